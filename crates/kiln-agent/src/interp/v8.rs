//! Node.js: JavaScript functions named from V8's own frames, with no change to the program.
//!
//! V8 keeps a frame pointer in every frame of the code it generates (interpreted, baseline
//! and optimized), and a JavaScript frame holds its context and its `JSFunction` at fixed
//! offsets below it (`v8dbg_off_fp_context`, `v8dbg_off_fp_function`). So, unlike CPython
//! and Ruby, nothing has to be read in the kernel: the sample's copy of the user stack is
//! that memory as it was at the sample. The DWARF unwinder walks the C++ frames by their
//! call-frame information and the generated code by its frame pointers (code without
//! CFI falls back to them), and gives each frame's frame pointer ([`crate::unwind::Walked::bases`]);
//! here each frame of generated code has its function read from the copy.
//!
//! From the function on, objects are read from the process's memory, later: the function's
//! `SharedFunctionInfo`, its name (a string, or the first string of its `ScopeInfo`) and
//! its `Script`'s name and line ends. The collector may have moved a function since the
//! sample, so every object's type is checked through its map (all `SharedFunctionInfo`s
//! share one), and names are cached by the `SharedFunctionInfo`'s address together with
//! the name-or-scope-info it points to. A read that fails keeps the native frame and is
//! counted. Offsets and type numbers come from the `v8dbg_*` postmortem symbols that every
//! Node.js build carries (gen-postmortem-metadata.py), matched by class and field whatever
//! the type suffix of the V8 version spells.
//!
//! Where a frame goes: code generated at run time (anonymous memory) and the interpreter
//! (`InterpreterEntryTrampoline` and the bytecode handlers, which run in its frame) are the
//! function itself and take its place; any other builtin keeps its native name, with the
//! function whose frame it ran in (its own, for a builtin with a JavaScript frame such as
//! `Array.prototype.push`, or its caller's when it sets up none) after it. A frame pointer
//! names at most one frame.
//!
//! Lines: the line of the function's start, from the positions V8 keeps in its
//! `ScopeInfo` (the layout differs by version and has no postmortem symbols, so the pair
//! of positions is found as OpenTelemetry's profiler finds it: two small integers in
//! order after the name). The line within the function would take the bytecode's source
//! position table, whose offset has no postmortem symbol either.
//!
//! Inlining: a function TurboFan (or Maglev) inlined into its caller has no frame of its
//! own, so the caller's frame is expanded into the chain of functions it was running, as
//! `go tool pprof` shows Go's inlined calls. V8 records it without being asked: optimized
//! code keeps a source position at each call and deoptimization check (measured: 22
//! positions in 940 bytes of a plain `node` run's optimized code, 7 of them in the inlined
//! loop), each with an inlining id, and the code's deoptimization data maps that id to the
//! inlined function and the position in its caller where it was inlined. The frame's code
//! is its function's current code (`JSFunction::code`), read later like the rest, and used
//! only when the sample's address lies within its instructions. Code entered by on-stack
//! replacement (a long loop's, compiled while it ran) is never its function's: it is found
//! from the address, by the header of the object holding its instructions, just below
//! them (code space holds its objects end to end), and must start where that header says
//! and have been compiled for the frame's function. Code replaced since the sample keeps
//! the frame's one function.
//! The `Code` class lost most of its postmortem symbols between V8 10 and 12, so the
//! offsets the build lacks are derived from those it has and its version
//! ([`Inlining::from_symbols`]); every object on the way is checked by its type, so a
//! layout that is wrong names no inlined frame rather than a wrong one.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use super::memory::Memory;
use super::{Copy, Frames};
use crate::procs::Process;

/// Whether a mapped file may hold V8: Node.js, its shared library.
pub fn may_be_interpreter(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name == "node" || name == "nodejs" || name.starts_with("libnode.so")
}

/// V8's layout in one build, from its `v8dbg_*` symbols.
#[derive(Debug, Clone)]
pub struct Offsets {
    fp_context: i64,
    fp_function: i64,
    map: u64,
    instance_type: u64,
    js_shared: u64,
    sfi_name: u64,
    sfi_script: u64,
    script_name: u64,
    script_line_ends: u64,
    script_source: u64,
    string_length: u64,
    seq_one_chars: u64,
    seq_two_chars: u64,
    cons_first: u64,
    cons_second: u64,
    thin_actual: u64,
    sliced_parent: u64,
    sliced_offset: u64,
    fixed_length: u64,
    fixed_data: u64,
    scope_first_vars: u64,
    scope_context_locals: u64,
    type_sfi: u16,
    type_scope_info: u16,
    type_script: u16,
    type_fixed_array: u16,
    first_nonstring: u16,
    representation_mask: u16,
    encoding_mask: u16,
    seq_tag: u16,
    cons_tag: u16,
    thin_tag: u16,
    sliced_tag: u16,
    one_byte_tag: u16,
    /// `Err` with the reason when this build's code objects cannot be read: its frames
    /// are then named without their inlined functions.
    inlining: Result<Inlining, String>,
}

/// A field's offset, whatever type its symbol's suffix names (`__Object`,
/// `__Tagged_Object_`).
fn symbol_field(values: &HashMap<String, i64>, class: &str, names: &[&str]) -> Option<u64> {
    names
        .iter()
        .find_map(|name| {
            let prefix = format!("class_{class}__{name}__");
            values
                .iter()
                .find(|(key, _)| key.starts_with(&prefix))
                .map(|(_, value)| *value)
        })
        .and_then(|value| u64::try_from(value).ok())
}

fn symbol_type(values: &HashMap<String, i64>, class: &str) -> Option<u16> {
    let prefix = format!("type_{class}__");
    values
        .iter()
        .find(|(key, _)| key.starts_with(&prefix))
        .and_then(|(_, value)| u16::try_from(*value).ok())
}

/// Where a build keeps what names the functions inlined into optimized code.
#[derive(Debug, Clone)]
pub struct Inlining {
    js_code: u64,
    type_code: u16,
    /// The instructions' address (`start_is_pointer`, V8 11.1.204 and later), or where
    /// they begin within the code object.
    code_start: u64,
    start_is_pointer: bool,
    code_size: u64,
    code_positions: u64,
    code_deopt: u64,
    /// The types a position table and the deoptimization data may have (V8 12 moved
    /// both to trusted space, as other types of the same layout).
    byte_arrays: Vec<u16>,
    fixed_arrays: Vec<u16>,
    deopt_count: u64,
    deopt_literals: u64,
    deopt_inlining: u64,
    deopt_function: u64,
    /// Where the instructions begin after the start of the object holding them: an
    /// `InstructionStream` (V8 11 on: its map, then its `Code`, then the rest of its
    /// header) or, before, the code object itself.
    stream_header: u64,
}

