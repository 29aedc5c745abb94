//! Java: HotSpot's methods named from its own frames and code cache, with no change to
//! the program (no agent loaded, no `-XX:+PreserveFramePointer`, no perf map).
//!
//! All of a JVM's Java code runs from its code cache: the template interpreter, the
//! methods C1 and C2 compiled (`nmethod`s), and the stubs between them. None of it has
//! call-frame information, and C2's code uses the frame-pointer register for other
//! things, so the binaries' CFI cannot walk it and frame pointers mislead. HotSpot
//! describes its own frames instead, and this module walks them over the sample's stack
//! copy ([`crate::unwind::Jit`]), handing back to the CFI at the first frame outside the
//! code cache:
//! - a compiled frame (an `nmethod`, or a runtime stub) has a fixed size
//!   (`CodeBlob::_frame_size`, in words, return address and saved frame pointer
//!   included), so its caller's stack pointer is its own plus that size;
//! - an interpreted frame keeps a frame pointer, with its `Method*` three words below it
//!   and its bytecode pointer eight words below (x86-64's `frame_x86.hpp` layout), and
//!   the caller's unextended stack pointer one word below;
//! - the call stub that enters Java from C++ keeps a frame pointer too.
//!
//! The code blob holding a pc is found as HotSpot finds it: through its code heap's
//! segment map (one byte per 128-byte segment, each the distance back to its block's
//! start). Blobs are read once and cached by address; an `nmethod`'s debug information is
//! decoded then, from its `PcDesc`s and scopes, into the chain of (method, bytecode
//! index) at each of its call sites and safepoints: a method C2 inlined into its caller is
//! there as a frame of its own, and gets the time spent in it. A blob read from the cache
//! is checked after each walk against its compile id: code the JVM freed and reused since
//! is read again, and that sample keeps its native frames.
//!
//! Names: `Method` → `ConstMethod` → `ConstantPool` → the holder class's name and the
//! method's name (`Symbol`s), and the source file; the line from the method's compressed
//! line number table at the frame's bytecode index. Every offset comes from the
//! `gHotSpotVMStructs` tables that libjvm.so exports for the serviceability agent, read
//! from the process at start, in both layouts: JDK 11–21 keep an `nmethod`'s debug
//! information in the code heap after its code, JDK 25 in blocks of their own, with the
//! metadata table at an offset the tables do not give (found per `nmethod`, see
//! [`DebugInfo`]). JDK 21 changed the compressed integers to `UNSIGNED5`, by the major
//! version. A JVM whose tables lack a field this module needs keeps its native frames,
//! counted with the field named.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use super::memory::Memory;
use super::{Copy, Frames};

/// Ends the reason of a JVM read before the loader placed and relocated libjvm.so (its
/// tables' pointers still zero, or its data not mapped where the tables say yet, so
/// they read as garbage): the process is looked at again when its mappings change.
pub const NOT_READY: &str = "not initialized yet";

/// Whether a mapped file may hold HotSpot.
pub fn may_be_interpreter(path: &str) -> bool {
    path.rsplit('/').next() == Some("libjvm.so")
}

/// A libjvm.so: where its exported `gHotSpot*` variables are, in the file.
#[derive(Debug, Clone)]
pub struct Binary {
    symbols: Arc<HashMap<String, u64>>,
    loads: crate::unwind::Loads,
}

impl Binary {
    /// `None` when the file exports no `gHotSpotVMStructs` (not HotSpot, or another VM).
    pub fn read(path: &Path) -> Option<Binary> {
        use object::{Object, ObjectSymbol};
        let file = std::fs::File::open(path).ok()?;
        // SAFETY: private, read-only, and dropped at the end of this function; see
        // v8.rs's `Binary::read` for the truncation risk, which is blazesym's too.
        let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
        let elf = object::File::parse(&*map).ok()?;
        let symbols: HashMap<String, u64> = elf
            .dynamic_symbols()
            .filter_map(|symbol| {
                let name = symbol.name().ok()?;
                name.starts_with("gHotSpot")
                    .then(|| (name.to_string(), symbol.address()))
            })
            .collect();
        if !symbols.contains_key("gHotSpotVMStructs") {
            return None;
        }
        Some(Binary {
            symbols: Arc::new(symbols),
            loads: crate::unwind::Loads::of(&elf),
        })
    }
}

/// The vmStructs tables as read: fields by `Type::_field` (offset, or address when
/// static), type sizes, and integer constants.
#[derive(Debug, Default)]
struct Tables {
    fields: HashMap<String, u64>,
    /// Each field's C++ type, as the tables spell it.
    field_types: HashMap<String, String>,
    types: HashMap<String, u64>,
    ints: HashMap<String, i64>,
}

impl Tables {
    fn field(&self, names: &[&str]) -> Result<u64, String> {
        names
            .iter()
            .find_map(|name| self.fields.get(*name).copied())
            .ok_or_else(|| format!("its vmStructs have no {}", names.join(" or ")))
    }

    fn size(&self, name: &str) -> Result<u64, String> {
        self.types
            .get(name)
            .copied()
            .ok_or_else(|| format!("its vmStructs have no type {name}"))
    }
}

/// The longest entry array read, and the longest name in it.
const MAX_ENTRIES: usize = 20_000;
const NAME_BYTES: usize = 80;

/// Reads one of the exported entry arrays: `columns` are the exported offsets of the
/// entry's fields; the array ends at an entry whose first name is null.
fn entries(
    memory: &Memory,
    array: u64,
    stride: u64,
    columns: &[u64],
    mut each: impl FnMut(&[u8], &dyn Fn(u64) -> Option<String>),
) -> Result<(), String> {
    let stride = usize::try_from(stride)
        .ok()
        .filter(|s| (16..=256).contains(s))
        .ok_or_else(|| {
            format!("its vmStructs entry size ({stride}) is implausible: {NOT_READY}")
        })?;
    const CHUNK: usize = 128;
    let mut at = array;
    for _ in 0..MAX_ENTRIES / CHUNK {
        let mut bytes = vec![0u8; stride * CHUNK];
        // The end of the array may be near the end of its mapping: read less then.
        let mut count = CHUNK;
        while count > 0 && !memory.read(at, &mut bytes[..stride * count]) {
            count /= 2;
        }
        if count == 0 {
            return Err(format!("its vmStructs are unreadable: {NOT_READY}"));
        }
        // Every name of the chunk at once.
        let pointers: Vec<u64> = (0..count)
            .flat_map(|i| {
                let entry = &bytes[i * stride..(i + 1) * stride];
                columns.iter().map(move |column| {
                    usize::try_from(*column)
                        .ok()
                        .and_then(|c| super::u64_at(entry, c))
                        .unwrap_or(0)
                })
            })
            .collect();
        let ranges: Vec<(u64, usize)> = pointers
            .iter()
            .filter(|p| **p != 0)
            .map(|p| (*p, NAME_BYTES))
            .collect();
        let mut names = vec![0u8; ranges.len() * NAME_BYTES];
        let read = memory.read_many(&ranges, &mut names);
        let mut strings = HashMap::new();
        for (i, ((pointer, _), ok)) in ranges.iter().zip(read).enumerate() {
            let text = if ok {
                let text = &names[i * NAME_BYTES..(i + 1) * NAME_BYTES];
                text.iter()
                    .position(|b| *b == 0)
                    .and_then(|end| std::str::from_utf8(&text[..end]).ok())
                    .map(str::to_string)
            } else {
                // A name at the very end of its mapping.
                memory.c_string(*pointer, NAME_BYTES)
            };
            if let Some(text) = text {
                strings.insert(*pointer, text);
            }
        }
        let name = |pointer: u64| strings.get(&pointer).cloned();
        for i in 0..count {
            let entry = &bytes[i * stride..(i + 1) * stride];
            if pointers[i * columns.len()] == 0 {
                return Ok(());
            }
            each(entry, &name);
        }
        at += (stride * count) as u64;
    }
    Err(format!("its vmStructs do not end: {NOT_READY}"))
}

