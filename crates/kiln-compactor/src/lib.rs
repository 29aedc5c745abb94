//! Compaction and retention: the background work that turns the write path's many small
//! segments into few large per-service blocks, and removes what is past retention.
//!
//! A segment holds one dataset per (tenant, service) of one flush. The compactor groups
//! the live datasets of a (tenant, service) by level (the level of the block holding them)
//! and, once a group is due ([`LevelPolicy`]), merges its datasets into one dataset of the
//! next level: symbols are re-interned, so each string, function, location, mapping and
//! stack is stored once per output, and identical series become one.
//!
//! Every step is safe to interrupt:
//! 1. the group's lease is taken in the metastore, so two compactors never do the same job;
//! 2. the inputs are read and merged, and the output is written as a new object — a crash
//!    here leaves an unregistered object, invisible to readers and removed by the orphan
//!    sweep once older than `orphan_age_ms` (an hour: far longer than any write takes
//!    between its upload and its registration, so a write in flight is never mistaken
//!    for garbage);
//! 3. one metastore transaction registers the output and removes the inputs (readers see
//!    one or the other, never both or neither); if another compactor or retention removed
//!    an input meanwhile, the transaction changes nothing and the output becomes an orphan;
//! 4. blocks left without datasets are tombstoned and their objects deleted after the
//!    grace period, so queries that listed them just before can still read them.
//!
//! A level-0 dataset is compacted exactly once: its swap deletes it, or, when every
//! dataset of its segment is its service's only one or one of two due, and none still
//! waits for a tenant's rules, the segment itself is raised to level 1 (one row update,
//! no object written; see [`promotable`]). A profile is seen exactly once twice over: at
//! its segment's registration and at its first compaction. Recording rules count it at
//! the registration where the ingester has them (kiln-ingest's sink, seconds after the
//! write; the dataset is then marked `rules_counted`); the rest, segments registered
//! without, are counted here ([`RuleHook`], kiln-rules), over the inputs, and their
//! samples are committed in the same transaction as the swap.
//!
//! Retention removes, per tenant, the datasets whose newest profile is older than the
//! tenant's retention, through the same tombstones.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kiln_metastore::{
    BlockMeta, DatasetMeta, Exports, LeaseKey, Metastore, MetastoreError, RuleRecord,
};
use kiln_runtime::worker::Pool;
use kiln_storage::format::{encode_block_as, BlockEncoding, Projection};
use kiln_storage::merge::{MergeInput, Streamed};
use kiln_storage::ranged::{BlockTail, PartialBlock, TailCache};
use kiln_storage::{Dataset, DatasetBuilder, ObjectStorage, StorageError};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use thiserror::Error;

const NANOS_PER_MS: i64 = 1_000_000;
const DAY_MS: i64 = 86_400_000;

