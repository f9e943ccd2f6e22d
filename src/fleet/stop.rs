//! The fleet stop's rules: which message on `<prefix>/estop/<environment>`
//! latches this host's stop and which one clears the fleet's stop. Plain
//! data and functions, no I/O; the wall clock is an argument.
//!
//! - **Everything but the fleet's clear stops.** Every message on the stop
//!   topic that is not an authentic, valid command ([`read`]) latches, with
//!   its [`Defect`] named in the stop's reason: a bare `stop` from
//!   `mosquitto_pub`, a command sealed with another fleet's key, an
//!   unsealed clear, a command too large to read, one that is not valid
//!   JSON or has a field of the wrong type (sealed or not), a clear without
//!   its issue time, and the empty message that deletes the retained
//!   command (hosts that are up latch; a host that joins later finds
//!   nothing, which is why the broker's ACL gives no one else write access
//!   to the topic). So a message that asks to stop never fails to stop for
//!   its form, and one that means to clear but is not a valid clear of the
//!   fleet stops too (the safe side: the fleet's next valid clear clears).
//!   An authentic stop latches too, fresh or not (a replay).
//! - **Only the fleet clears.** A clear must be authentic (its MAC verified
//!   under the fleet key; see `seal`), valid, and fresh:
//!   - it carries its issue time `at_ms`, within [`MAX_CLOCK_SKEW_MS`] of
//!     this host's clock (neither from the future nor older than that);
//!   - it is not older than a command this host already applied;
//!   - it was issued after the fleet stop it would clear (the stop
//!     command's own `at_ms`, or the local time at which an untrusted or
//!     late stop latched, or — after a restart — the time the latch says
//!     it latched).
//!
//!   So a recorded clear republished later cannot undo a newer stop, and a
//!   clear that is no longer fresh leaves the host stopped (the safe side:
//!   clear it again, which issues a new command). An authentic clear that
//!   is not fresh is not applied and does not latch: it is the fleet's own
//!   clear, only late (the retained clear a host sees when it starts an
//!   hour later).
//! - Each authentic command is applied once (by its `id`): the broker's
//!   redelivery of the retained command after a reconnection changes
//!   nothing, so a host cleared locally does not latch again; nor does the
//!   late echo of a stop this host published itself, even after it
//!   published a newer command (a stop and at once its clear). An untrusted
//!   message latches whenever it arrives (its `id` means nothing).

use super::record::{self, FleetStopCommand, Rejected};
use super::seal::{self, MessageKey, Unauthentic};

/// How far a clear's issue time may be from this host's clock, either way.
/// Fleet hosts keep their clocks synchronised (NTP) well within this.
pub(crate) const MAX_CLOCK_SKEW_MS: i64 = 5 * 60 * 1000;

/// A message on the stop topic, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Message {
    /// Sealed with the fleet key for this topic, and a valid command.
    Authentic(FleetStopCommand),
    /// Anything else: it latches (see the module), and nothing in it is
    /// trusted.
    Untrusted(Defect),
}

/// Why a message on the stop topic is not an authentic, valid command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Defect {
    /// Zero bytes: the broker's way of deleting the retained command.
    #[error("an empty message (it deletes the retained fleet command; it clears nothing)")]
    Empty,
    #[error("{len} bytes, more than the {max} bytes a command may have (not read)")]
    Oversized { len: usize, max: usize },
    /// A valid stop without the fleet's seal (`mosquitto_pub -m stop`).
    #[error("a stop without a valid MAC: {0}")]
    UnsealedStop(Unauthentic),
    /// A valid clear without the fleet's seal.
    #[error("a clear without a valid MAC: {0}; only the fleet's sealed clear clears")]
    UnsealedClear(Unauthentic),
    /// Not a valid command (`why`); `unsealed`: why it is not authentic
    /// either, if it is not (`None`: sealed with the fleet key).
    #[error("not a valid command: {why}{}", unsealed.as_ref().map(|u| format!("; and without a valid MAC: {u}")).unwrap_or_default())]
    Malformed {
        why: String,
        unsealed: Option<Unauthentic>,
    },
}

