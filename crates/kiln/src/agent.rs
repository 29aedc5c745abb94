//! `kiln agent`: profiles every process on this host and sends one self-contained profile
//! per process per interval: to a Kiln server through Pyroscope's push API
//! (`push.v1.PusherService/Push`), or to any OTLP receiver as OTLP profiles over HTTP.
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
use kiln_agent::procs::status_kib;
use kiln_agent::{AgentConfig, Collector, Report};
use kiln_ingest::push::{LabelPair, PushRequest, RawProfileSeries, RawSample};
use prost::Message;

#[derive(Args)]
pub struct AgentArgs {
    /// Kiln to push to, e.g. http://kiln:4040.
    #[arg(
        long,
        env = "KILN_PUSH_URL",
        required_unless_present_any = ["otlp_endpoint", "status"],
        conflicts_with = "otlp_endpoint"
    )]
    push_url: Option<String>,
    /// An OTLP/HTTP receiver of profiles instead, e.g. http://collector:4318 (the path
    /// `/v1development/profiles` is added when the URL has none).
    #[arg(long, env = "KILN_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// Tenant (sent as X-Scope-OrgID).
    #[arg(long, env = "KILN_TENANT")]
    tenant: Option<String>,
    #[command(flatten)]
    auth: crate::client::ClientAuth,
    /// Samples per second on each CPU.
    #[arg(long, default_value_t = 19, value_parser = clap::value_parser!(u64).range(1..=1000))]
    frequency: u64,
    /// Seconds covered by one report.
    #[arg(long, default_value_t = 10.0)]
    interval: f64,
    /// Bytes of reports kept while the server cannot take them; the oldest go first.
    /// A quarter of --memory-limit unless given.
    #[arg(long)]
    buffer_bytes: Option<usize>,
    /// The agent's memory budget: unwind tables, symbol caches and waiting reports stay
    /// within it (e.g. 128MiB, 1GiB, or bytes).
    #[arg(long, env = "KILN_AGENT_MEMORY_LIMIT", default_value = "128MiB", value_parser = parse_size)]
    memory_limit: usize,
    /// Count the samples of frame-pointer programs in the kernel with eBPF (`--ebpf
    /// false`: every sample through the perf ring); the output is the same. On by default:
    /// it halves the agent's CPU on such programs (docs/benchmarks.md). Where the program
    /// cannot be loaded the agent says why and samples without it.
    #[arg(long, env = "KILN_AGENT_EBPF", default_value_t = true, action = clap::ArgAction::Set)]
    ebpf: bool,
    /// Also profile where threads block (a lock, a socket, the disk, a sleep): a second
    /// profile per process, `off_cpu`, in nanoseconds. Needs eBPF (Linux 5.18+).
    #[arg(long, env = "KILN_AGENT_OFF_CPU")]
    off_cpu: bool,
    /// The share of blocking switches sampled with --off-cpu, 0 to 1; each is weighted by
    /// its inverse, so the totals are estimates of the whole. Bounds the cost on a host
    /// that switches often (docs/benchmarks.md).
    #[arg(long, env = "KILN_AGENT_OFF_CPU_THRESHOLD", value_parser = parse_share)]
    off_cpu_threshold: Option<f64>,
    /// Name the functions of Python, Ruby and Node.js programs from the interpreter's own
    /// memory, with no change to them (`--interpreters false`: their native frames only,
    /// and JIT code from perf maps). Python's and Ruby's are read with eBPF; Node.js's
    /// need no eBPF.
    #[arg(long, env = "KILN_AGENT_INTERPRETERS", action = clap::ArgAction::Set)]
    interpreters: Option<bool>,
    /// Name the frames of binaries and libraries on this host (`--symbolize false`: send
    /// their build ids and file offsets only, for the server to name from uploaded or
    /// debuginfod debug files; kernel, JIT and interpreted frames are named either way).
    #[arg(long, env = "KILN_AGENT_SYMBOLIZE", action = clap::ArgAction::Set)]
    symbolize: Option<bool>,
    /// Label each process in a Kubernetes pod with its pod: namespace, pod, container,
    /// node, controller kind and name, and `service_name` (the pod's
    /// `profiles.grafana.com/service_name` or `profefe.com/service` annotation, else
    /// `<namespace>/<controller>`); relabeling sees `__meta_kubernetes_*`. Watches the
    /// pods of node `NODE_NAME` through the pod's service account (`$KUBECONFIG` outside a
    /// pod).
    #[arg(long, env = "KILN_AGENT_KUBERNETES")]
    kubernetes: bool,
    /// Print what the agent running on this host is doing (from its /metrics at
    /// --metrics-listen): per binary, how stacks are unwound and how many were cut.
    #[arg(long)]
    status: bool,
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
#[derive(Debug, Default)]
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

