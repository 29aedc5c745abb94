//! Unary RPCs, decided and framed in one place: Connect (`application/proto` and
//! `application/json`), gRPC (HTTP/2, 5-byte length-prefixed messages, `grpc-status`
//! trailers) and OTLP/HTTP (`application/x-protobuf` and `application/json`).
//!
//! tonic would own the route and could not also answer Connect's HTTP/1.1 requests on the
//! same path, so the few lines of gRPC framing live here.
//!
//! Errors are shaped here too. Handlers return [`ApiError`], which renders as plain text
//! and leaves a [`Failure`] in the response's extensions; [`shape_errors`], a layer over
//! every route, re-renders it in the request's wire format ([`Wire::of`]) and counts
//! refused writes by endpoint and reason.

use std::convert::Infallible;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{self, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::StreamBody;
use hyper::body::Frame;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::json;

use crate::body::{content_type, decode_content_encoding, read_limited};
use crate::error::{ApiError, Failure, RpcError};
use crate::state::SharedState;

/// gRPC status codes used here.
pub mod code {
    pub const OK: u32 = 0;
    pub const INVALID_ARGUMENT: u32 = 3;
    pub const DEADLINE_EXCEEDED: u32 = 4;
    pub const NOT_FOUND: u32 = 5;
    pub const PERMISSION_DENIED: u32 = 7;
    pub const RESOURCE_EXHAUSTED: u32 = 8;
    pub const UNIMPLEMENTED: u32 = 12;
    pub const INTERNAL: u32 = 13;
    pub const UNAVAILABLE: u32 = 14;
    pub const UNAUTHENTICATED: u32 = 16;
}

/// The gRPC code for an HTTP status.
pub fn grpc_code(status: StatusCode) -> u32 {
    match status.as_u16() {
        400 | 413 | 422 => code::INVALID_ARGUMENT,
        401 => code::UNAUTHENTICATED,
        403 => code::PERMISSION_DENIED,
        404 => code::NOT_FOUND,
        408 => code::DEADLINE_EXCEEDED,
        415 => code::UNIMPLEMENTED,
        429 => code::RESOURCE_EXHAUSTED,
        503 => code::UNAVAILABLE,
        _ => code::INTERNAL,
    }
}

/// The Connect error code for an HTTP status.
fn connect_code(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 413 | 422 => "invalid_argument",
        401 => "unauthenticated",
        403 => "permission_denied",
        404 => "not_found",
        408 => "deadline_exceeded",
        415 => "unimplemented",
        429 => "resource_exhausted",
        503 => "unavailable",
        _ => "internal",
    }
}

/// Which protocol family a route speaks, for the names of its binary content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Connect and gRPC: `application/proto`.
    Connect,
    /// OTLP/HTTP and gRPC: `application/x-protobuf`.
    Otlp,
}

impl Family {
    fn proto_content_type(self) -> &'static str {
        match self {
            Family::Connect => "application/proto",
            Family::Otlp => "application/x-protobuf",
        }
    }

    fn accepted(self) -> &'static str {
        match self {
            Family::Connect => "application/proto, application/json or gRPC",
            Family::Otlp => "application/x-protobuf, application/json or gRPC",
        }
    }
}

/// How one RPC's messages are encoded, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Grpc,
    Proto,
    Json,
}

/// A request's RPC encoding and family, decided once from its headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rpc {
    pub family: Family,
    pub encoding: Encoding,
}

impl Rpc {
    pub fn of(headers: &HeaderMap, family: Family) -> Result<Rpc, RpcError> {
        let content_type = content_type(headers);
        let encoding = if content_type.starts_with("application/grpc") {
            Encoding::Grpc
        } else if content_type.starts_with("application/json") {
            Encoding::Json
        } else if content_type.starts_with(family.proto_content_type())
            || content_type.starts_with("application/protobuf")
        {
            Encoding::Proto
        } else {
            return Err(RpcError::ContentType(content_type, family.accepted()));
        };
        Ok(Rpc { family, encoding })
    }

    pub fn is_json(&self) -> bool {
        self.encoding == Encoding::Json
    }

    /// The request's one message: a gRPC frame opened (inflated when flagged), or the
    /// body with its `Content-Encoding` undone; at most `limit` bytes either way.
    pub fn open(&self, headers: &HeaderMap, raw: Bytes, limit: usize) -> Result<Bytes, ApiError> {
        match self.encoding {
            Encoding::Grpc => Ok(unframe(headers, &raw, limit)?),
            _ => Ok(decode_content_encoding(headers, raw, limit)?),
        }
    }

    /// Reads, bounds and opens the body, and decodes its message in the request's
    /// encoding (an empty JSON body is the default message).
    pub async fn decode<T: prost::Message + Default + DeserializeOwned>(
        &self,
        headers: &HeaderMap,
        body: Body,
        limit: usize,
    ) -> Result<T, ApiError> {
        let raw = read_limited(body, limit).await?;
        let message = self.open(headers, raw, limit)?;
        let decoded = match self.encoding {
            Encoding::Json if message.iter().all(u8::is_ascii_whitespace) => Ok(T::default()),
            Encoding::Json => serde_json::from_slice(&message).map_err(RpcError::Json),
            _ => T::decode(message.as_ref()).map_err(RpcError::Proto),
        };
        Ok(decoded?)
    }

