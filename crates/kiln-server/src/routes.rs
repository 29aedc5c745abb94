//! Route handlers. Each one: resolve the tenant, bound the body, call the ingest or query
//! layer, and shape the answer (or the error) the way the protocol's clients expect.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use kiln_ingest::push::{decode_json, decode_proto, parse_push, PushResponse};
use kiln_ingest::{IngestError, Ingester, ParsedProfile, TenantLimits};
use kiln_model::labels::SERVICE_NAME;
use kiln_model::profile_type::{default_legacy_type, split_legacy_name};
use kiln_model::selector::{self, Matcher, Selector};
use kiln_model::time::{format_rfc3339, parse_time_nanos};
use kiln_query::pprof_export::merged_pprof;
use kiln_query::profiles::{list_profiles, ordered_types, select_by_ids};
use kiln_query::select::{SelectRequest, TypeFilter};
use kiln_query::{Querier, QueryError};
use prometheus_client::registry::Registry;
use serde_json::json;

use crate::body::{content_type, decode_content_encoding, read_limited};
use crate::grpc;
use crate::metrics::ServerMetrics;
use crate::tenant::tenant_of;

pub struct AppState {
    pub ingester: Ingester,
    pub querier: Querier,
    pub limits: TenantLimits,
    pub metrics: ServerMetrics,
    pub registry: Registry,
    pub ready: AtomicBool,
    /// Health of scrape targets, when scrape_configs are set.
    pub targets: Option<kiln_scrape::Targets>,
    /// How long a client may take to send a request body.
    pub body_read_timeout: std::time::Duration,
}

pub(crate) type SharedState = Arc<AppState>;

pub fn router(state: SharedState) -> Router {
    Router::new()
        .route("/ingest", post(pyroscope_ingest))
        .route("/pyroscope/ingest", post(pyroscope_ingest))
        .route("/push.v1.PusherService/Push", post(push))
        .route(
            "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export",
            post(crate::otlp::export),
        )
        .route("/v1development/profiles", post(crate::otlp::export))
        .route(
            "/querier.v1.QuerierService/{method}",
            post(crate::querier::querier_service),
        )
        .route("/api/0/profiles", post(profefe_ingest).get(profefe_list))
        .route("/api/0/profiles/merge", get(profefe_merge))
        .route("/api/0/profiles/{id}", get(profefe_get))
        .route("/api/0/services", get(profefe_services))
        .route("/api/0/version", get(profefe_version))
        .route("/pyroscope/render", get(crate::legacy::render))
        .route("/render", get(crate::legacy::render))
        .route("/pyroscope/render-diff", get(crate::legacy::render_diff))
        .route("/render-diff", get(crate::legacy::render_diff))
        .route("/pyroscope/label-names", get(crate::legacy::label_names))
        .route("/label-names", get(crate::legacy::label_names))
        .route("/pyroscope/label-values", get(crate::legacy::label_values))
        .route("/label-values", get(crate::legacy::label_values))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/api/v1/targets", get(scrape_targets))
        .merge(crate::ui::router())
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::listener::guard,
        ))
        .with_state(state)
}

pub(crate) fn now_nanos() -> i64 {
    kiln_ingest::parse::now_nanos()
}

pub(crate) fn text_error(status: u16, message: impl Into<String>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut message = message.into();
    message.push('\n');
    (status, message).into_response()
}

/// Reads a body within the tenant's limit and counts it against the tenant's rate.
pub(crate) async fn read_ingest_body(
    state: &AppState,
    tenant: &str,
    headers: &HeaderMap,
    body: Body,
) -> Result<Bytes, IngestError> {
    let limits = state.limits.for_tenant(tenant);
    let raw = read_limited(body, limits.max_body_bytes).await?;
    state.limits.check_rate(tenant, raw.len())?;
    decode_content_encoding(headers, raw, limits.max_decompressed_bytes)
}

/// The tenant, its limits, and the bounded, decoded body of an ingest request.
async fn ingest_request(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<(String, kiln_ingest::Limits, Bytes), IngestError> {
    let tenant = tenant_of(headers).map_err(IngestError::BadRequest)?;
    let body = read_ingest_body(state, &tenant, headers, body).await?;
    let limits = state.limits.for_tenant(&tenant);
    Ok((tenant, limits, body))
}

/// Runs a CPU-heavy parser off the async workers.
pub(crate) async fn parse_blocking<T: Send + 'static>(
    parse: impl FnOnce() -> Result<T, IngestError> + Send + 'static,
) -> Result<T, IngestError> {
    kiln_ingest::cpu::run_parser(parse).await
}

