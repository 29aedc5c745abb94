//! Per-tenant limits, with defaults and overrides from the configuration.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use kiln_model::labels::LabelLimits;
use kiln_model::pprof::ProfileLimits;
use serde::{Deserialize, Serialize};

use crate::IngestError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest request body accepted as sent (compressed).
    pub max_body_bytes: usize,
    /// Largest body or profile after decompression.
    pub max_decompressed_bytes: usize,
    pub max_labels_per_series: usize,
    pub max_label_name_length: usize,
    pub max_label_value_length: usize,
    /// Samples (distinct stacks) kept of one pprof; past it the heaviest are kept and
    /// the response says so. Text formats with more distinct stacks are refused.
    pub max_samples_per_profile: usize,
    /// Frames kept of one stack; a deeper stack keeps its innermost frames under one
    /// `[truncated]` frame, and the response says so.
    pub max_stack_depth: usize,
    /// Sustained ingest rate in bytes per second as received; 0 means unlimited.
    pub ingestion_rate_bytes: u64,
    /// Burst allowed above the rate, in bytes.
    pub ingestion_burst_bytes: u64,
    /// Days profiles are kept; 0 keeps them forever. Older profiles are refused at ingest
    /// rather than acknowledged and then removed by retention.
    pub retention_days: u32,
    /// How far past the server's clock a profile's time may be, in milliseconds; 0 means
    /// no bound. A profile stamped years ahead would outlive retention and sit at the end
    /// of every "last hour" view, so it is refused unless the skew is plausible.
    pub max_future_skew_ms: u64,
    /// Bytes of this tenant's write requests held at once (read, waiting for a core,
    /// parsed, waiting for their commit); past it, 429. 0 means only the server-wide
    /// bound applies.
    pub max_inflight_bytes: usize,
    /// Series (label sets) written within a day; a write adding one more is refused
    /// with 429 ([`crate::cardinality`]). 0 means unlimited.
    pub max_series_per_tenant: usize,
    /// Values of one label name written within a day; likewise. 0 means unlimited.
    pub max_label_values_per_name: usize,
    /// A profile whose identity was stored this recently is acknowledged and not stored
    /// again: a client's retry ([`crate::dedup`]). 0 stores every copy.
    pub dedup_window_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 16 << 20,
            max_decompressed_bytes: 64 << 20,
            max_labels_per_series: 30,
            max_label_name_length: 1024,
            max_label_value_length: 2048,
            max_samples_per_profile: 64_000,
            max_stack_depth: 1_000,
            ingestion_rate_bytes: 0,
            ingestion_burst_bytes: 64 << 20,
            retention_days: 31,
            max_future_skew_ms: 3_600_000,
            max_inflight_bytes: 32 << 20,
            max_series_per_tenant: 100_000,
            max_label_values_per_name: 10_000,
            dedup_window_ms: 3_600_000,
        }
    }
}

impl Limits {
    pub fn labels(&self) -> LabelLimits {
        LabelLimits {
            max_labels: self.max_labels_per_series,
            max_name_length: self.max_label_name_length,
            max_value_length: self.max_label_value_length,
        }
    }

    pub fn profile(&self) -> ProfileLimits {
        ProfileLimits {
            max_samples: self.max_samples_per_profile,
            max_stack_depth: self.max_stack_depth,
        }
    }
}

struct Bucket {
    tokens: f64,
    last: Instant,
}

