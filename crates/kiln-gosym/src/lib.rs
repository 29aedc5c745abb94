//! Names for addresses in a Go binary from its `.gopclntab`, the table Go's runtime
//! itself reads to print stack traces.
//!
//! Release builds of Go services are stripped (`-ldflags="-s -w"`): `.symtab` and DWARF
//! are gone, but `.gopclntab` must stay, because the runtime needs it for panics, the
//! garbage collector and `runtime.Callers`. So a stripped Go binary still names every
//! function, file and line, and, through the inline trees its functions carry, every
//! call the compiler inlined. No debug file is needed: the binary is its own.
//!
//! # Why this is written here
//! Neither blazesym nor `gimli`/`addr2line` read this table, and no Rust crate of the field
//! does: Go's own `debug/gosym` is the reference reader, and it expands no inlined calls.
//! The format is small and specified by the Go runtime's source (`runtime/symtab.go`,
//! `runtime/symtabinl.go`, `internal/abi/symtab.go`); this crate reads it from byte
//! slices, every offset checked, so a corrupt or hostile file yields fewer names, never a
//! panic (the `gosym_read` fuzz target holds it to that). [`elf`] finds those slices in
//! an ELF file with `object`.
//!
//! # Layout, as read here
//! - A header (`pcHeader`): the magic that gives the layout (Go 1.16–1.17, 1.18–1.19,
//!   1.20 and later), the pc quantum, the pointer size, the function count and the
//!   offsets of five tables within the section: function names, compilation units, file
//!   names, pc-value tables and the function table.
//! - The function table: (entry, offset of `_func`) pairs sorted by entry, one more than
//!   there are functions so the last entry ends the text. From Go 1.18 entries are
//!   32-bit offsets from the module's text start.
//! - `_func`: the name, the pc-value tables of file and line, the `pcdata` tables (the
//!   inline-tree index is number 2) and the `funcdata` (the inline tree is number 3).
//! - A pc-value table is a sequence of (zig-zag value delta, pc delta) varint pairs from
//!   the function's entry, starting at -1.
//!
//! Two things are not in the section. The text start (from Go 1.26 the header no longer
//! holds it) and, from Go 1.18, the base that `funcdata` offsets count from
//! (`moduledata.gofunc`) are fields of the runtime's `moduledata`, a structure in the
//! binary's data whose first field points at the header. It is found by that pointer;
//! the text start is its 23rd word in every layout since 1.16, and `gofunc`, whose
//! position moved between releases, is the word whose inline trees read as inline trees
//! (names that start a string in the name table, call sites inside their function).
//! When `moduledata` cannot be read (a position-independent binary holds it as
//! relocations, zero in the file), the text start falls back to `.text` and calls
//! stay folded into their callers: names and lines remain right, inlined callees are
//! not frames of their own.

use std::fmt;

pub mod elf;

/// Magic numbers of the layouts read here (`internal/abi/symtab.go`).
const GO116: u32 = 0xffff_fffa;
const GO118: u32 = 0xffff_fff0;
const GO120: u32 = 0xffff_fff1;
/// Go 1.2–1.15: a different `_func` and name table, not read (no Go release of it is
/// supported upstream any more).
const GO12: u32 = 0xffff_fffb;

/// `internal/abi`: `PCDATA_InlTreeIndex` and `FUNCDATA_InlTree`.
const PCDATA_INLINE_INDEX: u32 = 2;
const FUNCDATA_INLINE_TREE: u32 = 3;
/// Bounds a chain of inlined calls, which a corrupt tree could make a cycle of.
const MAX_INLINE_DEPTH: usize = 64;
/// Bounds one name or path read up to its NUL.
const MAX_NAME: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error(".gopclntab is {0} bytes, too short for its header")]
    Short(usize),
    #[error(".gopclntab of Go 1.2-1.15 (magic {0:#x}) is not read; Go 1.16 and later are")]
    Old(u32),
    #[error(".gopclntab starts with {0:#x}, no Go layout's magic (a big-endian binary?)")]
    Magic(u32),
    #[error(".gopclntab's header is malformed: {0}")]
    Header(&'static str),
}

/// A span of the binary: where it is in the address space and its bytes.
#[derive(Clone, Copy)]
pub struct Section<'a> {
    pub address: u64,
    pub bytes: &'a [u8],
}

