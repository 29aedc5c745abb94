//! The regression watcher: after each deploy, compare the new version with the previous
//! one and record what changed significantly.
//!
//! Every `interval_ms`, for each tenant and each service with data from `lookback_ms` to
//! `settle_ms` ago, it reads which values of the version labels (`version`,
//! `service_version`, `service_git_ref` by default; the first one a series has counts)
//! each profile type's series carry, and when each was first and last seen. The value
//! first seen last is the new version; of the others, the one seen last is the previous.
//! Once the new version has `min_profiles` profiles and one past its first `window_ms`
//! (longer when either version needs more time for `min_profiles`) is stored, that window
//! is compared with the previous version's last window of the same length
//! ([`crate::compare`], same profile type, the
//! selectors differing only in the version label) and the significant changes are
//! recorded with the check, in one metastore transaction. A version is checked once:
//! the check's row is its key, so several watchers (one per node) record it once, and a
//! restart does not check it again. Findings go to `/metrics`
//! (`kiln_regressions_detected_total`) and, when configured, to a webhook as JSON.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kiln_metastore::{DatasetMeta, RegressionRecord, VersionCheck};
use kiln_model::labels::{Labels, SERVICE_NAME};
use kiln_model::time::now_ms;
use kiln_query::request::label_selector;
use kiln_query::select::{SelectRequest, TypeFilter};
use kiln_query::Querier;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};

use crate::compare::{comparison, side_sums, Side};
use crate::stats::Method;
use crate::InsightError;

/// `regressions:` in the config file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegressionsConfig {
    pub enabled: bool,
    /// Labels that carry a service's version, in order of preference.
    pub version_labels: Vec<String>,
    /// Pause between two looks for new versions.
    pub interval_ms: u64,
    /// How far back a look reads series to find versions.
    pub lookback_ms: i64,
    /// A look reads up to this long ago, not up to now. Datasets written since are
    /// still level 0, which compaction replaces within seconds: under load a look that
    /// read up to now read every dataset flushed since the last look (40,000 a minute at
    /// 1,000 clients) to see them once, where the blocks they are merged into hold the
    /// same profiles in a few hundred (docs/benchmarks.md). Their profiles count in the
    /// next looks; a new version is checked this much later.
    pub settle_ms: i64,
    /// Length of each side of the comparison; a new version is compared once it has a
    /// profile past this long after its first.
    pub window_ms: i64,
    /// Profiles each side needs; fewer, and the check records a refusal, not findings.
    pub min_profiles: u64,
    /// Family-wise error rate of one check.
    pub alpha: f64,
    /// Each finding is POSTed here as JSON, when set.
    pub webhook_url: Option<String>,
}

impl Default for RegressionsConfig {
    fn default() -> Self {
        RegressionsConfig {
            enabled: true,
            version_labels: vec![
                "version".into(),
                "service_version".into(),
                "service_git_ref".into(),
            ],
            interval_ms: 60_000,
            lookback_ms: 2 * 3_600_000,
            settle_ms: 60_000,
            window_ms: 15 * 60_000,
            min_profiles: 12,
            alpha: Method::default().alpha,
            webhook_url: None,
        }
    }
}

