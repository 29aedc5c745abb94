//! `series`: a selection's value over time at a step, as a short table, with its minimum,
//! maximum and largest change point (the querier's `SelectSeries`).

use serde_json::Value;

use super::{float, int, target, tool, Args};
use crate::api::{Api, ToolError};
use crate::budget::{tokens_for, Answer};
use crate::units::human;

const DEFAULT_POINTS: usize = 24;

pub fn definition() -> Value {
    let mut properties = super::where_properties();
    properties.push((
        "points",
        super::integer(
            "Points in the range (default 24); the step is the range divided by them",
            2,
            2000,
        ),
    ));
    tool(
        "series",
        "Value over time",
        "A service's or selection's value over time (CPU as cores by default), one row per step, with the minimum, the maximum and the largest change point: when the level shifted and from what to what. Use it to find since when something changed.",
        properties,
        &[],
    )
}

pub async fn run(api: &impl Api, args: &Args<'_>) -> Result<String, ToolError> {
    let points = args.count("points", DEFAULT_POINTS, 2000)?;
    let target = target(api, args).await?;
    let range = &target.range;
    let step_ms = ((range.until_ms - range.from_ms) / points as i64).max(1000) / 1000 * 1000;
    let answer_json = super::select_series(api, &target, step_ms as f64 / 1000.0, false).await?;
    let count = usize::try_from((range.until_ms - range.from_ms).div_euclid(step_ms))
        .unwrap_or(0)
        .max(1);
    let mut values = vec![0.0f64; count];
    for series in answer_json["series"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        for point in series["points"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            let at = (int(&point["timestamp"]) - range.from_ms).div_euclid(step_ms);
            if let Some(slot) = usize::try_from(at).ok().and_then(|at| values.get_mut(at)) {
                *slot += float(&point["value"]);
            }
        }
    }
    let kind = target.kind();
    let step_ns = Some(step_ms as f64 * 1e6);
    let time = |index: usize| super::rfc3339(range.from_ms + index as i64 * step_ms);
    let mut answer = Answer::new(tokens_for(points, DEFAULT_POINTS));
    answer.line(format!(
        "{} per step of {} s, {} points",
        target.header(),
        step_ms / 1000,
        values.len()
    ));
    let (min_at, max_at) = extremes(&values);
    answer.line(format!(
        "min {} at {}; max {} at {}",
        human(values[min_at], &kind, step_ns),
        time(min_at),
        human(values[max_at], &kind, step_ns),
        time(max_at)
    ));
    match change_point(&values) {
        Some((at, before, after)) => answer.line(format!(
            "largest change point: at {}, from {} to {} per step on average ({})",
            time(at),
            human(before, &kind, step_ns),
            human(after, &kind, step_ns),
            if before > 0.0 {
                format!("{:+.1} %", 100.0 * (after - before) / before)
            } else {
                "from nothing".into()
            }
        )),
        None => answer.line("no change point: the series is flat"),
    }
    answer.line("step start | value");
    let mut shown = 0;
    for (index, value) in values.iter().enumerate() {
        if !answer.row(format!(
            "{} | {}",
            time(index),
            human(*value, &kind, step_ns)
        )) {
            break;
        }
        shown += 1;
    }
    if shown < values.len() {
        let rest: f64 = values[shown..].iter().sum();
        answer.line(format!(
            "… {} more points ({} in all): ask with fewer points",
            values.len() - shown,
            human(rest, &kind, None)
        ));
    }
    answer.line(format!("ui: {}", target.link(api, &[])));
    Ok(answer.finish())
}

fn extremes(values: &[f64]) -> (usize, usize) {
    let mut min = 0;
    let mut max = 0;
    for (i, v) in values.iter().enumerate() {
        if *v < values[min] {
            min = i;
        }
        if *v > values[max] {
            max = i;
        }
    }
    (min, max)
}

/// The split with the largest shift of the mean, weighted as a two-sample statistic
/// (`|mean after − mean before| · √(n₁n₂/n)`), so that one odd point at an end does not
/// win over a lasting shift: (first point after, mean before, mean after).
fn change_point(values: &[f64]) -> Option<(usize, f64, f64)> {
    let n = values.len();
    let total: f64 = values.iter().sum();
    let mut best: Option<(f64, usize, f64, f64)> = None;
    let mut prefix = 0.0;
    for k in 1..n {
        prefix += values[k - 1];
        let before = prefix / k as f64;
        let after = (total - prefix) / (n - k) as f64;
        let score = (after - before).abs() * ((k * (n - k)) as f64 / n as f64).sqrt();
        if score > 0.0 && best.is_none_or(|(s, ..)| score > s) {
            best = Some((score, k, before, after));
        }
    }
    best.map(|(_, k, before, after)| (k, before, after))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shift_of_level_is_found() {
        let values = [10.0, 10.0, 14.0, 10.0, 6.0, 20.0, 22.0, 20.0, 18.0, 20.0];
        assert_eq!(change_point(&values), Some((5, 10.0, 20.0)));
        assert_eq!(change_point(&[5.0, 5.0, 5.0]), None);
        assert_eq!(extremes(&values), (4, 6));
    }
}
