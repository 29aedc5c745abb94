//! Group commit: requests queue their parsed profiles; a flusher gathers a batch, writes
//! it as one block object with one dataset per (tenant, service), registers the block in
//! the metastore in one transaction, and only then acknowledges every request in the batch.
//!
//! The batch is adaptive. It is flushed as soon as it reaches `flush_bytes`. Otherwise,
//! while no flush is running, it is flushed when no other write is on its way (no request
//! admitted by [`Ingester::check_room`] is still being read or parsed), or once it has
//! waited as long as the last flush took; and at the latest `flush_interval` after its
//! first profile. An idle server so acks in one segment write, not after a fixed delay.
//! Under load, what arrives while one flush runs forms the next batch, so batches grow
//! with the load and the number of blocks does not: this is the classic group commit of
//! databases, with one flush of small batches at a time (batches of `flush_bytes` may
//! overlap, up to `max_concurrent_flushes`). With `adaptive: false` every batch waits the
//! whole interval (fewest blocks, slowest acks). `min_gap` (`flush_min_gap_ms`, default
//! none) holds an adaptive flush until that long after the previous one started: a fleet
//! of services each sending rarely then shares segments, so level 0 holds fewer, larger
//! datasets for compaction and fresh queries, for up to that much more ack latency. Off by
//! default because closed-loop clients pay it on every write (docs/benchmarks.md).
//!
//! A failure anywhere fails every request of that batch with a 5xx; since the metastore
//! registration is the last step, a failed batch is never visible to readers.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kiln_metastore::{BlockMeta, DatasetMeta, Metastore};
use kiln_storage::format::encode_block;
use kiln_storage::{Dataset, DatasetBuilder, ObjectStorage};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, oneshot, Notify, Semaphore};

use crate::error::StoreError;
use crate::{IngestError, ParsedProfile};

#[derive(Debug, Clone, Copy)]
pub struct IngesterConfig {
    /// Longest a profile waits for its flush; also the shortest time between flushes
    /// under light load.
    pub flush_interval: Duration,
    /// Flush before the interval when nothing else is on its way (see the module doc).
    pub adaptive: bool,
    /// Flush early once a batch holds this many received bytes.
    pub flush_bytes: usize,
    /// Refuse new writes with 429 while decoded profiles holding this much memory wait
    /// for, or are in, a flush: the bound on the write path's memory under overload.
    pub max_pending_bytes: usize,
    /// Flushes (object writes and registrations) in flight at once.
    pub max_concurrent_flushes: usize,
    pub max_stack_depth: usize,
    /// An adaptive flush starts at least this long after the previous one started.
    pub min_gap: Duration,
}

impl Default for IngesterConfig {
    fn default() -> Self {
        IngesterConfig {
            flush_interval: Duration::from_millis(500),
            adaptive: true,
            flush_bytes: 32 << 20,
            // Counted as the decoded profiles' heap ([`ParsedProfile::decoded_bytes`]),
            // about what the old 64 MiB of protobuf encoding held; smaller, the batches
            // under load shrink and the throughput with them (docs/benchmarks.md, "Memory
            // of the write path").
            max_pending_bytes: 384 << 20,
            max_concurrent_flushes: 4,
            max_stack_depth: 1000,
            min_gap: Duration::ZERO,
        }
    }
}

struct Job {
    tenant: String,
    profiles: Vec<ParsedProfile>,
    /// Received bytes, which decide when a batch is big enough to flush.
    bytes: usize,
    /// Decoded bytes, counted in `pending_bytes` until the flush is done.
    decoded: usize,
    ack: oneshot::Sender<Result<(), IngestError>>,
}

