//! Names for frames that arrived without them.
//!
//! An agent that cannot name a frame (a stripped binary, a container image without
//! debug packages) still sends what identifies it: the mapping's GNU build id and the
//! address, from which the offset in the file follows. Kiln stores that as it is, and
//! this crate names it when a query reads it, from a debug file of that build id:
//!
//! 1. uploaded by the tenant (`kiln debuginfo upload`), kept in the object store under
//!    `debuginfo/<tenant>/<build id>`;
//! 2. else fetched from the configured debuginfod servers the first time a query needs
//!    it ([`debuginfod`]), kept under `debuginfod/<build id>` so that no other node and
//!    no restart fetches it again;
//! 3. else nothing, remembered for `negative_cache_ms` so that each query of an unnamed
//!    binary does not ask again.
//!
//! Every file is checked before it is kept or read ([`elf::inspect`]): an ELF file with
//! the build id it is stored under, sections inside the file, compressed sections that
//! inflate to at most `max_debuginfo_bytes`, DWARF that parses. What fails is refused and
//! counted by reason. Files are read by blazesym (the agent's symbolizer) from this
//! node's disk cache ([`local`]), on a thread of its own ([`resolver`]); names come with
//! inlined calls as frames of their own, files and lines, Rust and C++ demangled.
//!
//! Names are cached per (file, offset) in a bounded memory cache. Callers cache what they
//! make of them (the query path patches each decoded dataset once) and ask
//! [`Symbolizer::generation`] whether a debug file has arrived since.

pub mod config;
pub mod debuginfod;
pub mod elf;
mod go;
mod local;
mod resolver;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kiln_storage::ObjectStorage;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

pub use config::SymbolizationConfig;
pub use elf::{Contents, Refused};
pub use resolver::Frame;

#[derive(Debug, thiserror::Error)]
pub enum SymbolizeError {
    #[error("the symbolizer's cache directory {path}: {source}")]
    CacheDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("starting the symbolizer's thread: {0}")]
    Thread(std::io::Error),
    #[error(transparent)]
    Fetch(#[from] debuginfod::FetchError),
    #[error("{0:?} is not a build id (2 to 64 bytes in lower-case hex)")]
    BuildId(String),
    #[error("the debug file is refused: {0}")]
    Refused(#[from] Refused),
    #[error("object storage: {0}")]
    Storage(#[from] kiln_storage::StorageError),
    #[error("the node's debug file cache: {0}")]
    Io(#[from] std::io::Error),
    #[error("no debug file of build id {0} is held, nor found on a debuginfod server")]
    NotHeld(String),
}

impl SymbolizeError {
    /// Whether the caller sent something wrong (a 4xx), rather than the node failing.
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            SymbolizeError::BuildId(_) | SymbolizeError::Refused(_)
        )
    }

    /// The status an API answers it with.
    pub fn kind(&self) -> kiln_model::ErrorKind {
        use kiln_model::ErrorKind;
        match self {
            SymbolizeError::Refused(Refused::TooLarge { .. } | Refused::Inflates { .. }) => {
                ErrorKind::TooLarge
            }
            SymbolizeError::Refused(Refused::Io(_)) => ErrorKind::Internal,
            SymbolizeError::BuildId(_) | SymbolizeError::Refused(_) => ErrorKind::Malformed,
            SymbolizeError::NotHeld(_) => ErrorKind::NotFound,
            SymbolizeError::Storage(err) => err.kind(),
            SymbolizeError::Fetch(_) => ErrorKind::Unavailable,
            SymbolizeError::CacheDir { .. } | SymbolizeError::Thread(_) | SymbolizeError::Io(_) => {
                ErrorKind::Internal
            }
        }
    }
}

/// Where a held debug file came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    Upload,
    Debuginfod,
}

#[derive(Clone)]
pub struct Symbolizer {
    inner: Arc<Inner>,
}

struct Inner {
    storage: ObjectStorage,
    local: local::LocalFiles,
    resolver: resolver::Resolver,
    debuginfod: Option<debuginfod::Debuginfod>,
    config: SymbolizationConfig,
    /// What each local file holds, from its inspection.
    contents: Mutex<HashMap<String, (Contents, Origin)>>,
    /// (tenant, build id) found nowhere, until when.
    missing: Mutex<HashMap<TenantBuildId, Instant>>,
    /// One lookup per (tenant, build id) at a time: queries that need the same file at
    /// once wait for one download.
    lookups: Mutex<HashMap<TenantBuildId, Arc<tokio::sync::Mutex<()>>>>,
    /// Each tenant's debuginfod fetches at once.
    fetches: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
    names: quick_cache::sync::Cache<(Arc<str>, u64), Arc<[Frame]>, FrameBytes>,
    generation: AtomicU64,
    metrics: Metrics,
}

