//! Evaluating rules over a dataset: the one computation behind export at compaction,
//! backfill and the UI's preview, so that a preview shows exactly what will be sent.
//!
//! A sample's value is the sum of the profile values the rule selects whose profile time
//! falls in one step (`[k·step, (k+1)·step)`); its timestamp is the step's start. The
//! exported metric is therefore a gauge of per-step sums, not a running counter: sums are
//! additive, so profiles counted by different compactions, in any order, late or after a
//! restart, add up to the same series, and `sum_over_time(metric[w])` equals Kiln's own
//! total over any step-aligned window `w` exactly. A running total would need the sum of
//! everything before a sample to be known when the sample is written, which late data
//! and concurrent compactors make impossible without rewriting history.

use std::collections::BTreeMap;

use kiln_model::labels::Labels;
use kiln_query::select::{selectable_labels, TYPE_LABELS};
use kiln_query::symbols::FrameNames;
use kiln_storage::Dataset;

use crate::rule::CompiledRule;

/// Per-step sums of one rule: (series labels, step start in ms) → value.
pub type StepSums = BTreeMap<(SeriesLabels, i64), i64>;

/// An exported series' labels, sorted by name, `__name__` included.
pub type SeriesLabels = Vec<(String, String)>;

/// Which profiles count: profile times in `[from_ms, until_ms)`.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub from_ms: i64,
    pub until_ms: i64,
    pub step_ms: i64,
}

/// What every rule needs of one dataset, computed once for all of them: each series'
/// labels, and each profile's total. A rule without a function then
/// costs a pass over series and profiles, not over samples (`kiln bench rules`).
pub struct Prepared<'a> {
    dataset: &'a Dataset,
    labels: Vec<Labels>,
    totals: Vec<i64>,
}

impl<'a> Prepared<'a> {
    pub fn new(dataset: &'a Dataset) -> Self {
        let labels = dataset
            .series
            .iter()
            .map(|series| dataset.series_labels(series))
            .collect();
        let offsets = dataset.profile_sample_offsets();
        let totals = (0..dataset.profiles.len())
            .map(|row| {
                dataset.sample_value[offsets[row] as usize..offsets[row + 1] as usize]
                    .iter()
                    .fold(0i64, |sum, value| sum.saturating_add(*value))
            })
            .collect();
        Prepared {
            dataset,
            labels,
            totals,
        }
    }
}

/// Adds `rule`'s per-step sums over the prepared dataset to `sums`.
pub fn evaluate(rule: &CompiledRule, prepared: &Prepared<'_>, window: Window, sums: &mut StepSums) {
    let dataset = prepared.dataset;
    let step = window.step_ms.max(1);
    // Each series: does it match, and which exported series does it feed.
    let mut series_out: Vec<Option<SeriesLabels>> = Vec::with_capacity(dataset.series.len());
    // The labels derived from the profile type (`__name__`, ...) cost six strings per
    // series: only built for a rule whose matchers name one.
    let wants_type_labels = rule
        .selector
        .matchers
        .iter()
        .any(|matcher| TYPE_LABELS.contains(&matcher.name.as_str()));
    for (series, labels) in dataset.series.iter().zip(&prepared.labels) {
        let type_id = dataset.string(series.profile_type);
        if !rule.types.matches(type_id) {
            series_out.push(None);
            continue;
        }
        let matched = if wants_type_labels {
            rule.selector.matches(&selectable_labels(dataset, series))
        } else {
            rule.selector.matches(labels)
        };
        series_out.push(matched.then(|| series_labels(rule, |name| labels.get(name))));
    }
    if series_out.iter().all(Option::is_none) {
        return;
    }
    let stacks = rule
        .spec
        .function_name
        .as_deref()
        .map(|function| stacks_holding(dataset, function));
    let offsets = dataset.profile_sample_offsets();
    // Summed by (series row, step) first: the exported labels are cloned once per series
    // and step, not once per profile.
    let mut by_series: std::collections::HashMap<(u32, i64), i64> = Default::default();
    for (row, profile) in dataset.profiles.iter().enumerate() {
        if !matches!(series_out.get(profile.series as usize), Some(Some(_))) {
            continue;
        }
        let time_ms = profile.time_nanos.div_euclid(1_000_000);
        if time_ms < window.from_ms || time_ms >= window.until_ms {
            continue;
        }
        let total = match &stacks {
            None => prepared.totals[row],
            Some(holding) => {
                let mut total = 0i64;
                for sample in offsets[row] as usize..offsets[row + 1] as usize {
                    let stack = dataset.sample_stack[sample] as usize;
                    if holding.get(stack).copied().unwrap_or(false) {
                        total = total.saturating_add(dataset.sample_value[sample]);
                    }
                }
                total
            }
        };
        if total == 0 {
            continue;
        }
        let step_start = time_ms.div_euclid(step) * step;
        let slot = by_series.entry((profile.series, step_start)).or_insert(0);
        *slot = slot.saturating_add(total);
    }
    for ((series, step_start), total) in by_series {
        if let Some(Some(labels)) = series_out.get(series as usize) {
            let slot = sums.entry((labels.clone(), step_start)).or_insert(0);
            *slot = slot.saturating_add(total);
        }
    }
}