/// What [`Table::new`] reads, all borrowed from the binary's sections.
pub struct Image<'a> {
    pub pclntab: Section<'a>,
    /// `.text`'s address: the text start when `moduledata` cannot be read.
    pub text: u64,
    /// The binary's other allocated sections with contents (`.noptrdata`, `.rodata`,
    /// `.data`, …), where `moduledata` and the inline trees live. (The trees may also be
    /// in `.gopclntab` itself, as from Go 1.26: it is read as one of these too.)
    pub data: Vec<Section<'a>>,
}

/// The Go release range a table's layout belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Go116,
    Go118,
    Go120,
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layout::Go116 => "Go 1.16-1.17",
            Layout::Go118 => "Go 1.18-1.19",
            Layout::Go120 => "Go 1.20+",
        })
    }
}

/// One frame at an address: a function, and the file and line executing in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<'a> {
    pub function: &'a str,
    pub file: &'a str,
    pub line: u32,
}

/// A parsed `.gopclntab`, ready to name addresses.
pub struct Table<'a> {
    tab: &'a [u8],
    data: Vec<Section<'a>>,
    layout: Layout,
    quantum: u64,
    ptr: usize,
    functions: usize,
    text: u64,
    names: &'a [u8],
    cutab: &'a [u8],
    files: &'a [u8],
    pctab: &'a [u8],
    functab: &'a [u8],
    /// `moduledata.gofunc` (Go 1.18+), or `Some(0)` for Go 1.16's absolute `funcdata`;
    /// `None` when inline trees cannot be found.
    gofunc: Option<u64>,
}

/// A function's `_func` record, read.
#[derive(Debug, Clone, Copy)]
struct Func {
    entry: u64,
    end: u64,
    name: u32,
    pcfile: u32,
    pcln: u32,
    npcdata: u32,
    cu: u32,
    nfuncdata: u8,
    /// Where the `pcdata` array starts, in `pclntable`.
    pcdata_at: usize,
}

impl<'a> Table<'a> {
    pub fn new(image: Image<'a>) -> Result<Table<'a>, Error> {
        let tab = image.pclntab.bytes;
        if tab.len() < 8 {
            return Err(Error::Short(tab.len()));
        }
        let magic = u32_at(tab, 0).ok_or(Error::Short(tab.len()))?;
        let layout = match magic {
            GO116 => Layout::Go116,
            GO118 => Layout::Go118,
            GO120 => Layout::Go120,
            GO12 => return Err(Error::Old(magic)),
            other => return Err(Error::Magic(other)),
        };
        if tab[4] != 0 || tab[5] != 0 {
            return Err(Error::Header("padding is not zero"));
        }
        let quantum = u64::from(tab[6]);
        let ptr = usize::from(tab[7]);
        if !matches!(quantum, 1 | 2 | 4) || !matches!(ptr, 4 | 8) {
            return Err(Error::Header("pc quantum or pointer size out of range"));
        }
        let word = |index: usize| word_at(tab, 8 + index * ptr, ptr).ok_or(Error::Short(tab.len()));
        let functions = word(0)?;
        // Go 1.18+ has the (now unused) text start as the third word.
        let (text_field, first) = match layout {
            Layout::Go116 => (0, 2),
            _ => (word(2)?, 3),
        };
        let table = |index: usize| -> Result<&'a [u8], Error> {
            let offset = usize::try_from(word(first + index)?)
                .map_err(|_| Error::Header("table offset out of range"))?;
            tab.get(offset..)
                .ok_or(Error::Header("table offset past the section"))
        };
        let names = table(0)?;
        let cutab = table(1)?;
        let files = table(2)?;
        let pctab = table(3)?;
        let functab = table(4)?;
        let functions = usize::try_from(functions)
            .ok()
            .filter(|n| {
                n.saturating_add(1)
                    .saturating_mul(functab_entry(layout, ptr))
                    <= functab.len()
            })
            .ok_or(Error::Header(
                "more functions than the function table holds",
            ))?;
        let mut data = image.data;
        data.push(image.pclntab);
        let mut table = Table {
            tab,
            data,
            layout,
            quantum,
            ptr,
            functions,
            text: if text_field != 0 {
                text_field
            } else {
                image.text
            },
            names,
            cutab,
            files,
            pctab,
            functab,
            gofunc: None,
        };
        let (text, gofunc) = table.read_moduledata(image.pclntab.address);
        if let Some(text) = text {
            table.text = text;
        }
        table.gofunc = gofunc;
        Ok(table)
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    pub fn functions(&self) -> usize {
        self.functions
    }

    /// Whether calls the compiler inlined come out as frames of their own.
    pub fn inlining(&self) -> bool {
        self.gofunc.is_some()
    }

    /// The frames executing at `pc`, innermost (an inlined callee) first and the function
    /// that holds the code last, as pprof lists a location's lines. Empty when no
    /// function holds `pc`.
    pub fn frames(&self, pc: u64) -> Vec<Frame<'a>> {
        let Some(func) = self.find(pc) else {
            return Vec::new();
        };
        let mut frames = Vec::new();
        let (mut file, mut line) = self.position(&func, pc);
        let mut at = pc;
        let tree = self.inline_tree(&func);
        while let Some(tree) = tree {
            if frames.len() >= MAX_INLINE_DEPTH {
                break;
            }
            let Some(index) = self
                .pcdata(&func, PCDATA_INLINE_INDEX, at)
                .and_then(|i| usize::try_from(i).ok())
            else {
                break;
            };
            let Some(call) = self.inlined_call(tree, index) else {
                break;
            };
            frames.push(Frame {
                function: self.name(call.name).unwrap_or("?"),
                file,
                line,
            });
            at = func.entry.saturating_add(u64::from(call.parent_pc));
            if at >= func.end {
                break;
            }
            (file, line) = self.position(&func, at);
        }
        frames.push(Frame {
            function: self.name(func.name).unwrap_or("?"),
            file,
            line,
        });
        frames
    }

