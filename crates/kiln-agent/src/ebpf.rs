//! Stack counts aggregated in the kernel, for processes that keep frame pointers.
//!
//! src/bpf/agent.bpf.c (built by clang in build.rs, loaded here with aya) runs on every
//! sample of the agent's own `cpu-clock` events. For a process in its `fp_processes` map
//! it counts the sample by (instance, user stack id, kernel stack id) and tells the kernel
//! to write nothing to the ring; every other sample goes to the ring as without eBPF, with
//! the stack copy DWARF unwinding needs. So the output is the same either way; eBPF only
//! spares the ring and the agent the samples that need no work in user space: those of
//! long-running frame-pointer programs, Go services above all.
//!
//! Counts and stacks are double-buffered by epoch: [`Ebpf::drain`] bumps the epoch, and
//! reads and empties the maps of the previous one, which the program no longer writes.
//! The program's own exec and exit tracepoints drop a process from `fp_processes` at once,
//! so a pid reused or a program replaced never has its samples counted as the old one's.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use aya::maps::{Array, HashMap as BpfHashMap, MapData, RingBuf, StackTraceMap};
use aya::programs::{PerfEvent, RawTracePoint};

use crate::procs::Instance;
use crate::report::Stack;

/// The program, as built (empty when clang was missing at build time), aligned as the
/// ELF parser needs.
pub const OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/agent.bpf.o"));

/// The smallest of the call chain's context markers (`PERF_CONTEXT_USER` …).
const PERF_CONTEXT_MAX: u64 = perf_event_open_sys::bindings::PERF_CONTEXT_MAX;

/// Frames per stack the program keeps (`MAX_DEPTH` there).
pub const MAX_DEPTH: usize = 127;

