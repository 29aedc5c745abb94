//! Pyroscope's `POST /ingest`: `name=APP.SUFFIX{tags}`, `from`/`until`, `format`, and a
//! body that is pprof (raw, gzip, or multipart), folded stacks, speedscope JSON, a JFR
//! recording (raw or pyroscope-java's multipart `jfr` + `labels`), or `perf script` text.

use std::collections::HashMap;

use bytes::Bytes;
use kiln_model::labels::{client_labels, sanitize_label_name, ClientLabels, SERVICE_NAME};
use kiln_model::profile_type::{default_legacy_type, split_legacy_name, SuffixType};
use kiln_model::time::{arrival_nanos, parse_epoch_nanos};
use kiln_model::{folded, jfr, perf_script, speedscope};

use crate::parse::{from_pprof, from_pprof_bytes, ProfileContext};
use crate::{IngestError, Limits, ParsedProfile};

/// The parts of the `name` parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IngestName {
    pub app: String,
    /// The profile kind, when the last dot-separated part names a known one.
    pub kind: Option<SuffixType>,
    pub tags: Vec<(String, String)>,
}

/// Parses `app.cpu{env=staging,region=us-west}`.
pub fn parse_name(name: &str) -> Result<IngestName, IngestError> {
    let name = name.trim();
    let (head, tags) = match name.find('{') {
        Some(open) => {
            let Some(body) = name[open + 1..].strip_suffix('}') else {
                return Err(IngestError::BadRequest(format!(
                    "invalid name {name:?}: tags must be enclosed in {{}} at the end"
                )));
            };
            (&name[..open], parse_tags(body)?)
        }
        None => (name, Vec::new()),
    };
    let head = head.trim();
    if head.is_empty() {
        return Err(IngestError::BadRequest(
            "the name parameter has no application name".into(),
        ));
    }
    let (app, kind) = split_legacy_name(head);
    Ok(IngestName {
        app: app.to_string(),
        kind,
        tags,
    })
}

fn parse_tags(body: &str) -> Result<Vec<(String, String)>, IngestError> {
    let mut tags = Vec::new();
    for pair in body.split(',') {
        let pair = pair.trim();
        if pair.is_empty() {
            continue;
        }
        let Some((key, value)) = pair.split_once('=') else {
            return Err(IngestError::BadRequest(format!(
                "invalid tag {pair:?}: expected key=value"
            )));
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(IngestError::BadRequest(format!(
                "invalid tag {pair:?}: empty key"
            )));
        }
        let value = value.trim().trim_matches('"');
        tags.push((key.to_string(), value.to_string()));
    }
    Ok(tags)
}

/// What the body of an `/ingest` request holds, judged from `format` and the content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyFormat {
    Pprof,
    Folded,
    Speedscope,
    Jfr,
    PerfScript,
}

fn body_format(
    format: Option<&str>,
    content_type: &str,
    body: &[u8],
) -> Result<BodyFormat, IngestError> {
    match format.map(str::trim).unwrap_or("") {
        "pprof" => Ok(BodyFormat::Pprof),
        "folded" | "lines" => Ok(BodyFormat::Folded),
        "speedscope" => Ok(BodyFormat::Speedscope),
        "jfr" => Ok(BodyFormat::Jfr),
        "perf_script" => Ok(BodyFormat::PerfScript),
        "" => {
            if content_type.starts_with("multipart/form-data")
                || kiln_model::compress::is_gzip(body)
            {
                Ok(BodyFormat::Pprof)
            } else {
                Ok(BodyFormat::Folded)
            }
        }
        other => Err(IngestError::UnsupportedFormat(format!(
            "unknown format {other:?}; supported: pprof, folded, lines, speedscope, jfr, perf_script"
        ))),
    }
}

/// A request's CPU work, to run on the write path's threads: decompress, decode, convert.
pub type ParseJob = Box<dyn FnOnce() -> Result<Vec<ParsedProfile>, IngestError> + Send>;

