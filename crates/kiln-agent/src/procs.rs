//! Which program each process is, and what it has mapped where.
//!
//! A process is known from the records the kernel writes as things happen (MMAP2 for every
//! executable mapping, with its build id; COMM with the exec flag when a new program
//! starts; FORK; EXIT), and from `/proc/PID` for processes that were already running when
//! the agent started. So a process that lives 200 ms is still attributed to its program,
//! by the mappings seen while it ran, even when `/proc/PID` is gone by the time its
//! samples are reported.
//!
//! A pid can be reused. Each process gets an [`Instance`] number when it is first seen,
//! exec'd or forked, and samples are counted per instance, never per pid, so one
//! program's samples never go to another.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::{Arc, Weak};

/// One executable mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// File offset of `start`.
    pub pgoff: u64,
    pub path: String,
    pub build_id: Option<Vec<u8>>,
}

impl Mapping {
    /// Whether the path names a file (not `[vdso]`, `[anon:…]`, `//anon`).
    pub fn is_file(&self) -> bool {
        self.path.starts_with('/') && !self.path.starts_with("//anon")
    }

    pub fn file_offset(&self, address: u64) -> u64 {
        address - self.start + self.pgoff
    }
}

/// A process as one run of one program: a new number at each exec and for each new pid.
pub type Instance = u64;

#[derive(Debug, Clone)]
pub struct Process {
    pub pid: u32,
    pub instance: Instance,
    pub comm: String,
    pub exe: String,
    pub cgroup: String,
    /// Sorted by start, non-overlapping.
    pub mappings: Vec<Mapping>,
    /// The process exited; it is forgotten once its samples were reported.
    pub exited: bool,
    /// `/proc/PID/maps` was read for it (only once: later changes arrive as records).
    pub read_proc: bool,
    /// Allow-listed environment variables, from `/proc/PID/environ`.
    pub env: Vec<(String, String)>,
    /// Changes with every new mapping, so what was built from the mappings is rebuilt.
    pub generation: u64,
    /// The process was seen in a mount namespace other than the agent's (a container):
    /// a path as the host sees it names another file, or none.
    pub foreign_mounts: bool,
    /// Files of mappings that samples hit, held open (see [`ProcessTable::pin`]):
    /// (mapping start, file, or none when it could not be opened).
    pub pinned: Vec<(u64, Option<Arc<File>>)>,
}

impl Process {
    fn new(pid: u32, instance: Instance) -> Self {
        Process {
            pid,
            instance,
            comm: String::new(),
            exe: String::new(),
            cgroup: String::new(),
            mappings: Vec::new(),
            exited: false,
            read_proc: false,
            env: Vec::new(),
            generation: 0,
            foreign_mounts: false,
            pinned: Vec::new(),
        }
    }

    /// The mapping holding `address`.
    pub fn mapping(&self, address: u64) -> Option<&Mapping> {
        let index = self.mappings.partition_point(|m| m.start <= address);
        let mapping = self.mappings.get(index.checked_sub(1)?)?;
        (address < mapping.end).then_some(mapping)
    }

    fn add_mapping(&mut self, mapping: Mapping) {
        // A new mapping replaces whatever it overlaps, as mmap(2) does.
        self.mappings
            .retain(|m| m.end <= mapping.start || m.start >= mapping.end);
        let index = self.mappings.partition_point(|m| m.start < mapping.start);
        self.mappings.insert(index, mapping);
        self.generation += 1;
    }

