//! Durability under SIGKILL: a client pushes continuously and records every acknowledged
//! profile id; the server is killed with SIGKILL at random moments and restarted, several
//! rounds; afterwards every acknowledged profile must be readable, whole.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

fn start(data_dir: &Path, port: u16) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "server",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--flush-interval-ms",
            "50",
            // The fixture's own time is years old: keep it.
            "--retention-days",
            "0",
            "--config",
        ])
        .arg(data_dir.join("kiln.yaml"))
        .arg("--data-dir")
        .arg(data_dir)
        .env("KILN_LOG_LEVEL", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("kiln server starts");
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(2))
        .build();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if agent
            .get(&format!("http://127.0.0.1:{port}/ready"))
            .call()
            .is_ok()
        {
            return child;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("server did not become ready");
}

/// A small xorshift generator seeded from the clock: random kill moments, no dependency.
struct Random(u64);

impl Random {
    fn next_below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound
    }
}

#[test]
fn acknowledged_profiles_survive_sigkill() {
    let data_dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let profile = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/profefe-collector_cpu_1.prof"),
    )
    .unwrap();
    let expected_total: i64 = kiln_model::pprof::decode(&profile, 1 << 30)
        .unwrap()
        .sample
        .iter()
        .map(|s| s.value[1])
        .sum();
    // Compaction runs all the time, so the kills also land in the middle of merges and
    // swaps; garbage is deleted 2 s after it becomes garbage.
    std::fs::write(
        data_dir.path().join("kiln.yaml"),
        "compaction:\n  interval_ms: 30\n  grace_ms: 2000\n  levels:\n\
         \x20   - {max_datasets: 3, max_age_ms: 0, window_ms: 0}\n\
         \x20   - {max_datasets: 3, max_age_ms: 0, window_ms: 3600000}\n\
         \x20   - {max_datasets: 3, max_age_ms: 0, window_ms: 86400000}\n",
    )
    .unwrap();
    let mut server = start(data_dir.path(), port);

    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut clients = Vec::new();
    for client in 0..4 {
        let (stop, acked, profile) = (stop.clone(), acked.clone(), profile.clone());
        clients.push(std::thread::spawn(move || {
            let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(5)).build();
            let mut sequence = 0;
            while !stop.load(Ordering::Relaxed) {
                sequence += 1;
                let url = format!("http://127.0.0.1:{port}/api/0/profiles?service=crash&type=cpu&labels=client={client},seq={sequence}");
                match agent.post(&url).send_bytes(&profile) {
                    Ok(response) => {
                        let body: serde_json::Value = serde_json::from_str(&response.into_string().unwrap()).unwrap();
                        let id = body["body"]["id"].as_str().expect("id").to_string();
                        acked.lock().unwrap().push(id);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }));
    }

    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut random = Random(seed | 1);
    let rounds = 5;
    for round in 0..rounds {
        std::thread::sleep(Duration::from_millis(300 + random.next_below(900)));
        let before = acked.lock().unwrap().len();
        server.kill().expect("SIGKILL"); // Child::kill sends SIGKILL on Unix
        server.wait().expect("reaped");
        eprintln!("round {round}: killed with {before} profiles acknowledged so far");
        server = start(data_dir.path(), port);
    }
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() >= 20,
        "only {} profiles were acknowledged",
        acked.len()
    );

    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(30))
        .build();
    for id in &acked {
        let response = agent
            .get(&format!("http://127.0.0.1:{port}/api/0/profiles/{id}"))
            .call()
            .unwrap_or_else(|err| panic!("acknowledged profile {id} is lost: {err}"));
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut response.into_reader(), &mut bytes).unwrap();
        let total: i64 = kiln_model::pprof::decode(&bytes, 1 << 30)
            .unwrap()
            .sample
            .iter()
            .map(|s| s.value[1])
            .sum();
        assert_eq!(total, expected_total, "profile {id} came back partial");
    }
    eprintln!(
        "{} acknowledged profiles across {rounds} SIGKILLs: all readable and whole",
        acked.len()
    );
    // Once compaction has settled and the grace period passed, every object in storage is
    // a registered, live block: nothing a crash left half-done remains.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let metastore_url = format!(
        "sqlite://{}",
        data_dir.path().join("metastore.db").display()
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let metastore = runtime
            .block_on(kiln_metastore::Metastore::open(&metastore_url))
            .unwrap();
        let blocks = runtime.block_on(metastore.list_blocks()).unwrap();
        let mut registered: Vec<String> = blocks
            .iter()
            .filter(|block| block.deleted_at_ms.is_none())
            .map(|block| block.object_key.clone())
            .collect();
        registered.sort();
        let stored = stored_objects(&data_dir.path().join("blocks"));
        if stored == registered && blocks.iter().all(|b| b.deleted_at_ms.is_none()) {
            eprintln!("{} objects, all registered and live", stored.len());
            break;
        }
        assert!(
            Instant::now() < deadline,
            "storage and metastore disagree: stored {stored:?}, registered {registered:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The compacted data still holds every acknowledged profile.
    let total_profiles = acked.len();
    for id in acked.iter().step_by((total_profiles / 20).max(1)) {
        let status = agent
            .get(&format!("http://127.0.0.1:{port}/api/0/profiles/{id}"))
            .call()
            .map(|response| response.status())
            .unwrap_or(0);
        assert_eq!(status, 200, "profile {id} after compaction settled");
    }
    server.kill().ok();
    server.wait().ok();
}

/// Object keys under the object store root, `segments/…` and `blocks/…`.
fn stored_objects(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for prefix in ["segments", "blocks"] {
        if let Ok(entries) = std::fs::read_dir(root.join(prefix)) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                // object_store's in-flight temporary files are not objects yet.
                if name.ends_with(".parquet") {
                    out.push(format!("{prefix}/{name}"));
                }
            }
        }
    }
    out.sort();
    out
}
