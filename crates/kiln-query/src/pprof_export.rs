//! Merged pprof output: every selected stack as one sample, symbols re-interned into one
//! profile, identical stacks merged. Never truncated.

use foldhash::HashMap;

use kiln_model::build::PprofBuilder;
use kiln_model::pprof::{Mapping, Profile, ValueType};
use kiln_model::ProfileType;

use crate::selection::DatasetSelection;

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
    writer: PprofBuilder,
    type_ids: Vec<String>,
    latest: Vec<Option<u32>>,
    /// Earliest start and latest end of the merged profiles.
    span: Option<(i64, i64)>,
}

impl PprofMerge {
    pub fn new(type_ids: &[String]) -> Self {
        let mut writer = PprofBuilder::default();
        let mut period_type = None;
        for type_id in type_ids {
            let Ok(profile_type) = ProfileType::parse(type_id) else {
                continue;
            };
            let sample_type = ValueType {
                r#type: writer.string(&profile_type.sample_type),
                unit: writer.string(&profile_type.sample_unit),
            };
            writer.profile_mut().sample_type.push(sample_type);
            if period_type.is_none() {
                period_type = Some(ValueType {
                    r#type: writer.string(&profile_type.period_type),
                    unit: writer.string(&profile_type.period_unit),
                });
            }
        }
        writer.profile_mut().period_type = period_type;
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
        if writer.profile().period == 0 {
            if let Some(first) = selection.profiles.first() {
                writer.profile_mut().period = dataset.profiles[first.row].period;
            }
        }
        let line_offsets = dataset.location_line_offsets();
        let mut location_ids: Vec<u32> = vec![0; dataset.location_mapping.len()];
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
            writer.add_sample(stack, &values, Vec::new());
        }
    }

    /// Adds a profile another query node merged from its share of a split query
    /// ([`crate::root`]): its symbols re-interned here and identical stacks merged, as
    /// if its datasets had been read here. Its values go by sample type name and unit;
    /// types it lacks add nothing. A share's profile has one type, so which type pprof
    /// shows first needs no positions from it.
    pub fn add_profile(&mut self, profile: &Profile) {
        let writer = &mut self.writer;
        if profile.time_nanos != 0 || profile.duration_nanos != 0 {
            let end = profile.time_nanos.saturating_add(profile.duration_nanos);
            self.span = Some(match self.span {
                Some((start, last)) => (start.min(profile.time_nanos), last.max(end)),
                None => (profile.time_nanos, end),
            });
        }
        // Output type position -> the profile's sample type position.
        let local: Vec<Option<usize>> = self
            .type_ids
            .iter()
            .map(|id| {
                let parsed = ProfileType::parse(id).ok()?;
                profile.sample_type.iter().position(|value_type| {
                    profile.string_or_empty(value_type.r#type) == parsed.sample_type
                        && profile.string_or_empty(value_type.unit) == parsed.sample_unit
                })
            })
            .collect();
        if local.iter().all(Option::is_none) {
            return;
        }
        if writer.profile().period == 0 {
            writer.profile_mut().period = profile.period;
        }
        let mut mapping_ids: HashMap<u64, u64> = HashMap::default();
        for m in &profile.mapping {
            let filename = writer.string(&profile.string_or_empty(m.filename));
            let build_id = writer.string(&profile.string_or_empty(m.build_id));
            let id = writer.mapping(Mapping {
                filename,
                build_id,
                ..m.clone()
            });
            mapping_ids.insert(m.id, id);
        }
        let mut function_ids: HashMap<u64, u64> = HashMap::default();
        for f in &profile.function {
            let name = writer.string(&profile.string_or_empty(f.name));
            let system_name = writer.string(&profile.string_or_empty(f.system_name));
            let filename = writer.string(&profile.string_or_empty(f.filename));
            let id = writer.function(name, system_name, filename, f.start_line);
            function_ids.insert(f.id, id);
        }
        let mut location_ids: HashMap<u64, u32> = HashMap::default();
        for location in &profile.location {
            let mapping_id = mapping_ids.get(&location.mapping_id).copied().unwrap_or(0);
            let lines: Vec<(u64, i64)> = location
                .line
                .iter()
                .map(|line| {
                    let function = function_ids.get(&line.function_id).copied().unwrap_or(0);
                    (function, line.line)
                })
                .collect();
            let id = writer.location(mapping_id, location.address, &lines);
            location_ids.insert(location.id, id);
        }
        for sample in profile.sample.iter() {
            let values: Vec<i64> = local
                .iter()
                .map(|position| {
                    position
                        .and_then(|p| sample.value.get(p).copied())
                        .unwrap_or(0)
                })
                .collect();
            if values.iter().all(|v| *v == 0) {
                continue;
            }
            // A location the profile does not define: the sample is malformed, left out.
            let Some(stack) = sample
                .location_id
                .iter()
                .map(|id| location_ids.get(&u64::from(*id)).copied())
                .collect::<Option<Vec<u32>>>()
            else {
                continue;
            };
            writer.add_sample(stack, &values, Vec::new());
        }
    }

    pub fn finish(mut self) -> Profile {
        if let Some(default) = default_type(&self.type_ids, &self.latest)
            .and_then(|default| self.writer.profile().sample_type.get(default))
        {
            self.writer.profile_mut().default_sample_type = default.r#type;
        }
        let (start, end) = self.span.unwrap_or((0, 0));
        self.writer.profile_mut().time_nanos = start;
        self.writer.profile_mut().duration_nanos = end.saturating_sub(start).max(0);
        self.writer.finish()
    }
}

