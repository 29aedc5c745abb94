// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only
//
// Interpreter stacks, read at the sample (crates/kiln-agent/src/interp/ explains the
// design; agent.bpf.c includes this file).
//
// For a process in `interp_procs` (the agent put it there once it recognised the
// runtime, CPython or Ruby, and found its layout), the sampled thread's interpreter
// frames are read here, from the interpreter's own memory, at the moment of the sample:
// a later read from user space would find the thread elsewhere. Each frame goes out as the runtime's code object
// address and instruction pointer, with a fingerprint against an address reused by
// another object; the agent names them. The event goes to `interp_events` with the time
// and thread of the sample, and the sample itself to the perf ring as before: the agent
// joins the two by thread and time, and puts the interpreter frames in place of the
// interpreter's own native frames.
//
// The walk is a `bpf_loop` (Linux 5.17): a bounded loop this long, with a branch per
// frame, is more than the verifier will follow.
//
// Nothing here writes to the program's memory, and every read may fail: a read that
// fails ends the walk, with a status saying where, and the sample keeps its native stack.

#define INTERP_MAX_FRAMES 128
#define INTERP_MAX_THREADS 256

#define RUNTIME_PYTHON 1
#define RUNTIME_RUBY 2

// Statuses of an event.
#define STATUS_OK 0
#define STATUS_NO_THREAD 1    // the thread has no interpreter state (a native thread)
#define STATUS_READ_FAILED 2  // a read of the interpreter's memory failed mid-walk
#define STATUS_TRUNCATED 3    // more frames than INTERP_MAX_FRAMES

// Frame flags.
#define FRAME_ENTRY 1 // the outermost frame of one native call of the interpreter loop

// How a frame marks the end of one native interpreter call.
#define ENTRY_IS_ENTRY_BYTE 1 // CPython 3.11: a bool in the frame
#define ENTRY_CSTACK_OWNER 2  // CPython 3.12+: a shim frame (its owner `shim_owner`) follows
#define ENTRY_EVERY_FRAME 3   // CPython up to 3.10: one native call per frame object


// CPython's offsets (interp/python.rs). A field of 0xffff is absent in that version.
struct python_walk {
    __u16 runtime_interp_head;  // _PyRuntime.interpreters.head
    __u16 interp_threads_head;  // PyInterpreterState.threads.head (tstate_head)
    __u16 tstate_next;          // PyThreadState.next
    __u16 tstate_thread_id;     // PyThreadState.native_thread_id
    __u16 tstate_cframe;        // PyThreadState.cframe, or 0xffff: the frame is in tstate
    __u16 current_frame;        // _PyCFrame.current_frame, or PyThreadState.current_frame
    __u16 frame_code;           // _PyInterpreterFrame.f_code (f_executable)
    __u16 frame_previous;       // _PyInterpreterFrame.previous
    __u16 frame_instr;          // _PyInterpreterFrame.prev_instr (instr_ptr)
    __u16 frame_entry;          // is_entry or owner
    __u16 entry_kind;           // ENTRY_*
    __u16 code_firstlineno;     // PyCodeObject.co_firstlineno
    __u16 shim_owner;           // ENTRY_CSTACK_OWNER: the owner of the entry shim frame
    __u16 code_tag_bits;        // tag bits of f_executable (a _PyStackRef from 3.14)
    __u16 thread_key;           // THREAD_KEY_*: what tstate_thread_id holds
};

// What identifies a thread state's thread: the kernel's thread id (`native_thread_id`,
// 3.11 on), or `pthread_self()` (`thread_id`, up to 3.10), which on x86-64 glibc is the
// thread's TLS base, the FS base register the kernel keeps in its task.
#define THREAD_KEY_TID 0
#define THREAD_KEY_PTHREAD 1

// The two task fields read, relocated by the loader to where the running kernel has them
// (CO-RE: the kernel's BTF gives the offsets, so no kernel headers are needed here).
struct thread_struct {
    unsigned long fsbase;
} __attribute__((preserve_access_index));
struct task_struct {
    struct thread_struct thread;
} __attribute__((preserve_access_index));

// The current thread's TLS base; 0 when unreadable.
static __u64 current_fsbase(void)
{
    struct task_struct *task = bpf_get_current_task_btf();
    __u64 fsbase = 0;
    if (bpf_probe_read_kernel(&fsbase, sizeof(fsbase), &task->thread.fsbase) != 0)
        return 0;
    return fsbase;
}

