//! The `foxglove.websocket.v1` protocol, server side, as plain data and
//! pure functions: the channels and services rozd advertises, the client's
//! requests parsed, the server's messages encoded. No I/O.
//!
//! Text messages are JSON objects with an `op`; binary ones start with an
//! opcode byte, integers little-endian
//! (<https://github.com/foxglove/ws-protocol/blob/main/docs/spec.md>).

use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::types::Scope;
use crate::record::schema::Kind;

/// The WebSocket subprotocol.
pub(super) const SUBPROTOCOL: &str = "foxglove.websocket.v1";

/// Server binary opcodes.
const MESSAGE_DATA: u8 = 0x01;
const SERVICE_CALL_RESPONSE: u8 = 0x03;
/// Client binary opcode of a service call.
const SERVICE_CALL_REQUEST: u8 = 0x02;

/// The topic of the simulated world as a 3D scene.
pub(super) const SCENE_TOPIC: &str = "/sim/scene";
/// The topic of the Observation (polled by each client at `max_hz`).
pub(super) const OBSERVATION_TOPIC: &str = "/observation";

/// What a channel's messages are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ChannelSchema {
    /// The recordings' schema of that kind.
    Recorded(Kind),
    /// `foxglove.SceneUpdate` of the simulated world.
    Scene,
}

impl ChannelSchema {
    pub(super) fn name(self) -> &'static str {
        match self {
            ChannelSchema::Recorded(kind) => kind.schema_name(),
            ChannelSchema::Scene => "foxglove.SceneUpdate",
        }
    }

    pub(super) fn schema(self) -> Value {
        match self {
            ChannelSchema::Recorded(kind) => kind.schema(),
            ChannelSchema::Scene => scene_schema(),
        }
    }
}

/// One advertised channel.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Channel {
    pub id: u32,
    pub topic: String,
    pub schema: ChannelSchema,
}

/// Every channel of this host, with ids from 1: the recordings' topics,
/// then `/sim/scene` when a simulated world runs.
pub(super) fn channels(
    sensors: &[&str],
    actuators: &[&str],
    cameras: &[&str],
    sim_world: bool,
) -> Vec<Channel> {
    let mut list: Vec<(String, ChannelSchema)> = vec![
        (
            OBSERVATION_TOPIC.into(),
            ChannelSchema::Recorded(Kind::Observation),
        ),
        (
            "/protective_stop".into(),
            ChannelSchema::Recorded(Kind::ProtectiveStop),
        ),
        ("/audit".into(), ChannelSchema::Recorded(Kind::Audit)),
        ("/sessions".into(), ChannelSchema::Recorded(Kind::Sessions)),
        ("/tasks".into(), ChannelSchema::Recorded(Kind::Tasks)),
    ];
    list.extend(sensors.iter().map(|s| {
        (
            format!("/sensors/{s}"),
            ChannelSchema::Recorded(Kind::Sensor),
        )
    }));
    list.extend(actuators.iter().map(|a| {
        (
            format!("/actuators/{a}"),
            ChannelSchema::Recorded(Kind::Actuator),
        )
    }));
    list.extend(cameras.iter().map(|c| {
        (
            format!("/cameras/{c}"),
            ChannelSchema::Recorded(Kind::CompressedImage),
        )
    }));
    if sim_world {
        list.push((SCENE_TOPIC.into(), ChannelSchema::Scene));
    }
    list.into_iter()
        .zip(1u32..)
        .map(|((topic, schema), id)| Channel { id, topic, schema })
        .collect()
}

/// The services, with their ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Service {
    ProtectiveStop = 1,
    ClearProtectiveStop = 2,
    Approve = 3,
    Deny = 4,
    CommandActuator = 5,
}

impl Service {
    pub(super) const ALL: [Service; 5] = [
        Service::ProtectiveStop,
        Service::ClearProtectiveStop,
        Service::Approve,
        Service::Deny,
        Service::CommandActuator,
    ];

