//! Placement of writes: each (tenant, service) has one preferred ingest node, chosen by
//! rendezvous hashing over the live ingest nodes, so a service's profiles meet in one
//! segment per flush and its symbols are written once, not once per node.
//!
//! Placement is an optimisation and never a condition of correctness. Any ingest node
//! takes any write: it forwards the write to the owner and answers the client with the
//! owner's answer, which comes only once the owner made the write durable. When the owner
//! cannot be reached or answers 5xx, the write certainly is not stored there, and the
//! node writes it itself. When the owner took the write and then did not answer (slower
//! than `node.forward_timeout_ms`, or killed mid-request), it may have stored it: writing
//! it here too would store it twice, so the client gets a 503 and retries, as it would
//! from a node that died. Either way the owner is skipped for two heartbeats, so the
//! writes after it (the retry among them) go to the next node in the hash order. A
//! forwarded write carries [`FORWARDED_FROM`] and is always written where it lands, so a
//! write is forwarded at most once, whatever two nodes believe about the membership.
//!
//! `kiln bench chaos` found the case this rule exists for: with a fallback on every
//! failure, an owner killed between its commit and its answer had two acknowledged writes
//! stored twice in five minutes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use thiserror::Error;

use crate::membership::{Membership, NodeConfig};

/// The header a forwarded write carries: the forwarding node's id.
pub const FORWARDED_FROM: &str = "kiln-forwarded-from";

/// The headers a write is forwarded with; the rest (hop-by-hop, `Host`, lengths) belong to
/// the connection it came on.
pub const FORWARDED_HEADERS: [&str; 7] = [
    "content-type",
    "idempotency-key",
    "content-encoding",
    "authorization",
    "x-scope-orgid",
    "connect-protocol-version",
    "user-agent",
];

/// Where a write should be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Here: this node owns it, it was forwarded here, or placement is off.
    Local(LocalReason),
    /// At the owner.
    Forward(Peer),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalReason {
    Owner,
    Forwarded,
    Unplaced,
}

/// Another node, as membership lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub id: String,
    pub address: String,
}

/// A write as it is sent on: the same path and query, the headers in
/// [`FORWARDED_HEADERS`], and the body as received.
#[derive(Debug, Clone)]
pub struct ForwardRequest {
    pub path_and_query: String,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

/// The owner's answer to a forwarded write: a success or a refusal of the write itself
/// (4xx), which the client would have had here too.
#[derive(Debug)]
pub struct Forwarded {
    pub status: http::StatusCode,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

/// Why a forward did not settle the write.
#[derive(Debug, Error)]
pub enum ForwardError {
    /// No connection to the owner: nothing was sent, so the write is written here.
    #[error("owner {node} unreachable: {source}")]
    Unreachable {
        node: String,
        #[source]
        source: reqwest::Error,
    },
    /// The owner answered 5xx: it did not commit the write, which is written here.
    #[error("owner {node} answered {status}: {message}")]
    Unavailable {
        node: String,
        status: u16,
        message: String,
    },
    /// Sent, but no answer came (a timeout, or the connection cut: the owner killed).
    /// The owner may have committed it: writing it here too could store it twice, so
    /// the client is told to retry (503), as it would be by a node that died.
    #[error("owner {node} did not answer (the write may or may not be stored; retry): {source}")]
    Unanswered {
        node: String,
        #[source]
        source: reqwest::Error,
    },
}

impl ForwardError {
    /// Whether the write is certainly not stored by the owner, so that writing it here
    /// cannot store it twice.
    pub fn write_here(&self) -> bool {
        !matches!(self, ForwardError::Unanswered { .. })
    }

    fn reason(&self) -> &'static str {
        match self {
            ForwardError::Unreachable { .. } => "fallback_unreachable",
            ForwardError::Unavailable { .. } => "fallback_unavailable",
            ForwardError::Unanswered { .. } => "unanswered",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// Sends writes to their owners.
pub struct Forwarder {
    membership: Arc<Membership>,
    client: reqwest::Client,
    scheme: &'static str,
    enabled: bool,
    /// Owners that just failed, until when they are skipped.
    suspects: Mutex<HashMap<String, Instant>>,
    /// How long a failed owner is skipped: two heartbeats, after which membership has
    /// either marked it down or it answers again.
    suspect_for: Duration,
    writes: Family<OutcomeLabel, Counter>,
}

impl Forwarder {
    /// `tls_roots`: the PEM certificate chain the nodes serve HTTPS with, trusted for
    /// forwarding; `None` when they serve plain HTTP.
    pub fn new(
        membership: Arc<Membership>,
        config: &NodeConfig,
        tls_roots: Option<&[u8]>,
    ) -> Result<Self, crate::ClientError> {
        let timeout = Duration::from_millis(config.forward_timeout_ms.max(1));
        let client = crate::http_client(timeout, tls_roots)?;
        Ok(Forwarder {
            membership,
            client,
            scheme: if tls_roots.is_some() { "https" } else { "http" },
            enabled: config.placement,
            suspects: Mutex::new(HashMap::new()),
            suspect_for: Duration::from_millis(config.heartbeat_ms.max(100) * 2),
            writes: Family::default(),
        })
    }

    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kiln_placement_writes",
            "Writes by where placement sent them: owner (this node owns the service), forwarded (the owner acknowledged it), received (forwarded here), unplaced (placement off, or a write of several services), fallback_* (written here because the owner was unreachable or answered 5xx), unanswered (the owner took it and did not answer: 503 to the client)",
            self.writes.clone(),
        );
    }

