// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only
//
// Time off the CPU (crates/kiln-agent/src/offcpu.rs explains the design; agent.bpf.c
// includes this file).
//
// On the scheduler's switch (the `sched_switch` raw tracepoint, which runs as the thread
// going off the CPU), a share of the switches of user threads that block is sampled
// (`offcpu_config.threshold` of 2^32, by a random draw). A sampled switch sends the thread's
// stacks at once, as a CPU sample would carry them: the kernel stack, and the user
// registers with a copy of the user stack for the agent to unwind (frame pointers or DWARF,
// as any sample); for an interpreter, its frames too (interp.bpf.h). When the thread runs
// again, a second, small event says how long it was off. The agent joins the two by thread
// and time. A thread preempted while runnable is not blocked: its switch is not sampled.

#define OFFCPU_STACK_BYTES (16 << 10)
#define OFFCPU_KERNEL_DEPTH 64

#define TASK_DEAD 0x80

#define OFFCPU_EVENT_STACK 1
#define OFFCPU_EVENT_END 2

struct offcpu_config {
    __u32 enabled;
    __u32 threshold; // sampled when a random u32 is below this
    __u32 agent;     // the agent's own process: never sampled
    __u32 pad;
};

struct offcpu_stack {
    __u32 type; // OFFCPU_EVENT_STACK
    __u32 pid;
    __u32 tid;
    __u32 kernel_bytes;
    __u64 time;
    __u64 ip;
    __u64 sp;
    __u64 bp;
    __u64 stack_bytes;
    // Stack events this CPU could not send (the ring full) since its last one.
    __u64 dropped;
    __u64 kernel[OFFCPU_KERNEL_DEPTH];
    __u8 stack[OFFCPU_STACK_BYTES];
};

struct offcpu_end {
    __u32 type; // OFFCPU_EVENT_END
    __u32 tid;
    __u64 start;
    __u64 end;
};

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct offcpu_config);
} offcpu_config SEC(".maps");

struct offcpu_left {
    __u64 time;
    __u32 tid;
    __u32 pad;
};

// Sampled threads now off the CPU, by the address of their task (so nothing of `next`
// is read on the path every switch takes): when they left, and their thread id. A
// thread's last switch, at its exit, is not noted, so an entry never outlives its task.
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 65536);
    __type(key, __u64);
    __type(value, struct offcpu_left);
} offcpu_starts SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 8 << 20);
} offcpu_events SEC(".maps");

// Per CPU: stack events not sent since the last one that was.
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u64);
} offcpu_unsent SEC(".maps");

// x86-64 `struct pt_regs` (the ptrace ABI): where the user registers were saved.
#define PT_REGS_BP 32
#define PT_REGS_IP 128
#define PT_REGS_SP 152

SEC("raw_tracepoint/sched_switch")
int kiln_switch(struct bpf_raw_tracepoint_args *ctx)
{
    __u32 zero = 0;
    struct offcpu_config *config = bpf_map_lookup_elem(&offcpu_config, &zero);
    if (!config || !config->enabled)
        return 0;
    // The thread coming on: if it was sampled going off, say for how long.
    __u64 next = ctx->args[2];
    struct offcpu_left *left = bpf_map_lookup_elem(&offcpu_starts, &next);
    __u64 now = 0;
    if (left) {
        now = bpf_ktime_get_ns();
        struct offcpu_end *end = bpf_ringbuf_reserve(&offcpu_events, sizeof(*end), 0);
        if (end) {
            end->type = OFFCPU_EVENT_END;
            end->tid = left->tid;
            end->start = left->time;
            end->end = now;
            bpf_ringbuf_submit(end, ring_wakeup(&offcpu_events));
        }
        bpf_map_delete_elem(&offcpu_starts, &next);
    }
    // The thread going off (the current one): blocked, a user thread, and drawn.
    if (ctx->args[0]) // preempted while runnable
        return 0;
    // A thread switching out for good (its exit's last switch) never comes back; its
    // entry would wait for a task allocated at its address. (prev_state is the fourth
    // argument since Linux 5.18.)
    if (ctx->args[3] & TASK_DEAD)
        return 0;
    __u64 pid_tgid = bpf_get_current_pid_tgid();
    __u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
    if (tgid == 0 || tgid == config->agent)
        return 0;
    if (bpf_get_prandom_u32() >= config->threshold && config->threshold != 0xffffffff)
        return 0;
    if (!now)
        now = bpf_ktime_get_ns();
    void *task = bpf_get_current_task_btf();
    void *regs = (void *)bpf_task_pt_regs(task);
    __u64 ip = 0, sp = 0, bp = 0;
    bpf_probe_read_kernel(&ip, sizeof(ip), regs + PT_REGS_IP);
    bpf_probe_read_kernel(&sp, sizeof(sp), regs + PT_REGS_SP);
    bpf_probe_read_kernel(&bp, sizeof(bp), regs + PT_REGS_BP);
    if (ip == 0 || ip >= 0x800000000000ULL)
        return 0; // a kernel thread: no user context
    __u64 *unsent = bpf_map_lookup_elem(&offcpu_unsent, &zero);
    struct offcpu_stack *event = bpf_ringbuf_reserve(&offcpu_events, sizeof(*event), 0);
    if (!event) {
        if (unsent)
            *unsent += 1;
        return 0;
    }
    event->dropped = unsent ? *unsent : 0;
    if (unsent)
        *unsent = 0;
    event->type = OFFCPU_EVENT_STACK;
    event->pid = tgid;
    event->tid = tid;
    event->time = now;
    event->ip = ip;
    event->sp = sp;
    event->bp = bp;
    // The first two frames are this program and the tracepoint's BPF runner.
    long kernel = bpf_get_stack(ctx, event->kernel, sizeof(event->kernel), 2 & BPF_F_SKIP_FIELD_MASK);
    event->kernel_bytes = kernel > 0 ? kernel : 0;
    // As much of the user stack as is mapped: a thread's stack may end within 16 KiB of
    // its pointer, and a copy that fails is retried shorter.
    __u64 copied = 0;
    for (__u32 bytes = OFFCPU_STACK_BYTES; bytes >= 1024; bytes /= 2) {
        if (bpf_probe_read_user(event->stack, bytes, (const void *)sp) == 0) {
            copied = bytes;
            break;
        }
    }
    event->stack_bytes = copied;
    bpf_ringbuf_submit(event, ring_wakeup(&offcpu_events));
    struct offcpu_left noted = {.time = now, .tid = tid};
    __u64 current = (__u64)task;
    bpf_map_update_elem(&offcpu_starts, &current, &noted, BPF_ANY);
    interp_read(tgid, tid, now);
    return 0;
}
