//! A builder kept warm across flushes (`DatasetBuilder::take_dataset`) must write, flush
//! after flush, the same profiles a fresh builder writes, with no symbol of another flush;
//! and what a builder holds while its profiles wait for their flush must not grow past
//! what they use.

use std::collections::BTreeMap;

use crate::builder::{PprofInput, TypePlan};
use crate::testing::cpu_profile;
use crate::{Dataset, DatasetBuilder};
use kiln_model::labels::Labels;
use kiln_model::pprof::{self, Profile, ProfileLimits};
use kiln_model::ProfileType;

/// A frame resolved to its text: mapping file, build id, address, and its lines as
/// (function, system name, file, start line, line).
type Frame = (String, String, u64, Vec<(String, String, String, i64, i64)>);
/// A profile's key: id, type, time and series labels.
type ProfileKey = (Vec<u8>, String, i64, Vec<(String, String)>);
/// Its samples: the stack (root first) and sample labels, to the summed value.
type Samples = BTreeMap<(Vec<Frame>, Vec<(String, String)>), i64>;

/// The dataset's profiles with every id resolved, so that datasets numbering the same
/// symbols differently compare equal.
fn resolved(dataset: &Dataset) -> BTreeMap<ProfileKey, Samples> {
    dataset.check().expect("the dataset is consistent");
    let text = |id: u32| dataset.strings[id as usize].to_string();
    let line_offsets = dataset.location_line_offsets();
    let frame = |location: usize| -> Frame {
        let mapping = &dataset.mappings[dataset.location_mapping[location] as usize];
        let lines = (line_offsets[location]..line_offsets[location + 1])
            .map(|line| {
                let line = line as usize;
                let function = &dataset.functions[dataset.line_function[line] as usize];
                (
                    text(function.name),
                    text(function.system_name),
                    text(function.filename),
                    function.start_line,
                    dataset.line_number[line],
                )
            })
            .collect();
        (
            text(mapping.filename),
            text(mapping.build_id),
            dataset.location_address[location],
            lines,
        )
    };
    let stack = |mut node: usize| -> Vec<Frame> {
        let mut frames = Vec::new();
        while node != 0 {
            frames.push(frame(dataset.stack_location[node] as usize));
            node = dataset.stack_parent[node] as usize;
        }
        frames.reverse();
        frames
    };
    let offsets = dataset.profile_sample_offsets();
    let mut profiles = BTreeMap::new();
    for (index, row) in dataset.profiles.iter().enumerate() {
        let series = &dataset.series[row.series as usize];
        let key = (
            row.id.clone(),
            text(series.profile_type),
            row.time_nanos,
            series
                .labels
                .iter()
                .map(|(name, value)| (text(*name), text(*value)))
                .collect(),
        );
        let samples: &mut Samples = profiles.entry(key).or_default();
        for sample in offsets[index]..offsets[index + 1] {
            let labels = (0..dataset.sample_label_sample.len())
                .filter(|label| dataset.sample_label_sample[*label] == sample)
                .map(|label| {
                    (
                        text(dataset.sample_label_name[label]),
                        text(dataset.sample_label_value[label]),
                    )
                })
                .collect();
            let sample = sample as usize;
            *samples
                .entry((stack(dataset.sample_stack[sample] as usize), labels))
                .or_default() += dataset.sample_value[sample];
        }
    }
    profiles
}

fn fixture(name: &str) -> Profile {
    let path = format!("{}/../../testdata/{name}", env!("CARGO_MANIFEST_DIR"));
    let gzip = std::fs::read(&path).expect("the fixture is in the repository");
    let raw = kiln_model::compress::gunzip_bounded(&gzip, 64 << 20).expect("gzip");
    pprof::decode(&raw, 64 << 20).expect("pprof")
}

/// One profile added to a builder as the write path adds it, every sample type kept;
/// with `true`, its string sample labels stay with the samples instead of selecting
/// series.
struct Add<'a>(&'a str, &'a Profile, bool);

