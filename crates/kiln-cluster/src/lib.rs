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

pub mod forward;
pub mod membership;
pub mod roles;

pub use forward::{ForwardError, ForwardRequest, Forwarded, Forwarder, LocalReason, Peer, Route};
pub use membership::{advertise_address, host_name, Membership, NodeConfig};
pub use roles::{Roles, ROLES};
