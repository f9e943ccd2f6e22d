//! Commanded versus measured: did the actuator really do what it was told?
//!
//! An actuator with `feedback` names the sensor that measures its effect.
//! After every command that changes the expected value
//! (`value * scale + offset`), its [`Watch`] looks at that sensor until a
//! value arrives that is within `tolerance` of the expected one
//! (`confirmed`) or `settle_ms` has passed: then it is a `mismatch` if fresh
//! values came and none agreed, `unconfirmed` if no fresh value came at all.
//! While the value is held the watch goes on: a measured value out of
//! tolerance for longer than `settle_ms` is a mismatch too (a stall, a jam,
//! a slipping belt), feedback lost for that long is `unconfirmed`, and a
//! value back within tolerance is `confirmed` again.
//!
//! A mismatch raises the actuator's alarm (`<actuator>.mismatch` in the
//! reflex rules). It is cleared when a command that was not rozd's own safe
//! drive is confirmed: going safe on a stuck drive is confirmed at once,
//! and must not hide that the drive is stuck.
//!
//! Plain data and methods that take `now` and the sensor's [`Sample`];
//! the loop steps every watch at each tick and hands the verdicts to the
//! actuators' observers (see [`super::act::Actuators::watch_feedback`]).
//!
//! A value is fresh while it is younger than `fresh_within` (the sensor's
//! `stale_after_ms`, or `settle_ms` when it has none; unbounded for a GPIO
//! input read on its edges) and its source works: a sensor that simply
//! stops reporting while a value is held ends `unconfirmed`, whatever its
//! own staleness setting.
//!
//! What a verdict proves is only what the sensor measures: a sensor that
//! echoes the command confirms every command. An optional `cross_check`
//! names a second, independent sensor whose *rate of change* must agree
//! with the command while the value is held (odometry for a drive speed):
//! a held value whose cross-check disagrees for longer than `settle_ms` is
//! a mismatch even while the feedback sensor agrees.

use std::collections::VecDeque;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::hw::config::{CrossCheckSpec, FeedbackSpec, OnMismatch};

/// What rules read an actuator's mismatch alarm by: `<actuator>.mismatch`.
pub const MISMATCH_SUFFIX: &str = ".mismatch";

/// Verdicts kept per actuator for callers still to read theirs.
const HISTORY: usize = 16;

/// Expected values closer than this are the same expectation: a command
/// that renews the value (a hold, a teleop stream) continues the watch.
const SAME_EXPECTATION: f64 = 1e-9;

/// Where a watch stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FeedbackStatus {
    /// Commanded; the measured value has not agreed yet and `settle_ms` has
    /// not passed.
    Settling,
    /// The measured value is within tolerance of the expected one: the
    /// hardware did it, as far as the sensor can tell.
    Confirmed,
    /// No fresh feedback value: nothing is known either way.
    Unconfirmed,
    /// Fresh values disagree with the expected one: it did not.
    Mismatch,
}

impl FeedbackStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            FeedbackStatus::Settling => "settling",
            FeedbackStatus::Confirmed => "confirmed",
            FeedbackStatus::Unconfirmed => "unconfirmed",
            FeedbackStatus::Mismatch => "mismatch",
        }
    }
}

/// When a verdict was reached: settling after a command, or while the
/// value was held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    Command,
    Hold,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Command => "command",
            Stage::Hold => "hold",
        }
    }
}

/// The feedback sensor as the loop reads it at one tick.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Sample {
    /// Its latest value and when that arrived.
    pub latest: Option<(f64, Instant)>,
    /// Fresh by its `stale_after_ms`, and its source works.
    pub healthy: bool,
}

/// One verdict on what an actuator did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// The watch it belongs to: one per command that changed the expected
    /// value (not shown; a caller waits for its own).
    #[serde(skip)]
    pub episode: u64,
    pub status: FeedbackStatus,
    /// The actuator's value.
    pub commanded: f64,
    /// What the sensor should read (`commanded * scale + offset`).
    pub expected: f64,
    /// The sensor's latest value; `None` when it has none.
    pub measured: Option<f64>,
    pub tolerance: f64,
    /// From the command to the verdict (for `confirmed`: to the value that
    /// agreed).
    pub settled_ms: u64,
    pub stage: Stage,
    /// Why, in words.
    pub reason: &'static str,
    /// The cross-check's measured rate against its expected one, when
    /// the actuator has one and the rate is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cross_check: Option<CrossReading>,
}

/// What the cross-check sensor's rate of change says.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CrossReading {
    pub sensor_rate: f64,
    pub expected_rate: f64,
}

/// What a mismatch does besides the alarm (`on_mismatch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MismatchAction {
    DriveSafe,
    LatchStop,
}

/// What the Observation shows of a watch.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FeedbackView {
    /// `None` before the first command.
    pub status: Option<FeedbackStatus>,
    pub measured: Option<f64>,
    pub expected: Option<f64>,
    /// The actuator's mismatch alarm.
    pub alarm: bool,
}