fn add(builder: &mut DatasetBuilder, what: &Add<'_>) {
    let Add(id, profile, per_sample) = what;
    let index = pprof::validate(profile, &ProfileLimits::default()).expect("valid");
    let types: Vec<TypePlan> = profile
        .sample_type
        .iter()
        .enumerate()
        .map(|(value_index, sample_type)| TypePlan {
            value_index,
            profile_type: ProfileType::parse(&format!(
                "test:{}:{}:cpu:nanoseconds",
                profile.string_or_empty(sample_type.r#type),
                profile.string_or_empty(sample_type.unit)
            ))
            .expect("profile type"),
            scale: None,
        })
        .collect();
    builder.add_pprof(&PprofInput {
        profile,
        index: &index,
        id,
        time_nanos: 1_000,
        duration_nanos: 10,
        labels: &Labels::from_pairs([("service_name", "svc")]),
        types: &types,
        max_stack_depth: 64,
        sample_labels_per_sample: *per_sample,
    });
}

#[test]
fn a_warm_builder_writes_each_flush_as_a_fresh_one_would() {
    let cpu = fixture("pprof-report-sample.cpu.pb.gz");
    let labelled = fixture("parca-profile-with-labels.pb.gz");
    let many = fixture("parca-many-1644509275338070000.pb.gz");
    let many_later = fixture("parca-many-1644509272337470000.pb.gz");
    let alloc = fixture("parca-alloc_objects.pb.gz");
    let spans = cpu_profile(
        2_000,
        &[
            (&["work", "main"], 5, &[("span_id", "s1")]),
            (&["main"], 2, &[]),
        ],
    );
    let other_spans = cpu_profile(2_000, &[(&["work", "main"], 3, &[("span_id", "s2")])]);
    let flushes: Vec<Vec<Add<'_>>> = vec![
        vec![Add("a", &cpu, false), Add("b", &many, false)],
        // Known symbols again, with new ones, and labels that select series.
        vec![Add("c", &many_later, false), Add("d", &labelled, false)],
        // Known symbols only, and per-sample labels.
        vec![Add("e", &cpu, false), Add("f", &spans, true)],
        vec![Add("g", &alloc, false), Add("h", &other_spans, true)],
        // Nothing new at all.
        vec![Add("i", &many, false)],
    ];
    let mut warm = DatasetBuilder::new("tenant", "svc");
    for (number, flush) in flushes.iter().enumerate() {
        let mut fresh = DatasetBuilder::new("tenant", "svc");
        for what in flush {
            add(&mut warm, what);
            add(&mut fresh, what);
        }
        let taken = warm.take_dataset();
        let rows = taken.used_rows;
        assert_eq!(taken.warm, number > 0);
        if number == flushes.len() - 1 {
            assert_eq!(taken.new_rows, 0, "the last flush brought nothing new");
        } else {
            assert!(taken.new_rows > 0, "flush {number} brought new symbols");
        }
        let taken = taken.dataset;
        let cold = fresh.finish();
        assert_eq!(resolved(&taken), resolved(&cold), "flush {number}");
        assert!(!resolved(&taken).is_empty());
        assert_eq!(taken.profiles.len(), cold.profiles.len(), "flush {number}");
        // Only this flush's symbols: never more than a fresh builder holds (it interns
        // a pprof's whole string table, so it may hold more strings).
        assert!(taken.strings.len() <= cold.strings.len(), "flush {number}");
        assert!(
            taken.functions.len() <= cold.functions.len(),
            "flush {number}"
        );
        assert!(taken.location_address.len() <= cold.location_address.len());
        assert!(
            taken.stack_parent.len() <= cold.stack_parent.len(),
            "flush {number}"
        );
        assert!(taken.series.len() <= cold.series.len(), "flush {number}");
        assert!(rows <= warm.symbol_rows(), "flush {number}");
        assert!(warm.is_empty(), "the profiles went with the dataset");
    }
    // The tables stayed warm: the last flush found every symbol known.
    let before = warm.symbol_rows();
    add(&mut warm, &Add("j", &many, false));
    assert_eq!(warm.symbol_rows(), before);
}

#[test]
fn an_empty_warm_builder_takes_an_empty_dataset() {
    let mut warm = DatasetBuilder::new("tenant", "svc");
    add(
        &mut warm,
        &Add("a", &fixture("parca-two-stacks.pb.gz"), false),
    );
    let first = warm.take_dataset().dataset;
    assert!(!first.profiles.is_empty());
    let taken = warm.take_dataset();
    let (second, rows) = (taken.dataset, taken.used_rows);
    assert_eq!((taken.warm, taken.new_rows), (true, 0));
    assert!(second.profiles.is_empty());
    second.check().expect("consistent");
    // The sentinels: the empty string, "no mapping", the root node, the empty label set.
    assert_eq!(rows, 4);
    assert_eq!((second.min_time_nanos, second.max_time_nanos), (0, 0));
}

