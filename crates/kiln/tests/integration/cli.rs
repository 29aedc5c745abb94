//! `kiln query` against a live server: every subcommand, its output checked against the
//! profiles that went in.

use std::process::Command;

use crate::common::*;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

fn kiln_query(server: &TestServer, args: &[&str]) -> String {
    run_kiln(["query", "--url", server.url.as_str()].iter().chain(args))
}

#[test]
fn every_query_subcommand_answers_from_the_server() {
    let server = TestServer::start();
    let profile = fixture("profefe-collector_cpu_1.prof");
    let total = pprof_total(&profile, 1);
    for (service, from) in [
        ("api", 1_700_000_000),
        ("api", 1_700_000_060),
        ("web", 1_700_000_000),
    ] {
        let (status, text) = server.post(
            &format!(
                "/ingest?name={service}&format=pprof&from={from}&until={}",
                from + 10
            ),
            &profile,
        );
        assert_eq!(status, 200, "{text}");
    }
    let query = format!(r#"{CPU}{{service_name="api"}}"#);
    let range = ["--from", "1699999990", "--to", "1700000100"];
    let selection: Vec<&str> = ["--query", query.as_str()]
        .into_iter()
        .chain(range)
        .collect();

    let folded = kiln_query(
        &server,
        &[
            &["flamegraph", "--format", "folded", "--max-nodes", "-1"][..],
            &selection,
        ]
        .concat(),
    );
    let folded_total: i64 = folded
        .lines()
        .map(|line| line.rsplit_once(' ').unwrap().1.parse::<i64>().unwrap())
        .sum();
    assert_eq!(folded_total, 2 * total);

    let svg = kiln_query(&server, &[&["flamegraph"][..], &selection].concat());
    assert!(svg.contains("<svg") && svg.contains("</svg>"), "not an SVG");

    let dir = tempfile::tempdir().unwrap();
    let pprof_path = dir.path().join("merged.pb.gz");
    let pprof_arg = pprof_path.to_string_lossy().into_owned();
    kiln_query(
        &server,
        &[
            &["flamegraph", "--format", "pprof", "--output", &pprof_arg][..],
            &selection,
        ]
        .concat(),
    );
    let merged = std::fs::read(&pprof_path).unwrap();
    assert_eq!(pprof_total(&merged, 0), 2 * total);
    if let Some(go) = go_binary() {
        let expected = go_function_totals(&go, &[&temp_file(dir.path(), "in.prof", &profile)], 1);
        let actual = go_function_totals(&go, &[&pprof_path], 0);
        for (name, (flat, cum)) in expected {
            assert_eq!(actual.get(&name), Some(&(2 * flat, 2 * cum)), "{name}");
        }
    } else {
        eprintln!("skipped: go tool pprof check of the CLI's pprof (go not installed)");
    }

    let top = kiln_query(
        &server,
        &[&["top", "--limit", "3"][..], &selection].concat(),
    );
    let rows: Vec<&str> = top.lines().collect();
    assert_eq!(rows.len(), 4, "{top}");
    assert!(rows[0].contains("self") && rows[0].contains("function"));

    let csv = kiln_query(
        &server,
        &[
            &["series", "--format", "csv", "--step", "60"][..],
            &selection,
        ]
        .concat(),
    );
    let values: Vec<f64> = csv
        .lines()
        .skip(1)
        .map(|line| line.rsplit_once(',').unwrap().1.parse().unwrap())
        .collect();
    assert_eq!(values.len(), 2, "{csv}");
    assert_eq!(values.iter().sum::<f64>() as i64, 2 * total);

    let web = format!(r#"{CPU}{{service_name="web"}}"#);
    let diff = kiln_query(
        &server,
        &[&["diff", "--right-query", web.as_str()][..], &selection].concat(),
    );
    assert!(
        diff.starts_with(&format!("left total {}, right total {total}", 2 * total)),
        "{diff}"
    );

    let labels = kiln_query(
        &server,
        &["labels", "--from", "1699999990", "--to", "1700000100"],
    );
    assert!(
        labels.lines().any(|line| line == "service_name"),
        "{labels}"
    );
    let values = kiln_query(
        &server,
        &[
            "labels",
            "--name",
            "service_name",
            "--from",
            "1699999990",
            "--to",
            "1700000100",
        ],
    );
    assert_eq!(values, "api\nweb\n");

    // A bad query fails with the server's message, and a non-zero exit.
    let output = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["query", "--url", &server.url, "top", "--query", "cpu:x{"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("HTTP 400"));
}

/// The benchmarks run end to end on the committed fixtures (their figures are for
/// docs/benchmarks.md; here only that they work and agree with themselves).
#[test]
fn the_benchmarks_run_on_the_fixtures() {
    let testdata = workspace_root().join("testdata");
    let corpus = testdata.to_string_lossy().into_owned();
    let run = |args: &[&str]| -> String {
        run_kiln(
            ["bench"]
                .iter()
                .chain(args)
                .chain(&["--corpus", corpus.as_str()]),
        )
    };
    let stages = run(&["stages", "--rounds", "1"]);
    assert!(stages.contains("all stages"), "{stages}");
    let query = run(&[
        "query",
        "--days",
        "1",
        "--instances",
        "2",
        "--interval",
        "600",
        "--skip-go",
    ]);
    let line = query
        .lines()
        .find(|line| line.starts_with("24 h flame graph total"))
        .unwrap_or_else(|| panic!("{query}"));
    // "24 h flame graph total T; series points sum to S (N series)"
    let numbers: Vec<i64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|part| part.parse().ok())
        .collect();
    assert!(numbers.len() >= 4, "{line}");
    assert!(numbers[1] > 0, "{line}");
    assert_eq!(numbers[1], numbers[2], "{line}");
    // The storage bench fails by itself when the totals differ; here it must also compact.
    for stream in ["cpu", "heap"] {
        let storage = run(&[
            "storage",
            "--stream",
            stream,
            "--hours",
            "1",
            "--instances",
            "2",
            "--interval",
            "120",
            "--clients",
            "4",
        ]);
        assert!(storage.contains(": equal"), "{storage}");
        assert!(storage.contains("efficiency"), "{storage}");
    }
    for protocol in ["pprof", "otlp"] {
        let ingest = run(&[
            "ingest",
            "--protocol",
            protocol,
            "--clients",
            "4",
            "--seconds",
            "2",
        ]);
        assert!(ingest.contains("errors            0"), "{ingest}");
        let profiles: f64 = ingest
            .lines()
            .find_map(|line| line.strip_prefix("profiles/s"))
            .and_then(|rate| rate.trim().parse().ok())
            .unwrap_or_else(|| panic!("{ingest}"));
        assert!(profiles > 0.0, "{ingest}");
    }
    let scrape = run(&["scrape", "--targets", "5", "--seconds", "3"]);
    assert!(scrape.contains("0 endpoints not up"), "{scrape}");
    assert!(scrape.contains("targets per core"), "{scrape}");
}
