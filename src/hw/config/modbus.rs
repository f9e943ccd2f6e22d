//! `[[modbus]]` links as written, their validation, and the Modbus keys of
//! `[[sensors]]` (`source = "modbus"`) and `[[actuators]]` (`kind =
//! "modbus"`).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde::Deserialize;

use super::{Invalid, Parity, rate, require, valid_name};
use crate::config::types::within;
use crate::hw::modbus::codec::{Codec, Order, Table, ValueType};

/// `[[modbus]]`: one Modbus link (a TCP server, or a device on a serial
/// line) polled by its sensors and written by its actuators.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModbusLinkConfig {
    pub name: String,
    /// `tcp://host:port` (port 502 when absent).
    #[serde(default)]
    pub url: Option<String>,
    /// The serial line of a Modbus RTU device.
    #[serde(default)]
    pub rtu: Option<RtuConfig>,
    /// The device's unit (slave) id; a sensor or actuator may name another
    /// device on the same line.
    #[serde(default = "default_unit_id")]
    pub unit_id: u8,
    /// How long one request waits for its reply.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// How often a request that met a timeout or a bad frame is sent again.
    #[serde(default = "default_retries")]
    pub retries: u8,
    /// RTU: the least silence between two frames; default 3.5 characters
    /// at the line's baud rate (at least 1.75 ms).
    #[serde(default)]
    pub frame_gap_ms: Option<f64>,
    /// The rate its sensors are read at (a sensor's `rate_hz` makes a poll
    /// group of its own).
    #[serde(default = "default_poll_hz")]
    pub poll_hz: f64,
    /// The most registers one read request asks for (at most 125).
    #[serde(default = "default_max_registers")]
    pub max_registers: u16,
    /// Unused registers a read may span to join two sensors' addresses.
    #[serde(default = "default_max_gap")]
    pub max_gap: u16,
    /// Reconnection backoff: from this to `reconnect_max_ms`, doubling.
    #[serde(default = "default_reconnect_min_ms")]
    pub reconnect_min_ms: u64,
    #[serde(default = "default_reconnect_max_ms")]
    pub reconnect_max_ms: u64,
}

/// `rtu = { port, baud, parity, data_bits, stop_bits }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RtuConfig {
    pub port: String,
    #[serde(default = "default_rtu_baud")]
    pub baud: u32,
    /// Modbus RTU's default is even parity.
    #[serde(default = "default_rtu_parity")]
    pub parity: Parity,
    #[serde(default = "default_data_bits")]
    pub data_bits: u8,
    #[serde(default = "default_stop_bits")]
    pub stop_bits: u8,
}

/// How an actuator writes a register value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WriteMode {
    /// FC 6 (one register) or FC 5 (one coil).
    Single,
    /// FC 16 (registers) or FC 15 (coils).
    Multiple,
}

/// Where a link reaches its device.
#[derive(Debug, Clone, PartialEq)]
pub enum ModbusTransport {
    Tcp {
        host: String,
        port: u16,
    },
    Rtu {
        path: String,
        baud: u32,
        parity: Parity,
        data_bits: u8,
        stop_bits: u8,
    },
}

/// A validated `[[modbus]]` link.
#[derive(Debug, Clone, PartialEq)]
pub struct ModbusLinkSpec {
    pub name: String,
    pub transport: ModbusTransport,
    pub unit_id: u8,
    pub timeout: Duration,
    pub retries: u8,
    pub frame_gap: Duration,
    pub poll: Duration,
    pub max_registers: u16,
    pub max_gap: u16,
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
}

impl ModbusLinkSpec {
    /// `modbus:<name>`: its source in Observations and metrics.
    pub fn source(&self) -> String {
        format!("modbus:{}", self.name)
    }
}

/// One value on a device: unit, table, address, codec.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModbusPoint {
    pub unit: u8,
    pub table: Table,
    pub address: u16,
    pub codec: Codec,
}

impl std::fmt::Display for ModbusPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unit {} {} {}",
            self.unit,
            self.table.as_str(),
            self.address
        )
    }
}