    /// A successful answer carrying `message` in the request's encoding.
    pub fn reply<T: prost::Message + Serialize>(&self, message: &T) -> Response {
        match self.encoding {
            Encoding::Json => match serde_json::to_vec(message) {
                Ok(bytes) => json_response(bytes),
                Err(err) => ApiError::from(RpcError::Json(err)).into_response(),
            },
            _ => self.reply_encoded(message.encode_to_vec()),
        }
    }

    /// A successful answer of an already encoded protobuf message.
    pub fn reply_encoded(&self, message: Vec<u8>) -> Response {
        match self.encoding {
            Encoding::Grpc => grpc_ok(message),
            _ => (
                StatusCode::OK,
                [("content-type", self.family.proto_content_type())],
                message,
            )
                .into_response(),
        }
    }
}

pub fn json_response(bytes: Vec<u8>) -> Response {
    (
        StatusCode::OK,
        [("content-type", "application/json")],
        bytes,
    )
        .into_response()
}

/// Reads the single message of a unary gRPC request, inflating it when the compressed
/// flag is set (only gzip is accepted, as the request's `grpc-encoding` must say).
pub fn unframe(headers: &HeaderMap, body: &[u8], limit: usize) -> Result<Bytes, RpcError> {
    if body.len() < 5 {
        return Err(RpcError::ShortFrame);
    }
    let compressed = body[0];
    let length = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    let message = body.get(5..5 + length).ok_or(RpcError::FrameLength {
        declared: length,
        actual: body.len() - 5,
    })?;
    if body.len() != 5 + length {
        return Err(RpcError::TrailingBytes);
    }
    match compressed {
        0 => Ok(Bytes::copy_from_slice(message)),
        1 => {
            let encoding = headers
                .get("grpc-encoding")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if encoding != "gzip" {
                return Err(RpcError::GrpcEncoding(encoding.to_string()));
            }
            kiln_model::compress::gunzip_bounded(message, limit)
                .map(Bytes::from)
                .map_err(RpcError::Inflate)
        }
        flag => Err(RpcError::CompressedFlag(flag)),
    }
}

/// A successful unary gRPC response: one message, then `grpc-status: 0` trailers.
fn grpc_ok(message: Vec<u8>) -> Response {
    let mut frame = BytesMut::with_capacity(5 + message.len());
    frame.put_u8(0);
    frame.put_u32(message.len() as u32);
    frame.put_slice(&message);
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from(code::OK));
    let frames: Vec<Result<Frame<Bytes>, Infallible>> = vec![
        Ok(Frame::data(frame.freeze())),
        Ok(Frame::trailers(trailers)),
    ];
    let body = Body::new(StreamBody::new(futures_util::stream::iter(frames)));
    let mut response = Response::new(body);
    response.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("application/grpc+proto"),
    );
    response
}

/// A trailers-only gRPC error response, as gRPC sends errors before any message.
fn grpc_error(code: u32, message: &str) -> Response {
    let mut response = Response::new(Body::empty());
    let headers = response.headers_mut();
    headers.insert(
        "content-type",
        HeaderValue::from_static("application/grpc+proto"),
    );
    headers.insert("grpc-status", HeaderValue::from(code));
    if let Ok(value) = HeaderValue::from_str(&percent_encode(message)) {
        headers.insert("grpc-message", value);
    }
    response
}

/// gRPC's grpc-message encoding: printable ASCII except `%` as is, the rest as %XX.
fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for byte in message.bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// `google.rpc.Status`, the body of an OTLP/HTTP error.
#[derive(Clone, PartialEq, prost::Message)]
struct Status {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

/// How a request's errors look on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// `message\n` with the status: Pyroscope's and Kiln's HTTP APIs.
    Text,
    /// `{"code": status, "error": message}`.
    Profefe,
    /// A Connect error, `{"code": "invalid_argument", "message": …}`.
    Connect,
    /// Trailers-only, `grpc-status` and `grpc-message`.
    Grpc,
    /// OTLP/HTTP: a `google.rpc.Status` in the request's encoding.
    Otlp(Encoding),
}

impl Wire {
    /// The wire of a request, from its path and (lower-cased) content type.
    pub fn of(path: &str, content_type: &str) -> Wire {
        if content_type.starts_with("application/grpc") {
            return Wire::Grpc;
        }
        if path.starts_with("/api/0/") {
            return Wire::Profefe;
        }
        if path.starts_with("/push.v1.") || path.starts_with("/querier.v1.") {
            return Wire::Connect;
        }
        if path == crate::endpoints::OTLP_HTTP_PATH {
            return Wire::Otlp(if content_type.starts_with("application/json") {
                Encoding::Json
            } else {
                Encoding::Proto
            });
        }
        Wire::Text
    }

