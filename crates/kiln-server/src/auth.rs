//! Authentication at the edge: which scope each endpoint needs ([`access`]), and the
//! middleware that asks `kiln-auth` and puts the granted tenant on the request as
//! `X-Scope-OrgID`, so handlers read the tenant the same way with auth on or off.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use kiln_auth::Scope;

use crate::endpoints::endpoint_of;
use crate::error::ApiError;
use crate::state::SharedState;
use crate::tenant::TENANT_HEADER;

/// The address a connection came from, put on each of its requests by the listener.
#[derive(Debug, Clone, Copy)]
pub struct ClientAddr(pub SocketAddr);

/// What an endpoint needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Health and the UI's static files: they hold no tenant's data.
    Open,
    /// `/metrics`: the scope `auth.metrics_scope` names (admin by default), or open when
    /// it is `none`.
    Metrics,
    /// Node-to-node calls (a query's shares): the node credential, never a tenant token.
    Node,
    Needs(Scope),
}

/// The web UI's pages and files (served to anyone; their API calls carry the token).
pub fn is_ui_page(path: &str) -> bool {
    matches!(path, "/" | "/rules" | "/regressions") || path.starts_with("/ui/")
}

/// The one table of what each endpoint needs. Anything not named is `read` if it only
/// reads (GET, HEAD) and `admin` otherwise, so an endpoint added later and forgotten here
/// is closed rather than open.
pub fn access(method: &Method, path: &str) -> Access {
    if endpoint_of(method, path).is_some() {
        return Access::Needs(Scope::Write);
    }
    let reads = method == Method::GET || method == Method::HEAD;
    if method == Method::PUT && path.starts_with(crate::debuginfo::PREFIX) {
        // Uploading debug files is writing the tenant's data.
        return Access::Needs(Scope::Write);
    }
    match path {
        "/ready" | "/api/openapi.json" => Access::Open,
        "/metrics" => Access::Metrics,
        path if reads && is_ui_page(path) => Access::Open,
        // Read-only calls sent as POST: Connect/gRPC queries, comparisons, rule previews.
        path if path.starts_with("/querier.v1.QuerierService/") => Access::Needs(Scope::Read),
        kiln_cluster::fanout::PARTIAL_TREE_PATH
        | kiln_cluster::fanout::PARTIAL_PROFILE_PATH
        | kiln_cluster::fanout::PARTIAL_SERIES_PATH => Access::Node,
        "/api/v1/compare"
        | "/api/v1/recording-rules/preview"
        | "/api/v1/heatmap"
        | "/api/v1/heatmap/flamegraph"
        | "/api/v1/lines"
        // MCP tools only read; each call they make is checked again as it is.
        | "/mcp" => Access::Needs(Scope::Read),
        _ if reads => Access::Needs(Scope::Read),
        _ => Access::Needs(Scope::Admin),
    }
}

