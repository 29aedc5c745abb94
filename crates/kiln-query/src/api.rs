//! Wire messages of Pyroscope's query API (`querier.v1.QuerierService` and the `types.v1`
//! messages it uses), written from the documented schema: field numbers and names are the
//! contract with Grafana's Pyroscope data source and `profilecli`.
//!
//! Every message is both a prost message (Connect `application/proto` and gRPC) and a
//! serde type following the proto3 JSON mapping (Connect `application/json`): fields in
//! lowerCamelCase (the proto name is accepted too), 64-bit integers written as strings and
//! read from strings or numbers, enums by name or number.

use serde::{Deserialize, Serialize};

// proto3 JSON helpers, shared with OTLP.
use kiln_model::proto_json as json;

pub const PROFILE_FORMATS: [&str; 3] = [
    "PROFILE_FORMAT_UNSPECIFIED",
    "PROFILE_FORMAT_FLAMEGRAPH",
    "PROFILE_FORMAT_TREE",
];
pub const AGGREGATIONS: [&str; 2] = [
    "TIME_SERIES_AGGREGATION_TYPE_SUM",
    "TIME_SERIES_AGGREGATION_TYPE_AVERAGE",
];
pub const EXEMPLAR_TYPES: [&str; 4] = [
    "EXEMPLAR_TYPE_UNSPECIFIED",
    "EXEMPLAR_TYPE_NONE",
    "EXEMPLAR_TYPE_INDIVIDUAL",
    "EXEMPLAR_TYPE_SPAN",
];

pub const PROFILE_FORMAT_TREE: i32 = 2;
pub const AGGREGATION_AVERAGE: i32 = 1;
pub const EXEMPLAR_TYPE_INDIVIDUAL: i32 = 2;
pub const EXEMPLAR_TYPE_SPAN: i32 = 3;

fn format_field<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<i32, D::Error> {
    Ok(json::enum_value(deserializer, &PROFILE_FORMATS)?.unwrap_or(0))
}

fn aggregation_field<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<i32>, D::Error> {
    json::enum_value(deserializer, &AGGREGATIONS)
}

fn exemplar_type_field<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<i32, D::Error> {
    Ok(json::enum_value(deserializer, &EXEMPLAR_TYPES)?.unwrap_or(0))
}

// ---- types.v1 ----

#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct LabelPair {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct ProfileType {
    #[prost(string, tag = "1")]
    #[serde(rename = "ID")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(string, tag = "4")]
    #[serde(rename = "sampleType", alias = "sample_type")]
    pub sample_type: String,
    #[prost(string, tag = "5")]
    #[serde(rename = "sampleUnit", alias = "sample_unit")]
    pub sample_unit: String,
    #[prost(string, tag = "6")]
    #[serde(rename = "periodType", alias = "period_type")]
    pub period_type: String,
    #[prost(string, tag = "7")]
    #[serde(rename = "periodUnit", alias = "period_unit")]
    pub period_unit: String,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct Labels {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<LabelPair>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct Series {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<LabelPair>,
    #[prost(message, repeated, tag = "2")]
    pub points: Vec<Point>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct Point {
    #[prost(double, tag = "1")]
    pub value: f64,
    /// Milliseconds since the epoch.
    #[prost(int64, tag = "2")]
    #[serde(with = "json::int64")]
    pub timestamp: i64,
    #[prost(message, repeated, tag = "4")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub exemplars: Vec<Exemplar>,
}

/// One profile behind a series point.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct Exemplar {
    /// Milliseconds since the epoch.
    #[prost(int64, tag = "1")]
    #[serde(with = "json::int64")]
    pub timestamp: i64,
    #[prost(string, tag = "2")]
    #[serde(rename = "profileId", alias = "profile_id")]
    pub profile_id: String,
    #[prost(string, tag = "3")]
    #[serde(rename = "spanId", alias = "span_id")]
    pub span_id: String,
    #[prost(int64, tag = "4")]
    #[serde(with = "json::int64")]
    pub value: i64,
    #[prost(message, repeated, tag = "5")]
    pub labels: Vec<LabelPair>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct LabelValuesRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, repeated, tag = "2")]
    pub matchers: Vec<String>,
    #[prost(int64, tag = "3")]
    #[serde(with = "json::int64")]
    pub start: i64,
    #[prost(int64, tag = "4")]
    #[serde(with = "json::int64")]
    pub end: i64,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct LabelValuesResponse {
    #[prost(string, repeated, tag = "1")]
    pub names: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct LabelNamesRequest {
    #[prost(string, repeated, tag = "1")]
    pub matchers: Vec<String>,
    #[prost(int64, tag = "2")]
    #[serde(with = "json::int64")]
    pub start: i64,
    #[prost(int64, tag = "3")]
    #[serde(with = "json::int64")]
    pub end: i64,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct LabelNamesResponse {
    #[prost(string, repeated, tag = "1")]
    pub names: Vec<String>,
}

/// Only stacks under this call site (root first) are selected.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct StackTraceSelector {
    #[prost(message, repeated, tag = "1")]
    #[serde(rename = "callSite", alias = "call_site")]
    pub call_site: Vec<CallSiteLocation>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct CallSiteLocation {
    #[prost(string, tag = "1")]
    pub name: String,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct GetProfileStatsRequest {}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct GetProfileStatsResponse {
    #[prost(bool, tag = "1")]
    #[serde(rename = "dataIngested", alias = "data_ingested")]
    pub data_ingested: bool,
    /// Milliseconds since the epoch.
    #[prost(int64, tag = "2")]
    #[serde(
        rename = "oldestProfileTime",
        alias = "oldest_profile_time",
        with = "json::int64"
    )]
    pub oldest_profile_time: i64,
    #[prost(int64, tag = "3")]
    #[serde(
        rename = "newestProfileTime",
        alias = "newest_profile_time",
        with = "json::int64"
    )]
    pub newest_profile_time: i64,
}