#[derive(Debug, Error)]
pub enum CompactorError {
    #[error("metastore: {0}")]
    Metastore(#[from] MetastoreError),
    #[error("object storage: {0}")]
    Storage(#[from] StorageError),
    /// A dataset failed its checks (see [`Dataset::check`]).
    #[error("dataset {0} is corrupt: {1}")]
    Corrupt(String, String),
    #[error("dataset {dataset} cannot be read: {source}")]
    Unreadable {
        dataset: String,
        #[source]
        source: StorageError,
    },
    #[error("encoding the merged block: {0}")]
    Encode(#[source] StorageError),
    #[error("compaction task failed: {0}")]
    Task(#[from] kiln_runtime::worker::WorkerError),
}

/// When a level's datasets of one (tenant, service) are merged into the next level.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LevelPolicy {
    /// Merge once this many datasets wait.
    pub max_datasets: usize,
    /// Or once the oldest has waited this long (milliseconds).
    pub max_age_ms: i64,
    /// Outputs never span two windows of this width (milliseconds; 0: no windows), so
    /// retention and time-range queries can skip whole blocks.
    pub window_ms: i64,
    /// How the outputs are compressed. Outputs that the next level merges again within
    /// minutes are better written fast than small: with many services at a low rate, the
    /// zstd of level-1 outputs took a sixth of the server's CPU (docs/benchmarks.md).
    pub compression: LevelCompression,
}

/// The codec of a level's outputs (docs/FORMAT.md, section 1).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum LevelCompression {
    /// Snappy, plain encodings: cheap to write and to read, about 1.6 times the size.
    /// Datasets a level-0 pass copies or promotes keep their segment's pages
    /// (uncompressed) until this level merges them.
    Snappy,
    /// zstd level 3 with byte-stream-split values: for blocks kept for the retention period.
    #[default]
    Zstd,
}

impl LevelCompression {
    fn encoding(self) -> BlockEncoding {
        match self {
            LevelCompression::Snappy => BlockEncoding::Snappy,
            LevelCompression::Zstd => BlockEncoding::Compacted,
        }
    }
}

impl Default for LevelPolicy {
    fn default() -> Self {
        LevelPolicy {
            max_datasets: 10,
            max_age_ms: 600_000,
            window_ms: 0,
            compression: LevelCompression::Zstd,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct CompactorConfig {
    pub enabled: bool,
    /// Pause between two passes (milliseconds); a tenth of it after a pass that merged a
    /// level-0 group due by count, so that a fast-growing level 0 is merged as it fills.
    pub interval_ms: u64,
    /// Policy of level `i` (its datasets become level `i + 1`). Kiln's defaults, against
    /// Pyroscope's (20 / 36 s, 10 / 12 min, 10 / 3 h): segments merge after 20 or 10 s,
    /// so the median profile is compacted well within 30 s of its ingest; level 1 after 10
    /// or 10 min within hour windows; level 2 after 24 or 6 h within day windows. Level-1
    /// blocks are snappy, as they are merged again within minutes; the rest zstd.
    pub levels: Vec<LevelPolicy>,
    /// At most this many datasets in one merge, to bound its memory.
    pub max_inputs: usize,
    /// At most this many profiles in one level-0 merge (unless one dataset alone has
    /// more). Level 0's merges, and any merge the streaming one declines, hold all their
    /// inputs' samples and then their output in memory: about 30 KiB per profile of the
    /// corpus's size (about 900 samples) at the peak; at 5,000, a 1,000-client server went
    /// from 350 to 650 MiB at each busy service's merge (docs/benchmarks.md). Levels 1 and
    /// up stream their samples within `memory_limit` instead, so that a day of a service
    /// is one block whatever its profiles.
    pub max_job_profiles: u64,
    /// What a merge at level 1 and up may hold, in bytes, by `kiln_storage::merge`'s
    /// measured estimate: it takes as many of its inputs as fit; the rest are planned
    /// again in the same pass.
    pub memory_limit: u64,
    /// Replaced objects are deleted after this long (milliseconds): longer than any query
    /// may take between listing a block and reading it.
    pub grace_ms: i64,
    /// An object that no block row names is deleted once this old (milliseconds). It
    /// must exceed the longest time between a write's upload and its registration, or a
    /// write in flight would look like garbage; a flush takes well under a second, so the
    /// hour of the default is a wide margin. The store is listed at most once per period.
    pub orphan_age_ms: i64,
    /// How long a lease holds before another compactor may take over (milliseconds).
    pub lease_ms: i64,
    /// Compaction is behind once level-0 datasets have waited longer than this for their
    /// merge, on average (milliseconds; 0: never): the write path then spaces its
    /// flushes, 25 ms per second over, until it catches up (kiln-ingest `backoff.rs`).
    /// Level 0's own `max_age_ms` by default, which a service merged by age waits at
    /// most, and one merged by count far less.
    pub max_wait_ms: u64,
    /// Days of data kept; 0 keeps everything. Set from the tenant limits (one place to
    /// configure retention, which ingest also enforces), not from this section.
    #[serde(skip)]
    pub retention_days: u32,
    /// Per-tenant retention in days, overriding `retention_days`.
    #[serde(skip)]
    pub tenant_retention_days: HashMap<String, u32>,
}

impl Default for CompactorConfig {
    fn default() -> Self {
        CompactorConfig {
            enabled: true,
            interval_ms: 5_000,
            levels: vec![
                LevelPolicy {
                    max_datasets: 20,
                    max_age_ms: 10_000,
                    window_ms: 0,
                    compression: LevelCompression::Snappy,
                },
                LevelPolicy {
                    max_datasets: 10,
                    max_age_ms: 600_000,
                    window_ms: 3_600_000,
                    compression: LevelCompression::Zstd,
                },
                LevelPolicy {
                    max_datasets: 24,
                    max_age_ms: 6 * 3_600_000,
                    window_ms: DAY_MS,
                    compression: LevelCompression::Zstd,
                },
            ],
            max_inputs: 200,
            max_job_profiles: 2_000,
            memory_limit: 256 << 20,
            grace_ms: 300_000,
            orphan_age_ms: 3_600_000,
            lease_ms: 600_000,
            max_wait_ms: 10_000,
            retention_days: 31,
            tenant_retention_days: HashMap::new(),
        }
    }
}

#[derive(Clone, Default)]
pub struct CompactorMetrics {
    pub jobs: Counter,
    /// Jobs that moved a lone level-0 dataset by copying its column chunks.
    pub copies: Counter,
    /// Merges that streamed their inputs' samples (levels 1 and up).
    pub streamed: Counter,
    /// Jobs that raised a segment holding one lone dataset to level 1 in place.
    pub promotions: Counter,
    pub conflicts: Counter,
    pub input_bytes: Counter,
    pub output_bytes: Counter,
    /// CPU time of merges (decode, merge, encode), on the compactor's thread.
    pub merge_cpu_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
    /// CPU time of compaction in all: its merges, and its planning, metastore
    /// transactions and uploads wherever they ran ([`kiln_runtime::priority::CpuAccount`]).
    pub cpu_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
    pub expired_datasets: Counter,
    pub deleted_objects: Counter,
    /// Memory held by the cached tails of blocks not yet read to the end.
    pub tail_cache_bytes: Gauge,
}

impl CompactorMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kiln_compaction_jobs",
            "Compactions committed",
            self.jobs.clone(),
        );
        registry.register(
            "kiln_compaction_copies",
            "Lone level-0 datasets moved out of their segment by copying their column chunks, not merged",
            self.copies.clone(),
        );
        registry.register(
            "kiln_compaction_streamed",
            "Merges at level 1 and up by the streaming merge (kiln_storage::merge), within compaction.memory_limit",
            self.streamed.clone(),
        );
        registry.register(
            "kiln_compaction_promotions",
            "Segments holding one lone level-0 dataset raised to level 1 in place, neither copied nor merged",
            self.promotions.clone(),
        );
        registry.register(
            "kiln_compaction_conflicts",
            "Compactions abandoned because their inputs changed",
            self.conflicts.clone(),
        );
        registry.register(
            "kiln_compaction_input_bytes",
            "Bytes of block objects read by compaction",
            self.input_bytes.clone(),
        );
        registry.register(
            "kiln_compaction_merge_cpu_seconds",
            "CPU time spent merging and encoding compacted blocks",
            self.merge_cpu_seconds.clone(),
        );
        registry.register(
            "kiln_compaction_cpu_seconds",
            "CPU time of compaction in all: merges, planning, metastore transactions and the polls of its reads and uploads (not a local store's file writes, which object_store runs on the shared blocking pool)",
            self.cpu_seconds.clone(),
        );
        registry.register(
            "kiln_compaction_output_bytes",
            "Bytes of block objects written by compaction",
            self.output_bytes.clone(),
        );
        registry.register(
            "kiln_retention_expired_datasets",
            "Datasets removed by retention",
            self.expired_datasets.clone(),
        );
        registry.register(
            "kiln_deleted_objects",
            "Objects deleted after their grace period",
            self.deleted_objects.clone(),
        );
        registry.register(
            "kiln_compaction_tail_cache_bytes",
            "Memory held by the footers of blocks whose datasets compaction has still to read",
            self.tail_cache_bytes.clone(),
        );
    }
}

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    pub compactions: usize,
    /// Of them, merges of level-0 groups that were due by count (`max_datasets` waiting),
    /// not by age: data arrives faster than the passes. A higher level's group due by
    /// count is merged in the pass that finds it, and does not count.
    pub full_groups: usize,
    pub conflicts: usize,
    /// Jobs that failed (e.g. an unreadable input); the others went on.
    pub failures: usize,
    pub expired_datasets: usize,
    pub deleted_objects: usize,
}

/// Evaluates a tenant's recording rules over one level-0 dataset; runs on the blocking
/// pool during the merge. Its samples are committed with the swap.
pub type RuleHook = Arc<dyn Fn(&[RuleRecord], &Dataset) -> Exports + Send + Sync>;

#[derive(Clone)]
pub struct Compactor {
    rules: Option<RuleHook>,
    metastore: Metastore,
    storage: ObjectStorage,
    config: CompactorConfig,
    /// Lease owner name: unique per process.
    owner: String,
    metrics: CompactorMetrics,
    /// When the last orphan sweep listed the store (ms): listing every object is costly
    /// on S3, and orphans only age out once per `orphan_age_ms` anyway.
    last_sweep_ms: Arc<AtomicI64>,
    /// Block tails (footers) already fetched, so that the jobs of the services sharing a
    /// segment fetch its footer once between them (see [`kiln_storage::ranged`]).
    tails: Arc<std::sync::Mutex<TailCache>>,
    /// Top-level groups whose inputs do not fit two at a time in `memory_limit`, by the
    /// inputs tried: not fetched and merged again each pass until the group changes.
    unfit: Arc<std::sync::Mutex<HashMap<LeaseKey, Vec<String>>>>,
    /// The thread every merge step runs on. A job's builder grows over several steps and
    /// is freed in its last: on tokio's blocking pool those steps landed on different
    /// threads, each kept the pages it had allocated, and the RSS climbed by about 25 MiB
    /// a job through a pass of level-1 merges (docs/benchmarks.md). On one thread the
    /// freed pages are reused by the next job and handed back by `release_memory`.
    merges: Arc<Pool>,
}

/// The most datasets of a level-0 job that [`promotable`] raises instead of merging: up to
/// two, level 1 holds at most twice the datasets a merge would have left it.
const PROMOTE_MAX_INPUTS: usize = 2;

/// At most this many rounds of one level in a pass ([`Compactor::run_pass`]): a bound
/// beside the progress each round makes.
const MAX_ROUNDS: usize = 64;

/// Memory for cached block tails; beyond it the oldest go (and are fetched again if needed).
const TAIL_CACHE_BYTES: usize = 64 << 20;

/// Prefixes under which Kiln writes objects: the orphan sweep looks only there.
pub const OBJECT_PREFIXES: [&str; 2] = ["segments", "blocks"];

use kiln_model::time::now_ms;

/// A pass's time: the start its caller gave, advanced by what the pass has taken. The
/// pass judges every level by it and stamps with it what it makes (a block's creation,
/// a promotion, the tombstones of what a merge or retention replaced), so what it made one level down
/// is never younger than the level above is told it is now. With the wall clock for the
/// stamps, milliseconds rounded apart from this one, a level due at once missed its
/// inputs by a millisecond now and then.
#[derive(Clone, Copy)]
struct PassClock {
    start_ms: i64,
    started: std::time::Instant,
}

impl PassClock {
    fn now(&self) -> i64 {
        let elapsed = i64::try_from(self.started.elapsed().as_millis()).unwrap_or(i64::MAX);
        self.start_ms.saturating_add(elapsed)
    }
}

/// A due merge: the inputs of one group.
struct Job {
    key: LeaseKey,
    inputs: Vec<DatasetMeta>,
    /// Due because `max_datasets` were waiting.
    full: bool,
}

impl Job {
    /// Whether the job's memory is worth handing back to the system at once. A small job
    /// frees little, and collecting the allocator's heaps after each of the many small
    /// jobs of many services at a low rate cost more CPU than their merges' encoding.
    fn is_large(&self) -> bool {
        const LARGE_JOB_PROFILES: u64 = 200;
        self.inputs.iter().map(|d| d.profile_count).sum::<u64>() >= LARGE_JOB_PROFILES
    }

