//! Group commit: requests stage their parsed profiles into the open batch, a flusher
//! writes the batch as one block object with one dataset per (tenant, service), registers
//! the block in the metastore in one transaction, and only then acknowledges every request
//! in the batch.
//!
//! A batch (a `Generation`) holds one [`DatasetBuilder`] per (tenant, service), and a
//! request interns its profiles into them as soon as they are parsed, on the write path's
//! threads (`Ingester::stage`, [`crate::cpu`]); the decoded profile is dropped there. So
//! what waits for a flush is the interned form, where a service's symbols are stored once
//! however many of its profiles arrived (at 1,000 clients 20–90 MiB where the decoded
//! profiles reached 384 MiB: docs/benchmarks.md, "Memory of the write path"), and the
//! flush is left with finishing, encoding and writing. A service's builder outlives its
//! batch: the flush takes only the dataset of its profiles, and the next batch of that
//! service starts from the builder's symbol tables ([`WarmBuilders`]). A flush swaps the open generation for a fresh one
//! under a lock that every staging request holds for its whole add, so each request lands
//! whole in exactly one generation and waits for that one's result.
//!
//! The batch is adaptive. It is flushed as soon as it reaches `flush_bytes`. Otherwise,
//! while no flush is running, it is flushed when no other write is on its way (no request
//! admitted by [`Ingester::check_room`] is still being read or parsed), or once it has
//! waited as long as the last flush took; and at the latest `flush_interval` after its
//! first profile. An idle server so acks in one segment write, not after a fixed delay.
//! Under load, what arrives while one flush runs forms the next batch, so batches grow
//! with the load and the number of blocks does not: this is the classic group commit of
//! databases, with one flush of small batches at a time (batches of `flush_bytes` may
//! overlap, up to `max_concurrent_flushes`). A write that is alone, when the flusher
//! would flush it at once, flushes itself on the thread that parsed it
//! (`Flusher::flush_alone`): the same decision, without the flusher's round trips. With
//! `adaptive: false` every batch waits the whole interval (fewest blocks, slowest acks). `min_gap` (`flush_min_gap_ms`, default
//! none) holds an adaptive flush until that long after the previous one started: a fleet
//! of services each sending rarely then shares segments, so level 0 holds fewer, larger
//! datasets for compaction and fresh queries, for up to that much more ack latency. Off by
//! default because closed-loop clients pay it on every write (docs/benchmarks.md). While
//! compaction is behind, the gap grows with its backlog ([`crate::backoff`]).
//!
//! A failure anywhere fails every request of that batch with a 5xx; since the metastore
//! registration is the last step, a failed batch is never visible to readers.
//!
//! With a write-ahead log ([`crate::wal`], a node running every role on a local store and
//! SQLite), a write that arrives while no other is on its way, or that joins a batch
//! logged already, does not wait for a segment at all: it is appended to its batch's log
//! and acknowledged once that is on disk, and a batch of such writes is flushed per
//! `segment_interval` (or size, memory, a read that asks, or a write that was not logged
//! joining it; `Flusher::gather_logged`). Reads call
//! [`Syncer::sync`] first, which flushes the open batch. A logged batch whose flush fails
//! is written again from its log until that succeeds.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kiln_metastore::{BlockMeta, DatasetMeta, Metastore, WriteIdentity};
use kiln_storage::builder::Taken;
use kiln_storage::format::encode_block;
use kiln_storage::{Dataset, DatasetBuilder, ObjectStorage};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, watch, Notify, Semaphore};

use crate::backoff::{Backoff, BackoffMetrics};
use crate::dedup::{Dedup, Idempotence, Resolver};
use crate::error::StoreError;
use crate::wal::{Wal, WalFile};
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
    /// Refuse new writes with 429 while staged profiles holding this much memory wait
    /// for, or are in, a flush (their dataset builders' heap): the bound on the write
    /// path's memory under overload.
    pub max_pending_bytes: usize,
    /// Flushes (object writes and registrations) in flight at once.
    pub max_concurrent_flushes: usize,
    pub max_stack_depth: usize,
    /// An adaptive flush starts at least this long after the previous one started.
    pub min_gap: Duration,
    /// While level-0 datasets wait longer than this for their merge on average, adaptive
    /// flushes are spaced further apart (`compaction.max_wait_ms`; see
    /// [`crate::backoff`]). `None` when nothing compacts.
    pub max_compaction_wait: Option<Duration>,
    /// With a write-ahead log ([`Ingester::start_with_wal`]), the longest a logged
    /// profile waits in memory for its segment (`wal_segment_interval_ms`).
    pub segment_interval: Duration,
}

impl Default for IngesterConfig {
    fn default() -> Self {
        IngesterConfig {
            flush_interval: Duration::from_millis(500),
            adaptive: true,
            flush_bytes: 32 << 20,
            // Counted as the staged builders' heap, a service's symbols once however
            // many of its profiles wait: at 1,000 clients the batches hold well under
            // 128 MiB, so the bound only bites under overload (docs/benchmarks.md,
            // "Memory of the write path").
            max_pending_bytes: 128 << 20,
            max_concurrent_flushes: 4,
            max_stack_depth: 1000,
            min_gap: Duration::ZERO,
            max_compaction_wait: None,
            // Memory ends most batches of many services first (`logged_memory_limit`):
            // 30 s against 10 s was 1.31× at 500 services (docs/benchmarks.md, session 36).
            segment_interval: Duration::from_secs(30),
        }
    }
}

/// A staged request, as the flusher hears of it: enough to size and time the batch.
struct Job {
    generation: u64,
    /// Received bytes, which decide when a batch is big enough to flush.
    bytes: usize,
    /// Sent by [`Ingester::sync`]: flush the open batch now.
    sync: bool,
    /// Acknowledged from the write-ahead log already; otherwise its request waits for
    /// the flush.
    logged: bool,
}

type FlushResult = Option<Result<(), Arc<StoreError>>>;
/// (tenant, service).
type ServiceKey = (String, String);
type SharedBuilder = Arc<Mutex<DatasetBuilder>>;

/// One batch: the builders that staged requests intern into, until a flush takes them.
struct Generation {
    id: u64,
    /// The block id of its segment, and the name of its log file.
    block_id: String,
    /// Its log file, created by the first request logged here.
    wal: Mutex<Option<Arc<WalFile>>>,
    builders: Mutex<HashMap<ServiceKey, SharedBuilder>>,
    /// Heap of the builders, counted in `pending_bytes` until the flush is done.
    bytes: AtomicUsize,
    requests: AtomicUsize,
    profiles: AtomicUsize,
    /// The flush's outcome, for every request staged here.
    done: watch::Sender<FlushResult>,
    /// Identities of the profiles staged here, registered with the segment.
    identities: Mutex<Vec<WriteIdentity>>,
    /// Their outcome as their duplicates wait for it, resolved with the flush.
    resolvers: Mutex<Vec<Resolver>>,
}

impl Generation {
    fn new(id: u64) -> Self {
        Generation {
            id,
            block_id: ulid::Ulid::new().to_string(),
            wal: Mutex::new(None),
            builders: Mutex::new(HashMap::new()),
            bytes: AtomicUsize::new(0),
            requests: AtomicUsize::new(0),
            profiles: AtomicUsize::new(0),
            done: watch::channel(None).0,
            identities: Mutex::default(),
            resolvers: Mutex::default(),
        }
    }

