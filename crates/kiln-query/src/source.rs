//! Source text for a function's per-line view, from where the operator said the code is:
//! a directory on the server (`source.root`) or a URL per file (`source.url_template`).
//! With neither, there is no source text, and the UI shows the line numbers alone rather
//! than anything made up.
//!
//! Profiles carry the paths files had where they were built (`/build/src/shop/cart.go`,
//! `github.com/acme/shop/cart.go`), not where a checkout is. Under a root, the path is
//! tried whole and then with leading components dropped, so a checkout of the repository
//! at the root answers either. A path with `..` is refused, and the file found must lie
//! under the root once symbolic links are resolved: a profile cannot name what the
//! server reads.

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::QueryError;

/// Source files larger than this are not served.
pub const MAX_SOURCE_BYTES: u64 = 4 << 20;
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SourceConfig {
    /// A directory holding the services' source trees.
    pub root: Option<PathBuf>,
    /// A URL per source file, fetched by the server: `{path}` is the file's path as the
    /// profile gives it, without its leading `/`, and `{service}` the service's name
    /// (`https://git.example.com/raw/{service}/main/{path}`).
    pub url_template: String,
}

impl SourceConfig {
    pub fn configured(&self) -> bool {
        self.root.is_some() || !self.url_template.is_empty()
    }
}

/// Where source files are read from, with the client that fetches them by URL.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    config: SourceConfig,
    client: reqwest::Client,
}

impl Sources {
    pub fn new(config: SourceConfig) -> Self {
        Sources {
            config,
            client: reqwest::Client::new(),
        }
    }

    pub fn configured(&self) -> bool {
        self.config.configured()
    }

    /// [`read_source`] with this configuration.
    pub async fn read(&self, service: &str, file: &str) -> Result<Option<SourceText>, QueryError> {
        read_source(&self.config, &self.client, service, file).await
    }
}

/// A source file's text, and where it was read from.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SourceText {
    pub file: String,
    pub origin: String,
    pub lines: Vec<String>,
}

/// Reads `file` (as a profile names it) of `service` from the configured source; `None`
/// when there is no source configured or the file is not there.
pub async fn read_source(
    config: &SourceConfig,
    client: &reqwest::Client,
    service: &str,
    file: &str,
) -> Result<Option<SourceText>, QueryError> {
    let relative = relative_path(file)?;
    if let Some(root) = &config.root {
        if let Some((path, text)) = read_under(root, &relative).await? {
            return Ok(Some(source_text(file, path.display().to_string(), &text)));
        }
    }
    if !config.url_template.is_empty() {
        let url = config
            .url_template
            .replace("{path}", &relative.to_string_lossy())
            .replace("{service}", service);
        if let Some(text) = fetch(client, &url).await? {
            return Ok(Some(source_text(file, url, &text)));
        }
    }
    Ok(None)
}

fn source_text(file: &str, origin: String, text: &str) -> SourceText {
    SourceText {
        file: file.to_string(),
        origin,
        lines: text.lines().map(str::to_string).collect(),
    }
}

/// The profile's path as a relative one, refused if it climbs (`..`).
fn relative_path(file: &str) -> Result<PathBuf, QueryError> {
    let mut relative = PathBuf::new();
    for component in Path::new(file).components() {
        match component {
            Component::Normal(part) => relative.push(part),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                return Err(QueryError::BadRequest(format!(
                    "source file {file:?} climbs out of its tree (..)"
                )))
            }
        }
    }
    if relative.as_os_str().is_empty() {
        return Err(QueryError::BadRequest("file is required".to_string()));
    }
    Ok(relative)
}

