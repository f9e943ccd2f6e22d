//! The fleet view: the other hosts' latest records, when this host last
//! heard from each, and their presence. Plain data and methods, no I/O; the
//! clock is an argument, so every transition is tested with explicit times.
//!
//! A host's presence follows from its record, what this host heard and the
//! clock:
//!
//! - `offline`: its record says so: it shut down (cause `shutdown`) or the
//!   broker published its last will when its connection died (`will`);
//! - `registered`: a host that is not a rozd, added with `RegisterHost`;
//! - `online`: a rozd whose record says so, heard from recently;
//! - `stale`: a rozd not heard from for [`STALE_AFTER_HEARTBEATS`] of its
//!   heartbeat intervals (late, still live: relays still go to it);
//! - `lost`: not heard from for three heartbeats plus
//!   [`LOST_AFTER_KEEP_ALIVES`] of its MQTT keep-alive intervals (by then
//!   the broker would have published its last will, had its connection
//!   died: this one never came), or reported lost by a host that watches
//!   its liveness (for the record the view holds). Not live: no relay goes
//!   to it, until it publishes a newer record.
//!
//! "Heard from": a record refreshed every heartbeat (an older rozd's,
//! [`Liveness::Heartbeat`]) is heard each time it arrives. A record
//! published only on change ([`Liveness::Will`]) ages only in the view of a
//! host that watches liveness ([`FleetView::set_watching`]), where its
//! liveness messages are the signs of life ([`FleetView::heard`]);
//! elsewhere it is `online` until its last will, its own `offline`, or a
//! watcher's report says otherwise.
//!
//! Time-driven transitions are kept in the order they fall due
//! ([`FleetView::advance`]), so the counts by presence are kept as things
//! change, without walking the view; listings walk the ordered view (by id,
//! or by environment and id) and cost what the page costs.
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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::time::Duration;

use tokio::time::Instant;

use super::record::{HostRecord, OfflineCause, RecordStatus, Rejected, parse_record};
use super::stop::MAX_CLOCK_SKEW_MS;

/// How many missed heartbeats make a host stale.
pub const STALE_AFTER_HEARTBEATS: u32 = 3;
/// How many of its keep-alive intervals after it turned stale a silent
/// host is lost (the broker publishes a last will 1.5 keep-alives after a
/// connection fell silent; the rest is margin for its delivery).
pub const LOST_AFTER_KEEP_ALIVES: u32 = 2;
/// Most hosts the view holds; records of further ids are ignored (a bound
/// on what a misbehaving publisher can make us keep).
pub const MAX_HOSTS: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Presence {
    Online,
    Stale,
    Lost,
    Offline,
    Registered,
}

impl Presence {
    /// Every presence, in the order of [`Presence::index`].
    pub const ALL: [Presence; 5] = [
        Presence::Online,
        Presence::Stale,
        Presence::Lost,
        Presence::Offline,
        Presence::Registered,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Presence::Online => "online",
            Presence::Stale => "stale",
            Presence::Lost => "lost",
            Presence::Offline => "offline",
            Presence::Registered => "registered",
        }
    }

    /// A rozd that may be running (sessions are routed only to these).
    pub fn is_live(self) -> bool {
        matches!(self, Presence::Online | Presence::Stale)
    }

    fn index(self) -> usize {
        match self {
            Presence::Online => 0,
            Presence::Stale => 1,
            Presence::Lost => 2,
            Presence::Offline => 3,
            Presence::Registered => 4,
        }
    }
}

/// Why a host is not live: what `rozd hosts` and the dashboard show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Why {
    /// Offline: it shut down and said so.
    Shutdown,
    /// Offline: the broker published its last will (its connection died).
    Will,
    /// Offline by its record, which does not say why (an older rozd's).
    Unstated,
    /// Lost: nothing heard from it (records, liveness) within the bound.
    Silent,
    /// Lost: a host that watches liveness reported it (see [`LostReport`]).
    Reported,
}

