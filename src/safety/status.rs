//! The host's safety state, as `GET /v1/safety` and `GetSafetyStatus` report it.

use serde::Serialize;

use super::StopInfo;
use super::inputs::{GpioStopInput, mqtt_input_name};
use crate::config::types::SafetyConfig;
use crate::ooda::Ooda;
use crate::ooda::orient::AlarmLevel;

/// `level` while nothing is latched.
pub(crate) const LEVEL_NORMAL: &str = "normal";
/// `level` while the protective stop is latched.
pub(crate) const LEVEL_PROTECTIVE_STOP: &str = "protective_stop";

#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct SafetyStatus {
    pub environment_id: String,
    pub estop_active: bool,
    /// `normal` or `protective_stop`.
    pub level: &'static str,
    /// What restricts motion now: `protective_stop:<source>` (one per cause),
    /// `stop_input:<input>` (an input still asserting the stop: clearing is
    /// refused), `critical_alarm:<sensor>`.
    pub active_guards: Vec<String>,
    /// The latched stop's oldest cause.
    pub stop: Option<StopInfo>,
    /// Every active cause, oldest first (a clear names which it removes).
    pub causes: Vec<StopInfo>,
    /// Whether the latch as it is now is written to the stop file (it
    /// survives a restart); `false` after a failed write.
    pub persisted: bool,
    /// The configured stop inputs.
    pub inputs: Vec<InputStatus>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct InputStatus {
    /// `gpio:<pin>` or `mqtt:<topic>`.
    pub name: String,
    /// A GPIO input at its active level (clearing is refused meanwhile).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub asserted: Option<bool>,
    /// Whether the MQTT stop input's connection is up (the topic works only then).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connected: Option<bool>,
    /// MQTT: connections made since start (1 for one never lost).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connections: Option<u64>,
    /// MQTT: messages received on the stop topic.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub received: Option<u64>,
}

/// The safety state now: the loop's latch and alarms, and the configured
/// stop inputs of `safety` on the host of `environment_id`.
pub(crate) fn status(ooda: &Ooda, safety: &SafetyConfig, environment_id: &str) -> SafetyStatus {
    let latch = ooda.protective_stop();
    let state = latch.state();
    let stop = state.first().cloned();
    let held = latch.held_inputs();
    let mut active_guards: Vec<String> = state
        .causes
        .iter()
        .map(|c| format!("protective_stop:{}", c.source))
        .collect();
    active_guards.extend(held.iter().map(|input| format!("stop_input:{input}")));
    active_guards.extend(
        ooda.observation()
            .sensors
            .iter()
            .filter(|s| s.alarm == AlarmLevel::Critical)
            .map(|s| format!("critical_alarm:{}", s.sensor.name)),
    );
    let mut inputs = Vec::new();
    if let Some(g) = GpioStopInput::from_config(safety) {
        let name = g.name();
        inputs.push(InputStatus {
            asserted: Some(held.contains(&name)),
            connected: None,
            connections: None,
            received: None,
            name,
        });
    }
    if let Some(topic) = &safety.estop_mqtt_topic {
        // The input has a broker connection of its own.
        let link = ooda.mqtt().and_then(|m| m.stop_input_stats());
        inputs.push(InputStatus {
            name: mqtt_input_name(topic),
            asserted: None,
            connected: Some(link.is_some_and(|l| l.connected)),
            connections: Some(link.map_or(0, |l| l.connections)),
            received: Some(link.map_or(0, |l| l.received)),
        });
    }
    SafetyStatus {
        environment_id: environment_id.to_string(),
        estop_active: stop.is_some(),
        level: if stop.is_some() {
            LEVEL_PROTECTIVE_STOP
        } else {
            LEVEL_NORMAL
        },
        active_guards,
        stop,
        causes: state.causes,
        persisted: !latch.persist_failed(),
        inputs,
    }
}