impl Inlining {
    /// The layout from a build's symbols and version, for those the build lacks from the
    /// shape V8's `Code` had in each version (the same facts OpenTelemetry's profiler
    /// uses).
    fn from_symbols(values: &HashMap<String, i64>, js_shared: u64) -> Result<Inlining, String> {
        let number = |name: &str| values.get(name).and_then(|v| u64::try_from(*v).ok());
        let version = match (
            number("version_major"),
            number("version_minor"),
            number("version_build"),
        ) {
            (Some(major), Some(minor), Some(build)) => (major, minor, build),
            _ => return Err("no v8::internal::Version symbols".into()),
        };
        let field = |class: &str, names: &[&str]| symbol_field(values, class, names);
        let missing = |what: &str| format!("V8 {version:?}: no {what}");
        let js_code = match field("JSFunction", &["code"]) {
            Some(offset) => offset,
            // 11.7.368 moved the code before the shared function info.
            None if version >= (11, 7, 368) => js_shared
                .checked_sub(8)
                .ok_or_else(|| missing("JSFunction::code"))?,
            None => js_shared + 24,
        };
        let (code_start, code_size, code_positions) = match (
            field("Code", &["instruction_size"]),
            field("Code", &["source_position_table", "position_table"]),
        ) {
            (Some(size), positions) => {
                let start = field("Code", &["instruction_start"])
                    .ok_or_else(|| missing("Code::instruction_start"))?;
                let positions = match positions {
                    Some(positions) => Some(positions),
                    // 12.x: the table, the wrapper and the instruction stream, then the start.
                    None if symbol_type(values, "CodeWrapper").is_some() => start.checked_sub(24),
                    // 10.x: the table two words before the size.
                    None => size.checked_sub(16),
                }
                .ok_or_else(|| missing("Code::source_position_table"))?;
                (start, size, positions)
            }
            // 11.x kept only the table's symbol: the instruction stream, its start and the
            // flags follow it, then (before 11.4.59) two 16-bit fields, then the size.
            (None, Some(positions)) => {
                let start = positions + 16;
                let flags = start + 8;
                let size = flags + if version >= (11, 4, 59) { 4 } else { 8 };
                (start, size, positions)
            }
            (None, None) => return Err(missing("Code::instruction_size")),
        };
        let code_deopt = match field("Code", &["deoptimization_data"]) {
            Some(offset) => offset,
            None => code_positions
                .checked_sub(8)
                .ok_or_else(|| missing("Code::deoptimization_data"))?,
        };
        let index = |name: &str, default: u64| number(name).unwrap_or(default);
        let types = |names: &[&str]| -> Vec<u16> {
            names
                .iter()
                .filter_map(|name| symbol_type(values, name))
                .collect()
        };
        let start_is_pointer = version >= (11, 1, 204);
        let stream_header = if start_is_pointer {
            field("InstructionStream", &["instruction_start"])
                .ok_or_else(|| missing("InstructionStream::instruction_start"))?
        } else {
            code_start
        };
        Ok(Inlining {
            js_code,
            type_code: symbol_type(values, "Code").ok_or_else(|| missing("type Code"))?,
            code_start,
            start_is_pointer,
            code_size,
            code_positions,
            code_deopt,
            byte_arrays: types(&["ByteArray", "TrustedByteArray"]),
            fixed_arrays: types(&["FixedArray", "TrustedFixedArray", "ProtectedFixedArray"]),
            deopt_count: index("DeoptimizationDataInlinedFunctionCountIndex", 1),
            deopt_literals: index("DeoptimizationDataLiteralArrayIndex", 2),
            deopt_inlining: index("DeoptimizationDataInliningPositionsIndex", 7),
            deopt_function: index("DeoptimizationDataSharedFunctionInfoIndex", 6),
            stream_header,
        })
    }

    /// The bytes of a code object's header read to find its tables.
    fn header(&self) -> usize {
        let start = if self.start_is_pointer {
            self.code_start
        } else {
            0
        };
        start
            .max(self.code_size)
            .max(self.code_positions)
            .max(self.code_deopt) as usize
            + 8
    }
}

impl Offsets {
    /// The bytes of a `SharedFunctionInfo`'s header read to name it.
    fn sfi_header(&self) -> usize {
        self.map.max(self.sfi_name).max(self.sfi_script) as usize + 8
    }

    /// The layout from the values of a build's `v8dbg_*` symbols (named without the
    /// prefix); the first missing symbol is the error.
    pub fn from_symbols(values: &HashMap<String, i64>) -> Result<Offsets, String> {
        let exact = |name: &str| -> Result<i64, String> {
            values
                .get(name)
                .copied()
                .ok_or_else(|| format!("no v8dbg_{name}"))
        };
        let field = |class: &str, names: &[&str]| -> Result<u64, String> {
            symbol_field(values, class, names)
                .ok_or_else(|| format!("no v8dbg_class_{class}__{}", names.join("/")))
        };
        let type_of = |class: &str| -> Result<u16, String> {
            symbol_type(values, class).ok_or_else(|| format!("no v8dbg_type_{class}"))
        };
        let js_shared = field("JSFunction", &["shared"])?;
        let small = |name: &str| -> Result<u16, String> {
            u16::try_from(exact(name)?).map_err(|_| format!("v8dbg_{name} out of range"))
        };
        let index = |name: &str| -> Result<u64, String> {
            u64::try_from(exact(name)?).map_err(|_| format!("v8dbg_{name} out of range"))
        };
        Ok(Offsets {
            fp_context: exact("off_fp_context")?,
            fp_function: exact("off_fp_function")?,
            map: field("HeapObject", &["map"])?,
            instance_type: field("Map", &["instance_type"])?,
            js_shared,
            sfi_name: field("SharedFunctionInfo", &["name_or_scope_info"])?,
            sfi_script: field(
                "SharedFunctionInfo",
                &["script_or_debug_info", "script", "raw_script"],
            )?,
            script_name: field("Script", &["name"])?,
            script_line_ends: field("Script", &["line_ends"])?,
            script_source: field("Script", &["source"])?,
            string_length: field("String", &["length"])?,
            seq_one_chars: field("SeqOneByteString", &["chars"])?,
            seq_two_chars: field("SeqTwoByteString", &["chars"])?,
            cons_first: field("ConsString", &["first"])?,
            cons_second: field("ConsString", &["second"])?,
            thin_actual: field("ThinString", &["actual"])?,
            sliced_parent: field("SlicedString", &["parent"])?,
            sliced_offset: field("SlicedString", &["offset"])?,
            fixed_length: field("FixedArrayBase", &["length"])?,
            fixed_data: field("FixedArray", &["data"])?,
            scope_first_vars: index("scopeinfo_idx_first_vars")?,
            scope_context_locals: index("scopeinfo_idx_ncontextlocals")?,
            type_sfi: type_of("SharedFunctionInfo")?,
            type_scope_info: type_of("ScopeInfo")?,
            type_script: type_of("Script")?,
            type_fixed_array: type_of("FixedArray")?,
            first_nonstring: small("FirstNonstringType")?,
            representation_mask: small("StringRepresentationMask")?,
            encoding_mask: small("StringEncodingMask")?,
            seq_tag: small("SeqStringTag")?,
            cons_tag: small("ConsStringTag")?,
            thin_tag: small("ThinStringTag")?,
            sliced_tag: small("SlicedStringTag")?,
            one_byte_tag: small("OneByteStringTag")?,
            inlining: Inlining::from_symbols(values, js_shared),
        })
    }
}

/// A file holding V8.
#[derive(Debug, Clone)]
pub struct Binary {
    pub offsets: Result<Arc<Offsets>, String>,
    /// Builtins by file offset, sorted: their range and whether they run an interpreted
    /// function in its own frame. By offset, not address: Node.js 22 maps its builtins a
    /// second time, elsewhere, from the same file.
    builtins: Arc<Vec<(Range<u64>, bool)>>,
}