/// Counters of the write path, exported on `/metrics`.
#[derive(Clone)]
pub struct WriterMetrics {
    pub flushes: Counter,
    pub flush_failures: Counter,
    pub segment_bytes: Counter,
    pub profiles_written: Counter,
    pub flush_seconds: Histogram,
    /// Why each batch was flushed: `size`, `idle`, `interval` or `shutdown`.
    pub flush_reasons: Family<ReasonLabel, Counter>,
    /// Requests acknowledged by each flush.
    pub batch_requests: Histogram,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

impl WriterMetrics {
    fn new() -> Self {
        WriterMetrics {
            flushes: Counter::default(),
            flush_failures: Counter::default(),
            segment_bytes: Counter::default(),
            profiles_written: Counter::default(),
            flush_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            flush_reasons: Family::default(),
            batch_requests: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
        }
    }

    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kiln_ingest_flushes",
            "Segments flushed",
            self.flushes.clone(),
        );
        registry.register(
            "kiln_ingest_flush_failures",
            "Segment flushes that failed (their requests got 5xx)",
            self.flush_failures.clone(),
        );
        registry.register(
            "kiln_ingest_segment_bytes",
            "Bytes of segment objects written",
            self.segment_bytes.clone(),
        );
        registry.register(
            "kiln_ingest_profiles_written",
            "Profiles durably written and registered",
            self.profiles_written.clone(),
        );
        registry.register_with_unit(
            "kiln_ingest_flush_duration",
            "Time to build, write and register one segment",
            prometheus_client::registry::Unit::Seconds,
            self.flush_seconds.clone(),
        );
        registry.register(
            "kiln_ingest_flush_reason",
            "Segment flushes by what started them: size (flush_bytes), idle (nothing else on its way), interval (flush_interval), shutdown",
            self.flush_reasons.clone(),
        );
        registry.register(
            "kiln_ingest_flush_requests",
            "Write requests acknowledged by one segment flush",
            self.batch_requests.clone(),
        );
    }
}

/// The handle requests write through. Cloning is cheap; the flusher stops when every
/// handle is dropped, after flushing what is queued.
#[derive(Clone)]
pub struct Ingester {
    sender: mpsc::Sender<Job>,
    pending_bytes: Arc<AtomicUsize>,
    arrivals: Arc<Arrivals>,
    config: IngesterConfig,
    metrics: WriterMetrics,
}

impl Ingester {
    pub fn start(
        storage: ObjectStorage,
        metastore: Metastore,
        config: IngesterConfig,
    ) -> (Ingester, tokio::task::JoinHandle<()>) {
        let (sender, receiver) = mpsc::channel(4096);
        let pending_bytes = Arc::new(AtomicUsize::new(0));
        let arrivals = Arc::new(Arrivals::default());
        let metrics = WriterMetrics::new();
        let flusher = Flusher {
            storage,
            metastore,
            config,
            pending_bytes: pending_bytes.clone(),
            arrivals: arrivals.clone(),
            flushing: AtomicUsize::new(0),
            last_flush_micros: AtomicU64::new(5_000),
            metrics: metrics.clone(),
        };
        let handle = tokio::spawn(flusher.run(receiver));
        (
            Ingester {
                sender,
                pending_bytes,
                arrivals,
                config,
                metrics,
            },
            handle,
        )
    }

    pub fn metrics(&self) -> &WriterMetrics {
        &self.metrics
    }

    fn full(&self, pending: usize) -> IngestError {
        IngestError::Overloaded(format!(
            "server busy: profiles of {pending} decoded bytes are waiting to be written, at the limit of {} (max_pending_bytes); retry shortly",
            self.config.max_pending_bytes
        ))
    }

    /// Refuses at once while the write queue is full: checked before a request's body is
    /// read and parsed, so that an overloaded server spends nothing on what it would
    /// refuse after parsing. The [`Arrival`] it returns tells the flusher a write is on
    /// its way until it is handed to [`Ingester::write_arrived`] or dropped.
    pub fn check_room(&self) -> Result<Arrival, IngestError> {
        let pending = self.pending_bytes.load(Ordering::Relaxed);
        if pending >= self.config.max_pending_bytes {
            return Err(self.full(pending));
        }
        self.arrivals.count.fetch_add(1, Ordering::SeqCst);
        Ok(Arrival {
            arrivals: self.arrivals.clone(),
        })
    }

