//! Act: the one path every actuator command takes.
//!
//! admit (the pure rules of [`super::admission`]: stop, finite, within
//! limits, rate, owner) -> apply through the driver under the actuator's
//! deadline -> record -> set the hold's deadline, which one expiry task
//! drives safe. A refused command is never clamped. Any failure or expiry
//! drives the safe value.
//!
//! Each actuator has a driver lock: one command or safe drive at a time,
//! and every change of its state happens under it, so what the audit hears
//! is in the order the device saw it.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::admission::{Admission, HoldDeadlines, Refusal};
use super::feedback::{FeedbackStatus, MismatchAction, Sample, Started, Verdict, Watch};
use crate::hw::config::{ActuatorSpec, FeedbackSpec};
use crate::hw::{ActuatorDriver, HwError};
use crate::observe::Observers;
use crate::safety::ProtectiveStop;
use crate::safety::{StopRequest, StopSource};

/// Who asked for a command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "id", rename_all = "snake_case")]
pub enum Origin {
    Session(String),
    Rule(String),
    Operator(String),
    /// rozd itself: start-up, shutdown, hold expiry, protective stop, deadman.
    Safety(String),
}

impl Origin {
    /// `session`, `rule`, `operator` or `safety`: the metrics' label.
    pub fn kind(&self) -> &'static str {
        match self {
            Origin::Session(_) => "session",
            Origin::Rule(_) => "rule",
            Origin::Operator(_) => "operator",
            Origin::Safety(_) => "safety",
        }
    }

    /// The session that asked, if one did.
    pub fn session(&self) -> Option<&str> {
        match self {
            Origin::Session(id) => Some(id),
            _ => None,
        }
    }
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Session(id) => write!(f, "session {id}"),
            Origin::Rule(name) => write!(f, "rule {name}"),
            Origin::Operator(who) => write!(f, "operator {who}"),
            Origin::Safety(why) => write!(f, "safety ({why})"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ActError {
    #[error("unknown actuator `{0}`")]
    Unknown(String),
    #[error("{actuator}: {reason}")]
    SafetyViolation { actuator: String, reason: String },
    #[error("{actuator}: protective stop is active ({reason}); PHYSICAL commands are refused")]
    EStop { actuator: String, reason: String },
    #[error("{actuator} is held by {holder}; sharing is not enabled for it")]
    Held { actuator: String, holder: String },
    #[error(
        "{actuator}: the driver did not finish within {timeout_ms} ms; the actuator was sent to its safe value"
    )]
    Timeout { actuator: String, timeout_ms: u64 },
    #[error("{actuator}: {error}; the actuator was sent to its safe value")]
    Driver { actuator: String, error: HwError },
    /// The caller went away (a cancelled turn) before the command reached
    /// the driver; nothing was applied.
    #[error("{actuator}: the command was abandoned before it was applied")]
    Abandoned { actuator: String },
    /// The daemon is shutting down; every actuator has been driven safe.
    #[error("{actuator}: rozd is shutting down; commands are refused")]
    Closed { actuator: String },
}

impl ActError {
    /// Why a command was not applied, as the metrics' `result` label.
    pub fn kind(&self) -> &'static str {
        match self {
            ActError::Unknown(_) => "unknown",
            ActError::SafetyViolation { .. } => "safety_violation",
            ActError::EStop { .. } => "e_stop",
            ActError::Held { .. } => "held",
            ActError::Timeout { .. } => "timeout",
            ActError::Driver { .. } => "driver_error",
            ActError::Abandoned { .. } => "abandoned",
            ActError::Closed { .. } => "closed",
        }
    }
}

struct Entry {
    /// Its place in [`Actuators::entries`] (and in the hold deadlines).
    index: usize,
    spec: ActuatorSpec,
    driver: Arc<dyn ActuatorDriver>,
    state: Mutex<Admission>,
    /// Whether `state`'s value is the safe value, kept beside it (set
    /// under its lock) for the feedback step, which runs every tick and
    /// needs nothing else of it.
    at_safe: std::sync::atomic::AtomicBool,
    /// Serialises driver access: one command at a time per actuator.
    io: tokio::sync::Mutex<()>,
    /// The watch over its feedback sensor, if it has one.
    feedback: Option<Feedback>,
}

impl Entry {
    /// Mirrors `state`'s at-safe-value (called with its lock held).
    fn set_at_safe(&self, state: &Admission) {
        self.at_safe.store(
            state.at_safe_value(&self.spec),
            std::sync::atomic::Ordering::Release,
        );
    }
}

/// An actuator's feedback: its watch, and who commanded what it watches.
struct Feedback {
    spec: FeedbackSpec,
    watched: Mutex<Watched>,
    /// Counts the verdicts: wakes the callers waiting for theirs.
    verdicts: tokio::sync::watch::Sender<u64>,
}

struct Watched {
    watch: Watch,
    /// Who commanded the value watched now.
    origin: Origin,
}

