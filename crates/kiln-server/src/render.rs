//! Pyroscope's render API, as its UI and older clients call it:
//! `/pyroscope/render` (flamebearer JSON with a timeline, and `groupBy` timelines),
//! `/pyroscope/render-diff`, `/pyroscope/label-names` and `/pyroscope/label-values`.
//! Queries are `TYPE{matchers}`, where TYPE is a profile type id or a legacy
//! `app.suffix` name; times are `now-1h`, RFC 3339 or epoch seconds/ms/µs/ns.

use std::collections::{BTreeMap, HashMap};

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use kiln_model::selector::Selector;
use kiln_model::time::now_nanos;
use kiln_query::api::Series;
use kiln_query::diff::flame_graph_diff;
use kiln_query::flamebearer::{
    auto_step_seconds, flamebearer, metadata_for, timeline, Flamebearer, RenderDiffResponse,
    RenderResponse, Timeline,
};
use kiln_query::labels::{self as label_queries, SeriesQuery};
use kiln_query::merge::{cut, DEFAULT_MAX_NODES};
use kiln_query::request::{legacy_series_selectors, ordered, render_query, time_or};
use kiln_query::select::{SelectRequest, TypeFilter};
use kiln_query::series::{SeriesBuilder, SeriesOptions};
use kiln_query::tree::FlameTree;
use kiln_query::QueryError;

use crate::error::ApiError;
use crate::state::SharedState;
use crate::tenant::Tenant;

type Params = HashMap<String, String>;

/// One selection of a legacy request.
struct Selection {
    type_id: String,
    selector: Selector,
    from_nanos: i64,
    to_nanos: i64,
}

/// Parameter `name`, or `{prefix}Name` for render-diff's "left"/"right" sides.
fn param<'a>(params: &'a Params, prefix: &str, name: &str) -> Option<&'a String> {
    if prefix.is_empty() {
        return params.get(name);
    }
    let mut capitalized = name.to_string();
    if let Some(first) = capitalized.get_mut(..1) {
        first.make_ascii_uppercase();
    }
    params.get(&format!("{prefix}{capitalized}"))
}

fn selection(params: &Params, prefix: &str) -> Result<Selection, QueryError> {
    let query = param(params, prefix, "query").ok_or_else(|| {
        let name = if prefix.is_empty() {
            "query".to_string()
        } else {
            format!("{prefix}Query")
        };
        QueryError::BadRequest(format!("the {name} parameter is required"))
    })?;
    let (type_id, selector) = render_query(query)?;
    let now = now_nanos();
    let time = |name: &str, default: &str| {
        time_or(
            &format!("{prefix}{name}"),
            param(params, prefix, name).map(String::as_str),
            default,
            now,
        )
    };
    let (from_nanos, to_nanos) = ordered(
        time("from", "now-1h")?,
        time("until", "now")?,
        "from",
        "until",
    )?;
    Ok(Selection {
        type_id,
        selector,
        from_nanos,
        to_nanos,
    })
}

impl Selection {
    fn request(&self, tenant: &str) -> SelectRequest {
        SelectRequest {
            tenant: tenant.to_string(),
            types: TypeFilter::Exact(self.type_id.clone()),
            selector: self.selector.clone(),
            from_nanos: self.from_nanos,
            to_nanos: self.to_nanos,
            ..Default::default()
        }
    }

    fn step_seconds(&self) -> i64 {
        auto_step_seconds(self.from_nanos, self.to_nanos)
    }
}

fn max_nodes(params: &Params) -> Result<usize, QueryError> {
    match params.get("max-nodes").or(params.get("maxNodes")) {
        Some(value) => value
            .parse::<usize>()
            .map_err(|_| QueryError::BadRequest(format!("invalid max-nodes {value:?}"))),
        None => Ok(DEFAULT_MAX_NODES),
    }
}

