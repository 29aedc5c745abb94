//! Recording rules: metrics derived from profiles, remote-written to Prometheus.
//!
//! A rule selects profiles (profile type + label matchers, optionally only the samples
//! whose stack holds one function) and sums their values per step and per `group_by`
//! labels ([`eval`]). The sums are computed where each profile is seen exactly once, and
//! committed to the metastore's outbox in the transaction that makes that moment
//! final ([`Rules::hook`]): the registration of its segment, seconds after the write
//! (kiln-ingest's sink, which marks the datasets `rules_counted`), or, for a segment
//! registered without the rules (recovered from the log at start-up), its first
//! compaction's swap (kiln-compactor). A segment is registered once (a retry after a
//! crash finds its block id taken) and a level-0 dataset is swapped out once (a retry
//! or a second compactor finds the inputs gone), and a crash before either commit loses
//! the samples with it. So every profile counts once, whatever interleaves, and its
//! sample can go out seconds after its step. [`export`] then drains the outbox to each
//! target in time order, durably: samples wait in the metastore while Prometheus is down, and a resent
//! sample is identical to the one sent before.
//!
//! Time ranges never overlap between the two ways a profile is counted. A rule counts
//! live the profiles whose time is at or after its `live_from` (its creation, rounded up
//! to a step); `backfill` counts stored profiles before that, each range once (the
//! metastore refuses an overlapping backfill). Late data (a profile counted after its
//! step was sent) becomes an extra sample 1 ms after the step's previous one, so sums
//! stay exact; data later than `late_window_ms` after its step is dropped and counted,
//! because the receiver's out-of-order window has to accept it
//! (Prometheus: `storage.tsdb.out_of_order_time_window`, at least as long).

pub mod eval;
pub mod export;
pub mod remote_write;
pub mod rule;

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::StreamExt;

use kiln_metastore::{Exports, Metastore, MetastoreError, RuleRecord, RuleSample};
use kiln_model::error::ErrorKind;
use kiln_model::time::now_ms;
use kiln_query::select::SelectRequest;
use kiln_query::{Querier, QueryError};
use kiln_storage::Dataset;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::eval::{evaluate, series_key, Prepared, StepSums, Window};
use crate::export::{
    Destination, Exporter, ExporterMetrics, FailureLabels, Latest, METRICS_TARGET,
};
use crate::remote_write::{RemoteWriteConfig, RemoteWriter};
use crate::rule::{CompiledRule, RuleError, RuleSpec};

/// The ingester's and the compactor's hook (kiln-ingest's and kiln-compactor's
/// `RuleHook` have this shape).
pub type Hook = Arc<dyn Fn(&[RuleRecord], &Dataset) -> Exports + Send + Sync>;

/// How samples are cut and sent (`rule_export:` in the config file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExportSettings {
    /// Width of a sample's step; timestamps are step starts (multiples of it).
    pub step_ms: i64,
    /// A step is sent this long after it ends, so that most of its profiles are in its
    /// one sample; later ones add a sample, sent at the next poll. A profile is counted
    /// as its segment is registered: on a single node within
    /// `wal_rules_segment_interval_ms` (5 s) of its write, in a cluster within a flush
    /// (0.5 s). A profile lasting `d` thus reaches the receiver within `step_ms` +
    /// `delay_ms` − `d` of its end in its step's sample, or within that interval and a
    /// `poll_ms` in a later one: 12 s for the SDKs' and the agent's 10 s profiles.
    pub delay_ms: i64,
    /// Data this much later than its step's end is dropped (and counted); the receiver's
    /// out-of-order window must be at least this long.
    pub late_window_ms: i64,
    /// Samples per remote-write request.
    pub batch_samples: usize,
    /// Pause between two looks at an empty outbox.
    pub poll_ms: u64,
}

impl Default for ExportSettings {
    fn default() -> Self {
        ExportSettings {
            step_ms: 15_000,
            delay_ms: 6_000,
            late_window_ms: 3_600_000,
            batch_samples: 5_000,
            poll_ms: 1_000,
        }
    }
}