impl Defect {
    /// Who the message came from, as far as anything can be said.
    pub(crate) fn sender(&self) -> &'static str {
        match self {
            Defect::Empty | Defect::Oversized { .. } => "an MQTT publisher",
            Defect::UnsealedStop(_)
            | Defect::UnsealedClear(_)
            | Defect::Malformed {
                unsealed: Some(_), ..
            } => "an unauthenticated MQTT publisher",
            Defect::Malformed { unsealed: None, .. } => {
                "a fleet member (sealed with the fleet key)"
            }
        }
    }

    /// Whether it was sealed with the fleet key (then only its content is wrong).
    pub(crate) fn is_sealed(&self) -> bool {
        matches!(self, Defect::Malformed { unsealed: None, .. })
    }
}

/// Reads `payload`, received on the stop topic `topic`, with the fleet's
/// `key` (`None`: no key, nothing is authentic).
pub(crate) fn read(key: Option<&MessageKey>, topic: &str, payload: &[u8]) -> Message {
    if payload.is_empty() {
        return Message::Untrusted(Defect::Empty);
    }
    if payload.len() > record::MAX_COMMAND_BYTES {
        return Message::Untrusted(Defect::Oversized {
            len: payload.len(),
            max: record::MAX_COMMAND_BYTES,
        });
    }
    let opened = key.map_or(Err(Unauthentic::NotSealed), |key| {
        seal::open(key, topic, payload)
    });
    let (parsed, unsealed) = match opened {
        Ok(body) => (record::parse_command(body.as_bytes()), None),
        // Read only to name what it is; nothing in it is used.
        Err(why) => (record::parse_command(&seal::content(payload)), Some(why)),
    };
    let defect = match (parsed, unsealed) {
        (Ok(command), None) => return Message::Authentic(command),
        (Ok(command), Some(why)) if command.stop => Defect::UnsealedStop(why),
        (Ok(_), Some(why)) => Defect::UnsealedClear(why),
        (Err(Rejected::Oversized { len, max }), _) => Defect::Oversized { len, max },
        (Err(Rejected::Malformed(why)), unsealed) => Defect::Malformed { why, unsealed },
        (Err(other), unsealed) => Defect::Malformed {
            why: other.to_string(),
            unsealed,
        },
    };
    Message::Untrusted(defect)
}

/// How a stop that latches came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopKind {
    /// Sealed with the fleet key and fresh: its `by` and `reason` are
    /// trustworthy.
    Authentic,
    /// Sealed with the fleet key but not fresh (a replay or a very late
    /// delivery): it latches, its `by` names who first issued it.
    Replayed,
    /// Not an authentic, valid command ([`Message::Untrusted`]): it
    /// latches, and nothing in it is trusted.
    Untrusted,
}

/// Why an authentic command was not applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    #[error("a command without an issue time (at_ms)")]
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
pub(crate) enum Verdict {
    /// Latch the protective stop (source `fleet`).
    Stop(StopKind),
    /// Clear the stop the fleet set.
    Clear,
    /// Applied before (the same `id`): nothing to do.
    AlreadyApplied,
    Refused(Refusal),
}

/// How many of its own stops' ids a host remembers. The broker's echo of a
/// stop this host published can arrive after the host published a newer
/// command (a stop, then at once its clear: the stop comes back after the
/// clear was applied). It is this host's own stop, already applied, not a
/// late replay to latch again. (A late clear needs no such memory: one
/// older than a command applied is refused and latches nothing.)
pub(crate) const OWN_STOPS_REMEMBERED: usize = 32;

