//! HTTPS on the server's one port: HTTP/1.1 and h2 by ALPN (gRPC included), clients
//! verifying with `--ca-file`, and a certificate replaced on SIGHUP while a connection
//! made before it keeps working. The server is a `kiln server` child, so the signal goes
//! to it and not to the test process.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use kiln_testkit::tls::{certificates, Certificates};
use prost::Message;

use crate::common::*;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

fn client(ca: Option<&Path>) -> reqwest::blocking::Client {
    let mut builder = reqwest::blocking::Client::builder().timeout(Duration::from_secs(10));
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).unwrap();
        builder = builder.tls_certs_merge(reqwest::Certificate::from_pem_bundle(&pem).unwrap());
    }
    builder.build().unwrap()
}

fn start(dir: &Path, port: u16, certs: &Certificates) -> KilnChild {
    let probe = client(Some(&certs.ca));
    kiln_server(&dir.join("data"))
        .port(port)
        .arg("--tls-cert-file")
        .arg(&certs.cert)
        .arg("--tls-key-file")
        .arg(&certs.key)
        .args(["--flush-interval-ms", "50"])
        // The fixture's own time is years old: keep it.
        .args(["--retention-days", "0"])
        .ready_when(move |port| {
            probe
                .get(format!("https://localhost:{port}/ready"))
                .send()
                .is_ok_and(|r| r.status() == 200)
        })
        .start()
        .expect("kiln server starts")
}

fn metric(client: &reqwest::blocking::Client, base: &str, line: &str) -> Option<f64> {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .expect("metrics over the old connection")
        .text()
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(line)?.trim().parse().ok())
}

/// A service's CPU over all time, rendered over HTTPS.
fn cpu_ticks(client: &reqwest::blocking::Client, base: &str, service: &str) -> i64 {
    let query = crate::pyroscope::url_escape(&format!("{CPU}{{service_name=\"{service}\"}}"));
    let text = client
        .get(format!(
            "{base}/pyroscope/render?query={query}&from=0&until=now%2B1h"
        ))
        .send()
        .and_then(|r| r.text())
        .expect("render over TLS");
    crate::pyroscope::ticks(&serde_json::from_str(&text).expect("json"))
}

fn error_chain(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(inner) = source {
        text.push_str(&format!(": {inner}"));
        source = inner.source();
    }
    text
}

