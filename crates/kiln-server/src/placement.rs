//! Placement at the HTTP edge: a write endpoint names the write's service and how to send
//! it on; [`kiln_cluster::forward`] decides where it goes. Here only the translation: an
//! HTTP request into a [`ForwardRequest`], and the owner's answer back into this
//! request's answer.

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::Response;
use bytes::Bytes;
use kiln_cluster::forward::{FORWARDED_FROM, FORWARDED_HEADERS};
use kiln_cluster::{ForwardRequest, Forwarded, Route};
use kiln_model::ErrorKind;

use crate::error::ApiError;
use crate::state::AppState;

/// A write as the owner is to receive it.
pub(crate) struct Write(ForwardRequest);

impl Write {
    /// The request as it came: same path, query, headers and body.
    pub(crate) fn as_received(uri: &Uri, headers: &HeaderMap, body: Bytes) -> Self {
        let path_and_query = uri
            .path_and_query()
            .map_or_else(|| uri.path().to_string(), |pq| pq.as_str().to_string());
        Write(ForwardRequest {
            path_and_query,
            headers: kept(headers),
            body,
        })
    }

    /// An opened RPC message, sent as a Connect unary call (proto or JSON): the owner
    /// need not undo a gRPC frame or its compression a second time.
    pub(crate) fn connect(path: &str, headers: &HeaderMap, json: bool, message: Bytes) -> Self {
        let mut headers = kept(headers);
        headers.remove(header::CONTENT_ENCODING);
        let content_type = if json {
            "application/json"
        } else {
            "application/proto"
        };
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        headers.insert("connect-protocol-version", HeaderValue::from_static("1"));
        Write(ForwardRequest {
            path_and_query: path.to_string(),
            headers,
            body: message,
        })
    }
}

fn kept(headers: &HeaderMap) -> HeaderMap {
    let mut kept = HeaderMap::new();
    for name in FORWARDED_HEADERS {
        for value in headers.get_all(name) {
            if let Ok(name) = header::HeaderName::from_bytes(name.as_bytes()) {
                kept.append(name, value.clone());
            }
        }
    }
    kept
}

/// Sends `write` to the owner of (`tenant`, `service`) when that is another node, and
/// returns its answer; `None`: write it here (this node owns it, the write came
/// forwarded, its service is unknown or several, or the owner certainly did not store
/// it). An owner that took the write and did not answer is a 503: retry.
pub(crate) async fn offer(
    state: &AppState,
    tenant: &str,
    service: Option<&str>,
    headers: &HeaderMap,
    write: Write,
) -> Result<Option<Forwarded>, ApiError> {
    let forwarded_from = headers
        .get(FORWARDED_FROM)
        .and_then(|value| value.to_str().ok());
    let route = match service {
        Some(service) => state.forwarder.route(tenant, service, forwarded_from),
        None => Route::Local(if forwarded_from.is_some() {
            kiln_cluster::LocalReason::Forwarded
        } else {
            kiln_cluster::LocalReason::Unplaced
        }),
    };
    match route {
        Route::Local(reason) => {
            state.forwarder.count_local(reason);
            Ok(None)
        }
        Route::Forward(peer) => match state.forwarder.forward(&peer, write.0).await {
            Ok(answer) => Ok(Some(answer)),
            Err(err) if err.write_here() => Ok(None),
            Err(err) => Err(ApiError::Owner {
                kind: ErrorKind::Unavailable,
                message: err.to_string(),
            }),
        },
    }
}

/// The owner's answer as this request's: status, body, and the headers that describe
/// them.
pub(crate) fn relay(answer: Forwarded) -> Response {
    let mut response = Response::new(Body::from(answer.body));
    *response.status_mut() = answer.status;
    for name in [header::CONTENT_TYPE, header::RETRY_AFTER, header::WARNING] {
        for value in answer.headers.get_all(&name) {
            response.headers_mut().append(name.clone(), value.clone());
        }
    }
    response
}

/// The owner's warnings when it took the write; its refusal as this request's error, to
/// be shaped for the client's protocol.
pub(crate) fn accepted(answer: Forwarded) -> Result<Vec<String>, ApiError> {
    if answer.status.is_success() {
        return Ok(answer
            .headers
            .get_all(header::WARNING)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .map(|value| {
                // `299 - "text"`, as `with_warnings` wrote it.
                let text = value.trim_start_matches("299 - ");
                text.trim_matches('"').to_string()
            })
            .collect());
    }
    Err(ApiError::Owner {
        kind: kind_of(answer.status),
        message: refusal_message(&answer.body),
    })
}

/// What a refusal says: a Connect error's `message`, a profefe error's `error`, or the
/// text.
fn refusal_message(body: &[u8]) -> String {
    if let Ok(json) = serde_json::from_slice::<serde_json::Value>(body) {
        for field in ["message", "error"] {
            if let Some(text) = json.get(field).and_then(|v| v.as_str()) {
                return text.to_string();
            }
        }
    }
    String::from_utf8_lossy(body).trim().to_string()
}

/// The kind of the owner's refusal, from its status: the inverse of [`ErrorKind::status`]
/// for the statuses a write can be refused with.
fn kind_of(status: StatusCode) -> ErrorKind {
    match status.as_u16() {
        401 => ErrorKind::Unauthenticated,
        403 => ErrorKind::Forbidden,
        404 => ErrorKind::NotFound,
        408 => ErrorKind::Timeout,
        409 => ErrorKind::Conflict,
        413 => ErrorKind::TooLarge,
        415 => ErrorKind::UnsupportedFormat,
        422 => ErrorKind::OverBudget,
        429 => ErrorKind::RateLimited,
        _ => ErrorKind::Malformed,
    }
}
