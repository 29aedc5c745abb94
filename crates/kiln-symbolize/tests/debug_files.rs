//! The symbolizer on real debug files: a C program with inlined calls, built `-O2 -g`
//! and split with `objcopy --only-keep-debug` and `strip`, as distributions and release
//! builds ship it; named from an upload, and from elfutils' own debuginfod server.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kiln_storage::ObjectStorage;
use kiln_symbolize::{Frame, SymbolizationConfig, Symbolizer};
use object::{Object, ObjectSegment, ObjectSymbol};

const PAGE: u64 = 4096;
/// Where the test pretends the program's text was mapped.
const START: u64 = 0x7f12_3400_0000;

struct Program {
    dir: tempfile::TempDir,
    full: PathBuf,
    debug: PathBuf,
    stripped: PathBuf,
}

/// Builds tests/symbolize/inline.c with `cflags`, or `None` (the test says it skipped)
/// without a C compiler.
fn program(cflags: &[&str]) -> Option<Program> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/symbolize/inline.c");
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("inline");
    let built = Command::new("cc")
        .args(["-O2", "-g"])
        .args(cflags)
        .arg("-o")
        .arg(&full)
        .arg(&source)
        .status();
    if !built.is_ok_and(|s| s.success()) {
        eprintln!("skipped: no C compiler (cc) to build {}", source.display());
        return None;
    }
    let debug = dir.path().join("inline.debug");
    let stripped = dir.path().join("inline.stripped");
    run(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&full)
        .arg(&debug));
    std::fs::copy(&full, &stripped).unwrap();
    run(Command::new("strip").arg(&stripped));
    Some(Program {
        dir,
        full,
        debug,
        stripped,
    })
}

fn run(command: &mut Command) {
    let status = command.status().unwrap();
    assert!(status.success(), "{command:?}: {status}");
}

/// The text mapping a process would have of `binary` at [`START`], and the process
/// addresses of each byte of `function`.
fn addresses_of(binary: &Path, function: &str) -> ((u64, u64), Vec<u64>) {
    let data = std::fs::read(binary).unwrap();
    let elf = object::File::parse(&*data).unwrap();
    let text = elf
        .segments()
        .find(|s| matches!(s.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0))
        .unwrap();
    let base = text.address() - text.address() % PAGE;
    let limit = START + (text.address() % PAGE + text.size()).div_ceil(PAGE) * PAGE;
    let symbol = elf
        .symbols()
        .find(|s| s.name() == Ok(function))
        .unwrap_or_else(|| panic!("{function} in {}", binary.display()));
    let addresses = (symbol.address()..symbol.address() + symbol.size())
        .map(|vaddr| START + vaddr - base)
        .collect();
    ((START, limit), addresses)
}

fn symbolizer(root: &Path, config: SymbolizationConfig) -> Symbolizer {
    let storage =
        ObjectStorage::open(&format!("file://{}", root.join("objects").display())).unwrap();
    Symbolizer::new(storage, root.join("cache"), config).unwrap()
}

fn build_id(path: &Path) -> String {
    let data = std::fs::read(path).unwrap();
    let elf = object::File::parse(&*data).unwrap();
    kiln_symbolize::elf::hex(elf.build_id().unwrap().unwrap())
}

fn names(frames: &[Frame]) -> Vec<&str> {
    frames.iter().map(|f| f.name.as_str()).collect()
}

/// Every address of `kiln_hot_a` is named `kiln_hot_a` outermost, and those in the loop
/// have the inlined `kiln_mix_a` under it, with file and line.
fn assert_named(frames: &[std::sync::Arc<[Frame]>]) {
    assert!(!frames.is_empty());
    for f in frames {
        assert_eq!(
            f.last().map(|f| f.name.as_str()),
            Some("kiln_hot_a"),
            "{f:?}"
        );
    }
    let inlined: Vec<_> = frames
        .iter()
        .filter(|f| names(f) == ["kiln_mix_a", "kiln_hot_a"])
        .collect();
    assert!(
        inlined.len() * 4 >= frames.len(),
        "the inlined loop is most of kiln_hot_a: {} of {} addresses",
        inlined.len(),
        frames.len()
    );
    let mix = &inlined[0][0];
    assert!(mix.file.ends_with("inline.c"), "{mix:?}");
    assert!(
        (10..=15).contains(&mix.line),
        "kiln_mix_a's loop is lines 10-15: {mix:?}"
    );
    assert!(
        inlined[0][1].line >= 23,
        "the call site in kiln_hot_a: {:?}",
        inlined[0]
    );
}

