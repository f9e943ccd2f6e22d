//! How many sessions this daemon serves: the count `/v1/status` shows, the
//! wait for idle at shutdown, and the places under `session.max_sessions`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Counts the sessions this daemon is serving.
#[derive(Debug)]
pub struct SessionRegistry {
    active: tokio::sync::watch::Sender<usize>,
    total: AtomicU64,
    /// Sessions started (past `StartSession`) and not yet ended: what
    /// `session.max_sessions` bounds.
    started: Arc<AtomicUsize>,
}

impl Default for SessionRegistry {
    fn default() -> Self {
        SessionRegistry {
            active: tokio::sync::watch::Sender::new(0),
            total: AtomicU64::new(0),
            started: Arc::new(AtomicUsize::new(0)),
        }
    }
}

/// A started session's place under `session.max_sessions`; given back when dropped.
#[derive(Debug)]
pub struct SessionSlot(Arc<AtomicUsize>);

impl Drop for SessionSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl SessionRegistry {
    pub fn active(&self) -> usize {
        *self.active.borrow()
    }
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
    /// Resolves once no session is running (each has recorded its end).
    pub async fn wait_idle(&self) {
        let mut rx = self.active.subscribe();
        // The sender lives in `self`, so the channel cannot close under us.
        let _ = rx.wait_for(|n| *n == 0).await;
    }
    /// Sessions past `StartSession` and not ended (bounded by `session.max_sessions`).
    pub fn started(&self) -> usize {
        self.started.load(Ordering::Acquire)
    }

    /// A place for one more started session, unless `max` are running.
    pub fn admit(&self, max: usize) -> Option<SessionSlot> {
        self.started
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| SessionSlot(self.started.clone()))
    }

    pub(super) fn enter(&self) -> ActiveSession<'_> {
        self.active.send_modify(|n| *n += 1);
        self.total.fetch_add(1, Ordering::Relaxed);
        ActiveSession(self)
    }
}

pub(super) struct ActiveSession<'a>(&'a SessionRegistry);

impl Drop for ActiveSession<'_> {
    fn drop(&mut self) {
        self.0.active.send_modify(|n| *n = n.saturating_sub(1));
    }
}
