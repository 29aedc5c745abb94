//! `top_functions`: the functions with the most self or total value in a selection's
//! merged profile (the querier's `SelectMergeStacktraces`, whole).

use serde_json::{json, Value};

use super::tree::merged;
use super::{target, tool, Args};
use crate::api::{Api, ToolError};
use crate::budget::{tokens_for, Answer};
use crate::units::human;

const DEFAULT_LIMIT: usize = 20;

pub fn definition() -> Value {
    let mut properties = super::where_properties();
    properties.push((
        "by",
        json!({ "type": "string", "enum": ["self", "total"], "description": "Rank by self (time in the function itself, the default) or total (with its callees)" }),
    ));
    properties.push((
        "limit",
        super::integer(
            "Functions listed (default 20); the rest are summed in one line",
            1,
            2000,
        ),
    ));
    tool(
        "top_functions",
        "Top functions",
        "The functions using most of a profile type (CPU by default) in a service or selection over a time range: each with its self and total value, as a share of the whole and in its unit (cores, bytes). Self is the function's own time; total includes what it calls.",
        properties,
        &[],
    )
}

pub async fn run(api: &impl Api, args: &Args<'_>) -> Result<String, ToolError> {
    let by_total = match args.str("by") {
        None | Some("self") => false,
        Some("total") => true,
        Some(other) => {
            return Err(ToolError::Arguments(format!(
                "\"by\" is self or total, not {other:?}"
            )))
        }
    };
    let limit = args.count("limit", DEFAULT_LIMIT, 2000)?;
    let target = target(api, args).await?;
    let tree = merged(api, &target, &[]).await?;
    let mut functions = tree.functions();
    if by_total {
        functions.sort_by(|a, b| b.total.cmp(&a.total).then_with(|| a.name.cmp(&b.name)));
    }
    let whole = tree.total() as f64;
    let kind = target.kind();
    let span = Some(target.range.span_ns());
    let mut answer = Answer::new(tokens_for(limit, DEFAULT_LIMIT));
    answer.line(format!(
        "top functions by {} of {}: total {}, {} functions",
        if by_total { "total" } else { "self" },
        target.header(),
        human(whole, &kind, span),
        functions.len()
    ));
    super::function_rows(&mut answer, &functions, limit, whole, &kind, span);
    answer.line(format!("ui: {}", target.link(api, &[("view", "table")])));
    Ok(answer.finish())
}