    pub(super) fn from_id(id: u32) -> Option<Service> {
        Service::ALL.into_iter().find(|s| *s as u32 == id)
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Service::ProtectiveStop => "protective_stop",
            Service::ClearProtectiveStop => "clear_protective_stop",
            Service::Approve => "approve",
            Service::Deny => "deny",
            Service::CommandActuator => "command_actuator",
        }
    }

    /// The scope the call needs, as its REST twin does (`None`: any
    /// credential: anyone may stop).
    pub(super) fn needs(self) -> Option<Scope> {
        match self {
            Service::ProtectiveStop => None,
            Service::ClearProtectiveStop => Some(Scope::Admin),
            Service::Approve | Service::Deny | Service::CommandActuator => Some(Scope::Operate),
        }
    }

    fn request_schema(self) -> Value {
        let reason = json!({"type": "object", "properties": {
            "reason": {"type": "string", "description": "why (kept in the latch and the audit)"}
        }});
        match self {
            Service::ProtectiveStop | Service::ClearProtectiveStop => reason,
            Service::Approve | Service::Deny => json!({"type": "object", "properties": {
                "id": {"type": "string", "description": "the waiting call's id, as GET /v1/approvals lists it"}
            }, "required": ["id"]}),
            Service::CommandActuator => json!({"type": "object", "properties": {
                "actuator": {"type": "string"},
                "value": {"type": "number"},
                "hold_ms": {"type": "integer", "minimum": 1}
            }, "required": ["actuator", "value"]}),
        }
    }

    fn response_schema(self) -> Value {
        match self {
            Service::ProtectiveStop | Service::ClearProtectiveStop => {
                json!({"type": "object", "properties": {
                    "latched": {"type": "boolean"},
                    "changed": {"type": "boolean", "description": "this call added (or removed) a cause"},
                    "causes": {"type": "array", "items": {"type": "object"}}
                }})
            }
            Service::Approve | Service::Deny => json!({"type": "object", "properties": {
                "approved": {"type": "boolean"}, "call": {"type": "object"}
            }}),
            Service::CommandActuator => json!({"type": "object", "properties": {
                "result": {"description": "what the actuator's PHYSICAL tool answered"}
            }}),
        }
    }
}

/// `serverInfo`, the first message of every connection.
pub(super) fn server_info(name: &str, session_id: &str, host_id: &str) -> String {
    json!({
        "op": "serverInfo",
        "name": name,
        "capabilities": ["services"],
        "supportedEncodings": ["json"],
        "metadata": {"host_id": host_id, "version": crate::VERSION},
        "sessionId": session_id,
    })
    .to_string()
}

/// `advertise` of `channels`.
pub(super) fn advertise(channels: &[Channel]) -> String {
    let list: Vec<Value> = channels
        .iter()
        .map(|c| {
            json!({
                "id": c.id,
                "topic": c.topic,
                "encoding": "json",
                "schemaName": c.schema.name(),
                "schema": c.schema.schema().to_string(),
                "schemaEncoding": "jsonschema",
            })
        })
        .collect();
    json!({"op": "advertise", "channels": list}).to_string()
}

/// `advertiseServices` of every service.
pub(super) fn advertise_services() -> String {
    let list: Vec<Value> = Service::ALL
        .iter()
        .map(|s| {
            let definition = |schema: Value, kind: &str| {
                json!({
                    "encoding": "json",
                    "schemaName": format!("rozd.{}{kind}", s.name()),
                    "schemaEncoding": "jsonschema",
                    "schema": schema.to_string(),
                })
            };
            json!({
                "id": *s as u32,
                "name": s.name(),
                "type": format!("rozd.{}", s.name()),
                "request": definition(s.request_schema(), "Request"),
                "response": definition(s.response_schema(), "Response"),
                // The spelling of clients before the definitions above.
                "requestSchema": s.request_schema().to_string(),
                "responseSchema": s.response_schema().to_string(),
            })
        })
        .collect();
    json!({"op": "advertiseServices", "services": list}).to_string()
}

/// Status levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Level {
    Warning = 1,
    Error = 2,
}

/// A `status` message for the client's user.
pub(super) fn status(level: Level, message: &str) -> String {
    json!({"op": "status", "level": level as u8, "message": message}).to_string()
}

/// `serviceCallFailure`.
pub(super) fn service_call_failure(service_id: u32, call_id: u32, message: &str) -> String {
    json!({"op": "serviceCallFailure", "serviceId": service_id, "callId": call_id, "message": message})
        .to_string()
}

