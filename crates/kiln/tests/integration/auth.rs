//! Authentication and authorisation: tokens per tenant with scopes, as Bearer or basic
//! auth; every refusal's status and challenge; the CLI, the Python SDK and the agent
//! sending their tokens.

use std::process::Command;

use base64::Engine;
use kiln_auth::sha256_hex;

use crate::common::*;
use crate::pyroscope::{names, ticks, url_escape};

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
pub const WRITER_A: &str = "kiln_test_writer_a_0123456789abcdefghijklmnopq";
pub const READER_A: &str = "kiln_test_reader_a_0123456789abcdefghijklmnopq";
pub const OPS_B: &str = "kiln_test_ops_b_0123456789abcdefghijklmnopqrstu";

/// The issue's example: team-a with a write-only and a read-only token, team-b with one
/// that may do everything.
pub fn auth_config(max_failures_per_minute: u32) -> kiln_auth::AuthConfig {
    let yaml = format!(
        r#"
enabled: true
max_failures_per_minute: {max_failures_per_minute}
tenants:
  team-a:
    tokens:
      - {{ name: ci-agent, sha256: "{}", scopes: [write] }}
      - {{ name: grafana,  sha256: "{}", scopes: [read] }}
  team-b:
    tokens:
      - {{ name: ops, sha256: "{}", scopes: [read, write, admin] }}
"#,
        sha256_hex(WRITER_A),
        sha256_hex(READER_A),
        sha256_hex(OPS_B)
    );
    yaml_serde::from_str(&yaml).expect("auth config")
}

pub fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

fn basic(user: &str, token: &str) -> String {
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{token}"));
    format!("Basic {encoded}")
}

pub fn render_query(service: &str) -> String {
    format!(
        "/pyroscope/render?query={}&from=0&until=now%2B1h",
        url_escape(&format!("{CPU}{{service_name=\"{service}\"}}"))
    )
}

/// Status, body and `WWW-Authenticate` values of a request.
fn request(
    server: &TestServer,
    method: &str,
    path: &str,
    body: &[u8],
    headers: &[(&str, &str)],
) -> (u16, String, Vec<String>) {
    send(server, method, path, body, headers, "www-authenticate")
}

fn status(server: &TestServer, method: &str, path: &str, headers: &[(&str, &str)]) -> u16 {
    request(server, method, path, b"main;work 7\n", headers).0
}

