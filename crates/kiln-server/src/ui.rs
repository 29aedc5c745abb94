//! The web UI, compiled into the binary: plain ES modules and CSS with no build step (so
//! the files in `crates/kiln-server/ui/` are exactly what browsers get), plus uPlot 1.6.32
//! (MIT, vendored unchanged from npm) for the timeline.

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// Every file under `/ui/`: (path, content type, bytes).
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "api.js",
        "text/javascript; charset=utf-8",
        include_str!("../ui/api.js"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../ui/app.js"),
    ),
    (
        "flamegraph.js",
        "text/javascript; charset=utf-8",
        include_str!("../ui/flamegraph.js"),
    ),
    (
        "heatmap.js",
        "text/javascript; charset=utf-8",
        include_str!("../ui/heatmap.js"),
    ),
    (
        "overview.js",
        "text/javascript; charset=utf-8",
        include_str!("../ui/overview.js"),
    ),
    (
        "rules.js",
        "text/javascript; charset=utf-8",
        include_str!("../ui/rules.js"),
    ),
    (
        "regressions.js",
        "text/javascript; charset=utf-8",
        include_str!("../ui/regressions.js"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("../ui/style.css"),
    ),
    (
        "vendor/uPlot.iife.min.js",
        "text/javascript; charset=utf-8",
        include_str!("../ui/vendor/uPlot.iife.min.js"),
    ),
    (
        "vendor/uPlot.min.css",
        "text/css; charset=utf-8",
        include_str!("../ui/vendor/uPlot.min.css"),
    ),
];

const INDEX: &str = include_str!("../ui/index.html");
const RULES: &str = include_str!("../ui/rules.html");
const REGRESSIONS: &str = include_str!("../ui/regressions.html");

pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(index))
        .route("/rules", get(rules))
        .route("/regressions", get(regressions))
        .route("/ui/{*path}", get(asset))
}

async fn index() -> Response {
    page(INDEX)
}

/// Recording rules: write, preview, save.
async fn rules() -> Response {
    page(RULES)
}

/// What the regression watcher found after deploys.
async fn regressions() -> Response {
    page(REGRESSIONS)
}

fn page(html: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        html,
    )
        .into_response()
}

async fn asset(Path(path): Path<String>) -> Response {
    match ASSETS.iter().find(|(name, _, _)| *name == path) {
        Some((_, content_type, body)) => (
            [
                (header::CONTENT_TYPE, *content_type),
                // Revalidated on every load: a new kiln binary serves new files at once.
                (header::CACHE_CONTROL, "no-cache"),
            ],
            *body,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, format!("no UI file {path:?}\n")).into_response(),
    }
}

/// Bytes of the UI as served (the total a first visit downloads, before compression).
pub fn bundle_bytes() -> usize {
    INDEX.len()
        + RULES.len()
        + REGRESSIONS.len()
        + ASSETS.iter().map(|(_, _, body)| body.len()).sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_the_pages_load_is_served() {
        for (page, at_least) in [(INDEX, 4), (RULES, 4), (REGRESSIONS, 2)] {
            let references: Vec<&str> = page
                .split("\"/ui/")
                .skip(1)
                .filter_map(|rest| rest.split('"').next())
                .collect();
            assert!(references.len() >= at_least, "{references:?}");
            for path in references {
                assert!(ASSETS.iter().any(|(name, _, _)| *name == path), "{path}");
            }
        }
        assert!(include_str!("../ui/app.js").contains("from './flamegraph.js'"));
        assert!(bundle_bytes() < 200_000, "{} bytes", bundle_bytes());
    }
}
