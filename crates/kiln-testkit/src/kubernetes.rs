//! A Kubernetes API server double on loopback, as Prometheus tests its discovery: no real
//! cluster runs here, so the tests talk to this instead, over real HTTP.
//!
//! It serves list and watch of `pods`, `services`, `endpoints` and `nodes` (cluster-wide
//! and per namespace) in the API's JSON shapes: a list carries the collection's
//! `resourceVersion`; a watch is a chunked stream of `ADDED`, `MODIFIED` and `DELETED`
//! events from the version asked for, with a `BOOKMARK` every second, and an `ERROR`
//! event with `410 Gone` for a version older than it keeps. It can drop every watch
//! connection, and stop and start again on the same port with its history gone, as an
//! API server restarted behind a load balancer does. Field selectors on `metadata.name`,
//! `metadata.namespace`, `spec.nodeName` and `status.phase` filter lists and watches
//! (others are refused with 400, as the API server refuses them). It speaks HTTP, or HTTPS as an API
//! server reached from a pod, and can demand one bearer token. Requests are logged, so a
//! test can tell a list from a watch and see the token it was sent.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// One logged request.
#[derive(Debug, Clone)]
pub struct Logged {
    pub path: String,
    pub query: String,
    pub authorization: Option<String>,
    pub at: Instant,
}

impl Logged {
    pub fn is_watch(&self) -> bool {
        self.query
            .split('&')
            .any(|p| p == "watch=true" || p == "watch=1")
    }
}

#[derive(Default)]
struct State {
    version: u64,
    /// Versions below this are gone: a watch from one is answered 410.
    oldest: u64,
    /// (resource, namespace, name) → object.
    objects: BTreeMap<(String, String, String), serde_json::Value>,
    /// (version, resource, type, object), in order.
    events: Vec<(u64, String, &'static str, serde_json::Value)>,
    log: Vec<Logged>,
    /// Watches started before this count are ended.
    drops: u64,
    /// When set, a request without `Authorization: Bearer <this>` is answered 401.
    token: Option<String>,
}

struct Shared {
    /// Set for HTTPS.
    tls: Option<Arc<rustls::ServerConfig>>,
    state: Mutex<State>,
    changed: Condvar,
    /// The listener's generation: a stopped one ends its connections.
    generation: AtomicU64,
    running: AtomicBool,
}

/// The double. Dropped, it stops.
pub struct ApiServer {
    shared: Arc<Shared>,
    port: u16,
}

impl ApiServer {
    pub fn start() -> ApiServer {
        Self::start_with(None)
    }

    /// Over HTTPS, with `certs`' server certificate (valid for 127.0.0.1), as an API
    /// server is reached from a pod.
    pub fn start_tls(certs: &crate::tls::Certificates) -> ApiServer {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&certs.cert)
            .expect("the certificate")
            .collect::<Result<_, _>>()
            .expect("the certificate's PEM");
        let key = PrivateKeyDer::from_pem_file(&certs.key).expect("the key");
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("a TLS configuration");
        Self::start_with(Some(Arc::new(config)))
    }

