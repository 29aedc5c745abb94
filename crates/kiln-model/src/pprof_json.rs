//! The proto3 JSON mapping of a pprof `Profile`, as Connect answers any message to a
//! client that asked in JSON (`SelectMergeProfile` with `application/json`).
//!
//! The mapping is the one protobuf specifies: lowerCamelCase field names, 64-bit integers
//! as decimal strings (JavaScript numbers lose precision past 2^53), and fields at their
//! default value (0, false, empty) left out. Written by hand over [`Profile`] because that
//! type is Kiln's own zero-copy decoding of pprof rather than a generated message.

use serde_json::{Map, Value};

use crate::pprof::{Function, Label, Line, Location, Mapping, Profile, ValueType};

/// A JSON object that leaves out fields at their proto3 default.
#[derive(Default)]
struct Object(Map<String, Value>);

impl Object {
    fn int(mut self, name: &str, value: i64) -> Self {
        if value != 0 {
            self.0.insert(name.into(), Value::String(value.to_string()));
        }
        self
    }

    fn uint(mut self, name: &str, value: u64) -> Self {
        if value != 0 {
            self.0.insert(name.into(), Value::String(value.to_string()));
        }
        self
    }

    fn flag(mut self, name: &str, value: bool) -> Self {
        if value {
            self.0.insert(name.into(), Value::Bool(true));
        }
        self
    }

    fn list(mut self, name: &str, values: Vec<Value>) -> Self {
        if !values.is_empty() {
            self.0.insert(name.into(), Value::Array(values));
        }
        self
    }

    fn message(mut self, name: &str, value: Option<Value>) -> Self {
        if let Some(value) = value {
            self.0.insert(name.into(), value);
        }
        self
    }

    fn done(self) -> Value {
        Value::Object(self.0)
    }
}

fn ints(values: impl IntoIterator<Item = i64>) -> Vec<Value> {
    values
        .into_iter()
        .map(|v| Value::String(v.to_string()))
        .collect()
}

fn value_type(value: &ValueType) -> Value {
    Object::default()
        .int("type", value.r#type)
        .int("unit", value.unit)
        .done()
}

fn label(label: &Label) -> Value {
    Object::default()
        .int("key", label.key)
        .int("str", label.str)
        .int("num", label.num)
        .int("numUnit", label.num_unit)
        .done()
}

fn mapping(mapping: &Mapping) -> Value {
    Object::default()
        .uint("id", mapping.id)
        .uint("memoryStart", mapping.memory_start)
        .uint("memoryLimit", mapping.memory_limit)
        .uint("fileOffset", mapping.file_offset)
        .int("filename", mapping.filename)
        .int("buildId", mapping.build_id)
        .flag("hasFunctions", mapping.has_functions)
        .flag("hasFilenames", mapping.has_filenames)
        .flag("hasLineNumbers", mapping.has_line_numbers)
        .flag("hasInlineFrames", mapping.has_inline_frames)
        .done()
}

fn line(line: &Line) -> Value {
    Object::default()
        .uint("functionId", line.function_id)
        .int("line", line.line)
        .int("column", line.column)
        .done()
}

fn location(location: &Location) -> Value {
    Object::default()
        .uint("id", location.id)
        .uint("mappingId", location.mapping_id)
        .uint("address", location.address)
        .list("line", location.line.iter().map(line).collect())
        .flag("isFolded", location.is_folded)
        .done()
}

fn function(function: &Function) -> Value {
    Object::default()
        .uint("id", function.id)
        .int("name", function.name)
        .int("systemName", function.system_name)
        .int("filename", function.filename)
        .int("startLine", function.start_line)
        .done()
}

/// `profile` as proto3 JSON. Strings that are not UTF-8 (pprof's string table is declared
/// `string`, but some writers put raw bytes there) are replaced lossily.
pub fn to_json(profile: &Profile) -> Value {
    let samples = profile
        .sample
        .iter()
        .map(|sample| {
            Object::default()
                .list(
                    "locationId",
                    sample
                        .location_id
                        .iter()
                        .map(|id| Value::String(id.to_string()))
                        .collect(),
                )
                .list("value", ints(sample.value.iter().copied()))
                .list("label", sample.label.iter().map(label).collect())
                .done()
        })
        .collect();
    let strings = profile
        .string_table
        .iter()
        .map(|bytes| Value::String(String::from_utf8_lossy(bytes).into_owned()))
        .collect();
    Object::default()
        .list(
            "sampleType",
            profile.sample_type.iter().map(value_type).collect(),
        )
        .list("sample", samples)
        .list("mapping", profile.mapping.iter().map(mapping).collect())
        .list("location", profile.location.iter().map(location).collect())
        .list("function", profile.function.iter().map(function).collect())
        .list("stringTable", strings)
        .int("dropFrames", profile.drop_frames)
        .int("keepFrames", profile.keep_frames)
        .int("timeNanos", profile.time_nanos)
        .int("durationNanos", profile.duration_nanos)
        .message("periodType", profile.period_type.as_ref().map(value_type))
        .int("period", profile.period)
        .list("comment", ints(profile.comment.iter().copied()))
        .int("defaultSampleType", profile.default_sample_type)
        .int("docUrl", profile.doc_url)
        .done()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_the_proto3_json_mapping() {
        let mut profile = Profile::default();
        for text in ["", "cpu", "nanoseconds", "main"] {
            profile.string_table.push(text.as_bytes());
        }
        profile.sample_type.push(ValueType { r#type: 1, unit: 2 });
        profile.function.push(Function {
            id: 1,
            name: 3,
            ..Default::default()
        });
        profile.location.push(Location {
            id: 1,
            address: u64::MAX,
            line: crate::pprof::lines![Line {
                function_id: 1,
                line: 42,
                column: 0,
            }],
            ..Default::default()
        });
        profile.sample.push(&[1], &[9_007_199_254_740_993], &[]);
        profile.period = 10_000_000;
        let json = to_json(&profile);
        assert_eq!(json["sampleType"][0]["type"], "1");
        assert_eq!(json["sampleType"][0]["unit"], "2");
        // Past 2^53: exact only as a string.
        assert_eq!(json["sample"][0]["value"][0], "9007199254740993");
        assert_eq!(json["sample"][0]["locationId"][0], "1");
        assert!(json["sample"][0].get("label").is_none());
        assert_eq!(json["location"][0]["address"], "18446744073709551615");
        assert_eq!(json["location"][0]["line"][0]["functionId"], "1");
        assert_eq!(json["location"][0]["line"][0]["line"], "42");
        assert!(json["location"][0]["line"][0].get("column").is_none());
        assert!(json["location"][0].get("mappingId").is_none());
        assert_eq!(json["function"][0]["name"], "3");
        assert_eq!(json["stringTable"][3], "main");
        assert_eq!(json["period"], "10000000");
        assert!(json.get("timeNanos").is_none());
        assert!(json.get("periodType").is_none());
    }
}
