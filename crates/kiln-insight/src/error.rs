//! Insight's errors: one variant per cause, each with one [`ErrorKind`].

use kiln_metastore::MetastoreError;
use kiln_model::error::ErrorKind;
use kiln_query::QueryError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum InsightError {
    /// A malformed comparison: a bad selector, time, type or limit.
    #[error("{0}")]
    BadRequest(String),
    #[error("reading profiles: {0}")]
    Query(#[from] QueryError),
    #[error("metastore: {0}")]
    Metastore(#[from] MetastoreError),
    #[error("comparison task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("regressions webhook client: {0}")]
    Client(#[source] reqwest::Error),
    #[error("the regression watcher's dataset summaries lock was poisoned")]
    Poisoned,
}

impl InsightError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            InsightError::BadRequest(_) => ErrorKind::Malformed,
            InsightError::Query(err) => err.kind(),
            InsightError::Metastore(_)
            | InsightError::Task(_)
            | InsightError::Client(_)
            | InsightError::Poisoned => ErrorKind::Internal,
        }
    }
}
