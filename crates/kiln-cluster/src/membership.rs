//! Roles and membership of a scaled-out deployment, kept in the metastore every node
//! already shares: no consensus code and no coordination service of Kiln's own.
//!
//! A process runs the roles `--target` names (`all` by default, today's single-node
//! behaviour). Each node writes its roles and address to the `nodes` table with a
//! heartbeat and a lease; a node is live while its lease runs, down once it has run out,
//! and left once it said so at a clean shutdown. Who is live is all the others need to
//! know: a query node fans out over live query nodes, a write goes to a live ingest node.
//! A heartbeat that fails (the metastore restarting) is logged and retried; the node keeps
//! serving, because membership steers work and never decides correctness.

use std::sync::Arc;
use std::time::Duration;

use kiln_metastore::{Metastore, NodeRecord, NodeState};
use kiln_model::time::now_ms;
use serde::{Deserialize, Serialize};

use crate::roles::Roles;

/// How a node announces itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// The address other nodes use for this one; by default the host name and the
    /// listen port when listening on every interface, else the listen address.
    pub advertise_address: String,
    pub heartbeat_ms: u64,
    /// A node whose heartbeat is this late is down.
    pub lease_ms: u64,
    /// Whether writes go to the ingest node that owns their (tenant, service)
    /// ([`crate::forward`]); off, every node writes what it receives.
    pub placement: bool,
    /// How long a forwarded write may take; past it the client gets a 503 and retries
    /// (the owner may have stored it, so it is not written here too).
    pub forward_timeout_ms: u64,
    /// Queries over at least this many profiles are split over the live query nodes
    /// (kiln-query's fan-out); smaller ones run where they were asked.
    pub fanout_min_profiles: u64,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            advertise_address: String::new(),
            heartbeat_ms: 2_000,
            lease_ms: 10_000,
            placement: true,
            forward_timeout_ms: 5_000,
            fanout_min_profiles: 20_000,
        }
    }
}

/// This node's row in the `nodes` table, and the heartbeat that keeps it live.
pub struct Membership {
    metastore: Metastore,
    record: NodeRecord,
    heartbeat: Duration,
    lease_ms: i64,
    /// The live nodes as the last heartbeat read them: placement asks often, and a
    /// heartbeat's staleness is what a lease allows anyway.
    live: std::sync::RwLock<Vec<NodeRecord>>,
}

impl Membership {
    pub fn new(
        metastore: Metastore,
        id: String,
        roles: &Roles,
        address: String,
        config: &NodeConfig,
    ) -> Self {
        let now = now_ms();
        Membership {
            metastore,
            record: NodeRecord {
                id,
                roles: roles.names(),
                address,
                started_at_ms: now,
                heartbeat_at_ms: now,
                lease_expires_at_ms: now,
                left_at_ms: None,
            },
            heartbeat: Duration::from_millis(config.heartbeat_ms.max(100)),
            lease_ms: config.lease_ms.max(config.heartbeat_ms * 2).max(200) as i64,
            live: std::sync::RwLock::new(Vec::new()),
        }
    }

    pub fn id(&self) -> &str {
        &self.record.id
    }

    /// The live nodes with `role` as the last heartbeat read them, this node among them
    /// when it has the role: what placement hashes over without a round trip.
    pub fn live_with_role(&self, role: &str) -> Vec<NodeRecord> {
        let mut nodes: Vec<NodeRecord> = self
            .live
            .read()
            .map(|live| {
                live.iter()
                    .filter(|node| node.has_role(role) && node.id != self.record.id)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        if self.record.roles.iter().any(|r| r == role) {
            nodes.push(self.record.clone());
        }
        nodes
    }

    /// Writes one heartbeat now, and reads who else is live.
    pub async fn beat(&self) -> Result<(), kiln_metastore::MetastoreError> {
        let now = now_ms();
        let record = NodeRecord {
            heartbeat_at_ms: now,
            lease_expires_at_ms: now + self.lease_ms,
            ..self.record.clone()
        };
        self.metastore.heartbeat(&record).await?;
        let live: Vec<NodeRecord> = self
            .metastore
            .nodes()
            .await?
            .into_iter()
            .filter(|node| node.state(now) == NodeState::Live)
            .collect();
        if let Ok(mut cached) = self.live.write() {
            *cached = live;
        }
        Ok(())
    }

    /// The addresses of the live nodes with `role`: read now (a node may have joined
    /// since the last heartbeat), or as the last heartbeat saw them when the metastore
    /// cannot be read.
    pub async fn live_addresses(&self, role: &str) -> Vec<String> {
        let now = now_ms();
        let live = match self.metastore.nodes().await {
            Ok(nodes) => nodes
                .into_iter()
                .filter(|node| node.state(now) == NodeState::Live)
                .collect(),
            Err(_) => self
                .live
                .read()
                .map(|live| live.clone())
                .unwrap_or_default(),
        };
        live.into_iter()
            .filter(|node| node.has_role(role))
            .map(|node| node.address)
            .collect()
    }

    /// Whether this node owns `key` among the live nodes with `role` (rendezvous hashing
    /// over their ids, this node always counted): every node agrees without asking, and
    /// a node joining or leaving moves only its share.
    pub fn owns(&self, role: &str, key: &str) -> bool {
        let Ok(live) = self.live.read() else {
            return true;
        };
        let mut ids: Vec<&str> = live
            .iter()
            .filter(|node| node.has_role(role) && node.id != self.record.id)
            .map(|node| node.id.as_str())
            .collect();
        ids.push(&self.record.id);
        kiln_model::placement::owner(key, ids) == Some(self.record.id.as_str())
    }

    /// Heartbeats until `stopped`, then says the node is leaving.
    pub fn spawn(
        self: Arc<Self>,
        mut stopped: tokio::sync::watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                if let Err(err) = self.beat().await {
                    tracing::warn!(error = %err, node = %self.record.id, "heartbeat not written; retrying");
                }
                tokio::select! {
                    _ = tokio::time::sleep(self.heartbeat) => {}
                    _ = stopped.changed() => break,
                }
            }
            if let Err(err) = self.metastore.leave(&self.record.id).await {
                tracing::warn!(error = %err, "could not record leaving; the lease will run out");
            }
        })
    }

    /// Every node known, with its state now.
    pub async fn nodes(
        &self,
    ) -> Result<Vec<(NodeRecord, NodeState)>, kiln_metastore::MetastoreError> {
        let now = now_ms();
        Ok(self
            .metastore
            .nodes()
            .await?
            .into_iter()
            .map(|node| {
                let state = node.state(now);
                (node, state)
            })
            .collect())
    }
}

/// This machine's host name.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|host| host.trim().to_string())
        .unwrap_or_else(|| "localhost".to_string())
}

/// The address to advertise for a server bound at `local`.
pub fn advertise_address(config: &NodeConfig, local: std::net::SocketAddr) -> String {
    if !config.advertise_address.is_empty() {
        return config.advertise_address.clone();
    }
    if local.ip().is_unspecified() {
        return format!("{}:{}", host_name(), local.port());
    }
    local.to_string()
}