impl Binary {
    /// Reads an ELF file's postmortem symbols; `None` when it has none (not V8).
    pub fn read(path: &Path) -> Option<Binary> {
        use object::read::elf::{SectionHeader, Sym};
        let file = std::fs::File::open(path).ok()?;
        // Mapped, not read: Node.js's symbol and string tables are some 17 MB, and read
        // into memory they stayed in the agent's resident set (about 60 MB more, measured)
        // long after they were freed.
        // SAFETY: the mapping is private and read-only, and lives only in this function. A
        // file truncated meanwhile would fault the read (SIGBUS), the risk blazesym takes
        // with every binary it maps to symbolize; packages replace binaries by renaming,
        // which leaves this file whole.
        let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
        let cache: &[u8] = &map;
        let elf = object::read::elf::ElfFile64::<object::Endianness, _>::parse(cache).ok()?;
        let endian = elf.endian();
        let sections = elf.elf_section_table();
        let loads = crate::unwind::Loads::of(&elf);
        let mut values = HashMap::new();
        let mut builtins = Vec::new();
        // Node.js has some 180,000 symbols, of which a few thousand are wanted: names are
        // matched in place, in each string table.
        for table in [elf.elf_dynamic_symbol_table(), elf.elf_symbol_table()] {
            if table.is_empty() {
                continue;
            }
            let Some(strings) = sections
                .section(table.string_section())
                .ok()
                .and_then(|section| section.data(endian, cache).ok())
            else {
                continue;
            };
            for symbol in table.symbols() {
                let address = symbol.st_value(endian);
                let name = usize::try_from(symbol.st_name(endian))
                    .ok()
                    .and_then(|at| strings.get(at..))
                    .and_then(|rest| rest.split(|b| *b == 0).next())
                    .and_then(|name| std::str::from_utf8(name).ok());
                let Some(name) = name.filter(|_| address != 0) else {
                    continue;
                };
                // V8's version, for the layouts its postmortem symbols do not give.
                let version = match name {
                    "_ZN2v88internal7Version6major_E" => Some("version_major"),
                    "_ZN2v88internal7Version6minor_E" => Some("version_minor"),
                    "_ZN2v88internal7Version6build_E" => Some("version_build"),
                    _ => None,
                };
                if let Some(key) = name.strip_prefix("v8dbg_").or(version) {
                    if values.contains_key(key) {
                        continue;
                    }
                    // Each is a C `int` holding its value; those that are 0 are in
                    // `.bss`, which the file does not hold.
                    let value = loads
                        .file_offset(address)
                        .and_then(|at| usize::try_from(at).ok())
                        .and_then(|at| super::u32_at(cache, at));
                    let in_bss = sections
                        .section(object::SectionIndex(usize::from(symbol.st_shndx(endian))))
                        .is_ok_and(|section| section.sh_type(endian) == object::elf::SHT_NOBITS);
                    match value {
                        Some(value) => {
                            values.insert(key.to_string(), i64::from(value as i32));
                        }
                        None if in_bss => {
                            values.insert(key.to_string(), 0);
                        }
                        None => {}
                    }
                } else if let Some(builtin) = name.strip_prefix("Builtins_") {
                    let interpreted = builtin.starts_with("InterpreterEntryTrampoline")
                        || builtin.starts_with("InterpreterEnterAt")
                        || builtin.ends_with("Handler");
                    if let Some(offset) = loads.file_offset(address) {
                        builtins.push((offset, symbol.st_size(endian), interpreted));
                    }
                }
            }
        }
        if !values.keys().any(|key| !key.starts_with("version_")) {
            return None;
        }
        builtins.sort_unstable_by_key(|(start, _, _)| *start);
        // A builtin without a size runs to the next one.
        let ends: Vec<u64> = builtins
            .iter()
            .skip(1)
            .map(|(start, _, _)| *start)
            .chain(std::iter::once(u64::MAX))
            .collect();
        let builtins = builtins
            .iter()
            .zip(ends)
            .map(|((start, size, interpreted), next)| {
                let end = if *size > 0 { start + size } else { next };
                (*start..end, *interpreted)
            })
            .collect();
        Some(Binary {
            offsets: Offsets::from_symbols(&values).map(Arc::new),
            builtins: Arc::new(builtins),
        })
    }
}

/// What kind of code a native frame runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Code {
    /// Generated at run time: the frame is the function's, and may hold others inlined.
    Generated,
    /// The interpreter: the frame is the function's.
    Function,
    /// Another builtin: it runs in its own frame or in its caller's.
    Builtin,
    /// C, C++, or anything not V8's.
    Native,
}

/// A function as named once: name, file, line.
type Name = Arc<(String, String, i64)>;

/// A script's name and the positions where its lines end (`None` when neither V8 nor its
/// source had them: Node.js's own modules keep their source outside the heap).
#[derive(Debug)]
struct Script {
    name: String,
    line_ends: Option<Vec<u32>>,
}

/// What an optimized code object holds to name the functions inlined into it.
#[derive(Debug)]
struct Compiled {
    /// Its instructions' addresses.
    instructions: Range<u64>,
    /// The `SharedFunctionInfo` it was compiled for (untagged).
    function: u64,
    /// (offset in the instructions, source position), by offset; empty when nothing was
    /// inlined.
    positions: Vec<(u32, u64)>,
    /// Per inlining id less one: the position in the caller where it was inlined, and the
    /// index of its function in `functions`.
    inlined: Vec<(u64, i32)>,
    /// The inlined functions, named (`None` where a name could not be read).
    functions: Vec<Option<Name>>,
}

/// A code object as its header was read at a sample: its address, instructions' start and
/// size, position table and deoptimization data. A collected and reused address has
/// other tables.
type CodeKey = (u64, u64, u32, u64, u64);

/// A code object's header, as read.
#[derive(Debug, Clone, Copy)]
struct CodeHeader {
    map: u64,
    key: CodeKey,
}

impl CodeHeader {
    fn instructions(&self) -> Range<u64> {
        self.key.1..self.key.1 + u64::from(self.key.2)
    }
}

/// Code run by on-stack replacement found per process, by where its instructions start.
const MAX_REPLACED: usize = 4096;
/// The farthest below an address its code object's start is looked for.
const MAX_CODE_SEARCH: u64 = 256 << 10;

/// The most positions, inlined functions and inlining levels read from one code object.
const MAX_POSITIONS: usize = 1 << 16;
const MAX_INLINED: usize = 4096;
const MAX_DEPTH: usize = 64;
/// The tables of code objects kept per process, as HotSpot's debug information is; past
/// it they are read again.
const MAX_CODE_BYTES: usize = 4 << 20;

/// A position's inlining id, 0 where it is the code's own function's (V8's
/// `SourcePosition`: bit 0 external, 30 bits of script offset, then 16 of inlining id
/// plus one).
fn inlining_id(position: u64) -> usize {
    ((position >> 31) & 0xffff) as usize
}