fn read_tables(
    memory: &Memory,
    symbols: &HashMap<String, u64>,
    bias: u64,
) -> Result<Tables, String> {
    let value = |name: &str| -> Result<u64, String> {
        let address = symbols
            .get(&format!("gHotSpot{name}"))
            .ok_or_else(|| format!("libjvm.so exports no gHotSpot{name}"))?;
        memory
            .u64(address.wrapping_add(bias))
            .filter(|value| *value != 0 || !name.ends_with("VMStructs"))
            .ok_or_else(|| format!("gHotSpot{name}: {NOT_READY}"))
    };
    let mut tables = Tables::default();
    let at = |entry: &[u8], column: u64| -> u64 {
        usize::try_from(column)
            .ok()
            .and_then(|c| super::u64_at(entry, c))
            .unwrap_or(0)
    };
    let (type_name, field_name, type_string, is_static, offset, address) = (
        value("VMStructEntryTypeNameOffset")?,
        value("VMStructEntryFieldNameOffset")?,
        value("VMStructEntryTypeStringOffset")?,
        value("VMStructEntryIsStaticOffset")?,
        value("VMStructEntryOffsetOffset")?,
        value("VMStructEntryAddressOffset")?,
    );
    entries(
        memory,
        value("VMStructs")?,
        value("VMStructEntryArrayStride")?,
        &[type_name, field_name, type_string],
        |entry, name| {
            let (Some(class), Some(field)) =
                (name(at(entry, type_name)), name(at(entry, field_name)))
            else {
                return;
            };
            let is_static = usize::try_from(is_static)
                .ok()
                .and_then(|c| super::u32_at(entry, c))
                .unwrap_or(0);
            let value = if is_static != 0 {
                at(entry, address)
            } else {
                at(entry, offset)
            };
            let key = format!("{class}::{field}");
            if let Some(cxx) = name(at(entry, type_string)) {
                tables.field_types.insert(key.clone(), cxx);
            }
            tables.fields.insert(key, value);
        },
    )?;
    let (type_name, size) = (
        value("VMTypeEntryTypeNameOffset")?,
        value("VMTypeEntrySizeOffset")?,
    );
    entries(
        memory,
        value("VMTypes")?,
        value("VMTypeEntryArrayStride")?,
        &[type_name],
        |entry, name| {
            if let Some(class) = name(at(entry, type_name)) {
                tables.types.insert(class, at(entry, size));
            }
        },
    )?;
    let (constant, constant_value) = (
        value("VMIntConstantEntryNameOffset")?,
        value("VMIntConstantEntryValueOffset")?,
    );
    entries(
        memory,
        value("VMIntConstants")?,
        value("VMIntConstantEntryArrayStride")?,
        &[constant],
        |entry, name| {
            if let Some(constant) = name(at(entry, constant)) {
                let value = usize::try_from(constant_value)
                    .ok()
                    .and_then(|c| super::u32_at(entry, c))
                    .unwrap_or(0);
                tables.ints.insert(constant, i64::from(value as i32));
            }
        },
    )?;
    Ok(tables)
}

/// The offsets this module reads, from the tables.
#[derive(Debug, Clone)]
struct Layout {
    /// `X` of the compressed integers: JDK 21 moved them to `UNSIGNED5`, which never
    /// writes a zero byte (so every byte is one more).
    excluded: u8,
    heaps: u64,
    low_bound: u64,
    high_bound: u64,
    array_len: u64,
    array_data: u64,
    heap_memory: u64,
    heap_segmap: u64,
    heap_log2: u64,
    space_low: u64,
    space_high: u64,
    block_bytes: u64,
    block_used: u64,
    blob_name: u64,
    blob_size: u64,
    blob_frame_complete: u64,
    /// A 16-bit field from JDK 25 on.
    blob_frame_complete_short: bool,
    blob_frame_size: u64,
    code_start: CodeStart,
    nm_method: u64,
    nm_compile_id: u64,
    debug: DebugInfo,
    /// Bytes of a blob's header that hold every field above.
    header_bytes: usize,
    method_const: u64,
    const_constants: u64,
    const_flags: u64,
    const_code_size: u64,
    const_name_index: u64,
    const_bytes: u64,
    pool_holder: u64,
    pool_bytes: u64,
    /// Where the source file's index is: the pool (JDK 17 on) or the class (JDK 11).
    source_in_pool: bool,
    source_index: u64,
    klass_name: u64,
    symbol_length: u64,
    symbol_body: u64,
}

/// Where a blob's code begins.
#[derive(Debug, Clone, Copy)]
enum CodeStart {
    /// `CodeBlob::_code_begin`, a pointer (JDK 11–21).
    Pointer(u64),
    /// `CodeBlob::_code_offset`, from the blob (JDK 25).
    Offset(u64),
}

/// Where an nmethod's debug information is.
#[derive(Debug, Clone, Copy)]
enum DebugInfo {
    /// JDK 11–21: its metadata table, scopes data and `PcDesc`s one after another in the
    /// blob.
    Embedded {
        scopes_data: u64,
        scopes_pcs: u64,
        dependencies: u64,
        metadata: u64,
    },
    /// JDK 25: `PcDesc`s then scopes data in a block of its own (`_immutable_data`), and
    /// the metadata table in the mutable block after the relocations, at an offset the
    /// tables do not give: found per nmethod as the one where every scope chain's
    /// outermost method is the nmethod's own.
    Separate {
        immutable: u64,
        immutable_size: u64,
        scopes_pcs: u64,
        scopes_data: u64,
        mutable: u64,
        mutable_size: u64,
        relocation_size: u64,
    },
}

/// x86-64 interpreter frame slots, in words from the frame pointer (`frame_x86.hpp`).
const INTERPRETER_SENDER_SP: i64 = -1;
const INTERPRETER_METHOD: i64 = -3;
const INTERPRETER_BCP: i64 = -8;

