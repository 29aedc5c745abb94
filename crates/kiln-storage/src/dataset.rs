//! The in-memory form of a dataset: symbol tables, the stack prefix tree, series and
//! profiles, and the checks that let readers index it freely. [`crate::builder`] makes one.

use kiln_model::labels::Labels;

use crate::strings::Strings;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MappingRow {
    pub memory_start: u64,
    pub memory_limit: u64,
    pub file_offset: u64,
    pub filename: u32,
    pub build_id: u32,
    /// Bit 0: has_functions, 1: has_filenames, 2: has_line_numbers, 3: has_inline_frames.
    pub flags: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FunctionRow {
    pub name: u32,
    pub system_name: u32,
    pub filename: u32,
    pub start_line: i64,
}

/// A series: one profile type and one label set (names and values are string ids, sorted
/// by name).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct SeriesRow {
    pub profile_type: u32,
    pub labels: Vec<(u32, u32)>,
}

// Rows that name strings: a builder moving a row into another id space (a merge, or a
// flush taking the rows it uses) maps or marks exactly these ids.
impl MappingRow {
    pub fn string_ids(&self) -> [u32; 2] {
        [self.filename, self.build_id]
    }

    pub fn map_strings(&self, string: impl Fn(u32) -> u32) -> MappingRow {
        MappingRow {
            filename: string(self.filename),
            build_id: string(self.build_id),
            ..*self
        }
    }
}

impl FunctionRow {
    pub fn string_ids(&self) -> [u32; 3] {
        [self.name, self.system_name, self.filename]
    }

    pub fn map_strings(&self, string: impl Fn(u32) -> u32) -> FunctionRow {
        FunctionRow {
            name: string(self.name),
            system_name: string(self.system_name),
            filename: string(self.filename),
            start_line: self.start_line,
        }
    }
}

impl SeriesRow {
    pub fn string_ids(&self) -> impl Iterator<Item = u32> + '_ {
        let labels = self.labels.iter().flat_map(|(name, value)| [*name, *value]);
        std::iter::once(self.profile_type).chain(labels)
    }

    pub fn map_strings(&self, string: impl Fn(u32) -> u32) -> SeriesRow {
        SeriesRow {
            profile_type: string(self.profile_type),
            labels: (self.labels.iter())
                .map(|(name, value)| (string(*name), string(*value)))
                .collect(),
        }
    }
}

/// One profile of one series; its samples follow those of the previous row.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProfileRow {
    pub id: Vec<u8>,
    pub series: u32,
    pub time_nanos: i64,
    pub duration_nanos: i64,
    pub period: i64,
    /// Position of this sample type in the profile as it was received.
    pub type_index: u32,
    pub sample_count: u32,
    /// The sum of its samples' values (saturating), so a time series needs no samples.
    pub total: i64,
}

/// All profiles of one (tenant, service), with each symbol stored once.
///
/// Id conventions: string 0 is "", mapping 0 means "no mapping", stack node 0 is the root
/// sentinel (a node whose parent is 0 is an outermost frame). Functions and locations are
/// 0-based. Samples of profile `i` are the `profiles[i].sample_count` samples after those
/// of profile `i - 1`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Dataset {
    pub tenant: String,
    pub service: String,
    pub min_time_nanos: i64,
    pub max_time_nanos: i64,
    pub strings: Strings,
    pub mappings: Vec<MappingRow>,
    pub functions: Vec<FunctionRow>,
    pub location_mapping: Vec<u32>,
    pub location_address: Vec<u64>,
    pub location_line_count: Vec<u32>,
    pub line_function: Vec<u32>,
    pub line_number: Vec<i64>,
    pub stack_parent: Vec<u32>,
    pub stack_location: Vec<u32>,
    pub series: Vec<SeriesRow>,
    pub profiles: Vec<ProfileRow>,
    pub sample_stack: Vec<u32>,
    pub sample_value: Vec<i64>,
    pub sample_label_sample: Vec<u32>,
    pub sample_label_name: Vec<u32>,
    pub sample_label_value: Vec<u32>,
    /// Per series, the summed value of each stack node over all the dataset's profiles
    /// (the series' flame graph, pre-merged), sorted by (series, stack), zero sums left
    /// out. Compaction writes them ([`Dataset::sum_stacks`]): a query that covers the
    /// whole dataset then reads a few rows per stack instead of every sample, which is
    /// what makes a month of blocks cheap to merge. Empty in segments, in blocks of
    /// format 1, and where they would not have been much smaller than the samples
    /// ([`Dataset::sum_stacks_if_smaller`]).
    pub stack_sum_series: Vec<u32>,
    pub stack_sum_stack: Vec<u32>,
    pub stack_sum_value: Vec<i64>,
    /// The samples were not decoded (a projection left them out): the sample tables are
    /// empty although the profiles own samples.
    pub samples_omitted: bool,
    /// The profile rows were not decoded either (a summed dataset read for a flame
    /// graph): the stack sums are all there is.
    pub profiles_omitted: bool,
}

