//! A debuginfod client: `GET <server>/buildid/<hex>/debuginfo`, as elfutils' client and
//! the servers (Debian's, Fedora's, elfutils' own `debuginfod`) speak it. Servers are
//! asked in order; a 404 means "not here", anything else is an error that does not stop
//! the next server from being asked. A body is streamed to a file, bounded.

use std::path::Path;
use std::time::Duration;

use tokio::io::AsyncWriteExt;

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{url}: {source}")]
    Http { url: String, source: reqwest::Error },
    #[error("{url} answered {status}")]
    Status {
        url: String,
        status: reqwest::StatusCode,
    },
    #[error("{url}: the debug file is larger than the {limit} bytes allowed")]
    TooLarge { url: String, limit: u64 },
    #[error("writing the fetched file: {0}")]
    Io(#[from] std::io::Error),
    #[error("building the HTTP client: {0}")]
    Client(reqwest::Error),
}

pub struct Debuginfod {
    client: reqwest::Client,
    urls: Vec<String>,
    limit: u64,
}

/// What the servers said of a build id.
#[derive(Debug)]
pub enum Fetched {
    /// Written to the file, from this server.
    Found { url: String, bytes: u64 },
    /// Every server answered 404.
    NotFound,
}

impl Debuginfod {
    pub fn new(urls: &[String], timeout: Duration, limit: u64) -> Result<Self, FetchError> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .user_agent(concat!("kiln/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(FetchError::Client)?;
        Ok(Debuginfod {
            client,
            urls: urls
                .iter()
                .map(|u| u.trim_end_matches('/').to_string())
                .filter(|u| !u.is_empty())
                .collect(),
            limit,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.urls.is_empty()
    }

    /// Asks each server for `build_id`'s debug file and writes the first found to `file`.
    /// An error only when no server found it and one failed (the last failure).
    pub async fn fetch(&self, build_id: &str, file: &Path) -> Result<Fetched, FetchError> {
        let mut failure = None;
        for base in &self.urls {
            let url = format!("{base}/buildid/{build_id}/debuginfo");
            match self.fetch_one(&url, file).await {
                Ok(Some(bytes)) => return Ok(Fetched::Found { url, bytes }),
                Ok(None) => {}
                Err(err) => {
                    tracing::warn!(error = %err, "debuginfod fetch failed");
                    failure = Some(err);
                }
            }
        }
        match failure {
            Some(err) => Err(err),
            None => Ok(Fetched::NotFound),
        }
    }

    async fn fetch_one(&self, url: &str, file: &Path) -> Result<Option<u64>, FetchError> {
        let http = |source| FetchError::Http {
            url: url.to_string(),
            source,
        };
        let mut response = self.client.get(url).send().await.map_err(http)?;
        let status = response.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(FetchError::Status {
                url: url.to_string(),
                status,
            });
        }
        let too_large = || FetchError::TooLarge {
            url: url.to_string(),
            limit: self.limit,
        };
        if response.content_length().is_some_and(|n| n > self.limit) {
            return Err(too_large());
        }
        let mut output = tokio::fs::File::create(file).await?;
        let mut written = 0u64;
        while let Some(chunk) = response.chunk().await.map_err(http)? {
            written += chunk.len() as u64;
            if written > self.limit {
                return Err(too_large());
            }
            output.write_all(&chunk).await?;
        }
        output.sync_all().await?;
        Ok(Some(written))
    }
}

/// The servers `DEBUGINFOD_URLS` names: space-separated, as elfutils reads it.
pub fn urls_from_env(value: &str) -> Vec<String> {
    value.split_whitespace().map(str::to_string).collect()
}
