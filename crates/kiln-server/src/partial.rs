//! `POST /api/v1/partial/tree`: a share of a query that another query node split
//! (kiln-query's `fanout`), answered with its uncut tree for that node to add up.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use kiln_query::fanout::{local_tree, PartialQuery};
use kiln_query::tree::encode_partial;
use kiln_query::QueryError;

use crate::error::ApiError;
use crate::state::SharedState;
use crate::tenant::Tenant;

pub async fn tree(
    State(state): State<SharedState>,
    tenant: Tenant,
    body: Bytes,
) -> Result<Response, ApiError> {
    let part: PartialQuery = serde_json::from_slice(&body)
        .map_err(|err| QueryError::BadRequest(format!("invalid partial query: {err}")))?;
    let request = part.request(&tenant)?;
    // Run here, never split again: the node that split it chose this share for this node.
    let tree = local_tree(&state.querier, &request).await?;
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        encode_partial(&tree),
    )
        .into_response())
}
