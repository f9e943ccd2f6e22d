//! Whether the store writes: the outcome of its last write, kept for
//! `/v1/status` and the logs, and its hard size cap (`store.hard_cap_mb`,
//! SQLite's `max_page_count`).
//!
//! Nothing here decides whether a PHYSICAL call may run: each one writes its
//! own audit row before its command (`Store::audit_begin`) and is refused
//! when that write fails. This is what an operator reads to see why.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use serde::Serialize;

use crate::clock::now_ms;

/// What `/v1/status` shows as `store`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoreHealth {
    /// The last write succeeded (true before the first).
    pub writable: bool,
    /// Since when writes fail (the first failure of the current run of
    /// failures); `null` while writable.
    pub failing_since_unix_ms: Option<i64>,
    /// Why the last failed write failed; `null` while writable.
    pub last_error: Option<String>,
    /// Writes that failed since rozd started.
    pub failed_writes: u64,
    /// The hard size cap in force (`store.hard_cap_mb`); 0: none.
    pub hard_cap_mb: u32,
}

#[derive(Debug, Default)]
pub(super) struct Health {
    failing: Mutex<Option<(i64, String)>>,
    failed_writes: AtomicU64,
    hard_cap_mb: AtomicU32,
}

impl Health {
    /// Notes the outcome of one write.
    pub(super) fn wrote<T, E: std::fmt::Display>(&self, result: &Result<T, E>) {
        let mut failing = self.failing.lock();
        match result {
            Ok(_) => {
                if let Some((since, _)) = failing.take() {
                    tracing::info!(failing_for_ms = now_ms() - since, "the store writes again");
                }
            }
            Err(e) => {
                self.failed_writes.fetch_add(1, Ordering::Relaxed);
                let since = match failing.as_ref() {
                    Some((since, _)) => *since,
                    None => {
                        tracing::error!(error = %e, "the store cannot write; PHYSICAL calls are refused until it can");
                        now_ms()
                    }
                };
                *failing = Some((since, e.to_string()));
            }
        }
    }

    pub(super) fn set_hard_cap_mb(&self, mb: u32) {
        self.hard_cap_mb.store(mb, Ordering::Relaxed);
    }

    pub(super) fn snapshot(&self) -> StoreHealth {
        let failing = self.failing.lock().clone();
        StoreHealth {
            writable: failing.is_none(),
            failing_since_unix_ms: failing.as_ref().map(|(since, _)| *since),
            last_error: failing.map(|(_, e)| e),
            failed_writes: self.failed_writes.load(Ordering::Relaxed),
            hard_cap_mb: self.hard_cap_mb.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_is_shown_until_the_next_write_succeeds() {
        let health = Health::default();
        assert!(health.snapshot().writable);
        health.wrote::<(), _>(&Err("database or disk is full"));
        let first = health.snapshot();
        assert!(!first.writable);
        assert_eq!(
            first.last_error.as_deref(),
            Some("database or disk is full")
        );
        health.wrote::<(), _>(&Err("disk I/O error"));
        let second = health.snapshot();
        assert_eq!(second.failing_since_unix_ms, first.failing_since_unix_ms);
        assert_eq!(second.last_error.as_deref(), Some("disk I/O error"));
        assert_eq!(second.failed_writes, 2);
        health.wrote::<(), &str>(&Ok(()));
        let healed = health.snapshot();
        assert!(healed.writable && healed.last_error.is_none());
        assert_eq!(healed.failed_writes, 2);
    }
}
