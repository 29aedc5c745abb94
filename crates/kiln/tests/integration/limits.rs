use crate::common::*;
use crate::pyroscope::{ticks, url_escape};

#[test]
fn size_limits_are_413_and_counted() {
    let server = TestServer::start_with(|config| {
        config.limits.max_body_bytes = 64 * 1024;
        config.limits.max_decompressed_bytes = 1 << 20;
    });
    // A body declared past the limit is refused after its headers, before it is sent.
    let mut declared = crate::security::send_head(
        &server,
        &crate::security::ingest_head("big", "t", 100 * 1024, ""),
    );
    crate::security::refused_and_closed(&mut declared, "413", std::time::Duration::from_secs(5));
    // One sent without a length (chunked) is refused once past it.
    let (status, text) = response_text(
        TestServer::agent()
            .post(&format!("{}/ingest?name=big&format=pprof", server.url))
            .send(std::io::Cursor::new(vec![b'a'; 100 * 1024])),
    );
    assert_eq!(status, 413, "{text}");
    // 64 MiB of zeros gzip to ~64 KiB: stopped at the 1 MiB decompressed limit.
    let bomb = gzip(&vec![0u8; 8 << 20]);
    assert!(bomb.len() < 64 * 1024);
    let (status, text) = server.post("/ingest?name=bomb&format=pprof", &bomb);
    assert_eq!(status, 413, "{text}");
    let (status, _) = server.post_with(
        "/ingest?name=bomb&format=pprof",
        &bomb,
        &[("Content-Encoding", "gzip")],
    );
    assert_eq!(status, 413);
    let metrics = server.metrics();
    assert!(
        metrics.contains("kiln_ingest_rejected_total{endpoint=\"ingest\",reason=\"too_large\"} 4"),
        "{metrics}"
    );
}

#[test]
fn sample_and_label_limits_are_400() {
    let server = TestServer::start_with(|config| {
        config.limits.max_samples_per_profile = 100;
        config.limits.max_labels_per_series = 4;
        config.limits.max_label_value_length = 16;
    });
    // Past the sample limit the heaviest stacks are kept, and the answer says so.
    let response = TestServer::agent()
        .post(&format!("{}/api/0/profiles?service=s&type=cpu", server.url))
        .send_bytes(&fixture("profefe-collector_cpu_1.prof"))
        .expect("accepted");
    let warning = response.header("warning").unwrap_or_default().to_string();
    assert!(warning.contains("max_samples_per_profile"), "{warning}");
    let (status, text) = server.post("/ingest?name=app{a=1,b=2,c=3,d=4,e=5}", b"main 1\n");
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("labels"), "{text}");
    let (status, text) = server.post("/ingest?name=app{a=0123456789abcdefXYZ}", b"main 1\n");
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("\"a\""), "{text}");
    assert_eq!(server.post("/ingest?name=app{a=1}", b"main 1\n").0, 200);
}