// ---- querier.v1 ----

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct ProfileTypesRequest {
    #[prost(int64, tag = "1")]
    #[serde(with = "json::int64")]
    pub start: i64,
    #[prost(int64, tag = "2")]
    #[serde(with = "json::int64")]
    pub end: i64,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct ProfileTypesResponse {
    #[prost(message, repeated, tag = "1")]
    #[serde(rename = "profileTypes", alias = "profile_types")]
    pub profile_types: Vec<ProfileType>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct SeriesRequest {
    #[prost(string, repeated, tag = "1")]
    pub matchers: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    #[serde(rename = "labelNames", alias = "label_names")]
    pub label_names: Vec<String>,
    #[prost(int64, tag = "3")]
    #[serde(with = "json::int64")]
    pub start: i64,
    #[prost(int64, tag = "4")]
    #[serde(with = "json::int64")]
    pub end: i64,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct SeriesResponse {
    #[prost(message, repeated, tag = "2")]
    #[serde(rename = "labelsSet", alias = "labels_set")]
    pub labels_set: Vec<Labels>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct SelectMergeStacktracesRequest {
    #[prost(string, tag = "1")]
    #[serde(rename = "profileTypeID", alias = "profile_typeID")]
    pub profile_type_id: String,
    #[prost(string, tag = "2")]
    #[serde(rename = "labelSelector", alias = "label_selector")]
    pub label_selector: String,
    /// Milliseconds since the epoch.
    #[prost(int64, tag = "3")]
    #[serde(with = "json::int64")]
    pub start: i64,
    #[prost(int64, tag = "4")]
    #[serde(with = "json::int64")]
    pub end: i64,
    #[prost(int64, optional, tag = "5")]
    #[serde(rename = "maxNodes", alias = "max_nodes", with = "json::opt_int64")]
    pub max_nodes: Option<i64>,
    #[prost(int32, tag = "6")]
    #[serde(deserialize_with = "format_field")]
    pub format: i32,
    #[prost(message, optional, tag = "7")]
    #[serde(rename = "stackTraceSelector", alias = "stack_trace_selector")]
    pub stack_trace_selector: Option<StackTraceSelector>,
    #[prost(string, repeated, tag = "8")]
    #[serde(rename = "profileIdSelector", alias = "profile_id_selector")]
    pub profile_id_selector: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct SelectMergeStacktracesResponse {
    #[prost(message, optional, tag = "1")]
    pub flamegraph: Option<FlameGraph>,
    /// Pyroscope's serialized tree, for `PROFILE_FORMAT_TREE`.
    #[prost(bytes = "vec", tag = "2")]
    #[serde(with = "json::bytes", skip_serializing_if = "Vec::is_empty")]
    pub tree: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct SelectMergeSpanProfileRequest {
    #[prost(string, tag = "1")]
    #[serde(rename = "profileTypeID", alias = "profile_typeID")]
    pub profile_type_id: String,
    #[prost(string, tag = "2")]
    #[serde(rename = "labelSelector", alias = "label_selector")]
    pub label_selector: String,
    #[prost(string, repeated, tag = "3")]
    #[serde(rename = "spanSelector", alias = "span_selector")]
    pub span_selector: Vec<String>,
    #[prost(int64, tag = "4")]
    #[serde(with = "json::int64")]
    pub start: i64,
    #[prost(int64, tag = "5")]
    #[serde(with = "json::int64")]
    pub end: i64,
    #[prost(int64, optional, tag = "6")]
    #[serde(rename = "maxNodes", alias = "max_nodes", with = "json::opt_int64")]
    pub max_nodes: Option<i64>,
    #[prost(int32, tag = "7")]
    #[serde(deserialize_with = "format_field")]
    pub format: i32,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct DiffRequest {
    #[prost(message, optional, tag = "1")]
    pub left: Option<SelectMergeStacktracesRequest>,
    #[prost(message, optional, tag = "2")]
    pub right: Option<SelectMergeStacktracesRequest>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct DiffResponse {
    #[prost(message, optional, tag = "1")]
    pub flamegraph: Option<FlameGraphDiff>,
}

/// `levels[d].values` holds, per node at depth `d`, four numbers: x offset from the end
/// of the previous node of the level, total, self, index into `names`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct FlameGraph {
    #[prost(string, repeated, tag = "1")]
    pub names: Vec<String>,
    #[prost(message, repeated, tag = "2")]
    pub levels: Vec<Level>,
    #[prost(int64, tag = "3")]
    #[serde(with = "json::int64")]
    pub total: i64,
    #[prost(int64, tag = "4")]
    #[serde(rename = "maxSelf", alias = "max_self", with = "json::int64")]
    pub max_self: i64,
    /// Kiln's addition (a tag far from Pyroscope's, which its clients skip): the binaries
    /// of the frames shown as `binary+0xoffset`, for the notice asking for debug info.
    #[prost(message, repeated, tag = "100")]
    #[serde(
        rename = "unnamedBinaries",
        alias = "unnamed_binaries",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub unnamed_binaries: Vec<UnnamedBinary>,
}

/// A binary with frames no symbols named. Ordered by name, then build id, as a flame
/// graph lists them.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct UnnamedBinary {
    /// Its file name, as its frames show it.
    #[prost(string, tag = "1")]
    pub binary: String,
    /// Its GNU build id, empty when the profile gave none.
    #[prost(string, tag = "2")]
    #[serde(rename = "buildId", alias = "build_id")]
    pub build_id: String,
}

/// Like [`FlameGraph`] with seven numbers per node: left x offset, left total, left self,
/// right x offset, right total, right self, name index.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct FlameGraphDiff {
    #[prost(string, repeated, tag = "1")]
    pub names: Vec<String>,
    #[prost(message, repeated, tag = "2")]
    pub levels: Vec<Level>,
    #[prost(int64, tag = "3")]
    #[serde(with = "json::int64")]
    pub total: i64,
    #[prost(int64, tag = "4")]
    #[serde(rename = "maxSelf", alias = "max_self", with = "json::int64")]
    pub max_self: i64,
    #[prost(int64, tag = "5")]
    #[serde(rename = "leftTicks", with = "json::int64")]
    pub left_ticks: i64,
    #[prost(int64, tag = "6")]
    #[serde(rename = "rightTicks", with = "json::int64")]
    pub right_ticks: i64,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct Level {
    #[prost(int64, repeated, tag = "1")]
    #[serde(with = "json::int64s")]
    pub values: Vec<i64>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct SelectMergeProfileRequest {
    #[prost(string, tag = "1")]
    #[serde(rename = "profileTypeID", alias = "profile_typeID")]
    pub profile_type_id: String,
    #[prost(string, tag = "2")]
    #[serde(rename = "labelSelector", alias = "label_selector")]
    pub label_selector: String,
    #[prost(int64, tag = "3")]
    #[serde(with = "json::int64")]
    pub start: i64,
    #[prost(int64, tag = "4")]
    #[serde(with = "json::int64")]
    pub end: i64,
    #[prost(int64, optional, tag = "5")]
    #[serde(rename = "maxNodes", alias = "max_nodes", with = "json::opt_int64")]
    pub max_nodes: Option<i64>,
    #[prost(message, optional, tag = "6")]
    #[serde(rename = "stackTraceSelector", alias = "stack_trace_selector")]
    pub stack_trace_selector: Option<StackTraceSelector>,
    #[prost(string, repeated, tag = "7")]
    #[serde(rename = "profileIdSelector", alias = "profile_id_selector")]
    pub profile_id_selector: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct SelectSeriesRequest {
    #[prost(string, tag = "1")]
    #[serde(rename = "profileTypeID", alias = "profile_typeID")]
    pub profile_type_id: String,
    #[prost(string, tag = "2")]
    #[serde(rename = "labelSelector", alias = "label_selector")]
    pub label_selector: String,
    #[prost(int64, tag = "3")]
    #[serde(with = "json::int64")]
    pub start: i64,
    #[prost(int64, tag = "4")]
    #[serde(with = "json::int64")]
    pub end: i64,
    #[prost(string, repeated, tag = "5")]
    #[serde(rename = "groupBy", alias = "group_by")]
    pub group_by: Vec<String>,
    /// Seconds.
    #[prost(double, tag = "6")]
    pub step: f64,
    #[prost(int32, optional, tag = "7")]
    #[serde(deserialize_with = "aggregation_field")]
    pub aggregation: Option<i32>,
    #[prost(message, optional, tag = "8")]
    #[serde(rename = "stackTraceSelector", alias = "stack_trace_selector")]
    pub stack_trace_selector: Option<StackTraceSelector>,
    #[prost(int64, optional, tag = "9")]
    #[serde(with = "json::opt_int64")]
    pub limit: Option<i64>,
    #[prost(int32, tag = "10")]
    #[serde(
        rename = "exemplarType",
        alias = "exemplar_type",
        deserialize_with = "exemplar_type_field"
    )]
    pub exemplar_type: i32,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct SelectSeriesResponse {
    #[prost(message, repeated, tag = "1")]
    pub series: Vec<Series>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn json_requests_accept_both_field_spellings_and_int64_as_strings() {
        let camel: SelectMergeStacktracesRequest = serde_json::from_str(
            r#"{"profileTypeID":"a:b:c:d:e","labelSelector":"{}","start":"1000","end":2000,
                "maxNodes":"16","format":"PROFILE_FORMAT_TREE"}"#,
        )
        .unwrap();
        let snake: SelectMergeStacktracesRequest = serde_json::from_str(
            r#"{"profile_typeID":"a:b:c:d:e","label_selector":"{}","start":1000,"end":"2000",
                "max_nodes":16,"format":2}"#,
        )
        .unwrap();
        assert_eq!(camel, snake);
        assert_eq!(camel.max_nodes, Some(16));
        assert_eq!(camel.format, PROFILE_FORMAT_TREE);
        let series: SelectSeriesRequest = serde_json::from_str(
            r#"{"step":15.5,"aggregation":"TIME_SERIES_AGGREGATION_TYPE_AVERAGE",
                "exemplarType":"EXEMPLAR_TYPE_INDIVIDUAL","groupBy":["pod"]}"#,
        )
        .unwrap();
        assert_eq!(series.aggregation, Some(AGGREGATION_AVERAGE));
        assert_eq!(series.exemplar_type, EXEMPLAR_TYPE_INDIVIDUAL);
        assert!(serde_json::from_str::<SelectSeriesRequest>(r#"{"start":"soon"}"#).is_err());
        assert!(serde_json::from_str::<SelectSeriesRequest>(r#"{"aggregation":"MAX"}"#).is_err());
    }

    #[test]
    fn json_responses_write_int64_as_strings() {
        let response = SelectMergeStacktracesResponse {
            flamegraph: Some(FlameGraph {
                names: vec!["total".into()],
                levels: vec![Level {
                    values: vec![0, 10, 0, 0],
                }],
                total: 10,
                max_self: 0,
                unnamed_binaries: Vec::new(),
            }),
            tree: Vec::new(),
        };
        let text = serde_json::to_string(&response).unwrap();
        assert_eq!(
            text,
            r#"{"flamegraph":{"names":["total"],"levels":[{"values":["0","10","0","0"]}],"total":"10","maxSelf":"0"}}"#
        );
    }

    /// Field numbers, checked against hand-assembled protobuf bytes.
    #[test]
    fn field_numbers_match_the_schema() {
        let request = SelectSeriesRequest {
            profile_type_id: "t".into(),
            step: 1.0,
            limit: Some(3),
            exemplar_type: EXEMPLAR_TYPE_INDIVIDUAL,
            ..Default::default()
        };
        let bytes = request.encode_to_vec();
        // 1: "t"; 6: double 1.0; 9: varint 3; 10: varint 2.
        let mut expected = vec![0x0a, 0x01, b't', 0x31];
        expected.extend_from_slice(&1.0f64.to_le_bytes());
        expected.extend_from_slice(&[0x48, 0x03, 0x50, 0x02]);
        assert_eq!(bytes, expected);
        let point = Point {
            value: 0.0,
            timestamp: 5,
            exemplars: vec![Exemplar {
                profile_id: "p".into(),
                ..Default::default()
            }],
        };
        // 2: varint 5; 4: message { 2: "p" }.
        assert_eq!(
            point.encode_to_vec(),
            vec![0x10, 0x05, 0x22, 0x03, 0x12, 0x01, b'p']
        );
        let profile_type = ProfileType {
            id: "i".into(),
            sample_type: "s".into(),
            ..Default::default()
        };
        // 1: "i"; 4: "s".
        assert_eq!(
            profile_type.encode_to_vec(),
            vec![0x0a, 0x01, b'i', 0x22, 0x01, b's']
        );
    }
}
