//! OTLP profiles from an independent implementation: `tests/otlp/otlp_client.py` builds
//! the request with the official `opentelemetry-proto` package and sends it over gRPC
//! (`grpcio`) and OTLP/HTTP (protobuf, gzip; JSON). Each transport's data is read back:
//! flame graph, labels, span links, sample times, and the partial success of a request
//! holding one bad profile.

use std::process::Command;

use serde_json::{json, Value};

use crate::common::*;
use crate::pyroscope::{names, ticks, url_escape};

const TYPE: &str = "process_cpu:samples:count:cpu:nanoseconds";

pub(crate) fn has_python_otlp() -> bool {
    Command::new("python3")
        .args([
            "-c",
            "import grpc, opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2_grpc",
        ])
        .output()
        .is_ok_and(|output| output.status.success())
}

fn send(server: &TestServer, transport: &str, service: &str) -> Value {
    let address = server.url.trim_start_matches("http://");
    let script = workspace_root().join("tests/otlp/otlp_client.py");
    let output = Command::new("python3")
        .arg(&script)
        .args([address, transport, service])
        .output()
        .expect("python3 runs");
    assert!(
        output.status.success(),
        "{transport}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the client prints JSON")
}

fn connect(server: &TestServer, method: &str, request: Value) -> Value {
    let (status, text) = server.post_with(
        &format!("/querier.v1.QuerierService/{method}"),
        request.to_string().as_bytes(),
        &[("Content-Type", "application/json")],
    );
    assert_eq!(status, 200, "{method}: {text}");
    serde_json::from_str(&text).expect("JSON answer")
}

