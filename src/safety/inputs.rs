//! Protective-stop inputs from `[safety]`: a GPIO pin and an MQTT topic.
//!
//! - **GPIO** (`estop_gpio_pin`, `estop_gpio_active`, `estop_gpio_pull`): on
//!   every edge (or every 10 ms where the backend has no edges) the input is
//!   read; while it is at its active level it latches the stop (source
//!   `gpio`) and *holds* it, so the latch cannot be cleared until the input
//!   is released. No debounce delays a stop: the first active level counts.
//!   An edge after which the level is inactive again (a pulse shorter than
//!   it took us to look) also latches. If the backend stops reporting edges,
//!   that is a fault and latches too.
//! - **MQTT** (`estop_mqtt_topic`): a message whose payload is `1`, `true` or
//!   `stop` (case-insensitive, surrounding whitespace ignored) latches the
//!   stop (source `mqtt`); anything else is ignored (logged). MQTT cannot
//!   clear the stop. Retained messages count like any other: a retained
//!   `stop` latches the stop whenever rozd subscribes anew. The topic is
//!   read over a broker connection of its own ([`crate::hw::mqtt::Mqtt::listen`]),
//!   so sensor traffic cannot delay or crowd out a stop.
//!
//! These are software inputs of a software protective stop; they do not
//! replace a hardwired emergency stop.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::types::{Invalid, SafetyConfig};
use crate::hw::HwError;
use crate::hw::config::{ActuatorTarget, HardwareSpec, Level, Pull, SensorSource};
use crate::hw::gpio::GpioInput;
use crate::ooda::Ooda;
use crate::safety::{StopRequest, StopSource};

/// The source of stops from the GPIO input.
const GPIO_SOURCE: &StopSource = &StopSource::Gpio;
/// The source of stops from the MQTT topic.
const MQTT_SOURCE: &StopSource = &StopSource::Mqtt;
/// Poll period where a GPIO backend reports no edges.
const POLL: Duration = Duration::from_millis(10);
/// Ignored messages on the MQTT stop topic are logged at most this often.
const IGNORED_LOG_EVERY: Duration = Duration::from_secs(10);

/// The configured GPIO stop input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpioStopInput {
    pub pin: u8,
    pub active: Level,
    pub pull: Pull,
}

impl GpioStopInput {
    pub fn from_config(cfg: &SafetyConfig) -> Option<GpioStopInput> {
        let pin = cfg.estop_gpio_pin?;
        let active = cfg.estop_gpio_active.unwrap_or(Level::Low);
        let pull = cfg.estop_gpio_pull.unwrap_or(match active {
            Level::Low => Pull::Up,
            Level::High => Pull::Down,
        });
        Some(GpioStopInput { pin, active, pull })
    }

    /// The input's name in guards and clear refusals: `gpio:<pin>`.
    pub fn name(&self) -> String {
        format!("gpio:{}", self.pin)
    }

    fn is_active(&self, high: bool) -> bool {
        high == (self.active == Level::High)
    }

    fn level_name(&self) -> &'static str {
        match self.active {
            Level::High => "high",
            Level::Low => "low",
        }
    }
}

/// The input's name for an MQTT stop topic: `mqtt:<topic>`.
pub fn mqtt_input_name(topic: &str) -> String {
    format!("mqtt:{topic}")
}

/// Whether an MQTT payload asks for a stop: `1`, `true` or `stop`.
pub fn is_stop_payload(payload: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(payload) else {
        return false;
    };
    let text = text.trim();
    ["1", "true", "stop"]
        .iter()
        .any(|word| text.eq_ignore_ascii_case(word))
}

