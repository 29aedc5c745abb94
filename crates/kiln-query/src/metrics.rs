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
    /// Per service, the share of value in unnamed leaf frames over its newest datasets
    /// read (as named then), and those datasets' sums.
    unsymbolized: Family<ServiceLabels, Share>,
    unsymbolized_recent: std::sync::Arc<
        std::sync::Mutex<std::collections::HashMap<ServiceLabels, Vec<RecentDataset>>>,
    >,
}

/// A dataset read, by its object and row group, for a service's unsymbolized share.
#[derive(Clone, Debug)]
struct RecentDataset {
    key: (String, u32),
    start_nanos: i64,
    end_nanos: i64,
    value: crate::naming::Unnamed,
}

/// A service's share is taken over its datasets read that end within this much of its
/// newest, weighed by value: the newest alone may be a flush of a few samples (a process's
/// last report, its exit in the kernel) that says nothing of the service.
const UNSYMBOLIZED_WINDOW_NANOS: i64 = 10 * 60 * 1_000_000_000;
/// Datasets kept per service for the share; the oldest go first.
const UNSYMBOLIZED_DATASETS: usize = 64;

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

    /// A dataset was named ([`crate::naming`]): the service's share is taken again over
    /// its recent datasets of the newest one's type, this one as named now.
    pub(crate) fn unnamed_share(
        &self,
        key: &(String, u32),
        dataset: &kiln_storage::Dataset,
        value: &crate::naming::Unnamed,
    ) {
        let labels = ServiceLabels {
            tenant: dataset.tenant.clone(),
            service: dataset.service.clone(),
        };
        let mut recent = self
            .unsymbolized_recent
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let datasets = recent.entry(labels.clone()).or_default();
        datasets.retain(|d| d.key != *key);
        datasets.push(RecentDataset {
            key: key.clone(),
            start_nanos: dataset.min_time_nanos,
            end_nanos: dataset.max_time_nanos,
            value: value.clone(),
        });
        datasets.sort_by_key(|d| std::cmp::Reverse(d.end_nanos));
        datasets.truncate(UNSYMBOLIZED_DATASETS);
        if let Some(share) = recent_share(datasets) {
            self.unsymbolized.get_or_create(&labels).set(share);
        }
    }

    /// The metastore listed every dataset of `tenant` (of `service` when pinned) overlapping
    /// `[from, to]`: a recent one of the range not among them was compacted away or
    /// expired, and goes. Kept, the inputs of a compaction outweighed the one block that
    /// holds them all since: a service read before and after its debug file was uploaded
    /// still showed the share from before (0.99, not 0).
    pub(crate) fn live(
        &self,
        tenant: &str,
        service: Option<&str>,
        (from, to): (i64, i64),
        listed: &[kiln_metastore::DatasetMeta],
    ) {
        let mut recent = self
            .unsymbolized_recent
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let in_range = |d: &RecentDataset| d.start_nanos <= to && d.end_nanos >= from;
        // Built only when a service of the query has a dataset to judge: most queries'
        // listings are not walked at all.
        let mut live: Option<std::collections::HashSet<(&str, u32)>> = None;
        for (labels, datasets) in recent.iter_mut() {
            if labels.tenant != tenant
                || service.is_some_and(|s| s != labels.service)
                || !datasets.iter().any(in_range)
            {
                continue;
            }
            let live = live.get_or_insert_with(|| {
                listed
                    .iter()
                    .map(|meta| (meta.object_key.as_str(), meta.row_group))
                    .collect()
            });
            let before = datasets.len();
            datasets.retain(|d| !in_range(d) || live.contains(&(d.key.0.as_str(), d.key.1)));
            if datasets.len() != before {
                if let Some(share) = recent_share(datasets) {
                    self.unsymbolized.get_or_create(labels).set(share);
                }
            }
        }
        recent.retain(|_, datasets| !datasets.is_empty());
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

/// Over `datasets`, newest first: the unnamed share of value of the newest one's type, in
/// the datasets that end within [`UNSYMBOLIZED_WINDOW_NANOS`] of it; `None` with no value.
fn recent_share(datasets: &[RecentDataset]) -> Option<f64> {
    let newest = datasets.first()?;
    let (unnamed, total) = datasets
        .iter()
        .filter(|d| {
            d.value.profile_type == newest.value.profile_type
                && d.end_nanos >= newest.end_nanos.saturating_sub(UNSYMBOLIZED_WINDOW_NANOS)
        })
        .fold((0.0, 0.0), |(u, t), d| {
            (u + d.value.unnamed, t + d.value.total)
        });
    (total > 0.0).then(|| unnamed / total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::naming::Unnamed;
    use crate::root::tests::meta;

    fn dataset(
        object: &str,
        end_s: i64,
        profile_type: &str,
        unnamed: f64,
        total: f64,
    ) -> RecentDataset {
        RecentDataset {
            key: (format!("{object}.parquet"), 0),
            start_nanos: (end_s - 10) * 1_000_000_000,
            end_nanos: end_s * 1_000_000_000,
            value: Unnamed {
                profile_type: profile_type.to_string(),
                unnamed,
                total,
            },
        }
    }

    /// A last flush of a few named samples does not make an unnamed service look named.
    #[test]
    fn the_share_weighs_recent_datasets_by_value() {
        let cpu = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
        let datasets = [
            dataset("tail", 1000, cpu, 0.0, 10.0),
            dataset("a", 990, cpu, 950.0, 1000.0),
            dataset("b", 980, cpu, 960.0, 1000.0),
            dataset(
                "heap",
                970,
                "memory:inuse_space:bytes:space:bytes",
                0.0,
                1e9,
            ),
            dataset("old", 0, cpu, 0.0, 1e9),
        ];
        let share = recent_share(&datasets).unwrap();
        assert!((share - 1910.0 / 2010.0).abs() < 1e-9, "{share}");
        assert_eq!(recent_share(&datasets[..1]), Some(0.0));
        assert_eq!(recent_share(&[dataset("empty", 1, cpu, 0.0, 0.0)]), None);
        assert_eq!(recent_share(&[]), None);
    }

    /// Compacted away, datasets read before leave the share to the block that holds them.
    #[test]
    fn datasets_no_longer_listed_leave_the_share() {
        let cpu = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
        let metrics = QueryMetrics::default();
        let labels = ServiceLabels {
            tenant: "t".to_string(),
            service: "s".to_string(),
        };
        let other = ServiceLabels {
            tenant: "t".to_string(),
            service: "other".to_string(),
        };
        {
            let mut recent = metrics.unsymbolized_recent.lock().unwrap();
            recent.insert(
                labels.clone(),
                // Newest first, as kept.
                vec![
                    dataset("outside", 300, cpu, 99.0, 100.0),
                    dataset("block", 100, cpu, 0.0, 100.0),
                    dataset("segment-1", 60, cpu, 99.0, 100.0),
                    dataset("segment-2", 40, cpu, 99.0, 100.0),
                ],
            );
            recent.insert(other.clone(), vec![dataset("o", 60, cpu, 50.0, 100.0)]);
        }
        let range = (0, 200 * 1_000_000_000);
        // Another service's listing, or another tenant's, removes nothing.
        metrics.live("t", Some("other"), range, &[meta("o", 1)]);
        metrics.live("u", None, range, &[]);
        assert_eq!(
            metrics.unsymbolized_recent.lock().unwrap()[&labels].len(),
            4
        );

        metrics.live("t", None, range, &[meta("block", 1), meta("o", 1)]);
        let recent = metrics.unsymbolized_recent.lock().unwrap();
        let kept: Vec<&str> = recent[&labels].iter().map(|d| d.key.0.as_str()).collect();
        assert_eq!(
            kept,
            ["outside.parquet", "block.parquet"],
            "outside the range, not judged"
        );
        assert_eq!(recent[&other].len(), 1);
        drop(recent);
        // Of "outside" and "block" alone: 99 of 200 (with the segments, 297 of 400).
        let share = metrics.unsymbolized.get_or_create(&labels).get();
        assert!((share - 0.495).abs() < 1e-9, "{share}");
    }
}
