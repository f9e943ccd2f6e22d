//! What arrives from the broker: records of other hosts taken into the
//! view, messages on this host's own record topic, and commands on its stop
//! topic judged; whatever is not taken is counted by why ([`Ignored`]).

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::time::Instant;

use super::record::{self, RecordStatus, Rejected};
use super::stop::{self, Defect, Message, StopKind, Verdict};
use super::view::{Applied, Presence};
use super::{Fleet, seal};

/// How many messages from the broker this host did not take, by why.
/// Shown as `fleet.ignored` by `GET /v1/hosts`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Ignored {
    /// Host records without a valid MAC.
    pub unauthenticated_records: u64,
    /// Stop-topic messages without a valid MAC (the empty message that
    /// deletes the retained command among them). Each latched (everything
    /// on the stop topic but the fleet's clear stops); nothing else of them
    /// was applied.
    pub unauthenticated_commands: u64,
    /// Authentic host records older than one already taken from that
    /// host, or written ahead of this host's clock.
    pub replayed_records: u64,
    /// Authentic stop-topic commands not applied as they asked: a clear
    /// that is not fresh or not after the stop it would clear, or a stop
    /// that is not fresh (it still latched).
    pub stale_commands: u64,
    /// Authentic or not, messages that are oversized, malformed, on the
    /// wrong topic or otherwise invalid. On the stop topic: those too
    /// large to read, and sealed ones that are not a valid command; each
    /// latched.
    pub invalid: u64,
}

#[derive(Debug, Default)]
pub(super) struct IgnoredCounters {
    unauthenticated_records: AtomicU64,
    unauthenticated_commands: AtomicU64,
    replayed_records: AtomicU64,
    stale_commands: AtomicU64,
    invalid: AtomicU64,
}

impl IgnoredCounters {
    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn record(&self, why: &Rejected) {
        Self::count(match why {
            Rejected::Unauthenticated(_) => &self.unauthenticated_records,
            Rejected::Replayed { .. } | Rejected::Future { .. } => &self.replayed_records,
            _ => &self.invalid,
        });
    }

    fn snapshot(&self) -> Ignored {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Ignored {
            unauthenticated_records: get(&self.unauthenticated_records),
            unauthenticated_commands: get(&self.unauthenticated_commands),
            replayed_records: get(&self.replayed_records),
            stale_commands: get(&self.stale_commands),
            invalid: get(&self.invalid),
        }
    }
}

/// What a message on this host's own record topic is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OwnTopic {
    /// Our current record: nothing to do.
    Current,
    /// An authentic record of another running process with this host id,
    /// started after us (two hosts with one `host.id`?).
    Impostor { instance: Option<String> },
    /// Anything else (an old last will, our previous run's record, a
    /// forgery, a cleared message): publish ours again.
    Replace,
}

/// What a record with this host's id in another environment is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OwnElsewhere {
    /// Nothing to do: cleared, not authentic, not of its topic (counted).
    Nothing,
    /// An authentic, live record of another process with this host id.
    Impostor { instance: Option<String> },
    /// An authentic `offline` record with this host id: this host's own,
    /// from before it moved to its environment: clear it.
    Left,
}

/// A message on this host's stop topic and what to do with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JudgedCommand {
    pub message: Message,
    pub verdict: Verdict,
}

impl JudgedCommand {
    /// The fleet member that sent it: only for an authentic command.
    pub(crate) fn sender(&self) -> Option<&str> {
        match &self.message {
            Message::Authentic(command) => command.by.as_deref(),
            Message::Untrusted(_) => None,
        }
    }

    /// The reason a stop from it latches with on this host (its audit
    /// row): who sent it only when the command is authentic, else what is
    /// wrong with it (never anything it says).
    pub(crate) fn stop_reason(&self, environment_id: &str) -> String {
        let (from, detail) = match &self.message {
            Message::Authentic(command) => {
                let by = command.by.as_deref().unwrap_or("an unnamed fleet member");
                let from = if self.verdict == Verdict::Stop(StopKind::Replayed) {
                    format!("a replayed or late command first issued by host {by}")
                } else {
                    format!("host {by}")
                };
                (from, command.reason.clone())
            }
            // The everyday anonymous stop: nothing to add.
            Message::Untrusted(Defect::UnsealedStop(_)) => (
                "an unauthenticated MQTT publisher".to_string(),
                String::new(),
            ),
            Message::Untrusted(defect) => (defect.sender().to_string(), defect.to_string()),
        };
        if detail.is_empty() {
            format!("fleet stop of environment {environment_id} from {from}")
        } else {
            format!("fleet stop of environment {environment_id} from {from}: {detail}")
        }
    }

