//! The exporter: one task per target drains that target's outbox in the metastore, in
//! time order, and acknowledges rows only after the target accepted them.
//!
//! A batch is claimed (its rows stop changing) before it is sent, and acknowledged after;
//! a crash in between leaves claimed rows, sent again first after the restart with the
//! same values, which Prometheus ignores as duplicates. Retryable failures (no answer,
//! 5xx, 429) back off from 250 ms to 30 s and retry the same batch for as long as it
//! takes: the outbox is durable, so nothing is lost while the receiver is down. A refused
//! request ([`SendError::Refused`]) is halved until each refused sample stands alone;
//! those are dropped and counted (`kiln_rules_samples_failed_total{reason="refused"}`),
//! the others delivered.
//!
//! One process sends each target at a time: the sender holds a lease in the metastore
//! (the table compaction's leases use, keyed `("", "rule-export <target>")`), renewed on
//! every round, so the Kiln processes sharing a PostgreSQL metastore keep each series in
//! order; another takes over within [`LEASE_MS`] of the holder's death. The owner is the
//! node's name (host and listen address), so a node restarted after a crash takes its own
//! lease back at once.
//!
//! Crash point (`KILN_TEST_CRASH_AT`): `rules-sent`, after a target accepted a batch and
//! before its acknowledgement is stored.
//!
//! The local target `metrics` has no receiver: it keeps each series' newest value for
//! `/metrics`, for setups that scrape instead.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kiln_metastore::{Metastore, OutboxSample};
use kiln_model::time::now_ms;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use crate::eval::parse_series_key;
use crate::remote_write::{
    Label, MetricMetadata, RemoteWriter, Sample, SendError, TimeSeries, WriteRequest, GAUGE,
};
use crate::ExportSettings;

/// How long a sender's lease holds without renewal.
pub const LEASE_MS: i64 = 30_000;

/// The outbox of the newest values shown on `/metrics`.
pub const METRICS_TARGET: &str = "metrics";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetLabel {
    pub target: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    pub target: String,
    pub reason: String,
}

#[derive(Clone, Default)]
pub struct ExporterMetrics {
    pub sent: Family<TargetLabel, Counter>,
    pub failed: Family<FailureLabels, Counter>,
    pub pending: Family<TargetLabel, Gauge>,
    pub lag_seconds: Family<TargetLabel, Gauge<f64, AtomicU64>>,
    pub retries: Family<TargetLabel, Counter>,
}

impl ExporterMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kiln_rules_samples_sent",
            "Recording rule samples accepted by their target",
            self.sent.clone(),
        );
        registry.register(
            "kiln_rules_samples_failed",
            "Recording rule samples dropped: refused by the target (4xx), or too late for their step",
            self.failed.clone(),
        );
        registry.register(
            "kiln_rules_samples_pending",
            "Recording rule samples waiting in the outbox",
            self.pending.clone(),
        );
        registry.register(
            "kiln_rules_lag_seconds",
            "Seconds between now and the newest sample the target accepted",
            self.lag_seconds.clone(),
        );
        registry.register(
            "kiln_rules_send_retries",
            "Remote write requests retried after no answer, 5xx or 429",
            self.retries.clone(),
        );
    }

    pub fn target(&self, target: &str) -> TargetLabel {
        TargetLabel {
            target: target.to_string(),
        }
    }
}

/// Each series' newest value (local target), by tenant and series key.
#[derive(Default)]
pub struct Latest {
    values: Mutex<BTreeMap<(String, String), (i64, i64)>>,
}

impl Latest {
    fn record(&self, samples: &[OutboxSample]) {
        let Ok(mut values) = self.values.lock() else {
            return;
        };
        for sample in samples {
            let entry = values
                .entry((sample.tenant.clone(), sample.series.clone()))
                .or_insert((sample.ts_ms, 0));
            if sample.ts_ms >= entry.0 {
                *entry = (sample.ts_ms, sample.value);
            }
        }
    }

