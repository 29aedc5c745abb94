//! kiln-query
