//! Stripped binaries named on the server: a C program with inlined calls
//! (tests/symbolize/inline.c, `-O2 -g`), its debug file kept with `objcopy
//! --only-keep-debug` and the binary stripped, profiled by the agent with no names, then
//! named from `kiln debuginfo upload` and from a real debuginfod server, with no re-ingest;
//! a Rust release build the same way; and a Go program built `-ldflags="-s -w"`, named
//! from the `.gopclntab` of the stripped binary itself.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::agent::{start_agent_with, stop};
use crate::common::*;
use kiln_testkit::free_port;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
/// Enough samples that two builds' splits agree within ±3 points for sampling's sake: at
/// 199 Hz a 10 s run got ~1,000 samples each on a busy machine, and the builds' splits
/// differed by up to 3.0 points (also because the program then ran for wall seconds, so
/// each build made a different number of calls).
const FREQUENCY: &[&str] = &["--frequency", "997"];

struct Builds {
    _dir: tempfile::TempDir,
    full: PathBuf,
    stripped: PathBuf,
    debug: PathBuf,
}

/// The C program built unstripped as `<name>_full`, and stripped as `<name>` with its
/// debug file beside it; `None` without a C compiler (the test says it skipped).
fn builds(name: &str) -> Option<Builds> {
    split_build(name, |output| {
        Command::new("cc")
            .args(["-O2", "-g", "-fno-omit-frame-pointer", "-o"])
            .arg(output)
            .arg(workspace_root().join("tests/symbolize/inline.c"))
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// What `compile` writes to the path it is given, unstripped, and split as distributions
/// ship it: `objcopy --only-keep-debug`, then `strip`.
fn split_build(name: &str, compile: impl FnOnce(&Path) -> bool) -> Option<Builds> {
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join(format!("{name}_full"));
    if !compile(&full) {
        println!("skipped: symbolization test {name} (no compiler)");
        return None;
    }
    let stripped = dir.path().join(name);
    let debug = dir.path().join(format!("{name}.debug"));
    let run = |command: &mut Command| assert!(command.status().unwrap().success(), "{command:?}");
    run(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&full)
        .arg(&debug));
    std::fs::copy(&full, &stripped).unwrap();
    run(Command::new("strip").arg(&stripped));
    Some(Builds {
        _dir: dir,
        full,
        stripped,
        debug,
    })
}

/// Per function of one process's flame graph: (self, total), and the sum of self values.
fn functions_of_pid(
    server: &TestServer,
    pid: u32,
) -> (std::collections::HashMap<String, (i64, i64)>, i64) {
    let tree = crate::agent::cpu_tree(server, &format!(r#"{{pid="{pid}"}}"#));
    let functions = tree_functions(&tree);
    let total = functions.values().map(|(flat, _)| flat).sum();
    (functions, total)
}

/// Runs the unstripped and the stripped build side by side for `seconds` of CPU each (the
/// same machine conditions, and the same calls), and waits until their samples are in (up to 20 s more).
/// Their pids.
fn profile(server: &TestServer, builds: &Builds, seconds: f64) -> (u32, u32) {
    let start = |binary: &Path| -> Child {
        Command::new(binary)
            .arg(seconds.to_string())
            .stdout(Stdio::null())
            .spawn()
            .unwrap()
    };
    let (mut full, mut stripped) = (start(&builds.full), start(&builds.stripped));
    let pids = (full.id(), stripped.id());
    assert!(full.wait().unwrap().success() && stripped.wait().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let sampled = |pid| functions_of_pid(server, pid).1 as f64 >= 0.85 * seconds * 1e9;
    while Instant::now() < deadline && !(sampled(pids.0) && sampled(pids.1)) {
        std::thread::sleep(Duration::from_millis(250));
    }
    pids
}

/// A server configured by `configure`, an agent at [`FREQUENCY`], and both builds
/// profiled side by side for 6 s of CPU ([`profile`]); `None` where perf events are not
/// permitted (the agent says it skipped).
fn profiled(
    builds: &Builds,
    configure: impl FnOnce(&mut kiln_node::ServerConfig),
) -> Option<(TestServer, (u32, u32))> {
    let server = TestServer::start_with(configure);
    let agent = start_agent_with(&server, FREQUENCY)?;
    let pids = profile(&server, builds, 6.0);
    stop(agent);
    Some((server, pids))
}

/// kiln_hot_a's share of kiln_hot_a + kiln_hot_b, in percent, and the share of samples
/// under kiln_main_loop.
fn split(functions: &std::collections::HashMap<String, (i64, i64)>, total: i64) -> (f64, f64) {
    split_of(
        functions,
        total,
        ["kiln_hot_a", "kiln_hot_b", "kiln_main_loop"],
    )
}

/// `a`'s share of `a` + `b`, in percent, and the share of samples under `root`.
fn split_of(
    functions: &std::collections::HashMap<String, (i64, i64)>,
    total: i64,
    [a, b, root]: [&str; 3],
) -> (f64, f64) {
    let total_of = |name: &str| functions.get(name).map_or(0, |v| v.1) as f64;
    let (a, b) = (total_of(a), total_of(b));
    assert!(a + b > 0.0, "{functions:?}");
    (
        100.0 * a / (a + b),
        100.0 * total_of(root) / total.max(1) as f64,
    )
}

/// The share of self value in frames still shown as `binary+0xoffset`.
fn unnamed_share(
    functions: &std::collections::HashMap<String, (i64, i64)>,
    total: i64,
    binary: &str,
) -> f64 {
    let unnamed: i64 = functions
        .iter()
        .filter(|(name, _)| name.starts_with(&format!("{binary}+0x")))
        .map(|(_, (flat, _))| flat)
        .sum();
    unnamed as f64 / total.max(1) as f64
}

fn ratio_metric(server: &TestServer, service: &str) -> Option<f64> {
    let prefix = format!(
        r#"kiln_symbolization_unsymbolized_ratio{{tenant="anonymous",service="{service}"}} "#
    );
    server
        .metrics()
        .lines()
        .find_map(|line| line.strip_prefix(&prefix)?.parse().ok())
}

/// Upload path: stored unnamed, named after `kiln debuginfo upload` with inlined frames,
/// the split equal to the unstripped build's within ±3 points, the unsymbolized ratio
/// from > 0.9 to < 0.01.
#[test]
fn an_uploaded_debug_file_names_a_stripped_programs_stored_frames() {
    let Some(builds) = builds("kiln_sym_upload") else {
        return;
    };
    let Some((server, (full, stripped))) = profiled(&builds, |_| {}) else {
        return;
    };

    let (named, named_total) = functions_of_pid(&server, full);
    let (full_split, full_root) = split(&named, named_total);
    assert!(
        named.contains_key("kiln_mix_a"),
        "the unstripped build's inlined frame: {named:?}"
    );

    let (before, before_total) = functions_of_pid(&server, stripped);
    let unnamed_before = unnamed_share(&before, before_total, "kiln_sym_upload");
    assert!(unnamed_before > 0.9, "stored unnamed: {before:?}");
    assert!(!before.contains_key("kiln_hot_a"));
    let ratio_before = ratio_metric(&server, "kiln_sym_upload").expect("the ratio metric");
    assert!(ratio_before > 0.9, "{ratio_before}");

    // The explore page says how much is unnamed, and in which binary.
    let pid_labels = format!(r#"pid="{stripped}""#);
    let page = |shot: &str| {
        crate::ui::browser_available().then(|| {
            crate::ui::run_script(
                "symbols_test.mjs",
                &server,
                &["kiln_sym_upload", &pid_labels, shot],
            )
        })
    };
    if let Some(seen) = page("40-symbols-unnamed") {
        assert_eq!(seen["noticeShown"], true, "{seen:#}");
        let notice = seen["notice"].as_str().unwrap_or_default();
        assert!(
            notice.contains(&format!(
                "(kiln_sym_upload, build id {}",
                build_id_of(&builds.stripped)
            )),
            "the stripped binary first, with its build id: {notice}"
        );
        assert!(
            seen["unnamedShare"].as_f64().unwrap_or(0.0) > 0.9,
            "{seen:#}"
        );
    }

    let printed = upload(&server, &builds.debug);
    assert!(printed.contains("inline frames"), "{printed}");
    if let Some(seen) = page("41-symbols-named") {
        assert_eq!(seen["noticeShown"], false, "{seen:#}");
        assert!(
            seen["unnamedShare"].as_f64().unwrap_or(1.0) < 0.01,
            "{seen:#}"
        );
        let top = seen["functions"].to_string();
        assert!(top.contains("kiln_mix_a"), "{top}");
    }

    let (after, after_total) = functions_of_pid(&server, stripped);
    assert_eq!(
        after_total, before_total,
        "the same samples, nothing re-ingested"
    );
    let (stripped_split, stripped_root) = split(&after, after_total);
    println!(
        "unstripped: kiln_hot_a {full_split:.1} %, main loop {full_root:.1} %; stripped after upload: \
         kiln_hot_a {stripped_split:.1} %, main loop {stripped_root:.1} %; unnamed {:.1} % -> {:.1} %",
        100.0 * unnamed_before,
        100.0 * unnamed_share(&after, after_total, "kiln_sym_upload"),
    );
    assert!(
        (stripped_split - full_split).abs() <= 3.0,
        "{stripped_split} vs {full_split}"
    );
    assert!(
        after.contains_key("kiln_mix_a") && after.contains_key("kiln_mix_b"),
        "{after:?}"
    );
    // The inlined callee holds the time, not its caller.
    let (mix_self, hot_self) = (after["kiln_mix_a"].0, after["kiln_hot_a"].0);
    assert!(
        mix_self > hot_self,
        "kiln_mix_a self {mix_self} vs kiln_hot_a self {hot_self}"
    );
    assert!(stripped_root >= 90.0, "{stripped_root}");
    assert!(unnamed_share(&after, after_total, "kiln_sym_upload") < 0.01);
    let ratio_after = ratio_metric(&server, "kiln_sym_upload").unwrap();
    assert!(ratio_after < 0.01, "{ratio_after}");
    println!("kiln_symbolization_unsymbolized_ratio: {ratio_before:.3} -> {ratio_after:.4}");

    // The pprof export carries the names, with file and line.
    let profile = merged_pprof(&server, CPU, &format!(r#"{{pid="{stripped}"}}"#));
    let mix = profile
        .function
        .iter()
        .find(|f| profile.string_or_empty(f.name) == "kiln_mix_a")
        .expect("kiln_mix_a in the pprof");
    assert!(profile.string_or_empty(mix.filename).ends_with("inline.c"));

    // What is held, by build id; another tenant holds nothing.
    let id = build_id_of(&builds.stripped);
    let held = server.json(&format!("/api/v1/debuginfo/{id}"), &[]);
    assert_eq!(held["origin"], "upload", "{held}");
    assert_eq!(held["inline_frames"], true, "{held}");
    let (status, text) = server.get_with(
        &format!("/api/v1/debuginfo/{id}"),
        &[("X-Scope-OrgID", "someone-else")],
    );
    assert_eq!(status, 404, "{text}");
    // A file that is not the build id's is refused with the reason.
    let (status, text) = server.put_bytes(
        &format!("/api/v1/debuginfo/{}", "ab".repeat(20)),
        &std::fs::read(&builds.debug).unwrap(),
    );
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("build id"), "{text}");
    let (status, text) = server.put_bytes("/api/v1/debuginfo/not-hex", b"x");
    assert_eq!(status, 400, "{text}");
}

/// `kiln debuginfo upload FILE --url …`, and what it printed.
fn upload(server: &TestServer, file: &Path) -> String {
    run_kiln([
        "debuginfo".as_ref(),
        "upload".as_ref(),
        file.as_os_str(),
        "--url".as_ref(),
        server.url.as_ref(),
    ])
}

/// What `readelf FLAG PATH` prints.
fn readelf(flag: &str, path: &Path) -> String {
    let output = Command::new("readelf")
        .arg(flag)
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn build_id_of(path: &Path) -> String {
    readelf("-n", path)
        .lines()
        .find_map(|line| line.trim().strip_prefix("Build ID: "))
        .expect("a build id")
        .trim()
        .to_string()
}

/// elfutils' debuginfod on loopback serving `dir`, once it serves `build_id`.
fn debuginfod(dir: &Path, build_id: &str) -> Option<(Child, String)> {
    let port = free_port();
    let child = Command::new("debuginfod")
        .arg("-F")
        .args(["-p", &port.to_string(), "-t", "1", "-g", "0", "-d"])
        .arg(dir.join("index.sqlite"))
        .arg(dir.join("files"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let Ok(mut child) = child else {
        println!("skipped: the debuginfod test (no debuginfod: Debian's debuginfod package)");
        return None;
    };
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let served = ureq::get(&format!("{url}/buildid/{build_id}/debuginfo"))
            .call()
            .is_ok();
        if served {
            return Some((child, url));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = child.kill();
    panic!("debuginfod never served {build_id}");
}

/// debuginfod path: `symbolization.debuginfod_urls` names the frames at the first query;
/// a restart of Kiln, debuginfod gone, fetches nothing and names them still.
#[test]
fn a_debuginfod_server_names_a_stripped_program_once() {
    let Some(builds) = builds("kiln_sym_debuginfod") else {
        return;
    };
    let served = tempfile::tempdir().unwrap();
    std::fs::create_dir(served.path().join("files")).unwrap();
    std::fs::copy(&builds.debug, served.path().join("files/program.debug")).unwrap();
    let id = build_id_of(&builds.stripped);
    let Some((mut debuginfod, url)) = debuginfod(served.path(), &id) else {
        return;
    };
    let profiled = profiled(&builds, |config| {
        config.symbolization.debuginfod_urls = vec![url.clone()];
    });
    let Some((server, (full, stripped))) = profiled else {
        let _ = debuginfod.kill();
        return;
    };
    let (named, named_total) = functions_of_pid(&server, full);
    let (full_split, _) = split(&named, named_total);
    let (after, after_total) = functions_of_pid(&server, stripped);
    let (stripped_split, root) = split(&after, after_total);
    println!("debuginfod: kiln_hot_a {stripped_split:.1} % (unstripped {full_split:.1} %), main loop {root:.1} %");
    assert!((stripped_split - full_split).abs() <= 3.0);
    assert!(after.contains_key("kiln_mix_a"), "{after:?}");
    let fetched = r#"kiln_symbolization_debug_files_total{source="debuginfod",result="found"}"#;
    assert_eq!(server.counter(fetched), 1.0, "fetched once");
    let _ = debuginfod.kill();
    let _ = debuginfod.wait();

    let server = server.restart_with(|config| {
        config.symbolization.debuginfod_urls = vec![url.clone()];
    });
    let (again, _) = functions_of_pid(&server, stripped);
    assert!(
        again.contains_key("kiln_hot_a") && again.contains_key("kiln_mix_a"),
        "{again:?}"
    );
    assert_eq!(
        server.counter(fetched),
        0.0,
        "nothing fetched after the restart"
    );
    let stored = r#"kiln_symbolization_debug_files_total{source="object_store",result="found"}"#;
    assert_eq!(server.counter(stored), 1.0);
}

/// A stripped Rust release build (tests/agent/burner.rs, no frame pointers: unwound by
/// its CFI, which `strip` keeps), named from its uploaded debug file with its
/// demangled paths, split as the unstripped build's.
#[test]
fn a_stripped_rust_binary_is_named_with_demangled_paths() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let Some(builds) = split_build("kiln_sym_rust", |output| {
        Command::new(&rustc)
            .args([
                "-C",
                "opt-level=3",
                "-g",
                "--crate-name",
                "kiln_sym_rust",
                "-o",
            ])
            .arg(output)
            .arg(workspace_root().join("tests/agent/burner.rs"))
            .status()
            .is_ok_and(|s| s.success())
    }) else {
        return;
    };
    let Some((server, (full, stripped))) = profiled(&builds, |_| {}) else {
        return;
    };
    let names = [
        "kiln_sym_rust::kiln_hot_a",
        "kiln_sym_rust::kiln_hot_b",
        "kiln_sym_rust::main",
    ];
    let (named, named_total) = functions_of_pid(&server, full);
    let (full_split, _) = split_of(&named, named_total, names);
    let (before, before_total) = functions_of_pid(&server, stripped);
    assert!(
        unnamed_share(&before, before_total, "kiln_sym_rust") > 0.9,
        "{before:?}"
    );
    upload(&server, &builds.debug);
    let (after, after_total) = functions_of_pid(&server, stripped);
    let (stripped_split, root) = split_of(&after, after_total, names);
    println!(
        "rust: kiln_hot_a {stripped_split:.1} % stripped and named (unstripped {full_split:.1} %), main {root:.1} %, unnamed {:.1} %",
        100.0 * unnamed_share(&after, after_total, "kiln_sym_rust")
    );
    assert!((stripped_split - full_split).abs() <= 3.0);
    assert!(root >= 90.0, "{after:?}");
    assert!(
        !after
            .keys()
            .any(|name| name.starts_with("_ZN") || name.starts_with("_R")),
        "demangled: {after:?}"
    );
}

/// tests/symbolize/spin.go built as is (`<name>_full`) and with `-ldflags="-s -w"`
/// (`<name>`), as Go release builds ship; the stripped binary is its own debug file.
/// `None` without a Go toolchain (the test says it skipped).
fn go_builds(name: &str) -> Option<Builds> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        workspace_root().join("tests/symbolize/spin.go"),
        dir.path().join("main.go"),
    )
    .unwrap();
    std::fs::write(dir.path().join("go.mod"), "module spin\n\ngo 1.21\n").unwrap();
    let go = |output: &str, flags: &[&str]| {
        Command::new("go")
            .arg("build")
            .args(flags)
            .args(["-o", output, "."])
            .current_dir(dir.path())
            .env("GOTOOLCHAIN", "local")
            .env("CGO_ENABLED", "0")
            .status()
            .is_ok_and(|s| s.success())
    };
    if !go(&format!("{name}_full"), &[]) {
        println!("skipped: symbolization test {name} (no Go toolchain)");
        return None;
    }
    assert!(go(name, &["-ldflags=-s -w"]));
    let stripped = dir.path().join(name);
    Some(Builds {
        full: dir.path().join(format!("{name}_full")),
        debug: stripped.clone(),
        stripped,
        _dir: dir,
    })
}

/// main.main, not main.mainLoop: hotA and hotB are leaves with no frame of their own (Go
/// sets up no frame pointer there), so a frame-pointer walk from them goes on at their
/// caller's caller, in both builds.
const GO_NAMES: [&str; 3] = ["main.hotA", "main.hotB", "main.main"];

/// main.mixA's share of main.hotA: the inlined callee as a frame of its own.
fn go_inlined(functions: &std::collections::HashMap<String, (i64, i64)>) -> f64 {
    functions.get("main.mixA").map_or(0, |v| v.1) as f64
        / functions.get("main.hotA").map_or(1, |v| v.1).max(1) as f64
}

/// The stripped build named as the unstripped one: the split within ±3 points, main.main
/// over 90 %, the inlined main.mixA as large a share of main.hotA, nothing left unnamed,
/// and the pprof export naming main.mixA's file.
fn assert_go_named(server: &TestServer, (full, stripped): (u32, u32), how: &str) {
    let (named, named_total) = functions_of_pid(server, full);
    let (full_split, _) = split_of(&named, named_total, GO_NAMES);
    let (functions, total) = functions_of_pid(server, stripped);
    let (stripped_split, root) = split_of(&functions, total, GO_NAMES);
    let unnamed = unnamed_share(&functions, total, "kiln_sym_go");
    println!(
        "go, {how}: main.hotA {stripped_split:.1} % stripped (unstripped {full_split:.1} %), \
         main.main {root:.1} %, main.mixA {:.1} % of main.hotA (unstripped {:.1} %), unnamed {:.1} %",
        100.0 * go_inlined(&functions),
        100.0 * go_inlined(&named),
        100.0 * unnamed
    );
    assert!((stripped_split - full_split).abs() <= 3.0);
    assert!(root >= 90.0, "{functions:?}");
    assert!(go_inlined(&functions) >= 0.25, "{functions:?}");
    assert!((go_inlined(&functions) - go_inlined(&named)).abs() <= 0.1);
    assert!(unnamed < 0.02, "{functions:?}");
    let profile = merged_pprof(server, CPU, &format!(r#"{{pid="{stripped}"}}"#));
    let mix = profile
        .function
        .iter()
        .find(|f| profile.string_or_empty(f.name) == "main.mixA")
        .expect("main.mixA in the pprof");
    assert!(profile.string_or_empty(mix.filename).ends_with("main.go"));
}

/// A stripped Go binary under the agent is named on the host from the `.gopclntab` of the
/// binary the process runs, inlined calls included: no upload, no debug file.
#[test]
fn the_agent_names_a_stripped_go_binary_from_its_own_gopclntab() {
    let Some(builds) = go_builds("kiln_sym_go") else {
        return;
    };
    let Some((server, pids)) = profiled(&builds, |_| {}) else {
        return;
    };
    assert_go_named(&server, pids, "named by the agent");
}

/// The same program under an agent that names nothing on the host (`--symbolize false`):
/// both builds are stored unnamed; then `kiln debuginfo upload` of the stripped binary
/// itself (its `.gopclntab` is all it has) and of the unstripped one (symbols and DWARF)
/// names the stored samples, with no re-ingest, and the unsymbolized ratio falls.
#[test]
fn a_stripped_go_binary_stored_unnamed_is_named_from_an_upload_of_itself() {
    let Some(builds) = go_builds("kiln_sym_go") else {
        return;
    };
    let server = TestServer::start();
    let Some(agent) = start_agent_with(&server, &["--frequency", "997", "--symbolize", "false"])
    else {
        return;
    };
    let pids = profile(&server, &builds, 6.0);
    stop(agent);
    let (before, before_total) = functions_of_pid(&server, pids.1);
    assert!(
        unnamed_share(&before, before_total, "kiln_sym_go") > 0.9,
        "{before:?}"
    );
    let ratio_before = ratio_metric(&server, "kiln_sym_go");
    let uploaded = upload(&server, &builds.stripped);
    assert!(
        uploaded.contains(&build_id_of(&builds.stripped))
            && uploaded.contains("0 symbols, .gopclntab, inline frames"),
        "{uploaded}"
    );
    upload(&server, &builds.full);
    assert_go_named(&server, pids, "named on the server from the upload");
    let ratio_after = ratio_metric(&server, "kiln_sym_go");
    println!("kiln_symbolization_unsymbolized_ratio: {ratio_before:?} -> {ratio_after:?}");
    assert!(ratio_before.is_some_and(|r| r > 0.9), "{ratio_before:?}");
    assert!(ratio_after.is_some_and(|r| r < 0.01), "{ratio_after:?}");
}

/// `kiln bench symbolize`, briefly (the figures are docs/benchmarks.md's): over a debug
/// file made from the `kiln` binary itself, every frame of the unnamed stream is named
/// after the upload, and both streams sum to the same total.
#[test]
fn the_symbolize_bench_names_every_frame_and_keeps_the_totals() {
    let output = run_kiln([
        "bench",
        "symbolize",
        "--binaries",
        "1",
        "--functions",
        "200",
        "--instances",
        "1",
        "--interval",
        "600",
        "--profiles",
        "2",
        "--samples",
        "50",
        "--turns",
        "1",
    ]);
    let unnamed = output
        .lines()
        .find(|line| line.starts_with("| 24 h flame graph, unnamed frames"))
        .unwrap_or_else(|| panic!("{output}"));
    assert_eq!(
        unnamed.trim_end_matches(" |").rsplit("| ").next(),
        Some("0"),
        "frames left unnamed: {output}"
    );
    assert!(output.contains("(equal)"), "{output}");
    assert!(output.contains("what naming adds"), "{output}");
}

/// The executable segment of `binary` as the OpenTelemetry eBPF profiler reports a
/// mapping, in the file's own address space: (start, limit, file offset), page-aligned as
/// the kernel maps it.
fn text_segment(binary: &Path) -> (u64, u64, u64) {
    let text = readelf("-lW", binary);
    let hex = |field: &str| u64::from_str_radix(field.trim_start_matches("0x"), 16).unwrap();
    let page = 4096;
    // LOAD offset vaddr paddr filesz memsz flags... align, the flags one or more words.
    text.lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() > 7 && f[0] == "LOAD" && f[6..f.len() - 1].contains(&"E"))
        .map(|f| {
            let (offset, vaddr, memsz) = (hex(f[1]), hex(f[2]), hex(f[5]));
            (
                vaddr - vaddr % page,
                (vaddr + memsz).div_ceil(page) * page,
                offset - offset % page,
            )
        })
        .expect("an executable LOAD segment")
}

/// An address of the unstripped `binary`, inside function `outer` (from its symbol), whose
/// frames are exactly `frames`, innermost first: found by naming every byte of `outer`.
fn address_with(binary: &Path, outer: &str, frames: &[&str]) -> u64 {
    let output = Command::new("nm").arg("-S").arg(binary).output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    let (start, size) = text
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .find(|fields| fields.len() == 4 && fields[3] == outer)
        .map(|f| {
            let hex = |x: &str| u64::from_str_radix(x, 16).unwrap();
            (hex(f[0]), hex(f[1]))
        })
        .unwrap_or_else(|| panic!("{outer} in nm -S"));
    let addresses: Vec<u64> = (start..start + size).collect();
    let (_, named) = kiln_symbolize::read_debug_file(binary, 1 << 30, &addresses).unwrap();
    addresses
        .iter()
        .zip(named)
        .find(|(_, named)| {
            named
                .iter()
                .map(|f| f.name.as_str())
                .eq(frames.iter().copied())
        })
        .map(|(address, _)| *address)
        .unwrap_or_else(|| panic!("an address of {outer} named {frames:?}"))
}

/// Native frames as the OpenTelemetry eBPF profiler sends them over OTLP
/// (tests/otlp/ebpf_profiler_shape.py): addresses and mappings in the file's own address
/// space, the GNU build id after the profiler's own file hash, a Python frame at the root.
/// Stored unnamed, shown as `binary+0xoffset` at the offsets the agent would show, kept
/// under the GNU build id, and named after `kiln debuginfo upload` with inlined calls,
/// the values exact.
#[test]
fn otlp_native_frames_of_the_ebpf_profiler_are_named_from_an_upload() {
    if !crate::otlp::has_python_otlp() {
        println!("skipped: the eBPF profiler's OTLP shape (Python opentelemetry-proto and grpcio are not installed)");
        return;
    }
    let Some(builds) = builds("kiln_sym_otlp") else {
        return;
    };
    let build_id = build_id_of(&builds.stripped);
    let (start, limit, offset) = text_segment(&builds.stripped);
    let in_a = address_with(&builds.full, "kiln_hot_a", &["kiln_mix_a", "kiln_hot_a"]);
    let in_b = address_with(&builds.full, "kiln_hot_b", &["kiln_mix_b", "kiln_hot_b"]);
    let in_loop = address_with(&builds.full, "kiln_main_loop", &["kiln_main_loop"]);
    let server = TestServer::start();
    let spec = serde_json::json!({
        "service": "kiln-otlp-ebpf",
        "binary": builds.stripped.to_string_lossy(),
        "build_id": build_id,
        "htlhash": "0123456789abcdef0123456789abcdef",
        "segment": [start, limit, offset],
        "stacks": [[[in_a, in_loop], 70], [[in_b, in_loop], 30]],
        "python": ["handle", "app.py", 12],
    });
    let output = Command::new("python3")
        .arg(workspace_root().join("tests/otlp/ebpf_profiler_shape.py"))
        .arg(server.url.trim_start_matches("http://"))
        .arg(spec.to_string())
        .output()
        .expect("python3 runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    const TYPE: &str = "process_cpu:samples:count:cpu:nanoseconds";
    let selector = r#"{service_name="kiln-otlp-ebpf"}"#;
    let paths = || -> Vec<(Vec<String>, i64)> {
        let tree = crate::agent::tree_of(&server, TYPE, selector);
        let mut paths = kiln_query::merge::read_tree_bytes(&tree).expect("tree");
        paths.retain(|(_, value)| *value != 0);
        paths.sort();
        paths
    };
    let file_offset = |address: u64| format!("kiln_sym_otlp+0x{:x}", address - start + offset);
    let path = |frames: &[String]| -> Vec<String> { frames.to_vec() };
    let before = paths();
    let mut expected = vec![
        (
            path(&["handle".into(), file_offset(in_loop), file_offset(in_a)]),
            70,
        ),
        (
            path(&["handle".into(), file_offset(in_loop), file_offset(in_b)]),
            30,
        ),
    ];
    expected.sort();
    assert_eq!(before, expected);
    let profile = merged_pprof(&server, TYPE, selector);
    let build_ids: Vec<String> = profile
        .mapping
        .iter()
        .map(|m| profile.string_or_empty(m.build_id).to_string())
        .collect();
    assert_eq!(
        build_ids,
        vec![build_id.clone()],
        "the GNU build id is kept"
    );
    upload(&server, &builds.debug);
    let after = paths();
    let named = |leaf: &[&str]| -> Vec<String> {
        ["handle", "kiln_main_loop"]
            .iter()
            .chain(leaf)
            .map(|s| s.to_string())
            .collect()
    };
    assert_eq!(
        after,
        vec![
            (named(&["kiln_hot_a", "kiln_mix_a"]), 70),
            (named(&["kiln_hot_b", "kiln_mix_b"]), 30),
        ]
    );
    println!(
        "the eBPF profiler's OTLP shape: {} -> {:?} and {:?}",
        file_offset(in_a),
        after[0].0,
        after[1].0
    );
}

/// A debug file past `symbolization.max_debuginfo_bytes` is refused with 413 and the
/// limit named, whether its length is declared (refused before it is read) or it comes
/// chunked (refused once it passes the limit); nothing is kept, and `kiln debuginfo
/// upload` fails with the server's message.
#[test]
fn a_debug_file_past_the_limit_is_refused_with_413() {
    let Some(builds) = builds("kiln_sym_large") else {
        return;
    };
    let file = std::fs::read(&builds.debug).unwrap();
    let limit = (file.len() / 2) as u64;
    let server = TestServer::start_with(|config| config.symbolization.max_debuginfo_bytes = limit);
    let id = build_id_of(&builds.debug);
    let path = format!("/api/v1/debuginfo/{id}");
    let (status, text) = server.put_bytes(&path, &file);
    assert_eq!(status, 413, "{text}");
    assert!(
        text.contains(&format!(
            "{} bytes (Content-Length) exceeds the limit of {limit} bytes (symbolization.max_debuginfo_bytes)",
            file.len()
        )),
        "{text}"
    );
    let chunked = TestServer::agent()
        .put(&format!("{}{path}", server.url))
        .send(std::io::Cursor::new(file.clone()));
    let (status, text) = response_text(chunked);
    assert_eq!(status, 413, "{text}");
    assert!(
        text.contains(&format!(
            "is more than the {limit} allowed (symbolization.max_debuginfo_bytes)"
        )),
        "{text}"
    );
    let (status, _) = server.get(&path);
    assert_eq!(status, 404, "nothing kept");
    let output = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["debuginfo", "upload"])
        .arg(&builds.debug)
        .args(["--url", &server.url])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("max_debuginfo_bytes"), "{stderr}");
    println!("past the limit: 413 \"{}\"", text.trim());
}
