//! Where a flush's segment goes: encoded, stored in the object store and registered in
//! the metastore, by one [`SegmentSink`] whose route is chosen once, when the ingester
//! starts, from the backends it was given. No flush asks which backend it is on.
//!
//! The route decides which thread does the put and the registration. On a local store a
//! put is a file write and two `fsync`s, and on SQLite a registration is one more: the
//! thread that encoded the segment can do them itself and save the two hand-offs to
//! tokio's blocking threads and back (each a wake-up of a parked thread, a few percent of
//! the server's CPU with many services at a low rate: docs/benchmarks.md, sessions 32 and
//! 33). That thread is one of the write path's, though, so it does so only while no other
//! write is on its way (with 16 clients in a closed loop waiting out its `fsync`s cost a
//! tenth of the throughput); otherwise the block goes back to the runtime, as a cloud
//! store's or PostgreSQL's always does: the write path's threads never wait on the network.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Instant;

use bytes::Bytes;
use kiln_metastore::{
    BlockMeta, DatasetMeta, Exports, Metastore, RuleRecord, SegmentCounting, WriteIdentity,
};
use kiln_storage::format::encode_block;
use kiln_storage::{Dataset, DatasetBuilder, ObjectStorage};

use super::metrics::WriterMetrics;
use super::staging::Arrivals;
use super::warm::{ServiceKey, WarmBuilders};
use crate::error::StoreError;

/// Counts a dataset's profiles by its tenant's recording rules (kiln-rules' hook, the
/// compactor's `RuleHook` too).
pub type RuleHook = Arc<dyn Fn(&[RuleRecord], &Dataset) -> Exports + Send + Sync>;

/// A segment's block, its datasets' metastore entries, and what the rules count of them
/// at registration.
type Encoded = (Vec<u8>, Vec<DatasetMeta>, Option<SegmentCounting>);

/// A segment's block and entries, with the datasets they were encoded from.
type EncodedSegment = (Vec<u8>, Vec<DatasetMeta>, Vec<Dataset>);

/// Which thread stores and registers a segment; see the module doc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// A store over the network: put and registration on the runtime.
    Runtime,
    /// A local directory with a metastore over the network (PostgreSQL): the encoding
    /// thread stores the block while quiet, the registration is on the runtime.
    StoreHere,
    /// A local directory and SQLite: the encoding thread stores and registers the block
    /// while quiet, and a write alone may land whole on the thread that parsed it.
    LandHere,
}

/// The one way segments reach storage and the metastore ([`SegmentSink::write`] from a
/// flush, [`SegmentSink::write_here`] from the thread of a write alone).
pub(super) struct SegmentSink {
    storage: ObjectStorage,
    metastore: Metastore,
    route: Route,
    /// For the puts and registrations made off the runtime.
    runtime: tokio::runtime::Handle,
    /// Whether a write is on its way, which keeps the encoding thread from waiting on
    /// `fsync`s.
    arrivals: Arc<Arrivals>,
    warm: Arc<WarmBuilders>,
    metrics: WriterMetrics,
    /// Set once the node's rules exist; segments registered before count at level 0.
    rules: OnceLock<RuleHook>,
    /// The tenants with recording rules at the last registration. A segment keeps its
    /// datasets of these tenants, decoded, for the rules to count at its registration;
    /// the others it frees as it is encoded, and level 0 counts them should a rule
    /// appear meanwhile. While any tenant has rules, logged writes wait for their
    /// segment `rules_segment_interval` at most.
    ruled: Arc<RwLock<BTreeSet<String>>>,
}

impl SegmentSink {
    pub(super) fn new(
        storage: ObjectStorage,
        metastore: Metastore,
        arrivals: Arc<Arrivals>,
        warm: Arc<WarmBuilders>,
        metrics: WriterMetrics,
    ) -> Self {
        let route = match (storage.is_local(), metastore.is_embedded()) {
            (true, true) => Route::LandHere,
            (true, false) => Route::StoreHere,
            (false, _) => Route::Runtime,
        };
        SegmentSink {
            storage,
            metastore,
            route,
            runtime: tokio::runtime::Handle::current(),
            arrivals,
            warm,
            metrics,
            rules: OnceLock::new(),
            ruled: Arc::default(),
        }
    }

    /// From now on, segments are counted by the recording rules as they are registered;
    /// `ruled`: the tenants with rules now, until the next registration says.
    pub(super) fn count_rules_with(&self, hook: RuleHook, ruled: BTreeSet<String>) {
        if self.rules.set(hook).is_ok() {
            *self.ruled.write().unwrap_or_else(|p| p.into_inner()) = ruled;
        }
    }

    /// Whether recording rules count this node's segments, and some tenant had rules at
    /// the last registration.
    pub(super) fn rules_seen(&self) -> bool {
        self.rules.get().is_some() && !self.ruled().is_empty()
    }

