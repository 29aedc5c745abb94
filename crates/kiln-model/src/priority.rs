//! CPU priority of background work.
//!
//! Parsing, segment building and compaction merges can take every core. Requests still
//! have to be answered meanwhile (refusals, `/ready`, acknowledgements), and they run on
//! the async workers: so the threads doing that CPU work lower their own priority (nice
//! +5, per thread on Linux), and when the cores are saturated the scheduler runs the
//! workers first. A thread's priority cannot be raised back without privileges, so it is
//! lowered once and stays low; the blocking pool's threads only do background work.

use std::cell::Cell;

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