#[test]
fn https_and_grpc_over_tls_on_one_port_with_the_certificate_reloaded_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = match (
        certificates(dir.path(), "first"),
        certificates(dir.path(), "second"),
    ) {
        (Ok(first), Ok(second)) => (first, second),
        (Err(reason), _) | (_, Err(reason)) => {
            println!("skipped: the TLS test ({reason})");
            return;
        }
    };
    // The server reads these two paths; the test swaps their contents later.
    let served = Certificates {
        ca: first.ca.clone(),
        cert: dir.path().join("served.pem"),
        key: dir.path().join("served.key"),
    };
    std::fs::copy(&first.cert, &served.cert).unwrap();
    std::fs::copy(&first.key, &served.key).unwrap();
    let port = kiln_testkit::free_port();
    let server = start(dir.path(), port, &served);
    let base = format!("https://localhost:{port}");
    let trusted = client(Some(&first.ca));

    // h2 by ALPN; gRPC over it (a Push, framed).
    let profile = fixture("profefe-collector_cpu_1.prof");
    let message = crate::push::request("tlsgrpc", &profile, "").encode_to_vec();
    let response = trusted
        .post(format!("{base}/push.v1.PusherService/Push"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(crate::push::grpc_frame(&message, false))
        .send()
        .expect("gRPC over TLS");
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    assert_eq!(response.status(), 200);
    // HTTP/1.1 over TLS too: Pyroscope's /ingest.
    let http1 = reqwest::blocking::Client::builder()
        .http1_only()
        .tls_certs_merge(
            reqwest::Certificate::from_pem_bundle(&std::fs::read(&first.ca).unwrap()).unwrap(),
        )
        .build()
        .unwrap();
    let response = http1
        .post(format!("{base}/ingest?name=tlsingest.cpu"))
        .body("main;work 3\n")
        .send()
        .expect("HTTP/1.1 over TLS");
    assert_eq!(response.version(), reqwest::Version::HTTP_11);
    assert_eq!(response.status(), 200);
    assert_eq!(
        cpu_ticks(&trusted, &base, "tlsgrpc"),
        crate::push::expected_total()
    );

    // Cleartext to the TLS port is told so (400, as Go's and nginx's servers answer), and
    // TLS without the CA fails.
    let plain = reqwest::blocking::get(format!("http://127.0.0.1:{port}/ready"))
        .expect("an answer, not a reset");
    assert_eq!(plain.status(), 400);
    assert!(plain.text().unwrap().contains("This port speaks HTTPS"));
    let err = client(None)
        .get(format!("{base}/ready"))
        .send()
        .expect_err("unknown issuer");
    assert!(
        error_chain(&err).to_lowercase().contains("certificate"),
        "{}",
        error_chain(&err)
    );

    // kiln query verifies with --ca-file, and refuses without it.
    let query_top = |ca: Option<&Path>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_kiln"));
        command
            .args(["query", "top", "--url", &base, "--from", "0", "--query"])
            .arg(format!("{CPU}{{service_name=\"tlsingest\"}}"))
            .env("KILN_LOG_LEVEL", "warn");
        if let Some(ca) = ca {
            command.arg("--ca-file").arg(ca);
        }
        command.output().expect("kiln runs")
    };
    let output = query_top(Some(&first.ca));
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("work"));
    let output = query_top(None);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr)
        .to_lowercase()
        .contains("certificate"));

    // kiln scrape pushes over TLS with --ca-file.
    let target = crate::scrape::serve(|_| (200, crate::scrape::cumulative_heap(1)));
    let config = crate::scrape::remote_job(dir.path(), &target);
    let mut scrape = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["scrape", "--config"])
        .arg(&config)
        .args(["--push-url", &base, "--ca-file"])
        .arg(&first.ca)
        .env("KILN_LOG_LEVEL", "error")
        .spawn()
        .expect("kiln scrape starts");
    let services = || {
        trusted
            .post(format!("{base}/querier.v1.QuerierService/LabelValues"))
            .header("content-type", "application/json")
            .header("x-scope-orgid", "team-a")
            .body(r#"{"name": "service_name"}"#)
            .send()
            .and_then(|response| response.text())
            .unwrap_or_default()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !services().contains("remote") {
        if Instant::now() > deadline {
            let _ = scrape.kill();
            panic!("no profile pushed by kiln scrape over TLS: {}", services());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = scrape.kill();
    let _ = scrape.wait();

    // SIGHUP with a new pair, signed by another CA.
    std::fs::copy(&second.cert, &served.cert).unwrap();
    std::fs::copy(&second.key, &served.key).unwrap();
    // SAFETY: kill(2) with a child's pid and SIGHUP touches no memory.
    unsafe {
        libc::kill(server.id() as i32, libc::SIGHUP);
    }
    let reloaded = "kiln_tls_reloads_total{outcome=\"success\"} ";
    let deadline = Instant::now() + Duration::from_secs(10);
    // `trusted` keeps its h2 connection from before the reload: every poll goes over it.
    while metric(&trusted, &base, reloaded) != Some(1.0) {
        assert!(Instant::now() < deadline, "no reload counted");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        client(Some(&first.ca))
            .get(format!("{base}/ready"))
            .send()
            .is_err(),
        "a new connection still got the old certificate"
    );
    let renewed = client(Some(&second.ca));
    assert_eq!(
        renewed
            .get(format!("{base}/ready"))
            .send()
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        trusted
            .get(format!("{base}/ready"))
            .send()
            .unwrap()
            .status(),
        200,
        "the connection made before the reload was dropped"
    );

    // A broken pair is refused and the current one stays.
    std::fs::write(&served.cert, "not a certificate").unwrap();
    // SAFETY: as above.
    unsafe {
        libc::kill(server.id() as i32, libc::SIGHUP);
    }
    let failed = "kiln_tls_reloads_total{outcome=\"failure\"} ";
    while metric(&renewed, &base, failed) != Some(1.0) {
        assert!(
            Instant::now() < deadline + Duration::from_secs(10),
            "no failed reload counted"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        client(Some(&second.ca))
            .get(format!("{base}/ready"))
            .send()
            .unwrap()
            .status(),
        200
    );

    // The agent pushes over TLS with --ca-file.
    std::fs::copy(&second.cert, &served.cert).unwrap();
    let Some(program) = crate::agent::burner(dir.path(), "kiln_tls_burner") else {
        println!("skipped: the agent over TLS (no C compiler)");
        return;
    };
    let ca = second.ca.to_str().unwrap().to_string();
    let Some(agent) = crate::agent::start_agent_to(&["--push-url", &base], &["--ca-file", &ca])
    else {
        return;
    };
    assert!(Command::new(&program).arg("2").status().unwrap().success());
    let mut cpu = 0;
    let deadline = Instant::now() + Duration::from_secs(15);
    while cpu < 1_500_000_000 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        cpu = cpu_ticks(&renewed, &base, "kiln_tls_burner");
    }
    crate::agent::stop(agent);
    assert!(
        cpu >= 1_500_000_000,
        "{cpu} ns of the burner's 2 s over TLS"
    );
}