/// The exported labels of a series: `__name__`, the `group_by` labels it has (a missing or
/// empty one is left out, as Prometheus treats empty labels), and the external labels.
pub fn series_labels<'a>(
    rule: &CompiledRule,
    lookup: impl Fn(&str) -> Option<&'a str>,
) -> SeriesLabels {
    let mut labels: SeriesLabels = vec![("__name__".into(), rule.spec.metric_name.clone())];
    for (source, exported) in &rule.group_by {
        if let Some(value) = lookup(source).filter(|value| !value.is_empty()) {
            labels.push((exported.clone(), value.to_string()));
        }
    }
    for (name, value) in &rule.spec.external_labels {
        labels.push((name.clone(), value.clone()));
    }
    labels.sort();
    labels
}

/// Which stack nodes have `function` anywhere on their path (parents precede children,
/// so one pass settles every node).
fn stacks_holding(dataset: &Dataset, function: &str) -> Vec<bool> {
    let names = FrameNames::new(dataset);
    let count = dataset.stack_parent.len();
    let mut holding = vec![false; count];
    for node in 1..count {
        let parent = dataset.stack_parent[node] as usize;
        let mut found = holding.get(parent).copied().unwrap_or(false);
        if !found {
            names.for_each_frame(dataset.stack_location[node], |frame| {
                found |= frame == function;
            });
        }
        holding[node] = found;
    }
    holding
}

/// The outbox's text form of a series: JSON of its sorted pairs.
pub fn series_key(labels: &SeriesLabels) -> String {
    serde_json::to_string(labels).unwrap_or_default()
}