/// The push queue's counters and the agent's own resident memory, read at each scrape.
#[derive(Debug)]
struct QueueMetrics(Arc<Queue>);

impl prometheus_client::collector::Collector for QueueMetrics {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::metrics::MetricType::{Counter, Gauge};
        let queue = &self.0;
        let queued = queue.pushes.lock().map(|guard| guard.1).unwrap_or(0);
        let own = std::process::id();
        for (name, kind, help, value) in [
            (
                "kiln_agent_pushes_sent",
                Counter,
                "Pushes the server took",
                queue.sent.load(Ordering::Relaxed),
            ),
            (
                "kiln_agent_push_bytes",
                Counter,
                "Bytes of pushes the server took",
                queue.sent_bytes.load(Ordering::Relaxed),
            ),
            (
                "kiln_agent_reports_dropped",
                Counter,
                "Pushes dropped: the queue was full, or the server refused them",
                queue.dropped.load(Ordering::Relaxed),
            ),
            (
                "kiln_agent_queue_bytes",
                Gauge,
                "Bytes of pushes waiting for the server",
                queued as u64,
            ),
            (
                "kiln_agent_resident_memory_bytes",
                Gauge,
                "The agent's resident memory",
                status_kib(own, "VmRSS:") * 1024,
            ),
            (
                "kiln_agent_resident_anonymous_bytes",
                Gauge,
                "The agent's own heap and stacks: resident memory less the file-backed pages of binaries it mapped to symbolize, which the kernel can reclaim",
                status_kib(own, "RssAnon:") * 1024,
            ),
        ] {
            kiln_agent::encode_value(&mut encoder, name, help, kind, value)?;
        }
        Ok(())
    }
}

/// The agent's `/metrics`: the collector's counters and the queue's, through one registry.
fn metrics_registry(
    stats: Arc<kiln_agent::AgentStats>,
    queue: Arc<Queue>,
) -> prometheus_client::registry::Registry {
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(stats));
    registry.register_collector(Box::new(QueueMetrics(queue)));
    registry
}

/// Where reports go, and in what protocol.
#[derive(Clone)]
enum Target {
    Push(String),
    Otlp(String),
}

impl Target {
    fn from_args(args: &AgentArgs) -> anyhow::Result<Target> {
        match (&args.push_url, &args.otlp_endpoint) {
            (Some(url), None) => Ok(Target::Push(format!(
                "{}/push.v1.PusherService/Push",
                url.trim_end_matches('/')
            ))),
            (None, Some(endpoint)) => {
                let after_scheme = endpoint
                    .split_once("://")
                    .map_or(endpoint.as_str(), |(_, rest)| rest);
                let has_path = after_scheme.trim_end_matches('/').contains('/');
                Ok(Target::Otlp(if has_path {
                    endpoint.clone()
                } else {
                    format!("{}/v1development/profiles", endpoint.trim_end_matches('/'))
                }))
            }
            _ => anyhow::bail!("give one of --push-url and --otlp-endpoint"),
        }
    }

    fn url(&self) -> &str {
        match self {
            Target::Push(url) | Target::Otlp(url) => url,
        }
    }

    fn content_type(&self) -> &'static str {
        match self {
            Target::Push(_) => "application/proto",
            Target::Otlp(_) => "application/x-protobuf",
        }
    }

    /// The requests for one interval's reports: one Push with every process, or one OTLP
    /// export per process (each with its own dictionary, so each stands alone).
    fn encode(&self, reports: Vec<Report>) -> Vec<Vec<u8>> {
        match self {
            Target::Push(_) => vec![encode(reports)],
            Target::Otlp(_) => reports.into_iter().map(encode_otlp).collect(),
        }
    }
}

