//! `list_services`: every service, its profile types, and its main type's value in the
//! range against the period before, biggest change first (`GET /api/v1/overview`).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::{cell, float, int, link, series_labels, tool, Args, Range, Target};
use crate::api::{self, encode, Api, ApiRequest, ToolError};
use crate::budget::{tokens_for, Answer};
use crate::units::{human, percent, ProfileType};

const DEFAULT_LIMIT: usize = 30;

pub fn definition() -> Value {
    tool(
        "list_services",
        "List services",
        "The services Kiln profiles, each with its profile types and its main type's value (CPU as cores where it has CPU) in the range and in the period of the same length before it, biggest change first. Start here.",
        vec![
            ("from", super::string("Start: now-1h (the default), RFC 3339, or epoch milliseconds")),
            ("until", super::string("End; default now")),
            ("selector", super::string("Only services whose series match these label matchers, e.g. {namespace=\"shop\"}")),
            ("limit", super::integer("Services listed at most (default 30); the rest are summed in one line", 1, 1000)),
        ],
        &[],
    )
}

pub async fn run(api: &impl Api, args: &Args<'_>) -> Result<String, ToolError> {
    let range = Range::read(args, "now-1h")?;
    let limit = args.count("limit", DEFAULT_LIMIT, 1000)?;
    let extra = args.str("selector").map(super::bare).unwrap_or_default();
    let mut path = format!(
        "/api/v1/overview?from={}&until={}&points=1",
        range.from_ms, range.until_ms
    );
    if !extra.is_empty() {
        path.push_str(&format!("&selector={}", encode(&format!("{{{extra}}}"))));
    }
    let overview = api::json(api, ApiRequest::get(path)).await?;
    let mut services = overview["services"].as_array().cloned().unwrap_or_default();
    // The API's order (largest relative change first, new services before all), with the
    // services of equal change (new ones, unchanged ones) by their value.
    let rank = |s: &Value| {
        s.get("change")
            .and_then(Value::as_f64)
            .map_or(f64::INFINITY, f64::abs)
    };
    services.sort_by(|a, b| {
        rank(b)
            .total_cmp(&rank(a))
            .then_with(|| int(&b["total"]).cmp(&int(&a["total"])))
    });
    let all = Target {
        service: None,
        extra: extra.clone(),
        profile_type: String::new(),
        range: range.clone(),
    };
    let mut types: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for labels in series_labels(api, &all, &["service_name", "__profile_type__"]).await? {
        if let (Some(service), Some(kind)) =
            (labels.get("service_name"), labels.get("__profile_type__"))
        {
            types
                .entry(service.clone())
                .or_default()
                .insert(ProfileType::parse(kind).short().to_string());
        }
    }
    let span_ns = range.span_ns();
    let mut answer = Answer::new(tokens_for(limit, DEFAULT_LIMIT));
    answer.line(format!(
        "{} services {}, against the same length before",
        services.len(),
        range.header()
    ));
    if services.is_empty() {
        answer.line(format!("no profiles {}", range.words()));
    } else {
        answer.line("service | main type | now | before | change | profiles | types");
    }
    let mut shown = 0;
    for service in &services {
        if shown == limit {
            break;
        }
        let name = service["service"].as_str().unwrap_or("");
        let kind_id = service["profile_type"].as_str().unwrap_or("");
        let kind = ProfileType::parse(kind_id);
        let total = int(&service["total"]) as f64;
        let previous = int(&service["previous"]) as f64;
        let change = match service.get("change").filter(|c| !c.is_null()) {
            Some(change) => format!("{:+.1} %", 100.0 * float(change)),
            None => "new".to_string(),
        };
        let kinds: Vec<&str> = types
            .get(name)
            .map(|set| set.iter().map(String::as_str).collect())
            .unwrap_or_default();
        let row = format!(
            "{} | {} | {} | {} | {} | {} | {}",
            cell(name),
            kind.short(),
            human(total, &kind, Some(span_ns)),
            human(previous, &kind, Some(span_ns)),
            change,
            int(&service["profiles"]),
            kinds.join(", ")
        );
        if !answer.row(row) {
            break;
        }
        shown += 1;
    }
    if shown < services.len() {
        let rest = &services[shown..];
        let profiles: i64 = rest.iter().map(|s| int(&s["profiles"])).sum();
        answer.line(format!(
            "… {} more services ({} profiles; {} of all profiles): ask with a larger limit or a selector",
            rest.len(),
            profiles,
            percent(
                profiles as f64,
                services.iter().map(|s| int(&s["profiles"])).sum::<i64>() as f64
            )
        ));
    }
    answer.line(format!(
        "ui: {}",
        link(
            api,
            "/",
            &[
                ("from", range.from_ms.to_string()),
                ("until", range.until_ms.to_string()),
            ]
        )
    ));
    Ok(answer.finish())
}