    /// OpenMetrics text: one gauge family per metric, with the sample's own time. Every
    /// series carries its `tenant` (a series' own `tenant` label becomes
    /// `exported_tenant`, as Prometheus renames a clash), so one scrape of `/metrics`
    /// never mixes two tenants' series into one.
    ///
    /// Kiln's one exposition written by hand (`tests/architecture.rs` allows only this):
    /// prometheus-client 0.25 writes no sample timestamps, and a rule's value belongs to
    /// the time of its profiles, not to the time of the scrape.
    pub fn render(&self, out: &mut String) {
        let Ok(values) = self.values.lock() else {
            return;
        };
        let mut families: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for ((tenant, key), (ts_ms, value)) in values.iter() {
            let Some(labels) = parse_series_key(key) else {
                continue;
            };
            let name = labels
                .iter()
                .find(|(name, _)| name == "__name__")
                .map(|(_, value)| value.clone())
                .unwrap_or_default();
            let rendered: Vec<String> =
                std::iter::once(format!("tenant=\"{}\"", escape(tenant)))
                    .chain(labels.iter().filter(|(name, _)| name != "__name__").map(
                        |(name, value)| {
                            let name = if name == "tenant" {
                                "exported_tenant"
                            } else {
                                name
                            };
                            format!("{name}=\"{}\"", escape(value))
                        },
                    ))
                    .collect();
            families.entry(name.clone()).or_default().push(format!(
                "{name}{{{}}} {value} {}.{:03}\n",
                rendered.join(","),
                ts_ms.div_euclid(1000),
                ts_ms.rem_euclid(1000)
            ));
        }
        for (name, lines) in families {
            out.push_str(&format!("# TYPE {name} gauge\n"));
            for line in lines {
                out.push_str(&line);
            }
        }
    }
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Where one exporter task delivers.
pub enum Destination {
    Remote(Box<RemoteWriter>),
    Local(Arc<Latest>),
}

pub struct Exporter {
    pub target: String,
    /// This node's name: the lease owner.
    pub node: String,
    pub destination: Destination,
    pub metastore: Metastore,
    pub settings: ExportSettings,
    pub metrics: ExporterMetrics,
}

impl Exporter {
    /// Runs until `stop` fires: claim, send, acknowledge; prune delivered rows now and then.
    pub async fn run(self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let poll = Duration::from_millis(self.settings.poll_ms.max(10));
        let label = self.metrics.target(&self.target);
        let mut last_prune = 0i64;
        let mut newest_sent: Option<i64> = None;
        let lease = kiln_metastore::LeaseKey {
            tenant: String::new(),
            service: format!("rule-export {}", self.target),
            level: 0,
        };
        let owner = self.node.clone();
        loop {
            if *stop.borrow() {
                let _ = self.metastore.release_lease(lease.clone(), &owner).await;
                return;
            }
            let holding = self
                .metastore
                .acquire_lease(lease.clone(), &owner, LEASE_MS)
                .await
                .unwrap_or(false);
            if !holding {
                tokio::select! {
                    _ = tokio::time::sleep(poll) => {}
                    _ = stop.changed() => {}
                }
                continue;
            }
            let now = now_ms();
            let due_before = now - self.settings.step_ms - self.settings.delay_ms;
            let batch = match self
                .metastore
                .claim_exports(&self.target, due_before, self.settings.batch_samples)
                .await
            {
                Ok(batch) => batch,
                Err(err) => {
                    tracing::warn!(error = %err, target = %self.target, "rule outbox unreadable");
                    Vec::new()
                }
            };
            let full = batch.len() >= self.settings.batch_samples.max(1);
            if !batch.is_empty() {
                // Counted before the delivery too: while the receiver is down, delivery
                // retries until it is back, and the gauge must show what waits meanwhile.
                if let Ok(backlog) = self.metastore.export_backlog(&self.target).await {
                    self.metrics.pending.get_or_create(&label).set(backlog);
                }
                let delivered = self.deliver(&batch, &mut stop).await;
                if !delivered {
                    return; // stopped while retrying; the claimed rows go first next time
                }
                newest_sent = batch.iter().map(|s| s.ts_ms).max().max(newest_sent);
                if let Err(err) = self.metastore.ack_exports(&self.target, batch).await {
                    tracing::warn!(error = %err, target = %self.target, "rule samples sent but not acknowledged; they will be sent again");
                }
            }
            if let Some(newest) = newest_sent {
                self.metrics
                    .lag_seconds
                    .get_or_create(&label)
                    .set((now - newest) as f64 / 1000.0);
            }
            if let Ok(backlog) = self.metastore.export_backlog(&self.target).await {
                self.metrics.pending.get_or_create(&label).set(backlog);
            }
            if now - last_prune > 60_000 {
                last_prune = now;
                // Rows of steps that may still get late data stay, so that data becomes a
                // new sample; a margin covers compactions that read `now` a little earlier.
                let before = now - self.settings.late_window_ms - self.settings.step_ms - 600_000;
                if let Err(err) = self.metastore.prune_exports(before).await {
                    tracing::warn!(error = %err, "pruning the rule outbox failed");
                }
            }
            if full {
                continue; // more is due: no pause
            }
            tokio::select! {
                _ = tokio::time::sleep(poll) => {}
                _ = stop.changed() => {}
            }
        }
    }

