//! The observers of the cores' events, composed once (DESIGN.md, "Events
//! out, observers in"): the audit writer, the recording, the live view
//! (Foxglove) and the metrics.
//! Each core is built with its list ([`Composed`]); nothing is attached
//! afterwards.
//!
//! The audit rows are written by a task of their own, fed by a channel
//! whose sending end is the observer: the channels exist before any core
//! does, and the writer starts once the store is open, so nothing that
//! happens in between (a stop restored at start-up, the start-up safe
//! drive) is lost.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::observe::Observers;
use crate::ooda::LoopObservers;
use crate::ooda::act::{ActuatorEvent, ActuatorObserver, VerdictEvent};
use crate::ooda::feedback::FeedbackStatus;
use crate::ooda::metered::ActuatorMetrics;
use crate::record::Recorder;
use crate::safety::{StopEvent, StopEventChannel, StopMetrics, StopObserver};
use crate::store::{AuditKind, AuditRecord, Store, StoreObserver};

/// Every core's observers.
pub(super) struct Composed {
    pub store: Observers<dyn StoreObserver>,
    pub stop: Observers<dyn StopObserver>,
    pub ooda: LoopObservers,
    /// Frames of the cameras: the recording.
    pub cameras: Observers<dyn crate::camera::CameraObserver>,
}

/// The receiving ends of the audit channels, until the store is open.
pub(super) struct AuditWriter {
    actuators: mpsc::UnboundedReceiver<Audited>,
    stops: mpsc::UnboundedReceiver<StopEvent>,
}

/// What the actuators' audit writes: a change of value, or a verdict of
/// its feedback.
enum Audited {
    Changed(ActuatorEvent),
    Verdict(Box<VerdictEvent>),
}

/// Sends each actuator change and feedback verdict to the audit writer.
#[derive(Debug)]
struct ActuatorAudit(mpsc::UnboundedSender<Audited>);

impl ActuatorObserver for ActuatorAudit {
    fn actuator_changed(&self, event: &ActuatorEvent) {
        // A closed channel: the writer is gone with the daemon.
        let _ = self.0.send(Audited::Changed(event.clone()));
    }

    fn feedback_verdict(&self, event: &VerdictEvent) {
        let _ = self.0.send(Audited::Verdict(Box::new(event.clone())));
    }
}

/// The observers of every core, and the audit writer to start once the
/// store is open. The recording (disabled without `[record]`) hears
/// everything; the audit, actuator changes and stop changes; the metrics,
/// actuator commands and stop triggers.
pub(super) fn compose(
    recorder: &Arc<Recorder>,
    live: &Arc<crate::live::Hub>,
) -> (Composed, AuditWriter) {
    let (actuator_tx, actuators) = mpsc::unbounded_channel();
    let (stop_tx, stops) = mpsc::unbounded_channel();
    let recording = recorder.enabled().then(|| recorder.clone());
    let mut store: Vec<Arc<dyn StoreObserver>> = Vec::new();
    let mut stop: Vec<Arc<dyn StopObserver>> = Vec::new();
    let mut sensors: Vec<Arc<dyn crate::ooda::world::SensorObserver>> = Vec::new();
    let mut actuators_observers: Vec<Arc<dyn ActuatorObserver>> = Vec::new();
    let mut cameras: Vec<Arc<dyn crate::camera::CameraObserver>> = Vec::new();
    if let Some(recording) = recording {
        cameras.push(recording.clone());
        store.push(recording.clone());
        stop.push(recording.clone());
        sensors.push(recording.clone());
        actuators_observers.push(recording);
    }
    // The live view: each call returns at once unless a client subscribes.
    if live.config().enabled {
        cameras.push(live.clone());
        store.push(live.clone());
        stop.push(live.clone());
        sensors.push(live.clone());
        actuators_observers.push(live.clone());
    }
    stop.push(Arc::new(StopEventChannel(stop_tx)));
    stop.push(Arc::new(StopMetrics));
    actuators_observers.push(Arc::new(ActuatorAudit(actuator_tx)));
    actuators_observers.push(Arc::new(ActuatorMetrics));
    let composed = Composed {
        store: store.into(),
        stop: stop.into(),
        ooda: LoopObservers {
            sensors: sensors.into(),
            actuators: actuators_observers.into(),
        },
        cameras: cameras.into(),
    };
    (composed, AuditWriter { actuators, stops })
}

impl AuditWriter {
    /// Writes what the channels bring (and what they queued meanwhile) to
    /// the store's audit, each kind in order, until the senders are gone.
    pub(super) fn start(self, store: &Store) {
        tokio::spawn(write_actuator_changes(store.clone(), self.actuators));
        tokio::spawn(write_stop_changes(store.clone(), self.stops));
    }
}

