//! HTTP to targets: one `reqwest` client per job with its TLS and authentication
//! settings, and fetches that stop reading at the body size limit.

use std::time::Duration;

use crate::config::ScrapeConfig;
use crate::{ScrapeError, ScrapeFailure};

fn read_secret(inline: &Option<String>, file: &Option<String>) -> Result<String, ScrapeError> {
    if let Some(path) = file {
        return std::fs::read_to_string(path)
            .map(|text| text.trim().to_string())
            .map_err(|source| ScrapeError::Read {
                what: "secret file",
                path: path.clone(),
                source,
            });
    }
    Ok(inline.clone().unwrap_or_default())
}

pub fn build(config: &ScrapeConfig) -> Result<reqwest::Client, ScrapeError> {
    let tls = &config.tls_config;
    let mut builder = reqwest::Client::builder()
        .user_agent(concat!("kiln/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(config.scrape_timeout.max(Duration::from_secs(1)))
        .danger_accept_invalid_certs(tls.insecure_skip_verify);
    if let Some(path) = &tls.ca_file {
        let pem = std::fs::read(path).map_err(|source| ScrapeError::Read {
            what: "ca_file",
            path: path.clone(),
            source,
        })?;
        let certificate =
            reqwest::Certificate::from_pem(&pem).map_err(|source| ScrapeError::Http {
                what: "invalid ca_file",
                source,
            })?;
        builder = builder.add_root_certificate(certificate);
    }
    if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
        let mut pem = std::fs::read(cert).map_err(|source| ScrapeError::Read {
            what: "cert_file",
            path: cert.clone(),
            source,
        })?;
        pem.extend(std::fs::read(key).map_err(|source| ScrapeError::Read {
            what: "key_file",
            path: key.clone(),
            source,
        })?);
        let identity = reqwest::Identity::from_pem(&pem).map_err(|source| ScrapeError::Http {
            what: "invalid client certificate",
            source,
        })?;
        builder = builder.identity(identity);
    }
    builder.build().map_err(|source| ScrapeError::Http {
        what: "cannot build the HTTP client",
        source,
    })
}

/// GETs `url` and returns the body, refusing one over the job's size limit.
pub async fn fetch(
    client: &reqwest::Client,
    config: &ScrapeConfig,
    url: &str,
    timeout: Duration,
) -> Result<Vec<u8>, ScrapeFailure> {
    let mut request = client.get(url).timeout(timeout);
    if let Some(auth) = &config.basic_auth {
        let password =
            read_secret(&auth.password, &auth.password_file).map_err(ScrapeFailure::Secret)?;
        request = request.basic_auth(&auth.username, Some(password));
    }
    if let Some(auth) = &config.authorization {
        let credentials = read_secret(&auth.credentials, &auth.credentials_file)
            .map_err(ScrapeFailure::Secret)?;
        request = request.header(
            reqwest::header::AUTHORIZATION,
            format!("{} {credentials}", auth.kind),
        );
    }
    let mut response = request.send().await.map_err(|err| {
        if err.is_timeout() {
            ScrapeFailure::Timeout(timeout)
        } else {
            ScrapeFailure::Request(err)
        }
    })?;
    if !response.status().is_success() {
        return Err(ScrapeFailure::Status(response.status()));
    }
    let limit = config.body_size_limit;
    if response
        .content_length()
        .is_some_and(|length| length as usize > limit)
    {
        return Err(ScrapeFailure::TooLarge(limit));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|err| {
        if err.is_timeout() {
            ScrapeFailure::Timeout(timeout)
        } else {
            ScrapeFailure::Response(err)
        }
    })? {
        if body.len() + chunk.len() > limit {
            return Err(ScrapeFailure::TooLarge(limit));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