    /// Sends one batch until it is accepted or refused; false when stopped meanwhile.
    async fn deliver(
        &self,
        batch: &[OutboxSample],
        stop: &mut tokio::sync::watch::Receiver<bool>,
    ) -> bool {
        let label = self.metrics.target(&self.target);
        let writer = match &self.destination {
            Destination::Local(latest) => {
                latest.record(batch);
                self.metrics
                    .sent
                    .get_or_create(&label)
                    .inc_by(batch.len() as u64);
                return true;
            }
            Destination::Remote(writer) => writer,
        };
        // A receiver that refuses a request keeps none of it (Prometheus rolls the whole
        // request back on its first bad sample), so a refused part is halved until the
        // samples it refuses stand alone: those are dropped and counted, the rest land.
        let mut parts: Vec<&[OutboxSample]> = vec![batch];
        while let Some(part) = parts.pop() {
            let request = write_request(part);
            let mut backoff = Duration::from_millis(250);
            loop {
                match writer.send(&request).await {
                    Ok(()) => {
                        // The worst moment: the target has the samples, the outbox does
                        // not know.
                        kiln_runtime::crash::point("rules-sent");
                        self.metrics
                            .sent
                            .get_or_create(&label)
                            .inc_by(part.len() as u64);
                        break;
                    }
                    Err(SendError::Refused { .. }) if part.len() > 1 => {
                        let (first, second) = part.split_at(part.len() / 2);
                        parts.push(second);
                        parts.push(first);
                        break;
                    }
                    Err(err @ SendError::Refused { .. }) => {
                        tracing::warn!(error = %err, "rule sample dropped");
                        self.metrics
                            .failed
                            .get_or_create(&FailureLabels {
                                target: self.target.clone(),
                                reason: "refused".into(),
                            })
                            .inc();
                        break;
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, retry_in_ms = backoff.as_millis() as u64, "remote write failed");
                        self.metrics.retries.get_or_create(&label).inc();
                        tokio::select! {
                            _ = tokio::time::sleep(backoff) => {}
                            _ = stop.changed() => return false,
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(30));
                    }
                }
            }
        }
        true
    }
}

