//! CPython: where its state lives, and how its frames are named.
//!
//! The interpreter is found by its `_PyRuntime` symbol, in the program or in the
//! `libpython` it loaded, and its version by `Py_Version` (3.11 on) or the file's name
//! (`python3.9`, `libpython3.8.so.1.0`). The layout of the structures the BPF program
//! walks (`_PyRuntime` → interpreter → thread states → frames) depends on the minor
//! version. For 3.8 to 3.12 it is taken from [`LAYOUTS`]: offsets of a release build on a
//! 64-bit little-endian host, as CPython's headers give them
//! (`a_layout_per_version_matches_its_headers` checks an entry against the headers of
//! each interpreter unpacked here). From 3.13 on, CPython writes the offsets itself at the
//! start of `_PyRuntime` (`_Py_DebugOffsets`), and they are read from the binary
//! ([`from_debug_offsets`]): right for any build of that version, whatever its compiler or
//! options. Only the list's own shape is per version ([`DEBUG_SHAPES`], 3.13 and 3.14).
//!
//! Three shapes of frame chain are walked:
//! - up to 3.10, `PyFrameObject`s from `tstate->frame` by `f_back`, each evaluated by its
//!   own native call of `_PyEval_EvalFrameDefault`, its position `f_lasti` (an offset in
//!   bytes, in code units from 3.10), its lines in `co_lnotab` (3.10: `co_linetable`, a
//!   format of its own);
//! - 3.11 and 3.12, `_PyInterpreterFrame`s from `tstate->cframe->current_frame`;
//! - 3.13 on, the same frames from `tstate->current_frame`.
//!
//! The BPF program sends each frame as its code object's address and instruction
//! pointer (or `f_lasti`), with the code object's first line as a fingerprint. Here the
//! code object is read once (its type checked against `PyCode_Type`, so an address reused
//! by another object is never named as code), and the instruction's line comes from its
//! line table. A thread is matched to its state by `native_thread_id` (3.11 on), which is
//! the kernel's thread id, and before 3.11 by `thread_id`, which is `pthread_self()`: the
//! thread's TLS base, which the BPF program reads from the kernel's task.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use object::{Object, ObjectSegment, ObjectSymbol};

use super::memory::Memory;
use super::ProcLayout;

/// The offsets the BPF program walks by, in bytes (`struct python_walk` in
/// interp.bpf.h).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Walk {
    /// `_PyRuntime.interpreters.head`.
    pub runtime_interp_head: u16,
    /// `PyInterpreterState.threads.head`.
    pub interp_threads_head: u16,
    pub tstate_next: u16,
    /// `PyThreadState.native_thread_id`: the kernel's thread id.
    pub tstate_thread_id: u16,
    /// `PyThreadState.cframe`, or 0xffff when the frame pointer is in the thread state.
    pub tstate_cframe: u16,
    /// `_PyCFrame.current_frame` (or the thread state's).
    pub current_frame: u16,
    pub frame_code: u16,
    pub frame_previous: u16,
    pub frame_instr: u16,
    /// `is_entry`, or `owner`, as `entry_kind` says.
    pub frame_entry: u16,
    pub entry_kind: u16,
    pub code_firstlineno: u16,
    /// The owner of the shim frame that begins a native call of the loop (3.12 on).
    pub shim_owner: u16,
    /// Tag bits to clear from `f_executable` (a `_PyStackRef` from 3.14).
    pub code_tag_bits: u16,
    /// What `tstate_thread_id` holds: [`THREAD_KEY_TID`] or [`THREAD_KEY_PTHREAD`].
    pub thread_key: u16,
}

impl Walk {
    /// As `struct python_walk` lays them out.
    pub fn words(&self) -> [u16; 16] {
        super::words(&[
            self.runtime_interp_head,
            self.interp_threads_head,
            self.tstate_next,
            self.tstate_thread_id,
            self.tstate_cframe,
            self.current_frame,
            self.frame_code,
            self.frame_previous,
            self.frame_instr,
            self.frame_entry,
            self.entry_kind,
            self.code_firstlineno,
            self.shim_owner,
            self.code_tag_bits,
            self.thread_key,
        ])
    }
}

pub const RUNTIME_PYTHON: u32 = 1;
/// How a frame says it began its native call of the loop (interp.bpf.h): 3.11 keeps a
/// flag in the frame; 3.12 puts a shim frame owned by the C stack before it (2), and
/// releases up to 3.10 make one native call per frame (3).
const ENTRY_IS_ENTRY_BYTE: u16 = 1;
const ENTRY_CSTACK_OWNER: u16 = 2;
const ENTRY_EVERY_FRAME: u16 = 3;
/// A thread state's thread is the kernel's thread id (`native_thread_id`, 3.11 on), or
/// `pthread_self()` (`thread_id`, up to 3.10): the TLS base on x86-64 glibc.
pub const THREAD_KEY_TID: u16 = 0;
pub const THREAD_KEY_PTHREAD: u16 = 1;
/// A field this version does not have (`co_qualname` before 3.11).
const ABSENT: u16 = 0xffff;

/// How a version keeps its lines, and what the frame's position is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lines {
    /// 3.8 and 3.9: `co_lnotab`, (bytes, line) increments; the position is `f_lasti`,
    /// the byte offset of the instruction running.
    Lnotab,
    /// 3.10: `co_linetable`, (bytes, line) increments with -128 for no line; `f_lasti`
    /// counts code units.
    Linetable310,
    /// 3.11 on: the location table (`Objects/locations.md`); the position is a pointer
    /// into the code's instructions.
    Locations,
}

/// One minor version's layout.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    pub version: (u8, u8),
    pub walk: Walk,
    pub code_filename: u16,
    pub code_name: u16,
    pub code_qualname: u16,
    pub code_linetable: u16,
    pub lines: Lines,
    /// `co_code_adaptive`: where the instructions start, in the code object (3.11 on).
    pub code_instructions: u16,
    /// `sizeof(PyASCIIObject)` and `sizeof(PyCompactUnicodeObject)`: where a compact
    /// string's characters start.
    pub ascii_data: u16,
    pub compact_data: u16,
    /// The instruction pointer points at the next instruction, not the current one.
    pub instr_is_next: bool,
}

