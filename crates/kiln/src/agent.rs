//! `kiln agent`: profiles every process on this host and pushes one self-contained pprof
//! per process per interval to a Kiln server (`push.v1.PusherService/Push`).
//!
//! Reports wait in a queue bounded by bytes while the server is down or slow; past the
//! bound the oldest are dropped and counted, so the agent's memory never grows with an
//! outage.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use kiln_agent::{AgentConfig, Collector, Report};
use kiln_ingest::push::{LabelPair, PushRequest, RawProfileSeries, RawSample};
use prost::Message;

#[derive(Args)]
pub struct AgentArgs {
    /// Kiln to push to, e.g. http://kiln:4040.
    #[arg(long, env = "KILN_PUSH_URL")]
    push_url: String,
    /// Tenant (sent as X-Scope-OrgID).
    #[arg(long, env = "KILN_TENANT")]
    tenant: Option<String>,
    /// Samples per second on each CPU.
    #[arg(long, default_value_t = 19, value_parser = clap::value_parser!(u64).range(1..=1000))]
    frequency: u64,
    /// Seconds covered by one report.
    #[arg(long, default_value_t = 10.0)]
    interval: f64,
    /// Bytes of reports kept while the server cannot take them; the oldest go first.
    #[arg(long, default_value_t = 32 << 20)]
    buffer_bytes: usize,
    /// Kiln config file: its `agent:` section's `relabel_configs` (Prometheus's shape, over
    /// the process labels and `__meta_process_pid|comm|exe|cgroup`,
    /// `__meta_process_env_<NAME>`) and `env_allowlist` (the only variables read).
    #[arg(long, env = "KILN_AGENT_CONFIG")]
    config: Option<std::path::PathBuf>,
    /// Where the agent serves its own /metrics; empty turns it off.
    #[arg(
        long,
        env = "KILN_AGENT_METRICS_LISTEN",
        default_value = "127.0.0.1:4041"
    )]
    metrics_listen: String,
}

/// Encoded pushes waiting to be sent, bounded by bytes.
#[derive(Default)]
struct Queue {
    pushes: Mutex<(VecDeque<Vec<u8>>, usize)>,
    ready: Condvar,
    dropped: AtomicU64,
    sent: AtomicU64,
    sent_bytes: AtomicU64,
}

impl Queue {
    fn push(&self, body: Vec<u8>, limit: usize) {
        let Ok(mut guard) = self.pushes.lock() else {
            return;
        };
        let (pushes, bytes) = &mut *guard;
        *bytes += body.len();
        pushes.push_back(body);
        while *bytes > limit && pushes.len() > 1 {
            if let Some(oldest) = pushes.pop_front() {
                *bytes -= oldest.len();
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.ready.notify_one();
    }

    fn pop(&self, stop: &AtomicBool) -> Option<Vec<u8>> {
        let mut guard = self.pushes.lock().ok()?;
        loop {
            if let Some(body) = guard.0.pop_front() {
                guard.1 -= body.len();
                return Some(body);
            }
            if stop.load(Ordering::Relaxed) {
                return None;
            }
            guard = self
                .ready
                .wait_timeout(guard, Duration::from_millis(200))
                .ok()?
                .0;
        }
    }
}

/// The collector's counters, the queue's, and the agent's own resident memory.
fn metrics_text(stats: &kiln_agent::AgentStats, queue: &Queue) -> String {
    let mut text = stats.metrics_text();
    let queued = queue.pushes.lock().map(|guard| guard.1).unwrap_or(0);
    let page = 4096;
    let rss = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * page);
    for (name, kind, help, value) in [
        (
            "kiln_agent_pushes_sent_total",
            "counter",
            "Pushes the server took",
            queue.sent.load(Ordering::Relaxed),
        ),
        (
            "kiln_agent_push_bytes_total",
            "counter",
            "Bytes of pushes the server took",
            queue.sent_bytes.load(Ordering::Relaxed),
        ),
        (
            "kiln_agent_reports_dropped_total",
            "counter",
            "Pushes dropped: the queue was full, or the server refused them",
            queue.dropped.load(Ordering::Relaxed),
        ),
        (
            "kiln_agent_queue_bytes",
            "gauge",
            "Bytes of pushes waiting for the server",
            queued as u64,
        ),
        (
            "kiln_agent_resident_memory_bytes",
            "gauge",
            "The agent's resident memory",
            rss,
        ),
    ] {
        text.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
        ));
    }
    text
}

/// One Push with every process's report of an interval.
fn encode(reports: Vec<Report>) -> Vec<u8> {
    let series = reports
        .into_iter()
        .map(|report| RawProfileSeries {
            labels: report
                .labels
                .into_iter()
                .map(|(name, value)| LabelPair { name, value })
                .collect(),
            samples: vec![RawSample {
                raw_profile: report.profile.encode_to_bytes(),
                id: String::new(),
            }],
        })
        .collect();
    PushRequest { series }.encode_to_vec()
}

pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let interval = Duration::try_from_secs_f64(args.interval)
        .ok()
        .filter(|d| !d.is_zero())
        .context("--interval must be a positive number of seconds")?;
    // One file format for the server and the agent: the agent reads its section.
    let settings = match &args.config {
        Some(path) => {
            kiln_server::ServerConfig::from_yaml_file(path)
                .map_err(anyhow::Error::msg)?
                .agent
        }
        None => kiln_server::config::AgentSettings::default(),
    };
    let config = AgentConfig {
        frequency: args.frequency,
        interval,
        relabel_configs: settings.relabel_configs,
        env_allowlist: settings.env_allowlist,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let queue = Arc::new(Queue::default());
    // The symbolizer caches are not Send: the collector lives on its own thread from the
    // start, and says from there whether the events could be opened.
    let (opened, open_result) = std::sync::mpsc::channel();
    let collecting = {
        let (stop, queue, limit) = (stop.clone(), queue.clone(), args.buffer_bytes);
        std::thread::spawn(move || {
            let collector = match Collector::open(config) {
                Ok(collector) => collector,
                Err(err) => {
                    let _ = opened.send(Err(err));
                    return;
                }
            };
            let _ = opened.send(Ok((collector.cpus(), collector.stats())));
            collector.run(&stop, |reports| {
                if !reports.is_empty() {
                    queue.push(encode(reports), limit);
                }
            })
        })
    };
    let (cpus, stats) = tokio::task::spawn_blocking(move || open_result.recv())
        .await
        .context("the collector thread failed")?
        .context("the collector thread failed")??;
    tracing::info!(
        cpus,
        frequency = args.frequency,
        push_url = %args.push_url,
        "profiling every process on this host"
    );
    let pushing = {
        let (stop, queue) = (stop.clone(), queue.clone());
        let url = format!(
            "{}/push.v1.PusherService/Push",
            args.push_url.trim_end_matches('/')
        );
        let tenant = args.tenant.clone();
        std::thread::spawn(move || push_loop(&queue, &stop, &url, tenant.as_deref()))
    };
    if !args.metrics_listen.is_empty() {
        let listener = tokio::net::TcpListener::bind(&args.metrics_listen)
            .await
            .with_context(|| format!("cannot listen on {} for /metrics", args.metrics_listen))?;
        let (stats, queue) = (stats.clone(), queue.clone());
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let text = metrics_text(&stats, &queue);
                async move { ([("content-type", "text/plain; version=0.0.4")], text) }
            }),
        );
        tokio::spawn(async move {
            if let Err(err) = axum::serve(listener, app).await {
                tracing::warn!(error = %err, "the agent's /metrics stopped");
            }
        });
    }
    tokio::signal::ctrl_c().await?;
    stop.store(true, Ordering::Relaxed);
    let _ = tokio::task::spawn_blocking(move || {
        let _ = collecting.join();
        let _ = pushing.join();
    })
    .await;
    tracing::info!(
        samples = stats.samples.load(Ordering::Relaxed),
        lost = stats.lost.load(Ordering::Relaxed),
        reports = stats.reports.load(Ordering::Relaxed),
        pushes_sent = queue.sent.load(Ordering::Relaxed),
        pushes_dropped = queue.dropped.load(Ordering::Relaxed),
        "agent stopped"
    );
    Ok(())
}

/// Sends queued pushes in order; a failure is retried with backoff (the queue's bound
/// keeps memory flat meanwhile), a refusal (4xx) is logged and dropped.
fn push_loop(queue: &Queue, stop: &AtomicBool, url: &str, tenant: Option<&str>) {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(30))
        .build();
    while let Some(body) = queue.pop(stop) {
        let mut backoff = Duration::from_millis(250);
        loop {
            let mut request = agent.post(url).set("Content-Type", "application/proto");
            if let Some(tenant) = tenant {
                request = request.set("X-Scope-OrgID", tenant);
            }
            match request.send_bytes(&body) {
                Ok(_) => {
                    queue.sent.fetch_add(1, Ordering::Relaxed);
                    queue
                        .sent_bytes
                        .fetch_add(body.len() as u64, Ordering::Relaxed);
                    break;
                }
                Err(ureq::Error::Status(status, response))
                    if (400..500).contains(&status) && status != 429 =>
                {
                    let text = response.into_string().unwrap_or_default();
                    tracing::warn!(status, error = %text.trim(), "push refused; dropped");
                    queue.dropped.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                Err(err) => {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    tracing::warn!(error = %err, retry_in = ?backoff, "push failed");
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
        }
    }
}
