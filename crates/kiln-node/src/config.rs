//! A node's configuration: defaults, overridden by a YAML file, overridden by environment
//! variables and flags (the binary merges those).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use kiln_compactor::CompactorConfig;
use kiln_ingest::{IngesterConfig, Limits};
use kiln_server::config::HttpConfig;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// What this process runs: `all`, or a comma-separated list of ingest, query,
    /// compact, scrape and rules (docs/deploy.md).
    pub target: String,
    /// How this node announces itself to the others (the metastore's `nodes` table).
    pub node: kiln_cluster::NodeConfig,
    /// What the nodes of one deployment share.
    pub cluster: ClusterConfig,
    /// Address to listen on, HTTP/1.1 and HTTP/2 cleartext (gRPC).
    pub listen: String,
    pub data_dir: PathBuf,
    /// Object store URL; `file://<data-dir>/blocks` when empty.
    pub object_store: String,
    /// Object store settings, named like the environment variables they take precedence
    /// over (`AWS_ENDPOINT_URL`, `AWS_REGION`, ...).
    pub object_store_options: BTreeMap<String, String>,
    /// Metastore URL; `sqlite://<data-dir>/metastore.db` when empty.
    pub metastore: String,
    /// Longest a write waits for its segment flush, in milliseconds.
    pub flush_interval_ms: u64,
    /// Flush as soon as nothing else is on its way (adaptive group commit), rather than
    /// always waiting `flush_interval_ms`.
    pub flush_adaptive: bool,
    /// The shortest time between the starts of two adaptive flushes, in milliseconds.
    pub flush_min_gap_ms: u64,
    /// Acknowledge a write that arrives while no other is on its way (or that joins a
    /// batch logged already) once it is in the write-ahead log under `<data_dir>/wal`,
    /// and write segments per
    /// `wal_segment_interval_ms` (many writes each). Used by a
    /// node running every role (`target: all`) on a local directory and SQLite; a
    /// cluster's writes are acknowledged once their segment is registered, as with
    /// `wal: false`.
    pub wal: bool,
    /// With the write-ahead log, the longest a logged write waits for its segment, in
    /// milliseconds; reads flush what waits first, so it is never stale to a query.
    pub wal_segment_interval_ms: u64,
    /// `wal_segment_interval_ms` while any recording rule exists, in milliseconds: the
    /// rules count a segment as it is registered, so its samples can go out
    /// `rule_export.delay_ms` after their step.
    pub wal_rules_segment_interval_ms: u64,
    /// Flush a segment early at this many received bytes.
    pub flush_bytes: usize,
    /// Memory of staged profiles (their batch's dataset builders) waiting for, or in, a
    /// flush; past it, writes get 429. This bounds the write path's memory when clients
    /// send faster than it can store.
    pub max_pending_bytes: usize,
    /// Default limits for every tenant.
    pub limits: Limits,
    /// Per-tenant overrides of `limits`.
    pub tenant_limits: HashMap<String, Limits>,
    /// Background compaction, retention and deletion of replaced objects.
    pub compaction: CompactorConfig,
    /// Pull collection: pprof endpoints to scrape, in Prometheus's `scrape_configs` shape.
    #[serde(skip_serializing)]
    pub scrape_configs: Vec<kiln_scrape::ScrapeConfig>,
    /// Files whose `scrape_configs` are added to these, as Prometheus's
    /// `scrape_config_files`: relative to this file's directory. A shared scrape config
    /// (deploy/kubernetes/scrape.yaml, mounted from its own ConfigMap) stays one file.
    #[serde(skip_serializing)]
    pub scrape_config_files: Vec<PathBuf>,
    /// Connections: how long a client may take, and how many may be open.
    pub http: HttpConfig,
    /// Profile this host's processes in-process (`kiln server --agent`).
    pub agent: AgentSettings,
    /// Metrics derived from profiles (read-only through the API; see docs/rules.md).
    pub recording_rules: Vec<kiln_rules::rule::RuleSpec>,
    /// Where the rules' samples are sent: Prometheus remote write 1.0 receivers.
    pub remote_write: Vec<kiln_rules::remote_write::RemoteWriteConfig>,
    /// Step, delay and late-data window of the rules' samples.
    pub rule_export: kiln_rules::ExportSettings,
    /// The regression watcher: a service's new version compared with the previous one
    /// (docs/insight.md).
    pub regressions: kiln_insight::RegressionsConfig,
    /// Tokens per tenant and their scopes (docs/security.md); off by default.
    pub auth: kiln_auth::AuthConfig,
    /// HTTPS (and h2 over TLS) on `listen` instead of cleartext, when set.
    pub tls: kiln_server::tls::TlsConfig,
    /// What one query may cost: profiles read, time, and a tenant's queries at once.
    pub query: kiln_query::QueryBudget,
    /// Where source files are, for a function's lines in the UI; none by default, and
    /// then no source text is shown.
    pub source: kiln_query::source::SourceConfig,
    /// Names for frames stored unnamed (stripped binaries): uploaded debug files and
    /// debuginfod servers (docs/symbolization.md).
    pub symbolization: kiln_symbolize::SymbolizationConfig,
}

