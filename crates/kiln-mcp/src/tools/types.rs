//! `list_profile_types`: the profile types held for a selection, with the series of each
//! (the querier's `Series`).

use std::collections::BTreeMap;

use serde_json::Value;

use super::{series_labels, tool, Args};
use crate::api::{Api, ToolError};
use crate::budget::{Answer, DEFAULT_TOKENS};
use crate::units::ProfileType;

pub fn definition() -> Value {
    let mut properties = super::where_properties();
    properties.retain(|(key, _)| *key != "profile_type");
    tool(
        "list_profile_types",
        "List profile types",
        "The profile types Kiln holds (CPU, memory, off-CPU, ...), for one service or all, with the number of series of each. Other tools take the id as profile_type.",
        properties,
        &[],
    )
}

pub async fn run(api: &impl Api, args: &Args<'_>) -> Result<String, ToolError> {
    let target = super::untyped(args)?;
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for labels in series_labels(api, &target, &["__profile_type__", "service_name"]).await? {
        if let Some(kind) = labels.get("__profile_type__") {
            *counts.entry(kind.clone()).or_default() += 1;
        }
    }
    if counts.is_empty() {
        return Err(super::nothing_there(api, &target).await);
    }
    let mut answer = Answer::new(DEFAULT_TOKENS);
    answer.line(format!(
        "{} profile types for {} {}",
        counts.len(),
        target.selector(),
        target.range.header()
    ));
    answer.line("id | short name | unit | services");
    let total = counts.len();
    let mut shown = 0;
    for (id, services) in &counts {
        let kind = ProfileType::parse(id);
        if !answer.row(format!(
            "{id} | {} | {} | {services}",
            kind.short(),
            kind.unit
        )) {
            break;
        }
        shown += 1;
    }
    if shown < total {
        answer.line(format!(
            "… {} more types: narrow with service or selector",
            total - shown
        ));
    }
    answer.line(format!("ui: {}", target.link(api, &[])));
    Ok(answer.finish())
}
