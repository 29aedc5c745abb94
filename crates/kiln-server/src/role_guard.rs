//! The layer that refuses what this node's roles do not serve (docs/ARCHITECTURE.md):
//! beside the auth layer, it only classifies the request; [`kiln_cluster::membership`] says who
//! runs what.

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use kiln_auth::Scope;

use crate::auth::{access, is_ui_page, Access};
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
    // The auth table already says what a request is: a write, a read, the UI, or neither.
    let needed = match access(request.method(), path) {
        Access::Needs(Scope::Write) => Some(("ingest", "writes")),
        Access::Needs(Scope::Read) if !matches!(path, "/api/v1/nodes" | "/api/v1/targets") => {
            Some(("query", "queries and the UI"))
        }
        Access::Open if is_ui_page(path) => Some(("query", "queries and the UI")),
        _ => None,
    };
    let Some((role, what)) = needed else {
        return next.run(request).await;
    };
    if state.roles.has(role) {
        return next.run(request).await;
    }
    let others = state.membership.live_addresses(role).await;
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
