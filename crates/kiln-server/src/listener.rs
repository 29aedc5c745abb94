//! Accepting and serving connections, with bounds a stalled or hostile client cannot pass:
//! a deadline for a request's headers (hyper's `header_read_timeout`) and for its body
//! ([`DeadlineBody`]), a 413 before the body is read when the declared `Content-Length`
//! is over the tenant's limit, and a cap on open connections.
//!
//! axum's `serve` exposes none of these, so the accept loop is here, on hyper-util's
//! connection builder (HTTP/1.1 and h2c on one port, as before) and its graceful shutdown.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::auth::ClientAddr;
use crate::body::DeadlineBody;
use crate::config::HttpConfig;
use crate::endpoints::endpoint_of;
use crate::metrics::ServerMetrics;
use crate::state::SharedState;
use crate::tenant::tenant_of;
use crate::tls::Tls;

/// Longest shutdown waits for requests in flight before it closes their connections.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// Connections past the cap being answered at once; more are closed unanswered.
const MAX_REFUSALS: usize = 256;

/// Whether a query string percent-decodes to UTF-8 in every part. Decoders replace what
/// does not (with U+FFFD) and carry on, which would store a name other than the one sent.
fn query_is_utf8(query: &str) -> bool {
    let bytes = query.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(high), Some(low)) => {
                    decoded.push((high * 16 + low) as u8);
                    i += 3;
                    continue;
                }
                _ => decoded.push(b'%'),
            },
            b'&' | b'=' => {
                if std::str::from_utf8(&decoded).is_err() {
                    return false;
                }
                decoded.clear();
            }
            byte => decoded.push(byte),
        }
        i += 1;
    }
    std::str::from_utf8(&decoded).is_ok()
}

/// Refuses a body declared over the tenant's limit before reading a byte of it, and puts a
/// deadline and an idle timeout on reading the rest. A query string that is not UTF-8 is
/// refused here too. A write refused before its body was read (413, 429, 408) closes its
/// HTTP/1 connection, which cannot carry another request with the body still in it.
pub(crate) async fn guard(
    State(state): State<SharedState>,
    request: Request,
    next: Next,
) -> Response {
    if !request.uri().query().is_none_or(query_is_utf8) {
        return (
            StatusCode::BAD_REQUEST,
            "the query string is not valid UTF-8 once percent-decoded\n",
        )
            .into_response();
    }
    let endpoint = endpoint_of(request.method(), request.uri().path());
    let http1 = request.version() < axum::http::Version::HTTP_2;
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok());
    if let Some(length) = declared {
        let tenant = tenant_of(request.headers()).unwrap_or_default();
        // Debug files run to gigabytes and are streamed to disk: their own limit.
        let (limit, setting) = if request.uri().path().starts_with(crate::debuginfo::PREFIX) {
            (
                usize::try_from(state.symbolizer.max_bytes()).unwrap_or(usize::MAX),
                "symbolization.max_debuginfo_bytes",
            )
        } else {
            (
                state.limits.for_tenant(&tenant).max_body_bytes,
                "limits.max_body_bytes",
            )
        };
        if length > limit as u64 {
            state
                .metrics
                .reject(endpoint.unwrap_or("http"), "too_large");
            let mut response = (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "request body of {length} bytes (Content-Length) exceeds the limit of {limit} bytes ({setting})\n"
                ),
            )
                .into_response();
            if http1 {
                close(&mut response);
            }
            let (parts, body) = request.into_parts();
            crate::body::refuse_unread(&parts.headers, body);
            return response;
        }
    }
    let (timeout, idle) = (state.body_read_timeout, state.body_idle_timeout);
    let mut response = next
        .run(request.map(|body| Body::new(DeadlineBody::new(body, timeout, idle))))
        .await;
    let refused = matches!(
        response.status(),
        StatusCode::PAYLOAD_TOO_LARGE | StatusCode::TOO_MANY_REQUESTS | StatusCode::REQUEST_TIMEOUT
    );
    if endpoint.is_some() && http1 && refused {
        close(&mut response);
    }
    response
}

fn close(response: &mut Response) {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
}

/// The most an HTTP/1 connection's read buffer grows to (hyper's default is about
/// 400 KiB), and so the longest request head it accepts (Node.js's default limit). hyper
/// grows the buffer while a body arrives faster than it is read, a body chunk handed on
/// keeps its buffer alive, and while a request is served hyper reserves a fresh one to
/// watch the socket: with 1,000 keep-alive clients, read buffers of up to 400 KiB held
/// 156 MB of the server's heap, and of up to 64 KiB still 53 MB (heaptrack,
/// docs/benchmarks.md). Larger bodies just take more reads, and are copied once into one
/// buffer where they arrive in several chunks.
const READ_BUFFER_BYTES: usize = 16 << 10;

