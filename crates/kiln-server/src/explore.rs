//! Kiln's own views for the UI: `/api/v1/overview`, `/api/v1/heatmap`,
//! `/api/v1/heatmap/flamegraph` and `/api/v1/lines` (docs/ui.md). kiln-query decides what
//! each means; this file translates HTTP to its calls.

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use kiln_model::labels::SERVICE_NAME;
use kiln_model::selector::MatchOp;
use kiln_model::time::now_nanos;
use kiln_query::heatmap::{self, HeatmapRequest, RectangleRequest};
use kiln_query::lines::{self, LinesRequest};
use kiln_query::merge::{cut, flame_graph, max_nodes};
use kiln_query::overview::{self, OverviewRequest};
use kiln_query::QueryError;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::error::ApiError;
use crate::state::SharedState;
use crate::tenant::Tenant;

fn parse<T: DeserializeOwned>(what: &str, body: &[u8]) -> Result<T, QueryError> {
    serde_json::from_slice(body)
        .map_err(|err| QueryError::BadRequest(format!("invalid {what}: {err}")))
}

/// Every service at once: sparkline, top functions, change against the previous period.
pub async fn overview(
    State(state): State<SharedState>,
    tenant: Tenant,
    Query(request): Query<OverviewRequest>,
) -> Result<Response, ApiError> {
    let select = request.select(&tenant, now_nanos())?;
    let overview = overview::overview(&state.querier, &select, request.points()).await?;
    Ok(Json(overview).into_response())
}

/// Individual profiles by time and value.
pub async fn heatmap(
    State(state): State<SharedState>,
    tenant: Tenant,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: HeatmapRequest = parse("heatmap request", &body)?;
    let select = request.select(&tenant, now_nanos())?;
    Ok(Json(heatmap::heatmap(&state.querier, &select, request.columns).await?).into_response())
}

/// The flame graph of a heatmap rectangle's profiles, or the diff of two rectangles.
pub async fn heatmap_flamegraph(
    State(state): State<SharedState>,
    tenant: Tenant,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: RectangleRequest = parse("heatmap selection", &body)?;
    let (left, right) = request.select(&tenant, now_nanos())?;
    let limit = max_nodes(request.max_nodes);
    let side = |selected: &heatmap::Selected| json!({ "profiles": selected.profiles, "total": selected.total });
    let answer = match right {
        None => {
            let selected = heatmap::select_rectangle(&state.querier, &left).await?;
            let left = side(&selected);
            json!({ "flamegraph": flame_graph(&cut(selected.tree, limit)), "left": left })
        }
        Some(right) => {
            let (left, right) = futures_util::future::try_join(
                heatmap::select_rectangle(&state.querier, &left),
                heatmap::select_rectangle(&state.querier, &right),
            )
            .await?;
            let graph = kiln_query::diff::flame_graph_diff(&left.tree, &right.tree, limit);
            json!({ "flamegraph": graph, "left": side(&left), "right": side(&right) })
        }
    };
    Ok(Json(answer).into_response())
}

/// A function's self and total per source line, with the source text of its files when
/// the server was told where the code is (`source.root`, `source.url_template`).
pub async fn lines(
    State(state): State<SharedState>,
    tenant: Tenant,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: LinesRequest = parse("lines request", &body)?;
    let select = request.select(&tenant, now_nanos())?;
    let lines = lines::function_lines(&state.querier, &select, &request.function).await?;
    let service = select
        .selector
        .matchers
        .iter()
        .find(|m| m.name == SERVICE_NAME && m.op == MatchOp::Equal)
        .map(|m| m.value.clone())
        .unwrap_or_default();
    let mut files: Vec<&str> = lines.lines.iter().map(|line| line.file.as_str()).collect();
    files.dedup();
    let mut sources = Vec::new();
    if state.sources.configured() {
        for file in files.into_iter().filter(|file| !file.is_empty()) {
            match state.sources.read(&service, file).await {
                Ok(Some(text)) => sources.push(text),
                Ok(None) => {}
                // A file that cannot be read leaves the table without its text.
                Err(err) => tracing::info!(file, error = %err, "source not shown"),
            }
        }
    }
    Ok(Json(json!({
        "function": lines.function,
        "profile_type": lines.profile_type,
        "total": lines.total,
        "self_value": lines.self_value,
        "total_value": lines.total_value,
        "lines": lines.lines,
        "source_configured": state.sources.configured(),
        "sources": sources,
    }))
    .into_response())
}