/// The layouts known, by version. From the headers of each release
/// (`Include/internal/pycore_frame.h`, `pycore_interp.h`, `pycore_runtime.h`,
/// `Include/cpython/code.h`, `pystate.h`, `unicodeobject.h`), release builds, x86-64.
/// 3.9's and 3.11's are checked against their headers here; 3.8's, 3.10's and 3.12's are
/// those headers' offsets as bindgen gives them (py-spy publishes its output for each
/// release; its 3.9 and 3.11 agree with the checked entries field by field), and 3.12's
/// entry shim owner is `FRAME_OWNED_BY_CSTACK` (3) of its `pycore_frame.h`.
pub const LAYOUTS: &[Layout] = &[
    // 3.8 and 3.9: `PyFrameObject`s from `tstate->frame`, each its own native call of the
    // loop; the thread is `pthread_self()`. (3.9 is checked against Debian 11's headers.)
    pre_311((3, 8), 104, Lines::Lnotab),
    pre_311((3, 9), 104, Lines::Lnotab),
    // 3.10: `f_lasti` moved up (`f_stacktop` became an int), and the line table changed.
    pre_311((3, 10), 96, Lines::Linetable310),
    LAYOUT_3_11,
    // 3.12: as 3.11, but a native call of the loop begins with a shim frame owned by the
    // C stack (`FRAME_OWNED_BY_CSTACK`), and the frame's fields moved.
    Layout {
        version: (3, 12),
        walk: Walk {
            interp_threads_head: 72,
            tstate_thread_id: 144,
            current_frame: 0,
            frame_code: 0,
            frame_previous: 8,
            frame_entry: 70,
            entry_kind: ENTRY_CSTACK_OWNER,
            code_firstlineno: 68,
            shim_owner: 3,
            ..LAYOUT_3_11.walk
        },
        code_instructions: 192,
        // `wstr` is gone from `PyASCIIObject`.
        ascii_data: 40,
        compact_data: 56,
        ..LAYOUT_3_11
    },
];

/// 3.11: frames in `_PyInterpreterFrame`, reached through `tstate->cframe`; a frame says
/// itself whether it is the first of its native call (`is_entry`).
const LAYOUT_3_11: Layout = Layout {
    version: (3, 11),
    walk: Walk {
        runtime_interp_head: 40,
        interp_threads_head: 16,
        tstate_next: 8,
        tstate_thread_id: 160,
        tstate_cframe: 56,
        current_frame: 8,
        frame_code: 32,
        frame_previous: 48,
        frame_instr: 56,
        frame_entry: 68,
        entry_kind: ENTRY_IS_ENTRY_BYTE,
        code_firstlineno: 72,
        shim_owner: 0,
        code_tag_bits: 0,
        thread_key: THREAD_KEY_TID,
    },
    code_filename: 112,
    code_name: 120,
    code_qualname: 128,
    code_linetable: 136,
    lines: Lines::Locations,
    code_instructions: 184,
    ascii_data: 48,
    compact_data: 72,
    instr_is_next: false,
};

/// 3.8 to 3.10, which differ only in where `f_lasti` is and how lines are kept.
const fn pre_311(version: (u8, u8), frame_lasti: u16, lines: Lines) -> Layout {
    Layout {
        version,
        walk: Walk {
            runtime_interp_head: 32,
            interp_threads_head: 8,
            tstate_next: 8,
            tstate_thread_id: 176,
            tstate_cframe: ABSENT,
            current_frame: 24,
            frame_code: 32,
            frame_previous: 24,
            frame_instr: frame_lasti,
            frame_entry: 0,
            entry_kind: ENTRY_EVERY_FRAME,
            code_firstlineno: 40,
            shim_owner: 0,
            code_tag_bits: 0,
            thread_key: THREAD_KEY_PTHREAD,
        },
        code_filename: 104,
        code_name: 112,
        code_qualname: ABSENT,
        code_linetable: 120,
        lines,
        code_instructions: 0,
        ascii_data: 48,
        compact_data: 72,
        instr_is_next: false,
    }
}

/// The layout of a CPython `version`, from the table, or from the interpreter's own
/// `_Py_DebugOffsets` (3.13 and 3.14) when `debug` holds them; the error says why the process is
/// profiled with native frames only.
pub fn layout(version: (u8, u8), debug: Option<&[u8]>) -> Result<Layout, String> {
    if let Some(layout) = LAYOUTS.iter().find(|layout| layout.version == version) {
        return Ok(*layout);
    }
    match debug {
        Some(bytes) if DEBUG_SHAPES.iter().any(|shape| shape.version == version) => {
            from_debug_offsets(bytes, version)
        }
        _ => Err(format!(
            "CPython {}.{} has no known layout",
            version.0, version.1
        )),
    }
}

/// `_Py_DebugOffsets`' cookie, the first bytes of `_PyRuntime` from 3.13 on.
const DEBUG_COOKIE: &[u8; 8] = b"xdebugpy";

/// Where in one version's `_Py_DebugOffsets` each offset the agent needs is, in bytes
/// (the struct is a list of `uint64_t`, its shape changed from 3.13 to 3.14), and what
/// the offsets do not say: the owner of the entry shim frame and the tag bits of a
/// `_PyStackRef`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DebugShape {
    pub version: (u8, u8),
    /// `sizeof(_Py_DebugOffsets)`.
    pub bytes: usize,
    pub interpreters_head: usize,
    pub threads_head: usize,
    pub tstate_next: usize,
    pub tstate_current_frame: usize,
    pub tstate_native_thread_id: usize,
    pub frame_previous: usize,
    pub frame_executable: usize,
    pub frame_instr_ptr: usize,
    pub frame_owner: usize,
    pub code_filename: usize,
    pub code_name: usize,
    pub code_qualname: usize,
    pub code_linetable: usize,
    pub code_firstlineno: usize,
    pub code_adaptive: usize,
    pub unicode_asciiobject_size: usize,
    /// `FRAME_OWNED_BY_CSTACK` in 3.13, `FRAME_OWNED_BY_INTERPRETER` in 3.14.
    pub shim_owner: u16,
    /// `Py_TAG_BITS` of a release build with the GIL.
    pub code_tag_bits: u16,
}

