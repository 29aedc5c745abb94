//! The PostgreSQL backend, for deployments where several Kiln nodes share one index.
//!
//! Every write is one transaction at READ COMMITTED. Correctness under concurrent nodes
//! rests on row locks rather than on isolation level: a compaction swap deletes its input
//! rows first, so a second swap over the same inputs blocks on them, then finds them gone
//! and reports a conflict; leases are one upsert guarded by its `WHERE`. Migrations take
//! a transaction-scoped advisory lock, so nodes starting together migrate once.

use std::str::FromStr;

use deadpool_postgres::Transaction;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::{NoTls, Row};

use crate::now_ms;
use crate::{
    BlockMeta, DatasetMeta, DatasetQuery, DatasetRef, LeaseKey, MetastoreError, MIGRATIONS,
};

/// Any 64-bit key no other user of the database is likely to pick: "kilnmeta".
const MIGRATION_LOCK: i64 = 0x6b69_6c6e_6d65_7461;

const POOL_SIZE: usize = 16;

#[derive(Clone)]
pub struct PostgresMetastore {
    pool: Pool,
}

impl std::fmt::Debug for PostgresMetastore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PostgresMetastore")
    }
}

impl PostgresMetastore {
    /// Connects to `url` (`postgres://user:password@host:port/database?...`, libpq style)
    /// and brings the schema up to date.
    pub async fn open(url: &str) -> Result<Self, MetastoreError> {
        let config = tokio_postgres::Config::from_str(url).map_err(|source| {
            MetastoreError::InvalidPostgresUrl {
                url: redact(url),
                source,
            }
        })?;
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .build()
            .map_err(MetastoreError::PoolBuild)?;
        let metastore = PostgresMetastore { pool };
        metastore.migrate().await?;
        Ok(metastore)
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, MetastoreError> {
        self.pool.get().await.map_err(|err| match err {
            deadpool_postgres::PoolError::Backend(err) => MetastoreError::Postgres(err),
            other => MetastoreError::Pool(other),
        })
    }

    async fn migrate(&self) -> Result<(), MetastoreError> {
        let mut client = self.client().await?;
        let transaction = client.transaction().await?;
        transaction
            .execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await?;
        transaction
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, applied_at_ms BIGINT NOT NULL);",
            )
            .await?;
        let current: i64 = transaction
            .query_one(
                "SELECT COALESCE(MAX(version), 0)::BIGINT FROM schema_migrations",
                &[],
            )
            .await?
            .get(0);
        for (index, migration) in MIGRATIONS.iter().enumerate() {
            let version = index as i64 + 1;
            if version <= current {
                continue;
            }
            transaction.batch_execute(migration).await?;
            transaction
                .execute(
                    "INSERT INTO schema_migrations (version, applied_at_ms) VALUES ($1, $2)",
                    &[&version, &now_ms()],
                )
                .await?;
            tracing::info!(version, "applied metastore migration");
        }
        transaction.commit().await?;
        Ok(())
    }

    pub async fn register_block(
        &self,
        block: BlockMeta,
        datasets: Vec<DatasetMeta>,
    ) -> Result<(), MetastoreError> {
        let mut client = self.client().await?;
        let transaction = client.transaction().await?;
        insert_block(&transaction, &block, &datasets).await?;
        transaction.commit().await?;
        Ok(())
    }

    pub async fn list_datasets(
        &self,
        query: DatasetQuery,
    ) -> Result<Vec<DatasetMeta>, MetastoreError> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(
                "SELECT d.block_id, b.object_key, d.tenant, d.service, d.row_group, d.min_time_nanos, d.max_time_nanos,
                        d.profile_types, d.profile_count
                 FROM datasets d JOIN blocks b ON b.id = d.block_id
                 WHERE d.tenant = $1 AND ($2::TEXT IS NULL OR d.service = $2)
                   AND d.max_time_nanos >= $3 AND d.min_time_nanos <= $4
                 ORDER BY d.min_time_nanos, d.block_id, d.row_group",
            )
            .await?;
        let rows = client
            .query(
                &statement,
                &[
                    &query.tenant,
                    &query.service,
                    &query.from_nanos,
                    &query.to_nanos,
                ],
            )
            .await?;
        rows.iter().map(dataset_from_row).collect()
    }

    pub async fn list_blocks(&self) -> Result<Vec<BlockMeta>, MetastoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT id, object_key, level, size_bytes, created_at_ms, deleted_at_ms FROM blocks ORDER BY id",
                &[],
            )
            .await?;
        rows.iter().map(block_from_row).collect()
    }

    pub async fn datasets_at_level(
        &self,
        level: u32,
    ) -> Result<Vec<(DatasetMeta, i64)>, MetastoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT d.block_id, b.object_key, d.tenant, d.service, d.row_group, d.min_time_nanos, d.max_time_nanos,
                        d.profile_types, d.profile_count, b.created_at_ms
                 FROM datasets d JOIN blocks b ON b.id = d.block_id
                 WHERE b.level = $1 AND b.deleted_at_ms IS NULL
                 ORDER BY d.tenant, d.service, d.min_time_nanos, d.block_id, d.row_group",
                &[&(level as i32)],
            )
            .await?;
        rows.iter()
            .map(|row| Ok((dataset_from_row(row)?, row.try_get::<_, i64>(9)?)))
            .collect()
    }

    pub async fn acquire_lease(
        &self,
        group: LeaseKey,
        owner: &str,
        ttl_ms: i64,
    ) -> Result<bool, MetastoreError> {
        let client = self.client().await?;
        let now = now_ms();
        let changed = client
            .execute(
                "INSERT INTO compaction_leases (tenant, service, level, owner, expires_at_ms)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (tenant, service, level) DO UPDATE
                 SET owner = excluded.owner, expires_at_ms = excluded.expires_at_ms
                 WHERE compaction_leases.expires_at_ms < $6 OR compaction_leases.owner = excluded.owner",
                &[
                    &group.tenant,
                    &group.service,
                    &(group.level as i32),
                    &owner,
                    &(now + ttl_ms),
                    &now,
                ],
            )
            .await?;
        Ok(changed == 1)
    }

    pub async fn release_lease(&self, group: LeaseKey, owner: &str) -> Result<(), MetastoreError> {
        let client = self.client().await?;
        client
            .execute(
                "DELETE FROM compaction_leases WHERE tenant = $1 AND service = $2 AND level = $3 AND owner = $4",
                &[&group.tenant, &group.service, &(group.level as i32), &owner],
            )
            .await?;
        Ok(())
    }

    pub async fn replace_datasets(
        &self,
        block: BlockMeta,
        datasets: Vec<DatasetMeta>,
        replaced: Vec<DatasetRef>,
    ) -> Result<(), MetastoreError> {
        let mut client = self.client().await?;
        let transaction = client.transaction().await?;
        let delete = transaction
            .prepare_cached("DELETE FROM datasets WHERE block_id = $1 AND row_group = $2")
            .await?;
        for dataset in &replaced {
            let deleted = transaction
                .execute(&delete, &[&dataset.block_id, &(dataset.row_group as i32)])
                .await?;
            if deleted != 1 {
                // Dropping the transaction rolls it back.
                return Err(MetastoreError::Conflict(format!(
                    "dataset {}#{} is no longer registered",
                    dataset.block_id, dataset.row_group
                )));
            }
        }
        insert_block(&transaction, &block, &datasets).await?;
        let mut blocks: Vec<String> = replaced.iter().map(|d| d.block_id.clone()).collect();
        blocks.sort_unstable();
        blocks.dedup();
        tombstone_empty(&transaction, &blocks).await?;
        transaction.commit().await?;
        Ok(())
    }

    pub async fn expire_datasets(
        &self,
        tenant: &str,
        before_nanos: i64,
    ) -> Result<usize, MetastoreError> {
        let mut client = self.client().await?;
        let transaction = client.transaction().await?;
        let rows = transaction
            .query(
                "DELETE FROM datasets WHERE tenant = $1 AND max_time_nanos < $2 RETURNING block_id",
                &[&tenant, &before_nanos],
            )
            .await?;
        let expired = rows.len();
        let mut blocks = rows
            .iter()
            .map(|row| row.try_get::<_, String>(0))
            .collect::<Result<Vec<_>, _>>()?;
        blocks.sort_unstable();
        blocks.dedup();
        tombstone_empty(&transaction, &blocks).await?;
        transaction.commit().await?;
        Ok(expired)
    }

    pub async fn tenants(&self) -> Result<Vec<String>, MetastoreError> {
        let client = self.client().await?;
        let rows = client
            .query("SELECT DISTINCT tenant FROM datasets ORDER BY tenant", &[])
            .await?;
        Ok(rows
            .iter()
            .map(|row| row.try_get(0))
            .collect::<Result<_, _>>()?)
    }

    pub async fn delete_block(&self, id: &str) -> Result<(), MetastoreError> {
        let client = self.client().await?;
        client
            .execute(
                "DELETE FROM blocks WHERE id = $1 AND deleted_at_ms IS NOT NULL",
                &[&id],
            )
            .await?;
        Ok(())
    }

    pub async fn services(
        &self,
        tenant: &str,
        from_nanos: i64,
        to_nanos: i64,
    ) -> Result<Vec<String>, MetastoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT DISTINCT service FROM datasets WHERE tenant = $1 AND max_time_nanos >= $2 AND min_time_nanos <= $3 ORDER BY service",
                &[&tenant, &from_nanos, &to_nanos],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|row| row.try_get(0))
            .collect::<Result<_, _>>()?)
    }

    pub async fn schema_version(&self) -> Result<i64, MetastoreError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT COALESCE(MAX(version), 0)::BIGINT FROM schema_migrations",
                &[],
            )
            .await?;
        Ok(row.try_get(0)?)
    }
}

