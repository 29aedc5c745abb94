//! `kiln mcp`: Kiln's MCP tools over stdio, for desktop assistants (Claude Desktop,
//! Cursor, ...), calling a server's HTTP API with the token and tenant given here.
//! kiln-mcp decides every answer; this file moves lines and HTTP requests.
//!
//! Messages are newline-delimited JSON on standard input and output, as the stdio
//! transport specifies; standard output carries nothing else (logs go to standard error).

use std::time::Duration;

use anyhow::Context;
use clap::Args;
use kiln_mcp::{ApiError, ApiRequest, ApiResponse};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

#[derive(Args)]
pub struct McpArgs {
    #[command(flatten)]
    server: crate::query::ServerAddress,
    /// How long one API call may take.
    #[arg(long, default_value = "60", value_name = "SECONDS")]
    timeout: u64,
}

/// The largest API answer read.
const MAX_ANSWER_BYTES: usize = 256 << 20;

struct HttpApi {
    url: String,
    tenant: Option<String>,
    authorization: Option<String>,
    http: reqwest::Client,
}

impl kiln_mcp::Api for HttpApi {
    async fn call(&self, request: ApiRequest) -> Result<ApiResponse, ApiError> {
        let url = format!("{}{}", self.url, request.path);
        let mut http = match &request.body {
            Some(body) => self
                .http
                .post(&url)
                .header("Content-Type", "application/json")
                .body(body.to_string()),
            None => self.http.get(&url),
        };
        if let Some(tenant) = &self.tenant {
            http = http.header("X-Scope-OrgID", tenant);
        }
        if let Some(authorization) = &self.authorization {
            http = http.header("Authorization", authorization);
        }
        let mut response = http
            .send()
            .await
            .map_err(|err| ApiError::Unreachable(format!("{url}: {err}")))?;
        let status = response.status().as_u16();
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|err| ApiError::Unreachable(format!("{url}: {err}")))?
        {
            if body.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(ApiError::TooLarge(MAX_ANSWER_BYTES));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(ApiResponse { status, body })
    }

    fn ui_base(&self) -> &str {
        &self.url
    }
}

pub async fn run(args: McpArgs) -> anyhow::Result<()> {
    let server = args.server;
    let api = HttpApi {
        url: server.url.trim_end_matches('/').to_string(),
        tenant: server.tenant.clone(),
        authorization: server.auth.authorization()?,
        http: server
            .auth
            .asynchronous(Duration::from_secs(args.timeout))?,
    };
    tracing::info!(url = %api.url, "MCP over stdio");
    let server = kiln_mcp::Server::new(api);
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut stdout = tokio::io::stdout();
    while let Some(line) = lines
        .next_line()
        .await
        .context("cannot read standard input")?
    {
        if line.trim().is_empty() {
            continue;
        }
        if let Some(answer) = server.handle_text(&line).await {
            stdout.write_all(answer.as_bytes()).await?;
            stdout.write_all(b"\n").await?;
            stdout.flush().await?;
        }
    }
    Ok(())
}
