//! Real backing services for Kiln's tests: a PostgreSQL server (Debian's binaries) and an
//! S3-compatible server (`moto[server]` from PyPI), each started once per test process on
//! 127.0.0.1 and stopped when the process exits.
//!
//! Each test takes a fresh database or bucket from the shared server, so tests stay
//! independent while paying the server start-up once. A server is stopped by an `atexit`
//! hook when the test binary ends normally, and by the kernel's parent-death signal when
//! it is killed; the process that owns it is a thread that never ends, because Linux sends
//! that signal when the *thread* that forked the child exits.
//!
//! When a server cannot be started (the package is missing), [`postgres`] and [`s3`]
//! return an error saying why, and the calling test prints `skipped: …` and returns.

pub mod postgres;
mod process;
pub mod s3;
pub mod tls;

/// A free TCP port on loopback (the listener is closed before it is used; good enough
/// for tests that start their own servers).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free loopback port")
}

pub use postgres::postgres;
pub use s3::s3;