#[derive(Debug, Error)]
pub enum RulesError {
    #[error(transparent)]
    Invalid(#[from] RuleError),
    #[error("no recording rule {0:?}")]
    NotFound(String),
    #[error(
        "recording rule {0:?} comes from the config file and is read-only here; change it there"
    )]
    ReadOnly(String),
    #[error("recording rule {0:?} exists already; PUT /api/v1/recording-rules/{0} updates it")]
    Exists(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Overlap(String),
    #[error("stored recording rule {name:?} is unreadable: {source}")]
    Stored {
        name: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("metastore: {0}")]
    Metastore(#[source] MetastoreError),
    #[error("reading profiles: {0}")]
    Query(#[from] QueryError),
    #[error("remote write client for {url}: {source}")]
    Client {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("remote write {url}: tls_config: cannot read ca_file {}: {source}", path.display())]
    CaFile {
        url: String,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("rule evaluation task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

impl From<MetastoreError> for RulesError {
    fn from(err: MetastoreError) -> Self {
        match err {
            MetastoreError::Conflict(message) => RulesError::Overlap(message),
            other => RulesError::Metastore(other),
        }
    }
}

impl RulesError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            RulesError::Invalid(_) | RulesError::BadRequest(_) => ErrorKind::Malformed,
            RulesError::NotFound(_) => ErrorKind::NotFound,
            RulesError::ReadOnly(_) | RulesError::Exists(_) | RulesError::Overlap(_) => {
                ErrorKind::Conflict
            }
            RulesError::Query(err) => err.kind(),
            RulesError::Stored { .. }
            | RulesError::Metastore(_)
            | RulesError::Client { .. }
            | RulesError::CaFile { .. }
            | RulesError::Task(_) => ErrorKind::Internal,
        }
    }
}

/// A rule as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RuleView {
    #[serde(flatten)]
    pub spec: RuleSpec,
    /// `file` (read-only here) or `api`.
    pub source: String,
    /// Profiles from this time on (ms) are exported as they arrive; earlier ones only by
    /// a backfill.
    pub live_from_ms: i64,
    pub updated_at_ms: i64,
}

/// What a preview shows: the series the rule would export over a window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Preview {
    pub step_ms: i64,
    pub from_ms: i64,
    pub until_ms: i64,
    pub series: Vec<PreviewSeries>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PreviewSeries {
    pub labels: BTreeMap<String, String>,
    /// (step start in ms, value).
    pub points: Vec<(i64, i64)>,
}

/// What a backfill exported.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BackfillReport {
    pub rule: String,
    pub from_ms: i64,
    pub until_ms: i64,
    pub series: usize,
    pub samples: usize,
    /// Sum of every sample's value.
    pub total: i64,
}

/// Where the rules come from and where samples go.
#[derive(Debug, Clone, Default)]
pub struct RulesConfig {
    pub recording_rules: Vec<RuleSpec>,
    pub remote_write: Vec<RemoteWriteConfig>,
    pub settings: ExportSettings,
    /// Tenant of file rules that name none.
    pub default_tenant: String,
    /// This node's name (host and listen address): it holds the senders' leases.
    pub node: String,
}

pub const SOURCE_FILE: &str = "file";
pub const SOURCE_API: &str = "api";

/// The rules of every tenant: definitions, evaluation, preview, backfill and export.
#[derive(Clone)]
pub struct Rules {
    metastore: Metastore,
    querier: Querier,
    config: Arc<RulesConfig>,
    metrics: ExporterMetrics,
    latest: Arc<Latest>,
}

impl Rules {
    /// Checks every file rule; the first mistake is the error (it names rule and field).
    pub fn new(
        metastore: Metastore,
        querier: Querier,
        config: RulesConfig,
    ) -> Result<Self, RulesError> {
        let mut names = std::collections::HashSet::new();
        for spec in &config.recording_rules {
            spec.compile()?;
            let tenant = spec
                .tenant
                .clone()
                .unwrap_or_else(|| config.default_tenant.clone());
            if !names.insert((tenant, spec.metric_name.clone())) {
                return Err(RuleError {
                    rule: spec.metric_name.clone(),
                    field: "metric_name",
                    message: "two rules of one tenant have this name".into(),
                }
                .into());
            }
        }
        for target in &config.remote_write {
            target.check().map_err(RulesError::BadRequest)?;
        }
        Ok(Rules {
            metastore,
            querier,
            config: Arc::new(config),
            metrics: ExporterMetrics::default(),
            latest: Arc::new(Latest::default()),
        })
    }

