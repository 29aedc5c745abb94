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
pub use scraper::{ScrapeManager, ScrapedProfile, Sink, SinkFuture, Targets};

#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error("invalid scrape config: {0}")]
    Config(String),
}
