//! Time off the CPU: where threads wait (a lock, a socket, the disk, a sleep), which a CPU
//! profile cannot show.
//!
//! The BPF program's `sched_switch` hook (src/bpf/offcpu.bpf.h) runs as a thread leaves
//! the CPU. For a share of the switches of user threads that block (`--off-cpu-threshold`,
//! drawn at random in the kernel), it sends the thread's stacks at that moment, as a CPU
//! sample carries them: the kernel's stack, the user registers and a copy of the user
//! stack, which the agent unwinds like any sample (DWARF or frame pointers, and an
//! interpreter's frames, read by the same hook). When the thread runs again, a small event
//! says when it left and came back. [`OffCpu`] joins the two by thread and time, and adds
//! the time, divided by the share sampled, to the stack: the estimate of each stack's
//! blocked time is unbiased, and the cost is bounded by the share, not by the host's
//! switch rate. The report is a second profile per process, `off_cpu`, in nanoseconds.
//!
//! A thread preempted while it could still run is not blocked, and is not sampled: its
//! time waiting for a CPU is the CPU profile's concern.

use std::collections::HashMap;

use crate::procs::Instance;
use crate::report::Stack;

/// A thread left the CPU (a sampled switch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Left {
    pub pid: u32,
    pub tid: u32,
    pub time: u64,
    pub kernel: Vec<u64>,
    /// ip, sp, bp.
    pub regs: [u64; 3],
    pub stack: Box<[u8]>,
    /// Sampled switches of this CPU whose stacks the kernel could not send just before
    /// this one (the ring was full): this one's time stands for theirs too.
    pub unsent: u64,
}

/// A sampled thread came back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Back {
    pub tid: u32,
    pub left: u64,
    pub time: u64,
}

/// An event of the off-CPU ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Left(Left),
    Back(Back),
}

const STACK_BYTES: usize = 16 << 10;
const KERNEL_DEPTH: usize = 64;
const LEFT_HEADER: usize = 64;

impl Event {
    /// Decodes `struct offcpu_stack` or `struct offcpu_end`; `None` when shorter than its
    /// type says.
    pub fn parse(bytes: &[u8]) -> Option<Event> {
        use crate::interp::{u32_at, u64_at};
        let (u32_at, u64_at) = (|at| u32_at(bytes, at), |at| u64_at(bytes, at));
        match u32_at(0)? {
            1 => {
                let kernel_bytes = usize::try_from(u32_at(12)?).ok()?.min(KERNEL_DEPTH * 8);
                let stack_bytes = usize::try_from(u64_at(48)?).ok()?.min(STACK_BYTES);
                let kernel = (0..kernel_bytes / 8)
                    .map(|i| u64_at(LEFT_HEADER + i * 8))
                    .collect::<Option<Vec<u64>>>()?;
                let start = LEFT_HEADER + KERNEL_DEPTH * 8;
                let stack = bytes.get(start..start + stack_bytes)?.into();
                Some(Event::Left(Left {
                    pid: u32_at(4)?,
                    tid: u32_at(8)?,
                    time: u64_at(16)?,
                    kernel,
                    regs: [u64_at(24)?, u64_at(32)?, u64_at(40)?],
                    stack,
                    unsent: u64_at(56)?,
                }))
            }
            2 => Some(Event::Back(Back {
                tid: u32_at(4)?,
                left: u64_at(8)?,
                time: u64_at(16)?,
            })),
            _ => None,
        }
    }
}

/// Threads off the CPU whose return is awaited, at most; past it, new ones are not kept
/// (and counted).
const MAX_AWAITED: usize = 65_536;

/// Off-CPU stacks of this interval, per process instance.
///
/// A sampled switch whose stack the kernel's ring could not hold is counted there, and
/// the count rides on the next stack sent (`unsent`, on /metrics). Its time is not
/// guessed: weighting the next stack by it was tried, and is biased, because the ring
/// fills and empties in step with the agent's reads, and a program whose period matches
/// them (a 100-ms loop) always sends first after a read (its sleeps came out 74 % too
/// long in the test). The ring is read before it fills instead (the BPF program wakes
/// the reader at half full).
#[derive(Debug, Default)]
pub struct OffCpu {
    /// (tid, when it left) → its process and stack.
    awaited: HashMap<(u32, u64), (Instance, Stack)>,
    /// Per instance: nanoseconds off the CPU per stack, estimated.
    pub stacks: HashMap<Instance, HashMap<Stack, u64>>,
    /// 1 / the share of switches sampled.
    pub scale: f64,
    /// Sampled switches not counted: the table of awaited returns was full.
    pub dropped: u64,
    /// Sampled switches whose stacks the kernel could not send (the ring was full).
    pub unsent: u64,
}

impl OffCpu {
    pub fn new(threshold: f64) -> Self {
        OffCpu {
            scale: 1.0 / threshold.clamp(1e-6, 1.0),
            ..Default::default()
        }
    }