/// A position table's entries: V8's zigzag varints, each entry the difference from the
/// last in code offset (negative for an expression rather than a statement) and source
/// position. `None` where it is cut short or too long.
fn decode_positions(table: &[u8]) -> Option<Vec<(u32, u64)>> {
    fn varint(table: &[u8], at: &mut usize) -> Option<i64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *table.get(*at)?;
            *at += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(((value >> 1) as i64) ^ -((value & 1) as i64));
            }
        }
        None
    }
    let (mut at, mut offset, mut position) = (0, 0i64, 0i64);
    let mut out = Vec::new();
    while at < table.len() {
        let delta = varint(table, &mut at)?;
        offset += if delta >= 0 { delta } else { -(delta + 1) };
        position = position.wrapping_add(varint(table, &mut at)?);
        if out.len() == MAX_POSITIONS {
            return None;
        }
        out.push((u32::try_from(offset).ok()?, position as u64));
    }
    Some(out)
}

impl Compiled {
    /// The functions inlined at `address`, innermost first; `None` when the chain does
    /// not hold together.
    fn inlined_at(&self, address: u64) -> Option<Vec<Name>> {
        if !self.instructions.contains(&address) {
            return None;
        }
        let offset = address - self.instructions.start;
        let index = self
            .positions
            .partition_point(|(at, _)| u64::from(*at) <= offset);
        let mut position = self.positions.get(index.checked_sub(1)?)?.1;
        let mut out = Vec::new();
        let mut last = usize::MAX;
        while inlining_id(position) != 0 {
            let id = inlining_id(position);
            // Each level's caller was inlined before it: ids only fall.
            if id >= last || out.len() == MAX_DEPTH {
                return None;
            }
            let (caller, function) = *self.inlined.get(id - 1)?;
            let name = self
                .functions
                .get(usize::try_from(function).ok()?)?
                .clone()?;
            out.push(name);
            position = caller;
            last = id;
        }
        Some(out)
    }

    fn bytes(&self) -> usize {
        self.positions.len() * 16 + self.inlined.len() * 16 + self.functions.len() * 8 + 64
    }
}

/// One Node.js process.
#[derive(Debug)]
pub struct Runtime {
    offsets: Arc<Offsets>,
    builtins: Arc<Vec<(Range<u64>, bool)>>,
    mapped: String,
    memory: Memory,
    /// The map every `SharedFunctionInfo` has, once one was seen.
    sfi_map: Option<u64>,
    /// Instance types by map.
    types: HashMap<u64, u16>,
    /// By `SharedFunctionInfo` and its name-or-scope-info.
    names: HashMap<(u64, u64), Option<Name>>,
    scripts: HashMap<u64, Option<Arc<Script>>>,
    /// The name last read for each function: for the samples still unread when the
    /// process exits, whose memory is gone by then.
    last: HashMap<u64, Name>,
    /// Optimized code objects read, `None` for those with nothing inlined or unreadable.
    codes: HashMap<CodeKey, Option<Arc<Compiled>>>,
    code_bytes: usize,
    /// The map of the objects holding instructions, once one was seen.
    stream_map: Option<u64>,
    /// Code found from an address outside its function's current code: start → (end,
    /// code object).
    replaced: std::collections::BTreeMap<u64, (u64, u64)>,
    /// Pages (address >> 12) where none was found, with the lookups since.
    unfound: HashMap<u64, u8>,
}

/// Names and scripts kept per process; past it they are read again.
const MAX_NAMES: usize = 50_000;
/// The longest name or path read.
const MAX_NAME_BYTES: usize = 4096;
/// The longest source read to find line ends where V8 has not computed them.
const MAX_SOURCE_BYTES: usize = 16 << 20;

fn tagged(value: u64) -> Option<u64> {
    (value & 3 == 1).then(|| value - 1)
}

fn smi(value: u64) -> Option<i64> {
    (value & 1 == 0).then_some((value as i64) >> 32)
}

impl Runtime {
    /// The process's V8, from its binary mapped from `mapped`.
    pub fn new(pid: u32, binary: &Binary, mapped: &str) -> Result<Runtime, String> {
        let offsets = binary.offsets.clone()?;
        Ok(Runtime {
            offsets,
            builtins: binary.builtins.clone(),
            mapped: mapped.to_string(),
            memory: Memory { pid },
            sfi_map: None,
            types: HashMap::new(),
            names: HashMap::new(),
            scripts: HashMap::new(),
            last: HashMap::new(),
            codes: HashMap::new(),
            code_bytes: 0,
            stream_map: None,
            replaced: std::collections::BTreeMap::new(),
            unfound: HashMap::new(),
        })
    }

    fn code(&self, address: u64, process: &Process) -> Code {
        match process.mapping(address) {
            Some(mapping) if mapping.path == self.mapped => {
                let at = mapping.file_offset(address);
                let index = self.builtins.partition_point(|(r, _)| r.start <= at);
                match index.checked_sub(1).and_then(|i| self.builtins.get(i)) {
                    Some((range, true)) if range.contains(&at) => Code::Function,
                    Some((range, false)) if range.contains(&at) => Code::Builtin,
                    _ => Code::Native,
                }
            }
            Some(mapping) if mapping.is_file() || mapping.path.starts_with('[') => Code::Native,
            _ => Code::Generated,
        }
    }

    /// The sample's user stack with its JavaScript functions in place, and the outcome
    /// to count.
    pub fn join(
        &mut self,
        native: Vec<u64>,
        copy: &Copy<'_>,
        frames: &mut Frames,
    ) -> (Vec<u64>, &'static str) {
        // `last` grows with functions, not their code: closures made anew in a loop
        // each have one.
        if [
            self.names.len(),
            self.scripts.len(),
            self.last.len(),
            self.codes.len(),
        ]
        .iter()
        .any(|n| *n > MAX_NAMES)
        {
            self.names.clear();
            self.scripts.clear();
            self.types.clear();
            self.last.clear();
            self.codes.clear();
            self.code_bytes = 0;
            self.replaced.clear();
            self.unfound.clear();
        }
        // The frames that may be JavaScript's, each frame pointer once: (depth, code,
        // function, the address it runs at).
        let mut candidates: Vec<(usize, Code, u64, u64)> = Vec::new();
        let mut seen: Vec<u64> = Vec::new();
        for (depth, address) in native.iter().enumerate() {
            let lookup = if depth == 0 {
                *address
            } else {
                address.saturating_sub(1)
            };
            let code = self.code(lookup, copy.process);
            let base = copy.bases.get(depth).copied().unwrap_or(0);
            if code == Code::Native || base == 0 || seen.contains(&base) {
                continue;
            }
            if let Some(function) = self.frame_function(base, copy) {
                seen.push(base);
                candidates.push((depth, code, function, lookup));
            }
        }
        // Only generated code has others inlined into it.
        let functions: Vec<(u64, Option<u64>)> = candidates
            .iter()
            .map(|(_, code, f, at)| (*f, (*code == Code::Generated).then_some(*at)))
            .collect();
        let names = self.functions(&functions);
        let mut out = Vec::with_capacity(native.len() + candidates.len());
        let (mut named, mut unreadable) = (0, 0);
        let mut next = candidates.iter().zip(names).peekable();
        for (depth, address) in native.iter().enumerate() {
            let Some(((_, code, _, _), name)) = next.next_if(|((at, ..), _)| *at == depth) else {
                out.push(*address);
                continue;
            };
            match name {
                Some((name, inlined)) => {
                    named += 1;
                    // The function alone, or with those inlined where it ran.
                    let id = frames.intern_inlined(
                        inlined
                            .iter()
                            .chain(std::iter::once(&name))
                            .map(|name| (*name).as_ref().clone())
                            .collect(),
                    );
                    if *code == Code::Builtin {
                        out.push(*address);
                    }
                    out.push(id);
                }
                None => {
                    unreadable += 1;
                    out.push(*address);
                }
            }
        }
        let outcome = if unreadable > 0 {
            "code object unreadable"
        } else if named > 0 {
            "named"
        } else {
            "no javascript frames"
        };
        (out, outcome)
    }

