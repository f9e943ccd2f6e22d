//! The StreamSession protocol, rule by rule, over loopback with a real tonic
//! client against the real server and the offline `local` model.

use crate::common;
use crate::common::{text_of, until_complete};

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Session, TestDaemon, expect_error};
use rozd::api::proto;
use rozd::api::proto::session_request::Request as Req;
use rozd::api::proto::session_response::Response as Resp;
use serde_json::json;

fn schema(v: serde_json::Value) -> Option<prost_types::Struct> {
    Some(rozd::api::convert::json_to_struct(&v))
}

fn tool(name: &str, category: proto::ToolCategoryHint, timeout_ms: u32) -> proto::ToolSchema {
    proto::ToolSchema {
        name: name.into(),
        description: format!("test tool {name}"),
        parameters_schema: schema(json!({"type": "object"})),
        timeout_ms,
        category: category as i32,
    }
}

fn pure(name: &str) -> proto::ToolSchema {
    tool(name, proto::ToolCategoryHint::ToolCategoryPure, 5_000)
}

fn physical(name: &str) -> proto::ToolSchema {
    tool(name, proto::ToolCategoryHint::ToolCategoryPhysical, 5_000)
}

fn user(content: &str) -> Req {
    Req::UserMessage(proto::UserMessage {
        content: content.into(),
        ..Default::default()
    })
}

fn user_with_id(content: &str, id: &str) -> Req {
    Req::UserMessage(proto::UserMessage {
        content: content.into(),
        message_id: Some(id.into()),
        ..Default::default()
    })
}

fn result(id: &str, text: &str) -> Req {
    Req::ToolResult(proto::ToolResult {
        tool_call_id: id.into(),
        success: true,
        result: text.into(),
        exit_code: Some(0),
        ..Default::default()
    })
}

async fn open(daemon: &TestDaemon, tools: Vec<proto::ToolSchema>) -> Session {
    let mut client = daemon.agent().await;
    let mut session = Session::open(&mut client).await;
    session
        .start(proto::StartSession {
            environment_id: "test".into(),
            tools,
            ..Default::default()
        })
        .await;
    session
}

/// Paused-clock tests wait through long virtual timeouts.
const PAUSED_WAIT: Duration = Duration::from_secs(24 * 3600);

/// Everything up to and including the next `TurnComplete`.
async fn next_tool_request(session: &mut Session) -> proto::ToolRequest {
    loop {
        match session.next().await {
            Resp::ToolRequest(r) => return r,
            Resp::TurnComplete(t) => panic!("turn ended before a ToolRequest: {t:?}"),
            Resp::Error(e) => panic!("error before a ToolRequest: {e:?}"),
            _ => {}
        }
    }
}

/// Waits for `ActivityUpdate{waiting_approval}` and returns its tool_call_id.
async fn next_approval(session: &mut Session) -> String {
    loop {
        match session.next().await {
            Resp::ActivityUpdate(a) if a.state == "waiting_approval" => return a.detail,
            Resp::ToolRequest(r) => panic!("tool requested without approval: {r:?}"),
            Resp::TurnComplete(t) => panic!("turn ended before approval: {t:?}"),
            _ => {}
        }
    }
}

// ---------------------------------------------------------------- start

