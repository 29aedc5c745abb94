//! Pyroscope's push API, `push.v1.PusherService/Push`, written from its documented wire
//! format: `PushRequest{series: [RawProfileSeries{labels, samples: [RawSample{raw_profile, ID}]}]}`.

use kiln_model::labels::{client_labels, ClientLabels, METRIC_NAME, SERVICE_NAME};
use serde::Deserialize;

use crate::parse::{from_pprof_bytes, ProfileContext, UNKNOWN_SERVICE};
use crate::{IngestError, Limits, ParsedProfile};

#[derive(Clone, PartialEq, prost::Message)]
pub struct PushRequest {
    #[prost(message, repeated, tag = "1")]
    pub series: Vec<RawProfileSeries>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RawProfileSeries {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<LabelPair>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<RawSample>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LabelPair {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RawSample {
    #[prost(bytes = "vec", tag = "1")]
    pub raw_profile: Vec<u8>,
    #[prost(string, tag = "2")]
    pub id: String,
}

/// The empty `PushResponse` (`{}` in JSON).
#[derive(Clone, PartialEq, prost::Message, serde::Serialize)]
pub struct PushResponse {}

// Proto3 JSON: parsers accept both the lowerCamelCase JSON name and the proto field name.
#[derive(Deserialize)]
struct JsonPushRequest {
    #[serde(default)]
    series: Vec<JsonSeries>,
}

#[derive(Deserialize)]
struct JsonSeries {
    #[serde(default)]
    labels: Vec<JsonLabel>,
    #[serde(default)]
    samples: Vec<JsonSample>,
}

#[derive(Deserialize)]
struct JsonLabel {
    #[serde(default)]
    name: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize)]
struct JsonSample {
    #[serde(default, alias = "raw_profile", rename = "rawProfile")]
    raw_profile: String,
    #[serde(default, alias = "id", rename = "ID")]
    id: String,
}

/// Decodes a binary `PushRequest`.
pub fn decode_proto(body: &[u8]) -> Result<PushRequest, IngestError> {
    <PushRequest as prost::Message>::decode(body)
        .map_err(|err| IngestError::BadRequest(format!("invalid PushRequest protobuf: {err}")))
}

/// Decodes a proto3-JSON `PushRequest` (bytes fields are base64).
pub fn decode_json(body: &[u8]) -> Result<PushRequest, IngestError> {
    let request: JsonPushRequest = serde_json::from_slice(body)
        .map_err(|err| IngestError::BadRequest(format!("invalid PushRequest JSON: {err}")))?;
    let mut series = Vec::with_capacity(request.series.len());
    for json_series in request.series {
        let mut samples = Vec::with_capacity(json_series.samples.len());
        for sample in json_series.samples {
            let raw_profile =
                kiln_model::proto_json::base64_decode(&sample.raw_profile).map_err(|err| {
                    IngestError::BadRequest(format!("rawProfile is not valid base64: {err}"))
                })?;
            samples.push(RawSample {
                raw_profile,
                id: sample.id,
            });
        }
        series.push(RawProfileSeries {
            labels: json_series
                .labels
                .into_iter()
                .map(|label| LabelPair {
                    name: label.name,
                    value: label.value,
                })
                .collect(),
            samples,
        });
    }
    Ok(PushRequest { series })
}

/// The service every series of `request` belongs to, when they share one: what
/// placement needs to send the request, unparsed, to the service's ingest node.
pub fn single_service(request: &PushRequest) -> Option<&str> {
    let mut services = request.series.iter().map(|series| {
        series
            .labels
            .iter()
            .find(|label| label.name == SERVICE_NAME)
            .map_or(UNKNOWN_SERVICE, |label| label.value.as_str())
    });
    let first = services.next()?;
    services.all(|service| service == first).then_some(first)
}

/// Converts every sample of every series; one bad profile refuses the whole request.
pub fn parse_push(
    request: PushRequest,
    limits: &Limits,
) -> Result<Vec<ParsedProfile>, IngestError> {
    let mut parsed = Vec::new();
    for series in request.series {
        // `__name__` is the push protocol's own: it names the profile type.
        let ClientLabels { labels, warnings } = client_labels(
            series
                .labels
                .iter()
                .map(|label| (label.name.as_str(), label.value.as_str())),
            &[METRIC_NAME],
        )?;
        for sample in series.samples {
            let context = ProfileContext {
                labels: labels.clone(),
                warnings: warnings.clone(),
                id: Some(sample.id),
                ..Default::default()
            };
            parsed.push(from_pprof_bytes(&sample.raw_profile, context, limits)?);
        }
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn a_push_has_one_service_only_when_all_its_series_share_it() {
        let series = |service: Option<&str>| RawProfileSeries {
            labels: service
                .map(|value| LabelPair {
                    name: "service_name".into(),
                    value: value.into(),
                })
                .into_iter()
                .collect(),
            samples: Vec::new(),
        };
        let request = |all: Vec<RawProfileSeries>| PushRequest { series: all };
        assert_eq!(single_service(&request(vec![])), None);
        assert_eq!(
            single_service(&request(vec![series(Some("a")), series(Some("a"))])),
            Some("a")
        );
        assert_eq!(
            single_service(&request(vec![series(Some("a")), series(Some("b"))])),
            None
        );
        assert_eq!(
            single_service(&request(vec![series(None)])),
            Some(UNKNOWN_SERVICE)
        );
    }

    #[test]
    fn json_and_proto_agree() {
        let request = PushRequest {
            series: vec![RawProfileSeries {
                labels: vec![LabelPair {
                    name: "service_name".into(),
                    value: "svc".into(),
                }],
                samples: vec![RawSample {
                    raw_profile: vec![1, 2, 3],
                    id: "abc".into(),
                }],
            }],
        };
        let proto = decode_proto(&request.encode_to_vec()).unwrap();
        let json = decode_json(
            br#"{"series":[{"labels":[{"name":"service_name","value":"svc"}],"samples":[{"rawProfile":"AQID","ID":"abc"}]}]}"#,
        )
        .unwrap();
        assert_eq!(proto, request);
        assert_eq!(json, request);
        let snake =
            decode_json(br#"{"series":[{"samples":[{"raw_profile":"AQID","id":"x"}]}]}"#).unwrap();
        assert_eq!(snake.series[0].samples[0].raw_profile, vec![1, 2, 3]);
        assert!(decode_json(b"{").is_err());
    }
}
