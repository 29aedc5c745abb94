//! The dataset builder: interns decoded pprofs into a [`Dataset`], storing every string,
//! mapping, function, location and stack prefix once. A whole repeated stack is found with
//! one probe of a 128-bit-hash index before any stack node is walked; that, and the flat
//! sample columns, are the measured hot spots of ingest (docs/benchmarks.md).

use std::hash::BuildHasher;

use foldhash::{HashMap, HashMapExt};
use hashbrown::hash_table::{Entry, HashTable};
use kiln_model::labels::{sanitize_label_name, Labels, SERVICE_NAME};
use kiln_model::pprof::{Profile, Validated};
use kiln_model::ProfileType;
use smallvec::{smallvec, SmallVec};

use crate::dataset::{Dataset, FunctionRow, MappingRow, ProfileRow, SeriesRow};
use crate::strings::Strings;

/// Per-sample labels that stay with the sample instead of splitting the series: they are
/// unique per request and would otherwise explode the series count.
pub const PER_SAMPLE_LABELS: [&str; 3] = ["span_id", "trace_id", "profile_id"];

/// Frame name of the synthetic root frame that replaces frames cut by the depth limit.
pub const TRUNCATED_FRAME: &str = "[truncated]";

/// Which sample type of a pprof goes to which profile type, and how its values scale.
#[derive(Debug, Clone)]
pub struct TypePlan {
    pub value_index: usize,
    pub profile_type: ProfileType,
    /// Multiplier for values (sample counts to nanoseconds for legacy CPU uploads).
    pub scale: Option<f64>,
}

/// One decoded, validated profile to add to a dataset.
pub struct PprofInput<'a> {
    pub profile: &'a Profile,
    pub index: &'a Validated,
    pub id: &'a str,
    pub time_nanos: i64,
    pub duration_nanos: i64,
    /// Series labels, `service_name` included; sample labels are added per sample.
    pub labels: &'a Labels,
    pub types: &'a [TypePlan],
    pub max_stack_depth: usize,
    /// Every string sample label stays with its sample (none selects a series).
    pub sample_labels_per_sample: bool,
}

#[derive(Hash, PartialEq, Eq, Clone)]
struct LocationKey {
    mapping: u32,
    address: u64,
    lines: KeyLines,
}

/// (function, line) of a location, in the key when there is one: a key is built for every
/// location of every profile, known or not, and one allocation each was most of what a
/// warm location cost (docs/benchmarks.md, session 37).
type KeyLines = SmallVec<[(u32, i64); 1]>;

struct PendingProfile {
    row: ProfileRow,
    /// (stack, label set) and value, in arrival order with repeats: sorted and summed once
    /// at [`DatasetBuilder::finish`]. A vector costs 16 bytes a sample where a map cost
    /// 20 to 40, and a compaction holds every sample of its job here.
    samples: Vec<((u32, u32), i64)>,
}

/// Rows stored once each: interning a row returns the id of its first occurrence. The
/// hash table holds only ids and hashes rows where they are stored, so a new row is moved
/// in once instead of being cloned into a key (a location's inlined frames are a vector).
struct Table<K> {
    rows: Vec<K>,
    ids: HashTable<u32>,
    hasher: foldhash::fast::RandomState,
}

impl<K: std::hash::Hash + Eq> Table<K> {
    fn new() -> Self {
        Table {
            rows: Vec::new(),
            ids: HashTable::new(),
            hasher: Default::default(),
        }
    }

    /// Room for `additional` more rows without growing the table step by step.
    fn reserve(&mut self, additional: usize) {
        let (rows, hasher) = (&self.rows, &self.hasher);
        self.ids
            .reserve(additional, |id| hasher.hash_one(&rows[*id as usize]));
        self.rows.reserve(additional);
    }

    /// Heap held by the rows themselves and the index (not by vectors inside rows).
    fn heap_bytes(&self) -> usize {
        self.rows.capacity() * std::mem::size_of::<K>()
            + self.ids.capacity() * (std::mem::size_of::<u32>() + 1)
    }

    /// Adds a row no interned row will ever map to (a sentinel).
    fn push_sentinel(&mut self, row: K) {
        self.rows.push(row);
    }

    fn intern(&mut self, row: K) -> u32 {
        let hash = self.hasher.hash_one(&row);
        let rows = &mut self.rows;
        let hasher = &self.hasher;
        match self.ids.entry(
            hash,
            |id| rows[*id as usize] == row,
            |id| hasher.hash_one(&rows[*id as usize]),
        ) {
            Entry::Occupied(entry) => *entry.get(),
            Entry::Vacant(entry) => {
                let id = rows.len() as u32;
                rows.push(row);
                entry.insert(id);
                id
            }
        }
    }
}

/// Per-profile caches from pprof table positions to dataset ids, so each pprof symbol is
/// interned once per profile however many samples use it.
struct ProfileSymbols {
    strings: Vec<u32>,
    mappings: Vec<Option<u32>>,
    functions: Vec<Option<u32>>,
    locations: Vec<Option<u32>>,
}

