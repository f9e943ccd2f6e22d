//! The registry as clients see it: every known host with its presence,
//! and the hosts that are not rozds, registered and deregistered by hand.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::time::Duration;

use tokio::time::Instant;

use super::record::{self, HostRecord, RecordStatus};
use super::view::{Entry, FleetView, Presence, Why};
use super::{Fleet, FleetError, lock};

/// A host as listed: its record, its presence, and how long ago this host
/// last heard from it.
#[derive(Debug, Clone, PartialEq)]
pub struct HostView {
    pub record: HostRecord,
    pub presence: Presence,
    /// `true` for the host answering.
    pub this_host: bool,
    /// Since this host last heard from it: its latest record, or its
    /// liveness where watched (`None` for this host).
    pub heard_ago: Option<Duration>,
    /// Why it is not live (offline: `shutdown`, `will`; lost: `silent`,
    /// `reported`), `None` while it is.
    pub why: Option<Why>,
    /// The host that reported it lost (with [`Why::Reported`]).
    pub reported_by: Option<String>,
}

impl HostView {
    pub fn estop_active(&self) -> bool {
        self.record.estop.as_ref().is_some_and(|e| e.active)
    }
}

/// One page of a listing and the size of the whole.
#[derive(Debug, Clone, PartialEq)]
pub struct HostPage {
    pub hosts: Vec<HostView>,
    /// Hosts in the listing (of that environment), this one included.
    pub total: usize,
}

fn entry_view(view: &FleetView, entry: &Entry, now: Instant) -> HostView {
    HostView {
        record: entry.record.clone(),
        presence: view.presence_of(entry, now),
        this_host: false,
        heard_ago: Some(now.saturating_duration_since(entry.heard_at)),
        why: view.why(entry, now),
        reported_by: view.reported_by(&entry.record.id).map(str::to_string),
    }
}

impl Fleet {
    fn own_view(&self) -> HostView {
        HostView {
            record: self.own_record(RecordStatus::Online),
            presence: Presence::Online,
            this_host: true,
            heard_ago: None,
            why: None,
            reported_by: None,
        }
    }

    /// Every known host (this one included), ordered by id; only those of
    /// `environment_id` when given.
    pub fn list(&self, environment_id: Option<&str>) -> Vec<HostView> {
        self.page(environment_id, 0, usize::MAX).hosts
    }

    /// `limit` hosts from `offset` of the listing of [`Fleet::list`]. It
    /// walks the ordered view from the start of the environment to the end
    /// of the page (no copy, no sort of the rest), so a page costs what
    /// its hosts cost.
    pub fn page(&self, environment_id: Option<&str>, offset: usize, limit: usize) -> HostPage {
        let now = Instant::now();
        let own_id = self.own.id.as_str();
        let own_listed = environment_id.is_none_or(|env| env == self.own.environment_id);
        let view = lock(&self.view);
        let total = view.count_in(environment_id) + usize::from(own_listed);
        // This host, in its place among the others by id.
        let below = view.range(environment_id, (Bound::Unbounded, Bound::Excluded(own_id)));
        let above = view.range(environment_id, (Bound::Excluded(own_id), Bound::Unbounded));
        let hosts = below
            .map(Some)
            .chain(own_listed.then_some(None))
            .chain(above.map(Some))
            .skip(offset)
            .take(limit)
            .map(|entry| match entry {
                Some(entry) => entry_view(&view, entry, now),
                None => self.own_view(),
            })
            .collect();
        HostPage { hosts, total }
    }

    /// Hosts by presence (this one included), as of the view's latest
    /// transition: kept as things change, no listing.
    pub fn presence_counts(&self) -> [(Presence, usize); 5] {
        let mut counts = lock(&self.view).counts();
        for (presence, n) in &mut counts {
            if *presence == Presence::Online {
                *n += 1;
            }
        }
        counts
    }

    pub fn get(&self, id: &str) -> Option<HostView> {
        if id == self.own.id {
            return Some(self.own_view());
        }
        let now = Instant::now();
        let view = lock(&self.view);
        view.get(id).map(|e| entry_view(&view, e, now))
    }

    /// Adds a host that is not a rozd: it gets an id and a retained record
    /// with status `registered`. An empty `environment_id` means this host's.
    pub fn register(
        &self,
        name: &str,
        environment_id: &str,
        capabilities: BTreeMap<String, String>,
    ) -> Result<HostView, FleetError> {
        if self.config.is_none() {
            return Err(FleetError::NotConfigured);
        }
        let environment_id = if environment_id.is_empty() {
            self.own.environment_id.as_str()
        } else {
            environment_id
        };
        record::check_host_fields(name, environment_id, &capabilities)
            .map_err(|e| FleetError::Invalid(e.to_string()))?;
        let record = HostRecord {
            v: record::RECORD_VERSION,
            id: uuid::Uuid::new_v4().to_string(),
            name: name.trim().to_string(),
            environment_id: environment_id.to_string(),
            status: RecordStatus::Registered,
            capabilities,
            endpoint: None,
            estop: None,
            heartbeat_secs: None,
            created_at_ms: crate::clock::now_ms(),
            last_heartbeat_ms: None,
            instance: None,
            liveness: None,
            cause: None,
            keep_alive_secs: None,
        };
        let payload = self.seal(&self.topics.host(&record.id), &record)?;
        if payload.len() > record::MAX_RECORD_BYTES {
            return Err(FleetError::Invalid(format!(
                "the record would be {} bytes; at most {} are allowed",
                payload.len(),
                record::MAX_RECORD_BYTES
            )));
        }
        self.publish(&self.topics.host(&record.id), payload, true)?;
        tracing::info!(id = %record.id, name = %record.name, environment_id = %record.environment_id, "registered a host");
        let now = Instant::now();
        let stored = lock(&self.view).insert(record.clone(), now);
        if let Err(e) = stored {
            tracing::warn!("the registered host is published but not in this view: {e}");
        }
        self.bump();
        Ok(HostView {
            record,
            presence: Presence::Registered,
            this_host: false,
            heard_ago: Some(Duration::ZERO),
            why: None,
            reported_by: None,
        })
    }

    /// Removes a registered host's record, or an offline rozd's, and clears
    /// its retained message. A live rozd cannot be removed.
    pub fn deregister(&self, id: &str) -> Result<(), FleetError> {
        if id == self.own.id {
            return Err(FleetError::Live(id.to_string()));
        }
        if self.config.is_none() {
            return Err(FleetError::NotFound(id.to_string()));
        }
        match self.get(id) {
            None => return Err(FleetError::NotFound(id.to_string())),
            Some(h) if h.presence.is_live() => return Err(FleetError::Live(id.to_string())),
            Some(_) => {}
        }
        self.publish(&self.topics.host(id), Vec::new(), true)?;
        lock(&self.view).remove(id);
        tracing::info!(id, "deregistered a host");
        self.bump();
        Ok(())
    }
}
