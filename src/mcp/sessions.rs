//! MCP sessions as the host sees them: who opened them, how many there may
//! be, who owns what they command, whether their client is still there,
//! and the deadman when it is not.
//!
//! Streamable HTTP has no connection that lasts as long as a session, so
//! "the client is there" means: it holds its standalone SSE stream (the GET
//! that every client opens after `initialize` to hear the server). When the
//! last such stream closes (the client exited, was killed, lost the
//! network), or while it is open the client stops answering the pings sent
//! on it (a silent peer), the session's actuators go to their safe values
//! and its calls in flight are abandoned; a client that comes back may go
//! on, with its actuators safe. When the session ends (`DELETE /mcp`, or
//! `mcp.session_idle_secs` without any event, or it is evicted to seat a
//! newcomer) the same happens. A client that never opens the stream is
//! covered by the end of its session only.
//!
//! **Bounds and ownership** ([`Table`], pure): at most `mcp.max_sessions`
//! sessions exist, `initialize`s on their way counted. When all seats are
//! taken, an idle session (no request in flight) makes room for the
//! newcomer; only when none is idle is the newcomer refused. The idle
//! session evicted is chosen so that one credential opening sessions in a
//! loop displaces its own, not everyone else's: from the credential that
//! holds the most sessions (on a tie, the newcomer's own), one without an
//! open event stream before one with, the least recently active first. A
//! session belongs to the credential that opened it: to every other one it
//! does not exist (`404`).
//!
//! [`Manager`] is rmcp's in-memory session manager with these hooks around
//! it; [`super::gate`] admits requests in front of rmcp.

use parking_lot::Mutex;
use std::cmp::Reverse;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use futures_util::Stream;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError,
};
use rmcp::transport::streamable_http_server::session::{
    ServerSseMessage, SessionId, SessionManager,
};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::ooda::Ooda;
use crate::ooda::act::Origin;

/// The owner under which an MCP session commands actuators.
pub(crate) fn owner(session_id: &str) -> String {
    format!("mcp:{session_id}")
}

/// A seat held for an `initialize` on its way to creating a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Reservation(u64);

#[derive(Debug)]
struct Entry {
    /// The credential that opened the session (its name; `anonymous` on a
    /// daemon without credentials).
    credential: Arc<str>,
    /// Standalone streams open now.
    streams: usize,
    /// Requests (POSTs) whose answers are not finished.
    in_flight: usize,
    /// The last request began or ended (or the session was created).
    last_active: Instant,
    /// The session was created.
    opened: Instant,
    /// Cancelled when the client goes away or the session ends.
    present: CancellationToken,
}

/// A session taken out of the table to make room: its calls are
/// abandoned (none was in flight), its actuators go safe, rmcp closes it.
#[derive(Debug)]
pub(crate) struct Evicted {
    pub id: String,
    pub credential: Arc<str>,
}

/// What [`Table::admit`] decided for a newcomer.
#[derive(Debug)]
pub(crate) enum Admission {
    /// A seat is held for the newcomer, made by evicting `evicted` if the
    /// table was full.
    Seated {
        reservation: Reservation,
        evicted: Option<Evicted>,
    },
    /// Every seat is held by a session with a request in flight (or an
    /// `initialize` on its way): the newcomer is refused.
    Full { max: usize },
}

/// Counters for `/v1/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct TableStats {
    pub sessions: usize,
    pub max_sessions: usize,
    /// Idle sessions ended to seat a newcomer, since start.
    pub sessions_evicted: u64,
    /// `initialize`s refused because every session was busy, since start.
    pub sessions_refused: u64,
}

/// An open MCP session, as `GET /v1/sessions/open` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct McpSessionView {
    pub id: String,
    /// The credential that opened it (`anonymous` on a daemon without credentials).
    pub credential: String,
    pub opened_unix_ms: i64,
    /// Its last request began or ended.
    pub last_active_unix_ms: i64,
    /// Its client holds its event stream and answers: it is there.
    pub listening: bool,
    /// Requests (calls) whose answers are not finished.
    pub in_flight: usize,
}