/// One significant change after a deploy, as the API lists it and the webhook posts it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub tenant: String,
    pub service: String,
    pub profile_type: String,
    pub version_label: String,
    pub old_version: String,
    pub new_version: String,
    pub function: String,
    /// `increase` (a regression) or `decrease`.
    pub change: String,
    pub left_share: f64,
    pub right_share: f64,
    pub delta_share: f64,
    pub left_value: i64,
    pub right_value: i64,
    pub p_value: f64,
    pub p_adjusted: f64,
    pub confidence: f64,
    /// The windows compared: the old version's, then the new one's (ms, `[from, until)`).
    pub left: Window,
    pub right: Window,
    pub detected_at: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Window {
    pub from: i64,
    pub until: i64,
    pub profiles: u64,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ChangeLabels {
    change: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

#[derive(Clone, Default)]
struct WatchMetrics {
    detected: Family<ChangeLabels, Counter>,
    checks: Family<OutcomeLabels, Counter>,
    webhook_failures: Counter,
    datasets_read: Counter,
    /// Counted when a look ends, so that a reader of `datasets_read` can tell a quiet
    /// moment from a look still reading.
    looks: Counter,
}

/// A version: (profile type, version label, value).
type VersionKey = (String, String, String);

/// A dataset: (object key, row group).
type DatasetKey = (String, u32);

/// One dataset's profile times (ns) per version.
type Summary = Vec<(VersionKey, Vec<i64>)>;

/// When a version was seen in the lookback.
#[derive(Debug, Clone)]
struct Seen {
    /// Profile times in ms, sorted.
    times: Vec<i64>,
}

impl Seen {
    fn first_ms(&self) -> i64 {
        self.times.first().copied().unwrap_or(0)
    }

    fn last_ms(&self) -> i64 {
        self.times.last().copied().unwrap_or(0)
    }
}

pub struct Watcher {
    querier: Querier,
    config: RegressionsConfig,
    metrics: WatchMetrics,
    client: reqwest::Client,
    /// Per dataset (object key, row group): its summary and the last look that used it.
    summaries: Mutex<HashMap<DatasetKey, (Arc<Summary>, u64)>>,
    looks: AtomicU64,
    /// Which (tenant, service) this node watches, when several rules nodes share them.
    owner: std::sync::OnceLock<Owner>,
}

/// Whether this node watches (tenant, service): rules nodes share the services by
/// rendezvous hashing over the live ones, so each is watched once.
pub type Owner = Arc<dyn Fn(&str, &str) -> bool + Send + Sync>;

impl Watcher {
    pub fn new(querier: Querier, config: RegressionsConfig) -> Result<Self, InsightError> {
        if let Some(url) = &config.webhook_url {
            let parsed = reqwest::Url::parse(url).map_err(|err| {
                InsightError::BadRequest(format!("regressions.webhook_url {url:?}: {err}"))
            })?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(InsightError::BadRequest(format!(
                    "regressions.webhook_url {url:?}: expected an http or https URL"
                )));
            }
        }
        if config.window_ms <= 0 || config.lookback_ms < config.window_ms {
            return Err(InsightError::BadRequest(format!(
                "regressions: window_ms ({}) must be positive and at most lookback_ms ({})",
                config.window_ms, config.lookback_ms
            )));
        }
        if config.settle_ms < 0 || config.settle_ms >= config.lookback_ms {
            return Err(InsightError::BadRequest(format!(
                "regressions: settle_ms ({}) must be at least 0 and under lookback_ms ({})",
                config.settle_ms, config.lookback_ms
            )));
        }
        if !(config.alpha > 0.0 && config.alpha <= 0.5) || config.min_profiles < 2 {
            return Err(InsightError::BadRequest(format!(
                "regressions: alpha must be in (0, 0.5] (is {}) and min_profiles at least 2 (is {})",
                config.alpha, config.min_profiles
            )));
        }
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(InsightError::Client)?;
        Ok(Watcher {
            querier,
            config,
            metrics: WatchMetrics::default(),
            client,
            summaries: Mutex::new(HashMap::new()),
            looks: AtomicU64::new(0),
            owner: std::sync::OnceLock::new(),
        })
    }

    /// Watches only the services `owner` gives this node, asked again at every look, so
    /// services move when the rules nodes change. Set once; later calls are ignored.
    pub fn share(&self, owner: Owner) {
        let _ = self.owner.set(owner);
    }

    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kiln_regressions_detected",
            "Significant changes found by comparing a service's new version with its previous one",
            self.metrics.detected.clone(),
        );
        registry.register(
            "kiln_regressions_version_checks",
            "New versions compared with their previous one, by outcome (findings, none, refused)",
            self.metrics.checks.clone(),
        );
        registry.register(
            "kiln_regressions_datasets_read",
            "Datasets whose series and profile rows the watcher read (each once while it stays in the lookback)",
            self.metrics.datasets_read.clone(),
        );
        registry.register(
            "kiln_regressions_looks",
            "Looks for new versions completed",
            self.metrics.looks.clone(),
        );
        registry.register(
            "kiln_regressions_webhook_failures",
            "Findings the webhook did not accept after retries (they stay listed by the API)",
            self.metrics.webhook_failures.clone(),
        );
    }

    /// Looks every `interval_ms` until `stop` turns true.
    pub fn spawn(
        self: Arc<Self>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            if !self.config.enabled {
                return;
            }
            let interval = Duration::from_millis(self.config.interval_ms.max(100));
            loop {
                if let Err(err) = self.look(now_ms()).await {
                    tracing::warn!(error = %err, "regression watcher");
                }
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = stop.changed() => return,
                }
                if *stop.borrow() {
                    return;
                }
            }
        })
    }

    /// One look over every tenant and service; returns the findings recorded.
    pub async fn look(&self, now_ms: i64) -> Result<Vec<Finding>, InsightError> {
        let metastore = self.querier.metastore();
        let (from_nanos, to_nanos) = (
            (now_ms - self.config.lookback_ms).saturating_mul(1_000_000),
            // Every profile up to here is in the datasets listed (their ranges overlap
            // it), so a window that ends before it is complete.
            (now_ms - self.config.settle_ms).saturating_mul(1_000_000),
        );
        let look = self.looks.fetch_add(1, Ordering::Relaxed) + 1;
        let started = std::time::Instant::now();
        let read_before = self.metrics.datasets_read.get();
        let mut found = Vec::new();
        for tenant in metastore.tenants().await? {
            // One listing per tenant, not one per service.
            let request = SelectRequest {
                tenant: tenant.clone(),
                types: TypeFilter::Any,
                from_nanos,
                to_nanos,
                ..Default::default()
            };
            let mut metas = self.querier.datasets(&request).await?;
            if let Some(owner) = self.owner.get() {
                metas.retain(|meta| owner(&tenant, &meta.service));
            }
            let summaries = self.summaries_of(&metas, look).await?;
            let mut services: BTreeMap<&str, Vec<Arc<Summary>>> = BTreeMap::new();
            for (meta, summary) in metas.iter().zip(summaries) {
                services.entry(&meta.service).or_default().push(summary);
            }
            for (service, summaries) in services {
                let seen = versions(&summaries, from_nanos, to_nanos);
                match self.look_at(&tenant, service, now_ms, seen).await {
                    Ok(findings) => found.extend(findings),
                    Err(err) => {
                        tracing::warn!(tenant, service, error = %err, "regression check failed")
                    }
                }
            }
        }
        // Datasets this look did not list were compacted away or left the lookback.
        if let Ok(mut summaries) = self.summaries.lock() {
            summaries.retain(|_, (_, used)| *used == look);
        }
        self.metrics.looks.inc();
        tracing::debug!(
            look,
            datasets_read = self.metrics.datasets_read.get() - read_before,
            findings = found.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "regression look"
        );
        Ok(found)
    }

    /// Each dataset's profile times per version, in `metas`' order: read once (datasets
    /// never change) and kept while looks still list the dataset. Those not read before
    /// are read by object, each object fetched once for all its datasets.
    async fn summaries_of(
        &self,
        metas: &[DatasetMeta],
        look: u64,
    ) -> Result<Vec<Arc<Summary>>, InsightError> {
        let key = |meta: &DatasetMeta| (meta.object_key.clone(), meta.row_group);
        let mut missing: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
        if let Ok(mut summaries) = self.summaries.lock() {
            for meta in metas {
                match summaries.get_mut(&key(meta)) {
                    Some((_, used)) => *used = look,
                    None => missing
                        .entry(meta.object_key.as_str())
                        .or_default()
                        .push(meta.row_group),
                }
            }
        }
        let version_labels = self.config.version_labels.clone();
        let derive: Arc<dyn Fn(&kiln_storage::Dataset) -> Summary + Send + Sync> =
            Arc::new(move |dataset| summarize(dataset, &version_labels));
        // One object at a time: a look is background work once a minute, and each object
        // read holds its bytes and its decoded strings table; four at once lifted a
        // 1,000-client server by 100-160 MiB for a moment at each look
        // (docs/benchmarks.md).
        let mut read: Vec<Vec<Summary>> = Vec::with_capacity(missing.len());
        for (object, row_groups) in &missing {
            read.push(
                self.querier
                    .derive_from_indexes(object, row_groups, derive.clone())
                    .await?,
            );
        }
        let mut summaries = self.summaries.lock().map_err(|_| InsightError::Poisoned)?;
        for ((object, row_groups), read) in missing.iter().zip(read) {
            for (row_group, summary) in row_groups.iter().zip(read) {
                self.metrics.datasets_read.inc();
                summaries.insert((object.to_string(), *row_group), (Arc::new(summary), look));
            }
        }
        Ok(metas
            .iter()
            .filter_map(|meta| {
                summaries
                    .get(&key(meta))
                    .map(|(summary, _)| summary.clone())
            })
            .collect())
    }

    async fn look_at(
        &self,
        tenant: &str,
        service: &str,
        now_ms: i64,
        seen: HashMap<VersionKey, Seen>,
    ) -> Result<Vec<Finding>, InsightError> {
        let mut groups: HashMap<(String, String), Vec<(String, Seen)>> = HashMap::new();
        for ((profile_type, label, value), entry) in seen {
            groups
                .entry((profile_type, label))
                .or_default()
                .push((value, entry));
        }
        let mut found = Vec::new();
        let mut groups: Vec<_> = groups.into_iter().collect();
        groups.sort_by(|a, b| a.0.cmp(&b.0));
        for ((profile_type, label), mut versions) in groups {
            if versions.len() < 2 {
                continue;
            }
            versions.sort_by(|a, b| {
                a.1.first_ms()
                    .cmp(&b.1.first_ms())
                    .then_with(|| a.0.cmp(&b.0))
            });
            let Some((new_version, new_seen)) = versions.pop() else {
                continue;
            };
            let Some((old_version, old_seen)) = versions.into_iter().max_by(|a, b| {
                a.1.last_ms()
                    .cmp(&b.1.last_ms())
                    .then_with(|| a.0.cmp(&b.0))
            }) else {
                continue;
            };
            let Some(window) = comparison_window(&new_seen, &old_seen, &self.config) else {
                continue;
            };
            let new_first_ms = new_seen.first_ms();
            let old_until_ms = old_seen.last_ms() + 1;
            let metastore = self.querier.metastore();
            if metastore
                .version_checked(tenant, service, &profile_type, &label, &new_version)
                .await?
            {
                continue;
            }
            let side = |version: &str, from_ms: i64, until_ms: i64| -> Result<Side, InsightError> {
                let text = format!(
                    "{{{SERVICE_NAME}={}, {label}={}}}",
                    quote(service),
                    quote(version)
                );
                Ok(Side {
                    selector: label_selector(&text)?,
                    selector_text: text,
                    from_ms,
                    until_ms,
                })
            };
            let left = side(&old_version, old_until_ms - window, old_until_ms)?;
            let right = side(&new_version, new_first_ms, new_first_ms + window)?;
            let (left_sums, right_sums) = futures_util::future::try_join(
                side_sums(&self.querier, tenant, &profile_type, &left),
                side_sums(&self.querier, tenant, &profile_type, &right),
            )
            .await?;
            let method = Method {
                alpha: self.config.alpha,
                min_profiles: self.config.min_profiles,
            };
            let result = comparison(
                &profile_type,
                (&left, &left_sums),
                (&right, &right_sums),
                &method,
                0,
            );
            let detected_at = now_ms;
            let findings: Vec<Finding> = result
                .functions
                .iter()
                .filter(|change| change.significant)
                .map(|change| Finding {
                    tenant: tenant.to_string(),
                    service: service.to_string(),
                    profile_type: profile_type.clone(),
                    version_label: label.clone(),
                    old_version: old_version.clone(),
                    new_version: new_version.clone(),
                    function: change.name.clone(),
                    change: if change.delta_share > 0.0 {
                        "increase"
                    } else {
                        "decrease"
                    }
                    .into(),
                    left_share: change.left_share,
                    right_share: change.right_share,
                    delta_share: change.delta_share,
                    left_value: change.left_value,
                    right_value: change.right_value,
                    p_value: change.p_value.unwrap_or(1.0),
                    p_adjusted: change.p_adjusted.unwrap_or(1.0),
                    confidence: change.confidence.unwrap_or(0.0),
                    left: Window {
                        from: left.from_ms,
                        until: left.until_ms,
                        profiles: result.left.profiles,
                    },
                    right: Window {
                        from: right.from_ms,
                        until: right.until_ms,
                        profiles: result.right.profiles,
                    },
                    detected_at,
                })
                .collect();
            let (outcome, outcome_label) = match &result.refused {
                Some(reason) => (format!("refused: {reason}"), "refused"),
                None if findings.is_empty() => (
                    format!(
                        "no significant change among {} functions",
                        result.method.tested
                    ),
                    "none",
                ),
                None => (
                    format!(
                        "{} significant changes among {} functions",
                        findings.len(),
                        result.method.tested
                    ),
                    "findings",
                ),
            };
            let records = findings
                .iter()
                .map(|finding| RegressionRecord {
                    tenant: tenant.to_string(),
                    service: service.to_string(),
                    profile_type: profile_type.clone(),
                    version_label: label.clone(),
                    new_version: new_version.clone(),
                    function: finding.function.clone(),
                    detected_at_ms: detected_at,
                    finding: serde_json::to_string(finding).unwrap_or_default(),
                })
                .collect();
            let check = VersionCheck {
                tenant: tenant.to_string(),
                service: service.to_string(),
                profile_type: profile_type.clone(),
                version_label: label.clone(),
                new_version: new_version.clone(),
                old_version: old_version.clone(),
                checked_at_ms: detected_at,
                outcome: outcome.clone(),
            };
            if !metastore.record_version_check(check, records).await? {
                // Another node checked it first and reports it.
                continue;
            }
            tracing::info!(
                tenant,
                service,
                profile_type,
                old_version,
                new_version,
                outcome,
                "compared a new version with the previous one"
            );
            self.metrics
                .checks
                .get_or_create(&OutcomeLabels {
                    outcome: outcome_label.into(),
                })
                .inc();
            for finding in &findings {
                self.metrics
                    .detected
                    .get_or_create(&ChangeLabels {
                        change: finding.change.clone(),
                    })
                    .inc();
                self.post(finding).await;
            }
            found.extend(findings);
        }
        Ok(found)
    }

    /// Sends one finding to the webhook: three tries, then it is counted as failed (the
    /// finding stays stored and listed).
    async fn post(&self, finding: &Finding) {
        let Some(url) = &self.config.webhook_url else {
            return;
        };
        let body = serde_json::to_vec(finding).unwrap_or_default();
        for attempt in 0..3u32 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(500 << attempt)).await;
            }
            let request = self
                .client
                .post(url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.clone());
            match request.send().await {
                Ok(response) if response.status().is_success() => return,
                Ok(response) => {
                    tracing::warn!(url, status = %response.status(), "regressions webhook refused a finding")
                }
                Err(err) => tracing::warn!(url, error = %err, "regressions webhook unreachable"),
            }
        }
        self.metrics.webhook_failures.inc();
    }
}

