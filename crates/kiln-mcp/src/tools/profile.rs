//! `get_profile`: one profile (an exemplar: the largest in the range, or the one named),
//! summarised: when, its labels, its value and its top functions, with a link to open it.

use serde_json::Value;

use super::tree::merged;
use super::{float, int, target, tool, Args};
use crate::api::{Api, ToolError};
use crate::budget::{Answer, DEFAULT_TOKENS};
use crate::units::human;

/// Functions shown in a profile's summary.
const TOP: usize = 10;

pub fn definition() -> Value {
    let mut properties = super::where_properties();
    properties.push((
        "profile_id",
        super::string(
            "A profile's id (from an earlier answer); by default the largest profile in the range",
        ),
    ));
    tool(
        "get_profile",
        "One profile",
        "One individual profile of a service: by default the largest in the range (an exemplar of the worst moment), or the one named by profile_id. Its time, labels (pod, version, ...), value and top functions, with a link that opens exactly that profile in Kiln's UI.",
        properties,
        &[],
    )
}

pub async fn run(api: &impl Api, args: &Args<'_>) -> Result<String, ToolError> {
    let target = target(api, args).await?;
    let wanted = args.str("profile_id").map(str::to_string);
    let span_s = ((target.range.until_ms - target.range.from_ms) as f64 / 1000.0).max(1.0);
    let answer_json = super::select_series(api, &target, span_s, true).await?;
    let exemplars: Vec<&Value> = answer_json["series"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .flat_map(|s| {
            s["points"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
        })
        .flat_map(|p| {
            p["exemplars"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
        })
        .collect();
    let chosen = match &wanted {
        Some(id) => exemplars
            .iter()
            .find(|e| e["profileId"].as_str() == Some(id.as_str()))
            .copied(),
        None => exemplars
            .iter()
            .max_by(|a, b| float(&a["value"]).total_cmp(&float(&b["value"])))
            .copied(),
    };
    let id = match (&wanted, chosen) {
        (_, Some(exemplar)) => exemplar["profileId"].as_str().unwrap_or("").to_string(),
        (Some(id), None) => id.clone(),
        (None, None) => {
            return Err(ToolError::Empty(format!(
                "no individual profile of {} {}",
                target.selector(),
                target.range.words()
            )))
        }
    };
    let tree = merged(api, &target, std::slice::from_ref(&id)).await?;
    if tree.total() == 0 {
        return Err(ToolError::Empty(format!(
            "no profile {id:?} in {}; get_profile without profile_id picks the largest",
            target.header()
        )));
    }
    let kind = target.kind();
    let whole = tree.total() as f64;
    let mut answer = Answer::new(DEFAULT_TOKENS);
    answer.line(format!("profile {id} of {}", target.header()));
    if let Some(exemplar) = chosen {
        let labels: Vec<String> = exemplar["labels"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(|l| Some(format!("{}={}", l["name"].as_str()?, l["value"].as_str()?)))
            .collect();
        answer.line(format!(
            "at {}, of {} profiles in the range; labels: {}",
            super::rfc3339(int(&exemplar["timestamp"])),
            exemplars.len(),
            labels.join(", ")
        ));
    }
    answer.line(format!("value {}", human(whole, &kind, None)));
    super::function_rows(&mut answer, &tree.functions(), TOP, whole, &kind, None);
    answer.line(format!("ui: {}", target.link(api, &[("profile", &id)])));
    Ok(answer.finish())
}