#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    #[error("this kiln was built without its BPF program (clang was missing at build time)")]
    NotBuilt,
    #[error("loading the BPF program: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("the BPF program: {0}")]
    Program(#[from] aya::programs::ProgramError),
    #[error("the BPF maps: {0}")]
    Map(#[from] aya::maps::MapError),
    #[error("the BPF object has no {0}")]
    Missing(&'static str),
    #[error("attaching the BPF program to a perf event: {0}")]
    Attach(std::io::Error),
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct CountKey {
    instance: u64,
    user_stack: i32,
    kernel_stack: i32,
}

// SAFETY: a plain C struct of integers with no padding, as the BPF program lays it out.
unsafe impl aya::Pod for CountKey {}

/// The loaded program and its maps.
pub struct Ebpf {
    /// Keeps the programs loaded and the tracepoints attached.
    _bpf: aya::Ebpf,
    program: OwnedFd,
    fp_processes: BpfHashMap<MapData, u32, u64>,
    epoch: Array<MapData, u32>,
    current: u32,
    counts: [BpfHashMap<MapData, CountKey, u64>; 2],
    stacks: [StackTraceMap<MapData>; 2],
    /// pid → instance, as in `fp_processes`.
    tracked: HashMap<u32, Instance>,
    /// Processes whose interpreter stacks the program reads (interp/), by pid.
    interp_procs: BpfHashMap<MapData, u32, crate::interp::ProcLayout>,
    interpreted: HashMap<u32, Instance>,
    /// The rings the reading thread drains, until [`Ebpf::take_rings`].
    interp_events: Option<RingBuf<MapData>>,
    offcpu_events: Option<RingBuf<MapData>>,
}

/// How large the program's maps are made. The kernel allocates a hash map's entries and
/// a ring whole when they are created, and pins that memory whether it is used or not, so
/// it counts against the agent's memory budget as its own heap does: the maps get a
/// share of `--memory-limit` ([`MapSizes::within`]), and what the kernel charges for
/// them is measured once they are made ([`map_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapSizes {
    /// Entries of each of the two stack maps (per epoch: distinct stacks counted in the
    /// kernel; past it a sample goes to the ring, as without eBPF).
    pub stacks: u32,
    /// Entries of each of the two count maps.
    pub counts: u32,
    /// Entries of each map with one entry per thread (`interp_threads`, `offcpu_starts`,
    /// least recently used first out).
    pub threads: u32,
    /// Bytes of the rings of interpreter stacks and off-CPU switches.
    pub interp_ring: u32,
    pub offcpu_ring: u32,
}

impl MapSizes {
    /// The sizes the program declares: what a large budget gets.
    pub const FULL: MapSizes = MapSizes {
        stacks: MAX_STACKS,
        counts: 16384,
        threads: 65536,
        interp_ring: 4 << 20,
        offcpu_ring: 8 << 20,
    };
    /// Below these a map is not made smaller.
    const FLOOR: MapSizes = MapSizes {
        stacks: 256,
        counts: 1024,
        threads: 4096,
        interp_ring: 256 << 10,
        offcpu_ring: 256 << 10,
    };

    /// The sizes in the order of [`MapSizes::UNIT_BYTES`].
    fn parts(&self) -> [u32; 5] {
        [
            self.stacks,
            self.counts,
            self.threads,
            self.interp_ring,
            self.offcpu_ring,
        ]
    }

    fn from_parts([stacks, counts, threads, interp_ring, offcpu_ring]: [u32; 5]) -> MapSizes {
        MapSizes {
            stacks,
            counts,
            threads,
            interp_ring,
            offcpu_ring,
        }
    }

    /// What the kernel charges per unit of each part, in thousandths of a byte, as Linux
    /// 6.1 reports it (`memlock` in each map's fdinfo): per entry the value and key with
    /// the kernel's element header, two maps of each (stacks, counts) or one map each of
    /// two kinds (threads); per byte of a ring, its pages and a few more.
    const UNIT_BYTES: [u64; 5] = [
        2 * (8 * MAX_DEPTH as u64 + 24) * 1000,
        2 * 88 * 1000,
        (80 + 88) * 1000,
        1006,
        1006,
    ];

    /// What the kernel charges for maps of these sizes, the maps of fixed size (the
    /// processes tracked and read, 1.8 MB) included.
    pub fn bytes(&self) -> usize {
        let parts: u64 = self
            .parts()
            .iter()
            .zip(Self::UNIT_BYTES)
            .map(|(size, unit)| u64::from(*size) * unit / 1000)
            .sum();
        usize::try_from(parts).unwrap_or(usize::MAX) + FIXED_MAP_BYTES
    }

    /// The largest sizes whose [`MapSizes::bytes`] fit `budget`: from [`MapSizes::FULL`],
    /// the map that takes most is halved until they fit, or all are at their floors.
    /// Rings weigh half: a ring too small loses events under a burst, where a smaller
    /// map only sends more samples the slow way.
    pub fn within(budget: usize) -> MapSizes {
        let mut parts = MapSizes::FULL.parts();
        let floors = MapSizes::FLOOR.parts();
        while MapSizes::from_parts(parts).bytes() > budget {
            let weight = |part: usize| {
                let bytes = u64::from(parts[part]) * Self::UNIT_BYTES[part];
                // Parts 3 and 4 are the rings.
                if part >= 3 {
                    bytes / 2
                } else {
                    bytes
                }
            };
            let Some(largest) = (0..parts.len())
                .filter(|&part| parts[part] > floors[part])
                .max_by_key(|&part| weight(part))
            else {
                break;
            };
            parts[largest] /= 2;
        }
        MapSizes::from_parts(parts)
    }
}

/// Stacks per stack map, as agent.bpf.c declares them.
const MAX_STACKS: u32 = 4096;
/// `fp_processes` and `interp_procs`, and the one-entry arrays.
const FIXED_MAP_BYTES: usize = 1_806_000;

/// What the kernel charges for this process's BPF maps, in bytes: the sum of `memlock`
/// over the maps it holds open (`/proc/self/fdinfo`), which is what they pin.
pub fn map_bytes() -> u64 {
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    fds.flatten()
        .filter(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|target| target.as_os_str() == "anon_inode:bpf-map")
        })
        .filter_map(|fd| {
            let info = std::fs::read_to_string(
                std::path::Path::new("/proc/self/fdinfo").join(fd.file_name()),
            )
            .ok()?;
            info.lines()
                .find_map(|line| line.strip_prefix("memlock:"))
                .and_then(|value| value.trim().parse::<u64>().ok())
        })
        .sum()
}

