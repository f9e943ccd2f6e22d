//! The published field numbers, checked against hand-built protobuf bytes so a
//! renumbering in `proto/roz/v1/agent.proto` fails here.

use prost::Message;
use rozd::api::proto;

/// A field number and a check that the decoded oneof is the expected variant.
type Case<T> = (u32, fn(&T) -> bool);

use crate::common::wire::{ld, varint};

#[test]
fn session_response_field_11_is_activity_update() {
    let activity = [ld(1, b"calling_tool"), ld(2, b"read_sensor")].concat();
    let bytes = ld(11, &activity);
    let decoded = proto::SessionResponse::decode(bytes.as_slice()).unwrap();
    let Some(proto::session_response::Response::ActivityUpdate(a)) = &decoded.response else {
        panic!("field 11 must be activity_update, got {decoded:?}");
    };
    assert_eq!(
        (a.state.as_str(), a.detail.as_str()),
        ("calling_tool", "read_sensor")
    );
    assert_eq!(decoded.encode_to_vec(), bytes);
}

#[test]
fn session_response_numbers_1_to_10() {
    use proto::session_response::Response as R;
    let cases: Vec<Case<R>> = vec![
        (1, |r| matches!(r, R::SessionStarted(_))),
        (2, |r| matches!(r, R::TextDelta(_))),
        (3, |r| matches!(r, R::ThinkingDelta(_))),
        (4, |r| matches!(r, R::ToolRequest(_))),
        (5, |r| matches!(r, R::TurnComplete(_))),
        (6, |r| matches!(r, R::Error(_))),
        (7, |r| matches!(r, R::Keepalive(_))),
        (8, |r| matches!(r, R::Pong(_))),
        (9, |r| matches!(r, R::ContextCompacted(_))),
        (10, |r| matches!(r, R::PresenceHint(_))),
    ];
    for (field, is) in cases {
        let decoded = proto::SessionResponse::decode(ld(field, &[]).as_slice()).unwrap();
        assert!(
            decoded.response.as_ref().is_some_and(is),
            "field {field}: {decoded:?}"
        );
    }
}

#[test]
fn session_request_numbers() {
    use proto::session_request::Request as R;
    let cases: Vec<Case<R>> = vec![
        (1, |r| matches!(r, R::Start(_))),
        (2, |r| matches!(r, R::UserMessage(_))),
        (3, |r| matches!(r, R::ToolResult(_))),
        (4, |r| matches!(r, R::CancelTurn(_))),
        (5, |r| matches!(r, R::CancelSession(_))),
        (6, |r| matches!(r, R::Ping(_))),
        (7, |r| matches!(r, R::Feedback(_))),
        (8, |r| matches!(r, R::PermissionDecision(_))),
        (9, |r| matches!(r, R::RegisterTools(_))),
    ];
    for (field, is) in cases {
        let decoded = proto::SessionRequest::decode(ld(field, &[]).as_slice()).unwrap();
        assert!(
            decoded.request.as_ref().is_some_and(is),
            "field {field}: {decoded:?}"
        );
    }
}

#[test]
fn start_session_fields_and_optional_presence() {
    let tool = [
        ld(1, b"gripper"),
        ld(2, b"moves the gripper"),
        varint(4, 1500),
        varint(5, 1),
    ]
    .concat();
    let bytes = [
        ld(1, b"env-1"),
        ld(2, b"host-a"),
        ld(3, b"claude-x"),
        ld(4, &tool),
        ld(6, b"AGENTS.md text"),
        varint(7, 4096),
    ]
    .concat();
    let s = proto::StartSession::decode(bytes.as_slice()).unwrap();
    assert_eq!(s.environment_id, "env-1");
    assert_eq!(s.host_id.as_deref(), Some("host-a"));
    assert_eq!(s.model.as_deref(), Some("claude-x"));
    assert_eq!(s.tools[0].name, "gripper");
    assert_eq!(s.tools[0].timeout_ms, 1500);
    assert_eq!(
        s.tools[0].category(),
        proto::ToolCategoryHint::ToolCategoryPhysical
    );
    assert_eq!(s.project_context, ["AGENTS.md text"]);
    assert_eq!(s.max_context_tokens, Some(4096));
    // proto3 `optional`: an explicitly sent empty string is present.
    let present = proto::StartSession::decode(ld(2, b"").as_slice()).unwrap();
    assert_eq!(present.host_id.as_deref(), Some(""));
    assert_eq!(proto::StartSession::decode(&[][..]).unwrap().host_id, None);
}

#[test]
fn tool_result_and_turn_complete_fields() {
    let bytes = [
        ld(1, b"call-1"),
        varint(2, 1),
        ld(3, b"ok"),
        varint(4, 0),
        varint(5, 1),
        varint(6, 42),
    ]
    .concat();
    let r = proto::ToolResult::decode(bytes.as_slice()).unwrap();
    assert_eq!(
        (
            r.tool_call_id.as_str(),
            r.success,
            r.result.as_str(),
            r.exit_code,
            r.truncated,
            r.duration_ms
        ),
        ("call-1", true, "ok", Some(0), true, Some(42))
    );
    let usage = [varint(1, 10), varint(2, 20), varint(3, 30), varint(4, 40)].concat();
    let bytes = [ld(1, b"m-1"), ld(2, &usage), ld(3, b"end_turn")].concat();
    let t = proto::TurnComplete::decode(bytes.as_slice()).unwrap();
    let u = t.usage.unwrap();
    assert_eq!(
        (
            u.input_tokens,
            u.output_tokens,
            u.cache_read_tokens,
            u.cache_creation_tokens
        ),
        (10, 20, 30, 40)
    );
    assert_eq!(
        (t.message_id.as_str(), t.stop_reason.as_str()),
        ("m-1", "end_turn")
    );
}

#[test]
fn user_message_and_content_block_fields() {
    let block = [
        ld(2, &[ld(1, b"image/png"), ld(2, &[1, 2, 3])].concat()),
        ld(3, b"camera"),
    ]
    .concat();
    let bytes = [
        ld(1, b"hello"),
        ld(2, &block),
        ld(3, b"ooda_re_act"),
        ld(4, b"msg-9"),
        ld(6, b"sys"),
    ]
    .concat();
    let m = proto::UserMessage::decode(bytes.as_slice()).unwrap();
    assert_eq!(m.content, "hello");
    assert_eq!(m.ai_mode.as_deref(), Some("ooda_re_act"));
    assert_eq!(m.message_id.as_deref(), Some("msg-9"));
    assert_eq!(m.system_context.as_deref(), Some("sys"));
    assert_eq!(m.context[0].label.as_deref(), Some("camera"));
    let Some(proto::content_block::Block::Binary(b)) = &m.context[0].block else {
        panic!("binary block")
    };
    assert_eq!(
        (b.mime_type.as_str(), b.data.as_slice()),
        ("image/png", &[1u8, 2, 3][..])
    );
}

#[test]
fn team_event_numbers() {
    let started =
        proto::TeamEvent::decode(ld(1, &[ld(1, b"w1"), ld(2, b"h1")].concat()).as_slice()).unwrap();
    assert!(
        matches!(started.event, Some(proto::team_event::Event::WorkerStarted(ref w)) if w.worker_id == "w1" && w.host_id == "h1")
    );
    let exited =
        proto::TeamEvent::decode(ld(6, &[ld(1, b"w1"), ld(2, b"t1")].concat()).as_slice()).unwrap();
    assert!(
        matches!(exited.event, Some(proto::team_event::Event::WorkerExited(ref w)) if w.parent_task_id == "t1")
    );
}
