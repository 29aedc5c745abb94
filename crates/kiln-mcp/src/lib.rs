//! Kiln for AI assistants: a Model Context Protocol server whose tools answer "what uses
//! the CPU, what changed, where, and how sure is that", in a few hundred tokens each.
//!
//! # Every number is the HTTP API's
//!
//! A tool is a translation: it calls Kiln's own HTTP API (the querier, `/api/v1/compare`,
//! `/api/v1/lines`, ...) and writes what came back as text for a model. It computes no
//! figure the API does not give, beyond sums and shares of what the API returned, so an
//! answer and its API twin agree by construction, and the tests check that they do. The
//! [`Api`] trait is how a tool reaches the API:
//!
//! - `kiln mcp --url URL` (stdio, for desktop assistants) sends HTTP requests to a server,
//!   with the token and tenant it was started with;
//! - a server's own `/mcp` (Streamable HTTP) sends them through its own router, in
//!   process, with the credentials of the request that carried the call. Auth, tenancy
//!   and the per-tenant query limits are then the API's own, with nothing to keep in step.
//!
//! # Bounded answers
//!
//! An assistant's context is the scarce thing. Every answer is plain text, rows of a table
//! or lines of an indented tree, within a budget: [`budget::DEFAULT_TOKENS`] tokens, counted
//! as characters / 4 (the usual estimate for English and code), widened by the tool's
//! `limit` or `max_nodes` argument. What does not fit is never dropped silently: the rows
//! or subtrees cut are summed into one line that says how many and how much weight
//! ("… 41 more functions: 3.2 % of self"), so shares always add up. Every answer ends with
//! a link into Kiln's UI showing the same view, for the human to check.
//!
//! # The protocol, written here
//!
//! MCP is JSON-RPC 2.0; a server of tools and prompts needs `initialize`, `ping`,
//! `tools/list`, `tools/call`, `prompts/list` and `prompts/get`. [`Server`] answers those in
//! one function used by both transports. It keeps no session: each call carries all it
//! needs (the Streamable HTTP transport's session id is optional and not issued), so any
//! query node behind a load balancer can answer any call, with no sticky sessions. The
//! official Rust SDK (rmcp) brings a macro layer, schemars and a session store for the
//! same five methods; the schemas here are written by hand anyway, since their
//! descriptions are what a model reads.

pub mod api;
pub mod budget;
mod prompts;
mod protocol;
mod tools;
pub mod units;

pub use api::{Api, ApiError, ApiRequest, ApiResponse};
pub use protocol::{Server, PROTOCOL_VERSIONS};