    /// Queues the profiles and waits until they are durable and registered.
    pub async fn write(
        &self,
        tenant: &str,
        profiles: Vec<ParsedProfile>,
    ) -> Result<(), IngestError> {
        self.queue(tenant, profiles, None).await
    }

    /// As [`Ingester::write`], for a request admitted by [`Ingester::check_room`]: its
    /// arrival ends once the profiles are queued, so the flusher need not wait for it.
    pub async fn write_arrived(
        &self,
        tenant: &str,
        profiles: Vec<ParsedProfile>,
        arrival: Arrival,
    ) -> Result<(), IngestError> {
        self.queue(tenant, profiles, Some(arrival)).await
    }

    async fn queue(
        &self,
        tenant: &str,
        profiles: Vec<ParsedProfile>,
        arrival: Option<Arrival>,
    ) -> Result<(), IngestError> {
        if profiles.is_empty() {
            return Ok(());
        }
        let bytes: usize = profiles.iter().map(|p| p.received_bytes.max(1)).sum();
        let decoded: usize = profiles.iter().map(|p| p.decoded_bytes.max(1)).sum();
        let before = self.pending_bytes.fetch_add(decoded, Ordering::SeqCst);
        if before + decoded > self.config.max_pending_bytes && before > 0 {
            self.pending_bytes.fetch_sub(decoded, Ordering::SeqCst);
            return Err(self.full(before));
        }
        let (ack, acked) = oneshot::channel();
        let job = Job {
            tenant: tenant.to_string(),
            profiles,
            bytes,
            decoded,
            ack,
        };
        if self.sender.send(job).await.is_err() {
            self.pending_bytes.fetch_sub(decoded, Ordering::SeqCst);
            return Err(IngestError::ShuttingDown);
        }
        // Queued before the arrival ends, so a flusher that sees no arrivals left finds
        // this job in the channel.
        drop(arrival);
        acked.await.unwrap_or(Err(IngestError::ShuttingDown))
    }
}

/// Writes admitted but not yet queued, and a wake-up for the flusher whenever one ends
/// or a flush finishes.
#[derive(Default)]
struct Arrivals {
    count: AtomicUsize,
    changed: Notify,
}

/// A write on its way to the flusher (being read or parsed); see [`Ingester::check_room`].
pub struct Arrival {
    arrivals: Arc<Arrivals>,
}

impl Drop for Arrival {
    fn drop(&mut self) {
        self.arrivals.count.fetch_sub(1, Ordering::SeqCst);
        self.arrivals.changed.notify_one();
    }
}

struct Flusher {
    storage: ObjectStorage,
    metastore: Metastore,
    config: IngesterConfig,
    pending_bytes: Arc<AtomicUsize>,
    arrivals: Arc<Arrivals>,
    /// Flushes running now.
    flushing: AtomicUsize,
    /// How long the last flush took.
    last_flush_micros: AtomicU64,
    metrics: WriterMetrics,
}