    /// The function of the frame at `base`, from the stack copy; `None` when it is no
    /// JavaScript frame.
    fn frame_function(&self, base: u64, copy: &Copy<'_>) -> Option<u64> {
        let context = copy.word(base.wrapping_add_signed(self.offsets.fp_context))?;
        let function = copy.word(base.wrapping_add_signed(self.offsets.fp_function))?;
        // A typed frame (entry, exit, stub) holds a small integer marker where a
        // JavaScript frame holds its context.
        tagged(context)?;
        tagged(function)
    }

    /// The names of a sample's functions, each with those inlined where it ran (innermost
    /// first), `None` for each that could not be read. A function is given with the
    /// address its frame runs at where that is generated code. The process's memory is
    /// read twice per sample, however many frames: every function's `SharedFunctionInfo`
    /// and code, then all their headers (and once per code object, its tables).
    fn functions(&mut self, functions: &[(u64, Option<u64>)]) -> Vec<Option<(Name, Vec<Name>)>> {
        if functions.is_empty() {
            return Vec::new();
        }
        let o = self.offsets.clone();
        let inlining = o.inlining.as_ref().ok();
        // Per function: its shared info's word, and its code's where it may have inlined.
        let mut ranges: Vec<(u64, usize)> = Vec::with_capacity(functions.len() * 2);
        for (function, at) in functions {
            ranges.push((function + o.js_shared, 8));
            if let (Some(layout), Some(_)) = (inlining, at) {
                ranges.push((function + layout.js_code, 8));
            }
        }
        let mut words = vec![0u8; ranges.len() * 8];
        let read = self.memory.read_many(&ranges, &mut words);
        let mut words = read.iter().zip(words.chunks_exact(8)).map(|(ok, word)| {
            ok.then(|| super::u64_at(word, 0))
                .flatten()
                .and_then(tagged)
        });
        let mut shared = Vec::with_capacity(functions.len());
        let mut codes = Vec::with_capacity(functions.len());
        for (_, at) in functions {
            shared.push(words.next().flatten());
            codes.push(match (inlining, at) {
                (Some(_), Some(at)) => words.next().flatten().map(|code| (code, *at)),
                _ => None,
            });
        }
        let header = o.sfi_header();
        let code_header = inlining.map_or(0, Inlining::header);
        let mut ranges: Vec<(u64, usize)> =
            shared.iter().flatten().map(|sfi| (*sfi, header)).collect();
        let sfis = ranges.len();
        ranges.extend(codes.iter().flatten().map(|(code, _)| (*code, code_header)));
        let mut headers = vec![0u8; sfis * header + (ranges.len() - sfis) * code_header];
        let read = self.memory.read_many(&ranges, &mut headers);
        let (sfi_bytes, code_bytes) = headers.split_at(sfis * header);
        let mut sfi_read = read[..sfis].iter().zip(sfi_bytes.chunks_exact(header));
        let mut code_read = read[sfis..]
            .iter()
            .zip(code_bytes.chunks_exact(code_header.max(1)));
        let mut names = Vec::with_capacity(functions.len());
        for (((function, _), sfi), code) in functions.iter().zip(&shared).zip(&codes) {
            let named = match sfi {
                // Memory that cannot be read: the process has exited since the sample.
                None if !self.alive() => self.last.get(function).cloned(),
                None => None,
                Some(sfi) => match sfi_read.next() {
                    Some((true, chunk)) => self.shared(*sfi, chunk),
                    _ => None,
                },
            };
            let inlined = match (code, code.and_then(|_| code_read.next()), sfi) {
                (Some((code, at)), Some((true, chunk)), Some(sfi)) => {
                    self.inlined(*code, chunk, *at, *sfi).unwrap_or_default()
                }
                _ => Vec::new(),
            };
            if let Some(name) = &named {
                self.last.insert(*function, name.clone());
            }
            names.push(named.map(|name| (name, inlined)));
        }
        names
    }

    /// A code object's header fields, from its bytes as read.
    fn code_header(&self, code: u64, header: &[u8]) -> Option<CodeHeader> {
        let layout = self.offsets.inlining.as_ref().ok()?;
        let word = |at: u64| super::u64_at(header, usize::try_from(at).ok()?);
        let start = if layout.start_is_pointer {
            word(layout.code_start)?
        } else {
            code + layout.code_start
        };
        let size = super::u32_at(header, usize::try_from(layout.code_size).ok()?)?;
        let (positions, deopt) = (word(layout.code_positions)?, word(layout.code_deopt)?);
        Some(CodeHeader {
            map: word(self.offsets.map)?,
            key: (code, start, size, positions, deopt),
        })
    }

    /// The functions inlined where a frame of `function` (its `SharedFunctionInfo`) ran
    /// at `at`, innermost first. The code is its function's current code or, when that
    /// does not hold the address, the code object the address lies in: a long loop runs
    /// the code on-stack replacement compiled for it, which its function never points to.
    fn inlined(&mut self, code: u64, header: &[u8], at: u64, function: u64) -> Option<Vec<Name>> {
        let mut header = self.code_header(code, header)?;
        if !header.instructions().contains(&at) {
            header = match self.replaced_header(at) {
                Some(header) => header,
                // A range found before whose code has gone: forgotten, and found anew.
                None => {
                    let stale = self
                        .replaced
                        .range(..=at)
                        .next_back()
                        .filter(|(_, (end, _))| at < *end)
                        .map(|(start, _)| *start);
                    self.replaced.remove(&stale?);
                    self.replaced_header(at)?
                }
            };
        } else if self.stream_map.is_none() {
            self.learn_stream_map(&header);
        }
        let compiled = self.compiled(&header)?;
        if compiled.function != function {
            return None;
        }
        compiled.inlined_at(at)
    }

    /// The header of the code object found to hold `at` ([`Runtime::code_at`]), when it
    /// still does.
    fn replaced_header(&mut self, at: u64) -> Option<CodeHeader> {
        let code = self.code_at(at)?;
        let bytes = self.read_code_header(code)?;
        let header = self.code_header(code, &bytes)?;
        header.instructions().contains(&at).then_some(header)
    }

    fn read_code_header(&self, code: u64) -> Option<Vec<u8>> {
        let length = self.offsets.inlining.as_ref().ok()?.header();
        self.memory.bytes(code, length, length)
    }

    /// Notes the map of the objects holding instructions, from a code object known good.
    fn learn_stream_map(&mut self, header: &CodeHeader) {
        let offsets = self.offsets.clone();
        let Some(layout) = offsets.inlining.as_ref().ok() else {
            return;
        };
        if self.map_type(header.map) != Some(layout.type_code) {
            return;
        }
        self.stream_map = if layout.start_is_pointer {
            self.memory.u64(header.key.1 - layout.stream_header)
        } else {
            Some(header.map)
        };
    }

