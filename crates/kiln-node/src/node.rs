//! Assembling a node from its roles: storage and metastore opened from their URLs, the
//! writer, queries, rules, compaction, scraping and the agent started where the roles
//! ask, the edge ([`kiln_server`]) served with them, and all of it stopped in the order
//! [`crate::shutdown`] gives.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kiln_compactor::Compactor;
use kiln_ingest::parse::ProfileContext;
use kiln_ingest::{Ingester, IngesterConfig, TenantLimits};
use kiln_metastore::Metastore;
use kiln_query::Querier;
use kiln_scrape::ScrapeManager;
use kiln_server::metrics::ServerMetrics;
use kiln_server::state::AppState;
use kiln_storage::ObjectStorage;
use prometheus_client::registry::Registry;
use thiserror::Error;
use tokio_util::sync::CancellationToken;

use crate::shutdown::{Stage, Stages};
use crate::ServerConfig;

#[derive(Debug, Error)]
pub enum ServerError {
    #[error("object storage: {0}")]
    Storage(#[from] kiln_storage::StorageError),
    #[error("metastore: {0}")]
    Metastore(#[from] kiln_metastore::MetastoreError),
    #[error("cannot listen on {address}: {source}")]
    Bind {
        address: String,
        source: std::io::Error,
    },
    #[error("server error: {0}")]
    Io(#[from] std::io::Error),
    #[error("server task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
    #[error("{0}")]
    Scrape(#[from] kiln_scrape::ScrapeError),
    #[error("host agent: {0}")]
    Agent(#[from] kiln_agent::PerfError),
    #[error("host agent: {0}")]
    AgentPods(#[from] kiln_kube::KubeError),
    #[error("{0}")]
    Rules(#[from] kiln_rules::RulesError),
    #[error("regressions: {0}")]
    Insight(#[from] kiln_insight::InsightError),
    #[error("symbolization: {0}")]
    Symbolize(#[from] kiln_symbolize::SymbolizeError),
    #[error("{0}")]
    Auth(#[from] kiln_auth::ConfigError),
    #[error("{0}")]
    Tls(#[from] kiln_server::tls::TlsError),
    #[error("{0}")]
    Target(String),
    #[error("reaching the other nodes: {0}")]
    PeerClient(#[source] kiln_cluster::ClientError),
    #[error("auth: tenant id {tenant:?}: {source}")]
    AuthTenant {
        tenant: String,
        source: kiln_server::error::TenantError,
    },
}

pub struct Server;

/// A started node; `shutdown` stops it in the order of [`crate::shutdown`]: it stops
/// accepting, finishes requests, flushes writes, then stops the background work.
pub struct RunningServer {
    pub local_addr: SocketAddr,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), ServerError>>,
}

impl RunningServer {
    pub async fn shutdown(mut self) -> Result<(), ServerError> {
        self.stop.cancel();
        self.wait().await
    }

    /// Waits until the server stops by itself (it never does unless it fails).
    pub async fn wait(&mut self) -> Result<(), ServerError> {
        match (&mut self.task).await {
            Ok(result) => result,
            Err(err) => Err(ServerError::Task(err)),
        }
    }

    /// Cancelling it shuts the node down; [`RunningServer::wait`] then returns.
    pub fn stop_signal(&self) -> CancellationToken {
        self.stop.clone()
    }
}

impl Server {
    pub async fn start(config: ServerConfig) -> Result<RunningServer, ServerError> {
        let roles = kiln_cluster::Roles::parse(&config.target).map_err(ServerError::Target)?;
        std::fs::create_dir_all(&config.data_dir)?;
        let storage =
            ObjectStorage::open_with(&config.object_store_url(), &config.object_store_options())?;
        let metastore = Metastore::open(&config.metastore_url()).await?;
        tracing::info!(object_store = %config.object_store_url(), metastore = %kiln_metastore::redact_url(&config.metastore_url()), "storage opened");

        let stages = Stages::new();
        let wal = if config.wal
            && kiln_ingest::writer::logs_writes(
                &storage,
                &metastore,
                roles == kiln_cluster::Roles::all(),
            ) {
            Some(kiln_ingest::wal::Wal::open(config.data_dir.join("wal"))?)
        } else {
            None
        };
        let logged = wal.is_some();
        let (ingester, writer_task) = Ingester::start_with_wal(
            storage.clone(),
            metastore.clone(),
            IngesterConfig {
                flush_interval: Duration::from_millis(config.flush_interval_ms.max(1)),
                adaptive: config.flush_adaptive,
                min_gap: Duration::from_millis(config.flush_min_gap_ms),
                // On every node with compaction on, whichever node runs it: the backlog
                // is read from the shared metastore.
                max_compaction_wait: (config.compaction.enabled
                    && config.compaction.max_wait_ms > 0)
                    .then(|| Duration::from_millis(config.compaction.max_wait_ms)),
                flush_bytes: config.flush_bytes,
                max_pending_bytes: config.max_pending_bytes,
                max_stack_depth: config.limits.max_stack_depth,
                segment_interval: Duration::from_millis(config.wal_segment_interval_ms.max(1)),
                rules_segment_interval: Duration::from_millis(
                    config.wal_rules_segment_interval_ms.max(1),
                ),
                ..IngesterConfig::default()
            },
            wal,
        );
        let metrics = ServerMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let auth = authenticator(&config)?;
        let node_credential = node_credential(&config, &roles, auth.is_some())?;
        if let Some(auth) = &auth {
            auth.register(&mut registry);
        }
        let tls = if config.tls.enabled() {
            let tls = Arc::new(kiln_server::tls::Tls::load(&config.tls)?);
            tls.register(&mut registry);
            Some(tls)
        } else {
            None
        };
        ingester.metrics().register(&mut registry);
        let mut querier =
            Querier::new(metastore.clone(), storage.clone()).with_budget(config.query);
        if logged {
            // Reads flush what the write-ahead log acknowledged, so none is stale.
            let syncer = ingester.syncer();
            querier = querier.with_freshness(Arc::new(move |scope| {
                let syncer = syncer.clone();
                Box::pin(async move { syncer.sync_for(&scope).await })
            }));
        }
        let symbolizer = kiln_symbolize::Symbolizer::new(
            storage.clone(),
            config.data_dir.join("debuginfo-cache"),
            config.symbolization.clone(),
        )?;
        symbolizer.register(&mut registry);
        querier = querier.with_symbolizer(Arc::new(symbolizer.clone()));
        querier.metrics().register(&mut registry);
        let root = kiln_query::root::Root::new(querier.clone());
        let rules = kiln_rules::Rules::new(
            metastore.clone(),
            querier.clone(),
            kiln_rules::RulesConfig {
                recording_rules: config.recording_rules.clone(),
                remote_write: config.remote_write.clone(),
                settings: config.rule_export.clone(),
                default_tenant: kiln_server::tenant::DEFAULT_TENANT.to_string(),
                node: node_name(&config.listen),
            },
        )?;
        rules.sync_file_rules().await?;
        // Every node's segments are counted as they are registered, seconds after their
        // writes; those registered before (recovered from the log) by level 0.
        let ruled = metastore
            .recording_rules(None)
            .await?
            .into_iter()
            .map(|rule| rule.tenant)
            .collect();
        ingester.count_rules_with(rules.hook(), ruled);
        rules.register(&mut registry);
        // Rules and the regression watcher evaluate on nodes with the rules role; their
        // definitions and findings are served by any node.
        if roles.has("rules") {
            for task in rules.spawn(stages.stop_signal(Stage::Rules))? {
                stages.track(Stage::Rules, task);
            }
        }
        let insight = kiln_insight::Insight::new(querier.clone(), config.regressions.clone())?;
        insight.register(&mut registry);
        if config.compaction.enabled && roles.has("compact") {
            let mut compaction = config.compaction.clone();
            compaction.retention_days = config.limits.retention_days;
            compaction.tenant_retention_days = config
                .tenant_limits
                .iter()
                .map(|(tenant, limits)| (tenant.clone(), limits.retention_days))
                .collect();
            let compactor = Compactor::new(metastore.clone(), storage.clone(), compaction)
                .with_rules(rules.hook());
            compactor.metrics().register(&mut registry);
            stages.track(
                Stage::Compaction,
                compactor.spawn(stages.stop_signal(Stage::Compaction)),
            );
        }
        let listener = tokio::net::TcpListener::bind(&config.listen)
            .await
            .map_err(|source| ServerError::Bind {
                address: config.listen.clone(),
                source,
            })?;
        let local_addr = listener.local_addr()?;
        let membership = Arc::new(kiln_cluster::Membership::new(
            metastore.clone(),
            // The bound address: two nodes asked for port 0 on one host are two nodes.
            node_name(&local_addr.to_string()),
            &roles,
            kiln_cluster::advertise_address(&config.node, local_addr),
            &config.node,
        ));
        // The first heartbeat before serving, so the node is listed once it answers.
        if let Err(err) = membership.beat().await {
            tracing::warn!(error = %err, "first heartbeat not written; retrying in the background");
        }
        stages.track(
            Stage::Membership,
            membership
                .clone()
                .spawn(stages.stop_signal(Stage::Membership)),
        );
        tracing::info!(node = membership.id(), target = %roles, "node roles");
        if roles.has("rules") {
            // Rules nodes share the watched services as scrape nodes share targets.
            let owner_of = membership.clone();
            insight
                .watcher()
                .share(Arc::new(move |tenant: &str, service: &str| {
                    owner_of.owns(
                        "rules",
                        &kiln_cluster::forward::placement_key(tenant, service),
                    )
                }));
            stages.track(
                Stage::Rules,
                insight.spawn(stages.stop_signal(Stage::Rules)),
            );
        }
        kiln_ingest::cpu::set_max_wait(Duration::from_millis(config.http.max_parse_wait_ms));
        let limits = TenantLimits::new(
            config.limits,
            config.tenant_limits.clone(),
            config.http.max_inflight_bytes,
        );
        limits.register(&mut registry);
        let targets = if config.scrape_configs.is_empty() || !roles.has("scrape") {
            None
        } else {
            let sink = scrape_sink(
                ingester.clone(),
                // Scrapes are paced by their interval, not by requests: no in-flight bound.
                Arc::new(TenantLimits::new(
                    config.limits,
                    config.tenant_limits.clone(),
                    usize::MAX,
                )),
            );
            // Scrape nodes share the targets by rendezvous hashing over the live ones.
            let owner_of = membership.clone();
            let manager = ScrapeManager::new(config.scrape_configs.clone(), sink)?
                .with_owner(Arc::new(move |key: &str| owner_of.owns("scrape", key)));
            let targets = manager.targets();
            stages.track(
                Stage::Collectors,
                manager.spawn(stages.stop_signal(Stage::Collectors))?,
            );
            Some(targets)
        };
        if let Some(targets) = &targets {
            // Per-target health, read from the live targets at each scrape.
            registry.register_collector(Box::new(targets.clone()));
        }
        if config.agent.enabled && !roles.has("ingest") {
            tracing::warn!(target = %roles, "agent: enabled, but this node does not ingest; not started");
        }
        if config.agent.enabled && roles.has("ingest") {
            let agent =
                start_agent(&config.agent, ingester.clone(), limits_for_agent(&config)).await?;
            stages.on_stop(Stage::Collectors, agent.stop());
        }
        let tls_roots = match (&tls, &config.tls.cert_file) {
            (Some(_), Some(path)) => Some(std::fs::read(path)?),
            _ => None,
        };
        // An owner acknowledges after its flush, up to a flush interval after the write
        // arrives: a forward must be allowed that long, or every write not flushed in time
        // would be written twice (there and here).
        let node = kiln_cluster::NodeConfig {
            forward_timeout_ms: config.node.forward_timeout_ms.max(
                config
                    .flush_interval_ms
                    .saturating_mul(2)
                    .saturating_add(1_000),
            ),
            ..config.node.clone()
        };
        let forwarder =
            kiln_cluster::Forwarder::new(membership.clone(), &node, tls_roots.as_deref())
                .map_err(ServerError::PeerClient)?;
        forwarder.register(&mut registry);
        if roles.has("query") {
            // Large queries split over the other live query nodes; a share may take as
            // long as a query may.
            let client = kiln_cluster::http_client(
                Duration::from_millis(config.query.timeout_ms.max(1_000)),
                tls_roots.as_deref(),
            )
            .map_err(ServerError::PeerClient)?;
            root.fan_out(kiln_query::root::Fanout {
                peers: Arc::new(kiln_cluster::fanout::QueryPeers::new(
                    membership.clone(),
                    client,
                    tls_roots.is_some(),
                    node_credential
                        .as_ref()
                        .map(kiln_auth::NodeCredential::header),
                )),
                min_profiles: config.node.fanout_min_profiles,
            });
        }
        let state = Arc::new(AppState {
            symbolizer,
            roles,
            membership,
            forwarder,
            ingester,
            querier,
            root,
            rules,
            insight,
            limits,
            auth,
            node_credential,
            metrics: metrics.clone(),
            registry,
            ready: AtomicBool::new(false),
            targets,
            sources: kiln_query::source::Sources::new(config.source.clone()),
            body_read_timeout: Duration::from_millis(config.http.body_read_timeout_ms.max(1)),
            body_idle_timeout: Duration::from_millis(config.http.body_idle_timeout_ms.max(1)),
        });

        state.ready.store(true, Ordering::SeqCst);
        metrics.ready.set(1);
        if let Some(tls) = &tls {
            let reloader = tls.clone().reload_on_sighup()?;
            stages.on_stop(Stage::Edge, async move { reloader.abort() });
        }
        tracing::info!(%local_addr, tls = tls.is_some(), "kiln server listening");

        let stop = CancellationToken::new();
        let stopping = stop.clone();
        let task = tokio::spawn(async move {
            let served = kiln_server::serve(
                listener,
                state.clone(),
                config.http,
                tls,
                stopping.cancelled_owned(),
            )
            .await;
            state.ready.store(false, Ordering::SeqCst);
            stages.stop(Stage::Edge).await;
            // The scrapers and the agent hold ingester handles too: stopped first.
            stages.stop(Stage::Collectors).await;
            // Dropping the last handle lets the writer flush what is queued and stop.
            drop(state);
            stages.track(Stage::Writer, writer_task);
            for stage in [
                Stage::Writer,
                Stage::Compaction,
                Stage::Rules,
                Stage::Membership,
            ] {
                stages.stop(stage).await;
            }
            served.map_err(ServerError::Io)
        });
        Ok(RunningServer {
            local_addr,
            stop,
            task,
        })
    }
}

/// The token checker, or `None` with auth off, which is only said aloud when the port
/// is reachable from elsewhere.
fn authenticator(config: &ServerConfig) -> Result<Option<kiln_auth::Authenticator>, ServerError> {
    for tenant in config.auth.tenants.keys() {
        kiln_server::tenant::validate(tenant).map_err(|source| ServerError::AuthTenant {
            tenant: tenant.clone(),
            source,
        })?;
    }
    let auth = kiln_auth::Authenticator::from_config(&config.auth)?;
    let loopback = config
        .listen
        .parse::<SocketAddr>()
        .is_ok_and(|addr| addr.ip().is_loopback())
        || config.listen.starts_with("localhost:");
    if auth.is_none() && !loopback {
        tracing::warn!(
            listen = %config.listen,
            "auth is off: anyone who can reach this port can read and write every tenant's profiles (see docs/security.md)"
        );
    }
    Ok(auth)
}

/// The node credential, from `cluster.token_file`. Split roles with auth on need one: a
/// query node's shares go to its peers' node-only endpoints, which tenant tokens do not
/// open.
fn node_credential(
    config: &ServerConfig,
    roles: &kiln_cluster::Roles,
    auth: bool,
) -> Result<Option<kiln_auth::NodeCredential>, ServerError> {
    match &config.cluster.token_file {
        Some(path) => Ok(Some(kiln_auth::NodeCredential::from_file(path)?)),
        None if auth && *roles != kiln_cluster::Roles::all() => Err(ServerError::Auth(
            kiln_auth::ConfigError(
                "auth is on and this node runs only some roles: set cluster.token_file (the same file on every node) so query nodes can ask each other for a query's shares".to_string(),
            ),
        )),
        None => Ok(None),
    }
}

/// Host and listen address: what identifies this node across its restarts.
fn node_name(listen: &str) -> String {
    format!("{}@{listen}", kiln_cluster::host_name())
}

fn limits_for_agent(config: &ServerConfig) -> kiln_ingest::Limits {
    config
        .tenant_limits
        .get(&config.agent.tenant)
        .copied()
        .unwrap_or(config.limits)
}

/// The in-process agent: its collector thread and the task writing its reports.
struct RunningAgent {
    stop: Arc<AtomicBool>,
    collector: std::thread::JoinHandle<()>,
    writer: tokio::task::JoinHandle<()>,
}

impl RunningAgent {
    async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let collector = self.collector;
        // The collector sends its last report and drops its sender, which ends the writer.
        let _ = tokio::task::spawn_blocking(move || collector.join()).await;
        let _ = self.writer.await;
    }
}

/// Starts the host agent, writing to `ingester`; fails at once when perf events are not
/// permitted, with what to change.
async fn start_agent(
    settings: &crate::config::AgentSettings,
    ingester: Ingester,
    limits: kiln_ingest::Limits,
) -> Result<RunningAgent, ServerError> {
    let config = kiln_agent::AgentConfig {
        frequency: settings.frequency.clamp(1, 1000),
        interval: Duration::from_millis(settings.interval_ms.max(100)),
        relabel_configs: settings.relabel_configs.clone(),
        env_allowlist: settings.env_allowlist.clone(),
        memory_limit: settings.memory_limit_bytes,
        ebpf: settings.ebpf,
        off_cpu: settings.off_cpu.then_some(settings.off_cpu_threshold),
        interpreters: settings.interpreters,
        symbolize: settings.symbolize,
        containers: match settings.kubernetes {
            true => Some(crate::kubernetes::node_pods().await?),
            false => None,
        },
    };
    let stop = Arc::new(AtomicBool::new(false));
    // Reports wait here while a flush is slow; past 64 intervals the newest are dropped.
    let (reports, mut received) = tokio::sync::mpsc::channel::<Vec<kiln_agent::Report>>(64);
    let frequency = config.frequency;
    let sink = move |batch: Vec<kiln_agent::Report>| {
        if !batch.is_empty() && reports.try_send(batch).is_err() {
            tracing::warn!("host agent reports dropped: the writer is behind");
        }
    };
    let collector = {
        let stop = stop.clone();
        tokio::task::spawn_blocking(move || kiln_agent::Collector::spawn(config, stop, sink))
            .await
            .map_err(ServerError::Task)??
    };
    tracing::info!(
        cpus = collector.cpus,
        frequency,
        "host agent profiling every process"
    );
    let collector = collector.thread;
    let tenant = settings.tenant.clone();
    let writer = tokio::spawn(async move {
        while let Some(batch) = received.recv().await {
            let mut parsed = Vec::with_capacity(batch.len());
            for report in batch {
                let context = ProfileContext {
                    labels: kiln_model::labels::Labels::from_pairs(report.labels),
                    ..Default::default()
                };
                let profile = report.profile;
                match kiln_ingest::cpu::run_parser_waiting(move || {
                    kiln_ingest::parse::from_pprof(profile, context, 0, &limits)
                })
                .await
                {
                    Ok(profile) => parsed.push(profile),
                    Err(err) => tracing::warn!(error = %err, "host agent report refused"),
                }
            }
            if let Err(err) = ingester.write(&tenant, parsed).await {
                tracing::warn!(error = %err, "host agent reports not written");
            }
        }
    });
    Ok(RunningAgent {
        stop,
        collector,
        writer,
    })
}

/// Hands scraped profiles to the ingester as a push would, under the job's tenant.
fn scrape_sink(ingester: Ingester, limits: Arc<TenantLimits>) -> kiln_scrape::Sink {
    Arc::new(move |scraped: kiln_scrape::ScrapedProfile| {
        let (ingester, limits) = (ingester.clone(), limits.clone());
        Box::pin(async move {
            let tenant = scraped
                .tenant
                .unwrap_or_else(|| kiln_server::tenant::DEFAULT_TENANT.to_string());
            let tenant_limits = limits.for_tenant(&tenant);
            let labels: Vec<(String, String)> = scraped.labels.into_iter().collect();
            let context = ProfileContext {
                labels: kiln_model::labels::Labels::from_pairs(labels),
                name: Some(scraped.kind),
                time_nanos: Some(scraped.time_nanos),
                duration_nanos: Some(scraped.duration_nanos),
                ..Default::default()
            };
            let profile = scraped.profile;
            let parsed = kiln_ingest::cpu::run_parser_waiting(move || {
                kiln_ingest::parse::from_pprof(profile, context, 0, &tenant_limits)
            })
            .await
            .map_err(|err| err.to_string())?;
            ingester
                .write(&tenant, vec![parsed])
                .await
                .map_err(|err| err.to_string())
        })
    })
}
