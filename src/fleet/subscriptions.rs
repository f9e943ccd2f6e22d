//! The fleet connection's bookkeeping, without I/O: which subscription a
//! SUBACK answers, and what the broker's count of dropped messages says.

use std::collections::{HashMap, VecDeque};

/// The subscriptions the fleet connection asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Subscription {
    /// This environment's fleet stop (QoS 1, first and on its own).
    Stop,
    /// The fleet stop again, for its retained command (every heartbeat).
    StopAgain,
    /// The host records (QoS 0).
    Records,
    /// This environment's liveness messages (QoS 0).
    Alive,
    /// The broker's count of dropped messages (`$SYS`, QoS 0; optional).
    Dropped,
    /// One host's record in any environment, for a lookup (QoS 0).
    Lookup,
    /// This host's own id in every environment (QoS 0): another rozd with
    /// this host id elsewhere, or its own old record in an environment it
    /// left.
    OwnElsewhere,
}

/// Matches SUBACKs to what was asked: requests leave in the order they were
/// made ([`Subscriptions::asked`]); each gets its packet id when it is sent
/// ([`Subscriptions::sent`]); the SUBACK names that id.
#[derive(Debug, Default)]
pub(super) struct Subscriptions {
    queued: VecDeque<Subscription>,
    sent: HashMap<u16, Subscription>,
}

impl Subscriptions {
    /// A SUBSCRIBE for `what` was handed to the client.
    pub(super) fn asked(&mut self, what: Subscription) {
        self.queued.push_back(what);
    }

    /// The client sent the oldest SUBSCRIBE asked for, as packet `pkid`.
    pub(super) fn sent(&mut self, pkid: u16) {
        if let Some(what) = self.queued.pop_front() {
            self.sent.insert(pkid, what);
        }
    }

    /// The SUBACK of packet `pkid`: what it answers.
    pub(super) fn acked(&mut self, pkid: u16) -> Option<Subscription> {
        self.sent.remove(&pkid)
    }

    /// A new broker session: nothing sent before is answered any more
    /// (requests still queued in the client are sent on the new one).
    pub(super) fn new_session(&mut self) {
        self.sent.clear();
    }
}

/// The broker's count of messages it dropped (mosquitto publishes
/// `$SYS/broker/publish/messages/dropped`: for every client, since the
/// broker started). The first value seen is the baseline; what it grows by
/// afterwards was dropped while this host was connected, perhaps for this
/// host (the broker does not say for which client).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct DroppedCount {
    /// The broker's latest count.
    latest: Option<u64>,
    /// What it grew by since this host first saw it.
    since_join: u64,
}

impl DroppedCount {
    /// The broker published `count`: returns by how much it grew (0 for the
    /// first value, and after the broker restarted and counts from 0 again).
    pub(super) fn seen(&mut self, count: u64) -> u64 {
        let grew = match self.latest {
            Some(before) if count > before => count - before,
            _ => 0,
        };
        self.latest = Some(count);
        self.since_join = self.since_join.saturating_add(grew);
        grew
    }

    /// Whether the broker publishes its count at all (seen once).
    pub(super) fn available(&self) -> bool {
        self.latest.is_some()
    }

    /// Messages the broker dropped (for any client) since this host first
    /// saw its count.
    pub(super) fn since_join(&self) -> u64 {
        self.since_join
    }
}

/// The count in a `$SYS/broker/publish/messages/dropped` payload.
pub(super) fn parse_count(payload: &[u8]) -> Option<u64> {
    std::str::from_utf8(payload).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subacks_are_matched_by_packet_id_in_the_order_asked() {
        let mut s = Subscriptions::default();
        s.asked(Subscription::Stop);
        s.asked(Subscription::Records);
        s.sent(7);
        assert_eq!(s.acked(8), None);
        s.sent(8);
        assert_eq!(s.acked(8), Some(Subscription::Records));
        assert_eq!(s.acked(7), Some(Subscription::Stop));
        assert_eq!(s.acked(7), None);
        // sent before a new session: never answered; queued ones still are
        s.asked(Subscription::Dropped);
        s.sent(9);
        s.asked(Subscription::Stop);
        s.new_session();
        assert_eq!(s.acked(9), None);
        s.sent(1);
        assert_eq!(s.acked(1), Some(Subscription::Stop));
    }

    #[test]
    fn the_dropped_count_grows_from_its_first_value() {
        let mut d = DroppedCount::default();
        assert!(!d.available());
        assert_eq!(d.seen(1_980), 0);
        assert!(d.available());
        assert_eq!(d.seen(1_980), 0);
        assert_eq!(d.seen(2_000), 20);
        // the broker restarted: a new baseline, nothing lost from the total
        assert_eq!(d.seen(3), 0);
        assert_eq!(d.seen(10), 7);
        assert_eq!(d.since_join(), 27);
        assert_eq!(parse_count(b"42\n"), Some(42));
        assert_eq!(parse_count(b"-1"), None);
        assert_eq!(parse_count(b"\xff"), None);
    }
}