    /// Where a write for (`tenant`, `service`) goes. `forwarded_from`: the
    /// [`FORWARDED_FROM`] header, if the write came from another node.
    pub fn route(&self, tenant: &str, service: &str, forwarded_from: Option<&str>) -> Route {
        if forwarded_from.is_some() {
            return Route::Local(LocalReason::Forwarded);
        }
        if !self.enabled {
            return Route::Local(LocalReason::Unplaced);
        }
        let nodes = self.membership.live_with_role("ingest");
        let now = Instant::now();
        let suspects: Vec<String> = match self.suspects.lock() {
            Ok(mut suspects) => {
                suspects.retain(|_, until| *until > now);
                suspects.keys().cloned().collect()
            }
            Err(_) => Vec::new(),
        };
        let key = placement_key(tenant, service);
        let candidates = nodes
            .iter()
            .filter(|node| node.id == self.membership.id() || !suspects.contains(&node.id))
            .map(|node| node.id.as_str());
        match kiln_model::placement::owner(&key, candidates) {
            Some(owner) if owner != self.membership.id() => nodes
                .iter()
                .find(|node| node.id == owner)
                .map(|node| {
                    Route::Forward(Peer {
                        id: node.id.clone(),
                        address: node.address.clone(),
                    })
                })
                .unwrap_or(Route::Local(LocalReason::Owner)),
            _ => Route::Local(LocalReason::Owner),
        }
    }

    /// Counts a write settled here.
    pub fn count_local(&self, reason: LocalReason) {
        let outcome = match reason {
            LocalReason::Owner => "owner",
            LocalReason::Forwarded => "received",
            LocalReason::Unplaced => "unplaced",
        };
        self.writes.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    /// Sends `request` to `peer`. `Ok` is the owner's success or its refusal of the write
    /// (4xx); an `Err` says whether the write is to be written here
    /// ([`ForwardError::write_here`]). Either way the owner is skipped for a while.
    pub async fn forward(
        &self,
        peer: &Peer,
        request: ForwardRequest,
    ) -> Result<Forwarded, ForwardError> {
        let result = self.send(peer, request).await;
        let outcome = match &result {
            Ok(_) => "forwarded",
            Err(err) => {
                tracing::warn!(error = %err, write_here = err.write_here(), "forward failed");
                if let Ok(mut suspects) = self.suspects.lock() {
                    suspects.insert(peer.id.clone(), Instant::now() + self.suspect_for);
                }
                err.reason()
            }
        };
        self.writes.get_or_create(&OutcomeLabel { outcome }).inc();
        result
    }

    async fn send(&self, peer: &Peer, request: ForwardRequest) -> Result<Forwarded, ForwardError> {
        let url = format!(
            "{}://{}{}",
            self.scheme, peer.address, request.path_and_query
        );
        let mut builder = self
            .client
            .post(url)
            .header(FORWARDED_FROM, self.membership.id())
            .body(request.body);
        for name in FORWARDED_HEADERS {
            for value in request.headers.get_all(name) {
                builder = builder.header(name, value);
            }
        }
        // Only a failure to connect proves nothing reached the owner.
        let failed = |source: reqwest::Error| {
            if source.is_connect() {
                ForwardError::Unreachable {
                    node: peer.id.clone(),
                    source,
                }
            } else {
                ForwardError::Unanswered {
                    node: peer.id.clone(),
                    source,
                }
            }
        };
        let response = builder.send().await.map_err(failed)?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await.map_err(failed)?;
        if status.is_server_error() {
            return Err(ForwardError::Unavailable {
                node: peer.id.clone(),
                status: status.as_u16(),
                message: String::from_utf8_lossy(&body).trim().to_string(),
            });
        }
        Ok(Forwarded {
            status,
            headers,
            body,
        })
    }
}

/// The key a write is placed by: tenant and service, split by a NUL, which a tenant id
/// cannot hold, so no two pairs share a key.
pub fn placement_key(tenant: &str, service: &str) -> String {
    format!("{tenant}\u{0}{service}")
}
