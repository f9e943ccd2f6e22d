//! `[mcp]`: the MCP server at `/mcp`.

use std::time::Duration;

use serde::Deserialize;

use crate::config::types::{Invalid, within};
use crate::config::units;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct McpConfig {
    /// Serve MCP at `/mcp` on the server's listener.
    pub enabled: bool,
    /// An MCP session without any request or open stream event for this long
    /// ends (its actuators go to their safe values).
    #[serde(rename = "session_idle_secs", deserialize_with = "units::secs")]
    pub session_idle: Duration,
    /// Between SSE keep-alive comments on MCP streams and between pings to
    /// a client holding its event stream; a ping unanswered for as long
    /// means the client is gone.
    #[serde(rename = "keepalive_secs", deserialize_with = "units::secs")]
    pub keepalive: Duration,
    /// Ask a client that supports elicitation to approve a
    /// `require_confirmation` call (its user answers); `false`: only an
    /// operator over REST (`/v1/approvals`) can approve.
    pub elicitation: bool,
    /// At most this many MCP sessions exist at once. When all are taken, an
    /// idle one (no request in flight) is ended to seat a newcomer; when
    /// none is idle, `initialize` is refused with 503.
    pub max_sessions: usize,
}

impl Default for McpConfig {
    fn default() -> Self {
        McpConfig {
            enabled: true,
            session_idle: Duration::from_secs(300),
            keepalive: Duration::from_secs(15),
            elicitation: true,
            max_sessions: 64,
        }
    }
}

impl McpConfig {
    /// One line for `rozd check`.
    pub fn describe(&self) -> String {
        if !self.enabled {
            return "off".into();
        }
        format!(
            "/mcp (at most {} sessions, ended after {} s idle, keep-alive every {} s, approvals by {})",
            self.max_sessions,
            self.session_idle.as_secs(),
            self.keepalive.as_secs(),
            if self.elicitation {
                "elicitation or an operator"
            } else {
                "an operator"
            }
        )
    }
}

/// The largest `max_sessions` taken.
pub(crate) const MAX_MAX_SESSIONS: usize = 10_000;

/// Checks the section; an error names the key (`mcp.<key>`) and why.
pub(crate) fn validate(mcp: &McpConfig) -> Result<(), Invalid> {
    within(
        "mcp.session_idle_secs",
        mcp.session_idle.as_secs(),
        10..=86_400,
    )?;
    within("mcp.max_sessions", mcp.max_sessions, 1..=MAX_MAX_SESSIONS)?;
    within("mcp.keepalive_secs", mcp.keepalive.as_secs(), 1..=3600)?;
    Ok(())
}