impl Why {
    pub fn as_str(self) -> &'static str {
        match self {
            Why::Shutdown => "shutdown",
            Why::Will => "will",
            Why::Unstated => "unstated",
            Why::Silent => "silent",
            Why::Reported => "reported",
        }
    }
}

/// A watcher's report that a host fell silent: it applies to the record
/// it names (by stamp) and to no later one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostReport {
    /// The stamp of the record the watcher held ([`HostRecord::stamp_ms`]).
    pub stamp_ms: i64,
    /// The watcher's host id.
    pub by: String,
}

/// One host as the view knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub record: HostRecord,
    /// When its latest record arrived.
    pub received_at: Instant,
    /// When this host last heard from it: its latest record, or (watched)
    /// its latest liveness message.
    pub heard_at: Instant,
    /// Its presence as of the latest [`FleetView::advance`] (or change).
    presence: Presence,
    /// When its presence changes next by itself (online → stale → lost).
    due: Option<Instant>,
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

/// A presence that changed by itself or by a sign of life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub id: String,
    pub from: Presence,
    pub to: Presence,
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
    /// Used for records that do not state their keep-alive.
    default_keep_alive: Duration,
    /// The environment whose hosts' liveness this host watches (hosts
    /// whose records are published on change age here only if they are of
    /// it: only its liveness messages reach this host).
    watching: Option<String>,
    entries: BTreeMap<String, Entry>,
    /// Host ids by environment, ordered (listings of one environment).
    by_environment: HashMap<String, BTreeSet<String>>,
    /// Pending time-driven transitions, in the order they fall due.
    due: BTreeSet<(Instant, String)>,
    /// Hosts by presence (as of the latest advance), see [`Presence::index`].
    counts: [usize; 5],
    /// Per host id, kept when the host leaves the view (bounded: see
    /// [`FleetView::remember`]).
    newest: HashMap<String, Newest>,
    /// Watchers' reports of lost hosts, by host id (bounded like `newest`).
    reports: HashMap<String, LostReport>,
}

