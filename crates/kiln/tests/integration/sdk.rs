//! The real Pyroscope SDKs (Python `pyroscope-io` from PyPI, Node `@pyroscope/nodejs` from
//! npm) pushing to Kiln unchanged. `scripts/test.sh` installs them; without them these
//! tests say they skipped.

use std::process::Command;

use crate::common::*;
use crate::pyroscope::{names, ticks, url_escape};

fn render(server: &TestServer, query: &str) -> serde_json::Value {
    server.json(
        &format!(
            "/pyroscope/render?query={}&from=now-10m&until=now%2B1m",
            url_escape(query)
        ),
        &[],
    )
}

/// Whether `pyroscope-io` can be imported; says the test skipped when not.
pub fn python_sdk_installed() -> bool {
    let has_sdk = Command::new("python3")
        .args(["-c", "import pyroscope"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_sdk {
        println!(
            "skipped: the pyroscope-io Python SDK is not installed (scripts/test.sh installs it)"
        );
    }
    has_sdk
}

#[test]
fn python_sdk_pushes_cpu_profiles() {
    if !python_sdk_installed() {
        return;
    }
    let server = TestServer::start();
    let script = workspace_root().join("tests/sdk/python_app.py");
    let status = Command::new("python3")
        .arg(&script)
        .arg(&server.url)
        .arg("11")
        .status()
        .expect("python runs");
    assert!(status.success());
    let result = render(&server, "process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name=\"kiln-python-e2e\", sdk=\"python\"}");
    assert!(
        ticks(&result) > 1_000_000_000,
        "at least a second of CPU: {}",
        ticks(&result)
    );
    assert!(
        names(&result)
            .iter()
            .any(|n| n.contains("kiln_python_hot_loop")),
        "{:?}",
        names(&result)
    );
}

#[test]
fn node_sdk_pushes_wall_and_heap_profiles() {
    let sdk_dir = workspace_root().join("tests/sdk");
    if !sdk_dir.join("node_modules/@pyroscope/nodejs").is_dir() {
        eprintln!("skipped: @pyroscope/nodejs is not installed in tests/sdk (scripts/test.sh installs it)");
        return;
    }
    let server = TestServer::start();
    let status = Command::new("node")
        .current_dir(&sdk_dir)
        .arg("node_app.js")
        .arg(&server.url)
        .arg("8")
        .status()
        .expect("node runs");
    assert!(status.success());
    let wall = render(
        &server,
        "wall:wall:nanoseconds:wall:nanoseconds{service_name=\"kiln-node-e2e\", sdk=\"node\"}",
    );
    assert!(ticks(&wall) > 0);
    assert!(
        names(&wall).iter().any(|n| n.contains("kilnNodeHotLoop")),
        "{:?}",
        names(&wall)
    );
    let heap = render(
        &server,
        "memory:inuse_space:bytes:inuse_space:bytes{service_name=\"kiln-node-e2e\"}",
    );
    assert!(ticks(&heap) > 0, "the heap profile arrived");
}