// Ruby's offsets (interp/ruby.rs).
struct ruby_walk {
    __u16 vm_main_ractor;    // rb_vm_t.ractor.main_ractor
    __u16 ractor_threads;    // rb_ractor_t.threads.set, a list of rb_thread_t
    __u16 thread_lt_node;    // rb_thread_t.lt_node, its place in that list
    __u16 thread_tid;        // the thread's id, in rb_thread_t or its native thread
    __u16 thread_ec;         // rb_thread_t.ec, its running fiber's context
    __u16 ec_vm_stack;       // rb_execution_context_t.vm_stack
    __u16 ec_vm_stack_size;  // .vm_stack_size, in VALUEs
    __u16 ec_cfp;            // .cfp, the innermost control frame
    __u16 cfp_size;          // sizeof(rb_control_frame_t)
    __u16 cfp_pc;
    __u16 cfp_iseq;
    __u16 cfp_ep;
    __u16 iseq_body;         // rb_iseq_t.body
    __u16 thread_nt;         // rb_thread_t.nt (3.2 on: the id is there), or 0xffff
    __u16 thread_key;        // THREAD_KEY_*: tid (an int, 3.1 on) or thread_id (3.0)
};

// The layout of one process's interpreter, filled by the agent (interp/mod.rs).
struct interp_proc {
    __u64 runtime;  // Python: the address of _PyRuntime; Ruby: of ruby_current_vm_ptr
    __u32 kind;     // RUNTIME_*
    __u32 version;  // 0x030b for 3.11
    union {
        struct python_walk py;
        struct ruby_walk rb;
        __u16 words[16];
    };
};

struct interp_frame {
    __u64 code;
    __u64 instr;
    __u32 fingerprint;
    __u32 flags;
};

struct interp_event {
    __u32 pid;
    __u32 tid;
    __u64 time;
    __u32 kind;
    __u16 status;
    __u16 count;
    struct interp_frame frames[INTERP_MAX_FRAMES];
};

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 4096);
    __type(key, __u32);
    __type(value, struct interp_proc);
} interp_procs SEC(".maps");

// Where each thread's interpreter state was found: checked on every use, since a thread
// id is reused and a state freed.
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 65536);
    __type(key, __u32);
    __type(value, __u64);
} interp_threads SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 4 << 20);
} interp_events SEC(".maps");

static __u64 read_u64(__u64 address)
{
    __u64 value = 0;
    if (bpf_probe_read_user(&value, sizeof(value), (const void *)address) != 0)
        return 0;
    return value;
}

// A search of an interpreter's list of threads for the one whose id is `key`: a bpf_loop
// callback, as the frame walks are. Unrolled, a list this long costs the verifier a
// second of CPU per program at every start of the agent (more on a busy host).
struct thread_search {
    const struct interp_proc *proc;
    __u64 key;
    __u64 node;  // the thread (CPython) or list node (Ruby) to look at next
    __u64 head;  // Ruby: the list's head, where it ends
    __u64 found;
};

static long python_thread_step(__u64 index, struct thread_search *search)
{
    __u64 state = search->node;
    if (!state)
        return 1;
    if (read_u64(state + search->proc->py.tstate_thread_id) == search->key) {
        search->found = state;
        return 1;
    }
    search->node = read_u64(state + search->proc->py.tstate_next);
    return 0;
}

// The interpreter state of thread `tid`, or 0 when it has none.
static __u64 python_thread_state(const struct interp_proc *proc, __u32 tid)
{
    __u64 key = tid;
    if (proc->py.thread_key == THREAD_KEY_PTHREAD) {
        key = current_fsbase();
        if (!key)
            return 0;
    }
    __u64 *cached = bpf_map_lookup_elem(&interp_threads, &tid);
    if (cached && *cached && read_u64(*cached + proc->py.tstate_thread_id) == key)
        return *cached;
    __u64 interp = read_u64(proc->runtime + proc->py.runtime_interp_head);
    if (!interp)
        return 0;
    struct thread_search search = {
        .proc = proc, .key = key, .node = read_u64(interp + proc->py.interp_threads_head)};
    bpf_loop(INTERP_MAX_THREADS, python_thread_step, &search, 0);
    if (search.found)
        bpf_map_update_elem(&interp_threads, &tid, &search.found, BPF_ANY);
    return search.found;
}

struct walk {
    const struct interp_proc *proc;
    struct interp_event *event;
    __u64 frame;
    __u64 end; // Ruby: the end of the control frames
    __u32 count;
};

