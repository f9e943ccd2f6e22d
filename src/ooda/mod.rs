//! The observe–orient–decide–act loop. It runs whether or not a session is
//! connected: drivers observe into the [`world::World`]; every tick orients
//! (alarms, staleness) into an [`Observation`], decides with the reflex
//! [`rules`], and acts through [`act::Actuators`].

pub mod act;
pub mod orient;
pub mod rules;
pub mod world;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::hw::config::{ActuatorTarget, HardwareSpec, SensorSource};
use crate::hw::gpio::{self, GpioActuator, GpioBackend};
use crate::hw::mqtt::{Mqtt, MqttActuator};
use crate::hw::serial::{SerialActuator, SerialPortHandle, SerialPorts};
use crate::hw::sim::SimActuator;
use crate::hw::{ActuatorDriver, HwError, Readings};
use crate::safety::{ProtectiveStop, StopInfo};
use act::{ActuatorView, Actuators, Origin};
use orient::AlarmLevel;
use rules::{Action, Rule, RuleState};
use world::{SensorView, SourceView, World};

/// Lateness samples kept for the loop's statistics.
const LATENESS_WINDOW: usize = 4096;
/// Longest start-up waits for the serial ports' first open and the MQTT
/// client's first connection before driving every actuator safe.
const START_SETTLE: Duration = Duration::from_secs(3);

#[derive(Debug, thiserror::Error)]
pub enum OodaError {
    #[error("GPIO: {0}")]
    Gpio(HwError),
    #[error("actuator {name}: {error}")]
    Actuator { name: String, error: HwError },
    #[error("sensor {name}: {error}")]
    Sensor { name: String, error: HwError },
    #[error("{0}")]
    Unsupported(String),
}

/// What the host knows at one tick.
#[derive(Debug, Clone, Serialize)]
pub struct Observation {
    pub seq: u64,
    pub at_unix_ms: i64,
    /// The protective stop's oldest cause, if latched.
    pub protective_stop: Option<StopInfo>,
    /// Every active cause of the protective stop, oldest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub protective_stop_causes: Vec<StopInfo>,
    pub sensors: Vec<SensorObservation>,
    pub actuators: Vec<ActuatorView>,
    pub sources: Vec<SourceView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SensorObservation {
    #[serde(flatten)]
    pub sensor: SensorView,
    pub alarm: AlarmLevel,
}

impl Observation {
    pub fn sensor(&self, name: &str) -> Option<&SensorObservation> {
        self.sensors.iter().find(|s| s.sensor.name == name)
    }
}

/// Tick lateness statistics, for `/v1/status` and the benchmark.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct LoopStats {
    pub tick_hz: f64,
    pub ticks: u64,
    pub missed_ticks: u64,
    pub lateness_p50_us: u64,
    pub lateness_p99_us: u64,
    pub lateness_max_us: u64,
}

#[derive(Debug, Default)]
struct StatsInner {
    ticks: u64,
    missed: u64,
    max_us: u64,
    recent: std::collections::VecDeque<u64>,
}

pub struct Ooda {
    world: Arc<World>,
    actuators: Arc<Actuators>,
    estop: ProtectiveStop,
    rules: Vec<Rule>,
    period: Duration,
    latest: watch::Sender<Arc<Observation>>,
    stats: Mutex<StatsInner>,
    gpio: Arc<dyn GpioBackend>,
    sim_actuators: HashMap<String, Arc<SimActuator>>,
    serial: SerialPorts,
    mqtt: Option<Mqtt>,
    shutdown: CancellationToken,
}

impl std::fmt::Debug for Ooda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ooda")
            .field("period", &self.period)
            .field("rules", &self.rules.len())
            .finish()
    }
}

