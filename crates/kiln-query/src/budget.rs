//! What one query may cost: profiles read, time taken, and how many of a tenant's
//! queries run at once.
//!
//! The profile count is known from the metastore before a byte is fetched, so a query
//! that would read too much is refused at once (422, with how to narrow it) instead of
//! after it has filled the dataset cache and held the cores for a minute. The time
//! budget catches what the count cannot foresee (a cold object store, a slow disk). The
//! per-tenant limit queues a tenant's own queries behind each other, so one tenant's
//! dashboard of fifty panels cannot take every core from the others.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kiln_metastore::DatasetMeta;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

use crate::{QueryError, SelectRequest};

/// `query:` in the server's config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QueryBudget {
    /// Profiles one query may read; 0 means no bound.
    pub max_profiles: u64,
    /// Longest one query may take, waiting for its turn included, in milliseconds; 0
    /// means no bound.
    pub timeout_ms: u64,
    /// Queries of one tenant running at once; more wait for their turn.
    pub max_concurrent_per_tenant: usize,
    /// Memory the decoded-dataset cache may hold, in bytes (0: no cache). Compacted
    /// blocks read for a long range are small (stack sums, no samples), so the default
    /// holds a month of a busy service's flame graph (docs/benchmarks.md).
    pub cache_bytes: u64,
    /// Memory for each dataset's share of the flame graphs asked (0: none kept), so that
    /// a flame graph asked again reads only the datasets that are new since
    /// (`crate::tree_cache`).
    pub tree_cache_bytes: u64,
}

impl Default for QueryBudget {
    fn default() -> Self {
        QueryBudget {
            // A month of one service at a profile per 10 s from 10 instances is 2.6 M.
            max_profiles: 5_000_000,
            timeout_ms: 60_000,
            max_concurrent_per_tenant: 8,
            cache_bytes: 256 << 20,
            tree_cache_bytes: 64 << 20,
        }
    }
}

/// The budget and each tenant's turn-taking.
#[derive(Default)]
pub(crate) struct Budget {
    pub(crate) limits: QueryBudget,
    turns: Mutex<HashMap<String, Arc<Semaphore>>>,
}

fn range(request: &SelectRequest) -> String {
    let seconds = (request.to_nanos.saturating_sub(request.from_nanos)) / 1_000_000_000;
    match seconds {
        s if s >= 2 * 86_400 => format!("{} days", s / 86_400),
        s if s >= 2 * 3_600 => format!("{} hours", s / 3_600),
        s => format!("{} minutes", (s / 60).max(1)),
    }
}

impl Budget {
    pub(crate) fn new(limits: QueryBudget) -> Self {
        Budget {
            limits,
            turns: Mutex::new(HashMap::new()),
        }
    }

    /// Refuses a selection that would read more profiles than the budget.
    pub(crate) fn check(
        &self,
        request: &SelectRequest,
        datasets: &[DatasetMeta],
    ) -> Result<(), QueryError> {
        let max = self.limits.max_profiles;
        let profiles: u64 = datasets.iter().map(|d| d.profile_count).sum();
        if max == 0 || profiles <= max {
            return Ok(());
        }
        let services: std::collections::BTreeSet<&str> =
            datasets.iter().map(|d| d.service.as_str()).collect();
        let narrow = if services.len() > 1 {
            format!(
                "pin a service in the selector (it matches {} services, e.g. service_name=\"{}\")",
                services.len(),
                services.iter().next().copied().unwrap_or_default()
            )
        } else {
            "add label matchers to the selector".to_string()
        };
        Err(QueryError::OverBudget(format!(
            "the query would read {profiles} profiles over {}, more than the {max} one query may read (query.max_profiles): shorten the time range to about {}%, or {narrow}",
            range(request),
            (max * 100 / profiles).max(1)
        )))
    }

    /// Runs `query` in the tenant's turn and within the time budget.
    pub(crate) async fn run<T>(
        &self,
        tenant: &str,
        query: impl Future<Output = T>,
    ) -> Result<T, QueryError> {
        let turns = self
            .turns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(tenant.to_string())
            .or_insert_with(|| {
                Arc::new(Semaphore::new(self.limits.max_concurrent_per_tenant.max(1)))
            })
            .clone();
        let timeout = Duration::from_millis(self.limits.timeout_ms);
        let turn_and_query = async {
            let _turn = turns.acquire().await;
            query.await
        };
        if self.limits.timeout_ms == 0 {
            return Ok(turn_and_query.await);
        }
        tokio::time::timeout(timeout, turn_and_query).await.map_err(|_| {
            QueryError::OverBudget(format!(
                "the query took longer than {} s (query.timeout_ms): shorten its time range or pin a service in its selector",
                timeout.as_secs_f64()
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dataset(service: &str, profile_count: u64) -> DatasetMeta {
        DatasetMeta {
            block_id: "b".into(),
            object_key: "k".into(),
            tenant: "t".into(),
            service: service.into(),
            row_group: 0,
            min_time_nanos: 0,
            max_time_nanos: 0,
            profile_types: vec![],
            profile_count,
            rules_counted: false,
        }
    }

    #[test]
    fn a_query_over_budget_is_told_how_to_narrow() {
        let budget = Budget::new(QueryBudget {
            max_profiles: 1000,
            ..QueryBudget::default()
        });
        let request = SelectRequest {
            from_nanos: 0,
            to_nanos: 7 * 86_400 * 1_000_000_000,
            ..SelectRequest::default()
        };
        assert!(budget
            .check(&request, &[dataset("a", 600), dataset("a", 400)])
            .is_ok());
        let Err(QueryError::OverBudget(message)) =
            budget.check(&request, &[dataset("a", 3000), dataset("b", 1000)])
        else {
            panic!("over budget");
        };
        assert!(message.contains("4000 profiles over 7 days"), "{message}");
        assert!(message.contains("about 25%"), "{message}");
        assert!(message.contains("service_name=\"a\""), "{message}");
    }

    #[tokio::test]
    async fn a_slow_query_is_stopped_at_its_time_budget() {
        let budget = Budget::new(QueryBudget {
            timeout_ms: 50,
            ..QueryBudget::default()
        });
        assert_eq!(budget.run("t", async { 7 }).await.ok(), Some(7));
        let slow = budget.run("t", tokio::time::sleep(Duration::from_secs(5)));
        assert!(matches!(slow.await, Err(QueryError::OverBudget(_))));
    }
}
