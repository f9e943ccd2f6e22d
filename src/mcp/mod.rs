//! The host tools over MCP (the Model Context Protocol).
//!
//! - [`server`]: the MCP server rozd serves at `/mcp` (streamable HTTP, on
//!   the same listener and behind the same authentication and browser
//!   checks as every other route): the host tools with the schemas,
//!   categories and limits sessions get, and the latest Observation as a
//!   resource. Every call takes the host call path sessions take
//!   ([`crate::session::host_call`]).
//! - [`sessions`]: which MCP sessions exist (at most `mcp.max_sessions`),
//!   which credential opened each, what they own, and the deadman when one
//!   ends or its client disconnects.
//! - [`gate`]: in front of rmcp: request bodies, the session cap, ownership.
//! - [`config`]: the `[mcp]` section.
//!
//! `rozd mcp`, the stdio server that relays to `/mcp`, is a command-line
//! client: [`crate::cli::mcp`].

pub(crate) mod config;
pub(crate) mod gate;
pub(crate) mod server;
pub(crate) mod sessions;

use std::sync::Arc;

pub(crate) use config::McpConfig;

/// What the rest of the daemon shares with the MCP server (its calls wait
/// for approval in the host's list, [`crate::session::approvals`]).
#[derive(Debug)]
pub(crate) struct Mcp {
    pub sessions: Arc<sessions::Sessions>,
}

impl Mcp {
    pub(crate) fn new(ooda: Arc<crate::ooda::Ooda>, config: &McpConfig) -> Mcp {
        Mcp {
            sessions: Arc::new(sessions::Sessions::new(ooda, config.max_sessions)),
        }
    }
}