    /// The file a mapping's bytes can be read from now: the one pinned while the process
    /// lived, else through `/proc/PID/root` (it may be in another mount namespace),
    /// `/proc/PID/map_files` for a deleted executable, else the path as it is, unless the
    /// process had mounts of its own.
    ///
    /// The pinned file comes first even while the process seems alive: it dies before
    /// the agent reads its exit record, and a report in between would otherwise find
    /// `/proc/PID` gone and read the host's file at that path.
    pub fn readable_path(&self, mapping: &Mapping) -> Option<PathBuf> {
        if !mapping.is_file() {
            return None;
        }
        let pinned = self
            .pinned
            .iter()
            .find(|(start, _)| *start == mapping.start);
        if let Some((_, Some(file))) = pinned {
            return Some(PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd())));
        }
        let proc_dir = PathBuf::from(format!("/proc/{}", self.pid));
        // `/proc/PID/maps` marks a deleted file; a path from an MMAP2 record is as it was.
        let deleted = mapping.path.ends_with(" (deleted)");
        let path = mapping.path.trim_end_matches(" (deleted)");
        if !self.exited {
            let rooted = proc_dir.join("root").join(path.trim_start_matches('/'));
            if !deleted && rooted.exists() {
                return Some(rooted);
            }
            if let Some(file) = self.mapped_file(mapping) {
                return Some(file);
            }
        }
        let path = PathBuf::from(path);
        (!deleted && !self.foreign_mounts && path.exists()).then_some(path)
    }

    /// The mapped file itself, through `/proc/PID/map_files`, while the process lives: for
    /// when the file at the mapping's path was replaced since it was mapped.
    pub fn mapped_file(&self, mapping: &Mapping) -> Option<PathBuf> {
        let file = PathBuf::from(format!(
            "/proc/{}/map_files/{:x}-{:x}",
            self.pid, mapping.start, mapping.end
        ));
        (!self.exited && file.exists()).then_some(file)
    }

    /// The program's own file: the mapping of the executable, else the first file.
    pub fn main_mapping(&self) -> Option<&Mapping> {
        self.mappings
            .iter()
            .find(|m| !self.exe.is_empty() && m.path == self.exe)
            .or_else(|| self.mappings.iter().find(|m| m.is_file()))
    }
}

/// Every process the agent has seen: the current instance of each pid, and instances
/// replaced (by an exec or a reused pid) or exited whose samples are not reported yet.
#[derive(Debug)]
pub struct ProcessTable {
    by_pid: HashMap<u32, Instance>,
    instances: HashMap<Instance, Process>,
    next_instance: Instance,
    proc_root: PathBuf,
    /// Environment variables read from processes (for relabeling); no others are read.
    env_allowlist: Vec<String>,
    /// Files held open for processes, one descriptor per file however many map it.
    open_files: HashMap<(u64, u64), Weak<File>>,
}

impl Default for ProcessTable {
    fn default() -> Self {
        ProcessTable::with_proc_root("/proc")
    }
}

impl ProcessTable {
    pub fn with_proc_root(root: impl Into<PathBuf>) -> Self {
        ProcessTable {
            by_pid: HashMap::new(),
            instances: HashMap::new(),
            next_instance: 1,
            proc_root: root.into(),
            env_allowlist: Vec::new(),
            open_files: HashMap::new(),
        }
    }

    /// Holds open the file of the mapping at `address`, once per mapping. A process's files
    /// can be gone by the time its samples are symbolized: `/proc/PID/root` and
    /// `/proc/PID/map_files` vanish when it exits, and with them a container's files or a
    /// deleted executable. An open descriptor keeps them readable until the report.
    pub fn pin(&mut self, instance: Instance, address: u64) {
        let Some(process) = self.instances.get_mut(&instance) else {
            return;
        };
        let Some(mapping) = process.mapping(address) else {
            return;
        };
        if !mapping.is_file() || process.pinned.iter().any(|(s, _)| *s == mapping.start) {
            return;
        }
        let start = mapping.start;
        let opened = process
            .readable_path(mapping)
            .and_then(|path| File::open(path).ok())
            .and_then(|file| file.metadata().ok().map(|meta| (file, meta)));
        let Some((file, meta)) = opened else {
            process.pinned.push((start, None));
            return;
        };
        let key = (meta.dev(), meta.ino());
        let file = match self.open_files.get(&key).and_then(Weak::upgrade) {
            Some(open) => open,
            None => {
                let file = Arc::new(file);
                self.open_files.insert(key, Arc::downgrade(&file));
                file
            }
        };
        process.pinned.push((start, Some(file)));
    }

    /// Reads these environment variables of each process, for `__meta_process_env_<NAME>`.
    pub fn with_env_allowlist(mut self, names: Vec<String>) -> Self {
        self.env_allowlist = names;
        self
    }

