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
    BlockMeta, DatasetMeta, DatasetQuery, DatasetRef, Exports, LeaseKey, LevelBacklog,
    MetastoreError, NodeRecord, OutboxSample, RegressionRecord, RuleRecord, VersionCheck,
    WriteIdentity, CLAIMED, DELIVERED, LEVEL_BACKLOG, MIGRATIONS, PENDING, PROMOTE_BLOCK,
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
        identities: Vec<WriteIdentity>,
    ) -> Result<(), MetastoreError> {
        let mut client = self.client().await?;
        let transaction = client.transaction().await?;
        insert_block(&transaction, &block, &datasets).await?;
        if !identities.is_empty() {
            // One statement for all of them: a round trip per identity would cost a
            // flush of many profiles as many round trips to the server.
            let (keys, expiries): (Vec<&str>, Vec<i64>) = identities
                .iter()
                .map(|identity| (identity.identity.as_str(), identity.expires_at_ms))
                .unzip();
            transaction
                .execute(
                    "INSERT INTO write_identities (identity, expires_at_ms)
                     SELECT identity, MAX(expires_at_ms) FROM UNNEST($1::TEXT[], $2::BIGINT[])
                         AS given(identity, expires_at_ms)
                     GROUP BY identity
                     ON CONFLICT (identity) DO UPDATE SET expires_at_ms = excluded.expires_at_ms",
                    &[&keys, &expiries],
                )
                .await?;
            transaction
                .execute(
                    "DELETE FROM write_identities WHERE expires_at_ms < $1",
                    &[&block.created_at_ms],
                )
                .await?;
        }
        transaction.commit().await?;
        Ok(())
    }

    pub async fn write_identities(
        &self,
        now_ms: i64,
    ) -> Result<Vec<WriteIdentity>, MetastoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT identity, expires_at_ms FROM write_identities WHERE expires_at_ms >= $1",
                &[&now_ms],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|row| WriteIdentity {
                identity: row.get(0),
                expires_at_ms: row.get(1),
            })
            .collect())
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

    pub async fn tombstoned_blocks(
        &self,
        before_ms: i64,
    ) -> Result<Vec<BlockMeta>, MetastoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT id, object_key, level, size_bytes, created_at_ms, deleted_at_ms FROM blocks
                 WHERE deleted_at_ms IS NOT NULL AND deleted_at_ms <= $1 ORDER BY id",
                &[&before_ms],
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

    pub async fn level_backlog(&self, level: u32) -> Result<LevelBacklog, MetastoreError> {
        let client = self.client().await?;
        let row = client.query_one(LEVEL_BACKLOG, &[&(level as i32)]).await?;
        Ok(LevelBacklog {
            datasets: row.try_get::<_, i64>(0)? as u64,
            mean_created_at_ms: row.try_get(1)?,
        })
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
        exports: Exports,
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
        add_exports(&transaction, &exports).await?;
        transaction.commit().await?;
        Ok(())
    }

    pub async fn promote_blocks(
        &self,
        blocks: Vec<(String, u32)>,
        level: u32,
    ) -> Result<Vec<String>, MetastoreError> {
        let mut client = self.client().await?;
        let transaction = client.transaction().await?;
        let update = transaction.prepare_cached(PROMOTE_BLOCK).await?;
        let (level, now) = (level as i32, now_ms());
        let mut promoted = Vec::new();
        for (id, datasets) in blocks {
            let datasets = i64::from(datasets);
            if transaction
                .execute(&update, &[&id, &level, &now, &datasets])
                .await?
                == 1
            {
                promoted.push(id);
            }
        }
        transaction.commit().await?;
        Ok(promoted)
    }

    pub async fn recording_rules(
        &self,
        tenant: Option<String>,
    ) -> Result<Vec<RuleRecord>, MetastoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT tenant, name, spec, source, live_from_ms, updated_at_ms FROM recording_rules
                 WHERE $1::TEXT IS NULL OR tenant = $1 ORDER BY tenant, name",
                &[&tenant],
            )
            .await?;
        Ok(rows.iter().map(rule_from_row).collect())
    }

    pub async fn put_recording_rule(
        &self,
        record: RuleRecord,
    ) -> Result<RuleRecord, MetastoreError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "INSERT INTO recording_rules (tenant, name, spec, source, live_from_ms, updated_at_ms)
                 VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (tenant, name) DO UPDATE SET spec = excluded.spec,
                    source = excluded.source, updated_at_ms = excluded.updated_at_ms
                 RETURNING tenant, name, spec, source, live_from_ms, updated_at_ms",
                &[
                    &record.tenant,
                    &record.name,
                    &record.spec,
                    &record.source,
                    &record.live_from_ms,
                    &record.updated_at_ms,
                ],
            )
            .await?;
        Ok(rule_from_row(&row))
    }

    pub async fn delete_recording_rule(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<bool, MetastoreError> {
        let client = self.client().await?;
        Ok(client
            .execute(
                "DELETE FROM recording_rules WHERE tenant = $1 AND name = $2",
                &[&tenant, &name],
            )
            .await?
            > 0)
    }

    pub async fn record_backfill(
        &self,
        tenant: &str,
        rule: &str,
        from_ms: i64,
        until_ms: i64,
        exports: Exports,
    ) -> Result<(), MetastoreError> {
        let mut client = self.client().await?;
        let transaction = client.transaction().await?;
        // Two backfills of one rule at once: the second waits here, then sees the first.
        transaction
            .execute(
                "SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2, 0))",
                &[&tenant, &rule],
            )
            .await?;
        if let Some(row) = transaction
            .query_opt(
                "SELECT from_ms, until_ms FROM rule_backfills
                 WHERE tenant = $1 AND rule = $2 AND from_ms < $4 AND until_ms > $3 LIMIT 1",
                &[&tenant, &rule, &from_ms, &until_ms],
            )
            .await?
        {
            let (from, until): (i64, i64) = (row.get(0), row.get(1));
            return Err(MetastoreError::Conflict(format!(
                "rule {rule} was already backfilled over [{from}, {until}) ms"
            )));
        }
        transaction
            .execute(
                "INSERT INTO rule_backfills (tenant, rule, from_ms, until_ms, done_at_ms) VALUES ($1, $2, $3, $4, $5)",
                &[&tenant, &rule, &from_ms, &until_ms, &now_ms()],
            )
            .await?;
        add_exports(&transaction, &exports).await?;
        transaction.commit().await?;
        Ok(())
    }

    pub async fn record_version_check(
        &self,
        check: VersionCheck,
        findings: Vec<RegressionRecord>,
    ) -> Result<bool, MetastoreError> {
        let mut client = self.client().await?;
        let transaction = client.transaction().await?;
        let inserted = transaction
            .execute(
                "INSERT INTO version_checks (tenant, service, profile_type, version_label, new_version, old_version, checked_at_ms, outcome)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
                &[
                    &check.tenant,
                    &check.service,
                    &check.profile_type,
                    &check.version_label,
                    &check.new_version,
                    &check.old_version,
                    &check.checked_at_ms,
                    &check.outcome,
                ],
            )
            .await?;
        if inserted == 0 {
            return Ok(false);
        }
        for finding in &findings {
            transaction
                .execute(
                    "INSERT INTO regressions (tenant, service, profile_type, version_label, new_version, function, detected_at_ms, finding)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
                    &[
                        &finding.tenant,
                        &finding.service,
                        &finding.profile_type,
                        &finding.version_label,
                        &finding.new_version,
                        &finding.function,
                        &finding.detected_at_ms,
                        &finding.finding,
                    ],
                )
                .await?;
        }
        transaction.commit().await?;
        Ok(true)
    }

    pub async fn version_checked(
        &self,
        tenant: &str,
        service: &str,
        profile_type: &str,
        version_label: &str,
        new_version: &str,
    ) -> Result<bool, MetastoreError> {
        let client = self.client().await?;
        Ok(client
            .query_opt(
                "SELECT 1 FROM version_checks WHERE tenant = $1 AND service = $2
                 AND profile_type = $3 AND version_label = $4 AND new_version = $5",
                &[
                    &tenant,
                    &service,
                    &profile_type,
                    &version_label,
                    &new_version,
                ],
            )
            .await?
            .is_some())
    }

    pub async fn regressions(
        &self,
        tenant: &str,
        service: Option<String>,
        since_ms: i64,
    ) -> Result<Vec<RegressionRecord>, MetastoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT tenant, service, profile_type, version_label, new_version, function, detected_at_ms, finding
                 FROM regressions WHERE tenant = $1 AND detected_at_ms >= $2 AND ($3::TEXT IS NULL OR service = $3)
                 ORDER BY detected_at_ms DESC, service, function",
                &[&tenant, &since_ms, &service],
            )
            .await?;
        Ok(rows
            .into_iter()
            .map(|row| RegressionRecord {
                tenant: row.get(0),
                service: row.get(1),
                profile_type: row.get(2),
                version_label: row.get(3),
                new_version: row.get(4),
                function: row.get(5),
                detected_at_ms: row.get(6),
                finding: row.get(7),
            })
            .collect())
    }

    pub async fn claim_exports(
        &self,
        target: &str,
        due_before_ms: i64,
        limit: usize,
    ) -> Result<Vec<OutboxSample>, MetastoreError> {
        let mut client = self.client().await?;
        let transaction = client.transaction().await?;
        let rows = transaction
            .query(
                "UPDATE rule_samples SET state = $2 WHERE (target, tenant, rule, series, ts_ms) IN (
                    SELECT target, tenant, rule, series, ts_ms FROM rule_samples
                    WHERE target = $1 AND (state = $2 OR (state = $3 AND ts_ms < $4))
                    ORDER BY state DESC, ts_ms, tenant, rule, series LIMIT $5 FOR UPDATE)
                 RETURNING tenant, rule, series, ts_ms, value",
                &[
                    &target,
                    &CLAIMED,
                    &PENDING,
                    &due_before_ms,
                    &(limit as i64),
                ],
            )
            .await?;
        transaction.commit().await?;
        let mut samples: Vec<OutboxSample> = rows
            .iter()
            .map(|row| OutboxSample {
                tenant: row.get(0),
                rule: row.get(1),
                series: row.get(2),
                ts_ms: row.get(3),
                value: row.get(4),
            })
            .collect();
        samples.sort_by(|a, b| {
            (a.ts_ms, &a.tenant, &a.rule, &a.series).cmp(&(b.ts_ms, &b.tenant, &b.rule, &b.series))
        });
        Ok(samples)
    }

    pub async fn ack_exports(
        &self,
        target: &str,
        samples: Vec<OutboxSample>,
    ) -> Result<(), MetastoreError> {
        let mut client = self.client().await?;
        let transaction = client.transaction().await?;
        let ack = transaction
            .prepare_cached(
                "UPDATE rule_samples SET state = $1 WHERE target = $2 AND tenant = $3
                 AND rule = $4 AND series = $5 AND ts_ms = $6",
            )
            .await?;
        for sample in &samples {
            transaction
                .execute(
                    &ack,
                    &[
                        &DELIVERED,
                        &target,
                        &sample.tenant,
                        &sample.rule,
                        &sample.series,
                        &sample.ts_ms,
                    ],
                )
                .await?;
        }
        transaction.commit().await?;
        Ok(())
    }

    pub async fn prune_exports(&self, before_ms: i64) -> Result<usize, MetastoreError> {
        let client = self.client().await?;
        Ok(client
            .execute(
                "DELETE FROM rule_samples WHERE state = $1 AND ts_ms < $2",
                &[&DELIVERED, &before_ms],
            )
            .await? as usize)
    }

    pub async fn export_backlog(&self, target: &str) -> Result<i64, MetastoreError> {
        let client = self.client().await?;
        Ok(client
            .query_one(
                "SELECT COUNT(*) FROM rule_samples WHERE target = $1 AND state < $2",
                &[&target, &DELIVERED],
            )
            .await?
            .get(0))
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

    pub async fn heartbeat(&self, node: &NodeRecord) -> Result<(), MetastoreError> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO nodes (id, roles, address, started_at_ms, heartbeat_at_ms, lease_expires_at_ms, left_at_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, NULL)
                 ON CONFLICT (id) DO UPDATE SET roles = excluded.roles, address = excluded.address,
                   started_at_ms = excluded.started_at_ms, heartbeat_at_ms = excluded.heartbeat_at_ms,
                   lease_expires_at_ms = excluded.lease_expires_at_ms, left_at_ms = NULL",
                &[
                    &node.id,
                    &node.roles.join(","),
                    &node.address,
                    &node.started_at_ms,
                    &node.heartbeat_at_ms,
                    &node.lease_expires_at_ms,
                ],
            )
            .await?;
        Ok(())
    }

    pub async fn leave(&self, id: &str) -> Result<(), MetastoreError> {
        let client = self.client().await?;
        client
            .execute(
                "UPDATE nodes SET left_at_ms = $2, lease_expires_at_ms = LEAST(lease_expires_at_ms, $2) WHERE id = $1",
                &[&id, &now_ms()],
            )
            .await?;
        Ok(())
    }

    pub async fn nodes(&self) -> Result<Vec<NodeRecord>, MetastoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT id, roles, address, started_at_ms, heartbeat_at_ms, lease_expires_at_ms, left_at_ms
                 FROM nodes ORDER BY id",
                &[],
            )
            .await?;
        rows.iter()
            .map(|row| {
                Ok(NodeRecord {
                    id: row.try_get(0)?,
                    roles: crate::split_roles(row.try_get(1)?),
                    address: row.try_get(2)?,
                    started_at_ms: row.try_get(3)?,
                    heartbeat_at_ms: row.try_get(4)?,
                    lease_expires_at_ms: row.try_get(5)?,
                    left_at_ms: row.try_get(6)?,
                })
            })
            .collect()
    }

    pub async fn forget_nodes(&self, before_ms: i64) -> Result<usize, MetastoreError> {
        let client = self.client().await?;
        let deleted = client
            .execute(
                "DELETE FROM nodes WHERE heartbeat_at_ms < $1",
                &[&before_ms],
            )
            .await?;
        Ok(deleted as usize)
    }
}

