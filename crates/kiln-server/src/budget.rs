//! The time budget and per-tenant turns of every read, as one layer: kiln-query decides
//! (`Querier::run`); this only finds the reads and the tenant.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use kiln_auth::Scope;

use crate::auth::{access, Access};
use crate::error::ApiError;
use crate::state::SharedState;
use crate::tenant::tenant_of;

pub(crate) async fn limit_reads(
    State(state): State<SharedState>,
    request: Request,
    next: Next,
) -> Response {
    if access(request.method(), request.uri().path()) != Access::Needs(Scope::Read) {
        return next.run(request).await;
    }
    // An unusable tenant header is the handler's to refuse, with its own message.
    let Ok(tenant) = tenant_of(request.headers()) else {
        return next.run(request).await;
    };
    match state.querier.run(&tenant, next.run(request)).await {
        Ok(response) => response,
        Err(err) => ApiError::Query(err).into_response(),
    }
}
