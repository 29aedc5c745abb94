//! A request's profiles as pprofs, from the flat view of [`super::wire`].
//!
//! OTLP gives each sample type its own profile: a heap profile is four (alloc and in-use,
//! objects and bytes) sharing stacks. The profiles of one scope that share their time,
//! duration, period and attributes and carry no per-sample timestamps become one pprof
//! with a sample type each, as their pprof original was: the symbols are converted and
//! interned once instead of once per type, and the profile type is named from all of its
//! sample types as it is for pprof uploads. Profiles with timestamps become one pprof per
//! second of their samples (samples without timestamps go to the profile's own time).
//!
//! Dictionary lookups go through arrays indexed by the dictionary's own indices, stamped
//! with the pprof being built, so a request's pprofs share one allocation per table and a
//! known entry costs an array read.

use std::collections::BTreeMap;

use foldhash::{HashMap, HashMapExt};

use kiln_model::labels::{sanitize_label_name, Labels, SERVICE_NAME};
use kiln_model::pprof::{self, Profile, ValueType};

use super::wire::{Dictionary, ProfileView, Request};
use super::{hex, AnyValue, Export, KeyValue, Value};
use crate::parse::{from_pprof, ProfileContext};
use crate::{IngestError, Limits, ParsedProfile};

/// Converts every profile of a request. A profile that fails is counted and explained
/// (with the profiles merged with it); when every profile fails the request is refused as
/// a whole (400).
pub fn convert(
    request: &Request<'_>,
    received_bytes: usize,
    limits: &Limits,
) -> Result<Export, IngestError> {
    let dictionary = &request.dictionary;
    let total = request.profiles.len();
    let mut export = Export::default();
    let mut memo = Memo::new(dictionary);
    for resource in &request.resources {
        // Kept as text: a bad resource attribute refuses each of the resource's profiles.
        let resource_labels = match &resource.attributes {
            Some(attributes) => {
                attributes_labels(dictionary, attributes).map_err(|err| err.to_string())
            }
            None => Ok(Vec::new()),
        };
        for scope in &resource.scopes {
            let profiles = &request.profiles[scope.profiles.clone()];
            for group in groups(request, profiles) {
                let converted = resource_labels.clone().map_err(bad).and_then(|mut labels| {
                    labels.extend(attributes_labels(dictionary, &scope.attributes)?);
                    let share = received_bytes.saturating_mul(group.len()) / total.max(1);
                    let group: Vec<&ProfileView> = group.iter().map(|&i| &profiles[i]).collect();
                    convert_group(request, &mut memo, labels, &group, share, limits)
                });
                match converted {
                    Ok(profiles) => export.profiles.extend(profiles),
                    Err(err) => {
                        export.rejected_profiles += group.len() as i64;
                        export.errors.push(err.to_string());
                    }
                }
            }
        }
    }
    if export.profiles.is_empty() && export.rejected_profiles > 0 {
        return Err(IngestError::BadRequest(format!(
            "every profile of the request was refused: {}",
            export.error_message()
        )));
    }
    Ok(export)
}

/// The scope's profiles in groups to merge, by position: profiles with timestamped
/// samples, or without a sample type, stand alone; the others join the first group of
/// the same time, duration, period and attributes that lacks their sample type.
fn groups(request: &Request<'_>, profiles: &[ProfileView<'_>]) -> Vec<Vec<usize>> {
    type Shared<'r> = (u64, u64, Option<(i32, i32)>, i64, &'r [i32]);
    let mut groups: Vec<Vec<usize>> = Vec::new();
    // Open groups by what their profiles share.
    let mut open: HashMap<Shared, Vec<usize>> = HashMap::new();
    for (position, profile) in profiles.iter().enumerate() {
        let samples = &request.samples[range(&profile.samples)];
        let mergeable = profile.sample_type.is_some()
            && samples.iter().all(|sample| sample.timestamps.is_empty());
        if !mergeable {
            groups.push(vec![position]);
            continue;
        }
        let shared = (
            profile.time_unix_nano,
            profile.duration_nano,
            profile
                .period_type
                .map(|period| (period.type_strindex, period.unit_strindex)),
            profile.period,
            &request.indices[range(&profile.attributes)],
        );
        let candidates = open.entry(shared).or_default();
        let joins = candidates.iter().copied().find(|&group| {
            groups[group]
                .iter()
                .all(|&other| profiles[other].sample_type != profile.sample_type)
        });
        match joins {
            Some(group) => groups[group].push(position),
            None => {
                candidates.push(groups.len());
                groups.push(vec![position]);
            }
        }
    }
    groups
}

