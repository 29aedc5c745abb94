//! Kiln's host agent: profiles every process on a Linux host, with no change to any of
//! them, and reports one self-contained pprof per process per interval.
//!
//! Data flow:
//!
//! ```text
//!  perf_event_open(cpu-clock, every CPU) ──▶ ring buffers ──▶ records (perf.rs)
//!      samples ──▶ stack counts per process instance (this file)
//!      mmap2/comm/fork/exit ──▶ process table: who is which program (procs.rs)
//!  every interval: symbolize (blazesym) and write one pprof per process (report.rs)
//!      ──▶ a sink: the push API, or the server's own ingester with `kiln server --agent`
//! ```
//!
//! One thread reads the rings every 100 ms; another takes the samples in and writes the
//! reports, one series at a time between batches of samples ([`Collector::run`]). A
//! sample's interpreted frames are read from the process as it is taken in, so it must
//! not wait behind a whole report: on a loaded 2-core host a report took a second, and
//! samples waited up to 4 s; Node.js's functions moved by its collector meanwhile went
//! unnamed (63-70 % of a zlib-heavy program's stacks named, against 93 % now).
//!
//! User stacks come from the kernel's call chain where the program keeps frame pointers
//! (Go, and programs built with `-fno-omit-frame-pointer`, as Fedora and Ubuntu build
//! their packages), and from a DWARF unwind of a copy of the user stack otherwise
//! (unwind.rs).
//!
//! Memory is bounded by one budget ([`AgentConfig::memory_limit`]): unwind tables get an
//! eighth, blazesym's parsed files three eighths (it is started anew past that, and a
//! file whose DWARF alone passes an eighth is symbolized from its symbol table: names, no
//! lines; see [`report::Symbols`]), interpreted frames' names a sixteenth, the BPF maps,
//! which pin kernel memory whether used or not, an eighth ([`ebpf::MapSizes`]), and
//! `kiln agent` gives a quarter to reports waiting for the server.

pub mod ebpf;
pub mod interp;
pub mod offcpu;
pub mod perf;
pub mod procs;
pub mod report;
pub mod unwind;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kiln_model::time::now_nanos;
pub use perf::PerfError;
use perf::{PerfEvents, Record};
use procs::{Instance, Mapping, ProcessTable};
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
pub use report::Report;
use report::{HostInfo, ProfileWriter, Stack, Symbols};

/// How the agent samples and reports.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Samples per second per CPU.
    pub frequency: u64,
    /// Time covered by one report.
    pub interval: Duration,
    /// Prometheus relabeling over each process's labels and `__meta_process_pid`,
    /// `__meta_process_comm`, `__meta_process_exe`, `__meta_process_cgroup` and
    /// `__meta_process_env_<NAME>`, and its container's `meta` ([`Containers`]); a
    /// dropped process is not reported.
    pub relabel_configs: Vec<kiln_model::relabel::RelabelConfig>,
    /// Environment variables read for `__meta_process_env_<NAME>`: only these, because a
    /// process's environment can hold secrets.
    pub env_allowlist: Vec<String>,
    /// The budget of the agent's caches (see the crate's doc), in bytes.
    pub memory_limit: usize,
    /// Count the samples of frame-pointer processes in the kernel (ebpf.rs). Where the
    /// program cannot be loaded the agent says why and samples without it.
    pub ebpf: bool,
    /// Profile time off the CPU, sampling this share of the switches of threads that
    /// block (offcpu.rs); `None`: off. Needs eBPF.
    pub off_cpu: Option<f64>,
    /// Name interpreted programs' functions from the interpreter's memory (interp/):
    /// CPython's and Ruby's need eBPF, Node.js's do not. Off: native frames only, and
    /// JIT code from perf maps.
    pub interpreters: bool,
    /// Name the frames of files on the host (ELF symbols, DWARF, a Go binary's
    /// `.gopclntab`). Off: they go out as build id and file offset only, named on the
    /// server from uploaded or debuginfod debug files (docs/symbolization.md), which takes
    /// the parsing of every binary's symbols off the host. Kernel frames, JIT code from
    /// perf maps and interpreted functions are named either way.
    pub symbolize: bool,
    /// Who the containers are (`--kubernetes`: their pods); `None`: processes keep the
    /// agent's own labels.
    pub containers: Option<Arc<dyn Containers>>,
}

/// What an orchestrator knows of the container a process runs in. The agent asks, per
/// process and report, and stays free of any cluster client: kiln-node wires kiln-kube's
/// pods of this node in.
pub trait Containers: Send + Sync + std::fmt::Debug {
    /// For a process with this container id (from its cgroup path) and cgroup path; `None`
    /// when it is in no container known.
    fn labels(&self, container_id: Option<&str>, cgroup: &str) -> Option<ContainerLabels>;
}

/// A container's labels for its processes' profiles.
#[derive(Debug, Clone, Default)]
pub struct ContainerLabels {
    /// Labels of the profile; they replace the agent's own of the same name
    /// (`service_name`).
    pub labels: Arc<[(String, String)]>,
    /// Labels only relabeling sees (`__meta_kubernetes_*`).
    pub meta: Arc<[(String, String)]>,
}

