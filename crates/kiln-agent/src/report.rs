//! Turning one interval's samples into one self-contained pprof per process.
//!
//! Every report carries every string, function, location and mapping it uses, so no report
//! depends on one sent before: a server that restarted empty, or a receiver that missed a
//! report, reads the next one whole (the OpenTelemetry profiler's "sent once" symbols are
//! what its users lose). An address that cannot be symbolized keeps its mapping's file
//! name, build id and file offset, so it can be symbolized later.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use blazesym::symbolize::source::{Elf, Kernel, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};
use blazesym::MaybeDefault;
use kiln_model::build::PprofBuilder;
use kiln_model::pprof::{Mapping as PprofMapping, Profile, ValueType};

use crate::procs::{Instance, Mapping, Process};

/// A call stack: kernel frames then user frames, each innermost first.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Stack {
    pub kernel: Box<[u64]>,
    pub user: Box<[u64]>,
}

/// One process's profile for one interval, and the labels of its series.
#[derive(Debug, Clone)]
pub struct Report {
    pub labels: Vec<(String, String)>,
    pub profile: Profile,
}

/// What a frame resolved to: its function names and lines, innermost (inlined) first.
#[derive(Debug, Clone, Default)]
pub struct Resolved {
    frames: Vec<(String, String, i64)>,
}

/// Symbolizes with blazesym: ELF symbols and DWARF lines of the mapped files, kernel
/// symbols from `/proc/kallsyms`, Rust and C++ names demangled.
///
/// blazesym keeps what it parsed of every file it was given, for good. What it can hold of
/// a file is bounded by the file's symbol table and DWARF, uncompressed
/// ([`crate::unwind::Binary::symbol_bytes`]); their sum over the files given is charged to
/// the budget, and the collector starts a new symbolizer past it (what was dropped is
/// parsed again when next needed). A file whose DWARF alone would take more than
/// [`Symbols::new`]'s `dwarf_limit` is symbolized from its symbol table only: function
/// names without lines, rather than a budget blown or the file parsed anew every interval.
/// Kernel symbols have a symbolizer of their own, kept: `/proc/kallsyms` is one fixed
/// cost, and reading it again is slow.
pub struct Symbols {
    symbolizer: Symbolizer,
    kernel: Symbolizer,
    dwarf_limit: u64,
    files: std::cell::RefCell<(std::collections::HashSet<PathBuf>, u64)>,
    /// Whether files' frames are named here ([`crate::AgentConfig::symbolize`]).
    name_files: bool,
}

impl Default for Symbols {
    fn default() -> Self {
        Symbols::new(u64::MAX)
    }
}

fn symbolizer() -> Symbolizer {
    Symbolizer::builder()
        .enable_code_info(true)
        .enable_inlined_fns(true)
        .build()
}

impl Symbols {
    pub fn new(dwarf_limit: u64) -> Self {
        Symbols {
            symbolizer: symbolizer(),
            kernel: symbolizer(),
            dwarf_limit,
            files: Default::default(),
            name_files: true,
        }
    }

    /// Whether the frames of files are named on the host; off, they keep only their
    /// mapping's build id and file offset.
    pub fn files(self, name_files: bool) -> Self {
        Symbols { name_files, ..self }
    }

    /// Starts the file symbolizer anew; the kernel's is kept.
    pub fn clear_files(&mut self) {
        self.symbolizer = symbolizer();
        self.files = Default::default();
    }

    /// Bytes charged for the files this symbolizer has parsed (see above).
    pub fn held_bytes(&self) -> u64 {
        self.files.borrow().1
    }

    fn resolve_file(&self, path: PathBuf, symbol_bytes: u64, offsets: &[u64]) -> Vec<Resolved> {
        let mut elf = Elf::new(path);
        elf.debug_syms = symbol_bytes <= self.dwarf_limit;
        {
            let mut files = self.files.borrow_mut();
            if !files.0.contains(&elf.path) {
                files.0.insert(elf.path.clone());
                files.1 += symbol_bytes.min(self.dwarf_limit);
            }
        }
        self.resolve(
            &self.symbolizer,
            &Source::Elf(elf),
            Input::FileOffset(offsets),
        )
    }

