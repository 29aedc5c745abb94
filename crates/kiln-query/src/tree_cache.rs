//! Flame graphs asked again: each dataset's share of one, kept.
//!
//! A flame graph of every service up to now, asked every few seconds while ingest runs,
//! reads the same compacted blocks each time. A block of a service with a large symbol
//! table decodes to about 3 MB whatever its profile count (every symbol of the service,
//! and stack sums of each of its series), so twenty such services' blocks outgrow the
//! decoded-dataset cache within a minute, and each query decodes them again: 1.4-2.3 s
//! at p99 (docs/benchmarks.md, "Queries while ingesting"). And a query whose datasets
//! are all cached still aggregates each block's series and resolves its names again.
//!
//! What a dataset adds to a flame graph depends only on the dataset, the profile type and
//! the selector, as long as the query's range covers the dataset whole (then no profile
//! of it is left out; [`SelectRequest::summable`]). That share ([`DatasetTree`]) holds
//! only the frames of one type's stacks, a fraction of the decoded dataset, and adding it
//! to the result is one hash lookup per frame. So flame graphs keep shares here, by
//! (tenant, object, row group, type, selector), and read a dataset only for a share they
//! do not find. Blocks never change once written, so shares never go stale; eviction is
//! by memory (`query.tree_cache_bytes`), scan-resistant as the dataset cache is.

use std::sync::Arc;

use crate::tree::DatasetTree;

/// A dataset and the shape of the flame graphs its share serves. The shape is built once
/// per query and shared by its keys, so a lookup copies only the object key.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct TreeKey {
    object_key: String,
    row_group: u32,
    /// Tenant, profile type and selector.
    shape: Arc<(String, String, String)>,
    /// The symbolizer's generation: a share named before a debug file arrived is not the
    /// share after ([`crate::naming`]).
    names: u64,
}

impl TreeKey {
    pub(crate) fn new(
        object_key: String,
        row_group: u32,
        shape: Arc<(String, String, String)>,
        names: u64,
    ) -> Self {
        TreeKey {
            object_key,
            row_group,
            shape,
            names,
        }
    }
}

#[derive(Clone)]
struct Entry {
    tree: Arc<DatasetTree>,
    /// The dataset's own time range: a share serves a query only where the query covers
    /// it whole.
    min_nanos: i64,
    max_nanos: i64,
    bytes: u64,
}

#[derive(Clone)]
struct EntryBytes;

impl quick_cache::Weighter<TreeKey, Entry> for EntryBytes {
    fn weight(&self, _key: &TreeKey, entry: &Entry) -> u64 {
        entry.bytes.max(1)
    }
}

/// Shares of flame graphs by dataset and query shape.
pub(crate) struct TreeCache {
    entries: Option<quick_cache::sync::Cache<TreeKey, Entry, EntryBytes>>,
    capacity: u64,
}

/// A guess at the average share, only to size the cache's tables.
const TYPICAL_ENTRY_BYTES: u64 = 64 << 10;

impl TreeCache {
    pub(crate) fn new(capacity: u64) -> Self {
        // One shard, as the dataset cache ([`crate::cache::weighed_cache`]): large
        // shares would otherwise never be kept.
        let entries = (capacity > 0)
            .then(|| crate::cache::weighed_cache(capacity, TYPICAL_ENTRY_BYTES, EntryBytes));
        TreeCache { entries, capacity }
    }

    /// The share kept under `key`, if `covers` says the query covers its dataset's time
    /// range whole ([`crate::select::SelectRequest::summable`]).
    pub(crate) fn get(
        &self,
        key: &TreeKey,
        covers: impl Fn(i64, i64) -> bool,
    ) -> Option<Arc<DatasetTree>> {
        self.entries
            .as_ref()?
            .get(key)
            .filter(|entry| covers(entry.min_nanos, entry.max_nanos))
            .map(|entry| entry.tree)
    }

    pub(crate) fn insert(
        &self,
        key: TreeKey,
        tree: &Arc<DatasetTree>,
        min_nanos: i64,
        max_nanos: i64,
    ) {
        let Some(entries) = &self.entries else {
            return;
        };
        let bytes = (tree.heap_bytes() + std::mem::size_of::<Entry>()) as u64;
        if bytes > self.capacity {
            return;
        }
        entries.insert(
            key,
            Entry {
                tree: tree.clone(),
                min_nanos,
                max_nanos,
                bytes,
            },
        );
    }

    /// Memory the shares kept take.
    pub(crate) fn bytes(&self) -> u64 {
        self.entries.as_ref().map_or(0, |entries| entries.weight())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::select::SelectRequest;

    /// What a query of `request` accepts of a share.
    fn covers(request: &SelectRequest) -> impl Fn(i64, i64) -> bool + '_ {
        |min, max| request.summable(min, max)
    }

    fn key(object: &str) -> TreeKey {
        TreeKey {
            object_key: object.to_string(),
            row_group: 0,
            shape: Arc::new(("t".to_string(), "cpu".to_string(), "{}".to_string())),
            names: 0,
        }
    }

    fn over(from_nanos: i64, to_nanos: i64) -> SelectRequest {
        SelectRequest {
            from_nanos,
            to_nanos,
            ..Default::default()
        }
    }

    /// A share serves only queries that cover its dataset whole, and nothing is kept
    /// without a budget.
    #[test]
    fn a_share_serves_queries_that_cover_its_dataset_whole() {
        let cache = TreeCache::new(1 << 20);
        let tree = Arc::new(DatasetTree::default());
        cache.insert(key("a"), &tree, 100, 200);
        assert!(cache.get(&key("a"), covers(&over(100, 200))).is_some());
        assert!(cache.get(&key("a"), covers(&over(0, 1_000))).is_some());
        assert!(cache.get(&key("a"), covers(&over(150, 1_000))).is_none());
        assert!(cache.get(&key("a"), covers(&over(0, 199))).is_none());
        let filtered = SelectRequest {
            call_site: vec!["main".to_string()],
            ..over(0, 1_000)
        };
        assert!(cache.get(&key("a"), covers(&filtered)).is_none());
        assert!(cache.get(&key("b"), covers(&over(0, 1_000))).is_none());
        assert!(cache.bytes() > 0);
        // A share of a third of the budget is kept: shards would each have only a part
        // of it.
        let budget = TreeCache::new(64 << 20);
        let mut large = DatasetTree::default();
        large.push_for_test(&"f".repeat(20 << 20));
        budget.insert(key("large"), &Arc::new(large), 100, 200);
        assert!(budget.get(&key("large"), covers(&over(0, 1_000))).is_some());
        let none = TreeCache::new(0);
        none.insert(key("a"), &tree, 100, 200);
        assert!(none.get(&key("a"), covers(&over(0, 1_000))).is_none());
        assert_eq!(none.bytes(), 0);
    }
}
