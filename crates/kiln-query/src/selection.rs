//! What reading one dataset for a query yields, before any output is built from it: the
//! type the outputs ([`crate::tree`], [`crate::pprof_export`], [`crate::series`]) share
//! with the reader ([`crate::select`]), kept apart so that neither imports the other.

use std::sync::Arc;

use kiln_storage::Dataset;

/// What one dataset contributes to a query: per matched type, the value of every stack
/// node (dense, indexed by stack id), and each matched profile's total.
pub struct DatasetSelection {
    pub dataset: Arc<Dataset>,
    /// Matched type ids, with the lowest position each had in its received profile.
    pub types: Vec<(String, u32)>,
    /// `values[t][stack]`: summed value of stack node `stack` for local type `t`.
    pub values: Vec<Vec<i64>>,
    pub profiles: Vec<SelectedProfile>,
    /// The values came from the dataset's stack sums, not its samples.
    pub summed: bool,
}

impl DatasetSelection {
    /// The position of `type_id` among this selection's matched types.
    pub fn local_type(&self, type_id: &str) -> Option<usize> {
        self.types.iter().position(|(id, _)| id == type_id)
    }
}

#[derive(Debug, Clone)]
pub struct SelectedProfile {
    pub row: usize,
    pub time_nanos: i64,
    pub local_type: usize,
    pub total: i64,
}
