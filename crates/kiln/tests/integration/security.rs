//! Issue 56's findings, each reproduced as the probe found it: what a writer, a stalled
//! client or a retrying SDK could do to a server, and what the server must do instead.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use prost::Message as _;
use serde_json::json;

use crate::common::*;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

/// A loopback HTTP server that logs every request line it receives and answers from
/// `route` (status line, extra headers, body).
fn logging_http_server(
    route: impl Fn(&str) -> (&'static str, String, String) + Send + 'static,
) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    let log = Arc::new(Mutex::new(Vec::new()));
    let seen = log.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut line = String::new();
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            // The rest of the head.
            let mut header = String::new();
            while reader.read_line(&mut header).is_ok_and(|n| n > 2) {
                header.clear();
            }
            let target = line.split(' ').nth(1).unwrap_or("").to_string();
            seen.lock().unwrap().push(target.clone());
            let (status, headers, body) = route(&target);
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (address, log)
}

/// A pprof whose one function per file has that file's name, one sample each.
fn profile_with_files(files: &[String]) -> Vec<u8> {
    use kiln_model::build::{Frame, ProfileBuilder};
    let mut builder = ProfileBuilder::new(
        &[("cpu", "nanoseconds")],
        Some(("cpu", "nanoseconds")),
        10_000_000,
    );
    for (i, file) in files.iter().enumerate() {
        let function = format!("f{i}");
        let location = builder.location(&Frame {
            function: &function,
            file,
            line: 3,
            ..Frame::default()
        });
        builder.add(&[location], &[10_000_000], &[]);
    }
    let now = kiln_model::time::now_nanos();
    prost::Message::encode_to_vec(&builder.finish(now - 30_000_000_000, 10_000_000_000))
}

