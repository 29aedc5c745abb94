#![no_main]
//! Comparisons as `POST /api/v1/compare` takes them (JSON from any client): parsed,
//! checked and resolved, and ranked over sums built from the bytes; never a panic.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kiln_fuzz::targets::compare_request(data));