    /// A service's one level-0 dataset left after [`promotable`] ones were raised, moved
    /// out of the segment it shares by a copy of its column chunks
    /// (`Compactor::copy_lone`) unless recording rules must read it, and without a
    /// lease either way: a lease only spares two compactors the same work (the swap fails
    /// when its inputs are gone), and taking and releasing one are two metastore commits,
    /// each an fsync, where with many services at a low rate most jobs are such moves.
    fn is_lone(&self) -> bool {
        self.inputs.len() == 1
    }
}

/// Of level 0's due jobs, the inputs whose blocks can be raised to level 1 in place
/// ([`Metastore::promote_blocks`]): segments whose every live dataset (`live`, as listed)
/// is in a job of at most [`PROMOTE_MAX_INPUTS`], where level 1 is a fast one (snappy)
/// that takes a segment's pages as they are. Blocks holding a dataset of a tenant with
/// recording rules are then left out (`Compactor::promote`).
///
/// With many services at a low rate a service has one or two datasets when its group is
/// due: in segments of its own (a flush of one service), or in a segment of many services
/// (the write-ahead log's flushes, each a dataset per service). Copying such a dataset
/// out would write the same bytes again, with an upload and a metastore commit of its
/// own, per service; merging two would decode and encode both, for a dataset that level
/// 1 merges again within minutes anyway. Raised, a segment costs a row update in one
/// transaction per pass, and level 1's merge is its datasets' first (docs/benchmarks.md).
/// Level 1 then holds blocks of many services, as level 0 did; its merges read each
/// dataset by its byte range either way. A larger group is merged as before, so that
/// level 1 (which merges ten datasets at a time) holds few, larger datasets, and so do
/// the levels above it.
fn promotable<'a>(
    jobs: &'a [Job],
    live: &HashMap<String, usize>,
    compression: LevelCompression,
) -> Vec<&'a DatasetMeta> {
    if compression != LevelCompression::Snappy {
        return Vec::new();
    }
    let small: Vec<&DatasetMeta> = jobs
        .iter()
        .filter(|job| job.key.level == 0 && job.inputs.len() <= PROMOTE_MAX_INPUTS)
        .flat_map(|job| &job.inputs)
        .collect();
    let covered = per_block(small.iter().copied());
    small
        .into_iter()
        .filter(|input| live.get(&input.block_id) == covered.get(&input.block_id))
        .collect()
}

impl Compactor {
    pub fn new(metastore: Metastore, storage: ObjectStorage, config: CompactorConfig) -> Self {
        Compactor {
            rules: None,
            metastore,
            storage,
            config,
            owner: format!("compactor-{}", ulid::Ulid::new()),
            metrics: CompactorMetrics::default(),
            last_sweep_ms: Default::default(),
            tails: Arc::new(std::sync::Mutex::new(TailCache::new(TAIL_CACHE_BYTES))),
            unfit: Default::default(),
            merges: Arc::new(Pool::start("kiln-compact", 1)),
        }
    }

    /// Evaluates recording rules over level-0 inputs not counted at their registration.
    pub fn with_rules(mut self, hook: RuleHook) -> Self {
        self.rules = Some(hook);
        self
    }

    pub fn metrics(&self) -> &CompactorMetrics {
        &self.metrics
    }

