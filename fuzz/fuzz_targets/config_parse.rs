#![no_main]
//! The server's YAML config file (every section), and the checks run on it at start-up.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kiln_fuzz::targets::config_parse(data));
