//! The fleet stop's rules: which command on `<prefix>/estop/<environment>`
//! latches this host's stop and which one clears the fleet's stop. Plain
//! data and methods, no I/O; the wall clock is an argument.
//!
//! - **Anyone may stop.** Every command that asks to stop latches, sealed
//!   or not, fresh or not (a bare `stop` from `mosquitto_pub`, a command
//!   from a host with the wrong key, a replayed old command).
//! - **Only the fleet clears.** A clear must be authentic (its MAC verified
//!   under the fleet key; see `seal`) and fresh:
//!   - it carries its issue time `at_ms`, within [`MAX_CLOCK_SKEW_MS`] of
//!     this host's clock (neither from the future nor older than that);
//!   - it is not older than a command this host already applied;
//!   - it was issued after the fleet stop it would clear (the stop
//!     command's own `at_ms`, or the local time at which an unauthenticated
//!     or late stop latched, or — after a restart — the time the latch
//!     says it latched).
//!
//!   So a recorded clear republished later cannot undo a newer stop, and a
//!   clear that is no longer fresh leaves the host stopped (the safe side:
//!   clear it again, which issues a new command).
//! - Each authentic command is applied once (by its `id`): the broker's
//!   redelivery of the retained command after a reconnection changes
//!   nothing, so a host cleared locally does not latch again.

use super::record::EstopCommand;

/// How far a clear's issue time may be from this host's clock, either way.
/// Fleet hosts keep their clocks synchronised (NTP) well within this.
pub const MAX_CLOCK_SKEW_MS: i64 = 5 * 60 * 1000;

/// How a stop that latches came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopKind {
    /// Sealed with the fleet key and fresh: its `by` and `reason` are
    /// trustworthy.
    Authentic,
    /// Sealed with the fleet key but not fresh (a replay or a very late
    /// delivery): it latches, its `by` names who first issued it.
    Replayed,
    /// Not sealed with the fleet key: it latches, and nothing in it is
    /// trusted.
    Unauthenticated,
}

/// Why a command was not applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("a clear without a valid MAC (only fleet members can clear a fleet stop)")]
    Unauthenticated,
    #[error("a clear without an issue time (at_ms)")]
    NoIssueTime,
    #[error(
        "a clear issued at {at_ms}, more than {} s ahead of this host's clock ({now_ms})",
        MAX_CLOCK_SKEW_MS / 1000
    )]
    Future { at_ms: i64, now_ms: i64 },
    #[error(
        "a clear issued at {at_ms}, more than {} s before this host's clock ({now_ms}): too old",
        MAX_CLOCK_SKEW_MS / 1000
    )]
    TooOld { at_ms: i64, now_ms: i64 },
    #[error("a clear issued at {at_ms}, before the newest command this host applied ({newest_ms})")]
    OlderThanApplied { at_ms: i64, newest_ms: i64 },
    #[error("a clear issued at {at_ms}, not after the fleet stop it would clear ({stop_ms})")]
    BeforeStop { at_ms: i64, stop_ms: i64 },
}

/// What to do with a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Latch the protective stop (source `fleet`).
    Stop(StopKind),
    /// Clear the stop the fleet set.
    Clear,
    /// Applied before (the same `id`): nothing to do.
    AlreadyApplied,
    Refused(Refusal),
}

/// The fleet stop's state on one host: what it applied and since when the
/// fleet's stop holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopGate {
    /// The `id` of the latest authentic command applied.
    last_id: Option<String>,
    /// The issue time of the newest authentic command applied.
    newest_at_ms: Option<i64>,
    /// When the latest fleet stop was issued (or latched, for one whose
    /// issue time is not trusted). Only grows.
    stop_at_ms: Option<i64>,
}

impl StopGate {
    pub fn new() -> StopGate {
        StopGate::default()
    }

