//! The web UI in a real browser: Debian's Chromium driven by Playwright
//! (`tests/ui/ui_test.mjs`, `playwright-core` from npm) against a server loaded with known
//! profiles. Screenshots go to `target/ui-screenshots/` (or `$KILN_UI_SCREENSHOTS`).

use std::process::Command;

use crate::common::*;

const SERVICE: &str = "kiln-ui-demo";
const BIG_SERVICE: &str = "kiln-ui-big";

/// The strings of a JSON array (empty when it is not one).
fn strings(value: &serde_json::Value) -> Vec<&str> {
    value
        .as_array()
        .map(|items| items.iter().filter_map(|item| item.as_str()).collect())
        .unwrap_or_default()
}

/// Whether Playwright and Chromium are here; says it skipped when not.
fn browser_available() -> bool {
    let has_browser = std::path::Path::new("/usr/bin/chromium").exists()
        || std::env::var_os("KILN_CHROMIUM").is_some();
    if !workspace_root()
        .join("tests/ui/node_modules/playwright-core")
        .is_dir()
        || !has_browser
    {
        eprintln!("skipped: playwright-core (npm, tests/ui) or Debian's chromium is not installed (scripts/test.sh installs both)");
        return false;
    }
    true
}

/// Runs a script of tests/ui against `server` and returns the JSON it printed, with no
/// page errors. Screenshots go to target/ui-screenshots (or `$KILN_UI_SCREENSHOTS`).
fn run_script(script: &str, server: &TestServer, args: &[&str]) -> serde_json::Value {
    let shots = std::env::var_os("KILN_UI_SCREENSHOTS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/ui-screenshots"));
    std::fs::create_dir_all(&shots).expect("screenshot directory");
    let output = Command::new("node")
        .current_dir(workspace_root().join("tests/ui"))
        .arg(script)
        .arg(&server.url)
        .arg(&shots)
        .args(args)
        .output()
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let results: serde_json::Value = serde_json::from_str(stdout.trim()).expect("JSON results");
    println!("{results:#}");
    assert_eq!(results["errors"], serde_json::json!([]), "{results:#}");
    results
}

