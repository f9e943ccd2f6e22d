//! What this host publishes on the broker, each message sealed for its
//! topic: its own record (with stamps that only grow; published when it
//! changes), that it is alive (every heartbeat, for the hosts of its
//! environment) and fleet stop commands.

use super::record::{self, FleetStopCommand, HostRecord, OfflineCause, RecordStatus, ReportedStop};
use super::{Fleet, FleetError, config, seal};

impl Fleet {
    /// This host's record now.
    pub fn own_record(&self, status: RecordStatus) -> HostRecord {
        let mut record = self.own.clone();
        record.status = status;
        record.estop = Some(match self.protective_stop.active() {
            Some(stop) => ReportedStop {
                active: true,
                source: Some(stop.source),
                reason: Some(stop.reason),
                since_unix_ms: Some(stop.since_unix_ms),
            },
            None => ReportedStop::default(),
        });
        record.last_heartbeat_ms = Some(crate::clock::now_ms());
        record
    }

    /// This host's record as published: its stamp later than any record
    /// published under this host's id before (by this process, or — as
    /// far as the broker's retained record shows — by an earlier one), and
    /// sealed for its topic.
    pub(crate) fn sealed_own_record(
        &self,
        status: RecordStatus,
        cause: Option<OfflineCause>,
    ) -> Result<Vec<u8>, FleetError> {
        let mut record = self.own_record(status);
        record.cause = cause;
        record.last_heartbeat_ms = Some(self.next_stamp());
        self.seal(&self.own_topic(), &record)
    }

    /// This host's liveness message and its topic: the process and the
    /// time, sealed.
    pub(crate) fn sealed_alive(&self) -> Result<(String, Vec<u8>), FleetError> {
        let topic = self.topics.alive(&self.own.environment_id, &self.own.id);
        let alive = record::Alive {
            instance: self.own.instance.clone().unwrap_or_default(),
            at_ms: crate::clock::now_ms(),
        };
        let payload = self.seal(&topic, &alive)?;
        Ok((topic, payload))
    }

    fn next_stamp(&self) -> i64 {
        let mut floor = self.stamp_floor.lock();
        let stamp = crate::clock::now_ms().max(floor.saturating_add(1));
        *floor = stamp;
        stamp
    }

    /// `body` as JSON, sealed for `topic`.
    pub(super) fn seal(
        &self,
        topic: &str,
        body: &impl serde::Serialize,
    ) -> Result<Vec<u8>, FleetError> {
        let Some(key) = &self.key else {
            return Err(FleetError::NotConfigured);
        };
        let json = serde_json::to_string(body).map_err(|e| FleetError::Invalid(e.to_string()))?;
        Ok(seal::seal(key, topic, &json))
    }

    pub(super) fn publish(
        &self,
        topic: &str,
        payload: Vec<u8>,
        retain: bool,
    ) -> Result<(), FleetError> {
        let client = self.client.lock().clone();
        let Some(client) = client else {
            return Err(if self.config.is_some() {
                FleetError::Disconnected
            } else {
                FleetError::NotConfigured
            });
        };
        if !self.is_connected() {
            return Err(FleetError::Disconnected);
        }
        self.link
            .check_publish(topic, payload.len())
            .map_err(FleetError::Invalid)?;
        client
            .try_publish(
                topic,
                rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
                retain,
                payload,
            )
            .map_err(|_| FleetError::Busy)
    }

    /// Publishes a retained fleet stop command (`stop`) or its withdrawal
    /// for `environment_id`. Returns the command.
    pub fn publish_stop(
        &self,
        environment_id: &str,
        stop: bool,
        reason: &str,
    ) -> Result<FleetStopCommand, FleetError> {
        if self.config.is_none() {
            return Err(FleetError::NotConfigured);
        }
        if !config::topic_level_ok(environment_id) {
            return Err(FleetError::Invalid(format!(
                "environment_id {environment_id:?} must be 1-128 characters without '/', '+', '#'"
            )));
        }
        let command = FleetStopCommand {
            stop,
            reason: reason.to_string(),
            by: Some(self.own.id.clone()),
            id: Some(uuid::Uuid::new_v4().to_string()),
            at_ms: Some(crate::clock::now_ms()),
        };
        let topic = self.topics.stop(environment_id);
        let payload = self.seal(&topic, &command)?;
        if payload.len() > record::MAX_COMMAND_BYTES {
            return Err(FleetError::Invalid(format!(
                "the command would be {} bytes; at most {} are allowed (shorten the reason)",
                payload.len(),
                record::MAX_COMMAND_BYTES
            )));
        }
        self.publish(&topic, payload, true)?;
        if environment_id == self.own.environment_id {
            // The caller applies it here; its echo from the broker is not
            // applied again.
            self.gate.lock().published(&command, crate::clock::now_ms());
        }
        tracing::warn!(
            environment_id,
            stop,
            reason,
            "published the fleet protective-stop command"
        );
        Ok(command)
    }
}