/// Serves `app` on `listener` until `stop` resolves, then lets requests in flight finish.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    config: HttpConfig,
    metrics: ServerMetrics,
    tls: Option<Arc<Tls>>,
    stop: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .max_buf_size(READ_BUFFER_BYTES)
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(config.header_read_timeout_ms.max(1)));
    builder.http2().timer(TokioTimer::new());
    let builder = Arc::new(builder);
    let handshake_timeout = Duration::from_millis(config.header_read_timeout_ms.max(1));
    let slots = Arc::new(Semaphore::new(config.max_connections.max(1)));
    let refusals = Arc::new(Semaphore::new(MAX_REFUSALS));
    let graceful = GracefulShutdown::new();
    tokio::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of file descriptors, or a connection reset before accept: wait
                    // a little rather than spin, as a server must not die of either.
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            metrics.connections_refused.inc();
            tracing::debug!(%peer, "connection refused: max_connections open");
            // A TLS client could not read a cleartext answer: it is just closed. So is
            // one past the refusals already being answered, which hold sockets too.
            if tls.is_none() {
                if let Ok(refusing) = refusals.clone().try_acquire_owned() {
                    tokio::spawn(async move {
                        refuse(stream).await;
                        drop(refusing);
                    });
                }
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        // Each request learns its connection's address (for auth's per-address limits).
        let service = TowerToHyperService::new(tower::ServiceExt::map_request(
            app.clone(),
            move |mut request: axum::http::Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(ClientAddr(peer));
                request
            },
        ));
        let (builder, tls, watcher) = (builder.clone(), tls.clone(), graceful.watcher());
        let metrics = metrics.clone();
        metrics.connections_open.inc();
        tokio::spawn(async move {
            // The handshake happens here, off the accept loop, within the same deadline
            // as a request's headers.
            let io: Box<dyn Io> = match tls {
                None => Box::new(stream),
                Some(tls) => {
                    if speaks_cleartext(&stream, handshake_timeout).await {
                        answer_cleartext(stream).await;
                        metrics.connections_open.dec();
                        return;
                    }
                    match tokio::time::timeout(handshake_timeout, tls.acceptor.accept(stream)).await
                    {
                        Ok(Ok(stream)) => Box::new(stream),
                        Ok(Err(err)) => {
                            tracing::debug!(%peer, error = %err, "TLS handshake failed");
                            metrics.connections_open.dec();
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake timed out");
                            metrics.connections_open.dec();
                            return;
                        }
                    }
                }
            };
            let connection = builder
                .serve_connection_with_upgrades(TokioIo::new(io), service)
                .into_owned();
            if let Err(err) = watcher.watch(connection).await {
                tracing::debug!(%peer, error = %err, "connection ended with an error");
            }
            metrics.connections_open.dec();
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("requests still in flight after the shutdown grace period; closing");
    }
    Ok(())
}

/// Whether a client on the TLS port opened with plain HTTP: a TLS connection starts with
/// a handshake record (0x16), an HTTP/1 request with a method's capital letter.
async fn speaks_cleartext(stream: &tokio::net::TcpStream, within: Duration) -> bool {
    let mut first = [0u8; 1];
    matches!(
        tokio::time::timeout(within, stream.peek(&mut first)).await,
        Ok(Ok(1)) if first[0].is_ascii_uppercase()
    )
}

/// Tells a plain-HTTP client it reached an HTTPS port (as Go's and nginx's servers do),
/// rather than a handshake error it would show as a reset connection.
async fn answer_cleartext(mut stream: tokio::net::TcpStream) {
    let mut head = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_millis(100), stream.read(&mut head)).await;
    let body = "This port speaks HTTPS: use https:// (TLS is on for this server)\n";
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(answer.as_bytes())).await;
    let _ = stream.shutdown().await;
}

/// A connection's byte stream: TCP, or TLS over it.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// Answers a connection over the cap with a 429 and closes it, without waiting on it long.
///
/// What the client sends first is read (up to the end of its request head, 64 KiB or
/// 100 ms): an HTTP client answered before it has sent its request takes the answer for
/// a broken connection. After the answer, the rest of its body is read and discarded
/// for a moment, so that closing does not reset the connection under the answer.
async fn refuse(mut stream: tokio::net::TcpStream) {
    let mut head = Vec::new();
    let mut buffer = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_millis(100), async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 64 << 10 {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await;
    let answer = b"HTTP/1.1 429 Too Many Requests\r\nconnection: close\r\nretry-after: 1\r\ncontent-type: text/plain\r\ncontent-length: 45\r\n\r\ntoo many open connections (max_connections)\r\n";
    if tokio::time::timeout(Duration::from_secs(1), stream.write_all(answer))
        .await
        .is_err()
    {
        return;
    }
    let _ = stream.shutdown().await;
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let mut drained = 0;
        while drained < 1 << 20 {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::query_is_utf8;

    #[test]
    fn query_strings_must_decode_to_utf8() {
        assert!(query_is_utf8("name=caf%C3%A9.cpu&from=now-1h"));
        assert!(query_is_utf8("a=100%&b=%zz"));
        assert!(query_is_utf8("q=%7Bx%3D%22y%22%7D"));
        assert!(!query_is_utf8("name=bad%FF%FEutf8.cpu"));
        assert!(!query_is_utf8("a=ok&b=%C3"));
        assert!(!query_is_utf8("%C3=x"));
    }
}
