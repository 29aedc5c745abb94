use thiserror::Error;

/// What kind of refusal or failure an error is: the one mapping every layer's errors go
/// through to an HTTP status (and a gRPC or Connect code at the edge) and to the `reason`
/// label of the rejection metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is wrong: a bad parameter, malformed bytes, a broken shape limit.
    Malformed,
    TooLarge,
    UnsupportedFormat,
    RateLimited,
    /// Too much is in flight already: come back shortly (HTTP 429).
    Overloaded,
    /// The client did not send its body in time.
    Timeout,
    NotFound,
    /// The request contradicts what is stored: a rule that exists, is read-only, or a
    /// range already done.
    Conflict,
    /// No usable credentials (HTTP 401).
    Unauthenticated,
    /// Credentials that do not allow this tenant or this action (HTTP 403).
    Forbidden,
    /// Well formed, but more work than the budget allows: narrow it (HTTP 422).
    OverBudget,
    Internal,
    ShuttingDown,
    /// A backend the request needs (the metastore, object storage) failed or could not
    /// be reached: nothing was done, and the same request may succeed shortly (HTTP 503).
    Unavailable,
}

impl ErrorKind {
    pub fn status(self) -> u16 {
        match self {
            ErrorKind::Malformed => 400,
            ErrorKind::TooLarge => 413,
            ErrorKind::UnsupportedFormat => 415,
            ErrorKind::RateLimited | ErrorKind::Overloaded => 429,
            ErrorKind::Timeout => 408,
            ErrorKind::NotFound => 404,
            ErrorKind::Conflict => 409,
            ErrorKind::Unauthenticated => 401,
            ErrorKind::Forbidden => 403,
            ErrorKind::OverBudget => 422,
            ErrorKind::Internal => 500,
            ErrorKind::ShuttingDown | ErrorKind::Unavailable => 503,
        }
    }

    /// The `reason` label of the rejection metric.
    pub fn reason(self) -> &'static str {
        match self {
            ErrorKind::Malformed => "malformed",
            ErrorKind::TooLarge => "too_large",
            ErrorKind::UnsupportedFormat => "unsupported_format",
            ErrorKind::RateLimited => "rate_limited",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::Timeout => "timeout",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Unauthenticated => "unauthenticated",
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::OverBudget => "over_budget",
            ErrorKind::Internal => "internal",
            ErrorKind::ShuttingDown => "shutting_down",
            ErrorKind::Unavailable => "unavailable",
        }
    }
}

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

    pub fn kind(&self) -> ErrorKind {
        match self {
            FormatError::TooLarge(_) => ErrorKind::TooLarge,
            FormatError::Malformed(_) | FormatError::Limit(_) => ErrorKind::Malformed,
        }
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