/// The shapes known, from `Include/internal/pycore_runtime.h` (3.13) and
/// `pycore_debug_offsets.h` (3.14); the tests check them against each version's headers
/// where they are unpacked.
pub const DEBUG_SHAPES: &[DebugShape] = &[
    DebugShape {
        version: (3, 13),
        bytes: 584,
        interpreters_head: 40,
        threads_head: 72,
        tstate_next: 168,
        tstate_current_frame: 184,
        tstate_native_thread_id: 200,
        frame_previous: 232,
        frame_executable: 240,
        frame_instr_ptr: 248,
        frame_owner: 264,
        code_filename: 280,
        code_name: 288,
        code_qualname: 296,
        code_linetable: 304,
        code_firstlineno: 312,
        code_adaptive: 344,
        unicode_asciiobject_size: 560,
        shim_owner: 3,
        code_tag_bits: 0,
    },
    DebugShape {
        version: (3, 14),
        bytes: 760,
        interpreters_head: 40,
        threads_head: 72,
        tstate_next: 192,
        tstate_current_frame: 208,
        tstate_native_thread_id: 224,
        frame_previous: 256,
        frame_executable: 264,
        frame_instr_ptr: 272,
        frame_owner: 288,
        code_filename: 320,
        code_name: 328,
        code_qualname: 336,
        code_linetable: 344,
        code_firstlineno: 352,
        code_adaptive: 384,
        unicode_asciiobject_size: 640,
        shim_owner: 3,
        code_tag_bits: 3,
    },
];

/// The most bytes of `_PyRuntime` any shape needs.
pub const DEBUG_OFFSETS_BYTES: usize = 760;

/// A layout from a version's `_Py_DebugOffsets`: CPython writes the offsets of the
/// structures a debugger or profiler walks at the start of `_PyRuntime`, for this very
/// use, so a build whose structures differ (another compiler, options, a patch) is still
/// read right. The list's own shape is per version ([`DEBUG_SHAPES`]).
pub fn from_debug_offsets(bytes: &[u8], version: (u8, u8)) -> Result<Layout, String> {
    let shape = DEBUG_SHAPES
        .iter()
        .find(|shape| shape.version == version)
        .ok_or_else(|| {
            format!(
                "CPython {}.{}'s debug offsets are not known",
                version.0, version.1
            )
        })?;
    if bytes.get(..8) != Some(&DEBUG_COOKIE[..]) {
        return Err("_PyRuntime does not begin with its debug offsets".into());
    }
    let field = |at: usize| -> Result<u64, String> {
        bytes
            .get(at..at + 8)
            .filter(|_| at + 8 <= shape.bytes)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_ne_bytes)
            .ok_or_else(|| "the debug offsets are cut short".to_string())
    };
    let offset = |at: usize| -> Result<u16, String> {
        u16::try_from(field(at)?).map_err(|_| format!("a debug offset (at {at}) is too large"))
    };
    let hex = field(8)?;
    let found = ((hex >> 24) as u8, (hex >> 16) as u8);
    if found != version {
        return Err(format!(
            "the debug offsets are of CPython {}.{}",
            found.0, found.1
        ));
    }
    if field(16)? != 0 {
        return Err("a free-threaded build (its frames are laid out otherwise)".into());
    }
    let ascii = offset(shape.unicode_asciiobject_size)?;
    Ok(Layout {
        version,
        walk: Walk {
            runtime_interp_head: offset(shape.interpreters_head)?,
            interp_threads_head: offset(shape.threads_head)?,
            tstate_next: offset(shape.tstate_next)?,
            tstate_thread_id: offset(shape.tstate_native_thread_id)?,
            tstate_cframe: ABSENT,
            current_frame: offset(shape.tstate_current_frame)?,
            frame_code: offset(shape.frame_executable)?,
            frame_previous: offset(shape.frame_previous)?,
            frame_instr: offset(shape.frame_instr_ptr)?,
            frame_entry: offset(shape.frame_owner)?,
            entry_kind: ENTRY_CSTACK_OWNER,
            code_firstlineno: offset(shape.code_firstlineno)?,
            shim_owner: shape.shim_owner,
            code_tag_bits: shape.code_tag_bits,
            thread_key: THREAD_KEY_TID,
        },
        code_filename: offset(shape.code_filename)?,
        code_name: offset(shape.code_name)?,
        code_qualname: offset(shape.code_qualname)?,
        code_linetable: offset(shape.code_linetable)?,
        lines: Lines::Locations,
        code_instructions: offset(shape.code_adaptive)?,
        ascii_data: ascii,
        // PyCompactUnicodeObject adds the UTF-8 length and pointer.
        compact_data: ascii.checked_add(16).ok_or("a debug offset is too large")?,
        instr_is_next: false,
    })
}

/// An interpreter binary: the file that holds `_PyRuntime`.
#[derive(Debug, Clone)]
pub struct Binary {
    /// Virtual addresses in the file.
    pub runtime: u64,
    pub version_symbol: Option<u64>,
    pub code_type: Option<u64>,
    /// `_PyEval_EvalFrameDefault` and its split-off parts (`.cold`).
    pub eval: Vec<Range<u64>>,
    /// The first bytes of `_PyRuntime` as the file initializes them: 3.13's debug
    /// offsets, when they are there.
    pub debug_offsets: Option<Vec<u8>>,
    loads: super::Loads,
}

