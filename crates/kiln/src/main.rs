//! `kiln`: one binary for every role. `kiln server` runs ingest, storage and queries on
//! one machine with embedded defaults; `kiln bench` measures the hot paths.

mod admin;
mod agent;
mod allocator;
mod client;
mod debuginfo;
mod mcp;
mod query;
mod rules;
mod scrape;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use kiln_node::{Server, ServerConfig};

#[derive(Parser)]
#[command(
    name = "kiln",
    version,
    about = "Continuous profiling: collect, store and query profiles"
)]
struct Cli {
    /// Log filter, in tracing's env-filter syntax (e.g. info, kiln_ingest=debug).
    #[arg(long, env = "KILN_LOG_LEVEL", default_value = "info", global = true)]
    log_level: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server: ingest, storage and queries on one port.
    Server(ServerArgs),
    /// Query a server: flame graphs, top functions, series, diffs, labels.
    Query(query::QueryArgs),
    /// Recording rules: list them, backfill one over stored profiles.
    Rules(rules::RulesArgs),
    /// Inspect what a server's storage holds.
    Admin(admin::AdminArgs),
    /// Scrape pprof endpoints and push the profiles to a Kiln server.
    Scrape(scrape::ScrapeArgs),
    /// Profile every process on this host (perf events) and push to a Kiln server.
    Agent(agent::AgentArgs),
    /// Debug files for stripped binaries' frames: upload them, see what a server holds.
    Debuginfo(debuginfo::DebuginfoArgs),
    /// Kiln's tools for AI assistants, over the Model Context Protocol on stdio (docs/mcp.md).
    Mcp(mcp::McpArgs),
    /// Tokens for `auth:` (docs/security.md).
    Auth {
        #[command(subcommand)]
        command: AuthCommand,
    },
    /// Measure a hot path and print its figures.
    Bench {
        #[command(subcommand)]
        bench: kiln_bench::BenchCommand,
    },
}

#[derive(Subcommand)]
enum AuthCommand {
    /// Print a fresh random token and the config line that grants it; only the line's
    /// hash is needed by the server, so keep the token where the client reads it.
    NewToken {
        /// Tenant the token belongs to.
        #[arg(long)]
        tenant: String,
        /// What it may do: read, write and/or admin, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        scopes: Vec<kiln_auth::Scope>,
        /// A name for logs and errors (the client it is for).
        #[arg(long)]
        name: String,
    },
}

/// `kiln auth new-token`: the token on the first line (for `| head -1 > file`), then
/// where its line goes in the config, then the line.
fn new_token(tenant: &str, scopes: &[kiln_auth::Scope], name: &str) -> anyhow::Result<()> {
    kiln_server::tenant::validate(tenant).with_context(|| format!("--tenant {tenant:?}"))?;
    if name.trim().is_empty() || name.contains(['"', '\\', '\n']) {
        anyhow::bail!("--name must be non-empty and hold no quotes, backslashes or newlines");
    }
    let token = kiln_auth::new_token().context("the system's random generator failed")?;
    let mut scopes = scopes.to_vec();
    scopes.sort();
    scopes.dedup();
    let scopes: Vec<String> = scopes.iter().map(ToString::to_string).collect();
    println!("{token}");
    println!("# under auth.tenants.{tenant}.tokens:");
    println!(
        "- {{ name: \"{name}\", sha256: \"{}\", scopes: [{}] }}",
        kiln_auth::sha256_hex(&token),
        scopes.join(", ")
    );
    Ok(())
}

