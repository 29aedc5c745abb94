//! `kiln agent` on this machine: real perf events, real processes, a real server.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

/// Compiles the burner (tests/agent/burner.c) with frame pointers as `name`.
fn burner(dir: &Path, name: &str) -> Option<PathBuf> {
    let output = dir.join(name);
    let status = Command::new("cc")
        .args(["-O2", "-g", "-fno-omit-frame-pointer", "-o"])
        .arg(&output)
        .arg(workspace_root().join("tests/agent/burner.c"))
        .status()
        .ok()?;
    status.success().then_some(output)
}

/// The agent pushing to `server` every second; `None` (after saying why) when perf events
/// are not permitted here.
fn start_agent(server: &TestServer) -> Option<Child> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "agent",
            "--push-url",
            &server.url,
            "--interval",
            "1",
            "--frequency",
            "199",
        ])
        .env("KILN_LOG_LEVEL", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kiln runs");
    std::thread::sleep(Duration::from_millis(700));
    if let Ok(Some(status)) = child.try_wait() {
        let mut stderr = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
        }
        assert!(
            stderr.contains("perf_event_paranoid"),
            "the agent exited ({status}) without saying which setting to change: {stderr}"
        );
        println!(
            "skipped: the agent tests (perf events not permitted here: {})",
            stderr.trim()
        );
        return None;
    }
    Some(child)
}

/// Per function of the service's merged flame graph: (self, total), and the total.
fn functions(
    server: &TestServer,
    service: &str,
) -> (std::collections::HashMap<String, (i64, i64)>, i64) {
    let request = kiln_query::api::SelectMergeStacktracesRequest {
        profile_type_id: CPU.into(),
        label_selector: format!(r#"{{service_name="{service}"}}"#),
        start: 0,
        end: 0,
        max_nodes: Some(-1),
        format: kiln_query::api::PROFILE_FORMAT_TREE,
        ..Default::default()
    };
    let (status, body) = server.post_bytes(
        "/querier.v1.QuerierService/SelectMergeStacktraces",
        &prost::Message::encode_to_vec(&request),
        &[("Content-Type", "application/proto")],
    );
    assert_eq!(status, 200);
    let response: kiln_query::api::SelectMergeStacktracesResponse =
        prost::Message::decode(body.as_slice()).unwrap();
    let stacks = kiln_query::merge::read_tree_bytes(&response.tree).unwrap();
    let mut functions: std::collections::HashMap<String, (i64, i64)> = Default::default();
    let mut total = 0;
    for (path, value) in &stacks {
        total += value;
        if let Some(leaf) = path.last() {
            functions.entry(leaf.clone()).or_default().0 += value;
        }
        let mut seen: Vec<&String> = Vec::new();
        for frame in path {
            if !seen.contains(&frame) {
                functions.entry(frame.clone()).or_default().1 += value;
                seen.push(frame);
            }
        }
    }
    (functions, total)
}

fn stop(mut agent: Child) {
    // SAFETY: kill(2) with a child's pid and SIGINT touches no memory.
    unsafe {
        libc::kill(agent.id() as i32, libc::SIGINT);
    }
    let _ = agent.wait();
}

/// A C program burning 70/30 in two functions, profiled with no change to it: the split
/// holds within ±3 points and the stacks are whole (main is on ≥ 95% of them). Then 30
/// short runs (0.2 s each) of another program are attributed to that program's name.
#[test]
fn the_agent_profiles_processes_it_was_never_told_about() {
    let dir = tempfile::tempdir().unwrap();
    let Some(long) = burner(dir.path(), "kiln_fp_burner") else {
        println!("skipped: the agent tests (no C compiler)");
        return;
    };
    let short = dir.path().join("kiln_short_burner");
    std::fs::copy(&long, &short).unwrap();
    let server = TestServer::start();
    let Some(agent) = start_agent(&server) else {
        return;
    };
    let status = Command::new(&long).arg("8").status().unwrap();
    assert!(status.success());
    let started = Instant::now();
    for _ in 0..15 {
        let children: Vec<Child> = (0..2)
            .map(|_| Command::new(&short).arg("0.2").spawn().unwrap())
            .collect();
        for mut child in children {
            assert!(child.wait().unwrap().success());
        }
    }
    let short_seconds = started.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(2_500));
    stop(agent);

    let (long_functions, long_total) = functions(&server, "kiln_fp_burner");
    let a = long_functions.get("kiln_hot_a").map_or(0, |v| v.1) as f64;
    let b = long_functions.get("kiln_hot_b").map_or(0, |v| v.1) as f64;
    assert!(
        a + b > 0.0,
        "no samples of kiln_hot_a/b: {long_functions:?}"
    );
    let share_a = 100.0 * a / (a + b);
    println!(
        "kiln_fp_burner: {:.2} s of CPU sampled, kiln_hot_a {share_a:.1} %, kiln_hot_b {:.1} %",
        long_total as f64 / 1e9,
        100.0 - share_a
    );
    assert!(
        (share_a - 70.0).abs() <= 3.0,
        "split {share_a:.1}/{:.1}",
        100.0 - share_a
    );
    // 8 s of one core, sampled: within the sampling error of a few percent.
    assert!(
        long_total as f64 > 0.8 * 8e9,
        "only {long_total} ns sampled of 8 s"
    );
    let main = long_functions.get("main").map_or(0, |v| v.1) as f64;
    let main_share = main / long_total as f64;
    println!("main is on {:.1} % of the stacks", 100.0 * main_share);
    assert!(
        main_share >= 0.95,
        "stacks truncated: main on {:.1} %",
        100.0 * main_share
    );

    let (short_functions, short_total) = functions(&server, "kiln_short_burner");
    let expected = 30.0 * 0.2e9;
    println!(
        "kiln_short_burner: 30 runs of 0.2 s in {short_seconds:.1} s, {:.2} s of CPU sampled",
        short_total as f64 / 1e9
    );
    assert!(
        short_total as f64 > 0.75 * expected,
        "short-lived runs lost: {short_total} ns of {expected}"
    );
    assert!(
        short_functions.contains_key("kiln_hot_a"),
        "{short_functions:?}"
    );
    // None of them went to the long-running program's name, which had stopped by then.
    assert!(long_total as f64 <= 1.1 * 8e9, "{long_total}");
}