    /// The identities to register with this generation's segment.
    fn take_identities(&self) -> Vec<WriteIdentity> {
        std::mem::take(
            &mut *self
                .identities
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    fn builder(
        &self,
        tenant: &str,
        service: &str,
        warm: &WarmBuilders,
    ) -> Arc<Mutex<DatasetBuilder>> {
        let mut builders = self.builders.lock().unwrap_or_else(PoisonError::into_inner);
        builders
            .entry((tenant.to_string(), service.to_string()))
            .or_insert_with(|| Arc::new(Mutex::new(warm.take(tenant, service))))
            .clone()
    }

    /// Its log file, created if this is the first request logged here.
    fn wal_file(&self, wal: &Wal) -> std::io::Result<Arc<WalFile>> {
        let mut file = self.wal.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(file) = &*file {
            return Ok(file.clone());
        }
        let created = Arc::new(wal.create(&self.block_id)?);
        *file = Some(created.clone());
        Ok(created)
    }
}

/// The open generation, shared by the ingester handles and the flusher. Staging holds
/// the read lock for its whole add; a flush takes the write lock to swap in a new one.
struct Staging {
    open: RwLock<Arc<Generation>>,
    next_id: AtomicU64,
    warm: Arc<WarmBuilders>,
    /// The write-ahead log, when writes are acknowledged from it.
    wal: Option<Wal>,
    /// Generations swapped out and not yet settled, for [`Ingester::sync`]: added under
    /// the write lock that swaps them, so a reader of the open generation finds every
    /// older one here or settled.
    closed: Mutex<BTreeMap<u64, Arc<Generation>>>,
}

impl Staging {
    /// Closes the open generation and opens the next; waits for adds in progress.
    fn swap(&self) -> Arc<Generation> {
        let mut open = self.open.write().unwrap_or_else(PoisonError::into_inner);
        self.open_next(&mut open)
    }

    /// [`Staging::swap`] when no add is in progress; `None` when it would wait.
    fn try_swap(&self) -> Option<Arc<Generation>> {
        self.try_swap_if(|_| true)
    }

    /// [`Staging::try_swap`] of the open generation only if `wanted` says so of it, under
    /// the write lock: no add can join it between the check and the swap.
    fn try_swap_if(&self, wanted: impl FnOnce(&Generation) -> bool) -> Option<Arc<Generation>> {
        let mut open = match self.open.try_write() {
            Ok(open) => open,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        if !wanted(&open) {
            return None;
        }
        Some(self.open_next(&mut open))
    }

    /// Puts a new generation in `open`'s place (under the write lock) and returns the old.
    fn open_next(&self, open: &mut Arc<Generation>) -> Arc<Generation> {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let closed = std::mem::replace(open, Arc::new(Generation::new(id)));
        if self.wal.is_some() {
            self.closed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(closed.id, closed.clone());
        }
        closed
    }

    /// The open generation's id, without the lock: only the flusher swaps, so between
    /// its swaps this is exact.
    fn open_id(&self) -> u64 {
        self.next_id.load(Ordering::SeqCst) - 1
    }

    /// Heap of the open generation's builders: what the next flush takes, without the
    /// flushes in progress that `pending_bytes` also counts.
    fn open_bytes(&self) -> usize {
        let open = self.open.read().unwrap_or_else(PoisonError::into_inner);
        open.bytes.load(Ordering::SeqCst)
    }

    /// Whether a request was logged in the open generation: its flush then waits for
    /// `segment_interval` (or size, memory, a read), and a write joining it unlogged
    /// would cut that short.
    fn open_is_logged(&self) -> bool {
        let open = self.open.read().unwrap_or_else(PoisonError::into_inner);
        let logged = open
            .wal
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some();
        logged
    }
}

/// A request's profiles, interned into a generation, waiting for its flush.
struct Staged {
    generation: u64,
    done: watch::Receiver<FlushResult>,
    received_bytes: usize,
    /// Durable in the write-ahead log: acknowledged without waiting for the flush.
    logged: bool,
}

/// Counters of the write path, exported on `/metrics`.
#[derive(Clone)]
pub struct WriterMetrics {
    pub flushes: Counter,
    /// Of them, segments stored by the thread that encoded them ([`Landing`]).
    pub landed: Counter,
    pub flush_failures: Counter,
    pub segment_bytes: Counter,
    pub profiles_written: Counter,
    pub flush_seconds: Histogram,
    /// Why each batch was flushed: `size`, `idle`, `interval` or `shutdown`.
    pub flush_reasons: Family<ReasonLabel, Counter>,
    /// Requests acknowledged by each flush.
    pub batch_requests: Histogram,
    /// Bytes counted against `max_pending_bytes` now.
    pub pending_bytes: Gauge,
    /// Heap of the symbol tables kept warm between flushes ([`WarmBuilders`]).
    pub warm_bytes: Gauge,
    /// Requests appended to the write-ahead log, and the `fdatasync`s that made them
    /// durable (fewer when writes share one).
    pub wal_records: Counter,
    pub wal_syncs: Counter,
    /// Profiles staged again from log files whose segment was not registered.
    pub wal_recovered: Counter,
    backoff: BackoffMetrics,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

impl WriterMetrics {
    fn new() -> Self {
        WriterMetrics {
            flushes: Counter::default(),
            landed: Counter::default(),
            flush_failures: Counter::default(),
            segment_bytes: Counter::default(),
            profiles_written: Counter::default(),
            flush_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            flush_reasons: Family::default(),
            batch_requests: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            pending_bytes: Gauge::default(),
            warm_bytes: Gauge::default(),
            wal_records: Counter::default(),
            wal_syncs: Counter::default(),
            wal_recovered: Counter::default(),
            backoff: BackoffMetrics::default(),
        }
    }

    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kiln_ingest_flushes",
            "Segments flushed",
            self.flushes.clone(),
        );
        registry.register(
            "kiln_ingest_flushes_landed",
            "Segments stored (and, with SQLite, registered) by the write-path thread that encoded them, with no hand-off to the blocking pool: one-service flushes while no other write was on its way, on a local store",
            self.landed.clone(),
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
            "Segment flushes by what started them: size (flush_bytes), idle (nothing else on its way), alone (the only write on its way, flushed by the thread that parsed it), busy (waited about one flush for writes on their way), interval (flush_interval, or wal_segment_interval_ms with the write-ahead log), memory (logged profiles holding three quarters of max_pending_bytes), query (a read asked for what is logged to be visible), unlogged (a write that was not logged joined a logged batch), shutdown",
            self.flush_reasons.clone(),
        );
        registry.register(
            "kiln_ingest_flush_requests",
            "Write requests acknowledged by one segment flush",
            self.batch_requests.clone(),
        );
        registry.register(
            "kiln_ingest_pending_bytes",
            "Memory of the staged profiles waiting for, or in, a flush, counted against max_pending_bytes",
            self.pending_bytes.clone(),
        );
        registry.register(
            "kiln_ingest_warm_symbol_bytes",
            "Memory of the services' symbol tables kept between flushes, at most an eighth of max_pending_bytes",
            self.warm_bytes.clone(),
        );
        registry.register(
            "kiln_ingest_wal_records",
            "Write requests appended to the write-ahead log",
            self.wal_records.clone(),
        );
        registry.register(
            "kiln_ingest_wal_syncs",
            "fdatasyncs of the write-ahead log; each made every record appended before it durable",
            self.wal_syncs.clone(),
        );
        registry.register(
            "kiln_ingest_wal_recovered_profiles",
            "Profiles staged again from write-ahead log files whose segment was not registered (after a crash or a failed flush)",
            self.wal_recovered.clone(),
        );
        registry.register(
            "kiln_ingest_compaction_backlog_datasets",
            "Level-0 datasets waiting for their merge, as the write path last read them",
            self.backoff.datasets.clone(),
        );
        registry.register(
            "kiln_ingest_compaction_wait_seconds",
            "Mean time level-0 datasets have waited for their merge, as the write path last read it",
            self.backoff.wait_seconds.clone(),
        );
        registry.register(
            "kiln_ingest_flush_backoff_seconds",
            "Extra spacing between flushes while level-0 datasets wait longer than compaction.max_wait_ms",
            self.backoff.gap_seconds.clone(),
        );
    }
}

/// How long a service's symbol tables are kept without a flush of that service.
const WARM_FOR: Duration = Duration::from_secs(60);
/// Tables holding more than this many rows per row the last flush used are mostly other
/// profiles' symbols: walking them at each flush would cost more than the lookups save,
/// so they are dropped.
const WARM_MAX_ROWS_PER_USED: usize = 8;

/// Each service's dataset builder, kept between flushes with its symbol tables so that
/// the next batch of that service interns what it knows with one lookup per symbol
/// (`DatasetBuilder::take_dataset` writes only the rows a flush uses). Bounded: at most
/// an eighth of `max_pending_bytes` in all and a quarter of that per service, tables
/// mostly unused are dropped, and so is a service not flushed for [`WARM_FOR`].
struct WarmBuilders {
    budget: usize,
    inner: Mutex<WarmInner>,
    gauge: Gauge,
}

#[derive(Default)]
struct WarmInner {
    builders: HashMap<ServiceKey, (DatasetBuilder, usize, Instant)>,
    bytes: usize,
}

impl WarmBuilders {
    fn new(max_pending_bytes: usize, gauge: Gauge) -> Self {
        WarmBuilders {
            budget: max_pending_bytes / 8,
            inner: Mutex::default(),
            gauge,
        }
    }

    /// The service's warm builder, or a new one.
    fn take(&self, tenant: &str, service: &str) -> DatasetBuilder {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (tenant.to_string(), service.to_string());
        match inner.builders.remove(&key) {
            Some((builder, bytes, _)) => {
                inner.bytes -= bytes;
                self.gauge.set(inner.bytes as i64);
                builder
            }
            None => DatasetBuilder::new(tenant, service),
        }
    }

    /// Keeps a builder whose profiles a flush took, if it is worth keeping and fits: a
    /// new one, to see whether the next flush finds its symbols, or a warm one where it
    /// did (at least half of the rows the flush used were known). A service whose
    /// symbols churn, or that sends several programs under one name, starts afresh.
    fn give_back(&self, key: ServiceKey, builder: DatasetBuilder, taken: &Taken) {
        let used = taken.used_rows.max(1);
        let paid = !taken.warm || taken.new_rows * 2 <= used;
        if !paid || builder.symbol_rows() > used * WARM_MAX_ROWS_PER_USED {
            return;
        }
        let bytes = builder.heap_bytes();
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let WarmInner {
            builders,
            bytes: held,
        } = &mut *inner;
        builders.retain(|_, (_, kept, returned)| {
            let keep = now.duration_since(*returned) < WARM_FOR;
            if !keep {
                *held -= *kept;
            }
            keep
        });
        // A newer batch of the service may have returned its builder first: one is kept.
        if let Some((_, kept, _)) = builders.remove(&key) {
            *held -= kept;
        }
        if bytes <= self.budget / 4 && *held + bytes <= self.budget {
            *held += bytes;
            builders.insert(key, (builder, bytes, now));
        }
        self.gauge.set(*held as i64);
    }
}

/// The handle requests write through. Cloning is cheap; the flusher stops when every
/// handle is dropped, after flushing what is staged.
#[derive(Clone)]
pub struct Ingester {
    sender: mpsc::Sender<Job>,
    pending_bytes: Arc<AtomicUsize>,
    arrivals: Arc<Arrivals>,
    staging: Arc<Staging>,
    backoff: Arc<Backoff>,
    config: IngesterConfig,
    metrics: WriterMetrics,
    /// For a write that flushes itself ([`Flusher::flush_alone`]).
    flusher: Arc<Flusher>,
    /// Identities of recent writes, so a retry is not stored twice.
    dedup: Arc<Dedup>,
}

impl Ingester {
    pub fn start(
        storage: ObjectStorage,
        metastore: Metastore,
        config: IngesterConfig,
    ) -> (Ingester, tokio::task::JoinHandle<()>) {
        Self::start_with_wal(storage, metastore, config, None)
    }

    /// [`Ingester::start`], acknowledging writes from the write-ahead log in `wal`
    /// ([`crate::wal`]) when given. Log files left there are recovered first.
    pub fn start_with_wal(
        storage: ObjectStorage,
        metastore: Metastore,
        config: IngesterConfig,
        wal: Option<Wal>,
    ) -> (Ingester, tokio::task::JoinHandle<()>) {
        let (sender, receiver) = mpsc::channel(4096);
        // Listed before any write can open a log file of this run.
        let leftovers = match &wal {
            Some(wal) => wal.leftovers().unwrap_or_else(|err| {
                tracing::error!(dir = %wal.dir().display(), error = %err, "cannot list the write-ahead log");
                Vec::new()
            }),
            None => Vec::new(),
        };
        let pending_bytes = Arc::new(AtomicUsize::new(0));
        let backoff = Arc::new(Backoff::default());
        let arrivals = Arc::new(Arrivals::default());
        let metrics = WriterMetrics::new();
        let dedup = Arc::new(Dedup::default());
        let staging = Arc::new(Staging {
            open: RwLock::new(Arc::new(Generation::new(0))),
            next_id: AtomicU64::new(1),
            warm: Arc::new(WarmBuilders::new(
                config.max_pending_bytes,
                metrics.warm_bytes.clone(),
            )),
            wal,
            closed: Mutex::default(),
        });
        let flusher = Flusher {
            storage,
            metastore,
            config,
            pending_bytes: pending_bytes.clone(),
            arrivals: arrivals.clone(),
            staging: staging.clone(),
            flushing: AtomicUsize::new(0),
            permits: Arc::new(Semaphore::new(config.max_concurrent_flushes.max(1))),
            last_started: Mutex::new(None),
            runtime: tokio::runtime::Handle::current(),
            last_flush_micros: AtomicU64::new(5_000),
            backoff: backoff.clone(),
            metrics: metrics.clone(),
            recovered: watch::channel(false).0,
            dedup: dedup.clone(),
        };
        if let Some(bound) = config.max_compaction_wait {
            let weak = sender.downgrade();
            crate::backoff::spawn(
                flusher.metastore.clone(),
                flusher.backoff.clone(),
                metrics.backoff.clone(),
                bound,
                config.flush_interval,
                move || weak.upgrade().is_some(),
            );
        }
        let flusher = Arc::new(flusher);
        let handle = tokio::spawn(flusher.clone().run(receiver, leftovers));
        (
            Ingester {
                sender,
                pending_bytes,
                arrivals,
                staging,
                backoff,
                config,
                metrics,
                flusher,
                dedup,
            },
            handle,
        )
    }

    pub fn metrics(&self) -> &WriterMetrics {
        &self.metrics
    }

    /// The spacing between flushes asked now because compaction lags ([`crate::backoff`]).
    pub fn flush_backoff(&self) -> Duration {
        self.backoff.gap()
    }

    fn full(&self, pending: usize) -> IngestError {
        IngestError::Overloaded(format!(
            "server busy: {pending} bytes of profiles are waiting to be written, at the limit of {} (max_pending_bytes); retry shortly",
            self.config.max_pending_bytes
        ))
    }

    /// Refuses at once while the write queue is full: checked before a request's body is
    /// read and parsed, so that an overloaded server spends nothing on what it would
    /// refuse after parsing. The [`Arrival`] it returns tells the flusher a write is on
    /// its way until it is handed to [`Ingester::parse_and_write`] or dropped.
    pub fn check_room(&self) -> Result<Arrival, IngestError> {
        self.has_room()?;
        self.arrivals.count.fetch_add(1, Ordering::SeqCst);
        Ok(Arrival {
            arrivals: self.arrivals.clone(),
        })
    }

    /// [`Self::check_room`] without announcing a write: for a request whose body has not
    /// arrived yet. A client that declares a body and then stalls must not hold the
    /// flusher waiting for it.
    pub fn has_room(&self) -> Result<(), IngestError> {
        let pending = self.pending_bytes.load(Ordering::Relaxed);
        if pending >= self.config.max_pending_bytes {
            return Err(self.full(pending));
        }
        Ok(())
    }

    /// Stages the profiles and waits until they are durable and registered.
    pub async fn write(
        &self,
        tenant: &str,
        profiles: Vec<ParsedProfile>,
    ) -> Result<(), IngestError> {
        self.queue(tenant, profiles).await
    }

    /// Parses a request on the write path's threads ([`crate::cpu::run_parser`]), stages
    /// its profiles there right after, and waits until they are durable. Parsing and then
    /// staging as two tasks handed each request to those threads and back twice; with
    /// many services at a low rate each such round trip wakes parked threads: taking it
    /// out was worth 1.06-1.08× at 500 services (docs/benchmarks.md, session 32). `parse` returns the profiles and
    /// whatever else the caller answers with. The request's `arrival`
    /// ([`Ingester::check_room`]) ends once its profiles are staged, so the flusher need
    /// not wait for it.
    ///
    /// Profiles whose identity was stored within `idempotence.window_ms` are not staged
    /// again ([`crate::dedup`]); when their first copy is still on its way, the answer
    /// waits for it.
    pub async fn parse_and_write<T: Send + 'static>(
        &self,
        tenant: &str,
        parse: impl FnOnce() -> Result<(Vec<ParsedProfile>, T), IngestError> + Send + 'static,
        arrival: Arrival,
        idempotence: Idempotence,
    ) -> Result<(T, Written), IngestError> {
        self.dedup.ready().await;
        let (ingester, tenant) = (self.clone(), tenant.to_string());
        let (staged, answer, written, waits) = crate::cpu::run_parser(move || {
            let (profiles, answer) = parse()?;
            let mut written = Written::of(&profiles);
            let claim =
                ingester
                    .dedup
                    .claim(&tenant, profiles, &idempotence, kiln_model::time::now_ms());
            written.profiles = claim.kept.len();
            written.bytes = claim.kept.iter().map(|p| p.received_bytes).sum();
            written.duplicates = claim.duplicates;
            written.ids = claim.ids;
            let staged = match claim.kept.is_empty() {
                true => None,
                false => Some(ingester.stage(&tenant, claim.kept, claim.resolver)?),
            };
            if let Some(staged) = &staged {
                ingester.flusher.flush_alone(staged);
            }
            Ok((staged, answer, written, claim.waits))
        })
        .await?;
        match staged {
            Some(staged) => self.commit(staged, Some(arrival)).await?,
            None => drop(arrival),
        }
        if !crate::dedup::earlier_copies_stored(waits).await {
            return Err(IngestError::EarlierCopyLost);
        }
        Ok((answer, written))
    }

    async fn queue(&self, tenant: &str, profiles: Vec<ParsedProfile>) -> Result<(), IngestError> {
        if profiles.is_empty() {
            return Ok(());
        }
        let (ingester, tenant) = (self.clone(), tenant.to_string());
        // On the write path's threads, with no permit: their queue is first come, first
        // served, so a parsed profile (holding its decoded memory until it is staged) waits
        // behind at most the parses already admitted, never behind the requests still to
        // parse.
        let staged = crate::cpu::spawn(move || ingester.stage(&tenant, profiles, None)).await??;
        self.commit(staged, None).await
    }

    /// Interns a request's profiles into the open batch, whole, and drops their decoded
    /// form. CPU work, run on the write path's threads ([`crate::cpu::spawn`]).
    /// `resolver`, when the profiles were claimed ([`crate::dedup`]), is resolved with
    /// their outcome: once logged, or with their batch's flush.
    fn stage(
        &self,
        tenant: &str,
        profiles: Vec<ParsedProfile>,
        resolver: Option<Resolver>,
    ) -> Result<Staged, IngestError> {
        let pending = self.pending_bytes.load(Ordering::Relaxed);
        if pending >= self.config.max_pending_bytes {
            return Err(self.full(pending));
        }
        let received_bytes = profiles.iter().map(|p| p.received_bytes.max(1)).sum();
        let mut by_service: Vec<&ParsedProfile> = profiles.iter().collect();
        by_service.sort_by(|a, b| a.service().cmp(b.service()));
        let store = |err| IngestError::Store(Arc::new(StoreError::Wal(err)));
        // Logged only when no other write is on its way (its own arrival aside): such a
        // write would be alone in its segment, and the log spares it a segment's fixed
        // costs. Writes that arrive together share a segment's flush anyway (group
        // commit), and logging them too would only add an append and an `fdatasync` on
        // the write path's threads (docs/benchmarks.md, session 34). But a write that
        // joins a batch logged already is logged too: unlogged, it would wait for a
        // segment, and so flush the batch long before its `segment_interval`. At 500
        // services that cut batches to a few seconds of one-profile datasets (session 36).
        let log = self.staging.wal.is_some()
            && (self.arrivals.count.load(Ordering::SeqCst) <= 1 || self.staging.open_is_logged());
        let record = match log {
            true => Some(crate::wal::encode(tenant, &profiles).map_err(store)?),
            false => None,
        };
        let open = self
            .staging
            .open
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        // Logged in the file of the generation it is staged in, under the same lock, so a
        // generation's file holds exactly its requests; a request that cannot be logged
        // is not staged.
        let logged = match (&self.staging.wal, record) {
            (Some(wal), Some(record)) => {
                let file = open.wal_file(wal).map_err(store)?;
                let end = file.append(&record).map_err(store)?;
                self.metrics.wal_records.inc();
                Some((file, end))
            }
            _ => None,
        };
        let mut grown = 0;
        for group in by_service.chunk_by(|a, b| a.service() == b.service()) {
            let builder = open.builder(tenant, group[0].service(), &self.staging.warm);
            let mut builder = builder.lock().unwrap_or_else(PoisonError::into_inner);
            let before = builder.heap_bytes();
            for profile in group {
                builder.add_pprof(&profile.input(self.config.max_stack_depth));
            }
            grown += builder.heap_bytes().saturating_sub(before);
        }
        open.bytes.fetch_add(grown, Ordering::SeqCst);
        open.identities
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(profiles.iter().filter_map(|p| p.identity.clone()));
        if let Some(resolver) = &resolver {
            open.resolvers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(resolver.clone());
        }
        let pending = self.pending_bytes.fetch_add(grown, Ordering::SeqCst) + grown;
        self.metrics.pending_bytes.set(pending as i64);
        open.requests.fetch_add(1, Ordering::Relaxed);
        open.profiles.fetch_add(profiles.len(), Ordering::Relaxed);
        let staged = Staged {
            generation: open.id,
            done: open.done.subscribe(),
            received_bytes,
            logged: logged.is_some(),
        };
        drop(open);
        if let Some((file, end)) = logged {
            // Out of the lock, so that a flush's swap does not wait for it, and writes
            // appended meanwhile share it. Fails the request; its profiles, staged, may
            // still reach a segment, as a write whose answer was lost may.
            let synced = file.sync_to(end).map_err(store)?;
            if synced {
                self.metrics.wal_syncs.inc();
            }
            // Durable in the log: a retry is a duplicate from now on.
            if let Some(resolver) = &resolver {
                resolver.resolve(true);
            }
        }
        Ok(staged)
    }

    /// See [`Syncer::sync`].
    pub async fn sync(&self) {
        self.syncer().sync().await
    }

    /// A handle for reads to call [`Syncer::sync`] with, which does not keep the flusher
    /// running as an [`Ingester`] does.
    pub fn syncer(&self) -> Syncer {
        Syncer {
            sender: self.sender.downgrade(),
            staging: self.staging.clone(),
            flusher: self.flusher.clone(),
        }
    }
}

/// See [`Ingester::syncer`].
#[derive(Clone)]
pub struct Syncer {
    sender: mpsc::WeakSender<Job>,
    staging: Arc<Staging>,
    flusher: Arc<Flusher>,
}

impl Syncer {
    /// Returns once every write acknowledged before it is visible to readers: with the
    /// write-ahead log, the open batch is flushed and the flushes in progress awaited;
    /// without, an acknowledged write is registered already. Queries call it first. A
    /// batch whose flush fails stays in the log and is retried; it is not waited for.
    pub async fn sync(&self) {
        if self.staging.wal.is_none() {
            return;
        }
        let mut recovered = self.flusher.recovered.subscribe();
        let _ = recovered.wait_for(|done| *done).await;
        let (open, waiting) = {
            let open = self
                .staging
                .open
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            let closed = self
                .staging
                .closed
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let waiting: Vec<_> = closed.values().map(|g| g.done.subscribe()).collect();
            let open = (open.requests.load(Ordering::SeqCst) > 0)
                .then(|| (open.id, open.done.subscribe()));
            (open, waiting)
        };
        let mut waiting = waiting;
        if let Some((generation, done)) = open {
            let job = Job {
                generation,
                bytes: 0,
                sync: true,
                logged: true,
            };
            let Some(sender) = self.sender.upgrade() else {
                return;
            };
            if sender.send(job).await.is_err() {
                return;
            }
            waiting.push(done);
        }
        for mut done in waiting {
            let _ = done.wait_for(Option::is_some).await;
        }
    }
}

impl Ingester {
    /// Waits until the staged profiles are durable and registered.
    async fn commit(&self, staged: Staged, arrival: Option<Arrival>) -> Result<(), IngestError> {
        let job = Job {
            generation: staged.generation,
            bytes: staged.received_bytes,
            sync: false,
            logged: staged.logged,
        };
        // A write that flushed itself has its result already; the flusher need not wake.
        let flushed = staged.done.borrow().is_some();
        if !flushed && self.sender.send(job).await.is_err() {
            return Err(IngestError::ShuttingDown);
        }
        // Sent before the arrival ends, so a flusher that sees no arrivals left finds
        // this job in the channel.
        drop(arrival);
        if staged.logged {
            return Ok(());
        }
        let mut done = staged.done;
        let result = match done.wait_for(Option::is_some).await {
            Ok(result) => result.clone(),
            Err(_) => None,
        };
        match result {
            Some(Ok(())) => Ok(()),
            Some(Err(err)) => Err(IngestError::Store(err)),
            None => Err(IngestError::ShuttingDown),
        }
    }
}

/// What a request wrote: for the caller's counters, and the warnings its client should
/// see, each once.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Written {
    pub bytes: usize,
    pub profiles: usize,
    pub warnings: Vec<String>,
    /// What the shape limits cut from the profiles.
    pub cuts: crate::parse::Cuts,
    /// Profiles not stored because a copy was ([`crate::dedup`]).
    pub duplicates: usize,
    /// Every profile's id, in the request's order, duplicates included.
    pub ids: Vec<String>,
}

