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

mod postgres;
mod sqlite;

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub use postgres::{redact as redact_url, PostgresMetastore};
pub use sqlite::SqliteMetastore;

/// Versioned schema migrations, shared by both backends; entry `i` brings the schema to
/// version `i + 1`. Written in the SQL both speak: SQLite gives `BIGINT` columns integer
/// affinity (64-bit), PostgreSQL needs it for nanosecond times.
const MIGRATIONS: &[&str] = &[
    // 1: blocks and the datasets inside them.
    "CREATE TABLE blocks (
        id TEXT PRIMARY KEY,
        object_key TEXT NOT NULL,
        level INTEGER NOT NULL,
        size_bytes BIGINT NOT NULL,
        created_at_ms BIGINT NOT NULL
     );
     CREATE TABLE datasets (
        block_id TEXT NOT NULL REFERENCES blocks(id) ON DELETE CASCADE,
        tenant TEXT NOT NULL,
        service TEXT NOT NULL,
        row_group INTEGER NOT NULL,
        min_time_nanos BIGINT NOT NULL,
        max_time_nanos BIGINT NOT NULL,
        profile_types TEXT NOT NULL,
        profile_count BIGINT NOT NULL,
        PRIMARY KEY (block_id, row_group)
     );
     CREATE INDEX datasets_by_time ON datasets (tenant, service, max_time_nanos, min_time_nanos);",
    // 2: compaction and retention. A block whose datasets were all replaced or expired is
    // tombstoned (deleted_at_ms) and its object deleted after a grace period; leases let
    // several compactors share the work.
    "ALTER TABLE blocks ADD COLUMN deleted_at_ms BIGINT;
     CREATE INDEX datasets_by_block ON datasets (block_id);
     CREATE TABLE compaction_leases (
        tenant TEXT NOT NULL,
        service TEXT NOT NULL,
        level INTEGER NOT NULL,
        owner TEXT NOT NULL,
        expires_at_ms BIGINT NOT NULL,
        PRIMARY KEY (tenant, service, level)
     );",
    // 3: recording rules, their outbox per remote-write target, and backfilled ranges.
    "CREATE TABLE recording_rules (
        tenant TEXT NOT NULL,
        name TEXT NOT NULL,
        spec TEXT NOT NULL,
        source TEXT NOT NULL,
        live_from_ms BIGINT NOT NULL,
        updated_at_ms BIGINT NOT NULL,
        PRIMARY KEY (tenant, name)
     );
     CREATE TABLE rule_samples (
        target TEXT NOT NULL,
        tenant TEXT NOT NULL,
        rule TEXT NOT NULL,
        series TEXT NOT NULL,
        ts_ms BIGINT NOT NULL,
        value BIGINT NOT NULL,
        state INTEGER NOT NULL,
        PRIMARY KEY (target, tenant, rule, series, ts_ms)
     );
     CREATE INDEX rule_samples_by_state ON rule_samples (target, state, ts_ms);
     CREATE TABLE rule_backfills (
        tenant TEXT NOT NULL,
        rule TEXT NOT NULL,
        from_ms BIGINT NOT NULL,
        until_ms BIGINT NOT NULL,
        done_at_ms BIGINT NOT NULL,
        PRIMARY KEY (tenant, rule, from_ms)
     );",
    // 4: the regression watcher: each (service, type, version) compared once, and what
    // the comparison found.
    "CREATE TABLE version_checks (
        tenant TEXT NOT NULL,
        service TEXT NOT NULL,
        profile_type TEXT NOT NULL,
        version_label TEXT NOT NULL,
        new_version TEXT NOT NULL,
        old_version TEXT NOT NULL,
        checked_at_ms BIGINT NOT NULL,
        outcome TEXT NOT NULL,
        PRIMARY KEY (tenant, service, profile_type, version_label, new_version)
     );
     CREATE TABLE regressions (
        tenant TEXT NOT NULL,
        service TEXT NOT NULL,
        profile_type TEXT NOT NULL,
        version_label TEXT NOT NULL,
        new_version TEXT NOT NULL,
        function TEXT NOT NULL,
        detected_at_ms BIGINT NOT NULL,
        finding TEXT NOT NULL,
        PRIMARY KEY (tenant, service, profile_type, version_label, new_version, function)
     );
     CREATE INDEX regressions_by_time ON regressions (tenant, detected_at_ms);",
    // 5: membership of a scaled-out deployment: each node's roles and address, kept
    // alive by its heartbeat. No consensus: a node is live while its lease is unexpired.
    "CREATE TABLE nodes (
        id TEXT PRIMARY KEY,
        roles TEXT NOT NULL,
        address TEXT NOT NULL,
        started_at_ms BIGINT NOT NULL,
        heartbeat_at_ms BIGINT NOT NULL,
        lease_expires_at_ms BIGINT NOT NULL,
        left_at_ms BIGINT
     );",
    // 6: the write path polls how far compaction is behind (`level_backlog`), and the
    // compactor lists a level's blocks, without scanning every block of the retention.
    "CREATE INDEX blocks_by_level ON blocks (level, deleted_at_ms, created_at_ms);",
    // 7: identities of acknowledged writes, so a retry within the dedup window is not
    // stored twice after a restart (kiln_ingest::dedup). Written in the transaction that
    // registers the segment holding the write.
    "CREATE TABLE write_identities (
        identity TEXT PRIMARY KEY,
        expires_at_ms BIGINT NOT NULL
     );
     CREATE INDEX write_identities_by_expiry ON write_identities (expires_at_ms);",
];

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