    fn ruled(&self) -> std::sync::RwLockReadGuard<'_, BTreeSet<String>> {
        self.ruled.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Encodes finished datasets as one segment ([`encode_segment`]). Those of tenants
    /// with rules are marked `rules_counted` and kept for the rules to count in the
    /// registration's transaction, with the rules stored then; the registration also
    /// tells which tenants have rules now.
    fn encode(
        &self,
        built: Vec<(usize, Dataset)>,
        block_id: &str,
        object_key: &str,
    ) -> Result<Encoded, StoreError> {
        let (block, mut metas, datasets) = encode_segment(built, block_id, object_key)?;
        let Some(hook) = self.rules.get().cloned() else {
            return Ok((block, metas, None));
        };
        let kept: Vec<Dataset> = {
            let ruled = self.ruled();
            for meta in &mut metas {
                meta.rules_counted = ruled.contains(&meta.tenant);
            }
            datasets
                .into_iter()
                .filter(|dataset| ruled.contains(&dataset.tenant))
                .collect()
        };
        let ruled = self.ruled.clone();
        let counting: SegmentCounting = Arc::new(move |records: &[RuleRecord]| {
            // Each tenant's rules as one slice, in this order whatever the database's
            // collation: sorted once, not filtered and copied per dataset.
            let mut records = records.to_vec();
            records.sort_by(|a, b| a.tenant.cmp(&b.tenant));
            let mut counted = Vec::new();
            for dataset in &kept {
                let start = records.partition_point(|r| r.tenant < dataset.tenant);
                let end = records.partition_point(|r| r.tenant <= dataset.tenant);
                if start < end {
                    let exports = hook(&records[start..end], dataset);
                    if !exports.is_empty() {
                        counted.push(exports);
                    }
                }
            }
            *ruled.write().unwrap_or_else(|p| p.into_inner()) =
                records.into_iter().map(|r| r.tenant).collect();
            counted
        });
        Ok((block, metas, Some(counting)))
    }

    /// Whether [`SegmentSink::write_here`] may be called: the put and the registration
    /// both complete on the calling thread.
    pub(super) fn lands_on_any_thread(&self) -> bool {
        self.route == Route::LandHere
    }

    /// Finishes the builders' datasets, encodes them as one segment and stores and
    /// registers it (with `identities`), on the route chosen at start.
    pub(super) async fn write(
        self: &Arc<Self>,
        builders: Vec<(ServiceKey, DatasetBuilder)>,
        profile_count: usize,
        block_id: &str,
        identities: Vec<WriteIdentity>,
    ) -> Result<(), StoreError> {
        let build_started = Instant::now();
        let object_key = segment_key(block_id);
        let lands = (self.route != Route::Runtime).then(|| identities.clone());
        let mut segment = self
            .build(builders, block_id.to_string(), object_key.clone(), lands)
            .await?;
        // A segment landed by its encoding thread was also stored (and registered) there.
        let build_seconds =
            build_started.elapsed().as_secs_f64() - segment.put_seconds - segment.register_seconds;
        if segment.datasets.is_empty() {
            return Ok(());
        }
        let size_bytes = segment.size_bytes;
        let landed = segment.block.is_none();
        if let Some(block) = segment.block.take() {
            let put_started = Instant::now();
            self.storage
                .put(&object_key, Bytes::from(block))
                .await
                .map_err(StoreError::Storage)?;
            segment.put_seconds = put_started.elapsed().as_secs_f64();
        }
        if !segment.registered {
            let register_started = Instant::now();
            self.metastore
                .register_segment(
                    segment_block(block_id, &object_key, size_bytes),
                    std::mem::take(&mut segment.datasets),
                    identities,
                    segment.counting.take(),
                )
                .await
                .map_err(StoreError::Metastore)?;
            segment.register_seconds = register_started.elapsed().as_secs_f64();
        }
        self.record(&segment, block_id, profile_count, build_seconds, landed);
        Ok(())
    }

    /// [`SegmentSink::write`] on this thread, for a write alone on its way; only where
    /// [`SegmentSink::lands_on_any_thread`].
    pub(super) fn write_here(
        &self,
        mut builders: Vec<(ServiceKey, DatasetBuilder)>,
        profile_count: usize,
        block_id: &str,
        identities: Vec<WriteIdentity>,
    ) -> Result<(), StoreError> {
        debug_assert!(self.lands_on_any_thread());
        let build_started = Instant::now();
        let object_key = segment_key(block_id);
        builders.sort_by(|(a, _), (b, _)| a.cmp(b));
        let share = builders
            .into_iter()
            .enumerate()
            .map(|(index, (key, builder))| (index, key, builder))
            .collect();
        let built = finish_share(share, &self.warm);
        let (block, datasets, counting) = self.encode(built, block_id, &object_key)?;
        if datasets.is_empty() {
            return Ok(());
        }
        let segment = self.land(block, datasets, counting, block_id, &object_key, identities)?;
        let build_seconds =
            build_started.elapsed().as_secs_f64() - segment.put_seconds - segment.register_seconds;
        self.record(&segment, block_id, profile_count, build_seconds, true);
        Ok(())
    }

