//! gRPC framing for unary calls, served by the same handlers as Connect.
//!
//! tonic would own the route and could not also answer Connect's HTTP/1.1 requests on the
//! same path, so the few lines of gRPC framing live here: 5-byte length-prefixed messages
//! in, one message and `grpc-status` trailers out.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Response, StatusCode};
use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::StreamBody;
use hyper::body::Frame;

/// gRPC status codes used here.
pub mod code {
    pub const OK: u32 = 0;
    pub const INVALID_ARGUMENT: u32 = 3;
    pub const DEADLINE_EXCEEDED: u32 = 4;
    pub const NOT_FOUND: u32 = 5;
    pub const RESOURCE_EXHAUSTED: u32 = 8;
    pub const UNIMPLEMENTED: u32 = 12;
    pub const INTERNAL: u32 = 13;
    pub const UNAVAILABLE: u32 = 14;
}

/// The gRPC code for an HTTP-style status.
pub fn code_for_status(status: u16) -> u32 {
    match status {
        400 | 413 => code::INVALID_ARGUMENT,
        404 => code::NOT_FOUND,
        408 => code::DEADLINE_EXCEEDED,
        415 => code::UNIMPLEMENTED,
        429 => code::RESOURCE_EXHAUSTED,
        503 => code::UNAVAILABLE,
        _ => code::INTERNAL,
    }
}

pub fn is_grpc(content_type: &str) -> bool {
    content_type.starts_with("application/grpc")
}

/// Reads the single message of a unary request, inflating it when the compressed flag is
/// set (only gzip is accepted, as the request's `grpc-encoding` must say).
pub fn unframe(headers: &HeaderMap, body: &[u8], limit: usize) -> Result<Bytes, String> {
    if body.len() < 5 {
        return Err("gRPC message frame is shorter than its 5-byte header".to_string());
    }
    let compressed = body[0];
    let length = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    let message = body.get(5..5 + length).ok_or_else(|| {
        format!(
            "gRPC frame declares {length} bytes but has {}",
            body.len() - 5
        )
    })?;
    if body.len() != 5 + length {
        return Err("a unary gRPC request must carry exactly one message".to_string());
    }
    match compressed {
        0 => Ok(Bytes::copy_from_slice(message)),
        1 => {
            let encoding = headers
                .get("grpc-encoding")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if encoding != "gzip" {
                return Err(format!("unsupported grpc-encoding {encoding:?}; use gzip"));
            }
            kiln_model::compress::gunzip_bounded(message, limit)
                .map(Bytes::from)
                .map_err(|err| err.to_string())
        }
        flag => Err(format!("invalid gRPC compressed flag {flag}")),
    }
}

/// A successful unary response: one message, then `grpc-status: 0` trailers.
pub fn ok_response(message: Vec<u8>) -> Response<Body> {
    let mut frame = BytesMut::with_capacity(5 + message.len());
    frame.put_u8(0);
    frame.put_u32(message.len() as u32);
    frame.put_slice(&message);
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from(code::OK));
    let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = vec![
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

/// A trailers-only error response, as gRPC sends errors before any message.
pub fn error_response(code: u32, message: &str) -> Response<Body> {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::OK;
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