    pub fn settings(&self) -> &ExportSettings {
        &self.config.settings
    }

    pub fn register(&self, registry: &mut Registry) {
        self.metrics.register(registry);
    }

    /// The newest value of every series, for `/metrics`.
    pub fn render_latest(&self, out: &mut String) {
        self.latest.render(out);
    }

    /// The outboxes a tenant's samples go to: the local one behind `/metrics`, then each
    /// remote-write URL that takes the tenant.
    pub fn targets(&self, tenant: &str) -> Vec<String> {
        targets_for(&self.config, tenant)
    }

    /// A rule as stored, saved `now`; `live_from` counts only for a new rule (an update
    /// keeps the stored one).
    fn record(&self, tenant: &str, spec: &RuleSpec, source: &str, now: i64) -> RuleRecord {
        let step = self.config.settings.step_ms.max(1);
        RuleRecord {
            tenant: tenant.to_string(),
            name: spec.metric_name.clone(),
            spec: to_json(spec),
            source: source.into(),
            live_from_ms: (now + step - 1).div_euclid(step) * step,
            updated_at_ms: now,
        }
    }

    /// Stores the file's rules (read-only through the API) and forgets file rules no
    /// longer in the file.
    pub async fn sync_file_rules(&self) -> Result<(), RulesError> {
        let now = now_ms();
        let mut kept = std::collections::HashSet::new();
        for spec in &self.config.recording_rules {
            let tenant = spec
                .tenant
                .clone()
                .unwrap_or_else(|| self.config.default_tenant.clone());
            let mut stored = spec.clone();
            stored.tenant = None;
            self.metastore
                .put_recording_rule(self.record(&tenant, &stored, SOURCE_FILE, now))
                .await?;
            kept.insert((tenant, spec.metric_name.clone()));
        }
        for record in self.metastore.recording_rules(None).await? {
            if record.source == SOURCE_FILE
                && !kept.contains(&(record.tenant.clone(), record.name.clone()))
            {
                self.metastore
                    .delete_recording_rule(&record.tenant, &record.name)
                    .await?;
                tracing::info!(tenant = %record.tenant, rule = %record.name, "recording rule no longer in the config file: removed");
            }
        }
        Ok(())
    }

    pub async fn list(&self, tenant: &str) -> Result<Vec<RuleView>, RulesError> {
        self.metastore
            .recording_rules(Some(tenant.to_string()))
            .await?
            .into_iter()
            .map(view)
            .collect()
    }

    pub async fn get(&self, tenant: &str, name: &str) -> Result<RuleView, RulesError> {
        self.list(tenant)
            .await?
            .into_iter()
            .find(|rule| rule.spec.metric_name == name)
            .ok_or_else(|| RulesError::NotFound(name.to_string()))
    }

    async fn stored(&self, tenant: &str, name: &str) -> Result<Option<RuleRecord>, RulesError> {
        Ok(self
            .metastore
            .recording_rules(Some(tenant.to_string()))
            .await?
            .into_iter()
            .find(|record| record.name == name))
    }

    /// Creates (`create`: refused when it exists) or updates a rule through the API.
    pub async fn save(
        &self,
        tenant: &str,
        mut spec: RuleSpec,
        create: bool,
    ) -> Result<RuleView, RulesError> {
        if spec.tenant.as_deref().is_some_and(|named| named != tenant) {
            return Err(RulesError::BadRequest(format!(
                "recording rule {:?}: tenant: the API takes the tenant from X-Scope-OrgID ({tenant:?}), not from the rule",
                spec.metric_name
            )));
        }
        spec.tenant = None;
        spec.compile()?;
        match self.stored(tenant, &spec.metric_name).await? {
            Some(existing) if existing.source == SOURCE_FILE => {
                return Err(RulesError::ReadOnly(spec.metric_name))
            }
            Some(_) if create => return Err(RulesError::Exists(spec.metric_name)),
            _ => {}
        }
        let record = self
            .metastore
            .put_recording_rule(self.record(tenant, &spec, SOURCE_API, now_ms()))
            .await?;
        view(record)
    }

