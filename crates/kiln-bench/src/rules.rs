//! `kiln bench rules`: what recording rules add to a level-0 compaction job. A job merges
//! a service's segments' datasets; with rules, each input is also evaluated once per rule
//! (kiln-rules' `evaluate`, the code export, backfill and preview share). Reported per
//! job: the merge alone, and the evaluation of 1 rule, 10 rules and one function rule (the
//! hook's own path: stored records, compiled once), as times and as a share of the merge;
//! beside it, the same with the rules compiled again for every job.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use kiln_ingest::parse::{from_pprof, ProfileContext};
use kiln_metastore::RuleRecord;
use kiln_model::labels::Labels;
use kiln_rules::rule::RuleSpec;
use kiln_rules::{job_samples, RuleCache};
use kiln_storage::{Dataset, DatasetBuilder};

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

#[derive(Args)]
pub struct RulesBenchArgs {
    /// Directory of profiles; its CPU profiles are the job's inputs.
    #[arg(long, default_value = "../shared/corpus")]
    corpus: PathBuf,
    /// Services, each with its own level-0 job (many services with few profiles each is
    /// the common shape: `--services 500 --inputs 1 --profiles 2`).
    #[arg(long, default_value_t = 1)]
    services: usize,
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
    for (_, bytes, profile) in crate::common::corpus_pprofs(&args.corpus, 1 << 20)? {
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
    // A function on many stacks of the first template.
    let function = frequent_function(&templates[0]);
    // One level-0 job per service: its inputs, each a flush's dataset of that service.
    let jobs: Vec<Vec<Dataset>> = (0..args.services.max(1))
        .map(|service| {
            let name = format!("svc-{service}");
            (0..args.inputs)
                .map(|input| {
                    let mut builder = DatasetBuilder::new("bench", &name);
                    for profile in 0..args.profiles {
                        let template = &templates[(service + input + profile) % templates.len()];
                        let labels = Labels::from_pairs([
                            ("service_name", name.clone()),
                            ("instance", format!("i-{profile}")),
                            (
                                "env",
                                if profile % 2 == 0 { "prod" } else { "staging" }.to_string(),
                            ),
                        ]);
                        let id = format!("{service}-{input}-{profile}");
                        let mut pprof = template.input(1_000);
                        pprof.labels = &labels;
                        pprof.id = &id;
                        pprof.time_nanos =
                            (input as i64 * 1_000 + profile as i64 * 100) * 1_000_000;
                        builder.add_pprof(&pprof);
                    }
                    builder.finish()
                })
                .collect()
        })
        .collect();
    let samples: usize = jobs.iter().flatten().map(|d| d.sample_stack.len()).sum();
    // Rules as the compactor gets them: stored records, JSON definitions.
    let record = |name: &str, matchers: &str, group_by: &[&str], function: Option<&str>| {
        let spec = RuleSpec {
            metric_name: name.to_string(),
            profile_type: CPU.to_string(),
            matchers: matchers.to_string(),
            group_by: group_by.iter().map(|s| s.to_string()).collect(),
            function_name: function.map(str::to_string),
            external_labels: Default::default(),
            tenant: None,
        };
        RuleRecord {
            tenant: "bench".into(),
            name: name.into(),
            spec: serde_json::to_string(&spec).unwrap_or_default(),
            source: "api".into(),
            live_from_ms: 0,
            updated_at_ms: 0,
        }
    };
    let one = vec![record(
        "cpu",
        "{service_name=~\"svc-.*\"}",
        &["service_name"],
        None,
    )];
    let ten: Vec<RuleRecord> = (0..10)
        .map(|i| {
            record(
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
        .collect();
    let by_function = vec![record("fn_cpu", "", &["service_name"], Some(&function))];
    let median = |mut times: Vec<f64>| {
        times.sort_by(f64::total_cmp);
        times[times.len() / 2]
    };
    let mut merge = Vec::new();
    // Per case: (rules compiled once, as the hook does; compiled again for every job).
    let mut evaluations: [(Vec<f64>, Vec<f64>); 3] = Default::default();
    for _ in 0..args.jobs.max(1) {
        let started = Instant::now();
        for inputs in &jobs {
            let mut builder = DatasetBuilder::new("bench", "merge");
            for input in inputs {
                builder.add_dataset(input);
            }
            std::hint::black_box(builder.finish());
        }
        merge.push(started.elapsed().as_secs_f64() * 1e3);
        for (records, (cached, per_job)) in [&one, &ten, &by_function]
            .into_iter()
            .zip(evaluations.iter_mut())
        {
            let cache = RuleCache::default();
            let started = Instant::now();
            for inputs in &jobs {
                for input in inputs {
                    std::hint::black_box(job_samples(&cache, records, input, 15_000, i64::MIN));
                }
            }
            cached.push(started.elapsed().as_secs_f64() * 1e3);
            let started = Instant::now();
            for inputs in &jobs {
                let cache = RuleCache::default();
                for input in inputs {
                    std::hint::black_box(job_samples(&cache, records, input, 15_000, i64::MIN));
                }
            }
            per_job.push(started.elapsed().as_secs_f64() * 1e3);
        }
    }
    let merge = median(merge);
    println!(
        "{} level-0 job(s) of {} inputs × {} profiles, {samples} samples ({} templates)",
        jobs.len(),
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
    for ((name, rules), (cached, per_job)) in cases.into_iter().zip(evaluations) {
        let (time, per_job) = (median(cached), median(per_job));
        println!(
            "{name}: {time:.2} ms ({:.1} % of the merge; {:.0} M samples/s per rule); compiled for every job: {per_job:.2} ms",
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
            for name in locations.get(&u64::from(*id)).into_iter().flatten() {
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
