//! User stacks of programs built without frame pointers.
//!
//! The kernel's call chain walks frame pointers. That is free and whole for Go and for
//! programs built with `-fno-omit-frame-pointer`, but a program built with the default
//! `-O2` (Debian's packages, Rust release builds) uses the frame-pointer register for
//! other things, and its chain stops after a frame or two, or wanders into garbage.
//!
//! So each sample also carries the user registers and a copy of the top of the user
//! stack (`PERF_SAMPLE_REGS_USER`, `PERF_SAMPLE_STACK_USER`), and for programs whose own
//! code keeps no frame pointers the stack is unwound here with `framehop` from the DWARF
//! call-frame information (`.eh_frame`) that every x86-64 ELF carries for exceptions.
//!
//! The method is chosen per program, once: Go binaries keep frame pointers (the Go ABI
//! requires them on amd64 and arm64); for others, the first 32 bytes of up to
//! [`PROLOGUE_PROBES`] functions (listed by the `.eh_frame_hdr` index, present even in
//! stripped binaries, less the PLT stubs and the entry point, which never have one) are
//! read for `push %rbp; mov %rsp,%rbp`, the frame set-up (the compiler may schedule other
//! instructions before it). Only a program that has it in nine functions of ten is walked
//! by frame pointers: one frameless function on the path loses its caller, or sends the
//! walk into garbage. Mixed programs are common: Rust's standard library ships with frame
//! pointers while a release build's own code has none, and GCC 12 leaves them out of leaf
//! functions even with `-fno-omit-frame-pointer`. The kernel's chain is used for programs
//! that keep them, the cheapest method that works; DWARF for the rest.
//!
//! Memory: each binary's unwind sections (typically a tenth of its code) are kept in a
//! cache bounded by bytes, least recently used first out; an evicted binary is read again
//! when next needed.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::Arc;

use object::{Object, ObjectSection, ObjectSegment};

use crate::procs::{Instance, Process};

/// Functions whose prologue is read to tell whether a program keeps frame pointers.
pub const PROLOGUE_PROBES: usize = 256;

/// How a binary's user stacks are walked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// The kernel's call chain.
    FramePointer,
    /// DWARF CFI over the copied user stack.
    Dwarf,
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Method::FramePointer => "frame_pointer",
            Method::Dwarf => "dwarf",
        }
    }
}

/// What one ELF file gives for unwinding.
#[derive(Debug)]
pub struct Binary {
    pub method: Method,
    pub build_id: Option<Vec<u8>>,
    /// Bytes of its symbol table and DWARF, uncompressed: what a symbolizer may hold of
    /// it, at most.
    pub symbol_bytes: u64,
    /// A Go binary stripped of symbols and DWARF: named from its `.gopclntab`
    /// ([`kiln_gosym`]), which blazesym does not read.
    pub go_table: bool,
    loads: Loads,
    eh_frame: Option<(Range<u64>, Arc<[u8]>)>,
    eh_frame_hdr: Option<(Range<u64>, Arc<[u8]>)>,
    text: Option<Range<u64>>,
    got: Option<Range<u64>>,
    /// PLT stubs and the entry point: code with CFI that never sets up a frame.
    not_functions: Vec<Range<u64>>,
}

