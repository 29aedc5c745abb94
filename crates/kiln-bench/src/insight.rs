//! `kiln bench insight`: does the comparison find a planted regression, does it stay
//! quiet when nothing changed, and how fast is it over a day a side.
//!
//! Accuracy: each trial takes a real CPU profile of the corpus as the shape of a service
//! and draws `--profiles` profiles a side from it. Each profile jitters every function's
//! self value by a log-normal factor (`--sigma`, independent per function and profile),
//! then draws `--samples` samples from the result (Poisson per function), as a profiler
//! sampling at 100 Hz would. In planted trials one function, chosen at random among
//! those that have self time, gains `--plant` points of share on the right side. The same
//! sides are ranked three ways: Kiln's method (per-profile shares, Welch, Holm); the naive
//! ranking by |delta share| (a person reading a diff flame graph, who calls a change of
//! 1 point or more real); and a two-proportion z-test over samples with Holm, which treats
//! every sample as independent evidence.
//!
//! Speed: one service with a profile every second for two days, written as compaction
//! leaves it; `POST /api/v1/compare` of the last 24 h against the 24 h before, on a
//! `kiln server` child process.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use kiln_insight::stats::{rank, Method, SideSums};
use kiln_query::select::{SelectRequest, TypeFilter};
use kiln_storage::DatasetBuilder;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::stream::{
    cpu_templates, load_templates, write_stream, StreamShape, Template, CPU, HOUR_NANOS, SERVICE,
};