impl Ebpf {
    /// Loads the program with maps of these sizes and attaches its tracepoints; perf
    /// events are attached with [`Ebpf::attach`].
    pub fn load(sizes: MapSizes) -> Result<Ebpf, EbpfError> {
        if OBJECT.is_empty() {
            return Err(EbpfError::NotBuilt);
        }
        let mut loader = aya::EbpfLoader::new();
        for (map, entries) in [
            ("stacks_0", sizes.stacks),
            ("stacks_1", sizes.stacks),
            ("counts_0", sizes.counts),
            ("counts_1", sizes.counts),
            ("interp_threads", sizes.threads),
            ("offcpu_starts", sizes.threads),
            ("interp_events", sizes.interp_ring),
            ("offcpu_events", sizes.offcpu_ring),
        ] {
            loader.set_max_entries(map, entries);
        }
        let mut bpf = loader.load(OBJECT)?;
        let sample: &mut PerfEvent = bpf
            .program_mut("kiln_sample")
            .ok_or(EbpfError::Missing("kiln_sample"))?
            .try_into()?;
        sample.load()?;
        let program = sample
            .fd()?
            .as_fd()
            .try_clone_to_owned()
            .map_err(EbpfError::Attach)?;
        for (name, event) in [
            ("kiln_exec", "sched_process_exec"),
            ("kiln_exit", "sched_process_exit"),
        ] {
            let tracepoint: &mut RawTracePoint = bpf
                .program_mut(name)
                .ok_or(EbpfError::Missing("a tracepoint program"))?
                .try_into()?;
            tracepoint.load()?;
            tracepoint.attach(event)?;
        }
        let mut take = |name: &'static str| bpf.take_map(name).ok_or(EbpfError::Missing(name));
        let fp_processes = BpfHashMap::try_from(take("fp_processes")?)?;
        let epoch = Array::try_from(take("epoch")?)?;
        let counts = [
            BpfHashMap::try_from(take("counts_0")?)?,
            BpfHashMap::try_from(take("counts_1")?)?,
        ];
        let stacks = [
            StackTraceMap::try_from(take("stacks_0")?)?,
            StackTraceMap::try_from(take("stacks_1")?)?,
        ];
        let interp_procs = BpfHashMap::try_from(take("interp_procs")?)?;
        let interp_events = Some(RingBuf::try_from(take("interp_events")?)?);
        let offcpu_events = Some(RingBuf::try_from(take("offcpu_events")?)?);
        Ok(Ebpf {
            _bpf: bpf,
            program,
            fp_processes,
            epoch,
            current: 0,
            counts,
            stacks,
            tracked: HashMap::new(),
            interp_procs,
            interpreted: HashMap::new(),
            interp_events,
            offcpu_events,
        })
    }