/// Default limits, per-tenant overrides, each tenant's rate-limit bucket, and the bytes of
/// write requests in flight.
///
/// In-flight bytes are what keeps memory bounded under overload: a request holds its
/// share from before its body is read until it is answered, and one that does not fit
/// is refused at once (429, `Retry-After`) instead of queueing. Queueing is what lets a
/// server's memory grow with its backlog until the kernel kills it; a refusal costs the
/// client one retry.
pub struct TenantLimits {
    defaults: Limits,
    overrides: HashMap<String, Limits>,
    buckets: Mutex<HashMap<String, Bucket>>,
    global: Arc<Semaphore>,
    global_limit: usize,
    tenants: Mutex<HashMap<String, Arc<Semaphore>>>,
    metrics: LimitMetrics,
    cardinality: Arc<crate::Cardinality>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabels {
    limit: &'static str,
    /// A tenant with its own overrides, or `default` for everyone else.
    tenant: String,
}

#[derive(Clone, Default)]
struct LimitMetrics {
    inflight: Gauge,
    limits: Family<LimitLabels, Gauge>,
}

/// A request's share of the in-flight bounds, given back when it is dropped.
pub struct InFlight {
    global: Option<OwnedSemaphorePermit>,
    tenant: Option<OwnedSemaphorePermit>,
    bytes: usize,
    gauge: Gauge,
}

impl InFlight {
    /// Takes `more`'s share into this one: a body admitted chunk by chunk, as its bytes
    /// arrive, holds one share, given back at once. Both must be of one tenant.
    pub fn absorb(&mut self, mut more: InFlight) {
        fn merge(into: &mut Option<OwnedSemaphorePermit>, from: Option<OwnedSemaphorePermit>) {
            match (into.as_mut(), from) {
                (Some(permit), Some(other)) => permit.merge(other),
                (None, other) => *into = other,
                (Some(_), None) => {}
            }
        }
        merge(&mut self.global, more.global.take());
        merge(&mut self.tenant, more.tenant.take());
        self.bytes += std::mem::take(&mut more.bytes);
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Gives back all but `bytes` of the share: a body that stalls keeps only what has
    /// arrived of it.
    pub fn keep(&mut self, bytes: usize) {
        if bytes >= self.bytes {
            return;
        }
        for permit in [self.global.as_mut(), self.tenant.as_mut()]
            .into_iter()
            .flatten()
        {
            let excess = permit.num_permits().saturating_sub(bytes);
            if excess > 0 {
                drop(permit.split(excess));
            }
        }
        self.gauge.dec_by((self.bytes - bytes) as i64);
        self.bytes = bytes;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.gauge.dec_by(self.bytes as i64);
    }
}

/// Largest bound a semaphore can hold (tokio's `MAX_PERMITS`, with room to spare).
const MAX_BOUND: usize = usize::MAX >> 4;

/// `bytes` permits at once, or `None`; a request over the whole bound gets all of it, only
/// when it is alone.
fn try_take(
    semaphore: &Arc<Semaphore>,
    bytes: usize,
    bound: usize,
) -> Option<OwnedSemaphorePermit> {
    let wanted = u32::try_from(bytes.min(bound)).unwrap_or(u32::MAX);
    semaphore.clone().try_acquire_many_owned(wanted).ok()
}

impl TenantLimits {
    /// `global_inflight_bytes` bounds every tenant's write requests together.
    pub fn new(
        defaults: Limits,
        overrides: HashMap<String, Limits>,
        global_inflight_bytes: usize,
    ) -> Self {
        let global_limit = global_inflight_bytes.clamp(1, MAX_BOUND);
        let metrics = LimitMetrics::default();
        let set = |limit: &'static str, tenant: &str, value: u64| {
            metrics
                .limits
                .get_or_create(&LimitLabels {
                    limit,
                    tenant: tenant.to_string(),
                })
                .set(value.min(i64::MAX as u64) as i64);
        };
        set("inflight_bytes", "*", global_limit as u64);
        for (tenant, limits) in std::iter::once(("default", &defaults))
            .chain(overrides.iter().map(|(t, l)| (t.as_str(), l)))
        {
            set(
                "tenant_inflight_bytes",
                tenant,
                limits.max_inflight_bytes as u64,
            );
            set(
                "tenant_ingestion_rate_bytes",
                tenant,
                limits.ingestion_rate_bytes,
            );
            set(
                "tenant_ingestion_burst_bytes",
                tenant,
                limits.ingestion_burst_bytes,
            );
        }
        TenantLimits {
            defaults,
            overrides,
            buckets: Mutex::new(HashMap::new()),
            global: Arc::new(Semaphore::new(global_limit)),
            global_limit,
            tenants: Mutex::new(HashMap::new()),
            metrics,
            cardinality: Arc::default(),
        }
    }

    /// Every tenant's active series and label values, checked on the parse threads.
    pub fn cardinality(&self) -> Arc<crate::Cardinality> {
        self.cardinality.clone()
    }

    pub fn register(&self, registry: &mut Registry) {
        self.cardinality.register(registry);
        registry.register(
            "kiln_ingest_inflight_bytes",
            "Bytes of write requests held now (read, parsed or waiting for their commit)",
            self.metrics.inflight.clone(),
        );
        registry.register(
            "kiln_ingest_limit",
            "Configured ingest limits: in-flight bytes (server-wide, per tenant) and ingestion rate and burst (bytes/s, bytes; 0 = unlimited), per tenant with overrides and `default`",
            self.metrics.limits.clone(),
        );
    }

    /// Takes `bytes` of the server's and the tenant's in-flight bounds, or refuses at
    /// once. A request larger than a whole bound is let through alone when nothing else
    /// is in flight, so that the body limit, not this one, decides what is too large.
    pub fn admit(&self, tenant: &str, bytes: usize) -> Result<InFlight, IngestError> {
        let bytes = bytes.max(1);
        let global = try_take(&self.global, bytes, self.global_limit).ok_or_else(|| {
            IngestError::Overloaded(format!(
                "server busy: write requests of {} bytes are in flight, and {bytes} more would pass the server-wide limit of {} bytes (http.max_inflight_bytes); retry shortly",
                self.global_limit.saturating_sub(self.global.available_permits()),
                self.global_limit
            ))
        })?;
        let limit = self.for_tenant(tenant).max_inflight_bytes;
        let tenant_permit = if limit == 0 {
            None
        } else {
            let limit = limit.min(MAX_BOUND);
            let semaphore = self
                .tenants
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(tenant.to_string())
                .or_insert_with(|| Arc::new(Semaphore::new(limit)))
                .clone();
            Some(try_take(&semaphore, bytes, limit).ok_or_else(|| {
                IngestError::Overloaded(format!(
                    "tenant {tenant:?} is busy: its write requests of {} bytes in flight and {bytes} more would pass its limit of {limit} bytes (limits.max_inflight_bytes); retry shortly",
                    limit.saturating_sub(semaphore.available_permits())
                ))
            })?)
        };
        self.metrics.inflight.inc_by(bytes as i64);
        Ok(InFlight {
            global: Some(global),
            tenant: tenant_permit,
            bytes,
            gauge: self.metrics.inflight.clone(),
        })
    }