impl Binary {
    /// Reads what unwinding needs from an ELF file; `None` when it is not one.
    pub fn read(path: &Path) -> Option<Binary> {
        let file = File::open(path).ok()?;
        let cache = object::ReadCache::new(file);
        let elf = object::File::parse(&cache).ok()?;
        let section = |name: &str| {
            let section = elf.section_by_name(name)?;
            Some((
                section.address()..section.address() + section.size(),
                section,
            ))
        };
        let data = |name: &str| {
            let (range, section) = section(name)?;
            let bytes: Arc<[u8]> = Arc::from(section.data().ok()?);
            Some((range, bytes))
        };
        let loads = Loads::of(&elf);
        let eh_frame = data(".eh_frame");
        let eh_frame_hdr = data(".eh_frame_hdr");
        let symbol_bytes = elf
            .sections()
            .filter(|section| {
                let name = section.name().unwrap_or_default();
                name.starts_with(".debug_")
                    || name.starts_with(".zdebug_")
                    || name == ".symtab"
                    || name == ".strtab"
            })
            .map(|section| {
                section
                    .compressed_file_range()
                    .map_or(section.size(), |range| range.uncompressed_size)
            })
            .sum();
        let go = [".go.buildinfo", ".note.go.buildid", ".gopclntab"]
            .iter()
            .any(|name| elf.section_by_name(name).is_some());
        let mut binary = Binary {
            method: Method::FramePointer,
            build_id: elf.build_id().ok().flatten().map(<[u8]>::to_vec),
            symbol_bytes,
            go_table: kiln_gosym::elf::only_table(&elf),
            loads,
            text: section(".text").map(|(range, _)| range),
            not_functions: [".plt", ".plt.got", ".plt.sec"]
                .iter()
                .filter_map(|name| section(name).map(|(range, _)| range))
                .chain(std::iter::once(elf.entry()..elf.entry() + 1))
                .collect(),
            got: section(".got").map(|(range, _)| range),
            eh_frame,
            eh_frame_hdr,
        };
        drop(elf);
        let file = cache.into_inner();
        let dwarf = !go
            && binary.eh_frame.is_some()
            && cfg!(target_arch = "x86_64")
            && !binary.keeps_frame_pointers(&file);
        binary.method = if dwarf {
            Method::Dwarf
        } else {
            Method::FramePointer
        };
        Some(binary)
    }

    /// Memory held for this binary.
    pub fn bytes(&self) -> usize {
        let held = |section: &Option<(Range<u64>, Arc<[u8]>)>| {
            section.as_ref().map_or(0, |(_, d)| d.len())
        };
        held(&self.eh_frame) + held(&self.eh_frame_hdr) + std::mem::size_of::<Binary>()
    }

    /// Whether nine in ten of the functions probed set up a frame (see the module doc).
    fn keeps_frame_pointers(&self, file: &File) -> bool {
        let mut starts = self.function_starts();
        starts.retain(|start| !self.not_functions.iter().any(|r| r.contains(start)));
        if starts.is_empty() {
            return false;
        }
        let step = starts.len().div_ceil(PROLOGUE_PROBES);
        let (mut probed, mut framed) = (0usize, 0usize);
        for start in starts.iter().step_by(step) {
            let Some(offset) = self.loads.file_offset(*start) else {
                continue;
            };
            let mut code = [0u8; 32];
            let Ok(read) = file.read_at(&mut code, offset) else {
                continue;
            };
            probed += 1;
            framed += usize::from(sets_up_frame(&code[..read]));
        }
        probed > 0 && framed * 10 >= probed * 9
    }

    /// Function start addresses from the `.eh_frame_hdr` search table, in the encoding
    /// every x86-64 linker writes (`DW_EH_PE_datarel | DW_EH_PE_sdata4` pairs).
    fn function_starts(&self) -> Vec<u64> {
        let Some((range, hdr)) = &self.eh_frame_hdr else {
            return Vec::new();
        };
        function_starts(range.start, hdr)
    }
}

/// Whether a function's first bytes hold `push %rbp` and, after it, `mov %rsp,%rbp`: the
/// compiler schedules other instructions between and before them.
fn sets_up_frame(code: &[u8]) -> bool {
    let Some(mov) = code.windows(3).position(|w| w == [0x48, 0x89, 0xe5]) else {
        return false;
    };
    code[..mov].contains(&0x55)
}

/// Parses an `.eh_frame_hdr` at `address`: version 1, a 4-byte `eh_frame_ptr`, a
/// `udata4` count and a `datarel sdata4` table; anything else gives no starts.
pub fn function_starts(address: u64, hdr: &[u8]) -> Vec<u64> {
    let [1, _ptr_enc, count_enc, table_enc, ..] = *hdr else {
        return Vec::new();
    };
    if count_enc != 0x03 || table_enc != 0x3b || hdr.len() < 12 {
        return Vec::new();
    }
    let count = u32::from_le_bytes([hdr[8], hdr[9], hdr[10], hdr[11]]) as usize;
    hdr[12..]
        .chunks_exact(8)
        .take(count)
        .map(|pair| {
            let relative = i32::from_le_bytes([pair[0], pair[1], pair[2], pair[3]]);
            address.wrapping_add_signed(i64::from(relative))
        })
        .collect()
}

/// A file's identity: the same path may hold another program after an upgrade.
type FileKey = (u64, u64, u64, i64);

fn file_key(path: &Path) -> Option<FileKey> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.dev(), meta.ino(), meta.size(), meta.mtime_nsec()))
}

