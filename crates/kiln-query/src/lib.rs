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
//!
//! What a request means (its times, selector, profile type and step) is decided once, in
//! [`request`], for every API that asks: querier.v1, the render API, profefe and the CLI.
//! [`tree`] is the one call tree behind the flame graph and the diff.
//!
//! A query that may be split over the query nodes has a root and leaves, as Quickwit's
//! search does: [`root`] plans it, sends shares to peers, runs its own share and merges
//! the parts; [`leaf`] runs one part over datasets this node reads. [`select`]'s
//! `Querier` reads local data only and does not know the root exists. The output types
//! the reader and the outputs share sit in [`selection`], so no two files import each
//! other (`tests/architecture.rs` checks every crate for import cycles).
//!
//! What one query may cost is [`budget`]'s: profiles read (refused before anything is
//! fetched), time, and a tenant's queries at once.
//!
//! The query API (`querier.v1`, [`api`]) has one module per query type, as Pyroscope
//! does: [`merge`] (flame graph, tree, pprof), [`series`] (time series with exemplars),
//! [`diff`] (two selections in one flame graph) and [`labels`] (label names and values,
//! series, profile types, stats). Kiln's own views add [`overview`] (every service at
//! once), [`heatmap`] (individual profiles by time and value, and a rectangle of them)
//! and [`lines`] (a function's self and total per source line, with [`source`] text
//! where the operator configured where the code is).

pub mod api;
pub mod budget;
pub mod cache;
pub mod diff;
pub mod error;
pub mod flamebearer;
pub mod heatmap;
pub mod labels;
pub mod leaf;
pub mod lines;
pub mod merge;
pub mod metrics;
mod naming;
pub mod overview;
pub mod pprof_export;
pub mod profiles;
pub mod render;
pub mod request;
pub mod root;
pub mod select;
pub mod selection;
pub mod series;
pub mod source;
pub mod symbols;
pub mod tree;
pub mod tree_cache;

pub use budget::QueryBudget;
pub use error::QueryError;
pub use select::{Querier, SelectRequest};