/// Interns profiles into one dataset: every string, mapping, function, location and stack
/// prefix gets one id however many profiles use it.
pub struct DatasetBuilder {
    tenant: String,
    service: String,
    strings: Strings,
    /// Ids of `strings`, probed by bytes so that a pprof string already interned needs no
    /// UTF-8 check.
    string_ids: HashTable<u32>,
    string_hasher: foldhash::fast::RandomState,
    mappings: Table<MappingRow>,
    functions: Table<FunctionRow>,
    locations: Table<LocationKey>,
    /// Stack nodes as (parent, location); node 0 is the root sentinel.
    stacks: Table<(u32, u32)>,
    /// Leaf node of every whole stack seen, by a 128-bit hash of its locations. A service's
    /// profiles repeat the same stacks, and one probe here replaces one probe of `stacks`
    /// per frame, the hottest loop of ingest (docs/benchmarks.md). The hash is keyed with
    /// per-process random seeds; two distinct stacks of one dataset sharing 128 bits is
    /// far less likely than a memory error, so a hit is not verified frame by frame.
    whole_stacks: HashMap<u128, u32>,
    stack_hashers: [foldhash::quality::RandomState; 2],
    series: Table<SeriesRow>,
    /// Per-sample label sets; set 0 is empty.
    label_sets: Table<Vec<(u32, u32)>>,
    profiles: Vec<PendingProfile>,
    truncated_location: Option<u32>,
    /// Heap of the `locations` rows whose lines do not fit in the row (inlined frames).
    location_lines_bytes: usize,
    /// [`DatasetBuilder::symbol_rows`] after the last [`DatasetBuilder::take_dataset`],
    /// if there was one.
    rows_at_take: Option<usize>,
}

/// What [`DatasetBuilder::take_dataset`] took, and how warm the tables were for it.
pub struct Taken {
    pub dataset: Dataset,
    /// Rows the dataset holds.
    pub used_rows: usize,
    /// Rows the builder's tables gained since the previous take (all of them for the
    /// first), an upper bound of the used rows that were not known already.
    pub new_rows: usize,
    /// Whether there was a previous take (the tables were warm).
    pub warm: bool,
}

impl DatasetBuilder {
    pub fn new(tenant: &str, service: &str) -> Self {
        let mut builder = DatasetBuilder {
            tenant: tenant.to_string(),
            service: service.to_string(),
            strings: Strings::new(),
            string_ids: HashTable::new(),
            string_hasher: Default::default(),
            mappings: Table::new(),
            functions: Table::new(),
            locations: Table::new(),
            stacks: Table::new(),
            whole_stacks: HashMap::new(),
            stack_hashers: Default::default(),
            series: Table::new(),
            label_sets: Table::new(),
            profiles: Vec::new(),
            truncated_location: None,
            location_lines_bytes: 0,
            rows_at_take: None,
        };
        builder.intern("");
        // Sentinels: mapping 0 means "no mapping" even when a profile has an all-zero
        // mapping of its own, and stack node 0 is the root.
        builder.mappings.push_sentinel(MappingRow::default());
        builder.stacks.push_sentinel((0, 0));
        builder.label_sets.intern(Vec::new());
        builder
    }

    pub fn intern(&mut self, value: &str) -> u32 {
        let hash = self.string_hasher.hash_one(value.as_bytes());
        if let Some(id) = self.find_string(hash, value.as_bytes()) {
            return id;
        }
        self.insert_string(hash, value)
    }

    /// Keys are valid UTF-8, so invalid bytes always miss and are interned in their lossy
    /// form, which then deduplicates as text.
    fn intern_bytes(&mut self, value: &[u8]) -> u32 {
        let hash = self.string_hasher.hash_one(value);
        if let Some(id) = self.find_string(hash, value) {
            return id;
        }
        match std::str::from_utf8(value) {
            Ok(text) => self.insert_string(hash, text),
            Err(_) => self.intern(&String::from_utf8_lossy(value)),
        }
    }

    fn find_string(&self, hash: u64, value: &[u8]) -> Option<u32> {
        let strings = &self.strings;
        self.string_ids
            .find(hash, |id| strings[*id as usize].as_bytes() == value)
            .copied()
    }

    /// Adds a string `find_string` missed; `hash` is that of its bytes.
    fn insert_string(&mut self, hash: u64, value: &str) -> u32 {
        let id = self.strings.len() as u32;
        self.strings.push(value);
        let strings = &self.strings;
        let hasher = &self.string_hasher;
        self.string_ids.insert_unique(hash, id, |id| {
            hasher.hash_one(strings[*id as usize].as_bytes())
        });
        id
    }

