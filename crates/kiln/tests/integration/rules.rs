//! Recording rules through the API, on every backend: file rules are read-only, API rules
//! are per tenant, mistakes are answered 400 naming the rule and the field, a preview
//! equals Kiln's own totals, and what compaction exports shows on `/metrics`. (The
//! remote-write path to a real Prometheus is tests/rules.rs.)

use std::time::{Duration, Instant};

use kiln_node::ServerConfig;
use kiln_rules::rule::RuleSpec;

use crate::common::*;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
/// profefe-collector_cpu_1.prof's CPU total.
const PROFILE_NANOS: i64 = 9_640_000_000;

on_every_backend!(rules_are_per_tenant_file_rules_read_only_and_previews_match_totals);

fn with_rules(config: &mut ServerConfig) {
    eager_compaction(config);
    config.recording_rules = vec![serde_json::from_value::<RuleSpec>(serde_json::json!({
        "metric_name": "file_cpu",
        "profile_type": CPU,
        "matchers": "{service_name=\"checkout\"}",
        "group_by": ["service_name"],
    }))
    .unwrap()];
    config.rule_export.step_ms = 1_000;
    config.rule_export.delay_ms = 0;
    config.rule_export.poll_ms = 50;
    // A lone write is logged, and reaches compaction, and so the rules, with its segment:
    // sooner than the default 30 s, for a test of the export.
    config.wal_segment_interval_ms = 1_000;
}

fn send(
    server: &TestServer,
    method: &str,
    path: &str,
    body: &str,
    tenant: Option<&str>,
) -> (u16, String) {
    let mut request = TestServer::agent().request(method, &format!("{}{path}", server.url));
    if let Some(tenant) = tenant {
        request = request.set("X-Scope-OrgID", tenant);
    }
    match request.send_string(body) {
        Ok(response) => (response.status(), response.into_string().unwrap()),
        Err(ureq::Error::Status(status, response)) => (status, response.into_string().unwrap()),
        Err(err) => panic!("{method} {path}: {err}"),
    }
}

