//! speedscope's file format (https://www.speedscope.app/file-format-schema.json): shared
//! frames, then profiles that are either `sampled` (stacks root first, with weights) or
//! `evented` (open/close events at times). Every profile of a file goes into one pprof;
//! the profile's name (py-spy writes one per thread) is kept as a per-sample label.

use serde::Deserialize;

use crate::build::{Frame, ProfileBuilder};
use crate::pprof::Profile;
use crate::FormatError;

/// The per-sample label holding a sample's speedscope profile name.
pub const PROFILE_NAME_LABEL: &str = "speedscope_profile";

#[derive(Deserialize)]
struct File {
    #[serde(default)]
    shared: Shared,
    #[serde(default)]
    profiles: Vec<SpeedscopeProfile>,
}

#[derive(Deserialize, Default)]
struct Shared {
    #[serde(default)]
    frames: Vec<FrameInfo>,
}

#[derive(Deserialize)]
struct FrameInfo {
    name: String,
    #[serde(default)]
    file: Option<String>,
    #[serde(default)]
    line: Option<i64>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum SpeedscopeProfile {
    Sampled {
        #[serde(default)]
        name: String,
        unit: String,
        samples: Vec<Vec<usize>>,
        weights: Vec<f64>,
    },
    Evented {
        #[serde(default)]
        name: String,
        unit: String,
        #[serde(rename = "startValue")]
        start_value: f64,
        #[serde(rename = "endValue")]
        end_value: f64,
        events: Vec<Event>,
    },
}

#[derive(Deserialize)]
struct Event {
    #[serde(rename = "type")]
    kind: String,
    frame: usize,
    at: f64,
}

/// What a file's values measure, which decides its profile type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Durations, converted to nanoseconds.
    Time,
    Bytes,
    /// Unit "none": counts of samples.
    Count,
}

fn unit_of(unit: &str) -> Result<(Unit, f64), FormatError> {
    Ok(match unit {
        "nanoseconds" => (Unit::Time, 1.0),
        "microseconds" => (Unit::Time, 1e3),
        "milliseconds" => (Unit::Time, 1e6),
        "seconds" => (Unit::Time, 1e9),
        "bytes" => (Unit::Bytes, 1.0),
        "none" => (Unit::Count, 1.0),
        other => {
            return Err(FormatError::malformed(format!(
                "speedscope unit {other:?} is not one of nanoseconds, microseconds, milliseconds, seconds, bytes, none"
            )))
        }
    })
}

/// A parsed speedscope file: one pprof with one sample type, and what it measures.
pub struct Parsed {
    pub profile: Profile,
    pub unit: Unit,
}

