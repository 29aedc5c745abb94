//! The embedded SQLite backend: WAL mode with `synchronous=FULL`, so a committed
//! registration survives power loss, and one connection behind a mutex (SQLite serialises
//! writers anyway; reads are short index lookups).

use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::{params, Connection, OptionalExtension};

use crate::now_ms;
use crate::{
    BlockMeta, DatasetMeta, DatasetQuery, DatasetRef, Exports, LeaseKey, LevelBacklog,
    MetastoreError, NodeRecord, OutboxSample, RegressionRecord, RuleRecord, VersionCheck,
    WriteIdentity, CLAIMED, DELIVERED, LEVEL_BACKLOG, MIGRATIONS, PENDING, PROMOTE_BLOCK,
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

/// `Connection::execute` prepares its statement on every call, and the write path and
/// compaction run the same few statements many times a second.
fn execute_cached(
    connection: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> rusqlite::Result<usize> {
    connection.prepare_cached(sql)?.execute(params)
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
        execute_cached(
            &transaction,
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
                // Room for every statement the metastore runs (rusqlite keeps 16).
                connection.set_prepared_statement_cache_capacity(64);
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
        // A transaction is charged to the role that asked for it (compaction's commits).
        let account = kiln_runtime::priority::current_account();
        tokio::task::spawn_blocking(move || {
            let mut guard = connection.lock().map_err(|_| MetastoreError::Poisoned)?;
            kiln_runtime::priority::charge_blocking(account.as_ref(), || work(&mut guard))
        })
        .await
        .map_err(MetastoreError::Task)?
    }

    pub async fn register_block(
        &self,
        block: BlockMeta,
        datasets: Vec<DatasetMeta>,
        identities: Vec<WriteIdentity>,
    ) -> Result<(), MetastoreError> {
        self.with(move |connection| register(connection, &block, &datasets, &identities))
            .await
    }

    pub async fn write_identities(
        &self,
        now_ms: i64,
    ) -> Result<Vec<WriteIdentity>, MetastoreError> {
        self.with(move |connection| {
            let mut statement = connection.prepare_cached(
                "SELECT identity, expires_at_ms FROM write_identities WHERE expires_at_ms >= ?1",
            )?;
            let rows = statement.query_map(params![now_ms], |row| {
                Ok(WriteIdentity {
                    identity: row.get(0)?,
                    expires_at_ms: row.get(1)?,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// [`SqliteMetastore::register_block`] on the calling thread, which it blocks; for a
    /// thread off the runtime.
    pub fn register_block_blocking(
        &self,
        block: BlockMeta,
        datasets: Vec<DatasetMeta>,
        identities: Vec<WriteIdentity>,
    ) -> Result<(), MetastoreError> {
        let mut guard = self
            .connection
            .lock()
            .map_err(|_| MetastoreError::Poisoned)?;
        register(&mut guard, &block, &datasets, &identities)
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

    pub async fn tombstoned_blocks(
        &self,
        before_ms: i64,
    ) -> Result<Vec<BlockMeta>, MetastoreError> {
        self.with(move |connection| {
            let mut statement = connection.prepare_cached(
                "SELECT id, object_key, level, size_bytes, created_at_ms, deleted_at_ms FROM blocks
                 WHERE deleted_at_ms IS NOT NULL AND deleted_at_ms <= ?1 ORDER BY id",
            )?;
            let rows = statement.query_map(params![before_ms], block_from_row)?;
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

    pub async fn level_backlog(&self, level: u32) -> Result<LevelBacklog, MetastoreError> {
        self.with(move |connection| {
            let mut statement = connection.prepare_cached(LEVEL_BACKLOG)?;
            Ok(statement.query_row(params![level], |row| {
                Ok(LevelBacklog {
                    datasets: row.get::<_, i64>(0)? as u64,
                    mean_created_at_ms: row.get(1)?,
                })
            })?)
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
            let changed = execute_cached(
                connection,
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
            execute_cached(
                connection,
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
        exports: Exports,
    ) -> Result<(), MetastoreError> {
        self.with(move |connection| {
            let transaction = connection.transaction()?;
            for dataset in &replaced {
                let deleted = execute_cached(
                    &transaction,
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
            add_exports(&transaction, &exports)?;
            transaction.commit()?;
            Ok(())
        })
        .await
    }

    pub async fn promote_blocks(
        &self,
        blocks: Vec<(String, u32)>,
        level: u32,
    ) -> Result<Vec<String>, MetastoreError> {
        self.with(move |connection| {
            let transaction = connection.transaction()?;
            let mut promoted = Vec::new();
            {
                // SQLite takes `$2` as a name, bound in order of first use; `?2` is the
                // second parameter, as PostgreSQL's `$2` is.
                let mut update = transaction.prepare_cached(&PROMOTE_BLOCK.replace('$', "?"))?;
                let now = now_ms();
                for (id, datasets) in blocks {
                    if update.execute(params![id, level, now, datasets])? == 1 {
                        promoted.push(id);
                    }
                }
            }
            transaction.commit()?;
            Ok(promoted)
        })
        .await
    }

    pub async fn recording_rules(
        &self,
        tenant: Option<String>,
    ) -> Result<Vec<RuleRecord>, MetastoreError> {
        self.with(move |connection| {
            let mut statement = connection.prepare_cached(
                "SELECT tenant, name, spec, source, live_from_ms, updated_at_ms FROM recording_rules
                 WHERE ?1 IS NULL OR tenant = ?1 ORDER BY tenant, name",
            )?;
            let rows = statement.query_map(params![tenant], rule_from_row)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    pub async fn put_recording_rule(
        &self,
        record: RuleRecord,
    ) -> Result<RuleRecord, MetastoreError> {
        self.with(move |connection| {
            let transaction = connection.transaction()?;
            execute_cached(
                &transaction,
                "INSERT INTO recording_rules (tenant, name, spec, source, live_from_ms, updated_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (tenant, name) DO UPDATE SET spec = excluded.spec,
                    source = excluded.source, updated_at_ms = excluded.updated_at_ms",
                params![
                    record.tenant,
                    record.name,
                    record.spec,
                    record.source,
                    record.live_from_ms,
                    record.updated_at_ms
                ],
            )?;
            let stored = transaction.query_row(
                "SELECT tenant, name, spec, source, live_from_ms, updated_at_ms FROM recording_rules
                 WHERE tenant = ?1 AND name = ?2",
                params![record.tenant, record.name],
                rule_from_row,
            )?;
            transaction.commit()?;
            Ok(stored)
        })
        .await
    }

    pub async fn delete_recording_rule(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<bool, MetastoreError> {
        let (tenant, name) = (tenant.to_string(), name.to_string());
        self.with(move |connection| {
            Ok(execute_cached(
                connection,
                "DELETE FROM recording_rules WHERE tenant = ?1 AND name = ?2",
                params![tenant, name],
            )? > 0)
        })
        .await
    }

    pub async fn record_backfill(
        &self,
        tenant: &str,
        rule: &str,
        from_ms: i64,
        until_ms: i64,
        exports: Exports,
    ) -> Result<(), MetastoreError> {
        let (tenant, rule) = (tenant.to_string(), rule.to_string());
        self.with(move |connection| {
            let transaction = connection.transaction()?;
            let overlapping: Option<(i64, i64)> = transaction
                .query_row(
                    "SELECT from_ms, until_ms FROM rule_backfills
                     WHERE tenant = ?1 AND rule = ?2 AND from_ms < ?4 AND until_ms > ?3",
                    params![tenant, rule, from_ms, until_ms],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .optional()?;
            if let Some((from, until)) = overlapping {
                return Err(MetastoreError::Conflict(format!(
                    "rule {rule} was already backfilled over [{from}, {until}) ms"
                )));
            }
            execute_cached(
                &transaction,
                "INSERT INTO rule_backfills (tenant, rule, from_ms, until_ms, done_at_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![tenant, rule, from_ms, until_ms, now_ms()],
            )?;
            add_exports(&transaction, &exports)?;
            transaction.commit()?;
            Ok(())
        })
        .await
    }

    pub async fn record_version_check(
        &self,
        check: VersionCheck,
        findings: Vec<RegressionRecord>,
    ) -> Result<bool, MetastoreError> {
        self.with(move |connection| {
            let transaction = connection.transaction()?;
            let inserted = execute_cached(
                &transaction,
                "INSERT INTO version_checks (tenant, service, profile_type, version_label, new_version, old_version, checked_at_ms, outcome)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT DO NOTHING",
                params![
                    check.tenant,
                    check.service,
                    check.profile_type,
                    check.version_label,
                    check.new_version,
                    check.old_version,
                    check.checked_at_ms,
                    check.outcome
                ],
            )?;
            if inserted == 0 {
                return Ok(false);
            }
            for finding in &findings {
                execute_cached(
                    &transaction,
                    "INSERT INTO regressions (tenant, service, profile_type, version_label, new_version, function, detected_at_ms, finding)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT DO NOTHING",
                    params![
                        finding.tenant,
                        finding.service,
                        finding.profile_type,
                        finding.version_label,
                        finding.new_version,
                        finding.function,
                        finding.detected_at_ms,
                        finding.finding
                    ],
                )?;
            }
            transaction.commit()?;
            Ok(true)
        })
        .await
    }

    pub async fn version_checked(
        &self,
        tenant: &str,
        service: &str,
        profile_type: &str,
        version_label: &str,
        new_version: &str,
    ) -> Result<bool, MetastoreError> {
        let key = [tenant, service, profile_type, version_label, new_version].map(str::to_string);
        self.with(move |connection| {
            Ok(connection
                .query_row(
                    "SELECT 1 FROM version_checks WHERE tenant = ?1 AND service = ?2
                     AND profile_type = ?3 AND version_label = ?4 AND new_version = ?5",
                    params![key[0], key[1], key[2], key[3], key[4]],
                    |_| Ok(()),
                )
                .optional()?
                .is_some())
        })
        .await
    }

    pub async fn regressions(
        &self,
        tenant: &str,
        service: Option<String>,
        since_ms: i64,
    ) -> Result<Vec<RegressionRecord>, MetastoreError> {
        let tenant = tenant.to_string();
        self.with(move |connection| {
            let mut statement = connection.prepare_cached(
                "SELECT tenant, service, profile_type, version_label, new_version, function, detected_at_ms, finding
                 FROM regressions WHERE tenant = ?1 AND detected_at_ms >= ?2 AND (?3 IS NULL OR service = ?3)
                 ORDER BY detected_at_ms DESC, service, function",
            )?;
            let rows = statement
                .query_map(params![tenant, since_ms, service], |row| {
                    Ok(RegressionRecord {
                        tenant: row.get(0)?,
                        service: row.get(1)?,
                        profile_type: row.get(2)?,
                        version_label: row.get(3)?,
                        new_version: row.get(4)?,
                        function: row.get(5)?,
                        detected_at_ms: row.get(6)?,
                        finding: row.get(7)?,
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }

    pub async fn claim_exports(
        &self,
        target: &str,
        due_before_ms: i64,
        limit: usize,
    ) -> Result<Vec<OutboxSample>, MetastoreError> {
        let target = target.to_string();
        self.with(move |connection| {
            let transaction = connection.transaction()?;
            let rows = {
                // Two index ranges, so the cost follows the backlog, not the delivered
                // rows kept for late data.
                let mut statement = transaction.prepare_cached(
                    "SELECT tenant, rule, series, ts_ms, value, state FROM (
                        SELECT tenant, rule, series, ts_ms, value, state FROM rule_samples
                        WHERE target = ?1 AND state = ?2
                        UNION ALL
                        SELECT tenant, rule, series, ts_ms, value, state FROM rule_samples
                        WHERE target = ?1 AND state = ?3 AND ts_ms < ?4)
                     ORDER BY state DESC, ts_ms, tenant, rule, series LIMIT ?5",
                )?;
                let rows = statement.query_map(
                    params![target, CLAIMED, PENDING, due_before_ms, limit as i64],
                    |row| {
                        Ok((
                            OutboxSample {
                                tenant: row.get(0)?,
                                rule: row.get(1)?,
                                series: row.get(2)?,
                                ts_ms: row.get(3)?,
                                value: row.get(4)?,
                            },
                            row.get::<_, i32>(5)?,
                        ))
                    },
                )?;
                rows.collect::<Result<Vec<_>, _>>()?
            };
            {
                let mut claim = transaction.prepare_cached(
                    "UPDATE rule_samples SET state = ?1 WHERE target = ?2 AND tenant = ?3
                     AND rule = ?4 AND series = ?5 AND ts_ms = ?6 AND state = ?7",
                )?;
                for (sample, state) in &rows {
                    if *state == PENDING {
                        claim.execute(params![
                            CLAIMED,
                            target,
                            sample.tenant,
                            sample.rule,
                            sample.series,
                            sample.ts_ms,
                            PENDING
                        ])?;
                    }
                }
            }
            transaction.commit()?;
            Ok(rows.into_iter().map(|(sample, _)| sample).collect())
        })
        .await
    }

    pub async fn ack_exports(
        &self,
        target: &str,
        samples: Vec<OutboxSample>,
    ) -> Result<(), MetastoreError> {
        let target = target.to_string();
        self.with(move |connection| {
            let transaction = connection.transaction()?;
            {
                let mut ack = transaction.prepare_cached(
                    "UPDATE rule_samples SET state = ?1 WHERE target = ?2 AND tenant = ?3
                     AND rule = ?4 AND series = ?5 AND ts_ms = ?6",
                )?;
                for sample in &samples {
                    ack.execute(params![
                        DELIVERED,
                        target,
                        sample.tenant,
                        sample.rule,
                        sample.series,
                        sample.ts_ms
                    ])?;
                }
            }
            transaction.commit()?;
            Ok(())
        })
        .await
    }

    pub async fn prune_exports(&self, before_ms: i64) -> Result<usize, MetastoreError> {
        self.with(move |connection| {
            Ok(execute_cached(
                connection,
                "DELETE FROM rule_samples WHERE state = ?1 AND ts_ms < ?2",
                params![DELIVERED, before_ms],
            )?)
        })
        .await
    }

    pub async fn export_backlog(&self, target: &str) -> Result<i64, MetastoreError> {
        let target = target.to_string();
        self.with(move |connection| {
            Ok(connection.query_row(
                "SELECT COUNT(*) FROM rule_samples WHERE target = ?1 AND state < ?2",
                params![target, DELIVERED],
                |row| row.get(0),
            )?)
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
            let expired = execute_cached(
                &transaction,
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
            execute_cached(
                connection,
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

    pub async fn heartbeat(&self, node: &NodeRecord) -> Result<(), MetastoreError> {
        let node = node.clone();
        self.with(move |connection| {
            execute_cached(
                connection,
                "INSERT INTO nodes (id, roles, address, started_at_ms, heartbeat_at_ms, lease_expires_at_ms, left_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULL)
                 ON CONFLICT (id) DO UPDATE SET roles = excluded.roles, address = excluded.address,
                   started_at_ms = excluded.started_at_ms, heartbeat_at_ms = excluded.heartbeat_at_ms,
                   lease_expires_at_ms = excluded.lease_expires_at_ms, left_at_ms = NULL",
                params![
                    node.id,
                    node.roles.join(","),
                    node.address,
                    node.started_at_ms,
                    node.heartbeat_at_ms,
                    node.lease_expires_at_ms
                ],
            )?;
            Ok(())
        })
        .await
    }

    pub async fn leave(&self, id: &str) -> Result<(), MetastoreError> {
        let id = id.to_string();
        self.with(move |connection| {
            let now = now_ms();
            execute_cached(
                connection,
                "UPDATE nodes SET left_at_ms = ?2, lease_expires_at_ms = MIN(lease_expires_at_ms, ?2) WHERE id = ?1",
                params![id, now],
            )?;
            Ok(())
        })
        .await
    }

    pub async fn nodes(&self) -> Result<Vec<NodeRecord>, MetastoreError> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(
                "SELECT id, roles, address, started_at_ms, heartbeat_at_ms, lease_expires_at_ms, left_at_ms
                 FROM nodes ORDER BY id",
            )?;
            let rows = statement.query_map([], |row| {
                Ok(NodeRecord {
                    id: row.get(0)?,
                    roles: crate::split_roles(&row.get::<_, String>(1)?),
                    address: row.get(2)?,
                    started_at_ms: row.get(3)?,
                    heartbeat_at_ms: row.get(4)?,
                    lease_expires_at_ms: row.get(5)?,
                    left_at_ms: row.get(6)?,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    pub async fn forget_nodes(&self, before_ms: i64) -> Result<usize, MetastoreError> {
        self.with(move |connection| {
            Ok(execute_cached(
                connection,
                "DELETE FROM nodes WHERE heartbeat_at_ms < ?1",
                params![before_ms],
            )?)
        })
        .await
    }
}

/// Adds each sample to each target's outbox: into the step's newest row while it is
/// pending, else as a new row one millisecond after the step's newest (module docs).
fn add_exports(
    transaction: &rusqlite::Transaction<'_>,
    exports: &Exports,
) -> Result<(), MetastoreError> {
    if exports.is_empty() {
        return Ok(());
    }
    let mut newest = transaction.prepare_cached(
        "SELECT MAX(ts_ms) FROM rule_samples WHERE target = ?1 AND tenant = ?2 AND rule = ?3
         AND series = ?4 AND ts_ms >= ?5 AND ts_ms < ?6",
    )?;
    let mut upsert = transaction.prepare_cached(
        "INSERT INTO rule_samples (target, tenant, rule, series, ts_ms, value, state)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT (target, tenant, rule, series, ts_ms)
         DO UPDATE SET value = rule_samples.value + excluded.value WHERE rule_samples.state = ?7",
    )?;
    for target in &exports.targets {
        for sample in &exports.samples {
            let step_end = sample.step_start_ms + sample.step_ms.max(1);
            let mut ts: i64 = newest
                .query_row(
                    params![
                        target,
                        sample.tenant,
                        sample.rule,
                        sample.series,
                        sample.step_start_ms,
                        step_end
                    ],
                    |row| row.get::<_, Option<i64>>(0),
                )?
                .unwrap_or(sample.step_start_ms);
            while upsert.execute(params![
                target,
                sample.tenant,
                sample.rule,
                sample.series,
                ts,
                sample.value,
                PENDING
            ])? == 0
            {
                ts += 1;
            }
        }
    }
    Ok(())
}

fn rule_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<RuleRecord> {
    Ok(RuleRecord {
        tenant: row.get(0)?,
        name: row.get(1)?,
        spec: row.get(2)?,
        source: row.get(3)?,
        live_from_ms: row.get(4)?,
        updated_at_ms: row.get(5)?,
    })
}

/// A block and its datasets, registered in one transaction.
fn register(
    connection: &mut Connection,
    block: &BlockMeta,
    datasets: &[DatasetMeta],
    identities: &[WriteIdentity],
) -> Result<(), MetastoreError> {
    let transaction = connection.transaction()?;
    insert_block(&transaction, block, datasets)?;
    if !identities.is_empty() {
        let mut insert = transaction.prepare_cached(
            "INSERT INTO write_identities (identity, expires_at_ms) VALUES (?1, ?2)
             ON CONFLICT (identity) DO UPDATE SET expires_at_ms = excluded.expires_at_ms",
        )?;
        for identity in identities {
            insert.execute(params![identity.identity, identity.expires_at_ms])?;
        }
        drop(insert);
        execute_cached(
            &transaction,
            "DELETE FROM write_identities WHERE expires_at_ms < ?1",
            params![block.created_at_ms],
        )?;
    }
    transaction.commit()?;
    Ok(())
}

fn insert_block(
    transaction: &rusqlite::Transaction<'_>,
    block: &BlockMeta,
    datasets: &[DatasetMeta],
) -> Result<(), MetastoreError> {
    execute_cached(
        transaction,
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
