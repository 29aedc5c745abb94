//! Blocks and the datasets inside them: registration (with the identities of the writes
//! a segment holds), the time-overlap lookup that plans every query, retention, and the
//! tombstones compaction leaves for deletion.

use crate::sql::{args, texts, Dialect, Row, Sql};
use crate::{
    BlockMeta, DatasetMeta, DatasetQuery, Metastore, MetastoreError, SegmentCounting, WriteIdentity,
};

/// Columns of [`dataset_from_row`], from `datasets d JOIN blocks b`.
macro_rules! dataset_columns {
    () => {
        "d.block_id, b.object_key, d.tenant, d.service, d.row_group, \
         d.min_time_nanos, d.max_time_nanos, d.profile_types, d.profile_count, d.rules_counted"
    };
}
pub(crate) use dataset_columns;

/// How many columns [`dataset_columns`] selects: a query selecting more reads them from
/// this index on. Counted from the list, not written down, so that a new column cannot
/// shift them unseen (one did: the blocks' creation time read `rules_counted`, 0, and
/// every dataset was due at every level, so each pass merged segments through them all).
pub(crate) const DATASET_COLUMNS: usize = {
    let columns = dataset_columns!().as_bytes();
    let (mut count, mut at) = (1, 0);
    while at < columns.len() {
        if columns[at] == b',' {
            count += 1;
        }
        at += 1;
    }
    count
};

impl Metastore {
    /// Registers a block and its datasets in one transaction.
    pub async fn register_block(
        &self,
        block: BlockMeta,
        datasets: Vec<DatasetMeta>,
    ) -> Result<(), MetastoreError> {
        self.register_segment(block, datasets, Vec::new(), None)
            .await
    }

    /// Registers a block and its datasets, and the identities of the writes it holds, in
    /// one transaction: a write is known as stored exactly when its profiles are
    /// visible. Expired identities are deleted in the same transaction. With `counting`,
    /// the recording rules stored at that moment count the segment's profiles in it too:
    /// a segment is registered once (a retry after a crash finds it registered), so each
    /// profile counts once, and a rule saved later starts after these profiles' times.
    pub async fn register_segment(
        &self,
        block: BlockMeta,
        datasets: Vec<DatasetMeta>,
        identities: Vec<WriteIdentity>,
        counting: Option<SegmentCounting>,
    ) -> Result<(), MetastoreError> {
        run!(self, write, |sql| register(
            sql,
            &block,
            &datasets,
            &identities,
            counting.as_ref()
        ))
    }

    /// [`Metastore::register_segment`] from a thread outside the runtime, blocked until
    /// it commits: SQLite commits on that thread, with no hand-off to a blocking thread
    /// and back; PostgreSQL is driven on `runtime`.
    pub fn register_block_blocking(
        &self,
        runtime: &tokio::runtime::Handle,
        block: BlockMeta,
        datasets: Vec<DatasetMeta>,
        identities: Vec<WriteIdentity>,
        counting: Option<SegmentCounting>,
    ) -> Result<(), MetastoreError> {
        match &self.backend {
            crate::Backend::Sqlite(db) => db.write_blocking(|sql| {
                crate::sql::complete(register(
                    sql,
                    &block,
                    &datasets,
                    &identities,
                    counting.as_ref(),
                ))
            }),
            crate::Backend::Postgres(_) => {
                runtime.block_on(self.register_segment(block, datasets, identities, counting))
            }
        }
    }

    /// Identities of stored writes that expire at or after `now_ms`.
    pub async fn write_identities(
        &self,
        now_ms: i64,
    ) -> Result<Vec<WriteIdentity>, MetastoreError> {
        run!(self, read, |sql| async move {
            sql.query(
                "SELECT high, low, MAX(expires_at_ms) FROM write_identities
                 WHERE expires_at_ms >= $1 GROUP BY high, low",
                args![now_ms],
            )
            .await?
            .into_iter()
            .map(|row| {
                Ok(WriteIdentity {
                    identity: identity_text(row.int(0)?, row.int(1)?),
                    expires_at_ms: row.int(2)?,
                })
            })
            .collect()
        })
    }

