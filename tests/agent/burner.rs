//! Burns argv[1] seconds of its own CPU time (default 10), however busy the machine is:
//! 70% of it in `kiln_hot_a`, 30% in `kiln_hot_b`. The Rust twin of burner.c: the same
//! short loop in both, one of them picked at random 7 times in 10, so that no period falls
//! in step with the sampling or the scheduler's slices (a 7-then-3 alternation drew 75.5 %
//! in CI).
//!
//! Built by the agent tests as a release build, which keeps no frame pointers: the agent
//! must unwind it through its DWARF call-frame information. No crates, so plain `rustc`
//! builds it; the process CPU clock comes from libc, which std links anyway.

use std::hint::black_box;

#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}

extern "C" {
    fn clock_gettime(clock: i32, time: *mut Timespec) -> i32;
}

const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;

fn cpu_seconds() -> f64 {
    let mut time = Timespec { sec: 0, nsec: 0 };
    // SAFETY: clock_gettime writes one timespec, which `time` is.
    unsafe { clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &mut time) };
    time.sec as f64 + time.nsec as f64 / 1e9
}

fn step(x: u64) -> u64 {
    x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407)
}

#[inline(never)]
fn kiln_hot_a() -> u64 {
    let mut x = 1;
    for _ in 0..700_000 {
        x = black_box(step(x));
    }
    x
}

/// One step more than `kiln_hot_a`: rustc merges identical functions into one symbol.
#[inline(never)]
fn kiln_hot_b() -> u64 {
    let mut x = 1;
    for _ in 0..700_001 {
        x = black_box(step(x));
    }
    x
}

fn main() {
    let seconds: f64 = std::env::args()
        .nth(1)
        .and_then(|arg| arg.parse().ok())
        .unwrap_or(10.0);
    let start = cpu_seconds();
    let mut sum = 0u64;
    // A 64-bit LCG's high bits, seeded by the pid: random enough to break any period.
    let mut seed = u64::from(std::process::id());
    while cpu_seconds() - start < seconds {
        seed = step(seed);
        sum = sum.wrapping_add(if (seed >> 33) % 10 < 7 {
            kiln_hot_a()
        } else {
            kiln_hot_b()
        });
    }
    black_box(sum);
}
