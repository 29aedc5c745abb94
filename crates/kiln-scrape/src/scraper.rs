//! The scrape loop: per job, discovery and relabeling decide the targets; per (target,
//! profile kind), one task fetches the profile every interval at a stable offset, checks
//! it is a pprof, turns cumulative profiles into deltas and hands it to the sink.
//!
//! Each target has its own task, so a slow or dead target only delays itself; a shared
//! semaphore bounds how many requests are in flight at once. Health per target is kept
//! for `GET /api/v1/targets` and `/metrics`.

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use kiln_model::pprof::Profile;
use tokio::sync::{watch, Semaphore};

use crate::config::ScrapeConfig;
use crate::delta::{Delta, DeltaState};
use crate::discovery::Discovery;
use crate::relabel::{relabel, LabelSet};
use crate::{ScrapeError, ScrapeFailure};

/// A profile taken from a target, with its final labels (`job`, `instance`,
/// `service_name` and whatever relabeling added; no `__` labels).
#[derive(Debug, Clone)]
pub struct ScrapedProfile {
    /// The job's tenant; the receiver's default when `None`.
    pub tenant: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// The profile kind (`process_cpu`, `memory`, …): the profile type name.
    pub kind: String,
    pub profile: Profile,
    pub time_nanos: i64,
    pub duration_nanos: i64,
}

pub type SinkFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// Where scraped profiles go: the in-process ingester, or a remote Kiln's push API.
pub type Sink = Arc<dyn Fn(ScrapedProfile) -> SinkFuture + Send + Sync>;

/// At most this many scrapes in flight at once, whatever the number of targets.
const MAX_CONCURRENT_SCRAPES: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct TargetKey {
    job: String,
    kind: String,
    url: String,
    labels: BTreeMap<String, String>,
}

/// What `/api/v1/targets` shows of one target.
#[derive(Debug, Clone)]
pub struct TargetHealth {
    pub job: String,
    pub kind: String,
    pub url: String,
    pub discovered_labels: LabelSet,
    pub labels: BTreeMap<String, String>,
    pub health: &'static str,
    pub last_scrape: Option<SystemTime>,
    pub last_scrape_duration: Duration,
    pub last_error: String,
    pub interval: Duration,
    pub timeout: Duration,
    pub failures: u64,
}

#[derive(Default)]
struct State {
    active: BTreeMap<TargetKey, TargetHealth>,
    dropped: Vec<(String, LabelSet)>,
}

/// Shared view of every job's targets.
#[derive(Clone, Default)]
pub struct Targets {
    state: Arc<Mutex<State>>,
}

impl Targets {
    /// Active targets and dropped ones (job, discovered labels).
    pub fn snapshot(&self) -> (Vec<TargetHealth>, Vec<(String, LabelSet)>) {
        match self.state.lock() {
            Ok(state) => (
                state.active.values().cloned().collect(),
                state.dropped.clone(),
            ),
            Err(_) => (Vec::new(), Vec::new()),
        }
    }

    /// Prometheus's `/api/v1/targets` response.
    pub fn to_prometheus_json(&self) -> serde_json::Value {
        let (active, dropped) = self.snapshot();
        let active: Vec<serde_json::Value> = active
            .iter()
            .map(|target| {
                serde_json::json!({
                    "discoveredLabels": target.discovered_labels,
                    "labels": target.labels,
                    "scrapePool": target.job,
                    "scrapeUrl": target.url,
                    "globalUrl": target.url,
                    "lastError": target.last_error,
                    "lastScrape": target.last_scrape.map(rfc3339).unwrap_or_else(|| "0001-01-01T00:00:00Z".to_string()),
                    "lastScrapeDuration": target.last_scrape_duration.as_secs_f64(),
                    "health": target.health,
                    "scrapeInterval": format_duration(target.interval),
                    "scrapeTimeout": format_duration(target.timeout),
                    "profileKind": target.kind,
                })
            })
            .collect();
        let dropped: Vec<serde_json::Value> = dropped
            .iter()
            .map(|(job, labels)| serde_json::json!({"discoveredLabels": labels, "scrapePool": job}))
            .collect();
        serde_json::json!({
            "status": "success",
            "data": {"activeTargets": active, "droppedTargets": dropped}
        })
    }

    fn update(&self, key: &TargetKey, change: impl FnOnce(&mut TargetHealth)) {
        if let Ok(mut state) = self.state.lock() {
            if let Some(health) = state.active.get_mut(key) {
                change(health);
            }
        }
    }
}

