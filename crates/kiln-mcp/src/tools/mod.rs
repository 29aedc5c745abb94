//! The tools, one file each, and what they share: where to look (a service or selector,
//! a profile type, a time range), the merged call tree, and links into the UI.

mod compare;
mod flame;
mod labels;
mod profile;
mod regressions;
mod series;
mod services;
mod source;
mod top;
mod tree;
mod types;

use serde_json::{json, Map, Value};

use crate::api::{self, Api, ApiRequest, ToolError};
use crate::units::ProfileType;

/// The type shown when none is asked for and a service has it.
const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

/// Every tool's definition, as `tools/list` gives them.
pub fn definitions() -> Vec<Value> {
    [
        services::definition(),
        types::definition(),
        labels::definition(),
        top::definition(),
        flame::definition(),
        compare::definition(),
        regressions::definition(),
        source::definition(),
        series::definition(),
        profile::definition(),
    ]
    .into_iter()
    .collect()
}

/// Runs the tool `name`; `None` when there is no such tool.
pub async fn call(api: &impl Api, name: &str, args: &Value) -> Option<Result<String, ToolError>> {
    let args = Args(args);
    Some(match name {
        "list_services" => services::run(api, &args).await,
        "list_profile_types" => types::run(api, &args).await,
        "list_labels" => labels::run(api, &args).await,
        "top_functions" => top::run(api, &args).await,
        "flame_graph" => flame::run(api, &args).await,
        "compare" => compare::run(api, &args).await,
        "list_regressions" => regressions::run(api, &args).await,
        "source_lines" => source::run(api, &args).await,
        "series" => series::run(api, &args).await,
        "get_profile" => profile::run(api, &args).await,
        _ => return None,
    })
}

/// A tool's definition: its input schema's properties, `required` among them.
fn tool(
    name: &str,
    title: &str,
    description: &str,
    properties: Vec<(&str, Value)>,
    required: &[&str],
) -> Value {
    let properties: Map<String, Value> = properties
        .into_iter()
        .map(|(key, schema)| (key.to_string(), schema))
        .collect();
    json!({
        "name": name,
        "title": title,
        "description": description,
        "inputSchema": {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": false,
        },
        "annotations": { "readOnlyHint": true, "openWorldHint": false },
    })
}

fn string(description: &str) -> Value {
    json!({ "type": "string", "description": description })
}

fn integer(description: &str, minimum: i64, maximum: i64) -> Value {
    json!({ "type": "integer", "description": description, "minimum": minimum, "maximum": maximum })
}

/// The properties that say where to look, common to the query tools.
fn where_properties() -> Vec<(&'static str, Value)> {
    vec![
        ("service", string("The service (its service_name label), e.g. \"checkout\"; list_services names them")),
        ("selector", string("More label matchers, Prometheus style, e.g. {region=\"eu\", version=~\"1.4.*\"}; with service, both apply")),
        ("profile_type", string("A profile type id, e.g. process_cpu:cpu:nanoseconds:cpu:nanoseconds; by default the service's CPU type (list_profile_types names them)")),
        ("from", string("Start: now-1h (the default), now-30m, RFC 3339, or epoch milliseconds")),
        ("until", string("End, in the same forms; default now")),
    ]
}

/// A tool's arguments, read with the messages a model needs to correct a call.
pub struct Args<'a>(&'a Value);

impl Args<'_> {
    fn str(&self, key: &str) -> Option<&str> {
        self.0
            .get(key)
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|text| !text.is_empty())
    }

    fn text(&self, key: &str) -> Result<Option<String>, ToolError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) if text.trim().is_empty() => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.trim().to_string())),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(other) => Err(ToolError::Arguments(format!(
                "\"{key}\" must be a string, not {other}"
            ))),
        }
    }

    fn required(&self, key: &str) -> Result<String, ToolError> {
        self.text(key)?
            .ok_or_else(|| ToolError::Arguments(format!("\"{key}\" is required")))
    }

    /// A count between 1 and `max`, or `default`.
    fn count(&self, key: &str, default: usize, max: usize) -> Result<usize, ToolError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(value) => value
                .as_u64()
                .or_else(|| value.as_str().and_then(|s| s.trim().parse().ok()))
                .and_then(|n| usize::try_from(n).ok())
                .filter(|n| (1..=max).contains(n))
                .ok_or_else(|| {
                    ToolError::Arguments(format!(
                        "\"{key}\" must be a whole number from 1 to {max}"
                    ))
                }),
        }
    }

    fn object(&self, key: &str) -> Option<Args<'_>> {
        self.0.get(key).filter(|v| v.is_object()).map(Args)
    }
}