impl Dataset {
    /// Start offset of each location's lines in `line_*`, plus the end.
    pub fn location_line_offsets(&self) -> Vec<u32> {
        prefix_sums(&self.location_line_count)
    }

    /// Start offset of each profile's samples, plus the end.
    pub fn profile_sample_offsets(&self) -> Vec<u32> {
        let mut offsets = Vec::with_capacity(self.profiles.len() + 1);
        let mut total = 0u32;
        offsets.push(0);
        for profile in &self.profiles {
            total += profile.sample_count;
            offsets.push(total);
        }
        offsets
    }

    pub fn string(&self, id: u32) -> &str {
        self.strings.get(id as usize).unwrap_or("")
    }

    pub fn series_labels(&self, series: &SeriesRow) -> Labels {
        Labels::from_pairs(
            series
                .labels
                .iter()
                .map(|(name, value)| (self.string(*name), self.string(*value))),
        )
    }

    /// Approximate heap memory held, for caches to budget by.
    pub fn heap_bytes(&self) -> usize {
        fn vec<T>(v: &[T]) -> usize {
            std::mem::size_of_val(v)
        }
        self.strings.heap_bytes()
            + vec(&self.mappings)
            + vec(&self.functions)
            + vec(&self.location_mapping)
            + vec(&self.location_address)
            + vec(&self.location_line_count)
            + vec(&self.line_function)
            + vec(&self.line_number)
            + vec(&self.stack_parent)
            + vec(&self.stack_location)
            + self
                .series
                .iter()
                .map(|s| 32 + 8 * s.labels.len())
                .sum::<usize>()
            + self.profiles.iter().map(|p| 64 + p.id.len()).sum::<usize>()
            + vec(&self.sample_stack)
            + vec(&self.sample_value)
            + vec(&self.sample_label_sample)
            + vec(&self.sample_label_name)
            + vec(&self.sample_label_value)
            + vec(&self.stack_sum_series)
            + vec(&self.stack_sum_stack)
            + vec(&self.stack_sum_value)
    }

    /// Fills the stack sums from the samples. Profiles are grouped by series (they are
    /// sorted so already, but nothing relies on it); each series is summed into a dense
    /// per-stack slot, and only the slots it touched are read back and cleared, so the
    /// cost is the samples plus each series' distinct stacks, never series x stacks. Ids
    /// must be in range: a dataset a [`crate::DatasetBuilder`] made, or one that passed
    /// [`Dataset::check`].
    pub fn sum_stacks(&mut self) {
        self.sum_stacks_within(usize::MAX);
    }

