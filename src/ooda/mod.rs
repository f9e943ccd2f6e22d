//! The observe–orient–decide–act loop. It runs whether or not a session is
//! connected: drivers observe into the [`world::World`]; every tick orients
//! (alarms, staleness) into an [`Observation`], decides with the reflex
//! [`rules`], and acts through [`act::Actuators`].

pub mod act;
pub(crate) mod admission;
pub mod feedback;
pub(crate) mod metered;
pub(crate) mod metrics;
pub mod orient;
pub mod rules;
pub(crate) mod stats;
mod tick;
pub(crate) mod timer;
pub mod world;

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::hw::config::{ActuatorTarget, HardwareSpec, SensorSource};
use crate::hw::gpio::{self, GpioActuator, GpioBackend, SimGpio};
use crate::hw::modbus::{LinkEvent, ModbusActuator, ModbusLinks};
use crate::hw::mqtt::{Mqtt, MqttActuator};
use crate::hw::serial::{SerialActuator, SerialPortHandle, SerialPorts};
use crate::hw::sim::SimActuator;
use crate::hw::sim_world::{Quantity, SharedWorld, SimWorld, WorldView};
use crate::hw::{ActuatorDriver, HwError, Readings};
use crate::observe::Observers;
use crate::safety::{ProtectiveStop, StopInfo};
use crate::safety::{StopRequest, StopSource};
use act::{ActuatorView, Actuators};
use orient::AlarmLevel;
use rules::Rule;
pub use stats::LoopStats;
use timer::{Realtime, Timer, TimerError};
use world::{SensorView, SourceView, World};
/// The actuators on each Modbus link, by link.
fn modbus_actuators(hardware: &HardwareSpec) -> HashMap<String, Vec<String>> {
    let mut by_link: HashMap<String, Vec<String>> = HashMap::new();
    for a in &hardware.actuators {
        if let ActuatorTarget::Modbus { link, .. } = &a.target {
            by_link
                .entry(link.clone())
                .or_default()
                .push(a.name.clone());
        }
    }
    by_link
}

/// Drives the actuators of a Modbus link safe whenever it comes up or goes
/// down (going down, the drive fails and says so in the actuator's
/// `safe_unconfirmed`; coming up, it reaches the device).
async fn drive_safe_on_link_changes(
    mut changes: tokio::sync::mpsc::UnboundedReceiver<LinkEvent>,
    by_link: HashMap<String, Vec<String>>,
    actuators: Arc<Actuators>,
    shutdown: CancellationToken,
) {
    loop {
        let change = tokio::select! {
            _ = shutdown.cancelled() => return,
            change = changes.recv() => match change {
                Some(change) => change,
                None => return,
            },
        };
        let (link, why) = match &change {
            LinkEvent::Up(link) => (link, format!("modbus link {link} up")),
            LinkEvent::Down(link) => (link, format!("modbus link {link} lost")),
        };
        for name in by_link.get(link).into_iter().flatten() {
            let _ = actuators.safe(name, &why).await;
        }
    }
}

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
    #[error(transparent)]
    Timer(#[from] TimerError),
}

/// How the loop runs (`[ooda]`).
#[derive(Debug, Clone, PartialEq)]
pub struct LoopConfig {
    pub tick_hz: f64,
    /// How often the Observation is published (at most `tick_hz`).
    pub publish_hz: f64,
    pub timer: Timer,
    pub realtime: Realtime,
}

impl LoopConfig {
    /// `tick_hz` on its own thread, publishing at most 50 times a second.
    pub fn at(tick_hz: f64) -> LoopConfig {
        LoopConfig {
            tick_hz,
            publish_hz: tick_hz.min(50.0),
            timer: Timer::Thread,
            realtime: Realtime::default(),
        }
    }
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
    /// The simulated world's rover, when the host runs one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sim: Option<WorldView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SensorObservation {
    #[serde(flatten)]
    pub sensor: SensorView,
    pub alarm: AlarmLevel,
    /// Since when the sensor is at this alarm level (unix ms); absent at `ok`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alarm_since_unix_ms: Option<i64>,
    /// The limit crossed to reach this level (`limit`: its name, `value`);
    /// absent at `ok`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alarm_limit: Option<orient::CrossedLimit>,
}