/// The Modbus keys shared by sensors and actuators, as written.
#[derive(Debug, Clone, Copy)]
pub(super) struct PointKeys<'a> {
    pub link: Option<&'a str>,
    pub unit_id: Option<u8>,
    pub register: Option<Table>,
    pub address: Option<u16>,
    pub value_type: Option<ValueType>,
    pub word_order: Option<Order>,
    pub byte_order: Option<Order>,
    pub scale: Option<f64>,
    pub offset: Option<f64>,
}

/// `[[modbus]]`: names unique, a url or an rtu line (not both), settings
/// in range. The links by name.
pub(super) fn validate_links(
    links: &[ModbusLinkConfig],
    serial_paths: &HashSet<&str>,
) -> Result<Vec<ModbusLinkSpec>, Invalid> {
    let mut names = HashSet::new();
    let mut ports = HashSet::new();
    let mut specs = Vec::with_capacity(links.len());
    for (i, l) in links.iter().enumerate() {
        let key = |k: &str| format!("modbus[{i}].{k}");
        if !valid_name(&l.name) {
            return Err(Invalid::new(
                key("name"),
                format!("{:?} is not a valid name", l.name),
            ));
        }
        if !names.insert(l.name.as_str()) {
            return Err(Invalid::new(
                key("name"),
                format!("duplicate modbus link name {:?}", l.name),
            ));
        }
        let transport = match (&l.url, &l.rtu) {
            (Some(_), Some(_)) => {
                return Err(Invalid::new(
                    key("rtu"),
                    "give either url (Modbus TCP) or rtu (a serial line), not both",
                ));
            }
            (None, None) => {
                return Err(Invalid::new(
                    key("url"),
                    "is required (tcp://host:port), or give rtu = { port = ... }",
                ));
            }
            (Some(url), None) => {
                let (host, port) = tcp_address(url).map_err(|why| Invalid::new(key("url"), why))?;
                ModbusTransport::Tcp { host, port }
            }
            (None, Some(rtu)) => {
                let rkey = |k: &str| key(&format!("rtu.{k}"));
                if rtu.port.is_empty() {
                    return Err(Invalid::new(rkey("port"), "must not be empty"));
                }
                if serial_paths.contains(rtu.port.as_str()) {
                    return Err(Invalid::new(
                        rkey("port"),
                        format!(
                            "{} is also a [[serial]] port; a line has one owner",
                            rtu.port
                        ),
                    ));
                }
                if !ports.insert(rtu.port.as_str()) {
                    return Err(Invalid::new(
                        rkey("port"),
                        format!(
                            "{} is used by another link; several devices on one line are one \
                             link, each sensor or actuator naming its unit_id",
                            rtu.port
                        ),
                    ));
                }
                if rtu.baud == 0 {
                    return Err(Invalid::new(rkey("baud"), "must be greater than 0"));
                }
                if !(7..=8).contains(&rtu.data_bits) {
                    return Err(Invalid::new(rkey("data_bits"), "must be 7 or 8"));
                }
                if !(1..=2).contains(&rtu.stop_bits) {
                    return Err(Invalid::new(rkey("stop_bits"), "must be 1 or 2"));
                }
                ModbusTransport::Rtu {
                    path: rtu.port.clone(),
                    baud: rtu.baud,
                    parity: rtu.parity,
                    data_bits: rtu.data_bits,
                    stop_bits: rtu.stop_bits,
                }
            }
        };
        within(key("timeout_ms"), l.timeout_ms, 1..=60_000)?;
        within(key("retries"), l.retries, ..=10)?;
        let frame_gap = match (&transport, l.frame_gap_ms) {
            (ModbusTransport::Tcp { .. }, Some(_)) => {
                return Err(Invalid::new(
                    key("frame_gap_ms"),
                    "applies only to an rtu link",
                ));
            }
            (ModbusTransport::Tcp { .. }, None) => Duration::ZERO,
            (ModbusTransport::Rtu { .. }, Some(ms)) => {
                // NaN and the infinities are outside too.
                within(key("frame_gap_ms"), ms, 0.0..=1000.0)?;
                Duration::from_secs_f64(ms / 1000.0)
            }
            (ModbusTransport::Rtu { baud, .. }, None) => default_frame_gap(*baud),
        };
        let poll = rate(&key("poll_hz"), Some(l.poll_hz), l.poll_hz)?;
        within(key("max_registers"), l.max_registers, 1..=125)?;
        within(key("max_gap"), l.max_gap, ..=125)?;
        within(key("reconnect_min_ms"), l.reconnect_min_ms, 1..)?;
        if l.reconnect_max_ms < l.reconnect_min_ms {
            return Err(Invalid::new(
                key("reconnect_max_ms"),
                "must not be below reconnect_min_ms",
            ));
        }
        specs.push(ModbusLinkSpec {
            name: l.name.clone(),
            transport,
            unit_id: l.unit_id,
            timeout: Duration::from_millis(l.timeout_ms),
            retries: l.retries,
            frame_gap,
            poll,
            max_registers: l.max_registers,
            max_gap: l.max_gap,
            reconnect_min: Duration::from_millis(l.reconnect_min_ms),
            reconnect_max: Duration::from_millis(l.reconnect_max_ms),
        });
    }
    Ok(specs)
}