/// Parses a speedscope JSON file. `sample_type` names the values when they are time
/// (e.g. `cpu` or `wall`, from the upload's name); every profile must share one unit kind.
pub fn parse(data: &[u8], sample_type: &str, max_samples: usize) -> Result<Parsed, FormatError> {
    let file: File = serde_json::from_slice(data)
        .map_err(|err| FormatError::malformed(format!("invalid speedscope JSON: {err}")))?;
    if file.profiles.is_empty() {
        return Err(FormatError::malformed("speedscope file has no profiles"));
    }
    let units =
        file.profiles
            .iter()
            .map(|profile| match profile {
                SpeedscopeProfile::Sampled { unit, .. }
                | SpeedscopeProfile::Evented { unit, .. } => unit_of(unit),
            })
            .collect::<Result<Vec<_>, _>>()?;
    let unit = units[0].0;
    if units.iter().any(|(other, _)| *other != unit) {
        return Err(FormatError::malformed(
            "speedscope profiles of one file mix units of different kinds",
        ));
    }
    let (kind, unit_name) = match unit {
        Unit::Time => (sample_type, "nanoseconds"),
        Unit::Bytes => ("alloc_space", "bytes"),
        Unit::Count => ("samples", "count"),
    };
    let mut builder = ProfileBuilder::new(&[(kind, unit_name)], Some((kind, unit_name)), 0);
    let frames = &file.shared.frames;
    let locations: Vec<u32> = frames
        .iter()
        .map(|frame| {
            builder.location(&Frame {
                function: &frame.name,
                file: frame.file.as_deref().unwrap_or(""),
                line: frame.line.unwrap_or(0),
                ..Default::default()
            })
        })
        .collect();
    let location = |index: usize, what: &str| -> Result<u32, FormatError> {
        locations.get(index).copied().ok_or_else(|| {
            FormatError::malformed(format!(
                "{what} refers to frame {index}, but shared.frames has {} entries",
                frames.len()
            ))
        })
    };
    let mut stack: Vec<u32> = Vec::new();
    for (profile_index, (profile, (_, scale))) in file.profiles.iter().zip(&units).enumerate() {
        match profile {
            SpeedscopeProfile::Sampled {
                name,
                samples,
                weights,
                ..
            } => {
                if samples.len() != weights.len() {
                    return Err(FormatError::malformed(format!(
                        "speedscope profile {profile_index} has {} samples but {} weights",
                        samples.len(),
                        weights.len()
                    )));
                }
                for (sample, weight) in samples.iter().zip(weights) {
                    stack.clear();
                    for index in sample.iter().rev() {
                        stack.push(location(*index, "a sample")?);
                    }
                    add(&mut builder, &stack, weight * scale, name, max_samples)?;
                }
            }
            SpeedscopeProfile::Evented {
                name,
                start_value,
                end_value,
                events,
                ..
            } => {
                // Open frames root first; time between events goes to the open stack.
                let mut open: Vec<usize> = Vec::new();
                let mut last = *start_value;
                let mut charge = |builder: &mut ProfileBuilder,
                                  open: &[usize],
                                  last: &mut f64,
                                  until: f64|
                 -> Result<(), FormatError> {
                    let since = *last;
                    if until < since {
                        return Err(FormatError::malformed(format!(
                            "speedscope profile {profile_index}: event at {until} is before the previous one at {since}"
                        )));
                    }
                    if !open.is_empty() && until > since {
                        stack.clear();
                        for index in open.iter().rev() {
                            stack.push(location(*index, "an event")?);
                        }
                        add(builder, &stack, (until - since) * scale, name, max_samples)?;
                    }
                    *last = until;
                    Ok(())
                };
                for event in events {
                    charge(&mut builder, &open, &mut last, event.at)?;
                    match event.kind.as_str() {
                        "O" => {
                            location(event.frame, "an event")?;
                            open.push(event.frame);
                        }
                        "C" => match open.pop() {
                            Some(frame) if frame == event.frame => {}
                            Some(frame) => {
                                return Err(FormatError::malformed(format!(
                                    "speedscope profile {profile_index}: closing frame {} at {} while frame {frame} is open",
                                    event.frame, event.at
                                )))
                            }
                            None => {
                                return Err(FormatError::malformed(format!(
                                    "speedscope profile {profile_index}: closing frame {} at {} with no frame open",
                                    event.frame, event.at
                                )))
                            }
                        },
                        other => {
                            return Err(FormatError::malformed(format!(
                                "speedscope event type {other:?} is neither \"O\" nor \"C\""
                            )))
                        }
                    }
                }
                // Frames still open at the end run until the profile's end.
                let end = end_value.max(last);
                charge(&mut builder, &open, &mut last, end)?;
            }
        }
    }
    Ok(Parsed {
        profile: builder.finish(0, 0),
        unit,
    })
}