/// The MCP sessions and the seats held for new ones; no I/O, no clock:
/// every change takes the moment it happens at.
#[derive(Debug)]
pub(crate) struct Table {
    max: usize,
    entries: HashMap<String, Entry>,
    pending: HashMap<Reservation, Arc<str>>,
    next: u64,
    evicted: u64,
    refused: u64,
}

impl Table {
    /// A table of at most `max` sessions (at least one).
    pub(crate) fn new(max: usize) -> Table {
        Table {
            max: max.max(1),
            entries: HashMap::new(),
            pending: HashMap::new(),
            next: 0,
            evicted: 0,
            refused: 0,
        }
    }

    pub(crate) fn stats(&self) -> TableStats {
        TableStats {
            sessions: self.entries.len(),
            max_sessions: self.max,
            sessions_evicted: self.evicted,
            sessions_refused: self.refused,
        }
    }

    /// Holds a seat for a new session of `credential`, evicting an idle
    /// session if every seat is taken (see the module doc for which).
    pub(crate) fn admit(&mut self, credential: &Arc<str>) -> Admission {
        let mut evicted = None;
        if self.entries.len() + self.pending.len() >= self.max {
            let Some(victim) = self.victim(credential) else {
                self.refused += 1;
                return Admission::Full { max: self.max };
            };
            if let Some(entry) = self.entries.remove(&victim) {
                entry.present.cancel();
                self.evicted += 1;
                evicted = Some(Evicted {
                    id: victim,
                    credential: entry.credential,
                });
            }
        }
        let reservation = Reservation(self.next);
        self.next = self.next.wrapping_add(1);
        self.pending.insert(reservation, credential.clone());
        Admission::Seated {
            reservation,
            evicted,
        }
    }

    /// The idle session to end for a newcomer of `newcomer`'s credential.
    fn victim(&self, newcomer: &Arc<str>) -> Option<String> {
        let mut held: HashMap<&str, usize> = HashMap::new();
        for credential in self
            .entries
            .values()
            .map(|e| &e.credential)
            .chain(self.pending.values())
        {
            *held.entry(credential).or_default() += 1;
        }
        self.entries
            .iter()
            .filter(|(_, e)| e.in_flight == 0)
            .max_by_key(|(id, e)| {
                (
                    held.get(&*e.credential).copied().unwrap_or(0),
                    e.credential == *newcomer,
                    e.streams == 0,
                    Reverse(e.last_active),
                    Reverse(id.as_str()),
                )
            })
            .map(|(id, _)| id.clone())
    }

    /// Session `id` was created for `reservation`: the seat becomes the
    /// session, opened by the reservation's credential. `false` for a
    /// reservation that is not held (nothing is seated then).
    pub(crate) fn seat(&mut self, reservation: Reservation, id: &str, now: Instant) -> bool {
        let Some(credential) = self.pending.remove(&reservation) else {
            return false;
        };
        self.entries.insert(
            id.to_string(),
            Entry {
                credential,
                streams: 0,
                in_flight: 0,
                last_active: now,
                opened: now,
                present: CancellationToken::new(),
            },
        );
        true
    }

    /// The `initialize` of `reservation` ended without a session (or with
    /// one, already seated): the seat is free again.
    pub(crate) fn release(&mut self, reservation: Reservation) {
        self.pending.remove(&reservation);
    }

    /// A request of `credential` for session `id` arrives: whether the
    /// session exists and is that credential's (another's is not there, to
    /// it). `in_flight`: a POST, whose answer keeps the session busy until
    /// [`Table::end`].
    pub(crate) fn begin(
        &mut self,
        id: &str,
        credential: &str,
        in_flight: bool,
        now: Instant,
    ) -> bool {
        match self.entries.get_mut(id) {
            Some(entry) if &*entry.credential == credential => {
                entry.last_active = now;
                if in_flight {
                    entry.in_flight += 1;
                }
                true
            }
            _ => false,
        }
    }