/// The fleet stop's state on one host: what it applied and since when the
/// fleet's stop holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct StopGate {
    /// The `id` of the latest authentic command applied.
    last_id: Option<String>,
    /// The `id`s of the latest stops this host published, newest last (at
    /// most [`OWN_STOPS_REMEMBERED`]).
    own_stop_ids: std::collections::VecDeque<String>,
    /// The issue time of the newest authentic command applied.
    newest_at_ms: Option<i64>,
    /// When the latest fleet stop was issued (or latched, for one whose
    /// issue time is not trusted). Only grows.
    stop_at_ms: Option<i64>,
}

impl StopGate {
    pub(crate) fn new() -> StopGate {
        StopGate::default()
    }

    /// Decides on `message` received on this host's stop topic.
    /// `fleet_latched_since`: when this host's stop from the fleet
    /// latched, if it holds one (used when the stop command itself was not
    /// seen, e.g. after a restart).
    pub(crate) fn decide(
        &mut self,
        message: &Message,
        now_ms: i64,
        fleet_latched_since: Option<i64>,
    ) -> Verdict {
        let command = match message {
            Message::Authentic(command) => command,
            Message::Untrusted(_) => {
                self.stopped_at(now_ms);
                return Verdict::Stop(StopKind::Untrusted);
            }
        };
        if let Some(id) = &command.id
            && (self.last_id.as_deref() == Some(id.as_str())
                || (command.stop && self.own_stop_ids.contains(id)))
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
    pub(crate) fn published(&mut self, command: &FleetStopCommand, now_ms: i64) {
        if let Some(id) = &command.id
            && command.stop
        {
            if self.own_stop_ids.len() == OWN_STOPS_REMEMBERED {
                self.own_stop_ids.pop_front();
            }
            self.own_stop_ids.push_back(id.clone());
        }
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

    fn applied(&mut self, command: &FleetStopCommand, at_ms: i64) {
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

    /// The gate's decision on `command`, as read authentic (sealed with
    /// the fleet key) or not.
    trait DecideCommand {
        fn decide_command(
            &mut self,
            command: &FleetStopCommand,
            authentic: bool,
            now_ms: i64,
            since: Option<i64>,
        ) -> Verdict;
    }

    impl DecideCommand for StopGate {
        fn decide_command(
            &mut self,
            command: &FleetStopCommand,
            authentic: bool,
            now_ms: i64,
            since: Option<i64>,
        ) -> Verdict {
            let message = match (authentic, command.stop) {
                (true, _) => Message::Authentic(command.clone()),
                (false, true) => Message::Untrusted(Defect::UnsealedStop(Unauthentic::NotSealed)),
                (false, false) => Message::Untrusted(Defect::UnsealedClear(Unauthentic::BadMac)),
            };
            self.decide(&message, now_ms, since)
        }
    }

    fn cmd(stop: bool, id: &str, at_ms: Option<i64>) -> FleetStopCommand {
        FleetStopCommand {
            stop,
            reason: String::new(),
            by: Some("a".into()),
            id: Some(id.into()),
            at_ms,
        }
    }

    #[test]
    fn the_late_echo_of_this_hosts_own_stop_after_its_clear_does_not_latch_again() {
        let mut g = StopGate::new();
        let stop = cmd(true, "own-s", Some(T));
        let clear = cmd(false, "own-c", Some(T + 10));
        g.published(&stop, T);
        g.published(&clear, T + 10);
        // The broker hands the stop back after the clear was applied here.
        assert_eq!(
            g.decide_command(&stop, true, T + 12, None),
            Verdict::AlreadyApplied
        );
        // The clear's own replay after a newer stop is refused (and
        // counted), as anyone's.
        g.published(&cmd(true, "own-s2", Some(T + 20)), T + 20);
        assert!(matches!(
            g.decide_command(&clear, true, T + 21, None),
            Verdict::Refused(_)
        ));
        // Another member's stop of that age is still a replay that latches.
        assert_eq!(
            g.decide_command(&cmd(true, "other-s", Some(T)), true, T + 14, None),
            Verdict::Stop(StopKind::Replayed)
        );
    }

    #[test]
    fn a_fresh_clear_after_the_stop_clears_once() {
        let mut g = StopGate::new();
        assert_eq!(
            g.decide_command(&cmd(true, "s1", Some(T)), true, T + 5, None),
            Verdict::Stop(StopKind::Authentic)
        );
        // the broker redelivers the retained stop: applied once
        assert_eq!(
            g.decide_command(&cmd(true, "s1", Some(T)), true, T + 9, None),
            Verdict::AlreadyApplied
        );
        assert_eq!(
            g.decide_command(&cmd(false, "c1", Some(T + MIN)), true, T + MIN, None),
            Verdict::Clear
        );
        assert_eq!(
            g.decide_command(&cmd(false, "c1", Some(T + MIN)), true, T + MIN, None),
            Verdict::AlreadyApplied
        );
    }

    #[test]
    fn anyone_may_stop_nobody_else_may_clear() {
        let mut g = StopGate::new();
        let mut bare = cmd(true, "x", None);
        bare.by = Some("mallory".into());
        assert_eq!(
            g.decide_command(&bare, false, T, None),
            Verdict::Stop(StopKind::Untrusted)
        );
        // the same id again still latches: an unauthenticated id means nothing
        assert_eq!(
            g.decide_command(&bare, false, T, None),
            Verdict::Stop(StopKind::Untrusted)
        );
        // an unauthenticated clear is not a clear: it stops, and moves the
        // stop's time on to now
        assert_eq!(
            g.decide_command(&cmd(false, "x", Some(T + MIN)), false, T + MIN, None),
            Verdict::Stop(StopKind::Untrusted)
        );
        assert!(matches!(
            g.decide_command(&cmd(false, "c", Some(T + 1)), true, T + 2, None),
            Verdict::Refused(Refusal::BeforeStop { .. })
        ));
        // an authentic clear issued after that clears it
        assert_eq!(
            g.decide_command(&cmd(false, "c", Some(T + MIN + 1)), true, T + MIN + 2, None),
            Verdict::Clear
        );
        // whatever the defect, an untrusted message stops
        for defect in [
            Defect::Empty,
            Defect::Oversized {
                len: 9000,
                max: 8192,
            },
            Defect::Malformed {
                why: "x".into(),
                unsealed: None,
            },
        ] {
            assert_eq!(
                g.decide(&Message::Untrusted(defect), T + 2 * MIN, None),
                Verdict::Stop(StopKind::Untrusted)
            );
        }
    }

    #[test]
    fn a_replayed_clear_does_not_undo_a_newer_stop() {
        let mut g = StopGate::new();
        let old_stop = cmd(true, "s1", Some(T));
        let old_clear = cmd(false, "c1", Some(T + MIN));
        assert_eq!(
            g.decide_command(&old_stop, true, T, None),
            Verdict::Stop(StopKind::Authentic)
        );
        assert_eq!(
            g.decide_command(&old_clear, true, T + MIN, None),
            Verdict::Clear
        );
        let new_stop = cmd(true, "s2", Some(T + 2 * MIN));
        assert_eq!(
            g.decide_command(&new_stop, true, T + 2 * MIN, None),
            Verdict::Stop(StopKind::Authentic)
        );
        assert_eq!(
            g.decide_command(&old_clear, true, T + 3 * MIN, None),
            Verdict::Refused(Refusal::OlderThanApplied {
                at_ms: T + MIN,
                newest_ms: T + 2 * MIN
            })
        );
        // replayed much later: too old
        assert!(matches!(
            g.decide_command(&old_clear, true, T + 60 * MIN, None),
            Verdict::Refused(Refusal::TooOld { .. })
        ));
        // the old stop replayed still latches, and moves the stop's time on
        // to when it latched, so the old clear cannot follow it
        assert_eq!(
            g.decide_command(&old_stop, true, T + 4 * MIN, None),
            Verdict::Stop(StopKind::Replayed)
        );
        let fresh_clear = cmd(false, "c2", Some(T + 4 * MIN - 1));
        assert!(matches!(
            g.decide_command(&fresh_clear, true, T + 4 * MIN, None),
            Verdict::Refused(Refusal::BeforeStop { .. })
        ));
        assert_eq!(
            g.decide_command(
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
            g.decide_command(&cmd(false, "c", None), true, T, None),
            Verdict::Refused(Refusal::NoIssueTime)
        );
        assert!(matches!(
            g.decide_command(&cmd(false, "c", Some(T + 6 * MIN)), true, T, None),
            Verdict::Refused(Refusal::Future { .. })
        ));
        assert!(matches!(
            g.decide_command(&cmd(false, "c", Some(T - 6 * MIN)), true, T, None),
            Verdict::Refused(Refusal::TooOld { .. })
        ));
        // extreme values do not overflow
        assert!(matches!(
            g.decide_command(&cmd(false, "c", Some(i64::MAX)), true, i64::MAX - 1, None),
            Verdict::Clear | Verdict::Refused(_)
        ));
        assert!(matches!(
            g.decide_command(&cmd(false, "d", Some(i64::MIN)), true, i64::MIN + 1, None),
            Verdict::Clear | Verdict::Refused(_)
        ));
    }

    #[test]
    fn after_a_restart_the_latch_time_stands_for_the_unseen_stop() {
        let mut g = StopGate::new();
        let since = T;
        assert!(matches!(
            g.decide_command(&cmd(false, "c", Some(T - 1)), true, T + 1, Some(since)),
            Verdict::Refused(Refusal::BeforeStop { .. })
        ));
        assert_eq!(
            g.decide_command(&cmd(false, "c2", Some(T + 1)), true, T + 2, Some(since)),
            Verdict::Clear
        );
    }

    #[test]
    fn what_this_host_published_is_not_applied_again() {
        let mut g = StopGate::new();
        let stop = cmd(true, "s", Some(T));
        g.published(&stop, T);
        assert_eq!(
            g.decide_command(&stop, true, T + 1, None),
            Verdict::AlreadyApplied
        );
        // a replayed clear from before this host's stop does not clear it
        assert!(matches!(
            g.decide_command(&cmd(false, "old", Some(T - 1)), true, T + 1, None),
            Verdict::Refused(_)
        ));
    }
}

/// What is read from the stop topic: an authentic command only when sealed
/// with the fleet key for that topic; anything else latches.
#[cfg(test)]
mod reading {
    use proptest::prelude::*;

    use super::*;

    const TOPIC: &str = "roz/v1/estop/lab";
    const T: i64 = 1_800_000_000_000;

    fn key() -> MessageKey {
        MessageKey::from_token("stop-test-token")
    }

    #[test]
    fn what_is_read_from_the_stop_topic() {
        let clear = r#"{"stop":false,"id":"c","at_ms":5}"#;
        let sealed = seal::seal(&key(), TOPIC, clear);
        assert!(matches!(
            read(Some(&key()), TOPIC, &sealed),
            Message::Authentic(c) if !c.stop && c.at_ms == Some(5)
        ));
        // no key (no [fleet]), or sealed for another environment's topic
        assert_eq!(
            read(None, TOPIC, &sealed),
            Message::Untrusted(Defect::UnsealedClear(Unauthentic::NotSealed))
        );
        assert_eq!(
            read(
                Some(&key()),
                TOPIC,
                &seal::seal(&key(), "roz/v1/estop/dock", clear)
            ),
            Message::Untrusted(Defect::UnsealedClear(Unauthentic::BadMac))
        );
        assert_eq!(
            read(Some(&key()), TOPIC, b""),
            Message::Untrusted(Defect::Empty)
        );
        assert_eq!(
            read(Some(&key()), TOPIC, b"stop"),
            Message::Untrusted(Defect::UnsealedStop(Unauthentic::NotSealed))
        );
        let big = vec![b'x'; record::MAX_COMMAND_BYTES + 1];
        assert_eq!(
            read(Some(&key()), TOPIC, &big),
            Message::Untrusted(Defect::Oversized {
                len: record::MAX_COMMAND_BYTES + 1,
                max: record::MAX_COMMAND_BYTES
            })
        );
        // malformed, sealed or not: the defect says which
        let odd = r#"{"stop":1}"#;
        let Message::Untrusted(sealed_odd) =
            read(Some(&key()), TOPIC, &seal::seal(&key(), TOPIC, odd))
        else {
            panic!("a sealed {odd} read as a command");
        };
        assert!(sealed_odd.is_sealed(), "{sealed_odd:?}");
        assert_eq!(
            sealed_odd.to_string(),
            "not a valid command: `stop` is a number, not true or false"
        );
        let Message::Untrusted(unsealed_odd) = read(Some(&key()), TOPIC, odd.as_bytes()) else {
            panic!("{odd} read as a command");
        };
        assert!(!unsealed_odd.is_sealed());
        assert_eq!(unsealed_odd.sender(), "an unauthenticated MQTT publisher");
        // a sealed clear without its issue time is not a valid clear
        assert!(matches!(
            read(
                Some(&key()),
                TOPIC,
                &seal::seal(&key(), TOPIC, r#"{"stop":false,"id":"c"}"#)
            ),
            Message::Untrusted(Defect::Malformed { unsealed: None, .. })
        ));
    }

    /// Bodies that look like commands: the fields and values a command
    /// uses, and the ways they go wrong.
    fn json_ish() -> impl Strategy<Value = String> {
        prop::collection::vec(
            prop::sample::select(vec![
                "{",
                "}",
                "[",
                "]",
                ",",
                ":",
                "\"stop\"",
                "\"at_ms\"",
                "\"id\"",
                "\"by\"",
                "\"reason\"",
                "true",
                "false",
                "\"true\"",
                "1",
                "0",
                "-1",
                "1.5",
                "1e400",
                "null",
                "\"x\"",
                " ",
                "stop",
            ]),
            0..40,
        )
        .prop_map(|parts| parts.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Nothing that is not sealed with the fleet key escapes the stop.
        #[test]
        fn anything_unsealed_latches(
            bytes in prop::collection::vec(any::<u8>(), 0..300),
            text in json_ish(),
        ) {
            for payload in [bytes.as_slice(), text.as_bytes()] {
                let message = read(Some(&key()), TOPIC, payload);
                prop_assert!(matches!(message, Message::Untrusted(_)), "{:?}", message);
                let mut gate = StopGate::new();
                prop_assert_eq!(
                    gate.decide(&message, T, None),
                    Verdict::Stop(StopKind::Untrusted)
                );
            }
        }

        /// A sealed body is a valid command (as the parser reads it) or it
        /// latches; a sealed clear that is not valid never clears.
        #[test]
        fn a_sealed_body_is_a_command_or_latches(body in json_ish()) {
            let sealed = seal::seal(&key(), TOPIC, &body);
            let message = read(Some(&key()), TOPIC, &sealed);
            match &message {
                Message::Authentic(command) => {
                    prop_assert_eq!(record::parse_command(body.as_bytes()), Ok(command.clone()));
                }
                Message::Untrusted(defect) => {
                    prop_assert!(record::parse_command(body.as_bytes()).is_err());
                    let mut gate = StopGate::new();
                    prop_assert_eq!(
                        gate.decide(&message, T, None),
                        Verdict::Stop(StopKind::Untrusted),
                        "{}", defect
                    );
                }
            }
        }
    }
}