impl Ooda {
    /// Builds the world and actuators from validated config, starts the
    /// serial ports and the MQTT client, drives every actuator to its safe
    /// value, starts the sensor tasks and the tick loop.
    pub async fn start(
        hardware: &HardwareSpec,
        rules: Vec<Rule>,
        tick_hz: f64,
        host_id: &str,
        estop: ProtectiveStop,
    ) -> Result<Arc<Ooda>, OodaError> {
        let gpio = gpio::open_backend(hardware.gpio_backend).map_err(OodaError::Gpio)?;
        let world = Arc::new(World::new(hardware.sensors.clone()));
        let shutdown = CancellationToken::new();
        let readings: Arc<dyn Readings> = world.clone();
        let mut serial = SerialPorts::start(
            &hardware.serial,
            &hardware.sensors,
            readings.clone(),
            shutdown.clone(),
        );
        let mqtt = hardware.mqtt.as_ref().map(|cfg| {
            Mqtt::start(
                cfg,
                host_id,
                &hardware.sensors,
                readings.clone(),
                shutdown.clone(),
            )
        });
        let mut drivers: Vec<(crate::hw::config::ActuatorSpec, Arc<dyn ActuatorDriver>)> =
            Vec::new();
        let mut sim_actuators = HashMap::new();
        for spec in &hardware.actuators {
            let err = |error| OodaError::Actuator {
                name: spec.name.clone(),
                error,
            };
            let driver: Arc<dyn ActuatorDriver> = match &spec.target {
                ActuatorTarget::Sim => {
                    let sim = SimActuator::new();
                    sim_actuators.insert(spec.name.clone(), sim.clone());
                    sim
                }
                ActuatorTarget::Gpio { pin, active } => Arc::new(GpioActuator::digital(
                    gpio.output(*pin).map_err(err)?,
                    *active,
                )),
                ActuatorTarget::Pwm { pin, frequency_hz } => Arc::new(GpioActuator::pwm(
                    gpio.output(*pin).map_err(err)?,
                    *frequency_hz,
                )),
                ActuatorTarget::Serial { .. } => match SerialActuator::from_spec(spec, &serial) {
                    Some(driver) => Arc::new(driver),
                    None => {
                        return Err(OodaError::Unsupported(format!(
                            "actuator {}: its serial port was not started",
                            spec.name
                        )));
                    }
                },
                ActuatorTarget::Mqtt { .. } => {
                    match mqtt.as_ref().and_then(|m| MqttActuator::from_spec(spec, m)) {
                        Some(driver) => Arc::new(driver),
                        None => {
                            return Err(OodaError::Unsupported(format!(
                                "actuator {}: no MQTT client",
                                spec.name
                            )));
                        }
                    }
                }
            };
            drivers.push((spec.clone(), driver));
        }
        let actuators = Actuators::new(drivers, estop.clone());
        // The start-up safe values must reach the devices, not a port that
        // is not open yet: let each serial port try to open its device and
        // the MQTT client try to connect first (bounded; absent devices and
        // brokers are not waited for).
        let settled = tokio::time::timeout(START_SETTLE, async {
            serial.first_open_attempts().await;
            if let Some(mqtt) = &mqtt {
                mqtt.first_connection_attempt().await;
            }
        })
        .await;
        if settled.is_err() {
            tracing::warn!(
                "serial ports or MQTT not settled within {START_SETTLE:?}; driving the safe values anyway"
            );
        }
        actuators.safe_all("start-up").await;

        for sensor in &hardware.sensors {
            let name = sensor.name.clone();
            match &sensor.source {
                SensorSource::Sim(spec) => {
                    tokio::spawn(crate::hw::sim::run_sensor(
                        name,
                        spec.clone(),
                        readings.clone(),
                        shutdown.clone(),
                    ));
                }
                SensorSource::System { metric, every } => {
                    tokio::spawn(crate::hw::system::run_sensor(
                        name,
                        *metric,
                        *every,
                        readings.clone(),
                        shutdown.clone(),
                    ));
                }
                SensorSource::Gpio {
                    pin,
                    pull,
                    active,
                    debounce,
                    poll,
                } => {
                    let input = gpio.input(*pin, *pull).map_err(|error| OodaError::Sensor {
                        name: name.clone(),
                        error,
                    })?;
                    tokio::spawn(gpio::run_input(
                        name,
                        input,
                        *active,
                        *debounce,
                        *poll,
                        readings.clone(),
                        shutdown.clone(),
                    ));
                }
                // Serial and MQTT sensors are fed by their port / client tasks.
                SensorSource::Serial { .. } | SensorSource::Mqtt { .. } => {}
            }
        }
        let period = Duration::from_secs_f64(1.0 / tick_hz);
        let ooda = Arc::new(Ooda {
            latest: watch::Sender::new(Arc::new(Observation {
                seq: 0,
                at_unix_ms: crate::clock::now_ms(),
                protective_stop: estop.active(),
                protective_stop_causes: estop.state().causes,
                sensors: Vec::new(),
                actuators: actuators.views(Instant::now()),
                sources: Vec::new(),
            })),
            world,
            actuators,
            estop,
            rules,
            period,
            stats: Mutex::new(StatsInner::default()),
            gpio,
            sim_actuators,
            serial,
            mqtt,
            shutdown,
        });
        tokio::spawn(ooda.clone().run());
        Ok(ooda)
    }