    /// Sizes the tables for a batch's first profile, instead of growing (and rehashing)
    /// each several times. Tables kept warm from earlier flushes
    /// ([`DatasetBuilder::take_dataset`]) hold most of the profile's symbols already, so
    /// only what they lack of its counts is reserved: reserving the whole counts again
    /// doubled them.
    fn reserve_for(&mut self, profile: &Profile) {
        let (strings, hasher) = (&self.strings, &self.string_hasher);
        self.string_ids.reserve(
            profile.string_table.len().saturating_sub(strings.len()),
            |id| hasher.hash_one(strings[*id as usize].as_bytes()),
        );
        let lacking = |wanted: usize, held: usize| wanted.saturating_sub(held);
        self.mappings
            .reserve(lacking(profile.mapping.len(), self.mappings.rows.len()));
        self.functions
            .reserve(lacking(profile.function.len(), self.functions.rows.len()));
        self.locations
            .reserve(lacking(profile.location.len(), self.locations.rows.len()));
        // Stack nodes: a profile's call tree has about as many nodes as it has locations.
        self.stacks
            .reserve(lacking(profile.location.len(), self.stacks.rows.len()));
        self.whole_stacks
            .reserve(lacking(profile.sample.len(), self.whole_stacks.len()));
    }

    fn truncated_location(&mut self) -> u32 {
        if let Some(id) = self.truncated_location {
            return id;
        }
        let name = self.intern(TRUNCATED_FRAME);
        let function = self.functions.intern(FunctionRow {
            name,
            system_name: name,
            ..Default::default()
        });
        let id = self.intern_location(LocationKey {
            mapping: 0,
            address: 0,
            lines: smallvec![(function, 0)],
        });
        self.truncated_location = Some(id);
        id
    }

    fn pprof_mapping(
        &mut self,
        profile: &Profile,
        symbols: &mut ProfileSymbols,
        position: usize,
    ) -> u32 {
        if let Some(id) = symbols.mappings[position] {
            return id;
        }
        let m = &profile.mapping[position];
        let string = |index: i64| symbols.strings.get(index as usize).copied().unwrap_or(0);
        let id = self.mappings.intern(MappingRow {
            memory_start: m.memory_start,
            memory_limit: m.memory_limit,
            file_offset: m.file_offset,
            filename: string(m.filename),
            build_id: string(m.build_id),
            flags: (m.has_functions as u32)
                | (m.has_filenames as u32) << 1
                | (m.has_line_numbers as u32) << 2
                | (m.has_inline_frames as u32) << 3,
        });
        symbols.mappings[position] = Some(id);
        id
    }

    fn pprof_function(
        &mut self,
        profile: &Profile,
        symbols: &mut ProfileSymbols,
        position: usize,
    ) -> u32 {
        if let Some(id) = symbols.functions[position] {
            return id;
        }
        let f = &profile.function[position];
        let string = |index: i64| symbols.strings.get(index as usize).copied().unwrap_or(0);
        let id = self.functions.intern(FunctionRow {
            name: string(f.name),
            system_name: string(f.system_name),
            filename: string(f.filename),
            start_line: f.start_line,
        });
        symbols.functions[position] = Some(id);
        id
    }

    fn pprof_location(
        &mut self,
        input: &PprofInput<'_>,
        symbols: &mut ProfileSymbols,
        position: usize,
    ) -> u32 {
        if let Some(id) = symbols.locations[position] {
            return id;
        }
        let profile = input.profile;
        let location = &profile.location[position];
        let mapping = match input.index.mappings.get(location.mapping_id) {
            Some(mapping_position) if location.mapping_id != 0 => {
                self.pprof_mapping(profile, symbols, mapping_position)
            }
            _ => 0,
        };
        let mut lines = KeyLines::with_capacity(location.line.len());
        for line in &location.line {
            if let Some(function_position) = input.index.functions.get(line.function_id) {
                lines.push((
                    self.pprof_function(profile, symbols, function_position),
                    line.line,
                ));
            }
        }
        let id = self.intern_location(LocationKey {
            mapping,
            address: location.address,
            lines,
        });
        symbols.locations[position] = Some(id);
        id
    }

    /// Interns a location, adding the heap of a new row's spilled lines to
    /// `location_lines_bytes`, so that [`DatasetBuilder::heap_bytes`] stays a sum of
    /// counters instead of a walk over the rows.
    fn intern_location(&mut self, key: LocationKey) -> u32 {
        let spilled = match key.lines.spilled() {
            true => key.lines.capacity() * std::mem::size_of::<(u32, i64)>(),
            false => 0,
        };
        let known = self.locations.rows.len();
        let id = self.locations.intern(key);
        if self.locations.rows.len() > known {
            self.location_lines_bytes += spilled;
        }
        id
    }

    fn whole_stack_key(&self, locations: &[u32]) -> u128 {
        let [low, high] = &self.stack_hashers;
        (u128::from(high.hash_one(locations)) << 64) | u128::from(low.hash_one(locations))
    }