/// Binary `MessageData`: a message of subscription `subscription` logged at `at_ns`.
pub(super) fn message_data(subscription: u32, at_ns: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(13 + payload.len());
    out.push(MESSAGE_DATA);
    out.extend_from_slice(&subscription.to_le_bytes());
    out.extend_from_slice(&at_ns.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Binary `ServiceCallResponse` with a JSON payload.
pub(super) fn service_call_response(service_id: u32, call_id: u32, payload: &[u8]) -> Vec<u8> {
    const ENCODING: &[u8] = b"json";
    let mut out = Vec::with_capacity(13 + ENCODING.len() + payload.len());
    out.push(SERVICE_CALL_RESPONSE);
    out.extend_from_slice(&service_id.to_le_bytes());
    out.extend_from_slice(&call_id.to_le_bytes());
    out.extend_from_slice(&(ENCODING.len() as u32).to_le_bytes());
    out.extend_from_slice(ENCODING);
    out.extend_from_slice(payload);
    out
}

/// What a client asked for.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Request {
    /// `(subscription id, channel id)` pairs.
    Subscribe(Vec<(u32, u32)>),
    Unsubscribe(Vec<u32>),
    ServiceCall {
        service_id: u32,
        call_id: u32,
        encoding: String,
        payload: Vec<u8>,
    },
    /// A known operation rozd does not offer (`advertise`, parameters, ...).
    Unsupported(String),
}

#[derive(Deserialize)]
struct SubscriptionRequest {
    id: u32,
    #[serde(rename = "channelId")]
    channel_id: u32,
}

/// A client's text message.
pub(super) fn parse_text(text: &str) -> Result<Request, String> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| format!("not a JSON message: {e}"))?;
    let op = value
        .get("op")
        .and_then(Value::as_str)
        .ok_or("a message without an \"op\"")?;
    match op {
        "subscribe" => {
            let subscriptions: Vec<SubscriptionRequest> = value
                .get("subscriptions")
                .cloned()
                .map(serde_json::from_value)
                .transpose()
                .map_err(|e| format!("subscribe: {e}"))?
                .ok_or("subscribe without \"subscriptions\"")?;
            Ok(Request::Subscribe(
                subscriptions
                    .into_iter()
                    .map(|s| (s.id, s.channel_id))
                    .collect(),
            ))
        }
        "unsubscribe" => {
            let ids: Vec<u32> = value
                .get("subscriptionIds")
                .cloned()
                .map(serde_json::from_value)
                .transpose()
                .map_err(|e| format!("unsubscribe: {e}"))?
                .ok_or("unsubscribe without \"subscriptionIds\"")?;
            Ok(Request::Unsubscribe(ids))
        }
        other => Ok(Request::Unsupported(other.chars().take(64).collect())),
    }
}

/// A client's binary message.
pub(super) fn parse_binary(bytes: &[u8]) -> Result<Request, String> {
    let u32_at = |at: usize| -> Result<u32, String> {
        bytes
            .get(at..at + 4)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map(u32::from_le_bytes)
            .ok_or_else(|| "a binary message cut short".to_string())
    };
    match bytes.first() {
        Some(&SERVICE_CALL_REQUEST) => {
            let service_id = u32_at(1)?;
            let call_id = u32_at(5)?;
            let length = usize::try_from(u32_at(9)?).map_err(|e| e.to_string())?;
            let encoding = bytes
                .get(13..13usize.saturating_add(length))
                .ok_or("a service call's encoding cut short")?;
            let encoding = std::str::from_utf8(encoding)
                .map_err(|_| "a service call's encoding is not text")?
                .to_string();
            let payload = bytes.get(13 + length..).unwrap_or_default().to_vec();
            Ok(Request::ServiceCall {
                service_id,
                call_id,
                encoding,
                payload,
            })
        }
        Some(op) => Ok(Request::Unsupported(format!("binary opcode {op:#04x}"))),
        None => Err("an empty binary message".into()),
    }
}