/// `--memory-limit`'s default: 128 MiB.
pub const DEFAULT_MEMORY_LIMIT: usize = 128 << 20;

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            frequency: 19,
            interval: Duration::from_secs(10),
            relabel_configs: Vec::new(),
            env_allowlist: Vec::new(),
            memory_limit: DEFAULT_MEMORY_LIMIT,
            ebpf: true,
            off_cpu: None,
            interpreters: true,
            symbolize: true,
            containers: None,
        }
    }
}

/// The labels a report goes out with: the process's own, then the relabeling rules over
/// them, its `__meta_process_*` labels and its container's `meta`; `None` when a rule
/// dropped it.
fn relabeled(
    process: &procs::Process,
    mut labels: Vec<(String, String)>,
    meta: &[(String, String)],
    rules: &[kiln_model::relabel::RelabelConfig],
) -> Option<Vec<(String, String)>> {
    if rules.is_empty() {
        return Some(labels);
    }
    let mut set: kiln_model::relabel::LabelSet = labels.drain(..).collect();
    set.extend(meta.iter().cloned());
    set.insert("__meta_process_pid".into(), process.pid.to_string());
    set.insert("__meta_process_comm".into(), process.comm.clone());
    set.insert("__meta_process_exe".into(), process.exe.clone());
    set.insert("__meta_process_cgroup".into(), process.cgroup.clone());
    for (name, value) in &process.env {
        set.insert(format!("__meta_process_env_{name}"), value.clone());
    }
    let set = kiln_model::relabel::relabel(&set, rules)?;
    Some(
        set.into_iter()
            .filter(|(name, value)| {
                (!name.starts_with("__") || name == "__name__") && !value.is_empty()
            })
            .collect(),
    )
}

/// The binary a process instance runs, as the per-binary counters name it.
fn binary_name(table: &ProcessTable, instance: Instance) -> &str {
    table
        .instance(instance)
        .map(|process| process.exe.as_str())
        .filter(|exe| !exe.is_empty())
        .unwrap_or("unknown")
}

/// Looks for an interpreter in a sampled process (interp/), and has the BPF program read
/// its stacks once one is found, for runtimes read in the kernel.
fn examine_interpreter(
    enabled: bool,
    ebpf: &mut Option<ebpf::Ebpf>,
    interp: &mut interp::Interpreters,
    process: &procs::Process,
) {
    if !enabled {
        return;
    }
    if let interp::Found::Register(layout) = interp.examine(process, ebpf.is_some()) {
        if let Some(bpf) = ebpf {
            if let Err(err) = bpf.interpret(process.pid, process.instance, layout) {
                tracing::debug!(pid = process.pid, error = %err, "cannot read this interpreter's stacks");
            }
        }
    }
}

/// A process and its stack counts of one interval.
type ProcessStacks<'a> = (&'a procs::Process, &'a HashMap<Stack, u64>);

/// The processes of each series, by its labels, for a profile named `name`: processes that
/// relabeling left alike (a `labeldrop` of `pid`, say) are one service's, and go out as
/// one profile.
fn series<'a>(
    table: &'a ProcessTable,
    host: &HostInfo,
    config: &AgentConfig,
    name: &str,
    stacks: &'a HashMap<Instance, HashMap<Stack, u64>>,
) -> HashMap<Vec<(String, String)>, Vec<ProcessStacks<'a>>> {
    let mut series: HashMap<Vec<(String, String)>, Vec<ProcessStacks<'a>>> = HashMap::new();
    for (instance, counts) in stacks {
        let Some(process) = table.instance(*instance) else {
            continue;
        };
        let mut labels = report::process_labels(process, host);
        for (label, value) in &mut labels {
            if label == "__name__" {
                *value = name.to_string();
            }
        }
        let container = config
            .containers
            .as_ref()
            .filter(|_| !process.cgroup.is_empty())
            .and_then(|containers| {
                let id = report::container_id(&process.cgroup);
                containers.labels(id.as_deref(), &process.cgroup)
            });
        for (name, value) in container.iter().flat_map(|c| c.labels.iter()) {
            match labels.iter_mut().find(|(label, _)| label == name) {
                Some((_, old)) => old.clone_from(value),
                None => labels.push((name.clone(), value.clone())),
            }
        }
        let meta = container.as_ref().map_or(&[][..], |c| &c.meta[..]);
        let Some(mut labels) = relabeled(process, labels, meta, &config.relabel_configs) else {
            continue;
        };
        labels.sort();
        series.entry(labels).or_default().push((process, counts));
    }
    series
}

/// Counters of the agent's own work.
#[derive(Debug, Default)]
pub struct AgentStats {
    pub samples: AtomicU64,
    /// Of those, the samples counted in the kernel by the BPF program.
    pub kernel_counted: AtomicU64,
    pub lost: AtomicU64,
    /// Sampled switches whose off-CPU stacks the kernel's ring could not hold (their time
    /// is carried by the next stack sent: offcpu.rs), and those past the table of awaited
    /// returns (not counted at all).
    pub offcpu_unsent: AtomicU64,
    pub offcpu_dropped: AtomicU64,
    pub reports: AtomicU64,
    pub processes: AtomicU64,
    /// 1 when the BPF program runs on the samples.
    pub ebpf_active: AtomicU64,
    /// 1 once the perf events sample: the agent's start (the BPF program loaded, the
    /// rings mapped) is over and their reader runs.
    pub sampling: AtomicU64,
    /// Bytes held by the unwind-table and symbolizer caches.
    pub cache_bytes: AtomicU64,
    /// Bytes of kernel memory the BPF program's maps pin (their `memlock`).
    pub bpf_map_bytes: AtomicU64,
    /// Times a cache was emptied to stay within the memory budget.
    pub cache_evictions: AtomicU64,
    /// Per binary: how its user stacks were walked, stacks sampled and stacks cut short.
    pub binaries: std::sync::Mutex<HashMap<String, BinaryStats>>,
    /// Per binary, runtime and outcome: samples of interpreters, and whether their
    /// interpreted frames were named (interp/).
    pub interpreters: interp::Outcomes,
}

