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
//! server reads. Answers name a file as the profile named it, never where it lies on the
//! server.
//!
//! By URL the same must hold on the source host. Whoever can write a profile names the
//! file and the service, and the server fetches and shows what comes back, so a name must
//! never steer a fetch anywhere but under the template's own scheme, host, port and path
//! prefix (a server-side request forgery otherwise). Each value is split into path
//! segments. A segment that is, or percent-decodes to, nothing, `.` or `..`, or that holds
//! a backslash, `?`, `#` or a control character once decoded, is refused; every other
//! segment is percent-encoded whole (`%` included), so what the host decodes is the name
//! as sent. The URL made is parsed and checked against the prefix once more, a redirect
//! is followed only where it stays under the prefix, and only a `text/*` answer is shown.

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::QueryError;

/// Source files larger than this are not served.
pub const MAX_SOURCE_BYTES: u64 = 4 << 20;
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_REDIRECTS: usize = 5;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SourceConfig {
    /// A directory holding the services' source trees.
    pub root: Option<PathBuf>,
    /// A URL per source file, fetched by the server: `{path}` is the file's path as the
    /// profile gives it, without its leading `/`, and `{service}` the service's name
    /// (`https://git.example.com/raw/{service}/main/{path}`). Both are percent-encoded,
    /// and neither can climb out of the part of the URL before them.
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
        let client = source_client(&config.url_template);
        Sources { config, client }
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
/// when there is no source configured or the file is not there. `client` should be
/// [`source_client`]'s, which keeps redirects under the template's prefix.
pub async fn read_source(
    config: &SourceConfig,
    client: &reqwest::Client,
    service: &str,
    file: &str,
) -> Result<Option<SourceText>, QueryError> {
    let relative = relative_path(file)?;
    if let Some(root) = &config.root {
        if let Some((path, text)) = read_under(root, &relative).await? {
            let origin = format!("source.root/{}", path.display());
            return Ok(Some(source_text(file, origin, &text)));
        }
    }
    if !config.url_template.is_empty() {
        let url = fill_template(&config.url_template, service, &relative.to_string_lossy())?;
        if let Some(text) = fetch(client, &url).await? {
            return Ok(Some(source_text(file, url.to_string(), &text)));
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

/// The first of `relative` and its suffixes that is a file under `root`, with its path
/// relative to the root.
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
            let suffix: PathBuf = parts[skip..].iter().collect();
            let Ok(resolved) = root.join(&suffix).canonicalize() else {
                continue;
            };
            let Ok(inside) = resolved.strip_prefix(&root) else {
                continue;
            };
            let Ok(metadata) = std::fs::metadata(&resolved) else {
                continue;
            };
            if !metadata.is_file() {
                continue;
            }
            if metadata.len() > MAX_SOURCE_BYTES {
                return Err(QueryError::BadRequest(format!(
                    "source file {} is {} bytes, more than the {MAX_SOURCE_BYTES} served",
                    suffix.display(),
                    metadata.len()
                )));
            }
            let bytes = std::fs::read(&resolved).map_err(|err| {
                tracing::warn!(path = %resolved.display(), error = %err, "source file unreadable");
                QueryError::NotFound(format!("source file {} is unreadable", suffix.display()))
            })?;
            return Ok(Some((
                inside.to_path_buf(),
                String::from_utf8_lossy(&bytes).into_owned(),
            )));
        }
        Ok(None)
    })
    .await?
}

/// The client that fetches by URL. It follows a redirect only where it stays under the
/// template's prefix: a raw-file host may move a file, but must not send the server to
/// another host or path.
pub fn source_client(template: &str) -> reqwest::Client {
    let prefix = template_prefix(template).ok();
    let policy = reqwest::redirect::Policy::custom(move |attempt| {
        let allowed = prefix
            .as_ref()
            .is_some_and(|prefix| prefix.contains(attempt.url()));
        if !allowed {
            attempt.stop()
        } else if attempt.previous().len() >= MAX_REDIRECTS {
            attempt.error("too many redirects")
        } else {
            attempt.follow()
        }
    });
    reqwest::Client::builder()
        .redirect(policy)
        .build()
        .unwrap_or_default()
}

/// What a template's URLs must stay under: its scheme, host, port and user, its path up to
/// the first placeholder, and its own query.
#[derive(Debug, Clone)]
struct Prefix {
    origin: reqwest::Url,
    path: String,
}

impl Prefix {
    fn contains(&self, url: &reqwest::Url) -> bool {
        url.scheme() == self.origin.scheme()
            && url.host_str() == self.origin.host_str()
            && url.port_or_known_default() == self.origin.port_or_known_default()
            && url.username() == self.origin.username()
            && url.password() == self.origin.password()
            && url
                .path()
                .strip_prefix(self.path.as_str())
                .is_some_and(|rest| {
                    !rest
                        .split('/')
                        .any(|segment| matches!(decode(segment).as_str(), "." | ".."))
                })
    }
}

