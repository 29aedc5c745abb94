//! `kiln bench goodput`: profiles stored per second when writers outnumber what the
//! server can take, against the same when they do not.
//!
//! Issue 56 found that with 200 writers of 1 MB profiles the server stored a sixth of
//! what it stored with 20: it read every refused body in full, and accepted writes
//! waited seconds behind them. A server that refuses early and cheaply keeps its goodput
//! under overload. Each phase starts a fresh `kiln server` child with its defaults; each
//! writer sends gzip pprofs of about `--profile-bytes` in a closed loop: the next as soon
//! as the last is stored, or after the `Retry-After` of a refusal, as a client that
//! honours it does. Each writer is a service of its own and each profile a second after
//! its last, so no write is a retry of another.
//! Reported per phase: stored profiles per second (200s), refusals read as 429s, refusals
//! that reached the client as a closed connection (the server answered after the headers
//! and closed while the body was still being sent; a client that sends `Expect:
//! 100-continue` gets the 429 instead), accepted p50/p99, and the server's peak RSS; then
//! the ratio of the overloaded phase's goodput to the first's.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use rand::{Rng, SeedableRng};

#[derive(Args)]
pub struct GoodputArgs {
    /// Writers of each phase, comma-separated: the first is the baseline.
    #[arg(long, value_delimiter = ',', default_value = "20,200")]
    writers: Vec<usize>,
    /// Seconds each phase runs.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Size of each gzip pprof sent.
    #[arg(long, default_value_t = 1 << 20)]
    profile_bytes: usize,
    /// A flag for the started servers (repeated for several: `--server-flag
    /// --config --server-flag kiln.yaml`), to measure other settings.
    #[arg(long, allow_hyphen_values = true)]
    server_flag: Vec<std::ffi::OsString>,
}

/// A gzip pprof of about `target` bytes: random stacks over a few thousand functions,
/// within the default sample limit.
fn profile_of_about(target: usize) -> Vec<u8> {
    let most = 60_000;
    let largest = profile_of(most);
    if largest.len() <= target {
        return largest;
    }
    profile_of(most * target / largest.len())
}

/// A gzip pprof of `samples` random stacks.
fn profile_of(samples: usize) -> Vec<u8> {
    use kiln_model::build::{Frame, ProfileBuilder};
    let mut rng = rand::rngs::StdRng::seed_from_u64(56);
    let mut builder = ProfileBuilder::new(
        &[("cpu", "nanoseconds")],
        Some(("cpu", "nanoseconds")),
        10_000_000,
    );
    let names: Vec<String> = (0..4_000)
        .map(|index| format!("pkg{}.Type{}.method{index}", index % 40, index % 400))
        .collect();
    let locations: Vec<u32> = names
        .iter()
        .enumerate()
        .map(|(index, name)| {
            builder.location(&Frame {
                function: name,
                file: "service.go",
                line: index as i64,
                module: "",
                address: 0,
            })
        })
        .collect();
    while builder.sample_count() < samples {
        let depth = rng.random_range(8..40);
        let stack: Vec<u32> = (0..depth)
            .map(|_| locations[rng.random_range(0..locations.len())])
            .collect();
        builder.add(&stack, &[rng.random_range(1..1_000) * 10_000_000], &[]);
    }
    let profile = builder.finish(0, 10_000_000_000);
    kiln_model::compress::gzip(&prost::Message::encode_to_vec(&profile))
}

struct Phase {
    writers: usize,
    stored: usize,
    refused: usize,
    closed: usize,
    p50: Duration,
    p99: Duration,
    peak_rss_mib: f64,
    seconds: f64,
}

