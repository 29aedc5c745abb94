#![no_main]
//! What one query node returns to another for a share of a split query, and the share's
//! request.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kiln_fuzz::targets::partial_tree(data));