    /// The program's descriptor, for [`attach`].
    pub fn program(&self) -> BorrowedFd<'_> {
        self.program.as_fd()
    }

    /// Counts this process's samples in the kernel from now on.
    pub fn track(&mut self, pid: u32, instance: Instance) {
        if self.tracked.get(&pid) == Some(&instance) {
            return;
        }
        if self.fp_processes.insert(pid, instance, 0).is_ok() {
            self.tracked.insert(pid, instance);
        }
    }

    /// Sends this process's samples to the ring again, with their stack copies: it
    /// mapped what may be an interpreter (a JVM's `libjvm.so` is loaded after its
    /// launcher has run, and sampled, for a while), which only a sample can examine.
    pub fn count_in_ring(&mut self, pid: u32) {
        if self.tracked.remove(&pid).is_some() {
            let _ = self.fp_processes.remove(&pid);
        }
    }

    /// Stops counting a process that is gone from the agent's table.
    pub fn untrack(&mut self, pid: u32, instance: Instance) {
        if self.tracked.get(&pid) == Some(&instance) {
            self.tracked.remove(&pid);
            let _ = self.fp_processes.remove(&pid);
        }
        if self.interpreted.get(&pid) == Some(&instance) {
            self.interpreted.remove(&pid);
            let _ = self.interp_procs.remove(&pid);
        }
    }

    /// Reads this process's interpreter stacks at its samples from now on.
    pub fn interpret(
        &mut self,
        pid: u32,
        instance: Instance,
        layout: &crate::interp::ProcLayout,
    ) -> Result<(), EbpfError> {
        self.interp_procs.insert(pid, *layout, 0)?;
        self.interpreted.insert(pid, instance);
        Ok(())
    }

    /// The rings the programs write interpreter stacks and off-CPU switches to, for the
    /// thread that reads the perf rings; empty after the first call.
    pub fn take_rings(&mut self) -> Rings {
        Rings {
            interp: self.interp_events.take(),
            offcpu: self.offcpu_events.take(),
            epoll: None,
        }
    }

    /// Samples a `threshold` share of the switches of threads that block (offcpu.rs),
    /// other than the agent's own.
    pub fn enable_offcpu(&mut self, threshold: f64) -> Result<(), EbpfError> {
        let switch: &mut RawTracePoint = self
            ._bpf
            .program_mut("kiln_switch")
            .ok_or(EbpfError::Missing("kiln_switch"))?
            .try_into()?;
        switch.load()?;
        switch.attach("sched_switch")?;
        let mut config: Array<&mut MapData, OffCpuConfig> = Array::try_from(
            self._bpf
                .map_mut("offcpu_config")
                .ok_or(EbpfError::Missing("offcpu_config"))?,
        )?;
        let share = (threshold.clamp(0.0, 1.0) * f64::from(u32::MAX)) as u32;
        config.set(
            0,
            OffCpuConfig {
                enabled: 1,
                threshold: share,
                agent: std::process::id(),
                pad: 0,
            },
            0,
        )?;
        Ok(())
    }

    /// The counts since the last call, by instance and stack; the maps they were read from
    /// are emptied.
    pub fn drain(&mut self) -> Vec<(Instance, Stack, u64)> {
        let previous = self.current;
        self.current = self.current.wrapping_add(1);
        if self.epoch.set(0, self.current, 0).is_err() {
            self.current = previous;
            return Vec::new();
        }
        // A program that read the old epoch just before the bump finishes within
        // microseconds; give it a moment before its maps are read.
        std::thread::sleep(std::time::Duration::from_millis(1));
        let parity = (previous & 1) as usize;
        let keys: Vec<CountKey> = self.counts[parity].keys().filter_map(Result::ok).collect();
        let mut frames: HashMap<i32, Box<[u64]>> = HashMap::new();
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let Ok(count) = self.counts[parity].get(&key, 0) else {
                continue;
            };
            let _ = self.counts[parity].remove(&key);
            let mut stack = |id: i32| -> Box<[u64]> {
                if id < 0 {
                    return Box::default();
                }
                frames
                    .entry(id)
                    .or_insert_with(|| {
                        self.stacks[parity]
                            .get(&(id as u32), 0)
                            .map(|trace| {
                                // From a perf event the kernel reuses the sample's call
                                // chain, context markers included.
                                trace
                                    .frames()
                                    .iter()
                                    .map(|frame| frame.ip)
                                    .filter(|ip| *ip < PERF_CONTEXT_MAX)
                                    .collect()
                            })
                            .unwrap_or_default()
                    })
                    .clone()
            };
            let user = stack(key.user_stack);
            let kernel = stack(key.kernel_stack);
            out.push((key.instance, Stack { kernel, user }, count));
        }
        let ids: Vec<u32> = self.stacks[parity]
            .stack_ids()
            .filter_map(Result::ok)
            .collect();
        for id in ids {
            let _ = self.stacks[parity].remove(&id);
        }
        out
    }
}

/// Runs the program on a perf event's samples (`PERF_EVENT_IOC_SET_BPF`).
pub fn attach(event: BorrowedFd<'_>, program: BorrowedFd<'_>) -> std::io::Result<()> {
    // SAFETY: the ioctl takes the program's descriptor as its argument; both are open.
    let result = unsafe {
        perf_event_open_sys::ioctls::SET_BPF(event.as_raw_fd(), program.as_raw_fd() as u32)
    };
    if result < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct OffCpuConfig {
    enabled: u32,
    threshold: u32,
    agent: u32,
    pad: u32,
}

// SAFETY: a plain C struct of four integers, as `struct offcpu_config` lays it out.
unsafe impl aya::Pod for OffCpuConfig {}

/// The BPF rings of interpreter stacks (interp/) and off-CPU switches (offcpu.rs), read
/// with the perf rings.
#[derive(Default)]
pub struct Rings {
    interp: Option<RingBuf<MapData>>,
    offcpu: Option<RingBuf<MapData>>,
    epoll: Option<Epoll>,
}

/// An edge-triggered epoll over the rings: it reports the BPF program's wakeups, not
/// whether data waits (a ring always has some on a busy host, and a level-triggered
/// wait would return at once, every time).
struct Epoll(OwnedFd);

impl Epoll {
    fn new(fds: &[i32]) -> Option<Epoll> {
        use std::os::fd::FromRawFd;
        // SAFETY: epoll_create1 takes flags only; its result is checked.
        let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epoll < 0 {
            return None;
        }
        // SAFETY: a new descriptor nothing else owns.
        let epoll = Epoll(unsafe { OwnedFd::from_raw_fd(epoll) });
        for fd in fds {
            let mut event = libc::epoll_event {
                events: (libc::EPOLLIN | libc::EPOLLET) as u32,
                u64: *fd as u64,
            };
            // SAFETY: both descriptors are open; `event` is a valid epoll_event.
            let added = unsafe {
                libc::epoll_ctl(
                    std::os::fd::AsRawFd::as_raw_fd(&epoll.0),
                    libc::EPOLL_CTL_ADD,
                    *fd,
                    &mut event,
                )
            };
            if added < 0 {
                return None;
            }
        }
        Some(epoll)
    }

    fn wait(&self, timeout: std::time::Duration) {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 4];
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: `events` holds as many entries as passed; an error (EINTR) just ends
        // the wait early, as a wakeup would.
        unsafe {
            libc::epoll_wait(
                std::os::fd::AsRawFd::as_raw_fd(&self.0),
                events.as_mut_ptr(),
                events.len() as i32,
                ms,
            );
        }
    }
}

