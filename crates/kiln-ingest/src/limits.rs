//! Per-tenant limits, with defaults and overrides from the configuration.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

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
    pub max_samples_per_profile: usize,
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
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 16 << 20,
            max_decompressed_bytes: 64 << 20,
            max_labels_per_series: 30,
            max_label_name_length: 1024,
            max_label_value_length: 2048,
            max_samples_per_profile: 16_000,
            max_stack_depth: 1_000,
            ingestion_rate_bytes: 0,
            ingestion_burst_bytes: 64 << 20,
            retention_days: 31,
            max_future_skew_ms: 3_600_000,
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

/// Default limits, per-tenant overrides, and each tenant's rate-limit bucket.
pub struct TenantLimits {
    defaults: Limits,
    overrides: HashMap<String, Limits>,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl TenantLimits {
    pub fn new(defaults: Limits, overrides: HashMap<String, Limits>) -> Self {
        TenantLimits {
            defaults,
            overrides,
            buckets: Mutex::new(HashMap::new()),
        }
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
                "tenant {tenant:?} is over its ingestion rate of {} bytes/s",
                limits.ingestion_rate_bytes
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
        );
        assert!(tenants.check_rate("small", 1500).is_ok());
        assert!(matches!(
            tenants.check_rate("small", 1500),
            Err(IngestError::RateLimited(_))
        ));
        assert!(tenants.check_rate("other", 1 << 30).is_ok());
    }
}
