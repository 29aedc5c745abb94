//! Recording rules end to end, against a real Prometheus (Debian's `prometheus`, started
//! here on loopback with the remote-write receiver and an out-of-order window): Kiln runs
//! as a child process, real profiles of two services are pushed, and what Prometheus
//! holds is compared with Kiln's own totals for the same windows, exactly. On the way,
//! Kiln is killed with SIGKILL just after Prometheus accepted a batch and before Kiln
//! recorded it (so the batch is sent again), and Prometheus is restarted while samples
//! wait; afterwards nothing is missing or counted twice. An alerting rule on an exported
//! metric must fire, and a rule created after its data was stored is backfilled.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kiln_testkit::{fixture, free_port, wait_until, KilnChild, KilnCommand};

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
/// In the checkout profile (profefe's collector): 3.70 s of its 9.64 s per `go tool pprof`.
const FUNCTION: &str = "database/sql.(*Stmt).ExecContext";
const STEP_MS: i64 = 2_000;

fn now_ms() -> i64 {
    kiln_model::time::now_ms()
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(30))
        .build()
}

struct Prometheus {
    binary: PathBuf,
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl Prometheus {
    fn start(dir: &Path) -> Option<Prometheus> {
        let Some(binary) = ["/usr/bin/prometheus", "/usr/local/bin/prometheus"]
            .iter()
            .map(PathBuf::from)
            .find(|path| path.exists())
        else {
            println!("skipped: prometheus is not installed (apt-get install prometheus)");
            return None;
        };
        std::fs::write(
            dir.join("prometheus.yml"),
            "global:\n  evaluation_interval: 1s\n\
             storage:\n  tsdb:\n    out_of_order_time_window: 2h\n\
             rule_files: [alerts.yml]\n",
        )
        .unwrap();
        // The README's alert, on the exported metric, firing at once rather than after 5m.
        let alert = readme_block("groups:");
        assert!(alert.contains("for: 5m"), "{alert}");
        std::fs::write(dir.join("alerts.yml"), alert.replace("for: 5m", "for: 0s")).unwrap();
        let mut prometheus = Prometheus {
            binary,
            dir: dir.to_path_buf(),
            port: free_port(),
            child: None,
        };
        prometheus.spawn();
        Some(prometheus)
    }

    fn spawn(&mut self) {
        let child = Command::new(&self.binary)
            .arg(format!(
                "--config.file={}",
                self.dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                self.dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{}", self.port))
            .arg("--web.enable-remote-write-receiver")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus starts");
        self.child = Some(child);
        let url = format!("http://127.0.0.1:{}/-/ready", self.port);
        wait_until("prometheus to be ready", Duration::from_secs(60), || {
            agent().get(&url).call().is_ok()
        });
    }

    /// SIGTERM, as a service manager restarts it; its WAL keeps what it accepted.
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: a signal to our own child.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGTERM);
            }
            let _ = child.wait();
        }
    }

    fn write_url(&self) -> String {
        format!("http://127.0.0.1:{}/api/v1/write", self.port)
    }

    /// The value of an instant query, or `None` when it returns no series.
    fn query(&self, query: &str, at_ms: i64) -> Option<f64> {
        let response: serde_json::Value = serde_json::from_str(
            &agent()
                .get(&format!("http://127.0.0.1:{}/api/v1/query", self.port))
                .query("query", query)
                .query("time", &format!("{:.3}", at_ms as f64 / 1000.0))
                .call()
                .expect("query")
                .into_string()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(response["status"], "success", "{response}");
        let result = response["data"]["result"].as_array()?.first()?.clone();
        result["value"][1].as_str()?.parse().ok()
    }

    fn firing(&self, alert: &str) -> bool {
        let response: serde_json::Value = serde_json::from_str(
            &agent()
                .get(&format!("http://127.0.0.1:{}/api/v1/alerts", self.port))
                .call()
                .expect("alerts")
                .into_string()
                .unwrap(),
        )
        .unwrap();
        response["data"]["alerts"].as_array().is_some_and(|alerts| {
            alerts
                .iter()
                .any(|a| a["labels"]["alertname"] == alert && a["state"] == "firing")
        })
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

struct Kiln {
    dir: PathBuf,
    port: u16,
    child: KilnChild,
}

impl Kiln {
    fn start(dir: &Path, port: u16, crash_at: Option<&str>) -> Kiln {
        let mut command = KilnCommand::server(env!("CARGO_BIN_EXE_kiln"), dir)
            .port(port)
            .args(["--flush-interval-ms", "50", "--config"])
            .arg(dir.join("kiln.yaml"))
            .ready_within(Duration::from_secs(30));
        if let Some(point) = crash_at {
            command = command.env("KILN_TEST_CRASH_AT", point);
        }
        Kiln {
            dir: dir.to_path_buf(),
            port,
            child: command.start().expect("kiln starts"),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn push(&self, service: &str, profile: &[u8], at_seconds: i64) {
        self.push_for(service, profile, at_seconds, 1);
    }

    /// [`Kiln::push`] of a profile `seconds` long: another profile than one of the same
    /// bytes, time and another length (the same three would be a retry, stored once).
    fn push_for(&self, service: &str, profile: &[u8], at_seconds: i64, seconds: i64) {
        agent()
            .post(&self.url("/ingest"))
            .query("name", &format!("{service}.cpu"))
            .query("format", "pprof")
            .query("from", &at_seconds.to_string())
            .query("until", &(at_seconds + seconds).to_string())
            .send_bytes(profile)
            .expect("push");
    }

    /// `kiln_rules_samples_pending` of a target, from /metrics.
    fn pending(&self, target: &str) -> Option<i64> {
        self.metric(&format!(
            "kiln_rules_samples_pending{{target=\"{target}\"}}"
        ))
    }

    /// The value of one series on /metrics (`name{labels}` exactly as rendered).
    fn metric(&self, series: &str) -> Option<i64> {
        let text = agent()
            .get(&self.url("/metrics"))
            .call()
            .ok()?
            .into_string()
            .ok()?;
        let prefix = format!("{series} ");
        text.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|value| value.trim().parse().ok())
    }

    /// Kiln's own totals over profiles in `[from, until)`: all of the selection's CPU, and
    /// that of the samples whose stack holds `FUNCTION` (each sample once).
    fn totals(&self, service: &str, from_ms: i64, until_ms: i64) -> (i64, i64) {
        let response = agent()
            .get(&self.url("/pyroscope/render"))
            .query("query", &format!("{CPU}{{service_name=\"{service}\"}}"))
            .query("from", &from_ms.to_string())
            .query("until", &(until_ms - 1).to_string())
            .query("format", "pprof")
            .call()
            .expect("render");
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut response.into_reader(), &mut bytes).unwrap();
        let bytes = kiln_model::compress::gunzip_bounded(&bytes, 1 << 30).expect("gzip");
        let profile = kiln_model::pprof::decode(&bytes, 1 << 30).expect("pprof");
        let value = profile
            .sample_type
            .iter()
            .position(|t| profile.string_or_empty(t.r#type) == "cpu")
            .expect("a cpu sample type");
        let holds: std::collections::HashSet<u64> = profile
            .location
            .iter()
            .filter(|location| {
                location.line.iter().any(|line| {
                    profile
                        .function
                        .iter()
                        .find(|f| f.id == line.function_id)
                        .is_some_and(|f| profile.string_or_empty(f.name) == FUNCTION)
                })
            })
            .map(|location| location.id)
            .collect();
        let (mut all, mut function) = (0, 0);
        for sample in profile.sample.iter() {
            all += sample.value[value];
            if sample
                .location_id
                .iter()
                .any(|id| holds.contains(&u64::from(*id)))
            {
                function += sample.value[value];
            }
        }
        (all, function)
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
    }

    /// Waits for a SIGKILL from a crash point.
    fn wait_for_crash(&mut self) {
        use std::os::unix::process::ExitStatusExt;
        let status = self
            .child
            .wait_exit(Duration::from_secs(60))
            .expect("kiln reaches its crash point");
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    }

    fn restart(&mut self, crash_at: Option<&str>) {
        self.kill();
        *self = Kiln::start(&self.dir.clone(), self.port, crash_at);
    }
}

/// The README's yaml block that starts with `start`.
fn readme_block(start: &str) -> String {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .unwrap();
    let begin = readme
        .find(&format!("```yaml\n{start}"))
        .unwrap_or_else(|| panic!("no README block starting {start:?}"))
        + "```yaml\n".len();
    let end = begin + readme[begin..].find("```").unwrap();
    readme[begin..end].to_string()
}

/// Kiln's config: the README's rule (checkout's CPU), one for search with an external
/// label, one for a function; compaction and export fast enough for a test.
fn write_config(dir: &Path, remote_write: &str) {
    let readme = readme_block("recording_rules:");
    let readme_rule = readme
        .strip_prefix("recording_rules:\n")
        .and_then(|rest| rest.split("remote_write:").next())
        .expect("the README's rule");
    assert!(readme_rule.contains("metric_name: checkout_cpu_nanoseconds"));
    std::fs::write(
        dir.join("kiln.yaml"),
        format!(
            // Segments, and so rule samples, follow writes within a fraction of a second,
            // as compaction's short intervals here assume; the log stays on, so the
            // crashes below also recover logged writes.
            "wal_segment_interval_ms: 200\ncompaction:\n  interval_ms: 100\n  levels:\n\
             \x20   - {{max_datasets: 20, max_age_ms: 300, window_ms: 0}}\n\
             \x20   - {{max_datasets: 10, max_age_ms: 600000, window_ms: 3600000}}\n\
             recording_rules:\n{readme_rule}\
             \x20 - metric_name: search_cpu_nanoseconds\n\
             \x20   profile_type: {CPU}\n\
             \x20   matchers: '{{service_name=\"search\"}}'\n\
             \x20   group_by: [service_name]\n\
             \x20   external_labels: {{source: kiln}}\n\
             \x20 - metric_name: checkout_exec_nanoseconds\n\
             \x20   profile_type: {CPU}\n\
             \x20   matchers: '{{service_name=\"checkout\"}}'\n\
             \x20   function_name: '{FUNCTION}'\n\
             remote_write:\n  - url: {remote_write}\n\
             rule_export:\n  step_ms: {STEP_MS}\n  delay_ms: 300\n  poll_ms: 100\n"
        ),
    )
    .unwrap();
}

#[test]
fn rules_reach_prometheus_exactly_once_through_crashes_and_alert() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut prometheus) = Prometheus::start(dir.path()) else {
        return;
    };
    write_config(dir.path(), &prometheus.write_url());
    let checkout = fixture("profefe-collector_cpu_1.prof");
    let search = fixture("pprof-report-sample.cpu.pb.gz");
    let port = free_port();
    // The first batch Prometheus accepts kills Kiln before the batch is marked sent.
    let mut kiln = Kiln::start(dir.path(), port, Some("rules-sent"));
    let rules_from = now_ms();
    let window_start = (rules_from / STEP_MS + 2) * STEP_MS; // after every rule's live_from
    let second = |offset: i64| window_start / 1000 + offset;

    // Round 1: both services, two steps.
    for offset in [0, 1, 2, 3] {
        kiln.push("checkout", &checkout, second(offset));
        kiln.push("search", &search, second(offset));
    }
    kiln.wait_for_crash();
    eprintln!("kiln was killed after Prometheus accepted a batch, before recording it");
    kiln.restart(None);

    // Round 2, while Prometheus is down: the samples wait in the outbox.
    prometheus.stop();
    for offset in [4, 5, 7] {
        kiln.push("checkout", &checkout, second(offset));
        kiln.push("search", &search, second(offset));
    }
    let target = prometheus.write_url();
    wait_until(
        "samples to wait for Prometheus",
        Duration::from_secs(30),
        || kiln.pending(&target).is_some_and(|pending| pending > 0),
    );
    let retries = format!("kiln_rules_send_retries_total{{target=\"{target}\"}}");
    wait_until(
        "a retry while Prometheus is down",
        Duration::from_secs(30),
        || kiln.metric(&retries).is_some_and(|retries| retries >= 1),
    );
    // And Kiln is killed meanwhile too, with the samples still queued.
    kiln.restart(None);
    prometheus.spawn();
    eprintln!("prometheus restarted with samples queued");

    // Stored three hours ago, before any rule: only the backfill below reads it, and
    // Prometheus, whose newest samples are now, refuses it (too old for its 2 h window).
    kiln.push("search", &search, window_start / 1000 - 3 * 3600);
    // Late data: a profile in an early step, pushed after that step went out.
    kiln.push_for("checkout", &checkout, second(1), 2);
    let window_end = (second(7) * 1000 / STEP_MS + 1) * STEP_MS;
    wait_until("the outbox to drain", Duration::from_secs(90), || {
        now_ms() > window_end + STEP_MS + 2_000 && kiln.pending(&target) == Some(0)
    });

    let at = window_end - 1;
    let range = format!("[{}ms]", window_end - window_start);
    let (checkout_cpu, checkout_exec) = kiln.totals("checkout", window_start, window_end);
    let (search_cpu, _) = kiln.totals("search", window_start, window_end);
    let sum = |metric: &str| {
        prometheus
            .query(&format!("sum(sum_over_time({metric}{range}))"), at)
            .unwrap_or_else(|| panic!("{metric} is not in Prometheus"))
    };
    let exported = (
        sum("checkout_cpu_nanoseconds"),
        sum("search_cpu_nanoseconds"),
        sum("checkout_exec_nanoseconds"),
    );
    eprintln!(
        "kiln: checkout {checkout_cpu} ns, search {search_cpu} ns, {FUNCTION} {checkout_exec} ns; \
         prometheus: {} / {} / {}",
        exported.0, exported.1, exported.2
    );
    // 8 checkout profiles of 9.64 s, 7 search profiles of 1.76 s; ExecContext is 3.70 s
    // of each checkout profile by `go tool pprof`.
    assert_eq!(checkout_cpu, 8 * 9_640_000_000);
    assert_eq!(search_cpu, 7 * 1_760_000_000);
    assert_eq!((checkout_exec as f64 / 8e9 * 100.0).round(), 370.0);
    assert_eq!(
        exported.0, checkout_cpu as f64,
        "checkout: lost or doubled samples"
    );
    assert_eq!(
        exported.1, search_cpu as f64,
        "search: lost or doubled samples"
    );
    assert_eq!(
        exported.2, checkout_exec as f64,
        "function: lost or doubled samples"
    );
    // Samples carry the step's start: four steps of checkout data, one late sample.
    let samples = prometheus
        .query(
            &format!("count_over_time(checkout_cpu_nanoseconds{range})"),
            at,
        )
        .unwrap();
    eprintln!("{samples} checkout samples: 4 steps, and late data as its own sample");
    assert!(
        samples >= 5.0,
        "4 steps and at least one late sample: {samples}"
    );
    assert!(
        prometheus
            .query(&format!("count_over_time(search_cpu_nanoseconds{{source=\"kiln\",service_name=\"search\"}}{range})"), at)
            .is_some(),
        "group_by and external labels are on the series"
    );

    wait_until("the alert to fire", Duration::from_secs(30), || {
        prometheus.firing("CheckoutCpuBurning")
    });
    eprintln!("alert CheckoutCpuBurning is firing");

    // Backfill: a rule created now, over search profiles stored before it existed.
    let rule = serde_json::json!({
        "metric_name": "search_cpu_backfilled",
        "profile_type": CPU,
        "matchers": "{service_name=\"search\"}",
    });
    let created: serde_json::Value = serde_json::from_str(
        &agent()
            .post(&kiln.url("/api/v1/recording-rules"))
            .send_string(&rule.to_string())
            .expect("create")
            .into_string()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(created["source"], "api");
    let backfill = || {
        Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["rules", "backfill", "--url", &kiln.url("")])
            .args(["--rule", "search_cpu_backfilled"])
            .args(["--from", &(window_start - 4 * 3_600_000).to_string()])
            .args(["--until", &window_end.to_string()])
            .output()
            .unwrap()
    };
    let output = backfill();
    let printed = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "{printed} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!("{}", printed.trim());
    assert!(
        printed.contains(&format!("total {}", search_cpu + 1_760_000_000)),
        "{printed}"
    );
    // Once only: the same range again is refused.
    let again = backfill();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("409"));
    wait_until(
        "the backfill to reach Prometheus",
        Duration::from_secs(30),
        || {
            prometheus.query(
                &format!("sum(sum_over_time(search_cpu_backfilled{range}))"),
                at,
            ) == Some(search_cpu as f64)
        },
    );
    eprintln!("backfilled search_cpu_backfilled: {search_cpu} ns in Prometheus");
    // The refused sample was isolated from the request it came in, dropped and counted;
    // the others of that request landed (above).
    let refused =
        format!("kiln_rules_samples_failed_total{{target=\"{target}\",reason=\"refused\"}}");
    assert_eq!(kiln.metric(&refused), Some(1));
    eprintln!("1 sample refused by Prometheus (too old), dropped and counted");
}

/// With the defaults (`rule_export`, the write-ahead log, compaction), a rule's sample is
/// in Prometheus within 15 s of its profile's end, and level-0 compaction of the counted
/// segment adds nothing to it.
#[test]
fn a_rules_sample_reaches_prometheus_within_15_s_of_its_profile_and_once() {
    let dir = tempfile::tempdir().unwrap();
    let Some(prometheus) = Prometheus::start(dir.path()) else {
        return;
    };
    std::fs::write(
        dir.path().join("kiln.yaml"),
        format!(
            "recording_rules:\n\
             \x20 - metric_name: checkout_cpu_nanoseconds\n\
             \x20   profile_type: {CPU}\n\
             \x20   matchers: '{{service_name=\"checkout\"}}'\n\
             \x20   group_by: [service_name]\n\
             remote_write:\n  - url: {}\n",
            prometheus.write_url()
        ),
    )
    .unwrap();
    let kiln = Kiln::start(dir.path(), free_port(), None);
    let rules: serde_json::Value = serde_json::from_str(
        &agent()
            .get(&kiln.url("/api/v1/recording-rules"))
            .call()
            .expect("rules")
            .into_string()
            .unwrap(),
    )
    .unwrap();
    let live_from = rules["rules"][0]["live_from_ms"].as_i64().unwrap();
    // A 10 s profile that ends now, and starts at or after the rule's live_from.
    while now_ms() < live_from + 10_000 {
        std::thread::sleep(Duration::from_millis(100));
    }
    let ended_ms = now_ms() / 1000 * 1000;
    let checkout = fixture("profefe-collector_cpu_1.prof");
    kiln.push_for("checkout", &checkout, ended_ms / 1000 - 10, 10);
    let total = 9_640_000_000.0; // the profile's CPU, per `go tool pprof`
    let exported = || {
        prometheus.query(
            "sum(sum_over_time(checkout_cpu_nanoseconds[10m]))",
            now_ms(),
        )
    };
    wait_until(
        "the sample to reach Prometheus",
        Duration::from_secs(120),
        || exported().is_some(),
    );
    let latency_ms = now_ms() - ended_ms;
    eprintln!(
        "the sample reached Prometheus {:.1} s after its profile ended",
        latency_ms as f64 / 1000.0
    );
    assert_eq!(exported(), Some(total));
    assert!(latency_ms <= 15_000, "{latency_ms} ms after the profile");
    // Level 0's compaction of the counted segment (within its max_age_ms, 10 s) must not
    // count it again.
    let compacted = || {
        [
            "kiln_compaction_jobs_total",
            "kiln_compaction_copies_total",
            "kiln_compaction_promotions_total",
        ]
        .iter()
        .filter_map(|name| kiln.metric(name))
        .sum::<i64>()
    };
    wait_until("level 0 to be compacted", Duration::from_secs(60), || {
        compacted() >= 1
    });
    // What compaction would have counted goes out at the next poll (1 s).
    std::thread::sleep(Duration::from_secs(3));
    let target = prometheus.write_url();
    assert_eq!(kiln.pending(&target), Some(0));
    assert_eq!(exported(), Some(total), "counted again at compaction");
}

/// `kiln bench rules --latency`, short (its figures are docs/benchmarks.md's): two profiles
/// through a server, each timed to its sample. Here rather than among the integration
/// tests, whose timing-sensitive tests it would load for half a minute.
#[test]
fn the_rules_latency_bench_times_each_profile() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata");
    let output = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["bench", "rules", "--latency", "2", "--corpus"])
        .arg(&corpus)
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "{printed} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!("{printed}");
    for line in [
        "latency-0: ended ",
        "latency-1: ended ",
        "profile end → rule sample: median ",
    ] {
        assert!(printed.contains(line), "{printed}");
    }
}
