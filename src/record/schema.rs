//! What a recording holds: its channels, the JSON Schema of each channel's
//! messages (schema encoding `jsonschema`, message encoding `json`: what
//! Foxglove opens without plugins), and each event as its message. Plain
//! data, no I/O; docs/recordings.md describes the same.

use std::sync::Arc;

use serde::Serialize;
use serde_json::{Value, json};

use crate::ooda::Observation;
use crate::ooda::act::{ActuatorEvent, Origin, VerdictEvent};
use crate::safety::{StopEvent, StopInfo};
use crate::store::AuditRecord;

/// One thing to record, as the taps hand it over (converted to JSON on the
/// writer's thread, not on the hot path).
#[derive(Debug)]
pub(crate) enum Event {
    Sensor {
        name: Arc<str>,
        value: f64,
    },
    Actuator(Box<ActuatorEvent>),
    /// A verdict of an actuator's feedback, on its actuator's channel.
    Verdict(Box<VerdictEvent>),
    Stop {
        event: Box<StopEvent>,
        /// The latch's causes after the change.
        causes: Vec<StopInfo>,
    },
    Audit(Box<AuditRecord>),
    /// A session event, already a JSON object (`event`, `session_id`, ...).
    Session(Value),
    /// A task event, already a JSON object (`event`, `task_id`, ...).
    Task(Value),
    Observation(Arc<Observation>),
    /// A camera's frame (a whole JPEG), captured at `at_unix_ms`.
    Image {
        camera: Arc<str>,
        jpeg: bytes::Bytes,
        at_unix_ms: i64,
    },
}

/// The kinds of channel, each with its schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Kind {
    Observation,
    Sensor,
    Actuator,
    ProtectiveStop,
    Audit,
    Sessions,
    Tasks,
    /// Foxglove's own image schema, so that Foxglove shows the video.
    CompressedImage,
}