impl Layout {
    fn of(tables: &Tables, major: u32) -> Result<Layout, String> {
        let f = |names: &[&str]| tables.field(names);
        let (source_in_pool, source_index) = match f(&["ConstantPool::_source_file_name_index"]) {
            Ok(offset) => (true, offset),
            Err(_) => (false, f(&["InstanceKlass::_source_file_name_index"])?),
        };
        let nm_method = f(&["CompiledMethod::_method", "nmethod::_method"])?;
        let embedded = (|| -> Result<DebugInfo, String> {
            Ok(DebugInfo::Embedded {
                scopes_data: f(&["CompiledMethod::_scopes_data_begin"])?,
                scopes_pcs: f(&["nmethod::_scopes_pcs_offset"])?,
                dependencies: f(&["nmethod::_dependencies_offset"])?,
                metadata: f(&["nmethod::_metadata_offset"])?,
            })
        })();
        let separate = || -> Result<DebugInfo, String> {
            Ok(DebugInfo::Separate {
                immutable: f(&["nmethod::_immutable_data"])?,
                immutable_size: f(&["nmethod::_immutable_data_size"])?,
                scopes_pcs: f(&["nmethod::_scopes_pcs_offset"])?,
                scopes_data: f(&["nmethod::_scopes_data_offset"])?,
                mutable: f(&["CodeBlob::_mutable_data"])?,
                mutable_size: f(&["CodeBlob::_mutable_data_size"])?,
                relocation_size: f(&["CodeBlob::_relocation_size"])?,
            })
        };
        // The older layout's first missing field names the failure of both.
        let debug = embedded.clone().or_else(|_| separate()).or(embedded)?;
        let nm_compile_id = f(&["nmethod::_compile_id"])?;
        let blob_name = f(&["CodeBlob::_name"])?;
        let blob_size = f(&["CodeBlob::_size"])?;
        let blob_frame_complete = f(&["CodeBlob::_frame_complete_offset"])?;
        let blob_frame_complete_short = tables
            .field_types
            .get("CodeBlob::_frame_complete_offset")
            .is_some_and(|cxx| cxx.contains("16"));
        let blob_frame_size = f(&["CodeBlob::_frame_size"])?;
        let code_start = match f(&["CodeBlob::_code_begin"]) {
            Ok(pointer) => CodeStart::Pointer(pointer),
            Err(_) => CodeStart::Offset(f(&["CodeBlob::_code_offset"])?),
        };
        // Every field read from a blob's header lies within an nmethod's.
        let header_bytes = tables.size("nmethod")?.max(tables.size("CodeBlob")?);
        if header_bytes > 4096 {
            return Err("its nmethod header is implausibly large".into());
        }
        Ok(Layout {
            excluded: u8::from(major >= 21),
            heaps: f(&["CodeCache::_heaps"])?,
            low_bound: f(&["CodeCache::_low_bound"])?,
            high_bound: f(&["CodeCache::_high_bound"])?,
            array_len: f(&["GrowableArrayBase::_len", "GenericGrowableArray::_len"])?,
            array_data: f(&["GrowableArray<int>::_data"])?,
            heap_memory: f(&["CodeHeap::_memory"])?,
            heap_segmap: f(&["CodeHeap::_segmap"])?,
            heap_log2: f(&["CodeHeap::_log2_segment_size"])?,
            space_low: f(&["VirtualSpace::_low"])?,
            space_high: f(&["VirtualSpace::_high"])?,
            block_bytes: tables.size("HeapBlock")?,
            block_used: f(&["HeapBlock::Header::_used"])?,
            blob_name,
            blob_size,
            blob_frame_complete,
            blob_frame_complete_short,
            blob_frame_size,
            code_start,
            nm_method,
            nm_compile_id,
            debug,
            header_bytes: header_bytes as usize,
            method_const: f(&["Method::_constMethod"])?,
            const_constants: f(&["ConstMethod::_constants"])?,
            const_flags: f(&["ConstMethod::_flags", "ConstMethod::_flags._flags"])?,
            const_code_size: f(&["ConstMethod::_code_size"])?,
            const_name_index: f(&["ConstMethod::_name_index"])?,
            const_bytes: tables.size("ConstMethod")?,
            pool_holder: f(&["ConstantPool::_pool_holder"])?,
            pool_bytes: tables.size("ConstantPool")?,
            source_in_pool,
            source_index,
            klass_name: f(&["Klass::_name"])?,
            symbol_length: f(&["Symbol::_length"])?,
            symbol_body: f(&["Symbol::_body"])?,
        })
    }
}

/// One code heap: its committed range and segment map.
#[derive(Debug, Clone, Copy)]
struct Heap {
    low: u64,
    high: u64,
    segmap: u64,
    log2: u32,
}

/// An nmethod's scopes at each recorded pc offset (sorted): (`Method*`, bytecode index),
/// innermost (inlined) first.
type Scopes = Vec<(u32, Box<[(u64, i32)]>)>;

/// What a blob of the code cache is.
#[derive(Debug)]
enum Kind {
    /// A compiled method: at each recorded pc offset (sorted), its scopes, innermost
    /// (inlined) first, as (`Method*`, bytecode index).
    Nmethod {
        compile_id: u32,
        /// The compiled method itself: a native method's wrapper records no scopes.
        method: u64,
        scopes: Scopes,
    },
    Interpreter,
    /// Stubs that keep a frame pointer when they are a caller (the call stub).
    Stubs(String),
    /// Adapters, runtime stubs and the rest, by name.
    Other(String),
}

#[derive(Debug)]
struct Blob {
    start: u64,
    end: u64,
    code_begin: u64,
    frame_size: u64,
    frame_complete: u64,
    kind: Kind,
}

impl Blob {
    fn bytes(&self) -> usize {
        std::mem::size_of::<Blob>()
            + match &self.kind {
                Kind::Nmethod { scopes, .. } => scopes.iter().map(|(_, s)| 32 + 16 * s.len()).sum(),
                Kind::Stubs(name) | Kind::Other(name) => name.len(),
                Kind::Interpreter => 0,
            }
    }
}

/// A method as named once: its function name, file, and line number table.
#[derive(Debug)]
struct MethodInfo {
    name: String,
    file: String,
    /// (bytecode index, line), in bytecode order.
    lines: Vec<(u32, i32)>,
    /// Where its bytecodes are, and how many: an interpreted frame's bytecode pointer is
    /// made an index with it.
    code: (u64, u64),
}

impl MethodInfo {
    fn line(&self, bci: i64) -> i64 {
        let bci = bci.max(0);
        let at = self.lines.partition_point(|(b, _)| i64::from(*b) <= bci);
        match at.checked_sub(1).and_then(|i| self.lines.get(i)) {
            Some((_, line)) => i64::from(*line),
            None => self.lines.first().map_or(0, |(_, line)| i64::from(*line)),
        }
    }
}

/// Where a frame is in its method.
#[derive(Debug, Clone, Copy)]
enum At {
    /// A bytecode index (-1: the method's entry).
    Bci(i64),
    /// An interpreted frame's bytecode pointer, made an index once the method is read.
    Bcp(u64),
}

/// Blobs and methods kept per process; past it they are read again.
const MAX_BLOBS: usize = 20_000;
const MAX_METHODS: usize = 50_000;
/// The longest debug information read for one nmethod.
const MAX_DEBUG_BYTES: usize = 4 << 20;
/// The deepest chain of inlined scopes kept.
const MAX_INLINED: usize = 64;
const MAX_SYMBOL_BYTES: usize = 4096;

/// One JVM.
#[derive(Debug)]
pub struct Runtime {
    layout: Box<Layout>,
    memory: Memory,
    /// `CodeCache::_low_bound` and `_high_bound`, once set.
    bounds: Option<(u64, u64)>,
    heaps: Vec<Heap>,
    blobs: BTreeMap<u64, Arc<Blob>>,
    /// By `Method*` and its `ConstMethod*`.
    methods: HashMap<(u64, u64), Option<Arc<MethodInfo>>>,
    /// The blobs the last walk went through, checked in [`Runtime::join`].
    walked: Vec<Arc<Blob>>,
}