// One frame of the walk (a bpf_loop callback: the verifier checks it once, not once per
// iteration, so the walk may be long). Returns 1 to stop.
static long python_frame(__u64 index, struct walk *walk)
{
    const struct interp_proc *proc = walk->proc;
    struct interp_event *event = walk->event;
    __u64 frame = walk->frame;
    if (!frame)
        return 1;
    __u8 entry = 0;
    if (proc->py.entry_kind != ENTRY_EVERY_FRAME &&
        bpf_probe_read_user(&entry, 1, (const void *)(frame + proc->py.frame_entry)) != 0) {
        event->status = STATUS_READ_FAILED;
        return 1;
    }
    __u32 count = walk->count;
    if (proc->py.entry_kind == ENTRY_CSTACK_OWNER && entry >= proc->py.shim_owner) {
        // A shim between two native calls of the loop: the frame before it was the first
        // of its call. (Owners above it, 3.14's C-stack frames, run no code: skipped.)
        if (entry == proc->py.shim_owner && count > 0 && count <= INTERP_MAX_FRAMES)
            event->frames[count - 1].flags |= FRAME_ENTRY;
    } else {
        if (count >= INTERP_MAX_FRAMES) {
            event->status = STATUS_TRUNCATED;
            return 1;
        }
        struct interp_frame *out = &event->frames[count];
        out->code = read_u64(frame + proc->py.frame_code) & ~(__u64)proc->py.code_tag_bits;
        out->instr = read_u64(frame + proc->py.frame_instr);
        __u32 line = 0;
        if (out->code)
            bpf_probe_read_user(&line, sizeof(line),
                                (const void *)(out->code + proc->py.code_firstlineno));
        out->fingerprint = line;
        out->flags = 0;
        if (proc->py.entry_kind == ENTRY_EVERY_FRAME ||
            (proc->py.entry_kind == ENTRY_IS_ENTRY_BYTE && entry))
            out->flags = FRAME_ENTRY;
        walk->count = count + 1;
    }
    __u64 previous = 0;
    if (bpf_probe_read_user(&previous, sizeof(previous),
                            (const void *)(frame + proc->py.frame_previous)) != 0) {
        event->status = STATUS_READ_FAILED;
        return 1;
    }
    walk->frame = previous;
    return 0;
}

static void python_walk(const struct interp_proc *proc, struct interp_event *event, __u32 tid)
{
    __u64 state = python_thread_state(proc, tid);
    if (!state) {
        event->status = STATUS_NO_THREAD;
        return;
    }
    struct walk walk = {.proc = proc, .event = event, .count = 0};
    if (proc->py.tstate_cframe != 0xffff) {
        __u64 cframe = read_u64(state + proc->py.tstate_cframe);
        walk.frame = cframe ? read_u64(cframe + proc->py.current_frame) : 0;
    } else {
        walk.frame = read_u64(state + proc->py.current_frame);
    }
    // Shim frames take no slot, so up to twice as many frames are visited as kept.
    bpf_loop(INTERP_MAX_FRAMES * 2, python_frame, &walk, 0);
    event->count = walk.count;
}

// Ruby's control frame flags (vm_core.h): the frame's kind, in the magic bits, and
// whether it is the first of a native call of the VM (`vm_exec`).
#define RUBY_FRAME_MAGIC_MASK 0x7fff0001
#define RUBY_FRAME_MAGIC_CFUNC 0x55550001
#define RUBY_FRAME_FLAG_FINISH 0x20

// The id of a Ruby thread's native thread, as `thread_key` says: its kernel thread id (an
// int in the thread, or from 3.2 in its native thread `nt`), or its `pthread_t` (3.0).
static __u64 ruby_thread_id(const struct interp_proc *proc, __u64 thread)
{
    __u64 holder = thread;
    if (proc->rb.thread_nt != 0xffff) {
        holder = read_u64(thread + proc->rb.thread_nt);
        if (!holder)
            return 0;
    }
    if (proc->rb.thread_key == THREAD_KEY_PTHREAD)
        return read_u64(holder + proc->rb.thread_tid);
    __u32 id = 0;
    if (bpf_probe_read_user(&id, 4, (const void *)(holder + proc->rb.thread_tid)) != 0)
        return 0;
    return id;
}

static long ruby_thread_step(__u64 index, struct thread_search *search)
{
    __u64 node = search->node;
    if (!node || node == search->head)
        return 1;
    __u64 thread = node - search->proc->rb.thread_lt_node;
    if (ruby_thread_id(search->proc, thread) == search->key) {
        search->found = thread;
        return 1;
    }
    search->node = read_u64(node);
    return 0;
}

// The Ruby thread whose kernel thread id is `tid`, or 0. Threads of the main ractor only:
// others (an experimental feature) keep their native stacks.
static __u64 ruby_thread(const struct interp_proc *proc, __u32 tid)
{
    __u64 key = tid;
    if (proc->rb.thread_key == THREAD_KEY_PTHREAD) {
        key = current_fsbase();
        if (!key)
            return 0;
    }
    __u64 *cached = bpf_map_lookup_elem(&interp_threads, &tid);
    if (cached && *cached && ruby_thread_id(proc, *cached) == key)
        return *cached;
    __u64 vm = read_u64(proc->runtime);
    if (!vm)
        return 0;
    __u64 ractor = read_u64(vm + proc->rb.vm_main_ractor);
    if (!ractor)
        return 0;
    __u64 head = ractor + proc->rb.ractor_threads;
    struct thread_search search = {.proc = proc, .key = key, .node = read_u64(head), .head = head};
    bpf_loop(INTERP_MAX_THREADS, ruby_thread_step, &search, 0);
    if (search.found)
        bpf_map_update_elem(&interp_threads, &tid, &search.found, BPF_ANY);
    return search.found;
}

