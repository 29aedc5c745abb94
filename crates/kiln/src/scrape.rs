//! `kiln scrape`: the scraper alone, pushing what it collects to a remote Kiln through
//! the push API (`push.v1.PusherService/Push`), as a sidecar or a job beside the
//! services. Pull is translated into push by the same scrape code the server runs
//! in-process; only the sink differs.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use kiln_ingest::push::{LabelPair, PushRequest, RawProfileSeries, RawSample};
use kiln_scrape::{ScrapeConfig, ScrapeManager, ScrapedProfile, Sink};
use prost::Message;

#[derive(Args)]
pub struct ScrapeArgs {
    /// YAML file with a `scrape_configs:` section (a server's kiln.yaml works too).
    #[arg(long, env = "KILN_CONFIG")]
    config: PathBuf,
    /// Kiln to push to, e.g. http://kiln:4040.
    #[arg(long, env = "KILN_PUSH_URL")]
    push_url: String,
    /// Tenant for jobs that name none (sent as X-Scope-OrgID).
    #[arg(long, env = "KILN_TENANT")]
    tenant: Option<String>,
    #[command(flatten)]
    auth: crate::client::ClientAuth,
}

#[derive(serde::Deserialize)]
struct ScrapeFile {
    #[serde(default)]
    scrape_configs: Vec<ScrapeConfig>,
}

pub async fn run(args: ScrapeArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.config)
        .with_context(|| format!("cannot read {}", args.config.display()))?;
    let file: ScrapeFile = yaml_serde::from_str(&text)
        .with_context(|| format!("invalid config {}", args.config.display()))?;
    if file.scrape_configs.is_empty() {
        anyhow::bail!("{} has no scrape_configs", args.config.display());
    }
    let url = format!(
        "{}/push.v1.PusherService/Push",
        args.push_url.trim_end_matches('/')
    );
    let client = args.auth.asynchronous(Duration::from_secs(60))?;
    let sink = push_sink(client, url, args.tenant, args.auth.authorization()?);
    let manager = ScrapeManager::new(file.scrape_configs, sink)?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let task = manager.spawn(stopped)?;
    tracing::info!(push_url = %args.push_url, "scraping");
    tokio::signal::ctrl_c().await?;
    let _ = stop.send(true);
    let _ = task.await;
    Ok(())
}

/// One Push per profile, with the scraped labels and the profile kind as `__name__`.
fn push_sink(
    client: reqwest::Client,
    url: String,
    default_tenant: Option<String>,
    authorization: Option<String>,
) -> Sink {
    Arc::new(move |scraped: ScrapedProfile| {
        let (client, url) = (client.clone(), url.clone());
        let authorization = authorization.clone();
        let tenant = scraped.tenant.clone().or_else(|| default_tenant.clone());
        Box::pin(async move {
            let mut profile = scraped.profile;
            profile.time_nanos = scraped.time_nanos;
            profile.duration_nanos = scraped.duration_nanos;
            let mut labels: Vec<LabelPair> = scraped
                .labels
                .into_iter()
                .map(|(name, value)| LabelPair { name, value })
                .collect();
            labels.push(LabelPair {
                name: "__name__".into(),
                value: scraped.kind,
            });
            let request = PushRequest {
                series: vec![RawProfileSeries {
                    labels,
                    samples: vec![RawSample {
                        raw_profile: profile.encode_to_vec(),
                        id: String::new(),
                    }],
                }],
            };
            let mut post = client
                .post(&url)
                .header("Content-Type", "application/proto")
                .body(request.encode_to_vec());
            if let Some(tenant) = tenant {
                post = post.header("X-Scope-OrgID", tenant);
            }
            if let Some(authorization) = authorization {
                post = post.header("Authorization", authorization);
            }
            let response = post
                .send()
                .await
                .map_err(|err| format!("push failed: {err}"))?;
            if !response.status().is_success() {
                let status = response.status();
                let body = response.text().await.unwrap_or_default();
                return Err(format!("push answered {status}: {body}"));
            }
            Ok(())
        })
    })
}
