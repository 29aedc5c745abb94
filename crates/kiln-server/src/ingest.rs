//! Pyroscope's `/ingest` and `push.v1.PusherService/Push`, and what every write endpoint
//! shares: reading a body within the tenant's limits and rate, writing the parsed
//! profiles, and passing their warnings on.

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use kiln_ingest::push::{decode_json, decode_proto, parse_push, PushResponse};
use kiln_ingest::{IngestError, Limits, ParsedProfile};

use crate::body::{content_type, decode_content_encoding, read_limited};
use crate::endpoints::{PUSH, PUSH_PATH, PYROSCOPE};
use crate::error::ApiError;
use crate::placement;
use crate::rpc::{Family, Rpc};
use crate::state::{AppState, SharedState};
use crate::tenant::Tenant;

/// A write's body as received, within its tenant's limits: what placement forwards.
pub(crate) struct Received {
    pub limits: Limits,
    /// The body as it came, framed or compressed.
    pub raw: Bytes,
    pub received: usize,
    pub inflight: (kiln_ingest::InFlight, Option<kiln_ingest::InFlight>),
    pub arrival: kiln_ingest::Arrival,
}

impl Received {
    /// Opens the body: as `rpc` frames it, or as its `Content-Encoding` says.
    pub(crate) fn open(
        self,
        headers: &HeaderMap,
        rpc: Option<Rpc>,
    ) -> Result<IngestBody, ApiError> {
        let message = match rpc {
            Some(rpc) => rpc.open(headers, self.raw, self.limits.max_decompressed_bytes)?,
            None => decode_content_encoding(headers, self.raw, self.limits.max_decompressed_bytes)?,
        };
        Ok(IngestBody {
            limits: self.limits,
            message,
            received: self.received,
            _inflight: self.inflight,
            arrival: self.arrival,
        })
    }
}

/// A write's body, read within its tenant's limits and opened.
pub(crate) struct IngestBody {
    pub limits: Limits,
    /// The message: the body with its gRPC frame or `Content-Encoding` removed.
    pub message: Bytes,
    /// Bytes as received, for accounting.
    pub received: usize,
    /// This request's share of the in-flight bounds, held until it is answered.
    pub _inflight: (kiln_ingest::InFlight, Option<kiln_ingest::InFlight>),
    /// Tells the group commit this write is on its way, until it is queued.
    pub arrival: kiln_ingest::Arrival,
}

/// What a body without `Content-Length` (h2, chunked) is admitted as before it is read;
/// the rest is taken once its size is known.
const UNDECLARED_BODY_BYTES: usize = 64 << 10;

/// Reads a body within the tenant's size limit, counts it against the tenant's rate, and
/// opens it: as `rpc` frames it, or as its `Content-Encoding` says.
pub(crate) async fn read_body(
    state: &AppState,
    tenant: &str,
    headers: &HeaderMap,
    body: Body,
    rpc: Option<Rpc>,
) -> Result<IngestBody, ApiError> {
    receive(state, tenant, headers, body)
        .await?
        .open(headers, rpc)
}

/// Reads a body within the tenant's size limit and counts it against the tenant's rate.
pub(crate) async fn receive(
    state: &AppState,
    tenant: &str,
    headers: &HeaderMap,
    body: Body,
) -> Result<Received, ApiError> {
    let limits = state.limits.for_tenant(tenant);
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<usize>().ok());
    let admitted = declared.unwrap_or(UNDECLARED_BODY_BYTES);
    let admission = state.ingester.check_room().and_then(|arrival| {
        let inflight = state.limits.admit(tenant, admitted)?;
        Ok((arrival, inflight))
    });
    let (arrival, inflight) = match admission {
        Ok(admitted) => admitted,
        Err(err) => {
            crate::body::discard(body, limits.max_body_bytes).await;
            return Err(err.into());
        }
    };
    let raw = read_limited(body, limits.max_body_bytes).await?;
    let more = match raw.len().checked_sub(admitted) {
        Some(more) if more > 0 => Some(state.limits.admit(tenant, more)?),
        _ => None,
    };
    state.limits.check_rate(tenant, raw.len())?;
    Ok(Received {
        limits,
        received: raw.len(),
        raw,
        inflight: (inflight, more),
        arrival,
    })
}

