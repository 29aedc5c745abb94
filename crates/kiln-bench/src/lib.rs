//! `kiln bench …`: the benchmarks of Kiln's hot paths, whose figures docs/benchmarks.md
//! records. They live apart from the `kiln` binary's own code (the CLI, config merging),
//! in one module per path: [`ingest`] (write throughput and ack latency, and the per-stage
//! CPU cost), [`query`] (1 h to 7 d of one service against `go tool pprof`), [`storage`]
//! (bytes per profile and query time after compaction; compaction delay), [`scrape`]
//! (pull collection from a fleet of targets), [`rules`] (recording rules' share of a
//! compaction job), [`insight`] (planted regressions found, false alarms, compare speed) and [`agent`] (the host agent's overhead,
//! perf events against eBPF), and [`goodput`] (profiles stored under overload).
//!
//! Benches report numbers; the tests assert behaviour (`stages`, `query`, `storage`,
//! `scrape` and `agent` also run briefly in the `kiln` crate's integration suite). Servers
//! under test are started as child processes of the running `kiln` binary, so a bench
//! measures the binary users run.

pub mod agent;
pub mod chaos;
pub mod goodput;
pub mod ingest;
pub mod insight;
pub mod query;
pub mod rules;
pub mod scrape;
pub mod storage;

pub use ingest::{run, BenchCommand};