/// Reads [`series_key`] back; `None` for text it did not write.
pub fn parse_series_key(key: &str) -> Option<SeriesLabels> {
    serde_json::from_str(key).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule::RuleSpec;
    use kiln_model::folded;
    use kiln_model::labels::Labels;
    use kiln_model::profile_type::ProfileType;
    use kiln_storage::builder::{PprofInput, TypePlan};
    use kiln_storage::DatasetBuilder;

    const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

    /// One dataset: profiles of (labels, time in ms, folded stacks).
    /// (series labels, time in ms, folded stacks).
    type Input<'a> = (&'a [(&'a str, &'a str)], i64, &'a str);

    fn dataset(profiles: &[Input<'_>]) -> Dataset {
        let mut builder = DatasetBuilder::new("t", "checkout");
        let profile_type = ProfileType::parse(CPU).unwrap();
        for (index, (labels, time_ms, text)) in profiles.iter().enumerate() {
            let stacks = folded::parse(text.as_bytes(), 1000).unwrap();
            let profile = folded::to_pprof(&stacks, &profile_type);
            let validated = kiln_model::pprof::validate(&profile, &Default::default()).unwrap();
            let types = [TypePlan {
                value_index: 0,
                profile_type: profile_type.clone(),
                scale: None,
            }];
            let labels = Labels::from_pairs(labels.iter().copied());
            builder.add_pprof(&PprofInput {
                profile: &profile,
                index: &validated,
                id: &index.to_string(),
                time_nanos: time_ms * 1_000_000,
                duration_nanos: 10,
                labels: &labels,
                types: &types,
                max_stack_depth: 100,
                sample_labels_per_sample: false,
            });
        }
        builder.finish()
    }

    fn rule(json: &str) -> CompiledRule {
        serde_json::from_str::<RuleSpec>(json)
            .unwrap()
            .compile()
            .unwrap()
    }

    fn sums(rule: &CompiledRule, dataset: &Dataset, from_ms: i64) -> Vec<(String, i64, i64)> {
        let mut sums = StepSums::new();
        let window = Window {
            from_ms,
            until_ms: i64::MAX,
            step_ms: 15_000,
        };
        evaluate(rule, &Prepared::new(dataset), window, &mut sums);
        sums.into_iter()
            .map(|((labels, step), value)| (series_key(&labels), step, value))
            .collect()
    }

    #[test]
    fn values_sum_per_step_and_group_by_labels_with_matchers_applied() {
        let data = dataset(&[
            (
                &[("service_name", "checkout"), ("env", "prod"), ("pod", "a")],
                1_000,
                "main;work 10\nmain;idle 5",
            ),
            (
                &[("service_name", "checkout"), ("env", "prod"), ("pod", "b")],
                14_999,
                "main;work 7",
            ),
            (
                &[("service_name", "checkout"), ("env", "dev"), ("pod", "c")],
                15_000,
                "main;work 3",
            ),
            (
                &[("service_name", "search"), ("env", "prod")],
                2_000,
                "main;work 100",
            ),
        ]);
        let cpu = rule(&format!(
            r#"{{"metric_name": "cpu", "profile_type": "{CPU}", "matchers": "{{service_name=\"checkout\"}}",
                "group_by": ["env"], "external_labels": {{"source": "kiln"}}}}"#
        ));
        assert_eq!(
            sums(&cpu, &data, 0),
            vec![
                (
                    r#"[["__name__","cpu"],["env","dev"],["source","kiln"]]"#.into(),
                    15_000,
                    3
                ),
                (
                    r#"[["__name__","cpu"],["env","prod"],["source","kiln"]]"#.into(),
                    0,
                    22
                ),
            ]
        );
        // Profiles before the rule's live_from are a backfill's, not this evaluation's.
        assert_eq!(
            sums(&cpu, &data, 14_999).iter().map(|s| s.2).sum::<i64>(),
            10
        );
        // Another profile type matches nothing.
        let memory =
            rule(r#"{"metric_name": "m", "profile_type": "memory:alloc_space:bytes:space:bytes"}"#);
        assert!(sums(&memory, &data, 0).is_empty());
    }

    #[test]
    fn a_function_counts_each_sample_once_wherever_it_is_in_the_stack() {
        let data = dataset(&[(
            &[("service_name", "checkout")],
            1_000,
            "main;parse;parse;lex 4\nmain;render;parse 2\nmain;render 8\nparse 1",
        )]);
        let parse = rule(&format!(
            r#"{{"metric_name": "parse_cpu", "profile_type": "{CPU}", "function_name": "parse"}}"#
        ));
        // Recursion (parse;parse) counts once; parse under render and at the root count.
        assert_eq!(
            sums(&parse, &data, 0),
            vec![(r#"[["__name__","parse_cpu"]]"#.into(), 0, 7)]
        );
        let missing = rule(&format!(
            r#"{{"metric_name": "x", "profile_type": "{CPU}", "function_name": "nowhere"}}"#
        ));
        assert!(sums(&missing, &data, 0).is_empty());
    }
}
