//! The benches' HTTP client: the reqwest the rest of Kiln speaks, called from plain code.
//!
//! Benches drive load from OS threads (one per simulated client, as an SDK or an agent
//! runs) and also read `/metrics` and `/ready` from inside async functions. reqwest's own
//! blocking client refuses to run inside a runtime, so this one owns a small runtime of
//! its own and blocks on it: on a plain thread directly, on a runtime's worker through
//! `block_in_place`. One client, one connection pool, shared by every thread that clones
//! it, so `kiln` links one HTTP client and not two.

use std::collections::HashMap;
use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;

/// Where the client's connections live: two workers are plenty for the client side of a
/// bench, and keep it off the runtime the bench itself runs on.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kiln-bench-http")
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            // Without threads of its own nothing of a bench can run.
            Err(err) => panic!("kiln bench cannot start its HTTP client's threads: {err}"),
        }
    })
}

fn block<F: Future>(future: F) -> F::Output {
    let handle = runtime().handle();
    if tokio::runtime::Handle::try_current().is_ok() {
        tokio::task::block_in_place(|| handle.block_on(future))
    } else {
        handle.block_on(future)
    }
}

/// A client with one timeout for every request (connect, send and the whole body).
///
/// Clients are made once per timeout and shared: making one loads the TLS roots, which
/// costs milliseconds, and a bench that asked for a client per request measured that.
/// One that cannot be made (no TLS backend) fails each of its requests, with why.
#[derive(Clone)]
pub struct Http {
    client: Result<reqwest::Client, String>,
}

impl Http {
    pub fn new(timeout: Duration) -> Http {
        static CLIENTS: OnceLock<std::sync::Mutex<HashMap<Duration, reqwest::Client>>> =
            OnceLock::new();
        let mut clients = match CLIENTS.get_or_init(Default::default).lock() {
            Ok(clients) => clients,
            Err(poisoned) => poisoned.into_inner(),
        };
        let client = match clients.get(&timeout) {
            Some(client) => Ok(client.clone()),
            None => reqwest::Client::builder()
                .timeout(timeout)
                .build()
                .map(|client| clients.entry(timeout).or_insert(client).clone())
                .map_err(|err| format!("cannot make an HTTP client: {}", describe(&err))),
        };
        Http { client }
    }

    pub fn get(&self, url: &str) -> Request {
        Request(
            self.client
                .as_ref()
                .map(|c| c.get(url))
                .map_err(Clone::clone),
        )
    }

    pub fn post(&self, url: &str) -> Request {
        Request(
            self.client
                .as_ref()
                .map(|c| c.post(url))
                .map_err(Clone::clone),
        )
    }
}

/// `GET url` with a minute's timeout, for the one-off reads around a run.
pub fn get(url: &str) -> Request {
    Http::new(Duration::from_secs(60)).get(url)
}

pub struct Request(Result<reqwest::RequestBuilder, String>);

impl Request {
    pub fn header(self, name: &str, value: &str) -> Request {
        Request(self.0.map(|r| r.header(name, value)))
    }

    pub fn call(self) -> Result<Response, Error> {
        let request = self.0.map_err(Error::Transport)?;
        block(async move { Response::read(request.send().await).await })
    }

    pub fn send_bytes(self, body: &[u8]) -> Result<Response, Error> {
        Request(self.0.map(|r| r.body(Bytes::copy_from_slice(body)))).call()
    }

    pub fn send_string(self, body: &str) -> Result<Response, Error> {
        self.send_bytes(body.as_bytes())
    }
}

/// A whole response, read before the call returns.
#[derive(Debug)]
pub struct Response {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Bytes,
}

impl Response {
    async fn read(sent: reqwest::Result<reqwest::Response>) -> Result<Response, Error> {
        let response = sent.map_err(|err| Error::Transport(describe(&err)))?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response
            .bytes()
            .await
            .map_err(|err| Error::Transport(describe(&err)))?;
        let response = Response {
            status,
            headers,
            body,
        };
        if status >= 400 {
            return Err(Error::Status(status, Box::new(response)));
        }
        Ok(response)
    }

    pub fn status(&self) -> u16 {
        self.status
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name)?.to_str().ok()
    }

    pub fn bytes(&self) -> &[u8] {
        &self.body
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Result<serde_json::Value, Error> {
        serde_json::from_slice(&self.body).map_err(|err| Error::Body(err.to_string()))
    }
}

/// The error and every cause below it, as reqwest nests them ("error sending request:
/// connection refused").
fn describe(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[derive(Debug)]
pub enum Error {
    /// The server answered 4xx or 5xx.
    Status(u16, Box<Response>),
    /// No answer: refused, reset, timed out.
    Transport(String),
    /// An answer that is not what was asked for.
    Body(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Status(status, response) => {
                let text = response.text();
                write!(f, "status {status}: {}", text.trim())
            }
            Error::Transport(text) | Error::Body(text) => f.write_str(text),
        }
    }
}

impl std::error::Error for Error {}