#[tokio::test]
async fn an_uploaded_debug_file_names_a_stripped_binarys_frames_with_inlined_calls() {
    let Some(program) = program(&[]) else { return };
    let root = tempfile::tempdir().unwrap();
    let symbolizer = symbolizer(root.path(), SymbolizationConfig::default());
    let id = build_id(&program.stripped);
    assert_eq!(id, build_id(&program.debug));
    let (mapping, addresses) = addresses_of(&program.full, "kiln_hot_a");

    // Nothing held yet: no names, and the miss is remembered.
    assert!(symbolizer
        .symbolize("shop", &id, mapping, &addresses)
        .await
        .is_none());

    let incoming = symbolizer.incoming();
    std::fs::copy(&program.debug, &incoming).unwrap();
    let generation = symbolizer.generation();
    let contents = symbolizer
        .upload("shop", &incoming, Some(&id))
        .await
        .unwrap();
    assert!(symbolizer.generation() > generation);
    assert_eq!(contents.build_id, id);
    assert!(
        contents.symbols >= 4 && contents.lines && contents.inline_frames,
        "{contents:?}"
    );
    assert!(!contents.go_pclntab);

    let frames = symbolizer
        .symbolize("shop", &id, mapping, &addresses)
        .await
        .expect("named after the upload");
    assert_named(&frames);

    // Another tenant's upload is not this tenant's.
    assert!(symbolizer
        .symbolize("other", &id, mapping, &addresses)
        .await
        .is_none());

    // A new node over the same object store names it too (from the object store).
    drop(symbolizer);
    let again = symbolizer_at(root.path(), "cache-2");
    let frames = again
        .symbolize("shop", &id, mapping, &addresses)
        .await
        .unwrap();
    assert_named(&frames);
    let (status, origin) = again.status("shop", &id).await.unwrap().unwrap();
    assert_eq!(origin, kiln_symbolize::Origin::Upload);
    assert!(status.inline_frames);

    // The stripped binary itself names nothing: refused, with its reason.
    let incoming = again.incoming();
    std::fs::copy(&program.stripped, &incoming).unwrap();
    let refused = again.upload("shop", &incoming, None).await.unwrap_err();
    assert!(refused.is_client_error(), "{refused}");
    assert!(refused.to_string().contains("nothing to name"), "{refused}");
    drop(program.dir);
}

fn symbolizer_at(root: &Path, cache: &str) -> Symbolizer {
    let storage =
        ObjectStorage::open(&format!("file://{}", root.join("objects").display())).unwrap();
    Symbolizer::new(storage, root.join(cache), SymbolizationConfig::default()).unwrap()
}

