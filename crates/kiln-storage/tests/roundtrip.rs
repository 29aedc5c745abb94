use bytes::Bytes;
use kiln_model::labels::Labels;
use kiln_model::pprof::{
    self, Function, Line, Location, Profile, ProfileLimits, Sample, Samples, ValueType,
};
use kiln_model::ProfileType;
use kiln_storage::builder::{PprofInput, TypePlan};
use kiln_storage::format::{
    decode_dataset, encode_block, encode_block_as, BlockEncoding, Projection,
};
use kiln_storage::DatasetBuilder;

fn profile() -> Profile {
    let strings = [
        "",
        "samples",
        "count",
        "cpu",
        "nanoseconds",
        "main",
        "work",
        "span_id",
        "abc",
        "region",
        "eu",
    ];
    let function = |id: u64, name: i64| Function {
        id,
        name,
        ..Default::default()
    };
    let location = |id: u64, function_id: u64| Location {
        id,
        line: kiln_model::pprof::lines![Line {
            function_id,
            line: id as i64,
            column: 0,
        }],
        ..Default::default()
    };
    let label = |key: i64, str: i64| pprof::Label {
        key,
        str,
        ..Default::default()
    };
    Profile {
        sample_type: vec![
            ValueType { r#type: 1, unit: 2 },
            ValueType { r#type: 3, unit: 4 },
        ],
        sample: [
            Sample {
                location_id: &[2, 1],
                value: &[1, 10],
                label: &[],
            },
            Sample {
                location_id: &[2, 1],
                value: &[2, 20],
                label: &[],
            },
            Sample {
                location_id: &[1],
                value: &[0, 5],
                label: &[label(7, 8)],
            },
            Sample {
                location_id: &[2, 1],
                value: &[3, 30],
                label: &[label(9, 10)],
            },
        ]
        .into_iter()
        .collect(),
        location: vec![location(1, 1), location(2, 2)],
        function: vec![function(1, 5), function(2, 6)],
        string_table: strings.iter().collect(),
        period: 10_000_000,
        ..Default::default()
    }
}

#[test]
fn builder_interns_and_block_round_trips() {
    let profile = profile();
    let index = pprof::validate(&profile, &ProfileLimits::default()).unwrap();
    let labels = Labels::from_pairs([("service_name", "svc")]);
    let types = vec![
        TypePlan {
            value_index: 0,
            profile_type: ProfileType::parse("process_cpu:samples:count:cpu:nanoseconds").unwrap(),
            scale: None,
        },
        TypePlan {
            value_index: 1,
            profile_type: ProfileType::parse("process_cpu:cpu:nanoseconds:cpu:nanoseconds")
                .unwrap(),
            scale: None,
        },
    ];
    let mut builder = DatasetBuilder::new("tenant", "svc");
    for (id, time) in [("p1", 1_000), ("p2", 2_000)] {
        builder.add_pprof(&PprofInput {
            profile: &profile,
            index: &index,
            id,
            time_nanos: time,
            duration_nanos: 10,
            labels: &labels,
            types: &types,
            max_stack_depth: 1000,
            sample_labels_per_sample: false,
        });
    }
    let dataset = builder.finish();
    dataset.check().unwrap();
    // Two functions, two locations, stacks main and main;work: stored once for both profiles.
    assert_eq!(dataset.functions.len(), 2);
    assert_eq!(dataset.location_mapping.len(), 2);
    assert_eq!(dataset.stack_parent.len(), 3);
    // Series: 2 types x (no extra label, region=eu) = 4.
    assert_eq!(dataset.series.len(), 4);
    // Profiles: per id, 2 types for the plain group + 2 for region=eu = 8 rows.
    assert_eq!(dataset.profiles.len(), 8);
    let total: i64 = dataset.sample_value.iter().sum();
    assert_eq!(total, 2 * (1 + 2 + 3 + 10 + 20 + 5 + 30));
    // The two unlabelled main;work samples are one row per profile, their values summed:
    // per id, cpu {main;work 30, main 5 with span_id}, samples {main;work 3} and the two
    // region=eu rows; the zero-valued sample is dropped.
    assert_eq!(dataset.sample_value.len(), 2 * 5);
    assert!(dataset.sample_value.contains(&30) && dataset.sample_value.contains(&3));
    // The span_id sample keeps its label per sample.
    assert_eq!(dataset.sample_label_sample.len(), 2);
    assert_eq!(
        (dataset.min_time_nanos, dataset.max_time_nanos),
        (1_000, 2_000)
    );

    let other = DatasetBuilder::new("tenant", "other").finish();
    let block = Bytes::from(encode_block(&[dataset.clone(), other.clone()]).unwrap());
    assert_eq!(decode_dataset(&block, 0, Projection::ALL).unwrap(), dataset);
    assert_eq!(decode_dataset(&block, 1, Projection::ALL).unwrap(), other);
    // Compacted blocks choose other encodings per column; the data is the same.
    let compacted = Bytes::from(
        encode_block_as(&[dataset.clone(), other.clone()], BlockEncoding::Compacted).unwrap(),
    );
    assert_ne!(compacted, block);
    assert_eq!(
        decode_dataset(&compacted, 0, Projection::ALL).unwrap(),
        dataset
    );
    assert_eq!(
        decode_dataset(&compacted, 1, Projection::ALL).unwrap(),
        other
    );
    // docs/FORMAT.md: segments uncompressed (no codec work for pages read once),
    // compacted blocks zstd but for chunks of at most `SMALL_CHUNK_BYTES` (all of this
    // small dataset's).
    let codecs = |bytes: &Bytes| {
        use parquet::file::reader::FileReader;
        let reader = parquet::file::reader::SerializedFileReader::new(bytes.clone()).unwrap();
        let metadata = reader.metadata();
        metadata
            .row_groups()
            .iter()
            .flat_map(|group| group.columns().iter().map(|column| column.compression()))
            .collect::<Vec<_>>()
    };
    assert!(!codecs(&block).is_empty());
    assert!(codecs(&block)
        .iter()
        .all(|codec| *codec == parquet::basic::Compression::UNCOMPRESSED));
    assert!(codecs(&compacted)
        .iter()
        .all(|codec| *codec == parquet::basic::Compression::UNCOMPRESSED));
    let index_only = decode_dataset(&block, 0, Projection::INDEX).unwrap();
    assert!(index_only.sample_value.is_empty());
    assert_eq!(index_only.profiles, dataset.profiles);
    assert!(decode_dataset(&block, 2, Projection::ALL).is_err());
    assert!(decode_dataset(
        &Bytes::from_static(b"not parquet at all"),
        0,
        Projection::ALL
    )
    .is_err());
}

#[test]
fn deep_stacks_are_truncated_at_the_root() {
    let mut profile = profile();
    profile.sample = Samples::default();
    profile.sample.push(&[2, 1, 2, 1, 2, 1], &[1, 1], &[]);
    let index = pprof::validate(&profile, &ProfileLimits::default()).unwrap();
    let labels = Labels::from_pairs([("service_name", "svc")]);
    let types = vec![TypePlan {
        value_index: 0,
        profile_type: ProfileType::parse("a:b:c:d:e").unwrap(),
        scale: None,
    }];
    let mut builder = DatasetBuilder::new("t", "svc");
    builder.add_pprof(&PprofInput {
        profile: &profile,
        index: &index,
        id: "x",
        time_nanos: 0,
        duration_nanos: 0,
        labels: &labels,
        types: &types,
        max_stack_depth: 3,
        sample_labels_per_sample: false,
    });
    let dataset = builder.finish();
    // Depth 3: two leaf frames kept and a [truncated] root.
    assert_eq!(dataset.stack_parent.len(), 4);
    let root_location = dataset.stack_location[1] as usize;
    let function = dataset.line_function[dataset.location_line_offsets()[root_location] as usize];
    assert_eq!(
        dataset.string(dataset.functions[function as usize].name),
        "[truncated]"
    );
}