impl Written {
    fn of(profiles: &[ParsedProfile]) -> Self {
        let mut warnings: Vec<String> = Vec::new();
        for warning in profiles.iter().flat_map(|p| &p.warnings) {
            if !warnings.contains(warning) {
                warnings.push(warning.clone());
            }
        }
        let mut cuts = crate::parse::Cuts::default();
        for profile in profiles {
            cuts.add(&profile.cuts);
        }
        Written {
            bytes: profiles.iter().map(|p| p.received_bytes).sum(),
            profiles: profiles.len(),
            warnings,
            cuts,
            duplicates: 0,
            // Filled by the dedup claim, which may give the profiles their ids.
            ids: Vec::new(),
        }
    }
}

/// Writes admitted but not yet staged, and a wake-up for the flusher whenever one ends
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
    staging: Arc<Staging>,
    /// Flushes running now.
    flushing: AtomicUsize,
    /// One per flush that may run at once (`max_concurrent_flushes`).
    permits: Arc<Semaphore>,
    /// When the last flush started, for `min_gap` and the backoff's spacing.
    last_started: Mutex<Option<Instant>>,
    /// For puts and registrations made off the runtime ([`Landing`]).
    runtime: tokio::runtime::Handle,
    /// How long the last flush took.
    last_flush_micros: AtomicU64,
    /// Spacing asked while compaction lags.
    backoff: Arc<Backoff>,
    metrics: WriterMetrics,
    /// Set once the log files left by an earlier run are recovered.
    recovered: watch::Sender<bool>,
    dedup: Arc<Dedup>,
}