/// Writes parsed profiles and records the outcome in the metrics. Returns the warnings
/// the client should see (each once), for [`with_warnings`].
pub(crate) async fn write_profiles(
    state: &AppState,
    endpoint: &str,
    tenant: &str,
    profiles: Vec<ParsedProfile>,
) -> Result<Vec<String>, IngestError> {
    let bytes: usize = profiles.iter().map(|p| p.received_bytes).sum();
    let count = profiles.len();
    let mut warnings: Vec<String> = Vec::new();
    for warning in profiles.iter().flat_map(|p| &p.warnings) {
        if !warnings.contains(warning) {
            warnings.push(warning.clone());
        }
    }
    state.ingester.write(tenant, profiles).await?;
    state.metrics.accept(endpoint, bytes, count);
    Ok(warnings)
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

pub(crate) fn rejected(state: &AppState, endpoint: &str, err: &IngestError) {
    state.metrics.reject(endpoint, err.reason());
    if err.status() >= 500 {
        tracing::error!(endpoint, error = %err, "ingest failed");
    } else {
        tracing::debug!(endpoint, error = %err, "ingest refused");
    }
}

async fn pyroscope_ingest(
    State(state): State<SharedState>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = async {
        let (tenant, limits, body) = ingest_request(&state, &headers, body).await?;
        let profiles =
            kiln_ingest::pyroscope::parse_ingest(&params, &content_type(&headers), body, &limits)
                .await?;
        write_profiles(&state, "ingest", &tenant, profiles).await
    }
    .await;
    match result {
        Ok(warnings) => with_warnings(StatusCode::OK.into_response(), &warnings),
        Err(err) => {
            rejected(&state, "ingest", &err);
            text_error(err.status(), err.to_string())
        }
    }
}

/// `push.v1.PusherService/Push` over Connect (proto or JSON) and gRPC.
async fn push(State(state): State<SharedState>, headers: HeaderMap, body: Body) -> Response {
    let content_type = content_type(&headers);
    let is_grpc = grpc::is_grpc(&content_type);
    let is_json = content_type.starts_with("application/json");
    let result = async {
        let tenant = tenant_of(&headers).map_err(IngestError::BadRequest)?;
        let limits = state.limits.for_tenant(&tenant);
        let request = if is_grpc {
            let raw = read_limited(body, limits.max_body_bytes).await?;
            state.limits.check_rate(&tenant, raw.len())?;
            let message = grpc::unframe(&headers, &raw, limits.max_decompressed_bytes).map_err(IngestError::BadRequest)?;
            decode_proto(&message)?
        } else {
            if !(is_json || content_type.starts_with("application/proto") || content_type.starts_with("application/protobuf")) {
                return Err(IngestError::UnsupportedFormat(format!(
                    "unsupported content type {content_type:?}; use application/proto, application/json or gRPC"
                )));
            }
            let body = read_ingest_body(&state, &tenant, &headers, body).await?;
            if is_json {
                decode_json(&body)?
            } else {
                decode_proto(&body)?
            }
        };
        let profiles = parse_blocking(move || parse_push(request, &limits)).await?;
        write_profiles(&state, "push", &tenant, profiles).await
    }
    .await;
    match result {
        Ok(_) if is_grpc => grpc::ok_response(prost::Message::encode_to_vec(&PushResponse {})),
        Ok(warnings) if is_json => with_warnings(
            (StatusCode::OK, [("content-type", "application/json")], "{}").into_response(),
            &warnings,
        ),
        Ok(warnings) => with_warnings(
            (
                StatusCode::OK,
                [("content-type", "application/proto")],
                Vec::<u8>::new(),
            )
                .into_response(),
            &warnings,
        ),
        Err(err) => {
            rejected(&state, "push", &err);
            if is_grpc {
                grpc::error_response(grpc::code_for_status(err.status()), &err.to_string())
            } else {
                connect_error(err.status(), &err.to_string())
            }
        }
    }
}

/// A Connect unary error: JSON `{code, message}` with the matching HTTP status.
pub fn connect_error(status: u16, message: &str) -> Response {
    let code = match status {
        400 | 413 => "invalid_argument",
        404 => "not_found",
        408 => "deadline_exceeded",
        415 => "unimplemented",
        429 => "resource_exhausted",
        503 => "unavailable",
        _ => "internal",
    };
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(json!({"code": code, "message": message}))).into_response()
}

