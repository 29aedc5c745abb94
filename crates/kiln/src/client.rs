//! How the commands that call a server authenticate and check its certificate: a token
//! from `--token-file` or `KILN_TOKEN`, sent as `Authorization: Bearer`, and extra trusted
//! CAs from `--ca-file` on top of the system's.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

#[derive(Args, Clone, Debug, Default)]
pub struct ClientAuth {
    /// File holding the token to send (`kiln auth new-token` makes one); the
    /// KILN_TOKEN environment variable holds the token itself instead.
    #[arg(long, env = "KILN_TOKEN_FILE", global = true)]
    pub token_file: Option<PathBuf>,
    /// PEM file of CA certificates to trust for https:// servers, besides the system's.
    #[arg(long, env = "KILN_CA_FILE", global = true)]
    pub ca_file: Option<PathBuf>,
}

impl ClientAuth {
    /// The token, read now: a file wins over the environment. Whitespace around it (a
    /// trailing newline) is not part of it.
    pub fn token(&self) -> anyhow::Result<Option<String>> {
        let token = match &self.token_file {
            Some(path) => std::fs::read_to_string(path)
                .with_context(|| format!("cannot read --token-file {}", path.display()))?,
            None => match std::env::var("KILN_TOKEN") {
                Ok(token) => token,
                Err(_) => return Ok(None),
            },
        };
        let token = token.trim();
        if token.is_empty() {
            anyhow::bail!("the token is empty (--token-file or KILN_TOKEN)");
        }
        Ok(Some(token.to_string()))
    }

    /// The `Authorization` header value, if a token is given.
    pub fn authorization(&self) -> anyhow::Result<Option<String>> {
        Ok(self.token()?.map(|token| format!("Bearer {token}")))
    }

    fn certificates(&self) -> anyhow::Result<Vec<reqwest::Certificate>> {
        let Some(path) = &self.ca_file else {
            return Ok(Vec::new());
        };
        let pem = std::fs::read(path)
            .with_context(|| format!("cannot read --ca-file {}", path.display()))?;
        let certificates = reqwest::Certificate::from_pem_bundle(&pem)
            .with_context(|| format!("--ca-file {}: not PEM certificates", path.display()))?;
        if certificates.is_empty() {
            anyhow::bail!("--ca-file {}: no certificate in it", path.display());
        }
        Ok(certificates)
    }

    /// A blocking client (for commands without a runtime, and the agent's sender thread).
    pub fn blocking(&self, timeout: Duration) -> anyhow::Result<reqwest::blocking::Client> {
        reqwest::blocking::Client::builder()
            .timeout(timeout)
            .tls_certs_merge(self.certificates()?)
            .build()
            .context("cannot set up the HTTP client")
    }

    pub fn asynchronous(&self, timeout: Duration) -> anyhow::Result<reqwest::Client> {
        reqwest::Client::builder()
            .timeout(timeout)
            .tls_certs_merge(self.certificates()?)
            .build()
            .context("cannot set up the HTTP client")
    }
}