/// Adds each sample to each target's outbox (see the crate docs and SQLite's twin).
async fn add_exports(
    transaction: &Transaction<'_>,
    exports: &Exports,
) -> Result<(), MetastoreError> {
    if exports.is_empty() {
        return Ok(());
    }
    let newest = transaction
        .prepare_cached(
            "SELECT MAX(ts_ms) FROM rule_samples WHERE target = $1 AND tenant = $2 AND rule = $3
             AND series = $4 AND ts_ms >= $5 AND ts_ms < $6",
        )
        .await?;
    let upsert = transaction
        .prepare_cached(
            "INSERT INTO rule_samples (target, tenant, rule, series, ts_ms, value, state)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (target, tenant, rule, series, ts_ms)
             DO UPDATE SET value = rule_samples.value + excluded.value WHERE rule_samples.state = $7",
        )
        .await?;
    for target in &exports.targets {
        for sample in &exports.samples {
            let step_end = sample.step_start_ms + sample.step_ms.max(1);
            let mut ts: i64 = transaction
                .query_one(
                    &newest,
                    &[
                        target,
                        &sample.tenant,
                        &sample.rule,
                        &sample.series,
                        &sample.step_start_ms,
                        &step_end,
                    ],
                )
                .await?
                .get::<_, Option<i64>>(0)
                .unwrap_or(sample.step_start_ms);
            while transaction
                .execute(
                    &upsert,
                    &[
                        target,
                        &sample.tenant,
                        &sample.rule,
                        &sample.series,
                        &ts,
                        &sample.value,
                        &PENDING,
                    ],
                )
                .await?
                == 0
            {
                ts += 1;
            }
        }
    }
    Ok(())
}

fn rule_from_row(row: &Row) -> RuleRecord {
    RuleRecord {
        tenant: row.get(0),
        name: row.get(1),
        spec: row.get(2),
        source: row.get(3),
        live_from_ms: row.get(4),
        updated_at_ms: row.get(5),
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