    /// [`Dataset::sum_stacks`], unless the sums would hold more rows than half the
    /// samples; then the dataset keeps none, and says so. Sums that large save a query
    /// less than half its work and add their bytes to the block for its whole retention,
    /// and while a merge encodes its output they are held beside the samples: a job of
    /// 2,000 profiles of 50 series with few profiles each held 34 MB of sums at its peak
    /// (heaptrack, docs/benchmarks.md). Readers use the samples where a dataset has no
    /// sums (docs/FORMAT.md).
    pub fn sum_stacks_if_smaller(&mut self) -> bool {
        self.sum_stacks_within(self.sample_stack.len() / 2)
    }

    /// Sums at most `max_rows` rows, or none. The rows are counted in a first pass and
    /// the tables sized once: grown by doubling, they were copied at each step and held
    /// up to twice the room they needed.
    fn sum_stacks_within(&mut self, max_rows: usize) -> bool {
        self.stack_sum_series = Vec::new();
        self.stack_sum_stack = Vec::new();
        self.stack_sum_value = Vec::new();
        if self.samples_omitted {
            return false;
        }
        let offsets = self.profile_sample_offsets();
        let mut rows: Vec<usize> = (0..self.profiles.len()).collect();
        rows.sort_by_key(|row| self.profiles[*row].series);
        let groups = || {
            rows.chunk_by(|a, b| self.profiles[*a].series == self.profiles[*b].series)
                .map(|group| {
                    let samples = group
                        .iter()
                        .flat_map(|row| offsets[*row] as usize..offsets[row + 1] as usize);
                    (self.profiles[group[0]].series, samples)
                })
        };
        let mut used = vec![false; self.stack_parent.len()];
        let mut touched: Vec<u32> = Vec::new();
        // An upper bound: a stack whose values sum to zero takes no row.
        let mut distinct = 0usize;
        for (_, samples) in groups() {
            for sample in samples {
                // A checked dataset's stacks are in range.
                let stack = self.sample_stack[sample];
                if !std::mem::replace(&mut used[stack as usize], true) {
                    touched.push(stack);
                }
            }
            distinct += touched.len();
            for stack in touched.drain(..) {
                used[stack as usize] = false;
            }
            if distinct > max_rows {
                return false;
            }
        }
        let (mut sum_series, mut sum_stack, mut sum_value) = (
            Vec::with_capacity(distinct),
            Vec::with_capacity(distinct),
            Vec::with_capacity(distinct),
        );
        let mut slots = vec![0i64; self.stack_parent.len()];
        for (series, samples) in groups() {
            for sample in samples {
                let stack = self.sample_stack[sample];
                let slot = &mut slots[stack as usize];
                *slot = slot.saturating_add(self.sample_value[sample]);
                if !std::mem::replace(&mut used[stack as usize], true) {
                    touched.push(stack);
                }
            }
            touched.sort_unstable();
            for stack in touched.drain(..) {
                used[stack as usize] = false;
                let value = std::mem::take(&mut slots[stack as usize]);
                if value != 0 {
                    sum_series.push(series);
                    sum_stack.push(stack);
                    sum_value.push(value);
                }
            }
        }
        self.stack_sum_series = sum_series;
        self.stack_sum_stack = sum_stack;
        self.stack_sum_value = sum_value;
        true
    }

    /// The profile type ids present, sorted, and the number of distinct profiles: what
    /// the metastore indexes about a dataset.
    pub fn summary(&self) -> (Vec<String>, u64) {
        let mut profile_types: Vec<String> = self
            .series
            .iter()
            .map(|series| self.string(series.profile_type).to_string())
            .collect();
        profile_types.sort();
        profile_types.dedup();
        let mut ids: Vec<&[u8]> = self.profiles.iter().map(|p| p.id.as_slice()).collect();
        ids.sort_unstable();
        ids.dedup();
        (profile_types, ids.len() as u64)
    }