/// What the nodes of one deployment share.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// A file holding the token nodes present to each other's node-only endpoints
    /// (`/api/v1/partial/*`, a query's shares). Needed with auth on and roles split;
    /// with it set, those endpoints refuse everything else, auth on or off.
    pub token_file: Option<PathBuf>,
}

/// The in-process host agent: what `kiln agent` does, written straight to this server.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentSettings {
    pub enabled: bool,
    /// Samples per second on each CPU (1 to 1000).
    pub frequency: u64,
    /// Time covered by one report, in milliseconds.
    pub interval_ms: u64,
    /// Tenant the host's profiles are written to.
    pub tenant: String,
    /// Prometheus relabeling of each process's labels (see `kiln agent --config`).
    #[serde(skip_serializing)]
    pub relabel_configs: Vec<kiln_scrape::relabel::RelabelConfig>,
    /// Environment variables that relabeling may read, as `__meta_process_env_<NAME>`.
    pub env_allowlist: Vec<String>,
    /// The budget of the agent's unwind-table and symbol caches (`kiln agent
    /// --memory-limit`).
    pub memory_limit_bytes: usize,
    /// Count frame-pointer programs' samples in the kernel (`kiln agent --ebpf`).
    pub ebpf: bool,
    /// Profile where threads block, as a second profile per process (`off_cpu`; `kiln
    /// agent --off-cpu`).
    pub off_cpu: bool,
    /// The share of blocking switches sampled (`kiln agent --off-cpu-threshold`), 0 to 1.
    pub off_cpu_threshold: f64,
    /// Name Python's, Ruby's and Node.js's functions from the interpreter's memory
    /// (`kiln agent --interpreters`).
    pub interpreters: bool,
    /// Name the frames of files on the host (`kiln agent --symbolize`); off, the server
    /// names them from uploaded or debuginfod debug files.
    pub symbolize: bool,
    /// Label each process in a pod with its pod (`kiln agent --kubernetes`): namespace,
    /// pod, container, node, controller and `service_name`, and `__meta_kubernetes_*`
    /// for relabeling; from a watch of this node's pods (`NODE_NAME`).
    pub kubernetes: bool,
}

impl Default for AgentSettings {
    fn default() -> Self {
        AgentSettings {
            enabled: false,
            frequency: 19,
            interval_ms: 10_000,
            tenant: "anonymous".to_string(),
            relabel_configs: Vec::new(),
            env_allowlist: Vec::new(),
            memory_limit_bytes: kiln_agent::DEFAULT_MEMORY_LIMIT,
            ebpf: true,
            off_cpu: false,
            off_cpu_threshold: kiln_agent::offcpu::DEFAULT_THRESHOLD,
            interpreters: true,
            symbolize: true,
            kubernetes: false,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "0.0.0.0:4040".to_string(),
            data_dir: PathBuf::from("./kiln-data"),
            object_store: String::new(),
            object_store_options: BTreeMap::new(),
            metastore: String::new(),
            flush_interval_ms: 500,
            flush_adaptive: true,
            flush_min_gap_ms: 0,
            wal: true,
            wal_segment_interval_ms: 30_000,
            wal_rules_segment_interval_ms: 5_000,
            flush_bytes: 32 << 20,
            max_pending_bytes: IngesterConfig::default().max_pending_bytes,
            limits: Limits::default(),
            tenant_limits: HashMap::new(),
            compaction: CompactorConfig::default(),
            scrape_configs: Vec::new(),
            scrape_config_files: Vec::new(),
            http: HttpConfig::default(),
            agent: AgentSettings::default(),
            recording_rules: Vec::new(),
            remote_write: Vec::new(),
            rule_export: kiln_rules::ExportSettings::default(),
            regressions: kiln_insight::RegressionsConfig::default(),
            auth: kiln_auth::AuthConfig::default(),
            tls: kiln_server::tls::TlsConfig::default(),
            query: kiln_query::QueryBudget::default(),
            source: kiln_query::source::SourceConfig::default(),
            symbolization: kiln_symbolize::SymbolizationConfig::default(),
            target: "all".to_string(),
            node: kiln_cluster::NodeConfig::default(),
            cluster: ClusterConfig::default(),
        }
    }
}