/// Each active target's health for `/metrics`, read at each scrape: targets come and go,
/// so they are read from the live state rather than kept in families of their own.
impl prometheus_client::collector::Collector for Targets {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (active, _) = self.snapshot();
        let labels = |target: &TargetHealth| {
            [
                ("job", target.job.clone()),
                (
                    "instance",
                    target.labels.get("instance").cloned().unwrap_or_default(),
                ),
                ("kind", target.kind.clone()),
            ]
        };
        let families: [MetricFamily; 3] = [
            (
                "kiln_scrape_target_up",
                "Whether the last scrape of a target succeeded.",
                MetricType::Gauge,
                |t| f64::from(u8::from(t.health == "up")),
            ),
            (
                "kiln_scrape_duration_seconds",
                "Duration of the last scrape of a target.",
                MetricType::Gauge,
                |t| t.last_scrape_duration.as_secs_f64(),
            ),
            (
                "kiln_scrape_failures",
                "Failed scrapes of a target.",
                MetricType::Counter,
                |t| t.failures as f64,
            ),
        ];
        for (name, help, kind, value) in families {
            let mut family = encoder.encode_descriptor(name, help, None, kind)?;
            for target in &active {
                let labels = labels(target);
                let metric = family.encode_family(&labels)?;
                match kind {
                    MetricType::Counter => {
                        ConstCounter::new(value(target) as u64).encode(metric)?
                    }
                    _ => ConstGauge::new(value(target)).encode(metric)?,
                }
            }
        }
        Ok(())
    }
}

/// A per-target family: name, help, type and the value read from a target's health.
type MetricFamily = (
    &'static str,
    &'static str,
    MetricType,
    fn(&TargetHealth) -> f64,
);

impl std::fmt::Debug for Targets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Targets").finish_non_exhaustive()
    }
}

fn format_duration(duration: Duration) -> String {
    let ms = duration.as_millis();
    if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

fn rfc3339(time: SystemTime) -> String {
    let nanos = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0);
    kiln_model::time::format_rfc3339(nanos)
}

/// Whether this process scrapes a target, by its `job/url` key: several scrape nodes
/// share the targets so that each is scraped once.
pub type Owner = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// Runs every job's discovery and targets until `stop` fires.
pub struct ScrapeManager {
    configs: Vec<ScrapeConfig>,
    sink: Sink,
    targets: Targets,
    owner: Option<Owner>,
}

impl ScrapeManager {
    pub fn new(configs: Vec<ScrapeConfig>, sink: Sink) -> Result<Self, ScrapeError> {
        let mut names = std::collections::HashSet::new();
        for config in &configs {
            config.validate().map_err(ScrapeError::Config)?;
            if !names.insert(config.job_name.clone()) {
                return Err(ScrapeError::Config(format!(
                    "job_name {:?} is used twice",
                    config.job_name
                )));
            }
        }
        Ok(ScrapeManager {
            configs,
            sink,
            targets: Targets::default(),
            owner: None,
        })
    }

    /// Scrapes only the targets `owner` says are this process's, asked again at every
    /// discovery round (each second), so targets move when the scrape nodes change.
    pub fn with_owner(mut self, owner: Owner) -> Self {
        self.owner = Some(owner);
        self
    }

    pub fn targets(&self) -> Targets {
        self.targets.clone()
    }

    pub fn spawn(
        self,
        stop: watch::Receiver<bool>,
    ) -> Result<tokio::task::JoinHandle<()>, ScrapeError> {
        let semaphore = Arc::new(Semaphore::new(MAX_CONCURRENT_SCRAPES));
        let mut jobs = Vec::new();
        for config in self.configs {
            let client = crate::client::build(&config)?;
            jobs.push(tokio::spawn(run_job(
                Arc::new(config),
                client,
                self.sink.clone(),
                self.targets.clone(),
                semaphore.clone(),
                self.owner.clone(),
                stop.clone(),
            )));
        }
        Ok(tokio::spawn(async move {
            for job in jobs {
                let _ = job.await;
            }
        }))
    }
}

/// The labels of one discovered target for one profile kind, before relabeling.
fn discovered_labels(
    config: &ScrapeConfig,
    group_labels: &BTreeMap<String, String>,
    address: &str,
    kind: &str,
    path: &str,
) -> LabelSet {
    let mut labels: LabelSet = group_labels.clone();
    labels.insert("__address__".into(), address.to_string());
    labels.insert("job".into(), config.job_name.clone());
    labels.insert("__scheme__".into(), config.scheme.clone());
    labels.insert("__profile_path__".into(), path.to_string());
    labels.insert("__name__".into(), kind.to_string());
    labels.insert(
        "__scrape_interval__".into(),
        format_duration(config.scrape_interval),
    );
    labels.insert(
        "__scrape_timeout__".into(),
        format_duration(config.scrape_timeout),
    );
    for (name, values) in &config.params {
        if let Some(first) = values.first() {
            labels.insert(format!("__param_{name}"), first.clone());
        }
    }
    labels
}

