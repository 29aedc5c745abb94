#![no_main]
//! `perf script` text into a pprof.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kiln_fuzz::targets::perf_script_parse(data));
