//! Act: the one path every actuator command takes.
//!
//! validate (finite, within limits, rate) -> apply through the driver under
//! the actuator's deadline -> record -> schedule the hold expiry. A refused
//! command is never clamped. Any failure or expiry drives the safe value.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::hw::config::ActuatorSpec;
use crate::hw::{ActuatorDriver, HwError};
use crate::safety::ProtectiveStop;

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

#[derive(Debug, Clone)]
struct State {
    value: f64,
    /// Who commanded the current (non-safe) value.
    owner: Option<Origin>,
    since: Instant,
    hold_until: Option<Instant>,
    last_command: Option<Instant>,
    /// Bumped on every change, so a stale hold-expiry timer does nothing.
    generation: u64,
}

struct Entry {
    spec: ActuatorSpec,
    driver: Arc<dyn ActuatorDriver>,
    state: Mutex<State>,
    /// Serialises driver access: one command at a time per actuator.
    io: tokio::sync::Mutex<()>,
}

/// One actuator as shown in an Observation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ActuatorView {
    pub name: String,
    pub unit: Option<String>,
    pub value: f64,
    pub safe_value: f64,
    pub at_safe_value: bool,
    pub owner: Option<String>,
    pub since_ms: u64,
    pub hold_remaining_ms: Option<u64>,
}

/// What a successful command did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Applied {
    pub actuator: String,
    pub value: f64,
    pub previous: f64,
    pub hold_ms: Option<u64>,
}

/// One change of an actuator, for the audit.
#[derive(Debug, Clone, PartialEq)]
pub struct ActuatorEvent {
    pub actuator: String,
    pub value: f64,
    /// Who: `session <id>`, `rule <name>`, `operator ...`, `safety (...)`.
    pub origin: String,
    /// The session that owned it, for filtering.
    pub session_id: Option<String>,
    pub error: Option<String>,
}

/// Told of every actuator change as it happens, in order (a recording taps
/// here). Must not block.
pub trait ActuatorTap: Send + Sync + std::fmt::Debug {
    fn actuator_changed(&self, event: &ActuatorEvent);
}