/// The first of `relative` and its suffixes that is a file under `root`.
async fn read_under(root: &Path, relative: &Path) -> Result<Option<(PathBuf, String)>, QueryError> {
    let root = root.to_path_buf();
    let relative = relative.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let Ok(root) = root.canonicalize() else {
            tracing::warn!(root = %root.display(), "source.root is not a readable directory");
            return Ok(None);
        };
        let parts: Vec<_> = relative.components().collect();
        for skip in 0..parts.len() {
            let candidate: PathBuf = root.join(parts[skip..].iter().collect::<PathBuf>());
            let Ok(resolved) = candidate.canonicalize() else {
                continue;
            };
            if !resolved.starts_with(&root) {
                continue;
            }
            let Ok(metadata) = std::fs::metadata(&resolved) else {
                continue;
            };
            if !metadata.is_file() {
                continue;
            }
            if metadata.len() > MAX_SOURCE_BYTES {
                return Err(QueryError::BadRequest(format!(
                    "{} is {} bytes, more than the {MAX_SOURCE_BYTES} served",
                    resolved.display(),
                    metadata.len()
                )));
            }
            let bytes = std::fs::read(&resolved)
                .map_err(|err| QueryError::NotFound(format!("{}: {err}", resolved.display())))?;
            return Ok(Some((
                resolved,
                String::from_utf8_lossy(&bytes).into_owned(),
            )));
        }
        Ok(None)
    })
    .await?
}

/// The body at `url`, `None` on 404; bounded in size and time.
async fn fetch(client: &reqwest::Client, url: &str) -> Result<Option<String>, QueryError> {
    let unavailable = |err: String| QueryError::NotFound(format!("source at {url}: {err}"));
    let mut response = client
        .get(url)
        .timeout(FETCH_TIMEOUT)
        .send()
        .await
        .map_err(|err| unavailable(err.to_string()))?;
    if response.status() == reqwest::StatusCode::NOT_FOUND {
        return Ok(None);
    }
    if !response.status().is_success() {
        return Err(unavailable(format!("HTTP {}", response.status())));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|err| unavailable(err.to_string()))?
    {
        body.extend_from_slice(&chunk);
        if body.len() as u64 > MAX_SOURCE_BYTES {
            return Err(unavailable(format!(
                "more than the {MAX_SOURCE_BYTES} bytes served"
            )));
        }
    }
    Ok(Some(String::from_utf8_lossy(&body).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_file_is_found_by_a_suffix_of_its_path_and_never_outside_the_root() {
        let dir = std::env::temp_dir().join(format!("kiln-source-{}", std::process::id()));
        let root = dir.join("checkout");
        std::fs::create_dir_all(root.join("shop")).unwrap();
        std::fs::write(root.join("shop/cart.go"), "package shop\n\nfunc Add() {}\n").unwrap();
        std::fs::write(dir.join("secret.txt"), "no").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(dir.join("secret.txt"), root.join("shop/link.go")).unwrap();
        let config = SourceConfig {
            root: Some(root.clone()),
            url_template: String::new(),
        };
        let client = reqwest::Client::new();
        let found = read_source(&config, &client, "shop", "/home/ci/build/shop/cart.go")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(found.lines, ["package shop", "", "func Add() {}"]);
        assert!(read_source(&config, &client, "shop", "shop/missing.go")
            .await
            .unwrap()
            .is_none());
        assert!(read_source(&config, &client, "shop", "../secret.txt")
            .await
            .is_err());
        #[cfg(unix)]
        assert!(read_source(&config, &client, "shop", "shop/link.go")
            .await
            .unwrap()
            .is_none());
        // Nothing configured: no source, whatever the file.
        assert!(
            read_source(&SourceConfig::default(), &client, "shop", "/x/shop/cart.go")
                .await
                .unwrap()
                .is_none()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A one-file HTTP server on loopback: `/shop/cart.go` is there, anything else 404.
    async fn serve_one_file() -> std::net::SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut request = vec![0u8; 4096];
                let read = stream.read(&mut request).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&request[..read]).to_string();
                let found = head.starts_with("GET /shop/cart.go ");
                let (status, body) = if found {
                    ("200 OK", "package shop\n// fetched\n")
                } else {
                    ("404 Not Found", "no such file\n")
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            }
        });
        address
    }

    #[tokio::test]
    async fn a_url_template_is_filled_in_and_fetched() {
        let address = serve_one_file().await;
        let config = SourceConfig {
            root: None,
            url_template: format!("http://{address}/{{service}}/{{path}}"),
        };
        let client = reqwest::Client::new();
        let found = read_source(&config, &client, "shop", "/cart.go")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(found.lines, ["package shop", "// fetched"]);
        assert_eq!(found.origin, format!("http://{address}/shop/cart.go"));
        // A 404 is no source, not an error.
        assert!(read_source(&config, &client, "other", "/cart.go")
            .await
            .unwrap()
            .is_none());
    }
}
