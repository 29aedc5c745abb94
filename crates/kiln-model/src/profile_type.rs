//! Profile type ids: `name:sample_type:sample_unit:period_type:period_unit`, as Pyroscope
//! names them (`process_cpu:cpu:nanoseconds:cpu:nanoseconds`).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::FormatError;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ProfileType {
    pub name: String,
    pub sample_type: String,
    pub sample_unit: String,
    pub period_type: String,
    pub period_unit: String,
}

impl ProfileType {
    pub fn new(
        name: &str,
        sample_type: &str,
        sample_unit: &str,
        period_type: &str,
        period_unit: &str,
    ) -> Self {
        ProfileType {
            name: name.to_string(),
            sample_type: sample_type.to_string(),
            sample_unit: sample_unit.to_string(),
            period_type: period_type.to_string(),
            period_unit: period_unit.to_string(),
        }
    }

    /// Parses an id of exactly five colon-separated parts.
    pub fn parse(id: &str) -> Result<Self, FormatError> {
        let parts: Vec<&str> = id.split(':').collect();
        if parts.len() != 5 || parts[0].is_empty() || parts[1].is_empty() {
            return Err(FormatError::malformed(format!(
                "invalid profile type {id:?}: expected name:sample_type:sample_unit:period_type:period_unit"
            )));
        }
        Ok(ProfileType::new(
            parts[0], parts[1], parts[2], parts[3], parts[4],
        ))
    }

    pub fn id(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for ProfileType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}:{}:{}",
            self.name, self.sample_type, self.sample_unit, self.period_type, self.period_unit
        )
    }
}

/// The profile name (`__name__`) Pyroscope gives a pprof sample type, judged from the
/// sample type itself and, where that is ambiguous (`samples`), from the profile's other
/// sample types and period type.
pub fn name_for_sample_type(sample_type: &str, other_types: &[&str], period_type: &str) -> String {
    let name = match sample_type {
        "cpu" => "process_cpu",
        "wall" => "wall",
        "samples" => {
            if other_types.contains(&"wall") || period_type == "wall" {
                "wall"
            } else {
                "process_cpu"
            }
        }
        "inuse_objects"
        | "inuse_space"
        | "alloc_objects"
        | "alloc_space"
        | "alloc_samples"
        | "alloc_size"
        | "alloc_in_new_tlab_objects"
        | "alloc_in_new_tlab_bytes"
        | "alloc_outside_tlab_objects"
        | "alloc_outside_tlab_bytes"
        | "space"
        | "objects" => "memory",
        "goroutine" | "goroutines" => "goroutines",
        "lock_count" | "lock_time" => "mutex",
        "contentions" | "delay" => {
            if period_type == "block" {
                "block"
            } else {
                "mutex"
            }
        }
        "exception" | "exceptions" => "exceptions",
        other => other,
    };
    name.to_string()
}

/// What a legacy `/ingest` name suffix means, for payloads (folded stacks) that carry no
/// sample types of their own, and as the profile name for pprof payloads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuffixType {
    pub profile_type: ProfileType,
    /// Values are sample counts to be scaled to nanoseconds by `1e9 / sampleRate`.
    pub scale_by_sample_rate: bool,
}

/// Maps a legacy suffix (`cpu`, `inuse_space`, …) to its profile type; `None` when the
/// suffix is not a known profile kind (then it is part of the application name).
pub fn from_legacy_suffix(suffix: &str) -> Option<SuffixType> {
    let (profile_type, scale) = match suffix {
        "cpu" | "itimer" => return Some(default_legacy_type()),
        "wall" => (
            ProfileType::new("wall", "wall", "nanoseconds", "wall", "nanoseconds"),
            true,
        ),
        "inuse_objects" => (
            ProfileType::new("memory", "inuse_objects", "count", "space", "bytes"),
            false,
        ),
        "inuse_space" => (
            ProfileType::new("memory", "inuse_space", "bytes", "space", "bytes"),
            false,
        ),
        "alloc_objects" => (
            ProfileType::new("memory", "alloc_objects", "count", "space", "bytes"),
            false,
        ),
        "alloc_space" => (
            ProfileType::new("memory", "alloc_space", "bytes", "space", "bytes"),
            false,
        ),
        "goroutines" | "goroutine" => (
            ProfileType::new("goroutines", "goroutine", "count", "goroutine", "count"),
            false,
        ),
        "mutex_count" => (
            ProfileType::new("mutex", "contentions", "count", "contentions", "count"),
            false,
        ),
        "mutex_duration" => (
            ProfileType::new("mutex", "delay", "nanoseconds", "contentions", "count"),
            false,
        ),
        "block_count" => (
            ProfileType::new("block", "contentions", "count", "contentions", "count"),
            false,
        ),
        "block_duration" => (
            ProfileType::new("block", "delay", "nanoseconds", "contentions", "count"),
            false,
        ),
        "lock_count" => (
            ProfileType::new("mutex", "contentions", "count", "contentions", "count"),
            false,
        ),
        "lock_duration" => (
            ProfileType::new("mutex", "delay", "nanoseconds", "contentions", "count"),
            false,
        ),
        "exceptions" => (
            ProfileType::new("exceptions", "exceptions", "count", "exceptions", "count"),
            false,
        ),
        _ => return None,
    };
    Some(SuffixType {
        profile_type,
        scale_by_sample_rate: scale,
    })
}

/// Splits a legacy name (`my.app.cpu`) into the application and its kind suffix. A last
/// part that is not a known kind stays in the application name (`my.app`).
pub fn split_legacy_name(name: &str) -> (&str, Option<SuffixType>) {
    match name.rsplit_once('.') {
        Some((app, suffix)) if !app.is_empty() => match from_legacy_suffix(suffix) {
            Some(known) => (app, Some(known)),
            None => (name, None),
        },
        _ => (name, None),
    }
}

/// What a legacy name without a kind suffix means: CPU, as in Pyroscope.
pub fn default_legacy_type() -> SuffixType {
    SuffixType {
        profile_type: ProfileType::new("process_cpu", "cpu", "nanoseconds", "cpu", "nanoseconds"),
        scale_by_sample_rate: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display_round_trip() {
        let id = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
        assert_eq!(ProfileType::parse(id).unwrap().id(), id);
        assert!(ProfileType::parse("process_cpu:cpu").is_err());
    }

    #[test]
    fn names_follow_pyroscope() {
        assert_eq!(
            name_for_sample_type("samples", &["samples", "cpu"], "cpu"),
            "process_cpu"
        );
        assert_eq!(
            name_for_sample_type("samples", &["samples", "wall"], "wall"),
            "wall"
        );
        assert_eq!(name_for_sample_type("inuse_space", &[], "space"), "memory");
        assert_eq!(
            from_legacy_suffix("cpu").unwrap().profile_type.name,
            "process_cpu"
        );
        assert!(from_legacy_suffix("myapp").is_none());
    }
}