    pub fn world(&self) -> &Arc<World> {
        &self.world
    }
    pub fn readings(&self) -> Arc<dyn Readings> {
        self.world.clone()
    }
    pub fn actuators(&self) -> &Arc<Actuators> {
        &self.actuators
    }
    pub fn protective_stop(&self) -> &ProtectiveStop {
        &self.estop
    }
    pub fn gpio(&self) -> &Arc<dyn GpioBackend> {
        &self.gpio
    }
    /// The MQTT client, when `[mqtt]` is configured.
    pub fn mqtt(&self) -> Option<&Mqtt> {
        self.mqtt.as_ref()
    }
    /// A simulated actuator's driver (what it was actually told).
    pub fn sim_actuator(&self, name: &str) -> Option<Arc<SimActuator>> {
        self.sim_actuators.get(name).cloned()
    }
    /// Cancelled at shutdown; driver tasks started by the daemon watch it too.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// The latest Observation.
    pub fn observation(&self) -> Arc<Observation> {
        self.latest.borrow().clone()
    }

    /// An Observation of this instant: sensor values and actuator states read
    /// now, alarm levels as of the last tick. What a host tool returns, so a
    /// command is visible to the next `observe` without waiting for a tick.
    pub fn observe_now(&self) -> Observation {
        let latest = self.observation();
        let now = Instant::now();
        let sensors = self
            .world
            .sensors(now)
            .into_iter()
            .map(|sensor| {
                let alarm = latest
                    .sensor(&sensor.name)
                    .map(|s| s.alarm)
                    .unwrap_or_default();
                SensorObservation { sensor, alarm }
            })
            .collect();
        let stop = self.estop.state();
        Observation {
            seq: latest.seq,
            at_unix_ms: crate::clock::now_ms(),
            protective_stop: stop.first().cloned(),
            protective_stop_causes: stop.causes,
            sensors,
            actuators: self.actuators.views(now),
            sources: self.world.sources(),
        }
    }