fn profefe_error(status: u16, message: impl std::fmt::Display) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        code,
        Json(json!({"code": status, "error": message.to_string()})),
    )
        .into_response()
}

async fn profefe_ingest(
    State(state): State<SharedState>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = async {
        let (tenant, limits, body) = ingest_request(&state, &headers, body).await?;
        let profile =
            parse_blocking(move || kiln_ingest::profefe::parse_profefe(&params, &body, &limits))
                .await?;
        let id = profile.id.clone();
        let profefe_type = profile
            .types
            .first()
            .map(|plan| kiln_ingest::profefe::type_for_profile_name(&plan.profile_type.name))
            .unwrap_or("other");
        let warnings = write_profiles(&state, "profefe", &tenant, vec![profile]).await?;
        Ok::<_, IngestError>((id, profefe_type, warnings))
    }
    .await;
    match result {
        Ok((id, profefe_type, warnings)) => with_warnings(
            Json(json!({"code": 200, "body": {"id": id, "type": profefe_type}})).into_response(),
            &warnings,
        ),
        Err(err) => {
            rejected(&state, "profefe", &err);
            profefe_error(err.status(), err)
        }
    }
}

/// The selection a profefe read describes: service, type, labels, from/to.
fn profefe_selection(
    params: &HashMap<String, String>,
    tenant: String,
) -> Result<SelectRequest, QueryError> {
    let service = params
        .get("service")
        .filter(|s| !s.is_empty())
        .ok_or_else(|| QueryError::BadRequest("the service parameter is required".into()))?;
    let profefe_type = params
        .get("type")
        .ok_or_else(|| QueryError::BadRequest("the type parameter is required".into()))?;
    let name = kiln_ingest::profefe::profile_name_for_type(profefe_type)
        .map_err(|err| QueryError::BadRequest(err.to_string()))?;
    let mut matchers = vec![Matcher::equal(SERVICE_NAME, service)];
    let labels =
        kiln_ingest::profefe::parse_labels(params.get("labels").map_or("", String::as_str))
            .map_err(|err| QueryError::BadRequest(err.to_string()))?;
    for label in labels.labels.iter() {
        matchers.push(Matcher::equal(&label.name, &label.value));
    }
    let now = now_nanos();
    let from_nanos = match params.get("from") {
        Some(value) => parse_time_nanos(value, now)
            .map_err(|err| QueryError::BadRequest(format!("from: {err}")))?,
        None => i64::MIN,
    };
    let to_nanos = match params.get("to") {
        Some(value) => parse_time_nanos(value, now)
            .map_err(|err| QueryError::BadRequest(format!("to: {err}")))?,
        None => i64::MAX,
    };
    if to_nanos < from_nanos {
        return Err(QueryError::BadRequest("to is before from".into()));
    }
    Ok(SelectRequest {
        tenant,
        types: name.map_or(TypeFilter::Any, |name| TypeFilter::Name(name.to_string())),
        selector: Selector {
            name: None,
            matchers,
        },
        from_nanos,
        to_nanos,
        ..Default::default()
    })
}

async fn profefe_list(
    State(state): State<SharedState>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let result = async {
        let tenant = tenant_of(&headers).map_err(QueryError::BadRequest)?;
        let request = profefe_selection(&params, tenant)?;
        let limit = match params.get("limit") {
            Some(limit) => limit
                .parse::<usize>()
                .map_err(|_| QueryError::BadRequest(format!("invalid limit {limit:?}")))?,
            None => 100,
        };
        list_profiles(&state.querier, &request, limit).await
    }
    .await;
    match result {
        Ok(profiles) => {
            let body: Vec<serde_json::Value> = profiles
                .iter()
                .map(|profile| {
                    let labels: Vec<serde_json::Value> = profile
                        .labels
                        .iter()
                        .filter(|label| label.name != SERVICE_NAME)
                        .map(|label| json!({"key": label.name, "value": label.value}))
                        .collect();
                    json!({
                        "profile_id": profile.id,
                        "service": profile.service,
                        "type": kiln_ingest::profefe::type_for_profile_name(&profile.profile_name),
                        "labels": labels,
                        "created_at": format_rfc3339(profile.time_nanos),
                    })
                })
                .collect();
            Json(json!({"code": 200, "body": body})).into_response()
        }
        Err(err) => profefe_error(err.status(), err),
    }
}