    /// The function whose code holds `pc`.
    fn find(&self, pc: u64) -> Option<Func> {
        let (mut low, mut high) = (0usize, self.functions);
        // Entries are sorted; find the last whose entry is at most `pc`.
        while low < high {
            let mid = low + (high - low) / 2;
            if self.entry(mid)? <= pc {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        let index = low.checked_sub(1)?;
        let end = self.entry(index + 1)?;
        if pc >= end {
            return None;
        }
        self.func(index, end)
    }

    fn entry(&self, index: usize) -> Option<u64> {
        let size = functab_entry(self.layout, self.ptr);
        let at = index.checked_mul(size)?;
        match self.layout {
            Layout::Go116 => word_at(self.functab, at, self.ptr),
            _ => Some(
                self.text
                    .checked_add(u64::from(u32_at(self.functab, at)?))?,
            ),
        }
    }

    fn func(&self, index: usize, end: u64) -> Option<Func> {
        let size = functab_entry(self.layout, self.ptr);
        let at = index.checked_mul(size)?;
        let offset = match self.layout {
            Layout::Go116 => {
                usize::try_from(word_at(self.functab, at + self.ptr, self.ptr)?).ok()?
            }
            _ => usize::try_from(u32_at(self.functab, at + 4)?).ok()?,
        };
        let record = self.functab.get(offset..)?;
        let entry = self.entry(index)?;
        // Field offsets after the entry (a pointer in Go 1.16, a 32-bit offset after).
        let base = match self.layout {
            Layout::Go116 => self.ptr,
            _ => 4,
        };
        // name, args, deferreturn, pcsp, pcfile, pcln, npcdata, cuOffset (4 bytes each),
        // startLine from Go 1.20, then funcID, flag, a pad byte and nfuncdata.
        let (nfuncdata_at, pcdata_at) = match self.layout {
            Layout::Go116 | Layout::Go118 => (base + 35, base + 36),
            Layout::Go120 => (base + 39, base + 40),
        };
        Some(Func {
            entry,
            end,
            name: u32_at(record, base)?,
            pcfile: u32_at(record, base + 16)?,
            pcln: u32_at(record, base + 20)?,
            npcdata: u32_at(record, base + 24)?,
            cu: u32_at(record, base + 28)?,
            nfuncdata: *record.get(nfuncdata_at)?,
            pcdata_at: offset.checked_add(pcdata_at)?,
        })
    }

    /// File and line executing at `pc` in `func`.
    fn position(&self, func: &Func, pc: u64) -> (&'a str, u32) {
        let file = self
            .pcvalue(func, func.pcfile, pc)
            .and_then(|index| self.file(func.cu, index))
            .unwrap_or("?");
        let line = self
            .pcvalue(func, func.pcln, pc)
            .and_then(|line| u32::try_from(line).ok())
            .unwrap_or(0);
        (file, line)
    }

    fn file(&self, cu: u32, index: i64) -> Option<&'a str> {
        let slot = usize::try_from(i64::from(cu).checked_add(index)?).ok()?;
        let offset = u32_at(self.cutab, slot.checked_mul(4)?)?;
        if offset == u32::MAX {
            return None;
        }
        c_string(self.files, usize::try_from(offset).ok()?)
    }

    fn name(&self, offset: u32) -> Option<&'a str> {
        c_string(self.names, usize::try_from(offset).ok()?)
    }

