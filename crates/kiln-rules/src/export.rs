//! The exporter: one task per target drains that target's outbox in the metastore, in
//! time order, and acknowledges rows only after the target accepted them.
//!
//! A batch is claimed (its rows stop changing) before it is sent, and acknowledged after;
//! a crash in between leaves claimed rows, sent again first after the restart with the
//! same values, which Prometheus ignores as duplicates. Retryable failures (no answer,
//! 5xx, 429) back off from 250 ms to 30 s and retry the same batch for as long as it
//! takes: the outbox is durable, so nothing is lost while the receiver is down. Any other
//! 4xx drops the batch and counts it (`kiln_rules_samples_failed_total{reason="refused"}`).
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

/// Each series' newest value (local target), by series key.
#[derive(Default)]
pub struct Latest {
    values: Mutex<BTreeMap<String, (i64, i64)>>,
}

impl Latest {
    fn record(&self, samples: &[OutboxSample]) {
        let Ok(mut values) = self.values.lock() else {
            return;
        };
        for sample in samples {
            let entry = values
                .entry(sample.series.clone())
                .or_insert((sample.ts_ms, 0));
            if sample.ts_ms >= entry.0 {
                *entry = (sample.ts_ms, sample.value);
            }
        }
    }

    /// OpenMetrics text: one gauge family per metric, with the sample's own time.
    pub fn render(&self, out: &mut String) {
        let Ok(values) = self.values.lock() else {
            return;
        };
        let mut families: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (key, (ts_ms, value)) in values.iter() {
            let Some(labels) = parse_series_key(key) else {
                continue;
            };
            let name = labels
                .iter()
                .find(|(name, _)| name == "__name__")
                .map(|(_, value)| value.clone())
                .unwrap_or_default();
            let rendered: Vec<String> = labels
                .iter()
                .filter(|(name, _)| name != "__name__")
                .map(|(name, value)| format!("{name}=\"{}\"", escape(value)))
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
    Remote(RemoteWriter),
    Local(Arc<Latest>),
}

pub struct Exporter {
    pub target: String,
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
        loop {
            if *stop.borrow() {
                return;
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
        let request = write_request(batch);
        let mut backoff = Duration::from_millis(250);
        loop {
            match writer.send(&request).await {
                Ok(()) => {
                    // The worst moment: the target has the samples, the outbox does not
                    // know.
                    kiln_model::crash::point("rules-sent");
                    self.metrics
                        .sent
                        .get_or_create(&label)
                        .inc_by(batch.len() as u64);
                    return true;
                }
                Err(err @ SendError::Refused { .. }) => {
                    tracing::warn!(error = %err, samples = batch.len(), "rule samples dropped");
                    self.metrics
                        .failed
                        .get_or_create(&FailureLabels {
                            target: self.target.clone(),
                            reason: "refused".into(),
                        })
                        .inc_by(batch.len() as u64);
                    return true;
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
