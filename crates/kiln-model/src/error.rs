use thiserror::Error;

/// Why untrusted input was refused. Each variant maps to one HTTP status at the edge.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum FormatError {
    /// The bytes are not what they claim to be (HTTP 400).
    #[error("malformed input: {0}")]
    Malformed(String),
    /// The input, or what it expands to, is over a configured limit (HTTP 413).
    #[error("too large: {0}")]
    TooLarge(String),
    /// The input is well formed but breaks a limit on its shape (HTTP 400).
    #[error("limit exceeded: {0}")]
    Limit(String),
}

impl FormatError {
    pub fn malformed(message: impl Into<String>) -> Self {
        FormatError::Malformed(message.into())
    }

    /// The message alone, without the kind's prefix, for answers that carry the kind in
    /// their status.
    pub fn message(&self) -> &str {
        match self {
            FormatError::Malformed(message)
            | FormatError::TooLarge(message)
            | FormatError::Limit(message) => message,
        }
    }
}
