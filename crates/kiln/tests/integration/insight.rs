//! Insight through the API, on every backend: a comparison finds a planted change and
//! nothing in equal inputs, refuses with too few profiles, keeps tenants apart; the
//! regression watcher finds a change planted in a service's second version, end to end
//! through ingest, posts it to a webhook, and its findings survive a restart.

use std::io::{BufRead, BufReader, Read, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kiln_node::ServerConfig;

use crate::common::*;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
/// Profiles a version, ten seconds apart.
const PROFILES: i64 = 20;

on_every_backend!(compare_ranks_with_confidence_and_the_watcher_finds_a_planted_regression);

/// A receiver of webhook posts: their bodies.
pub fn webhook() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let received = bodies.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; length];
            if reader.read_exact(&mut body).is_ok() {
                received
                    .lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&body).into_owned());
            }
            let _ = stream.write_all(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n");
        }
    });
    (url, bodies)
}

/// One profile's folded stacks: three functions whose sizes wobble from profile to
/// profile, and in `slow` versions a fourth, `slow_path`.
pub fn profile(index: i64, slow: bool) -> String {
    // A small deterministic wobble, different for each function.
    let wobble = |salt: i64| (index * 7919 + salt * 104_729) % 23 - 11;
    let mut text = format!(
        "main;handle;parse {}\nmain;handle;render {}\nmain;gc {}\n",
        300 + 3 * wobble(1),
        200 + 2 * wobble(2),
        100 + wobble(3)
    );
    if slow {
        text.push_str(&format!("main;handle;slow_path {}\n", 60 + wobble(4)));
    }
    text
}

pub fn push(server: &TestServer, tenant: &str, version: &str, start_s: i64, slow: bool) -> i64 {
    push_service(server, tenant, "checkout", version, start_s, slow)
}

pub fn push_service(
    server: &TestServer,
    tenant: &str,
    service: &str,
    version: &str,
    start_s: i64,
    slow: bool,
) -> i64 {
    let mut total = 0;
    for index in 0..PROFILES {
        let from = start_s + index * 10;
        let body = profile(index, slow);
        total += body
            .lines()
            .map(|line| line.rsplit(' ').next().unwrap().parse::<i64>().unwrap())
            .sum::<i64>();
        let (status, text) = server.post_with(
            &format!(
                "/ingest?name={service}.cpu{{version={version}}}&format=folded&sampleRate=100&from={from}&until={}",
                from + 10
            ),
            body.as_bytes(),
            &[("X-Scope-OrgID", tenant)],
        );
        assert_eq!(status, 200, "{text}");
    }
    // Samples at 100 Hz: 10 ms each.
    total * 10_000_000
}

fn compare(server: &TestServer, tenant: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let (status, text) = server.post_with(
        "/api/v1/compare",
        body.to_string().as_bytes(),
        &[
            ("X-Scope-OrgID", tenant),
            ("Content-Type", "application/json"),
        ],
    );
    let value = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
    (status, value)
}

fn side(version: &str, from_s: i64, until_s: i64) -> serde_json::Value {
    serde_json::json!({
        "selector": format!("{{service_name=\"checkout\", version=\"{version}\"}}"),
        "from": from_s * 1000,
        "until": until_s * 1000,
    })
}

pub fn with_watcher(url: String) -> impl FnOnce(&mut ServerConfig) {
    move |config: &mut ServerConfig| {
        config.regressions.interval_ms = 200;
        config.regressions.window_ms = 120_000;
        config.regressions.lookback_ms = 3_600_000;
        config.regressions.min_profiles = 10;
        config.regressions.webhook_url = Some(url);
        // The datasets stay as written, so the watcher's reads can be counted.
        config.compaction.enabled = false;
    }
}

