//! The table of open connections of one listener: which to shed when it is
//! full or the process runs out of file descriptors, and which have been
//! idle too long. Plain data and methods, no I/O: the accept loop in
//! `daemon/listen.rs` asks it and closes what it says (`T` is whatever closes a
//! connection there).
//!
//! A connection is seated once it has shown its first bytes (see
//! `daemon/listen.rs`: until then it waits in a [`Lobby`] of its own
//! bound). When the table is full, a newcomer takes the place of:
//! 1. the oldest connection that has not completed an authenticated request
//!    (half-sent headers, refused requests), with no request in flight;
//! 2. else the longest-idle connection (no request in flight).
//!
//! A request in flight is never displaced by a newcomer: with no place to
//! take, the newcomer is refused ([`Seat::Refused`]). A connection whose
//! first request is a stop ([`Arrival::Stop`]) is never displaced before
//! that request has ended, and when the table has no place to free it is
//! seated beyond the cap (at most [`STOP_OVERFLOW`] such): a stop never
//! waits behind a full table.
//!
//! Out of file descriptors ([`ConnectionTable::shed`]) the same order
//! applies, then the one whose last activity is oldest, a request in flight
//! included, then a stop whose head has not all come yet (one that stalls
//! must not pin the table); never a connection on which a stop's request
//! runs, whatever its first bytes were (a gRPC `TriggerEstop` on HTTP/2
//! included): its caller would not learn that the stop latched, or the
//! stop would be dropped before it ran.
//!
//! A connection is idle while no request is in flight on it; it has been
//! idle since its last request ended (or since it opened).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

/// Descriptors given back to the rest of the process when accept runs out
/// of them (see [`ConnectionTable::shed`]).
pub(crate) const SHED_HEADROOM: usize = 8;

/// Identifies a connection in its table; ids increase in opening order.
pub(crate) type ConnectionId = u64;

/// Connections whose first request is a stop that may be seated beyond the
/// cap when it has no place to free.
pub(crate) const STOP_OVERFLOW: usize = 64;

/// What a connection's first bytes say it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// Its first request triggers the protective stop (`POST /v1/estop`,
    /// `POST /v1/fleet/estop`).
    Stop,
    Other,
}

/// Where a newcomer ends up.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Seat<T> {
    /// Seated; `evicted` are to be closed for it.
    Seated { id: ConnectionId, evicted: Vec<T> },
    /// No place: every connection has a request in flight (or a stop on
    /// its way). The newcomer's closer, to close it.
    Refused(T),
}

#[derive(Debug)]
struct Entry<T> {
    closer: T,
    authenticated: bool,
    /// Its first request is a stop that has not ended yet: neither
    /// displaced nor shed.
    stop: bool,
    in_flight: u32,
    /// Requests that trigger the stop running on it, whatever its first
    /// bytes were (a gRPC `TriggerEstop` on an HTTP/2 connection, a second
    /// request of a keep-alive one): it is not shed while one runs.
    stops_running: u32,
    /// When it last opened, started or ended a request.
    active_at: Instant,
}

#[derive(Debug)]
pub(crate) struct ConnectionTable<T> {
    /// At most this many connections (the configured cap, lowered when the
    /// process ran out of file descriptors).
    limit: usize,
    next_id: ConnectionId,
    /// By id: the oldest first.
    entries: BTreeMap<ConnectionId, Entry<T>>,
    /// Removed (shed or expired) but not yet reported closed: their
    /// descriptors are on their way back.
    closing: BTreeSet<ConnectionId>,
}