    /// Decides on `command` received on this host's stop topic.
    /// `authentic`: its MAC verified. `fleet_latched_since`: when this
    /// host's stop from the fleet latched, if it holds one (used when the
    /// stop command itself was not seen, e.g. after a restart).
    pub fn decide(
        &mut self,
        command: &EstopCommand,
        authentic: bool,
        now_ms: i64,
        fleet_latched_since: Option<i64>,
    ) -> Verdict {
        if !authentic {
            if command.stop {
                self.stopped_at(now_ms);
                return Verdict::Stop(StopKind::Unauthenticated);
            }
            return Verdict::Refused(Refusal::Unauthenticated);
        }
        if let Some(id) = &command.id
            && self.last_id.as_deref() == Some(id.as_str())
        {
            return Verdict::AlreadyApplied;
        }
        let fresh = self.fresh(command.at_ms, now_ms);
        if command.stop {
            return Verdict::Stop(match fresh {
                Ok(at_ms) => {
                    self.applied(command, at_ms);
                    self.stopped_at(at_ms);
                    StopKind::Authentic
                }
                Err(_) => {
                    // Its issue time says nothing about now: the stop
                    // holds from the moment it latched here.
                    self.stopped_at(now_ms);
                    StopKind::Replayed
                }
            });
        }
        let at_ms = match fresh {
            Ok(at_ms) => at_ms,
            Err(refusal) => return Verdict::Refused(refusal),
        };
        if let Some(stop_ms) = self.stop_at_ms.or(fleet_latched_since)
            && at_ms <= stop_ms
        {
            return Verdict::Refused(Refusal::BeforeStop { at_ms, stop_ms });
        }
        self.applied(command, at_ms);
        Verdict::Clear
    }

    /// This host published `command` (and applied it itself): its echo
    /// from the broker is [`Verdict::AlreadyApplied`].
    pub fn published(&mut self, command: &EstopCommand, now_ms: i64) {
        let at_ms = command.at_ms.unwrap_or(now_ms);
        self.applied(command, at_ms);
        if command.stop {
            self.stopped_at(at_ms);
        }
    }

    fn fresh(&self, at_ms: Option<i64>, now_ms: i64) -> Result<i64, Refusal> {
        let Some(at_ms) = at_ms else {
            return Err(Refusal::NoIssueTime);
        };
        if at_ms > now_ms.saturating_add(MAX_CLOCK_SKEW_MS) {
            return Err(Refusal::Future { at_ms, now_ms });
        }
        if at_ms < now_ms.saturating_sub(MAX_CLOCK_SKEW_MS) {
            return Err(Refusal::TooOld { at_ms, now_ms });
        }
        if let Some(newest_ms) = self.newest_at_ms
            && at_ms < newest_ms
        {
            return Err(Refusal::OlderThanApplied { at_ms, newest_ms });
        }
        Ok(at_ms)
    }

    fn applied(&mut self, command: &EstopCommand, at_ms: i64) {
        self.last_id.clone_from(&command.id);
        self.newest_at_ms = Some(self.newest_at_ms.map_or(at_ms, |n| n.max(at_ms)));
    }