    /// Refuses at once a request that declares more bytes than are free now in the
    /// server's or the tenant's in-flight bound, so that its body is never read; takes
    /// nothing. A request that fits is admitted as its bytes arrive ([`Self::admit`] per
    /// chunk), so a client that declares a large body and sends nothing holds nothing.
    pub fn check_declared(&self, tenant: &str, bytes: usize) -> Result<(), IngestError> {
        let free = self.global.available_permits();
        if bytes > free && free < self.global_limit {
            return Err(IngestError::Overloaded(format!(
                "server busy: {bytes} bytes declared, and only {free} of the server-wide limit of {} bytes of write requests in flight are free (http.max_inflight_bytes); retry shortly",
                self.global_limit
            )));
        }
        let limit = self.for_tenant(tenant).max_inflight_bytes.min(MAX_BOUND);
        if limit == 0 {
            return Ok(());
        }
        let free = self
            .tenants
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(tenant)
            .map_or(limit, |semaphore| semaphore.available_permits());
        if bytes > free && free < limit {
            return Err(IngestError::Overloaded(format!(
                "tenant {tenant:?} is busy: {bytes} bytes declared, and only {free} of its limit of {limit} bytes of write requests in flight are free (limits.max_inflight_bytes); retry shortly"
            )));
        }
        Ok(())
    }

    pub fn for_tenant(&self, tenant: &str) -> Limits {
        self.overrides.get(tenant).copied().unwrap_or(self.defaults)
    }

    /// Takes `bytes` from the tenant's token bucket, or refuses with 429.
    pub fn check_rate(&self, tenant: &str, bytes: usize) -> Result<(), IngestError> {
        let limits = self.for_tenant(tenant);
        if limits.ingestion_rate_bytes == 0 {
            return Ok(());
        }
        let rate = limits.ingestion_rate_bytes as f64;
        let burst = limits
            .ingestion_burst_bytes
            .max(limits.ingestion_rate_bytes) as f64;
        let now = Instant::now();
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let bucket = buckets.entry(tenant.to_string()).or_insert(Bucket {
            tokens: burst,
            last: now,
        });
        bucket.tokens =
            (bucket.tokens + now.duration_since(bucket.last).as_secs_f64() * rate).min(burst);
        bucket.last = now;
        if bucket.tokens < bytes as f64 {
            return Err(IngestError::RateLimited(format!(
                "tenant {tenant:?} is over its ingestion rate of {} bytes/s with a burst of {} bytes (limits.ingestion_rate_bytes, limits.ingestion_burst_bytes); retry shortly",
                limits.ingestion_rate_bytes, burst as u64
            )));
        }
        bucket.tokens -= bytes as f64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limit_refuses_over_burst() {
        let limits = Limits {
            ingestion_rate_bytes: 1000,
            ingestion_burst_bytes: 2000,
            ..Limits::default()
        };
        let tenants = TenantLimits::new(
            Limits::default(),
            HashMap::from([("small".to_string(), limits)]),
            1 << 30,
        );
        assert!(tenants.check_rate("small", 1500).is_ok());
        assert!(matches!(
            tenants.check_rate("small", 1500),
            Err(IngestError::RateLimited(_))
        ));
        assert!(tenants.check_rate("other", 1 << 30).is_ok());
    }

    #[test]
    fn in_flight_bytes_are_bounded_per_tenant_and_in_all() {
        let small = Limits {
            max_inflight_bytes: 1000,
            ..Limits::default()
        };
        let tenants = TenantLimits::new(
            Limits::default(),
            HashMap::from([("small".to_string(), small)]),
            3000,
        );
        let a = tenants.admit("small", 600).expect("fits");
        let Err(IngestError::Overloaded(message)) = tenants.admit("small", 600) else {
            panic!("over the tenant's bound");
        };
        assert!(message.contains("limits.max_inflight_bytes"), "{message}");
        let b = tenants.admit("big", 2000).expect("another tenant fits");
        let Err(IngestError::Overloaded(message)) = tenants.admit("big", 500) else {
            panic!("over the server's bound");
        };
        assert!(message.contains("http.max_inflight_bytes"), "{message}");
        drop((a, b));
        // Given back on drop; a request larger than the whole bound passes alone.
        let whole = tenants.admit("big", 10_000).expect("alone");
        assert!(tenants.admit("big", 1).is_err());
        drop(whole);
        assert!(tenants.admit("big", 1).is_ok());
    }
}
