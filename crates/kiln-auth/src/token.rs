//! Tokens: making them, hashing them, and reading them from an `Authorization` header.

use base64::Engine;
use rand::TryRngCore;
use sha2::{Digest, Sha256};

use crate::AuthError;

/// A fresh token: 256 bits from the operating system's generator, base64url, behind a
/// `kiln_` prefix that secret scanners can match.
pub fn new_token() -> Result<String, rand::rand_core::OsError> {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.try_fill_bytes(&mut bytes)?;
    Ok(format!(
        "kiln_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    ))
}

/// The hex SHA-256 of a token: what the config stores.
pub fn sha256_hex(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// What an `Authorization` header presents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    Bearer(String),
    /// RFC 7617: the user name (a tenant id here) and the password (the token).
    Basic {
        user: String,
        password: String,
    },
}

impl Credentials {
    pub fn parse(header: Option<&[u8]>) -> Result<Credentials, AuthError> {
        let header = header.ok_or(AuthError::Missing)?;
        let header = std::str::from_utf8(header)
            .map_err(|_| AuthError::Malformed("not valid UTF-8"))?
            .trim();
        let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
        let rest = rest.trim();
        if scheme.eq_ignore_ascii_case("bearer") {
            if rest.is_empty() {
                return Err(AuthError::Malformed("an empty bearer token"));
            }
            return Ok(Credentials::Bearer(rest.to_string()));
        }
        if scheme.eq_ignore_ascii_case("basic") {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(rest)
                .map_err(|_| AuthError::Malformed("basic credentials are not base64"))?;
            let decoded = String::from_utf8(decoded)
                .map_err(|_| AuthError::Malformed("basic credentials are not UTF-8"))?;
            let (user, password) = decoded
                .split_once(':')
                .ok_or(AuthError::Malformed("basic credentials have no ':'"))?;
            if password.is_empty() {
                return Err(AuthError::Malformed(
                    "basic auth needs the token as password",
                ));
            }
            return Ok(Credentials::Basic {
                user: user.to_string(),
                password: password.to_string(),
            });
        }
        Err(AuthError::Malformed("use the Bearer or Basic scheme"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_fresh_and_long() {
        let (a, b) = (new_token().expect("os rng"), new_token().expect("os rng"));
        assert_ne!(a, b);
        assert!(a.starts_with("kiln_") && a.len() == 5 + 43, "{a}");
        // The SHA-256 of "abc" (FIPS 180-2, appendix B.1).
        assert_eq!(
            sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn headers_parse_as_their_scheme_says() {
        assert_eq!(
            Credentials::parse(Some(b"bearer  kiln_x ")),
            Ok(Credentials::Bearer("kiln_x".into()))
        );
        // "team-a:tok:en" — the password may hold colons.
        assert_eq!(
            Credentials::parse(Some(b"Basic dGVhbS1hOnRvazplbg==")),
            Ok(Credentials::Basic {
                user: "team-a".into(),
                password: "tok:en".into()
            })
        );
        assert_eq!(Credentials::parse(None), Err(AuthError::Missing));
        for bad in [
            &b"Bearer"[..],
            b"Basic !!",
            b"Basic dGVhbS1h",
            b"Token x",
            b"\xff",
        ] {
            assert!(
                matches!(Credentials::parse(Some(bad)), Err(AuthError::Malformed(_))),
                "{bad:?}"
            );
        }
    }
}