    /// The interned series labels of the request labels plus one group of sample labels
    /// (pprof string indices); sample labels never override `service_name` or `__name__`.
    fn series_label_ids(
        &mut self,
        base: &Labels,
        profile: &Profile,
        extra: &[(i64, i64)],
    ) -> Vec<(u32, u32)> {
        let mut labels = base.clone();
        for (key, value) in extra {
            let name = sanitize_label_name(&profile.string_or_empty(*key));
            if name == SERVICE_NAME || name == kiln_model::labels::METRIC_NAME {
                continue;
            }
            labels.set(name, profile.string_or_empty(*value));
        }
        labels
            .iter()
            .map(|label| (self.intern(&label.name), self.intern(&label.value)))
            .collect()
    }

    /// Adds one validated pprof. Never fails: [`kiln_model::pprof::validate`] has checked
    /// every reference already.
    pub fn add_pprof(&mut self, input: &PprofInput<'_>) {
        let profile = input.profile;
        let first_new = self.profiles.len();
        if self.profiles.is_empty() {
            // A flush's dataset often holds one profile.
            self.reserve_for(profile);
        }
        let mut symbols = ProfileSymbols {
            strings: profile
                .string_table
                .iter()
                .map(|bytes| self.intern_bytes(bytes))
                .collect(),
            mappings: vec![None; profile.mapping.len()],
            functions: vec![None; profile.function.len()],
            locations: vec![None; profile.location.len()],
        };
        let string = |symbols: &ProfileSymbols, index: i64| {
            symbols.strings.get(index as usize).copied().unwrap_or(0)
        };

        // Sample labels that become series labels, grouped so each distinct set is one series.
        let mut groups: HashMap<Vec<(i64, i64)>, usize> = HashMap::new();
        groups.insert(Vec::new(), 0);
        let mut group_keys: Vec<Vec<(i64, i64)>> = vec![Vec::new()];
        // The pending profile of each (group, type), indexed without hashing: it is looked
        // up for every sample and type.
        let mut pending_index: Vec<Vec<Option<usize>>> = vec![vec![None; input.types.len()]];
        // Interned series labels per group, computed once whatever the number of types.
        let mut group_label_ids: Vec<Option<Vec<(u32, u32)>>> = vec![None];
        let type_ids: Vec<u32> = input
            .types
            .iter()
            .map(|plan| self.intern(&plan.profile_type.id()))
            .collect();

        let mut stack_locations: Vec<u32> = Vec::new();
        // The previous sample's locations (outermost first) and their stack nodes.
        let mut previous_locations: Vec<u32> = Vec::new();
        let mut previous_nodes: Vec<u32> = Vec::new();
        for sample in profile.sample.iter() {
            // Resolve the stack, leaf first as pprof stores it; past the depth limit the
            // outermost frames are replaced by one [truncated] frame.
            stack_locations.clear();
            let depth = sample.location_id.len();
            let keep = if depth > input.max_stack_depth {
                input.max_stack_depth.saturating_sub(1)
            } else {
                depth
            };
            for id in &sample.location_id[..keep] {
                if let Some(position) = input.index.locations.get(u64::from(*id)) {
                    stack_locations.push(self.pprof_location(input, &mut symbols, position));
                }
            }
            if keep < depth {
                let truncated = self.truncated_location();
                stack_locations.push(truncated);
            }
            if stack_locations.is_empty() {
                continue;
            }
            stack_locations.reverse();
            let stack_key = self.whole_stack_key(&stack_locations);
            let node = match self.whole_stacks.get(&stack_key) {
                Some(leaf) => {
                    previous_locations.clear();
                    previous_nodes.clear();
                    *leaf
                }
                None => {
                    // Consecutive samples often share their outer frames: reuse the nodes of
                    // the common prefix with the previous sample instead of looking each one
                    // up again.
                    let shared = previous_locations
                        .iter()
                        .zip(&stack_locations)
                        .take_while(|(a, b)| a == b)
                        .count();
                    previous_nodes.truncate(shared);
                    let mut node = previous_nodes.last().copied().unwrap_or(0);
                    for location in &stack_locations[shared..] {
                        node = self.stacks.intern((node, *location));
                        previous_nodes.push(node);
                    }
                    std::mem::swap(&mut previous_locations, &mut stack_locations);
                    self.whole_stacks.insert(stack_key, node);
                    node
                }
            };

            // Split labels: per-sample ones stay with the sample, string labels pick the series.
            let (group, label_set) = if sample.label.is_empty() {
                (0, 0)
            } else {
                let mut series_extra: Vec<(i64, i64)> = Vec::new();
                let mut per_sample: Vec<(u32, u32)> = Vec::new();
                for label in sample.label {
                    if label.str == 0 {
                        continue; // numeric labels (e.g. Go's heap "bytes") are not series labels
                    }
                    let key = profile.string_table.get(label.key as usize).unwrap_or(b"");
                    if input.sample_labels_per_sample
                        || PER_SAMPLE_LABELS.iter().any(|name| name.as_bytes() == key)
                    {
                        per_sample.push((string(&symbols, label.key), string(&symbols, label.str)));
                    } else {
                        series_extra.push((label.key, label.str));
                    }
                }
                series_extra.sort_unstable();
                series_extra.dedup_by_key(|pair| pair.0);
                per_sample.sort_unstable();
                let label_set = if per_sample.is_empty() {
                    0
                } else {
                    self.label_sets.intern(per_sample)
                };
                let group = match groups.get(&series_extra) {
                    Some(group) => *group,
                    None => {
                        group_keys.push(series_extra.clone());
                        group_label_ids.push(None);
                        pending_index.push(vec![None; input.types.len()]);
                        groups.insert(series_extra, group_keys.len() - 1);
                        group_keys.len() - 1
                    }
                };
                (group, label_set)
            };

            for (type_position, plan) in input.types.iter().enumerate() {
                let raw = sample.value.get(plan.value_index).copied().unwrap_or(0);
                let value = match plan.scale {
                    Some(scale) => (raw as f64 * scale).round() as i64,
                    None => raw,
                };
                if value == 0 {
                    continue;
                }
                let pending = match pending_index[group][type_position] {
                    Some(pending) => pending,
                    None => {
                        if group_label_ids[group].is_none() {
                            let ids =
                                self.series_label_ids(input.labels, profile, &group_keys[group]);
                            group_label_ids[group] = Some(ids);
                        }
                        let series = self.series.intern(SeriesRow {
                            profile_type: type_ids[type_position],
                            labels: group_label_ids[group].clone().unwrap_or_default(),
                        });
                        self.profiles.push(PendingProfile {
                            row: ProfileRow {
                                id: input.id.as_bytes().to_vec(),
                                series,
                                time_nanos: input.time_nanos,
                                duration_nanos: input.duration_nanos,
                                period: profile.period,
                                type_index: plan.value_index as u32,
                                sample_count: 0,
                                total: 0,
                            },
                            // Every sample, for the profile without series labels: one
                            // allocation where most profiles have only that group. A
                            // group of labelled samples holds a share; it grows.
                            samples: Vec::with_capacity(match group {
                                0 => profile.sample.len(),
                                _ => 0,
                            }),
                        });
                        let pending = self.profiles.len() - 1;
                        pending_index[group][type_position] = Some(pending);
                        pending
                    }
                };
                self.profiles[pending]
                    .samples
                    .push(((node, label_set), value));
            }
        }
        // The samples wait in memory for their flush, which at 500 services is the
        // memory bound's to call: room reserved and left unused is given back. With room
        // for every sample in each series, one profile of each pprof of the corpus held
        // 6.0 MB, 5.3 MB now (docs/benchmarks.md, session 36).
        for pending in &mut self.profiles[first_new..] {
            if pending.samples.capacity() > pending.samples.len() + pending.samples.len() / 8 {
                pending.samples.shrink_to_fit();
            }
        }
    }

