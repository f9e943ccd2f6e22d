//! Safety: the protective-stop latch.
//!
//! This is a *software protective stop*: it drives every actuator to its safe
//! value and refuses PHYSICAL commands until cleared. It is not an emergency
//! stop: a hardwired emergency stop that cuts power is still required for
//! category-0 stopping.
//!
//! Stop sources: `POST /v1/estop`, the `roz.v1.SafetyService` RPCs, the CLI
//! (through REST), reflex rules, the fleet, and the inputs of [`inputs`] (a
//! GPIO pin and an MQTT topic).
//!
//! The latch holds every active *cause* (one per source): a stop from a
//! second source while latched adds its cause, and a clear removes only what
//! it names ([`ProtectiveStop::clear`] with a [`ClearRequest`]). A fleet
//! clear removes the fleet's cause ([`ClearRequest::source`]); an operator
//! clear removes every cause but those an input still asserts
//! ([`ClearRequest::all`]). A source
//! that still *asserts* the stop (a pressed, latching stop button on the
//! GPIO input) [`ProtectiveStop::hold`]s its cause: it cannot be cleared
//! until the input is released.
//!
//! Every change is written to the stop file ([`persist`]) so that a restart,
//! a crash or a watchdog kill brings rozd back up latched.

pub mod inputs;
pub(crate) mod latch;
pub(crate) mod metrics;
pub(crate) mod persist;
mod source;
pub(crate) mod status;

use parking_lot::{Mutex, MutexGuard};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

use crate::observe::Observers;
use latch::Latch;
pub use latch::{ClearRequest, ClearScope, StopRequest};
pub use source::StopSource;

/// One cause of the protective stop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopInfo {
    /// Where the stop came from: `rest`, `grpc`, `cli`, `gpio`, `mqtt`,
    /// `fleet`, `rule:<name>`, `control-socket`, or `restore` (the stop file
    /// could not be read at start-up).
    pub source: String,
    pub reason: String,
    pub since_unix_ms: i64,
    /// Who asked, where it is known and authenticated (a fleet host id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

/// The latch's state: every active cause, oldest first. Empty = not latched.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StopState {
    pub causes: Vec<StopInfo>,
}

impl StopState {
    pub fn is_active(&self) -> bool {
        !self.causes.is_empty()
    }

    /// The oldest active cause.
    pub fn first(&self) -> Option<&StopInfo> {
        self.causes.first()
    }

