//! Formats other than pprof, each from the real tool that writes it: a JFR recording of
//! a real JVM (checked against the JDK's own `jfr print`), a speedscope file written by
//! `py-spy record`, and `perf script` output of a `perf record` session. Each test skips,
//! saying so, when its tool is not installed.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::common::*;
use crate::pyroscope::{names, ticks, url_escape};

fn installed(program: &str, version_flag: &str) -> bool {
    Command::new(program)
        .arg(version_flag)
        .output()
        .is_ok_and(|output| output.status.success())
}

fn render(server: &TestServer, query: &str) -> Value {
    server.json(
        &format!(
            "/pyroscope/render?query={}&from=now-10m&until=now%2B1m&max-nodes=0",
            url_escape(query)
        ),
        &[],
    )
}

/// Self value of every frame name of a flamebearer response.
fn self_values(render: &Value) -> HashMap<String, i64> {
    let names = names(render);
    let mut values = HashMap::new();
    for level in render["flamebearer"]["levels"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let level: Vec<i64> = level
            .as_array()
            .map(|v| v.iter().filter_map(Value::as_i64).collect())
            .unwrap_or_default();
        for node in level.chunks(4) {
            if let [_, _, self_value, name] = node {
                *values.entry(names[*name as usize].clone()).or_insert(0) += self_value;
            }
        }
    }
    values
}

