//! `kiln bench symbolize`: the cost of naming frames on the server (kiln-symbolize).
//!
//! Debug files: `--binaries` copies of one binary with symbols and DWARF (by default this
//! `kiln` executable, whose release build carries ~150 MB of DWARF), each given a build id
//! of its own, so the symbolizer parses each one as a binary of its own. The stream: a
//! day of one service, `--instances` instances sending a CPU profile every `--interval`
//! seconds, each profile's stacks running through `--functions` functions of every
//! binary. It is written twice, straight into blocks as compaction leaves them: once with
//! every frame unnamed (mapping, build id and address, as the agent sends a stripped
//! binary's), once with the same frames already named as the server names them (inlined
//! calls included, as an agent names an unstripped binary's).
//!
//! Measured in this process, through the query engine as a query node runs it (no HTTP):
//! the 24 h flame graph over the unnamed stream after the debug files were uploaded,
//! first and warm (the first parses every debug file and names every address); the
//! process's anonymous memory before and after that first query; and over the named
//! stream, the first query of a fresh querier with the symbolizer and without it, turn
//! about: what naming costs a query that has nothing to name.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use kiln_model::build::PprofBuilder;
use kiln_model::pprof::{Mapping, ValueType};
use kiln_query::root::Root;
use kiln_query::select::TypeFilter;
use kiln_query::tree::FlameTree;
use kiln_query::SelectRequest;
use object::{Object, ObjectSegment, ObjectSymbol};

use crate::stream::{write_stream, StreamShape, Template, CPU, HOUR_NANOS};

#[derive(Args)]
pub struct SymbolizeBenchArgs {
    /// A binary with symbols and DWARF to make the debug files from [default: this kiln
    /// executable].
    #[arg(long)]
    binary: Option<PathBuf>,
    /// Debug files (copies of the binary with build ids of their own).
    #[arg(long, default_value_t = 5)]
    binaries: usize,
    /// Functions of each binary that stacks run through.
    #[arg(long, default_value_t = 2000)]
    functions: usize,
    #[arg(long, default_value_t = 10)]
    instances: usize,
    /// Seconds between two profiles of one instance.
    #[arg(long, default_value_t = 10)]
    interval: i64,
    /// Distinct profiles the stream takes turns with.
    #[arg(long, default_value_t = 7)]
    profiles: usize,
    /// Samples (distinct stacks) per profile.
    #[arg(long, default_value_t = 400)]
    samples: usize,
    /// Turns of the named stream's A/B (a fresh querier with and without the symbolizer).
    #[arg(long, default_value_t = 15)]
    turns: usize,
    /// `symbolization.memory_bytes` of the unnamed stream's symbolizer (`512MiB`, `4GiB`).
    #[arg(long, default_value = "512MiB", value_parser = kiln_model::size::parse_bytes)]
    memory_bytes: u64,
}

/// Where the bench pretends binary N's text was mapped: 4 GiB apart.
const MAPPED_AT: u64 = 0x7f00_0000_0000;

struct Binary {
    /// (address in the file, name) of the functions stacks use.
    functions: Vec<(u64, String)>,
    /// The frames at each of those addresses, innermost first, as the server names them
    /// from the binary's DWARF: what the named stream's locations carry, so that both
    /// streams are the same profiles once named.
    frames: Vec<Vec<kiln_symbolize::Frame>>,
    /// The text segment's address rounded down to a page, and its mapped size.
    text_base: u64,
    text_size: u64,
}

fn read_binary(path: &Path, count: usize) -> anyhow::Result<(Binary, Vec<u8>)> {
    let data = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let elf = object::File::parse(&*data).context("not an ELF file")?;
    let text = elf
        .segments()
        .find(|s| matches!(s.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0))
        .context("no executable segment")?;
    let text_base = text.address() - text.address() % 4096;
    let text_size = (text.address() % 4096 + text.size()).div_ceil(4096) * 4096;
    let mut all: Vec<(u64, String)> = elf
        .symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text && s.size() >= 16)
        .filter_map(|s| Some((s.address() + s.size() / 2, s.name().ok()?.to_string())))
        .collect();
    all.sort();
    all.dedup_by_key(|(address, _)| *address);
    anyhow::ensure!(
        all.len() >= count,
        "{} has {} functions",
        path.display(),
        all.len()
    );
    let step = all.len() / count;
    let functions: Vec<(u64, String)> = all.into_iter().step_by(step).take(count).collect();
    if elf.build_id().ok().flatten().is_none() {
        anyhow::bail!("{} has no GNU build id", path.display());
    }
    drop(elf);
    let addresses: Vec<u64> = functions.iter().map(|(address, _)| *address).collect();
    let (_, frames) = kiln_symbolize::read_debug_file(path, u64::MAX, &addresses)
        .with_context(|| format!("{} does not symbolize", path.display()))?;
    Ok((
        Binary {
            functions,
            frames,
            text_base,
            text_size,
        },
        data,
    ))
}

