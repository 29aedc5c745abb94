//! kiln-ingest