    /// Datasets of one tenant (and service) overlapping a time range, oldest first.
    pub async fn list_datasets(
        &self,
        query: DatasetQuery,
    ) -> Result<Vec<DatasetMeta>, MetastoreError> {
        run!(self, read, |sql| async move {
            sql.query(
                concat!(
                    "SELECT ",
                    dataset_columns!(),
                    " FROM datasets d JOIN blocks b ON b.id = d.block_id
                     WHERE d.tenant = $1 AND (CAST($2 AS TEXT) IS NULL OR d.service = $2)
                       AND d.max_time_nanos >= $3 AND d.min_time_nanos <= $4
                     ORDER BY d.min_time_nanos, d.block_id, d.row_group"
                ),
                args![
                    &query.tenant,
                    &query.service,
                    query.from_nanos,
                    query.to_nanos
                ],
            )
            .await?
            .into_iter()
            .map(dataset_from_row)
            .collect()
        })
    }

    pub async fn list_blocks(&self) -> Result<Vec<BlockMeta>, MetastoreError> {
        run!(self, read, |sql| async move {
            sql.query(
                "SELECT id, object_key, level, size_bytes, created_at_ms, deleted_at_ms FROM blocks ORDER BY id",
                &[],
            )
            .await?
            .into_iter()
            .map(block_from_row)
            .collect()
        })
    }

    /// Blocks tombstoned at or before `before_ms`, whose objects are due for deletion.
    /// Compaction asks every pass; listing every block instead read the whole table, which
    /// grows with retention, each time (docs/benchmarks.md, session 33).
    pub async fn tombstoned_blocks(
        &self,
        before_ms: i64,
    ) -> Result<Vec<BlockMeta>, MetastoreError> {
        run!(self, read, |sql| async move {
            sql.query(
                "SELECT id, object_key, level, size_bytes, created_at_ms, deleted_at_ms FROM blocks
                 WHERE deleted_at_ms IS NOT NULL AND deleted_at_ms <= $1 ORDER BY id",
                args![before_ms],
            )
            .await?
            .into_iter()
            .map(block_from_row)
            .collect()
        })
    }

    /// Removes the tenant's datasets whose newest profile is older than `before_nanos`;
    /// returns how many. Blocks left empty are tombstoned as of `now_ms` (the caller's
    /// clock, which its grace period is read by).
    pub async fn expire_datasets(
        &self,
        tenant: &str,
        before_nanos: i64,
        now_ms: i64,
    ) -> Result<usize, MetastoreError> {
        let tenant = tenant.to_string();
        run!(self, write, |sql| async move {
            let mut blocks = texts(
                sql.query(
                    "DELETE FROM datasets WHERE tenant = $1 AND max_time_nanos < $2 RETURNING block_id",
                    args![&tenant, before_nanos],
                )
                .await?,
            )?;
            let expired = blocks.len();
            blocks.sort_unstable();
            blocks.dedup();
            tombstone_empty(sql, &blocks, now_ms).await?;
            Ok(expired)
        })
    }

    /// Every tenant with at least one dataset.
    pub async fn tenants(&self) -> Result<Vec<String>, MetastoreError> {
        run!(self, read, |sql| async move {
            texts(
                sql.query("SELECT DISTINCT tenant FROM datasets ORDER BY tenant", &[])
                    .await?,
            )
        })
    }

    /// Forgets a tombstoned block, once its object is deleted.
    pub async fn delete_block(&self, id: &str) -> Result<(), MetastoreError> {
        let id = id.to_string();
        run!(self, read, |sql| async move {
            sql.execute(
                "DELETE FROM blocks WHERE id = $1 AND deleted_at_ms IS NOT NULL",
                args![&id],
            )
            .await?;
            Ok(())
        })
    }

