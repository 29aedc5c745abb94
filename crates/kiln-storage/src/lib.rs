//! Kiln's storage layer: the dataset model, the block file format and object storage.
//!
//! A *dataset* holds the profiles of one (tenant, service) with every symbol stored once:
//! strings, mappings, functions, locations and a prefix tree of stacks, then per-series
//! profiles and their samples as `(stack id, value)` columns. A *block* is one Apache
//! Parquet object holding one or more datasets, one row group each; segments from the
//! write path and compacted blocks share the format. `docs/FORMAT.md` specifies it.
//!
//! This crate knows nothing about the metastore or HTTP: it turns datasets into bytes and
//! back, and moves bytes to and from object storage.

pub mod builder;
pub mod dataset;
pub mod error;
pub mod format;
pub mod merge;
pub mod objects;
pub mod ranged;
pub mod strings;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(test)]
mod warm_tests;

pub use builder::DatasetBuilder;
pub use dataset::{Dataset, ProfileRow, SeriesRow};
pub use error::StorageError;
pub use objects::ObjectStorage;
pub use strings::Strings;
