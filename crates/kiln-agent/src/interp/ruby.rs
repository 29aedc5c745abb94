//! Ruby (CRuby, "MRI"): where a thread's frames live, and how they are named.
//!
//! The VM is found by its `ruby_current_vm_ptr` symbol, in `libruby` or in a statically
//! linked `ruby`, and its version by the `ruby_version` string. The BPF program walks
//! `ruby_current_vm_ptr` → the main ractor → its threads (matched by the kernel's thread
//! id, kept in the thread, or from 3.2 in its native thread `nt`; 3.0 keeps only the
//! `pthread_t`, matched against the thread's TLS base) → the thread's execution context →
//! its control frames, innermost first. Ruby 3.3 hides `ruby_current_vm_ptr` from the
//! dynamic symbols, so a stripped 3.3 is counted unsupported, with that reason.
//! Each frame running Ruby code goes out as its instruction sequence (`rb_iseq_t`) and
//! program counter, with the low half of the sequence's body address as a fingerprint;
//! frames of methods written in C keep their native frames, and the frame that began a
//! native call of the VM (`VM_FRAME_FLAG_FINISH`) is marked, so each call's Ruby frames go
//! in place of that call's native VM frames.
//!
//! The VM's loop is `rb_vm_exec` and the function it calls to run instructions
//! (`vm_exec_core`), which is static, so stripped from Debian's `libruby`. It is found
//! without symbols: of the functions `rb_vm_exec` calls directly (their starts listed by
//! `.eh_frame_hdr`, present in stripped binaries), the largest, a function of tens of
//! kilobytes where every other is a few hundred bytes.
//!
//! Naming happens here, from user space: the sequence's label (`hot`, `block in hot`,
//! `<main>`), its path, and the line of the program counter, from the sequence's
//! instruction info, indexed by the succinct bit vector CRuby keeps for it
//! ([`succinct_rank`]). Layouts are per minor version ([`LAYOUTS`]), from CRuby's headers,
//! and checked against the installed Ruby's by this file's tests. A new version is one
//! entry there (its differences from the one before) and its line in those tests.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};

use super::memory::Memory;
use super::ProcLayout;

pub const RUNTIME_RUBY: u32 = 2;

/// The offsets the BPF program walks by (`struct ruby_walk` in interp.bpf.h).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Walk {
    pub vm_main_ractor: u16,
    pub ractor_threads: u16,
    pub thread_lt_node: u16,
    pub thread_tid: u16,
    pub thread_ec: u16,
    pub ec_vm_stack: u16,
    pub ec_vm_stack_size: u16,
    pub ec_cfp: u16,
    pub cfp_size: u16,
    pub cfp_pc: u16,
    pub cfp_iseq: u16,
    pub cfp_ep: u16,
    pub iseq_body: u16,
    /// `rb_thread_t.nt`, where the id is from 3.2 on, or [`ABSENT`]: in the thread.
    pub thread_nt: u16,
    /// What `thread_tid` holds: the kernel's thread id, an int (3.1 on), or the
    /// `pthread_t` (3.0's `thread_id`), which is the thread's TLS base.
    pub thread_key: u16,
}

/// A field this version does not have.
pub const ABSENT: u16 = 0xffff;

impl Walk {
    /// As `struct ruby_walk` lays them out.
    pub fn words(&self) -> [u16; 16] {
        super::words(&[
            self.vm_main_ractor,
            self.ractor_threads,
            self.thread_lt_node,
            self.thread_tid,
            self.thread_ec,
            self.ec_vm_stack,
            self.ec_vm_stack_size,
            self.ec_cfp,
            self.cfp_size,
            self.cfp_pc,
            self.cfp_iseq,
            self.cfp_ep,
            self.iseq_body,
            self.thread_nt,
            self.thread_key,
        ])
    }
}

