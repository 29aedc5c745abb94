//! Real backing services for Kiln's tests: a PostgreSQL server (Debian's binaries) and an
//! S3-compatible server (`moto[server]` from PyPI), each started once per test process on
//! 127.0.0.1 and stopped when the process exits; and the helpers every test binary shares
//! (`kiln` children from kiln-child, fixtures, polling).
//!
//! Each test takes a fresh database or bucket from the shared server, so tests stay
//! independent while paying the server start-up once. A server is stopped by an `atexit`
//! hook when the test binary ends normally, and by the kernel's parent-death signal when
//! it is killed; the process that owns it is a thread that never ends, because Linux sends
//! that signal when the *thread* that forked the child exits.
//!
//! When a server cannot be started (the package is missing), [`postgres`] and [`s3`]
//! return an error saying why, and the calling test prints `skipped: …` and returns.

pub mod kubernetes;
pub mod postgres;
mod process;
pub mod s3;
pub mod tls;

/// `kiln` child processes, as the benches start them too.
pub use kiln_child::{free_port, KilnChild, KilnCommand, Log};

/// A file of the workspace's `testdata/`.
pub fn fixture(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|err| panic!("fixture {}: {err}", path.display()))
}

/// Polls `done` every 50 ms until it holds; fails the test after `timeout`, naming `what`
/// was awaited.
pub fn wait_until(what: &str, timeout: std::time::Duration, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + timeout;
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

pub use postgres::postgres;
pub use s3::s3;