/// A copy of `data` whose build id ends in `index`'s bytes: a binary of its own to the
/// symbolizer, the rest of the file unchanged.
fn with_build_id(data: &[u8], index: usize) -> anyhow::Result<(Vec<u8>, String)> {
    let elf = object::File::parse(data)?;
    let id = elf.build_id()?.context("no build id")?;
    let at = id.as_ptr() as usize - data.as_ptr() as usize;
    let len = id.len();
    drop(elf);
    let mut copy = data.to_vec();
    let tail = (index as u32 + 1).to_be_bytes();
    copy[at + len - 4..at + len].copy_from_slice(&tail);
    Ok((copy.clone(), kiln_symbolize::elf::hex(&copy[at..at + len])))
}

/// A deterministic generator (splitmix64): the two streams must hold the same stacks.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Skewed toward small values, as a profile's hot functions are few.
    fn skewed(&mut self, below: usize) -> usize {
        let a = self.next() as usize % below;
        let b = self.next() as usize % below;
        a.min(b)
    }
}

/// One CPU profile per seed over `binary`'s functions in `ids.len()` mappings, its frames
/// unnamed (address only) or named (a line each, the symbol's name).
fn template(
    binary: &Binary,
    ids: &[String],
    args: &SymbolizeBenchArgs,
    seed: u64,
    named: bool,
) -> anyhow::Result<Template> {
    let mut builder = PprofBuilder::default();
    let sample_type =
        [("samples", "count"), ("cpu", "nanoseconds")].map(|(kind, unit)| ValueType {
            r#type: builder.string(kind),
            unit: builder.string(unit),
        });
    let period_type = sample_type[1];
    {
        let profile = builder.profile_mut();
        profile.sample_type = sample_type.to_vec();
        profile.period_type = Some(period_type);
        profile.period = 10_000_000;
        profile.duration_nanos = 10_000_000_000;
    }
    let mappings: Vec<u64> = ids
        .iter()
        .enumerate()
        .map(|(index, id)| {
            let start = MAPPED_AT + ((index as u64) << 32);
            let mapping = Mapping {
                memory_start: start,
                memory_limit: start + binary.text_size,
                file_offset: 0,
                filename: builder.string(&format!("/usr/bin/service-{index}")),
                build_id: builder.string(id),
                ..Default::default()
            };
            builder.mapping(mapping)
        })
        .collect();
    let mut rng = Rng(seed);
    for _ in 0..args.samples {
        let depth = 6 + rng.next() as usize % 10;
        let mut stack = Vec::with_capacity(depth);
        for _ in 0..depth {
            let index = rng.next() as usize % ids.len();
            let function = rng.skewed(binary.functions.len());
            let address = binary.functions[function].0;
            let process_address = MAPPED_AT + ((index as u64) << 32) + address - binary.text_base;
            let lines: Vec<(u64, i64)> = if named {
                binary.frames[function]
                    .iter()
                    .map(|frame| {
                        let name = builder.string(&frame.name);
                        let file = builder.string(&frame.file);
                        (builder.function(name, name, file, 0), frame.line)
                    })
                    .collect()
            } else {
                Vec::new()
            };
            stack.push(builder.location(mappings[index], process_address, &lines));
        }
        let count = 1 + rng.next() as i64 % 20;
        builder.add_sample(stack, &[count, count * 10_000_000], Vec::new());
    }
    let profile = builder.finish();
    let bytes = profile.encode_to_bytes();
    let limits = kiln_ingest::Limits {
        max_samples_per_profile: usize::MAX,
        retention_days: 0,
        ..Default::default()
    };
    let parsed = kiln_ingest::parse::from_pprof(
        profile,
        kiln_ingest::parse::ProfileContext::default(),
        bytes.len(),
        &limits,
    )?;
    Ok(Template {
        name: format!("{}-{seed}", if named { "named" } else { "unnamed" }),
        bytes,
        parsed,
    })
}