#[test]
fn tokens_allow_their_tenant_and_scopes_and_nothing_else() {
    let server = TestServer::start_with(|config| config.auth = auth_config(1000));
    let ingest = "/ingest?name=authsvc.cpu";
    let (writer, reader, ops) = (bearer(WRITER_A), bearer(READER_A), bearer(OPS_B));

    // No credentials: 401 with both challenges; the UI (X-Requested-With) gets Bearer only.
    let (code, body, challenges) = request(&server, "POST", ingest, b"main;work 7\n", &[]);
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("Authorization: Bearer"), "{body}");
    assert_eq!(
        challenges,
        vec![
            "Bearer realm=\"kiln\"".to_string(),
            "Basic realm=\"kiln\", charset=\"UTF-8\"".to_string()
        ]
    );
    let (_, _, from_ui) = request(
        &server,
        "GET",
        &render_query("authsvc"),
        b"",
        &[("X-Requested-With", "kiln-ui")],
    );
    assert_eq!(from_ui, vec!["Bearer realm=\"kiln\"".to_string()]);
    assert_eq!(
        status(
            &server,
            "POST",
            ingest,
            &[("Authorization", &bearer("kiln_guess"))]
        ),
        401
    );

    // The write token writes, into its own tenant, without naming it.
    assert_eq!(
        status(&server, "POST", ingest, &[("Authorization", &writer)]),
        200
    );
    assert_eq!(
        status(
            &server,
            "POST",
            ingest,
            &[("Authorization", &writer), ("X-Scope-OrgID", "team-a")]
        ),
        200
    );
    // ... but not into another tenant, and it cannot read.
    let (code, body, _) = request(
        &server,
        "POST",
        ingest,
        b"main;work 7\n",
        &[("Authorization", &writer), ("X-Scope-OrgID", "team-b")],
    );
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("belongs to tenant \"team-a\""), "{body}");
    let (code, body, _) = request(
        &server,
        "GET",
        &render_query("authsvc"),
        b"",
        &[("Authorization", &writer)],
    );
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("read scope"), "{body}");

    // The read token reads what was written (two pushes of 7 samples, 10 ms each at
    // /ingest's default 100 Hz), and cannot write.
    let (code, body, _) = request(
        &server,
        "GET",
        &render_query("authsvc"),
        b"",
        &[("Authorization", &reader)],
    );
    assert_eq!(code, 200, "{body}");
    let result: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(ticks(&result), 2 * 7 * 10_000_000);
    assert!(names(&result).contains(&"work".to_string()));
    assert_eq!(
        status(&server, "POST", ingest, &[("Authorization", &reader)]),
        403
    );
    // Basic auth: the user name is the tenant.
    assert_eq!(
        status(
            &server,
            "GET",
            &render_query("authsvc"),
            &[("Authorization", &basic("team-a", READER_A))]
        ),
        200
    );
    assert_eq!(
        status(
            &server,
            "GET",
            &render_query("authsvc"),
            &[("Authorization", &basic("team-b", READER_A))]
        ),
        403
    );
    // team-b's data is its own: its token sees nothing of team-a's.
    let (code, body, _) = request(
        &server,
        "GET",
        &render_query("authsvc"),
        b"",
        &[("Authorization", &ops)],
    );
    assert_eq!(code, 200, "{body}");
    let result: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(ticks(&result), 0, "{body}");

    // Admin endpoints: rules. A read token may list them, not create them.
    let rule = serde_json::json!({
        "metric_name": "authsvc_work_cpu",
        "profile_type": CPU,
        "matchers": "{service_name=\"authsvc\"}",
        "function_name": "work",
    })
    .to_string();
    let (code, body, _) = request(
        &server,
        "POST",
        "/api/v1/recording-rules",
        rule.as_bytes(),
        &[
            ("Authorization", &reader),
            ("Content-Type", "application/json"),
        ],
    );
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("admin scope"), "{body}");
    assert_eq!(
        status(
            &server,
            "GET",
            "/api/v1/recording-rules",
            &[("Authorization", &reader)]
        ),
        200
    );
    let (code, body, _) = request(
        &server,
        "POST",
        "/api/v1/recording-rules",
        rule.as_bytes(),
        &[
            ("Authorization", &ops),
            ("Content-Type", "application/json"),
        ],
    );
    assert!(code == 200 || code == 201, "{code}: {body}");

    // Connect and gRPC clients get their own shape of the refusal.
    let (code, body, challenges) = request(
        &server,
        "POST",
        "/querier.v1.QuerierService/ProfileTypes",
        b"{}",
        &[("Content-Type", "application/json")],
    );
    assert_eq!(code, 401);
    assert!(!challenges.is_empty());
    let error: serde_json::Value = serde_json::from_str(&body).expect("connect error");
    assert_eq!(error["code"], "unauthenticated", "{body}");
    let (code, body, _) = request(
        &server,
        "POST",
        "/querier.v1.QuerierService/ProfileTypes",
        b"{}",
        &[
            ("Content-Type", "application/json"),
            ("Authorization", &writer),
        ],
    );
    assert_eq!(code, 403);
    let error: serde_json::Value = serde_json::from_str(&body).expect("connect error");
    assert_eq!(error["code"], "permission_denied", "{body}");

    // Open: health and the UI's files. /metrics needs the admin scope by default.
    assert_eq!(status(&server, "GET", "/ready", &[]), 200);
    assert_eq!(status(&server, "GET", "/", &[]), 200);
    assert_eq!(status(&server, "GET", "/ui/app.js", &[]), 200);
    assert_eq!(status(&server, "GET", "/metrics", &[]), 401);
    let metrics = admin_metrics(&server);
    for reason in ["missing", "invalid", "wrong_tenant", "scope"] {
        let line = format!("kiln_auth_failures_total{{reason=\"{reason}\"}} ");
        let count: f64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&line)?.parse().ok())
            .unwrap_or_else(|| panic!("no {line} in {metrics}"));
        assert!(count >= 1.0, "{line}{count}");
    }
}

#[test]
fn metrics_need_admin_by_default_and_prometheus_gets_in_with_basic_auth() {
    let server = TestServer::start_with(|config| config.auth = auth_config(1000));
    assert_eq!(status(&server, "GET", "/metrics", &[]), 401);
    assert_eq!(
        status(
            &server,
            "GET",
            "/metrics",
            &[("Authorization", &bearer(READER_A))]
        ),
        403
    );
    // What Prometheus sends for `basic_auth: {username: team-b, password: <token>}`.
    let body = admin_metrics(&server);
    assert!(body.contains("kiln_auth_failures_total"), "{body}");
    assert_eq!(status(&server, "GET", "/ready", &[]), 200);
    // Opened on purpose.
    let open = TestServer::start_with(|config| {
        config.auth = auth_config(1000);
        config.auth.metrics_scope = None;
    });
    assert_eq!(status(&open, "GET", "/metrics", &[]), 200);
}