fn multipart(parts: &[(&str, &[u8])]) -> (String, Vec<u8>) {
    let boundary = "kiln-test-boundary-7d41";
    let mut body = Vec::new();
    for (name, data) in parts {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// Records `testdata/java/KilnBurner.java` with the JDK's Flight Recorder.
fn record_jfr(dir: &Path) -> Option<std::path::PathBuf> {
    if !installed("java", "-version") || !installed("jfr", "--version") {
        eprintln!("skipped: java and jfr (openjdk) are not installed");
        return None;
    }
    let recording = dir.join("burner.jfr");
    let status = Command::new("java")
        .arg(format!(
            "-XX:StartFlightRecording=filename={},settings=profile",
            recording.display()
        ))
        .arg(workspace_root().join("testdata/java/KilnBurner.java"))
        .arg("3")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("java runs");
    assert!(status.success(), "the JVM failed");
    Some(recording)
}

/// Events of one type as the JDK's own `jfr print --json` reads them.
fn jfr_events(recording: &Path, event: &str) -> Vec<Value> {
    let output = Command::new("jfr")
        .args(["print", "--json", "--events", event])
        .arg(recording)
        .output()
        .expect("jfr runs");
    assert!(output.status.success());
    let document: Value = serde_json::from_slice(&output.stdout).expect("jfr prints JSON");
    document["recording"]["events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn jfr_top_frame(event: &Value) -> Option<String> {
    let method = &event["values"]["stackTrace"]["frames"][0]["method"];
    let class = method["type"]["name"].as_str()?.replace('/', ".");
    Some(format!("{class}.{}", method["name"].as_str()?))
}

#[test]
fn a_real_jvm_recording_gives_cpu_allocation_and_lock_profiles() {
    let dir = tempfile::tempdir().unwrap();
    let Some(recording) = record_jfr(dir.path()) else {
        return;
    };
    let bytes = std::fs::read(&recording).unwrap();
    let server = TestServer::start();
    // pyroscope-java's shape: multipart with the recording in a "jfr" part, gzip here.
    let (content_type, body) = multipart(&[("jfr", &gzip(&bytes))]);
    let (status, text) = server.post_with(
        "/ingest?name=kiln-java&format=jfr&sampleRate=100&spyName=javaspy",
        &body,
        &[("Content-Type", &content_type)],
    );
    assert_eq!(status, 200, "{text}");

    // CPU: one 10 ms interval per execution sample, each on the frame jfr print shows.
    let samples = jfr_events(&recording, "jdk.ExecutionSample");
    assert!(!samples.is_empty(), "the JVM recorded no execution samples");
    let mut expected: HashMap<String, i64> = HashMap::new();
    for event in &samples {
        if let Some(frame) = jfr_top_frame(event) {
            *expected.entry(frame).or_insert(0) += 10_000_000;
        }
    }
    let cpu = render(
        &server,
        r#"process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name="kiln-java"}"#,
    );
    assert_eq!(ticks(&cpu), expected.values().sum::<i64>(), "{expected:?}");
    let self_cpu = self_values(&cpu);
    let hot = "KilnBurner.kilnHotMethod";
    assert_eq!(self_cpu.get(hot), expected.get(hot), "{self_cpu:?}");
    let hottest = self_cpu
        .iter()
        .max_by_key(|(_, v)| **v)
        .map(|(n, _)| n.as_str());
    assert_eq!(hottest, Some(hot), "{self_cpu:?}");

    // Allocations: JDK 17's sampled allocation events, weights summed.
    let allocations = jfr_events(&recording, "jdk.ObjectAllocationSample");
    let weight: i64 = allocations
        .iter()
        .filter(|event| !event["values"]["stackTrace"]["frames"][0].is_null())
        .filter_map(|event| event["values"]["weight"].as_i64())
        .sum();
    let alloc = render(
        &server,
        r#"memory:alloc_space:bytes:space:bytes{service_name="kiln-java"}"#,
    );
    assert!(
        weight > 0 && ticks(&alloc) == weight,
        "{} vs {weight}",
        ticks(&alloc)
    );
    assert!(
        names(&alloc).iter().any(|n| n == "KilnBurner.kilnAllocate"),
        "{:?}",
        names(&alloc)
    );
    let objects = render(
        &server,
        r#"memory:alloc_objects:count:space:bytes{service_name="kiln-java"}"#,
    );
    assert!(ticks(&objects) > 0);

    // Locks: one count per monitor-enter and park event with a stack, as jfr print has them.
    let lock_events: Vec<Value> = ["jdk.JavaMonitorEnter", "jdk.ThreadPark"]
        .iter()
        .flat_map(|event| jfr_events(&recording, event))
        .filter(|event| !event["values"]["stackTrace"]["frames"][0].is_null())
        .collect();
    assert!(!lock_events.is_empty(), "the JVM recorded no lock events");
    let locks = render(
        &server,
        r#"mutex:lock_count:count:lock:nanoseconds{service_name="kiln-java"}"#,
    );
    assert_eq!(ticks(&locks), lock_events.len() as i64);
    let lock_names = names(&locks);
    assert!(
        lock_names.iter().any(|n| n == "KilnBurner.kilnContend")
            && lock_names.iter().any(|n| n == "KilnBurner.kilnPark"),
        "{lock_names:?}"
    );
    let lock_time = render(
        &server,
        r#"mutex:lock_time:nanoseconds:lock:nanoseconds{service_name="kiln-java"}"#,
    );
    // Each event waited at least the 10 ms threshold of the "profile" settings.
    assert!(ticks(&lock_time) >= lock_events.len() as i64 * 10_000_000);

    // Mutated copies of the real recording (bit flips, bytes overwritten, cuts) are read
    // or refused, never a panic, and what is read is a valid pprof.
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let contexts = kiln_model::jfr::Contexts::new();
    let mut refused = 0;
    for round in 0..300 {
        let mut data = bytes.clone();
        match round % 3 {
            0 => data.truncate((next() as usize) % data.len()),
            1 => {
                for _ in 0..4 {
                    let at = (next() as usize) % data.len();
                    data[at] ^= 1 << (next() % 8);
                }
            }
            _ => {
                let at = (next() as usize) % data.len();
                data[at] = next() as u8;
            }
        }
        match kiln_model::jfr::parse(&data, 10_000_000, 16_000, &contexts) {
            Ok(recordings) => {
                for recording in recordings {
                    kiln_model::pprof::validate(&recording.profile, &Default::default())
                        .expect("a valid pprof");
                }
            }
            Err(_) => refused += 1,
        }
    }
    assert!(refused > 50, "{refused} of 300 mutations refused");

    // A recording cut short is refused whole, with the reason.
    let (status, text) = server.post(
        "/ingest?name=kiln-java-cut&format=jfr",
        &bytes[..bytes.len() / 2],
    );
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("invalid JFR recording"), "{text}");
}

#[test]
fn a_py_spy_speedscope_file_reads_back() {
    if !installed("py-spy", "--version") {
        eprintln!("skipped: py-spy is not installed (scripts/test.sh installs it)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("hot.py");
    std::fs::write(
        &script,
        "import time\n\
         def kiln_speedscope_hot(n):\n    total = 0\n    for i in range(n):\n        total += i * i\n    return total\n\
         end = time.time() + 2\n\
         while time.time() < end:\n    kiln_speedscope_hot(100000)\n",
    )
    .unwrap();
    let output = dir.path().join("profile.json");
    let status = Command::new("py-spy")
        .args(["record", "--format", "speedscope", "--rate", "100", "-o"])
        .arg(&output)
        .args(["--", "python3"])
        .arg(&script)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("py-spy runs");
    assert!(status.success(), "py-spy failed");
    let file = std::fs::read(&output).unwrap();
    let document: Value = serde_json::from_slice(&file).unwrap();
    assert!(document["exporter"]
        .as_str()
        .unwrap_or("")
        .starts_with("py-spy"));
    // The expected total: the weight of every sample with a stack (py-spy also writes a
    // few empty ones, which hold no frame to charge), in py-spy's unit, as nanoseconds.
    let scale = match document["profiles"][0]["unit"].as_str() {
        Some("seconds") => 1e9,
        Some("milliseconds") => 1e6,
        Some("microseconds") => 1e3,
        _ => 1.0,
    };
    let mut expected = 0i64;
    for profile in document["profiles"].as_array().into_iter().flatten() {
        let samples = profile["samples"].as_array().cloned().unwrap_or_default();
        let weights = profile["weights"].as_array().cloned().unwrap_or_default();
        for (sample, weight) in samples.iter().zip(&weights) {
            if sample.as_array().is_some_and(|frames| !frames.is_empty()) {
                expected += (weight.as_f64().unwrap_or(0.0) * scale).round() as i64;
            }
        }
    }

    let server = TestServer::start();
    let (status, text) = server.post("/ingest?name=kiln-pyspy.cpu&format=speedscope", &file);
    assert_eq!(status, 200, "{text}");
    let cpu = render(
        &server,
        r#"process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name="kiln-pyspy"}"#,
    );
    assert_eq!(ticks(&cpu), expected);
    let hot = self_values(&cpu)
        .into_iter()
        .max_by_key(|(_, value)| *value)
        .map(|(name, _)| name);
    assert_eq!(
        hot.as_deref(),
        Some("kiln_speedscope_hot"),
        "{:?}",
        names(&cpu)
    );

    let (status, text) = server.post(
        "/ingest?name=kiln-pyspy.cpu&format=speedscope",
        br#"{"shared": {"frames": []}, "profiles": [{"type": "sampled", "unit": "none", "samples": [[4]], "weights": [1]}]}"#,
    );
    assert_eq!(status, 400);
    assert!(text.contains("refers to frame 4"), "{text}");
}

#[test]
fn perf_script_output_of_a_real_perf_record_reads_back() {
    if !installed("perf", "--version") || !installed("cc", "--version") {
        eprintln!("skipped: perf (linux-perf) or a C compiler is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("kiln_perf_burner");
    let status = Command::new("cc")
        .args(["-O0", "-g", "-fno-omit-frame-pointer", "-o"])
        .arg(&program)
        .arg(workspace_root().join("testdata/c/kiln_perf_burner.c"))
        .status()
        .expect("cc runs");
    assert!(status.success());
    let data = dir.path().join("perf.data");
    let record = Command::new("perf")
        .args(["record", "-e", "cpu-clock", "-F", "499", "-g", "-o"])
        .arg(&data)
        .arg("--")
        .arg(&program)
        .arg("1.5")
        .output()
        .expect("perf runs");
    if !record.status.success() {
        eprintln!(
            "skipped: perf record cannot sample here: {}",
            String::from_utf8_lossy(&record.stderr)
        );
        return;
    }
    let script = Command::new("perf")
        .args(["script", "-i"])
        .arg(&data)
        .output()
        .expect("perf script runs");
    assert!(script.status.success());
    let text = String::from_utf8(script.stdout).unwrap();

    // The expected self time of kiln_perf_hot: the periods of the samples on it.
    let mut expected_hot = 0i64;
    let mut period = 0i64;
    let mut first_frame = false;
    for line in text.lines() {
        if !line.starts_with(char::is_whitespace) && line.contains("cpu-clock") {
            period = line
                .split_whitespace()
                .rev()
                .nth(1)
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            first_frame = true;
        } else if first_frame && !line.trim().is_empty() {
            if line.contains(" kiln_perf_hot+") {
                expected_hot += period;
            }
            first_frame = false;
        }
    }
    assert!(expected_hot > 0, "no samples on kiln_perf_hot:\n{text}");

    let server = TestServer::start();
    let (status, body) = server.post("/ingest?name=kiln-perf&format=perf_script", text.as_bytes());
    assert_eq!(status, 200, "{body}");
    let cpu = render(
        &server,
        r#"process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name="kiln-perf", comm="kiln_perf_burne"}"#,
    );
    let self_cpu = self_values(&cpu);
    assert_eq!(
        self_cpu.get("kiln_perf_hot"),
        Some(&expected_hot),
        "{self_cpu:?}"
    );
    assert!(names(&cpu).iter().any(|n| n == "kiln_perf_outer"));

    let (status, body) = server.post(
        "/ingest?name=kiln-perf&format=perf_script",
        b"\tffff main (/bin/x)\n",
    );
    assert_eq!(status, 400);
    assert!(body.contains("before any sample header"), "{body}");
}
