//! Safety: the protective-stop latch.
//!
//! This is a *software protective stop*: it drives every actuator to its safe
//! value and refuses PHYSICAL commands until cleared. It is not an emergency
//! stop: a hardwired emergency stop that cuts power is still required for
//! category-0 stopping.

use std::sync::Arc;

use serde::Serialize;
use tokio::sync::watch;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StopInfo {
    /// Where the stop came from: `rest`, `grpc`, `cli`, `gpio`, `mqtt`, `rule:<name>`.
    pub source: String,
    pub reason: String,
    pub since_unix_ms: i64,
}

/// The latch. Cheap to clone; all clones share one state.
#[derive(Debug, Clone)]
pub struct ProtectiveStop {
    state: Arc<watch::Sender<Option<StopInfo>>>,
}

impl Default for ProtectiveStop {
    fn default() -> Self {
        ProtectiveStop {
            state: Arc::new(watch::Sender::new(None)),
        }
    }
}

impl ProtectiveStop {
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
        }
        latched
    }

    /// Clears the latch; `false` if it was not active. Clearing moves nothing.
    pub fn clear(&self, by: &str) -> bool {
        let cleared = self.state.send_if_modified(|s| s.take().is_some());
        if cleared {
            tracing::warn!(by, "protective stop cleared");
        }
        cleared
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
}