/// What the sensor says now, against the expectation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Condition {
    Within,
    Out,
    /// The feedback sensor agrees, the cross-check's rate does not.
    CrossOut,
    NoFresh,
}

/// The cross-check sensor's recent values since the command (oldest
/// first), spanning at most its window: their rate of change.
#[derive(Debug, Clone, Default)]
struct RateWindow {
    samples: VecDeque<(f64, Instant)>,
}

impl RateWindow {
    fn clear(&mut self) {
        self.samples.clear();
    }

    /// Adds a value that arrived at `at` (once: a value read again at the
    /// next tick is the same value) and drops what the window no longer
    /// needs.
    fn add(&mut self, value: f64, at: Instant, window: Duration) {
        if self.samples.back().is_some_and(|&(_, last)| at <= last) {
            return;
        }
        self.samples.push_back((value, at));
        // Keep the newest span that still covers the window.
        while self.samples.len() > 2
            && self
                .samples
                .get(1)
                .is_some_and(|&(_, second)| at.saturating_duration_since(second) >= window)
        {
            self.samples.pop_front();
        }
    }

    /// Units per second over at least `window`; `None` before the values
    /// span it.
    fn rate(&self, window: Duration) -> Option<f64> {
        let (&(v0, t0), &(v1, t1)) = (self.samples.front()?, self.samples.back()?);
        let span = t1.saturating_duration_since(t0);
        (span >= window && !span.is_zero()).then(|| (v1 - v0) / span.as_secs_f64())
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Nothing commanded yet.
    Idle,
    /// After a command, until `deadline`; `fresh`: a fresh value came.
    Settling { deadline: Instant, fresh: bool },
    /// The verdict is in; `condition` has held since `since`.
    Holding {
        condition: Condition,
        since: Instant,
    },
}

/// One actuator's watch over its feedback sensor.
#[derive(Debug, Clone)]
pub struct Watch {
    episode: u64,
    commanded: f64,
    expected: f64,
    commanded_at: Instant,
    /// Whether confirming this command clears the alarm (it was not rozd's
    /// own safe drive).
    clears_alarm: bool,
    phase: Phase,
    status: Option<FeedbackStatus>,
    measured: Option<f64>,
    alarm: bool,
    verdicts: VecDeque<Verdict>,
    /// The cross-check sensor's values since the command.
    rates: RateWindow,
    cross: Option<CrossReading>,
}

/// What [`Watch::command`] started.
#[derive(Debug, Clone, PartialEq)]
pub enum Started {
    /// A new watch: wait for its first verdict.
    Watching { episode: u64 },
    /// The same expectation as the watch going on, which has this verdict
    /// already.
    Standing(Verdict),
    /// The same expectation as the watch going on, still settling.
    Settling { episode: u64 },
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Watch {
    pub fn new(now: Instant) -> Watch {
        Watch {
            episode: 0,
            commanded: 0.0,
            expected: 0.0,
            commanded_at: now,
            clears_alarm: false,
            phase: Phase::Idle,
            status: None,
            measured: None,
            alarm: false,
            verdicts: VecDeque::with_capacity(HISTORY),
            rates: RateWindow::default(),
            cross: None,
        }
    }

    /// `value` was applied at `now`; `by_rozd`: it is rozd's own drive to
    /// the safe value. Returns what the caller waits for, and the verdict
    /// on a command it replaced before that one settled (`unconfirmed`).
    pub fn command(
        &mut self,
        spec: &FeedbackSpec,
        value: f64,
        by_rozd: bool,
        now: Instant,
    ) -> (Started, Option<Verdict>) {
        let expected = spec.expected(value);
        let same = (expected - self.expected).abs() <= SAME_EXPECTATION * expected.abs().max(1.0);
        if same && self.phase != Phase::Idle {
            self.commanded = value;
            if !by_rozd {
                self.clears_alarm = true;
                if self.status == Some(FeedbackStatus::Confirmed) {
                    self.alarm = false;
                }
            }
            let started = match self.latest_of(self.episode) {
                Some(v) => Started::Standing(v.clone()),
                None => Started::Settling {
                    episode: self.episode,
                },
            };
            return (started, None);
        }
        let replaced = match self.phase {
            Phase::Settling { .. } => {
                let verdict = self.verdict(
                    spec,
                    FeedbackStatus::Unconfirmed,
                    Stage::Command,
                    ms(now.saturating_duration_since(self.commanded_at)),
                    "replaced by a new command before it settled",
                );
                self.keep(verdict.clone());
                Some(verdict)
            }
            _ => None,
        };
        self.episode += 1;
        self.commanded = value;
        self.expected = expected;
        self.commanded_at = now;
        // A rate across the change of command says nothing about either.
        self.rates.clear();
        self.cross = None;
        self.clears_alarm = !by_rozd;
        self.status = Some(FeedbackStatus::Settling);
        self.phase = Phase::Settling {
            deadline: now.checked_add(spec.settle).unwrap_or(now),
            fresh: false,
        };
        (
            Started::Watching {
                episode: self.episode,
            },
            replaced,
        )
    }

    /// Looks at the sensor at `now`: a verdict when the status changes.
    pub fn step(&mut self, spec: &FeedbackSpec, sample: Sample, now: Instant) -> Option<Verdict> {
        self.step_checked(spec, sample, None, now)
    }

    /// [`Watch::step`] with the cross-check sensor's sample (`cross`), for
    /// an actuator whose feedback has a `cross_check`.
    pub fn step_checked(
        &mut self,
        spec: &FeedbackSpec,
        sample: Sample,
        cross: Option<Sample>,
        now: Instant,
    ) -> Option<Verdict> {
        if let Some((value, _)) = sample.latest {
            self.measured = Some(value);
        }
        let fresh_within = spec.fresh_within;
        let fresh = move |s: Sample| {
            s.latest.filter(|(_, at)| {
                s.healthy && fresh_within.is_none_or(|d| now.saturating_duration_since(*at) <= d)
            })
        };
        let cross_out = match (&spec.cross_check, cross) {
            (Some(check), Some(cross)) => self.cross_out(check, fresh(cross)),
            _ => false,
        };
        let within = |v: f64| (v - self.expected).abs() <= spec.tolerance;
        match self.phase {
            Phase::Idle => None,
            Phase::Settling {
                deadline,
                fresh: had_fresh,
            } => {
                // Only a value that arrived after the command is evidence.
                let evidence = fresh(sample).filter(|(_, at)| *at > self.commanded_at);
                if let Some((value, at)) = evidence {
                    if within(value) {
                        self.phase = Phase::Holding {
                            condition: Condition::Within,
                            since: now,
                        };
                        let took = ms(at.saturating_duration_since(self.commanded_at));
                        return Some(self.conclude(
                            spec,
                            FeedbackStatus::Confirmed,
                            Stage::Command,
                            took,
                            "the measured value is within tolerance",
                        ));
                    }
                    self.phase = Phase::Settling {
                        deadline,
                        fresh: true,
                    };
                }
                if now < deadline {
                    return None;
                }
                let had_fresh = had_fresh || evidence.is_some();
                let (status, condition, reason) = if had_fresh {
                    (
                        FeedbackStatus::Mismatch,
                        Condition::Out,
                        "the measured value was not within tolerance within settle_ms",
                    )
                } else {
                    (
                        FeedbackStatus::Unconfirmed,
                        Condition::NoFresh,
                        "no fresh feedback value within settle_ms",
                    )
                };
                self.phase = Phase::Holding {
                    condition,
                    since: now,
                };
                let took = ms(now.saturating_duration_since(self.commanded_at));
                Some(self.conclude(spec, status, Stage::Command, took, reason))
            }
            Phase::Holding {
                mut condition,
                mut since,
            } => {
                let now_condition = match fresh(sample) {
                    Some((value, _)) if !within(value) => Condition::Out,
                    Some(_) if cross_out => Condition::CrossOut,
                    Some(_) => Condition::Within,
                    None => Condition::NoFresh,
                };
                if now_condition != condition {
                    condition = now_condition;
                    since = now;
                    self.phase = Phase::Holding { condition, since };
                }
                let (status, reason) = match condition {
                    Condition::Within => (
                        FeedbackStatus::Confirmed,
                        "the measured value is within tolerance again",
                    ),
                    Condition::Out => (
                        FeedbackStatus::Mismatch,
                        "the measured value left the tolerance for longer than settle_ms",
                    ),
                    Condition::CrossOut => (
                        FeedbackStatus::Mismatch,
                        "the cross-check sensor's rate of change disagreed with the command \
                         for longer than settle_ms",
                    ),
                    Condition::NoFresh => (
                        FeedbackStatus::Unconfirmed,
                        "no fresh feedback value for longer than settle_ms",
                    ),
                };
                // Agreement is taken at once; disagreement and silence only
                // once they have lasted settle_ms.
                let lasted = condition == Condition::Within
                    || now.saturating_duration_since(since) >= spec.settle;
                if self.status == Some(status) || !lasted {
                    return None;
                }
                let took = ms(now.saturating_duration_since(self.commanded_at));
                Some(self.conclude(spec, status, Stage::Hold, took, reason))
            }
        }
    }

    /// Adds the cross-check sensor's fresh value; whether its rate of
    /// change is known and out of tolerance of what the command implies.
    fn cross_out(&mut self, check: &CrossCheckSpec, latest: Option<(f64, Instant)>) -> bool {
        // Only values since the command: the rate of the old one is not
        // evidence against the new one.
        match latest.filter(|(_, at)| *at > self.commanded_at) {
            Some((value, at)) => self.rates.add(value, at, check.window),
            // Silent: the rate is unknown, not zero.
            None => {
                self.rates.clear();
                self.cross = None;
                return false;
            }
        }
        let Some(rate) = self.rates.rate(check.window) else {
            return false;
        };
        let expected = check.expected_rate(self.commanded);
        self.cross = Some(CrossReading {
            sensor_rate: rate,
            expected_rate: expected,
        });
        (rate - expected).abs() > check.tolerance
    }

    /// What `on_mismatch` does about `verdict`, the actuator being at its
    /// safe value or not. Only a mismatch does anything; going safe when
    /// it is safe already does nothing more.
    pub fn action(
        spec: &FeedbackSpec,
        verdict: &Verdict,
        at_safe_value: bool,
    ) -> Option<MismatchAction> {
        if verdict.status != FeedbackStatus::Mismatch {
            return None;
        }
        match spec.on_mismatch {
            OnMismatch::Alarm => None,
            OnMismatch::Safe => (!at_safe_value).then_some(MismatchAction::DriveSafe),
            OnMismatch::Stop => Some(MismatchAction::LatchStop),
        }
    }

    /// The actuator's mismatch alarm.
    pub fn alarm(&self) -> bool {
        self.alarm
    }

    pub fn episode(&self) -> u64 {
        self.episode
    }

    pub fn view(&self) -> FeedbackView {
        FeedbackView {
            status: self.status,
            measured: self.measured,
            expected: (self.phase != Phase::Idle).then_some(self.expected),
            alarm: self.alarm,
        }
    }

    /// The first verdict of `episode` still kept.
    pub fn first_of(&self, episode: u64) -> Option<&Verdict> {
        self.verdicts.iter().find(|v| v.episode == episode)
    }

    /// The latest verdict of `episode` still kept.
    fn latest_of(&self, episode: u64) -> Option<&Verdict> {
        self.verdicts.iter().rev().find(|v| v.episode == episode)
    }

    /// A verdict of the current episode, without changing the state.
    fn verdict(
        &self,
        spec: &FeedbackSpec,
        status: FeedbackStatus,
        stage: Stage,
        settled_ms: u64,
        reason: &'static str,
    ) -> Verdict {
        Verdict {
            episode: self.episode,
            status,
            commanded: self.commanded,
            expected: self.expected,
            measured: self.measured,
            tolerance: spec.tolerance,
            settled_ms,
            stage,
            reason,
            cross_check: self.cross,
        }
    }

    /// Records `status` as the current episode's verdict (the alarm with it).
    fn conclude(
        &mut self,
        spec: &FeedbackSpec,
        status: FeedbackStatus,
        stage: Stage,
        settled_ms: u64,
        reason: &'static str,
    ) -> Verdict {
        self.status = Some(status);
        match status {
            FeedbackStatus::Mismatch => self.alarm = true,
            FeedbackStatus::Confirmed if self.clears_alarm => self.alarm = false,
            _ => {}
        }
        let verdict = self.verdict(spec, status, stage, settled_ms, reason);
        self.keep(verdict.clone());
        verdict
    }

    /// Keeps `verdict` for callers still to read it, dropping the oldest.
    fn keep(&mut self, verdict: Verdict) {
        if self.verdicts.len() == HISTORY {
            self.verdicts.pop_front();
        }
        self.verdicts.push_back(verdict);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> FeedbackSpec {
        FeedbackSpec {
            sensor: "wheel_speed".into(),
            tolerance: 0.05,
            settle: Duration::from_millis(500),
            scale: 1.0,
            offset: 0.0,
            on_mismatch: OnMismatch::Alarm,
            fresh_within: Some(Duration::from_millis(500)),
            cross_check: None,
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A healthy value that arrived at `at`.
    fn fresh(value: f64, at: Instant) -> Sample {
        Sample {
            latest: Some((value, at)),
            healthy: true,
        }
    }

    fn episode(started: Started) -> u64 {
        match started {
            Started::Watching { episode } | Started::Settling { episode } => episode,
            Started::Standing(v) => panic!("a new watch expected, got {v:?}"),
        }
    }

    #[test]
    fn nothing_is_judged_before_the_first_command() {
        let t0 = Instant::now();
        let mut w = Watch::new(t0);
        assert_eq!(w.step(&spec(), fresh(1.0, t0), t0 + ms(10_000)), None);
        assert_eq!(w.view().status, None);
        assert_eq!(w.view().expected, None);
        assert!(!w.alarm());
    }

    #[test]
    fn a_fresh_value_within_tolerance_confirms_at_once_with_the_time_it_took() {
        let t0 = Instant::now();
        let s = spec();
        let mut w = Watch::new(t0);
        let (started, replaced) = w.command(&s, 0.3, false, t0);
        let e = episode(started);
        assert_eq!(replaced, None);
        assert_eq!(w.view().status, Some(FeedbackStatus::Settling));
        // Still accelerating: not yet, and no verdict before settle_ms.
        assert_eq!(w.step(&s, fresh(0.1, t0 + ms(20)), t0 + ms(20)), None);
        let v = w
            .step(&s, fresh(0.27, t0 + ms(40)), t0 + ms(41))
            .expect("confirmed");
        assert_eq!(v.status, FeedbackStatus::Confirmed);
        assert_eq!((v.episode, v.commanded, v.expected), (e, 0.3, 0.3));
        assert_eq!(v.measured, Some(0.27));
        assert_eq!(
            v.settled_ms, 40,
            "from the command to the value that agreed"
        );
        assert_eq!(v.stage, Stage::Command);
        assert_eq!(w.first_of(e), Some(&v));
        // Nothing new while it stays within tolerance.
        assert_eq!(w.step(&s, fresh(0.31, t0 + ms(60)), t0 + ms(60)), None);
    }

    #[test]
    fn scale_and_offset_turn_the_command_into_the_expected_reading() {
        let t0 = Instant::now();
        // 0-1 duty cycle read back as 0-3000 rpm, 100 rpm at rest.
        let s = FeedbackSpec {
            tolerance: 50.0,
            scale: 2900.0,
            offset: 100.0,
            ..spec()
        };
        let mut w = Watch::new(t0);
        w.command(&s, 0.5, false, t0);
        assert_eq!(w.view().expected, Some(1550.0));
        assert_eq!(w.step(&s, fresh(0.5, t0 + ms(5)), t0 + ms(5)), None);
        let v = w.step(&s, fresh(1520.0, t0 + ms(9)), t0 + ms(9)).unwrap();
        assert_eq!(v.status, FeedbackStatus::Confirmed);
    }

    #[test]
    fn a_value_from_before_the_command_is_no_evidence() {
        let t0 = Instant::now();
        let s = spec();
        let mut w = Watch::new(t0);
        // The sensor read 0.3 before; the command asks 0.3 now.
        let old = fresh(0.3, t0);
        w.command(&s, 0.3, false, t0 + ms(1));
        assert_eq!(w.step(&s, old, t0 + ms(100)), None);
        assert_eq!(w.step(&s, old, t0 + ms(500)), None, "settle_ms not over");
        let v = w
            .step(&s, old, t0 + ms(501))
            .expect("a verdict at settle_ms");
        assert_eq!(v.status, FeedbackStatus::Unconfirmed);
        assert_eq!(v.measured, Some(0.3), "the latest value, stale as it is");
        assert_eq!(v.settled_ms, 500);
        assert!(!w.alarm(), "unconfirmed is no alarm");
    }

    #[test]
    fn an_unhealthy_sensor_gives_unconfirmed_and_no_sensor_value_gives_none_measured() {
        let t0 = Instant::now();
        let s = spec();
        let mut w = Watch::new(t0);
        w.command(&s, 0.3, false, t0);
        let stale = Sample {
            latest: Some((0.3, t0 + ms(10))),
            healthy: false,
        };
        assert_eq!(w.step(&s, stale, t0 + ms(10)), None);
        let v = w.step(&s, stale, t0 + ms(500)).unwrap();
        assert_eq!(v.status, FeedbackStatus::Unconfirmed);
        let mut silent = Watch::new(t0);
        silent.command(&s, 0.3, false, t0);
        let v = silent.step(&s, Sample::default(), t0 + ms(600)).unwrap();
        assert_eq!((v.status, v.measured), (FeedbackStatus::Unconfirmed, None));
    }

    #[test]
    fn fresh_values_that_disagree_are_a_mismatch_exactly_at_settle_ms_and_raise_the_alarm() {
        let t0 = Instant::now();
        let s = spec();
        let mut w = Watch::new(t0);
        w.command(&s, 0.3, false, t0);
        for t in (20..500).step_by(20) {
            assert_eq!(w.step(&s, fresh(0.0, t0 + ms(t)), t0 + ms(t)), None, "{t}");
        }
        assert!(!w.alarm());
        let v = w.step(&s, fresh(0.0, t0 + ms(500)), t0 + ms(500)).unwrap();
        assert_eq!(v.status, FeedbackStatus::Mismatch);
        assert_eq!(
            (v.commanded, v.measured, v.settled_ms),
            (0.3, Some(0.0), 500)
        );
        assert!(w.alarm());
        assert_eq!(w.view().status, Some(FeedbackStatus::Mismatch));
        // It stays a mismatch without repeating itself.
        assert_eq!(w.step(&s, fresh(0.0, t0 + ms(520)), t0 + ms(520)), None);
        // A fresh value earlier counts even if the last one is stale.
        let mut w = Watch::new(t0);
        w.command(&s, 0.3, false, t0);
        w.step(&s, fresh(0.0, t0 + ms(20)), t0 + ms(20));
        let stale = Sample {
            latest: Some((0.0, t0 + ms(20))),
            healthy: false,
        };
        let v = w.step(&s, stale, t0 + ms(500)).unwrap();
        assert_eq!(v.status, FeedbackStatus::Mismatch);
    }

    #[test]
    fn while_held_a_drift_longer_than_settle_ms_is_a_mismatch_and_a_shorter_one_is_not() {
        let t0 = Instant::now();
        let s = spec();
        let mut w = Watch::new(t0);
        w.command(&s, 0.3, false, t0);
        w.step(&s, fresh(0.3, t0 + ms(20)), t0 + ms(20)).unwrap();
        // A bump: out for 400 ms, back in.
        assert_eq!(w.step(&s, fresh(0.1, t0 + ms(1000)), t0 + ms(1000)), None);
        assert_eq!(w.step(&s, fresh(0.1, t0 + ms(1400)), t0 + ms(1400)), None);
        assert_eq!(w.step(&s, fresh(0.3, t0 + ms(1420)), t0 + ms(1420)), None);
        // A stall: out from 2000 on.
        assert_eq!(w.step(&s, fresh(0.0, t0 + ms(2000)), t0 + ms(2000)), None);
        assert_eq!(w.step(&s, fresh(0.0, t0 + ms(2499)), t0 + ms(2499)), None);
        let v = w
            .step(&s, fresh(0.0, t0 + ms(2500)), t0 + ms(2500))
            .unwrap();
        assert_eq!((v.status, v.stage), (FeedbackStatus::Mismatch, Stage::Hold));
        assert_eq!(v.settled_ms, 2500, "since the command");
        assert!(w.alarm());
        // Moving again: confirmed at once, and the alarm clears (a command
        // of someone else's, not a safe drive).
        let v = w
            .step(&s, fresh(0.29, t0 + ms(3000)), t0 + ms(3000))
            .unwrap();
        assert_eq!(
            (v.status, v.stage),
            (FeedbackStatus::Confirmed, Stage::Hold)
        );
        assert!(!w.alarm());
    }

    #[test]
    fn feedback_lost_while_held_is_unconfirmed_after_settle_ms_and_found_again_confirmed() {
        let t0 = Instant::now();
        let s = spec();
        let mut w = Watch::new(t0);
        w.command(&s, 0.3, false, t0);
        w.step(&s, fresh(0.3, t0 + ms(20)), t0 + ms(20)).unwrap();
        let lost = Sample {
            latest: Some((0.3, t0 + ms(20))),
            healthy: false,
        };
        assert_eq!(w.step(&s, lost, t0 + ms(1000)), None);
        let v = w.step(&s, lost, t0 + ms(1500)).unwrap();
        assert_eq!(v.status, FeedbackStatus::Unconfirmed);
        assert!(!w.alarm());
        let v = w
            .step(&s, fresh(0.3, t0 + ms(1600)), t0 + ms(1600))
            .unwrap();
        assert_eq!(v.status, FeedbackStatus::Confirmed);
        // After an unconfirmed command, fresh disagreement for settle_ms
        // is a mismatch.
        let mut w = Watch::new(t0);
        w.command(&s, 0.3, false, t0);
        w.step(&s, Sample::default(), t0 + ms(500)).unwrap();
        assert_eq!(w.step(&s, fresh(0.0, t0 + ms(600)), t0 + ms(600)), None);
        let v = w
            .step(&s, fresh(0.0, t0 + ms(1100)), t0 + ms(1100))
            .unwrap();
        assert_eq!(v.status, FeedbackStatus::Mismatch);
    }

    #[test]
    fn only_a_confirmed_command_clears_the_alarm_not_rozds_own_safe_drive() {
        let t0 = Instant::now();
        let s = spec();
        let mut w = Watch::new(t0);
        w.command(&s, 0.3, false, t0);
        w.step(&s, fresh(0.0, t0 + ms(500)), t0 + ms(500)).unwrap();
        assert!(w.alarm());
        // on_mismatch = "safe": rozd drives 0; the stuck drive reads 0.
        let (started, _) = w.command(&s, 0.0, true, t0 + ms(501));
        let e = episode(started);
        let v = w.step(&s, fresh(0.0, t0 + ms(520)), t0 + ms(520)).unwrap();
        assert_eq!((v.episode, v.status), (e, FeedbackStatus::Confirmed));
        assert!(w.alarm(), "a stuck drive is confirmed at 0: still stuck");
        // Someone commands 0 themselves: the same expectation goes on, and
        // their command is confirmed already.
        let (started, replaced) = w.command(&s, 0.0, false, t0 + ms(600));
        assert_eq!(started, Started::Standing(v));
        assert_eq!(replaced, None);
        assert!(!w.alarm());
    }

    #[test]
    fn a_new_command_before_the_verdict_ends_the_old_one_unconfirmed_and_a_renewal_continues() {
        let t0 = Instant::now();
        let s = spec();
        let mut w = Watch::new(t0);
        let first = episode(w.command(&s, 0.3, false, t0).0);
        // The same value again (a renewed hold): the same watch.
        let (again, replaced) = w.command(&s, 0.3, false, t0 + ms(50));
        assert_eq!(again, Started::Settling { episode: first });
        assert_eq!(replaced, None);
        let (second, replaced) = w.command(&s, 0.1, false, t0 + ms(100));
        let replaced = replaced.expect("the first command's verdict");
        assert_eq!(
            (replaced.episode, replaced.status, replaced.settled_ms),
            (first, FeedbackStatus::Unconfirmed, 100)
        );
        assert!(replaced.reason.contains("replaced"));
        assert_eq!(w.first_of(first), Some(&replaced), "its caller reads it");
        let second = episode(second);
        assert_ne!(second, first);
        // The settle window restarts with the new command.
        assert_eq!(w.step(&s, Sample::default(), t0 + ms(550)), None);
        let v = w.step(&s, Sample::default(), t0 + ms(600)).unwrap();
        assert_eq!(v.episode, second);
        // Once judged, a new command starts a new watch with no verdict on
        // the old one.
        assert_eq!(w.command(&s, 0.2, false, t0 + ms(700)).1, None);
    }

    #[test]
    fn on_mismatch_decides_what_follows_a_mismatch_and_nothing_else() {
        let t0 = Instant::now();
        let mut w = Watch::new(t0);
        let s = spec();
        w.command(&s, 0.3, false, t0);
        let mismatch = w.step(&s, fresh(0.0, t0 + ms(500)), t0 + ms(500)).unwrap();
        let with = |on_mismatch| FeedbackSpec {
            on_mismatch,
            ..spec()
        };
        assert_eq!(
            Watch::action(&with(OnMismatch::Alarm), &mismatch, false),
            None
        );
        assert_eq!(
            Watch::action(&with(OnMismatch::Safe), &mismatch, false),
            Some(MismatchAction::DriveSafe)
        );
        // Already safe: driving it again changes nothing.
        assert_eq!(
            Watch::action(&with(OnMismatch::Safe), &mismatch, true),
            None
        );
        // A safe value that does not take (a runaway) still stops.
        assert_eq!(
            Watch::action(&with(OnMismatch::Stop), &mismatch, true),
            Some(MismatchAction::LatchStop)
        );
        let confirmed = Verdict {
            status: FeedbackStatus::Confirmed,
            ..mismatch.clone()
        };
        let unconfirmed = Verdict {
            status: FeedbackStatus::Unconfirmed,
            ..mismatch
        };
        for on_mismatch in [OnMismatch::Alarm, OnMismatch::Safe, OnMismatch::Stop] {
            assert_eq!(Watch::action(&with(on_mismatch), &confirmed, false), None);
            assert_eq!(Watch::action(&with(on_mismatch), &unconfirmed, false), None);
        }
    }

    #[test]
    fn a_feedback_sensor_without_stale_after_that_stops_reporting_while_held_is_unconfirmed() {
        let t0 = Instant::now();
        // The sensor has no stale_after_ms: its source says healthy forever,
        // so only the watch's own bound (settle_ms) can see it is silent.
        let s = spec();
        assert_eq!(s.fresh_within, Some(s.settle));
        let mut w = Watch::new(t0);
        w.command(&s, 0.3, false, t0);
        w.step(&s, fresh(0.3, t0 + ms(20)), t0 + ms(20)).unwrap();
        // Its last value, still "healthy", ever older.
        let last = fresh(0.3, t0 + ms(20));
        assert_eq!(w.step(&s, last, t0 + ms(520)), None, "fresh until 520");
        assert_eq!(w.step(&s, last, t0 + ms(521)), None, "silent from 521");
        assert_eq!(w.step(&s, last, t0 + ms(1020)), None, "not yet settle_ms");
        let v = w
            .step(&s, last, t0 + ms(1021))
            .expect("silent for settle_ms");
        assert_eq!(
            (v.status, v.stage),
            (FeedbackStatus::Unconfirmed, Stage::Hold)
        );
        assert!(v.reason.contains("no fresh"), "{v:?}");
        assert!(
            !w.alarm(),
            "silence is no mismatch, and no on_mismatch action"
        );
        assert_eq!(Watch::action(&s, &v, false), None);
        assert_eq!(w.view().status, Some(FeedbackStatus::Unconfirmed));
        // Reporting again: confirmed at once.
        let v = w
            .step(&s, fresh(0.3, t0 + ms(1100)), t0 + ms(1100))
            .unwrap();
        assert_eq!(v.status, FeedbackStatus::Confirmed);
        // A longer bound of the sensor's own (stale_after_ms) is kept.
        let patient = FeedbackSpec {
            fresh_within: Some(ms(2000)),
            ..spec()
        };
        let mut w = Watch::new(t0);
        w.command(&patient, 0.3, false, t0);
        w.step(&patient, fresh(0.3, t0 + ms(20)), t0 + ms(20))
            .unwrap();
        assert_eq!(w.step(&patient, last, t0 + ms(1021)), None, "still fresh");
        assert_eq!(
            w.step(&patient, last, t0 + ms(2021)),
            None,
            "silent from 2021"
        );
        assert_eq!(w.step(&patient, last, t0 + ms(2520)), None);
        let v = w.step(&patient, last, t0 + ms(2521)).unwrap();
        assert_eq!(v.status, FeedbackStatus::Unconfirmed);
    }

    fn cross_checked() -> FeedbackSpec {
        FeedbackSpec {
            cross_check: Some(CrossCheckSpec {
                sensor: "odometry".into(),
                scale: 1.0,
                magnitude: true,
                tolerance: 0.05,
                window: ms(500),
            }),
            ..spec()
        }
    }

    #[test]
    fn a_held_value_whose_cross_check_rate_disagrees_is_a_mismatch_while_the_feedback_agrees() {
        let t0 = Instant::now();
        let s = cross_checked();
        let mut w = Watch::new(t0);
        w.command(&s, -0.3, false, t0);
        // wheel_speed echoes -0.3; odometry grows 0.3 m/s (a magnitude)
        // for 1 s, then stops: the rover is stuck, the echo goes on.
        let odometry = |t: u64| 0.3 * (t.min(1000) as f64) / 1000.0;
        let mut verdicts = Vec::new();
        for t in (20..=3000).step_by(20) {
            let at = t0 + ms(t);
            if let Some(v) = w.step_checked(&s, fresh(-0.3, at), Some(fresh(odometry(t), at)), at) {
                verdicts.push((t, v));
            }
        }
        assert_eq!(verdicts.len(), 2, "{verdicts:?}");
        let (t, confirmed) = &verdicts[0];
        assert_eq!((*t, confirmed.status), (20, FeedbackStatus::Confirmed));
        assert_eq!(confirmed.cross_check, None, "no window of values yet");
        let (t, mismatch) = &verdicts[1];
        // The rate over the last 500 ms leaves 0.3 ± 0.05 once more than
        // 1/6 of the window is standing still (t > 1083), and a mismatch
        // after it has been out for settle_ms.
        assert!((1580..=1620).contains(t), "at {t}");
        assert_eq!(
            (mismatch.status, mismatch.stage),
            (FeedbackStatus::Mismatch, Stage::Hold)
        );
        assert!(mismatch.reason.contains("cross-check"), "{mismatch:?}");
        assert_eq!(mismatch.measured, Some(-0.3), "the echo agrees");
        let cross = mismatch.cross_check.expect("the rate it judged");
        assert_eq!(cross.expected_rate, 0.3);
        assert!(cross.sensor_rate < 0.25, "{cross:?}");
        assert!(w.alarm());
        // The same drive with the cross-check sensor silent judges nothing
        // by it: the echo confirms, as it would without a cross-check.
        let mut w = Watch::new(t0);
        w.command(&s, -0.3, false, t0);
        for t in (20..=3000).step_by(20) {
            let at = t0 + ms(t);
            let v = w.step_checked(&s, fresh(-0.3, at), Some(Sample::default()), at);
            assert!(v.is_none() || t == 20, "{t}: {v:?}");
        }
        assert_eq!(w.view().status, Some(FeedbackStatus::Confirmed));
    }

    #[test]
    fn a_cross_check_rate_counts_only_values_since_the_command() {
        let t0 = Instant::now();
        let s = cross_checked();
        let mut w = Watch::new(t0);
        // Standing still at 0, confirmed and the rate (0) agrees.
        w.command(&s, 0.0, false, t0);
        let mut odo = 0.0;
        for t in (20..=1000).step_by(20) {
            let at = t0 + ms(t);
            w.step_checked(&s, fresh(0.0, at), Some(fresh(odo, at)), at);
        }
        assert_eq!(w.view().status, Some(FeedbackStatus::Confirmed));
        // Then 0.3, carried out at once: the standstill before the command
        // must not count against it.
        w.command(&s, 0.3, false, t0 + ms(1000));
        for t in (1020..=4000).step_by(20) {
            odo += 0.3 * 0.02;
            let at = t0 + ms(t);
            let v = w.step_checked(&s, fresh(0.3, at), Some(fresh(odo, at)), at);
            assert!(
                v.as_ref()
                    .is_none_or(|v| v.status == FeedbackStatus::Confirmed),
                "{t}: {v:?}"
            );
        }
        assert_eq!(w.view().status, Some(FeedbackStatus::Confirmed));
        assert!(!w.alarm());
    }

    #[test]
    fn old_verdicts_make_room_for_new_ones() {
        let t0 = Instant::now();
        let s = spec();
        let mut w = Watch::new(t0);
        let first = episode(w.command(&s, 0.0, false, t0).0);
        w.step(&s, fresh(0.0, t0 + ms(1)), t0 + ms(1)).unwrap();
        for i in 1..=HISTORY as u64 {
            let value = if i % 2 == 0 { 0.0 } else { 0.5 };
            w.command(&s, value, false, t0 + ms(10 * i));
            w.step(&s, fresh(value, t0 + ms(10 * i + 1)), t0 + ms(10 * i + 1))
                .unwrap();
        }
        assert_eq!(w.first_of(first), None);
        assert!(w.first_of(w.episode()).is_some());
    }
}
