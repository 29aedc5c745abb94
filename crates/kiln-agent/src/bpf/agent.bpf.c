// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only
//
// Kiln's in-kernel stack aggregation (crates/kiln-agent/src/ebpf.rs loads it).
//
// Attached to the agent's own cpu-clock perf events. For a process the agent has found to
// keep frame pointers (an entry in `fp_processes`, its value the agent's instance number
// of that process), a sample is counted here, by (instance, user stack id, kernel stack
// id), and returns 0: the kernel writes nothing to the ring, and the agent wakes for
// nothing. Every other sample returns 1 and goes to the ring as before, with the
// registers and the stack copy that DWARF unwinding needs: processes not yet known,
// programs without frame pointers, and anything that does not fit a map here. So no
// sample is lost to this program; it only moves the cheap ones into the kernel.
//
// Counts go to the map of the current epoch's parity, stacks likewise: the agent bumps the
// epoch, then reads and empties the other parity's maps, which nothing writes any more.
//
// Exec and exit are raw tracepoints: they need no tracefs mounted, which hosts may not have.
//
// No libbpf headers: the few helpers and map macros it uses are declared below, so Debian's
// clang and the kernel's UAPI headers are all it needs.

#include <linux/bpf.h>
#include <linux/bpf_perf_event.h>

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*bpf_map_update_elem)(void *map, const void *key, const void *value,
                                   __u64 flags) = (void *)2;
static long (*bpf_map_delete_elem)(void *map, const void *key) = (void *)3;
static __u64 (*bpf_get_current_pid_tgid)(void) = (void *)14;
static long (*bpf_get_stackid)(void *ctx, void *map, __u64 flags) = (void *)27;
static __u64 (*bpf_ktime_get_ns)(void) = (void *)5;
static long (*bpf_probe_read_user)(void *dst, __u32 size, const void *src) = (void *)112;
static void *(*bpf_ringbuf_reserve)(void *ringbuf, __u64 size, __u64 flags) = (void *)131;
static void (*bpf_ringbuf_submit)(void *data, __u64 flags) = (void *)132;
static long (*bpf_loop)(__u32 nr_loops, void *callback_fn, void *callback_ctx,
                        __u64 flags) = (void *)181;
static __u32 (*bpf_get_prandom_u32)(void) = (void *)7;
static long (*bpf_get_stack)(void *ctx, void *buf, __u32 size, __u64 flags) = (void *)67;
static long (*bpf_probe_read_kernel)(void *dst, __u32 size, const void *src) = (void *)113;
static void *(*bpf_get_current_task_btf)(void) = (void *)158;
static long (*bpf_task_pt_regs)(void *task) = (void *)175;

static __u64 (*bpf_ringbuf_query)(void *ringbuf, __u64 flags) = (void *)134;

#define BPF_RB_NO_WAKEUP 1
#define BPF_RB_FORCE_WAKEUP 2
#define BPF_RB_AVAIL_DATA 0
#define BPF_RB_RING_SIZE 1

// How to submit to a ring: wake the agent's reader (an edge-triggered epoll) only once
// the ring is half full. It reads every 100 ms anyway; a wakeup per event would cost a
// switch each, and with none, a burst filled the ring between two reads and lost events.
static __u64 ring_wakeup(void *ring)
{
    __u64 used = bpf_ringbuf_query(ring, BPF_RB_AVAIL_DATA);
    __u64 size = bpf_ringbuf_query(ring, BPF_RB_RING_SIZE);
    return used * 2 > size ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
}

#include "interp.bpf.h"
#include "offcpu.bpf.h"

#define MAX_DEPTH 127
#define MAX_STACKS 4096

struct count_key {
    __u64 instance;
    __s32 user_stack;
    __s32 kernel_stack;
};

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, __u32);
    __type(value, __u64);
} fp_processes SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u32);
} epoch SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, struct count_key);
    __type(value, __u64);
} counts_0 SEC(".maps"), counts_1 SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_STACK_TRACE);
    __uint(max_entries, MAX_STACKS);
    __type(key, __u32);
    __type(value, __u64[MAX_DEPTH]);
} stacks_0 SEC(".maps"), stacks_1 SEC(".maps");

SEC("perf_event")
int kiln_sample(struct bpf_perf_event_data *ctx)
{
    __u64 pid_tgid = bpf_get_current_pid_tgid();
    __u32 tgid = pid_tgid >> 32;
    if (tgid == 0)
        return 0; // the idle task: the agent ignores it
    // An interpreter's sample needs its native stack unwound with the interpreter frames
    // read here: it goes to the ring, never counted here.
    if (interp_sample(tgid, (__u32)pid_tgid))
        return 1;
    __u64 *instance = bpf_map_lookup_elem(&fp_processes, &tgid);
    if (!instance)
        return 1;
    __u32 zero = 0;
    __u32 *current = bpf_map_lookup_elem(&epoch, &zero);
    if (!current)
        return 1;
    int odd = *current & 1;
    void *stacks = odd ? (void *)&stacks_1 : (void *)&stacks_0;
    void *counts = odd ? (void *)&counts_1 : (void *)&counts_0;
    struct count_key key = {};
    key.instance = *instance;
    key.user_stack = bpf_get_stackid(ctx, stacks, BPF_F_USER_STACK);
    if (key.user_stack < 0)
        return 1; // a hash collision or a full map: let the ring have it
    key.kernel_stack = bpf_get_stackid(ctx, stacks, 0);
    if (key.kernel_stack < 0 && key.kernel_stack != -14 /* EFAULT: no kernel stack */)
        return 1;
    if (key.kernel_stack < 0)
        key.kernel_stack = -1;
    __u64 *count = bpf_map_lookup_elem(counts, &key);
    if (count) {
        __sync_fetch_and_add(count, 1);
        return 0;
    }
    __u64 one = 1;
    if (bpf_map_update_elem(counts, &key, &one, BPF_NOEXIST) == 0)
        return 0;
    count = bpf_map_lookup_elem(counts, &key); // another CPU added it meanwhile
    if (count) {
        __sync_fetch_and_add(count, 1);
        return 0;
    }
    return 1;
}

// A process that executes a new program is another program: its samples go to the ring
// again, with no interpreter read, until the agent has looked at the new one.
SEC("raw_tracepoint/sched_process_exec")
int kiln_exec(void *ctx)
{
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    bpf_map_delete_elem(&fp_processes, &tgid);
    bpf_map_delete_elem(&interp_procs, &tgid);
    return 0;
}

// A process that exits frees its pid for another: forget it at once, not when the agent
// reads the exit record.
SEC("raw_tracepoint/sched_process_exit")
int kiln_exit(void *ctx)
{
    __u64 pid_tgid = bpf_get_current_pid_tgid();
    if ((__u32)pid_tgid == (__u32)(pid_tgid >> 32)) {
        __u32 tgid = pid_tgid >> 32;
        bpf_map_delete_elem(&fp_processes, &tgid);
        bpf_map_delete_elem(&interp_procs, &tgid);
    }
    return 0;
}

char LICENSE[] SEC("license") = "GPL";
