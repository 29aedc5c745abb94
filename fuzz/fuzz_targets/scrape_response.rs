#![no_main]
//! What a scrape target or an HTTP SD server may answer: the first half of the input as a
//! profile, taken twice through the delta state (baseline, then delta against a second
//! profile from the other half), and the whole input as HTTP SD target groups and as
//! relabel rules.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kiln_fuzz::targets::scrape_response(data));