impl Kind {
    /// The schema's name.
    pub(crate) fn schema_name(self) -> &'static str {
        match self {
            Kind::Observation => "rozd.Observation",
            Kind::Sensor => "rozd.SensorValue",
            Kind::Actuator => "rozd.ActuatorChange",
            Kind::ProtectiveStop => "rozd.ProtectiveStop",
            Kind::Audit => "rozd.AuditRecord",
            Kind::Sessions => "rozd.SessionEvent",
            Kind::Tasks => "rozd.TaskEvent",
            Kind::CompressedImage => "foxglove.CompressedImage",
        }
    }

    /// The JSON Schema (draft 2020-12) of the channel's messages.
    pub(crate) fn schema(self) -> Value {
        let mut schema = match self {
            Kind::Observation => json!({
                "type": "object",
                "description": "What the host knew at one tick: GET /v1/observation",
                "properties": {
                    "seq": {"type": "integer"},
                    "at_unix_ms": {"type": "integer"},
                    "protective_stop": {"type": ["object", "null"]},
                    "sensors": {"type": "array", "items": {"type": "object", "properties": {
                        "name": {"type": "string"},
                        "unit": {"type": ["string", "null"]},
                        "value": {"type": ["number", "null"]},
                        "age_ms": {"type": ["integer", "null"]},
                        "health": {"type": "string"},
                        "alarm": {"type": "string"}
                    }}},
                    "actuators": {"type": "array", "items": {"type": "object", "properties": {
                        "name": {"type": "string"},
                        "value": {"type": "number"},
                        "safe_value": {"type": "number"},
                        "at_safe_value": {"type": "boolean"},
                        "safe_unconfirmed": {"type": "string"},
                        "owner": {"type": ["string", "null"]}
                    }}},
                    "sources": {"type": "array"}
                },
                "required": ["seq", "at_unix_ms", "sensors", "actuators"]
            }),
            Kind::Sensor => json!({
                "type": "object",
                "description": "One value of a sensor as it arrived from its source",
                "properties": {
                    "sensor": {"type": "string"},
                    "value": {"type": "number"},
                    "at_unix_ns": {"type": "integer", "description": "when rozd received it"}
                },
                "required": ["sensor", "value", "at_unix_ns"]
            }),
            Kind::Actuator => json!({
                "type": "object",
                "description": "A command applied to an actuator, a drive to its safe value, or a verdict of its feedback (commanded versus measured)",
                "properties": {
                    "actuator": {"type": "string"},
                    "value": {"type": "number"},
                    "kind": {"enum": ["command", "safe", "verdict"]},
                    "status": {"enum": ["confirmed", "unconfirmed", "mismatch"], "description": "verdict: what the feedback sensor measured"},
                    "expected": {"type": "number", "description": "verdict: what the sensor should read"},
                    "measured": {"type": ["number", "null"], "description": "verdict: what it read"},
                    "tolerance": {"type": "number"},
                    "settled_ms": {"type": "integer", "description": "verdict: from the command to the verdict"},
                    "stage": {"enum": ["command", "hold"]},
                    "alarm": {"type": "boolean", "description": "verdict: the actuator's mismatch alarm after it"},
                    "cross_check": {"type": ["object", "null"], "description": "verdict: a cross_check's sensor_rate against its expected_rate", "properties": {"sensor_rate": {"type": "number"}, "expected_rate": {"type": "number"}}},
                    "origin": {"type": "string", "description": "as in the audit: session <id>, rule <name>, operator <who>, safety (<reason>)"},
                    "reason": {"type": ["string", "null"], "description": "why a safe value was driven; for a verdict, why it is what it is"},
                    "session_id": {"type": ["string", "null"]},
                    "error": {"type": ["string", "null"], "description": "the driver's failure, if any"}
                },
                "required": ["actuator", "value", "kind", "origin"]
            }),
            Kind::ProtectiveStop => json!({
                "type": "object",
                "description": "A change of the protective-stop latch",
                "properties": {
                    "event": {"enum": ["triggered", "cleared", "clear_refused", "restored", "reason_given"]},
                    "source": {"type": ["string", "null"]},
                    "reason": {"type": ["string", "null"]},
                    "by": {"type": ["string", "null"]},
                    "credential": {"type": ["string", "null"]},
                    "latched": {"type": "boolean"},
                    "causes": {"type": "array", "items": {"type": "object"}}
                },
                "required": ["event", "latched", "causes"]
            }),
            Kind::Audit => json!({
                "type": "object",
                "description": "One audit row as written to the store (GET /v1/audit)",
                "properties": {
                    "at_ms": {"type": "integer"},
                    "kind": {"type": "string"},
                    "session_id": {"type": ["string", "null"]},
                    "tool_call_id": {"type": ["string", "null"]},
                    "tool": {"type": ["string", "null"]},
                    "actuator": {"type": ["string", "null"]},
                    "parameters": {},
                    "decision": {"type": ["string", "null"]},
                    "result": {"type": ["string", "null"]},
                    "error": {"type": ["string", "null"]},
                    "origin": {"type": ["string", "null"]},
                    "credential": {"type": ["string", "null"]},
                    "approved_by": {"type": ["string", "null"], "description": "the credential that answered the call's approval"}
                },
                "required": ["at_ms", "kind"]
            }),
            Kind::Sessions => json!({
                "type": "object",
                "description": "A session started or ended, a turn started or ended (with the messages it added: text, thinking, tool calls and results)",
                "properties": {
                    "event": {"enum": ["session_started", "session_ended", "turn_started", "turn_ended"]},
                    "session_id": {"type": "string"},
                    "message_id": {"type": "string"},
                    "model": {"type": "string"},
                    "ai_mode": {"type": "string"},
                    "user_content": {"type": "string"},
                    "messages": {"type": "array"},
                    "stop_reason": {"type": "string"},
                    "reason": {"type": "string"}
                },
                "required": ["event", "session_id"]
            }),
            Kind::Tasks => json!({
                "type": "object",
                "description": "A task created, its status changed, or a team event of its log",
                "properties": {
                    "event": {"enum": ["created", "status", "team_event"]},
                    "task_id": {"type": "string"},
                    "status": {"type": "string"},
                    "detail": {"type": ["string", "null"]},
                    "kind": {"type": "string"},
                    "worker_id": {"type": ["string", "null"]},
                    "body": {}
                },
                "required": ["event", "task_id"]
            }),
            Kind::CompressedImage => json!({
                "type": "object",
                "description": "A compressed image (Foxglove's foxglove.CompressedImage): a camera's frame",
                "properties": {
                    "timestamp": {"type": "object", "description": "when the frame was captured",
                        "properties": {"sec": {"type": "integer", "minimum": 0},
                                       "nsec": {"type": "integer", "minimum": 0}},
                        "required": ["sec", "nsec"]},
                    "frame_id": {"type": "string", "description": "the camera's name"},
                    "data": {"type": "string", "contentEncoding": "base64", "description": "the JPEG"},
                    "format": {"type": "string", "description": "always jpeg"}
                },
                "required": ["timestamp", "frame_id", "data", "format"]
            }),
        };
        if let Some(object) = schema.as_object_mut() {
            object.insert(
                "$schema".into(),
                json!("https://json-schema.org/draft/2020-12/schema"),
            );
            object.insert("title".into(), json!(self.schema_name()));
        }
        schema
    }
}