fn rules_are_per_tenant_file_rules_read_only_and_previews_match_totals(backend: Backend) {
    let server = TestServer::start_on(backend, with_rules);
    let rules = "/api/v1/recording-rules";
    let listed = server.json(rules, &[]);
    assert_eq!(listed["rules"][0]["metric_name"], "file_cpu");
    assert_eq!(listed["rules"][0]["source"], "file");

    // File rules are changed in the file only.
    let file_rule = serde_json::json!({"metric_name": "file_cpu", "profile_type": CPU});
    let (status, body) = send(
        &server,
        "PUT",
        &format!("{rules}/file_cpu"),
        &file_rule.to_string(),
        None,
    );
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("read-only"), "{body}");
    assert_eq!(
        send(&server, "DELETE", &format!("{rules}/file_cpu"), "", None).0,
        409
    );

    // A mistake names the rule and the field.
    let bad = serde_json::json!({"metric_name": "api_cpu", "profile_type": CPU, "matchers": "{service_name=}"});
    let (status, body) = send(&server, "POST", rules, &bad.to_string(), Some("team-a"));
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("recording rule \"api_cpu\": matchers:"),
        "{body}"
    );
    let (status, body) = send(
        &server,
        "POST",
        rules,
        "{\"metric_name\": 1}",
        Some("team-a"),
    );
    assert_eq!(status, 400, "{body}");

    // Create, refuse a second create, update, read, delete; all per tenant.
    let rule = serde_json::json!({"metric_name": "api_cpu", "profile_type": CPU,
        "matchers": "{service_name=\"checkout\"}"});
    let (status, body) = send(&server, "POST", rules, &rule.to_string(), Some("team-a"));
    assert_eq!(status, 201, "{body}");
    let (status, body) = send(&server, "POST", rules, &rule.to_string(), Some("team-a"));
    assert_eq!(status, 409, "{body}");
    let mut updated = rule.clone();
    updated["group_by"] = serde_json::json!(["env"]);
    let (status, body) = send(
        &server,
        "PUT",
        &format!("{rules}/api_cpu"),
        &updated.to_string(),
        Some("team-a"),
    );
    assert_eq!(status, 200, "{body}");
    let read = server.json(&format!("{rules}/api_cpu"), &[("X-Scope-OrgID", "team-a")]);
    assert_eq!(read["group_by"], serde_json::json!(["env"]));
    assert_eq!(read["source"], "api");
    assert_eq!(
        server.json(rules, &[("X-Scope-OrgID", "team-b")])["rules"],
        serde_json::json!([]),
        "another tenant sees none of team-a's rules"
    );
    assert_eq!(
        send(&server, "GET", &format!("{rules}/api_cpu"), "", None).0,
        404
    );
    // The first delete removes it; the second finds nothing.
    for expected in [204, 404] {
        let (status, body) = send(
            &server,
            "DELETE",
            &format!("{rules}/api_cpu"),
            "",
            Some("team-a"),
        );
        assert_eq!(status, expected, "{body}");
    }

    // Profiles of the last minutes: a preview sums them per step, as export will.
    let profile = fixture("profefe-collector_cpu_1.prof");
    let now_s = kiln_model::time::now_ms() / 1000;
    for offset in [-300, -200, -100] {
        let (status, body) = server.post(
            &format!(
                "/ingest?name=checkout.cpu&format=pprof&from={}",
                now_s + offset
            ),
            &profile,
        );
        assert_eq!(status, 200, "{body}");
    }
    let preview_rule = serde_json::json!({"metric_name": "preview_cpu", "profile_type": CPU,
        "matchers": "{service_name=\"checkout\"}", "group_by": ["service_name"]});
    let (status, body) = send(
        &server,
        "POST",
        &format!("{rules}/preview?from=now-1h"),
        &preview_rule.to_string(),
        None,
    );
    assert_eq!(status, 200, "{body}");
    let preview: serde_json::Value = serde_json::from_str(&body).unwrap();
    let series = preview["series"].as_array().unwrap();
    assert_eq!(series.len(), 1, "{preview}");
    assert_eq!(series[0]["labels"]["service_name"], "checkout");
    let points = series[0]["points"].as_array().unwrap();
    assert_eq!(points.len(), 3, "one step per profile: {preview}");
    let total: i64 = points.iter().map(|point| point[1].as_i64().unwrap()).sum();
    let render = server.json(
        &format!("/pyroscope/render?query={CPU}%7Bservice_name%3D%22checkout%22%7D&from=now-1h&until=now"),
        &[],
    );
    assert_eq!(render["flamebearer"]["numTicks"].as_i64(), Some(total));
    assert_eq!(total, 3 * PROFILE_NANOS);

    // The file rule counts live from its start: profiles stamped after it, compacted
    // here, reach /metrics (the local target) with their own step's time.
    let ahead = kiln_model::time::now_ms() / 1000 + 2;
    let (status, body) = server.post(
        &format!("/ingest?name=checkout.cpu&format=pprof&from={ahead}"),
        &profile,
    );
    assert_eq!(status, 200, "{body}");
    let expected = format!(
        "file_cpu{{tenant=\"anonymous\",service_name=\"checkout\"}} {PROFILE_NANOS} {ahead}.000"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let metrics = server.metrics();
        if metrics.contains(&expected) {
            assert!(
                metrics.contains("kiln_rules_samples_sent_total{target=\"metrics\"} 1"),
                "{metrics}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "no {expected} in {metrics}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A rule that fails its checks stops the server at start-up, naming rule and field.
#[test]
fn a_bad_file_rule_stops_startup_naming_the_rule_and_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("kiln.yaml");
    std::fs::write(
        &config,
        format!(
            "recording_rules:\n  - metric_name: checkout_cpu\n    profile_type: {CPU}\n    group_by: [__name__]\n"
        ),
    )
    .unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["server", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.path())
        .env("KILN_LOG_LEVEL", "error")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains(
            "recording rule \"checkout_cpu\": group_by: \"__name__\" is not a label name"
        ),
        "{stderr}"
    );
}

/// `kiln bench rules` runs and reports each case (the figures are docs/benchmarks.md's).
#[test]
fn the_rules_bench_reports_every_case() {
    let corpus = workspace_root().join("testdata");
    let output = run_kiln([
        "bench",
        "rules",
        "--corpus",
        corpus.to_str().unwrap(),
        "--services",
        "3",
        "--inputs",
        "3",
        "--jobs",
        "2",
    ]);
    for line in [
        "merge alone: ",
        "1 rule: ",
        "10 rules: ",
        "1 function rule (",
    ] {
        assert!(output.contains(line), "{output}");
    }
    assert!(output.contains("% of the merge"), "{output}");
}
