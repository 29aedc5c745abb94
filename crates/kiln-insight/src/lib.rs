//! Insight: what changed between two selections, and after each deploy, with a number
//! for how sure Kiln is.
//!
//! A diff flame graph shows every difference and leaves the reader to guess which are
//! noise. Here each function's change is tested: [`stats`] holds the method (per-profile
//! shares, Welch's t-test, Holm's correction; docs/insight.md explains it and when it
//! refuses), [`compare`] reads the two sides from storage in one pass per dataset and
//! answers `POST /api/v1/compare`, and [`watch`] runs the same comparison whenever a
//! service's version label takes a new value, storing findings in the metastore.

pub mod compare;
pub mod error;
pub mod stats;
pub mod watch;

use std::sync::Arc;

use kiln_query::Querier;
use prometheus_client::registry::Registry;

pub use compare::{CompareRequest, Comparison};
pub use error::InsightError;
pub use watch::{Finding, Owner, RegressionsConfig, Watcher};

/// What the server holds: comparisons on demand, and the watcher's findings.
#[derive(Clone)]
pub struct Insight {
    querier: Querier,
    watcher: Arc<Watcher>,
}

impl Insight {
    pub fn new(querier: Querier, config: RegressionsConfig) -> Result<Self, InsightError> {
        let watcher = Arc::new(Watcher::new(querier.clone(), config)?);
        Ok(Insight { querier, watcher })
    }

    pub async fn compare(
        &self,
        tenant: &str,
        request: &CompareRequest,
    ) -> Result<Comparison, InsightError> {
        compare::compare(
            &self.querier,
            tenant,
            request,
            kiln_model::time::now_nanos(),
        )
        .await
    }

    /// A tenant's findings since `since_ms`, newest first.
    pub async fn regressions(
        &self,
        tenant: &str,
        service: Option<String>,
        since_ms: i64,
    ) -> Result<Vec<Finding>, InsightError> {
        let records = self
            .querier
            .metastore()
            .regressions(tenant, service, since_ms)
            .await?;
        Ok(records
            .into_iter()
            .filter_map(|record| match serde_json::from_str(&record.finding) {
                Ok(finding) => Some(finding),
                Err(err) => {
                    tracing::warn!(function = record.function, error = %err, "unreadable stored finding");
                    None
                }
            })
            .collect())
    }

    pub fn watcher(&self) -> &Arc<Watcher> {
        &self.watcher
    }

    pub fn register(&self, registry: &mut Registry) {
        self.watcher.register(registry);
    }

    /// Starts the watcher (it returns at once when disabled).
    pub fn spawn(&self, stop: tokio::sync::watch::Receiver<bool>) -> tokio::task::JoinHandle<()> {
        self.watcher.clone().spawn(stop)
    }
}