    /// Runs passes every `interval_ms` until `stop` fires; sooner while level-0 groups
    /// fill up between passes. Under heavy ingest level 0 grows by hundreds of datasets a second,
    /// and every query up to now reads each of them: the pause between passes was most of
    /// their number (docs/benchmarks.md, queries while ingesting).
    pub fn spawn(
        self,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let interval = Duration::from_millis(self.config.interval_ms.max(10));
            let catching_up = (interval / 10).max(Duration::from_millis(10));
            let cpu = self.metrics.cpu_seconds.clone();
            let account = kiln_runtime::priority::CpuAccount::new(move |seconds| {
                cpu.inc_by(seconds);
            });
            loop {
                let pause = match account.scope(self.run_pass(now_ms())).await {
                    Ok(report) => {
                        if report != PassReport::default() {
                            tracing::debug!(?report, "compaction pass");
                        }
                        if report.full_groups > 0 {
                            catching_up
                        } else {
                            interval
                        }
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "compaction pass failed");
                        interval
                    }
                };
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = stop.changed() => return,
                }
            }
        })
    }

    /// One pass: every due compaction, then retention, then deletion of objects past their
    /// grace period. `now_ms` is the pass's start; each step reads the time as it begins
    /// (`now_ms` plus what the pass has taken so far), so a level's output is judged by its
    /// own age, not against the start of a pass that made it: with the pass's start alone,
    /// a level due at once waited a pass for each level below it, and a settled day took
    /// three passes and a fourth to delete what they replaced (docs/benchmarks.md,
    /// "Settling at the server's own pass interval").
    pub async fn run_pass(&self, now_ms: i64) -> Result<PassReport, CompactorError> {
        let clock = PassClock {
            start_ms: now_ms,
            started: std::time::Instant::now(),
        };
        let mut report = PassReport::default();
        // Through the top level, whose datasets of one window are merged into one there
        // (no level at all: nothing is merged).
        let levels = match self.config.levels.len() {
            0 => 0,
            n => n as u32 + 1,
        };
        for level in 0..levels {
            // A merge that took only the inputs that fit in `memory_limit` leaves the rest
            // at its level: they are planned again at once, instead of a pass later. Each
            // round merges at least one input away, so the rounds end.
            for _ in 0..MAX_ROUNDS {
                let left = self.run_level(level, clock, &mut report).await?;
                if left == 0 {
                    break;
                }
            }
        }
        report.expired_datasets = self.apply_retention(clock.now()).await?;
        report.deleted_objects = self.delete_garbage(clock.now()).await?;
        Ok(report)
    }

    /// Runs the jobs due at `level`; returns how many of their inputs were left for
    /// another merge (they did not fit in this one's memory limit).
    async fn run_level(
        &self,
        level: u32,
        clock: PassClock,
        report: &mut PassReport,
    ) -> Result<usize, CompactorError> {
        let (mut jobs, live) = self.due_jobs(level, clock.now()).await?;
        if level == 0 && !live.is_empty() {
            let promoted = self.promote(&jobs, &live, clock.now()).await?;
            let due = per_block(jobs.iter().flat_map(|job| &job.inputs));
            let promoting = self.config.levels[0].compression == LevelCompression::Snappy;
            for job in &mut jobs {
                job.inputs
                    .retain(|input| !promoted.contains(&input.block_id));
            }
            // A small job whose segment is only partly due waits for the rest of it,
            // at most one `max_age_ms`, to be raised with it: copied now, it would
            // cost an object per service where the segment's promotion costs none.
            jobs.retain(|job| {
                let waits = promoting
                    && job.inputs.len() <= PROMOTE_MAX_INPUTS
                    && job
                        .inputs
                        .iter()
                        .any(|input| live.get(&input.block_id) > due.get(&input.block_id));
                !job.inputs.is_empty() && !waits
            });
            report.compactions += promoted.len();
        }
        let mut left = 0;
        for job in jobs {
            let (tenant, service) = (job.key.tenant.clone(), job.key.service.clone());
            let full = job.full;
            match self.compact(job, clock).await {
                Ok(Some(rest)) => {
                    report.compactions += 1;
                    report.full_groups += usize::from(full && level == 0);
                    left += rest;
                }
                Ok(None) => report.conflicts += 1,
                // One group's failure must not stop the others, retention or deletion.
                Err(err) => {
                    tracing::warn!(error = %err, %tenant, %service, level, "compaction job failed");
                    report.failures += 1;
                }
            }
        }
        Ok(left)
    }

    /// Raises the [`promotable`] blocks of level 0's due jobs to level 1 in one metastore
    /// transaction; returns those raised. The rest (a block changed since it was listed)
    /// are merged or copied with their job's other inputs.
    async fn promote(
        &self,
        jobs: &[Job],
        live: &HashMap<String, usize>,
        now_ms: i64,
    ) -> Result<HashSet<String>, CompactorError> {
        let candidates = promotable(jobs, live, self.config.levels[0].compression);
        if candidates.is_empty() {
            return Ok(HashSet::new());
        }
        // Read before the promotion, as a job reads them before its merge: a rule saved
        // later starts with the next job.
        let ruled: HashSet<String> = match &self.rules {
            Some(_) => self
                .metastore
                .recording_rules(None)
                .await?
                .into_iter()
                .map(|rule| rule.tenant)
                .collect(),
            None => HashSet::new(),
        };
        // A block holding one uncounted dataset of a tenant with rules is left whole for
        // its jobs.
        let held: HashSet<&str> = candidates
            .iter()
            .filter(|input| !input.rules_counted && ruled.contains(&input.tenant))
            .map(|input| input.block_id.as_str())
            .collect();
        let blocks = per_block(
            candidates
                .iter()
                .copied()
                .filter(|input| !held.contains(input.block_id.as_str())),
        )
        .into_iter()
        .map(|(block, datasets)| (block, datasets as u32))
        .collect();
        let promoted = self.metastore.promote_blocks(blocks, 0, now_ms).await?;
        let count = promoted.len() as u64;
        self.metrics.jobs.inc_by(count);
        self.metrics.promotions.inc_by(count);
        Ok(promoted.into_iter().collect())
    }

    /// The level of the blocks no policy merges into another level: the last policy's
    /// output, whose datasets of one window it merges into one at that level.
    fn top_level(&self) -> u32 {
        self.config.levels.len() as u32
    }

    /// The policy datasets at `level` are merged by (the last one at the top).
    fn policy(&self, level: u32) -> &LevelPolicy {
        let last = self.config.levels.len().saturating_sub(1);
        &self.config.levels[(level as usize).min(last)]
    }

    /// Groups the live datasets of `level` by (tenant, service, window) and returns the
    /// groups that are due, and at level 0 how many live datasets each segment held when
    /// listed (the only level [`promotable`] raises from).
    async fn due_jobs(
        &self,
        level: u32,
        now_ms: i64,
    ) -> Result<(Vec<Job>, HashMap<String, usize>), CompactorError> {
        let top = self.top_level();
        let policy = self.policy(level);
        let mut groups: BTreeMap<(String, String, i64), Vec<(DatasetMeta, i64)>> = BTreeMap::new();
        let listed = self.metastore.datasets_at_level(level).await?;
        let live = match level {
            0 => per_block(listed.iter().map(|(dataset, _)| dataset)),
            _ => HashMap::new(),
        };
        for (dataset, created_at_ms) in listed {
            let window = match policy.window_ms {
                window if window > 0 => (dataset.min_time_nanos / NANOS_PER_MS).div_euclid(window),
                _ => 0,
            };
            groups
                .entry((dataset.tenant.clone(), dataset.service.clone(), window))
                .or_default()
                .push((dataset, created_at_ms));
        }
        let mut jobs = Vec::new();
        for ((tenant, service, _), mut datasets) in groups {
            let oldest = datasets
                .iter()
                .map(|(_, created)| *created)
                .min()
                .unwrap_or(now_ms);
            let full = datasets.len() >= policy.max_datasets;
            let due = full || now_ms - oldest >= policy.max_age_ms;
            if !due {
                continue;
            }
            datasets.sort_by_key(|(dataset, created)| (*created, dataset.min_time_nanos));
            let datasets: Vec<DatasetMeta> = datasets.into_iter().map(|(d, _)| d).collect();
            // Above level 0 a merge streams, and takes what fits in its memory limit.
            let max_profiles = match level {
                0 => self.config.max_job_profiles,
                _ => u64::MAX,
            };
            for chunk in chunks(&datasets, self.config.max_inputs, max_profiles) {
                // A dataset alone (in its group, or in a chunk of a group too large for
                // one merge) moves up a level all the same (copied where its encoding is
                // the next level's), to meet the rest of its next window there: a
                // segment of profiles sent late, or replayed, spans hours, and grouped by
                // the hour it starts in it was alone in its window and stayed,
                // uncompacted, at level 1 (docs/benchmarks.md, issue 61). At the top
                // there is no level to meet them, and it stays.
                if chunk.len() < 2 && level == top {
                    continue;
                }
                jobs.push(Job {
                    key: LeaseKey {
                        tenant: tenant.clone(),
                        service: service.clone(),
                        level,
                    },
                    inputs: chunk.to_vec(),
                    full,
                });
            }
        }
        Ok((jobs, live))
    }

    /// Merges one group; `None` when it lost a race (lease held elsewhere or inputs gone),
    /// else how many of its inputs were left for another merge.
    async fn compact(&self, job: Job, clock: PassClock) -> Result<Option<usize>, CompactorError> {
        let leased = !job.is_lone();
        if leased
            && !self
                .metastore
                .acquire_lease(job.key.clone(), &self.owner, self.config.lease_ms)
                .await?
        {
            return Ok(None);
        }
        let large = job.is_large();
        let result = self.merge_and_swap(&job, large, clock).await;
        // The job's inputs, merged dataset and block are freed by now: hand the memory
        // back before the next job, instead of when the allocator gets round to it.
        if large {
            kiln_runtime::priority::release_memory();
        }
        if leased {
            self.metastore
                .release_lease(job.key.clone(), &self.owner)
                .await?;
        }
        match result {
            Ok(swapped) => {
                if swapped.is_some() {
                    self.metrics.jobs.inc();
                }
                Ok(Some(swapped.unwrap_or(0)))
            }
            Err(CompactorError::Metastore(MetastoreError::Conflict(message))) => {
                tracing::info!(%message, tenant = %job.key.tenant, service = %job.key.service, "compaction inputs changed; abandoned");
                self.metrics.conflicts.inc();
                Ok(None)
            }
            Err(err) => Err(err),
        }
    }

    /// The tail of a block, from the cache or fetched (and counted as input).
    async fn block_tail(&self, key: &str) -> Result<Arc<BlockTail>, CompactorError> {
        let (tail, fetched) = TailCache::get_or_read(&self.tails, &self.storage, key).await?;
        self.metrics.input_bytes.inc_by(fetched);
        if fetched > 0 {
            let bytes = TailCache::lock(&self.tails).bytes();
            self.metrics.tail_cache_bytes.set(bytes as i64);
        }
        Ok(tail)
    }

    /// Counts one dataset of block `key` as merged: the block goes once every dataset of
    /// it is, so its tail is not kept past its last reader.
    fn tail_read(&self, key: &str) {
        let mut tails = TailCache::lock(&self.tails);
        tails.read_once(key);
        self.metrics.tail_cache_bytes.set(tails.bytes() as i64);
    }

    /// Runs merge work on the compactor's thread (at background priority), its CPU counted.
    async fn background<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T, CompactorError> + Send + 'static,
    ) -> Result<T, CompactorError> {
        let merge_cpu = self.metrics.merge_cpu_seconds.clone();
        // The pass's account, when it runs in one: the merge thread is not polled in it.
        let account = kiln_runtime::priority::current_account();
        self.merges
            .spawn(move || {
                let (done, used) = kiln_runtime::priority::with_thread_cpu(work);
                merge_cpu.inc_by(used);
                if let Some(account) = account {
                    account.charge(used);
                }
                done
            })
            .await?
    }

    /// `large`: hand the merge's memory back once it is encoded ([`Job::is_large`]).
    /// When a block was swapped in, how many of the job's inputs it left out (they did
    /// not fit in `memory_limit`); `None` when the job's inputs do not fit together at
    /// the top level (nothing to do).
    async fn merge_and_swap(
        &self,
        job: &Job,
        large: bool,
        clock: PassClock,
    ) -> Result<Option<usize>, CompactorError> {
        let (tenant, service) = (job.key.tenant.clone(), job.key.service.clone());
        // Rules are read after the lease is held: a rule saved before this point counts
        // these inputs, one saved later starts with the next job. Inputs counted as
        // their segment was registered are not counted again.
        let rules = match &self.rules {
            Some(hook) if job.key.level == 0 && job.inputs.iter().any(|i| !i.rules_counted) => {
                let rules = self.metastore.recording_rules(Some(tenant.clone())).await?;
                (!rules.is_empty()).then(|| (hook.clone(), rules))
            }
            _ => None,
        };
        let encoding = self.policy(job.key.level).compression.encoding();
        if job.is_lone() && rules.is_none() {
            if let Some((block, meta)) = self.copy_lone(&job.inputs[0], encoding).await? {
                crash_point("compaction-merged");
                self.swap(job, &job.inputs, block, meta, Exports::default(), clock)
                    .await?;
                self.metrics.copies.inc();
                return Ok(Some(0));
            }
        }
        if job.key.level > 0 && rules.is_none() {
            match self.stream_and_swap(job, encoding, clock).await? {
                Stream::Swapped { left } => return Ok(Some(left)),
                Stream::Unfit => return Ok(None),
                Stream::Declined => {}
            }
        }
        // Each input dataset is read by its own byte range (a segment holds many services'
        // datasets, and this job needs only one of them), and merged before the next is
        // fetched: a job holds one input's bytes at a time, not all of them. The bytes are
        // read on the compactor's thread, which frees them
        // ([`ObjectStorage::get_ranges_blocking`] says why).
        let runtime = tokio::runtime::Handle::current();
        let mut merge = Merge::new(&tenant, &service, rules);
        for meta in &job.inputs {
            let tail = self.block_tail(&meta.object_key).await?;
            let (input, storage, runtime) = (meta.clone(), self.storage.clone(), runtime.clone());
            let fetched;
            (merge, fetched) = self
                .background(move || {
                    let mut merge = merge;
                    let (partial, fetched) = fetch_dataset(&storage, &runtime, &tail, &input)?;
                    merge.add(&input, partial)?;
                    Ok((merge, fetched))
                })
                .await?;
            self.metrics.input_bytes.inc_by(fetched);
            self.tail_read(&meta.object_key);
        }
        // The block is named first, so its index entry is complete when built.
        let id = ulid::Ulid::new().to_string();
        let object_key = format!("blocks/{id}.parquet");
        let target = (id, object_key);
        let started = std::time::Instant::now();
        // Walks the builder's profiles: asked only when the job's line will be logged.
        let merged_bytes = tracing::enabled!(tracing::Level::DEBUG)
            .then(|| merge.builder.heap_bytes())
            .unwrap_or(0);
        let (block, meta, exports) = self
            .background(move || {
                let finished = merge.finish(&target, encoding);
                if large {
                    kiln_runtime::priority::release_memory();
                }
                finished
            })
            .await?;
        crash_point("compaction-merged");
        let size_bytes = block.len() as u64;
        tracing::debug!(
            tenant = %job.key.tenant,
            service = %job.key.service,
            level = job.key.level,
            inputs = job.inputs.len(),
            profiles = meta.profile_count,
            merged_bytes,
            block_bytes = size_bytes,
            finish_ms = started.elapsed().as_millis() as u64,
            "compaction merged"
        );
        self.swap(job, &job.inputs, Bytes::from(block), meta, exports, clock)
            .await?;
        Ok(Some(0))
    }

    /// Merges the job's inputs by [`kiln_storage::merge`], streaming their samples, and
    /// swaps those it took (as many as fit in `memory_limit`, from the first) for the
    /// block. False when the streaming merge declines the inputs (see its doc): the
    /// caller merges them in memory. Inputs are fetched until their bytes alone would
    /// take a third of the limit, which is as many as the merge could take.
    async fn stream_and_swap(
        &self,
        job: &Job,
        encoding: BlockEncoding,
        clock: PassClock,
    ) -> Result<Stream, CompactorError> {
        let tried: Vec<String> = job.inputs.iter().map(|i| i.block_id.clone()).collect();
        let top = job.key.level == self.top_level();
        if top && self.unfit_lock().get(&job.key) == Some(&tried) {
            return Ok(Stream::Unfit);
        }
        let limit = usize::try_from(self.config.memory_limit).unwrap_or(usize::MAX);
        let runtime = tokio::runtime::Handle::current();
        let mut inputs = Vec::with_capacity(job.inputs.len());
        let mut held = 0usize;
        for meta in &job.inputs {
            if !inputs.is_empty() && held.saturating_mul(3) > limit {
                break;
            }
            let tail = self.block_tail(&meta.object_key).await?;
            let (input, storage, runtime) = (meta.clone(), self.storage.clone(), runtime.clone());
            let (partial, fetched) = self
                .background(move || fetch_dataset(&storage, &runtime, &tail, &input))
                .await?;
            self.metrics.input_bytes.inc_by(fetched);
            held += partial.size_bytes();
            inputs.push(MergeInput {
                name: format!("{}#{}", meta.object_key, meta.row_group),
                block: partial,
                row_group: meta.row_group as usize,
            });
        }
        let (tenant, service) = (job.key.tenant.clone(), job.key.service.clone());
        let started = std::time::Instant::now();
        let fetched_inputs = inputs.len();
        let streamed = self
            .background(move || {
                Ok(kiln_storage::merge::merge(
                    &tenant, &service, &inputs, encoding, limit,
                )?)
            })
            .await?;
        let merged = match streamed {
            Streamed::Merged(merged) => merged,
            Streamed::Declined(reason) => {
                tracing::info!(%reason, tenant = %job.key.tenant, service = %job.key.service, "streaming merge declined; merging in memory");
                return Ok(Stream::Declined);
            }
        };
        // At the top a merge of one input would only copy it.
        if top && merged.inputs_used < 2 {
            tracing::info!(tenant = %job.key.tenant, service = %job.key.service, inputs = job.inputs.len(), "top-level datasets do not fit two at a time in compaction.memory_limit; left apart");
            self.unfit_lock().insert(job.key.clone(), tried);
            return Ok(Stream::Unfit);
        }
        crash_point("compaction-merged");
        let used = &job.inputs[..merged.inputs_used];
        for meta in used {
            self.tail_read(&meta.object_key);
        }
        let id = ulid::Ulid::new().to_string();
        let meta = DatasetMeta {
            object_key: format!("blocks/{id}.parquet"),
            block_id: id,
            tenant: job.key.tenant.clone(),
            service: job.key.service.clone(),
            row_group: 0,
            min_time_nanos: merged.min_time_nanos,
            max_time_nanos: merged.max_time_nanos,
            profile_types: merged.profile_types,
            profile_count: merged.profile_count,
            rules_counted: false,
        };
        tracing::debug!(
            tenant = %job.key.tenant,
            service = %job.key.service,
            level = job.key.level,
            inputs = used.len(),
            fetched_inputs,
            job_inputs = job.inputs.len(),
            decoded_whole = merged.decoded_whole,
            estimated_bytes = merged.estimated_bytes,
            profiles = meta.profile_count,
            block_bytes = merged.block.len(),
            merge_ms = started.elapsed().as_millis() as u64,
            "compaction merged, streaming"
        );
        self.metrics.streamed.inc();
        let block = Bytes::from(merged.block);
        self.swap(job, used, block, meta, Exports::default(), clock)
            .await?;
        Ok(Stream::Swapped {
            left: job.inputs.len() - used.len(),
        })
    }

    fn unfit_lock(&self) -> std::sync::MutexGuard<'_, HashMap<LeaseKey, Vec<String>>> {
        self.unfit
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The same compactor with another `memory_limit` (tests and benches).
    pub fn with_memory_limit(mut self, bytes: u64) -> Self {
        self.config.memory_limit = bytes;
        self
    }

    /// Moves a lone level-0 dataset out of its segment into a block of its own by copying
    /// its column chunks ([`kiln_storage::ranged::copy_dataset`]): with hundreds of
    /// services each sending a profile every few seconds, most level-0 groups are due by
    /// age with one dataset, and merging one input decodes and encodes it only to write
    /// the same columns. `None` when its chunks are not as the level's encoding writes
    /// them; it is merged then. The copy is read back (its series and profile rows) and
    /// must hold the job's tenant and service, as a merge's input must.
    async fn copy_lone(
        &self,
        input: &DatasetMeta,
        encoding: BlockEncoding,
    ) -> Result<Option<(Bytes, DatasetMeta)>, CompactorError> {
        let tail = self.block_tail(&input.object_key).await?;
        let (source, storage, runtime) = (
            input.clone(),
            self.storage.clone(),
            tokio::runtime::Handle::current(),
        );
        let (copied, fetched) = self
            .background(move || {
                let (partial, fetched) = fetch_dataset(&storage, &runtime, &tail, &source)?;
                let row_group = source.row_group as usize;
                let Some(block) =
                    kiln_storage::ranged::copy_dataset(&partial, row_group, encoding)?
                else {
                    return Ok((None, fetched));
                };
                let block = Bytes::from(block);
                let name = format!("{}#{}", source.object_key, source.row_group);
                let copy = kiln_storage::format::decode_dataset(&block, 0, Projection::INDEX)
                    .map_err(|source| CompactorError::Unreadable {
                        dataset: name.clone(),
                        source,
                    })?;
                holds(&copy, name, &source.tenant, &source.service)?;
                Ok((Some(block), fetched))
            })
            .await?;
        self.metrics.input_bytes.inc_by(fetched);
        self.tail_read(&input.object_key);
        Ok(copied.map(|block| {
            let id = ulid::Ulid::new().to_string();
            let meta = DatasetMeta {
                object_key: format!("blocks/{id}.parquet"),
                block_id: id,
                row_group: 0,
                ..input.clone()
            };
            (block, meta)
        }))
    }

    /// Uploads a job's block, named by `meta` (its one dataset), and swaps it for
    /// `inputs` (the job's, or those a streaming merge took) in one metastore transaction.
    async fn swap(
        &self,
        job: &Job,
        inputs: &[DatasetMeta],
        block: Bytes,
        meta: DatasetMeta,
        exports: Exports,
        clock: PassClock,
    ) -> Result<(), CompactorError> {
        let size_bytes = block.len() as u64;
        self.storage.put(&meta.object_key, block).await?;
        self.metrics.output_bytes.inc_by(size_bytes);
        crash_point("compaction-uploaded");
        self.metastore
            .replace_datasets(
                BlockMeta {
                    id: meta.block_id.clone(),
                    object_key: meta.object_key.clone(),
                    level: (job.key.level + 1).min(self.top_level()),
                    size_bytes,
                    created_at_ms: clock.now(),
                    deleted_at_ms: None,
                },
                vec![meta],
                inputs.iter().map(DatasetMeta::reference).collect(),
                exports,
            )
            .await?;
        crash_point("compaction-swapped");
        Ok(())
    }

    /// Expires, per tenant, the datasets that ended before the tenant's retention.
    async fn apply_retention(&self, now_ms: i64) -> Result<usize, CompactorError> {
        let mut expired = 0;
        for tenant in self.metastore.tenants().await? {
            let days = self
                .config
                .tenant_retention_days
                .get(&tenant)
                .copied()
                .unwrap_or(self.config.retention_days);
            if days == 0 {
                continue;
            }
            let cutoff_nanos = (now_ms - i64::from(days) * DAY_MS).saturating_mul(NANOS_PER_MS);
            expired += self
                .metastore
                .expire_datasets(&tenant, cutoff_nanos, now_ms)
                .await?;
        }
        self.metrics.expired_datasets.inc_by(expired as u64);
        Ok(expired)
    }

    /// Deletes tombstoned blocks' objects and unregistered objects, once past the grace
    /// period; the metastore row of a tombstoned block goes after its object.
    async fn delete_garbage(&self, now_ms: i64) -> Result<usize, CompactorError> {
        let cutoff = now_ms - self.config.grace_ms;
        let mut deleted = 0;
        for block in self.metastore.tombstoned_blocks(cutoff).await? {
            self.storage.delete(&block.object_key).await?;
            crash_point("garbage-object-deleted");
            self.metastore.delete_block(&block.id).await?;
            deleted += 1;
        }
        let last_sweep = self.last_sweep_ms.load(Ordering::Relaxed);
        if last_sweep != 0 && now_ms - last_sweep < self.config.orphan_age_ms {
            self.metrics.deleted_objects.inc_by(deleted as u64);
            return Ok(deleted);
        }
        self.last_sweep_ms.store(now_ms, Ordering::Relaxed);
        let orphan_cutoff = now_ms - self.config.orphan_age_ms;
        // Every block, once per `orphan_age_ms`: an object none of them names is an orphan.
        let blocks = self.metastore.list_blocks().await?;
        let registered: HashSet<&str> = blocks
            .iter()
            .map(|block| block.object_key.as_str())
            .collect();
        for prefix in OBJECT_PREFIXES {
            for (key, modified_ms) in self.storage.list(prefix).await? {
                if modified_ms <= orphan_cutoff && !registered.contains(key.as_str()) {
                    tracing::info!(%key, "deleting unregistered object");
                    self.storage.delete(&key).await?;
                    deleted += 1;
                }
            }
        }
        self.metrics.deleted_objects.inc_by(deleted as u64);
        Ok(deleted)
    }
}

