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

/// A metric's value in the symbolizer's exposition.
fn metric(symbolizer: &Symbolizer, name: &str) -> f64 {
    let mut registry = prometheus_client::registry::Registry::default();
    symbolizer.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} in {text}"))
}

/// Uploads `file` for tenant "shop"; its build id and weight.
async fn uploaded(symbolizer: &Symbolizer, file: &Path) -> (String, u64) {
    let incoming = symbolizer.incoming();
    std::fs::copy(file, &incoming).unwrap();
    let contents = symbolizer.upload("shop", &incoming, None).await.unwrap();
    (contents.build_id.clone(), contents.weight())
}

/// `memory_bytes` bounds what is parsed: with room for one of two debug files, reading
/// the other drops the first, which is parsed again, with the same names, when next read;
/// a file heavier than the whole budget is named and then not held.
#[tokio::test]
async fn parsed_debug_files_stay_within_the_memory_budget() {
    let (Some(first), Some(second)) = (program(&[]), program(&["-fno-omit-frame-pointer"])) else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    // The names cache takes its floor, 1 MiB; the parsed files room for one and a half.
    let probe = symbolizer(&root.path().join("probe"), SymbolizationConfig::default());
    let (_, weight) = uploaded(&probe, &first.debug).await;
    let (_, second_weight) = uploaded(&probe, &second.debug).await;
    let budget = weight.max(second_weight) * 3 / 2;
    let config = SymbolizationConfig {
        memory_bytes: (1 << 20) + budget,
        ..SymbolizationConfig::default()
    };
    let symbolizer = symbolizer(root.path(), config);
    let (a, _) = uploaded(&symbolizer, &first.debug).await;
    let (b, _) = uploaded(&symbolizer, &second.debug).await;
    assert_ne!(a, b);
    let (mapping_a, hot_a) = addresses_of(&first.full, "kiln_hot_a");
    let (mapping_b, hot_b) = addresses_of(&second.full, "kiln_hot_a");
    let held = |s: &Symbolizer| metric(s, "kiln_symbolization_parsed_bytes") as u64;
    let evictions = |s: &Symbolizer| metric(s, "kiln_symbolization_parsed_evictions_total");

    assert_named(
        &symbolizer
            .symbolize("shop", &a, mapping_a, &hot_a)
            .await
            .unwrap(),
    );
    assert_eq!((held(&symbolizer), evictions(&symbolizer)), (weight, 0.0));
    assert_named(
        &symbolizer
            .symbolize("shop", &b, mapping_b, &hot_b)
            .await
            .unwrap(),
    );
    assert_eq!(
        (held(&symbolizer), evictions(&symbolizer)),
        (second_weight, 1.0),
        "the first file left memory for the second"
    );
    // Addresses of the first file not asked before (the names cache cannot answer): it
    // is parsed again and names them as the first reading would have.
    let (_, hot_b_of_a) = addresses_of(&first.full, "kiln_hot_b");
    let again = symbolizer
        .symbolize("shop", &a, mapping_a, &hot_b_of_a)
        .await
        .unwrap();
    let whole = kiln_symbolize::read_debug_file(&first.debug, 1 << 30, &{
        let data = std::fs::read(&first.full).unwrap();
        let elf = object::File::parse(&*data).unwrap();
        let symbol = elf
            .symbols()
            .find(|s| s.name() == Ok("kiln_hot_b"))
            .unwrap();
        (symbol.address()..symbol.address() + symbol.size()).collect::<Vec<_>>()
    })
    .unwrap()
    .1;
    assert_eq!(
        again.iter().map(|f| f.to_vec()).collect::<Vec<_>>(),
        whole,
        "named as before the eviction"
    );
    assert!(again
        .iter()
        .all(|f| f.last().is_some_and(|f| f.name == "kiln_hot_b")));
    assert_eq!((held(&symbolizer), evictions(&symbolizer)), (weight, 2.0));

    // No room for even one file: it names what is asked, then is not held.
    let tight = symbolizer_with(
        root.path(),
        "cache-tight",
        SymbolizationConfig {
            memory_bytes: 1 << 20,
            ..SymbolizationConfig::default()
        },
    );
    assert_named(
        &tight
            .symbolize("shop", &a, mapping_a, &hot_a)
            .await
            .unwrap(),
    );
    assert_eq!((held(&tight), evictions(&tight)), (0, 1.0));
    drop((first.dir, second.dir));
}

fn symbolizer_with(root: &Path, cache: &str, config: SymbolizationConfig) -> Symbolizer {
    let storage =
        ObjectStorage::open(&format!("file://{}", root.join("objects").display())).unwrap();
    Symbolizer::new(storage, root.join(cache), config).unwrap()
}

