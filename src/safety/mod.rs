//! Safety: the protective-stop latch.
//!
//! This is a *software protective stop*: it drives every actuator to its safe
//! value and refuses PHYSICAL commands until cleared. It is not an emergency
//! stop: a hardwired emergency stop that cuts power is still required for
//! category-0 stopping.
//!
//! Stop sources: `POST /v1/estop`, the `roz.v1.SafetyService` RPCs, the CLI
//! (through REST), reflex rules, and the inputs of [`inputs`] (a GPIO pin and
//! an MQTT topic). A source that still *asserts* the stop (a pressed, latching
//! stop button on the GPIO input) [`ProtectiveStop::hold`]s it: the latch
//! cannot be cleared until the input is released.

pub mod inputs;
pub mod status;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde::Serialize;
use tokio::sync::watch;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StopInfo {
    /// Where the stop came from: `rest`, `grpc`, `cli`, `gpio`, `mqtt`, `rule:<name>`.
    pub source: String,
    pub reason: String,
    pub since_unix_ms: i64,
}

/// Why a clear was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stop input {input} still asserts the stop ({why}); release it before clearing")]
pub struct ClearRefused {
    /// The input, e.g. `gpio:17`.
    pub input: String,
    pub why: String,
}

/// A change of the latch, for the audit.
#[derive(Debug, Clone, PartialEq)]
pub enum StopEvent {
    Triggered { source: String, reason: String },
    Cleared { by: String },
    ClearRefused { by: String, input: String },
}

/// The latch. Cheap to clone; all clones share one state.
#[derive(Debug, Clone)]
pub struct ProtectiveStop {
    state: Arc<watch::Sender<Option<StopInfo>>>,
    /// Where each change goes (the daemon writes it to the audit).
    audit: Arc<std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<StopEvent>>>,
    /// Inputs that still assert the stop (input -> description). The lock is
    /// also held while clearing, so a clear and an input becoming active
    /// cannot interleave.
    held: Arc<Mutex<BTreeMap<String, String>>>,
}

impl Default for ProtectiveStop {
    fn default() -> Self {
        ProtectiveStop {
            state: Arc::new(watch::Sender::new(None)),
            audit: Arc::default(),
            held: Arc::default(),
        }
    }
}

impl ProtectiveStop {
    /// Sends every later trigger, clear and refused clear to `sink`.
    pub fn set_audit(&self, sink: tokio::sync::mpsc::UnboundedSender<StopEvent>) {
        let _ = self.audit.set(sink);
    }

    fn report(&self, event: StopEvent) {
        if let Some(sink) = self.audit.get() {
            // A closed sink means the daemon is gone; nothing left to record.
            let _ = sink.send(event);
        }
    }

    pub fn active(&self) -> Option<StopInfo> {
        self.state.borrow().clone()
    }

    /// Latches the stop; `false` if it was already active (the first cause is kept).
    pub fn trigger(&self, source: &str, reason: &str) -> bool {
        let info = StopInfo {
            source: source.to_string(),
            reason: reason.to_string(),
            since_unix_ms: crate::store::now_ms(),
        };
        let latched = self.state.send_if_modified(|s| {
            if s.is_some() {
                return false;
            }
            *s = Some(info);
            true
        });
        if latched {
            tracing::warn!(source, reason, "PROTECTIVE STOP");
            self.report(StopEvent::Triggered {
                source: source.to_string(),
                reason: reason.to_string(),
            });
        }
        latched
    }

    /// Clears the latch: `Ok(false)` if it was not active, refused while an
    /// input still asserts the stop. Clearing moves nothing.
    pub fn try_clear(&self, by: &str) -> Result<bool, ClearRefused> {
        let held = self.held();
        if let Some((input, why)) = held.iter().next() {
            tracing::warn!(
                by,
                input,
                "protective stop NOT cleared: an input still asserts it"
            );
            self.report(StopEvent::ClearRefused {
                by: by.to_string(),
                input: input.clone(),
            });
            return Err(ClearRefused {
                input: input.clone(),
                why: why.clone(),
            });
        }
        let cleared = self.state.send_if_modified(|s| s.take().is_some());
        drop(held);
        if cleared {
            tracing::warn!(by, "protective stop cleared");
            self.report(StopEvent::Cleared { by: by.to_string() });
        }
        Ok(cleared)
    }

    /// [`ProtectiveStop::try_clear`]; `false` if it was not active or was refused.
    pub fn clear(&self, by: &str) -> bool {
        self.try_clear(by).unwrap_or(false)
    }

    /// Marks `input` as asserting the stop (it does not latch by itself:
    /// latch with [`ProtectiveStop::trigger`] or `Ooda::trigger_stop` too).
    pub fn hold(&self, input: &str, why: &str) {
        self.held().insert(input.to_string(), why.to_string());
    }

    /// `input` no longer asserts the stop. The latch stays until cleared.
    pub fn release(&self, input: &str) {
        self.held().remove(input);
    }

    /// Inputs that assert the stop now, by name.
    pub fn held_inputs(&self) -> Vec<String> {
        self.held().keys().cloned().collect()
    }

    fn held(&self) -> MutexGuard<'_, BTreeMap<String, String>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn subscribe(&self) -> watch::Receiver<Option<StopInfo>> {
        self.state.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latches_first_cause_until_cleared() {
        let stop = ProtectiveStop::default();
        assert!(stop.active().is_none());
        assert!(stop.trigger("rest", "operator"));
        assert!(!stop.trigger("rule:x", "later"));
        assert_eq!(stop.active().unwrap().source, "rest");
        assert!(stop.clone().clear("operator"));
        assert!(!stop.clear("operator"));
        assert!(stop.active().is_none());
    }

    #[test]
    fn a_held_input_blocks_clearing_until_released() {
        let stop = ProtectiveStop::default();
        stop.hold("gpio:17", "GPIO 17 is low");
        assert!(stop.trigger("gpio", "button"));
        let refused = stop.try_clear("operator").unwrap_err();
        assert_eq!(refused.input, "gpio:17");
        assert!(!stop.clear("operator"));
        assert!(stop.active().is_some(), "still latched");
        assert_eq!(stop.held_inputs(), ["gpio:17"]);
        stop.release("gpio:17");
        assert!(
            stop.active().is_some(),
            "releasing the input does not clear"
        );
        assert_eq!(stop.try_clear("operator"), Ok(true));
        assert_eq!(stop.try_clear("operator"), Ok(false));
    }
}