    pub async fn delete(&self, tenant: &str, name: &str) -> Result<(), RulesError> {
        match self.stored(tenant, name).await? {
            None => Err(RulesError::NotFound(name.to_string())),
            Some(record) if record.source == SOURCE_FILE => {
                Err(RulesError::ReadOnly(name.to_string()))
            }
            Some(_) => {
                self.metastore.delete_recording_rule(tenant, name).await?;
                Ok(())
            }
        }
    }

    /// Per-step sums of `rule` over the stored profiles with times in `[from, until)`.
    async fn sums_over_stored(
        &self,
        tenant: &str,
        rule: &CompiledRule,
        from_ms: i64,
        until_ms: i64,
    ) -> Result<StepSums, RulesError> {
        let request = SelectRequest {
            tenant: tenant.to_string(),
            types: rule.types.clone(),
            selector: rule.selector.clone(),
            from_nanos: from_ms.saturating_mul(1_000_000),
            to_nanos: until_ms.saturating_mul(1_000_000).saturating_sub(1),
            ..SelectRequest::default()
        };
        // One listing: every profile is in exactly one live dataset at that moment, so
        // concurrent compaction cannot make it count twice or not at all.
        let metas = self.querier.datasets(&request).await?;
        let window = Window {
            from_ms,
            until_ms,
            step_ms: self.config.settings.step_ms,
        };
        let parts = metas.into_iter().map(|meta| {
            let rule = rule.clone();
            async move {
                let dataset = self.querier.load(&meta).await?;
                let part = tokio::task::spawn_blocking(move || {
                    let mut part = StepSums::new();
                    evaluate(&rule, &Prepared::new(&dataset), window, &mut part);
                    part
                })
                .await?;
                Ok::<_, RulesError>(part)
            }
        });
        // A few datasets in flight per core, as queries read them: a week's backfill uses
        // every core without holding every decoded dataset at once.
        let in_flight = 2 * kiln_runtime::priority::cores();
        let mut parts = futures_util::stream::iter(parts).buffer_unordered(in_flight);
        let mut sums = StepSums::new();
        while let Some(part) = parts.next().await {
            for (key, value) in part? {
                let slot = sums.entry(key).or_insert(0);
                *slot = slot.saturating_add(value);
            }
        }
        Ok(sums)
    }

    /// The series `spec` would export over `[from, until)`, from stored profiles, computed
    /// as export computes them.
    pub async fn preview(
        &self,
        tenant: &str,
        spec: &RuleSpec,
        from_ms: i64,
        until_ms: i64,
    ) -> Result<Preview, RulesError> {
        let rule = spec.compile()?;
        if until_ms <= from_ms {
            return Err(RulesError::BadRequest(
                "preview: until must be after from".into(),
            ));
        }
        if until_ms - from_ms > 7 * 86_400_000 {
            return Err(RulesError::BadRequest(
                "preview: at most 7 days at once".into(),
            ));
        }
        let sums = self
            .sums_over_stored(tenant, &rule, from_ms, until_ms)
            .await?;
        let mut series: BTreeMap<eval::SeriesLabels, Vec<(i64, i64)>> = BTreeMap::new();
        for ((labels, step), value) in sums {
            series.entry(labels).or_default().push((step, value));
        }
        Ok(Preview {
            step_ms: self.config.settings.step_ms,
            from_ms,
            until_ms,
            series: series
                .into_iter()
                .map(|(labels, points)| PreviewSeries {
                    labels: labels.into_iter().collect(),
                    points,
                })
                .collect(),
        })
    }

