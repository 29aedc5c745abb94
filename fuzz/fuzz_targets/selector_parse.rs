#![no_main]
//! Prometheus label selectors from query strings.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kiln_fuzz::targets::selector_parse(data));
