//! CPU priority of background work.
//!
//! Parsing, segment building and compaction merges can take every core. Requests still
//! have to be answered meanwhile (refusals, `/ready`, acknowledgements), and they run on
//! the async workers: so the threads doing that CPU work lower their own priority (nice
//! +5, per thread on Linux), and when the cores are saturated the scheduler runs the
//! workers first. A thread's priority cannot be raised back without privileges, so it is
//! lowered once and stays low; the blocking pool's threads only do background work.

use std::cell::Cell;
use std::sync::LazyLock;

static CORES: LazyLock<usize> =
    LazyLock::new(|| std::thread::available_parallelism().map_or(2, |cores| cores.get()));

/// The cores this process may use, read once: `available_parallelism` reads the cgroup's
/// CPU quota from `/sys` on every call, and a flush asked at 2 % of a quiet server's CPU.
pub fn cores() -> usize {
    *CORES
}

thread_local! {
    static LOWERED: Cell<bool> = const { Cell::new(false) };
}

/// Lowers the calling thread's priority, once.
pub fn background_thread() {
    if LOWERED.with(|lowered| lowered.replace(true)) {
        return;
    }
    #[cfg(target_os = "linux")]
    // SAFETY: gettid and setpriority on the calling thread touch no memory of ours.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 5);
    }
}

/// CPU seconds the calling thread has used so far: background work that runs on a thread
/// of its own (a compaction merge) is measured with it, so that a benchmark can tell its
/// cost from the request path's when both share one process.
pub fn thread_cpu_seconds() -> f64 {
    #[cfg(target_os = "linux")]
    {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes only the timespec it is given.
        if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) } == 0 {
            return now.tv_sec as f64 + now.tv_nsec as f64 / 1e9;
        }
    }
    0.0
}

static RELEASE_MEMORY: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Installs how to hand freed memory back to the system: the binary owns the allocator,
/// the libraries that free large amounts at once only know when.
pub fn set_memory_release(release: fn()) {
    let _ = RELEASE_MEMORY.set(release);
}

/// Called after a large background job (a compaction) freed its memory: an allocator
/// keeps freed pages for a while before returning them, and without this the peak RSS
/// under load was a compaction's transient memory on top of ingest's.
pub fn release_memory() {
    if let Some(release) = RELEASE_MEMORY.get() {
        release();
    }
}
