//! OpenTelemetry profiles (OTLP), `opentelemetry.proto.collector.profiles.v1development`,
//! as of OTLP v1.10.0: one `ProfilesDictionary` per request shared by every profile in it,
//! stacks in a `stack_table`, attributes as `KeyValueAndUnit` with string-table keys.
//!
//! The messages are written here from the documented wire format (field numbers are the
//! contract), with proto3-JSON names for OTLP/HTTP JSON. Older drafts (v1.3–v1.7 kept a
//! dictionary inside each profile) differ in wire types where they overlap, so they fail
//! to decode and are refused with a message naming the supported version.
//!
//! Each OTLP profile becomes one pprof per second of its samples' timestamps (samples
//! without timestamps go to the profile's own time), holding only the symbols its samples
//! reach, and then takes the same path as every pprof upload. Every request stands alone:
//! nothing is remembered between requests, so nothing can be missing from an earlier one.

use std::collections::BTreeMap;

use foldhash::{HashMap, HashMapExt};

use kiln_model::labels::{sanitize_label_name, Labels, SERVICE_NAME};
use kiln_model::pprof::{self, Profile, ValueType};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

use crate::parse::{from_pprof, ProfileContext};
use crate::{IngestError, Limits, ParsedProfile};

/// The OTLP release whose profiles schema this module implements.
pub const OTLP_VERSION: &str = "v1.10.0";

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ExportProfilesServiceRequest {
    #[prost(message, repeated, tag = "1")]
    pub resource_profiles: Vec<ResourceProfiles>,
    #[prost(message, optional, tag = "2")]
    pub dictionary: Option<ProfilesDictionary>,
}

#[derive(Clone, PartialEq, prost::Message, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExportProfilesServiceResponse {
    #[prost(message, optional, tag = "1")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partial_success: Option<ExportProfilesPartialSuccess>,
}

