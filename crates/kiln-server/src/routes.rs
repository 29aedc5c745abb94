//! The router: every path Kiln serves, and the handler of each.

use axum::routing::{get, post};
use axum::Router;

use crate::endpoints::{OTLP_GRPC_PATH, OTLP_HTTP_PATH, PROFEFE_PATH, PUSH_PATH, PYROSCOPE_PATHS};
use crate::state::SharedState;
use crate::{explore, ingest, insight, ops, otlp, partial, profefe, querier, render, rules};

pub fn router(state: SharedState) -> Router {
    PYROSCOPE_PATHS
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
        // Outermost last: errors are shaped for their protocol, then credentials are
        // checked, then the body's declared size, then a read's budget.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::budget::limit_reads,
        ))
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
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::rpc::shape_errors,
        ))
        .with_state(state)
}