type TenantBuildId = (String, String);

#[derive(Clone)]
struct FrameBytes;

impl quick_cache::Weighter<(Arc<str>, u64), Arc<[Frame]>> for FrameBytes {
    fn weight(&self, _key: &(Arc<str>, u64), frames: &Arc<[Frame]>) -> u64 {
        64 + frames
            .iter()
            .map(|f| 48 + f.name.len() + f.file.len())
            .sum::<usize>() as u64
    }
}

/// Memory for names of addresses at most, kept apart from the files' parsed tables.
const NAMES_BYTES: u64 = 64 << 20;

/// Of `symbolization.memory_bytes`, the names cache's part: an eighth, at most
/// [`NAMES_BYTES`]; the rest is the parsed files'.
fn names_bytes(memory_bytes: u64) -> u64 {
    (memory_bytes / 8).clamp(1 << 20, NAMES_BYTES)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Default)]
struct Metrics {
    debug_files: Family<SourceLabels, Counter>,
    refused: Family<ReasonLabels, Counter>,
    addresses: Family<ResultLabels, Counter>,
    cache_bytes: Gauge,
    held: resolver::Held,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Symbolizer {
    /// A symbolizer keeping debug files in `storage` and its copies under `cache_dir`
    /// (emptied now: see [`local`]).
    pub fn new(
        storage: ObjectStorage,
        cache_dir: PathBuf,
        config: SymbolizationConfig,
    ) -> Result<Symbolizer, SymbolizeError> {
        let local =
            local::LocalFiles::open(cache_dir.clone(), config.cache_bytes).map_err(|source| {
                SymbolizeError::CacheDir {
                    path: cache_dir,
                    source,
                }
            })?;
        let debuginfod = if config.debuginfod_urls.is_empty() {
            None
        } else {
            Some(debuginfod::Debuginfod::new(
                &config.debuginfod_urls,
                Duration::from_millis(config.fetch_timeout_ms.max(1)),
                config.max_debuginfo_bytes,
            )?)
        };
        let names_bytes = names_bytes(config.memory_bytes);
        let metrics = Metrics::default();
        let resolver = resolver::Resolver::start(
            config.memory_bytes.saturating_sub(names_bytes),
            metrics.held.clone(),
        )
        .map_err(SymbolizeError::Thread)?;
        Ok(Symbolizer {
            inner: Arc::new(Inner {
                storage,
                local,
                resolver,
                debuginfod,
                names: quick_cache::sync::Cache::with_weighter(
                    (names_bytes / 256) as usize,
                    names_bytes,
                    FrameBytes,
                ),
                config,
                contents: Mutex::default(),
                missing: Mutex::default(),
                lookups: Mutex::default(),
                fetches: Mutex::default(),
                generation: AtomicU64::new(0),
                metrics,
            }),
        })
    }

    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        let metrics = &self.inner.metrics;
        registry.register(
            "kiln_symbolization_debug_files",
            "Debug files looked for, by where (object_store, debuginfod, upload) and result",
            metrics.debug_files.clone(),
        );
        registry.register(
            "kiln_symbolization_refused",
            "Debug files refused, by reason",
            metrics.refused.clone(),
        );
        registry.register(
            "kiln_symbolization_addresses",
            "Addresses looked up in debug files, by result (named, unknown)",
            metrics.addresses.clone(),
        );
        registry.register(
            "kiln_symbolization_cache_bytes",
            "Bytes of debug files on this node's disk cache",
            metrics.cache_bytes.clone(),
        );
        registry.register(
            "kiln_symbolization_parsed_bytes",
            "Debug files parsed and held in memory, by the bytes of DWARF and symbol tables they parse (within symbolization.memory_bytes)",
            metrics.held.bytes.clone(),
        );
        registry.register(
            "kiln_symbolization_parsed_evictions",
            "Parsed debug files dropped from memory for symbolization.memory_bytes, to be parsed again when next read",
            metrics.held.evictions.clone(),
        );
    }

    /// Changes whenever a debug file arrives: names cached before may now be found.
    pub fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    /// How long a build id found nowhere is not looked for again.
    pub fn retry_after(&self) -> Duration {
        Duration::from_millis(self.inner.config.negative_cache_ms)
    }

    /// The largest debug file taken (`max_debuginfo_bytes`).
    pub fn max_bytes(&self) -> u64 {
        self.inner.config.max_debuginfo_bytes
    }