impl Runtime {
    /// The process's JVM, from its libjvm.so's code mapped at `start` from `pgoff`.
    pub fn new(pid: u32, binary: &Binary, start: u64, pgoff: u64) -> Result<Runtime, String> {
        let bias = binary
            .loads
            .bias(start, pgoff)
            .ok_or("libjvm.so's code segment is not where it was mapped")?;
        let memory = Memory { pid };
        let tables = read_tables(&memory, &binary.symbols, bias)?;
        let major = tables
            .fields
            .get("Abstract_VM_Version::_vm_major_version")
            .and_then(|address| memory.u32(*address))
            .ok_or_else(|| format!("its major version: {NOT_READY}"))?;
        let layout = Layout::of(&tables, major)?;
        Ok(Runtime {
            layout: Box::new(layout),
            memory,
            bounds: None,
            heaps: Vec::new(),
            blobs: BTreeMap::new(),
            methods: HashMap::new(),
            walked: Vec::new(),
        })
    }

    pub fn bytes(&self) -> usize {
        self.blobs.values().map(|b| b.bytes()).sum::<usize>()
            + self
                .methods
                .values()
                .map(|m| {
                    96 + m
                        .as_ref()
                        .map_or(0, |m| m.name.len() + m.file.len() + 8 * m.lines.len())
                })
                .sum::<usize>()
    }

    /// The code cache's range, read until the JVM has set it.
    fn bounds(&mut self) -> Option<(u64, u64)> {
        if self.bounds.is_none() {
            let low = self.memory.u64(self.layout.low_bound)?;
            let high = self.memory.u64(self.layout.high_bound)?;
            if low != 0 && low < high {
                self.bounds = Some((low, high));
            }
        }
        self.bounds
    }

    fn in_code_cache(&mut self, pc: u64) -> bool {
        self.bounds()
            .is_some_and(|(low, high)| (low..high).contains(&pc))
    }

    fn read_heaps(&mut self) {
        let layout = &self.layout;
        let memory = &self.memory;
        let heaps = (|| -> Option<Vec<Heap>> {
            let array = memory.u64(layout.heaps)?;
            let len = memory.u32(array.wrapping_add(layout.array_len))?.min(16);
            let data = memory.u64(array.wrapping_add(layout.array_data))?;
            let mut heaps = Vec::new();
            for i in 0..u64::from(len) {
                let heap = memory.u64(data.wrapping_add(8 * i))?;
                let low = memory.u64(heap.wrapping_add(layout.heap_memory + layout.space_low))?;
                let high = memory.u64(heap.wrapping_add(layout.heap_memory + layout.space_high))?;
                let segmap =
                    memory.u64(heap.wrapping_add(layout.heap_segmap + layout.space_low))?;
                let log2 = memory.u32(heap.wrapping_add(layout.heap_log2))?;
                if low < high && (4..=16).contains(&log2) {
                    heaps.push(Heap {
                        low,
                        high,
                        segmap,
                        log2,
                    });
                }
            }
            Some(heaps)
        })();
        if let Some(heaps) = heaps {
            self.heaps = heaps;
        }
    }

    /// The blob holding `pc`, from the cache or the code heaps.
    fn blob(&mut self, pc: u64) -> Option<Arc<Blob>> {
        if let Some((_, blob)) = self.blobs.range(..=pc).next_back() {
            if pc < blob.end {
                return Some(blob.clone());
            }
        }
        if !self.in_code_cache(pc) {
            return None;
        }
        let heap = match self.heaps.iter().find(|h| (h.low..h.high).contains(&pc)) {
            Some(heap) => *heap,
            None => {
                self.read_heaps();
                *self.heaps.iter().find(|h| (h.low..h.high).contains(&pc))?
            }
        };
        let start = self.block_start(&heap, pc)?;
        let blob = Arc::new(self.read_blob(start, pc)?);
        if self.blobs.len() >= MAX_BLOBS {
            self.blobs.clear();
        }
        // Blobs freed since and overlapping this one go.
        let stale: Vec<u64> = self
            .blobs
            .range(..blob.end)
            .rev()
            .take_while(|(_, b)| b.end > blob.start)
            .map(|(start, _)| *start)
            .collect();
        for start in stale {
            self.blobs.remove(&start);
        }
        self.blobs.insert(blob.start, blob.clone());
        Some(blob)
    }

    /// The start of the block holding `pc`, walking the segment map back.
    fn block_start(&self, heap: &Heap, pc: u64) -> Option<u64> {
        let mut index = (pc - heap.low) >> heap.log2;
        for _ in 0..64 {
            let from = index.saturating_sub(255);
            let mut map = vec![0u8; (index - from + 1) as usize];
            if !self.memory.read(heap.segmap.wrapping_add(from), &mut map) {
                return None;
            }
            loop {
                let hop = map[(index - from) as usize];
                if hop == 0xff {
                    return None; // a free segment
                }
                if hop == 0 {
                    return Some(heap.low.wrapping_add(index << heap.log2));
                }
                index = index.checked_sub(u64::from(hop))?;
                if index < from {
                    break;
                }
            }
        }
        None
    }

    fn read_blob(&self, block: u64, pc: u64) -> Option<Blob> {
        let layout = &self.layout;
        let mut used = [0u8];
        if !self
            .memory
            .read(block.wrapping_add(layout.block_used), &mut used)
            || used[0] == 0
        {
            return None;
        }
        let start = block.wrapping_add(layout.block_bytes);
        let mut header = vec![0u8; layout.header_bytes];
        if !self.memory.read(start, &mut header) {
            return None;
        }
        let word = |at: u64| super::u64_at(&header, usize::try_from(at).ok()?);
        let int = |at: u64| super::u32_at(&header, usize::try_from(at).ok()?).map(|v| v as i32);
        let size = u64::try_from(int(layout.blob_size)?).ok()?;
        let end = start.checked_add(size)?;
        if pc >= end {
            return None;
        }
        let name = self.memory.c_string(word(layout.blob_name)?, 64)?;
        let code_begin = match layout.code_start {
            CodeStart::Pointer(at) => word(at)?,
            CodeStart::Offset(at) => start.checked_add(u64::try_from(int(at)?).ok()?)?,
        };
        let frame_size = u64::try_from(int(layout.blob_frame_size)?).unwrap_or(0);
        let frame_complete = if layout.blob_frame_complete_short {
            let at = usize::try_from(layout.blob_frame_complete).ok()?;
            i64::from(i16::from_ne_bytes(header.get(at..at + 2)?.try_into().ok()?))
        } else {
            i64::from(int(layout.blob_frame_complete)?)
        };
        let frame_complete = u64::try_from(frame_complete).unwrap_or(0);
        let kind = match name.as_str() {
            // A native method's wrapper is an nmethod too, named apart.
            "nmethod" | "native nmethod" => {
                let compile_id = int(layout.nm_compile_id)? as u32;
                let method = word(layout.nm_method)?;
                let offset = |base: u64, at: u64| -> Option<u64> {
                    base.checked_add(u64::try_from(int(at)?).ok()?)
                };
                let scopes = match layout.debug {
                    DebugInfo::Embedded {
                        scopes_data,
                        scopes_pcs,
                        dependencies,
                        metadata,
                    } => self.embedded_scopes(
                        offset(start, metadata)?,
                        word(scopes_data)?,
                        offset(start, scopes_pcs)?,
                        offset(start, dependencies)?,
                        end,
                    )?,
                    DebugInfo::Separate {
                        immutable,
                        immutable_size,
                        scopes_pcs,
                        scopes_data,
                        mutable,
                        mutable_size,
                        relocation_size,
                    } => {
                        let immutable = word(immutable)?;
                        let mutable = word(mutable)?;
                        self.separate_scopes(
                            method,
                            offset(immutable, scopes_pcs)?,
                            offset(immutable, scopes_data)?,
                            offset(immutable, immutable_size)?,
                            offset(mutable, relocation_size)?,
                            offset(mutable, mutable_size)?,
                        )
                        .unwrap_or_default()
                    }
                };
                Kind::Nmethod {
                    compile_id,
                    method,
                    scopes,
                }
            }
            "Interpreter" => Kind::Interpreter,
            name if name.starts_with("StubRoutines") => Kind::Stubs(name.to_string()),
            _ => Kind::Other(name),
        };
        Some(Blob {
            start,
            end,
            code_begin,
            frame_size,
            frame_complete,
            kind,
        })
    }