fn run_phase(
    writers: usize,
    seconds: u64,
    body: Arc<Vec<u8>>,
    flags: &[std::ffi::OsString],
) -> anyhow::Result<Phase> {
    let temp = std::env::temp_dir().join(format!(
        "kiln-bench-goodput-{}-{writers}",
        std::process::id()
    ));
    let (mut child, url) = crate::common::start_server_with(&temp, flags)?;
    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let counts: Arc<Mutex<(usize, usize)>> = Arc::default();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let threads: Vec<_> = (0..writers)
        .map(|writer| {
            let (url, body) = (url.clone(), body.clone());
            let (latencies, counts) = (latencies.clone(), counts.clone());
            std::thread::spawn(move || {
                let agent = crate::http::Http::new(Duration::from_secs(60));
                // A service per writer, and each of its profiles a second after the
                // last: no write is a copy of another (a retry, which is stored once).
                let base = kiln_model::time::now_ms() / 1000 - 86_400;
                let mut sent = 0i64;
                while Instant::now() < deadline {
                    let from = base + sent;
                    sent += 1;
                    let begun = Instant::now();
                    let answer = agent
                        .post(&format!(
                            "{url}/ingest?name=goodput-{writer}.cpu&format=pprof&from={from}&until={}",
                            from + 1
                        ))
                        .send_bytes(&body);
                    let took = begun.elapsed();
                    match answer {
                        Ok(_) => latencies
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(took),
                        Err(crate::http::Error::Status(429 | 503 | 408, response)) => {
                            counts.lock().unwrap_or_else(|p| p.into_inner()).0 += 1;
                            // As an SDK that honours Retry-After: the next profile then.
                            let wait = response
                                .header("retry-after")
                                .and_then(|seconds| seconds.trim().parse::<u64>().ok())
                                .unwrap_or(1);
                            std::thread::sleep(Duration::from_secs(wait.min(5)));
                        }
                        // Refused while its body was still being sent: the server
                        // read a little of it and closed the connection, which the
                        // client sees as an error, not as the 429 it was sent.
                        Err(crate::http::Error::Transport(err)) => {
                            let mut counts = counts.lock().unwrap_or_else(|p| p.into_inner());
                            if counts.1 == 0 {
                                eprintln!("goodput: a write's connection was closed: {err}");
                            }
                            counts.1 += 1;
                            drop(counts);
                            std::thread::sleep(Duration::from_secs(1));
                        }
                        Err(err) => panic!("goodput: a write failed: {err}"),
                    }
                }
            })
        })
        .collect();
    let writers_failed = threads
        .into_iter()
        .map(std::thread::JoinHandle::join)
        .filter(Result::is_err)
        .count();
    let elapsed = started.elapsed().as_secs_f64();
    let peak_rss_mib = kiln_agent::procs::status_kib(child.id(), "VmHWM:") as f64 / 1024.0;
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&temp);
    anyhow::ensure!(
        writers_failed == 0,
        "{writers_failed} writers failed (a write answered neither 200 nor a refusal)"
    );
    let mut latencies = std::mem::take(&mut *latencies.lock().unwrap_or_else(|p| p.into_inner()));
    latencies.sort();
    let quantile = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    let (refused, closed) = *counts.lock().unwrap_or_else(|p| p.into_inner());
    Ok(Phase {
        writers,
        stored: latencies.len(),
        refused,
        closed,
        p50: quantile(0.5),
        p99: quantile(0.99),
        peak_rss_mib,
        seconds: elapsed,
    })
}

pub fn run(args: GoodputArgs) -> anyhow::Result<()> {
    anyhow::ensure!(!args.writers.is_empty(), "--writers names no phase");
    let body = Arc::new(profile_of_about(args.profile_bytes));
    println!(
        "goodput: gzip pprofs of {} bytes, {} s per phase, a fresh server each",
        body.len(),
        args.seconds
    );
    println!(
        "{:>8} {:>10} {:>9} {:>9} {:>7} {:>9} {:>9} {:>10}",
        "writers", "stored/s", "stored", "429", "closed", "p50 ms", "p99 ms", "peak RSS"
    );
    let mut baseline = None;
    for &writers in &args.writers {
        let phase = run_phase(writers, args.seconds, body.clone(), &args.server_flag)
            .with_context(|| format!("the phase of {writers} writers"))?;
        let goodput = phase.stored as f64 / phase.seconds;
        println!(
            "{:>8} {:>10.1} {:>9} {:>9} {:>7} {:>9.0} {:>9.0} {:>6.0} MiB",
            phase.writers,
            goodput,
            phase.stored,
            phase.refused,
            phase.closed,
            phase.p50.as_secs_f64() * 1e3,
            phase.p99.as_secs_f64() * 1e3,
            phase.peak_rss_mib
        );
        match baseline {
            None => baseline = Some(goodput),
            Some(first) if first > 0.0 => println!(
                "         {:.2}× the goodput of {} writers",
                goodput / first,
                args.writers[0]
            ),
            Some(_) => {}
        }
    }
    Ok(())
}