/// One minor version's layout: what the BPF program walks, and what naming reads.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    pub version: (u8, u8),
    pub walk: Walk,
    /// `rb_iseq_constant_body`: `iseq_size`, `iseq_encoded`, `location` and in it
    /// `pathobj`, `label`, `first_lineno`; `insns_info.body`, `.size`,
    /// `.succ_index_table`.
    pub body_iseq_size: u16,
    pub body_iseq_encoded: u16,
    pub body_location: u16,
    pub location_pathobj: u16,
    pub location_label: u16,
    pub location_first_lineno: u16,
    pub body_insns_body: u16,
    pub body_insns_size: u16,
    pub body_insns_succ: u16,
    /// `sizeof(struct iseq_insn_info_entry)`; its `line_no` comes first.
    pub insn_info_size: u16,
    /// `RString`: the no-embed flag, the embedded length's mask and shift in the flags
    /// (a mask of 0: from 3.2 an embedded string's length is in `len` too), and where
    /// the heap length, heap pointer and embedded bytes are.
    pub string_noembed: u64,
    pub string_embed_len_mask: u64,
    pub string_embed_len_shift: u32,
    pub string_heap_len: u16,
    pub string_heap_ptr: u16,
    pub string_embed: u16,
    /// `RArray`: the embed flag, and where the heap pointer and embedded values are.
    pub array_embed_flag: u64,
    pub array_heap_ptr: u16,
    pub array_embed: u16,
}

/// The layouts known, by version: release builds for x86-64, from each release's
/// `vm_core.h`, `iseq.h` and `include/ruby/internal/core/rstring.h`/`rarray.h`. 3.1's is
/// checked against the `rb_mjit_min_header` Debian's Ruby installs, which gathers them.
/// 3.0's, 3.2's and 3.3's are the offsets of those headers as bindgen gives them (the
/// rbspy-ruby-structs crate publishes its output for every release; its 3.1 agrees with
/// 3.1's entry field by field), not checked against a running VM: no registry here has a
/// Ruby of those versions that keeps its VM's symbols (Debian 13's 3.3 hides them).
pub const LAYOUTS: &[Layout] = &[
    // 3.0: the thread is known by its `pthread_t` (`thread_id`), and a control frame has
    // no `__bp__`.
    Layout {
        version: (3, 0),
        walk: Walk {
            thread_tid: 80,
            thread_key: super::python::THREAD_KEY_PTHREAD,
            cfp_size: 56,
            ..WALK_3_1
        },
        insn_info_size: 8,
        ..LAYOUT_3_1
    },
    LAYOUT_3_1,
    LAYOUT_3_2,
    // 3.3: the ractor's thread list and the native thread's id moved; control frames
    // lost `__bp__`.
    Layout {
        version: (3, 3),
        walk: Walk {
            ractor_threads: 256,
            thread_tid: 24,
            cfp_size: 56,
            ..WALK_3_2
        },
        ..LAYOUT_3_2
    },
];

const WALK_3_1: Walk = Walk {
    vm_main_ractor: 32,
    ractor_threads: 304,
    thread_lt_node: 0,
    thread_tid: 88,
    thread_ec: 40,
    ec_vm_stack: 0,
    ec_vm_stack_size: 8,
    ec_cfp: 16,
    cfp_size: 64,
    cfp_pc: 0,
    cfp_iseq: 16,
    cfp_ep: 32,
    iseq_body: 16,
    thread_nt: ABSENT,
    thread_key: super::python::THREAD_KEY_TID,
};

const LAYOUT_3_1: Layout = Layout {
    version: (3, 1),
    walk: WALK_3_1,
    body_iseq_size: 4,
    body_iseq_encoded: 8,
    body_location: 64,
    location_pathobj: 0,
    location_label: 16,
    location_first_lineno: 24,
    body_insns_body: 120,
    body_insns_size: 136,
    body_insns_succ: 144,
    insn_info_size: 12,
    string_noembed: 1 << 13,
    string_embed_len_mask: 0x1f << 14,
    string_embed_len_shift: 14,
    string_heap_len: 16,
    string_heap_ptr: 24,
    string_embed: 16,
    array_embed_flag: 1 << 13,
    array_heap_ptr: 32,
    array_embed: 16,
};

const WALK_3_2: Walk = Walk {
    thread_nt: 40,
    thread_tid: 16,
    thread_ec: 48,
    ..WALK_3_1
};

/// 3.2: the kernel's thread id moved to the native thread (`nt`), and an embedded
/// string's length to `len`, before its bytes.
const LAYOUT_3_2: Layout = Layout {
    version: (3, 2),
    walk: WALK_3_2,
    body_insns_body: 112,
    body_insns_size: 128,
    body_insns_succ: 136,
    string_embed_len_mask: 0,
    string_embed_len_shift: 0,
    string_embed: 24,
    ..LAYOUT_3_1
};

