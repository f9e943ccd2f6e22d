//! `[foxglove]`: the live view over the Foxglove WebSocket protocol at
//! `/foxglove` on the server's listener.

use serde::Deserialize;

use crate::config::types::{Invalid, within};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FoxgloveConfig {
    /// Serve `/foxglove`.
    pub enabled: bool,
    /// Also serve `/foxglove` (and nothing else) on this address of its
    /// own, for setups that expect `ws://host:8765`; same TLS and credentials.
    pub listen: Option<std::net::SocketAddr>,
    /// At most this many Foxglove clients at once; more are refused at the
    /// handshake (503).
    pub max_clients: usize,
    /// Messages queued for one client at most; beyond, new messages for it
    /// are dropped (counted), never waited for.
    pub send_buffer: usize,
    /// At most this many messages per second on one sampled stream to one
    /// client (events are never thinned: see `policy::rate_limited`).
    pub max_hz: f64,
    /// A message larger than this (KiB) is not sent (counted); a client's
    /// own messages are limited to 64 KiB.
    pub max_message_kb: usize,
    /// A client that does not take a frame within this long is disconnected.
    #[serde(
        rename = "send_timeout_secs",
        deserialize_with = "crate::config::units::secs"
    )]
    pub send_timeout: std::time::Duration,
}

impl Default for FoxgloveConfig {
    fn default() -> Self {
        FoxgloveConfig {
            enabled: true,
            listen: None,
            max_clients: 8,
            send_buffer: 256,
            max_hz: 20.0,
            max_message_kb: 1024,
            send_timeout: std::time::Duration::from_secs(10),
        }
    }
}

impl FoxgloveConfig {
    /// One line for `rozd check`.
    pub fn describe(&self) -> String {
        if !self.enabled {
            return "off".into();
        }
        let own = self
            .listen
            .map(|a| format!(", also on {a}"))
            .unwrap_or_default();
        format!(
            "/foxglove{own} (at most {} clients, {} messages queued each, {} Hz per channel, {} KiB per message)",
            self.max_clients, self.send_buffer, self.max_hz, self.max_message_kb
        )
    }

    /// The shortest time between two messages of one channel to one client.
    pub fn every(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(1.0 / self.max_hz)
    }
}

/// Checks the section; an error names the key (`foxglove.<key>`) and why.
pub(crate) fn validate(c: &FoxgloveConfig) -> Result<(), Invalid> {
    within("foxglove.max_clients", c.max_clients, 1..=1000)?;
    within("foxglove.send_buffer", c.send_buffer, 1..=65_536)?;
    // Not a number and infinities are outside every range.
    within("foxglove.max_hz", c.max_hz, 0.1..=1000.0)?;
    within("foxglove.max_message_kb", c.max_message_kb, 1..=65_536)?;
    within(
        "foxglove.send_timeout_secs",
        c.send_timeout.as_secs(),
        1..=3600,
    )?;
    Ok(())
}
