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
    #[error("invalid object store url {url:?}: {message}")]
    InvalidUrl { url: String, message: String },
}

impl StorageError {
    /// The object store failing to answer is transient (503); bytes that do not decode
    /// are not (500).
    pub fn kind(&self) -> kiln_model::ErrorKind {
        match self {
            StorageError::ObjectStore(_) | StorageError::Io(_) => {
                kiln_model::ErrorKind::Unavailable
            }
            _ => kiln_model::ErrorKind::Internal,
        }
    }
}
