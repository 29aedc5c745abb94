//! `querier.v1.QuerierService`, Pyroscope's query API, over Connect (`application/proto`
//! and `application/json`, unary) and gRPC (HTTP/2 cleartext) on the server's one port.
//! Each method decodes its request in the encoding it arrived in ([`Rpc`]), applies
//! kiln-query's request rules ([`kiln_query::request`]), runs the query module of the
//! same name, and answers in that same encoding.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use kiln_model::time::now_nanos;
use kiln_query::api::{self, EXEMPLAR_TYPE_INDIVIDUAL, EXEMPLAR_TYPE_SPAN, PROFILE_FORMAT_TREE};
use kiln_query::labels as label_queries;
use kiln_query::merge::{flame_graph, max_nodes, tree_bytes};
use kiln_query::request::{self, Selection};
use kiln_query::series::SeriesOptions;
use kiln_query::tree::FlameTree;
use kiln_query::QueryError;

use crate::error::ApiError;
use crate::rpc::{json_response, Encoding, Family, Rpc};
use crate::state::SharedState;
use crate::tenant::Tenant;

/// Query requests are small; this bounds what a client can make the server buffer.
const MAX_QUERY_BODY_BYTES: usize = 4 << 20;

/// `POST /querier.v1.QuerierService/{method}`.
pub async fn call(
    State(state): State<SharedState>,
    tenant: Tenant,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    // querier.v1 has always answered an unknown content type with 400 (push with 415, as
    // Connect says); kept so that this refactoring changes no answer.
    let rpc = Rpc::of(&headers, Family::Connect)
        .map_err(|err| QueryError::BadRequest(err.to_string()))?;
    let querier = &state.querier;
    let now = now_nanos();
    macro_rules! decode {
        ($request:ty) => {
            rpc.decode::<$request>(&headers, body, MAX_QUERY_BODY_BYTES)
                .await?
        };
    }
    let response = match method.as_str() {
        "ProfileTypes" => {
            let request = decode!(api::ProfileTypesRequest);
            let (from, to) = request::time_range_ms(request.start, request.end, now)?;
            let profile_types = label_queries::profile_types(querier, &tenant, from, to).await?;
            rpc.reply(&api::ProfileTypesResponse { profile_types })
        }
        "LabelNames" => {
            let request = decode!(api::LabelNamesRequest);
            let query =
                request::series_query(&tenant, &request.matchers, request.start, request.end, now)?;
            let names = label_queries::label_names(querier, &query).await?;
            rpc.reply(&api::LabelNamesResponse { names })
        }
        "LabelValues" => {
            let request = decode!(api::LabelValuesRequest);
            if request.name.is_empty() {
                return Err(QueryError::BadRequest("name is required".to_string()).into());
            }
            let query =
                request::series_query(&tenant, &request.matchers, request.start, request.end, now)?;
            let names = label_queries::label_values(querier, &query, &request.name).await?;
            rpc.reply(&api::LabelValuesResponse { names })
        }
        "Series" => {
            let request = decode!(api::SeriesRequest);
            let query =
                request::series_query(&tenant, &request.matchers, request.start, request.end, now)?;
            let labels_set = label_queries::series(querier, &query, &request.label_names).await?;
            rpc.reply(&api::SeriesResponse { labels_set })
        }
        "SelectMergeStacktraces" => {
            let request = decode!(api::SelectMergeStacktracesRequest);
            let select = Selection::of_stacktraces(&request).request(&tenant, now)?;
            let tree = state
                .root
                .merged_tree(&select, max_nodes(request.max_nodes))
                .await?;
            rpc.reply(&stacktraces_response(&tree, request.format))
        }
        "SelectMergeSpanProfile" => {
            let request = decode!(api::SelectMergeSpanProfileRequest);
            let mut select = Selection::of_span_profile(&request).request(&tenant, now)?;
            select.span_ids = Some(request.span_selector.clone());
            let tree = state
                .root
                .merged_tree(&select, max_nodes(request.max_nodes))
                .await?;
            rpc.reply(&stacktraces_response(&tree, request.format))
        }
        "SelectMergeProfile" => {
            let request = decode!(api::SelectMergeProfileRequest);
            let select = Selection::of_profile(&request).request(&tenant, now)?;
            let profile = state.root.merged_profile(&select).await?;
            match rpc.encoding {
                // pprof's JSON is written by kiln-model, not serde.
                Encoding::Json => json_response(
                    kiln_model::pprof_json::to_json(&profile)
                        .to_string()
                        .into_bytes(),
                ),
                _ => rpc.reply_encoded(prost::Message::encode_to_vec(&profile)),
            }
        }
        "SelectSeries" => {
            let request = decode!(api::SelectSeriesRequest);
            let select = Selection::of_series(&request).request(&tenant, now)?;
            let options = SeriesOptions {
                step_ms: request::step_ms(request.step)?,
                group_by: request.group_by.clone(),
                average: request.aggregation == Some(api::AGGREGATION_AVERAGE),
                limit: request
                    .limit
                    .filter(|limit| *limit > 0)
                    .map(|limit| usize::try_from(limit).unwrap_or(usize::MAX)),
                exemplars: request.exemplar_type == EXEMPLAR_TYPE_INDIVIDUAL,
                span_exemplars: request.exemplar_type == EXEMPLAR_TYPE_SPAN,
            };
            let series = state.root.select_series(&select, &options).await?;
            rpc.reply(&api::SelectSeriesResponse { series })
        }
        "Diff" => {
            let request = decode!(api::DiffRequest);
            let (Some(left), Some(right)) = (&request.left, &request.right) else {
                return Err(
                    QueryError::BadRequest("a diff needs both left and right".to_string()).into(),
                );
            };
            let left_select = Selection::of_stacktraces(left).request(&tenant, now)?;
            let right_select = Selection::of_stacktraces(right).request(&tenant, now)?;
            // Both sides merge in full; the diff is cut once, over both.
            let (left_tree, right_tree) = futures_util::future::try_join(
                state.root.merged_tree(&left_select, 0),
                state.root.merged_tree(&right_select, 0),
            )
            .await?;
            let limit = max_nodes(left.max_nodes.or(right.max_nodes));
            rpc.reply(&api::DiffResponse {
                flamegraph: Some(kiln_query::diff::flame_graph_diff(
                    &left_tree,
                    &right_tree,
                    limit,
                )),
            })
        }
        "GetProfileStats" => {
            let _request = decode!(api::GetProfileStatsRequest);
            rpc.reply(&label_queries::profile_stats(querier, &tenant).await?)
        }
        other => {
            return Err(QueryError::NotFound(format!(
                "querier.v1.QuerierService has no method {other:?}"
            ))
            .into())
        }
    };
    Ok(response)
}

fn stacktraces_response(tree: &FlameTree, format: i32) -> api::SelectMergeStacktracesResponse {
    if format == PROFILE_FORMAT_TREE {
        return api::SelectMergeStacktracesResponse {
            flamegraph: None,
            tree: tree_bytes(tree),
        };
    }
    api::SelectMergeStacktracesResponse {
        flamegraph: Some(flame_graph(tree)),
        tree: Vec::new(),
    }
}
