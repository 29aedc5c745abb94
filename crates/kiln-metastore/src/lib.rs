//! The metastore: the index of which blocks exist and which datasets each one holds.
//!
//! A block is visible to readers exactly when its row is committed here; the object is
//! written first. This ordering is what makes a flush atomic: a crash between the two
//! leaves an unreferenced object (garbage, never half-visible data).
//!
//! Recording rules share that rule. Their definitions live here per tenant, and the samples
//! they produce wait in an outbox table, one row per (remote-write target, series, sample
//! time). A rule's samples from a level-0 dataset are inserted in the same transaction as
//! the compaction swap that removes that dataset, so each profile is counted exactly once
//! however crashes, retries and concurrent compactors interleave. A row is mutable
//! (`PENDING`: a later contribution to its step adds to it) until a sender claims it
//! (`CLAIMED`: its value is fixed, and it is sent until acknowledged); after that, a
//! contribution to the same step becomes a new row one millisecond later, so a resent
//! sample is always identical to the first (Prometheus ignores it) and no value is ever
//! sent twice under one timestamp with two different values.
//!
//! Backends are chosen by URL: `sqlite:///path` (embedded, one node) or `postgres://…`
//! (shared by every node of a scaled-out deployment). Both keep the same tables and
//! schema versions; migrations are versioned and applied at open. One behavioural test
//! suite (`tests/suite.rs`) runs against both.
//!
//! Each operation is written once, in the module of its concern (`datasets`,
//! `compaction`, `rules`, `insight`, `nodes`), against one trait, `sql::Sql`: run a
//! statement, read its rows. Each backend implements that trait and nothing else of the
//! operations (`sqlite`, `postgres`: connections, transactions, migrations). Where the
//! two dialects part, the operation holds both statements side by side (`sql` explains).

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Runs one operation on whichever backend this is: `read` outside a transaction (one
/// statement, or reads), `write` in one, committed when the operation succeeds. The body
/// is the operation's future over the session bound to `$sql`; it is expanded once per
/// backend, so an operation is written once and compiled for both. On SQLite the body
/// runs on a blocking thread, so what it uses must be owned (`'static`).
macro_rules! run {
    ($self:ident, read, |$sql:ident| $body:expr) => {
        match &$self.backend {
            $crate::Backend::Sqlite(db) => db.read(move |$sql| $crate::sql::complete($body)).await,
            $crate::Backend::Postgres(db) => {
                let client = db.client().await?;
                let $sql = &mut $crate::postgres::Session::Client(&client);
                $body.await
            }
        }
    };
    ($self:ident, write, |$sql:ident| $body:expr) => {
        match &$self.backend {
            $crate::Backend::Sqlite(db) => db.write(move |$sql| $crate::sql::complete($body)).await,
            $crate::Backend::Postgres(db) => {
                let mut client = db.client().await?;
                // Dropping it uncommitted (an error below) rolls it back.
                let transaction = client.transaction().await?;
                let outcome: Result<_, $crate::MetastoreError> = {
                    let $sql = &mut $crate::postgres::Session::Transaction(&transaction);
                    $body.await
                };
                let outcome = outcome?;
                transaction.commit().await?;
                Ok(outcome)
            }
        }
    };
}

mod compaction;
mod datasets;
mod insight;
mod migrations;
mod nodes;
mod postgres;
mod rules;
mod sql;
mod sqlite;

pub use postgres::redact as redact_url;

/// A stored write's identity (`kiln_ingest::dedup`): a hex digest, kept until it expires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteIdentity {
    pub identity: String,
    pub expires_at_ms: i64,
}

/// Outbox states: a pending row still takes contributions to its step.
pub const PENDING: i32 = 0;
/// Claimed by a sender: the value is final and is sent until acknowledged.
pub const CLAIMED: i32 = 1;
/// Acknowledged by the target; kept (until pruned) so that late data for its step becomes
/// a new sample instead of changing this one.
pub const DELIVERED: i32 = 2;

// Wall-clock milliseconds, for lease expiry, tombstones and migration records.
use kiln_model::time::now_ms;

