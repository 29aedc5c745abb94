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
pub(crate) fn browser_available() -> bool {
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
pub(crate) fn run_script(script: &str, server: &TestServer, args: &[&str]) -> serde_json::Value {
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
    // 50,000 distinct stacks (four uploads of 12,500 stacks each).
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

/// dd-grow's profiles: (minutes ago, samples at 100 Hz), one value per heatmap row range.
const DD_GROW: [(i64, i64); 8] = [
    (50, 10),
    (45, 20),
    (40, 40),
    (35, 80),
    (30, 160),
    (25, 320),
    (20, 640),
    (15, 1280),
];

/// `from,until,min,max` of the UI's `sel`: the pushed dd-grow profiles inside it, as
/// (count, summed value).
fn inside(rectangle: &str, pushed: &[(i64, i64)]) -> (usize, i64) {
    let parts: Vec<Option<i64>> = rectangle.split(',').map(|p| p.parse().ok()).collect();
    let (from, until) = (parts[0].expect("from"), parts[1].expect("until"));
    let (min, max) = (
        parts.get(2).copied().flatten(),
        parts.get(3).copied().flatten(),
    );
    let chosen: Vec<i64> = pushed
        .iter()
        .filter(|(at, value)| {
            *at >= from
                && *at < until
                && min.is_none_or(|min| *value >= min)
                && max.is_none_or(|max| *value < max)
        })
        .map(|(_, value)| *value)
        .collect();
    (chosen.len(), chosen.iter().sum())
}

#[test]
fn the_ui_answers_which_service_changed_which_profiles_and_which_line() {
    if !browser_available() {
        return;
    }
    // A checkout with runtime/proc.go, which the lines profile names.
    let root = std::env::temp_dir().join(format!("kiln-ui-source-{}", std::process::id()));
    std::fs::create_dir_all(root.join("runtime")).expect("source root");
    let text: String = (1..=3000).map(|n| format!("// line {n}\n")).collect();
    std::fs::write(root.join("runtime/proc.go"), text).expect("source file");
    let source_root = root.clone();
    let server = TestServer::start_with(move |config| config.source.root = Some(source_root));
    push_folded(&server, "dd-grow", "", 90, "main;grow_old 100\n");
    let now = kiln_model::time::now_nanos() / 1_000_000_000;
    let mut pushed = Vec::new();
    for (k, (minutes_ago, samples)) in DD_GROW.iter().enumerate() {
        // Its value: its own samples and grow_common's 5, at 10 ms each.
        pushed.push(((now - minutes_ago * 60) * 1000, (samples + 5) * 10_000_000));
        push_folded(
            &server,
            "dd-grow",
            "",
            *minutes_ago,
            &format!("main;grow_{k} {samples}\nmain;grow_common 5\n"),
        );
    }
    push_folded(&server, "dd-shrink", "", 90, "main;shrink 400\n");
    push_folded(&server, "dd-shrink", "", 20, "main;shrink 100\n");
    push_folded(&server, "dd-steady", "", 80, "main;steady 200\n");
    push_folded(&server, "dd-steady", "", 10, "main;steady 210\n");
    push_folded(&server, "dd-new", "", 5, "main;fresh 50\n");
    let (status, text) = server.post(
        &format!("/ingest?name=dd-lines&format=pprof&from={}", now - 20 * 60),
        &fixture("profefe-collector_cpu_1.prof"),
    );
    assert_eq!(status, 200, "{text}");
    // 500 services on a server of their own, this hour and the previous one.
    let bulk = TestServer::start();
    std::thread::scope(|scope| {
        for part in 0..10 {
            let bulk = &bulk;
            scope.spawn(move || {
                for i in (part * 50)..(part + 1) * 50 {
                    let service = format!("svc-{i:03}");
                    let body = format!("main;{service}_work {}\nmain;idle 3\n", 10 + i % 37);
                    push_folded(bulk, &service, "", 30, &body);
                    push_folded(bulk, &service, "", 90, "main;idle 20\n");
                }
            });
        }
    });

    let results = run_script("drilldown_test.mjs", &server, &[&bulk.url]);

    // The overview: new services first, then by the size of their change.
    let overview = &results["overview"];
    assert_eq!(overview["view"], "overview", "{results:#}");
    assert_eq!(
        strings(&overview["order"]),
        ["dd-lines", "dd-new", "dd-grow", "dd-shrink", "dd-steady"],
        "{results:#}"
    );
    assert_eq!(
        strings(&overview["changes"]),
        ["new", "new", "+2490 %", "−75 %", "+5.0 %"],
        "{results:#}"
    );
    // dd-grow's top three by self: the three largest profiles' own functions.
    assert_eq!(
        strings(&overview["tops"][2]),
        ["grow_7", "grow_6", "grow_5"],
        "{results:#}"
    );
    assert_eq!(
        strings(&results["overviewByName"]),
        ["dd-grow", "dd-lines", "dd-new", "dd-shrink", "dd-steady"]
    );
    assert_eq!(results["overviewByChange"], overview["order"]);

    // Keyboard: the header's controls in order, then the services; Enter opens one.
    let stops = strings(&results["tabStops"]);
    let at = |id: &str| stops.iter().position(|stop| *stop == id);
    assert!(at("service") < at("labels"), "{stops:?}");
    assert!(
        at("labels") < at("dd-grow") && at("dd-grow").is_some(),
        "{stops:?}"
    );
    assert_eq!(results["enterOpened"]["service"], "dd-grow", "{results:#}");

    // The heatmap counts every dd-grow profile; a rectangle's flame graph is exactly the
    // profiles the test pushed inside it.
    let heatmap = &results["heatmap"];
    assert_eq!(heatmap["profiles"], 8, "{results:#}");
    let all: i64 = pushed.iter().map(|(_, value)| value).sum();
    assert_eq!(heatmap["flameTotal"].as_i64(), Some(all), "{results:#}");
    let rectangle = &results["rectangle"];
    let (count, total) = inside(rectangle["sel"].as_str().expect("sel"), &pushed);
    assert!((1..8).contains(&count), "{count} of 8 in {rectangle}");
    let expected = total;
    assert_eq!(
        rectangle["flameTotal"].as_i64(),
        Some(expected),
        "{rectangle}"
    );
    assert_eq!(
        rectangle["selection"]["left"]["total"].as_i64(),
        Some(expected)
    );
    assert_eq!(
        rectangle["selection"]["left"]["profiles"].as_u64(),
        Some(count as u64)
    );
    let compared = &results["compared"];
    let (right_count, right_total) = inside(compared["sel2"].as_str().expect("sel2"), &pushed);
    assert!(right_count >= 1, "{compared}");
    assert_eq!(
        compared["diffSides"],
        format!("{expected}:{right_total}"),
        "{compared}"
    );
    assert_eq!(compared["tableTestId"], "compare");
    assert_eq!(results["deepLink"]["same"], true, "{results:#}");
    assert_eq!(results["deepLink"]["diffSides"], compared["diffSides"]);
    assert!(results["afterEscape"].get("sel").is_none(), "{results:#}");

    // Exemplars: each is a pushed profile; opened alone, its flame graph is its value, and
    // the pprof downloaded says the same.
    let exemplars = results["exemplars"].as_array().expect("exemplars");
    assert!(!exemplars.is_empty(), "{results:#}");
    let first = exemplars[0]["value"].as_i64().expect("value");
    assert!(pushed.iter().any(|(_, value)| *value == first), "{first}");
    assert_eq!(results["single"]["flameTotal"].as_i64(), Some(first));
    let downloaded = std::fs::read(results["exemplarDownload"].as_str().expect("path"))
        .expect("downloaded pprof");
    let profile = kiln_model::pprof::decode(&downloaded, 1 << 30).expect("pprof");
    let cpu = profile
        .sample_type
        .iter()
        .position(|t| profile.string_or_empty(t.r#type) == "cpu")
        .expect("cpu sample type");
    assert_eq!(
        profile.sample.iter().map(|s| s.value[cpu]).sum::<i64>(),
        first
    );

    // Source lines: runtime.schedule's four lines, with the checkout's text beside them.
    let lines = &results["lines"];
    let rows = lines["rows"].as_array().expect("rows");
    let numbers: Vec<&str> = rows.iter().filter_map(|r| r[1].as_str()).collect();
    assert_eq!(numbers, ["2493", "2525", "2532", "2559"], "{lines}");
    assert_eq!(rows[1][3], "370 ms", "{lines}");
    assert_eq!(lines["sourceRows"], 4, "{lines}");
    assert_eq!(lines["firstHot"], "// line 2493");
    assert_eq!(results["linesAfterEscape"], true);

    // No accessibility violations (WCAG 2 A and AA, colour contrast included) in either
    // theme; the dark theme is dark.
    for audit in results["axe"].as_array().expect("axe") {
        assert_eq!(audit["violations"], serde_json::json!([]), "{audit:#}");
    }
    assert_eq!(results["axe"].as_array().map(Vec::len), Some(7));
    assert_eq!(results["darkBackground"], "rgb(21, 21, 21)");

    // 500 services listed; the figures go to docs/ui.md.
    assert_eq!(results["bulk"]["rows"], 500, "{results:#}");
    println!(
        "500 services: overview drawn {} ms after navigation (API {} ms, table {} ms)",
        results["bulk"]["sinceNavigationMs"],
        results["bulk"]["fetchMs"],
        results["bulk"]["renderMs"]
    );
    std::fs::remove_dir_all(&root).ok();
}