    fn stopped_at(&mut self, at_ms: i64) {
        self.stop_at_ms = Some(self.stop_at_ms.map_or(at_ms, |s| s.max(at_ms)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: i64 = 1_800_000_000_000;
    const MIN: i64 = 60_000;

    fn cmd(stop: bool, id: &str, at_ms: Option<i64>) -> EstopCommand {
        EstopCommand {
            stop,
            reason: String::new(),
            by: Some("a".into()),
            id: Some(id.into()),
            at_ms,
        }
    }

    #[test]
    fn a_fresh_clear_after_the_stop_clears_once() {
        let mut g = StopGate::new();
        assert_eq!(
            g.decide(&cmd(true, "s1", Some(T)), true, T + 5, None),
            Verdict::Stop(StopKind::Authentic)
        );
        // the broker redelivers the retained stop: applied once
        assert_eq!(
            g.decide(&cmd(true, "s1", Some(T)), true, T + 9, None),
            Verdict::AlreadyApplied
        );
        assert_eq!(
            g.decide(&cmd(false, "c1", Some(T + MIN)), true, T + MIN, None),
            Verdict::Clear
        );
        assert_eq!(
            g.decide(&cmd(false, "c1", Some(T + MIN)), true, T + MIN, None),
            Verdict::AlreadyApplied
        );
    }

    #[test]
    fn anyone_may_stop_nobody_else_may_clear() {
        let mut g = StopGate::new();
        let mut bare = cmd(true, "x", None);
        bare.by = Some("mallory".into());
        assert_eq!(
            g.decide(&bare, false, T, None),
            Verdict::Stop(StopKind::Unauthenticated)
        );
        // the same id again still latches: an unauthenticated id means nothing
        assert_eq!(
            g.decide(&bare, false, T, None),
            Verdict::Stop(StopKind::Unauthenticated)
        );
        assert_eq!(
            g.decide(&cmd(false, "x", Some(T + MIN)), false, T + MIN, None),
            Verdict::Refused(Refusal::Unauthenticated)
        );
        // an authentic clear issued after the bare stop latched clears it
        assert_eq!(
            g.decide(&cmd(false, "c", Some(T + 1)), true, T + 2, None),
            Verdict::Clear
        );
    }

    #[test]
    fn a_replayed_clear_does_not_undo_a_newer_stop() {
        let mut g = StopGate::new();
        let old_stop = cmd(true, "s1", Some(T));
        let old_clear = cmd(false, "c1", Some(T + MIN));
        assert_eq!(
            g.decide(&old_stop, true, T, None),
            Verdict::Stop(StopKind::Authentic)
        );
        assert_eq!(g.decide(&old_clear, true, T + MIN, None), Verdict::Clear);
        let new_stop = cmd(true, "s2", Some(T + 2 * MIN));
        assert_eq!(
            g.decide(&new_stop, true, T + 2 * MIN, None),
            Verdict::Stop(StopKind::Authentic)
        );
        assert_eq!(
            g.decide(&old_clear, true, T + 3 * MIN, None),
            Verdict::Refused(Refusal::OlderThanApplied {
                at_ms: T + MIN,
                newest_ms: T + 2 * MIN
            })
        );
        // replayed much later: too old
        assert!(matches!(
            g.decide(&old_clear, true, T + 60 * MIN, None),
            Verdict::Refused(Refusal::TooOld { .. })
        ));
        // the old stop replayed still latches, and moves the stop's time on
        // to when it latched, so the old clear cannot follow it
        assert_eq!(
            g.decide(&old_stop, true, T + 4 * MIN, None),
            Verdict::Stop(StopKind::Replayed)
        );
        let fresh_clear = cmd(false, "c2", Some(T + 4 * MIN - 1));
        assert!(matches!(
            g.decide(&fresh_clear, true, T + 4 * MIN, None),
            Verdict::Refused(Refusal::BeforeStop { .. })
        ));
        assert_eq!(
            g.decide(
                &cmd(false, "c3", Some(T + 4 * MIN + 1)),
                true,
                T + 4 * MIN + 2,
                None
            ),
            Verdict::Clear
        );
    }

    #[test]
    fn a_clear_needs_a_sane_issue_time() {
        let mut g = StopGate::new();
        assert_eq!(
            g.decide(&cmd(false, "c", None), true, T, None),
            Verdict::Refused(Refusal::NoIssueTime)
        );
        assert!(matches!(
            g.decide(&cmd(false, "c", Some(T + 6 * MIN)), true, T, None),
            Verdict::Refused(Refusal::Future { .. })
        ));
        assert!(matches!(
            g.decide(&cmd(false, "c", Some(T - 6 * MIN)), true, T, None),
            Verdict::Refused(Refusal::TooOld { .. })
        ));
        // extreme values do not overflow
        assert!(matches!(
            g.decide(&cmd(false, "c", Some(i64::MAX)), true, i64::MAX - 1, None),
            Verdict::Clear | Verdict::Refused(_)
        ));
        assert!(matches!(
            g.decide(&cmd(false, "d", Some(i64::MIN)), true, i64::MIN + 1, None),
            Verdict::Clear | Verdict::Refused(_)
        ));
    }

    #[test]
    fn after_a_restart_the_latch_time_stands_for_the_unseen_stop() {
        let mut g = StopGate::new();
        let since = T;
        assert!(matches!(
            g.decide(&cmd(false, "c", Some(T - 1)), true, T + 1, Some(since)),
            Verdict::Refused(Refusal::BeforeStop { .. })
        ));
        assert_eq!(
            g.decide(&cmd(false, "c2", Some(T + 1)), true, T + 2, Some(since)),
            Verdict::Clear
        );
    }

    #[test]
    fn what_this_host_published_is_not_applied_again() {
        let mut g = StopGate::new();
        let stop = cmd(true, "s", Some(T));
        g.published(&stop, T);
        assert_eq!(g.decide(&stop, true, T + 1, None), Verdict::AlreadyApplied);
        // a replayed clear from before this host's stop does not clear it
        assert!(matches!(
            g.decide(&cmd(false, "old", Some(T - 1)), true, T + 1, None),
            Verdict::Refused(_)
        ));
    }
}