/// What the agent knows of one binary's stacks.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BinaryStats {
    pub method: &'static str,
    pub stacks: u64,
    pub truncated: u64,
}

/// Binaries tracked in [`AgentStats::binaries`]; past it, new ones count as `other`.
const MAX_BINARIES: usize = 1000;

/// The agent's counters for `/metrics`, read at each scrape: the values live here, so the
/// registry sees them through this collector (the library writes the exposition and
/// escapes the label values).
impl prometheus_client::collector::Collector for AgentStats {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let load = |value: &AtomicU64| value.load(Ordering::Relaxed);
        for (name, help, value) in [
            ("kiln_agent_samples", "Samples taken", load(&self.samples)),
            (
                "kiln_agent_samples_in_kernel",
                "Samples counted in the kernel by the BPF program (--ebpf), not read from a ring",
                load(&self.kernel_counted),
            ),
            (
                "kiln_agent_samples_lost",
                "Samples the kernel dropped because a ring buffer was full",
                load(&self.lost),
            ),
            (
                "kiln_agent_offcpu_switches_unsent",
                "Sampled switches whose stacks the kernel's ring could not hold; their time is carried, weighted, by the next stack sent",
                load(&self.offcpu_unsent),
            ),
            (
                "kiln_agent_offcpu_switches_dropped",
                "Sampled switches not counted: the table of threads awaited back was full",
                load(&self.offcpu_dropped),
            ),
            ("kiln_agent_reports", "Process profiles written", load(&self.reports)),
            (
                "kiln_agent_cache_evictions",
                "Cache entries dropped to stay within --memory-limit; they are recomputed when needed",
                load(&self.cache_evictions),
            ),
        ] {
            encode_value(&mut encoder, name, help, MetricType::Counter, value)?;
        }
        for (name, help, value) in [
            (
                "kiln_agent_processes",
                "Processes the agent tracks",
                load(&self.processes),
            ),
            (
                "kiln_agent_sampling",
                "1 once the agent samples: its start is over",
                load(&self.sampling),
            ),
            (
                "kiln_agent_ebpf_active",
                "1 when samples of frame-pointer programs are counted in the kernel",
                load(&self.ebpf_active),
            ),
            (
                "kiln_agent_cache_bytes",
                "Bytes held by the unwind-table and symbol caches",
                load(&self.cache_bytes),
            ),
            (
                "kiln_agent_bpf_map_bytes",
                "Bytes of kernel memory the BPF maps pin, within an eighth of --memory-limit",
                load(&self.bpf_map_bytes),
            ),
        ] {
            encode_value(&mut encoder, name, help, MetricType::Gauge, value)?;
        }
        let Ok(binaries) = self.binaries.lock() else {
            return Ok(());
        };
        let mut names: Vec<&String> = binaries.keys().collect();
        names.sort();
        let mut stacks = encoder.encode_descriptor(
            "kiln_agent_stacks",
            "Stacks sampled per binary, by how the user stack was walked",
            None,
            MetricType::Counter,
        )?;
        for name in &names {
            let stats = &binaries[*name];
            let labels = [("binary", name.as_str()), ("method", stats.method)];
            ConstCounter::new(stats.stacks).encode(stacks.encode_family(&labels)?)?;
        }
        let mut truncated = encoder.encode_descriptor(
            "kiln_agent_stacks_truncated",
            "Stacks cut short: at the kernel's perf_event_max_stack, or past the copied user stack",
            None,
            MetricType::Counter,
        )?;
        for name in &names {
            let labels = [("binary", name.as_str())];
            ConstCounter::new(binaries[*name].truncated)
                .encode(truncated.encode_family(&labels)?)?;
        }
        drop(binaries);
        let Ok(outcomes) = self.interpreters.lock() else {
            return Ok(());
        };
        let mut rows: Vec<(&str, &str, &str, u64)> = outcomes
            .iter()
            .flat_map(|(binary, (runtime, counts))| {
                counts.iter().map(move |(outcome, count)| {
                    (binary.as_str(), *runtime, outcome.as_str(), *count)
                })
            })
            .collect();
        rows.sort();
        let mut family = encoder.encode_descriptor(
            "kiln_agent_interpreter_stacks",
            "Samples of interpreters (Python, Ruby), per binary, by outcome: named, or why the stack kept native frames only",
            None,
            MetricType::Counter,
        )?;
        for (binary, runtime, outcome, count) in rows {
            let labels = [
                ("binary", binary),
                ("runtime", runtime),
                ("outcome", outcome),
            ];
            ConstCounter::new(count).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// One unlabelled counter or gauge, for collectors whose values live elsewhere. A
/// counter's name is given without `_total`: the library adds it.
pub fn encode_value(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    value: u64,
) -> Result<(), std::fmt::Error> {
    let metric = encoder.encode_descriptor(name, help, None, kind)?;
    match kind {
        MetricType::Counter => ConstCounter::new(value).encode(metric),
        _ => ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX)).encode(metric),
    }
}