    /// An nmethod's scopes at each of its `PcDesc`s, JDK 11–21: metadata table, scopes data
    /// and the `PcDesc` array lie one after another in the blob (`nmethod.hpp`).
    fn embedded_scopes(
        &self,
        metadata: u64,
        scopes_data: u64,
        pcs: u64,
        pcs_end: u64,
        end: u64,
    ) -> Option<Scopes> {
        if !(metadata <= scopes_data && scopes_data <= pcs && pcs <= pcs_end && pcs_end <= end)
            || pcs_end - metadata > MAX_DEBUG_BYTES as u64
        {
            return None;
        }
        let bytes = self
            .memory
            .bytes(metadata, (pcs_end - metadata) as usize, MAX_DEBUG_BYTES)?;
        let table = &bytes[..(scopes_data - metadata) as usize];
        let data = &bytes[(scopes_data - metadata) as usize..(pcs - metadata) as usize];
        let descs = &bytes[(pcs - metadata) as usize..];
        let raw = raw_scopes(descs, data, self.layout.excluded);
        Some(resolve(&raw, table, 0))
    }

    /// The same, JDK 25: `PcDesc`s and scopes data in the immutable block, the metadata
    /// table somewhere after the relocations in the mutable one (see [`DebugInfo`]).
    /// `None` when no place in it fits every chain.
    fn separate_scopes(
        &self,
        method: u64,
        pcs: u64,
        scopes_data: u64,
        immutable_end: u64,
        metadata: u64,
        mutable_end: u64,
    ) -> Option<Scopes> {
        if !(pcs <= scopes_data && scopes_data <= immutable_end && metadata <= mutable_end)
            || immutable_end - pcs > MAX_DEBUG_BYTES as u64
            || mutable_end - metadata > MAX_DEBUG_BYTES as u64
        {
            return None;
        }
        let bytes = self
            .memory
            .bytes(pcs, (immutable_end - pcs) as usize, MAX_DEBUG_BYTES)?;
        let descs = &bytes[..(scopes_data - pcs) as usize];
        let data = &bytes[(scopes_data - pcs) as usize..];
        let table =
            self.memory
                .bytes(metadata, (mutable_end - metadata) as usize, MAX_DEBUG_BYTES)?;
        let raw = raw_scopes(descs, data, self.layout.excluded);
        let roots: Vec<usize> = raw
            .iter()
            .filter_map(|(_, chain)| chain.last().map(|(index, _)| *index as usize))
            .collect();
        let entry = |at: usize| super::u64_at(&table, at.checked_mul(8)?);
        let skip = (0..table.len() / 8).find(|skip| {
            roots
                .iter()
                .all(|root| root.checked_sub(1).and_then(|i| entry(skip + i)) == Some(method))
        })?;
        Some(resolve(&raw, &table[skip * 8..], 0))
    }

    /// The method at an interpreted frame's `Method*`, and its bytecode index there.
    fn method(&mut self, method: u64, const_method: u64) -> Option<Arc<MethodInfo>> {
        if let Some(known) = self.methods.get(&(method, const_method)) {
            return known.clone();
        }
        if self.methods.len() >= MAX_METHODS {
            self.methods.clear();
        }
        let info = self.read_method(const_method).map(Arc::new);
        self.methods.insert((method, const_method), info.clone());
        info
    }