    /// The code object whose instructions hold `at`, found by the header of the object
    /// holding them just below it (objects in code space lie end to end); `None` when the
    /// nearest header below is not one, or is another's.
    fn code_at(&mut self, at: u64) -> Option<u64> {
        if let Some((_, (end, code))) = self.replaced.range(..=at).next_back() {
            if at < *end {
                return Some(*code);
            }
        }
        // A page searched in vain is searched again at every 64th address that asks: code
        // space is reused as the collector frees code.
        if let Some(misses) = self.unfound.get_mut(&(at >> 12)) {
            *misses = misses.wrapping_add(1);
            if *misses % 64 != 0 {
                return None;
            }
        }
        // Nothing to look for before a code object has shown its container's map.
        self.stream_map?;
        match self.search_code(at) {
            Some((range, code)) => {
                if self.replaced.len() >= MAX_REPLACED {
                    self.replaced.clear();
                }
                self.unfound.remove(&(at >> 12));
                self.replaced.insert(range.start, (range.end, code));
                Some(code)
            }
            None => {
                if self.unfound.len() >= MAX_REPLACED {
                    self.unfound.clear();
                }
                self.unfound.entry(at >> 12).or_insert(0);
                None
            }
        }
    }

    fn search_code(&mut self, at: u64) -> Option<(Range<u64>, u64)> {
        let layout = self.offsets.inlining.as_ref().ok()?.clone();
        let map = self.stream_map?;
        // Instructions start 32-byte aligned (64 in newer V8, which is also 32).
        const STEP: u64 = 32;
        const WINDOW: u64 = 4096;
        let mut top = at & !(STEP - 1);
        let floor = at.saturating_sub(MAX_CODE_SEARCH);
        while top > floor {
            let low = top.saturating_sub(WINDOW).max(floor);
            let base = low.saturating_sub(layout.stream_header);
            let bytes = self
                .memory
                .bytes(base, (top - base + 16) as usize, 2 * WINDOW as usize)?;
            let mut start = top;
            while start >= low && start > layout.stream_header {
                let object = start - layout.stream_header;
                let word =
                    |at: u64| super::u64_at(&bytes, usize::try_from(at.checked_sub(base)?).ok()?);
                if word(object) == Some(map) {
                    let code = if layout.start_is_pointer {
                        tagged(word(object + 8)?)?
                    } else {
                        object
                    };
                    let bytes = self.read_code_header(code)?;
                    let header = self.code_header(code, &bytes)?;
                    let range = header.instructions();
                    return (range.start == start && range.contains(&at)).then_some((range, code));
                }
                start -= STEP;
            }
            top = low;
        }
        None
    }

    /// A code object's tables, from its header as read; `None` when it is not optimized
    /// code with something inlined, or does not read as one.
    fn compiled(&mut self, header: &CodeHeader) -> Option<Arc<Compiled>> {
        let key = header.key;
        if let Some(known) = self.codes.get(&key) {
            return known.clone();
        }
        let layout = self.offsets.inlining.as_ref().ok()?.clone();
        let (_, start, size, positions, deopt) = key;
        let read = self.read_compiled(header.map, start, size, positions, deopt, &layout);
        let read = read.map(Arc::new);
        self.code_bytes += read.as_ref().map_or(0, |c| c.bytes()) + 48;
        if self.code_bytes > MAX_CODE_BYTES {
            self.codes.clear();
            self.code_bytes = 0;
        }
        self.codes.insert(key, read.clone());
        read
    }

    /// Reads a code object's inlining tables: its deoptimization data (the count of
    /// inlined functions, their `SharedFunctionInfo`s among the literals, one
    /// `InliningPosition` per id) and its source position table.
    fn read_compiled(
        &mut self,
        map: u64,
        start: u64,
        size: u32,
        positions: u64,
        deopt: u64,
        layout: &Inlining,
    ) -> Option<Compiled> {
        let o = self.offsets.clone();
        if self.map_type(map)? != layout.type_code {
            return None;
        }
        // Interpreted and baseline code keep other things where optimized code keeps its
        // deoptimization data.
        if !layout.fixed_arrays.contains(&self.type_of(deopt)?) {
            return None;
        }
        let deopt = tagged(deopt)?;
        let slots = layout
            .deopt_count
            .max(layout.deopt_literals)
            .max(layout.deopt_inlining)
            .max(layout.deopt_function)
            + 1;
        let length = smi(self.memory.u64(deopt + o.fixed_length)?)?;
        if u64::try_from(length).ok()? < slots {
            return None;
        }
        let data = self
            .memory
            .bytes(deopt + o.fixed_data, slots as usize * 8, 4096)?;
        let slot = |i: u64| super::u64_at(&data, usize::try_from(i).ok()? * 8);
        let function = tagged(slot(layout.deopt_function)?)?;
        let count = usize::try_from(smi(slot(layout.deopt_count)?)?).ok()?;
        if count == 0 || count > MAX_INLINED {
            return None;
        }
        // The inlined functions come first among the literals, held weakly (a weak
        // reference is the pointer with its second bit set).
        let literals = tagged(slot(layout.deopt_literals)?)?;
        let words = self
            .memory
            .bytes(literals + o.fixed_data, count * 8, MAX_INLINED * 8)?;
        let sfis: Vec<u64> = words
            .chunks_exact(8)
            .map(|word| super::u64_at(word, 0).map_or(0, |value| value & !2))
            .collect();
        // One `InliningPosition` (a position, then the function's index) per id.
        let table = |this: &mut Runtime, value: u64, limit: usize| -> Option<Vec<u8>> {
            if !layout.byte_arrays.contains(&this.type_of(value)?) {
                return None;
            }
            let array = tagged(value)?;
            let length = usize::try_from(smi(this.memory.u64(array + o.fixed_length)?)?).ok()?;
            this.memory.bytes(array + o.fixed_data, length, limit)
        };
        let inlined: Vec<(u64, i32)> = table(self, slot(layout.deopt_inlining)?, MAX_INLINED * 16)?
            .chunks_exact(16)
            .map(|entry| {
                let position = super::u64_at(entry, 0).unwrap_or(0);
                let function = super::u32_at(entry, 8).map_or(-1, |f| f as i32);
                (position, function)
            })
            .collect();
        let positions = decode_positions(&table(self, positions, MAX_POSITIONS * 8)?)?;
        let header = o.sfi_header();
        let functions = sfis
            .into_iter()
            .map(|sfi| {
                let sfi = tagged(sfi)?;
                let bytes = self.memory.bytes(sfi, header, header)?;
                self.shared(sfi, &bytes)
            })
            .collect();
        Some(Compiled {
            instructions: start..start + u64::from(size),
            function,
            positions,
            inlined,
            functions,
        })
    }

    /// Whether the process still runs.
    fn alive(&self) -> bool {
        std::path::Path::new(&format!("/proc/{}", self.memory.pid)).exists()
    }