/// Lets a request through only with credentials that allow it, when auth is enabled.
/// Node-only endpoints need the node credential whenever one is configured, and are shut
/// with auth on and none configured.
pub(crate) async fn authenticate(
    State(state): State<SharedState>,
    mut request: Request,
    next: Next,
) -> Response {
    let needs = access(request.method(), request.uri().path());
    if needs == Access::Node {
        let presented = request.headers().get(header::AUTHORIZATION);
        let allowed = match &state.node_credential {
            Some(node) => node.verify(presented.map(HeaderValue::as_bytes)),
            None => state.auth.is_none(),
        };
        if allowed {
            return next.run(request).await;
        }
        tracing::debug!(path = request.uri().path(), "node-only endpoint refused");
        return ApiError::Auth(kiln_auth::AuthError::NodeOnly).into_response();
    }
    let Some(auth) = &state.auth else {
        return next.run(request).await;
    };
    let scope = match needs {
        Access::Open | Access::Node => return next.run(request).await,
        Access::Metrics => match auth.metrics_scope() {
            None => return next.run(request).await,
            Some(scope) => scope,
        },
        Access::Needs(scope) => scope,
    };
    let client = request
        .extensions()
        .get::<ClientAddr>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |addr| addr.0.ip());
    let headers = request.headers();
    let tenant = headers
        .get(TENANT_HEADER)
        .and_then(|value| value.to_str().ok())
        .map(str::trim)
        .filter(|value| !value.is_empty());
    let authorization = headers
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    match auth.check(authorization, tenant, scope, client) {
        Ok(grant) => {
            match HeaderValue::from_str(&grant.tenant) {
                Ok(value) => {
                    request.headers_mut().insert(TENANT_HEADER, value);
                }
                Err(_) => {
                    // Config validation keeps tenant ids to header-safe characters.
                    tracing::error!(tenant = %grant.tenant, "a configured tenant id is not a valid header value");
                }
            }
            // A query split over other query nodes presents the same credentials there.
            let credentials = request
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|value| value.to_str().ok())
                .map(str::to_string);
            kiln_query::root::with_credentials(credentials, next.run(request)).await
        }
        Err(err) => {
            // The UI asks for a token itself; a Basic challenge would make the browser
            // pop up its own login dialog first.
            let from_ui = request.headers().contains_key("x-requested-with");
            let mut response = ApiError::Auth(err.clone()).into_response();
            let headers = response.headers_mut();
            if err.kind() == kiln_model::ErrorKind::Unauthenticated {
                headers.append(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"kiln\""),
                );
                if !from_ui {
                    headers.append(
                        header::WWW_AUTHENTICATE,
                        HeaderValue::from_static("Basic realm=\"kiln\", charset=\"UTF-8\""),
                    );
                }
            }
            if let Some(seconds) = err.retry_after_secs() {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            }
            response
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_endpoint_needs_what_it_does() {
        let needs = |method: Method, path: &str| access(&method, path);
        assert_eq!(needs(Method::GET, "/ready"), Access::Open);
        assert_eq!(needs(Method::GET, "/ui/app.js"), Access::Open);
        assert_eq!(needs(Method::GET, "/"), Access::Open);
        assert_eq!(needs(Method::GET, "/metrics"), Access::Metrics);
        for partial in [
            "/api/v1/partial/tree",
            "/api/v1/partial/profile",
            "/api/v1/partial/series",
        ] {
            assert_eq!(needs(Method::POST, partial), Access::Node, "{partial}");
        }
        for write in [
            "/ingest",
            "/pyroscope/ingest",
            "/push.v1.PusherService/Push",
            "/api/0/profiles",
            "/v1development/profiles",
        ] {
            assert_eq!(
                needs(Method::POST, write),
                Access::Needs(Scope::Write),
                "{write}"
            );
        }
        for read in [
            (Method::GET, "/pyroscope/render"),
            (Method::GET, "/api/0/profiles"),
            (
                Method::POST,
                "/querier.v1.QuerierService/SelectMergeStacktraces",
            ),
            (Method::POST, "/api/v1/compare"),
            (Method::GET, "/api/v1/overview"),
            (Method::POST, "/api/v1/heatmap"),
            (Method::POST, "/api/v1/heatmap/flamegraph"),
            (Method::POST, "/api/v1/lines"),
            (Method::GET, "/api/v1/recording-rules"),
            (Method::POST, "/api/v1/recording-rules/preview"),
            (Method::GET, "/api/v1/regressions"),
        ] {
            assert_eq!(
                needs(read.0.clone(), read.1),
                Access::Needs(Scope::Read),
                "{read:?}"
            );
        }
        for admin in [
            (Method::POST, "/api/v1/recording-rules"),
            (Method::PUT, "/api/v1/recording-rules/x"),
            (Method::DELETE, "/api/v1/recording-rules/x"),
            (Method::POST, "/api/v1/recording-rules/x/backfill"),
            (Method::POST, "/rules"),
            (Method::DELETE, "/api/v1/anything-new"),
        ] {
            assert_eq!(
                needs(admin.0.clone(), admin.1),
                Access::Needs(Scope::Admin),
                "{admin:?}"
            );
        }
    }
}
