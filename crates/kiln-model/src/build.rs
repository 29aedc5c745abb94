//! Building a pprof from stacks of named frames, for the formats that are not pprof
//! (speedscope, `perf script`, JFR): every string, mapping, function and location is
//! stored once, and samples with the same stack and labels are summed into one.

use foldhash::{HashMap, HashMapExt};

use crate::pprof::{Function, Label, Line, Location, Mapping, Profile, StringInterner, ValueType};

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

/// A sample's identity: its location ids (leaf first) and its sorted (key, value) labels.
type SampleKey = (Vec<u32>, Vec<(i64, i64)>);

pub struct ProfileBuilder {
    profile: Profile,
    strings: StringInterner,
    mappings: HashMap<i64, u64>,
    functions: HashMap<(i64, i64), u64>,
    locations: HashMap<(u64, u64, u64, i64), u32>,
    samples: HashMap<SampleKey, usize>,
    label_scratch: Vec<(i64, i64)>,
}

impl ProfileBuilder {
    /// A profile with these `(type, unit)` sample types; every sample gives one value each.
    pub fn new(
        sample_types: &[(&str, &str)],
        period_type: Option<(&str, &str)>,
        period: i64,
    ) -> Self {
        let mut builder = ProfileBuilder {
            profile: Profile::default(),
            strings: StringInterner::default(),
            mappings: HashMap::new(),
            functions: HashMap::new(),
            locations: HashMap::new(),
            samples: HashMap::new(),
            label_scratch: Vec::new(),
        };
        builder.string("");
        for (kind, unit) in sample_types {
            let value_type = ValueType {
                r#type: builder.string(kind),
                unit: builder.string(unit),
            };
            builder.profile.sample_type.push(value_type);
        }
        if let Some((kind, unit)) = period_type {
            builder.profile.period_type = Some(ValueType {
                r#type: builder.string(kind),
                unit: builder.string(unit),
            });
        }
        builder.profile.period = period;
        builder
    }

    pub fn string(&mut self, value: &str) -> i64 {
        self.strings.intern(&mut self.profile.string_table, value)
    }

    fn mapping(&mut self, module: &str) -> u64 {
        if module.is_empty() {
            return 0;
        }
        let filename = self.string(module);
        if let Some(id) = self.mappings.get(&filename) {
            return *id;
        }
        let id = self.profile.mapping.len() as u64 + 1;
        self.profile.mapping.push(Mapping {
            id,
            filename,
            memory_limit: u64::MAX,
            ..Default::default()
        });
        self.mappings.insert(filename, id);
        id
    }

    /// The location id of a frame, interning what it refers to.
    pub fn location(&mut self, frame: &Frame<'_>) -> u32 {
        let mapping_id = self.mapping(frame.module);
        let function_id = if frame.function.is_empty() {
            0
        } else {
            let name = self.string(frame.function);
            let file = self.string(frame.file);
            match self.functions.get(&(name, file)) {
                Some(id) => *id,
                None => {
                    let id = self.profile.function.len() as u64 + 1;
                    self.profile.function.push(Function {
                        id,
                        name,
                        system_name: name,
                        filename: file,
                        start_line: 0,
                    });
                    self.functions.insert((name, file), id);
                    id
                }
            }
        };
        // A symbolized frame is keyed by function and line, an unsymbolized one by address.
        let address = if function_id == 0 { frame.address } else { 0 };
        let key = (function_id, mapping_id, address, frame.line);
        if let Some(id) = self.locations.get(&key) {
            return *id;
        }
        let id = self.profile.push_location(Location {
            mapping_id,
            address,
            line: match function_id {
                0 => Default::default(),
                _ => smallvec::smallvec![Line {
                    function_id,
                    line: frame.line,
                    column: 0,
                }],
            },
            ..Default::default()
        });
        self.locations.insert(key, id);
        id
    }

    /// Adds `values` (one per sample type) to the sample of this stack (leaf first, as
    /// pprof stores it) and these string labels.
    pub fn add(&mut self, stack: &[u32], values: &[i64], labels: &[(&str, &str)]) {
        let mut label_ids = std::mem::take(&mut self.label_scratch);
        label_ids.clear();
        for (key, value) in labels {
            let pair = (self.string(key), self.string(value));
            label_ids.push(pair);
        }
        label_ids.sort_unstable();
        let key = (stack.to_vec(), label_ids);
        match self.samples.get(&key) {
            Some(index) => {
                if let Some(existing) = self.profile.sample.values_mut(*index) {
                    for (sum, value) in existing.iter_mut().zip(values) {
                        *sum = sum.saturating_add(*value);
                    }
                }
                self.label_scratch = key.1;
            }
            None => {
                let labels: Vec<Label> = key
                    .1
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
                self.samples.insert(key, self.profile.sample.len() - 1);
            }
        }
    }

    pub fn sample_count(&self) -> usize {
        self.profile.sample.len()
    }

    pub fn finish(mut self, time_nanos: i64, duration_nanos: i64) -> Profile {
        self.profile.time_nanos = time_nanos;
        self.profile.duration_nanos = duration_nanos;
        self.profile
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
