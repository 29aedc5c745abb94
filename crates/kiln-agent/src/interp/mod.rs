//! Interpreted frames: the functions of a Python, Ruby, Node.js or Java program, named
//! with no change to it (python.rs and ruby.rs hold what differs between the first two;
//! v8.rs and hotspot.rs read Node.js's and Java's from the stack copy instead, see there).
//!
//! A profile of an interpreter's process that shows only the interpreter's own C
//! functions (`_PyEval_EvalFrameDefault` or `vm_exec_core` a thousand times) says nothing
//! of the program.
//! The program's frames live in the interpreter's memory, and they must be read at the
//! moment of the sample: read later, from user space, they describe wherever the thread
//! went since. So the BPF program (src/bpf/interp.bpf.h) reads them in the sample's own
//! context, and sends each as a code object address and an instruction pointer through a
//! BPF ring buffer, stamped with the thread and the time. The sample itself still goes to
//! the perf ring with its stack copy, and its native stack is unwound as before.
//!
//! Here the two meet ([`Interpreters::join`]): by thread, and by time (the perf events
//! run on `CLOCK_MONOTONIC`, as `bpf_ktime_get_ns` does; the BPF program runs just before
//! the kernel writes the sample). Each native frame of the interpreter's loop is replaced
//! by the interpreted frames it was running, innermost first, up to the frame that began
//! that native call ([`merge`]), so a C extension sits under the Python function (or a C
//! method under the Ruby method) that called it, and the interpreter's caller above the
//! outermost one. Interpreted frames are
//! named here, from user space, by reading the code object once (it outlives the
//! sample); they go in the stack as tagged values ([`INTERPRETED`]) into [`Frames`], and
//! the report writes them as functions with a file and a line, no mapping.
//!
//! A process whose interpreter is not known (another version, a build whose symbols are
//! gone) keeps its native stacks, and the reason is counted per binary
//! (`kiln_agent_interpreter_stacks_total`). So is every sample whose interpreter read
//! failed or was not found.

pub mod hotspot;
pub mod memory;
pub mod python;
pub mod ruby;
pub mod v8;

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use crate::procs::{Instance, Process};

/// What the BPF program's `struct interp_proc` holds (interp.bpf.h), laid out as it is:
/// the runtime's root address, its kind and version, and its offsets (`python::Walk`,
/// `ruby::Walk`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcLayout {
    pub runtime: u64,
    pub kind: u32,
    pub version: u32,
    pub walk: [u16; 16],
}

pub use crate::unwind::Loads;

/// A runtime's offsets as the `walk` of [`ProcLayout`], zero-filled.
fn words(fields: &[u16]) -> [u16; 16] {
    let mut words = [0u16; 16];
    for (word, field) in words.iter_mut().zip(fields) {
        *word = *field;
    }
    words
}

// SAFETY: a plain C struct of integers without padding (8 + 4 + 4 + 16 × 2 = 48 bytes, a
// multiple of its alignment), as the BPF program lays it out.
unsafe impl aya::Pod for ProcLayout {}

/// The tag of an interpreted frame in a user stack: user addresses are below 2^63.
pub const INTERPRETED: u64 = 1 << 63;

/// A frame as the BPF program read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawFrame {
    pub code: u64,
    pub instr: u64,
    pub fingerprint: u32,
    /// The first frame of its native call of the interpreter's loop.
    pub entry: bool,
}

/// An interpreter stack read at one sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub pid: u32,
    pub tid: u32,
    pub time: u64,
    pub kind: u32,
    pub status: u16,
    /// Innermost first.
    pub frames: Vec<RawFrame>,
}

pub const STATUS_OK: u16 = 0;
pub const STATUS_NO_THREAD: u16 = 1;
pub const STATUS_READ_FAILED: u16 = 2;
pub const STATUS_TRUNCATED: u16 = 3;

const HEADER_BYTES: usize = 24;
const FRAME_BYTES: usize = 24;
/// `INTERP_MAX_FRAMES` in interp.bpf.h.
pub const MAX_FRAMES: usize = 128;