/// A collector running on its own thread (see [`Collector::spawn`]).
pub struct RunningCollector {
    pub thread: std::thread::JoinHandle<()>,
    pub cpus: usize,
    pub stats: Arc<AgentStats>,
}

/// Samples every CPU and aggregates stacks per process until the next report.
pub struct Collector {
    config: AgentConfig,
    /// Moved to the reading thread by [`Collector::run`].
    events: Option<PerfEvents>,
    cpus: usize,
    table: ProcessTable,
    stacks: HashMap<Instance, HashMap<Stack, u64>>,
    symbols: Symbols,
    unwinding: unwind::Unwinding,
    ebpf: Option<ebpf::Ebpf>,
    /// Interpreters found, and their stacks read in the kernel (interp/).
    interp: interp::Interpreters,
    /// Stacks off the CPU, with `--off-cpu`.
    offcpu: Option<offcpu::OffCpu>,
    host: HostInfo,
    stats: Arc<AgentStats>,
    interval_start: i64,
    /// The kernel's `perf_event_max_stack`: a call chain this long was cut.
    max_stack: usize,
}

/// A series of a report not written yet: which stacks ([`ON_CPU`] or [`OFF_CPU`]), its
/// labels, its processes.
type SeriesToWrite = (usize, Vec<(String, String)>, Vec<Instance>);

/// Indexes of [`PendingReport`]'s stacks and kernel names.
const ON_CPU: usize = 0;
const OFF_CPU: usize = 1;

/// An interval's reports, written one series at a time ([`Collector::begin_report`]).
struct PendingReport {
    start: i64,
    end: i64,
    /// On the CPU, then off it.
    stacks: [HashMap<Instance, HashMap<Stack, u64>>; 2],
    kernel: [HashMap<u64, report::Resolved>; 2],
    /// The interval's interpreted frames, when the collector's were started anew.
    frames: Option<interp::Frames>,
    queue: VecDeque<SeriesToWrite>,
    reports: Vec<Report>,
}

impl Collector {
    /// Opens the perf events; fails at once, with what to change, when not permitted.
    pub fn open(config: AgentConfig) -> Result<Collector, PerfError> {
        for rule in &config.relabel_configs {
            rule.validate().map_err(PerfError::Config)?;
        }
        let mut events = PerfEvents::open(config.frequency.clamp(1, 1000))?;
        raise_open_files_limit();
        let ebpf = if config.ebpf {
            match ebpf::Ebpf::load(ebpf::MapSizes::within(config.memory_limit / 8)).and_then(
                |bpf| {
                    let program = bpf
                        .program()
                        .try_clone_to_owned()
                        .map_err(ebpf::EbpfError::Attach)?;
                    events
                        .attach_bpf(program)
                        .map_err(ebpf::EbpfError::Attach)?;
                    Ok(bpf)
                },
            ) {
                Ok(bpf) => Some(bpf),
                Err(err) => {
                    tracing::warn!(error = %err, "eBPF unavailable; sampling without it, with the same output");
                    None
                }
            }
        } else {
            None
        };
        let mut ebpf = ebpf;
        let offcpu = match (config.off_cpu, &mut ebpf) {
            (None, _) => None,
            (Some(_), None) => {
                tracing::warn!("off-CPU profiling needs eBPF, which is unavailable; CPU only");
                None
            }
            (Some(threshold), Some(bpf)) => match bpf.enable_offcpu(threshold) {
                Ok(()) => Some(offcpu::OffCpu::new(threshold)),
                Err(err) => {
                    tracing::warn!(error = %err, "off-CPU profiling unavailable (Linux 5.18+ with BTF); CPU only");
                    None
                }
            },
        };
        let ebpf_loaded = ebpf.is_some();
        let env_allowlist = config.env_allowlist.clone();
        let max_stack = std::fs::read_to_string("/proc/sys/kernel/perf_event_max_stack")
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(127);
        Ok(Collector {
            unwinding: unwind::Unwinding::new(config.memory_limit / 8, max_stack),
            symbols: Symbols::new(config.memory_limit as u64 / 8).files(config.symbolize),
            ebpf,
            interp: interp::Interpreters::default(),
            offcpu,
            config,
            cpus: events.cpus(),
            events: Some(events),
            table: ProcessTable::default().with_env_allowlist(env_allowlist),
            stacks: HashMap::new(),
            host: HostInfo::read(),
            stats: Arc::new(AgentStats {
                ebpf_active: AtomicU64::new(u64::from(ebpf_loaded)),
                // Made whole at load: measured once.
                bpf_map_bytes: AtomicU64::new(if ebpf_loaded { ebpf::map_bytes() } else { 0 }),
                ..Default::default()
            }),
            interval_start: now_nanos(),
            max_stack,
        })
    }

    pub fn stats(&self) -> Arc<AgentStats> {
        self.stats.clone()
    }

    pub fn cpus(&self) -> usize {
        self.cpus
    }

