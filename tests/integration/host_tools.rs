//! Host tools through real sessions: the local model drives simulated
//! actuators; approvals, limits, protective stop, deadman, ownership, OODA
//! context and the audit.

use crate::common;
use crate::common::{text_of, until_complete};

use common::{Session, TestDaemon, expect_error};
use rozd::api::proto;
use rozd::api::proto::session_request::Request as Req;
use rozd::api::proto::session_response::Response as Resp;

const HOST: &str = r#"
[[sensors]]
name = "distance"
source = "sim"
unit = "m"
signal = "constant"
offset = 1.25
rate_hz = 50

[[actuators]]
name = "speed"
kind = "sim"
unit = "m/s"
min = -1.0
max = 1.0
safe_value = 0.0

[[actuators]]
name = "lamp"
kind = "sim"
allowed = [0, 1]
safe_value = 0
"#;

/// `speed` runs without approval so deadman tests need no dialogue.
const ALLOW_SPEED: &str = "[[permissions]]\ntool_pattern = \"speed\"\npolicy = \"allow\"\n";

async fn host(extra: &str) -> TestDaemon {
    TestDaemon::start(&format!("{HOST}\n{extra}")).await
}

async fn open(daemon: &TestDaemon, tools: Vec<proto::ToolSchema>) -> (Session, String) {
    let mut client = daemon.agent().await;
    let mut session = Session::open(&mut client).await;
    let started = session
        .start(proto::StartSession {
            tools,
            ..Default::default()
        })
        .await;
    (session, started.session_id)
}

fn user(text: &str) -> Req {
    Req::UserMessage(proto::UserMessage {
        content: text.into(),
        ..Default::default()
    })
}

fn errors(seen: &[Resp]) -> Vec<String> {
    seen.iter()
        .filter_map(|r| match r {
            Resp::Error(e) => Some(e.code.clone()),
            _ => None,
        })
        .collect()
}

async fn wait_safe(daemon: &TestDaemon, actuator: &str) {
    let mut rx = daemon.host.ooda().subscribe();
    tokio::time::timeout(common::EXPECT_WITHIN, async {
        loop {
            let at_safe = rx
                .borrow_and_update()
                .actuators
                .iter()
                .any(|a| a.name == actuator && a.at_safe_value);
            if at_safe
                && daemon.host.ooda().actuators().value(actuator)
                    == daemon
                        .host
                        .ooda()
                        .actuators()
                        .spec(actuator)
                        .map(|s| s.safe_value)
            {
                return;
            }
            rx.changed().await.expect("loop alive");
        }
    })
    .await
    .expect("actuator back at its safe value");
}