// One control frame, from the innermost outwards (a bpf_loop callback).
static long ruby_frame(__u64 index, struct walk *walk)
{
    const struct interp_proc *proc = walk->proc;
    struct interp_event *event = walk->event;
    __u64 cfp = walk->frame;
    if (!cfp || cfp >= walk->end)
        return 1;
    __u64 pc = 0, iseq = 0, ep = 0, flags = 0;
    if (bpf_probe_read_user(&pc, 8, (const void *)(cfp + proc->rb.cfp_pc)) != 0 ||
        bpf_probe_read_user(&iseq, 8, (const void *)(cfp + proc->rb.cfp_iseq)) != 0 ||
        bpf_probe_read_user(&ep, 8, (const void *)(cfp + proc->rb.cfp_ep)) != 0 ||
        bpf_probe_read_user(&flags, 8, (const void *)ep) != 0) {
        event->status = STATUS_READ_FAILED;
        return 1;
    }
    __u32 count = walk->count;
    __u32 finish = flags & RUBY_FRAME_FLAG_FINISH ? FRAME_ENTRY : 0;
    if (iseq && pc && (flags & RUBY_FRAME_MAGIC_MASK) != RUBY_FRAME_MAGIC_CFUNC) {
        if (count >= INTERP_MAX_FRAMES) {
            event->status = STATUS_TRUNCATED;
            return 1;
        }
        struct interp_frame *out = &event->frames[count];
        out->code = iseq;
        out->instr = pc;
        // The body's address: an iseq freed and its memory reused has another.
        out->fingerprint = (__u32)read_u64(iseq + proc->rb.iseq_body);
        out->flags = finish;
        walk->count = count + 1;
    } else if (finish && count > 0 && count <= INTERP_MAX_FRAMES) {
        // A C method or a C block began this call of the VM: the frame before it is the
        // first of it that is kept. (C methods keep their native frames.)
        event->frames[count - 1].flags |= FRAME_ENTRY;
    }
    walk->frame = cfp + proc->rb.cfp_size;
    return 0;
}

static void ruby_walk(const struct interp_proc *proc, struct interp_event *event, __u32 tid)
{
    __u64 thread = ruby_thread(proc, tid);
    __u64 ec = thread ? read_u64(thread + proc->rb.thread_ec) : 0;
    if (!ec) {
        event->status = STATUS_NO_THREAD;
        return;
    }
    __u64 stack = read_u64(ec + proc->rb.ec_vm_stack);
    __u64 size = read_u64(ec + proc->rb.ec_vm_stack_size);
    struct walk walk = {.proc = proc, .event = event, .count = 0};
    walk.frame = read_u64(ec + proc->rb.ec_cfp);
    // Control frames grow down from the top of the VM stack (RUBY_VM_END_CONTROL_FRAME).
    walk.end = stack + size * 8;
    if (!stack || size > (1 << 24) || !proc->rb.cfp_size) {
        event->status = STATUS_READ_FAILED;
        return;
    }
    // C frames take no slot, so up to twice as many frames are visited as kept.
    bpf_loop(INTERP_MAX_FRAMES * 2, ruby_frame, &walk, 0);
    event->count = walk.count;
}

// Reads the thread's interpreter stack, if its process runs a known interpreter, stamped
// `time`. Returns whether it does.
static int interp_read(__u32 tgid, __u32 tid, __u64 time)
{
    const struct interp_proc *proc = bpf_map_lookup_elem(&interp_procs, &tgid);
    if (!proc)
        return 0;
    struct interp_event *event = bpf_ringbuf_reserve(&interp_events, sizeof(*event), 0);
    if (!event)
        return 1; // the ring is full: the sample keeps its native stack
    event->pid = tgid;
    event->tid = tid;
    event->time = time;
    event->kind = proc->kind;
    event->status = STATUS_OK;
    event->count = 0;
    if (proc->kind == RUNTIME_PYTHON)
        python_walk(proc, event, tid);
    else if (proc->kind == RUNTIME_RUBY)
        ruby_walk(proc, event, tid);
    bpf_ringbuf_submit(event, ring_wakeup(&interp_events));
    return 1;
}

// At a CPU sample: whether the thread's interpreter stack was read (the sample then goes
// to the ring as well).
static int interp_sample(__u32 tgid, __u32 tid)
{
    return interp_read(tgid, tid, bpf_ktime_get_ns());
}