/// Flags override environment variables, which override the config file. Each is
/// serialized under the dotted key of the setting it overrides, and laid over the file
/// by `ServerConfig::layered`; one left unset is skipped.
#[derive(Args, serde::Serialize)]
struct ServerArgs {
    /// YAML config file.
    #[arg(long, env = "KILN_CONFIG")]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// What this process runs: all, or a comma-separated list of ingest, query, compact,
    /// scrape, rules [default: all].
    #[arg(long, env = "KILN_TARGET")]
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<String>,
    /// Listen address (HTTP/1.1 and h2c gRPC, or HTTPS with --tls-cert-file) [default:
    /// 0.0.0.0:4040].
    #[arg(long, env = "KILN_LISTEN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    listen: Option<String>,
    /// Data directory for the embedded object store and metastore [default: ./kiln-data].
    #[arg(long, env = "KILN_DATA_DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    data_dir: Option<PathBuf>,
    /// Object store URL [default: file://<data-dir>/blocks].
    #[arg(long, env = "KILN_OBJECT_STORE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    object_store: Option<String>,
    /// Metastore URL [default: sqlite://<data-dir>/metastore.db].
    #[arg(long, env = "KILN_METASTORE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    metastore: Option<String>,
    /// Longest a write waits for its segment flush, in milliseconds [default: 500].
    #[arg(long, env = "KILN_FLUSH_INTERVAL_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    flush_interval_ms: Option<u64>,
    /// Flush as soon as no other write is on its way, instead of always waiting the
    /// interval [default: true].
    #[arg(long, env = "KILN_FLUSH_ADAPTIVE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    flush_adaptive: Option<bool>,
    /// Shortest time between the starts of two adaptive flushes, in milliseconds
    /// [default: 0].
    #[arg(long, env = "KILN_FLUSH_MIN_GAP_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    flush_min_gap_ms: Option<u64>,
    /// Acknowledge writes from a write-ahead log (local store and SQLite only)
    /// [default: true].
    #[arg(long, env = "KILN_WAL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    wal: Option<bool>,
    /// With the write-ahead log, the longest a write waits for its segment, in
    /// milliseconds [default: 30000].
    #[arg(long, env = "KILN_WAL_SEGMENT_INTERVAL_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    wal_segment_interval_ms: Option<u64>,
    /// The same while recording rules exist, which count a segment as it is registered,
    /// in milliseconds [default: 5000].
    #[arg(long, env = "KILN_WAL_RULES_SEGMENT_INTERVAL_MS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    wal_rules_segment_interval_ms: Option<u64>,
    /// Largest request body, compressed, in bytes [default: 16777216].
    #[arg(long, env = "KILN_MAX_BODY_BYTES")]
    #[serde(
        rename = "limits.max_body_bytes",
        skip_serializing_if = "Option::is_none"
    )]
    max_body_bytes: Option<usize>,
    /// Largest body after decompression, in bytes [default: 67108864].
    #[arg(long, env = "KILN_MAX_DECOMPRESSED_BYTES")]
    #[serde(
        rename = "limits.max_decompressed_bytes",
        skip_serializing_if = "Option::is_none"
    )]
    max_decompressed_bytes: Option<usize>,
    /// Days of profiles kept; 0 keeps everything [default: 31]. Per tenant in the config
    /// file (`tenant_limits.<tenant>.retention_days`).
    #[arg(long, env = "KILN_RETENTION_DAYS")]
    #[serde(
        rename = "limits.retention_days",
        skip_serializing_if = "Option::is_none"
    )]
    retention_days: Option<u32>,
    /// How far ahead of the server's clock a profile may be stamped, in milliseconds; 0
    /// means no bound [default: 3600000].
    #[arg(long, env = "KILN_MAX_FUTURE_SKEW_MS")]
    #[serde(
        rename = "limits.max_future_skew_ms",
        skip_serializing_if = "Option::is_none"
    )]
    max_future_skew_ms: Option<u64>,
    /// Client connections open at once; more are answered 429 [default: 4096].
    #[arg(long, env = "KILN_MAX_CONNECTIONS")]
    #[serde(
        rename = "http.max_connections",
        skip_serializing_if = "Option::is_none"
    )]
    max_connections: Option<usize>,
    /// The address the other nodes reach this one at (`node.advertise_address`), as
    /// `host:port`; by default the host name and the listen port. On Kubernetes, the pod's
    /// IP from the downward API (deploy/kubernetes).
    #[arg(long, env = "KILN_ADVERTISE_ADDRESS")]
    #[serde(
        rename = "node.advertise_address",
        skip_serializing_if = "Option::is_none"
    )]
    advertise_address: Option<String>,
    /// Profile this host's processes in-process, as `kiln agent` does [default: false].
    #[arg(long, env = "KILN_AGENT")]
    #[serde(rename = "agent.enabled", skip_serializing_if = "std::ops::Not::not")]
    agent: bool,
    /// Run compaction and retention in this process [default: true].
    #[arg(long, env = "KILN_COMPACTION")]
    #[serde(rename = "compaction.enabled", skip_serializing_if = "Option::is_none")]
    compaction: Option<bool>,
    /// Serve HTTPS (and h2 over TLS, for gRPC) with this PEM certificate chain; SIGHUP
    /// re-reads it and the key.
    #[arg(long, env = "KILN_TLS_CERT_FILE", requires = "tls_key_file")]
    #[serde(rename = "tls.cert_file", skip_serializing_if = "Option::is_none")]
    tls_cert_file: Option<PathBuf>,
    /// The certificate's PEM private key.
    #[arg(long, env = "KILN_TLS_KEY_FILE", requires = "tls_cert_file")]
    #[serde(rename = "tls.key_file", skip_serializing_if = "Option::is_none")]
    tls_key_file: Option<PathBuf>,
    /// A directory of source checkouts, for a function's lines in the UI (`source.root`).
    #[arg(long, env = "KILN_SOURCE_ROOT")]
    #[serde(rename = "source.root", skip_serializing_if = "Option::is_none")]
    source_root: Option<PathBuf>,
    /// A URL per source file, fetched by the server: `{path}` and `{service}` filled in
    /// (`source.url_template`).
    #[arg(long, env = "KILN_SOURCE_URL_TEMPLATE")]
    #[serde(
        rename = "source.url_template",
        skip_serializing_if = "Option::is_none"
    )]
    source_url_template: Option<String>,
    /// A debuginfod server that names stripped binaries' frames; repeatable
    /// (`symbolization.debuginfod_urls`). `DEBUGINFOD_URLS` takes a space-separated
    /// list, as elfutils reads it.
    #[arg(
        long = "debuginfod-url",
        env = "DEBUGINFOD_URLS",
        value_delimiter = ' '
    )]
    #[serde(
        rename = "symbolization.debuginfod_urls",
        skip_serializing_if = "Vec::is_empty"
    )]
    debuginfod_url: Vec<String>,
}

