//! Merging is associative and order-free: however the same profiles are split into
//! datasets (blocks), and in whatever order, the merged flame graph, merged pprof and
//! series totals are the same. Random splits from a seeded generator, many cases.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use kiln_ingest::parse::{from_pprof, ProfileContext};
use kiln_ingest::{Limits, ParsedProfile};
use kiln_model::labels::Labels;
use kiln_model::pprof::Profile;
use kiln_query::pprof_export::merged_pprof;
use kiln_query::select::{aggregate, DatasetSelection, SelectRequest, TypeFilter};
use kiln_query::tree::{build_tree, FlameTree};
use kiln_storage::format::{decode_dataset, encode_block_as, BlockEncoding, Projection};
use kiln_storage::{Dataset, DatasetBuilder};

const FIXTURES: [&str; 5] = [
    "profefe-collector_cpu_1.prof",
    "pprof-report-sample.cpu.pb.gz",
    "parca-profile-with-labels.pb.gz",
    "parca-two-stacks.pb.gz",
    "profefe-collector_heap_1.prof",
];

/// xorshift64*: deterministic, so a failure names a reproducible case.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound as u64) as usize
    }
}

/// Every fixture three times, as different instances and times.
fn profiles() -> Vec<ParsedProfile> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata");
    let mut profiles = Vec::new();
    for copy in 0..3 {
        for (index, name) in FIXTURES.iter().enumerate() {
            let bytes = std::fs::read(root.join(name)).expect("fixture");
            let profile = kiln_model::pprof::decode(&bytes, 1 << 30).expect("pprof");
            let context = ProfileContext {
                labels: Labels::from_pairs([
                    ("service_name", "svc".to_string()),
                    ("instance", format!("i{copy}")),
                ]),
                time_nanos: Some(
                    1_700_000_000_000_000_000 + (copy * 10 + index as i64) * 1_000_000_000,
                ),
                ..Default::default()
            };
            profiles.push(
                from_pprof(
                    profile,
                    context,
                    bytes.len(),
                    &Limits {
                        // The fixtures' own times are years old.
                        retention_days: 0,
                        ..Limits::default()
                    },
                )
                .expect("valid"),
            );
        }
    }
    profiles
}

/// One dataset per group, each taken through a block's bytes and back.
fn datasets(profiles: &[ParsedProfile], groups: &[Vec<usize>]) -> Vec<Dataset> {
    groups
        .iter()
        .filter(|group| !group.is_empty())
        .map(|group| {
            let mut builder = DatasetBuilder::new("t", "svc");
            for index in group {
                builder.add_pprof(&profiles[*index].input(1_000));
            }
            round_trip(builder.finish())
        })
        .collect()
}

fn round_trip(dataset: Dataset) -> Dataset {
    round_trip_as(dataset, BlockEncoding::Segment, Projection::ALL)
}

fn round_trip_as(dataset: Dataset, encoding: BlockEncoding, projection: Projection) -> Dataset {
    let block = encode_block_as(&[dataset], encoding).expect("encodes");
    let dataset = decode_dataset(&bytes::Bytes::from(block), 0, projection).expect("decodes");
    dataset.check().expect("consistent");
    dataset
}

/// Both selections merge to the same flame tree and pprof for each type.
fn assert_same_merges(
    split: &[DatasetSelection],
    reference: &[DatasetSelection],
    type_ids: &[String],
    case: &str,
) {
    for id in type_ids {
        assert_eq!(
            tree_paths(&build_tree(split, id)),
            tree_paths(&build_tree(reference, id)),
            "{case}: flame tree of {id}"
        );
        assert_eq!(
            pprof_functions(&merged_pprof(split, std::slice::from_ref(id))),
            pprof_functions(&merged_pprof(reference, std::slice::from_ref(id))),
            "{case}: merged pprof of {id}"
        );
    }
}

fn select(datasets: Vec<Dataset>) -> Vec<DatasetSelection> {
    let request = SelectRequest {
        tenant: "t".into(),
        types: TypeFilter::Any,
        from_nanos: i64::MIN,
        to_nanos: i64::MAX,
        ..Default::default()
    };
    datasets
        .into_iter()
        .filter_map(|dataset| aggregate(Arc::new(dataset), &request))
        .collect()
}

fn selections(profiles: &[ParsedProfile], groups: &[Vec<usize>]) -> Vec<DatasetSelection> {
    select(datasets(profiles, groups))
}

/// Compaction's merge: the datasets of `groups`, merged into one by symbol remapping.
fn compacted(profiles: &[ParsedProfile], groups: &[Vec<usize>]) -> Dataset {
    let mut builder = DatasetBuilder::new("t", "svc");
    for dataset in datasets(profiles, groups) {
        builder.add_dataset(&dataset);
    }
    round_trip(builder.finish())
}

