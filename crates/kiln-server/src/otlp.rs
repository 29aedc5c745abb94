//! OTLP profiles export: gRPC `ProfilesService/Export` and OTLP/HTTP
//! `POST /v1development/profiles` (protobuf or JSON, gzip or not), on the server's port.
//!
//! Refused profiles of an otherwise good request are reported in `partial_success`, as
//! OTLP defines; a request whose every profile is refused gets 400 (gRPC
//! INVALID_ARGUMENT). OTLP/HTTP errors carry a `google.rpc.Status` in the request's
//! encoding.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use kiln_ingest::otlp::{
    decode_json, decode_proto, parse_export, ExportProfilesPartialSuccess,
    ExportProfilesServiceResponse,
};
use kiln_ingest::IngestError;
use serde_json::json;

use crate::body::{content_type, read_limited};
use crate::grpc;
use crate::routes::{parse_blocking, read_ingest_body, rejected, write_profiles, SharedState};
use crate::tenant::tenant_of;

const ENDPOINT: &str = "otlp";

/// `google.rpc.Status`, the body of an OTLP/HTTP error.
#[derive(Clone, PartialEq, prost::Message)]
struct Status {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

#[derive(Clone, Copy, PartialEq)]
enum Encoding {
    Grpc,
    Protobuf,
    Json,
}

/// Both transports: gRPC when the content type says so, OTLP/HTTP otherwise.
pub async fn export(State(state): State<SharedState>, headers: HeaderMap, body: Body) -> Response {
    let content_type = content_type(&headers);
    let encoding = if grpc::is_grpc(&content_type) {
        Encoding::Grpc
    } else if content_type.starts_with("application/json") {
        Encoding::Json
    } else {
        Encoding::Protobuf
    };
    let result = async {
        let tenant = tenant_of(&headers).map_err(IngestError::BadRequest)?;
        let limits = state.limits.for_tenant(&tenant);
        let (request, received_bytes) = match encoding {
            Encoding::Grpc => {
                let raw = read_limited(body, limits.max_body_bytes).await?;
                state.limits.check_rate(&tenant, raw.len())?;
                let message = grpc::unframe(&headers, &raw, limits.max_decompressed_bytes)
                    .map_err(IngestError::BadRequest)?;
                (decode_proto(&message)?, raw.len())
            }
            Encoding::Protobuf | Encoding::Json => {
                if encoding == Encoding::Protobuf
                    && !content_type.starts_with("application/x-protobuf")
                    && !content_type.starts_with("application/protobuf")
                {
                    return Err(IngestError::UnsupportedFormat(format!(
                        "unsupported content type {content_type:?}; OTLP/HTTP takes application/x-protobuf or application/json"
                    )));
                }
                let body = read_ingest_body(&state, &tenant, &headers, body).await?;
                let request = match encoding {
                    Encoding::Json => decode_json(&body)?,
                    _ => decode_proto(&body)?,
                };
                (request, body.len())
            }
        };
        let export =
            parse_blocking(move || parse_export(request, received_bytes, &limits)).await?;
        let rejected_profiles = export.rejected_profiles;
        let error_message = export.error_message();
        write_profiles(&state, ENDPOINT, &tenant, export.profiles).await?;
        Ok((rejected_profiles, error_message))
    }
    .await;
    match result {
        Ok((rejected_profiles, error_message)) => {
            let partial_success = (rejected_profiles > 0).then_some(ExportProfilesPartialSuccess {
                rejected_profiles,
                error_message,
            });
            success(encoding, partial_success)
        }
        Err(err) => {
            rejected(&state, ENDPOINT, &err);
            failure(encoding, &err)
        }
    }
}

fn success(encoding: Encoding, partial_success: Option<ExportProfilesPartialSuccess>) -> Response {
    match encoding {
        Encoding::Json => {
            let body = match partial_success {
                Some(partial) => json!({"partialSuccess": {
                    "rejectedProfiles": partial.rejected_profiles.to_string(),
                    "errorMessage": partial.error_message,
                }}),
                None => json!({}),
            };
            (StatusCode::OK, axum::Json(body)).into_response()
        }
        Encoding::Grpc | Encoding::Protobuf => {
            let message =
                prost::Message::encode_to_vec(&ExportProfilesServiceResponse { partial_success });
            if encoding == Encoding::Grpc {
                return grpc::ok_response(message);
            }
            (
                StatusCode::OK,
                [("content-type", "application/x-protobuf")],
                message,
            )
                .into_response()
        }
    }
}

fn failure(encoding: Encoding, err: &IngestError) -> Response {
    let status = err.status();
    let code = grpc::code_for_status(status);
    let message = err.to_string();
    let http_status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    match encoding {
        Encoding::Grpc => grpc::error_response(code, &message),
        Encoding::Json => (
            http_status,
            axum::Json(json!({"code": code, "message": message})),
        )
            .into_response(),
        Encoding::Protobuf => (
            http_status,
            [("content-type", "application/x-protobuf")],
            prost::Message::encode_to_vec(&Status {
                code: code as i32,
                message,
            }),
        )
            .into_response(),
    }
}
