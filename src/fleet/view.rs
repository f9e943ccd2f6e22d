//! The fleet view: every other host's latest record and when it arrived.
//! Plain data and methods, no I/O; the clock is an argument, so every
//! transition is tested with explicit times.
//!
//! A host's presence follows from its record and the clock:
//!
//! - `offline`: its record says so (it shut down, or the broker published
//!   its last will when its connection died);
//! - `registered`: a host that is not a rozd, added with `RegisterHost`;
//! - `stale`: a rozd whose record says `online` but which has not refreshed
//!   it for three of its heartbeat intervals;
//! - `online`: otherwise.
//!
//! Records only move forward: the view remembers, per host id, the newest
//! record it took (by [`HostRecord::stamp_ms`], also after the host left
//! the view) and refuses an older one — a replay of an authentic old record
//! cannot bring back an old endpoint or status. The one exception is a
//! host's last will: it is written when its connection opens, before the
//! heartbeats of that connection, so an `offline` record of the process
//! (`instance`) the view holds is taken although it is older. Records
//! written more than [`MAX_CLOCK_SKEW_MS`] ahead of this host's clock are
//! refused too, so that one host's wrong clock cannot hold its own later
//! records back.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use super::record::{HostRecord, RecordStatus, Rejected, parse_record};
use super::stop::MAX_CLOCK_SKEW_MS;

/// How many missed heartbeats make a host stale.
pub const STALE_AFTER_HEARTBEATS: u32 = 3;
/// Most hosts the view holds; records of further ids are ignored (a bound
/// on what a misbehaving publisher can make us keep).
pub const MAX_HOSTS: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Presence {
    Online,
    Stale,
    Offline,
    Registered,
}

impl Presence {
    pub fn as_str(self) -> &'static str {
        match self {
            Presence::Online => "online",
            Presence::Stale => "stale",
            Presence::Offline => "offline",
            Presence::Registered => "registered",
        }
    }

    /// A rozd that may be running (sessions are routed only to these).
    pub fn is_live(self) -> bool {
        matches!(self, Presence::Online | Presence::Stale)
    }
}

/// One host as the view knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub record: HostRecord,
    /// When its latest record arrived.
    pub received_at: Instant,
}

/// What [`FleetView::apply`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// A record was stored; `before` is the host's presence until then.
    Stored {
        id: String,
        before: Option<Presence>,
        now: Presence,
    },
    /// An empty payload: the host's retained record was cleared.
    Removed { id: String },
    /// An empty payload for a host the view did not hold.
    Nothing,
}

/// The newest record taken from a host.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Newest {
    stamp_ms: i64,
    instance: Option<String>,
}

#[derive(Debug, Clone)]
pub struct FleetView {
    own_id: String,
    /// Used for records that do not state their interval.
    default_heartbeat: Duration,
    entries: BTreeMap<String, Entry>,
    /// Per host id, kept when the host leaves the view (bounded: see
    /// [`FleetView::remember`]).
    newest: HashMap<String, Newest>,
}

impl FleetView {
    pub fn new(own_id: &str, default_heartbeat: Duration) -> FleetView {
        FleetView {
            own_id: own_id.to_string(),
            default_heartbeat,
            entries: BTreeMap::new(),
            newest: HashMap::new(),
        }
    }

    /// Takes in an authentic message (the opened body) from the topic of
    /// `topic_id`, at `now` (`now_ms` on the wall clock). Records of this
    /// host itself are not kept (it knows itself better); invalid or
    /// replayed ones change nothing.
    pub fn apply(
        &mut self,
        topic_id: &str,
        payload: &[u8],
        now: Instant,
        now_ms: i64,
    ) -> Result<Applied, Rejected> {
        if payload.is_empty() {
            return Ok(match self.entries.remove(topic_id) {
                Some(_) => Applied::Removed {
                    id: topic_id.to_string(),
                },
                None => Applied::Nothing,
            });
        }
        let record = parse_record(topic_id, payload)?;
        if record.id == self.own_id {
            return Err(Rejected::Invalid {
                field: "id",
                why: "a record for this host itself".into(),
            });
        }
        self.check_fresh(&record, now_ms)?;
        self.insert(record, now)
    }

    /// Whether `record` may replace what the view knows of its host.
    fn check_fresh(&self, record: &HostRecord, now_ms: i64) -> Result<(), Rejected> {
        let stamp_ms = record.stamp_ms();
        if stamp_ms > now_ms.saturating_add(MAX_CLOCK_SKEW_MS) {
            return Err(Rejected::Future { stamp_ms, now_ms });
        }
        match self.newest.get(&record.id) {
            Some(newest) if stamp_ms < newest.stamp_ms => {
                let own_last_will = record.status == RecordStatus::Offline
                    && record.instance.is_some()
                    && record.instance == newest.instance;
                if own_last_will {
                    Ok(())
                } else {
                    Err(Rejected::Replayed {
                        stamp_ms,
                        newest_ms: newest.stamp_ms,
                    })
                }
            }
            _ => Ok(()),
        }
    }