    /// Checks that every id points inside its table, so readers can index freely.
    pub fn check(&self) -> Result<(), String> {
        let strings = self.strings.len() as u32;
        let in_range = |id: u32, len: usize, what: &str| -> Result<(), String> {
            if (id as usize) < len {
                Ok(())
            } else {
                Err(format!("{what} {id} out of range ({len})"))
            }
        };
        if self.strings.first().is_some_and(|s| !s.is_empty()) {
            return Err("string 0 is not empty".into());
        }
        for m in &self.mappings {
            in_range(m.filename, strings as usize, "mapping filename")?;
            in_range(m.build_id, strings as usize, "mapping build id")?;
        }
        for f in &self.functions {
            in_range(f.name, strings as usize, "function name")?;
            in_range(f.system_name, strings as usize, "function system name")?;
            in_range(f.filename, strings as usize, "function filename")?;
        }
        let locations = self.location_mapping.len();
        if self.location_address.len() != locations || self.location_line_count.len() != locations {
            return Err("location columns differ in length".into());
        }
        for id in &self.location_mapping {
            in_range(*id, self.mappings.len().max(1), "location mapping")?;
        }
        let lines: u64 = self.location_line_count.iter().map(|c| *c as u64).sum();
        if lines != self.line_function.len() as u64
            || self.line_number.len() != self.line_function.len()
        {
            return Err("line columns do not match location line counts".into());
        }
        for id in &self.line_function {
            in_range(*id, self.functions.len(), "line function")?;
        }
        if self.stack_parent.len() != self.stack_location.len() {
            return Err("stack columns differ in length".into());
        }
        for (node, (parent, location)) in self
            .stack_parent
            .iter()
            .zip(&self.stack_location)
            .enumerate()
        {
            if node == 0 {
                continue;
            }
            // Parents precede children, which also rules out cycles.
            if *parent as usize >= node {
                return Err(format!(
                    "stack node {node} has parent {parent} not before it"
                ));
            }
            in_range(*location, locations, "stack location")?;
        }
        for series in &self.series {
            in_range(series.profile_type, strings as usize, "series profile type")?;
            for (name, value) in &series.labels {
                in_range(*name, strings as usize, "series label name")?;
                in_range(*value, strings as usize, "series label value")?;
            }
        }
        let mut samples = 0u64;
        for profile in &self.profiles {
            in_range(profile.series, self.series.len(), "profile series")?;
            samples += profile.sample_count as u64;
        }
        let expected_samples = if self.samples_omitted { 0 } else { samples };
        if expected_samples != self.sample_stack.len() as u64
            || self.sample_value.len() != self.sample_stack.len()
        {
            return Err("sample columns do not match profile sample counts".into());
        }
        let sums = self.stack_sum_series.len();
        if self.stack_sum_stack.len() != sums || self.stack_sum_value.len() != sums {
            return Err("stack sum columns differ in length".into());
        }
        for (series, stack) in self.stack_sum_series.iter().zip(&self.stack_sum_stack) {
            in_range(*series, self.series.len(), "stack sum series")?;
            in_range(*stack, self.stack_parent.len(), "stack sum stack")?;
            if *stack == 0 {
                return Err("stack sum refers to the root stack node".into());
            }
        }
        for stack in &self.sample_stack {
            in_range(*stack, self.stack_parent.len(), "sample stack")?;
            if *stack == 0 {
                return Err("sample refers to the root stack node".into());
            }
        }
        let label_rows = self.sample_label_sample.len();
        if self.sample_label_name.len() != label_rows || self.sample_label_value.len() != label_rows
        {
            return Err("sample label columns differ in length".into());
        }
        for index in 0..label_rows {
            in_range(
                self.sample_label_sample[index],
                self.sample_stack.len(),
                "sample label sample",
            )?;
            in_range(
                self.sample_label_name[index],
                strings as usize,
                "sample label name",
            )?;
            in_range(
                self.sample_label_value[index],
                strings as usize,
                "sample label value",
            )?;
        }
        Ok(())
    }
}

fn prefix_sums(counts: &[u32]) -> Vec<u32> {
    let mut offsets = Vec::with_capacity(counts.len() + 1);
    let mut total = 0u32;
    offsets.push(0);
    for count in counts {
        total += count;
        offsets.push(total);
    }
    offsets
}
