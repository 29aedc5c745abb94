//! `kiln agent` and interpreted programs: their own functions named, with no change to
//! them (no flag, no environment variable, no library loaded), in one stack with the
//! native frames around them (crates/kiln-agent/src/interp/).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::agent::{agent_metrics, cpu_tree, start_agent, stop};
use crate::common::*;

/// The merged flame graph of one process: each path root first, with its self value.
fn paths(server: &TestServer, pid: u32) -> Vec<(Vec<String>, i64)> {
    let tree = cpu_tree(server, &format!(r#"{{pid="{pid}"}}"#));
    kiln_query::merge::read_tree_bytes(&tree).expect("tree")
}

/// The share (in %) of a process's samples whose stack holds a frame named `name`.
fn share(paths: &[(Vec<String>, i64)], name: &str) -> f64 {
    let total: i64 = paths.iter().map(|(_, v)| v).sum();
    let with: i64 = paths
        .iter()
        .filter(|(path, _)| path.iter().any(|frame| frame == name))
        .map(|(_, v)| v)
        .sum();
    100.0 * with as f64 / total.max(1) as f64
}

/// Waits (up to 20 s) until a process's sampled CPU reaches `nanos`.
fn wait_for_samples(server: &TestServer, pid: u32, nanos: i64) -> Vec<(Vec<String>, i64)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let paths = paths(server, pid);
        let total: i64 = paths.iter().map(|(_, v)| v).sum();
        if total >= nanos || Instant::now() > deadline {
            return paths;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The CPython interpreters here, each once: the one `python3` runs, and Debian's.
fn pythons() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = Vec::new();
    let mut candidates = vec![PathBuf::from("/usr/bin/python3.11")];
    if let Ok(output) = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
    {
        candidates.push(PathBuf::from(
            String::from_utf8_lossy(&output.stdout).trim(),
        ));
    }
    for candidate in candidates {
        let Ok(real) = candidate.canonicalize() else {
            continue;
        };
        if !found
            .iter()
            .any(|f| f.canonicalize().ok().as_ref() == Some(&real))
        {
            found.push(candidate);
        }
    }
    found
}

/// Python programs started plainly: the flame graph of each process names its own
/// functions, splits 70/30 between the two hot ones within ±5 points, and has `kiln_main`
/// on ≥ 90 % of its samples (the stack is whole: the Python frames sit between the
/// interpreter's start and the native code they run). A function calling a C extension
/// (zlib) has zlib's frames under it.
#[test]
fn python_functions_are_named_with_no_change_to_the_program() {
    let pythons = pythons();
    if pythons.is_empty() {
        println!("skipped: the Python agent test (no CPython here)");
        return;
    }
    let script = workspace_root().join("tests/agent/burner.py");
    let server = TestServer::start();
    let Some(agent) = start_agent(&server) else {
        return;
    };
    let seconds = "8";
    let mut children = Vec::new();
    for python in &pythons {
        for mode in ["plain", "compress"] {
            let child = Command::new(python)
                .arg(&script)
                .arg(seconds)
                .arg(mode)
                .spawn()
                .expect("python runs");
            children.push((python.clone(), mode, child));
        }
    }
    let mut processes = Vec::new();
    for (python, mode, mut child) in children {
        let pid = child.id();
        assert!(child.wait().expect("waits").success(), "{python:?} {mode}");
        processes.push((python, mode, pid));
    }
    let mut failures = Vec::new();
    for (python, mode, pid) in &processes {
        // Four processes on two cores for 8 s: about 4 s of CPU each.
        let paths = wait_for_samples(&server, *pid, 3_000_000_000);
        let total: i64 = paths.iter().map(|(_, v)| v).sum();
        let main = share(&paths, "kiln_main");
        if *mode == "plain" {
            let a = share(&paths, "kiln_hot_a");
            let b = share(&paths, "kiln_hot_b");
            let split = 100.0 * a / (a + b).max(f64::MIN_POSITIVE);
            println!(
                "{python:?} (pid {pid}): {:.2} s sampled, kiln_hot_a {split:.1} % of the two, kiln_main on {main:.1} % of stacks",
                total as f64 / 1e9
            );
            if (split - 70.0).abs() > 5.0 || main < 90.0 {
                failures.push(format!("{python:?}: split {split:.1}, main {main:.1}"));
            }
        } else {
            // zlib's own frames (deflate…) below kiln_compress, in the same stacks.
            let under: i64 = paths
                .iter()
                .filter(|(path, _)| {
                    path.iter()
                        .position(|f| f == "kiln_compress")
                        .is_some_and(|at| path[at + 1..].iter().any(|f| f.contains("deflate")))
                })
                .map(|(_, v)| v)
                .sum();
            let compress = share(&paths, "kiln_compress");
            let under = 100.0 * under as f64 / total.max(1) as f64;
            println!(
                "{python:?} (pid {pid}) with zlib: kiln_compress on {compress:.1} % of stacks, zlib's deflate under it on {under:.1} %, kiln_main on {main:.1} %"
            );
            if under < 80.0 || main < 90.0 {
                let top: Vec<String> = paths
                    .iter()
                    .take(5)
                    .map(|(path, v)| format!("{v}: {}", path.join(";")))
                    .collect();
                failures.push(format!(
                    "{python:?} zlib: deflate under kiln_compress on {under:.1} %, main {main:.1}: {top:#?}"
                ));
            }
        }
    }
    let metrics = agent_metrics(&agent);
    stop(agent);
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(
        metrics.contains("kiln_agent_interpreter_stacks_total{")
            && metrics.contains("outcome=\"named\""),
        "{metrics}"
    );
}