/// Finding 1: `{path}` and `{service}` came from profiles unescaped, so a writer could make
/// the server fetch any path of the source host (or, by a redirect, any host) and show it.
#[test]
fn source_fetches_never_leave_the_url_templates_prefix() {
    let (elsewhere, elsewhere_log) = logging_http_server(|_| {
        (
            "200 OK",
            "content-type: text/plain\r\n".into(),
            "secret elsewhere\n".into(),
        )
    });
    let (source, source_log) = logging_http_server(move |target| match target {
        "/raw/shop/ok.go" => (
            "200 OK",
            "content-type: text/plain\r\n".into(),
            "package ok\n".into(),
        ),
        "/raw/shop/moved.go" => (
            "302 Found",
            "location: /raw/shop/ok.go\r\n".into(),
            String::new(),
        ),
        "/raw/shop/away.go" => (
            "302 Found",
            format!("location: http://{elsewhere}/admin/secret\r\n"),
            String::new(),
        ),
        "/raw/shop/up.go" => (
            "302 Found",
            "location: /admin/secret\r\n".into(),
            String::new(),
        ),
        "/raw/shop/binary.go" => (
            "200 OK",
            "content-type: application/octet-stream\r\n".into(),
            "\u{7f}ELF".into(),
        ),
        target if !target.starts_with("/raw/") => (
            "200 OK",
            "content-type: text/plain\r\n".into(),
            "secret admin\n".into(),
        ),
        _ => ("404 Not Found", String::new(), "no\n".into()),
    });
    let template = format!("http://{source}/raw/{{service}}/{{path}}");
    let server = TestServer::start_with(move |config| config.source.url_template = template);

    let hostile = [
        "%2e%2e/admin/secret",
        ".%2e/admin/secret",
        "%2E%2E/%2E%2E/admin/secret",
        "..\\admin\\secret",
        "%5c..%5cadmin",
        "a%2f..%2f..%2fadmin",
        "x?token=1",
        "x%3ftoken=1",
        "x#fragment",
        "x/%2e/../../admin",
        "x//admin",
        "x%0d%0aHost: evil",
        "../admin/secret",
    ];
    let files: Vec<String> = ["ok.go", "moved.go", "away.go", "up.go", "binary.go"]
        .iter()
        .map(|f| f.to_string())
        .chain(hostile.iter().map(|f| f.to_string()))
        .collect();
    let lines = |service: &str, function: &str| {
        let (status, answer) = post_json(
            &server,
            "/api/v1/lines",
            &json!({ "profile_type": CPU, "selector": format!("{{service_name=\"{service}\"}}"),
                     "from": "now-1h", "until": "now", "function": function }),
        );
        assert_eq!(status, 200, "{answer}");
        answer["sources"].as_array().expect("sources").clone()
    };
    let profile = profile_with_files(&files);
    for service in ["shop", "x/../../internal/api?", "%2e%2e", "a?b#c"] {
        let name = crate::pyroscope::url_escape(service);
        let (status, text) = server.post(&format!("/ingest?name={name}&format=pprof"), &profile);
        assert_eq!(status, 200, "{service}: {text}");
        for (i, file) in files.iter().enumerate() {
            let sources = lines(service, &format!("f{i}"));
            let shown = sources
                .iter()
                .map(|s| s["lines"].to_string())
                .collect::<String>();
            assert!(!shown.contains("secret"), "{service} {file}: {shown}");
            if service == "shop" && (file == "ok.go" || file == "moved.go") {
                assert_eq!(sources.len(), 1, "{file}: {sources:?}");
                assert_eq!(sources[0]["lines"], json!(["package ok"]));
            } else {
                assert!(sources.is_empty(), "{service} {file}: {sources:?}");
            }
        }
    }
    let paths = source_log.lock().unwrap().clone();
    assert!(paths.iter().any(|p| p == "/raw/shop/ok.go"), "{paths:?}");
    for path in &paths {
        let decoded = percent_decode(path);
        assert!(path.starts_with("/raw/"), "left the prefix: {path}");
        assert!(
            !path.contains(['?', '#', '\\']) && !decoded.split('/').any(|s| s == ".." || s == "."),
            "{path} ({decoded})"
        );
    }
    assert!(
        elsewhere_log.lock().unwrap().is_empty(),
        "a redirect was followed off the host"
    );
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(byte) = u8::from_str_radix(&text[i + 1..i + 3], 16) {
                out.push(byte);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Sends a request head (no body) on a fresh connection.
pub fn send_head(server: &TestServer, head: &str) -> std::net::TcpStream {
    let address = server.url.trim_start_matches("http://").to_string();
    let mut stream = std::net::TcpStream::connect(address).expect("connect");
    stream.write_all(head.as_bytes()).expect("head");
    stream
}

/// Reads an answer's head (up to the blank line), within `timeout`.
pub fn read_head(stream: &mut std::net::TcpStream, timeout: std::time::Duration) -> String {
    use std::io::Read;
    stream.set_read_timeout(Some(timeout)).expect("timeout");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// Reads an answer's head and checks its status and that the connection is closed.
pub fn refused_and_closed(
    stream: &mut std::net::TcpStream,
    status: &str,
    timeout: std::time::Duration,
) -> String {
    let head = read_head(stream, timeout);
    assert!(head.starts_with(&format!("HTTP/1.1 {status}")), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
    head
}

pub fn ingest_head(service: &str, tenant: &str, length: usize, extra: &str) -> String {
    format!(
        "POST /ingest?name={service}.cpu&format=pprof HTTP/1.1\r\nHost: kiln\r\nX-Scope-OrgID: {tenant}\r\nContent-Length: {length}\r\n{extra}\r\n"
    )
}

/// Finding 2: the in-flight budget was reserved from the declared `Content-Length`, so
/// four idle connections declaring 16 MiB blocked every write for 180 s.
#[test]
fn stalled_uploads_hold_no_budget_and_are_closed_when_idle() {
    let server = TestServer::start_with(|config| config.http.body_idle_timeout_ms = 2_000);
    let profile = fixture("profefe-collector_cpu_1.prof");
    let stalled: Vec<_> = (0..50)
        .map(|i| {
            let tenant = ["team-a", "team-b", "team-c", "team-d"][i % 4];
            send_head(&server, &ingest_head("stall", tenant, 16 << 20, ""))
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(300));
    for tenant in ["team-a", "team-z"] {
        for _ in 0..3 {
            let (status, text) = server.post_with(
                "/ingest?name=good.cpu&format=pprof",
                &profile,
                &[("X-Scope-OrgID", tenant)],
            );
            assert_eq!(status, 200, "{tenant}: {text}");
        }
    }
    // Past the idle timeout, each stalled upload is answered 408 and closed.
    for mut stream in stalled.into_iter().take(4) {
        refused_and_closed(&mut stream, "408", std::time::Duration::from_secs(10));
    }
    assert!(
        server.counter("kiln_ingest_rejected_total{endpoint=\"ingest\",reason=\"timeout\"}") >= 4.0,
        "{}",
        server.metrics()
    );
}

/// A declared body larger than what is free of the tenant's in-flight bound is refused
/// before a byte of it is read; a client that asked with `Expect: 100-continue` is told
/// no without being asked for its body, and one that fits is asked for it.
#[test]
fn refusals_come_after_the_headers_and_honour_expect_100_continue() {
    let server = TestServer::start_with(|config| {
        let small = kiln_ingest::Limits {
            max_inflight_bytes: 1 << 20,
            ..config.limits
        };
        config.tenant_limits.insert("small".into(), small);
        let slow = kiln_ingest::Limits {
            ingestion_rate_bytes: 1_000,
            ingestion_burst_bytes: 10_000,
            ..config.limits
        };
        config.tenant_limits.insert("slow".into(), slow);
    });
    // One upload declares all of tenant small's 1 MiB and sends 640 KiB of it: while its
    // bytes come, it holds its whole declared length.
    let mut holder = send_head(&server, &ingest_head("holder", "small", 1 << 20, ""));
    holder.write_all(&vec![b'x'; 640 << 10]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    // Another declares 1 MiB: refused at once, its body never sent.
    let started = std::time::Instant::now();
    let mut refused = send_head(&server, &ingest_head("second", "small", 1 << 20, ""));
    refused_and_closed(&mut refused, "429", std::time::Duration::from_secs(5));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // Over the tenant's rate, with Expect: 100-continue: the final answer, no 100.
    let mut expecting = send_head(
        &server,
        &ingest_head("rate", "slow", 1 << 20, "Expect: 100-continue\r\n"),
    );
    let head = read_head(&mut expecting, std::time::Duration::from_secs(5));
    assert!(head.starts_with("HTTP/1.1 429"), "{head}");
    // Stalled for a second, the holder keeps only the 640 KiB it sent: one that fits in
    // the rest is asked for its body, and stored.
    std::thread::sleep(std::time::Duration::from_millis(1_500));
    let profile = fixture("profefe-collector_cpu_1.prof");
    let mut fits = send_head(
        &server,
        &ingest_head("fits", "small", profile.len(), "Expect: 100-continue\r\n"),
    );
    let head = read_head(&mut fits, std::time::Duration::from_secs(5));
    assert!(head.starts_with("HTTP/1.1 100"), "{head}");
    fits.write_all(&profile).unwrap();
    let head = read_head(&mut fits, std::time::Duration::from_secs(10));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    drop(holder);
}

/// Finding 4: read tokens could call the node-to-node endpoints, and their 503 named the
/// server's data directory.
#[test]
fn partial_endpoints_need_the_node_credential_and_errors_name_no_server_path() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("node-token");
    let node_token = "node-secret-0123456789abcdef0123456789";
    std::fs::write(&token_file, format!("{node_token}\n")).unwrap();
    let server = TestServer::start_with(|config| {
        config.auth = crate::auth::auth_config(1000);
        config.cluster.token_file = Some(token_file.clone());
    });
    let data_dir = server
        .data_dir()
        .canonicalize()
        .unwrap()
        .display()
        .to_string();
    let share = json!({
        "profile_type": CPU, "selector": "{}", "from_nanos": 0, "to_nanos": i64::MAX,
        "datasets": [{ "block_id": "01J00000000000000000000000", "object_key": "blocks/../../etc/passwd",
                       "tenant": "team-a", "service": "s", "row_group": 0,
                       "min_time_nanos": 0, "max_time_nanos": 1, "profile_types": [CPU],
                       "profile_count": 1 }]
    })
    .to_string();
    for path in [
        "/api/v1/partial/tree",
        "/api/v1/partial/profile",
        "/api/v1/partial/series",
    ] {
        for authorization in [
            crate::auth::bearer(crate::auth::READER_A),
            crate::auth::bearer(crate::auth::WRITER_A),
        ] {
            let (status, text) = server.post_with(
                path,
                share.as_bytes(),
                &[
                    ("Authorization", &authorization),
                    ("X-Scope-OrgID", "team-a"),
                ],
            );
            assert_eq!(status, 403, "{path}: {text}");
            assert!(text.contains("cluster.token_file"), "{text}");
        }
        let (status, text) = server.post_with(
            path,
            share.as_bytes(),
            &[
                ("Authorization", &format!("Bearer {node_token}")),
                ("X-Scope-OrgID", "team-a"),
            ],
        );
        assert_ne!(status, 403, "{path}: {text}");
        assert_ne!(status, 401, "{path}: {text}");
        assert!(
            !text.contains(&data_dir),
            "{path} names the data directory: {text}"
        );
        assert!(!text.contains("file://"), "{path}: {text}");
    }
    // Split roles with auth on and no node credential: refused at start, saying why.
    let err = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(kiln_node::Server::start(kiln_node::ServerConfig {
            listen: "127.0.0.1:0".into(),
            data_dir: dir.path().join("q"),
            target: "query".into(),
            auth: crate::auth::auth_config(1000),
            ..kiln_node::ServerConfig::default()
        }))
        .err()
        .expect("refused");
    assert!(err.to_string().contains("cluster.token_file"), "{err}");
}

/// POSTs and returns the status, the body and the `Warning` headers.
fn post_warned(
    server: &TestServer,
    path_and_query: &str,
    body: &[u8],
    headers: &[(&str, &str)],
) -> (u16, String, Vec<String>) {
    send(server, "POST", path_and_query, body, headers, "warning")
}

/// Finding 6: an SDK whose upload timed out sends it again, and the profile was stored
/// twice. Now a retry is acknowledged and not stored again, on every write protocol;
/// what differs in content is stored, and an `Idempotency-Key` says what a retry is.
#[test]
fn retries_are_acknowledged_and_stored_once() {
    let server = TestServer::start();
    let cpu = fixture("profefe-collector_cpu_1.prof");
    let once = pprof_total(&cpu, 1);

    // /ingest: the same request twice, then once more uncompressed: the same profile. (As
    // the SDKs send it, with its time range: without `from` a profile is stamped with
    // its arrival, and each arrival is another profile.)
    let plain = kiln_model::compress::gunzip_bounded(&cpu, 1 << 30).unwrap();
    assert_ne!(plain, cpu);
    for (attempt, body) in [&cpu, &cpu, &plain].into_iter().enumerate() {
        let (status, text, warnings) = post_warned(
            &server,
            "/ingest?name=retry-ingest.cpu&format=pprof&from=1700000000&until=1700000010",
            body,
            &[],
        );
        assert_eq!(status, 200, "{text}");
        assert_eq!(
            warnings.iter().any(|w| w.contains("stored already")),
            attempt > 0,
            "attempt {attempt}: {warnings:?}"
        );
    }
    assert_eq!(crate::push::cpu_total(&server, "retry-ingest"), once);

    // The push API: the same request twice.
    let push = crate::push::request("retry-push", &plain, "6f1e2d3c-0000-4000-8000-00000000aaaa")
        .encode_to_vec();
    for _ in 0..2 {
        let (status, text, _) = post_warned(
            &server,
            "/push.v1.PusherService/Push",
            &push,
            &[("Content-Type", "application/proto")],
        );
        assert_eq!(status, 200, "{text}");
    }
    assert_eq!(crate::push::cpu_total(&server, "retry-push"), once);

    // profefe: the second upload answers the first one's id, and one copy is stored.
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (status, text, _) = post_warned(
            &server,
            "/api/0/profiles?service=retry-profefe&type=cpu",
            &cpu,
            &[],
        );
        assert_eq!(status, 200, "{text}");
        let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
        ids.push(answer["body"]["id"].as_str().unwrap().to_string());
    }
    assert_eq!(ids[0], ids[1]);
    let (status, merged) =
        server.get_bytes("/api/0/profiles/merge?service=retry-profefe&type=cpu", &[]);
    assert_eq!(status, 200);
    assert_eq!(pprof_total(&merged, 1), once);
    let (status, by_id) = server.get_bytes(&format!("/api/0/profiles/{}", ids[0]), &[]);
    assert_eq!(status, 200);
    assert_eq!(pprof_total(&by_id, 1), once);

    // Two different profiles with the same labels and time are both stored.
    let folded = |body: &str| {
        let (status, text, warnings) = post_warned(
            &server,
            "/ingest?name=retry-twins.cpu&format=folded&sampleRate=100&from=1700000000&until=1700000010",
            body.as_bytes(),
            &[],
        );
        assert_eq!(status, 200, "{text}");
        warnings
    };
    assert!(folded("main;a 10\n").is_empty());
    assert!(folded("main;b 10\n").is_empty());
    assert_eq!(
        crate::push::cpu_total(&server, "retry-twins"),
        20 * 10_000_000
    );

    // An Idempotency-Key takes precedence: another body under the same key is the
    // retry, and the same body under another key is a new write.
    let keyed = |body: &str, key: &str| {
        let (status, text, _) = post_warned(
            &server,
            "/ingest?name=retry-keyed.cpu&format=folded&sampleRate=100&from=1700000000&until=1700000010",
            body.as_bytes(),
            &[("Idempotency-Key", key)],
        );
        assert_eq!(status, 200, "{text}");
    };
    keyed("main;a 10\n", "upload-1");
    keyed("main;a 30\n", "upload-1");
    assert_eq!(
        crate::push::cpu_total(&server, "retry-keyed"),
        10 * 10_000_000
    );
    keyed("main;a 10\n", "upload-2");
    assert_eq!(
        crate::push::cpu_total(&server, "retry-keyed"),
        20 * 10_000_000
    );
    let (status, text, _) = post_warned(
        &server,
        "/ingest?name=retry-keyed.cpu&format=folded",
        b"main;a 1\n",
        &[("Idempotency-Key", "two words")],
    );
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("Idempotency-Key"), "{text}");
    assert_eq!(
        server.counter("kiln_ingest_duplicates_total{endpoint=\"ingest\"}"),
        3.0
    );

    // With the window at 0, every copy is stored, as before.
    let server = TestServer::start_with(|config| config.limits.dedup_window_ms = 0);
    for _ in 0..2 {
        let (status, text) = server.post(
            "/ingest?name=retry-off.cpu&format=pprof&from=1700000000&until=1700000010",
            &cpu,
        );
        assert_eq!(status, 200, "{text}");
    }
    assert_eq!(crate::push::cpu_total(&server, "retry-off"), 2 * once);
}

/// Finding 6 across a crash: the server is killed (SIGKILL) after it made a write
/// durable and before its client read the answer; the client sends it again to the
/// restarted server, which stores nothing twice. One write's identity comes back from
/// the metastore (its segment was flushed), the other's from the write-ahead log.
#[test]
fn a_retry_after_kill_9_between_write_and_acknowledgement_is_stored_once() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let command = kiln_server(dir.path()).args(["--retention-days", "0"]);
    let port = command.port_number();
    let url = command.url();
    let mut server = command.start().expect("kiln server starts");
    let client = TestServer::at(&url);
    let path = |service: &str| {
        format!("/ingest?name={service}.cpu&format=folded&sampleRate=100&from=1700000000&until=1700000010")
    };
    let flushed_body = "main;flushed 25\n";
    let logged_body = "main;logged 40\n";
    // The first write is acknowledged, and a query flushes it into a segment.
    let (status, text) = client.post(&path("crash-flushed"), flushed_body.as_bytes());
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        crate::push::cpu_total(&client, "crash-flushed"),
        25 * 10_000_000
    );
    // The second is sent whole; the server is killed once it is in the log, and its
    // answer is never read.
    let wal = dir.path().join("wal");
    let logged_bytes = || -> u64 {
        std::fs::read_dir(&wal)
            .map(|entries| {
                entries
                    .flatten()
                    .filter_map(|entry| entry.metadata().ok())
                    .map(|meta| meta.len())
                    .sum()
            })
            .unwrap_or(0)
    };
    assert_eq!(logged_bytes(), 0, "the flushed write's log is gone");
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "POST {} HTTP/1.1\r\nHost: kiln\r\nContent-Length: {}\r\n\r\n{logged_body}",
        path("crash-logged"),
        logged_body.len()
    )
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while logged_bytes() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the write was never logged"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    server.kill().expect("SIGKILL");
    let mut unread = Vec::new();
    let _ = stream.read_to_end(&mut unread);
    drop(stream);

    server.restart().expect("kiln server starts again");
    for (service, body) in [
        ("crash-flushed", flushed_body),
        ("crash-logged", logged_body),
    ] {
        let (status, text, warnings) = post_warned(&client, &path(service), body.as_bytes(), &[]);
        assert_eq!(status, 200, "{service}: {text}");
        assert!(
            warnings.iter().any(|w| w.contains("stored already")),
            "{service}: the retry is known as one: {warnings:?}"
        );
    }
    assert_eq!(
        crate::push::cpu_total(&client, "crash-flushed"),
        25 * 10_000_000
    );
    assert_eq!(
        crate::push::cpu_total(&client, "crash-logged"),
        40 * 10_000_000
    );
}