/// A dataset's profile times per version: the first of `version_labels` each series has.
fn summarize(dataset: &kiln_storage::Dataset, version_labels: &[String]) -> Summary {
    let keys: Vec<Option<VersionKey>> = dataset
        .series
        .iter()
        .map(|series| {
            let labels: Labels = dataset.series_labels(series);
            version_labels.iter().find_map(|name| {
                let value = labels.get(name).filter(|value| !value.is_empty())?;
                let profile_type = dataset.string(series.profile_type).to_string();
                Some((profile_type, name.clone(), value.to_string()))
            })
        })
        .collect();
    let mut times: HashMap<&VersionKey, Vec<i64>> = HashMap::new();
    for profile in &dataset.profiles {
        if let Some(Some(key)) = keys.get(profile.series as usize) {
            times.entry(key).or_default().push(profile.time_nanos);
        }
    }
    times
        .into_iter()
        .map(|(key, times)| (key.clone(), times))
        .collect()
}

/// One service's versions over `[from, to]` (ns), from its datasets' summaries.
fn versions(
    summaries: &[Arc<Summary>],
    from_nanos: i64,
    to_nanos: i64,
) -> HashMap<VersionKey, Seen> {
    let mut seen: HashMap<VersionKey, Seen> = HashMap::new();
    for (key, times) in summaries.iter().flat_map(|summary| summary.iter()) {
        let entry = seen
            .entry(key.clone())
            .or_insert_with(|| Seen { times: Vec::new() });
        entry.times.extend(
            times
                .iter()
                .filter(|time| (from_nanos..=to_nanos).contains(*time))
                .map(|time| time.div_euclid(1_000_000)),
        );
    }
    seen.retain(|_, entry| !entry.times.is_empty());
    for entry in seen.values_mut() {
        entry.times.sort_unstable();
    }
    seen
}

