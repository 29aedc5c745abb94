//! The router: every path Kiln serves, and the handler of each.

use axum::routing::{get, post, put};
use axum::Router;

use crate::endpoints::{OTLP_GRPC_PATH, OTLP_HTTP_PATH, PROFEFE_PATH, PUSH_PATH, PYROSCOPE_PATHS};
use crate::state::SharedState;
use crate::{
    debuginfo, explore, ingest, insight, mcp, ops, otlp, partial, profefe, querier, render, rules,
};

/// Every route; `secure` when the listener serves TLS (for the links MCP answers carry).
pub fn router(state: SharedState, secure: bool) -> Router {
    let api = api(state.clone());
    // `/mcp` calls the rest through it, so it sits outside it: the same guards, and no
    // read budget of its own (each call it makes takes one; crate::mcp).
    let mcp = Router::new()
        .route(
            "/mcp",
            post(mcp::call).get(mcp::no_stream).delete(mcp::no_stream),
        )
        .with_state(mcp::McpState {
            api: api.clone(),
            secure,
        });
    api.merge(guarded(mcp, &state))
}

/// Credentials, then the body's declared size, then the node's roles (outermost first).
fn guarded<S: Clone + Send + Sync + 'static>(router: Router<S>, state: &SharedState) -> Router<S> {
    router
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::role_guard::route_by_role,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::listener::guard,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::auth::authenticate,
        ))
}

fn api(state: SharedState) -> Router {
    let routes = PYROSCOPE_PATHS
        .iter()
        .fold(Router::new(), |router, path| {
            router.route(path, post(ingest::pyroscope))
        })
        .route(PUSH_PATH, post(ingest::push))
        .route(OTLP_GRPC_PATH, post(otlp::export))
        .route(OTLP_HTTP_PATH, post(otlp::export))
        .route("/querier.v1.QuerierService/{method}", post(querier::call))
        .route(PROFEFE_PATH, post(profefe::ingest).get(profefe::list))
        .route("/api/0/profiles/merge", get(profefe::merge))
        .route("/api/0/profiles/{id}", get(profefe::get))
        .route("/api/0/services", get(profefe::services))
        .route("/api/0/version", get(profefe::version))
        .route("/pyroscope/render", get(render::render))
        .route("/render", get(render::render))
        .route("/pyroscope/render-diff", get(render::render_diff))
        .route("/render-diff", get(render::render_diff))
        .route("/pyroscope/label-names", get(render::label_names))
        .route("/label-names", get(render::label_names))
        .route("/pyroscope/label-values", get(render::label_values))
        .route("/label-values", get(render::label_values))
        .route("/ready", get(ops::ready))
        .route("/api/openapi.json", get(ops::openapi))
        .route("/metrics", get(ops::metrics))
        .route("/api/v1/targets", get(ops::scrape_targets))
        .route(
            "/api/v1/recording-rules",
            get(rules::list).post(rules::create),
        )
        .route("/api/v1/recording-rules/preview", post(rules::preview))
        .route(
            "/api/v1/recording-rules/{name}",
            get(rules::get).put(rules::update).delete(rules::delete),
        )
        .route(
            "/api/v1/recording-rules/{name}/backfill",
            post(rules::backfill),
        )
        .route("/api/v1/compare", post(insight::compare))
        .route("/api/v1/regressions", get(insight::regressions))
        .route("/api/v1/nodes", get(ops::nodes))
        .route("/api/v1/overview", get(explore::overview))
        .route("/api/v1/heatmap", post(explore::heatmap))
        .route(
            "/api/v1/heatmap/flamegraph",
            post(explore::heatmap_flamegraph),
        )
        .route("/api/v1/lines", post(explore::lines))
        .route(
            "/api/v1/debuginfo/{build_id}",
            put(debuginfo::upload).get(debuginfo::status),
        )
        .route(kiln_cluster::fanout::PARTIAL_TREE_PATH, post(partial::tree))
        .route(
            kiln_cluster::fanout::PARTIAL_PROFILE_PATH,
            post(partial::profile),
        )
        .route(
            kiln_cluster::fanout::PARTIAL_SERIES_PATH,
            post(partial::series),
        )
        .merge(crate::ui::router())
        // Innermost first: a read's budget, then the guards, and outermost the errors
        // shaped for their protocol.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::budget::limit_reads,
        ));
    guarded(routes, &state)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::rpc::shape_errors,
        ))
        .with_state(state)
}
