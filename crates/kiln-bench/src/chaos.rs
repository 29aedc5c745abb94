//! `kiln bench chaos`: a scaled-out deployment under faults, checked for what it promises.
//!
//! Ingest, query and compact nodes run as `kiln server` processes over a real PostgreSQL
//! and a real S3-compatible server (kiln-testkit starts both on loopback). Writers push
//! without pause to random ingest nodes; every `--kill-every` seconds a random ingest
//! node is killed with SIGKILL and started again; once, a query node is killed while a
//! week-long query runs on another; once, PostgreSQL is restarted. Writers never retry:
//! a write is acknowledged or it is not, and each write carries a function of its own
//! (`w<n>`) with a known value, so that afterwards each can be looked up alone.
//!
//! Then, with the faults over: every acknowledged write is present exactly once (its
//! function holds exactly its value: not missing, not doubled); an unacknowledged one is
//! present once or not at all; every query either answered with at least what had been
//! acknowledged before it started, or failed with a retryable status (429, 503) or on a
//! node that was down; and compaction caught up (no level-0 dataset older than a minute).
//! Any breach makes the bench fail, so its short form is a test.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use prost::Message;
use rand::Rng;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
/// Folded samples at 100 Hz: each counts 10 ms.
const NANOS_PER_SAMPLE: i64 = 10_000_000;

#[derive(Args, Clone, Debug)]
pub struct ChaosArgs {
    /// Ingest processes.
    #[arg(long, default_value_t = 3)]
    pub ingest: usize,
    /// Query processes.
    #[arg(long, default_value_t = 2)]
    pub query: usize,
    /// Compact processes.
    #[arg(long, default_value_t = 2)]
    pub compact: usize,
    /// Seconds of sustained ingest under faults.
    #[arg(long, default_value_t = 300)]
    pub duration: u64,
    /// Seconds between two kills of a random ingest node.
    #[arg(long, default_value_t = 30)]
    pub kill_every: u64,
    /// Concurrent writers.
    #[arg(long, default_value_t = 4)]
    pub writers: usize,
    /// Services the writes are spread over.
    #[arg(long, default_value_t = 12)]
    pub services: usize,
}

/// One `kiln server` process and what it takes to start it again.
struct Node {
    target: &'static str,
    port: u16,
    data_dir: PathBuf,
    child: Option<crate::common::KilnChild>,
    up: Arc<AtomicBool>,
}

struct Cluster {
    binary: PathBuf,
    config: PathBuf,
    metastore: String,
    object_store: String,
    env: Vec<(String, String)>,
}

