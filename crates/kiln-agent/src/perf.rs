//! Perf events: one `cpu-clock` sampling event per online CPU, each with its own mmap'd
//! ring buffer, and the records read from them.
//!
//! The kernel writes records (samples with their call chains, and the mmap, comm, fork
//! and exit records that say which process has which executable mapped) into a ring the
//! agent shares with it; the agent reads between `data_tail` and `data_head` and moves the
//! tail on. A full ring drops records and says so with a `LOST` record, which is counted.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{fence, Ordering};

use perf_event_open_sys as sys;
use sys::bindings as b;

/// Bytes of user stack copied with each sample, for DWARF unwinding: as `perf record
/// --call-graph dwarf` copies by default, twice over. Deeper stacks of programs without
/// frame pointers are cut there, and counted as truncated.
pub const STACK_BYTES: u32 = 16 << 10;

/// User registers copied with each sample: the three that unwinding starts from.
#[cfg(target_arch = "x86_64")]
const USER_REGS: u64 = (1 << 6) | (1 << 7) | (1 << 8); // BP, SP, IP (perf_regs.h)

/// Data pages per CPU ring (a power of two), from the frequency: a sample with its stack
/// copy is about 17 KiB, and the ring holds 2.5 times what arrives between two drains
/// (100 ms), from 512 KiB at 19 Hz to 4 MiB at 1000 Hz. A full ring drops samples, which
/// are counted.
fn ring_pages(frequency: u64, page: usize) -> usize {
    let bytes = frequency as usize * (STACK_BYTES as usize + 1024) / 10 * 5 / 2;
    bytes.div_ceil(page).next_power_of_two().clamp(128, 1024)
}

/// Why the events could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum PerfError {
    /// Not permitted: the message says which setting to change.
    #[error("{0}")]
    Permission(String),
    #[error("perf_event_open on CPU {cpu}: {source}")]
    Open { cpu: usize, source: io::Error },
    #[error("mmap of the ring buffer of CPU {cpu}: {source}")]
    Mmap { cpu: usize, source: io::Error },
    #[error("cannot list online CPUs: {0}")]
    Cpus(io::Error),
    /// The agent's configuration is invalid (a relabeling rule).
    #[error("invalid agent configuration: {0}")]
    Config(String),
}

/// What a record says, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A sample: the process and thread, and the call chain, innermost first, with the
    /// kernel's context markers removed (`kernel` frames, then `user` frames).
    Sample {
        pid: u32,
        tid: u32,
        kernel: Vec<u64>,
        user: Vec<u64>,
        /// Entries in the kernel's call chain, markers included: at the kernel's
        /// `perf_event_max_stack` the stack was cut.
        depth: usize,
        /// The user registers at the sample (ip, sp, bp), when it interrupted a process.
        regs: Option<[u64; 3]>,
        /// The copy of the user stack from `sp` up, as much as the kernel could copy.
        stack: Box<[u8]>,
        /// When it was taken, on `CLOCK_MONOTONIC`: the clock of the BPF program's
        /// interpreter stacks, which are joined to their samples by thread and time.
        time: u64,
    },
    /// An interpreter's stack, read by the BPF program at a sample (interp/).
    Interpreted(crate::interp::Event),
    /// A thread left the CPU or came back (offcpu.rs).
    OffCpu(crate::offcpu::Event),
    /// An executable mapping appeared.
    Mmap {
        pid: u32,
        start: u64,
        len: u64,
        pgoff: u64,
        path: String,
        build_id: Option<Vec<u8>>,
    },
    /// A thread was named; `exec` when it is the name of a newly executed program.
    Comm {
        pid: u32,
        tid: u32,
        comm: String,
        exec: bool,
    },
    Fork {
        pid: u32,
        ppid: u32,
        tid: u32,
    },
    Exit {
        pid: u32,
        tid: u32,
    },
    /// Records the kernel dropped because the ring was full.
    Lost(u64),
}

/// Online CPUs, from `/sys/devices/system/cpu/online` (`0-3,5`).
pub fn online_cpus() -> Result<Vec<usize>, PerfError> {
    let text =
        std::fs::read_to_string("/sys/devices/system/cpu/online").map_err(PerfError::Cpus)?;
    Ok(parse_cpu_list(&text))
}