impl Event {
    /// Decodes `struct interp_event`; `None` when it is shorter than it says.
    pub fn parse(bytes: &[u8]) -> Option<Event> {
        let (u32_at, u64_at) = (|at| u32_at(bytes, at), |at| u64_at(bytes, at));
        let u16_at = |at: usize| -> Option<u16> {
            Some(u16::from_ne_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
        };
        let count = usize::from(u16_at(22)?).min(MAX_FRAMES);
        let frames = (0..count)
            .map(|i| {
                let at = HEADER_BYTES + i * FRAME_BYTES;
                Some(RawFrame {
                    code: u64_at(at)?,
                    instr: u64_at(at + 8)?,
                    fingerprint: u32_at(at + 16)?,
                    entry: u32_at(at + 20)? & 1 == 1,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Event {
            pid: u32_at(0)?,
            tid: u32_at(4)?,
            time: u64_at(8)?,
            kind: u32_at(16)?,
            status: u16_at(20)?,
            frames,
        })
    }
}

/// A native-endian `u32` at `at`, as a BPF program wrote it.
pub(crate) fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(
        bytes.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

/// A native-endian `u64` at `at`, as a BPF program wrote it.
pub(crate) fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(
        bytes.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// Interpreted frames of this interval, each a list of (function, file, line), innermost
/// (inlined) first; a user stack holds `INTERPRETED | index`.
#[derive(Debug, Default)]
pub struct Frames {
    frames: Vec<Vec<(String, String, i64)>>,
    index: HashMap<(String, String, i64), u64>,
    bytes: usize,
}

impl Frames {
    pub fn intern(&mut self, name: String, file: String, line: i64) -> u64 {
        let key = (name, file, line);
        if let Some(id) = self.index.get(&key) {
            return INTERPRETED | id;
        }
        let id = self.frames.len() as u64;
        self.bytes += 2 * (key.0.len() + key.1.len()) + 96;
        self.frames.push(vec![key.clone()]);
        self.index.insert(key, id);
        INTERPRETED | id
    }

    /// The frames of a tagged value; `None` for a native address.
    /// A frame with the frames inlined into it: `names` innermost first.
    pub fn intern_inlined(&mut self, mut names: Vec<(String, String, i64)>) -> u64 {
        if names.len() <= 1 {
            return match names.pop() {
                Some((name, file, line)) => self.intern(name, file, line),
                None => self.intern("[unknown frame]".into(), String::new(), 0),
            };
        }
        // Keyed by the whole chain, joined: inlined chains are few and short.
        let key = (
            names
                .iter()
                .map(|(name, _, _)| name.as_str())
                .collect::<Vec<_>>()
                .join("\u{1}"),
            names
                .iter()
                .map(|(_, file, line)| format!("{file}:{line}"))
                .collect::<Vec<_>>()
                .join("\u{1}"),
            -1,
        );
        if let Some(id) = self.index.get(&key) {
            return INTERPRETED | id;
        }
        let id = self.frames.len() as u64;
        self.bytes += names
            .iter()
            .map(|(name, file, _)| 2 * (name.len() + file.len()) + 96)
            .sum::<usize>();
        self.frames.push(names);
        self.index.insert(key, id);
        INTERPRETED | id
    }

    pub fn get(&self, value: u64) -> Option<&[(String, String, i64)]> {
        if value & INTERPRETED == 0 {
            return None;
        }
        self.frames
            .get(usize::try_from(value & !INTERPRETED).ok()?)
            .map(Vec::as_slice)
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Puts interpreted frames in place of the interpreter loop's native frames: each native
/// call of the loop (one frame, or several in a row) takes the interpreted frames up to
/// the first of its call.
///
/// Calls and their frames are paired from the outermost when the native stack has more
/// calls than there are groups of frames: the innermost call has then just returned its
/// last frame or not pushed its first (a block that ended, with `rb_vm_exec` still on the
/// stack), and keeps its native frames. Otherwise they are paired from the innermost, and
/// interpreted frames left over (their native calls were past a stack cut short) go
/// outermost, after the native ones.
pub fn merge(
    native: &[u64],
    interpreted: &[(u64, bool)],
    in_loop: impl Fn(u64) -> bool,
) -> Vec<u64> {
    // A caller's address is where the call returns to: the call is a byte before.
    let at = |depth: usize, address: u64| {
        if depth == 0 {
            address
        } else {
            address.saturating_sub(1)
        }
    };
    let mut calls = 0;
    let mut previous = false;
    for (depth, address) in native.iter().enumerate() {
        let inside = in_loop(at(depth, *address));
        calls += usize::from(inside && !previous);
        previous = inside;
    }
    let groups = interpreted.iter().filter(|(_, entry)| *entry).count()
        + usize::from(interpreted.last().is_some_and(|(_, entry)| !entry));
    let mut unpaired = calls.saturating_sub(groups);
    let mut out = Vec::with_capacity(native.len() + interpreted.len());
    let mut next = 0;
    // Whether the frame before was in the loop, and then whether its call took frames.
    let mut in_call: Option<bool> = None;
    for (depth, address) in native.iter().enumerate() {
        if in_loop(at(depth, *address)) {
            // Loop frames one after another are one call of it (Ruby's `rb_vm_exec`
            // calling `vm_exec_core`).
            match in_call {
                Some(true) => continue,
                Some(false) => {
                    out.push(*address);
                    continue;
                }
                None => {}
            }
            if unpaired > 0 {
                unpaired -= 1;
                in_call = Some(false);
                out.push(*address);
                continue;
            }
            if next < interpreted.len() {
                in_call = Some(true);
                while let Some((frame, entry)) = interpreted.get(next) {
                    out.push(*frame);
                    next += 1;
                    if *entry {
                        break;
                    }
                }
                continue;
            }
        }
        in_call = None;
        out.push(*address);
    }
    out.extend(interpreted[next..].iter().map(|(frame, _)| *frame));
    out
}

/// The stack copy of a sample and the frame pointer of each frame unwound from it.
pub struct Copy<'a> {
    pub bases: &'a [u64],
    pub stack: &'a [u8],
    pub sp: u64,
    pub process: &'a Process,
}

impl Copy<'_> {
    fn word(&self, address: u64) -> Option<u64> {
        crate::unwind::stack_word(self.stack, self.sp, address)
    }
}

/// A process's interpreter, known and read.
#[derive(Debug)]
enum Runtime {
    Python(python::Runtime),
    Ruby(ruby::Runtime),
    V8(Box<v8::Runtime>),
    HotSpot(hotspot::Runtime),
}

impl Runtime {
    /// What the BPF program reads; nothing for V8, whose frames are in the stack copy.
    fn proc(&self) -> Option<&ProcLayout> {
        match self {
            Runtime::Python(python) => Some(&python.proc),
            Runtime::Ruby(ruby) => Some(&ruby.proc),
            Runtime::V8(_) | Runtime::HotSpot(_) => None,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Runtime::Python(_) => "python",
            Runtime::Ruby(_) => "ruby",
            Runtime::V8(_) => "node",
            Runtime::HotSpot(_) => "java",
        }
    }

    fn name(&mut self, frame: &RawFrame) -> Named {
        let named = match self {
            Runtime::Python(python) => python.name(frame.code, frame.fingerprint, frame.instr),
            Runtime::Ruby(ruby) => match ruby.name(frame.code, frame.fingerprint, frame.instr) {
                Some((name, file, line, false)) => {
                    return Named::NotStarted(name, file, line);
                }
                Some((name, file, line, true)) => Some((name, file, line)),
                None => None,
            },
            Runtime::V8(_) | Runtime::HotSpot(_) => None,
        };
        match named {
            Some((name, file, line)) => Named::Frame(name, file, line),
            None => Named::Unreadable,
        }
    }

    fn in_loop(&self, address: u64) -> bool {
        match self {
            Runtime::Python(python) => python.in_eval(address),
            Runtime::Ruby(ruby) => ruby.in_loop(address),
            Runtime::V8(_) | Runtime::HotSpot(_) => false,
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Runtime::Python(python) => python.bytes(),
            Runtime::Ruby(ruby) => ruby.bytes(),
            Runtime::V8(v8) => v8.bytes(),
            Runtime::HotSpot(hotspot) => hotspot.bytes(),
        }
    }
}

/// What a frame read at a sample turned out to be.
enum Named {
    /// Function, file and line.
    Frame(String, String, i64),
    /// A frame whose code has not begun: a block about to run, or, outermost, Ruby's
    /// placeholder `<main>` under the main thread's frames, which no native call runs.
    NotStarted(String, String, i64),
    /// Its code object could not be read, or was not one.
    Unreadable,
}

/// A binary that holds an interpreter.
#[derive(Debug)]
enum Binary {
    Python(python::Binary),
    Ruby(ruby::Binary),
    V8(v8::Binary),
    HotSpot(hotspot::Binary),
}

impl Binary {
    /// Whether a mapped file may hold an interpreter, by its name: only those are read.
    fn may_be(mapped: &str) -> bool {
        python::may_be_interpreter(mapped)
            || ruby::may_be_interpreter(mapped)
            || v8::may_be_interpreter(mapped)
            || hotspot::may_be_interpreter(mapped)
    }

    /// The interpreter in a mapped file, judged first by its name.
    fn read(mapped: &str, path: &std::path::Path) -> Option<Binary> {
        if python::may_be_interpreter(mapped) {
            return python::Binary::read(path).map(Binary::Python);
        }
        if ruby::may_be_interpreter(mapped) {
            return ruby::Binary::read(path).map(Binary::Ruby);
        }
        if v8::may_be_interpreter(mapped) {
            return v8::Binary::read(path).map(Binary::V8);
        }
        if hotspot::may_be_interpreter(mapped) {
            return hotspot::Binary::read(path).map(Binary::HotSpot);
        }
        None
    }
}

/// Whether a mapped file may hold an interpreter, by its name: a process that maps one
/// is looked at again.
pub fn may_be_interpreter(path: &str) -> bool {
    Binary::may_be(path)
}

/// What became of a process's interpreter.
#[derive(Debug)]
enum State {
    /// Not an interpreter this agent knows, as of the mapping generation given.
    Native(u64),
    /// Read from the time given on (`CLOCK_MONOTONIC`): samples before it have no
    /// event.
    Known(Box<Runtime>, u64),
    /// An interpreter, profiled natively: its kind, and the outcome counted, with why.
    Unsupported(&'static str, String),
}

/// Samples an interpreter stack was wanted for: per binary, its runtime and the count of
/// each outcome. Keyed so that counting a sample looks up by `&str` and allocates nothing
/// once the binary and outcome are known (it runs at every interpreter sample).
pub type Outcomes = Mutex<HashMap<String, (&'static str, HashMap<String, u64>)>>;

/// Binaries tracked in [`Outcomes`]; past it, new ones count as `other`.
const MAX_BINARIES: usize = 1000;

/// The interpreters of the host's processes, and the stacks read for them not yet
/// joined to their samples.
#[derive(Debug, Default)]
pub struct Interpreters {
    states: HashMap<Instance, State>,
    /// Events of each thread not joined yet, oldest first.
    pending: HashMap<u32, std::collections::VecDeque<Event>>,
    binaries: HashMap<String, Option<Binary>>,
    /// Per process, how many times its runtime was found not initialized yet.
    not_ready: HashMap<Instance, u32>,
    pub frames: Frames,
    /// Events whose sample never came (the ring dropped it, or the sample was lost).
    pub unjoined: AtomicU64,
}

/// How far apart a sample's time and its event's may be. The kernel stamps the sample,
/// runs the BPF program (which stamps the event microseconds later), then writes the
/// sample; a thread is sampled at most every millisecond, so the window tells samples
/// apart.
const JOIN_WINDOW_NANOS: u64 = 500_000;

/// Times a runtime found not initialized is looked at again (each time its mappings
/// change) before it counts as unsupported, with the reason. A JVM maps some dozens of
/// regions as it starts.
const MAX_NOT_READY: u32 = 64;

/// Events kept per thread while their samples are awaited.
const MAX_PENDING: usize = 256;

/// What [`Interpreters::examine`] found for the BPF program.
pub enum Found<'a> {
    /// Read this process's interpreter with this layout.
    Register(&'a ProcLayout),
    Nothing,
}

impl Interpreters {
    /// Looks at a process's mappings for an interpreter, once per mapping generation until
    /// one is found. Without eBPF (`kernel` false), the runtimes whose frames are read in
    /// the kernel are counted as unsupported, with that reason.
    pub fn examine(&mut self, process: &Process, kernel: bool) -> Found<'_> {
        let instance = process.instance;
        match self.states.get(&instance) {
            Some(State::Native(generation)) if *generation == process.generation => {
                return Found::Nothing
            }
            Some(State::Known(..)) | Some(State::Unsupported(..)) => return Found::Nothing,
            _ => {}
        }
        let mut found = None;
        for mapping in &process.mappings {
            if !mapping.is_file() || !Binary::may_be(&mapping.path) {
                continue;
            }
            let Some(path) = process.readable_path(mapping) else {
                continue;
            };
            // The same file in every process that maps it, told apart by build id.
            let key = match &mapping.build_id {
                Some(id) => format!("{id:02x?}"),
                None => format!("{}:{}", process.pid, mapping.path),
            };
            let binary = self
                .binaries
                .entry(key)
                .or_insert_with(|| Binary::read(&mapping.path, &path));
            let (start, pgoff, pid) = (mapping.start, mapping.pgoff, process.pid);
            found = match binary {
                Some(Binary::Python(binary)) => Some((
                    "python",
                    python::Runtime::new(pid, binary, &mapping.path, start, pgoff)
                        .map(Runtime::Python),
                )),
                Some(Binary::Ruby(binary)) => Some((
                    "ruby",
                    ruby::Runtime::new(pid, binary, start, pgoff).map(Runtime::Ruby),
                )),
                Some(Binary::V8(binary)) => Some((
                    "node",
                    v8::Runtime::new(pid, binary, &mapping.path)
                        .map(|v8| Runtime::V8(Box::new(v8))),
                )),
                Some(Binary::HotSpot(binary)) => Some((
                    "java",
                    hotspot::Runtime::new(pid, binary, start, pgoff).map(Runtime::HotSpot),
                )),
                None => None,
            };
            if found.is_some() {
                break;
            }
        }
        if self.binaries.len() > 4 * MAX_BINARIES {
            self.binaries.clear();
        }
        let state = match found {
            None => State::Native(process.generation),
            Some((kind, Ok(runtime))) if runtime.proc().is_some() && !kernel => State::Unsupported(
                kind,
                "unsupported: its frames are read with eBPF, which is off or unavailable".into(),
            ),
            Some((_, Ok(runtime))) => State::Known(Box::new(runtime), monotonic_nanos()),
            // Mapped, not yet loaded whole or relocated: looked at again when its
            // mappings change, for as long as a runtime takes to start.
            Some((_, Err(reason)))
                if reason.ends_with(hotspot::NOT_READY) && self.not_ready_again(instance) =>
            {
                State::Native(process.generation)
            }
            Some((kind, Err(reason))) => {
                tracing::info!(pid = process.pid, exe = %process.exe, %reason, "interpreter profiled with native frames only");
                State::Unsupported(kind, format!("unsupported: {reason}"))
            }
        };
        self.states.insert(instance, state);
        match self.states.get(&instance).and_then(|state| match state {
            State::Known(runtime, _) => runtime.proc(),
            _ => None,
        }) {
            Some(layout) => Found::Register(layout),
            None => Found::Nothing,
        }
    }

    /// Counts one more look at a runtime not initialized yet; `false` past
    /// [`MAX_NOT_READY`], when it is to count as unsupported.
    fn not_ready_again(&mut self, instance: Instance) -> bool {
        let looks = self.not_ready.entry(instance).or_insert(0);
        *looks += 1;
        *looks <= MAX_NOT_READY
    }

    /// Whether the process's samples may be counted in the kernel, out of the agent's
    /// sight: not while its runtime is looked at again for not being initialized yet
    /// (each of its samples is what looks), nor once it is a runtime read from the stack
    /// copies the kernel would no longer send.
    pub fn may_count_in_kernel(&self, instance: Instance) -> bool {
        let retrying = matches!(self.states.get(&instance), Some(State::Native(_)))
            && self.not_ready.contains_key(&instance);
        !retrying && !self.wants_copy(instance)
    }

    /// Whether the process's samples must be unwound from their stack copies, with each
    /// frame's frame pointer: V8's and HotSpot's frames are read from there.
    pub fn wants_copy(&self, instance: Instance) -> bool {
        matches!(self.states.get(&instance), Some(State::Known(runtime, _)) if matches!(**runtime, Runtime::V8(_) | Runtime::HotSpot(_)))
    }

    /// The process's generated code that the unwinder must walk by the runtime's rules.
    pub fn jit(&mut self, instance: Instance) -> Option<&mut dyn crate::unwind::Jit> {
        match self.states.get_mut(&instance) {
            Some(State::Known(runtime, _)) => match &mut **runtime {
                Runtime::HotSpot(hotspot) => Some(hotspot),
                _ => None,
            },
            _ => None,
        }
    }

    /// Keeps an event until its sample arrives. Events are written just after their
    /// samples are stamped, so a batch's events must all be kept before its samples join.
    pub fn event(&mut self, event: Event) {
        let queue = self.pending.entry(event.tid).or_default();
        if queue.len() >= MAX_PENDING {
            queue.pop_front();
            self.unjoined
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        queue.push_back(event);
    }

    /// The event of the sample taken at `time` on thread `tid`; older events, whose
    /// samples never came, are dropped.
    fn take(&mut self, tid: u32, time: u64) -> Option<Event> {
        let queue = self.pending.get_mut(&tid)?;
        while let Some(front) = queue.front() {
            if front.time.abs_diff(time) <= JOIN_WINDOW_NANOS {
                return queue.pop_front();
            }
            if front.time > time {
                return None; // a later sample's
            }
            queue.pop_front();
            self.unjoined
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        None
    }

    /// The sample's user stack with its interpreted frames, and the outcome to count:
    /// `None` when the process runs no interpreter.
    pub fn join(
        &mut self,
        instance: Instance,
        tid: u32,
        time: u64,
        native: Vec<u64>,
        copy: Option<Copy<'_>>,
    ) -> (Vec<u64>, Option<(&'static str, &str)>) {
        if let Some(State::Known(runtime, _)) = self.states.get_mut(&instance) {
            match &mut **runtime {
                Runtime::V8(v8) => {
                    let Some(copy) = copy else {
                        return (native, Some(("node", "no stack copy")));
                    };
                    let (joined, outcome) = v8.join(native, &copy, &mut self.frames);
                    return (joined, Some(("node", outcome)));
                }
                Runtime::HotSpot(hotspot) => {
                    let Some(copy) = copy else {
                        hotspot.forget_walk();
                        return (native, Some(("java", "no stack copy")));
                    };
                    let (joined, outcome) = hotspot.join(native, &copy, &mut self.frames);
                    return (joined, Some(("java", outcome)));
                }
                _ => {}
            }
        }
        let kind = match self.states.get(&instance) {
            Some(State::Known(runtime, since)) if time < *since => {
                return (
                    native,
                    Some((runtime.kind(), "sampled before it was found")),
                )
            }
            Some(State::Known(runtime, _)) => runtime.kind(),
            Some(State::Unsupported(..)) => "",
            _ => return (native, None),
        };
        if kind.is_empty() {
            // Borrowed again here, not above: a borrow returned from one arm of that match
            // would last past it, and `take` below needs `self`.
            return match self.states.get(&instance) {
                Some(State::Unsupported(kind, outcome)) => (native, Some((kind, outcome.as_str()))),
                _ => (native, None),
            };
        }
        let Some(event) = self.take(tid, time) else {
            return (native, Some((kind, "no stack read")));
        };
        let Some(State::Known(runtime, _)) = self.states.get_mut(&instance) else {
            return (native, None);
        };
        let outcome = match event.status {
            STATUS_OK => "named",
            STATUS_NO_THREAD => "native thread",
            STATUS_READ_FAILED => "read failed",
            STATUS_TRUNCATED => "truncated",
            _ => "unknown status",
        };
        let mut frames: Vec<(u64, bool)> = Vec::with_capacity(event.frames.len());
        let mut unnamed = 0;
        let outermost = event.frames.len().saturating_sub(1);
        for (depth, frame) in event.frames.iter().enumerate() {
            let id = match runtime.name(frame) {
                Named::Frame(name, file, line) => self.frames.intern(name, file, line),
                Named::NotStarted(..) if depth == outermost && event.status == STATUS_OK => {
                    // The placeholder: its call's first frame is then the one before it.
                    if let Some(last) = frames.last_mut().filter(|_| frame.entry) {
                        last.1 = true;
                    }
                    continue;
                }
                Named::NotStarted(name, file, line) => self.frames.intern(name, file, line),
                Named::Unreadable => {
                    unnamed += 1;
                    let unknown = match kind {
                        "ruby" => "[unknown ruby frame]",
                        _ => "[unknown python frame]",
                    };
                    self.frames.intern(unknown.into(), String::new(), 0)
                }
            };
            frames.push((id, frame.entry));
        }
        let outcome = if unnamed > 0 && outcome == "named" {
            "code object unreadable"
        } else {
            outcome
        };
        let merged = merge(&native, &frames, |address| runtime.in_loop(address));
        (merged, Some((kind, outcome)))
    }

    /// Forgets processes that are gone. (The frames are started anew, when over their
    /// budget, as an interval ends: see the collector's `begin_report`.)
    pub fn retain(&mut self, live: impl Fn(Instance) -> bool) {
        self.states.retain(|instance, _| live(*instance));
        self.not_ready.retain(|instance, _| live(*instance));
        // An event read just before a report may have its sample in the next batch: only
        // events a second old, whose samples never came, are dropped.
        let stale = monotonic_nanos().saturating_sub(1_000_000_000);
        self.pending.retain(|_, queue| {
            queue.retain(|event| event.time >= stale);
            !queue.is_empty()
        });
    }

    /// Bytes held by named code objects and interned frames.
    pub fn bytes(&self) -> usize {
        self.frames.bytes()
            + self
                .states
                .values()
                .map(|state| match state {
                    State::Known(runtime, _) => runtime.bytes(),
                    _ => 0,
                })
                .sum::<usize>()
    }
}

/// `CLOCK_MONOTONIC`, the clock of samples and events.
fn monotonic_nanos() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which `now` is.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    (now.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(now.tv_nsec as u64)
}

/// Counts one outcome, by binary.
pub fn count(outcomes: &Outcomes, binary: &str, runtime: &'static str, outcome: &str) {
    let Ok(mut outcomes) = outcomes.lock() else {
        return;
    };
    let binary = if outcomes.contains_key(binary) || outcomes.len() < MAX_BINARIES {
        binary
    } else {
        "other"
    };
    if !outcomes.contains_key(binary) {
        outcomes.insert(binary.to_string(), (runtime, HashMap::new()));
    }
    let Some((_, counts)) = outcomes.get_mut(binary) else {
        return;
    };
    match counts.get_mut(outcome) {
        Some(count) => *count += 1,
        None => {
            counts.insert(outcome.to_string(), 1);
        }
    }
}

/// Test support: builds a C program that prints `name value` lines (offsets computed by
/// the compiler from a runtime's headers) with `cc` and `args`, and runs it. `None` when
/// there is no C compiler; a program that does not build fails the test.
#[cfg(test)]
pub(crate) fn c_values(source: &str, args: &[&str]) -> Option<HashMap<String, u64>> {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("offsets.c");
    std::fs::write(&file, source).expect("write");
    let program = dir.path().join("offsets");
    let status = std::process::Command::new("cc")
        .args(args)
        .arg(&file)
        .arg("-o")
        .arg(&program)
        .status()
        .ok()?;
    assert!(status.success(), "offsets.c did not build with {args:?}");
    let output = std::process::Command::new(&program).output().expect("runs");
    Some(
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| {
                let (name, value) = line.split_once(' ')?;
                Some((name.to_string(), value.trim().parse().ok()?))
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A runtime found not initialized is looked at again a bounded number of times, per
    /// process, and the count goes with the process.
    #[test]
    fn a_runtime_not_ready_is_retried_a_bounded_number_of_times() {
        let mut interpreters = Interpreters::default();
        for _ in 0..MAX_NOT_READY {
            assert!(interpreters.not_ready_again(7));
        }
        assert!(!interpreters.not_ready_again(7), "retried past the bound");
        assert!(
            interpreters.not_ready_again(8),
            "another process has its own count"
        );
        interpreters.retain(|instance| instance != 7);
        assert!(
            interpreters.not_ready_again(7),
            "the count went with the process"
        );
    }

    /// A runtime looked at again for not being ready is never counted in the kernel
    /// meanwhile: its samples would stop reaching the agent, and it would never be
    /// looked at again (a JVM read as native for good, as CI once showed).
    #[test]
    fn a_runtime_not_ready_keeps_its_samples_in_sight() {
        let mut interpreters = Interpreters::default();
        interpreters.states.insert(7, State::Native(1));
        assert!(interpreters.may_count_in_kernel(7), "a native program");
        assert!(interpreters.not_ready_again(7));
        assert!(
            !interpreters.may_count_in_kernel(7),
            "a runtime not ready yet"
        );
        interpreters.states.insert(
            7,
            State::Unsupported("java", "unsupported: not initialized".into()),
        );
        assert!(interpreters.may_count_in_kernel(7), "given up on: native");
        assert!(may_be_interpreter(
            "/usr/lib/jvm/java-17/lib/server/libjvm.so"
        ));
        assert!(!may_be_interpreter("/usr/lib/x86_64-linux-gnu/libc.so.6"));
    }

    #[test]
    fn interpreted_frames_replace_the_loop_with_each_native_call_its_own() {
        // Native, innermost first: deflate (0x10), compress (0x20), the loop (0x100,
        // return address 0x101), a C call (0x30), the loop again (0x181), main (0x40).
        let native = [0x10, 0x21, 0x101, 0x31, 0x181, 0x41];
        let in_loop = |address: u64| (0x100..0x200).contains(&address);
        let py = |n: u64| INTERPRETED | n;
        // Python, innermost first: hot (1) called by work (2), which began the inner
        // native call; then handler (3) and main (4), which began the outer one.
        let interpreted = [(py(1), false), (py(2), true), (py(3), false), (py(4), true)];
        assert_eq!(
            merge(&native, &interpreted, in_loop),
            [0x10, 0x21, py(1), py(2), 0x31, py(3), py(4), 0x41]
        );
        // A native stack cut short before the outer call: its frames go outermost.
        assert_eq!(
            merge(&native[..3], &interpreted, in_loop),
            [0x10, 0x21, py(1), py(2), py(3), py(4)]
        );
        // No interpreted frames: the native stack as it was.
        assert_eq!(merge(&native, &[], in_loop), native);
        // Loop frames one after another (Ruby's rb_vm_exec at 0x1f0 calling its core at
        // 0x100) are one call: the second takes no frames of its own.
        let ruby = [0x10, 0x101, 0x1f1, 0x31, 0x181, 0x1f1, 0x41];
        assert_eq!(
            merge(&ruby, &interpreted, in_loop),
            [0x10, py(1), py(2), 0x31, py(3), py(4), 0x41]
        );
        // More native calls than groups of frames: the innermost call's frame is gone
        // (it returned, the loop is still on the stack), so calls pair from the
        // outermost, and the innermost keeps its native frames.
        let returned = [0x1f8, 0x31, 0x101, 0x1f1, 0x31, 0x181, 0x41];
        let outer = [(py(3), false), (py(4), true)];
        assert_eq!(
            merge(&returned, &outer, in_loop),
            [0x1f8, 0x31, 0x101, 0x1f1, 0x31, py(3), py(4), 0x41]
        );
    }

    #[test]
    fn events_decode_as_the_bpf_program_lays_them_out() {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&7u32.to_ne_bytes());
        bytes.extend_from_slice(&8u32.to_ne_bytes());
        bytes.extend_from_slice(&99u64.to_ne_bytes());
        bytes.extend_from_slice(&1u32.to_ne_bytes());
        bytes.extend_from_slice(&0u16.to_ne_bytes());
        bytes.extend_from_slice(&2u16.to_ne_bytes());
        for (code, instr, line, flags) in
            [(0x1000u64, 0x1040u64, 3u32, 0u32), (0x2000, 0x2010, 9, 1)]
        {
            bytes.extend_from_slice(&code.to_ne_bytes());
            bytes.extend_from_slice(&instr.to_ne_bytes());
            bytes.extend_from_slice(&line.to_ne_bytes());
            bytes.extend_from_slice(&flags.to_ne_bytes());
        }
        let event = Event::parse(&bytes).expect("decodes");
        assert_eq!(
            (event.pid, event.tid, event.time, event.kind),
            (7, 8, 99, 1)
        );
        assert_eq!(event.frames.len(), 2);
        assert!(!event.frames[0].entry && event.frames[1].entry);
        assert_eq!(event.frames[1].code, 0x2000);
        // Shorter than its count says: refused, not read past its end.
        assert_eq!(Event::parse(&bytes[..bytes.len() - 1]), None);
        assert_eq!(Event::parse(&bytes[..10]), None);
    }
}