/// Parses an `/ingest` request into profiles, in two parts. `params` are the query
/// parameters, `body` the request body after any `Content-Encoding` was removed. Here the
/// parameters are checked and a multipart body split; the returned job does the CPU work,
/// so that a caller can stage the profiles on the thread that parsed them
/// (`Ingester::parse_and_write`).
pub async fn prepare_ingest(
    params: &HashMap<String, String>,
    content_type: &str,
    body: Bytes,
    limits: &Limits,
) -> Result<ParseJob, IngestError> {
    let name = params.get("name").ok_or_else(|| {
        IngestError::BadRequest("the name parameter is required (name=app.cpu{tags})".into())
    })?;
    let name = parse_name(name)?;
    let from = params
        .get("from")
        .map(|v| parse_epoch_nanos(v))
        .transpose()?;
    let until = params
        .get("until")
        .map(|v| parse_epoch_nanos(v))
        .transpose()?;
    let sample_rate: Option<f64> = match params
        .get("sampleRate")
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
    {
        Some(value) => Some(
            value
                .parse::<f64>()
                .ok()
                .filter(|rate| *rate > 0.0 && rate.is_finite())
                .ok_or_else(|| IngestError::BadRequest(format!("invalid sampleRate {value:?}")))?,
        ),
        None => None,
    };
    let format = body_format(
        params.get("format").map(String::as_str),
        content_type,
        &body,
    )?;

    let ClientLabels {
        mut labels,
        warnings,
    } = client_labels(
        name.tags
            .iter()
            .map(|(key, value)| (key.as_str(), value.as_str())),
        &[],
    )?;
    labels.set(SERVICE_NAME, name.app.clone());
    if let Some(spy) = params.get("spyName").filter(|spy| !spy.is_empty()) {
        labels.set("pyroscope_spy", spy.clone());
    }
    let mut context = ProfileContext {
        labels,
        warnings,
        // Without `from` a profile is stamped with its arrival, as Pyroscope does; the
        // pprof's own time_nanos may be from whenever the file was recorded.
        time_nanos: Some(from.unwrap_or_else(arrival_nanos)),
        duration_nanos: match (from, until) {
            (Some(from), Some(until)) if until >= from => Some(until - from),
            _ => None,
        },
        ..Default::default()
    };

    match format {
        BodyFormat::Pprof => {
            let pprof_body = if content_type.starts_with("multipart/form-data") {
                multipart_profile(content_type, body).await?
            } else {
                body
            };
            context.name = name
                .kind
                .as_ref()
                .map(|known| known.profile_type.name.clone());
            let limits = *limits;
            Ok(Box::new(move || {
                Ok(vec![from_pprof_bytes(&pprof_body, context, &limits)?])
            }))
        }
        BodyFormat::Folded => {
            // A suffix is only split off the name when it is a known kind; no suffix means CPU.
            let known = name.kind.clone().unwrap_or_else(default_legacy_type);
            let scale = known
                .scale_by_sample_rate
                .then(|| 1e9 / sample_rate.unwrap_or(100.0));
            let profile_type = known.profile_type;
            context.name = Some(profile_type.name.clone());
            context.scale = scale;
            let limits = *limits;
            Ok(Box::new(move || {
                let text =
                    kiln_model::compress::maybe_gunzip(&body, limits.max_decompressed_bytes)?;
                let stacks = folded::parse(&text, limits.max_samples_per_profile)?;
                let profile = folded::to_pprof(&stacks, &profile_type);
                Ok(vec![from_pprof(profile, context, body.len(), &limits)?])
            }))
        }
        BodyFormat::Speedscope => {
            let known = name.kind.clone().unwrap_or_else(default_legacy_type);
            let limits = *limits;
            Ok(Box::new(move || {
                let text =
                    kiln_model::compress::maybe_gunzip(&body, limits.max_decompressed_bytes)?;
                let profile_type = &known.profile_type;
                let mut parsed = speedscope::parse(
                    &text,
                    &profile_type.sample_type,
                    limits.max_samples_per_profile,
                )?;
                match parsed.unit {
                    speedscope::Unit::Time => context.name = Some(profile_type.name.clone()),
                    speedscope::Unit::Bytes => context.name = Some("memory".into()),
                    // Sample counts of a CPU upload are CPU time at the sample rate, as
                    // for folded stacks.
                    speedscope::Unit::Count if known.scale_by_sample_rate => {
                        let profile = &mut parsed.profile;
                        let kind = profile.string_table.len() as i64;
                        profile
                            .string_table
                            .push(profile_type.sample_type.as_bytes());
                        profile
                            .string_table
                            .push(profile_type.sample_unit.as_bytes());
                        let value_type = kiln_model::pprof::ValueType {
                            r#type: kind,
                            unit: kind + 1,
                        };
                        profile.sample_type = vec![value_type];
                        profile.period_type = Some(value_type);
                        context.name = Some(profile_type.name.clone());
                        context.scale = Some(1e9 / sample_rate.unwrap_or(100.0));
                    }
                    speedscope::Unit::Count => {}
                }
                context.sample_labels_per_sample = true;
                Ok(vec![from_pprof(
                    parsed.profile,
                    context,
                    body.len(),
                    &limits,
                )?])
            }))
        }
        BodyFormat::PerfScript => {
            let limits = *limits;
            Ok(Box::new(move || {
                let text =
                    kiln_model::compress::maybe_gunzip(&body, limits.max_decompressed_bytes)?;
                let profile = perf_script::parse(&text, limits.max_samples_per_profile)?;
                Ok(vec![from_pprof(profile, context, body.len(), &limits)?])
            }))
        }
        BodyFormat::Jfr => {
            let (recording, contexts) = if content_type.starts_with("multipart/form-data") {
                jfr_parts(content_type, body).await?
            } else {
                (body, Bytes::new())
            };
            let interval_nanos = (1e9 / sample_rate.unwrap_or(100.0)).round() as i64;
            let limits = *limits;
            Ok(Box::new(move || {
                let data =
                    kiln_model::compress::maybe_gunzip(&recording, limits.max_decompressed_bytes)?;
                let contexts = decode_contexts(&contexts)?;
                let recordings = jfr::parse(
                    &data,
                    interval_nanos,
                    limits.max_samples_per_profile,
                    &contexts,
                )?;
                if recordings.is_empty() {
                    return Err(IngestError::BadRequest(
                        "the JFR recording holds no execution, allocation or lock samples".into(),
                    ));
                }
                let share = recording.len() / recordings.len();
                recordings
                    .into_iter()
                    .map(|recording| {
                        let context = ProfileContext {
                            name: Some(recording.kind.name().to_string()),
                            ..context.clone()
                        };
                        from_pprof(recording.profile, context, share, &limits)
                    })
                    .collect()
            }))
        }
    }
}

