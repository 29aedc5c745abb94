//! The credential nodes of one deployment present to each other (`cluster.token_file`).
//!
//! A query node that splits a query asks its peers for shares on `/api/v1/partial/*`,
//! which read any object key they are given. Those endpoints are for nodes only: a tenant
//! token, even an admin one, never opens them. The token is a shared secret read from a
//! file that every node mounts (a Kubernetes secret, say), compared in constant time.

use std::path::Path;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::ConfigError;

/// This deployment's node credential.
#[derive(Clone)]
pub struct NodeCredential {
    token: String,
    hash: [u8; 32],
}

impl std::fmt::Debug for NodeCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeCredential(..)")
    }
}

impl NodeCredential {
    /// Reads the token (the file's first line, trimmed); refuses an empty or short one.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|err| ConfigError(format!("cluster.token_file {}: {err}", path.display())))?;
        Self::new(text.lines().next().unwrap_or("").trim()).map_err(|ConfigError(why)| {
            ConfigError(format!("cluster.token_file {}: {why}", path.display()))
        })
    }

    pub fn new(token: &str) -> Result<Self, ConfigError> {
        if token.len() < 16 {
            return Err(ConfigError(
                "the node token must be at least 16 characters (`kiln auth new-token` makes one)"
                    .to_string(),
            ));
        }
        Ok(NodeCredential {
            token: token.to_string(),
            hash: Sha256::digest(token.as_bytes()).into(),
        })
    }

    /// The `Authorization` header a node sends.
    pub fn header(&self) -> String {
        format!("Bearer {}", self.token)
    }

    /// Whether an `Authorization` header presents this credential.
    pub fn verify(&self, authorization: Option<&[u8]>) -> bool {
        let Some(token) = authorization
            .and_then(|header| std::str::from_utf8(header).ok())
            .and_then(|header| header.trim().split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
        else {
            return false;
        };
        let hash: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        bool::from(self.hash.ct_eq(&hash))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_node_token_verifies() {
        let node = NodeCredential::new("a-node-secret-of-32-characters!!").unwrap();
        assert!(node.verify(Some(node.header().as_bytes())));
        assert!(node.verify(Some(b"bearer  a-node-secret-of-32-characters!! ")));
        assert!(!node.verify(Some(b"Bearer a-node-secret-of-32-characters!")));
        assert!(!node.verify(Some(b"Basic a-node-secret-of-32-characters!!")));
        assert!(!node.verify(None));
        assert!(NodeCredential::new("short").is_err());
        assert!(!format!("{node:?}").contains("secret"));
    }
}
