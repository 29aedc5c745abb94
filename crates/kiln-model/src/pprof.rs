//! The pprof `profile.proto` messages, written from the documented wire format
//! (github.com/google/pprof/proto/profile.proto; field numbers are the contract).
//!
//! `string_table` is decoded as raw bytes rather than `string`: real profiles carry invalid
//! UTF-8 (the corpus has one), and refusing a whole profile over one bad symbol would lose
//! data. Names are converted lossily when they are interned.

use prost::Message;

use crate::compress::maybe_gunzip;
use crate::FormatError;

#[derive(Clone, PartialEq, Message)]
pub struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(bytes = "vec", repeated, tag = "6")]
    pub string_table: Vec<Vec<u8>>,
    #[prost(int64, tag = "7")]
    pub drop_frames: i64,
    #[prost(int64, tag = "8")]
    pub keep_frames: i64,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
    #[prost(int64, tag = "15")]
    pub doc_url: i64,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

#[derive(Clone, PartialEq, Eq, Hash, Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

#[derive(Clone, PartialEq, Eq, Hash, Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
    #[prost(bool, tag = "5")]
    pub is_folded: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
    #[prost(int64, tag = "3")]
    pub column: i64,
}

#[derive(Clone, PartialEq, Eq, Hash, Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}

impl Profile {
    /// The string at `index`, or an error naming the field when it is out of range.
    pub fn string(&self, index: i64, what: &str) -> Result<String, FormatError> {
        usize::try_from(index)
            .ok()
            .and_then(|index| self.string_table.get(index))
            .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
            .ok_or_else(|| {
                FormatError::malformed(format!(
                    "{what} refers to string {index}, but the string table has {} entries",
                    self.string_table.len()
                ))
            })
    }

    /// The string at `index`, or "" when the index is out of range. For display only.
    pub fn string_or_empty(&self, index: i64) -> String {
        self.string(index, "").unwrap_or_default()
    }

    pub fn encode_to_bytes(&self) -> Vec<u8> {
        self.encode_to_vec()
    }
}

/// Signatures of pre-protobuf profile formats, which carry no symbols and are refused.
fn legacy_format_name(data: &[u8]) -> Option<&'static str> {
    if data.starts_with(b"--- heap") || data.starts_with(b"heap profile:") {
        return Some("legacy text heap profile");
    }
    if data.starts_with(b"--- contention") || data.starts_with(b"--- threadz") {
        return Some("legacy text profile");
    }
    // gperftools / legacy Go CPU profiles start with the words 0, 3, 0 (header count,
    // version, sampling period) in the machine's word size.
    if data.len() >= 24 && data[..8] == [0u8; 8] && (data[8] == 3 || data[15] == 3) {
        return Some("legacy binary CPU profile (gperftools/Go before 1.9)");
    }
    if data.len() >= 12 && data[..4] == [0u8; 4] && (data[4] == 3 || data[7] == 3) {
        return Some("legacy binary CPU profile (gperftools/Go before 1.9)");
    }
    None
}

/// Decodes a pprof profile, gzip-compressed or not, inflating at most `limit` bytes.
pub fn decode(data: &[u8], limit: usize) -> Result<Profile, FormatError> {
    let raw = maybe_gunzip(data, limit)?;
    if let Some(name) = legacy_format_name(&raw) {
        return Err(FormatError::malformed(format!(
            "{name} is not supported; send pprof protobuf (go tool pprof -proto converts it)"
        )));
    }
    let profile = Profile::decode(&*raw)
        .map_err(|err| FormatError::malformed(format!("invalid pprof protobuf: {err}")))?;
    if profile
        .string_table
        .first()
        .is_some_and(|first| !first.is_empty())
    {
        return Err(FormatError::malformed(
            "invalid pprof: string_table[0] must be the empty string",
        ));
    }
    if profile.string_table.is_empty() && !profile.sample.is_empty() {
        return Err(FormatError::malformed("invalid pprof: empty string table"));
    }
    Ok(profile)
}

/// Limits on one profile's shape.
#[derive(Debug, Clone, Copy)]
pub struct ProfileLimits {
    pub max_samples: usize,
    pub max_stack_depth: usize,
}

impl Default for ProfileLimits {
    fn default() -> Self {
        ProfileLimits {
            max_samples: 16_000,
            max_stack_depth: 1_000,
        }
    }
}

/// Maps pprof ids (`Location.id`, `Function.id`, `Mapping.id`) to positions in their table.
/// Go writes ids `1..=n` in order, which needs no hash map at all.
#[derive(Debug, Clone)]
pub enum IdIndex {
    Dense(usize),
    Sparse(foldhash::HashMap<u64, usize>),
}

impl IdIndex {
    fn build(ids: impl ExactSizeIterator<Item = u64>, what: &str) -> Result<Self, FormatError> {
        let len = ids.len();
        let ids: Vec<u64> = ids.collect();
        if ids
            .iter()
            .enumerate()
            .all(|(position, id)| *id == position as u64 + 1)
        {
            return Ok(IdIndex::Dense(len));
        }
        let mut map = foldhash::HashMap::with_capacity_and_hasher(len, Default::default());
        for (position, id) in ids.into_iter().enumerate() {
            if map.insert(id, position).is_some() {
                return Err(FormatError::malformed(format!("duplicate {what} id {id}")));
            }
        }
        Ok(IdIndex::Sparse(map))
    }

    pub fn get(&self, id: u64) -> Option<usize> {
        match self {
            IdIndex::Dense(len) => (id >= 1 && id <= *len as u64).then(|| id as usize - 1),
            IdIndex::Sparse(map) => map.get(&id).copied(),
        }
    }
}

