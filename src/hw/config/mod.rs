//! Hardware configuration: `[gpio]`, `[mqtt]`, `[[serial]]`, `[[sensors]]`,
//! `[[actuators]]` as written in TOML ([`schema`]), and their validation
//! into typed specs ([`spec`]), one function per table kind.
//!
//! The TOML tables are flat (every key of every source is optional at the
//! serde level); [`validate`] then checks that each sensor and actuator sets
//! exactly the keys its source or kind needs, so a misplaced key is an error
//! that names it rather than something silently ignored.

mod actuators;
pub(crate) mod modbus;
pub(crate) mod schema;
mod sensors;
pub(crate) mod spec;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

pub use super::sim_config::SimWorldConfig;
pub use crate::config::broker::check_max_packet_size;
pub use crate::config::types::Invalid;
use crate::config::types::within;
pub use modbus::{
    ModbusLinkConfig, ModbusLinkSpec, ModbusPoint, ModbusTransport, RtuConfig, WriteMode,
};
pub use schema::*;
pub use spec::*;

/// Checks the hardware sections together (cross-references included).
#[allow(clippy::too_many_arguments)] // one per hardware section
pub fn validate(
    gpio: &GpioConfig,
    mqtt: Option<&MqttConfig>,
    serial: &[SerialPortConfig],
    modbus: &[ModbusLinkConfig],
    sensors: &[SensorConfig],
    actuators: &[ActuatorConfig],
    sim: Option<&SimWorldConfig>,
    default_timeout_ms: u32,
) -> Result<HardwareSpec, Invalid> {
    let world = sim.map(super::sim_config::world_spec).transpose()?;
    if let Some(m) = mqtt {
        validate_mqtt(m)?;
    }
    let ports = validate_serial(serial)?;
    let serial_paths = serial.iter().map(|p| p.path.as_str()).collect();
    let modbus = modbus::validate_links(modbus, &serial_paths)?;
    // A pin drives one sensor or one actuator.
    let mut gpio_pins: HashMap<u8, String> = HashMap::new();
    let tables = Tables {
        ports: &ports,
        serial,
        have_mqtt: mqtt.is_some(),
        modbus: &modbus,
    };
    let sensors = sensors::validate_sensors(sensors, &tables, &mut gpio_pins)?;
    let (actuators, world_inputs) = actuators::validate_actuators(
        actuators,
        &sensors,
        &tables,
        &mut gpio_pins,
        default_timeout_ms,
    )?;
    // A world sensor or actuator without `[sim]` acts on the built-in room.
    let uses_world = sensors
        .iter()
        .any(|s| matches!(s.source, SensorSource::World(_)))
        || world_inputs;
    let sim_world = world.or_else(|| uses_world.then(super::sim_world::WorldSpec::default));
    Ok(HardwareSpec {
        gpio_backend: gpio.backend,
        mqtt: mqtt.cloned(),
        serial: serial.to_vec(),
        modbus,
        sensors,
        actuators,
        sim_world,
    })
}

/// What sensors and actuators refer to in the other tables.
struct Tables<'a> {
    /// Names of the `[[serial]]` ports.
    ports: &'a HashSet<&'a str>,
    serial: &'a [SerialPortConfig],
    /// Whether `[mqtt]` is configured.
    have_mqtt: bool,
    /// The validated `[[modbus]]` links.
    modbus: &'a [ModbusLinkSpec],
}

/// `[mqtt]`: the shared broker fields, its keep-alive sent as 16 bits.
fn validate_mqtt(m: &MqttConfig) -> Result<(), Invalid> {
    crate::config::broker::check(
        &m.broker_fields(),
        &crate::config::broker::BrokerLimits {
            section: "mqtt",
            // 5: the shortest keep-alive the MQTT 5 client takes.
            keep_alive_secs: 5..=u64::from(u16::MAX),
            min_packet_size: crate::hw::mqtt_link::MIN_MAX_PACKET,
        },
    )
}

