#![no_main]
//! profefe's `POST /api/0/profiles`: its query parameters (the input's first line) and its
//! pprof body (the rest).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kiln_fuzz::targets::profefe_parse(data));
