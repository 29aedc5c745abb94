//! The fuzz targets' inputs worth keeping, run on every test run: each target's body
//! (`fuzz/src/targets.rs`, included here by path, the same code libFuzzer runs) over every
//! file of `fuzz/regressions/<target>/`, the corpus `cargo fuzz cmin` left after the runs
//! recorded in docs/security.md. A panic names the target and the file.

#[path = "../../../fuzz/src/targets.rs"]
#[allow(dead_code)]
mod targets;

use std::path::Path;

type Target = (&'static str, fn(&[u8]));

const TARGETS: &[Target] = &[
    ("agent_records", targets::agent_records),
    ("block_decode", targets::block_decode),
    ("compare_request", targets::compare_request),
    ("config_parse", targets::config_parse),
    ("debuginfo_read", targets::debuginfo_read),
    ("folded_parse", targets::folded_parse),
    ("gosym_read", targets::gosym_read),
    ("ingest_name", targets::ingest_name),
    ("jfr_parse", targets::jfr_parse),
    ("otlp_decode", targets::otlp_decode),
    ("partial_tree", targets::partial_tree),
    ("perf_script_parse", targets::perf_script_parse),
    ("pprof_decode", targets::pprof_decode),
    ("profefe_parse", targets::profefe_parse),
    ("push_decode", targets::push_decode),
    ("rule_parse", targets::rule_parse),
    ("scrape_response", targets::scrape_response),
    ("selector_parse", targets::selector_parse),
    ("source_url", targets::source_url),
    ("speedscope_parse", targets::speedscope_parse),
    ("time_parse", targets::time_parse),
    ("wal_records", targets::wal_records),
];

fn fuzz_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

#[test]
fn every_fuzz_target_is_run_here_and_has_kept_inputs() {
    let mut defined: Vec<String> = std::fs::read_dir(fuzz_dir().join("fuzz_targets"))
        .expect("fuzz/fuzz_targets")
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            Some(name.strip_suffix(".rs")?.to_string())
        })
        .collect();
    defined.sort();
    let listed: Vec<&str> = TARGETS.iter().map(|(name, _)| *name).collect();
    assert_eq!(defined, listed, "a fuzz target is missing from TARGETS");
    for (name, _) in TARGETS {
        let kept = std::fs::read_dir(fuzz_dir().join("regressions").join(name))
            .map(|dir| dir.count())
            .unwrap_or(0);
        assert!(kept > 0, "fuzz/regressions/{name} holds no inputs");
    }
}

#[test]
fn kept_fuzz_inputs_run_clean() {
    // The block decoder catches the parquet crate's panics on corrupt footers (and says
    // so in an error); the default hook would print each. The last message is kept for
    // a panic that escapes.
    static LAST_PANIC: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());
    std::panic::set_hook(Box::new(|info| {
        *LAST_PANIC.lock().unwrap_or_else(|p| p.into_inner()) = info.to_string();
    }));
    let mut runs = 0;
    for (name, target) in TARGETS {
        let Ok(dir) = std::fs::read_dir(fuzz_dir().join("regressions").join(name)) else {
            continue;
        };
        for entry in dir {
            let path = entry.expect("entry").path();
            let input = std::fs::read(&path).expect("read input");
            if std::panic::catch_unwind(|| target(&input)).is_err() {
                // Copied out first, and the default hook back, so this panic is printed.
                let message = LAST_PANIC.lock().unwrap_or_else(|p| p.into_inner()).clone();
                drop(std::panic::take_hook());
                panic!("{name} panicked on {}: {message}", path.display());
            }
            runs += 1;
        }
    }
    println!("{runs} kept fuzz inputs ran clean");
}