/// Binaries read so far, bounded by bytes, least recently used out first.
pub struct Binaries {
    entries: HashMap<FileKey, (Option<Arc<Binary>>, u64)>,
    bytes: usize,
    limit: usize,
    tick: u64,
    pub evictions: u64,
}

impl Binaries {
    pub fn new(limit: usize) -> Self {
        Binaries {
            entries: HashMap::new(),
            bytes: 0,
            limit,
            tick: 0,
            evictions: 0,
        }
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The binary at `path`; `None` (remembered too) when it is not a readable ELF file.
    pub fn get(&mut self, path: &Path) -> Option<Arc<Binary>> {
        let key = file_key(path)?;
        self.tick += 1;
        if let Some((binary, used)) = self.entries.get_mut(&key) {
            *used = self.tick;
            return binary.clone();
        }
        let binary = Binary::read(path).map(Arc::new);
        self.bytes += binary.as_ref().map_or(64, |b| b.bytes());
        self.entries.insert(key, (binary.clone(), self.tick));
        while self.bytes > self.limit && self.entries.len() > 1 {
            let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(key, _)| *key)
            else {
                break;
            };
            if let Some((gone, _)) = self.entries.remove(&oldest) {
                self.bytes -= gone.as_ref().map_or(64, |b| b.bytes());
                self.evictions += 1;
            }
        }
        binary
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }
}

/// The file to symbolize a mapping from. When the kernel gave the mapped file's build id
/// and the file now at its path has another (the package was upgraded under a running
/// process), the mapped file itself is read through `/proc/PID/map_files`, or nothing:
/// a wrong name is worse than an address.
/// Returns the path and the file's [`Binary::symbol_bytes`].
pub fn verified_path(
    binaries: &mut Binaries,
    process: &Process,
    mapping: &crate::procs::Mapping,
) -> Option<(std::path::PathBuf, u64)> {
    let path = process.readable_path(mapping)?;
    let binary = binaries.get(&path);
    let symbol_bytes = binary.as_ref().map_or(0, |b| b.symbol_bytes);
    let Some(expected) = &mapping.build_id else {
        return Some((path, symbol_bytes));
    };
    let found = binary.and_then(|b| b.build_id.clone());
    if found.as_ref().is_none_or(|found| found == expected) {
        return Some((path, symbol_bytes));
    }
    let mapped = process.mapped_file(mapping)?;
    let binary = binaries.get(&mapped)?;
    (binary.build_id.as_ref() == Some(expected)).then_some((mapped, binary.symbol_bytes))
}

/// An ELF file's loadable segments (file offset, virtual address, bytes in the file,
/// executable): where its addresses are in the file, and in a process that mapped it.
#[derive(Debug, Clone, Default)]
pub struct Loads(Vec<(u64, u64, u64, bool)>);

impl Loads {
    pub fn of<'data>(elf: &impl Object<'data>) -> Loads {
        Loads(
            elf.segments()
                .map(|segment| {
                    let (offset, size) = segment.file_range();
                    let exec = matches!(segment.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0);
                    (offset, segment.address(), size, exec)
                })
                .collect(),
        )
    }

    /// The file offset of a virtual address; `None` outside what the file holds (`.bss`).
    pub fn file_offset(&self, address: u64) -> Option<u64> {
        self.0.iter().find_map(|(offset, vaddr, size, _)| {
            let inside = address.checked_sub(*vaddr)?;
            (inside < *size).then(|| offset + inside)
        })
    }

    /// The virtual address of an executable mapping's first byte, from its file offset.
    /// Segments share pages at their edges, so it is looked up among the code segments,
    /// by the page-aligned offset the loader mapped them at.
    pub fn code_address(&self, pgoff: u64) -> Option<u64> {
        self.0
            .iter()
            .filter(|(offset, _, _, exec)| *exec && offset & !0xfff <= pgoff)
            .max_by_key(|(offset, _, _, _)| *offset)
            .map(|(offset, vaddr, _, _)| pgoff.wrapping_add(*vaddr).wrapping_sub(*offset))
    }

    /// What to add to the file's addresses in a process that mapped its code at `start`
    /// from file offset `pgoff`.
    pub fn bias(&self, start: u64, pgoff: u64) -> Option<u64> {
        Some(start.wrapping_sub(self.code_address(pgoff)?))
    }
}