impl Binary {
    /// Reads an ELF file's interpreter symbols; `None` when it has no `_PyRuntime`.
    pub fn read(path: &Path) -> Option<Binary> {
        let file = std::fs::File::open(path).ok()?;
        let cache = object::ReadCache::new(file);
        let elf = object::File::parse(&cache).ok()?;
        let mut binary = Binary {
            runtime: 0,
            version_symbol: None,
            code_type: None,
            eval: Vec::new(),
            debug_offsets: None,
            loads: super::Loads::of(&elf),
        };
        for symbol in elf.dynamic_symbols().chain(elf.symbols()) {
            let Ok(name) = symbol.name() else { continue };
            let address = symbol.address();
            if address == 0 {
                continue;
            }
            match name {
                "_PyRuntime" => binary.runtime = address,
                "Py_Version" => binary.version_symbol = Some(address),
                "PyCode_Type" => binary.code_type = Some(address),
                _ if name == "_PyEval_EvalFrameDefault"
                    || name.starts_with("_PyEval_EvalFrameDefault.") =>
                {
                    let range = address..address + symbol.size().max(1);
                    if !binary.eval.contains(&range) {
                        binary.eval.push(range);
                    }
                }
                _ => {}
            }
        }
        if binary.runtime == 0 {
            return None;
        }
        binary.debug_offsets = elf.segments().find_map(|segment| {
            let bytes = segment
                .data_range(binary.runtime, DEBUG_OFFSETS_BYTES as u64)
                .ok()??;
            bytes.starts_with(DEBUG_COOKIE).then(|| bytes.to_vec())
        });
        Some(binary)
    }
}

/// The version from a file name: `python3.10`, `libpython3.9.so.1.0`.
pub fn version_from_name(path: &str) -> Option<(u8, u8)> {
    let name = path.rsplit('/').next()?;
    let rest = name
        .strip_prefix("libpython")
        .or_else(|| name.strip_prefix("python"))?;
    let mut parts = rest.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Whether a mapped file may be a CPython interpreter, by its name.
pub fn may_be_interpreter(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.starts_with("libpython") || name.starts_with("python")
}

/// A code object as read: what names its frames.
#[derive(Debug)]
struct Code {
    name: String,
    file: String,
    first_line: i64,
    lines: Vec<u8>,
    instructions: u64,
}

/// Most code objects one process keeps named; past it the cache starts anew.
const MAX_CODES: usize = 65_536;
/// The longest name or path read.
const MAX_STRING: usize = 4096;
/// The largest location table read.
const MAX_TABLE: usize = 1 << 20;

/// One CPython process: its layout, where its loop runs, and its named code objects.
#[derive(Debug)]
pub struct Runtime {
    pub layout: Layout,
    pub proc: ProcLayout,
    pub eval: Vec<Range<u64>>,
    code_type: Option<u64>,
    memory: Memory,
    codes: HashMap<(u64, u32), Option<Arc<Code>>>,
}

impl Runtime {
    /// The process's interpreter, from its binary mapped at `start` (file offset `pgoff`).
    pub fn new(
        pid: u32,
        binary: &Binary,
        path: &str,
        start: u64,
        pgoff: u64,
    ) -> Result<Runtime, String> {
        let bias = binary
            .loads
            .bias(start, pgoff)
            .ok_or("the interpreter's code segment is not where it was mapped")?;
        let memory = Memory { pid };
        let version = match binary.version_symbol {
            Some(symbol) => {
                let hex = memory
                    .u32(symbol.wrapping_add(bias))
                    .ok_or("Py_Version is unreadable")?;
                ((hex >> 24) as u8, (hex >> 16) as u8)
            }
            None => version_from_name(path).ok_or("the CPython version is unknown")?,
        };
        let layout = layout(version, binary.debug_offsets.as_deref())?;
        let proc = ProcLayout {
            runtime: binary.runtime.wrapping_add(bias),
            kind: RUNTIME_PYTHON,
            version: u32::from(version.0) << 8 | u32::from(version.1),
            walk: layout.walk.words(),
        };
        Ok(Runtime {
            layout,
            proc,
            eval: binary
                .eval
                .iter()
                .map(|range| range.start.wrapping_add(bias)..range.end.wrapping_add(bias))
                .collect(),
            code_type: binary.code_type.map(|t| t.wrapping_add(bias)),
            memory,
            codes: HashMap::new(),
        })
    }

    /// Whether a native frame's address is in the interpreter's loop.
    pub fn in_eval(&self, address: u64) -> bool {
        self.eval.iter().any(|range| range.contains(&address))
    }

    /// The frame's function, file and line; `None` when its code object cannot be read
    /// (freed since, or not a code object).
    pub fn name(
        &mut self,
        code: u64,
        fingerprint: u32,
        instr: u64,
    ) -> Option<(String, String, i64)> {
        if self.codes.len() >= MAX_CODES {
            self.codes.clear();
        }
        let entry = self.codes.entry((code, fingerprint)).or_insert_with(|| {
            read_code(&self.memory, &self.layout, self.code_type, code).map(Arc::new)
        });
        let code = entry.clone()?;
        // The BPF program read 8 bytes at `f_lasti`, an int: the low 4 are it.
        let lasti = instr as u32 as i32;
        let line = match self.layout.lines {
            Lines::Locations => {
                let mut index = instr.checked_sub(code.instructions).map(|b| b / 2);
                if self.layout.instr_is_next {
                    index = index.and_then(|i| i.checked_sub(1));
                }
                index.and_then(|index| line_of(&code.lines, code.first_line, index))
            }
            // -1 before the first instruction: the function's own line.
            Lines::Lnotab => u64::try_from(lasti)
                .ok()
                .map(|offset| line_of_lnotab(&code.lines, code.first_line, offset)),
            Lines::Linetable310 => u64::try_from(lasti)
                .ok()
                .and_then(|units| line_of_310(&code.lines, code.first_line, units * 2)),
        }
        .unwrap_or(code.first_line);
        Some((code.name.clone(), code.file.clone(), line))
    }

    /// Bytes held by the named code objects, roughly.
    pub fn bytes(&self) -> usize {
        self.codes
            .values()
            .flatten()
            .map(|code| code.name.len() + code.file.len() + code.lines.len() + 64)
            .sum()
    }
}

fn read_code(memory: &Memory, layout: &Layout, code_type: Option<u64>, code: u64) -> Option<Code> {
    // ob_type follows ob_refcnt.
    if let Some(expected) = code_type {
        if memory.u64(code + 8)? != expected {
            return None;
        }
    }
    let field = |offset: u16| memory.u64(code + u64::from(offset));
    let qualname = (layout.code_qualname != ABSENT)
        .then(|| read_unicode(memory, layout, field(layout.code_qualname)?))
        .flatten();
    let name = qualname.or_else(|| read_unicode(memory, layout, field(layout.code_name)?))?;
    let file = read_unicode(memory, layout, field(layout.code_filename)?).unwrap_or_default();
    let first_line = i64::from(memory.u32(code + u64::from(layout.walk.code_firstlineno))? as i32);
    let lines = read_bytes(memory, field(layout.code_linetable)?).unwrap_or_default();
    Some(Code {
        name,
        file,
        first_line,
        lines,
        instructions: code + u64::from(layout.code_instructions),
    })
}

/// A `str`: compact, as names and paths are; ASCII, Latin-1, UCS-2 or UCS-4.
fn read_unicode(memory: &Memory, layout: &Layout, address: u64) -> Option<String> {
    let length = usize::try_from(memory.u64(address + 16)?).ok()?;
    let state = memory.u32(address + 32)?;
    let kind = (state >> 2) & 7;
    let compact = (state >> 5) & 1 == 1;
    let ascii = (state >> 6) & 1 == 1;
    if !compact || length > MAX_STRING {
        return None;
    }
    let data = address
        + u64::from(if ascii {
            layout.ascii_data
        } else {
            layout.compact_data
        });
    let width = match kind {
        1 | 2 | 4 => kind as usize,
        _ => return None,
    };
    let bytes = memory.bytes(data, length * width, MAX_STRING * 4)?;
    Some(match width {
        1 => bytes.iter().map(|b| char::from(*b)).collect(),
        2 => bytes
            .chunks_exact(2)
            .map(|c| {
                char::from_u32(u32::from(u16::from_ne_bytes([c[0], c[1]]))).unwrap_or('\u{fffd}')
            })
            .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|c| {
                char::from_u32(u32::from_ne_bytes([c[0], c[1], c[2], c[3]])).unwrap_or('\u{fffd}')
            })
            .collect(),
    })
}