/// Parses a request and writes its profiles, staged on the thread that parsed them
/// ([`kiln_ingest::Ingester::parse_and_write`]), and counts them. Returns what `parse`
/// answered besides the profiles, and the warnings for [`with_warnings`].
pub(crate) async fn parse_and_write<T: Send + 'static>(
    state: &AppState,
    endpoint: &str,
    tenant: &str,
    parse: impl FnOnce() -> Result<(Vec<ParsedProfile>, T), IngestError> + Send + 'static,
    arrival: kiln_ingest::Arrival,
) -> Result<(T, Vec<String>), ApiError> {
    let (answer, written) = state
        .ingester
        .parse_and_write(tenant, parse, arrival)
        .await?;
    state
        .metrics
        .accept(endpoint, written.bytes, written.profiles);
    Ok((answer, written.warnings))
}

/// Adds one `Warning: 299 - "…"` header (RFC 7234's miscellaneous persistent warning) per
/// warning: the write succeeded, but not quite as sent.
pub(crate) fn with_warnings(mut response: Response, warnings: &[String]) -> Response {
    for warning in warnings {
        let text = warning.replace(['"', '\\'], "'");
        if let Ok(value) = HeaderValue::from_str(&format!("299 - \"{text}\"")) {
            response.headers_mut().append("warning", value);
        }
    }
    response
}

/// `POST /ingest?name=app.cpu{tags}&from=…&until=…&format=…`.
pub async fn pyroscope(
    State(state): State<SharedState>,
    tenant: Tenant,
    Query(params): Query<HashMap<String, String>>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let received = receive(&state, &tenant, &headers, body).await?;
    // The service is in the query string: the body is forwarded unopened.
    let service = params
        .get("name")
        .and_then(|name| kiln_ingest::pyroscope::parse_name(name).ok())
        .map(|name| name.app);
    let write = placement::Write::as_received(&uri, &headers, received.raw.clone());
    if let Some(answer) =
        placement::offer(&state, &tenant, service.as_deref(), &headers, write).await?
    {
        return Ok(placement::relay(answer));
    }
    let body = received.open(&headers, None)?;
    let parse = kiln_ingest::pyroscope::prepare_ingest(
        &params,
        &content_type(&headers),
        body.message,
        &body.limits,
    )
    .await?;
    let ((), warnings) = parse_and_write(
        &state,
        PYROSCOPE,
        &tenant,
        move || Ok((parse()?, ())),
        body.arrival,
    )
    .await?;
    Ok(with_warnings(StatusCode::OK.into_response(), &warnings))
}

/// `push.v1.PusherService/Push` over Connect (proto or JSON) and gRPC.
pub async fn push(
    State(state): State<SharedState>,
    tenant: Tenant,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let rpc = Rpc::of(&headers, Family::Connect)?;
    let body = read_body(&state, &tenant, &headers, body, Some(rpc)).await?;
    let request = if rpc.is_json() {
        decode_json(&body.message)?
    } else {
        decode_proto(&body.message)?
    };
    // Forwarded as a Connect unary call whatever it came as: the message, opened once.
    let write = placement::Write::connect(PUSH_PATH, &headers, rpc.is_json(), body.message.clone());
    let service = kiln_ingest::push::single_service(&request);
    if let Some(answer) = placement::offer(&state, &tenant, service, &headers, write).await? {
        let warnings = placement::accepted(answer)?;
        return Ok(with_warnings(rpc.reply(&PushResponse {}), &warnings));
    }
    let limits = body.limits;
    let parse = move || Ok((parse_push(request, &limits)?, ()));
    let ((), warnings) = parse_and_write(&state, PUSH, &tenant, parse, body.arrival).await?;
    Ok(with_warnings(rpc.reply(&PushResponse {}), &warnings))
}
