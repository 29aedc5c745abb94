//! Overload: four times what the server can take, for a minute. Every request gets 200
//! or 429 (never a 5xx, a reset or a timeout), memory stays bounded, `/ready` stays
//! quick, and every 200 is stored. The server is a `kiln server` child, so its memory
//! is its own, and this is a test binary of its own: cargo runs test binaries one at a
//! time, so no other test competes with it for the cores while it measures.

#[path = "integration/common.rs"]
#[allow(dead_code, unused_imports, unused_macros)]
mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
/// The documented bound (docs/security.md).
const RSS_BOUND: u64 = 1 << 30;
const READY_BOUND: Duration = Duration::from_millis(100);

fn start(dir: &Path, port: u16) -> KilnChild {
    // A short commit interval, so that the clients measuring capacity are not held back
    // by the interval instead of the server's work.
    kiln_server(dir)
        .port(port)
        .args(["--retention-days", "0", "--flush-interval-ms", "50"])
        .start()
        .expect("kiln server starts")
}

fn url_escape(text: &str) -> String {
    text.bytes()
        .map(|byte| {
            if byte.is_ascii_alphanumeric() || b"-_.~:".contains(&byte) {
                (byte as char).to_string()
            } else {
                format!("%{byte:02X}")
            }
        })
        .collect()
}

fn ticks(value: &serde_json::Value) -> i64 {
    value["flamebearer"]["numTicks"].as_i64().unwrap_or(-1)
}

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// What the load got back: statuses, and anything that was not an HTTP answer.
#[derive(Default)]
struct Outcomes {
    statuses: BTreeMap<u16, u64>,
    failures: Vec<String>,
}

