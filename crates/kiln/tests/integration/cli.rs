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
    // A flush of one profile: as many datasets, and blocks, as files.
    let single = run(&[
        "stages",
        "--rounds",
        "1",
        "--profiles-per-dataset",
        "1",
        "--datasets-per-block",
        "1",
    ]);
    let files = single
        .split_once("kiln bench stages: ")
        .and_then(|(_, rest)| rest.split_once(" files"))
        .map(|(count, _)| count.to_string())
        .unwrap_or_else(|| panic!("{single}"));
    assert!(
        single.contains(&format!("({files} datasets per round, 1 per block)")),
        "{single}"
    );
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

/// The README's walk: `--from 0` is the epoch (data older than an hour is found), no
/// `--from` is the last hour, and a query that matches nothing says so on standard error
/// with exit status 3 instead of printing a bare header.
#[test]
fn from_zero_is_the_epoch_and_no_data_is_said() {
    let server = TestServer::start();
    let profile = fixture("profefe-collector_cpu_1.prof");
    let total = pprof_total(&profile, 1);
    // Recorded two hours ago: outside the default last hour, inside "since the epoch".
    let two_hours_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 7200;
    let (status, text) = server.post(
        &format!("/ingest?name=old&format=pprof&from={two_hours_ago}"),
        &profile,
    );
    assert_eq!(status, 200, "{text}");
    let query = format!(r#"{CPU}{{service_name="old"}}"#);

    let raw = kiln_query(
        &server,
        &[
            "top", "--raw", "--query", &query, "--from", "0", "--limit", "200",
        ],
    );
    let self_sum: i64 = raw
        .lines()
        .skip(1)
        .map(|line| {
            line.split_whitespace()
                .next()
                .unwrap()
                .parse::<i64>()
                .unwrap()
        })
        .sum();
    assert_eq!(self_sum, total, "{raw}");
    // Without --raw the values carry units: a CPU profile in seconds/milliseconds.
    let human = kiln_query(&server, &["top", "--query", &query, "--from", "0"]);
    let first = human.lines().nth(1).unwrap_or_default();
    assert!(
        [" s ", " ms ", " µs ", " ns "]
            .iter()
            .any(|unit| first.contains(unit)),
        "{human}"
    );
    // CSV names the one series after the selection, not "".
    let csv = kiln_query(
        &server,
        &[
            "series", "--format", "csv", "--query", &query, "--from", "0", "--step", "3600",
        ],
    );
    let row = csv.lines().nth(1).unwrap_or_else(|| panic!("{csv}"));
    assert!(row.starts_with(r#""{service_name=""old""}","#), "{csv}");
    let labels = kiln_query(
        &server,
        &["labels", "--name", "service_name", "--from", "0"],
    );
    assert_eq!(labels, "old\n");
    // The querier API agrees: a start of 0 is the epoch, not "an hour before the end".
    let request = kiln_query::api::SelectMergeStacktracesRequest {
        profile_type_id: CPU.to_string(),
        label_selector: r#"{service_name="old"}"#.to_string(),
        start: 0,
        end: 0,
        ..Default::default()
    };
    let response: kiln_query::api::SelectMergeStacktracesResponse =
        call(&server, "SelectMergeStacktraces", &request, None);
    assert_eq!(response.flamegraph.unwrap().total, total);

    // The default range is the last hour, which holds nothing here.
    for args in [
        &["top", "--query", query.as_str()][..],
        &["flamegraph", "--query", query.as_str()][..],
        &["flamegraph", "--format", "pprof", "--query", query.as_str()][..],
        &["series", "--query", query.as_str()][..],
        &["labels", "--name", "service_name"][..],
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["query", "--url", &server.url])
            .args(args)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(3), "{args:?}");
        assert!(output.stdout.is_empty(), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("no data for"), "{args:?}: {stderr}");
        assert!(stderr.contains("now-1h"), "{args:?}: {stderr}");
    }
}

/// Logs written to a file or a pipe carry no colour codes.
#[test]
fn logs_to_a_file_have_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let log = std::fs::File::create(dir.path().join("kiln.log")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .env("KILN_LOG_LEVEL", "info")
        .stderr(log)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let path = dir.path().join("kiln.log");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut text = String::new();
    while std::time::Instant::now() < deadline {
        text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.contains("listening") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(text.contains("listening"), "{text}");
    assert!(!text.contains('\u{1b}'), "ANSI escape in the log: {text:?}");
}