impl Flusher {
    async fn run(self, mut receiver: mpsc::Receiver<Job>) {
        let flusher = Arc::new(self);
        let permits = Arc::new(Semaphore::new(flusher.config.max_concurrent_flushes.max(1)));
        let mut closed = false;
        let mut last_started: Option<tokio::time::Instant> = None;
        while !closed {
            let Some(first) = receiver.recv().await else {
                break;
            };
            let opened = tokio::time::Instant::now();
            let deadline = opened + flusher.config.flush_interval;
            let mut batch_bytes = first.bytes;
            let mut batch = vec![first];
            let reason = loop {
                while let Ok(job) = receiver.try_recv() {
                    batch_bytes += job.bytes;
                    batch.push(job);
                }
                if batch_bytes >= flusher.config.flush_bytes {
                    break "size";
                }
                let mut wake = deadline;
                let earliest = last_started.map_or(opened, |at| at + flusher.config.min_gap);
                if flusher.config.adaptive
                    && flusher.flushing.load(Ordering::SeqCst) == 0
                    && tokio::time::Instant::now() < earliest
                {
                    wake = wake.min(earliest);
                } else if flusher.config.adaptive && flusher.flushing.load(Ordering::SeqCst) == 0 {
                    if flusher.arrivals.count.load(Ordering::SeqCst) == 0 {
                        // Arrivals end after their job is queued: take any that just did.
                        while let Ok(job) = receiver.try_recv() {
                            batch.push(job);
                        }
                        break "idle";
                    }
                    // Writes on their way are worth waiting for about as long as one
                    // flush takes; longer, and the wait costs more than a smaller batch.
                    let linger = opened + flusher.linger();
                    if tokio::time::Instant::now() >= linger {
                        break "busy";
                    }
                    wake = wake.min(linger);
                }
                tokio::select! {
                    job = receiver.recv() => match job {
                        Some(job) => {
                            batch_bytes += job.bytes;
                            batch.push(job);
                        }
                        None => {
                            closed = true;
                            break "shutdown";
                        }
                    },
                    () = flusher.arrivals.changed.notified(), if flusher.config.adaptive => {}
                    () = tokio::time::sleep_until(wake) => if wake >= deadline {
                        break "interval";
                    },
                }
            };
            flusher
                .metrics
                .flush_reasons
                .get_or_create(&ReasonLabel { reason })
                .inc();
            let Ok(permit) = permits.clone().acquire_owned().await else {
                break;
            };
            flusher.flushing.fetch_add(1, Ordering::SeqCst);
            last_started = Some(tokio::time::Instant::now());
            let flusher = flusher.clone();
            tokio::spawn(async move {
                flusher.flush(batch).await;
                flusher.flushing.fetch_sub(1, Ordering::SeqCst);
                flusher.arrivals.changed.notify_one();
                drop(permit);
            });
        }
        // Wait for in-flight flushes before reporting the writer stopped.
        let _ = permits
            .acquire_many(flusher.config.max_concurrent_flushes.max(1) as u32)
            .await;
    }

    /// How long a batch waits for writes still on their way: the last flush's duration,
    /// within [1 ms, `flush_interval`].
    fn linger(&self) -> Duration {
        Duration::from_micros(self.last_flush_micros.load(Ordering::Relaxed))
            .clamp(Duration::from_millis(1), self.config.flush_interval)
    }