    /// Starts a new instance for `pid`, retiring the one it had.
    fn start(&mut self, process_for: impl FnOnce(Instance) -> Process) -> Instance {
        let instance = self.next_instance;
        self.next_instance += 1;
        let process = process_for(instance);
        let pid = process.pid;
        if let Some(old) = self.by_pid.insert(pid, instance) {
            if let Some(old) = self.instances.get_mut(&old) {
                old.exited = true;
            }
        }
        self.instances.insert(instance, process);
        instance
    }

    fn current(&mut self, pid: u32) -> Option<&mut Process> {
        let instance = self.by_pid.get(&pid)?;
        self.instances.get_mut(instance)
    }

    pub fn instance(&self, instance: Instance) -> Option<&Process> {
        self.instances.get(&instance)
    }

    pub fn len(&self) -> usize {
        self.instances.len()
    }

    pub fn is_empty(&self) -> bool {
        self.instances.is_empty()
    }

    /// The process of a sample: known, or read from `/proc` on first sight. One gone from
    /// `/proc` before its first sample was read is still counted, with what records said.
    pub fn for_sample(&mut self, pid: u32) -> Instance {
        let instance = match self.by_pid.get(&pid) {
            Some(instance) => *instance,
            None => self.start(|instance| Process::new(pid, instance)),
        };
        let root = self.proc_root.clone();
        if let Some(process) = self.instances.get_mut(&instance) {
            if !process.read_proc {
                process.read_proc = true;
                read_proc(&root, process, &self.env_allowlist);
            }
        }
        instance
    }

    pub fn mmap(&mut self, pid: u32, mapping: Mapping) {
        if !self.by_pid.contains_key(&pid) {
            self.start(|instance| Process::new(pid, instance));
        }
        if let Some(process) = self.current(pid) {
            // At an exec the kernel maps the program's own file first: that is the
            // executable even when the process is gone before /proc/PID/exe is read.
            if process.exe.is_empty() && mapping.is_file() {
                process.exe = mapping.path.clone();
            }
            process.add_mapping(mapping);
        }
    }

    /// A thread was named; at an exec the process becomes a new program, whose mappings
    /// arrive as MMAP2 records right after.
    pub fn comm(&mut self, pid: u32, tid: u32, comm: String, exec: bool) {
        if exec {
            self.start(|instance| {
                let mut process = Process::new(pid, instance);
                process.comm = comm;
                process
            });
        } else if pid == tid {
            if let Some(process) = self.current(pid) {
                process.comm = comm;
            }
        }
    }

    /// A new process (not a new thread) starts as a copy of its parent.
    pub fn fork(&mut self, pid: u32, ppid: u32, tid: u32) {
        if pid != tid || pid == ppid {
            return; // a thread
        }
        let parent = self.current(ppid).cloned();
        self.start(|instance| match parent {
            Some(parent) => Process {
                pid,
                instance,
                exited: false,
                read_proc: true,
                ..parent
            },
            None => Process::new(pid, instance),
        });
    }

    pub fn exit(&mut self, pid: u32, tid: u32) {
        if pid == tid {
            if let Some(process) = self.current(pid) {
                process.exited = true;
            }
        }
    }

    /// Exited and replaced processes, which [`ProcessTable::forget_exited`] forgets.
    pub fn exited(&self) -> impl Iterator<Item = (Instance, &Process)> {
        self.instances
            .iter()
            .filter(|(_, process)| process.exited)
            .map(|(instance, process)| (*instance, process))
    }

    /// Forgets exited and replaced processes, but those `keep` names: call after their
    /// samples were reported, and keep those sampled since.
    pub fn forget_exited_except(&mut self, keep: impl Fn(Instance) -> bool) {
        self.instances
            .retain(|instance, process| !process.exited || keep(*instance));
        self.open_files.retain(|_, file| file.strong_count() > 0);
        let instances = &self.instances;
        self.by_pid
            .retain(|_, instance| instances.contains_key(instance));
    }
}

/// A `kB` field (`VmRSS:`, `RssAnon:` …) of `/proc/PID/status`; 0 when unreadable.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(field))
                .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// The cgroup that says which container a process is in, from `/proc/<pid>/cgroup`: the
