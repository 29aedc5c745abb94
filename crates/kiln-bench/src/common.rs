//! Helpers every bench shares, importing none of them: the `kiln server` children a
//! bench measures, their CPU time and metrics, and the corpus read as pprof.

use std::path::PathBuf;

use anyhow::Context;
pub use kiln_child::{KilnChild, KilnCommand, Log};

/// The files of a corpus directory, in name order, of at most `max_bytes`, that decode as
/// pprof: (file name, bytes as stored, decoded profile).
pub fn corpus_pprofs(
    dir: &std::path::Path,
    max_bytes: usize,
) -> anyhow::Result<Vec<(String, Vec<u8>, kiln_model::pprof::Profile)>> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read corpus {}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.is_file())
        .collect();
    entries.sort();
    let mut profiles = Vec::new();
    for path in entries {
        let bytes = std::fs::read(&path)?;
        if bytes.len() > max_bytes {
            continue;
        }
        let Ok(profile) = kiln_model::pprof::decode(&bytes, 64 << 20) else {
            continue;
        };
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        profiles.push((name, bytes, profile));
    }
    Ok(profiles)
}

/// Starts `kiln server` as a child process on `data_dir` and waits until it is ready;
/// returns the child and its URL. A child, so that its CPU time and memory can be told
/// from the load generator's, which shares the machine. `KILN_BENCH_SERVER` names another
/// `kiln` binary to start instead, so that two builds are compared under the same load
/// generator. Compaction is off: it is measured on its own, and here it would compete for
/// the cores.
pub fn start_server(data_dir: &std::path::Path) -> anyhow::Result<(KilnChild, String)> {
    start_server_with(data_dir, &["--compaction".into(), "false".into()])
}

/// [`start_server`] with other server flags instead of `--compaction false`.
pub fn start_server_with(
    data_dir: &std::path::Path,
    flags: &[std::ffi::OsString],
) -> anyhow::Result<(KilnChild, String)> {
    start_server_pinned(data_dir, flags, &[])
}

/// [`start_server_with`] on only these CPUs (`taskset`), when not empty: one process
/// standing for a machine of its own.
pub fn start_server_pinned(
    data_dir: &std::path::Path,
    flags: &[std::ffi::OsString],
    cpus: &[usize],
) -> anyhow::Result<(KilnChild, String)> {
    let child = KilnCommand::server(this_kiln()?, data_dir)
        .args(flags)
        .cpus(cpus)
        .start()?;
    let url = child.url();
    Ok((child, url))
}

/// The `kiln` a bench starts its servers from: `KILN_BENCH_SERVER`, else this one.
pub fn this_kiln() -> anyhow::Result<std::path::PathBuf> {
    Ok(match std::env::var_os("KILN_BENCH_SERVER") {
        Some(binary) => std::path::PathBuf::from(binary),
        None => std::env::current_exe().context("cannot find the kiln binary")?,
    })
}

/// User plus system CPU seconds of a process, from `/proc/PID/stat` (Linux; clock ticks are
/// 100 per second there).
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// One counter's value from the server's `/metrics`.
pub fn metric(url: &str, name: &str) -> anyhow::Result<f64> {
    let text = crate::http::get(&format!("{url}/metrics")).call()?.text();
    Ok(text
        .lines()
        .filter(|line| line.starts_with(name))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// An empty directory of this process's own under the temporary directory.
pub fn tempfile_dir(prefix: &str) -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
