//! Lookups of hosts outside this host's view, without I/O.
//!
//! A host with `[fleet] view = "environment"` holds the records of its own
//! environment only. For another id (`GetHost`, a relay by host id) the
//! broker connection subscribes to that one id's record in any environment
//! (`<prefix>/hosts/+/<id>`, QoS 0), takes the retained record the broker
//! hands over, and unsubscribes. This module keeps the bookkeeping: who
//! waits for which id, when a lookup ends, and with what. The clock is an
//! argument; the waiters are whatever the I/O loop answers them with (a
//! channel there, numbers in the tests).
//!
//! - Concurrent lookups of one id share one subscription: the first asks
//!   for it ([`Ask::Subscribe`]), later ones join ([`Ask::Joined`]) and end
//!   with it.
//! - A live record (`online`) or a registered host's ends the lookup at
//!   once. An `offline` one is kept while the lookup waits on: one id may
//!   have records in two environments (a host moved from one to another
//!   leaves its old record, offline), and a live one is the answer.
//!   Between two records of one kind the newer (by stamp) is kept.
//! - The broker does not say "there is no retained record": a lookup that
//!   found no live record by its deadline (`lookup_timeout_ms` after it was
//!   first asked) ends with what it kept, an offline record or nothing
//!   ([`Outcome::NotFound`]).
//! - A lost broker connection ends every lookup ([`Outcome::Disconnected`]).
//!
//! Nothing is cached: a record looked up is the broker's retained record
//! at that moment, and this host hears nothing of that host afterwards (no
//! subscription to its record, none to its environment's liveness), so a
//! kept copy could only grow staler. Each lookup asks again.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use super::record::{HostRecord, RecordStatus};

/// What to do after [`Lookups::ask`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ask {
    /// The first lookup of this id: subscribe to its record.
    Subscribe,
    /// A lookup of this id is under way: wait with it.
    Joined,
    /// [`MAX_LOOKUPS`] other ids are being looked up: not asked (the
    /// waiter is handed back, to be told to try again).
    Full,
}

/// Most ids looked up at once (each is a subscription on the broker for at
/// most the lookup's time): a flood of requests for made-up ids cannot
/// pile up subscriptions beyond this.
pub(super) const MAX_LOOKUPS: usize = 256;

/// How a lookup ended.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Outcome {
    /// The broker's retained record of the host (authentic, checked).
    Found(Box<HostRecord>),
    /// No record came within the lookup's time.
    NotFound,
    /// The broker connection was lost before the lookup ended.
    Disconnected,
    /// Too many other ids were being looked up: try again.
    Busy,
}

/// A lookup that ended: unsubscribe from `id`'s record (if it was
/// subscribed to) and answer every waiter with `outcome`.
#[derive(Debug)]
pub(super) struct Done<W> {
    pub id: String,
    pub outcome: Outcome,
    pub waiters: Vec<W>,
}

#[derive(Debug)]
struct Pending<W> {
    deadline: Instant,
    /// The best record so far that does not end the lookup (offline).
    kept: Option<HostRecord>,
    waiters: Vec<W>,
}

/// The lookups under way.
#[derive(Debug)]
pub(super) struct Lookups<W> {
    timeout: Duration,
    pending: HashMap<String, Pending<W>>,
    /// Deadlines in order, for [`Lookups::next_deadline`].
    deadlines: BTreeSet<(Instant, String)>,
}

impl<W> Lookups<W> {
    pub(super) fn new(timeout: Duration) -> Lookups<W> {
        Lookups {
            timeout,
            pending: HashMap::new(),
            deadlines: BTreeSet::new(),
        }
    }

    /// `waiter` asks for `id` at `now`. With [`Ask::Full`] the waiter is
    /// returned, not kept.
    pub(super) fn ask(&mut self, id: &str, waiter: W, now: Instant) -> (Ask, Option<W>) {
        if let Some(pending) = self.pending.get_mut(id) {
            pending.waiters.push(waiter);
            return (Ask::Joined, None);
        }
        if self.pending.len() >= MAX_LOOKUPS {
            return (Ask::Full, Some(waiter));
        }
        let deadline = now + self.timeout;
        self.deadlines.insert((deadline, id.to_string()));
        self.pending.insert(
            id.to_string(),
            Pending {
                deadline,
                kept: None,
                waiters: vec![waiter],
            },
        );
        (Ask::Subscribe, None)
    }