pub struct Actuators {
    entries: Vec<Entry>,
    index: HashMap<String, usize>,
    estop: ProtectiveStop,
    audit: std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<ActuatorEvent>>,
    tap: std::sync::OnceLock<Arc<dyn ActuatorTap>>,
    /// Set by [`Actuators::close`] at shutdown: no command after the last safe drive.
    closed: std::sync::atomic::AtomicBool,
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
    pub fn new(
        actuators: Vec<(ActuatorSpec, Arc<dyn ActuatorDriver>)>,
        estop: ProtectiveStop,
    ) -> Arc<Actuators> {
        let now = Instant::now();
        let index = actuators
            .iter()
            .enumerate()
            .map(|(i, (s, _))| (s.name.clone(), i))
            .collect();
        let entries = actuators
            .into_iter()
            .map(|(spec, driver)| Entry {
                state: Mutex::new(State {
                    value: spec.safe_value,
                    owner: None,
                    since: now,
                    hold_until: None,
                    last_command: None,
                    generation: 0,
                }),
                spec,
                driver,
                io: tokio::sync::Mutex::new(()),
            })
            .collect();
        Arc::new(Actuators {
            entries,
            index,
            estop,
            audit: std::sync::OnceLock::new(),
            tap: std::sync::OnceLock::new(),
            closed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Where every actuator change is reported (once; later calls are ignored).
    pub fn set_audit(&self, sink: tokio::sync::mpsc::UnboundedSender<ActuatorEvent>) {
        let _ = self.audit.set(sink);
    }

    /// Where every actuator change is also reported, synchronously (once).
    pub fn set_tap(&self, tap: Arc<dyn ActuatorTap>) {
        let _ = self.tap.set(tap);
    }

    fn report(
        &self,
        actuator: &str,
        value: f64,
        origin: &Origin,
        session_id: Option<String>,
        error: Option<String>,
    ) {
        let event = ActuatorEvent {
            actuator: actuator.to_string(),
            value,
            origin: origin.to_string(),
            session_id,
            error,
        };
        if let Some(tap) = self.tap.get() {
            tap.actuator_changed(&event);
        }
        if let Some(sink) = self.audit.get() {
            let _ = sink.send(event);
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
        self.entry(name).ok().map(|e| lock(&e.state).value)
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
        let origin_kind = crate::metrics::origin_kind(&origin);
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
                    error: HwError::Io(format!("the command failed inside rozd: {e}")),
                })
            }
        };
        crate::metrics::actuator_command(name, origin_kind, &result);
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
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(ActError::Closed {
                actuator: name.to_string(),
            });
        }
        let spec = &entry.spec;
        let violation = |reason: String| ActError::SafetyViolation {
            actuator: name.to_string(),
            reason,
        };
        if !matches!(origin, Origin::Safety(_))
            && let Some(stop) = self.estop.active()
        {
            return Err(ActError::EStop {
                actuator: name.to_string(),
                reason: stop.reason,
            });
        }
        if !value.is_finite() {
            return Err(violation(format!("{value} is not a finite number")));
        }
        if !spec.values.contains(value) {
            return Err(violation(format!(
                "{value} is outside the allowed values {}",
                spec.values
            )));
        }
        let _io = entry.io.lock().await;
        // Under the lock, before the driver: a caller that left while this
        // command waited, or a shutdown that closed the actuators, applies nothing.
        if caller.is_cancelled() {
            return Err(ActError::Abandoned {
                actuator: name.to_string(),
            });
        }
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(ActError::Closed {
                actuator: name.to_string(),
            });
        }
        // Again under the lock: a stop that latched while this command waited
        // has already driven the actuator safe, and it must stay there.
        if !matches!(origin, Origin::Safety(_))
            && let Some(stop) = self.estop.active()
        {
            return Err(ActError::EStop {
                actuator: name.to_string(),
                reason: stop.reason,
            });
        }
        let now = Instant::now();
        {
            let state = lock(&entry.state);
            if let (Some(hz), Some(last)) = (spec.max_rate_hz, state.last_command) {
                let min_gap = Duration::from_secs_f64(1.0 / hz);
                if now.duration_since(last) < min_gap && !matches!(origin, Origin::Safety(_)) {
                    return Err(violation(format!("rate limit of {hz} commands/s exceeded")));
                }
            }
            if let (Origin::Session(_), Some(owner @ Origin::Session(_))) = (&origin, &state.owner)
                && owner != &origin
                && !spec.shared
            {
                return Err(ActError::Held {
                    actuator: name.to_string(),
                    holder: owner.to_string(),
                });
            }
        }
        let result = tokio::time::timeout(spec.timeout, entry.driver.apply(value)).await;
        let failure = match result {
            Ok(Ok(())) => None,
            // The driver's own deadline (e.g. a serial reply timeout shorter
            // than the command's) is a timeout too, not a generic failure.
            Ok(Err(HwError::Timeout(timeout_ms))) => Some(ActError::Timeout {
                actuator: name.to_string(),
                timeout_ms,
            }),
            Ok(Err(error)) => Some(ActError::Driver {
                actuator: name.to_string(),
                error,
            }),
            Err(_) => Some(ActError::Timeout {
                actuator: name.to_string(),
                timeout_ms: ms(spec.timeout),
            }),
        };
        if let Some(failure) = failure {
            tracing::warn!(actuator = name, %origin, error = %failure, "command failed; driving the safe value");
            drop(_io);
            self.drive_safe(entry, &format!("command failed: {failure}"))
                .await;
            return Err(failure);
        }
        let hold = match (spec.hold, hold) {
            (Some(configured), Some(asked)) => Some(configured.min(asked)),
            (configured, asked) => configured.or(asked),
        };
        let is_safe = (value - spec.safe_value).abs() < 1e-12;
        let (previous, generation) = {
            let mut state = lock(&entry.state);
            let previous = state.value;
            state.value = value;
            state.owner = (!is_safe).then(|| origin.clone());
            state.since = now;
            state.last_command = Some(now);
            // `hold_ms` may come from a model: an absurd one must not overflow.
            state.hold_until = hold.filter(|_| !is_safe).and_then(|h| now.checked_add(h));
            state.generation += 1;
            (previous, state.generation)
        };
        tracing::info!(actuator = name, value, previous, %origin, "actuator commanded");
        let session = match &origin {
            Origin::Session(id) => Some(id.clone()),
            _ => None,
        };
        self.report(name, value, &origin, session, None);
        if let Some(hold) = hold.filter(|_| !is_safe) {
            let me = self.clone();
            let name = name.to_string();
            tokio::spawn(async move {
                tokio::time::sleep(hold).await;
                me.expire(&name, generation).await;
            });
        }
        Ok(Applied {
            actuator: name.to_string(),
            value,
            previous,
            hold_ms: hold.map(ms),
        })
    }

    async fn expire(&self, name: &str, generation: u64) {
        let Ok(entry) = self.entry(name) else { return };
        if lock(&entry.state).generation == generation {
            self.drive_safe(entry, "hold_ms expired").await;
        }
    }

    /// Drives one actuator to its safe value. Never refused: no estop, rate
    /// or ownership check applies to going safe.
    async fn drive_safe(&self, entry: &Entry, reason: &str) {
        let _io = entry.io.lock().await;
        self.drive_safe_locked(entry, reason).await;
    }

    /// [`Actuators::drive_safe`] with the driver lock already held.
    async fn drive_safe_locked(&self, entry: &Entry, reason: &str) {
        let safe = entry.spec.safe_value;
        let result = tokio::time::timeout(entry.spec.timeout, entry.driver.apply(safe)).await;
        let mut state = lock(&entry.state);
        let session = match &state.owner {
            Some(Origin::Session(id)) => Some(id.clone()),
            _ => None,
        };
        crate::metrics::actuator_safe(&entry.spec.name, matches!(result, Ok(Ok(()))));
        let error = match &result {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some("timed out".to_string()),
        };
        self.report(
            &entry.spec.name,
            safe,
            &Origin::Safety(reason.to_string()),
            session,
            error,
        );
        state.value = safe;
        state.owner = None;
        state.since = Instant::now();
        state.hold_until = None;
        state.generation += 1;
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
            let owned = lock(&e.state).owner.as_ref() == Some(origin);
            if owned {
                self.drive_safe_locked(e, reason).await;
            }
            owned.then(|| e.spec.name.clone())
        }))
        .await;
        released.into_iter().flatten().collect()
    }

    pub fn views(&self, now: Instant) -> Vec<ActuatorView> {
        self.entries
            .iter()
            .map(|e| {
                let s = lock(&e.state);
                ActuatorView {
                    name: e.spec.name.clone(),
                    unit: e.spec.unit.clone(),
                    value: s.value,
                    safe_value: e.spec.safe_value,
                    at_safe_value: (s.value - e.spec.safe_value).abs() < 1e-12,
                    owner: s.owner.as_ref().map(ToString::to_string),
                    since_ms: ms(now.saturating_duration_since(s.since)),
                    hold_remaining_ms: s.hold_until.map(|t| ms(t.saturating_duration_since(now))),
                }
            })
            .collect()
    }
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