/// A report as an OTLP export: its labels as resource attributes (`service_name` as
/// `service.name`, as OpenTelemetry names it), the profile type from its sample types.
fn encode_otlp(report: Report) -> Vec<u8> {
    let attributes: Vec<(&str, &str)> = report
        .labels
        .iter()
        .filter(|(name, _)| name != "__name__")
        .map(|(name, value)| {
            let name = if name == "service_name" {
                "service.name"
            } else {
                name.as_str()
            };
            (name, value.as_str())
        })
        .collect();
    let time = u64::try_from(report.profile.time_nanos).unwrap_or(0);
    kiln_ingest::otlp::request_from_pprof(&report.profile, &attributes, time).encode_to_vec()
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

/// `--memory-limit`'s size ([`kiln_model::size::parse_bytes`]).
fn parse_size(text: &str) -> Result<usize, String> {
    let bytes = kiln_model::size::parse_bytes(text)?;
    usize::try_from(bytes).map_err(|_| format!("{text:?} is too large"))
}

/// A share: a number from 0 (exclusive) to 1.
fn parse_share(text: &str) -> Result<f64, String> {
    let share: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    if share > 0.0 && share <= 1.0 {
        Ok(share)
    } else {
        Err(format!(
            "{text} is not a share: it must be above 0 and at most 1"
        ))
    }
}

/// `kiln agent --status`: the running agent's per-binary unwinding, from its /metrics.
fn print_status(metrics_listen: &str) -> anyhow::Result<()> {
    let url = format!("http://{metrics_listen}/metrics");
    let text = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?
        .get(&url)
        .send()
        .and_then(reqwest::blocking::Response::error_for_status)
        .and_then(reqwest::blocking::Response::text)
        .with_context(|| {
            format!(
                "no agent answers at {url} (is `kiln agent` running with this --metrics-listen?)"
            )
        })?;
    let mut rows: std::collections::BTreeMap<String, (String, f64, f64)> = Default::default();
    let mut totals = Vec::new();
    let mut interpreted: Vec<(String, String, String, f64)> = Vec::new();
    for line in text.lines().filter(|line| !line.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let value: f64 = value.parse().unwrap_or(0.0);
        let label = |name: &str| {
            let start = series.find(&format!("{name}=\""))? + name.len() + 2;
            let end = series[start..].find('"')? + start;
            Some(series[start..end].to_string())
        };
        if series.starts_with("kiln_agent_stacks_total{") {
            if let (Some(binary), Some(method)) = (label("binary"), label("method")) {
                let row = rows.entry(binary).or_default();
                row.0 = method;
                row.1 = value;
            }
        } else if series.starts_with("kiln_agent_stacks_truncated_total{") {
            if let Some(binary) = label("binary") {
                rows.entry(binary).or_default().2 = value;
            }
        } else if series.starts_with("kiln_agent_interpreter_stacks_total{") {
            if let (Some(binary), Some(runtime), Some(outcome)) =
                (label("binary"), label("runtime"), label("outcome"))
            {
                interpreted.push((binary, runtime, outcome, value));
            }
        } else if !series.contains('{') {
            totals.push((series.trim_start_matches("kiln_agent_").to_string(), value));
        }
    }
    for (name, value) in totals {
        println!("{name:<32} {value}");
    }
    println!();
    println!(
        "{:<14} {:>10} {:>10}  binary",
        "method", "stacks", "truncated"
    );
    for (binary, (method, stacks, truncated)) in rows {
        println!("{method:<14} {stacks:>10} {truncated:>10}  {binary}");
    }
    if !interpreted.is_empty() {
        // Whether each interpreter's own functions were named, and if not, why.
        println!();
        println!(
            "{:<8} {:>10}  {:<32} binary",
            "runtime", "stacks", "outcome"
        );
        interpreted.sort_by(|a, b| (&a.0, &a.2).cmp(&(&b.0, &b.2)));
        for (binary, runtime, outcome, stacks) in interpreted {
            println!("{runtime:<8} {stacks:>10}  {outcome:<32} {binary}");
        }
    }
    Ok(())
}

pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    if args.status {
        return tokio::task::spawn_blocking(move || print_status(&args.metrics_listen)).await?;
    }
    let interval = Duration::try_from_secs_f64(args.interval)
        .ok()
        .filter(|d| !d.is_zero())
        .context("--interval must be a positive number of seconds")?;
    // One file format for the server and the agent: the agent reads its section.
    let settings = match &args.config {
        Some(path) => {
            kiln_node::ServerConfig::from_yaml_file(path)
                .map_err(anyhow::Error::msg)?
                .agent
        }
        None => kiln_node::config::AgentSettings::default(),
    };
    let config = AgentConfig {
        frequency: args.frequency,
        interval,
        relabel_configs: settings.relabel_configs,
        env_allowlist: settings.env_allowlist,
        memory_limit: args.memory_limit,
        ebpf: args.ebpf,
        off_cpu: (args.off_cpu || settings.off_cpu)
            .then(|| args.off_cpu_threshold.unwrap_or(settings.off_cpu_threshold)),
        interpreters: args.interpreters.unwrap_or(settings.interpreters),
        symbolize: args.symbolize.unwrap_or(settings.symbolize),
        containers: match args.kubernetes || settings.kubernetes {
            true => Some(
                kiln_node::kubernetes::node_pods()
                    .await
                    .context("--kubernetes")?,
            ),
            false => None,
        },
    };
    let target = Target::from_args(&args)?;
    let stop = Arc::new(AtomicBool::new(false));
    let queue = Arc::new(Queue::default());
    let collector = {
        let (stop, queue, limit) = (
            stop.clone(),
            queue.clone(),
            args.buffer_bytes.unwrap_or(args.memory_limit / 4),
        );
        let target = target.clone();
        let sink = move |reports: Vec<Report>| {
            if !reports.is_empty() {
                for body in target.encode(reports) {
                    queue.push(body, limit);
                }
            }
        };
        tokio::task::spawn_blocking(move || Collector::spawn(config, stop, sink))
            .await
            .context("the collector thread failed")??
    };
    let (cpus, stats, collecting) = (collector.cpus, collector.stats, collector.thread);
    tracing::info!(
        cpus,
        frequency = args.frequency,
        to = %target.url(),
        "profiling every process on this host"
    );
    let pushing = {
        let (stop, queue) = (stop.clone(), queue.clone());
        let sender = Sender {
            tenant: args.tenant.clone(),
            authorization: args.auth.authorization()?,
            // A blocking client must be made (and dropped) off the async runtime.
            http: {
                let auth = args.auth.clone();
                tokio::task::spawn_blocking(move || auth.blocking(Duration::from_secs(30)))
                    .await??
            },
        };
        std::thread::spawn(move || push_loop(&queue, &stop, &target, &sender))
    };
    if !args.metrics_listen.is_empty() {
        let listener = tokio::net::TcpListener::bind(&args.metrics_listen)
            .await
            .with_context(|| format!("cannot listen on {} for /metrics", args.metrics_listen))?;
        let registry = Arc::new(metrics_registry(stats.clone(), queue.clone()));
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let mut text = String::new();
                let encoded = prometheus_client::encoding::text::encode(&mut text, &registry);
                async move {
                    match encoded {
                        Ok(()) => (
                            axum::http::StatusCode::OK,
                            [(
                                "content-type",
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            )],
                            text,
                        ),
                        Err(err) => (
                            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                            [("content-type", "text/plain; charset=utf-8")],
                            format!("failed to encode metrics: {err}\n"),
                        ),
                    }
                }
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

/// Who the pushes are from, and how they travel.
struct Sender {
    tenant: Option<String>,
    authorization: Option<String>,
    http: reqwest::blocking::Client,
}

/// Sends queued pushes in order; a failure is retried with backoff (the queue's bound
/// keeps memory flat meanwhile), a refusal (4xx) is logged and dropped. A 401 or 403 is
/// retried too: a token being rotated must not cost the profiles meanwhile.
fn push_loop(queue: &Queue, stop: &AtomicBool, target: &Target, sender: &Sender) {
    while let Some(body) = queue.pop(stop) {
        let mut backoff = Duration::from_millis(250);
        loop {
            let mut request = sender
                .http
                .post(target.url())
                .header("Content-Type", target.content_type())
                .body(body.clone());
            if let Some(tenant) = &sender.tenant {
                request = request.header("X-Scope-OrgID", tenant);
            }
            if let Some(authorization) = &sender.authorization {
                request = request.header("Authorization", authorization);
            }
            let failure = match request.send() {
                Ok(response) if response.status().is_success() => {
                    if let Target::Otlp(_) = target {
                        note_partial_success(response, queue);
                    }
                    queue.sent.fetch_add(1, Ordering::Relaxed);
                    queue
                        .sent_bytes
                        .fetch_add(body.len() as u64, Ordering::Relaxed);
                    break;
                }
                Ok(response) => {
                    let status = response.status().as_u16();
                    let text = response.text().unwrap_or_default();
                    if (400..500).contains(&status) && ![401, 403, 429].contains(&status) {
                        tracing::warn!(status, error = %text.trim(), "push refused; dropped");
                        queue.dropped.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    format!("HTTP {status}: {}", text.trim())
                }
                Err(err) => format!("{:#}", anyhow::Error::new(err)),
            };
            if stop.load(Ordering::Relaxed) {
                return;
            }
            tracing::warn!(error = %failure, retry_in = ?backoff, "push failed");
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_secs(30));
        }
    }
}

/// An OTLP receiver may take a request and still refuse some profiles in it.
fn note_partial_success(response: reqwest::blocking::Response, queue: &Queue) {
    let Ok(body) = response.bytes() else {
        return;
    };
    let Ok(answer) = kiln_ingest::otlp::ExportProfilesServiceResponse::decode(body.as_ref()) else {
        return;
    };
    if let Some(partial) = answer.partial_success {
        if partial.rejected_profiles > 0 {
            tracing::warn!(
                rejected = partial.rejected_profiles,
                error = %partial.error_message,
                "the OTLP receiver refused profiles"
            );
            queue.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}