/// Groups a batch (in time order) into series, each with its samples in time order.
pub fn write_request(batch: &[OutboxSample]) -> WriteRequest {
    let mut series: HashMap<&str, usize> = HashMap::new();
    let mut timeseries: Vec<TimeSeries> = Vec::new();
    let mut names: BTreeMap<String, ()> = BTreeMap::new();
    for sample in batch {
        let index = *series.entry(sample.series.as_str()).or_insert_with(|| {
            let labels = parse_series_key(&sample.series).unwrap_or_default();
            if let Some((_, name)) = labels.iter().find(|(name, _)| name == "__name__") {
                names.insert(name.clone(), ());
            }
            timeseries.push(TimeSeries {
                labels: labels
                    .into_iter()
                    .map(|(name, value)| Label { name, value })
                    .collect(),
                samples: Vec::new(),
            });
            timeseries.len() - 1
        });
        timeseries[index].samples.push(Sample {
            value: sample.value as f64,
            timestamp: sample.ts_ms,
        });
    }
    for series in &mut timeseries {
        series.samples.sort_by_key(|sample| sample.timestamp);
    }
    WriteRequest {
        timeseries,
        metadata: names
            .into_keys()
            .map(|name| MetricMetadata {
                r#type: GAUGE,
                metric_family_name: name,
                help: "Kiln recording rule: sum of profile values per step".into(),
                unit: String::new(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_metastore::{BlockMeta, Exports, RuleSample};

    fn exporter(metastore: &Metastore, node: &str, latest: &Arc<Latest>) -> Exporter {
        Exporter {
            target: METRICS_TARGET.into(),
            node: node.into(),
            destination: Destination::Local(latest.clone()),
            metastore: metastore.clone(),
            settings: ExportSettings {
                step_ms: 1_000,
                delay_ms: 0,
                poll_ms: 20,
                ..ExportSettings::default()
            },
            metrics: ExporterMetrics::default(),
        }
    }

    async fn add_sample(metastore: &Metastore, step_start_ms: i64, id: &str) {
        let block = |id: &str| BlockMeta {
            id: id.into(),
            object_key: format!("blocks/{id}"),
            level: 1,
            size_bytes: 1,
            created_at_ms: 0,
            deleted_at_ms: None,
        };
        let exports = Exports {
            targets: vec![METRICS_TARGET.into()],
            samples: vec![RuleSample {
                tenant: "t".into(),
                rule: "cpu".into(),
                series: r#"[["__name__","cpu"]]"#.into(),
                step_start_ms,
                step_ms: 1_000,
                value: 5,
            }],
        };
        metastore
            .replace_datasets(block(id), vec![], vec![], exports)
            .await
            .unwrap();
    }

    fn shown(latest: &Latest) -> String {
        let mut text = String::new();
        latest.render(&mut text);
        text
    }

    /// Two nodes on one metastore: one sends, the other waits; when the first stops, the
    /// second takes over (its lease was released), and nothing is sent twice.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_node_sends_a_target_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("m.db").display());
        let metastore = Metastore::open(&url).await.unwrap();
        let (a_latest, b_latest) = (Arc::new(Latest::default()), Arc::new(Latest::default()));
        let (stop_a, stopped_a) = tokio::sync::watch::channel(false);
        let (stop_b, stopped_b) = tokio::sync::watch::channel(false);
        let a = tokio::spawn(exporter(&metastore, "a", &a_latest).run(stopped_a));
        // a holds the lease before b starts.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let b = tokio::spawn(exporter(&metastore, "b", &b_latest).run(stopped_b));
        add_sample(&metastore, 1_000, "c1").await;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !shown(&a_latest).contains("cpu{tenant=\"t\"} 5 1.000") {
            assert!(std::time::Instant::now() < deadline, "a never sent");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(shown(&b_latest), "", "b sent while a held the lease");
        stop_a.send(true).unwrap();
        a.await.unwrap();
        add_sample(&metastore, 2_000, "c2").await;
        while !shown(&b_latest).contains("cpu{tenant=\"t\"} 5 2.000") {
            assert!(std::time::Instant::now() < deadline, "b never took over");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!shown(&a_latest).contains("2.000"));
        stop_b.send(true).unwrap();
        b.await.unwrap();
        assert_eq!(metastore.export_backlog(METRICS_TARGET).await.unwrap(), 0);
    }
}