/// What [`Compactor::stream_and_swap`] did.
enum Stream {
    /// `left`: the job's inputs that did not fit in this merge.
    Swapped { left: usize },
    /// The inputs do not fit two at a time, at the top level: nothing to merge.
    Unfit,
    /// For the in-memory merge.
    Declined,
}

/// How many of `datasets` each block holds.
fn per_block<'a>(datasets: impl IntoIterator<Item = &'a DatasetMeta>) -> HashMap<String, usize> {
    let mut per_block: HashMap<String, usize> = HashMap::new();
    for dataset in datasets {
        *per_block.entry(dataset.block_id.clone()).or_default() += 1;
    }
    per_block
}

/// Consecutive runs of `datasets` with at most `max_inputs` datasets and `max_profiles`
/// profiles each (a dataset over `max_profiles` alone is a run of its own).
fn chunks(datasets: &[DatasetMeta], max_inputs: usize, max_profiles: u64) -> Vec<&[DatasetMeta]> {
    let mut runs = Vec::new();
    let (mut start, mut profiles) = (0, 0u64);
    for (i, dataset) in datasets.iter().enumerate() {
        let full = i - start >= max_inputs.max(1)
            || (i > start && profiles + dataset.profile_count > max_profiles);
        if full {
            runs.push(&datasets[start..i]);
            (start, profiles) = (i, 0);
        }
        profiles += dataset.profile_count;
    }
    if start < datasets.len() {
        runs.push(&datasets[start..]);
    }
    runs
}

