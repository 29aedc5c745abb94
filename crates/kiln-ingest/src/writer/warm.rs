//! The builder pool: each service's dataset builder kept between flushes with its symbol
//! tables, so the next batch of that service interns what it knows with one lookup per
//! symbol.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use kiln_storage::builder::Taken;
use kiln_storage::DatasetBuilder;
use prometheus_client::metrics::gauge::Gauge;

/// (tenant, service).
pub(super) type ServiceKey = (String, String);

/// How long a service's symbol tables are kept without a flush of that service.
const WARM_FOR: Duration = Duration::from_secs(60);
/// Tables holding more than this many rows per row the last flush used are mostly other
/// profiles' symbols: walking them at each flush would cost more than the lookups save,
/// so they are dropped.
const WARM_MAX_ROWS_PER_USED: usize = 8;

/// Each service's dataset builder, kept between flushes with its symbol tables so that
/// the next batch of that service interns what it knows with one lookup per symbol
/// (`DatasetBuilder::take_dataset` writes only the rows a flush uses). Bounded: at most
/// an eighth of `max_pending_bytes` in all and a quarter of that per service, tables
/// mostly unused are dropped, and so is a service not flushed for [`WARM_FOR`].
pub(super) struct WarmBuilders {
    budget: usize,
    inner: Mutex<WarmInner>,
    gauge: Gauge,
}

#[derive(Default)]
struct WarmInner {
    builders: HashMap<ServiceKey, (DatasetBuilder, usize, Instant)>,
    bytes: usize,
}

impl WarmBuilders {
    pub(super) fn new(max_pending_bytes: usize, gauge: Gauge) -> Self {
        WarmBuilders {
            budget: max_pending_bytes / 8,
            inner: Mutex::default(),
            gauge,
        }
    }

    /// The service's warm builder, or a new one.
    pub(super) fn take(&self, tenant: &str, service: &str) -> DatasetBuilder {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (tenant.to_string(), service.to_string());
        match inner.builders.remove(&key) {
            Some((builder, bytes, _)) => {
                inner.bytes -= bytes;
                self.gauge.set(inner.bytes as i64);
                builder
            }
            None => DatasetBuilder::new(tenant, service),
        }
    }

    /// Keeps a builder whose profiles a flush took, if it is worth keeping and fits: a
    /// new one, to see whether the next flush finds its symbols, or a warm one where it
    /// did (at least half of the rows the flush used were known). A service whose
    /// symbols churn, or that sends several programs under one name, starts afresh.
    pub(super) fn give_back(&self, key: ServiceKey, builder: DatasetBuilder, taken: &Taken) {
        let used = taken.used_rows.max(1);
        let paid = !taken.warm || taken.new_rows * 2 <= used;
        if !paid || builder.symbol_rows() > used * WARM_MAX_ROWS_PER_USED {
            return;
        }
        let bytes = builder.heap_bytes();
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let WarmInner {
            builders,
            bytes: held,
        } = &mut *inner;
        builders.retain(|_, (_, kept, returned)| {
            let keep = now.duration_since(*returned) < WARM_FOR;
            if !keep {
                *held -= *kept;
            }
            keep
        });
        // A newer batch of the service may have returned its builder first: one is kept.
        if let Some((_, kept, _)) = builders.remove(&key) {
            *held -= kept;
        }
        if bytes <= self.budget / 4 && *held + bytes <= self.budget {
            *held += bytes;
            builders.insert(key, (builder, bytes, now));
        }
        self.gauge.set(*held as i64);
    }
}