/// pyroscope-java's `LabelsSnapshot`: the labels behind each context id of its JFR events.
#[derive(Clone, PartialEq, prost::Message)]
struct LabelsSnapshot {
    #[prost(map = "int64, message", tag = "1")]
    contexts: std::collections::HashMap<i64, LabelsContext>,
    #[prost(map = "int64, string", tag = "2")]
    strings: std::collections::HashMap<i64, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct LabelsContext {
    #[prost(map = "int64, int64", tag = "1")]
    labels: std::collections::HashMap<i64, i64>,
}

fn decode_contexts(bytes: &[u8]) -> Result<jfr::Contexts, IngestError> {
    let mut contexts = jfr::Contexts::new();
    if bytes.is_empty() {
        return Ok(contexts);
    }
    let snapshot = <LabelsSnapshot as prost::Message>::decode(bytes)
        .map_err(|err| IngestError::BadRequest(format!("invalid JFR labels part: {err}")))?;
    let string = |id: &i64| snapshot.strings.get(id).cloned().unwrap_or_default();
    for (id, context) in &snapshot.contexts {
        let mut labels: Vec<(String, String)> = context
            .labels
            .iter()
            .map(|(key, value)| (sanitize_label_name(&string(key)), string(value)))
            .filter(|(key, _)| !key.is_empty())
            .collect();
        labels.sort();
        contexts.insert(*id, labels);
    }
    Ok(contexts)
}

/// The `jfr` and optional `labels` parts of a pyroscope-java upload.
async fn jfr_parts(content_type: &str, body: Bytes) -> Result<(Bytes, Bytes), IngestError> {
    let mut parts = multipart_parts(content_type, body).await?;
    let recording = parts
        .remove("jfr")
        .ok_or_else(|| IngestError::BadRequest("multipart body has no \"jfr\" part".into()))?;
    let labels = parts.remove("labels").unwrap_or_default();
    Ok((recording, labels))
}

/// Every named part of a multipart body.
async fn multipart_parts(
    content_type: &str,
    body: Bytes,
) -> Result<HashMap<String, Bytes>, IngestError> {
    let boundary = multer::parse_boundary(content_type)
        .map_err(|err| IngestError::BadRequest(format!("invalid multipart content type: {err}")))?;
    let stream = futures_util::stream::once(async move { Ok::<Bytes, std::io::Error>(body) });
    let mut multipart = multer::Multipart::new(stream, boundary);
    let mut parts = HashMap::new();
    while let Some(field) = multipart
        .next_field()
        .await
        .map_err(|err| IngestError::BadRequest(format!("invalid multipart body: {err}")))?
    {
        let name = field.name().unwrap_or("").to_string();
        let data = field.bytes().await.map_err(|err| {
            IngestError::BadRequest(format!("invalid multipart part {name:?}: {err}"))
        })?;
        parts.insert(name, data);
    }
    Ok(parts)
}

/// Extracts the `profile` part of a multipart upload (the Go SDK's shape). A
/// `sample_type_config` part is checked to be JSON; sample types come from the profile.
async fn multipart_profile(content_type: &str, body: Bytes) -> Result<Bytes, IngestError> {
    let mut parts = multipart_parts(content_type, body).await?;
    if parts.contains_key("prev_profile") {
        return Err(IngestError::BadRequest(
            "prev_profile is not supported: send delta profiles (the Go SDK does by default) \
             instead of cumulative ones"
                .into(),
        ));
    }
    if let Some(config) = parts.get("sample_type_config") {
        serde_json::from_slice::<serde_json::Value>(config).map_err(|err| {
            IngestError::BadRequest(format!("sample_type_config is not valid JSON: {err}"))
        })?;
    }
    parts
        .remove("profile")
        .ok_or_else(|| IngestError::BadRequest("multipart body has no \"profile\" part".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_suffix_and_tags() {
        let name = parse_name("my.app.cpu{env=staging, region=us-west}").unwrap();
        assert_eq!(name.app, "my.app");
        assert_eq!(
            name.kind.map(|kind| kind.profile_type.id()).as_deref(),
            Some("process_cpu:cpu:nanoseconds:cpu:nanoseconds")
        );
        assert_eq!(
            name.tags,
            vec![
                ("env".into(), "staging".into()),
                ("region".into(), "us-west".into())
            ]
        );
        let name = parse_name("my.app{}").unwrap();
        assert_eq!((name.app.as_str(), name.kind), ("my.app", None));
        assert!(parse_name("app{broken").is_err());
        assert!(parse_name("{a=b}").is_err());
        assert!(parse_name("app{novalue}").is_err());
    }

    /// The whole parse, as the server runs it (there on the write path's threads).
    async fn parse_ingest(
        params: &HashMap<String, String>,
        content_type: &str,
        body: Bytes,
        limits: &Limits,
    ) -> Result<Vec<ParsedProfile>, IngestError> {
        prepare_ingest(params, content_type, body, limits).await?()
    }

    #[tokio::test]
    async fn folded_cpu_is_scaled_to_nanoseconds() {
        let params = HashMap::from([
            ("name".to_string(), "svc.cpu{env=prod}".to_string()),
            ("sampleRate".to_string(), "100".to_string()),
            ("from".to_string(), "1700000000".to_string()),
            ("until".to_string(), "1700000010".to_string()),
        ]);
        let parsed = parse_ingest(
            &params,
            "text/plain",
            Bytes::from_static(b"main;work 3\nmain 1\n"),
            &Limits {
                retention_days: 0, // the time above is from 2023
                ..Limits::default()
            },
        )
        .await
        .unwrap();
        assert_eq!(parsed.len(), 1);
        let profile = &parsed[0];
        assert_eq!(profile.labels.get("service_name"), Some("svc"));
        assert_eq!(profile.labels.get("env"), Some("prod"));
        assert_eq!(
            profile.types[0].profile_type.id(),
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
        );
        assert_eq!(profile.types[0].scale, Some(10_000_000.0));
        assert_eq!(profile.time_nanos, 1_700_000_000_000_000_000);
        assert_eq!(profile.duration_nanos, 10_000_000_000);
    }

    #[test]
    fn jfr_labels_snapshots_name_each_context() {
        let snapshot = LabelsSnapshot {
            contexts: [(
                7,
                LabelsContext {
                    labels: [(1, 2), (3, 4)].into_iter().collect(),
                },
            )]
            .into_iter()
            .collect(),
            strings: [
                (1, "endpoint"),
                (2, "/checkout"),
                (3, "region.name"),
                (4, "eu"),
            ]
            .into_iter()
            .map(|(id, text)| (id, text.to_string()))
            .collect(),
        };
        let contexts = decode_contexts(&prost::Message::encode_to_vec(&snapshot)).unwrap();
        assert_eq!(
            contexts.get(&7),
            Some(&vec![
                ("endpoint".to_string(), "/checkout".to_string()),
                ("region.name".to_string(), "eu".to_string()),
            ])
        );
        assert!(decode_contexts(b"").unwrap().is_empty());
        assert!(decode_contexts(&[0x0a, 0xff]).is_err());
    }

    #[tokio::test]
    async fn unsupported_formats_are_415() {
        let params = HashMap::from([
            ("name".to_string(), "svc".to_string()),
            ("format".to_string(), "xml".to_string()),
        ]);
        let err = parse_ingest(&params, "", Bytes::new(), &Limits::default())
            .await
            .err()
            .unwrap();
        assert_eq!(err.kind().status(), 415);
    }
}