/// A user stack as walked: addresses innermost first, and whether it was cut short.
pub struct Walked {
    pub user: Vec<u64>,
    pub truncated: bool,
    pub method: Method,
    /// The frame pointer of each frame of `user` as the unwinder recovered it, from
    /// [`Unwinding::walk_copy`] (V8 keeps each JavaScript frame's function below it:
    /// interp/v8.rs); empty otherwise.
    pub bases: Vec<u64>,
}

/// The 8 bytes at `address` in a copy of the stack taken at `sp`.
pub fn stack_word(stack: &[u8], sp: u64, address: u64) -> Option<u64> {
    let at = usize::try_from(address.checked_sub(sp)?).ok()?;
    Some(u64::from_le_bytes(
        stack.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// Code a runtime generated, with no CFI, whose frames the runtime's own rules walk
/// (interp/hotspot.rs): consulted at each frame before the binaries' CFI.
pub trait Jit {
    /// `None` when `pc` is not this runtime's code. Else the caller's (return address,
    /// stack pointer, frame pointer), or `Some(None)` when the frame cannot be walked.
    /// `top` is the sample's own frame, which may be mid-prologue; `word` reads the
    /// stack copy.
    fn step(
        &mut self,
        pc: u64,
        sp: u64,
        bp: u64,
        top: bool,
        word: &dyn Fn(u64) -> Option<u64>,
    ) -> Option<Option<(u64, u64, u64)>>;
}

/// The user registers and stack copy of one sample.
pub struct UserContext<'a> {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    pub stack: &'a [u8],
}

/// Per-process unwinders, rebuilt when a process's mappings change.
pub struct Unwinding {
    pub binaries: Binaries,
    processes: HashMap<Instance, ProcessUnwinder>,
    #[cfg(target_arch = "x86_64")]
    cache: framehop::x86_64::CacheX86_64,
    max_frames: usize,
}

struct ProcessUnwinder {
    generation: u64,
    method: Method,
    /// Holds the DWARF of every mapped file: always for DWARF programs, and for a
    /// frame-pointer program once a stack copy had to be walked (walk_copy).
    modules: bool,
    #[cfg(target_arch = "x86_64")]
    unwinder: framehop::x86_64::UnwinderX86_64<Arc<[u8]>>,
}

impl Unwinding {
    pub fn new(cache_bytes: usize, max_frames: usize) -> Self {
        Unwinding {
            binaries: Binaries::new(cache_bytes),
            processes: HashMap::new(),
            #[cfg(target_arch = "x86_64")]
            cache: framehop::x86_64::CacheX86_64::new(),
            max_frames,
        }
    }

    /// Drops the unwinders of processes no longer tracked.
    pub fn retain(&mut self, live: impl Fn(Instance) -> bool) {
        self.processes.retain(|instance, _| live(*instance));
    }

    pub fn clear(&mut self) {
        self.processes.clear();
        self.binaries.clear();
    }

    /// The user stack of a sample: the kernel's frame-pointer chain for programs that keep
    /// frame pointers, else a DWARF unwind of the copied stack.
    pub fn walk(
        &mut self,
        process: &Process,
        chain: Vec<u64>,
        chain_truncated: bool,
        context: Option<UserContext<'_>>,
    ) -> Walked {
        self.walk_keeping(process, chain, chain_truncated, context, false, None)
    }

    /// [`Unwinding::walk`], keeping each frame's frame pointer when `bases` says so (for
    /// [`Unwinding::walk_copy`]; other samples need none, and skip the allocation).
    fn walk_keeping(
        &mut self,
        process: &Process,
        chain: Vec<u64>,
        chain_truncated: bool,
        context: Option<UserContext<'_>>,
        keep_bases: bool,
        mut jit: Option<&mut dyn Jit>,
    ) -> Walked {
        self.refresh(process);
        let unwinder = self.processes.get(&process.instance);
        let (Some(unwinder), Some(context)) = (unwinder, context) else {
            return Walked {
                user: chain,
                truncated: chain_truncated,
                method: Method::FramePointer,
                bases: Vec::new(),
            };
        };
        if unwinder.method == Method::FramePointer {
            return Walked {
                user: chain,
                truncated: chain_truncated,
                method: Method::FramePointer,
                bases: Vec::new(),
            };
        }
        #[cfg(target_arch = "x86_64")]
        {
            use framehop::Unwinder;
            let stack = context.stack;
            let sp = context.sp;
            let word = |address: u64| stack_word(stack, sp, address);
            let mut read_stack = |address: u64| word(address).ok_or(());
            // Frame by frame (not `iter_frames`): each frame's frame pointer is kept.
            let mut regs =
                framehop::x86_64::UnwindRegsX86_64::new(context.ip, context.sp, context.bp);
            let mut address = framehop::FrameAddress::InstructionPointer(context.ip);
            let mut user = Vec::new();
            let mut bases = Vec::new();
            let truncated = loop {
                if user.len() >= self.max_frames {
                    break true;
                }
                user.push(address.address());
                if keep_bases {
                    bases.push(regs.bp());
                }
                if let Some(jit) = jit.as_deref_mut() {
                    let top = user.len() == 1;
                    match jit.step(address.address(), regs.sp(), regs.bp(), top, &word) {
                        Some(Some((ret, caller_sp, caller_bp))) => {
                            match framehop::FrameAddress::from_return_address(ret) {
                                Some(next) => {
                                    regs.set_sp(caller_sp);
                                    regs.set_bp(caller_bp);
                                    regs.set_ip(ret);
                                    address = next;
                                    continue;
                                }
                                None => break false,
                            }
                        }
                        Some(None) => break true,
                        None => {}
                    }
                }
                match unwinder.unwinder.unwind_frame(
                    address,
                    &mut regs,
                    &mut self.cache,
                    &mut read_stack,
                ) {
                    Ok(Some(next)) => match framehop::FrameAddress::from_return_address(next) {
                        Some(next) => address = next,
                        None => break false,
                    },
                    Ok(None) => break false,
                    Err(err) => {
                        tracing::trace!(pid = process.pid, frames = user.len(), error = %err, stack = stack.len(), "unwinding stopped");
                        break true;
                    }
                }
            };
            Walked {
                user,
                truncated,
                method: Method::Dwarf,
                bases,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (context, jit, keep_bases);
            Walked {
                user: chain,
                truncated: chain_truncated,
                method: Method::FramePointer,
            }
        }
    }

    /// The user stack of a thread that went off the CPU (offcpu.rs): there is no kernel
    /// chain, only the registers and the stack copy, so a frame-pointer program's chain
    /// is followed in the copy.
    /// The frames are found by the files' CFI even in a frame-pointer program: a thread
    /// that blocked is in a system call's libc wrapper, which sets up no frame, so a
    /// frame-pointer walk from there would skip its caller.
    ///
    /// A runtime's generated code (`jit`) is walked by its own rules.
    pub fn walk_copy(
        &mut self,
        process: &Process,
        context: UserContext<'_>,
        jit: Option<&mut dyn Jit>,
    ) -> Walked {
        self.refresh(process);
        let modules = self
            .processes
            .get(&process.instance)
            .is_some_and(|unwinder| unwinder.modules);
        if !modules {
            if let Some(built) = self.build(process, true) {
                self.processes.insert(process.instance, built);
            }
        }
        let method = match self.processes.get_mut(&process.instance) {
            Some(unwinder) => std::mem::replace(&mut unwinder.method, Method::Dwarf),
            None => Method::FramePointer,
        };
        let walked = self.walk_keeping(process, vec![context.ip], false, Some(context), true, jit);
        if let Some(unwinder) = self.processes.get_mut(&process.instance) {
            unwinder.method = method;
        }
        walked
    }

    /// Builds the process's unwinder if its mappings changed since it was built.
    fn refresh(&mut self, process: &Process) {
        let stale = self
            .processes
            .get(&process.instance)
            .is_none_or(|known| known.generation != process.generation);
        if stale {
            // A program that cannot be read is walked by the kernel's chain, and not read
            // again until its mappings change.
            let built = self.build(process, false).unwrap_or(ProcessUnwinder {
                generation: process.generation,
                method: Method::FramePointer,
                modules: false,
                #[cfg(target_arch = "x86_64")]
                unwinder: framehop::x86_64::UnwinderX86_64::new(),
            });
            self.processes.insert(process.instance, built);
        }
    }

    fn build(&mut self, process: &Process, modules: bool) -> Option<ProcessUnwinder> {
        let main = process.main_mapping()?;
        let main_path = process.readable_path(main)?;
        let method = self.binaries.get(&main_path)?.method;
        #[cfg(target_arch = "x86_64")]
        let mut unwinder = framehop::x86_64::UnwinderX86_64::new();
        let modules = modules || method == Method::Dwarf;
        #[cfg(target_arch = "x86_64")]
        if modules {
            use framehop::Unwinder;
            for mapping in process.mappings.iter().filter(|m| m.is_file()) {
                let Some(path) = process.readable_path(mapping) else {
                    continue;
                };
                let Some(binary) = self.binaries.get(&path) else {
                    continue;
                };
                let Some(svma) = binary.loads.code_address(mapping.pgoff) else {
                    continue;
                };
                let base_avma = mapping.start.wrapping_sub(svma);
                let info = framehop::ExplicitModuleSectionInfo {
                    base_svma: 0,
                    text_svma: binary.text.clone(),
                    got_svma: binary.got.clone(),
                    eh_frame_svma: binary.eh_frame.as_ref().map(|(r, _)| r.clone()),
                    eh_frame: binary.eh_frame.as_ref().map(|(_, d)| d.clone()),
                    eh_frame_hdr_svma: binary.eh_frame_hdr.as_ref().map(|(r, _)| r.clone()),
                    eh_frame_hdr: binary.eh_frame_hdr.as_ref().map(|(_, d)| d.clone()),
                    ..Default::default()
                };
                unwinder.add_module(framehop::Module::new(
                    mapping.path.clone(),
                    mapping.start..mapping.end,
                    base_avma,
                    info,
                ));
            }
        }
        Some(ProcessUnwinder {
            generation: process.generation,
            method,
            modules,
            #[cfg(target_arch = "x86_64")]
            unwinder,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eh_frame_hdr_tables_list_function_starts() {
        let mut hdr = vec![1u8, 0x1b, 0x03, 0x3b];
        hdr.extend_from_slice(&0i32.to_le_bytes());
        hdr.extend_from_slice(&2u32.to_le_bytes());
        for (start, fde) in [(-0x100i32, 0x10i32), (0x40, 0x20)] {
            hdr.extend_from_slice(&start.to_le_bytes());
            hdr.extend_from_slice(&fde.to_le_bytes());
        }
        assert_eq!(function_starts(0x2000, &hdr), vec![0x1f00, 0x2040]);
        // Another encoding, or a cut table: no starts, no panic.
        let mut other = hdr.clone();
        other[3] = 0x1b;
        assert!(function_starts(0x2000, &other).is_empty());
        for len in 0..hdr.len() {
            let _ = function_starts(0x2000, &hdr[..len]);
        }
    }

    #[test]
    fn frame_set_up_is_found_where_the_compiler_scheduled_it() {
        // main with -fno-omit-frame-pointer: at the start.
        assert!(sets_up_frame(&[0x55, 0x48, 0x89, 0xe5, 0x41, 0x56]));
        // GCC 12 -O2: a movabs first, then push, another mov, then the frame.
        assert!(sets_up_frame(&[
            0x48, 0xbe, 0x2d, 0x7f, 0x95, 0x4c, 0x2d, 0xf4, 0x51, 0x58, 0x55, 0xba, 0xc0, 0xcf,
            0x6a, 0x00, 0x48, 0xb9, 0x4f, 0x81, 0x67, 0xf7, 0x7e, 0x7b, 0x05, 0x14, 0x48, 0x89,
            0xe5,
        ]));
        // -fomit-frame-pointer: rbp pushed as a callee-saved register, no frame.
        assert!(!sets_up_frame(&[
            0x55, 0x53, 0x48, 0x89, 0xfd, 0x48, 0x83, 0xec, 0x08
        ]));
        assert!(!sets_up_frame(&[0x48, 0x89, 0xe5]));
    }

    #[test]
    fn this_test_binary_is_read() {
        let exe = std::env::current_exe().unwrap();
        let binary = Binary::read(&exe).expect("the test binary is an ELF file");
        assert!(binary.eh_frame.is_some());
        assert!(binary.bytes() > 1000);
        let text = binary.text.clone().unwrap();
        let offset = binary.loads.file_offset(text.start).unwrap();
        let mapped = binary.loads.code_address(offset & !0xfff).unwrap();
        assert_eq!(mapped + (offset & 0xfff), text.start);
        assert!(!binary.function_starts().is_empty());
    }
}