    /// Whether a lookup of `id` is under way (a record of it is wanted).
    pub(super) fn wants(&self, id: &str) -> bool {
        self.pending.contains_key(id)
    }

    /// How many ids are being looked up.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.pending.len()
    }

    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// An authentic, checked record of `record.id` arrived: the lookup
    /// ends if it is live or registered; an offline one is kept.
    pub(super) fn found(&mut self, record: HostRecord) -> Option<Done<W>> {
        let pending = self.pending.get_mut(&record.id)?;
        if record.status == RecordStatus::Offline {
            let newer = pending
                .kept
                .as_ref()
                .is_none_or(|kept| kept.stamp_ms() <= record.stamp_ms());
            if newer {
                pending.kept = Some(record);
            }
            return None;
        }
        let id = record.id.clone();
        self.end(&id, Outcome::Found(Box::new(record)))
    }

    /// When the next lookup runs out of time.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|(at, _)| *at)
    }

    /// Ends the lookups whose time is up at `now`, each with the record it
    /// kept (offline), or not found.
    pub(super) fn expire(&mut self, now: Instant) -> Vec<Done<W>> {
        let mut done = Vec::new();
        while let Some((at, id)) = self.deadlines.first().cloned() {
            if at > now {
                break;
            }
            let outcome = match self.pending.get_mut(&id).and_then(|p| p.kept.take()) {
                Some(record) => Outcome::Found(Box::new(record)),
                None => Outcome::NotFound,
            };
            if let Some(d) = self.end(&id, outcome) {
                done.push(d);
            }
        }
        done
    }

    /// The broker connection was lost: every lookup ends.
    pub(super) fn disconnected(&mut self) -> Vec<Done<W>> {
        let ids: Vec<String> = self.pending.keys().cloned().collect();
        ids.iter()
            .filter_map(|id| self.end(id, Outcome::Disconnected))
            .collect()
    }

    fn end(&mut self, id: &str, outcome: Outcome) -> Option<Done<W>> {
        let pending = self.pending.remove(id)?;
        self.deadlines.remove(&(pending.deadline, id.to_string()));
        Some(Done {
            id: id.to_string(),
            outcome,
            waiters: pending.waiters,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::fleet::record::RECORD_VERSION;

    const MS: Duration = Duration::from_millis(1);
    const TIMEOUT: Duration = Duration::from_millis(1000);

    fn record(id: &str, environment: &str, status: RecordStatus, stamp: i64) -> HostRecord {
        HostRecord {
            v: RECORD_VERSION,
            id: id.into(),
            name: id.into(),
            environment_id: environment.into(),
            status,
            capabilities: BTreeMap::new(),
            endpoint: Some("http://127.0.0.1:1".into()),
            estop: None,
            heartbeat_secs: Some(10),
            created_at_ms: 1,
            last_heartbeat_ms: Some(stamp),
            instance: None,
            liveness: None,
            cause: None,
            keep_alive_secs: None,
        }
    }

    #[test]
    fn concurrent_lookups_of_one_id_share_one_subscription_and_end_together() {
        let t0 = Instant::now();
        let mut l = Lookups::new(TIMEOUT);
        assert_eq!(l.ask("f", 1, t0).0, Ask::Subscribe);
        assert_eq!(l.ask("f", 2, t0 + 10 * MS).0, Ask::Joined);
        assert_eq!(l.ask("g", 3, t0 + 20 * MS).0, Ask::Subscribe);
        assert!(l.wants("f") && l.wants("g") && !l.wants("h"));
        let done = l
            .found(record("f", "field", RecordStatus::Online, 5))
            .unwrap();
        assert_eq!(done.id, "f");
        assert_eq!(done.waiters, [1, 2]);
        assert!(matches!(&done.outcome, Outcome::Found(r) if r.environment_id == "field"));
        // ended: a late copy of the record ends nothing more
        assert!(!l.wants("f"));
        assert!(
            l.found(record("f", "field", RecordStatus::Online, 5))
                .is_none()
        );
        // a new lookup of it asks the broker again (nothing is cached)
        assert_eq!(l.ask("f", 4, t0 + 30 * MS).0, Ask::Subscribe);
        assert_eq!(l.len(), 2);
    }

    #[test]
    fn a_lookup_without_a_record_is_not_found_at_its_deadline_not_before() {
        let t0 = Instant::now();
        let mut l = Lookups::new(TIMEOUT);
        l.ask("f", 1, t0);
        // the deadline is the first ask's: joining does not extend it
        l.ask("f", 2, t0 + 900 * MS);
        l.ask("g", 3, t0 + 500 * MS);
        assert_eq!(l.next_deadline(), Some(t0 + TIMEOUT));
        assert!(l.expire(t0 + TIMEOUT - MS).is_empty());
        let done = l.expire(t0 + TIMEOUT);
        assert_eq!(done.len(), 1);
        assert_eq!(
            (done[0].id.as_str(), &done[0].outcome),
            ("f", &Outcome::NotFound)
        );
        assert_eq!(done[0].waiters, [1, 2]);
        assert_eq!(l.next_deadline(), Some(t0 + 500 * MS + TIMEOUT));
        let done = l.expire(t0 + 10 * TIMEOUT);
        assert_eq!((done.len(), done[0].waiters.as_slice()), (1, &[3][..]));
        assert!(l.is_empty());
        assert_eq!(l.next_deadline(), None);
    }

    #[test]
    fn an_offline_record_waits_for_a_live_one_of_another_environment() {
        let t0 = Instant::now();
        let mut l = Lookups::new(TIMEOUT);
        l.ask("f", 1, t0);
        // its old environment's record, offline since it moved
        assert!(
            l.found(record("f", "lab", RecordStatus::Offline, 7))
                .is_none()
        );
        let done = l
            .found(record("f", "field", RecordStatus::Online, 3))
            .unwrap();
        assert!(matches!(&done.outcome, Outcome::Found(r) if r.environment_id == "field"));
        assert_eq!(l.next_deadline(), None);
        // only offline records: the newest of them at the deadline
        l.ask("g", 2, t0);
        assert!(
            l.found(record("g", "a", RecordStatus::Offline, 9))
                .is_none()
        );
        assert!(
            l.found(record("g", "b", RecordStatus::Offline, 4))
                .is_none()
        );
        let done = l.expire(t0 + TIMEOUT);
        assert!(
            matches!(&done[0].outcome, Outcome::Found(r) if r.environment_id == "a" && r.status == RecordStatus::Offline),
            "{:?}",
            done[0].outcome
        );
        // a registered host's record ends the lookup at once
        l.ask("h", 3, t0);
        let done = l
            .found(record("h", "a", RecordStatus::Registered, 1))
            .unwrap();
        assert_eq!(done.waiters, [3]);
    }

    #[test]
    fn lookups_of_more_ids_than_the_bound_are_turned_away_not_kept() {
        let t0 = Instant::now();
        let mut l = Lookups::new(TIMEOUT);
        for i in 0..MAX_LOOKUPS {
            assert_eq!(l.ask(&format!("h{i}"), i, t0).0, Ask::Subscribe);
        }
        assert_eq!(l.ask("one-more", 9999, t0), (Ask::Full, Some(9999)));
        assert!(!l.wants("one-more"));
        // an id already under way is still joined
        assert_eq!(l.ask("h0", 10_000, t0), (Ask::Joined, None));
        // once some end, new ids are taken again
        assert_eq!(l.expire(t0 + TIMEOUT).len(), MAX_LOOKUPS);
        assert_eq!(l.ask("one-more", 9999, t0 + TIMEOUT).0, Ask::Subscribe);
    }

    #[test]
    fn a_lost_connection_ends_every_lookup() {
        let t0 = Instant::now();
        let mut l = Lookups::new(TIMEOUT);
        l.ask("f", 1, t0);
        l.ask("g", 2, t0);
        l.ask("g", 3, t0);
        let mut done = l.disconnected();
        done.sort_by(|a, b| a.id.cmp(&b.id));
        assert_eq!(done.len(), 2);
        assert!(done.iter().all(|d| d.outcome == Outcome::Disconnected));
        assert_eq!(done[1].waiters, [2, 3]);
        assert!(l.is_empty() && l.next_deadline().is_none());
        assert!(l.expire(t0 + 10 * TIMEOUT).is_empty());
    }
}