#[derive(Debug, Error)]
pub enum MetastoreError {
    #[error("sqlite error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("postgres error: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("postgres connection pool: {0}")]
    Pool(#[source] deadpool_postgres::PoolError),
    #[error("postgres connection pool: {0}")]
    PoolBuild(#[source] deadpool_postgres::BuildError),
    #[error("invalid metastore url {url:?}: {message}")]
    InvalidUrl { url: String, message: String },
    #[error("invalid metastore url {url:?}: {source}")]
    InvalidPostgresUrl {
        url: String,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("metastore task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("the metastore connection lock was poisoned")]
    Poisoned,
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// A compaction swap found its inputs already replaced; nothing was changed.
    #[error("conflict: {0}")]
    Conflict(String),
    /// A column read back was not what the statement selects: a schema the code does not
    /// know (a newer Kiln's, or one changed by hand).
    #[error("metastore column {column}: expected {expected}, found {found}")]
    Column {
        column: usize,
        expected: &'static str,
        found: &'static str,
    },
    #[error("{0} does not fit a BIGINT column")]
    OutOfRange(u64),
    #[error("the metastore returned no row for {0}")]
    Missing(&'static str),
    /// An operation over SQLite waited, which its statements never do: a defect.
    #[error("a metastore operation over SQLite waited instead of completing")]
    Suspended,
}

impl MetastoreError {
    /// PostgreSQL unreachable, restarting or out of connections is transient (503: try
    /// again); what SQLite or a bad URL says is not (500).
    pub fn kind(&self) -> kiln_model::ErrorKind {
        match self {
            MetastoreError::Postgres(_) | MetastoreError::Pool(_) | MetastoreError::Io(_) => {
                kiln_model::ErrorKind::Unavailable
            }
            MetastoreError::Conflict(_) => kiln_model::ErrorKind::Conflict,
            _ => kiln_model::ErrorKind::Internal,
        }
    }
}

/// One object in object storage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockMeta {
    pub id: String,
    pub object_key: String,
    /// 0 for segments from the write path; compaction raises it.
    pub level: u32,
    pub size_bytes: u64,
    pub created_at_ms: i64,
    /// Set once no dataset of the block is live; the object goes after a grace period.
    #[serde(default)]
    pub deleted_at_ms: Option<i64>,
}

/// What waits at one level: for level 0, the datasets compaction has not merged yet, and
/// so how far behind it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LevelBacklog {
    /// Live datasets of the level.
    pub datasets: u64,
    /// The mean creation time of their blocks (ms); `None` when the level is empty. For
    /// level 0, now minus this is how long a dataset has waited for its merge, on average.
    pub mean_created_at_ms: Option<i64>,
}

/// Which dataset: its block and row group.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DatasetRef {
    pub block_id: String,
    pub row_group: u32,
}

impl DatasetMeta {
    pub fn reference(&self) -> DatasetRef {
        DatasetRef {
            block_id: self.block_id.clone(),
            row_group: self.row_group,
        }
    }
}

/// A recording rule as stored: its definition (`spec`, JSON) is kiln-rules' business; the
/// metastore keeps it per tenant, with the time from which compaction counts it live.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleRecord {
    pub tenant: String,
    pub name: String,
    pub spec: String,
    /// `file` (read-only, from the config file) or `api`.
    pub source: String,
    /// Profiles from this time on are counted as their segment is registered (or, if it
    /// was registered without the rules, as it is first compacted); earlier ones only by
    /// a backfill. Kept when the rule is updated.
    pub live_from_ms: i64,
    pub updated_at_ms: i64,
}

/// One comparison of a service's new version with its previous one, done once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionCheck {
    pub tenant: String,
    pub service: String,
    pub profile_type: String,
    /// Which label carries the version (`version`, `service_version`, ...).
    pub version_label: String,
    pub new_version: String,
    pub old_version: String,
    pub checked_at_ms: i64,
    /// What the comparison concluded, in words (findings, or why it refused).
    pub outcome: String,
}

/// One significant change found by a check: `finding` (JSON) is kiln-insight's business.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegressionRecord {
    pub tenant: String,
    pub service: String,
    pub profile_type: String,
    pub version_label: String,
    pub new_version: String,
    pub function: String,
    pub detected_at_ms: i64,
    pub finding: String,
}

/// One rule's sum for one series over one step, to add to every target's outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSample {
    pub tenant: String,
    pub rule: String,
    /// The series' labels, canonical text (kiln-rules renders them).
    pub series: String,
    /// Start of the step (ms), a multiple of `step_ms`.
    pub step_start_ms: i64,
    pub step_ms: i64,
    pub value: i64,
}

/// Counts a segment's profiles by the recording rules stored when it is registered
/// ([`Metastore::register_segment`]): given every tenant's rules, the samples to add.
pub type SegmentCounting = std::sync::Arc<dyn Fn(&[RuleRecord]) -> Vec<Exports> + Send + Sync>;

