//! Names for a dataset's unnamed frames, found when it is read.
//!
//! A location with no lines but a mapping with a build id is a native frame its agent
//! could not name (a stripped binary). Once a debug file of that build id is held
//! ([`kiln_model::symbols::NameFrames`]), the decoded dataset gets those locations' lines:
//! new functions and strings are appended, and every later reader (flame graphs, top
//! tables, diff, insight, rules, the pprof export) sees a named frame. Nothing stored
//! changes; data written before the debug file arrived is named as well.
//!
//! The patched dataset is what the dataset cache keeps. One whose build ids were not all
//! found is marked pending: it is named again once a debug file arrives (the
//! symbolizer's generation moves) or the symbolizer's "not found" expires, and flame
//! graph shares are not kept of it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use kiln_model::symbols::{Frame, NameFrames};
use kiln_storage::Dataset;

use crate::QueryError;

/// What naming made of a dataset.
pub(crate) struct Named {
    pub dataset: Arc<Dataset>,
    /// When some frames still wait for a debug file: when to look again.
    pub retry_at: Option<Instant>,
    /// The symbolizer's generation the names were looked up at.
    pub generation: u64,
    /// Of the dataset's most profiled type, the value whose leaf frame is still unnamed.
    pub unnamed: Unnamed,
}

/// Of one profile type of a dataset, the value in unnamed leaf frames and in all; kept as
/// sums so that datasets are weighed by their value when a service's share is taken.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Unnamed {
    pub profile_type: String,
    pub unnamed: f64,
    pub total: f64,
}

/// Bits of a mapping's flags ([`kiln_storage::dataset::MappingRow::flags`]).
const NAMED_FLAGS: u32 = 0b1111;

pub(crate) async fn name_frames(
    dataset: Arc<Dataset>,
    names: &dyn NameFrames,
) -> Result<Named, QueryError> {
    let generation = names.generation();
    // Scanning locations and summing samples is a pass over the whole dataset (a
    // day's block holds millions of samples): it runs off the async workers, as
    // decoding does, and only reads, so it borrows a clone of the `Arc`.
    let scan = {
        let dataset = Arc::clone(&dataset);
        tokio::task::spawn_blocking(move || scan(&dataset)).await?
    };
    let Some(Scan { unnamed, offsets }) = scan else {
        // Named whole, it still weighs in its service's share by its value: the profile
        // rows' totals, no pass over the samples.
        let unnamed = unnamed_value(&dataset, None);
        return Ok(Named {
            dataset,
            retry_at: None,
            generation,
            unnamed,
        });
    };
    let mut found: HashMap<usize, Arc<[Frame]>> = HashMap::new();
    let mut named_mappings = Vec::new();
    let mut missing = false;
    for (mapping, locations) in unnamed {
        let row = dataset.mappings[mapping as usize];
        let addresses: Vec<u64> = locations.iter().map(|(_, a)| *a).collect();
        let answer = names
            .names(
                &dataset.tenant,
                dataset.string(row.build_id),
                (row.memory_start, row.memory_limit),
                &addresses,
            )
            .await;
        let Some(frames) = answer else {
            missing = true;
            continue;
        };
        let mut any = false;
        for ((location, _), frames) in locations.iter().zip(frames) {
            if !frames.is_empty() {
                found.insert(*location, frames);
                any = true;
            }
        }
        if any {
            named_mappings.push(mapping);
        }
    }
    let retry_at = missing.then(|| Instant::now() + names.retry_after());
    let (dataset, unnamed) = tokio::task::spawn_blocking(move || {
        if found.is_empty() {
            let share = unnamed_value(&dataset, Some(&offsets));
            return (dataset, share);
        }
        // The scan's clone is gone by now, so this takes the dataset unless the cache
        // still shares it (a pending dataset named again): then it is copied once.
        let mut owned = Arc::try_unwrap(dataset).unwrap_or_else(|shared| (*shared).clone());
        patch(&mut owned, &found, &named_mappings, &offsets);
        let offsets = owned.location_line_offsets();
        let share = unnamed_value(&owned, Some(&offsets));
        (Arc::new(owned), share)
    })
    .await?;
    Ok(Named {
        dataset,
        retry_at,
        generation,
        unnamed,
    })
}

/// A dataset's unnamed locations that a debug file could name, by mapping.
struct Scan {
    /// (mapping, [(location, address)]), in mapping order.
    unnamed: Vec<(u32, Vec<(usize, u64)>)>,
    /// [`Dataset::location_line_offsets`], computed once for the passes after.
    offsets: Vec<u32>,
}

/// `None` when every location has lines: nothing to name and nothing to count.
fn scan(dataset: &Dataset) -> Option<Scan> {
    let offsets = dataset.location_line_offsets();
    let mut unnamed: HashMap<u32, Vec<(usize, u64)>> = HashMap::new();
    let mut any_unnamed = false;
    for location in 0..dataset.location_address.len() {
        if offsets[location] != offsets[location + 1] {
            continue;
        }
        any_unnamed = true;
        let mapping = dataset.location_mapping.get(location).copied().unwrap_or(0);
        let has_build_id = dataset
            .mappings
            .get(mapping as usize)
            .is_some_and(|m| mapping != 0 && !dataset.string(m.build_id).is_empty());
        if has_build_id {
            unnamed
                .entry(mapping)
                .or_default()
                .push((location, dataset.location_address[location]));
        }
    }
    if !any_unnamed {
        return None;
    }
    let mut unnamed: Vec<_> = unnamed.into_iter().collect();
    unnamed.sort_unstable_by_key(|(mapping, _)| *mapping);
    Some(Scan { unnamed, offsets })
}

