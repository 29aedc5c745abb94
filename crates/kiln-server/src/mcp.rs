//! `/mcp`: the Model Context Protocol's Streamable HTTP transport, for assistants that
//! reach Kiln over the network. kiln-mcp decides what every tool answers; this file
//! carries messages, and lets the tools call the API through this server's own router.
//!
//! Each POST holds one JSON-RPC message (or a batch) and is answered with one JSON body;
//! nothing is streamed and no session is kept (the transport makes both optional), so
//! `GET` (a stream of server-initiated messages) is refused with 405, as the transport
//! says. A tool's calls go through the router with the credentials of the request that
//! carried it, so they meet the same auth, tenancy and per-tenant query limits as any
//! API call; `/mcp` itself takes no query slot, or a tenant allowed one query at a time
//! would wait on itself.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Router};
use http_body_util::BodyExt;
use kiln_mcp::{ApiError, ApiRequest, ApiResponse, PROTOCOL_VERSIONS};
use tower::ServiceExt;

use crate::auth::ClientAddr;

/// The largest API answer a tool reads (a whole merged tree of a large profile).
const MAX_ANSWER_BYTES: usize = 256 << 20;

/// The headers a tool's API calls carry over from the request that carried the call.
const FORWARDED: [HeaderName; 2] = [
    header::AUTHORIZATION,
    HeaderName::from_static("x-scope-orgid"),
];

#[derive(Clone)]
pub struct McpState {
    /// Every other route, with its layers: what the tools call.
    pub api: Router,
    /// Whether this listener serves TLS, for the links in answers.
    pub secure: bool,
}

/// The API as one call's credentials reach it.
struct RouterApi {
    router: Router,
    headers: HeaderMap,
    /// The caller's address, which auth's lockouts count by.
    client: Option<ClientAddr>,
    base: String,
}

impl kiln_mcp::Api for RouterApi {
    async fn call(&self, request: ApiRequest) -> Result<ApiResponse, ApiError> {
        let mut builder = Request::builder().uri(&request.path);
        for name in &FORWARDED {
            if let Some(value) = self.headers.get(name) {
                builder = builder.header(name, value);
            }
        }
        let body = match &request.body {
            Some(body) => {
                builder = builder
                    .method(Method::POST)
                    .header(header::CONTENT_TYPE, "application/json");
                Body::from(body.to_string())
            }
            None => {
                builder = builder.method(Method::GET);
                Body::empty()
            }
        };
        if let Some(client) = &self.client {
            builder = builder.extension(*client);
        }
        let call = builder
            .body(body)
            .map_err(|err| ApiError::Unreachable(format!("cannot build the request: {err}")))?;
        let response = match self.router.clone().oneshot(call).await {
            Ok(response) => response,
            Err(never) => match never {},
        };
        let status = response.status().as_u16();
        let body = http_body_util::Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|_| ApiError::TooLarge(MAX_ANSWER_BYTES))?
            .to_bytes();
        Ok(ApiResponse {
            status,
            body: body.to_vec(),
        })
    }

    fn ui_base(&self) -> &str {
        &self.base
    }
}

fn refuse(status: StatusCode, message: &str) -> Response {
    (status, format!("{message}\n")).into_response()
}

/// One message (or batch) in, its answer out; 202 when it needs none.
pub async fn call(
    State(mcp): State<McpState>,
    client: Option<Extension<ClientAddr>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let host = headers
        .get(header::HOST)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("localhost")
        .to_string();
    // DNS rebinding: a page elsewhere must not drive a browser at this server.
    if let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        let origin_host = origin.split("://").nth(1).unwrap_or(origin);
        if origin_host != host.as_str() {
            return refuse(
                StatusCode::FORBIDDEN,
                &format!("Origin {origin} is not this server ({host})"),
            );
        }
    }
    if let Some(version) = headers
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok())
    {
        if !PROTOCOL_VERSIONS.contains(&version) {
            return refuse(
                StatusCode::BAD_REQUEST,
                &format!(
                    "MCP-Protocol-Version {version} is not supported; this server speaks {}",
                    PROTOCOL_VERSIONS.join(", ")
                ),
            );
        }
    }
    let json_body = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !json_body {
        return refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "an MCP message is a JSON-RPC message: Content-Type: application/json",
        );
    }
    let scheme = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .unwrap_or(if mcp.secure { "https" } else { "http" })
        .to_string();
    let api = RouterApi {
        router: mcp.api,
        headers,
        client: client.map(|Extension(client)| client),
        base: format!("{scheme}://{host}"),
    };
    let server = kiln_mcp::Server::new(api);
    let text = String::from_utf8_lossy(&body);
    match server.handle_text(&text).await {
        None => StatusCode::ACCEPTED.into_response(),
        Some(answer) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            answer,
        )
            .into_response(),
    }
}

/// `GET` and `DELETE`: no stream to open and no session to end.
pub async fn no_stream() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::ALLOW, "POST")],
        "this MCP server answers each POST with JSON and opens no stream\n",
    )
        .into_response()
}