    /// Takes in records read from the rings: interpreter stacks first, since each is
    /// stamped just after its sample (interp/).
    fn records(&mut self, batch: Vec<Record>) {
        let (interpreted, records): (Vec<Record>, Vec<Record>) = batch
            .into_iter()
            .partition(|record| matches!(record, Record::Interpreted(_)));
        for record in interpreted.into_iter().chain(records) {
            self.record(record);
        }
        self.stats
            .processes
            .store(self.table.len() as u64, Ordering::Relaxed);
    }

    fn record(&mut self, record: Record) {
        match record {
            Record::Sample {
                pid,
                tid,
                kernel,
                user,
                depth,
                regs,
                stack,
                time,
            } => {
                if pid == 0 {
                    return; // the idle task
                }
                self.stats.samples.fetch_add(1, Ordering::Relaxed);
                let instance = self.table.for_sample(pid);
                let context = regs.map(|[ip, sp, bp]| unwind::UserContext {
                    ip,
                    sp,
                    bp,
                    stack: &stack,
                });
                let walked = match self.table.instance(instance) {
                    Some(process) => {
                        examine_interpreter(
                            self.config.interpreters,
                            &mut self.ebpf,
                            &mut self.interp,
                            process,
                        );
                        match context {
                            // V8's and HotSpot's functions are read from the stack copy,
                            // at each frame the unwinder recovers from it.
                            Some(context) if self.interp.wants_copy(instance) => {
                                let jit = self.interp.jit(instance);
                                self.unwinding.walk_copy(process, context, jit)
                            }
                            _ => {
                                self.unwinding
                                    .walk(process, user, depth >= self.max_stack, context)
                            }
                        }
                    }
                    None => unwind::Walked {
                        user,
                        truncated: depth >= self.max_stack,
                        method: unwind::Method::FramePointer,
                        bases: Vec::new(),
                    },
                };
                if !walked.user.is_empty() {
                    self.count_stacks(instance, walked.method, 1, u64::from(walked.truncated));
                }
                // Only a stack walked from its copy has the frame pointers V8's need.
                let copy = match (walked.bases.is_empty(), regs) {
                    (false, Some([_, sp, _])) => {
                        self.table.instance(instance).map(|process| interp::Copy {
                            bases: &walked.bases,
                            stack: &stack,
                            sp,
                            process,
                        })
                    }
                    _ => None,
                };
                let (user, outcome) = self.interp.join(instance, tid, time, walked.user, copy);
                if let Some((runtime, outcome)) = outcome {
                    let binary = binary_name(&self.table, instance);
                    interp::count(&self.stats.interpreters, binary, runtime, outcome);
                }
                // Only user-mode samples: a kernel thread has no user stack to count.
                if walked.method == unwind::Method::FramePointer
                    && regs.is_some()
                    && self.interp.may_count_in_kernel(instance)
                {
                    if let Some(bpf) = &mut self.ebpf {
                        bpf.track(pid, instance);
                    }
                }
                for address in &user {
                    if address & interp::INTERPRETED == 0 {
                        self.table.pin(instance, *address);
                    }
                }
                let stack = Stack {
                    kernel: kernel.into_boxed_slice(),
                    user: user.into_boxed_slice(),
                };
                self.add_stack(instance, stack, 1);
            }
            Record::Mmap {
                pid,
                start,
                len,
                pgoff,
                path,
                build_id,
            } => {
                if pid == u32::MAX {
                    return; // kernel modules
                }
                if interp::may_be_interpreter(&path) {
                    if let Some(bpf) = &mut self.ebpf {
                        bpf.count_in_ring(pid);
                    }
                }
                self.table.mmap(
                    pid,
                    Mapping {
                        start,
                        end: start.saturating_add(len),
                        pgoff,
                        path,
                        build_id,
                    },
                );
            }
            Record::Comm {
                pid,
                tid,
                comm,
                exec,
            } => self.table.comm(pid, tid, comm, exec),
            Record::Fork { pid, ppid, tid } => self.table.fork(pid, ppid, tid),
            Record::Exit { pid, tid } => self.table.exit(pid, tid),
            Record::Lost(count) => {
                self.stats.lost.fetch_add(count, Ordering::Relaxed);
            }
            Record::Interpreted(event) => self.interp.event(event),
            Record::OffCpu(offcpu::Event::Left(left)) => self.left_cpu(left),
            Record::OffCpu(offcpu::Event::Back(back)) => {
                if let Some(off) = &mut self.offcpu {
                    off.back(back);
                }
            }
        }
    }

    fn add_stack(&mut self, instance: Instance, stack: Stack, count: u64) {
        *self
            .stacks
            .entry(instance)
            .or_default()
            .entry(stack)
            .or_default() += count;
    }