impl ServerArgs {
    fn into_config(self) -> anyhow::Result<ServerConfig> {
        let overrides = match yaml_serde::to_value(&self)? {
            yaml_serde::Value::Mapping(overrides) => overrides,
            _ => yaml_serde::Mapping::new(),
        };
        ServerConfig::layered(self.config.as_deref(), overrides).map_err(anyhow::Error::msg)
    }
}

fn main() -> anyhow::Result<std::process::ExitCode> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&cli.log_level)
                .context("invalid --log-level")?,
        )
        .with_writer(std::io::stderr)
        // Colour codes only where a person reads them, not in a log file or a pipe.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    allocator::disable_transparent_huge_pages();
    kiln_runtime::priority::set_memory_release(allocator::release_memory);
    if matches!(
        cli.command,
        Command::Server(_) | Command::Scrape(_) | Command::Agent(_)
    ) {
        allocator::follow_process_size();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let done = match cli.command {
        Command::Server(args) => runtime.block_on(run_server(args.into_config()?)),
        Command::Bench { bench } => runtime.block_on(kiln_bench::run(bench)),
        // Queries are blocking HTTP calls and need no runtime.
        Command::Query(args) => return query::run(args),
        Command::Rules(args) => return rules::run(args),
        Command::Debuginfo(args) => debuginfo::run(args),
        Command::Admin(args) => runtime.block_on(admin::run(args)),
        Command::Scrape(args) => runtime.block_on(scrape::run(args)),
        Command::Agent(args) => runtime.block_on(agent::run(args)),
        Command::Mcp(args) => runtime.block_on(mcp::run(args)),
        Command::Auth {
            command:
                AuthCommand::NewToken {
                    tenant,
                    scopes,
                    name,
                },
        } => new_token(&tenant, &scopes, &name),
    };
    done.map(|()| std::process::ExitCode::SUCCESS)
}

