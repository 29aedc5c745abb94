//! The layer that refuses what this node's roles do not serve (docs/ARCHITECTURE.md):
//! beside the auth layer, it only classifies the request; [`crate::membership`] says who
//! runs what.

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use kiln_metastore::NodeState;

use crate::auth::{access, Access};
use crate::endpoints::endpoint_of;
use crate::state::SharedState;

/// Refuses what this node's roles do not serve, with a 503 naming the live nodes that
/// do: writes need `ingest`, queries and the UI need `query`. Operations (`/ready`,
/// `/metrics`, `/api/v1/nodes`, `/api/v1/targets`) and administration are served by
/// every node.
pub(crate) async fn route_by_role(
    State(state): State<SharedState>,
    request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    let method = request.method();
    let needed = if endpoint_of(method, path).is_some() {
        Some(("ingest", "writes"))
    } else if (access(method, path) == Access::Needs(kiln_auth::Scope::Read)
        && !matches!(path, "/api/v1/nodes" | "/api/v1/targets"))
        || matches!(path, "/" | "/rules" | "/regressions")
        || path.starts_with("/ui/")
    {
        Some(("query", "queries and the UI"))
    } else {
        None
    };
    let Some((role, what)) = needed else {
        return next.run(request).await;
    };
    if state.roles.has(role) {
        return next.run(request).await;
    }
    let others: Vec<String> = match state.membership.nodes().await {
        Ok(nodes) => nodes
            .into_iter()
            .filter(|(node, node_state)| *node_state == NodeState::Live && node.has_role(role))
            .map(|(node, _)| node.address)
            .collect(),
        Err(_) => Vec::new(),
    };
    let hint = if others.is_empty() {
        "no live node has it now (GET /api/v1/nodes)".to_string()
    } else {
        format!("live {role} nodes: {}", others.join(", "))
    };
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, "1")],
        format!(
            "this node runs {}, not {role}: {what} go to a node with the {role} role; {hint}\n",
            state.roles
        ),
    )
        .into_response()
}