/// `[[serial]]`: names and paths unique, line settings in range. The names.
fn validate_serial(serial: &[SerialPortConfig]) -> Result<HashSet<&str>, Invalid> {
    let mut port_names = HashSet::new();
    let mut paths = HashSet::new();
    for (i, p) in serial.iter().enumerate() {
        let key = |k: &str| format!("serial[{i}].{k}");
        if !valid_name(&p.name) {
            return Err(Invalid::new(
                key("name"),
                format!("{:?} is not a valid name", p.name),
            ));
        }
        if !port_names.insert(p.name.as_str()) {
            return Err(Invalid::new(
                key("name"),
                format!("duplicate serial port name {:?}", p.name),
            ));
        }
        if !paths.insert(p.path.as_str()) {
            return Err(Invalid::new(
                key("path"),
                format!("{} is configured twice", p.path),
            ));
        }
        if p.baud == 0 {
            return Err(Invalid::new(key("baud"), "must be greater than 0"));
        }
        if !(5..=8).contains(&p.data_bits) {
            return Err(Invalid::new(key("data_bits"), "must be 5, 6, 7 or 8"));
        }
        if !(1..=2).contains(&p.stop_bits) {
            return Err(Invalid::new(key("stop_bits"), "must be 1 or 2"));
        }
        within(key("max_line"), p.max_line, 8..=65_536)?;
        match (&p.query, p.query_hz) {
            (Some(q), hz) => {
                if q.is_empty() {
                    return Err(Invalid::new(key("query"), "must not be empty"));
                }
                rate(&key("query_hz"), hz, 1.0)?;
            }
            (None, Some(_)) => return Err(Invalid::new(key("query_hz"), "needs `query`")),
            (None, None) => {}
        }
        within(key("reconnect_ms"), p.reconnect_ms, 1..)?;
    }
    Ok(port_names)
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// A sensor's or an actuator's name: valid and not used twice.
fn check_name<'a>(
    name: &'a str,
    what: &str,
    names: &mut HashSet<&'a str>,
    key: &dyn Fn(&str) -> String,
) -> Result<(), Invalid> {
    if !valid_name(name) {
        return Err(Invalid::new(
            key("name"),
            format!("{name:?} is not a valid name (letters, digits, '_', '-')"),
        ));
    }
    if !names.insert(name) {
        return Err(Invalid::new(
            key("name"),
            format!("duplicate {what} name {name:?}"),
        ));
    }
    Ok(())
}

fn rate(key: &str, hz: Option<f64>, default_hz: f64) -> Result<Duration, Invalid> {
    let hz = hz.unwrap_or(default_hz);
    if !(hz.is_finite() && hz > 0.0 && hz <= 10_000.0) {
        return Err(Invalid::new(
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

/// `Err` naming key `k` when a key its source or kind needs is not set.
fn require(key: &dyn Fn(&str) -> String, is_set: bool, k: &str, what: &str) -> Result<(), Invalid> {
    if is_set {
        Ok(())
    } else {
        Err(Invalid::new(key(k), format!("is required for this {what}")))
    }
}

/// A topic rozd subscribes or publishes to: concrete, no wildcards.
fn concrete_topic(key: &dyn Fn(&str) -> String, topic: &str) -> Result<(), Invalid> {
    if topic.is_empty() || topic.contains('#') || topic.contains('+') {
        return Err(Invalid::new(
            key("topic"),
            "must be a concrete topic (no wildcards)",
        ));
    }
    Ok(())
}

/// A pin not yet used by another sensor or actuator; then used by `name`.
fn claim_pin(
    pins: &mut HashMap<u8, String>,
    pin: u8,
    name: &str,
    key: &dyn Fn(&str) -> String,
) -> Result<(), Invalid> {
    if let Some(other) = pins.insert(pin, name.to_string()) {
        return Err(Invalid::new(
            key("pin"),
            format!("GPIO {pin} is already used by {other:?}"),
        ));
    }
    Ok(())
}
