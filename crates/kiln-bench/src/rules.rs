//! `kiln bench rules`: what recording rules add to a level-0 compaction job. A job merges
//! a service's segments' datasets; with rules, each input is also evaluated once per rule
//! (kiln-rules' `evaluate`, the code export, backfill and preview share). Reported per
//! job: the merge alone, and the evaluation of 1 rule, 10 rules and one function rule, as
//! times and as a share of the merge.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use kiln_ingest::parse::{from_pprof, ProfileContext};
use kiln_model::labels::Labels;
use kiln_rules::eval::{evaluate, Prepared, StepSums, Window};
use kiln_rules::rule::RuleSpec;
use kiln_storage::{Dataset, DatasetBuilder};

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

#[derive(Args)]
pub struct RulesBenchArgs {
    /// Directory of profiles; its CPU profiles are the job's inputs.
    #[arg(long, default_value = "../shared/corpus")]
    corpus: PathBuf,
    /// Input datasets per job (the level-0 default merges up to 20 segments).
    #[arg(long, default_value_t = 20)]
    inputs: usize,
    /// Profiles per input dataset (10 s of flushes of a service's instances).
    #[arg(long, default_value_t = 10)]
    profiles: usize,
    /// Jobs measured; the median is reported.
    #[arg(long, default_value_t = 20)]
    jobs: usize,
}

pub fn run(args: RulesBenchArgs) -> anyhow::Result<()> {
    let limits = kiln_ingest::Limits {
        max_samples_per_profile: usize::MAX,
        retention_days: 0,
        ..Default::default()
    };
    let mut templates = Vec::new();
    for (_, bytes, profile) in crate::ingest::corpus_pprofs(&args.corpus, 1 << 20)? {
        if let Ok(parsed) = from_pprof(profile, ProfileContext::default(), bytes.len(), &limits) {
            if parsed
                .types
                .iter()
                .any(|plan| plan.profile_type.id() == CPU)
            {
                templates.push(parsed);
            }
        }
    }
    anyhow::ensure!(
        !templates.is_empty(),
        "no CPU profile in {}",
        args.corpus.display()
    );
    // A function on many stacks of the first template: its most frequent frame name.
    let function = frequent_function(&templates[0]);
    let inputs: Vec<Dataset> = (0..args.inputs)
        .map(|input| {
            let mut builder = DatasetBuilder::new("bench", "checkout");
            for profile in 0..args.profiles {
                let template = &templates[(input + profile) % templates.len()];
                let labels = Labels::from_pairs([
                    ("service_name", "checkout".to_string()),
                    ("instance", format!("i-{profile}")),
                    (
                        "env",
                        if profile % 2 == 0 { "prod" } else { "staging" }.to_string(),
                    ),
                ]);
                let id = format!("{input}-{profile}");
                let mut pprof = template.input(1_000);
                pprof.labels = &labels;
                pprof.id = &id;
                pprof.time_nanos = (input as i64 * 1_000 + profile as i64 * 100) * 1_000_000;
                builder.add_pprof(&pprof);
            }
            builder.finish()
        })
        .collect();
    let samples: usize = inputs.iter().map(|d| d.sample_stack.len()).sum();
    let spec = |name: &str, matchers: &str, group_by: &[&str], function: Option<&str>| {
        RuleSpec {
            metric_name: name.to_string(),
            profile_type: CPU.to_string(),
            matchers: matchers.to_string(),
            group_by: group_by.iter().map(|s| s.to_string()).collect(),
            function_name: function.map(str::to_string),
            external_labels: Default::default(),
            tenant: None,
        }
        .compile()
    };
    let one = vec![spec(
        "cpu",
        "{service_name=\"checkout\"}",
        &["service_name"],
        None,
    )?];
    let ten = (0..10)
        .map(|i| {
            spec(
                &format!("cpu_{i}"),
                if i % 2 == 0 {
                    "{env=\"prod\"}"
                } else {
                    "{env=~\"stag.*\"}"
                },
                &["service_name", "instance"],
                None,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let by_function = vec![spec("fn_cpu", "", &["service_name"], Some(&function))?];
    let window = Window {
        from_ms: 0,
        until_ms: i64::MAX,
        step_ms: 15_000,
    };
    let median = |mut times: Vec<f64>| {
        times.sort_by(f64::total_cmp);
        times[times.len() / 2]
    };
    let mut merge = Vec::new();
    let mut evaluations: [Vec<f64>; 3] = Default::default();
    for _ in 0..args.jobs.max(1) {
        let started = Instant::now();
        let mut builder = DatasetBuilder::new("bench", "checkout");
        for input in &inputs {
            builder.add_dataset(input);
        }
        std::hint::black_box(builder.finish());
        merge.push(started.elapsed().as_secs_f64() * 1e3);
        for (rules, times) in [&one, &ten, &by_function]
            .into_iter()
            .zip(evaluations.iter_mut())
        {
            let started = Instant::now();
            let mut sums = StepSums::new();
            for input in &inputs {
                let prepared = Prepared::new(input);
                for rule in rules {
                    evaluate(rule, &prepared, window, &mut sums);
                }
            }
            std::hint::black_box(sums);
            times.push(started.elapsed().as_secs_f64() * 1e3);
        }
    }
    let merge = median(merge);
    println!(
        "level-0 job: {} inputs × {} profiles, {samples} samples ({} templates)",
        args.inputs,
        args.profiles,
        templates.len()
    );
    println!("merge alone: {merge:.2} ms");
    let cases = [
        ("1 rule".to_string(), 1),
        ("10 rules".to_string(), 10),
        (format!("1 function rule ({function})"), 1),
    ];
    for ((name, rules), times) in cases.into_iter().zip(evaluations) {
        let time = median(times);
        println!(
            "{name}: {time:.2} ms ({:.1} % of the merge; {:.0} M samples/s per rule)",
            time / merge * 100.0,
            (samples * rules) as f64 / (time / 1e3) / 1e6
        );
    }
    Ok(())
}

/// A function on many, but not all, samples: the third most frequent frame name (the
/// first ones are the roots every stack has).
fn frequent_function(parsed: &kiln_ingest::parse::ParsedProfile) -> String {
    let profile = &parsed.profile;
    let mut counts = std::collections::HashMap::<String, usize>::new();
    let names: std::collections::HashMap<u64, String> = profile
        .function
        .iter()
        .map(|f| (f.id, profile.string_or_empty(f.name)))
        .collect();
    let locations: std::collections::HashMap<u64, Vec<&str>> = profile
        .location
        .iter()
        .map(|l| {
            (
                l.id,
                l.line
                    .iter()
                    .filter_map(|line| names.get(&line.function_id).map(String::as_str))
                    .collect(),
            )
        })
        .collect();
    for sample in profile.sample.iter() {
        let mut seen = std::collections::HashSet::new();
        for id in sample.location_id {
            for name in locations.get(id).into_iter().flatten() {
                if seen.insert(*name) {
                    *counts.entry(name.to_string()).or_default() += 1;
                }
            }
        }
    }
    let mut ranked: Vec<(String, usize)> = counts.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    ranked
        .get(ranked.len().min(3).saturating_sub(1))
        .map(|(name, _)| name.clone())
        .unwrap_or_default()
}
