//! HTTPS on the listening port, with rustls: HTTP/1.1 and h2 (so gRPC) chosen by ALPN.
//!
//! The certificate can be replaced without a restart or a dropped connection: SIGHUP
//! re-reads both files, and the resolver hands the new pair to handshakes from then on,
//! while connections already open keep the session they negotiated. A pair that does not
//! load (a half-written file, a key that is not the certificate's) is refused with an
//! error in the log and the old pair stays; the reload counter says which happened.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio_rustls::TlsAcceptor;

/// `tls:` in the config; `--tls-cert-file` and `--tls-key-file` set the same.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM: the server's certificate first, then its chain.
    pub cert_file: Option<PathBuf>,
    /// PEM: the certificate's private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
}

impl TlsConfig {
    pub fn enabled(&self) -> bool {
        self.cert_file.is_some() || self.key_file.is_some()
    }
}

#[derive(Debug, Error)]
pub enum TlsError {
    #[error("tls: give both cert_file and key_file (--tls-cert-file, --tls-key-file)")]
    Incomplete,
    #[error("tls: cannot read the certificates in {path}: {source}")]
    Certificates {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("tls: {0} holds no certificate")]
    NoCertificate(PathBuf),
    #[error("tls: cannot read the private key in {path}: {source}")]
    Key {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("tls: the key in {key} does not go with the certificate in {cert}: {source}")]
    Mismatch {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
    #[error("tls: {0}")]
    Config(#[source] rustls::Error),
}

#[derive(Debug)]
struct Resolver(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|p| p.into_inner()).clone())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// The acceptor and what it serves; shared by the accept loop and the reloader.
pub struct Tls {
    pub acceptor: TlsAcceptor,
    resolver: Arc<Resolver>,
    provider: Arc<CryptoProvider>,
    cert_file: PathBuf,
    key_file: PathBuf,
    reloads: Family<OutcomeLabel, Counter>,
}

impl Tls {
    pub fn load(config: &TlsConfig) -> Result<Tls, TlsError> {
        let (Some(cert_file), Some(key_file)) = (&config.cert_file, &config.key_file) else {
            return Err(TlsError::Incomplete);
        };
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let key = certified_key(cert_file, key_file, &provider)?;
        let resolver = Arc::new(Resolver(RwLock::new(Arc::new(key))));
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Config)?
            .with_no_client_auth()
            .with_cert_resolver(resolver.clone());
        server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Tls {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            resolver,
            provider,
            cert_file: cert_file.clone(),
            key_file: key_file.clone(),
            reloads: Family::default(),
        })
    }

    /// Re-reads both files; the old pair stays when the new one does not load.
    pub fn reload(&self) -> Result<(), TlsError> {
        let result = certified_key(&self.cert_file, &self.key_file, &self.provider);
        let outcome = if result.is_ok() { "success" } else { "failure" };
        self.reloads.get_or_create(&OutcomeLabel { outcome }).inc();
        let key = result?;
        *self.resolver.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(key);
        Ok(())
    }

    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kiln_tls_reloads",
            "Certificate reloads on SIGHUP, by outcome",
            self.reloads.clone(),
        );
    }

    /// Reloads on every SIGHUP until the process ends.
    pub fn reload_on_sighup(self: Arc<Self>) -> std::io::Result<tokio::task::JoinHandle<()>> {
        let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
        Ok(tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                match self.reload() {
                    Ok(()) => {
                        tracing::info!(cert = %self.cert_file.display(), "TLS certificate reloaded")
                    }
                    Err(err) => {
                        tracing::error!(error = %err, "TLS certificate not reloaded; the previous one is still served")
                    }
                }
            }
        }))
    }
}

fn certified_key(
    cert_file: &Path,
    key_file: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let certificates = CertificateDer::pem_file_iter(cert_file)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|source| TlsError::Certificates {
            path: cert_file.to_path_buf(),
            source,
        })?;
    if certificates.is_empty() {
        return Err(TlsError::NoCertificate(cert_file.to_path_buf()));
    }
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|source| TlsError::Key {
        path: key_file.to_path_buf(),
        source,
    })?;
    CertifiedKey::from_der(certificates, key, provider).map_err(|source| TlsError::Mismatch {
        cert: cert_file.to_path_buf(),
        key: key_file.to_path_buf(),
        source,
    })
}
