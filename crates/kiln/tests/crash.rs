//! Durability under SIGKILL: a client pushes continuously and records every acknowledged
//! profile id; the server is killed with SIGKILL at random moments and restarted, several
//! rounds; afterwards every acknowledged profile must be readable, whole.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kiln_testkit::{free_port, KilnChild, KilnCommand, Log};

/// `kiln server` on `data_dir` and `port`, with the data directory's `kiln.yaml`.
fn kiln_server(data_dir: &Path, port: u16) -> KilnCommand {
    KilnCommand::server(env!("CARGO_BIN_EXE_kiln"), data_dir)
        .port(port)
        // The fixture's own time is years old: keep it.
        .args([
            "--flush-interval-ms",
            "50",
            "--retention-days",
            "0",
            "--config",
        ])
        .arg(data_dir.join("kiln.yaml"))
        .ready_within(Duration::from_secs(30))
}

fn start(data_dir: &Path, port: u16) -> KilnChild {
    kiln_server(data_dir, port)
        .start()
        .expect("kiln server starts")
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
        "compaction:\n  interval_ms: 30\n  grace_ms: 2000\n  orphan_age_ms: 2000\n  levels:\n\
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
        server.kill().expect("SIGKILL");
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

/// The CPU total of everything stored, through the query API.
fn cpu_total(port: u16) -> i64 {
    use prost::Message;
    let request = kiln_query::api::SelectMergeStacktracesRequest {
        profile_type_id: "process_cpu:cpu:nanoseconds:cpu:nanoseconds".into(),
        label_selector: r#"{service_name="crash"}"#.into(),
        start: 1_600_000_000_000,
        end: 1_800_000_000_000,
        max_nodes: Some(1),
        ..Default::default()
    };
    let response = ureq::post(&format!(
        "http://127.0.0.1:{port}/querier.v1.QuerierService/SelectMergeStacktraces"
    ))
    .set("Content-Type", "application/proto")
    .send_bytes(&request.encode_to_vec())
    .expect("query");
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut response.into_reader(), &mut bytes).unwrap();
    kiln_query::api::SelectMergeStacktracesResponse::decode(bytes.as_slice())
        .unwrap()
        .flamegraph
        .map_or(0, |graph| graph.total)
}

fn write_config(data_dir: &Path, compaction_enabled: bool) {
    std::fs::write(
        data_dir.join("kiln.yaml"),
        format!(
            "compaction:\n  enabled: {compaction_enabled}\n  interval_ms: 30\n  grace_ms: 0\n  orphan_age_ms: 3000\n  lease_ms: 500\n  levels:\n\
             \x20   - {{max_datasets: 2, max_age_ms: 0, window_ms: 0}}\n\
             \x20   - {{max_datasets: 2, max_age_ms: 0, window_ms: 3600000}}\n\
             \x20   - {{max_datasets: 2, max_age_ms: 0, window_ms: 86400000}}\n"
        ),
    )
    .unwrap();
}

/// Kills the server (SIGKILL, from inside, at the exact step) at each step of a
/// compaction and of the deletion that follows it; after a restart, compaction finishes,
/// the totals are those ingested (nothing lost, nothing counted twice) and every stored
/// object is a registered, live block.
#[test]
fn compaction_killed_at_every_step_loses_and_duplicates_nothing() {
    use std::os::unix::process::ExitStatusExt;
    let profile = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/profefe-collector_cpu_1.prof"),
    )
    .unwrap();
    let one_total: i64 = kiln_model::pprof::decode(&profile, 1 << 30)
        .unwrap()
        .sample
        .iter()
        .map(|s| s.value[1])
        .sum();
    let profiles = 6;
    for point in [
        "compaction-merged",
        "compaction-uploaded",
        "compaction-swapped",
        "garbage-object-deleted",
    ] {
        let data_dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        write_config(data_dir.path(), false);
        let mut server = start(data_dir.path(), port);
        for index in 0..profiles {
            let from = 1_700_000_000 + index * 60;
            let response = ureq::post(&format!(
                "http://127.0.0.1:{port}/ingest?name=crash&format=pprof&from={from}&until={}",
                from + 10
            ))
            .send_bytes(&profile)
            .expect("ingest");
            assert_eq!(response.status(), 200);
            std::thread::sleep(Duration::from_millis(120)); // one segment each
        }
        assert_eq!(cpu_total(port), profiles * one_total);
        server.kill().ok();
        server.wait().ok();

        // With compaction on and the crash point armed, the server kills itself.
        write_config(data_dir.path(), true);
        let mut crashing = kiln_server(data_dir.path(), port)
            .env("KILN_TEST_CRASH_AT", point)
            .log(Log::Discard)
            .spawn()
            .expect("kiln server starts");
        let status = crashing
            .wait_exit(Duration::from_secs(60))
            .unwrap_or_else(|err| panic!("{point}: the crash point was never reached: {err}"));
        assert_eq!(status.signal(), Some(9), "{point}: {status:?}");

        // Restarted, compaction completes from whatever the crash left.
        let mut server = start(data_dir.path(), port);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let metastore = runtime
            .block_on(kiln_metastore::Metastore::open(&format!(
                "sqlite://{}",
                data_dir.path().join("metastore.db").display()
            )))
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let blocks = runtime.block_on(metastore.list_blocks()).unwrap();
            let mut live: Vec<String> = blocks
                .iter()
                .filter(|block| block.deleted_at_ms.is_none())
                .map(|block| block.object_key.clone())
                .collect();
            live.sort();
            let stored = stored_objects(&data_dir.path().join("blocks"));
            // The six segments end as one block at the top (level 3 of the three levels
            // configured), where a lone block rests.
            let settled = blocks
                .iter()
                .all(|block| block.deleted_at_ms.is_none() && block.level == 3)
                && live.len() == 1
                && stored == live;
            if settled {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{point}: not settled: blocks {blocks:?}, stored {stored:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(
            cpu_total(port),
            profiles * one_total,
            "{point}: totals changed"
        );
        eprintln!("{point}: killed there, restarted, compacted; totals unchanged, no orphan");
        server.kill().ok();
        server.wait().ok();
    }
}
