//! Hardware configuration: `[gpio]`, `[mqtt]`, `[[serial]]`, `[[sensors]]`,
//! `[[actuators]]` as written in TOML, and their validation into typed specs.
//!
//! The TOML tables are flat (every key of every source is optional at the
//! serde level); [`validate`] then checks that each sensor and actuator sets
//! exactly the keys its source or kind needs, so a misplaced key is an error
//! that names it rather than something silently ignored.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde::Deserialize;

pub use super::sim_config::SimWorldConfig;
use super::sim_world::{Input, Quantity, WorldSpec};

// ------------------------------------------------------------------ TOML schema

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum GpioBackendChoice {
    /// rppal on a Raspberry Pi, the simulated chip elsewhere.
    #[default]
    Auto,
    Rppal,
    Sim,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct GpioConfig {
    #[serde(default)]
    pub backend: GpioBackendChoice,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MqttConfig {
    /// `mqtt://host:port` (TLS: `mqtts://host:port`).
    pub url: String,
    /// Default: `rozd-<host id>`. Must be stable: the broker keeps the
    /// persistent session (QoS 1 messages queued while we were away) by it.
    #[serde(default)]
    pub client_id: Option<String>,
    #[serde(default)]
    pub username: Option<String>,
    /// Name of an environment variable holding the password.
    #[serde(default)]
    pub password_env: Option<String>,
    /// CA certificate (PEM) for `mqtts://`; default: the system roots.
    #[serde(default)]
    pub ca_file: Option<std::path::PathBuf>,
    #[serde(default = "default_mqtt_keep_alive")]
    pub keep_alive_secs: u64,
    #[serde(default = "default_reconnect_min")]
    pub reconnect_min_ms: u64,
    #[serde(default = "default_reconnect_max")]
    pub reconnect_max_ms: u64,
    /// The largest packet the broker may send (MQTT 5 maximum packet size):
    /// it drops bigger messages for us instead of delivering them.
    #[serde(default = "default_max_packet_size")]
    pub max_packet_size: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Parity {
    #[default]
    None,
    Even,
    Odd,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Framing {
    /// Lines end with `\n` (a preceding `\r` is stripped).
    #[default]
    Lf,
    Crlf,
    Cr,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SerialPortConfig {
    pub name: String,
    pub path: String,
    #[serde(default = "default_baud")]
    pub baud: u32,
    #[serde(default = "default_data_bits")]
    pub data_bits: u8,
    #[serde(default)]
    pub parity: Parity,
    #[serde(default = "default_stop_bits")]
    pub stop_bits: u8,
    #[serde(default)]
    pub framing: Framing,
    /// Longer lines are dropped and counted as overlong.
    #[serde(default = "default_max_line")]
    pub max_line: usize,
    /// Sent at `query_hz` to devices that answer on request (e.g. "MEAS?\n").
    #[serde(default)]
    pub query: Option<String>,
    #[serde(default)]
    pub query_hz: Option<f64>,
    /// Delay between attempts to reopen a port that failed or vanished.
    #[serde(default = "default_reconnect_min")]
    pub reconnect_ms: u64,
    /// Offer the `serial_query` host tool on this port.
    #[serde(default)]
    pub allow_raw: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SensorSourceKind {
    Sim,
    Serial,
    Gpio,
    Mqtt,
    System,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParserKind {
    Json,
    Kv,
    Regex,
    Nmea,
    Number,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NmeaField {
    Latitude,
    Longitude,
    Altitude,
    FixQuality,
    Satellites,
    SpeedKnots,
    SpeedMps,
    Course,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pull {
    None,
    Up,
    Down,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    High,
    Low,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SystemMetric {
    /// 1-minute load average divided by the number of CPUs.
    CpuLoad,
    /// Mean CPU usage in percent.
    CpuUsage,
    MemoryUsedPercent,
    MemoryAvailableMb,
    DiskUsedPercent,
    CpuTemperature,
    UptimeSecs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SimSignal {
    Sine,
    Ramp,
    RandomWalk,
    Constant,
    Replay,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SensorConfig {
    pub name: String,
    pub source: SensorSourceKind,
    #[serde(default)]
    pub unit: Option<String>,
    // alarms: warn and critical limits with hysteresis
    #[serde(default)]
    pub warn_min: Option<f64>,
    #[serde(default)]
    pub warn_max: Option<f64>,
    #[serde(default)]
    pub critical_min: Option<f64>,
    #[serde(default)]
    pub critical_max: Option<f64>,
    #[serde(default)]
    pub hysteresis: Option<f64>,
    #[serde(default)]
    pub stale_after_ms: Option<u64>,
    /// Sampling rate of polled sources (sim, system, polled gpio).
    #[serde(default)]
    pub rate_hz: Option<f64>,
    // serial
    #[serde(default)]
    pub port: Option<String>,
    #[serde(default)]
    pub parser: Option<ParserKind>,
    /// JSON pointer (serial `json` parser, mqtt JSON payloads).
    #[serde(default)]
    pub pointer: Option<String>,
    /// Key of a `kv` line.
    #[serde(default)]
    pub key: Option<String>,
    /// Regex with a named capture group (`group`, default `value`).
    #[serde(default)]
    pub pattern: Option<String>,
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub nmea_field: Option<NmeaField>,
    // gpio
    #[serde(default)]
    pub pin: Option<u8>,
    #[serde(default)]
    pub pull: Option<Pull>,
    #[serde(default)]
    pub active: Option<Level>,
    #[serde(default)]
    pub debounce_ms: Option<u64>,
    // mqtt
    #[serde(default)]
    pub topic: Option<String>,
    // system
    #[serde(default)]
    pub metric: Option<SystemMetric>,
    // sim
    #[serde(default)]
    pub signal: Option<SimSignal>,
    #[serde(default)]
    pub amplitude: Option<f64>,
    #[serde(default)]
    pub offset: Option<f64>,
    #[serde(default)]
    pub period_ms: Option<u64>,
    #[serde(default)]
    pub noise: Option<f64>,
    /// Replay: a CSV file of `elapsed_ms,value` rows, looped.
    #[serde(default)]
    pub file: Option<std::path::PathBuf>,
    #[serde(default)]
    pub seed: Option<u64>,
    /// A quantity of the simulated world (`[sim]`) instead of a signal.
    #[serde(default)]
    pub quantity: Option<Quantity>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActuatorKind {
    Sim,
    Gpio,
    Pwm,
    Serial,
    Mqtt,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActuatorConfig {
    pub name: String,
    pub kind: ActuatorKind,
    #[serde(default)]
    pub unit: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub min: Option<f64>,
    #[serde(default)]
    pub max: Option<f64>,
    /// A discrete set of allowed values instead of a range.
    #[serde(default)]
    pub allowed: Option<Vec<f64>>,
    /// The value the actuator returns to on timeout, stop, disconnect or shutdown.
    pub safe_value: f64,
    /// Most commands per second; faster ones are refused.
    #[serde(default)]
    pub max_rate_hz: Option<f64>,
    /// A command expires after this and the actuator returns to its safe
    /// value unless renewed; 0 = holds until changed.
    #[serde(default)]
    pub hold_ms: u64,
    /// Deadline of one command through the driver; default `[safety].default_timeout_ms`.
    #[serde(default)]
    pub timeout_ms: Option<u32>,
    /// Let another session command this actuator while one holds it (last writer wins).
    #[serde(default)]
    pub shared: bool,
    // gpio / pwm
    #[serde(default)]
    pub pin: Option<u8>,
    #[serde(default)]
    pub active: Option<Level>,
    #[serde(default)]
    pub frequency_hz: Option<f64>,
    // serial
    #[serde(default)]
    pub port: Option<String>,
    /// Command template; `{value}` is replaced by the value.
    #[serde(default)]
    pub template: Option<String>,
    /// Regex the device's reply must match (within `reply_timeout_ms`).
    #[serde(default)]
    pub expect: Option<String>,
    #[serde(default)]
    pub reply_timeout_ms: Option<u64>,
    // mqtt
    #[serde(default)]
    pub topic: Option<String>,
    /// Payload template; default `{value}`.
    #[serde(default)]
    pub payload: Option<String>,
    #[serde(default)]
    pub qos: Option<u8>,
    #[serde(default)]
    pub retain: Option<bool>,
    // sim
    /// What the actuator drives in the simulated world (`[sim]`); absent:
    /// it only records what it is told.
    #[serde(default)]
    pub input: Option<Input>,
}

fn default_mqtt_keep_alive() -> u64 {
    30
}
fn default_max_packet_size() -> u32 {
    crate::hw::mqtt_link::DEFAULT_MAX_PACKET
}
fn default_reconnect_min() -> u64 {
    1_000
}
fn default_reconnect_max() -> u64 {
    30_000
}
fn default_baud() -> u32 {
    9_600
}
fn default_data_bits() -> u8 {
    8
}
fn default_stop_bits() -> u8 {
    1
}
fn default_max_line() -> usize {
    1_024
}

// ------------------------------------------------------------------ validated specs

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
}

/// Validated hardware configuration.
#[derive(Debug, Clone, Default)]
pub struct HardwareSpec {
    pub gpio_backend: GpioBackendChoice,
    pub mqtt: Option<MqttConfig>,
    pub serial: Vec<SerialPortConfig>,
    pub sensors: Vec<SensorSpec>,
    pub actuators: Vec<ActuatorSpec>,
    /// The simulated world, when `[sim]` is written or a sensor or
    /// actuator uses it.
    pub sim_world: Option<WorldSpec>,
}

/// A validation failure: the dotted key and what is wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct Invalid {
    pub key: String,
    pub message: String,
}

fn invalid(key: impl Into<String>, message: impl Into<String>) -> Invalid {
    Invalid {
        key: key.into(),
        message: message.into(),
    }
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn rate(key: &str, hz: Option<f64>, default_hz: f64) -> Result<Duration, Invalid> {
    let hz = hz.unwrap_or(default_hz);
    if !(hz.is_finite() && hz > 0.0 && hz <= 10_000.0) {
        return Err(invalid(
            key,
            format!("{hz} is outside 0 < rate <= 10000 Hz"),
        ));
    }
    Ok(Duration::from_secs_f64(1.0 / hz))
}

/// Keys set on a table that do not belong to its source or kind.
fn misplaced(set: &[(&str, bool)], allowed: &[&str]) -> Option<String> {
    set.iter()
        .find(|(k, is_set)| *is_set && !allowed.contains(k))
        .map(|(k, _)| (*k).to_string())
}

/// Checks the hardware sections together (cross-references included).
pub fn validate(
    gpio: &GpioConfig,
    mqtt: Option<&MqttConfig>,
    serial: &[SerialPortConfig],
    sensors: &[SensorConfig],
    actuators: &[ActuatorConfig],
    sim: Option<&SimWorldConfig>,
    default_timeout_ms: u32,
) -> Result<HardwareSpec, Invalid> {
    let world = sim.map(super::sim_config::world_spec).transpose()?;
    if let Some(m) = mqtt {
        validate_mqtt(m)?;
    }
    let mut port_names = HashSet::new();
    let mut paths = HashSet::new();
    for (i, p) in serial.iter().enumerate() {
        let key = |k: &str| format!("serial[{i}].{k}");
        if !valid_name(&p.name) {
            return Err(invalid(
                key("name"),
                format!("{:?} is not a valid name", p.name),
            ));
        }
        if !port_names.insert(p.name.as_str()) {
            return Err(invalid(
                key("name"),
                format!("duplicate serial port name {:?}", p.name),
            ));
        }
        if !paths.insert(p.path.as_str()) {
            return Err(invalid(
                key("path"),
                format!("{} is configured twice", p.path),
            ));
        }
        if p.baud == 0 {
            return Err(invalid(key("baud"), "must be greater than 0"));
        }
        if !(5..=8).contains(&p.data_bits) {
            return Err(invalid(key("data_bits"), "must be 5, 6, 7 or 8"));
        }
        if !(1..=2).contains(&p.stop_bits) {
            return Err(invalid(key("stop_bits"), "must be 1 or 2"));
        }
        if p.max_line < 8 || p.max_line > 65_536 {
            return Err(invalid(key("max_line"), "must be between 8 and 65536"));
        }
        match (&p.query, p.query_hz) {
            (Some(q), hz) => {
                if q.is_empty() {
                    return Err(invalid(key("query"), "must not be empty"));
                }
                rate(&key("query_hz"), hz, 1.0)?;
            }
            (None, Some(_)) => return Err(invalid(key("query_hz"), "needs `query`")),
            (None, None) => {}
        }
        if p.reconnect_ms == 0 {
            return Err(invalid(key("reconnect_ms"), "must be at least 1"));
        }
    }

    let mut names = HashSet::new();
    let mut specs = Vec::with_capacity(sensors.len());
    let mut gpio_pins: HashMap<u8, String> = HashMap::new();
    for (i, s) in sensors.iter().enumerate() {
        let key = |k: &str| format!("sensors[{i}].{k}");
        if !valid_name(&s.name) {
            return Err(invalid(
                key("name"),
                format!(
                    "{:?} is not a valid name (letters, digits, '_', '-')",
                    s.name
                ),
            ));
        }
        if !names.insert(s.name.as_str()) {
            return Err(invalid(
                key("name"),
                format!("duplicate sensor name {:?}", s.name),
            ));
        }
        let alarms = alarm_limits(s, &key)?;
        if s.stale_after_ms == Some(0) {
            return Err(invalid(key("stale_after_ms"), "must be at least 1"));
        }
        let set = [
            ("port", s.port.is_some()),
            ("parser", s.parser.is_some()),
            ("pointer", s.pointer.is_some()),
            ("key", s.key.is_some()),
            ("pattern", s.pattern.is_some()),
            ("group", s.group.is_some()),
            ("nmea_field", s.nmea_field.is_some()),
            ("pin", s.pin.is_some()),
            ("pull", s.pull.is_some()),
            ("active", s.active.is_some()),
            ("debounce_ms", s.debounce_ms.is_some()),
            ("topic", s.topic.is_some()),
            ("metric", s.metric.is_some()),
            ("signal", s.signal.is_some()),
            ("amplitude", s.amplitude.is_some()),
            ("offset", s.offset.is_some()),
            ("period_ms", s.period_ms.is_some()),
            ("noise", s.noise.is_some()),
            ("file", s.file.is_some()),
            ("seed", s.seed.is_some()),
            ("rate_hz", s.rate_hz.is_some()),
            ("quantity", s.quantity.is_some()),
        ];
        let allowed: &[&str] = match s.source {
            SensorSourceKind::Serial => &[
                "port",
                "parser",
                "pointer",
                "key",
                "pattern",
                "group",
                "nmea_field",
            ],
            SensorSourceKind::Gpio => &["pin", "pull", "active", "debounce_ms", "rate_hz"],
            SensorSourceKind::Mqtt => &["topic", "pointer"],
            SensorSourceKind::System => &["metric", "rate_hz"],
            SensorSourceKind::Sim if s.quantity.is_some() => &["quantity"],
            SensorSourceKind::Sim => &[
                "signal",
                "amplitude",
                "offset",
                "period_ms",
                "noise",
                "file",
                "seed",
                "rate_hz",
            ],
        };
        if let Some(k) = misplaced(&set, allowed) {
            let why = if s.quantity.is_some() && s.source == SensorSourceKind::Sim {
                "does not apply to a world sensor (with `quantity`, read at every tick)".to_string()
            } else {
                format!("does not apply to a sensor with source = {:?}", s.source)
            };
            return Err(invalid(key(&k), why));
        }
        let require = |v: bool, k: &str| {
            if v {
                Ok(())
            } else {
                Err(invalid(key(k), "is required for this source"))
            }
        };
        let source = match s.source {
            SensorSourceKind::Serial => {
                let port = s.port.clone().unwrap_or_default();
                require(s.port.is_some(), "port")?;
                if !port_names.contains(port.as_str()) {
                    return Err(invalid(
                        key("port"),
                        format!("no [[serial]] port named {port:?}"),
                    ));
                }
                require(s.parser.is_some(), "parser")?;
                let parser = match s.parser {
                    Some(ParserKind::Json) => {
                        require(s.pointer.is_some(), "pointer")?;
                        let pointer = s.pointer.clone().unwrap_or_default();
                        if !pointer.starts_with('/') {
                            return Err(invalid(key("pointer"), "a JSON pointer starts with '/'"));
                        }
                        LineParser::Json { pointer }
                    }
                    Some(ParserKind::Kv) => {
                        require(s.key.is_some(), "key")?;
                        LineParser::Kv {
                            key: s.key.clone().unwrap_or_default(),
                        }
                    }
                    Some(ParserKind::Regex) => {
                        require(s.pattern.is_some(), "pattern")?;
                        let pattern = regex::Regex::new(s.pattern.as_deref().unwrap_or_default())
                            .map_err(|e| {
                            invalid(key("pattern"), format!("not a valid regex: {e}"))
                        })?;
                        let group = s.group.clone().unwrap_or_else(|| "value".to_string());
                        if !pattern.capture_names().flatten().any(|n| n == group) {
                            return Err(invalid(
                                key("pattern"),
                                format!("has no named group `{group}`"),
                            ));
                        }
                        LineParser::Regex { pattern, group }
                    }
                    Some(ParserKind::Nmea) => {
                        require(s.nmea_field.is_some(), "nmea_field")?;
                        LineParser::Nmea {
                            field: s.nmea_field.unwrap_or(NmeaField::Latitude),
                        }
                    }
                    Some(ParserKind::Number) | None => LineParser::Number,
                };
                SensorSource::Serial { port, parser }
            }
            SensorSourceKind::Gpio => {
                require(s.pin.is_some(), "pin")?;
                let pin = s.pin.unwrap_or(0);
                if let Some(other) = gpio_pins.insert(pin, s.name.clone()) {
                    return Err(invalid(
                        key("pin"),
                        format!("GPIO {pin} is already used by {other:?}"),
                    ));
                }
                SensorSource::Gpio {
                    pin,
                    pull: s.pull.unwrap_or(Pull::None),
                    active: s.active.unwrap_or(Level::High),
                    debounce: Duration::from_millis(s.debounce_ms.unwrap_or(0)),
                    poll: s
                        .rate_hz
                        .map(|hz| rate(&key("rate_hz"), Some(hz), hz))
                        .transpose()?,
                }
            }
            SensorSourceKind::Mqtt => {
                require(s.topic.is_some(), "topic")?;
                if mqtt.is_none() {
                    return Err(invalid(
                        key("topic"),
                        "an mqtt sensor needs an [mqtt] section",
                    ));
                }
                let topic = s.topic.clone().unwrap_or_default();
                if topic.is_empty() || topic.contains('#') || topic.contains('+') {
                    return Err(invalid(
                        key("topic"),
                        "must be a concrete topic (no wildcards)",
                    ));
                }
                if let Some(p) = &s.pointer
                    && !p.starts_with('/')
                {
                    return Err(invalid(key("pointer"), "a JSON pointer starts with '/'"));
                }
                SensorSource::Mqtt {
                    topic,
                    pointer: s.pointer.clone(),
                }
            }
            SensorSourceKind::System => {
                require(s.metric.is_some(), "metric")?;
                SensorSource::System {
                    metric: s.metric.unwrap_or(SystemMetric::CpuLoad),
                    every: rate(&key("rate_hz"), s.rate_hz, 1.0)?,
                }
            }
            SensorSourceKind::Sim => match s.quantity {
                Some(quantity) => SensorSource::World(quantity),
                None => SensorSource::Sim(sim_spec(s, &key)?),
            },
        };
        specs.push(SensorSpec {
            name: s.name.clone(),
            unit: s.unit.clone(),
            alarms,
            stale_after: s.stale_after_ms.map(Duration::from_millis),
            source,
        });
    }

    let mut names = HashSet::new();
    let mut actuator_specs = Vec::with_capacity(actuators.len());
    let mut world_inputs: HashMap<Input, String> = HashMap::new();
    for (i, a) in actuators.iter().enumerate() {
        let key = |k: &str| format!("actuators[{i}].{k}");
        if !valid_name(&a.name) {
            return Err(invalid(
                key("name"),
                format!(
                    "{:?} is not a valid name (letters, digits, '_', '-')",
                    a.name
                ),
            ));
        }
        if !names.insert(a.name.as_str()) {
            return Err(invalid(
                key("name"),
                format!("duplicate actuator name {:?}", a.name),
            ));
        }
        let set = [
            ("pin", a.pin.is_some()),
            ("active", a.active.is_some()),
            ("frequency_hz", a.frequency_hz.is_some()),
            ("port", a.port.is_some()),
            ("template", a.template.is_some()),
            ("expect", a.expect.is_some()),
            ("reply_timeout_ms", a.reply_timeout_ms.is_some()),
            ("topic", a.topic.is_some()),
            ("payload", a.payload.is_some()),
            ("qos", a.qos.is_some()),
            ("retain", a.retain.is_some()),
            ("input", a.input.is_some()),
        ];
        let allowed: &[&str] = match a.kind {
            ActuatorKind::Sim => &["input"],
            ActuatorKind::Gpio => &["pin", "active"],
            ActuatorKind::Pwm => &["pin", "frequency_hz"],
            ActuatorKind::Serial => &["port", "template", "expect", "reply_timeout_ms"],
            ActuatorKind::Mqtt => &["topic", "payload", "qos", "retain"],
        };
        if let Some(k) = misplaced(&set, allowed) {
            return Err(invalid(
                key(&k),
                format!("does not apply to an actuator with kind = {:?}", a.kind),
            ));
        }
        let require = |v: bool, k: &str| {
            if v {
                Ok(())
            } else {
                Err(invalid(key(k), "is required for this kind"))
            }
        };
        let values = match (a.kind, a.min, a.max, &a.allowed) {
            (_, Some(_), _, Some(_)) | (_, _, Some(_), Some(_)) => {
                return Err(invalid(
                    key("allowed"),
                    "give either min/max or allowed, not both",
                ));
            }
            (_, None, None, Some(list)) => {
                if list.is_empty() || list.iter().any(|v| !v.is_finite()) {
                    return Err(invalid(
                        key("allowed"),
                        "must be a non-empty list of finite numbers",
                    ));
                }
                ValueSet::Allowed(list.clone())
            }
            (ActuatorKind::Gpio, None, None, None) => ValueSet::Allowed(vec![0.0, 1.0]),
            (ActuatorKind::Pwm, None, None, None) => ValueSet::Range { min: 0.0, max: 1.0 },
            (_, Some(min), Some(max), None) => {
                if !(min.is_finite() && max.is_finite() && min <= max) {
                    return Err(invalid(
                        key("max"),
                        format!("[{min}, {max}] is not a finite, ordered range"),
                    ));
                }
                ValueSet::Range { min, max }
            }
            (_, None, _, None) => {
                return Err(invalid(key("min"), "is required (or give `allowed`)"));
            }
            (_, _, None, None) => {
                return Err(invalid(key("max"), "is required (or give `allowed`)"));
            }
        };
        if a.kind == ActuatorKind::Gpio
            && !matches!(&values, ValueSet::Allowed(v) if v.iter().all(|x| *x == 0.0 || *x == 1.0))
        {
            return Err(invalid(key("allowed"), "a gpio output takes only 0 and 1"));
        }
        if a.kind == ActuatorKind::Pwm
            && !matches!(values, ValueSet::Range { min, max } if min >= 0.0 && max <= 1.0)
        {
            return Err(invalid(key("max"), "a pwm duty cycle lies within [0, 1]"));
        }
        if !a.safe_value.is_finite() || !values.contains(a.safe_value) {
            return Err(invalid(
                key("safe_value"),
                format!("{} is not in {values}", a.safe_value),
            ));
        }
        if let Some(hz) = a.max_rate_hz
            && !(hz.is_finite() && hz > 0.0)
        {
            return Err(invalid(key("max_rate_hz"), "must be a positive number"));
        }
        if a.timeout_ms == Some(0) {
            return Err(invalid(key("timeout_ms"), "must be at least 1"));
        }
        let target = match a.kind {
            ActuatorKind::Sim => {
                if let Some(input) = a.input
                    && let Some(other) = world_inputs.insert(input, a.name.clone())
                {
                    return Err(invalid(
                        key("input"),
                        format!("{} is already driven by {other:?}", input.as_str()),
                    ));
                }
                ActuatorTarget::Sim { input: a.input }
            }
            ActuatorKind::Gpio | ActuatorKind::Pwm => {
                require(a.pin.is_some(), "pin")?;
                let pin = a.pin.unwrap_or(0);
                if let Some(other) = gpio_pins.insert(pin, a.name.clone()) {
                    return Err(invalid(
                        key("pin"),
                        format!("GPIO {pin} is already used by {other:?}"),
                    ));
                }
                if a.kind == ActuatorKind::Gpio {
                    ActuatorTarget::Gpio {
                        pin,
                        active: a.active.unwrap_or(Level::High),
                    }
                } else {
                    let frequency_hz = a.frequency_hz.unwrap_or(1_000.0);
                    if !(frequency_hz.is_finite()
                        && frequency_hz > 0.0
                        && frequency_hz <= 100_000.0)
                    {
                        return Err(invalid(key("frequency_hz"), "must be within (0, 100000]"));
                    }
                    ActuatorTarget::Pwm { pin, frequency_hz }
                }
            }
            ActuatorKind::Serial => {
                require(a.port.is_some(), "port")?;
                require(a.template.is_some(), "template")?;
                let port = a.port.clone().unwrap_or_default();
                if !port_names.contains(port.as_str()) {
                    return Err(invalid(
                        key("port"),
                        format!("no [[serial]] port named {port:?}"),
                    ));
                }
                // Raw text on a port that drives an actuator would move it
                // around its limits, its rate limit, its ownership and the
                // deadman: the two are exclusive.
                if let Some(raw) = serial.iter().position(|p| p.name == port && p.allow_raw) {
                    return Err(invalid(
                        format!("serial[{raw}].allow_raw"),
                        format!(
                            "port {port:?} drives actuator {:?}: `serial_query` there could move it \
                             around its limits; remove allow_raw or give the raw device a port of its own",
                            a.name
                        ),
                    ));
                }
                let template = a.template.clone().unwrap_or_default();
                if !template.contains("{value}") {
                    return Err(invalid(key("template"), "must contain {value}"));
                }
                let expect = a
                    .expect
                    .as_deref()
                    .map(regex::Regex::new)
                    .transpose()
                    .map_err(|e| invalid(key("expect"), format!("not a valid regex: {e}")))?;
                if expect.is_none() && a.reply_timeout_ms.is_some() {
                    return Err(invalid(key("reply_timeout_ms"), "needs `expect`"));
                }
                ActuatorTarget::Serial {
                    port,
                    template,
                    expect,
                    reply_timeout: Duration::from_millis(a.reply_timeout_ms.unwrap_or(1_000)),
                }
            }
            ActuatorKind::Mqtt => {
                require(a.topic.is_some(), "topic")?;
                if mqtt.is_none() {
                    return Err(invalid(
                        key("topic"),
                        "an mqtt actuator needs an [mqtt] section",
                    ));
                }
                let qos = a.qos.unwrap_or(1);
                if qos > 2 {
                    return Err(invalid(key("qos"), "must be 0, 1 or 2"));
                }
                let topic = a.topic.clone().unwrap_or_default();
                if topic.is_empty() || topic.contains('#') || topic.contains('+') {
                    return Err(invalid(
                        key("topic"),
                        "must be a concrete topic (no wildcards)",
                    ));
                }
                ActuatorTarget::Mqtt {
                    topic,
                    payload: a.payload.clone().unwrap_or_else(|| "{value}".to_string()),
                    qos,
                    retain: a.retain.unwrap_or(false),
                }
            }
        };
        actuator_specs.push(ActuatorSpec {
            name: a.name.clone(),
            unit: a.unit.clone(),
            description: a.description.clone(),
            values,
            safe_value: a.safe_value,
            max_rate_hz: a.max_rate_hz,
            hold: (a.hold_ms > 0).then(|| Duration::from_millis(a.hold_ms)),
            timeout: Duration::from_millis(u64::from(a.timeout_ms.unwrap_or(default_timeout_ms))),
            shared: a.shared,
            target,
        });
    }
    // A world sensor or actuator without `[sim]` acts on the built-in room.
    let uses_world = specs
        .iter()
        .any(|s| matches!(s.source, SensorSource::World(_)))
        || !world_inputs.is_empty();
    let sim_world = world.or_else(|| uses_world.then(WorldSpec::default));
    Ok(HardwareSpec {
        gpio_backend: gpio.backend,
        mqtt: mqtt.cloned(),
        serial: serial.to_vec(),
        sensors: specs,
        actuators: actuator_specs,
        sim_world,
    })
}

/// Checks a broker URL: `mqtt://host[:port]` or `mqtts://host[:port]`.
pub fn check_broker_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("mqtt://")
        .or_else(|| url.strip_prefix("mqtts://"))
        .ok_or_else(|| "must start with mqtt:// or mqtts://".to_string())?;
    let (host, port) = rest.rsplit_once(':').unwrap_or((rest, "1883"));
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(format!("{url:?} is not mqtt://host:port"));
    }
    Ok(())
}

/// Checks a broker connection's `max_packet_size`: from `min` to 16 MiB.
pub fn check_max_packet_size(size: u32, min: u32) -> Result<(), String> {
    let max = crate::hw::mqtt_link::MAX_MAX_PACKET;
    if !(min..=max).contains(&size) {
        return Err(format!("must be from {min} to {max} bytes"));
    }
    Ok(())
}

fn validate_mqtt(m: &MqttConfig) -> Result<(), Invalid> {
    check_broker_url(&m.url).map_err(|why| invalid("mqtt.url", why))?;
    if m.keep_alive_secs < 5 {
        return Err(invalid("mqtt.keep_alive_secs", "must be at least 5"));
    }
    if m.reconnect_min_ms == 0 || m.reconnect_max_ms < m.reconnect_min_ms {
        return Err(invalid(
            "mqtt.reconnect_max_ms",
            "needs 0 < reconnect_min_ms <= reconnect_max_ms",
        ));
    }
    if let Some(client_id) = &m.client_id
        && (client_id.is_empty() || client_id.len() > 64)
    {
        return Err(invalid("mqtt.client_id", "must be 1-64 characters"));
    }
    check_max_packet_size(m.max_packet_size, crate::hw::mqtt_link::MIN_MAX_PACKET)
        .map_err(|why| invalid("mqtt.max_packet_size", why))?;
    Ok(())
}

fn alarm_limits(s: &SensorConfig, key: &dyn Fn(&str) -> String) -> Result<AlarmLimits, Invalid> {
    let limits = AlarmLimits {
        warn_min: s.warn_min,
        warn_max: s.warn_max,
        critical_min: s.critical_min,
        critical_max: s.critical_max,
        hysteresis: s.hysteresis.unwrap_or(0.0),
    };
    for (k, v) in [
        ("warn_min", limits.warn_min),
        ("warn_max", limits.warn_max),
        ("critical_min", limits.critical_min),
        ("critical_max", limits.critical_max),
        ("hysteresis", Some(limits.hysteresis)),
    ] {
        if let Some(v) = v
            && !v.is_finite()
        {
            return Err(invalid(key(k), "must be a finite number"));
        }
    }
    if limits.hysteresis < 0.0 {
        return Err(invalid(key("hysteresis"), "must not be negative"));
    }
    if let (Some(c), Some(w)) = (limits.critical_min, limits.warn_min)
        && c > w
    {
        return Err(invalid(key("critical_min"), "must not be above warn_min"));
    }
    if let (Some(c), Some(w)) = (limits.critical_max, limits.warn_max)
        && c < w
    {
        return Err(invalid(key("critical_max"), "must not be below warn_max"));
    }
    Ok(limits)
}

fn sim_spec(s: &SensorConfig, key: &dyn Fn(&str) -> String) -> Result<SimSpec, Invalid> {
    let signal = s.signal.unwrap_or(SimSignal::Constant);
    let mut replay = Vec::new();
    if signal == SimSignal::Replay {
        let Some(file) = &s.file else {
            return Err(invalid(key("file"), "is required for signal = \"replay\""));
        };
        let text = std::fs::read_to_string(file)
            .map_err(|e| invalid(key("file"), format!("cannot read {}: {e}", file.display())))?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty()
                || line.starts_with('#')
                || (n == 0 && line.chars().any(char::is_alphabetic))
            {
                continue;
            }
            let parsed = line
                .split_once(',')
                .and_then(|(t, v)| {
                    Some((t.trim().parse::<u64>().ok()?, v.trim().parse::<f64>().ok()?))
                })
                .filter(|(_, v)| v.is_finite());
            match parsed {
                Some(row) => replay.push(row),
                None => {
                    return Err(invalid(
                        key("file"),
                        format!("{}:{}: expected `elapsed_ms,value`", file.display(), n + 1),
                    ));
                }
            }
        }
        if replay.is_empty() {
            return Err(invalid(
                key("file"),
                format!("{} has no rows", file.display()),
            ));
        }
    } else if s.file.is_some() {
        return Err(invalid(key("file"), "applies only to signal = \"replay\""));
    }
    let period = Duration::from_millis(s.period_ms.unwrap_or(10_000));
    if period.is_zero() {
        return Err(invalid(key("period_ms"), "must be at least 1"));
    }
    let noise = s.noise.unwrap_or(0.0);
    if !(noise.is_finite() && noise >= 0.0) {
        return Err(invalid(key("noise"), "must be a non-negative number"));
    }
    for (k, v) in [("amplitude", s.amplitude), ("offset", s.offset)] {
        if let Some(v) = v
            && !v.is_finite()
        {
            return Err(invalid(key(k), "must be a finite number"));
        }
    }
    Ok(SimSpec {
        signal,
        every: rate(&key("rate_hz"), s.rate_hz, 10.0)?,
        amplitude: s.amplitude.unwrap_or(1.0),
        offset: s.offset.unwrap_or(0.0),
        period,
        noise,
        seed: s.seed.unwrap_or(0x5eed),
        replay,
    })
}
