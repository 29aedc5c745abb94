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
    let http = args
        .server
        .auth
        .blocking(std::time::Duration::from_secs(600))?;
    let mut request = match &args.command {
        RulesCommand::List => http.get(&base),
        RulesCommand::Backfill { rule, from, until } => http
            .post(format!("{base}/{rule}/backfill"))
            .query(&[("from", from), ("until", until)]),
    };
    if let Some(tenant) = &args.server.tenant {
        request = request.header("X-Scope-OrgID", tenant);
    }
    if let Some(authorization) = args.server.auth.authorization()? {
        request = request.header("Authorization", authorization);
    }
    let response = request
        .send()
        .with_context(|| format!("cannot reach {base}"))?;
    if !response.status().is_success() {
        let status = response.status().as_u16();
        let text = response.text().unwrap_or_default();
        bail!("HTTP {status}: {}", text.trim())
    }
    let text = response.text().context("cannot read the server's answer")?;
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
