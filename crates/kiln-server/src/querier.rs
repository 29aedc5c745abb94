//! `querier.v1.QuerierService`, Pyroscope's query API, over Connect (`application/proto`
//! and `application/json`, unary) and gRPC (HTTP/2 cleartext) on the server's one port.
//! Each method decodes its request in the encoding it arrived in, runs the query module of
//! the same name in kiln-query, and answers in that same encoding.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use kiln_model::selector::{self, Selector};
use kiln_query::api::{self, EXEMPLAR_TYPE_INDIVIDUAL, EXEMPLAR_TYPE_SPAN, PROFILE_FORMAT_TREE};
use kiln_query::labels::{self as label_queries, SeriesQuery};
use kiln_query::merge::{self, flame_graph, max_nodes, tree_bytes};
use kiln_query::select::{SelectRequest, TypeFilter};
use kiln_query::series::{select_series, SeriesOptions};
use kiln_query::QueryError;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::body::{content_type, decode_content_encoding, read_limited};
use crate::grpc;
use crate::routes::{connect_error, AppState};
use crate::tenant::tenant_of;

/// Query requests are small; this bounds what a client can make the server buffer.
const MAX_QUERY_BODY_BYTES: usize = 4 << 20;

#[derive(Clone, Copy, PartialEq)]
enum Encoding {
    Proto,
    Json,
    Grpc,
}

impl Encoding {
    fn of(headers: &HeaderMap) -> Result<Encoding, QueryError> {
        let content_type = content_type(headers);
        if grpc::is_grpc(&content_type) {
            return Ok(Encoding::Grpc);
        }
        if content_type.starts_with("application/json") {
            return Ok(Encoding::Json);
        }
        if content_type.starts_with("application/proto")
            || content_type.starts_with("application/protobuf")
        {
            return Ok(Encoding::Proto);
        }
        Err(QueryError::BadRequest(format!(
            "unsupported content type {content_type:?}; use application/proto, application/json or gRPC"
        )))
    }
}

async fn decode_request<T: prost::Message + Default + DeserializeOwned>(
    headers: &HeaderMap,
    body: Body,
    encoding: Encoding,
) -> Result<T, QueryError> {
    let raw = read_limited(body, MAX_QUERY_BODY_BYTES)
        .await
        .map_err(|err| QueryError::BadRequest(err.to_string()))?;
    let message = match encoding {
        Encoding::Grpc => {
            grpc::unframe(headers, &raw, MAX_QUERY_BODY_BYTES).map_err(QueryError::BadRequest)?
        }
        _ => decode_content_encoding(headers, raw, MAX_QUERY_BODY_BYTES)
            .map_err(|err| QueryError::BadRequest(err.to_string()))?,
    };
    match encoding {
        Encoding::Json if message.iter().all(u8::is_ascii_whitespace) => Ok(T::default()),
        Encoding::Json => serde_json::from_slice(&message)
            .map_err(|err| QueryError::BadRequest(format!("invalid JSON request: {err}"))),
        _ => T::decode(message.as_ref())
            .map_err(|err| QueryError::BadRequest(format!("invalid protobuf request: {err}"))),
    }
}

fn encode_response<T: prost::Message + Serialize>(
    encoding: Encoding,
    result: Result<T, QueryError>,
) -> Response {
    let message = match result {
        Ok(message) => message,
        Err(err) => return error_response(encoding, &err),
    };
    match encoding {
        Encoding::Json => match serde_json::to_vec(&message) {
            Ok(bytes) => (
                StatusCode::OK,
                [("content-type", "application/json")],
                bytes,
            )
                .into_response(),
            Err(err) => error_response(encoding, &QueryError::Task(err.to_string())),
        },
        _ => binary_response(encoding, message.encode_to_vec()),
    }
}

/// An encoded protobuf message as a gRPC or Connect (`application/proto`) answer.
fn binary_response(encoding: Encoding, message: Vec<u8>) -> Response {
    if encoding == Encoding::Grpc {
        return grpc::ok_response(message);
    }
    (
        StatusCode::OK,
        [("content-type", "application/proto")],
        message,
    )
        .into_response()
}

fn error_response(encoding: Encoding, err: &QueryError) -> Response {
    if err.status() >= 500 {
        tracing::error!(error = %err, "query failed");
    }
    match encoding {
        Encoding::Grpc => {
            grpc::error_response(grpc::code_for_status(err.status()), &err.to_string())
        }
        _ => connect_error(err.status(), &err.to_string()),
    }
}

fn millis_to_nanos(millis: i64) -> i64 {
    millis.saturating_mul(1_000_000)
}