/// A time range, resolved once so that every call of a tool reads the same one.
#[derive(Debug, Clone)]
pub struct Range {
    pub from_ms: i64,
    pub until_ms: i64,
    /// As the caller wrote them, for messages.
    pub from_text: String,
    pub until_text: String,
}

impl Range {
    fn read(args: &Args<'_>, default_from: &str) -> Result<Range, ToolError> {
        let now = kiln_model::time::now_nanos();
        let from_text = args
            .text("from")?
            .unwrap_or_else(|| default_from.to_string());
        let until_text = args.text("until")?.unwrap_or_else(|| "now".to_string());
        let from_ms = millis("from", &from_text, now)?;
        let until_ms = millis("until", &until_text, now)?;
        if until_ms <= from_ms {
            return Err(ToolError::Arguments(format!(
                "\"until\" ({until_text}) must be after \"from\" ({from_text})"
            )));
        }
        Ok(Range {
            from_ms,
            until_ms,
            from_text,
            until_text,
        })
    }

    fn span_ns(&self) -> f64 {
        (self.until_ms - self.from_ms) as f64 * 1e6
    }

    /// "in the last 1h" or "from X until Y", for messages.
    fn words(&self) -> String {
        match self.from_text.strip_prefix("now-") {
            Some(ago) if self.until_text == "now" => format!("in the last {ago}"),
            _ => format!("from {} until {}", self.from_text, self.until_text),
        }
    }

    /// RFC 3339 at second precision, for headers.
    fn header(&self) -> String {
        format!("{} to {}", rfc3339(self.from_ms), rfc3339(self.until_ms))
    }
}

/// RFC 3339 at whole seconds, as the headers of answers give times.
fn rfc3339(ms: i64) -> String {
    kiln_model::time::format_rfc3339(ms.div_euclid(1000) * 1_000_000_000)
}

fn millis(name: &str, text: &str, now_nanos: i64) -> Result<i64, ToolError> {
    kiln_model::time::parse_time_nanos(text, now_nanos)
        .map(|nanos| nanos.div_euclid(1_000_000))
        .map_err(|err| {
            ToolError::Arguments(format!(
                "\"{name}\" ({text}) is not a time: {err}; use now-1h, RFC 3339 or epoch milliseconds"
            ))
        })
}

/// Where a query tool looks: the selector, the profile type, the range.
#[derive(Debug, Clone)]
pub struct Target {
    pub service: Option<String>,
    /// The matchers besides the service's, without braces.
    pub extra: String,
    pub profile_type: String,
    pub range: Range,
}

impl Target {
    /// The whole selector, `{service_name="a", region="eu"}`.
    pub fn selector(&self) -> String {
        selector(self.service.as_deref(), &self.extra)
    }

    pub fn kind(&self) -> ProfileType<'_> {
        ProfileType::parse(&self.profile_type)
    }

    /// A one-line statement of what was read.
    pub fn header(&self) -> String {
        format!(
            "{} {} {}",
            self.kind().short(),
            self.selector(),
            self.range.header()
        )
    }

    /// The UI's explore view of the same selection, with more of its parameters.
    pub fn link(&self, api: &impl Api, extra: &[(&str, &str)]) -> String {
        let mut params: Vec<(&str, String)> = Vec::new();
        if let Some(service) = &self.service {
            params.push(("service", service.clone()));
        }
        if !self.profile_type.is_empty() {
            params.push(("type", self.profile_type.clone()));
        }
        if !self.extra.is_empty() {
            params.push(("labels", self.extra.clone()));
        }
        params.push(("from", self.range.from_ms.to_string()));
        params.push(("until", self.range.until_ms.to_string()));
        params.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
        link(api, "/", &params)
    }

    /// The querier's request body fields for this selection.
    fn query(&self) -> Map<String, Value> {
        let mut body = Map::new();
        body.insert("profileTypeID".into(), json!(self.profile_type));
        body.insert("labelSelector".into(), json!(self.selector()));
        body.insert("start".into(), json!(self.range.from_ms.to_string()));
        body.insert("end".into(), json!(self.range.until_ms.to_string()));
        body
    }
}

/// `{service_name="a", extra}`, with the service's name escaped.
pub fn selector(service: Option<&str>, extra: &str) -> String {
    let mut parts = Vec::new();
    if let Some(service) = service {
        parts.push(format!("service_name=\"{}\"", escape(service)));
    }
    if !extra.is_empty() {
        parts.push(extra.to_string());
    }
    format!("{{{}}}", parts.join(", "))
}

fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"")
}

/// A selector as a model may write it: with or without braces.
fn bare(selector: &str) -> String {
    let trimmed = selector.trim();
    trimmed
        .strip_prefix('{')
        .and_then(|inner| inner.strip_suffix('}'))
        .unwrap_or(trimmed)
        .trim()
        .to_string()
}

/// A link into the UI: `path` with these query parameters.
fn link(api: &impl Api, path: &str, params: &[(&str, String)]) -> String {
    let query: Vec<String> = params
        .iter()
        .map(|(key, value)| format!("{key}={}", api::encode(value)))
        .collect();
    format!(
        "{}{path}?{}",
        api.ui_base().trim_end_matches('/'),
        query.join("&")
    )
}

/// Where to look, with no profile type (the tools that list types and labels).
fn untyped(args: &Args<'_>) -> Result<Target, ToolError> {
    Ok(Target {
        service: args.str("service").map(str::to_string),
        extra: args.str("selector").map(bare).unwrap_or_default(),
        profile_type: String::new(),
        range: Range::read(args, "now-1h")?,
    })
}

/// The querier's `SelectSeries` of a target at `step_s` seconds, with each point's
/// individual profiles when `exemplars`.
async fn select_series(
    api: &impl Api,
    target: &Target,
    step_s: f64,
    exemplars: bool,
) -> Result<Value, ToolError> {
    let mut body = target.query();
    body.insert("step".into(), json!(step_s));
    if exemplars {
        body.insert("exemplarType".into(), json!("EXEMPLAR_TYPE_INDIVIDUAL"));
    }
    api::json(
        api,
        ApiRequest::post(
            "/querier.v1.QuerierService/SelectSeries",
            Value::Object(body),
        ),
    )
    .await
}

/// Writes functions as rows (`rank | name | self | self share | total | total share`),
/// at most `limit`, and one line for the rest; `span_ns` makes CPU time cores.
fn function_rows(
    answer: &mut crate::budget::Answer,
    functions: &[tree::Function],
    limit: usize,
    whole: f64,
    kind: &ProfileType<'_>,
    span_ns: Option<f64>,
) {
    use crate::units::{human, percent};
    answer.line("rank | function | self | self share | total | total share");
    let mut shown = 0;
    for (rank, function) in functions.iter().enumerate().take(limit) {
        let row = format!(
            "{} | {} | {} | {} | {} | {}",
            rank + 1,
            cell(&function.name),
            human(function.self_value as f64, kind, span_ns),
            percent(function.self_value as f64, whole),
            human(function.total as f64, kind, span_ns),
            percent(function.total as f64, whole)
        );
        if !answer.row(row) {
            break;
        }
        shown += 1;
    }
    if shown < functions.len() {
        let rest: i64 = functions[shown..].iter().map(|f| f.self_value).sum();
        answer.line(format!(
            "… {} more functions: {} of self ({}); ask with a larger limit",
            functions.len() - shown,
            percent(rest as f64, whole),
            human(rest as f64, kind, span_ns)
        ));
    }
}

/// Reads where to look, and the profile type: the one asked for, else the selection's
/// CPU type, else its first. Nothing there is an error that names what might have been
/// meant.
async fn target(api: &impl Api, args: &Args<'_>) -> Result<Target, ToolError> {
    let range = Range::read(args, "now-1h")?;
    let service = args.str("service").map(str::to_string);
    let extra = args.str("selector").map(bare).unwrap_or_default();
    let asked = args.str("profile_type").map(str::to_string);
    let mut target = Target {
        service,
        extra,
        profile_type: asked.clone().unwrap_or_default(),
        range,
    };
    let types = series_labels(api, &target, &["__profile_type__"]).await?;
    let mut present: Vec<String> = types
        .iter()
        .filter_map(|labels| labels.get("__profile_type__").cloned())
        .collect();
    present.sort();
    present.dedup();
    if present.is_empty() {
        return Err(nothing_there(api, &target).await);
    }
    target.profile_type = match asked {
        Some(asked) if present.contains(&asked) => asked,
        Some(asked) => {
            return Err(ToolError::Empty(format!(
                "no {asked} profiles for {} {}; it has {}",
                target.selector(),
                target.range.words(),
                present.join(", ")
            )))
        }
        None => present
            .iter()
            .find(|id| *id == CPU)
            .or_else(|| present.iter().find(|id| id.contains(":cpu:")))
            .unwrap_or(&present[0])
            .clone(),
    };
    Ok(target)
}