/// A `bytes` object's contents (`ob_size` at 16, the bytes at 32).
fn read_bytes(memory: &Memory, address: u64) -> Option<Vec<u8>> {
    let size = usize::try_from(memory.u64(address + 16)?).ok()?;
    memory.bytes(address + 32, size, MAX_TABLE)
}

/// The line of code unit `index`, from a 3.11+ location table
/// (`Objects/locations.md` in CPython): entries of a header byte (1, a 4-bit code and
/// the length in code units less one) and the code's operands. `None` for an
/// instruction without a location, or past the table.
pub fn line_of(table: &[u8], first_line: i64, index: u64) -> Option<i64> {
    let mut at = 0usize;
    let mut line = first_line;
    let mut unit = 0u64;
    let mut next = || -> Option<u8> {
        let byte = *table.get(at)?;
        at += 1;
        Some(byte)
    };
    loop {
        let header = next()?;
        if header & 0x80 == 0 {
            return None;
        }
        let code = (header >> 3) & 15;
        let length = u64::from(header & 7) + 1;
        let mut varint = || -> Option<u64> {
            let mut byte = next()?;
            let mut value = u64::from(byte & 63);
            let mut shift = 6;
            while byte & 64 != 0 && shift < 64 {
                byte = next()?;
                value |= u64::from(byte & 63) << shift;
                shift += 6;
            }
            Some(value)
        };
        let located = match code {
            15 => false,
            14 => {
                let delta = varint()?;
                line = line.saturating_add(signed(delta));
                for _ in 0..3 {
                    varint()?;
                }
                true
            }
            13 => {
                let delta = varint()?;
                line = line.saturating_add(signed(delta));
                true
            }
            10..=12 => {
                line = line.saturating_add(i64::from(code - 10));
                next()?;
                next()?;
                true
            }
            _ => {
                next()?;
                true
            }
        };
        if index < unit + length {
            return located.then_some(line);
        }
        unit += length;
    }
}

/// The line of the instruction at byte `offset`, from a 3.8/3.9 `co_lnotab`: pairs of
/// (bytes, line) increments, the line's signed, each pair's line reached once its bytes
/// are passed (`PyCode_Addr2Line`).
pub fn line_of_lnotab(table: &[u8], first_line: i64, offset: u64) -> i64 {
    let mut line = first_line;
    let mut address = 0u64;
    for pair in table.chunks_exact(2) {
        address += u64::from(pair[0]);
        if address > offset {
            break;
        }
        line += i64::from(pair[1] as i8);
    }
    line
}

/// The line of the instruction at byte `offset`, from a 3.10 `co_linetable`: pairs of
/// (bytes, signed line increment) that each cover a range of bytes, -128 for a range
/// with no line (`Objects/lnotab_notes.txt` in 3.10). `None` for such a range, or past
/// the table.
pub fn line_of_310(table: &[u8], first_line: i64, offset: u64) -> Option<i64> {
    let mut line = first_line;
    let mut start = 0u64;
    for pair in table.chunks_exact(2) {
        let end = start + u64::from(pair[0]);
        let delta = pair[1] as i8;
        let current = (delta != -128).then(|| {
            line += i64::from(delta);
            line
        });
        if (start..end).contains(&offset) {
            return current;
        }
        start = end;
    }
    None
}

