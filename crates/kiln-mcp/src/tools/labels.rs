//! `list_labels`: label names with how many series carry each and how many values they
//! take, or one name's values with their series (the querier's `Series`).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::{cell, series_labels, tool, Args};
use crate::api::{Api, ToolError};
use crate::budget::{tokens_for, Answer};
use crate::units::percent;

const DEFAULT_LIMIT: usize = 40;

pub fn definition() -> Value {
    let mut properties = super::where_properties();
    properties.retain(|(key, _)| *key != "profile_type");
    properties.push((
        "name",
        super::string("A label name: list its values instead of the names"),
    ));
    properties.push((
        "limit",
        super::integer(
            "Names or values listed at most (default 40); the rest are summed in one line",
            1,
            1000,
        ),
    ));
    tool(
        "list_labels",
        "List labels",
        "Label names of the profiles' series, with how many series carry each and how many distinct values it takes; or, with name, that label's values with their series counts, most first. Use the names and values in selector arguments.",
        properties,
        &[],
    )
}

pub async fn run(api: &impl Api, args: &Args<'_>) -> Result<String, ToolError> {
    let target = super::untyped(args)?;
    let limit = args.count("limit", DEFAULT_LIMIT, 1000)?;
    let name = args.str("name");
    let sets = series_labels(api, &target, &[]).await?;
    if sets.is_empty() {
        return Err(super::nothing_there(api, &target).await);
    }
    let series = sets.len();
    let mut answer = Answer::new(tokens_for(limit, DEFAULT_LIMIT));
    let rows: Vec<(String, usize, String)> = match name {
        None => {
            let mut names: BTreeMap<&str, (usize, BTreeSet<&str>)> = BTreeMap::new();
            for labels in &sets {
                for (key, value) in labels.iter().filter(|(key, _)| !key.starts_with("__")) {
                    let entry = names.entry(key).or_default();
                    entry.0 += 1;
                    entry.1.insert(value);
                }
            }
            answer.line(format!(
                "{} label names on {series} series of {} {}",
                names.len(),
                target.selector(),
                target.range.header()
            ));
            answer.line("name | series | values");
            let mut rows: Vec<_> = names
                .into_iter()
                .map(|(key, (count, values))| (key.to_string(), count, values.len().to_string()))
                .collect();
            rows.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            rows
        }
        Some(name) => {
            let mut values: BTreeMap<&str, usize> = BTreeMap::new();
            for labels in &sets {
                if let Some(value) = labels.get(name) {
                    *values.entry(value).or_default() += 1;
                }
            }
            if values.is_empty() {
                return Err(ToolError::Empty(format!(
                    "no series of {} {} has the label {name:?}; list_labels without name lists those there are",
                    target.selector(),
                    target.range.words()
                )));
            }
            answer.line(format!(
                "{} values of {name} on {series} series of {} {}",
                values.len(),
                target.selector(),
                target.range.header()
            ));
            answer.line("value | series | share of series");
            let mut rows: Vec<_> = values
                .into_iter()
                .map(|(value, count)| {
                    (
                        value.to_string(),
                        count,
                        percent(count as f64, series as f64),
                    )
                })
                .collect();
            rows.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            rows
        }
    };
    let mut shown = 0;
    for (key, count, more) in &rows {
        if shown == limit || !answer.row(format!("{} | {count} | {more}", cell(key))) {
            break;
        }
        shown += 1;
    }
    if shown < rows.len() {
        let rest: usize = rows[shown..].iter().map(|(_, count, _)| count).sum();
        answer.line(format!(
            "… {} more, on {rest} series in all: ask with a larger limit",
            rows.len() - shown
        ));
    }
    answer.line(format!("ui: {}", target.link(api, &[])));
    Ok(answer.finish())
}