/// Points: `compaction-merged`, `compaction-uploaded`, `compaction-swapped`,
/// `garbage-object-deleted` (see [`kiln_runtime::crash::point`]).
fn crash_point(point: &str) {
    kiln_runtime::crash::point(point);
}

/// Fetches dataset `input`'s byte ranges (its block's tail at hand), on the compactor's
/// thread: the bytes and how many were read.
fn fetch_dataset(
    storage: &ObjectStorage,
    runtime: &tokio::runtime::Handle,
    tail: &BlockTail,
    input: &DatasetMeta,
) -> Result<(PartialBlock, u64), CompactorError> {
    let plan = kiln_storage::ranged::column_fetch(tail, input.row_group as usize, Projection::ALL)?;
    let bytes = storage.get_ranges_blocking(runtime, &input.object_key, &plan.ranges())?;
    let fetched = bytes.iter().map(|bytes| bytes.len() as u64).sum();
    Ok((plan.partial(&input.object_key, tail, bytes)?, fetched))
}

/// An input read for a job of `tenant`'s `service` must be theirs: a metastore row that
/// names the wrong dataset must not move another service's profiles.
fn holds(
    dataset: &Dataset,
    name: String,
    tenant: &str,
    service: &str,
) -> Result<(), CompactorError> {
    if dataset.tenant != tenant || dataset.service != service {
        return Err(CompactorError::Corrupt(
            name,
            format!(
                "holds {}/{}, not {tenant}/{service}",
                dataset.tenant, dataset.service
            ),
        ));
    }
    Ok(())
}