/// `[start, end]` in nanoseconds from the API's milliseconds. A start of 0 is the epoch,
/// as everywhere else in Kiln (`/pyroscope/render?from=0`, `kiln query --from 0`); an end
/// of 0 is an absent end (proto3 cannot tell them apart), and means now.
fn time_range(start_ms: i64, end_ms: i64) -> Result<(i64, i64), QueryError> {
    let to_nanos = if end_ms == 0 {
        kiln_ingest::parse::now_nanos()
    } else {
        millis_to_nanos(end_ms)
    };
    let from_nanos = millis_to_nanos(start_ms);
    if to_nanos < from_nanos {
        return Err(QueryError::BadRequest(format!(
            "end ({end_ms}) is before start ({start_ms})"
        )));
    }
    Ok((from_nanos, to_nanos))
}

/// A label selector such as `{service_name="api"}`; empty selects everything.
fn parse_label_selector(text: &str) -> Result<Selector, QueryError> {
    if text.trim().is_empty() {
        return Ok(Selector::default());
    }
    let parsed = selector::parse(text)
        .map_err(|err| QueryError::BadRequest(format!("invalid label selector: {err}")))?;
    if let Some(name) = &parsed.name {
        return Err(QueryError::BadRequest(format!(
            "invalid label selector: unexpected name {name:?} before the braces; the profile type goes in profile_typeID"
        )));
    }
    Ok(parsed)
}

fn type_filter(profile_type_id: &str) -> Result<TypeFilter, QueryError> {
    if profile_type_id.split(':').count() != 5 {
        return Err(QueryError::BadRequest(format!(
            "invalid profile_typeID {profile_type_id:?}: expected name:sample_type:sample_unit:period_type:period_unit"
        )));
    }
    Ok(TypeFilter::Exact(profile_type_id.to_string()))
}

struct Selection<'a> {
    profile_type_id: &'a str,
    label_selector: &'a str,
    start: i64,
    end: i64,
    call_site: Option<&'a api::StackTraceSelector>,
    profile_ids: &'a [String],
}

impl<'a> Selection<'a> {
    fn new(profile_type_id: &'a str, label_selector: &'a str, start: i64, end: i64) -> Self {
        Selection {
            profile_type_id,
            label_selector,
            start,
            end,
            call_site: None,
            profile_ids: &[],
        }
    }
}

fn select_request(tenant: &str, selection: Selection<'_>) -> Result<SelectRequest, QueryError> {
    let (from_nanos, to_nanos) = time_range(selection.start, selection.end)?;
    Ok(SelectRequest {
        tenant: tenant.to_string(),
        types: type_filter(selection.profile_type_id)?,
        selector: parse_label_selector(selection.label_selector)?,
        from_nanos,
        to_nanos,
        profile_ids: (!selection.profile_ids.is_empty()).then(|| {
            selection
                .profile_ids
                .iter()
                .map(|id| id.as_bytes().to_vec())
                .collect()
        }),
        call_site: selection
            .call_site
            .map(|selector| {
                selector
                    .call_site
                    .iter()
                    .map(|location| location.name.clone())
                    .collect()
            })
            .unwrap_or_default(),
        span_ids: None,
    })
}

fn stacktraces_selection(request: &api::SelectMergeStacktracesRequest) -> Selection<'_> {
    Selection {
        call_site: request.stack_trace_selector.as_ref(),
        profile_ids: &request.profile_id_selector,
        ..Selection::new(
            &request.profile_type_id,
            &request.label_selector,
            request.start,
            request.end,
        )
    }
}

