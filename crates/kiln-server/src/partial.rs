//! `POST /api/v1/partial/tree` and `/api/v1/partial/profile`: a share of a query that
//! another query node split (kiln-query's `fanout`), answered with its uncut tree or its
//! merged pprof for that node to add up.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use kiln_query::leaf::{local_profile, local_series, local_tree};
use kiln_query::root::PartialQuery;
use kiln_query::select::SelectRequest;

use kiln_query::tree::encode_partial;
use kiln_query::QueryError;
use prost::Message;

use crate::error::ApiError;
use crate::state::SharedState;
use crate::tenant::Tenant;

pub async fn tree(
    State(state): State<SharedState>,
    tenant: Tenant,
    body: Bytes,
) -> Result<Response, ApiError> {
    // Run here, never split again: the node that split it chose this share for this node.
    let tree = local_tree(&state.querier, &request(&tenant, &body)?).await?;
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        encode_partial(&tree),
    )
        .into_response())
}

pub async fn profile(
    State(state): State<SharedState>,
    tenant: Tenant,
    body: Bytes,
) -> Result<Response, ApiError> {
    let profile = local_profile(&state.querier, &request(&tenant, &body)?).await?;
    Ok((
        [(header::CONTENT_TYPE, "application/vnd.google.protobuf")],
        profile.encode_to_bytes(),
    )
        .into_response())
}

pub async fn series(
    State(state): State<SharedState>,
    tenant: Tenant,
    body: Bytes,
) -> Result<Response, ApiError> {
    let part = parse(&body)?;
    let Some(spec) = &part.series else {
        return Err(
            QueryError::BadRequest("a series share needs its \"series\" options".into()).into(),
        );
    };
    let options = spec.options();
    let series = local_series(&state.querier, &part.request(&tenant)?, &options).await?;
    Ok((
        [(header::CONTENT_TYPE, "application/x-protobuf")],
        series.encode_to_vec(),
    )
        .into_response())
}

fn parse(body: &[u8]) -> Result<PartialQuery, ApiError> {
    Ok(serde_json::from_slice(body)
        .map_err(|err| QueryError::BadRequest(format!("invalid partial query: {err}")))?)
}

/// The share's request, for the caller's own tenant (whose datasets the share must hold).
fn request(tenant: &str, body: &[u8]) -> Result<SelectRequest, ApiError> {
    Ok(parse(body)?.request(tenant)?)
}
