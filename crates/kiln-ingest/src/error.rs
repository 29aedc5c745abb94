use kiln_model::FormatError;
use thiserror::Error;

/// Why a write was refused or failed; each maps to one HTTP status and one metric reason.
#[derive(Debug, Error)]
pub enum IngestError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    UnsupportedFormat(String),
    #[error("{0}")]
    RateLimited(String),
    /// The client did not send its body in time.
    #[error("{0}")]
    Timeout(String),
    #[error("{0}")]
    Internal(String),
    #[error("server is shutting down")]
    ShuttingDown,
}

impl IngestError {
    pub fn status(&self) -> u16 {
        match self {
            IngestError::BadRequest(_) => 400,
            IngestError::TooLarge(_) => 413,
            IngestError::UnsupportedFormat(_) => 415,
            IngestError::RateLimited(_) => 429,
            IngestError::Timeout(_) => 408,
            IngestError::Internal(_) => 500,
            IngestError::ShuttingDown => 503,
        }
    }

    /// Short label for the `reason` of the rejection metric.
    pub fn reason(&self) -> &'static str {
        match self {
            IngestError::BadRequest(_) => "malformed",
            IngestError::TooLarge(_) => "too_large",
            IngestError::UnsupportedFormat(_) => "unsupported_format",
            IngestError::RateLimited(_) => "rate_limited",
            IngestError::Timeout(_) => "timeout",
            IngestError::Internal(_) => "internal",
            IngestError::ShuttingDown => "shutting_down",
        }
    }
}

impl From<FormatError> for IngestError {
    fn from(err: FormatError) -> Self {
        match err {
            FormatError::TooLarge(message) => IngestError::TooLarge(message),
            FormatError::Malformed(message) | FormatError::Limit(message) => {
                IngestError::BadRequest(message)
            }
        }
    }
}