    /// A path on the cache's disk to write an upload to before [`Symbolizer::upload`].
    pub fn incoming(&self) -> PathBuf {
        self.inner.local.temporary()
    }

    /// The frames at each of `addresses` of a process that mapped the text of the
    /// binary `build_id` at `start..limit`, innermost first (empty where the file does not
    /// name it), or `None` when no debug file of that build id is held or can be found now.
    pub async fn symbolize(
        &self,
        tenant: &str,
        build_id: &str,
        (start, limit): (u64, u64),
        addresses: &[u64],
    ) -> Option<Vec<Arc<[Frame]>>> {
        let (name, path) = self.locate(tenant, build_id).await?;
        let contents = lock(&self.inner.contents)
            .get(&name)
            .map(|(c, _)| c.clone())?;
        let vaddrs: Vec<Option<u64>> = addresses
            .iter()
            .map(|a| contents.virtual_address(start, limit, *a))
            .collect();
        let name: Arc<str> = name.into();
        let mut answers: Vec<Option<Arc<[Frame]>>> = vaddrs
            .iter()
            .map(|vaddr| match vaddr {
                Some(vaddr) => self.inner.names.get(&(name.clone(), *vaddr)),
                None => Some(Arc::from(Vec::new())),
            })
            .collect();
        let asked: Vec<u64> = vaddrs
            .iter()
            .zip(&answers)
            .filter(|(_, a)| a.is_none())
            .filter_map(|(v, _)| *v)
            .collect();
        if !asked.is_empty() {
            let go = go::only_table(&contents);
            let resolved = self
                .inner
                .resolver
                .resolve(path, asked.clone(), go, contents.weight())
                .await;
            let mut resolved = asked.into_iter().zip(resolved);
            for answer in answers.iter_mut().filter(|a| a.is_none()) {
                let Some((vaddr, frames)) = resolved.next() else {
                    break;
                };
                let result = if frames.is_empty() {
                    "unknown"
                } else {
                    "named"
                };
                self.inner
                    .metrics
                    .addresses
                    .get_or_create(&ResultLabels { result })
                    .inc();
                let frames: Arc<[Frame]> = frames.into();
                self.inner
                    .names
                    .insert((name.clone(), vaddr), frames.clone());
                *answer = Some(frames);
            }
        }
        Some(
            answers
                .into_iter()
                .map(|a| a.unwrap_or_else(|| Arc::from(Vec::new())))
                .collect(),
        )
    }

    /// Takes the file at `file` (written to [`Symbolizer::incoming`]) as the tenant's
    /// debug file of the build id it holds, which must be `expected` when given: checked,
    /// stored in the object store, and read by queries from now on.
    pub async fn upload(
        &self,
        tenant: &str,
        file: &Path,
        expected: Option<&str>,
    ) -> Result<Contents, SymbolizeError> {
        let checked = self.checked(file, expected, "upload").await;
        let contents = match checked {
            Ok(contents) => contents,
            Err(err) => {
                let _ = std::fs::remove_file(file);
                return Err(err);
            }
        };
        let key = upload_key(tenant, &contents.build_id);
        let stored = self.inner.storage.put_file(&key, file).await;
        if let Err(err) = stored {
            let _ = std::fs::remove_file(file);
            return Err(err.into());
        }
        let name = upload_name(tenant, &contents.build_id);
        self.keep(&name, file, contents.clone(), Origin::Upload)?;
        lock(&self.inner.missing).remove(&(tenant.to_string(), contents.build_id.clone()));
        self.count("upload", "found");
        tracing::info!(tenant, build_id = %contents.build_id, bytes = contents.bytes, "debug file uploaded");
        Ok(contents)
    }

    /// What is held for `build_id`: its contents and where it came from, looking in the
    /// object store (and on debuginfod) as a query would.
    pub async fn status(
        &self,
        tenant: &str,
        build_id: &str,
    ) -> Result<Option<(Contents, Origin)>, SymbolizeError> {
        if !elf::valid_build_id(build_id) {
            return Err(SymbolizeError::BuildId(build_id.to_string()));
        }
        let Some((name, _)) = self.locate(tenant, build_id).await else {
            return Ok(None);
        };
        Ok(lock(&self.inner.contents).get(&name).cloned())
    }