/// The JSON Schema of `foxglove.SceneUpdate` as rozd fills it (entities
/// with cubes, cylinders and arrows).
fn scene_schema() -> Value {
    let time = json!({"type": "object", "properties": {
        "sec": {"type": "integer"}, "nsec": {"type": "integer"}}});
    let vector = json!({"type": "object", "properties": {
        "x": {"type": "number"}, "y": {"type": "number"}, "z": {"type": "number"}}});
    let pose = json!({"type": "object", "properties": {
        "position": vector,
        "orientation": {"type": "object", "properties": {
            "x": {"type": "number"}, "y": {"type": "number"},
            "z": {"type": "number"}, "w": {"type": "number"}}}}});
    let color = json!({"type": "object", "properties": {
        "r": {"type": "number"}, "g": {"type": "number"},
        "b": {"type": "number"}, "a": {"type": "number"}}});
    let primitive = json!({"type": "array", "items": {"type": "object", "properties": {
        "pose": pose, "size": vector, "color": color}}});
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "foxglove.SceneUpdate",
        "type": "object",
        "description": "The simulated room and rover (Foxglove's foxglove.SceneUpdate)",
        "properties": {
            "deletions": {"type": "array", "items": {"type": "object"}},
            "entities": {"type": "array", "items": {"type": "object", "properties": {
                "timestamp": time,
                "frame_id": {"type": "string"},
                "id": {"type": "string"},
                "lifetime": time,
                "frame_locked": {"type": "boolean"},
                "metadata": {"type": "array"},
                "arrows": primitive,
                "cubes": primitive,
                "spheres": primitive,
                "cylinders": primitive,
                "lines": {"type": "array"},
                "triangles": {"type": "array"},
                "texts": {"type": "array"},
                "models": {"type": "array"}
            }, "required": ["frame_id", "id"]}}
        },
        "required": ["deletions", "entities"]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_have_unique_ids_and_the_recordings_topics() {
        let list = channels(&["front"], &["drive"], &["cam"], true);
        let topics: Vec<&str> = list.iter().map(|c| c.topic.as_str()).collect();
        assert_eq!(
            topics,
            [
                "/observation",
                "/protective_stop",
                "/audit",
                "/sessions",
                "/tasks",
                "/sensors/front",
                "/actuators/drive",
                "/cameras/cam",
                "/sim/scene"
            ]
        );
        let ids: Vec<u32> = list.iter().map(|c| c.id).collect();
        assert_eq!(ids, (1..=9).collect::<Vec<_>>());
        assert_eq!(list[7].schema.name(), "foxglove.CompressedImage");
        assert!(
            !channels(&[], &[], &[], false)
                .iter()
                .any(|c| c.topic == SCENE_TOPIC)
        );
        // Each schema is carried as a JSON string.
        let advertised: Value = serde_json::from_str(&advertise(&list)).unwrap();
        let schema = advertised["channels"][0]["schema"].as_str().unwrap();
        let schema: Value = serde_json::from_str(schema).unwrap();
        assert_eq!(schema["title"], "rozd.Observation");
    }

    #[test]
    fn message_data_is_opcode_subscription_time_payload() {
        let frame = message_data(0x0102_0304, 0x1122_3344_5566_7788, b"{}");
        assert_eq!(
            frame,
            [
                1, 4, 3, 2, 1, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, b'{', b'}'
            ]
        );
    }

    #[test]
    fn a_service_call_round_trips() {
        let mut call = vec![2u8];
        call.extend_from_slice(&5u32.to_le_bytes());
        call.extend_from_slice(&77u32.to_le_bytes());
        call.extend_from_slice(&4u32.to_le_bytes());
        call.extend_from_slice(b"json{\"a\":1}");
        assert_eq!(
            parse_binary(&call),
            Ok(Request::ServiceCall {
                service_id: 5,
                call_id: 77,
                encoding: "json".into(),
                payload: b"{\"a\":1}".to_vec()
            })
        );
        // Cut anywhere in the header: an error, not a panic.
        for cut in 0..13 {
            assert!(parse_binary(&call[..cut]).is_err(), "{cut}");
        }
        let mut lying = call[..13].to_vec();
        lying[9..13].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(parse_binary(&lying).is_err());
        let response = service_call_response(5, 77, b"{}");
        assert_eq!(response[0], 3);
        assert_eq!(&response[1..13], &call[1..13]);
        assert_eq!(&response[13..], b"json{}");
    }

    #[test]
    fn client_text_messages() {
        assert_eq!(
            parse_text(r#"{"op":"subscribe","subscriptions":[{"id":3,"channelId":1}]}"#),
            Ok(Request::Subscribe(vec![(3, 1)]))
        );
        assert_eq!(
            parse_text(r#"{"op":"unsubscribe","subscriptionIds":[3]}"#),
            Ok(Request::Unsubscribe(vec![3]))
        );
        assert_eq!(
            parse_text(r#"{"op":"getParameters","parameterNames":[]}"#),
            Ok(Request::Unsupported("getParameters".into()))
        );
        for bad in [
            "nope",
            "{}",
            r#"{"op":"subscribe"}"#,
            r#"{"op":"subscribe","subscriptions":[{"id":-1,"channelId":1}]}"#,
        ] {
            assert!(parse_text(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn services_need_what_their_rest_twins_need() {
        use crate::api::scopes::{Need, need};
        use http::Method;
        let rest = |path| match need(&Method::POST, path) {
            Need::Authenticated => None,
            Need::Scope(scope) => Some(scope),
            Need::Public => panic!("{path} is public"),
        };
        assert_eq!(Service::ProtectiveStop.needs(), rest("/v1/estop"));
        assert_eq!(
            Service::ClearProtectiveStop.needs(),
            rest("/v1/estop/clear")
        );
        assert_eq!(Service::Approve.needs(), rest("/v1/approvals/x"));
        assert_eq!(Service::Deny.needs(), rest("/v1/approvals/x"));
        assert_eq!(Service::CommandActuator.needs(), rest("/mcp"));
        for s in Service::ALL {
            assert_eq!(Service::from_id(s as u32), Some(s));
        }
    }
}
