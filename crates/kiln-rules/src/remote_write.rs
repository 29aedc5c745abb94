//! Prometheus remote write 1.0: the protobuf `WriteRequest` (written here from the
//! documented schema, as prost messages), snappy block compression, and one POST with the
//! protocol's headers. Retrying is the exporter's business ([`crate::export`]).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

#[derive(Clone, PartialEq, prost::Message)]
pub struct WriteRequest {
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
    #[prost(message, repeated, tag = "3")]
    pub metadata: Vec<MetricMetadata>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TimeSeries {
    /// Sorted by name, `__name__` included.
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    /// In timestamp order.
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    #[prost(double, tag = "1")]
    pub value: f64,
    /// Milliseconds since the epoch.
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct MetricMetadata {
    /// 2 = GAUGE in the protocol's `MetricType`.
    #[prost(int32, tag = "1")]
    pub r#type: i32,
    #[prost(string, tag = "2")]
    pub metric_family_name: String,
    #[prost(string, tag = "4")]
    pub help: String,
    #[prost(string, tag = "5")]
    pub unit: String,
}

pub const GAUGE: i32 = 2;

/// One `remote_write:` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteWriteConfig {
    pub url: String,
    /// Extra request headers, such as `X-Scope-OrgID` for a multi-tenant receiver.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub basic_auth: Option<BasicAuth>,
    /// Prometheus's `authorization`: a token (such as a Kiln or Grafana token) sent as
    /// `Authorization: <type> <credentials>`.
    #[serde(default)]
    pub authorization: Option<Authorization>,
    /// Prometheus's `tls_config`: the CA to verify an https:// receiver with, besides the
    /// system's.
    #[serde(default)]
    pub tls_config: Option<TlsClientConfig>,
    /// Only these tenants' samples go to this receiver; empty: every tenant's. In a
    /// multi-tenant Kiln, each team's Prometheus should get its own tenant only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<String>,
}

impl RemoteWriteConfig {
    pub fn takes(&self, tenant: &str) -> bool {
        self.tenants.is_empty() || self.tenants.iter().any(|t| t == tenant)
    }
}

#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasicAuth {
    pub username: String,
    pub password: String,
}

/// `credentials` inline, or `credentials_file`, read at every send so that a rotated
/// token is picked up without a restart.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Authorization {
    #[serde(default = "bearer", rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub credentials: Option<String>,
    #[serde(default)]
    pub credentials_file: Option<std::path::PathBuf>,
}

fn bearer() -> String {
    "Bearer".to_string()
}

impl std::fmt::Debug for Authorization {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Authorization({}, <secret>)", self.kind)
    }
}

impl Authorization {
    fn header(&self) -> Result<String, String> {
        let credentials = match (&self.credentials, &self.credentials_file) {
            (Some(credentials), None) => credentials.clone(),
            (None, Some(path)) => std::fs::read_to_string(path).map_err(|err| {
                format!("authorization: credentials_file {}: {err}", path.display())
            })?,
            _ => {
                return Err(
                    "authorization: give one of credentials and credentials_file".to_string(),
                )
            }
        };
        Ok(format!("{} {}", self.kind, credentials.trim()))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsClientConfig {
    pub ca_file: std::path::PathBuf,
}

impl std::fmt::Debug for BasicAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BasicAuth({}, <secret>)", self.username)
    }
}

impl RemoteWriteConfig {
    /// Checks what would otherwise fail every send, forever: the URL and the headers.
    pub fn check(&self) -> Result<(), String> {
        let url = reqwest::Url::parse(&self.url)
            .map_err(|err| format!("remote_write: url {:?}: {err}", self.url))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!(
                "remote_write: url {:?}: use http:// or https://",
                self.url
            ));
        }
        if let Some(authorization) = &self.authorization {
            authorization
                .header()
                .map_err(|err| format!("remote_write {}: {err}", self.url))?;
        }
        for (name, value) in &self.headers {
            reqwest::header::HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                format!(
                    "remote_write {}: headers: {name:?} is not a header name",
                    self.url
                )
            })?;
            reqwest::header::HeaderValue::from_str(value).map_err(|_| {
                format!(
                    "remote_write {}: headers: the value of {name} is not a valid header value",
                    self.url
                )
            })?;
        }
        Ok(())
    }
}

