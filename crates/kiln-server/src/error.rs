//! Every error an API can answer with, and the one mapping from each to an HTTP status
//! and a metric reason. How the answer looks on the wire (text, Connect JSON, gRPC
//! trailers, profefe JSON, an OTLP `Status`) is [`crate::rpc`]'s business.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use kiln_ingest::IngestError;
use kiln_model::ErrorKind;
use kiln_query::QueryError;
use thiserror::Error;

use crate::body::BodyError;

#[derive(Debug, Error)]
pub enum ApiError {
    #[error(transparent)]
    Tenant(#[from] TenantError),
    #[error(transparent)]
    Body(#[from] BodyError),
    #[error(transparent)]
    Rpc(#[from] RpcError),
    #[error(transparent)]
    Ingest(#[from] IngestError),
    #[error(transparent)]
    Query(#[from] QueryError),
    #[error(transparent)]
    Rules(#[from] kiln_rules::RulesError),
    #[error(transparent)]
    Insight(#[from] kiln_insight::InsightError),
    #[error(transparent)]
    Auth(#[from] kiln_auth::AuthError),
    #[error(transparent)]
    Debuginfo(#[from] kiln_symbolize::SymbolizeError),
    /// The ingest node a write was forwarded to refused it (placement).
    #[error("{message}")]
    Owner { kind: ErrorKind, message: String },
}

impl ApiError {
    /// The one mapping: every error's kind, whose status and metric reason follow.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ApiError::Tenant(_) => ErrorKind::Malformed,
            ApiError::Body(err) => err.kind(),
            ApiError::Rpc(err) => err.kind(),
            ApiError::Ingest(err) => err.kind(),
            ApiError::Query(err) => err.kind(),
            ApiError::Rules(err) => err.kind(),
            ApiError::Insight(err) => err.kind(),
            ApiError::Auth(err) => err.kind(),
            ApiError::Debuginfo(err) => err.kind(),
            ApiError::Owner { kind, .. } => *kind,
        }
    }

    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.kind().status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// What the client is told. A failure of the object store, the metastore or the disk
    /// carries paths, object keys and URLs of the server's own (`file:///var/lib/kiln/…`),
    /// which no client sent and none may learn: those say which backend failed and stop
    /// there; the whole error goes to the server's log.
    pub fn public_message(&self) -> String {
        let mut current: Option<&(dyn std::error::Error + 'static)> = Some(self);
        let mut backend = None;
        while let Some(err) = current {
            if err.is::<kiln_storage::StorageError>() {
                backend = Some("the object store");
            } else if err.is::<kiln_metastore::MetastoreError>() {
                backend = Some("the metastore");
            } else if err.is::<std::io::Error>() && backend.is_none() {
                backend = Some("the local disk");
            }
            current = err.source();
        }
        let Some(backend) = backend else {
            return self.to_string();
        };
        let what = match self {
            ApiError::Ingest(_) => "failed to store the profiles",
            _ => "the request failed",
        };
        let retry = if self.status() == StatusCode::SERVICE_UNAVAILABLE {
            "; retry shortly"
        } else {
            ""
        };
        format!("{what}: {backend} failed{retry} (the server's log has the detail)")
    }
}

/// What an error response carries for [`crate::rpc::shape_errors`], which renders it in
/// the request's wire format and counts it.
#[derive(Debug, Clone)]
pub struct Failure {
    pub status: StatusCode,
    pub reason: &'static str,
    pub message: String,
}

/// A plain-text answer (Pyroscope's and Kiln's HTTP APIs); the RPC protocols' shapes are
/// put on by [`crate::rpc::shape_errors`] from the [`Failure`] left in the extensions.
impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let failure = Failure {
            status: self.status(),
            reason: self.kind().reason(),
            message: self.public_message(),
        };
        if failure.status.is_server_error() {
            tracing::error!(error = %self, source = ?std::error::Error::source(&self), "request failed");
        } else {
            tracing::debug!(error = %self, "request refused");
        }
        let mut response = (failure.status, format!("{}\n", failure.message)).into_response();
        if matches!(
            failure.status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        ) {
            // Limits refill within a second, and a restarting backend is back in a few;
            // whoever knows better sets its own.
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        response.extensions_mut().insert(failure);
        response
    }
}

/// Why an `X-Scope-OrgID` header is unusable.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum TenantError {
    #[error("X-Scope-OrgID is not valid ASCII")]
    NotAscii,
    #[error("X-Scope-OrgID is longer than 150 characters")]
    TooLong,
    #[error("X-Scope-OrgID must not be '.' or '..'")]
    Dots,
    #[error("X-Scope-OrgID contains the invalid character {0:?}")]
    InvalidCharacter(char),
}

/// Why an RPC's framing or message was refused.
#[derive(Debug, Error)]
pub enum RpcError {
    #[error("unsupported content type {0:?}; use {1}")]
    ContentType(String, &'static str),
    #[error("gRPC message frame is shorter than its 5-byte header")]
    ShortFrame,
    #[error("gRPC frame declares {declared} bytes but has {actual}")]
    FrameLength { declared: usize, actual: usize },
    #[error("a unary gRPC request must carry exactly one message")]
    TrailingBytes,
    #[error("unsupported grpc-encoding {0:?}; use gzip")]
    GrpcEncoding(String),
    #[error("invalid gRPC compressed flag {0}")]
    CompressedFlag(u8),
    #[error("{}", .0.message())]
    Inflate(#[source] kiln_model::FormatError),
    #[error("invalid JSON request: {0}")]
    Json(#[source] serde_json::Error),
    #[error("invalid protobuf request: {0}")]
    Proto(#[source] prost::DecodeError),
}

impl RpcError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            RpcError::ContentType(..) => ErrorKind::UnsupportedFormat,
            RpcError::Inflate(err) => err.kind(),
            _ => ErrorKind::Malformed,
        }
    }
}
