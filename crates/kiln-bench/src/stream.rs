//! A synthetic history written straight into blocks: one service's (or several
//! services') CPU profiles, taken from the corpus, every `interval` seconds for days. The
//! query and insight benches read it back; writing it through HTTP would take hours.

use std::path::{Path, PathBuf};

use anyhow::bail;
use kiln_ingest::parse::{from_pprof, new_profile_id, ProfileContext};
use kiln_ingest::ParsedProfile;
use kiln_metastore::{BlockMeta, Metastore};
use kiln_model::labels::Labels;
use kiln_storage::format::{encode_block_as, BlockEncoding};
use kiln_storage::{DatasetBuilder, ObjectStorage};

/// The shape of a written stream: which profiles, how many services and instances, how
/// often.
#[derive(Clone, Debug)]
pub struct StreamShape {
    pub corpus: PathBuf,
    pub instances: usize,
    pub services: usize,
    /// Seconds between two profiles of one instance.
    pub interval: i64,
    /// Leave out corpus files larger than this (bytes).
    pub max_file_bytes: usize,
    /// Write each block's stack sums, as compaction does.
    pub stack_sums: bool,
}

impl StreamShape {
    /// One instance of one service sending a profile every second.
    pub fn one_instance(corpus: PathBuf) -> Self {
        StreamShape {
            corpus,
            instances: 1,
            services: 1,
            interval: 1,
            max_file_bytes: 200_000,
            stack_sums: true,
        }
    }
}

pub const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

pub const SERVICE: &str = "bench-service";

pub const HOUR_NANOS: i64 = 3_600 * 1_000_000_000;

pub struct Template {
    pub name: String,
    pub bytes: Vec<u8>,
    pub parsed: ParsedProfile,
}

/// Every CPU profile of the corpus (`process_cpu:cpu:nanoseconds`), of any sample types.
pub fn cpu_templates(corpus: &Path, max_file_bytes: usize) -> anyhow::Result<Vec<Template>> {
    let mut templates = Vec::new();
    // Corpus files carry their recording times, years old: no retention here.
    let limits = kiln_ingest::Limits {
        max_samples_per_profile: usize::MAX,
        retention_days: 0,
        ..Default::default()
    };
    for (name, bytes, profile) in crate::common::corpus_pprofs(corpus, max_file_bytes)? {
        let Ok(parsed) = from_pprof(profile, ProfileContext::default(), bytes.len(), &limits)
        else {
            continue;
        };
        if parsed
            .types
            .iter()
            .any(|plan| plan.profile_type.id() == CPU)
        {
            templates.push(Template {
                name,
                bytes,
                parsed,
            });
        }
    }
    Ok(templates)
}

