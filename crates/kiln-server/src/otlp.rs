//! OTLP profiles export: gRPC `ProfilesService/Export` and OTLP/HTTP
//! `POST /v1development/profiles` (protobuf or JSON, gzip or not), on the server's port.
//!
//! Refused profiles of an otherwise good request are reported in `partial_success`, as
//! OTLP defines; a request whose every profile is refused gets 400 (gRPC
//! INVALID_ARGUMENT). OTLP/HTTP errors carry a `google.rpc.Status` in the request's
//! encoding ([`crate::rpc::Wire::Otlp`]).

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use kiln_ingest::otlp::{
    decode_json, parse_export, parse_export_proto, ExportProfilesPartialSuccess,
    ExportProfilesServiceResponse,
};

use crate::endpoints::OTLP;
use crate::error::ApiError;
use crate::ingest::{parse_and_write, read_body};
use crate::rpc::{Encoding, Family, Rpc};
use crate::state::SharedState;
use crate::tenant::Tenant;

/// Both transports: gRPC when the content type says so, OTLP/HTTP otherwise.
pub async fn export(
    State(state): State<SharedState>,
    tenant: Tenant,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let rpc = Rpc::of(&headers, Family::Otlp)?;
    let body = read_body(&state, &tenant, &headers, body, Some(rpc)).await?;
    // An export batches resources of many services (a collector's): written here.
    state
        .forwarder
        .count_local(kiln_cluster::LocalReason::Unplaced);
    // gRPC counts the frame as received, OTLP/HTTP the decoded body.
    let received = match rpc.encoding {
        Encoding::Grpc => body.received,
        _ => body.message.len(),
    };
    let limits = body.limits;
    let message = body.message;
    let json = rpc.is_json();
    let parse = move || {
        let export = match json {
            true => parse_export(decode_json(&message)?, received, &limits)?,
            false => parse_export_proto(&message, received, &limits)?,
        };
        let error_message = export.error_message();
        Ok((export.profiles, (export.rejected_profiles, error_message)))
    };
    let ((rejected_profiles, error_message), _) =
        parse_and_write(&state, OTLP, &tenant, &headers, parse, body.arrival).await?;
    let partial_success = (rejected_profiles > 0).then_some(ExportProfilesPartialSuccess {
        rejected_profiles,
        error_message,
    });
    Ok(rpc.reply(&ExportProfilesServiceResponse { partial_success }))
}
