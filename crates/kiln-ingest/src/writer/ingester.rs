//! The handle requests write through: admission ([`Ingester::check_room`]), staging
//! into the open batch (logged first where a write-ahead log acknowledges it), and the
//! wait for the flush that makes it durable.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, RwLock};
use std::time::Duration;

use kiln_metastore::{DatasetQuery, Metastore};
use kiln_storage::ObjectStorage;
use tokio::sync::{mpsc, watch, Semaphore};

use super::flusher::Flusher;
use super::metrics::WriterMetrics;
use super::recovery::Recovery;
use super::sink::SegmentSink;
use super::staging::{Arrivals, Generation, Job, PendingSync, Staged, Staging};
use super::warm::WarmBuilders;
use super::IngesterConfig;
use crate::backoff::Backoff;
use crate::dedup::{Dedup, Idempotence, Resolver};
use crate::error::StoreError;
use crate::wal::Wal;
use crate::{IngestError, ParsedProfile};

/// The thread that makes logged writes durable. A write's `fdatasync` held its write
/// path thread (one per core, and the permit to parse with it) for the disk's whole
/// round trip: with every write logged, the server then sat idle in 38 s of ingest it
/// did in 28 (docs/benchmarks.md, "Every write logged"). One thread is enough: the writes
/// queued behind a sync find their bytes on disk when it ends, so each `fdatasync` covers
/// every write appended before it (group commit).
static WAL_SYNC: LazyLock<kiln_runtime::worker::Pool> =
    LazyLock::new(|| kiln_runtime::worker::Pool::start("kiln-wal-sync", 1));

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

    /// From now on, every segment's profiles are counted by the recording rules in the
    /// transaction that registers it (`hook` gives a dataset's samples for its tenant's
    /// rules); earlier segments are counted by level-0 compaction. `ruled`: the tenants
    /// with rules stored now (each registration tells again): only their datasets wait,
    /// decoded, for their registration, and logged writes wait `rules_segment_interval`
    /// for their segment only while there are any.
    pub fn count_rules_with(&self, hook: super::RuleHook, ruled: BTreeSet<String>) {
        self.flusher.sink.count_rules_with(hook, ruled);
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
        let sink = Arc::new(SegmentSink::new(
            storage,
            metastore.clone(),
            arrivals.clone(),
            staging.warm.clone(),
            metrics.clone(),
        ));
        let recovery = Arc::new(Recovery {
            metastore: metastore.clone(),
            sink: sink.clone(),
            dedup: dedup.clone(),
            metrics: metrics.clone(),
            max_stack_depth: config.max_stack_depth,
            retry_every: config.segment_interval,
        });
        let flusher = Flusher {
            alone: config.adaptive && staging.wal.is_none() && sink.lands_on_any_thread(),
            sink,
            recovery,
            config,
            pending_bytes: pending_bytes.clone(),
            arrivals: arrivals.clone(),
            staging: staging.clone(),
            flushing: AtomicUsize::new(0),
            permits: Arc::new(Semaphore::new(config.max_concurrent_flushes.max(1))),
            last_started: Mutex::new(None),
            last_flush_micros: AtomicU64::new(5_000),
            backoff: backoff.clone(),
            metrics: metrics.clone(),
            recovered: watch::channel(false).0,
        };
        if let Some(bound) = config.max_compaction_wait {
            let weak = sender.downgrade();
            crate::backoff::spawn(
                metastore,
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
        // With a log every write is logged, alone or among others: the log's `fdatasync`s
        // are shared (`WAL_SYNC`), and a batch then lives its `segment_interval`. Logging
        // only a write that came alone made each batch's fate a coin toss at its first
        // write: under steady load that write came among others almost always, and every
        // batch was then a group commit of a few profiles. Two hours of 50 services sent
        // flat out made 1,853 segments (1,162 MB) where 30-s batches make 291 MB, for
        // 1.7× the ingest CPU and 5.7× the compaction (docs/benchmarks.md, "Every write
        // logged").
        let log = self.staging.wal.is_some();
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
            // First start to last end, as a dataset's range is listed by (a superset).
            let times = group.iter().fold((i64::MAX, i64::MIN), |(first, last), p| {
                let end = p.time_nanos.saturating_add(p.duration_nanos.max(0));
                (first.min(p.time_nanos), last.max(end))
            });
            let builder = open.builder(tenant, group[0].service(), times, &self.staging.warm);
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
            // Synced out of the lock, so that a flush's swap does not wait for it, and
            // off the write path's threads (`WAL_SYNC`).
            sync: logged.map(|(file, end)| PendingSync {
                file,
                end,
                resolver,
            }),
        };
        drop(open);
        Ok(staged)
    }

    /// Waits until a logged write is on disk. A failure fails the request; its
    /// profiles, staged, may still reach a segment, as a write whose answer was lost may.
    async fn sync_log(&self, sync: PendingSync) -> Result<(), IngestError> {
        let PendingSync {
            file,
            end,
            resolver,
        } = sync;
        let store = |err| IngestError::Store(Arc::new(StoreError::Wal(err)));
        if !file.synced_through(end) {
            let synced = WAL_SYNC
                .spawn(move || file.sync_to(end))
                .await?
                .map_err(store)?;
            if synced {
                self.metrics.wal_syncs.inc();
            }
        }
        // Durable in the log: a retry is a duplicate from now on.
        if let Some(resolver) = &resolver {
            resolver.resolve(true);
        }
        Ok(())
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
    /// without, an acknowledged write is registered already. A batch whose flush fails
    /// stays in the log and is retried; it is not waited for.
    pub async fn sync(&self) {
        self.sync_batches(None).await
    }

    /// [`Syncer::sync`] of the batches holding a profile that a listing of `scope` could
    /// see: queries call it first. Every read flushing the open batch made a read of
    /// fresh data wait for up to `segment_interval` of every service's profiles, and one
    /// of last hour's wait as long (docs/benchmarks.md, "Every write logged").
    pub async fn sync_for(&self, scope: &DatasetQuery) {
        self.sync_batches(Some(scope)).await
    }

    async fn sync_batches(&self, scope: Option<&DatasetQuery>) {
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
            let wanted = |generation: &Generation| scope.is_none_or(|s| generation.reaches(s));
            let waiting: Vec<_> = closed
                .values()
                .filter(|generation| wanted(generation))
                .map(|generation| generation.done.subscribe())
                .collect();
            let open = (open.requests.load(Ordering::SeqCst) > 0 && wanted(&open))
                .then(|| (open.id, open.done.subscribe()));
            (open, waiting)
        };
        let mut waiting = waiting;
        if let Some((generation, done)) = open {
            let job = Job {
                generation,
                bytes: 0,
                sync: true,
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
        };
        // A write that flushed itself has its result already; the flusher need not wake.
        let flushed = staged.done.borrow().is_some();
        if !flushed && self.sender.send(job).await.is_err() {
            return Err(IngestError::ShuttingDown);
        }
        // Sent before the arrival ends, so a flusher that sees no arrivals left finds
        // this job in the channel.
        drop(arrival);
        if let Some(sync) = staged.sync {
            return self.sync_log(sync).await;
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
