#![no_main]
//! The `name=app.suffix{k=v}` parameter and profefe's `labels=k=v,k=v`.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kiln_fuzz::targets::ingest_name(data));