    fn resolve(
        &self,
        symbolizer: &Symbolizer,
        source: &Source<'_>,
        input: Input<&[u64]>,
    ) -> Vec<Resolved> {
        let count = match input {
            Input::AbsAddr(a) | Input::VirtOffset(a) | Input::FileOffset(a) => a.len(),
        };
        let Ok(results) = symbolizer.symbolize(source, input) else {
            return vec![Resolved::default(); count];
        };
        results
            .into_iter()
            .map(|result| match result {
                Symbolized::Sym(sym) => {
                    let file_line = |info: Option<&blazesym::symbolize::CodeInfo<'_>>| {
                        info.map(|info| {
                            let file = match &info.dir {
                                Some(dir) => dir.join(&*info.file).to_string_lossy().into_owned(),
                                None => info.file.to_string_lossy().into_owned(),
                            };
                            (file, i64::from(info.line.unwrap_or(0)))
                        })
                        .unwrap_or_default()
                    };
                    // blazesym lists inlined calls outermost first; pprof wants innermost.
                    let mut frames: Vec<(String, String, i64)> = Vec::new();
                    for inlined in sym.inlined.iter().rev() {
                        let (file, line) = file_line(inlined.code_info.as_ref());
                        frames.push((inlined.name.to_string(), file, line));
                    }
                    let (file, line) = file_line(sym.code_info.as_deref());
                    frames.push((sym.name.to_string(), file, line));
                    Resolved { frames }
                }
                Symbolized::Unknown(_) => Resolved::default(),
            })
            .collect()
    }
}

