//! Ingest yields to compaction.
//!
//! Under a closed loop at saturation the write path takes every core: a flush starts the
//! moment the last one ends (25 a second at 1,000 clients), each writes one small dataset
//! per service, and compaction, whose cost is mostly per input dataset, falls behind. Its
//! level 0 then grows without end (24,000 datasets after four minutes), and every query up
//! to now, the regression watcher's looks and compaction's own listings grow with it, and
//! so does the memory they hold (docs/benchmarks.md, "Ingest yields to compaction").
//!
//! Refusing writes would waste the clients' work and leave the flushes as small. Instead,
//! the write path spaces its flushes by how far compaction is behind, measured as the mean
//! time level-0 datasets have waited for their merge. When compaction keeps up that is a
//! second or two at any rate (merges by count) and under level 0's `max_age_ms` for
//! services that send little (merges by age); behind, it grows (20 s after two and a half
//! minutes at 1,000 clients). Each second of mean wait over `compaction.max_wait_ms` adds
//! [`PER_SECOND`] between the starts of two flushes, up to `flush_interval` (where a batch
//! is flushed anyway). Batches grow with the gap, so there are fewer, larger datasets,
//! cheaper to write and to compact. Level 0 stays bounded; the gap still swings between 0
//! and `flush_interval` at saturation, as level 0 waits mostly while the one compaction
//! thread runs a phase of level-1 merges (measured).
//!
//! Why this measure (docs/benchmarks.md, "Ingest yields to compaction"): the age of the
//! oldest dataset reacts late, as compaction merges the oldest first while the count
//! grows behind them; the count per service reacts to fast flushing as such (75 per
//! service at 16 clients, which compaction kept up with), and spaced the flushes of a
//! server that was not behind. And the gap is a function of the wait, not a step that
//! keeps growing while it lasts: one that doubled each second held flushes half a second
//! apart for a minute after it was needed. Acks wait longer only while the server is
//! saturated, when they already wait for the queue ahead of them.
//!
//! The backlog is read from the metastore (`Metastore::level_backlog`), so an ingester
//! yields to a compactor on another node just as to one in its own process.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kiln_metastore::Metastore;
use prometheus_client::metrics::gauge::Gauge;

/// How often the backlog is read.
const POLL: Duration = Duration::from_secs(1);
/// The gap added per second of mean wait over the bound: 100 ms at 4 s over.
pub(crate) const PER_SECOND: Duration = Duration::from_millis(25);

/// The gap now asked of the flusher, shared with the task that reads the backlog.
#[derive(Default)]
pub(crate) struct Backoff {
    gap_micros: AtomicU64,
}

impl Backoff {
    pub(crate) fn gap(&self) -> Duration {
        Duration::from_micros(self.gap_micros.load(Ordering::Relaxed))
    }
}

/// Exported on `/metrics`: what the write path sees of compaction, and what it does.
#[derive(Clone, Default)]
pub(crate) struct BackoffMetrics {
    pub(crate) datasets: Gauge,
    pub(crate) wait_seconds: Gauge<f64, AtomicU64>,
    pub(crate) gap_seconds: Gauge<f64, AtomicU64>,
}

/// The gap for a mean wait of `wait`.
pub(crate) fn gap_for(wait: Duration, bound: Duration, ceiling: Duration) -> Duration {
    PER_SECOND
        .mul_f64(wait.saturating_sub(bound).as_secs_f64())
        .min(ceiling)
}

/// Reads the backlog every [`POLL`] and sets the gap, until `alive` says the flusher is
/// gone.
pub(crate) fn spawn(
    metastore: Metastore,
    backoff: Arc<Backoff>,
    metrics: BackoffMetrics,
    bound: Duration,
    ceiling: Duration,
    alive: impl Fn() -> bool + Send + 'static,
) {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(POLL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while alive() {
            ticks.tick().await;
            let backlog = match metastore.level_backlog(0).await {
                Ok(backlog) => backlog,
                Err(err) => {
                    // Flushes fail on their own if the metastore is gone; the gap stays.
                    tracing::debug!(error = %err, "reading compaction's backlog");
                    continue;
                }
            };
            let wait = backlog.mean_created_at_ms.map_or(Duration::ZERO, |mean| {
                Duration::from_millis((kiln_model::time::now_ms() - mean).max(0) as u64)
            });
            let gap = backoff.gap();
            let next = gap_for(wait, bound, ceiling);
            let (datasets, wait_ms) = (backlog.datasets, wait.as_millis() as u64);
            if gap.is_zero() && !next.is_zero() {
                tracing::info!(datasets, wait_ms, "compaction is behind: flushes spaced");
            } else if !gap.is_zero() && next.is_zero() {
                tracing::info!(
                    datasets,
                    wait_ms,
                    "compaction caught up: flushes no longer spaced"
                );
            }
            backoff
                .gap_micros
                .store(next.as_micros() as u64, Ordering::Relaxed);
            metrics.datasets.set(backlog.datasets as i64);
            metrics.wait_seconds.set(wait.as_secs_f64());
            metrics.gap_seconds.set(next.as_secs_f64());
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gap_grows_with_the_wait_over_the_bound_up_to_the_interval() {
        let ceiling = Duration::from_millis(500);
        let gap = |wait_ms| {
            gap_for(
                Duration::from_millis(wait_ms),
                Duration::from_secs(10),
                ceiling,
            )
            .as_millis()
        };
        assert_eq!(gap(0), 0);
        assert_eq!(gap(10_000), 0);
        assert_eq!(gap(10_400), 10);
        assert_eq!(gap(14_000), 100);
        assert_eq!(gap(30_000), 500);
        assert_eq!(gap(3_600_000), 500);
    }
}