async fn audit(daemon: &TestDaemon, session_id: &str) -> Vec<serde_json::Value> {
    let reply = rozd::cli::client::get(
        &daemon.addr.to_string(),
        &format!("/v1/audit?session={session_id}"),
        None,
    )
    .await
    .unwrap();
    assert_eq!(reply.status, 200, "{}", reply.body);
    let v: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    v["data"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn host_tools_appear_in_permissions_and_client_tools_may_not_shadow_them() {
    let daemon = host("").await;
    let mut client = daemon.agent().await;
    let mut session = Session::open(&mut client).await;
    let started = session.start(proto::StartSession::default()).await;
    let rule = |name: &str| {
        started
            .permissions
            .iter()
            .find(|p| p.tool_pattern == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(
        (
            rule("observe").policy.as_str(),
            rule("observe").category.as_deref()
        ),
        ("allow", Some("pure"))
    );
    assert_eq!(
        (
            rule("speed").policy.as_str(),
            rule("speed").category.as_deref()
        ),
        ("require_confirmation", Some("physical"))
    );
    assert_eq!(
        (
            rule("stop_all").policy.as_str(),
            rule("stop_all").category.as_deref()
        ),
        ("allow", Some("physical")),
        "going safe is never gated by an approval"
    );
    assert!(
        started
            .permissions
            .iter()
            .all(|p| p.tool_pattern != "serial_query"),
        "no raw port configured"
    );

    let shadow = proto::ToolSchema {
        name: "observe".into(),
        ..Default::default()
    };
    let mut other = Session::open(&mut client).await;
    other
        .send(Req::Start(proto::StartSession {
            tools: vec![shadow.clone()],
            ..Default::default()
        }))
        .await;
    let err = expect_error(other.next_significant().await);
    assert_eq!(err.code, "invalid_argument");
    assert!(err.message.contains("host tool"), "{}", err.message);
    session
        .send(Req::RegisterTools(proto::RegisterTools {
            source: None,
            tools: vec![shadow],
            system_context: None,
        }))
        .await;
    assert_eq!(
        expect_error(session.next_significant().await).code,
        "invalid_argument"
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn the_local_model_moves_an_actuator_after_approval_and_reads_it_back() {
    let daemon = host("").await;
    let (mut session, session_id) = open(&daemon, vec![]).await;
    session.send(user("set speed 0.3")).await;
    let call_id = loop {
        match session.next().await {
            Resp::ActivityUpdate(a) if a.state == "waiting_approval" => break a.detail,
            Resp::ToolRequest(r) => panic!("host tools never go to the client: {r:?}"),
            Resp::TurnComplete(t) => panic!("no approval asked: {t:?}"),
            _ => {}
        }
    };
    assert_eq!(
        daemon.host.sim_actuator("speed").unwrap().value(),
        Some(0.0),
        "nothing moves before approval"
    );
    session
        .send(Req::PermissionDecision(proto::PermissionDecision {
            tool_call_id: call_id.clone(),
            approved: true,
        }))
        .await;
    let (seen, done) = until_complete(&mut session).await;
    assert_eq!(done.stop_reason, "end_turn");
    assert!(seen.iter().any(
        |r| matches!(r, Resp::ActivityUpdate(a) if a.state == "calling_tool" && a.detail == "speed")
    ));
    assert!(
        seen.iter()
            .any(|r| matches!(r, Resp::PresenceHint(p) if p.level == "full"))
    );
    assert!(
        text_of(&seen).contains("speed returned:"),
        "{}",
        text_of(&seen)
    );
    assert_eq!(
        daemon.host.sim_actuator("speed").unwrap().value(),
        Some(0.3)
    );

    session.send(user("status")).await;
    let (seen, _) = until_complete(&mut session).await;
    let text = text_of(&seen);
    // `status` reads as a table (issue 35, item 14).
    let speed = text
        .lines()
        .find(|l| l.starts_with("speed "))
        .unwrap_or_else(|| panic!("a row for speed: {text}"));
    assert!(speed.contains(" 0.3"), "{text}");

    let records = audit(&daemon, &session_id).await;
    let call = records
        .iter()
        .find(|r| r["kind"] == "tool_call" && r["tool_call_id"] == call_id.as_str())
        .expect("audited");
    assert_eq!(
        (call["tool"].as_str(), call["decision"].as_str()),
        (Some("speed"), Some("approved"))
    );
    assert_eq!(call["parameters"]["value"], 0.3);
    assert!(call["duration_ms"].is_i64() && call["started_at_ms"].is_i64());
    daemon.shutdown().await;
}

#[tokio::test]
async fn out_of_range_and_non_numeric_values_are_safety_violations() {
    let daemon = host(ALLOW_SPEED).await;
    let (mut session, session_id) = open(&daemon, vec![]).await;
    for prompt in ["set speed 5", "call speed {\"value\": \"NaN\"}"] {
        session.send(user(prompt)).await;
        let (seen, _) = until_complete(&mut session).await;
        assert_eq!(errors(&seen), ["safety_violation"], "{prompt}");
        assert!(
            text_of(&seen).contains("speed failed: `speed` refused"),
            "{}",
            text_of(&seen)
        );
    }
    assert_eq!(daemon.host.sim_actuator("speed").unwrap().history(), [0.0]);
    let refused = audit(&daemon, &session_id)
        .await
        .into_iter()
        .filter(|r| r["decision"] == "refused")
        .count();
    assert_eq!(refused, 2);
    daemon.shutdown().await;
}

#[tokio::test]
async fn protective_stop_refuses_physical_calls_while_observe_still_works() {
    let daemon = host(ALLOW_SPEED).await;
    let (mut session, _) = open(&daemon, vec![]).await;
    session.send(user("set speed 0.5")).await;
    until_complete(&mut session).await;
    daemon
        .host
        .ooda()
        .trigger_stop(rozd::safety::StopRequest::new(
            &rozd::safety::StopSource::Rest,
            "bumper hit",
        ))
        .await;
    assert_eq!(
        daemon.host.sim_actuator("speed").unwrap().value(),
        Some(0.0)
    );
    session.send(user("set speed 0.2")).await;
    let (seen, _) = until_complete(&mut session).await;
    assert_eq!(errors(&seen), ["e_stop"]);
    let err = seen
        .iter()
        .find_map(|r| match r {
            Resp::Error(e) => Some(e.clone()),
            _ => None,
        })
        .unwrap();
    assert!(!err.retryable);
    session.send(user("read distance")).await;
    let (seen, _) = until_complete(&mut session).await;
    assert!(errors(&seen).is_empty());
    assert!(
        text_of(&seen).contains("read_sensor returned:") && text_of(&seen).contains("1.25"),
        "{}",
        text_of(&seen)
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn disconnect_returns_the_sessions_actuators_to_safe() {
    let daemon = host(ALLOW_SPEED).await;
    let (mut session, session_id) = open(&daemon, vec![]).await;
    session.send(user("set speed 0.4")).await;
    until_complete(&mut session).await;
    assert_eq!(daemon.host.ooda().actuators().value("speed"), Some(0.4));
    drop(session);
    wait_safe(&daemon, "speed").await;
    tokio::time::timeout(common::EXPECT_WITHIN, daemon.host.sessions().wait_idle())
        .await
        .unwrap();
    let records = audit(&daemon, &session_id).await;
    assert!(
        records.iter().any(|r| r["kind"] == "actuator"
            && r["actuator"] == "speed"
            && r["origin"].as_str().unwrap_or("").contains("disconnect")),
        "{records:?}"
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn cancel_session_returns_the_sessions_actuators_to_safe() {
    let daemon = host(ALLOW_SPEED).await;
    let (mut session, _) = open(&daemon, vec![]).await;
    session.send(user("set speed -0.4")).await;
    until_complete(&mut session).await;
    session
        .send(Req::CancelSession(proto::CancelSession {
            reason: "done".into(),
        }))
        .await;
    session.closed().await.unwrap();
    wait_safe(&daemon, "speed").await;
    daemon.shutdown().await;
}

#[tokio::test]
async fn cancel_turn_returns_the_sessions_actuators_to_safe() {
    let daemon = host(ALLOW_SPEED).await;
    let hang = proto::ToolSchema {
        name: "hang".into(),
        category: proto::ToolCategoryHint::ToolCategoryPure as i32,
        timeout_ms: 60_000,
        ..Default::default()
    };
    let (mut session, _) = open(&daemon, vec![hang]).await;
    session.send(user("set speed 0.6; call hang {}")).await;
    loop {
        if let Resp::ToolRequest(r) = session.next().await {
            assert_eq!(r.tool_name, "hang");
            break;
        }
    }
    assert_eq!(daemon.host.ooda().actuators().value("speed"), Some(0.6));
    let (_, done) = session.cancel_turn().await;
    assert_eq!(done.stop_reason, "cancelled");
    wait_safe(&daemon, "speed").await;
    daemon.shutdown().await;
}

#[tokio::test]
async fn another_session_cannot_take_a_held_actuator() {
    let daemon = host(ALLOW_SPEED).await;
    let (mut first, _) = open(&daemon, vec![]).await;
    first.send(user("set speed 0.2")).await;
    until_complete(&mut first).await;
    let (mut second, _) = open(&daemon, vec![]).await;
    second.send(user("set speed 0.9")).await;
    let (seen, _) = until_complete(&mut second).await;
    assert_eq!(errors(&seen), ["permission_denied"]);
    assert_eq!(daemon.host.ooda().actuators().value("speed"), Some(0.2));
    daemon.shutdown().await;
}

#[tokio::test]
async fn ooda_mode_puts_the_observation_in_the_context_and_react_does_not() {
    let daemon = host("").await;
    let (mut session, _) = open(&daemon, vec![]).await;
    session.send(user("context")).await;
    let (seen, _) = until_complete(&mut session).await;
    let text = text_of(&seen);
    assert!(
        text.contains("Current observation #") && text.contains("sensor distance = 1.2500 m"),
        "{text}"
    );
    assert!(
        seen.iter()
            .any(|r| matches!(r, Resp::ActivityUpdate(a) if a.detail == "ooda cycle 1"))
    );
    session
        .send(Req::UserMessage(proto::UserMessage {
            content: "context".into(),
            ai_mode: Some("react".into()),
            ..Default::default()
        }))
        .await;
    let (seen, _) = until_complete(&mut session).await;
    assert!(!text_of(&seen).contains("Current observation"));
    daemon.shutdown().await;
}

#[tokio::test]
async fn the_audit_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("rozd.db");
    let daemon = TestDaemon::start_with_store(&store, &format!("{HOST}\n{ALLOW_SPEED}")).await;
    let (mut session, session_id) = open(&daemon, vec![]).await;
    session.send(user("set speed 0.1")).await;
    until_complete(&mut session).await;
    drop(session);
    daemon.shutdown().await;
    let again = TestDaemon::start_with_store(&store, HOST).await;
    let records = audit(&again, &session_id).await;
    assert!(
        records.iter().any(|r| r["kind"] == "tool_call"
            && r["tool"] == "speed"
            && r["decision"] == "allowed"),
        "{records:?}"
    );
    again.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_serial_actuator_times_out_and_ends_at_its_safe_value() {
    use tokio::io::AsyncBufReadExt;
    use tokio_serial::SerialPortBuilderExt;
    let dir = tempfile::tempdir().unwrap();
    let pty = common::pty::PtyPair::start(dir.path()).await;
    let config = format!(
        "[[serial]]\nname = \"mcu\"\npath = {:?}\n\n[[actuators]]\nname = \"valve\"\nkind = \"serial\"\nport = \"mcu\"\n\
         template = \"V {{value}}\\n\"\nexpect = \"^OK\"\nreply_timeout_ms = 60000\ntimeout_ms = 300\nmin = 0\nmax = 1\nsafe_value = 0\n\n\
         [[permissions]]\ntool_pattern = \"valve\"\npolicy = \"allow\"\n",
        pty.a.display().to_string()
    );
    let device = tokio_serial::new(pty.b.to_string_lossy(), 9600)
        .open_native_async()
        .unwrap();
    let mut device = tokio::io::BufReader::new(device).lines();
    let daemon = TestDaemon::start(&config).await;
    // Start-up drives the safe value first; the device never answers anything.
    let first = tokio::time::timeout(common::EXPECT_WITHIN, device.next_line())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.as_deref(), Some("V 0"));
    let (mut session, session_id) = open(&daemon, vec![]).await;
    session.send(user("set valve 1")).await;
    let line = tokio::time::timeout(common::EXPECT_WITHIN, device.next_line())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(line.as_deref(), Some("V 1"));
    let (seen, done) = until_complete(&mut session).await;
    assert_eq!(errors(&seen), ["tool_timeout"]);
    assert!(
        text_of(&seen).contains("did not finish within 300 ms"),
        "{}",
        text_of(&seen)
    );
    assert_eq!(done.stop_reason, "end_turn");
    // The safe value was sent to the device and is what the host holds.
    let safe = tokio::time::timeout(common::EXPECT_WITHIN, device.next_line())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(safe.as_deref(), Some("V 0"));
    assert_eq!(daemon.host.ooda().actuators().value("valve"), Some(0.0));
    let records = audit(&daemon, &session_id).await;
    assert!(
        records.iter().any(|r| r["kind"] == "tool_call"
            && r["tool"] == "valve"
            && r["error"].as_str().unwrap_or("").contains("300 ms")),
        "{records:?}"
    );
    daemon.shutdown().await;
}

/// Hooks that panic when a turn is interrupted: a fault inside the session
/// loop itself (not inside a turn).
#[derive(Debug)]
struct PanickingHooks;

impl rozd::session::SessionHooks for PanickingHooks {
    fn turn_interrupted(&self, _session_id: &str, _reason: &str) {
        panic!("injected fault in the session loop");
    }
    fn session_ended(&self, _session_id: &str, _reason: &str) {}
}

#[tokio::test]
async fn a_panic_in_the_session_loop_still_drives_its_actuators_safe() {
    let daemon = TestDaemon::setup(&format!("{HOST}\n{ALLOW_SPEED}"))
        .hooks(std::sync::Arc::new(PanickingHooks))
        .start()
        .await;
    let (mut session, id) = open(&daemon, vec![]).await;
    session.send(user("set speed 0.5")).await;
    let (_, done) = until_complete(&mut session).await;
    assert_eq!(done.stop_reason, "end_turn");
    assert_eq!(daemon.host.ooda().actuators().value("speed"), Some(0.5));
    // A slow turn is running when the session is cancelled: closing it
    // calls the hook, which panics before the loop's own deadman runs.
    session.send(user("wait 600000; echo never")).await;
    session.until_activity("thinking").await;
    session
        .send(Req::CancelSession(proto::CancelSession {
            reason: "bye".into(),
        }))
        .await;
    wait_safe(&daemon, "speed").await;
    assert_eq!(daemon.host.ooda().actuators().value("speed"), Some(0.0));
    // The daemon goes on: the end is recorded and a new session works.
    let recorded = tokio::time::timeout(common::EXPECT_WITHIN, async {
        loop {
            let sessions = daemon.host.store().sessions(10, 0).await.unwrap();
            if let Some(s) = sessions.iter().find(|s| s.id == id)
                && s.end_reason.is_some()
            {
                return s.clone();
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the end is recorded");
    assert_eq!(recorded.end_reason.as_deref(), Some("internal_error"));
    let (mut again, _) = open(&daemon, vec![]).await;
    again.send(user("echo still here")).await;
    let (seen, _) = until_complete(&mut again).await;
    assert_eq!(text_of(&seen), "still here\n");
    daemon.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_whole_number_hold_ms_written_as_a_float_is_held_to_not_dropped() {
    let daemon = TestDaemon::setup(&format!("{HOST}\n{ALLOW_SPEED}"))
        .paused_clock()
        .start()
        .await;
    let (mut session, _) = open(&daemon, vec![]).await;
    session.wait_bound = std::time::Duration::from_secs(3600);
    let speed = daemon.host.sim_actuator("speed").unwrap();
    let mut applied = speed.applied();
    session
        .send(user("call speed {\"value\": 0.6, \"hold_ms\": 500.0}"))
        .await;
    let (seen, _) = until_complete(&mut session).await;
    let text = text_of(&seen);
    assert!(text.contains("\"hold_ms\":500"), "{text}");
    assert_eq!(speed.value(), Some(0.6));
    let commanded_at = tokio::time::Instant::now();
    // The hold expires: the actuator goes back to its safe value by itself.
    applied.borrow_and_update();
    while speed.value() != Some(0.0) {
        applied.changed().await.expect("actuator alive");
    }
    assert!(commanded_at.elapsed() <= std::time::Duration::from_millis(600));

    // Not a whole number: refused like any value the host would not apply,
    // never applied without its hold.
    session
        .send(user("call speed {\"value\": 0.6, \"hold_ms\": 500.5}"))
        .await;
    let (seen, _) = until_complete(&mut session).await;
    assert_eq!(errors(&seen), ["safety_violation"], "{}", text_of(&seen));
    assert!(text_of(&seen).contains("hold_ms"), "{}", text_of(&seen));
    assert_eq!(speed.value(), Some(0.0));
    daemon.shutdown().await;
}

#[tokio::test]
async fn stop_all_needs_no_approval_even_under_a_rule_that_asks_for_everything() {
    let daemon =
        host("[[permissions]]\ntool_pattern = \"*\"\npolicy = \"require_confirmation\"\n").await;
    daemon
        .host
        .ooda()
        .actuators()
        .command(
            "speed",
            0.5,
            rozd::ooda::act::Origin::Operator("test".into()),
            None,
        )
        .await
        .expect("speed accepted");
    let (mut session, _) = open(&daemon, vec![]).await;
    session.send(user("call stop_all {}")).await;
    let (seen, done) = until_complete(&mut session).await;
    assert!(
        !seen
            .iter()
            .any(|r| matches!(r, Resp::ActivityUpdate(a) if a.state == "waiting_approval")),
        "going safe asked for approval: {seen:?}"
    );
    assert_eq!(done.stop_reason, "end_turn");
    assert_eq!(
        daemon.host.sim_actuator("speed").unwrap().value(),
        Some(0.0)
    );
    daemon.shutdown().await;
}