/// One actuator as shown in an Observation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ActuatorView {
    pub name: String,
    pub unit: Option<String>,
    pub value: f64,
    pub safe_value: f64,
    /// At its safe value as far as the device confirmed: false when the
    /// last drive to it failed (see `safe_unconfirmed`).
    pub at_safe_value: bool,
    /// Why the device did not confirm the last drive to the safe value
    /// (e.g. `no reply within 200 ms`); absent when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub safe_unconfirmed: Option<String>,
    pub owner: Option<String>,
    pub since_ms: u64,
    pub hold_remaining_ms: Option<u64>,
    /// Commanded versus measured, for an actuator with feedback.
    #[serde(flatten)]
    pub feedback: Option<ActuatorFeedback>,
}

/// What an Observation shows of an actuator's feedback.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ActuatorFeedback {
    /// The sensor that measures it.
    pub feedback_sensor: String,
    /// `settling`, `confirmed`, `unconfirmed` or `mismatch`; `null` before
    /// the first command.
    pub feedback_status: Option<FeedbackStatus>,
    /// The sensor's latest value.
    pub measured: Option<f64>,
    /// What the sensor should read for the current value.
    pub expected: Option<f64>,
    /// The mismatch alarm (`<actuator>.mismatch` in rules).
    pub mismatch: bool,
}

/// What a successful command did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Applied {
    pub actuator: String,
    pub value: f64,
    pub previous: f64,
    pub hold_ms: Option<u64>,
    /// What its feedback watch started (see [`Actuators::verdict`]); `None`
    /// without feedback.
    #[serde(skip)]
    pub watch: Option<Started>,
}

/// One change of an actuator's value: a command applied, or a drive to
/// the safe value (origin [`Origin::Safety`], with `error` when the device
/// did not confirm it).
#[derive(Debug, Clone, PartialEq)]
pub struct ActuatorEvent {
    pub actuator: String,
    pub value: f64,
    pub origin: Origin,
    /// The session that owned it (for a safe drive: the one that had
    /// commanded the value it replaced), for filtering.
    pub session_id: Option<String>,
    pub error: Option<String>,
}

/// What the loop finishes for `on_mismatch`: drive `actuator` safe, or
/// drive everything safe under the stop (already latched) with `source`
/// and `reason`.
#[derive(Debug, Clone, PartialEq)]
pub struct MismatchResponse {
    pub actuator: String,
    pub action: MismatchAction,
    pub source: StopSource,
    pub reason: String,
}

/// A verdict on what an actuator did (see [`super::feedback`]).
#[derive(Debug, Clone, PartialEq)]
pub struct VerdictEvent {
    pub actuator: String,
    /// Who commanded the value judged.
    pub origin: Origin,
    pub session_id: Option<String>,
    pub verdict: Verdict,
    /// Whether the actuator's mismatch alarm is raised after it.
    pub alarm: bool,
    /// What `on_mismatch` does about it, if anything.
    pub action: Option<MismatchAction>,
}

/// Told of what the actuators do, as it happens, in order (the audit, a
/// recording, the metrics). Must not block (see [`crate::observe`]).
pub trait ActuatorObserver: Send + Sync + std::fmt::Debug {
    /// Every change of a value, under the actuator's driver lock.
    fn actuator_changed(&self, _event: &ActuatorEvent) {}
    /// The outcome of every command: applied, or why not.
    fn command_finished(
        &self,
        _actuator: &str,
        _origin: &Origin,
        _result: &Result<Applied, ActError>,
    ) {
    }
    /// Every verdict of a feedback watch, in order per actuator.
    fn feedback_verdict(&self, _event: &VerdictEvent) {}
}

pub struct Actuators {
    entries: Vec<Entry>,
    index: HashMap<String, usize>,
    protective_stop: ProtectiveStop,
    observers: Observers<dyn ActuatorObserver>,
    /// Set by [`Actuators::close`] at shutdown: no command after the last safe drive.
    closed: std::sync::atomic::AtomicBool,
    /// When each held value goes back to safe (see [`expire_holds`]).
    holds: Mutex<HoldDeadlines>,
    /// Wakes the expiry task: a deadline came earlier, or we are gone.
    holds_changed: Arc<tokio::sync::Notify>,
}

impl Drop for Actuators {
    fn drop(&mut self) {
        // The expiry task holds only a weak reference: let it see we are gone.
        self.holds_changed.notify_one();
    }
}

