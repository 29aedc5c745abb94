//! Where targets come from: static lists, files (`file_sd_configs`), HTTP endpoints
//! (`http_sd_configs`), all in Prometheus's target group format:
//! `[{"targets": ["host:port", …], "labels": {"name": "value", …}}, …]`, and Kubernetes
//! (`kubernetes_sd_configs`, one group per target, kiln-kube's).
//!
//! Kubernetes is watched, not polled: [`Discovery::changed`] wakes the job's loop at each
//! change, so a pod that goes away stops being scraped at once.
//!
//! Files are re-read when their modification time or the set of files matching a glob
//! changes, checked every second, and at least every `refresh_interval`; an HTTP endpoint
//! is polled every `refresh_interval`. A source that fails keeps its last good targets, as
//! Prometheus does, so a flaky SD server does not drop every target.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use crate::config::{FileSdConfig, HttpSdConfig, ScrapeConfig, StaticConfig};
use crate::DiscoveryError;

/// One group of targets sharing labels, with the source's `__meta_*` labels added.
pub type TargetGroup = StaticConfig;

/// The state of one job's sources between refreshes.
pub struct Discovery {
    static_groups: Vec<TargetGroup>,
    files: Vec<FileSource>,
    http: Vec<HttpSource>,
    kubernetes: Vec<KubernetesSource>,
    client: reqwest::Client,
}

struct KubernetesSource {
    api: kiln_kube::ApiConfig,
    watch: kiln_kube::WatchConfig,
    /// Started at the first refresh (making the client is async), again after a failure.
    running: Option<(
        kiln_kube::Discovery,
        tokio::sync::watch::Receiver<std::sync::Arc<Vec<kiln_kube::Target>>>,
    )>,
    last_attempt: Option<Instant>,
}

struct FileSource {
    config: FileSdConfig,
    /// Matching files and their modification times at the last read.
    seen: BTreeMap<PathBuf, Option<SystemTime>>,
    groups: Vec<TargetGroup>,
    last_read: Option<Instant>,
}

struct HttpSource {
    config: HttpSdConfig,
    groups: Vec<TargetGroup>,
    last_poll: Option<Instant>,
}

impl Discovery {
    pub fn new(config: &ScrapeConfig, client: reqwest::Client) -> Self {
        Discovery {
            static_groups: config.static_configs.clone(),
            files: config
                .file_sd_configs
                .iter()
                .map(|config| FileSource {
                    config: config.clone(),
                    seen: BTreeMap::new(),
                    groups: Vec::new(),
                    last_read: None,
                })
                .collect(),
            http: config
                .http_sd_configs
                .iter()
                .map(|config| HttpSource {
                    config: config.clone(),
                    groups: Vec::new(),
                    last_poll: None,
                })
                .collect(),
            kubernetes: config
                .kubernetes_sd_configs
                .iter()
                // Checked when the configuration was loaded (ScrapeConfig::validate).
                .filter_map(|config| config.resolve().ok())
                .map(|(api, watch)| KubernetesSource {
                    api,
                    watch,
                    running: None,
                    last_attempt: None,
                })
                .collect(),
            client,
        }
    }

    /// Waits for a change of a watched source (Kubernetes); never, without one.
    pub async fn changed(&mut self) {
        let waits: Vec<_> = self
            .kubernetes
            .iter_mut()
            .filter_map(|source| source.running.as_mut())
            .map(|(_, receiver)| Box::pin(receiver.changed()))
            .collect();
        if waits.is_empty() {
            return std::future::pending().await;
        }
        let (result, _, _) = futures_util::future::select_all(waits).await;
        if result.is_err() {
            // Its sender is gone: don't spin on it.
            std::future::pending::<()>().await;
        }
    }