/// A push of one series per value of label `user`, from `first` on.
fn push_users(server: &TestServer, first: usize, count: usize) -> (u16, String) {
    use kiln_ingest::push::{LabelPair, PushRequest, RawProfileSeries, RawSample};
    let profile = profile_with_files(&["main.go".to_string()]);
    let label = |name: &str, value: String| LabelPair {
        name: name.into(),
        value,
    };
    let request = PushRequest {
        series: (first..first + count)
            .map(|user| RawProfileSeries {
                labels: vec![
                    label("__name__", "process_cpu".into()),
                    label("service_name", "cardinal".into()),
                    label("user", format!("u{user}")),
                ],
                samples: vec![RawSample {
                    raw_profile: profile.clone(),
                    id: String::new(),
                }],
            })
            .collect(),
    };
    let (status, body, _) = send(
        server,
        "POST",
        "/push.v1.PusherService/Push",
        &request.encode_to_vec(),
        &[("Content-Type", "application/proto")],
        "warning",
    );
    (status, body)
}

/// Finding 7, at the default limits: 100,000 values of one label were all accepted; a
/// 4 MB function name was stored; a 200,000-frame stack was cut without a word; a real
/// 20,430-sample profile got 413.
#[test]
fn cardinality_and_sizes_are_bounded_at_the_defaults() {
    let server = TestServer::start_with(|config| {
        config.limits.max_samples_per_profile =
            kiln_ingest::Limits::default().max_samples_per_profile;
    });
    // Values of one label: accepted up to limits.max_label_values_per_name (10,000), the
    // next series refused with 429 naming its label set; the known ones still go in.
    for batch in 0..10 {
        let (status, body) = push_users(&server, batch * 1_000, 1_000);
        assert_eq!(status, 200, "batch {batch}: {body}");
    }
    let (status, body) = push_users(&server, 10_000, 1);
    assert_eq!(status, 429, "{body}");
    assert!(
        body.contains("max_label_values_per_name") && body.contains("user=\\\"u10000\\\""),
        "{body}"
    );
    assert_eq!(push_users(&server, 5, 1).0, 200, "a known series");
    assert_eq!(
        server.counter("kiln_ingest_series_refused_total{limit=\"label_values\"}"),
        1.0
    );

    // A 4 MB function name is cut to 4 KiB and said so.
    let long = "f".repeat(4 << 20);
    let (status, text, warnings) = post_warned(
        &server,
        "/ingest?name=long.cpu&format=folded&sampleRate=100",
        format!("main;{long} 5\n").as_bytes(),
        &[],
    );
    assert_eq!(status, 200, "{text}");
    assert!(
        warnings.iter().any(|w| w.contains("4096 bytes were cut")),
        "{warnings:?}"
    );
    let query = crate::pyroscope::url_escape(&format!("{CPU}{{service_name=\"long\"}}"));
    let rendered = server.json(
        &format!("/pyroscope/render?query={query}&from=0&until=now%2B1h"),
        &[],
    );
    let names = rendered["flamebearer"]["names"].as_array().unwrap().clone();
    let longest = names
        .iter()
        .filter_map(|n| n.as_str())
        .map(str::len)
        .max()
        .unwrap();
    assert!(
        (4096..4200).contains(&longest),
        "longest stored name: {longest} bytes"
    );

    // A 200,000-frame stack keeps its innermost frames, with a Warning and a metric.
    let frames: Vec<String> = (0..200_000).map(|i| format!("g{i}")).collect();
    let (status, text, warnings) = post_warned(
        &server,
        "/ingest?name=deep.cpu&format=folded&sampleRate=100",
        format!("{} 3\n", frames.join(";")).as_bytes(),
        &[],
    );
    assert_eq!(status, 200, "{text}");
    assert!(
        warnings.iter().any(|w| w.contains("max_stack_depth")),
        "{warnings:?}"
    );
    assert_eq!(
        server.counter("kiln_ingest_cut_total{what=\"stacks\"}"),
        1.0
    );
    // The long name was the function's name and its system name.
    assert_eq!(server.counter("kiln_ingest_cut_total{what=\"names\"}"), 2.0);

    // The corpus's 20,430-sample profile is accepted whole.
    if let Some(large) = corpus("pprof-large.cpu.pb.gz") {
        let samples = kiln_model::pprof::decode(&large, 1 << 30)
            .unwrap()
            .sample
            .len();
        assert_eq!(samples, 20_430);
        let (status, text, warnings) = post_warned(
            &server,
            "/ingest?name=large.cpu&format=pprof&from=1700000000&until=1700000010",
            &large,
            &[],
        );
        assert_eq!(status, 200, "{text}");
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(
            crate::push::cpu_total(&server, "large"),
            pprof_total(&large, 1)
        );
    }
}

