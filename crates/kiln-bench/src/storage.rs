//! `kiln bench storage`: what a day of one service costs to keep, and how fast compaction
//! gets it there.
//!
//! The real corpus files are replayed as one service whose instances each send a profile
//! every interval, with every sample value jittered (×0.5–1.5, CPU values kept whole
//! multiples of the period), so that no two profiles are byte-identical. Each body is
//! sent as SDKs send it, gzip'd (level 6, the conservative choice: Go's runtime uses
//! level 1, whose bodies are bigger and would flatter the ratio).
//!
//! Phase 1 ingests through a `kiln server` child with compaction off and measures the
//! segments. Phase 2 restarts the server with compaction on (every level due at once,
//! no grace period) and waits until the layout settles; the server's CPU time over that
//! phase gives compaction throughput. The figure is then the bytes in object storage plus
//! the metastore files, against the gzip bytes ingested, and the query totals before and
//! after compaction are checked against the values sent.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use kiln_ingest::parse::{from_pprof, ProfileContext};
use kiln_model::pprof::Profile;
use kiln_query::api;
use prost::Message;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Stream {
    /// CPU profiles (`process_cpu:cpu:nanoseconds:cpu:nanoseconds`).
    Cpu,
    /// Heap profiles with four sample types (alloc/inuse objects/space).
    Heap,
}

#[derive(Args)]
pub struct StorageBenchArgs {
    /// Directory of profiles to replay.
    #[arg(long, default_value = "../shared/corpus")]
    corpus: PathBuf,
    #[arg(long, value_enum, default_value = "cpu")]
    stream: Stream,
    /// Hours of data.
    #[arg(long, default_value_t = 24)]
    hours: i64,
    #[arg(long, default_value_t = 10)]
    instances: usize,
    /// Spread the instances over this many services (`checkout-0`, …): a segment then
    /// holds one dataset per service, which is what compaction's read ratio depends on.
    #[arg(long, default_value_t = 1)]
    services: usize,
    /// Seconds between two profiles of one instance.
    #[arg(long, default_value_t = 10)]
    interval: i64,
    /// Leave out corpus files larger than this (bytes): a 10 s profile is small.
    #[arg(long, default_value_t = 200_000)]
    max_file_bytes: usize,
    /// Concurrent senders (each waits for its durable ack, a group commit away).
    #[arg(long, default_value_t = 256)]
    clients: usize,
    /// Keep the data directory afterwards, for `kiln admin blocks` or DuckDB.
    #[arg(long)]
    keep_data: bool,
    /// `compaction.max_job_profiles` for phase 2 [default: the server's].
    #[arg(long)]
    max_job_profiles: Option<usize>,
    /// `compaction.memory_limit` in bytes for phase 2 [default: the server's].
    #[arg(long)]
    memory_limit: Option<u64>,
    /// `compaction.interval_ms` for phase 2: the pause between two compactor passes. The
    /// server's own is 5,000; the bench's default is short, so that settling measures the
    /// merges. At 5,000 it says how many passes the layout takes to settle.
    #[arg(long, default_value_t = 100)]
    compaction_interval_ms: u64,
}

/// A corpus file and where its measured type's values are.
struct Template {
    name: String,
    profile: Profile,
    value_index: usize,
}

/// Every level due at once (phase 2), with the default windows and codecs.
const PHASE_2_LEVELS: &str = "    - { max_datasets: 20, max_age_ms: 0, window_ms: 0, compression: snappy }\n    - { max_datasets: 10, max_age_ms: 0, window_ms: 3600000 }\n    - { max_datasets: 24, max_age_ms: 0, window_ms: 86400000 }\n";

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
const ALLOC_SPACE: &str = "memory:alloc_space:bytes:space:bytes";
const SERVICE: &str = "checkout";