    /// Services of a tenant with data overlapping `[from, to]`.
    pub async fn services(
        &self,
        tenant: &str,
        from_nanos: i64,
        to_nanos: i64,
    ) -> Result<Vec<String>, MetastoreError> {
        let tenant = tenant.to_string();
        run!(self, read, |sql| async move {
            texts(
                sql.query(
                    "SELECT DISTINCT service FROM datasets
                     WHERE tenant = $1 AND max_time_nanos >= $2 AND min_time_nanos <= $3 ORDER BY service",
                    args![&tenant, from_nanos, to_nanos],
                )
                .await?,
            )
        })
    }

    pub async fn schema_version(&self) -> Result<i64, MetastoreError> {
        run!(self, read, |sql| async move {
            match sql
                .query(
                    "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
                    &[],
                )
                .await?
                .first()
            {
                Some(row) => row.int(0),
                None => Ok(0),
            }
        })
    }
}

/// A block, its datasets, the identities of the writes it holds, and what the rules
/// count of it.
async fn register(
    sql: &mut impl Sql,
    block: &BlockMeta,
    datasets: &[DatasetMeta],
    identities: &[WriteIdentity],
    counting: Option<&SegmentCounting>,
) -> Result<(), MetastoreError> {
    insert_block(sql, block, datasets).await?;
    if let Some(count) = counting {
        // Asked even without rules: the writer learns from it whether there are any.
        let rules = crate::rules::all_rules(sql).await?;
        for exports in count(&rules) {
            crate::rules::add_exports(sql, &exports.sorted()).await?;
        }
    }
    // Kiln's identities are 32 hex digits (kiln_ingest::dedup); another would be a bug
    // upstream, and costs only the deduplication of its one write.
    let halves: Vec<(i64, i64, i64)> = identities
        .iter()
        .filter_map(|identity| match identity_halves(&identity.identity) {
            Some((high, low)) => Some((identity.expires_at_ms, high, low)),
            None => {
                tracing::warn!(identity = %identity.identity, "write identity not stored: not 32 hex digits");
                None
            }
        })
        .collect();
    if halves.is_empty() {
        return Ok(());
    }
    match sql.dialect() {
        Dialect::Postgres => {
            // One statement for all of them: a round trip per identity would cost a
            // flush of many profiles as many round trips to the server.
            let mut expiries = Vec::with_capacity(halves.len());
            let mut highs = Vec::with_capacity(halves.len());
            let mut lows = Vec::with_capacity(halves.len());
            for &(expires_at_ms, high, low) in &halves {
                expiries.push(expires_at_ms);
                highs.push(high);
                lows.push(low);
            }
            sql.execute(
                "INSERT INTO write_identities (expires_at_ms, high, low)
                 SELECT * FROM UNNEST($1::BIGINT[], $2::BIGINT[], $3::BIGINT[])
                 ON CONFLICT DO NOTHING",
                &[
                    crate::sql::Arg::Ints(expiries),
                    crate::sql::Arg::Ints(highs),
                    crate::sql::Arg::Ints(lows),
                ],
            )
            .await?;
        }
        Dialect::Sqlite => {
            // Local statements: one per identity costs no round trip.
            for &(expires_at_ms, high, low) in &halves {
                sql.execute(
                    "INSERT OR IGNORE INTO write_identities (expires_at_ms, high, low)
                     VALUES ($1, $2, $3)",
                    args![expires_at_ms, high, low],
                )
                .await?;
            }
        }
    }
    sql.execute(
        "DELETE FROM write_identities WHERE expires_at_ms < $1",
        args![block.created_at_ms],
    )
    .await?;
    Ok(())
}

/// A write identity's 128 bits as the two integers stored (big-endian halves).
fn identity_halves(identity: &str) -> Option<(i64, i64)> {
    if identity.len() != 32 || !identity.bytes().all(|byte| byte.is_ascii_hexdigit()) {
        return None;
    }
    let half = |digits: &str| u64::from_str_radix(digits, 16).ok().map(|bits| bits as i64);
    Some((half(identity.get(..16)?)?, half(identity.get(16..)?)?))
}

