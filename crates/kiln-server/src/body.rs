//! Reading request bodies within limits, and undoing `Content-Encoding`.

use axum::body::Body;
use axum::http::HeaderMap;
use bytes::Bytes;
use http_body_util::BodyExt;
use kiln_ingest::IngestError;

/// Reads the whole body, refusing with 413 once it passes `limit` bytes.
pub async fn read_limited(body: Body, limit: usize) -> Result<Bytes, IngestError> {
    let limited = http_body_util::Limited::new(body, limit);
    match limited.collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err)
            if err
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(IngestError::TooLarge(format!(
                "request body exceeds the limit of {limit} bytes"
            )))
        }
        Err(err) => Err(IngestError::BadRequest(format!(
            "failed to read the request body: {err}"
        ))),
    }
}

/// Removes a gzip `Content-Encoding`, bounded by `limit` decompressed bytes.
pub fn decode_content_encoding(
    headers: &HeaderMap,
    body: Bytes,
    limit: usize,
) -> Result<Bytes, IngestError> {
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
            Ok(Bytes::from(kiln_model::compress::gunzip_bounded(
                &body, limit,
            )?))
        }
        other => Err(IngestError::UnsupportedFormat(format!(
            "unsupported Content-Encoding {other:?}; use gzip"
        ))),
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
