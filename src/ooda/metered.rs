//! The actuators' events as metrics: an observer that turns them into the
//! plain labels of the loop's own metrics ([`super::metrics`]).

use super::act::{ActError, ActuatorEvent, ActuatorObserver, Applied, Origin, VerdictEvent};

/// Counts every command by actuator, origin kind and result, every safe
/// drive (origin `safety`: `applied`, or `driver_error` when the device did
/// not confirm it), and every feedback verdict by actuator and status.
#[derive(Debug, Default)]
pub(crate) struct ActuatorMetrics;

impl ActuatorObserver for ActuatorMetrics {
    fn actuator_changed(&self, event: &ActuatorEvent) {
        // Commands are counted with their outcome below; here only the safe
        // drives, which are no command of anyone's.
        if let Origin::Safety(_) = event.origin {
            let result = if event.error.is_none() {
                "applied"
            } else {
                "driver_error"
            };
            super::metrics::actuator_command(&event.actuator, "safety", result);
        }
    }

    fn command_finished(
        &self,
        actuator: &str,
        origin: &Origin,
        result: &Result<Applied, ActError>,
    ) {
        let result = match result {
            Ok(_) => "applied",
            Err(e) => e.kind(),
        };
        super::metrics::actuator_command(actuator, origin.kind(), result);
    }

    fn feedback_verdict(&self, event: &VerdictEvent) {
        super::metrics::feedback_verdict(&event.actuator, event.verdict.status.as_str());
    }
}
