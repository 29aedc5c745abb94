//! The write path: from request bytes to durable, registered segments.
//!
//! Parsers (`pyroscope`, `push`, `profefe`) turn each protocol's request into
//! [`ParsedProfile`]s, fully decoded and validated before anything is queued, so a request
//! is accepted or refused whole. The [`Ingester`] batches profiles from many concurrent
//! requests per flush (group commit): one block object and one metastore transaction per
//! flush, and every request in it is acknowledged only after both succeed. Batches are adaptive: an
//! idle server flushes at once, a busy one gathers what arrives during each flush.

mod backoff;
pub mod cardinality;
pub mod cpu;
pub mod dedup;
pub mod error;
pub mod limits;
pub mod otlp;
pub mod parse;
pub mod profefe;
pub mod push;
pub mod pyroscope;
pub mod wal;
pub mod writer;

pub use cardinality::Cardinality;
pub use error::IngestError;
pub use limits::{InFlight, Limits, TenantLimits};
pub use parse::{Cuts, ParsedProfile};
pub use writer::{Arrival, Ingester, IngesterConfig, Syncer, Written};