/// A pprof whose samples carry series labels is split into a profile per label set. Each
/// once reserved room for every sample of the pprof: ten sets held ten times the samples.
#[test]
fn samples_split_by_series_labels_are_held_once() {
    let shards: Vec<String> = (0..1_000)
        .map(|index| format!("shard-{}", index % 10))
        .collect();
    let spans: Vec<String> = (0..1_000).map(|index| format!("span-{index}")).collect();
    let labels = |sharded: bool| -> Vec<Vec<(&str, &str)>> {
        (0..1_000)
            .map(|index| {
                let mut labels = vec![("span_id", spans[index].as_str())];
                if sharded {
                    labels.push(("shard", shards[index].as_str()));
                }
                labels
            })
            .collect()
    };
    let held = |sharded: bool| {
        let labels = labels(sharded);
        let samples: Vec<crate::testing::TestSample<'_>> = labels
            .iter()
            .map(|labels| (&["work", "main"][..], 1, labels.as_slice()))
            .collect();
        let profile = cpu_profile(2_000, &samples);
        assert_eq!(profile.sample.len(), 1_000);
        let mut builder = DatasetBuilder::new("tenant", "svc");
        add(&mut builder, &Add("a", &profile, false));
        builder.heap_bytes()
    };
    let (one_set, ten_sets) = (held(false), held(true));
    // Ten series of 100 samples each against one of 1,000: the same 16 KB of samples,
    // and a little more for the ten series and their label values.
    assert!(
        ten_sets < one_set + 16 * 1024,
        "{ten_sets} bytes held for ten series against {one_set} for one"
    );
}

/// A warm builder knows the next profile's symbols: adding it grows the builder by its
/// samples (1.4 KB here), not by another copy of its tables (38 KB, when a batch's first
/// profile reserved room for all its symbols again).
#[test]
fn a_known_profile_does_not_grow_warm_tables() {
    let profile = fixture("parca-many-1644509275338070000.pb.gz");
    let mut builder = DatasetBuilder::new("tenant", "svc");
    let empty = builder.heap_bytes();
    add(&mut builder, &Add("a", &profile, false));
    let first = builder.heap_bytes() - empty;
    builder.take_dataset();
    let warm = builder.heap_bytes();
    add(&mut builder, &Add("b", &profile, false));
    let grown = builder.heap_bytes() - warm;
    assert!(
        grown < first / 8,
        "the second flush's profile grew the builder by {grown} bytes, the first by {first}"
    );
}

/// A location's lines are counted as the heap they take: nothing when the one line fits in
/// the row, and the spilled vector when a location holds inlined frames. The estimate
/// once counted 32 bytes for every location, inlined or not.
#[test]
fn only_inlined_frames_count_heap_for_their_lines() {
    let names: Vec<String> = (0..200).map(|index| format!("f{index}")).collect();
    let frames: Vec<[&str; 2]> = names
        .chunks(2)
        .map(|pair| [pair[0].as_str(), pair[1].as_str()])
        .collect();
    let samples: Vec<crate::testing::TestSample<'_>> = frames
        .iter()
        .map(|frames| (&frames[..], 1, &[][..]))
        .collect();
    let single = cpu_profile(2_000, &samples);
    assert_eq!(single.location.len(), 200);
    // The same frames, each with a second line of its own function (an inlined call).
    let mut inlined = single.clone();
    for location in &mut inlined.location {
        let line = location.line[0];
        location.line.push(pprof::Line {
            line: line.line + 1,
            ..line
        });
    }
    let held = |profile: &Profile| {
        let mut builder = DatasetBuilder::new("tenant", "svc");
        add(&mut builder, &Add("a", profile, false));
        builder.heap_bytes()
    };
    let (single, inlined) = (held(&single), held(&inlined));
    let spilled = 200 * 2 * std::mem::size_of::<(u32, i64)>();
    assert!(
        inlined >= single + spilled,
        "{inlined} bytes held with inlined frames against {single} without"
    );
}
