//! Merged pprof output: every selected stack as one sample, symbols re-interned into one
//! profile, identical stacks merged. Never truncated.

use foldhash::HashMap;

use kiln_model::pprof::{Function, Line, Location, Mapping, Profile, StringInterner, ValueType};
use kiln_model::ProfileType;

use crate::select::DatasetSelection;

/// (mapping id, address, (function id, line) per line): identical locations merge.
type LocationKey = (u64, u64, Vec<(u64, i64)>);

#[derive(Default)]
struct Writer {
    profile: Profile,
    strings: StringInterner,
    mappings: HashMap<(u64, u64, u64, i64, i64), u64>,
    functions: HashMap<(i64, i64, i64, i64), u64>,
    locations: HashMap<LocationKey, u64>,
    samples: HashMap<Vec<u64>, usize>,
}

impl Writer {
    fn string(&mut self, value: &str) -> i64 {
        self.strings.intern(&mut self.profile.string_table, value)
    }
}

/// The sample type a reader should show first, as the sources had it: pprof's default is
/// the last sample type (Go's `cpu` after `samples`, `inuse_space` after the others), so a
/// measured quantity over a plain count, then the type that came latest in any source.
/// Set explicitly, because the merged order follows the earliest position of each type,
/// and mixing sources (a Go CPU profile with folded stacks holding only `cpu`, merged
/// into one dataset by compaction) can put `samples` last. `latest[i]`: the latest position
/// type `i` had in any source.
fn default_type(type_ids: &[String], latest: &[Option<u32>]) -> Option<usize> {
    if type_ids.len() < 2 {
        return None;
    }
    type_ids
        .iter()
        .zip(latest)
        .enumerate()
        .filter_map(|(index, (id, latest))| {
            let measured = ProfileType::parse(id).ok()?.sample_unit != "count";
            Some((measured, (*latest)?, index))
        })
        .max()
        .map(|(_, _, index)| index)
}

/// Merges the given types (in this order) of all selections into one pprof. Its time and
/// duration span the merged profiles (a single profile keeps its own).
pub fn merged_pprof(selections: &[DatasetSelection], type_ids: &[String]) -> Profile {
    let mut merge = PprofMerge::new(type_ids);
    for selection in selections {
        merge.add(selection);
    }
    merge.finish()
}

/// [`merged_pprof`] one selection at a time, so that each can be dropped once added.
pub struct PprofMerge {
    writer: Writer,
    type_ids: Vec<String>,
    latest: Vec<Option<u32>>,
    /// Earliest start and latest end of the merged profiles.
    span: Option<(i64, i64)>,
}

impl PprofMerge {
    pub fn new(type_ids: &[String]) -> Self {
        let mut writer = Writer::default();
        writer.string("");
        let mut period_type = None;
        for type_id in type_ids {
            let Ok(profile_type) = ProfileType::parse(type_id) else {
                continue;
            };
            let sample_type = ValueType {
                r#type: writer.string(&profile_type.sample_type),
                unit: writer.string(&profile_type.sample_unit),
            };
            writer.profile.sample_type.push(sample_type);
            if period_type.is_none() {
                period_type = Some(ValueType {
                    r#type: writer.string(&profile_type.period_type),
                    unit: writer.string(&profile_type.period_unit),
                });
            }
        }
        writer.profile.period_type = period_type;
        PprofMerge {
            writer,
            type_ids: type_ids.to_vec(),
            latest: vec![None; type_ids.len()],
            span: None,
        }
    }