/// A flame tree as path → (self, total), independent of node and name numbering.
fn tree_paths(tree: &FlameTree) -> BTreeMap<Vec<String>, (i64, i64)> {
    let mut paths: Vec<Vec<String>> = vec![Vec::new(); tree.nodes.len()];
    let mut out = BTreeMap::new();
    for (index, node) in tree.nodes.iter().enumerate().skip(1) {
        let mut path = paths[node.parent as usize].clone();
        path.push(tree.names[node.name as usize].clone());
        out.insert(path.clone(), (node.self_value, node.total));
        paths[index] = path;
    }
    out
}

/// Per function (flat, cum) of every sample type of a pprof.
fn pprof_functions(profile: &Profile) -> BTreeMap<(usize, String), (i64, i64)> {
    let name_of = |location_id: u32| -> Vec<String> {
        profile
            .location
            .iter()
            .find(|location| location.id == u64::from(location_id))
            .map(|location| {
                location
                    .line
                    .iter()
                    .map(|line| {
                        let function = profile
                            .function
                            .iter()
                            .find(|function| function.id == line.function_id);
                        function.map_or(String::new(), |f| profile.string_or_empty(f.name))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut out: BTreeMap<(usize, String), (i64, i64)> = BTreeMap::new();
    for sample in profile.sample.iter() {
        for (type_index, value) in sample.value.iter().enumerate() {
            let mut seen: Vec<String> = Vec::new();
            for (depth, location) in sample.location_id.iter().enumerate() {
                for (inline, name) in name_of(*location).into_iter().enumerate() {
                    let entry = out.entry((type_index, name.clone())).or_default();
                    if depth == 0 && inline == 0 {
                        entry.0 += value;
                    }
                    if !seen.contains(&name) {
                        entry.1 += value;
                        seen.push(name);
                    }
                }
            }
        }
    }
    out
}

#[test]
fn any_split_into_blocks_merges_to_the_same_result() {
    let profiles = profiles();
    let whole: Vec<Vec<usize>> = vec![(0..profiles.len()).collect()];
    let reference = selections(&profiles, &whole);
    let mut type_ids: Vec<String> = reference
        .iter()
        .flat_map(|selection| selection.types.iter().map(|(id, _)| id.clone()))
        .collect();
    type_ids.sort();
    type_ids.dedup();
    assert!(
        type_ids.len() >= 3,
        "fixtures cover several profile types: {type_ids:?}"
    );
    let expected_trees: Vec<_> = type_ids
        .iter()
        .map(|id| tree_paths(&build_tree(&reference, id)))
        .collect();
    let expected_pprofs: Vec<_> = type_ids
        .iter()
        .map(|id| pprof_functions(&merged_pprof(&reference, std::slice::from_ref(id))))
        .collect();
    let expected_totals: Vec<i64> = reference
        .iter()
        .flat_map(|s| s.profiles.iter())
        .map(|p| p.total)
        .collect();
    let expected_sum: i64 = expected_totals.iter().sum();

    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for case in 0..24 {
        // A random order, cut into 1..=6 random groups.
        let mut order: Vec<usize> = (0..profiles.len()).collect();
        for index in (1..order.len()).rev() {
            order.swap(index, rng.below(index + 1));
        }
        let group_count = 1 + rng.below(6);
        let mut groups = vec![Vec::new(); group_count];
        for index in order {
            groups[rng.below(group_count)].push(index);
        }
        let split = selections(&profiles, &groups);
        for (position, id) in type_ids.iter().enumerate() {
            assert_eq!(
                tree_paths(&build_tree(&split, id)),
                expected_trees[position],
                "case {case}: flame tree of {id} with groups {groups:?}"
            );
            assert_eq!(
                pprof_functions(&merged_pprof(&split, std::slice::from_ref(id))),
                expected_pprofs[position],
                "case {case}: merged pprof of {id} with groups {groups:?}"
            );
        }
        let sum: i64 = split
            .iter()
            .flat_map(|s| s.profiles.iter())
            .map(|p| p.total)
            .sum();
        assert_eq!(sum, expected_sum, "case {case}: profile totals");
    }
}

#[test]
fn compacting_any_split_changes_nothing_and_stores_each_symbol_once() {
    let profiles = profiles();
    let whole: Vec<Vec<usize>> = vec![(0..profiles.len()).collect()];
    let reference_dataset = datasets(&profiles, &whole).remove(0);
    let reference = select(vec![reference_dataset.clone()]);
    let type_ids: Vec<String> = reference[0]
        .types
        .iter()
        .map(|(id, _)| id.clone())
        .collect();
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for case in 0..16 {
        let group_count = 1 + rng.below(8);
        let mut groups = vec![Vec::new(); group_count];
        for index in 0..profiles.len() {
            groups[rng.below(group_count)].push(index);
        }
        let merged = compacted(&profiles, &groups);
        // Stored once: the merged tables are exactly as large as building in one go.
        let sizes = |d: &Dataset| {
            [
                d.strings.len(),
                d.functions.len(),
                d.location_mapping.len(),
                d.stack_parent.len(),
                d.series.len(),
                d.profiles.len(),
                d.sample_value.len(),
            ]
        };
        assert_eq!(sizes(&merged), sizes(&reference_dataset), "case {case}");
        // Each profile keeps its total through the merge (summed afresh, not carried).
        let totals = |d: &Dataset| {
            let mut totals: Vec<(i64, i64)> =
                d.profiles.iter().map(|p| (p.time_nanos, p.total)).collect();
            totals.sort_unstable();
            totals
        };
        assert_eq!(totals(&merged), totals(&reference_dataset), "case {case}");
        let merged_selection = select(vec![merged]);
        assert_same_merges(
            &merged_selection,
            &reference,
            &type_ids,
            &format!("case {case}"),
        );
    }
    // Merging a dataset with itself doubles every value and keeps every table.
    let mut builder = DatasetBuilder::new("t", "svc");
    builder.add_dataset(&reference_dataset);
    builder.add_dataset(&reference_dataset);
    let doubled = round_trip(builder.finish());
    assert_eq!(
        doubled.stack_parent.len(),
        reference_dataset.stack_parent.len()
    );
    assert_eq!(doubled.profiles.len(), 2 * reference_dataset.profiles.len());
    let total = |dataset: &Dataset| -> i64 { dataset.sample_value.iter().sum() };
    assert_eq!(total(&doubled), 2 * total(&reference_dataset));
}

/// A compacted block as compaction writes it (stack sums, zstd), read back as a long-range
/// merge reads it: summed, without its samples.
fn summed_round_trip(mut dataset: Dataset) -> Dataset {
    dataset.sum_stacks();
    round_trip_as(dataset, BlockEncoding::Compacted, Projection::SUMMED)
}

#[test]
fn stack_sums_merge_to_what_the_samples_merge_to() {
    let profiles = profiles();
    let whole: Vec<Vec<usize>> = vec![(0..profiles.len()).collect()];
    let reference = selections(&profiles, &whole);
    let type_ids: Vec<String> = reference[0]
        .types
        .iter()
        .map(|(id, _)| id.clone())
        .collect();
    let reference_totals: Vec<(i64, i64)> = reference[0]
        .profiles
        .iter()
        .map(|p| (p.time_nanos, p.total))
        .collect();
    let mut rng = Rng(0x5eed_5eed_0bad_cafe);
    for case in 0..12 {
        let group_count = 1 + rng.below(5);
        let mut groups = vec![Vec::new(); group_count];
        for index in 0..profiles.len() {
            groups[rng.below(group_count)].push(index);
        }
        let summed: Vec<Dataset> = datasets(&profiles, &groups)
            .into_iter()
            .map(summed_round_trip)
            .collect();
        for dataset in &summed {
            // The samples were never decoded: only the sums can have answered.
            assert!(dataset.samples_omitted, "case {case}");
            assert!(dataset.sample_value.is_empty(), "case {case}");
            assert!(!dataset.stack_sum_value.is_empty(), "case {case}");
        }
        let split = select(summed);
        assert_same_merges(&split, &reference, &type_ids, &format!("case {case}"));
        let mut totals: Vec<(i64, i64)> = split
            .iter()
            .flat_map(|s| s.profiles.iter().map(|p| (p.time_nanos, p.total)))
            .collect();
        totals.sort_unstable();
        let mut expected = reference_totals.clone();
        expected.sort_unstable();
        assert_eq!(totals, expected, "case {case}: profile totals");
    }
}

#[test]
fn a_range_that_cuts_a_summed_dataset_reads_its_samples() {
    let profiles = profiles();
    let whole: Vec<Vec<usize>> = vec![(0..profiles.len()).collect()];
    let mut dataset = datasets(&profiles, &whole).remove(0);
    dataset.sum_stacks();
    let block = bytes::Bytes::from(
        encode_block_as(std::slice::from_ref(&dataset), BlockEncoding::Compacted).expect("encodes"),
    );
    let full = decode_dataset(&block, 0, Projection::ALL).expect("decodes");
    assert_eq!(full, dataset, "a compacted block round-trips with its sums");
    // Half the range: the sums cover profiles outside it, so they must not answer.
    let middle = dataset.min_time_nanos + (dataset.max_time_nanos - dataset.min_time_nanos) / 2;
    let request = SelectRequest {
        tenant: "t".into(),
        types: TypeFilter::Any,
        from_nanos: i64::MIN,
        to_nanos: middle,
        ..Default::default()
    };
    assert!(!request.summable(dataset.min_time_nanos, dataset.max_time_nanos));
    let half = aggregate(Arc::new(full), &request).expect("selects");
    let expected: i64 = dataset
        .profiles
        .iter()
        .filter(|p| p.time_nanos <= middle)
        .map(|p| p.total)
        .sum();
    let got: i64 = half.profiles.iter().map(|p| p.total).sum();
    assert_eq!(got, expected);
    let everything: i64 = dataset.profiles.iter().map(|p| p.total).sum();
    assert!(got < everything, "the cut leaves profiles out");
    let tree_total: i64 = half.values.iter().flatten().sum();
    assert_eq!(
        tree_total, expected,
        "the values come from the samples in range"
    );
}
