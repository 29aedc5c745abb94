//! The regression watcher's memory: each (service, type, version) compared once, and the
//! significant changes that comparison found.

use crate::sql::{args, Sql};
use crate::{Metastore, MetastoreError, RegressionRecord, VersionCheck};

impl Metastore {
    /// Records a version check and its findings together; false (and nothing written)
    /// when that version was checked already, so two watchers report it once.
    pub async fn record_version_check(
        &self,
        check: VersionCheck,
        findings: Vec<RegressionRecord>,
    ) -> Result<bool, MetastoreError> {
        run!(self, write, |sql| async move {
            let inserted = sql
                .execute(
                    "INSERT INTO version_checks (tenant, service, profile_type, version_label, new_version, old_version, checked_at_ms, outcome)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
                    args![
                        &check.tenant,
                        &check.service,
                        &check.profile_type,
                        &check.version_label,
                        &check.new_version,
                        &check.old_version,
                        check.checked_at_ms,
                        &check.outcome
                    ],
                )
                .await?;
            if inserted == 0 {
                return Ok(false);
            }
            for finding in &findings {
                sql.execute(
                    "INSERT INTO regressions (tenant, service, profile_type, version_label, new_version, function, detected_at_ms, finding)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
                    args![
                        &finding.tenant,
                        &finding.service,
                        &finding.profile_type,
                        &finding.version_label,
                        &finding.new_version,
                        &finding.function,
                        finding.detected_at_ms,
                        &finding.finding
                    ],
                )
                .await?;
            }
            Ok(true)
        })
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
        let key = [tenant, service, profile_type, version_label, new_version].map(str::to_string);
        run!(self, read, |sql| async move {
            let rows = sql
                .query(
                    "SELECT 1 FROM version_checks WHERE tenant = $1 AND service = $2
                     AND profile_type = $3 AND version_label = $4 AND new_version = $5",
                    args![&key[0], &key[1], &key[2], &key[3], &key[4]],
                )
                .await?;
            Ok(!rows.is_empty())
        })
    }

    /// Findings of a tenant detected at or after `since_ms`, newest first; of one service
    /// when given.
    pub async fn regressions(
        &self,
        tenant: &str,
        service: Option<String>,
        since_ms: i64,
    ) -> Result<Vec<RegressionRecord>, MetastoreError> {
        let tenant = tenant.to_string();
        run!(self, read, |sql| async move {
            sql.query(
                "SELECT tenant, service, profile_type, version_label, new_version, function, detected_at_ms, finding
                 FROM regressions WHERE tenant = $1 AND detected_at_ms >= $2
                   AND (CAST($3 AS TEXT) IS NULL OR service = $3)
                 ORDER BY detected_at_ms DESC, service, function",
                args![&tenant, since_ms, &service],
            )
            .await?
            .into_iter()
            .map(|mut row| {
                Ok(RegressionRecord {
                    tenant: row.text(0)?,
                    service: row.text(1)?,
                    profile_type: row.text(2)?,
                    version_label: row.text(3)?,
                    new_version: row.text(4)?,
                    function: row.text(5)?,
                    detected_at_ms: row.int(6)?,
                    finding: row.text(7)?,
                })
            })
            .collect()
        })
    }
}