    /// Adds every profile of an existing dataset (of the same tenant and service), mapping
    /// its symbol ids onto this builder's. Compaction merges datasets this way: each
    /// string, mapping, function, location, stack node, series and sample label set ends
    /// up stored once however many inputs held it. The input must have passed
    /// [`Dataset::check`], so every id it holds is in range.
    pub fn add_dataset(&mut self, dataset: &Dataset) {
        let SymbolMap {
            strings,
            stacks,
            series,
        } = self.add_symbols(dataset);
        let string = |id: u32| strings.get(id as usize).copied().unwrap_or(0);
        // Per-sample label sets, rebuilt from the sample label rows (sorted by sample).
        let mut sample_sets = vec![0u32; dataset.sample_stack.len()];
        let mut row = 0;
        let label_rows = dataset.sample_label_sample.len();
        while row < label_rows {
            let sample = dataset.sample_label_sample[row];
            let mut set: Vec<(u32, u32)> = Vec::new();
            while row < label_rows && dataset.sample_label_sample[row] == sample {
                set.push((
                    string(dataset.sample_label_name[row]),
                    string(dataset.sample_label_value[row]),
                ));
                row += 1;
            }
            set.sort_unstable();
            if let Some(slot) = sample_sets.get_mut(sample as usize) {
                *slot = self.label_sets.intern(set);
            }
        }
        let offsets = dataset.profile_sample_offsets();
        for (index, profile) in dataset.profiles.iter().enumerate() {
            let range = offsets[index] as usize..offsets[index + 1] as usize;
            let samples = range
                .map(|sample| {
                    (
                        (
                            stacks[dataset.sample_stack[sample] as usize],
                            sample_sets[sample],
                        ),
                        dataset.sample_value[sample],
                    )
                })
                .collect();
            self.profiles.push(PendingProfile {
                row: ProfileRow {
                    series: series[profile.series as usize],
                    sample_count: 0,
                    ..profile.clone()
                },
                samples,
            });
        }
    }