#[derive(Args)]
pub struct InsightBenchArgs {
    /// Directory of profiles; its CPU profiles shape the streams.
    #[arg(long, default_value = "../shared/corpus")]
    corpus: PathBuf,
    /// Trials with a planted change, and as many with none.
    #[arg(long, default_value_t = 100)]
    trials: usize,
    /// Profiles a side.
    #[arg(long, default_value_t = 12)]
    profiles: usize,
    /// Log-normal σ of each function's per-profile jitter.
    #[arg(long, default_value_t = 0.3)]
    sigma: f64,
    /// Points of CPU share planted.
    #[arg(long, default_value_t = 2.0)]
    plant: f64,
    /// Samples per profile (10 s at 100 Hz).
    #[arg(long, default_value_t = 1_000)]
    samples: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Family-wise error rate [default: Kiln's, as the API uses].
    #[arg(long)]
    alpha: Option<f64>,
    /// Profiles a side for the speed measurement (one a second); 0 skips it.
    #[arg(long, default_value_t = 86_400)]
    speed_profiles: usize,
    /// Services for the regression watcher's look (0 skips it).
    #[arg(long, default_value_t = 500)]
    watch_services: usize,
    /// Level-0 segments (one flush each, every service in each) the watcher finds.
    #[arg(long, default_value_t = 20)]
    watch_segments: usize,
}

/// A service's shape needs this many functions with self time: fewer, and it is a test
/// fixture, not a program.
const MIN_FUNCTIONS: usize = 20;

/// One corpus profile's self value per leaf function, as Kiln's compare reads it.
struct Shape {
    name: String,
    functions: Vec<(String, f64)>,
}

fn shapes(templates: &[Template]) -> Vec<Shape> {
    let request = SelectRequest {
        types: TypeFilter::Exact(CPU.into()),
        from_nanos: i64::MIN,
        to_nanos: i64::MAX,
        ..Default::default()
    };
    templates
        .iter()
        .filter_map(|template| {
            let mut builder = DatasetBuilder::new("bench", SERVICE);
            builder.add_pprof(&template.parsed.input(1_000));
            let sums = kiln_insight::compare::dataset_sums(&builder.finish(), &request);
            let mut functions: Vec<(String, f64)> = sums
                .functions
                .into_iter()
                .filter(|(_, sums)| sums.value > 0)
                .map(|(name, sums)| (name, sums.value as f64))
                .collect();
            functions.sort_by(|a, b| a.0.cmp(&b.0));
            (functions.len() >= MIN_FUNCTIONS).then(|| Shape {
                name: template.name.clone(),
                functions,
            })
        })
        .collect()
}

fn normal(rng: &mut StdRng) -> f64 {
    // Box-Muller.
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

fn poisson(rng: &mut StdRng, mean: f64) -> u64 {
    if mean <= 0.0 {
        return 0;
    }
    if mean > 50.0 {
        return (mean + mean.sqrt() * normal(rng)).round().max(0.0) as u64;
    }
    // Knuth: multiply uniforms until below e^-mean.
    let limit = (-mean).exp();
    let mut count = 0;
    let mut product: f64 = rng.random();
    while product > limit {
        count += 1;
        product *= rng.random::<f64>();
    }
    count
}

/// One drawn profile: sample counts per function index.
fn draw(
    rng: &mut StdRng,
    shape: &Shape,
    args: &InsightBenchArgs,
    planted: Option<usize>,
) -> Vec<(usize, u64)> {
    let mut weights: Vec<f64> = shape
        .functions
        .iter()
        .map(|(_, value)| value * (args.sigma * normal(rng)).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    if let Some(index) = planted {
        // Raise the function's share by `plant` points: (w + x) / (total + x) = s + plant.
        let target = weights[index] / total + args.plant / 100.0;
        weights[index] += (target * total - weights[index]) / (1.0 - target);
    }
    let total: f64 = weights.iter().sum();
    weights
        .iter()
        .enumerate()
        .map(|(index, weight)| (index, poisson(rng, args.samples as f64 * weight / total)))
        .filter(|(_, count)| *count > 0)
        .collect()
}

/// Per-sample counts of one side (for the z-test), and its Kiln sums.
struct DrawnSide {
    sums: SideSums,
    counts: Vec<u64>,
    samples: u64,
}

fn side(
    rng: &mut StdRng,
    shape: &Shape,
    args: &InsightBenchArgs,
    planted: Option<usize>,
) -> DrawnSide {
    let mut drawn = DrawnSide {
        sums: SideSums::default(),
        counts: vec![0; shape.functions.len()],
        samples: 0,
    };
    for _ in 0..args.profiles {
        let profile = draw(rng, shape, args, planted);
        for (index, count) in &profile {
            drawn.counts[*index] += count;
            drawn.samples += count;
        }
        // 10 ms a sample, as the CPU profile's nanoseconds.
        drawn.sums.add_profile(profile.iter().map(|(index, count)| {
            (
                shape.functions[*index].0.as_str(),
                *count as i64 * 10_000_000,
            )
        }));
    }
    drawn
}

/// The per-sample z-test with Holm: which function indexes it calls significant, and
/// the index it ranks first (smallest p).
fn sample_test(
    left: &DrawnSide,
    right: &DrawnSide,
    alpha: f64,
    planted: Option<usize>,
) -> (usize, Option<usize>, bool) {
    let (n1, n2) = (left.samples as f64, right.samples as f64);
    let p_values: Vec<f64> = left
        .counts
        .iter()
        .zip(&right.counts)
        .map(|(c1, c2)| {
            let (p1, p2) = (*c1 as f64 / n1, *c2 as f64 / n2);
            let pooled = (*c1 + *c2) as f64 / (n1 + n2);
            let se = (pooled * (1.0 - pooled) * (1.0 / n1 + 1.0 / n2)).sqrt();
            if se == 0.0 {
                1.0
            } else {
                // The normal tail: Student's t with 10⁷ degrees of freedom.
                kiln_insight::stats::t_two_sided((p2 - p1) / se, 1e7)
            }
        })
        .collect();
    let adjusted = kiln_insight::stats::holm(&p_values);
    let significant = adjusted.iter().filter(|p| **p <= alpha).count();
    let first = (0..p_values.len()).min_by(|a, b| p_values[*a].total_cmp(&p_values[*b]));
    let found = planted.is_some_and(|index| adjusted[index] <= alpha);
    (significant, first, found)
}

#[derive(Default)]
struct Tally {
    first: usize,
    /// Planted trials: the planted function called significant.
    found: usize,
    any_significant: usize,
}

pub async fn run(args: InsightBenchArgs) -> anyhow::Result<()> {
    let query_args = StreamShape::one_instance(args.corpus.clone());
    let templates = load_templates(&query_args)?;
    let shapes = shapes(&cpu_templates(&args.corpus, usize::MAX)?);
    if shapes.is_empty() {
        bail!(
            "no CPU profiles with two or more functions in {}",
            args.corpus.display()
        );
    }
    println!(
        "kiln bench insight: {} trials planted and {} not, {} profiles a side, jitter σ = {}, +{} points planted, {} samples a profile; shapes: {}",
        args.trials,
        args.trials,
        args.profiles,
        args.sigma,
        args.plant,
        args.samples,
        shapes
            .iter()
            .map(|shape| format!("{} ({} functions)", shape.name, shape.functions.len()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut method = Method::default();
    if let Some(alpha) = args.alpha {
        method.alpha = alpha;
    }
    let mut rng = StdRng::seed_from_u64(args.seed);
    let (mut kiln, mut naive, mut samples) = (Tally::default(), Tally::default(), Tally::default());
    let (mut kiln_null, mut naive_null, mut samples_null) =
        (Tally::default(), Tally::default(), Tally::default());
    let started = Instant::now();
    for trial in 0..2 * args.trials {
        let shape = &shapes[rng.random_range(0..shapes.len())];
        let planted = (trial < args.trials).then(|| rng.random_range(0..shape.functions.len()));
        let left = side(&mut rng, shape, &args, None);
        let right = side(&mut rng, shape, &args, planted);
        let ranking = rank(&left.sums, &right.sums, &method);
        let kiln_first = ranking.functions.first().map(|f| f.name.as_str());
        let kiln_any = ranking.functions.iter().any(|f| f.significant);
        let by_size = ranking
            .functions
            .iter()
            .max_by(|a, b| a.delta_share.abs().total_cmp(&b.delta_share.abs()));
        let naive_first = by_size.map(|f| f.name.as_str());
        let naive_any = by_size.is_some_and(|f| f.delta_share.abs() >= 0.01);
        let (sample_significant, sample_first, sample_found) =
            sample_test(&left, &right, method.alpha, planted);
        let sample_first = sample_first.map(|index| shape.functions[index].0.as_str());
        let (k, n, s) = if planted.is_some() {
            (&mut kiln, &mut naive, &mut samples)
        } else {
            (&mut kiln_null, &mut naive_null, &mut samples_null)
        };
        let planted_name = planted.map(|index| shape.functions[index].0.as_str());
        k.first += usize::from(planted_name.is_some() && kiln_first == planted_name);
        n.first += usize::from(planted_name.is_some() && naive_first == planted_name);
        s.first += usize::from(planted_name.is_some() && sample_first == planted_name);
        k.found += usize::from(
            ranking
                .functions
                .iter()
                .any(|f| f.significant && Some(f.name.as_str()) == planted_name),
        );
        n.found +=
            usize::from(by_size.is_some_and(|f| {
                f.delta_share.abs() >= 0.01 && Some(f.name.as_str()) == planted_name
            }));
        s.found += usize::from(sample_found);
        k.any_significant += usize::from(kiln_any);
        n.any_significant += usize::from(naive_any);
        s.any_significant += usize::from(sample_significant > 0);
    }
    let rate = |count: usize| 100.0 * count as f64 / args.trials.max(1) as f64;
    println!();
    println!("| ranking | planted function ranked #1 | planted function reported | trials with nothing planted that report a change |");
    println!("|---|---|---|---|");
    let alpha = method.alpha;
    for (name, planted, null) in [
        (
            format!("Kiln: per-profile shares, Welch, Holm (α = {alpha})"),
            &kiln,
            &kiln_null,
        ),
        (
            "naive: by the size of Δ share (a change ≥ 1 point reported)".to_string(),
            &naive,
            &naive_null,
        ),
        (
            format!("per-sample z-test, Holm (α = {alpha})"),
            &samples,
            &samples_null,
        ),
    ] {
        println!(
            "| {name} | {:.0}% ({}/{}) | {:.0}% ({}/{}) | {:.1}% ({}/{}) |",
            rate(planted.first),
            planted.first,
            args.trials,
            rate(planted.found),
            planted.found,
            args.trials,
            rate(null.any_significant),
            null.any_significant,
            args.trials
        );
    }
    println!(
        "({} comparisons in {:.2} s)",
        2 * args.trials,
        started.elapsed().as_secs_f64()
    );
    if args.watch_services > 0 {
        watch(&args, &templates).await?;
    }
    if args.speed_profiles > 0 {
        speed(&args, &templates).await?;
    }
    Ok(())
}

/// The regression watcher's look over many services with few profiles each, as ingest
/// leaves them before compaction: every 15 s a segment with one dataset (one profile) per
/// service; the first half of the segments at version 1.0, the second at 1.1.
async fn watch(args: &InsightBenchArgs, templates: &[Template]) -> anyhow::Result<()> {
    let dir = crate::common::tempfile_dir("kiln-bench-watch")?;
    let storage =
        kiln_storage::ObjectStorage::open(&format!("file://{}", dir.join("blocks").display()))?;
    let metastore = kiln_metastore::Metastore::open(&format!(
        "sqlite://{}",
        dir.join("metastore.db").display()
    ))
    .await?;
    let now_ms = kiln_model::time::now_ms();
    let start_ms = now_ms - 30 * 60_000;
    for segment in 0..args.watch_segments {
        let time_nanos = (start_ms + segment as i64 * 15_000) * 1_000_000;
        let version = if segment < args.watch_segments / 2 {
            "1.0"
        } else {
            "1.1"
        };
        let mut datasets = Vec::new();
        for service in 0..args.watch_services {
            let name = format!("svc-{service:03}");
            let labels = kiln_model::labels::Labels::from_pairs([
                ("service_name", name.clone()),
                ("version", version.to_string()),
            ]);
            let template = &templates[(segment + service) % templates.len()];
            let id = kiln_ingest::parse::new_profile_id(time_nanos);
            let mut input = template.parsed.input(1_000);
            input.id = &id;
            input.labels = &labels;
            input.time_nanos = time_nanos;
            let mut builder = DatasetBuilder::new("anonymous", &name);
            builder.add_pprof(&input);
            datasets.push(builder.finish());
        }
        let id = ulid::Ulid::new().to_string();
        let key = format!("blocks/{id}.parquet");
        let block = kiln_storage::format::encode_block(&datasets)?;
        let metas = datasets
            .iter()
            .enumerate()
            .map(|(row_group, dataset)| {
                kiln_ingest::writer::dataset_meta(dataset, &id, &key, row_group as u32)
            })
            .collect();
        let size_bytes = block.len() as u64;
        storage.put(&key, bytes::Bytes::from(block)).await?;
        metastore
            .register_block(
                kiln_metastore::BlockMeta {
                    id,
                    object_key: key,
                    level: 0,
                    size_bytes,
                    created_at_ms: now_ms,
                    deleted_at_ms: None,
                },
                metas,
            )
            .await?;
    }
    let querier = kiln_query::Querier::new(metastore, storage);
    let watcher = kiln_insight::Watcher::new(
        querier,
        kiln_insight::RegressionsConfig {
            window_ms: 60_000,
            min_profiles: 3,
            lookback_ms: 3_600_000,
            ..Default::default()
        },
    )?;
    println!();
    println!(
        "| regression watcher, {} services × {} segments of one profile each | time | findings |",
        args.watch_services, args.watch_segments
    );
    println!("|---|---|---|");
    for name in [
        "first look (reads every dataset, checks every service)",
        "next look (nothing new)",
    ] {
        let started = Instant::now();
        let found = watcher.look(now_ms).await?;
        println!(
            "| {name} | {:.0} ms | {} |",
            started.elapsed().as_secs_f64() * 1000.0,
            found.len()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// `POST /api/v1/compare` over a day a side.
async fn speed(args: &InsightBenchArgs, templates: &[Template]) -> anyhow::Result<()> {
    let data_dir = std::env::temp_dir().join(format!("kiln-bench-insight-{}", std::process::id()));
    std::fs::create_dir_all(&data_dir)?;
    let result = speed_in(args, templates, &data_dir).await;
    let _ = std::fs::remove_dir_all(&data_dir);
    result
}

async fn speed_in(
    args: &InsightBenchArgs,
    templates: &[Template],
    data_dir: &std::path::Path,
) -> anyhow::Result<()> {
    // Two sides of `speed_profiles` seconds each, in whole hours.
    let hours = ((args.speed_profiles as i64 + 3_599) / 3_600).max(1);
    let stream = StreamShape::one_instance(args.corpus.clone());
    let now = kiln_model::time::now_nanos();
    let end_nanos = now - now.rem_euclid(HOUR_NANOS);
    let started = Instant::now();
    let (written, _) = write_stream(&stream, templates, data_dir, end_nanos, 2 * hours).await?;
    println!();
    println!(
        "wrote {written} profiles (one a second, {} h; the corpus's {} in turn) in {:.1} s",
        2 * hours,
        templates
            .iter()
            .map(|template| template.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        started.elapsed().as_secs_f64()
    );
    // Samples of the right side: slot i (its second) holds template i mod n.
    let side_slots = hours as usize * 3_600;
    let samples: usize = (side_slots..2 * side_slots)
        .map(|slot| {
            templates[slot % templates.len()]
                .parsed
                .profile
                .sample
                .len()
        })
        .sum();
    println!("{samples} samples a side");
    let (mut child, url) = crate::common::start_server(data_dir)?;
    let end_ms = end_nanos / 1_000_000;
    let side_ms = hours * 3_600_000;
    let body = serde_json::json!({
        "profile_type": CPU,
        "left": {"selector": format!("{{service_name=\"{SERVICE}\"}}"), "from": end_ms - 2 * side_ms, "until": end_ms - side_ms},
        "right": {"selector": format!("{{service_name=\"{SERVICE}\"}}"), "from": end_ms - side_ms, "until": end_ms},
        "limit": 20
    });
    let agent = crate::http::Http::new(Duration::from_secs(600));
    let mut timings = Vec::new();
    let mut answer = serde_json::Value::Null;
    let outcome = (|| -> anyhow::Result<()> {
        for _ in 0..4 {
            let started = Instant::now();
            let response = agent
                .post(&format!("{url}/api/v1/compare"))
                .header("Content-Type", "application/json")
                .send_string(&body.to_string())
                .context("POST /api/v1/compare")?;
            answer = response.json()?;
            timings.push(started.elapsed().as_secs_f64());
        }
        Ok(())
    })();
    let _ = child.kill();
    let _ = child.wait();
    outcome?;
    let mut warm = timings[1..].to_vec();
    warm.sort_by(|a, b| a.total_cmp(b));
    println!(
        "| compare, {} h a side | {} + {} profiles | first {:.0} ms | warm (median of 3) {:.0} ms | {} functions tested |",
        hours,
        answer["left"]["profiles"],
        answer["right"]["profiles"],
        timings[0] * 1000.0,
        warm[1] * 1000.0,
        answer["method"]["tested"]
    );
    Ok(())
}
