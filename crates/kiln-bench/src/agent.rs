//! `kiln bench agent`: the agent's own cost on a host shaped like a real one. Every core is
//! kept busy by spinning threads (something to sample on every CPU), short-lived processes
//! come and go (`--churn` a minute, each a new exec'd shell that burns a little CPU, as
//! cron jobs, health checks and build steps do: each is a new pid, a new process table
//! entry and a new set of mappings), a `kiln server` child takes the reports, and for each
//! frequency a `kiln agent` child runs for the given time; its CPU comes from
//! `/proc/PID/stat` and its memory from `/proc/PID/status`.
//!
//! With `--storage`, each run's server is then compacted until its layout settles (every
//! level due at once, as `kiln bench storage` does) and what it keeps is reported per
//! profiled core per day: the bytes over the CPU time the stored profiles hold, times a
//! day. Scaling every byte is an upper bound (a block's symbols and the metastore grow far
//! slower than its samples); the second figure scales only the profiles and samples and
//! counts the symbols and the metastore once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use kiln_agent::procs::status_kib;

#[derive(Args)]
pub struct AgentBenchArgs {
    /// Seconds measured at each frequency.
    #[arg(long, default_value_t = 300)]
    seconds: u64,
    /// Sampling frequencies, Hz.
    #[arg(long, value_delimiter = ',', default_value = "19,100,1000")]
    frequencies: Vec<u64>,
    /// Short-lived processes started per minute (0: none).
    #[arg(long, default_value_t = 200)]
    churn: u64,
    /// Agent modes measured at each frequency: `perf` (every sample through the ring),
    /// `ebpf` (frame-pointer programs counted in the kernel), `native` (eBPF, but no
    /// interpreter's functions named: what naming them costs, for runtimes read without
    /// eBPF), `offcpu=SHARE` (eBPF, and off-CPU profiling sampling that share of blocking
    /// switches).
    #[arg(long, value_delimiter = ',', default_value = "perf,ebpf")]
    modes: Vec<String>,
    /// Blocking context switches a second made by threads that sleep briefly in a loop
    /// (0: none), for the cost of off-CPU profiling.
    #[arg(long, default_value_t = 0)]
    switches: u64,
    /// A program to keep each core busy instead of the bench's own spinning threads, with
    /// its arguments (e.g. a Go program, whose frame pointers let eBPF count its samples
    /// in the kernel). One copy per core.
    #[arg(long, num_args = 1.., allow_hyphen_values = true)]
    busy_command: Vec<String>,
    /// One more busy process, a shell command line run once (repeatable): e.g. two
    /// Python, two Java, two Node.js and two Ruby programs, for what naming their
    /// functions costs. With any, the bench's own spinning threads stay off.
    #[arg(long = "busy")]
    busy: Vec<String>,
    /// The agent's --memory-limit.
    #[arg(long, default_value = "128MiB")]
    memory_limit: String,
    /// The agent's --interval: seconds covered by one report.
    #[arg(long, default_value_t = 10.0)]
    interval: f64,
    /// After each run, compact what the agent sent and report the bytes kept per
    /// profiled core per day.
    #[arg(long)]
    storage: bool,
}

