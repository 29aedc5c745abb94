//! `kiln debuginfo upload FILE|DIR...`: debug files to a server, each stored once under
//! its GNU build id, so that the frames of stripped binaries with that id are named
//! (docs/symbolization.md). `kiln debuginfo show BUILD_ID` says what a server holds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};

use crate::query::ServerAddress;

#[derive(Args)]
pub struct DebuginfoArgs {
    #[command(flatten)]
    server: ServerAddress,
    #[command(subcommand)]
    command: DebuginfoCommand,
}

#[derive(Subcommand)]
enum DebuginfoCommand {
    /// Upload debug files: `objcopy --only-keep-debug` output, unstripped binaries, or
    /// directories of them (searched whole). Of several files with one build id (a
    /// stripped binary beside its debug file), the one that names the most is sent.
    Upload {
        /// Debug files, binaries, or directories of them.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Longest one upload may take, in seconds.
        #[arg(long, default_value_t = 600)]
        timeout_secs: u64,
    },
    /// What the server holds for a build id.
    Show { build_id: String },
}

/// The largest file looked at locally (the server's default limit).
const MAX_BYTES: u64 = 2 << 30;

pub fn run(args: DebuginfoArgs) -> anyhow::Result<()> {
    match args.command {
        DebuginfoCommand::Upload {
            paths,
            timeout_secs,
        } => upload(&args.server, &paths, Duration::from_secs(timeout_secs)),
        DebuginfoCommand::Show { build_id } => show(&args.server, &build_id),
    }
}

fn files_under(path: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let metadata =
        std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    if metadata.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .with_context(|| format!("cannot list {}", path.display()))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .collect();
        entries.sort();
        for entry in entries {
            files_under(&entry, out)?;
        }
    } else if metadata.is_file() {
        out.push(path.to_path_buf());
    }
    Ok(())
}

/// How much a file names: DWARF lines and inline frames over symbols alone.
fn rank(contents: &kiln_symbolize::Contents) -> (bool, bool, u64) {
    (contents.lines, contents.inline_frames, contents.symbols)
}

fn upload(server: &ServerAddress, paths: &[PathBuf], timeout: Duration) -> anyhow::Result<()> {
    let mut files = Vec::new();
    for path in paths {
        files_under(path, &mut files)?;
    }
    let named_one = paths.len() == 1 && files.len() == 1;
    // Build id → the best file of it.
    let mut best: BTreeMap<String, (PathBuf, kiln_symbolize::Contents)> = BTreeMap::new();
    for file in &files {
        match kiln_symbolize::elf::inspect(file, MAX_BYTES) {
            Ok(contents) => {
                let better = best
                    .get(&contents.build_id)
                    .is_none_or(|(_, held)| rank(&contents) > rank(held));
                if better {
                    best.insert(contents.build_id.clone(), (file.clone(), contents));
                }
            }
            // A directory holds other files too: said, not fatal. A file named alone is.
            Err(err) if named_one => anyhow::bail!("{}: {err}", file.display()),
            Err(err) => eprintln!("skipped {}: {err}", file.display()),
        }
    }
    if best.is_empty() {
        anyhow::bail!(
            "no debug file with a build id among {} file(s)",
            files.len()
        );
    }
    let client = server.auth.blocking(timeout)?;
    let authorization = server.auth.authorization()?;
    let base = server.url.trim_end_matches('/');
    for (build_id, (file, contents)) in &best {
        let handle =
            std::fs::File::open(file).with_context(|| format!("cannot open {}", file.display()))?;
        let mut request = client
            .put(format!("{base}/api/v1/debuginfo/{build_id}"))
            .header("content-type", "application/octet-stream")
            .body(reqwest::blocking::Body::sized(handle, contents.bytes));
        if let Some(tenant) = &server.tenant {
            request = request.header("X-Scope-OrgID", tenant);
        }
        if let Some(authorization) = &authorization {
            request = request.header("Authorization", authorization);
        }
        let response = request
            .send()
            .with_context(|| format!("cannot upload {} to {base}", file.display()))?;
        let status = response.status();
        let text = response.text().unwrap_or_default();
        if !status.is_success() {
            anyhow::bail!(
                "{}: the server answered {status}: {}",
                file.display(),
                text.trim()
            );
        }
        println!(
            "{build_id} {} ({} bytes: {} symbols{}{}{})",
            file.display(),
            contents.bytes,
            contents.symbols,
            if contents.lines { ", lines" } else { "" },
            if contents.go_pclntab {
                ", .gopclntab"
            } else {
                ""
            },
            if contents.inline_frames {
                ", inline frames"
            } else {
                ""
            },
        );
    }
    Ok(())
}

fn show(server: &ServerAddress, build_id: &str) -> anyhow::Result<()> {
    let client = server.auth.blocking(Duration::from_secs(120))?;
    let base = server.url.trim_end_matches('/');
    let mut request = client.get(format!("{base}/api/v1/debuginfo/{build_id}"));
    if let Some(tenant) = &server.tenant {
        request = request.header("X-Scope-OrgID", tenant);
    }
    if let Some(authorization) = server.auth.authorization()? {
        request = request.header("Authorization", authorization);
    }
    let response = request
        .send()
        .with_context(|| format!("cannot reach {base}"))?;
    let status = response.status();
    let text = response.text().unwrap_or_default();
    if !status.is_success() {
        anyhow::bail!("the server answered {status}: {}", text.trim());
    }
    println!("{}", text.trim());
    Ok(())
}