/// The frames at file offsets of a Go binary stripped of symbols and DWARF, from the
/// `.gopclntab` stripping keeps (blazesym does not read it): functions, files, lines and
/// inlined calls, innermost first. The table is parsed anew each report (a header, and
/// `moduledata` found in a small section), over a mapping of the file, not a copy.
fn go_frames(path: &Path, offsets: &[u64]) -> Vec<Resolved> {
    let none = || vec![Resolved::default(); offsets.len()];
    let Ok(file) = std::fs::File::open(path) else {
        return none();
    };
    // SAFETY: a read-only mapping of a binary that processes run from, as blazesym maps
    // the ones it reads; binaries are replaced by rename, not written in place.
    let Ok(map) = (unsafe { memmap2::Mmap::map(&file) }) else {
        return none();
    };
    let Ok(elf) = object::File::parse(&*map) else {
        return none();
    };
    let Some(table) = kiln_gosym::elf::image(&elf).and_then(|i| kiln_gosym::Table::new(i).ok())
    else {
        tracing::debug!(file = %path.display(), "a Go binary's .gopclntab did not parse");
        return none();
    };
    offsets
        .iter()
        .map(|offset| Resolved {
            frames: kiln_gosym::elf::address_of_offset(&elf, *offset)
                .map(|address| {
                    table
                        .frames(address)
                        .into_iter()
                        .map(|f| {
                            (
                                f.function.to_string(),
                                f.file.to_string(),
                                i64::from(f.line),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect()
}

/// Largest perf map read: a JVM's can reach tens of MB; past this the rest is left out.
const MAX_PERF_MAP_BYTES: u64 = 64 << 20;

/// A JIT's or interpreter's own names for its code (`/tmp/perf-PID.map`, written by the JVM
/// with perf-map-agent or `-XX:+DumpPerfMapAtExit`, Node with `--perf-basic-prof`, Python
/// 3.12+ with `-X perf`): `START SIZE name` lines in hex, later lines winning.
#[derive(Debug, Default)]
pub struct PerfMap {
    /// (start, end, name), sorted by start; of entries with one start, the last written.
    entries: Vec<(u64, u64, String)>,
}

impl PerfMap {
    pub fn parse(text: &str) -> PerfMap {
        let mut entries: Vec<(usize, u64, u64, String)> = text
            .lines()
            .enumerate()
            .filter_map(|(order, line)| {
                let mut parts = line.splitn(3, ' ');
                let start = u64::from_str_radix(parts.next()?.trim_start_matches("0x"), 16).ok()?;
                let size = u64::from_str_radix(parts.next()?.trim_start_matches("0x"), 16).ok()?;
                let name = parts.next()?.trim().to_string();
                Some((order, start, start.checked_add(size)?, name))
            })
            .collect();
        entries.sort_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)));
        entries.dedup_by_key(|entry| entry.1);
        PerfMap {
            entries: entries
                .into_iter()
                .map(|(_, start, end, name)| (start, end, name))
                .collect(),
        }
    }

    /// The map of a process: under its root while it lives (a container's `/tmp`, named by
    /// the pid inside its namespace), else the host's `/tmp`.
    fn read(process: &Process) -> Option<PerfMap> {
        let inner_pid = std::fs::read_to_string(format!("/proc/{}/status", process.pid))
            .ok()
            .and_then(|status| {
                status
                    .lines()
                    .find_map(|line| line.strip_prefix("NSpid:"))
                    .and_then(|pids| pids.split_whitespace().last()?.parse::<u32>().ok())
            })
            .unwrap_or(process.pid);
        let candidates = [
            PathBuf::from(format!(
                "/proc/{}/root/tmp/perf-{inner_pid}.map",
                process.pid
            )),
            PathBuf::from(format!("/tmp/perf-{}.map", process.pid)),
        ];
        let path = candidates.iter().find(|path| path.is_file())?;
        let mut text = String::new();
        let file = std::fs::File::open(path).ok()?;
        std::io::Read::read_to_string(
            &mut std::io::Read::take(file, MAX_PERF_MAP_BYTES),
            &mut text,
        )
        .ok()?;
        Some(PerfMap::parse(&text))
    }

    pub fn lookup(&self, address: u64) -> Option<&str> {
        let index = self
            .entries
            .partition_point(|(start, _, _)| *start <= address);
        let (_, end, name) = self.entries.get(index.checked_sub(1)?)?;
        (address < *end).then_some(name.as_str())
    }
}

/// Labels of a process's series: `service_name` is its executable's name (the name a
/// person knows it by; `comm` is cut at 15 bytes), with what identifies the process.
pub fn process_labels(process: &Process, host: &HostInfo) -> Vec<(String, String)> {
    let exe_name = process
        .exe
        .rsplit('/')
        .next()
        .filter(|name| !name.is_empty())
        .map(|name| name.trim_end_matches(" (deleted)").to_string());
    let service = exe_name
        .clone()
        .or_else(|| (!process.comm.is_empty()).then(|| process.comm.clone()))
        .unwrap_or_else(|| "unknown".to_string());
    let mut labels = vec![
        ("__name__".to_string(), "process_cpu".to_string()),
        ("service_name".to_string(), service),
        ("pid".to_string(), process.pid.to_string()),
        ("hostname".to_string(), host.hostname.clone()),
        ("kernel_release".to_string(), host.kernel_release.clone()),
    ];
    if !process.comm.is_empty() {
        labels.push(("comm".to_string(), process.comm.clone()));
    }
    if !process.exe.is_empty() {
        labels.push(("exe".to_string(), process.exe.clone()));
    }
    if let Some(build_id) = process.main_mapping().and_then(|m| m.build_id.as_ref()) {
        labels.push(("build_id".to_string(), hex(build_id)));
    }
    if !process.cgroup.is_empty() && process.cgroup != "/" {
        labels.push(("cgroup".to_string(), process.cgroup.clone()));
        if let Some(id) = container_id(&process.cgroup) {
            labels.push(("container_id".to_string(), id));
        }
    }
    labels
}

/// A container runtime's 64-hex id in a cgroup path (`…/docker-<id>.scope`, `…/<id>`).
pub fn container_id(cgroup: &str) -> Option<String> {
    cgroup.split(['/', '-', '.', ':']).find_map(|part| {
        (part.len() == 64 && part.bytes().all(|b| b.is_ascii_hexdigit())).then(|| part.to_string())
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Facts about the host, for labels.
#[derive(Debug, Clone, Default)]
pub struct HostInfo {
    pub hostname: String,
    pub kernel_release: String,
}

impl HostInfo {
    pub fn read() -> HostInfo {
        let read = |path: &str| {
            std::fs::read_to_string(path)
                .map(|text| text.trim().to_string())
                .unwrap_or_default()
        };
        HostInfo {
            hostname: read("/proc/sys/kernel/hostname"),
            kernel_release: read("/proc/sys/kernel/osrelease"),
        }
    }
}

/// Builds one process's pprof from its stack counts.
pub struct ProfileWriter<'a> {
    symbols: &'a Symbols,
    kernel: &'a HashMap<u64, Resolved>,
    /// What the interpreted frames of user stacks are (crate::interp).
    interpreted: &'a crate::interp::Frames,
    period_nanos: i64,
    /// Stacks count nanoseconds off the CPU (crate::offcpu), not samples.
    off_cpu: bool,
}

/// Symbolizes every kernel address of this interval at once.
pub fn resolve_kernel(
    symbols: &Symbols,
    stacks: &HashMap<Instance, HashMap<Stack, u64>>,
) -> HashMap<u64, Resolved> {
    let mut addresses: Vec<u64> = stacks
        .values()
        .flat_map(|counts| counts.keys())
        .flat_map(|stack| stack.kernel.iter().copied())
        .collect();
    addresses.sort_unstable();
    addresses.dedup();
    if addresses.is_empty() {
        return HashMap::new();
    }
    let kernel = Kernel {
        kallsyms: MaybeDefault::Default,
        vmlinux: MaybeDefault::None,
        debug_syms: false,
        ..Default::default()
    };
    let resolved = symbols.resolve(
        &symbols.kernel,
        &Source::Kernel(kernel),
        Input::AbsAddr(&addresses),
    );
    addresses.into_iter().zip(resolved).collect()
}

impl<'a> ProfileWriter<'a> {
    pub fn new(
        symbols: &'a Symbols,
        kernel: &'a HashMap<u64, Resolved>,
        interpreted: &'a crate::interp::Frames,
        period_nanos: i64,
    ) -> Self {
        ProfileWriter {
            symbols,
            kernel,
            interpreted,
            period_nanos,
            off_cpu: false,
        }
    }

    /// The writer of off-CPU profiles: one value per stack, nanoseconds blocked.
    pub fn off_cpu(self) -> Self {
        ProfileWriter {
            off_cpu: true,
            ..self
        }
    }

    /// One profile of the processes given: one process, or every process that relabeling
    /// put in one series (the same service on this host).
    pub fn write(
        &self,
        processes: &[(&Process, &HashMap<Stack, u64>)],
        binaries: &mut crate::unwind::Binaries,
        time_nanos: i64,
        duration_nanos: i64,
    ) -> Profile {
        let mut out = Out::default();
        let samples = (out.string("samples"), out.string("count"));
        let kind = if self.off_cpu { "off_cpu" } else { "cpu" };
        let time = (out.string(kind), out.string("nanoseconds"));
        let time_type = ValueType {
            r#type: time.0,
            unit: time.1,
        };
        let profile = out.pprof.profile_mut();
        profile.sample_type = if self.off_cpu {
            vec![time_type]
        } else {
            vec![
                ValueType {
                    r#type: samples.0,
                    unit: samples.1,
                },
                time_type,
            ]
        };
        profile.period_type = Some(time_type);
        profile.period = if self.off_cpu { 1 } else { self.period_nanos };
        profile.time_nanos = time_nanos;
        profile.duration_nanos = duration_nanos;
        for (process, counts) in processes {
            self.write_process(&mut out, process, counts, binaries);
        }
        out.pprof.finish()
    }

    fn write_process(
        &self,
        out: &mut Out,
        process: &Process,
        counts: &HashMap<Stack, u64>,
        binaries: &mut crate::unwind::Binaries,
    ) {
        // User addresses: caller frames are return addresses, so the call is one before.
        let lookup = |depth: usize, address: u64| {
            if depth == 0 {
                address
            } else {
                address.saturating_sub(1)
            }
        };
        let mut by_mapping: HashMap<usize, Vec<u64>> = HashMap::new();
        let native = |address: &u64| address & crate::interp::INTERPRETED == 0;
        for stack in counts.keys() {
            for (depth, address) in stack.user.iter().enumerate().filter(|(_, a)| native(a)) {
                let address = lookup(depth, *address);
                if let Some(index) = mapping_index(process, address) {
                    by_mapping.entry(index).or_default().push(address);
                }
            }
        }
        let mut resolved: HashMap<u64, Resolved> = HashMap::new();
        // Build ids read from the files of mappings the kernel gave none for (those in
        // /proc/PID/maps at start): a frame this agent cannot name is named on the server
        // from a debug file of that id (docs/symbolization.md).
        let mut build_ids: HashMap<usize, Vec<u8>> = HashMap::new();
        for (index, mut addresses) in by_mapping {
            addresses.sort_unstable();
            addresses.dedup();
            let mapping = &process.mappings[index];
            let Some((path, symbol_bytes)) =
                crate::unwind::verified_path(binaries, process, mapping)
            else {
                continue;
            };
            if mapping.build_id.is_none() {
                if let Some(id) = binaries.get(&path).and_then(|b| b.build_id.clone()) {
                    build_ids.insert(index, id);
                }
            }
            if !self.symbols.name_files {
                continue;
            }
            let offsets: Vec<u64> = addresses.iter().map(|a| mapping.file_offset(*a)).collect();
            let results = if binaries.get(&path).is_some_and(|b| b.go_table) {
                go_frames(&path, &offsets)
            } else {
                self.symbols.resolve_file(path, symbol_bytes, &offsets)
            };
            resolved.extend(addresses.into_iter().zip(results));
        }

        // Addresses outside any file: JIT code, named by the runtime's perf map if any.
        let jitted = counts.keys().any(|stack| {
            stack.user.iter().filter(|a| native(a)).any(|address| {
                mapping_index(process, *address).is_none_or(|i| !process.mappings[i].is_file())
            })
        });
        let perf_map = if jitted { PerfMap::read(process) } else { None };
        if let Some(perf_map) = &perf_map {
            for stack in counts.keys() {
                for (depth, address) in stack.user.iter().enumerate() {
                    let address = lookup(depth, *address);
                    if resolved.contains_key(&address) {
                        continue;
                    }
                    if let Some(name) = perf_map.lookup(address) {
                        resolved.insert(
                            address,
                            Resolved {
                                frames: vec![(name.to_string(), String::new(), 0)],
                            },
                        );
                    }
                }
            }
        }

        for (stack, count) in counts {
            let mut ids = Vec::with_capacity(stack.kernel.len() + stack.user.len());
            for address in stack.kernel.iter() {
                let frames = self.kernel.get(address).cloned().unwrap_or_default();
                ids.push(out.kernel_location(*address, &frames));
            }
            for (depth, address) in stack.user.iter().enumerate() {
                if let Some(frames) = self.interpreted.get(*address) {
                    ids.push(out.interpreted_location(*address, frames));
                    continue;
                }
                let at = lookup(depth, *address);
                let index = mapping_index(process, at);
                let mapping = index.map(|i| &process.mappings[i]);
                let build_id = index.and_then(|i| build_ids.get(&i)).map(Vec::as_slice);
                let frames = resolved.get(&at).cloned().unwrap_or_default();
                ids.push(out.user_location(*address, mapping, build_id, &frames));
            }
            let count = i64::try_from(*count).unwrap_or(i64::MAX);
            if self.off_cpu {
                out.pprof.add_sample(ids, &[count], Vec::new());
            } else {
                out.pprof.add_sample(
                    ids,
                    &[count, count.saturating_mul(self.period_nanos)],
                    Vec::new(),
                );
            }
        }
    }
}

fn mapping_index(process: &Process, address: u64) -> Option<usize> {
    let index = process.mappings.partition_point(|m| m.start <= address);
    let index = index.checked_sub(1)?;
    (address < process.mappings[index].end).then_some(index)
}

/// A report under construction: the one pprof builder, and this report's memo of the
/// location at each (mapping, address), whose frames were resolved once.
#[derive(Default)]
struct Out {
    pprof: PprofBuilder,
    locations: HashMap<(u64, u64), u32>,
    kernel_mapping: u64,
}

impl Out {
    fn string(&mut self, value: &str) -> i64 {
        self.pprof.string(value)
    }

    /// `build_id` stands in for the mapping's own when the kernel gave none.
    fn mapping(&mut self, mapping: &Mapping, build_id: Option<&[u8]>, symbolized: bool) -> u64 {
        let filename = self.string(&mapping.path);
        let build_id = match mapping.build_id.as_deref().or(build_id) {
            Some(bytes) => self.string(&hex(bytes)),
            None => 0,
        };
        self.pprof.mapping(PprofMapping {
            id: 0,
            memory_start: mapping.start,
            memory_limit: mapping.end,
            file_offset: mapping.pgoff,
            filename,
            build_id,
            has_functions: symbolized,
            has_filenames: symbolized,
            has_line_numbers: symbolized,
            has_inline_frames: symbolized,
        })
    }

    fn location(&mut self, address: u64, mapping_id: u64, frames: &[(String, String, i64)]) -> u32 {
        self.location_keyed((mapping_id, address), mapping_id, address, frames)
    }

    /// An interpreted frame: a function with its file and line, at no address in any
    /// mapping (the tag only tells frames apart).
    fn interpreted_location(&mut self, tag: u64, frames: &[(String, String, i64)]) -> u32 {
        self.location_keyed((u64::MAX, tag), 0, 0, frames)
    }

    fn location_keyed(
        &mut self,
        key: (u64, u64),
        mapping_id: u64,
        address: u64,
        frames: &[(String, String, i64)],
    ) -> u32 {
        if let Some(id) = self.locations.get(&key) {
            return *id;
        }
        let lines: Vec<(u64, i64)> = frames
            .iter()
            .map(|(name, file, line)| {
                let (name, file) = (self.string(name), self.string(file));
                (self.pprof.function(name, name, file, 0), *line)
            })
            .collect();
        let id = self.pprof.location(mapping_id, address, &lines);
        self.locations.insert(key, id);
        id
    }

    fn user_location(
        &mut self,
        address: u64,
        mapping: Option<&Mapping>,
        build_id: Option<&[u8]>,
        resolved: &Resolved,
    ) -> u32 {
        let mapping_id = match mapping {
            Some(mapping) => self.mapping(mapping, build_id, !resolved.frames.is_empty()),
            None => 0,
        };
        self.location(address, mapping_id, &resolved.frames)
    }

    fn kernel_location(&mut self, address: u64, resolved: &Resolved) -> u32 {
        if self.kernel_mapping == 0 {
            let kernel = Mapping {
                start: 0xffff_8000_0000_0000,
                end: u64::MAX,
                pgoff: 0,
                path: "[kernel.kallsyms]".into(),
                build_id: None,
            };
            self.kernel_mapping = self.mapping(&kernel, None, true);
        }
        let mapping_id = self.kernel_mapping;
        self.location(address, mapping_id, &resolved.frames)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_maps_name_jitted_code_latest_first() {
        let map = PerfMap::parse(
            "1000 100 JS:~old /app.js:1\n1000 80 JS:*kilnHotJs /app.js:1\n2000 10 Interpreter\nbad line\n",
        );
        assert_eq!(map.lookup(0x1010), Some("JS:*kilnHotJs /app.js:1"));
        assert_eq!(map.lookup(0x1090), None); // the newer entry is shorter
        assert_eq!(map.lookup(0x2005), Some("Interpreter"));
        assert_eq!(map.lookup(0xfff), None);
    }

    #[test]
    fn container_ids_come_from_cgroup_paths() {
        let id = "a".repeat(64);
        assert_eq!(
            container_id(&format!("/system.slice/docker-{id}.scope")),
            Some(id.clone())
        );
        assert_eq!(
            container_id(&format!("/kubepods/burstable/pod1/{id}")),
            Some(id)
        );
        assert_eq!(
            container_id("/user.slice/user-0.slice/session-1.scope"),
            None
        );
    }
}