/// Why a Ruby process is profiled with native frames only.
pub fn layout(version: (u8, u8)) -> Result<&'static Layout, String> {
    LAYOUTS
        .iter()
        .find(|layout| layout.version == version)
        .ok_or_else(|| format!("Ruby {}.{} has no known layout", version.0, version.1))
}

/// Whether a mapped file may hold the Ruby VM, by its name.
pub fn may_be_interpreter(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.starts_with("libruby") || name.starts_with("ruby")
}

/// A file holding the Ruby VM.
#[derive(Debug, Clone)]
pub struct Binary {
    /// Virtual addresses in the file.
    /// `None` when the file does not name it: Ruby 3.3 hides the symbol from the
    /// dynamic table, and Debian strips the rest, so its `libruby` is profiled natively,
    /// with that reason.
    pub vm_ptr: Option<u64>,
    pub version: (u8, u8),
    /// `rb_vm_exec`, and `vm_exec_core` when found.
    pub exec: Vec<Range<u64>>,
    loads: super::Loads,
}

/// The smallest function taken for the VM's instruction loop: it inlines the code of
/// every instruction.
const MIN_CORE_BYTES: u64 = 4096;

impl Binary {
    /// Reads an ELF file's VM symbols; `None` when it is not a VM (no
    /// `ruby_current_vm_ptr`, and no `ruby_version` either).
    pub fn read(path: &Path) -> Option<Binary> {
        let file = std::fs::File::open(path).ok()?;
        let cache = object::ReadCache::new(file);
        let elf = object::File::parse(&cache).ok()?;
        let mut vm_ptr = None;
        let mut version_at = None;
        let mut exec = None;
        for symbol in elf.dynamic_symbols().chain(elf.symbols()) {
            let Ok(name) = symbol.name() else { continue };
            if symbol.address() == 0 {
                continue;
            }
            match name {
                "ruby_current_vm_ptr" => vm_ptr = Some(symbol.address()),
                "ruby_version" => version_at = Some(symbol.address()),
                "rb_vm_exec" => {
                    exec = Some(symbol.address()..symbol.address() + symbol.size().max(1))
                }
                _ => {}
            }
        }
        if vm_ptr.is_none() && version_at.is_none() {
            return None;
        }
        let bytes_at = |address: u64, len: u64| -> Option<&[u8]> {
            elf.segments()
                .find_map(|segment| segment.data_range(address, len).ok().flatten())
        };
        let version = version_at
            .and_then(|at| bytes_at(at, 8))
            .and_then(parse_version)?;
        let mut ranges = Vec::new();
        if let Some(exec) = exec {
            let hdr = elf.section_by_name(".eh_frame_hdr");
            let starts = match hdr
                .as_ref()
                .and_then(|s| Some((s.address(), s.data().ok()?)))
            {
                Some((address, data)) => crate::unwind::function_starts(address, data),
                None => Vec::new(),
            };
            let code = bytes_at(exec.start, exec.end - exec.start).unwrap_or_default();
            if let Some(core) = exec_core(exec.start, code, starts) {
                ranges.push(core);
            }
            ranges.push(exec);
        }
        Some(Binary {
            vm_ptr,
            version,
            exec: ranges,
            loads: super::Loads::of(&elf),
        })
    }
}

