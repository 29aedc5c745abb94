//! Operating the server: `/ready`, `/metrics` and the scrape targets' health.

use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::state::SharedState;

/// The OpenAPI 3 description of the endpoints that are not Connect/gRPC (`api/openapi.json`
/// in this crate, written by hand; the schemathesis test checks the server against it).
pub const OPENAPI: &str = include_str!("../api/openapi.json");

pub async fn openapi() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        OPENAPI,
    )
        .into_response()
}

pub async fn ready(State(state): State<SharedState>) -> Response {
    if state.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}

/// The deployment's nodes: roles, address, last heartbeat and state (live, down, left).
pub async fn nodes(State(state): State<SharedState>) -> Result<Response, crate::error::ApiError> {
    let nodes = state
        .membership
        .nodes()
        .await
        .map_err(kiln_query::QueryError::from)?;
    let listed: Vec<serde_json::Value> = nodes
        .into_iter()
        .map(|(node, node_state)| {
            serde_json::json!({
                "id": node.id,
                "roles": node.roles,
                "address": node.address,
                "started_at_ms": node.started_at_ms,
                "last_heartbeat_ms": node.heartbeat_at_ms,
                "lease_expires_at_ms": node.lease_expires_at_ms,
                "left_at_ms": node.left_at_ms,
                "state": node_state,
            })
        })
        .collect();
    Ok(
        axum::Json(serde_json::json!({ "self": state.membership.id(), "nodes": listed }))
            .into_response(),
    )
}

/// Prometheus's target listing, for the scrape targets of this server.
pub async fn scrape_targets(State(state): State<SharedState>) -> Response {
    let targets = state.targets.clone().unwrap_or_default();
    axum::Json(targets.to_prometheus_json()).into_response()
}

pub async fn metrics(State(state): State<SharedState>) -> Response {
    let mut text = String::new();
    if let Err(err) = prometheus_client::encoding::text::encode(&mut text, &state.registry) {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("failed to encode metrics: {err}\n"),
        )
            .into_response();
    }
    // The recording rules' newest values carry their own sample times, which
    // prometheus-client's encoder cannot write (kiln-rules `export.rs` says why they must):
    // rendered here, before `# EOF`.
    let mut body = text.strip_suffix("# EOF\n").unwrap_or(&text).to_string();
    state.rules.render_latest(&mut body);
    body.push_str("# EOF\n");
    text = body;
    let mut response = text.into_response();
    response.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}
