//! What a process runs (`--target`): `all`, today's single-node behaviour, or any
//! comma-separated set of roles, each of which any number of nodes may share.

/// Every role, in the order they are listed.
pub const ROLES: [&str; 5] = ["ingest", "query", "compact", "scrape", "rules"];

/// The roles this process runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roles(Vec<&'static str>);

impl Roles {
    pub fn all() -> Self {
        Roles(ROLES.to_vec())
    }

    /// `all`, or a comma-separated list of [`ROLES`].
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut roles = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part == "all" {
                return Ok(Roles::all());
            }
            let Some(role) = ROLES.iter().find(|role| **role == part) else {
                return Err(format!(
                    "unknown role {part:?} in target {text:?}: expected all, or a comma-separated list of {}",
                    ROLES.join(", ")
                ));
            };
            roles.push(*role);
        }
        if roles.is_empty() {
            return Err(format!(
                "target is empty: expected all, or a comma-separated list of {}",
                ROLES.join(", ")
            ));
        }
        roles.sort_by_key(|role| ROLES.iter().position(|r| r == role));
        roles.dedup();
        Ok(Roles(roles))
    }

    pub fn has(&self, role: &str) -> bool {
        self.0.contains(&role)
    }

    pub fn names(&self) -> Vec<String> {
        self.0.iter().map(|role| role.to_string()).collect()
    }
}

impl std::fmt::Display for Roles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_to_roles_in_order_and_unknown_ones_are_refused() {
        assert_eq!(Roles::parse("all").unwrap(), Roles::all());
        assert_eq!(
            Roles::parse("query, ingest,query").unwrap().to_string(),
            "ingest,query"
        );
        assert!(Roles::parse("compact").unwrap().has("compact"));
        assert!(!Roles::parse("compact").unwrap().has("ingest"));
        let err = Roles::parse("ingest,writer").unwrap_err();
        assert!(
            err.contains("\"writer\"") && err.contains("ingest, query, compact, scrape, rules"),
            "{err}"
        );
        assert!(Roles::parse(" , ").is_err());
    }
}
