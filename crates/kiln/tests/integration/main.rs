//! End-to-end tests: a real server on a loopback port, real profiles pushed through every
//! ingest protocol, and the results read back and checked against `go tool pprof`.

mod agent;
mod auth;
mod cli;
mod common;
mod compaction;
mod connections;
mod duckdb;
mod explore;
mod formats;
mod hygiene;
mod insight;
mod interpreters;
mod kubernetes;
mod limits;
mod mcp;
mod openapi;
mod otlp;
mod profefe;
mod push;
mod pyroscope;
mod querier;
mod rules;
mod scale;
mod scrape;
mod sdk;
mod security;
mod symbolization;
mod tls;
mod ui;
