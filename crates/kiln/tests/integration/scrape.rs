//! Pull collection end to end: a real Go program exposing net/http/pprof scraped through
//! static and file service discovery, cumulative heap profiles turned into exact deltas,
//! and HTTP service discovery adding and removing targets live.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kiln_node::ServerConfig;
use kiln_query::api;
use prost::Message;

use crate::common::*;

/// A job's `profiling_config` with every Go endpoint but memory switched off (the
/// memory line follows), at the indentation of a top-level job list.
pub(crate) const MEMORY_ONLY: &str = "  profiling_config:
    pprof_config:
      process_cpu: {enabled: false}
      goroutine: {enabled: false}
      mutex: {enabled: false}
      block: {enabled: false}
";

pub(crate) fn scrape_configs(yaml: &str) -> Vec<kiln_scrape::ScrapeConfig> {
    yaml_serde::from_str(yaml).expect("scrape config parses")
}

pub(crate) use kiln_testkit::wait_until;

/// Self value per function of one service's profiles of `profile_type`.
pub(crate) fn self_by_function(
    server: &TestServer,
    profile_type: &str,
    service: &str,
) -> Vec<(String, i64)> {
    let now = kiln_model::time::now_nanos() / 1_000_000;
    let request = api::SelectMergeStacktracesRequest {
        profile_type_id: profile_type.into(),
        label_selector: format!(r#"{{service_name="{service}"}}"#),
        start: now - 3_600_000,
        end: now + 60_000,
        max_nodes: Some(-1),
        ..Default::default()
    };
    let (status, bytes) = server.post_bytes(
        "/querier.v1.QuerierService/SelectMergeStacktraces",
        &request.encode_to_vec(),
        &[("Content-Type", "application/proto")],
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let graph = api::SelectMergeStacktracesResponse::decode(bytes.as_slice())
        .unwrap()
        .flamegraph
        .unwrap_or_default();
    let mut out = Vec::new();
    for level in &graph.levels {
        for node in level.values.chunks(4) {
            if let [_, _, self_value, name] = node {
                if *self_value > 0 {
                    out.push((graph.names[*name as usize].clone(), *self_value));
                }
            }
        }
    }
    out
}

pub(crate) struct GoProgram {
    child: Child,
    pub(crate) address: String,
}

impl Drop for GoProgram {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Builds and starts testdata/go/burner, or `None` when Go is not installed.
pub(crate) fn start_burner(dir: &std::path::Path) -> Option<GoProgram> {
    static STARTED: AtomicUsize = AtomicUsize::new(0);
    let go = go_binary()?;
    let binary = dir.join(format!("burner-{}", STARTED.fetch_add(1, Ordering::SeqCst)));
    let status = Command::new(&go)
        .args(["build", "-o"])
        .arg(&binary)
        .arg(workspace_root().join("testdata/go/burner/main.go"))
        .env("GOTOOLCHAIN", "local")
        .env("GOCACHE", dir.join("gocache"))
        .env("GOPATH", dir.join("gopath"))
        .env("GO111MODULE", "off")
        .status()
        .expect("go build runs");
    assert!(status.success(), "go build failed");
    let mut child = Command::new(&binary)
        .stdout(Stdio::piped())
        .spawn()
        .expect("burner starts");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut address = String::new();
    let mut byte = [0u8; 1];
    while stdout.read(&mut byte).unwrap_or(0) == 1 && byte[0] != b'\n' {
        address.push(byte[0] as char);
    }
    Some(GoProgram { child, address })
}

#[test]
fn a_go_program_is_scraped_via_static_and_file_discovery() {
    let dir = tempfile::tempdir().unwrap();
    let Some(burner) = start_burner(dir.path()) else {
        println!(
            "skipped: a_go_program_is_scraped_via_static_and_file_discovery (go not installed)"
        );
        return;
    };
    // One process per job: Go serves one CPU profile at a time, and two jobs on one
    // process would take turns failing with HTTP 500.
    let Some(second) = start_burner(dir.path()) else {
        return;
    };
    let targets_file = dir.path().join("targets.json");
    std::fs::write(
        &targets_file,
        format!(
            r#"[{{"targets": ["{}"], "labels": {{"team": "perf"}}}}]"#,
            second.address
        ),
    )
    .unwrap();
    let yaml = format!(
        r#"
- job_name: burner-static
  scrape_interval: 2s
  scrape_timeout: 1s
  static_configs:
    - targets: ["{address}"]
- job_name: burner-files
  scrape_interval: 2s
  scrape_timeout: 1s
  file_sd_configs:
    - files: ["{dir}/*.json"]
      refresh_interval: 1s
  relabel_configs:
    - source_labels: [team]
      target_label: service_name
      replacement: burner-$1
"#,
        address = burner.address,
        dir = dir.path().display()
    );
    let configs = scrape_configs(&yaml);
    let server = TestServer::start_with(|config: &mut ServerConfig| {
        config.scrape_configs = configs;
    });
    const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
    for service in ["burner-static", "burner-perf"] {
        wait_until(
            &format!("{service}'s CPU profile"),
            Duration::from_secs(60),
            || {
                self_by_function(&server, CPU, service)
                    .iter()
                    .any(|(name, _)| name == "main.kilnBurnCPU")
            },
        );
        let functions = self_by_function(&server, CPU, service);
        let hottest = functions.iter().max_by_key(|(_, value)| *value).unwrap();
        assert_eq!(hottest.0, "main.kilnBurnCPU", "{functions:?}");
    }
    // The allocs endpoint is a delta profile: after two scrapes, allocations appear.
    wait_until("a memory delta", Duration::from_secs(60), || {
        self_by_function(
            &server,
            "memory:alloc_space:bytes:space:bytes",
            "burner-static",
        )
        .iter()
        .any(|(name, _)| name == "main.kilnAllocate")
    });
    // Targets: every profile kind of both jobs, up, with Prometheus's JSON shape.
    let targets = server.json("/api/v1/targets", &[]);
    let active = targets["data"]["activeTargets"].as_array().unwrap();
    assert_eq!(active.len(), 10, "5 kinds × 2 jobs: {targets}");
    let cpu = active
        .iter()
        .find(|t| t["scrapePool"] == "burner-files" && t["profileKind"] == "process_cpu")
        .unwrap();
    assert_eq!(cpu["health"], "up", "{cpu}");
    assert_eq!(cpu["labels"]["service_name"], "burner-perf");
    assert_eq!(cpu["labels"]["team"], "perf");
    assert_eq!(cpu["labels"]["instance"], second.address.as_str());
    assert!(cpu["discoveredLabels"]["__meta_filepath"]
        .as_str()
        .unwrap()
        .ends_with("targets.json"));
    assert!(server
        .metrics()
        .contains("kiln_scrape_target_up{job=\"burner-static\""));

    // Emptying the file removes its targets.
    std::fs::write(&targets_file, "[]").unwrap();
    wait_until("the file's targets to go", Duration::from_secs(30), || {
        let targets = server.json("/api/v1/targets", &[]);
        targets["data"]["activeTargets"].as_array().unwrap().len() == 5
    });
}

/// A one-thread HTTP server answering every request with `respond(request head)`.
pub(crate) fn serve(respond: impl Fn(&str) -> (u16, Vec<u8>) + Send + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = Vec::new();
            let mut buffer = [0u8; 4096];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buffer[..n]),
                }
            }
            let text = String::from_utf8_lossy(&request).to_string();
            let (status, body) = respond(&text);
            let head = format!(
                "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&body);
        }
    });
    address
}