impl std::fmt::Debug for Actuators {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Actuators")
            .field("names", &self.index.keys().collect::<Vec<_>>())
            .finish()
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Actuators {
    /// Starts the hold expiry task, so it must be called within a tokio
    /// runtime. `observers` hear every change and command from the first.
    pub fn new(
        actuators: Vec<(ActuatorSpec, Arc<dyn ActuatorDriver>)>,
        protective_stop: ProtectiveStop,
        observers: Observers<dyn ActuatorObserver>,
    ) -> Arc<Actuators> {
        let now = Instant::now();
        let index = actuators
            .iter()
            .enumerate()
            .map(|(i, (s, _))| (s.name.clone(), i))
            .collect();
        let entries = actuators
            .into_iter()
            .enumerate()
            .map(|(index, (spec, driver))| Entry {
                index,
                state: Mutex::new(Admission::new(spec.safe_value, now)),
                at_safe: std::sync::atomic::AtomicBool::new(true),
                feedback: spec.feedback.clone().map(|spec| Feedback {
                    spec,
                    watched: Mutex::new(Watched {
                        watch: Watch::new(now),
                        origin: Origin::Safety("start-up".into()),
                    }),
                    verdicts: tokio::sync::watch::Sender::new(0),
                }),
                spec,
                driver,
                io: tokio::sync::Mutex::new(()),
            })
            .collect();
        let holds_changed = Arc::new(tokio::sync::Notify::new());
        let actuators = Arc::new(Actuators {
            entries,
            index,
            protective_stop,
            observers,
            closed: std::sync::atomic::AtomicBool::new(false),
            holds: Mutex::new(HoldDeadlines::default()),
            holds_changed: holds_changed.clone(),
        });
        tokio::spawn(expire_holds(Arc::downgrade(&actuators), holds_changed));
        actuators
    }

    fn report(
        &self,
        actuator: &str,
        value: f64,
        origin: Origin,
        session_id: Option<String>,
        error: Option<String>,
    ) {
        let event = ActuatorEvent {
            actuator: actuator.to_string(),
            value,
            origin,
            session_id,
            error,
        };
        for observer in self.observers.iter() {
            observer.actuator_changed(&event);
        }
    }

    fn entry(&self, name: &str) -> Result<&Entry, ActError> {
        self.index
            .get(name)
            .map(|&i| &self.entries[i])
            .ok_or_else(|| ActError::Unknown(name.to_string()))
    }

    pub fn specs(&self) -> impl Iterator<Item = &ActuatorSpec> {
        self.entries.iter().map(|e| &e.spec)
    }

    pub fn spec(&self, name: &str) -> Option<&ActuatorSpec> {
        self.entry(name).ok().map(|e| &e.spec)
    }

    /// The current value of an actuator.
    pub fn value(&self, name: &str) -> Option<f64> {
        self.entry(name).ok().map(|e| e.state.lock().value())
    }

    /// Commands `value` on behalf of `origin`. `hold` shortens (never
    /// extends) the actuator's configured `hold_ms` for this command.
    ///
    /// Cancellation-safe: the command runs as its own task. If the caller
    /// goes away before the driver is reached, nothing is applied; once the
    /// driver has the value, the command finishes and records its owner, so
    /// a deadman [`Actuators::release`] (which waits for the driver) drives
    /// it safe. A dropped caller can never leave a value applied but unowned.
    pub async fn command(
        self: &Arc<Self>,
        name: &str,
        value: f64,
        origin: Origin,
        hold: Option<Duration>,
    ) -> Result<Applied, ActError> {
        let asked_by = origin.clone();
        let caller = CancellationToken::new();
        let _caller_present = caller.clone().drop_guard();
        let me = self.clone();
        let actuator = name.to_string();
        let task = tokio::spawn(async move {
            me.command_task(&actuator, value, origin, hold, caller)
                .await
        });
        let result = match task.await {
            Ok(result) => result,
            // A panic in a driver: the actuator's state is unknown; go safe.
            Err(e) => {
                tracing::error!(actuator = name, error = %e, "command task failed; driving the safe value");
                if let Ok(entry) = self.entry(name) {
                    self.drive_safe(entry, "command task failed").await;
                }
                Err(ActError::Driver {
                    actuator: name.to_string(),
                    error: HwError::io("the command failed inside rozd", e),
                })
            }
        };
        for observer in self.observers.iter() {
            observer.command_finished(name, &asked_by, &result);
        }
        result
    }

    async fn command_task(
        self: &Arc<Self>,
        name: &str,
        value: f64,
        origin: Origin,
        hold: Option<Duration>,
        caller: CancellationToken,
    ) -> Result<Applied, ActError> {
        let entry = self.entry(name)?;
        // A refusal need not wait for the driver; the same checks are made
        // again, authoritatively, under its lock.
        self.admit(entry, value, &origin, Instant::now())?;
        let _io = entry.io.lock().await;
        // A caller that left while this command waited applies nothing; nor
        // does one that a stop or a shutdown overtook meanwhile (the stop
        // has driven the actuator safe, and it must stay there).
        if caller.is_cancelled() {
            return Err(ActError::Abandoned {
                actuator: name.to_string(),
            });
        }
        let now = Instant::now();
        self.admit(entry, value, &origin, now)?;
        if let Err(failure) = apply_within_deadline(entry, value).await {
            tracing::warn!(actuator = name, %origin, error = %failure, "command failed; driving the safe value");
            self.drive_safe_locked(entry, &format!("command failed: {failure}"))
                .await;
            return Err(failure);
        }
        let change = {
            let mut state = entry.state.lock();
            let change = state.applied(&entry.spec, value, &origin, hold, now);
            entry.set_at_safe(&state);
            change
        };
        self.set_hold_deadline(entry.index, change.hold_until);
        let previous = change.previous;
        tracing::info!(actuator = name, value, previous, %origin, "actuator commanded");
        let session = origin.session().map(str::to_string);
        let watch = self.watch_command(entry, value, &origin, now);
        self.report(name, value, origin, session, None);
        Ok(Applied {
            actuator: name.to_string(),
            value,
            previous,
            hold_ms: change.hold.map(ms),
            watch,
        })
    }

    /// The admission rules for `origin` commanding `value` now, as the
    /// command's error.
    fn admit(
        &self,
        entry: &Entry,
        value: f64,
        origin: &Origin,
        now: Instant,
    ) -> Result<(), ActError> {
        let actuator = || entry.spec.name.clone();
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(ActError::Closed {
                actuator: actuator(),
            });
        }
        let stop = self.protective_stop.active().map(|s| s.reason);
        let refusal =
            match entry
                .state
                .lock()
                .admit(&entry.spec, value, origin, stop.as_deref(), now)
            {
                Ok(()) => return Ok(()),
                Err(refusal) => refusal,
            };
        let violation = |reason: String| ActError::SafetyViolation {
            actuator: actuator(),
            reason,
        };
        Err(match refusal {
            Refusal::Stopped(reason) => ActError::EStop {
                actuator: actuator(),
                reason,
            },
            Refusal::NotFinite(v) => violation(format!("{v} is not a finite number")),
            Refusal::OutOfRange { value, allowed } => {
                violation(format!("{value} is outside the allowed values {allowed}"))
            }
            Refusal::RateLimited { max_rate_hz } => {
                violation(format!("rate limit of {max_rate_hz} commands/s exceeded"))
            }
            Refusal::Held(holder) => ActError::Held {
                actuator: actuator(),
                holder: holder.to_string(),
            },
        })
    }

