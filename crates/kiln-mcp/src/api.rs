//! How a tool reaches Kiln's HTTP API: over the network for `kiln mcp`, in process for a
//! server's `/mcp`. Requests and answers are JSON bodies; the implementation adds the
//! credentials.

use std::future::Future;

use serde_json::Value;

/// A call to the API: `GET` when there is no body, `POST` with a JSON body otherwise.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiRequest {
    /// Path and query string, e.g. `/api/v1/overview?from=now-1h`.
    pub path: String,
    pub body: Option<Value>,
}

impl ApiRequest {
    pub fn get(path: impl Into<String>) -> ApiRequest {
        ApiRequest {
            path: path.into(),
            body: None,
        }
    }

    pub fn post(path: impl Into<String>, body: Value) -> ApiRequest {
        ApiRequest {
            path: path.into(),
            body: Some(body),
        }
    }
}

#[derive(Debug, Clone)]
pub struct ApiResponse {
    pub status: u16,
    pub body: Vec<u8>,
}

/// The API could not be asked at all (a refusal is an [`ApiResponse`] with its status).
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("cannot reach Kiln: {0}")]
    Unreachable(String),
    #[error("Kiln's answer is too large ({0} bytes)")]
    TooLarge(usize),
}

/// Kiln's HTTP API, with the caller's credentials.
pub trait Api: Send + Sync {
    fn call(
        &self,
        request: ApiRequest,
    ) -> impl Future<Output = Result<ApiResponse, ApiError>> + Send;

    /// Where the UI is, for links: `http://kiln:4040`, or empty for links relative to the
    /// server that answered.
    fn ui_base(&self) -> &str;
}

/// Why a tool failed, told to the model as the tool's result (MCP's `isError`), in words
/// it can act on.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The arguments are wrong: the message says which and how.
    #[error("{0}")]
    Arguments(String),
    /// The API refused the call.
    #[error("Kiln answered {status}: {message}")]
    Refused { status: u16, message: String },
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The API's answer was not what this tool reads.
    #[error("unexpected answer from {path}: {message}")]
    Unexpected { path: String, message: String },
    /// Nothing matched, with what might have been meant.
    #[error("{0}")]
    Empty(String),
}

/// The message of an API error body: `{"message": ...}` (Connect), `{"error": ...}`, or the
/// text itself.
fn message_of(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    if let Ok(value) = serde_json::from_slice::<Value>(body) {
        for key in ["message", "error"] {
            if let Some(message) = value.get(key).and_then(Value::as_str) {
                return message.to_string();
            }
        }
    }
    text.trim().chars().take(500).collect()
}

/// Calls the API and reads a JSON answer; a status outside 2xx is a [`ToolError::Refused`].
pub async fn json(api: &impl Api, request: ApiRequest) -> Result<Value, ToolError> {
    let path = request.path.clone();
    let response = api.call(request).await?;
    if !(200..300).contains(&response.status) {
        return Err(ToolError::Refused {
            status: response.status,
            message: message_of(&response.body),
        });
    }
    serde_json::from_slice(&response.body).map_err(|err| ToolError::Unexpected {
        path,
        message: err.to_string(),
    })
}

/// Percent-encodes a query string value.
pub fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(byte as char)
            }
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_give_their_message() {
        assert_eq!(
            message_of(br#"{"code":"invalid_argument","message":"bad"}"#),
            "bad"
        );
        assert_eq!(message_of(br#"{"error":"no"}"#), "no");
        assert_eq!(message_of(b"plain text\n"), "plain text");
    }

    #[test]
    fn query_values_are_encoded() {
        assert_eq!(encode(r#"{a="b c"}"#), "%7Ba%3D%22b%20c%22%7D");
        assert_eq!(encode("now-1h"), "now-1h");
    }
}