    fn start_with(tls: Option<Arc<rustls::ServerConfig>>) -> ApiServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = listener.local_addr().expect("its address").port();
        let shared = Arc::new(Shared {
            tls,
            state: Mutex::new(State {
                version: 100,
                oldest: 100,
                ..State::default()
            }),
            changed: Condvar::new(),
            generation: AtomicU64::new(0),
            running: AtomicBool::new(true),
        });
        serve(listener, shared.clone(), 0);
        ApiServer { shared, port }
    }

    pub fn url(&self) -> String {
        let scheme = if self.shared.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Answers 401 to any request not bearing this token from now on.
    pub fn require_token(&self, token: &str) {
        self.lock().token = Some(token.to_string());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds or replaces an object of `resource` (`pods`, …); its metadata's namespace and
    /// name place it.
    pub fn apply(&self, resource: &str, mut object: serde_json::Value) {
        let mut state = self.lock();
        state.version += 1;
        let version = state.version;
        let meta = &mut object["metadata"];
        meta["resourceVersion"] = version.to_string().into();
        let key = (
            resource.to_string(),
            meta["namespace"].as_str().unwrap_or_default().to_string(),
            meta["name"].as_str().unwrap_or_default().to_string(),
        );
        let kind = if state.objects.contains_key(&key) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        state.objects.insert(key, object.clone());
        state
            .events
            .push((version, resource.to_string(), kind, object));
        drop(state);
        self.shared.changed.notify_all();
    }

    /// Deletes an object; true when it was there.
    pub fn delete(&self, resource: &str, namespace: &str, name: &str) -> bool {
        let mut state = self.lock();
        let key = (
            resource.to_string(),
            namespace.to_string(),
            name.to_string(),
        );
        let Some(mut object) = state.objects.remove(&key) else {
            return false;
        };
        state.version += 1;
        object["metadata"]["resourceVersion"] = state.version.to_string().into();
        let version = state.version;
        state
            .events
            .push((version, resource.to_string(), "DELETED", object));
        drop(state);
        self.shared.changed.notify_all();
        true
    }

    /// Ends every open watch: clients must watch again from the version they had.
    pub fn drop_watches(&self) {
        self.lock().drops += 1;
        self.shared.changed.notify_all();
    }

    /// Forgets the history: a watch from any version before now gets `410 Gone`.
    pub fn compact(&self) {
        let mut state = self.lock();
        state.version += 1;
        state.oldest = state.version;
        state.events.clear();
    }

    /// Stops listening and ends every connection, as a server that went down.
    pub fn stop(&self) {
        self.shared.running.store(false, Ordering::SeqCst);
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
        self.shared.changed.notify_all();
        // Wake the accept.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }

    /// Listens again on the same port, its history forgotten (see [`Self::compact`]).
    pub fn restart(&self) {
        self.compact();
        let listener = loop {
            match TcpListener::bind(("127.0.0.1", self.port)) {
                Ok(listener) => break listener,
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        self.shared.running.store(true, Ordering::SeqCst);
        let generation = self.shared.generation.load(Ordering::SeqCst);
        serve(listener, self.shared.clone(), generation);
    }

    /// Every request so far.
    pub fn log(&self) -> Vec<Logged> {
        self.lock().log.clone()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn serve(listener: TcpListener, shared: Arc<Shared>, generation: u64) {
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            if shared.generation.load(Ordering::SeqCst) != generation
                || !shared.running.load(Ordering::SeqCst)
            {
                return;
            }
            let Ok(stream) = stream else { continue };
            let shared = shared.clone();
            std::thread::spawn(move || {
                let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
                let Ok(socket) = stream.try_clone() else {
                    return;
                };
                match shared.tls.clone() {
                    Some(config) => {
                        let Ok(session) = rustls::ServerConnection::new(config) else {
                            return;
                        };
                        let tls = rustls::StreamOwned::new(session, stream);
                        connection(tls, &socket, &shared, generation);
                    }
                    None => connection(stream, &socket, &shared, generation),
                }
            });
        }
    });
}

/// Requests of one connection, kept alive as clients expect; `socket` is its TCP
/// connection, to cut it off.
fn connection<S: Read + Write>(stream: S, socket: &TcpStream, shared: &Shared, generation: u64) {
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) => return,
            Ok(_) => {}
            Err(err)
                if matches!(
                    err.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if shared.generation.load(Ordering::SeqCst) != generation {
                    return;
                }
                continue;
            }
            Err(_) => return,
        }
        let mut parts = line.split_whitespace();
        let (Some(_method), Some(target)) = (parts.next(), parts.next()) else {
            return;
        };
        let mut authorization = None;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("authorization") {
                    authorization = Some(value.trim().to_string());
                }
            }
        }
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let logged = Logged {
            path: path.to_string(),
            query: query.to_string(),
            authorization,
            at: Instant::now(),
        };
        let watch = logged.is_watch();
        let allowed = {
            let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
            let allowed = state.token.as_ref().is_none_or(|token| {
                logged.authorization.as_deref() == Some(format!("Bearer {token}").as_str())
            });
            state.log.push(logged);
            allowed
        };
        let writer = reader.get_mut();
        if !allowed {
            let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Unauthorized","code":401}"#;
            if respond(writer, 401, body).is_err() {
                return;
            }
            continue;
        }
        let Some((resource, namespace)) = route(path) else {
            let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#;
            if respond(writer, 404, body).is_err() {
                return;
            }
            continue;
        };
        let fields = match Fields::parse(param(query, "fieldSelector").unwrap_or_default()) {
            Ok(fields) => fields,
            Err(field) => {
                let body = serde_json::json!({"kind": "Status", "apiVersion": "v1",
                    "status": "Failure", "reason": "BadRequest", "code": 400,
                    "message": format!("field label not supported: {field}")})
                .to_string();
                if respond(writer, 400, &body).is_err() {
                    return;
                }
                continue;
            }
        };
        if watch {
            let from = param(query, "resourceVersion")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            watch_stream(
                writer,
                socket,
                shared,
                generation,
                (&resource, namespace.as_deref(), &fields),
                from,
            );
            return;
        }
        let body = list(shared, &resource, namespace.as_deref(), &fields);
        if respond(writer, 200, &body).is_err() {
            return;
        }
    }
}

/// `/api/v1/<resource>` or `/api/v1/namespaces/<ns>/<resource>`.
fn route(path: &str) -> Option<(String, Option<String>)> {
    let rest = path.strip_prefix("/api/v1/")?;
    let parts: Vec<&str> = rest.split('/').collect();
    let (resource, namespace) = match parts.as_slice() {
        [resource] => (*resource, None),
        ["namespaces", namespace, resource] => (*resource, Some(namespace.to_string())),
        _ => return None,
    };
    ["pods", "services", "endpoints", "nodes"]
        .contains(&resource)
        .then(|| (resource.to_string(), namespace))
}

