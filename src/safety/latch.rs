//! The latch's rules as plain data, without I/O, locks or clocks: which
//! request adds or removes which cause, and what each change reports
//! ([`StopEvent`]). [`super::ProtectiveStop`] holds one [`Latch`] under its
//! lock and does the rest: publishing the causes, writing the stop file,
//! logging, telling the observers.

use std::collections::BTreeMap;

use super::{ClearRefused, StopEvent, StopInfo, StopSource};

/// Asks to latch the stop with one cause.
#[derive(Debug, Clone, Copy)]
pub struct StopRequest<'a> {
    /// Where it comes from.
    pub source: &'a StopSource,
    pub reason: &'a str,
    /// Who asked, where known (a fleet host id); kept with the cause.
    pub by: Option<&'a str>,
    /// The authenticated credential that asked, for the audit.
    pub credential: Option<&'a str>,
}

impl<'a> StopRequest<'a> {
    /// A stop from `source` for `reason`.
    pub fn new(source: &'a StopSource, reason: &'a str) -> StopRequest<'a> {
        StopRequest {
            source,
            reason,
            by: None,
            credential: None,
        }
    }

    /// Names who asked (a fleet host id).
    pub fn by(self, by: Option<&'a str>) -> StopRequest<'a> {
        StopRequest { by, ..self }
    }

    /// Names the authenticated credential that asked.
    pub fn credential(self, credential: Option<&'a str>) -> StopRequest<'a> {
        StopRequest { credential, ..self }
    }
}

/// What a clear removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClearScope<'a> {
    /// The operator's clear: every cause but those an input still asserts.
    All,
    /// Only this source's cause (the fleet's clear).
    Source(&'a StopSource),
}

/// Asks to clear.
#[derive(Debug, Clone, Copy)]
pub struct ClearRequest<'a> {
    pub scope: ClearScope<'a>,
    /// Who clears, as the log and audit name it (e.g. `rest (127.0.0.1)`).
    pub by: &'a str,
    pub credential: Option<&'a str>,
}

impl<'a> ClearRequest<'a> {
    /// The operator's clear, by `by`: every cause but those an input asserts.
    pub fn all(by: &'a str) -> ClearRequest<'a> {
        ClearRequest {
            scope: ClearScope::All,
            by,
            credential: None,
        }
    }

    /// Only `source`'s cause (the fleet's clear), by `by`.
    pub fn source(source: &'a StopSource, by: &'a str) -> ClearRequest<'a> {
        ClearRequest {
            scope: ClearScope::Source(source),
            by,
            credential: None,
        }
    }

    /// Names the authenticated credential that clears.
    pub fn credential(self, credential: Option<&'a str>) -> ClearRequest<'a> {
        ClearRequest { credential, ..self }
    }
}

/// What a clear did: the events to report (in order) and its answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Cleared {
    pub events: Vec<StopEvent>,
    /// `Ok(true)` if a cause was removed, `Ok(false)` if there was none to
    /// remove; refused while an input asserts a cause in scope.
    pub answer: Result<bool, ClearRefused>,
}

/// An input that asserts the stop now.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    /// The source whose cause it holds (e.g. `gpio`).
    source: String,
    why: String,
}

/// Every active cause, the inputs that assert theirs, and a generation
/// that counts the changes of the causes (the stop file records up to
/// which one it holds).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Latch {
    causes: Vec<StopInfo>,
    /// Inputs that still assert the stop (input -> what it holds).
    held: BTreeMap<String, Held>,
    generation: u64,
}

impl Latch {
    /// A latch holding `causes` (restored from the stop file).
    pub(crate) fn with_causes(causes: Vec<StopInfo>) -> Latch {
        Latch {
            causes,
            ..Latch::default()
        }
    }