/// How a send went, for the exporter to decide between retry, drop and done.
#[derive(Debug, Error)]
pub enum SendError {
    /// 5xx, 429 or no answer: the same request is worth retrying.
    #[error("remote write to {url} failed, will retry: {reason}")]
    Retryable { url: String, reason: String },
    /// Any other 4xx, or a 5xx naming a sample the receiver's storage refuses: retrying
    /// the same samples cannot help.
    #[error("remote write to {url} refused ({status}): {body}")]
    Refused {
        url: String,
        status: u16,
        body: String,
    },
}

/// A client for one target.
#[derive(Clone)]
pub struct RemoteWriter {
    config: RemoteWriteConfig,
    client: reqwest::Client,
}

impl RemoteWriter {
    pub fn new(config: RemoteWriteConfig) -> Result<Self, crate::RulesError> {
        let mut builder = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .connect_timeout(Duration::from_secs(5));
        if let Some(tls) = &config.tls_config {
            let pem = std::fs::read(&tls.ca_file).map_err(|source| crate::RulesError::CaFile {
                url: config.url.clone(),
                path: tls.ca_file.clone(),
                source,
            })?;
            let certificates = reqwest::Certificate::from_pem_bundle(&pem).map_err(|source| {
                crate::RulesError::Client {
                    url: config.url.clone(),
                    source,
                }
            })?;
            builder = builder.tls_certs_merge(certificates);
        }
        let client = builder
            .build()
            .map_err(|source| crate::RulesError::Client {
                url: config.url.clone(),
                source,
            })?;
        Ok(RemoteWriter { config, client })
    }

    pub fn url(&self) -> &str {
        &self.config.url
    }

    /// Sends one request: protobuf, snappy-compressed (block format, as the protocol says).
    pub async fn send(&self, request: &WriteRequest) -> Result<(), SendError> {
        let body = encode(request);
        let url = self.config.url.clone();
        let mut post = self
            .client
            .post(&url)
            .header("Content-Encoding", "snappy")
            .header("Content-Type", "application/x-protobuf")
            .header("X-Prometheus-Remote-Write-Version", "0.1.0")
            .header("User-Agent", concat!("kiln/", env!("CARGO_PKG_VERSION")));
        for (name, value) in &self.config.headers {
            post = post.header(name, value);
        }
        if let Some(auth) = &self.config.basic_auth {
            post = post.basic_auth(&auth.username, Some(&auth.password));
        }
        if let Some(authorization) = &self.config.authorization {
            // A credentials file that went missing is worth retrying: it may be in the
            // middle of being rotated.
            let header = authorization
                .header()
                .map_err(|reason| SendError::Retryable {
                    url: url.clone(),
                    reason,
                })?;
            post = post.header("Authorization", header);
        }
        let response = post
            .body(body)
            .send()
            .await
            .map_err(|err| SendError::Retryable {
                url: url.clone(),
                reason: error_chain(&err),
            })?;
        let status = response.status().as_u16();
        if response.status().is_success() {
            return Ok(());
        }
        let body = response.text().await.unwrap_or_default();
        let body: String = body.chars().take(512).collect();
        if status == 429 || (status >= 500 && !refuses_samples(&body)) {
            return Err(SendError::Retryable {
                url,
                reason: format!("{status}: {body}"),
            });
        }
        Err(SendError::Refused { url, status, body })
    }
}

/// Prometheus's storage errors for samples it will never take (too old for its
/// out-of-order window, out of order without one, a second value for a timestamp).
/// Prometheus 2.42 (Debian 12's) answers a too-old sample with 500, not the 400 later
/// versions send; retrying it would block every sample behind it forever.
fn refuses_samples(body: &str) -> bool {
    [
        "too old sample",
        "out of bounds",
        "out of order sample",
        "duplicate sample for timestamp",
    ]
    .iter()
    .any(|error| body.contains(error))
}