/// `POST /querier.v1.QuerierService/{method}`.
pub async fn querier_service(
    State(state): State<Arc<AppState>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let encoding = match Encoding::of(&headers) {
        Ok(encoding) => encoding,
        Err(err) => return error_response(Encoding::Proto, &err),
    };
    let tenant = match tenant_of(&headers) {
        Ok(tenant) => tenant,
        Err(message) => return error_response(encoding, &QueryError::BadRequest(message)),
    };
    let querier = &state.querier;
    macro_rules! call {
        ($request:ty, |$message:ident| $body:expr) => {{
            let result = async {
                let $message: $request = decode_request(&headers, body, encoding).await?;
                $body
            }
            .await;
            encode_response(encoding, result)
        }};
    }
    match method.as_str() {
        "ProfileTypes" => call!(api::ProfileTypesRequest, |request| {
            let (from_nanos, to_nanos) = time_range(request.start, request.end)?;
            let profile_types =
                label_queries::profile_types(querier, &tenant, from_nanos, to_nanos).await?;
            Ok(api::ProfileTypesResponse { profile_types })
        }),
        "LabelNames" => call!(api::LabelNamesRequest, |request| {
            let query = series_query(&tenant, &request.matchers, request.start, request.end)?;
            let names = label_queries::label_names(querier, &query).await?;
            Ok(api::LabelNamesResponse { names })
        }),
        "LabelValues" => call!(api::LabelValuesRequest, |request| {
            if request.name.is_empty() {
                return Err(QueryError::BadRequest("name is required".to_string()));
            }
            let query = series_query(&tenant, &request.matchers, request.start, request.end)?;
            let names = label_queries::label_values(querier, &query, &request.name).await?;
            Ok(api::LabelValuesResponse { names })
        }),
        "Series" => call!(api::SeriesRequest, |request| {
            let query = series_query(&tenant, &request.matchers, request.start, request.end)?;
            let labels_set = label_queries::series(querier, &query, &request.label_names).await?;
            Ok(api::SeriesResponse { labels_set })
        }),
        "SelectMergeStacktraces" => call!(api::SelectMergeStacktracesRequest, |request| {
            let select = select_request(&tenant, stacktraces_selection(&request))?;
            let tree = merge::merged_tree(querier, &select, max_nodes(request.max_nodes)).await?;
            Ok(stacktraces_response(&tree, request.format))
        }),
        "SelectMergeSpanProfile" => call!(api::SelectMergeSpanProfileRequest, |request| {
            let mut select = select_request(
                &tenant,
                Selection::new(
                    &request.profile_type_id,
                    &request.label_selector,
                    request.start,
                    request.end,
                ),
            )?;
            select.span_ids = Some(request.span_selector.clone());
            let tree = merge::merged_tree(querier, &select, max_nodes(request.max_nodes)).await?;
            Ok(stacktraces_response(&tree, request.format))
        }),
        "SelectMergeProfile" => {
            let result = async {
                let request: api::SelectMergeProfileRequest =
                    decode_request(&headers, body, encoding).await?;
                let select = select_request(
                    &tenant,
                    Selection {
                        call_site: request.stack_trace_selector.as_ref(),
                        profile_ids: &request.profile_id_selector,
                        ..Selection::new(
                            &request.profile_type_id,
                            &request.label_selector,
                            request.start,
                            request.end,
                        )
                    },
                )?;
                merge::merged_profile(querier, &select).await
            }
            .await;
            match result {
                Ok(profile) if encoding == Encoding::Json => (
                    StatusCode::OK,
                    [("content-type", "application/json")],
                    kiln_model::pprof_json::to_json(&profile).to_string(),
                )
                    .into_response(),
                Ok(profile) => binary_response(encoding, prost::Message::encode_to_vec(&profile)),
                Err(err) => error_response(encoding, &err),
            }
        }
        "SelectSeries" => call!(api::SelectSeriesRequest, |request| {
            let select = select_request(
                &tenant,
                Selection {
                    call_site: request.stack_trace_selector.as_ref(),
                    ..Selection::new(
                        &request.profile_type_id,
                        &request.label_selector,
                        request.start,
                        request.end,
                    )
                },
            )?;
            if !(request.step.is_finite() && request.step > 0.0) {
                return Err(QueryError::BadRequest(format!(
                    "step must be a positive number of seconds, got {}",
                    request.step
                )));
            }
            let options = SeriesOptions {
                step_ms: ((request.step * 1000.0).round() as i64).max(1),
                group_by: request.group_by.clone(),
                average: request.aggregation == Some(api::AGGREGATION_AVERAGE),
                limit: request
                    .limit
                    .filter(|limit| *limit > 0)
                    .map(|limit| usize::try_from(limit).unwrap_or(usize::MAX)),
                exemplars: request.exemplar_type == EXEMPLAR_TYPE_INDIVIDUAL,
                span_exemplars: request.exemplar_type == EXEMPLAR_TYPE_SPAN,
            };
            let series = select_series(querier, &select, &options).await?;
            Ok(api::SelectSeriesResponse { series })
        }),
        "Diff" => call!(api::DiffRequest, |request| {
            let (Some(left), Some(right)) = (&request.left, &request.right) else {
                return Err(QueryError::BadRequest(
                    "a diff needs both left and right".to_string(),
                ));
            };
            let left_select = select_request(&tenant, stacktraces_selection(left))?;
            let right_select = select_request(&tenant, stacktraces_selection(right))?;
            // Both sides merge in full; the diff is cut once, over both.
            let (left_tree, right_tree) = futures_util::future::try_join(
                merge::merged_tree(querier, &left_select, 0),
                merge::merged_tree(querier, &right_select, 0),
            )
            .await?;
            let limit = max_nodes(left.max_nodes.or(right.max_nodes));
            Ok(api::DiffResponse {
                flamegraph: Some(kiln_query::diff::flame_graph_diff(
                    &left_tree,
                    &right_tree,
                    limit,
                )),
            })
        }),
        "GetProfileStats" => call!(api::GetProfileStatsRequest, |_request| {
            label_queries::profile_stats(querier, &tenant).await
        }),
        other => error_response(
            encoding,
            &QueryError::NotFound(format!("querier.v1.QuerierService has no method {other:?}")),
        ),
    }
}

fn series_query(
    tenant: &str,
    matchers: &[String],
    start: i64,
    end: i64,
) -> Result<SeriesQuery, QueryError> {
    let (from_nanos, to_nanos) = time_range(start, end)?;
    Ok(SeriesQuery {
        tenant: tenant.to_string(),
        selectors: label_queries::parse_matchers(matchers)?,
        from_nanos,
        to_nanos,
    })
}

fn stacktraces_response(
    tree: &kiln_query::tree::FlameTree,
    format: i32,
) -> api::SelectMergeStacktracesResponse {
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
