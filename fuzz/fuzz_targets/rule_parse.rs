#![no_main]
//! Recording rules as the API takes them (JSON from any client) and as the outbox stores
//! series: parsed and checked, never a panic.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kiln_fuzz::targets::rule_parse(data));
