//! How the nodes of a scaled-out deployment find each other and share work, with the
//! metastore every node already uses as the only shared state: no consensus code and no
//! coordination service of Kiln's own.
//!
//! - [`roles`]: what a process runs (`--target`).
//! - [`membership`]: each node's row in the `nodes` table, kept live by a heartbeat and a
//!   lease; who is live is all the rest needs.
//! - [`forward`]: writes placed by (tenant, service) on one ingest node, with a local
//!   fallback, so placement speeds things up and never decides correctness.
//!
//! Everything here steers work. Durability stays where it was: a write is acknowledged
//! by the node that made it durable, and a dataset exists once the metastore committed it.

pub mod fanout;
pub mod forward;
pub mod membership;
pub mod roles;

pub use forward::{ForwardError, ForwardRequest, Forwarded, Forwarder, LocalReason, Peer, Route};
pub use membership::{advertise_address, host_name, Membership, NodeConfig};
pub use roles::{Roles, ROLES};

use std::time::Duration;

/// Why the client that talks to the other nodes could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the TLS certificate file holds no certificate usable to reach the other nodes: {0}")]
    Certificate(#[source] reqwest::Error),
    #[error("cannot build the client for the other nodes: {0}")]
    Client(#[source] reqwest::Error),
}

/// The client nodes reach each other with: HTTPS trusting `tls_roots` (the chain the
/// nodes serve) when given, else plain HTTP; connecting within a second, since a peer
/// that does not accept by then is better skipped.
pub fn http_client(
    timeout: Duration,
    tls_roots: Option<&[u8]>,
) -> Result<reqwest::Client, ClientError> {
    let mut builder = reqwest::Client::builder()
        .connect_timeout(timeout.min(Duration::from_secs(1)))
        .timeout(timeout)
        .pool_idle_timeout(Duration::from_secs(30));
    if let Some(pem) = tls_roots {
        for certificate in
            reqwest::Certificate::from_pem_bundle(pem).map_err(ClientError::Certificate)?
        {
            builder = builder.add_root_certificate(certificate);
        }
    }
    builder.build().map_err(ClientError::Client)
}
