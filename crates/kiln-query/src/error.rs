use kiln_model::ErrorKind;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum QueryError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    /// More than one query may cost ([`crate::budget`]); the message says how to narrow it.
    #[error("{0}")]
    OverBudget(String),
    #[error("storage error: {0}")]
    Storage(#[from] kiln_storage::StorageError),
    #[error("metastore error: {0}")]
    Metastore(#[from] kiln_metastore::MetastoreError),
    #[error("query task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("background read failed: {0}")]
    Worker(#[from] kiln_runtime::worker::WorkerError),
    /// Another query node did not return its part, or returned one that does not read.
    #[error("query part on another node: {0}")]
    Remote(String),
}

impl QueryError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            QueryError::BadRequest(_) => ErrorKind::Malformed,
            QueryError::NotFound(_) => ErrorKind::NotFound,
            QueryError::OverBudget(_) => ErrorKind::OverBudget,
            QueryError::Storage(err) => err.kind(),
            QueryError::Metastore(err) => err.kind(),
            _ => ErrorKind::Internal,
        }
    }
}
