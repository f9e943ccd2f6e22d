//! The hardware tables as written in TOML: `[gpio]`, `[mqtt]`, `[[serial]]`,
//! `[[sensors]]`, `[[actuators]]`. Every key of every source is optional at
//! the serde level; [`super::validate`] checks which ones each needs.

use serde::Deserialize;

use super::super::sim_world::{Input, Quantity};
use crate::config::broker::broker_section;
pub use crate::config::types::{Level, Pull};

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

broker_section! {
    /// `[mqtt]`: the broker of the MQTT sensors, actuators and stop input.
    /// Its client id defaults to `rozd-<host id>`; the broker keeps the
    /// persistent session (QoS 1 messages queued while we were away) by it.
    pub struct MqttConfig {
        defaults: {
            keep_alive_secs: "default_mqtt_keep_alive",
            max_packet_size: "default_max_packet_size",
        },
    }
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
    /// A sensor channel of an MCAP recording, played back.
    Replay,
    /// A register or bit of a `[[modbus]]` link.
    Modbus,
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
    /// Sim replay: a CSV file of `elapsed_ms,value` rows, looped; source
    /// `replay`: an MCAP recording.
    #[serde(default)]
    pub file: Option<std::path::PathBuf>,
    /// Source `replay`: the recording's channel (default `/sensors/<name>`).
    #[serde(default)]
    pub channel: Option<String>,
    #[serde(default)]
    pub seed: Option<u64>,
    /// A quantity of the simulated world (`[sim]`) instead of a signal.
    #[serde(default)]
    pub quantity: Option<Quantity>,
    // modbus (also `offset`, `rate_hz`)
    #[serde(default)]
    pub link: Option<String>,
    #[serde(default)]
    pub unit_id: Option<u8>,
    #[serde(default)]
    pub register: Option<crate::hw::modbus::codec::Table>,
    #[serde(default)]
    pub address: Option<u16>,
    #[serde(default, rename = "type")]
    pub value_type: Option<crate::hw::modbus::codec::ValueType>,
    #[serde(default)]
    pub word_order: Option<crate::hw::modbus::codec::Order>,
    #[serde(default)]
    pub byte_order: Option<crate::hw::modbus::codec::Order>,
    /// Engineering value = raw * scale + offset.
    #[serde(default)]
    pub scale: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActuatorKind {
    Sim,
    Gpio,
    Pwm,
    Serial,
    Mqtt,
    /// A holding register or coil of a `[[modbus]]` link.
    Modbus,
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
    // modbus: the point written (min/max/allowed/safe_value are in
    // engineering units: raw = (value - offset) / scale)
    #[serde(default)]
    pub link: Option<String>,
    #[serde(default)]
    pub unit_id: Option<u8>,
    #[serde(default)]
    pub register: Option<crate::hw::modbus::codec::Table>,
    #[serde(default)]
    pub address: Option<u16>,
    #[serde(default, rename = "type")]
    pub value_type: Option<crate::hw::modbus::codec::ValueType>,
    #[serde(default)]
    pub word_order: Option<crate::hw::modbus::codec::Order>,
    #[serde(default)]
    pub byte_order: Option<crate::hw::modbus::codec::Order>,
    #[serde(default)]
    pub scale: Option<f64>,
    #[serde(default)]
    pub offset: Option<f64>,
    /// `single` (FC 6 / FC 5) or `multiple` (FC 16 / FC 15).
    #[serde(default)]
    pub write: Option<super::modbus::WriteMode>,
    /// Read the point back after each write; a different value fails the
    /// command (and drives the safe value). Default true.
    #[serde(default)]
    pub read_back: Option<bool>,
    /// The sensor that measures what the actuator did, and how closely and
    /// how soon it must agree with the command (any kind of actuator).
    #[serde(default)]
    pub feedback: Option<FeedbackConfig>,
}

/// An actuator's `feedback = { sensor, tolerance, settle_ms, ... }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedbackConfig {
    /// The sensor that measures the actuator's effect.
    pub sensor: String,
    /// How far the measured value may be from the expected one, in the
    /// sensor's unit.
    pub tolerance: f64,
    /// How long after a command the measured value may take to come within
    /// tolerance; also how long a held value may drift out of it.
    pub settle_ms: u64,
    /// From command units to sensor units: expected = value * scale + offset.
    #[serde(default)]
    pub scale: Option<f64>,
    #[serde(default)]
    pub offset: Option<f64>,
    /// What a mismatch does besides raising the actuator's alarm.
    #[serde(default)]
    pub on_mismatch: OnMismatch,
    /// A second, independent sensor whose rate of change must agree with
    /// the command while the value is held (catches a feedback sensor that
    /// echoes the command).
    #[serde(default)]
    pub cross_check: Option<CrossCheckConfig>,
}

/// `feedback.cross_check = { sensor, tolerance, scale, magnitude, window_ms }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CrossCheckConfig {
    /// The sensor whose rate of change measures the actuator's effect
    /// (e.g. odometry in m for a speed in m/s).
    pub sensor: String,
    /// How far its rate may be from the expected one, in its unit per second.
    pub tolerance: f64,
    /// From command units to the sensor's unit per second (default 1).
    #[serde(default)]
    pub scale: Option<f64>,
    /// Compare with the command's magnitude (a distance counter).
    #[serde(default)]
    pub magnitude: bool,
    /// The span a rate is measured over (default: the feedback's settle_ms).
    #[serde(default)]
    pub window_ms: Option<u64>,
}

/// What a mismatch between commanded and measured does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum OnMismatch {
    /// Raise the actuator's alarm (`<actuator>.mismatch` in rules) only.
    #[default]
    Alarm,
    /// Raise the alarm and drive the actuator to its safe value.
    Safe,
    /// Raise the alarm and latch the protective stop (source `feedback:<actuator>`).
    Stop,
}

impl OnMismatch {
    pub fn as_str(self) -> &'static str {
        match self {
            OnMismatch::Alarm => "alarm",
            OnMismatch::Safe => "safe",
            OnMismatch::Stop => "stop",
        }
    }
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
