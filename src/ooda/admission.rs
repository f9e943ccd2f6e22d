//! Actuator admission: may this command be applied, and what does applying
//! it or going safe change? Plain data and methods that take `now`; no
//! driver, no lock, no clock of their own. [`super::act::Actuators`] owns
//! the I/O around it (the driver under its deadline, the audit, the expiry
//! task over [`HoldDeadlines`]).
//!
//! The rules, in the order they are checked:
//! 1. rozd itself (origin `safety`) is never refused: going safe is never
//!    gated by a stop, a rate or an owner;
//! 2. while the protective stop is active, nothing else is applied;
//! 3. the value is finite and within the actuator's allowed values (never
//!    clamped);
//! 4. commands come no faster than `max_rate_hz`;
//! 5. an actuator commanded by one session is not commanded by another
//!    unless it is `shared` (rules and operators may always command it).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use super::act::Origin;
use crate::hw::config::ActuatorSpec;

/// Values closer than this to the safe value count as the safe value.
const SAFE_EPSILON: f64 = 1e-12;

/// Why a command is not applied.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Refusal {
    /// The protective stop is active (its reason).
    Stopped(String),
    NotFinite(f64),
    /// Outside the allowed values (their description).
    OutOfRange {
        value: f64,
        allowed: String,
    },
    RateLimited {
        max_rate_hz: f64,
    },
    /// Commanded by another session, and not shared.
    Held(Origin),
}

/// One actuator's commanded state.
#[derive(Debug, Clone)]
pub(crate) struct Admission {
    value: f64,
    /// Who commanded the current (non-safe) value.
    owner: Option<Origin>,
    since: Instant,
    hold_until: Option<Instant>,
    last_command: Option<Instant>,
    /// Why the device did not confirm the last drive to the safe value
    /// (a driver error or a timeout); `None` once a drive went through.
    safe_unconfirmed: Option<String>,
}

/// What applying a command changed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Change {
    pub previous: f64,
    /// The hold in force: the configured `hold_ms`, shortened (never
    /// extended) by the command's own; none for the safe value.
    pub hold: Option<Duration>,
    /// When the value is to go back to safe, if ever.
    pub hold_until: Option<Instant>,
}

impl Admission {
    /// At its safe value, owned by nobody.
    pub(crate) fn new(safe_value: f64, now: Instant) -> Admission {
        Admission {
            value: safe_value,
            owner: None,
            since: now,
            hold_until: None,
            last_command: None,
            safe_unconfirmed: None,
        }
    }

    /// Why the device did not confirm that it is at the safe value, when
    /// the last drive to it failed.
    pub(crate) fn safe_unconfirmed(&self) -> Option<&str> {
        self.safe_unconfirmed.as_deref()
    }

    pub(crate) fn value(&self) -> f64 {
        self.value
    }

    pub(crate) fn owner(&self) -> Option<&Origin> {
        self.owner.as_ref()
    }

    pub(crate) fn since(&self) -> Instant {
        self.since
    }

    pub(crate) fn hold_until(&self) -> Option<Instant> {
        self.hold_until
    }

    pub(crate) fn at_safe_value(&self, spec: &ActuatorSpec) -> bool {
        (self.value - spec.safe_value).abs() < SAFE_EPSILON
    }

    /// May `origin` command `value` now? `stop` is the reason of the active
    /// protective stop, if one is.
    pub(crate) fn admit(
        &self,
        spec: &ActuatorSpec,
        value: f64,
        origin: &Origin,
        stop: Option<&str>,
        now: Instant,
    ) -> Result<(), Refusal> {
        let going_safe = matches!(origin, Origin::Safety(_));
        if !going_safe && let Some(reason) = stop {
            return Err(Refusal::Stopped(reason.to_string()));
        }
        if !value.is_finite() {
            return Err(Refusal::NotFinite(value));
        }
        if !spec.values.contains(value) {
            return Err(Refusal::OutOfRange {
                value,
                allowed: spec.values.to_string(),
            });
        }
        if going_safe {
            return Ok(());
        }
        if let (Some(hz), Some(last)) = (spec.max_rate_hz, self.last_command) {
            let min_gap = Duration::from_secs_f64(1.0 / hz);
            if now.saturating_duration_since(last) < min_gap {
                return Err(Refusal::RateLimited { max_rate_hz: hz });
            }
        }
        if let (Origin::Session(_), Some(owner @ Origin::Session(_))) = (origin, &self.owner)
            && owner != origin
            && !spec.shared
        {
            return Err(Refusal::Held(owner.clone()));
        }
        Ok(())
    }