    fn read_method(&self, const_method: u64) -> Option<MethodInfo> {
        let layout = &self.layout;
        let memory = &self.memory;
        let header = memory.bytes(const_method, layout.const_bytes as usize, 4096)?;
        let u16_at = |bytes: &[u8], at: u64| -> Option<u16> {
            let at = usize::try_from(at).ok()?;
            Some(u16::from_ne_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
        };
        let pool = super::u64_at(&header, layout.const_constants as usize)?;
        let flags = u16_at(&header, layout.const_flags)?;
        let code_size = u64::from(u16_at(&header, layout.const_code_size)?);
        let name_index = u64::from(u16_at(&header, layout.const_name_index)?);
        let pool_header = memory.bytes(pool, layout.pool_bytes as usize, 4096)?;
        let holder = super::u64_at(&pool_header, layout.pool_holder as usize)?;
        let source_index = if layout.source_in_pool {
            u64::from(u16_at(&pool_header, layout.source_index)?)
        } else {
            let mut index = [0u8; 2];
            memory
                .read(holder.wrapping_add(layout.source_index), &mut index)
                .then(|| u64::from(u16::from_ne_bytes(index)))?
        };
        let entry = |index: u64| memory.u64(pool.wrapping_add(layout.pool_bytes + 8 * index));
        let name = self.symbol(entry(name_index)?)?;
        let class = self.symbol(memory.u64(holder.wrapping_add(layout.klass_name))?)?;
        let source = match source_index {
            0 => None,
            index => entry(index).and_then(|symbol| self.symbol(symbol)),
        };
        let code = const_method.wrapping_add(layout.const_bytes);
        // `_has_linenumber_table` is the first flag in every version.
        let lines = if flags & 1 == 1 {
            self.line_table(code.wrapping_add(code_size))
        } else {
            Vec::new()
        };
        let package = class.rsplit_once('/').map(|(package, _)| package);
        let file = match (package, source) {
            (Some(package), Some(source)) => format!("{package}/{source}"),
            (None, Some(source)) => source,
            (_, None) => String::new(),
        };
        Some(MethodInfo {
            name: format!("{}.{name}", class.replace('/', ".")),
            file,
            lines,
            code: (code, code_size),
        })
    }

    fn symbol(&self, symbol: u64) -> Option<String> {
        let mut length = [0u8; 2];
        if !self
            .memory
            .read(symbol.wrapping_add(self.layout.symbol_length), &mut length)
        {
            return None;
        }
        let length = usize::from(u16::from_ne_bytes(length)).min(MAX_SYMBOL_BYTES);
        let body = self.memory.bytes(
            symbol.wrapping_add(self.layout.symbol_body),
            length,
            MAX_SYMBOL_BYTES,
        )?;
        Some(String::from_utf8_lossy(&body).into_owned())
    }

    /// A compressed line number table (`CompressedLineNumberReadStream`): a byte of
    /// (bci delta << 3 | line delta), or 0xff and two signed compressed integers; 0 ends.
    fn line_table(&self, at: u64) -> Vec<(u32, i32)> {
        let mut bytes = Vec::new();
        let mut lines = Vec::new();
        for chunk in 0..16u64 {
            let Some(more) = self.memory.bytes(at.wrapping_add(1024 * chunk), 1024, 1024) else {
                break;
            };
            bytes.extend_from_slice(&more);
            lines.clear();
            if decode_lines(&bytes, self.layout.excluded, &mut lines) {
                return lines;
            }
        }
        lines
    }
}

/// Reads an `UNSIGNED5` (JDK 21 on, `excluded` 1) or `CompressedStream` (`excluded` 0)
/// integer: up to five bytes, each below 192 (less `excluded`) ending it.
fn read_u5(bytes: &[u8], at: &mut usize, excluded: u8) -> Option<u32> {
    const LG_H: u32 = 6;
    let low = 192 - u32::from(excluded);
    let mut sum: u32 = 0;
    for i in 0..5 {
        let byte = u32::from(*bytes.get(*at)?);
        *at += 1;
        let b = byte.checked_sub(u32::from(excluded))?;
        sum = sum.wrapping_add(b.checked_shl(LG_H * i)?);
        if b < low || i == 4 {
            return Some(sum);
        }
    }
    Some(sum)
}

fn decode_sign(value: u32) -> i32 {
    ((value >> 1) as i32) ^ -((value & 1) as i32)
}

/// Decodes a line number table into `out`; false when `bytes` ended before it did.
fn decode_lines(bytes: &[u8], excluded: u8, out: &mut Vec<(u32, i32)>) -> bool {
    let (mut bci, mut line) = (0i64, 0i64);
    let mut at = 0;
    while let Some(byte) = bytes.get(at) {
        at += 1;
        match byte {
            0 => return true,
            0xff => {
                let (Some(b), Some(l)) = (
                    read_u5(bytes, &mut at, excluded),
                    read_u5(bytes, &mut at, excluded),
                ) else {
                    return false;
                };
                bci += i64::from(decode_sign(b));
                line += i64::from(decode_sign(l));
            }
            _ => {
                bci += i64::from(byte >> 3);
                line += i64::from(byte & 7);
            }
        }
        if out.len() >= 65_536 {
            return true;
        }
        out.push((bci.clamp(0, i64::from(u32::MAX)) as u32, line as i32));
    }
    false
}

/// Each `PcDesc`'s (pc offset, chain of scopes), as metadata indexes: `PcDesc`s are
/// four 32-bit fields, the pc offset and the scope's decode offset first.
fn raw_scopes(descs: &[u8], data: &[u8], excluded: u8) -> Vec<(u32, Vec<(u32, i32)>)> {
    descs
        .chunks_exact(16)
        .filter_map(|desc| {
            let pc_offset = super::u32_at(desc, 0)?;
            let decode = super::u32_at(desc, 4)? as i32;
            // No scope here (the serialized-null offset).
            let decode = usize::try_from(decode).ok().filter(|d| *d > 0)?;
            let chain = decode_chain(data, decode, excluded);
            (!chain.is_empty()).then_some((pc_offset, chain))
        })
        .collect()
}

/// Chains of metadata indexes made chains of `Method*`s, through the metadata table
/// (index 1 is its first entry); a chain stops at an index outside it.
fn resolve(raw: &[(u32, Vec<(u32, i32)>)], table: &[u8], skip: usize) -> Scopes {
    let mut out: Scopes = raw
        .iter()
        .filter_map(|(pc, chain)| {
            let methods: Vec<(u64, i32)> = chain
                .iter()
                .map_while(|(index, bci)| {
                    let at = (*index as usize).checked_sub(1)?.checked_add(skip)?;
                    let method = super::u64_at(table, at.checked_mul(8)?)?;
                    (method != 0).then_some((method, *bci))
                })
                .collect();
            (!methods.is_empty()).then(|| (*pc, methods.into_boxed_slice()))
        })
        .collect();
    out.sort_by_key(|(pc, _)| *pc);
    out
}

/// The chain of scopes from one `PcDesc`, innermost first: each scope is its sender's
/// offset, its method's index in the metadata table (1-based), and its bytecode index
/// (stored one more, so that -1, the method's entry, is 0).
fn decode_chain(data: &[u8], mut offset: usize, excluded: u8) -> Vec<(u32, i32)> {
    let mut chain = Vec::new();
    while chain.len() < MAX_INLINED {
        let mut at = offset;
        let (Some(sender), Some(method), Some(bci)) = (
            read_u5(data, &mut at, excluded),
            read_u5(data, &mut at, excluded),
            read_u5(data, &mut at, excluded),
        ) else {
            break;
        };
        if method == 0 {
            break;
        }
        chain.push((method, (bci as i32).wrapping_sub(1)));
        if sender == 0 || sender as usize == offset {
            break;
        }
        offset = sender as usize;
    }
    chain
}

impl crate::unwind::Jit for Runtime {
    fn step(
        &mut self,
        pc: u64,
        sp: u64,
        bp: u64,
        top: bool,
        word: &dyn Fn(u64) -> Option<u64>,
    ) -> Option<Option<(u64, u64, u64)>> {
        let lookup = if top { pc } else { pc.saturating_sub(1) };
        let blob = self.blob(lookup)?;
        // One walk's frames at most: a walk never joined (a bug) cannot grow it.
        if self.walked.len() >= 4096 {
            self.walked.clear();
        }
        self.walked.push(blob.clone());
        let frame_pointer = |bp: u64| -> Option<(u64, u64, u64)> {
            let ret = word(bp.checked_add(8)?)?;
            Some((ret, bp.checked_add(16)?, word(bp)?))
        };
        let step = match &blob.kind {
            Kind::Interpreter => frame_pointer(bp).map(|(ret, caller_sp, caller_bp)| {
                // A compiled caller's frame is measured from its unextended stack pointer.
                let sender_sp = word(bp.wrapping_add_signed(8 * INTERPRETER_SENDER_SP));
                let compiled = self
                    .blob(ret.saturating_sub(1))
                    .is_some_and(|b| matches!(b.kind, Kind::Nmethod { .. }));
                match (compiled, sender_sp) {
                    (true, Some(sender_sp)) if sender_sp >= sp => (ret, sender_sp, caller_bp),
                    _ => (ret, caller_sp, caller_bp),
                }
            }),
            _ if blob.frame_size > 0 => {
                let in_prologue = top && pc < blob.code_begin.saturating_add(blob.frame_complete);
                if in_prologue {
                    // Before the frame is set up: the return address is on top, or under
                    // the saved frame pointer.
                    let ret = word(sp)?;
                    if self.plausible(ret) {
                        Some((ret, sp.checked_add(8)?, bp))
                    } else {
                        Some((word(sp.checked_add(8)?)?, sp.checked_add(16)?, word(sp)?))
                    }
                } else {
                    let caller_sp = sp.checked_add(8 * blob.frame_size)?;
                    Some((
                        word(caller_sp.checked_sub(8)?)?,
                        caller_sp,
                        word(caller_sp.checked_sub(16)?)?,
                    ))
                }
            }
            Kind::Stubs(_) if !top => frame_pointer(bp),
            _ => {
                // A stub without a frame of its own (on top), or one that keeps a frame
                // pointer.
                let ret = word(sp)?;
                if top && self.plausible(ret) {
                    Some((ret, sp + 8, bp))
                } else {
                    frame_pointer(bp)
                }
            }
        };
        Some(step.filter(|(ret, caller_sp, _)| *ret != 0 && *caller_sp > sp))
    }
}

impl Runtime {
    /// Whether a word may be a return address into the code cache.
    fn plausible(&mut self, address: u64) -> bool {
        self.blob(address.saturating_sub(1)).is_some()
    }