#[test]
fn the_ui_explores_searches_selects_compares_and_restores_a_shared_view() {
    if !browser_available() {
        return;
    }
    let server = TestServer::start();
    // First half hour: the hot function and a cold one; last ten minutes: the hot function
    // and a new one, so the halves differ and a drag over the second half changes totals.
    push_folded(
        &server,
        SERVICE,
        "env=prod",
        50,
        "main;kiln_ui_hot;leaf 600\nmain;kiln_ui_cold 100\n",
    );
    push_folded(
        &server,
        SERVICE,
        "env=staging",
        10,
        "main;kiln_ui_hot;leaf 300\nmain;kiln_ui_new 200\n",
    );
    // Another service, so picking one matters.
    push_folded(&server, "kiln-ui-other", "", 20, "other;work 50\n");
    // 50,000 distinct stacks (four uploads under the 16,000-sample limit each).
    for part in 0..4 {
        let mut body = String::new();
        for i in part * 12_500..(part + 1) * 12_500 {
            body.push_str(&format!(
                "main;pkg{}.dispatch;pkg{}.handler{};leaf{i} {}\n",
                i % 50,
                i % 50,
                i % 500,
                1 + i % 7
            ));
        }
        push_folded(&server, BIG_SERVICE, "", 5, &body);
    }

    let results = run_script(
        "ui_test.mjs",
        &server,
        &[SERVICE, "kiln_ui_hot", BIG_SERVICE],
    );

    // 1. The service is picked; timeline and flame graph drawn; the hottest function leads.
    let opened = &results["opened"];
    assert_eq!(opened["service"], SERVICE);
    assert_eq!(
        opened["type"],
        "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
    );
    assert!(opened["timelinePoints"].as_i64() >= Some(2), "{opened}");
    // 1,200 samples of 10 ms
    assert_eq!(opened["flameTotal"].as_f64(), Some(12e9), "{opened}");
    assert!(opened["flameRendered"].as_i64() >= Some(5), "{opened}");
    let top = strings(&opened["tableTop"]);
    assert_eq!(top.first(), Some(&"leaf"), "{top:?}"); // self time: leaf 900 samples
    assert!(top.contains(&"kiln_ui_hot"), "{top:?}");

    // 2. Search: the hot function's share, 900 of 1,200 samples.
    let searched = &results["searched"];
    let text = searched["searchResult"].as_str().unwrap_or_default();
    assert!(text.contains("75.00 %"), "{text}");

    // 3. Dragging over the second half leaves only the last ten minutes' samples.
    let dragged = &results["dragged"];
    assert_eq!(dragged["flameTotal"].as_f64(), Some(5e9), "{dragged}");
    assert_ne!(dragged["from"], opened["from"]);

    // 4. Compare: the diff holds both halves (1,200 samples) and names the new and the
    // cold functions among its rows.
    let compared = &results["compared"];
    assert_eq!(compared["compare"], true);
    assert_eq!(compared["flameTotal"].as_f64(), Some(12e9), "{compared}");
    let rows = strings(&compared["tableTop"]);
    assert!(
        rows.contains(&"kiln_ui_new") && rows.contains(&"kiln_ui_cold"),
        "{rows:?}"
    );
    assert!(results["compareUrl"]
        .as_str()
        .unwrap_or("")
        .contains("mode=compare"));

    // 5. The shared URL restores the view: service, type, range, search and totals.
    let (before, shared) = (&results["beforeShare"], &results["shared"]);
    for key in [
        "service",
        "type",
        "search",
        "from",
        "until",
        "flameTotal",
        "searchResult",
    ] {
        assert_eq!(before[key], shared[key], "{key}: {before} vs {shared}");
    }

    // Focus: zoomed into the hot function, then its call path queried alone (9 s).
    let zoomed = &results["zoomed"]["breadcrumbs"];
    assert_eq!(
        zoomed,
        &serde_json::json!(["total", "main", "kiln_ui_hot"]),
        "{results:#}"
    );
    assert_eq!(
        results["focused"]["flameTotal"].as_f64(),
        Some(9e9),
        "{results:#}"
    );
    assert!(results["focusedUrl"]
        .as_str()
        .unwrap_or("")
        .contains("callsite="));

    // Two label selections over the same hour: prod (7 s) against staging (5 s).
    assert_eq!(
        results["labelCompareSides"], "7000000000:5000000000",
        "{results:#}"
    );
    let rows = strings(&results["labelCompare"]["tableTop"]);
    assert!(
        rows.contains(&"kiln_ui_new") && rows.contains(&"kiln_ui_cold"),
        "{rows:?}"
    );

    // A bad selector: the server's message on screen, marked as an error.
    let error = &results["errorState"];
    assert_eq!(error["statusClass"], "error", "{error}");
    assert!(
        error["status"].as_str().unwrap_or("").contains("HTTP 400"),
        "{error}"
    );

    // The dark theme follows the system setting.
    assert_eq!(results["darkBackground"], "rgb(21, 21, 21)");

    // Label values are suggested once a name and an operator are typed.
    assert_eq!(
        results["suggestions"],
        serde_json::json!(["env=\"prod\"", "env=\"staging\""]),
        "{results:#}"
    );

    // Split by env: one timeline series per value.
    let split = strings(&results["split"]);
    assert!(
        split.contains(&"prod") && split.contains(&"staging"),
        "{split:?}"
    );

    // Callers and callees of the hot function: 9 s each way; callers kiln_ui_hot <- main
    // <- total (3 levels), callees kiln_ui_hot -> leaf (2 levels).
    assert_eq!(
        results["sandwich"], "9000000000:9000000000:3:2",
        "{results:#}"
    );

    // Single profiles: the point 50 minutes ago holds one profile, of 700 samples.
    let listed = results["profilesListed"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(listed.len(), 1, "{results:#}");
    assert_eq!(
        results["single"]["flameTotal"].as_f64(),
        Some(7e9),
        "{results:#}"
    );

    // Exports: gzip pprof from the server, SVG built in the page.
    assert_eq!(results["pprofExport"]["status"], 200);
    assert_eq!(results["pprofExport"]["gzip"], true);
    assert_eq!(results["svgExport"], "flamegraph.svg");

    // The 50,000-node flame graph rendered, with its times reported.
    let big = &results["big"];
    assert!(big["nodes"].as_i64() >= Some(50_000), "{big}");
    println!(
        "50k-node flame graph: {} nodes, first meaningful render {} ms after navigation, \
         flame graph built and drawn in {} ms (draw alone {} ms, zoomed re-draw {} ms)",
        big["nodes"], big["navigationToReadyMs"], big["setDataMs"], big["renderMs"], big["zoomMs"]
    );
}

#[test]
fn the_ui_is_served_by_the_binary() {
    let server = TestServer::start();
    let (status, page) = server.get("/");
    assert_eq!(status, 200);
    assert!(page.contains("<title>Kiln</title>"));
    for asset in [
        "/ui/app.js",
        "/ui/flamegraph.js",
        "/ui/style.css",
        "/ui/vendor/uPlot.iife.min.js",
    ] {
        let (status, body) = server.get(asset);
        assert_eq!(status, 200, "{asset}");
        assert!(!body.is_empty());
    }
    assert_eq!(server.get("/ui/nope.js").0, 404);
}

/// The recording rules page: a rule written in the form, previewed over the last hour
/// (the preview's total is Kiln's own total of the selection), saved, and a mistake shown
/// as the server words it.
#[test]
fn the_rules_page_previews_and_saves_a_rule() {
    if !browser_available() {
        return;
    }
    let server = TestServer::start();
    push_folded(&server, "kiln-ui-rules", "env=prod", 30, "main;work 600\n");
    push_folded(
        &server,
        "kiln-ui-rules",
        "env=dev",
        20,
        "main;work 300\nmain;idle 100\n",
    );
    push_folded(&server, "kiln-ui-other", "", 20, "other;work 50\n");
    let results = run_script("rules_test.mjs", &server, &["kiln-ui-rules"]);
    // 1000 samples at 100 Hz: 10 s of CPU, in two series (env=prod, env=dev).
    assert_eq!(results["preview"]["series"], 2, "{results}");
    assert_eq!(results["preview"]["total"], 10_000_000_000i64, "{results}");
    assert_eq!(results["preview"]["chart"], true);
    let rows = results["preview"]["rows"].to_string();
    assert!(
        rows.contains("ui_cpu_nanoseconds{env=\\\"dev\\\", service_name=\\\"kiln-ui-rules\\\"}"),
        "{rows}"
    );
    assert!(rows.contains("\"4 s\""), "{rows}");
    assert!(
        strings(&results["listed"]).contains(&"ui_cpu_nanoseconds"),
        "{results}"
    );
    let stored = server.json("/api/v1/recording-rules/ui_cpu_nanoseconds", &[]);
    assert_eq!(
        stored["group_by"],
        serde_json::json!(["service_name", "env"])
    );
    let mistake = results["mistake"].as_str().unwrap_or_default();
    assert!(
        mistake.contains("recording rule \"bad rule\": metric_name"),
        "{mistake}"
    );
}

/// The regressions page lists what the watcher found after a deploy; its link opens the
/// comparison of the two versions, ranked with confidence, and a row focuses the flame
/// graph on its function.
#[test]
fn the_regressions_page_leads_to_a_ranked_comparison() {
    if !browser_available() {
        return;
    }
    let (hook, _) = crate::insight::webhook();
    let server = TestServer::start_with(crate::insight::with_watcher(hook));
    let now_s = kiln_model::time::now_ms() / 1000;
    crate::insight::push(&server, "anonymous", "1.0", now_s - 1800, false);
    crate::insight::push(&server, "anonymous", "1.1", now_s - 1500, true);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while server.json("/api/v1/regressions", &[])["regressions"]
        .as_array()
        .is_none_or(|found| found.is_empty())
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the watcher found nothing"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let results = run_script("insight_test.mjs", &server, &["checkout"]);
    assert_eq!(
        results["link"], "/regressions?service=checkout",
        "{results}"
    );
    let listed = results["regressions"].to_string();
    assert!(
        listed.contains("slow_path") && listed.contains("1.0 → 1.1"),
        "{listed}"
    );
    assert!(listed.contains("\"increase\""), "{listed}");
    let summary = results["summary"].as_str().unwrap_or_default();
    assert!(
        summary.contains("before: 12 profiles, after: 12 profiles"),
        "{summary}"
    );
    assert!(
        summary.contains("of 4 functions changed significantly"),
        "{summary}"
    );
    assert_eq!(
        results["header"],
        serde_json::json!([
            "function",
            "self before",
            "self after",
            "change (pp)",
            "confidence"
        ])
    );
    // Most important first: slow_path, significant, with its confidence shown.
    let first = &results["ranked"][0];
    assert_eq!(first["cells"][0], "slow_path", "{results}");
    assert_eq!(first["significant"], true);
    assert!(
        first["cells"][4]
            .as_str()
            .unwrap_or_default()
            .ends_with("✓"),
        "{first}"
    );
    // The second row, clicked, is selected and the flame graph zoomed to it.
    let second = results["ranked"][1]["cells"][0]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(results["clicked"], second.as_str(), "{results}");
    assert_eq!(
        strings(&results["breadcrumbs"]).last().copied(),
        Some(second.as_str()),
        "{results}"
    );
    assert_eq!(results["focus"], second.as_str());
}

/// With auth on, the UI asks for a token on 401, keeps it for the tab only, and sends it
/// on every call.
#[test]
fn the_ui_asks_for_a_token_and_keeps_it_for_the_tab() {
    use crate::auth::{auth_config, bearer, READER_A, WRITER_A};
    if !browser_available() {
        return;
    }
    let server = TestServer::start_with(|config| config.auth = auth_config(1000));
    let (status, text) = server.post_with(
        "/ingest?name=authui.cpu",
        b"main;work 30\nmain;rest 10\n",
        &[("Authorization", bearer(WRITER_A).as_str())],
    );
    assert_eq!(status, 200, "{text}");
    let results = run_script("auth_test.mjs", &server, &["authui", READER_A]);
    assert!(
        results["asked"]
            .as_str()
            .is_some_and(|m| m.contains("authentication required")),
        "{results}"
    );
    assert!(
        results["askedAgain"]
            .as_str()
            .is_some_and(|m| m.contains("invalid token")),
        "{results}"
    );
    assert_eq!(results["total"], 40 * 10_000_000, "{results}");
    let functions = strings(&results["functions"]);
    assert!(
        functions.contains(&"work") && functions.contains(&"rest"),
        "{functions:?}"
    );
    assert_eq!(results["dialogAfter"], 0);
    assert_eq!(results["dialogAfterReload"], 0, "the tab forgot its token");
    assert_eq!(results["otherSessionAsked"], true);
}