    fn pcdata(&self, func: &Func, table: u32, pc: u64) -> Option<i64> {
        if table >= func.npcdata {
            return None;
        }
        let at = func
            .pcdata_at
            .checked_add(usize::try_from(table).ok()? * 4)?;
        let offset = u32_at(self.functab, at)?;
        self.pcvalue(func, offset, pc)
    }

    /// The value a pc-value table gives at `target`; `None` for no table, a table that
    /// ends before `target`, or -1 (no value there).
    fn pcvalue(&self, func: &Func, offset: u32, target: u64) -> Option<i64> {
        if offset == 0 {
            return None;
        }
        let mut p = self.pctab.get(usize::try_from(offset).ok()?..)?;
        let mut pc = func.entry;
        let mut value: i64 = -1;
        let mut first = true;
        loop {
            let (delta, n) = varint(p)?;
            if delta == 0 && !first {
                return None;
            }
            first = false;
            p = p.get(n..)?;
            // Zig-zag: the low bit is the sign.
            let delta = i64::from((delta >> 1) as i32 ^ -((delta & 1) as i32));
            let (step, n) = varint(p)?;
            p = p.get(n..)?;
            value = value.checked_add(delta)?;
            pc = pc.checked_add(u64::from(step).checked_mul(self.quantum)?)?;
            if target < pc {
                return (value >= 0).then_some(value);
            }
        }
    }

    /// The address of `func`'s inline tree.
    fn inline_tree(&self, func: &Func) -> Option<u64> {
        let gofunc = self.gofunc?;
        if u32::from(func.nfuncdata) <= FUNCDATA_INLINE_TREE {
            return None;
        }
        let pcdata_end = func
            .pcdata_at
            .checked_add(usize::try_from(func.npcdata).ok()?.checked_mul(4)?)?;
        match self.layout {
            Layout::Go116 => {
                // Pointers, aligned to the pointer size within the section.
                let start = self.functab_offset()?.checked_add(pcdata_end)?;
                let aligned = start.div_ceil(self.ptr) * self.ptr - self.functab_offset()?;
                let at = aligned.checked_add(FUNCDATA_INLINE_TREE as usize * self.ptr)?;
                word_at(self.functab, at, self.ptr).filter(|a| *a != 0)
            }
            _ => {
                let at = pcdata_end.checked_add(FUNCDATA_INLINE_TREE as usize * 4)?;
                let offset = u32_at(self.functab, at)?;
                (offset != u32::MAX).then(|| gofunc.checked_add(u64::from(offset)))?
            }
        }
    }

    /// Where the function table starts within the section (for Go 1.16's alignment).
    fn functab_offset(&self) -> Option<usize> {
        (self.functab.as_ptr() as usize).checked_sub(self.tab.as_ptr() as usize)
    }

    fn inlined_call(&self, tree: u64, index: usize) -> Option<InlinedCall> {
        let size = match self.layout {
            Layout::Go120 => 16,
            _ => 20,
        };
        let at = tree.checked_add(u64::try_from(index.checked_mul(size)?).ok()?)?;
        let bytes = self.read(at, size)?;
        Some(match self.layout {
            // funcID, pad[3], nameOff, parentPc, startLine.
            Layout::Go120 => InlinedCall {
                name: u32_at(bytes, 4)?,
                parent_pc: u32_at(bytes, 8)?,
            },
            // parent int16, funcID, pad, file, line, func_ (name), parentPc.
            _ => InlinedCall {
                name: u32_at(bytes, 12)?,
                parent_pc: u32_at(bytes, 16)?,
            },
        })
    }

