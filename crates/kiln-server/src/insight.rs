//! `/api/v1/compare` and `/api/v1/regressions`: kiln-insight decides; this file
//! translates HTTP to its calls.

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use kiln_insight::{CompareRequest, InsightError};
use kiln_model::time::now_nanos;
use serde::Deserialize;

use crate::error::ApiError;
use crate::state::SharedState;
use crate::tenant::Tenant;

/// Two selections compared function by function (docs/insight.md).
pub async fn compare(
    State(state): State<SharedState>,
    tenant: Tenant,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: CompareRequest = serde_json::from_slice(&body)
        .map_err(|err| InsightError::BadRequest(format!("invalid comparison: {err}")))?;
    Ok(Json(state.insight.compare(&tenant, &request).await?).into_response())
}

#[derive(Debug, Deserialize)]
pub struct RegressionsQuery {
    service: Option<String>,
    since: Option<String>,
}

/// Findings of the regression watcher, newest first; `since` defaults to a week ago.
pub async fn regressions(
    State(state): State<SharedState>,
    tenant: Tenant,
    Query(query): Query<RegressionsQuery>,
) -> Result<Response, ApiError> {
    let since =
        kiln_query::request::time_or("since", query.since.as_deref(), "now-7d", now_nanos())?;
    let findings = state
        .insight
        .regressions(
            &tenant,
            query.service.filter(|s| !s.is_empty()),
            since.div_euclid(1_000_000),
        )
        .await?;
    Ok(Json(serde_json::json!({ "regressions": findings })).into_response())
}