/// A run's server compacted until it settled: what it keeps, per profiled core-day.
async fn report_storage(data_dir: &std::path::Path, started_ms: i64) -> anyhow::Result<()> {
    let settled = crate::storage::compact_until_settled(data_dir, Default::default()).await?;
    let mut server = settled.server;
    let (symbols, samples) = crate::storage::print_layout(&settled.metastore, data_dir).await?;
    let cpu_nanos = crate::storage::flame_total(
        &settled.url,
        "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
        r#"{service_name=~".+"}"#,
        started_ms - 60_000,
        kiln_model::time::now_nanos() / 1_000_000,
    )?;
    drop(settled.metastore);
    server.stop();
    let objects = crate::storage::directory_bytes(&data_dir.join("blocks"));
    let metastore = crate::storage::metastore_bytes(data_dir);
    let core_days = cpu_nanos as f64 / 1e9 / 86_400.0;
    anyhow::ensure!(core_days > 0.0, "no CPU time stored");
    let per_day = |bytes: f64| bytes / core_days / 1e6;
    println!(
        "      stored: {:.3} MB objects ({:.3} MB symbols, {:.3} MB profiles and samples) + {:.3} MB metastore for {:.1} s of CPU sampled, compacted in {:.1} s: {:.2} MB per core-day with every byte scaled, {:.2} MB with the symbols and metastore once",
        objects as f64 / 1e6,
        symbols as f64 / 1e6,
        samples as f64 / 1e6,
        metastore as f64 / 1e6,
        cpu_nanos as f64 / 1e9,
        settled.seconds,
        per_day((objects + metastore) as f64),
        per_day(samples as f64) + (objects.saturating_sub(samples) + metastore) as f64 / 1e6,
    );
    Ok(())
}

