//! Who may do what with which tenant's data.
//!
//! A token belongs to one tenant and carries scopes (`read`, `write`, `admin`, each
//! granted on its own). Only its SHA-256 is configured, so a leaked config file leaks no
//! credential; tokens are 256 random bits, so an unsalted fast hash is enough (there is
//! no dictionary to attack). A request presents a token as `Authorization: Bearer`, or
//! as HTTP basic auth with the tenant id as user name and the token as password, which
//! is what the Pyroscope SDKs, Grafana and Prometheus send.
//!
//! [`Authenticator::check`] decides in three steps, and each refusal is one
//! [`AuthError`] variant with one status and one metric reason:
//! 1. the token is hashed and compared with every configured hash in constant time, so
//!    how long a refusal takes says nothing about how close the guess was;
//! 2. a token that is not configured (or a malformed header) is a failed guess: refused
//!    with 401, or with 429 once its client address or the name it presents (the
//!    basic-auth user) has used this minute's budget of failures ([`failures`]). Valid
//!    credentials never meet that limit, so one client's guesses cannot lock out another
//!    behind the same NAT, and no credentials at all is a plain 401 that counts for
//!    nothing;
//! 3. the token's tenant must be the one asked for (`X-Scope-OrgID`, or the basic-auth
//!    user), and its scopes must hold the one the endpoint needs (403).
//!
//! The crate knows nothing of HTTP beyond the `Authorization` header's syntax: which
//! endpoint needs which scope is the server's table.

mod config;
mod failures;
mod node;
mod token;

use std::net::IpAddr;
use std::time::Instant;

use kiln_model::ErrorKind;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use thiserror::Error;

pub use config::{AuthConfig, Scope, TenantAuth, TokenSpec};
pub use node::NodeCredential;
pub use token::{new_token, sha256_hex, Credentials};

use failures::{Failures, Key};

/// Why a request was refused; each variant maps to one status and one metric reason.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum AuthError {
    #[error("authentication required: send `Authorization: Bearer <token>`, or basic auth with the tenant id as user name and the token as password")]
    Missing,
    #[error("malformed Authorization header: {0}")]
    Malformed(&'static str),
    #[error("invalid token")]
    Invalid,
    #[error("token {token:?} belongs to tenant {granted:?}, not {requested:?}")]
    WrongTenant {
        token: String,
        granted: String,
        requested: String,
    },
    #[error(
        "token {token:?} of tenant {tenant:?} does not have the {scope} scope this endpoint needs"
    )]
    MissingScope {
        token: String,
        tenant: String,
        scope: Scope,
    },
    #[error(
        "too many failed authentication attempts from this address or for this name; retry in {retry_after_secs} s"
    )]
    TooManyFailures { retry_after_secs: u64 },
    /// A node-to-node endpoint asked for without this deployment's node credential.
    #[error("this endpoint is for Kiln's own nodes: it needs the node credential (cluster.token_file), not a tenant token")]
    NodeOnly,
}

impl AuthError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            AuthError::Missing | AuthError::Malformed(_) | AuthError::Invalid => {
                ErrorKind::Unauthenticated
            }
            AuthError::WrongTenant { .. }
            | AuthError::MissingScope { .. }
            | AuthError::NodeOnly => ErrorKind::Forbidden,
            AuthError::TooManyFailures { .. } => ErrorKind::RateLimited,
        }
    }

    /// The `reason` label of `kiln_auth_failures_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            AuthError::Missing => "missing",
            AuthError::Malformed(_) => "malformed",
            AuthError::Invalid => "invalid",
            AuthError::WrongTenant { .. } => "wrong_tenant",
            AuthError::MissingScope { .. } => "scope",
            AuthError::TooManyFailures { .. } => "too_many_failures",
            AuthError::NodeOnly => "node_only",
        }
    }

    /// Seconds a client should wait before trying again, for `Retry-After`.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            AuthError::TooManyFailures { retry_after_secs } => Some(*retry_after_secs),
            _ => None,
        }
    }
}

/// A configuration that cannot be used: refused at startup, with where the mistake is.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("auth: {0}")]
pub struct ConfigError(pub String);

/// Who a request is: the tenant its token belongs to, and what the token may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub tenant: String,
    /// The token's name, for logs and errors (never the token).
    pub token: String,
    pub scopes: Vec<Scope>,
}

