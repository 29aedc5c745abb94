//! The read path: find the datasets a query touches, decode them, and aggregate by
//! symbol id before resolving any name.
//!
//! Every query works in two steps. [`select`] asks the metastore for datasets overlapping
//! the time range (pruned by service when the selector pins `service_name`), decodes them,
//! and sums sample values per stack id for the matching series and profiles. Then one
//! module per output turns those per-dataset stack sums into a result: [`tree`] builds a
//! flame tree (names resolved once per distinct stack node), [`flamebearer`] renders
//! Pyroscope's JSON, [`pprof_export`] writes a merged pprof, [`profiles`] serves
//! single-profile lookups and listings.

pub mod error;
pub mod flamebearer;
pub mod pprof_export;
pub mod profiles;
pub mod select;
pub mod symbols;
pub mod tree;

pub use error::QueryError;
pub use select::{Querier, SelectRequest};
