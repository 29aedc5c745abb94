//! Pyroscope's `/ingest` and `push.v1.PusherService/Push`, and what every write endpoint
//! shares: reading a body within the tenant's limits and rate, writing the parsed
//! profiles, and passing their warnings on.

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use kiln_ingest::dedup::Idempotence;
use kiln_ingest::push::{decode_json, decode_proto, parse_push, PushResponse};
use kiln_ingest::{IngestError, Limits, ParsedProfile, Written};

use crate::body::{content_type, decode_content_encoding, BodyError};
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
    pub inflight: Option<kiln_ingest::InFlight>,
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
    pub _inflight: Option<kiln_ingest::InFlight>,
    /// Tells the group commit this write is on its way, until it is queued.
    pub arrival: kiln_ingest::Arrival,
}

/// The in-flight share a body of unknown length takes at a time as it arrives: one
/// reservation per 64 KiB rather than per read of 16 KiB at most.
const ADMISSION_STEP: usize = 64 << 10;

/// How long a body may send nothing and keep the share it was promised: past it, it keeps
/// only the bytes that have arrived ([`kiln_ingest::InFlight::keep`]).
const PROMISE_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

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

/// Reads a body within the tenant's limits. Every limit that can be judged from the
/// headers is judged before a byte of the body is read, and a refusal reads at most a
/// little of it ([`crate::body::refuse_unread`]): the write queue's room, the declared
/// length against the free in-flight bytes and against the tenant's rate. The in-flight
/// bytes are taken when the body's bytes start to arrive (the whole declared length, so
/// that bodies admitted together all finish), and given back down to what has arrived
/// whenever the body stalls for [`PROMISE_IDLE`]: a client that declares a body and sends
/// nothing, or stops, holds no more than it sent.
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
    // Past the hard limit: 413 before a byte of the body is read.
    if declared.is_some_and(|declared| declared > limits.max_body_bytes) {
        crate::body::refuse_unread(headers, body);
        return Err(BodyError::TooLarge(limits.max_body_bytes).into());
    }
    let early = state.ingester.has_room().and_then(|()| match declared {
        Some(declared) => {
            state.limits.check_declared(tenant, declared)?;
            state.limits.check_rate(tenant, declared)
        }
        None => Ok(()),
    });
    if let Err(err) = early {
        crate::body::refuse_unread(headers, body);
        return Err(err.into());
    }
    let (raw, inflight) = read_admitted(state, tenant, body, &limits, declared).await?;
    if declared.is_none() {
        state.limits.check_rate(tenant, raw.len())?;
    }
    // Announced to the group commit only now that the body is here: a stalled client
    // must not hold flushes waiting for it.
    let arrival = state.ingester.check_room()?;
    Ok(Received {
        limits,
        received: raw.len(),
        raw,
        inflight,
        arrival,
    })
}

