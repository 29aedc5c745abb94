//! The fuzz targets' bodies, one function per target: `fuzz_targets/*.rs` call them under
//! libFuzzer, and `crates/kiln/tests/fuzz_regressions.rs` runs them over the inputs kept in
//! `fuzz/regressions/<target>/` on every test run (this file is included there by path).

use kiln_storage::format::Projection;
use kiln_storage::ranged::{decode_partial, BlockTail, PartialBlock};

/// The agent's parsers of bytes it does not control: perf ring records (samples with their
/// register and stack copies, mmap, comm, fork, exit, lost) and a binary's `.eh_frame_hdr`.
pub fn agent_records(data: &[u8]) {
    let _ = kiln_agent::perf::parse_timed(data);
    let _ = kiln_agent::perf::parse_record(data);
    let _ = kiln_agent::unwind::function_starts(0x1000, data);
    // The BPF rings' events, and a CPython location table as read from a process's memory.
    // (Ruby's `succinct_rank` and `exec_core`, and CPython's debug offsets, below.)
    let _ = kiln_agent::interp::Event::parse(data);
    let _ = kiln_agent::offcpu::Event::parse(data);
    for index in [0, 1, 7, u64::MAX] {
        let _ = kiln_agent::interp::python::line_of(data, 1, index);
        // CRuby's succinct line index, and the code a VM's loop is found in.
        let _ = kiln_agent::interp::ruby::succinct_rank(data, index % 100_000);
    }
    let _ = kiln_agent::interp::ruby::exec_core(0x1000, data, vec![0x1000, 0x1100, 0x9000]);
    // CPython 3.13's debug offsets, as a binary's `_PyRuntime` holds them.
    let _ = kiln_agent::interp::python::from_debug_offsets(data, (3, 13));
}

/// Block objects: a corrupt block must be an error, never a panic, whether it is decoded
/// whole or, as compaction does, from its tail and one dataset's byte range.
pub fn block_decode(data: &[u8]) {
    let block = bytes::Bytes::copy_from_slice(data);
    // Every projection a reader uses: the summed ones take another path through the
    // columns (stack sums first, then the profiles and samples only if needed).
    for projection in [Projection::ALL, Projection::SUMMED, Projection::VALUES] {
        if let Ok(dataset) = kiln_storage::format::decode_dataset(&block, 0, projection) {
            let _ = dataset.check();
        }
    }
    let len = block.len() as u64;
    let Ok(Ok(tail)) = BlockTail::parse(block.clone(), len) else {
        return;
    };
    for row_group in 0..tail.dataset_count().min(8) {
        let Ok(range) = tail.dataset_range(row_group) else {
            continue;
        };
        let part = block.slice(range.start as usize..range.end as usize);
        let (start, bytes) = tail.bytes();
        let partial = PartialBlock::new(len, vec![(range.start, part), (start, bytes.clone())]);
        if let Ok(dataset) = decode_partial(partial, row_group, Projection::ALL) {
            let _ = dataset.check();
        }
    }
}

/// Comparisons as `POST /api/v1/compare` takes them (JSON from any client): parsed,
/// checked and resolved, and ranked over sums built from the bytes; never a panic.
pub fn compare_request(data: &[u8]) {
    if let Ok(request) = serde_json::from_slice::<kiln_insight::CompareRequest>(data) {
        let _ = request.resolve(1_700_000_000_000_000_000);
    }
    // Arbitrary sides: function names and values from the bytes, ranked.
    let mut sides = [kiln_insight::stats::SideSums::default(), Default::default()];
    for (index, chunk) in data.chunks(3).enumerate() {
        let name = format!("f{}", chunk[0] % 8);
        let value = i64::from(*chunk.get(1).unwrap_or(&0)) - 16;
        sides[index % 2].add_profile([
            (name.as_str(), value),
            ("g", i64::from(*chunk.get(2).unwrap_or(&1))),
        ]);
    }
    let ranking = kiln_insight::stats::rank(&sides[0], &sides[1], &Default::default());
    for change in &ranking.functions {
        if let Some(p) = change.p_value {
            assert!((0.0..=1.0).contains(&p), "{change:?}");
        }
    }
}

/// The server's YAML config file (every section), and the checks run on it at start-up.
pub fn config_parse(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(config) = yaml_serde::from_str::<kiln_node::ServerConfig>(text) {
        let _ = kiln_auth::Authenticator::from_config(&config.auth);
        for tenant in config.auth.tenants.keys() {
            let _ = kiln_server::tenant::validate(tenant);
        }
        for rule in &config.recording_rules {
            let _ = rule.compile();
        }
        for target in &config.remote_write {
            let _ = target.check();
        }
    }
}