/// Checks `[safety]`'s stop inputs against the validated hardware: the pin
/// is not used by a sensor or actuator; the topic needs `[mqtt]`, is
/// concrete, and is not a sensor's or an actuator's topic.
pub fn validate(cfg: &SafetyConfig, hw: &HardwareSpec) -> Result<(), Invalid> {
    let err = |key: &str, message: String| Err(Invalid::new(format!("safety.{key}"), message));
    if cfg.estop_gpio_pin.is_none() {
        if cfg.estop_gpio_active.is_some() {
            return err("estop_gpio_active", "needs safety.estop_gpio_pin".into());
        }
        if cfg.estop_gpio_pull.is_some() {
            return err("estop_gpio_pull", "needs safety.estop_gpio_pin".into());
        }
    }
    if let Some(pin) = cfg.estop_gpio_pin {
        let sensor = hw.sensors.iter().find_map(|s| match s.source {
            SensorSource::Gpio { pin: p, .. } if p == pin => Some(format!("sensor {:?}", s.name)),
            _ => None,
        });
        let actuator = hw.actuators.iter().find_map(|a| match a.target {
            ActuatorTarget::Gpio { pin: p, .. } | ActuatorTarget::Pwm { pin: p, .. }
                if p == pin =>
            {
                Some(format!("actuator {:?}", a.name))
            }
            _ => None,
        });
        if let Some(user) = sensor.or(actuator) {
            return err(
                "estop_gpio_pin",
                format!("GPIO {pin} is already used by {user}"),
            );
        }
    }
    if let Some(topic) = &cfg.estop_mqtt_topic {
        if hw.mqtt.is_none() {
            return err(
                "estop_mqtt_topic",
                "an MQTT stop topic needs an [mqtt] section".into(),
            );
        }
        if topic.trim().is_empty() || topic.contains(['#', '+']) {
            return err(
                "estop_mqtt_topic",
                format!("{topic:?} must be a concrete topic (no wildcards)"),
            );
        }
        let sensor = hw.sensors.iter().find_map(|s| match &s.source {
            SensorSource::Mqtt { topic: t, .. } if t == topic => {
                Some(format!("sensor {:?}", s.name))
            }
            _ => None,
        });
        let actuator = hw.actuators.iter().find_map(|a| match &a.target {
            ActuatorTarget::Mqtt { topic: t, .. } if t == topic => {
                Some(format!("actuator {:?}", a.name))
            }
            _ => None,
        });
        if let Some(user) = sensor.or(actuator) {
            return err(
                "estop_mqtt_topic",
                format!("{topic:?} is already the topic of {user}"),
            );
        }
    }
    Ok(())
}

/// One line for `rozd check`: the configured stop inputs.
pub fn describe(cfg: &SafetyConfig) -> String {
    let mut parts = Vec::new();
    if let Some(g) = GpioStopInput::from_config(cfg) {
        let pull = match g.pull {
            Pull::None => "none",
            Pull::Up => "up",
            Pull::Down => "down",
        };
        parts.push(format!(
            "GPIO {} (active {}, pull {pull})",
            g.pin,
            g.level_name()
        ));
    }
    if let Some(topic) = &cfg.estop_mqtt_topic {
        parts.push(format!("MQTT topic {topic}"));
    }
    if parts.is_empty() {
        "none (REST, gRPC, CLI and rules only)".to_string()
    } else {
        parts.join(", ")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("protective-stop input GPIO {pin} (safety.estop_gpio_pin): {error}")]
    Gpio { pin: u8, error: HwError },
    #[error("protective-stop input MQTT topic {topic} (safety.estop_mqtt_topic): {why}")]
    Mqtt { topic: String, why: String },
}

/// Opens the configured stop inputs and starts their tasks (they end when
/// the OODA loop shuts down). An input that cannot be opened is an error:
/// rozd does not run without a stop input it was configured with.
pub fn start(cfg: &SafetyConfig, ooda: &Arc<Ooda>) -> Result<(), InputError> {
    if let Some(input) = GpioStopInput::from_config(cfg) {
        let pin = ooda
            .gpio()
            .input(input.pin, input.pull)
            .map_err(|error| InputError::Gpio {
                pin: input.pin,
                error,
            })?;
        tracing::info!(
            pin = input.pin,
            active = input.level_name(),
            "protective-stop input on GPIO"
        );
        tokio::spawn(watch_gpio(input, pin, ooda.clone(), ooda.shutdown_token()));
    }
    if let Some(topic) = &cfg.estop_mqtt_topic {
        let mqtt_error = |why: String| InputError::Mqtt {
            topic: topic.clone(),
            why,
        };
        let mqtt = ooda
            .mqtt()
            .ok_or_else(|| mqtt_error("no MQTT client ([mqtt] is not configured)".into()))?;
        let messages = mqtt.listen(topic).map_err(|e| {
            mqtt_error(match e {
                HwError::Disconnected(_) => {
                    "the MQTT client cannot work (see the mqtt errors above)".into()
                }
                other => other.to_string(),
            })
        })?;
        tracing::info!(%topic, "protective-stop input on MQTT");
        tokio::spawn(watch_mqtt(
            topic.clone(),
            messages,
            ooda.clone(),
            ooda.shutdown_token(),
        ));
    }
    Ok(())
}

