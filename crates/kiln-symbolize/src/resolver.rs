//! blazesym on a thread of its own: its symbolizer keeps what it parsed of each file in
//! cells that are not `Send`, so one thread owns it and answers requests in turn.
//!
//! What it holds is bounded twice. A file leaves it when it leaves the node's disk cache
//! ([`Resolver::evict`]), and the files it has parsed weigh at most a budget
//! (`symbolization.memory_bytes` less the names cache): past it, the least recently read
//! leave first. blazesym does not say what it holds, so a file weighs the tables it
//! parses ([`crate::Contents::weight`]: DWARF and symbol sections, compressed ones as
//! inflated), against which its memory was measured at about 0.9 byte per byte
//! (docs/benchmarks.md), so the weight errs a little high. A file heavier than the
//! whole budget is parsed for the request that needs it and dropped after it. Go tables
//! ([`crate::go`]) are read per request and kept by nobody, so they weigh nothing here.

use std::path::PathBuf;
use std::sync::mpsc;

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{CodeInfo, Input, Symbolized, Symbolizer};

pub use kiln_model::symbols::Frame;

enum Job {
    Resolve {
        path: PathBuf,
        offsets: Vec<u64>,
        /// Named from `.gopclntab` ([`crate::go`]) rather than by blazesym.
        go: bool,
        /// What parsing the file is taken to cost in memory ([`crate::Contents::weight`]).
        weight: u64,
        reply: tokio::sync::oneshot::Sender<Vec<Vec<Frame>>>,
    },
    Evict(PathBuf),
}

#[derive(Clone)]
pub(crate) struct Resolver {
    jobs: mpsc::Sender<Job>,
}

/// What the resolver's thread reports of its memory.
#[derive(Clone, Default)]
pub(crate) struct Held {
    /// The weight of the files parsed and held now.
    pub bytes: prometheus_client::metrics::gauge::Gauge,
    /// Files dropped from memory for the budget (not for leaving the disk).
    pub evictions: prometheus_client::metrics::counter::Counter,
}

impl Resolver {
    pub(crate) fn start(budget: u64, held: Held) -> std::io::Result<Resolver> {
        let (jobs, receiver) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("kiln-symbolize".into())
            .spawn(move || run(receiver, budget, held))?;
        Ok(Resolver { jobs })
    }

    /// The frames at each virtual address of the file at `path`, innermost (inlined) first
    /// as pprof lists them; none where the file does not name the address.
    pub(crate) async fn resolve(
        &self,
        path: PathBuf,
        offsets: Vec<u64>,
        go: bool,
        weight: u64,
    ) -> Vec<Vec<Frame>> {
        let count = offsets.len();
        let (reply, answer) = tokio::sync::oneshot::channel();
        if self
            .jobs
            .send(Job::Resolve {
                path,
                offsets,
                go,
                weight,
                reply,
            })
            .is_err()
        {
            return vec![Vec::new(); count];
        }
        answer.await.unwrap_or_else(|_| vec![Vec::new(); count])
    }

    pub(crate) fn evict(&self, path: PathBuf) {
        let _ = self.jobs.send(Job::Evict(path));
    }
}

fn symbolizer() -> Symbolizer {
    Symbolizer::builder()
        .enable_code_info(true)
        .enable_inlined_fns(true)
        .enable_demangling(true)
        // A debug file is complete in itself: no debug links followed to other files.
        .set_debug_dirs(Some(Vec::<PathBuf>::new()))
        .build()
}

/// [`Resolver::resolve`] on this thread, with a symbolizer of its own.
pub(crate) fn resolve_once(path: PathBuf, addresses: &[u64], go: bool) -> Vec<Vec<Frame>> {
    resolve_guarded(&symbolizer(), path, addresses, go)
        .unwrap_or_else(|| vec![Vec::new(); addresses.len()])
}

/// [`resolve`], or `None` when blazesym panicked. A file that passed [`crate::elf::inspect`]
/// can still trip its checks: in a build with overflow checks, a symbol whose value plus
/// size overflows, or a compressed section's length it asserts (both found by the
/// `debuginfo_read` fuzz target; a release build wraps and skips them). Such a file costs
/// its own names, never the thread.
fn resolve_guarded(
    symbolizer: &Symbolizer,
    path: PathBuf,
    addresses: &[u64],
    go: bool,
) -> Option<Vec<Vec<Frame>>> {
    let shown = path.display().to_string();
    let resolved = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        if go {
            crate::go::resolve(&path, addresses)
        } else {
            resolve(symbolizer, path, addresses)
        }
    }));
    if resolved.is_err() {
        tracing::error!(file = %shown, "the symbolizer panicked on a debug file; its addresses stay unnamed");
    }
    resolved.ok()
}