pub fn load_templates(args: &StreamShape) -> anyhow::Result<Vec<Template>> {
    let templates = cpu_templates(&args.corpus, args.max_file_bytes)?;
    // go tool pprof merges only profiles with the same sample types: keep the group that
    // shares them with the most bytes of profile (the heaviest, most realistic stream), as
    // one service's profiles would.
    let signature = |template: &Template| -> Vec<String> {
        let profile = &template.parsed.profile;
        profile
            .sample_type
            .iter()
            .chain(profile.period_type.iter())
            .map(|value_type| {
                format!(
                    "{}/{}",
                    profile.string_or_empty(value_type.r#type),
                    profile.string_or_empty(value_type.unit)
                )
            })
            .collect()
    };
    let mut groups: std::collections::BTreeMap<Vec<String>, Vec<Template>> = Default::default();
    for template in templates {
        if template.parsed.profile.sample.is_empty() {
            continue;
        }
        groups
            .entry(signature(&template))
            .or_default()
            .push(template);
    }
    let weight = |group: &Vec<Template>| -> usize {
        group.iter().map(|template| template.bytes.len()).sum()
    };
    let Some(group) = groups.into_values().max_by_key(weight) else {
        bail!("no {CPU} profiles in {}", args.corpus.display());
    };
    Ok(group)
}

/// The name of service `index` of the stream: the first is [`SERVICE`].
fn service_name(index: usize) -> String {
    if index == 0 {
        SERVICE.to_string()
    } else {
        format!("{SERVICE}-{index}")
    }
}

/// Writes one block per service and hour (in parallel on every core) and registers each.
pub async fn write_stream(
    args: &StreamShape,
    templates: &[Template],
    data_dir: &Path,
    end_nanos: i64,
    hours: i64,
) -> anyhow::Result<(usize, u64)> {
    let storage = ObjectStorage::open(&format!("file://{}", data_dir.join("blocks").display()))?;
    let metastore = Metastore::open(&format!(
        "sqlite://{}",
        data_dir.join("metastore.db").display()
    ))
    .await?;
    let start_nanos = end_nanos - hours * HOUR_NANOS;
    let interval_nanos = args.interval * 1_000_000_000;
    let services: Vec<String> = (0..args.services.max(1)).map(service_name).collect();
    let instance_labels: Vec<Vec<Labels>> = services
        .iter()
        .map(|service| {
            (0..args.instances)
                .map(|instance| {
                    Labels::from_pairs([
                        ("service_name", service.clone()),
                        ("instance", format!("instance-{instance:02}")),
                    ])
                })
                .collect()
        })
        .collect();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut profiles = 0usize;
    let mut bytes_written = 0u64;
    // One block per service and hour, as compaction leaves them.
    let units: Vec<(i64, usize)> = (0..hours)
        .flat_map(|hour| (0..services.len()).map(move |service| (hour, service)))
        .collect();
    for chunk in units.chunks(cores) {
        let blocks: Vec<anyhow::Result<(Vec<u8>, kiln_metastore::DatasetMeta, usize)>> =
            std::thread::scope(|scope| {
                let handles: Vec<_> = chunk
                    .iter()
                    .map(|(hour, service)| {
                        let instance_labels = &instance_labels[*service];
                        let name = &services[*service];
                        scope.spawn(move || -> anyhow::Result<_> {
                            let hour_start = start_nanos + hour * HOUR_NANOS;
                            let mut builder = DatasetBuilder::new("anonymous", name);
                            let mut count = 0usize;
                            let mut time = hour_start;
                            while time < hour_start + HOUR_NANOS {
                                let slot = ((time - start_nanos) / interval_nanos) as usize;
                                for (instance, labels) in instance_labels.iter().enumerate() {
                                    let template =
                                        &templates[(slot + instance + service) % templates.len()];
                                    let id = new_profile_id(time);
                                    let mut input = template.parsed.input(1_000);
                                    input.id = &id;
                                    input.labels = labels;
                                    input.time_nanos = time;
                                    input.duration_nanos = interval_nanos;
                                    builder.add_pprof(&input);
                                    count += 1;
                                }
                                time += interval_nanos;
                            }
                            let mut dataset = builder.finish();
                            if args.stack_sums {
                                dataset.sum_stacks_if_smaller();
                            }
                            let id = ulid::Ulid::new().to_string();
                            let key = format!("blocks/{id}.parquet");
                            let meta = kiln_ingest::writer::dataset_meta(&dataset, &id, &key, 0);
                            let block = encode_block_as(
                                std::slice::from_ref(&dataset),
                                BlockEncoding::Compacted,
                            )?;
                            Ok((block, meta, count))
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|handle| {
                        handle
                            .join()
                            .unwrap_or_else(|_| Err(anyhow::anyhow!("block builder panicked")))
                    })
                    .collect()
            });
        for block in blocks {
            let (block, meta, count) = block?;
            bytes_written += block.len() as u64;
            let size_bytes = block.len() as u64;
            storage
                .put(&meta.object_key, bytes::Bytes::from(block))
                .await?;
            metastore
                .register_block(
                    BlockMeta {
                        id: meta.block_id.clone(),
                        object_key: meta.object_key.clone(),
                        level: 2,
                        size_bytes,
                        created_at_ms: end_nanos / 1_000_000,
                        deleted_at_ms: None,
                    },
                    vec![meta],
                )
                .await?;
            profiles += count;
        }
    }
    Ok((profiles, bytes_written))
}
