//! Where the write path's CPU work runs: parsing, staging and segment building, on one
//! thread per core off the async workers ([`spawn`]), and at most one parse per core.
//!
//! Parsing (inflate, decode, validate) is pure CPU. Handing each request to its own
//! blocking thread let a burst of clients start hundreds of parses at once: no faster on
//! two cores, but 225 threads each holding its own allocator heap and decoded profiles
//! (3 GB resident after 40 s of `kiln bench ingest` with 256 clients). With one permit per
//! core, a waiting request holds only its compressed body.
//!
//! The queue for those permits is bounded by time, not length: a request that would wait
//! longer than the configured maximum ([`set_max_wait`]) for a core is refused at once
//! (429), judged from how many are waiting and how long parses take lately. Under
//! overload the server thus answers every request quickly, 200 or 429, and the backlog
//! (and with it memory and latency) stops growing; the clients retry. Internal writers
//! that pace themselves (scrapes, the in-process agent) wait instead
//! ([`run_parser_waiting`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use kiln_runtime::worker::Pool;
use tokio::sync::Semaphore;

use crate::IngestError;

static PARSE_PERMITS: LazyLock<Semaphore> =
    LazyLock::new(|| Semaphore::new(kiln_runtime::priority::cores()));
/// Requests waiting for a permit now.
static WAITING: AtomicUsize = AtomicUsize::new(0);
/// Recent parse time, in nanoseconds (an exponentially weighted mean, weight 1/16).
static PARSE_NANOS: AtomicU64 = AtomicU64::new(1_000_000);
/// `http.max_parse_wait_ms` when the configuration does not say: a second keeps the p99
/// of accepted writes under 2 s at 10x overload (docs/benchmarks.md, "Goodput under
/// overload").
pub const DEFAULT_MAX_WAIT_MS: u64 = 1_000;
static MAX_WAIT_MS: AtomicU64 = AtomicU64::new(DEFAULT_MAX_WAIT_MS);

/// The longest a request may wait for a core (`http.max_parse_wait_ms`).
pub fn set_max_wait(wait: Duration) {
    MAX_WAIT_MS.store(wait.as_millis().max(1) as u64, Ordering::Relaxed);
}

struct Waiting;

impl Waiting {
    fn enter() -> Self {
        WAITING.fetch_add(1, Ordering::Relaxed);
        Waiting
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        WAITING.fetch_sub(1, Ordering::Relaxed);
    }
}

fn busy(waiting: usize, expected: Duration, max: Duration) -> IngestError {
    IngestError::Overloaded(format!(
        "server busy: {waiting} requests are waiting to be parsed, about {} ms, over the limit of {} ms (http.max_parse_wait_ms); retry shortly",
        expected.as_millis(),
        max.as_millis()
    ))
}

/// Runs a CPU-bound parse of a client's request on the write path's threads once a core is
/// free for it, or refuses when that would take longer than the maximum wait.
pub async fn run_parser<T: Send + 'static>(
    parse: impl FnOnce() -> Result<T, IngestError> + Send + 'static,
) -> Result<T, IngestError> {
    let max = Duration::from_millis(MAX_WAIT_MS.load(Ordering::Relaxed));
    let waiting = WAITING.load(Ordering::Relaxed);
    let expected = Duration::from_nanos(
        PARSE_NANOS.load(Ordering::Relaxed) * (waiting as u64 + 1)
            / kiln_runtime::priority::cores() as u64,
    );
    if waiting > 0 && expected > max {
        return Err(busy(waiting, expected, max));
    }
    let permit = {
        let _waiting = Waiting::enter();
        match tokio::time::timeout(max, PARSE_PERMITS.acquire()).await {
            Ok(permit) => permit.map_err(|_| IngestError::ShuttingDown)?,
            Err(_) => return Err(busy(WAITING.load(Ordering::Relaxed), max, max)),
        }
    };
    let result = timed(parse).await;
    drop(permit);
    result
}

/// [`run_parser`] for writers that pace themselves: waits for a core however long.
pub async fn run_parser_waiting<T: Send + 'static>(
    parse: impl FnOnce() -> Result<T, IngestError> + Send + 'static,
) -> Result<T, IngestError> {
    let _permit = PARSE_PERMITS
        .acquire()
        .await
        .map_err(|_| IngestError::ShuttingDown)?;
    timed(parse).await
}

pub use kiln_runtime::worker::WorkerError;

/// The write path's threads: one per core, started on first use, for parsing, staging
/// and building segments ([`kiln_runtime::worker`] says why threads of its own).
static POOL: LazyLock<Pool> =
    LazyLock::new(|| Pool::start("kiln-write", kiln_runtime::priority::cores()));

/// Hands `work` to the write path's threads at once; await the result when needed.
pub fn spawn<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> impl std::future::Future<Output = Result<T, WorkerError>> {
    POOL.spawn(work)
}

thread_local! {
    /// Time the running job spent on work other than parsing ([`not_parsing`]).
    static NOT_PARSING: std::cell::Cell<Duration> = const { std::cell::Cell::new(Duration::ZERO) };
}

/// Leaves `spent` out of the running parse's time, which admission judges the wait for a
/// core by: a write that flushes itself when it is alone (`Flusher::flush_alone`) holds
/// its permit through a segment write that a write under load never does.
pub fn not_parsing(spent: Duration) {
    NOT_PARSING.with(|cell| cell.set(cell.get() + spent));
}

async fn timed<T: Send + 'static>(
    parse: impl FnOnce() -> Result<T, IngestError> + Send + 'static,
) -> Result<T, IngestError> {
    let started = Instant::now();
    let (result, not_parsing) = spawn(move || {
        NOT_PARSING.with(|cell| cell.set(Duration::ZERO));
        let result = parse();
        (result, NOT_PARSING.with(|cell| cell.take()))
    })
    .await?;
    let nanos = started
        .elapsed()
        .saturating_sub(not_parsing)
        .as_nanos()
        .min(u64::MAX as u128) as u64;
    // Racing updates lose a sample now and then; the mean stays a mean.
    let mean = PARSE_NANOS.load(Ordering::Relaxed);
    PARSE_NANOS.store(mean - mean / 16 + nanos / 16, Ordering::Relaxed);
    result
}