/// Watches the GPIO stop input until shutdown.
async fn watch_gpio(
    input: GpioStopInput,
    mut pin: Box<dyn GpioInput>,
    ooda: Arc<Ooda>,
    shutdown: CancellationToken,
) {
    let name = input.name();
    let stop = ooda.protective_stop().clone();
    let mut changes = pin.changes();
    let mut ticker = tokio::time::interval(POLL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut was_active: Option<bool> = None;
    let mut edge = false;
    loop {
        let active = input.is_active(pin.read());
        let why = format!("GPIO {} is {}", input.pin, input.level_name());
        if active {
            stop.hold(&name, GPIO_SOURCE, &why);
            if was_active != Some(true) {
                let reason = if was_active.is_none() {
                    format!("stop input active at start-up ({why})")
                } else {
                    format!("stop input active ({why})")
                };
                ooda.trigger_stop(StopRequest::new(GPIO_SOURCE, &reason))
                    .await;
            }
        } else {
            stop.release(&name);
            if edge && was_active == Some(false) {
                // Woken by edges, yet inactive as before: a pulse we did not see.
                ooda.trigger_stop(StopRequest::new(
                    GPIO_SOURCE,
                    &format!("stop input pulsed ({why} briefly)"),
                ))
                .await;
            } else if was_active == Some(true) {
                tracing::info!(input = %name, "stop input released; the stop stays latched until cleared");
            }
        }
        was_active = Some(active);
        edge = match changes.as_mut() {
            Some(rx) => tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        let why = format!("GPIO {} stopped reporting edges", input.pin);
                        tracing::error!(input = %name, "{why}; latching the protective stop");
                        stop.hold(&name, GPIO_SOURCE, &why);
                        ooda.trigger_stop(StopRequest::new(
                            GPIO_SOURCE,
                            &format!("stop input lost ({why})"),
                        ))
                        .await;
                        return;
                    }
                    true
                }
                () = shutdown.cancelled() => return,
            },
            None => tokio::select! {
                _ = ticker.tick() => false,
                () = shutdown.cancelled() => return,
            },
        };
    }
}

/// Triggers the stop for every stop message on `topic` until shutdown.
async fn watch_mqtt(
    topic: String,
    mut messages: mpsc::UnboundedReceiver<Vec<u8>>,
    ooda: Arc<Ooda>,
    shutdown: CancellationToken,
) {
    let mut ignored_log = crate::logging::LogLimiter::new(IGNORED_LOG_EVERY);
    loop {
        let payload = tokio::select! {
            message = messages.recv() => match message {
                Some(payload) => payload,
                None => return,
            },
            () = shutdown.cancelled() => return,
        };
        if is_stop_payload(&payload) {
            ooda.trigger_stop(StopRequest::new(
                MQTT_SOURCE,
                &format!("stop message on MQTT topic {topic}"),
            ))
            .await;
        } else if let Some(more) = ignored_log.allow(tokio::time::Instant::now()) {
            // Rate-limited: garbage on the topic must not flood the journal.
            tracing::info!(
                %topic,
                payload = %String::from_utf8_lossy(&payload[..payload.len().min(64)]),
                "ignored a message on the MQTT stop topic (only 1, true or stop trigger; MQTT \
                 cannot clear; {more} more ignored since the last report)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_payloads() {
        for yes in ["1", "true", "TRUE", "stop", " Stop\n", "\t1 "] {
            assert!(is_stop_payload(yes.as_bytes()), "{yes:?}");
        }
        for no in ["", "0", "false", "clear", "10", "stopped", "{\"stop\":1}"] {
            assert!(!is_stop_payload(no.as_bytes()), "{no:?}");
        }
        assert!(!is_stop_payload(&[0xff, 0x31]));
    }

    #[test]
    fn gpio_defaults_follow_the_active_level() {
        let mut cfg = SafetyConfig {
            estop_gpio_pin: Some(4),
            ..SafetyConfig::default()
        };
        let g = GpioStopInput::from_config(&cfg).unwrap();
        assert_eq!((g.active, g.pull), (Level::Low, Pull::Up));
        assert!(g.is_active(false) && !g.is_active(true));
        cfg.estop_gpio_active = Some(Level::High);
        let g = GpioStopInput::from_config(&cfg).unwrap();
        assert_eq!((g.active, g.pull), (Level::High, Pull::Down));
        assert_eq!(g.name(), "gpio:4");
        assert!(GpioStopInput::from_config(&SafetyConfig::default()).is_none());
    }
}

/// No payload on the stop topic panics the input.
#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn any_payload_is_a_stop_or_not(payload in prop::collection::vec(any::<u8>(), 0..300)) {
            let _ = is_stop_payload(&payload);
        }

        /// A stop wrapped in any amount of whitespace is still a stop.
        #[test]
        fn a_padded_stop_is_a_stop(
            pad_before in "[ \t\r\n]{0,5}",
            pad_after in "[ \t\r\n]{0,5}",
        ) {
            let padded = format!("{pad_before}stop{pad_after}");
            prop_assert!(is_stop_payload(padded.as_bytes()));
        }
    }
}
