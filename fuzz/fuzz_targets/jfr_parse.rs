#![no_main]
//! JFR recordings: chunk headers, metadata, constant pools and events, into pprofs.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kiln_fuzz::targets::jfr_parse(data));