impl Rings {
    /// Waits up to `timeout` for a ring to be half full (the BPF program wakes its
    /// readers then, and only then: `ring_wakeup` in agent.bpf.c).
    pub fn wait(&mut self, timeout: std::time::Duration) {
        use std::os::fd::AsRawFd;
        let fds: Vec<i32> = [self.interp.as_ref(), self.offcpu.as_ref()]
            .into_iter()
            .flatten()
            .map(|ring| ring.as_raw_fd())
            .collect();
        if self.epoll.is_none() && !fds.is_empty() {
            self.epoll = Epoll::new(&fds);
        }
        match &self.epoll {
            Some(epoll) => epoll.wait(timeout),
            None => std::thread::sleep(timeout),
        }
    }

    /// Every event written since the last call: interpreter stacks, and off-CPU switches.
    pub fn drain(&mut self) -> (Vec<crate::interp::Event>, Vec<crate::offcpu::Event>) {
        let mut interpreted = Vec::new();
        if let Some(ring) = &mut self.interp {
            while let Some(item) = ring.next() {
                interpreted.extend(crate::interp::Event::parse(&item));
            }
        }
        let mut off_cpu = Vec::new();
        if let Some(ring) = &mut self.offcpu {
            while let Some(item) = ring.next() {
                off_cpu.extend(crate::offcpu::Event::parse(&item));
            }
        }
        (interpreted, off_cpu)
    }
}

/// Turns on the kernel's run-time accounting of BPF programs for as long as the returned
/// descriptor is open (`kiln bench agent` measures the programs' own cost with it).
pub fn enable_stats() -> Option<OwnedFd> {
    aya::sys::enable_stats(aya::sys::Stats::RunTime).ok()
}

/// Runs and run time of every loaded BPF program named `kiln_*` (any process's), by name.
pub fn program_stats() -> HashMap<String, (u64, std::time::Duration)> {
    let mut stats: HashMap<String, (u64, std::time::Duration)> = HashMap::new();
    for info in aya::programs::loaded_programs().filter_map(Result::ok) {
        let Some(name) = info.name_as_str().filter(|name| name.starts_with("kiln_")) else {
            continue;
        };
        let entry = stats.entry(name.to_string()).or_default();
        entry.0 += info.run_count();
        entry.1 += info.run_time();
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The maps fit the share of the budget they are given, shrink no further than they
    /// must, and stop at their floors when it is too small for anything.
    #[test]
    fn maps_are_sized_within_their_share_of_the_budget() {
        assert_eq!(MapSizes::within(usize::MAX), MapSizes::FULL);
        assert!(MapSizes::FULL.bytes() > 36_000_000 && MapSizes::FULL.bytes() < 38_000_000);
        let mut previous = 0;
        for budget_mib in [4usize, 8, 16, 24, 32, 48, 64] {
            let budget = budget_mib << 20;
            let sizes = MapSizes::within(budget);
            let bytes = sizes.bytes();
            assert!(
                bytes <= budget || sizes == MapSizes::FLOOR,
                "{budget_mib} MiB: {sizes:?}"
            );
            // Halving any one map more would have been needless: they took over half
            // the budget.
            assert!(
                bytes > budget / 2 || sizes == MapSizes::FULL,
                "{budget_mib}: {sizes:?}"
            );
            assert!(bytes >= previous, "{budget_mib}: {sizes:?}");
            previous = bytes;
        }
        // The default budget's eighth (16 MiB): the rings kept larger than the maps that
        // only send samples the slow way when full.
        let default = MapSizes::within(16 << 20);
        assert!(default.offcpu_ring >= 4 << 20, "{default:?}");
        assert!(default.threads < MapSizes::FULL.threads, "{default:?}");
        assert_eq!(MapSizes::within(0), MapSizes::FLOOR);
    }
}