/// Finding 7: past `limits.max_series_per_tenant`, a new series is refused naming its
/// label set, and the series already written keep being accepted.
#[test]
fn new_series_past_the_tenants_limit_are_refused() {
    let server = TestServer::start_with(|config| config.limits.max_series_per_tenant = 20);
    assert_eq!(push_users(&server, 0, 20).0, 200);
    let (status, body) = push_users(&server, 20, 1);
    assert_eq!(status, 429, "{body}");
    assert!(
        body.contains("max_series_per_tenant") && body.contains("u20"),
        "{body}"
    );
    assert_eq!(push_users(&server, 3, 1).0, 200);
}

/// Finding 5's benchmark, briefly (its figures are for docs/benchmarks.md): both phases
/// run against a server of their own, and each stores profiles.
#[test]
fn the_goodput_bench_runs_briefly() {
    let output = run_kiln([
        "bench",
        "goodput",
        "--writers",
        "2,8",
        "--seconds",
        "2",
        "--profile-bytes",
        "200000",
    ]);
    let phases: Vec<&str> = output
        .lines()
        .filter(|line| line.ends_with("MiB"))
        .collect();
    assert_eq!(phases.len(), 2, "{output}");
    for phase in phases {
        let stored: usize = phase
            .split_whitespace()
            .nth(2)
            .and_then(|stored| stored.parse().ok())
            .unwrap_or_else(|| panic!("{output}"));
        assert!(stored > 0, "{output}");
    }
    assert!(output.contains("× the goodput of 2 writers"), "{output}");
}
