#![no_main]
//! Time arguments: now-1h, epochs, RFC 3339.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kiln_fuzz::targets::time_parse(data));
