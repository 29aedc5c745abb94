//! `kiln bench rules`: what recording rules add to a level-0 compaction job. A job merges
//! a service's segments' datasets; with rules, each input is also evaluated once per rule
//! (kiln-rules' `evaluate`, the code export, backfill and preview share). Reported per
//! job: the merge alone, and the evaluation of 1 rule, 10 rules and one function rule (the
//! hook's own path: stored records, compiled once), as times and as a share of the merge;
//! beside it, the same with the rules compiled again for every job.
//!
//! `--latency N` measures instead how soon a rule's sample is out: a server with one rule
//! and the default `rule_export` (its own, so `KILN_BENCH_SERVER` compares builds), N
//! pushes of a 10 s CPU profile ending now, their ends spread over a step, and the time
//! from each profile's end to its series' first value on the server's `/metrics` (the
//! local target, drained by the same exporter as a remote-write receiver).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
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
    /// Instead of the jobs: this many profiles through a server, each timed from its
    /// end to its rule's sample (module doc).
    #[arg(long, default_value_t = 0)]
    latency: usize,
}

pub fn run(args: RulesBenchArgs) -> anyhow::Result<()> {
    if args.latency > 0 {
        return latency(&args);
    }
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

/// Seconds a pushed profile lasts, as the SDKs' and the agent's CPU profiles do.
const PROFILE_SECONDS: i64 = 10;
/// The default `rule_export.step_ms`.
const STEP_MS: i64 = 15_000;

/// `--latency`: see the module doc.
fn latency(args: &RulesBenchArgs) -> anyhow::Result<()> {
    let (corpus_name, profile) = crate::common::corpus_pprofs(&args.corpus, 1 << 20)?
        .into_iter()
        .find(|(_, _, profile)| {
            profile
                .sample_type
                .iter()
                .any(|t| profile.string_or_empty(t.r#type) == "cpu")
        })
        .map(|(name, bytes, _)| (name, bytes))
        .with_context(|| format!("no CPU profile in {}", args.corpus.display()))?;
    let dir = crate::common::tempfile_dir("kiln-bench-rules-latency")?;
    let config = dir.join("kiln.yaml");
    std::fs::write(
        &config,
        format!(
            "recording_rules:\n  - metric_name: bench_cpu_nanoseconds\n    profile_type: {CPU}\n\
             \x20   matchers: '{{service_name=~\"latency-.*\"}}'\n    group_by: [service_name]\n"
        ),
    )?;
    let (mut server, url) = crate::common::start_server_with(
        &dir.join("data"),
        &["--config".into(), config.into_os_string()],
    )?;
    let measured = measure_latency(&url, &profile, args.latency);
    let _ = server.kill();
    let _ = std::fs::remove_dir_all(&dir);
    let mut latencies = measured?;
    println!(
        "{} profiles of {PROFILE_SECONDS} s ({corpus_name}), ends spread over a {} s step; server {}",
        latencies.len(),
        STEP_MS / 1000,
        crate::common::this_kiln()?.display()
    );
    for (trial, (phase, latency)) in latencies.iter().enumerate() {
        println!(
            "  latency-{trial}: ended {:.1} s into its step, sample out {latency:.1} s after",
            *phase as f64 / 1000.0
        );
    }
    latencies.sort_by(|a, b| a.1.total_cmp(&b.1));
    let median = latencies[latencies.len() / 2].1;
    let max = latencies.last().map_or(0.0, |l| l.1);
    println!("profile end → rule sample: median {median:.1} s, max {max:.1} s");
    Ok(())
}

/// Pushes `trials` profiles at their times and watches `/metrics` for their samples;
/// returns, per trial, where in its step the profile ended (ms) and the seconds until
/// its sample was out.
fn measure_latency(url: &str, profile: &[u8], trials: usize) -> anyhow::Result<Vec<(i64, f64)>> {
    use std::time::Duration;
    let http = crate::http::Http::new(Duration::from_secs(30));
    let rules = http
        .get(&format!("{url}/api/v1/recording-rules"))
        .call()?
        .json()?;
    let live_from = rules["rules"][0]["live_from_ms"]
        .as_i64()
        .context("the server lists no rule")?;
    // The first profile starts at the rule's live_from (or now); the others end a step's
    // share later each.
    let first_end = (live_from + PROFILE_SECONDS * 1000).max(kiln_model::time::now_ms());
    let first_end = (first_end + 999) / 1000 * 1000;
    let spacing = (STEP_MS / trials as i64).max(1000) / 1000 * 1000 + 1000;
    let ends: Vec<i64> = (0..trials as i64)
        .map(|i| first_end + i * spacing)
        .collect();
    let mut out: Vec<Option<f64>> = vec![None; trials];
    let mut pushed = 0;
    let deadline = std::time::Instant::now()
        + Duration::from_millis((ends[trials - 1] - kiln_model::time::now_ms()).max(0) as u64)
        + Duration::from_secs(180);
    while out.iter().any(Option::is_none) {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "no sample within 180 s of its profile: {out:?}"
        );
        let now = kiln_model::time::now_ms();
        while pushed < trials && now >= ends[pushed] {
            let until = ends[pushed] / 1000;
            let response = http
                .post(&format!(
                    "{url}/ingest?name=latency-{pushed}.cpu&format=pprof&from={}&until={until}",
                    until - PROFILE_SECONDS
                ))
                .send_bytes(profile)?;
            anyhow::ensure!(
                response.status() == 200,
                "push: {} {}",
                response.status(),
                response.text()
            );
            pushed += 1;
        }
        let metrics = http.get(&format!("{url}/metrics")).call()?.text();
        for (trial, seen) in out.iter_mut().enumerate().take(pushed) {
            let series = format!("service_name=\"latency-{trial}\"");
            if seen.is_none()
                && metrics.lines().any(|line| {
                    line.starts_with("bench_cpu_nanoseconds{") && line.contains(&series)
                })
            {
                *seen = Some((now - ends[trial]) as f64 / 1000.0);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(ends
        .iter()
        .zip(out)
        .map(|(end, latency)| (end.rem_euclid(STEP_MS), latency.unwrap_or(f64::NAN)))
        .collect())
}
