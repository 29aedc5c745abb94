#![no_main]
//! speedscope JSON (sampled and evented profiles) into a pprof.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kiln_fuzz::targets::speedscope_parse(data));
