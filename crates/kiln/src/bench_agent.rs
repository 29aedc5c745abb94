//! `kiln bench agent`: the agent's own cost. Every core is kept busy by spinning threads
//! (so there is something to sample on every CPU, as on a loaded host), a `kiln server`
//! child takes the reports, and for each frequency a `kiln agent` child runs for the
//! given time; its CPU comes from `/proc/PID/stat` and its memory from `/proc/PID/status`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

#[derive(Args)]
pub struct AgentBenchArgs {
    /// Seconds measured at each frequency.
    #[arg(long, default_value_t = 300)]
    seconds: u64,
    /// Sampling frequencies, Hz.
    #[arg(long, value_delimiter = ',', default_value = "19,100,1000")]
    frequencies: Vec<u64>,
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(field))
                .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

pub async fn run(args: AgentBenchArgs) -> anyhow::Result<()> {
    let data_dir = std::env::temp_dir().join(format!("kiln-bench-agent-{}", std::process::id()));
    let (mut server, url) = crate::bench::start_server(&data_dir)?;
    let busy = Arc::new(AtomicBool::new(true));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let spinners: Vec<_> = (0..cores)
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
    println!(
        "kiln bench agent: {cores} cores kept busy, {} s per frequency",
        args.seconds
    );
    let exe = std::env::current_exe().context("cannot find the kiln binary")?;
    for frequency in &args.frequencies {
        let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut agent = std::process::Command::new(&exe)
            .args([
                "agent",
                "--push-url",
                &url,
                "--frequency",
                &frequency.to_string(),
            ])
            .args(["--metrics-listen", &format!("127.0.0.1:{metrics_port}")])
            .env("KILN_LOG_LEVEL", "warn")
            .spawn()
            .context("cannot start kiln agent")?;
        let pid = agent.id();
        tokio::time::sleep(Duration::from_secs(5)).await;
        if let Ok(Some(status)) = agent.try_wait() {
            anyhow::bail!("kiln agent exited: {status}");
        }
        let before = crate::bench::process_cpu_seconds(pid).unwrap_or(0.0);
        tokio::time::sleep(Duration::from_secs(args.seconds)).await;
        let cpu = crate::bench::process_cpu_seconds(pid).unwrap_or(0.0) - before;
        let samples = ureq::get(&format!("http://127.0.0.1:{metrics_port}/metrics"))
            .call()
            .ok()
            .and_then(|response| response.into_string().ok())
            .and_then(|text| {
                text.lines()
                    .find_map(|line| line.strip_prefix("kiln_agent_samples_total "))
                    .and_then(|value| value.trim().parse::<u64>().ok())
            })
            .unwrap_or(0);
        println!(
            "{frequency:>5} Hz: agent CPU {:.3} % of one core over {} s, RSS {:.1} MiB (peak {:.1} MiB; its own heap {:.1} MiB, the rest mapped binaries), {samples} samples",
            100.0 * cpu / args.seconds as f64,
            args.seconds,
            status_kib(pid, "VmRSS:") as f64 / 1024.0,
            status_kib(pid, "VmHWM:") as f64 / 1024.0,
            status_kib(pid, "RssAnon:") as f64 / 1024.0,
        );
        // SAFETY: kill(2) with a child's pid and SIGINT touches no memory.
        unsafe {
            libc::kill(pid as i32, libc::SIGINT);
        }
        let _ = agent.wait();
    }
    busy.store(false, Ordering::Relaxed);
    for spinner in spinners {
        let _ = spinner.join();
    }
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&data_dir);
    Ok(())
}