fn parse_cpu_list(text: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
                    cpus.extend(a..=b);
                }
            }
            None => cpus.extend(part.parse::<usize>().ok()),
        }
    }
    cpus
}

fn paranoid() -> String {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .map(|text| text.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// One CPU's event and ring.
struct Ring {
    cpu: usize,
    /// Kept open for as long as the ring is mapped: closing it stops the event.
    fd: OwnedFd,
    base: *mut u8,
    mapped: usize,
    data_offset: usize,
    data_size: usize,
}

// SAFETY: the mapping is owned by this value and only read through `&mut self`.
unsafe impl Send for Ring {}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: `base` and `mapped` are exactly what mmap returned; nothing else uses them.
        unsafe {
            libc::munmap(self.base.cast(), self.mapped);
        }
    }
}

/// Sampling events on every online CPU.
pub struct PerfEvents {
    rings: Vec<Ring>,
    frequency: u64,
    scratch: Vec<u8>,
    /// The BPF program run on every sample, if any (ebpf.rs).
    bpf_program: Option<OwnedFd>,
}

impl PerfEvents {
    /// Opens a `cpu-clock` event on every online CPU, for every process, with kernel and
    /// user call chains and the records that track mappings, to sample at `frequency` Hz
    /// once [`PerfEvents::enable`]d.
    ///
    /// They open disabled: loading the BPF program and the rest of the agent's start take
    /// up to a second (more in a debug build), and rings sampling meanwhile with no one to
    /// drain them filled and dropped the first second of every program (34 samples lost at
    /// each start, all of them then).
    pub fn open(frequency: u64) -> Result<PerfEvents, PerfError> {
        let mut events = PerfEvents {
            rings: Vec::new(),
            frequency,
            scratch: Vec::new(),
            bpf_program: None,
        };
        for cpu in online_cpus()? {
            events.open_cpu(cpu, false)?;
        }
        Ok(events)
    }

