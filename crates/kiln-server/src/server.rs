//! Starting and stopping the server: storage, metastore, writer, router, listener.

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
use kiln_storage::ObjectStorage;
use prometheus_client::registry::Registry;
use thiserror::Error;
use tokio::sync::oneshot;

use crate::metrics::ServerMetrics;
use crate::routes::{router, AppState};
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
    #[error("{0}")]
    Scrape(#[from] kiln_scrape::ScrapeError),
}

pub struct Server;

/// A started server; `shutdown` stops accepting, finishes requests and flushes writes.
pub struct RunningServer {
    pub local_addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), ServerError>>,
}

impl RunningServer {
    pub async fn shutdown(mut self) -> Result<(), ServerError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.wait().await
    }

    /// Waits until the server stops by itself (it never does unless it fails).
    pub async fn wait(&mut self) -> Result<(), ServerError> {
        match (&mut self.task).await {
            Ok(result) => result,
            Err(err) => Err(ServerError::Io(std::io::Error::other(err.to_string()))),
        }
    }

    pub fn stop_signal(&mut self) -> Option<oneshot::Sender<()>> {
        self.stop.take()
    }
}

impl Server {
    pub async fn start(config: ServerConfig) -> Result<RunningServer, ServerError> {
        std::fs::create_dir_all(&config.data_dir)?;
        let storage =
            ObjectStorage::open_with(&config.object_store_url(), &config.object_store_options())?;
        let metastore = Metastore::open(&config.metastore_url()).await?;
        tracing::info!(object_store = %config.object_store_url(), metastore = %kiln_metastore::redact_url(&config.metastore_url()), "storage opened");

        let (ingester, writer_task) = Ingester::start(
            storage.clone(),
            metastore.clone(),
            IngesterConfig {
                flush_interval: Duration::from_millis(config.flush_interval_ms.max(1)),
                flush_bytes: config.flush_bytes,
                max_stack_depth: config.limits.max_stack_depth,
                ..IngesterConfig::default()
            },
        );
        let metrics = ServerMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        ingester.metrics().register(&mut registry);
        let (stop_compactor, compactor_stopped) = tokio::sync::watch::channel(false);
        let compactor_task = if config.compaction.enabled {
            let mut compaction = config.compaction.clone();
            compaction.retention_days = config.limits.retention_days;
            compaction.tenant_retention_days = config
                .tenant_limits
                .iter()
                .map(|(tenant, limits)| (tenant.clone(), limits.retention_days))
                .collect();
            let compactor = Compactor::new(metastore.clone(), storage.clone(), compaction);
            compactor.metrics().register(&mut registry);
            Some(compactor.spawn(compactor_stopped))
        } else {
            None
        };
        let (stop_scrape, scrape_stopped) = tokio::sync::watch::channel(false);
        let limits = TenantLimits::new(config.limits, config.tenant_limits.clone());
        let (targets, scrape_task) = if config.scrape_configs.is_empty() {
            (None, None)
        } else {
            let sink = scrape_sink(
                ingester.clone(),
                Arc::new(TenantLimits::new(
                    config.limits,
                    config.tenant_limits.clone(),
                )),
            );
            let manager = ScrapeManager::new(config.scrape_configs.clone(), sink)?;
            let targets = manager.targets();
            (Some(targets), Some(manager.spawn(scrape_stopped)?))
        };
        let state = Arc::new(AppState {
            ingester,
            querier: Querier::new(metastore, storage),
            limits,
            metrics: metrics.clone(),
            registry,
            ready: AtomicBool::new(false),
            targets,
            body_read_timeout: Duration::from_millis(config.http.body_read_timeout_ms.max(1)),
        });

        let listener = tokio::net::TcpListener::bind(&config.listen)
            .await
            .map_err(|source| ServerError::Bind {
                address: config.listen.clone(),
                source,
            })?;
        let local_addr = listener.local_addr()?;
        let app = router(state.clone());
        state.ready.store(true, Ordering::SeqCst);
        metrics.ready.set(1);
        tracing::info!(%local_addr, "kiln server listening");

        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let served =
                crate::listener::serve(listener, app, config.http, metrics.clone(), async move {
                    let _ = stopped.await;
                })
                .await;
            state.ready.store(false, Ordering::SeqCst);
            // The scrapers hold ingester handles too: stop them first.
            let _ = stop_scrape.send(true);
            if let Some(task) = scrape_task {
                let _ = task.await;
            }
            // Dropping the last handle lets the writer flush what is queued and stop.
            drop(state);
            let _ = writer_task.await;
            let _ = stop_compactor.send(true);
            if let Some(task) = compactor_task {
                let _ = task.await;
            }
            served.map_err(ServerError::Io)
        });
        Ok(RunningServer {
            local_addr,
            stop: Some(stop),
            task,
        })
    }
}

/// Hands scraped profiles to the ingester as a push would, under the job's tenant.
fn scrape_sink(ingester: Ingester, limits: Arc<TenantLimits>) -> kiln_scrape::Sink {
    Arc::new(move |scraped: kiln_scrape::ScrapedProfile| {
        let (ingester, limits) = (ingester.clone(), limits.clone());
        Box::pin(async move {
            let tenant = scraped
                .tenant
                .unwrap_or_else(|| crate::tenant::DEFAULT_TENANT.to_string());
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
            let parsed = kiln_ingest::cpu::run_parser(move || {
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