    pub(crate) fn causes(&self) -> &[StopInfo] {
        &self.causes
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    fn bump(&mut self) {
        self.generation += 1;
    }

    /// Adds the request's cause at `now_ms`. `None` when its source holds a
    /// cause already (which keeps its first reason): nothing changed.
    pub(crate) fn trigger(&mut self, request: StopRequest<'_>, now_ms: i64) -> Option<StopEvent> {
        if self.causes.iter().any(|c| request.source.is(&c.source)) {
            return None;
        }
        self.causes.push(StopInfo {
            source: request.source.to_string(),
            reason: request.reason.to_string(),
            since_unix_ms: now_ms,
            by: request.by.map(str::to_string),
        });
        self.bump();
        Some(StopEvent::Triggered {
            source: request.source.to_string(),
            reason: request.reason.to_string(),
            by: request.by.map(str::to_string),
            credential: request.credential.map(str::to_string),
        })
    }

    /// `source`'s cause takes `reason` (it latched before its request's body
    /// arrived). `Err(())` when `source` holds no cause: a late reason never
    /// latches by itself. `Ok(None)` when the reason is the same already.
    #[allow(clippy::result_unit_err)]
    pub(crate) fn give_reason(
        &mut self,
        source: &StopSource,
        reason: &str,
        credential: Option<&str>,
    ) -> Result<Option<StopEvent>, ()> {
        let cause = self
            .causes
            .iter_mut()
            .find(|c| source.is(&c.source))
            .ok_or(())?;
        if cause.reason == reason {
            return Ok(None);
        }
        cause.reason = reason.to_string();
        self.bump();
        Ok(Some(StopEvent::ReasonGiven {
            source: source.to_string(),
            reason: reason.to_string(),
            credential: credential.map(str::to_string),
        }))
    }

    /// Clears what the request's scope names. A cause an input asserts is
    /// never removed: the operator's clear removes the others and is
    /// refused; a source's clear is refused outright.
    pub(crate) fn clear(&mut self, request: ClearRequest<'_>) -> Cleared {
        let by = request.by.to_string();
        let credential = request.credential.map(str::to_string);
        let refusal = |input: &String, held: &Held, cleared: Vec<String>| {
            (
                StopEvent::ClearRefused {
                    by: by.clone(),
                    input: input.clone(),
                    credential: credential.clone(),
                },
                ClearRefused {
                    input: input.clone(),
                    why: held.why.clone(),
                    cleared,
                },
            )
        };
        match request.scope {
            ClearScope::All => {
                let held_sources: Vec<&str> =
                    self.held.values().map(|h| h.source.as_str()).collect();
                let (kept, removed): (Vec<StopInfo>, Vec<StopInfo>) =
                    std::mem::take(&mut self.causes)
                        .into_iter()
                        .partition(|c| held_sources.contains(&c.source.as_str()));
                self.causes = kept;
                if !removed.is_empty() {
                    self.bump();
                }
                let mut events: Vec<StopEvent> = removed
                    .iter()
                    .map(|c| StopEvent::Cleared {
                        by: by.clone(),
                        source: c.source.clone(),
                        credential: credential.clone(),
                    })
                    .collect();
                let answer = match self.held.iter().next() {
                    Some((input, held)) => {
                        let cleared = removed.into_iter().map(|c| c.source).collect();
                        let (event, refused) = refusal(input, held, cleared);
                        events.push(event);
                        Err(refused)
                    }
                    None => Ok(!removed.is_empty()),
                };
                Cleared { events, answer }
            }
            ClearScope::Source(source) => {
                if let Some((input, held)) = self.held.iter().find(|(_, h)| source.is(&h.source)) {
                    let (event, refused) = refusal(input, held, Vec::new());
                    return Cleared {
                        events: vec![event],
                        answer: Err(refused),
                    };
                }
                let before = self.causes.len();
                self.causes.retain(|c| !source.is(&c.source));
                if self.causes.len() == before {
                    return Cleared {
                        events: Vec::new(),
                        answer: Ok(false),
                    };
                }
                self.bump();
                Cleared {
                    events: vec![StopEvent::Cleared {
                        by,
                        source: source.to_string(),
                        credential,
                    }],
                    answer: Ok(true),
                }
            }
        }
    }

    /// `input` asserts `source`'s cause: it cannot be cleared until the
    /// input is released. (It does not latch by itself.)
    pub(crate) fn hold(&mut self, input: &str, source: &StopSource, why: &str) {
        self.held.insert(
            input.to_string(),
            Held {
                source: source.to_string(),
                why: why.to_string(),
            },
        );
    }

    /// `input` no longer asserts the stop; the cause stays until cleared.
    pub(crate) fn release(&mut self, input: &str) {
        self.held.remove(input);
    }

    /// Inputs that assert the stop now, by name.
    pub(crate) fn held_inputs(&self) -> Vec<String> {
        self.held.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: i64 = 1_800_000_000_000;

    const REST: &StopSource = &StopSource::Rest;
    const FLEET: &StopSource = &StopSource::Fleet;
    const GPIO: &StopSource = &StopSource::Gpio;
    const MQTT: &StopSource = &StopSource::Mqtt;

    fn stop<'a>(source: &'a StopSource, reason: &'a str) -> StopRequest<'a> {
        StopRequest::new(source, reason)
    }

    fn clear_all(by: &str) -> ClearRequest<'_> {
        ClearRequest {
            scope: ClearScope::All,
            by,
            credential: None,
        }
    }

    fn sources(latch: &Latch) -> Vec<&str> {
        latch.causes().iter().map(|c| c.source.as_str()).collect()
    }

    #[test]
    fn a_trigger_adds_its_cause_with_the_time_and_reports_it() {
        let mut latch = Latch::default();
        let event = latch.trigger(
            StopRequest {
                source: FLEET,
                reason: "drill",
                by: Some("host-a"),
                credential: Some("ops"),
            },
            T,
        );
        assert_eq!(
            event,
            Some(StopEvent::Triggered {
                source: "fleet".into(),
                reason: "drill".into(),
                by: Some("host-a".into()),
                credential: Some("ops".into()),
            })
        );
        assert_eq!(latch.causes()[0].since_unix_ms, T);
        assert_eq!(latch.causes()[0].by.as_deref(), Some("host-a"));
        assert_eq!(latch.generation(), 1);
    }

    #[test]
    fn a_second_trigger_of_one_source_keeps_the_first_reason_and_changes_nothing() {
        let mut latch = Latch::default();
        latch.trigger(stop(REST, "first"), T);
        assert_eq!(latch.trigger(stop(REST, "second"), T + 5), None);
        assert_eq!(latch.causes()[0].reason, "first");
        assert_eq!(latch.generation(), 1);
    }

    #[test]
    fn causes_of_other_sources_add_up_oldest_first() {
        let mut latch = Latch::default();
        latch.trigger(stop(REST, "a"), T);
        latch.trigger(stop(&StopSource::Rule("cliff".into()), "b"), T + 1);
        latch.trigger(stop(FLEET, "c"), T + 2);
        assert_eq!(sources(&latch), ["rest", "rule:cliff", "fleet"]);
    }

    #[test]
    fn the_operator_clear_removes_every_cause_and_reports_each() {
        let mut latch = Latch::default();
        latch.trigger(stop(REST, "a"), T);
        latch.trigger(stop(FLEET, "b"), T);
        let cleared = latch.clear(clear_all("rest (local)"));
        assert_eq!(cleared.answer, Ok(true));
        assert_eq!(cleared.events.len(), 2);
        assert!(latch.causes().is_empty());
        // Nothing left: a second clear removes nothing and says so.
        let again = latch.clear(clear_all("rest (local)"));
        assert_eq!((again.answer, again.events.len()), (Ok(false), 0));
    }

    #[test]
    fn a_held_input_keeps_its_cause_and_refuses_the_clear_naming_what_it_cleared() {
        let mut latch = Latch::default();
        latch.trigger(stop(GPIO, "button"), T);
        latch.trigger(stop(REST, "a"), T);
        latch.hold("gpio:17", GPIO, "pin 17 is low");
        let cleared = latch.clear(clear_all("op"));
        let refused = cleared.answer.expect_err("refused while held");
        assert_eq!(
            (refused.input.as_str(), refused.cleared.as_slice()),
            ("gpio:17", ["rest".to_string()].as_slice())
        );
        assert!(matches!(
            cleared.events.last(),
            Some(StopEvent::ClearRefused { input, .. }) if input == "gpio:17"
        ));
        assert_eq!(sources(&latch), ["gpio"]);
        // Released: the next clear clears.
        latch.release("gpio:17");
        assert_eq!(latch.clear(clear_all("op")).answer, Ok(true));
        assert!(latch.causes().is_empty());
    }

    #[test]
    fn a_source_clear_removes_only_that_source() {
        let mut latch = Latch::default();
        latch.trigger(stop(REST, "a"), T);
        latch.trigger(stop(FLEET, "b"), T);
        let cleared = latch.clear(ClearRequest {
            scope: ClearScope::Source(FLEET),
            by: "fleet",
            credential: Some("host-b"),
        });
        assert_eq!(cleared.answer, Ok(true));
        assert_eq!(sources(&latch), ["rest"]);
        let none = latch.clear(ClearRequest {
            scope: ClearScope::Source(FLEET),
            by: "fleet",
            credential: None,
        });
        assert_eq!((none.answer, none.events.len()), (Ok(false), 0));
    }

    #[test]
    fn a_source_clear_of_a_held_source_is_refused_and_removes_nothing() {
        let mut latch = Latch::default();
        latch.trigger(stop(MQTT, "topic"), T);
        latch.hold("mqtt:estop", MQTT, "the topic says stop");
        let before = latch.generation();
        let cleared = latch.clear(ClearRequest {
            scope: ClearScope::Source(MQTT),
            by: "op",
            credential: None,
        });
        assert!(cleared.answer.is_err());
        assert_eq!(sources(&latch), ["mqtt"]);
        assert_eq!(latch.generation(), before);
    }

    #[test]
    fn a_late_reason_replaces_the_default_once_and_never_latches_by_itself() {
        let mut latch = Latch::default();
        assert_eq!(latch.give_reason(REST, "late", None), Err(()));
        assert!(latch.causes().is_empty());
        latch.trigger(stop(REST, "protective stop (REST)"), T);
        assert!(matches!(
            latch.give_reason(REST, "the arm hit the table", Some("ops")),
            Ok(Some(StopEvent::ReasonGiven { .. }))
        ));
        assert_eq!(latch.causes()[0].reason, "the arm hit the table");
        assert_eq!(
            latch.give_reason(REST, "the arm hit the table", None),
            Ok(None)
        );
        assert_eq!(latch.generation(), 2);
    }

    #[test]
    fn restored_causes_are_the_latch_and_a_clear_removes_them() {
        let mut latch = Latch::with_causes(vec![StopInfo {
            source: "rest".into(),
            reason: "before the restart".into(),
            since_unix_ms: T,
            by: None,
        }]);
        assert_eq!(latch.trigger(stop(REST, "again"), T + 1), None);
        assert_eq!(latch.clear(clear_all("op")).answer, Ok(true));
        assert!(latch.causes().is_empty());
    }
}