fn template_prefix(template: &str) -> Result<Prefix, QueryError> {
    let bad = |why: String| QueryError::BadRequest(format!("source.url_template {why}"));
    let cut = ["{path}", "{service}"]
        .iter()
        .filter_map(|placeholder| template.find(placeholder))
        .min()
        .unwrap_or(template.len());
    let head = &template[..cut];
    if head.contains(['?', '#']) {
        return Err(bad("has a placeholder in its query or fragment".to_string()));
    }
    let origin = reqwest::Url::parse(head).map_err(|err| bad(format!("is not a URL: {err}")))?;
    if !matches!(origin.scheme(), "http" | "https") || origin.host_str().is_none() {
        return Err(bad("must be an http or https URL with a host".to_string()));
    }
    let path = origin.path().to_string();
    Ok(Prefix { origin, path })
}

/// Everything but RFC 3986's unreserved characters is encoded, `%` included.
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A segment percent-decoded once, as a host would see it.
fn decode(segment: &str) -> String {
    percent_encoding::percent_decode_str(segment)
        .decode_utf8_lossy()
        .into_owned()
}

/// A substituted value as percent-encoded path segments, or a refusal saying why.
fn encode_segments(what: &str, value: &str) -> Result<String, QueryError> {
    let refuse = |why: &str| {
        QueryError::BadRequest(format!(
            "{what} {value:?} cannot be fetched by source.url_template: {why}"
        ))
    };
    let mut encoded = String::with_capacity(value.len() + 8);
    for (i, segment) in value.split('/').enumerate() {
        let decoded = decode(segment);
        if matches!(decoded.as_str(), "" | "." | "..") {
            return Err(refuse("a path segment is empty, . or .."));
        }
        if decoded.contains(['\\', '/', '?', '#']) || decoded.chars().any(char::is_control) {
            return Err(refuse(
                "a path segment holds a backslash, ?, #, an encoded / or a control character",
            ));
        }
        if i > 0 {
            encoded.push('/');
        }
        encoded.extend(percent_encoding::utf8_percent_encode(segment, SEGMENT));
    }
    Ok(encoded)
}

/// The template with `{service}` and `{path}` filled in, checked to be under its prefix.
/// Public for the fuzz target `source_url`, which checks that nothing it accepts leaves
/// the prefix.
pub fn fill_template(
    template: &str,
    service: &str,
    path: &str,
) -> Result<reqwest::Url, QueryError> {
    let prefix = template_prefix(template)?;
    let url = template
        .replace("{service}", &encode_segments("service", service)?)
        .replace("{path}", &encode_segments("source file", path)?);
    let url = reqwest::Url::parse(&url)
        .map_err(|err| QueryError::BadRequest(format!("the source URL is not valid: {err}")))?;
    let own_query = template
        .split_once('?')
        .map(|(_, rest)| rest.split('#').next().unwrap_or(rest));
    if !prefix.contains(&url) || url.query() != own_query || url.fragment().is_some() {
        return Err(QueryError::BadRequest(
            "the source URL would leave source.url_template's prefix".to_string(),
        ));
    }
    Ok(url)
}

