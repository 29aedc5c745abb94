//! The write path's counters, exported on `/metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::backoff::BackoffMetrics;

#[derive(Clone)]
pub struct WriterMetrics {
    pub flushes: Counter,
    /// Of them, segments stored by the thread that encoded them ([`super::SegmentSink`]).
    pub landed: Counter,
    pub flush_failures: Counter,
    pub segment_bytes: Counter,
    pub profiles_written: Counter,
    pub flush_seconds: Histogram,
    /// Why each batch was flushed: `size`, `idle`, `interval` or `shutdown`.
    pub flush_reasons: Family<ReasonLabel, Counter>,
    /// Requests acknowledged by each flush.
    pub batch_requests: Histogram,
    /// Bytes counted against `max_pending_bytes` now.
    pub pending_bytes: Gauge,
    /// Heap of the symbol tables kept warm between flushes ([`super::warm`]).
    pub warm_bytes: Gauge,
    /// Requests appended to the write-ahead log, and the `fdatasync`s that made them
    /// durable (fewer when writes share one).
    pub wal_records: Counter,
    pub wal_syncs: Counter,
    /// Profiles staged again from log files whose segment was not registered.
    pub wal_recovered: Counter,
    pub(super) backoff: BackoffMetrics,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

impl WriterMetrics {
    pub(super) fn new() -> Self {
        WriterMetrics {
            flushes: Counter::default(),
            landed: Counter::default(),
            flush_failures: Counter::default(),
            segment_bytes: Counter::default(),
            profiles_written: Counter::default(),
            flush_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            flush_reasons: Family::default(),
            batch_requests: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            pending_bytes: Gauge::default(),
            warm_bytes: Gauge::default(),
            wal_records: Counter::default(),
            wal_syncs: Counter::default(),
            wal_recovered: Counter::default(),
            backoff: BackoffMetrics::default(),
        }
    }

    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kiln_ingest_flushes",
            "Segments flushed",
            self.flushes.clone(),
        );
        registry.register(
            "kiln_ingest_flushes_landed",
            "Segments stored (and, with SQLite, registered) by the write-path thread that encoded them, with no hand-off to the blocking pool: one-service flushes while no other write was on its way, on a local store",
            self.landed.clone(),
        );
        registry.register(
            "kiln_ingest_flush_failures",
            "Segment flushes that failed (their requests got 5xx)",
            self.flush_failures.clone(),
        );
        registry.register(
            "kiln_ingest_segment_bytes",
            "Bytes of segment objects written",
            self.segment_bytes.clone(),
        );
        registry.register(
            "kiln_ingest_profiles_written",
            "Profiles durably written and registered",
            self.profiles_written.clone(),
        );
        registry.register_with_unit(
            "kiln_ingest_flush_duration",
            "Time to build, write and register one segment",
            prometheus_client::registry::Unit::Seconds,
            self.flush_seconds.clone(),
        );
        registry.register(
            "kiln_ingest_flush_reason",
            "Segment flushes by what started them: size (flush_bytes), idle (nothing else on its way), alone (the only write on its way, flushed by the thread that parsed it), busy (waited about one flush for writes on their way), interval (flush_interval, or wal_segment_interval_ms with the write-ahead log), memory (logged profiles holding three quarters of max_pending_bytes), query (a read asked for what is logged to be visible), shutdown",
            self.flush_reasons.clone(),
        );
        registry.register(
            "kiln_ingest_flush_requests",
            "Write requests acknowledged by one segment flush",
            self.batch_requests.clone(),
        );
        registry.register(
            "kiln_ingest_pending_bytes",
            "Memory of the staged profiles waiting for, or in, a flush, counted against max_pending_bytes",
            self.pending_bytes.clone(),
        );
        registry.register(
            "kiln_ingest_warm_symbol_bytes",
            "Memory of the services' symbol tables kept between flushes, at most an eighth of max_pending_bytes",
            self.warm_bytes.clone(),
        );
        registry.register(
            "kiln_ingest_wal_records",
            "Write requests appended to the write-ahead log",
            self.wal_records.clone(),
        );
        registry.register(
            "kiln_ingest_wal_syncs",
            "fdatasyncs of the write-ahead log; each made every record appended before it durable",
            self.wal_syncs.clone(),
        );
        registry.register(
            "kiln_ingest_wal_recovered_profiles",
            "Profiles staged again from write-ahead log files whose segment was not registered (after a crash or a failed flush)",
            self.wal_recovered.clone(),
        );
        registry.register(
            "kiln_ingest_compaction_backlog_datasets",
            "Level-0 datasets waiting for their merge, as the write path last read them",
            self.backoff.datasets.clone(),
        );
        registry.register(
            "kiln_ingest_compaction_wait_seconds",
            "Mean time level-0 datasets have waited for their merge, as the write path last read it",
            self.backoff.wait_seconds.clone(),
        );
        registry.register(
            "kiln_ingest_flush_backoff_seconds",
            "Extra spacing between flushes while level-0 datasets wait longer than compaction.max_wait_ms",
            self.backoff.gap_seconds.clone(),
        );
    }
}
