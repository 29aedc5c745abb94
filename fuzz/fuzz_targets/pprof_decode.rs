#![no_main]
//! pprof bytes (gzip or plain) through decode, validation and conversion to series.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kiln_fuzz::targets::pprof_decode(data));