    /// Names a `SharedFunctionInfo` from its header as read.
    fn shared(&mut self, shared: u64, header: &[u8]) -> Option<Name> {
        let word = |at: u64| super::u64_at(header, usize::try_from(at).ok()?);
        let o = &self.offsets;
        let (map, name, script) = (word(o.map)?, word(o.sfi_name)?, word(o.sfi_script)?);
        match self.sfi_map {
            Some(known) if known != map => return None,
            Some(_) => {}
            None => {
                if self.map_type(map)? != self.offsets.type_sfi {
                    return None;
                }
                self.sfi_map = Some(map);
            }
        }
        if let Some(known) = self.names.get(&(shared, name)) {
            return known.clone();
        }
        let described = self.describe(name, script);
        self.names.insert((shared, name), described.clone());
        described
    }

    fn describe(&mut self, name: u64, script: u64) -> Option<Name> {
        let (function, start) = match self.type_of(name)? {
            t if t == self.offsets.type_scope_info => self.scope_info(tagged(name)?),
            t if t < self.offsets.first_nonstring => (self.string(name, MAX_NAME_BYTES), None),
            _ => (None, None),
        };
        let function = match function {
            Some(function) if !function.is_empty() => function,
            _ => "(anonymous)".to_string(),
        };
        let script = match self.type_of(script) {
            Some(t) if t == self.offsets.type_script => self.script(tagged(script)?),
            _ => None,
        };
        let (file, line) = match &script {
            Some(script) => (
                script.name.clone(),
                match (start, &script.line_ends) {
                    (Some(start), Some(ends)) => line_of(ends, start),
                    _ => 0,
                },
            ),
            None => (String::new(), 0),
        };
        Some(Arc::new((function, file, line)))
    }

    /// The name in a `ScopeInfo`, and the position where its function starts.
    fn scope_info(&mut self, scope: u64) -> (Option<String>, Option<u32>) {
        // ScopeInfo is a HeapObject (V8 9.1 and later): its slots follow the map.
        let data = scope + self.offsets.map + 8;
        let mut slots = [0u8; 16 * 8];
        if !self.memory.read(data, &mut slots) {
            return (None, None);
        }
        let slot = |i: u64| super::u64_at(&slots, usize::try_from(i).ok()?.checked_mul(8)?);
        let locals = slot(self.offsets.scope_context_locals)
            .and_then(smi)
            .and_then(|n| u64::try_from(n).ok())
            .unwrap_or(0);
        let mut name = None;
        let mut previous = 1u64; // not a small integer
        let first = self.offsets.scope_first_vars.saturating_add(2 * locals);
        for i in first..16 {
            let Some(value) = slot(i) else { break };
            if name.is_none() && tagged(value).is_some() {
                name = self.string(value, MAX_NAME_BYTES);
            }
            if let (Some(start), Some(end)) = (smi(previous), smi(value)) {
                if (0..end).contains(&start) {
                    return (name, u32::try_from(start).ok());
                }
            }
            previous = value;
        }
        (name, None)
    }

    fn script(&mut self, script: u64) -> Option<Arc<Script>> {
        if let Some(known) = self.scripts.get(&script) {
            return known.clone();
        }
        let o = self.offsets.clone();
        let read = |this: &mut Runtime| -> Option<Script> {
            let name = this
                .memory
                .u64(script + o.script_name)
                .and_then(|name| this.string(name, MAX_NAME_BYTES))
                .unwrap_or_default();
            let ends = this.memory.u64(script + o.script_line_ends)?;
            let line_ends = match this.type_of(ends) {
                Some(t) if t == o.type_fixed_array => this.line_ends(tagged(ends)?),
                _ => None,
            };
            // V8 computes line ends on demand: until then they are found in the source.
            let line_ends = line_ends.or_else(|| {
                let source = this.memory.u64(script + o.script_source)?;
                // Positions count UTF-16 units, as V8's do.
                let mut units = Vec::new();
                this.string_units(source, MAX_SOURCE_BYTES, 16, &mut units)?;
                Some(
                    units
                        .iter()
                        .enumerate()
                        .filter(|(_, unit)| **unit == u16::from(b'\n'))
                        .map(|(at, _)| at as u32)
                        .collect(),
                )
            });
            Some(Script { name, line_ends })
        };
        let script_info = read(self).map(Arc::new);
        self.scripts.insert(script, script_info.clone());
        script_info
    }

    fn line_ends(&self, array: u64) -> Option<Vec<u32>> {
        let length = smi(self.memory.u64(array + self.offsets.fixed_length)?)?;
        let length = usize::try_from(length).ok().filter(|n| *n <= 4 << 20)?;
        let bytes = self
            .memory
            .bytes(array + self.offsets.fixed_data, length * 8, 32 << 20)?;
        bytes
            .chunks_exact(8)
            .map(|word| u32::try_from(smi(super::u64_at(word, 0)?)?).ok())
            .collect()
    }

    /// The instance type of the object a tagged pointer points to.
    fn type_of(&mut self, value: u64) -> Option<u16> {
        let object = tagged(value)?;
        let map = self.memory.u64(object + self.offsets.map)?;
        self.map_type(map)
    }

    fn map_type(&mut self, map: u64) -> Option<u16> {
        if let Some(known) = self.types.get(&map) {
            return Some(*known);
        }
        let mut bytes = [0u8; 2];
        if !self
            .memory
            .read(tagged(map)? + self.offsets.instance_type, &mut bytes)
        {
            return None;
        }
        let value = u16::from_le_bytes(bytes);
        self.types.insert(map, value);
        Some(value)
    }

    /// A string's text, at most `limit` bytes of it; `None` for representations not read
    /// (external strings live outside the heap, behind a C++ object).
    fn string(&mut self, value: u64, limit: usize) -> Option<String> {
        let mut units = Vec::new();
        self.string_units(value, limit, 16, &mut units)?;
        Some(String::from_utf16_lossy(&units))
    }

    fn string_units(
        &mut self,
        value: u64,
        limit: usize,
        depth: u32,
        out: &mut Vec<u16>,
    ) -> Option<()> {
        let kind = self.type_of(value)?;
        let o = self.offsets.clone();
        if kind >= o.first_nonstring || depth == 0 {
            return None;
        }
        let object = tagged(value)?;
        let length = usize::try_from(self.memory.u32(object + o.string_length)?).ok()?;
        if out.len() + length > limit {
            return None;
        }
        let representation = kind & o.representation_mask;
        if representation == o.seq_tag {
            if kind & o.encoding_mask == o.one_byte_tag {
                let bytes = self.memory.bytes(object + o.seq_one_chars, length, limit)?;
                out.extend(bytes.iter().map(|b| u16::from(*b)));
            } else {
                let bytes = self
                    .memory
                    .bytes(object + o.seq_two_chars, length * 2, limit * 2)?;
                out.extend(
                    bytes
                        .chunks_exact(2)
                        .map(|pair| u16::from_le_bytes([pair[0], pair[1]])),
                );
            }
            Some(())
        } else if representation == o.cons_tag {
            let first = self.memory.u64(object + o.cons_first)?;
            let second = self.memory.u64(object + o.cons_second)?;
            self.string_units(first, limit, depth - 1, out)?;
            self.string_units(second, limit, depth - 1, out)
        } else if representation == o.thin_tag {
            let actual = self.memory.u64(object + o.thin_actual)?;
            self.string_units(actual, limit, depth - 1, out)
        } else if representation == o.sliced_tag {
            let parent = self.memory.u64(object + o.sliced_parent)?;
            let offset = usize::try_from(smi(self.memory.u64(object + o.sliced_offset)?)?).ok()?;
            let mut whole = Vec::new();
            self.string_units(parent, limit.saturating_add(offset), depth - 1, &mut whole)?;
            out.extend(whole.get(offset..offset.checked_add(length)?)?);
            Some(())
        } else {
            None
        }
    }