fn range(range: &std::ops::Range<u32>) -> std::ops::Range<usize> {
    range.start as usize..range.end as usize
}

fn bad(message: impl Into<String>) -> IngestError {
    IngestError::BadRequest(message.into())
}

/// Looks up `index` in one of the dictionary's tables, naming the table when it is out
/// of range.
fn entry<'t, T>(table: &'t [T], index: i32, what: &str) -> Result<&'t T, IngestError> {
    usize::try_from(index)
        .ok()
        .and_then(|position| table.get(position))
        .ok_or_else(|| {
            bad(format!(
                "{what} index {index} is out of range (the dictionary's table has {} entries)",
                table.len()
            ))
        })
}

fn dictionary_string<'a>(dictionary: &Dictionary<'a>, index: i32) -> Result<&'a str, IngestError> {
    entry(&dictionary.strings, index, "string").copied()
}

/// An attribute value as label text.
fn value_text(dictionary: &Dictionary<'_>, value: &AnyValue) -> Result<String, IngestError> {
    Ok(match &value.value {
        None => String::new(),
        Some(Value::StringValue(text)) => text.clone(),
        Some(Value::BoolValue(value)) => value.to_string(),
        Some(Value::IntValue(value)) => value.to_string(),
        Some(Value::DoubleValue(value)) => value.to_string(),
        Some(Value::BytesValue(bytes)) => hex(bytes),
        Some(Value::StringValueStrindex(index)) => dictionary_string(dictionary, *index)?.into(),
        Some(Value::ArrayValue(array)) => {
            let items = array
                .values
                .iter()
                .map(|item| value_text(dictionary, item))
                .collect::<Result<Vec<_>, _>>()?;
            format!("[{}]", items.join(","))
        }
        Some(Value::KvlistValue(list)) => {
            let items = list
                .values
                .iter()
                .map(|pair| {
                    let key = key_text(dictionary, pair)?;
                    let value = match &pair.value {
                        Some(value) => value_text(dictionary, value)?,
                        None => String::new(),
                    };
                    Ok(format!("{key}={value}"))
                })
                .collect::<Result<Vec<_>, IngestError>>()?;
            format!("{{{}}}", items.join(","))
        }
    })
}

fn key_text<'a>(dictionary: &Dictionary<'a>, pair: &'a KeyValue) -> Result<&'a str, IngestError> {
    if pair.key.is_empty() && pair.key_strindex != 0 {
        return dictionary_string(dictionary, pair.key_strindex);
    }
    Ok(&pair.key)
}

/// Resource and scope attributes as series labels; `service.name` is `service_name`.
fn attributes_labels(
    dictionary: &Dictionary<'_>,
    attributes: &[KeyValue],
) -> Result<Vec<(String, String)>, IngestError> {
    let mut labels = Vec::with_capacity(attributes.len());
    for pair in attributes {
        let key = key_text(dictionary, pair)?;
        if key.is_empty() {
            continue;
        }
        let value = match &pair.value {
            Some(value) => value_text(dictionary, value)?,
            None => String::new(),
        };
        labels.push((label_name(key), value));
    }
    Ok(labels)
}

fn label_name(key: &str) -> String {
    if key == "service.name" {
        return SERVICE_NAME.to_string();
    }
    sanitize_label_name(key)
}

/// Values memoized per dictionary entry for the pprof being built: an entry counts only
/// if its stamp is the current pprof's.
struct Slots<T> {
    stamps: Vec<u32>,
    values: Vec<T>,
}

