use crate::common::*;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

fn render(server: &TestServer, query: &str, headers: &[(&str, &str)]) -> serde_json::Value {
    let query: String = url_escape(query);
    server.json(
        &format!("/pyroscope/render?query={query}&from=0&until=now%2B1h"),
        headers,
    )
}

pub fn url_escape(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~:".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Frame names of a flamebearer response.
pub fn names(result: &serde_json::Value) -> Vec<String> {
    result["flamebearer"]["names"]
        .as_array()
        .map(|names| {
            names
                .iter()
                .filter_map(|n| n.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

pub fn ticks(value: &serde_json::Value) -> i64 {
    value["flamebearer"]["numTicks"].as_i64().unwrap_or(-1)
}

#[test]
fn folded_stacks_and_flamebearer_layout() {
    let server = TestServer::start();
    let body = b"main (app.py:1);eval (file.py:11) 30\nmain (app.py:1);idle 10\n";
    let (status, text) = server.post("/ingest?name=pyapp.cpu{env=prod}&sampleRate=100&spyName=pyspy&from=1700000000&until=1700000010", body);
    assert_eq!(status, 200, "{text}");
    let result = render(&server, &format!("{CPU}{{service_name=\"pyapp\"}}"), &[]);
    // 40 samples at 100 Hz: 400 ms of CPU.
    assert_eq!(ticks(&result), 400_000_000);
    let names = names(&result);
    assert!(names.iter().any(|n| n == "eval (file.py:11)"), "{names:?}");
    let levels = result["flamebearer"]["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 3);
    assert_eq!(levels[1].as_array().unwrap()[1], 400_000_000);
    assert_eq!(result["metadata"]["name"], CPU);
    assert_eq!(
        result["timeline"]["samples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .sum::<i64>(),
        400_000_000
    );
    // The legacy app-name query form selects the same data; other labels filter.
    assert_eq!(ticks(&render(&server, "pyapp.cpu{}", &[])), 400_000_000);
    assert_eq!(
        ticks(&render(
            &server,
            "pyapp.cpu{env=\"prod\", pyroscope_spy=\"pyspy\"}",
            &[]
        )),
        400_000_000
    );
    assert_eq!(ticks(&render(&server, "pyapp.cpu{env!=\"prod\"}", &[])), 0);
    assert_eq!(
        ticks(&render(&server, "pyapp.cpu{env=~\"pr.*\"}", &[])),
        400_000_000
    );
    // A syntax error is a 400 naming the position.
    let (status, text) = server.get(&format!(
        "/pyroscope/render?query={}",
        url_escape("pyapp.cpu{env=\"prod\" x}")
    ));
    assert_eq!(status, 400);
    assert!(text.contains("position 21"), "{text}");
}

#[test]
fn max_nodes_keeps_totals_with_an_other_node() {
    let server = TestServer::start();
    let mut body = String::new();
    for i in 0..50 {
        body.push_str(&format!("main;f{i} {}\n", i + 1));
    }
    body.push_str("main;big 10000\n");
    assert_eq!(server.post("/ingest?name=many.cpu", body.as_bytes()).0, 200);
    let query = url_escape(&format!("{CPU}{{service_name=\"many\"}}"));
    let result = server.json(
        &format!("/pyroscope/render?query={query}&from=0&until=now&max-nodes=5"),
        &[],
    );
    let names = names(&result);
    assert!(
        names.iter().any(|n| n == "big") && names.iter().any(|n| n == "other"),
        "{names:?}"
    );
    assert!(!names.iter().any(|n| n == "f0"));
    let full = server.json(
        &format!("/pyroscope/render?query={query}&from=0&until=now"),
        &[],
    );
    assert_eq!(ticks(&result), ticks(&full));
}

#[test]
fn node_style_gzip_body_without_header_and_types_from_the_profile() {
    let Some(wall) = corpus("pyro-nodejs-wall.pb.gz") else {
        return;
    };
    let Some(heap) = corpus("pyro-nodejs-heap.pb.gz") else {
        return;
    };
    let server = TestServer::start();
    for body in [&wall, &heap] {
        let (status, text) = server.post(
            "/ingest?name=nodeapp{region=eu}&format=pprof&spyName=nodespy",
            body,
        );
        assert_eq!(status, 200, "{text}");
    }
    // Wall profile: samples/count and wall/microseconds, both under the "wall" name.
    let wall_profile = kiln_model::pprof::decode(&wall, 1 << 30).unwrap();
    let period = wall_profile.period_type.unwrap();
    let (pt, pu) = (
        wall_profile.string_or_empty(period.r#type),
        wall_profile.string_or_empty(period.unit),
    );
    let wall_type = format!("wall:wall:microseconds:{pt}:{pu}");
    assert_eq!(
        ticks(&render(
            &server,
            &format!("{wall_type}{{service_name=\"nodeapp\"}}"),
            &[]
        )),
        pprof_total(&wall, 1)
    );
    // Node's heap profile has period type inuse_space/bytes, and the id says so.
    let heap_type = "memory:inuse_space:bytes:inuse_space:bytes";
    assert_eq!(
        ticks(&render(
            &server,
            &format!("{heap_type}{{service_name=\"nodeapp\", region=\"eu\"}}"),
            &[]
        )),
        pprof_total(&heap, 1)
    );
}

#[test]
fn rust_style_content_encoding_and_sample_labels_become_series_labels() {
    let server = TestServer::start();
    let raw =
        kiln_model::compress::gunzip_bounded(&fixture("parca-profile-with-labels.pb.gz"), 1 << 30)
            .unwrap();
    let (status, text) = server.post_with(
        "/ingest?name=rustapp&format=pprof",
        &gzip(&raw),
        &[("Content-Encoding", "gzip")],
    );
    assert_eq!(status, 200, "{text}");
    let profile = kiln_model::pprof::decode(&raw, 1 << 30).unwrap();
    let total: i64 = profile.sample.iter().map(|s| s.value[0]).sum();
    let type_id = "process_cpu:samples:count:cpu:nanoseconds";
    assert_eq!(
        ticks(&render(
            &server,
            &format!("{type_id}{{service_name=\"rustapp\"}}"),
            &[]
        )),
        total
    );
    // Per label value, the server's totals equal the sums over the samples carrying it.
    let label = profile
        .sample
        .iter()
        .flat_map(|s| s.label.iter())
        .find(|l| l.str != 0)
        .expect("a string label");
    let key = profile.string_or_empty(label.key);
    let mut by_value: std::collections::BTreeMap<String, i64> = Default::default();
    for sample in profile.sample.iter() {
        let value = sample
            .label
            .iter()
            .find(|l| l.key == label.key)
            .map(|l| profile.string_or_empty(l.str))
            .unwrap_or_default();
        *by_value.entry(value).or_default() += sample.value[0];
    }
    assert!(
        by_value.len() > 1,
        "the fixture has several values of {key}"
    );
    let key = kiln_model::labels::sanitize_label_name(&key);
    for (value, expected) in by_value {
        let result = render(
            &server,
            &format!("{type_id}{{service_name=\"rustapp\", {key}=\"{value}\"}}"),
            &[],
        );
        assert_eq!(ticks(&result), expected, "{key}={value}");
    }
}

fn multipart(parts: &[(&str, &[u8])]) -> (String, Vec<u8>) {
    let boundary = "kilnboundary1234";
    let mut body = Vec::new();
    for (name, data) in parts {
        body.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n").as_bytes());
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

#[test]
fn go_style_multipart_with_nanosecond_times() {
    let server = TestServer::start();
    let cpu = fixture("profefe-collector_cpu_1.prof");
    let config = br#"{"cpu":{"units":"samples","sampled":true}}"#;
    let (content_type, body) = multipart(&[("profile", &cpu), ("sample_type_config", config)]);
    let from = 1_700_000_000_000_000_000i64;
    let path = format!(
        "/ingest?name=goapp.cpu{{version=1.2}}&format=pprof&spyName=gospy&from={from}&until={}",
        from + 10_000_000_000
    );
    let (status, text) = server.post_with(&path, &body, &[("Content-Type", &content_type)]);
    assert_eq!(status, 200, "{text}");
    let query = url_escape(&format!("{CPU}{{service_name=\"goapp\", version=\"1.2\"}}"));
    let result = server.json(
        &format!("/pyroscope/render?query={query}&from=1699999990&until=1700000020"),
        &[],
    );
    assert_eq!(ticks(&result), pprof_total(&cpu, 1));
    // Outside the from..until window the profile is not counted.
    let outside = server.json(
        &format!("/pyroscope/render?query={query}&from=1700000100&until=1700000200"),
        &[],
    );
    assert_eq!(ticks(&outside), 0);

    let (content_type, body) = multipart(&[("profile", &cpu), ("prev_profile", &cpu)]);
    let (status, text) = server.post_with(
        "/ingest?name=goapp.cpu&format=pprof",
        &body,
        &[("Content-Type", &content_type)],
    );
    assert_eq!(status, 400);
    assert!(text.contains("prev_profile"), "{text}");
    let (content_type, body) = multipart(&[("other", b"x")]);
    let (status, _) = server.post_with(
        "/ingest?name=goapp.cpu&format=pprof",
        &body,
        &[("Content-Type", &content_type)],
    );
    assert_eq!(status, 400);
}

#[test]
fn unsupported_and_malformed_input_is_refused_with_a_message() {
    let server = TestServer::start();
    for (format, expected, message) in [
        ("speedscope", 400, "no profiles"),
        ("jfr", 400, "FLR magic"),
        ("perf_script", 400, "not a sample header"),
        ("trie", 415, "unknown format"),
    ] {
        let (status, text) = server.post(&format!("/ingest?name=x&format={format}"), b"{}");
        assert_eq!(status, expected, "{format}: {text}");
        assert!(text.contains(message), "{format}: {text}");
    }
    let cases: [(&str, Vec<u8>); 5] = [
        ("legacy", fixture("pprof-cppbench.cpu")),
        ("heapz", fixture("pprof-fuzz-heapz-malformed.txt")),
        ("garbage", b"\x0a\x0b\x0c not a profile".to_vec()),
        (
            "truncated",
            fixture("profefe-collector_cpu_1.prof")[..1000].to_vec(),
        ),
        ("bad-gzip", vec![0x1f, 0x8b, 8, 0, 1, 2, 3]),
    ];
    for (name, body) in cases {
        let (status, text) = server.post("/ingest?name=bad&format=pprof", &body);
        assert_eq!(status, 400, "{name}: {text}");
    }
    let (status, _) = server.post(
        "/ingest?format=pprof",
        &fixture("profefe-collector_cpu_1.prof"),
    );
    assert_eq!(status, 400, "name is required");
    let (status, text) = server.post("/ingest?name=x", b"a;b notanumber\n");
    assert_eq!(status, 400);
    assert!(text.contains("line 1"), "{text}");
    // Nothing of the refused requests is visible.
    let services = server.json("/api/0/services", &[]);
    assert_eq!(services["body"], serde_json::json!([]));
    let metrics = server.metrics();
    assert!(
        metrics.contains("kiln_ingest_rejected_total{endpoint=\"ingest\",reason=\"malformed\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("reason=\"unsupported_format\""));
}
