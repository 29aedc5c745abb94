#![no_main]
//! `source.url_template` filled with a writer's service and file names.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kiln_fuzz::targets::source_url(data));