/// The length of both sides of a check, once the new version is ready for one: `None`
/// until it has `min_profiles` profiles and one past the window's end.
///
/// The window is `window_ms`, or longer where a version needs it to hold `min_profiles`
/// (a service that sends a profile a minute), at most `lookback_ms`. Profiles are
/// acknowledged in order, so once one past the end is stored the window's own are all in:
/// a check on the clock alone would compare a backfill, or a lagging ingest, half-way.
fn comparison_window(new: &Seen, old: &Seen, config: &RegressionsConfig) -> Option<i64> {
    let needed = config.min_profiles.max(1) as usize;
    if new.times.len() < needed {
        return None;
    }
    let new_first_ms = new.first_ms();
    let old_until_ms = old.last_ms() + 1;
    let mut window = config
        .window_ms
        .max(new.times[needed - 1] - new_first_ms + 1);
    if old.times.len() >= needed {
        window = window.max(old_until_ms - old.times[old.times.len() - needed]);
    }
    let window = window.min(config.lookback_ms);
    (new.last_ms() >= new_first_ms + window).then_some(window)
}

/// A label value as a selector's quoted string.
fn quote(value: &str) -> String {
    format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version seen at these times (ms).
    fn seen(times: &[i64]) -> Seen {
        Seen {
            times: times.to_vec(),
        }
    }

    fn config(window_ms: i64, min_profiles: u64) -> RegressionsConfig {
        RegressionsConfig {
            window_ms,
            min_profiles,
            lookback_ms: 3_600_000,
            ..Default::default()
        }
    }

    #[test]
    fn a_new_version_is_checked_once_its_window_is_complete() {
        // A profile every 10 s: 12 in the first 120 s.
        let old = seen(&(0..30).map(|i| i * 10_000).collect::<Vec<_>>());
        let every_10s =
            |count: i64| seen(&(0..count).map(|i| 400_000 + i * 10_000).collect::<Vec<_>>());
        assert_eq!(
            comparison_window(&every_10s(12), &old, &config(120_000, 10)),
            None,
            "none past the end yet"
        );
        assert_eq!(
            comparison_window(&every_10s(13), &old, &config(120_000, 10)),
            Some(120_000)
        );
        // Too few profiles in all: not checked, whatever the clock.
        assert_eq!(
            comparison_window(&every_10s(13), &old, &config(120_000, 20)),
            None
        );
    }

    #[test]
    fn sparse_versions_get_a_longer_window_of_one_length_for_both() {
        // A profile a minute: 10 profiles need 9 minutes and a millisecond.
        let minutely = |start: i64, count: i64| {
            seen(&(0..count).map(|i| start + i * 60_000).collect::<Vec<_>>())
        };
        let old = minutely(0, 20);
        assert_eq!(
            comparison_window(&minutely(2_000_000, 10), &old, &config(120_000, 10)),
            None
        );
        assert_eq!(
            comparison_window(&minutely(2_000_000, 11), &old, &config(120_000, 10)),
            Some(540_001)
        );
        // The old version, sparser still, stretches both sides.
        let old = seen(&(0..10).map(|i| i * 120_000).collect::<Vec<_>>());
        assert_eq!(
            comparison_window(&minutely(2_000_000, 30), &old, &config(120_000, 10)),
            Some(1_080_001)
        );
    }
}
