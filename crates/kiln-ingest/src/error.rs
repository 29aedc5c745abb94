use std::sync::Arc;

use kiln_model::{ErrorKind, FormatError};
use thiserror::Error;

/// Why a write was refused or failed; each maps to one [`ErrorKind`].
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
    /// A new series or label value past the tenant's cardinality limits.
    #[error("{0}")]
    Cardinality(String),
    /// The server's or the tenant's bound on write requests in flight is reached.
    #[error("{0}")]
    Overloaded(String),
    /// The batch this write joined could not be stored; every request of the batch gets
    /// the same error, hence the `Arc`.
    #[error("failed to store the profiles: {0}")]
    Store(#[source] Arc<StoreError>),
    /// A parser task died (it panicked) before answering.
    #[error("parser task failed: {0}")]
    Task(#[from] crate::cpu::WorkerError),
    #[error("server is shutting down")]
    ShuttingDown,
    /// A retry found its first copy on its way, and that copy then failed to be stored.
    #[error("an earlier copy of this profile, sent by another request, was not stored; retry")]
    EarlierCopyLost,
}

/// Why a group commit failed.
#[derive(Debug, Error)]
pub enum StoreError {
    #[error("building the segment: {0}")]
    Build(String),
    #[error("encoding the segment: {0}")]
    Encode(#[source] kiln_storage::StorageError),
    #[error("the segment builder task failed: {0}")]
    Task(#[source] crate::cpu::WorkerError),
    #[error("{0}")]
    Storage(#[source] kiln_storage::StorageError),
    #[error("{0}")]
    Metastore(#[source] kiln_metastore::MetastoreError),
    /// Appending to, or syncing, the write-ahead log ([`crate::wal`]).
    #[error("write-ahead log: {0}")]
    Wal(#[source] std::io::Error),
}

impl IngestError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            IngestError::BadRequest(_) => ErrorKind::Malformed,
            IngestError::Format(err) => err.kind(),
            IngestError::TooLarge(_) => ErrorKind::TooLarge,
            IngestError::UnsupportedFormat(_) => ErrorKind::UnsupportedFormat,
            IngestError::RateLimited(_) | IngestError::Cardinality(_) => ErrorKind::RateLimited,
            IngestError::Overloaded(_) => ErrorKind::Overloaded,
            IngestError::Store(err) => err.kind(),
            IngestError::Task(_) => ErrorKind::Internal,
            IngestError::ShuttingDown => ErrorKind::ShuttingDown,
            IngestError::EarlierCopyLost => ErrorKind::Unavailable,
        }
    }
}

impl StoreError {
    /// A backend that failed is worth retrying against (503): the batch was not
    /// committed, so a retry cannot duplicate it. A segment that cannot be built is a
    /// fault of this server (500).
    pub fn kind(&self) -> ErrorKind {
        match self {
            StoreError::Storage(err) => err.kind(),
            StoreError::Metastore(err) => err.kind(),
            // A full or failing disk: nothing was acknowledged, and a retry may succeed.
            StoreError::Wal(_) => ErrorKind::Unavailable,
            StoreError::Build(_) | StoreError::Encode(_) | StoreError::Task(_) => {
                ErrorKind::Internal
            }
        }
    }
}

impl From<FormatError> for IngestError {
    fn from(err: FormatError) -> Self {
        IngestError::Format(err)
    }
}