/// An event as a message: its kind, channel and JSON body.
#[derive(Debug)]
pub(crate) struct Message {
    pub kind: Kind,
    pub topic: String,
    pub body: Vec<u8>,
}

#[derive(Serialize)]
struct SensorValue<'a> {
    sensor: &'a str,
    value: f64,
    at_unix_ns: u64,
}

/// The message of `event`, logged at `at_ns` (ns since the Unix epoch).
pub(crate) fn message(event: &Event, at_ns: u64) -> Message {
    let (kind, topic, body) = match event {
        Event::Sensor { name, value } => (
            Kind::Sensor,
            format!("/sensors/{name}"),
            serde_json::to_vec(&SensorValue {
                sensor: name,
                value: *value,
                at_unix_ns: at_ns,
            }),
        ),
        Event::Actuator(a) => {
            let reason = match &a.origin {
                Origin::Safety(reason) => Some(reason),
                _ => None,
            };
            let body = json!({
                "actuator": a.actuator,
                "value": a.value,
                "kind": if reason.is_some() { "safe" } else { "command" },
                "origin": a.origin.to_string(),
                "reason": reason,
                "session_id": a.session_id,
                "error": a.error,
            });
            (
                Kind::Actuator,
                format!("/actuators/{}", a.actuator),
                serde_json::to_vec(&body),
            )
        }
        Event::Verdict(v) => {
            let verdict = &v.verdict;
            let body = json!({
                "actuator": v.actuator,
                "value": verdict.commanded,
                "kind": "verdict",
                "origin": v.origin.to_string(),
                "session_id": v.session_id,
                "status": verdict.status,
                "expected": verdict.expected,
                "measured": verdict.measured,
                "tolerance": verdict.tolerance,
                "settled_ms": verdict.settled_ms,
                "stage": verdict.stage,
                "reason": verdict.reason,
                "alarm": v.alarm,
                "cross_check": verdict.cross_check,
            });
            (
                Kind::Actuator,
                format!("/actuators/{}", v.actuator),
                serde_json::to_vec(&body),
            )
        }
        Event::Stop { event, causes } => {
            let mut body = match event.as_ref() {
                StopEvent::Triggered {
                    source,
                    reason,
                    by,
                    credential,
                } => json!({"event": "triggered", "source": source, "reason": reason,
                            "by": by, "credential": credential}),
                StopEvent::Cleared {
                    by,
                    source,
                    credential,
                } => json!({"event": "cleared", "source": source, "by": by,
                            "credential": credential}),
                StopEvent::ClearRefused {
                    by,
                    input,
                    credential,
                } => json!({"event": "clear_refused", "source": input, "by": by,
                            "credential": credential,
                            "reason": format!("stop input {input} still asserts the stop")}),
                StopEvent::ReasonGiven {
                    source,
                    reason,
                    credential,
                } => json!({"event": "reason_given", "source": source, "reason": reason,
                            "credential": credential}),
                StopEvent::Restored { .. } => {
                    json!({"event": "restored", "reason": "latched at start-up as before the restart"})
                }
            };
            if let Some(object) = body.as_object_mut() {
                object.insert("latched".into(), json!(!causes.is_empty()));
                object.insert("causes".into(), json!(causes));
            }
            (
                Kind::ProtectiveStop,
                "/protective_stop".to_string(),
                serde_json::to_vec(&body),
            )
        }
        Event::Audit(record) => {
            // The row's id is the store's, not known yet when it is recorded.
            let mut body = json!(record);
            if let Some(object) = body.as_object_mut() {
                object.remove("id");
            }
            (Kind::Audit, "/audit".to_string(), serde_json::to_vec(&body))
        }
        Event::Session(body) => (
            Kind::Sessions,
            "/sessions".to_string(),
            serde_json::to_vec(body),
        ),
        Event::Task(body) => (Kind::Tasks, "/tasks".to_string(), serde_json::to_vec(body)),
        Event::Image {
            camera,
            jpeg,
            at_unix_ms,
        } => {
            use base64::Engine as _;
            let ms = (*at_unix_ms).max(0);
            let body = json!({
                "timestamp": {"sec": ms / 1000, "nsec": (ms % 1000) * 1_000_000},
                "frame_id": camera.as_ref(),
                "data": base64::engine::general_purpose::STANDARD.encode(jpeg),
                "format": "jpeg",
            });
            (
                Kind::CompressedImage,
                format!("/cameras/{camera}"),
                serde_json::to_vec(&body),
            )
        }
        Event::Observation(obs) => (
            Kind::Observation,
            "/observation".to_string(),
            serde_json::to_vec(obs.as_ref()),
        ),
    };
    Message {
        kind,
        topic,
        // These types serialise infallibly (string keys, no custom impls);
        // an empty object keeps the file valid if one ever did not.
        body: body.unwrap_or_else(|_| b"{}".to_vec()),
    }
}