impl<T> ConnectionTable<T> {
    pub(crate) fn new(limit: usize) -> Self {
        ConnectionTable {
            limit: limit.max(1),
            next_id: 0,
            entries: BTreeMap::new(),
            closing: BTreeSet::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// Connections removed from the table whose end has not been reported.
    pub(crate) fn closing(&self) -> usize {
        self.closing.len()
    }

    /// Seats a newcomer whose first bytes say `arrival`: in a free place,
    /// else in the place of a victim (see the module doc), else (a stop)
    /// beyond the cap, else it is refused.
    pub(crate) fn open(&mut self, closer: T, arrival: Arrival, now: Instant) -> Seat<T> {
        let mut evicted = Vec::new();
        while self.entries.len() >= self.limit {
            match self.evict_for_newcomer() {
                Some(victim) => evicted.push(victim),
                None => break,
            }
        }
        let stop = arrival == Arrival::Stop;
        let room = self.entries.len() < self.limit
            || (stop && self.entries.len() < self.limit.saturating_add(STOP_OVERFLOW));
        if !room {
            return Seat::Refused(closer);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.entries.insert(
            id,
            Entry {
                closer,
                authenticated: false,
                stop,
                in_flight: 0,
                stops_running: 0,
                active_at: now,
            },
        );
        Seat::Seated { id, evicted }
    }

    /// The connection ended (or was closed). Unknown ids are ignored.
    pub(crate) fn close(&mut self, id: ConnectionId) {
        self.entries.remove(&id);
        self.closing.remove(&id);
    }

    pub(crate) fn request_started(&mut self, id: ConnectionId, now: Instant) {
        if let Some(e) = self.entries.get_mut(&id) {
            e.in_flight = e.in_flight.saturating_add(1);
            e.active_at = now;
        }
    }

    pub(crate) fn request_ended(&mut self, id: ConnectionId, now: Instant) {
        if let Some(e) = self.entries.get_mut(&id) {
            // Its first request (a stop, perhaps) has ended: an ordinary
            // connection from now on.
            e.stop = false;
            e.in_flight = e.in_flight.saturating_sub(1);
            e.active_at = now;
        }
    }

    /// A request that triggers the stop started on it (within a request
    /// counted by [`ConnectionTable::request_started`]).
    pub(crate) fn stop_started(&mut self, id: ConnectionId) {
        if let Some(e) = self.entries.get_mut(&id) {
            e.stops_running = e.stops_running.saturating_add(1);
        }
    }

    pub(crate) fn stop_ended(&mut self, id: ConnectionId) {
        if let Some(e) = self.entries.get_mut(&id) {
            e.stops_running = e.stops_running.saturating_sub(1);
        }
    }

    /// The connection completed a request that passed authentication.
    pub(crate) fn authenticated(&mut self, id: ConnectionId) {
        if let Some(e) = self.entries.get_mut(&id) {
            e.authenticated = true;
        }
    }

    /// The process ran out of file descriptors: lowers the limit to what is
    /// open now less [`SHED_HEADROOM`] (so that the rest of the process —
    /// the store, the watchdog notification, the control socket — finds
    /// descriptors again), and removes and returns the connections above it
    /// (at least one, unless the table holds only stops whose request runs,
    /// or nothing: then the descriptors are used elsewhere).
    pub(crate) fn shed(&mut self) -> Vec<T> {
        self.limit = self.entries.len().saturating_sub(SHED_HEADROOM).max(1);
        let mut shed = Vec::new();
        while self.entries.len() > self.limit {
            match self.evict() {
                Some(closer) => shed.push(closer),
                None => break,
            }
        }
        if shed.is_empty() {
            shed.extend(self.evict());
        }
        shed
    }

    /// Removes and returns every connection idle for at least `timeout`.
    pub(crate) fn expire_idle(&mut self, now: Instant, timeout: Duration) -> Vec<T> {
        let expired: Vec<ConnectionId> = self
            .entries
            .iter()
            .filter(|(_, e)| {
                e.in_flight == 0 && now.saturating_duration_since(e.active_at) >= timeout
            })
            .map(|(id, _)| *id)
            .collect();
        expired
            .into_iter()
            .filter_map(|id| self.remove(id))
            .collect()
    }

    /// Removes and returns the next victim of the shedding order.
    /// A place for a newcomer: never a request in flight, nor a stop on its
    /// way.
    fn evict_for_newcomer(&mut self) -> Option<T> {
        let victim = self.displaceable()?;
        self.remove(victim)
    }

    /// The oldest unauthenticated connection, else the longest-idle one,
    /// among those with nothing in flight and no stop on its way.
    fn displaceable(&self) -> Option<ConnectionId> {
        let free = |e: &Entry<T>| e.in_flight == 0 && !e.stop;
        self.entries
            .iter()
            .find(|(_, e)| !e.authenticated && free(e))
            .map(|(id, _)| *id)
            .or_else(|| {
                self.entries
                    .iter()
                    .filter(|(_, e)| free(e))
                    .min_by_key(|(_, e)| e.active_at)
                    .map(|(id, _)| *id)
            })
    }

    /// Out of descriptors something must go: as for a newcomer, else the
    /// one whose last activity is oldest, stops whose request has not
    /// started last of all; never a stop whose request runs (it ends within
    /// the body's bound, and is sheddable then).
    fn evict(&mut self) -> Option<T> {
        let least_active = || {
            self.entries
                .iter()
                .filter(|(_, e)| !(e.stop && e.in_flight > 0) && e.stops_running == 0)
                .min_by_key(|(_, e)| (e.stop, e.active_at))
                .map(|(id, _)| *id)
        };
        let victim = self.displaceable().or_else(least_active)?;
        self.remove(victim)
    }

    fn remove(&mut self, id: ConnectionId) -> Option<T> {
        let entry = self.entries.remove(&id)?;
        self.closing.insert(id);
        Some(entry.closer)
    }
}

/// Identifies a connection in the [`Lobby`].
pub(crate) type LobbyId = u64;

/// Connections accepted that have not shown their first bytes yet (or,
/// with TLS, finished the handshake): at most `limit`. When it is full, the
/// oldest is dropped for a newcomer once it has waited [`LOBBY_GRACE`] (it
/// had its chance); before that the newcomer is refused, so that a
/// connection whose request is on its way is not crowded out by a flood.
/// Bare connections opened to crowd the table wait here, not in it; and
/// when the process runs out of file descriptors, those that have sent
/// nothing and have waited past their grace are the first to go
/// ([`Lobby::shed`]).
#[derive(Debug)]
pub(crate) struct Lobby<T> {
    limit: usize,
    next_id: LobbyId,
    waiting: VecDeque<(LobbyId, Instant, T)>,
    /// Dropped or shed but not yet left: their descriptors are on their
    /// way back.
    closing: BTreeSet<LobbyId>,
}

/// How long a connection in a full lobby keeps its place.
pub(crate) const LOBBY_GRACE: Duration = Duration::from_secs(1);

impl<T> Lobby<T> {
    pub(crate) fn new(limit: usize) -> Self {
        Lobby {
            limit: limit.max(1),
            next_id: 0,
            waiting: VecDeque::new(),
            closing: BTreeSet::new(),
        }
    }

    /// A newcomer waits: its id and, when the lobby was full, the closer of
    /// the oldest past its grace, dropped for it: the oldest that is `bare`
    /// (has sent nothing) if any, so that a stop on its way outlasts a
    /// silent flood. `Err`: full of connections still within their grace;
    /// the newcomer's closer, to close it.
    pub(crate) fn enter(
        &mut self,
        closer: T,
        now: Instant,
        bare: impl Fn(&T) -> bool,
    ) -> Result<(LobbyId, Option<T>), T> {
        let mut dropped = None;
        if self.waiting.len() >= self.limit {
            dropped = self
                .shed(now, 1, bare)
                .pop()
                .or_else(|| self.shed(now, 1, |_| true).pop());
            if dropped.is_none() {
                return Err(closer);
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        self.waiting.push_back((id, now, closer));
        Ok((id, dropped))
    }

    /// It left (seated, refused, closed or timed out). Unknown ids are ignored.
    pub(crate) fn leave(&mut self, id: LobbyId) {
        self.closing.remove(&id);
        if let Some(at) = self.waiting.iter().position(|(i, _, _)| *i == id) {
            self.waiting.remove(at);
        }
    }

    /// Removes and returns up to `most` of the oldest connections that have
    /// waited past their grace and are `bare` (out of file descriptors: those
    /// that have sent nothing, a flood's in all likelihood; a client silent
    /// for [`LOBBY_GRACE`] connects again). They count as
    /// [`Lobby::closing`] until they leave.
    pub(crate) fn shed(&mut self, now: Instant, most: usize, bare: impl Fn(&T) -> bool) -> Vec<T> {
        // Oldest first: once one is within its grace, so are the rest.
        let ids: Vec<LobbyId> = self
            .waiting
            .iter()
            .take_while(|(_, since, _)| now.saturating_duration_since(*since) >= LOBBY_GRACE)
            .filter(|(_, _, closer)| bare(closer))
            .take(most)
            .map(|(id, _, _)| *id)
            .collect();
        let mut shed = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(at) = self.waiting.iter().position(|(i, _, _)| *i == id)
                && let Some((_, _, closer)) = self.waiting.remove(at)
            {
                self.closing.insert(id);
                shed.push(closer);
            }
        }
        shed
    }

    /// Connections dropped or shed whose leaving has not been reported.
    pub(crate) fn closing(&self) -> usize {
        self.closing.len()
    }

    pub(crate) fn len(&self) -> usize {
        self.waiting.len()
    }
}

/// What the first bytes of a connection say, or `None` while they could
/// still be the start of a stop's request line.
pub(crate) fn classify(first: &[u8]) -> Option<Arrival> {
    const STOPS: [&[u8]; 2] = [b"POST /v1/estop", b"POST /v1/fleet/estop"];
    for stop in STOPS {
        if first.len() <= stop.len() {
            if stop.starts_with(first) {
                // A prefix of a stop (or the path without what follows).
                return None;
            }
        } else if first.starts_with(stop) && matches!(first[stop.len()], b' ' | b'?') {
            return Some(Arrival::Stop);
        }
    }
    Some(Arrival::Other)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// Seats an ordinary newcomer, which must find a place.
    fn open<T: std::fmt::Debug>(
        table: &mut ConnectionTable<T>,
        closer: T,
        now: Instant,
    ) -> (ConnectionId, Vec<T>) {
        match table.open(closer, Arrival::Other, now) {
            Seat::Seated { id, evicted } => (id, evicted),
            Seat::Refused(c) => panic!("{c:?} refused"),
        }
    }

    #[test]
    fn a_full_table_sheds_the_oldest_unauthenticated_first() {
        let t0 = Instant::now();
        let mut table = ConnectionTable::new(3);
        let (a, _) = open(&mut table, "a", t0);
        let (_b, _) = open(&mut table, "b", t0 + secs(1));
        let (c, _) = open(&mut table, "c", t0 + secs(2));
        table.request_started(a, t0 + secs(3));
        table.request_ended(a, t0 + secs(3));
        table.authenticated(a);
        // a is older but authenticated: b goes.
        let (_d, evicted) = open(&mut table, "d", t0 + secs(4));
        assert_eq!(evicted, ["b"]);
        assert_eq!(table.len(), 3);
        // c has a request in flight: d goes, then e.
        table.request_started(c, t0 + secs(5));
        assert_eq!(open(&mut table, "e", t0 + secs(6)).1, ["d"]);
        assert_eq!(open(&mut table, "f", t0 + secs(7)).1, ["e"]);
    }

    #[test]
    fn with_everyone_authenticated_the_longest_idle_goes_then_the_least_active() {
        let t0 = Instant::now();
        let mut table = ConnectionTable::new(2);
        let (a, _) = open(&mut table, "a", t0);
        let (b, _) = open(&mut table, "b", t0);
        for (id, at) in [(a, 5), (b, 3)] {
            table.request_started(id, t0 + secs(at));
            table.request_ended(id, t0 + secs(at));
            table.authenticated(id);
        }
        let (c, evicted) = open(&mut table, "c", t0 + secs(6));
        assert_eq!(evicted, ["b"], "b idle since 3, a since 5");
        table.authenticated(c);
        // Both busy: nothing in flight is displaced; the newcomer is refused.
        table.request_started(a, t0 + secs(7));
        table.request_started(c, t0 + secs(8));
        assert_eq!(
            table.open("d", Arrival::Other, t0 + secs(9)),
            Seat::Refused("d")
        );
        assert_eq!(table.len(), 2);
    }

    #[test]
    fn closing_frees_a_place_and_unknown_ids_are_ignored() {
        let t0 = Instant::now();
        let mut table = ConnectionTable::new(1);
        let (a, _) = open(&mut table, "a", t0);
        table.close(a);
        table.close(a);
        table.request_started(a, t0);
        table.authenticated(a);
        assert_eq!(table.len(), 0);
        let (b, shed) = open(&mut table, "b", t0);
        assert!(shed.is_empty());
        // Shed connections count as closing until their end is reported.
        let (c, shed) = open(&mut table, "c", t0);
        assert_eq!((shed, table.closing()), (vec!["b"], 1));
        table.close(b);
        table.close(b);
        assert_eq!(table.closing(), 0);
        assert_eq!(table.expire_idle(t0 + secs(1), secs(1)), ["c"]);
        assert_eq!(table.closing(), 1);
        table.close(c);
        assert_eq!((table.len(), table.closing()), (0, 0));
    }

    #[test]
    fn idle_connections_expire_busy_ones_do_not() {
        let t0 = Instant::now();
        let mut table = ConnectionTable::new(10);
        let (a, _) = open(&mut table, "a", t0);
        let (b, _) = open(&mut table, "b", t0);
        let (_c, _) = open(&mut table, "c", t0 + secs(5));
        table.request_started(a, t0 + secs(1));
        table.request_started(b, t0 + secs(1));
        table.request_ended(b, t0 + secs(2));
        assert!(table.expire_idle(t0 + secs(9), secs(10)).is_empty());
        // b idle since 2, a busy, c idle since 5.
        assert_eq!(table.expire_idle(t0 + secs(12), secs(10)), ["b"]);
        assert_eq!(table.expire_idle(t0 + secs(100), secs(10)), ["c"]);
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn running_out_of_descriptors_lowers_the_limit_with_headroom() {
        let t0 = Instant::now();
        let mut table = ConnectionTable::new(100);
        for i in 0..20 {
            open(&mut table, i, t0);
        }
        assert_eq!(table.shed(), (0..SHED_HEADROOM).collect::<Vec<_>>());
        assert_eq!(table.limit(), 20 - SHED_HEADROOM);
        assert_eq!(table.len(), 20 - SHED_HEADROOM);
        // Now a newcomer evicts instead of growing the table.
        assert_eq!(open(&mut table, 20, t0).1, [SHED_HEADROOM]);
        assert_eq!(table.len(), 20 - SHED_HEADROOM);
        // Small tables shed down to one, then that one.
        let mut small = ConnectionTable::new(5);
        open(&mut small, 0u8, t0);
        open(&mut small, 1, t0);
        assert_eq!(small.shed(), [0]);
        assert_eq!(small.shed(), [1]);
        let mut empty: ConnectionTable<u8> = ConnectionTable::new(5);
        assert!(empty.shed().is_empty());
    }

    #[test]
    fn a_stop_on_its_way_is_never_displaced_and_finds_a_place_beyond_the_cap() {
        let t0 = Instant::now();
        let mut table = ConnectionTable::new(2);
        let (held, _) = open(&mut table, "held", t0);
        table.request_started(held, t0);
        let Seat::Seated { id: stop, .. } = table.open("stop", Arrival::Stop, t0) else {
            panic!("the stop has a free place");
        };
        // Bare newcomers cannot displace the stop before its request starts,
        // nor the request in flight.
        for i in 0..10 {
            assert_eq!(
                table.open("bare", Arrival::Other, t0 + secs(i)),
                Seat::Refused("bare")
            );
        }
        // A second stop finds no place to free: seated beyond the cap.
        let Seat::Seated { evicted, .. } = table.open("stop 2", Arrival::Stop, t0 + secs(1)) else {
            panic!("a stop is never refused while the overflow has room");
        };
        assert!(evicted.is_empty());
        assert_eq!(table.len(), 3);
        // Once the first stop's request has run, its connection is ordinary
        // (the second's stop is still on its way).
        table.request_started(stop, t0 + secs(2));
        table.request_ended(stop, t0 + secs(2));
        table.close(held);
        assert_eq!(open(&mut table, "next", t0 + secs(3)).1, ["stop"]);
    }

    #[test]
    fn out_of_descriptors_a_stop_is_never_shed_before_its_request_has_ended() {
        // Seen in CI: out of descriptors, a `POST /v1/estop` over TCP was
        // the only connection in the table; accept took one more from the
        // backlog, the table shed the stop while its request was in flight,
        // and its caller got no answer.
        let t0 = Instant::now();
        let mut table = ConnectionTable::new(10);
        let Seat::Seated { id: stop, .. } = table.open("stop", Arrival::Stop, t0) else {
            panic!("the stop has a free place");
        };
        let (busy, _) = open(&mut table, "busy", t0 + secs(1));
        table.request_started(stop, t0 + secs(2));
        table.request_started(busy, t0 + secs(3));
        // The ordinary request in flight goes though it is the newer one.
        assert_eq!(table.shed(), ["busy"]);
        // The stop alone: nothing is shed.
        assert!(table.shed().is_empty());
        assert_eq!(table.len(), 1);
        // Once its request has ended it is an ordinary connection.
        table.request_ended(stop, t0 + secs(4));
        assert_eq!(table.shed(), ["stop"]);
        assert!(table.shed().is_empty());

        // A stop whose head has not all come goes last of all, but goes:
        // heads that stall must not pin the table.
        let mut table = ConnectionTable::new(10);
        let Seat::Seated { id: running, .. } = table.open("running", Arrival::Stop, t0) else {
            panic!("the stop has a free place");
        };
        table.request_started(running, t0);
        let Seat::Seated { .. } = table.open("pending", Arrival::Stop, t0) else {
            panic!("the stop has a free place");
        };
        let (idle, _) = open(&mut table, "idle", t0 + secs(9));
        table.authenticated(idle);
        // Down to one place: the idle one first, then the pending stop.
        assert_eq!(table.shed(), ["idle", "pending"]);
        assert!(table.shed().is_empty(), "the running stop stays");
    }

    #[test]
    fn out_of_descriptors_a_stop_running_on_any_connection_keeps_it() {
        // A gRPC TriggerEstop arrives on an HTTP/2 connection, whose first
        // bytes (the preface) say nothing of a stop.
        let t0 = Instant::now();
        let mut table = ConnectionTable::new(10);
        let (grpc, _) = open(&mut table, "grpc", t0);
        let (other, _) = open(&mut table, "other", t0 + secs(1));
        table.request_started(grpc, t0 + secs(2));
        table.stop_started(grpc);
        table.request_started(other, t0 + secs(3));
        // The least active is the gRPC one, but its stop runs.
        assert_eq!(table.shed(), ["other"]);
        assert!(table.shed().is_empty(), "the running stop stays");
        table.stop_ended(grpc);
        table.request_ended(grpc, t0 + secs(4));
        assert_eq!(table.shed(), ["grpc"]);
    }

    #[test]
    fn the_stop_overflow_is_bounded() {
        let t0 = Instant::now();
        let mut table = ConnectionTable::new(1);
        let seated = (0..=STOP_OVERFLOW)
            .filter(|_| matches!(table.open(0u8, Arrival::Stop, t0), Seat::Seated { .. }))
            .count();
        assert_eq!(seated, 1 + STOP_OVERFLOW);
        assert_eq!(table.open(1u8, Arrival::Stop, t0), Seat::Refused(1));
    }

    #[test]
    fn a_full_lobby_drops_its_oldest_after_its_grace_else_refuses_the_newcomer() {
        let t0 = Instant::now();
        let mut lobby = Lobby::new(2);
        let any = |_: &&str| true;
        let (a, dropped) = lobby.enter("a", t0, any).unwrap();
        assert_eq!(dropped, None);
        let (_b, _) = lobby.enter("b", t0 + secs(1), any).unwrap();
        assert_eq!(
            lobby.enter("early", t0 + LOBBY_GRACE / 2, any),
            Err("early")
        );
        let (_c, dropped) = lobby.enter("c", t0 + LOBBY_GRACE, any).unwrap();
        assert_eq!(dropped, Some("a"));
        assert_eq!(lobby.closing(), 1, "dropped, not yet gone");
        lobby.leave(a);
        assert_eq!((lobby.len(), lobby.closing()), (2, 0));
        let (_d, dropped) = lobby.enter("d", t0 + secs(5), any).unwrap();
        assert_eq!(dropped, Some("b"));
    }

    #[test]
    fn a_full_lobby_drops_a_silent_connection_before_one_that_has_begun_to_speak() {
        let t0 = Instant::now();
        let mut lobby = Lobby::new(2);
        // "stop" has sent its first bytes (a stop whose TLS handshake or
        // request line trickles in); "silent" has sent nothing.
        let bare = |c: &&str| *c != "stop";
        lobby.enter("stop", t0, bare).unwrap();
        lobby.enter("silent", t0 + secs(1), bare).unwrap();
        let (_, dropped) = lobby.enter("new", t0 + secs(3), bare).unwrap();
        assert_eq!(dropped, Some("silent"), "the older one has spoken");
        // With none silent past its grace, the oldest goes all the same.
        let (_, dropped) = lobby
            .enter("newer", t0 + secs(5), |c: &&str| *c == "nobody")
            .unwrap();
        assert_eq!(dropped, Some("stop"));
    }

    #[test]
    fn out_of_descriptors_the_lobby_sheds_its_oldest_bare_ones_past_their_grace() {
        // Seen in CI: out of descriptors, bare connections in the lobby
        // held nearly every descriptor until their header timeout while
        // only the table was shed, so TCP stayed unreachable that long.
        let t0 = Instant::now();
        let mut lobby = Lobby::new(100);
        let ids: Vec<_> = (0..6)
            .map(|i| lobby.enter(i, t0 + secs(i), |_| true).unwrap().0)
            .collect();
        let bare = |c: &u64| *c != 1;
        // Nobody past the grace yet: nothing goes.
        assert!(lobby.shed(t0 + LOBBY_GRACE / 2, 10, bare).is_empty());
        // At 4 s, 0..=3 have waited a second or more; 1 has sent bytes (a
        // stop on its way, perhaps) and stays; at most two go.
        assert_eq!(lobby.shed(t0 + secs(4), 2, bare), [0, 2]);
        assert_eq!(lobby.shed(t0 + secs(4), 10, bare), [3]);
        assert_eq!((lobby.len(), lobby.closing()), (3, 3));
        // Each counts as closing until it has left.
        lobby.leave(ids[0]);
        lobby.leave(ids[0]);
        assert_eq!(lobby.closing(), 2);
        lobby.leave(ids[2]);
        lobby.leave(ids[3]);
        assert_eq!((lobby.len(), lobby.closing()), (3, 0));
        assert_eq!(lobby.shed(t0 + secs(60), 10, bare), [4, 5]);
        assert_eq!(lobby.len(), 1);
        lobby.leave(ids[1]);
    }

    #[test]
    fn first_bytes_say_whether_a_stop_is_coming() {
        for stop in [
            &b"POST /v1/estop HTTP/1.1\r\n"[..],
            b"POST /v1/estop?x=1 HTTP/1.1",
            b"POST /v1/fleet/estop HTTP/1.1",
        ] {
            assert_eq!(classify(stop), Some(Arrival::Stop), "{stop:?}");
        }
        for undecided in [
            &b""[..],
            b"P",
            b"POST /v1/es",
            b"POST /v1/estop",
            b"POST /v1/fleet/",
        ] {
            assert_eq!(classify(undecided), None, "{undecided:?}");
        }
        for other in [
            &b"GET /v1/estop HTTP/1.1"[..],
            b"POST /v1/estop/clear HTTP/1.1",
            b"POST /v1/fleet/estop/clear HTTP/1.1",
            b"PRI * HTTP/2.0\r\n",
            b"\x16\x03\x01",
        ] {
            assert_eq!(classify(other), Some(Arrival::Other), "{other:?}");
        }
    }
}
