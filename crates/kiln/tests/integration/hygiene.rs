//! Hostile names: tenant ids, service names and label values with `../`, NUL, non-UTF-8
//! bytes and great length. Each is refused with a 4xx or stored as the exact string it
//! was, and none reaches a file name or an object key: every file the server writes is
//! one of its own names.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;

use crate::common::*;

/// Sends raw bytes as one HTTP/1.1 request and returns the status.
fn raw(server: &TestServer, request: &[u8]) -> u16 {
    let address = server.url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request).expect("send");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    text.split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP answer: {text:?}"))
}

fn ingest_request(target: &[u8], tenant: Option<&[u8]>) -> Vec<u8> {
    let body = b"main;work 1\n";
    let mut request = b"POST ".to_vec();
    request.extend_from_slice(target);
    request.extend_from_slice(b" HTTP/1.1\r\nHost: kiln\r\nConnection: close\r\n");
    if let Some(tenant) = tenant {
        request.extend_from_slice(b"X-Scope-OrgID: ");
        request.extend_from_slice(tenant);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
    request.extend_from_slice(body);
    request
}

/// Every file under `root`, relative, with `/` between parts.
fn files(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let relative = path.strip_prefix(root).expect("under root");
                found.push(relative.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    found
}

/// The server's own names: the metastore, and objects named by ULIDs.
fn is_own_name(name: &str) -> bool {
    let ulid_object = |prefix: &str| {
        name.strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix(".parquet"))
            .is_some_and(|id| id.len() == 26 && id.bytes().all(|b| b.is_ascii_alphanumeric()))
    };
    name.starts_with("metastore.db")
        || ulid_object("blocks/segments/")
        || ulid_object("blocks/blocks/")
}

/// A request target, its tenant header, and the statuses it may get.
type Case = (Vec<u8>, Option<Vec<u8>>, &'static [u16]);

#[test]
fn hostile_names_are_refused_or_kept_exactly_and_never_become_paths() {
    let server = TestServer::start();
    let long = "s".repeat(5000);
    let cases: Vec<Case> = vec![
        (
            b"/ingest?name=..%2F..%2Fetc%2Fpasswd.cpu".to_vec(),
            None,
            &[200],
        ),
        (b"/ingest?name=%2Fabs%2Fpath.cpu".to_vec(), None, &[200]),
        (b"/ingest?name=nul%00byte.cpu".to_vec(), None, &[200, 400]),
        (b"/ingest?name=bad%FF%FEutf8.cpu".to_vec(), None, &[400]),
        (
            format!("/ingest?name={long}.cpu").into_bytes(),
            None,
            &[400],
        ),
        (
            b"/ingest?name=labels.cpu%7Bdir%3D..%2F..%2Fx%7D".to_vec(),
            None,
            &[200],
        ),
        (
            b"/ingest?name=t.cpu".to_vec(),
            Some(b"../evil".to_vec()),
            &[400],
        ),
        (b"/ingest?name=t.cpu".to_vec(), Some(b"..".to_vec()), &[400]),
        (
            b"/ingest?name=t.cpu".to_vec(),
            Some(b"a/b".to_vec()),
            &[400],
        ),
        (
            b"/ingest?name=t.cpu".to_vec(),
            Some(vec![b'x'; 200]),
            &[400],
        ),
        (
            b"/ingest?name=t.cpu".to_vec(),
            Some(b"caf\xc3\xa9".to_vec()),
            &[400],
        ),
        (
            b"/ingest?name=t.cpu".to_vec(),
            Some(b"\xff\xfe".to_vec()),
            &[400],
        ),
        (
            b"/api/0/profiles?service=..%2F..%2Fprofefe&type=cpu".to_vec(),
            None,
            &[200, 400],
        ),
    ];
    for (target, tenant, allowed) in &cases {
        let status = raw(&server, &ingest_request(target, tenant.as_deref()));
        assert!(
            allowed.contains(&status),
            "{} (tenant {:?}): {status}",
            String::from_utf8_lossy(target),
            tenant.as_deref().map(String::from_utf8_lossy)
        );
    }
    // What was accepted is stored under exactly the name it was sent with.
    let values = server.json(
        "/pyroscope/label-values?label=service_name&from=now-1h&until=now%2B1m",
        &[],
    );
    let values: Vec<&str> = values
        .as_array()
        .expect("label values")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(values.contains(&"../../etc/passwd"), "{values:?}");
    assert!(values.contains(&"/abs/path"), "{values:?}");
    assert!(!values.iter().any(|v| v.contains('\u{fffd}')), "{values:?}");
    let dirs = server.json(
        "/pyroscope/label-values?label=dir&from=now-1h&until=now%2B1m",
        &[],
    );
    assert_eq!(dirs, serde_json::json!(["../../x"]));
    // Nothing but the server's own names on disk, and nothing outside its directory.
    let on_disk = files(server.data_dir());
    assert!(!on_disk.is_empty());
    for name in &on_disk {
        assert!(is_own_name(name), "unexpected file {name:?} in {on_disk:?}");
    }
    for key in server.object_keys() {
        assert!(is_own_name(&format!("blocks/{key}")), "object key {key:?}");
    }
}