fn load_templates(args: &StorageBenchArgs) -> anyhow::Result<Vec<Template>> {
    let limits = kiln_ingest::Limits {
        max_samples_per_profile: usize::MAX,
        retention_days: 0,
        ..Default::default()
    };
    let target = match args.stream {
        Stream::Cpu => CPU,
        Stream::Heap => ALLOC_SPACE,
    };
    let mut templates = Vec::new();
    for (name, _, profile) in crate::common::corpus_pprofs(&args.corpus, args.max_file_bytes)? {
        if profile.sample.is_empty() {
            continue;
        }
        if args.stream == Stream::Heap && profile.sample_type.len() != 4 {
            continue;
        }
        let Ok(parsed) = from_pprof(profile.clone(), ProfileContext::default(), 0, &limits) else {
            continue;
        };
        let Some(plan) = parsed
            .types
            .iter()
            .find(|plan| plan.profile_type.id() == target && plan.scale.is_none())
        else {
            continue;
        };
        templates.push(Template {
            name,
            value_index: plan.value_index,
            profile,
        });
    }
    if templates.is_empty() {
        bail!(
            "no {target} profiles under {} bytes in {}",
            args.max_file_bytes,
            args.corpus.display()
        );
    }
    Ok(templates)
}

/// xorshift64*: reproducible jitter without a dependency.
struct Random(u64);