/// unified (v2) hierarchy's path, unless it is the root, as on a host that mounts v1 and
/// v2 side by side with the controllers on v1; then the first v1 hierarchy's that is not
/// the root (the kubelet and container runtimes place a container in every one).
pub fn cgroup_path(text: &str) -> &str {
    let paths = text.lines().filter_map(|line| {
        let mut parts = line.splitn(3, ':');
        let id = parts.next()?;
        parts.next()?;
        Some((id == "0", parts.next()?))
    });
    let mut first = None;
    for (unified, path) in paths {
        if unified && path != "/" {
            return path;
        }
        if !unified && path != "/" && first.is_none() {
            first = Some(path);
        }
    }
    first.unwrap_or(if text.is_empty() { "" } else { "/" })
}

/// Fills a process from `/proc/PID`: name, executable, cgroup, mappings. Any of them may be
/// unreadable (gone, another mount namespace, hidepid): what is read is kept.
fn read_proc(root: &std::path::Path, process: &mut Process, env_allowlist: &[String]) {
    let dir = root.join(process.pid.to_string());
    if !env_allowlist.is_empty() {
        if let Ok(environ) = std::fs::read(dir.join("environ")) {
            process.env = environ
                .split(|&b| b == 0)
                .filter_map(|entry| {
                    let entry = String::from_utf8_lossy(entry);
                    let (name, value) = entry.split_once('=')?;
                    env_allowlist
                        .iter()
                        .any(|allowed| allowed == name)
                        .then(|| (name.to_string(), value.to_string()))
                })
                .collect();
        }
    }
    if process.comm.is_empty() {
        if let Ok(comm) = std::fs::read_to_string(dir.join("comm")) {
            process.comm = comm.trim_end().to_string();
        }
    }
    if let Ok(exe) = std::fs::read_link(dir.join("exe")) {
        process.exe = exe.to_string_lossy().into_owned();
    }
    if let Ok(cgroup) = std::fs::read_to_string(dir.join("cgroup")) {
        process.cgroup = cgroup_path(&cgroup).to_string();
    }
    if let (Ok(own), Ok(agents)) = (
        std::fs::read_link(dir.join("ns/mnt")),
        std::fs::read_link(root.join("self/ns/mnt")),
    ) {
        process.foreign_mounts = own != agents;
    }
    if let Ok(maps) = std::fs::read_to_string(dir.join("maps")) {
        for mapping in parse_maps(&maps) {
            if process.mapping(mapping.start).is_none() {
                process.add_mapping(mapping);
            }
        }
    }
}