/// Gives each location in `found` its frames as lines (innermost first, as stored).
fn patch(
    dataset: &mut Dataset,
    found: &HashMap<usize, Arc<[Frame]>>,
    mappings: &[u32],
    offsets: &[u32],
) {
    let mut strings: HashMap<String, u32> = dataset
        .strings
        .iter()
        .enumerate()
        .map(|(id, s)| (s.to_string(), id as u32))
        .collect();
    let mut string = |dataset: &mut Dataset, text: &str| -> u32 {
        if let Some(id) = strings.get(text) {
            return *id;
        }
        let id = dataset.strings.len() as u32;
        dataset.strings.push(text);
        strings.insert(text.to_string(), id);
        id
    };
    let mut functions: HashMap<(u32, u32), u32> = dataset
        .functions
        .iter()
        .enumerate()
        .map(|(id, f)| ((f.name, f.filename), id as u32))
        .collect();
    let lines = dataset.line_function.len() + found.values().map(|f| f.len()).sum::<usize>();
    let mut line_function = Vec::with_capacity(lines);
    let mut line_number = Vec::with_capacity(lines);
    for location in 0..dataset.location_line_count.len() {
        if let Some(frames) = found.get(&location) {
            for frame in frames.iter() {
                let name = string(dataset, &frame.name);
                let file = string(dataset, &frame.file);
                let function = *functions.entry((name, file)).or_insert_with(|| {
                    dataset.functions.push(kiln_storage::dataset::FunctionRow {
                        name,
                        system_name: name,
                        filename: file,
                        start_line: 0,
                    });
                    (dataset.functions.len() - 1) as u32
                });
                line_function.push(function);
                line_number.push(frame.line);
            }
            dataset.location_line_count[location] = frames.len() as u32;
        } else {
            let (start, end) = (offsets[location] as usize, offsets[location + 1] as usize);
            line_function.extend_from_slice(&dataset.line_function[start..end]);
            line_number.extend_from_slice(&dataset.line_number[start..end]);
        }
    }
    dataset.line_function = line_function;
    dataset.line_number = line_number;
    for mapping in mappings {
        if let Some(row) = dataset.mappings.get_mut(*mapping as usize) {
            row.flags |= NAMED_FLAGS;
        }
    }
}

/// Of the type with the most profiles (or stack sums), the value whose own frame, the
/// stack's leaf, is a location without lines, and all its value (`offsets` is `None` when
/// every location has lines). The unnamed value is the samples "in" unnamed frames,
/// as a flame graph's self values count them. (Counting every stack with an unnamed frame
/// anywhere would count a program whose every stack starts in an unnamed libc frame as
/// unnamed whole, however well its own code is named.)
fn unnamed_value(dataset: &Dataset, offsets: Option<&[u32]>) -> Unnamed {
    let unnamed_location = |location: u32| {
        offsets.is_some_and(|o| o.get(location as usize) == o.get(location as usize + 1))
    };
    let any_unnamed =
        offsets.is_some() && (0..dataset.location_line_count.len() as u32).any(unnamed_location);
    let is_marked = |stack: u32| {
        any_unnamed
            && stack != 0
            && dataset
                .stack_location
                .get(stack as usize)
                .is_some_and(|location| unnamed_location(*location))
    };
    // (unnamed, total) per profile type string id.
    let mut by_type: HashMap<u32, (f64, f64, u64)> = HashMap::new();
    let series_type = |series: u32| {
        dataset
            .series
            .get(series as usize)
            .map_or(0, |s| s.profile_type)
    };
    if !any_unnamed && !dataset.profiles_omitted {
        for profile in &dataset.profiles {
            let entry = by_type.entry(series_type(profile.series)).or_default();
            entry.2 += 1;
            entry.1 += profile.total as f64;
        }
    } else if !dataset.samples_omitted && !dataset.profiles_omitted {
        let mut sample = 0usize;
        for profile in &dataset.profiles {
            let entry = by_type.entry(series_type(profile.series)).or_default();
            entry.2 += 1;
            for _ in 0..profile.sample_count {
                let (Some(stack), Some(value)) = (
                    dataset.sample_stack.get(sample),
                    dataset.sample_value.get(sample),
                ) else {
                    break;
                };
                let value = *value as f64;
                entry.1 += value;
                if is_marked(*stack) {
                    entry.0 += value;
                }
                sample += 1;
            }
        }
    } else {
        for ((series, stack), value) in dataset
            .stack_sum_series
            .iter()
            .zip(&dataset.stack_sum_stack)
            .zip(&dataset.stack_sum_value)
        {
            let entry = by_type.entry(series_type(*series)).or_default();
            entry.2 += 1;
            entry.1 += *value as f64;
            if is_marked(*stack) {
                entry.0 += *value as f64;
            }
        }
    }
    by_type
        .iter()
        .max_by_key(|(_, (_, _, count))| *count)
        .map_or_else(Unnamed::default, |(profile_type, (unnamed, total, _))| {
            Unnamed {
                profile_type: dataset.string(*profile_type).to_string(),
                unnamed: *unnamed,
                total: *total,
            }
        })
}
