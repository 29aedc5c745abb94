//! Building a pprof: [`PprofBuilder`] is the one place Kiln puts a profile together, for
//! every producer (the non-pprof formats here, the agent's reports, the query's merged
//! export). Every string, mapping, function and location is stored once, and samples
//! with the same stack and labels are summed into one. [`ProfileBuilder`] takes stacks
//! of named frames on top of it, for the formats that are not pprof (speedscope, `perf
//! script`, JFR).

use std::collections::hash_map::Entry;

use foldhash::{HashMap, HashMapExt};
use smallvec::SmallVec;

use crate::pprof::{Function, Label, Line, Location, Mapping, Profile, StringInterner, ValueType};

/// A mapping's identity: start, limit, file offset, file name and build id.
type MappingKey = (u64, u64, u64, i64, i64);
/// A function's identity: name, system name, file name and start line.
type FunctionKey = (i64, i64, i64, i64);
/// A location's identity: its mapping, address, and (function id, line) per line; one
/// line, as most have, is held without a heap allocation.
type LocationKey = (u64, u64, SmallVec<[(u64, i64); 2]>);
/// A sample's identity: its location ids (leaf first) and its sorted (key, value) labels.
type SampleKey = (Vec<u32>, Vec<(i64, i64)>);

/// A pprof under construction, its tables interned. Ids are assigned in order from 1,
/// as pprof requires.
pub struct PprofBuilder {
    profile: Profile,
    strings: StringInterner,
    mappings: HashMap<MappingKey, u64>,
    functions: HashMap<FunctionKey, u64>,
    locations: HashMap<LocationKey, u32>,
    samples: HashMap<SampleKey, usize>,
}

impl Default for PprofBuilder {
    fn default() -> Self {
        let mut builder = PprofBuilder {
            profile: Profile::default(),
            strings: StringInterner::default(),
            mappings: HashMap::new(),
            functions: HashMap::new(),
            locations: HashMap::new(),
            samples: HashMap::new(),
        };
        builder.string("");
        builder
    }
}

impl PprofBuilder {
    /// The string's index in the string table, added if new.
    pub fn string(&mut self, value: &str) -> i64 {
        self.strings.intern(&mut self.profile.string_table, value)
    }

    /// The profile so far.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// The profile's header fields (sample types, period, times), to set directly.
    pub fn profile_mut(&mut self) -> &mut Profile {
        &mut self.profile
    }

    /// The id of this mapping (its strings interned here; its id is ignored), added if
    /// new.
    pub fn mapping(&mut self, mapping: Mapping) -> u64 {
        let key = (
            mapping.memory_start,
            mapping.memory_limit,
            mapping.file_offset,
            mapping.filename,
            mapping.build_id,
        );
        let next = self.profile.mapping.len() as u64 + 1;
        let id = *self.mappings.entry(key).or_insert(next);
        if id == next {
            self.profile.mapping.push(Mapping { id, ..mapping });
        }
        id
    }

    /// The id of this function (strings interned here), added if new.
    pub fn function(&mut self, name: i64, system_name: i64, filename: i64, start_line: i64) -> u64 {
        let key = (name, system_name, filename, start_line);
        let next = self.profile.function.len() as u64 + 1;
        let id = *self.functions.entry(key).or_insert(next);
        if id == next {
            self.profile.function.push(Function {
                id,
                name,
                system_name,
                filename,
                start_line,
            });
        }
        id
    }

    /// The id of the location at `address` in mapping `mapping_id` (0: none) whose lines
    /// are these (function id, line) pairs, innermost first; added if new.
    pub fn location(&mut self, mapping_id: u64, address: u64, lines: &[(u64, i64)]) -> u32 {
        match self
            .locations
            .entry((mapping_id, address, SmallVec::from_slice(lines)))
        {
            Entry::Occupied(known) => *known.get(),
            Entry::Vacant(new) => {
                let line = lines
                    .iter()
                    .map(|(function_id, line)| Line {
                        function_id: *function_id,
                        line: *line,
                        column: 0,
                    })
                    .collect();
                let id = self.profile.push_location(Location {
                    mapping_id,
                    address,
                    line,
                    ..Default::default()
                });
                *new.insert(id)
            }
        }
    }

    /// Adds `values` (one per sample type; missing ones are 0) to the sample of this
    /// stack (location ids, leaf first) and these (key, value) string labels, in any
    /// order.
    pub fn add_sample(&mut self, stack: Vec<u32>, values: &[i64], mut labels: Vec<(i64, i64)>) {
        labels.sort_unstable();
        match self.samples.entry((stack, labels)) {
            Entry::Occupied(known) => {
                if let Some(slots) = self.profile.sample.values_mut(*known.get()) {
                    for (slot, value) in slots.iter_mut().zip(values) {
                        *slot = slot.saturating_add(*value);
                    }
                }
            }
            Entry::Vacant(new) => {
                let (stack, labels) = new.key();
                let labels: Vec<Label> = labels
                    .iter()
                    .map(|(key, value)| Label {
                        key: *key,
                        str: *value,
                        ..Default::default()
                    })
                    .collect();
                let mut row = values.to_vec();
                row.resize(self.profile.sample_type.len(), 0);
                self.profile.sample.push(stack, &row, &labels);
                new.insert(self.profile.sample.len() - 1);
            }
        }
    }

