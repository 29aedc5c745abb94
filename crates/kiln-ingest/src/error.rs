use std::sync::Arc;

use kiln_model::FormatError;
use thiserror::Error;

/// Why a write was refused or failed; each maps to one HTTP status and one metric reason.
#[derive(Debug, Error)]
pub enum IngestError {
    #[error("{0}")]
    BadRequest(String),
    /// The profile's bytes were refused by a parser in kiln-model.
    #[error("{}", .0.message())]
    Format(#[source] FormatError),
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    UnsupportedFormat(String),
    #[error("{0}")]
    RateLimited(String),
    /// The batch this write joined could not be stored; every request of the batch gets
    /// the same error, hence the `Arc`.
    #[error("failed to store the profiles: {0}")]
    Store(#[source] Arc<StoreError>),
    /// A parser task died (it panicked) before answering.
    #[error("parser task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
    #[error("server is shutting down")]
    ShuttingDown,
}

/// Why a group commit failed.
#[derive(Debug, Error)]
pub enum StoreError {
    #[error("building the segment: {0}")]
    Build(String),
    #[error("encoding the segment: {0}")]
    Encode(#[source] kiln_storage::StorageError),
    #[error("the segment builder task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
    #[error("{0}")]
    Storage(#[source] kiln_storage::StorageError),
    #[error("{0}")]
    Metastore(#[source] kiln_metastore::MetastoreError),
}

impl IngestError {
    pub fn status(&self) -> u16 {
        match self {
            IngestError::BadRequest(_) => 400,
            IngestError::Format(FormatError::TooLarge(_)) => 413,
            IngestError::Format(_) => 400,
            IngestError::TooLarge(_) => 413,
            IngestError::UnsupportedFormat(_) => 415,
            IngestError::RateLimited(_) => 429,
            IngestError::Store(_) | IngestError::Task(_) => 500,
            IngestError::ShuttingDown => 503,
        }
    }

    /// Short label for the `reason` of the rejection metric.
    pub fn reason(&self) -> &'static str {
        match self {
            IngestError::BadRequest(_) => "malformed",
            IngestError::Format(FormatError::TooLarge(_)) => "too_large",
            IngestError::Format(_) => "malformed",
            IngestError::TooLarge(_) => "too_large",
            IngestError::UnsupportedFormat(_) => "unsupported_format",
            IngestError::RateLimited(_) => "rate_limited",
            IngestError::Store(_) | IngestError::Task(_) => "internal",
            IngestError::ShuttingDown => "shutting_down",
        }
    }
}

impl From<FormatError> for IngestError {
    fn from(err: FormatError) -> Self {
        IngestError::Format(err)
    }
}
