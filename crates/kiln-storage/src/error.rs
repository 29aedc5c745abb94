use thiserror::Error;

#[derive(Debug, Error)]
pub enum StorageError {
    #[error("object storage error: {0}")]
    ObjectStore(#[from] object_store::Error),
    #[error("parquet error: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    #[error("corrupt block: {0}")]
    Corrupt(String),
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error("fsync task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
    #[error("invalid object store url {url:?}: {message}")]
    InvalidUrl { url: String, message: String },
}