    /// `source: reason` of every cause, joined for a message.
    pub fn describe(&self) -> String {
        self.causes
            .iter()
            .map(|c| format!("{}: {}", c.source, c.reason))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Why a clear was refused (in whole or in part).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stop input {input} still asserts the stop ({why}); release it before clearing{}", cleared_note(.cleared))]
pub struct ClearRefused {
    /// The input, e.g. `gpio:17`.
    pub input: String,
    pub why: String,
    /// Other causes this clear did remove.
    pub cleared: Vec<String>,
}

fn cleared_note(cleared: &[String]) -> String {
    if cleared.is_empty() {
        String::new()
    } else {
        format!(" (cleared: {})", cleared.join(", "))
    }
}

/// A change of the latch, for the audit.
#[derive(Debug, Clone, PartialEq)]
pub enum StopEvent {
    /// A cause was added; `credential`: the authenticated credential that
    /// asked, where one did.
    Triggered {
        source: String,
        reason: String,
        by: Option<String>,
        credential: Option<String>,
    },
    /// `by` removed the cause of `source`; `credential`: the authenticated
    /// credential that asked, where one did.
    Cleared {
        by: String,
        source: String,
        credential: Option<String>,
    },
    ClearRefused {
        by: String,
        input: String,
        credential: Option<String>,
    },
    /// The latch came back from the stop file at start-up with these causes.
    Restored { causes: Vec<StopInfo> },
    /// The request that added `source`'s cause gave its reason after it
    /// latched (the stop did not wait for the request's body).
    ReasonGiven {
        source: String,
        reason: String,
        credential: Option<String>,
    },
}

/// Told of every change of the latch as it happens, under the latch's
/// lock, with the causes after it (the audit, a recording, the metrics).
/// Must not block (see [`crate::observe`]).
pub trait StopObserver: Send + Sync + std::fmt::Debug {
    fn stop_changed(&self, event: &StopEvent, causes: &[StopInfo]);
}

/// The part of a stop source that names its kind, as the metrics' label:
/// `rule:<name>` is `rule`; the other sources are one word already.
pub fn source_kind(source: &str) -> &str {
    source.split_once(':').map_or(source, |(kind, _)| kind)
}

/// Sends each event down a channel, to a task of its own (the daemon's
/// audit writer). A closed channel means that task is gone: nothing is
/// left to record.
#[derive(Debug)]
pub struct StopEventChannel(pub mpsc::UnboundedSender<StopEvent>);

impl StopObserver for StopEventChannel {
    fn stop_changed(&self, event: &StopEvent, _causes: &[StopInfo]) {
        let _ = self.0.send(event.clone());
    }
}

/// Counts each cause added, by the kind of its source.
#[derive(Debug, Default)]
pub struct StopMetrics;

impl StopObserver for StopMetrics {
    fn stop_changed(&self, event: &StopEvent, _causes: &[StopInfo]) {
        if let StopEvent::Triggered { source, .. } = event {
            metrics::stop_triggered(source_kind(source));
        }
    }
}

/// The latch. Cheap to clone; all clones share one state.
#[derive(Debug, Clone)]
pub struct ProtectiveStop {
    /// Causes and held inputs, changed under this lock so that a clear and
    /// an input becoming active (or two triggers) cannot interleave.
    latch: Arc<Mutex<Latch>>,
    state: Arc<watch::Sender<StopState>>,
    /// Told of each change synchronously, in order.
    observers: Observers<dyn StopObserver>,
    /// Where each change is made durable (none in unit tests).
    file: Option<Arc<persist::StopFile>>,
}

impl Default for ProtectiveStop {
    fn default() -> Self {
        ProtectiveStop {
            latch: Arc::default(),
            state: Arc::new(watch::Sender::new(StopState::default())),
            observers: Observers::default(),
            file: None,
        }
    }
}

impl ProtectiveStop {
    /// A latch backed by the stop file at `file`: latched with the causes
    /// the file holds (a file that cannot be read latches with source
    /// `restore`, failing safe). `observers` hear of a restored stop first,
    /// then of every change.
    pub fn restore(
        file: persist::StopFile,
        observers: Observers<dyn StopObserver>,
    ) -> ProtectiveStop {
        let mut stop = ProtectiveStop {
            observers,
            ..ProtectiveStop::default()
        };
        let restore_cause = |reason: String| StopInfo {
            source: StopSource::Restore.to_string(),
            reason,
            since_unix_ms: crate::clock::now_ms(),
            by: None,
        };
        let mut causes = match file.load() {
            Ok(causes) => causes,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the protective-stop file; starting LATCHED");
                vec![restore_cause(format!(
                    "the stop file could not be read at start-up: {e}"
                ))]
            }
        };
        // Proves the file can be written (and repairs an unreadable one);
        // a stop that could not survive a restart is itself a reason to stop.
        if let Err(e) = file.write_now(&causes) {
            tracing::error!(error = %e, "cannot write the protective-stop file; starting LATCHED");
            if !causes.iter().any(|c| StopSource::Restore.is(&c.source)) {
                causes.push(restore_cause(format!(
                    "the stop file cannot be written: {e}"
                )));
            }
        }
        if !causes.is_empty() {
            tracing::warn!(
                causes = %StopState { causes: causes.clone() }.describe(),
                "PROTECTIVE STOP restored from before the restart; it stays latched until cleared"
            );
            *stop.lock() = Latch::with_causes(causes.clone());
            stop.state.send_replace(StopState {
                causes: causes.clone(),
            });
            stop.report(StopEvent::Restored { causes });
        }
        stop.file = Some(Arc::new(file));
        stop
    }

    fn report(&self, event: StopEvent) {
        // Published already (`changed` runs first): the causes after it.
        let state = self.state.borrow();
        for observer in self.observers.iter() {
            observer.stop_changed(&event, &state.causes);
        }
    }

    fn lock(&self) -> MutexGuard<'_, Latch> {
        self.latch.lock()
    }

    /// Publishes the causes and has them written to the stop file. Called
    /// with the lock held, so publications keep the order of the changes.
    fn changed(&self, latch: &Latch) {
        self.state.send_replace(StopState {
            causes: latch.causes().to_vec(),
        });
        if let Some(file) = &self.file {
            file.save(latch.generation(), latch.causes().to_vec());
        }
    }

    /// The oldest active cause, if latched.
    pub fn active(&self) -> Option<StopInfo> {
        self.state.borrow().first().cloned()
    }

    /// Every active cause, oldest first.
    pub fn state(&self) -> StopState {
        self.state.borrow().clone()
    }

    /// Latches the stop with the request's cause. `true` if the cause is
    /// new: the stop was not latched, or latched by other sources only. A
    /// source that already holds a cause keeps its first reason. Never
    /// waits (the tick thread calls it); the stop file is written behind it
    /// ([`ProtectiveStop::persisted`]).
    pub fn trigger(&self, request: StopRequest<'_>) -> bool {
        let (source, reason) = (request.source, request.reason);
        let mut latch = self.lock();
        let was_active = !latch.causes().is_empty();
        let Some(event) = latch.trigger(request, crate::clock::now_ms()) else {
            tracing::debug!(
                %source,
                reason,
                "protective stop already latched by this source"
            );
            return false;
        };
        self.changed(&latch);
        if was_active {
            tracing::warn!(%source, reason, "PROTECTIVE STOP: another cause");
        } else {
            tracing::warn!(%source, reason, "PROTECTIVE STOP");
        }
        self.report(event);
        true
    }

