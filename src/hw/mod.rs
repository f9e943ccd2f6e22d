//! Hardware drivers: sensor sources and actuator outputs over serial, GPIO,
//! MQTT, the host system, and simulation. Drivers know nothing about
//! sessions or the OODA loop: they deliver readings to a [`Readings`] sink
//! and apply values through [`ActuatorDriver`].

pub mod config;
pub mod gpio;
pub mod modbus;
pub mod mqtt;
pub mod mqtt_link;
pub mod parse;
pub(crate) mod replay;
pub mod serial;
pub mod sim;
pub(crate) mod sim_config;
pub mod sim_world;
pub(crate) mod system;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// Health of a sensor or a source (a serial port, the MQTT connection, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Ok,
    Stale,
    Disconnected,
    Error(String),
}

impl Health {
    pub fn kind(&self) -> HealthKind {
        match self {
            Health::Ok => HealthKind::Ok,
            Health::Stale => HealthKind::Stale,
            Health::Disconnected => HealthKind::Disconnected,
            Health::Error(_) => HealthKind::Error,
        }
    }

    pub fn as_str(&self) -> &'static str {
        self.kind().as_str()
    }
}

/// [`Health`] without its message: what Observations, metrics and the
/// model's text show (`ok`, `stale`, `disconnected`, `error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthKind {
    Ok,
    Stale,
    Disconnected,
    Error,
}

impl HealthKind {
    pub const ALL: [HealthKind; 4] = [
        HealthKind::Ok,
        HealthKind::Stale,
        HealthKind::Disconnected,
        HealthKind::Error,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HealthKind::Ok => "ok",
            HealthKind::Stale => "stale",
            HealthKind::Disconnected => "disconnected",
            HealthKind::Error => "error",
        }
    }
}

impl std::fmt::Display for HealthKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where drivers deliver what they read. The OODA world state implements it.
pub trait Readings: Send + Sync + 'static {
    /// A new value of the named sensor, read now.
    fn record(&self, sensor: &str, value: f64);
    /// The health of a source (e.g. `serial:arduino`, `mqtt`, `gpio`).
    fn source_health(&self, source: &str, health: Health);
    /// Input from a source that could not be used (garbage, overlong or
    /// partial lines, undecodable payloads): counted, logged rate-limited.
    fn rejected(&self, source: &str, why: &str);
    /// A sensor that its (working) source could not read this time, and
    /// why (a Modbus exception, no reply): the sensor's health is `error`
    /// with that message until `None` (or a value) clears it.
    fn sensor_error(&self, _sensor: &str, _error: Option<&str>) {}
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HwError {
    #[error("{0} is disconnected")]
    Disconnected(String),
    #[error("no reply within {0} ms")]
    Timeout(u64),
    /// The OS or the device failed (`context`: what rozd was doing); the
    /// error itself is kept as the source.
    #[error("I/O error: {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: SourceError,
    },
    /// The driver cannot take the request now (a full queue, a closed link).
    #[error("{0}")]
    Busy(String),
    #[error("device answered {0:?}, which does not match the expected reply")]
    UnexpectedReply(String),
    #[error("{0}")]
    Unsupported(String),
    /// A Modbus request failed: the device answered with an exception, did
    /// not answer, or the link is down (`fault` names which).
    #[error("modbus link {link}: {fault}")]
    Modbus { link: String, fault: String },
}

/// An error kept whole (with its own sources), cheap to clone: a driver's
/// error goes to the caller, the audit and the log. Two are equal when they
/// say the same.
#[derive(Debug, Clone)]
pub struct SourceError(Arc<dyn std::error::Error + Send + Sync>);

impl SourceError {
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> SourceError {
        SourceError(Arc::new(error))
    }
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SourceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for SourceError {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

impl HwError {
    /// An OS or device error while doing `context`.
    pub fn io(
        context: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> HwError {
        HwError::Io {
            context: context.into(),
            source: SourceError::new(source),
        }
    }
}

pub type DriverFuture<'a> = Pin<Box<dyn Future<Output = Result<(), HwError>> + Send + 'a>>;

/// One actuator output. `apply` sets the value; the caller bounds it with the
/// actuator's deadline and drives the safe value when it fails or expires.
pub trait ActuatorDriver: Send + Sync + fmt::Debug {
    fn apply(&self, value: f64) -> DriverFuture<'_>;
}
