#![no_main]
//! Recording rules as the API takes them (JSON from any client) and as the outbox stores
//! series: parsed and checked, never a panic.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(spec) = serde_json::from_slice::<kiln_rules::rule::RuleSpec>(data) {
        if let Ok(rule) = spec.compile() {
            let _ = kiln_rules::eval::series_labels(&rule, |_| Some("x"));
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = kiln_rules::eval::parse_series_key(text);
    }
});
