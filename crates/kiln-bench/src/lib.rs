//! `kiln bench …`: the benchmarks of Kiln's hot paths, whose figures docs/benchmarks.md
//! records. They live apart from the `kiln` binary's own code (the CLI, config merging),
//! in one module per path: [`ingest`] (write throughput and ack latency, and the per-stage
//! CPU cost), [`query`] (1 h to 7 d of one service against `go tool pprof`), [`storage`]
//! (bytes per profile and query time after compaction; compaction delay), [`scrape`]
//! (pull collection from a fleet of targets), [`rules`] (recording rules' share of a
//! compaction job), [`insight`] (planted regressions found, false alarms, compare speed), [`symbolize`] (naming stripped binaries' frames on the server) and [`agent`] (the host agent's overhead,
//! perf events against eBPF), and [`goodput`] (profiles stored under overload).
//!
//! Each bench stands alone: what several share sits in [`common`] (the server children,
//! their CPU and metrics, the corpus) and [`stream`] (days of profiles written straight
//! into blocks), which import no bench; this file only dispatches.
//!
//! Benches report numbers; the tests assert behaviour (`stages`, `query`, `storage`,
//! `scrape` and `agent` also run briefly in the `kiln` crate's integration suite). Servers
//! under test are started as child processes of the running `kiln` binary, so a bench
//! measures the binary users run.

pub mod agent;
#[cfg(feature = "services")]
pub mod chaos;
pub mod common;
pub mod goodput;
pub mod http;
pub mod ingest;
pub mod insight;
pub mod query;
pub mod rules;
pub mod scrape;
pub mod services;
pub mod storage;
pub mod stream;
pub mod symbolize;

use anyhow::Context;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Ingest throughput and ack latency with durable acks.
    Ingest(ingest::IngestArgs),
    /// CPU cost of each write-path stage on one core, without HTTP or storage.
    Stages(ingest::StagesArgs),
    /// Query latency over 1 h, 24 h and 7 d of one service, against go tool pprof.
    Query(query::QueryBenchArgs),
    /// Bytes kept for a day of one service after compaction, and compaction throughput.
    Storage(storage::StorageBenchArgs),
    /// Time from a segment's write to its first compaction, with the default settings.
    CompactionDelay(storage::DelayBenchArgs),
    /// Scrape targets one server core sustains.
    Scrape(scrape::ScrapeBenchArgs),
    /// The host agent's own CPU and memory, with every core busy, per sampling frequency.
    Agent(agent::AgentBenchArgs),
    /// What recording rules add to a level-0 compaction job.
    Rules(rules::RulesBenchArgs),
    /// Planted regressions found and false alarms raised by the comparison, and its speed.
    Insight(insight::InsightBenchArgs),
    /// A day's flame graph over stripped binaries' frames named from uploaded debug files,
    /// and what naming costs a query of frames already named.
    Symbolize(symbolize::SymbolizeBenchArgs),
    /// Ingest, query and compact processes over PostgreSQL and S3 under kills and a
    /// PostgreSQL restart: every acknowledged write present exactly once.
    Chaos(services::ChaosArgs),
    /// Profiles stored per second with 200 writers of 1 MB profiles against 20.
    Goodput(goodput::GoodputArgs),
}

pub async fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Ingest(args) => ingest::run(args).await,
        BenchCommand::Stages(args) => ingest::stages(args),
        BenchCommand::Query(args) => query::run(args).await,
        BenchCommand::Storage(args) => storage::run(args).await,
        BenchCommand::CompactionDelay(args) => storage::run_delay(args).await,
        BenchCommand::Scrape(args) => scrape::run(args).await,
        BenchCommand::Agent(args) => agent::run(args).await,
        BenchCommand::Rules(args) => rules::run(args),
        BenchCommand::Insight(args) => insight::run(args).await,
        BenchCommand::Symbolize(args) => symbolize::run(args).await,
        // Threads and child processes of its own, and a runtime for the metastore.
        BenchCommand::Chaos(args) => tokio::task::spawn_blocking(move || services::chaos(args))
            .await
            .context("the chaos bench's thread failed")?,
        BenchCommand::Goodput(args) => tokio::task::spawn_blocking(move || goodput::run(args))
            .await
            .context("the goodput bench's thread failed")?,
    }
}