impl<T: Copy + Default> Slots<T> {
    fn new(len: usize) -> Self {
        Slots {
            stamps: vec![0; len],
            values: vec![T::default(); len],
        }
    }

    fn get(&self, index: usize, stamp: u32) -> Option<T> {
        (self.stamps.get(index) == Some(&stamp)).then(|| self.values[index])
    }

    fn set(&mut self, index: usize, stamp: u32, value: T) {
        if let Some(slot) = self.stamps.get_mut(index) {
            *slot = stamp;
            self.values[index] = value;
        }
    }
}

/// Every table's slots for one request; `stamp` names the pprof being built.
struct Memo {
    stamp: u32,
    strings: Slots<i64>,
    mappings: Slots<u64>,
    functions: Slots<u64>,
    locations: Slots<u32>,
    /// A sample attribute as a pprof label (key, value string ids).
    attributes: Slots<(i64, i64)>,
    /// A stack's range in the pprof builder's location ids.
    stacks: Slots<(u32, u32)>,
}

impl Memo {
    fn new(dictionary: &Dictionary<'_>) -> Self {
        Memo {
            stamp: 0,
            strings: Slots::new(dictionary.strings.len()),
            mappings: Slots::new(dictionary.mappings.len()),
            functions: Slots::new(dictionary.functions.len()),
            locations: Slots::new(dictionary.locations.len()),
            attributes: Slots::new(dictionary.attributes.len()),
            stacks: Slots::new(dictionary.stacks.len()),
        }
    }
}

/// Builds a pprof holding only what its samples reach, converting each dictionary entry
/// once.
struct PprofBuilder<'r, 'a> {
    dictionary: &'r Dictionary<'a>,
    memo: &'r mut Memo,
    profile: Profile,
    text_strings: pprof::StringInterner,
    /// Location ids of every stack converted so far (ranges in `Memo::stacks`).
    location_ids: Vec<u32>,
}

impl<'r, 'a> PprofBuilder<'r, 'a> {
    fn new(dictionary: &'r Dictionary<'a>, memo: &'r mut Memo) -> Self {
        // A new stamp invalidates every slot; on wrapping, the slots are cleared instead.
        memo.stamp = memo.stamp.wrapping_add(1);
        if memo.stamp == 0 {
            *memo = Memo::new(dictionary);
            memo.stamp = 1;
        }
        let mut builder = PprofBuilder {
            dictionary,
            memo,
            profile: Profile::default(),
            text_strings: Default::default(),
            location_ids: Vec::new(),
        };
        builder.text("");
        builder
    }

    /// A pprof string index for text that may not be in the dictionary.
    fn text(&mut self, value: &str) -> i64 {
        self.text_strings
            .intern(&mut self.profile.string_table, value)
    }

    fn string(&mut self, index: i32) -> Result<i64, IngestError> {
        let stamp = self.memo.stamp;
        if let Some(id) = self.memo.strings.get(index as usize, stamp) {
            return Ok(id);
        }
        let value = dictionary_string(self.dictionary, index)?;
        // Dictionary strings go in as they are: pprof allows repeats, and hashing every
        // symbol name to find one would cost more than the repeat.
        let id = match value {
            "" => 0,
            _ => {
                self.profile.string_table.push(value.as_bytes());
                self.profile.string_table.len() as i64 - 1
            }
        };
        self.memo.strings.set(index as usize, stamp, id);
        Ok(id)
    }

