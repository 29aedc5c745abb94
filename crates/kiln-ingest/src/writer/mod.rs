//! Group commit: requests stage their parsed profiles into the open batch, a flusher
//! writes the batch as one block object with one dataset per (tenant, service), registers
//! the block in the metastore in one transaction, and only then acknowledges every request
//! in the batch.
//!
//! A batch (a `Generation`) holds one `DatasetBuilder` per (tenant, service), and a
//! request interns its profiles into them as soon as they are parsed, on the write path's
//! threads (`Ingester::stage`, [`crate::cpu`]); the decoded profile is dropped there. So
//! what waits for a flush is the interned form, where a service's symbols are stored once
//! however many of its profiles arrived (at 1,000 clients 20–90 MiB where the decoded
//! profiles reached 384 MiB: docs/benchmarks.md, "Memory of the write path"), and the
//! flush is left with finishing, encoding and writing. A service's builder outlives its
//! batch: the flush takes only the dataset of its profiles, and the next batch of that
//! service starts from the builder's symbol tables ([`warm`]). A flush swaps the open generation for a fresh one
//! under a lock that every staging request holds for its whole add, so each request lands
//! whole in exactly one generation and waits for that one's result.
//!
//! The batch is adaptive. It is flushed as soon as it reaches `flush_bytes`. Otherwise,
//! while no flush is running, it is flushed when no other write is on its way (no request
//! admitted by [`Ingester::check_room`] is still being read or parsed), or once it has
//! waited as long as the last flush took; and at the latest `flush_interval` after its
//! first profile. An idle server so acks in one segment write, not after a fixed delay.
//! Under load, what arrives while one flush runs forms the next batch, so batches grow
//! with the load and the number of blocks does not: this is the classic group commit of
//! databases, with one flush of small batches at a time (batches of `flush_bytes` may
//! overlap, up to `max_concurrent_flushes`). A write that is alone, when the flusher
//! would flush it at once, flushes itself on the thread that parsed it
//! (`Flusher::flush_alone`): the same decision, without the flusher's round trips. With
//! `adaptive: false` every batch waits the whole interval (fewest blocks, slowest acks). `min_gap` (`flush_min_gap_ms`, default
//! none) holds an adaptive flush until that long after the previous one started: a fleet
//! of services each sending rarely then shares segments, so level 0 holds fewer, larger
//! datasets for compaction and fresh queries, for up to that much more ack latency. Off by
//! default because closed-loop clients pay it on every write (docs/benchmarks.md). While
//! compaction is behind, the gap grows with its backlog ([`crate::backoff`]).
//!
//! A failure anywhere fails every request of that batch with a 5xx; since the metastore
//! registration is the last step, a failed batch is never visible to readers.
//!
//! With a write-ahead log ([`crate::wal`], a node running every role on a local store and
//! SQLite: [`logs_writes`]), no write waits for a segment: each is appended to its
//! batch's log and acknowledged once that is on disk, and the batch is flushed per
//! `segment_interval` (or size, memory, or a read that asks; `Flusher::gather_logged`).
//! Reads call
//! [`Syncer::sync`] first, which flushes the open batch. A logged batch whose flush fails
//! is written again from its log until that succeeds.
//!
//! The module's files, one concern each, import in one direction:
//! [`metrics`] (the counters) and [`warm`] (the builder pool) stand alone; [`staging`]
//! holds the open batch; [`sink`] is the one place a segment is stored and registered,
//! its route chosen once from the backends (`SegmentSink`); [`recovery`] writes the
//! logs an earlier run left through the sink; [`flusher`] decides when a batch goes;
//! [`ingester`] is the handle requests write through.

mod flusher;
mod ingester;
mod metrics;
mod recovery;
mod sink;
mod staging;
mod warm;

use std::time::Duration;

pub use ingester::{Arrival, Ingester, Syncer, Written};
pub use metrics::{ReasonLabel, WriterMetrics};
pub use sink::{dataset_meta, logs_writes, RuleHook};

#[derive(Debug, Clone, Copy)]
pub struct IngesterConfig {
    /// Longest a profile waits for its flush; also the shortest time between flushes
    /// under light load.
    pub flush_interval: Duration,
    /// Flush before the interval when nothing else is on its way (see the module doc).
    pub adaptive: bool,
    /// Flush early once a batch holds this many received bytes.
    pub flush_bytes: usize,
    /// Refuse new writes with 429 while staged profiles holding this much memory wait
    /// for, or are in, a flush (their dataset builders' heap): the bound on the write
    /// path's memory under overload.
    pub max_pending_bytes: usize,
    /// Flushes (object writes and registrations) in flight at once.
    pub max_concurrent_flushes: usize,
    pub max_stack_depth: usize,
    /// An adaptive flush starts at least this long after the previous one started.
    pub min_gap: Duration,
    /// While level-0 datasets wait longer than this for their merge on average, adaptive
    /// flushes are spaced further apart (`compaction.max_wait_ms`; see
    /// [`crate::backoff`]). `None` when nothing compacts.
    pub max_compaction_wait: Option<Duration>,
    /// With a write-ahead log ([`Ingester::start_with_wal`]), the longest a logged
    /// profile waits in memory for its segment (`wal_segment_interval_ms`).
    pub segment_interval: Duration,
    /// [`IngesterConfig::segment_interval`] while recording rules exist
    /// (`wal_rules_segment_interval_ms`): they count a segment as it is registered.
    pub rules_segment_interval: Duration,
}

impl Default for IngesterConfig {
    fn default() -> Self {
        IngesterConfig {
            flush_interval: Duration::from_millis(500),
            adaptive: true,
            flush_bytes: 32 << 20,
            // Counted as the staged builders' heap, a service's symbols once however
            // many of its profiles wait: at 1,000 clients the batches hold well under
            // 128 MiB, so the bound only bites under overload (docs/benchmarks.md,
            // "Memory of the write path").
            max_pending_bytes: 128 << 20,
            max_concurrent_flushes: 4,
            max_stack_depth: 1000,
            min_gap: Duration::ZERO,
            max_compaction_wait: None,
            // Memory ends most batches of many services first (`logged_memory_limit`):
            // 30 s against 10 s was 1.31× at 500 services (docs/benchmarks.md, session 36).
            segment_interval: Duration::from_secs(30),
            // A rule's sample goes out `rule_export.delay_ms` (6 s) after its step: a
            // logged write is counted by then, and within 15 s of its profile's end.
            rules_segment_interval: Duration::from_secs(5),
        }
    }
}