    /// No write is being read or parsed now, so none waits for this thread.
    fn is_quiet(&self) -> bool {
        self.arrivals.count.load(Ordering::SeqCst) == 0
    }

    /// Stores an encoded segment from this thread, and registers it too on
    /// [`Route::LandHere`].
    fn land(
        &self,
        block: Vec<u8>,
        datasets: Vec<DatasetMeta>,
        counting: Option<SegmentCounting>,
        block_id: &str,
        object_key: &str,
        identities: Vec<WriteIdentity>,
    ) -> Result<Segment, StoreError> {
        let size_bytes = block.len() as u64;
        let started = Instant::now();
        self.storage
            .put_blocking(&self.runtime, object_key, Bytes::from(block))
            .map_err(StoreError::Storage)?;
        let mut segment = Segment {
            datasets,
            size_bytes,
            block: None,
            counting,
            registered: false,
            put_seconds: started.elapsed().as_secs_f64(),
            register_seconds: 0.0,
        };
        if self.route == Route::LandHere {
            let started = Instant::now();
            self.metastore
                .register_block_blocking(
                    &self.runtime,
                    segment_block(block_id, object_key, size_bytes),
                    segment.datasets.clone(),
                    identities,
                    segment.counting.take(),
                )
                .map_err(StoreError::Metastore)?;
            segment.registered = true;
            segment.register_seconds = started.elapsed().as_secs_f64();
        }
        Ok(segment)
    }

    /// Finishes one dataset per (tenant, service), on as many of the write path's threads
    /// as there are cores, and encodes them as one block, datasets in (tenant, service)
    /// order. When one thread does it all, that thread also stores the block where the
    /// route allows (`identities` given) and no write waits for it.
    async fn build(
        self: &Arc<Self>,
        mut builders: Vec<(ServiceKey, DatasetBuilder)>,
        block_id: String,
        object_key: String,
        identities: Option<Vec<WriteIdentity>>,
    ) -> Result<Segment, StoreError> {
        builders.sort_by(|(a, _), (b, _)| a.cmp(b));
        let count = builders.len();
        let threads = kiln_runtime::priority::cores().min(count).max(1);
        // Deal builders to threads largest first, so one big service does not leave the
        // other threads idle.
        let mut order: Vec<(usize, ServiceKey, DatasetBuilder)> = builders
            .into_iter()
            .enumerate()
            .map(|(index, (key, builder))| (index, key, builder))
            .collect();
        order.sort_by_cached_key(|(_, _, builder)| std::cmp::Reverse(builder.heap_bytes()));
        let mut shares: Vec<Share> = (0..threads).map(|_| Vec::new()).collect();
        for (position, entry) in order.into_iter().enumerate() {
            shares[position % threads].push(entry);
        }
        if let [share] = &mut shares[..] {
            // One thread's work (a flush of one service, most flushes at a low rate):
            // finished and encoded in one task, one hand-off to the write path's threads
            // instead of two.
            let share = std::mem::take(share);
            let sink = self.clone();
            return crate::cpu::spawn(move || {
                let (block, datasets, counting) =
                    sink.encode(finish_share(share, &sink.warm), &block_id, &object_key)?;
                match identities {
                    Some(identities) if !datasets.is_empty() && sink.is_quiet() => sink.land(
                        block,
                        datasets,
                        counting,
                        &block_id,
                        &object_key,
                        identities,
                    ),
                    _ => Ok(Segment::encoded(block, datasets, counting)),
                }
            })
            .await
            .map_err(StoreError::Task)?;
        }
        let finishing: Vec<_> = shares
            .into_iter()
            .map(|share| {
                let warm = self.warm.clone();
                crate::cpu::spawn(move || finish_share(share, &warm))
            })
            .collect();
        let mut built: Vec<(usize, Dataset)> = Vec::with_capacity(count);
        for share in finishing {
            built.extend(share.await.map_err(StoreError::Task)?);
        }
        let sink = self.clone();
        let (block, datasets, counting) =
            crate::cpu::spawn(move || sink.encode(built, &block_id, &object_key))
                .await
                .map_err(StoreError::Task)??;
        Ok(Segment::encoded(block, datasets, counting))
    }