    pub fn sample_count(&self) -> usize {
        self.profile.sample.len()
    }

    pub fn finish(self) -> Profile {
        self.profile
    }
}

/// One frame as a text format describes it. An empty `function` with a `module` and an
/// `address` is an unsymbolized native frame, kept as such (shown as `module+0xaddress`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Frame<'a> {
    pub function: &'a str,
    pub file: &'a str,
    pub line: i64,
    pub module: &'a str,
    pub address: u64,
}

/// Stacks of named frames into a pprof, for the text and JFR formats.
pub struct ProfileBuilder {
    pprof: PprofBuilder,
}

impl ProfileBuilder {
    /// A profile with these `(type, unit)` sample types; every sample gives one value each.
    pub fn new(
        sample_types: &[(&str, &str)],
        period_type: Option<(&str, &str)>,
        period: i64,
    ) -> Self {
        let mut pprof = PprofBuilder::default();
        for (kind, unit) in sample_types {
            let value_type = ValueType {
                r#type: pprof.string(kind),
                unit: pprof.string(unit),
            };
            pprof.profile_mut().sample_type.push(value_type);
        }
        if let Some((kind, unit)) = period_type {
            let value_type = ValueType {
                r#type: pprof.string(kind),
                unit: pprof.string(unit),
            };
            pprof.profile_mut().period_type = Some(value_type);
        }
        pprof.profile_mut().period = period;
        ProfileBuilder { pprof }
    }

    pub fn string(&mut self, value: &str) -> i64 {
        self.pprof.string(value)
    }

    /// The location id of a frame, interning what it refers to. A symbolized frame is
    /// keyed by function and line, an unsymbolized one by its module and address.
    pub fn location(&mut self, frame: &Frame<'_>) -> u32 {
        let mapping_id = match frame.module {
            "" => 0,
            module => {
                let filename = self.pprof.string(module);
                self.pprof.mapping(Mapping {
                    filename,
                    memory_limit: u64::MAX,
                    ..Default::default()
                })
            }
        };
        if frame.function.is_empty() {
            return self.pprof.location(mapping_id, frame.address, &[]);
        }
        let name = self.pprof.string(frame.function);
        let file = self.pprof.string(frame.file);
        let function_id = self.pprof.function(name, name, file, 0);
        self.pprof
            .location(mapping_id, 0, &[(function_id, frame.line)])
    }

    /// Adds `values` (one per sample type) to the sample of this stack (leaf first, as
    /// pprof stores it) and these string labels.
    pub fn add(&mut self, stack: &[u32], values: &[i64], labels: &[(&str, &str)]) {
        let labels = labels
            .iter()
            .map(|(key, value)| (self.pprof.string(key), self.pprof.string(value)))
            .collect();
        self.pprof.add_sample(stack.to_vec(), values, labels);
    }

    pub fn sample_count(&self) -> usize {
        self.pprof.sample_count()
    }

    pub fn finish(mut self, time_nanos: i64, duration_nanos: i64) -> Profile {
        let profile = self.pprof.profile_mut();
        profile.time_nanos = time_nanos;
        profile.duration_nanos = duration_nanos;
        self.pprof.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_stacks_and_labels_sum_into_one_sample() {
        let mut builder = ProfileBuilder::new(&[("cpu", "nanoseconds")], None, 0);
        let main = builder.location(&Frame {
            function: "main",
            file: "main.c",
            line: 3,
            ..Default::default()
        });
        let native = builder.location(&Frame {
            module: "/lib/libc.so.6",
            address: 0x1234,
            ..Default::default()
        });
        builder.add(&[native, main], &[10], &[("comm", "a")]);
        builder.add(&[native, main], &[5], &[("comm", "a")]);
        builder.add(&[native, main], &[1], &[("comm", "b")]);
        builder.add(&[main], &[7], &[]);
        let profile = builder.finish(1, 2);
        assert_eq!(profile.sample.len(), 3);
        assert_eq!(profile.sample.get(0).unwrap().value, &[15]);
        assert_eq!(profile.location.len(), 2);
        assert!(profile.location[1].line.is_empty());
        assert_eq!(profile.location[1].address, 0x1234);
        assert!(crate::pprof::validate(&profile, &Default::default()).is_ok());
    }
}
