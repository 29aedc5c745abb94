//! `kiln bench ingest`: replays real pprof files as many services and instances against a
//! server (an in-process one on a temporary directory unless `--url` is given) and reports
//! throughput and acknowledgement latency. Acks are durable: each one waited for the
//! segment's fsync and metastore commit.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;

#[derive(Args)]
pub struct StagesArgs {
    /// Directory of pprof files (every file that decodes as pprof is used).
    #[arg(long, default_value = "../shared/corpus")]
    corpus: PathBuf,
    /// Passes over the corpus.
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// Profiles per dataset (0: the whole corpus in one). One is the many-services regime,
    /// where each service has a profile or two per flush and per-dataset costs dominate.
    #[arg(long, default_value_t = 0)]
    profiles_per_dataset: usize,
    /// Datasets per block (0: a round's datasets in one). With `--profiles-per-dataset 1`,
    /// one is the segment of a flush at 40 profiles/s over 500 services: one profile in
    /// it, so every block's fixed costs (writer, footer) are paid per profile.
    #[arg(long, default_value_t = 0)]
    datasets_per_block: usize,
    /// The wire format parsed: `otlp` sends each file as the OTLP request
    /// `request_from_pprof` makes of it, and `decode` then covers reading the request and
    /// converting it to pprofs (`parse_export_proto`, validation included).
    #[arg(long, value_enum, default_value_t = Protocol::Pprof)]
    protocol: Protocol,
}

#[derive(Args)]
pub struct IngestArgs {
    /// Directory of pprof files to replay (every file that decodes as pprof is used).
    #[arg(long, default_value = "../shared/corpus")]
    corpus: PathBuf,
    /// Server to push to; an in-process server is started when absent.
    #[arg(long)]
    url: Option<String>,
    /// A flag for the started server (repeated for several: `--server-flag --config
    /// --server-flag kiln.yaml`), to compare settings in one sitting.
    #[arg(long, allow_hyphen_values = true)]
    server_flag: Vec<std::ffi::OsString>,
    /// Concurrent clients.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Distinct services the clients spread over.
    #[arg(long, default_value_t = 20)]
    services: usize,
    /// Instances per service. Without it each client is an instance of service
    /// `client % services`; with it the clients take turns over every (service, instance)
    /// pair, as a shared pool of connections from many small services does.
    #[arg(long)]
    instances: Option<usize>,
    /// Each service sends the profiles of one program (service `i` replays file `i` modulo
    /// the files), as a real service does, so its symbols repeat from one profile to the
    /// next. Off, every client replays every file in turn, whatever its service.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    program_per_service: bool,
    /// Profiles per second in all, spread evenly over the clients (0: each client sends
    /// its next profile as soon as the last is acknowledged). A fixed rate is the
    /// many-services regime: each service sends a profile every few seconds.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// The started server's compaction (default off: measured on its own by `kiln bench
    /// storage`). On, the report splits the server's CPU between compaction (its merges,
    /// planning, metastore transactions and uploads) and the rest.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    compaction: bool,
    /// Seconds to run.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Only files at least this large (bytes), to measure big-profile throughput.
    #[arg(long, default_value_t = 0)]
    min_file_bytes: usize,
    /// How the profiles travel: gzip pprof to `/ingest`, or the same profiles as gzip OTLP
    /// protobuf to `/v1development/profiles`.
    #[arg(long, value_enum, default_value_t = Protocol::Pprof)]
    protocol: Protocol,
    /// The started server's adaptive group commit (`--flush-adaptive`); false waits the
    /// whole flush interval, as before it existed.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    flush_adaptive: bool,
    /// Instead of one server of every role on SQLite: this many `kiln server --target
    /// ingest` processes over one PostgreSQL (started here) and one directory of blocks,
    /// the clients spread evenly over them. The same figures then cover a scaled-out
    /// write path, forwarding to each service's owner included (see `--placement`).
    #[arg(long, default_value_t = 0)]
    ingest_nodes: usize,
    /// With `--ingest-nodes`: `node.placement` of the started nodes.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    placement: bool,
}