/// Reads the whole body, refusing with 413 past `limits.max_body_bytes` and with 429 when
/// the in-flight bounds, taken as the bytes arrive, are full.
async fn read_admitted(
    state: &AppState,
    tenant: &str,
    mut body: Body,
    limits: &Limits,
    declared: Option<usize>,
) -> Result<(Bytes, Option<kiln_ingest::InFlight>), ApiError> {
    use http_body_util::BodyExt;
    let limit = limits.max_body_bytes;
    let mut held: Option<kiln_ingest::InFlight> = None;
    let mut first: Option<Bytes> = None;
    let mut joined = bytes::BytesMut::new();
    let mut received = 0usize;
    loop {
        let frame = match tokio::time::timeout(PROMISE_IDLE, body.frame()).await {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            // Stalled: it keeps only what has arrived, and asks again when bytes come.
            Err(_) => {
                if let Some(held) = held.as_mut() {
                    held.keep(received);
                }
                continue;
            }
        };
        let frame = frame.map_err(|err| {
            let err: axum::BoxError = err.into();
            if crate::body::is_timeout(err.as_ref()) {
                BodyError::Timeout(err)
            } else {
                BodyError::Read(err)
            }
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        received += data.len();
        if received > limit {
            crate::body::refuse_sending(body).await;
            return Err(BodyError::TooLarge(limit).into());
        }
        let holding = held.as_ref().map_or(0, kiln_ingest::InFlight::bytes);
        if received > holding {
            // A body of declared length takes the rest of it at once, so that bodies
            // admitted together are not refused halfway, their bytes read for nothing;
            // one of unknown length takes a step at a time.
            let ceiling = declared.unwrap_or(limit).max(received);
            let step = match declared {
                Some(_) => ceiling - holding,
                None => (received - holding)
                    .max(ADMISSION_STEP)
                    .min(ceiling - holding),
            };
            match state.limits.admit(tenant, step) {
                Ok(share) => match held.as_mut() {
                    Some(held) => held.absorb(share),
                    None => held = Some(share),
                },
                Err(err) => {
                    crate::body::refuse_sending(body).await;
                    return Err(BodyError::Overloaded(err).into());
                }
            }
        }
        match first.take() {
            None if joined.is_empty() => first = Some(data),
            None => joined.extend_from_slice(&data),
            Some(earlier) => {
                joined.reserve(declared.unwrap_or(0).max(earlier.len() + data.len()));
                joined.extend_from_slice(&earlier);
                joined.extend_from_slice(&data);
            }
        }
    }
    let raw = first.unwrap_or_else(|| joined.freeze());
    Ok((raw, held))
}

/// Parses a request and writes its profiles, staged on the thread that parsed them
/// ([`kiln_ingest::Ingester::parse_and_write`]), and counts them. Returns what `parse`
/// answered besides the profiles, and the warnings for [`with_warnings`].
///
/// A profile stored already within the tenant's `dedup_window_ms` (a retry) is
/// acknowledged and not stored again ([`kiln_ingest::dedup`]); the request's
/// `Idempotency-Key` header, when sent, says what a retry is.
pub(crate) async fn parse_and_write<T: Send + 'static>(
    state: &AppState,
    endpoint: &str,
    tenant: &str,
    headers: &HeaderMap,
    parse: impl FnOnce() -> Result<(Vec<ParsedProfile>, T), IngestError> + Send + 'static,
    arrival: kiln_ingest::Arrival,
) -> Result<(T, Written), ApiError> {
    let cardinality = state.limits.cardinality();
    let limits = state.limits.for_tenant(tenant);
    let idempotence = Idempotence {
        window_ms: limits.dedup_window_ms,
        key: idempotency_key(headers)?,
    };
    let owner = tenant.to_string();
    let parse = move || {
        let (profiles, answer) = parse()?;
        cardinality.admit(
            &owner,
            profiles.iter().map(|profile| &profile.labels),
            &limits,
            kiln_model::time::now_ms(),
        )?;
        Ok((profiles, answer))
    };
    let (answer, mut written) = state
        .ingester
        .parse_and_write(tenant, parse, arrival, idempotence)
        .await?;
    state
        .metrics
        .accept(endpoint, written.bytes, written.profiles);
    state.metrics.cut(&written.cuts);
    state.metrics.duplicates(endpoint, written.duplicates);
    if written.duplicates > 0 {
        written.warnings.push(format!(
            "{} of the request's profiles were stored already (a retry within limits.dedup_window_ms); they were not stored again",
            written.duplicates
        ));
    }
    Ok((answer, written))
}

/// The `Idempotency-Key` header (the IETF draft's): a visible-ASCII string of at most
/// 255 bytes, naming a request and its retries.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let text = value
        .to_str()
        .ok()
        .map(|text| text.trim().trim_matches('"'))
        .filter(|text| !text.is_empty() && text.len() <= 255)
        .filter(|text| text.bytes().all(|byte| byte.is_ascii_graphic()))
        .ok_or_else(|| {
            ApiError::from(IngestError::BadRequest(
                "the Idempotency-Key header must be 1 to 255 visible ASCII characters".into(),
            ))
        })?;
    Ok(Some(text.to_string()))
}

/// Adds one `Warning: 299 - "…"` header (RFC 7234's miscellaneous persistent warning) per
/// warning: the write succeeded, but not quite as sent.
pub(crate) fn with_warnings(mut response: Response, warnings: &[String]) -> Response {
    for warning in warnings {
        // Header values are ASCII to every client: some drop a value with other bytes.
        let text: String = warning
            .replace('…', "...")
            .chars()
            .map(|c| match c {
                '"' | '\\' => '\'',
                c if c.is_ascii() && !c.is_ascii_control() => c,
                _ => '?',
            })
            .collect();
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
    let ((), written) = parse_and_write(
        &state,
        PYROSCOPE,
        &tenant,
        &headers,
        move || Ok((parse()?, ())),
        body.arrival,
    )
    .await?;
    Ok(with_warnings(
        StatusCode::OK.into_response(),
        &written.warnings,
    ))
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
    let ((), written) =
        parse_and_write(&state, PUSH, &tenant, &headers, parse, body.arrival).await?;
    Ok(with_warnings(
        rpc.reply(&PushResponse {}),
        &written.warnings,
    ))
}
