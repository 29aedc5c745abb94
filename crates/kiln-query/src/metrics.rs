//! What the read path does, on `/metrics`: how each dataset was aggregated and whether the
//! cache had it. An operator sees from these when long ranges fall back to samples (blocks
//! written before format 2, segments, ranges that cut every block) and when the cache
//! (`query.cache_bytes`) is too small for the ranges asked.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabel {
    source: &'static str,
}

#[derive(Clone, Default)]
pub struct QueryMetrics {
    aggregated: Family<SourceLabel, Counter>,
    loads: Family<SourceLabel, Counter>,
}

impl QueryMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kiln_query_datasets_aggregated",
            "Datasets a query aggregated, by source: stack_sums or samples",
            self.aggregated.clone(),
        );
        registry.register(
            "kiln_query_dataset_loads",
            "Datasets a query needed, by where they came from: cache or storage",
            self.loads.clone(),
        );
    }

    pub(crate) fn aggregated(&self, summed: bool) {
        let source = if summed { "stack_sums" } else { "samples" };
        self.aggregated.get_or_create(&SourceLabel { source }).inc();
    }

    pub(crate) fn loaded(&self, cached: bool) {
        let source = if cached { "cache" } else { "storage" };
        self.loads.get_or_create(&SourceLabel { source }).inc();
    }
}
