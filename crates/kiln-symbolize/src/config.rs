//! The `symbolization` section of a node's config.

use serde::{Deserialize, Deserializer, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SymbolizationConfig {
    /// debuginfod servers asked, in order, for a build id nobody uploaded (also
    /// `--debuginfod-url` and `DEBUGINFOD_URLS`, space-separated as elfutils reads it).
    pub debuginfod_urls: Vec<String>,
    /// Disk for this node's copies of debug files (the object store keeps them all);
    /// the least recently used go past it. `1GiB`, `512MiB` or a number of bytes
    /// ([`kiln_model::size::parse_bytes`]).
    #[serde(deserialize_with = "bytes")]
    pub cache_bytes: u64,
    /// Memory for what is read of debug files: their parsed symbol and DWARF tables (about
    /// 0.9 byte per byte of DWARF, docs/benchmarks.md), weighed by those tables, and the
    /// names found (an eighth of it, at most 64 MiB). The least recently read file leaves
    /// memory first and is parsed again when next needed; a file larger than this alone is
    /// parsed for the query that needs it and dropped after it. `512MiB` or a number of
    /// bytes.
    #[serde(deserialize_with = "bytes")]
    pub memory_bytes: u64,
    /// How long a build id found nowhere is not looked for again, in milliseconds. An
    /// upload to this node ends it at once; other nodes see the upload after at most this.
    pub negative_cache_ms: u64,
    /// The largest debug file taken, uploaded or fetched, and the most its compressed
    /// sections may inflate to.
    #[serde(deserialize_with = "bytes")]
    pub max_debuginfo_bytes: u64,
    /// The longest one debuginfod fetch may take, in milliseconds.
    pub fetch_timeout_ms: u64,
    /// debuginfod fetches one tenant's queries may run at once.
    pub max_concurrent_fetches: usize,
}

impl Default for SymbolizationConfig {
    fn default() -> Self {
        SymbolizationConfig {
            debuginfod_urls: Vec::new(),
            cache_bytes: 1 << 30,
            memory_bytes: 512 << 20,
            negative_cache_ms: 300_000,
            max_debuginfo_bytes: 2 << 30,
            fetch_timeout_ms: 60_000,
            max_concurrent_fetches: 4,
        }
    }
}

fn bytes<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Value {
        Number(u64),
        Text(String),
    }
    match Value::deserialize(deserializer)? {
        Value::Number(n) => Ok(n),
        Value::Text(text) => kiln_model::size::parse_bytes(&text).map_err(serde::de::Error::custom),
    }
}
