//! JSON-RPC 2.0 as MCP uses it: one message (or, before 2025-06-18, a batch) in, the
//! answer out, for either transport.
//!
//! Errors in a message itself (not JSON, no method, an unknown method or tool) are
//! JSON-RPC errors; a tool that ran and failed is a result with `isError`, whose text
//! the model reads and can act on, as the specification asks.

use serde_json::{json, Value};

use crate::api::Api;
use crate::{prompts, tools};

/// Protocol revisions answered, newest first: a client asking for one of them gets it,
/// any other gets the newest.
pub const PROTOCOL_VERSIONS: &[&str] = &["2025-06-18", "2025-03-26", "2024-11-05"];

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;

/// What the model is told about the server as a whole, at initialization.
const INSTRUCTIONS: &str = "Kiln is a continuous profiler: it holds CPU, memory, off-CPU and other profiles of every service over time. Start with list_services (what runs and what changed), then top_functions or flame_graph for where the time goes, compare for what changed between two ranges or versions (with p-values: trust only changes marked significant), list_regressions for what the regression watcher found per deploy, and source_lines for the hot lines of one function. Times are like now-1h, now-30m, RFC 3339 or epoch milliseconds. Every answer ends with a link to the same view in Kiln's UI.";

/// An MCP server over Kiln's API.
pub struct Server<A> {
    api: A,
}

impl<A: Api> Server<A> {
    pub fn new(api: A) -> Server<A> {
        Server { api }
    }

    /// One line of the stdio transport (a message or a batch); the line to answer, if any.
    pub async fn handle_text(&self, text: &str) -> Option<String> {
        let answer = match serde_json::from_str::<Value>(text) {
            Ok(message) => self.handle(message).await?,
            Err(err) => error(Value::Null, PARSE_ERROR, &format!("not JSON: {err}")),
        };
        Some(answer.to_string())
    }

    /// A message or a batch; `None` when nothing is to be answered (notifications, or
    /// responses to requests this server never sends).
    pub async fn handle(&self, message: Value) -> Option<Value> {
        match message {
            Value::Array(batch) => {
                let mut answers = Vec::new();
                for message in batch {
                    answers.extend(self.one(message).await);
                }
                (!answers.is_empty()).then_some(Value::Array(answers))
            }
            message => self.one(message).await,
        }
    }

    async fn one(&self, message: Value) -> Option<Value> {
        let id = message.get("id").cloned();
        let Some(method) = message.get("method").and_then(Value::as_str) else {
            // A response (to nothing this server asked) is ignored; anything else is
            // not a request.
            if message.get("result").is_some() || message.get("error").is_some() {
                return None;
            }
            return Some(error(
                id.unwrap_or(Value::Null),
                INVALID_REQUEST,
                "a request needs \"jsonrpc\": \"2.0\" and a \"method\"",
            ));
        };
        let Some(id) = id else {
            // Notifications (initialized, cancelled, ...): nothing to answer.
            tracing::debug!(method, "MCP notification");
            return None;
        };
        let params = message.get("params").cloned().unwrap_or(Value::Null);
        let result = match method {
            "initialize" => Ok(initialize(&params)),
            "ping" => Ok(json!({})),
            "tools/list" => Ok(json!({ "tools": tools::definitions() })),
            "tools/call" => self.call_tool(&params).await,
            "prompts/list" => Ok(json!({ "prompts": prompts::definitions() })),
            "prompts/get" => prompts::get(&params).map_err(|message| (INVALID_PARAMS, message)),
            _ => Err((METHOD_NOT_FOUND, format!("no method {method:?}"))),
        };
        Some(match result {
            Ok(result) => json!({ "jsonrpc": "2.0", "id": id, "result": result }),
            Err((code, message)) => error(id, code, &message),
        })
    }

    async fn call_tool(&self, params: &Value) -> Result<Value, (i64, String)> {
        let name = params.get("name").and_then(Value::as_str).ok_or((
            INVALID_PARAMS,
            "tools/call needs a tool \"name\"".to_string(),
        ))?;
        let arguments = params.get("arguments").cloned().unwrap_or(json!({}));
        if !arguments.is_object() {
            return Err((INVALID_PARAMS, "\"arguments\" must be an object".into()));
        }
        let started = std::time::Instant::now();
        let outcome = tools::call(&self.api, name, &arguments)
            .await
            .ok_or_else(|| {
                (
                    INVALID_PARAMS,
                    format!("no tool {name:?}; tools/list names them"),
                )
            })?;
        let (text, is_error) = match outcome {
            Ok(text) => (text, false),
            Err(err) => (err.to_string(), true),
        };
        tracing::debug!(
            tool = name,
            tokens = crate::budget::tokens(&text),
            is_error,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "MCP tool call"
        );
        Ok(json!({
            "content": [{ "type": "text", "text": text }],
            "isError": is_error,
        }))
    }
}

fn initialize(params: &Value) -> Value {
    let asked = params.get("protocolVersion").and_then(Value::as_str);
    let version = asked
        .and_then(|asked| PROTOCOL_VERSIONS.iter().find(|v| **v == asked))
        .unwrap_or(&PROTOCOL_VERSIONS[0]);
    json!({
        "protocolVersion": version,
        "capabilities": {
            "tools": { "listChanged": false },
            "prompts": { "listChanged": false },
        },
        "serverInfo": {
            "name": "kiln",
            "title": "Kiln continuous profiling",
            "version": env!("CARGO_PKG_VERSION"),
        },
        "instructions": INSTRUCTIONS,
    })
}

fn error(id: Value, code: i64, message: &str) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": { "code": code, "message": message },
    })
}
