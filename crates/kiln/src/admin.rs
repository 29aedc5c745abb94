//! `kiln admin blocks list|inspect`: what is stored, read straight from the metastore and
//! object storage a server uses (the same URLs and defaults as `kiln server`).

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use kiln_metastore::{DatasetQuery, Metastore};
use kiln_node::ServerConfig;
use kiln_storage::format::{decode_dataset, Projection};
use kiln_storage::ObjectStorage;

#[derive(Args)]
pub struct AdminArgs {
    /// Data directory of the server [default: ./kiln-data].
    #[arg(long, env = "KILN_DATA_DIR", global = true)]
    data_dir: Option<PathBuf>,
    /// Object store URL [default: file://<data-dir>/blocks].
    #[arg(long, env = "KILN_OBJECT_STORE", global = true)]
    object_store: Option<String>,
    /// Metastore URL [default: sqlite://<data-dir>/metastore.db].
    #[arg(long, env = "KILN_METASTORE", global = true)]
    metastore: Option<String>,
    #[command(subcommand)]
    command: AdminCommand,
}

#[derive(Subcommand)]
enum AdminCommand {
    /// Blocks and the datasets inside them.
    Blocks {
        #[command(subcommand)]
        command: BlocksCommand,
    },
}

#[derive(Subcommand)]
enum BlocksCommand {
    /// Every block: level, size, datasets, time range; tombstoned ones marked.
    List,
    /// One block's datasets with their series, profile, sample and symbol counts.
    Inspect {
        /// Block id (a ULID, as `list` shows).
        id: String,
    },
}

fn rfc3339(nanos: i64) -> String {
    kiln_model::time::format_rfc3339(nanos)
}

pub async fn run(args: AdminArgs) -> anyhow::Result<()> {
    let mut config = ServerConfig::default();
    if let Some(dir) = args.data_dir {
        config.data_dir = dir;
    }
    if let Some(url) = args.object_store {
        config.object_store = url;
    }
    if let Some(url) = args.metastore {
        config.metastore = url;
    }
    let metastore = Metastore::open(&config.metastore_url())
        .await
        .with_context(|| {
            format!(
                "cannot open the metastore {}",
                kiln_metastore::redact_url(&config.metastore_url())
            )
        })?;
    let blocks = metastore.list_blocks().await?;
    // Every dataset of every tenant, by block.
    let mut datasets = Vec::new();
    for tenant in metastore.tenants().await? {
        datasets.extend(
            metastore
                .list_datasets(DatasetQuery {
                    tenant,
                    service: None,
                    from_nanos: i64::MIN,
                    to_nanos: i64::MAX,
                })
                .await?,
        );
    }
    let AdminCommand::Blocks { command } = args.command;
    match command {
        BlocksCommand::List => {
            println!(
                "{:<26}  {:>5}  {:>12}  {:>8}  {:>9}  {:<30}  {:<30}  state",
                "block", "level", "bytes", "datasets", "profiles", "from", "to"
            );
            for block in &blocks {
                let inside: Vec<_> = datasets.iter().filter(|d| d.block_id == block.id).collect();
                let from = inside.iter().map(|d| d.min_time_nanos).min();
                let to = inside.iter().map(|d| d.max_time_nanos).max();
                println!(
                    "{:<26}  {:>5}  {:>12}  {:>8}  {:>9}  {:<30}  {:<30}  {}",
                    block.id,
                    block.level,
                    block.size_bytes,
                    inside.len(),
                    inside.iter().map(|d| d.profile_count).sum::<u64>(),
                    from.map_or("-".to_string(), rfc3339),
                    to.map_or("-".to_string(), rfc3339),
                    if block.deleted_at_ms.is_some() {
                        "tombstoned"
                    } else {
                        "live"
                    }
                );
            }
            let live: Vec<_> = blocks
                .iter()
                .filter(|b| b.deleted_at_ms.is_none())
                .collect();
            println!(
                "{} blocks ({} live, {} bytes live), {} datasets",
                blocks.len(),
                live.len(),
                live.iter().map(|b| b.size_bytes).sum::<u64>(),
                datasets.len()
            );
        }
        BlocksCommand::Inspect { id } => {
            let block = blocks
                .iter()
                .find(|block| block.id == id)
                .with_context(|| format!("no block {id}"))?;
            println!(
                "block {} level {} key {} bytes {}",
                block.id, block.level, block.object_key, block.size_bytes
            );
            let storage = ObjectStorage::open_with(
                &config.object_store_url(),
                &config.object_store_options(),
            )?;
            let bytes = storage.get(&block.object_key).await?;
            println!(
                "compression {}",
                kiln_storage::format::block_compression(&bytes)?.join(", ")
            );
            let split = kiln_storage::format::dataset_bytes(&bytes)?;
            for meta in datasets.iter().filter(|d| d.block_id == block.id) {
                let dataset = decode_dataset(&bytes, meta.row_group as usize, Projection::ALL)?;
                println!(
                    "dataset {} tenant {} service {}: {} .. {}",
                    meta.row_group,
                    dataset.tenant,
                    dataset.service,
                    rfc3339(dataset.min_time_nanos),
                    rfc3339(dataset.max_time_nanos)
                );
                println!(
                    "  series {}  profiles {}  samples {}  sample labels {}  stack sums {}",
                    dataset.series.len(),
                    dataset.profiles.len(),
                    dataset.sample_value.len(),
                    dataset.sample_label_sample.len(),
                    dataset.stack_sum_value.len()
                );
                println!(
                    "  strings {}  mappings {}  functions {}  locations {}  stack nodes {}",
                    dataset.strings.len(),
                    dataset.mappings.len(),
                    dataset.functions.len(),
                    dataset.location_mapping.len(),
                    dataset.stack_parent.len()
                );
                if let Some(stored) = split.get(meta.row_group as usize) {
                    println!(
                        "  bytes stored: symbols {}  profiles and samples {}",
                        stored.symbols, stored.profiles
                    );
                }
                for profile_type in &meta.profile_types {
                    println!("  type {profile_type}");
                }
            }
        }
    }
    Ok(())
}