impl ServerConfig {
    /// Reads a YAML config file; unknown keys are an error so typos do not pass silently.
    pub fn from_yaml_file(path: &std::path::Path) -> Result<Self, String> {
        Self::layered(Some(path), yaml_serde::Mapping::new())
    }

    /// The defaults, overridden by the YAML file at `path` (when given), overridden by
    /// `overrides`: settings by dotted key (`limits.max_body_bytes`), as the binary's
    /// flags and environment variables give them (clap puts a flag over its variable).
    /// A key that names no setting is an error, as an unknown key in the file is.
    pub fn layered(
        path: Option<&std::path::Path>,
        overrides: yaml_serde::Mapping,
    ) -> Result<Self, String> {
        let mut config = Self::layered_settings(path, overrides)?;
        let dir = path
            .and_then(std::path::Path::parent)
            .unwrap_or(std::path::Path::new("."));
        for file in &config.scrape_config_files {
            #[derive(Deserialize)]
            #[serde(deny_unknown_fields)]
            struct ScrapeFile {
                #[serde(default)]
                scrape_configs: Vec<kiln_scrape::ScrapeConfig>,
            }
            let file = dir.join(file);
            let text = std::fs::read_to_string(&file).map_err(|err| {
                format!("cannot read scrape_config_files {}: {err}", file.display())
            })?;
            let parsed: ScrapeFile = yaml_serde::from_str(&text)
                .map_err(|err| format!("invalid scrape config {}: {err}", file.display()))?;
            config.scrape_configs.extend(parsed.scrape_configs);
        }
        Ok(config)
    }

    fn layered_settings(
        path: Option<&std::path::Path>,
        overrides: yaml_serde::Mapping,
    ) -> Result<Self, String> {
        let (text, source) = match path {
            Some(path) => (
                std::fs::read_to_string(path)
                    .map_err(|err| format!("cannot read config {}: {err}", path.display()))?,
                path.display().to_string(),
            ),
            None => (String::new(), "defaults".to_string()),
        };
        // Read as written first, so that a mistake in the file is told with its line.
        let from_file: ServerConfig = match text.trim() {
            "" => ServerConfig::default(),
            _ => yaml_serde::from_str(&text)
                .map_err(|err| format!("invalid config {source}: {err}"))?,
        };
        if overrides.is_empty() {
            return Ok(from_file);
        }
        let mut layered = match yaml_serde::from_str::<yaml_serde::Value>(&text) {
            Ok(yaml_serde::Value::Mapping(mapping)) => mapping,
            _ => yaml_serde::Mapping::new(),
        };
        for (key, value) in overrides {
            let key = key.as_str().unwrap_or_default().to_string();
            let mut path = key.split('.').peekable();
            let mut at = &mut layered;
            while let Some(name) = path.next() {
                let name = yaml_serde::Value::String(name.to_string());
                if path.peek().is_none() {
                    at.insert(name, value);
                    break;
                }
                let next = at
                    .entry(name)
                    .or_insert_with(|| yaml_serde::Value::Mapping(Default::default()));
                if !next.is_mapping() {
                    *next = yaml_serde::Value::Mapping(Default::default());
                }
                let yaml_serde::Value::Mapping(next) = next else {
                    break;
                };
                at = next;
            }
        }
        yaml_serde::from_value(yaml_serde::Value::Mapping(layered)).map_err(|err| {
            format!("invalid setting from flags or environment over {source}: {err}")
        })
    }

    pub fn object_store_url(&self) -> String {
        if !self.object_store.is_empty() {
            return self.object_store.clone();
        }
        let blocks = absolute(&self.data_dir).join("blocks");
        format!("file://{}", blocks.display())
    }

    pub fn object_store_options(&self) -> Vec<(String, String)> {
        self.object_store_options
            .iter()
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect()
    }