    /// Refreshes what is due and returns every current group.
    pub async fn refresh(&mut self) -> Vec<TargetGroup> {
        for source in &mut self.files {
            source.refresh();
        }
        for source in &mut self.http {
            let due = source
                .last_poll
                .is_none_or(|at| at.elapsed() >= source.config.refresh_interval);
            if due {
                source.last_poll = Some(Instant::now());
                match fetch_groups(&self.client, &source.config.url).await {
                    Ok(groups) => source.groups = groups,
                    Err(err) => {
                        tracing::warn!(url = %source.config.url, error = %err, "http service discovery failed; keeping the last targets")
                    }
                }
            }
        }
        for source in &mut self.kubernetes {
            let due = source
                .last_attempt
                .is_none_or(|at| at.elapsed() >= Duration::from_secs(10));
            if source.running.is_some() || !due {
                continue;
            }
            source.last_attempt = Some(Instant::now());
            match source.api.client().await {
                Ok(client) => {
                    let discovery = kiln_kube::Discovery::start(client, source.watch.clone());
                    let mut receiver = discovery.subscribe();
                    receiver.mark_unchanged();
                    source.running = Some((discovery, receiver));
                }
                Err(err) => {
                    tracing::warn!(error = %err, "kubernetes service discovery cannot start; trying again in 10 s")
                }
            }
        }
        let mut groups = self.static_groups.clone();
        groups.extend(self.files.iter().flat_map(|source| source.groups.clone()));
        groups.extend(self.http.iter().flat_map(|source| source.groups.clone()));
        for (discovery, receiver) in self
            .kubernetes
            .iter_mut()
            .filter_map(|s| s.running.as_mut())
        {
            receiver.mark_unchanged();
            groups.extend(discovery.targets().iter().map(|target| TargetGroup {
                targets: vec![target.address.clone()],
                labels: target.labels.clone(),
            }));
        }
        groups
    }
}

async fn fetch_groups(
    client: &reqwest::Client,
    url: &str,
) -> Result<Vec<TargetGroup>, DiscoveryError> {
    let response = client
        .get(url)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .map_err(DiscoveryError::Http)?;
    if !response.status().is_success() {
        return Err(DiscoveryError::Status(response.status()));
    }
    let body = response.bytes().await.map_err(DiscoveryError::Http)?;
    let mut groups: Vec<TargetGroup> =
        serde_json::from_slice(&body).map_err(DiscoveryError::Json)?;
    for group in &mut groups {
        group
            .labels
            .insert("__meta_url".to_string(), url.to_string());
    }
    Ok(groups)
}

impl FileSource {
    fn refresh(&mut self) {
        let mut now_seen = BTreeMap::new();
        for pattern in &self.config.files {
            for path in expand(pattern) {
                let modified = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
                now_seen.insert(path, modified);
            }
        }
        let stale = self
            .last_read
            .is_none_or(|at| at.elapsed() >= self.config.refresh_interval);
        if now_seen == self.seen && !stale {
            return;
        }
        let mut groups = Vec::new();
        for path in now_seen.keys() {
            match read_groups(path) {
                Ok(mut read) => {
                    for group in &mut read {
                        group
                            .labels
                            .insert("__meta_filepath".to_string(), path.display().to_string());
                    }
                    groups.extend(read);
                }
                Err(err) => {
                    tracing::warn!(file = %path.display(), error = %err, "file service discovery failed; keeping the last targets");
                    return;
                }
            }
        }
        self.groups = groups;
        self.seen = now_seen;
        self.last_read = Some(Instant::now());
    }
}

/// JSON or YAML (a superset of JSON), as Prometheus reads `*.json`, `*.yml`, `*.yaml`.
fn read_groups(path: &Path) -> Result<Vec<TargetGroup>, DiscoveryError> {
    let text = std::fs::read_to_string(path).map_err(DiscoveryError::Read)?;
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    yaml_serde::from_str(&text).map_err(DiscoveryError::Yaml)
}

/// The files a pattern names; `*` and `?` in the last component are globs.
fn expand(pattern: &str) -> Vec<PathBuf> {
    let path = Path::new(pattern);
    let Some(name) = path.file_name().and_then(|name| name.to_str()) else {
        return Vec::new();
    };
    if !name.contains(['*', '?']) {
        return if path.is_file() {
            vec![path.to_path_buf()]
        } else {
            Vec::new()
        };
    }
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut matched: Vec<PathBuf> = entries
        .flatten()
        .filter(|entry| {
            entry
                .file_name()
                .to_str()
                .is_some_and(|candidate| glob_match(name.as_bytes(), candidate.as_bytes()))
        })
        .map(|entry| entry.path())
        .filter(|path| path.is_file())
        .collect();
    matched.sort();
    matched
}

fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    match (pattern.first(), text.first()) {
        (None, None) => true,
        (Some(b'*'), _) => {
            glob_match(&pattern[1..], text) || (!text.is_empty() && glob_match(pattern, &text[1..]))
        }
        (Some(b'?'), Some(_)) => glob_match(&pattern[1..], &text[1..]),
        (Some(p), Some(t)) if p == t => glob_match(&pattern[1..], &text[1..]),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::glob_match;

    #[test]
    fn globs_match_like_filepath_match() {
        assert!(glob_match(b"*.json", b"targets.json"));
        assert!(glob_match(b"t?.yml", b"t1.yml"));
        assert!(!glob_match(b"*.json", b"targets.yml"));
        assert!(glob_match(b"*", b""));
        assert!(!glob_match(b"a*b", b"acd"));
    }
}