    fn mapping(&mut self, index: i32) -> Result<u64, IngestError> {
        if index == 0 {
            return Ok(0); // mapping_table[0] is the "no mapping" entry
        }
        let stamp = self.memo.stamp;
        if let Some(id) = self.memo.mappings.get(index as usize, stamp) {
            return Ok(id);
        }
        let dictionary = self.dictionary;
        let mapping = entry(&dictionary.mappings, index, "mapping")?;
        // The GNU build id is what debug files are kept and fetched under
        // (kiln-symbolize, debuginfod), so it wins over the others a mapping may carry
        // (the OpenTelemetry eBPF profiler sends `.gnu`, `.go` and its own `.htlhash`),
        // in whatever order they come; another is kept only when it is all there is.
        let (mut gnu, mut other) = (None, None);
        for attribute in &dictionary.indices[range(&mapping.attributes)] {
            let attribute = entry(&dictionary.attributes, *attribute, "attribute")?;
            let key = dictionary_string(dictionary, attribute.key_strindex)?;
            let held = match key.strip_prefix("process.executable.build_id") {
                Some(".gnu") => &mut gnu,
                Some(_) => &mut other,
                None => continue,
            };
            if held.is_none() {
                if let Some(value) = &attribute.value {
                    *held = Some(value_text(dictionary, value)?).filter(|v| !v.is_empty());
                }
            }
        }
        let build_id = gnu.or(other).map_or(0, |value| self.text(&value));
        let id = self.profile.mapping.len() as u64 + 1;
        let filename = self.string(mapping.filename_strindex)?;
        self.profile.mapping.push(pprof::Mapping {
            id,
            memory_start: mapping.memory_start,
            memory_limit: mapping.memory_limit,
            file_offset: mapping.file_offset,
            filename,
            build_id,
            ..Default::default()
        });
        self.memo.mappings.set(index as usize, stamp, id);
        Ok(id)
    }

    fn function(&mut self, index: i32) -> Result<u64, IngestError> {
        let stamp = self.memo.stamp;
        if let Some(id) = self.memo.functions.get(index as usize, stamp) {
            return Ok(id);
        }
        let function = entry(&self.dictionary.functions, index, "function")?;
        let id = self.profile.function.len() as u64 + 1;
        let name = self.string(function.name_strindex)?;
        let system_name = self.string(function.system_name_strindex)?;
        let filename = self.string(function.filename_strindex)?;
        self.profile.function.push(pprof::Function {
            id,
            name,
            system_name,
            filename,
            start_line: function.start_line,
        });
        self.memo.functions.set(index as usize, stamp, id);
        Ok(id)
    }

    fn location(&mut self, index: i32) -> Result<u32, IngestError> {
        let stamp = self.memo.stamp;
        if let Some(id) = self.memo.locations.get(index as usize, stamp) {
            return Ok(id);
        }
        let dictionary = self.dictionary;
        let location = entry(&dictionary.locations, index, "location")?;
        let mapping_id = self.mapping(location.mapping_index)?;
        let mut lines = pprof::Lines::with_capacity(location.lines.len());
        for line in &dictionary.lines[range(&location.lines)] {
            // function_table[0] is the "unknown function" entry: such a frame keeps its
            // address and mapping and is shown as module+0xoffset until symbolized.
            if line.function_index == 0 {
                continue;
            }
            lines.push(pprof::Line {
                function_id: self.function(line.function_index)?,
                line: line.line,
                column: line.column,
            });
        }
        let id = u32::try_from(self.profile.location.len() + 1)
            .map_err(|_| bad("too many locations"))?;
        self.profile.location.push(pprof::Location {
            id: u64::from(id),
            mapping_id,
            address: location.address,
            line: lines,
            is_folded: false,
        });
        self.memo.locations.set(index as usize, stamp, id);
        Ok(id)
    }

    /// The range of `location_ids` holding a stack's pprof location ids, leaf first as
    /// both formats store them.
    fn stack(&mut self, index: i32) -> Result<(usize, usize), IngestError> {
        let stamp = self.memo.stamp;
        if let Some((start, end)) = self.memo.stacks.get(index as usize, stamp) {
            return Ok((start as usize, end as usize));
        }
        let dictionary = self.dictionary;
        let stack = entry(&dictionary.stacks, index, "stack")?;
        let start = self.location_ids.len();
        for location in &dictionary.stack_locations[range(stack)] {
            let id = self.location(*location)?;
            self.location_ids.push(id);
        }
        let end = self.location_ids.len();
        let stored = (
            u32::try_from(start).map_err(|_| bad("too many locations"))?,
            u32::try_from(end).map_err(|_| bad("too many locations"))?,
        );
        self.memo.stacks.set(index as usize, stamp, stored);
        Ok((start, end))
    }

