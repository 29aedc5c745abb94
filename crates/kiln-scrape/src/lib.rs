//! Pull collection: Kiln scrapes pprof endpoints the way Prometheus scrapes metrics.
//!
//! Jobs are configured in Prometheus's `scrape_configs` shape ([`config`]); targets come
//! from static lists, files and HTTP service discovery ([`discovery`]) and pass through
//! Prometheus relabeling ([`relabel`]); each (target, profile kind) is fetched on its own
//! schedule and cumulative profiles become deltas ([`delta`]). What comes out is handed
//! to a [`Sink`]: the server's ingester in-process, or a remote Kiln's push API for
//! `kiln scrape` (pull translated into push, one code path for both).

pub mod client;
pub mod config;
pub mod delta;
pub mod discovery;
/// Prometheus relabeling lives in kiln-model, shared with the host agent.
pub use kiln_model::relabel;
pub mod scraper;

pub use config::ScrapeConfig;
pub use scraper::{Owner, ScrapeManager, ScrapedProfile, Sink, SinkFuture, Targets};

/// Why a scrape configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error("invalid scrape config: {0}")]
    Config(String),
    #[error("invalid scrape config: cannot read {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid scrape config: {what}: {source}")]
    Http {
        what: &'static str,
        #[source]
        source: reqwest::Error,
    },
}

/// Why one scrape of a target failed; its text is the target's `lastError`.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeFailure {
    #[error("timed out after {0:?}")]
    Timeout(std::time::Duration),
    #[error("request failed: {0}")]
    Request(#[source] reqwest::Error),
    #[error("reading the response failed: {0}")]
    Response(#[source] reqwest::Error),
    #[error("HTTP {0} from the target")]
    Status(reqwest::StatusCode),
    #[error("the response is larger than body_size_limit ({0} bytes)")]
    TooLarge(usize),
    #[error("cannot decompress the response: {0}")]
    Decompress(#[source] kiln_model::FormatError),
    #[error("the response is not a pprof profile ({source}); it starts with {start:?}")]
    NotPprof {
        start: String,
        #[source]
        source: kiln_model::FormatError,
    },
    #[error("invalid pprof profile: {0}")]
    InvalidPprof(#[source] kiln_model::FormatError),
    #[error("{0}")]
    Secret(#[source] ScrapeError),
    #[error("the scraper is stopping")]
    Stopping,
    #[error("cannot store the profile: {0}")]
    Sink(String),
}

/// Why a service discovery source could not be read (the last targets are kept).
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("{0}")]
    Http(#[source] reqwest::Error),
    #[error("HTTP {0}")]
    Status(reqwest::StatusCode),
    #[error("{0}")]
    Read(#[source] std::io::Error),
    #[error("invalid target groups: {0}")]
    Json(#[source] serde_json::Error),
    #[error("invalid target groups: {0}")]
    Yaml(#[source] yaml_serde::Error),
}
