//! Where targets come from: static lists, files (`file_sd_configs`) and HTTP endpoints
//! (`http_sd_configs`), all in Prometheus's target group format:
//! `[{"targets": ["host:port", …], "labels": {"name": "value", …}}, …]`.
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
    client: reqwest::Client,
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
            client,
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
        let mut groups = self.static_groups.clone();
        groups.extend(self.files.iter().flat_map(|source| source.groups.clone()));
        groups.extend(self.http.iter().flat_map(|source| source.groups.clone()));
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