    /// What it is, for the log, when it latches without being the fleet's
    /// fresh stop.
    pub(crate) fn describe(&self) -> String {
        match &self.message {
            Message::Authentic(_) => {
                "a stop command that is not fresh (a replay or a late delivery)".to_string()
            }
            Message::Untrusted(defect) => {
                format!("a message that is not the fleet's valid command ({defect})")
            }
        }
    }
}

impl Fleet {
    /// Counts a message this host did not take.
    pub(super) fn count_ignored(&self, why: &Rejected) {
        self.ignored.record(why);
    }

    /// The body of an authentic message on `topic`.
    fn open(&self, topic: &str, payload: &[u8]) -> Result<String, seal::Unauthentic> {
        match &self.key {
            Some(key) => seal::open(key, topic, payload),
            None => Err(seal::Unauthentic::NotSealed),
        }
    }

    /// What this host ignored from the broker so far.
    pub fn ignored(&self) -> Ignored {
        self.ignored.snapshot()
    }

    /// Takes in a message from the broker on the record topic of `id` of
    /// `environment` (`topic`); logs what changed, counts what it ignores.
    pub(super) fn record_received(
        &self,
        environment: &str,
        id: &str,
        topic: &str,
        payload: &[u8],
    ) -> Result<(), Rejected> {
        let taken = self.take_record(environment, id, topic, payload);
        if let Err(why) = &taken {
            self.ignored.record(why);
        }
        taken
    }

    /// A record that a lookup of `id` asked for (on the record topic of
    /// `id` of `environment`), judged like one the view takes: authentic,
    /// not oversized, of its topic, not replayed. Counts what it ignores.
    pub(super) fn looked_up_received(
        &self,
        environment: &str,
        id: &str,
        topic: &str,
        payload: &[u8],
    ) -> Result<Option<record::HostRecord>, Rejected> {
        if payload.is_empty() {
            // A cleared record: nothing to find.
            return Ok(None);
        }
        let judged = self.open_record(topic, payload).and_then(|body| {
            self.view.lock().check_looked_up(
                environment,
                id,
                body.as_bytes(),
                crate::clock::now_ms(),
            )
        });
        match judged {
            Ok(record) => Ok(Some(record)),
            Err(why) => {
                self.ignored.record(&why);
                Err(why)
            }
        }
    }

    /// The body of a sealed record on `topic`, if it is authentic and not
    /// oversized.
    fn open_record(&self, topic: &str, payload: &[u8]) -> Result<String, Rejected> {
        if payload.len() > record::MAX_RECORD_BYTES {
            return Err(Rejected::Oversized {
                len: payload.len(),
                max: record::MAX_RECORD_BYTES,
            });
        }
        Ok(self.open(topic, payload)?)
    }

    fn take_record(
        &self,
        environment: &str,
        id: &str,
        topic: &str,
        payload: &[u8],
    ) -> Result<(), Rejected> {
        // An empty payload is the broker saying the retained record was
        // cleared (deregistered): nothing to authenticate.
        let body = if payload.is_empty() {
            String::new()
        } else {
            self.open_record(topic, payload)?
        };
        let applied = self.view.lock().apply_on(
            environment,
            id,
            body.as_bytes(),
            Instant::now(),
            crate::clock::now_ms(),
        )?;
        match applied {
            Applied::Stored { id, before, now } if before != Some(now) => {
                tracing::info!(
                    host_id = %id,
                    from = before.map_or("unknown", Presence::as_str),
                    to = now.as_str(),
                    "fleet: host presence changed"
                );
            }
            Applied::Removed { id } => {
                tracing::info!(host_id = %id, "fleet: host record removed");
            }
            _ => {}
        }
        self.bump();
        Ok(())
    }

    /// A host of this host's environment says it is alive (`topic` of
    /// host `id`): a sign of life for the view, if it is authentic, of
    /// this environment and fresh. Logs what changed.
    pub(super) fn alive_received(
        &self,
        environment: &str,
        id: &str,
        topic: &str,
        payload: &[u8],
    ) -> Result<(), Rejected> {
        if payload.len() > record::MAX_ALIVE_BYTES {
            return Err(Rejected::Oversized {
                len: payload.len(),
                max: record::MAX_ALIVE_BYTES,
            });
        }
        if environment != self.own.environment_id || id == self.own.id {
            return Ok(());
        }
        let body = self.open(topic, payload)?;
        let alive: record::Alive =
            serde_json::from_str(&body).map_err(|e| Rejected::Malformed(e.to_string()))?;
        let now_ms = crate::clock::now_ms();
        if alive.at_ms > now_ms.saturating_add(stop::MAX_CLOCK_SKEW_MS) {
            return Err(Rejected::Future {
                stamp_ms: alive.at_ms,
                now_ms,
            });
        }
        if alive.at_ms < now_ms.saturating_sub(stop::MAX_CLOCK_SKEW_MS) {
            return Err(Rejected::Replayed {
                stamp_ms: alive.at_ms,
                newest_ms: now_ms.saturating_sub(stop::MAX_CLOCK_SKEW_MS),
            });
        }
        let changed = self
            .view
            .lock()
            .heard(id, Some(&alive.instance), Instant::now());
        if let Some(t) = changed {
            super::presence::log_changes(&[t]);
            self.bump();
        }
        Ok(())
    }