/// Collapsed-stack text, and the pprof it becomes; the pprof must pass validation.
pub fn folded_parse(data: &[u8]) {
    if let Ok(stacks) = kiln_model::folded::parse(data, 16_000) {
        let profile_type = kiln_model::profile_type::default_legacy_type().profile_type;
        let profile = kiln_model::folded::to_pprof(&stacks, &profile_type);
        assert!(kiln_model::pprof::validate(&profile, &Default::default()).is_ok());
    }
}

/// The `name=app.suffix{k=v}` parameter and profefe's `labels=k=v,k=v`.
pub fn ingest_name(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = kiln_ingest::pyroscope::parse_name(text);
        let _ = kiln_ingest::profefe::parse_labels(text);
    }
}

/// Debug files as uploads and debuginfod bring them (malformed ELF, DWARF that does not
/// parse, compressed sections that lie about their size): checked, and when taken, read
/// by the symbolizer at a few addresses of each executable segment. Refused or named,
/// never a panic; the sizes are bounded.
pub fn debuginfo_read(data: &[u8]) {
    use std::io::Write;
    let Ok(mut file) = tempfile_in_tmp() else {
        return;
    };
    if file.1.write_all(data).is_err() {
        return;
    }
    let limit = 64 << 20;
    let Ok(contents) = kiln_symbolize::elf::inspect(&file.0, limit) else {
        let _ = std::fs::remove_file(&file.0);
        return;
    };
    let addresses: Vec<u64> = contents
        .text_segments
        .iter()
        .flat_map(|(start, size)| [*start, start + size / 2, (start + size).saturating_sub(1)])
        .collect();
    let _ = kiln_symbolize::read_debug_file(&file.0, limit, &addresses);
    let _ = std::fs::remove_file(&file.0);
}