    /// Sets (or clears) when actuator `index` goes back to safe, waking the
    /// expiry task if it now has to wake earlier.
    fn set_hold_deadline(&self, index: usize, deadline: Option<Instant>) {
        if self.holds.lock().set(index, deadline) {
            self.holds_changed.notify_one();
        }
    }

    /// Drives safe every actuator whose hold has run out by `now`.
    async fn expire_due(&self, now: Instant) {
        let due = self.holds.lock().take_due(now);
        futures_util::future::join_all(due.into_iter().map(|i| async move {
            let entry = &self.entries[i];
            let _io = entry.io.lock().await;
            // Under the driver lock: a command that came meanwhile has
            // renewed or ended the hold, and stands.
            if entry.state.lock().hold_expired(Instant::now()) {
                self.drive_safe_locked(entry, "hold_ms expired").await;
            }
        }))
        .await;
    }

    /// Drives one actuator to its safe value. Never refused: no protective stop, rate
    /// or ownership check applies to going safe.
    async fn drive_safe(&self, entry: &Entry, reason: &str) {
        let _io = entry.io.lock().await;
        self.drive_safe_locked(entry, reason).await;
    }

    /// [`Actuators::drive_safe`] with the driver lock already held.
    async fn drive_safe_locked(&self, entry: &Entry, reason: &str) {
        let safe = entry.spec.safe_value;
        let result = tokio::time::timeout(entry.spec.timeout, entry.driver.apply(safe)).await;
        let error = match &result {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some("timed out".to_string()),
        };
        // The value rozd wants is safe, whether or not the device confirmed
        // it; the views say when it did not.
        let now = Instant::now();
        let previous_owner = {
            let mut state = entry.state.lock();
            let owner = state.went_safe(&entry.spec, error.clone(), now);
            entry.set_at_safe(&state);
            owner
        };
        self.set_hold_deadline(entry.index, None);
        // Whether it really went safe is for its feedback to say.
        self.watch_command(entry, safe, &Origin::Safety(reason.to_string()), now);
        let session = match previous_owner {
            Some(Origin::Session(id)) => Some(id),
            _ => None,
        };
        self.report(
            &entry.spec.name,
            safe,
            Origin::Safety(reason.to_string()),
            session,
            error,
        );
        match result {
            Ok(Ok(())) => {
                tracing::info!(actuator = %entry.spec.name, safe, reason, "actuator at safe value")
            }
            // The value we *want* is safe; the device did not confirm it.
            // Log loudly: this is what a hardwired stop exists for.
            Ok(Err(e)) => {
                tracing::error!(actuator = %entry.spec.name, error = %e, reason, "driving the safe value failed")
            }
            Err(_) => {
                tracing::error!(actuator = %entry.spec.name, reason, "driving the safe value timed out")
            }
        }
    }

    pub async fn safe(&self, name: &str, reason: &str) -> Result<(), ActError> {
        let entry = self.entry(name)?;
        self.drive_safe(entry, reason).await;
        Ok(())
    }

    /// Every actuator to its safe value, concurrently.
    pub async fn safe_all(&self, reason: &str) {
        futures_util::future::join_all(self.entries.iter().map(|e| self.drive_safe(e, reason)))
            .await;
    }