    /// The local copy of `build_id`'s debug file: the tenant's upload, else the fetched
    /// one, downloaded or fetched when not on this node.
    async fn locate(&self, tenant: &str, build_id: &str) -> Option<(String, PathBuf)> {
        if !elf::valid_build_id(build_id) {
            return None;
        }
        let uploaded = upload_name(tenant, build_id);
        let fetched = fetched_name(build_id);
        if let Some(found) = self.held(&uploaded, &fetched) {
            return Some(found);
        }
        let key = (tenant.to_string(), build_id.to_string());
        if self.known_missing(&key) {
            return None;
        }
        let turn = lock(&self.inner.lookups)
            .entry(key.clone())
            .or_default()
            .clone();
        let found = {
            let _turn = turn.lock().await;
            // Another lookup may have brought it, or found it missing, while this waited.
            if let Some(found) = self.held(&uploaded, &fetched) {
                Some(found)
            } else if self.known_missing(&key) {
                None
            } else {
                let found = self.find(tenant, build_id).await;
                if found.is_none() {
                    lock(&self.inner.missing)
                        .insert(key.clone(), Instant::now() + self.retry_after());
                }
                found
            }
        };
        let mut lookups = lock(&self.inner.lookups);
        if lookups.get(&key).is_some_and(|t| Arc::strong_count(t) <= 2) {
            lookups.remove(&key);
        }
        found
    }

    fn held(&self, uploaded: &str, fetched: &str) -> Option<(String, PathBuf)> {
        [uploaded, fetched]
            .into_iter()
            .find_map(|name| Some((name.to_string(), self.inner.local.get(name)?)))
    }

    fn known_missing(&self, key: &(String, String)) -> bool {
        let mut missing = lock(&self.inner.missing);
        match missing.get(key) {
            Some(until) if *until > Instant::now() => true,
            Some(_) => {
                missing.remove(key);
                false
            }
            None => false,
        }
    }

    async fn find(&self, tenant: &str, build_id: &str) -> Option<(String, PathBuf)> {
        let stored = [
            (
                upload_name(tenant, build_id),
                upload_key(tenant, build_id),
                Origin::Upload,
            ),
            (
                fetched_name(build_id),
                fetched_key(build_id),
                Origin::Debuginfod,
            ),
        ];
        for (name, key, origin) in stored {
            let incoming = self.incoming();
            let got = self
                .inner
                .storage
                .get_to_file(&key, &incoming, self.max_bytes())
                .await;
            match got {
                Ok(Some(_)) => match self
                    .checked(&incoming, Some(build_id), "object_store")
                    .await
                {
                    Ok(contents) => match self.keep(&name, &incoming, contents, origin) {
                        Ok(path) => {
                            self.count("object_store", "found");
                            return Some((name, path));
                        }
                        Err(err) => {
                            tracing::warn!(error = %err, key, "keeping a debug file");
                            self.count("object_store", "error");
                        }
                    },
                    Err(err) => tracing::warn!(error = %err, key, "a stored debug file is refused"),
                },
                Ok(None) => {}
                Err(err) => {
                    tracing::warn!(error = %err, key, "reading a stored debug file");
                    self.count("object_store", "error");
                }
            }
            let _ = std::fs::remove_file(&incoming);
        }
        self.count("object_store", "not_found");
        self.fetch(tenant, build_id).await
    }

    async fn fetch(&self, tenant: &str, build_id: &str) -> Option<(String, PathBuf)> {
        let debuginfod = self.inner.debuginfod.as_ref()?;
        let permits = lock(&self.inner.fetches)
            .entry(tenant.to_string())
            .or_insert_with(|| {
                Arc::new(tokio::sync::Semaphore::new(
                    self.inner.config.max_concurrent_fetches.max(1),
                ))
            })
            .clone();
        let _permit = permits.acquire_owned().await.ok()?;
        let incoming = self.incoming();
        let fetched = debuginfod.fetch(build_id, &incoming).await;
        let result = match fetched {
            Ok(debuginfod::Fetched::Found { url, bytes }) => {
                tracing::info!(build_id, url, bytes, "debug file fetched from debuginfod");
                match self.checked(&incoming, Some(build_id), "debuginfod").await {
                    Ok(contents) => {
                        let key = fetched_key(build_id);
                        match self.inner.storage.put_file(&key, &incoming).await {
                            Ok(()) => {
                                let name = fetched_name(build_id);
                                match self.keep(&name, &incoming, contents, Origin::Debuginfod) {
                                    Ok(path) => {
                                        self.count("debuginfod", "found");
                                        Some((name, path))
                                    }
                                    Err(err) => {
                                        tracing::warn!(error = %err, "keeping a fetched debug file");
                                        None
                                    }
                                }
                            }
                            Err(err) => {
                                tracing::warn!(error = %err, key, "storing a fetched debug file");
                                self.count("debuginfod", "error");
                                None
                            }
                        }
                    }
                    Err(_) => None,
                }
            }
            Ok(debuginfod::Fetched::NotFound) => {
                self.count("debuginfod", "not_found");
                None
            }
            Err(_) => {
                self.count("debuginfod", "error");
                None
            }
        };
        if result.is_none() {
            let _ = std::fs::remove_file(&incoming);
        }
        result
    }

