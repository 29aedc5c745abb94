//! Where request parsing runs: off the async workers, and at most one parse per core.
//!
//! Parsing (inflate, decode, validate) is pure CPU. Handing each request to its own
//! blocking thread let a burst of clients start hundreds of parses at once: no faster on
//! two cores, but 225 threads each holding its own allocator heap and decoded profiles
//! (3 GB resident after 40 s of `kiln bench ingest` with 256 clients). With one permit per
//! core, a waiting request holds only its compressed body, and waiting in this queue is
//! the backpressure clients feel.

use std::sync::LazyLock;

use tokio::sync::Semaphore;

use crate::IngestError;

static PARSE_PERMITS: LazyLock<Semaphore> = LazyLock::new(|| {
    let cores = std::thread::available_parallelism().map_or(2, |cores| cores.get());
    Semaphore::new(cores)
});

/// Runs a CPU-bound parse on the blocking pool once a core is free for it.
pub async fn run_parser<T: Send + 'static>(
    parse: impl FnOnce() -> Result<T, IngestError> + Send + 'static,
) -> Result<T, IngestError> {
    let _permit = PARSE_PERMITS
        .acquire()
        .await
        .map_err(|_| IngestError::ShuttingDown)?;
    tokio::task::spawn_blocking(parse)
        .await
        .map_err(IngestError::Task)?
}