fn run(jobs: mpsc::Receiver<Job>, budget: u64, held: Held) {
    let mut symbolizer = symbolizer();
    let mut parsed = Parsed::default();
    while let Ok(job) = jobs.recv() {
        match job {
            Job::Resolve {
                path,
                offsets,
                go,
                weight,
                reply,
            } => {
                if !go {
                    for gone in parsed.read(&path, weight, budget) {
                        evict(&mut symbolizer, gone);
                        held.evictions.inc();
                    }
                }
                let frames = resolve_guarded(&symbolizer, path.clone(), &offsets, go)
                    .unwrap_or_else(|| {
                        // What it held may be half-updated.
                        symbolizer = self::symbolizer();
                        parsed = Parsed::default();
                        vec![Vec::new(); offsets.len()]
                    });
                if !go && weight > budget && parsed.forget(&path) {
                    evict(&mut symbolizer, path);
                    held.evictions.inc();
                }
                // Before the answer, so that who reads the gauge after it sees this job.
                held.bytes
                    .set(i64::try_from(parsed.bytes).unwrap_or(i64::MAX));
                let _ = reply.send(frames);
            }
            Job::Evict(path) => {
                parsed.forget(&path);
                evict(&mut symbolizer, path);
                held.bytes
                    .set(i64::try_from(parsed.bytes).unwrap_or(i64::MAX));
            }
        }
    }
}

fn evict(symbolizer: &mut Symbolizer, path: PathBuf) {
    let evict = blazesym::symbolize::evict::Evict::Elf(blazesym::symbolize::evict::Elf::new(path));
    if let Err(err) = symbolizer.evict(&evict) {
        tracing::debug!(error = %err, "evicting a debug file from the symbolizer");
    }
}

/// The files blazesym has parsed, least recently read first, with their weights. A
/// node reads a handful of debug files, so a list is enough.
#[derive(Default)]
struct Parsed {
    files: Vec<(PathBuf, u64)>,
    bytes: u64,
}

impl Parsed {
    /// `path` is about to be read: it becomes the most recent, and the files to drop so
    /// that all fit in `budget` are returned (never `path` itself).
    fn read(&mut self, path: &PathBuf, weight: u64, budget: u64) -> Vec<PathBuf> {
        match self.files.iter().position(|(p, _)| p == path) {
            Some(at) => {
                let file = self.files.remove(at);
                self.files.push(file);
            }
            None => {
                self.files.push((path.clone(), weight));
                self.bytes += weight;
            }
        }
        let mut gone = Vec::new();
        while self.bytes > budget && self.files.len() > 1 {
            let (file, weight) = self.files.remove(0);
            self.bytes -= weight;
            gone.push(file);
        }
        gone
    }

    /// Whether `path` was held; it is not now.
    fn forget(&mut self, path: &PathBuf) -> bool {
        let Some(at) = self.files.iter().position(|(p, _)| p == path) else {
            return false;
        };
        let (_, weight) = self.files.remove(at);
        self.bytes -= weight;
        true
    }
}

fn resolve(symbolizer: &Symbolizer, path: PathBuf, offsets: &[u64]) -> Vec<Vec<Frame>> {
    let source = Source::Elf(Elf::new(path));
    let results = match symbolizer.symbolize(&source, Input::VirtOffset(offsets)) {
        Ok(results) => results,
        Err(err) => {
            tracing::warn!(error = %err, "a debug file did not symbolize");
            return vec![Vec::new(); offsets.len()];
        }
    };
    results
        .into_iter()
        .map(|result| match result {
            Symbolized::Sym(sym) => {
                let mut frames = Vec::with_capacity(sym.inlined.len() + 1);
                for inlined in sym.inlined.iter().rev() {
                    let (file, line) = file_line(inlined.code_info.as_ref());
                    frames.push(Frame {
                        name: inlined.name.to_string(),
                        file,
                        line,
                    });
                }
                let (file, line) = file_line(sym.code_info.as_deref());
                frames.push(Frame {
                    name: sym.name.to_string(),
                    file,
                    line,
                });
                frames
            }
            Symbolized::Unknown(_) => Vec::new(),
        })
        .collect()
}

fn file_line(info: Option<&CodeInfo<'_>>) -> (String, i64) {
    info.map(|info| {
        let file = match &info.dir {
            Some(dir) if !dir.as_os_str().is_empty() => {
                dir.join(&*info.file).to_string_lossy().into_owned()
            }
            _ => info.file.to_string_lossy().into_owned(),
        };
        (file, i64::from(info.line.unwrap_or(0)))
    })
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_read_leave_first_and_the_one_read_stays() {
        let path = |name: &str| PathBuf::from(name);
        let mut parsed = Parsed::default();
        assert!(parsed.read(&path("a"), 40, 100).is_empty());
        assert!(parsed.read(&path("b"), 40, 100).is_empty());
        // a is read again: b is now the oldest.
        assert!(parsed.read(&path("a"), 40, 100).is_empty());
        assert_eq!(parsed.read(&path("c"), 40, 100), [path("b")]);
        assert_eq!(parsed.bytes, 80);
        // Heavier than the budget alone: everything else goes, it stays while read.
        assert_eq!(parsed.read(&path("d"), 150, 100), [path("a"), path("c")]);
        assert_eq!(parsed.bytes, 150);
        assert!(parsed.forget(&path("d")));
        assert!(!parsed.forget(&path("d")));
        assert_eq!(parsed.bytes, 0);
    }
}
