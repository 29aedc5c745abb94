//! The HTTP (and gRPC, on the same port) edge of Kiln: routing, tenancy, body limits,
//! protocol framing (Connect, gRPC, Pyroscope, profefe, OTLP), metrics and readiness.
//!
//! Handlers stay thin: they read and bound the body, resolve the tenant, and hand off to
//! `kiln-ingest` or `kiln-query`. Everything protocol-specific about errors (HTTP status,
//! Connect error JSON, gRPC trailers) lives here.

pub mod body;
pub mod config;
pub mod grpc;
pub mod legacy;
pub mod listener;
pub mod metrics;
pub mod otlp;
pub mod querier;
pub mod routes;
pub mod server;
pub mod tenant;
pub mod ui;

pub use config::ServerConfig;
pub use server::{RunningServer, Server};
