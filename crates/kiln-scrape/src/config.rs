//! The `scrape_configs` section, in Prometheus's shape plus Pyroscope's and Parca's
//! `profiling_config`, so a Prometheus user's job definitions carry over.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::relabel::RelabelConfig;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScrapeConfig {
    pub job_name: String,
    #[serde(default = "default_interval", deserialize_with = "duration")]
    pub scrape_interval: Duration,
    #[serde(default = "default_timeout", deserialize_with = "duration")]
    pub scrape_timeout: Duration,
    #[serde(default = "default_scheme")]
    pub scheme: String,
    /// Extra query parameters for every request.
    #[serde(default)]
    pub params: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    pub basic_auth: Option<BasicAuth>,
    #[serde(default)]
    pub authorization: Option<Authorization>,
    #[serde(default)]
    pub tls_config: TlsConfig,
    #[serde(default)]
    pub static_configs: Vec<StaticConfig>,
    #[serde(default)]
    pub file_sd_configs: Vec<FileSdConfig>,
    #[serde(default)]
    pub http_sd_configs: Vec<HttpSdConfig>,
    #[serde(default)]
    pub kubernetes_sd_configs: Vec<KubernetesSdConfig>,
    #[serde(default)]
    pub relabel_configs: Vec<RelabelConfig>,
    #[serde(default)]
    pub profiling_config: ProfilingConfig,
    /// The tenant the job's profiles are stored under (Kiln's addition; the default
    /// tenant when absent).
    #[serde(default)]
    pub tenant: Option<String>,
    /// Largest profile body accepted from a target.
    #[serde(default = "default_body_limit")]
    pub body_size_limit: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasicAuth {
    pub username: String,
    #[serde(default)]
    pub password: Option<String>,
    #[serde(default)]
    pub password_file: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Authorization {
    #[serde(default = "default_auth_type", rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub credentials: Option<String>,
    #[serde(default)]
    pub credentials_file: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    #[serde(default)]
    pub ca_file: Option<String>,
    #[serde(default)]
    pub cert_file: Option<String>,
    #[serde(default)]
    pub key_file: Option<String>,
    #[serde(default)]
    pub insecure_skip_verify: bool,
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StaticConfig {
    #[serde(default)]
    pub targets: Vec<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSdConfig {
    /// Paths; a `*` in the last component is a glob, as in Prometheus.
    pub files: Vec<String>,
    #[serde(default = "default_file_refresh", deserialize_with = "duration")]
    pub refresh_interval: Duration,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSdConfig {
    pub url: String,
    #[serde(default = "default_http_refresh", deserialize_with = "duration")]
    pub refresh_interval: Duration,
}

/// `kubernetes_sd_configs`, in Prometheus's shape (kiln-kube follows the cluster).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesSdConfig {
    /// `pod`, `service`, `endpoints` or `node`.
    pub role: String,
    /// The API server's URL; in-cluster config when neither this nor a kubeconfig is set.
    #[serde(default)]
    pub api_server: Option<String>,
    #[serde(default)]
    pub kubeconfig_file: Option<String>,
    #[serde(default)]
    pub namespaces: KubernetesNamespaces,
    #[serde(default)]
    pub selectors: Vec<KubernetesSelector>,
    /// For `api_server`: `credentials_file` holds a bearer token.
    #[serde(default)]
    pub authorization: Option<Authorization>,
    #[serde(default)]
    pub tls_config: TlsConfig,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesNamespaces {
    /// The namespace Kiln runs in, from its service account.
    #[serde(default)]
    pub own_namespace: bool,
    #[serde(default)]
    pub names: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesSelector {
    pub role: String,
    #[serde(default)]
    pub label: Option<String>,
    #[serde(default)]
    pub field: Option<String>,
}

impl KubernetesSdConfig {
    /// What kiln-kube needs: the API server, and what to watch.
    pub fn resolve(&self) -> Result<(kiln_kube::ApiConfig, kiln_kube::WatchConfig), String> {
        let role = kiln_kube::Role::parse(&self.role).ok_or_else(|| {
            format!(
                "kubernetes_sd_configs: role {:?} is not one of pod, service, endpoints, node",
                self.role
            )
        })?;
        if self.api_server.is_some() && self.kubeconfig_file.is_some() {
            return Err(
                "kubernetes_sd_configs: at most one of api_server and kubeconfig_file".into(),
            );
        }
        let mut selectors = Vec::new();
        for selector in &self.selectors {
            let role = kiln_kube::Role::parse(&selector.role).ok_or_else(|| {
                format!(
                    "kubernetes_sd_configs: selector role {:?} is not one of pod, service, endpoints, node",
                    selector.role
                )
            })?;
            selectors.push(kiln_kube::Selector {
                role: Some(role),
                label: selector.label.clone(),
                field: selector.field.clone(),
            });
        }
        let token = match &self.authorization {
            Some(auth) if auth.kind != "Bearer" => {
                return Err(format!(
                    "kubernetes_sd_configs: authorization type {:?}: only Bearer",
                    auth.kind
                ))
            }
            Some(auth) if auth.credentials.is_some() => {
                return Err(
                    "kubernetes_sd_configs: give the token as authorization.credentials_file"
                        .into(),
                )
            }
            Some(auth) => auth.credentials_file.clone().map(Into::into),
            None => None,
        };
        let api = kiln_kube::ApiConfig {
            api_server: self.api_server.clone(),
            kubeconfig_file: self.kubeconfig_file.clone().map(Into::into),
            bearer_token_file: token,
            ca_file: self.tls_config.ca_file.clone().map(Into::into),
            insecure_skip_verify: self.tls_config.insecure_skip_verify,
            service_account_dir: None,
        };
        let mut namespaces = self.namespaces.names.clone();
        if self.namespaces.own_namespace {
            namespaces.push(api.own_namespace());
        }
        Ok((
            api,
            kiln_kube::WatchConfig {
                role,
                namespaces,
                selectors,
            },
        ))
    }
}

/// Which profiles to take from each target.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfilingConfig {
    #[serde(default)]
    pub pprof_config: BTreeMap<String, ProfileEndpoint>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProfileEndpoint {
    #[serde(default = "default_true")]
    pub enabled: bool,
    #[serde(default)]
    pub path: String,
    /// The endpoint serves cumulative values (since process start): store the difference
    /// between consecutive scrapes.
    #[serde(default)]
    pub delta: bool,
}

/// The Go `net/http/pprof` endpoints, with Pyroscope's and Parca's defaults.
pub fn go_defaults() -> BTreeMap<String, ProfileEndpoint> {
    [
        ("process_cpu", "/debug/pprof/profile", false),
        ("memory", "/debug/pprof/allocs", true),
        ("goroutine", "/debug/pprof/goroutine", false),
        ("mutex", "/debug/pprof/mutex", true),
        ("block", "/debug/pprof/block", true),
    ]
    .into_iter()
    .map(|(name, path, delta)| {
        (
            name.to_string(),
            ProfileEndpoint {
                enabled: true,
                path: path.to_string(),
                delta,
            },
        )
    })
    .collect()
}

impl Default for ProfilingConfig {
    fn default() -> Self {
        ProfilingConfig {
            pprof_config: go_defaults(),
        }
    }
}

impl ProfilingConfig {
    /// The configured endpoints over the Go defaults: a kind named in the config replaces
    /// only the fields it gives (an empty path keeps the default path).
    pub fn endpoints(&self) -> BTreeMap<String, ProfileEndpoint> {
        let mut endpoints = go_defaults();
        for (kind, endpoint) in &self.pprof_config {
            let merged = match endpoints.get(kind) {
                Some(default) => ProfileEndpoint {
                    enabled: endpoint.enabled,
                    path: if endpoint.path.is_empty() {
                        default.path.clone()
                    } else {
                        endpoint.path.clone()
                    },
                    delta: endpoint.delta || (default.delta && endpoint.path.is_empty()),
                },
                None => endpoint.clone(),
            };
            endpoints.insert(kind.clone(), merged);
        }
        endpoints.retain(|_, endpoint| endpoint.enabled && !endpoint.path.is_empty());
        endpoints
    }
}

impl ScrapeConfig {
    /// Prometheus's load-time checks.
    pub fn validate(&self) -> Result<(), String> {
        if self.job_name.is_empty() {
            return Err("a scrape config needs a job_name".to_string());
        }
        if self.scrape_timeout > self.scrape_interval {
            return Err(format!(
                "job {}: scrape_timeout {:?} is greater than scrape_interval {:?}",
                self.job_name, self.scrape_timeout, self.scrape_interval
            ));
        }
        if self.scheme != "http" && self.scheme != "https" {
            return Err(format!(
                "job {}: scheme must be http or https, not {:?}",
                self.job_name, self.scheme
            ));
        }
        if self.basic_auth.is_some() && self.authorization.is_some() {
            return Err(format!(
                "job {}: at most one of basic_auth and authorization",
                self.job_name
            ));
        }
        for rule in &self.relabel_configs {
            rule.validate()
                .map_err(|err| format!("job {}: {err}", self.job_name))?;
        }
        for kubernetes in &self.kubernetes_sd_configs {
            kubernetes
                .resolve()
                .map_err(|err| format!("job {}: {err}", self.job_name))?;
        }
        Ok(())
    }
}

fn default_interval() -> Duration {
    Duration::from_secs(15)
}

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_scheme() -> String {
    "http".to_string()
}

fn default_auth_type() -> String {
    "Bearer".to_string()
}

fn default_file_refresh() -> Duration {
    Duration::from_secs(300)
}

fn default_http_refresh() -> Duration {
    Duration::from_secs(60)
}

fn default_body_limit() -> usize {
    64 << 20
}

fn default_true() -> bool {
    true
}

fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    parse_duration(&text).map_err(serde::de::Error::custom)
}

/// A Prometheus duration: `1h30m`, `15s`, `500ms`, units y w d h m s ms.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let invalid = || format!("invalid duration {text:?} (expected e.g. 15s, 1m30s, 500ms)");
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total_ms: u64 = 0;
    let mut rest = text;
    if rest.is_empty() {
        return Err(invalid());
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .ok_or_else(invalid)?;
        if digits == 0 {
            return Err(invalid());
        }
        let number: u64 = rest[..digits].parse().map_err(|_| invalid())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit_ms: u64 = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 7 * 86_400_000,
            "y" => 365 * 86_400_000,
            _ => return Err(invalid()),
        };
        total_ms = number
            .checked_mul(unit_ms)
            .and_then(|ms| total_ms.checked_add(ms))
            .ok_or_else(invalid)?;
        rest = &rest[unit_len..];
    }
    Ok(Duration::from_millis(total_ms))
}