/// One compaction's merge, fed its inputs one at a time (each decoded from the byte
/// ranges fetched for it) and encoded at the end as a one-dataset block.
struct Merge {
    tenant: String,
    service: String,
    builder: DatasetBuilder,
    exports: Exports,
    rules: Option<(RuleHook, Vec<RuleRecord>)>,
}

impl Merge {
    fn new(tenant: &str, service: &str, rules: Option<(RuleHook, Vec<RuleRecord>)>) -> Self {
        Merge {
            tenant: tenant.to_string(),
            service: service.to_string(),
            builder: DatasetBuilder::new(tenant, service),
            exports: Exports::default(),
            rules,
        }
    }

    /// Decodes one input dataset, checks it belongs here, and merges it in.
    fn add(&mut self, input: &DatasetMeta, partial: PartialBlock) -> Result<(), CompactorError> {
        let name = format!("{}#{}", input.object_key, input.row_group);
        let dataset: Dataset = kiln_storage::ranged::decode_partial(
            partial,
            input.row_group as usize,
            Projection::ALL,
        )
        .map_err(|source| CompactorError::Unreadable {
            dataset: name.clone(),
            source,
        })?;
        dataset
            .check()
            .map_err(|err| CompactorError::Corrupt(name.clone(), err))?;
        holds(&dataset, name, &self.tenant, &self.service)?;
        if let Some((hook, rules)) = self.rules.as_ref().filter(|_| !input.rules_counted) {
            let found = hook(rules, &dataset);
            self.exports.targets = found.targets;
            self.exports.samples.extend(found.samples);
        }
        self.builder.add_dataset(&dataset);
        Ok(())
    }

