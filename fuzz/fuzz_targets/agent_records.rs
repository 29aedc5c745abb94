#![no_main]
//! The agent's parsers of bytes it does not control: perf ring records (samples with their
//! register and stack copies, mmap, comm, fork, exit, lost) and a binary's `.eh_frame_hdr`.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = kiln_agent::perf::parse_timed(data);
    let _ = kiln_agent::perf::parse_record(data);
    let _ = kiln_agent::unwind::function_starts(0x1000, data);
});
