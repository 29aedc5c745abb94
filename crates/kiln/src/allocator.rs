//! The process's allocator and how it hands memory back to the system.
//!
//! mimalloc (v2) returns freed pages to the kernel after a delay, 10 ms by default. That
//! suits a busy server, whose memory must stay flat under load: freed request and
//! compaction buffers go back quickly. It does not suit a quiet one. With many services at
//! a low rate, a flush every few tens of milliseconds frees its buffers, the pages go back,
//! and the next flush faults them in again, zeroed: `perf` put 11 % of such a server's CPU
//! in page faults and `madvise`. So the delay follows the process's size: while it is
//! small, freed pages are kept for a quarter of a second and reused; once it is large, they
//! go back after 10 ms as before. Measured in docs/benchmarks.md ("Memory and the
//! allocator"). A user's own `MIMALLOC_PURGE_DELAY` wins: the delay is then left alone.

use std::ffi::c_long;
use std::time::Duration;

/// Ingest allocates many small objects per profile on several threads; mimalloc measured
/// faster than the system allocator there. Its v2 line, not v3: v3 held freed pages long
/// enough that the server's peak RSS was 1.2–1.3 GiB where v2's was 0.8 GiB, at the same
/// CPU with compaction on (docs/benchmarks.md, "Memory and the allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

extern "C" {
    fn mi_collect(force: bool);
    fn mi_option_get(option: std::ffi::c_int) -> c_long;
    fn mi_option_set(option: std::ffi::c_int, value: c_long);
}

/// `mi_option_purge_delay` in mimalloc v2's `mi_option_e` (include/mimalloc.h); the
/// `libmimalloc-sys` bindings do not name it. A test checks it against the environment
/// variable mimalloc reads for it.
const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;

/// mimalloc's own delay, kept while the process is large.
const EAGER_MS: c_long = 10;
/// The delay while the process is small: longer than the gap between flushes at a low rate,
/// so a flush reuses the last one's pages. 100 ms and 1 s measured alike; a quarter second
/// keeps the retained memory small.
const LAZY_MS: c_long = 250;
/// At or above this resident size, freed memory goes back eagerly.
const LARGE_BYTES: u64 = 384 << 20;
/// At or below this one, it is kept; in between the delay stays as it was, so that a
/// process near one bound does not switch at every check.
const SMALL_BYTES: u64 = 256 << 20;

/// Transparent huge pages cost more than they give here: the allocator returns freed
/// memory and faults it back in as ingest load moves, and with THP every fault zeroes 2 MiB.
/// Under `kiln bench ingest` a third of the server's CPU went to `clear_page_erms` until
/// THP was turned off for the process (docs/benchmarks.md). Children inherit the setting.
#[cfg(target_os = "linux")]
pub fn disable_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes plain integer arguments and touches no memory of ours.
    let result = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if result != 0 {
        tracing::debug!("could not disable transparent huge pages");
    }
}

#[cfg(not(target_os = "linux"))]
pub fn disable_transparent_huge_pages() {}

/// A compaction frees tens of MB at once on a background thread: returning them right
/// away keeps that memory from stacking on top of ingest's until the allocator's own
/// purge gets round to it (docs/benchmarks.md, "Memory and the allocator").
pub fn release_memory() {
    // SAFETY: mi_collect takes a flag and only walks the allocator's own structures.
    unsafe { mi_collect(true) }
}

/// The purge delay for a process of `resident` bytes whose delay is `current` ms.
fn purge_delay_ms(resident: u64, current: c_long) -> c_long {
    if resident >= LARGE_BYTES {
        EAGER_MS
    } else if resident <= SMALL_BYTES {
        LAZY_MS
    } else {
        current
    }
}

fn purge_delay() -> c_long {
    // SAFETY: mi_option_get reads one of the allocator's option slots by index.
    unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) }
}

fn set_purge_delay(ms: c_long) {
    // SAFETY: mi_option_set stores a value in one of the allocator's option slots; mimalloc
    // reads the purge delay each time it schedules a purge, so the change takes effect.
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, ms) }
}

/// The process's resident set, from `/proc/self/statm`.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

/// Starts the thread that sets the purge delay from the process's size, twice a second,
/// for the long-running commands (server, scrape, agent). Not where the user set
/// `MIMALLOC_PURGE_DELAY`, nor where the resident size cannot be read.
pub fn follow_process_size() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() || resident_bytes().is_none() {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("allocator".into())
        .spawn(|| loop {
            if let Some(resident) = resident_bytes() {
                let current = purge_delay();
                let wanted = purge_delay_ms(resident, current);
                if wanted != current {
                    set_purge_delay(wanted);
                    if wanted < current {
                        // Pages already freed keep the delay they were scheduled with.
                        release_memory();
                    }
                    tracing::debug!(resident, purge_delay_ms = wanted, "allocator purge delay");
                }
            }
            std::thread::sleep(Duration::from_millis(500));
        });
    if let Err(err) = spawned {
        tracing::warn!(error = %err, "cannot start the allocator thread; freed memory is returned after mimalloc's default delay");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_follows_the_process_size_with_a_gap_between_the_bounds() {
        assert_eq!(purge_delay_ms(100 << 20, EAGER_MS), LAZY_MS);
        assert_eq!(purge_delay_ms(SMALL_BYTES, EAGER_MS), LAZY_MS);
        assert_eq!(purge_delay_ms(LARGE_BYTES, LAZY_MS), EAGER_MS);
        assert_eq!(purge_delay_ms(2 << 30, LAZY_MS), EAGER_MS);
        // In between, whichever it was.
        assert_eq!(purge_delay_ms(300 << 20, LAZY_MS), LAZY_MS);
        assert_eq!(purge_delay_ms(300 << 20, EAGER_MS), EAGER_MS);
    }

    /// The option index is mimalloc's, not ours: a child started with
    /// `MIMALLOC_PURGE_DELAY` must read that value at the index, and setting it must read
    /// back. Both run in a child, so this process's allocator is left as it was.
    #[test]
    fn the_purge_delay_index_is_the_one_mimalloc_reads_from_its_environment() {
        if let Some(expected) = std::env::var_os("KILN_TEST_PURGE_DELAY_CHILD") {
            let expected: c_long = expected.to_string_lossy().parse().expect("a number");
            assert_eq!(purge_delay(), expected);
            set_purge_delay(LAZY_MS);
            assert_eq!(purge_delay(), LAZY_MS);
            return;
        }
        let status = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "allocator::tests::the_purge_delay_index_is_the_one_mimalloc_reads_from_its_environment",
                "--nocapture",
            ])
            .env("KILN_TEST_PURGE_DELAY_CHILD", "1234")
            .env("MIMALLOC_PURGE_DELAY", "1234")
            .status()
            .expect("the test binary runs");
        assert!(status.success(), "the child's check failed: {status}");
    }

    #[test]
    fn the_resident_size_is_read() {
        let resident = resident_bytes().expect("/proc/self/statm");
        assert!(resident > 1 << 20, "{resident} bytes resident");
    }
}