impl SensorObservation {
    pub fn new(sensor: SensorView, alarm: AlarmLevel, mark: Option<orient::AlarmMark>) -> Self {
        SensorObservation {
            sensor,
            alarm,
            alarm_since_unix_ms: mark.map(|m| m.since_unix_ms),
            alarm_limit: mark.and_then(|m| m.limit),
        }
    }

    fn mark(&self) -> Option<orient::AlarmMark> {
        self.alarm_since_unix_ms
            .map(|since_unix_ms| orient::AlarmMark {
                since_unix_ms,
                limit: self.alarm_limit,
            })
    }
}

impl Observation {
    pub fn sensor(&self, name: &str) -> Option<&SensorObservation> {
        self.sensors.iter().find(|s| s.sensor.name == name)
    }
}

pub struct Ooda {
    world: Arc<World>,
    actuators: Arc<Actuators>,
    protective_stop: ProtectiveStop,
    rules: Vec<Rule>,
    period: Duration,
    /// Ticks per published Observation.
    publish_every: u64,
    timer: Timer,
    realtime: Realtime,
    /// Where the tick hands actions off to (it may run on its own thread).
    runtime: tokio::runtime::Handle,
    latest: watch::Sender<Arc<Observation>>,
    /// Each rule's phase, firings and last result, in `rules` order.
    rule_status: watch::Sender<Vec<rules::RuleStatus>>,
    tick_history: Mutex<stats::TickHistory>,
    gpio: Arc<dyn GpioBackend>,
    /// The GPIO chip when it is the simulated one (see [`gpio::OpenedGpio`]).
    sim_gpio: Option<Arc<SimGpio>>,
    sim_actuators: HashMap<String, Arc<SimActuator>>,
    sim: Option<SimLoop>,
    serial: SerialPorts,
    mqtt: Option<Mqtt>,
    modbus: ModbusLinks,
    shutdown: CancellationToken,
}

/// The simulated world as the loop steps it: the world and the sensors
/// that read it at every tick.
#[derive(Debug)]
struct SimLoop {
    world: SharedWorld,
    sensors: Vec<(String, Quantity)>,
}

impl SimLoop {
    fn lock(&self) -> parking_lot::MutexGuard<'_, SimWorld> {
        self.world.lock()
    }

    fn view(&self) -> WorldView {
        self.lock().view()
    }

    /// Advances the world by `dt` and records what its sensors read now.
    fn step(&self, dt: Duration, readings: &dyn Readings) {
        let mut world = self.lock();
        world.step(dt);
        for (name, quantity) in &self.sensors {
            readings.record(name, world.read(*quantity));
        }
    }
}

impl std::fmt::Debug for Ooda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ooda")
            .field("period", &self.period)
            .field("rules", &self.rules.len())
            .finish()
    }
}

/// Who is told of every sensor value and actuator change (the audit, a
/// recording, the metrics), given before any driver starts so nothing is
/// missed.
#[derive(Debug, Clone, Default)]
pub struct LoopObservers {
    pub sensors: Observers<dyn world::SensorObserver>,
    pub actuators: Observers<dyn act::ActuatorObserver>,
}

