//! A stable-toolchain complement to the `cargo fuzz` targets in `fuzz/`: real profiles,
//! mutated deterministically (bit flips, truncation, splices, varint garbage), through
//! every parser. Each input must be accepted or refused with an error, never a panic, and
//! whatever is accepted must build a dataset that passes its own consistency check.

use kiln_ingest::parse::{from_pprof_bytes, ProfileContext};
use kiln_ingest::Limits;
use kiln_storage::DatasetBuilder;

struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound.max(1) as u64) as usize
    }
}

fn fixtures() -> Vec<Vec<u8>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata");
    [
        "parca-two-stacks.pb.gz",
        "pprof-report-sample.cpu.pb.gz",
        "profefe-collector_heap_1.prof",
        "parca-profile-with-labels.pb.gz",
    ]
    .iter()
    .map(|name| {
        let bytes = std::fs::read(dir.join(name)).expect("fixture");
        kiln_model::compress::maybe_gunzip(&bytes, 1 << 30)
            .expect("gunzip")
            .into_owned()
    })
    .collect()
}

fn mutate(random: &mut Random, input: &[u8]) -> Vec<u8> {
    let mut data = input.to_vec();
    match random.below(5) {
        0 => {
            for _ in 0..1 + random.below(8) {
                let index = random.below(data.len());
                data[index] ^= 1 << random.below(8);
            }
        }
        1 => data.truncate(random.below(data.len())),
        2 => {
            let start = random.below(data.len());
            let end = (start + random.below(64)).min(data.len());
            let chunk = data[start..end].to_vec();
            let at = random.below(data.len());
            data.splice(at..at, chunk);
        }
        3 => {
            // Large varints where lengths and ids live.
            let index = random.below(data.len());
            data.splice(index..index, [0xff, 0xff, 0xff, 0xff, 0x0f]);
        }
        _ => {
            let index = random.below(data.len());
            data[index] = random.next() as u8;
        }
    }
    data
}

/// The fixtures' recording times are years old: no retention in these tests.
fn limits() -> Limits {
    Limits {
        retention_days: 0,
        ..Limits::default()
    }
}

#[test]
fn mutated_profiles_never_panic() {
    let limits = limits();
    let mut random = Random(0x9e37_79b9_7f4a_7c15);
    let mut accepted = 0;
    let mut refused = 0;
    for input in fixtures() {
        for _ in 0..1500 {
            let data = mutate(&mut random, &input);
            match from_pprof_bytes(&data, ProfileContext::default(), &limits) {
                Ok(parsed) => {
                    accepted += 1;
                    let mut builder = DatasetBuilder::new("t", parsed.service());
                    builder.add_pprof(&parsed.input(1000));
                    let dataset = builder.finish();
                    dataset
                        .check()
                        .expect("accepted profiles build consistent datasets");
                    let block = bytes::Bytes::from(
                        kiln_storage::format::encode_block(std::slice::from_ref(&dataset)).unwrap(),
                    );
                    let decoded = kiln_storage::format::decode_dataset(
                        &block,
                        0,
                        kiln_storage::format::Projection::ALL,
                    )
                    .unwrap();
                    assert_eq!(decoded, dataset);
                }
                Err(_) => refused += 1,
            }
        }
    }
    // Both outcomes must occur, or the mutations are not exercising anything.
    assert!(
        accepted > 100 && refused > 100,
        "accepted {accepted}, refused {refused}"
    );
}

#[test]
fn mutated_text_inputs_never_panic() {
    let mut random = Random(42);
    let seeds: [&[u8]; 4] = [
        b"main;work;leaf 10\nmain;idle 3\n",
        br#"process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name="a", x=~"b.*", y!="\u00e9"}"#,
        b"app.cpu{env=prod,region=eu-west}",
        br#"{"series":[{"labels":[{"name":"service_name","value":"a"}],"samples":[{"rawProfile":"AQID","ID":"x"}]}]}"#,
    ];
    for seed in seeds {
        for _ in 0..2000 {
            let data = mutate(&mut random, seed);
            let _ = kiln_model::folded::parse(&data, 16_000);
            let _ = kiln_ingest::push::decode_json(&data);
            let _ = kiln_ingest::push::decode_proto(&data);
            if let Ok(text) = std::str::from_utf8(&data) {
                let _ = kiln_model::selector::parse(text);
                let _ = kiln_ingest::pyroscope::parse_name(text);
                let _ = kiln_ingest::profefe::parse_labels(text);
                let _ = kiln_model::time::parse_time_nanos(text, 0);
            }
        }
    }
}