/// `3.1.2` (and the NUL after it) as (3, 1).
fn parse_version(bytes: &[u8]) -> Option<(u8, u8)> {
    let text = bytes.split(|b| *b == 0).next()?;
    let text = std::str::from_utf8(text).ok()?;
    let mut parts = text.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// The VM's instruction loop: of the functions `code` (at `address`) calls with a
/// relative `call`, the largest, if it is large enough. A byte pattern that only looks
/// like a call lands on a function's start only by chance, and then on a small one.
pub fn exec_core(address: u64, code: &[u8], mut starts: Vec<u64>) -> Option<Range<u64>> {
    starts.sort_unstable();
    starts.dedup();
    let extent = |start: u64| -> Option<Range<u64>> {
        let at = starts.binary_search(&start).ok()?;
        Some(start..*starts.get(at + 1)?)
    };
    let mut best: Option<Range<u64>> = None;
    for at in 0..code.len().saturating_sub(4) {
        if code[at] != 0xe8 {
            continue;
        }
        let relative = i32::from_le_bytes([code[at + 1], code[at + 2], code[at + 3], code[at + 4]]);
        let target = address
            .wrapping_add(at as u64 + 5)
            .wrapping_add_signed(i64::from(relative));
        if let Some(range) = extent(target) {
            if best
                .as_ref()
                .is_none_or(|b| range.end - range.start > b.end - b.start)
            {
                best = Some(range);
            }
        }
    }
    best.filter(|range| range.end - range.start >= MIN_CORE_BYTES)
}

/// An instruction sequence as read: what names its frames.
#[derive(Debug)]
struct Code {
    label: String,
    path: String,
    first_line: i64,
    encoded: u64,
    /// The line of each instruction info entry.
    lines: Vec<i32>,
    /// The succinct index of the entries' positions, when there is more than one.
    index: Vec<u8>,
}

const MAX_CODES: usize = 65_536;
const MAX_STRING: usize = 4096;
/// Instruction info entries read, at most.
const MAX_ENTRIES: usize = 1 << 18;

/// `T_IMEMO`, `T_STRING`, `T_ARRAY` in an object's flags, and an iseq's imemo type.
const T_MASK: u64 = 0x1f;
const T_IMEMO: u64 = 0x1a;
const T_STRING: u64 = 0x05;
const T_ARRAY: u64 = 0x07;
const IMEMO_ISEQ: u64 = 7;

/// One Ruby process: its layout, where its VM loop runs, and its named sequences.
#[derive(Debug)]
pub struct Runtime {
    pub layout: &'static Layout,
    pub proc: ProcLayout,
    pub exec: Vec<Range<u64>>,
    memory: Memory,
    codes: HashMap<(u64, u32), Option<Arc<Code>>>,
}

impl Runtime {
    /// The process's VM, from its binary mapped at `start` (file offset `pgoff`).
    pub fn new(pid: u32, binary: &Binary, start: u64, pgoff: u64) -> Result<Runtime, String> {
        let bias = binary
            .loads
            .bias(start, pgoff)
            .ok_or("the VM's code segment is not where it was mapped")?;
        let vm_ptr = binary
            .vm_ptr
            .ok_or("ruby_current_vm_ptr is not in its symbols (stripped)")?;
        let layout = layout(binary.version)?;
        if binary.exec.is_empty() {
            return Err("rb_vm_exec is not in its symbols".into());
        }
        Ok(Runtime {
            layout,
            proc: ProcLayout {
                runtime: vm_ptr.wrapping_add(bias),
                kind: RUNTIME_RUBY,
                version: u32::from(binary.version.0) << 8 | u32::from(binary.version.1),
                walk: layout.walk.words(),
            },
            exec: binary
                .exec
                .iter()
                .map(|range| range.start.wrapping_add(bias)..range.end.wrapping_add(bias))
                .collect(),
            memory: Memory { pid },
            codes: HashMap::new(),
        })
    }

    /// Whether a native frame's address is in the VM's loop.
    pub fn in_loop(&self, address: u64) -> bool {
        self.exec.iter().any(|range| range.contains(&address))
    }

    /// The frame's label, path and line, and whether its code has begun (a frame just
    /// pushed, or the placeholder `<main>` CRuby keeps under the main thread's frames,
    /// has its program counter at the first instruction); `None` when its sequence
    /// cannot be read.
    pub fn name(
        &mut self,
        iseq: u64,
        fingerprint: u32,
        pc: u64,
    ) -> Option<(String, String, i64, bool)> {
        if self.codes.len() >= MAX_CODES {
            self.codes.clear();
        }
        let entry = self.codes.entry((iseq, fingerprint)).or_insert_with(|| {
            read_code(&self.memory, self.layout, iseq, fingerprint).map(Arc::new)
        });
        let code = entry.clone()?;
        // The program counter points past the instruction running (vm_core.h's
        // `calc_pos` steps back one).
        let position = pc
            .checked_sub(code.encoded)
            .map(|bytes| (bytes / 8).saturating_sub(1));
        let line = position
            .and_then(|position| {
                let entry = if code.lines.len() == 1 {
                    0
                } else {
                    succinct_rank(&code.index, position)?.checked_sub(1)?
                };
                code.lines.get(usize::try_from(entry).ok()?).copied()
            })
            .map_or(code.first_line, i64::from);
        Some((
            code.label.clone(),
            code.path.clone(),
            line,
            pc != code.encoded,
        ))
    }

    pub fn bytes(&self) -> usize {
        self.codes
            .values()
            .flatten()
            .map(|code| {
                code.label.len() + code.path.len() + code.lines.len() * 4 + code.index.len() + 64
            })
            .sum()
    }
}

fn read_code(memory: &Memory, layout: &Layout, iseq: u64, fingerprint: u32) -> Option<Code> {
    let flags = memory.u64(iseq)?;
    if flags & T_MASK != T_IMEMO || (flags >> 12) & 0xf != IMEMO_ISEQ {
        return None;
    }
    let body = memory.u64(iseq + u64::from(layout.walk.iseq_body))?;
    if body as u32 != fingerprint {
        return None;
    }
    let field = |offset: u16| memory.u64(body + u64::from(offset));
    let location = layout.body_location;
    let label = read_string(memory, layout, field(location + layout.location_label)?)?;
    let path =
        path_of(memory, layout, field(location + layout.location_pathobj)?).unwrap_or_default();
    // A Fixnum: the value shifted left, tagged with 1.
    let first_line = (field(location + layout.location_first_lineno)? as i64) >> 1;
    let encoded = field(layout.body_iseq_encoded)?;
    let size = memory.u32(body + u64::from(layout.body_iseq_size))?;
    let entries = usize::try_from(memory.u32(body + u64::from(layout.body_insns_size))?).ok()?;
    let table = field(layout.body_insns_body)?;
    let stride = usize::from(layout.insn_info_size);
    let raw = memory.bytes(table, entries * stride, MAX_ENTRIES * stride)?;
    let lines = raw
        .chunks_exact(stride)
        .map(|entry| i32::from_ne_bytes([entry[0], entry[1], entry[2], entry[3]]))
        .collect();
    let index = if entries > 1 {
        let succ = field(layout.body_insns_succ)?;
        let blocks = u64::from(size).saturating_sub(IMMEDIATE_BITS).div_ceil(512);
        let len = IMMEDIATE_BYTES + usize::try_from(blocks).ok()? * BLOCK_BYTES;
        memory.bytes(succ, len, IMMEDIATE_BYTES + MAX_ENTRIES * BLOCK_BYTES)?
    } else {
        Vec::new()
    };
    Some(Code {
        label,
        path,
        first_line,
        encoded,
        lines,
        index,
    })
}

/// A `pathobj`: a path string, or an array of the path and the real path.
fn path_of(memory: &Memory, layout: &Layout, object: u64) -> Option<String> {
    let flags = memory.u64(object)?;
    match flags & T_MASK {
        T_STRING => read_string(memory, layout, object),
        T_ARRAY => {
            let elements = if flags & layout.array_embed_flag != 0 {
                object + u64::from(layout.array_embed)
            } else {
                memory.u64(object + u64::from(layout.array_heap_ptr))?
            };
            read_string(memory, layout, memory.u64(elements)?)
        }
        _ => None,
    }
}

/// A `String`, embedded in its object or on the heap.
fn read_string(memory: &Memory, layout: &Layout, object: u64) -> Option<String> {
    let flags = memory.u64(object)?;
    if flags & T_MASK != T_STRING {
        return None;
    }
    let bytes = if flags & layout.string_noembed != 0 {
        let len = usize::try_from(memory.u64(object + u64::from(layout.string_heap_len))?).ok()?;
        let ptr = memory.u64(object + u64::from(layout.string_heap_ptr))?;
        memory.bytes(ptr, len, MAX_STRING)?
    } else {
        let len = if layout.string_embed_len_mask == 0 {
            memory.u64(object + u64::from(layout.string_heap_len))?
        } else {
            (flags & layout.string_embed_len_mask) >> layout.string_embed_len_shift
        };
        memory.bytes(
            object + u64::from(layout.string_embed),
            len as usize,
            MAX_STRING,
        )?
    };
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// Positions below this are ranked from the immediate part: 9 ranks of 7 bits in each of
/// its 6 words.
const IMMEDIATE_BITS: u64 = 54;
const IMMEDIATE_BYTES: usize = 48;
/// A block of 512 positions: its rank (`u32`, padded to 8), 7 sub-block ranks of 9 bits
/// in a word, and the 512 bits.
const BLOCK_BYTES: usize = 80;

/// CRuby's `succ_index_lookup` (iseq.c): how many entries start at or before `position`.
/// `None` past the table.
pub fn succinct_rank(index: &[u8], position: u64) -> Option<u64> {
    let word = |at: usize| -> Option<u64> {
        Some(u64::from_ne_bytes(index.get(at..at + 8)?.try_into().ok()?))
    };
    if position < IMMEDIATE_BITS {
        let (i, j) = (position / 9, position % 9);
        return Some((word(usize::try_from(i).ok()? * 8)? >> (j * 7)) & 0x7f);
    }
    let bit = position - IMMEDIATE_BITS;
    let block = IMMEDIATE_BYTES + usize::try_from(bit / 512).ok()? * BLOCK_BYTES;
    let rank = u64::from(u32::from_ne_bytes(
        index.get(block..block + 4)?.try_into().ok()?,
    ));
    let in_block = bit % 512;
    let small = in_block / 64;
    let small_rank = if small == 0 {
        0
    } else {
        (word(block + 8)? >> ((small - 1) * 9)) & 0x1ff
    };
    let bits = word(block + 16 + usize::try_from(small).ok()? * 8)?;
    let below = (bits << (63 - in_block % 64)).count_ones();
    Some(rank + small_rank + u64::from(below))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A succinct index built as CRuby's `succ_index_table_create` builds it, for entries
    /// starting at `positions`.
    fn build_index(positions: &[u64], max: u64) -> Vec<u8> {
        let set = |p: u64| positions.contains(&p);
        let rank_to = |p: u64| (0..=p).filter(|q| set(*q)).count() as u64;
        let mut out = Vec::new();
        for i in 0..6u64 {
            let mut word = 0u64;
            for j in 0..9u64 {
                let p = i * 9 + j;
                word |= rank_to(p) << (j * 7);
            }
            out.extend_from_slice(&word.to_ne_bytes());
        }
        let blocks = max.saturating_sub(IMMEDIATE_BITS).div_ceil(512);
        for b in 0..blocks {
            let base = IMMEDIATE_BITS + b * 512;
            let rank = if base == 0 { 0 } else { rank_to(base - 1) };
            out.extend_from_slice(&(rank as u32).to_ne_bytes());
            out.extend_from_slice(&[0; 4]);
            let mut small = 0u64;
            let mut bits = [0u64; 8];
            for s in 0..8u64 {
                let start = base + s * 64;
                if s > 0 {
                    let in_block = (base..start).filter(|q| set(*q)).count() as u64;
                    small |= in_block << ((s - 1) * 9);
                }
                for k in 0..64 {
                    if set(start + k) {
                        bits[s as usize] |= 1 << k;
                    }
                }
            }
            out.extend_from_slice(&small.to_ne_bytes());
            for word in bits {
                out.extend_from_slice(&word.to_ne_bytes());
            }
        }
        out
    }

    #[test]
    fn the_succinct_index_ranks_positions_as_cruby_does() {
        let positions: Vec<u64> = [0, 3, 7, 53, 54, 60, 200, 565, 566, 1100]
            .into_iter()
            .collect();
        let index = build_index(&positions, 1200);
        for position in 0..1200 {
            let expected = positions.iter().filter(|p| **p <= position).count() as u64;
            assert_eq!(
                succinct_rank(&index, position),
                Some(expected),
                "at {position}"
            );
        }
        // Past the table: no rank, no panic.
        assert_eq!(succinct_rank(&index, 10_000), None);
        assert_eq!(succinct_rank(&[], 3), None);
    }

    #[test]
    fn versions_and_names() {
        assert_eq!(parse_version(b"3.1.2\0xx"), Some((3, 1)));
        assert_eq!(parse_version(b"x"), None);
        assert!(may_be_interpreter(
            "/usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1.2"
        ));
        assert!(may_be_interpreter("/opt/rb/bin/ruby"));
        assert!(!may_be_interpreter("/usr/bin/python3"));
        // A version without a layout is refused with a reason, never read with another's.
        assert_eq!(
            layout((3, 4)).map(|l| l.version),
            Err("Ruby 3.4 has no known layout".to_string())
        );
        for version in [(3, 0), (3, 1), (3, 2), (3, 3)] {
            assert_eq!(layout(version).map(|l| l.version), Ok(version));
        }
    }

    #[test]
    fn the_instruction_loop_is_the_largest_function_called() {
        // At 0x1000: a call to 0x2000 (small), a byte pattern that only looks like a call
        // (into the middle of nothing), and a call to 0x3000 (large).
        let mut code = vec![0x90; 32];
        let call = |code: &mut Vec<u8>, at: usize, target: u64| {
            code[at] = 0xe8;
            let relative = (target as i64 - (0x1000 + at as i64 + 5)) as i32;
            code[at + 1..at + 5].copy_from_slice(&relative.to_le_bytes());
        };
        call(&mut code, 0, 0x2000);
        call(&mut code, 10, 0x2345);
        call(&mut code, 20, 0x3000);
        let starts = vec![0x1000, 0x2000, 0x2100, 0x3000, 0x9000];
        assert_eq!(
            exec_core(0x1000, &code, starts.clone()),
            Some(0x3000..0x9000)
        );
        // Only small callees: none is the loop.
        let mut small = vec![0x90; 8];
        call(&mut small, 0, 0x2000);
        assert_eq!(exec_core(0x1000, &small, starts), None);
    }

    /// The 3.1 entry against the headers of the Ruby installed here, when there is one:
    /// the offsets a C compiler computes from the `rb_mjit_min_header` it ships.
    #[test]
    fn a_layout_per_version_matches_its_headers() {
        let Some((header, version)) = installed_header() else {
            eprintln!("skipped: no Ruby with an rb_mjit_min_header here");
            return;
        };
        let Ok(layout) = layout(version) else {
            panic!("Ruby {version:?} is installed but has no layout");
        };
        // The header's inline functions name the VM's symbols; nothing calls them.
        let Some(values) = super::super::c_values(
            &OFFSETS_C.replace("HEADER", &header.to_string_lossy()),
            &["-no-pie", "-Wl,--unresolved-symbols=ignore-all"],
        ) else {
            eprintln!("skipped: no C compiler");
            return;
        };
        let value = |name: &str| -> u64 {
            *values
                .get(name)
                .unwrap_or_else(|| panic!("{name} missing from {values:?}"))
        };
        let walk = layout.walk;
        let pairs: &[(&str, u64)] = &[
            ("vm_main_ractor", walk.vm_main_ractor.into()),
            ("ractor_threads", walk.ractor_threads.into()),
            ("thread_lt_node", walk.thread_lt_node.into()),
            ("thread_tid", walk.thread_tid.into()),
            ("thread_ec", walk.thread_ec.into()),
            ("ec_vm_stack", walk.ec_vm_stack.into()),
            ("ec_vm_stack_size", walk.ec_vm_stack_size.into()),
            ("ec_cfp", walk.ec_cfp.into()),
            ("cfp_size", walk.cfp_size.into()),
            ("cfp_pc", walk.cfp_pc.into()),
            ("cfp_iseq", walk.cfp_iseq.into()),
            ("cfp_ep", walk.cfp_ep.into()),
            ("iseq_body", walk.iseq_body.into()),
            ("body_iseq_size", layout.body_iseq_size.into()),
            ("body_iseq_encoded", layout.body_iseq_encoded.into()),
            ("body_location", layout.body_location.into()),
            ("location_pathobj", layout.location_pathobj.into()),
            ("location_label", layout.location_label.into()),
            ("location_first_lineno", layout.location_first_lineno.into()),
            ("body_insns_body", layout.body_insns_body.into()),
            ("body_insns_size", layout.body_insns_size.into()),
            ("body_insns_succ", layout.body_insns_succ.into()),
            ("insn_info_size", layout.insn_info_size.into()),
            ("string_noembed", layout.string_noembed),
            ("string_embed_len_mask", layout.string_embed_len_mask),
            (
                "string_embed_len_shift",
                layout.string_embed_len_shift.into(),
            ),
            ("string_heap_len", layout.string_heap_len.into()),
            ("string_heap_ptr", layout.string_heap_ptr.into()),
            ("string_embed", layout.string_embed.into()),
            ("array_embed_flag", layout.array_embed_flag),
            ("array_heap_ptr", layout.array_heap_ptr.into()),
            ("array_embed", layout.array_embed.into()),
            ("t_imemo", T_IMEMO),
            ("t_string", T_STRING),
            ("t_array", T_ARRAY),
            ("imemo_iseq", IMEMO_ISEQ),
            ("frame_finish", 0x20),
            ("frame_magic_cfunc", 0x5555_0001),
            ("frame_magic_mask", 0x7fff_0001),
        ];
        for (name, expected) in pairs {
            assert_eq!(value(name), *expected, "{name}");
        }
    }

    /// The installed Ruby's `rb_mjit_min_header-*.h` and its version.
    fn installed_header() -> Option<(std::path::PathBuf, (u8, u8))> {
        let output = std::process::Command::new("ruby")
            .args([
                "-e",
                "print RbConfig::CONFIG['rubyarchhdrdir'], \"\\n\", RUBY_VERSION",
            ])
            .output()
            .ok()?;
        let text = String::from_utf8(output.stdout).ok()?;
        let mut lines = text.lines();
        let dir = std::path::PathBuf::from(lines.next()?);
        let version = parse_version(lines.next()?.as_bytes())?;
        let header = std::fs::read_dir(&dir).ok()?.flatten().find_map(|entry| {
            let name = entry.file_name();
            name.to_string_lossy()
                .starts_with("rb_mjit_min_header-")
                .then(|| entry.path())
        })?;
        Some((header, version))
    }

    const OFFSETS_C: &str = r#"
#include "HEADER"
#include <stddef.h>
#include <stdio.h>
#define P(name, type, field) printf(name " %zu\n", offsetof(type, field))
#define V(name, value) printf(name " %lu\n", (unsigned long)(value))
int main(void) {
    P("vm_main_ractor", rb_vm_t, ractor.main_ractor);
    P("ractor_threads", rb_ractor_t, threads.set);
    P("thread_lt_node", rb_thread_t, lt_node);
    P("thread_tid", rb_thread_t, tid);
    P("thread_ec", rb_thread_t, ec);
    P("ec_vm_stack", rb_execution_context_t, vm_stack);
    P("ec_vm_stack_size", rb_execution_context_t, vm_stack_size);
    P("ec_cfp", rb_execution_context_t, cfp);
    V("cfp_size", sizeof(rb_control_frame_t));
    P("cfp_pc", rb_control_frame_t, pc);
    P("cfp_iseq", rb_control_frame_t, iseq);
    P("cfp_ep", rb_control_frame_t, ep);
    P("iseq_body", rb_iseq_t, body);
    P("body_iseq_size", struct rb_iseq_constant_body, iseq_size);
    P("body_iseq_encoded", struct rb_iseq_constant_body, iseq_encoded);
    P("body_location", struct rb_iseq_constant_body, location);
    P("location_pathobj", rb_iseq_location_t, pathobj);
    P("location_label", rb_iseq_location_t, label);
    P("location_first_lineno", rb_iseq_location_t, first_lineno);
    P("body_insns_body", struct rb_iseq_constant_body, insns_info.body);
    P("body_insns_size", struct rb_iseq_constant_body, insns_info.size);
    P("body_insns_succ", struct rb_iseq_constant_body, insns_info.succ_index_table);
    V("insn_info_size", sizeof(struct iseq_insn_info_entry));
    P("string_heap_len", struct RString, as.heap.len);
    P("string_heap_ptr", struct RString, as.heap.ptr);
    P("string_embed", struct RString, as.embed.ary);
    P("array_heap_ptr", struct RArray, as.heap.ptr);
    P("array_embed", struct RArray, as.ary);
    V("string_noembed", RSTRING_NOEMBED);
    V("string_embed_len_mask", RSTRING_EMBED_LEN_MASK);
    V("string_embed_len_shift", RSTRING_EMBED_LEN_SHIFT);
    V("array_embed_flag", RARRAY_EMBED_FLAG);
    V("t_imemo", RUBY_T_IMEMO);
    V("t_string", RUBY_T_STRING);
    V("t_array", RUBY_T_ARRAY);
    V("imemo_iseq", imemo_iseq);
    V("frame_finish", VM_FRAME_FLAG_FINISH);
    V("frame_magic_cfunc", VM_FRAME_MAGIC_CFUNC);
    V("frame_magic_mask", VM_FRAME_MAGIC_MASK);
    return 0;
}
"#;
}