async fn insert_block(
    transaction: &Transaction<'_>,
    block: &BlockMeta,
    datasets: &[DatasetMeta],
) -> Result<(), MetastoreError> {
    transaction
        .execute(
            "INSERT INTO blocks (id, object_key, level, size_bytes, created_at_ms) VALUES ($1, $2, $3, $4, $5)",
            &[
                &block.id,
                &block.object_key,
                &(block.level as i32),
                &(block.size_bytes as i64),
                &block.created_at_ms,
            ],
        )
        .await?;
    let insert = transaction
        .prepare_cached(
            "INSERT INTO datasets (block_id, tenant, service, row_group, min_time_nanos, max_time_nanos, profile_types, profile_count)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .await?;
    for dataset in datasets {
        transaction
            .execute(
                &insert,
                &[
                    &block.id,
                    &dataset.tenant,
                    &dataset.service,
                    &(dataset.row_group as i32),
                    &dataset.min_time_nanos,
                    &dataset.max_time_nanos,
                    &dataset.profile_types.join("\n"),
                    &(dataset.profile_count as i64),
                ],
            )
            .await?;
    }
    Ok(())
}

async fn tombstone_empty(
    transaction: &Transaction<'_>,
    blocks: &[String],
) -> Result<(), MetastoreError> {
    if blocks.is_empty() {
        return Ok(());
    }
    transaction
        .execute(
            "UPDATE blocks SET deleted_at_ms = $2
             WHERE id = ANY($1) AND deleted_at_ms IS NULL
               AND NOT EXISTS (SELECT 1 FROM datasets WHERE block_id = blocks.id)",
            &[&blocks, &now_ms()],
        )
        .await?;
    Ok(())
}

/// Columns: block_id, object_key, tenant, service, row_group, min, max, types, count.
fn dataset_from_row(row: &Row) -> Result<DatasetMeta, MetastoreError> {
    let types: String = row.try_get(7)?;
    Ok(DatasetMeta {
        block_id: row.try_get(0)?,
        object_key: row.try_get(1)?,
        tenant: row.try_get(2)?,
        service: row.try_get(3)?,
        row_group: row.try_get::<_, i32>(4)? as u32,
        min_time_nanos: row.try_get(5)?,
        max_time_nanos: row.try_get(6)?,
        profile_types: types
            .split('\n')
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .collect(),
        profile_count: row.try_get::<_, i64>(8)? as u64,
    })
}

/// Columns: id, object_key, level, size, created, deleted.
fn block_from_row(row: &Row) -> Result<BlockMeta, MetastoreError> {
    Ok(BlockMeta {
        id: row.try_get(0)?,
        object_key: row.try_get(1)?,
        level: row.try_get::<_, i32>(2)? as u32,
        size_bytes: row.try_get::<_, i64>(3)? as u64,
        created_at_ms: row.try_get(4)?,
        deleted_at_ms: row.try_get(5)?,
    })
}

/// The URL without its password, for error messages and logs.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let Some((credentials, host)) = rest.rsplit_once('@') else {
        return url.to_string();
    };
    let user = credentials.split(':').next().unwrap_or("");
    format!("{scheme}://{user}:***@{host}")
}
