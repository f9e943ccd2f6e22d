//! The registry as clients see it: every known host with its presence,
//! and the hosts that are not rozds, registered and deregistered by hand.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::record::{self, HostRecord, RecordStatus};
use super::view::Presence;
use super::{Fleet, FleetError, lock};

/// A host as listed: its record, its presence, and how long ago its record arrived.
#[derive(Debug, Clone, PartialEq)]
pub struct HostView {
    pub record: HostRecord,
    pub presence: Presence,
    /// `true` for the host answering.
    pub this_host: bool,
    /// Since its latest record arrived (`None` for this host).
    pub heard_ago: Option<Duration>,
}

impl HostView {
    pub fn estop_active(&self) -> bool {
        self.record.estop.as_ref().is_some_and(|e| e.active)
    }
}

impl Fleet {
    fn own_view(&self) -> HostView {
        HostView {
            record: self.own_record(RecordStatus::Online),
            presence: Presence::Online,
            this_host: true,
            heard_ago: None,
        }
    }

    /// Every known host (this one included), ordered by id; only those of
    /// `environment_id` when given.
    pub fn list(&self, environment_id: Option<&str>) -> Vec<HostView> {
        let now = Instant::now();
        let mut hosts = vec![self.own_view()];
        {
            let view = lock(&self.view);
            hosts.extend(view.entries().map(|e| HostView {
                record: e.record.clone(),
                presence: view.presence_of(e, now),
                this_host: false,
                heard_ago: Some(now.saturating_duration_since(e.received_at)),
            }));
        }
        hosts.retain(|h| environment_id.is_none_or(|env| h.record.environment_id == env));
        hosts.sort_by(|a, b| a.record.id.cmp(&b.record.id));
        hosts
    }

    pub fn get(&self, id: &str) -> Option<HostView> {
        if id == self.own.id {
            return Some(self.own_view());
        }
        let now = Instant::now();
        let view = lock(&self.view);
        view.get(id).map(|e| HostView {
            record: e.record.clone(),
            presence: view.presence_of(e, now),
            this_host: false,
            heard_ago: Some(now.saturating_duration_since(e.received_at)),
        })
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
