#![no_main]
//! The write-ahead log's files as recovery reads them back, through staging.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kiln_fuzz::targets::wal_records(data));