impl Ooda {
    /// Builds the world and actuators from validated config (with their
    /// observers), starts the serial ports and the MQTT client, drives
    /// every actuator to its safe value, starts the sensor tasks and the
    /// tick loop.
    pub async fn start(
        hardware: &HardwareSpec,
        rules: Vec<Rule>,
        loop_config: &LoopConfig,
        host_id: &str,
        protective_stop: ProtectiveStop,
        observers: LoopObservers,
    ) -> Result<Arc<Ooda>, OodaError> {
        let gpio::OpenedGpio {
            backend: gpio,
            sim: sim_gpio,
        } = gpio::open_backend(hardware.gpio_backend).map_err(OodaError::Gpio)?;
        let world = Arc::new(World::new(hardware.sensors.clone(), observers.sensors));
        let shutdown = CancellationToken::new();
        let readings: Arc<dyn Readings> = world.clone();
        let mut serial = SerialPorts::start(
            &hardware.serial,
            &hardware.sensors,
            readings.clone(),
            shutdown.clone(),
        );
        let (link_events, mut link_changes) = tokio::sync::mpsc::unbounded_channel();
        let mut modbus = ModbusLinks::start(
            &hardware.modbus,
            &hardware.sensors,
            readings.clone(),
            link_events,
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
        let sim = hardware.sim_world.clone().map(|spec| SimLoop {
            world: Arc::new(Mutex::new(SimWorld::new(spec))),
            sensors: hardware
                .sensors
                .iter()
                .filter_map(|s| match s.source {
                    SensorSource::World(q) => Some((s.name.clone(), q)),
                    _ => None,
                })
                .collect(),
        });
        let mut sim_actuators = HashMap::new();
        for spec in &hardware.actuators {
            let err = |error| OodaError::Actuator {
                name: spec.name.clone(),
                error,
            };
            let driver: Arc<dyn ActuatorDriver> = match &spec.target {
                ActuatorTarget::Sim { input } => {
                    let driver = match (input, &sim) {
                        (Some(input), Some(sim)) => SimActuator::driving(sim.world.clone(), *input),
                        _ => SimActuator::new(),
                    };
                    sim_actuators.insert(spec.name.clone(), driver.clone());
                    driver
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
                ActuatorTarget::Modbus { .. } => match ModbusActuator::from_spec(spec, &modbus) {
                    Some(driver) => Arc::new(driver),
                    None => {
                        return Err(OodaError::Unsupported(format!(
                            "actuator {}: its modbus link was not started",
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
        let actuators = Actuators::new(drivers, protective_stop.clone(), observers.actuators);
        // The start-up safe values must reach the devices, not a port that
        // is not open yet: let each serial port try to open its device and
        // the MQTT client try to connect first (bounded; absent devices and
        // brokers are not waited for).
        let settled = tokio::time::timeout(START_SETTLE, async {
            serial.first_open_attempts().await;
            modbus.first_connection_attempts().await;
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
        // A Modbus link that comes up or goes down drives its actuators
        // safe: the device may have kept the last value while rozd could
        // not reach it. (What happened before the start-up drive is
        // covered by it.)
        while link_changes.try_recv().is_ok() {}
        tokio::spawn(drive_safe_on_link_changes(
            link_changes,
            modbus_actuators(hardware),
            actuators.clone(),
            shutdown.clone(),
        ));

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
                SensorSource::Replay(spec) => {
                    tokio::spawn(crate::hw::replay::run_sensor(
                        name,
                        spec.clone(),
                        readings.clone(),
                        shutdown.clone(),
                    ));
                }
                // The tick reads the simulated world.
                SensorSource::World(_) => readings.source_health("sim", crate::hw::Health::Ok),
                // Serial, MQTT and Modbus sensors are fed by their port /
                // client / link tasks.
                SensorSource::Serial { .. }
                | SensorSource::Mqtt { .. }
                | SensorSource::Modbus { .. } => {}
            }
        }
        let period = Duration::from_secs_f64(1.0 / loop_config.tick_hz);
        let publish_hz = loop_config.publish_hz.min(loop_config.tick_hz);
        let publish_every = (loop_config.tick_hz / publish_hz).round().max(1.0) as u64;
        let ooda = Arc::new(Ooda {
            latest: watch::Sender::new(Arc::new(Observation {
                seq: 0,
                at_unix_ms: crate::clock::now_ms(),
                protective_stop: protective_stop.active(),
                protective_stop_causes: protective_stop.state().causes,
                sensors: Vec::new(),
                actuators: actuators.views(Instant::now()),
                sources: Vec::new(),
                sim: sim.as_ref().map(|s| s.view()),
            })),
            world,
            actuators,
            protective_stop,
            rule_status: watch::Sender::new(vec![
                rules::RuleStatus {
                    phase: Some(rules::RulePhase::Armed),
                    ..Default::default()
                };
                rules.len()
            ]),
            rules,
            period,
            publish_every,
            timer: loop_config.timer,
            realtime: loop_config.realtime.clone(),
            runtime: tokio::runtime::Handle::current(),
            tick_history: Mutex::new(stats::TickHistory::default()),
            gpio,
            sim_gpio,
            sim_actuators,
            sim,
            serial,
            mqtt,
            modbus,
            shutdown,
        });
        if let Err(e) = ooda.start_loop() {
            ooda.stop().await;
            return Err(e.into());
        }
        Ok(ooda)
    }

    /// The loop's tick period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// How long after `settle` a feedback verdict may still come: the
    /// watch judges at the first tick past it, which may be a little late.
    pub fn verdict_grace(&self) -> Duration {
        self.period.saturating_mul(2) + Duration::from_millis(100)
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
        &self.protective_stop
    }
    pub fn gpio(&self) -> &Arc<dyn GpioBackend> {
        &self.gpio
    }
    /// The simulated GPIO chip, when `[gpio] backend` chose it.
    pub fn sim_gpio(&self) -> Option<&Arc<SimGpio>> {
        self.sim_gpio.as_ref()
    }
    /// The MQTT client, when `[mqtt]` is configured.
    pub fn mqtt(&self) -> Option<&Mqtt> {
        self.mqtt.as_ref()
    }
    /// A simulated actuator's driver (what it was actually told).
    pub(crate) fn sim_actuator(&self, name: &str) -> Option<Arc<SimActuator>> {
        self.sim_actuators.get(name).cloned()
    }
    /// The simulated world's rover now, when the host runs a world.
    pub fn sim_world(&self) -> Option<WorldView> {
        self.sim.as_ref().map(SimLoop::view)
    }
    /// Sets the simulated world's faults (a stuck or slipping drive, an
    /// echoing speed sensor) from now on. `None` without a world; `Err`
    /// says what is wrong with `faults`.
    pub fn set_sim_faults(
        &self,
        faults: crate::hw::sim_world::SimFaults,
    ) -> Option<Result<(), String>> {
        let sim = self.sim.as_ref()?;
        Some(faults.check().map(|()| sim.lock().set_faults(faults)))
    }

    /// The simulated world itself, when the host runs one: what a `sim`
    /// camera renders (it reads the pose under the world's short lock).
    pub fn sim_handle(&self) -> Option<SharedWorld> {
        self.sim.as_ref().map(|sim| sim.world.clone())
    }
    /// The simulated world's room (when the host runs a world), and the
    /// sensor that reads its range straight ahead, if one does.
    pub fn sim_spec(&self) -> Option<(crate::hw::sim_world::WorldSpec, Option<String>)> {
        self.sim.as_ref().map(|sim| {
            let range = sim
                .sensors
                .iter()
                .find(|(_, q)| *q == Quantity::FrontDistance)
                .map(|(name, _)| name.clone());
            (sim.lock().spec().clone(), range)
        })
    }

    /// Cancelled at shutdown; driver tasks started by the daemon watch it too.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Every reflex rule: its condition, action, phase, firings and what
    /// its last firing did.
    pub fn rules_view(&self) -> Vec<rules::RuleView> {
        let status = self.rule_status.borrow();
        self.rules
            .iter()
            .zip(status.iter())
            .map(|(rule, status)| rule.view(status))
            .collect()
    }

    /// Changes whenever a rule's phase, firings or last result does.
    pub fn subscribe_rules(&self) -> watch::Receiver<Vec<rules::RuleStatus>> {
        self.rule_status.subscribe()
    }

    /// The latest Observation.
    pub fn observation(&self) -> Arc<Observation> {
        self.latest.borrow().clone()
    }

    /// An Observation of this instant: sensor values and actuator states read
    /// now, alarm levels as of the last tick. What a host tool returns, so a
    /// command is visible to the next `observe` without waiting for a tick.
    pub fn observe_now(&self) -> Observation {
        Observation {
            sim: self.sim_world(),
            sources: self.sources(),
            ..self.observe_now_brief()
        }
    }

    /// [`Ooda::observe_now`] without the simulated world and the sources'
    /// health: what the model's text shows, read before every model call.
    pub fn observe_now_brief(&self) -> Observation {
        let latest = self.observation();
        let now = Instant::now();
        let sensors = self
            .world
            .sensors(now)
            .into_iter()
            .enumerate()
            .map(|(i, sensor)| {
                // Both lists are in the world's order: look at the same
                // place first, by name only if it is not there.
                let last = latest
                    .sensors
                    .get(i)
                    .filter(|s| s.sensor.name == sensor.name)
                    .or_else(|| latest.sensor(&sensor.name));
                let alarm = last.map(|s| s.alarm).unwrap_or_default();
                SensorObservation::new(sensor, alarm, last.and_then(SensorObservation::mark))
            })
            .collect();
        let stop = self.protective_stop.state();
        Observation {
            seq: latest.seq,
            at_unix_ms: crate::clock::now_ms(),
            protective_stop: stop.first().cloned(),
            protective_stop_causes: stop.causes,
            sensors,
            actuators: self.actuators.views(now),
            sim: None,
            sources: Vec::new(),
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
    pub async fn trigger_stop(&self, request: StopRequest<'_>) -> bool {
        let (source, reason) = (request.source, request.reason);
        let added = self.protective_stop.trigger(request);
        // Every actuator is driven even when the stop was latched already:
        // going safe again costs nothing and may catch a driver that failed.
        let why = format!("protective stop ({source}: {reason})");
        let ((), persisted) = tokio::join!(
            self.actuators.safe_all(&why),
            self.protective_stop.persisted()
        );
        if !persisted {
            tracing::error!(
                %source,
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

    /// Each `[[modbus]]` link's counters.
    pub fn modbus_stats(&self) -> Vec<crate::hw::modbus::LinkStats> {
        self.modbus.stats()
    }

    /// Every source's health, with each Modbus link's counters.
    fn sources(&self) -> Vec<SourceView> {
        let mut sources = self.world.sources();
        for stats in self.modbus.stats() {
            let name = format!("modbus:{}", stats.link);
            match sources.iter_mut().find(|s| s.name == name) {
                Some(s) => s.link = Some(stats),
                // A link with only actuators has no sensor source.
                None => sources.push(SourceView {
                    health: if stats.connected {
                        crate::hw::HealthKind::Ok
                    } else {
                        crate::hw::HealthKind::Disconnected
                    },
                    name,
                    error: None,
                    rejected: 0,
                    last_rejection: None,
                    link: Some(stats),
                }),
            }
        }
        sources
    }

    /// A configured serial port (for raw queries).
    pub fn serial_port(&self, name: &str) -> Option<SerialPortHandle> {
        self.serial.port(name)
    }

    pub fn stats(&self) -> LoopStats {
        self.tick_history.lock().stats(
            1.0 / self.period.as_secs_f64(),
            self.timer.as_str(),
            self.realtime.view(),
        )
    }

    /// Starts the tick: on its own thread, or as a task on the runtime's
    /// clock. The loop holds the Ooda weakly and ends at shutdown.
    fn start_loop(self: &Arc<Self>) -> Result<(), TimerError> {
        let weak: Weak<Ooda> = Arc::downgrade(self);
        let mut state = tick::TickState::new(self);
        let tick = move |wake| {
            let Some(ooda) = weak.upgrade() else {
                return false;
            };
            if ooda.shutdown.is_cancelled() {
                return false;
            }
            ooda.tick(&mut state, wake);
            true
        };
        // A loop that died would leave actuators as commanded with no reflex
        // watching them: a tick that panics latches the stop and drives
        // everything safe.
        let weak: Weak<Ooda> = Arc::downgrade(self);
        let tick = timer::guarded(tick, move |why| {
            tracing::error!(panic = %why, "the control loop failed; protective stop");
            if let Some(ooda) = weak.upgrade() {
                let reason = format!("the control loop failed: {why}");
                // Held like an asserted input: no clear ends it while the
                // loop is gone (a restart of rozd starts a new one).
                let source = StopSource::Loop;
                ooda.protective_stop.hold(
                    source.kind(),
                    &source,
                    "the control loop is not running",
                );
                ooda.protective_stop
                    .trigger(StopRequest::new(&source, &reason));
                let me = ooda.clone();
                ooda.runtime.spawn(async move {
                    me.trigger_stop(StopRequest::new(&source, &reason)).await;
                });
            }
        });
        match self.timer {
            Timer::Thread => {
                timer::spawn_thread(self.period, &self.realtime, tick)?;
            }
            Timer::Runtime => {
                tokio::spawn(timer::run_runtime(self.period, tick));
            }
        }
        Ok(())
    }
}