    /// `source`'s cause, latched already (by [`ProtectiveStop::trigger`]
    /// with a default reason, before the request's body arrived), takes the
    /// reason the body gave. `false` when `source` holds no cause (it was
    /// cleared meanwhile): a late reason never latches by itself.
    pub fn give_reason(&self, source: &StopSource, reason: &str, credential: Option<&str>) -> bool {
        let mut latch = self.lock();
        match latch.give_reason(source, reason, credential) {
            Err(()) => false,
            Ok(None) => true,
            Ok(Some(event)) => {
                self.changed(&latch);
                tracing::warn!(%source, reason, "PROTECTIVE STOP: its reason arrived");
                self.report(event);
                true
            }
        }
    }

    /// Clears what the request names (the operator's clear: every cause
    /// but those an input still asserts; a source's clear: only its cause)
    /// and returns once that is on disk (bounded by
    /// [`persist::DURABLE_WITHIN`]; a clear that could not be written still
    /// holds in memory, is logged, and a restart would latch again: the safe
    /// side). `Ok(false)` if there was nothing to clear; refused (with
    /// whatever else it did clear) while an input asserts a cause in scope.
    /// Moves nothing.
    pub async fn clear(&self, request: ClearRequest<'_>) -> Result<bool, ClearRefused> {
        let answer = self.clear_now(request);
        if !self.persisted().await {
            tracing::error!("the protective stop's clear could not be written to disk in time");
        }
        answer
    }

    /// [`ProtectiveStop::clear`] without waiting for the disk: applies the
    /// clear at once, publishes it, logs and reports each event in order,
    /// and has the stop file written behind it. For a loop that must not
    /// wait on the disk and must apply clears and stops in the order they
    /// came (the fleet connection); everyone else awaits
    /// [`ProtectiveStop::clear`].
    pub fn clear_now(&self, request: ClearRequest<'_>) -> Result<bool, ClearRefused> {
        let by = request.by;
        let credential = request.credential;
        let mut latch = self.lock();
        let generation = latch.generation();
        let cleared = latch.clear(request);
        if latch.generation() != generation {
            self.changed(&latch);
        }
        for event in cleared.events {
            match &event {
                StopEvent::Cleared { source, .. } => tracing::warn!(
                    by,
                    source = %source,
                    credential = ?credential,
                    still_latched = !latch.causes().is_empty(),
                    "protective stop cause cleared"
                ),
                StopEvent::ClearRefused { input, .. } => tracing::warn!(
                    by,
                    input = %input,
                    "protective stop NOT cleared: an input still asserts it"
                ),
                _ => {}
            }
            self.report(event);
        }
        if cleared.answer == Ok(true) && latch.causes().is_empty() {
            tracing::warn!(by, "protective stop cleared");
        }
        cleared.answer
    }

    /// Marks `input` as asserting `source`'s stop (it does not latch by
    /// itself: latch with [`ProtectiveStop::trigger`] or `Ooda::trigger_stop`
    /// too). While held, that cause cannot be cleared.
    pub fn hold(&self, input: &str, source: &StopSource, why: &str) {
        self.lock().hold(input, source, why);
    }

    /// `input` no longer asserts the stop. The latch stays until cleared.
    pub fn release(&self, input: &str) {
        self.lock().release(input);
    }

    /// Inputs that assert the stop now, by name.
    pub fn held_inputs(&self) -> Vec<String> {
        self.lock().held_inputs()
    }

    pub fn subscribe(&self) -> watch::Receiver<StopState> {
        self.state.subscribe()
    }

    /// Waits (bounded by [`persist::DURABLE_WITHIN`]) until the latch as it is
    /// now is on disk. `true` once it is, or when there is no stop file.
    pub async fn persisted(&self) -> bool {
        let Some(file) = &self.file else {
            return true;
        };
        let generation = self.lock().generation();
        file.durable(generation).await
    }