/// Context switches on the host since boot (`ctxt` in /proc/stat).
fn context_switches() -> u64 {
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix("ctxt "))
                .and_then(|value| value.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Starts `per_minute` short-lived processes a minute until `busy` is cleared.
fn churn(per_minute: u64, busy: Arc<AtomicBool>) -> Option<std::thread::JoinHandle<u64>> {
    if per_minute == 0 {
        return None;
    }
    let pause = Duration::from_secs_f64(60.0 / per_minute as f64);
    Some(std::thread::spawn(move || {
        let mut started = 0;
        let mut running: Vec<std::process::Child> = Vec::new();
        while busy.load(Ordering::Relaxed) {
            let child = std::process::Command::new("sh")
                .args(["-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done"])
                .spawn();
            if let Ok(child) = child {
                running.push(child);
                started += 1;
            }
            running.retain_mut(|child| !matches!(child.try_wait(), Ok(Some(_))));
            std::thread::sleep(pause);
        }
        for mut child in running {
            let _ = child.wait();
        }
        started
    }))
}

pub async fn run(args: AgentBenchArgs) -> anyhow::Result<()> {
    let data_dir = std::env::temp_dir().join(format!("kiln-bench-agent-{}", std::process::id()));
    let busy = Arc::new(AtomicBool::new(true));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut busy_children = Vec::new();
    if let Some((program, program_args)) = args.busy_command.split_first() {
        for _ in 0..cores {
            busy_children.push(
                std::process::Command::new(program)
                    .args(program_args)
                    .spawn()
                    .with_context(|| format!("cannot start {program}"))?,
            );
        }
    }
    for line in &args.busy {
        busy_children.push(
            std::process::Command::new("sh")
                .args(["-c", &format!("exec {line}")])
                .spawn()
                .with_context(|| format!("cannot start {line}"))?,
        );
    }
    let spinning = if busy_children.is_empty() { cores } else { 0 };
    let spinners: Vec<_> = (0..spinning)
        .map(|_| {
            let busy = busy.clone();
            std::thread::spawn(move || {
                let mut x: u64 = 1;
                while busy.load(Ordering::Relaxed) {
                    for _ in 0..100_000 {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    }
                    std::hint::black_box(x);
                }
            })
        })
        .collect();
    let churning = churn(args.churn, busy.clone());
    // Four threads that block and wake, `switches` times a second between them.
    let sleepers: Vec<_> = (0..if args.switches > 0 { 4 } else { 0 })
        .map(|_| {
            let busy = busy.clone();
            let pause = Duration::from_secs_f64(4.0 / args.switches.max(1) as f64);
            std::thread::spawn(move || {
                while busy.load(Ordering::Relaxed) {
                    std::thread::sleep(pause);
                }
            })
        })
        .collect();
    println!(
        "kiln bench agent: {cores} cores kept busy ({} busy processes), {} short-lived processes a minute, {} s per frequency",
        busy_children.len(),
        args.churn,
        args.seconds
    );
    let exe = std::env::current_exe().context("cannot find the kiln binary")?;
    for frequency in &args.frequencies {
        for mode in &args.modes {
            let (ebpf, off_cpu, interpreters) = match mode.split_once('=') {
                _ if mode == "perf" => ("false", None, "true"),
                _ if mode == "ebpf" => ("true", None, "true"),
                _ if mode == "native" => ("true", None, "false"),
                Some(("offcpu", share)) => ("true", Some(share), "true"),
                _ => anyhow::bail!("unknown mode {mode:?}: perf, ebpf, native or offcpu=SHARE"),
            };
            // A server of the run's own, so that what it stores is this run's.
            let run_dir = data_dir.join(format!("{frequency}-{}", mode.replace('=', "-")));
            let (mut server, url) = crate::common::start_server(&run_dir)?;
            let started_ms = kiln_model::time::now_nanos() / 1_000_000;
            let metrics_port = kiln_child::free_port();
            let mut agent = std::process::Command::new(&exe)
                .args([
                    "agent",
                    "--push-url",
                    &url,
                    "--frequency",
                    &frequency.to_string(),
                ])
                .args(["--metrics-listen", &format!("127.0.0.1:{metrics_port}")])
                .args(["--memory-limit", &args.memory_limit])
                .args(["--interval", &args.interval.to_string()])
                .args(["--ebpf", ebpf, "--interpreters", interpreters])
                .args(
                    off_cpu
                        .map(|share| vec!["--off-cpu", "--off-cpu-threshold", share])
                        .unwrap_or_default(),
                )
                .env("KILN_LOG_LEVEL", "warn")
                .spawn()
                .context("cannot start kiln agent")?;
            let pid = agent.id();
            // Measured from its first sample on: its start (the BPF programs' verification
            // above all) is slower on a busy host, and is reported apart.
            let started = std::time::Instant::now();
            let metrics_url = format!("http://127.0.0.1:{metrics_port}/metrics");
            loop {
                if let Ok(Some(status)) = agent.try_wait() {
                    anyhow::bail!("kiln agent exited: {status}");
                }
                let sampling = crate::http::Http::new(Duration::from_secs(2))
                    .get(&metrics_url)
                    .call()
                    .ok()
                    .map(|response| response.text())
                    .is_some_and(|text| text.contains("kiln_agent_sampling 1"));
                if sampling {
                    break;
                }
                if started.elapsed() > Duration::from_secs(120) {
                    anyhow::bail!("kiln agent did not start sampling within 120 s");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let start_seconds = started.elapsed().as_secs_f64();
            // Then as long again for the processes it finds at its first samples.
            tokio::time::sleep(Duration::from_secs(3)).await;
            let stats_on = kiln_agent::ebpf::enable_stats();
            let programs_before = kiln_agent::ebpf::program_stats();
            let before = crate::common::process_cpu_seconds(pid).unwrap_or(0.0);
            let switches_before = context_switches();
            // Its own heap, every second: the figure the memory budget bounds.
            let mut peak_anon = 0;
            for _ in 0..args.seconds {
                tokio::time::sleep(Duration::from_secs(1)).await;
                peak_anon = peak_anon.max(status_kib(pid, "RssAnon:"));
            }
            let cpu = crate::common::process_cpu_seconds(pid).unwrap_or(0.0) - before;
            let switch_rate =
                context_switches().saturating_sub(switches_before) as f64 / args.seconds as f64;
            // The BPF programs run in the threads they sample, not in the agent: their
            // time is the kernel's accounting of each program.
            let programs: Vec<String> = kiln_agent::ebpf::program_stats()
                .into_iter()
                .filter_map(|(name, (runs, time))| {
                    let (runs_before, time_before) =
                        programs_before.get(&name).copied().unwrap_or_default();
                    let runs = runs.checked_sub(runs_before)?;
                    let time = time.checked_sub(time_before)?;
                    (runs > 0).then(|| {
                        format!(
                            "{name} {runs} runs, {:.0} ns each, {:.3} % of one core",
                            time.as_nanos() as f64 / runs as f64,
                            100.0 * time.as_secs_f64() / args.seconds as f64
                        )
                    })
                })
                .collect();
            drop(stats_on);
            let metrics = crate::http::get(&format!("http://127.0.0.1:{metrics_port}/metrics"))
                .call()
                .ok()
                .map(|response| response.text())
                .unwrap_or_default();
            let metric = |name: &str| {
                metrics
                    .lines()
                    .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
                    .and_then(|value| value.trim().parse::<u64>().ok())
                    .unwrap_or(0)
            };
            let (samples, in_kernel, lost, processes) = (
                metric("kiln_agent_samples_total"),
                metric("kiln_agent_samples_in_kernel_total"),
                metric("kiln_agent_samples_lost_total"),
                metric("kiln_agent_processes"),
            );
            let stacks = |method: &str| -> u64 {
                metrics
                    .lines()
                    .filter(|line| {
                        line.starts_with("kiln_agent_stacks_total{")
                            && line.contains(&format!("method=\"{method}\""))
                    })
                    .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
                    .sum()
            };
            println!(
            "{frequency:>5} Hz {mode:>4}: agent CPU {:.3} % of one core over {} s, RSS {:.1} MiB (peak {:.1} MiB; its own heap {:.1} MiB, peak {:.1} MiB, the rest mapped binaries), {samples} samples ({in_kernel} counted in the kernel), {lost} lost, {} stacks by frame pointers, {} by DWARF, {processes} processes tracked, {switch_rate:.0} context switches/s on the host; sampling {start_seconds:.2} s after its start",
            100.0 * cpu / args.seconds as f64,
            args.seconds,
            status_kib(pid, "VmRSS:") as f64 / 1024.0,
            status_kib(pid, "VmHWM:") as f64 / 1024.0,
            status_kib(pid, "RssAnon:") as f64 / 1024.0,
            peak_anon as f64 / 1024.0,
            stacks("frame_pointer"),
            stacks("dwarf"),
        );
            if !programs.is_empty() {
                println!("      in the kernel: {}", programs.join("; "));
            }
            // Per runtime, the interpreter stacks named of those wanted.
            let mut runtimes: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
            for line in metrics
                .lines()
                .filter(|line| line.starts_with("kiln_agent_interpreter_stacks_total{"))
            {
                let label = |name: &str| {
                    let at = line.find(&format!("{name}=\""))? + name.len() + 2;
                    line[at..].split('"').next()
                };
                let (Some(runtime), Some(outcome), Some(count)) = (
                    label("runtime"),
                    label("outcome"),
                    line.rsplit(' ').next().and_then(|v| v.parse::<u64>().ok()),
                ) else {
                    continue;
                };
                let entry = runtimes.entry(runtime.to_string()).or_default();
                entry.1 += count;
                if outcome == "named" {
                    entry.0 += count;
                }
            }
            if !runtimes.is_empty() {
                let named: Vec<String> = runtimes
                    .iter()
                    .map(|(runtime, (named, all))| format!("{runtime} {named} of {all}"))
                    .collect();
                println!("      interpreter stacks named: {}", named.join(", "));
            }
            // SAFETY: kill(2) with a child's pid and SIGINT touches no memory.
            unsafe {
                libc::kill(pid as i32, libc::SIGINT);
            }
            let _ = agent.wait();
            server.stop();
            if args.storage {
                report_storage(&run_dir, started_ms).await?;
            }
            let _ = std::fs::remove_dir_all(&run_dir);
        }
    }
    busy.store(false, Ordering::Relaxed);
    for sleeper in sleepers {
        let _ = sleeper.join();
    }
    for mut child in busy_children {
        let _ = child.kill();
        let _ = child.wait();
    }
    for spinner in spinners {
        let _ = spinner.join();
    }
    if let Some(started) = churning.and_then(|thread| thread.join().ok()) {
        println!("{started} short-lived processes started");
    }
    let _ = std::fs::remove_dir_all(&data_dir);
    Ok(())
}
