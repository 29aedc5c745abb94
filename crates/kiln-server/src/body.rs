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
/// in (an idle timeout alone would let a client hold a request open for ever by sending
/// one byte at a time), or once no byte has come for its idle timeout (a deadline alone
/// would let a client that declared a body and sent nothing hold its connection, and
/// whatever the request holds, for the whole deadline).
pub struct DeadlineBody {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
    idle: Pin<Box<tokio::time::Sleep>>,
    idle_timeout: Duration,
}

impl DeadlineBody {
    pub fn new(inner: Body, timeout: Duration, idle_timeout: Duration) -> Self {
        DeadlineBody {
            inner,
            deadline: Box::pin(tokio::time::sleep(timeout)),
            timeout,
            idle: Box::pin(tokio::time::sleep(idle_timeout)),
            idle_timeout,
        }
    }
}

/// The error a [`DeadlineBody`] ends with.
#[derive(Debug, thiserror::Error)]
pub enum BodyTimeout {
    #[error("the request body did not arrive within {} s (http.body_read_timeout_ms)", .0.as_secs_f64())]
    Deadline(Duration),
    #[error("no byte of the request body came for {} s (http.body_idle_timeout_ms)", .0.as_secs_f64())]
    Idle(Duration),
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(Box::new(BodyTimeout::Deadline(self.timeout)))));
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                let next = tokio::time::Instant::now() + self.idle_timeout;
                self.idle.as_mut().reset(next);
                Poll::Ready(frame.map(|frame| frame.map_err(axum::BoxError::from)))
            }
            Poll::Pending => {
                if self.idle.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Some(Err(Box::new(BodyTimeout::Idle(self.idle_timeout)))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Finds a [`BodyTimeout`] however deep axum and http-body-util wrapped it.
pub(crate) fn is_timeout(err: &(dyn std::error::Error + 'static)) -> bool {
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
    /// The in-flight bounds were reached while the body arrived.
    #[error("{0}")]
    Overloaded(#[source] kiln_ingest::IngestError),
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
            BodyError::Overloaded(err) => err.kind(),
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

/// Most of a refused body read and thrown away, and for how long, before its connection
/// closes. Answering and closing at once would make a client still sending see a reset
/// instead of the answer; reading it all is what made refusals cost as much as writes
/// under overload. A small body is drained whole (the client reads its 429 and may keep
/// the connection); a larger one costs at most this much before the close.
const LINGER_BYTES: usize = 64 << 10;
const LINGER: Duration = Duration::from_secs(1);

/// Lets a refused request's body go without reading more than [`LINGER_BYTES`] of it.
/// A client that sent `Expect: 100-continue` has sent nothing yet and is told no by the
/// answer itself: its body is not polled, since polling it is what sends `100 Continue`.
pub fn refuse_unread(headers: &HeaderMap, body: Body) {
    if expects_continue(headers) {
        return;
    }
    tokio::spawn(linger(body));
}

/// [`refuse_unread`] of a body already being sent, waited for before answering: the
/// client is sending, so the rest of a body within [`LINGER_BYTES`] arrives at once, and
/// read before the answer it cannot be cut off by the close that follows it.
pub async fn refuse_sending(body: Body) {
    linger(body).await
}

async fn linger(body: Body) {
    let drain = http_body_util::BodyExt::collect(http_body_util::Limited::new(body, LINGER_BYTES));
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// Whether the client waits for `100 Continue` before it sends its body.
pub fn expects_continue(headers: &HeaderMap) -> bool {
    headers
        .get(axum::http::header::EXPECT)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.trim().eq_ignore_ascii_case("100-continue"))
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