/// A target's final labels and URL after relabeling; `None` when a rule dropped it.
fn finish_target(
    config: &ScrapeConfig,
    discovered: &LabelSet,
    kind: &str,
) -> Option<(String, BTreeMap<String, String>)> {
    let relabeled = relabel(discovered, &config.relabel_configs)?;
    let address = relabeled
        .get("__address__")
        .filter(|a| !a.is_empty())?
        .clone();
    let scheme = relabeled
        .get("__scheme__")
        .cloned()
        .unwrap_or_else(|| config.scheme.clone());
    let path = relabeled
        .get("__profile_path__")
        .cloned()
        .unwrap_or_default();
    let mut query: Vec<(String, String)> = relabeled
        .iter()
        .filter_map(|(name, value)| {
            Some((name.strip_prefix("__param_")?.to_string(), value.clone()))
        })
        .collect();
    if kind == "process_cpu" && !query.iter().any(|(name, _)| name == "seconds") {
        query.push(("seconds".into(), cpu_seconds(config).to_string()));
    }
    let mut url = format!("{scheme}://{address}{path}");
    for (index, (name, value)) in query.iter().enumerate() {
        url.push(if index == 0 { '?' } else { '&' });
        url.push_str(&form_encode(name));
        url.push('=');
        url.push_str(&form_encode(value));
    }
    let mut labels: BTreeMap<String, String> = relabeled
        .iter()
        .filter(|(name, _)| !name.starts_with("__"))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    labels.entry("instance".into()).or_insert(address);
    let job = labels
        .get("job")
        .cloned()
        .unwrap_or_else(|| config.job_name.clone());
    labels.entry("service_name".into()).or_insert(job);
    Some((url, labels))
}

fn form_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (byte as char).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// A CPU profile covers most of the interval: one second less, so that it ends before
/// the next one starts.
fn cpu_seconds(config: &ScrapeConfig) -> u64 {
    config.scrape_interval.as_secs().saturating_sub(1).max(1)
}

async fn run_job(
    config: Arc<ScrapeConfig>,
    client: reqwest::Client,
    sink: Sink,
    targets: Targets,
    semaphore: Arc<Semaphore>,
    owner: Option<Owner>,
    mut stop: watch::Receiver<bool>,
) {
    let mut discovery = Discovery::new(&config, client.clone());
    let endpoints = config.profiling_config.endpoints();
    let mut running: HashMap<TargetKey, tokio::task::JoinHandle<()>> = HashMap::new();
    loop {
        let groups = discovery.refresh().await;
        let mut wanted: BTreeMap<TargetKey, LabelSet> = BTreeMap::new();
        let mut dropped = Vec::new();
        for group in &groups {
            for address in &group.targets {
                for (kind, endpoint) in &endpoints {
                    let discovered =
                        discovered_labels(&config, &group.labels, address, kind, &endpoint.path);
                    match finish_target(&config, &discovered, kind) {
                        Some((url, labels)) => {
                            wanted.insert(
                                TargetKey {
                                    job: config.job_name.clone(),
                                    kind: kind.clone(),
                                    url,
                                    labels,
                                },
                                discovered,
                            );
                        }
                        None => dropped.push((config.job_name.clone(), discovered)),
                    }
                }
            }
        }
        // Another scrape node's targets are its own to scrape and to report.
        if let Some(owns) = &owner {
            wanted.retain(|key, _| owns(&format!("{}/{}", key.job, key.url)));
        }
        // Stop the targets that went away, start the new ones.
        running.retain(|key, task| {
            let keep = wanted.contains_key(key);
            if !keep {
                task.abort();
            }
            keep
        });
        if let Ok(mut state) = targets.state.lock() {
            state
                .active
                .retain(|key, _| key.job != config.job_name || wanted.contains_key(key));
            state.dropped.retain(|(job, _)| *job != config.job_name);
            state.dropped.extend(dropped);
            for (key, discovered) in &wanted {
                state
                    .active
                    .entry(key.clone())
                    .or_insert_with(|| TargetHealth {
                        job: key.job.clone(),
                        kind: key.kind.clone(),
                        url: key.url.clone(),
                        discovered_labels: discovered.clone(),
                        labels: key.labels.clone(),
                        health: "unknown",
                        last_scrape: None,
                        last_scrape_duration: Duration::ZERO,
                        last_error: String::new(),
                        interval: config.scrape_interval,
                        timeout: config.scrape_timeout,
                        failures: 0,
                    });
            }
        }
        for key in wanted.keys() {
            if running.contains_key(key) {
                continue;
            }
            let delta = endpoints
                .get(&key.kind)
                .is_some_and(|endpoint| endpoint.delta);
            running.insert(
                key.clone(),
                tokio::spawn(run_target(
                    config.clone(),
                    client.clone(),
                    key.clone(),
                    delta,
                    sink.clone(),
                    targets.clone(),
                    semaphore.clone(),
                )),
            );
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = discovery.changed() => {}
            _ = stop.changed() => break,
        }
    }
    for task in running.values() {
        task.abort();
    }
}

