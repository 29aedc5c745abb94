//! blazesym on a thread of its own: its symbolizer keeps what it parsed of each file in
//! cells that are not `Send`, so one thread owns it and answers requests in turn. Files
//! leave its cache when they leave the node's disk cache ([`Resolver::evict`]), which is
//! what bounds its memory: it holds parsed tables of the files on disk, no more.

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
        reply: tokio::sync::oneshot::Sender<Vec<Vec<Frame>>>,
    },
    Evict(PathBuf),
}

#[derive(Clone)]
pub(crate) struct Resolver {
    jobs: mpsc::Sender<Job>,
}

impl Resolver {
    pub(crate) fn start() -> std::io::Result<Resolver> {
        let (jobs, receiver) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("kiln-symbolize".into())
            .spawn(move || run(receiver))?;
        Ok(Resolver { jobs })
    }

    /// The frames at each virtual address of the file at `path`, innermost (inlined) first
    /// as pprof lists them; none where the file does not name the address.
    pub(crate) async fn resolve(
        &self,
        path: PathBuf,
        offsets: Vec<u64>,
        go: bool,
    ) -> Vec<Vec<Frame>> {
        let count = offsets.len();
        let (reply, answer) = tokio::sync::oneshot::channel();
        if self
            .jobs
            .send(Job::Resolve {
                path,
                offsets,
                go,
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

fn run(jobs: mpsc::Receiver<Job>) {
    let mut symbolizer = symbolizer();
    while let Ok(job) = jobs.recv() {
        match job {
            Job::Resolve {
                path,
                offsets,
                go,
                reply,
            } => {
                let frames =
                    resolve_guarded(&symbolizer, path, &offsets, go).unwrap_or_else(|| {
                        // What it held may be half-updated.
                        symbolizer = self::symbolizer();
                        vec![Vec::new(); offsets.len()]
                    });
                let _ = reply.send(frames);
            }
            Job::Evict(path) => {
                let evict = blazesym::symbolize::evict::Evict::Elf(
                    blazesym::symbolize::evict::Elf::new(path),
                );
                if let Err(err) = symbolizer.evict(&evict) {
                    tracing::debug!(error = %err, "evicting a debug file from the symbolizer");
                }
            }
        }
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