    /// The error answer of `failure` on this wire; `text` is the plain-text answer, kept
    /// (headers and all) where the wire is text.
    fn render(self, failure: &Failure, text: Response) -> Response {
        let status = failure.status;
        let message = failure.message.as_str();
        // What the client is told to do next survives the reshaping.
        let kept: Vec<_> = [header::WWW_AUTHENTICATE, header::RETRY_AFTER]
            .iter()
            .flat_map(|name| {
                text.headers()
                    .get_all(name)
                    .iter()
                    .map(move |value| (name.clone(), value.clone()))
            })
            .collect();
        let mut response = match self {
            Wire::Text => return text,
            Wire::Profefe => (
                status,
                axum::Json(json!({"code": status.as_u16(), "error": message})),
            )
                .into_response(),
            Wire::Connect => (
                status,
                axum::Json(json!({"code": connect_code(status), "message": message})),
            )
                .into_response(),
            Wire::Grpc => grpc_error(grpc_code(status), message),
            Wire::Otlp(Encoding::Json) => (
                status,
                axum::Json(json!({"code": grpc_code(status), "message": message})),
            )
                .into_response(),
            Wire::Otlp(_) => (
                status,
                [("content-type", "application/x-protobuf")],
                prost::Message::encode_to_vec(&Status {
                    code: grpc_code(status) as i32,
                    message: message.to_string(),
                }),
            )
                .into_response(),
        };
        for (name, value) in kept {
            response.headers_mut().append(name, value);
        }
        response
    }
}

/// Renders every error answer in its request's wire format, and counts refused writes.
pub(crate) async fn shape_errors(
    State(state): State<SharedState>,
    request: Request,
    next: Next,
) -> Response {
    // Kept as they are (cheap, reference-counted clones): the wire is worked out only for
    // an answer that failed, not on every request.
    let (method, uri) = (request.method().clone(), request.uri().clone());
    let content_type = request.headers().get(CONTENT_TYPE).cloned();
    let response = next.run(request).await;
    let Some(failure) = response.extensions().get::<Failure>().cloned() else {
        return response;
    };
    if let Some(endpoint) = crate::endpoints::endpoint_of(&method, uri.path()) {
        state.metrics.reject(endpoint, failure.reason);
    }
    let content_type = content_type
        .as_ref()
        .and_then(|value| value.to_str().ok())
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    Wire::of(uri.path(), &content_type).render(&failure, response)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(content_type: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            "content-type",
            HeaderValue::from_str(content_type).expect("header"),
        );
        headers
    }

    #[test]
    fn each_family_takes_its_own_binary_type() {
        let connect = Rpc::of(&headers("application/proto"), Family::Connect).unwrap();
        assert_eq!(connect.encoding, Encoding::Proto);
        assert!(Rpc::of(&headers("application/x-protobuf"), Family::Connect).is_err());
        let otlp = Rpc::of(&headers("application/x-protobuf"), Family::Otlp).unwrap();
        assert_eq!(otlp.encoding, Encoding::Proto);
        let grpc = Rpc::of(&headers("application/grpc+proto"), Family::Otlp).unwrap();
        assert_eq!(grpc.encoding, Encoding::Grpc);
        let err = Rpc::of(&headers("text/plain"), Family::Connect).unwrap_err();
        assert_eq!(err.kind().status(), 415);
    }

    #[test]
    fn errors_take_the_shape_of_the_request() {
        let json = "application/json";
        assert_eq!(Wire::of("/push.v1.PusherService/Push", json), Wire::Connect);
        assert_eq!(
            Wire::of(crate::endpoints::OTLP_HTTP_PATH, json),
            Wire::Otlp(Encoding::Json)
        );
        assert_eq!(Wire::of("/api/0/profiles", json), Wire::Profefe);
        assert_eq!(
            Wire::of("/querier.v1.QuerierService/Series", "application/grpc"),
            Wire::Grpc
        );
        assert_eq!(Wire::of("/ingest", json), Wire::Text);
    }

    #[test]
    fn grpc_frames_are_checked() {
        let plain = headers("application/grpc");
        let frame = [0u8, 0, 0, 0, 2, 8, 1];
        assert_eq!(unframe(&plain, &frame, 100).unwrap().as_ref(), &[8, 1]);
        assert!(matches!(
            unframe(&plain, &frame[..3], 100),
            Err(RpcError::ShortFrame)
        ));
        assert!(matches!(
            unframe(&plain, &[0, 0, 0, 0, 9, 1], 100),
            Err(RpcError::FrameLength {
                declared: 9,
                actual: 1
            })
        ));
        assert!(matches!(
            unframe(&plain, &[1, 0, 0, 0, 1, 0], 100),
            Err(RpcError::GrpcEncoding(_))
        ));
    }
}