    /// Exports `name` over stored profiles in `[from, until)`, both rounded down to a step
    /// and `until` capped at the rule's `live_from` (profiles from then on are exported
    /// live). Each range once: an overlapping backfill is refused.
    pub async fn backfill(
        &self,
        tenant: &str,
        name: &str,
        from_ms: i64,
        until_ms: i64,
    ) -> Result<BackfillReport, RulesError> {
        let record = self
            .stored(tenant, name)
            .await?
            .ok_or_else(|| RulesError::NotFound(name.to_string()))?;
        let spec: RuleSpec =
            serde_json::from_str(&record.spec).map_err(|source| RulesError::Stored {
                name: name.to_string(),
                source,
            })?;
        let rule = spec.compile()?;
        let step = self.config.settings.step_ms.max(1);
        let from = from_ms.div_euclid(step) * step;
        let until = (until_ms.div_euclid(step) * step).min(record.live_from_ms);
        if until <= from {
            return Err(RulesError::BadRequest(format!(
                "nothing to backfill: rule {name:?} exports profiles from {} ms on as they arrive, and [{from}, {until}) is empty",
                record.live_from_ms
            )));
        }
        let sums = self.sums_over_stored(tenant, &rule, from, until).await?;
        let mut series = std::collections::HashSet::new();
        let mut total = 0i64;
        let samples: Vec<RuleSample> = sums
            .into_iter()
            .map(|((labels, step_start_ms), value)| {
                total = total.saturating_add(value);
                let key = series_key(&labels);
                series.insert(key.clone());
                RuleSample {
                    tenant: tenant.to_string(),
                    rule: name.to_string(),
                    series: key,
                    step_start_ms,
                    step_ms: step,
                    value,
                }
            })
            .collect();
        let report = BackfillReport {
            rule: name.to_string(),
            from_ms: from,
            until_ms: until,
            series: series.len(),
            samples: samples.len(),
            total,
        };
        self.metastore
            .record_backfill(
                tenant,
                name,
                from,
                until,
                Exports {
                    targets: self.targets(tenant),
                    samples,
                },
            )
            .await?;
        tracing::info!(
            tenant,
            rule = name,
            from,
            until,
            samples = report.samples,
            "recording rule backfilled"
        );
        Ok(report)
    }

    /// The compactor's hook: the samples of `records` over one level-0 dataset, counting
    /// each rule's profiles from its `live_from` on.
    pub fn hook(&self) -> Hook {
        let config = self.config.clone();
        let metrics = self.metrics.clone();
        let cache = Arc::new(RuleCache::default());
        Arc::new(move |records: &[RuleRecord], dataset: &Dataset| {
            // A job is one tenant's: its samples go to that tenant's targets.
            let targets = targets_for(&config, &dataset.tenant);
            let settings = &config.settings;
            let too_late_before = now_ms() - settings.late_window_ms;
            let (samples, too_late) =
                job_samples(&cache, records, dataset, settings.step_ms, too_late_before);
            if too_late > 0 {
                for target in &targets {
                    metrics
                        .failed
                        .get_or_create(&FailureLabels {
                            target: target.clone(),
                            reason: "too_late".into(),
                        })
                        .inc_by(too_late);
                }
            }
            Exports { targets, samples }
        })
    }