    /// The driver took `value` for `origin` at `now`; `asked_hold` is the
    /// command's own hold, if it gave one.
    pub(crate) fn applied(
        &mut self,
        spec: &ActuatorSpec,
        value: f64,
        origin: &Origin,
        asked_hold: Option<Duration>,
        now: Instant,
    ) -> Change {
        let hold = match (spec.hold, asked_hold) {
            (Some(configured), Some(asked)) => Some(configured.min(asked)),
            (configured, asked) => configured.or(asked),
        };
        let previous = self.value;
        self.value = value;
        self.since = now;
        self.last_command = Some(now);
        // The driver took this value: whatever failed before is past.
        self.safe_unconfirmed = None;
        let is_safe = self.at_safe_value(spec);
        self.owner = (!is_safe).then(|| origin.clone());
        // `hold_ms` may come from a model: an absurd one must not overflow.
        self.hold_until = hold.filter(|_| !is_safe).and_then(|h| now.checked_add(h));
        Change {
            previous,
            hold,
            hold_until: self.hold_until,
        }
    }

    /// The safe value was driven (whether or not the device confirmed it:
    /// it is the value rozd wants); `error`: why the device did not
    /// confirm it. Returns who had owned the value before.
    pub(crate) fn went_safe(
        &mut self,
        spec: &ActuatorSpec,
        error: Option<String>,
        now: Instant,
    ) -> Option<Origin> {
        self.safe_unconfirmed = error;
        self.value = spec.safe_value;
        self.since = now;
        self.hold_until = None;
        self.owner.take()
    }

    /// The value's hold has run out by `now`.
    pub(crate) fn hold_expired(&self, now: Instant) -> bool {
        self.hold_until.is_some_and(|until| until <= now)
    }
}

/// When each actuator's hold runs out, earliest first: the one expiry task
/// sleeps until [`HoldDeadlines::next`] and drives what
/// [`HoldDeadlines::take_due`] returns (as mini-redis's `db.rs` keeps one
/// expiry task over a deadline set). At most one deadline per actuator
/// (its index): a new command replaces the old one.
#[derive(Debug, Default)]
pub(crate) struct HoldDeadlines {
    by_time: BTreeSet<(Instant, usize)>,
    by_actuator: HashMap<usize, Instant>,
}

impl HoldDeadlines {
    /// Sets (or, with `None`, removes) the deadline of `actuator`. Returns
    /// whether the earliest deadline moved earlier, i.e. whether a sleeping
    /// expiry task must be woken to sleep less.
    pub(crate) fn set(&mut self, actuator: usize, deadline: Option<Instant>) -> bool {
        if let Some(old) = self.by_actuator.remove(&actuator) {
            self.by_time.remove(&(old, actuator));
        }
        let Some(deadline) = deadline else {
            return false;
        };
        let earliest_before = self.next();
        self.by_time.insert((deadline, actuator));
        self.by_actuator.insert(actuator, deadline);
        earliest_before.is_none_or(|e| deadline < e)
    }

