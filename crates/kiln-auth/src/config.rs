//! The `auth:` block of the server's config, exactly as users write it.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::{ConfigError, Grant};

/// What a token may do. Scopes are granted one by one: `admin` does not imply `read`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Queries, listings, comparisons, the rules as defined.
    Read,
    /// Ingest on every protocol.
    Write,
    /// Changing the server's state other than by ingest: recording rules and backfills.
    Admin,
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Scope::Read => "read",
            Scope::Write => "write",
            Scope::Admin => "admin",
        })
    }
}

impl std::str::FromStr for Scope {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim() {
            "read" => Ok(Scope::Read),
            "write" => Ok(Scope::Write),
            "admin" => Ok(Scope::Admin),
            other => Err(format!("unknown scope {other:?}; use read, write or admin")),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    pub enabled: bool,
    /// Tokens by tenant id.
    pub tenants: BTreeMap<String, TenantAuth>,
    /// The scope `/metrics` needs (of any tenant): `admin` by default, since it shows
    /// every tenant's recording-rule series and limits; `none` opens it on purpose (a
    /// Prometheus on a private network without credentials).
    #[serde(with = "metrics_scope")]
    pub metrics_scope: Option<Scope>,
    /// Failed guesses (unknown tokens, malformed headers) one client address, or one
    /// presented basic-auth name, may make in a minute; past it, further guesses get 429
    /// until the minute is over. Valid credentials and requests without any are never
    /// refused by it. 0 turns the limit off.
    pub max_failures_per_minute: u32,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            enabled: false,
            tenants: BTreeMap::new(),
            metrics_scope: Some(Scope::Admin),
            max_failures_per_minute: 30,
        }
    }
}

/// `metrics_scope` as written: a scope, or `none` for no credentials at all.
mod metrics_scope {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::Scope;

    pub fn serialize<S: Serializer>(
        scope: &Option<Scope>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match scope {
            Some(scope) => scope.serialize(serializer),
            None => serializer.serialize_str("none"),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Scope>, D::Error> {
        match Option::<String>::deserialize(deserializer)?
            .as_deref()
            .map(str::trim)
        {
            None | Some("none") => Ok(None),
            Some(text) => text
                .parse()
                .map(Some)
                .map_err(|err: String| serde::de::Error::custom(format!("{err}, or none"))),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantAuth {
    pub tokens: Vec<TokenSpec>,
}

/// One token: a name for logs, the hex SHA-256 of the token, and its scopes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenSpec {
    pub name: String,
    pub sha256: String,
    pub scopes: Vec<Scope>,
}

impl AuthConfig {
    /// Every token with its hash decoded; refuses what would be ambiguous or useless.
    pub(crate) fn validate(&self) -> Result<Vec<([u8; 32], Grant)>, ConfigError> {
        let mut entries = Vec::new();
        let mut hashes = HashSet::new();
        for (tenant, spec) in &self.tenants {
            if tenant.is_empty() {
                return Err(ConfigError("a tenant id is empty".to_string()));
            }
            let mut names = HashSet::new();
            for token in &spec.tokens {
                let at = format!("tenants.{tenant}.tokens[{}]", token.name);
                if token.name.trim().is_empty() {
                    return Err(ConfigError(format!(
                        "a token of tenant {tenant} has no name"
                    )));
                }
                if !names.insert(token.name.as_str()) {
                    return Err(ConfigError(format!("{at}: the name is used twice")));
                }
                let hash = decode_hex(&token.sha256).ok_or_else(|| {
                    ConfigError(format!(
                        "{at}: sha256 must be 64 hexadecimal digits (the SHA-256 of the token; `kiln auth new-token` prints it)"
                    ))
                })?;
                if !hashes.insert(hash) {
                    return Err(ConfigError(format!(
                        "{at}: the same token is configured twice; a token must name one tenant"
                    )));
                }
                if token.scopes.is_empty() {
                    return Err(ConfigError(format!(
                        "{at}: no scopes; give it read, write and/or admin"
                    )));
                }
                let mut scopes = token.scopes.clone();
                scopes.sort();
                scopes.dedup();
                entries.push((
                    hash,
                    Grant {
                        tenant: tenant.clone(),
                        token: token.name.clone(),
                        scopes,
                    },
                ));
            }
        }
        if entries.is_empty() {
            return Err(ConfigError(
                "enabled, but no tenant has a token: nothing could be read or written (create one with `kiln auth new-token`)".to_string(),
            ));
        }
        Ok(entries)
    }
}

fn decode_hex(text: &str) -> Option<[u8; 32]> {
    let text = text.trim().as_bytes();
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (byte, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
        let digit = |c: u8| (c as char).to_digit(16);
        *byte = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sha256_hex;

    fn config(yaml: &str) -> Result<Vec<([u8; 32], Grant)>, ConfigError> {
        yaml_serde::from_str::<AuthConfig>(yaml)
            .expect("parses")
            .validate()
    }

    #[test]
    fn mistakes_are_refused_with_where_they_are() {
        let hash = sha256_hex("t");
        let ok = config(&format!(
            "enabled: true\ntenants:\n  a:\n    tokens:\n      - {{ name: x, sha256: \"{hash}\", scopes: [admin, read, read] }}\n"
        ))
        .expect("valid");
        assert_eq!(ok[0].1.scopes, vec![Scope::Read, Scope::Admin]);
        let short = config("enabled: true\ntenants:\n  a:\n    tokens:\n      - { name: x, sha256: \"abc\", scopes: [read] }\n")
            .expect_err("short hash");
        assert!(short.0.contains("tenants.a.tokens[x]: sha256"), "{short}");
        let twice = config(&format!(
            "enabled: true\ntenants:\n  a:\n    tokens:\n      - {{ name: x, sha256: \"{hash}\", scopes: [read] }}\n  b:\n    tokens:\n      - {{ name: y, sha256: \"{hash}\", scopes: [read] }}\n"
        ))
        .expect_err("same token twice");
        assert!(twice.0.contains("one tenant"), "{twice}");
        let none = config("enabled: true\n").expect_err("no tokens");
        assert!(none.0.contains("no tenant has a token"), "{none}");
        assert!(yaml_serde::from_str::<AuthConfig>("enabled: true\ntenant: {}\n").is_err());
        assert!(yaml_serde::from_str::<AuthConfig>(
            "tenants:\n  a:\n    tokens:\n      - { name: x, sha256: \"\", scopes: [root] }\n"
        )
        .is_err());
    }

    #[test]
    fn metrics_need_admin_unless_opened_on_purpose() {
        let parse = |yaml: &str| yaml_serde::from_str::<AuthConfig>(yaml).map(|c| c.metrics_scope);
        assert_eq!(parse("enabled: true\n").unwrap(), Some(Scope::Admin));
        assert_eq!(parse("metrics_scope: none\n").unwrap(), None);
        assert_eq!(parse("metrics_scope: read\n").unwrap(), Some(Scope::Read));
        let err = parse("metrics_scope: root\n").unwrap_err().to_string();
        assert!(err.contains("or none"), "{err}");
        let text = yaml_serde::to_string(&AuthConfig {
            metrics_scope: None,
            ..AuthConfig::default()
        })
        .unwrap();
        assert_eq!(parse(&text).unwrap(), None, "{text}");
    }
}
