#![no_main]
//! OTLP profiles export requests, protobuf and JSON, through conversion and into a dataset.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kiln_fuzz::targets::otlp_decode(data));