/// A fresh file under the system's temporary directory, and its path.
fn tempfile_in_tmp() -> std::io::Result<(std::path::PathBuf, std::fs::File)> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let path = std::env::temp_dir().join(format!(
        "kiln-fuzz-debuginfo-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let file = std::fs::File::create(&path)?;
    Ok((path, file))
}

/// JFR recordings: chunk headers, metadata, constant pools and events, into pprofs.
pub fn jfr_parse(data: &[u8]) {
    let contexts = kiln_model::jfr::Contexts::new();
    if let Ok(recordings) = kiln_model::jfr::parse(data, 10_000_000, 16_000, &contexts) {
        for recording in recordings {
            assert!(kiln_model::pprof::validate(&recording.profile, &Default::default()).is_ok());
        }
    }
}

/// OTLP profiles export requests, protobuf and JSON, through conversion and into a dataset.
pub fn otlp_decode(data: &[u8]) {
    // No retention: random times would otherwise stop most inputs before the builder.
    let limits = kiln_ingest::Limits {
        retention_days: 0,
        ..Default::default()
    };
    // The server reads binary requests with the flat reader: it must refuse what prost
    // refuses and make the same pprofs of the rest.
    let flat = kiln_ingest::otlp::parse_export_proto(data, data.len(), &limits);
    let derived = kiln_ingest::otlp::decode_proto(data)
        .ok()
        .map(|request| kiln_ingest::otlp::parse_export(request, data.len(), &limits));
    match (&flat, &derived) {
        (Ok(flat), Some(Ok(derived))) => {
            assert_eq!(flat.rejected_profiles, derived.rejected_profiles);
            assert_eq!(flat.profiles.len(), derived.profiles.len());
            for (a, b) in flat.profiles.iter().zip(&derived.profiles) {
                assert!(a.profile == b.profile && a.labels == b.labels);
            }
        }
        (Err(_), None | Some(Err(_))) => {}
        _ => panic!("the flat OTLP reader and prost disagree"),
    }
    // What the server accepts, over both encodings, builds a consistent dataset.
    let json = kiln_ingest::otlp::decode_json(data)
        .ok()
        .and_then(|request| kiln_ingest::otlp::parse_export(request, data.len(), &limits).ok());
    for export in [flat.ok(), json].into_iter().flatten() {
        for parsed in &export.profiles {
            let mut builder = kiln_storage::DatasetBuilder::new("t", parsed.service());
            builder.add_pprof(&parsed.input(1000));
            assert!(builder.finish().check().is_ok());
        }
    }
}

/// `perf script` text into a pprof.
pub fn perf_script_parse(data: &[u8]) {
    if let Ok(profile) = kiln_model::perf_script::parse(data, 16_000) {
        assert!(kiln_model::pprof::validate(&profile, &Default::default()).is_ok());
    }
}

/// pprof bytes (gzip or plain) through decode, validation and conversion to series.
pub fn pprof_decode(data: &[u8]) {
    // No retention: random times would otherwise stop most inputs before the builder.
    let limits = kiln_ingest::Limits {
        retention_days: 0,
        ..Default::default()
    };
    let context = kiln_ingest::parse::ProfileContext::default();
    if let Ok(parsed) = kiln_ingest::parse::from_pprof_bytes(data, context, &limits) {
        let mut builder = kiln_storage::DatasetBuilder::new("t", parsed.service());
        builder.add_pprof(&parsed.input(1000));
        let dataset = builder.finish();
        assert!(dataset.check().is_ok());
    }
}

/// profefe's `POST /api/0/profiles`: its query parameters (the input's first line) and its
/// pprof body (the rest).
pub fn profefe_parse(data: &[u8]) {
    let limits = kiln_ingest::Limits {
        retention_days: 0,
        ..Default::default()
    };
    let (query, body) = match data.iter().position(|&b| b == b'\n') {
        Some(end) => (&data[..end], &data[end + 1..]),
        None => (data, &[][..]),
    };
    let params: std::collections::HashMap<String, String> = String::from_utf8_lossy(query)
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if let Ok(parsed) = kiln_ingest::profefe::parse_profefe(&params, body, &limits) {
        let mut builder = kiln_storage::DatasetBuilder::new("t", parsed.service());
        builder.add_pprof(&parsed.input(1000));
        assert!(builder.finish().check().is_ok());
    }
}

/// Pyroscope PushRequest bodies, protobuf and JSON, and the profiles inside.
pub fn push_decode(data: &[u8]) {
    // No retention: random times would otherwise stop most inputs before the builder.
    let limits = kiln_ingest::Limits {
        retention_days: 0,
        ..Default::default()
    };
    if let Ok(request) = kiln_ingest::push::decode_proto(data) {
        let _ = kiln_ingest::push::parse_push(request, &limits);
    }
    if let Ok(request) = kiln_ingest::push::decode_json(data) {
        let _ = kiln_ingest::push::parse_push(request, &limits);
    }
}

/// Recording rules as the API takes them (JSON from any client) and as the outbox stores
/// series: parsed and checked, never a panic.
pub fn rule_parse(data: &[u8]) {
    if let Ok(spec) = serde_json::from_slice::<kiln_rules::rule::RuleSpec>(data) {
        if let Ok(rule) = spec.compile() {
            let _ = kiln_rules::eval::series_labels(&rule, |_| Some("x"));
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = kiln_rules::eval::parse_series_key(text);
    }
}

/// What a scrape target or an HTTP SD server may answer: the first half of the input as a
/// profile, taken twice through the delta state (baseline, then delta against a second
/// profile from the other half), and the whole input as HTTP SD target groups and as
/// relabel rules.
pub fn scrape_response(data: &[u8]) {
    let (first, second) = data.split_at(data.len() / 2);
    let mut state = kiln_scrape::delta::DeltaState::default();
    for half in [first, second] {
        let Ok(profile) = kiln_model::pprof::decode(half, 1 << 24) else {
            continue;
        };
        if kiln_model::pprof::validate(&profile, &Default::default()).is_err() {
            continue;
        }
        if let kiln_scrape::delta::Delta::Profile(delta) = state.apply(profile) {
            // A delta is still a valid profile.
            assert!(kiln_model::pprof::validate(&delta, &Default::default()).is_ok());
        }
    }
    let _ = serde_json::from_slice::<Vec<kiln_scrape::config::StaticConfig>>(data);
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(rules) = yaml_serde::from_str::<Vec<kiln_scrape::relabel::RelabelConfig>>(text) {
            let labels = [("__address__".to_string(), "h:1".to_string())]
                .into_iter()
                .collect();
            let _ = kiln_scrape::relabel::relabel(&labels, &rules);
        }
    }
}

/// Prometheus label selectors from query strings.
pub fn selector_parse(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = kiln_model::selector::parse(text);
    }
}

