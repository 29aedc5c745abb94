//! `compare`: two selections (time ranges, versions, labels) function by function, ranked
//! with p-values, by `POST /api/v1/compare`, the same engine as the UI's comparison.

use serde_json::{json, Value};

use super::{cell, float, int, target, tool, Args, Range, Target};
use crate::api::{self, Api, ApiRequest, ToolError};
use crate::budget::{tokens_for, Answer};
use crate::units::{human, percent};

const DEFAULT_LIMIT: usize = 15;

fn side_schema(which: &str) -> Value {
    json!({
        "type": "object",
        "description": format!("The {which} side: its own label matchers and time range"),
        "properties": {
            "selector": { "type": "string", "description": "Matchers of this side only, e.g. {version=\"1.4.0\"}" },
            "from": { "type": "string", "description": "Start, e.g. now-2h" },
            "until": { "type": "string", "description": "End, e.g. now-1h" },
        },
        "additionalProperties": false,
    })
}

pub fn definition() -> Value {
    let mut properties = super::where_properties();
    properties.retain(|(key, _)| *key != "from" && *key != "until");
    properties.push(("left", side_schema("left (before)")));
    properties.push(("right", side_schema("right (after)")));
    properties.push((
        "limit",
        super::integer(
            "Functions listed (default 15); the rest are summed in one line",
            1,
            1000,
        ),
    ));
    tool(
        "compare",
        "Compare two selections",
        "What changed between two selections of the same service: two time ranges, two versions (left.selector {version=\"1.0\"}, right.selector {version=\"1.1\"}) or two label sets. Each function's share of the whole on each side, the change in percentage points, and a p-value from Welch's t-test on per-profile shares with Holm's correction: only changes marked significant are real. By default right is the last hour and left the hour before. Refuses to test when a side has too few profiles, and says so.",
        properties,
        &[],
    )
}

struct Side {
    selector: String,
    range: Range,
}

fn side(args: &Args<'_>, key: &str, base: &Target, default: Range) -> Result<Side, ToolError> {
    let (selector, range) = match args.object(key) {
        None => (String::new(), default),
        Some(side) => {
            let range = match (side.str("from"), side.str("until")) {
                (None, None) => default,
                _ => Range::read(&side, &default.from_text)
                    .map_err(|err| ToolError::Arguments(format!("{key}: {err}")))?,
            };
            (
                side.str("selector").map(super::bare).unwrap_or_default(),
                range,
            )
        }
    };
    let extra = [base.extra.as_str(), selector.as_str()]
        .into_iter()
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join(", ");
    Ok(Side {
        selector: super::selector(base.service.as_deref(), &extra),
        range,
    })
}

