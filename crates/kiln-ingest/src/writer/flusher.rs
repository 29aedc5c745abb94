//! When a batch goes: the flusher gathers what arrives while a flush runs (group
//! commit), swaps the open generation out, hands its builders to the sink and settles
//! every request staged in it with the outcome.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kiln_metastore::WriteIdentity;
use kiln_storage::DatasetBuilder;
use tokio::sync::{mpsc, watch, Semaphore};

use super::metrics::{ReasonLabel, WriterMetrics};
use super::recovery::{remove_logged, Recovery};
use super::sink::SegmentSink;
use super::staging::{Arrivals, Generation, Job, Staged, Staging};
use super::warm::ServiceKey;
use super::IngesterConfig;
use crate::backoff::Backoff;
use crate::error::StoreError;

pub(super) struct Flusher {
    /// Where segments go.
    pub(super) sink: Arc<SegmentSink>,
    /// The leftover logs, written before the first batch; failed logged flushes, again.
    pub(super) recovery: Arc<Recovery>,
    /// Whether a write alone on its way may flush itself ([`Flusher::flush_alone`]):
    /// adaptive, no log, and a sink that lands on any thread. Decided at start.
    pub(super) alone: bool,
    pub(super) config: IngesterConfig,
    pub(super) pending_bytes: Arc<AtomicUsize>,
    pub(super) arrivals: Arc<Arrivals>,
    pub(super) staging: Arc<Staging>,
    /// Flushes running now.
    pub(super) flushing: AtomicUsize,
    /// One per flush that may run at once (`max_concurrent_flushes`).
    pub(super) permits: Arc<Semaphore>,
    /// When the last flush started, for `min_gap` and the backoff's spacing.
    pub(super) last_started: Mutex<Option<Instant>>,
    /// How long the last flush took.
    pub(super) last_flush_micros: AtomicU64,
    /// Spacing asked while compaction lags.
    pub(super) backoff: Arc<Backoff>,
    pub(super) metrics: WriterMetrics,
    /// Set once the log files left by an earlier run are recovered.
    pub(super) recovered: watch::Sender<bool>,
}

impl Flusher {
    pub(super) async fn run(
        self: Arc<Self>,
        mut receiver: mpsc::Receiver<Job>,
        leftovers: Vec<(String, PathBuf)>,
    ) {
        let flusher = self;
        flusher.recovery.remember_identities(&leftovers).await;
        flusher.recovery.recover(leftovers).await;
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
            // With a log every write is logged (`Ingester::stage`), and acknowledged
            // already; without, each waits for this flush.
            let reason = if flusher.staging.wal.is_some() {
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
    /// or a read asks ([`Ingester::sync`]), and at the latest `segment_interval` after
    /// its first write. With a log every write is logged, so none waits for this flush.
    /// Returns the reason, and whether the channel closed.
    async fn gather_logged(
        &self,
        receiver: &mut mpsc::Receiver<Job>,
        first: Job,
    ) -> (&'static str, bool) {
        // Recording rules count a segment as it is registered: while there are any, a
        // logged write waits a shorter time for it, so its metric is out in seconds.
        let interval = if self.sink.rules_seen() {
            self.config
                .segment_interval
                .min(self.config.rules_segment_interval)
        } else {
            self.config.segment_interval
        };
        let deadline = tokio::time::Instant::now() + interval;
        let mut batch_bytes = first.bytes;
        let mut asked = first.sync;
        loop {
            while let Ok(job) = receiver.try_recv() {
                batch_bytes += job.bytes;
                asked |= job.sync;
            }
            if batch_bytes >= self.config.flush_bytes {
                return ("size", false);
            }
            if asked {
                return ("query", false);
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
                    }
                    None => return ("shutdown", true),
                },
                () = tokio::time::sleep_until(deadline) => return ("interval", false),
            }
        }
    }

    /// Writes the segment of every log file an earlier run left (see [`crate::wal`]):
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
        let (builders, profiles, identities) = self.take_batch(&generation);
        let result = self
            .sink
            .write(builders, profiles, &generation.block_id, identities)
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
                    .recovery
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
    pub(super) fn flush_alone(&self, staged: &Staged) {
        let alone = self.alone
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
        let (builders, profiles, identities) = self.take_batch(&generation);
        let result = self
            .sink
            .write_here(builders, profiles, &generation.block_id, identities)
            .map_err(Arc::new);
        self.settle(&generation, started, result);
        // Not parsing: left out of the parse time that admission judges waits by.
        crate::cpu::not_parsing(started.elapsed());
    }

    /// What a swapped-out generation holds for its segment: its builders (which only it
    /// holds by then), its profile count and its writes' identities.
    fn take_batch(
        &self,
        generation: &Generation,
    ) -> (Vec<(ServiceKey, DatasetBuilder)>, usize, Vec<WriteIdentity>) {
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
        let profiles = generation.profiles.load(Ordering::Relaxed);
        (builders, profiles, generation.take_identities())
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