/// speedscope JSON (sampled and evented profiles) into a pprof.
pub fn speedscope_parse(data: &[u8]) {
    if let Ok(parsed) = kiln_model::speedscope::parse(data, "cpu", 16_000) {
        assert!(kiln_model::pprof::validate(&parsed.profile, &Default::default()).is_ok());
    }
}

/// Time arguments: now-1h, epochs, RFC 3339.
pub fn time_parse(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = kiln_model::time::parse_time_nanos(text, 1_800_000_000_000_000_000);
        let _ = kiln_model::time::parse_duration_nanos(text);
        let _ = kiln_model::time::parse_epoch_nanos(text);
    }
}

/// A query share's answer and request as one query node sends them to another
/// (`POST /api/v1/partial/tree`, `…/series`): the uncut tree bytes (`KFT1`), read and
/// merged, the unfinished series, added up and averaged, and the partial query's JSON,
/// turned into a request; never a panic.
pub fn partial_tree(data: &[u8]) {
    if let Ok(series) = kiln_query::series::PartialSeries::from_bytes(data) {
        let options = kiln_query::series::SeriesOptions {
            step_ms: 1_000,
            average: true,
            limit: Some(3),
            ..Default::default()
        };
        if let Ok(mut builder) = kiln_query::series::SeriesBuilder::new(&options) {
            builder.add_partial(series.clone());
            builder.add_partial(series);
            let _ = builder.finish();
        }
    }
    if let Ok(tree) = kiln_query::tree::decode_partial(data) {
        let mut merged = tree.clone();
        merged.add_tree(&tree, |value| value);
        merged.compute_totals();
        let _ = kiln_query::tree::encode_partial(&merged);
    }
    if let Ok(part) = serde_json::from_slice::<kiln_query::root::PartialQuery>(data) {
        let _ = part.request("fuzz");
    }
}

/// The write-ahead log's files as recovery reads them back: framed, CRC-checked records
/// and the profiles inside, staged into datasets as recovery stages them.
pub fn wal_records(data: &[u8]) {
    let Ok(requests) = kiln_ingest::wal::records(data, std::path::Path::new("fuzz.wal")) else {
        return;
    };
    for (tenant, profiles) in requests {
        for profile in profiles {
            let mut builder = kiln_storage::DatasetBuilder::new(&tenant, profile.service());
            builder.add_pprof(&profile.input(1000));
            let dataset = builder.finish();
            assert!(dataset.check().is_ok());
        }
    }
}

/// `source.url_template`'s filling: `{service}` and `{path}` come from profiles, so from
/// any writer. Whatever is accepted must stay under the template's host and path prefix,
/// with no query or fragment of the writer's and no dot segment.
pub fn source_url(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (service, path) = text.split_once('\0').unwrap_or((&text, "main.go"));
    let template = "https://git.example.com:8443/raw/{service}/main/{path}";
    let Ok(url) = kiln_query::source::fill_template(template, service, path) else {
        return;
    };
    assert_eq!(url.scheme(), "https");
    assert_eq!(url.host_str(), Some("git.example.com"));
    assert_eq!(url.port(), Some(8443));
    assert!(url.path().starts_with("/raw/"), "{url}");
    assert!(url.query().is_none() && url.fragment().is_none(), "{url}");
    let segments: Vec<&str> = url.path().split('/').collect();
    assert!(
        segments
            .iter()
            .all(|segment| *segment != ".." && *segment != "."),
        "{url}"
    );
    assert!(url.path().contains("/main/"), "{url}");
}

/// A Go binary's `.gopclntab` as `kiln-gosym` reads it: the first four bytes (little
/// endian) split the rest into the table, at 0x4a0000, and one data section after it,
/// at 0x560000 (where `moduledata` and the inline trees are looked for); then frames at
/// addresses through the text the table claims.
pub fn gosym_read(data: &[u8]) {
    let Some((split, rest)) = data.split_first_chunk::<4>() else {
        return;
    };
    let split = (u32::from_le_bytes(*split) as usize).min(rest.len());
    let (table, section) = rest.split_at(split);
    let image = kiln_gosym::Image {
        pclntab: kiln_gosym::Section {
            address: 0x4a_0000,
            bytes: table,
        },
        text: 0x40_1000,
        data: vec![kiln_gosym::Section {
            address: 0x56_0000,
            bytes: section,
        }],
    };
    let Ok(table) = kiln_gosym::Table::new(image) else {
        return;
    };
    for step in 0..64u64 {
        let _ = table.frames(0x40_1000 + step * 0x40);
    }
    let _ = table.frames(u64::MAX);
}