/// Every actuator change as an audit row of kind `actuator`: `result` the
/// value, `origin` who (`session <id>`, `rule <name>`, `operator <who>`,
/// `safety (<why>)`), `error` when the device did not confirm a safe drive;
/// every feedback verdict as one of kind `feedback` (see [`verdict_record`]).
async fn write_actuator_changes(store: Store, mut changes: mpsc::UnboundedReceiver<Audited>) {
    while let Some(audited) = changes.recv().await {
        let now = crate::clock::now_ms();
        let event = match audited {
            Audited::Changed(event) => event,
            Audited::Verdict(verdict) => {
                if let Err(e) = store.audit(verdict_record(&verdict, now)).await {
                    tracing::error!(error = %e, "cannot write the audit record of a feedback verdict");
                }
                continue;
            }
        };
        let record = AuditRecord {
            at_ms: now,
            kind: AuditKind::Actuator,
            session_id: event.session_id,
            actuator: Some(event.actuator),
            result: Some(event.value.to_string()),
            error: event.error,
            origin: Some(event.origin.to_string()),
            ended_at_ms: Some(now),
            ..Default::default()
        };
        if let Err(e) = store.audit(record).await {
            tracing::error!(error = %e, "cannot write the audit record of an actuator change");
        }
    }
}

/// A feedback verdict as an audit row of kind `feedback`: `result` the
/// status (`confirmed`, `unconfirmed`, `mismatch`), `parameters` what was
/// compared (`commanded`, `expected`, `measured`, `tolerance`, `settled_ms`,
/// `stage`, `reason`, `alarm`, `on_mismatch` action, `cross_check`: the
/// cross-check sensor's rate against the expected one), `origin` who commanded
/// the value judged, `error` what a mismatch means.
fn verdict_record(event: &VerdictEvent, now: i64) -> AuditRecord {
    let v = &event.verdict;
    let action = event.action.map(|a| match a {
        crate::ooda::feedback::MismatchAction::DriveSafe => "safe",
        crate::ooda::feedback::MismatchAction::LatchStop => "stop",
    });
    let error = (v.status == FeedbackStatus::Mismatch).then(|| {
        let measured = v
            .measured
            .map_or_else(|| "nothing".to_string(), |m| m.to_string());
        format!(
            "measured {measured} where {} ± {} was expected: {}",
            v.expected, v.tolerance, v.reason
        )
    });
    AuditRecord {
        at_ms: now,
        kind: AuditKind::Feedback,
        session_id: event.session_id.clone(),
        actuator: Some(event.actuator.clone()),
        parameters: Some(serde_json::json!({
            "commanded": v.commanded,
            "expected": v.expected,
            "measured": v.measured,
            "tolerance": v.tolerance,
            "settled_ms": v.settled_ms,
            "stage": v.stage,
            "reason": v.reason,
            "alarm": event.alarm,
            "action": action,
            "cross_check": v.cross_check,
        })),
        result: Some(v.status.as_str().to_string()),
        error,
        origin: Some(event.origin.to_string()),
        ended_at_ms: Some(now),
        ..Default::default()
    }
}

/// Every trigger, clear and refused clear of the protective stop, as audit
/// rows of kind `protective_stop` (one per added cause),
/// `protective_stop_cleared` (one per removed cause),
/// `protective_stop_clear_refused`, `protective_stop_restored` (latched
/// again at start-up) and `protective_stop_reason` (the reason of a stop
/// that latched before its request's body arrived); `origin`: the source,
/// or who cleared; `credential`:
/// the credential that asked (for a fleet stop over MQTT, the host that
/// signed it).
async fn write_stop_changes(store: Store, mut changes: mpsc::UnboundedReceiver<StopEvent>) {
    while let Some(event) = changes.recv().await {
        let now = crate::clock::now_ms();
        let (kind, origin, result, error, credential) = match event {
            StopEvent::Triggered {
                source,
                reason,
                by,
                credential,
            } => {
                let origin = match &by {
                    Some(by) => format!("{source} ({by})"),
                    None => source,
                };
                // A fleet stop over MQTT has no credential: its signer.
                (
                    AuditKind::ProtectiveStop,
                    origin,
                    Some(reason),
                    None,
                    credential.or(by),
                )
            }
            StopEvent::Cleared {
                by,
                source,
                credential,
            } => (
                AuditKind::ProtectiveStopCleared,
                by,
                Some(format!("cleared cause {source}")),
                None,
                credential,
            ),
            StopEvent::Restored { causes } => (
                AuditKind::ProtectiveStopRestored,
                "start-up".to_string(),
                Some(format!(
                    "latched at start-up as before the restart: {}",
                    crate::safety::StopState { causes }.describe()
                )),
                None,
                None,
            ),
            StopEvent::ReasonGiven {
                source,
                reason,
                credential,
            } => (
                AuditKind::ProtectiveStopReason,
                source,
                Some(reason),
                None,
                credential,
            ),
            StopEvent::ClearRefused {
                by,
                input,
                credential,
            } => (
                AuditKind::ProtectiveStopClearRefused,
                by,
                None,
                Some(format!("stop input {input} still asserts the stop")),
                credential,
            ),
        };
        let record = crate::store::AuditRecord {
            at_ms: now,
            kind,
            result,
            error,
            origin: Some(origin),
            credential,
            ended_at_ms: Some(now),
            ..Default::default()
        };
        if let Err(e) = store.audit(record).await {
            tracing::error!(error = %e, "cannot write the audit record of a protective stop change");
        }
    }
}