    /// The answer to a request begun with `in_flight` is finished.
    pub(crate) fn end(&mut self, id: &str, now: Instant) {
        if let Some(entry) = self.entries.get_mut(id) {
            entry.in_flight = entry.in_flight.saturating_sub(1);
            entry.last_active = now;
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The open sessions, the oldest first, their moments in unix ms by
    /// `unix_ms`.
    pub(crate) fn list(&self, unix_ms: impl Fn(Instant) -> i64) -> Vec<McpSessionView> {
        let mut views: Vec<McpSessionView> = self
            .entries
            .iter()
            .map(|(id, e)| McpSessionView {
                id: id.clone(),
                credential: e.credential.to_string(),
                opened_unix_ms: unix_ms(e.opened),
                last_active_unix_ms: unix_ms(e.last_active),
                listening: e.streams > 0 && !e.present.is_cancelled(),
                in_flight: e.in_flight,
            })
            .collect();
        views.sort_by(|a, b| {
            (a.opened_unix_ms, a.id.as_str()).cmp(&(b.opened_unix_ms, b.id.as_str()))
        });
        views
    }
}

/// The open MCP sessions.
#[derive(Debug)]
pub(crate) struct Sessions {
    table: Mutex<Table>,
    ooda: Arc<Ooda>,
    /// A moment in both clocks: the table's instants as unix ms.
    epoch: (Instant, i64),
}

impl Sessions {
    /// At most `max` sessions (`mcp.max_sessions`).
    pub(crate) fn new(ooda: Arc<Ooda>, max: usize) -> Sessions {
        Sessions {
            table: Mutex::new(Table::new(max)),
            ooda,
            epoch: (Instant::now(), crate::clock::now_ms()),
        }
    }

    /// Sessions open now.
    pub(crate) fn count(&self) -> usize {
        self.lock().len()
    }

    pub(crate) fn stats(&self) -> TableStats {
        self.lock().stats()
    }

    /// The open sessions ([`Table::list`]).
    pub(crate) fn list(&self) -> Vec<McpSessionView> {
        let (at, at_ms) = self.epoch;
        self.lock().list(|t| {
            let since = i64::try_from(t.saturating_duration_since(at).as_millis());
            at_ms.saturating_add(since.unwrap_or(i64::MAX))
        })
    }

    /// [`Table::admit`]; an evicted session's deadman is the caller's to
    /// run (with rmcp's close, see [`Manager::evict`]).
    pub(crate) fn admit(&self, credential: &Arc<str>) -> Admission {
        self.lock().admit(credential)
    }

    pub(crate) fn release(&self, reservation: Reservation) {
        self.lock().release(reservation);
    }

    /// [`Table::begin`]; the guard ends an in-flight request when dropped
    /// (when its answer is finished or abandoned).
    pub(crate) fn begin(
        self: &Arc<Self>,
        id: &str,
        credential: &str,
        in_flight: bool,
    ) -> Option<RequestGuard> {
        self.lock()
            .begin(id, credential, in_flight, Instant::now())
            .then(|| RequestGuard {
                sessions: in_flight.then(|| self.clone()),
                id: id.to_string(),
            })
    }

    /// For a call of session `id` that arrives now: cancelled once the
    /// client goes away or the session ends; `None` for an unknown session.
    /// A request proves the client is there now, even after it was found
    /// gone (what it commanded before is safe by then).
    pub(crate) fn presence(&self, id: &str) -> Option<CancellationToken> {
        let mut table = self.lock();
        let entry = table.entries.get_mut(id)?;
        if entry.present.is_cancelled() {
            entry.present = CancellationToken::new();
        }
        Some(entry.present.clone())
    }

    /// Whether session `id`'s client holds its event stream and has not
    /// been found gone since: the one a ping can reach.
    pub(crate) fn listening(&self, id: &str) -> bool {
        self.lock()
            .entries
            .get(id)
            .is_some_and(|e| e.streams > 0 && !e.present.is_cancelled())
    }

    /// Session `id`'s client holds its stream but did not answer: it is gone
    /// (a silent peer, e.g. a cut network). Whether the session still exists.
    pub(crate) async fn unresponsive(&self, id: &str) -> bool {
        let present = match self.lock().entries.get(id) {
            None => return false,
            Some(e) if e.present.is_cancelled() => return true,
            Some(e) => e.present.clone(),
        };
        present.cancel();
        deadman(&self.ooda, id, "MCP client stopped answering").await;
        true
    }

    /// rmcp created session `id` for the `initialize` that holds `reservation`.
    fn created(&self, reservation: Reservation, id: &str) -> bool {
        self.lock().seat(reservation, id, Instant::now())
    }

    /// A standalone stream of session `id` opened; the guard notes its end.
    fn stream_opened(self: &Arc<Self>, id: &str) -> Option<StreamGuard> {
        let mut table = self.lock();
        let entry = table.entries.get_mut(id)?;
        entry.streams += 1;
        // The client is back after it had gone: its calls from now on are
        // not abandoned (what it commanded before is already safe).
        if entry.present.is_cancelled() {
            entry.present = CancellationToken::new();
        }
        Some(StreamGuard {
            sessions: self.clone(),
            id: id.to_string(),
        })
    }

    fn stream_closed(&self, id: &str) {
        let gone = {
            let mut table = self.lock();
            let Some(entry) = table.entries.get_mut(id) else {
                return;
            };
            entry.streams = entry.streams.saturating_sub(1);
            (entry.streams == 0).then(|| entry.present.clone())
        };
        if let Some(present) = gone {
            present.cancel();
            let ooda = self.ooda.clone();
            let id = id.to_string();
            // A stream's end is noticed in a drop (no await there).
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    deadman(&ooda, &id, "MCP client disconnected").await;
                });
            }
        }
    }

    /// Session `id` ended (or was evicted, and is out of the table already):
    /// its calls are abandoned and what it commands goes safe.
    async fn closed(&self, id: &str) {
        if let Some(entry) = self.lock().entries.remove(id) {
            entry.present.cancel();
        }
        deadman(&self.ooda, id, "MCP session ended").await;
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Table> {
        self.table.lock()
    }
}