#[test]
fn mutated_blocks_are_errors_not_panics() {
    let input = fixtures().remove(1);
    let parsed = from_pprof_bytes(&input, ProfileContext::default(), &limits()).unwrap();
    let mut builder = DatasetBuilder::new("t", "s");
    builder.add_pprof(&parsed.input(1000));
    let dataset = builder.finish();
    // Both encodings: segments (plain) and compacted blocks (byte-stream-split, delta).
    for encoding in [
        kiln_storage::format::BlockEncoding::Segment,
        kiln_storage::format::BlockEncoding::Compacted,
    ] {
        let block = kiln_storage::format::encode_block_as(std::slice::from_ref(&dataset), encoding)
            .unwrap();
        let mut random = Random(7);
        for _ in 0..3000 {
            let data = bytes::Bytes::from(mutate(&mut random, &block));
            if let Ok(dataset) = kiln_storage::format::decode_dataset(
                &data,
                0,
                kiln_storage::format::Projection::ALL,
            ) {
                let _ = dataset.check();
            }
        }
    }
}

#[test]
fn mutated_otlp_speedscope_and_perf_script_never_panic() {
    let limits = limits();
    let fixture = fixtures().remove(3);
    let profile = kiln_model::pprof::decode(&fixture, 1 << 30).unwrap();
    let otlp = prost::Message::encode_to_vec(&kiln_ingest::otlp::request_from_pprof(
        &profile,
        &[("service.name", "mutated")],
        0,
    ));
    let speedscope: &[u8] = br#"{"shared": {"frames": [{"name": "main", "file": "a.py", "line": 1}, {"name": "work"}]},
        "profiles": [{"type": "sampled", "name": "t", "unit": "seconds", "startValue": 0, "endValue": 1,
                      "samples": [[0, 1], [0]], "weights": [0.5, 0.25]},
                     {"type": "evented", "name": "u", "unit": "milliseconds", "startValue": 0, "endValue": 9,
                      "events": [{"type": "O", "frame": 0, "at": 0}, {"type": "O", "frame": 1, "at": 1},
                                 {"type": "C", "frame": 1, "at": 4}, {"type": "C", "frame": 0, "at": 8}]}]}"#;
    let perf_script: &[u8] = b"prog 12/13 [001] 100.5: 250000 cpu-clock:pppH: \n\
        \t 4005d0 hot+0x10 (/bin/prog)\n\t 400600 main+0x20 (/bin/prog)\n\n\
        prog 12/13 [000] 100.6: 250000 cpu-clock:pppH: \n\t 7f00 [unknown] (/lib/libc.so.6)\n\n";
    let mut random = Random(99);
    let mut accepted = 0;
    for _ in 0..2000 {
        let data = mutate(&mut random, &otlp);
        // The flat reader the server uses, checked against prost's derived decoder: the
        // same inputs refused, and the same pprofs made from the rest.
        let flat = kiln_ingest::otlp::parse_export_proto(&data, data.len(), &limits);
        let derived = kiln_ingest::otlp::decode_proto(&data)
            .and_then(|request| kiln_ingest::otlp::parse_export(request, data.len(), &limits));
        match (&flat, &derived) {
            (Ok(flat), Ok(derived)) => {
                assert_eq!(flat.profiles.len(), derived.profiles.len());
                assert_eq!(flat.rejected_profiles, derived.rejected_profiles);
                // (Times are compared only where the request set them: otherwise each
                // path stamps its own arrival.)
                for (a, b) in flat.profiles.iter().zip(&derived.profiles) {
                    assert!(
                        a.profile == b.profile,
                        "the two readers made different pprofs"
                    );
                    assert_eq!(a.labels, b.labels);
                    assert_eq!(a.duration_nanos, b.duration_nanos);
                }
            }
            (Err(_), Err(_)) => {}
            (flat, derived) => panic!(
                "flat reader {:?}, prost {:?}",
                flat.as_ref().map(|_| "accepted"),
                derived.as_ref().map(|_| "accepted")
            ),
        }
        if let Ok(export) = flat {
            for parsed in &export.profiles {
                accepted += 1;
                let mut builder = DatasetBuilder::new("t", parsed.service());
                builder.add_pprof(&parsed.input(1000));
                builder.finish().check().expect("consistent dataset");
            }
        }
    }
    assert!(accepted > 100, "{accepted} mutated OTLP profiles accepted");
    for seed in [speedscope, perf_script] {
        for _ in 0..2000 {
            let data = mutate(&mut random, seed);
            if let Ok(parsed) = kiln_model::speedscope::parse(&data, "cpu", 16_000) {
                kiln_model::pprof::validate(&parsed.profile, &Default::default()).unwrap();
            }
            if let Ok(profile) = kiln_model::perf_script::parse(&data, 16_000) {
                kiln_model::pprof::validate(&profile, &Default::default()).unwrap();
            }
            let _ = kiln_ingest::otlp::decode_json(&data);
        }
    }
}
