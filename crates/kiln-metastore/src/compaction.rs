//! What compaction asks and changes: the live datasets of a level and how far behind it
//! is, the leases that let several compactors share the work, the atomic swap of merged
//! datasets (with the rule samples they carry), and promotion of a block in place.

use crate::datasets::{
    dataset_columns, dataset_from_row, insert_block, tombstone_empty, DATASET_COLUMNS,
};
use crate::rules::add_exports;
use crate::sql::{args, Sql};
use crate::{
    now_ms, BlockMeta, DatasetMeta, DatasetRef, Exports, LeaseKey, LevelBacklog, Metastore,
    MetastoreError,
};

impl Metastore {
    /// Live datasets of blocks at `level`, with their block's creation time.
    pub async fn datasets_at_level(
        &self,
        level: u32,
    ) -> Result<Vec<(DatasetMeta, i64)>, MetastoreError> {
        run!(self, read, |sql| async move {
            sql.query(
                concat!(
                    "SELECT ",
                    dataset_columns!(),
                    ", b.created_at_ms
                     FROM datasets d JOIN blocks b ON b.id = d.block_id
                     WHERE b.level = $1 AND b.deleted_at_ms IS NULL
                     ORDER BY d.tenant, d.service, d.min_time_nanos, d.block_id, d.row_group"
                ),
                args![level],
            )
            .await?
            .into_iter()
            .map(|row| {
                let created = row.int(DATASET_COLUMNS)?;
                Ok((dataset_from_row(row)?, created))
            })
            .collect()
        })
    }

    /// What waits at `level`: indexed aggregates over its live blocks, cheap enough to
    /// poll every second while compaction keeps the level small.
    pub async fn level_backlog(&self, level: u32) -> Result<LevelBacklog, MetastoreError> {
        run!(self, read, |sql| async move {
            let rows = sql
                .query(
                    "SELECT count(*), CAST(avg(b.created_at_ms) AS BIGINT)
                     FROM datasets d JOIN blocks b ON b.id = d.block_id
                     WHERE b.level = $1 AND b.deleted_at_ms IS NULL",
                    args![level],
                )
                .await?;
            match rows.first() {
                Some(row) => Ok(LevelBacklog {
                    datasets: row.unsigned(0)?,
                    mean_created_at_ms: row.opt_int(1)?,
                }),
                None => Ok(LevelBacklog::default()),
            }
        })
    }

    /// Takes the lease on one compaction group unless another owner holds an unexpired one.
    pub async fn acquire_lease(
        &self,
        group: LeaseKey,
        owner: &str,
        ttl_ms: i64,
    ) -> Result<bool, MetastoreError> {
        let owner = owner.to_string();
        run!(self, read, |sql| async move {
            let now = now_ms();
            let changed = sql
                .execute(
                    "INSERT INTO compaction_leases (tenant, service, level, owner, expires_at_ms)
                     VALUES ($1, $2, $3, $4, $5)
                     ON CONFLICT (tenant, service, level) DO UPDATE
                     SET owner = excluded.owner, expires_at_ms = excluded.expires_at_ms
                     WHERE compaction_leases.expires_at_ms < $6 OR compaction_leases.owner = excluded.owner",
                    args![&group.tenant, &group.service, group.level, &owner, now + ttl_ms, now],
                )
                .await?;
            Ok(changed == 1)
        })
    }

    pub async fn release_lease(&self, group: LeaseKey, owner: &str) -> Result<(), MetastoreError> {
        let owner = owner.to_string();
        run!(self, read, |sql| async move {
            sql.execute(
                "DELETE FROM compaction_leases WHERE tenant = $1 AND service = $2 AND level = $3 AND owner = $4",
                args![&group.tenant, &group.service, group.level, &owner],
            )
            .await?;
            Ok(())
        })
    }

    /// The atomic swap of compaction: registers `block` with `datasets` and removes the
    /// `replaced` datasets in one transaction, tombstoning blocks left without datasets
    /// as of `block`'s creation (the caller's clock, which its grace period is read by).
    /// `exports` (rule samples of the replaced level-0 datasets) are committed with it.
    /// If any replaced dataset is already gone (another compactor or retention got there
    /// first) nothing changes and the answer is [`MetastoreError::Conflict`].
    pub async fn replace_datasets(
        &self,
        block: BlockMeta,
        datasets: Vec<DatasetMeta>,
        replaced: Vec<DatasetRef>,
        exports: Exports,
    ) -> Result<(), MetastoreError> {
        let exports = exports.sorted();
        run!(self, write, |sql| async move {
            for dataset in &replaced {
                let deleted = sql
                    .execute(
                        "DELETE FROM datasets WHERE block_id = $1 AND row_group = $2",
                        args![&dataset.block_id, dataset.row_group],
                    )
                    .await?;
                if deleted != 1 {
                    // The transaction is rolled back.
                    return Err(MetastoreError::Conflict(format!(
                        "dataset {}#{} is no longer registered",
                        dataset.block_id, dataset.row_group
                    )));
                }
            }
            insert_block(sql, &block, &datasets).await?;
            let mut blocks: Vec<String> = replaced.iter().map(|d| d.block_id.clone()).collect();
            blocks.sort_unstable();
            blocks.dedup();
            tombstone_empty(sql, &blocks, block.created_at_ms).await?;
            add_exports(sql, &exports).await
        })
    }

    /// Raises each block, given with the number of datasets the caller saw in it, from
    /// `level` to the next, in place, where it is live, at `level`, and holds exactly
    /// that many datasets, which it keeps: a segment whose every dataset is its service's
    /// lone one already is what copies of them would be, so compaction moves it with a
    /// row update instead of a write per service. One transaction for all; returns the
    /// blocks raised (the others changed meanwhile and are left as they are). Their
    /// `created_at_ms` becomes `now_ms`, as a new block's would.
    ///
    /// On PostgreSQL a swap that deletes one of the block's datasets meanwhile either
    /// commits first (the count then differs) or tombstones the raised block's row of it
    /// after this commits: each dataset lives in one place either way.
    pub async fn promote_blocks(
        &self,
        blocks: Vec<(String, u32)>,
        level: u32,
        now_ms: i64,
    ) -> Result<Vec<String>, MetastoreError> {
        if blocks.is_empty() {
            return Ok(Vec::new());
        }
        run!(self, write, |sql| async move {
            let mut promoted = Vec::new();
            for (id, datasets) in blocks {
                let raised = sql
                    .execute(
                        "UPDATE blocks SET level = $2 + 1, created_at_ms = $3
                         WHERE id = $1 AND level = $2 AND deleted_at_ms IS NULL
                           AND (SELECT count(*) FROM datasets WHERE block_id = $1) = $4",
                        args![&id, level, now_ms, datasets],
                    )
                    .await?;
                if raised == 1 {
                    promoted.push(id);
                }
            }
            Ok(promoted)
        })
    }
}