struct Entry {
    hash: [u8; 32],
    grant: Grant,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// Checks requests against the configured tokens; shared by every request.
pub struct Authenticator {
    entries: Vec<Entry>,
    metrics_scope: Option<Scope>,
    failures: Failures,
    failed: Family<ReasonLabel, Counter>,
}

impl Authenticator {
    /// `None` when auth is disabled; an error when the config cannot be used as written.
    pub fn from_config(config: &AuthConfig) -> Result<Option<Authenticator>, ConfigError> {
        if !config.enabled {
            return Ok(None);
        }
        let entries = config.validate()?;
        let entries = entries
            .into_iter()
            .map(|(hash, grant)| Entry { hash, grant })
            .collect();
        Ok(Some(Authenticator {
            entries,
            metrics_scope: config.metrics_scope,
            failures: Failures::new(config.max_failures_per_minute),
            failed: Family::default(),
        }))
    }

    /// The scope `/metrics` needs, when it is closed.
    pub fn metrics_scope(&self) -> Option<Scope> {
        self.metrics_scope
    }

    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kiln_auth_failures",
            "Requests refused for their credentials, by reason",
            self.failed.clone(),
        );
    }

    /// Decides a request: `authorization` is its `Authorization` header, `tenant` its
    /// `X-Scope-OrgID` (if any), `scope` what the endpoint needs. Failed guesses are
    /// counted against `client` and the name presented.
    pub fn check(
        &self,
        authorization: Option<&[u8]>,
        tenant: Option<&str>,
        scope: Scope,
        client: IpAddr,
    ) -> Result<Grant, AuthError> {
        let now = Instant::now();
        let result = match Credentials::parse(authorization) {
            Err(AuthError::Missing) => Err(AuthError::Missing),
            Err(err) => self.guessed(err, vec![Key::Address(client)], now),
            Ok(credentials) => {
                let (token, user) = match credentials {
                    Credentials::Bearer(token) => (token, None),
                    Credentials::Basic { user, password } => (password, Some(user)),
                };
                match self.lookup(token.as_bytes()) {
                    Some(grant) => Self::allows(grant, user.as_deref(), tenant, scope),
                    None => {
                        let mut keys = vec![Key::Address(client)];
                        keys.extend(user.or(tenant.map(str::to_string)).map(Key::Name));
                        self.guessed(AuthError::Invalid, keys, now)
                    }
                }
            }
        };
        if let Err(err) = &result {
            self.failed
                .get_or_create(&ReasonLabel {
                    reason: err.reason(),
                })
                .inc();
            tracing::debug!(%client, reason = err.reason(), "request refused: {err}");
        }
        result
    }

    /// A failed guess: 429 if one of its keys is over its budget, else `err`, counted.
    fn guessed(&self, err: AuthError, keys: Vec<Key>, now: Instant) -> Result<Grant, AuthError> {
        self.failures.admit(&keys, now)?;
        self.failures.record(&keys, now);
        Err(err)
    }

    /// Whether a configured token may act for the tenant asked for, with `scope`.
    fn allows(
        grant: &Grant,
        user: Option<&str>,
        tenant: Option<&str>,
        scope: Scope,
    ) -> Result<Grant, AuthError> {
        // Basic auth names the tenant twice at most (user name, header); both must agree
        // with the token's.
        for requested in [user, tenant].into_iter().flatten() {
            if requested != grant.tenant {
                return Err(AuthError::WrongTenant {
                    token: grant.token.clone(),
                    granted: grant.tenant.clone(),
                    requested: requested.to_string(),
                });
            }
        }
        if !grant.scopes.contains(&scope) {
            return Err(AuthError::MissingScope {
                token: grant.token.clone(),
                tenant: grant.tenant.clone(),
                scope,
            });
        }
        Ok(grant.clone())
    }

    /// Every configured hash is compared, whatever matched first, each in constant time.
    fn lookup(&self, token: &[u8]) -> Option<&Grant> {
        let hash: [u8; 32] = Sha256::digest(token).into();
        let mut found = None;
        for entry in &self.entries {
            if bool::from(entry.hash.ct_eq(&hash)) {
                found = Some(&entry.grant);
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(user: &str, password: &str) -> Vec<u8> {
        use base64::Engine;
        let encoded =
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        format!("Basic {encoded}").into_bytes()
    }

    fn authenticator(max_failures: u32) -> Authenticator {
        let yaml = format!(
            r#"
enabled: true
max_failures_per_minute: {max_failures}
tenants:
  team-a:
    tokens:
      - {{ name: ci-agent, sha256: "{}", scopes: [write] }}
      - {{ name: grafana, sha256: "{}", scopes: [read] }}
  team-b:
    tokens:
      - {{ name: ops, sha256: "{}", scopes: [read, write, admin] }}
"#,
            sha256_hex("writer-a"),
            sha256_hex("reader-a"),
            sha256_hex("ops-b")
        );
        let config: AuthConfig = yaml_serde::from_str(&yaml).expect("config");
        Authenticator::from_config(&config)
            .expect("valid")
            .expect("enabled")
    }

    const CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[test]
    fn tokens_grant_their_tenant_and_scopes_only() {
        let auth = authenticator(100);
        let bearer = |token: &str| format!("Bearer {token}").into_bytes();
        let grant = auth
            .check(Some(&bearer("writer-a")), None, Scope::Write, CLIENT)
            .expect("write token writes");
        assert_eq!(
            (grant.tenant.as_str(), grant.token.as_str()),
            ("team-a", "ci-agent")
        );
        assert!(matches!(
            auth.check(Some(&bearer("writer-a")), None, Scope::Read, CLIENT),
            Err(AuthError::MissingScope {
                scope: Scope::Read,
                ..
            })
        ));
        assert!(matches!(
            auth.check(
                Some(&bearer("reader-a")),
                Some("team-b"),
                Scope::Read,
                CLIENT
            ),
            Err(AuthError::WrongTenant { .. })
        ));
        assert_eq!(
            auth.check(Some(&bearer("nope")), None, Scope::Read, CLIENT),
            Err(AuthError::Invalid)
        );
        assert_eq!(
            auth.check(None, Some("team-a"), Scope::Read, CLIENT),
            Err(AuthError::Missing)
        );
        // Basic auth: the user name is the tenant.
        let grant = auth
            .check(Some(&basic("team-b", "ops-b")), None, Scope::Admin, CLIENT)
            .expect("basic auth");
        assert_eq!(grant.tenant, "team-b");
        assert!(matches!(
            auth.check(Some(&basic("team-a", "ops-b")), None, Scope::Read, CLIENT),
            Err(AuthError::WrongTenant { .. })
        ));
        assert!(matches!(
            auth.check(Some(b"Digest abc"), None, Scope::Read, CLIENT),
            Err(AuthError::Malformed(_))
        ));
    }

    #[test]
    fn an_address_over_its_failure_budget_is_refused_but_valid_credentials_are_not() {
        let auth = authenticator(3);
        let good = b"Bearer reader-a".as_slice();
        for _ in 0..3 {
            assert_eq!(
                auth.check(Some(b"Bearer guess"), None, Scope::Read, CLIENT),
                Err(AuthError::Invalid)
            );
        }
        let refused = auth.check(Some(b"Bearer guess"), None, Scope::Read, CLIENT);
        let Err(AuthError::TooManyFailures { retry_after_secs }) = refused else {
            panic!("{refused:?}");
        };
        assert!((1..=60).contains(&retry_after_secs), "{retry_after_secs}");
        // A valid token from the same address (a NAT, a proxy) is not refused.
        assert!(auth.check(Some(good), None, Scope::Read, CLIENT).is_ok());
        // Nor are requests without credentials counted, however many: 401, never 429.
        for _ in 0..100 {
            assert_eq!(
                auth.check(
                    None,
                    None,
                    Scope::Read,
                    IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 3))
                ),
                Err(AuthError::Missing)
            );
        }
        assert_eq!(
            auth.check(
                Some(b"Bearer guess"),
                None,
                Scope::Read,
                IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 3))
            ),
            Err(AuthError::Invalid)
        );
        // Guesses at one tenant's basic auth from many addresses share the name's budget.
        for last in 10..13 {
            let address = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, last));
            assert_eq!(
                auth.check(Some(&basic("team-b", "guess")), None, Scope::Read, address),
                Err(AuthError::Invalid)
            );
        }
        let address = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 20));
        assert!(matches!(
            auth.check(Some(&basic("team-b", "guess")), None, Scope::Read, address),
            Err(AuthError::TooManyFailures { .. })
        ));
        assert!(auth
            .check(Some(&basic("team-b", "ops-b")), None, Scope::Read, address)
            .is_ok());
    }
}
