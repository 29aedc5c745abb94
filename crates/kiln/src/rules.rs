//! `kiln rules`: list a server's recording rules and backfill one over stored profiles.
//! The server does the work (`/api/v1/recording-rules`); this only calls it.

use anyhow::{bail, Context};
use clap::{Args, Subcommand};

#[derive(Args)]
pub struct RulesArgs {
    #[command(flatten)]
    server: crate::query::ServerAddress,
    #[command(subcommand)]
    command: RulesCommand,
}

#[derive(Subcommand)]
enum RulesCommand {
    /// Every rule of the tenant, as JSON.
    List,
    /// Export a rule over profiles stored before it existed. Each range is exported
    /// once: a range overlapping an earlier backfill is refused.
    Backfill {
        /// The rule's name (its metric_name).
        #[arg(long)]
        rule: String,
        /// Start: RFC 3339, epoch seconds, or relative (now-7d).
        #[arg(long)]
        from: String,
        /// End (exclusive); capped at the time the rule began exporting live.
        #[arg(long, default_value = "now")]
        until: String,
    },
}

pub fn run(args: RulesArgs) -> anyhow::Result<std::process::ExitCode> {
    let base = format!(
        "{}/api/v1/recording-rules",
        args.server.url.trim_end_matches('/')
    );
    let agent = ureq::AgentBuilder::new()
        .timeout(std::time::Duration::from_secs(600))
        .build();
    let request = match &args.command {
        RulesCommand::List => agent.get(&base),
        RulesCommand::Backfill { rule, from, until } => agent
            .post(&format!("{base}/{rule}/backfill"))
            .query("from", from)
            .query("until", until),
    };
    let request = match &args.server.tenant {
        Some(tenant) => request.set("X-Scope-OrgID", tenant),
        None => request,
    };
    let response = match request.call() {
        Ok(response) => response,
        Err(ureq::Error::Status(status, response)) => {
            let text = response.into_string().unwrap_or_default();
            bail!("HTTP {status}: {}", text.trim())
        }
        Err(err) => return Err(err).with_context(|| format!("cannot reach {base}")),
    };
    let text = response
        .into_string()
        .context("cannot read the server's answer")?;
    let body: serde_json::Value =
        serde_json::from_str(&text).context("the server's answer is not JSON")?;
    match args.command {
        RulesCommand::List => println!("{}", serde_json::to_string_pretty(&body)?),
        RulesCommand::Backfill { .. } => println!(
            "backfilled {} over [{}, {}) ms: {} samples in {} series, total {}",
            body["rule"].as_str().unwrap_or("?"),
            body["from_ms"],
            body["until_ms"],
            body["samples"],
            body["series"],
            body["total"]
        ),
    }
    Ok(std::process::ExitCode::SUCCESS)
}