    /// Remembers `record` as its host's newest if it is. The memory holds
    /// at most twice [`MAX_HOSTS`] ids: beyond, ids that left the view are
    /// forgotten first.
    fn remember(&mut self, record: &HostRecord) {
        let stamp_ms = record.stamp_ms();
        if let Some(newest) = self.newest.get_mut(&record.id) {
            if stamp_ms >= newest.stamp_ms {
                newest.stamp_ms = stamp_ms;
                newest.instance.clone_from(&record.instance);
            }
            return;
        }
        if self.newest.len() >= MAX_HOSTS.saturating_mul(2) {
            let entries = &self.entries;
            self.newest.retain(|id, _| entries.contains_key(id));
        }
        self.newest.insert(
            record.id.clone(),
            Newest {
                stamp_ms,
                instance: record.instance.clone(),
            },
        );
    }

    /// Stores a record that is already checked (e.g. one this host published).
    pub fn insert(&mut self, record: HostRecord, now: Instant) -> Result<Applied, Rejected> {
        let before = self.presence(&record.id, now);
        if before.is_none() && self.entries.len() >= MAX_HOSTS {
            return Err(Rejected::Full(self.entries.len()));
        }
        self.remember(&record);
        let id = record.id.clone();
        let entry = Entry {
            record,
            received_at: now,
        };
        let presence = self.presence_of(&entry, now);
        self.entries.insert(id.clone(), entry);
        Ok(Applied::Stored {
            id,
            before,
            now: presence,
        })
    }

    pub fn remove(&mut self, id: &str) -> Option<Entry> {
        self.entries.remove(id)
    }

    pub fn get(&self, id: &str) -> Option<&Entry> {
        self.entries.get(id)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every host, ordered by id.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }

    pub fn presence(&self, id: &str, now: Instant) -> Option<Presence> {
        self.entries.get(id).map(|e| self.presence_of(e, now))
    }

    pub fn presence_of(&self, entry: &Entry, now: Instant) -> Presence {
        match entry.record.status {
            RecordStatus::Offline => Presence::Offline,
            RecordStatus::Registered => Presence::Registered,
            RecordStatus::Online => {
                let interval = entry
                    .record
                    .heartbeat_secs
                    .map_or(self.default_heartbeat, Duration::from_secs);
                if now.saturating_duration_since(entry.received_at)
                    >= interval.saturating_mul(STALE_AFTER_HEARTBEATS)
                {
                    Presence::Stale
                } else {
                    Presence::Online
                }
            }
        }
    }

    /// Drops the hosts whose record did not arrive again since `since` (a
    /// new broker session): the broker resends every retained record on
    /// subscribing, so a record it did not resend was cleared meanwhile.
    /// Returns the removed ids.
    pub fn prune_older_than(&mut self, since: Instant) -> Vec<String> {
        let gone: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, e)| e.received_at < since)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &gone {
            self.entries.remove(id);
        }
        gone
    }
}

