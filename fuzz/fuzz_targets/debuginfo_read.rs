#![no_main]
//! Debug files as uploads and debuginfod bring them: ELF, DWARF, compressed sections.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kiln_fuzz::targets::debuginfo_read(data));