    /// A sample's labels: its attributes, then its link's trace and span ids.
    fn labels(
        &mut self,
        request: &Request<'_>,
        attributes: &[i32],
        link_index: i32,
        out: &mut Vec<pprof::Label>,
    ) -> Result<(), IngestError> {
        let dictionary = self.dictionary;
        for &index in attributes {
            let stamp = self.memo.stamp;
            let (key, str) = match self.memo.attributes.get(index as usize, stamp) {
                Some(label) => label,
                None => {
                    let attribute = entry(&dictionary.attributes, index, "attribute")?;
                    let key =
                        sanitize_label_name(dictionary_string(dictionary, attribute.key_strindex)?);
                    let value = match &attribute.value {
                        Some(value) => value_text(dictionary, value)?,
                        None => String::new(),
                    };
                    let label = (self.text(&key), self.text(&value));
                    self.memo.attributes.set(index as usize, stamp, label);
                    label
                }
            };
            out.push(pprof::Label {
                key,
                str,
                ..Default::default()
            });
        }
        if link_index != 0 {
            let (trace_id, span_id) = *entry(&request.dictionary.links, link_index, "link")?;
            for (key, id) in [("trace_id", trace_id), ("span_id", span_id)] {
                if id.iter().any(|byte| *byte != 0) {
                    out.push(pprof::Label {
                        key: self.text(key),
                        str: self.text(&hex(id)),
                        ..Default::default()
                    });
                }
            }
        }
        Ok(())
    }
}

/// The labels a group's series get: resource and scope attributes, then the first
/// profile's own (the group's profiles share them).
fn series_labels(
    request: &Request<'_>,
    mut labels: Vec<(String, String)>,
    profile: &ProfileView<'_>,
) -> Result<Labels, IngestError> {
    let dictionary = &request.dictionary;
    for attribute in &request.indices[range(&profile.attributes)] {
        let attribute = entry(&dictionary.attributes, *attribute, "attribute")?;
        let key = dictionary_string(dictionary, attribute.key_strindex)?;
        let value = match &attribute.value {
            Some(value) => value_text(dictionary, value)?,
            None => String::new(),
        };
        labels.push((label_name(key), value));
    }
    let mut series = Labels::new();
    for (name, value) in labels {
        if !name.is_empty() {
            series.set(name, value);
        }
    }
    Ok(series)
}

/// A sample's identity within a group: stack, link and attributes.
type SampleKey<'r> = (i32, i32, &'r [i32]);

/// `a == b` without a `memcmp` call for the attribute lists, which are short or empty: the
/// call cost more than the rest of the comparison.
#[inline]
fn same_key(a: &SampleKey<'_>, b: &SampleKey<'_>) -> bool {
    a.0 == b.0 && a.1 == b.1 && a.2.len() == b.2.len() && a.2.iter().zip(b.2).all(|(x, y)| x == y)
}