impl FleetView {
    pub fn new(
        own_id: &str,
        default_heartbeat: Duration,
        default_keep_alive: Duration,
    ) -> FleetView {
        FleetView {
            own_id: own_id.to_string(),
            default_heartbeat,
            default_keep_alive,
            watching: None,
            entries: BTreeMap::new(),
            by_environment: HashMap::new(),
            due: BTreeSet::new(),
            counts: [0; 5],
            newest: HashMap::new(),
            reports: HashMap::new(),
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
        self.take(None, topic_id, payload, now, now_ms)
    }

    /// [`FleetView::apply`] for a message on the record topic of
    /// `topic_id` in `topic_environment`: a record of another environment
    /// than its topic's is refused.
    pub fn apply_on(
        &mut self,
        topic_environment: &str,
        topic_id: &str,
        payload: &[u8],
        now: Instant,
        now_ms: i64,
    ) -> Result<Applied, Rejected> {
        self.take(Some(topic_environment), topic_id, payload, now, now_ms)
    }

    fn take(
        &mut self,
        topic_environment: Option<&str>,
        topic_id: &str,
        payload: &[u8],
        now: Instant,
        now_ms: i64,
    ) -> Result<Applied, Rejected> {
        if payload.is_empty() {
            // The record of this topic was cleared: the host leaves the
            // view if that is the record it holds (not if it holds one of
            // another environment, where the host moved).
            let held_here = self.entries.get(topic_id).is_some_and(|e| {
                topic_environment.is_none_or(|env| e.record.environment_id == env)
            });
            return Ok(match held_here.then(|| self.remove(topic_id)).flatten() {
                Some(_) => Applied::Removed {
                    id: topic_id.to_string(),
                },
                None => Applied::Nothing,
            });
        }
        let record = self.check(topic_environment, topic_id, payload, now_ms)?;
        self.insert(record, now)
    }

    /// Parses and checks an authentic record from the record topic of
    /// `topic_id` (in `topic_environment`): its shape, its topic, that it is
    /// not this host's own, and that it is not older than the newest taken
    /// from that host nor written ahead of this host's clock.
    fn check(
        &self,
        topic_environment: Option<&str>,
        topic_id: &str,
        payload: &[u8],
        now_ms: i64,
    ) -> Result<HostRecord, Rejected> {
        let record = parse_record(topic_id, payload)?;
        if let Some(environment) = topic_environment
            && record.environment_id != environment
        {
            return Err(Rejected::WrongEnvironment {
                topic: environment.to_string(),
                record: record.environment_id,
            });
        }
        if record.id == self.own_id {
            return Err(Rejected::Invalid {
                field: "id",
                why: "a record for this host itself".into(),
            });
        }
        self.check_fresh(&record, now_ms)?;
        Ok(record)
    }

    /// A record looked up outside the view (the broker's retained record of
    /// a host of another environment): checked exactly as one the view
    /// takes, and remembered as its host's newest (a later replay of an
    /// older one is refused), but not held.
    pub fn check_looked_up(
        &mut self,
        topic_environment: &str,
        topic_id: &str,
        payload: &[u8],
        now_ms: i64,
    ) -> Result<HostRecord, Rejected> {
        let record = self.check(Some(topic_environment), topic_id, payload, now_ms)?;
        self.remember(&record);
        Ok(record)
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
        let before = self
            .entries
            .get(&record.id)
            .map(|e| self.presence_of(e, now));
        if before.is_none() && self.entries.len() >= MAX_HOSTS {
            return Err(Rejected::Full(self.entries.len()));
        }
        self.remember(&record);
        if self
            .reports
            .get(&record.id)
            .is_some_and(|r| r.stamp_ms < record.stamp_ms())
        {
            // A newer record than the one reported lost: it spoke since.
            self.reports.remove(&record.id);
        }
        self.detach(&record.id);
        let id = record.id.clone();
        let presence = self.attach(
            Entry {
                record,
                received_at: now,
                heard_at: now,
                presence: Presence::Online,
                due: None,
            },
            now,
        );
        Ok(Applied::Stored {
            id,
            before,
            now: presence,
        })
    }

    pub fn remove(&mut self, id: &str) -> Option<Entry> {
        self.detach(id)
    }

    /// Adds `entry` (whose id the view does not hold) with its presence
    /// at `now`, to the indexes and counts.
    fn attach(&mut self, mut entry: Entry, now: Instant) -> Presence {
        let (presence, due) = self.judge(&entry, now);
        entry.presence = presence;
        entry.due = due;
        let id = entry.record.id.clone();
        if let Some(at) = due {
            self.due.insert((at, id.clone()));
        }
        self.counts[presence.index()] += 1;
        self.by_environment
            .entry(entry.record.environment_id.clone())
            .or_default()
            .insert(id.clone());
        self.entries.insert(id, entry);
        presence
    }

    /// Takes `id` out of the view, its indexes and counts.
    fn detach(&mut self, id: &str) -> Option<Entry> {
        let entry = self.entries.remove(id)?;
        if let Some(at) = entry.due {
            self.due.remove(&(at, id.to_string()));
        }
        let count = &mut self.counts[entry.presence.index()];
        *count = count.saturating_sub(1);
        let environment = &entry.record.environment_id;
        if let Some(ids) = self.by_environment.get_mut(environment) {
            ids.remove(id);
            if ids.is_empty() {
                self.by_environment.remove(environment);
            }
        }
        Some(entry)
    }

    /// Re-judges `id` at `now`: its presence, counts and next due time.
    fn settle(&mut self, id: &str, now: Instant) -> Option<Transition> {
        let entry = self.entries.get(id)?;
        let (presence, due) = self.judge(entry, now);
        let (from, was_due) = (entry.presence, entry.due);
        if let Some(at) = was_due {
            self.due.remove(&(at, id.to_string()));
        }
        if let Some(at) = due {
            self.due.insert((at, id.to_string()));
        }
        let entry = self.entries.get_mut(id)?;
        entry.presence = presence;
        entry.due = due;
        let count = &mut self.counts[from.index()];
        *count = count.saturating_sub(1);
        self.counts[presence.index()] += 1;
        Some(Transition {
            id: id.to_string(),
            from,
            to: presence,
        })
    }

    /// When a host that stays silent turns stale and lost, if it ages here.
    fn bounds(&self, record: &HostRecord) -> Option<(Duration, Duration)> {
        if record.status != RecordStatus::Online
            || !(record.refreshed_every_heartbeat()
                || self.watching.as_deref() == Some(record.environment_id.as_str()))
        {
            return None;
        }
        let heartbeat = record
            .heartbeat_secs
            .map_or(self.default_heartbeat, Duration::from_secs);
        let keep_alive = record
            .keep_alive_secs
            .map_or(self.default_keep_alive, Duration::from_secs);
        let stale = heartbeat.saturating_mul(STALE_AFTER_HEARTBEATS);
        Some((
            stale,
            stale.saturating_add(keep_alive.saturating_mul(LOST_AFTER_KEEP_ALIVES)),
        ))
    }

    fn is_reported(&self, record: &HostRecord) -> bool {
        self.reports
            .get(&record.id)
            .is_some_and(|r| r.stamp_ms == record.stamp_ms())
    }

    /// `entry`'s presence at `now` and when it changes next by itself.
    fn judge(&self, entry: &Entry, now: Instant) -> (Presence, Option<Instant>) {
        match entry.record.status {
            RecordStatus::Offline => return (Presence::Offline, None),
            RecordStatus::Registered => return (Presence::Registered, None),
            RecordStatus::Online => {}
        }
        if self.is_reported(&entry.record) {
            return (Presence::Lost, None);
        }
        let Some((stale, lost)) = self.bounds(&entry.record) else {
            return (Presence::Online, None);
        };
        let quiet = now.saturating_duration_since(entry.heard_at);
        if quiet >= lost {
            (Presence::Lost, None)
        } else if quiet >= stale {
            (Presence::Stale, entry.heard_at.checked_add(lost))
        } else {
            (Presence::Online, entry.heard_at.checked_add(stale))
        }
    }

    /// Moves every host whose time has come on (online → stale → lost);
    /// returns what changed, for the log. Call it at [`FleetView::next_due`].
    pub fn advance(&mut self, now: Instant) -> Vec<Transition> {
        let mut changed = Vec::new();
        while let Some((at, id)) = self.due.first().cloned() {
            if at > now {
                break;
            }
            self.due.pop_first();
            if let Some(entry) = self.entries.get_mut(&id) {
                entry.due = None;
            }
            if let Some(t) = self.settle(&id, now)
                && t.from != t.to
            {
                changed.push(t);
            }
        }
        changed
    }

    /// When the next time-driven transition falls due.
    pub fn next_due(&self) -> Option<Instant> {
        self.due.first().map(|(at, _)| *at)
    }

    /// A sign of life from `id` (its liveness message, of process
    /// `instance`) at `now`. Only a watched host whose record is published
    /// on change takes it (the others are heard through their records).
    pub fn heard(&mut self, id: &str, instance: Option<&str>, now: Instant) -> Option<Transition> {
        let entry = self.entries.get_mut(id)?;
        if entry.record.status != RecordStatus::Online
            || entry.record.refreshed_every_heartbeat()
            || (instance.is_some() && entry.record.instance.as_deref() != instance)
        {
            return None;
        }
        entry.heard_at = entry.heard_at.max(now);
        self.settle(id, now).filter(|t| t.from != t.to)
    }

    /// Starts watching the liveness of the hosts of `environment`, or
    /// stops (`None`). Hosts that age only while watched count as heard at
    /// `now` when the watch starts.
    pub fn set_watching(&mut self, environment: Option<&str>, now: Instant) -> Vec<Transition> {
        if environment == self.watching.as_deref() {
            return Vec::new();
        }
        self.watching = environment.map(str::to_string);
        let watching = self.watching.is_some();
        let ids: Vec<String> = self
            .entries
            .values()
            .filter(|e| !e.record.refreshed_every_heartbeat())
            .map(|e| e.record.id.clone())
            .collect();
        let mut changed = Vec::new();
        for id in ids {
            if let Some(entry) = self.entries.get_mut(&id)
                && watching
            {
                entry.heard_at = entry.heard_at.max(now);
            }
            if let Some(t) = self.settle(&id, now)
                && t.from != t.to
            {
                changed.push(t);
            }
        }
        changed
    }

    pub fn is_watching(&self) -> bool {
        self.watching.is_some()
    }

    /// A watcher reported `id` lost (for the record of `report.stamp_ms`).
    pub fn report_lost(
        &mut self,
        id: &str,
        report: LostReport,
        now: Instant,
    ) -> Option<Transition> {
        if self.reports.len() >= MAX_HOSTS.saturating_mul(2) {
            let entries = &self.entries;
            self.reports.retain(|id, _| entries.contains_key(id));
        }
        self.reports.insert(id.to_string(), report);
        self.settle(id, now).filter(|t| t.from != t.to)
    }

    /// The report on `id` was withdrawn (its retained message cleared).
    pub fn withdraw_report(&mut self, id: &str, now: Instant) -> Option<Transition> {
        self.reports.remove(id)?;
        self.settle(id, now).filter(|t| t.from != t.to)
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

    /// How many hosts of `environment` (every one for `None`) the view holds.
    pub fn count_in(&self, environment: Option<&str>) -> usize {
        match environment {
            None => self.entries.len(),
            Some(env) => self.by_environment.get(env).map_or(0, BTreeSet::len),
        }
    }

    /// Hosts by presence, as of the latest [`FleetView::advance`].
    pub fn counts(&self) -> [(Presence, usize); 5] {
        Presence::ALL.map(|p| (p, self.counts[p.index()]))
    }

    /// Every host, ordered by id.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }

    /// The hosts of `environment` (every one for `None`) whose ids lie
    /// within `ids`, ordered by id: what a page of a listing walks.
    pub fn range<'a>(
        &'a self,
        environment: Option<&str>,
        ids: (Bound<&str>, Bound<&str>),
    ) -> Box<dyn Iterator<Item = &'a Entry> + 'a> {
        match environment {
            None => Box::new(self.entries.range::<str, _>(ids).map(|(_, e)| e)),
            Some(env) => match self.by_environment.get(env) {
                Some(set) => Box::new(
                    set.range::<str, _>(ids)
                        .filter_map(|id| self.entries.get(id)),
                ),
                None => Box::new(std::iter::empty()),
            },
        }
    }

    pub fn presence(&self, id: &str, now: Instant) -> Option<Presence> {
        self.entries.get(id).map(|e| self.presence_of(e, now))
    }

    /// `entry`'s presence at `now`.
    pub fn presence_of(&self, entry: &Entry, now: Instant) -> Presence {
        self.judge(entry, now).0
    }

    /// Why `entry` is not live at `now` (`None` while it is, and for a
    /// registered host).
    pub fn why(&self, entry: &Entry, now: Instant) -> Option<Why> {
        match self.presence_of(entry, now) {
            Presence::Offline => Some(match entry.record.cause {
                Some(OfflineCause::Shutdown) => Why::Shutdown,
                Some(OfflineCause::Will) => Why::Will,
                Some(OfflineCause::Unknown) | None => Why::Unstated,
            }),
            Presence::Lost if self.is_reported(&entry.record) => Some(Why::Reported),
            Presence::Lost => Some(Why::Silent),
            Presence::Online | Presence::Stale | Presence::Registered => None,
        }
    }

    /// Who reported `id` lost, if a report applies to its record.
    pub fn reported_by(&self, id: &str) -> Option<&str> {
        let entry = self.entries.get(id)?;
        self.is_reported(&entry.record)
            .then(|| self.reports.get(id).map(|r| r.by.as_str()))
            .flatten()
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
            self.detach(id);
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
    /// The keep-alive of the tests' view (records without their own).
    const KA: Duration = Duration::from_secs(5);
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
            liveness: None,
            cause: None,
            keep_alive_secs: None,
        })
        .unwrap()
    }

    #[test]
    fn a_record_that_stops_refreshing_goes_stale_then_lost_and_a_refresh_revives_it() {
        let t0 = Instant::now();
        let mut v = FleetView::new("a", 10 * SEC, KA);
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
        // three heartbeats plus two of the view's keep-alives (5 s): lost
        assert_eq!(
            v.presence("b", t0 + 16 * SEC - Duration::from_millis(1)),
            Some(Presence::Stale)
        );
        assert_eq!(v.presence("b", t0 + 16 * SEC), Some(Presence::Lost));
        assert_eq!(v.presence("b", t0 + 3600 * SEC), Some(Presence::Lost));
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
        let mut v = FleetView::new("a", SEC, KA);
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
        assert!(
            !Presence::Offline.is_live()
                && !Presence::Registered.is_live()
                && !Presence::Lost.is_live()
        );
        assert!(Presence::Online.is_live() && Presence::Stale.is_live());
    }

    #[test]
    fn an_empty_payload_removes_the_host() {
        let t0 = Instant::now();
        let mut v = FleetView::new("a", SEC, KA);
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
        let mut v = FleetView::new("a", SEC, KA);
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
        let mut v = FleetView::new("a", SEC, KA);
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

    /// A record as a rozd that publishes on change writes it.
    fn on_change(id: &str, env: &str, instance: &str, stamp_ms: i64) -> HostRecord {
        HostRecord {
            v: RECORD_VERSION,
            id: id.into(),
            name: id.to_uppercase(),
            environment_id: env.into(),
            status: RecordStatus::Online,
            capabilities: BTreeMap::new(),
            endpoint: Some("http://127.0.0.1:1".into()),
            estop: None,
            heartbeat_secs: Some(2),
            created_at_ms: 0,
            last_heartbeat_ms: Some(stamp_ms),
            instance: Some(instance.into()),
            liveness: Some(crate::fleet::record::Liveness::Will),
            cause: None,
            keep_alive_secs: Some(10),
        }
    }

    fn counts(v: &FleetView) -> Vec<(&'static str, usize)> {
        v.counts()
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(p, n)| (p.as_str(), n))
            .collect()
    }

    #[test]
    fn counts_follow_time_through_advance_and_each_transition_is_reported_once() {
        let t0 = Instant::now();
        let mut v = FleetView::new("a", 10 * SEC, KA);
        for id in ["b", "c"] {
            apply(&mut v, id, &record(id, RecordStatus::Online, Some(1)), t0).unwrap();
        }
        apply(
            &mut v,
            "r",
            &record("r", RecordStatus::Registered, None),
            t0,
        )
        .unwrap();
        assert_eq!(counts(&v), [("online", 2), ("registered", 1)]);
        assert_eq!(v.next_due(), Some(t0 + 3 * SEC));
        assert_eq!(v.advance(t0 + 2 * SEC), []);
        // c refreshes; b does not
        apply(
            &mut v,
            "c",
            &record("c", RecordStatus::Online, Some(1)),
            t0 + 2 * SEC,
        )
        .unwrap();
        let stale = v.advance(t0 + 3 * SEC);
        assert_eq!(
            stale,
            [Transition {
                id: "b".into(),
                from: Presence::Online,
                to: Presence::Stale
            }]
        );
        assert_eq!(counts(&v), [("online", 1), ("stale", 1), ("registered", 1)]);
        // an advance far past both bounds reports each host once, where it ends
        let later = v.advance(t0 + 3600 * SEC);
        assert_eq!(
            later
                .iter()
                .map(|t| (t.id.as_str(), t.from, t.to))
                .collect::<Vec<_>>(),
            [
                ("c", Presence::Online, Presence::Lost),
                ("b", Presence::Stale, Presence::Lost)
            ]
        );
        assert_eq!(counts(&v), [("lost", 2), ("registered", 1)]);
        assert_eq!(v.next_due(), None);
        assert_eq!(v.advance(t0 + 7200 * SEC), []);
        // a lost host that publishes again is online again; removal counts
        apply(
            &mut v,
            "b",
            &record("b", RecordStatus::Online, Some(1)),
            t0 + 7200 * SEC,
        )
        .unwrap();
        assert_eq!(counts(&v), [("online", 1), ("lost", 1), ("registered", 1)]);
        v.remove("c");
        assert_eq!(counts(&v), [("online", 1), ("registered", 1)]);
    }

    #[test]
    fn a_record_published_on_change_ages_only_where_liveness_is_watched() {
        let t0 = Instant::now();
        let mut v = FleetView::new("a", 10 * SEC, KA);
        v.insert(on_change("b", "lab", "i1", 1), t0).unwrap();
        // not watched: nothing ages it, whatever the time
        assert_eq!(v.presence("b", t0 + 86_400 * SEC), Some(Presence::Online));
        assert_eq!(v.next_due(), None);
        // watched from t0 + 100 s: it counts as heard then
        let start = t0 + 100 * SEC;
        assert_eq!(v.set_watching(Some("lab"), start), []);
        assert_eq!(v.presence("b", start + 5 * SEC), Some(Presence::Online));
        // its liveness (2 s heartbeat) keeps it online
        assert_eq!(v.heard("b", Some("i1"), start + 5 * SEC), None);
        assert_eq!(v.presence("b", start + 10 * SEC), Some(Presence::Online));
        // liveness of another process of that id does not
        assert_eq!(v.heard("b", Some("i0"), start + 10 * SEC), None);
        assert_eq!(v.presence("b", start + 11 * SEC), Some(Presence::Stale));
        // 3 × 2 s + 2 × its own 10 s keep-alive after it was last heard (+5 s)
        assert_eq!(v.presence("b", start + 30 * SEC), Some(Presence::Stale));
        assert_eq!(v.presence("b", start + 31 * SEC), Some(Presence::Lost));
        let lost = v.advance(start + 31 * SEC);
        assert_eq!(lost.last().map(|t| t.to), Some(Presence::Lost));
        assert_eq!(
            v.why(v.get("b").unwrap(), start + 31 * SEC),
            Some(Why::Silent)
        );
        // it speaks again (it had hung): online
        assert_eq!(
            v.heard("b", Some("i1"), start + 35 * SEC),
            Some(Transition {
                id: "b".into(),
                from: Presence::Lost,
                to: Presence::Online
            })
        );
        // no longer watched: no longer ages
        v.set_watching(None, start + 36 * SEC);
        assert_eq!(v.presence("b", start + 3600 * SEC), Some(Presence::Online));
        // watching another environment: no longer ages either
        v.set_watching(Some("lab"), start + 40 * SEC);
        v.set_watching(Some("elsewhere"), start + 41 * SEC);
        assert_eq!(v.presence("b", start + 3600 * SEC), Some(Presence::Online));
        // a record refreshed every heartbeat ignores liveness messages
        v.insert(
            HostRecord {
                liveness: None,
                ..on_change("old", "lab", "i9", 1)
            },
            t0,
        )
        .unwrap();
        assert_eq!(v.heard("old", Some("i9"), t0 + 100 * SEC), None);
        assert_eq!(v.presence("old", t0 + 100 * SEC), Some(Presence::Lost));
    }

    #[test]
    fn a_lost_report_applies_to_the_record_it_names_and_no_later_one() {
        let t0 = Instant::now();
        let mut v = FleetView::new("a", 10 * SEC, KA);
        v.insert(on_change("b", "lab", "i1", 100), t0).unwrap();
        let report = |stamp_ms| LostReport {
            stamp_ms,
            by: "w".into(),
        };
        // a report on an older record changes nothing
        assert_eq!(v.report_lost("b", report(99), t0), None);
        assert_eq!(v.presence("b", t0), Some(Presence::Online));
        let t = v.report_lost("b", report(100), t0).unwrap();
        assert_eq!((t.from, t.to), (Presence::Online, Presence::Lost));
        assert_eq!(v.why(v.get("b").unwrap(), t0), Some(Why::Reported));
        assert_eq!(v.reported_by("b"), Some("w"));
        assert_eq!(counts(&v), [("lost", 1)]);
        // it publishes a newer record: the report no longer applies
        v.insert(on_change("b", "lab", "i1", 101), t0 + SEC)
            .unwrap();
        assert_eq!(v.presence("b", t0 + SEC), Some(Presence::Online));
        assert_eq!(v.reported_by("b"), None);
        // a report that arrives before the record it names still applies
        v.report_lost("c", report(7), t0);
        v.insert(on_change("c", "lab", "i2", 7), t0).unwrap();
        assert_eq!(v.presence("c", t0), Some(Presence::Lost));
        // and its withdrawal ends it
        let t = v.withdraw_report("c", t0).unwrap();
        assert_eq!(t.to, Presence::Online);
        assert_eq!(counts(&v), [("online", 2)]);
    }

    #[test]
    fn offline_records_say_why() {
        let t0 = Instant::now();
        let mut v = FleetView::new("a", 10 * SEC, KA);
        for (id, cause) in [
            ("s", Some(OfflineCause::Shutdown)),
            ("w", Some(OfflineCause::Will)),
            ("u", None),
        ] {
            let mut r = on_change(id, "lab", "i", 1);
            r.status = RecordStatus::Offline;
            r.cause = cause;
            v.insert(r, t0).unwrap();
        }
        v.insert(on_change("o", "lab", "i", 1), t0).unwrap();
        let why = |id: &str| v.why(v.get(id).unwrap(), t0);
        assert_eq!(
            [why("o"), why("s"), why("u"), why("w")],
            [
                None,
                Some(Why::Shutdown),
                Some(Why::Unstated),
                Some(Why::Will)
            ]
        );
    }

    #[test]
    fn listings_walk_the_ordered_view_by_environment() {
        let t0 = Instant::now();
        let mut v = FleetView::new("a", 10 * SEC, KA);
        for (id, env) in [("d", "lab"), ("b", "lab"), ("c", "yard"), ("e", "lab")] {
            v.insert(on_change(id, env, "i", 1), t0).unwrap();
        }
        let ids = |v: &FleetView, env, from: Bound<&str>, to: Bound<&str>| {
            v.range(env, (from, to))
                .map(|e| e.record.id.clone())
                .collect::<Vec<_>>()
        };
        use Bound::{Excluded, Included, Unbounded};
        assert_eq!(ids(&v, None, Unbounded, Unbounded), ["b", "c", "d", "e"]);
        assert_eq!(ids(&v, Some("lab"), Unbounded, Unbounded), ["b", "d", "e"]);
        assert_eq!(ids(&v, Some("lab"), Excluded("b"), Included("d")), ["d"]);
        assert_eq!(
            ids(&v, Some("nowhere"), Unbounded, Unbounded),
            Vec::<String>::new()
        );
        assert_eq!(
            (
                v.count_in(None),
                v.count_in(Some("lab")),
                v.count_in(Some("yard"))
            ),
            (4, 3, 1)
        );
        // a host that moves to another environment moves in the index
        v.insert(on_change("d", "yard", "i", 2), t0).unwrap();
        assert_eq!(ids(&v, Some("yard"), Unbounded, Unbounded), ["c", "d"]);
        assert_eq!(v.count_in(Some("lab")), 2);
        v.remove("c");
        v.remove("d");
        assert_eq!(v.count_in(Some("yard")), 0);
        assert_eq!(
            ids(&v, Some("yard"), Unbounded, Unbounded),
            Vec::<String>::new()
        );
    }
}
