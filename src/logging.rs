//! Where the daemon's logs go (`[log]`), and the one rate limiter for log
//! lines about input from outside (garbage on a line, rejected messages).

use std::io::IsTerminal as _;
use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;

use serde::Deserialize;

/// `[log]`: how much is logged and in which form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    pub level: String,
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: "info".to_string(),
            format: LogFormat::Text,
        }
    }
}

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

/// How often a log line about rejected input may repeat: a device or a
/// publisher spewing garbage must not flood the journal.
pub const REJECT_LOG_EVERY: Duration = Duration::from_secs(10);

/// Allows one log line per period and counts what it held back.
#[derive(Debug, Clone)]
pub struct LogLimiter {
    every: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl LogLimiter {
    pub fn new(every: Duration) -> LogLimiter {
        LogLimiter {
            every,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(n)`: log now, mentioning the `n` held back since the last
    /// line; `None`: stay quiet (counted).
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < self.every => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

impl Default for LogLimiter {
    fn default() -> Self {
        LogLimiter::new(REJECT_LOG_EVERY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_limiter_allows_one_line_per_period_and_counts_the_rest() {
        const SEC: Duration = Duration::from_secs(1);
        let t0 = Instant::now();
        let mut l = LogLimiter::new(10 * SEC);
        assert_eq!(l.allow(t0), Some(0));
        assert_eq!(l.allow(t0 + SEC), None);
        assert_eq!(l.allow(t0 + 9 * SEC), None);
        assert_eq!(l.allow(t0 + 10 * SEC), Some(2));
        assert_eq!(l.allow(t0 + 11 * SEC), None);
        assert_eq!(l.allow(t0 + 30 * SEC), Some(1));
    }
}