/// CPU time this process has used (user and system, every thread), in seconds: steadier
/// than wall time on a VM whose neighbours come and go.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes the struct it is given and nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0.0;
    }
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// A sample of the symbolizer's metrics.
fn gauge(symbolizer: &kiln_symbolize::Symbolizer, name: &str) -> f64 {
    let mut registry = prometheus_client::registry::Registry::default();
    symbolizer.register(&mut registry);
    let mut text = String::new();
    if prometheus_client::encoding::text::encode(&mut text, &registry).is_err() {
        return f64::NAN;
    }
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// This process's anonymous resident memory (heap, not mapped files), in MB.
fn anon_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status
                .lines()
                .find(|l| l.starts_with("RssAnon:"))?
                .to_string();
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

pub async fn run(args: SymbolizeBenchArgs) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("kiln-bench-symbolize-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = run_in(&args, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn run_in(args: &SymbolizeBenchArgs, dir: &Path) -> anyhow::Result<()> {
    let path = match &args.binary {
        Some(path) => path.clone(),
        None => std::env::current_exe()?,
    };
    let (binary, data) = read_binary(&path, args.functions)?;
    let dwarf: u64 = {
        let elf = object::File::parse(&*data)?;
        use object::ObjectSection;
        elf.sections()
            .filter(|s| s.name().is_ok_and(|n| n.starts_with(".debug_")))
            .map(|s| s.size())
            .sum()
    };
    let mut files = Vec::new();
    for index in 0..args.binaries {
        let (copy, id) = with_build_id(&data, index)?;
        let file = dir.join(format!("debug-{index}"));
        std::fs::write(&file, copy)?;
        files.push((file, id));
    }
    drop(data);
    let ids: Vec<String> = files.iter().map(|(_, id)| id.clone()).collect();
    println!(
        "kiln bench symbolize: {} debug files of {} ({:.0} MB, {:.0} MB of DWARF each), {} functions of each in the stacks",
        args.binaries,
        path.display(),
        std::fs::metadata(&files[0].0)?.len() as f64 / 1e6,
        dwarf as f64 / 1e6,
        args.functions
    );

    let now = kiln_model::time::now_nanos();
    let end = now - now.rem_euclid(HOUR_NANOS);
    let shape = StreamShape {
        corpus: PathBuf::new(),
        instances: args.instances,
        services: 1,
        interval: args.interval,
        max_file_bytes: usize::MAX,
        stack_sums: true,
    };
    let request = SelectRequest {
        tenant: "anonymous".into(),
        types: TypeFilter::Exact(CPU.into()),
        from_nanos: end - 24 * HOUR_NANOS,
        to_nanos: end - 1,
        values_only: true,
        ..Default::default()
    };
    let mut totals = Vec::new();
    let mut named_dirs = Vec::new();
    for named in [false, true] {
        let templates: Vec<Template> = (0..args.profiles as u64)
            .map(|seed| template(&binary, &ids, args, seed + 1, named))
            .collect::<anyhow::Result<_>>()?;
        let data_dir = dir.join(if named { "named" } else { "unnamed" });
        let (profiles, bytes) = write_stream(&shape, &templates, &data_dir, end, 24).await?;
        println!(
            "{} stream: {profiles} profiles in 24 hourly blocks, {:.1} MB",
            if named { "named" } else { "unnamed" },
            bytes as f64 / 1e6
        );
        named_dirs.push(data_dir);
    }

    // The unnamed stream, after the uploads.
    let (storage, metastore) = open(&named_dirs[0]).await?;
    let symbolizer = kiln_symbolize::Symbolizer::new(
        storage.clone(),
        named_dirs[0].join("debuginfo-cache"),
        kiln_symbolize::SymbolizationConfig {
            cache_bytes: (args.binaries as u64 + 1) * std::fs::metadata(&files[0].0)?.len(),
            memory_bytes: args.memory_bytes,
            ..Default::default()
        },
    )?;
    let started = Instant::now();
    for (file, id) in &files {
        let incoming = symbolizer.incoming();
        std::fs::copy(file, &incoming)?;
        symbolizer
            .upload("anonymous", &incoming, Some(id.as_str()))
            .await?;
    }
    let upload = started.elapsed().as_secs_f64();
    let symbolizer = Arc::new(symbolizer);
    let root =
        Root::new(kiln_query::Querier::new(metastore, storage).with_symbolizer(symbolizer.clone()));
    let before = anon_mb();
    let started = Instant::now();
    let tree = root.merged_tree(&request, 0).await?;
    let first = started.elapsed().as_secs_f64();
    let after = anon_mb();
    totals.push(total(&tree));
    let unnamed = tree_unnamed(&tree);
    let (parsed, evictions) = (
        gauge(&symbolizer, "kiln_symbolization_parsed_bytes"),
        gauge(&symbolizer, "kiln_symbolization_parsed_evictions_total"),
    );
    let mut warm = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        root.merged_tree(&request, 0).await?;
        warm.push(started.elapsed().as_secs_f64());
    }
    warm.sort_by(f64::total_cmp);
    println!();
    println!("| query | first | warm (median of 3) | anonymous memory before → after the first | frames left unnamed |");
    println!("|---|---|---|---|---|");
    println!(
        "| 24 h flame graph, unnamed frames, {} debug files uploaded ({:.1} s to upload) | {:.0} ms | {:.0} ms | {before:.0} → {after:.0} MB | {unnamed} |",
        args.binaries,
        upload,
        first * 1000.0,
        warm[1] * 1000.0
    );
    // What the first query left: the named datasets and shares (the querier's caches),
    // and the symbolizer (blazesym's parsed DWARF, the names cache). Each is dropped in
    // turn and the memory read after the allocator has returned what was freed.
    let settle = || {
        std::thread::sleep(std::time::Duration::from_secs(2));
        anon_mb()
    };
    drop(root);
    let without_caches = settle();
    drop(symbolizer);
    let without_symbolizer = settle();

    // The named stream: a fresh querier each turn, with the symbolizer and without.
    let mut with = Vec::new();
    let mut without = Vec::new();
    for turn in 0..args.turns * 2 {
        let (storage, metastore) = open(&named_dirs[1]).await?;
        let naming = turn % 2 == 0;
        let mut querier = kiln_query::Querier::new(metastore, storage.clone());
        if naming {
            let symbolizer = kiln_symbolize::Symbolizer::new(
                storage,
                named_dirs[1].join(format!("debuginfo-cache-{turn}")),
                kiln_symbolize::SymbolizationConfig::default(),
            )?;
            querier = querier.with_symbolizer(Arc::new(symbolizer));
        }
        let root = Root::new(querier);
        let started = Instant::now();
        let cpu = cpu_seconds();
        let tree = root.merged_tree(&request, 0).await?;
        let first = started.elapsed().as_secs_f64();
        let first_cpu = cpu_seconds() - cpu;
        let started = Instant::now();
        root.merged_tree(&request, 0).await?;
        let warm = started.elapsed().as_secs_f64();
        if turn == 0 {
            totals.push(total(&tree));
        }
        if naming {
            with.push((first, warm, first_cpu));
        } else {
            without.push((first, warm, first_cpu));
        }
    }
    let median = |runs: &[(f64, f64, f64)], pick: fn(&(f64, f64, f64)) -> f64| {
        let mut values: Vec<f64> = runs.iter().map(pick).collect();
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let (first_with, warm_with) = (median(&with, |r| r.0), median(&with, |r| r.1));
    let (first_without, warm_without) = (median(&without, |r| r.0), median(&without, |r| r.1));
    println!(
        "| 24 h flame graph, frames already named, a fresh querier with the symbolizer (medians of {}) | {:.0} ms | {:.0} ms | | |",
        args.turns,
        first_with * 1000.0,
        warm_with * 1000.0
    );
    println!(
        "| the same without a symbolizer | {:.0} ms | {:.0} ms | | |",
        first_without * 1000.0,
        warm_without * 1000.0
    );
    let (cpu_with, cpu_without) = (median(&with, |r| r.2), median(&without, |r| r.2));
    println!();
    println!(
        "what naming adds to a query of frames already named: first {:.3}× ({:.0} vs {:.0} ms of CPU: {:.3}×), warm {:.3}×",
        first_with / first_without,
        cpu_with * 1000.0,
        cpu_without * 1000.0,
        cpu_with / cpu_without,
        warm_with / warm_without
    );
    println!(
        "memory_bytes {:.0} MiB: parsed files held after the first query {:.0} MB by weight, {evictions} dropped for the budget",
        args.memory_bytes as f64 / (1 << 20) as f64,
        parsed / 1e6
    );
    println!(
        "anonymous memory after the unnamed stream's first query {after:.0} MB (before it {before:.0} MB); \
         with the querier's caches dropped {without_caches:.0} MB; with the symbolizer dropped too \
         {without_symbolizer:.0} MB: the symbolizer held {:.0} MB, the caches {:.0} MB",
        without_caches - without_symbolizer,
        after - without_caches
    );
    println!();
    println!(
        "totals: unnamed stream {}, named stream {} ({})",
        totals[0],
        totals[1],
        if totals[0] == totals[1] {
            "equal"
        } else {
            "DIFFERENT"
        }
    );
    Ok(())
}

/// Frames of the tree still shown as `binary+0x…`.
fn tree_unnamed(tree: &FlameTree) -> usize {
    tree.names
        .iter()
        .filter(|name| name.contains("+0x"))
        .count()
}

fn total(tree: &FlameTree) -> i64 {
    tree.nodes.first().map_or(0, |root| root.total)
}

async fn open(
    data_dir: &Path,
) -> anyhow::Result<(kiln_storage::ObjectStorage, kiln_metastore::Metastore)> {
    let storage = kiln_storage::ObjectStorage::open(&format!(
        "file://{}",
        data_dir.join("blocks").display()
    ))?;
    let metastore = kiln_metastore::Metastore::open(&format!(
        "sqlite://{}",
        data_dir.join("metastore.db").display()
    ))
    .await?;
    Ok((storage, metastore))
}
