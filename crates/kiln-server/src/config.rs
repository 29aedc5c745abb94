//! The edge's own settings (`http:` in the node's config): what a client may hold.

use serde::{Deserialize, Serialize};

/// Bounds on what a client can hold: a connection that never finishes its request would
/// otherwise keep a socket, a file descriptor and a task forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// A request's headers must arrive within this long (HTTP/1.1), in milliseconds.
    pub header_read_timeout_ms: u64,
    /// Its whole body within this long after the headers, in milliseconds. Long enough
    /// for the largest body at a slow client's pace; a 16 MiB profile at 1 Mbit/s takes
    /// about two minutes.
    pub body_read_timeout_ms: u64,
    /// Longest a request body may go without a byte arriving, in milliseconds; then the
    /// request is answered 408 and its connection closed. A client that declares a body
    /// and sends nothing holds no ingest budget meanwhile (budget is taken as bytes
    /// arrive), but it holds a connection and a task.
    pub body_idle_timeout_ms: u64,
    /// Connections open at once; one more is answered 429 and closed, so that stalled
    /// clients cannot exhaust the process's file descriptors.
    pub max_connections: usize,
    /// Bytes of write requests held at once, all tenants together (each tenant also has
    /// `limits.max_inflight_bytes`); past it, 429 with `Retry-After`.
    pub max_inflight_bytes: usize,
    /// Longest a write request may expect to wait for a core to parse it, in
    /// milliseconds; one that would wait longer is refused at once with 429, so that an
    /// overloaded server answers quickly instead of building a backlog. A second keeps
    /// the p99 of accepted writes under 2 s at 10× overload (`kiln bench goodput`) for
    /// about 6 % fewer stored profiles than 2 s at closed-loop saturation.
    pub max_parse_wait_ms: u64,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 180_000,
            body_idle_timeout_ms: 10_000,
            max_connections: 4096,
            max_inflight_bytes: 64 << 20,
            max_parse_wait_ms: kiln_ingest::cpu::DEFAULT_MAX_WAIT_MS,
        }
    }
}
