//! profefe's API: `POST /api/0/profiles` to write one pprof; `GET /api/0/profiles` to
//! list, `/api/0/profiles/{id}` (ids joined by `+` are merged) and
//! `/api/0/profiles/merge` to read; `/api/0/services` and `/api/0/version`. Answers are
//! `{"code": 200, "body": …}`; errors `{"code": status, "error": message}`
//! ([`crate::rpc::Wire::Profefe`]).

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use kiln_ingest::profefe::{
    parse_labels, parse_profefe, profile_name_for_type, type_for_profile_name,
};
use kiln_model::labels::SERVICE_NAME;
use kiln_model::selector::{Matcher, Selector};
use kiln_model::time::{format_rfc3339, now_nanos};
use kiln_query::pprof_export::merged_pprof;
use kiln_query::profiles::{list_profiles, ordered_types, select_by_ids};
use kiln_query::request::{ordered, parse_time};
use kiln_query::select::{SelectRequest, TypeFilter};
use kiln_query::QueryError;
use serde_json::json;

use crate::endpoints::PROFEFE;
use crate::error::ApiError;
use crate::ingest::{parse_and_write, receive, with_warnings};
use crate::placement;
use crate::state::SharedState;
use crate::tenant::Tenant;

type Params = HashMap<String, String>;

fn ok(body: serde_json::Value) -> Response {
    Json(json!({"code": 200, "body": body})).into_response()
}

pub async fn ingest(
    State(state): State<SharedState>,
    tenant: Tenant,
    Query(params): Query<Params>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let received = receive(&state, &tenant, &headers, body).await?;
    let service = params
        .get("service")
        .map(|s| s.trim())
        .filter(|s| !s.is_empty());
    let write = placement::Write::as_received(&uri, &headers, received.raw.clone());
    if let Some(answer) = placement::offer(&state, &tenant, service, &headers, write).await? {
        return Ok(placement::relay(answer));
    }
    let body = received.open(&headers, None)?;
    let (message, limits) = (body.message, body.limits);
    let parse = move || {
        let profile = parse_profefe(&params, &message, &limits)?;
        let profefe_type = profile
            .types
            .first()
            .map(|plan| type_for_profile_name(&plan.profile_type.name))
            .unwrap_or("other");
        Ok((vec![profile], profefe_type))
    };
    let (profefe_type, written) =
        parse_and_write(&state, PROFEFE, &tenant, &headers, parse, body.arrival).await?;
    // The stored copy's id, also when this was a retry of it.
    let id = written.ids.first().cloned().unwrap_or_default();
    Ok(with_warnings(
        ok(json!({"id": id, "type": profefe_type})),
        &written.warnings,
    ))
}

/// The selection a profefe read describes: service, type, labels, from/to (both optional:
/// all time).
fn selection(params: &Params, tenant: &str) -> Result<SelectRequest, QueryError> {
    let service = params
        .get("service")
        .filter(|s| !s.is_empty())
        .ok_or_else(|| QueryError::BadRequest("the service parameter is required".into()))?;
    let profefe_type = params
        .get("type")
        .ok_or_else(|| QueryError::BadRequest("the type parameter is required".into()))?;
    let name = profile_name_for_type(profefe_type)
        .map_err(|err| QueryError::BadRequest(err.to_string()))?;
    let mut matchers = vec![Matcher::equal(SERVICE_NAME, service)];
    let labels = parse_labels(params.get("labels").map_or("", String::as_str))
        .map_err(|err| QueryError::BadRequest(err.to_string()))?;
    for label in labels.labels.iter() {
        matchers.push(Matcher::equal(&label.name, &label.value));
    }
    let now = now_nanos();
    let time = |name: &str, absent: i64| {
        params
            .get(name)
            .map_or(Ok(absent), |value| parse_time(name, value, now))
    };
    let (from_nanos, to_nanos) =
        ordered(time("from", i64::MIN)?, time("to", i64::MAX)?, "from", "to")?;
    Ok(SelectRequest {
        tenant: tenant.to_string(),
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

pub async fn list(
    State(state): State<SharedState>,
    tenant: Tenant,
    Query(params): Query<Params>,
) -> Result<Response, ApiError> {
    let request = selection(&params, &tenant)?;
    let limit = match params.get("limit") {
        Some(limit) => limit
            .parse::<usize>()
            .map_err(|_| QueryError::BadRequest(format!("invalid limit {limit:?}")))?,
        None => 100,
    };
    let profiles = list_profiles(&state.querier, &request, limit).await?;
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
                "type": type_for_profile_name(&profile.profile_name),
                "labels": labels,
                "created_at": format_rfc3339(profile.time_nanos),
            })
        })
        .collect();
    Ok(ok(body.into()))
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

/// `GET /api/0/profiles/{id}`: one profile, or several (`id+id`) merged.
pub async fn get(
    State(state): State<SharedState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let ids: Vec<String> = id
        .split('+')
        .filter(|id| !id.is_empty())
        .map(str::to_string)
        .collect();
    if ids.is_empty() {
        return Err(QueryError::BadRequest("no profile id given".into()).into());
    }
    let (selections, types) = select_by_ids(&state.querier, &tenant, &ids).await?;
    // Merging profiles of different kinds would mix units: refuse like profefe does.
    let names: std::collections::BTreeSet<&str> =
        types.iter().filter_map(|t| t.split(':').next()).collect();
    if names.len() > 1 {
        return Err(QueryError::BadRequest(format!(
            "profiles are of different types ({}); merge profiles of one type",
            names.into_iter().collect::<Vec<_>>().join(", ")
        ))
        .into());
    }
    Ok(pprof_response(&merged_pprof(&selections, &types)))
}

pub async fn merge(
    State(state): State<SharedState>,
    tenant: Tenant,
    Query(params): Query<Params>,
) -> Result<Response, ApiError> {
    let request = selection(&params, &tenant)?;
    let selections = state.querier.select(&request).await?;
    if selections.is_empty() {
        return Err(QueryError::NotFound("no profiles found for this selection".into()).into());
    }
    let types = ordered_types(&selections);
    Ok(pprof_response(&merged_pprof(&selections, &types)))
}

pub async fn services(
    State(state): State<SharedState>,
    tenant: Tenant,
) -> Result<Response, ApiError> {
    state
        .querier
        .fresh(&kiln_metastore::DatasetQuery {
            tenant: tenant.to_string(),
            service: None,
            from_nanos: i64::MIN,
            to_nanos: i64::MAX,
        })
        .await;
    let services = state
        .querier
        .metastore()
        .services(&tenant, i64::MIN, i64::MAX)
        .await
        .map_err(QueryError::from)?;
    Ok(ok(json!(services)))
}

pub async fn version() -> Response {
    ok(json!({"version": env!("CARGO_PKG_VERSION"), "commit": "", "build_time": ""}))
}