/// A query parameter's raw (still percent-encoded) value.
pub fn param<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
}

fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A field selector: `field=value`, `field==value` or `field!=value` terms, all to hold.
#[derive(Debug, Default)]
struct Fields(Vec<(&'static str, bool, String)>);

impl Fields {
    /// The selector of a `fieldSelector` parameter; `Err(field)` for a field not served.
    fn parse(encoded: &str) -> Result<Fields, String> {
        const SUPPORTED: [&str; 4] = [
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "status.phase",
        ];
        let text = percent_decoded(encoded);
        let mut terms = Vec::new();
        for term in text.split(',').filter(|t| !t.is_empty()) {
            let (field, equal, value) = match term.split_once("!=") {
                Some((field, value)) => (field, false, value),
                None => match term.split_once('=') {
                    Some((field, value)) => (field, true, value.trim_start_matches('=')),
                    None => return Err(term.to_string()),
                },
            };
            let Some(field) = SUPPORTED.iter().find(|f| **f == field.trim()) else {
                return Err(field.to_string());
            };
            terms.push((*field, equal, value.trim().to_string()));
        }
        Ok(Fields(terms))
    }

    fn matches(&self, object: &serde_json::Value) -> bool {
        self.0.iter().all(|(field, equal, value)| {
            let found = field
                .split('.')
                .fold(object, |at, part| &at[part])
                .as_str()
                .unwrap_or_default();
            (found == value) == *equal
        })
    }
}

fn kind_of(resource: &str) -> &'static str {
    match resource {
        "pods" => "Pod",
        "services" => "Service",
        "endpoints" => "Endpoints",
        _ => "Node",
    }
}

fn list(shared: &Shared, resource: &str, namespace: Option<&str>, fields: &Fields) -> String {
    let state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
    let items: Vec<&serde_json::Value> = state
        .objects
        .iter()
        .filter(|((r, ns, _), object)| {
            r == resource && namespace.is_none_or(|want| want == ns) && fields.matches(object)
        })
        .map(|(_, object)| object)
        .collect();
    serde_json::json!({
        "kind": format!("{}List", kind_of(resource)),
        "apiVersion": "v1",
        "metadata": {"resourceVersion": state.version.to_string()},
        "items": items,
    })
    .to_string()
}

fn respond(writer: &mut impl Write, status: u16, body: &str) -> std::io::Result<()> {
    write!(
        writer,
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    writer.flush()
}

fn chunk(writer: &mut impl Write, event: &serde_json::Value) -> std::io::Result<()> {
    let line = format!("{event}\n");
    write!(writer, "{:x}\r\n{line}\r\n", line.len())?;
    writer.flush()
}

/// Events after `from` as they happen, a bookmark each second, until the watch is dropped
/// or the server stops.
fn watch_stream(
    writer: &mut impl Write,
    socket: &TcpStream,
    shared: &Shared,
    generation: u64,
    (resource, namespace, fields): (&str, Option<&str>, &Fields),
    from: u64,
) {
    let head =
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
    if writer.write_all(head.as_bytes()).is_err() {
        return;
    }
    let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
    if from < state.oldest {
        drop(state);
        let gone = serde_json::json!({"type": "ERROR", "object": {
            "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": format!("too old resource version: {from}"),
            "reason": "Expired", "code": 410}});
        let _ = chunk(writer, &gone);
        let _ = writer.write_all(b"0\r\n\r\n");
        let _ = writer.flush();
        return;
    }
    let drops = state.drops;
    let mut sent = from;
    let mut bookmark = Instant::now();
    loop {
        let due: Vec<serde_json::Value> = state
            .events
            .iter()
            .filter(|(version, r, _, object)| {
                *version > sent
                    && r == resource
                    && namespace.is_none_or(|want| object["metadata"]["namespace"] == want)
                    && fields.matches(object)
            })
            .map(|(_, _, kind, object)| serde_json::json!({"type": kind, "object": object}))
            .collect();
        let version = state.version;
        drop(state);
        for event in &due {
            if chunk(writer, event).is_err() {
                return;
            }
        }
        sent = version;
        if bookmark.elapsed() >= Duration::from_secs(1) {
            bookmark = Instant::now();
            let mark = serde_json::json!({"type": "BOOKMARK", "object": {
                "kind": kind_of(resource), "apiVersion": "v1",
                "metadata": {"resourceVersion": version.to_string()}}});
            if chunk(writer, &mark).is_err() {
                return;
            }
        }
        state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
        let (next, _) = shared
            .changed
            .wait_timeout(state, Duration::from_millis(200))
            .unwrap_or_else(|e| e.into_inner());
        state = next;
        if state.drops != drops || shared.generation.load(Ordering::SeqCst) != generation {
            drop(state);
            // Cut off, with no last chunk: a lost connection, not an ended stream.
            let _ = socket.shutdown(std::net::Shutdown::Both);
            return;
        }
    }
}