    /// Interns the symbol tables and series of a checked dataset (its profiles and samples
    /// are left alone), and says where each of its strings, stack nodes and series went.
    /// The streaming merge ([`crate::merge`]) takes the symbols this way and the samples
    /// column by column.
    pub fn add_symbols(&mut self, dataset: &Dataset) -> SymbolMap {
        let strings: Vec<u32> = dataset.strings.iter().map(|s| self.intern(s)).collect();
        let string = |id: u32| strings.get(id as usize).copied().unwrap_or(0);
        let mappings: Vec<u32> = dataset
            .mappings
            .iter()
            .enumerate()
            .map(|(index, row)| {
                if index == 0 {
                    return 0; // the "no mapping" sentinel
                }
                self.mappings.intern(row.map_strings(string))
            })
            .collect();
        let functions: Vec<u32> = (dataset.functions.iter())
            .map(|row| self.functions.intern(row.map_strings(string)))
            .collect();
        let line_offsets = dataset.location_line_offsets();
        let locations: Vec<u32> = (0..dataset.location_mapping.len())
            .map(|location| {
                let lines = (line_offsets[location]..line_offsets[location + 1])
                    .map(|line| {
                        let line = line as usize;
                        (
                            functions[dataset.line_function[line] as usize],
                            dataset.line_number[line],
                        )
                    })
                    .collect();
                self.intern_location(LocationKey {
                    mapping: mappings
                        .get(dataset.location_mapping[location] as usize)
                        .copied()
                        .unwrap_or(0),
                    address: dataset.location_address[location],
                    lines,
                })
            })
            .collect();
        // Parents precede children, so each parent is mapped before its children.
        let mut stacks = vec![0u32; dataset.stack_parent.len()];
        for node in 1..dataset.stack_parent.len() {
            stacks[node] = self.stacks.intern((
                stacks[dataset.stack_parent[node] as usize],
                locations[dataset.stack_location[node] as usize],
            ));
        }
        let series: Vec<u32> = dataset
            .series
            .iter()
            .map(|row| self.series.intern(row.map_strings(string)))
            .collect();
        SymbolMap {
            strings,
            stacks,
            series,
        }
    }

    /// About the heap this builder holds, cheap enough to ask after every profile: the
    /// ingester counts an open batch by it (`max_pending_bytes`). Vectors inside rows (a
    /// series' labels, a label set) are counted at their usual size of one or two entries
    /// rather than walked; a location's lines only when they do not fit in the row.
    pub fn heap_bytes(&self) -> usize {
        const NESTED: usize = 32;
        let samples: usize = self
            .profiles
            .iter()
            .map(|profile| {
                std::mem::size_of::<PendingProfile>()
                    + profile.row.id.capacity()
                    + profile.samples.capacity() * std::mem::size_of::<((u32, u32), i64)>()
            })
            .sum();
        self.strings.heap_bytes()
            + self.string_ids.capacity() * (std::mem::size_of::<u32>() + 1)
            + self.mappings.heap_bytes()
            + self.functions.heap_bytes()
            + self.locations.heap_bytes()
            + self.location_lines_bytes
            + self.stacks.heap_bytes()
            + self.whole_stacks.capacity() * (std::mem::size_of::<(u128, u32)>() + 1)
            + self.series.heap_bytes()
            + self.series.rows.len() * NESTED
            + self.label_sets.heap_bytes()
            + self.label_sets.rows.len() * NESTED
            + samples
    }

    /// Profiles added so far (one per sample type of each pprof).
    pub fn is_empty(&self) -> bool {
        self.profiles.is_empty()
    }

    /// Rows held by the symbol tables (strings, mappings, functions, locations, stack
    /// nodes, series and sample label sets), used or not by the profiles added since the
    /// last [`DatasetBuilder::take_dataset`].
    pub fn symbol_rows(&self) -> usize {
        self.strings.len()
            + self.mappings.rows.len()
            + self.functions.rows.len()
            + self.locations.rows.len()
            + self.stacks.rows.len()
            + self.series.rows.len()
            + self.label_sets.rows.len()
    }