fn compare_ranks_with_confidence_and_the_watcher_finds_a_planted_regression(backend: Backend) {
    let (hook_url, hooked) = webhook();
    let server = TestServer::start_on(backend, with_watcher(hook_url));
    let now_s = kiln_model::time::now_ms() / 1000;
    // Version 1.0 from 30 min ago, 1.1 (with slow_path) from 25 min ago, both done by now.
    let (v1_start, v2_start) = (now_s - 1800, now_s - 1500);
    let v1_total = push(&server, "team-a", "1.0", v1_start, false);
    let v2_total = push(&server, "team-a", "1.1", v2_start, true);
    let span = PROFILES * 10;

    // The planted function comes first, significant, with its figures.
    let request = serde_json::json!({
        "profile_type": CPU,
        "left": side("1.0", v1_start, v1_start + span),
        "right": side("1.1", v2_start, v2_start + span),
        "limit": 3,
    });
    let (status, answer) = compare(&server, "team-a", request.clone());
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["left"]["profiles"], PROFILES, "{answer}");
    assert_eq!(answer["right"]["profiles"], PROFILES);
    assert_eq!(answer["left"]["total"], v1_total);
    assert_eq!(answer["right"]["total"], v2_total);
    let rate = answer["right"]["rate"].as_f64().unwrap();
    assert!((rate - v2_total as f64 / span as f64).abs() < 1.0, "{rate}");
    assert_eq!(answer["refused"], serde_json::Value::Null);
    // Leaf functions: parse, render, gc, slow_path.
    assert_eq!(answer["method"]["tested"], 4);
    let top = &answer["functions"][0];
    assert_eq!(top["name"], "slow_path", "{answer}");
    assert_eq!(top["significant"], true);
    assert_eq!(top["left_share"], 0.0);
    assert!(top["confidence"].as_f64().unwrap() > 0.999, "{top}");
    assert!(top["p_value"].as_f64().unwrap() < 1e-6, "{top}");
    let delta = top["delta_share"].as_f64().unwrap();
    assert!((delta - top["right_share"].as_f64().unwrap()).abs() < 1e-12);
    assert!(delta > 0.08 && delta < 0.12, "{delta}");
    assert_eq!(answer["functions"].as_array().unwrap().len(), 3, "limit");

    // The CLI prints the same ranking.
    let printed = run_kiln([
        "query".to_string(),
        "--url".into(),
        server.url.clone(),
        "--tenant".into(),
        "team-a".into(),
        "diff".into(),
        "--explain".into(),
        "-q".into(),
        format!("{CPU}{{service_name=\"checkout\", version=\"1.0\"}}"),
        "--from".into(),
        (v1_start * 1000).to_string(),
        "--to".into(),
        ((v1_start + span) * 1000).to_string(),
        "--right-query".into(),
        format!("{CPU}{{service_name=\"checkout\", version=\"1.1\"}}"),
        "--right-from".into(),
        (v2_start * 1000).to_string(),
        "--right-to".into(),
        ((v2_start + span) * 1000).to_string(),
    ]);
    let first = printed
        .lines()
        .find(|line| line.trim_start().starts_with("1 "))
        .unwrap_or_else(|| panic!("no rank 1 in {printed}"));
    assert!(
        first.ends_with("slow_path") && first.contains(" yes "),
        "{printed}"
    );
    assert!(
        printed.contains(&format!("left   {PROFILES} profiles, total {v1_total}")),
        "{printed}"
    );

    // Equal inputs: nothing significant.
    let same = serde_json::json!({
        "profile_type": CPU,
        "left": side("1.0", v1_start, v1_start + span),
        "right": side("1.0", v1_start, v1_start + span),
    });
    let (_, answer) = compare(&server, "team-a", same);
    assert_eq!(answer["significant"], 0, "{answer}");
    assert!(answer["functions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|f| f["significant"] == false));

    // Three profiles on the left: a refusal, not a false "significant".
    let few = serde_json::json!({
        "profile_type": CPU,
        "left": side("1.0", v1_start, v1_start + 30),
        "right": side("1.1", v2_start, v2_start + span),
    });
    let (status, answer) = compare(&server, "team-a", few);
    assert_eq!(status, 200);
    let refused = answer["refused"].as_str().unwrap_or_default();
    assert!(refused.contains("the left side has 3"), "{answer}");
    assert_eq!(answer["significant"], 0);
    assert_eq!(answer["functions"][0]["p_value"], serde_json::Value::Null);

    // Another tenant sees none of it.
    let (_, answer) = compare(&server, "team-b", request);
    assert_eq!(answer["left"]["profiles"], 0, "{answer}");
    assert_eq!(answer["functions"], serde_json::json!([]));

    // Mistakes are 400s that say what is wrong.
    for (body, expect) in [
        (
            serde_json::json!({"profile_type": CPU, "left": side("1.0", 10, 5), "right": side("1.1", 0, 1)}),
            "left: until",
        ),
        (
            serde_json::json!({"profile_type": CPU, "left": {"selector": "{version=}", "from": 0, "until": 1}, "right": side("1.1", 0, 1)}),
            "left.selector",
        ),
        (
            serde_json::json!({"profile_type": "cpu", "left": side("1.0", 0, 1), "right": side("1.1", 0, 1)}),
            "profile_typeID",
        ),
        (
            serde_json::json!({"profile_type": CPU}),
            "invalid comparison",
        ),
    ] {
        let (status, answer) = compare(&server, "team-a", body);
        assert_eq!(status, 400, "{answer}");
        assert!(
            answer.to_string().contains(expect),
            "{answer}: want {expect}"
        );
    }

    // The watcher: version 1.1 is new, has run longer than the window, and slow_path is
    // its regression.
    let deadline = Instant::now() + Duration::from_secs(60);
    let findings = loop {
        let listed = server.json(
            "/api/v1/regressions?service=checkout&since=now-1h",
            &[("X-Scope-OrgID", "team-a")],
        );
        let findings = listed["regressions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if !findings.is_empty() {
            break findings;
        }
        assert!(
            Instant::now() < deadline,
            "no regression found: {listed}; {}",
            server
                .metrics()
                .lines()
                .filter(|line| line.contains("regressions"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    // The one increase is slow_path. Shares are parts of a whole, so the others shrink:
    // the biggest, parse, by enough to be reported as a decrease.
    let increases: Vec<&serde_json::Value> = findings
        .iter()
        .filter(|f| f["change"] == "increase")
        .collect();
    assert_eq!(increases.len(), 1, "{findings:?}");
    assert!(findings
        .iter()
        .all(|f| f["change"] == "increase" || f["delta_share"].as_f64().unwrap() < 0.0));
    let finding = increases[0];
    assert_eq!(finding["function"], "slow_path");
    assert_eq!(finding["change"], "increase");
    assert_eq!(finding["old_version"], "1.0");
    assert_eq!(finding["new_version"], "1.1");
    assert_eq!(finding["version_label"], "version");
    assert_eq!(finding["profile_type"], CPU);
    assert_eq!(finding["right"]["from"], v2_start * 1000);
    assert_eq!(finding["right"]["until"], v2_start * 1000 + 120_000);
    assert_eq!(finding["right"]["profiles"], 12, "{finding}");
    assert_eq!(finding["left"]["profiles"], 12, "{finding}");
    assert!(server
        .metrics()
        .contains("kiln_regressions_detected_total{change=\"increase\"} 1"));
    // Each dataset is read once while it stays in the lookback: later looks read none.
    let counter = |server: &TestServer, name: &str| server.metric(name) as u64;
    let datasets_read =
        |server: &TestServer| counter(server, "kiln_regressions_datasets_read_total");
    let two_more_looks = |server: &TestServer| {
        let looks = |server: &TestServer| counter(server, "kiln_regressions_looks_total");
        let target = looks(server) + 2;
        let deadline = Instant::now() + Duration::from_secs(30);
        while looks(server) < target {
            assert!(Instant::now() < deadline, "the watcher stopped looking");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // Quiet: two whole looks read nothing. (A look under way may still be reading the
    // last segments flushed; it ends before the second look counted from now.)
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut read = datasets_read(&server);
    assert!(read > 0);
    loop {
        two_more_looks(&server);
        let now_read = datasets_read(&server);
        if now_read == read {
            break;
        }
        read = now_read;
        assert!(
            Instant::now() < deadline,
            "the watcher keeps reading datasets"
        );
    }
    // Datasets of the last `settle_ms` (60 s) are not read: they are level 0, which
    // compaction moves within seconds. Two whole looks after they are written, none of
    // them was read.
    push_service(&server, "team-a", "fresh", "1.0", now_s, false);
    two_more_looks(&server);
    assert_eq!(datasets_read(&server), read);
    let deadline = Instant::now() + Duration::from_secs(30);
    while hooked.lock().unwrap().len() < findings.len() {
        assert!(Instant::now() < deadline, "the webhook got nothing");
        std::thread::sleep(Duration::from_millis(100));
    }
    let posted: Vec<serde_json::Value> = hooked
        .lock()
        .unwrap()
        .iter()
        .map(|body| serde_json::from_str(body).expect("webhook body is JSON"))
        .collect();
    assert!(posted.contains(finding), "{posted:?}");
    assert_eq!(posted.len(), findings.len());
    assert!(
        server.json("/api/v1/regressions", &[("X-Scope-OrgID", "team-b")])["regressions"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    let (status, body) = server.get("/api/v1/regressions?since=yesterday-ish");
    assert_eq!(status, 400, "{body}");

    // Stored: a restart lists it still, and does not check the version again.
    let (hook_url, hooked_again) = webhook();
    let server = server.restart_with(with_watcher(hook_url));
    std::thread::sleep(Duration::from_millis(1000));
    let listed = server.json(
        "/api/v1/regressions?service=checkout",
        &[("X-Scope-OrgID", "team-a")],
    );
    assert_eq!(
        listed["regressions"].as_array().unwrap().len(),
        findings.len(),
        "{listed}"
    );
    assert!(hooked_again.lock().unwrap().is_empty());
    assert!(!server
        .metrics()
        .contains("kiln_regressions_detected_total{change=\"increase\"} 1"));
}

/// `kiln bench insight` reports each ranking's rates and the speed over a side of data
/// (the figures are docs/benchmarks.md's); with its fixed seed the rates are fixed too.
#[test]
fn the_insight_bench_reports_both_rates_for_each_ranking() {
    let corpus = workspace_root().join("testdata");
    let output = run_kiln([
        "bench",
        "insight",
        "--corpus",
        corpus.to_str().unwrap(),
        "--trials",
        "20",
        "--speed-profiles",
        "3600",
        "--watch-services",
        "20",
        "--watch-segments",
        "6",
    ]);
    let row = |name: &str| -> Vec<String> {
        let line = output
            .lines()
            .find(|line| line.starts_with(&format!("| {name}")))
            .unwrap_or_else(|| panic!("no {name} row in {output}"));
        line.split('|')
            .map(|cell| cell.trim().to_string())
            .collect()
    };
    // "90% (18/20)" → 18.
    let count = |cell: &str| -> u32 {
        let inner = cell.rsplit('(').next().unwrap_or_default();
        inner
            .split('/')
            .next()
            .unwrap_or_default()
            .parse()
            .unwrap_or(u32::MAX)
    };
    let (kiln, naive, per_sample) = (row("Kiln"), row("naive"), row("per-sample"));
    // Ranked first more often than by size, and no false alarm where both others raise some.
    assert!(count(&kiln[2]) > count(&naive[2]), "{output}");
    assert_eq!(count(&kiln[4]), 0, "{output}");
    assert!(
        count(&naive[4]) > 0 && count(&per_sample[4]) > 0,
        "{output}"
    );
    assert!(
        output.contains("| compare, 1 h a side | 3600 + 3600 profiles |"),
        "{output}"
    );
    assert!(
        output.contains("| regression watcher, 20 services × 6 segments"),
        "{output}"
    );
    assert!(output.contains("| next look (nothing new) |"), "{output}");
}