/// A request of a session under way; dropped when its answer is finished
/// (or abandoned), ending it in the table.
#[derive(Debug)]
pub(crate) struct RequestGuard {
    /// Set for a request that counts as in flight.
    sessions: Option<Arc<Sessions>>,
    id: String,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        if let Some(sessions) = self.sessions.take() {
            sessions.lock().end(&self.id, Instant::now());
        }
    }
}

/// Every actuator session `id` commands goes to its safe value.
pub(crate) async fn deadman(ooda: &Ooda, id: &str, reason: &str) {
    let owner = owner(id);
    let released = ooda
        .actuators()
        .release(&Origin::Session(owner.clone()), reason)
        .await;
    if released.is_empty() {
        tracing::info!(session_id = %owner, reason, "MCP session: nothing to release");
    } else {
        tracing::warn!(session_id = %owner, reason, ?released, "deadman: MCP session's actuators sent to safe values");
    }
}

/// Notes the end of a standalone stream when dropped.
#[derive(Debug)]
struct StreamGuard {
    sessions: Arc<Sessions>,
    id: String,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.sessions.stream_closed(&self.id);
    }
}

type BoxedSse = Pin<Box<dyn Stream<Item = ServerSseMessage> + Send + Sync>>;

/// A stream that notes its end (hyper drops a response body when its
/// connection closes).
struct Guarded {
    inner: BoxedSse,
    _guard: Option<StreamGuard>,
}

impl Stream for Guarded {
    type Item = ServerSseMessage;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

/// Why [`Manager`] did not do what rmcp asked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ManagerError {
    #[error(transparent)]
    Local(#[from] LocalSessionManagerError),
    /// A session would be created without a seat held for it by
    /// [`super::gate`] (it would escape the cap): a bug, refused.
    #[error("no seat is held for this MCP session (the request did not pass rozd's gate)")]
    Unseated,
}

/// rmcp's in-memory session manager, telling [`Sessions`] when sessions
/// begin and end and when their standalone streams open and close.
pub(crate) struct Manager {
    inner: LocalSessionManager,
    sessions: Arc<Sessions>,
}

impl Manager {
    pub(crate) fn new(inner: LocalSessionManager, sessions: Arc<Sessions>) -> Manager {
        Manager { inner, sessions }
    }

