//! Which API server, and as whom: `api_server`, `kubeconfig_file`, or the pod's own
//! service account, as Prometheus's `kubernetes_sd_configs` choose.
//!
//! In a pod, the service account's token is re-read whenever its file changes (a stat per
//! request): the kubelet replaces a projected token long before it expires, and a client
//! that re-reads on a timer instead (kube's own does every 60 s, as client-go does) would
//! only be slower to follow.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use http::{HeaderValue, Request};

use crate::KubeError;

/// Where the service account's files are in a pod.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// How to reach the API server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApiConfig {
    /// `api_server`: a URL; in-cluster config when neither this nor a kubeconfig is set.
    pub api_server: Option<String>,
    /// `kubeconfig_file`: its current context.
    pub kubeconfig_file: Option<PathBuf>,
    /// A bearer token file for `api_server` (`authorization.credentials_file`).
    pub bearer_token_file: Option<PathBuf>,
    /// A CA bundle for `api_server` (`tls_config.ca_file`).
    pub ca_file: Option<PathBuf>,
    pub insecure_skip_verify: bool,
    /// The service account's directory, for in-cluster config: [`SERVICE_ACCOUNT_DIR`]
    /// unless `KILN_KUBERNETES_SERVICE_ACCOUNT_DIR` names another (tests, unusual mounts).
    pub service_account_dir: Option<PathBuf>,
}

impl ApiConfig {
    fn service_account_dir(&self) -> PathBuf {
        self.service_account_dir
            .clone()
            .or_else(|| std::env::var_os("KILN_KUBERNETES_SERVICE_ACCOUNT_DIR").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(SERVICE_ACCOUNT_DIR))
    }

    /// The namespace this process runs in (`namespaces: { own_namespace: true }`): the
    /// service account's, else the kubeconfig context's, else `default`.
    pub fn own_namespace(&self) -> String {
        std::fs::read_to_string(self.service_account_dir().join("namespace"))
            .ok()
            .map(|text| text.trim().to_string())
            .filter(|namespace| !namespace.is_empty())
            .unwrap_or_else(|| "default".into())
    }

    /// A client for this configuration. Reads files, but makes no request.
    pub async fn client(&self) -> Result<kube::Client, KubeError> {
        let (config, token_file) = if let Some(path) = &self.kubeconfig_file {
            let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|source| {
                KubeError::Kubeconfig {
                    path: path.clone(),
                    source,
                }
            })?;
            let options = kube::config::KubeConfigOptions::default();
            let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|source| KubeError::Kubeconfig {
                    path: path.clone(),
                    source,
                })?;
            (config, None)
        } else if let Some(url) = &self.api_server {
            let uri: http::Uri = url
                .parse()
                .map_err(|_| KubeError::Config(format!("api_server {url:?} is not a URL")))?;
            let mut config = kube::Config::new(uri);
            config.root_cert_file = self.ca_file.clone();
            config.accept_invalid_certs = self.insecure_skip_verify;
            (config, self.bearer_token_file.clone())
        } else {
            let dir = self.service_account_dir();
            let host = std::env::var("KUBERNETES_SERVICE_HOST").map_err(|_| {
                KubeError::Config(
                    "no api_server or kubeconfig_file, and not in a pod (KUBERNETES_SERVICE_HOST is not set)"
                        .into(),
                )
            })?;
            let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
            let host = if host.contains(':') {
                format!("[{host}]")
            } else {
                host
            };
            let uri: http::Uri = format!("https://{host}:{port}").parse().map_err(|_| {
                KubeError::Config(format!("KUBERNETES_SERVICE_HOST {host:?} is not a host"))
            })?;
            let mut config = kube::Config::new(uri);
            let ca = dir.join("ca.crt");
            if !ca.exists() {
                return Err(KubeError::Config(format!(
                    "in-cluster config: no CA at {}",
                    ca.display()
                )));
            }
            config.root_cert_file = Some(ca);
            config.default_namespace = self.own_namespace();
            (config, Some(dir.join("token")))
        };
        let builder = kube::client::ClientBuilder::try_from(config).map_err(KubeError::Client)?;
        let Some(path) = token_file else {
            return Ok(builder.build());
        };
        let token = Arc::new(TokenFile::read(&path)?);
        let layer = tower::util::MapRequestLayer::new(move |mut request: Request<_>| {
            if let Some(value) = token.header() {
                request
                    .headers_mut()
                    .insert(http::header::AUTHORIZATION, value);
            }
            request
        });
        Ok(builder.with_layer(&layer).build())
    }
}

/// A file's modification time and length: it changed when they did.
type Stamp = (SystemTime, u64);

/// A bearer token file, read again when it changes.
struct TokenFile {
    path: PathBuf,
    current: Mutex<(Option<Stamp>, Option<HeaderValue>)>,
}

impl TokenFile {
    fn read(path: &Path) -> Result<TokenFile, KubeError> {
        let file = TokenFile {
            path: path.to_path_buf(),
            current: Mutex::new((None, None)),
        };
        if file.header().is_none() {
            return Err(KubeError::Config(format!(
                "cannot read a token from {}",
                path.display()
            )));
        }
        Ok(file)
    }

    /// The header for the token now in the file; the last one read when it cannot be read.
    fn header(&self) -> Option<HeaderValue> {
        let stamp = std::fs::metadata(&self.path)
            .ok()
            .and_then(|m| Some((m.modified().ok()?, m.len())));
        let Ok(mut current) = self.current.lock() else {
            return None;
        };
        if stamp.is_some() && stamp != current.0 {
            match std::fs::read_to_string(&self.path) {
                Ok(text) => {
                    let value = HeaderValue::from_str(&format!("Bearer {}", text.trim())).ok();
                    if let Some(mut value) = value {
                        value.set_sensitive(true);
                        *current = (stamp, Some(value));
                        tracing::debug!(path = %self.path.display(), "read the API server token");
                    }
                }
                Err(err) => {
                    tracing::warn!(path = %self.path.display(), error = %err, "cannot read the API server token; keeping the last one")
                }
            }
        }
        current.1.clone()
    }
}
