#![no_main]
//! The agent's parsers of bytes it does not control: perf ring records (samples with their
//! register and stack copies, mmap, comm, fork, exit, lost), a binary's `.eh_frame_hdr`,
//! the BPF rings' interpreter and off-CPU events, and CPython's location tables.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kiln_fuzz::targets::agent_records(data));