    /// Starts sampling on the CPUs opened by [`PerfEvents::open`]: called by the thread
    /// that drains the rings, as it starts to.
    pub fn enable(&self) -> io::Result<()> {
        for ring in &self.rings {
            // SAFETY: ENABLE takes no argument, on an open perf event descriptor.
            if unsafe { sys::ioctls::ENABLE(ring.fd.as_raw_fd(), 0) } < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// Opens CPUs that came online since; returns how many.
    pub fn add_new_cpus(&mut self) -> Result<usize, PerfError> {
        let mut added = 0;
        for cpu in online_cpus()? {
            if !self.rings.iter().any(|ring| ring.cpu == cpu) {
                self.open_cpu(cpu, true)?;
                added += 1;
            }
        }
        Ok(added)
    }

    pub fn cpus(&self) -> usize {
        self.rings.len()
    }

    /// Runs a BPF program on every sample, of these CPUs and of those that come online.
    pub fn attach_bpf(&mut self, program: OwnedFd) -> io::Result<()> {
        for ring in &self.rings {
            crate::ebpf::attach(ring.fd.as_fd(), program.as_fd())?;
        }
        self.bpf_program = Some(program);
        Ok(())
    }

    fn open_cpu(&mut self, cpu: usize, enabled: bool) -> Result<(), PerfError> {
        let mut attr = b::perf_event_attr {
            type_: b::PERF_TYPE_SOFTWARE,
            size: std::mem::size_of::<b::perf_event_attr>() as u32,
            config: u64::from(b::PERF_COUNT_SW_CPU_CLOCK),
            sample_type: u64::from(
                b::PERF_SAMPLE_IP
                    | b::PERF_SAMPLE_TID
                    | b::PERF_SAMPLE_TIME
                    | b::PERF_SAMPLE_PERIOD
                    | b::PERF_SAMPLE_CALLCHAIN,
            ),
            ..Default::default()
        };
        #[cfg(target_arch = "x86_64")]
        {
            attr.sample_type |= u64::from(b::PERF_SAMPLE_REGS_USER | b::PERF_SAMPLE_STACK_USER);
            attr.sample_regs_user = USER_REGS;
            attr.sample_stack_user = STACK_BYTES;
        }
        attr.__bindgen_anon_1.sample_freq = self.frequency;
        attr.set_freq(1);
        attr.set_disabled(u64::from(!enabled));
        attr.set_mmap(1);
        attr.set_mmap2(1);
        attr.set_comm(1);
        attr.set_comm_exec(1);
        attr.set_task(1);
        attr.set_build_id(1);
        // Every record carries (pid, tid, time) at its end, so records from different CPUs
        // can be put back in order: a child's FORK on one CPU must come before its exec's
        // COMM and MMAP2 on another, or the new program would look like its parent.
        attr.set_sample_id_all(1);
        // The clock `bpf_ktime_get_ns` reads, so a sample and the interpreter stack read
        // for it compare.
        attr.set_use_clockid(1);
        attr.clockid = libc::CLOCK_MONOTONIC;
        // SAFETY: `attr` is a valid, initialised perf_event_attr of the size it declares.
        let fd = unsafe {
            sys::perf_event_open(&mut attr, -1, cpu as i32, -1, b::PERF_FLAG_FD_CLOEXEC as _)
        };
        if fd < 0 {
            let err = io::Error::last_os_error();
            return Err(match err.raw_os_error() {
                Some(libc::EACCES) | Some(libc::EPERM) => PerfError::Permission(format!(
                    "perf_event_open was refused ({err}): profiling every process needs root, \
                     or CAP_PERFMON (CAP_SYS_ADMIN before Linux 5.8), or \
                     kernel.perf_event_paranoid at -1 (it is {}): \
                     run as root, `setcap cap_perfmon,cap_sys_ptrace,cap_syslog+ep $(which kiln)`, \
                     or `sysctl kernel.perf_event_paranoid=-1`",
                    paranoid()
                )),
                _ => PerfError::Open { cpu, source: err },
            });
        }
        // SAFETY: perf_event_open returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let page = page_size();
        let pages = ring_pages(self.frequency, page);
        let mapped = page * (pages + 1);
        // SAFETY: a shared read-write mapping of the event's ring, as perf_event_open(2)
        // documents; the result is checked before use.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(PerfError::Mmap {
                cpu,
                source: io::Error::last_os_error(),
            });
        }
        let base = base.cast::<u8>();
        // SAFETY: the first page of the mapping is the kernel's perf_event_mmap_page.
        let header = unsafe { &*(base as *const b::perf_event_mmap_page) };
        let (data_offset, data_size) = if header.data_size != 0 {
            (header.data_offset as usize, header.data_size as usize)
        } else {
            (page, page * pages)
        };
        if let Some(program) = &self.bpf_program {
            crate::ebpf::attach(fd.as_fd(), program.as_fd())
                .map_err(|source| PerfError::Open { cpu, source })?;
        }
        self.rings.push(Ring {
            cpu,
            fd,
            base,
            mapped,
            data_offset,
            data_size,
        });
        Ok(())
    }

    /// Reads every record waiting in every ring, in the order they happened.
    pub fn drain(&mut self) -> Vec<Record> {
        self.drain_with(Vec::new())
    }

    /// [`PerfEvents::drain`], with records read elsewhere put in time order among them.
    pub fn drain_with(&mut self, mut records: Vec<(u64, Record)>) -> Vec<Record> {
        for ring in &mut self.rings {
            drain_ring(ring, &mut self.scratch, &mut |time, record| {
                records.push((time, record))
            });
        }
        records.sort_by_key(|(time, _)| *time);
        records.into_iter().map(|(_, record)| record).collect()
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096)
}

fn drain_ring(ring: &mut Ring, scratch: &mut Vec<u8>, sink: &mut impl FnMut(u64, Record)) {
    let header = ring.base as *mut b::perf_event_mmap_page;
    // SAFETY: `header` points at the mapped control page; data_head is written by the
    // kernel, so it is read volatile and fenced before the data it covers is read.
    let head = unsafe { std::ptr::read_volatile(&(*header).data_head) };
    fence(Ordering::Acquire);
    // SAFETY: as above; data_tail is ours to read and write.
    let mut tail = unsafe { std::ptr::read_volatile(&(*header).data_tail) };
    // SAFETY: the data area lies within the mapping, at the offset the kernel gave.
    let data =
        unsafe { std::slice::from_raw_parts(ring.base.add(ring.data_offset), ring.data_size) };
    while tail < head {
        let at = (tail % ring.data_size as u64) as usize;
        let mut size_bytes = [0u8; 8];
        copy_wrapped(data, at, &mut size_bytes);
        let size = usize::from(u16::from_ne_bytes([size_bytes[6], size_bytes[7]]));
        if size < 8 || (head - tail) < size as u64 {
            break; // a torn or corrupt header: stop, and skip what is left
        }
        scratch.resize(size, 0);
        copy_wrapped(data, at, scratch);
        if let Some((time, record)) = parse_timed(scratch) {
            sink(time, record);
        }
        tail += size as u64;
    }
    fence(Ordering::Release);
    // SAFETY: publishing the new tail tells the kernel the space is free again.
    unsafe { std::ptr::write_volatile(&mut (*header).data_tail, head.max(tail)) };
}

