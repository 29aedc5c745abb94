//! Cumulative profiles into deltas. Go's allocs, mutex and block endpoints report totals
//! since the process started; a flame graph over a time range must show what happened in
//! that range, so each scrape stores its difference from the previous one, as Parca and
//! Pyroscope do.
//!
//! Samples are matched across scrapes by their stack (each frame's address and its
//! function names and lines, since location ids are renumbered in every profile) and
//! their labels. Only the cumulative sample types are subtracted: in a Go heap profile
//! `alloc_objects` and `alloc_space` are totals, while `inuse_objects` and `inuse_space`
//! are a snapshot and stay as they are. A value that went down means the counters
//! restarted (the process restarted): the new profile is then the delta itself, as
//! everything it counts happened since the restart.

use std::collections::HashMap;

use kiln_model::pprof::{Profile, Samples};

/// The previous scrape's cumulative values of one (target, profile kind).
#[derive(Default)]
pub struct DeltaState {
    previous: Option<HashMap<Vec<u8>, Vec<i64>>>,
}

/// What one scrape becomes.
pub enum Delta {
    /// The first scrape: only a baseline, nothing to store yet.
    Baseline,
    /// The profile with cumulative values replaced by their increase.
    Profile(Profile),
    /// Counters went backwards: the process restarted; the profile is stored as it came.
    Reset(Profile),
}

/// Whether sample type `index` of `profile` counts since process start.
fn is_cumulative(profile: &Profile, index: usize) -> bool {
    let Some(value_type) = profile.sample_type.get(index) else {
        return false;
    };
    let name = profile.string_or_empty(value_type.r#type);
    // Snapshot types of Go's heap profile; everything else these endpoints serve
    // (alloc_*, contentions, delay, and the generic "samples") is cumulative.
    !name.starts_with("inuse_")
}

/// Positions of locations and functions by id, to key samples without quadratic lookups.
struct Index {
    locations: HashMap<u64, usize>,
    functions: HashMap<u64, usize>,
}

impl Index {
    fn new(profile: &Profile) -> Self {
        Index {
            locations: profile
                .location
                .iter()
                .enumerate()
                .map(|(position, location)| (location.id, position))
                .collect(),
            functions: profile
                .function
                .iter()
                .enumerate()
                .map(|(position, function)| (function.id, position))
                .collect(),
        }
    }

    /// A sample's stack and labels as bytes that do not depend on the profile's ids.
    fn sample_key(
        &self,
        profile: &Profile,
        location_ids: &[u32],
        labels: &[kiln_model::pprof::Label],
    ) -> Vec<u8> {
        let mut key = Vec::with_capacity(location_ids.len() * 32);
        for &id in location_ids {
            let id = u64::from(id);
            match self
                .locations
                .get(&id)
                .map(|position| &profile.location[*position])
            {
                Some(location) => {
                    key.extend_from_slice(&location.address.to_le_bytes());
                    for line in &location.line {
                        if let Some(position) = self.functions.get(&line.function_id) {
                            let function = &profile.function[*position];
                            key.extend_from_slice(
                                profile.string_or_empty(function.name).as_bytes(),
                            );
                        }
                        key.push(0);
                        key.extend_from_slice(&line.line.to_le_bytes());
                    }
                }
                None => key.extend_from_slice(&id.to_le_bytes()),
            }
            key.push(0xff);
        }
        key.push(0xfe);
        for label in labels {
            key.extend_from_slice(profile.string_or_empty(label.key).as_bytes());
            key.push(0);
            key.extend_from_slice(profile.string_or_empty(label.str).as_bytes());
            key.push(0);
            key.extend_from_slice(&label.num.to_le_bytes());
        }
        key
    }
}

impl DeltaState {
    pub fn apply(&mut self, mut profile: Profile) -> Delta {
        let cumulative: Vec<bool> = (0..profile.sample_type.len())
            .map(|index| is_cumulative(&profile, index))
            .collect();
        let index = Index::new(&profile);
        // Samples with the same stack and labels are merged: one total per key, in the
        // order first seen.
        let mut current: HashMap<Vec<u8>, Vec<i64>> = HashMap::new();
        let mut first_sample: Vec<(Vec<u8>, usize)> = Vec::new();
        for (position, sample) in profile.sample.iter().enumerate() {
            let key = index.sample_key(&profile, sample.location_id, sample.label);
            match current.get_mut(&key) {
                Some(totals) => {
                    for (total, value) in totals.iter_mut().zip(sample.value) {
                        *total += value;
                    }
                }
                None => {
                    current.insert(key.clone(), sample.value.to_vec());
                    first_sample.push((key, position));
                }
            }
        }
        let Some(previous) = self.previous.replace(current.clone()) else {
            return Delta::Baseline;
        };
        // A counter below its previous value anywhere means the process restarted.
        let reset = current.iter().any(|(key, values)| {
            previous.get(key).is_some_and(|before| {
                values
                    .iter()
                    .zip(before)
                    .zip(&cumulative)
                    .any(|((now, before), cumulative)| *cumulative && now < before)
            })
        });
        if reset {
            return Delta::Reset(profile);
        }
        let mut samples = Samples::default();
        for (key, position) in &first_sample {
            let Some(sample) = profile.sample.get(*position) else {
                continue;
            };
            let mut values = current.get(key).cloned().unwrap_or_default();
            if let Some(before) = previous.get(key) {
                for ((value, before), cumulative) in values.iter_mut().zip(before).zip(&cumulative)
                {
                    if *cumulative {
                        *value -= before;
                    }
                }
            }
            if values.iter().any(|value| *value != 0) {
                samples.push(sample.location_id, &values, sample.label);
            }
        }
        profile.sample = samples;
        Delta::Profile(profile)
    }
}
