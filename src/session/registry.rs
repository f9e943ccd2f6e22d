//! How many sessions this daemon serves: the count `/v1/status` shows, the
//! wait for idle at shutdown, the places under `session.max_sessions`, and
//! the session streams open now (`GET /v1/sessions/open`, the dashboard):
//! local sessions and the relays to other hosts that pass through here.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use serde::Serialize;

use crate::clock::now_ms;

/// Counts the sessions this daemon is serving.
#[derive(Debug)]
pub struct SessionRegistry {
    active: tokio::sync::watch::Sender<usize>,
    total: AtomicU64,
    /// Sessions started (past `StartSession`) and not yet ended: what
    /// `session.max_sessions` bounds.
    started: Arc<AtomicUsize>,
    /// The session streams open now, by the key their guard holds.
    open: Arc<Mutex<BTreeMap<u64, OpenSession>>>,
    next_key: AtomicU64,
}

impl Default for SessionRegistry {
    fn default() -> Self {
        SessionRegistry {
            active: tokio::sync::watch::Sender::new(0),
            total: AtomicU64::new(0),
            started: Arc::new(AtomicUsize::new(0)),
            open: Arc::default(),
            next_key: AtomicU64::new(0),
        }
    }
}

/// What kind of session stream is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamKind {
    /// A `StreamSession` served here (it may have been relayed here by
    /// another host of the fleet).
    Grpc,
    /// A `StreamSession` this host relays to another host of the fleet.
    Relayed,
}

/// An open session stream, as `GET /v1/sessions/open` lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpenSession {
    pub kind: StreamKind,
    /// The session's id; `None` before its `StartSession` (and for a relay,
    /// whose session lives on the other host).
    pub id: Option<String>,
    /// The credential that opened the stream (`None`: anonymous).
    pub credential: Option<String>,
    pub opened_unix_ms: i64,
    /// The session's model, once started.
    pub model: Option<String>,
    /// A relay's target host.
    pub host_id: Option<String>,
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

    pub(super) fn enter(&self, credential: Option<String>) -> ActiveSession<'_> {
        self.active.send_modify(|n| *n += 1);
        self.total.fetch_add(1, Ordering::Relaxed);
        let listed = self.list(OpenSession {
            kind: StreamKind::Grpc,
            id: None,
            credential,
            opened_unix_ms: now_ms(),
            model: None,
            host_id: None,
        });
        ActiveSession {
            registry: self,
            listed,
        }
    }

    /// Lists a relay of a session stream of `credential` to host `host_id`
    /// while the guard lives.
    pub fn relaying(&self, host_id: &str, credential: Option<String>) -> Listed {
        self.list(OpenSession {
            kind: StreamKind::Relayed,
            id: None,
            credential,
            opened_unix_ms: now_ms(),
            model: None,
            host_id: Some(host_id.to_string()),
        })
    }

    /// The session streams open now, oldest first.
    pub fn open(&self) -> Vec<OpenSession> {
        self.open.lock().values().cloned().collect()
    }

    fn list(&self, session: OpenSession) -> Listed {
        let key = self.next_key.fetch_add(1, Ordering::Relaxed);
        self.open.lock().insert(key, session);
        Listed {
            open: self.open.clone(),
            key,
        }
    }
}

/// An open session stream's entry in the list; taken off when dropped.
#[derive(Debug)]
pub struct Listed {
    open: Arc<Mutex<BTreeMap<u64, OpenSession>>>,
    key: u64,
}

impl Listed {
    /// The stream's session started: its id and model.
    pub fn started(&self, id: &str, model: &str) {
        if let Some(entry) = self.open.lock().get_mut(&self.key) {
            entry.id = Some(id.to_string());
            entry.model = Some(model.to_string());
        }
    }
}

impl Drop for Listed {
    fn drop(&mut self) {
        self.open.lock().remove(&self.key);
    }
}

/// A session stream served here: counted in `sessions.active` and listed
/// while it lives.
pub(super) struct ActiveSession<'a> {
    registry: &'a SessionRegistry,
    pub(super) listed: Listed,
}

impl Drop for ActiveSession<'_> {
    fn drop(&mut self) {
        self.registry
            .active
            .send_modify(|n| *n = n.saturating_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_streams_are_listed_while_they_live_with_their_session_once_started() {
        let registry = SessionRegistry::default();
        let grpc = registry.enter(Some("alice".into()));
        let relay = registry.relaying("rover-2", None);
        let open = registry.open();
        assert_eq!(open.len(), 2);
        assert_eq!(
            (
                open[0].kind,
                open[0].id.as_deref(),
                open[0].credential.as_deref()
            ),
            (StreamKind::Grpc, None, Some("alice"))
        );
        assert_eq!(
            (open[1].kind, open[1].host_id.as_deref()),
            (StreamKind::Relayed, Some("rover-2"))
        );
        grpc.listed.started("s-1", "local");
        assert_eq!(registry.open()[0].id.as_deref(), Some("s-1"));
        assert_eq!(registry.open()[0].model.as_deref(), Some("local"));
        assert_eq!(registry.active(), 1);
        drop(grpc);
        assert_eq!(registry.active(), 0);
        assert_eq!(registry.open().len(), 1);
        drop(relay);
        assert!(registry.open().is_empty());
    }
}
