//! The registry as clients see it: every known host with its presence,
//! and the hosts that are not rozds, registered and deregistered by hand.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::time::Duration;

use tokio::time::Instant;

use super::config::ViewScope;
use super::lookup::Outcome;
use super::record::{self, HostRecord, OfflineCause, RecordStatus};
use super::view::{Entry, FleetView, Presence, Why};
use super::{Fleet, FleetError};

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
    pub fn stop_active(&self) -> bool {
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

/// A host looked up outside the view, as the broker's retained record
/// says it is now: `online` until its last will or its own `offline` says
/// otherwise (this host hears neither afterwards: nothing is cached).
fn looked_up_view(record: HostRecord) -> HostView {
    let (presence, why) = match record.status {
        RecordStatus::Online => (Presence::Online, None),
        RecordStatus::Registered => (Presence::Registered, None),
        RecordStatus::Offline => (
            Presence::Offline,
            Some(match record.cause {
                Some(OfflineCause::Shutdown) => Why::Shutdown,
                Some(OfflineCause::Will) => Why::Will,
                Some(OfflineCause::Unknown) | None => Why::Unstated,
            }),
        ),
    };
    HostView {
        record,
        presence,
        this_host: false,
        heard_ago: Some(Duration::ZERO),
        why,
        reported_by: None,
    }
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
        let view = self.view.lock();
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
        let mut counts = self.view.lock().counts();
        for (presence, n) in &mut counts {
            if *presence == Presence::Online {
                *n += 1;
            }
        }
        counts
    }

    /// Refuses a listing of `environment_id` (every environment for
    /// `None`) that this host's view does not hold completely: only a
    /// listing of what it holds is answered (`None` lists the view).
    pub fn listable(&self, environment_id: Option<&str>) -> Result<(), FleetError> {
        match environment_id {
            Some(env) if !self.holds(env) => Err(FleetError::OutOfView(format!(
                "this host ({:?}) holds the hosts of its own environment {:?} only \
                 ([fleet] view = \"environment\"), so it cannot list environment {env:?} \
                 completely; ask a host of {env:?}, or one with [fleet] view = \"fleet\", \
                 which holds every environment (GetHost and sessions by host id reach any \
                 host from here)",
                self.own.id, self.own.environment_id
            ))),
            _ => Ok(()),
        }
    }

    /// Host `id`: from the view, or, for a host outside it, the broker's
    /// retained record of it ([`Fleet::look_up`]). `None`: no such host.
    pub async fn find(&self, id: &str) -> Result<Option<HostView>, FleetError> {
        if let Some(host) = self.get(id) {
            return Ok(Some(host));
        }
        Ok(self.look_up(id).await?.map(looked_up_view))
    }

    /// The broker's retained record of host `id`, looked up (not cached)
    /// when the view does not hold every environment; `None` when the view
    /// holds them all, or no authentic record came within
    /// `lookup_timeout_ms`.
    pub async fn look_up(&self, id: &str) -> Result<Option<HostRecord>, FleetError> {
        let Some(config) = &self.config else {
            return Ok(None);
        };
        // An id that cannot be a topic level could only widen the
        // subscription (`+`, `#`): it names no host.
        if config.view == ViewScope::Fleet || !record::host_id_ok(id) || id == self.own.id {
            return Ok(None);
        }
        if !self.is_connected() {
            return Err(FleetError::Disconnected);
        }
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.lookups
            .try_send((id.to_string(), answer))
            .map_err(|_| FleetError::Busy)?;
        // The broker connection's loop answers every lookup (at its
        // deadline at the latest, or when its connection drops); it ends
        // only at shutdown.
        match answered.await {
            Ok(Outcome::Found(record)) => Ok(Some(*record)),
            Ok(Outcome::NotFound) => Ok(None),
            Ok(Outcome::Busy) => Err(FleetError::Busy),
            Ok(Outcome::Disconnected) | Err(_) => Err(FleetError::Disconnected),
        }
    }

    pub fn get(&self, id: &str) -> Option<HostView> {
        if id == self.own.id {
            return Some(self.own_view());
        }
        let now = Instant::now();
        let view = self.view.lock();
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
        let topic = self.topics.host(&record.environment_id, &record.id);
        let payload = self.seal(&topic, &record)?;
        if payload.len() > record::MAX_RECORD_BYTES {
            return Err(FleetError::Invalid(format!(
                "the record would be {} bytes; at most {} are allowed",
                payload.len(),
                record::MAX_RECORD_BYTES
            )));
        }
        self.publish(&topic, payload, true)?;
        tracing::info!(id = %record.id, name = %record.name, environment_id = %record.environment_id, "registered a host");
        // Into the view only if it holds that environment (else a lookup
        // finds it).
        if self.holds(&record.environment_id) {
            let stored = self.view.lock().insert(record.clone(), Instant::now());
            if let Err(e) = stored {
                tracing::warn!("the registered host is published but not in this view: {e}");
            }
            self.bump();
        }
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
    /// its retained message (in its environment: from the view, or looked
    /// up). A live rozd cannot be removed.
    pub async fn deregister(&self, id: &str) -> Result<(), FleetError> {
        if id == self.own.id {
            return Err(FleetError::Live(id.to_string()));
        }
        if self.config.is_none() {
            return Err(FleetError::NotFound(id.to_string()));
        }
        let environment = match self.find(id).await? {
            None => return Err(FleetError::NotFound(id.to_string())),
            Some(h) if h.presence.is_live() => return Err(FleetError::Live(id.to_string())),
            Some(h) => h.record.environment_id,
        };
        self.publish(&self.topics.host(&environment, id), Vec::new(), true)?;
        self.view.lock().remove(id);
        tracing::info!(id, "deregistered a host");
        self.bump();
        Ok(())
    }
}