pub use crate::logging::LogLimiter;

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::fleet::record::RECORD_VERSION;

    const SEC: Duration = Duration::from_secs(1);
    /// The wall clock of the tests that are not about it.
    const NOW_MS: i64 = 1_800_000_000_000;

    fn apply(
        v: &mut FleetView,
        id: &str,
        payload: &[u8],
        now: Instant,
    ) -> Result<Applied, Rejected> {
        v.apply(id, payload, now, NOW_MS)
    }

    fn record(id: &str, status: RecordStatus, heartbeat_secs: Option<u64>) -> Vec<u8> {
        serde_json::to_vec(&HostRecord {
            v: RECORD_VERSION,
            id: id.into(),
            name: id.to_uppercase(),
            environment_id: "lab".into(),
            status,
            capabilities: BTreeMap::new(),
            endpoint: Some("http://127.0.0.1:1".into()),
            estop: None,
            heartbeat_secs,
            created_at_ms: 0,
            last_heartbeat_ms: None,
            instance: None,
        })
        .unwrap()
    }

    #[test]
    fn online_goes_stale_after_three_missed_heartbeats_and_a_refresh_revives_it() {
        let t0 = Instant::now();
        let mut v = FleetView::new("a", 10 * SEC);
        let applied = apply(&mut v, "b", &record("b", RecordStatus::Online, Some(2)), t0).unwrap();
        assert_eq!(
            applied,
            Applied::Stored {
                id: "b".into(),
                before: None,
                now: Presence::Online
            }
        );
        // the record's own interval (2 s) counts, not ours (10 s)
        assert_eq!(v.presence("b", t0 + 5 * SEC), Some(Presence::Online));
        assert_eq!(
            v.presence("b", t0 + 6 * SEC - Duration::from_millis(1)),
            Some(Presence::Online)
        );
        assert_eq!(v.presence("b", t0 + 6 * SEC), Some(Presence::Stale));
        assert_eq!(v.presence("b", t0 + 3600 * SEC), Some(Presence::Stale));
        let applied = apply(
            &mut v,
            "b",
            &record("b", RecordStatus::Online, Some(2)),
            t0 + 7 * SEC,
        )
        .unwrap();
        assert_eq!(
            applied,
            Applied::Stored {
                id: "b".into(),
                before: Some(Presence::Stale),
                now: Presence::Online
            }
        );
        // without an interval in the record, ours
        apply(&mut v, "c", &record("c", RecordStatus::Online, None), t0).unwrap();
        assert_eq!(v.presence("c", t0 + 29 * SEC), Some(Presence::Online));
        assert_eq!(v.presence("c", t0 + 30 * SEC), Some(Presence::Stale));
    }

    #[test]
    fn offline_and_registered_do_not_age() {
        let t0 = Instant::now();
        let mut v = FleetView::new("a", SEC);
        apply(&mut v, "b", &record("b", RecordStatus::Online, Some(1)), t0).unwrap();
        let applied = apply(
            &mut v,
            "b",
            &record("b", RecordStatus::Offline, Some(1)),
            t0 + SEC,
        )
        .unwrap();
        assert!(matches!(
            applied,
            Applied::Stored {
                before: Some(Presence::Online),
                now: Presence::Offline,
                ..
            }
        ));
        apply(
            &mut v,
            "r",
            &record("r", RecordStatus::Registered, None),
            t0,
        )
        .unwrap();
        let later = t0 + 86_400 * SEC;
        assert_eq!(v.presence("b", later), Some(Presence::Offline));
        assert_eq!(v.presence("r", later), Some(Presence::Registered));
        assert!(!Presence::Offline.is_live() && !Presence::Registered.is_live());
        assert!(Presence::Online.is_live() && Presence::Stale.is_live());
    }

    #[test]
    fn an_empty_payload_removes_the_host() {
        let t0 = Instant::now();
        let mut v = FleetView::new("a", SEC);
        apply(
            &mut v,
            "r",
            &record("r", RecordStatus::Registered, None),
            t0,
        )
        .unwrap();
        assert_eq!(
            apply(&mut v, "r", b"", t0),
            Ok(Applied::Removed { id: "r".into() })
        );
        assert_eq!(apply(&mut v, "r", b"", t0), Ok(Applied::Nothing));
        assert!(v.is_empty());
    }

    #[test]
    fn bad_records_change_nothing() {
        let t0 = Instant::now();
        let mut v = FleetView::new("a", SEC);
        apply(&mut v, "b", &record("b", RecordStatus::Online, Some(5)), t0).unwrap();
        let before = v.get("b").cloned();
        // malformed, oversized, forged for another topic, our own id
        assert!(apply(&mut v, "b", b"{\"id\":", t0 + SEC).is_err());
        let mut huge = b"{\"id\":\"b\",\"name\":\"".to_vec();
        huge.extend(std::iter::repeat_n(b'x', 100_000));
        huge.extend(b"\"}");
        assert!(matches!(
            apply(&mut v, "b", &huge, t0 + SEC),
            Err(Rejected::Oversized { .. })
        ));
        assert!(matches!(
            apply(
                &mut v,
                "b",
                &record("c", RecordStatus::Offline, None),
                t0 + SEC
            ),
            Err(Rejected::WrongTopic { .. })
        ));
        assert!(apply(&mut v, "a", &record("a", RecordStatus::Online, None), t0).is_err());
        assert!(apply(&mut v, "evil", b"\x00\xff", t0).is_err());
        assert_eq!(v.get("b").cloned(), before);
        assert_eq!(v.len(), 1);
        assert_eq!(v.presence("b", t0 + 2 * SEC), Some(Presence::Online));
    }

    #[test]
    fn pruning_drops_what_the_broker_did_not_resend() {
        let t0 = Instant::now();
        let mut v = FleetView::new("a", SEC);
        for id in ["b", "c", "r"] {
            apply(&mut v, id, &record(id, RecordStatus::Registered, None), t0).unwrap();
        }
        let reconnected = t0 + 10 * SEC;
        // the broker resends b and c after the new subscription, not r
        for id in ["b", "c"] {
            apply(
                &mut v,
                id,
                &record(id, RecordStatus::Registered, None),
                reconnected + SEC,
            )
            .unwrap();
        }
        assert_eq!(v.prune_older_than(reconnected), ["r"]);
        let ids: Vec<&str> = v.entries().map(|e| e.record.id.as_str()).collect();
        assert_eq!(ids, ["b", "c"]);
    }
}
