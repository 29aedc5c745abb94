//! Reading request bodies within limits and deadlines, and undoing `Content-Encoding`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::HeaderMap;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use kiln_model::{ErrorKind, FormatError};

/// A request body that fails once its deadline passes, however slowly its bytes trickle
/// in: an idle timeout between reads would let a client hold a request open for ever by
/// sending one byte at a time.
pub struct DeadlineBody {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
}

impl DeadlineBody {
    pub fn new(inner: Body, timeout: Duration) -> Self {
        DeadlineBody {
            inner,
            deadline: Box::pin(tokio::time::sleep(timeout)),
            timeout,
        }
    }
}

/// The error a [`DeadlineBody`] ends with.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {} s", .0.as_secs_f64())]
pub struct BodyTimeout(Duration);

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(Box::new(BodyTimeout(self.timeout)))));
        }
        Pin::new(&mut self.inner)
            .poll_frame(cx)
            .map_err(axum::BoxError::from)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Finds a [`BodyTimeout`] however deep axum and http-body-util wrapped it.
fn is_timeout(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(err);
    while let Some(err) = current {
        if err.is::<BodyTimeout>() {
            return true;
        }
        current = err.source();
    }
    false
}

/// Why a request body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("request body exceeds the limit of {0} bytes")]
    TooLarge(usize),
    #[error("failed to read the request body: {0}")]
    Timeout(#[source] axum::BoxError),
    #[error("failed to read the request body: {0}")]
    Read(#[source] axum::BoxError),
    #[error("unsupported Content-Encoding {0:?}; use gzip")]
    Encoding(String),
    #[error("{}", .0.message())]
    Inflate(#[source] FormatError),
}

impl BodyError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            BodyError::TooLarge(_) => ErrorKind::TooLarge,
            BodyError::Timeout(_) => ErrorKind::Timeout,
            BodyError::Read(_) => ErrorKind::Malformed,
            BodyError::Encoding(_) => ErrorKind::UnsupportedFormat,
            BodyError::Inflate(err) => err.kind(),
        }
    }
}

/// Reads the whole body, refusing with 413 once it passes `limit` bytes.
pub async fn read_limited(body: Body, limit: usize) -> Result<Bytes, BodyError> {
    let limited = http_body_util::Limited::new(body, limit);
    match limited.collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err)
            if err
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(BodyError::TooLarge(limit))
        }
        Err(err) if is_timeout(err.as_ref()) => Err(BodyError::Timeout(err)),
        Err(err) => Err(BodyError::Read(err)),
    }
}

/// Reads a body the server refuses and throws it away, up to `limit` bytes: answering
/// before the client has sent it would make the client see a reset connection instead of
/// the answer (429, say), and it could not reuse the connection either.
pub async fn discard(body: Body, limit: usize) {
    let mut body = body;
    let mut read = 0;
    while read <= limit {
        match body.frame().await {
            Some(Ok(frame)) => read += frame.data_ref().map_or(0, |data| data.len()),
            _ => return,
        }
    }
}

/// Removes a gzip `Content-Encoding`, bounded by `limit` decompressed bytes.
pub fn decode_content_encoding(
    headers: &HeaderMap,
    body: Bytes,
    limit: usize,
) -> Result<Bytes, BodyError> {
    let encoding = headers
        .get(axum::http::header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match encoding.as_str() {
        "" | "identity" => Ok(body),
        "gzip" | "x-gzip" => {
            // Some clients label an already-gzipped pprof this way; only inflate real gzip.
            if !kiln_model::compress::is_gzip(&body) {
                return Ok(body);
            }
            kiln_model::compress::gunzip_bounded(&body, limit)
                .map(Bytes::from)
                .map_err(BodyError::Inflate)
        }
        other => Err(BodyError::Encoding(other.to_string())),
    }
}

pub fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}