    /// Ends a session [`Table::admit`] evicted: rmcp closes it (its
    /// streams end), and what it commands goes safe.
    pub(crate) async fn evict(&self, evicted: &Evicted) {
        tracing::warn!(
            session_id = %owner(&evicted.id),
            credential = %evicted.credential,
            "MCP session evicted: mcp.max_sessions reached and it was idle"
        );
        let id: SessionId = evicted.id.as_str().into();
        if let Err(e) = self.close_session(&id).await {
            tracing::info!(session_id = %owner(&evicted.id), error = %e, "closing the evicted MCP session");
        }
    }
}

impl SessionManager for Manager {
    type Error = ManagerError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    /// Only for an `initialize` that [`super::gate`] holds a seat for.
    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let Some(reservation) = super::gate::held_seat() else {
            tracing::error!("an MCP session was about to be created without a seat; refused");
            return Err(ManagerError::Unseated);
        };
        let (id, transport) = self.inner.create_session().await?;
        if !self.sessions.created(reservation, &id) {
            let _ = self.inner.close_session(&id).await;
            return Err(ManagerError::Unseated);
        }
        tracing::info!(session_id = %owner(&id), "MCP session created");
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        Ok(self.inner.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        Ok(self.inner.has_session(id).await?)
    }

    /// `DELETE /mcp`, an eviction, and the end of the session's worker
    /// (idle timeout, shutdown) all come here.
    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        let closed = self.inner.close_session(id).await;
        self.sessions.closed(id).await;
        Ok(closed?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.create_stream(id, message).await?)
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        Ok(self.inner.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let stream = self.inner.create_standalone_stream(id).await?;
        Ok(Guarded {
            inner: Box::pin(stream),
            _guard: self.sessions.stream_opened(id),
        })
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        // The local manager's event ids are `<index>` on the standalone
        // stream and `<index>/<request>` on a request's stream: only a
        // resumed standalone stream says the client is there.
        let standalone = !last_event_id.contains('/');
        let stream = self.inner.resume(id, last_event_id).await?;
        Ok(Guarded {
            inner: Box::pin(stream),
            _guard: if standalone {
                self.sessions.stream_opened(id)
            } else {
                None
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn who(name: &str) -> Arc<str> {
        Arc::from(name)
    }

    /// Admits and seats a session `id` of `credential` at `now`.
    fn open(table: &mut Table, credential: &str, id: &str, now: Instant) -> Option<Evicted> {
        match table.admit(&who(credential)) {
            Admission::Seated {
                reservation,
                evicted,
            } => {
                assert!(table.seat(reservation, id, now));
                evicted
            }
            Admission::Full { max } => panic!("full at {max} seating {id}"),
        }
    }

    #[test]
    fn a_full_table_evicts_the_least_recently_active_idle_session() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut table = Table::new(2);
        assert!(open(&mut table, "a", "s1", at(0)).is_none());
        assert!(open(&mut table, "a", "s2", at(1)).is_none());
        // s1 is used after s2: s2 is the least recently active.
        assert!(table.begin("s1", "a", true, at(2)));
        table.end("s1", at(3));
        let evicted = open(&mut table, "a", "s3", at(4)).expect("one evicted");
        assert_eq!(evicted.id, "s2");
        assert_eq!(&*evicted.credential, "a");
        assert!(!table.begin("s2", "a", false, at(5)), "gone");
        assert_eq!(table.len(), 2);
        assert_eq!(table.stats().sessions_evicted, 1);
    }

    #[test]
    fn the_list_says_since_when_each_session_is_open_and_whether_it_is_busy() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut table = Table::new(4);
        open(&mut table, "alice", "s1", at(0));
        open(&mut table, "bob", "s2", at(2));
        assert!(table.begin("s2", "bob", true, at(3)));
        let unix = |t: Instant| 1_000_000 + t.duration_since(t0).as_millis() as i64;
        let list = table.list(unix);
        assert_eq!(
            list.iter()
                .map(|v| (
                    v.id.as_str(),
                    v.credential.as_str(),
                    v.opened_unix_ms,
                    v.last_active_unix_ms,
                    v.in_flight
                ))
                .collect::<Vec<_>>(),
            [
                ("s1", "alice", 1_000_000, 1_000_000, 0),
                ("s2", "bob", 1_002_000, 1_003_000, 1)
            ],
            "oldest first"
        );
        assert!(!list[0].listening, "no event stream open");
    }

    #[test]
    fn a_session_with_a_request_in_flight_is_never_evicted_and_a_newcomer_is_refused() {
        let t0 = Instant::now();
        let mut table = Table::new(2);
        open(&mut table, "a", "s1", t0);
        open(&mut table, "a", "s2", t0);
        assert!(table.begin("s1", "a", true, t0));
        assert!(table.begin("s2", "a", true, t0));
        assert!(matches!(table.admit(&who("b")), Admission::Full { max: 2 }));
        assert_eq!(table.stats().sessions_refused, 1);
        // A GET (no request in flight) does not make a session busy.
        table.end("s2", t0);
        assert!(table.begin("s2", "a", false, t0));
        let evicted = open(&mut table, "b", "s3", t0).expect("s2 is idle");
        assert_eq!(evicted.id, "s2");
    }

    #[test]
    fn an_initialize_on_its_way_holds_its_seat_until_seated_or_released() {
        let t0 = Instant::now();
        let mut table = Table::new(1);
        let Admission::Seated { reservation, .. } = table.admit(&who("a")) else {
            panic!("room for one")
        };
        // The seat is held: nothing idle to evict, the next is refused.
        assert!(matches!(table.admit(&who("a")), Admission::Full { .. }));
        table.release(reservation);
        assert!(
            !table.seat(reservation, "late", t0),
            "a released seat seats nothing"
        );
        assert_eq!(table.len(), 0);
        let Admission::Seated { reservation, .. } = table.admit(&who("a")) else {
            panic!("free again")
        };
        assert!(table.seat(reservation, "s1", t0));
        table.release(reservation);
        assert_eq!(
            table.len(),
            1,
            "releasing a seated reservation changes nothing"
        );
    }

    #[test]
    fn the_credential_holding_the_most_sessions_gives_up_one_of_its_own() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut table = Table::new(3);
        open(&mut table, "bob", "b1", at(0));
        open(&mut table, "alice", "a1", at(1));
        open(&mut table, "alice", "a2", at(2));
        // Bob's session is the oldest, but alice holds more.
        assert_eq!(open(&mut table, "bob", "b2", at(3)).unwrap().id, "a1");
        // Now bob holds two: his oldest makes room for alice.
        assert_eq!(open(&mut table, "alice", "a3", at(4)).unwrap().id, "b1");
        // A tie (one each): the newcomer's own goes first.
        let mut tie = Table::new(2);
        open(&mut tie, "bob", "b1", at(0));
        open(&mut tie, "alice", "a1", at(1));
        assert_eq!(open(&mut tie, "alice", "a2", at(2)).unwrap().id, "a1");
    }

    #[test]
    fn an_idle_session_without_an_event_stream_goes_before_one_with() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut table = Table::new(2);
        open(&mut table, "a", "listening", at(0));
        open(&mut table, "a", "silent", at(1));
        table.entries.get_mut("listening").unwrap().streams = 1;
        assert_eq!(open(&mut table, "a", "new", at(2)).unwrap().id, "silent");
    }

    #[test]
    fn a_session_is_only_its_credentials() {
        let t0 = Instant::now();
        let mut table = Table::new(4);
        open(&mut table, "alice", "s1", t0);
        assert!(!table.begin("s1", "bob", true, t0));
        assert!(!table.begin("s1", "bob", false, t0));
        assert!(table.begin("s1", "alice", false, t0));
        assert!(!table.begin("nope", "alice", false, t0));
        // Bob's attempt left nothing in flight: s1 is idle and can make room.
        let mut full = Table::new(1);
        open(&mut full, "alice", "s1", t0);
        assert!(!full.begin("s1", "bob", true, t0));
        assert_eq!(open(&mut full, "alice", "s2", t0).unwrap().id, "s1");
    }
}