/// A stable offset within the interval, so that targets are spread over it.
fn offset(key: &TargetKey, interval: Duration) -> Duration {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut hasher);
    let interval_ms = interval.as_millis().max(1) as u64;
    Duration::from_millis(hasher.finish() % interval_ms)
}

async fn run_target(
    config: Arc<ScrapeConfig>,
    client: reqwest::Client,
    key: TargetKey,
    delta: bool,
    sink: Sink,
    targets: Targets,
    semaphore: Arc<Semaphore>,
) {
    let interval = config.scrape_interval;
    let start = tokio::time::Instant::now() + offset(&key, interval);
    let mut ticker = tokio::time::interval_at(start, interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut state = DeltaState::default();
    loop {
        ticker.tick().await;
        let began = Instant::now();
        let scraped_at = SystemTime::now();
        let result =
            scrape_once(&config, &client, &key, delta, &mut state, &sink, &semaphore).await;
        let took = began.elapsed();
        targets.update(&key, |health| {
            health.last_scrape = Some(scraped_at);
            health.last_scrape_duration = took;
            match &result {
                Ok(()) => {
                    health.health = "up";
                    health.last_error.clear();
                }
                Err(err) => {
                    health.health = "down";
                    health.last_error = err.to_string();
                    health.failures += 1;
                }
            }
        });
        if let Err(err) = result {
            tracing::debug!(url = %key.url, error = %err, "scrape failed");
        }
    }
}

async fn scrape_once(
    config: &ScrapeConfig,
    client: &reqwest::Client,
    key: &TargetKey,
    delta: bool,
    state: &mut DeltaState,
    sink: &Sink,
    semaphore: &Semaphore,
) -> Result<(), ScrapeFailure> {
    let cpu = key.kind == "process_cpu";
    let timeout = if cpu {
        config.scrape_timeout + Duration::from_secs(cpu_seconds(config))
    } else {
        config.scrape_timeout
    };
    let started_nanos = kiln_model::time::now_nanos();
    // The permit bounds requests in flight, not storage: a durable write waits for a
    // group commit, and holding the permit through it would throttle every target.
    let body = {
        let _permit = semaphore
            .acquire()
            .await
            .map_err(|_| ScrapeFailure::Stopping)?;
        crate::client::fetch(client, config, &key.url, timeout).await?
    };
    let limit = config.body_size_limit;
    let data =
        kiln_model::compress::maybe_gunzip(&body, limit).map_err(ScrapeFailure::Decompress)?;
    let profile = kiln_model::pprof::decode(&data, limit).map_err(|source| {
        let start = String::from_utf8_lossy(&data[..data.len().min(40)]).replace('\n', " ");
        ScrapeFailure::NotPprof { start, source }
    })?;
    kiln_model::pprof::validate(&profile, &Default::default())
        .map_err(ScrapeFailure::InvalidPprof)?;
    let (time_nanos, duration_nanos) = if cpu {
        let seconds = cpu_seconds(config) as i64 * 1_000_000_000;
        (started_nanos, seconds)
    } else {
        (started_nanos, config.scrape_interval.as_nanos() as i64)
    };
    let profile = if delta {
        match state.apply(profile) {
            Delta::Baseline => return Ok(()),
            Delta::Profile(profile) | Delta::Reset(profile) => profile,
        }
    } else {
        profile
    };
    if profile.sample.is_empty() {
        return Ok(());
    }
    sink(ScrapedProfile {
        tenant: config.tenant.clone(),
        labels: key.labels.clone(),
        kind: key.kind.clone(),
        profile,
        time_nanos,
        duration_nanos,
    })
    .await
    .map_err(ScrapeFailure::Sink)
}
