#![no_main]
//! Prometheus label selectors from query strings.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = kiln_model::selector::parse(text);
    }
});