fn convert_group(
    request: &Request<'_>,
    memo: &mut Memo,
    labels: Vec<(String, String)>,
    group: &[&ProfileView<'_>],
    received_bytes: usize,
    limits: &Limits,
) -> Result<Vec<ParsedProfile>, IngestError> {
    let first = group[0];
    let series = series_labels(request, labels, first)?;
    let mut builder = PprofBuilder::new(&request.dictionary, memo);
    for profile in group {
        let sample_type = profile
            .sample_type
            .ok_or_else(|| bad("profile has no sample_type"))?;
        let value_type = ValueType {
            r#type: builder.string(sample_type.type_strindex)?,
            unit: builder.string(sample_type.unit_strindex)?,
        };
        builder.profile.sample_type.push(value_type);
    }
    if let Some(period_type) = first.period_type {
        builder.profile.period_type = Some(ValueType {
            r#type: builder.string(period_type.type_strindex)?,
            unit: builder.string(period_type.unit_strindex)?,
        });
    }
    builder.profile.period = first.period;
    if group.len() == 1 && has_timestamps(request, first) {
        return per_second(request, builder, series, first, received_bytes, limits);
    }

    // Rows of the merged pprof: the first profile's samples in order, then any sample of a
    // later profile that the rows lack. Profiles converted from one pprof list the same
    // samples in the same order, which needs no map.
    let types = group.len();
    let key = |sample: &super::wire::SampleView| -> SampleKey<'_> {
        (
            sample.stack_index,
            sample.link_index,
            &request.indices[range(&sample.attributes)],
        )
    };
    let sum = |sample: &super::wire::SampleView| {
        request.values[range(&sample.values)]
            .iter()
            .fold(0i64, |sum, value| sum.saturating_add(*value))
    };
    let mut rows: Vec<SampleKey> = Vec::new();
    let mut values: Vec<i64> = Vec::new();
    let mut positions: Option<HashMap<SampleKey, usize>> = None;
    for (type_index, profile) in group.iter().enumerate() {
        let samples = &request.samples[range(&profile.samples)];
        let aligned = positions.is_none()
            && samples.len() == rows.len()
            && samples
                .iter()
                .zip(&rows)
                .all(|(sample, row)| same_key(&key(sample), row));
        if type_index == 0 || aligned {
            for (row, sample) in samples.iter().enumerate() {
                if type_index == 0 {
                    rows.push(key(sample));
                    values.extend(std::iter::repeat_n(0, types));
                }
                let slot = &mut values[row * types + type_index];
                *slot = slot.saturating_add(sum(sample));
            }
            continue;
        }
        let positions = positions.get_or_insert_with(|| {
            let mut map = HashMap::with_capacity(rows.len());
            for (row, key) in rows.iter().enumerate() {
                map.entry(*key).or_insert(row);
            }
            map
        });
        for sample in samples {
            let sample_key = key(sample);
            let row = *positions.entry(sample_key).or_insert_with(|| {
                rows.push(sample_key);
                values.extend(std::iter::repeat_n(0, types));
                rows.len() - 1
            });
            let slot = &mut values[row * types + type_index];
            *slot = slot.saturating_add(sum(sample));
        }
    }
    // Stacks first, so that the samples' columns are allocated once at their size.
    let mut stacks = Vec::with_capacity(rows.len());
    let mut location_ids = 0;
    for (stack_index, _, _) in &rows {
        let (start, end) = builder.stack(*stack_index)?;
        location_ids += end - start;
        stacks.push((start, end));
    }
    builder
        .profile
        .sample
        .reserve(rows.len(), location_ids, values.len());
    let mut sample_labels = Vec::new();
    for (row, (_, link_index, attributes)) in rows.iter().enumerate() {
        let (start, end) = stacks[row];
        sample_labels.clear();
        builder.labels(request, attributes, *link_index, &mut sample_labels)?;
        builder.profile.sample.push(
            &builder.location_ids[start..end],
            &values[row * types..(row + 1) * types],
            &sample_labels,
        );
    }
    let context = ProfileContext {
        labels: series,
        time_nanos: Some(first.time_unix_nano as i64).filter(|time| *time > 0),
        duration_nanos: Some((first.duration_nano as i64).max(0)),
        id: group
            .iter()
            .find(|profile| !profile.profile_id.is_empty())
            .map(|profile| hex(profile.profile_id)),
        sample_labels_per_sample: true,
        ..Default::default()
    };
    Ok(vec![from_pprof(
        builder.profile,
        context,
        received_bytes,
        limits,
    )?])
}

fn has_timestamps(request: &Request<'_>, profile: &ProfileView<'_>) -> bool {
    request.samples[range(&profile.samples)]
        .iter()
        .any(|sample| !sample.timestamps.is_empty())
}

/// Samples of one profile grouped by the second their timestamps fall in (`None`: the
/// samples without timestamps, at the profile's own time).
type Buckets = BTreeMap<Option<i64>, Vec<(usize, i64)>>;

const SECOND: i64 = 1_000_000_000;