    /// `len` bytes at virtual address `address`, from the sections given.
    fn read(&self, address: u64, len: usize) -> Option<&'a [u8]> {
        self.data.iter().find_map(|section| {
            let offset = usize::try_from(address.checked_sub(section.address)?).ok()?;
            section.bytes.get(offset..offset.checked_add(len)?)
        })
    }

    fn read_word(&self, address: u64) -> Option<u64> {
        word_at(self.read(address, self.ptr)?, 0, self.ptr)
    }

    /// Finds `moduledata` by its first field, the header's address, and a second one that
    /// confirms it (the function name table's address), then reads the text start and
    /// the inline trees' base from it.
    fn read_moduledata(&self, header: u64) -> (Option<u64>, Option<u64>) {
        let names = header
            .saturating_add((self.names.as_ptr() as usize - self.tab.as_ptr() as usize) as u64);
        let ptr = self.ptr;
        let found = self.data.iter().find_map(|section| {
            let bytes = section.bytes;
            (0..bytes.len().saturating_sub(2 * ptr))
                .step_by(ptr)
                .find(|at| {
                    word_at(bytes, *at, ptr) == Some(header)
                        && word_at(bytes, at + ptr, ptr) == Some(names)
                })
                .map(|at| section.address + at as u64)
        });
        let Some(moduledata) = found else {
            return (None, None);
        };
        let word = |index: u64| self.read_word(moduledata + index * ptr as u64);
        // pcHeader, six slices of three words, findfunctab, minpc, maxpc, then text.
        let text = word(22).filter(|t| *t != 0);
        if self.layout == Layout::Go116 {
            // `funcdata` holds addresses; nothing to find.
            return (text, Some(0));
        }
        // Entries count from the text start, so the samples must be read with it.
        let probe = Table {
            text: text.unwrap_or(self.text),
            data: self.data.clone(),
            ..*self
        };
        // The base is one of the words after `text`; the one under which sampled inline
        // trees read right.
        let samples = probe.inline_tree_offsets(16);
        if samples.is_empty() {
            return (text, None);
        }
        let gofunc = (23..96).map_while(word).find(|candidate| {
            *candidate != 0
                && self.read(*candidate, 1).is_some()
                && samples.iter().all(|(func, offset)| {
                    probe.tree_reads(candidate.saturating_add(u64::from(*offset)), func)
                })
        });
        (text, gofunc)
    }

    /// Up to `count` functions that have an inline tree, with its `funcdata` offset.
    fn inline_tree_offsets(&self, count: usize) -> Vec<(Func, u32)> {
        let mut found = Vec::new();
        let step = (self.functions / (count * 8)).max(1);
        let mut index = 0;
        while index < self.functions && found.len() < count {
            let func = self.entry(index + 1).and_then(|end| self.func(index, end));
            index += step;
            let Some(func) = func else { continue };
            if u32::from(func.nfuncdata) <= FUNCDATA_INLINE_TREE {
                continue;
            }
            let Some(pcdata_end) = usize::try_from(func.npcdata)
                .ok()
                .and_then(|n| func.pcdata_at.checked_add(n.checked_mul(4)?))
            else {
                continue;
            };
            let at = pcdata_end + FUNCDATA_INLINE_TREE as usize * 4;
            if let Some(offset) = u32_at(self.functab, at).filter(|o| *o != u32::MAX) {
                found.push((func, offset));
            }
        }
        found
    }

    /// Whether an inline tree's first entry at `address` reads as one of `func`'s: a
    /// name that starts a string of the name table, and a call site inside `func`.
    fn tree_reads(&self, address: u64, func: &Func) -> bool {
        let size = match self.layout {
            Layout::Go120 => 16,
            _ => 20,
        };
        let Some(bytes) = self.read(address, size) else {
            return false;
        };
        let (name, parent_pc) = match self.layout {
            Layout::Go120 => (u32_at(bytes, 4), u32_at(bytes, 8)),
            _ => (u32_at(bytes, 12), u32_at(bytes, 16)),
        };
        let (Some(name), Some(parent_pc)) = (name, parent_pc) else {
            return false;
        };
        let name = name as usize;
        let starts_string = name == 0 || self.names.get(name - 1) == Some(&0);
        starts_string
            && self.name(name as u32).is_some_and(|n| !n.is_empty())
            && func.entry.saturating_add(u64::from(parent_pc)) < func.end
    }
}

struct InlinedCall {
    name: u32,
    parent_pc: u32,
}