impl Flusher {
    async fn run(
        self: Arc<Self>,
        mut receiver: mpsc::Receiver<Job>,
        leftovers: Vec<(String, PathBuf)>,
    ) {
        let flusher = self;
        flusher.remember_identities(&leftovers).await;
        flusher.recover(leftovers).await;
        flusher.recovered.send_replace(true);
        let permits = flusher.permits.clone();
        let mut closed = false;
        while !closed {
            let Some(first) = receiver.recv().await else {
                break;
            };
            // A job whose generation a flush already took was written with it.
            if first.generation < flusher.staging.open_id() {
                continue;
            }
            let opened = tokio::time::Instant::now();
            let deadline = opened + flusher.config.flush_interval;
            let mut batch_bytes = first.bytes;
            let reason = if first.logged {
                let (reason, ended) = flusher.gather_logged(&mut receiver, first).await;
                closed = ended;
                reason
            } else {
                loop {
                    while let Ok(job) = receiver.try_recv() {
                        batch_bytes += job.bytes;
                    }
                    if batch_bytes >= flusher.config.flush_bytes {
                        break "size";
                    }
                    let mut wake = deadline;
                    let gap = flusher.config.min_gap.max(flusher.backoff.gap());
                    let earliest = flusher
                        .last_started()
                        .map_or(opened, |at| tokio::time::Instant::from_std(at) + gap);
                    if flusher.config.adaptive
                        && flusher.flushing.load(Ordering::SeqCst) == 0
                        && tokio::time::Instant::now() < earliest
                    {
                        wake = wake.min(earliest);
                    } else if flusher.config.adaptive
                        && flusher.flushing.load(Ordering::SeqCst) == 0
                    {
                        if flusher.arrivals.count.load(Ordering::SeqCst) == 0 {
                            // Arrivals end after their job is queued, and their profiles
                            // are staged before that: the swap below takes them all.
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
            // The swap waits for adds in progress, a few milliseconds at most: off the
            // async workers, and not queued behind the parses on the write path's threads.
            // With none in progress (most flushes at a low rate) it is taken here, without
            // the hand-off to a blocking thread and back.
            let generation = match flusher.staging.try_swap() {
                Some(generation) => generation,
                None => {
                    let staging = flusher.staging.clone();
                    let Ok(generation) = tokio::task::spawn_blocking(move || staging.swap()).await
                    else {
                        break;
                    };
                    generation
                }
            };
            flusher.flushing.fetch_add(1, Ordering::SeqCst);
            flusher.started_now();
            let flusher = flusher.clone();
            tokio::spawn(async move {
                flusher.flush(generation).await;
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

    /// When to flush a batch of logged writes, whose requests were acknowledged already:
    /// once it holds `flush_bytes` received, or its profiles [`logged_memory_limit`],
    /// or a read asks ([`Ingester::sync`]), or a write that was not logged joins it (its
    /// request waits for the flush), and at the latest `segment_interval` after its first
    /// write. Returns the reason, and whether the channel closed.
    async fn gather_logged(
        &self,
        receiver: &mut mpsc::Receiver<Job>,
        first: Job,
    ) -> (&'static str, bool) {
        let deadline = tokio::time::Instant::now() + self.config.segment_interval;
        let mut batch_bytes = first.bytes;
        let mut asked = first.sync;
        let mut waiting = false;
        loop {
            while let Ok(job) = receiver.try_recv() {
                batch_bytes += job.bytes;
                asked |= job.sync;
                waiting |= !job.logged;
            }
            if batch_bytes >= self.config.flush_bytes {
                return ("size", false);
            }
            if asked {
                return ("query", false);
            }
            if waiting {
                // A write that was not logged waits for this flush: the batch goes now.
                return ("unlogged", false);
            }
            // The open batch's own memory: counting the flush in progress as well made
            // every write after a memory flush start another, of one profile, until it
            // ended (five tiny segments a flush at 500 services).
            if self.staging.open_bytes() >= logged_memory_limit(self.config.max_pending_bytes) {
                return ("memory", false);
            }
            tokio::select! {
                job = receiver.recv() => match job {
                    Some(job) => {
                        batch_bytes += job.bytes;
                        asked |= job.sync;
                        waiting |= !job.logged;
                    }
                    None => return ("shutdown", true),
                },
                () = tokio::time::sleep_until(deadline) => return ("interval", false),
            }
        }
    }

    /// Writes the segment of every log file an earlier run left (see [`crate::wal`]):
    /// at start, before any read is answered. A file that cannot be recovered now is
    /// retried in the background.
    /// Fills the dedup table with the identities stored before this start, from the
    /// metastore and from the log files left, then lets writes through. A metastore that
    /// cannot be read leaves the table to what the log knows: writes are not refused
    /// for it.
    async fn remember_identities(&self, leftovers: &[(String, PathBuf)]) {
        let now_ms = kiln_model::time::now_ms();
        match self.metastore.write_identities(now_ms).await {
            Ok(identities) => self.dedup.remember(identities, now_ms),
            Err(err) => {
                tracing::error!(error = %err, "identities of stored writes not read; retries may be stored twice")
            }
        }
        for (_, path) in leftovers {
            let path = path.clone();
            match crate::cpu::spawn(move || crate::wal::identities(&path)).await {
                Ok(Ok(identities)) => self.dedup.remember(identities, now_ms),
                Ok(Err(err)) => tracing::warn!(error = %err, "identities of a log file not read"),
                Err(err) => tracing::warn!(error = %err, "identities of a log file not read"),
            }
        }
        self.dedup.open();
    }

    async fn recover(self: &Arc<Self>, leftovers: Vec<(String, PathBuf)>) {
        for (block_id, path) in leftovers {
            if let Err(err) = self.recover_file(&block_id, &path).await {
                tracing::error!(file = %path.display(), error = %err, "write-ahead log file not recovered; retrying");
                self.clone().retry(block_id, path);
            }
        }
    }

    /// Retries [`Flusher::recover_file`] every `segment_interval` until it succeeds.
    fn retry(self: Arc<Self>, block_id: String, path: PathBuf) {
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(self.config.segment_interval).await;
                match self.recover_file(&block_id, &path).await {
                    Ok(()) => return,
                    Err(err) => {
                        tracing::warn!(file = %path.display(), error = %err, "write-ahead log file not recovered yet")
                    }
                }
            }
        });
    }

    /// One log file's segment, written unless its block is registered already; then the
    /// file is deleted. A file that cannot be read back is kept aside as `.corrupt`.
    async fn recover_file(&self, block_id: &str, path: &Path) -> Result<(), StoreError> {
        let registered = self
            .metastore
            .list_blocks()
            .await
            .map_err(StoreError::Metastore)?
            .iter()
            .any(|block| block.id == block_id);
        if !registered {
            let read_path = path.to_path_buf();
            let max_stack_depth = self.config.max_stack_depth;
            let read = crate::cpu::spawn(move || {
                let requests = crate::wal::read(&read_path)?;
                let mut builders: HashMap<ServiceKey, DatasetBuilder> = HashMap::new();
                let mut profiles = 0;
                let mut identities = Vec::new();
                for (tenant, parsed) in requests {
                    for profile in parsed {
                        identities.extend(profile.identity.clone());
                        let key = (tenant.clone(), profile.service().to_string());
                        builders
                            .entry(key)
                            .or_insert_with(|| DatasetBuilder::new(&tenant, profile.service()))
                            .add_pprof(&profile.input(max_stack_depth));
                        profiles += 1;
                    }
                }
                Ok::<_, crate::wal::WalError>((
                    builders.into_iter().collect::<Vec<_>>(),
                    profiles,
                    identities,
                ))
            })
            .await
            .map_err(StoreError::Task)?;
            let (builders, profiles, identities) = match read {
                Ok(read) => read,
                Err(crate::wal::WalError::Io { source, .. }) => {
                    return Err(StoreError::Wal(source))
                }
                Err(err @ crate::wal::WalError::Corrupt { .. }) => {
                    tracing::error!(error = %err, "write-ahead log file kept aside as .corrupt");
                    let aside = path.with_extension("wal.corrupt");
                    return std::fs::rename(path, aside).map_err(StoreError::Wal);
                }
            };
            self.write_segment(builders, profiles, block_id, identities)
                .await?;
            self.metrics.wal_recovered.inc_by(profiles as u64);
            tracing::info!(block = %block_id, profiles, "write-ahead log file recovered");
        }
        remove_logged(path);
        Ok(())
    }

    /// How long a batch waits for writes still on their way: the last flush's duration,
    /// within [1 ms, `flush_interval`].
    fn linger(&self) -> Duration {
        Duration::from_micros(self.last_flush_micros.load(Ordering::Relaxed))
            .clamp(Duration::from_millis(1), self.config.flush_interval)
    }

    fn last_started(&self) -> Option<Instant> {
        *self
            .last_started
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn started_now(&self) {
        *self
            .last_started
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }

    async fn flush(self: &Arc<Self>, generation: Arc<Generation>) {
        let started = Instant::now();
        let builders = self.take_builders(&generation);
        let profiles = generation.profiles.load(Ordering::Relaxed);
        let identities = generation.take_identities();
        let result = self
            .write_segment(builders, profiles, &generation.block_id, identities)
            .await
            .map_err(Arc::new);
        let logged = generation
            .wal
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(file) = logged {
            match &result {
                // Registered: the log of these writes is no longer needed.
                Ok(()) => remove_logged(file.path()),
                // Their requests were acknowledged: the log is their only copy now.
                Err(_) => self
                    .clone()
                    .retry(generation.block_id.clone(), file.path().to_path_buf()),
            }
        }
        self.settle(&generation, started, result);
        if self.staging.wal.is_some() {
            self.staging
                .closed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&generation.id);
        }
    }

    /// A write that is the only one on its way flushes itself, on the write-path thread
    /// that parsed and staged it, when the flusher would flush it at once anyway (adaptive,
    /// no flush running, none of `min_gap` or the backoff's spacing left, nothing else in
    /// its batch), and the store and metastore are a local directory and SQLite, whose
    /// writes complete on this thread. With many services at a low rate that is most
    /// writes: each is then handed once to the write path's threads and back, without the
    /// flusher's wake-up, its flush task and a second hand-off to encode
    /// (docs/benchmarks.md, session 33). A request that flushed itself finds its result
    /// set when it commits. With a write-ahead log such a write is logged instead (see
    /// [`Ingester::stage`]), so this serves only ingesters without one.
    fn flush_alone(&self, staged: &Staged) {
        let alone = self.config.adaptive
            && self.staging.wal.is_none()
            && self.storage.is_local()
            && self.metastore.is_embedded()
            // Its own arrival ends when it is handed to the flusher, after this.
            && self.arrivals.count.load(Ordering::SeqCst) == 1
            && self.flushing.load(Ordering::SeqCst) == 0;
        if !alone {
            return;
        }
        let gap = self.config.min_gap.max(self.backoff.gap());
        if self.last_started().is_some_and(|at| at.elapsed() < gap) {
            return;
        }
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            return;
        };
        let Some(generation) = self.staging.try_swap_if(|open| {
            open.id == staged.generation && open.requests.load(Ordering::Relaxed) == 1
        }) else {
            return;
        };
        self.flushing.fetch_add(1, Ordering::SeqCst);
        // Ends the flush even if it unwinds, so the flusher's adaptive path goes on.
        let _ended = FlushEnded {
            flusher: self,
            _permit: permit,
        };
        self.started_now();
        self.metrics
            .flush_reasons
            .get_or_create(&ReasonLabel { reason: "alone" })
            .inc();
        let started = Instant::now();
        let builders = self.take_builders(&generation);
        let profiles = generation.profiles.load(Ordering::Relaxed);
        let identities = generation.take_identities();
        let result = self
            .write_alone(builders, profiles, &generation.block_id, identities)
            .map_err(Arc::new);
        self.settle(&generation, started, result);
        // Not parsing: left out of the parse time that admission judges waits by.
        crate::cpu::not_parsing(started.elapsed());
    }

    /// The builders of a swapped-out generation, which only it holds by then.
    fn take_builders(&self, generation: &Generation) -> Vec<(ServiceKey, DatasetBuilder)> {
        self.metrics
            .batch_requests
            .observe(generation.requests.load(Ordering::Relaxed) as f64);
        let builders: Vec<((String, String), DatasetBuilder)> = {
            let mut builders = generation
                .builders
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            builders
                .drain()
                .map(|((tenant, service), builder)| {
                    let builder = match Arc::try_unwrap(builder) {
                        Ok(builder) => builder.into_inner().unwrap_or_else(PoisonError::into_inner),
                        // Only the generation holds them once it is swapped out; taking
                        // the contents is the fallback, not the rule.
                        Err(shared) => std::mem::replace(
                            &mut *shared.lock().unwrap_or_else(PoisonError::into_inner),
                            DatasetBuilder::new(&tenant, &service),
                        ),
                    };
                    ((tenant, service), builder)
                })
                .collect()
        };
        builders
    }

    /// Records a flush's outcome and hands it to every request of its generation.
    fn settle(
        &self,
        generation: &Generation,
        started: Instant,
        result: Result<(), Arc<StoreError>>,
    ) {
        let took = started.elapsed();
        self.metrics.flush_seconds.observe(took.as_secs_f64());
        self.last_flush_micros.store(
            u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        let released = generation.bytes.load(Ordering::SeqCst);
        let pending = self.pending_bytes.fetch_sub(released, Ordering::SeqCst) - released;
        self.metrics.pending_bytes.set(pending as i64);
        if let Err(err) = &result {
            self.metrics.flush_failures.inc();
            tracing::error!(
                error = %err,
                requests = generation.requests.load(Ordering::Relaxed),
                "segment flush failed"
            );
        }
        let resolvers = std::mem::take(
            &mut *generation
                .resolvers
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for resolver in resolvers {
            resolver.resolve(result.is_ok());
        }
        generation.done.send_replace(Some(result));
    }

    async fn write_segment(
        &self,
        builders: Vec<((String, String), DatasetBuilder)>,
        profile_count: usize,
        block_id: &str,
        identities: Vec<WriteIdentity>,
    ) -> Result<(), StoreError> {
        let build_started = Instant::now();
        let block_id = block_id.to_string();
        let object_key = segment_key(&block_id);
        let landing = self.storage.is_local().then(|| Landing {
            storage: self.storage.clone(),
            metastore: self.metastore.is_embedded().then(|| self.metastore.clone()),
            runtime: self.runtime.clone(),
            arrivals: self.arrivals.clone(),
            identities: identities.clone(),
        });
        let mut segment = build_segment(
            builders,
            self.staging.warm.clone(),
            block_id.clone(),
            object_key.clone(),
            landing,
        )
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
                    segment_block(&block_id, &object_key, size_bytes),
                    std::mem::take(&mut segment.datasets),
                    identities,
                )
                .await
                .map_err(StoreError::Metastore)?;
            segment.register_seconds = register_started.elapsed().as_secs_f64();
        }
        self.record(&segment, &block_id, profile_count, build_seconds, landed);
        Ok(())
    }

    /// [`Flusher::write_segment`] on this thread, for [`Flusher::flush_alone`]: the store
    /// is local and the metastore SQLite, so the put and the registration complete here.
    fn write_alone(
        &self,
        mut builders: Vec<(ServiceKey, DatasetBuilder)>,
        profile_count: usize,
        block_id: &str,
        identities: Vec<WriteIdentity>,
    ) -> Result<(), StoreError> {
        let build_started = Instant::now();
        let object_key = segment_key(block_id);
        builders.sort_by(|(a, _), (b, _)| a.cmp(b));
        let share = builders
            .into_iter()
            .enumerate()
            .map(|(index, (key, builder))| (index, key, builder))
            .collect();
        let built = finish_share(share, &self.staging.warm);
        let (block, datasets) = encode_segment(built, block_id, &object_key)?;
        if datasets.is_empty() {
            return Ok(());
        }
        let landing = Landing {
            storage: self.storage.clone(),
            metastore: Some(self.metastore.clone()),
            runtime: self.runtime.clone(),
            arrivals: self.arrivals.clone(),
            identities,
        };
        let segment = landing.land(block, datasets, block_id, &object_key)?;
        let build_seconds =
            build_started.elapsed().as_secs_f64() - segment.put_seconds - segment.register_seconds;
        self.record(&segment, block_id, profile_count, build_seconds, true);
        Ok(())
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

/// The memory a batch of logged writes may hold before it is flushed (reason `memory`):
/// three quarters of `max_pending_bytes`, leaving a quarter for the writes that arrive
/// while it is written, so that logged writes never hold the write path at its 429
/// bound. At 500 services at a low rate memory ends the batches (a service's first
/// profile holds about twice its pprof size in symbol tables), and a longer batch gives
/// each service's dataset more profiles to share its symbols: half of the bound made
/// batches of 13 s (docs/benchmarks.md, session 36).
fn logged_memory_limit(max_pending_bytes: usize) -> usize {
    max_pending_bytes / 4 * 3
}

/// A segment's object key. The block is named when its batch opens, so its datasets'
/// index entries are complete when built, and its log file has the same name.
fn segment_key(block_id: &str) -> String {
    format!("segments/{block_id}.parquet")
}

/// Deletes a log file whose segment is registered. One left behind is found registered
/// at the next start, and deleted then.
fn remove_logged(path: &Path) {
    if let Err(err) = std::fs::remove_file(path) {
        if err.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(file = %path.display(), error = %err, "write-ahead log file not deleted");
        }
    }
}

/// A flush run by [`Flusher::flush_alone`], ended when dropped.
struct FlushEnded<'a> {
    flusher: &'a Flusher,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for FlushEnded<'_> {
    fn drop(&mut self) {
        self.flusher.flushing.fetch_sub(1, Ordering::SeqCst);
        self.flusher.arrivals.changed.notify_one();
    }
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

/// A flush's segment, as [`build_segment`] leaves it.
struct Segment {
    /// Its datasets' entries; none when no dataset held a profile (nothing to write).
    datasets: Vec<DatasetMeta>,
    size_bytes: u64,
    /// The encoded block, still to store; `None` once stored by the thread that encoded it.
    block: Option<Vec<u8>>,
    /// Registered by the thread that encoded it.
    registered: bool,
    put_seconds: f64,
    register_seconds: f64,
}

impl Segment {
    fn encoded(block: Vec<u8>, datasets: Vec<DatasetMeta>) -> Self {
        Segment {
            datasets,
            size_bytes: block.len() as u64,
            block: Some(block),
            registered: false,
            put_seconds: 0.0,
            register_seconds: 0.0,
        }
    }
}

/// Where a segment encoded by one thread is stored, and registered, by that same thread:
/// a local store (its put is a file write and two `fsync`s), and SQLite when the metastore
/// is (its commit is one more), while no other write is on its way. With many services at
/// a low rate most flushes are one service's one profile, and the two hand-offs to tokio's
/// blocking threads and back (each a wake-up of a parked thread) cost a few percent of
/// the server's CPU (docs/benchmarks.md). The thread waits out the `fsync`s, though, and
/// it is one of the threads that parse: with writes coming in (16 clients in a closed
/// loop) that cost a tenth of the throughput, so the block is then handed back to be
/// stored on the runtime, as a cloud store's or PostgreSQL's always is (the write path's
/// threads must not wait on the network).
struct Landing {
    storage: ObjectStorage,
    metastore: Option<Metastore>,
    runtime: tokio::runtime::Handle,
    arrivals: Arc<Arrivals>,
    /// Registered with the segment.
    identities: Vec<WriteIdentity>,
}

impl Landing {
    /// No write is being read or parsed now, so none waits for this thread.
    fn is_quiet(&self) -> bool {
        self.arrivals.count.load(Ordering::SeqCst) == 0
    }

    fn land(
        self,
        block: Vec<u8>,
        datasets: Vec<DatasetMeta>,
        block_id: &str,
        object_key: &str,
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
            registered: false,
            put_seconds: started.elapsed().as_secs_f64(),
            register_seconds: 0.0,
        };
        if let Some(metastore) = &self.metastore {
            let started = Instant::now();
            metastore
                .register_block_blocking(
                    &self.runtime,
                    segment_block(block_id, object_key, size_bytes),
                    segment.datasets.clone(),
                    self.identities,
                )
                .map_err(StoreError::Metastore)?;
            segment.registered = true;
            segment.register_seconds = started.elapsed().as_secs_f64();
        }
        Ok(segment)
    }
}

/// Finishes one dataset per (tenant, service), on as many of the write path's threads as
/// there are cores, and encodes them as one block, datasets in (tenant, service) order.
/// When one thread does it all, that thread also stores the block where `landing` allows.
async fn build_segment(
    mut builders: Vec<(ServiceKey, DatasetBuilder)>,
    warm: Arc<WarmBuilders>,
    block_id: String,
    object_key: String,
    landing: Option<Landing>,
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
        // One thread's work (a flush of one service, most flushes at a low rate): finished
        // and encoded in one task, one hand-off to the write path's threads instead of two.
        let share = std::mem::take(share);
        return crate::cpu::spawn(move || {
            let (block, datasets) =
                encode_segment(finish_share(share, &warm), &block_id, &object_key)?;
            match landing {
                Some(landing) if !datasets.is_empty() && landing.is_quiet() => {
                    landing.land(block, datasets, &block_id, &object_key)
                }
                _ => Ok(Segment::encoded(block, datasets)),
            }
        })
        .await
        .map_err(StoreError::Task)?;
    }
    let finishing: Vec<_> = shares
        .into_iter()
        .map(|share| {
            let warm = warm.clone();
            crate::cpu::spawn(move || finish_share(share, &warm))
        })
        .collect();
    let mut built: Vec<(usize, Dataset)> = Vec::with_capacity(count);
    for share in finishing {
        built.extend(share.await.map_err(StoreError::Task)?);
    }
    let (block, datasets) =
        crate::cpu::spawn(move || encode_segment(built, &block_id, &object_key))
            .await
            .map_err(StoreError::Task)??;
    Ok(Segment::encoded(block, datasets))
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
/// (tenant, service) order), leaving out those that hold no profile.
fn encode_segment(
    mut built: Vec<(usize, Dataset)>,
    block_id: &str,
    object_key: &str,
) -> Result<(Vec<u8>, Vec<DatasetMeta>), StoreError> {
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