fn bucket_samples(
    request: &Request<'_>,
    profile: &ProfileView<'_>,
) -> Result<Buckets, IngestError> {
    let mut buckets = Buckets::new();
    for (position, sample) in request.samples[range(&profile.samples)].iter().enumerate() {
        let timestamps = &request.timestamps[range(&sample.timestamps)];
        let values = &request.values[range(&sample.values)];
        if timestamps.is_empty() {
            let value = values.iter().fold(0i64, |sum, v| sum.saturating_add(*v));
            buckets.entry(None).or_default().push((position, value));
            continue;
        }
        if !values.is_empty() && values.len() != timestamps.len() {
            return Err(bad(format!(
                "sample {position} has {} values and {} timestamps; they must pair up",
                values.len(),
                timestamps.len()
            )));
        }
        for (at, timestamp) in timestamps.iter().enumerate() {
            let timestamp = i64::try_from(*timestamp)
                .map_err(|_| bad(format!("sample {position} has a timestamp past 2262")))?;
            let value = values.get(at).copied().unwrap_or(1);
            let second = timestamp - timestamp.rem_euclid(SECOND);
            buckets
                .entry(Some(second))
                .or_default()
                .push((position, value));
        }
    }
    Ok(buckets)
}

/// A profile with timestamped samples: one pprof per second of them.
fn per_second(
    request: &Request<'_>,
    mut builder: PprofBuilder<'_, '_>,
    series: Labels,
    profile: &ProfileView<'_>,
    received_bytes: usize,
    limits: &Limits,
) -> Result<Vec<ParsedProfile>, IngestError> {
    // Each sample's location ids and labels, converted once for every bucket.
    let samples = &request.samples[range(&profile.samples)];
    let mut stacks = Vec::with_capacity(samples.len());
    let mut labels_flat: Vec<pprof::Label> = Vec::new();
    let mut sample_labels = Vec::with_capacity(samples.len());
    for sample in samples {
        stacks.push(builder.stack(sample.stack_index)?);
        let start = labels_flat.len();
        let attributes = &request.indices[range(&sample.attributes)];
        builder.labels(request, attributes, sample.link_index, &mut labels_flat)?;
        sample_labels.push((start, labels_flat.len()));
    }
    let location_ids = std::mem::take(&mut builder.location_ids);
    let mut tables = Some(builder.profile);

    let buckets = bucket_samples(request, profile)?;
    let profile_id = (!profile.profile_id.is_empty()).then(|| hex(profile.profile_id));
    let split = buckets.len() > 1;
    let mut parsed = Vec::with_capacity(buckets.len());
    let last = buckets.len().saturating_sub(1);
    for (bucket, (second, samples)) in buckets.into_iter().enumerate() {
        // Every bucket but the last gets a copy of the tables; the last takes them.
        let mut pprof = match (bucket == last, &mut tables) {
            (true, tables) => tables.take().unwrap_or_default(),
            (false, Some(tables)) => tables.clone(),
            (false, None) => Profile::default(),
        };
        for (position, value) in samples {
            let (stack_start, stack_end) = stacks[position];
            let (labels_start, labels_end) = sample_labels[position];
            pprof.sample.push(
                &location_ids[stack_start..stack_end],
                &[value],
                &labels_flat[labels_start..labels_end],
            );
        }
        let (time_nanos, duration_nanos) = match second {
            Some(second) => (second, SECOND),
            None => (profile.time_unix_nano as i64, profile.duration_nano as i64),
        };
        let id = profile_id.as_ref().map(|id| match (split, second) {
            (true, Some(second)) => format!("{id}-{}", second / SECOND),
            _ => id.clone(),
        });
        let context = ProfileContext {
            labels: series.clone(),
            time_nanos: (time_nanos > 0).then_some(time_nanos),
            duration_nanos: Some(duration_nanos.max(0)),
            id,
            sample_labels_per_sample: true,
            ..Default::default()
        };
        parsed.push(from_pprof(pprof, context, received_bytes, limits)?);
    }
    Ok(parsed)
}