#[tokio::test]
async fn hostile_debug_files_are_refused_with_a_reason() {
    let Some(program) = program(&["-gz=zlib"]) else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let id = build_id(&program.debug);
    let symbolizer = symbolizer(root.path(), SymbolizationConfig::default());
    let upload = |bytes: Vec<u8>| {
        let incoming = symbolizer.incoming();
        std::fs::write(&incoming, bytes).unwrap();
        let symbolizer = symbolizer.clone();
        async move { symbolizer.upload("t", &incoming, None).await }
    };
    let whole = std::fs::read(&program.debug).unwrap();
    // A zip bomb's shape: .debug_info's compression header claims a terabyte.
    let info = {
        let elf = object::File::parse(&*whole).unwrap();
        let section = object::ObjectSection::file_range(
            &object::Object::section_by_name(&elf, ".debug_info").unwrap(),
        )
        .unwrap();
        section.0 as usize
    };
    let mut bomb = whole.clone();
    assert_eq!(
        &bomb[info..info + 4],
        &1u32.to_le_bytes(),
        "ELFCOMPRESS_ZLIB"
    );
    bomb[info + 8..info + 16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let refused = upload(bomb).await.unwrap_err();
    assert!(refused.to_string().contains("inflate"), "{refused}");
    // And one claiming less than it inflates to is read only as far as it claims.
    let mut short = whole.clone();
    short[info + 8..info + 16].copy_from_slice(&16u64.to_le_bytes());
    let _ = upload(short).await;
    for cut in [16, 64, 200, whole.len() / 2] {
        let refused = upload(whole[..cut].to_vec()).await.unwrap_err();
        assert!(refused.is_client_error(), "cut at {cut}: {refused}");
    }
    // Garbage in the middle of the DWARF: refused or held, never a crash.
    let mut bad = whole.clone();
    for b in bad.iter_mut().skip(whole.len() / 3).take(4096) {
        *b = 0xff;
    }
    let _ = upload(bad).await;
    // The file as built is taken, and names from compressed DWARF.
    let roomy = symbolizer_at(root.path(), "cache-2");
    let incoming = roomy.incoming();
    std::fs::copy(&program.debug, &incoming).unwrap();
    let contents = roomy.upload("t", &incoming, Some(&id)).await.unwrap();
    assert!(contents.inline_frames, "{contents:?}");
    let (mapping, addresses) = addresses_of(&program.full, "kiln_hot_a");
    assert_named(
        &roomy
            .symbolize("t", &id, mapping, &addresses)
            .await
            .unwrap(),
    );
}

/// elfutils' debuginfod on loopback, serving the files under `dir`.
struct Debuginfod {
    child: Child,
    url: String,
}

impl Drop for Debuginfod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn debuginfod(dir: &Path, id: &str) -> Option<Debuginfod> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("debuginfod")
        .arg("-F")
        .arg("-p")
        .arg(port.to_string())
        .arg("-d")
        .arg(dir.join("debuginfod.sqlite"))
        .args(["-t", "1", "-g", "0"])
        .arg(dir.join("files"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let Ok(child) = child else {
        eprintln!("skipped: no debuginfod (Debian's debuginfod package)");
        return None;
    };
    let server = Debuginfod {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    // Until it has scanned the directory and serves the file.
    let deadline = Instant::now() + Duration::from_secs(30);
    let probe = format!("127.0.0.1:{port}");
    while Instant::now() < deadline {
        if let Ok(status) = http_status(&probe, &format!("/buildid/{id}/debuginfo")) {
            if status == 200 {
                return Some(server);
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("debuginfod never served {id}");
}

/// The status code of a GET, read off the status line (a HEAD-like probe).
fn http_status(address: &str, path: &str) -> std::io::Result<u16> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n")?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head)?;
    let text = String::from_utf8_lossy(&head[9..12]).to_string();
    text.parse()
        .map_err(|_| std::io::Error::other(format!("status {text:?}")))
}

#[tokio::test]
async fn a_debuginfod_server_names_frames_once_and_a_restart_fetches_nothing() {
    let Some(program) = program(&[]) else { return };
    let served = tempfile::tempdir().unwrap();
    std::fs::create_dir(served.path().join("files")).unwrap();
    std::fs::copy(&program.debug, served.path().join("files/inline.debug")).unwrap();
    let id = build_id(&program.debug);
    let Some(server) = debuginfod(served.path(), &id) else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let config = SymbolizationConfig {
        debuginfod_urls: vec![server.url.clone()],
        ..SymbolizationConfig::default()
    };
    let symbolizer = symbolizer(root.path(), config.clone());
    let (mapping, addresses) = addresses_of(&program.full, "kiln_hot_a");
    let frames = symbolizer
        .symbolize("shop", &id, mapping, &addresses)
        .await
        .expect("fetched from debuginfod");
    assert_named(&frames);
    let (_, origin) = symbolizer.status("shop", &id).await.unwrap().unwrap();
    assert_eq!(origin, kiln_symbolize::Origin::Debuginfod);
    // Cached in the object store for every tenant.
    assert!(root.path().join("objects/debuginfod").join(&id).exists());
    assert!(symbolizer
        .symbolize("other", &id, mapping, &addresses)
        .await
        .is_some());

    // An unknown build id is a 404, remembered: a second lookup asks no server.
    let unknown = "00".repeat(20);
    assert!(symbolizer
        .symbolize("shop", &unknown, mapping, &addresses)
        .await
        .is_none());

    // The server gone, a restarted node (a fresh disk cache) still names the frames.
    drop(server);
    drop(symbolizer);
    let storage =
        ObjectStorage::open(&format!("file://{}", root.path().join("objects").display())).unwrap();
    let restarted = Symbolizer::new(storage, root.path().join("cache"), config).unwrap();
    let frames = restarted
        .symbolize("shop", &id, mapping, &addresses)
        .await
        .expect("from the object store, with debuginfod down");
    assert_named(&frames);
}