    /// A receiver that changes every tick.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Observation>> {
        self.latest.subscribe()
    }

    /// Latches the protective stop and drives every actuator safe now (not
    /// at the next tick); returns once they are safe and the latch is on
    /// disk (bounded). `true` if this added a cause (see
    /// [`ProtectiveStop::trigger`]).
    pub async fn trigger_stop(&self, source: &str, reason: &str) -> bool {
        self.trigger_stop_by(source, reason, None).await
    }

    /// [`Ooda::trigger_stop`] naming who asked.
    pub async fn trigger_stop_by(&self, source: &str, reason: &str, by: Option<&str>) -> bool {
        let added = self.estop.trigger_by(source, reason, by);
        // Every actuator is driven even when the stop was latched already:
        // going safe again costs nothing and may catch a driver that failed.
        let why = format!("protective stop ({source}: {reason})");
        let ((), persisted) = tokio::join!(self.actuators.safe_all(&why), self.estop.persisted());
        if !persisted {
            tracing::error!(
                source,
                "the protective stop could not be written to disk in time"
            );
        }
        added
    }

    /// Drives every actuator safe (while the drivers still run), then stops
    /// the loop, the sensor tasks, the serial ports and the MQTT client.
    pub async fn stop(&self) {
        self.actuators.close("shutdown").await;
        self.shutdown.cancel();
        if let Some(mqtt) = &self.mqtt {
            mqtt.join().await;
        }
    }

    /// A configured serial port (for raw queries).
    pub fn serial_port(&self, name: &str) -> Option<SerialPortHandle> {
        self.serial.port(name)
    }

    pub fn stats(&self) -> LoopStats {
        let s = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
        let mut sorted: Vec<u64> = s.recent.iter().copied().collect();
        sorted.sort_unstable();
        let pct = |p: f64| {
            if sorted.is_empty() {
                return 0;
            }
            let i = ((sorted.len() - 1) as f64 * p).round() as usize;
            sorted[i.min(sorted.len() - 1)]
        };
        LoopStats {
            tick_hz: 1.0 / self.period.as_secs_f64(),
            ticks: s.ticks,
            missed_ticks: s.missed,
            lateness_p50_us: pct(0.50),
            lateness_p99_us: pct(0.99),
            lateness_max_us: s.max_us,
        }
    }

    async fn run(self: Arc<Self>) {
        let mut ticker = tokio::time::interval(self.period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut alarms = vec![AlarmLevel::Ok; self.world.specs().len()];
        let mut rule_states = vec![RuleState::default(); self.rules.len()];
        let mut seq = 0u64;
        let mut expected_next: Option<Instant> = None;
        loop {
            let scheduled = tokio::select! {
                t = ticker.tick() => t,
                () = self.shutdown.cancelled() => return,
            };
            let now = Instant::now();
            self.record_lateness(now, scheduled, &mut expected_next);
            seq += 1;
            let observation = Arc::new(self.orient(seq, now, &mut alarms));
            self.decide(&observation, &mut rule_states, now);
            self.latest.send_replace(observation);
        }
    }

    fn record_lateness(
        &self,
        now: Instant,
        scheduled: Instant,
        expected_next: &mut Option<Instant>,
    ) {
        let late =
            u64::try_from(now.saturating_duration_since(scheduled).as_micros()).unwrap_or(u64::MAX);
        let mut s = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
        s.ticks += 1;
        // With `Skip`, a tick that comes after the expected one means ticks were dropped.
        if let Some(expected) = *expected_next
            && scheduled > expected
        {
            let gap = scheduled.duration_since(expected).as_secs_f64() / self.period.as_secs_f64();
            s.missed += gap.round() as u64;
        }
        *expected_next = Some(scheduled + self.period);
        s.max_us = s.max_us.max(late);
        if s.recent.len() == LATENESS_WINDOW {
            s.recent.pop_front();
        }
        s.recent.push_back(late);
    }

    fn orient(&self, seq: u64, now: Instant, alarms: &mut [AlarmLevel]) -> Observation {
        let views = self.world.sensors(now);
        let sensors = views
            .into_iter()
            .zip(self.world.specs())
            .zip(alarms.iter_mut())
            .map(|((view, spec), level)| {
                if let Some(v) = view.value.filter(|_| view.health == "ok") {
                    *level = orient::next_level(&spec.alarms, *level, v);
                }
                SensorObservation {
                    sensor: view,
                    alarm: *level,
                }
            })
            .collect();
        let stop = self.estop.state();
        Observation {
            seq,
            at_unix_ms: crate::clock::now_ms(),
            protective_stop: stop.first().cloned(),
            protective_stop_causes: stop.causes,
            sensors,
            actuators: self.actuators.views(now),
            sources: self.world.sources(),
        }
    }

    fn decide(self: &Arc<Self>, observation: &Observation, states: &mut [RuleState], now: Instant) {
        let facts = ObservationFacts {
            observation,
            actuators: &self.actuators,
        };
        for (rule, state) in self.rules.iter().zip(states.iter_mut()) {
            if !rule.step(state, &facts, now) {
                continue;
            }
            tracing::info!(rule = %rule.name, action = ?rule.action, "reflex rule fired");
            // Actions run off the tick task so a slow driver cannot delay the loop.
            let me = self.clone();
            let rule = rule.clone();
            tokio::spawn(async move { me.act(&rule).await });
        }
    }

    async fn act(&self, rule: &Rule) {
        match &rule.action {
            Action::Command { actuator, value } => {
                if let Err(e) = self
                    .actuators
                    .command(actuator, *value, Origin::Rule(rule.name.clone()), None)
                    .await
                {
                    tracing::warn!(rule = %rule.name, error = %e, "reflex command refused");
                }
            }
            Action::Estop { reason } => {
                self.trigger_stop(&format!("rule:{}", rule.name), reason)
                    .await;
            }
            Action::Publish {
                topic,
                payload,
                qos,
            } => match &self.mqtt {
                Some(mqtt) => {
                    if let Err(e) = mqtt.publish(topic, payload.clone(), *qos, false) {
                        tracing::warn!(rule = %rule.name, error = %e, "reflex publish failed");
                    }
                }
                None => tracing::warn!(rule = %rule.name, "no MQTT client to publish with"),
            },
        }
    }
}

struct ObservationFacts<'a> {
    observation: &'a Observation,
    actuators: &'a Actuators,
}

impl rules::Facts for ObservationFacts<'_> {
    fn value(&self, name: &str) -> Option<f64> {
        match self.observation.sensor(name) {
            Some(s) => s.sensor.value,
            None => self.actuators.value(name),
        }
    }
    fn stale(&self, name: &str) -> bool {
        self.observation
            .sensor(name)
            .is_some_and(|s| s.sensor.health != "ok")
    }
    fn alarm(&self, name: &str) -> f64 {
        self.observation
            .sensor(name)
            .map_or(0.0, |s| s.alarm.as_number())
    }
    fn age_ms(&self, name: &str) -> Option<f64> {
        self.observation
            .sensor(name)
            .and_then(|s| s.sensor.age_ms)
            .map(|a| a as f64)
    }
}