    /// The earliest deadline.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.by_time.first().map(|(t, _)| *t)
    }

    /// Removes and returns the actuators whose deadline is at or before `now`.
    pub(crate) fn take_due(&mut self, now: Instant) -> Vec<usize> {
        let mut due = Vec::new();
        while let Some(&(t, actuator)) = self.by_time.first() {
            if t > now {
                break;
            }
            self.by_time.pop_first();
            self.by_actuator.remove(&actuator);
            due.push(actuator);
        }
        due
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::hw::config::{ActuatorTarget, ValueSet};

    /// A simulated actuator in [-1, 1], safe at 0 (also for `act`'s tests).
    pub(in crate::ooda) fn test_spec(name: &str, hold_ms: Option<u64>) -> ActuatorSpec {
        ActuatorSpec {
            name: name.into(),
            unit: Some("m/s".into()),
            description: None,
            values: ValueSet::Range {
                min: -1.0,
                max: 1.0,
            },
            safe_value: 0.0,
            max_rate_hz: None,
            hold: hold_ms.map(Duration::from_millis),
            timeout: Duration::from_millis(100),
            shared: false,
            target: ActuatorTarget::Sim { input: None },
            feedback: None,
        }
    }

    fn spec() -> ActuatorSpec {
        test_spec("drive", Some(2000))
    }

    fn session(id: &str) -> Origin {
        Origin::Session(id.into())
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn starts_safe_and_unowned() {
        let t0 = Instant::now();
        let a = Admission::new(0.0, t0);
        assert_eq!(a.value(), 0.0);
        assert!(a.owner().is_none());
        assert!(a.at_safe_value(&spec()));
        assert!(!a.hold_expired(t0 + ms(1_000_000)));
    }

    #[test]
    fn values_are_refused_never_clamped() {
        let t0 = Instant::now();
        let a = Admission::new(0.0, t0);
        let s = spec();
        // NaN is not equal to itself: match rather than compare.
        assert!(matches!(
            a.admit(&s, f64::NAN, &session("a"), None, t0),
            Err(Refusal::NotFinite(v)) if v.is_nan()
        ));
        assert_eq!(
            a.admit(&s, f64::INFINITY, &session("a"), None, t0),
            Err(Refusal::NotFinite(f64::INFINITY))
        );
        assert_eq!(
            a.admit(&s, 1.5, &session("a"), None, t0),
            Err(Refusal::OutOfRange {
                value: 1.5,
                allowed: "[-1, 1]".into()
            })
        );
        let allowed = ActuatorSpec {
            values: ValueSet::Allowed(vec![0.0, 0.5]),
            ..spec()
        };
        assert!(a.admit(&allowed, 0.5, &session("a"), None, t0).is_ok());
        assert_eq!(
            a.admit(&allowed, 0.4, &session("a"), None, t0),
            Err(Refusal::OutOfRange {
                value: 0.4,
                allowed: "one of {0, 0.5}".into()
            })
        );
        // Even going safe must name a value the actuator takes.
        assert!(
            a.admit(&s, 7.0, &Origin::Safety("x".into()), None, t0)
                .is_err()
        );
    }

    #[test]
    fn the_stop_refuses_everyone_but_going_safe() {
        let t0 = Instant::now();
        let a = Admission::new(0.0, t0);
        let s = spec();
        for origin in [
            session("a"),
            Origin::Rule("r".into()),
            Origin::Operator("ops".into()),
        ] {
            assert_eq!(
                a.admit(&s, 0.3, &origin, Some("bumper"), t0),
                Err(Refusal::Stopped("bumper".into())),
                "{origin}"
            );
        }
        assert!(
            a.admit(&s, 0.0, &Origin::Safety("stop".into()), Some("bumper"), t0)
                .is_ok()
        );
        // The stop is checked before the value: the caller learns of the stop.
        assert_eq!(
            a.admit(&s, f64::NAN, &session("a"), Some("bumper"), t0),
            Err(Refusal::Stopped("bumper".into()))
        );
    }

    #[test]
    fn the_rate_limit_counts_from_the_last_applied_command() {
        let t0 = Instant::now();
        let s = ActuatorSpec {
            max_rate_hz: Some(10.0),
            ..spec()
        };
        let mut a = Admission::new(0.0, t0);
        assert!(a.admit(&s, 0.2, &session("a"), None, t0).is_ok());
        a.applied(&s, 0.2, &session("a"), None, t0);
        assert_eq!(
            a.admit(&s, 0.3, &session("a"), None, t0 + ms(99)),
            Err(Refusal::RateLimited { max_rate_hz: 10.0 })
        );
        assert!(a.admit(&s, 0.3, &session("a"), None, t0 + ms(100)).is_ok());
        // Going safe is never rate limited.
        assert!(
            a.admit(&s, 0.0, &Origin::Safety("x".into()), None, t0 + ms(1))
                .is_ok()
        );
        // A refused command does not count: only what was applied does.
        assert!(a.admit(&s, 0.3, &session("a"), None, t0 + ms(150)).is_ok());
    }

    #[test]
    fn another_session_is_refused_unless_shared() {
        let t0 = Instant::now();
        let s = spec();
        let mut a = Admission::new(0.0, t0);
        a.applied(&s, 0.5, &session("a"), None, t0);
        assert_eq!(a.owner(), Some(&session("a")));
        assert_eq!(
            a.admit(&s, 0.1, &session("b"), None, t0),
            Err(Refusal::Held(session("a")))
        );
        assert!(a.admit(&s, 0.1, &session("a"), None, t0).is_ok());
        // Rules and operators are not sessions: they may take over.
        assert!(
            a.admit(&s, 0.1, &Origin::Rule("r".into()), None, t0)
                .is_ok()
        );
        assert!(
            a.admit(&s, 0.1, &Origin::Operator("ops".into()), None, t0)
                .is_ok()
        );
        let shared = ActuatorSpec {
            shared: true,
            ..spec()
        };
        assert!(a.admit(&shared, 0.1, &session("b"), None, t0).is_ok());
    }

    #[test]
    fn the_safe_value_frees_the_actuator_and_has_no_hold() {
        let t0 = Instant::now();
        let s = spec();
        let mut a = Admission::new(0.0, t0);
        a.applied(&s, 0.5, &session("a"), None, t0);
        let change = a.applied(&s, 0.0, &session("a"), None, t0 + ms(10));
        assert_eq!(change.previous, 0.5);
        assert_eq!(change.hold_until, None);
        assert!(a.owner().is_none());
        assert!(a.admit(&s, 0.2, &session("b"), None, t0 + ms(10)).is_ok());
    }

    #[test]
    fn a_command_may_shorten_the_hold_but_never_extend_it() {
        let t0 = Instant::now();
        let s = spec(); // hold_ms = 2000
        let mut a = Admission::new(0.0, t0);
        let change = a.applied(&s, 0.5, &session("a"), Some(ms(500)), t0);
        assert_eq!(change.hold, Some(ms(500)));
        assert_eq!(change.hold_until, Some(t0 + ms(500)));
        let change = a.applied(&s, 0.5, &session("a"), Some(ms(60_000)), t0);
        assert_eq!(change.hold, Some(ms(2000)));
        // No configured hold: the command's own applies.
        let unheld = ActuatorSpec {
            hold: None,
            ..spec()
        };
        let change = a.applied(&unheld, 0.5, &session("a"), Some(ms(300)), t0);
        assert_eq!(change.hold_until, Some(t0 + ms(300)));
        let change = a.applied(&unheld, 0.5, &session("a"), None, t0);
        assert_eq!(change.hold_until, None);
        // An absurd hold from a model does not overflow: no deadline at all
        // rather than a panic (the configured hold still bounds real ones).
        let change = a.applied(&unheld, 0.5, &session("a"), Some(Duration::MAX), t0);
        assert_eq!(change.hold, Some(Duration::MAX));
        assert_eq!(change.hold_until, None);
    }

    #[test]
    fn the_hold_expires_at_its_deadline_and_a_new_command_renews_it() {
        let t0 = Instant::now();
        let s = spec();
        let mut a = Admission::new(0.0, t0);
        a.applied(&s, 0.5, &session("a"), Some(ms(500)), t0);
        assert!(!a.hold_expired(t0 + ms(499)));
        assert!(a.hold_expired(t0 + ms(500)));
        a.applied(&s, 0.4, &session("a"), Some(ms(500)), t0 + ms(400));
        assert!(!a.hold_expired(t0 + ms(500)));
        assert!(a.hold_expired(t0 + ms(900)));
    }

    #[test]
    fn going_safe_clears_owner_and_hold_and_reports_the_owner() {
        let t0 = Instant::now();
        let s = spec();
        let mut a = Admission::new(0.0, t0);
        a.applied(&s, 0.5, &session("a"), Some(ms(500)), t0);
        assert_eq!(a.went_safe(&s, None, t0 + ms(5)), Some(session("a")));
        assert_eq!(a.value(), 0.0);
        assert_eq!(a.hold_until(), None);
        assert_eq!(a.since(), t0 + ms(5));
        assert!(!a.hold_expired(t0 + ms(10_000)));
        assert_eq!(a.went_safe(&s, None, t0 + ms(6)), None);
    }

    #[test]
    fn a_safe_drive_the_device_did_not_confirm_is_remembered_until_one_goes_through() {
        let t0 = Instant::now();
        let s = spec();
        let mut a = Admission::new(0.0, t0);
        assert_eq!(a.safe_unconfirmed(), None, "nothing failed yet");
        a.went_safe(&s, Some("no reply within 200 ms".into()), t0);
        assert!(a.at_safe_value(&s), "the value rozd wants is safe");
        assert_eq!(a.safe_unconfirmed(), Some("no reply within 200 ms"));
        // A later safe drive that goes through ends it.
        a.went_safe(&s, None, t0 + ms(1));
        assert_eq!(a.safe_unconfirmed(), None);
        // So does any command the driver took.
        a.went_safe(&s, Some("timed out".into()), t0 + ms(2));
        a.applied(&s, 0.0, &session("a"), None, t0 + ms(3));
        assert_eq!(a.safe_unconfirmed(), None);
    }

    #[test]
    fn deadlines_come_out_earliest_first_one_per_actuator() {
        let t0 = Instant::now();
        let mut d = HoldDeadlines::default();
        assert!(d.set(0, Some(t0 + ms(300))));
        assert!(d.set(1, Some(t0 + ms(100))));
        assert!(!d.set(2, Some(t0 + ms(200))));
        assert_eq!(d.next(), Some(t0 + ms(100)));
        // A new command on actuator 1 replaces its deadline.
        assert!(!d.set(1, Some(t0 + ms(400))));
        assert_eq!(d.next(), Some(t0 + ms(200)));
        assert_eq!(d.take_due(t0 + ms(199)), Vec::<usize>::new());
        assert_eq!(d.take_due(t0 + ms(300)), vec![2, 0]);
        // Going safe removes it.
        assert_eq!(d.next(), Some(t0 + ms(400)));
        d.set(1, None);
        assert_eq!(d.next(), None);
        assert_eq!(d.take_due(t0 + ms(10_000)), Vec::<usize>::new());
    }
}
