#![no_main]
//! The agent's parsers of bytes it does not control: perf ring records (samples with their
//! register and stack copies, mmap, comm, fork, exit, lost) and a binary's `.eh_frame_hdr`.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kiln_fuzz::targets::agent_records(data));