pub async fn run(api: &impl Api, args: &Args<'_>) -> Result<String, ToolError> {
    let limit = args.count("limit", DEFAULT_LIMIT, 1000)?;
    let now = kiln_model::time::now_ms();
    let right_default = Range {
        from_ms: now - 3_600_000,
        until_ms: now,
        from_text: "now-1h".into(),
        until_text: "now".into(),
    };
    // The type: what the service has over both sides' ranges (the right one, widened).
    let probe = json!({
        "service": args.str("service"),
        "selector": args.str("selector"),
        "profile_type": args.str("profile_type"),
        "from": (now - 7 * 86_400_000).to_string(),
        "until": now.to_string(),
    });
    let base = target(api, &Args(&probe)).await?;
    let right = side(args, "right", &base, right_default)?;
    let span = right.range.until_ms - right.range.from_ms;
    let left_default = Range {
        from_ms: right.range.from_ms - span,
        until_ms: right.range.from_ms,
        from_text: (right.range.from_ms - span).to_string(),
        until_text: right.range.from_ms.to_string(),
    };
    let left = side(args, "left", &base, left_default)?;
    let request = json!({
        "profile_type": base.profile_type,
        "left": { "selector": left.selector, "from": left.range.from_ms, "until": left.range.until_ms },
        "right": { "selector": right.selector, "from": right.range.from_ms, "until": right.range.until_ms },
        "limit": 0,
    });
    let answer_json = api::json(api, ApiRequest::post("/api/v1/compare", request)).await?;
    let kind = base.kind();
    let describe = |which: &str, side: &Value| {
        format!(
            "{which} {} {}–{}: {} profiles, {}",
            side["selector"].as_str().unwrap_or(""),
            super::rfc3339(int(&side["from"])),
            super::rfc3339(int(&side["until"])),
            int(&side["profiles"]),
            human(
                int(&side["total"]) as f64,
                &kind,
                Some((int(&side["until"]) - int(&side["from"])) as f64 * 1e6)
            )
        )
    };
    let functions = answer_json["functions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut answer = Answer::new(tokens_for(limit, DEFAULT_LIMIT));
    answer.line(format!("compare {} of {}", kind.short(), base.selector()));
    answer.line(describe("left", &answer_json["left"]));
    answer.line(describe("right", &answer_json["right"]));
    let method = &answer_json["method"];
    match answer_json["refused"].as_str() {
        Some(refused) => answer.line(format!(
            "NOT TESTED: {refused}. The changes below are ranked by size only and may be noise."
        )),
        None => answer.line(format!(
            "{} of {} functions changed significantly ({} on per-profile shares, {} correction, family-wise α = {})",
            int(&answer_json["significant"]),
            int(&method["tested"]),
            method["test"].as_str().unwrap_or(""),
            method["correction"].as_str().unwrap_or(""),
            float(&method["alpha"])
        )),
    }
    answer.line(
        "rank | function | left share | right share | delta_share (pp) | p adjusted | significant",
    );
    let mut shown = 0;
    for (rank, function) in functions.iter().enumerate() {
        if shown == limit {
            break;
        }
        let p = match function["p_adjusted"].as_f64() {
            Some(p) => format!("{p:.2e}"),
            None => "-".into(),
        };
        let row = format!(
            "{} | {} | {} | {} | {:+.2} | {p} | {}",
            rank + 1,
            cell(function["name"].as_str().unwrap_or("")),
            percent(float(&function["left_share"]), 1.0),
            percent(float(&function["right_share"]), 1.0),
            100.0 * float(&function["delta_share"]),
            if function["significant"].as_bool() == Some(true) {
                "yes"
            } else {
                "no"
            }
        );
        if !answer.row(row) {
            break;
        }
        shown += 1;
    }
    if shown < functions.len() {
        let rest = &functions[shown..];
        let significant = rest
            .iter()
            .filter(|f| f["significant"].as_bool() == Some(true))
            .count();
        let moved: f64 = rest.iter().map(|f| float(&f["delta_share"]).abs()).sum();
        answer.line(format!(
            "… {} more functions ({significant} of them significant), moving {:.2} pp in all: ask with a larger limit",
            rest.len(),
            100.0 * moved
        ));
    }
    let focus = functions
        .first()
        .and_then(|f| f["name"].as_str())
        .unwrap_or("")
        .to_string();
    let selector_of = |side: &Side| {
        let bare = super::bare(&side.selector);
        bare.split(", ")
            .filter(|part| !part.starts_with("service_name="))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let view = Target {
        range: Range {
            from_ms: left.range.from_ms.min(right.range.from_ms),
            until_ms: left.range.until_ms.max(right.range.until_ms),
            ..base.range.clone()
        },
        extra: String::new(),
        ..base.clone()
    };
    let (lsel, rsel) = (selector_of(&left), selector_of(&right));
    let (lfrom, luntil) = (
        left.range.from_ms.to_string(),
        left.range.until_ms.to_string(),
    );
    let (rfrom, runtil) = (
        right.range.from_ms.to_string(),
        right.range.until_ms.to_string(),
    );
    answer.line(format!(
        "ui: {}",
        view.link(
            api,
            &[
                ("mode", "compare"),
                ("lfrom", &lfrom),
                ("luntil", &luntil),
                ("rfrom", &rfrom),
                ("runtil", &runtil),
                ("lsel", &lsel),
                ("rsel", &rsel),
                ("focus", &focus),
            ]
        )
    ));
    Ok(answer.finish())
}