/// [`LevelBacklog`]'s statement, the same SQL for both backends (`$1`: the level).
const LEVEL_BACKLOG: &str = "SELECT count(*), CAST(avg(b.created_at_ms) AS BIGINT)
    FROM datasets d JOIN blocks b ON b.id = d.block_id
    WHERE b.level = $1 AND b.deleted_at_ms IS NULL";

/// [`Metastore::promote_blocks`]' statement for one block, the same SQL for both backends
/// (`$1`: the block, `$2`: its level now, `$3`: now in ms, `$4`: the datasets the caller
/// saw in it). On PostgreSQL a swap that deletes one of the block's datasets meanwhile
/// either commits first (the count then differs) or tombstones the raised block's row
/// of it after this commits: each dataset lives in one place either way.
const PROMOTE_BLOCK: &str = "UPDATE blocks SET level = $2 + 1, created_at_ms = $3
    WHERE id = $1 AND level = $2 AND deleted_at_ms IS NULL
      AND (SELECT count(*) FROM datasets WHERE block_id = $1) = $4";

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
    /// Profiles from this time on are counted as they are first compacted; earlier ones
    /// only by a backfill. Kept when the rule is updated.
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

/// Samples committed with a swap or a backfill, into each of `targets`' outboxes.
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
    fn sorted(mut self) -> Self {
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

/// The metastore, one variant per backend.
#[derive(Clone, Debug)]
pub enum Metastore {
    Sqlite(SqliteMetastore),
    Postgres(PostgresMetastore),
}

/// Calls the same method on whichever backend this is.
macro_rules! dispatch {
    ($self:ident . $method:ident ( $($arg:expr),* )) => {
        match $self {
            Metastore::Sqlite(store) => store.$method($($arg),*).await,
            Metastore::Postgres(store) => store.$method($($arg),*).await,
        }
    };
}

impl Metastore {
    /// Opens the backend named by `url` and brings its schema up to date.
    pub async fn open(url: &str) -> Result<Self, MetastoreError> {
        if let Some(path) = url.strip_prefix("sqlite://") {
            return Ok(Metastore::Sqlite(SqliteMetastore::open(path).await?));
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(Metastore::Postgres(PostgresMetastore::open(url).await?));
        }
        Err(MetastoreError::InvalidUrl {
            url: postgres::redact(url),
            message: "expected sqlite:///path/to/metastore.db or postgres://user@host/database"
                .to_string(),
        })
    }

    /// Registers a block and its datasets in one transaction.
    pub async fn register_block(
        &self,
        block: BlockMeta,
        datasets: Vec<DatasetMeta>,
    ) -> Result<(), MetastoreError> {
        self.register_segment(block, datasets, Vec::new()).await
    }

    /// Registers a block and its datasets, and the identities of the writes it holds, in
    /// one transaction: a write is known as stored exactly when its profiles are
    /// visible. Expired identities are deleted in the same transaction.
    pub async fn register_segment(
        &self,
        block: BlockMeta,
        datasets: Vec<DatasetMeta>,
        identities: Vec<WriteIdentity>,
    ) -> Result<(), MetastoreError> {
        dispatch!(self.register_block(block, datasets, identities))
    }

    /// Identities of stored writes that expire at or after `now_ms`.
    pub async fn write_identities(
        &self,
        now_ms: i64,
    ) -> Result<Vec<WriteIdentity>, MetastoreError> {
        dispatch!(self.write_identities(now_ms))
    }

    /// Whether this is the embedded SQLite: a commit is then local work (and an fsync),
    /// cheap enough to run on the thread that wrote the block
    /// ([`Metastore::register_block_blocking`]).
    pub fn is_embedded(&self) -> bool {
        matches!(self, Metastore::Sqlite(_))
    }

    /// [`Metastore::register_block`] from a thread outside the runtime, blocked until it
    /// commits: SQLite commits on that thread, with no hand-off to a blocking thread and
    /// back; PostgreSQL is driven on `runtime`.
    pub fn register_block_blocking(
        &self,
        runtime: &tokio::runtime::Handle,
        block: BlockMeta,
        datasets: Vec<DatasetMeta>,
        identities: Vec<WriteIdentity>,
    ) -> Result<(), MetastoreError> {
        match self {
            Metastore::Sqlite(store) => store.register_block_blocking(block, datasets, identities),
            Metastore::Postgres(store) => {
                runtime.block_on(store.register_block(block, datasets, identities))
            }
        }
    }

    pub async fn list_datasets(
        &self,
        query: DatasetQuery,
    ) -> Result<Vec<DatasetMeta>, MetastoreError> {
        dispatch!(self.list_datasets(query))
    }

    pub async fn list_blocks(&self) -> Result<Vec<BlockMeta>, MetastoreError> {
        dispatch!(self.list_blocks())
    }

    /// Blocks tombstoned at or before `before_ms`, whose objects are due for deletion.
    /// Compaction asks every pass; listing every block instead read the whole table, which
    /// grows with retention, each time (docs/benchmarks.md, session 33).
    pub async fn tombstoned_blocks(
        &self,
        before_ms: i64,
    ) -> Result<Vec<BlockMeta>, MetastoreError> {
        dispatch!(self.tombstoned_blocks(before_ms))
    }

    pub async fn datasets_at_level(
        &self,
        level: u32,
    ) -> Result<Vec<(DatasetMeta, i64)>, MetastoreError> {
        dispatch!(self.datasets_at_level(level))
    }

    /// What waits at `level`: indexed aggregates over its live blocks, cheap enough to
    /// poll every second while compaction keeps the level small.
    pub async fn level_backlog(&self, level: u32) -> Result<LevelBacklog, MetastoreError> {
        dispatch!(self.level_backlog(level))
    }

    pub async fn acquire_lease(
        &self,
        group: LeaseKey,
        owner: &str,
        ttl_ms: i64,
    ) -> Result<bool, MetastoreError> {
        dispatch!(self.acquire_lease(group, owner, ttl_ms))
    }

    pub async fn release_lease(&self, group: LeaseKey, owner: &str) -> Result<(), MetastoreError> {
        dispatch!(self.release_lease(group, owner))
    }

    /// The compaction swap; `exports` (rule samples of the replaced level-0 datasets) are
    /// committed in the same transaction, or not at all.
    pub async fn replace_datasets(
        &self,
        block: BlockMeta,
        datasets: Vec<DatasetMeta>,
        replaced: Vec<DatasetRef>,
        exports: Exports,
    ) -> Result<(), MetastoreError> {
        let exports = exports.sorted();
        dispatch!(self.replace_datasets(block, datasets, replaced, exports))
    }

    /// Raises each block, given with the number of datasets the caller saw in it, from
    /// `level` to the next, in place, where it is live, at `level`, and holds exactly
    /// that many datasets, which it keeps: a segment whose every dataset is its service's
    /// lone one already is what copies of them would be, so compaction moves it with a
    /// row update instead of a write per service. One transaction for all; returns the
    /// blocks raised (the others changed meanwhile and are left as they are). Their
    /// `created_at_ms` becomes now, as a new block's would.
    pub async fn promote_blocks(
        &self,
        blocks: Vec<(String, u32)>,
        level: u32,
    ) -> Result<Vec<String>, MetastoreError> {
        if blocks.is_empty() {
            return Ok(Vec::new());
        }
        dispatch!(self.promote_blocks(blocks, level))
    }

    /// Recording rules, of one tenant or of all.
    pub async fn recording_rules(
        &self,
        tenant: Option<String>,
    ) -> Result<Vec<RuleRecord>, MetastoreError> {
        dispatch!(self.recording_rules(tenant))
    }

    /// Creates or updates a rule; an update keeps `live_from_ms`. Returns the stored row.
    pub async fn put_recording_rule(
        &self,
        record: RuleRecord,
    ) -> Result<RuleRecord, MetastoreError> {
        dispatch!(self.put_recording_rule(record))
    }

    /// Removes a rule; false when there was none. Samples already computed still go out.
    pub async fn delete_recording_rule(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<bool, MetastoreError> {
        dispatch!(self.delete_recording_rule(tenant, name))
    }

    /// Records that `rule` was backfilled over `[from_ms, until_ms)` together with its
    /// samples; [`MetastoreError::Conflict`] (and nothing written) when the range overlaps
    /// one backfilled before.
    pub async fn record_backfill(
        &self,
        tenant: &str,
        rule: &str,
        from_ms: i64,
        until_ms: i64,
        exports: Exports,
    ) -> Result<(), MetastoreError> {
        let exports = exports.sorted();
        dispatch!(self.record_backfill(tenant, rule, from_ms, until_ms, exports))
    }

    /// Claims up to `limit` rows of `target`'s outbox, oldest first: rows claimed earlier
    /// and never acknowledged (a sender died), then pending rows whose time is before
    /// `due_before_ms`. Claimed rows no longer change.
    pub async fn claim_exports(
        &self,
        target: &str,
        due_before_ms: i64,
        limit: usize,
    ) -> Result<Vec<OutboxSample>, MetastoreError> {
        dispatch!(self.claim_exports(target, due_before_ms, limit))
    }

    /// Marks claimed rows delivered.
    pub async fn ack_exports(
        &self,
        target: &str,
        samples: Vec<OutboxSample>,
    ) -> Result<(), MetastoreError> {
        dispatch!(self.ack_exports(target, samples))
    }

    /// Deletes delivered rows older than `before_ms`; late data for their steps is then
    /// no longer exported (see kiln-rules). Returns how many.
    pub async fn prune_exports(&self, before_ms: i64) -> Result<usize, MetastoreError> {
        dispatch!(self.prune_exports(before_ms))
    }

    /// Rows of `target` not yet delivered.
    pub async fn export_backlog(&self, target: &str) -> Result<i64, MetastoreError> {
        dispatch!(self.export_backlog(target))
    }

    /// Records a version check and its findings together; false (and nothing written)
    /// when that version was checked already, so two watchers report it once.
    pub async fn record_version_check(
        &self,
        check: VersionCheck,
        findings: Vec<RegressionRecord>,
    ) -> Result<bool, MetastoreError> {
        dispatch!(self.record_version_check(check, findings))
    }

    /// Whether this version of the service was checked already.
    pub async fn version_checked(
        &self,
        tenant: &str,
        service: &str,
        profile_type: &str,
        version_label: &str,
        new_version: &str,
    ) -> Result<bool, MetastoreError> {
        dispatch!(self.version_checked(tenant, service, profile_type, version_label, new_version))
    }

    /// Findings of a tenant detected at or after `since_ms`, newest first; of one service
    /// when given.
    pub async fn regressions(
        &self,
        tenant: &str,
        service: Option<String>,
        since_ms: i64,
    ) -> Result<Vec<RegressionRecord>, MetastoreError> {
        dispatch!(self.regressions(tenant, service, since_ms))
    }

    pub async fn expire_datasets(
        &self,
        tenant: &str,
        before_nanos: i64,
    ) -> Result<usize, MetastoreError> {
        dispatch!(self.expire_datasets(tenant, before_nanos))
    }

    pub async fn tenants(&self) -> Result<Vec<String>, MetastoreError> {
        dispatch!(self.tenants())
    }

    pub async fn delete_block(&self, id: &str) -> Result<(), MetastoreError> {
        dispatch!(self.delete_block(id))
    }

    /// Services of a tenant with data overlapping `[from, to]`.
    pub async fn services(
        &self,
        tenant: &str,
        from_nanos: i64,
        to_nanos: i64,
    ) -> Result<Vec<String>, MetastoreError> {
        dispatch!(self.services(tenant, from_nanos, to_nanos))
    }

    pub async fn schema_version(&self) -> Result<i64, MetastoreError> {
        dispatch!(self.schema_version())
    }

    /// Announces `node` (its roles, address, heartbeat and lease), creating or replacing
    /// its row; a node that had left is live again.
    pub async fn heartbeat(&self, node: &NodeRecord) -> Result<(), MetastoreError> {
        dispatch!(self.heartbeat(node))
    }

    /// Marks `id` as gone by a clean shutdown, so the others stop counting on it now
    /// rather than when its lease runs out.
    pub async fn leave(&self, id: &str) -> Result<(), MetastoreError> {
        dispatch!(self.leave(id))
    }

    /// Every node known, by id.
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>, MetastoreError> {
        dispatch!(self.nodes())
    }

    /// Forgets nodes not heard from since `before_ms`; returns how many.
    pub async fn forget_nodes(&self, before_ms: i64) -> Result<usize, MetastoreError> {
        dispatch!(self.forget_nodes(before_ms))
    }
}