fn identity_text(high: i64, low: i64) -> String {
    format!("{:016x}{:016x}", high as u64, low as u64)
}

pub(crate) async fn insert_block(
    sql: &mut impl Sql,
    block: &BlockMeta,
    datasets: &[DatasetMeta],
) -> Result<(), MetastoreError> {
    sql.execute(
        "INSERT INTO blocks (id, object_key, level, size_bytes, created_at_ms) VALUES ($1, $2, $3, $4, $5)",
        args![
            &block.id,
            &block.object_key,
            block.level,
            count(block.size_bytes)?,
            block.created_at_ms
        ],
    )
    .await?;
    for dataset in datasets {
        let types = dataset.profile_types.join("\n");
        sql.execute(
            "INSERT INTO datasets (block_id, tenant, service, row_group, min_time_nanos, max_time_nanos, profile_types, profile_count, rules_counted)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            args![
                &block.id,
                &dataset.tenant,
                &dataset.service,
                dataset.row_group,
                dataset.min_time_nanos,
                dataset.max_time_nanos,
                &types,
                count(dataset.profile_count)?,
                i64::from(dataset.rules_counted)
            ],
        )
        .await?;
    }
    Ok(())
}

/// A size or a count as the `BIGINT` that stores it.
fn count(value: u64) -> Result<i64, MetastoreError> {
    i64::try_from(value).map_err(|_| MetastoreError::OutOfRange(value))
}

/// Tombstones, as of `now`, those of `blocks` that have no dataset left.
pub(crate) async fn tombstone_empty(
    sql: &mut impl Sql,
    blocks: &[String],
    now: i64,
) -> Result<(), MetastoreError> {
    if blocks.is_empty() {
        return Ok(());
    }
    match sql.dialect() {
        Dialect::Postgres => {
            let ids = blocks.iter().map(String::as_str).collect();
            sql.execute(
                "UPDATE blocks SET deleted_at_ms = $2
                 WHERE id = ANY($1) AND deleted_at_ms IS NULL
                   AND NOT EXISTS (SELECT 1 FROM datasets WHERE block_id = blocks.id)",
                &[crate::sql::Arg::Texts(ids), now.into()],
            )
            .await?;
        }
        Dialect::Sqlite => {
            for block in blocks {
                sql.execute(
                    "UPDATE blocks SET deleted_at_ms = $2
                     WHERE id = $1 AND deleted_at_ms IS NULL
                       AND NOT EXISTS (SELECT 1 FROM datasets WHERE block_id = $1)",
                    args![block, now],
                )
                .await?;
            }
        }
    }
    Ok(())
}

/// Columns: [`dataset_columns`].
pub(crate) fn dataset_from_row(mut row: Row) -> Result<DatasetMeta, MetastoreError> {
    let types = row.text(7)?;
    Ok(DatasetMeta {
        block_id: row.text(0)?,
        object_key: row.text(1)?,
        tenant: row.text(2)?,
        service: row.text(3)?,
        row_group: row.unsigned(4)?,
        min_time_nanos: row.int(5)?,
        max_time_nanos: row.int(6)?,
        profile_types: types
            .split('\n')
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .collect(),
        profile_count: row.unsigned(8)?,
        rules_counted: row.int(9)? != 0,
    })
}

/// Columns: id, object_key, level, size, created, deleted.
fn block_from_row(mut row: Row) -> Result<BlockMeta, MetastoreError> {
    Ok(BlockMeta {
        id: row.text(0)?,
        object_key: row.text(1)?,
        level: row.unsigned(2)?,
        size_bytes: row.unsigned(3)?,
        created_at_ms: row.int(4)?,
        deleted_at_ms: row.opt_int(5)?,
    })
}