/// Copies `out.len()` bytes from the ring starting at `at`, wrapping at its end.
fn copy_wrapped(data: &[u8], at: usize, out: &mut [u8]) {
    let first = (data.len() - at).min(out.len());
    out[..first].copy_from_slice(&data[at..at + first]);
    let rest = out.len() - first;
    out[first..].copy_from_slice(&data[..rest]);
}

/// A little reader over one record's bytes; every read is bounds-checked.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn u32(&mut self) -> Option<u32> {
        let bytes = self.bytes.get(self.at..self.at + 4)?;
        self.at += 4;
        Some(u32::from_ne_bytes(bytes.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        let bytes = self.bytes.get(self.at..self.at + 8)?;
        self.at += 8;
        Some(u64::from_ne_bytes(bytes.try_into().ok()?))
    }

    fn take(&mut self, len: usize) -> Option<&'a [u8]> {
        let bytes = self.bytes.get(self.at..self.at.checked_add(len)?)?;
        self.at += len;
        Some(bytes)
    }

    /// A NUL-terminated string padded to 8 bytes, up to the end of the record.
    fn string(&mut self) -> String {
        let rest = self.bytes.get(self.at..).unwrap_or_default();
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        self.at = self.bytes.len();
        String::from_utf8_lossy(&rest[..end]).into_owned()
    }
}

/// Decodes one record and its time: a sample's own, or for any other record the time of
/// the `sample_id` trailer (pid, tid, time) that `sample_id_all` appends.
pub fn parse_timed(bytes: &[u8]) -> Option<(u64, Record)> {
    let kind = u32::from_ne_bytes(bytes.get(..4)?.try_into().ok()?);
    let time = if kind == b::PERF_RECORD_SAMPLE {
        u64::from_ne_bytes(bytes.get(24..32)?.try_into().ok()?)
    } else {
        u64::from_ne_bytes(bytes.get(bytes.len().checked_sub(8)?..)?.try_into().ok()?)
    };
    let body = if kind == b::PERF_RECORD_SAMPLE {
        bytes
    } else {
        bytes.get(..bytes.len().checked_sub(16)?)?
    };
    Some((time, parse_record(body)?))
}

/// A sample's user registers (ip, sp, bp) and its copy of the user stack.
type UserContext = (Option<[u64; 3]>, Box<[u8]>);

/// The user registers and stack copy after a sample's call chain, where this build asks
/// for them; anything missing or cut gives none, and the call chain is still used.
fn user_context(cursor: &mut Cursor<'_>) -> UserContext {
    #[cfg(target_arch = "x86_64")]
    {
        let mut read = || -> Option<UserContext> {
            let abi = cursor.u64()?;
            let regs = if abi == u64::from(b::PERF_SAMPLE_REGS_ABI_NONE) {
                None
            } else {
                let (bp, sp, ip) = (cursor.u64()?, cursor.u64()?, cursor.u64()?);
                Some([ip, sp, bp])
            };
            let size = usize::try_from(cursor.u64()?).ok()?;
            if size == 0 {
                return Some((regs, Box::default()));
            }
            let data = cursor.take(size)?;
            let valid = usize::try_from(cursor.u64()?).ok()?.min(size);
            Some((regs, data[..valid].into()))
        };
        read().unwrap_or_default()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = cursor;
        (None, Box::default())
    }
}

