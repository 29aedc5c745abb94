#![no_main]
//! Collapsed-stack text.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = kiln_model::folded::parse(data, 16_000);
});