fn signed(value: u64) -> i64 {
    if value & 1 == 1 {
        -((value >> 1) as i64)
    } else {
        (value >> 1) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_come_from_file_names() {
        assert_eq!(version_from_name("/usr/bin/python3.11"), Some((3, 11)));
        assert_eq!(
            version_from_name("/usr/lib/x86_64-linux-gnu/libpython3.9.so.1.0"),
            Some((3, 9))
        );
        assert_eq!(version_from_name("/usr/bin/python3"), None);
        assert!(may_be_interpreter("/opt/py/bin/python3.12"));
        assert!(!may_be_interpreter("/usr/lib/libc.so.6"));
    }

    /// A location table as CPython 3.11 writes it for
    /// `def f():\n    x = 1\n    return x` (first line 1): RESUME on line 1, then two
    /// instructions on line 2 and two on line 3 (short and one-line forms).
    #[test]
    fn lines_come_from_the_location_table() {
        let table = [
            0x80 | (13 << 3),
            0, // 1 unit, no columns, line +0 → 1
            0x80 | (11 << 3) | 1,
            4,
            9, // 2 units, one-line form, line +1 → 2
            0x80 | (14 << 3) | 1,
            2,
            0,
            5,
            13,               // 2 units, long form, line +1 → 3
            0x80 | (15 << 3), // 1 unit without a location
        ];
        let lines: Vec<Option<i64>> = (0..7).map(|i| line_of(&table, 1, i)).collect();
        assert_eq!(
            lines,
            [Some(1), Some(2), Some(2), Some(3), Some(3), None, None]
        );
        // A negative delta (long form, zigzag) and garbage after it.
        let back = [0x80 | (13 << 3), 4, 0x80 | (13 << 3), 3, 0x00];
        assert_eq!(line_of(&back, 10, 0), Some(12));
        assert_eq!(line_of(&back, 10, 1), Some(11));
        assert_eq!(line_of(&back, 10, 2), None);
        assert_eq!(line_of(&[], 10, 0), None);
    }

    /// The table's entries against the headers of the interpreters here: the one
    /// installed (3.11), and Debian 11's 3.9 as scripts/test.sh unpacks it. The offsets
    /// a C compiler computes from their `Py_BUILD_CORE` headers give the entry, field by
    /// field.
    #[test]
    fn a_layout_per_version_matches_its_headers() {
        let mut checked = Vec::new();
        let mut headers = Vec::new();
        if let Some((include, version)) = installed_headers() {
            headers.push((vec![format!("-I{}", include.display())], version));
        }
        let root = debian_root("bullseye");
        if root.join("usr/include/python3.9/Python.h").exists() {
            headers.push((debian_includes(&root, "python3.9"), (3, 9)));
        } else {
            eprintln!(
                "skipped: CPython 3.9's headers (scripts/test.sh unpacks Debian 11's at {root:?})"
            );
        }
        for (includes, version) in headers {
            let Ok(layout) = layout(version, None) else {
                panic!("CPython {version:?} is here but has no layout");
            };
            let args: Vec<&str> = includes.iter().map(String::as_str).collect();
            let Some(values) = super::super::c_values(OFFSETS_C, &args) else {
                eprintln!("skipped: no C compiler");
                return;
            };
            let from_headers = header_layout(&values, version);
            assert_eq!(format!("{layout:?}"), format!("{from_headers:?}"));
            checked.push(version);
        }
        if checked.is_empty() {
            eprintln!("skipped: no CPython headers with their internal headers found");
        } else {
            println!("CPython layouts checked against headers: {checked:?}");
        }
    }

    /// Lines from a 3.8/3.9 `co_lnotab` and a 3.10 `co_linetable`, as CPython writes
    /// them for a function on line 10 whose bytes 0-5 are on line 10, 6-9 on 12, and
    /// 10-15 back on 11.
    #[test]
    fn lines_come_from_the_tables_before_3_11() {
        let lnotab = [6, 2, 4, 0xff];
        let lines: Vec<i64> = [0, 5, 6, 9, 10, 15, 40]
            .iter()
            .map(|&offset| line_of_lnotab(&lnotab, 10, offset))
            .collect();
        assert_eq!(lines, [10, 10, 12, 12, 11, 11, 11]);
        // 3.10: each pair covers its bytes; the last range has no line.
        let table = [6, 0, 4, 2, 6, 0xff, 2, 0x80];
        let lines: Vec<Option<i64>> = [0, 5, 6, 9, 10, 15, 16, 17, 18]
            .iter()
            .map(|&offset| line_of_310(&table, 10, offset))
            .collect();
        assert_eq!(
            lines,
            [
                Some(10),
                Some(10),
                Some(12),
                Some(12),
                Some(11),
                Some(11),
                None,
                None,
                None
            ]
        );
    }

    /// Where scripts/test.sh unpacks a Debian release's CPython (`trixie` has 3.13,
    /// `sid` 3.14).
    fn debian_root(suite: &str) -> std::path::PathBuf {
        std::env::var_os("KILN_TEST_DEBIAN")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| {
                std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                    .join(".cache/kiln-test-debian")
            })
            .join(suite)
            .join("root")
    }

    /// The include flags for an unpacked Debian CPython's headers (`python3.9`), its
    /// `pyconfig.h` in the multiarch directory.
    fn debian_includes(root: &std::path::Path, name: &str) -> Vec<String> {
        [
            format!("usr/include/{name}"),
            "usr/include".to_string(),
            format!("usr/include/x86_64-linux-gnu/{name}"),
        ]
        .iter()
        .map(|dir| format!("-I{}", root.join(dir).display()))
        .collect()
    }

    /// CPython 3.13 (Debian 13) and 3.14 (Debian sid), as scripts/test.sh unpacks them:
    /// each binary's debug offsets give the layout its headers give (the offsets a C
    /// compiler computes from them), field by field, and the shape of the offsets this
    /// reader assumes ([`DEBUG_SHAPES`]) is the headers' `_Py_DebugOffsets`.
    #[test]
    fn the_debug_offsets_of_3_13_and_3_14_give_the_layout_of_their_headers() {
        for (suite, version) in [("trixie", (3u8, 13u8)), ("sid", (3, 14))] {
            let root = debian_root(suite);
            let name = format!("python{}.{}", version.0, version.1);
            let Some(binary) = Binary::read(&root.join("usr/bin").join(&name)) else {
                eprintln!("skipped: no CPython {version:?} unpacked at {root:?} (scripts/test.sh does it)");
                continue;
            };
            let bytes = binary.debug_offsets.as_deref().expect("debug offsets");
            let from_binary = layout(version, Some(bytes)).expect("a layout");
            let includes = debian_includes(&root, &name);
            let args: Vec<&str> = includes.iter().map(String::as_str).collect();
            let Some(values) = super::super::c_values(OFFSETS_C, &args) else {
                eprintln!("skipped: no C compiler");
                return;
            };
            let from_headers = header_layout(&values, version);
            assert_eq!(format!("{from_binary:?}"), format!("{from_headers:?}"));
            assert_eq!(values.get("runtime_debug_offsets"), Some(&0));
            let shape = DEBUG_SHAPES
                .iter()
                .find(|shape| shape.version == version)
                .expect("a shape");
            let at = |field: &str| values.get(&format!("shape.{field}")).copied();
            let positions = [
                ("bytes", shape.bytes),
                ("interpreters_head", shape.interpreters_head),
                ("threads_head", shape.threads_head),
                ("tstate_next", shape.tstate_next),
                ("tstate_current_frame", shape.tstate_current_frame),
                ("tstate_native_thread_id", shape.tstate_native_thread_id),
                ("frame_previous", shape.frame_previous),
                ("frame_executable", shape.frame_executable),
                ("frame_instr_ptr", shape.frame_instr_ptr),
                ("frame_owner", shape.frame_owner),
                ("code_filename", shape.code_filename),
                ("code_name", shape.code_name),
                ("code_qualname", shape.code_qualname),
                ("code_linetable", shape.code_linetable),
                ("code_firstlineno", shape.code_firstlineno),
                ("code_adaptive", shape.code_adaptive),
                ("unicode_asciiobject_size", shape.unicode_asciiobject_size),
            ];
            for (field, position) in positions {
                assert_eq!(at(field), Some(position as u64), "{version:?} {field}");
            }
            assert!(shape.bytes <= DEBUG_OFFSETS_BYTES);
        }
    }

    /// Debug offsets of another version than the binary's, or of a shape not known, or
    /// not there, or of a build laid out otherwise, are refused with the reason, never
    /// read.
    #[test]
    fn debug_offsets_not_as_expected_are_refused() {
        let mut bytes = vec![0u8; DEBUG_OFFSETS_BYTES];
        bytes[..8].copy_from_slice(DEBUG_COOKIE);
        bytes[8..16].copy_from_slice(&0x030d_05f0u64.to_ne_bytes());
        for (at, value) in [(40, 632u64), (72, 7344), (560, 40)] {
            bytes[at..at + 8].copy_from_slice(&value.to_ne_bytes());
        }
        let layout = from_debug_offsets(&bytes, (3, 13)).expect("3.13's");
        assert_eq!(layout.walk.interp_threads_head, 7344);
        assert_eq!((layout.ascii_data, layout.compact_data), (40, 56));
        assert!(from_debug_offsets(&bytes, (3, 14))
            .unwrap_err()
            .contains("3.13"));
        assert!(super::layout((3, 15), Some(&bytes))
            .unwrap_err()
            .contains("no known layout"));
        assert!(from_debug_offsets(&bytes, (3, 15))
            .unwrap_err()
            .contains("not known"));
        assert!(from_debug_offsets(&bytes[..100], (3, 13))
            .unwrap_err()
            .contains("cut short"));
        let mut threaded = bytes.clone();
        threaded[16] = 1;
        assert!(from_debug_offsets(&threaded, (3, 13))
            .unwrap_err()
            .contains("free-threaded"));
        let mut huge = bytes.clone();
        huge[40..48].copy_from_slice(&70_000u64.to_ne_bytes());
        assert!(from_debug_offsets(&huge, (3, 13))
            .unwrap_err()
            .contains("too large"));
        bytes[0] = b'y';
        assert!(from_debug_offsets(&bytes, (3, 13))
            .unwrap_err()
            .contains("debug offsets"));
    }

    /// The layout a C compiler computed from a version's headers (OFFSETS_C; 3.13 has
    /// no `tstate_cframe`).
    fn header_layout(values: &std::collections::HashMap<String, u64>, version: (u8, u8)) -> Layout {
        let value = |name: &str| -> u16 {
            values
                .get(name)
                .and_then(|v| u16::try_from(*v).ok())
                .unwrap_or_else(|| panic!("{name} missing from {values:?}"))
        };
        Layout {
            version,
            walk: Walk {
                runtime_interp_head: value("runtime_interp_head"),
                interp_threads_head: value("interp_threads_head"),
                tstate_next: value("tstate_next"),
                tstate_thread_id: value("tstate_thread_id"),
                tstate_cframe: values
                    .get("tstate_cframe")
                    .map_or(0xffff, |_| value("tstate_cframe")),
                current_frame: value("current_frame"),
                frame_code: value("frame_code"),
                frame_previous: value("frame_previous"),
                frame_instr: value("frame_instr"),
                frame_entry: values
                    .get("frame_entry")
                    .map_or(0, |_| value("frame_entry")),
                entry_kind: value("entry_kind"),
                code_firstlineno: value("code_firstlineno"),
                shim_owner: values.get("shim_owner").map_or(0, |_| value("shim_owner")),
                code_tag_bits: values
                    .get("code_tag_bits")
                    .map_or(0, |_| value("code_tag_bits")),
                thread_key: values
                    .get("thread_key")
                    .map_or(THREAD_KEY_TID, |_| value("thread_key")),
            },
            code_filename: value("code_filename"),
            code_name: value("code_name"),
            code_qualname: values
                .get("code_qualname")
                .map_or(ABSENT, |_| value("code_qualname")),
            code_linetable: value("code_linetable"),
            lines: match value("lines") {
                0 => Lines::Lnotab,
                1 => Lines::Linetable310,
                _ => Lines::Locations,
            },
            code_instructions: values
                .get("code_instructions")
                .map_or(0, |_| value("code_instructions")),
            ascii_data: value("ascii_data"),
            compact_data: value("compact_data"),
            instr_is_next: false,
        }
    }

    /// The include directory of an installed CPython with its internal headers, and its
    /// version.
    fn installed_headers() -> Option<(std::path::PathBuf, (u8, u8))> {
        let output = std::process::Command::new("python3")
            .args(["-c", "import sysconfig, sys; print(sysconfig.get_paths()['include']); print(sys.version_info[0], sys.version_info[1])"])
            .output()
            .ok()?;
        let text = String::from_utf8(output.stdout).ok()?;
        let mut lines = text.lines();
        let include = std::path::PathBuf::from(lines.next()?);
        let mut version = lines.next()?.split(' ');
        let version = (version.next()?.parse().ok()?, version.next()?.parse().ok()?);
        include
            .join("internal/pycore_frame.h")
            .exists()
            .then_some((include, version))
    }

    /// The offsets of 3.9's, 3.11's, 3.13's and 3.14's structures, by the same names
    /// (3.13 on keep the current frame in the thread state; up to 3.10 it is a
    /// `PyFrameObject`), and from 3.13 on the positions in `_Py_DebugOffsets` (`shape.*`).
    const OFFSETS_C: &str = r#"
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#if PY_VERSION_HEX < 0x030b0000
#include <frameobject.h>
#else
#include "internal/pycore_frame.h"
#endif
#include "internal/pycore_interp.h"
#include "internal/pycore_runtime.h"
#if PY_VERSION_HEX >= 0x030e0000
#include "internal/pycore_stackref.h"
#endif
#define P(name, type, field) printf(name " %zu\n", offsetof(type, field))
#define D(name, field) printf("shape." name " %zu\n", offsetof(_Py_DebugOffsets, field))
int main(void) {
    P("runtime_interp_head", _PyRuntimeState, interpreters.head);
    P("tstate_next", PyThreadState, next);
    P("code_firstlineno", PyCodeObject, co_firstlineno);
    P("code_filename", PyCodeObject, co_filename);
    P("code_name", PyCodeObject, co_name);
#if PY_VERSION_HEX < 0x030b0000
    /* Frame objects, each its own call of the loop; threads by pthread_self(). */
    printf("entry_kind 3\nthread_key 1\n");
    P("interp_threads_head", PyInterpreterState, tstate_head);
    P("tstate_thread_id", PyThreadState, thread_id);
    P("current_frame", PyThreadState, frame);
    P("frame_code", PyFrameObject, f_code);
    P("frame_previous", PyFrameObject, f_back);
    P("frame_instr", PyFrameObject, f_lasti);
#if PY_VERSION_HEX < 0x030a0000
    printf("lines 0\n"); /* Lines::Lnotab */
    P("code_linetable", PyCodeObject, co_lnotab);
#else
    printf("lines 1\n"); /* Lines::Linetable310 */
    P("code_linetable", PyCodeObject, co_linetable);
#endif
#else
    printf("lines 2\n"); /* Lines::Locations */
    P("interp_threads_head", PyInterpreterState, threads.head);
    P("tstate_thread_id", PyThreadState, native_thread_id);
#if PY_VERSION_HEX >= 0x030d0000
    P("current_frame", PyThreadState, current_frame);
    P("frame_code", _PyInterpreterFrame, f_executable);
    P("frame_instr", _PyInterpreterFrame, instr_ptr);
    P("frame_entry", _PyInterpreterFrame, owner);
    printf("entry_kind 2\n");
    P("runtime_debug_offsets", _PyRuntimeState, debug_offsets);
    printf("shape.bytes %zu\n", sizeof(_Py_DebugOffsets));
    D("interpreters_head", runtime_state.interpreters_head);
    D("threads_head", interpreter_state.threads_head);
    D("tstate_next", thread_state.next);
    D("tstate_current_frame", thread_state.current_frame);
    D("tstate_native_thread_id", thread_state.native_thread_id);
    D("frame_previous", interpreter_frame.previous);
    D("frame_executable", interpreter_frame.executable);
    D("frame_instr_ptr", interpreter_frame.instr_ptr);
    D("frame_owner", interpreter_frame.owner);
    D("code_filename", code_object.filename);
    D("code_name", code_object.name);
    D("code_qualname", code_object.qualname);
    D("code_linetable", code_object.linetable);
    D("code_firstlineno", code_object.firstlineno);
    D("code_adaptive", code_object.co_code_adaptive);
    D("unicode_asciiobject_size", unicode_object.asciiobject_size);
#if PY_VERSION_HEX >= 0x030e0000
    /* The entry shim's owner, and the tag bits of f_executable (a _PyStackRef). */
    printf("shim_owner %d\n", FRAME_OWNED_BY_INTERPRETER);
    printf("code_tag_bits %lu\n", (unsigned long)Py_TAG_BITS);
#else
    printf("shim_owner %d\n", FRAME_OWNED_BY_CSTACK);
    printf("code_tag_bits 0\n");
#endif
#else
    P("tstate_cframe", PyThreadState, cframe);
    P("current_frame", _PyCFrame, current_frame);
    P("frame_code", _PyInterpreterFrame, f_code);
    P("frame_instr", _PyInterpreterFrame, prev_instr);
#if PY_VERSION_HEX >= 0x030c0000
    P("frame_entry", _PyInterpreterFrame, owner);
    printf("entry_kind 2\nshim_owner %d\n", FRAME_OWNED_BY_CSTACK);
#else
    P("frame_entry", _PyInterpreterFrame, is_entry);
    printf("entry_kind 1\n");
#endif
#endif
    P("frame_previous", _PyInterpreterFrame, previous);
    P("code_qualname", PyCodeObject, co_qualname);
    P("code_linetable", PyCodeObject, co_linetable);
    P("code_instructions", PyCodeObject, co_code_adaptive);
#endif
    printf("ascii_data %zu\n", sizeof(PyASCIIObject));
    printf("compact_data %zu\n", sizeof(PyCompactUnicodeObject));
    return 0;
}
"#;
}