/// Decodes one record (header included, any `sample_id` trailer removed); `None` for
/// types the agent does not use or a record too short for its type.
pub fn parse_record(bytes: &[u8]) -> Option<Record> {
    let mut cursor = Cursor { bytes, at: 0 };
    let kind = cursor.u32()?;
    let misc = u32::from(u16::from_ne_bytes(cursor.take(2)?.try_into().ok()?));
    cursor.take(2)?;
    match kind {
        b::PERF_RECORD_SAMPLE => {
            let _ip = cursor.u64()?;
            let pid = cursor.u32()?;
            let tid = cursor.u32()?;
            let time = cursor.u64()?;
            let _period = cursor.u64()?;
            let count = usize::try_from(cursor.u64()?).ok()?;
            if count > 4096 {
                return None;
            }
            let (mut kernel, mut user) = (Vec::new(), Vec::new());
            let mut in_kernel = true;
            for _ in 0..count {
                let ip = cursor.u64()?;
                if ip >= b::PERF_CONTEXT_MAX {
                    if ip == b::PERF_CONTEXT_KERNEL {
                        in_kernel = true;
                    } else if ip == b::PERF_CONTEXT_USER {
                        in_kernel = false;
                    }
                    continue;
                }
                if in_kernel {
                    kernel.push(ip);
                } else {
                    user.push(ip);
                }
            }
            let (regs, stack) = user_context(&mut cursor);
            Some(Record::Sample {
                pid,
                tid,
                kernel,
                user,
                depth: count,
                regs,
                stack,
                time,
            })
        }
        b::PERF_RECORD_MMAP | b::PERF_RECORD_MMAP2 => {
            let pid = cursor.u32()?;
            let _tid = cursor.u32()?;
            let (start, len, pgoff) = (cursor.u64()?, cursor.u64()?, cursor.u64()?);
            let mut build_id = None;
            if kind == b::PERF_RECORD_MMAP2 {
                // maj, min, ino, ino_generation; or, with the flag, the build id.
                let identity = cursor.take(24)?;
                if misc & b::PERF_RECORD_MISC_MMAP_BUILD_ID != 0 {
                    let size = usize::from(identity[0]).min(20);
                    build_id = Some(identity[4..4 + size].to_vec());
                }
                let _prot_and_flags = cursor.take(8)?;
            }
            let path = cursor.string();
            Some(Record::Mmap {
                pid,
                start,
                len,
                pgoff,
                path,
                build_id,
            })
        }
        b::PERF_RECORD_COMM => {
            let pid = cursor.u32()?;
            let tid = cursor.u32()?;
            let comm = cursor.string();
            Some(Record::Comm {
                pid,
                tid,
                comm,
                exec: misc & b::PERF_RECORD_MISC_COMM_EXEC != 0,
            })
        }
        b::PERF_RECORD_FORK => {
            let pid = cursor.u32()?;
            let ppid = cursor.u32()?;
            let tid = cursor.u32()?;
            Some(Record::Fork { pid, ppid, tid })
        }
        b::PERF_RECORD_EXIT => {
            let pid = cursor.u32()?;
            let _ppid = cursor.u32()?;
            let tid = cursor.u32()?;
            Some(Record::Exit { pid, tid })
        }
        b::PERF_RECORD_LOST => {
            let _id = cursor.u64()?;
            Some(Record::Lost(cursor.u64()?))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: u32, misc: u16, body: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&kind.to_ne_bytes());
        bytes.extend_from_slice(&misc.to_ne_bytes());
        bytes.extend_from_slice(&((body.len() + 8) as u16).to_ne_bytes());
        bytes.extend_from_slice(body);
        bytes
    }

    #[test]
    fn samples_split_kernel_and_user_frames() {
        let mut body = Vec::new();
        body.extend_from_slice(&0x1000u64.to_ne_bytes()); // ip
        body.extend_from_slice(&7u32.to_ne_bytes()); // pid
        body.extend_from_slice(&8u32.to_ne_bytes()); // tid
        body.extend_from_slice(&1u64.to_ne_bytes()); // time
        body.extend_from_slice(&10u64.to_ne_bytes()); // period
        let chain = [
            b::PERF_CONTEXT_KERNEL,
            0xffff_0001,
            0xffff_0002,
            b::PERF_CONTEXT_USER,
            0x10,
            0x20,
        ];
        body.extend_from_slice(&(chain.len() as u64).to_ne_bytes());
        for ip in chain {
            body.extend_from_slice(&ip.to_ne_bytes());
        }
        // Without the user context (or on other architectures): the chain alone.
        let parsed = parse_record(&record(b::PERF_RECORD_SAMPLE, 0, &body)).unwrap();
        assert_eq!(
            parsed,
            Record::Sample {
                pid: 7,
                tid: 8,
                kernel: vec![0xffff_0001, 0xffff_0002],
                user: vec![0x10, 0x20],
                depth: 6,
                regs: None,
                stack: Box::default(),
                time: 1,
            }
        );
        // With it: registers BP, SP, IP in perf_regs order, 16 bytes of stack of which the
        // kernel could fill 8.
        body.extend_from_slice(&u64::from(b::PERF_SAMPLE_REGS_ABI_64).to_ne_bytes());
        for reg in [0xb0u64, 0x5000, 0x1000] {
            body.extend_from_slice(&reg.to_ne_bytes());
        }
        body.extend_from_slice(&16u64.to_ne_bytes());
        body.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0, 0]);
        body.extend_from_slice(&8u64.to_ne_bytes());
        let parsed = parse_record(&record(b::PERF_RECORD_SAMPLE, 0, &body)).unwrap();
        let Record::Sample { regs, stack, .. } = parsed else {
            panic!("not a sample: {parsed:?}");
        };
        if cfg!(target_arch = "x86_64") {
            assert_eq!(regs, Some([0x1000, 0x5000, 0xb0]));
            assert_eq!(&stack[..], &[1, 2, 3, 4, 5, 6, 7, 8]);
        }
        // Truncated: no record, no panic.
        let bytes = record(b::PERF_RECORD_SAMPLE, 0, &body);
        for len in 0..bytes.len() {
            let _ = parse_record(&bytes[..len]);
        }
    }

    #[test]
    fn mmap2_records_carry_the_build_id() {
        let mut body = Vec::new();
        body.extend_from_slice(&5u32.to_ne_bytes());
        body.extend_from_slice(&5u32.to_ne_bytes());
        body.extend_from_slice(&0x40_0000u64.to_ne_bytes());
        body.extend_from_slice(&0x1000u64.to_ne_bytes());
        body.extend_from_slice(&0x2000u64.to_ne_bytes());
        let mut identity = [0u8; 24];
        identity[0] = 3;
        identity[4..7].copy_from_slice(&[0xab, 0xcd, 0xef]);
        body.extend_from_slice(&identity);
        body.extend_from_slice(&5u32.to_ne_bytes());
        body.extend_from_slice(&2u32.to_ne_bytes());
        body.extend_from_slice(b"/usr/bin/app\0\0\0\0");
        let parsed = parse_record(&record(
            b::PERF_RECORD_MMAP2,
            b::PERF_RECORD_MISC_MMAP_BUILD_ID as u16,
            &body,
        ))
        .unwrap();
        assert_eq!(
            parsed,
            Record::Mmap {
                pid: 5,
                start: 0x40_0000,
                len: 0x1000,
                pgoff: 0x2000,
                path: "/usr/bin/app".into(),
                build_id: Some(vec![0xab, 0xcd, 0xef]),
            }
        );
    }

    #[test]
    fn records_carry_their_time_in_the_sample_id_trailer() {
        let mut body = Vec::new();
        body.extend_from_slice(&9u32.to_ne_bytes());
        body.extend_from_slice(&9u32.to_ne_bytes());
        body.extend_from_slice(b"burner\0\0");
        body.extend_from_slice(&9u32.to_ne_bytes()); // sample_id: pid, tid, time
        body.extend_from_slice(&9u32.to_ne_bytes());
        body.extend_from_slice(&1234u64.to_ne_bytes());
        let bytes = record(
            b::PERF_RECORD_COMM,
            b::PERF_RECORD_MISC_COMM_EXEC as u16,
            &body,
        );
        let (time, parsed) = parse_timed(&bytes).unwrap();
        assert_eq!(time, 1234);
        assert_eq!(
            parsed,
            Record::Comm {
                pid: 9,
                tid: 9,
                comm: "burner".into(),
                exec: true
            }
        );
        for len in 0..bytes.len() {
            let _ = parse_timed(&bytes[..len]);
        }
    }

    #[test]
    fn cpu_lists_parse() {
        assert_eq!(parse_cpu_list("0-3,5\n"), vec![0, 1, 2, 3, 5]);
        assert_eq!(parse_cpu_list("0\n"), vec![0]);
    }
}
