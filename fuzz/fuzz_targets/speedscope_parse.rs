#![no_main]
//! speedscope JSON (sampled and evented profiles) into a pprof.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(parsed) = kiln_model::speedscope::parse(data, "cpu", 16_000) {
        assert!(kiln_model::pprof::validate(&parsed.profile, &Default::default()).is_ok());
    }
});
