//! The metastore: the index of which blocks exist and which datasets each one holds.
//!
//! A block is visible to readers exactly when its row is committed here; the object is
//! written first. This ordering is what makes a flush atomic: a crash between the two
//! leaves an unreferenced object (garbage, never half-visible data).
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
];

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
        dispatch!(self.register_block(block, datasets))
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

    pub async fn datasets_at_level(
        &self,
        level: u32,
    ) -> Result<Vec<(DatasetMeta, i64)>, MetastoreError> {
        dispatch!(self.datasets_at_level(level))
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

    pub async fn replace_datasets(
        &self,
        block: BlockMeta,
        datasets: Vec<DatasetMeta>,
        replaced: Vec<DatasetRef>,
    ) -> Result<(), MetastoreError> {
        dispatch!(self.replace_datasets(block, datasets, replaced))
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
}