fn add(
    builder: &mut ProfileBuilder,
    stack: &[u32],
    value: f64,
    profile_name: &str,
    max_samples: usize,
) -> Result<(), FormatError> {
    if !value.is_finite() || value < 0.0 {
        return Err(FormatError::malformed(format!(
            "speedscope weight {value} is not a non-negative number"
        )));
    }
    let value = value.round().min(i64::MAX as f64) as i64;
    if value == 0 || stack.is_empty() {
        return Ok(());
    }
    let labels: &[(&str, &str)] = if profile_name.is_empty() {
        &[]
    } else {
        &[(PROFILE_NAME_LABEL, profile_name)]
    };
    builder.add(stack, &[value], labels);
    if builder.sample_count() > max_samples {
        return Err(FormatError::Limit(format!(
            "speedscope file has more than {max_samples} distinct stacks"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(profile: &Profile) -> Vec<(Vec<String>, i64)> {
        let name = |location_id: u32| {
            let location = &profile.location[location_id as usize - 1];
            let function = &profile.function[location.line[0].function_id as usize - 1];
            profile.string_or_empty(function.name)
        };
        let mut totals: Vec<(Vec<String>, i64)> = profile
            .sample
            .iter()
            .map(|sample| {
                (
                    sample
                        .location_id
                        .iter()
                        .rev()
                        .map(|id| name(*id))
                        .collect(),
                    sample.value[0],
                )
            })
            .collect();
        totals.sort();
        totals
    }

    #[test]
    fn sampled_and_evented_profiles_become_one_pprof() {
        let file = br#"{
          "shared": {"frames": [{"name": "main", "file": "a.py", "line": 1}, {"name": "work"}, {"name": "idle"}]},
          "profiles": [
            {"type": "sampled", "name": "thread 1", "unit": "milliseconds", "startValue": 0, "endValue": 3,
             "samples": [[0, 1], [0, 1], [0, 2]], "weights": [1, 1, 1]},
            {"type": "evented", "name": "thread 2", "unit": "microseconds", "startValue": 0, "endValue": 10,
             "events": [{"type": "O", "frame": 0, "at": 0}, {"type": "O", "frame": 1, "at": 2},
                        {"type": "C", "frame": 1, "at": 7}]}
          ]
        }"#;
        let parsed = parse(file, "cpu", 1000).unwrap();
        assert_eq!(parsed.unit, Unit::Time);
        let totals = totals(&parsed.profile);
        let expect = |stack: &[&str], value| (stack.iter().map(|s| s.to_string()).collect(), value);
        // thread 1: main;work 2 ms, main;idle 1 ms. thread 2: main self 2+3 µs, main;work 5 µs.
        assert_eq!(
            totals,
            vec![
                expect(&["main"], 5_000),
                expect(&["main", "idle"], 1_000_000),
                expect(&["main", "work"], 5_000),
                expect(&["main", "work"], 2_000_000),
            ]
        );
    }

    #[test]
    fn inconsistent_files_name_the_problem() {
        let cases: [(&[u8], &str); 6] = [
            (br#"{"profiles": []}"#, "no profiles"),
            (
                br#"{"shared": {"frames": [{"name": "a"}]}, "profiles": [{"type": "sampled", "unit": "none", "samples": [[3]], "weights": [1]}]}"#,
                "refers to frame 3",
            ),
            (
                br#"{"shared": {"frames": [{"name": "a"}]}, "profiles": [{"type": "sampled", "unit": "none", "samples": [[0]], "weights": []}]}"#,
                "1 samples but 0 weights",
            ),
            (
                br#"{"shared": {"frames": [{"name": "a"}, {"name": "b"}]}, "profiles": [{"type": "evented", "unit": "none", "startValue": 0, "endValue": 5, "events": [{"type": "O", "frame": 0, "at": 0}, {"type": "C", "frame": 1, "at": 1}]}]}"#,
                "while frame 0 is open",
            ),
            (
                br#"{"shared": {"frames": [{"name": "a"}]}, "profiles": [{"type": "evented", "unit": "none", "startValue": 0, "endValue": 5, "events": [{"type": "O", "frame": 0, "at": 3}, {"type": "C", "frame": 0, "at": 1}]}]}"#,
                "before the previous one",
            ),
            (
                br#"{"shared": {"frames": []}, "profiles": [{"type": "sampled", "unit": "furlongs", "samples": [], "weights": []}]}"#,
                "furlongs",
            ),
        ];
        for (input, expected) in cases {
            let err = parse(input, "cpu", 1000)
                .err()
                .expect("refused")
                .to_string();
            assert!(err.contains(expected), "{err}");
        }
    }
}
