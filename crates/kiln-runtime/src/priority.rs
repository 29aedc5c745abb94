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

/// CPU seconds charged to one role of the server (compaction) wherever its work runs: the
/// polls of its futures on the async workers ([`CpuAccount::scope`]), and the blocking work
/// those futures hand to other threads through [`charge_blocking`] (a metastore
/// transaction). Measuring only a role's own thread missed most of it: compaction's
/// SQLite commits, uploads and hand-offs ran on threads it shares with ingest, and a
/// benchmark counted less than half of compaction's cost (docs/benchmarks.md).
#[derive(Clone)]
pub struct CpuAccount {
    record: std::sync::Arc<dyn Fn(f64) + Send + Sync>,
}

impl std::fmt::Debug for CpuAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CpuAccount")
    }
}

tokio::task_local! {
    static ACCOUNT: CpuAccount;
}

impl CpuAccount {
    /// An account that hands each charge, in CPU seconds, to `record` (a metric's counter).
    pub fn new(record: impl Fn(f64) + Send + Sync + 'static) -> Self {
        CpuAccount {
            record: std::sync::Arc::new(record),
        }
    }

    /// Adds `seconds` of CPU used elsewhere (a thread of the role's own).
    pub fn charge(&self, seconds: f64) {
        if seconds > 0.0 {
            (self.record)(seconds);
        }
    }

    /// Runs `future` with this account as its task's: the CPU of each of its polls, and
    /// of the blocking work it hands off through [`charge_blocking`], is charged here.
    pub async fn scope<F: std::future::Future>(&self, future: F) -> F::Output {
        let account = self.clone();
        Metered {
            inner: Box::pin(ACCOUNT.scope(self.clone(), future)),
            account,
        }
        .await
    }
}

/// A future whose polls are timed in the polling thread's CPU clock.
struct Metered<F> {
    inner: std::pin::Pin<Box<F>>,
    account: CpuAccount,
}

impl<F: std::future::Future> std::future::Future for Metered<F> {
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let (polled, used) = with_thread_cpu(|| self.inner.as_mut().poll(context));
        self.account.charge(used);
        polled
    }
}

/// The calling task's account, if it runs inside [`CpuAccount::scope`]: to be taken
/// before work is handed to another thread, and given to [`charge_blocking`] there.
pub fn current_account() -> Option<CpuAccount> {
    ACCOUNT.try_with(CpuAccount::clone).ok()
}

/// Runs `work` on the calling thread, charging its CPU to `account` when there is one.
pub fn charge_blocking<T>(account: Option<&CpuAccount>, work: impl FnOnce() -> T) -> T {
    let Some(account) = account else {
        return work();
    };
    let (done, used) = with_thread_cpu(work);
    account.charge(used);
    done
}

/// Runs `work` on the calling thread, with the CPU seconds it used there.
pub fn with_thread_cpu<T>(work: impl FnOnce() -> T) -> (T, f64) {
    let before = thread_cpu_seconds();
    let done = work();
    (done, thread_cpu_seconds() - before)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    /// Spins for `seconds` of this thread's CPU.
    fn burn(seconds: f64) {
        let until = thread_cpu_seconds() + seconds;
        while thread_cpu_seconds() < until {
            std::hint::spin_loop();
        }
    }

    fn account() -> (CpuAccount, Arc<AtomicU64>) {
        let micros = Arc::new(AtomicU64::new(0));
        let counted = micros.clone();
        let account = CpuAccount::new(move |seconds| {
            counted.fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
        });
        (account, micros)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_scope_is_charged_its_polls_and_the_blocking_work_it_hands_off() {
        let (account, micros) = account();
        account
            .scope(async {
                burn(0.02);
                let handed = current_account();
                assert!(handed.is_some(), "the scope's account is the task's");
                tokio::task::spawn_blocking(move || {
                    charge_blocking(handed.as_ref(), || burn(0.05))
                })
                .await
                .expect("blocking work");
                tokio::task::yield_now().await;
                burn(0.02);
            })
            .await;
        let charged = micros.load(Ordering::Relaxed);
        assert!(
            (90_000..200_000).contains(&charged),
            "charged {charged} µs for 90 ms of work"
        );
        // Outside a scope nothing is charged, and blocking work has no account to take.
        assert!(current_account().is_none());
        burn(0.02);
        charge_blocking(current_account().as_ref(), || burn(0.02));
        assert_eq!(micros.load(Ordering::Relaxed), charged);
    }
}
