//! Dataset selection and per-stack aggregation, shared by every query type.

use std::sync::{Arc, Mutex};

use futures_util::StreamExt;

use kiln_metastore::{DatasetMeta, DatasetQuery, Metastore};
use kiln_model::labels::{Labels, SERVICE_NAME};
use kiln_model::selector::Selector;
use kiln_storage::format::{decode_dataset, Projection};
use kiln_storage::ranged::TailCache;
use kiln_storage::{Dataset, ObjectStorage};

pub use crate::selection::{DatasetSelection, SelectedProfile};
use crate::QueryError;

/// Which profile types a query wants.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TypeFilter {
    /// One full profile type id (`process_cpu:cpu:nanoseconds:cpu:nanoseconds`).
    Exact(String),
    /// Every type whose profile name (the id's first part) is this (`memory`).
    Name(String),
    #[default]
    Any,
}

/// Wall time per thread: the agent's on-CPU and off-CPU time of a process summed. Not a
/// stored type: a query for it selects both of [`WALL_PARTS`], whose samples are in the
/// same unit, so every query type (flame graph, diff, series, rules) sums them as it
/// sums profiles of one type.
pub const WALL_TYPE: &str = "process_wall:wall:nanoseconds:wall:nanoseconds";
pub const WALL_PARTS: [&str; 2] = [
    "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
    "off_cpu:off_cpu:nanoseconds:off_cpu:nanoseconds",
];

impl TypeFilter {
    pub fn matches(&self, type_id: &str) -> bool {
        match self {
            TypeFilter::Exact(id) => id == self.selected_as(type_id),
            TypeFilter::Name(name) => type_id.split(':').next() == Some(name.as_str()),
            TypeFilter::Any => true,
        }
    }

