#![no_main]
//! pprof bytes (gzip or plain) through decode, validation and conversion to series.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // No retention: random times would otherwise stop most inputs before the builder.
    let limits = kiln_ingest::Limits {
        retention_days: 0,
        ..Default::default()
    };
    let context = kiln_ingest::parse::ProfileContext::default();
    if let Ok(parsed) = kiln_ingest::parse::from_pprof_bytes(data, context, &limits) {
        let mut builder = kiln_storage::DatasetBuilder::new("t", parsed.service());
        builder.add_pprof(&parsed.input(1000));
        let dataset = builder.finish();
        assert!(dataset.check().is_ok());
    }
});