impl Cluster {
    fn start(&self, node: &mut Node) -> anyhow::Result<()> {
        // Each node's errors (expected ones among them: writes cut by a kill) in its log.
        std::fs::create_dir_all(&node.data_dir)?;
        let child = crate::common::KilnCommand::server(&self.binary, &node.data_dir)
            .port(node.port)
            .args(["--target", node.target])
            .arg("--config")
            .arg(&self.config)
            .args(["--metastore", &self.metastore])
            .args(["--object-store", &self.object_store])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .log(crate::common::Log::File(node.data_dir.join("kiln.log")))
            .start()
            .with_context(|| format!("{} node", node.target))?;
        node.child = Some(child);
        node.up.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// SIGKILL: no shutdown, no leaving the membership.
    fn kill(node: &mut Node) {
        node.up.store(false, Ordering::SeqCst);
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        Cluster::kill(self);
    }
}

/// What became of one write.
#[derive(Clone, Copy)]
struct Write {
    value: i64,
    acked: bool,
    /// The ingest node it was sent to, and when it was answered.
    node: usize,
    at: Instant,
}

#[derive(Default)]
struct QueryOutcomes {
    answered: u64,
    /// Answers with less than what was acknowledged before the query started.
    wrong: Vec<String>,
    retryable: u64,
    on_a_down_node: u64,
    unclean: Vec<String>,
}

/// A week's flame graph of every service through querier.v1 (what the UI and Grafana
/// ask): each function's self value.
fn week(url: &str, now_ms: i64) -> Result<HashMap<String, i64>, (Option<u16>, String)> {
    let request = kiln_query::api::SelectMergeStacktracesRequest {
        profile_type_id: CPU.into(),
        label_selector: "{}".into(),
        start: now_ms - 7 * 86_400_000,
        end: now_ms + 3_600_000,
        max_nodes: Some(-1),
        format: kiln_query::api::PROFILE_FORMAT_TREE,
        ..Default::default()
    };
    let response = crate::http::Http::new(Duration::from_secs(60))
        .post(&format!(
            "{url}/querier.v1.QuerierService/SelectMergeStacktraces"
        ))
        .header("Content-Type", "application/proto")
        .send_bytes(&request.encode_to_vec());
    let body = match response {
        Ok(response) => response.bytes().to_vec(),
        Err(crate::http::Error::Status(status, response)) => {
            return Err((Some(status), response.text()))
        }
        Err(err) => return Err((None, err.to_string())),
    };
    let response = kiln_query::api::SelectMergeStacktracesResponse::decode(body.as_slice())
        .map_err(|err| (None, err.to_string()))?;
    let nodes = kiln_query::merge::read_tree_bytes(&response.tree)
        .map_err(|err| (None, err.to_string()))?;
    let mut functions: HashMap<String, i64> = HashMap::new();
    for (path, self_value) in nodes {
        if let Some(name) = path.last() {
            *functions.entry(name.clone()).or_default() += self_value;
        }
    }
    Ok(functions)
}

/// Runs the cluster in a temporary directory, removed when every check passed; after a
/// breach it is kept, and named in the error, for the nodes' logs (`<node>/kiln.log`).
pub fn run(args: ChaosArgs) -> anyhow::Result<()> {
    let temp = crate::common::tempfile_dir("kiln-chaos")?;
    match run_in(args, &temp) {
        Ok(()) => {
            let _ = std::fs::remove_dir_all(&temp);
            Ok(())
        }
        Err(err) => Err(err.context(format!("the nodes' logs are in {}", temp.display()))),
    }
}

fn run_in(args: ChaosArgs, temp: &std::path::Path) -> anyhow::Result<()> {
    let started = Instant::now();
    let postgres = kiln_testkit::postgres::start_own().map_err(anyhow::Error::msg)?;
    let s3 = kiln_testkit::s3::s3().map_err(anyhow::Error::msg)?;
    let config = temp.join("kiln.yaml");
    std::fs::write(
        &config,
        "node:\n  heartbeat_ms: 500\n  lease_ms: 3000\n  fanout_min_profiles: 50\n\
         compaction:\n  interval_ms: 1000\nlimits:\n  retention_days: 0\n",
    )?;
    let cluster = Cluster {
        binary: std::env::current_exe()?,
        config,
        metastore: postgres.fresh_database(),
        object_store: s3.fresh_bucket(),
        env: s3.env(),
    };
    let mut nodes: Vec<Node> = Vec::new();
    for (target, count) in [
        ("ingest", args.ingest.max(1)),
        ("query", args.query.max(1)),
        ("compact", args.compact),
    ] {
        for index in 0..count {
            nodes.push(Node {
                target,
                port: kiln_child::free_port(),
                data_dir: temp.join(format!("{target}-{index}")),
                child: None,
                up: Arc::new(AtomicBool::new(false)),
            });
        }
    }
    for node in &mut nodes {
        cluster.start(node)?;
    }
    let urls = |target: &str| -> Vec<(String, Arc<AtomicBool>)> {
        nodes
            .iter()
            .filter(|node| node.target == target)
            .map(|node| (format!("http://127.0.0.1:{}", node.port), node.up.clone()))
            .collect()
    };
    let (ingest_urls, query_urls) = (urls("ingest"), urls("query"));
    // Every node has seen the others before the load starts.
    std::thread::sleep(Duration::from_millis(1_500));
    println!(
        "kiln bench chaos: {} ingest, {} query, {} compact processes over PostgreSQL and S3 (moto); {} s, an ingest node killed every {} s",
        args.ingest, args.query, args.compact, args.duration, args.kill_every
    );

    let deadline = Instant::now() + Duration::from_secs(args.duration);
    let writes: Arc<Mutex<Vec<Write>>> = Arc::default();
    let acked_total = Arc::new(AtomicI64::new(0));
    let refused: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let next = Arc::new(AtomicU64::new(0));
    let now_s = kiln_model::time::now_ms() / 1000;
    let writers: Vec<_> = (0..args.writers.max(1))
        .map(|_| {
            let (writes, acked_total, refused, next) = (
                writes.clone(),
                acked_total.clone(),
                refused.clone(),
                next.clone(),
            );
            let ingest_urls = ingest_urls.clone();
            let services = args.services.max(1) as u64;
            std::thread::spawn(move || {
                let mut rng = rand::rng();
                while Instant::now() < deadline {
                    let up: Vec<usize> = (0..ingest_urls.len())
                        .filter(|&node| ingest_urls[node].1.load(Ordering::SeqCst))
                        .collect();
                    if up.is_empty() {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                    let node = up[rng.random_range(0..up.len())];
                    let url = &ingest_urls[node].0;
                    let seq = next.fetch_add(1, Ordering::SeqCst);
                    let value = 1 + (seq % 7) as i64;
                    // Times spread over the past six days, so the week's query spans
                    // many blocks.
                    let from = now_s - (seq as i64 * 7_919) % (6 * 86_400) - 60;
                    let path = format!(
                        "{url}/ingest?name=chaos-{}.cpu&format=folded&sampleRate=100&from={from}&until={}",
                        seq % services,
                        from + 10
                    );
                    let body = format!("main;handle;w{seq} {value}\n");
                    let outcome = crate::http::Http::new(Duration::from_secs(30)).post(&path)
                        .send_string(&body);
                    let acked = match outcome {
                        Ok(_) => true,
                        Err(crate::http::Error::Status(status, _)) => {
                            *refused.lock().expect("refused").entry(status.to_string()).or_default() += 1;
                            false
                        }
                        Err(_) => {
                            *refused.lock().expect("refused").entry("connection".into()).or_default() += 1;
                            false
                        }
                    };
                    let mut writes = writes.lock().expect("writes");
                    if writes.len() <= seq as usize {
                        writes.resize(seq as usize + 1, Write { value: 0, acked: false, node, at: Instant::now() });
                    }
                    writes[seq as usize] = Write { value, acked, node, at: Instant::now() };
                    if acked {
                        acked_total.fetch_add(value, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();

    // Queries all along: each must hold what was acknowledged before it began.
    let outcomes: Arc<Mutex<QueryOutcomes>> = Arc::default();
    let querier = {
        let (outcomes, acked_total, query_urls) =
            (outcomes.clone(), acked_total.clone(), query_urls.clone());
        std::thread::spawn(move || {
            let mut rng = rand::rng();
            while Instant::now() < deadline {
                let (url, up) = &query_urls[rng.random_range(0..query_urls.len())];
                check_query(url, up, &acked_total, &outcomes);
                std::thread::sleep(Duration::from_millis(500));
            }
        })
    };

    // The faults, from this thread.
    let mut kills = 0;
    // Each ingest node restarted, and when it was up again.
    let mut restarts: Vec<(usize, Instant)> = Vec::new();
    let mut postgres_restarted = false;
    let mut query_node_killed = false;
    let mut next_kill = Instant::now() + Duration::from_secs(args.kill_every.max(1));
    let mut rng = rand::rng();
    while Instant::now() < deadline {
        let progress = 1.0
            - deadline
                .saturating_duration_since(Instant::now())
                .as_secs_f64()
                / args.duration.max(1) as f64;
        if !postgres_restarted && progress >= 0.3 {
            postgres_restarted = true;
            postgres
                .restart(Duration::from_secs(2))
                .map_err(anyhow::Error::msg)?;
            println!(
                "  PostgreSQL restarted (2 s down) at {:.0} %",
                progress * 100.0
            );
        }
        if !query_node_killed && progress >= 0.5 && query_urls.len() >= 2 {
            query_node_killed = true;
            // A week's query on the first query node while the second dies: its share
            // goes elsewhere.
            let (url, up) = query_urls[0].clone();
            let during = {
                let (outcomes, acked_total) = (outcomes.clone(), acked_total.clone());
                std::thread::spawn(move || check_query(&url, &up, &acked_total, &outcomes))
            };
            let index = nodes
                .iter()
                .position(|node| node.target == "query")
                .map_or(0, |first| first + 1);
            Cluster::kill(&mut nodes[index]);
            let _ = during.join();
            for _ in 0..3 {
                check_query(&query_urls[0].0, &query_urls[0].1, &acked_total, &outcomes);
            }
            cluster.start(&mut nodes[index])?;
            println!("  query node killed during a week's query, and restarted");
        }
        if Instant::now() >= next_kill {
            next_kill += Duration::from_secs(args.kill_every.max(1));
            let ingest: Vec<usize> = (0..nodes.len())
                .filter(|&index| nodes[index].target == "ingest")
                .collect();
            let index = ingest[rng.random_range(0..ingest.len())];
            Cluster::kill(&mut nodes[index]);
            kills += 1;
            std::thread::sleep(Duration::from_secs(1));
            cluster.start(&mut nodes[index])?;
            let position = ingest.iter().position(|i| *i == index).unwrap_or(0);
            restarts.push((position, Instant::now()));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for writer in writers {
        let _ = writer.join();
    }
    let _ = querier.join();
    let load_seconds = started.elapsed().as_secs_f64();

    // Compaction catches up: no level-0 dataset older than a minute.
    let caught_up = wait_for_compaction(&cluster.metastore)?;
    let url = &query_urls[0].0;
    let functions = week(url, kiln_model::time::now_ms())
        .map_err(|(status, text)| anyhow::anyhow!("final query failed ({status:?}): {text}"))?;
    let writes = writes.lock().expect("writes").clone();
    let (mut acked, mut once, mut lost, mut doubled, mut unacked_present, mut unacked_absent) =
        (0, 0, 0, 0, 0, 0);
    let mut breaches = Vec::new();
    for (seq, write) in writes.iter().enumerate() {
        let stored = functions.get(&format!("w{seq}")).copied().unwrap_or(0);
        let expected = write.value * NANOS_PER_SAMPLE;
        if write.acked {
            acked += 1;
            match stored {
                s if s == expected => once += 1,
                0 => {
                    lost += 1;
                    breaches.push(format!("w{seq} acknowledged and lost"));
                }
                s => {
                    doubled += 1;
                    breaches.push(format!(
                        "w{seq} acknowledged, stored {s} (expected {expected})"
                    ));
                }
            }
        } else if stored == 0 {
            unacked_absent += 1;
        } else if stored == expected {
            unacked_present += 1;
        } else {
            breaches.push(format!("w{seq} unacknowledged, stored {stored}"));
        }
    }
    // A node killed and started again takes writes again: every restart but one too close
    // to the end to be sent any is followed by a write it acknowledged.
    let judged: Vec<&(usize, Instant)> = restarts
        .iter()
        .filter(|(_, at)| deadline.saturating_duration_since(*at) >= Duration::from_secs(2))
        .collect();
    let recovered = judged
        .iter()
        .filter(|(node, up)| {
            writes
                .iter()
                .any(|write| write.acked && write.node == *node && write.at > *up)
        })
        .count();
    if recovered < judged.len() {
        breaches.push(format!(
            "{} of {} restarted ingest nodes acknowledged no write after their restart",
            judged.len() - recovered,
            judged.len()
        ));
    }
    let outcomes = outcomes.lock().expect("outcomes");
    let refused = refused.lock().expect("refused");
    println!();
    println!("| | |");
    println!("|---|---|");
    println!(
        "| writes | {} ({:.0}/s) |",
        writes.len(),
        writes.len() as f64 / args.duration.max(1) as f64
    );
    println!("| acknowledged | {acked} |");
    println!("| acknowledged, present exactly once | {once} |");
    println!("| acknowledged, lost | {lost} |");
    println!("| acknowledged, stored twice or wrong | {doubled} |");
    println!("| not acknowledged: present / absent | {unacked_present} / {unacked_absent} |");
    println!("| refused writes by status | {:?} |", sorted(&refused));
    println!("| ingest kills (SIGKILL + restart) | {kills} |");
    println!(
        "| restarted ingest nodes acknowledging writes again | {recovered} / {} |",
        judged.len()
    );
    println!("| PostgreSQL restarts | {} |", u8::from(postgres_restarted));
    println!(
        "| query node killed during a week's query | {} |",
        u8::from(query_node_killed)
    );
    println!(
        "| queries: answered / retryable 429-503 / on a down node / unclean / wrong | {} / {} / {} / {} / {} |",
        outcomes.answered,
        outcomes.retryable,
        outcomes.on_a_down_node,
        outcomes.unclean.len(),
        outcomes.wrong.len()
    );
    println!(
        "| compaction caught up | {} |",
        if caught_up { "yes" } else { "no" }
    );
    println!(
        "| wall time | {load_seconds:.0} s load, {:.0} s in all |",
        started.elapsed().as_secs_f64()
    );
    breaches.extend(outcomes.unclean.iter().cloned());
    breaches.extend(outcomes.wrong.iter().cloned());
    if !caught_up {
        breaches.push("compaction did not catch up within 120 s".to_string());
    }
    if acked == 0 || outcomes.answered == 0 {
        breaches.push("nothing acknowledged or answered: the load never ran".to_string());
    }
    if !breaches.is_empty() {
        bail!(
            "{} breaches, the first: {}",
            breaches.len(),
            breaches[..breaches.len().min(10)].join("; ")
        );
    }
    println!(
        "\nevery acknowledged write present exactly once; every query answered or refused cleanly"
    );
    Ok(())
}

fn sorted(map: &HashMap<String, u64>) -> Vec<(String, u64)> {
    let mut entries: Vec<(String, u64)> = map.iter().map(|(k, v)| (k.clone(), *v)).collect();
    entries.sort();
    entries
}

/// One week's query on `url`, judged against what was acknowledged before it began.
fn check_query(
    url: &str,
    up: &AtomicBool,
    acked_total: &AtomicI64,
    outcomes: &Mutex<QueryOutcomes>,
) {
    let before = acked_total.load(Ordering::SeqCst);
    let was_up = up.load(Ordering::SeqCst);
    let result = week(url, kiln_model::time::now_ms());
    let mut outcomes = outcomes.lock().expect("outcomes");
    match result {
        Ok(functions) => {
            let total: i64 = functions
                .iter()
                .filter(|(name, _)| name.starts_with('w'))
                .map(|(_, value)| value)
                .sum();
            outcomes.answered += 1;
            if total < before * NANOS_PER_SAMPLE {
                outcomes.wrong.push(format!(
                    "a query on {url} answered {total}, less than the {} acknowledged before it",
                    before * NANOS_PER_SAMPLE
                ));
            }
        }
        Err((Some(429 | 503), _)) => outcomes.retryable += 1,
        Err(_) if !was_up || !up.load(Ordering::SeqCst) => outcomes.on_a_down_node += 1,
        Err((status, text)) => outcomes.unclean.push(format!(
            "a query on {url} failed: {status:?} {}",
            text.trim()
        )),
    }
}

fn wait_for_compaction(metastore_url: &str) -> anyhow::Result<bool> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let metastore = runtime.block_on(kiln_metastore::Metastore::open(metastore_url))?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let now = kiln_model::time::now_ms();
        let stale = runtime
            .block_on(metastore.datasets_at_level(0))?
            .iter()
            .filter(|(_, created)| now - created > 60_000)
            .count();
        if stale == 0 {
            return Ok(true);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Ok(false)
}
