//! Series and label-value cardinality per tenant: `limits.max_series_per_tenant` and
//! `limits.max_label_values_per_name`.
//!
//! A series here is the label set a profile is written under (service and labels; its
//! profile types are not counted apart). Each is remembered for a day after it was last
//! written, as Cortex and Pyroscope count a tenant's active series; so is each value of
//! each label name. A write that would add a series past the tenant's bound, or a value
//! past a name's bound, is refused (429), naming the label set, before anything is
//! staged; series and values already known are always let through, so the limit stops
//! an explosion without stopping the services already sending.
//!
//! Counted on the node that writes, from what it wrote: a restart starts the count
//! afresh (the limit then catches an explosion within its first day again), and in a
//! cluster placement sends a service to one node, so a tenant's bound holds per node.
//! Memory is about 24 bytes a series and a value: a tenant at its 100,000 series costs
//! about 2.4 MB.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::sync::Mutex;

use kiln_model::labels::Labels;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::{IngestError, Limits};

/// How long a series or a value counts after it was last written.
pub const ACTIVE_MS: i64 = 24 * 3600 * 1000;

#[derive(Default)]
struct Tenant {
    series: HashMap<u64, i64>,
    /// Values by label name: each value's hash and when it was last written.
    values: HashMap<String, HashMap<u64, i64>>,
    pruned_at_ms: i64,
}

impl Tenant {
    fn prune(&mut self, now_ms: i64) {
        if now_ms - self.pruned_at_ms < 60_000 {
            return;
        }
        self.pruned_at_ms = now_ms;
        let alive = |seen: &mut i64| now_ms - *seen < ACTIVE_MS;
        self.series.retain(|_, seen| alive(seen));
        for values in self.values.values_mut() {
            values.retain(|_, seen| alive(seen));
        }
        self.values.retain(|_, values| !values.is_empty());
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLabels {
    limit: &'static str,
}

/// Every tenant's active series and label values.
#[derive(Default)]
pub struct Cardinality {
    tenants: Mutex<HashMap<String, Tenant>>,
    hasher: foldhash::fast::FixedState,
    refused: Family<RefusedLabels, Counter>,
}

impl Cardinality {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kiln_ingest_series_refused",
            "Writes refused because they would add a series or a label value past a tenant's limit (limits.max_series_per_tenant, limits.max_label_values_per_name)",
            self.refused.clone(),
        );
    }

    fn hash(&self, value: impl Hash) -> u64 {
        self.hasher.hash_one(value)
    }

    /// Admits the label sets of one write, all or none, and marks them written `now_ms`.
    pub fn admit<'a>(
        &self,
        tenant: &str,
        series: impl IntoIterator<Item = &'a Labels>,
        limits: &Limits,
        now_ms: i64,
    ) -> Result<(), IngestError> {
        if limits.max_series_per_tenant == 0 && limits.max_label_values_per_name == 0 {
            return Ok(());
        }
        let series: Vec<(u64, &Labels)> = series
            .into_iter()
            .map(|labels| (self.hash(labels), labels))
            .collect();
        let mut tenants = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        let known = tenants.entry(tenant.to_string()).or_default();
        known.prune(now_ms);
        let mut new_series = 0;
        let mut new_values: HashMap<&str, usize> = HashMap::new();
        for (hash, labels) in &series {
            if known.series.contains_key(hash) {
                continue;
            }
            new_series += 1;
            if limits.max_series_per_tenant > 0
                && known.series.len() + new_series > limits.max_series_per_tenant
            {
                return Err(self.refuse("series", format!(
                    "tenant {tenant:?} has {} active series, its limit (limits.max_series_per_tenant); the new series {} is refused. Series written within a day go on being accepted",
                    known.series.len(),
                    show(labels)
                )));
            }
            for label in labels.iter() {
                let (name, hash) = (label.name.as_str(), self.hash(&label.value));
                let count = known.values.get(name).map_or(0, HashMap::len);
                if known
                    .values
                    .get(name)
                    .is_some_and(|values| values.contains_key(&hash))
                {
                    continue;
                }
                let added = new_values.entry(name).or_default();
                *added += 1;
                if limits.max_label_values_per_name > 0
                    && count + *added > limits.max_label_values_per_name
                {
                    return Err(self.refuse("label_values", format!(
                        "label {name:?} of tenant {tenant:?} has {count} values written within a day, its limit (limits.max_label_values_per_name); the series {} with a new value is refused",
                        show(labels)
                    )));
                }
            }
        }
        for (hash, labels) in series {
            known.series.insert(hash, now_ms);
            for label in labels.iter() {
                let hash = self.hash(&label.value);
                known
                    .values
                    .entry(label.name.clone())
                    .or_default()
                    .insert(hash, now_ms);
            }
        }
        Ok(())
    }
}

impl Cardinality {
    /// Counts a refusal by the limit it hit, and words it.
    fn refuse(&self, limit: &'static str, message: String) -> IngestError {
        self.refused.get_or_create(&RefusedLabels { limit }).inc();
        IngestError::Cardinality(message)
    }
}

/// A label set as a selector would write it, cut to 512 bytes.
fn show(labels: &Labels) -> String {
    let text: Vec<String> = labels
        .iter()
        .map(|label| format!("{}={:?}", label.name, label.value))
        .collect();
    let mut text = format!("{{{}}}", text.join(", "));
    if text.len() > 512 {
        let mut end = 512;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str("…}");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        Labels::from_pairs(pairs.iter().map(|(n, v)| (n.to_string(), v.to_string())))
    }

    #[test]
    fn new_series_past_the_limit_are_refused_and_known_ones_are_not() {
        let limits = Limits {
            max_series_per_tenant: 3,
            max_label_values_per_name: 0,
            ..Limits::default()
        };
        let cardinality = Cardinality::default();
        let series: Vec<Labels> = (0..4)
            .map(|i| labels(&[("service_name", "a"), ("pod", &format!("p{i}"))]))
            .collect();
        for s in &series[..3] {
            cardinality
                .admit("t", [s], &limits, 0)
                .expect("under the limit");
        }
        let err = cardinality
            .admit("t", [&series[3]], &limits, 0)
            .unwrap_err();
        assert!(
            err.to_string().contains("p3") && err.to_string().contains("max_series_per_tenant"),
            "{err}"
        );
        assert!(
            cardinality.admit("t", [&series[0]], &limits, 1).is_ok(),
            "known"
        );
        assert!(
            cardinality.admit("other", [&series[3]], &limits, 0).is_ok(),
            "per tenant"
        );
        // A day later the old ones are forgotten.
        assert!(cardinality
            .admit("t", [&series[3]], &limits, ACTIVE_MS + 60_000)
            .is_ok());
    }

    #[test]
    fn values_of_one_name_are_bounded() {
        let limits = Limits {
            max_series_per_tenant: 0,
            max_label_values_per_name: 2,
            ..Limits::default()
        };
        let cardinality = Cardinality::default();
        let a = labels(&[("service_name", "a"), ("user", "1")]);
        let b = labels(&[("service_name", "a"), ("user", "2")]);
        let c = labels(&[("service_name", "a"), ("user", "3")]);
        cardinality
            .admit("t", [&a, &b], &limits, 0)
            .expect("two values");
        let err = cardinality.admit("t", [&c], &limits, 0).unwrap_err();
        assert!(err.to_string().contains("\"user\""), "{err}");
        // All or none: a write refused adds nothing.
        let d = labels(&[("service_name", "b"), ("user", "1")]);
        cardinality
            .admit("t", [&d], &limits, 0)
            .expect("known values");
    }
}
