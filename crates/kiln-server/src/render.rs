//! Pyroscope's render API, as its UI and older clients call it:
//! `/pyroscope/render` (flamebearer JSON with a timeline, and `groupBy` timelines),
//! `/pyroscope/render-diff`, `/pyroscope/label-names` and `/pyroscope/label-values`.
//! Queries are `TYPE{matchers}`, where TYPE is a profile type id or a legacy
//! `app.suffix` name; times are `now-1h`, RFC 3339 or epoch seconds/ms/µs/ns.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use kiln_model::time::now_nanos;
use kiln_query::diff::flame_graph_diff;
use kiln_query::flamebearer::{
    flamebearer, metadata_for, Flamebearer, RenderDiffResponse, RenderResponse,
};
use kiln_query::labels::{self as label_queries, SeriesQuery};
use kiln_query::merge::cut;
use kiln_query::render::{fold, RenderParams, RenderSelection, Rendered};
use kiln_query::request::{legacy_series_selectors, time_or};
use kiln_query::QueryError;

use crate::error::ApiError;
use crate::state::SharedState;
use crate::tenant::Tenant;

type Params = HashMap<String, String>;

/// Parameter `name`, or `{prefix}Name` for render-diff's "left"/"right" sides.
fn param<'a>(params: &'a Params, prefix: &str, name: &str) -> Option<&'a str> {
    if prefix.is_empty() {
        return params.get(name).map(String::as_str);
    }
    let mut capitalized = name.to_string();
    if let Some(first) = capitalized.get_mut(..1) {
        first.make_ascii_uppercase();
    }
    params
        .get(&format!("{prefix}{capitalized}"))
        .map(String::as_str)
}

/// The selection of one side (`prefix` "left" or "right") or of the whole request ("").
fn selection(params: &Params, prefix: &str) -> Result<RenderSelection, QueryError> {
    let query_name = match prefix {
        "" => "query".to_string(),
        _ => format!("{prefix}Query"),
    };
    let (from_name, until_name) = (format!("{prefix}from"), format!("{prefix}until"));
    RenderSelection::parse(
        &RenderParams {
            query: param(params, prefix, "query"),
            query_name: &query_name,
            from: param(params, prefix, "from"),
            from_name: &from_name,
            until: param(params, prefix, "until"),
            until_name: &until_name,
        },
        now_nanos(),
    )
}

fn max_nodes(params: &Params) -> Result<usize, QueryError> {
    kiln_query::render::max_nodes(
        params
            .get("max-nodes")
            .or(params.get("maxNodes"))
            .map(String::as_str),
    )
}

/// `GET /pyroscope/render?query=…&from=…&until=…&max-nodes=…&groupBy=…`; with
/// `format=pprof`, the selection merged into one pprof (gzip), as Pyroscope's render offers,
/// for `go tool pprof` and the UI's download.
pub async fn render(
    State(state): State<SharedState>,
    tenant: Tenant,
    Query(params): Query<Params>,
) -> Result<Response, ApiError> {
    let selection = selection(&params, "")?;
    if params.get("format").map(String::as_str) == Some("pprof") {
        let selections = state.querier.select(&selection.request(&tenant)).await?;
        let types = kiln_query::profiles::ordered_types(&selections);
        let profile = kiln_query::pprof_export::merged_pprof(&selections, &types);
        return Ok((
            [
                ("content-type", "application/octet-stream"),
                (
                    "content-disposition",
                    "attachment; filename=\"profile.pb.gz\"",
                ),
            ],
            kiln_model::compress::gzip(&profile.encode_to_bytes()),
        )
            .into_response());
    }
    let max_nodes = max_nodes(&params)?;
    let group_by = params
        .get("groupBy")
        .map(String::as_str)
        .filter(|label| !label.is_empty());
    let Rendered {
        tree,
        timeline,
        groups,
    } = fold(&state.querier, &selection, &tenant, group_by).await?;
    let tree = cut(tree, max_nodes);
    Ok(Json(RenderResponse {
        version: 1,
        flamebearer: flamebearer(&tree),
        metadata: metadata_for(&selection.type_id),
        timeline,
        groups,
    })
    .into_response())
}

/// `GET /pyroscope/render-diff?leftQuery=…&leftFrom=…&leftUntil=…&rightQuery=…&…`.
pub async fn render_diff(
    State(state): State<SharedState>,
    tenant: Tenant,
    Query(params): Query<Params>,
) -> Result<Json<RenderDiffResponse>, ApiError> {
    let left_selection = selection(&params, "left")?;
    let right_selection = selection(&params, "right")?;
    if left_selection.type_id != right_selection.type_id {
        return Err(QueryError::BadRequest(format!(
            "left and right query different profile types ({} and {})",
            left_selection.type_id, right_selection.type_id
        ))
        .into());
    }
    let left = fold(&state.querier, &left_selection, &tenant, None).await?;
    let right = fold(&state.querier, &right_selection, &tenant, None).await?;
    let diff = flame_graph_diff(&left.tree, &right.tree, max_nodes(&params)?);
    let mut metadata = metadata_for(&left_selection.type_id);
    metadata.format = "double";
    Ok(Json(RenderDiffResponse {
        version: 1,
        flamebearer: Flamebearer {
            names: diff.names,
            levels: diff.levels.into_iter().map(|level| level.values).collect(),
            num_ticks: diff.total,
            max_self: diff.max_self,
            unnamed_binaries: Vec::new(),
        },
        metadata,
        left_ticks: diff.left_ticks,
        right_ticks: diff.right_ticks,
        left_timeline: left.timeline,
        right_timeline: right.timeline,
    }))
}

/// The series query of `query` (optional; a bare `{…}` or `TYPE{…}`) over `from`/`until`.
fn series_query(params: &Params, tenant: &str) -> Result<SeriesQuery, QueryError> {
    let now = now_nanos();
    let time = |name: &str, default: &str| {
        time_or(name, params.get(name).map(String::as_str), default, now)
    };
    Ok(SeriesQuery {
        tenant: tenant.to_string(),
        selectors: legacy_series_selectors(params.get("query").map(String::as_str))?,
        from_nanos: time("from", "now-24h")?,
        to_nanos: time("until", "now")?,
    })
}

/// `GET /pyroscope/label-names?query=…&from=…&until=…`: a JSON array of names.
pub async fn label_names(
    State(state): State<SharedState>,
    tenant: Tenant,
    Query(params): Query<Params>,
) -> Result<Json<Vec<String>>, ApiError> {
    let query = series_query(&params, &tenant)?;
    Ok(Json(
        label_queries::label_names(&state.querier, &query).await?,
    ))
}

/// `GET /pyroscope/label-values?label=…&query=…&from=…&until=…`: a JSON array of values.
pub async fn label_values(
    State(state): State<SharedState>,
    tenant: Tenant,
    Query(params): Query<Params>,
) -> Result<Json<Vec<String>>, ApiError> {
    let label = params
        .get("label")
        .or(params.get("name"))
        .ok_or_else(|| QueryError::BadRequest("the label parameter is required".into()))?;
    let query = series_query(&params, &tenant)?;
    Ok(Json(
        label_queries::label_values(&state.querier, &query, label).await?,
    ))
}
