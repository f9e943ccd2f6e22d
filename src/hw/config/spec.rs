//! The validated hardware specs the drivers and the OODA loop take.

use std::time::Duration;

use super::super::sim_world::{Input, Quantity, WorldSpec};
use super::schema::{
    GpioBackendChoice, Level, MqttConfig, NmeaField, OnMismatch, Pull, SerialPortConfig, SimSignal,
    SystemMetric,
};

/// Warn/critical limits with hysteresis: an alarm raised at a limit clears
/// only once the value is back inside by `hysteresis`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AlarmLimits {
    pub warn_min: Option<f64>,
    pub warn_max: Option<f64>,
    pub critical_min: Option<f64>,
    pub critical_max: Option<f64>,
    pub hysteresis: f64,
}

#[derive(Debug, Clone)]
pub enum LineParser {
    Json {
        pointer: String,
    },
    Kv {
        key: String,
    },
    Regex {
        pattern: regex::Regex,
        group: String,
    },
    Nmea {
        field: NmeaField,
    },
    Number,
}

#[derive(Debug, Clone)]
pub enum SensorSource {
    Serial {
        port: String,
        parser: LineParser,
    },
    Gpio {
        pin: u8,
        pull: Pull,
        active: Level,
        debounce: Duration,
        poll: Option<Duration>,
    },
    Mqtt {
        topic: String,
        pointer: Option<String>,
    },
    System {
        metric: SystemMetric,
        every: Duration,
    },
    Sim(SimSpec),
    /// Read from the simulated world at every tick of the loop.
    World(Quantity),
    /// A recorded sensor channel, played back at its recorded times.
    Replay(ReplaySpec),
    /// Polled from a `[[modbus]]` link every `every`.
    Modbus {
        link: String,
        point: super::modbus::ModbusPoint,
        every: Duration,
    },
}

/// A sensor channel of a recording, read at config load.
#[derive(Debug, Clone)]
pub struct ReplaySpec {
    pub file: std::path::PathBuf,
    pub channel: String,
    /// (time since the recording's first message, value), in time order.
    pub values: std::sync::Arc<Vec<(Duration, f64)>>,
    /// The recording's length (its first to its last message, any channel).
    pub span: Duration,
    /// From `[replay]`: playback speed, and whether it starts over.
    pub speed: f64,
    pub looped: bool,
}

#[derive(Debug, Clone)]
pub struct SimSpec {
    pub signal: SimSignal,
    pub every: Duration,
    pub amplitude: f64,
    pub offset: f64,
    pub period: Duration,
    pub noise: f64,
    pub seed: u64,
    /// Replay rows (elapsed ms, value), for `replay`.
    pub replay: Vec<(u64, f64)>,
}

#[derive(Debug, Clone)]
pub struct SensorSpec {
    pub name: String,
    pub unit: Option<String>,
    pub alarms: AlarmLimits,
    pub stale_after: Option<Duration>,
    pub source: SensorSource,
}

#[derive(Debug, Clone)]
pub enum ActuatorTarget {
    Sim {
        input: Option<Input>,
    },
    Gpio {
        pin: u8,
        active: Level,
    },
    Pwm {
        pin: u8,
        frequency_hz: f64,
    },
    Serial {
        port: String,
        template: String,
        expect: Option<regex::Regex>,
        reply_timeout: Duration,
    },
    Mqtt {
        topic: String,
        payload: String,
        qos: u8,
        retain: bool,
    },
    Modbus {
        link: String,
        point: super::modbus::ModbusPoint,
        write: super::modbus::WriteMode,
        read_back: bool,
    },
}

/// What values an actuator accepts.
#[derive(Debug, Clone, PartialEq)]
pub enum ValueSet {
    Range { min: f64, max: f64 },
    Allowed(Vec<f64>),
}

impl ValueSet {
    pub fn contains(&self, v: f64) -> bool {
        match self {
            ValueSet::Range { min, max } => v >= *min && v <= *max,
            ValueSet::Allowed(values) => values.iter().any(|a| (*a - v).abs() < 1e-9),
        }
    }
}

impl std::fmt::Display for ValueSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ValueSet::Range { min, max } => write!(f, "[{min}, {max}]"),
            ValueSet::Allowed(v) => {
                let list: Vec<String> = v.iter().map(ToString::to_string).collect();
                write!(f, "one of {{{}}}", list.join(", "))
            }
        }
    }
}

#[derive(Debug, Clone)]
pub struct ActuatorSpec {
    pub name: String,
    pub unit: Option<String>,
    pub description: Option<String>,
    pub values: ValueSet,
    pub safe_value: f64,
    pub max_rate_hz: Option<f64>,
    pub hold: Option<Duration>,
    pub timeout: Duration,
    pub shared: bool,
    pub target: ActuatorTarget,
    /// What measures the actuator's effect, if anything does.
    pub feedback: Option<FeedbackSpec>,
}

/// An actuator's validated `feedback`: the sensor (by name), and what counts as the actuator having done
/// what it was told.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedbackSpec {
    pub sensor: String,
    /// Finite and positive, in the sensor's unit.
    pub tolerance: f64,
    /// Positive.
    pub settle: Duration,
    /// Finite and not zero (a reversed encoder reads negative).
    pub scale: f64,
    pub offset: f64,
    pub on_mismatch: OnMismatch,
    /// A value older than this is not evidence: the sensor's
    /// `stale_after_ms`, or `settle` when it has none; `None` for an
    /// edge-driven GPIO input without one (its value stands until the next
    /// edge; a lost chip is its source's health).
    pub fresh_within: Option<Duration>,
    /// A second, independent sensor whose rate of change must agree with
    /// the command while the value is held.
    pub cross_check: Option<CrossCheckSpec>,
}

/// A feedback's validated `cross_check`: the sensor (by name) whose rate
/// of change, in its unit per second, is expected to be
/// `commanded * scale` (its magnitude with `magnitude`), within `tolerance`,
/// measured over `window`.
#[derive(Debug, Clone, PartialEq)]
pub struct CrossCheckSpec {
    pub sensor: String,
    /// Finite and not zero.
    pub scale: f64,
    /// The sensor counts distance whatever the direction (odometry).
    pub magnitude: bool,
    /// Finite and positive, in the sensor's unit per second.
    pub tolerance: f64,
    /// Positive: the span a rate is measured over.
    pub window: Duration,
}

impl CrossCheckSpec {
    /// The rate of change the sensor should show while `commanded` holds.
    pub fn expected_rate(&self, commanded: f64) -> f64 {
        let rate = commanded * self.scale;
        if self.magnitude { rate.abs() } else { rate }
    }
}

impl FeedbackSpec {
    /// What the sensor should read once `commanded` has taken effect.
    pub fn expected(&self, commanded: f64) -> f64 {
        commanded * self.scale + self.offset
    }
}

/// Validated hardware configuration.
#[derive(Debug, Clone, Default)]
pub struct HardwareSpec {
    pub gpio_backend: GpioBackendChoice,
    pub mqtt: Option<MqttConfig>,
    pub serial: Vec<SerialPortConfig>,
    /// The `[[modbus]]` links.
    pub modbus: Vec<super::modbus::ModbusLinkSpec>,
    pub sensors: Vec<SensorSpec>,
    pub actuators: Vec<ActuatorSpec>,
    /// The simulated world, when `[sim]` is written or a sensor or
    /// actuator uses it.
    pub sim_world: Option<WorldSpec>,
}