    /// Drops what the last walk went through, for a sample that is not joined.
    pub fn forget_walk(&mut self) {
        self.walked.clear();
    }

    /// The sample's user stack with its Java methods in place, and the outcome to count.
    pub fn join(
        &mut self,
        native: Vec<u64>,
        copy: &Copy<'_>,
        frames: &mut Frames,
    ) -> (Vec<u64>, &'static str) {
        let walked = std::mem::take(&mut self.walked);
        if walked.is_empty() {
            return (native, "no java frames");
        }
        // Code freed and reused since it was cached: read again next time.
        let mut checks: Vec<(u64, usize)> = Vec::new();
        let mut expected: Vec<(u64, u32)> = Vec::new();
        for blob in &walked {
            if let Kind::Nmethod { compile_id, .. } = blob.kind {
                if !expected.iter().any(|(start, _)| *start == blob.start) {
                    checks.push((blob.start.wrapping_add(self.layout.nm_compile_id), 4));
                    expected.push((blob.start, compile_id));
                }
            }
        }
        let mut ids = vec![0u8; 4 * checks.len()];
        let read = self.memory.read_many(&checks, &mut ids);
        let mut changed = false;
        for (i, ((start, id), ok)) in expected.iter().zip(read).enumerate() {
            if !ok || super::u32_at(&ids, 4 * i) != Some(*id) {
                self.blobs.remove(start);
                changed = true;
            }
        }
        if changed {
            return (native, "code changed");
        }
        // Each frame's methods: (depth, [(Method*, bci)]), the interpreter's from the
        // copy.
        let mut java: Vec<(usize, Vec<(u64, At)>)> = Vec::new();
        let mut stubs: Vec<(usize, String)> = Vec::new();
        for (depth, address) in native.iter().enumerate() {
            let lookup = if depth == 0 {
                *address
            } else {
                address.saturating_sub(1)
            };
            let Some(blob) = walked
                .iter()
                .find(|b| (b.start..b.end).contains(&lookup))
                .cloned()
            else {
                continue;
            };
            match &blob.kind {
                Kind::Interpreter => {
                    let base = copy.bases.get(depth).copied().unwrap_or(0);
                    let method = copy.word(base.wrapping_add_signed(8 * INTERPRETER_METHOD));
                    let bcp = copy
                        .word(base.wrapping_add_signed(8 * INTERPRETER_BCP))
                        .unwrap_or(0);
                    if let Some(method) = method.filter(|m| *m != 0) {
                        java.push((depth, vec![(method, At::Bcp(bcp))]));
                    }
                }
                Kind::Nmethod { scopes, method, .. } => {
                    // A call's return address has its own `PcDesc`; any other pc takes
                    // the next one's, where the code it runs is accounted.
                    let offset = address.saturating_sub(blob.code_begin);
                    let offset = u32::try_from(offset).unwrap_or(u32::MAX);
                    let at = scopes.partition_point(|(pc, _)| *pc < offset);
                    let chain = match scopes.get(at).or_else(|| scopes.last()) {
                        Some((_, chain)) => chain
                            .iter()
                            .map(|(m, bci)| (*m, At::Bci(i64::from(*bci))))
                            .collect(),
                        None => vec![(*method, At::Bci(-1))],
                    };
                    java.push((depth, chain));
                }
                Kind::Stubs(name) | Kind::Other(name) => stubs.push((depth, name.clone())),
            }
        }
        // Every method's `ConstMethod*` at once: a method unloaded since reads another.
        let mut methods: Vec<u64> = java
            .iter()
            .flat_map(|(_, chain)| chain.iter().map(|(m, _)| *m))
            .collect();
        methods.sort_unstable();
        methods.dedup();
        let ranges: Vec<(u64, usize)> = methods
            .iter()
            .map(|m| (m.wrapping_add(self.layout.method_const), 8))
            .collect();
        let mut consts = vec![0u8; 8 * ranges.len()];
        let read = self.memory.read_many(&ranges, &mut consts);
        let const_of: HashMap<u64, u64> = methods
            .iter()
            .zip(read)
            .enumerate()
            .filter(|(_, (_, ok))| *ok)
            .filter_map(|(i, (m, _))| Some((*m, super::u64_at(&consts, 8 * i)?)))
            .collect();
        let mut out = native;
        let mut unnamed = 0;
        let mut named = 0;
        for (depth, chain) in java {
            let mut names = Vec::with_capacity(chain.len());
            for (method, at) in chain {
                let info = const_of.get(&method).and_then(|c| self.method(method, *c));
                let Some(info) = info else {
                    unnamed += 1;
                    names.push(("[unknown java frame]".to_string(), String::new(), 0));
                    continue;
                };
                let bci = match at {
                    At::Bci(bci) => bci,
                    At::Bcp(bcp) => {
                        let (code, size) = info.code;
                        bcp.checked_sub(code)
                            .filter(|bci| *bci < size)
                            .map_or(0, |bci| bci as i64)
                    }
                };
                named += 1;
                names.push((info.name.clone(), info.file.clone(), info.line(bci)));
            }
            if let Some(slot) = out.get_mut(depth) {
                *slot = frames.intern_inlined(names);
            }
        }
        for (depth, name) in stubs {
            if let Some(slot) = out.get_mut(depth) {
                *slot = frames.intern(name, String::new(), 0);
            }
        }
        let outcome = match (named, unnamed) {
            (0, 0) => "no java frames",
            (_, 0) => "named",
            _ => "code object unreadable",
        };
        (out, outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// JDK 17's tables, as its libjvm.so exports them (offsets of the fields read).
    fn jdk17() -> Tables {
        let mut tables = Tables::default();
        for (name, value) in [
            ("CodeCache::_heaps", 0x1000),
            ("CodeCache::_low_bound", 0x1008),
            ("CodeCache::_high_bound", 0x1010),
            ("GrowableArrayBase::_len", 0),
            ("GrowableArray<int>::_data", 8),
            ("CodeHeap::_memory", 8),
            ("CodeHeap::_segmap", 120),
            ("CodeHeap::_log2_segment_size", 256),
            ("VirtualSpace::_low", 16),
            ("VirtualSpace::_high", 24),
            ("HeapBlock::Header::_used", 8),
            ("CodeBlob::_name", 96),
            ("CodeBlob::_size", 12),
            ("CodeBlob::_frame_complete_offset", 20),
            ("CodeBlob::_frame_size", 28),
            ("CodeBlob::_code_begin", 32),
            ("CompiledMethod::_method", 112),
            ("CompiledMethod::_scopes_data_begin", 120),
            ("nmethod::_scopes_pcs_offset", 268),
            ("nmethod::_dependencies_offset", 272),
            ("nmethod::_metadata_offset", 260),
            ("nmethod::_compile_id", 304),
            ("Method::_constMethod", 8),
            ("ConstMethod::_constants", 8),
            ("ConstMethod::_flags", 28),
            ("ConstMethod::_code_size", 32),
            ("ConstMethod::_name_index", 34),
            ("ConstantPool::_pool_holder", 24),
            ("ConstantPool::_source_file_name_index", 54),
            ("Klass::_name", 24),
            ("Symbol::_length", 4),
            ("Symbol::_body", 6),
        ] {
            tables.fields.insert(name.to_string(), value);
        }
        for (name, size) in [
            ("HeapBlock", 16),
            ("CodeBlob", 104),
            ("nmethod", 352),
            ("ConstMethod", 48),
            ("ConstantPool", 72),
        ] {
            tables.types.insert(name.to_string(), size);
        }
        tables
    }

    fn runtime_with(blobs: Vec<Blob>) -> Runtime {
        let layout = Layout::of(&jdk17(), 17).expect("JDK 17's tables are enough");
        Runtime {
            layout: Box::new(layout),
            memory: Memory { pid: 0 },
            bounds: Some((0x10_0000, 0x20_0000)),
            heaps: Vec::new(),
            blobs: blobs
                .into_iter()
                .map(|blob| (blob.start, Arc::new(blob)))
                .collect(),
            methods: HashMap::new(),
            walked: Vec::new(),
        }
    }

    #[test]
    fn a_jvm_whose_tables_lack_a_field_is_refused_with_the_field_named() {
        let mut tables = jdk17();
        tables.fields.remove("nmethod::_metadata_offset");
        let refused = Layout::of(&tables, 17).expect_err("no metadata table");
        assert_eq!(refused, "its vmStructs have no nmethod::_metadata_offset");
        let mut tables = jdk17();
        tables.types.remove("ConstMethod");
        assert_eq!(
            Layout::of(&tables, 17).expect_err("no ConstMethod"),
            "its vmStructs have no type ConstMethod"
        );
    }

    #[test]
    fn the_code_cache_is_walked_by_frame_sizes_and_frame_pointers() {
        use crate::unwind::Jit;
        let blob = |start: u64, frame_size: u64, kind: Kind| Blob {
            start,
            end: start + 0x1000,
            code_begin: start + 0x100,
            frame_size,
            frame_complete: 0x10,
            kind,
        };
        let nmethod = || Kind::Nmethod {
            compile_id: 7,
            method: 0x9000,
            scopes: Vec::new(),
        };
        let mut runtime = runtime_with(vec![
            blob(0x10_0000, 0, Kind::Interpreter),
            blob(0x11_0000, 4, nmethod()),
            blob(0x12_0000, 0, Kind::Stubs("StubRoutines (1)".into())),
        ]);
        // A stack: a compiled frame at 0x6f00 (4 words: two locals, then the saved frame
        // pointer and the return address into the interpreter), then an interpreted
        // frame whose frame pointer is 0x7020 (above it the call stub's frame pointer
        // and the return address into it; below it its sender's stack pointer).
        let stack: HashMap<u64, u64> = [
            (0x6f10, 0x7020),    // saved frame pointer: the interpreter's
            (0x6f18, 0x10_0456), // return address: in the interpreter
            (0x7018, 0x7030),    // the interpreter's sender sp
            (0x7020, 0x7100),    // the call stub's frame pointer
            (0x7028, 0x12_0321), // return address: in the call stub
            (0x7100, 0x7200),    // the C++ caller's frame pointer
            (0x7108, 0x4_1234),  // return address: libjvm
        ]
        .into_iter()
        .collect();
        let word = |address: u64| stack.get(&address).copied();
        // Compiled, past its prologue: by its frame size.
        assert_eq!(
            runtime.step(0x11_0200, 0x6f00, 0xdead, true, &word),
            Some(Some((0x10_0456, 0x6f20, 0x7020)))
        );
        // Interpreted, called from the call stub (not compiled): by its frame pointer.
        assert_eq!(
            runtime.step(0x10_0456, 0x6f20, 0x7020, false, &word),
            Some(Some((0x12_0321, 0x7030, 0x7100)))
        );
        // The call stub, as a caller: by its frame pointer, back to C++.
        assert_eq!(
            runtime.step(0x12_0321, 0x7030, 0x7100, false, &word),
            Some(Some((0x4_1234, 0x7110, 0x7200)))
        );
        // Outside the code cache: not this runtime's to walk.
        assert_eq!(runtime.step(0x4_1234, 0x7110, 0x7200, false, &word), None);
        // A frame pointer that leads nowhere stops the walk, it is not followed.
        assert_eq!(
            runtime.step(0x10_0456, 0x7020, 0x9999, false, &word),
            Some(None)
        );
        // Every blob walked is kept for the sample's names.
        assert_eq!(runtime.walked.len(), 4);
    }

    #[test]
    fn compressed_integers_decode_in_both_encodings() {
        // Below 192 (191 for UNSIGNED5): one byte. 300 = 192 + 108 + 0 × 64... in two.
        let mut at = 0;
        assert_eq!(read_u5(&[5], &mut at, 0), Some(5));
        assert_eq!(read_u5(&[6], &mut { 0 }, 1), Some(5));
        // 1000 = 192 + 64 × 12 + 40: first byte 232 (≥ 192), then 12.
        assert_eq!(read_u5(&[232, 12], &mut { 0 }, 0), Some(232 + 12 * 64));
        // UNSIGNED5 adds one to every byte.
        assert_eq!(read_u5(&[233, 13], &mut { 0 }, 1), Some(232 + 12 * 64));
        // A zero byte never occurs in UNSIGNED5; cut input is refused.
        assert_eq!(read_u5(&[0], &mut { 0 }, 1), None);
        assert_eq!(read_u5(&[250], &mut { 0 }, 0), None);
        assert_eq!(decode_sign(3), -2);
        assert_eq!(decode_sign(4), 2);
    }

    #[test]
    fn line_tables_decode_short_and_escaped_pairs() {
        // bci 0 → line 3 (one byte: 0 << 3 | 3); bci +9, line +1; then an escape: bci
        // +40, line -2 (signed: 80 and 3).
        let table = [3u8, (9 << 3) | 1, 0xff, 80, 3, 0];
        let mut lines = Vec::new();
        assert!(decode_lines(&table, 0, &mut lines));
        assert_eq!(lines, vec![(0, 3), (9, 4), (49, 2)]);
        let info = MethodInfo {
            name: "A.b".into(),
            file: "A.java".into(),
            lines,
            code: (0, 0),
        };
        assert_eq!(
            (info.line(0), info.line(8), info.line(9), info.line(60)),
            (3, 3, 4, 2)
        );
        // Cut before its end: incomplete, and nothing read past it.
        let mut cut = Vec::new();
        assert!(!decode_lines(&table[..3], 0, &mut cut));
    }

    #[test]
    fn scope_chains_follow_their_senders_through_the_metadata_table() {
        // Offset 1: sender 4, method 2, bci 7 (stored 8); offset 4: sender 0, method 1,
        // bci -1 (stored 0).
        let data = [0u8, 4, 2, 8, 0, 1, 0];
        let mut metadata = Vec::new();
        metadata.extend_from_slice(&0x1000u64.to_ne_bytes());
        metadata.extend_from_slice(&0x2000u64.to_ne_bytes());
        assert_eq!(decode_chain(&data, 1, 0), vec![(2, 7), (1, -1)]);
        let raw = vec![(40, decode_chain(&data, 1, 0))];
        assert_eq!(
            resolve(&raw, &metadata, 0),
            vec![(40, vec![(0x2000, 7), (0x1000, -1)].into_boxed_slice())]
        );
        // A method index past the table ends the chain, not the agent.
        let bad = [0u8, 0, 9, 1];
        let raw = vec![(8, decode_chain(&bad, 1, 0))];
        assert!(resolve(&raw, &metadata, 0).is_empty());
    }
}