#[derive(Clone, PartialEq, prost::Message, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExportProfilesPartialSuccess {
    #[prost(int64, tag = "1")]
    #[serde(with = "kiln_model::proto_json::int64")]
    pub rejected_profiles: i64,
    #[prost(string, tag = "2")]
    pub error_message: String,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProfilesDictionary {
    #[prost(message, repeated, tag = "1")]
    pub mapping_table: Vec<Mapping>,
    #[prost(message, repeated, tag = "2")]
    pub location_table: Vec<Location>,
    #[prost(message, repeated, tag = "3")]
    pub function_table: Vec<Function>,
    #[prost(message, repeated, tag = "4")]
    pub link_table: Vec<Link>,
    #[prost(string, repeated, tag = "5")]
    pub string_table: Vec<String>,
    #[prost(message, repeated, tag = "6")]
    pub attribute_table: Vec<KeyValueAndUnit>,
    #[prost(message, repeated, tag = "7")]
    pub stack_table: Vec<Stack>,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ResourceProfiles {
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    pub scope_profiles: Vec<ScopeProfiles>,
    #[prost(string, tag = "3")]
    pub schema_url: String,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Resource {
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<KeyValue>,
    #[prost(uint32, tag = "2")]
    pub dropped_attributes_count: u32,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ScopeProfiles {
    #[prost(message, optional, tag = "1")]
    pub scope: Option<InstrumentationScope>,
    #[prost(message, repeated, tag = "2")]
    pub profiles: Vec<OtlpProfile>,
    #[prost(string, tag = "3")]
    pub schema_url: String,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct InstrumentationScope {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub version: String,
    #[prost(message, repeated, tag = "3")]
    pub attributes: Vec<KeyValue>,
    #[prost(uint32, tag = "4")]
    pub dropped_attributes_count: u32,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
    #[prost(int32, tag = "3")]
    pub key_strindex: i32,
}

/// `opentelemetry.proto.common.v1.AnyValue`; its JSON form (`{"stringValue": "x"}`) is
/// read by hand below.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AnyValue {
    #[prost(oneof = "Value", tags = "1, 2, 3, 4, 5, 6, 7, 8")]
    pub value: Option<Value>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Value {
    #[prost(string, tag = "1")]
    StringValue(String),
    #[prost(bool, tag = "2")]
    BoolValue(bool),
    #[prost(int64, tag = "3")]
    IntValue(i64),
    #[prost(double, tag = "4")]
    DoubleValue(f64),
    #[prost(message, tag = "5")]
    ArrayValue(ArrayValue),
    #[prost(message, tag = "6")]
    KvlistValue(KeyValueList),
    #[prost(bytes = "vec", tag = "7")]
    BytesValue(Vec<u8>),
    #[prost(int32, tag = "8")]
    StringValueStrindex(i32),
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default)]
pub struct ArrayValue {
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<AnyValue>,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default)]
pub struct KeyValueList {
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct OtlpProfile {
    #[prost(message, optional, tag = "1")]
    pub sample_type: Option<OtlpValueType>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<OtlpSample>,
    #[prost(fixed64, tag = "3")]
    #[serde(deserialize_with = "json::u64")]
    pub time_unix_nano: u64,
    #[prost(uint64, tag = "4")]
    #[serde(deserialize_with = "json::u64")]
    pub duration_nano: u64,
    #[prost(message, optional, tag = "5")]
    pub period_type: Option<OtlpValueType>,
    #[prost(int64, tag = "6")]
    #[serde(deserialize_with = "json::i64")]
    pub period: i64,
    #[prost(bytes = "vec", tag = "7")]
    #[serde(deserialize_with = "json::id")]
    pub profile_id: Vec<u8>,
    #[prost(uint32, tag = "8")]
    pub dropped_attributes_count: u32,
    #[prost(string, tag = "9")]
    pub original_payload_format: String,
    #[prost(bytes = "vec", tag = "10")]
    #[serde(deserialize_with = "json::bytes")]
    pub original_payload: Vec<u8>,
    #[prost(int32, repeated, tag = "11")]
    pub attribute_indices: Vec<i32>,
}

#[derive(Clone, Copy, PartialEq, prost::Message, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct OtlpValueType {
    #[prost(int32, tag = "1")]
    pub type_strindex: i32,
    #[prost(int32, tag = "2")]
    pub unit_strindex: i32,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct OtlpSample {
    #[prost(int32, tag = "1")]
    pub stack_index: i32,
    #[prost(int32, repeated, tag = "2")]
    pub attribute_indices: Vec<i32>,
    #[prost(int32, tag = "3")]
    pub link_index: i32,
    #[prost(int64, repeated, tag = "4")]
    #[serde(deserialize_with = "json::i64s")]
    pub values: Vec<i64>,
    #[prost(fixed64, repeated, tag = "5")]
    #[serde(deserialize_with = "json::u64s")]
    pub timestamps_unix_nano: Vec<u64>,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    #[serde(deserialize_with = "json::u64")]
    pub memory_start: u64,
    #[prost(uint64, tag = "2")]
    #[serde(deserialize_with = "json::u64")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "3")]
    #[serde(deserialize_with = "json::u64")]
    pub file_offset: u64,
    #[prost(int32, tag = "4")]
    pub filename_strindex: i32,
    #[prost(int32, repeated, tag = "5")]
    pub attribute_indices: Vec<i32>,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Stack {
    #[prost(int32, repeated, tag = "1")]
    pub location_indices: Vec<i32>,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Location {
    #[prost(int32, tag = "1")]
    pub mapping_index: i32,
    #[prost(uint64, tag = "2")]
    #[serde(deserialize_with = "json::u64")]
    pub address: u64,
    #[prost(message, repeated, tag = "3")]
    pub lines: Vec<Line>,
    #[prost(int32, repeated, tag = "4")]
    pub attribute_indices: Vec<i32>,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Line {
    #[prost(int32, tag = "1")]
    pub function_index: i32,
    #[prost(int64, tag = "2")]
    #[serde(deserialize_with = "json::i64")]
    pub line: i64,
    #[prost(int64, tag = "3")]
    #[serde(deserialize_with = "json::i64")]
    pub column: i64,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Function {
    #[prost(int32, tag = "1")]
    pub name_strindex: i32,
    #[prost(int32, tag = "2")]
    pub system_name_strindex: i32,
    #[prost(int32, tag = "3")]
    pub filename_strindex: i32,
    #[prost(int64, tag = "4")]
    #[serde(deserialize_with = "json::i64")]
    pub start_line: i64,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Link {
    #[prost(bytes = "vec", tag = "1")]
    #[serde(deserialize_with = "json::id")]
    pub trace_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    #[serde(deserialize_with = "json::id")]
    pub span_id: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KeyValueAndUnit {
    #[prost(int32, tag = "1")]
    pub key_strindex: i32,
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
    #[prost(int32, tag = "3")]
    pub unit_strindex: i32,
}

/// Proto3 JSON as OTLP/HTTP sends it: 64-bit integers as strings or numbers, bytes as
/// base64, and trace, span and profile ids as hex (OTLP's exception to proto3 JSON; base64
/// is accepted too, as generic protobuf JSON printers write it).
mod json {
    use super::*;
    use kiln_model::proto_json::{base64_decode, i64_of};

    pub use kiln_model::proto_json::bytes::deserialize as bytes;
    pub use kiln_model::proto_json::int64::deserialize as i64;
    pub use kiln_model::proto_json::int64s::deserialize as i64s;
    pub use kiln_model::proto_json::uint64::deserialize as u64;
    pub use kiln_model::proto_json::uint64s::deserialize as u64s;

    /// A trace or span id: hex, as OTLP/JSON writes it, or base64, as proto3 JSON does.
    pub fn id<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text.len() % 2 == 0 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
            if let Some(bytes) = from_hex(&text) {
                return Ok(bytes);
            }
        }
        base64_decode(&text)
            .map_err(|err| D::Error::custom(format!("{text:?} is neither hex nor base64: {err}")))
    }

    fn from_hex(text: &str) -> Option<Vec<u8>> {
        (0..text.len())
            .step_by(2)
            .map(|at| u8::from_str_radix(text.get(at..at + 2)?, 16).ok())
            .collect()
    }

    /// `AnyValue` as JSON: an object with one key naming the variant.
    pub fn any_value(value: serde_json::Value) -> Result<AnyValue, String> {
        let serde_json::Value::Object(object) = value else {
            return Err("an attribute value must be a JSON object".into());
        };
        let Some((kind, inner)) = object.into_iter().next() else {
            return Ok(AnyValue { value: None });
        };
        let custom = |err: serde_json::Error| format!("{kind}: {err}");
        let value = match kind.as_str() {
            "stringValue" => Value::StringValue(serde_json::from_value(inner).map_err(custom)?),
            "boolValue" => Value::BoolValue(serde_json::from_value(inner).map_err(custom)?),
            "intValue" => Value::IntValue(
                i64_of(inner).map_err(|err: serde_json::Error| format!("intValue: {err}"))?,
            ),
            "doubleValue" => Value::DoubleValue(serde_json::from_value(inner).map_err(custom)?),
            "arrayValue" => Value::ArrayValue(serde_json::from_value(inner).map_err(custom)?),
            "kvlistValue" => Value::KvlistValue(serde_json::from_value(inner).map_err(custom)?),
            "bytesValue" => {
                let text: String = serde_json::from_value(inner).map_err(custom)?;
                Value::BytesValue(
                    base64_decode(&text)
                        .map_err(|err| format!("bytesValue: invalid base64: {err}"))?,
                )
            }
            "stringValueStrindex" => {
                Value::StringValueStrindex(serde_json::from_value(inner).map_err(custom)?)
            }
            other => return Err(format!("unknown attribute value kind {other:?}")),
        };
        Ok(AnyValue { value: Some(value) })
    }
}

impl<'de> Deserialize<'de> for AnyValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        json::any_value(serde_json::Value::deserialize(deserializer)?).map_err(D::Error::custom)
    }
}

/// Decodes a binary `ExportProfilesServiceRequest`.
pub fn decode_proto(body: &[u8]) -> Result<ExportProfilesServiceRequest, IngestError> {
    <ExportProfilesServiceRequest as prost::Message>::decode(body).map_err(|err| {
        IngestError::BadRequest(format!(
            "invalid OTLP profiles request (Kiln reads OTLP {OTLP_VERSION} profiles v1development): {err}"
        ))
    })
}

/// Decodes an OTLP/JSON `ExportProfilesServiceRequest`.
pub fn decode_json(body: &[u8]) -> Result<ExportProfilesServiceRequest, IngestError> {
    serde_json::from_slice(body).map_err(|err| {
        IngestError::BadRequest(format!(
            "invalid OTLP profiles JSON (Kiln reads OTLP {OTLP_VERSION} profiles v1development): {err}"
        ))
    })
}

/// What an export request became: the profiles to write, and those refused, which OTLP
/// reports as a partial success rather than failing the whole request.
#[derive(Default)]
pub struct Export {
    pub profiles: Vec<ParsedProfile>,
    pub rejected_profiles: i64,
    pub errors: Vec<String>,
}

impl Export {
    /// The `partial_success` message: empty when nothing was refused.
    pub fn error_message(&self) -> String {
        let mut message = self
            .errors
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join("; ");
        if self.errors.len() > 5 {
            message.push_str(&format!("; and {} more", self.errors.len() - 5));
        }
        message
    }
}

/// Converts every profile of a request. A profile that fails is counted and explained;
/// when every profile fails the request is refused as a whole (400).
pub fn parse_export(
    request: ExportProfilesServiceRequest,
    received_bytes: usize,
    limits: &Limits,
) -> Result<Export, IngestError> {
    let dictionary = request.dictionary.unwrap_or_default();
    let total: usize = request
        .resource_profiles
        .iter()
        .flat_map(|resource| &resource.scope_profiles)
        .map(|scope| scope.profiles.len())
        .sum();
    let mut export = Export::default();
    for resource in &request.resource_profiles {
        // Kept as text: a bad resource attribute refuses each of the resource's profiles.
        let resource_labels = match resource.resource.as_ref() {
            Some(resource) => {
                attributes_labels(&dictionary, &resource.attributes).map_err(|err| err.to_string())
            }
            None => Ok(Vec::new()),
        };
        for scope in &resource.scope_profiles {
            for profile in &scope.profiles {
                let converted = resource_labels.clone().map_err(bad).and_then(|mut labels| {
                    if let Some(scope) = &scope.scope {
                        labels.extend(attributes_labels(&dictionary, &scope.attributes)?);
                    }
                    let share = received_bytes / total.max(1);
                    convert_profile(&dictionary, labels, profile, share, limits)
                });
                match converted {
                    Ok(profiles) => export.profiles.extend(profiles),
                    Err(err) => {
                        export.rejected_profiles += 1;
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

fn bad(message: impl Into<String>) -> IngestError {
    IngestError::BadRequest(message.into())
}

/// Looks up `index` in one of the dictionary's tables, naming the table when it is out
/// of range.
fn entry<'a, T>(table: &'a [T], index: i32, what: &str) -> Result<&'a T, IngestError> {
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

fn dictionary_string(dictionary: &ProfilesDictionary, index: i32) -> Result<&str, IngestError> {
    entry(&dictionary.string_table, index, "string").map(String::as_str)
}

/// An attribute value as label text.
fn value_text(dictionary: &ProfilesDictionary, value: &AnyValue) -> Result<String, IngestError> {
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

fn key_text<'a>(
    dictionary: &'a ProfilesDictionary,
    pair: &'a KeyValue,
) -> Result<&'a str, IngestError> {
    if pair.key.is_empty() && pair.key_strindex != 0 {
        return dictionary_string(dictionary, pair.key_strindex);
    }
    Ok(&pair.key)
}

/// Resource and scope attributes as series labels; `service.name` is `service_name`.
fn attributes_labels(
    dictionary: &ProfilesDictionary,
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

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Builds a pprof holding only what a profile's samples reach, interning each dictionary
/// entry once.
struct PprofBuilder<'a> {
    dictionary: &'a ProfilesDictionary,
    profile: Profile,
    strings: HashMap<i32, i64>,
    text_strings: pprof::StringInterner,
    mappings: HashMap<i32, u64>,
    functions: HashMap<i32, u64>,
    locations: HashMap<i32, u64>,
}

impl<'a> PprofBuilder<'a> {
    fn new(dictionary: &'a ProfilesDictionary) -> Self {
        let mut builder = PprofBuilder {
            dictionary,
            profile: Profile::default(),
            strings: HashMap::new(),
            text_strings: Default::default(),
            mappings: HashMap::new(),
            functions: HashMap::new(),
            locations: HashMap::new(),
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
        if let Some(pprof_index) = self.strings.get(&index) {
            return Ok(*pprof_index);
        }
        let value = dictionary_string(self.dictionary, index)?;
        let pprof_index = self.text(value);
        self.strings.insert(index, pprof_index);
        Ok(pprof_index)
    }

    fn mapping(&mut self, index: i32) -> Result<u64, IngestError> {
        if index == 0 {
            return Ok(0); // mapping_table[0] is the "no mapping" entry
        }
        if let Some(id) = self.mappings.get(&index) {
            return Ok(*id);
        }
        let mapping = entry(&self.dictionary.mapping_table, index, "mapping")?;
        let mut build_id = 0;
        for attribute in &mapping.attribute_indices {
            let attribute = entry(&self.dictionary.attribute_table, *attribute, "attribute")?;
            let key = dictionary_string(self.dictionary, attribute.key_strindex)?;
            if key.starts_with("process.executable.build_id") && build_id == 0 {
                let value = match &attribute.value {
                    Some(value) => value_text(self.dictionary, value)?,
                    None => String::new(),
                };
                build_id = self.text(&value);
            }
        }
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
        self.mappings.insert(index, id);
        Ok(id)
    }

    fn function(&mut self, index: i32) -> Result<u64, IngestError> {
        if let Some(id) = self.functions.get(&index) {
            return Ok(*id);
        }
        let function = entry(&self.dictionary.function_table, index, "function")?;
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
        self.functions.insert(index, id);
        Ok(id)
    }

    fn location(&mut self, index: i32) -> Result<u64, IngestError> {
        if let Some(id) = self.locations.get(&index) {
            return Ok(*id);
        }
        let location = entry(&self.dictionary.location_table, index, "location")?;
        let mapping_id = self.mapping(location.mapping_index)?;
        let mut lines = Vec::with_capacity(location.lines.len());
        for line in &location.lines {
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
        let id = self.profile.location.len() as u64 + 1;
        self.profile.location.push(pprof::Location {
            id,
            mapping_id,
            address: location.address,
            line: lines,
            is_folded: false,
        });
        self.locations.insert(index, id);
        Ok(id)
    }

    /// Appends the pprof location ids of a stack, leaf first as both formats store them.
    fn stack(&mut self, index: i32, location_ids: &mut Vec<u64>) -> Result<(), IngestError> {
        let stack = entry(&self.dictionary.stack_table, index, "stack")?;
        for location in &stack.location_indices {
            location_ids.push(self.location(*location)?);
        }
        Ok(())
    }
}

/// Samples of one profile grouped by the second their timestamps fall in (`None`: the
/// samples without timestamps, at the profile's own time).
type Buckets = BTreeMap<Option<i64>, Vec<(usize, i64)>>;

const SECOND: i64 = 1_000_000_000;

fn bucket_samples(profile: &OtlpProfile) -> Result<Buckets, IngestError> {
    let mut buckets = Buckets::new();
    for (position, sample) in profile.samples.iter().enumerate() {
        let timestamps = &sample.timestamps_unix_nano;
        if timestamps.is_empty() {
            let value = sample
                .values
                .iter()
                .fold(0i64, |sum, v| sum.saturating_add(*v));
            buckets.entry(None).or_default().push((position, value));
            continue;
        }
        if !sample.values.is_empty() && sample.values.len() != timestamps.len() {
            return Err(bad(format!(
                "sample {position} has {} values and {} timestamps; they must pair up",
                sample.values.len(),
                timestamps.len()
            )));
        }
        for (at, timestamp) in timestamps.iter().enumerate() {
            let timestamp = i64::try_from(*timestamp)
                .map_err(|_| bad(format!("sample {position} has a timestamp past 2262")))?;
            let value = sample.values.get(at).copied().unwrap_or(1);
            let second = timestamp - timestamp.rem_euclid(SECOND);
            buckets
                .entry(Some(second))
                .or_default()
                .push((position, value));
        }
    }
    Ok(buckets)
}

fn convert_profile(
    dictionary: &ProfilesDictionary,
    mut labels: Vec<(String, String)>,
    profile: &OtlpProfile,
    received_bytes: usize,
    limits: &Limits,
) -> Result<Vec<ParsedProfile>, IngestError> {
    let sample_type = profile
        .sample_type
        .ok_or_else(|| bad("profile has no sample_type"))?;
    for attribute in &profile.attribute_indices {
        let attribute = entry(&dictionary.attribute_table, *attribute, "attribute")?;
        let key = dictionary_string(dictionary, attribute.key_strindex)?;
        let value = match &attribute.value {
            Some(value) => value_text(dictionary, value)?,
            None => String::new(),
        };
        labels.push((label_name(key), value));
    }
    let mut series_labels = Labels::new();
    for (name, value) in labels {
        if !name.is_empty() {
            series_labels.set(name, value);
        }
    }

    // The symbol tables every bucket shares, then each bucket's samples.
    let mut builder = PprofBuilder::new(dictionary);
    builder.profile.sample_type = vec![ValueType {
        r#type: builder.string(sample_type.type_strindex)?,
        unit: builder.string(sample_type.unit_strindex)?,
    }];
    if let Some(period_type) = profile.period_type {
        builder.profile.period_type = Some(ValueType {
            r#type: builder.string(period_type.type_strindex)?,
            unit: builder.string(period_type.unit_strindex)?,
        });
    }
    builder.profile.period = profile.period;
    // Each sample's location ids and labels, as ranges of two flat vectors; samples that
    // share a stack share its range.
    let mut location_ids: Vec<u64> = Vec::new();
    let mut stack_ranges: HashMap<i32, (usize, usize)> = HashMap::new();
    let mut stacks = Vec::with_capacity(profile.samples.len());
    let mut labels_flat: Vec<pprof::Label> = Vec::new();
    let mut sample_labels = Vec::with_capacity(profile.samples.len());
    for sample in &profile.samples {
        let range = match stack_ranges.get(&sample.stack_index) {
            Some(range) => *range,
            None => {
                let start = location_ids.len();
                builder.stack(sample.stack_index, &mut location_ids)?;
                stack_ranges.insert(sample.stack_index, (start, location_ids.len()));
                (start, location_ids.len())
            }
        };
        stacks.push(range);
        let labels_start = labels_flat.len();
        let pprof_labels = &mut labels_flat;
        for attribute in &sample.attribute_indices {
            let attribute = entry(&dictionary.attribute_table, *attribute, "attribute")?;
            let key = sanitize_label_name(dictionary_string(dictionary, attribute.key_strindex)?);
            let value = match &attribute.value {
                Some(value) => value_text(dictionary, value)?,
                None => String::new(),
            };
            pprof_labels.push(pprof::Label {
                key: builder.text(&key),
                str: builder.text(&value),
                ..Default::default()
            });
        }
        if sample.link_index != 0 {
            let link = entry(&dictionary.link_table, sample.link_index, "link")?;
            for (key, id) in [("trace_id", &link.trace_id), ("span_id", &link.span_id)] {
                if id.iter().any(|byte| *byte != 0) {
                    pprof_labels.push(pprof::Label {
                        key: builder.text(key),
                        str: builder.text(&hex(id)),
                        ..Default::default()
                    });
                }
            }
        }
        sample_labels.push((labels_start, labels_flat.len()));
    }
    let mut tables = Some(builder.profile);

    let buckets = bucket_samples(profile)?;
    let profile_id = (!profile.profile_id.is_empty()).then(|| hex(&profile.profile_id));
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
            labels: series_labels.clone(),
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

/// The OTLP form of a pprof: one OTLP profile per sample type, sharing one dictionary,
/// string sample labels as sample attributes. Kiln's benchmarks replay real pprof files as
/// OTLP with it, and tests check that both routes store the same data.
pub fn request_from_pprof(
    profile: &Profile,
    resource_attributes: &[(&str, &str)],
    time_unix_nano: u64,
) -> ExportProfilesServiceRequest {
    let strindex = |index: i64| i32::try_from(index).unwrap_or(0);
    let mut dictionary = ProfilesDictionary {
        string_table: profile
            .string_table
            .iter()
            .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
            .collect(),
        // Entry 0 of every table is the zero value OTLP reserves.
        mapping_table: vec![Mapping::default()],
        location_table: vec![Location::default()],
        function_table: vec![Function::default()],
        link_table: vec![Link::default()],
        attribute_table: vec![KeyValueAndUnit::default()],
        stack_table: vec![Stack::default()],
    };
    let position_of = |ids: &mut dyn Iterator<Item = u64>| -> HashMap<u64, i32> {
        ids.enumerate()
            .map(|(position, id)| (id, position as i32 + 1))
            .collect()
    };
    let mappings = position_of(&mut profile.mapping.iter().map(|m| m.id));
    let functions = position_of(&mut profile.function.iter().map(|f| f.id));
    let locations = position_of(&mut profile.location.iter().map(|l| l.id));
    for mapping in &profile.mapping {
        dictionary.mapping_table.push(Mapping {
            memory_start: mapping.memory_start,
            memory_limit: mapping.memory_limit,
            file_offset: mapping.file_offset,
            filename_strindex: strindex(mapping.filename),
            attribute_indices: Vec::new(),
        });
    }
    for function in &profile.function {
        dictionary.function_table.push(Function {
            name_strindex: strindex(function.name),
            system_name_strindex: strindex(function.system_name),
            filename_strindex: strindex(function.filename),
            start_line: function.start_line,
        });
    }
    for location in &profile.location {
        dictionary.location_table.push(Location {
            mapping_index: mappings.get(&location.mapping_id).copied().unwrap_or(0),
            address: location.address,
            lines: location
                .line
                .iter()
                .map(|line| Line {
                    function_index: functions.get(&line.function_id).copied().unwrap_or(0),
                    line: line.line,
                    column: line.column,
                })
                .collect(),
            attribute_indices: Vec::new(),
        });
    }
    let mut stacks: HashMap<Vec<i32>, i32> = HashMap::new();
    let mut attributes: HashMap<(i64, i64), i32> = HashMap::new();
    let mut samples = Vec::with_capacity(profile.sample.len());
    for sample in profile.sample.iter() {
        let stack: Vec<i32> = sample
            .location_id
            .iter()
            .map(|id| locations.get(id).copied().unwrap_or(0))
            .collect();
        let next_stack = dictionary.stack_table.len() as i32;
        let stack_index = *stacks.entry(stack.clone()).or_insert_with(|| {
            dictionary.stack_table.push(Stack {
                location_indices: stack,
            });
            next_stack
        });
        let mut attribute_indices = Vec::new();
        for label in sample.label.iter().filter(|label| label.str != 0) {
            let next_attribute = dictionary.attribute_table.len() as i32;
            let index = *attributes.entry((label.key, label.str)).or_insert_with(|| {
                dictionary.attribute_table.push(KeyValueAndUnit {
                    key_strindex: strindex(label.key),
                    value: Some(AnyValue {
                        value: Some(Value::StringValueStrindex(strindex(label.str))),
                    }),
                    unit_strindex: 0,
                });
                next_attribute
            });
            attribute_indices.push(index);
        }
        samples.push((stack_index, attribute_indices, sample.value));
    }
    let value_type = |value_type: &ValueType| OtlpValueType {
        type_strindex: strindex(value_type.r#type),
        unit_strindex: strindex(value_type.unit),
    };
    let profiles = profile
        .sample_type
        .iter()
        .enumerate()
        .map(|(type_index, sample_type)| OtlpProfile {
            sample_type: Some(value_type(sample_type)),
            samples: samples
                .iter()
                .map(|(stack_index, attribute_indices, values)| OtlpSample {
                    stack_index: *stack_index,
                    attribute_indices: attribute_indices.clone(),
                    values: vec![values.get(type_index).copied().unwrap_or(0)],
                    ..Default::default()
                })
                .collect(),
            time_unix_nano,
            duration_nano: u64::try_from(profile.duration_nanos).unwrap_or(0),
            period_type: profile.period_type.as_ref().map(value_type),
            period: profile.period,
            ..Default::default()
        })
        .collect();
    ExportProfilesServiceRequest {
        resource_profiles: vec![ResourceProfiles {
            resource: Some(Resource {
                attributes: resource_attributes
                    .iter()
                    .map(|(key, value)| KeyValue {
                        key: key.to_string(),
                        value: Some(AnyValue {
                            value: Some(Value::StringValue(value.to_string())),
                        }),
                        key_strindex: 0,
                    })
                    .collect(),
                dropped_attributes_count: 0,
            }),
            scope_profiles: vec![ScopeProfiles {
                profiles,
                ..Default::default()
            }],
            schema_url: String::new(),
        }],
        dictionary: Some(dictionary),
    }
}
