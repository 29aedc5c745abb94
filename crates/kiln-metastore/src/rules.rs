//! Recording rules: their definitions per tenant, the ranges backfilled, and the outbox of
//! samples per remote-write target, claimed by a sender and acknowledged by it (the crate
//! docs give the states and why a claimed row never changes).

use crate::sql::{args, Dialect, Row, Sql};
use crate::{
    now_ms, Exports, Metastore, MetastoreError, OutboxSample, RuleRecord, CLAIMED, DELIVERED,
    PENDING,
};

impl Metastore {
    /// Recording rules, of one tenant or of all.
    pub async fn recording_rules(
        &self,
        tenant: Option<String>,
    ) -> Result<Vec<RuleRecord>, MetastoreError> {
        run!(self, read, |sql| async move {
            sql.query(RULES_OF_TENANT, args![&tenant])
                .await?
                .into_iter()
                .map(rule_from_row)
                .collect()
        })
    }

    /// Creates or updates a rule; an update keeps `live_from_ms`. Returns the stored row.
    pub async fn put_recording_rule(
        &self,
        record: RuleRecord,
    ) -> Result<RuleRecord, MetastoreError> {
        run!(self, read, |sql| async move {
            let stored = sql
                .query(
                    "INSERT INTO recording_rules (tenant, name, spec, source, live_from_ms, updated_at_ms)
                     VALUES ($1, $2, $3, $4, $5, $6)
                     ON CONFLICT (tenant, name) DO UPDATE SET spec = excluded.spec,
                        source = excluded.source, updated_at_ms = excluded.updated_at_ms
                     RETURNING tenant, name, spec, source, live_from_ms, updated_at_ms",
                    args![
                        &record.tenant,
                        &record.name,
                        &record.spec,
                        &record.source,
                        record.live_from_ms,
                        record.updated_at_ms
                    ],
                )
                .await?;
            match stored.into_iter().next() {
                Some(row) => rule_from_row(row),
                None => Err(MetastoreError::Missing("the stored recording rule")),
            }
        })
    }

    /// Removes a rule; false when there was none. Samples already computed still go out.
    pub async fn delete_recording_rule(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<bool, MetastoreError> {
        let (tenant, name) = (tenant.to_string(), name.to_string());
        run!(self, read, |sql| async move {
            Ok(sql
                .execute(
                    "DELETE FROM recording_rules WHERE tenant = $1 AND name = $2",
                    args![&tenant, &name],
                )
                .await?
                > 0)
        })
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
        let (tenant, rule) = (tenant.to_string(), rule.to_string());
        run!(self, write, |sql| async move {
            if sql.dialect() == Dialect::Postgres {
                // Two backfills of one rule at once: the second waits here, then sees the
                // first. (SQLite's one connection serialises them already.)
                sql.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2, 0))",
                    args![&tenant, &rule],
                )
                .await?;
            }
            let overlapping = sql
                .query(
                    "SELECT from_ms, until_ms FROM rule_backfills
                     WHERE tenant = $1 AND rule = $2 AND from_ms < $4 AND until_ms > $3 LIMIT 1",
                    args![&tenant, &rule, from_ms, until_ms],
                )
                .await?;
            if let Some(row) = overlapping.first() {
                let (from, until) = (row.int(0)?, row.int(1)?);
                return Err(MetastoreError::Conflict(format!(
                    "rule {rule} was already backfilled over [{from}, {until}) ms"
                )));
            }
            sql.execute(
                "INSERT INTO rule_backfills (tenant, rule, from_ms, until_ms, done_at_ms) VALUES ($1, $2, $3, $4, $5)",
                args![&tenant, &rule, from_ms, until_ms, now_ms()],
            )
            .await?;
            add_exports(sql, &exports).await
        })
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
        let target = target.to_string();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        run!(self, write, |sql| async move {
            match sql.dialect() {
                Dialect::Postgres => {
                    // Locked as claimed, so two senders of one target claim apart.
                    let rows = sql
                        .query(
                            "UPDATE rule_samples SET state = $2 WHERE (target, tenant, rule, series, ts_ms) IN (
                                SELECT target, tenant, rule, series, ts_ms FROM rule_samples
                                WHERE target = $1 AND (state = $2 OR (state = $3 AND ts_ms < $4))
                                ORDER BY state DESC, ts_ms, tenant, rule, series LIMIT $5 FOR UPDATE)
                             RETURNING tenant, rule, series, ts_ms, value",
                            args![&target, CLAIMED, PENDING, due_before_ms, limit],
                        )
                        .await?;
                    let mut samples = rows
                        .into_iter()
                        .map(sample_from_row)
                        .collect::<Result<Vec<_>, _>>()?;
                    samples.sort_by(|a, b| {
                        (a.ts_ms, &a.tenant, &a.rule, &a.series)
                            .cmp(&(b.ts_ms, &b.tenant, &b.rule, &b.series))
                    });
                    Ok(samples)
                }
                Dialect::Sqlite => {
                    // Two index ranges, so the cost follows the backlog, not the delivered
                    // rows kept for late data.
                    let rows = sql
                        .query(
                            "SELECT tenant, rule, series, ts_ms, value, state FROM (
                                SELECT tenant, rule, series, ts_ms, value, state FROM rule_samples
                                WHERE target = $1 AND state = $2
                                UNION ALL
                                SELECT tenant, rule, series, ts_ms, value, state FROM rule_samples
                                WHERE target = $1 AND state = $3 AND ts_ms < $4)
                             ORDER BY state DESC, ts_ms, tenant, rule, series LIMIT $5",
                            args![&target, CLAIMED, PENDING, due_before_ms, limit],
                        )
                        .await?;
                    let mut samples = Vec::with_capacity(rows.len());
                    for row in rows {
                        let pending = row.int(5)? == i64::from(PENDING);
                        let sample = sample_from_row(row)?;
                        if pending {
                            sql.execute(
                                "UPDATE rule_samples SET state = $1 WHERE target = $2 AND tenant = $3
                                 AND rule = $4 AND series = $5 AND ts_ms = $6 AND state = $7",
                                args![
                                    CLAIMED,
                                    &target,
                                    &sample.tenant,
                                    &sample.rule,
                                    &sample.series,
                                    sample.ts_ms,
                                    PENDING
                                ],
                            )
                            .await?;
                        }
                        samples.push(sample);
                    }
                    Ok(samples)
                }
            }
        })
    }

    /// Marks claimed rows delivered.
    pub async fn ack_exports(
        &self,
        target: &str,
        samples: Vec<OutboxSample>,
    ) -> Result<(), MetastoreError> {
        let target = target.to_string();
        run!(self, write, |sql| async move {
            for sample in &samples {
                sql.execute(
                    "UPDATE rule_samples SET state = $1 WHERE target = $2 AND tenant = $3
                     AND rule = $4 AND series = $5 AND ts_ms = $6",
                    args![
                        DELIVERED,
                        &target,
                        &sample.tenant,
                        &sample.rule,
                        &sample.series,
                        sample.ts_ms
                    ],
                )
                .await?;
            }
            Ok(())
        })
    }

    /// Deletes delivered rows older than `before_ms`; late data for their steps is then
    /// no longer exported (see kiln-rules). Returns how many.
    pub async fn prune_exports(&self, before_ms: i64) -> Result<usize, MetastoreError> {
        run!(self, read, |sql| async move {
            let deleted = sql
                .execute(
                    "DELETE FROM rule_samples WHERE state = $1 AND ts_ms < $2",
                    args![DELIVERED, before_ms],
                )
                .await?;
            Ok(usize::try_from(deleted).unwrap_or(usize::MAX))
        })
    }

    /// Rows of `target` not yet delivered.
    pub async fn export_backlog(&self, target: &str) -> Result<i64, MetastoreError> {
        let target = target.to_string();
        run!(self, read, |sql| async move {
            let rows = sql
                .query(
                    "SELECT COUNT(*) FROM rule_samples WHERE target = $1 AND state < $2",
                    args![&target, DELIVERED],
                )
                .await?;
            rows.first().map_or(Ok(0), |row| row.int(0))
        })
    }
}

