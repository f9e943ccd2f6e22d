//! The table of open connections of one listener: which to shed when it is
//! full or the process runs out of file descriptors, and which have been
//! idle too long. Plain data and methods, no I/O: the accept loop in
//! `daemon.rs` asks it and closes what it says (`T` is whatever closes a
//! connection there).
//!
//! Shedding order, so that the protective stop and working clients stay
//! reachable while someone floods the port:
//! 1. the oldest connection that has not completed an authenticated request
//!    (idle sockets, half-sent headers, refused requests);
//! 2. else the longest-idle connection (no request in flight);
//! 3. else the one whose last activity is oldest.
//!
//! A connection is idle while no request is in flight on it; it has been
//! idle since its last request ended (or since it opened).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

/// Descriptors given back to the rest of the process when accept runs out
/// of them (see [`ConnectionTable::shed`]).
pub const SHED_HEADROOM: usize = 8;

/// Identifies a connection in its table; ids increase in opening order.
pub type ConnectionId = u64;

#[derive(Debug)]
struct Entry<T> {
    closer: T,
    authenticated: bool,
    in_flight: u32,
    /// When it last opened, started or ended a request.
    active_at: Instant,
}

#[derive(Debug)]
pub struct ConnectionTable<T> {
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
    pub fn new(limit: usize) -> Self {
        ConnectionTable {
            limit: limit.max(1),
            next_id: 0,
            entries: BTreeMap::new(),
            closing: BTreeSet::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Connections removed from the table whose end has not been reported.
    pub fn closing(&self) -> usize {
        self.closing.len()
    }

    /// Registers a new connection. When the table is full, the victims
    /// (see the module doc) are removed and returned, to be closed; the new
    /// connection is always admitted.
    pub fn open(&mut self, closer: T, now: Instant) -> (ConnectionId, Vec<T>) {
        let mut evicted = Vec::new();
        while self.entries.len() >= self.limit {
            match self.evict() {
                Some(closer) => evicted.push(closer),
                None => break,
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        self.entries.insert(
            id,
            Entry {
                closer,
                authenticated: false,
                in_flight: 0,
                active_at: now,
            },
        );
        (id, evicted)
    }

    /// The connection ended (or was closed). Unknown ids are ignored.
    pub fn close(&mut self, id: ConnectionId) {
        self.entries.remove(&id);
        self.closing.remove(&id);
    }

    pub fn request_started(&mut self, id: ConnectionId, now: Instant) {
        if let Some(e) = self.entries.get_mut(&id) {
            e.in_flight = e.in_flight.saturating_add(1);
            e.active_at = now;
        }
    }

    pub fn request_ended(&mut self, id: ConnectionId, now: Instant) {
        if let Some(e) = self.entries.get_mut(&id) {
            e.in_flight = e.in_flight.saturating_sub(1);
            e.active_at = now;
        }
    }

    /// The connection completed a request that passed authentication.
    pub fn authenticated(&mut self, id: ConnectionId) {
        if let Some(e) = self.entries.get_mut(&id) {
            e.authenticated = true;
        }
    }

    /// The process ran out of file descriptors: lowers the limit to what is
    /// open now less [`SHED_HEADROOM`] (so that the rest of the process —
    /// the store, the watchdog notification, the control socket — finds
    /// descriptors again), and removes and returns the connections above it
    /// (at least one, unless the table is empty: then the descriptors are
    /// used elsewhere).
    pub fn shed(&mut self) -> Vec<T> {
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
    pub fn expire_idle(&mut self, now: Instant, timeout: Duration) -> Vec<T> {
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
    fn evict(&mut self) -> Option<T> {
        let unauthenticated = self
            .entries
            .iter()
            .find(|(_, e)| !e.authenticated)
            .map(|(id, _)| *id);
        let longest_idle = || {
            self.entries
                .iter()
                .filter(|(_, e)| e.in_flight == 0)
                .min_by_key(|(_, e)| e.active_at)
                .map(|(id, _)| *id)
        };
        let least_active = || {
            self.entries
                .iter()
                .min_by_key(|(_, e)| e.active_at)
                .map(|(id, _)| *id)
        };
        let victim = unauthenticated
            .or_else(longest_idle)
            .or_else(least_active)?;
        self.remove(victim)
    }

    /// Takes a connection out of the table, to be closed.
    fn remove(&mut self, id: ConnectionId) -> Option<T> {
        let entry = self.entries.remove(&id)?;
        self.closing.insert(id);
        Some(entry.closer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn a_full_table_sheds_the_oldest_unauthenticated_first() {
        let t0 = Instant::now();
        let mut table = ConnectionTable::new(3);
        let (a, _) = table.open("a", t0);
        let (_b, _) = table.open("b", t0 + secs(1));
        let (c, _) = table.open("c", t0 + secs(2));
        table.request_started(a, t0 + secs(3));
        table.request_ended(a, t0 + secs(3));
        table.authenticated(a);
        // a is older but authenticated: b goes.
        let (_d, evicted) = table.open("d", t0 + secs(4));
        assert_eq!(evicted, ["b"]);
        assert_eq!(table.len(), 3);
        // then c (older than d), then d.
        table.request_started(c, t0 + secs(5));
        assert_eq!(table.open("e", t0 + secs(6)).1, ["c"]);
        assert_eq!(table.open("f", t0 + secs(7)).1, ["d"]);
    }

    #[test]
    fn with_everyone_authenticated_the_longest_idle_goes_then_the_least_active() {
        let t0 = Instant::now();
        let mut table = ConnectionTable::new(2);
        let (a, _) = table.open("a", t0);
        let (b, _) = table.open("b", t0);
        for (id, at) in [(a, 5), (b, 3)] {
            table.request_started(id, t0 + secs(at));
            table.request_ended(id, t0 + secs(at));
            table.authenticated(id);
        }
        let (c, evicted) = table.open("c", t0 + secs(6));
        assert_eq!(evicted, ["b"], "b idle since 3, a since 5");
        table.authenticated(c);
        // Both busy: a (active at 5) is older than c (active at 6).
        table.request_started(a, t0 + secs(7));
        table.request_started(c, t0 + secs(8));
        assert_eq!(table.open("d", t0 + secs(9)).1, ["a"]);
    }

    #[test]
    fn closing_frees_a_place_and_unknown_ids_are_ignored() {
        let t0 = Instant::now();
        let mut table = ConnectionTable::new(1);
        let (a, _) = table.open("a", t0);
        table.close(a);
        table.close(a);
        table.request_started(a, t0);
        table.authenticated(a);
        assert!(table.is_empty());
        let (b, shed) = table.open("b", t0);
        assert!(shed.is_empty());
        // Shed connections count as closing until their end is reported.
        let (c, shed) = table.open("c", t0);
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
        let (a, _) = table.open("a", t0);
        let (b, _) = table.open("b", t0);
        let (_c, _) = table.open("c", t0 + secs(5));
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
            table.open(i, t0);
        }
        assert_eq!(table.shed(), (0..SHED_HEADROOM).collect::<Vec<_>>());
        assert_eq!(table.limit(), 20 - SHED_HEADROOM);
        assert_eq!(table.len(), 20 - SHED_HEADROOM);
        // Now a newcomer evicts instead of growing the table.
        assert_eq!(table.open(20, t0).1, [SHED_HEADROOM]);
        assert_eq!(table.len(), 20 - SHED_HEADROOM);
        // Small tables shed down to one, then that one.
        let mut small = ConnectionTable::new(5);
        small.open(0u8, t0);
        small.open(1, t0);
        assert_eq!(small.shed(), [0]);
        assert_eq!(small.shed(), [1]);
        let mut empty: ConnectionTable<u8> = ConnectionTable::new(5);
        assert!(empty.shed().is_empty());
    }
}