/// Finding 3: failures were counted per address, so 30 requests without a token (a few
/// UI page loads) locked every client behind the same NAT out for a minute, valid
/// tokens included.
#[test]
fn failures_never_lock_out_valid_credentials_behind_the_same_address() {
    let server = TestServer::start_with(|config| config.auth = auth_config(5));
    let path = render_query("any");
    // A browser that has not asked for a token yet: 401 each time, never 429.
    for _ in 0..40 {
        assert_eq!(
            status(&server, "GET", &path, &[("X-Requested-With", "kiln-ui")]),
            401
        );
    }
    for _ in 0..5 {
        assert_eq!(
            status(
                &server,
                "GET",
                &path,
                &[("Authorization", &bearer("kiln_guess"))]
            ),
            401
        );
    }
    // The guesser is told to wait...
    let mut request = TestServer::agent().get(&format!("{}{path}", server.url));
    request = request.set("Authorization", &bearer("kiln_guess_again"));
    let Err(ureq::Error::Status(429, response)) = request.call() else {
        panic!("expected 429");
    };
    let retry: u64 = response
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert!((1..=60).contains(&retry), "{retry}");
    assert!(response
        .into_string()
        .unwrap_or_default()
        .contains("too many failed authentication attempts"));
    // ...and everyone with valid credentials at the same address goes on.
    assert_eq!(
        status(
            &server,
            "GET",
            &path,
            &[("Authorization", &bearer(READER_A))]
        ),
        200
    );
    assert_eq!(
        status(
            &server,
            "POST",
            "/ingest?name=natsvc.cpu",
            &[("Authorization", &bearer(WRITER_A))]
        ),
        200
    );
    let metrics = admin_metrics(&server);
    assert!(
        metrics.contains("kiln_auth_failures_total{reason=\"too_many_failures\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kiln_auth_failures_total{reason=\"missing\"} 40"),
        "{metrics}"
    );
}

fn request_with(
    server: &TestServer,
    path: &str,
    authorization: &str,
) -> (u16, String, Vec<String>) {
    request(
        server,
        "GET",
        path,
        b"",
        &[("Authorization", authorization)],
    )
}

/// `/metrics` of a server with [`auth_config`], read with the admin token it needs.
pub fn admin_metrics(server: &TestServer) -> String {
    let (code, body, _) = request_with(server, "/metrics", &basic("team-b", OPS_B));
    assert_eq!(code, 200, "{body}");
    body
}

#[test]
fn the_cli_sends_its_token_from_a_file_or_the_environment() {
    let server = TestServer::start_with(|config| config.auth = auth_config(1000));
    assert_eq!(
        status(
            &server,
            "POST",
            "/ingest?name=clisvc.cpu",
            &[("Authorization", &bearer(WRITER_A))]
        ),
        200
    );
    let dir = tempfile::tempdir().unwrap();
    let token_file = temp_file(dir.path(), "token", format!("{READER_A}\n").as_bytes());
    let selection = format!("{CPU}{{service_name=\"clisvc\"}}");
    let top = |extra: &[&str], env: Option<&str>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_kiln"));
        command
            .args(["query", "top", "--url", &server.url, "--from", "0"])
            .args(["--query", &selection])
            .args(extra)
            .env("KILN_LOG_LEVEL", "warn")
            .env_remove("KILN_TOKEN");
        if let Some(token) = env {
            command.env("KILN_TOKEN", token);
        }
        command.output().expect("kiln runs")
    };
    let output = top(&["--token-file", token_file.to_str().unwrap()], None);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("work"));
    let output = top(&[], Some(READER_A));
    assert!(output.status.success());
    assert!(String::from_utf8_lossy(&output.stdout).contains("work"));
    let output = top(&[], None);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("HTTP 401"), "{stderr}");

    // `kiln auth new-token` prints a token and the line that lets a server accept it.
    let printed = run_kiln([
        "auth",
        "new-token",
        "--tenant",
        "team-c",
        "--scopes",
        "read,write",
        "--name",
        "ci",
    ]);
    let mut lines = printed.lines();
    let token = lines.next().expect("token").to_string();
    assert!(token.len() >= 5 + 22, "at least 128 bits: {token}");
    let line = lines.last().expect("config line");
    let entry: yaml_serde::Value =
        yaml_serde::from_str(line.trim_start_matches("- ")).expect("yaml");
    assert_eq!(entry["sha256"].as_str(), Some(sha256_hex(&token).as_str()));
    assert_eq!(entry["name"].as_str(), Some("ci"));
    let again = run_kiln([
        "auth",
        "new-token",
        "--tenant",
        "team-c",
        "--scopes",
        "read",
        "--name",
        "ci",
    ]);
    assert_ne!(again.lines().next(), Some(token.as_str()));
}

#[test]
fn the_python_sdk_authenticates_with_basic_auth() {
    if !crate::sdk::python_sdk_installed() {
        return;
    }
    let server = TestServer::start_with(|config| config.auth = auth_config(1000));
    let script = workspace_root().join("tests/sdk/python_app.py");
    let status = Command::new("python3")
        .arg(&script)
        .arg(&server.url)
        .arg("11")
        .env("KILN_TENANT", "team-a")
        .env("KILN_TOKEN", WRITER_A)
        .status()
        .expect("python runs");
    assert!(status.success());
    let (code, body, _) = request(
        &server,
        "GET",
        &render_query("kiln-python-e2e"),
        b"",
        &[("Authorization", &basic("team-a", READER_A))],
    );
    assert_eq!(code, 200, "{body}");
    let result: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert!(ticks(&result) > 1_000_000_000, "{}", ticks(&result));
    assert!(names(&result)
        .iter()
        .any(|n| n.contains("kiln_python_hot_loop")));
    assert!(!admin_metrics(&server).contains("kiln_auth_failures_total{reason=\"invalid\"}"));
}
