//! The embedded SQLite backend: WAL mode with `synchronous=FULL`, so a committed
//! registration survives power loss, and one connection behind a mutex (SQLite serialises
//! writers anyway; reads are short index lookups).

use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::{params, Connection, OptionalExtension};

use crate::now_ms;
use crate::{
    BlockMeta, DatasetMeta, DatasetQuery, DatasetRef, LeaseKey, MetastoreError, MIGRATIONS,
};

#[derive(Clone)]
pub struct SqliteMetastore {
    connection: Arc<Mutex<Connection>>,
}

impl std::fmt::Debug for SqliteMetastore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SqliteMetastore")
    }
}

fn migrate(connection: &mut Connection) -> Result<(), MetastoreError> {
    connection.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at_ms INTEGER NOT NULL);",
    )?;
    let current: i64 = connection.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
        [],
        |row| row.get(0),
    )?;
    for (index, migration) in MIGRATIONS.iter().enumerate() {
        let version = index as i64 + 1;
        if version <= current {
            continue;
        }
        let transaction = connection.transaction()?;
        transaction.execute_batch(migration)?;
        transaction.execute(
            "INSERT INTO schema_migrations (version, applied_at_ms) VALUES (?1, ?2)",
            params![version, now_ms()],
        )?;
        transaction.commit()?;
        tracing::info!(version, "applied metastore migration");
    }
    Ok(())
}

impl SqliteMetastore {
    pub async fn open(path: &str) -> Result<Self, MetastoreError> {
        let path = path.to_string();
        let connection =
            tokio::task::spawn_blocking(move || -> Result<Connection, MetastoreError> {
                if let Some(parent) = Path::new(&path).parent() {
                    if !parent.as_os_str().is_empty() {
                        std::fs::create_dir_all(parent)?;
                    }
                }
                let mut connection = Connection::open(&path)?;
                connection.pragma_update(None, "journal_mode", "WAL")?;
                connection.pragma_update(None, "synchronous", "FULL")?;
                connection.pragma_update(None, "foreign_keys", "ON")?;
                connection.busy_timeout(std::time::Duration::from_secs(10))?;
                migrate(&mut connection)?;
                Ok(connection)
            })
            .await
            .map_err(MetastoreError::Task)??;
        Ok(SqliteMetastore {
            connection: Arc::new(Mutex::new(connection)),
        })
    }

