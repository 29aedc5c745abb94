//! The MCP server, driven by the official MCP Python SDK (tests/mcp/client.py): over
//! stdio against `kiln mcp`, and over Streamable HTTP against a server's `/mcp`. Each
//! tool is called on a planted regression (insight's data) and on a real profile of the
//! shared corpus, and its figures are checked against its HTTP API twin.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::auth::{auth_config, OPS_B, READER_A};
use crate::common::*;
use crate::insight::{push, webhook, with_watcher};
use kiln_node::ServerConfig;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
const TOOLS: [&str; 10] = [
    "list_services",
    "list_profile_types",
    "list_labels",
    "top_functions",
    "flame_graph",
    "compare",
    "list_regressions",
    "source_lines",
    "series",
    "get_profile",
];
/// The default budget of an answer, in tokens of 4 characters.
const BUDGET_TOKENS: usize = 2000;

fn sdk_installed() -> bool {
    let found = Command::new("python3")
        .args(["-c", "import mcp.client.streamable_http"])
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        println!("skipped: the MCP tests (the mcp Python SDK is not installed; scripts/test.sh installs it)");
    }
    found
}

/// Runs tests/mcp/client.py with `args` and the calls on its standard input.
fn client(args: &[&str], calls: &Value) -> (bool, Value) {
    let mut child = Command::new("python3")
        .arg(workspace_root().join("tests/mcp/client.py"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(calls.to_string().as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let value = serde_json::from_str(stdout.trim()).unwrap_or_else(|err| {
        panic!(
            "client output is not JSON ({err}): {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output.status.success(), value)
}

/// The text of the call named `name` (the `index`th of that name).
fn answer<'a>(result: &'a Value, name: &str, index: usize) -> (&'a str, bool) {
    let call = result["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["name"] == name)
        .nth(index)
        .unwrap_or_else(|| panic!("no call {name} #{index}: {result}"));
    (call["text"].as_str().unwrap(), call["isError"] == true)
}

/// The row of a `|` table whose second cell is `key`.
fn row<'a>(text: &'a str, column: usize, key: &str) -> Vec<&'a str> {
    text.lines()
        .map(|line| line.split(" | ").collect::<Vec<_>>())
        .find(|cells| cells.get(column) == Some(&key))
        .unwrap_or_else(|| panic!("no row with {key:?} in column {column}:\n{text}"))
}

fn percent(part: f64, whole: f64) -> String {
    format!("{:.2} %", 100.0 * part / whole)
}

/// Every tool over stdio, on a planted regression and on a real Go CPU profile, against
/// its API twin; an unknown service's error names the one meant; every answer within
/// its budget.
#[test]
fn every_tool_answers_over_stdio_as_its_api_twin_does() {
    if !sdk_installed() {
        return;
    }
    let (hook, _) = webhook();
    let server = TestServer::start_with(with_watcher(hook));
    let now_s = kiln_model::time::now_ms() / 1000;
    let (v1_start, v2_start) = (now_s - 1800, now_s - 1500);
    push(&server, "anonymous", "1.0", v1_start, false);
    push(&server, "anonymous", "1.1", v2_start, true);
    let corpus = corpus("pprof-large.cpu.pb.gz");
    if let Some(profile) = &corpus {
        let (status, text) = server.post_bytes(
            &format!(
                "/ingest?name=gocorpus&format=pprof&from={}&until={}",
                now_s - 600,
                now_s - 590
            ),
            profile,
            &[("Content-Type", "application/octet-stream")],
        );
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&text));
    } else {
        println!("skipped: the corpus half of the MCP test (no ../shared/corpus)");
    }
    // The watcher's finding, for list_regressions.
    let deadline = Instant::now() + Duration::from_secs(60);
    let findings = loop {
        let listed = server.json("/api/v1/regressions?since=now-1h", &[]);
        let findings = listed["regressions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if !findings.is_empty() || Instant::now() > deadline {
            break findings;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    assert!(!findings.is_empty(), "the watcher found nothing");

    let (from_ms, until_ms) = ((now_s - 3600) * 1000, (now_s + 60) * 1000);
    let range = json!({ "from": from_ms.to_string(), "until": until_ms.to_string() });
    let with = |extra: Value| {
        let mut args = range.clone();
        args.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        args
    };
    let side = |version: &str, start: i64, until: i64| json!({ "selector": format!("{{version=\"{version}\"}}"), "from": (start * 1000).to_string(), "until": (until * 1000).to_string() });
    let mut calls = vec![
        json!({ "name": "list_services", "arguments": range }),
        json!({ "name": "list_profile_types", "arguments": with(json!({ "service": "checkout" })) }),
        json!({ "name": "list_labels", "arguments": with(json!({ "service": "checkout", "name": "version" })) }),
        json!({ "name": "top_functions", "arguments": with(json!({ "service": "checkout" })) }),
        json!({ "name": "flame_graph", "arguments": with(json!({ "service": "checkout" })) }),
        json!({ "name": "compare", "arguments": { "service": "checkout",
            "left": side("1.0", v1_start, v2_start), "right": side("1.1", v2_start, now_s + 60) } }),
        json!({ "name": "list_regressions", "arguments": { "service": "checkout", "since": "now-1h" } }),
        json!({ "name": "source_lines", "arguments": with(json!({ "service": "checkout", "function": "parse" })) }),
        json!({ "name": "series", "arguments": with(json!({ "service": "checkout", "points": 12 })) }),
        json!({ "name": "get_profile", "arguments": with(json!({ "service": "checkout" })) }),
        json!({ "name": "top_functions", "arguments": with(json!({ "service": "chekout" })) }),
        json!({ "name": "flame_graph", "arguments": with(json!({ "service": "checkout", "focus": "handle" })) }),
        json!({ "prompt": "investigate_cpu_regression", "arguments": { "service": "checkout" } }),
    ];
    if corpus.is_some() {
        calls.push(json!({ "name": "top_functions", "arguments": { "service": "gocorpus", "from": "0", "until": "now" } }));
        calls.push(json!({ "name": "flame_graph", "arguments": { "service": "gocorpus", "from": "0", "until": "now" } }));
        calls.push(json!({ "name": "top_functions", "arguments": { "service": "gocorpus", "from": "0", "until": "now", "limit": 300 } }));
    }
    let binary = env!("CARGO_BIN_EXE_kiln");
    let (ok, result) = client(&["stdio", binary, &server.url], &Value::Array(calls));
    assert!(ok, "{result}");
    assert_eq!(result["server"], "kiln");
    assert_eq!(result["protocolVersion"], "2025-06-18", "{result}");

    // The tools, with exactly these names, each with a schema a model can follow.
    let tools = result["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, TOOLS);
    for tool in tools {
        assert!(tool["description"].as_str().unwrap().len() > 60, "{tool}");
        let schema = &tool["inputSchema"];
        assert_eq!(schema["type"], "object", "{tool}");
        for (key, property) in schema["properties"].as_object().unwrap() {
            assert!(
                property["description"]
                    .as_str()
                    .is_some_and(|d| d.len() > 10),
                "{}: {key} has no description",
                tool["name"]
            );
        }
    }
    assert_eq!(
        result["prompts"],
        json!(["investigate_cpu_regression", "explain_service_cpu"])
    );

    // Every answer within the budget, and with a link into the UI.
    for call in result["calls"].as_array().unwrap() {
        let text = call["text"].as_str().unwrap();
        let tokens = text.chars().count().div_ceil(4);
        println!("{} {}: {tokens} tokens", call["name"], call["arguments"]);
        let widened = call["arguments"]["limit"] == 300;
        assert!(
            widened || tokens <= BUDGET_TOKENS,
            "{tokens} tokens: {text}"
        );
        if call["isError"] == false && call.get("prompt").is_none() {
            assert!(text.contains(&format!("ui: {}/", server.url)), "{text}");
        }
    }

    let headers = [("Content-Type", "application/json")];
    // list_services: checkout's profiles as the overview API counts them.
    let overview = server.json(
        &format!("/api/v1/overview?from={from_ms}&until={until_ms}&points=1"),
        &[],
    );
    let checkout = overview["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["service"] == "checkout")
        .unwrap();
    let (text, error) = answer(&result, "list_services", 0);
    assert!(!error, "{text}");
    let cells = row(text, 0, "checkout");
    assert_eq!(cells[5], checkout["profiles"].to_string(), "{text}");
    assert_eq!(cells[6], "cpu", "{text}");

    // list_profile_types and list_labels.
    let (text, _) = answer(&result, "list_profile_types", 0);
    assert!(row(text, 0, CPU)[3] == "1", "{text}");
    let (text, _) = answer(&result, "list_labels", 0);
    assert_eq!(row(text, 0, "1.0")[1], "1", "{text}");
    assert_eq!(row(text, 0, "1.1")[1], "1", "{text}");

    // top_functions: shares of the API's merged tree.
    let merge = |service: &str, from: &str, until: &str| {
        api_json(
            &server,
            "/querier.v1.QuerierService/SelectMergeStacktraces",
            json!({ "profileTypeID": CPU, "labelSelector": format!("{{service_name=\"{service}\"}}"),
                     "start": from, "end": until, "maxNodes": "-1" }),
        )
    };
    let checkout_tree = merge("checkout", &from_ms.to_string(), &until_ms.to_string());
    let total = num(&checkout_tree["flamegraph"]["levels"][0]["values"][1]);
    let functions = flamegraph_functions(&checkout_tree["flamegraph"]);
    let (text, _) = answer(&result, "top_functions", 0);
    let parse_self = functions["parse"].0 as f64;
    let cells = row(text, 1, "parse");
    assert_eq!(cells[0], "1", "parse is the top function: {text}");
    assert_eq!(cells[3], percent(parse_self, total), "{text}");
    assert_eq!(row(text, 1, "main")[5], "100.00 %", "{text}");

    // flame_graph: the root's lines add up to the whole.
    let (text, _) = answer(&result, "flame_graph", 0);
    assert!(text.contains("100.00 % total → main"), "{text}");
    let top_level: f64 = text
        .lines()
        .filter(|line| line.starts_with("  ") && !line.starts_with("   "))
        .map(|line| {
            line.trim()
                .split(" %")
                .next()
                .unwrap()
                .parse::<f64>()
                .unwrap()
        })
        .sum();
    assert!((top_level - 100.0).abs() < 0.05, "{top_level}: {text}");

    // compare: the API's own ranking.
    let body = json!({
        "profile_type": CPU,
        "left": { "selector": "{service_name=\"checkout\", version=\"1.0\"}", "from": v1_start * 1000, "until": v2_start * 1000 },
        "right": { "selector": "{service_name=\"checkout\", version=\"1.1\"}", "from": v2_start * 1000, "until": (now_s + 60) * 1000 },
        "limit": 0,
    });
    let (status, api) = server.post_with("/api/v1/compare", body.to_string().as_bytes(), &headers);
    assert_eq!(status, 200, "{api}");
    let api: Value = serde_json::from_str(&api).unwrap();
    let top = &api["functions"][0];
    let (text, _) = answer(&result, "compare", 0);
    let cells = row(text, 1, "slow_path");
    assert_eq!(cells[0], "1", "{text}");
    assert_eq!(
        cells[4],
        format!("{:+.2}", 100.0 * top["delta_share"].as_f64().unwrap()),
        "{text}"
    );
    assert_eq!(
        cells[5],
        format!("{:.2e}", top["p_adjusted"].as_f64().unwrap()),
        "{text}"
    );
    assert_eq!(cells[6], "yes", "{text}");
    assert!(
        text.contains(&format!(
            "{} of {} functions changed significantly",
            api["significant"], api["method"]["tested"]
        )),
        "{text}"
    );

    // list_regressions: the watcher's findings.
    let (text, _) = answer(&result, "list_regressions", 0);
    let increase = findings.iter().find(|f| f["change"] == "increase").unwrap();
    let cells = row(text, 4, increase["function"].as_str().unwrap());
    assert!(cells[3].ends_with("1.0 → 1.1"), "{text}");
    assert_eq!(
        cells[7],
        format!("{:+.2}", 100.0 * increase["delta_share"].as_f64().unwrap()),
        "{text}"
    );

    // source_lines: the function's total as the lines API gives it.
    let lines = api_json(
        &server,
        "/api/v1/lines",
        json!({ "profile_type": CPU, "selector": "{service_name=\"checkout\"}", "from": from_ms, "until": until_ms, "function": "parse" }),
    );
    let (text, error) = answer(&result, "source_lines", 0);
    assert!(!error, "{text}");
    let share = percent(
        lines["total_value"].as_f64().unwrap(),
        lines["total"].as_f64().unwrap(),
    );
    assert!(text.contains(&format!("({share}), on")), "{share}: {text}");

    // series: the maximum step as SelectSeries gives it.
    let (text, _) = answer(&result, "series", 0);
    assert!(
        text.contains("points") && text.contains("largest change point"),
        "{text}"
    );
    let steps = text
        .lines()
        .filter(|l| l.starts_with("20") && l.contains(" | "))
        .count();
    assert_eq!(steps, 12, "{text}");

    // get_profile: the largest exemplar of the range.
    let series = api_json(
        &server,
        "/querier.v1.QuerierService/SelectSeries",
        json!({ "profileTypeID": CPU, "labelSelector": "{service_name=\"checkout\"}", "start": from_ms.to_string(),
                 "end": until_ms.to_string(), "step": (until_ms - from_ms) as f64 / 1000.0, "exemplarType": "EXEMPLAR_TYPE_INDIVIDUAL" }),
    );
    let largest = series["series"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["points"].as_array().unwrap())
        .flat_map(|p| p["exemplars"].as_array().cloned().unwrap_or_default())
        .max_by(|a, b| {
            let v = |e: &Value| e["value"].as_str().unwrap().parse::<f64>().unwrap();
            v(a).total_cmp(&v(b))
        })
        .unwrap();
    let (text, _) = answer(&result, "get_profile", 0);
    assert!(
        text.starts_with(&format!(
            "profile {} ",
            largest["profileId"].as_str().unwrap()
        )),
        "{largest}: {text}"
    );

    // A typo: a tool error a model can act on, not a protocol failure.
    let (text, error) = answer(&result, "top_functions", 1);
    assert!(error, "{text}");
    assert!(text.contains("did you mean 'checkout'?"), "{text}");

    // focus: handle's callees, and main as its caller.
    let (text, _) = answer(&result, "flame_graph", 1);
    assert!(
        text.contains("its callees") && text.contains("handle → main"),
        "{text}"
    );

    if corpus.is_some() {
        // The real profile: its top function's self share as the API's tree gives it, and
        // what is cut summed so that the shares add up.
        let tree = merge(
            "gocorpus",
            "0",
            &(kiln_model::time::now_ms() + 60_000).to_string(),
        );
        let total = num(&tree["flamegraph"]["levels"][0]["values"][1]);
        assert!(
            total > 0.0,
            "{}",
            &tree.to_string()[..tree.to_string().len().min(2000)]
        );
        let functions = flamegraph_functions(&tree["flamegraph"]);
        let (text, _) = answer(&result, "top_functions", 2);
        let first = text.lines().find(|l| l.starts_with("1 | ")).unwrap();
        let cells: Vec<&str> = first.split(" | ").collect();
        let expected = functions.values().map(|(s, _)| *s).max().unwrap();
        assert_eq!(functions[cells[1]].0, expected, "{text}");
        assert_eq!(cells[3], percent(expected as f64, total), "{text}");
        let listed: f64 = text
            .lines()
            .filter(|l| {
                l.split(" | ")
                    .next()
                    .is_some_and(|c| c.parse::<u32>().is_ok())
            })
            .map(|l| {
                l.split(" | ")
                    .nth(3)
                    .unwrap()
                    .trim_end_matches(" %")
                    .parse::<f64>()
                    .unwrap()
            })
            .sum();
        let rest: f64 = text
            .lines()
            .find(|l| l.starts_with("… "))
            .map(|l| {
                l.split(": ")
                    .nth(1)
                    .unwrap()
                    .split(" %")
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap()
            })
            .unwrap_or(0.0);
        assert!(
            (listed + rest - 100.0).abs() < 0.2,
            "{listed} + {rest}: {text}"
        );
        // Asked for 300, it lists up to 300 functions, past the default budget.
        let (text, _) = answer(&result, "top_functions", 3);
        let rows = text
            .lines()
            .filter(|l| {
                l.split(" | ")
                    .next()
                    .is_some_and(|c| c.parse::<u32>().is_ok())
            })
            .count();
        assert_eq!(rows, functions.len().min(300), "{text}");
        let (text, _) = answer(&result, "flame_graph", 2);
        assert!(text.contains("more callee"), "{text}");
    }
}

/// An int64 as proto3 JSON writes it (a string), or a number.
fn num(value: &Value) -> f64 {
    value
        .as_str()
        .and_then(|s| s.parse().ok())
        .or_else(|| value.as_f64())
        .unwrap_or(0.0)
}

/// A JSON API's answer, which must be a success.
fn api_json(server: &TestServer, path: &str, body: Value) -> Value {
    // Read whole: a large profile's tree is past ureq's limit for text.
    let (status, bytes) = server.post_bytes(
        path,
        body.to_string().as_bytes(),
        &[("Content-Type", "application/json")],
    );
    assert_eq!(status, 200, "{path}: {}", String::from_utf8_lossy(&bytes));
    serde_json::from_slice(&bytes).expect("JSON")
}

/// Per function of a flamebearer graph: (self, total counted once per stack).
fn flamegraph_functions(graph: &Value) -> std::collections::HashMap<String, (i64, i64)> {
    let names: Vec<&str> = graph["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    let levels: Vec<Vec<i64>> = graph["levels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            l["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| num(v) as i64)
                .collect()
        })
        .collect();
    // Paths by walking levels: (start, end, name, path) per node.
    let mut out: std::collections::HashMap<String, (i64, i64)> = Default::default();
    let mut above: Vec<(i64, i64, Vec<String>)> = Vec::new();
    for (depth, level) in levels.iter().enumerate() {
        let mut here = Vec::new();
        let mut x = 0;
        for quad in level.chunks(4) {
            x += quad[0];
            let name = names[quad[3] as usize].to_string();
            let mut path = if depth == 0 {
                Vec::new()
            } else {
                above
                    .iter()
                    .find(|(s, e, _)| *s <= x && x < *e)
                    .unwrap()
                    .2
                    .clone()
            };
            if depth > 0 {
                let entry = out.entry(name.clone()).or_default();
                entry.0 += quad[2];
                if !path.contains(&name) {
                    entry.1 += quad[1];
                }
                path.push(name);
            }
            here.push((x, x + quad[1], path));
            x += quad[1];
        }
        above = here;
    }
    out
}

/// `/mcp` over Streamable HTTP: a read token of the tenant lists its services; no token,
/// and another tenant's token for this tenant, are refused before any tool runs. Over
/// stdio, `kiln mcp --token-file` carries the token, and without one a tool answers the
/// API's 401 as its error.
#[test]
fn mcp_needs_a_read_token_of_its_tenant() {
    if !sdk_installed() {
        return;
    }
    let server = TestServer::start_with(|config| config.auth = auth_config(1000));
    let ops = format!("Bearer {OPS_B}");
    let now_s = kiln_model::time::now_ms() / 1000;
    // A service in each tenant, each written with its tenant's token.
    let (status, text) = server.post_with(
        &format!(
            "/ingest?name=teama_svc.cpu&format=folded&from={}&until={}",
            now_s - 60,
            now_s - 50
        ),
        b"main;work 7\n",
        &[(
            "Authorization",
            &format!("Bearer {}", crate::auth::WRITER_A),
        )],
    );
    assert_eq!(status, 200, "{text}");
    let (status, text) = server.post_with(
        &format!(
            "/ingest?name=teamb_svc.cpu&format=folded&from={}&until={}",
            now_s - 60,
            now_s - 50
        ),
        b"main;other 3\n",
        &[("Authorization", &ops)],
    );
    assert_eq!(status, 200, "{text}");
    let url = format!("{}/mcp", server.url);
    let calls = json!([{ "name": "list_services", "arguments": {} }]);

    let (ok, result) = client(&["http", &url, "--token", READER_A], &calls);
    assert!(ok, "{result}");
    let (text, error) = answer(&result, "list_services", 0);
    assert!(!error, "{text}");
    assert!(text.contains("teama_svc | cpu"), "{text}");
    assert!(
        !text.contains("teamb_svc"),
        "another tenant's service: {text}"
    );

    let (ok, result) = client(&["http", &url], &calls);
    assert!(!ok, "no token, yet: {result}");
    assert!(
        result["error"].as_str().unwrap().contains("401"),
        "{result}"
    );

    let (ok, result) = client(
        &["http", &url, "--token", OPS_B, "--tenant", "team-a"],
        &calls,
    );
    assert!(!ok, "team-b's token for team-a, yet: {result}");
    assert!(
        result["error"].as_str().unwrap().contains("403"),
        "{result}"
    );

    let dir = tempfile::tempdir().unwrap();
    let token_file = temp_file(dir.path(), "token", format!("{READER_A}\n").as_bytes());
    let binary = env!("CARGO_BIN_EXE_kiln");
    let token_file = token_file.to_string_lossy().into_owned();
    let (ok, result) = client(
        &["stdio", binary, &server.url, "--token-file", &token_file],
        &calls,
    );
    assert!(ok, "{result}");
    let (text, error) = answer(&result, "list_services", 0);
    assert!(!error && text.contains("teama_svc | cpu"), "{text}");
    let (ok, result) = client(&["stdio", binary, &server.url], &calls);
    assert!(ok, "{result}");
    let (text, error) = answer(&result, "list_services", 0);
    assert!(error && text.starts_with("Kiln answered 401"), "{text}");

    // The transport's own rules: JSON only, no stream to open, other origins refused.
    let (status, _) = server.post_with(
        "/mcp",
        b"{}",
        &[
            ("Authorization", &format!("Bearer {READER_A}")),
            ("Content-Type", "text/plain"),
        ],
    );
    assert_eq!(status, 415);
    let (status, text, _) = send(
        &server,
        "GET",
        "/mcp",
        b"",
        &[("Authorization", &format!("Bearer {READER_A}"))],
        "allow",
    );
    assert_eq!(status, 405, "{text}");
    let (status, _) = server.post_with(
        "/mcp",
        br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
        &[
            ("Authorization", &format!("Bearer {READER_A}")),
            ("Content-Type", "application/json"),
            ("Origin", "http://evil.example"),
        ],
    );
    assert_eq!(status, 403);
    let (status, text) = server.post_with(
        "/mcp",
        br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
        &[
            ("Authorization", &format!("Bearer {READER_A}")),
            ("Content-Type", "application/json"),
        ],
    );
    assert_eq!(
        (status, text.as_str()),
        (200, r#"{"id":1,"jsonrpc":"2.0","result":{}}"#)
    );
}

/// The evaluation of docs/mcp.md, quick (planted data only): every planted cause is found
/// by the tool calls a model would make.
#[test]
fn the_evaluation_finds_every_planted_cause() {
    if !sdk_installed() {
        return;
    }
    let output = Command::new("python3")
        .arg(workspace_root().join("tests/mcp/evaluate.py"))
        .args([env!("CARGO_BIN_EXE_kiln"), "--quick"])
        .env("KILN_LOG_LEVEL", "warn")
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    println!("{stdout}");
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let results = summary["results"].as_array().unwrap();
    assert_eq!(results.len(), 9, "{summary}");
    for result in results {
        assert_eq!(
            result["found"],
            true,
            "{result}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(result["tokens"].as_u64().unwrap() <= 2 * 2000, "{result}");
    }
}

/// Per-tenant query limits apply to the tools' calls, and `/mcp` itself holds no query
/// slot: with one query a tenant at a time, a tool's calls still run (were `/mcp` a read,
/// they would wait for its own slot until the query timeout), and a tool past the
/// tenant's `max_profiles` answers the API's refusal as its error.
#[test]
fn tools_meet_the_tenants_query_limits_without_waiting_on_themselves() {
    if !sdk_installed() {
        return;
    }
    let calls = json!([{ "name": "top_functions", "arguments": { "service": "limited" } }]);
    let run = |configure: fn(&mut ServerConfig)| {
        let server = TestServer::start_with(configure);
        let now_s = kiln_model::time::now_ms() / 1000;
        for i in 0..5 {
            let (status, text) = server.post_with(
                &format!(
                    "/ingest?name=limited.cpu&format=folded&from={}&until={}",
                    now_s - 300 + i * 10,
                    now_s - 290 + i * 10
                ),
                b"main;work 7\n",
                &[],
            );
            assert_eq!(status, 200, "{text}");
        }
        let started = Instant::now();
        let (ok, result) = client(&["http", &format!("{}/mcp", server.url)], &calls);
        assert!(ok, "{result}");
        let (text, error) = answer(&result, "top_functions", 0);
        (text.to_string(), error, started.elapsed())
    };
    // One query at a time: the tool's three calls run one after another.
    let (text, error, took) = run(|config| {
        config.query.max_concurrent_per_tenant = 1;
        config.query.timeout_ms = 5_000;
    });
    assert!(!error && text.contains("| main |"), "{text}");
    assert!(took < Duration::from_secs(4), "{took:?}");
    // Three profiles a query at most: the API's refusal, as the tool's error.
    let (text, error, _) = run(|config| config.query.max_profiles = 3);
    assert!(error, "{text}");
    assert!(
        text.contains("Kiln answered 422") && text.contains("query.max_profiles"),
        "{text}"
    );
}