#[test]
fn deep_stacks_are_truncated_not_refused() {
    let server = TestServer::start_with(|config| config.limits.max_stack_depth = 10);
    let frames: Vec<String> = (0..50).map(|i| format!("f{i}")).collect();
    let line = format!("{} 7\n", frames.join(";"));
    assert_eq!(server.post("/ingest?name=deep.cpu", line.as_bytes()).0, 200);
    let query = url_escape("process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name=\"deep\"}");
    let result = server.json(
        &format!("/pyroscope/render?query={query}&from=0&until=now"),
        &[],
    );
    assert_eq!(ticks(&result), 70_000_000);
    let levels = result["flamebearer"]["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 11, "root + 10 frames");
    let names = result["flamebearer"]["names"].to_string();
    assert!(
        names.contains("[truncated]") && names.contains("f49") && !names.contains("\"f0\""),
        "{names}"
    );
}

#[test]
fn rate_limit_is_429_per_tenant() {
    let server = TestServer::start_with(|config| {
        let limits = kiln_ingest::Limits {
            ingestion_rate_bytes: 1000,
            ingestion_burst_bytes: 30_000,
            ..config.limits
        };
        config.tenant_limits.insert("small".into(), limits);
    });
    let body = fixture("profefe-collector_cpu_1.prof");
    let headers = [("X-Scope-OrgID", "small")];
    assert_eq!(
        server
            .post_with("/api/0/profiles?service=s&type=cpu", &body, &headers)
            .0,
        200
    );
    let (status, text) = server.post_with("/api/0/profiles?service=s&type=cpu", &body, &headers);
    assert_eq!(status, 429, "{text}");
    assert_eq!(
        server
            .post_with(
                "/api/0/profiles?service=s&type=cpu",
                &body,
                &[("X-Scope-OrgID", "big")]
            )
            .0,
        200
    );
    assert!(server.metrics().contains("reason=\"rate_limited\""));
}

#[test]
fn tenants_never_see_each_other() {
    let server = TestServer::start();
    let body = fixture("profefe-collector_cpu_1.prof");
    let (status, text) = server.post_with(
        "/api/0/profiles?service=secret&type=cpu",
        &body,
        &[("X-Scope-OrgID", "team-a")],
    );
    assert_eq!(status, 200);
    let id = serde_json::from_str::<serde_json::Value>(&text).unwrap()["body"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(server.post("/ingest?name=public.cpu", b"main 1\n").0, 200);

    let a = [("X-Scope-OrgID", "team-a")];
    let b = [("X-Scope-OrgID", "team-b")];
    let query = url_escape("process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name=\"secret\"}");
    let render = format!("/pyroscope/render?query={query}&from=0&until=now");
    assert!(ticks(&server.json(&render, &a)) > 0);
    assert_eq!(ticks(&server.json(&render, &b)), 0);
    assert_eq!(
        ticks(&server.json(&render, &[])),
        0,
        "no header is the anonymous tenant"
    );
    assert_eq!(
        server.json("/api/0/services", &a)["body"],
        serde_json::json!(["secret"])
    );
    assert_eq!(
        server.json("/api/0/services", &b)["body"],
        serde_json::json!([])
    );
    assert_eq!(
        server.json("/api/0/services", &[])["body"],
        serde_json::json!(["public"])
    );
    assert_eq!(
        server.json("/api/0/profiles?service=secret&type=cpu", &b)["body"],
        serde_json::json!([])
    );
    assert_eq!(server.get_with(&format!("/api/0/profiles/{id}"), &a).0, 200);
    assert_eq!(server.get_with(&format!("/api/0/profiles/{id}"), &b).0, 404);
    assert_eq!(
        server
            .get_bytes("/api/0/profiles/merge?service=secret&type=cpu", &b)
            .0,
        404
    );
    let (status, _) = server.post_with(
        "/ingest?name=x",
        b"main 1\n",
        &[("X-Scope-OrgID", "bad/tenant")],
    );
    assert_eq!(status, 400);
}

/// The write is acknowledged from the write-ahead log, before any segment, and the next
/// read flushes it first (reason `query`), so the read sees it.
#[test]
fn ready_and_metrics() {
    let server = TestServer::start();
    assert_eq!(server.get("/ready"), (200, "ready\n".to_string()));
    assert_eq!(server.post("/ingest?name=m.cpu", b"a;b 1\n").0, 200);
    let metrics = server.metrics();
    assert!(metrics.contains("kiln_ready 1"));
    assert!(
        metrics.contains("kiln_ingest_wal_records_total 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kiln_ingest_flushes_total 0\n"),
        "{metrics}"
    );
    assert!(metrics.contains("kiln_ingest_received_profiles_total{endpoint=\"ingest\"} 1"));
    assert_eq!(
        server.json("/api/0/services", &[])["body"],
        serde_json::json!(["m"])
    );
    let metrics = server.metrics();
    assert!(
        metrics.contains("kiln_ingest_flushes_total 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kiln_ingest_flush_reason_total{reason=\"query\"} 1\n"),
        "{metrics}"
    );
}

/// With the write-ahead log a write is acknowledged before its segment is stored; when
/// the store then fails, the batch stays in the log, invisible, and is written from the
/// log once the store works again: acknowledged, never lost.
#[test]
fn a_logged_write_whose_flush_fails_is_written_from_the_log_later() {
    let blocks = tempfile::tempdir().unwrap();
    let object_store = format!("file://{}", blocks.path().display());
    let server = TestServer::start_with(|config| {
        config.object_store = object_store.clone();
        config.wal_segment_interval_ms = 200;
    });
    std::fs::write(blocks.path().join("segments"), b"in the way").unwrap();
    assert_eq!(
        server.post("/ingest?name=kept.cpu", b"main;work 5\n").0,
        200
    );
    assert_eq!(
        server.json("/api/0/services", &[])["body"],
        serde_json::json!([])
    );
    assert!(server
        .metrics()
        .contains("kiln_ingest_flush_failures_total 1\n"));
    std::fs::remove_file(blocks.path().join("segments")).unwrap();
    crate::scrape::wait_until(
        "the logged write recovered",
        std::time::Duration::from_secs(30),
        || server.json("/api/0/services", &[])["body"] == serde_json::json!(["kept"]),
    );
    // Counted just after its segment is registered (and so visible): waited for, once.
    crate::scrape::wait_until(
        "the recovery counted",
        std::time::Duration::from_secs(10),
        || {
            server
                .metrics()
                .contains("kiln_ingest_wal_recovered_profiles_total 1\n")
        },
    );
}

/// A memory flush of the log's batch counts the open batch only. A write logged while
/// such a flush is held up (its registration waits for SQLite's write lock, which another
/// process holds) stays in the next batch; counting the flush in progress as well made
/// every such write a flush, and a segment, of its own.
#[test]
fn a_logged_write_during_a_memory_flush_waits_for_its_own_batch() {
    // A profile of many distinct stacks, and the heap it takes staged.
    let big: String = (0..2_000)
        .map(|i| format!("main;handler_{i};leaf_{i} 1\n"))
        .collect();
    let measured = TestServer::start_with(|config| config.wal_segment_interval_ms = 60_000);
    assert_eq!(measured.post("/ingest?name=big.cpu", big.as_bytes()).0, 200);
    let heap = measured.metric("kiln_ingest_pending_bytes");
    assert!(heap > 100_000.0, "{heap}");
    drop(measured);

    // The logged batch's share of max_pending_bytes (three quarters) is under the big
    // profile's heap, and the whole over it and a small one's.
    let server = TestServer::start_with(|config| {
        config.wal_segment_interval_ms = 60_000;
        config.max_pending_bytes = (heap * 1.2) as usize;
    });
    let memory_flushes =
        |server: &TestServer| server.counter(r#"kiln_ingest_flush_reason_total{reason="memory"}"#);
    // Holds SQLite's write lock until it is killed, on drop too (before the server's own
    // drop, which waits for the flush the lock holds up).
    struct LockHolder(std::process::Child);
    impl Drop for LockHolder {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = std::process::Command::new("python3")
        .args([
            "-c",
            "import sqlite3, sys, time\n\
             c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)\n\
             c.execute('BEGIN IMMEDIATE')\n\
             print('locked', flush=True)\n\
             time.sleep(60)",
        ])
        .arg(server.data_dir().join("metastore.db"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let stdout = child.stdout.take().expect("stdout");
    let lock = LockHolder(child);
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)
        .expect("the lock holder's line");
    assert_eq!(line.trim(), "locked");

    assert_eq!(server.post("/ingest?name=big.cpu", big.as_bytes()).0, 200);
    crate::scrape::wait_until(
        "the memory flush started",
        std::time::Duration::from_secs(5),
        || memory_flushes(&server) == 1.0,
    );
    assert_eq!(
        server.post("/ingest?name=small.cpu", b"main;work 5\n").0,
        200
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(memory_flushes(&server), 1.0, "{}", server.metrics());
    assert_eq!(
        server.counter("kiln_ingest_flush_duration_seconds_count"),
        0.0
    );

    drop(lock);
    crate::scrape::wait_until(
        "both profiles visible",
        std::time::Duration::from_secs(30),
        || server.json("/api/0/services", &[])["body"] == serde_json::json!(["big", "small"]),
    );
    // The small one was written by the read, not by a flush of its own.
    assert_eq!(memory_flushes(&server), 1.0);
    assert_eq!(
        server.counter(r#"kiln_ingest_flush_reason_total{reason="query"}"#),
        1.0
    );
}

#[test]
fn a_failed_flush_is_5xx_and_leaves_nothing_visible() {
    let blocks = tempfile::tempdir().unwrap();
    let object_store = format!("file://{}", blocks.path().display());
    let server = TestServer::start_with(|config| {
        config.object_store = object_store.clone();
        config.wal = false;
    });
    // A file where the segments directory must go makes every object write fail.
    std::fs::write(blocks.path().join("segments"), b"in the way").unwrap();
    let (status, text) = server.post("/ingest?name=doomed.cpu", b"main;work 5\n");
    // The backend failed and nothing was committed: retry (503).
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("failed to store"), "{text}");
    assert_eq!(
        server.json("/api/0/services", &[])["body"],
        serde_json::json!([])
    );
    assert!(server
        .metrics()
        .contains("kiln_ingest_flush_failures_total 1"));
    // Once storage works again, writes succeed and only they are visible.
    std::fs::remove_file(blocks.path().join("segments")).unwrap();
    assert_eq!(
        server.post("/ingest?name=fine.cpu", b"main;work 5\n").0,
        200
    );
    assert_eq!(
        server.json("/api/0/services", &[])["body"],
        serde_json::json!(["fine"])
    );
}

/// Writes of `count` services (`{prefix}{i}`), each from its own thread, the i-th
/// `i * spacing_ms` after the first; every one must be acknowledged.
fn write_from_threads(server: &TestServer, prefix: &str, count: u64, spacing_ms: u64) {
    let threads: Vec<_> = (0..count)
        .map(|i| {
            let url = format!("{}/ingest?name={prefix}{i}.cpu", server.url);
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(spacing_ms * i));
                TestServer::agent()
                    .post(&url)
                    .send_bytes(b"main;work 1\n")
                    .map(|r| r.status())
                    .unwrap_or(0)
            })
        })
        .collect();
    for thread in threads {
        assert_eq!(thread.join().unwrap(), 200);
    }
}

#[test]
fn concurrent_requests_share_one_flush() {
    let server = TestServer::start_with(|config| {
        config.wal = false;
        config.flush_interval_ms = 1000;
        config.flush_adaptive = false;
    });
    write_from_threads(&server, "svc", 8, 0);
    let metrics = server.metrics();
    assert!(
        metrics.contains("kiln_ingest_flushes_total 1\n"),
        "8 requests within one interval, one segment: {metrics}"
    );
    assert_eq!(
        server.json("/api/0/services", &[])["body"]
            .as_array()
            .unwrap()
            .len(),
        8
    );
}

/// `flush_min_gap_ms`: writes that come within the gap after a flush started wait for its
/// end and share one flush, though each alone would find the server idle.
#[test]
fn writes_within_the_minimum_gap_share_one_flush() {
    let server = TestServer::start_with(|config| {
        config.wal = false;
        config.flush_interval_ms = 5_000;
        config.flush_min_gap_ms = 1_000;
    });
    let started = std::time::Instant::now();
    assert_eq!(
        server.post("/ingest?name=first.cpu", b"main;work 1\n").0,
        200
    );
    let first = started.elapsed();
    assert!(first < std::time::Duration::from_millis(900), "{first:?}");
    write_from_threads(&server, "later", 4, 50);
    let all = started.elapsed();
    assert!(all >= std::time::Duration::from_millis(950), "{all:?}");
    let metrics = server.metrics();
    assert!(
        metrics.contains("kiln_ingest_flushes_total 2\n"),
        "one flush for the first write, one for the four within the gap: {metrics}"
    );
}

/// The adaptive group commit: an idle server flushes a write at once instead of after
/// `flush_interval_ms` (the write flushes itself, on the thread that parsed it), and an
/// upload stalled half-way holds no other write back: it is on its way only once its
/// body has arrived.
#[test]
fn writes_are_acked_without_waiting_for_the_flush_interval() {
    let server = TestServer::start_with(|config| {
        config.wal = false;
        config.flush_interval_ms = 5_000;
    });
    let started = std::time::Instant::now();
    assert_eq!(
        server.post("/ingest?name=idle.cpu", b"main;work 1\n").0,
        200
    );
    let idle = started.elapsed();
    assert!(idle < std::time::Duration::from_millis(2_500), "{idle:?}");
    let metrics = server.metrics();
    assert!(
        metrics.contains("kiln_ingest_flush_reason_total{reason=\"alone\"} 1\n")
            && !metrics.contains("reason=\"idle\""),
        "{metrics}"
    );
    // With nothing else on its way, the thread that encoded the segment also stored it.
    assert!(
        server
            .metrics()
            .contains("kiln_ingest_flushes_landed_total 1\n"),
        "{}",
        server.metrics()
    );

    let address = server.url.trim_start_matches("http://").to_string();
    let mut stalled = std::net::TcpStream::connect(&address).unwrap();
    use std::io::Write;
    stalled
        .write_all(
            b"POST /ingest?name=stalled.cpu HTTP/1.1\r\nHost: kiln\r\nContent-Length: 100\r\n\r\nmain;",
        )
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let started = std::time::Instant::now();
    assert_eq!(
        server.post("/ingest?name=busy.cpu", b"main;work 1\n").0,
        200
    );
    let busy = started.elapsed();
    assert!(busy < std::time::Duration::from_millis(2_500), "{busy:?}");
    // The stalled upload is not on its way until its body is here: the write flushed
    // alone again, on its own thread, rather than wait for it.
    let metrics = server.metrics();
    assert!(
        metrics.contains("kiln_ingest_flush_reason_total{reason=\"alone\"} 2\n")
            && !metrics.contains("reason=\"busy\"")
            && !metrics.contains("reason=\"interval\""),
        "{metrics}"
    );
    assert!(
        metrics.contains("kiln_ingest_flushes_landed_total 2\n"),
        "{metrics}"
    );
    // Its body, once it comes, is written as any other.
    let rest = format!("{} 1\n", "w".repeat(100 - "main;".len() - " 1\n".len()));
    stalled.write_all(rest.as_bytes()).unwrap();
    let mut answer = [0u8; 12];
    std::io::Read::read_exact(&mut stalled, &mut answer).unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200");
}

#[test]
fn huge_values_saturate_instead_of_overflowing() {
    let server = TestServer::start();
    let body = format!("main;a {max}\nmain;b {max}\n", max = i64::MAX);
    assert_eq!(
        server.post("/ingest?name=huge.wall", body.as_bytes()).0,
        200
    );
    assert_eq!(
        server.post("/ingest?name=huge.wall", body.as_bytes()).0,
        200
    );
    let query = url_escape("wall:wall:nanoseconds:wall:nanoseconds{service_name=\"huge\"}");
    let result = server.json(
        &format!("/pyroscope/render?query={query}&from=0&until=now"),
        &[],
    );
    assert_eq!(ticks(&result), i64::MAX);
    let (status, _) = server.get_bytes("/api/0/profiles/merge?service=huge&type=other", &[]);
    assert_eq!(status, 200);
}

/// Label names are taken as sent or refused, never rewritten: `a-b` and a label given
/// twice are 400s naming the label; a reserved `__` label is dropped with a `Warning`
/// header, so `__name__` cannot change a profile's type.
#[test]
fn label_names_are_checked_not_rewritten() {
    let server = TestServer::start();
    let profile = fixture("profefe-collector_cpu_1.prof");
    for (name, label) in [
        ("app%7Ba-b%3D1%7D", "\"a-b\""),
        ("app%7B1x%3D1%7D", "\"1x\""),
        ("app%7Bk%3Da%2Ck%3Db%7D", "duplicate label \"k\""),
    ] {
        let (status, text) = server.post(&format!("/ingest?name={name}&format=pprof"), &profile);
        assert_eq!(status, 400, "{name}: {text}");
        assert!(text.contains(label), "{name}: {text}");
    }
    let (status, text) = server.post(
        "/api/0/profiles?service=s&type=cpu&labels=a-b%3D1",
        &profile,
    );
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("\\\"a-b\\\""), "{text}");

    // A reserved label is dropped, with a warning, and the type stays CPU.
    let response = TestServer::agent()
        .post(&format!(
            "{}/ingest?name=app%7B__name__%3Devil%2Cenv%3Dprod%7D&format=pprof",
            server.url
        ))
        .send_bytes(&profile)
        .expect("accepted");
    assert_eq!(response.status(), 200);
    let warning = response.header("warning").unwrap_or_default().to_string();
    assert!(
        warning.starts_with("299 - \"") && warning.contains("__name__"),
        "{warning}"
    );
    let types = server.json(
        "/pyroscope/label-values?label=__name__&from=0&until=now%2B1h",
        &[],
    );
    assert!(
        !types.to_string().contains("evil"),
        "a client renamed the profile type: {types}"
    );
    let query =
        url_escape(r#"process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name="app",env="prod"}"#);
    let total = ticks(&server.json(
        &format!("/pyroscope/render?query={query}&from=0&until=now%2B1h"),
        &[],
    ));
    assert_eq!(total, pprof_total(&profile, 1));
    // A valid name with a dot is kept as sent and found by its own name.
    let (status, text) = server.post(
        "/ingest?name=dotted%7Bservice.version%3D1.2%7D&format=pprof",
        &profile,
    );
    assert_eq!(status, 200, "{text}");
    let values = server.json(
        "/pyroscope/label-values?label=service.version&from=0&until=now%2B1h",
        &[],
    );
    assert_eq!(values, serde_json::json!(["1.2"]));

    // The push API: `__name__` is its protocol label; others reserved are dropped.
    let push = serde_json::json!({"series": [{
        "labels": [
            {"name": "__name__", "value": "process_cpu"},
            {"name": "service_name", "value": "pushed"},
            {"name": "__session_id__", "value": "abc"},
        ],
        "samples": [{"rawProfile": base64_encode(&profile), "ID": ""}],
    }]});
    let response = TestServer::agent()
        .post(&format!("{}/push.v1.PusherService/Push", server.url))
        .set("Content-Type", "application/json")
        .send_string(&push.to_string())
        .expect("pushed");
    let warning = response.header("warning").unwrap_or_default().to_string();
    assert!(warning.contains("__session_id__"), "{warning}");
    let bad = serde_json::json!({"series": [{
        "labels": [{"name": "service_name", "value": "x"}, {"name": "a-b", "value": "1"}],
        "samples": [{"rawProfile": base64_encode(&profile), "ID": ""}],
    }]});
    let (status, text) = server.post_with(
        "/push.v1.PusherService/Push",
        bad.to_string().as_bytes(),
        &[("Content-Type", "application/json")],
    );
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("a-b"), "{text}");
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A profile stamped far ahead of the server's clock is refused with the server's time
/// in the message; within the configured skew it is taken.
#[test]
fn far_future_profiles_are_refused() {
    let server = TestServer::start_with(|config| config.limits.max_future_skew_ms = 600_000);
    let profile = fixture("profefe-collector_cpu_1.prof");
    // 2100-01-01
    let (status, text) = server.post("/ingest?name=future&format=pprof&from=4102444800", &profile);
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("2100-01-01T00:00:00"), "{text}");
    let this_year = kiln_model::time::format_rfc3339(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i64,
    );
    assert!(
        text.contains("server's time") && text.contains(&this_year[..4]),
        "{text}"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let (status, text) = server.post(
        &format!("/ingest?name=future&format=pprof&from={}", now + 300),
        &profile,
    );
    assert_eq!(status, 200, "five minutes ahead is within the skew: {text}");
    let (status, _) = server.post(
        &format!("/ingest?name=future&format=pprof&from={}", now + 1200),
        &profile,
    );
    assert_eq!(status, 400, "twenty minutes ahead is not");
}

#[test]
fn a_query_over_its_budget_is_422_with_how_to_narrow_it_and_other_tenants_go_on() {
    let server = TestServer::start_with(|config| config.query.max_profiles = 20);
    // team-a: three services of ten profiles each; team-b: one service of five.
    for (tenant, services, each) in [("team-a", 3, 10), ("team-b", 1, 5)] {
        for service in 0..services {
            for _ in 0..each {
                let (status, text) = server.post_with(
                    &format!("/ingest?name=svc{service}.cpu"),
                    b"main;work 5\n",
                    &[("X-Scope-OrgID", tenant)],
                );
                assert_eq!(status, 200, "{text}");
            }
        }
    }
    let render = |selector: &str, tenant: &str| {
        let query = url_escape(&format!(
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds{selector}"
        ));
        server.get_with(
            &format!("/pyroscope/render?query={query}&from=now-1h&until=now%2B1m"),
            &[("X-Scope-OrgID", tenant)],
        )
    };
    // Other tenants' queries go on while team-a's over-budget queries are refused.
    let (refused, answered) = std::thread::scope(|scope| {
        let refusals = scope.spawn(|| {
            (0..20)
                .map(|_| render("{service_name=~\"svc.*\"}", "team-a"))
                .collect::<Vec<_>>()
        });
        let others = scope.spawn(|| {
            (0..20)
                .map(|_| render("{service_name=\"svc0\"}", "team-b"))
                .collect::<Vec<_>>()
        });
        (refusals.join().unwrap(), others.join().unwrap())
    });
    for (status, text) in &refused {
        assert_eq!(*status, 422, "{text}");
        assert!(
            text.contains("would read 30 profiles")
                && text.contains("query.max_profiles")
                && text.contains("pin a service in the selector"),
            "{text}"
        );
    }
    for (status, text) in &answered {
        assert_eq!(*status, 200, "{text}");
        let result: serde_json::Value = serde_json::from_str(text).expect("json");
        assert_eq!(ticks(&result), 5 * 5 * 10_000_000);
    }
    // Narrowed as the message says, team-a's query is answered.
    let (status, text) = render("{service_name=\"svc1\"}", "team-a");
    assert_eq!(status, 200, "{text}");
    // querier.v1 clients get the same refusal in Connect's shape.
    let request = kiln_query::api::SelectMergeStacktracesRequest {
        profile_type_id: "process_cpu:cpu:nanoseconds:cpu:nanoseconds".into(),
        label_selector: "{}".into(),
        start: 0,
        end: 0,
        max_nodes: Some(-1),
        ..Default::default()
    };
    let (status, body) = server.post_bytes(
        &path("SelectMergeStacktraces"),
        &prost::Message::encode_to_vec(&request),
        &[
            ("Content-Type", "application/proto"),
            ("X-Scope-OrgID", "team-a"),
        ],
    );
    assert_eq!(status, 422);
    let error: serde_json::Value = serde_json::from_slice(&body).expect("connect error");
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("query.max_profiles")),
        "{error}"
    );
}