    /// Shutdown: from now on every command is refused, then every actuator
    /// goes to its safe value (a command already at its driver finishes first).
    pub async fn close(&self, reason: &str) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        self.safe_all(reason).await;
    }

    /// Deadman: every actuator whose current value was commanded by `origin`
    /// goes to its safe value. Each actuator's driver lock is taken before
    /// its owner is read, so a command of `origin` still at its driver is
    /// waited for and then undone.
    pub async fn release(&self, origin: &Origin, reason: &str) -> Vec<String> {
        let released = futures_util::future::join_all(self.entries.iter().map(|e| async move {
            let _io = e.io.lock().await;
            let owned = e.state.lock().owner() == Some(origin);
            if owned {
                self.drive_safe_locked(e, reason).await;
            }
            owned.then(|| e.spec.name.clone())
        }))
        .await;
        released.into_iter().flatten().collect()
    }

    /// Starts (or continues) the feedback watch of `entry` on `value`,
    /// applied for `origin` at `now`; the verdict on a command it replaced
    /// before that one settled goes to the observers. `None` without
    /// feedback.
    fn watch_command(
        &self,
        entry: &Entry,
        value: f64,
        origin: &Origin,
        now: Instant,
    ) -> Option<Started> {
        let feedback = entry.feedback.as_ref()?;
        let by_rozd = matches!(origin, Origin::Safety(_));
        let mut watched = feedback.watched.lock();
        let (started, replaced) = watched.watch.command(&feedback.spec, value, by_rozd, now);
        if let Some(verdict) = replaced {
            let previous = watched.origin.clone();
            self.publish_verdict(entry, feedback, &watched.watch, previous, verdict, None);
        }
        watched.origin = origin.clone();
        Some(started)
    }

    /// Hands a verdict to the observers and wakes its waiting caller (under
    /// the watch's lock, so each actuator's verdicts stay in order).
    fn publish_verdict(
        &self,
        entry: &Entry,
        feedback: &Feedback,
        watch: &Watch,
        origin: Origin,
        verdict: Verdict,
        action: Option<MismatchAction>,
    ) {
        let event = VerdictEvent {
            actuator: entry.spec.name.clone(),
            session_id: origin.session().map(str::to_string),
            origin,
            verdict,
            alarm: watch.alarm(),
            action,
        };
        match event.verdict.status {
            FeedbackStatus::Mismatch => tracing::warn!(
                actuator = %event.actuator,
                commanded = event.verdict.commanded,
                measured = ?event.verdict.measured,
                expected = event.verdict.expected,
                reason = event.verdict.reason,
                "feedback mismatch"
            ),
            status => tracing::info!(
                actuator = %event.actuator,
                status = status.as_str(),
                measured = ?event.verdict.measured,
                "feedback verdict"
            ),
        }
        for observer in self.observers.iter() {
            observer.feedback_verdict(&event);
        }
        feedback.verdicts.send_modify(|n| *n += 1);
    }

    /// The actuators with feedback: (index, feedback sensor, cross-check
    /// sensor), for the loop to step their watches with
    /// [`Actuators::step_feedback`].
    pub fn feedback_sensors(&self) -> impl Iterator<Item = (usize, &str, Option<&str>)> {
        self.entries.iter().filter_map(|e| {
            let spec = &e.feedback.as_ref()?.spec;
            let cross = spec.cross_check.as_ref().map(|c| c.sensor.as_str());
            Some((e.index, spec.sensor.as_str(), cross))
        })
    }

    /// Steps the feedback watch of actuator `index` with its sensor's
    /// `sample` at `now` (once a tick). A verdict goes to the observers.
    /// What `on_mismatch` asks for is returned, for the loop to finish: a
    /// stop is latched here already, before anyone hears of the verdict, so
    /// the call that waits for it fails with `e_stop` rather than reading a
    /// verdict as if nothing followed.
    pub fn step_feedback(
        &self,
        index: usize,
        sample: Sample,
        cross: Option<Sample>,
        now: Instant,
    ) -> Option<MismatchResponse> {
        let entry = self.entries.get(index)?;
        let feedback = entry.feedback.as_ref()?;
        // Without the state's lock: this runs for every watch every tick.
        let at_safe = entry.at_safe.load(std::sync::atomic::Ordering::Acquire);
        let mut watched = feedback.watched.lock();
        let verdict = watched
            .watch
            .step_checked(&feedback.spec, sample, cross, now)?;
        let action = Watch::action(&feedback.spec, &verdict, at_safe);
        let response = action.map(|action| {
            let measured = verdict
                .measured
                .map_or_else(|| "nothing".to_string(), |m| m.to_string());
            let response = MismatchResponse {
                actuator: entry.spec.name.clone(),
                action,
                source: StopSource::Feedback(entry.spec.name.clone()),
                reason: format!(
                    "feedback mismatch: {} commanded {}, {} measured {measured} ({} ± {} expected)",
                    entry.spec.name,
                    verdict.commanded,
                    feedback.spec.sensor,
                    verdict.expected,
                    feedback.spec.tolerance
                ),
            };
            if action == MismatchAction::LatchStop {
                self.protective_stop
                    .trigger(StopRequest::new(&response.source, &response.reason));
            }
            response
        });
        let origin = watched.origin.clone();
        self.publish_verdict(entry, feedback, &watched.watch, origin, verdict, action);
        response
    }

    /// The verdict on a command (what [`Applied::watch`] says it started),
    /// waiting at most `wait` for it; `None` if none came.
    pub async fn verdict(&self, name: &str, started: &Started, wait: Duration) -> Option<Verdict> {
        let episode = match started {
            Started::Standing(verdict) => return Some(verdict.clone()),
            Started::Watching { episode } | Started::Settling { episode } => *episode,
        };
        let feedback = self.entry(name).ok()?.feedback.as_ref()?;
        let mut changed = feedback.verdicts.subscribe();
        let wait_for = async {
            loop {
                {
                    let watched = feedback.watched.lock();
                    if let Some(verdict) = watched.watch.first_of(episode) {
                        return Some(verdict.clone());
                    }
                    // Replaced and its verdict long gone (kept verdicts are few).
                    if watched.watch.episode() > episode {
                        return None;
                    }
                }
                if changed.changed().await.is_err() {
                    return None;
                }
            }
        };
        tokio::time::timeout(wait, wait_for).await.ok().flatten()
    }

    /// The mismatch alarm of an actuator with feedback: 1 raised, 0 not;
    /// `None` for an unknown actuator or one without feedback.
    pub fn mismatch(&self, name: &str) -> Option<f64> {
        let feedback = self.entry(name).ok()?.feedback.as_ref()?;
        Some(f64::from(u8::from(feedback.watched.lock().watch.alarm())))
    }

    pub fn views(&self, now: Instant) -> Vec<ActuatorView> {
        self.entries
            .iter()
            .map(|e| {
                let s = e.state.lock();
                ActuatorView {
                    name: e.spec.name.clone(),
                    unit: e.spec.unit.clone(),
                    value: s.value(),
                    safe_value: e.spec.safe_value,
                    // Wanted safe is not known safe: a device that did
                    // not answer may still run.
                    at_safe_value: s.at_safe_value(&e.spec) && s.safe_unconfirmed().is_none(),
                    safe_unconfirmed: s.safe_unconfirmed().map(str::to_string),
                    owner: s.owner().map(ToString::to_string),
                    since_ms: ms(now.saturating_duration_since(s.since())),
                    hold_remaining_ms: s.hold_until().map(|t| ms(t.saturating_duration_since(now))),
                    feedback: e.feedback.as_ref().map(|f| {
                        let view = f.watched.lock().watch.view();
                        ActuatorFeedback {
                            feedback_sensor: f.spec.sensor.clone(),
                            feedback_status: view.status,
                            measured: view.measured,
                            expected: view.expected,
                            mismatch: view.alarm,
                        }
                    }),
                }
            })
            .collect()
    }
}