    pub fn metastore_url(&self) -> String {
        if !self.metastore.is_empty() {
            return self.metastore.clone();
        }
        let db = absolute(&self.data_dir).join("metastore.db");
        format!("sqlite://{}", db.display())
    }
}

fn absolute(path: &std::path::Path) -> PathBuf {
    if path.is_absolute() {
        return path.to_path_buf();
    }
    let relative = path.strip_prefix(".").unwrap_or(path);
    std::env::current_dir()
        .map(|cwd| cwd.join(relative))
        .unwrap_or_else(|_| path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `scrape_config_files` add their jobs to the file's own, read from beside it; a
    /// missing one is an error that names it.
    #[test]
    fn scrape_config_files_add_their_jobs() {
        let dir = tempfile::tempdir().unwrap();
        let job = |name: &str| {
            format!("scrape_configs:\n  - job_name: {name}\n    static_configs: [{{targets: ['127.0.0.1:6060']}}]\n")
        };
        std::fs::create_dir(dir.path().join("scrape")).unwrap();
        std::fs::write(dir.path().join("scrape/pods.yaml"), job("pods")).unwrap();
        let config = dir.path().join("kiln.yaml");
        std::fs::write(
            &config,
            format!("{}scrape_config_files: [scrape/pods.yaml]\n", job("own")),
        )
        .unwrap();
        let read = ServerConfig::from_yaml_file(&config).unwrap();
        let jobs: Vec<&str> = read
            .scrape_configs
            .iter()
            .map(|j| j.job_name.as_str())
            .collect();
        assert_eq!(jobs, ["own", "pods"]);
        std::fs::write(&config, "scrape_config_files: [missing.yaml]\n").unwrap();
        let err = ServerConfig::from_yaml_file(&config).unwrap_err();
        assert!(err.contains("missing.yaml"), "{err}");
    }

    /// The README's configuration example is a config the server takes, as written.
    #[test]
    fn the_readme_example_is_a_valid_config() {
        let readme = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"),
        )
        .expect("README.md");
        let block = readme
            .split("```yaml\n")
            .find(|block| block.starts_with("listen:"))
            .and_then(|block| block.split("```").next())
            .expect("the README's config block");
        let config: ServerConfig = yaml_serde::from_str(block).expect("valid config");
        let defaults = ServerConfig::default();
        assert_eq!(
            config.limits.max_inflight_bytes,
            defaults.limits.max_inflight_bytes
        );
        assert_eq!(config.http, defaults.http);
        assert_eq!(config.query, defaults.query);
        assert_eq!(config.max_pending_bytes, defaults.max_pending_bytes);
        assert_eq!(
            config.compaction.max_job_profiles,
            defaults.compaction.max_job_profiles
        );
        assert_eq!(
            config.compaction.memory_limit,
            defaults.compaction.memory_limit
        );
        assert_eq!(
            config.compaction.max_wait_ms,
            defaults.compaction.max_wait_ms
        );
    }

    /// docs/symbolization.md's example is the defaults, and sizes take units; a flag's
    /// servers (`--debuginfod-url`, `DEBUGINFOD_URLS`) go over the file's.
    #[test]
    fn the_symbolization_example_is_the_defaults() {
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/symbolization.md"),
        )
        .expect("docs/symbolization.md");
        let block = doc
            .split("```yaml\n")
            .nth(1)
            .and_then(|block| block.split("```").next())
            .expect("the config block");
        let config: ServerConfig = yaml_serde::from_str(block).expect("valid config");
        assert_eq!(config.symbolization, ServerConfig::default().symbolization);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kiln.yaml");
        std::fs::write(
            &file,
            "symbolization:\n  debuginfod_urls: [http://file]\n  cache_bytes: 64MiB\n",
        )
        .unwrap();
        let mut overrides = yaml_serde::Mapping::new();
        overrides.insert(
            "symbolization.debuginfod_urls".into(),
            yaml_serde::to_value(vec!["http://a", "http://b"]).unwrap(),
        );
        let config = ServerConfig::layered(Some(&file), overrides).unwrap();
        assert_eq!(
            config.symbolization.debuginfod_urls,
            ["http://a", "http://b"]
        );
        assert_eq!(config.symbolization.cache_bytes, 64 << 20);
        let wrong = "symbolization:\n  cache_bytes: 1 parsec\n";
        assert!(yaml_serde::from_str::<ServerConfig>(wrong).is_err());
    }
}