    /// The dataset of the profiles added since the last call, holding only the rows they
    /// use, renumbered in the order the builder first saw them (so a stack node's parent
    /// still precedes it). The builder keeps its tables and drops the profiles: the next
    /// flush of a busy service then finds the functions it knows with one lookup each
    /// instead of interning them afresh, about 2.4× cheaper per profile
    /// (docs/benchmarks.md).
    pub fn take_dataset(&mut self) -> Taken {
        let mut profiles = std::mem::take(&mut self.profiles);
        // Mark what the profiles use, from the samples outwards; `USED` until renumbered.
        const UNUSED: u32 = u32::MAX;
        const USED: u32 = 0;
        let mut stack_ids = vec![UNUSED; self.stacks.rows.len()];
        let mut set_ids = vec![UNUSED; self.label_sets.rows.len()];
        let mut series_ids = vec![UNUSED; self.series.rows.len()];
        stack_ids[0] = USED;
        set_ids[0] = USED;
        for pending in &profiles {
            series_ids[pending.row.series as usize] = USED;
            for ((stack, set), _) in &pending.samples {
                set_ids[*set as usize] = USED;
                let mut node = *stack as usize;
                while stack_ids[node] == UNUSED {
                    stack_ids[node] = USED;
                    node = self.stacks.rows[node].0 as usize;
                }
            }
        }
        let mut location_ids = vec![UNUSED; self.locations.rows.len()];
        for (_, location) in kept_rows(&self.stacks.rows[1..], &stack_ids[1..]) {
            location_ids[*location as usize] = USED;
        }
        let mut function_ids = vec![UNUSED; self.functions.rows.len()];
        let mut mapping_ids = vec![UNUSED; self.mappings.rows.len()];
        mapping_ids[0] = USED;
        for row in kept_rows(&self.locations.rows, &location_ids) {
            mapping_ids[row.mapping as usize] = USED;
            for (function, _) in &row.lines {
                function_ids[*function as usize] = USED;
            }
        }
        let mut string_ids = vec![UNUSED; self.strings.len()];
        string_ids[0] = USED;
        let mut mark_string = |id: u32| string_ids[id as usize] = USED;
        for row in kept_rows(&self.mappings.rows, &mapping_ids) {
            row.string_ids().into_iter().for_each(&mut mark_string);
        }
        for row in kept_rows(&self.functions.rows, &function_ids) {
            row.string_ids().into_iter().for_each(&mut mark_string);
        }
        for row in kept_rows(&self.series.rows, &series_ids) {
            row.string_ids().for_each(&mut mark_string);
        }
        for set in kept_rows(&self.label_sets.rows, &set_ids) {
            set.iter()
                .flat_map(|(name, value)| [*name, *value])
                .for_each(&mut mark_string);
        }
        let mut rows = 0;
        for ids in [
            &mut stack_ids,
            &mut set_ids,
            &mut series_ids,
            &mut location_ids,
            &mut function_ids,
            &mut mapping_ids,
            &mut string_ids,
        ] {
            let mut next = 0;
            for id in ids.iter_mut().filter(|id| **id != UNUSED) {
                *id = next;
                next += 1;
            }
            rows += next as usize;
        }

        let string = |id: u32| string_ids[id as usize];
        let mut dataset = Dataset {
            tenant: self.tenant.clone(),
            service: self.service.clone(),
            min_time_nanos: i64::MAX,
            max_time_nanos: i64::MIN,
            ..Default::default()
        };
        dataset.strings = (0..self.strings.len())
            .filter(|index| string_ids[*index] != UNUSED)
            .map(|index| &self.strings[index])
            .collect();
        dataset.mappings = kept_rows(&self.mappings.rows, &mapping_ids)
            .map(|row| row.map_strings(string))
            .collect();
        dataset.functions = kept_rows(&self.functions.rows, &function_ids)
            .map(|row| row.map_strings(string))
            .collect();
        for location in kept_rows(&self.locations.rows, &location_ids) {
            dataset
                .location_mapping
                .push(mapping_ids[location.mapping as usize]);
            dataset.location_address.push(location.address);
            dataset
                .location_line_count
                .push(location.lines.len() as u32);
            for (function, line) in &location.lines {
                dataset.line_function.push(function_ids[*function as usize]);
                dataset.line_number.push(*line);
            }
        }
        // The root sentinel, then the nodes it leads to (the root has no location).
        dataset.stack_parent.push(0);
        dataset.stack_location.push(0);
        for (parent, location) in kept_rows(&self.stacks.rows[1..], &stack_ids[1..]) {
            dataset.stack_parent.push(stack_ids[*parent as usize]);
            dataset
                .stack_location
                .push(location_ids[*location as usize]);
        }
        dataset.series = kept_rows(&self.series.rows, &series_ids)
            .map(|row| row.map_strings(string))
            .collect();
        let label_sets: Vec<Vec<(u32, u32)>> = kept_rows(&self.label_sets.rows, &set_ids)
            .map(|set| {
                set.iter()
                    .map(|(name, value)| (string(*name), string(*value)))
                    .collect()
            })
            .collect();
        for pending in &mut profiles {
            pending.row.series = series_ids[pending.row.series as usize];
            for ((stack, set), _) in &mut pending.samples {
                *stack = stack_ids[*stack as usize];
                *set = set_ids[*set as usize];
            }
        }
        emit_profiles(&mut dataset, profiles, &label_sets);
        let total = self.symbol_rows();
        let taken = Taken {
            dataset,
            used_rows: rows,
            new_rows: total - self.rows_at_take.unwrap_or(0),
            warm: self.rows_at_take.is_some(),
        };
        self.rows_at_take = Some(total);
        taken
    }

    pub fn finish(self) -> Dataset {
        self.finish_with_series().0
    }