/// The driver takes `value` within the actuator's deadline, or the error
/// that the command reports (the caller drives the safe value then).
async fn apply_within_deadline(entry: &Entry, value: f64) -> Result<(), ActError> {
    let actuator = || entry.spec.name.clone();
    match tokio::time::timeout(entry.spec.timeout, entry.driver.apply(value)).await {
        Ok(Ok(())) => Ok(()),
        // The driver's own deadline (e.g. a serial reply timeout shorter
        // than the command's) is a timeout too, not a generic failure.
        Ok(Err(HwError::Timeout(timeout_ms))) => Err(ActError::Timeout {
            actuator: actuator(),
            timeout_ms,
        }),
        Ok(Err(error)) => Err(ActError::Driver {
            actuator: actuator(),
            error,
        }),
        Err(_) => Err(ActError::Timeout {
            actuator: actuator(),
            timeout_ms: ms(entry.spec.timeout),
        }),
    }
}

/// The one task that returns held values to safe: it sleeps until the
/// earliest hold deadline (or until one comes earlier) and drives what is
/// due. It holds the actuators only weakly, and ends when they are dropped.
async fn expire_holds(actuators: Weak<Actuators>, changed: Arc<tokio::sync::Notify>) {
    loop {
        let next = match actuators.upgrade() {
            Some(a) => a.holds.lock().next(),
            None => return,
        };
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = changed.notified() => continue,
                }
            }
            None => {
                changed.notified().await;
                continue;
            }
        }
        let Some(a) = actuators.upgrade() else { return };
        a.expire_due(Instant::now()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::sim::SimActuator;
    use crate::ooda::admission::tests::test_spec as spec;

    fn two(stop: ProtectiveStop) -> (Arc<Actuators>, Arc<SimActuator>, Arc<SimActuator>) {
        let (a, b) = (SimActuator::new(), SimActuator::new());
        let actuators = Actuators::new(
            vec![
                (spec("a", Some(1000)), a.clone() as Arc<dyn ActuatorDriver>),
                (spec("b", Some(3000)), b.clone() as Arc<dyn ActuatorDriver>),
            ],
            stop,
            Observers::default(),
        );
        (actuators, a, b)
    }

    fn session(id: &str) -> Origin {
        Origin::Session(id.into())
    }

    /// Lets the expiry task run what is due at the (paused) clock's now.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn one_task_returns_each_held_value_to_safe_at_its_own_deadline() {
        let (actuators, a, b) = two(ProtectiveStop::default());
        actuators
            .command("a", 0.5, session("s"), None)
            .await
            .unwrap();
        actuators
            .command("b", 0.7, session("s"), None)
            .await
            .unwrap();
        tokio::time::advance(Duration::from_millis(999)).await;
        settle().await;
        assert_eq!(actuators.value("a"), Some(0.5));
        tokio::time::advance(Duration::from_millis(1)).await;
        settle().await;
        assert_eq!(actuators.value("a"), Some(0.0));
        assert_eq!(a.value(), Some(0.0));
        assert_eq!(actuators.value("b"), Some(0.7));
        tokio::time::advance(Duration::from_millis(2000)).await;
        settle().await;
        assert_eq!(b.value(), Some(0.0));
        assert_eq!(actuators.value("b"), Some(0.0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_command_renews_the_hold_and_a_shorter_one_wakes_the_task_earlier() {
        let (actuators, _, b) = two(ProtectiveStop::default());
        actuators
            .command("b", 0.5, session("s"), None)
            .await
            .unwrap();
        tokio::time::advance(Duration::from_millis(2500)).await;
        actuators
            .command("b", 0.6, session("s"), None)
            .await
            .unwrap();
        // The first deadline (3000) passes: the renewed value stands.
        tokio::time::advance(Duration::from_millis(600)).await;
        settle().await;
        assert_eq!(b.value(), Some(0.6));
        // A command asking a shorter hold than the one pending is honoured.
        actuators
            .command("b", 0.4, session("s"), Some(Duration::from_millis(10)))
            .await
            .unwrap();
        tokio::time::advance(Duration::from_millis(10)).await;
        settle().await;
        assert_eq!(b.value(), Some(0.0));
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_reach_no_driver() {
        let stop = ProtectiveStop::default();
        let (actuators, a, _) = two(stop.clone());
        let refused = actuators.command("a", 2.0, session("s"), None).await;
        assert!(
            matches!(&refused, Err(ActError::SafetyViolation { reason, .. }) if reason.contains("outside the allowed values [-1, 1]")),
            "{refused:?}"
        );
        actuators
            .command("a", 0.5, session("s"), None)
            .await
            .unwrap();
        let held = actuators.command("a", 0.1, session("t"), None).await;
        assert!(matches!(held, Err(ActError::Held { .. })), "{held:?}");
        assert!(stop.trigger(StopRequest::new(&StopSource::Rest, "bumper")));
        let stopped = actuators.command("a", 0.1, session("s"), None).await;
        assert!(
            matches!(&stopped, Err(ActError::EStop { reason, .. }) if reason == "bumper"),
            "{stopped:?}"
        );
        assert!(matches!(
            actuators.command("zz", 0.1, session("s"), None).await,
            Err(ActError::Unknown(_))
        ));
        assert_eq!(a.history(), vec![0.5]);
    }

    #[tokio::test(start_paused = true)]
    async fn release_drives_safe_only_what_the_session_owns_and_ends_its_hold() {
        let (actuators, a, b) = two(ProtectiveStop::default());
        actuators
            .command("a", 0.5, session("s"), None)
            .await
            .unwrap();
        actuators
            .command("b", 0.5, Origin::Rule("r".into()), None)
            .await
            .unwrap();
        assert_eq!(
            actuators.release(&session("s"), "deadman").await,
            vec!["a".to_string()]
        );
        assert_eq!(a.value(), Some(0.0));
        assert_eq!(b.value(), Some(0.5));
        let views = actuators.views(Instant::now());
        assert_eq!(views[0].hold_remaining_ms, None);
        assert_eq!(views[1].hold_remaining_ms, Some(3000));
        // The released actuator's old deadline drives nothing again.
        tokio::time::advance(Duration::from_millis(1000)).await;
        settle().await;
        assert_eq!(a.history(), vec![0.5, 0.0]);
    }

    #[tokio::test(start_paused = true)]
    async fn after_close_every_command_is_refused_and_everything_is_safe() {
        let (actuators, a, b) = two(ProtectiveStop::default());
        actuators
            .command("a", 0.5, session("s"), None)
            .await
            .unwrap();
        actuators.close("shutdown").await;
        assert_eq!((a.value(), b.value()), (Some(0.0), Some(0.0)));
        assert!(matches!(
            actuators.command("a", 0.5, session("s"), None).await,
            Err(ActError::Closed { .. })
        ));
    }

    /// Keeps every verdict it hears.
    #[derive(Debug, Default)]
    struct Verdicts(Mutex<Vec<VerdictEvent>>);

    impl ActuatorObserver for Verdicts {
        fn feedback_verdict(&self, event: &VerdictEvent) {
            self.0.lock().push(event.clone());
        }
    }

    fn with_feedback(
        on_mismatch: crate::hw::config::OnMismatch,
    ) -> (Arc<Actuators>, Arc<Verdicts>) {
        let verdicts = Arc::new(Verdicts::default());
        let drive = ActuatorSpec {
            feedback: Some(FeedbackSpec {
                sensor: "wheel_speed".into(),
                tolerance: 0.05,
                settle: Duration::from_millis(500),
                scale: 1.0,
                offset: 0.0,
                on_mismatch,
                fresh_within: Some(Duration::from_millis(500)),
                cross_check: None,
            }),
            ..spec("drive", Some(10_000))
        };
        let actuators = Actuators::new(
            vec![
                (
                    spec("plain", None),
                    SimActuator::new() as Arc<dyn ActuatorDriver>,
                ),
                (drive, SimActuator::new() as Arc<dyn ActuatorDriver>),
            ],
            ProtectiveStop::default(),
            Observers::new(vec![verdicts.clone() as Arc<dyn ActuatorObserver>]),
        );
        (actuators, verdicts)
    }

    fn sample(value: f64) -> Sample {
        Sample {
            latest: Some((value, Instant::now())),
            healthy: true,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_reads_the_verdict_on_its_own_command_and_the_observers_hear_it() {
        use crate::hw::config::OnMismatch;
        let (actuators, verdicts) = with_feedback(OnMismatch::Alarm);
        assert_eq!(
            actuators.feedback_sensors().collect::<Vec<_>>(),
            [(1, "wheel_speed", None)]
        );
        let applied = actuators
            .command("drive", 0.3, session("s"), None)
            .await
            .unwrap();
        let started = applied.watch.clone().expect("drive has feedback");
        let waiter = {
            let actuators = actuators.clone();
            tokio::spawn(async move {
                actuators
                    .verdict("drive", &started, Duration::from_secs(1))
                    .await
            })
        };
        tokio::time::advance(Duration::from_millis(20)).await;
        assert!(
            actuators
                .step_feedback(1, sample(0.29), None, Instant::now())
                .is_none()
        );
        let verdict = waiter.await.unwrap().expect("a verdict");
        assert_eq!(verdict.status, FeedbackStatus::Confirmed);
        assert_eq!((verdict.measured, verdict.settled_ms), (Some(0.29), 20));
        let heard = verdicts.0.lock().clone();
        assert_eq!(heard.len(), 1);
        assert_eq!(heard[0].actuator, "drive");
        assert_eq!(heard[0].session_id.as_deref(), Some("s"));
        assert_eq!(heard[0].verdict, verdict);
        let view = &actuators.views(Instant::now())[1];
        let feedback = view.feedback.as_ref().unwrap();
        assert_eq!(feedback.feedback_status, Some(FeedbackStatus::Confirmed));
        assert_eq!((feedback.measured, feedback.mismatch), (Some(0.29), false));
        assert_eq!(actuators.views(Instant::now())[0].feedback, None);
        assert_eq!(actuators.mismatch("drive"), Some(0.0));
        assert_eq!(actuators.mismatch("plain"), None);
        // Renewing the same value answers at once with the standing verdict.
        let renewed = actuators
            .command("drive", 0.3, session("s"), None)
            .await
            .unwrap();
        assert_eq!(renewed.watch, Some(Started::Standing(verdict)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_mismatch_raises_the_alarm_and_asks_for_the_safe_drive_which_is_watched_too() {
        use crate::hw::config::OnMismatch;
        let (actuators, verdicts) = with_feedback(OnMismatch::Safe);
        let applied = actuators
            .command("drive", 0.3, session("s"), None)
            .await
            .unwrap();
        for _ in 0..24 {
            tokio::time::advance(Duration::from_millis(20)).await;
            assert!(
                actuators
                    .step_feedback(1, sample(0.0), None, Instant::now())
                    .is_none()
            );
        }
        tokio::time::advance(Duration::from_millis(20)).await;
        let response = actuators
            .step_feedback(1, sample(0.0), None, Instant::now())
            .expect("on_mismatch acts");
        assert_eq!(
            (response.actuator.as_str(), response.action),
            ("drive", MismatchAction::DriveSafe)
        );
        assert_eq!(
            response.reason,
            "feedback mismatch: drive commanded 0.3, wheel_speed measured 0 (0.3 ± 0.05 expected)"
        );
        assert_eq!(actuators.mismatch("drive"), Some(1.0));
        let read = actuators
            .verdict("drive", applied.watch.as_ref().unwrap(), Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(read.status, FeedbackStatus::Mismatch);
        assert_eq!(verdicts.0.lock().last().map(|e| &e.verdict), Some(&read));
        // The loop drives it safe; the stuck drive reads 0: confirmed, and
        // the alarm stays (rozd's own drive does not clear it).
        actuators.safe("drive", "feedback mismatch").await.unwrap();
        tokio::time::advance(Duration::from_millis(20)).await;
        assert!(
            actuators
                .step_feedback(1, sample(0.0), None, Instant::now())
                .is_none()
        );
        let heard = verdicts.0.lock().clone();
        let last = heard.last().unwrap();
        assert_eq!(last.verdict.status, FeedbackStatus::Confirmed);
        assert_eq!(last.verdict.commanded, 0.0);
        assert!(matches!(&last.origin, Origin::Safety(why) if why == "feedback mismatch"));
        assert!(last.alarm);
        assert_eq!(actuators.mismatch("drive"), Some(1.0));
    }

    #[tokio::test(start_paused = true)]
    async fn on_mismatch_stop_latches_the_stop_before_the_verdict_is_heard() {
        use crate::hw::config::OnMismatch;
        let (actuators, _) = with_feedback(OnMismatch::Stop);
        actuators
            .command("drive", 0.3, session("s"), None)
            .await
            .unwrap();
        tokio::time::advance(Duration::from_millis(500)).await;
        let response = actuators
            .step_feedback(1, sample(0.0), None, Instant::now())
            .expect("on_mismatch acts");
        assert_eq!(response.action, MismatchAction::LatchStop);
        assert_eq!(response.source, StopSource::Feedback("drive".into()));
        let stop = actuators.protective_stop.active().expect("latched");
        assert_eq!(
            (stop.source, stop.reason),
            ("feedback:drive".to_string(), response.reason)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_expiry_task_does_not_keep_the_actuators_alive() {
        let (actuators, _, _) = two(ProtectiveStop::default());
        actuators
            .command("a", 0.5, session("s"), None)
            .await
            .unwrap();
        let weak = Arc::downgrade(&actuators);
        drop(actuators);
        settle().await;
        assert!(weak.upgrade().is_none());
    }
}
