//! Where the daemon's logs go (`[log]`).

use std::io::IsTerminal as _;
use std::path::Path;

use crate::config::{LogConfig, LogFormat};

/// Logs go to journald when systemd started the daemon with a journal (its
/// `JOURNAL_STREAM` is set and the socket exists), else to stderr.
/// `RUST_LOG` overrides `log.level`.
pub fn init(log: &LogConfig) {
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&log.level));
    let under_journal = std::env::var_os("JOURNAL_STREAM").is_some()
        && Path::new("/run/systemd/journal/socket").exists();
    if under_journal && let Ok(journald) = tracing_journald::layer() {
        tracing_subscriber::registry()
            .with(filter)
            .with(journald)
            .init();
        return;
    }
    // Colour only for a person at a terminal: a pipe, a file or a log
    // collector gets plain text (NO_COLOR turns it off at a terminal too).
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match log.format {
        LogFormat::Json => tracing_subscriber::registry()
            .with(filter)
            .with(fmt.json())
            .init(),
        LogFormat::Text => tracing_subscriber::registry().with(filter).with(fmt).init(),
    }
}
