#![no_main]
//! Collapsed-stack text, and the pprof it becomes; the pprof must pass validation.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kiln_fuzz::targets::folded_parse(data));
