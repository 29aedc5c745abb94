#![no_main]
//! Pyroscope PushRequest bodies, protobuf and JSON, and the profiles inside.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kiln_fuzz::targets::push_decode(data));