const RULES_OF_TENANT: &str =
    "SELECT tenant, name, spec, source, live_from_ms, updated_at_ms FROM recording_rules
     WHERE CAST($1 AS TEXT) IS NULL OR tenant = $1 ORDER BY tenant, name";

/// Every tenant's rules, read in the caller's transaction.
pub(crate) async fn all_rules(sql: &mut impl Sql) -> Result<Vec<RuleRecord>, MetastoreError> {
    let none: Option<String> = None;
    sql.query(RULES_OF_TENANT, args![&none])
        .await?
        .into_iter()
        .map(rule_from_row)
        .collect()
}

/// Adds each sample to each target's outbox: into the step's newest row while it is
/// pending, else as a new row one millisecond after the step's newest (crate docs).
pub(crate) async fn add_exports(
    sql: &mut impl Sql,
    exports: &Exports,
) -> Result<(), MetastoreError> {
    if exports.is_empty() {
        return Ok(());
    }
    for target in &exports.targets {
        for sample in &exports.samples {
            let step_end = sample.step_start_ms + sample.step_ms.max(1);
            let newest = sql
                .query(
                    "SELECT MAX(ts_ms) FROM rule_samples WHERE target = $1 AND tenant = $2 AND rule = $3
                     AND series = $4 AND ts_ms >= $5 AND ts_ms < $6",
                    args![
                        target,
                        &sample.tenant,
                        &sample.rule,
                        &sample.series,
                        sample.step_start_ms,
                        step_end
                    ],
                )
                .await?;
            let mut ts = match newest.first() {
                Some(row) => row.opt_int(0)?,
                None => None,
            }
            .unwrap_or(sample.step_start_ms);
            while sql
                .execute(
                    "INSERT INTO rule_samples (target, tenant, rule, series, ts_ms, value, state)
                     VALUES ($1, $2, $3, $4, $5, $6, $7)
                     ON CONFLICT (target, tenant, rule, series, ts_ms)
                     DO UPDATE SET value = rule_samples.value + excluded.value WHERE rule_samples.state = $7",
                    args![
                        target,
                        &sample.tenant,
                        &sample.rule,
                        &sample.series,
                        ts,
                        sample.value,
                        PENDING
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

/// Columns: tenant, rule, series, ts, value.
fn sample_from_row(mut row: Row) -> Result<OutboxSample, MetastoreError> {
    Ok(OutboxSample {
        tenant: row.text(0)?,
        rule: row.text(1)?,
        series: row.text(2)?,
        ts_ms: row.int(3)?,
        value: row.int(4)?,
    })
}

/// Columns: tenant, name, spec, source, live from, updated.
fn rule_from_row(mut row: Row) -> Result<RuleRecord, MetastoreError> {
    Ok(RuleRecord {
        tenant: row.text(0)?,
        name: row.text(1)?,
        spec: row.text(2)?,
        source: row.text(3)?,
        live_from_ms: row.int(4)?,
        updated_at_ms: row.int(5)?,
    })
}
