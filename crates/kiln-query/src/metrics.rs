//! What the read path does, on `/metrics`: how each dataset was aggregated and whether the
//! cache had it. An operator sees from these when long ranges fall back to samples (blocks
//! written before format 2, segments, ranges that cut every block) and when the cache
//! (`query.cache_bytes`) is too small for the ranges asked.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabel {
    source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceLabels {
    tenant: String,
    service: String,
}

type Share = Gauge<f64, std::sync::atomic::AtomicU64>;

#[derive(Clone, Default)]
pub struct QueryMetrics {
    aggregated: Family<SourceLabel, Counter>,
    loads: Family<SourceLabel, Counter>,
    /// Memory of the flame graphs' kept shares (`query.tree_cache_bytes`).
    tree_cache_bytes: Gauge,
    /// Queries split over other query nodes, and the shares sent.
    fanned_out: Counter,
    shares_sent: Counter,
    /// Shares no peer answered, run here instead.
    shares_run_here: Counter,
    /// Per service, the share of value in stacks with an unnamed frame, of the newest
    /// dataset read (as named then), and that dataset's end.
    unsymbolized: Family<ServiceLabels, Share>,
    unsymbolized_newest:
        std::sync::Arc<std::sync::Mutex<std::collections::HashMap<ServiceLabels, i64>>>,
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
            "Datasets a query needed, by where they came from: cache, storage, or tree_cache (a flame graph's kept share of the dataset)",
            self.loads.clone(),
        );
        registry.register(
            "kiln_query_tree_cache_bytes",
            "Memory of the flame graphs' kept shares of datasets (query.tree_cache_bytes)",
            self.tree_cache_bytes.clone(),
        );
        registry.register(
            "kiln_symbolization_unsymbolized_ratio",
            "Per service, the share of samples (of its most profiled type) in stacks with a frame no symbols name, in the newest data a query read",
            self.unsymbolized.clone(),
        );
        registry.register(
            "kiln_query_fanned_out",
            "Queries split by block over other query nodes (above node.fanout_min_profiles)",
            self.fanned_out.clone(),
        );
        registry.register(
            "kiln_query_shares_sent",
            "Shares of split queries sent to other query nodes",
            self.shares_sent.clone(),
        );
        registry.register(
            "kiln_query_shares_run_here",
            "Shares of split queries that no other query node answered, run here instead",
            self.shares_run_here.clone(),
        );
    }

    /// A dataset was named ([`crate::naming`]): its share of unnamed value is the
    /// service's when it is the newest of the service read so far.
    pub(crate) fn unnamed_share(&self, dataset: &kiln_storage::Dataset, share: f64) {
        let labels = ServiceLabels {
            tenant: dataset.tenant.clone(),
            service: dataset.service.clone(),
        };
        let mut newest = self
            .unsymbolized_newest
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let end = newest.entry(labels.clone()).or_insert(i64::MIN);
        if dataset.max_time_nanos >= *end {
            *end = dataset.max_time_nanos;
            self.unsymbolized.get_or_create(&labels).set(share);
        }
    }

    pub(crate) fn fanned_out(&self, shares: usize) {
        self.fanned_out.inc();
        self.shares_sent.inc_by(shares as u64);
    }

    pub(crate) fn share_run_here(&self) {
        self.shares_run_here.inc();
    }

    pub(crate) fn aggregated(&self, summed: bool) {
        let source = if summed { "stack_sums" } else { "samples" };
        self.aggregated.get_or_create(&SourceLabel { source }).inc();
    }

    /// A flame graph took a dataset's kept share instead of reading the dataset.
    pub(crate) fn share_reused(&self) {
        self.loads
            .get_or_create(&SourceLabel {
                source: "tree_cache",
            })
            .inc();
    }

    pub(crate) fn tree_cache_holds(&self, bytes: u64) {
        self.tree_cache_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    pub(crate) fn loaded(&self, cached: bool) {
        let source = if cached { "cache" } else { "storage" };
        self.loads.get_or_create(&SourceLabel { source }).inc();
    }
}
