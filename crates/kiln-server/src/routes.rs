//! The router: every path Kiln serves, and the handler of each.

use axum::http::Method;
use axum::routing::{get, post};
use axum::Router;

use crate::state::SharedState;
use crate::{ingest, ops, otlp, profefe, querier, render};

/// OTLP/HTTP's profiles path.
pub const OTLP_HTTP_PATH: &str = "/v1development/profiles";
const OTLP_GRPC_PATH: &str =
    "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";
const PUSH_PATH: &str = "/push.v1.PusherService/Push";

pub fn router(state: SharedState) -> Router {
    Router::new()
        .route("/ingest", post(ingest::pyroscope))
        .route("/pyroscope/ingest", post(ingest::pyroscope))
        .route(PUSH_PATH, post(ingest::push))
        .route(OTLP_GRPC_PATH, post(otlp::export))
        .route(OTLP_HTTP_PATH, post(otlp::export))
        .route("/querier.v1.QuerierService/{method}", post(querier::call))
        .route("/api/0/profiles", post(profefe::ingest).get(profefe::list))
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
        .route("/metrics", get(ops::metrics))
        .route("/api/v1/targets", get(ops::scrape_targets))
        .merge(crate::ui::router())
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::rpc::shape_errors,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::listener::guard,
        ))
        .with_state(state)
}

/// The `endpoint` label of the ingest metrics for a write; `None` for reads (a profefe
/// listing shares its path with profefe's write).
pub fn endpoint_of(method: &Method, path: &str) -> Option<&'static str> {
    if method != Method::POST {
        return None;
    }
    match path {
        "/ingest" | "/pyroscope/ingest" => Some(ingest::PYROSCOPE),
        PUSH_PATH => Some(ingest::PUSH),
        "/api/0/profiles" => Some(profefe::ENDPOINT),
        OTLP_HTTP_PATH | OTLP_GRPC_PATH => Some(otlp::ENDPOINT),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_writes_are_counted_as_ingest() {
        assert_eq!(
            endpoint_of(&Method::POST, "/api/0/profiles"),
            Some("profefe")
        );
        assert_eq!(endpoint_of(&Method::GET, "/api/0/profiles"), None);
        assert_eq!(endpoint_of(&Method::POST, "/ingest"), Some("ingest"));
        assert_eq!(endpoint_of(&Method::POST, OTLP_GRPC_PATH), Some("otlp"));
        assert_eq!(
            endpoint_of(&Method::POST, "/querier.v1.QuerierService/Series"),
            None
        );
    }
}
