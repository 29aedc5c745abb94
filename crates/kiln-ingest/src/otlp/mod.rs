//! OpenTelemetry profiles (OTLP), `opentelemetry.proto.collector.profiles.v1development`,
//! as of OTLP v1.10.0: one `ProfilesDictionary` per request shared by every profile in it,
//! stacks in a `stack_table`, attributes as `KeyValueAndUnit` with string-table keys.
//!
//! The messages are written here from the documented wire format (field numbers are the
//! contract), with proto3-JSON names for OTLP/HTTP JSON. Older drafts (v1.3–v1.7 kept a
//! dictionary inside each profile) differ in wire types where they overlap, so they fail
//! to decode and are refused with a message naming the supported version.
//!
//! Binary requests are read by [`wire`] into flat tables borrowing the body; OTLP/JSON
//! decodes into the messages below and is viewed the same way. [`convert`] turns the
//! profiles into pprofs (the sample types of one source merged back into one pprof),
//! holding only the symbols their samples reach, which then take the same path as every
//! pprof upload. Every request stands alone: nothing is remembered between requests, so
//! nothing can be missing from an earlier one.

mod convert;
pub mod wire;

use foldhash::{HashMap, HashMapExt};

use kiln_model::pprof::{Profile, ValueType};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

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

/// Decodes a binary `ExportProfilesServiceRequest` with prost's derived decoder: the
/// reference that tests and the fuzz target hold the server's flat reader
/// ([`parse_export_proto`]) to.
pub fn decode_proto(body: &[u8]) -> Result<ExportProfilesServiceRequest, IngestError> {
    <ExportProfilesServiceRequest as prost::Message>::decode(body).map_err(invalid_request)
}

fn invalid_request(err: impl std::fmt::Display) -> IngestError {
    IngestError::BadRequest(format!(
        "invalid OTLP profiles request (Kiln reads OTLP {OTLP_VERSION} profiles v1development): {err}"
    ))
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

/// Converts every profile of a binary request, read straight from its bytes
/// ([`wire::decode`]).
pub fn parse_export_proto(
    body: &[u8],
    received_bytes: usize,
    limits: &Limits,
) -> Result<Export, IngestError> {
    let request = wire::decode(body).map_err(invalid_request)?;
    convert::convert(&request, received_bytes, limits)
}

/// Converts every profile of a decoded request (OTLP/JSON). A profile that fails is
/// counted and explained; when every profile fails the request is refused as a whole
/// (400).
pub fn parse_export(
    request: ExportProfilesServiceRequest,
    received_bytes: usize,
    limits: &Limits,
) -> Result<Export, IngestError> {
    let view = wire::Request::from_message(&request).map_err(IngestError::BadRequest)?;
    convert::convert(&view, received_bytes, limits)
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
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
            .map(|id| locations.get(&u64::from(*id)).copied().unwrap_or(0))
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