/// The body at `url`, `None` on 404 or on a redirect off the prefix; bounded in size and
/// time, and only text.
async fn fetch(client: &reqwest::Client, url: &reqwest::Url) -> Result<Option<String>, QueryError> {
    let unavailable = |err: String| QueryError::NotFound(format!("source at {url}: {err}"));
    let mut response = client
        .get(url.clone())
        .timeout(FETCH_TIMEOUT)
        .send()
        .await
        .map_err(|err| unavailable(err.to_string()))?;
    let status = response.status();
    if status.is_redirection() {
        tracing::debug!(%url, %status, "a redirect off source.url_template's prefix is not followed");
        return Ok(None);
    }
    if status == reqwest::StatusCode::NOT_FOUND {
        return Ok(None);
    }
    if !status.is_success() {
        return Err(unavailable(format!("HTTP {status}")));
    }
    let content_type = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if !content_type.starts_with("text/") {
        return Err(unavailable(format!(
            "its content type {content_type:?} is not text/*, so it is not shown"
        )));
    }
    let too_large = || unavailable(format!("more than the {MAX_SOURCE_BYTES} bytes served"));
    if response
        .content_length()
        .is_some_and(|length| length > MAX_SOURCE_BYTES)
    {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|err| unavailable(err.to_string()))?
    {
        body.extend_from_slice(&chunk);
        if body.len() as u64 > MAX_SOURCE_BYTES {
            return Err(too_large());
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
                    "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
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

    /// Random names over the characters that matter (dots, slashes, percent signs and hex
    /// digits, backslashes, `?`, `#`, a space, a letter): whatever is accepted stays under
    /// the prefix, with no dot segment, query or fragment of the name's, and the host
    /// decodes each segment back to the name's.
    #[test]
    fn random_hostile_names_never_leave_the_prefix() {
        let template = "https://git.example.com:8443/raw/{service}/main/{path}";
        let alphabet: &[u8] = b"././/%%2eEfF5c\\?#a ";
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut accepted = 0;
        for _ in 0..200_000 {
            let mut name = |longest: u64| -> String {
                let length = 1 + next() % longest;
                (0..length)
                    .map(|_| alphabet[(next() % alphabet.len() as u64) as usize] as char)
                    .collect()
            };
            let service = name(6);
            let path = name(10);
            let Ok(url) = fill_template(template, &service, &path) else {
                continue;
            };
            accepted += 1;
            assert_eq!(url.host_str(), Some("git.example.com"));
            assert_eq!(url.port(), Some(8443));
            assert!(url.query().is_none() && url.fragment().is_none(), "{url}");
            let segments: Vec<String> = url
                .path()
                .split('/')
                .map(|segment| {
                    percent_encoding::percent_decode_str(segment)
                        .decode_utf8_lossy()
                        .into_owned()
                })
                .collect();
            assert!(segments.iter().all(|s| s != "." && s != ".."), "{url}");
            assert_eq!(segments[..2], ["", "raw"], "{url}");
            let expected: Vec<&str> = ["", "raw"]
                .into_iter()
                .chain(service.split('/'))
                .chain(["main"])
                .chain(path.split('/'))
                .collect();
            assert_eq!(segments, expected, "{service:?} {path:?} -> {url}");
        }
        assert!(accepted > 1_000, "only {accepted} names were accepted");
    }

    /// Every way a name could steer the fetch out of the template's prefix is refused, and
    /// what is allowed is encoded so the host decodes the name as sent.
    #[test]
    fn substituted_values_never_leave_the_template_prefix() {
        let template = "https://git.example.com:8443/raw/{service}/main/{path}?ref=1";
        let fill = |service: &str, path: &str| fill_template(template, service, path);
        let url = fill("shop", "src/cart.go").unwrap();
        assert_eq!(
            url.as_str(),
            "https://git.example.com:8443/raw/shop/main/src/cart.go?ref=1"
        );
        // Names that are merely unusual are encoded, not refused.
        assert_eq!(
            fill("my shop", "a b/c%d+é.go").unwrap().as_str(),
            "https://git.example.com:8443/raw/my%20shop/main/a%20b/c%25d%2B%C3%A9.go?ref=1"
        );
        assert_eq!(
            fill("shop", "%41.go").unwrap().path(),
            "/raw/shop/main/%2541.go",
            "a % is sent as %25, so the host sees the name as sent"
        );
        for hostile in [
            "..",
            "../admin/secret",
            "%2e%2e/admin/secret",
            "%2E%2E/admin/secret",
            ".%2e/admin",
            "%2e./admin",
            "a/%2e/b",
            "a/./b",
            "a//b",
            "a/",
            "..\\x",
            "a\\..\\..\\admin",
            "%5c..%5cadmin",
            "a%2f..%2f..%2fadmin",
            "%2F..%2Fadmin",
            "a?token=1",
            "a%3ftoken=1",
            "a#fragment",
            "a%23fragment",
            "a\nb",
            "a%0d%0aHost: evil",
            "a%00b",
            "",
        ] {
            let err = fill("shop", hostile).expect_err(hostile);
            assert!(matches!(err, QueryError::BadRequest(_)), "{hostile}: {err}");
            let err = fill(hostile, "cart.go").expect_err(hostile);
            assert!(matches!(err, QueryError::BadRequest(_)), "{hostile}: {err}");
        }
        assert!(fill("x/../../internal/api?", "cart.go").is_err());
        // A placeholder in the host would let a value pick the host: the prefix is the
        // scheme alone, which is no prefix at all, so it is refused.
        assert!(template_prefix("http://{service}.example.com/{path}").is_err());
        assert!(template_prefix("https://h/raw?file={path}").is_err());
        assert!(template_prefix("file:///etc/{path}").is_err());
        // The prefix check itself, for redirects.
        let prefix = template_prefix(template).unwrap();
        let parse = |url: &str| reqwest::Url::parse(url).unwrap();
        assert!(prefix.contains(&parse("https://git.example.com:8443/raw/x/main/y.go")));
        assert!(!prefix.contains(&parse("https://git.example.com:8443/admin")));
        assert!(!prefix.contains(&parse("http://git.example.com:8443/raw/x")));
        assert!(!prefix.contains(&parse("https://git.example.com/raw/x")));
        assert!(!prefix.contains(&parse("https://evil.example.com:8443/raw/x")));
        assert!(!prefix.contains(&parse("https://u:p@git.example.com:8443/raw/x")));
        assert!(!prefix.contains(&parse("https://git.example.com:8443/raw/%2e%2e/admin")));
        assert!(!prefix.contains(&parse("https://git.example.com:8443/rawx/y")));
    }
}