    /// A thread left the CPU: its stacks are unwound as a sample's, and kept until it
    /// comes back.
    fn left_cpu(&mut self, left: offcpu::Left) {
        if self.offcpu.is_none() {
            return;
        }
        let instance = self.table.for_sample(left.pid);
        let Some(process) = self.table.instance(instance) else {
            if let Some(off) = &mut self.offcpu {
                off.unsent += left.unsent;
            }
            return;
        };
        examine_interpreter(
            self.config.interpreters,
            &mut self.ebpf,
            &mut self.interp,
            process,
        );
        let [ip, sp, bp] = left.regs;
        let jit = self.interp.jit(instance);
        let walked = self.unwinding.walk_copy(
            process,
            unwind::UserContext {
                ip,
                sp,
                bp,
                stack: &left.stack,
            },
            jit,
        );
        let copy = interp::Copy {
            bases: &walked.bases,
            stack: &left.stack,
            sp,
            process,
        };
        let (user, _) = self
            .interp
            .join(instance, left.tid, left.time, walked.user, Some(copy));
        for address in &user {
            if address & interp::INTERPRETED == 0 {
                self.table.pin(instance, *address);
            }
        }
        let stack = Stack {
            kernel: left.kernel.into_boxed_slice(),
            user: user.into_boxed_slice(),
        };
        if let Some(off) = &mut self.offcpu {
            off.left(left.tid, left.time, instance, stack, left.unsent);
        }
    }

    fn count_stacks(
        &self,
        instance: Instance,
        method: unwind::Method,
        stacks: u64,
        truncated: u64,
    ) {
        let binary = binary_name(&self.table, instance);
        if let Ok(mut binaries) = self.stats.binaries.lock() {
            let key = if binaries.len() < MAX_BINARIES || binaries.contains_key(binary) {
                binary.to_string()
            } else {
                "other".to_string()
            };
            let stats = binaries.entry(key).or_default();
            stats.method = method.name();
            stats.stacks += stacks;
            stats.truncated += truncated;
        }
    }

    /// Adds what the kernel counted since the last report.
    fn drain_ebpf(&mut self) {
        let Some(bpf) = &mut self.ebpf else {
            return;
        };
        for (instance, stack, count) in bpf.drain() {
            if stack.user.is_empty() && stack.kernel.is_empty() {
                continue;
            }
            self.stats.samples.fetch_add(count, Ordering::Relaxed);
            self.stats
                .kernel_counted
                .fetch_add(count, Ordering::Relaxed);
            if !stack.user.is_empty() {
                let cut = stack.user.len() + stack.kernel.len() >= ebpf::MAX_DEPTH;
                self.count_stacks(
                    instance,
                    unwind::Method::FramePointer,
                    count,
                    if cut { count } else { 0 },
                );
            }
            self.add_stack(instance, stack, count);
        }
    }

    /// One report per process that was sampled since the last call.
    pub fn report(&mut self) -> Vec<Report> {
        let mut pending = self.begin_report();
        while self.report_step(&mut pending) {}
        self.finish_report(pending)
    }

    /// Ends the interval: what was sampled in it is set aside to be written series by
    /// series ([`Collector::report_step`]), while samples go on being taken in.
    ///
    /// Why not all at once: writing symbolizes every process, which takes a second on a
    /// busy host, and samples read meanwhile would wait. V8's functions and HotSpot's
    /// compiled methods are read from the process when their sample is taken in, and the
    /// longer that waits, the likelier the collector or the JIT has moved them since.
    fn begin_report(&mut self) -> PendingReport {
        self.drain_ebpf();
        let now = now_nanos();
        let stacks = std::mem::take(&mut self.stacks);
        let off = self
            .offcpu
            .as_mut()
            .map(|off| std::mem::take(&mut off.stacks))
            .unwrap_or_default();
        let kernel = report::resolve_kernel(&self.symbols, &stacks);
        let off_kernel = report::resolve_kernel(&self.symbols, &off);
        let mut queue = VecDeque::new();
        for (kind, name, counts) in [(ON_CPU, "process_cpu", &stacks), (OFF_CPU, "off_cpu", &off)] {
            for (labels, processes) in series(&self.table, &self.host, &self.config, name, counts) {
                let instances = processes.iter().map(|(p, _)| p.instance).collect();
                queue.push_back((kind, labels, instances));
            }
        }
        // Frames interned from now on belong to the next interval: when the table is over
        // its budget it starts anew, and this interval is written from the old one.
        let frames = (self.interp.frames.bytes() > self.config.memory_limit / 16)
            .then(|| std::mem::take(&mut self.interp.frames));
        let pending = PendingReport {
            start: self.interval_start,
            end: now,
            stacks: [stacks, off],
            kernel: [kernel, off_kernel],
            frames,
            queue,
            reports: Vec::new(),
        };
        self.interval_start = now;
        pending
    }

    /// Writes the next series of a report; `false` once none is left.
    fn report_step(&mut self, pending: &mut PendingReport) -> bool {
        let Some((kind, labels, instances)) = pending.queue.pop_front() else {
            return false;
        };
        let period =
            1_000_000_000 / i64::try_from(self.config.frequency.clamp(1, 1000)).unwrap_or(19);
        let frames = pending.frames.as_ref().unwrap_or(&self.interp.frames);
        let mut writer = ProfileWriter::new(&self.symbols, &pending.kernel[kind], frames, period);
        if kind == OFF_CPU {
            writer = writer.off_cpu();
        }
        let processes: Vec<ProcessStacks<'_>> = instances
            .iter()
            .filter_map(|instance| {
                Some((
                    self.table.instance(*instance)?,
                    pending.stacks[kind].get(instance)?,
                ))
            })
            .collect();
        let profile = writer.write(
            &processes,
            &mut self.unwinding.binaries,
            pending.start,
            pending.end - pending.start,
        );
        pending.reports.push(Report { labels, profile });
        true
    }

