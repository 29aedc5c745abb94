//! The HTTP (and gRPC, on the same port) edge of Kiln: routes, extractors, wire
//! encodings and errors. The node that owns what the handlers call (the writer,
//! queries, rules, membership) is assembled outside it, in `kiln-node`, and handed in
//! as [`state::AppState`] to [`serve`].
//!
//! [`auth`] lets a request in only with credentials for its tenant and scope.
//! A handler translates: it takes the tenant ([`tenant::Tenant`]) and the request, hands
//! them to `kiln-ingest` or `kiln-query`, which decide, and shapes the answer. One file per
//! protocol family ([`ingest`], [`profefe`], [`otlp`], [`querier`], [`render`], [`ops`]);
//! [`rpc`] decides every RPC's encoding and frames it (Connect, gRPC, OTLP/HTTP);
//! [`error`] maps every error to one status and metric reason, and [`rpc::shape_errors`]
//! renders it the way the protocol's clients expect. [`listener`] owns connections and
//! their bounds, [`body`] reading bodies within limits.

pub mod auth;
pub mod body;
pub mod budget;
pub mod config;
mod debuginfo;
pub mod endpoints;
pub mod error;
pub mod explore;
pub mod ingest;
pub mod insight;
pub mod listener;
pub mod mcp;
pub mod metrics;
pub mod ops;
pub mod otlp;
pub mod partial;
pub mod placement;
pub mod profefe;
pub mod querier;
pub mod render;
pub mod role_guard;
pub mod routes;
pub mod rpc;
pub mod rules;
pub mod state;
pub mod tenant;
pub mod tls;
pub mod ui;

pub use config::HttpConfig;

/// Serves the API on `listener` until `stop` resolves, then finishes the requests in
/// flight: the edge of a node whose parts are in `state`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: state::SharedState,
    http: HttpConfig,
    tls: Option<std::sync::Arc<tls::Tls>>,
    stop: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let metrics = state.metrics.clone();
    let router = routes::router(state, tls.is_some());
    listener::serve(listener, router, http, metrics, tls, stop).await
}