/// "no profiles for service 'chekout' in the last 1h; did you mean 'checkout'?"
async fn nothing_there(api: &impl Api, target: &Target) -> ToolError {
    let what = match &target.service {
        Some(service) if target.extra.is_empty() => format!("service '{service}'"),
        _ => target.selector(),
    };
    let mut message = format!("no profiles for {what} {}", target.range.words());
    if let Some(service) = &target.service {
        // Services of the last week, to find the one meant.
        let week = Target {
            service: None,
            extra: String::new(),
            profile_type: String::new(),
            range: Range {
                from_ms: target.range.until_ms - 7 * 86_400_000,
                until_ms: target.range.until_ms,
                from_text: String::new(),
                until_text: String::new(),
            },
        };
        if let Ok(sets) = series_labels(api, &week, &["service_name"]).await {
            let names: Vec<&str> = sets
                .iter()
                .filter_map(|labels| labels.get("service_name").map(String::as_str))
                .collect();
            match closest(service, &names) {
                Some(close) if close != service => {
                    message.push_str(&format!("; did you mean '{close}'?"));
                }
                Some(_) => message.push_str("; it has profiles in the last 7 days: widen \"from\""),
                None if names.is_empty() => {
                    message.push_str("; Kiln has no profiles in the last 7 days")
                }
                None => message.push_str("; list_services names the services there are"),
            }
        }
    }
    ToolError::Empty(message)
}

/// The name nearest to `wanted` by edit distance, if near enough to be a typo (or it
/// contains `wanted`).
fn closest<'a>(wanted: &str, names: &[&'a str]) -> Option<&'a str> {
    let wanted_lower = wanted.to_lowercase();
    names
        .iter()
        .map(|name| {
            let lower = name.to_lowercase();
            let distance = if lower.contains(&wanted_lower) && !wanted_lower.is_empty() {
                1
            } else {
                edit_distance(&wanted_lower, &lower)
            };
            (distance, *name)
        })
        .filter(|(distance, _)| *distance <= 2.max(wanted.chars().count() / 3))
        .min()
        .map(|(_, name)| name)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let current = row[j + 1];
            row[j + 1] = if ca == *cb {
                previous
            } else {
                1 + previous.min(row[j]).min(row[j + 1])
            };
            previous = current;
        }
    }
    row[b.len()]
}

type Labels = std::collections::BTreeMap<String, String>;

/// The querier's `Series`: the label sets of the selection's series, of these names (all
/// of them when empty).
async fn series_labels(
    api: &impl Api,
    target: &Target,
    names: &[&str],
) -> Result<Vec<Labels>, ToolError> {
    let answer = api::json(
        api,
        ApiRequest::post(
            "/querier.v1.QuerierService/Series",
            json!({
                "matchers": [target.selector()],
                "labelNames": names,
                "start": target.range.from_ms.to_string(),
                "end": target.range.until_ms.to_string(),
            }),
        ),
    )
    .await?;
    Ok(answer["labelsSet"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|set| {
            set["labels"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .filter_map(|pair| {
                    Some((
                        pair["name"].as_str()?.to_string(),
                        pair["value"].as_str()?.to_string(),
                    ))
                })
                .collect()
        })
        .collect())
}

/// An integer the querier's JSON writes as a string (proto3's int64) or a number.
fn int(value: &Value) -> i64 {
    match value {
        Value::String(text) => text.parse().unwrap_or(0),
        Value::Number(n) => n
            .as_i64()
            .unwrap_or_else(|| n.as_f64().unwrap_or(0.0) as i64),
        _ => 0,
    }
}

fn float(value: &Value) -> f64 {
    match value {
        Value::String(text) => text.parse().unwrap_or(0.0),
        Value::Number(n) => n.as_f64().unwrap_or(0.0),
        _ => 0.0,
    }
}

/// A cell of a `|`-separated table: its own separators and line breaks replaced.
fn cell(text: &str) -> String {
    text.replace('|', "¦").replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_find_the_service_meant() {
        let names = ["checkout", "cart", "payments"];
        assert_eq!(closest("chekout", &names), Some("checkout"));
        assert_eq!(closest("payment", &names), Some("payments"));
        assert_eq!(closest("zzzzzz", &names), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn selectors_are_read_with_or_without_braces() {
        assert_eq!(bare(r#"{region="eu"}"#), r#"region="eu""#);
        assert_eq!(bare(r#" region="eu" "#), r#"region="eu""#);
        assert_eq!(selector(Some("a\"b"), ""), r#"{service_name="a\"b"}"#);
        assert_eq!(selector(None, r#"x="1""#), r#"{x="1"}"#);
    }
}