    /// A message on this host's own record topic.
    pub(crate) fn own_topic_message(&self, payload: &[u8]) -> OwnTopic {
        if payload.is_empty() {
            return OwnTopic::Replace;
        }
        let topic = self.own_topic();
        let body = match self.open(&topic, payload) {
            Ok(body) => body,
            Err(why) => {
                self.ignored.record(&Rejected::Unauthenticated(why));
                return OwnTopic::Replace;
            }
        };
        let Ok(r) = record::parse_record(&self.own.id, body.as_bytes()) else {
            return OwnTopic::Replace;
        };
        // Our next record must be newer than any published under our id
        // (our previous run's, if this host's clock went back since); one
        // far in the future would be refused by the other hosts anyway.
        let stamp = r.stamp_ms();
        if stamp <= crate::clock::now_ms().saturating_add(stop::MAX_CLOCK_SKEW_MS) {
            let mut floor = self.stamp_floor.lock();
            *floor = (*floor).max(stamp);
        }
        if r.status != RecordStatus::Online {
            return OwnTopic::Replace;
        }
        if r.instance == self.own.instance {
            return OwnTopic::Current;
        }
        // Started after us: another process with this host id. (An older
        // record is our own previous run's; ours replaces it.)
        if r.created_at_ms > self.own.created_at_ms {
            return OwnTopic::Impostor {
                instance: r.instance,
            };
        }
        OwnTopic::Replace
    }

    /// A message with this host's id on the record topic of another
    /// environment (`environment`, `topic`).
    pub(crate) fn own_record_elsewhere(
        &self,
        environment: &str,
        topic: &str,
        payload: &[u8],
    ) -> OwnElsewhere {
        if payload.is_empty() || environment == self.own.environment_id {
            return OwnElsewhere::Nothing;
        }
        let judged = self.open_record(topic, payload).and_then(|body| {
            let r = record::parse_record(&self.own.id, body.as_bytes())?;
            if r.environment_id == environment {
                Ok(r)
            } else {
                Err(Rejected::WrongEnvironment {
                    topic: environment.to_string(),
                    record: r.environment_id,
                })
            }
        });
        match judged {
            Err(why) => {
                self.ignored.record(&why);
                OwnElsewhere::Nothing
            }
            Ok(r) if r.status == RecordStatus::Offline => OwnElsewhere::Left,
            Ok(r) if r.status == RecordStatus::Online && r.instance != self.own.instance => {
                OwnElsewhere::Impostor {
                    instance: r.instance,
                }
            }
            Ok(_) => OwnElsewhere::Nothing,
        }
    }

    /// Judges a message on this host's stop topic: every message but an
    /// authentic, valid command latches (see [`stop`]).
    /// `fleet_latched_since`: when this host's stop from the fleet
    /// latched, if it holds one. Counts what it does not take as it asks.
    pub(crate) fn command_received(
        &self,
        payload: &[u8],
        fleet_latched_since: Option<i64>,
    ) -> JudgedCommand {
        let topic = self.topics.stop(&self.own.environment_id);
        let message = stop::read(self.key.as_ref(), &topic, payload);
        let verdict =
            self.gate
                .lock()
                .decide(&message, crate::clock::now_ms(), fleet_latched_since);
        match &message {
            Message::Untrusted(defect) => {
                match defect {
                    Defect::Oversized { .. } => self.link.oversized(),
                    Defect::Malformed { .. } => self.link.rejected(),
                    _ => {}
                }
                let counter = if defect.is_sealed() || matches!(defect, Defect::Oversized { .. }) {
                    &self.ignored.invalid
                } else {
                    &self.ignored.unauthenticated_commands
                };
                IgnoredCounters::count(counter);
            }
            Message::Authentic(_) => {
                if matches!(
                    verdict,
                    Verdict::Refused(_) | Verdict::Stop(StopKind::Replayed)
                ) {
                    IgnoredCounters::count(&self.ignored.stale_commands);
                }
            }
        }
        JudgedCommand { message, verdict }
    }
}