    async fn flush(&self, batch: Vec<Job>) {
        self.metrics.batch_requests.observe(batch.len() as f64);
        let started = Instant::now();
        let mut acks = Vec::with_capacity(batch.len());
        let mut work = Vec::with_capacity(batch.len());
        let mut decoded = 0;
        for job in batch {
            acks.push(job.ack);
            decoded += job.decoded;
            work.push((job.tenant, job.profiles));
        }
        let result = self.write_segment(work).await.map_err(Arc::new);
        let took = started.elapsed();
        self.metrics.flush_seconds.observe(took.as_secs_f64());
        self.last_flush_micros.store(
            u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        self.pending_bytes.fetch_sub(decoded, Ordering::SeqCst);
        if let Err(err) = &result {
            self.metrics.flush_failures.inc();
            tracing::error!(error = %err, requests = acks.len(), "segment flush failed");
        }
        for ack in acks {
            let _ = ack.send(match &result {
                Ok(()) => Ok(()),
                Err(err) => Err(IngestError::Store(err.clone())),
            });
        }
    }

    async fn write_segment(
        &self,
        work: Vec<(String, Vec<ParsedProfile>)>,
    ) -> Result<(), StoreError> {
        let max_stack_depth = self.config.max_stack_depth;
        let profile_count: usize = work.iter().map(|(_, profiles)| profiles.len()).sum();
        let build_started = Instant::now();
        // The block is named first, so its datasets' index entries are complete when built.
        let block_id = ulid::Ulid::new().to_string();
        let object_key = format!("segments/{block_id}.parquet");
        let (block, datasets) = {
            let (block_id, object_key) = (block_id.clone(), object_key.clone());
            tokio::task::spawn_blocking(move || {
                kiln_model::priority::background_thread();
                build_segment(work, max_stack_depth, &block_id, &object_key)
            })
            .await
            .map_err(StoreError::Task)??
        };
        let build_seconds = build_started.elapsed().as_secs_f64();
        if datasets.is_empty() {
            return Ok(());
        }
        let size_bytes = block.len() as u64;
        let put_started = Instant::now();
        self.storage
            .put(&object_key, Bytes::from(block))
            .await
            .map_err(StoreError::Storage)?;
        let put_seconds = put_started.elapsed().as_secs_f64();
        let block_meta = BlockMeta {
            id: block_id.clone(),
            object_key: object_key.clone(),
            level: 0,
            size_bytes,
            created_at_ms: kiln_model::time::now_ms(),
            deleted_at_ms: None,
        };
        let register_started = Instant::now();
        self.metastore
            .register_block(block_meta, datasets)
            .await
            .map_err(StoreError::Metastore)?;
        let register_seconds = register_started.elapsed().as_secs_f64();
        self.metrics.flushes.inc();
        self.metrics.segment_bytes.inc_by(size_bytes);
        self.metrics.profiles_written.inc_by(profile_count as u64);
        tracing::debug!(
            block = %block_id,
            bytes = size_bytes,
            profiles = profile_count,
            build_seconds,
            put_seconds,
            register_seconds,
            "flushed segment"
        );
        Ok(())
    }
}

/// Builds one dataset per (tenant, service), on as many threads as there are cores, and
/// encodes them as one block.
fn build_segment(
    work: Vec<(String, Vec<ParsedProfile>)>,
    max_stack_depth: usize,
    block_id: &str,
    object_key: &str,
) -> Result<(Vec<u8>, Vec<DatasetMeta>), StoreError> {
    let mut groups: BTreeMap<(String, String), Vec<&ParsedProfile>> = BTreeMap::new();
    for (tenant, profiles) in &work {
        for profile in profiles {
            groups
                .entry((tenant.clone(), profile.service().to_string()))
                .or_default()
                .push(profile);
        }
    }
    let groups: Vec<((String, String), Vec<&ParsedProfile>)> = groups.into_iter().collect();
    let threads = kiln_model::priority::cores().min(groups.len()).max(1);
    // Deal datasets to threads largest first, so one big service does not leave the
    // other threads idle.
    let mut order: Vec<usize> = (0..groups.len()).collect();
    order.sort_by_key(|index| std::cmp::Reverse(groups[*index].1.len()));
    let mut assignments: Vec<Vec<usize>> = vec![Vec::new(); threads];
    for (position, index) in order.into_iter().enumerate() {
        assignments[position % threads].push(index);
    }
    let build = |indexes: &[usize]| -> Vec<(usize, Dataset)> {
        indexes
            .iter()
            .map(|index| {
                let ((tenant, service), profiles) = &groups[*index];
                let dataset = build_dataset(tenant, service, profiles, max_stack_depth);
                (*index, dataset)
            })
            .collect()
    };
    // The first share is built on this thread: a flush of one service (most flushes of
    // many services at a low rate) starts no thread at all.
    let mut built: Vec<(usize, Dataset)> = std::thread::scope(|scope| {
        let Some((here, elsewhere)) = assignments.split_first() else {
            return Vec::new();
        };
        let handles: Vec<_> = elsewhere
            .iter()
            .map(|indexes| scope.spawn(|| build(indexes)))
            .collect();
        let mut built = build(here);
        for handle in handles {
            built.extend(handle.join().unwrap_or_default());
        }
        built
    });
    if built.len() != groups.len() {
        return Err(StoreError::Build(
            "a dataset builder thread panicked".to_string(),
        ));
    }
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
    Ok((block, metas))
}

fn build_dataset(
    tenant: &str,
    service: &str,
    profiles: &[&ParsedProfile],
    max_stack_depth: usize,
) -> Dataset {
    let mut builder = DatasetBuilder::new(tenant, service);
    for profile in profiles {
        builder.add_pprof(&profile.input(max_stack_depth));
    }
    builder.finish()
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
    }
}