/// The heap fixture with its alloc_* values multiplied by `factor`, as a cumulative
/// profile `factor` intervals into a process's life; in-use values stay as they are.
pub(crate) fn cumulative_heap(factor: i64) -> Vec<u8> {
    let mut profile =
        kiln_model::pprof::decode(&fixture("profefe-collector_heap_1.prof"), 1 << 30).unwrap();
    let alloc: Vec<usize> = profile
        .sample_type
        .iter()
        .enumerate()
        .filter(|(_, t)| profile.string_or_empty(t.r#type).starts_with("alloc_"))
        .map(|(index, _)| index)
        .collect();
    assert_eq!(alloc.len(), 2);
    for sample in 0..profile.sample.len() {
        let values = profile.sample.values_mut(sample).unwrap();
        for index in &alloc {
            values[*index] *= factor;
        }
    }
    profile.encode_to_vec()
}

#[test]
fn cumulative_heap_profiles_become_exact_deltas_and_restarts_are_detected() {
    // Scrapes 1–3 see a process 1, 2, 3 intervals old; scrape 4 sees it restarted (1 again).
    let factors = [1, 2, 3, 1];
    let served = Arc::new(AtomicUsize::new(0));
    let counter = served.clone();
    let address = serve(move |_| {
        let index = counter.fetch_add(1, Ordering::SeqCst);
        match factors.get(index) {
            Some(factor) => (200, cumulative_heap(*factor)),
            None => (503, b"done".to_vec()),
        }
    });
    let yaml = format!(
        r#"
- job_name: heap
  scrape_interval: 1s
  scrape_timeout: 1s
  static_configs: [{{targets: ["{address}"]}}]
{MEMORY_ONLY}      memory: {{path: /debug/pprof/heap, delta: true}}
"#
    );
    let server = TestServer::start_with(|config: &mut ServerConfig| {
        config.scrape_configs = scrape_configs(&yaml);
    });
    wait_until("four scrapes", Duration::from_secs(30), || {
        served.load(Ordering::SeqCst) >= 5
    });
    std::thread::sleep(Duration::from_millis(300)); // the last write's flush
    let heap = fixture("profefe-collector_heap_1.prof");
    let total = |profile_type: &str| -> i64 {
        self_by_function(&server, profile_type, "heap")
            .iter()
            .map(|(_, v)| v)
            .sum()
    };
    // Stored: deltas 2−1 and 3−2, then the restarted process's profile as it came.
    assert_eq!(
        total("memory:alloc_space:bytes:space:bytes"),
        3 * pprof_total(&heap, 1)
    );
    assert_eq!(
        total("memory:alloc_objects:count:space:bytes"),
        3 * pprof_total(&heap, 0)
    );
    // In-use values are a snapshot, never subtracted: one per stored profile.
    assert_eq!(
        total("memory:inuse_space:bytes:space:bytes"),
        3 * pprof_total(&heap, 3)
    );
}

#[test]
fn http_service_discovery_adds_and_removes_targets_live() {
    let good = serve(|_| (200, cumulative_heap(1)));
    let groups = Arc::new(Mutex::new(String::from("[]")));
    let published = groups.clone();
    let sd = serve(move |_| (200, published.lock().unwrap().clone().into_bytes()));
    let yaml = format!(
        r#"
- job_name: discovered
  scrape_interval: 1s
  scrape_timeout: 1s
  http_sd_configs:
    - url: http://{sd}/targets
      refresh_interval: 1s
  relabel_configs:
    - source_labels: [__name__]
      regex: memory
      action: keep
  profiling_config:
    pprof_config:
      memory: {{path: /heap, delta: false}}
"#
    );
    let server = TestServer::start_with(|config: &mut ServerConfig| {
        config.scrape_configs = scrape_configs(&yaml);
    });
    let active = |server: &TestServer| -> Vec<serde_json::Value> {
        server.json("/api/v1/targets", &[])["data"]["activeTargets"]
            .as_array()
            .unwrap()
            .clone()
    };
    std::thread::sleep(Duration::from_secs(2));
    assert!(active(&server).is_empty());
    *groups.lock().unwrap() = format!(
        r#"[{{"targets": ["{good}"], "labels": {{"env": "prod"}}}}, {{"targets": ["127.0.0.1:1"]}}]"#
    );
    wait_until("both targets scraped", Duration::from_secs(30), || {
        let targets = active(&server);
        targets.len() == 2 && targets.iter().all(|t| t["health"] != "unknown")
    });
    let targets = active(&server);
    let up = targets
        .iter()
        .find(|t| t["labels"]["instance"] == good.as_str())
        .unwrap();
    assert_eq!(up["health"], "up", "{up}");
    assert_eq!(up["labels"]["env"], "prod");
    assert_eq!(
        up["discoveredLabels"]["__meta_url"],
        format!("http://{sd}/targets").as_str()
    );
    let down = targets
        .iter()
        .find(|t| t["labels"]["instance"] == "127.0.0.1:1")
        .unwrap();
    assert_eq!(down["health"], "down");
    assert!(
        down["lastError"]
            .as_str()
            .unwrap()
            .contains("request failed"),
        "{down}"
    );
    // Relabeling kept only the memory kind; the others are listed as dropped.
    let dropped = server.json("/api/v1/targets", &[])["data"]["droppedTargets"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(dropped, 8, "4 other kinds × 2 targets");

    *groups.lock().unwrap() = format!(r#"[{{"targets": ["{good}"]}}]"#);
    wait_until("the dead target to go", Duration::from_secs(30), || {
        active(&server).len() == 1
    });
    *groups.lock().unwrap() = "[]".to_string();
    wait_until("every target to go", Duration::from_secs(30), || {
        active(&server).is_empty()
    });
}

/// A `kiln scrape` config: one job of tenant team-a scraping `target`'s heap every second.
pub(crate) fn remote_job(dir: &std::path::Path, target: &str) -> std::path::PathBuf {
    let config = dir.join("scrape.yaml");
    let memory_only: String = MEMORY_ONLY
        .lines()
        .map(|line| format!("  {line}\n"))
        .collect();
    std::fs::write(
        &config,
        format!(
            r#"
scrape_configs:
  - job_name: remote
    scrape_interval: 1s
    scrape_timeout: 1s
    tenant: team-a
    static_configs: [{{targets: ["{target}"], labels: {{region: eu}}}}]
{memory_only}        memory: {{path: /heap, delta: false}}
"#
        ),
    )
    .unwrap();
    config
}

/// `kiln scrape` as its own process, pushing to a second Kiln: pull translated into push.
#[test]
fn kiln_scrape_pushes_to_a_remote_kiln() {
    let target = serve(|_| (200, cumulative_heap(1)));
    let receiver = TestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = remote_job(dir.path(), &target);
    let mut scraper = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["scrape", "--config"])
        .arg(&config)
        .args(["--push-url", &receiver.url])
        .env("KILN_LOG_LEVEL", "warn")
        .spawn()
        .expect("kiln scrape starts");
    let heap = fixture("profefe-collector_heap_1.prof");
    let inuse = pprof_total(&heap, 3);
    let series = || -> serde_json::Value {
        let now = kiln_model::time::now_nanos() / 1_000_000;
        let body = serde_json::json!({
            "profileTypeID": "memory:inuse_space:bytes:space:bytes",
            "labelSelector": "{service_name=\"remote\"}",
            "start": (now - 600_000).to_string(),
            "end": (now + 60_000).to_string(),
            "step": 3600.0,
            "groupBy": ["region", "instance", "job"],
        });
        let (status, text) = receiver.post_with(
            "/querier.v1.QuerierService/SelectSeries",
            body.to_string().as_bytes(),
            &[
                ("Content-Type", "application/json"),
                ("X-Scope-OrgID", "team-a"),
            ],
        );
        assert_eq!(status, 200, "{text}");
        serde_json::from_str(&text).unwrap()
    };
    wait_until("two pushed profiles", Duration::from_secs(30), || {
        let response = series();
        let total: f64 = response["series"]
            .as_array()
            .map(|all| {
                all.iter()
                    .flat_map(|s| s["points"].as_array().cloned().unwrap_or_default())
                    .map(|p| p["value"].as_f64().unwrap_or(0.0))
                    .sum()
            })
            .unwrap_or(0.0);
        total >= 2.0 * inuse as f64
    });
    let _ = scraper.kill();
    let _ = scraper.wait();
    let response = series();
    let labels = &response["series"][0]["labels"];
    let label = |name: &str| {
        labels
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == name)
            .map(|l| l["value"].as_str().unwrap().to_string())
    };
    assert_eq!(label("region").as_deref(), Some("eu"));
    assert_eq!(label("job").as_deref(), Some("remote"));
    assert_eq!(label("instance").as_deref(), Some(target.as_str()));
    // Every stored profile is the target's whole heap profile: a multiple of its total.
    let total: f64 = response["series"][0]["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["value"].as_f64().unwrap())
        .sum();
    assert_eq!(total as i64 % inuse, 0, "{response}");
    // The default tenant saw nothing.
    let (_, other) = receiver.post_with(
        "/querier.v1.QuerierService/LabelValues",
        br#"{"name": "service_name"}"#,
        &[("Content-Type", "application/json")],
    );
    assert!(!other.contains("remote"), "{other}");
}

/// With auth on, `kiln scrape` sends its token (`KILN_TOKEN`) and its pushes land in the
/// job's tenant; without one they are refused, and counted.
#[test]
fn kiln_scrape_sends_its_token() {
    use crate::auth::{auth_config, bearer, READER_A, WRITER_A};
    let target = serve(|_| (200, cumulative_heap(1)));
    let receiver = TestServer::start_with(|config| config.auth = auth_config(1000));
    let dir = tempfile::tempdir().unwrap();
    let config = remote_job(dir.path(), &target);
    let scrape = |token: Option<&str>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_kiln"));
        command
            .args(["scrape", "--config"])
            .arg(&config)
            .args(["--push-url", &receiver.url])
            .env("KILN_LOG_LEVEL", "error")
            .env_remove("KILN_TOKEN");
        if let Some(token) = token {
            command.env("KILN_TOKEN", token);
        }
        command.spawn().expect("kiln scrape starts")
    };
    let reader = bearer(READER_A);
    let types = || {
        let (status, text) = receiver.post_with(
            "/querier.v1.QuerierService/LabelValues",
            br#"{"name": "service_name"}"#,
            &[
                ("Content-Type", "application/json"),
                ("Authorization", &reader),
            ],
        );
        assert_eq!(status, 200, "{text}");
        text
    };
    let mut without = scrape(None);
    wait_until("a refused push", Duration::from_secs(30), || {
        crate::auth::admin_metrics(&receiver)
            .contains("kiln_auth_failures_total{reason=\"missing\"}")
    });
    let _ = without.kill();
    let _ = without.wait();
    assert!(!types().contains("remote"));
    let mut with = scrape(Some(WRITER_A));
    wait_until(
        "a pushed profile in team-a",
        Duration::from_secs(30),
        || types().contains("remote"),
    );
    let _ = with.kill();
    let _ = with.wait();
}

/// Targets that answer HTML, garbage, too much, too late or only with credentials: each
/// gets its own clear error, nothing of theirs is stored, and the good ones go on.
#[test]
fn bad_targets_fail_alone_with_clear_errors() {
    let good = serve(|_| (200, cumulative_heap(1)));
    let html = serve(|_| (200, b"<html><body>Welcome to nginx!</body></html>".to_vec()));
    let garbage = serve(|_| (200, (0..5000u32).map(|i| (i * 7919 % 251) as u8).collect()));
    let huge = serve(|_| (200, vec![b'x'; 2 << 20]));
    let slow = serve(|_| {
        std::thread::sleep(Duration::from_secs(3));
        (200, cumulative_heap(1))
    });
    // "dTpw" is base64 of "u:p".
    let guarded = serve(|request| {
        if request.contains("Authorization: Basic dTpw")
            || request.contains("authorization: Basic dTpw")
        {
            (200, cumulative_heap(1))
        } else {
            (401, b"unauthorized".to_vec())
        }
    });
    let yaml = format!(
        r#"
- job_name: mixed
  scrape_interval: 1s
  scrape_timeout: 1s
  body_size_limit: 1048576
  basic_auth: {{username: u, password: p}}
  static_configs: [{{targets: ["{good}", "{html}", "{garbage}", "{huge}", "{slow}", "{guarded}"]}}]
{MEMORY_ONLY}      memory: {{path: /heap, delta: false}}
"#
    );
    let server = TestServer::start_with(|config: &mut ServerConfig| {
        config.scrape_configs = scrape_configs(&yaml);
    });
    let target = |address: &str| -> serde_json::Value {
        server.json("/api/v1/targets", &[])["data"]["activeTargets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["labels"]["instance"] == address)
            .cloned()
            .unwrap_or_default()
    };
    wait_until("every target scraped", Duration::from_secs(30), || {
        [&good, &html, &garbage, &huge, &slow, &guarded]
            .iter()
            .all(|address| target(address)["health"] != "unknown")
    });
    assert_eq!(target(&good)["health"], "up");
    assert_eq!(target(&guarded)["health"], "up", "{}", target(&guarded));
    let error = |address: &str| {
        target(address)["lastError"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    assert!(
        error(&html).contains("not a pprof profile") && error(&html).contains("<html>"),
        "{}",
        error(&html)
    );
    assert!(
        error(&garbage).contains("not a pprof profile"),
        "{}",
        error(&garbage)
    );
    assert!(
        error(&huge).contains("larger than body_size_limit"),
        "{}",
        error(&huge)
    );
    assert!(error(&slow).contains("timed out"), "{}", error(&slow));
    // Only the good targets' profiles were stored.
    let (status, text) = server.post_with(
        "/querier.v1.QuerierService/LabelValues",
        br#"{"name": "instance"}"#,
        &[("Content-Type", "application/json")],
    );
    assert_eq!(status, 200, "{text}");
    let values: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut stored: Vec<&str> = values["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    stored.sort();
    let mut expected = vec![good.as_str(), guarded.as_str()];
    expected.sort();
    assert_eq!(stored, expected);
}