async fn run_server(config: ServerConfig) -> anyhow::Result<()> {
    let mut server = Server::start(config)
        .await
        .context("failed to start the server")?;
    let stop = server.stop_signal();
    tokio::select! {
        result = server.wait() => return result.context("server failed"),
        _ = shutdown_signal() => {}
    }
    tracing::info!("shutting down: finishing requests and flushing writes");
    stop.cancel();
    server
        .wait()
        .await
        .context("server failed while shutting down")
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(_) => {
                    let _ = interrupt.await;
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The config `kiln ARGS` would start a server with.
    fn config_of(args: &[&str]) -> ServerConfig {
        let Command::Server(args) = Cli::parse_from(args).command else {
            panic!("expected the server command");
        };
        args.into_config().unwrap()
    }

    #[test]
    fn flags_override_the_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kiln.yaml");
        std::fs::write(
            &file,
            "listen: 127.0.0.1:5000\ndata_dir: /from/file\nflush_interval_ms: 250\nlimits:\n  max_labels_per_series: 7\ntenant_limits:\n  small:\n    ingestion_rate_bytes: 1000\n",
        )
        .unwrap();
        let config = config_of(&[
            "kiln",
            "server",
            "--config",
            file.to_str().unwrap(),
            "--data-dir",
            "/from/flag",
        ]);
        assert_eq!(config.listen, "127.0.0.1:5000");
        assert_eq!(config.data_dir, PathBuf::from("/from/flag"));
        assert_eq!(config.flush_interval_ms, 250);
        assert_eq!(config.limits.max_labels_per_series, 7);
        assert_eq!(
            config.limits.max_samples_per_profile, 64_000,
            "unset limits keep their defaults"
        );
        assert_eq!(config.tenant_limits["small"].ingestion_rate_bytes, 1000);
        assert_eq!(config.metastore_url(), "sqlite:///from/flag/metastore.db");
    }

    /// Every flag lands on the setting it names (a key that named none would be refused
    /// as an unknown one), over the file and over its environment variable.
    #[test]
    fn every_flag_overrides_its_setting() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kiln.yaml");
        std::fs::write(
            &file,
            "limits:\n  retention_days: 9\n  max_labels_per_series: 7\n",
        )
        .unwrap();
        let cert = dir.path().join("cert.pem");
        // A variable under its flag, and one with no flag given (no other test reads it).
        std::env::set_var("KILN_FLUSH_MIN_GAP_MS", "99");
        let config = config_of(&[
            "kiln",
            "server",
            "--config",
            file.to_str().unwrap(),
            "--target",
            "ingest,query",
            "--listen",
            "127.0.0.1:5001",
            "--data-dir",
            "/d",
            "--object-store",
            "s3://b/p",
            "--metastore",
            "postgres://h/db",
            "--flush-interval-ms",
            "11",
            "--flush-adaptive",
            "false",
            "--flush-min-gap-ms",
            "12",
            "--wal",
            "false",
            "--wal-segment-interval-ms",
            "13",
            "--wal-rules-segment-interval-ms",
            "7",
            "--max-body-bytes",
            "14",
            "--max-decompressed-bytes",
            "15",
            "--retention-days",
            "16",
            "--max-future-skew-ms",
            "17",
            "--max-connections",
            "18",
            "--agent",
            "--compaction",
            "false",
            "--tls-cert-file",
            cert.to_str().unwrap(),
            "--tls-key-file",
            "/k.pem",
            "--source-root",
            "/src",
            "--source-url-template",
            "http://127.0.0.1/{path}",
        ]);
        assert_eq!(config.target, "ingest,query");
        assert_eq!(config.listen, "127.0.0.1:5001");
        assert_eq!(config.data_dir, PathBuf::from("/d"));
        assert_eq!(config.object_store, "s3://b/p");
        assert_eq!(config.metastore, "postgres://h/db");
        assert_eq!(config.flush_interval_ms, 11);
        assert!(!config.flush_adaptive);
        assert_eq!(config.flush_min_gap_ms, 12, "the flag over its variable");
        assert!(!config.wal);
        assert_eq!(config.wal_segment_interval_ms, 13);
        assert_eq!(config.wal_rules_segment_interval_ms, 7);
        assert_eq!(config.limits.max_body_bytes, 14);
        assert_eq!(config.limits.max_decompressed_bytes, 15);
        assert_eq!(config.limits.retention_days, 16, "the flag over the file");
        assert_eq!(
            config.limits.max_labels_per_series, 7,
            "the file's other limits kept"
        );
        assert_eq!(config.limits.max_future_skew_ms, 17);
        assert_eq!(config.http.max_connections, 18);
        assert!(config.agent.enabled);
        assert!(!config.compaction.enabled);
        assert_eq!(config.tls.cert_file, Some(cert));
        assert_eq!(config.tls.key_file, Some(PathBuf::from("/k.pem")));
        assert_eq!(config.source.root, Some(PathBuf::from("/src")));
        assert_eq!(config.source.url_template, "http://127.0.0.1/{path}");
        // Unset flags override nothing.
        let config = config_of(&["kiln", "server", "--config", file.to_str().unwrap()]);
        std::env::remove_var("KILN_FLUSH_MIN_GAP_MS");
        assert_eq!(config.limits.retention_days, 9);
        assert_eq!(
            config.flush_min_gap_ms, 99,
            "the variable over the file's default"
        );
        assert_eq!(config.listen, ServerConfig::default().listen);
    }

    /// The README's example configuration is a valid one, with the defaults it shows.
    #[test]
    fn the_readme_config_example_parses() {
        let readme = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"),
        )
        .unwrap();
        let start = readme.find("```yaml\n").expect("a yaml block") + "```yaml\n".len();
        let end = start + readme[start..].find("```").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kiln.yaml");
        std::fs::write(&file, &readme[start..end]).unwrap();
        let config = ServerConfig::from_yaml_file(&file).unwrap();
        let defaults = ServerConfig::default();
        assert_eq!(config.limits, defaults.limits);
        assert_eq!(config.compaction, defaults.compaction);
        assert_eq!(config.tenant_limits["team-a"].retention_days, 7);
        // Every other yaml block of the README is a whole config file too.
        let mut rest = &readme[end..];
        let mut blocks = 0;
        while let Some(found) = rest.find("```yaml\n") {
            let start = found + "```yaml\n".len();
            let end = start + rest[start..].find("```").unwrap();
            if rest[start..].starts_with("groups:") {
                // Prometheus's alert for the recording rule: tests/rules.rs runs it.
                rest = &rest[end..];
                continue;
            }
            std::fs::write(&file, &rest[start..end]).unwrap();
            let config = ServerConfig::from_yaml_file(&file).unwrap();
            for scrape in &config.scrape_configs {
                scrape.validate().unwrap();
            }
            for rule in &config.recording_rules {
                rule.compile().unwrap();
            }
            blocks += 1;
            rest = &rest[end..];
        }
        assert!(blocks >= 1, "the scrape_configs example");
    }

    #[test]
    fn unknown_config_keys_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kiln.yaml");
        std::fs::write(&file, "listn: 127.0.0.1:5000\n").unwrap();
        let err = ServerConfig::from_yaml_file(&file).unwrap_err();
        assert!(err.contains("listn"), "{err}");
    }
}