    /// Starts one exporter per target; they stop when `stop` fires.
    pub fn spawn(
        &self,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> Result<Vec<tokio::task::JoinHandle<()>>, RulesError> {
        let mut tasks = Vec::new();
        let local = Exporter {
            target: METRICS_TARGET.into(),
            node: self.config.node.clone(),
            destination: Destination::Local(self.latest.clone()),
            metastore: self.metastore.clone(),
            settings: self.config.settings.clone(),
            metrics: self.metrics.clone(),
        };
        tasks.push(tokio::spawn(local.run(stop.clone())));
        for target in &self.config.remote_write {
            let writer = RemoteWriter::new(target.clone())?;
            let exporter = Exporter {
                target: target.url.clone(),
                node: self.config.node.clone(),
                destination: Destination::Remote(Box::new(writer)),
                metastore: self.metastore.clone(),
                settings: self.config.settings.clone(),
                metrics: self.metrics.clone(),
            };
            tasks.push(tokio::spawn(exporter.run(stop.clone())));
        }
        Ok(tasks)
    }
}

/// Rules compiled once per stored definition: a service's level-0 job comes every few
/// seconds, and parsing every rule's JSON and compiling its regexes for each one was most
/// of a small job's rule cost (`kiln bench rules --services 500`).
#[derive(Default)]
pub struct RuleCache {
    compiled: std::sync::Mutex<std::collections::HashMap<String, Arc<CompiledRule>>>,
}

/// Definitions kept compiled; past this many (rules edited over a long uptime) the cache
/// starts over.
const RULE_CACHE_ENTRIES: usize = 10_000;

impl RuleCache {
    pub fn compiled(&self, spec: &str) -> Result<Arc<CompiledRule>, String> {
        if let Some(rule) = self.compiled.lock().ok().and_then(|c| c.get(spec).cloned()) {
            return Ok(rule);
        }
        let rule = serde_json::from_str::<RuleSpec>(spec)
            .map_err(|err| err.to_string())
            .and_then(|spec| spec.compile().map_err(|err| err.to_string()))?;
        let rule = Arc::new(rule);
        if let Ok(mut compiled) = self.compiled.lock() {
            if compiled.len() >= RULE_CACHE_ENTRIES {
                compiled.clear();
            }
            compiled.insert(spec.to_string(), rule.clone());
        }
        Ok(rule)
    }
}

/// What a level-0 job exports for one input dataset: each rule's per-step sums of the
/// profiles from its `live_from` on; and how many were dropped as later than
/// `too_late_before_ms` (their steps may already be pruned from the outbox).
pub fn job_samples(
    cache: &RuleCache,
    records: &[RuleRecord],
    dataset: &Dataset,
    step_ms: i64,
    too_late_before_ms: i64,
) -> (Vec<RuleSample>, u64) {
    let step = step_ms.max(1);
    let prepared = Prepared::new(dataset);
    let (mut samples, mut too_late) = (Vec::new(), 0);
    for record in records {
        let rule = match cache.compiled(&record.spec) {
            Ok(rule) => rule,
            Err(err) => {
                tracing::warn!(tenant = %record.tenant, rule = %record.name, error = %err, "stored recording rule skipped");
                continue;
            }
        };
        let mut sums = StepSums::new();
        let window = Window {
            from_ms: record.live_from_ms,
            until_ms: i64::MAX,
            step_ms: step,
        };
        evaluate(&rule, &prepared, window, &mut sums);
        for ((labels, step_start_ms), value) in sums {
            if step_start_ms + step <= too_late_before_ms {
                too_late += 1;
                continue;
            }
            samples.push(RuleSample {
                tenant: record.tenant.clone(),
                rule: record.name.clone(),
                series: series_key(&labels),
                step_start_ms,
                step_ms: step,
                value,
            });
        }
    }
    (samples, too_late)
}

fn targets_for(config: &RulesConfig, tenant: &str) -> Vec<String> {
    std::iter::once(METRICS_TARGET.to_string())
        .chain(
            config
                .remote_write
                .iter()
                .filter(|target| target.takes(tenant))
                .map(|target| target.url.clone()),
        )
        .collect()
}

fn to_json(spec: &RuleSpec) -> String {
    // A RuleSpec is strings, lists and maps of strings: serializing cannot fail.
    serde_json::to_string(spec).unwrap_or_default()
}

fn view(record: RuleRecord) -> Result<RuleView, RulesError> {
    let spec: RuleSpec =
        serde_json::from_str(&record.spec).map_err(|source| RulesError::Stored {
            name: record.name.clone(),
            source,
        })?;
    Ok(RuleView {
        spec,
        source: record.source,
        live_from_ms: record.live_from_ms,
        updated_at_ms: record.updated_at_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receiver_limited_to_tenants_gets_only_theirs() {
        let target = |url: &str, tenants: &[&str]| RemoteWriteConfig {
            url: url.into(),
            headers: Default::default(),
            basic_auth: None,
            authorization: None,
            tls_config: None,
            tenants: tenants.iter().map(|t| t.to_string()).collect(),
        };
        let config = RulesConfig {
            remote_write: vec![
                target("http://shared/w", &[]),
                target("http://team-a/w", &["team-a"]),
            ],
            ..RulesConfig::default()
        };
        assert_eq!(
            targets_for(&config, "team-a"),
            vec!["metrics", "http://shared/w", "http://team-a/w"]
        );
        assert_eq!(
            targets_for(&config, "team-b"),
            vec!["metrics", "http://shared/w"]
        );
    }
}
