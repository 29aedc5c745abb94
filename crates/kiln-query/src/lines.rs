//! Source lines of one function: self and total per (file, line) over a selection, for a
//! function's detail view.
//!
//! A sample's self value belongs to the line of its innermost frame. Its total value
//! belongs to every line of the function on its stack, each counted once however often
//! the function recurses there, as the flame graph's top table counts a function once
//! per stack. Lines come from the profiles (pprof `Line.line`, per inlined frame), so a
//! profile without line numbers yields line 0 only: the caller says so rather than
//! guessing.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::request::{json_selection, Time};
use crate::select::{DatasetSelection, Querier, SelectRequest};
use crate::symbols::FrameNames;
use crate::QueryError;

/// `POST /api/v1/lines`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LinesRequest {
    pub profile_type: String,
    #[serde(default)]
    pub selector: String,
    pub from: Time,
    pub until: Time,
    pub function: String,
}

impl LinesRequest {
    pub fn select(&self, tenant: &str, now: i64) -> Result<SelectRequest, QueryError> {
        json_selection(
            tenant,
            &self.profile_type,
            &self.selector,
            &self.from,
            &self.until,
            now,
        )
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FunctionLines {
    pub function: String,
    pub profile_type: String,
    /// The selection's total, for shares.
    pub total: i64,
    /// The function's own self and total (its total counted once per stack).
    pub self_value: i64,
    pub total_value: i64,
    /// Per (file, line), in file then line order.
    pub lines: Vec<LineValues>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct LineValues {
    pub file: String,
    pub line: i64,
    pub self_value: i64,
    pub total_value: i64,
}

/// Self and total per line of `function` over `request`'s one profile type.
pub async fn function_lines(
    querier: &Querier,
    request: &SelectRequest,
    function: &str,
) -> Result<FunctionLines, QueryError> {
    let type_id = crate::merge::exact_type(request)?.to_string();
    if function.is_empty() {
        return Err(QueryError::BadRequest("function is required".to_string()));
    }
    let mut lines: BTreeMap<(String, i64), (i64, i64)> = BTreeMap::new();
    let (mut total, mut self_value, mut total_value) = (0i64, 0i64, 0i64);
    let request = SelectRequest {
        values_only: true,
        ..request.clone()
    };
    querier
        .select_each(&request, |selection| {
            let Some(local_type) = selection.local_type(&type_id) else {
                return;
            };
            let sums = dataset_lines(&selection, local_type, function);
            total = total.saturating_add(sums.total);
            self_value = self_value.saturating_add(sums.self_value);
            total_value = total_value.saturating_add(sums.total_value);
            for (key, (line_self, line_total)) in sums.lines {
                let slot = lines.entry(key).or_default();
                slot.0 = slot.0.saturating_add(line_self);
                slot.1 = slot.1.saturating_add(line_total);
            }
        })
        .await?;
    Ok(FunctionLines {
        function: function.to_string(),
        profile_type: type_id,
        total,
        self_value,
        total_value,
        lines: lines
            .into_iter()
            .map(|((file, line), (self_value, total_value))| LineValues {
                file,
                line,
                self_value,
                total_value,
            })
            .collect(),
    })
}

struct DatasetLines {
    total: i64,
    self_value: i64,
    total_value: i64,
    lines: BTreeMap<(String, i64), (i64, i64)>,
}

/// One dataset's share: each stack with a value is walked to the root once.
fn dataset_lines(selection: &DatasetSelection, local_type: usize, function: &str) -> DatasetLines {
    let dataset = &selection.dataset;
    let names = FrameNames::new(dataset);
    // The function's frames of each location, innermost last: (file string, line). Only
    // locations on a stack with a value are looked at, each once.
    let mut frames_of: Vec<Option<Vec<(String, i64)>>> =
        vec![None; dataset.location_line_count.len()];
    let mut leaf_is_function: Vec<Option<bool>> = vec![None; dataset.location_line_count.len()];
    let mut sums = DatasetLines {
        total: 0,
        self_value: 0,
        total_value: 0,
        lines: BTreeMap::new(),
    };
    let mut on_stack: Vec<(String, i64)> = Vec::new();
    for (stack, value) in selection.values[local_type].iter().enumerate() {
        if *value == 0 || stack == 0 {
            continue;
        }
        sums.total = sums.total.saturating_add(*value);
        on_stack.clear();
        let mut node = stack;
        let mut innermost = true;
        // Stack node 0 is the root sentinel; parents precede children, so this ends.
        while node != 0 {
            let Some(location) = dataset.stack_location.get(node).copied() else {
                break;
            };
            let slot = location as usize;
            if slot >= frames_of.len() {
                break;
            }
            if frames_of[slot].is_none() {
                let mut frames = Vec::new();
                let mut last_is_function = false;
                names.for_each_line(location, |name, file, line| {
                    last_is_function = name == function;
                    if last_is_function {
                        frames.push((file.to_string(), line));
                    }
                });
                leaf_is_function[slot] = Some(last_is_function);
                frames_of[slot] = Some(frames);
            }
            let frames = frames_of[slot].as_deref().unwrap_or_default();
            if innermost && leaf_is_function[slot] == Some(true) {
                if let Some(key) = frames.last() {
                    let entry = sums.lines.entry(key.clone()).or_default();
                    entry.0 = entry.0.saturating_add(*value);
                    sums.self_value = sums.self_value.saturating_add(*value);
                }
            }
            innermost = false;
            for key in frames {
                if !on_stack.contains(key) {
                    on_stack.push(key.clone());
                }
            }
            node = dataset.stack_parent.get(node).copied().unwrap_or(0) as usize;
        }
        if !on_stack.is_empty() {
            sums.total_value = sums.total_value.saturating_add(*value);
        }
        for key in &on_stack {
            let entry = sums.lines.entry(key.clone()).or_default();
            entry.1 = entry.1.saturating_add(*value);
        }
    }
    sums
}