    /// A thread left with this stack; `unsent` switches before it on its CPU were lost.
    pub fn left(&mut self, tid: u32, time: u64, instance: Instance, stack: Stack, unsent: u64) {
        self.unsent += unsent;
        if self.awaited.len() >= MAX_AWAITED {
            self.dropped += 1;
            return;
        }
        self.awaited.insert((tid, time), (instance, stack));
    }

    /// A thread came back: its time off goes to the stack it left with.
    pub fn back(&mut self, back: Back) {
        let Some((instance, stack)) = self.awaited.remove(&(back.tid, back.left)) else {
            return;
        };
        let nanos = (back.time.saturating_sub(back.left) as f64 * self.scale) as u64;
        *self
            .stacks
            .entry(instance)
            .or_default()
            .entry(stack)
            .or_default() += nanos;
    }

    /// Forgets the threads of processes that are gone.
    pub fn retain(&mut self, live: impl Fn(Instance) -> bool) {
        self.awaited.retain(|_, (instance, _)| live(*instance));
    }
}

/// The default share of blocking switches sampled: on a host switching 20,000 times a
/// second, 1 in 100 keeps the whole cost (the hook at every switch, the sampled stacks,
/// the agent's unwinding) at about half a percent of one core, where 1 in 20 took 1.5 %
/// and every switch 5.4 % (docs/benchmarks.md). That is still 200 stacks a second.
pub const DEFAULT_THRESHOLD: f64 = 0.01;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_decode_as_the_bpf_program_lays_them_out() {
        let mut left = Vec::new();
        for value in [1u32, 7, 8, 16] {
            left.extend_from_slice(&value.to_ne_bytes());
        }
        for value in [99u64, 0x1000, 0x7ff0, 0x7ff8, 3, 2] {
            left.extend_from_slice(&value.to_ne_bytes());
        }
        let mut kernel = [0u64; KERNEL_DEPTH];
        kernel[0] = 0xffff_ffff_8100_0000;
        kernel[1] = 0xffff_ffff_8100_0100;
        for value in kernel {
            left.extend_from_slice(&value.to_ne_bytes());
        }
        left.extend_from_slice(&[1, 2, 3]);
        left.resize(LEFT_HEADER + KERNEL_DEPTH * 8 + STACK_BYTES, 0);
        let Some(Event::Left(event)) = Event::parse(&left) else {
            panic!("not decoded");
        };
        assert_eq!((event.pid, event.tid, event.time), (7, 8, 99));
        assert_eq!(event.kernel, kernel[..2]);
        assert_eq!(event.regs, [0x1000, 0x7ff0, 0x7ff8]);
        assert_eq!(&event.stack[..], &[1, 2, 3]);
        assert_eq!(event.unsent, 2);
        // Cut short: refused.
        assert_eq!(Event::parse(&left[..60]), None);

        let mut back = Vec::new();
        back.extend_from_slice(&2u32.to_ne_bytes());
        back.extend_from_slice(&8u32.to_ne_bytes());
        back.extend_from_slice(&99u64.to_ne_bytes());
        back.extend_from_slice(&150u64.to_ne_bytes());
        assert_eq!(
            Event::parse(&back),
            Some(Event::Back(Back {
                tid: 8,
                left: 99,
                time: 150
            }))
        );
        assert_eq!(Event::parse(&[9, 0, 0, 0]), None);
    }

    #[test]
    fn blocked_time_goes_to_the_stack_it_left_with_scaled_by_the_share() {
        let mut off = OffCpu::new(0.5);
        let stack = |n: u64| Stack {
            kernel: Box::new([n]),
            user: Box::new([]),
        };
        off.left(8, 100, 1, stack(1), 0);
        off.left(9, 100, 1, stack(2), 0);
        off.back(Back {
            tid: 8,
            left: 100,
            time: 400,
        });
        // A return for a switch not sampled, or already counted, adds nothing.
        off.back(Back {
            tid: 8,
            left: 100,
            time: 900,
        });
        off.back(Back {
            tid: 10,
            left: 5,
            time: 9,
        });
        assert_eq!(off.stacks[&1][&stack(1)], 600);
        assert!(!off.stacks[&1].contains_key(&stack(2)));
        off.retain(|_| false);
        off.back(Back {
            tid: 9,
            left: 100,
            time: 200,
        });
        assert!(!off.stacks[&1].contains_key(&stack(2)));
    }

    #[test]
    fn stacks_the_ring_could_not_hold_are_counted_not_guessed() {
        let mut off = OffCpu::new(1.0);
        let stack = Stack {
            kernel: Box::new([1]),
            user: Box::new([]),
        };
        off.left(8, 100, 1, stack.clone(), 2);
        off.back(Back {
            tid: 8,
            left: 100,
            time: 150,
        });
        assert_eq!(off.stacks[&1][&stack], 50);
        assert_eq!(off.unsent, 2);
    }
}
