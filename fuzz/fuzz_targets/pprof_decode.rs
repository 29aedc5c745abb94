#![no_main]
//! pprof bytes (gzip or plain) through decode, validation and conversion to series.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = kiln_ingest::Limits::default();
    let context = kiln_ingest::parse::ProfileContext::default();
    if let Ok(parsed) = kiln_ingest::parse::from_pprof_bytes(data, context, &limits) {
        let mut builder = kiln_storage::DatasetBuilder::new("t", parsed.service());
        builder.add_pprof(&kiln_storage::dataset::PprofInput {
            profile: &parsed.profile,
            index: &parsed.index,
            id: &parsed.id,
            time_nanos: parsed.time_nanos,
            duration_nanos: parsed.duration_nanos,
            labels: &parsed.labels,
            types: &parsed.types,
            max_stack_depth: 1000,
        });
        let dataset = builder.finish();
        assert!(dataset.check().is_ok());
    }
});