/// The executable mappings of a `/proc/PID/maps` text.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (start, end) = fields.next()?.split_once('-')?;
            let perms = fields.next()?;
            let offset = fields.next()?;
            let _device = fields.next()?;
            let _inode = fields.next()?;
            let path = fields.collect::<Vec<_>>().join(" ");
            if !perms.contains('x') {
                return None;
            }
            Some(Mapping {
                start: u64::from_str_radix(start, 16).ok()?,
                end: u64::from_str_radix(end, 16).ok()?,
                pgoff: u64::from_str_radix(offset, 16).ok()?,
                path,
                build_id: None,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cgroup_is_the_unified_one_unless_it_is_the_root() {
        let id = "a".repeat(64);
        let v2 = format!("0::/kubepods.slice/cri-containerd-{id}.scope\n");
        assert_eq!(
            cgroup_path(&v2),
            format!("/kubepods.slice/cri-containerd-{id}.scope")
        );
        let hybrid =
            format!("2:cpu:/kubepods/pod1/{id}\n1:name=systemd:/kubepods/pod1/{id}\n0::/\n");
        assert_eq!(cgroup_path(&hybrid), format!("/kubepods/pod1/{id}"));
        let hybrid_v2 = format!("4:memory:/other\n0::/kubepods/pod1/{id}\n");
        assert_eq!(cgroup_path(&hybrid_v2), format!("/kubepods/pod1/{id}"));
        assert_eq!(cgroup_path("1:cpu:/\n0::/\n"), "/");
        assert_eq!(cgroup_path(""), "");
    }

    #[test]
    fn maps_parse_executable_mappings_only() {
        let text = "55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 1 /usr/bin/app\n\
                    55d0c0a01000-55d0c0a05000 r-xp 00001000 08:01 1 /usr/bin/app\n\
                    7ffd1000-7ffd3000 r-xp 00000000 00:00 0 [vdso]\n\
                    7f00-8f00 r-xp 00000000 08:01 2 /tmp/x (deleted)\n";
        let maps = parse_maps(text);
        assert_eq!(maps.len(), 3);
        assert_eq!(maps[0].path, "/usr/bin/app");
        assert_eq!(maps[0].file_offset(0x55d0c0a01010), 0x1010);
        assert_eq!(maps[2].path, "/tmp/x (deleted)");
        assert!(!maps[1].is_file());
    }

    #[test]
    fn a_reused_pid_is_another_instance() {
        let mut table = ProcessTable::with_proc_root("/nonexistent");
        let mapping = |path: &str| Mapping {
            start: 0x1000,
            end: 0x2000,
            pgoff: 0,
            path: path.into(),
            build_id: None,
        };
        table.comm(42, 42, "first".into(), true);
        table.mmap(42, mapping("/bin/first"));
        let first = table.for_sample(42);
        table.exit(42, 42);
        table.fork(42, 1, 42);
        table.comm(42, 42, "second".into(), true);
        table.mmap(42, mapping("/bin/second"));
        let second = table.for_sample(42);
        assert_ne!(first, second);
        // The first program's samples still resolve to its own mapping until reported.
        assert_eq!(
            table.instance(first).unwrap().mapping(0x1800).unwrap().path,
            "/bin/first"
        );
        assert_eq!(
            table
                .instance(second)
                .unwrap()
                .mapping(0x1800)
                .unwrap()
                .path,
            "/bin/second"
        );
        assert_eq!(table.instance(second).unwrap().comm, "second");
        table.forget_exited_except(|_| false);
        assert!(table.instance(first).is_none());
        assert!(table.instance(second).is_some());
    }

    #[test]
    fn forks_inherit_mappings_and_threads_are_not_processes() {
        let mut table = ProcessTable::with_proc_root("/nonexistent");
        table.comm(10, 10, "parent".into(), true);
        table.mmap(
            10,
            Mapping {
                start: 0x1000,
                end: 0x2000,
                pgoff: 0,
                path: "/bin/p".into(),
                build_id: None,
            },
        );
        table.fork(10, 10, 11); // a thread
        assert_eq!(table.len(), 1);
        table.fork(20, 10, 20);
        let child = table.for_sample(20);
        assert_eq!(
            table.instance(child).unwrap().mapping(0x1500).unwrap().path,
            "/bin/p"
        );
        assert_eq!(table.instance(child).unwrap().comm, "parent");
    }

    /// A container's process that died a moment ago, its exit record not read yet: its
    /// `/proc/PID` is gone, and the host has another file at the mapping's path.
    #[test]
    fn a_dead_containers_file_is_the_pinned_one_never_the_hosts() {
        let dir = tempfile::tempdir().unwrap();
        let hosts = dir.path().join("app");
        std::fs::write(&hosts, b"the host's file").unwrap();
        let own = dir.path().join("own");
        std::fs::write(&own, b"the container's file").unwrap();
        // No pid reaches 2^31 (the kernel's limit is 2^22): this one has no /proc entry.
        let mut process = Process::new(3_000_000_000, 1);
        let mapping = Mapping {
            start: 0x1000,
            end: 0x2000,
            pgoff: 0,
            path: hosts.to_string_lossy().into_owned(),
            build_id: None,
        };
        process.add_mapping(mapping.clone());
        // Mounts of its own, nothing pinned: no file at all rather than the host's.
        process.foreign_mounts = true;
        assert_eq!(process.readable_path(&mapping), None);
        // Same mounts as the agent: the path as it is.
        process.foreign_mounts = false;
        assert_eq!(process.readable_path(&mapping), Some(hosts.clone()));
        // Pinned while it lived: that file, though the process is not known to have exited.
        process.foreign_mounts = true;
        let pinned = Arc::new(File::open(&own).unwrap());
        process.pinned.push((mapping.start, Some(pinned)));
        assert!(!process.exited);
        let path = process.readable_path(&mapping).unwrap();
        assert_eq!(std::fs::read(path).unwrap(), b"the container's file");
    }
}