fn functab_entry(layout: Layout, ptr: usize) -> usize {
    match layout {
        Layout::Go116 => 2 * ptr,
        _ => 8,
    }
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn word_at(bytes: &[u8], at: usize, ptr: usize) -> Option<u64> {
    if ptr == 4 {
        return u32_at(bytes, at).map(u64::from);
    }
    let b = bytes.get(at..at.checked_add(8)?)?;
    let mut word = [0u8; 8];
    word.copy_from_slice(b);
    Some(u64::from_le_bytes(word))
}

fn varint(p: &[u8]) -> Option<(u32, usize)> {
    let mut value = 0u32;
    for (n, byte) in p.iter().enumerate().take(5) {
        value |= u32::from(byte & 0x7f) << (7 * n);
        if byte & 0x80 == 0 {
            return Some((value, n + 1));
        }
    }
    None
}

fn c_string(bytes: &[u8], at: usize) -> Option<&str> {
    let rest = bytes.get(at..)?;
    let rest = &rest[..rest.len().min(MAX_NAME)];
    let end = rest.iter().position(|b| *b == 0)?;
    std::str::from_utf8(&rest[..end]).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_zigzag_as_go_writes_them() {
        assert_eq!(varint(&[0x05]), Some((5, 1)));
        assert_eq!(varint(&[0x96, 0x01]), Some((150, 2)));
        assert_eq!(varint(&[0x80, 0x80]), None, "a varint cut short");
        let zigzag = |u: u32| (u >> 1) as i32 ^ -((u & 1) as i32);
        assert_eq!((zigzag(2), zigzag(3), zigzag(0)), (1, -2, 0));
    }

    #[test]
    fn refuses_what_is_no_table() {
        let section = |bytes| Image {
            pclntab: Section { address: 0, bytes },
            text: 0,
            data: Vec::new(),
        };
        assert_eq!(Table::new(section(&[1, 2])).err(), Some(Error::Short(2)));
        let mut old = GO12.to_le_bytes().to_vec();
        old.extend([0, 0, 1, 8]);
        assert_eq!(Table::new(section(&old)).err(), Some(Error::Old(GO12)));
        let mut huge = GO120.to_le_bytes().to_vec();
        huge.extend([0, 0, 1, 8]);
        huge.extend(u64::MAX.to_le_bytes());
        huge.extend([0u8; 64]);
        assert!(matches!(Table::new(section(&huge)), Err(Error::Header(_))));
    }
    /// A Go 1.20 table built by hand: `main.outer` (pc 0-0x40) with `main.inner` inlined
    /// at 0x20-0x40 (called from the instruction at 0x10), and `main.inner` itself
    /// (0x40-0x80). Returns (table, data section holding the inline tree at its start
    /// and `moduledata` at 64).
    fn synthetic() -> (Vec<u8>, Vec<u8>) {
        const TABLE: u64 = 0x4a_0000;
        const DATA: u64 = 0x56_0000;
        let names = b"\0main.outer\0main.inner\0".to_vec();
        let cutab = 0u32.to_le_bytes().to_vec();
        let files = b"main.go\0".to_vec();
        // Offset 0 means "no table", so tables start at 1.
        let mut pctab = vec![0u8];
        let pcfile = pctab.len() as u32;
        pctab.extend([2, 0x40, 0]); // file 0 over 0x40 bytes
        let outer_lines = pctab.len() as u32;
        pctab.extend([22, 0x20, 20, 0x20, 0]); // line 10, then 20 from 0x20
        let outer_inline = pctab.len() as u32;
        pctab.extend([0, 0x20, 2, 0x20, 0]); // -1, then inline index 0 from 0x20
        let inner_lines = pctab.len() as u32;
        pctab.extend([62, 0x40, 0]); // line 30
        let header_len = 8 + 8 * 8;
        let names_at = header_len;
        let cutab_at = names_at + names.len();
        let files_at = cutab_at + cutab.len();
        let pctab_at = files_at + files.len();
        let functab_at = (pctab_at + pctab.len()).div_ceil(8) * 8;
        let func = |name: u32,
                    lines: u32,
                    npcdata: u32,
                    nfuncdata: u8,
                    pcdata: &[u32],
                    funcdata: &[u32]| {
            let mut f = Vec::new();
            for word in [0u32, name, 0, 0, 0, pcfile, lines, npcdata, 0, 9] {
                f.extend(word.to_le_bytes());
            }
            f.extend([0, 0, 0, nfuncdata]);
            for word in pcdata.iter().chain(funcdata) {
                f.extend(word.to_le_bytes());
            }
            f
        };
        let outer = func(
            1,
            outer_lines,
            3,
            4,
            &[0, 0, outer_inline],
            &[u32::MAX, u32::MAX, u32::MAX, 0],
        );
        let inner = func(12, inner_lines, 0, 0, &[], &[]);
        let mut functab = Vec::new();
        let first = 24u32;
        let second = first + outer.len() as u32;
        for (entry, offset) in [(0u32, first), (0x40, second), (0x80, 0)] {
            functab.extend(entry.to_le_bytes());
            functab.extend(offset.to_le_bytes());
        }
        functab.extend(outer);
        functab.extend(inner);
        let mut tab = Vec::new();
        tab.extend(GO120.to_le_bytes());
        tab.extend([0, 0, 1, 8]);
        for word in [
            2u64,
            1,
            0,
            names_at as u64,
            cutab_at as u64,
            files_at as u64,
            pctab_at as u64,
            functab_at as u64,
        ] {
            tab.extend(word.to_le_bytes());
        }
        tab.extend(names);
        tab.extend(cutab);
        tab.extend(files);
        tab.extend(pctab);
        tab.resize(functab_at, 0);
        tab.extend(functab);
        // The inline tree (funcID, pad, nameOff, parentPc, startLine), then moduledata.
        let mut data = Vec::new();
        for word in [0u32, 12, 0x10, 29] {
            data.extend(word.to_le_bytes());
        }
        data.resize(64, 0);
        let mut moduledata = vec![0u64; 96];
        moduledata[0] = TABLE;
        moduledata[1] = TABLE + names_at as u64;
        moduledata[22] = 0x40_1000;
        moduledata[27] = TABLE; // a word that is no base (reads no trees right)
        moduledata[30] = DATA;
        for word in moduledata {
            data.extend(word.to_le_bytes());
        }
        (tab, data)
    }

    #[test]
    fn names_inlined_calls_from_a_table_built_by_hand() {
        let (tab, data) = synthetic();
        let table = Table::new(Image {
            pclntab: Section {
                address: 0x4a_0000,
                bytes: &tab,
            },
            // No text start given: moduledata's is used.
            text: 0,
            data: vec![Section {
                address: 0x56_0000,
                bytes: &data,
            }],
        })
        .unwrap();
        assert_eq!(
            (table.layout(), table.functions(), table.inlining()),
            (Layout::Go120, 2, true)
        );
        let frame = |function, line| Frame {
            function,
            file: "main.go",
            line,
        };
        assert_eq!(table.frames(0x40_1008), [frame("main.outer", 10)]);
        assert_eq!(
            table.frames(0x40_1028),
            [frame("main.inner", 20), frame("main.outer", 10)],
            "the inlined callee, then its call site in the caller"
        );
        assert_eq!(table.frames(0x40_1050), [frame("main.inner", 30)]);
        assert!(table.frames(0x40_1080).is_empty() && table.frames(0x40_0fff).is_empty());

        // With no moduledata to read, names and lines stay, the inlined call folds.
        let table = Table::new(Image {
            pclntab: Section {
                address: 0x4a_0000,
                bytes: &tab,
            },
            text: 0x40_1000,
            data: Vec::new(),
        })
        .unwrap();
        assert!(!table.inlining());
        assert_eq!(table.frames(0x40_1028), [frame("main.outer", 20)]);

        // Every truncation of the table parses or is refused, and names without panicking.
        for cut in 0..tab.len() {
            if let Ok(table) = Table::new(Image {
                pclntab: Section {
                    address: 0x4a_0000,
                    bytes: &tab[..cut],
                },
                text: 0x40_1000,
                data: vec![Section {
                    address: 0x56_0000,
                    bytes: &data,
                }],
            }) {
                for pc in (0x40_1000..0x40_1090).step_by(4) {
                    let _ = table.frames(pc);
                }
            }
        }
    }

    /// Writes the hand-built table as a seed of the `gosym_read` fuzz target:
    /// `cargo test -p kiln-gosym -- --ignored write_fuzz_seed`.
    #[test]
    #[ignore]
    fn write_fuzz_seed() {
        let (tab, data) = synthetic();
        let mut seed = (tab.len() as u32).to_le_bytes().to_vec();
        seed.extend(tab);
        seed.extend(data);
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fuzz/regressions/gosym_read"
        );
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(format!("{dir}/synthetic-go120"), seed).unwrap();
    }
}