/// 3.5 character times of 11 bits at `baud`, at least 1.75 ms (the
/// specification's fixed value above 19200 baud).
pub(crate) fn default_frame_gap(baud: u32) -> Duration {
    let chars = Duration::from_secs_f64(3.5 * 11.0 / f64::from(baud.max(1)));
    chars.max(Duration::from_micros(1750))
}

/// `tcp://host[:port]`.
fn tcp_address(url: &str) -> Result<(String, u16), String> {
    let Some(rest) = url.strip_prefix("tcp://") else {
        return Err(format!(
            "{url:?} is not a Modbus TCP url (tcp://host:port); a serial device takes rtu = {{ port = ... }}"
        ));
    };
    let rest = rest.trim_end_matches('/');
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("{url:?}: unclosed [ in the address"))?;
        (host, after.strip_prefix(':'))
    } else {
        match rest.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (rest, None),
        }
    };
    if host.is_empty() || host.contains(['/', '@', '?', '#']) {
        return Err(format!("{url:?} has no valid host"));
    }
    let port = match port {
        None => 502,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("{url:?}: {p:?} is not a port (1-65535)"))?,
    };
    Ok((host.to_string(), port))
}

/// A sensor's or actuator's point on a configured link: the link exists,
/// the register is of the right kind, the type fits the table, scale and
/// offset are finite (scale not 0).
pub(super) fn point(
    k: &PointKeys<'_>,
    links: &[ModbusLinkSpec],
    key: &dyn Fn(&str) -> String,
    what: &str,
    writing: bool,
) -> Result<(String, ModbusPoint), Invalid> {
    require(key, k.link.is_some(), "link", what)?;
    let link = k.link.unwrap_or_default();
    let Some(spec) = links.iter().find(|l| l.name == link) else {
        return Err(Invalid::new(
            key("link"),
            format!("no [[modbus]] link named {link:?}"),
        ));
    };
    require(key, k.register.is_some(), "register", what)?;
    require(key, k.address.is_some(), "address", what)?;
    let table = k.register.unwrap_or(Table::Holding);
    if writing && !table.is_writable() {
        return Err(Invalid::new(
            key("register"),
            format!(
                "{} registers are read-only; an actuator writes holding registers or coils",
                table.as_str()
            ),
        ));
    }
    let value_type = match (table.is_bits(), k.value_type) {
        (true, None | Some(ValueType::Bool)) => ValueType::Bool,
        (true, Some(other)) => {
            return Err(Invalid::new(
                key("type"),
                format!(
                    "a {} holds one bit: type bool, not {}",
                    table.as_str(),
                    other.as_str()
                ),
            ));
        }
        (false, Some(ValueType::Bool)) => {
            return Err(Invalid::new(
                key("type"),
                "bool is for coils and discrete inputs; a register is u16, i16, u32, i32 or f32",
            ));
        }
        (false, ty) => ty.unwrap_or(ValueType::U16),
    };
    if value_type.width() == 1 {
        for (name, set) in [("word_order", k.word_order.is_some())] {
            if set {
                return Err(Invalid::new(
                    key(name),
                    format!("applies to 32-bit types, not {}", value_type.as_str()),
                ));
            }
        }
    }
    if value_type == ValueType::Bool && k.byte_order.is_some() {
        return Err(Invalid::new(key("byte_order"), "does not apply to a bit"));
    }
    let address = k.address.unwrap_or(0);
    if u32::from(address) + u32::from(value_type.width()) > 65_536 {
        return Err(Invalid::new(
            key("address"),
            format!(
                "a {} at {address} runs past the last address (65535)",
                value_type.as_str()
            ),
        ));
    }
    let scale = k.scale.unwrap_or(1.0);
    if !(scale.is_finite() && scale != 0.0) {
        return Err(Invalid::new(
            key("scale"),
            format!("{scale} is not a finite number other than 0"),
        ));
    }
    let offset = k.offset.unwrap_or(0.0);
    if !offset.is_finite() {
        return Err(Invalid::new(key("offset"), "must be a finite number"));
    }
    Ok((
        link.to_string(),
        ModbusPoint {
            unit: k.unit_id.unwrap_or(spec.unit_id),
            table,
            address,
            codec: Codec {
                value_type,
                word_order: k.word_order.unwrap_or_default(),
                byte_order: k.byte_order.unwrap_or_default(),
                scale,
                offset,
            },
        },
    ))
}