/// One profile per request, at `rate` per second for `duration`, whatever the answers,
/// with at most `concurrent` requests outstanding (when all are, the next waits, and the
/// rate achieved says so). Over HTTP/2, as gRPC agents send, one connection per client
/// (the server takes up to 200 requests at once on each): many requests share a few
/// connections, so the load is not bounded by the server's connection cap.
async fn open_loop(
    concurrent: usize,
    clients: Vec<reqwest::Client>,
    url: String,
    body: bytes::Bytes,
    rate: f64,
    duration: Duration,
) -> Outcomes {
    let outcomes = Arc::new(Mutex::new(Outcomes::default()));
    let started = tokio::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(concurrent));
    let mut sent = 0u64;
    while started.elapsed() < duration {
        let due = started + Duration::from_secs_f64(sent as f64 / rate);
        tokio::time::sleep_until(due).await;
        let slot = slots.clone().acquire_owned().await.expect("slots");
        sent += 1;
        let client = clients[sent as usize % clients.len()].clone();
        let (url, body, outcomes) = (url.clone(), body.clone(), outcomes.clone());
        tasks.spawn(async move {
            let answer = client.post(&url).body(body).send().await;
            drop(slot);
            let mut outcomes = outcomes.lock().unwrap();
            match answer {
                Ok(response) => {
                    *outcomes
                        .statuses
                        .entry(response.status().as_u16())
                        .or_default() += 1
                }
                Err(err) => outcomes.failures.push(format!("{err:?}")),
            }
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    Arc::into_inner(outcomes)
        .expect("all tasks done")
        .into_inner()
        .unwrap()
}

#[test]
fn four_times_capacity_for_a_minute_gets_200_or_429_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let port = kiln_testkit::free_port();
    let server = start(dir.path(), port);
    let base = format!("http://127.0.0.1:{port}");
    let profile = fixture("profefe-collector_cpu_1.prof");
    let per_profile = pprof_total(&profile, 1);
    let url = format!("{base}/ingest?name=overload.cpu&format=pprof");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(4096)
        // Below the server's keep-alive deadline (http.header_read_timeout_ms), so that no
        // request is sent on a connection the server is closing as idle.
        .pool_idle_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let body = bytes::Bytes::from(profile);

    // Capacity: what 256 clients, each sending as soon as answered, get through.
    let calibration = Duration::from_secs(5);
    let accepted = runtime.block_on(async {
        let stop = tokio::time::Instant::now() + calibration;
        let mut clients = tokio::task::JoinSet::new();
        for _ in 0..256 {
            let (client, url, body) = (client.clone(), url.clone(), body.clone());
            clients.spawn(async move {
                let mut accepted = 0u64;
                while tokio::time::Instant::now() < stop {
                    let response = client.post(&url).body(body.clone()).send().await;
                    let status = response.expect("calibration request").status();
                    assert!(status == 200 || status == 429, "calibration: {status}");
                    accepted += u64::from(status == 200);
                }
                accepted
            });
        }
        let mut accepted = 0;
        while let Some(done) = clients.join_next().await {
            accepted += done.unwrap();
        }
        accepted
    });
    let capacity = accepted as f64 / calibration.as_secs_f64();
    assert!(capacity > 1.0, "capacity {capacity}/s");

    // /ready and memory, watched throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let slowest_ready = Arc::new(AtomicU64::new(0));
    let watcher = {
        let (stop, slowest_ready, pid) = (stop.clone(), slowest_ready.clone(), server.id());
        let ready = format!("{base}/ready");
        std::thread::spawn(move || {
            let agent = TestServer::agent();
            let metrics_url = ready.replace("/ready", "/metrics");
            let mut peak_rss = 0;
            let mut probes = 0;
            let mut peaks: BTreeMap<&'static str, f64> = BTreeMap::new();
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let status = agent.get(&ready).call().map(|r| r.status()).unwrap_or(0);
                let took = started.elapsed();
                assert_eq!(status, 200, "/ready during overload");
                slowest_ready.fetch_max(took.as_micros() as u64, Ordering::Relaxed);
                peak_rss = peak_rss.max(rss_bytes(pid));
                probes += 1;
                if probes % 5 == 0 {
                    let text = agent
                        .get(&metrics_url)
                        .call()
                        .ok()
                        .and_then(|r| r.into_string().ok())
                        .unwrap_or_default();
                    for name in ["kiln_http_connections_open", "kiln_ingest_inflight_bytes"] {
                        let value = text
                            .lines()
                            .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
                            .unwrap_or(0.0);
                        let peak = peaks.entry(name).or_default();
                        *peak = peak.max(value);
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            (peak_rss, probes, peaks)
        })
    };

    let load = Duration::from_secs(60);
    let h2: Vec<reqwest::Client> = (0..16)
        .map(|_| {
            reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .http2_prior_knowledge()
                .build()
                .unwrap()
        })
        .collect();
    let outcomes = runtime.block_on(open_loop(
        3000,
        h2,
        url.clone(),
        body.clone(),
        4.0 * capacity,
        load,
    ));
    stop.store(true, Ordering::Relaxed);
    let (peak_rss, probes, peaks) = watcher.join().expect("watcher");
    let slowest_ready = Duration::from_micros(slowest_ready.load(Ordering::Relaxed));
    let ok = outcomes.statuses.get(&200).copied().unwrap_or(0);
    let offered = outcomes.statuses.values().sum::<u64>() as f64 / load.as_secs_f64();
    let refused = outcomes.statuses.get(&429).copied().unwrap_or(0);
    println!(
        "overload: capacity {capacity:.0}/s, offered {offered:.0}/s (aimed at {:.0}/s) for {} s: {:?}, {} failures; /ready slowest {} ms over {probes} probes; peak RSS {} MiB; peaks {peaks:?}",
        4.0 * capacity,
        load.as_secs(),
        outcomes.statuses,
        outcomes.failures.len(),
        slowest_ready.as_millis(),
        peak_rss >> 20
    );
    assert!(
        outcomes.failures.is_empty(),
        "requests without an answer: {:?}",
        &outcomes.failures[..outcomes.failures.len().min(5)]
    );
    assert_eq!(
        ok + refused,
        outcomes.statuses.values().sum::<u64>(),
        "only 200 and 429: {:?}",
        outcomes.statuses
    );
    assert!(refused > 0, "4× capacity was not refused at all");
    assert!(ok > 0, "nothing accepted under overload");
    assert!(peak_rss < RSS_BOUND, "peak RSS {} MiB", peak_rss >> 20);
    assert!(slowest_ready < READY_BOUND, "/ready took {slowest_ready:?}");

    // Every 200 is stored, once.
    let query = url_escape(&format!("{CPU}{{service_name=\"overload\"}}"));
    let (status, text) = TestServer::at(&base).get(&format!(
        "/pyroscope/render?query={query}&from=0&until=now%2B1h"
    ));
    assert_eq!(status, 200, "{text}");
    let stored = ticks(&serde_json::from_str(&text).expect("json"));
    let expected = (accepted + ok) as i64 * per_profile;
    if stored != expected {
        // Tells a late write from a lost one, and a retry mistaken for one.
        std::thread::sleep(Duration::from_secs(3));
        let (_, later) = TestServer::at(&base).get(&format!(
            "/pyroscope/render?query={query}&from=0&until=now%2B1h"
        ));
        let later = ticks(&serde_json::from_str(&later).expect("json"));
        let (_, metrics) = TestServer::at(&base).get("/metrics");
        let counters: Vec<&str> = metrics
            .lines()
            .filter(|l| {
                !l.starts_with('#')
                    && ["duplicates", "failed", "error", "flushes", "wal", "compact"]
                        .iter()
                        .any(|w| l.contains(w))
            })
            .collect();
        panic!(
            "stored {stored}, expected {expected} ({} profiles of {per_profile} each short); \
             3 s later {later}; counters:\n{}",
            (expected - stored) as f64 / per_profile as f64,
            counters.join("\n")
        );
    }
    drop(runtime);
}