    /// The type a stored type's samples count as in a selection: wall time's parts as
    /// [`WALL_TYPE`], so that every query type finds their sum under the id it asked for.
    pub fn selected_as<'a>(&self, type_id: &'a str) -> &'a str {
        match self {
            TypeFilter::Exact(id) if id == WALL_TYPE && WALL_PARTS.contains(&type_id) => WALL_TYPE,
            _ => type_id,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct SelectRequest {
    pub tenant: String,
    pub types: TypeFilter,
    pub selector: Selector,
    /// Inclusive range of profile times, in nanoseconds.
    pub from_nanos: i64,
    pub to_nanos: i64,
    /// When set, only profiles with these ids.
    pub profile_ids: Option<Vec<Vec<u8>>>,
    /// When not empty, only stacks whose outermost frames are these names, in order.
    pub call_site: Vec<String>,
    /// When set, only samples whose `span_id` label is one of these.
    pub span_ids: Option<Vec<String>>,
    /// The caller reads the samples themselves (span exemplars), not only their sums per
    /// stack and per profile: stack sums cannot stand in for them.
    pub per_sample: bool,
    /// The caller reads only the values per stack (a flame graph), not the profiles behind
    /// them, so summed datasets are read without their profile rows.
    pub values_only: bool,
    /// When set, only profiles whose stored total lies in `min..max` (a heatmap's
    /// rectangle: the values of whole profiles, whatever else filters their samples).
    pub value_range: Option<(i64, i64)>,
    /// When set, these datasets instead of the metastore's listing: a share of a query
    /// that another query node listed and split ([`crate::root`]). Listing again here
    /// could miss datasets a compaction replaced in between; the objects themselves stay
    /// readable for the grace period.
    pub datasets: Option<Arc<Vec<DatasetMeta>>>,
}

impl SelectRequest {
    /// Whether a dataset's stack sums answer this request for a dataset spanning
    /// `min_nanos..=max_nanos`: the range covers it whole, and nothing selects single
    /// profiles or samples. A call site could filter the sums by stack, but not the
    /// per-profile totals, so it reads the samples.
    pub fn summable(&self, min_nanos: i64, max_nanos: i64) -> bool {
        !self.per_sample
            && self.profile_ids.is_none()
            && self.span_ids.is_none()
            && self.call_site.is_empty()
            && self.value_range.is_none()
            && self.from_nanos <= min_nanos
            && max_nanos <= self.to_nanos
    }
}

/// Labels Pyroscope derives from the profile type id
/// (`name:sample_type:sample_unit:period_type:period_unit`), which selectors may use.
pub const TYPE_LABELS: [&str; 6] = [
    "__profile_type__",
    "__name__",
    "__type__",
    "__unit__",
    "__period_type__",
    "__period_unit__",
];

/// A series' labels as selectors see them: its stored labels plus [`TYPE_LABELS`].
pub fn selectable_labels(dataset: &Dataset, series: &kiln_storage::dataset::SeriesRow) -> Labels {
    let mut labels = dataset.series_labels(series);
    let type_id = dataset.string(series.profile_type);
    labels.set(TYPE_LABELS[0], type_id);
    for (name, part) in TYPE_LABELS[1..].iter().zip(type_id.split(':')) {
        labels.set(*name, part);
    }
    labels
}

/// Decoded datasets kept in memory by (object key, row group). Blocks never change once
/// written, so entries never go stale. An entry keeps the projection it was decoded with,
/// and serves what that covers: a summed one ([`Projection::SUMMED`],
/// [`Projection::VALUES`]) only summable requests.
///
/// Eviction is quick_cache's scan-resistant policy (S3-FIFO-like: a small queue for new
/// entries, a main one for entries asked for again, and a ghost list of recent
/// evictions), not insertion order. A flame graph of every service up to now reads every
/// fresh level-0 dataset in turn; once they outgrow the cache, evicting the oldest
/// dropped each one just before the next query asked for it again (69 hits in 11,819
/// loads over 12 s of `kiln bench query --ingest-rate 640`), where a scan-resistant cache
/// keeps a stable part of them (docs/benchmarks.md, "Queries while ingesting").
struct DatasetCache {
    entries: quick_cache::sync::Cache<(String, u32), CacheEntry, EntryBytes>,
    /// Decoded datasets are 10-100x their compressed size, so a count limit alone could
    /// hold gigabytes: a week of one busy service decodes to ~1.3 GB with its samples.
    capacity: u64,
}

#[derive(Clone)]
struct CacheEntry {
    dataset: Arc<Dataset>,
    bytes: u64,
    projection: Projection,
    /// Its frames' names wait for debug files ([`crate::naming`]): until when, and at
    /// which symbolizer generation they were looked up.
    names_pending: Option<(std::time::Instant, u64)>,
}

#[derive(Clone)]
struct EntryBytes;

impl quick_cache::Weighter<(String, u32), CacheEntry> for EntryBytes {
    fn weight(&self, _key: &(String, u32), entry: &CacheEntry) -> u64 {
        entry.bytes.max(1)
    }
}

/// A guess at the average entry, only to size the cache's tables.
const TYPICAL_ENTRY_BYTES: u64 = 256 << 10;

impl DatasetCache {
    fn new(capacity: u64) -> Self {
        let entries = crate::cache::weighed_cache(capacity, TYPICAL_ENTRY_BYTES, EntryBytes);
        DatasetCache { entries, capacity }
    }

    /// The cached dataset, when there is one holding what `projection` reads.
    fn get(&self, key: &(String, u32), projection: &Projection) -> Option<CacheEntry> {
        self.entries
            .get(key)
            .filter(|entry| entry.projection.covers(projection))
    }

    fn insert(
        &self,
        key: (String, u32),
        dataset: &Arc<Dataset>,
        projection: Projection,
        names_pending: Option<(std::time::Instant, u64)>,
    ) {
        let bytes = dataset.heap_bytes() as u64;
        if bytes > self.capacity {
            return;
        }
        // Another query cached it meanwhile, or as much of it; unless this is that entry
        // named again ([`crate::naming`]), which replaces it.
        if let Some(entry) = self.entries.peek(&key) {
            let renamed = entry.names_pending.is_some() && projection.covers(&entry.projection);
            if entry.projection.covers(&projection) && !renamed {
                return;
            }
        }
        self.entries.insert(
            key,
            CacheEntry {
                dataset: dataset.clone(),
                bytes,
                projection,
                names_pending,
            },
        );
    }
}

/// Stateless query front: everything it knows comes from the metastore and object store.
#[derive(Clone)]
pub struct Querier {
    metastore: Metastore,
    storage: ObjectStorage,
    cache: Arc<DatasetCache>,
    /// Each dataset's share of the flame graphs asked ([`crate::tree_cache`]).
    trees: Arc<crate::tree_cache::TreeCache>,
    /// Footers of segments read, so each of a segment's datasets is read by its own byte
    /// range without parsing the footer again.
    tails: Arc<Mutex<TailCache>>,
    budget: Arc<crate::budget::Budget>,
    metrics: crate::metrics::QueryMetrics,
    /// The thread that reads and decodes for [`Querier::derive_from_indexes`], started at
    /// its first use ([`kiln_runtime::worker`] says why a thread of its own).
    background: Arc<std::sync::OnceLock<kiln_runtime::worker::Pool>>,
    /// Makes every acknowledged write visible before a listing ([`Querier::with_freshness`]).
    freshness: Option<Freshness>,
    /// Names frames stored unnamed, when debug files can be had ([`crate::naming`]).
    names: Option<Arc<dyn kiln_model::symbols::NameFrames>>,
    /// Datasets whose names wait for debug files: their flame graph shares are not kept.
    names_pending: Arc<Mutex<std::collections::HashSet<(String, u32)>>>,
}

/// Returns once every write acknowledged before the call is visible in the metastore.
/// Makes visible what a listing of its scope could see ([`Querier::with_freshness`]).
pub type Freshness =
    Arc<dyn Fn(DatasetQuery) -> futures_util::future::BoxFuture<'static, ()> + Send + Sync>;

/// Datasets remembered as waiting for debug files ([`Querier::names_pending`]).
const MAX_PENDING_NAMES: usize = 65_536;

/// Memory for cached segment footers.
const TAIL_CACHE_BYTES: usize = 16 << 20;

impl Querier {
    pub fn new(metastore: Metastore, storage: ObjectStorage) -> Self {
        Querier {
            metastore,
            storage,
            cache: Arc::new(DatasetCache::new(crate::QueryBudget::default().cache_bytes)),
            trees: Arc::new(crate::tree_cache::TreeCache::new(
                crate::QueryBudget::default().tree_cache_bytes,
            )),
            budget: Arc::new(crate::budget::Budget::new(crate::QueryBudget::default())),
            tails: Arc::new(Mutex::new(TailCache::new(TAIL_CACHE_BYTES))),
            metrics: Default::default(),
            background: Arc::new(std::sync::OnceLock::new()),
            freshness: None,
            names: None,
            names_pending: Default::default(),
        }
    }

    /// The same querier, naming frames stored without names from `names` as it reads
    /// them ([`crate::naming`]).
    pub fn with_symbolizer(mut self, names: Arc<dyn kiln_model::symbols::NameFrames>) -> Self {
        self.names = Some(names);
        self
    }

    /// The symbolizer's generation (0 without one): part of a kept flame graph share's key,
    /// so that shares made before a debug file arrived are not served after.
    pub(crate) fn names_generation(&self) -> u64 {
        self.names.as_ref().map_or(0, |names| names.generation())
    }

    /// Whether the dataset's frames wait for debug files, so that a share of it is not kept.
    pub(crate) fn names_pending(&self, object_key: &str, row_group: u32) -> bool {
        let pending = self.names_pending.lock().unwrap_or_else(|p| p.into_inner());
        !pending.is_empty() && pending.contains(&(object_key.to_string(), row_group))
    }

    pub fn metrics(&self) -> &crate::metrics::QueryMetrics {
        &self.metrics
    }

    pub(crate) fn trees(&self) -> Arc<crate::tree_cache::TreeCache> {
        self.trees.clone()
    }

    /// The same querier with another budget for what clients ask.
    /// Where writes are acknowledged before they are registered (the ingester's
    /// write-ahead log), `fresh` makes them visible; it is awaited before each listing,
    /// with the listing's scope, so a read still sees every write acknowledged before it
    /// that it could list.
    pub fn with_freshness(mut self, fresh: Freshness) -> Self {
        self.freshness = Some(fresh);
        self
    }

    /// Waits until every write acknowledged so far that a listing of `scope` could see
    /// is visible ([`Querier::with_freshness`]).
    pub async fn fresh(&self, scope: &DatasetQuery) {
        if let Some(fresh) = &self.freshness {
            fresh(scope.clone()).await;
        }
    }

    pub fn with_budget(mut self, budget: crate::QueryBudget) -> Self {
        self.cache = Arc::new(DatasetCache::new(budget.cache_bytes));
        self.trees = Arc::new(crate::tree_cache::TreeCache::new(budget.tree_cache_bytes));
        self.budget = Arc::new(crate::budget::Budget::new(budget));
        self
    }

    /// Runs a client's query in its tenant's turn, within the time budget.
    pub async fn run<T>(
        &self,
        tenant: &str,
        query: impl std::future::Future<Output = T>,
    ) -> Result<T, QueryError> {
        self.budget.run(tenant, query).await
    }

    /// [`Self::datasets`] for what a client asks: refused at once when reading them would
    /// pass the budget's profile count.
    pub async fn datasets_within_budget(
        &self,
        request: &SelectRequest,
    ) -> Result<Vec<DatasetMeta>, QueryError> {
        let datasets = self.datasets(request).await?;
        self.budget.check(request, &datasets)?;
        Ok(datasets)
    }

    pub fn metastore(&self) -> &Metastore {
        &self.metastore
    }

    /// Datasets of the tenant overlapping the range, pruned by a pinned `service_name`.
    pub async fn datasets(&self, request: &SelectRequest) -> Result<Vec<DatasetMeta>, QueryError> {
        let listed = match &request.datasets {
            // Another node's listing names the tenant of each; only the request's own
            // are read (and each dataset's stored tenant is checked again on loading).
            Some(given) => given
                .iter()
                .filter(|meta| meta.tenant == request.tenant)
                .cloned()
                .collect(),
            None => {
                let service = request.selector.equality(SERVICE_NAME);
                let scope = DatasetQuery {
                    tenant: request.tenant.clone(),
                    service: service.map(str::to_string),
                    from_nanos: request.from_nanos,
                    to_nanos: request.to_nanos,
                };
                self.fresh(&scope).await;
                let listed = self.metastore.list_datasets(scope).await?;
                self.metrics.live(
                    &request.tenant,
                    service,
                    (request.from_nanos, request.to_nanos),
                    &listed,
                );
                listed
            }
        };
        Ok(listed
            .into_iter()
            .filter(|meta| {
                meta.profile_types.iter().any(|t| request.types.matches(t))
                    && request
                        .selector
                        .matchers
                        .iter()
                        .filter(|m| m.name == SERVICE_NAME)
                        .all(|m| m.matches_value(Some(&meta.service)))
            })
            .collect())
    }

    /// The cached dataset, when there is one holding what `projection` reads.
    fn cached(&self, key: &(String, u32), projection: &Projection) -> Option<Arc<Dataset>> {
        self.cache.get(key, projection).map(|entry| entry.dataset)
    }

    /// Loads a dataset with every table, from the cache when it is there.
    pub async fn load(&self, meta: &DatasetMeta) -> Result<Arc<Dataset>, QueryError> {
        self.load_as(meta, Projection::ALL).await
    }

    /// Loads what `request` needs of a dataset: its stack sums instead of its samples
    /// when they answer the request ([`SelectRequest::summable`]), else every table.
    pub async fn load_for(
        &self,
        meta: &DatasetMeta,
        request: &SelectRequest,
    ) -> Result<Arc<Dataset>, QueryError> {
        if request.summable(meta.min_time_nanos, meta.max_time_nanos) {
            let projection = if request.values_only {
                Projection::VALUES
            } else {
                Projection::SUMMED
            };
            self.load_as(meta, projection).await
        } else {
            self.load(meta).await
        }
    }

    async fn load_as(
        &self,
        meta: &DatasetMeta,
        projection: Projection,
    ) -> Result<Arc<Dataset>, QueryError> {
        let key = (meta.object_key.clone(), meta.row_group);
        let cached = self.cache.get(&key, &projection);
        self.metrics.loaded(cached.is_some());
        if let Some(entry) = cached {
            let due = entry.names_pending.is_some_and(|(retry_at, generation)| {
                std::time::Instant::now() >= retry_at || self.names_generation() != generation
            });
            if !due {
                return Ok(entry.dataset);
            }
            return self.named(key, entry.dataset, entry.projection).await;
        }
        let row_group = meta.row_group as usize;
        // A segment holds the dataset of every service in a flush: read this one's byte
        // range, its footer cached, not the whole object once per dataset (a query of
        // twenty services read each segment twenty times). A compacted block holds one
        // dataset, read whole in one request. Keys are specified in docs/FORMAT.md.
        let dataset = if meta.object_key.starts_with("segments/") {
            let (tail, _) =
                TailCache::get_or_read(&self.tails, &self.storage, &meta.object_key).await?;
            let (partial, _) = kiln_storage::ranged::read_dataset_bytes(
                &self.storage,
                &meta.object_key,
                &tail,
                row_group,
            )
            .await?;
            tokio::task::spawn_blocking(move || {
                checked(kiln_storage::ranged::decode_partial(
                    partial, row_group, projection,
                ))
            })
            .await??
        } else {
            let bytes = self.storage.get(&meta.object_key).await?;
            tokio::task::spawn_blocking(move || {
                checked(decode_dataset(&bytes, row_group, projection))
            })
            .await??
        };
        self.named(key, Arc::new(dataset), projection).await
    }

    /// `dataset` with the names of its unnamed frames where debug files have them, cached.
    async fn named(
        &self,
        key: (String, u32),
        dataset: Arc<Dataset>,
        projection: Projection,
    ) -> Result<Arc<Dataset>, QueryError> {
        let Some(names) = self.names.as_ref().filter(|_| projection.symbols) else {
            self.cache.insert(key, &dataset, projection, None);
            return Ok(dataset);
        };
        let named = crate::naming::name_frames(dataset, names.as_ref()).await?;
        self.metrics
            .unnamed_share(&key, &named.dataset, &named.unnamed);
        {
            let mut pending = self.names_pending.lock().unwrap_or_else(|p| p.into_inner());
            if named.retry_at.is_some() {
                // Keys of datasets evicted or compacted away stay until cleared: bounded
                // here. A share kept meanwhile is still keyed by the symbolizer's
                // generation, so only a retry after "not found" expires is put off.
                if pending.len() >= MAX_PENDING_NAMES {
                    pending.clear();
                }
                pending.insert(key.clone());
            } else if !pending.is_empty() {
                pending.remove(&key);
            }
        }
        let pending = named.retry_at.map(|at| (at, named.generation));
        self.cache.insert(key, &named.dataset, projection, pending);
        Ok(named.dataset)
    }

    /// What `derive` makes of the series and profile rows of datasets of one object, in
    /// `row_groups`' order, for what needs no samples (which versions services run): from
    /// the cached dataset where it is there, else from one decoded without symbols or
    /// samples, and dropped once derived.
    ///
    /// The object's footer is read and parsed once for all of them (a level-0 segment
    /// holds one dataset per service), and of each dataset only the column chunks of its
    /// strings, series and profile rows are fetched ([`kiln_storage::ranged::column_fetch`]):
    /// a quarter of a segment's bytes, a twelfth of a block's. They are fetched, decoded, derived from and dropped one
    /// dataset at a time on one thread of the querier's own. The regression watcher once
    /// kept every dataset of a look until it had them all (its first look under load
    /// lifted the server by 500 MiB), and then fetched whole objects on tokio's blocking
    /// threads, which kept what they had freed (docs/benchmarks.md).
    pub async fn derive_from_indexes<T: Send + 'static>(
        &self,
        object_key: &str,
        row_groups: &[u32],
        derive: Arc<dyn Fn(&Dataset) -> T + Send + Sync>,
    ) -> Result<Vec<T>, QueryError> {
        let mut derived: Vec<Option<T>> = Vec::with_capacity(row_groups.len());
        let mut missing = Vec::new();
        for (index, row_group) in row_groups.iter().enumerate() {
            match self.cached(&(object_key.to_string(), *row_group), &Projection::INDEX) {
                Some(dataset) => derived.push(Some(derive(&dataset))),
                None => {
                    derived.push(None);
                    missing.push((index, *row_group as usize));
                }
            }
        }
        if !missing.is_empty() {
            let tail = if object_key.starts_with("segments/") {
                TailCache::get_or_read(&self.tails, &self.storage, object_key)
                    .await?
                    .0
            } else {
                // Blocks are read once a look, for good: their footers would only push
                // the segments' out of the cache that queries use.
                Arc::new(
                    kiln_storage::ranged::read_tail(&self.storage, object_key)
                        .await?
                        .0,
                )
            };
            let groups: Vec<usize> = missing.iter().map(|(_, row_group)| *row_group).collect();
            let storage = self.storage.clone();
            let runtime = tokio::runtime::Handle::current();
            let key = object_key.to_string();
            let read = move || -> Result<Vec<T>, QueryError> {
                let plans = groups
                    .iter()
                    .map(|&row_group| {
                        kiln_storage::ranged::column_fetch(&tail, row_group, Projection::INDEX)
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                // One call for the whole object: a remote store joins near ranges into
                // one request.
                let ranges: Vec<_> = plans.iter().flat_map(|plan| plan.ranges()).collect();
                let mut fetched = storage
                    .get_ranges_blocking(&runtime, &key, &ranges)?
                    .into_iter();
                groups
                    .iter()
                    .zip(&plans)
                    .map(|(&row_group, plan)| {
                        let parts = fetched.by_ref().take(plan.ranges().len()).collect();
                        let partial = plan.partial(&key, &tail, parts)?;
                        let dataset = checked(kiln_storage::ranged::decode_partial(
                            partial,
                            row_group,
                            Projection::INDEX,
                        ))?;
                        Ok(derive(&dataset))
                    })
                    .collect()
            };
            let values = self
                .background
                .get_or_init(|| kiln_runtime::worker::Pool::start("kiln-index", 1))
                .spawn(read)
                .await??;
            for ((index, _), value) in missing.iter().zip(values) {
                derived[*index] = Some(value);
            }
        }
        Ok(derived.into_iter().flatten().collect())
    }

    /// Selects and aggregates every matching dataset, in parallel.
    pub async fn select(
        &self,
        request: &SelectRequest,
    ) -> Result<Vec<DatasetSelection>, QueryError> {
        let mut selections = Vec::new();
        self.select_each(request, |selection| selections.push(selection))
            .await?;
        Ok(selections)
    }

    /// Selects and aggregates every matching dataset, in parallel, handing each selection
    /// to `each` in dataset order as it is ready. A caller that folds each one into its
    /// result and drops it holds a few datasets at a time, not the whole range.
    pub async fn select_each(
        &self,
        request: &SelectRequest,
        each: impl FnMut(DatasetSelection),
    ) -> Result<(), QueryError> {
        self.select_map(request, |_| None, |_, _, selection| Some(selection), each)
            .await
    }

    /// [`Self::select_each`] with each selection turned into what the caller folds by
    /// `map` (given the dataset's listing and the request too), on the blocking thread
    /// that aggregated it, and `cached` asked first for each dataset: what it answers is
    /// handed on without reading the dataset.
    pub(crate) async fn select_map<T: Send + 'static>(
        &self,
        request: &SelectRequest,
        cached: impl Fn(&DatasetMeta) -> Option<T>,
        map: impl Fn(&DatasetMeta, &SelectRequest, DatasetSelection) -> Option<T>
            + Clone
            + Send
            + 'static,
        mut each: impl FnMut(T),
    ) -> Result<(), QueryError> {
        let metas = self.datasets_within_budget(request).await?;
        let request = Arc::new(request.clone());
        let tasks = metas.into_iter().map(|meta| {
            let request = request.clone();
            let map = map.clone();
            let hit = cached(&meta);
            async move {
                if hit.is_some() {
                    return Ok(hit);
                }
                let mut dataset = self.load_for(&meta, &request).await?;
                // A dataset named by another node is read only if it is this tenant's.
                if request.datasets.is_some() && dataset.tenant != request.tenant {
                    return Err(QueryError::BadRequest(format!(
                        "dataset {}#{} is not tenant {:?}'s",
                        meta.object_key, meta.row_group, request.tenant
                    )));
                }
                // The metastore's range said the sums would do; the dataset's own did not.
                if (dataset.samples_omitted
                    && !request.summable(dataset.min_time_nanos, dataset.max_time_nanos))
                    || (dataset.profiles_omitted && !request.values_only)
                {
                    dataset = self.load(&meta).await?;
                }
                let metrics = self.metrics.clone();
                tokio::task::spawn_blocking(move || {
                    let selection = aggregate(dataset, &request)?;
                    metrics.aggregated(selection.summed);
                    map(&meta, &request, selection)
                })
                .await
                .map_err(QueryError::Task)
            }
        });
        // A few datasets in flight per core: all cores stay busy, while decoding buffers
        // of a week of blocks are not all alive at once.
        let in_flight = 2 * kiln_runtime::priority::cores();
        let mut results = futures_util::stream::iter(tasks).buffered(in_flight);
        while let Some(result) = results.next().await {
            if let Some(folded) = result? {
                each(folded);
            }
        }
        Ok(())
    }
}

/// A decoded dataset that passed its checks, so readers may index it freely.
fn checked(decoded: Result<Dataset, kiln_storage::StorageError>) -> Result<Dataset, QueryError> {
    let dataset = decoded?;
    dataset
        .check()
        .map_err(kiln_storage::StorageError::Corrupt)?;
    Ok(dataset)
}

/// Which of the dataset's series the request's types and selector match, by series row.
pub fn matching_series(dataset: &Dataset, request: &SelectRequest) -> Vec<bool> {
    // The derived type labels cost six more strings per series; only build them when the
    // selector names one.
    let wants_type_labels = request
        .selector
        .matchers
        .iter()
        .any(|matcher| TYPE_LABELS.contains(&matcher.name.as_str()));
    dataset
        .series
        .iter()
        .map(|series| {
            request.types.matches(dataset.string(series.profile_type))
                && request.selector.matches(&if wants_type_labels {
                    selectable_labels(dataset, series)
                } else {
                    dataset.series_labels(series)
                })
        })
        .collect()
}

/// Sums the matching samples of one dataset per stack node.
pub fn aggregate(dataset: Arc<Dataset>, request: &SelectRequest) -> Option<DatasetSelection> {
    let mut types: Vec<(String, u32)> = Vec::new();
    let mut series_type: Vec<Option<usize>> = Vec::with_capacity(dataset.series.len());
    let mut matched = matching_series(&dataset, request);
    if let Some(ids) = &request.profile_ids {
        // Only the series of the profiles asked for: a dataset also holds its service's
        // other profiles, maybe of other types, which must not count as selected.
        let mut holds = vec![false; matched.len()];
        for row in &dataset.profiles {
            if ids.contains(&row.id) {
                if let Some(holds) = holds.get_mut(row.series as usize) {
                    *holds = true;
                }
            }
        }
        for (matched, holds) in matched.iter_mut().zip(holds) {
            *matched &= holds;
        }
    }
    for (series, matched) in dataset.series.iter().zip(matched) {
        let type_id = request
            .types
            .selected_as(dataset.string(series.profile_type));
        if !matched {
            series_type.push(None);
            continue;
        }
        let position = match types.iter().position(|(id, _)| id == type_id) {
            Some(position) => position,
            None => {
                types.push((type_id.to_string(), u32::MAX));
                types.len() - 1
            }
        };
        series_type.push(Some(position));
    }
    if types.is_empty() {
        return None;
    }
    if !dataset.stack_sum_series.is_empty()
        && request.summable(dataset.min_time_nanos, dataset.max_time_nanos)
    {
        return aggregate_sums(dataset, types, &series_type);
    }
    if dataset.samples_omitted || dataset.profiles_omitted {
        return None;
    }
    let stack_count = dataset.stack_parent.len();
    let stack_selected = call_site_mask(&dataset, &request.call_site);
    let sample_selected = span_mask(&dataset, request.span_ids.as_deref());
    let mut values = vec![vec![0i64; stack_count]; types.len()];
    let mut profiles = Vec::new();
    let offsets = dataset.profile_sample_offsets();
    for (row, profile) in dataset.profiles.iter().enumerate() {
        let Some(local_type) = series_type.get(profile.series as usize).copied().flatten() else {
            continue;
        };
        if profile.time_nanos < request.from_nanos || profile.time_nanos > request.to_nanos {
            continue;
        }
        if let Some(ids) = &request.profile_ids {
            if !ids.contains(&profile.id) {
                continue;
            }
        }
        if let Some((min, max)) = request.value_range {
            if profile.total < min || profile.total >= max {
                continue;
            }
        }
        let type_entry = &mut types[local_type];
        type_entry.1 = type_entry.1.min(profile.type_index);
        let target = &mut values[local_type];
        let mut total = 0i64;
        for sample in offsets[row] as usize..offsets[row + 1] as usize {
            let stack = dataset.sample_stack[sample] as usize;
            if stack_selected.as_ref().is_some_and(|mask| !mask[stack])
                || sample_selected.as_ref().is_some_and(|mask| !mask[sample])
            {
                continue;
            }
            let value = dataset.sample_value[sample];
            let slot = &mut target[stack];
            *slot = slot.saturating_add(value);
            total = total.saturating_add(value);
        }
        profiles.push(SelectedProfile {
            row,
            time_nanos: profile.time_nanos,
            local_type,
            total,
        });
    }
    if profiles.is_empty() {
        return None;
    }
    Some(DatasetSelection {
        dataset,
        types,
        values,
        profiles,
        summed: false,
    })
}

/// [`aggregate`] from the stack sums, for a request that covers the whole dataset: the
/// profiles' totals are stored, and each series' values per stack are summed already.
fn aggregate_sums(
    dataset: Arc<Dataset>,
    mut types: Vec<(String, u32)>,
    series_type: &[Option<usize>],
) -> Option<DatasetSelection> {
    let mut profiles = Vec::new();
    for (row, profile) in dataset.profiles.iter().enumerate() {
        let Some(local_type) = series_type.get(profile.series as usize).copied().flatten() else {
            continue;
        };
        let type_entry = &mut types[local_type];
        type_entry.1 = type_entry.1.min(profile.type_index);
        profiles.push(SelectedProfile {
            row,
            time_nanos: profile.time_nanos,
            local_type,
            total: profile.total,
        });
    }
    // Without its profile rows (read for a flame graph), a dataset is selected when a
    // matched series has sums.
    let matched = !profiles.is_empty()
        || (dataset.profiles_omitted
            && dataset.stack_sum_series.iter().any(|series| {
                series_type
                    .get(*series as usize)
                    .copied()
                    .flatten()
                    .is_some()
            }));
    if !matched {
        return None;
    }
    let mut values = vec![vec![0i64; dataset.stack_parent.len()]; types.len()];
    for ((series, stack), value) in dataset
        .stack_sum_series
        .iter()
        .zip(&dataset.stack_sum_stack)
        .zip(&dataset.stack_sum_value)
    {
        let Some(local_type) = series_type.get(*series as usize).copied().flatten() else {
            continue;
        };
        if let Some(slot) = values[local_type].get_mut(*stack as usize) {
            *slot = slot.saturating_add(*value);
        }
    }
    Some(DatasetSelection {
        dataset,
        types,
        values,
        profiles,
        summed: true,
    })
}

/// Which stack nodes lie under the call site (root first), or `None` for no call site.
/// Each node's state is the number of call-site frames its path has matched, or `FAILED`;
/// parents precede children, so one pass resolves them all.
fn call_site_mask(dataset: &Dataset, call_site: &[String]) -> Option<Vec<bool>> {
    if call_site.is_empty() {
        return None;
    }
    const FAILED: usize = usize::MAX;
    let names = crate::symbols::FrameNames::new(dataset);
    let stack_count = dataset.stack_parent.len();
    let mut matched = vec![0usize; stack_count];
    let mut selected = vec![false; stack_count];
    for node in 1..stack_count {
        let mut state = matched[dataset.stack_parent[node] as usize];
        if state != FAILED && state < call_site.len() {
            names.for_each_frame(dataset.stack_location[node], |frame| {
                if state != FAILED && state < call_site.len() {
                    state = if call_site[state] == frame {
                        state + 1
                    } else {
                        FAILED
                    };
                }
            });
        }
        matched[node] = state;
        selected[node] = state == call_site.len();
    }
    Some(selected)
}

/// Which samples carry one of the span ids, or `None` for no span filter.
fn span_mask(dataset: &Dataset, span_ids: Option<&[String]>) -> Option<Vec<bool>> {
    let span_ids = span_ids?;
    let mut selected = vec![false; dataset.sample_stack.len()];
    for ((sample, name), value) in dataset
        .sample_label_sample
        .iter()
        .zip(&dataset.sample_label_name)
        .zip(&dataset.sample_label_value)
    {
        if dataset.string(*name) == "span_id"
            && span_ids.iter().any(|id| id == dataset.string(*value))
        {
            if let Some(slot) = selected.get_mut(*sample as usize) {
                *slot = true;
            }
        }
    }
    Some(selected)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Wall time selects the agent's on- and off-CPU types and nothing else; the parts
    /// still select only themselves.
    #[test]
    fn wall_time_selects_on_and_off_cpu() {
        let wall = TypeFilter::Exact(WALL_TYPE.to_string());
        for part in WALL_PARTS {
            assert!(wall.matches(part));
        }
        let [on, off] = WALL_PARTS;
        assert!(!TypeFilter::Exact(on.to_string()).matches(off));
        assert!(!TypeFilter::Exact(off.to_string()).matches(on));
        assert!(wall.matches(WALL_TYPE));
        assert!(!wall.matches("wall:wall:nanoseconds:wall:nanoseconds"));
        assert!(!wall.matches("memory:alloc_space:bytes:space:bytes"));
    }

    /// A dataset of about `bytes` bytes on the heap.
    fn dataset_of(bytes: usize) -> Arc<Dataset> {
        // One string: its bytes and one end offset.
        let mut strings = kiln_storage::Strings::with_capacity(1, bytes - 8);
        strings.push(&"x".repeat(bytes - 8));
        let dataset = Dataset {
            strings,
            ..Default::default()
        };
        assert_eq!(dataset.heap_bytes(), bytes);
        Arc::new(dataset)
    }

    /// The access pattern of a flame graph of every service to now, asked again and again:
    /// the same datasets in turn, twice as many as fit. Evicting in insertion order
    /// answers none of them from memory; the cache must keep a stable part.
    #[test]
    fn datasets_read_in_turn_beyond_the_capacity_are_partly_kept() {
        let cache = DatasetCache::new(100 << 20);
        let keys: Vec<(String, u32)> = (0..200).map(|i| (format!("segments/{i}"), 0)).collect();
        let mut hits = 0;
        for round in 0..6 {
            for key in &keys {
                if cache.get(key, &Projection::ALL).is_some() {
                    hits += usize::from(round > 0);
                } else {
                    cache.insert(key.clone(), &dataset_of(1 << 20), Projection::ALL, None);
                }
            }
        }
        assert!(
            hits >= 5 * 200 / 5,
            "{hits} hits in 1,000 reads of 200 datasets twice the cache"
        );
        assert!(cache.entries.weight() <= 100 << 20);
    }

    #[test]
    fn an_entry_serves_what_its_projection_covers_and_a_wider_one_replaces_it() {
        let cache = DatasetCache::new(10 << 20);
        let key = ("blocks/a".to_string(), 0);
        cache.insert(key.clone(), &dataset_of(1000), Projection::SUMMED, None);
        assert!(cache.get(&key, &Projection::SUMMED).is_some());
        assert!(cache.get(&key, &Projection::ALL).is_none());
        cache.insert(key.clone(), &dataset_of(2000), Projection::ALL, None);
        assert!(cache.get(&key, &Projection::ALL).is_some());
        assert!(cache.get(&key, &Projection::SUMMED).is_some());
        // A narrower one does not replace it.
        cache.insert(key.clone(), &dataset_of(1000), Projection::SUMMED, None);
        assert!(cache.get(&key, &Projection::ALL).is_some());
        // Larger than the whole cache: not kept.
        let big = ("blocks/big".to_string(), 0);
        cache.insert(big.clone(), &dataset_of(11 << 20), Projection::ALL, None);
        assert!(cache.get(&big, &Projection::ALL).is_none());
    }
}