/// An actuator's write: its point not written by another actuator, the
/// mode fitting the type.
pub(super) fn write_mode(
    mode: Option<WriteMode>,
    point: &ModbusPoint,
    key: &dyn Fn(&str) -> String,
) -> Result<WriteMode, Invalid> {
    match (mode, point.codec.value_type.width()) {
        (Some(WriteMode::Single), 2) => Err(Invalid::new(
            key("write"),
            format!(
                "a {} takes two registers: write = \"multiple\"",
                point.codec.value_type.as_str()
            ),
        )),
        (Some(mode), _) => Ok(mode),
        (None, 2) => Ok(WriteMode::Multiple),
        (None, _) => Ok(WriteMode::Single),
    }
}

/// Registers written by actuators, so that two never write the same one.
#[derive(Debug, Default)]
pub(super) struct Written {
    by: HashMap<(String, u8, Table, u16), String>,
}

impl Written {
    pub(super) fn claim(
        &mut self,
        link: &str,
        p: &ModbusPoint,
        actuator: &str,
        key: &dyn Fn(&str) -> String,
    ) -> Result<(), Invalid> {
        for a in p.address..p.address.saturating_add(p.codec.value_type.width()) {
            if let Some(other) = self
                .by
                .insert((link.to_string(), p.unit, p.table, a), actuator.to_string())
            {
                return Err(Invalid::new(
                    key("address"),
                    format!(
                        "{} {a} of link {link:?} is already written by {other:?}",
                        p.table.as_str()
                    ),
                ));
            }
        }
        Ok(())
    }
}

fn default_unit_id() -> u8 {
    1
}
fn default_timeout_ms() -> u64 {
    500
}
fn default_retries() -> u8 {
    1
}
fn default_poll_hz() -> f64 {
    10.0
}
fn default_max_registers() -> u16 {
    125
}
fn default_max_gap() -> u16 {
    16
}
fn default_reconnect_min_ms() -> u64 {
    100
}
fn default_reconnect_max_ms() -> u64 {
    5_000
}
fn default_rtu_baud() -> u32 {
    19_200
}
fn default_rtu_parity() -> Parity {
    Parity::Even
}
fn default_data_bits() -> u8 {
    8
}
fn default_stop_bits() -> u8 {
    1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_urls_name_host_and_port() {
        assert_eq!(
            tcp_address("tcp://10.0.0.5:502"),
            Ok(("10.0.0.5".into(), 502))
        );
        assert_eq!(
            tcp_address("tcp://vfd.local"),
            Ok(("vfd.local".into(), 502))
        );
        assert_eq!(tcp_address("tcp://[::1]:1502"), Ok(("::1".into(), 1502)));
        assert!(tcp_address("modbus://x:502").is_err());
        assert!(tcp_address("tcp://x:0").is_err());
        assert!(tcp_address("tcp://:502").is_err());
        assert!(tcp_address("tcp://x:99999").is_err());
    }

    #[test]
    fn the_default_frame_gap_is_three_and_a_half_characters() {
        // 9600 baud: 3.5 * 11 / 9600 s = 4.01 ms
        let gap = default_frame_gap(9_600);
        assert!(gap > Duration::from_micros(4_000) && gap < Duration::from_micros(4_020));
        assert_eq!(default_frame_gap(115_200), Duration::from_micros(1750));
    }
}