    /// Counts a written segment.
    fn record(
        &self,
        segment: &Segment,
        block_id: &str,
        profile_count: usize,
        build_seconds: f64,
        landed: bool,
    ) {
        self.metrics.flushes.inc();
        if landed {
            self.metrics.landed.inc();
        }
        self.metrics.segment_bytes.inc_by(segment.size_bytes);
        self.metrics.profiles_written.inc_by(profile_count as u64);
        tracing::debug!(
            block = %block_id,
            bytes = segment.size_bytes,
            profiles = profile_count,
            build_seconds,
            put_seconds = segment.put_seconds,
            register_seconds = segment.register_seconds,
            "flushed segment"
        );
    }
}

/// Whether writes may be acknowledged from a write-ahead log on this node: only where
/// the node owns its store and metastore (it runs every role: a node of a cluster, even
/// one sharing a SQLite file on one host, answers reads of writes another node
/// acknowledged, which only a registered segment makes visible to it), and both are on
/// this host, where the log is.
pub fn logs_writes(storage: &ObjectStorage, metastore: &Metastore, sole_node: bool) -> bool {
    sole_node && storage.is_local() && metastore.is_embedded()
}

/// A segment's object key. The block is named when its batch opens, so its datasets'
/// index entries are complete when built, and its log file has the same name.
fn segment_key(block_id: &str) -> String {
    format!("segments/{block_id}.parquet")
}

/// The metastore row of a segment, registered now.
fn segment_block(block_id: &str, object_key: &str, size_bytes: u64) -> BlockMeta {
    BlockMeta {
        id: block_id.to_string(),
        object_key: object_key.to_string(),
        level: 0,
        size_bytes,
        created_at_ms: kiln_model::time::now_ms(),
        deleted_at_ms: None,
    }
}

/// A flush's segment, as [`SegmentSink::build`] leaves it.
struct Segment {
    /// Its datasets' entries; none when no dataset held a profile (nothing to write).
    datasets: Vec<DatasetMeta>,
    size_bytes: u64,
    /// The encoded block, still to store; `None` once stored by the thread that encoded it.
    block: Option<Vec<u8>>,
    /// What the rules count at its registration, until registered.
    counting: Option<SegmentCounting>,
    /// Registered by the thread that encoded it.
    registered: bool,
    put_seconds: f64,
    register_seconds: f64,
}

impl Segment {
    fn encoded(
        block: Vec<u8>,
        datasets: Vec<DatasetMeta>,
        counting: Option<SegmentCounting>,
    ) -> Self {
        Segment {
            datasets,
            size_bytes: block.len() as u64,
            block: Some(block),
            counting,
            registered: false,
            put_seconds: 0.0,
            register_seconds: 0.0,
        }
    }
}

/// Builders dealt to one thread, each with its index in the segment.
type Share = Vec<(usize, ServiceKey, DatasetBuilder)>;

/// Takes each builder's dataset, and gives the builder back to be warm for the next batch.
fn finish_share(share: Share, warm: &WarmBuilders) -> Vec<(usize, Dataset)> {
    share
        .into_iter()
        .map(|(index, key, mut builder)| {
            let taken = builder.take_dataset();
            warm.give_back(key, builder, &taken);
            (index, taken.dataset)
        })
        .collect()
}

/// Encodes finished datasets as one segment, in the order of their indices (the sorted
/// (tenant, service) order), leaving out those that hold no profile; returns them too.
fn encode_segment(
    mut built: Vec<(usize, Dataset)>,
    block_id: &str,
    object_key: &str,
) -> Result<EncodedSegment, StoreError> {
    built.sort_by_key(|(index, _)| *index);
    let datasets: Vec<Dataset> = built
        .into_iter()
        .map(|(_, dataset)| dataset)
        .filter(|dataset| !dataset.profiles.is_empty())
        .collect();
    let metas = datasets
        .iter()
        .enumerate()
        .map(|(row_group, dataset)| dataset_meta(dataset, block_id, object_key, row_group as u32))
        .collect();
    let block = encode_block(&datasets).map_err(StoreError::Encode)?;
    Ok((block, metas, datasets))
}

/// The metastore entry of `dataset`, stored as row group `row_group` of the block
/// `block_id` at `object_key`.
pub fn dataset_meta(
    dataset: &Dataset,
    block_id: &str,
    object_key: &str,
    row_group: u32,
) -> DatasetMeta {
    let (profile_types, profile_count) = dataset.summary();
    DatasetMeta {
        block_id: block_id.to_string(),
        object_key: object_key.to_string(),
        tenant: dataset.tenant.clone(),
        service: dataset.service.clone(),
        row_group,
        min_time_nanos: dataset.min_time_nanos,
        max_time_nanos: dataset.max_time_nanos,
        profile_types,
        profile_count,
        rules_counted: false,
    }
}