/// Timelines of the selection's totals, one per value of each series' `group_by` labels
/// (one with no labels when `group_by` is empty).
fn timelines(series: Vec<Series>, selection: &Selection) -> BTreeMap<String, Timeline> {
    let step = selection.step_seconds();
    series
        .into_iter()
        .map(|series| {
            let key = series
                .labels
                .iter()
                .map(|label| label.value.as_str())
                .collect::<Vec<_>>()
                .join(",");
            let points: Vec<(i64, i64)> = series
                .points
                .iter()
                .map(|point| (point.timestamp * 1_000_000, point.value as i64))
                .collect();
            (
                key,
                timeline(&points, selection.from_nanos, selection.to_nanos, step),
            )
        })
        .collect()
}

/// The selection's total over time: the one ungrouped timeline, or an empty one.
fn total_timeline(series: Vec<Series>, selection: &Selection) -> Timeline {
    timelines(series, selection)
        .into_values()
        .next()
        .unwrap_or_else(|| {
            timeline(
                &[],
                selection.from_nanos,
                selection.to_nanos,
                selection.step_seconds(),
            )
        })
}

impl Selection {
    /// Series options of this selection's timelines, grouped by `group_by`.
    fn series_options(&self, group_by: Vec<String>) -> SeriesOptions {
        SeriesOptions {
            step_ms: self.step_seconds() * 1000,
            group_by,
            ..Default::default()
        }
    }
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
    let group_by = params.get("groupBy").filter(|label| !label.is_empty());
    let (tree, timeline, groups) = fold(&state, &selection, &tenant, group_by).await?;
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

/// The selection's flame tree (uncut), its timeline and, with `group_by`, one timeline
/// per value of that label: one selection feeds them all, each dataset folded into every
/// one as it comes and then dropped.
async fn fold(
    state: &SharedState,
    selection: &Selection,
    tenant: &str,
    group_by: Option<&String>,
) -> Result<(FlameTree, Timeline, Option<BTreeMap<String, Timeline>>), QueryError> {
    let total_options = selection.series_options(Vec::new());
    let group_options = group_by.map(|label| selection.series_options(vec![label.clone()]));
    let mut tree = FlameTree::default();
    let mut total = SeriesBuilder::new(&total_options)?;
    let mut groups = group_options.as_ref().map(SeriesBuilder::new).transpose()?;
    state
        .querier
        .select_each(&selection.request(tenant), |selected| {
            tree.add_selection(&selected, &selection.type_id);
            total.add(&selected);
            if let Some(groups) = &mut groups {
                groups.add(&selected);
            }
        })
        .await?;
    tree.compute_totals();
    Ok((
        tree,
        total_timeline(total.finish(), selection),
        groups.map(|groups| timelines(groups.finish(), selection)),
    ))
}

/// `GET /pyroscope/render-diff?leftQuery=…&leftFrom=…&leftUntil=…&rightQuery=…&…`.
pub async fn render_diff(
    State(state): State<SharedState>,
    tenant: Tenant,
    Query(params): Query<Params>,
) -> Result<Json<RenderDiffResponse>, ApiError> {
    let left = selection(&params, "left")?;
    let right = selection(&params, "right")?;
    if left.type_id != right.type_id {
        return Err(QueryError::BadRequest(format!(
            "left and right query different profile types ({} and {})",
            left.type_id, right.type_id
        ))
        .into());
    }
    let (left_tree, left_timeline, _) = fold(&state, &left, &tenant, None).await?;
    let (right_tree, right_timeline, _) = fold(&state, &right, &tenant, None).await?;
    let diff = flame_graph_diff(&left_tree, &right_tree, max_nodes(&params)?);
    let mut metadata = metadata_for(&left.type_id);
    metadata.format = "double";
    Ok(Json(RenderDiffResponse {
        version: 1,
        flamebearer: Flamebearer {
            names: diff.names,
            levels: diff.levels.into_iter().map(|level| level.values).collect(),
            num_ticks: diff.total,
            max_self: diff.max_self,
        },
        metadata,
        left_ticks: diff.left_ticks,
        right_ticks: diff.right_ticks,
        left_timeline,
        right_timeline,
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