    /// Whether the stop file could not be written (the last attempt failed).
    pub fn persist_failed(&self) -> bool {
        self.file.as_deref().is_some_and(persist::StopFile::failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_is_counted_by_its_kind() {
        assert_eq!(source_kind("rule:too_close"), "rule");
        assert_eq!(source_kind("rest"), "rest");
        assert_eq!(source_kind("control-socket"), "control-socket");
    }

    /// The source a cause's text names (the ones these tests use).
    fn source(text: &str) -> StopSource {
        match text.split_once(':') {
            Some(("rule", name)) => StopSource::Rule(name.into()),
            _ => match text {
                "fleet" => StopSource::Fleet,
                "gpio" => StopSource::Gpio,
                _ => StopSource::Rest,
            },
        }
    }

    fn stop(text: &'static str, reason: &'static str) -> StopRequest<'static> {
        // Leaked: a few bytes per test, for a request of 'static lifetime.
        StopRequest::new(Box::leak(Box::new(source(text))), reason)
    }

    #[tokio::test]
    async fn a_source_keeps_its_first_cause_until_cleared() {
        let stop = ProtectiveStop::default();
        assert!(stop.active().is_none());
        assert!(stop.trigger(self::stop("rest", "operator")));
        assert!(
            !stop.trigger(self::stop("rest", "later")),
            "same source: no new cause"
        );
        assert_eq!(stop.active().unwrap().reason, "operator");
        assert_eq!(
            stop.clone().clear(ClearRequest::all("operator")).await,
            Ok(true)
        );
        assert_eq!(stop.clear(ClearRequest::all("operator")).await, Ok(false));
        assert!(stop.active().is_none());
    }

    #[tokio::test]
    async fn every_source_adds_a_cause_and_a_source_clear_removes_only_its_own() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let stop = ProtectiveStop {
            observers: Observers::new(vec![Arc::new(StopEventChannel(tx))]),
            ..ProtectiveStop::default()
        };
        assert!(stop.trigger(self::stop("fleet", "drill").by(Some("host-a"))));
        assert!(stop.trigger(self::stop("rest", "person in cell")));
        assert!(stop.trigger(self::stop("rule:too_close", "front_distance < 0.2")));
        let sources: Vec<_> = stop
            .state()
            .causes
            .iter()
            .map(|c| c.source.clone())
            .collect();
        assert_eq!(sources, ["fleet", "rest", "rule:too_close"]);
        assert_eq!(stop.state().causes[0].by.as_deref(), Some("host-a"));

        let fleet_clear = |by| ClearRequest::source(&StopSource::Fleet, by);
        assert_eq!(stop.clear(fleet_clear("fleet: withdrawn")).await, Ok(true));
        assert_eq!(stop.clear(fleet_clear("fleet: again")).await, Ok(false));
        assert_eq!(stop.active().unwrap().source, "rest", "still latched");

        assert_eq!(stop.clear(ClearRequest::all("operator")).await, Ok(true));
        assert!(!stop.state().is_active());

        let mut events = Vec::new();
        while let Ok(e) = rx.try_recv() {
            events.push(e);
        }
        assert_eq!(events.len(), 6, "{events:?}");
        assert_eq!(
            events[1],
            StopEvent::Triggered {
                source: "rest".into(),
                reason: "person in cell".into(),
                by: None,
                credential: None,
            }
        );
        assert_eq!(
            events[3],
            StopEvent::Cleared {
                credential: None,
                by: "fleet: withdrawn".into(),
                source: "fleet".into()
            }
        );
    }

    #[tokio::test]
    async fn a_held_input_keeps_its_cause_and_blocks_only_that() {
        let stop = ProtectiveStop::default();
        stop.hold("gpio:17", &StopSource::Gpio, "GPIO 17 is low");
        assert!(stop.trigger(self::stop("gpio", "button")));
        assert!(stop.trigger(self::stop("rest", "operator")));
        let refused = stop.clear(ClearRequest::all("operator")).await.unwrap_err();
        assert_eq!(refused.input, "gpio:17");
        assert_eq!(refused.cleared, ["rest"]);
        assert!(stop.clear(ClearRequest::all("operator")).await.is_err());
        assert_eq!(stop.active().unwrap().source, "gpio", "still latched");
        assert!(
            stop.clear(ClearRequest::source(&StopSource::Gpio, "fleet"))
                .await
                .is_err()
        );
        assert_eq!(stop.held_inputs(), ["gpio:17"]);
        stop.release("gpio:17");
        assert!(
            stop.active().is_some(),
            "releasing the input does not clear"
        );
        assert_eq!(stop.clear(ClearRequest::all("operator")).await, Ok(true));
        assert_eq!(stop.clear(ClearRequest::all("operator")).await, Ok(false));
    }

    #[test]
    fn subscribers_see_every_added_cause() {
        let stop = ProtectiveStop::default();
        let mut rx = stop.subscribe();
        stop.trigger(self::stop("fleet", "drill"));
        assert!(rx.has_changed().unwrap());
        assert_eq!(rx.borrow_and_update().causes.len(), 1);
        stop.trigger(self::stop("rest", "person"));
        assert!(rx.has_changed().unwrap(), "a second cause is a change");
        assert_eq!(rx.borrow_and_update().causes.len(), 2);
    }
}
