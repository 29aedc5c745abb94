//! `kiln bench scrape`: how many targets one core of a Kiln server scrapes and stores.
//!
//! A fake fleet is served from this process (so its CPU is not the server's): every
//! target answers the five Go endpoints with real profiles from the corpus directory (a
//! CPU profile for `/debug/pprof/profile`, a heap profile for the others; the CPU one
//! answers at once instead of after `seconds`). A `kiln server` child scrapes them all at
//! `--interval` and stores every profile (deltas included); its CPU time per scrape,
//! read from /proc, gives the targets one core sustains at a 15 s interval.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;

#[derive(Args)]
pub struct ScrapeBenchArgs {
    /// A Go CPU profile and a Go heap profile are taken from here.
    #[arg(long, default_value = "testdata")]
    corpus: PathBuf,
    #[arg(long, default_value_t = 200)]
    targets: usize,
    /// Seconds between two scrapes of a target (short, to measure quickly).
    #[arg(long, default_value_t = 1)]
    interval: u64,
    #[arg(long, default_value_t = 20)]
    seconds: u64,
}

fn read_profile(dir: &Path, name: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(dir.join(name))
        .with_context(|| format!("cannot read {}", dir.join(name).display()))
}

pub async fn run(args: ScrapeBenchArgs) -> anyhow::Result<()> {
    let cpu = Arc::new(read_profile(&args.corpus, "profefe-collector_cpu_1.prof")?);
    let heap = Arc::new(read_profile(&args.corpus, "profefe-collector_heap_1.prof")?);
    let served = Arc::new(AtomicU64::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?.to_string();
    let fleet = {
        let (cpu, heap, served) = (cpu.clone(), heap.clone(), served.clone());
        axum::Router::new().fallback(move |uri: axum::http::Uri| {
            let body = if uri.path().ends_with("/profile") {
                cpu.clone()
            } else {
                heap.clone()
            };
            served.fetch_add(1, Ordering::Relaxed);
            async move { (*body).clone() }
        })
    };
    tokio::spawn(async move {
        let _ = axum::serve(listener, fleet).await;
    });

    let data_dir = std::env::temp_dir().join(format!("kiln-bench-scrape-{}", std::process::id()));
    std::fs::create_dir_all(&data_dir)?;
    let mut yaml = format!(
        "compaction:\n  enabled: false\nscrape_configs:\n  - job_name: fleet\n    scrape_interval: {}s\n    scrape_timeout: {}s\n    static_configs:\n",
        args.interval, args.interval
    );
    for target in 0..args.targets {
        yaml.push_str(&format!(
            "      - {{targets: [\"{address}\"], labels: {{replica: \"r{target}\"}}}}\n"
        ));
    }
    let config = data_dir.join("kiln.yaml");
    std::fs::write(&config, yaml)?;
    let (mut server, url) =
        crate::common::start_server_with(&data_dir, &["--config".into(), config.into_os_string()])?;
    println!(
        "kiln bench scrape: {} targets × 5 Go endpoints every {} s, {} s measured",
        args.targets, args.interval, args.seconds
    );
    // Warm-up: every target's first scrape (the delta baselines) and connection set-up.
    tokio::time::sleep(Duration::from_secs(2 * args.interval + 1)).await;
    let served_before = served.load(Ordering::Relaxed);
    let cpu_before = crate::common::process_cpu_seconds(server.id()).unwrap_or(0.0);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    let cpu_seconds = crate::common::process_cpu_seconds(server.id()).unwrap_or(0.0) - cpu_before;
    let elapsed = started.elapsed().as_secs_f64();
    let scrapes = (served.load(Ordering::Relaxed) - served_before) as f64;
    let targets: serde_json::Value = serde_json::from_str(
        &crate::http::get(&format!("{url}/api/v1/targets"))
            .call()?
            .text(),
    )?;
    let down = targets["data"]["activeTargets"]
        .as_array()
        .map(|all| all.iter().filter(|t| t["health"] != "up").count())
        .unwrap_or(0);
    server.stop();
    let _ = std::fs::remove_dir_all(&data_dir);
    if scrapes == 0.0 {
        bail!("no scrape happened");
    }
    let expected = (args.targets * 5) as f64 * elapsed / args.interval as f64;
    let cpu_per_scrape = cpu_seconds / scrapes;
    println!("scrapes           {scrapes:.0} in {elapsed:.1} s ({:.0} % of the {expected:.0} due), {down} endpoints not up", scrapes / expected * 100.0);
    println!(
        "server CPU        {cpu_seconds:.2} s ({:.2} cores), {:.2} ms per scrape (fetch, gunzip, decode, delta, store)",
        cpu_seconds / elapsed,
        cpu_per_scrape * 1000.0
    );
    println!(
        "targets per core  {:.0} at a 15 s interval (5 endpoints each)",
        15.0 / (5.0 * cpu_per_scrape)
    );
    Ok(())
}
