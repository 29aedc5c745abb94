//! Datasets with many profiles and samples, for the merge's tests: four series of one
//! service, stacks from a tree of 2,000 nodes, values that vary, and span labels on a
//! tenth of the samples.

use bytes::Bytes;
use kiln_storage::dataset::{FunctionRow, MappingRow};
use kiln_storage::format::{encode_block_as, BlockEncoding, Projection};
use kiln_storage::merge::MergeInput;
use kiln_storage::ranged::{column_fetch, BlockTail, PartialBlock};
use kiln_storage::{Dataset, DatasetBuilder, ProfileRow, SeriesRow, Strings};

pub const NODES: u32 = 2_000;

/// A small deterministic generator (SplitMix64).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A dataset of `profiles` profiles of `samples` samples each, its series numbered
/// in reverse text order (as no merge numbers them), starting at `start_secs`.
pub fn raw(seed: u64, profiles: usize, samples: usize, start_secs: i64) -> Dataset {
    let mut rng = Rng::new(seed);
    let mut strings = Strings::new();
    let id = |strings: &mut Strings, text: &str| {
        strings.push(text);
        (strings.len() - 1) as u32
    };
    id(&mut strings, "");
    let profile_type = id(&mut strings, "process_cpu:cpu:nanoseconds:cpu:nanoseconds");
    let service_name = id(&mut strings, "service_name");
    let checkout = id(&mut strings, "checkout");
    let instance = id(&mut strings, "instance");
    let instances: Vec<u32> = (0..4)
        .rev()
        .map(|i| id(&mut strings, &format!("i-{i}")))
        .collect();
    let file = id(&mut strings, "main.go");
    let span = id(&mut strings, "span_id");
    let spans: Vec<u32> = (0..10)
        .map(|i| id(&mut strings, &format!("span-{seed}-{i}")))
        .collect();
    let functions: Vec<u32> = (0..200)
        .map(|i| id(&mut strings, &format!("main.f{i}")))
        .collect();
    let mut dataset = Dataset {
        tenant: "t".into(),
        service: "checkout".into(),
        strings,
        mappings: vec![
            MappingRow::default(),
            MappingRow {
                memory_start: 0x1000,
                memory_limit: 0x9000,
                file_offset: 0,
                filename: file,
                build_id: 0,
                flags: 0,
            },
        ],
        functions: functions
            .iter()
            .map(|name| FunctionRow {
                name: *name,
                system_name: *name,
                filename: file,
                start_line: 1,
            })
            .collect(),
        ..Default::default()
    };
    for i in 0..200u32 {
        dataset.location_mapping.push(1);
        dataset.location_address.push(0x1000 + u64::from(i) * 16);
        dataset.location_line_count.push(1);
        dataset.line_function.push(i);
        dataset.line_number.push(i64::from(i) + 10);
    }
    // Node i's (parent, location) is (i / 2, i % 200): distinct for every node.
    dataset.stack_parent.push(0);
    dataset.stack_location.push(0);
    for node in 1..NODES {
        dataset.stack_parent.push(node / 2);
        dataset.stack_location.push(node % 200);
    }
    dataset.series = instances
        .iter()
        .map(|value| SeriesRow {
            profile_type,
            labels: vec![(instance, *value), (service_name, checkout)],
        })
        .collect();
    let per_series = profiles.div_ceil(4);
    let mut made = 0;
    for series in 0..4u32 {
        for step in 0..per_series {
            if made == profiles {
                break;
            }
            made += 1;
            let time_nanos = (start_secs + step as i64 * 10) * 1_000_000_000;
            let mut stacks: Vec<u32> = (0..samples)
                .map(|_| 1 + rng.below(u64::from(NODES) - 1) as u32)
                .collect();
            stacks.sort_unstable();
            stacks.dedup();
            let mut total = 0i64;
            for stack in &stacks {
                let value = 10_000_000 * (1 + rng.below(50) as i64);
                total += value;
                if rng.below(10) == 0 {
                    dataset
                        .sample_label_sample
                        .push(dataset.sample_stack.len() as u32);
                    dataset.sample_label_name.push(span);
                    dataset
                        .sample_label_value
                        .push(spans[rng.below(10) as usize]);
                }
                dataset.sample_stack.push(*stack);
                dataset.sample_value.push(value);
            }
            let mut profile_id = seed.to_be_bytes().to_vec();
            profile_id.extend_from_slice(&(made as u64).to_be_bytes());
            dataset.profiles.push(ProfileRow {
                id: profile_id,
                series,
                time_nanos,
                duration_nanos: 10_000_000_000,
                period: 10_000_000,
                type_index: 0,
                sample_count: stacks.len() as u32,
                total,
            });
            dataset.min_time_nanos = dataset.min_time_nanos.min(time_nanos);
            dataset.max_time_nanos = dataset.max_time_nanos.max(time_nanos);
        }
    }
    dataset.min_time_nanos = start_secs * 1_000_000_000;
    dataset.check().expect("a valid synthetic dataset");
    dataset
}

/// `raw` as a merge writes it: series in canonical order, rows sorted by them.
pub fn merged(dataset: &Dataset) -> Dataset {
    let mut builder = DatasetBuilder::new(&dataset.tenant, &dataset.service);
    builder.add_dataset(dataset);
    let mut merged = builder.finish();
    merged.sum_stacks_if_smaller();
    merged
}

/// A dataset as compaction hands it to a merge: encoded, then fetched by byte ranges.
pub fn input(name: &str, dataset: &Dataset, encoding: BlockEncoding) -> MergeInput {
    let block = Bytes::from(encode_block_as(std::slice::from_ref(dataset), encoding).unwrap());
    MergeInput {
        name: name.into(),
        block: partial(&block),
        row_group: 0,
    }
}

pub fn partial(block: &Bytes) -> PartialBlock {
    let len = block.len() as u64;
    let tail = BlockTail::parse(block.slice(block.len().saturating_sub(64 * 1024)..), len)
        .unwrap()
        .unwrap();
    let plan = column_fetch(&tail, 0, Projection::ALL).unwrap();
    let fetched = plan
        .ranges()
        .iter()
        .map(|range| block.slice(range.start as usize..range.end as usize))
        .collect();
    plan.partial("input", &tail, fetched).unwrap()
}
