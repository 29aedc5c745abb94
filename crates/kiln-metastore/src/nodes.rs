//! Membership of a scaled-out deployment: each node's roles and address, kept alive by
//! its heartbeat (no consensus: a node is live while its lease is unexpired).

use crate::sql::{args, Sql};
use crate::{now_ms, split_roles, Metastore, MetastoreError, NodeRecord};

impl Metastore {
    /// Announces `node` (its roles, address, heartbeat and lease), creating or replacing
    /// its row; a node that had left is live again.
    pub async fn heartbeat(&self, node: &NodeRecord) -> Result<(), MetastoreError> {
        let node = node.clone();
        run!(self, read, |sql| async move {
            let roles = node.roles.join(",");
            sql.execute(
                "INSERT INTO nodes (id, roles, address, started_at_ms, heartbeat_at_ms, lease_expires_at_ms, left_at_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, NULL)
                 ON CONFLICT (id) DO UPDATE SET roles = excluded.roles, address = excluded.address,
                   started_at_ms = excluded.started_at_ms, heartbeat_at_ms = excluded.heartbeat_at_ms,
                   lease_expires_at_ms = excluded.lease_expires_at_ms, left_at_ms = NULL",
                args![
                    &node.id,
                    &roles,
                    &node.address,
                    node.started_at_ms,
                    node.heartbeat_at_ms,
                    node.lease_expires_at_ms
                ],
            )
            .await?;
            Ok(())
        })
    }

    /// Marks `id` as gone by a clean shutdown, so the others stop counting on it now
    /// rather than when its lease runs out.
    pub async fn leave(&self, id: &str) -> Result<(), MetastoreError> {
        let id = id.to_string();
        run!(self, read, |sql| async move {
            sql.execute(
                "UPDATE nodes SET left_at_ms = $2, lease_expires_at_ms =
                   CASE WHEN lease_expires_at_ms < $2 THEN lease_expires_at_ms ELSE $2 END
                 WHERE id = $1",
                args![&id, now_ms()],
            )
            .await?;
            Ok(())
        })
    }

    /// Every node known, by id.
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>, MetastoreError> {
        run!(self, read, |sql| async move {
            sql.query(
                "SELECT id, roles, address, started_at_ms, heartbeat_at_ms, lease_expires_at_ms, left_at_ms
                 FROM nodes ORDER BY id",
                &[],
            )
            .await?
            .into_iter()
            .map(|mut row| {
                Ok(NodeRecord {
                    id: row.text(0)?,
                    roles: split_roles(&row.text(1)?),
                    address: row.text(2)?,
                    started_at_ms: row.int(3)?,
                    heartbeat_at_ms: row.int(4)?,
                    lease_expires_at_ms: row.int(5)?,
                    left_at_ms: row.opt_int(6)?,
                })
            })
            .collect()
        })
    }

    /// Forgets nodes not heard from since `before_ms`; returns how many.
    pub async fn forget_nodes(&self, before_ms: i64) -> Result<usize, MetastoreError> {
        run!(self, read, |sql| async move {
            let deleted = sql
                .execute(
                    "DELETE FROM nodes WHERE heartbeat_at_ms < $1",
                    args![before_ms],
                )
                .await?;
            Ok(usize::try_from(deleted).unwrap_or(usize::MAX))
        })
    }
}