    async fn with<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Connection) -> Result<T, MetastoreError> + Send + 'static,
    ) -> Result<T, MetastoreError> {
        let connection = self.connection.clone();
        tokio::task::spawn_blocking(move || {
            let mut guard = connection.lock().map_err(|_| MetastoreError::Poisoned)?;
            work(&mut guard)
        })
        .await
        .map_err(MetastoreError::Task)?
    }

    pub async fn register_block(
        &self,
        block: BlockMeta,
        datasets: Vec<DatasetMeta>,
    ) -> Result<(), MetastoreError> {
        self.with(move |connection| {
            let transaction = connection.transaction()?;
            insert_block(&transaction, &block, &datasets)?;
            transaction.commit()?;
            Ok(())
        })
        .await
    }

    pub async fn list_datasets(
        &self,
        query: DatasetQuery,
    ) -> Result<Vec<DatasetMeta>, MetastoreError> {
        self.with(move |connection| {
            let mut statement = connection.prepare_cached(
                "SELECT d.block_id, b.object_key, d.tenant, d.service, d.row_group, d.min_time_nanos, d.max_time_nanos,
                        d.profile_types, d.profile_count
                 FROM datasets d JOIN blocks b ON b.id = d.block_id
                 WHERE d.tenant = ?1 AND (?2 IS NULL OR d.service = ?2)
                   AND d.max_time_nanos >= ?3 AND d.min_time_nanos <= ?4
                 ORDER BY d.min_time_nanos, d.block_id, d.row_group",
            )?;
            let rows = statement.query_map(
                params![query.tenant, query.service, query.from_nanos, query.to_nanos],
                dataset_from_row,
            )?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    pub async fn list_blocks(&self) -> Result<Vec<BlockMeta>, MetastoreError> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(
                "SELECT id, object_key, level, size_bytes, created_at_ms, deleted_at_ms FROM blocks ORDER BY id",
            )?;
            let rows = statement.query_map([], block_from_row)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Live datasets of blocks at `level`, with their block's creation time.
    pub async fn datasets_at_level(
        &self,
        level: u32,
    ) -> Result<Vec<(DatasetMeta, i64)>, MetastoreError> {
        self.with(move |connection| {
            let mut statement = connection.prepare_cached(
                "SELECT d.block_id, b.object_key, d.tenant, d.service, d.row_group, d.min_time_nanos, d.max_time_nanos,
                        d.profile_types, d.profile_count, b.created_at_ms
                 FROM datasets d JOIN blocks b ON b.id = d.block_id
                 WHERE b.level = ?1 AND b.deleted_at_ms IS NULL
                 ORDER BY d.tenant, d.service, d.min_time_nanos, d.block_id, d.row_group",
            )?;
            let rows = statement.query_map(params![level], |row| {
                Ok((dataset_from_row(row)?, row.get::<_, i64>(9)?))
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// Takes the lease on one compaction group unless another owner holds an unexpired one.
    pub async fn acquire_lease(
        &self,
        group: LeaseKey,
        owner: &str,
        ttl_ms: i64,
    ) -> Result<bool, MetastoreError> {
        let owner = owner.to_string();
        self.with(move |connection| {
            let now = now_ms();
            let changed = connection.execute(
                "INSERT INTO compaction_leases (tenant, service, level, owner, expires_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (tenant, service, level) DO UPDATE
                 SET owner = excluded.owner, expires_at_ms = excluded.expires_at_ms
                 WHERE compaction_leases.expires_at_ms < ?6 OR compaction_leases.owner = excluded.owner",
                params![group.tenant, group.service, group.level, owner, now + ttl_ms, now],
            )?;
            Ok(changed == 1)
        })
        .await
    }

    pub async fn release_lease(&self, group: LeaseKey, owner: &str) -> Result<(), MetastoreError> {
        let owner = owner.to_string();
        self.with(move |connection| {
            connection.execute(
                "DELETE FROM compaction_leases WHERE tenant = ?1 AND service = ?2 AND level = ?3 AND owner = ?4",
                params![group.tenant, group.service, group.level, owner],
            )?;
            Ok(())
        })
        .await
    }

    /// The atomic swap of compaction: registers `block` with `datasets` and removes the
    /// `replaced` datasets in one transaction, tombstoning blocks left without datasets.
    /// If any replaced dataset is already gone (another compactor or retention got there
    /// first) nothing changes and the answer is [`MetastoreError::Conflict`].
    pub async fn replace_datasets(
        &self,
        block: BlockMeta,
        datasets: Vec<DatasetMeta>,
        replaced: Vec<DatasetRef>,
    ) -> Result<(), MetastoreError> {
        self.with(move |connection| {
            let transaction = connection.transaction()?;
            for dataset in &replaced {
                let deleted = transaction.execute(
                    "DELETE FROM datasets WHERE block_id = ?1 AND row_group = ?2",
                    params![dataset.block_id, dataset.row_group],
                )?;
                if deleted != 1 {
                    return Err(MetastoreError::Conflict(format!(
                        "dataset {}#{} is no longer registered",
                        dataset.block_id, dataset.row_group
                    )));
                }
            }
            insert_block(&transaction, &block, &datasets)?;
            let mut blocks: Vec<&str> = replaced.iter().map(|d| d.block_id.as_str()).collect();
            blocks.sort_unstable();
            blocks.dedup();
            tombstone_empty(&transaction, &blocks)?;
            transaction.commit()?;
            Ok(())
        })
        .await
    }

    /// Removes the tenant's datasets whose newest profile is older than `before_nanos`;
    /// returns how many. Blocks left empty are tombstoned.
    pub async fn expire_datasets(
        &self,
        tenant: &str,
        before_nanos: i64,
    ) -> Result<usize, MetastoreError> {
        let tenant = tenant.to_string();
        self.with(move |connection| {
            let transaction = connection.transaction()?;
            let blocks: Vec<String> = {
                let mut statement = transaction.prepare_cached(
                    "SELECT DISTINCT block_id FROM datasets WHERE tenant = ?1 AND max_time_nanos < ?2",
                )?;
                let rows = statement.query_map(params![tenant, before_nanos], |row| row.get(0))?;
                rows.collect::<Result<Vec<String>, _>>()?
            };
            let expired = transaction.execute(
                "DELETE FROM datasets WHERE tenant = ?1 AND max_time_nanos < ?2",
                params![tenant, before_nanos],
            )?;
            let blocks: Vec<&str> = blocks.iter().map(String::as_str).collect();
            tombstone_empty(&transaction, &blocks)?;
            transaction.commit()?;
            Ok(expired)
        })
        .await
    }

    /// Every tenant with at least one dataset.
    pub async fn tenants(&self) -> Result<Vec<String>, MetastoreError> {
        self.with(|connection| {
            let mut statement = connection
                .prepare_cached("SELECT DISTINCT tenant FROM datasets ORDER BY tenant")?;
            let rows = statement.query_map([], |row| row.get(0))?;
            Ok(rows.collect::<Result<Vec<String>, _>>()?)
        })
        .await
    }

    /// Forgets a tombstoned block, once its object is deleted.
    pub async fn delete_block(&self, id: &str) -> Result<(), MetastoreError> {
        let id = id.to_string();
        self.with(move |connection| {
            connection.execute(
                "DELETE FROM blocks WHERE id = ?1 AND deleted_at_ms IS NOT NULL",
                params![id],
            )?;
            Ok(())
        })
        .await
    }

    pub async fn services(
        &self,
        tenant: &str,
        from_nanos: i64,
        to_nanos: i64,
    ) -> Result<Vec<String>, MetastoreError> {
        let tenant = tenant.to_string();
        self.with(move |connection| {
            let mut statement = connection.prepare_cached(
                "SELECT DISTINCT service FROM datasets WHERE tenant = ?1 AND max_time_nanos >= ?2 AND min_time_nanos <= ?3 ORDER BY service",
            )?;
            let rows = statement.query_map(params![tenant, from_nanos, to_nanos], |row| row.get(0))?;
            Ok(rows.collect::<Result<Vec<String>, _>>()?)
        })
        .await
    }

    pub async fn schema_version(&self) -> Result<i64, MetastoreError> {
        self.with(|connection| {
            Ok(connection
                .query_row("SELECT MAX(version) FROM schema_migrations", [], |row| {
                    row.get::<_, Option<i64>>(0)
                })
                .optional()?
                .flatten()
                .unwrap_or(0))
        })
        .await
    }
}

fn insert_block(
    transaction: &rusqlite::Transaction<'_>,
    block: &BlockMeta,
    datasets: &[DatasetMeta],
) -> Result<(), MetastoreError> {
    transaction.execute(
        "INSERT INTO blocks (id, object_key, level, size_bytes, created_at_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![block.id, block.object_key, block.level, block.size_bytes as i64, block.created_at_ms],
    )?;
    let mut insert = transaction.prepare_cached(
        "INSERT INTO datasets (block_id, tenant, service, row_group, min_time_nanos, max_time_nanos, profile_types, profile_count)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?;
    for dataset in datasets {
        insert.execute(params![
            block.id,
            dataset.tenant,
            dataset.service,
            dataset.row_group,
            dataset.min_time_nanos,
            dataset.max_time_nanos,
            dataset.profile_types.join("\n"),
            dataset.profile_count as i64,
        ])?;
    }
    Ok(())
}

/// Tombstones those of `blocks` that have no dataset left.
fn tombstone_empty(
    transaction: &rusqlite::Transaction<'_>,
    blocks: &[&str],
) -> Result<(), MetastoreError> {
    let mut update = transaction.prepare_cached(
        "UPDATE blocks SET deleted_at_ms = ?2
         WHERE id = ?1 AND deleted_at_ms IS NULL
           AND NOT EXISTS (SELECT 1 FROM datasets WHERE block_id = ?1)",
    )?;
    let now = now_ms();
    for block in blocks {
        update.execute(params![block, now])?;
    }
    Ok(())
}

/// Columns: block_id, object_key, tenant, service, row_group, min, max, types, count.
fn dataset_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<DatasetMeta> {
    let types: String = row.get(7)?;
    Ok(DatasetMeta {
        block_id: row.get(0)?,
        object_key: row.get(1)?,
        tenant: row.get(2)?,
        service: row.get(3)?,
        row_group: row.get(4)?,
        min_time_nanos: row.get(5)?,
        max_time_nanos: row.get(6)?,
        profile_types: types
            .split('\n')
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .collect(),
        profile_count: row.get::<_, i64>(8)? as u64,
    })
}

/// Columns: id, object_key, level, size, created, deleted.
fn block_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<BlockMeta> {
    Ok(BlockMeta {
        id: row.get(0)?,
        object_key: row.get(1)?,
        level: row.get(2)?,
        size_bytes: row.get::<_, i64>(3)? as u64,
        created_at_ms: row.get(4)?,
        deleted_at_ms: row.get(5)?,
    })
}