/// A proxy in front of `upstream` that holds each request `delay` before passing it on
/// (with `Connection: close`, so a request is a connection) and counts the most in flight.
fn slow_proxy(
    upstream: String,
    delay: Duration,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let peak = Arc::clone(&most);
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { continue };
            let (now, most, upstream) = (Arc::clone(&now), Arc::clone(&most), upstream.clone());
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if client.read(&mut byte).unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let in_flight = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(in_flight, Ordering::SeqCst);
                std::thread::sleep(delay);
                let text = String::from_utf8_lossy(&head);
                let mut request: String = text
                    .lines()
                    .filter(|l| !l.is_empty() && !l.to_ascii_lowercase().starts_with("connection:"))
                    .map(|l| format!("{l}\r\n"))
                    .collect();
                request.push_str("Connection: close\r\n\r\n");
                if let Ok(mut server) =
                    std::net::TcpStream::connect(upstream.trim_start_matches("http://"))
                {
                    let _ = server.write_all(request.as_bytes());
                    let _ = std::io::copy(&mut server, &mut client);
                }
                now.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (url, peak)
}

/// At most `max_concurrent_fetches` debuginfod fetches run at once for a tenant, however
/// many of its queries need files; another tenant has fetches of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debuginfod_fetches_are_bounded_per_tenant() {
    let programs: Vec<Program> = (0..8)
        .filter_map(|n| program(&[&format!("-Wl,--build-id=0x6b696c6e{n:032x}")]))
        .collect();
    if programs.len() < 8 {
        return;
    }
    let served = tempfile::tempdir().unwrap();
    std::fs::create_dir(served.path().join("files")).unwrap();
    let ids: Vec<String> = programs.iter().map(|p| build_id(&p.debug)).collect();
    for (n, program) in programs.iter().enumerate() {
        std::fs::copy(
            &program.debug,
            served.path().join(format!("files/{n}.debug")),
        )
        .unwrap();
    }
    let Some(server) = debuginfod(served.path(), &ids[0]) else {
        return;
    };
    let probe = server.url.trim_start_matches("http://").to_string();
    for id in &ids {
        let deadline = Instant::now() + Duration::from_secs(30);
        while http_status(&probe, &format!("/buildid/{id}/debuginfo")).ok() != Some(200) {
            assert!(Instant::now() < deadline, "debuginfod never served {id}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let (url, most) = slow_proxy(server.url.clone(), Duration::from_millis(400));
    let root = tempfile::tempdir().unwrap();
    let symbolizer = symbolizer(
        root.path(),
        SymbolizationConfig {
            debuginfod_urls: vec![url],
            max_concurrent_fetches: 2,
            ..SymbolizationConfig::default()
        },
    );
    let (mapping, addresses) = addresses_of(&programs[0].full, "kiln_hot_a");
    let fetch_all = |tenants: Vec<(&'static str, String)>| {
        let mut tasks = tokio::task::JoinSet::new();
        for (tenant, id) in tenants {
            let (symbolizer, addresses) = (symbolizer.clone(), addresses.clone());
            tasks
                .spawn(async move { symbolizer.symbolize(tenant, &id, mapping, &addresses).await });
        }
        tasks
    };
    let started = Instant::now();
    let mut tasks = fetch_all(ids[..6].iter().map(|id| ("shop", id.clone())).collect());
    while let Some(named) = tasks.join_next().await {
        assert_named(&named.unwrap().expect("fetched"));
    }
    let one_tenant = most.swap(0, std::sync::atomic::Ordering::SeqCst);
    let elapsed = started.elapsed();
    // Two tenants' fetches at once: each has its own two.
    let mut tasks = fetch_all(vec![
        ("a", ids[6].clone()),
        ("b", ids[7].clone()),
        ("a", "6b696c6e".repeat(5)),
        ("b", "6e6c696b".repeat(5)),
    ]);
    let mut found = 0;
    while let Some(named) = tasks.join_next().await {
        found += usize::from(named.unwrap().is_some());
    }
    let two_tenants = most.load(std::sync::atomic::Ordering::SeqCst);
    println!(
        "debuginfod fetches at once: {one_tenant} for one tenant's 6 files (max_concurrent_fetches 2, {} ms at 400 ms each), {two_tenants} for two tenants' 4",
        elapsed.as_millis()
    );
    assert_eq!(one_tenant, 2);
    assert!(
        elapsed >= Duration::from_millis(1200),
        "three rounds of two: {elapsed:?}"
    );
    assert_eq!(found, 2, "the two unknown build ids are not found");
    assert!(two_tenants >= 3, "{two_tenants}");
    drop(programs);
}