/// The `/sessions` message of a session that started.
pub(crate) fn session_started(s: &crate::store::SessionRecord) -> Value {
    json!({
        "event": "session_started",
        "session_id": s.id,
        "model": s.model,
        "environment_id": s.environment_id,
    })
}

/// The `/sessions` message of a session that ended.
pub(crate) fn session_ended(id: &str, reason: &str) -> Value {
    json!({"event": "session_ended", "session_id": id, "reason": reason})
}

/// The `/sessions` message of a turn that ended, with the messages it added.
pub(crate) fn turn_ended(t: &crate::store::TurnRecord) -> Value {
    json!({
        "event": "turn_ended",
        "session_id": t.session_id,
        "seq": t.seq,
        "message_id": t.message_id,
        "ai_mode": t.ai_mode,
        "user_content": t.user_content,
        "messages": t.messages,
        "stop_reason": t.stop_reason,
        "input_tokens": t.input_tokens,
        "output_tokens": t.output_tokens,
        "started_at_ms": t.started_at_ms,
        "ended_at_ms": t.ended_at_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schema_is_an_object_schema_with_a_title() {
        for kind in [
            Kind::Observation,
            Kind::Sensor,
            Kind::Actuator,
            Kind::ProtectiveStop,
            Kind::Audit,
            Kind::Sessions,
            Kind::Tasks,
            Kind::CompressedImage,
        ] {
            let schema = kind.schema();
            assert_eq!(schema["type"], "object");
            assert_eq!(schema["title"], kind.schema_name());
        }
    }

    #[test]
    fn a_safe_drive_is_told_apart_from_a_command() {
        let event = |origin: Origin| {
            Event::Actuator(Box::new(ActuatorEvent {
                actuator: "motor".into(),
                value: 0.0,
                origin,
                session_id: None,
                error: None,
            }))
        };
        let safe = message(&event(Origin::Safety("hold_ms expired".into())), 1);
        let body: Value = serde_json::from_slice(&safe.body).unwrap_or_default();
        assert_eq!(safe.topic, "/actuators/motor");
        assert_eq!(body["kind"], "safe");
        assert_eq!(body["reason"], "hold_ms expired");
        let command = message(&event(Origin::Rule("too_close".into())), 1);
        let body: Value = serde_json::from_slice(&command.body).unwrap_or_default();
        assert_eq!(body["kind"], "command");
        assert_eq!(body["reason"], Value::Null);
    }

    #[test]
    fn a_verdict_is_on_its_actuators_channel_with_what_was_compared() {
        use crate::ooda::feedback::{FeedbackStatus, Stage, Verdict};
        let event = Event::Verdict(Box::new(VerdictEvent {
            actuator: "motor".into(),
            origin: Origin::Session("s1".into()),
            session_id: Some("s1".into()),
            verdict: Verdict {
                episode: 3,
                status: FeedbackStatus::Mismatch,
                commanded: 0.3,
                expected: 0.3,
                measured: Some(0.0),
                tolerance: 0.02,
                settled_ms: 500,
                stage: Stage::Command,
                reason: "why",
                cross_check: None,
            },
            alarm: true,
            action: None,
        }));
        let m = message(&event, 1);
        assert_eq!(
            (m.kind, m.topic.as_str()),
            (Kind::Actuator, "/actuators/motor")
        );
        let body: Value = serde_json::from_slice(&m.body).unwrap_or_default();
        for required in ["actuator", "value", "kind", "origin"] {
            assert!(body.get(required).is_some(), "{required}: {body}");
        }
        assert_eq!(body["kind"], "verdict");
        assert_eq!(body["status"], "mismatch");
        assert_eq!(
            (body["value"].as_f64(), body["measured"].as_f64()),
            (Some(0.3), Some(0.0))
        );
        assert_eq!(body["settled_ms"], 500);
        assert_eq!(body["alarm"], true);
    }
}