/// The request body: prost encoding, then snappy's raw (block) format.
pub fn encode(request: &WriteRequest) -> Vec<u8> {
    let bytes = prost::Message::encode_to_vec(request);
    // The raw encoder fails only on inputs over 4 GiB, which no batch comes near; an
    // empty body would be refused by the receiver and retried as a 4xx drop.
    snap::raw::Encoder::new()
        .compress_vec(&bytes)
        .unwrap_or_default()
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unusable_urls_and_headers_are_refused_up_front() {
        let target = |url: &str, header: (&str, &str)| RemoteWriteConfig {
            url: url.into(),
            headers: [(header.0.to_string(), header.1.to_string())].into(),
            basic_auth: None,
            authorization: None,
            tls_config: None,
            tenants: vec![],
        };
        assert!(target("http://p:9090/api/v1/write", ("X-Scope-OrgID", "a"))
            .check()
            .is_ok());
        for (config, words) in [
            (target("p:9090/api/v1/write", ("a", "b")), "use http"),
            (target("not a url", ("a", "b")), "url"),
            (
                target("http://p/w", ("bad header", "b")),
                "is not a header name",
            ),
            (
                target("http://p/w", ("X-A", "line\nbreak")),
                "not a valid header value",
            ),
        ] {
            let err = config.check().expect_err(words);
            assert!(err.contains(words), "{err}");
        }
    }

    #[test]
    fn the_body_is_snappy_block_format_of_the_protobuf() {
        let request = WriteRequest {
            timeseries: vec![TimeSeries {
                labels: vec![Label {
                    name: "__name__".into(),
                    value: "cpu".into(),
                }],
                samples: vec![Sample {
                    value: 1.5,
                    timestamp: 15_000,
                }],
            }],
            metadata: vec![],
        };
        let body = encode(&request);
        let raw = snap::raw::Decoder::new()
            .decompress_vec(&body)
            .expect("snappy block");
        let decoded: WriteRequest = prost::Message::decode(raw.as_slice()).expect("protobuf");
        assert_eq!(decoded, request);
    }

    /// The token is read from `credentials_file` at each send: a rotated file is used by
    /// the next request, with no restart.
    #[tokio::test]
    async fn the_token_file_is_sent_and_reread_at_every_send() {
        let dir = tempfile::tempdir().expect("dir");
        let token = dir.path().join("token");
        std::fs::write(&token, "kiln_first\n").expect("write");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!(
            "http://{}/api/v1/write",
            listener.local_addr().expect("addr")
        );
        let received = tokio::spawn(async move {
            let mut heads = Vec::new();
            for _ in 0..2 {
                let (mut stream, _) = listener.accept().await.expect("accept");
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = tokio::io::AsyncReadExt::read(&mut stream, &mut buf)
                        .await
                        .expect("read");
                    assert!(n > 0, "request ended early");
                    head.extend_from_slice(&buf[..n]);
                }
                tokio::io::AsyncWriteExt::write_all(
                    &mut stream,
                    b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n",
                )
                .await
                .expect("answer");
                heads.push(String::from_utf8_lossy(&head).to_lowercase());
            }
            heads
        });
        let writer = RemoteWriter::new(RemoteWriteConfig {
            url,
            headers: Default::default(),
            basic_auth: None,
            authorization: Some(Authorization {
                kind: bearer(),
                credentials: None,
                credentials_file: Some(token.clone()),
            }),
            tls_config: None,
            tenants: vec![],
        })
        .expect("client");
        let request = WriteRequest::default();
        writer.send(&request).await.expect("first send");
        std::fs::write(&token, "kiln_second").expect("rotate");
        writer.send(&request).await.expect("second send");
        let heads = received.await.expect("receiver");
        assert!(
            heads[0].contains("authorization: bearer kiln_first\r\n"),
            "{}",
            heads[0]
        );
        assert!(
            heads[1].contains("authorization: bearer kiln_second\r\n"),
            "{}",
            heads[1]
        );
    }
}
