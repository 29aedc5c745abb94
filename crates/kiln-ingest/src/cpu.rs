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
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use thiserror::Error;
use tokio::sync::Semaphore;

use crate::IngestError;

static PARSE_PERMITS: LazyLock<Semaphore> =
    LazyLock::new(|| Semaphore::new(kiln_model::priority::cores()));
/// Requests waiting for a permit now.
static WAITING: AtomicUsize = AtomicUsize::new(0);
/// Recent parse time, in nanoseconds (an exponentially weighted mean, weight 1/16).
static PARSE_NANOS: AtomicU64 = AtomicU64::new(1_000_000);
static MAX_WAIT_MS: AtomicU64 = AtomicU64::new(2_000);

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

/// Runs a CPU-bound parse of a client's request on the blocking pool once a core is
/// free for it, or refuses when that would take longer than the maximum wait.
pub async fn run_parser<T: Send + 'static>(
    parse: impl FnOnce() -> Result<T, IngestError> + Send + 'static,
) -> Result<T, IngestError> {
    let max = Duration::from_millis(MAX_WAIT_MS.load(Ordering::Relaxed));
    let waiting = WAITING.load(Ordering::Relaxed);
    let expected = Duration::from_nanos(
        PARSE_NANOS.load(Ordering::Relaxed) * (waiting as u64 + 1)
            / kiln_model::priority::cores() as u64,
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

/// Why work handed to the write path's threads did not answer.
#[derive(Debug, Error)]
pub enum WorkerError {
    #[error("the task panicked")]
    Panicked,
    #[error("the write path's threads are gone")]
    Stopped,
}

type Task = Box<dyn FnOnce() + Send>;

/// The write path's threads: one per core, started on first use, for parsing, staging
/// and building segments.
///
/// Not tokio's blocking pool: that one starts a thread whenever none is idle and keeps it
/// for ten seconds, so under load this work spread over 30 to 40 threads. The allocator
/// keeps a thread's freed pages until that thread allocates again, and each of those
/// threads had freed a few decoded profiles and then sat idle: a 1,000-client server held
/// 200 to 300 MiB that way (docs/benchmarks.md, "Memory of the write path"). A few
/// threads that never idle long reuse their own freed memory. The queue is first in,
/// first out, and its tasks are whole parses and builds (milliseconds), so a channel
/// behind a mutex serves it; a work-stealing pool (rayon) is made for finer tasks and
/// would be one more dependency for nothing here.
static POOL: LazyLock<Option<std::sync::mpsc::Sender<Task>>> = LazyLock::new(start_pool);

fn start_pool() -> Option<std::sync::mpsc::Sender<Task>> {
    let (sender, receiver) = std::sync::mpsc::channel::<Task>();
    let receiver = Arc::new(Mutex::new(receiver));
    let mut started = 0;
    for index in 0..kiln_model::priority::cores() {
        let receiver = receiver.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("kiln-write-{index}"))
            .spawn(move || {
                kiln_model::priority::background_thread();
                loop {
                    // The guard is dropped at the end of this statement, before the task runs.
                    let task = receiver
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .recv();
                    match task {
                        Ok(task) => task(),
                        Err(_) => return,
                    }
                }
            });
        match spawned {
            Ok(_) => started += 1,
            Err(err) => tracing::warn!(error = %err, "cannot start a write path thread"),
        }
    }
    (started > 0).then_some(sender)
}

/// Hands `work` to the write path's threads at once; await the result when needed.
pub fn spawn<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> impl std::future::Future<Output = Result<T, WorkerError>> {
    let (sender, receiver) = tokio::sync::oneshot::channel();
    let task: Task = Box::new(move || {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
        let _ = sender.send(result);
    });
    let queued = match &*POOL {
        Some(pool) => pool.send(task).is_ok(),
        None => false,
    };
    async move {
        if !queued {
            return Err(WorkerError::Stopped);
        }
        match receiver.await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(_)) => Err(WorkerError::Panicked),
            Err(_) => Err(WorkerError::Stopped),
        }
    }
}

async fn timed<T: Send + 'static>(
    parse: impl FnOnce() -> Result<T, IngestError> + Send + 'static,
) -> Result<T, IngestError> {
    let started = Instant::now();
    let result = spawn(parse).await?;
    let nanos = started.elapsed().as_nanos().min(u64::MAX as u128) as u64;
    // Racing updates lose a sample now and then; the mean stays a mean.
    let mean = PARSE_NANOS.load(Ordering::Relaxed);
    PARSE_NANOS.store(mean - mean / 16 + nanos / 16, Ordering::Relaxed);
    result
}