    pub fn bytes(&self) -> usize {
        self.names
            .values()
            .flatten()
            .map(|name| name.0.len() + name.1.len() + 64)
            .sum::<usize>()
            + self
                .scripts
                .values()
                .flatten()
                .map(|script| {
                    script.name.len() + script.line_ends.as_ref().map_or(0, Vec::len) * 4 + 64
                })
                .sum::<usize>()
            + self.types.len() * 16
            + self.last.len() * 24
            + self.code_bytes
    }
}

/// The 1-based line holding source position `position`, given where lines end.
pub fn line_of(line_ends: &[u32], position: u32) -> i64 {
    line_ends.partition_point(|end| *end < position) as i64 + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_fall_on_their_lines() {
        // "ab\ncd\n\nef": lines end at 2, 5 and 6.
        let ends = [2, 5, 6];
        assert_eq!(line_of(&ends, 0), 1);
        assert_eq!(line_of(&ends, 2), 1);
        assert_eq!(line_of(&ends, 3), 2);
        assert_eq!(line_of(&ends, 6), 3);
        assert_eq!(line_of(&ends, 7), 4);
        assert_eq!(line_of(&[], 9), 1);
    }

    #[test]
    fn values_are_told_apart_by_their_tags() {
        assert_eq!(tagged(0x1001), Some(0x1000));
        assert_eq!(tagged(0x1000), None);
        assert_eq!(tagged(0x1003), None);
        assert_eq!(smi(7 << 32), Some(7));
        assert_eq!(smi((-2i64 as u64) << 32), Some(-2));
        assert_eq!(smi(0x1001), None);
    }

    /// Encodes as V8's `SourcePositionTableBuilder` does: zigzag varints of the
    /// differences, a statement's code offset as is and an expression's as `-(d + 1)`.
    fn encode(entries: &[(u32, u64, bool)]) -> Vec<u8> {
        fn varint(out: &mut Vec<u8>, value: i64) {
            let mut value = ((value << 1) ^ (value >> 63)) as u64;
            loop {
                let more = value > 0x7f;
                out.push((value as u8 & 0x7f) | if more { 0x80 } else { 0 });
                value >>= 7;
                if !more {
                    break;
                }
            }
        }
        let (mut out, mut offset, mut position) = (Vec::new(), 0i64, 0i64);
        for (at, pos, statement) in entries {
            let delta = i64::from(*at) - offset;
            varint(&mut out, if *statement { delta } else { -delta - 1 });
            varint(&mut out, *pos as i64 - position);
            (offset, position) = (i64::from(*at), *pos as i64);
        }
        out
    }

    fn position(script_offset: u64, inlining: u64) -> u64 {
        ((script_offset + 1) << 1) | (inlining << 31)
    }

    #[test]
    fn positions_decode_and_name_the_inlined_chain() {
        // main's own code, then b inlined into a inlined into main, then main again.
        let entries = [
            (0, position(92, 0), true),
            (0x39, position(149, 0), false),
            (0x107, position(26, 1), true),
            (0x143, position(39, 2), false),
            (0x19f, position(159, 0), true),
        ];
        let table = encode(&entries);
        let decoded = decode_positions(&table).expect("decodes");
        assert_eq!(
            decoded,
            entries.iter().map(|(a, p, _)| (*a, *p)).collect::<Vec<_>>()
        );
        let name = |n: &str| Some(Arc::new((n.to_string(), "app.js".to_string(), 1)));
        let compiled = Compiled {
            instructions: 0x1000..0x1400,
            function: 0x5000,
            positions: decoded,
            // id 1: a, inlined into main at 149; id 2: b, inlined into a at 30.
            inlined: vec![(position(149, 0), 0), (position(30, 1), 1)],
            functions: vec![name("a"), name("b")],
        };
        let names = |at: u64| {
            compiled
                .inlined_at(at)
                .map(|chain| chain.iter().map(|n| n.0.clone()).collect::<Vec<_>>())
        };
        assert_eq!(names(0x1000), Some(vec![]));
        assert_eq!(names(0x1107), Some(vec!["a".to_string()]));
        assert_eq!(names(0x1150), Some(vec!["b".to_string(), "a".to_string()]));
        assert_eq!(names(0x13ff), Some(vec![]));
        // Past the instructions (code replaced since the sample): nothing.
        assert_eq!(names(0x1400), None);
        assert_eq!(names(0x0fff), None);
        // A chain that does not fall (or names a function not there) names nothing.
        let looped = Compiled {
            inlined: vec![(position(1, 2), 0), (position(1, 1), 1)],
            ..compiled
        };
        assert_eq!(looped.inlined_at(0x1107).map(|c| c.len()), None);
        // Cut short: no entries rather than wrong ones.
        assert_eq!(decode_positions(&table[..table.len() - 1]), None);
    }

    #[test]
    fn names() {
        assert!(may_be_interpreter("/usr/bin/node"));
        assert!(may_be_interpreter(
            "/usr/lib/x86_64-linux-gnu/libnode.so.108"
        ));
        assert!(!may_be_interpreter("/usr/bin/nodemon"));
    }

    /// The Node.js builds here (the one installed, and those scripts/test.sh unpacks) have
    /// their layouts read whole.
    #[test]
    fn the_node_builds_here_are_read() {
        let mut paths = vec![std::path::PathBuf::from("/usr/bin/node")];
        let cache = std::env::var_os("KILN_TEST_NODE")
            .map(std::path::PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/kiln-test-node"))
            });
        if let Some(Ok(entries)) = cache.map(std::fs::read_dir) {
            paths.extend(entries.flatten().map(|e| e.path().join("package/bin/node")));
        }
        let paths: Vec<_> = paths.into_iter().filter(|p| p.exists()).collect();
        if paths.is_empty() {
            eprintln!("skipped: no node here");
            return;
        }
        for path in paths {
            let binary = Binary::read(&path).expect("v8dbg symbols");
            let offsets = binary
                .offsets
                .unwrap_or_else(|err| panic!("{path:?}: {err}"));
            // x64: the context, then the function, below the saved frame pointer.
            assert_eq!(
                (offsets.fp_context, offsets.fp_function),
                (-8, -16),
                "{path:?}"
            );
            assert_eq!(offsets.map, 0);
            assert!(offsets.type_sfi != offsets.type_script);
            // Every build here has its code objects' layout, derived or given.
            let inlining = offsets
                .inlining
                .as_ref()
                .unwrap_or_else(|err| panic!("{path:?}: {err}"));
            assert!(
                inlining.code_deopt < inlining.code_positions
                    && !inlining.byte_arrays.is_empty()
                    && !inlining.fixed_arrays.is_empty(),
                "{path:?}: {inlining:?}"
            );
            let interpreter = binary.builtins.iter().filter(|(_, i)| *i).count();
            let others = binary.builtins.len() - interpreter;
            // The trampoline and a few hundred bytecode handlers; the rest are builtins.
            assert!(
                interpreter > 100 && others > 500,
                "{path:?}: {interpreter} {others}"
            );
        }
    }
}