fn export_location(
    writer: &mut PprofBuilder,
    dataset: &kiln_storage::Dataset,
    location: usize,
    line_offsets: &[u32],
    mapping_ids: &mut [u64],
    function_ids: &mut [u64],
) -> u32 {
    let mapping_index = dataset.location_mapping[location] as usize;
    let mapping_id = if mapping_index == 0 {
        0
    } else {
        if mapping_ids[mapping_index] == u64::MAX {
            let m = dataset.mappings[mapping_index];
            let filename = writer.string(dataset.string(m.filename));
            let build_id = writer.string(dataset.string(m.build_id));
            mapping_ids[mapping_index] = writer.mapping(Mapping {
                id: 0,
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
            let id = writer.function(name, system_name, filename, f.start_line);
            function_ids[function_index] = id;
        }
        lines.push((
            function_ids[function_index],
            dataset.line_number[line as usize],
        ));
    }
    let address = dataset.location_address[location];
    writer.location(mapping_id, address, &lines)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_model::pprof::{Function, Line, Location, StringInterner};

    const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

    /// A share's profile: `main;a` and `main;b`, symbols in its own ids and string order.
    fn share(offset: u32, a: i64, b: i64, time_nanos: i64) -> Profile {
        let mut profile = Profile::default();
        let mut strings = StringInterner::default();
        let mut string = |value: &str| strings.intern(&mut profile.string_table, value);
        let (empty, cpu, nanoseconds) = (string(""), string("cpu"), string("nanoseconds"));
        assert_eq!(empty, 0);
        let names = [string("b"), string("main"), string("a")];
        let file = string("main.go");
        profile.sample_type.push(ValueType {
            r#type: cpu,
            unit: nanoseconds,
        });
        for (index, name) in names.iter().enumerate() {
            let id = u64::from(offset) + index as u64;
            profile.function.push(Function {
                id,
                name: *name,
                system_name: *name,
                filename: file,
                start_line: 1,
            });
            profile.location.push(Location {
                id,
                mapping_id: 0,
                address: 0,
                line: kiln_model::pprof::lines![Line {
                    function_id: id,
                    line: 10 + index as i64,
                    column: 0,
                }],
                is_folded: false,
            });
        }
        // Leaf first: [a, main] and [b, main].
        profile.sample.push(&[offset + 2, offset + 1], &[a], &[]);
        profile.sample.push(&[offset, offset + 1], &[b], &[]);
        profile.time_nanos = time_nanos;
        profile.duration_nanos = 10;
        profile.period = 10_000_000;
        profile
    }

    fn stacks(profile: &Profile) -> Vec<(Vec<String>, i64)> {
        let name = |id: &u32| {
            let location = profile
                .location
                .iter()
                .find(|l| l.id == u64::from(*id))
                .expect("location");
            let function = profile
                .function
                .iter()
                .find(|f| f.id == location.line[0].function_id)
                .expect("function");
            profile.string_or_empty(function.name)
        };
        let mut stacks: Vec<(Vec<String>, i64)> = profile
            .sample
            .iter()
            .map(|s| (s.location_id.iter().map(name).collect(), s.value[0]))
            .collect();
        stacks.sort();
        stacks
    }

    #[test]
    fn shares_profiles_merge_by_symbol_not_by_id() {
        let mut merge = PprofMerge::new(&[CPU.to_string()]);
        merge.add_profile(&share(1, 5, 7, 100));
        // Other ids for the same symbols: still the same two stacks.
        merge.add_profile(&share(50, 1, 2, 40));
        let merged = merge.finish();
        assert_eq!(
            stacks(&merged),
            [
                (vec!["a".to_string(), "main".to_string()], 6),
                (vec!["b".to_string(), "main".to_string()], 9),
            ]
        );
        assert_eq!(merged.function.len(), 3);
        assert_eq!(merged.location.len(), 3);
        // The span covers both shares; the period is kept.
        assert_eq!((merged.time_nanos, merged.duration_nanos), (40, 70));
        assert_eq!(merged.period, 10_000_000);
        // Round trip through the bytes a peer sends.
        let decoded = kiln_model::pprof::decode(&merged.encode_to_bytes(), 1 << 20).unwrap();
        assert_eq!(stacks(&decoded), stacks(&merged));
    }

    #[test]
    fn a_share_without_the_type_adds_nothing() {
        let mut merge = PprofMerge::new(&["memory:alloc_space:bytes:space:bytes".to_string()]);
        merge.add_profile(&share(1, 5, 7, 100));
        assert!(merge.finish().sample.is_empty());
    }
}