    /// What follows the last series: processes that exited are forgotten, unless they
    /// were sampled again while the report was written, and caches kept to their budgets.
    fn finish_report(&mut self, pending: PendingReport) -> Vec<Report> {
        let reports = pending.reports;
        // What the kernel counted while the report was written belongs to the next
        // interval, and keeps its processes known as much as the samples read here do.
        self.drain_ebpf();
        let sampled: HashSet<Instance> = self
            .stacks
            .keys()
            .chain(self.offcpu.iter().flat_map(|off| off.stacks.keys()))
            .copied()
            .collect();
        if let Some(bpf) = &mut self.ebpf {
            for (instance, process) in self.table.exited() {
                if !sampled.contains(&instance) {
                    bpf.untrack(process.pid, instance);
                }
            }
        }
        self.table
            .forget_exited_except(|instance| sampled.contains(&instance));
        let table = &self.table;
        self.unwinding
            .retain(|instance| table.instance(instance).is_some());
        self.interp
            .retain(|instance| table.instance(instance).is_some());
        if let Some(off) = &mut self.offcpu {
            off.retain(|instance| table.instance(instance).is_some());
            self.stats
                .offcpu_unsent
                .store(off.unsent, Ordering::Relaxed);
            self.stats
                .offcpu_dropped
                .store(off.dropped, Ordering::Relaxed);
        }
        self.keep_within_budget();
        self.stats
            .reports
            .fetch_add(reports.len() as u64, Ordering::Relaxed);
        self.stats
            .processes
            .store(self.table.len() as u64, Ordering::Relaxed);
        reports
    }

    /// Starts blazesym anew once the files it parsed pass three eighths of the memory
    /// budget (see [`report::Symbols`]), and publishes what the caches hold.
    fn keep_within_budget(&mut self) {
        let held = self.symbols.held_bytes();
        if held > (self.config.memory_limit / 8 * 3) as u64 {
            tracing::debug!(held, "symbol cache over its budget; starting it anew");
            self.symbols.clear_files();
            self.stats.cache_evictions.fetch_add(1, Ordering::Relaxed);
        }
        let evicted = std::mem::take(&mut self.unwinding.binaries.evictions);
        self.stats
            .cache_evictions
            .fetch_add(evicted, Ordering::Relaxed);
        self.stats.cache_bytes.store(
            self.symbols.held_bytes()
                + self.unwinding.binaries.bytes() as u64
                + self.interp.bytes() as u64,
            Ordering::Relaxed,
        );
    }

    /// Opens the events on a thread of its own (blazesym's caches are not `Send`, so the
    /// collector lives where it was made) and runs there until `stop` is set, handing each
    /// interval's reports to `sink`. Returns once the events are open, or with why not.
    pub fn spawn(
        config: AgentConfig,
        stop: Arc<AtomicBool>,
        sink: impl FnMut(Vec<Report>) + Send + 'static,
    ) -> Result<RunningCollector, PerfError> {
        let (opened, open_result) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || match Collector::open(config) {
            Ok(collector) => {
                let _ = opened.send(Ok((collector.cpus(), collector.stats())));
                collector.run(&stop, sink);
            }
            Err(err) => {
                let _ = opened.send(Err(err));
            }
        });
        let (cpus, stats) = open_result.recv().unwrap_or_else(|_| {
            Err(PerfError::Config(
                "the collector thread ended before opening".into(),
            ))
        })?;
        Ok(RunningCollector {
            thread,
            cpus,
            stats,
        })
    }

    /// Reads the rings on a thread of its own every 100 ms, and hands a batch of reports to
    /// `sink` every interval, until `stop` is set. Reports are written a series at a time,
    /// between batches of samples (see the module's doc).
    ///
    /// Reading never waits for symbolizing: a report can take a while (a large binary's
    /// DWARF parsed for the first time), and samples with their stack copies would fill
    /// the rings meanwhile. Batches read wait in a channel of [`READ_AHEAD`] batches;
    /// when that is full the rings fill, and what the kernel drops is counted as lost.
    pub fn run(mut self, stop: &AtomicBool, mut sink: impl FnMut(Vec<Report>)) {
        let Some(mut events) = self.events.take() else {
            return;
        };
        let (batches, received) = std::sync::mpsc::sync_channel::<Vec<Record>>(READ_AHEAD);
        let mut rings = self
            .ebpf
            .as_mut()
            .map(ebpf::Ebpf::take_rings)
            .unwrap_or_default();
        std::thread::scope(|scope| {
            let stats = self.stats.clone();
            scope.spawn(move || read_rings(&mut events, &mut rings, stop, batches, &stats));
            let mut next_report = Instant::now() + first_report_after(self.config.interval);
            let mut pending: Option<PendingReport> = None;
            loop {
                // A batch of samples, then a report's next series, in turn: a batch waits
                // at most for one series to be written, and a report gets written even
                // while batches keep coming.
                let wait = if pending.is_some() {
                    Duration::ZERO
                } else {
                    next_report
                        .saturating_duration_since(Instant::now())
                        .min(Duration::from_millis(200))
                };
                match received.recv_timeout(wait) {
                    Ok(batch) => self.records(batch),
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                }
                if let Some(mut report) = pending.take() {
                    if self.report_step(&mut report) {
                        pending = Some(report);
                    } else {
                        sink(self.finish_report(report));
                    }
                } else if Instant::now() >= next_report {
                    next_report += jittered(self.config.interval);
                    pending = Some(self.begin_report());
                }
            }
            if let Some(mut report) = pending.take() {
                while self.report_step(&mut report) {}
                sink(self.finish_report(report));
            }
        });
        sink(self.report());
    }
}