    /// [`elf::inspect`] off the runtime, with the build id checked and refusals counted.
    async fn checked(
        &self,
        file: &Path,
        expected: Option<&str>,
        source: &'static str,
    ) -> Result<Contents, SymbolizeError> {
        if let Some(expected) = expected {
            if !elf::valid_build_id(expected) {
                return Err(SymbolizeError::BuildId(expected.to_string()));
            }
        }
        let path = file.to_path_buf();
        let limit = self.max_bytes();
        let inspected = tokio::task::spawn_blocking(move || elf::inspect(&path, limit))
            .await
            .map_err(|err| SymbolizeError::Io(std::io::Error::other(err)))?;
        let inspected = inspected.and_then(|contents| match expected {
            Some(expected) if contents.build_id != expected => Err(Refused::OtherBuildId {
                expected: expected.to_string(),
                found: contents.build_id,
            }),
            _ => Ok(contents),
        });
        inspected.map_err(|refused| {
            tracing::warn!(reason = refused.reason(), error = %refused, source, "debug file refused");
            self.inner
                .metrics
                .refused
                .get_or_create(&ReasonLabels {
                    reason: refused.reason(),
                })
                .inc();
            self.count(source, "refused");
            SymbolizeError::Refused(refused)
        })
    }

    /// Moves a checked file into the disk cache under `name`, and makes it the one read.
    fn keep(
        &self,
        name: &str,
        file: &Path,
        contents: Contents,
        origin: Origin,
    ) -> Result<PathBuf, SymbolizeError> {
        let replaced = lock(&self.inner.contents)
            .insert(name.to_string(), (contents, origin))
            .is_some();
        let evicted = self.inner.local.insert(name, file)?;
        let path =
            self.inner.local.get(name).ok_or_else(|| {
                std::io::Error::other("a debug file left the cache as it came in")
            })?;
        if replaced {
            // Another file under the same name: what was read of the old one is stale.
            self.inner.resolver.evict(path.clone());
            self.inner.names.clear();
        }
        let mut contents = lock(&self.inner.contents);
        for gone in evicted {
            if let Some(name) = gone.file_name().and_then(|n| n.to_str()) {
                contents.remove(name);
            }
            self.inner.resolver.evict(gone);
        }
        self.inner
            .metrics
            .cache_bytes
            .set(i64::try_from(self.inner.local.bytes()).unwrap_or(i64::MAX));
        self.inner.generation.fetch_add(1, Ordering::AcqRel);
        Ok(path)
    }

    fn count(&self, source: &'static str, result: &'static str) {
        self.inner
            .metrics
            .debug_files
            .get_or_create(&SourceLabels { source, result })
            .inc();
    }
}

impl kiln_model::symbols::NameFrames for Symbolizer {
    fn names<'a>(
        &'a self,
        tenant: &'a str,
        build_id: &'a str,
        mapping: (u64, u64),
        addresses: &'a [u64],
    ) -> kiln_model::symbols::Names<'a> {
        Box::pin(self.symbolize(tenant, build_id, mapping, addresses))
    }

    fn generation(&self) -> u64 {
        Symbolizer::generation(self)
    }

    fn retry_after(&self) -> Duration {
        Symbolizer::retry_after(self)
    }
}

/// Checks the file at `path` and names `addresses` (in its own address space) from it, at
/// once on this thread: what an upload and a query do, for the fuzz target and benches.
pub fn read_debug_file(
    path: &Path,
    limit: u64,
    addresses: &[u64],
) -> Result<(Contents, Vec<Vec<Frame>>), Refused> {
    let contents = elf::inspect(path, limit)?;
    let frames = resolver::resolve_once(path.to_path_buf(), addresses, go::only_table(&contents));
    Ok((contents, frames))
}

/// Object key of a tenant's uploaded debug file (docs/FORMAT.md, section 6).
pub fn upload_key(tenant: &str, build_id: &str) -> String {
    format!("debuginfo/{tenant}/{build_id}")
}

/// Object key of a debug file fetched from debuginfod: public, shared by tenants.
pub fn fetched_key(build_id: &str) -> String {
    format!("debuginfod/{build_id}")
}

fn upload_name(tenant: &str, build_id: &str) -> String {
    format!("u.{tenant}.{build_id}")
}

fn fetched_name(build_id: &str) -> String {
    format!("d.{build_id}")
}