    /// [`DatasetBuilder::finish`], and where each series the builder interned went: the
    /// series are numbered in their canonical order ([`canonical_series`]), so that the
    /// profile rows of any two finished datasets sort alike and a streaming merge reads
    /// each input once, front to back.
    pub fn finish_with_series(mut self) -> (Dataset, Vec<u32>) {
        let order = canonical_series(&self.strings, &self.series.rows);
        let mut renumbered = vec![0u32; order.len()];
        for (new, old) in order.iter().enumerate() {
            renumbered[*old as usize] = new as u32;
        }
        let mut rows: Vec<Option<SeriesRow>> = std::mem::take(&mut self.series.rows)
            .into_iter()
            .map(Some)
            .collect();
        let series: Vec<SeriesRow> = order
            .iter()
            .filter_map(|old| rows[*old as usize].take())
            .collect();
        for pending in &mut self.profiles {
            pending.row.series = renumbered[pending.row.series as usize];
        }
        let mut dataset = Dataset {
            tenant: self.tenant,
            service: self.service,
            min_time_nanos: i64::MAX,
            max_time_nanos: i64::MIN,
            strings: self.strings,
            mappings: self.mappings.rows,
            functions: self.functions.rows,
            series,
            ..Default::default()
        };
        dataset.stack_parent = self.stacks.rows.iter().map(|(parent, _)| *parent).collect();
        dataset.stack_location = self
            .stacks
            .rows
            .iter()
            .map(|(_, location)| *location)
            .collect();
        for location in &self.locations.rows {
            dataset.location_mapping.push(location.mapping);
            dataset.location_address.push(location.address);
            dataset
                .location_line_count
                .push(location.lines.len() as u32);
            for (function, line) in &location.lines {
                dataset.line_function.push(*function);
                dataset.line_number.push(*line);
            }
        }
        emit_profiles(&mut dataset, self.profiles, &self.label_sets.rows);
        (dataset, renumbered)
    }
}

/// Where [`DatasetBuilder::add_symbols`] put an input's strings, stack nodes and series.
pub struct SymbolMap {
    pub strings: Vec<u32>,
    pub stacks: Vec<u32>,
    pub series: Vec<u32>,
}

/// The series ids in canonical order: by profile type, then labels, compared as text.
/// Merged datasets number their series so; two such datasets' profile rows, sorted by
/// (series, time, id), are then in the same relative order in both and in their merge.
pub fn canonical_series(strings: &Strings, series: &[SeriesRow]) -> Vec<u32> {
    let text = |id: u32| strings.get(id as usize).unwrap_or("");
    let key = |row: &SeriesRow| {
        let labels: Vec<(&str, &str)> = (row.labels.iter())
            .map(|(name, value)| (text(*name), text(*value)))
            .collect();
        (text(row.profile_type), labels)
    };
    let mut order: Vec<u32> = (0..series.len() as u32).collect();
    order.sort_by_cached_key(|id| key(&series[*id as usize]));
    order
}

/// The rows whose new id in `ids` is set (not `u32::MAX`).
fn kept_rows<'a, T>(rows: &'a [T], ids: &'a [u32]) -> impl Iterator<Item = &'a T> + 'a {
    rows.iter()
        .zip(ids)
        .filter(|(_, id)| **id != u32::MAX)
        .map(|(row, _)| row)
}

/// Sorts the profiles by (series, time, id), sums each one's repeated (stack, label set)
/// samples, and appends them with their sample labels (`label_sets`, by set id) to the
/// dataset, whose symbol tables the ids already index.
fn emit_profiles(
    dataset: &mut Dataset,
    mut profiles: Vec<PendingProfile>,
    label_sets: &[Vec<(u32, u32)>],
) {
    // Sized once: grown by doubling, the two largest vectors of a compaction's output
    // were copied on each growth and could end up with twice the room they needed.
    let samples: usize = profiles.iter().map(|pending| pending.samples.len()).sum();
    dataset.sample_stack.reserve_exact(samples);
    dataset.sample_value.reserve_exact(samples);
    dataset.profiles.reserve_exact(profiles.len());
    profiles.sort_by(|a, b| {
        (a.row.series, a.row.time_nanos, &a.row.id).cmp(&(
            b.row.series,
            b.row.time_nanos,
            &b.row.id,
        ))
    });
    for pending in profiles {
        let mut samples = pending.samples;
        samples.sort_unstable_by_key(|(key, _)| *key);
        samples.dedup_by(|(key, value), (kept_key, kept)| {
            let same = key == kept_key;
            if same {
                *kept = kept.saturating_add(*value);
            }
            same
        });
        let mut row = pending.row;
        row.sample_count = samples.len() as u32;
        dataset.min_time_nanos = dataset.min_time_nanos.min(row.time_nanos);
        dataset.max_time_nanos = dataset.max_time_nanos.max(row.time_nanos);
        // A merged input's row carries its old total: summed afresh here.
        row.total = 0;
        for ((stack, label_set), value) in samples {
            row.total = row.total.saturating_add(value);
            if label_set != 0 {
                let sample = dataset.sample_stack.len() as u32;
                for (name, value) in &label_sets[label_set as usize] {
                    dataset.sample_label_sample.push(sample);
                    dataset.sample_label_name.push(*name);
                    dataset.sample_label_value.push(*value);
                }
            }
            dataset.sample_stack.push(stack);
            dataset.sample_value.push(value);
        }
        dataset.profiles.push(row);
    }
    if dataset.profiles.is_empty() {
        dataset.min_time_nanos = 0;
        dataset.max_time_nanos = 0;
    }
}