/// The agent holds open the files of the binaries it samples (procs.rs, `pin`), one
/// descriptor per file: more than the usual soft limit of 1024 on a busy host. The hard
/// limit is what the administrator allows; the soft one is raised to it.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write one rlimit, which `limit` is.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// Batches of records read ahead of processing (see [`Collector::run`]): 1.6 s of them.
pub const READ_AHEAD: usize = 16;

/// The reading thread: drains every ring each 100 ms, in time order, and looks for CPUs
/// that came online every 10 s. Ends when `stop` is set, after a last drain.
fn read_rings(
    events: &mut PerfEvents,
    rings: &mut ebpf::Rings,
    stop: &AtomicBool,
    batches: std::sync::mpsc::SyncSender<Vec<Record>>,
    stats: &AgentStats,
) {
    let mut next_cpu_check = Instant::now() + Duration::from_secs(10);
    if let Err(err) = events.enable() {
        tracing::error!(error = %err, "cannot start sampling");
        return;
    }
    stats.sampling.store(1, Ordering::Relaxed);
    while !stop.load(Ordering::Relaxed) {
        // Every 100 ms, or sooner when a BPF ring is half full.
        rings.wait(Duration::from_millis(100));
        // The BPF rings first: an interpreter stack is written before its sample reaches
        // the perf ring, so every sample drained next finds its stack already read.
        let batch = events.drain_with(timed(rings.drain()));
        if !batch.is_empty() && batches.send(batch).is_err() {
            return;
        }
        if Instant::now() >= next_cpu_check {
            next_cpu_check = Instant::now() + Duration::from_secs(10);
            match events.add_new_cpus() {
                Ok(0) => {}
                Ok(added) => tracing::info!(added, "sampling CPUs that came online"),
                Err(err) => tracing::warn!(error = %err, "cannot sample a new CPU"),
            }
        }
    }
    let _ = batches.send(events.drain_with(timed(rings.drain())));
}

/// The BPF rings' events as records, with their times.
fn timed((interpreted, off_cpu): (Vec<interp::Event>, Vec<offcpu::Event>)) -> Vec<(u64, Record)> {
    let interpreted = interpreted
        .into_iter()
        .map(|event| (event.time, Record::Interpreted(event)));
    let off_cpu = off_cpu.into_iter().map(|event| {
        let time = match &event {
            offcpu::Event::Left(left) => left.time,
            offcpu::Event::Back(back) => back.time,
        };
        (time, Record::OffCpu(event))
    });
    interpreted.chain(off_cpu).collect()
}

/// When the first report is due: between half an interval and a whole one, at a phase
/// fixed by the host's name, so that a fleet's agents started together (a deploy, a
/// reboot) do not all report at the same instant.
fn first_report_after(interval: Duration) -> Duration {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    HostInfo::read().hostname.hash(&mut hasher);
    let phase = (hasher.finish() % 1000) as f64 / 1000.0;
    interval.mul_f64(0.5 + 0.5 * phase)
}

/// An interval give or take 5%, so that agents do not fall into step.
fn jittered(interval: Duration) -> Duration {
    let noise = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() % 1000);
    interval.mul_f64(0.95 + 0.1 * f64::from(noise) / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The agent's counters come out through the library: OpenMetrics text, counters
    /// with `_total`, and a binary's path escaped by the exposition's rules (a quote, a
    /// backslash and a newline in a path must not end the label value).
    #[test]
    fn the_counters_are_exposed_with_escaped_label_values() {
        let stats = Arc::new(AgentStats::default());
        stats.samples.store(7, Ordering::Relaxed);
        stats.processes.store(3, Ordering::Relaxed);
        let path = "/opt/a \"b\"\\c\nd";
        stats.binaries.lock().expect("lock").insert(
            path.to_string(),
            BinaryStats {
                method: "dwarf",
                stacks: 5,
                truncated: 1,
            },
        );
        interp::count(
            &stats.interpreters,
            "/usr/bin/python3.11",
            "python",
            "named",
        );
        interp::count(
            &stats.interpreters,
            "/usr/bin/python3.11",
            "python",
            "named",
        );
        interp::count(
            &stats.interpreters,
            "/usr/bin/python3.11",
            "python",
            "read failed",
        );
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(stats));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        assert!(text.contains("\nkiln_agent_samples_total 7\n"), "{text}");
        assert!(text.contains("\nkiln_agent_processes 3\n"), "{text}");
        assert!(
            text.contains(
                "kiln_agent_stacks_total{binary=\"/opt/a \\\"b\\\"\\\\c\\nd\",method=\"dwarf\"} 5\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "kiln_agent_stacks_truncated_total{binary=\"/opt/a \\\"b\\\"\\\\c\\nd\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "kiln_agent_interpreter_stacks_total{binary=\"/usr/bin/python3.11\",runtime=\"python\",outcome=\"named\"} 2\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "kiln_agent_interpreter_stacks_total{binary=\"/usr/bin/python3.11\",runtime=\"python\",outcome=\"read failed\"} 1\n"
            ),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
