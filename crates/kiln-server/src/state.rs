//! What every handler shares.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use kiln_ingest::{Ingester, TenantLimits};
use kiln_query::Querier;
use prometheus_client::registry::Registry;

use crate::metrics::ServerMetrics;

pub struct AppState {
    pub ingester: Ingester,
    pub querier: Querier,
    /// Plans, fans out and merges the queries that may be split ([`kiln_query::root`]).
    pub root: kiln_query::root::Root,
    /// Recording rules: definitions, preview, backfill, and the newest values.
    pub rules: kiln_rules::Rules,
    /// Comparisons with confidence, and the regression watcher's findings.
    pub insight: kiln_insight::Insight,
    pub limits: TenantLimits,
    /// Tokens and what they allow; `None` when `auth.enabled` is false.
    pub auth: Option<kiln_auth::Authenticator>,
    /// What the node-only endpoints need (`cluster.token_file`), when set.
    pub node_credential: Option<kiln_auth::NodeCredential>,
    pub metrics: ServerMetrics,
    pub registry: Registry,
    pub ready: AtomicBool,
    /// Health of scrape targets, when scrape_configs are set.
    pub targets: Option<kiln_scrape::Targets>,
    /// What this process runs (`--target`).
    pub roles: kiln_cluster::Roles,
    /// This node's row in the metastore's `nodes` table, and every other's.
    pub membership: Arc<kiln_cluster::Membership>,
    /// Sends each write to the ingest node that owns its (tenant, service).
    pub forwarder: kiln_cluster::Forwarder,
    /// Debug files: uploads, and names for frames stored unnamed.
    pub symbolizer: kiln_symbolize::Symbolizer,
    /// Where a function's source text is read from, when configured.
    pub sources: kiln_query::source::Sources,
    /// How long a client may take to send a request body.
    pub body_read_timeout: Duration,
    /// How long a request body may go without a byte.
    pub body_idle_timeout: Duration,
}

pub type SharedState = Arc<AppState>;
