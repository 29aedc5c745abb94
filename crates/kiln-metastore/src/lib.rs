//! The metastore: the index of which blocks exist and which datasets each one holds.
//!
//! A block is visible to readers exactly when its row is committed here; the object is
//! written first. This ordering is what makes a flush atomic: a crash between the two
//! leaves an unreferenced object (garbage, never half-visible data).
//!
//! Backends are chosen by URL (`sqlite:///path`; PostgreSQL comes with the scaled-out
//! deployment). Schema migrations are versioned and applied at open.

mod sqlite;

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub use sqlite::SqliteMetastore;

#[derive(Debug, Error)]
pub enum MetastoreError {
    #[error("sqlite error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("invalid metastore url {url:?}: {message}")]
    InvalidUrl { url: String, message: String },
    #[error("metastore task failed: {0}")]
    Task(String),
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
}

impl Metastore {
    /// Opens the backend named by `url` and brings its schema up to date.
    pub async fn open(url: &str) -> Result<Self, MetastoreError> {
        if let Some(path) = url.strip_prefix("sqlite://") {
            return Ok(Metastore::Sqlite(SqliteMetastore::open(path).await?));
        }
        Err(MetastoreError::InvalidUrl {
            url: url.to_string(),
            message: "expected sqlite:///path/to/metastore.db".to_string(),
        })
    }

    /// Registers a block and its datasets in one transaction.
    pub async fn register_block(
        &self,
        block: BlockMeta,
        datasets: Vec<DatasetMeta>,
    ) -> Result<(), MetastoreError> {
        match self {
            Metastore::Sqlite(store) => store.register_block(block, datasets).await,
        }
    }

    pub async fn list_datasets(
        &self,
        query: DatasetQuery,
    ) -> Result<Vec<DatasetMeta>, MetastoreError> {
        match self {
            Metastore::Sqlite(store) => store.list_datasets(query).await,
        }
    }

    pub async fn list_blocks(&self) -> Result<Vec<BlockMeta>, MetastoreError> {
        match self {
            Metastore::Sqlite(store) => store.list_blocks().await,
        }
    }

    pub async fn datasets_at_level(
        &self,
        level: u32,
    ) -> Result<Vec<(DatasetMeta, i64)>, MetastoreError> {
        match self {
            Metastore::Sqlite(store) => store.datasets_at_level(level).await,
        }
    }

    pub async fn acquire_lease(
        &self,
        group: LeaseKey,
        owner: &str,
        ttl_ms: i64,
    ) -> Result<bool, MetastoreError> {
        match self {
            Metastore::Sqlite(store) => store.acquire_lease(group, owner, ttl_ms).await,
        }
    }

    pub async fn release_lease(&self, group: LeaseKey, owner: &str) -> Result<(), MetastoreError> {
        match self {
            Metastore::Sqlite(store) => store.release_lease(group, owner).await,
        }
    }

    pub async fn replace_datasets(
        &self,
        block: BlockMeta,
        datasets: Vec<DatasetMeta>,
        replaced: Vec<DatasetRef>,
    ) -> Result<(), MetastoreError> {
        match self {
            Metastore::Sqlite(store) => store.replace_datasets(block, datasets, replaced).await,
        }
    }

    pub async fn expire_datasets(
        &self,
        tenant: &str,
        before_nanos: i64,
    ) -> Result<usize, MetastoreError> {
        match self {
            Metastore::Sqlite(store) => store.expire_datasets(tenant, before_nanos).await,
        }
    }

    pub async fn tenants(&self) -> Result<Vec<String>, MetastoreError> {
        match self {
            Metastore::Sqlite(store) => store.tenants().await,
        }
    }

    pub async fn delete_block(&self, id: &str) -> Result<(), MetastoreError> {
        match self {
            Metastore::Sqlite(store) => store.delete_block(id).await,
        }
    }

    /// Services of a tenant with data overlapping `[from, to]`.
    pub async fn services(
        &self,
        tenant: &str,
        from_nanos: i64,
        to_nanos: i64,
    ) -> Result<Vec<String>, MetastoreError> {
        match self {
            Metastore::Sqlite(store) => store.services(tenant, from_nanos, to_nanos).await,
        }
    }

    pub async fn schema_version(&self) -> Result<i64, MetastoreError> {
        match self {
            Metastore::Sqlite(store) => store.schema_version().await,
        }
    }
}
