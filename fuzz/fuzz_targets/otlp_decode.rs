#![no_main]
//! OTLP profiles export requests, protobuf and JSON, through conversion and into a dataset.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // No retention: random times would otherwise stop most inputs before the builder.
    let limits = kiln_ingest::Limits {
        retention_days: 0,
        ..Default::default()
    };
    let requests = [
        kiln_ingest::otlp::decode_proto(data).ok(),
        kiln_ingest::otlp::decode_json(data).ok(),
    ];
    for request in requests.into_iter().flatten() {
        let Ok(export) = kiln_ingest::otlp::parse_export(request, data.len(), &limits) else {
            continue;
        };
        for parsed in &export.profiles {
            let mut builder = kiln_storage::DatasetBuilder::new("t", parsed.service());
            builder.add_pprof(&parsed.input(1000));
            assert!(builder.finish().check().is_ok());
        }
    }
});
