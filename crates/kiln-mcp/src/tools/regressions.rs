//! `list_regressions`: what the regression watcher found after each deploy, per service
//! and version, newest first (`GET /api/v1/regressions`).

use serde_json::Value;

use super::{cell, float, int, link, tool, Args};
use crate::api::{self, encode, Api, ApiRequest, ToolError};
use crate::budget::{tokens_for, Answer};
use crate::units::{percent, ProfileType};

const DEFAULT_LIMIT: usize = 20;

pub fn definition() -> Value {
    tool(
        "list_regressions",
        "List regressions",
        "Significant changes the regression watcher found when a service's new version was deployed: per service and version, the function, its share before and after, the change and the confidence, newest first. Increases are regressions.",
        vec![
            ("service", super::string("Only this service's findings")),
            ("since", super::string("Findings detected since: now-7d (the default), RFC 3339, epoch ms")),
            ("change", serde_json::json!({ "type": "string", "enum": ["increase", "decrease", "any"], "description": "increase (regressions, the default), decrease, or any" })),
            ("limit", super::integer("Findings listed (default 20); the rest are counted in one line", 1, 1000)),
        ],
        &[],
    )
}

pub async fn run(api: &impl Api, args: &Args<'_>) -> Result<String, ToolError> {
    let limit = args.count("limit", DEFAULT_LIMIT, 1000)?;
    let since = args.text("since")?.unwrap_or_else(|| "now-7d".into());
    let service = args.str("service");
    let change = match args.str("change").unwrap_or("increase") {
        "any" => None,
        change @ ("increase" | "decrease") => Some(change),
        other => {
            return Err(ToolError::Arguments(format!(
                "\"change\" is increase, decrease or any, not {other:?}"
            )))
        }
    };
    let mut path = format!("/api/v1/regressions?since={}", encode(&since));
    if let Some(service) = service {
        path.push_str(&format!("&service={}", encode(service)));
    }
    let answer_json = api::json(api, ApiRequest::get(path)).await?;
    let findings: Vec<&Value> = answer_json["regressions"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter(|f| change.is_none_or(|change| f["change"].as_str() == Some(change)))
        .collect();
    let mut answer = Answer::new(tokens_for(limit, DEFAULT_LIMIT));
    answer.line(format!(
        "{} {} since {since}{}",
        findings.len(),
        match change {
            Some("increase") => "regressions (increases)",
            Some(_) => "decreases",
            None => "findings",
        },
        service.map(|s| format!(" for {s}")).unwrap_or_default()
    ));
    if findings.is_empty() {
        answer.line("the watcher compares each new version with the one before once it has run for a window; none was found significant");
    } else {
        answer.line("detected | service | type | versions | function | before | after | change (pp) | confidence");
    }
    let mut shown = 0;
    for finding in &findings {
        if shown == limit {
            break;
        }
        let kind = finding["profile_type"].as_str().unwrap_or("");
        let row = format!(
            "{} | {} | {} | {}: {} → {} | {} | {} | {} | {:+.2} | {:.4} %",
            super::rfc3339(int(&finding["detected_at"])),
            cell(finding["service"].as_str().unwrap_or("")),
            ProfileType::parse(kind).short(),
            cell(finding["version_label"].as_str().unwrap_or("")),
            cell(finding["old_version"].as_str().unwrap_or("")),
            cell(finding["new_version"].as_str().unwrap_or("")),
            cell(finding["function"].as_str().unwrap_or("")),
            percent(float(&finding["left_share"]), 1.0),
            percent(float(&finding["right_share"]), 1.0),
            100.0 * float(&finding["delta_share"]),
            100.0 * float(&finding["confidence"])
        );
        if !answer.row(row) {
            break;
        }
        shown += 1;
    }
    if shown < findings.len() {
        answer.line(format!(
            "… {} more findings: ask with a larger limit or one service",
            findings.len() - shown
        ));
    }
    let mut params = vec![("since", since.clone())];
    if let Some(service) = service {
        params.push(("service", service.to_string()));
    }
    answer.line(format!("ui: {}", link(api, "/regressions", &params)));
    Ok(answer.finish())
}