/// The `--ingest-nodes` processes, and the PostgreSQL they share (stopped on drop).
struct IngestCluster {
    _postgres: crate::services::OwnPostgres,
    servers: Vec<(crate::common::KilnChild, String)>,
    /// With `--compaction true`: one `--target compact` process over the same stores,
    /// whose CPU counts as the servers'.
    compactor: Option<(crate::common::KilnChild, String)>,
}

impl IngestCluster {
    fn start(args: &IngestArgs, temp: &std::path::Path) -> anyhow::Result<IngestCluster> {
        let (postgres, metastore) = crate::services::own_postgres()?;
        std::fs::create_dir_all(temp)?;
        let config = temp.join("kiln.yaml");
        std::fs::write(
            &config,
            format!(
                "node:\n  heartbeat_ms: 500\n  lease_ms: 3000\n  placement: {}\n",
                args.placement
            ),
        )?;
        let blocks = format!("file://{}", temp.join("blocks").display());
        let mut cluster = IngestCluster {
            _postgres: postgres,
            servers: Vec::new(),
            compactor: None,
        };
        let flags = |target: &str| -> Vec<std::ffi::OsString> {
            vec![
                "--target".into(),
                target.into(),
                "--metastore".into(),
                metastore.clone().into(),
                "--object-store".into(),
                blocks.clone().into(),
                "--config".into(),
                config.clone().into(),
                "--flush-adaptive".into(),
                args.flush_adaptive.to_string().into(),
                "--compaction".into(),
                args.compaction.to_string().into(),
            ]
        };
        for index in 0..args.ingest_nodes {
            let server = crate::common::start_server_with(
                &temp.join(format!("ingest-{index}")),
                &flags("ingest"),
            )?;
            cluster.servers.push(server);
        }
        if args.compaction {
            cluster.compactor = Some(crate::common::start_server_with(
                &temp.join("compact"),
                &flags("compact"),
            )?);
        }
        // Placement needs every node to know the others: wait until each lists them all
        // as live, and one heartbeat more for their caches.
        let deadline = Instant::now() + Duration::from_secs(30);
        for (_, url) in &cluster.servers {
            loop {
                let listed = crate::http::get(&format!("{url}/api/v1/nodes"))
                    .call()
                    .ok()
                    .map(|response| response.text())
                    .unwrap_or_default();
                if listed.matches("\"live\"").count() >= args.ingest_nodes {
                    break;
                }
                if Instant::now() > deadline {
                    bail!(
                        "{url} did not list the {} ingest nodes: {listed}",
                        args.ingest_nodes
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        std::thread::sleep(Duration::from_millis(600));
        Ok(cluster)
    }
}

impl Drop for IngestCluster {
    fn drop(&mut self) {
        for (child, _) in self.servers.iter_mut().chain(&mut self.compactor) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Busy CPU seconds of the whole machine (every process: servers, PostgreSQL, the bench's
/// own clients), from the first line of `/proc/stat`.
fn machine_busy_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<f64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|field| field.parse().ok())
        .collect();
    let total: f64 = fields.iter().take(8).sum();
    let idle = fields.get(3)? + fields.get(4)?;
    Some((total - idle) / 100.0)
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Protocol {
    Pprof,
    Otlp,
}

/// A corpus file as the bench sends it: gzip pprof, and the size of the pprof inside.
struct BenchFile {
    name: String,
    body: Vec<u8>,
    pprof_bytes: usize,
    /// With `--protocol otlp`: the gzip OTLP request per service (the service name travels
    /// inside it) and the size of the protobuf inside.
    otlp: Vec<(Vec<u8>, usize)>,
}

/// Adds each file's OTLP form, one request per service.
fn add_otlp_bodies(files: &mut [BenchFile], services: usize) -> anyhow::Result<()> {
    for file in files {
        let profile = kiln_model::pprof::decode(&file.body, 64 << 20)?;
        for service in 0..services {
            let request = kiln_ingest::otlp::request_from_pprof(
                &profile,
                &[("service.name", &format!("bench-svc-{service}"))],
                0,
            );
            let proto = prost::Message::encode_to_vec(&request);
            file.otlp
                .push((kiln_model::compress::gzip(&proto), proto.len()));
        }
    }
    Ok(())
}

fn load_corpus(dir: &PathBuf, min_bytes: usize) -> anyhow::Result<Vec<BenchFile>> {
    let mut files = Vec::new();
    for entry in
        std::fs::read_dir(dir).with_context(|| format!("cannot read corpus {}", dir.display()))?
    {
        let path = entry?.path();
        if !path.is_file() {
            continue;
        }
        let bytes = std::fs::read(&path)?;
        if bytes.len() < min_bytes {
            continue;
        }
        let Ok(profile) = kiln_model::pprof::decode(&bytes, 64 << 20) else {
            continue;
        };
        if profile.sample.is_empty()
            || kiln_model::pprof::validate(&profile, &Default::default()).is_err()
        {
            continue;
        }
        let pprof_bytes = kiln_model::compress::maybe_gunzip(&bytes, 64 << 20)?.len();
        // Send what SDKs send: gzip pprof.
        let body = if kiln_model::compress::is_gzip(&bytes) {
            bytes
        } else {
            kiln_model::compress::gzip(&bytes)
        };
        files.push(BenchFile {
            name: path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
            body,
            pprof_bytes,
            otlp: Vec::new(),
        });
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    if files.is_empty() {
        bail!("no usable pprof files in {}", dir.display());
    }
    Ok(files)
}

pub async fn run(args: IngestArgs) -> anyhow::Result<()> {
    let mut files = load_corpus(&args.corpus, args.min_file_bytes)?;
    let services = args.services.max(1);
    let protocol = args.protocol;
    if protocol == Protocol::Otlp {
        add_otlp_bodies(&mut files, services)?;
    }
    let files = Arc::new(files);
    let temp = std::env::temp_dir().join(format!("kiln-bench-{}", std::process::id()));
    let mut server = None;
    let mut cluster = None;
    let url = match &args.url {
        Some(url) => url.trim_end_matches('/').to_string(),
        None if args.ingest_nodes > 0 => {
            let started = IngestCluster::start(&args, &temp)?;
            let url = started.servers[0].1.clone();
            cluster = Some(started);
            url
        }
        None => {
            let mut flags: Vec<std::ffi::OsString> = vec![
                "--compaction".into(),
                args.compaction.to_string().into(),
                "--flush-adaptive".into(),
                args.flush_adaptive.to_string().into(),
            ];
            flags.extend(args.server_flag.iter().cloned());
            let (child, url) = crate::common::start_server_with(&temp, &flags)?;
            server = Some(child);
            url
        }
    };
    let urls: Vec<String> = match &cluster {
        Some(cluster) => cluster.servers.iter().map(|(_, url)| url.clone()).collect(),
        None => vec![url.clone()],
    };
    let pids: Vec<u32> = match &cluster {
        Some(cluster) => cluster
            .servers
            .iter()
            .chain(&cluster.compactor)
            .map(|(child, _)| child.id())
            .collect(),
        None => server.iter().map(|child| child.id()).collect(),
    };
    // Where compaction runs: the compact node of a cluster, else the one server.
    let merge_url = match cluster.as_ref().and_then(|c| c.compactor.as_ref()) {
        Some((_, url)) => url.clone(),
        None => url.clone(),
    };
    let servers_cpu = |pids: &[u32]| -> Option<f64> {
        let seconds: Option<Vec<f64>> = pids
            .iter()
            .map(|pid| crate::common::process_cpu_seconds(*pid))
            .collect();
        seconds.filter(|s| !s.is_empty()).map(|s| s.iter().sum())
    };
    let cpu_before = servers_cpu(&pids);
    let machine_before = machine_busy_seconds();
    let merge_cpu_before = crate::common::metric(&merge_url, MERGE_CPU).ok();
    let compaction_cpu_before = crate::common::metric(&merge_url, COMPACTION_CPU).ok();
    let total_bytes: usize = files.iter().map(|file| file.body.len()).sum();
    let total_pprof_bytes: usize = files.iter().map(|file| file.pprof_bytes).sum();
    let total_otlp_bytes: usize = files
        .iter()
        .map(|file| file.otlp.first().map_or(0, |(_, proto)| *proto))
        .sum();
    println!(
        "kiln bench ingest: {} files ({:.1} MB gzip, {:.1} MB pprof{}), {} clients, {} services{}{}{}, {} s, compaction {}, server {}",
        files.len(),
        total_bytes as f64 / 1e6,
        total_pprof_bytes as f64 / 1e6,
        match protocol {
            Protocol::Pprof => String::new(),
            Protocol::Otlp => format!(", sent as {:.1} MB of OTLP protobuf", total_otlp_bytes as f64 / 1e6),
        },
        args.clients,
        args.services,
        args.instances
            .map(|n| format!(" x {n} instances"))
            .unwrap_or_default(),
        if args.program_per_service {
            ", one program each"
        } else {
            ""
        },
        if args.rate > 0.0 {
            format!(" at {} profiles/s", args.rate)
        } else {
            String::new()
        },
        args.seconds,
        if args.url.is_some() {
            "as configured"
        } else if args.compaction {
            "on"
        } else {
            "off"
        },
        match &cluster {
            Some(_) => format!(
                "{} ingest nodes over PostgreSQL and file:// blocks, placement {}",
                urls.len(),
                if args.placement { "on" } else { "off" }
            ),
            None => url.clone(),
        }
    );
    let series = args.instances.map(|instances| services * instances.max(1));
    let program_per_service = args.program_per_service;
    // Each client's share of the rate: its n-th send is due at n / per_client seconds,
    // offset so that the clients do not send in bursts.
    let per_client = args.rate / args.clients.max(1) as f64;
    let clients = args.clients.max(1);

    let stop = Arc::new(AtomicBool::new(false));
    let sent_bytes = Arc::new(AtomicU64::new(0));
    let sent_pprof_bytes = Arc::new(AtomicU64::new(0));
    let sent_profiles = Arc::new(AtomicU64::new(0));
    let sent_otlp_bytes = Arc::new(AtomicU64::new(0));
    // Refusals by HTTP status (0: no response).
    let errors = Arc::new(Mutex::new(std::collections::BTreeMap::<u16, u64>::new()));
    // What the first write without a response failed with: a count alone does not say
    // whether the server reset a connection, refused one, or the client timed out.
    let first_transport_error = Arc::new(Mutex::new(None::<String>));
    let latencies = Arc::new(Mutex::new(Vec::<f64>::new()));
    let started = Instant::now();
    let mut threads = Vec::new();
    for client in 0..args.clients {
        let (files, stop, sent_bytes, sent_pprof_bytes, sent_profiles, errors, latencies, url) = (
            files.clone(),
            stop.clone(),
            sent_bytes.clone(),
            sent_pprof_bytes.clone(),
            sent_profiles.clone(),
            errors.clone(),
            latencies.clone(),
            urls[client % urls.len()].clone(),
        );
        let sent_otlp_bytes = sent_otlp_bytes.clone();
        let first_transport_error = first_transport_error.clone();
        threads.push(std::thread::spawn(move || {
            let agent = crate::http::Http::new(Duration::from_secs(60));
            let mut local = Vec::new();
            let mut index = client;
            let mut sent_count = 0u64;
            let offset = if per_client > 0.0 {
                client as f64 / per_client / clients as f64
            } else {
                0.0
            };
            while !stop.load(Ordering::Relaxed) {
                if per_client > 0.0 {
                    let due = started
                        + Duration::from_secs_f64(offset + sent_count as f64 / per_client);
                    let wait = due.saturating_duration_since(Instant::now());
                    if !wait.is_zero() {
                        std::thread::sleep(wait.min(Duration::from_millis(200)));
                        continue;
                    }
                }
                sent_count += 1;
                let (service_index, instance) = match series {
                    Some(series) => {
                        let pair = (client + sent_count as usize * clients) % series;
                        (pair % services, pair / services)
                    }
                    None => (client % services, client),
                };
                let file = match program_per_service {
                    true => &files[service_index % files.len()],
                    false => &files[index % files.len()],
                };
                let service = format!("bench-svc-{service_index}");
                let now = kiln_model::time::now_nanos() / 1_000_000_000;
                let begin = Instant::now();
                let (sent, body_bytes, otlp_bytes) = match protocol {
                    Protocol::Pprof => {
                        let request_url = format!(
                            "{url}/ingest?name={service}{{instance=i{instance}}}&format=pprof&from={}&until={now}",
                            now - 10
                        );
                        let sent = agent.post(&request_url).send_bytes(&file.body);
                        (sent, file.body.len(), 0)
                    }
                    Protocol::Otlp => {
                        let (body, proto_bytes) = &file.otlp[service_index];
                        let sent = agent
                            .post(&format!("{url}/v1development/profiles"))
                            .header("Content-Type", "application/x-protobuf")
                            .header("Content-Encoding", "gzip")
                            .send_bytes(body);
                        (sent, body.len(), *proto_bytes)
                    }
                };
                match sent {
                    Ok(_) => {
                        sent_otlp_bytes.fetch_add(otlp_bytes as u64, Ordering::Relaxed);
                        local.push(begin.elapsed().as_secs_f64());
                        sent_bytes.fetch_add(body_bytes as u64, Ordering::Relaxed);
                        sent_pprof_bytes.fetch_add(file.pprof_bytes as u64, Ordering::Relaxed);
                        sent_profiles.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(err) => {
                        // A refused client waits as told, as SDKs and agents do: without
                        // it, 1,000 clients retrying at once spend the cores they share
                        // with the server on refusals, and the run measures that storm.
                        let (status, retry_after) = match &err {
                            crate::http::Error::Status(status, response) => (
                                *status,
                                response
                                    .header("Retry-After")
                                    .and_then(|seconds| seconds.trim().parse::<f64>().ok()),
                            ),
                            crate::http::Error::Transport(transport)
                            | crate::http::Error::Body(transport) => {
                                if let Ok(mut first) = first_transport_error.lock() {
                                    first.get_or_insert_with(|| transport.to_string());
                                }
                                (0, None)
                            }
                        };
                        if status == 429 {
                            let wait = retry_after.unwrap_or(1.0).clamp(0.0, 5.0);
                            std::thread::sleep(Duration::from_secs_f64(wait));
                        }
                        if let Ok(mut errors) = errors.lock() {
                            *errors.entry(status).or_insert(0u64) += 1;
                        }
                    }
                }
                index += 1;
            }
            if let Ok(mut all) = latencies.lock() {
                all.extend(local);
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    // Logged writes are acknowledged before their segment is written (up to
    // `wal_segment_interval_ms` later): a read makes the server write what it logged, so
    // the CPU counted covers every acknowledged profile's segment. A cluster's nodes log
    // nothing (the log serves a node running every role).
    if cluster.is_none() {
        // Blocking, as the metric reads below: the load has ended.
        if let Err(err) = crate::http::get(&format!("{url}/api/0/services")).call() {
            eprintln!("kiln bench ingest: the read that writes logged profiles failed: {err}");
        }
    }
    let cpu_after = servers_cpu(&pids);
    let machine_after = machine_busy_seconds();
    let merge_cpu_after = crate::common::metric(&merge_url, MERGE_CPU).ok();
    let compaction_cpu_after = crate::common::metric(&merge_url, COMPACTION_CPU).ok();
    // A run that leaves compaction behind looks cheaper than it is: its backlog is shown.
    let backlog = args
        .compaction
        .then(|| {
            let datasets = crate::common::metric(&url, BACKLOG_DATASETS).ok()?;
            let wait = crate::common::metric(&url, BACKLOG_WAIT).ok()?;
            Some((datasets, wait))
        })
        .flatten();
    let mut latencies = latencies.lock().map(|l| l.clone()).unwrap_or_default();
    latencies.sort_by(|a, b| a.total_cmp(b));
    let percentile = |p: f64| -> f64 {
        if latencies.is_empty() {
            return 0.0;
        }
        latencies[((latencies.len() - 1) as f64 * p).round() as usize] * 1000.0
    };
    let profiles = sent_profiles.load(Ordering::Relaxed) as f64;
    let megabytes = sent_bytes.load(Ordering::Relaxed) as f64 / 1e6;
    let pprof_megabytes = sent_pprof_bytes.load(Ordering::Relaxed) as f64 / 1e6;
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!("profiles/s        {:.1}", profiles / elapsed);
    let otlp_megabytes = sent_otlp_bytes.load(Ordering::Relaxed) as f64 / 1e6;
    if protocol == Protocol::Otlp {
        println!(
            "MB/s (OTLP)       {:.2}  (uncompressed protobuf; gzip on the wire)",
            otlp_megabytes / elapsed
        );
    }
    println!(
        "MB/s (gzip body)  {:.2}  ({:.2} per core, {} cores)",
        megabytes / elapsed,
        megabytes / elapsed / cores as f64,
        cores
    );
    println!(
        "MB/s (pprof)      {:.2}  (the same profiles as pprof)",
        pprof_megabytes / elapsed
    );
    println!("ack latency p50   {:.1} ms", percentile(0.5));
    println!("ack latency p99   {:.1} ms", percentile(0.99));
    let errors = errors.lock().map(|e| e.clone()).unwrap_or_default();
    let by_status: Vec<String> = errors
        .iter()
        .map(|(status, count)| match status {
            0 => format!("{count} without a response"),
            status => format!("{count} × {status}"),
        })
        .collect();
    println!(
        "errors            {}{}",
        errors.values().sum::<u64>(),
        match by_status.is_empty() {
            true => String::new(),
            false => format!("  ({})", by_status.join(", ")),
        }
    );
    if let Some(first) = first_transport_error
        .lock()
        .ok()
        .and_then(|first| first.clone())
    {
        println!("  first without a response: {first}");
    }
    if let (Some(before), Some(after)) = (cpu_before, cpu_after) {
        let cpu = after - before;
        println!(
            "server CPU        {:.1} s over {:.1} s ({:.2} cores)",
            cpu,
            elapsed,
            cpu / elapsed,
        );
        if let (Some(before), Some(after), Some(merge_before), Some(merge_after)) = (
            compaction_cpu_before,
            compaction_cpu_after,
            merge_cpu_before,
            merge_cpu_after,
        ) {
            let compaction = after - before;
            println!(
                "  compaction      {:.1} s ({:.0} %; merges {:.1} s), ingest and the rest {:.1} s",
                compaction,
                100.0 * compaction / cpu.max(f64::EPSILON),
                merge_after - merge_before,
                cpu - compaction
            );
        }
        if let Some((datasets, wait)) = backlog {
            println!(
                "  level 0 at end  {datasets:.0} datasets waiting for their merge, {wait:.1} s on average"
            );
        }
        println!(
            "per server core   {:.2} MB/s of pprof ({:.2} MB/s of gzip body)",
            pprof_megabytes / cpu.max(f64::EPSILON),
            megabytes / cpu.max(f64::EPSILON)
        );
        if protocol == Protocol::Otlp {
            println!(
                "per server core   {:.2} MB/s of OTLP protobuf, {:.1} profiles/s",
                otlp_megabytes / cpu.max(f64::EPSILON),
                profiles / cpu.max(f64::EPSILON)
            );
        }
        println!(
            "server CPU per MB {:.3} s per MB of pprof ({:.3} s per MB of gzip body)",
            cpu / pprof_megabytes.max(f64::EPSILON),
            cpu / megabytes.max(f64::EPSILON)
        );
    }
    if let (Some(before), Some(after), Some(_)) = (machine_before, machine_after, &cluster) {
        // PostgreSQL and the clients too: on one machine, they share the cores.
        let cpu = after - before;
        println!(
            "machine CPU       {:.1} s ({:.3} s per MB of pprof), PostgreSQL and the clients included",
            cpu,
            cpu / pprof_megabytes.max(f64::EPSILON)
        );
    }
    if let Some(cluster) = &cluster {
        let mut outcomes = std::collections::BTreeMap::<String, f64>::new();
        for (_, url) in &cluster.servers {
            let Some(text) = crate::http::get(&format!("{url}/metrics"))
                .call()
                .ok()
                .map(|response| response.text())
            else {
                continue;
            };
            for line in text.lines() {
                let Some(rest) = line.strip_prefix("kiln_placement_writes_total{outcome=\"") else {
                    continue;
                };
                let Some((outcome, value)) = rest.split_once("\"} ") else {
                    continue;
                };
                *outcomes.entry(outcome.to_string()).or_default() += value.parse().unwrap_or(0.0);
            }
        }
        let listed: Vec<String> = outcomes
            .iter()
            .map(|(outcome, count)| format!("{outcome} {count:.0}"))
            .collect();
        println!("placement         {}", listed.join(", "));
        let peak = pids
            .iter()
            .map(|pid| kiln_agent::procs::status_kib(*pid, "VmHWM:"))
            .max()
            .unwrap_or(0);
        println!(
            "node peak RSS     {:.0} MiB (the largest node)",
            peak as f64 / 1024.0
        );
    }
    if let Some(child) = &server {
        // VmHWM: the peak over the server's life, startup and the run alike.
        println!(
            "server peak RSS   {:.0} MiB",
            kiln_agent::procs::status_kib(child.id(), "VmHWM:") as f64 / 1024.0
        );
    }
    if let Some(mut child) = server {
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_dir_all(&temp);
    }
    if let Some(cluster) = cluster {
        drop(cluster);
        let _ = std::fs::remove_dir_all(&temp);
    }
    Ok(())
}

/// Compaction's merge CPU on the server's `/metrics`.
const MERGE_CPU: &str = "kiln_compaction_merge_cpu_seconds_total";
/// Level 0's backlog as the write path last read it: datasets, and their mean wait.
const BACKLOG_DATASETS: &str = "kiln_ingest_compaction_backlog_datasets";
const BACKLOG_WAIT: &str = "kiln_ingest_compaction_wait_seconds";
/// Compaction's CPU in all (merges, planning, metastore transactions, uploads).
const COMPACTION_CPU: &str = "kiln_compaction_cpu_seconds_total";

/// Times each stage of the write path over the corpus on one thread: inflate, protobuf
/// decode, validation and series planning, dataset building (interning), block encoding.
pub fn stages(args: StagesArgs) -> anyhow::Result<()> {
    let mut files = load_corpus(&args.corpus, 0)?;
    if args.protocol == Protocol::Otlp {
        add_otlp_bodies(&mut files, 1)?;
    }
    let gzip_bytes: usize = files.iter().map(|file| file.body.len()).sum();
    // Corpus files carry their recording times, years old: no retention here.
    let limits = kiln_ingest::Limits {
        retention_days: 0,
        ..Default::default()
    };
    let mut inflate = Duration::ZERO;
    let mut decode = Duration::ZERO;
    let mut plan = Duration::ZERO;
    let mut identity = Duration::ZERO;
    let mut build = Duration::ZERO;
    let mut encode = Duration::ZERO;
    let mut read_back = Duration::ZERO;
    let mut raw_bytes = 0usize;
    let mut block_bytes = 0usize;
    let mut held_bytes = 0usize;
    let per_dataset = if args.profiles_per_dataset == 0 {
        files.len()
    } else {
        args.profiles_per_dataset
    };
    let mut datasets_built = 0usize;
    for _ in 0..args.rounds {
        let mut builder = kiln_storage::DatasetBuilder::new("bench", "bench");
        let mut datasets = Vec::new();
        for (position, file) in files.iter().enumerate() {
            raw_bytes += file.pprof_bytes;
            let parsed = match args.protocol {
                Protocol::Pprof => {
                    let started = Instant::now();
                    let raw = kiln_model::compress::gunzip_bounded(
                        &file.body,
                        limits.max_decompressed_bytes,
                    )?;
                    inflate += started.elapsed();
                    let started = Instant::now();
                    let profile = kiln_model::pprof::decode(&raw, limits.max_decompressed_bytes)?;
                    decode += started.elapsed();
                    let started = Instant::now();
                    let parsed = kiln_ingest::parse::from_pprof(
                        profile,
                        Default::default(),
                        file.body.len(),
                        &limits,
                    )?;
                    plan += started.elapsed();
                    vec![parsed]
                }
                Protocol::Otlp => {
                    let (body, _) = &file.otlp[0];
                    let started = Instant::now();
                    let raw =
                        kiln_model::compress::gunzip_bounded(body, limits.max_decompressed_bytes)?;
                    inflate += started.elapsed();
                    let started = Instant::now();
                    let export = kiln_ingest::otlp::parse_export_proto(&raw, body.len(), &limits)?;
                    decode += started.elapsed();
                    export.profiles
                }
            };
            held_bytes += parsed.iter().map(|p| p.decoded_bytes()).sum::<usize>();
            // What deduplication adds to each write: the profile's identity.
            let started = Instant::now();
            for parsed in &parsed {
                let digest = kiln_ingest::dedup::profile_digest(&parsed.profile);
                std::hint::black_box(kiln_ingest::dedup::identity("bench", parsed, &digest));
            }
            identity += started.elapsed();
            let started = Instant::now();
            for parsed in &parsed {
                builder.add_pprof(&parsed.input(limits.max_stack_depth));
            }
            if (position + 1) % per_dataset == 0 || position + 1 == files.len() {
                let full = std::mem::replace(
                    &mut builder,
                    kiln_storage::DatasetBuilder::new("bench", "bench"),
                );
                datasets.push(full.finish());
            }
            build += started.elapsed();
        }
        datasets_built += datasets.len();
        let per_block = match args.datasets_per_block {
            0 => datasets.len().max(1),
            count => count,
        };
        for group in datasets.chunks(per_block) {
            let started = Instant::now();
            let block = bytes::Bytes::from(kiln_storage::format::encode_block(group)?);
            encode += started.elapsed();
            block_bytes += block.len();
            // The read path's share: what a query pays to decode these datasets whole, the
            // footer parsed once per block as the server's tail cache does.
            let started = Instant::now();
            let tail =
                match kiln_storage::ranged::BlockTail::parse(block.clone(), block.len() as u64)? {
                    Ok(tail) => tail,
                    Err(needed) => anyhow::bail!(
                        "a block of {} bytes whole, yet {needed} wanted",
                        block.len()
                    ),
                };
            for row_group in 0..group.len() {
                let dataset = tail.decode(
                    block.clone(),
                    row_group,
                    kiln_storage::format::Projection::ALL,
                )?;
                drop(dataset);
            }
            read_back += started.elapsed();
        }
    }
    let megabytes = (gzip_bytes * args.rounds) as f64 / 1e6;
    let total = inflate + decode + plan + identity + build + encode;
    println!(
        "kiln bench stages: {} files as {}, {:.2} MB gzip pprof ({:.2} MB raw) x {} rounds, one thread",
        files.len(),
        match args.protocol {
            Protocol::Pprof => "pprof",
            Protocol::Otlp => "OTLP",
        },
        gzip_bytes as f64 / 1e6,
        raw_bytes as f64 / 1e6 / args.rounds as f64,
        args.rounds
    );
    for (name, time) in [
        ("inflate", inflate),
        ("decode", decode),
        ("validate+plan", plan),
        ("identity", identity),
        ("build", build),
        ("encode", encode),
    ] {
        println!(
            "{name:<14} {:>8.1} ms  {:>5.1} %  {:>8.1} MB/s of gzip pprof",
            time.as_secs_f64() * 1000.0,
            100.0 * time.as_secs_f64() / total.as_secs_f64(),
            megabytes / time.as_secs_f64()
        );
    }
    println!(
        "all stages     {:>8.1} ms           {:>8.1} MB/s of gzip pprof per core ({:.1} MB/s of pprof)",
        total.as_secs_f64() * 1000.0,
        megabytes / total.as_secs_f64(),
        raw_bytes as f64 / 1e6 / total.as_secs_f64()
    );
    println!(
        "read back      {:>8.1} ms           {:>8.1} MB/s of gzip pprof (a query decoding the block's datasets; not in the stages above)",
        read_back.as_secs_f64() * 1000.0,
        megabytes / read_back.as_secs_f64()
    );
    println!(
        "decoded        {:.2} MB held in memory per round while waiting for a flush ({:.1}× the pprof)",
        held_bytes as f64 / 1e6 / args.rounds as f64,
        held_bytes as f64 / raw_bytes.max(1) as f64
    );
    println!(
        "block size     {:.1} % of the gzip pprof ({} datasets per round, {})",
        100.0 * block_bytes as f64 / (gzip_bytes * args.rounds) as f64,
        datasets_built / args.rounds.max(1),
        match args.datasets_per_block {
            0 => "one block".to_string(),
            count => format!("{count} per block"),
        }
    );
    Ok(())
}