impl Random {
    fn next_unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The template with every value scaled by its own factor in [0.5, 1.5); values that are
/// whole multiples of the period (CPU time) stay so. Returns the pprof bytes and the sum
/// of the measured type's values.
fn jittered(template: &Template, random: &mut Random) -> (Vec<u8>, i64) {
    let mut profile = template.profile.clone();
    let period = profile.period;
    let mut total = 0i64;
    for sample in 0..profile.sample.len() {
        let Some(values) = profile.sample.values_mut(sample) else {
            continue;
        };
        for (index, value) in values.iter_mut().enumerate() {
            let factor = 0.5 + random.next_unit();
            *value = if period > 0 && *value % period == 0 {
                ((*value / period) as f64 * factor).round() as i64 * period
            } else {
                (*value as f64 * factor).round() as i64
            };
            if index == template.value_index {
                total += *value;
            }
        }
    }
    (profile.encode_to_vec(), total)
}

#[derive(Default)]
struct Sent {
    profiles: AtomicUsize,
    gzip_bytes: AtomicU64,
    pprof_bytes: AtomicU64,
    value_total: AtomicU64,
    errors: AtomicUsize,
}

pub async fn run(args: StorageBenchArgs) -> anyhow::Result<()> {
    let templates = Arc::new(load_templates(&args)?);
    let data_dir = std::env::temp_dir().join(format!("kiln-bench-storage-{}", std::process::id()));
    std::fs::create_dir_all(&data_dir)?;
    let result = run_in(&args, templates, &data_dir).await;
    if args.keep_data {
        println!("data kept in     {}", data_dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&data_dir);
    }
    result
}

async fn run_in(
    args: &StorageBenchArgs,
    templates: Arc<Vec<Template>>,
    data_dir: &Path,
) -> anyhow::Result<()> {
    let steps = args.hours * 3600 / args.interval;
    let now = kiln_model::time::now_nanos() / 1_000_000_000;
    let start = now - args.hours * 3600 - 600;
    println!(
        "kiln bench storage: {:?} stream, {} corpus files ({}), {} h, {} instances every {} s = {} profiles",
        args.stream,
        templates.len(),
        templates
            .iter()
            .map(|template| template.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        args.hours,
        args.instances,
        args.interval,
        steps * args.instances as i64
    );

    // Phase 1: ingest with compaction off.
    let (mut server, url) = crate::common::start_server(data_dir)?;
    let sent = Arc::new(Sent::default());
    let next = Arc::new(AtomicUsize::new(0));
    let total_jobs = steps as usize * args.instances;
    let started = Instant::now();
    let mut threads = Vec::new();
    for client in 0..args.clients {
        let (templates, sent, next, url) =
            (templates.clone(), sent.clone(), next.clone(), url.clone());
        let instances = args.instances;
        let services = args.services.max(1);
        let interval = args.interval;
        threads.push(std::thread::spawn(move || {
            let agent = crate::http::Http::new(Duration::from_secs(120));
            let mut random = Random(0x9e37_79b9_7f4a_7c15 ^ (client as u64 + 1));
            loop {
                let job = next.fetch_add(1, Ordering::Relaxed);
                if job >= total_jobs {
                    break;
                }
                let (step, instance) = (job / instances, job % instances);
                let template = &templates[(step + instance) % templates.len()];
                let (pprof, value_total) = jittered(template, &mut random);
                let body = kiln_model::compress::gzip(&pprof);
                let from = start + step as i64 * interval;
                let service = if services == 1 {
                    SERVICE.to_string()
                } else {
                    format!("{SERVICE}-{}", instance % services)
                };
                let request = format!(
                    "{url}/ingest?name={service}{{instance=i{instance}}}&format=pprof&from={from}&until={}",
                    from + interval
                );
                // An SDK retries a server that says it is busy; so does the replay, after
                // the wait the server asks for (capped), up to a minute.
                let mut answer = agent.post(&request).send_bytes(&body);
                for _ in 0..600 {
                    match &answer {
                        Err(crate::http::Error::Status(429 | 503, _)) => {
                            std::thread::sleep(Duration::from_millis(100));
                            answer = agent.post(&request).send_bytes(&body);
                        }
                        _ => break,
                    }
                }
                match answer {
                    Ok(_) => {
                        sent.profiles.fetch_add(1, Ordering::Relaxed);
                        sent.gzip_bytes
                            .fetch_add(body.len() as u64, Ordering::Relaxed);
                        sent.pprof_bytes
                            .fetch_add(pprof.len() as u64, Ordering::Relaxed);
                        sent.value_total
                            .fetch_add(value_total as u64, Ordering::Relaxed);
                    }
                    Err(err) => {
                        if sent.errors.fetch_add(1, Ordering::Relaxed) < 3 {
                            eprintln!("ingest error: {err}");
                        }
                    }
                }
            }
        }));
    }
    for thread in threads {
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
    let ingest_seconds = started.elapsed().as_secs_f64();
    let errors = sent.errors.load(Ordering::Relaxed);
    if errors > 0 {
        let _ = server.kill();
        bail!("{errors} profiles were refused");
    }
    let gzip_bytes = sent.gzip_bytes.load(Ordering::Relaxed) as f64;
    let pprof_bytes = sent.pprof_bytes.load(Ordering::Relaxed) as f64;
    let expected_total = sent.value_total.load(Ordering::Relaxed) as i64;
    let (query_start, query_end) = ((start - 60) * 1000, (now + 60) * 1000);
    let total_before = query_total(&url, args.stream, query_start, query_end)?;
    let ingest_cpu = crate::common::process_cpu_seconds(server.id()).unwrap_or(0.0);
    server.stop();
    let objects_before = directory_bytes(&data_dir.join("blocks"));
    let metastore_before = metastore_bytes(data_dir);
    println!(
        "ingested          {} profiles in {:.0} s ({:.1} s of server CPU): {:.1} MB gzip pprof ({:.1} MB pprof), {:.0} B gzip per profile",
        sent.profiles.load(Ordering::Relaxed),
        ingest_seconds,
        ingest_cpu,
        gzip_bytes / 1e6,
        pprof_bytes / 1e6,
        gzip_bytes / sent.profiles.load(Ordering::Relaxed).max(1) as f64
    );
    println!(
        "segments          {:.2} MB objects + {:.2} MB metastore = {:.2} % of gzip",
        objects_before as f64 / 1e6,
        metastore_before as f64 / 1e6,
        (objects_before + metastore_before) as f64 / gzip_bytes * 100.0
    );

    // Phase 2: compaction alone, every level due at once.
    let Settled {
        mut server,
        url,
        metastore,
        seconds: settled_seconds,
        cpu_seconds,
    } = compact_until_settled(
        data_dir,
        Phase2 {
            max_job_profiles: args.max_job_profiles,
            memory_limit: args.memory_limit,
            interval_ms: args.compaction_interval_ms,
        },
    )
    .await?;
    let compaction_input = crate::common::metric(&url, "kiln_compaction_input_bytes_total")?;
    let blocks: Vec<_> = metastore
        .list_blocks()
        .await?
        .into_iter()
        .filter(|block| block.deleted_at_ms.is_none())
        .collect();
    // The peak of a server that did nothing but start and compact.
    let peak_rss_mib = kiln_agent::procs::status_kib(server.id(), "VmHWM:") as f64 / 1024.0;
    let total_after = query_total(&url, args.stream, query_start, query_end)?;
    print_layout(&metastore, data_dir).await?;
    drop(metastore);
    server.stop();
    let objects_after = directory_bytes(&data_dir.join("blocks"));
    let metastore_after = metastore_bytes(data_dir);
    let stored = objects_after + metastore_after;
    println!(
        "compacted         {} blocks (levels {:?}) in {:.1} s ({:.1} compaction intervals of {} ms), {:.1} s of server CPU, peak RSS {:.0} MiB",
        blocks.len(),
        blocks.iter().map(|block| block.level).collect::<Vec<_>>(),
        settled_seconds,
        settled_seconds * 1000.0 / args.compaction_interval_ms.max(1) as f64,
        args.compaction_interval_ms,
        cpu_seconds,
        peak_rss_mib
    );
    println!(
        "compaction        {:.1} MB/s of segments per core ({:.1} MB/s of input over all levels, {:.1} MB read)",
        objects_before as f64 / 1e6 / cpu_seconds.max(f64::EPSILON),
        compaction_input / 1e6 / cpu_seconds.max(f64::EPSILON),
        compaction_input / 1e6
    );
    println!(
        "compaction read   {:.3}× the segment bytes written (all levels)",
        compaction_input / (objects_before as f64).max(1.0)
    );
    println!(
        "stored            {:.3} MB objects + {:.3} MB metastore = {:.3} MB",
        objects_after as f64 / 1e6,
        metastore_after as f64 / 1e6,
        stored as f64 / 1e6
    );
    println!(
        "efficiency        {:.2} % of the gzip pprof bytes ingested ({:.2} % of the pprof bytes), {:.0} B per profile",
        stored as f64 / gzip_bytes * 100.0,
        stored as f64 / pprof_bytes * 100.0,
        stored as f64 / sent.profiles.load(Ordering::Relaxed).max(1) as f64
    );
    println!(
        "totals            sent {expected_total}, before compaction {total_before}, after {total_after}: {}",
        if expected_total == total_before && total_before == total_after {
            "equal"
        } else {
            "DIFFERENT"
        }
    );
    if expected_total != total_before || total_before != total_after {
        bail!("query totals differ from what was sent");
    }
    Ok(())
}

/// A data directory compacted until its layout settled, and the server still on it.
pub(crate) struct Settled {
    pub server: crate::common::KilnChild,
    pub url: String,
    pub metastore: kiln_metastore::Metastore,
    /// From the server's start to the layout's last change.
    pub seconds: f64,
    /// The server's CPU over that time.
    pub cpu_seconds: f64,
}

/// The compaction settings of phase 2 beside its levels.
pub(crate) struct Phase2 {
    pub max_job_profiles: Option<usize>,
    pub memory_limit: Option<u64>,
    pub interval_ms: u64,
}

impl Default for Phase2 {
    fn default() -> Self {
        Phase2 {
            max_job_profiles: None,
            memory_limit: None,
            interval_ms: 100,
        }
    }
}

/// Starts a server on `data_dir` with every compaction level due at once and no grace
/// period, and waits until every live dataset is above level 0 and the layout has not
/// changed for 1.5 s and three compactor passes. `seconds` is when the layout last
/// changed (seen by a poll every 300 ms), from the server's start.
pub(crate) async fn compact_until_settled(
    data_dir: &Path,
    phase: Phase2,
) -> anyhow::Result<Settled> {
    let settings = phase
        .max_job_profiles
        .map_or(String::new(), |n| format!("  max_job_profiles: {n}\n"))
        + &phase
            .memory_limit
            .map_or(String::new(), |n| format!("  memory_limit: {n}\n"));
    let interval_ms = phase.interval_ms;
    std::fs::write(
        data_dir.join("kiln.yaml"),
        format!("compaction:\n{settings}  interval_ms: {interval_ms}\n  grace_ms: 0\n  levels:\n{PHASE_2_LEVELS}"),
    )?;
    let stable_for = Duration::from_millis(1_500.max(3 * interval_ms));
    let (mut server, url) = crate::common::start_server_with(
        data_dir,
        &[
            "--config".into(),
            data_dir.join("kiln.yaml").into_os_string(),
        ],
    )?;
    let cpu_before = crate::common::process_cpu_seconds(server.id()).unwrap_or(0.0);
    let compaction_started = Instant::now();
    let metastore = kiln_metastore::Metastore::open(&format!(
        "sqlite://{}",
        data_dir.join("metastore.db").display()
    ))
    .await?;
    let mut changed_at = Instant::now();
    let mut last = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(3600);
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let blocks = metastore.list_blocks().await?;
        let layout: Vec<(String, u32, bool)> = blocks
            .iter()
            .map(|block| (block.id.clone(), block.level, block.deleted_at_ms.is_some()))
            .collect();
        let settled = blocks
            .iter()
            .all(|block| block.deleted_at_ms.is_none() && block.level > 0);
        if !settled || layout != last {
            changed_at = Instant::now();
            last = layout;
        }
        if settled && changed_at.elapsed() >= stable_for {
            let cpu = crate::common::process_cpu_seconds(server.id()).unwrap_or(0.0) - cpu_before;
            return Ok(Settled {
                server,
                url,
                metastore,
                seconds: (changed_at - compaction_started).as_secs_f64(),
                cpu_seconds: cpu,
            });
        }
        if Instant::now() > deadline {
            server.stop();
            bail!("compaction did not settle within an hour");
        }
    }
}

/// Prints each live block's level, time range, profiles and stored bytes, split into
/// symbols and the rest, from its footer: where a day's bytes went (issue 61), one line
/// per block and then one per level.
pub(crate) async fn print_layout(
    metastore: &kiln_metastore::Metastore,
    data_dir: &Path,
) -> anyhow::Result<(u64, u64)> {
    let mut datasets = Vec::new();
    for tenant in metastore.tenants().await? {
        datasets.extend(
            metastore
                .list_datasets(kiln_metastore::DatasetQuery {
                    tenant,
                    service: None,
                    from_nanos: i64::MIN,
                    to_nanos: i64::MAX,
                })
                .await?,
        );
    }
    let mut blocks: Vec<_> = metastore
        .list_blocks()
        .await?
        .into_iter()
        .filter(|block| block.deleted_at_ms.is_none())
        .collect();
    blocks.sort_by_key(|block| (block.level, block.created_at_ms));
    let time = |nanos: i64| {
        let seconds = nanos.div_euclid(1_000_000_000);
        format!(
            "day {} {:02}:{:02}",
            seconds.div_euclid(86_400),
            seconds.rem_euclid(86_400) / 3600,
            seconds.rem_euclid(3600) / 60
        )
    };
    // (blocks, profiles, symbol bytes, other bytes) per level.
    let mut levels: std::collections::BTreeMap<u32, (usize, u64, u64, u64)> = Default::default();
    for (shown, block) in blocks.iter().enumerate() {
        let path = data_dir.join("blocks").join(&block.object_key);
        let bytes = bytes::Bytes::from(
            std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?,
        );
        let split = kiln_storage::format::dataset_bytes(&bytes)?;
        let inside: Vec<_> = datasets.iter().filter(|d| d.block_id == block.id).collect();
        let profiles: u64 = inside.iter().map(|d| d.profile_count).sum();
        let symbols: u64 = split.iter().map(|d| d.symbols).sum();
        let other: u64 = split.iter().map(|d| d.profiles).sum();
        let level = levels.entry(block.level).or_default();
        *level = (
            level.0 + 1,
            level.1 + profiles,
            level.2 + symbols,
            level.3 + other,
        );
        if shown < 40 {
            let from = inside.iter().map(|d| d.min_time_nanos).min().unwrap_or(0);
            let to = inside.iter().map(|d| d.max_time_nanos).max().unwrap_or(0);
            println!(
                "block             level {} {} → {}: {} datasets, {} profiles, {:.3} MB ({:.3} MB symbols, {:.3} MB profiles and samples), {}",
                block.level,
                time(from),
                time(to),
                inside.len(),
                profiles,
                block.size_bytes as f64 / 1e6,
                symbols as f64 / 1e6,
                other as f64 / 1e6,
                kiln_storage::format::block_compression(&bytes)?.join("+")
            );
        }
    }
    let mut totals = (0, 0);
    for (level, (count, profiles, symbols, other)) in levels {
        println!(
            "level {level}           {count} blocks, {profiles} profiles: {:.3} MB symbols, {:.3} MB profiles and samples",
            symbols as f64 / 1e6,
            other as f64 / 1e6
        );
        totals = (totals.0 + symbols, totals.1 + other);
    }
    Ok(totals)
}

#[derive(Args)]
pub struct DelayBenchArgs {
    /// Directory of profiles to replay.
    #[arg(long, default_value = "../shared/corpus")]
    corpus: PathBuf,
    /// Seconds of real-time traffic.
    #[arg(long, default_value_t = 120)]
    seconds: u64,
    #[arg(long, default_value_t = 10)]
    instances: usize,
    /// Seconds between two profiles of one instance.
    #[arg(long, default_value_t = 10)]
    interval: u64,
    /// Seconds to wait after the traffic for the last segments' compaction.
    #[arg(long, default_value_t = 40)]
    settle: u64,
}

/// Pushes one service's profiles in real time to a server with the default compaction
/// settings, then reads from the metastore when each segment was written and when its
/// dataset was first compacted (the swap tombstones it; the grace period keeps the row).
pub async fn run_delay(args: DelayBenchArgs) -> anyhow::Result<()> {
    let storage_args = StorageBenchArgs {
        corpus: args.corpus.clone(),
        stream: Stream::Cpu,
        hours: 0,
        instances: args.instances,
        services: 1,
        interval: args.interval as i64,
        max_file_bytes: 200_000,
        clients: args.instances,
        keep_data: false,
        max_job_profiles: None,
        memory_limit: None,
        compaction_interval_ms: 100,
    };
    let templates = Arc::new(load_templates(&storage_args)?);
    let data_dir = std::env::temp_dir().join(format!("kiln-bench-delay-{}", std::process::id()));
    std::fs::create_dir_all(&data_dir)?;
    let (mut server, url) = crate::common::start_server_with(&data_dir, &[])?;
    println!(
        "kiln bench compaction-delay: {} instances every {} s for {} s, default compaction settings",
        args.instances, args.interval, args.seconds
    );
    let started = Instant::now();
    let mut threads = Vec::new();
    for instance in 0..args.instances {
        let (templates, url) = (templates.clone(), url.clone());
        let (seconds, interval) = (args.seconds, args.interval);
        threads.push(std::thread::spawn(move || {
            let agent = crate::http::Http::new(Duration::from_secs(60));
            let mut random = Random(0x9e37_79b9_7f4a_7c15 ^ (instance as u64 + 1));
            // Instances start spread over one interval, as real ones do.
            let offset = Duration::from_millis(interval * 1000 * instance as u64 / 10);
            std::thread::sleep(offset);
            let mut step = 0usize;
            while started.elapsed() < Duration::from_secs(seconds) {
                let template = &templates[(step + instance) % templates.len()];
                let (pprof, _) = jittered(template, &mut random);
                let body = kiln_model::compress::gzip(&pprof);
                let request =
                    format!("{url}/ingest?name={SERVICE}{{instance=i{instance}}}&format=pprof");
                if let Err(err) = agent.post(&request).send_bytes(&body) {
                    eprintln!("ingest error: {err}");
                }
                step += 1;
                let next = offset + Duration::from_secs(interval * step as u64);
                if let Some(wait) = next.checked_sub(started.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
        }));
    }
    for thread in threads {
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
    tokio::time::sleep(Duration::from_secs(args.settle)).await;
    let now_ms = kiln_model::time::now_ms();
    let metastore = kiln_metastore::Metastore::open(&format!(
        "sqlite://{}",
        data_dir.join("metastore.db").display()
    ))
    .await?;
    let mut compacted = Vec::new();
    let mut waiting = Vec::new();
    for block in metastore.list_blocks().await? {
        if block.level != 0 {
            continue;
        }
        match block.deleted_at_ms {
            Some(at) => compacted.push((at - block.created_at_ms) as f64 / 1000.0),
            None => waiting.push((now_ms - block.created_at_ms) as f64 / 1000.0),
        }
    }
    drop(metastore);
    server.stop();
    let _ = std::fs::remove_dir_all(&data_dir);
    if compacted.is_empty() {
        bail!("no segment was compacted");
    }
    // A segment still waiting counts with the time it has waited so far: a lower bound,
    // so the median below can only be an underestimate if some are still waiting.
    let mut all: Vec<f64> = compacted.iter().chain(&waiting).copied().collect();
    all.sort_by(f64::total_cmp);
    let at = |p: f64| all[((all.len() - 1) as f64 * p).round() as usize];
    println!(
        "segments          {} written, {} compacted, {} still waiting",
        all.len(),
        compacted.len(),
        waiting.len()
    );
    println!(
        "write → first compaction: median {:.1} s, p90 {:.1} s, max {:.1} s",
        at(0.5),
        at(0.9),
        at(1.0)
    );
    Ok(())
}

fn query_total(url: &str, stream: Stream, start: i64, end: i64) -> anyhow::Result<i64> {
    let profile_type = match stream {
        Stream::Cpu => CPU,
        Stream::Heap => ALLOC_SPACE,
    };
    let selector = format!(r#"{{service_name=~"{SERVICE}(-[0-9]+)?"}}"#);
    flame_total(url, profile_type, &selector, start, end)
}

/// The total of a merged flame graph of `profile_type` over `[start, end]` (ms).
pub(crate) fn flame_total(
    url: &str,
    profile_type: &str,
    selector: &str,
    start: i64,
    end: i64,
) -> anyhow::Result<i64> {
    let request = api::SelectMergeStacktracesRequest {
        profile_type_id: profile_type.to_string(),
        label_selector: selector.to_string(),
        start,
        end,
        max_nodes: Some(1),
        ..Default::default()
    };
    let response = crate::http::Http::new(Duration::from_secs(600))
        .post(&format!(
            "{url}/querier.v1.QuerierService/SelectMergeStacktraces"
        ))
        .header("Content-Type", "application/proto")
        .send_bytes(&request.encode_to_vec())
        .context("query failed")?;
    let response = api::SelectMergeStacktracesResponse::decode(response.bytes())?;
    Ok(response.flamegraph.map_or(0, |graph| graph.total))
}

pub(crate) fn directory_bytes(root: &Path) -> u64 {
    let mut total = 0;
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if let Ok(meta) = entry.metadata() {
                total += meta.len();
            }
        }
    }
    total
}

/// The metastore's files: the database and, if the server left one, its WAL.
pub(crate) fn metastore_bytes(data_dir: &Path) -> u64 {
    ["metastore.db", "metastore.db-wal"]
        .iter()
        .filter_map(|name| std::fs::metadata(data_dir.join(name)).ok())
        .map(|meta| meta.len())
        .sum()
}