/// Samples committed with a swap, a backfill or a segment's registration, into each of
/// `targets`' outboxes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exports {
    pub targets: Vec<String>,
    pub samples: Vec<RuleSample>,
}

impl Exports {
    pub fn is_empty(&self) -> bool {
        self.targets.is_empty() || self.samples.is_empty()
    }

    /// Key order, so concurrent transactions touch rows in one order (no deadlocks).
    pub(crate) fn sorted(mut self) -> Self {
        self.samples.sort_by(|a, b| {
            (&a.tenant, &a.rule, &a.series, a.step_start_ms).cmp(&(
                &b.tenant,
                &b.rule,
                &b.series,
                b.step_start_ms,
            ))
        });
        self.targets.sort();
        self.targets.dedup();
        self
    }
}

/// One row of a target's outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxSample {
    pub tenant: String,
    pub rule: String,
    pub series: String,
    pub ts_ms: i64,
    pub value: i64,
}

/// One compaction group: the datasets of a (tenant, service) at one level.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LeaseKey {
    pub tenant: String,
    pub service: String,
    pub level: u32,
}

/// One (tenant, service) dataset inside a block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetMeta {
    pub block_id: String,
    pub object_key: String,
    pub tenant: String,
    pub service: String,
    pub row_group: u32,
    pub min_time_nanos: i64,
    pub max_time_nanos: i64,
    pub profile_types: Vec<String>,
    pub profile_count: u64,
    /// Its profiles were counted by the recording rules when its segment was registered
    /// ([`Metastore::register_segment`]), so level-0 compaction does not count them again.
    #[serde(default)]
    pub rules_counted: bool,
}

/// What to look up: datasets of one tenant overlapping `[from, to]` (nanoseconds).
#[derive(Debug, Clone, Default)]
pub struct DatasetQuery {
    pub tenant: String,
    pub service: Option<String>,
    pub from_nanos: i64,
    pub to_nanos: i64,
}

/// A node of a deployment as it last announced itself ([`Metastore::heartbeat`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// Stable across the node's restarts (host and listen address).
    pub id: String,
    /// What it runs (`ingest`, `query`, `compact`, `scrape`, `rules`).
    pub roles: Vec<String>,
    /// Where the other nodes reach it (`host:port`).
    pub address: String,
    pub started_at_ms: i64,
    pub heartbeat_at_ms: i64,
    /// Live until then, unless it left.
    pub lease_expires_at_ms: i64,
    /// When it said it was leaving (a clean shutdown).
    pub left_at_ms: Option<i64>,
}

/// What a node is, judged at `now_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    Live,
    /// Its lease ran out without it leaving: it died or cannot reach the metastore.
    Down,
    Left,
}

/// Roles as stored: comma-separated.
fn split_roles(text: &str) -> Vec<String> {
    text.split(',')
        .filter(|role| !role.is_empty())
        .map(str::to_string)
        .collect()
}

impl NodeRecord {
    pub fn state(&self, now_ms: i64) -> NodeState {
        if self.left_at_ms.is_some() {
            NodeState::Left
        } else if self.lease_expires_at_ms > now_ms {
            NodeState::Live
        } else {
            NodeState::Down
        }
    }

    pub fn has_role(&self, role: &str) -> bool {
        self.roles.iter().any(|r| r == role)
    }
}

/// The metastore: one handle over whichever backend its URL named. Its operations are in
/// the modules of their concerns.
#[derive(Clone, Debug)]
pub struct Metastore {
    backend: Backend,
}

#[derive(Clone, Debug)]
enum Backend {
    Sqlite(sqlite::SqliteMetastore),
    Postgres(postgres::PostgresMetastore),
}

impl Metastore {
    /// Opens the backend named by `url` and brings its schema up to date.
    pub async fn open(url: &str) -> Result<Self, MetastoreError> {
        let backend = if let Some(path) = url.strip_prefix("sqlite://") {
            Backend::Sqlite(sqlite::SqliteMetastore::open(path).await?)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Backend::Postgres(postgres::PostgresMetastore::open(url).await?)
        } else {
            return Err(MetastoreError::InvalidUrl {
                url: postgres::redact(url),
                message: "expected sqlite:///path/to/metastore.db or postgres://user@host/database"
                    .to_string(),
            });
        };
        Ok(Metastore { backend })
    }

    /// Whether this is the embedded SQLite: a commit is then local work (and an fsync),
    /// cheap enough to run on the thread that wrote the block
    /// ([`Metastore::register_block_blocking`]).
    pub fn is_embedded(&self) -> bool {
        matches!(self.backend, Backend::Sqlite(_))
    }
}