fn pprof_response(profile: &kiln_model::pprof::Profile) -> Response {
    let bytes = kiln_model::compress::gzip(&profile.encode_to_bytes());
    (
        StatusCode::OK,
        [("content-type", "application/octet-stream")],
        bytes,
    )
        .into_response()
}

async fn profefe_get(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let result = async {
        let tenant = tenant_of(&headers).map_err(QueryError::BadRequest)?;
        let ids: Vec<String> = id
            .split('+')
            .filter(|id| !id.is_empty())
            .map(str::to_string)
            .collect();
        if ids.is_empty() {
            return Err(QueryError::BadRequest("no profile id given".into()));
        }
        let (selections, types) = select_by_ids(&state.querier, &tenant, &ids).await?;
        // Merging profiles of different kinds would mix units: refuse like profefe does.
        let names: std::collections::BTreeSet<&str> =
            types.iter().filter_map(|t| t.split(':').next()).collect();
        if names.len() > 1 {
            return Err(QueryError::BadRequest(format!(
                "profiles are of different types ({}); merge profiles of one type",
                names.into_iter().collect::<Vec<_>>().join(", ")
            )));
        }
        Ok(merged_pprof(&selections, &types))
    }
    .await;
    match result {
        Ok(profile) => pprof_response(&profile),
        Err(err) => profefe_error(err.status(), err),
    }
}

async fn profefe_merge(
    State(state): State<SharedState>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let result = async {
        let tenant = tenant_of(&headers).map_err(QueryError::BadRequest)?;
        let request = profefe_selection(&params, tenant)?;
        let selections = state.querier.select(&request).await?;
        if selections.is_empty() {
            return Err(QueryError::NotFound(
                "no profiles found for this selection".into(),
            ));
        }
        let types = ordered_types(&selections);
        Ok(merged_pprof(&selections, &types))
    }
    .await;
    match result {
        Ok(profile) => pprof_response(&profile),
        Err(err) => profefe_error(err.status(), err),
    }
}

async fn profefe_services(State(state): State<SharedState>, headers: HeaderMap) -> Response {
    let result = async {
        let tenant = tenant_of(&headers).map_err(QueryError::BadRequest)?;
        Ok::<_, QueryError>(
            state
                .querier
                .metastore()
                .services(&tenant, i64::MIN, i64::MAX)
                .await?,
        )
    }
    .await;
    match result {
        Ok(services) => Json(json!({"code": 200, "body": services})).into_response(),
        Err(err) => profefe_error(err.status(), err),
    }
}

async fn profefe_version() -> Response {
    Json(json!({"code": 200, "body": {"version": env!("CARGO_PKG_VERSION"), "commit": "", "build_time": ""}})).into_response()
}

/// Parses a render `query`: `TYPE_ID{matchers}` or the legacy `app.cpu{matchers}` form.
pub fn parse_render_query(query: &str) -> Result<(String, Selector), QueryError> {
    let mut parsed = selector::parse(query)
        .map_err(|err| QueryError::BadRequest(format!("invalid query: {err}")))?;
    let name = parsed.name.take().ok_or_else(|| {
        QueryError::BadRequest("invalid query: a profile type is required before the braces".into())
    })?;
    if name.split(':').count() == 5 {
        return Ok((name, parsed));
    }
    let (app, kind) = split_legacy_name(&name);
    let type_id = kind.unwrap_or_else(default_legacy_type).profile_type.id();
    parsed.matchers.push(Matcher::equal(SERVICE_NAME, app));
    Ok((type_id, parsed))
}

async fn ready(State(state): State<SharedState>) -> Response {
    if state.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}

/// Prometheus's target listing, for the scrape targets of this server.
async fn scrape_targets(State(state): State<SharedState>) -> Response {
    let targets = state.targets.clone().unwrap_or_default();
    axum::Json(targets.to_prometheus_json()).into_response()
}

async fn metrics(State(state): State<SharedState>) -> Response {
    let mut text = String::new();
    if let Err(err) = prometheus_client::encoding::text::encode(&mut text, &state.registry) {
        return text_error(500, format!("failed to encode metrics: {err}"));
    }
    if let Some(targets) = &state.targets {
        // Per-target series change as targets come and go: rendered here, before `# EOF`.
        let body = text.strip_suffix("# EOF\n").unwrap_or(&text).to_string();
        text = format!("{body}{}# EOF\n", targets.metrics_text());
    }
    let mut response = text.into_response();
    response.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}