#[tokio::test]
async fn session_started_lists_configured_then_default_permissions() {
    let daemon = TestDaemon::start(
        "[[permissions]]\ntool_pattern = \"cam_*\"\npolicy = \"allow\"\ncategory = \"physical\"\nreason = \"cameras are harmless\"\n",
    )
    .await;
    let mut client = daemon.agent().await;
    let mut session = Session::open(&mut client).await;
    let started = session.start(proto::StartSession::default()).await;
    let rules: Vec<(&str, &str, Option<&str>)> = started
        .permissions
        .iter()
        .map(|p| {
            (
                p.tool_pattern.as_str(),
                p.policy.as_str(),
                p.category.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        rules,
        [
            ("cam_*", "allow", Some("physical")),
            ("*", "require_confirmation", Some("physical")),
            ("*", "allow", Some("pure")),
        ]
    );
    assert_eq!(
        started.permissions[0].reason.as_deref(),
        Some("cameras are harmless")
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn second_start_is_already_started_and_not_fatal() {
    let daemon = TestDaemon::start("").await;
    let mut session = open(&daemon, vec![]).await;
    session
        .send(Req::Start(proto::StartSession::default()))
        .await;
    let err = expect_error(session.next_significant().await);
    assert_eq!(
        (err.code.as_str(), err.retryable),
        ("already_started", false)
    );
    session.send(Req::Ping(proto::Ping {})).await;
    assert!(matches!(session.next_significant().await, Resp::Pong(_)));
    daemon.shutdown().await;
}

#[tokio::test]
async fn host_id_of_another_host_is_host_not_found() {
    let daemon = TestDaemon::start("[host]\nid = \"rover-9\"\n").await;
    let mut client = daemon.agent().await;
    let mut session = Session::open(&mut client).await;
    session
        .send(Req::Start(proto::StartSession {
            host_id: Some("elsewhere".into()),
            ..Default::default()
        }))
        .await;
    let err = expect_error(session.next_significant().await);
    assert_eq!(
        (err.code.as_str(), err.retryable),
        ("host_not_found", false)
    );
    assert!(err.message.contains("elsewhere"));
    // Not fatal: the right host id starts the session on the same stream.
    session
        .start(proto::StartSession {
            host_id: Some("rover-9".into()),
            ..Default::default()
        })
        .await;
    daemon.shutdown().await;
}

#[tokio::test]
async fn unknown_model_is_invalid_argument_naming_known_models() {
    let daemon = TestDaemon::start("").await;
    let mut client = daemon.agent().await;
    let mut session = Session::open(&mut client).await;
    session
        .send(Req::Start(proto::StartSession {
            model: Some("gpt-imaginary".into()),
            ..Default::default()
        }))
        .await;
    let err = expect_error(session.next_significant().await);
    assert_eq!(err.code, "invalid_argument");
    assert!(
        err.message.contains("gpt-imaginary") && err.message.contains("local"),
        "{}",
        err.message
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn unconvertible_history_is_invalid_argument_naming_the_index() {
    let daemon = TestDaemon::start("").await;
    let mut client = daemon.agent().await;
    let mut session = Session::open(&mut client).await;
    let text = |t: &str| proto::ContentPart {
        part: Some(proto::content_part::Part::Text(proto::TextContent {
            text: t.into(),
        })),
    };
    let history = vec![
        proto::ConversationMessage {
            role: "user".into(),
            parts: vec![text("hello")],
        },
        proto::ConversationMessage {
            role: "assistant".into(),
            parts: vec![text("hi"), proto::ContentPart { part: None }],
        },
    ];
    session
        .send(Req::Start(proto::StartSession {
            history,
            ..Default::default()
        }))
        .await;
    let err = expect_error(session.next_significant().await);
    assert_eq!(err.code, "invalid_argument");
    assert!(
        err.message.contains("history[1].parts[1]"),
        "{}",
        err.message
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn history_and_project_context_reach_the_model() {
    let daemon = TestDaemon::start("").await;
    let mut client = daemon.agent().await;
    let mut session = Session::open(&mut client).await;
    session
        .start(proto::StartSession {
            project_context: vec!["PROJECT-ALPHA".into(), "PROJECT-BETA".into()],
            ..Default::default()
        })
        .await;
    session.send(user("context")).await;
    let (seen, _) = until_complete(&mut session).await;
    let text = text_of(&seen);
    let alpha = text
        .find("PROJECT-ALPHA")
        .expect("first block in the system prompt");
    let beta = text
        .find("PROJECT-BETA")
        .expect("second block in the system prompt");
    assert!(alpha < beta, "project_context keeps its order: {text}");
    daemon.shutdown().await;
}

// ---------------------------------------------------------------- turns

#[tokio::test]
async fn all_deltas_of_a_turn_come_before_turn_complete_with_its_message_id() {
    let daemon = TestDaemon::start("").await;
    let mut session = open(&daemon, vec![]).await;
    session
        .send(user_with_id(
            "echo one two three four five six seven eight nine ten",
            "m-42",
        ))
        .await;
    let (seen, done) = until_complete(&mut session).await;
    let deltas: Vec<&proto::TextDelta> = seen
        .iter()
        .filter_map(|r| match r {
            Resp::TextDelta(d) => Some(d),
            _ => None,
        })
        .collect();
    assert!(deltas.len() >= 3, "several deltas: {seen:?}");
    assert!(deltas.iter().all(|d| d.message_id == "m-42"));
    assert!(
        seen.iter()
            .any(|r| matches!(r, Resp::ThinkingDelta(t) if t.message_id == "m-42"))
    );
    assert_eq!(
        text_of(&seen),
        "one two three four five six seven eight nine ten\n"
    );
    assert_eq!(done.message_id, "m-42");
    assert_eq!(done.stop_reason, "end_turn");
    let usage = done.usage.expect("usage");
    assert!(usage.input_tokens > 0 && usage.output_tokens > 0);
    // After TurnComplete nothing of that turn follows: the next message is ours.
    session.send(Req::Ping(proto::Ping {})).await;
    assert!(matches!(session.next_significant().await, Resp::Pong(_)));
    daemon.shutdown().await;
}

#[tokio::test]
async fn message_id_is_generated_when_absent() {
    let daemon = TestDaemon::start("").await;
    let mut session = open(&daemon, vec![]).await;
    session.send(user("echo hi")).await;
    let (seen, done) = until_complete(&mut session).await;
    assert!(uuid::Uuid::parse_str(&done.message_id).is_ok());
    assert!(seen.iter().all(|r| match r {
        Resp::TextDelta(d) => d.message_id == done.message_id,
        Resp::ThinkingDelta(d) => d.message_id == done.message_id,
        _ => true,
    }));
    daemon.shutdown().await;
}

#[tokio::test]
async fn next_message_right_after_turn_complete_is_never_refused() {
    let daemon = TestDaemon::start("").await;
    let mut session = open(&daemon, vec![]).await;
    for i in 0..25 {
        session
            .send(user_with_id(&format!("echo turn {i}"), &format!("m{i}")))
            .await;
        let (seen, done) = until_complete(&mut session).await;
        assert!(
            !seen.iter().any(|r| matches!(r, Resp::Error(_))),
            "turn {i}: {seen:?}"
        );
        assert_eq!(done.message_id, format!("m{i}"));
    }
    daemon.shutdown().await;
}

#[tokio::test]
async fn user_message_during_a_turn_is_turn_in_progress() {
    let daemon = TestDaemon::start("").await;
    let mut session = open(&daemon, vec![]).await;
    session
        .send(user_with_id("wait 600000; echo slow", "slow"))
        .await;
    session.send(user("echo impatient")).await;
    let err = expect_error(session.next_significant().await);
    assert_eq!(
        (err.code.as_str(), err.retryable),
        ("turn_in_progress", true)
    );
    let (_, done) = session.cancel_turn().await;
    assert_eq!(
        (done.message_id.as_str(), done.stop_reason.as_str()),
        ("slow", "cancelled")
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn context_blocks_and_turn_system_context_reach_the_model_for_that_turn_only() {
    let daemon = TestDaemon::start("").await;
    let mut session = open(&daemon, vec![]).await;
    session
        .send(Req::UserMessage(proto::UserMessage {
            content: "context".into(),
            system_context: Some("TURN-ONLY-GUIDANCE".into()),
            context: vec![
                proto::ContentBlock {
                    block: Some(proto::content_block::Block::Text("LABELLED-NOTE".into())),
                    label: Some("note".into()),
                },
                proto::ContentBlock {
                    block: Some(proto::content_block::Block::Binary(proto::BinaryContent {
                        mime_type: "image/png".into(),
                        data: vec![0x89, b'P', b'N', b'G'],
                    })),
                    label: None,
                },
            ],
            ..Default::default()
        }))
        .await;
    let (seen, _) = until_complete(&mut session).await;
    let text = text_of(&seen);
    assert!(text.contains("TURN-ONLY-GUIDANCE"), "{text}");
    assert!(text.contains("[note]\nLABELLED-NOTE"), "{text}");
    assert!(text.contains("image: image/png, 4 bytes"), "{text}");
    session.send(user("context")).await;
    let (seen, _) = until_complete(&mut session).await;
    assert!(
        !text_of(&seen).contains("TURN-ONLY-GUIDANCE"),
        "system_context is for one turn only"
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn invalid_ai_mode_is_invalid_argument() {
    let daemon = TestDaemon::start("").await;
    let mut session = open(&daemon, vec![]).await;
    session
        .send(Req::UserMessage(proto::UserMessage {
            content: "echo x".into(),
            ai_mode: Some("yolo".into()),
            ..Default::default()
        }))
        .await;
    assert_eq!(
        expect_error(session.next_significant().await).code,
        "invalid_argument"
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn max_cycles_ends_the_turn() {
    let daemon = TestDaemon::start("[session]\nmax_cycles = 2\n").await;
    let mut session = open(&daemon, vec![pure("step")]).await;
    session
        .send(user("call step {}; call step {}; call step {}"))
        .await;
    for _ in 0..2 {
        let request = next_tool_request(&mut session).await;
        session.send(result(&request.tool_call_id, "ok")).await;
    }
    let (seen, done) = until_complete(&mut session).await;
    assert!(!seen.iter().any(|r| matches!(r, Resp::ToolRequest(_))));
    assert_eq!(done.stop_reason, "max_cycles");
    daemon.shutdown().await;
}

#[tokio::test]
async fn max_tokens_stop_reason() {
    let daemon = TestDaemon::start("[model]\nmax_output_tokens = 20\n").await;
    let mut session = open(&daemon, vec![]).await;
    session
        .send(user(
            "echo this answer is much longer than twenty tokens allow, so it must stop early",
        ))
        .await;
    let (_, done) = until_complete(&mut session).await;
    assert_eq!(done.stop_reason, "max_tokens");
    daemon.shutdown().await;
}

#[tokio::test]
async fn usage_is_summed_over_every_model_call_of_the_turn() {
    let daemon = TestDaemon::start("").await;
    let mut session = open(&daemon, vec![pure("probe")]).await;
    session.send(user("echo baseline")).await;
    let (_, one_call) = until_complete(&mut session).await;
    let one = one_call.usage.unwrap();
    session.send(user("call probe {}")).await;
    let request = next_tool_request(&mut session).await;
    session.send(result(&request.tool_call_id, "probed")).await;
    let (_, two_calls) = until_complete(&mut session).await;
    let two = two_calls.usage.unwrap();
    // Two model calls, each of which reads at least the whole first turn.
    assert!(
        two.input_tokens > 2 * one.input_tokens,
        "{one:?} vs {two:?}"
    );
    daemon.shutdown().await;
}

// ---------------------------------------------------------------- client tools

#[tokio::test]
async fn client_tool_round_trip_reports_everything_to_the_model() {
    let daemon = TestDaemon::start("").await;
    let mut sum = pure("sum");
    sum.timeout_ms = 1234;
    sum.parameters_schema = schema(json!({
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"]
    }));
    let mut session = open(&daemon, vec![sum]).await;
    session.send(user("call sum {\"a\": 2, \"b\": 40}")).await;
    let request = next_tool_request(&mut session).await;
    assert_eq!(request.tool_name, "sum");
    assert_eq!(request.timeout_ms, 1234);
    let params =
        rozd::api::convert::struct_to_json(request.parameters.as_ref().unwrap(), "p").unwrap();
    assert_eq!(params, json!({"a": 2, "b": 40}));
    session
        .send(Req::ToolResult(proto::ToolResult {
            tool_call_id: request.tool_call_id.clone(),
            success: false,
            result: "42 (partial)".into(),
            exit_code: Some(3),
            truncated: true,
            duration_ms: Some(17),
        }))
        .await;
    let (seen, done) = until_complete(&mut session).await;
    assert_eq!(done.stop_reason, "end_turn");
    assert_eq!(
        text_of(&seen),
        "sum failed: 42 (partial)\n[exit code 3; output truncated; took 17 ms]\n"
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn tool_without_timeout_gets_the_configured_default() {
    let daemon = TestDaemon::start("[session]\ndefault_tool_timeout_ms = 4321\n").await;
    let mut session = open(
        &daemon,
        vec![tool("t", proto::ToolCategoryHint::ToolCategoryPure, 0)],
    )
    .await;
    session.send(user("call t {}")).await;
    assert_eq!(next_tool_request(&mut session).await.timeout_ms, 4321);
    daemon.shutdown().await;
}

#[tokio::test]
async fn invalid_parameters_go_back_to_the_model_not_the_client() {
    let daemon = TestDaemon::start("").await;
    let mut t = pure("move");
    t.parameters_schema = schema(json!({
        "type": "object",
        "properties": {"speed": {"type": "number", "maximum": 1}},
        "required": ["speed"]
    }));
    let mut session = open(&daemon, vec![t]).await;
    session.send(user("call move {\"speed\": 7}")).await;
    let (seen, done) = until_complete(&mut session).await;
    assert!(
        !seen.iter().any(|r| matches!(r, Resp::ToolRequest(_))),
        "no request reaches the client"
    );
    assert!(!seen.iter().any(|r| matches!(r, Resp::Error(_))));
    let text = text_of(&seen);
    assert!(
        text.contains("move failed: invalid parameters for `move`") && text.contains("/speed"),
        "{text}"
    );
    assert_eq!(done.stop_reason, "end_turn");
    daemon.shutdown().await;
}

#[tokio::test]
async fn unknown_tool_from_the_model_is_an_error_result() {
    let daemon = TestDaemon::start("").await;
    let mut session = open(&daemon, vec![pure("real")]).await;
    session.send(user("call imaginary {}")).await;
    let (seen, _) = until_complete(&mut session).await;
    assert!(!seen.iter().any(|r| matches!(r, Resp::ToolRequest(_))));
    assert!(text_of(&seen).contains("unknown tool `imaginary`; available: real"));
    daemon.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn client_tool_timeout_is_enforced_and_late_results_are_ignored() {
    let daemon = TestDaemon::setup("").paused_clock().start().await;
    let mut session = open(
        &daemon,
        vec![tool(
            "slow",
            proto::ToolCategoryHint::ToolCategoryPure,
            1_500,
        )],
    )
    .await;
    session.wait_bound = PAUSED_WAIT;
    session.send(user("call slow {}")).await;
    let request = next_tool_request(&mut session).await;
    let sent_at = tokio::time::Instant::now();
    let err = loop {
        match session.next().await {
            Resp::Error(e) => break e,
            Resp::TurnComplete(t) => panic!("turn ended without a timeout error: {t:?}"),
            _ => {}
        }
    };
    assert_eq!((err.code.as_str(), err.retryable), ("tool_timeout", true));
    assert!(
        err.message.contains(&request.tool_call_id),
        "{}",
        err.message
    );
    assert!(sent_at.elapsed() >= Duration::from_millis(1_500));
    let (seen, done) = until_complete(&mut session).await;
    assert_eq!(done.stop_reason, "end_turn");
    assert!(
        text_of(&seen).contains("slow failed: `slow` timed out after 1500 ms"),
        "{seen:?}"
    );
    // The late result is ignored: no error, the session goes on.
    session
        .send(result(&request.tool_call_id, "too late"))
        .await;
    session.send(Req::Ping(proto::Ping {})).await;
    assert!(matches!(session.next_significant().await, Resp::Pong(_)));
    daemon.shutdown().await;
}

#[tokio::test]
async fn unknown_and_duplicate_tool_results_are_ignored() {
    let daemon = TestDaemon::start("").await;
    let mut session = open(&daemon, vec![pure("a"), pure("b")]).await;
    session.send(user("call a {}; call b {}")).await;
    let first = next_tool_request(&mut session).await;
    session.send(result("no-such-call", "stray")).await;
    session.send(result(&first.tool_call_id, "A-OK")).await;
    let second = next_tool_request(&mut session).await;
    assert_eq!(second.tool_name, "b");
    session.send(result(&first.tool_call_id, "DUPLICATE")).await;
    session.send(result(&second.tool_call_id, "B-OK")).await;
    let (seen, done) = until_complete(&mut session).await;
    assert!(
        !seen.iter().any(|r| matches!(r, Resp::Error(_))),
        "{seen:?}"
    );
    assert_eq!(
        text_of(&seen),
        "a returned: A-OK\n[exit code 0]\nb returned: B-OK\n[exit code 0]\n"
    );
    assert_eq!(done.stop_reason, "end_turn");
    daemon.shutdown().await;
}

/// The turn reads its inbox as it goes; a client that floods a turn busy
/// with its model (64 inputs it has not read) is told each input past that
/// was not taken, and the session keeps answering (it never waits for room).
#[tokio::test]
async fn a_flood_of_inputs_for_a_busy_turn_is_refused_and_the_session_still_answers() {
    let daemon = TestDaemon::start("").await;
    let mut session = open(&daemon, vec![]).await;
    session.send(user("wait 600000; echo never")).await;
    session.until_activity("thinking").await;
    for n in 0..64 {
        session.send(result(&format!("stray-{n}"), "x")).await;
    }
    session.send(result("stray-64", "x")).await;
    let err = expect_error(session.next_significant().await);
    assert_eq!(err.code, "rate_limited");
    assert!(
        err.message.contains("ToolResult stray-64 not taken"),
        "{}",
        err.message
    );
    session.send(Req::Ping(proto::Ping {})).await;
    assert!(matches!(session.next_significant().await, Resp::Pong(_)));
    let (_, done) = session.cancel_turn().await;
    assert_eq!(done.stop_reason, "cancelled");
    daemon.shutdown().await;
}

#[tokio::test]
async fn tool_result_without_a_turn_is_no_active_turn() {
    let daemon = TestDaemon::start("").await;
    let mut session = open(&daemon, vec![]).await;
    session.send(result("whatever", "x")).await;
    let err = expect_error(session.next_significant().await);
    assert_eq!(
        (err.code.as_str(), err.retryable),
        ("no_active_turn", false)
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn success_contradicting_exit_code_is_invalid_and_the_call_still_waits() {
    let daemon = TestDaemon::start("").await;
    let mut session = open(&daemon, vec![pure("run")]).await;
    session.send(user("call run {}")).await;
    let request = next_tool_request(&mut session).await;
    session
        .send(Req::ToolResult(proto::ToolResult {
            tool_call_id: request.tool_call_id.clone(),
            success: true,
            result: "claims success".into(),
            exit_code: Some(2),
            ..Default::default()
        }))
        .await;
    let err = expect_error(session.next_significant().await);
    assert_eq!(err.code, "invalid_argument");
    assert!(err.message.contains("exit_code"));
    session.send(result(&request.tool_call_id, "fixed")).await;
    let (seen, _) = until_complete(&mut session).await;
    assert_eq!(text_of(&seen), "run returned: fixed\n[exit code 0]\n");
    daemon.shutdown().await;
}

#[tokio::test]
async fn register_tools_replaces_a_source_and_empty_list_unregisters() {
    let daemon = TestDaemon::start("").await;
    let mut session = open(&daemon, vec![pure("sim__old"), pure("keep")]).await;
    session
        .send(Req::RegisterTools(proto::RegisterTools {
            source: Some("sim".into()),
            tools: vec![pure("sim__new")],
            system_context: Some("SIM-GUIDANCE".into()),
        }))
        .await;
    session.send(user("call sim__old {}")).await;
    let (seen, _) = until_complete(&mut session).await;
    assert!(
        text_of(&seen).contains("unknown tool `sim__old`"),
        "{}",
        text_of(&seen)
    );
    session.send(user("context")).await;
    let (seen, _) = until_complete(&mut session).await;
    assert!(
        text_of(&seen).contains("SIM-GUIDANCE"),
        "system_context kept for the next turn"
    );
    session.send(user("call sim__new {}")).await;
    let request = next_tool_request(&mut session).await;
    session.send(result(&request.tool_call_id, "new ok")).await;
    until_complete(&mut session).await;

    session
        .send(Req::RegisterTools(proto::RegisterTools {
            source: Some("sim".into()),
            tools: vec![],
            system_context: None,
        }))
        .await;
    session.send(user("call sim__new {}; call keep {}")).await;
    let request = next_tool_request(&mut session).await;
    assert_eq!(request.tool_name, "keep", "sim__new is gone, keep stays");
    session.send(result(&request.tool_call_id, "kept")).await;
    let (seen, _) = until_complete(&mut session).await;
    assert!(text_of(&seen).contains("unknown tool `sim__new`"));
    daemon.shutdown().await;
}

#[tokio::test]
async fn register_tools_name_conflict_is_invalid_argument_and_changes_nothing() {
    let daemon = TestDaemon::start("").await;
    let mut session = open(&daemon, vec![pure("sim__a")]).await;
    session
        .send(Req::RegisterTools(proto::RegisterTools {
            source: Some("sim".into()),
            tools: vec![pure("sim__b"), pure("sim__b")],
            system_context: None,
        }))
        .await;
    assert_eq!(
        expect_error(session.next_significant().await).code,
        "invalid_argument"
    );
    session.send(user("call sim__a {}")).await;
    assert_eq!(next_tool_request(&mut session).await.tool_name, "sim__a");
    daemon.shutdown().await;
}

#[tokio::test]
async fn user_message_tools_are_the_tool_set_of_that_turn_only() {
    let daemon = TestDaemon::start("").await;
    let mut session = open(&daemon, vec![pure("session_tool")]).await;
    session
        .send(Req::UserMessage(proto::UserMessage {
            content: "call turn_tool {}; call session_tool {}".into(),
            tools: vec![pure("turn_tool")],
            ..Default::default()
        }))
        .await;
    let request = next_tool_request(&mut session).await;
    assert_eq!(request.tool_name, "turn_tool");
    session.send(result(&request.tool_call_id, "t")).await;
    let (seen, _) = until_complete(&mut session).await;
    assert!(
        text_of(&seen).contains("unknown tool `session_tool`"),
        "the snapshot replaces the session tools"
    );
    session
        .send(user("call turn_tool {}; call session_tool {}"))
        .await;
    let request = next_tool_request(&mut session).await;
    assert_eq!(request.tool_name, "session_tool");
    session.send(result(&request.tool_call_id, "s")).await;
    let (seen, _) = until_complete(&mut session).await;
    assert!(text_of(&seen).contains("unknown tool `turn_tool`"));
    daemon.shutdown().await;
}

#[tokio::test]
async fn malformed_tool_schema_is_invalid_argument_and_the_session_survives() {
    let daemon = TestDaemon::start("").await;
    let mut session = open(&daemon, vec![]).await;
    let mut bad = pure("bad");
    bad.parameters_schema = Some(prost_types::Struct {
        fields: [("type".to_string(), prost_types::Value { kind: None })]
            .into_iter()
            .collect(),
    });
    session
        .send(Req::RegisterTools(proto::RegisterTools {
            source: None,
            tools: vec![bad],
            system_context: None,
        }))
        .await;
    let err = expect_error(session.next_significant().await);
    assert_eq!(err.code, "invalid_argument");
    assert!(
        err.message
            .contains("register_tools.tools[0].parameters_schema"),
        "{}",
        err.message
    );
    session.send(user("echo still here")).await;
    let (seen, _) = until_complete(&mut session).await;
    assert_eq!(text_of(&seen), "still here\n");
    daemon.shutdown().await;
}

// ---------------------------------------------------------------- approvals and presence

#[tokio::test]
async fn physical_tool_waits_for_approval_then_runs() {
    let daemon = TestDaemon::start("").await;
    let mut session = open(&daemon, vec![physical("arm")]).await;
    session.send(user("call arm {}")).await;
    let mut presence = Vec::new();
    let call_id = loop {
        match session.next().await {
            Resp::PresenceHint(p) => presence.push(p.level),
            Resp::ActivityUpdate(a) if a.state == "waiting_approval" => break a.detail,
            Resp::ToolRequest(r) => panic!("PHYSICAL tool ran without approval: {r:?}"),
            _ => {}
        }
    };
    // Presence while waiting for a PHYSICAL approval is "full".
    if let Resp::PresenceHint(p) = session.next().await {
        presence.push(p.level);
    }
    assert_eq!(presence, ["mini", "full"]);
    session
        .send(Req::PermissionDecision(proto::PermissionDecision {
            tool_call_id: call_id.clone(),
            approved: true,
        }))
        .await;
    let request = next_tool_request(&mut session).await;
    assert_eq!(request.tool_call_id, call_id);
    session.send(result(&call_id, "moved")).await;
    let (seen, _) = until_complete(&mut session).await;
    assert!(text_of(&seen).contains("arm returned: moved"));
    daemon.shutdown().await;
}

#[tokio::test]
async fn denied_approval_tells_the_model_and_never_runs_the_tool() {
    let daemon = TestDaemon::start("").await;
    let mut session = open(&daemon, vec![physical("arm")]).await;
    session.send(user("call arm {}")).await;
    let call_id = next_approval(&mut session).await;
    session
        .send(Req::PermissionDecision(proto::PermissionDecision {
            tool_call_id: call_id,
            approved: false,
        }))
        .await;
    let (seen, done) = until_complete(&mut session).await;
    assert!(!seen.iter().any(|r| matches!(r, Resp::ToolRequest(_))));
    assert!(text_of(&seen).contains("arm failed: the user denied `arm`"));
    assert_eq!(done.stop_reason, "end_turn");
    daemon.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn approval_timeout_counts_as_denied() {
    let daemon = TestDaemon::setup("[session]\napproval_timeout_secs = 30\n")
        .paused_clock()
        .start()
        .await;
    let mut session = open(&daemon, vec![physical("arm")]).await;
    session.wait_bound = PAUSED_WAIT;
    session.send(user("call arm {}")).await;
    next_approval(&mut session).await;
    let asked_at = tokio::time::Instant::now();
    let (seen, _) = until_complete(&mut session).await;
    assert!(asked_at.elapsed() >= Duration::from_secs(30));
    assert!(!seen.iter().any(|r| matches!(r, Resp::ToolRequest(_))));
    assert!(text_of(&seen).contains("the user denied `arm`"));
    daemon.shutdown().await;
}

#[tokio::test]
async fn blocked_tools_never_run() {
    let daemon = TestDaemon::start(
        "[[permissions]]\ntool_pattern = \"danger*\"\npolicy = \"block\"\nreason = \"never\"\n",
    )
    .await;
    let mut session = open(&daemon, vec![pure("danger_zone")]).await;
    session.send(user("call danger_zone {}")).await;
    let (seen, _) = until_complete(&mut session).await;
    assert!(!seen.iter().any(|r| matches!(r, Resp::ToolRequest(_))));
    assert!(
        !seen
            .iter()
            .any(|r| matches!(r, Resp::ActivityUpdate(a) if a.state == "waiting_approval"))
    );
    assert!(
        text_of(&seen).contains("`danger_zone` is blocked by policy: never"),
        "{}",
        text_of(&seen)
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn allow_rule_skips_approval_for_a_physical_tool() {
    let daemon =
        TestDaemon::start("[[permissions]]\ntool_pattern = \"lamp\"\npolicy = \"allow\"\n").await;
    let mut session = open(&daemon, vec![physical("lamp")]).await;
    session.send(user("call lamp {}")).await;
    let request = next_tool_request(&mut session).await;
    assert_eq!(request.tool_name, "lamp");
    daemon.shutdown().await;
}

#[tokio::test]
async fn activity_and_presence_follow_the_turn() {
    let daemon = TestDaemon::start("").await;
    let mut session = open(&daemon, vec![pure("look")]).await;
    session.send(user("call look {}")).await;
    let mut states = Vec::new();
    let mut presence = Vec::new();
    loop {
        match session.next().await {
            Resp::ActivityUpdate(a) => states.push(format!("{}:{}", a.state, a.detail)),
            Resp::PresenceHint(p) => presence.push(p.level),
            Resp::ToolRequest(r) => session.send(result(&r.tool_call_id, "seen")).await,
            Resp::TurnComplete(_) => break,
            _ => {}
        }
    }
    assert_eq!(
        states,
        [
            "thinking:ooda cycle 1",
            "calling_tool:look",
            "thinking:ooda cycle 2",
            "idle:"
        ]
    );
    assert_eq!(presence, ["mini", "hidden"]);
    daemon.shutdown().await;
}

// ---------------------------------------------------------------- cancel, disconnect, keepalive

#[tokio::test]
async fn cancel_turn_during_the_model_stream() {
    let daemon = TestDaemon::start("").await;
    let mut session = open(&daemon, vec![]).await;
    session
        .send(user_with_id("wait 600000; echo never", "long"))
        .await;
    // The turn has started once the model is reported thinking.
    loop {
        if let Resp::ActivityUpdate(a) = session.next().await
            && a.state == "thinking"
        {
            break;
        }
    }
    let (seen, done) = session.cancel_turn().await;
    assert_eq!(
        (done.message_id.as_str(), done.stop_reason.as_str()),
        ("long", "cancelled")
    );
    assert!(text_of(&seen).is_empty());
    session.send(user("echo after cancel")).await;
    let (seen, done) = until_complete(&mut session).await;
    assert_eq!(
        (text_of(&seen).as_str(), done.stop_reason.as_str()),
        ("after cancel\n", "end_turn")
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn cancel_turn_during_a_tool_wait_keeps_the_conversation_usable() {
    let daemon = TestDaemon::start("").await;
    let mut session = open(&daemon, vec![pure("hang")]).await;
    session.send(user("call hang {}")).await;
    let request = next_tool_request(&mut session).await;
    let (_, done) = session.cancel_turn().await;
    assert_eq!(done.stop_reason, "cancelled");
    // A result for the cancelled call now has no turn.
    session.send(result(&request.tool_call_id, "late")).await;
    assert_eq!(
        expect_error(session.next_significant().await).code,
        "no_active_turn"
    );
    session.send(user("echo next")).await;
    let (seen, _) = until_complete(&mut session).await;
    assert_eq!(text_of(&seen), "next\n");
    daemon.shutdown().await;
}

#[tokio::test]
async fn cancel_turn_without_a_turn_is_no_active_turn() {
    let daemon = TestDaemon::start("").await;
    let mut session = open(&daemon, vec![]).await;
    session
        .send(Req::CancelTurn(proto::CancelTurn { reason: "x".into() }))
        .await;
    assert_eq!(
        expect_error(session.next_significant().await).code,
        "no_active_turn"
    );
    daemon.shutdown().await;
}

/// Records hook calls and signals each one.
#[derive(Debug)]
struct RecordingHooks {
    calls: Mutex<Vec<String>>,
    tx: tokio::sync::mpsc::UnboundedSender<String>,
}

impl RecordingHooks {
    fn new() -> (Arc<Self>, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (
            Arc::new(RecordingHooks {
                calls: Mutex::new(Vec::new()),
                tx,
            }),
            rx,
        )
    }
    fn record(&self, call: String) {
        self.calls.lock().unwrap().push(call.clone());
        let _ = self.tx.send(call);
    }
}

impl rozd::session::SessionHooks for RecordingHooks {
    fn turn_interrupted(&self, _session_id: &str, reason: &str) {
        self.record(format!("turn_interrupted:{reason}"));
    }
    fn session_ended(&self, _session_id: &str, reason: &str) {
        self.record(format!("session_ended:{reason}"));
    }
}

async fn wait_for(rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>, wanted: &str) {
    loop {
        let call = tokio::time::timeout(common::EXPECT_WITHIN, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("hook {wanted} was not called"))
            .expect("hooks alive");
        if call == wanted {
            return;
        }
    }
}

#[tokio::test]
async fn cancel_session_ends_the_turn_and_closes_the_stream() {
    let (hooks, mut calls) = RecordingHooks::new();
    let daemon = TestDaemon::setup("").hooks(hooks.clone()).start().await;
    let mut session = open(&daemon, vec![pure("hang")]).await;
    session.send(user_with_id("call hang {}", "t1")).await;
    next_tool_request(&mut session).await;
    session
        .send(Req::CancelSession(proto::CancelSession {
            reason: "bye".into(),
        }))
        .await;
    let (_, done) = until_complete(&mut session).await;
    assert_eq!(
        (done.message_id.as_str(), done.stop_reason.as_str()),
        ("t1", "cancelled")
    );
    session.closed().await.expect("the stream closes cleanly");
    wait_for(&mut calls, "session_ended:cancel_session").await;
    assert!(
        hooks
            .calls
            .lock()
            .unwrap()
            .iter()
            .any(|c| c.starts_with("turn_interrupted"))
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn client_disconnect_mid_turn_ends_the_session() {
    let (hooks, mut calls) = RecordingHooks::new();
    let daemon = TestDaemon::setup("").hooks(hooks.clone()).start().await;
    let ctx = daemon.host.clone();
    let mut session = open(&daemon, vec![pure("hang")]).await;
    session.send(user("call hang {}")).await;
    next_tool_request(&mut session).await;
    drop(session);
    wait_for(&mut calls, "session_ended:disconnect").await;
    assert!(
        hooks
            .calls
            .lock()
            .unwrap()
            .contains(&"turn_interrupted:disconnect".to_string())
    );
    tokio::time::timeout(common::EXPECT_WITHIN, ctx.sessions().wait_idle())
        .await
        .expect("the session closes");
    let recorded = ctx.store().sessions(10, 0).await.unwrap();
    assert_eq!(recorded[0].end_reason.as_deref(), Some("disconnect"));
    assert_eq!(recorded[0].turns, 1, "the interrupted turn is recorded");
    daemon.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn keepalive_arrives_every_keepalive_secs_with_token_counts() {
    let daemon = TestDaemon::setup("[session]\nkeepalive_secs = 7\n")
        .paused_clock()
        .start()
        .await;
    let mut client = daemon.agent().await;
    let mut session = Session::open(&mut client).await;
    session.wait_bound = PAUSED_WAIT;
    session
        .start(proto::StartSession {
            max_context_tokens: Some(50_000),
            ..Default::default()
        })
        .await;
    let mut arrivals = Vec::new();
    while arrivals.len() < 4 {
        if let Resp::Keepalive(k) = session.next().await {
            assert_eq!(k.tokens_max, Some(50_000));
            assert!(k.tokens_used.is_some());
            arrivals.push(tokio::time::Instant::now());
        }
    }
    for pair in arrivals.windows(2) {
        assert_eq!(pair[1] - pair[0], Duration::from_secs(7));
    }
    daemon.shutdown().await;
}

#[tokio::test]
async fn ping_is_answered_with_pong() {
    let daemon = TestDaemon::start("").await;
    let mut session = open(&daemon, vec![]).await;
    session.send(Req::Ping(proto::Ping {})).await;
    assert!(matches!(session.next_significant().await, Resp::Pong(_)));
    daemon.shutdown().await;
}

#[tokio::test]
async fn feedback_is_stored_and_bad_ratings_are_refused() {
    let daemon = TestDaemon::start("").await;
    let mut client = daemon.agent().await;
    let mut session = Session::open(&mut client).await;
    let started = session.start(proto::StartSession::default()).await;
    session
        .send(Req::Feedback(proto::MessageFeedback {
            session_id: started.session_id.clone(),
            message_id: "m1".into(),
            rating: "up".into(),
        }))
        .await;
    session
        .send(Req::Feedback(proto::MessageFeedback {
            session_id: started.session_id.clone(),
            message_id: "m1".into(),
            rating: "meh".into(),
        }))
        .await;
    // Feedback is acknowledged by nothing; the bad rating is the next response.
    assert_eq!(
        expect_error(session.next_significant().await).code,
        "invalid_argument"
    );
    assert_eq!(
        daemon
            .host
            .store()
            .feedback_count(started.session_id)
            .await
            .unwrap(),
        1
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn context_over_budget_is_compacted_by_dropping_old_turns() {
    let daemon = TestDaemon::start("").await;
    let mut client = daemon.agent().await;
    let mut session = Session::open(&mut client).await;
    let long = "word ".repeat(300);
    let text = |t: &str| proto::ContentPart {
        part: Some(proto::content_part::Part::Text(proto::TextContent {
            text: t.into(),
        })),
    };
    let history = (0..4)
        .flat_map(|i| {
            [
                proto::ConversationMessage {
                    role: "user".into(),
                    parts: vec![text(&format!("old question {i} {long}"))],
                },
                proto::ConversationMessage {
                    role: "assistant".into(),
                    parts: vec![text(&format!("old answer {i} {long}"))],
                },
            ]
        })
        .collect();
    session
        .start(proto::StartSession {
            history,
            max_context_tokens: Some(1_200),
            ..Default::default()
        })
        .await;
    session.send(user("echo fits")).await;
    let (seen, done) = until_complete(&mut session).await;
    let c = seen
        .iter()
        .find_map(|r| match r {
            Resp::ContextCompacted(c) => Some(c.clone()),
            _ => None,
        })
        .expect("ContextCompacted before the model call");
    assert!(c.tokens_before > 1_200 && c.tokens_after <= 1_200, "{c:?}");
    assert!(c.messages_after < c.messages_before);
    assert_eq!(done.stop_reason, "end_turn");
    assert_eq!(text_of(&seen), "fits\n");
    daemon.shutdown().await;
}

#[tokio::test]
async fn a_turn_that_cannot_fit_the_budget_is_budget_exceeded() {
    let daemon = TestDaemon::start("").await;
    let mut client = daemon.agent().await;
    let mut session = Session::open(&mut client).await;
    session
        .start(proto::StartSession {
            max_context_tokens: Some(50),
            ..Default::default()
        })
        .await;
    session
        .send(user(&format!("echo {}", "word ".repeat(200))))
        .await;
    let (seen, done) = until_complete(&mut session).await;
    let err = seen
        .iter()
        .find_map(|r| match r {
            Resp::Error(e) => Some(e.clone()),
            _ => None,
        })
        .expect("an error");
    assert_eq!(err.code, "budget_exceeded");
    assert_eq!(done.stop_reason, "error");
    daemon.shutdown().await;
}