/// The id lookups of a profile whose every reference has been checked.
#[derive(Debug, Clone)]
pub struct Validated {
    pub locations: IdIndex,
    pub functions: IdIndex,
    pub mappings: IdIndex,
}

/// Checks every cross-reference and string index of a decoded profile, so that later
/// stages can index without failing: a profile is either accepted whole or refused whole.
pub fn validate(profile: &Profile, limits: &ProfileLimits) -> Result<Validated, FormatError> {
    if profile.sample.len() > limits.max_samples {
        return Err(FormatError::TooLarge(format!(
            "profile has {} samples, over the limit of {}",
            profile.sample.len(),
            limits.max_samples
        )));
    }
    let strings = profile.string_table.len() as i64;
    let check_string = |index: i64, what: &dyn Fn() -> String| -> Result<(), FormatError> {
        if index < 0 || index >= strings {
            return Err(FormatError::malformed(format!(
                "{} refers to string {index}, but the string table has {strings} entries",
                what()
            )));
        }
        Ok(())
    };
    for (position, value_type) in profile
        .sample_type
        .iter()
        .chain(profile.period_type.iter())
        .enumerate()
    {
        check_string(value_type.r#type, &|| format!("sample type {position}"))?;
        check_string(value_type.unit, &|| format!("sample type {position} unit"))?;
    }
    let mappings = IdIndex::build(profile.mapping.iter().map(|m| m.id), "mapping")?;
    for mapping in &profile.mapping {
        check_string(mapping.filename, &|| {
            format!("mapping {} filename", mapping.id)
        })?;
        check_string(mapping.build_id, &|| {
            format!("mapping {} build id", mapping.id)
        })?;
    }
    let functions = IdIndex::build(profile.function.iter().map(|f| f.id), "function")?;
    for function in &profile.function {
        check_string(function.name, &|| format!("function {} name", function.id))?;
        check_string(function.system_name, &|| {
            format!("function {} system name", function.id)
        })?;
        check_string(function.filename, &|| {
            format!("function {} filename", function.id)
        })?;
    }
    let locations = IdIndex::build(profile.location.iter().map(|l| l.id), "location")?;
    for location in &profile.location {
        if location.mapping_id != 0 && mappings.get(location.mapping_id).is_none() {
            return Err(FormatError::malformed(format!(
                "location {} refers to mapping {}, which is not defined",
                location.id, location.mapping_id
            )));
        }
        for line in &location.line {
            if functions.get(line.function_id).is_none() {
                return Err(FormatError::malformed(format!(
                    "location {} refers to function {}, which is not defined",
                    location.id, line.function_id
                )));
            }
        }
    }
    let value_count = profile.sample_type.len();
    for (position, sample) in profile.sample.iter().enumerate() {
        if sample.value.len() != value_count && !(value_count == 0 && sample.value.len() == 1) {
            return Err(FormatError::malformed(format!(
                "sample {position} has {} values but the profile has {value_count} sample types",
                sample.value.len()
            )));
        }
        for id in &sample.location_id {
            if locations.get(*id).is_none() {
                return Err(FormatError::malformed(format!(
                    "sample {position} refers to location {id}, which is not defined"
                )));
            }
        }
        for label in &sample.label {
            check_string(label.key, &|| format!("sample {position} label key"))?;
            check_string(label.str, &|| format!("sample {position} label value"))?;
            check_string(label.num_unit, &|| format!("sample {position} label unit"))?;
        }
    }
    Ok(Validated {
        locations,
        functions,
        mappings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Profile {
        Profile {
            sample_type: vec![ValueType { r#type: 1, unit: 2 }],
            sample: vec![Sample {
                location_id: vec![1],
                value: vec![5],
                label: vec![],
            }],
            location: vec![Location {
                id: 1,
                line: vec![Line {
                    function_id: 1,
                    line: 3,
                    column: 0,
                }],
                ..Default::default()
            }],
            function: vec![Function {
                id: 1,
                name: 3,
                ..Default::default()
            }],
            string_table: vec![
                b"".to_vec(),
                b"cpu".to_vec(),
                b"nanoseconds".to_vec(),
                b"main".to_vec(),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn round_trip_and_validate() {
        let profile = tiny();
        let bytes = crate::compress::gzip(&profile.encode_to_vec());
        let decoded = decode(&bytes, 1 << 20).unwrap();
        assert_eq!(decoded, profile);
        let validated = validate(&decoded, &ProfileLimits::default()).unwrap();
        assert_eq!(validated.locations.get(1), Some(0));
        assert_eq!(validated.locations.get(2), None);
    }

    #[test]
    fn dangling_references_are_refused() {
        let mut profile = tiny();
        profile.sample[0].location_id = vec![9];
        let err = validate(&profile, &ProfileLimits::default()).unwrap_err();
        assert!(err.to_string().contains("location 9"), "{err}");
        let mut profile = tiny();
        profile.function[0].name = 99;
        assert!(validate(&profile, &ProfileLimits::default()).is_err());
        let mut profile = tiny();
        profile.sample[0].value = vec![1, 2];
        assert!(validate(&profile, &ProfileLimits::default()).is_err());
    }

    #[test]
    fn garbage_and_legacy_are_refused() {
        assert!(decode(b"\x0a\xff\xff\xff", 1 << 20).is_err());
        assert!(decode(b"--- heapz 1 ---\n", 1 << 20)
            .unwrap_err()
            .to_string()
            .contains("legacy"));
    }
}
