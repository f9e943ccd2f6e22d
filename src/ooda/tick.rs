//! One tick of the loop: orient (alarm levels with hysteresis, staleness),
//! decide (the reflex rules), hand the decided actions off, and every
//! `publish_every` ticks publish the Observation. A tick never awaits:
//! sensor values are read from the world under a short lock, and actions
//! leave as tasks on the runtime, so a slow driver cannot delay the loop.

use std::sync::Arc;

use tokio::time::Instant;

use super::act::MismatchResponse;
use super::feedback::{MISMATCH_SUFFIX, MismatchAction, Sample};
use super::orient::{self, AlarmLevel, AlarmMark};
use super::rules::{self, Action, RulePhase, RuleState};
use super::timer::Wake;
use super::world::Reading;
use super::{Observation, Ooda, SensorObservation};
use crate::ooda::act::Origin;
use crate::safety::{StopRequest, StopSource};

/// What the loop carries from one tick to the next.
#[derive(Debug)]
pub(super) struct TickState {
    seq: u64,
    alarms: Vec<AlarmLevel>,
    /// Since when each sensor is at its level, and the limit it crossed.
    alarm_marks: Vec<Option<AlarmMark>>,
    rules: Vec<RuleState>,
    /// Each rule's phase as last told to [`Ooda::rules_view`].
    rule_phases: Vec<RulePhase>,
    readings: Vec<Reading>,
    /// The actuators with feedback and their sensors' places in
    /// `readings`: the feedback sensor, and the cross-check's if any.
    feedback: Vec<(usize, Option<usize>, Option<Option<usize>>)>,
    until_publish: u64,
}

impl TickState {
    pub(super) fn new(ooda: &Ooda) -> TickState {
        TickState {
            seq: 0,
            alarms: vec![AlarmLevel::Ok; ooda.world.specs().len()],
            alarm_marks: vec![None; ooda.world.specs().len()],
            rules: vec![RuleState::default(); ooda.rules.len()],
            rule_phases: vec![RulePhase::Armed; ooda.rules.len()],
            readings: Vec::with_capacity(ooda.world.specs().len()),
            feedback: ooda
                .actuators
                .feedback_sensors()
                .map(|(actuator, sensor, cross)| {
                    let index = |name| ooda.world.index_of(name);
                    (actuator, index(sensor), cross.map(index))
                })
                .collect(),
            until_publish: 0,
        }
    }
}

impl Ooda {
    pub(super) fn tick(self: &Arc<Self>, state: &mut TickState, wake: Wake) {
        let started = std::time::Instant::now();
        let now = Instant::now();
        state.seq += 1;
        if let Some(sim) = &self.sim {
            // Simulated time advances by whole periods (the skipped ones
            // too), so the same commands give the same world on any clock.
            let periods = if state.seq == 1 { 0 } else { 1 + wake.skipped };
            let periods = u32::try_from(periods).unwrap_or(u32::MAX);
            sim.step(self.period.saturating_mul(periods), self.world.as_ref());
        }
        self.world.readings_into(now, &mut state.readings);
        for (((reading, spec), level), mark) in state
            .readings
            .iter()
            .zip(self.world.specs())
            .zip(state.alarms.iter_mut())
            .zip(state.alarm_marks.iter_mut())
        {
            if let Some(v) = reading.value.filter(|_| reading.healthy) {
                let next = orient::next_level(&spec.alarms, *level, v);
                if next != *level {
                    *mark = (next != AlarmLevel::Ok).then(|| AlarmMark {
                        since_unix_ms: crate::clock::now_ms(),
                        limit: orient::crossed(&spec.alarms, next, v),
                    });
                    *level = next;
                }
            }
        }
        // Commanded versus measured, before the rules read the alarms.
        for &(actuator, sensor, cross) in &state.feedback {
            let sample_of = |sensor: Option<usize>| {
                sensor
                    .and_then(|i| state.readings.get(i))
                    .map_or_else(Sample::default, |r| Sample {
                        latest: r.value.zip(r.at),
                        healthy: r.healthy,
                    })
            };
            let sample = sample_of(sensor);
            let cross = cross.map(sample_of);
            if let Some(response) = self.actuators.step_feedback(actuator, sample, cross, now) {
                self.on_mismatch(response);
            }
        }
        let facts = TickFacts {
            ooda: self,
            readings: &state.readings,
            alarms: &state.alarms,
        };
        for (i, (rule, rule_state)) in self.rules.iter().zip(state.rules.iter_mut()).enumerate() {
            let fired = rule.step(rule_state, &facts, now);
            // The action first: a stop latches here and now. The status
            // takes the firing and the action's result in either order
            // (see `RuleStatus::fired`).
            if fired {
                tracing::info!(rule = %rule.name, action = ?rule.action, "reflex rule fired");
                self.hand_off(i, rule, rule_state.fired);
            }
            // Told only on a change: most ticks take no lock here.
            let phase = rule_state.phase();
            if fired || state.rule_phases.get(i) != Some(&phase) {
                if let Some(known) = state.rule_phases.get_mut(i) {
                    *known = phase;
                }
                let count = rule_state.fired;
                self.rule_status.send_modify(|all| {
                    if let Some(status) = all.get_mut(i) {
                        status.phase = Some(phase);
                        if fired {
                            status.fired(count, crate::clock::now_ms());
                        }
                    }
                });
            }
        }
        if state.until_publish == 0 {
            self.publish(state, now);
            state.until_publish = self.publish_every.saturating_sub(1);
        } else {
            state.until_publish -= 1;
        }
        let exec = started.elapsed();
        super::metrics::loop_tick(wake.late, exec);
        self.tick_history
            .lock()
            .tick(micros(wake.late), micros(exec), wake.skipped);
    }

