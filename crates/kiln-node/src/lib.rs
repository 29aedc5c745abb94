//! One Kiln node, assembled from its roles outside the edge.
//!
//! `kiln server` runs every role in one process by default, and the same binary runs
//! any subset of them (`--target`). This crate is where a node is put together:
//! [`config`] is what the operator writes (a YAML file, then environment variables and
//! flags over it); [`node`] opens storage and the metastore from their URLs, starts the
//! write path, queries, rules, compaction, scraping and the host agent where the roles
//! ask, and hands what requests need to the edge ([`kiln_server`], HTTP and gRPC only);
//! [`shutdown`] is the one order all of it stops in.

pub mod config;
pub mod kubernetes;
pub mod node;
mod shutdown;

pub use config::{AgentSettings, ClusterConfig, ServerConfig};
pub use node::{RunningServer, Server, ServerError};