    pub fn add(&mut self, selection: &DatasetSelection) {
        let writer = &mut self.writer;
        let dataset = &selection.dataset;
        for profile in &selection.profiles {
            let row = &dataset.profiles[profile.row];
            let end = row.time_nanos.saturating_add(row.duration_nanos);
            self.span = Some(match self.span {
                Some((start, last)) => (start.min(row.time_nanos), last.max(end)),
                None => (row.time_nanos, end),
            });
        }
        for (id, latest) in self.type_ids.iter().zip(&mut self.latest) {
            for (local_id, position) in &selection.types {
                if local_id == id {
                    *latest = Some(latest.map_or(*position, |seen| seen.max(*position)));
                }
            }
        }
        // Output type position -> local type of this dataset.
        let local: Vec<Option<usize>> = self
            .type_ids
            .iter()
            .map(|id| {
                selection
                    .types
                    .iter()
                    .position(|(local_id, _)| local_id == id)
            })
            .collect();
        if local.iter().all(Option::is_none) {
            return;
        }
        if writer.profile.period == 0 {
            if let Some(first) = selection.profiles.first() {
                writer.profile.period = dataset.profiles[first.row].period;
            }
        }
        let line_offsets = dataset.location_line_offsets();
        let mut location_ids: Vec<u64> = vec![0; dataset.location_mapping.len()];
        let mut mapping_ids: Vec<u64> = vec![u64::MAX; dataset.mappings.len()];
        let mut function_ids: Vec<u64> = vec![0; dataset.functions.len()];
        for node in 1..dataset.stack_parent.len() {
            let values: Vec<i64> = local
                .iter()
                .map(|position| position.map_or(0, |p| selection.values[p][node]))
                .collect();
            if values.iter().all(|v| *v == 0) {
                continue;
            }
            let mut stack = Vec::new();
            let mut current = node;
            while current != 0 {
                let location = dataset.stack_location[current] as usize;
                if location_ids[location] == 0 {
                    location_ids[location] = export_location(
                        writer,
                        dataset,
                        location,
                        &line_offsets,
                        &mut mapping_ids,
                        &mut function_ids,
                    );
                }
                stack.push(location_ids[location]);
                current = dataset.stack_parent[current] as usize;
            }
            match writer.samples.get(&stack) {
                Some(index) => {
                    if let Some(slots) = writer.profile.sample.values_mut(*index) {
                        for (slot, value) in slots.iter_mut().zip(&values) {
                            *slot = slot.saturating_add(*value);
                        }
                    }
                }
                None => {
                    writer.profile.sample.push(&stack, &values, &[]);
                    writer
                        .samples
                        .insert(stack, writer.profile.sample.len() - 1);
                }
            }
        }
    }

    pub fn finish(mut self) -> Profile {
        if let Some(default) = default_type(&self.type_ids, &self.latest)
            .and_then(|default| self.writer.profile.sample_type.get(default))
        {
            self.writer.profile.default_sample_type = default.r#type;
        }
        let (start, end) = self.span.unwrap_or((0, 0));
        self.writer.profile.time_nanos = start;
        self.writer.profile.duration_nanos = end.saturating_sub(start).max(0);
        self.writer.profile
    }
}

fn export_location(
    writer: &mut Writer,
    dataset: &kiln_storage::Dataset,
    location: usize,
    line_offsets: &[u32],
    mapping_ids: &mut [u64],
    function_ids: &mut [u64],
) -> u64 {
    let mapping_index = dataset.location_mapping[location] as usize;
    let mapping_id = if mapping_index == 0 {
        0
    } else {
        if mapping_ids[mapping_index] == u64::MAX {
            let m = dataset.mappings[mapping_index];
            let filename = writer.string(dataset.string(m.filename));
            let build_id = writer.string(dataset.string(m.build_id));
            let key = (
                m.memory_start,
                m.memory_limit,
                m.file_offset,
                filename,
                build_id,
            );
            let next = writer.profile.mapping.len() as u64 + 1;
            let id = *writer.mappings.entry(key).or_insert(next);
            if id == next {
                writer.profile.mapping.push(Mapping {
                    id,
                    memory_start: m.memory_start,
                    memory_limit: m.memory_limit,
                    file_offset: m.file_offset,
                    filename,
                    build_id,
                    has_functions: m.flags & 1 != 0,
                    has_filenames: m.flags & 2 != 0,
                    has_line_numbers: m.flags & 4 != 0,
                    has_inline_frames: m.flags & 8 != 0,
                });
            }
            mapping_ids[mapping_index] = id;
        }
        mapping_ids[mapping_index]
    };
    let mut lines = Vec::new();
    for line in line_offsets[location]..line_offsets[location + 1] {
        let function_index = dataset.line_function[line as usize] as usize;
        if function_ids[function_index] == 0 {
            let f = dataset.functions[function_index];
            let name = writer.string(dataset.string(f.name));
            let system_name = writer.string(dataset.string(f.system_name));
            let filename = writer.string(dataset.string(f.filename));
            let key = (name, system_name, filename, f.start_line);
            let next = writer.profile.function.len() as u64 + 1;
            let id = *writer.functions.entry(key).or_insert(next);
            if id == next {
                writer.profile.function.push(Function {
                    id,
                    name,
                    system_name,
                    filename,
                    start_line: f.start_line,
                });
            }
            function_ids[function_index] = id;
        }
        lines.push((
            function_ids[function_index],
            dataset.line_number[line as usize],
        ));
    }
    let address = dataset.location_address[location];
    let key = (mapping_id, address, lines);
    let next = writer.profile.location.len() as u64 + 1;
    let id = *writer.locations.entry(key.clone()).or_insert(next);
    if id == next {
        writer.profile.location.push(Location {
            id,
            mapping_id,
            address,
            line: key
                .2
                .iter()
                .map(|(function_id, line)| Line {
                    function_id: *function_id,
                    line: *line,
                    column: 0,
                })
                .collect(),
            is_folded: false,
        });
    }
    id
}