#[test]
fn otlp_profiles_over_grpc_and_http_read_back_whole() {
    if !has_python_otlp() {
        eprintln!("skipped: Python opentelemetry-proto and grpcio are not installed (scripts/test.sh installs them)");
        return;
    }
    let server = TestServer::start();
    let now_ms = kiln_model::time::now_nanos() / 1_000_000;
    let (start, end) = (now_ms - 600_000, now_ms + 60_000);
    for transport in ["grpc", "http-protobuf", "http-json"] {
        let service = format!("otlp-{transport}");
        let response = send(&server, transport, &service);
        // One of the two profiles refers past the stack table: refused alone.
        let partial = &response["partialSuccess"];
        assert_eq!(
            partial["rejectedProfiles"],
            json!("1"),
            "{transport}: {response}"
        );
        let message = partial["errorMessage"].as_str().unwrap_or_default();
        assert!(message.contains("stack index 99"), "{transport}: {message}");

        let render = server.json(
            &format!(
                "/pyroscope/render?query={}&from=now-10m&until=now%2B1m",
                url_escape(&format!(r#"{TYPE}{{service_name="{service}"}}"#))
            ),
            &[],
        );
        // 10 + 20 + 30 timestamped hot-loop samples and 5 in the shared library.
        assert_eq!(ticks(&render), 65, "{transport}: {render}");
        let names = names(&render);
        for expected in ["main", "handle_request", "kiln_otlp_hot_loop"] {
            assert!(
                names.iter().any(|n| n == expected),
                "{transport}: {names:?}"
            );
        }
        // The unsymbolized frame: module + file offset (0x2345 into the mapping + 0x1000).
        assert!(
            names.iter().any(|n| n == "libkilnfoo.so+0x3345"),
            "{transport}: {names:?}"
        );

        // Resource and scope attributes are series labels (dots kept, as Pyroscope keeps
        // them); sample attributes stay with their samples.
        let selector = format!(r#"{{service_name="{service}"}}"#);
        let label_names = connect(
            &server,
            "LabelNames",
            json!({"matchers": [selector], "start": start.to_string(), "end": end.to_string()}),
        );
        let label_names: Vec<&str> = label_names["names"]
            .as_array()
            .map(|names| names.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        for expected in ["host.name", "process.pid", "scope.kind", "service_name"] {
            assert!(
                label_names.contains(&expected),
                "{transport}: {label_names:?}"
            );
        }
        assert!(!label_names.contains(&"thread.name"), "{label_names:?}");
        let hosts = connect(
            &server,
            "LabelValues",
            json!({"name": "host.name", "matchers": [selector], "start": start.to_string(), "end": end.to_string()}),
        );
        assert_eq!(hosts["names"], json!(["kiln-otlp-host"]), "{transport}");

        // The link's span id selects exactly the linked samples.
        let span = connect(
            &server,
            "SelectMergeSpanProfile",
            json!({
                "profileTypeID": TYPE,
                "labelSelector": selector,
                "spanSelector": ["0102030405060708"],
                "start": start.to_string(),
                "end": end.to_string(),
            }),
        );
        assert_eq!(
            span["flamegraph"]["total"],
            json!("60"),
            "{transport}: {span}"
        );

        // Sample timestamps place values in their own seconds: 10 + 20 in one, 30 in the
        // next; the 5 untimed samples sit at the profile's time (the first second).
        let series = connect(
            &server,
            "SelectSeries",
            json!({
                "profileTypeID": TYPE,
                "labelSelector": selector,
                "start": start.to_string(),
                "end": end.to_string(),
                "step": 1.0,
            }),
        );
        let points: Vec<f64> = series["series"][0]["points"]
            .as_array()
            .map(|points| points.iter().filter_map(|p| p["value"].as_f64()).collect())
            .unwrap_or_default();
        assert_eq!(points, vec![35.0, 30.0], "{transport}: {series}");
    }
}

#[test]
fn otlp_requests_that_are_not_v1development_get_clear_errors() {
    let server = TestServer::start();
    // Field 3 of a profile is fixed64 today; the older drafts put a message there.
    let old_draft = [0x0a, 0x06, 0x12, 0x04, 0x12, 0x02, 0x1a, 0x00];
    let (status, body) = server.post_bytes(
        "/v1development/profiles",
        &old_draft,
        &[("Content-Type", "application/x-protobuf")],
    );
    assert_eq!(status, 400);
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("v1.10.0"), "{text}");
    let (status, text) = server.post_with(
        "/v1development/profiles",
        br#"{"resourceProfiles": 3}"#,
        &[("Content-Type", "application/json")],
    );
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("invalid OTLP profiles JSON"), "{text}");
    let (status, text) = server.post_with(
        "/v1development/profiles",
        b"hello",
        &[("Content-Type", "text/plain")],
    );
    assert_eq!(status, 415, "{text}");
    // An empty request is a success with nothing to store.
    let (status, text) = server.post_with(
        "/v1development/profiles",
        b"{}",
        &[("Content-Type", "application/json")],
    );
    assert_eq!((status, text.trim()), (200, "{}"));
}

/// Real profiles sent both ways (pprof to `/ingest`, the same profile as OTLP) store the
/// same flame graph for every sample type: every frame and every value.
#[test]
fn real_profiles_as_otlp_store_what_their_pprof_stores() {
    let server = TestServer::start();
    let fixtures = [
        "pprof-report-sample.cpu.pb.gz",
        "parca-alloc_objects.pb.gz",
        "parca-profile-with-labels.pb.gz",
        "profefe-collector_heap_1.prof",
    ];
    let now = kiln_model::time::now_nanos();
    for (index, name) in fixtures.iter().enumerate() {
        let bytes = fixture(name);
        let profile = kiln_model::pprof::decode(&bytes, 64 << 20).expect("fixture decodes");
        let (pprof_service, otlp_service) = (format!("pprof-{index}"), format!("otlp-{index}"));
        let (status, text) = server.post(
            &format!(
                "/ingest?name={pprof_service}&format=pprof&from={}",
                now / 1_000_000_000
            ),
            &bytes,
        );
        assert_eq!(status, 200, "{name}: {text}");
        let request = kiln_ingest::otlp::request_from_pprof(
            &profile,
            &[("service.name", &otlp_service)],
            now as u64,
        );
        let (status, body) = server.post_bytes(
            "/v1development/profiles",
            &gzip(&prost::Message::encode_to_vec(&request)),
            &[
                ("Content-Type", "application/x-protobuf"),
                ("Content-Encoding", "gzip"),
            ],
        );
        assert_eq!(status, 200, "{name}: {}", String::from_utf8_lossy(&body));

        let types = connect(
            &server,
            "ProfileTypes",
            json!({"start": ((now / 1_000_000) - 600_000).to_string(), "end": ((now / 1_000_000) + 600_000).to_string()}),
        );
        let type_ids: Vec<String> = types["profileTypes"]
            .as_array()
            .map(|types| {
                types
                    .iter()
                    .filter_map(|t| t["ID"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        assert!(!type_ids.is_empty(), "{types}");
        let mut compared = 0;
        for type_id in &type_ids {
            let render = |service: &str| {
                server.json(
                    &format!(
                        "/pyroscope/render?query={}&from=now-10m&until=now%2B1m&max-nodes=0",
                        url_escape(&format!(r#"{type_id}{{service_name="{service}"}}"#))
                    ),
                    &[],
                )
            };
            let (via_pprof, via_otlp) = (render(&pprof_service), render(&otlp_service));
            if ticks(&via_pprof) <= 0 {
                continue; // a type of another fixture
            }
            compared += 1;
            assert_eq!(ticks(&via_otlp), ticks(&via_pprof), "{name} {type_id}");
            let mut pprof_names = names(&via_pprof);
            let mut otlp_names = names(&via_otlp);
            pprof_names.sort();
            otlp_names.sort();
            assert_eq!(otlp_names, pprof_names, "{name} {type_id}");
            assert_eq!(
                via_otlp["flamebearer"]["maxSelf"], via_pprof["flamebearer"]["maxSelf"],
                "{name} {type_id}"
            );
        }
        assert_eq!(compared, profile.sample_type.len(), "{name}: {type_ids:?}");
    }
}
