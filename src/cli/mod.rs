//! The command-line clients of a running daemon: `rozd status`, `rozd
//! hosts`, `rozd estop`, `rozd task`, `rozd chat` and `rozd mcp`. `main.rs`
//! parses the command line and calls in here; each command prints its own
//! output and returns its exit status.
//!
//! - [`connect`]: the address, bearer token, gRPC channel and timeouts every client shares
//! - [`client`]: a small HTTP/1.1 client (TCP or the local control socket) and where that socket is
//! - [`status`]: `rozd status` and `rozd hosts`, one `GET` each
//! - [`estop`]: `rozd estop`, triggering or clearing the protective stop
//! - [`gpio`](mod@gpio): `rozd gpio`, the simulated GPIO's pins (rehearsing a stop button)
//! - [`task`]: `rozd task ...`, over REST and gRPC
//! - [`chat`]: `rozd chat`, an interactive gRPC session
//! - [`mcp`]: `rozd mcp`, a stdio MCP server relaying to the daemon's `/mcp`
//! - [`record`](mod@record): `rozd record list|info`, local recordings (no daemon needed)
//! - [`model`](mod@model): `rozd model check`, a configured model server's round trip (no daemon needed)
//! - [`format`](mod@format): the human-readable forms of the daemon's JSON answers
//!
//! Nothing here is part of the daemon: of rozd it uses the protocol
//! ([`crate::proto`]), the configuration (to find the control socket), one
//! published limit of the REST API ([`crate::api::MAX_HOSTS_LIMIT`]) and
//! the server-sent-events decoder ([`crate::model::sse`], for `rozd mcp`)
//! and the recordings' file helpers ([`crate::record::files`], [`crate::record::read`]).

pub mod approvals;
pub mod chat;
pub mod client;
pub mod connect;
pub mod estop;
pub mod format;
pub mod gpio;
pub mod mcp;
pub mod model;
pub mod record;
pub mod status;
pub mod task;

/// The runtime could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot start the async runtime")]
pub struct RuntimeError(#[source] std::io::Error);

/// The runtime every command-line client runs on: one thread is plenty
/// for one request or one session.
pub fn runtime() -> Result<tokio::runtime::Runtime, RuntimeError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(RuntimeError)
}

/// `error` and each of its sources, `a: b: c`, as a command prints a
/// failure (every source is printed, even one its error already quoted).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// Like [`error_chain`], without a source whose text its error already
/// ends with (transport errors often quote their cause).
pub fn distinct_error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let next = e.to_string();
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = e.source();
    }
    text
}
