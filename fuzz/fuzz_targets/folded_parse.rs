#![no_main]
//! Collapsed-stack text, and the pprof it becomes; the pprof must pass validation.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(stacks) = kiln_model::folded::parse(data, 16_000) {
        let profile_type = kiln_model::profile_type::default_legacy_type().profile_type;
        let profile = kiln_model::folded::to_pprof(&stacks, &profile_type);
        assert!(kiln_model::pprof::validate(&profile, &Default::default()).is_ok());
    }
});
