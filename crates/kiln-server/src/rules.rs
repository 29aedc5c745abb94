//! `/api/v1/recording-rules`: a tenant's recording rules, their preview and backfill.
//! kiln-rules decides; this file translates HTTP to its calls.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use kiln_model::time::now_nanos;
use kiln_rules::rule::RuleSpec;
use kiln_rules::RulesError;
use serde::Deserialize;

use crate::error::ApiError;
use crate::state::SharedState;
use crate::tenant::Tenant;

#[derive(Debug, Deserialize)]
pub struct Range {
    from: Option<String>,
    until: Option<String>,
}

impl Range {
    /// Both ends in ms; times as the query APIs take them (`now-1h`, RFC 3339, epoch).
    fn millis(&self, default_from: Option<&str>) -> Result<(i64, i64), ApiError> {
        let now = now_nanos();
        let from = self
            .from
            .as_deref()
            .or(default_from)
            .ok_or_else(|| RulesError::BadRequest("from is required".into()))?;
        let from = kiln_query::request::parse_time("from", from, now)?;
        let until = kiln_query::request::time_or("until", self.until.as_deref(), "now", now)?;
        Ok((from.div_euclid(1_000_000), until.div_euclid(1_000_000)))
    }
}

fn spec_of(body: &[u8]) -> Result<RuleSpec, ApiError> {
    serde_json::from_slice(body)
        .map_err(|err| RulesError::BadRequest(format!("invalid recording rule: {err}")).into())
}

pub async fn list(State(state): State<SharedState>, tenant: Tenant) -> Result<Response, ApiError> {
    let rules = state.rules.list(&tenant).await?;
    Ok(Json(serde_json::json!({ "rules": rules })).into_response())
}

pub async fn create(
    State(state): State<SharedState>,
    tenant: Tenant,
    body: Bytes,
) -> Result<Response, ApiError> {
    let rule = state.rules.save(&tenant, spec_of(&body)?, true).await?;
    Ok((StatusCode::CREATED, Json(rule)).into_response())
}

pub async fn get(
    State(state): State<SharedState>,
    tenant: Tenant,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    Ok(Json(state.rules.get(&tenant, &name).await?).into_response())
}

pub async fn update(
    State(state): State<SharedState>,
    tenant: Tenant,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let spec = spec_of(&body)?;
    if spec.metric_name != name {
        return Err(RulesError::BadRequest(format!(
            "the path names rule {name:?} but the body's metric_name is {:?}",
            spec.metric_name
        ))
        .into());
    }
    Ok(Json(state.rules.save(&tenant, spec, false).await?).into_response())
}

pub async fn delete(
    State(state): State<SharedState>,
    tenant: Tenant,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    state.rules.delete(&tenant, &name).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The series a rule (the body, saved or not) would export over `from`..`until`
/// (default: the last hour).
pub async fn preview(
    State(state): State<SharedState>,
    tenant: Tenant,
    Query(range): Query<Range>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let spec = spec_of(&body)?;
    let (from, until) = range.millis(Some("now-1h"))?;
    Ok(Json(state.rules.preview(&tenant, &spec, from, until).await?).into_response())
}

/// Exports a saved rule over stored profiles (`kiln rules backfill`).
pub async fn backfill(
    State(state): State<SharedState>,
    tenant: Tenant,
    Path(name): Path<String>,
    Query(range): Query<Range>,
) -> Result<Response, ApiError> {
    let (from, until) = range.millis(None)?;
    Ok(Json(state.rules.backfill(&tenant, &name, from, until).await?).into_response())
}
