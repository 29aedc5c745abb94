#![no_main]
//! A Go binary's `.gopclntab` and the data its `moduledata` and inline trees are read from.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kiln_fuzz::targets::gosym_read(data));