    /// A fired rule's action leaves the tick: a stop latches here and now
    /// (so nothing can be commanded in between), everything that touches a
    /// driver or the network runs as a task.
    /// `count`: which firing of the rule this is, for its status.
    fn hand_off(self: &Arc<Self>, index: usize, rule: &rules::Rule, count: u64) {
        let source = StopSource::Rule(rule.name.clone());
        if let Action::ProtectiveStop { reason } = &rule.action {
            self.protective_stop
                .trigger(StopRequest::new(&source, reason));
        }
        let me = self.clone();
        let rule = rule.clone();
        self.runtime.spawn(async move {
            let result = match &rule.action {
                Action::Command { actuator, value } => match me
                    .actuators
                    .command(actuator, *value, Origin::Rule(rule.name.clone()), None)
                    .await
                {
                    Ok(_) => format!("{actuator} set to {value}"),
                    Err(e) => {
                        tracing::warn!(rule = %rule.name, error = %e, "reflex command refused");
                        format!("{actuator} not set: {e}")
                    }
                },
                Action::ProtectiveStop { reason } => {
                    me.trigger_stop(StopRequest::new(&source, reason)).await;
                    "protective stop latched".to_string()
                }
                Action::Publish {
                    topic,
                    payload,
                    qos,
                } => match &me.mqtt {
                    Some(mqtt) => match mqtt.publish(topic, payload.clone(), *qos, false) {
                        Ok(()) => format!("published to {topic}"),
                        Err(e) => {
                            tracing::warn!(rule = %rule.name, error = %e, "reflex publish failed");
                            format!("not published to {topic}: {e}")
                        }
                    },
                    None => {
                        tracing::warn!(rule = %rule.name, "no MQTT client to publish with");
                        "not published: no MQTT client".to_string()
                    }
                },
            };
            me.rule_status.send_modify(|all| {
                if let Some(status) = all.get_mut(index) {
                    status.action_done(count, result);
                }
            });
        });
    }

    /// What `on_mismatch` asks for leaves the tick as a rule's action does:
    /// the stop is latched already (see `Actuators::step_feedback`); the
    /// safe drives run as a task.
    fn on_mismatch(self: &Arc<Self>, response: MismatchResponse) {
        let me = self.clone();
        self.runtime.spawn(async move {
            match response.action {
                MismatchAction::DriveSafe => {
                    // An unknown name cannot come from the actuators' own list.
                    let _ = me
                        .actuators
                        .safe(&response.actuator, &response.reason)
                        .await;
                }
                MismatchAction::LatchStop => {
                    me.trigger_stop(StopRequest::new(&response.source, &response.reason))
                        .await;
                }
            }
        });
    }

    fn publish(&self, state: &TickState, now: Instant) {
        let sensors = self
            .world
            .sensors(now)
            .into_iter()
            .zip(&state.alarms)
            .zip(&state.alarm_marks)
            .map(|((sensor, alarm), mark)| SensorObservation::new(sensor, *alarm, *mark))
            .collect();
        let stop = self.protective_stop.state();
        self.latest.send_replace(Arc::new(Observation {
            seq: state.seq,
            at_unix_ms: crate::clock::now_ms(),
            protective_stop: stop.first().cloned(),
            protective_stop_causes: stop.causes,
            sensors,
            actuators: self.actuators.views(now),
            sources: self.sources(),
            sim: self.sim_world(),
        }));
    }
}

fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// What the rules read during a tick: this tick's readings and alarm
/// levels, and the actuators' current values.
struct TickFacts<'a> {
    ooda: &'a Ooda,
    readings: &'a [Reading],
    alarms: &'a [AlarmLevel],
}

impl TickFacts<'_> {
    fn reading(&self, name: &str) -> Option<(usize, &Reading)> {
        let i = self.ooda.world.index_of(name)?;
        self.readings.get(i).map(|r| (i, r))
    }
}

impl rules::Facts for TickFacts<'_> {
    fn value(&self, name: &str) -> Option<f64> {
        match self.reading(name) {
            Some((_, r)) => r.value,
            None => self.ooda.actuators.value(name).or_else(|| {
                // `<actuator>.mismatch`: its feedback alarm.
                name.strip_suffix(MISMATCH_SUFFIX)
                    .and_then(|a| self.ooda.actuators.mismatch(a))
            }),
        }
    }
    fn stale(&self, name: &str) -> bool {
        self.reading(name).is_some_and(|(_, r)| !r.healthy)
    }
    fn alarm(&self, name: &str) -> f64 {
        self.reading(name)
            .and_then(|(i, _)| self.alarms.get(i))
            .map_or(0.0, |a| a.as_number())
    }
    fn age_ms(&self, name: &str) -> Option<f64> {
        self.reading(name)
            .and_then(|(_, r)| r.age_ms)
            .map(|a| a as f64)
    }
}
