//! `source_lines`: the hot lines of one function, with their source text where the server
//! knows where the code is (`POST /api/v1/lines`).

use std::collections::HashMap;

use serde_json::{json, Value};

use super::{cell, int, target, tool, Args};
use crate::api::{self, Api, ApiRequest, ToolError};
use crate::budget::{tokens_for, Answer};
use crate::units::{human, percent};

const DEFAULT_LIMIT: usize = 15;
/// Longest source line written.
const MAX_SOURCE: usize = 140;

pub fn definition() -> Value {
    let mut properties = super::where_properties();
    properties.insert(
        0,
        (
            "function",
            super::string("The function's name exactly as top_functions or flame_graph shows it"),
        ),
    );
    properties.push((
        "limit",
        super::integer(
            "Lines listed, hottest first (default 15); the rest are summed in one line",
            1,
            1000,
        ),
    ));
    tool(
        "source_lines",
        "Hot source lines of a function",
        "Where inside one function the time goes: its self and total value per source line (file:line), hottest first, with the line's source text when the Kiln server is configured with the source code.",
        properties,
        &["function"],
    )
}

pub async fn run(api: &impl Api, args: &Args<'_>) -> Result<String, ToolError> {
    let function = args.required("function")?;
    let limit = args.count("limit", DEFAULT_LIMIT, 1000)?;
    let target = target(api, args).await?;
    let request = json!({
        "profile_type": target.profile_type,
        "selector": target.selector(),
        "from": target.range.from_ms,
        "until": target.range.until_ms,
        "function": function,
    });
    let lines_json = api::json(api, ApiRequest::post("/api/v1/lines", request)).await?;
    let whole = int(&lines_json["total"]) as f64;
    let own_total = int(&lines_json["total_value"]);
    if own_total == 0 {
        return Err(ToolError::Empty(format!(
            "{function:?} has no samples in {}; top_functions names the functions there are, exactly as to pass them",
            target.header()
        )));
    }
    let kind = target.kind();
    let span = Some(target.range.span_ns());
    // Source text by (file, line), where the server sent it.
    let mut texts: HashMap<(String, i64), String> = HashMap::new();
    for source in lines_json["sources"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let file = source["file"].as_str().unwrap_or("").to_string();
        for (at, text) in source["lines"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            texts.insert(
                (file.clone(), at as i64 + 1),
                text.as_str().unwrap_or("").to_string(),
            );
        }
    }
    let mut lines: Vec<&Value> = lines_json["lines"]
        .as_array()
        .map(|l| l.iter().collect())
        .unwrap_or_default();
    lines.sort_by(|a, b| {
        int(&b["self_value"])
            .cmp(&int(&a["self_value"]))
            .then(int(&b["total_value"]).cmp(&int(&a["total_value"])))
    });
    let mut answer = Answer::new(tokens_for(limit, DEFAULT_LIMIT));
    answer.line(format!(
        "{function} in {}: self {} ({}), total {} ({}), on {} lines",
        target.header(),
        human(int(&lines_json["self_value"]) as f64, &kind, span),
        percent(int(&lines_json["self_value"]) as f64, whole),
        human(own_total as f64, &kind, span),
        percent(own_total as f64, whole),
        lines.len()
    ));
    if lines_json["source_configured"].as_bool() != Some(true) {
        answer.line("(no source text: the server has no source.root or source.url_template)");
    }
    answer.line("file:line | self | self share | total share | source");
    let mut shown = 0;
    for line in &lines {
        if shown == limit {
            break;
        }
        let file = line["file"].as_str().unwrap_or("");
        let number = int(&line["line"]);
        let text = texts
            .get(&(file.to_string(), number))
            .map(|t| t.trim().chars().take(MAX_SOURCE).collect::<String>())
            .unwrap_or_default();
        let at = if file.is_empty() && number == 0 {
            "(no line information)".to_string()
        } else {
            format!("{}:{number}", cell(file))
        };
        let row = format!(
            "{at} | {} | {} | {} | {}",
            human(int(&line["self_value"]) as f64, &kind, span),
            percent(int(&line["self_value"]) as f64, whole),
            percent(int(&line["total_value"]) as f64, whole),
            cell(&text)
        );
        if !answer.row(row) {
            break;
        }
        shown += 1;
    }
    if shown < lines.len() {
        let rest: i64 = lines[shown..].iter().map(|l| int(&l["self_value"])).sum();
        answer.line(format!(
            "… {} more lines: {} of self; ask with a larger limit",
            lines.len() - shown,
            percent(rest as f64, whole)
        ));
    }
    answer.line(format!(
        "ui: {}",
        target.link(api, &[("view", "sandwich"), ("fn", &function)])
    ));
    Ok(answer.finish())
}