    /// The merged block, its metastore entry, and the rules' exports.
    fn finish(
        self,
        (block_id, object_key): &(String, String),
        encoding: BlockEncoding,
    ) -> Result<(Vec<u8>, DatasetMeta, Exports), CompactorError> {
        let mut dataset = self.builder.finish();
        // Blocks live for the retention period and long-range queries read them whole:
        // each stores its series' flame graphs pre-merged (docs/FORMAT.md, stack_sums),
        // where that is much smaller than the samples.
        dataset.sum_stacks_if_smaller();
        let (profile_types, profile_count) = dataset.summary();
        let meta = DatasetMeta {
            block_id: block_id.clone(),
            object_key: object_key.clone(),
            tenant: self.tenant,
            service: self.service,
            row_group: 0,
            min_time_nanos: dataset.min_time_nanos,
            max_time_nanos: dataset.max_time_nanos,
            profile_types,
            profile_count,
            rules_counted: false,
        };
        let block = encode_block_as(std::slice::from_ref(&dataset), encoding)
            .map_err(CompactorError::Encode)?;
        Ok((block, meta, self.exports))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_profiles(counts: &[u64]) -> Vec<DatasetMeta> {
        counts
            .iter()
            .enumerate()
            .map(|(i, &profile_count)| DatasetMeta {
                block_id: format!("b{i}"),
                object_key: format!("blocks/b{i}.parquet"),
                tenant: "t".into(),
                service: "s".into(),
                row_group: 0,
                min_time_nanos: 0,
                max_time_nanos: 0,
                profile_types: Vec::new(),
                profile_count,
                rules_counted: false,
            })
            .collect()
    }

    #[test]
    fn merges_are_cut_by_inputs_and_by_profiles() {
        let sizes = |runs: Vec<&[DatasetMeta]>| -> Vec<Vec<u64>> {
            runs.iter()
                .map(|run| run.iter().map(|d| d.profile_count).collect())
                .collect()
        };
        let datasets = with_profiles(&[1700, 1700, 1700, 1700, 9000, 10, 10]);
        assert_eq!(
            sizes(chunks(&datasets, 200, 5000)),
            vec![vec![1700, 1700], vec![1700, 1700], vec![9000], vec![10, 10]]
        );
        assert_eq!(
            sizes(chunks(&datasets, 3, u64::MAX)),
            vec![vec![1700, 1700, 1700], vec![1700, 9000, 10], vec![10]]
        );
        assert!(chunks(&[], 3, 10).is_empty());
    }
}
