//! Sessions and turns survive a daemon restart and are readable over REST
//! (`GET /v1/sessions`, `GET /v1/sessions/{id}`).

use crate::common;

use common::{EXPECT_WITHIN, Session, TestDaemon};
use rozd::api::proto;
use rozd::api::proto::session_request::Request as Req;
use rozd::api::proto::session_response::Response as Resp;
use rozd::config::{Config, ConfigSource};
use serde_json::Value;

/// `GET path` on the daemon; the status and the body parsed as JSON.
async fn get_json(daemon: &TestDaemon, path: &str) -> (u16, Value) {
    get_json_with(daemon, path, None).await
}

async fn get_json_with(daemon: &TestDaemon, path: &str, token: Option<&str>) -> (u16, Value) {
    let reply = rozd::cli::client::get(&daemon.addr.to_string(), path, token)
        .await
        .expect("REST request");
    let body = serde_json::from_str(&reply.body)
        .unwrap_or_else(|e| panic!("GET {path}: body is not JSON ({e}): {:?}", reply.body));
    (reply.status.as_u16(), body)
}

/// Sends a user message and collects the turn: (text, TurnComplete).
async fn turn(
    session: &mut Session,
    content: &str,
    message_id: &str,
) -> (String, proto::TurnComplete) {
    session
        .send(Req::UserMessage(proto::UserMessage {
            content: content.into(),
            message_id: Some(message_id.into()),
            ..Default::default()
        }))
        .await;
    let mut text = String::new();
    loop {
        match session.next_significant().await {
            Resp::TextDelta(d) => {
                assert_eq!(d.message_id, message_id);
                text.push_str(&d.content);
            }
            Resp::ThinkingDelta(_) => {}
            Resp::TurnComplete(done) => return (text, done),
            other => panic!("unexpected response during the turn: {other:?}"),
        }
    }
}

/// The assistant text blocks of a stored turn's `messages`.
fn assistant_text(messages: &Value) -> String {
    messages
        .as_array()
        .expect("messages is an array")
        .iter()
        .filter(|m| m["role"] == "assistant")
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter(|b| b["type"] == "text")
        .filter_map(|b| b["text"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn sessions_and_turns_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("rozd.db");

    let daemon = TestDaemon::start_with_store(&store, "[host]\nid = \"rover-1\"\n").await;
    let mut client = daemon.agent().await;
    let mut session = Session::open(&mut client).await;
    let started = session
        .start(proto::StartSession {
            environment_id: "lab".into(),
            ..Default::default()
        })
        .await;
    let id = started.session_id.clone();
    let (first, done) = turn(&mut session, "echo first turn", "m-1").await;
    assert_eq!(
        (first.as_str(), done.stop_reason.as_str()),
        ("first turn\n", "end_turn")
    );
    let (second, done) = turn(&mut session, "echo second turn", "m-2").await;
    assert_eq!(
        (second.as_str(), done.stop_reason.as_str()),
        ("second turn\n", "end_turn")
    );
    session
        .send(Req::CancelSession(proto::CancelSession {
            reason: "done".into(),
        }))
        .await;
    session.closed().await.expect("stream ends cleanly");
    daemon.shutdown().await;

    let daemon = TestDaemon::start_with_store(&store, "").await;
    let (status, list) = get_json(&daemon, "/v1/sessions").await;
    assert_eq!(status, 200, "{list}");
    let data = list["data"].as_array().expect("data is an array");
    assert_eq!(data.len(), 1, "{list}");
    let listed = &data[0];
    assert_eq!(listed["id"], id.as_str());
    assert_eq!(listed["host_id"], "rover-1");
    assert_eq!(listed["environment_id"], "lab");
    assert_eq!(listed["model"], "local");
    assert_eq!(listed["end_reason"], "cancel_session");
    assert_eq!(listed["turns"], 2);
    let started_at = listed["started_at_ms"].as_i64().expect("started_at_ms");
    let ended_at = listed["ended_at_ms"].as_i64().expect("ended_at_ms");
    assert!(started_at > 0 && ended_at >= started_at, "{listed}");

    let (status, detail) = get_json(&daemon, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{detail}");
    assert_eq!(&detail["session"], listed);
    let turns = detail["turns"].as_array().expect("turns is an array");
    assert_eq!(turns.len(), 2, "{detail}");
    for (i, (t, (content, message_id, text))) in turns
        .iter()
        .zip([
            ("echo first turn", "m-1", "first turn\n"),
            ("echo second turn", "m-2", "second turn\n"),
        ])
        .enumerate()
    {
        assert_eq!(t["seq"], i, "{t}");
        assert_eq!(t["message_id"], message_id, "{t}");
        assert_eq!(t["user_content"], content, "{t}");
        assert_eq!(t["stop_reason"], "end_turn", "{t}");
        assert!(t["ai_mode"].is_string(), "{t}");
        assert!(t["input_tokens"].as_u64().is_some_and(|n| n > 0), "{t}");
        assert!(t["output_tokens"].as_u64().is_some_and(|n| n > 0), "{t}");
        assert!(t["cache_read_tokens"].is_u64(), "{t}");
        assert!(t["cache_creation_tokens"].is_u64(), "{t}");
        let (start, end) = (t["started_at_ms"].as_i64(), t["ended_at_ms"].as_i64());
        assert!(start.zip(end).is_some_and(|(s, e)| s > 0 && e >= s), "{t}");
        assert_eq!(assistant_text(&t["messages"]), text, "{t}");
        let roles: Vec<&str> = t["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["role"].as_str())
            .collect();
        assert_eq!(roles.first(), Some(&"user"), "{t}");
    }
    daemon.shutdown().await;
}

/// A daemon that dies without its graceful shutdown (its runtime is dropped,
/// so no session gets to record its end) leaves the session open in the
/// store; the next start closes it as `daemon_restart`.
#[test]
fn a_session_left_open_by_a_crash_ends_as_daemon_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("rozd.db");
    let crashing = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    let first = crashing.block_on(TestDaemon::start_with_store(&store, ""));
    let (id, session) = client_rt.block_on(async {
        let mut client = first.agent().await;
        let mut session = Session::open(&mut client).await;
        let id = session
            .start(proto::StartSession::default())
            .await
            .session_id;
        // A completed turn is recorded before its TurnComplete is sent.
        let (text, done) = turn(&mut session, "echo before the crash", "m-1").await;
        assert_eq!(
            (text.as_str(), done.stop_reason.as_str()),
            ("before the crash\n", "end_turn")
        );
        (id, session)
    });
    // The crash: every task of the first daemon is dropped mid-flight.
    drop(crashing);
    drop(first);

    client_rt.block_on(async {
        let mut session = session;
        // The old stream is gone with the daemon.
        let gone = tokio::time::timeout(EXPECT_WITHIN, session.rx.message())
            .await
            .expect("the dead daemon's stream ends in time");
        assert!(!matches!(gone, Ok(Some(_))), "{gone:?}");

        let daemon = TestDaemon::start_with_store(&store, "").await;
        let (status, detail) = get_json(&daemon, &format!("/v1/sessions/{id}")).await;
        assert_eq!(status, 200, "{detail}");
        assert_eq!(
            detail["session"]["end_reason"], "daemon_restart",
            "{detail}"
        );
        assert!(
            detail["session"]["ended_at_ms"].as_i64().is_some(),
            "{detail}"
        );
        assert_eq!(detail["session"]["turns"], 1, "{detail}");
        assert_eq!(detail["turns"][0]["user_content"], "echo before the crash");
        daemon.shutdown().await;
    });
}

#[tokio::test]
async fn sessions_are_listed_newest_first_with_limit_and_offset() {
    let daemon = TestDaemon::start("").await;
    let mut client = daemon.agent().await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let mut session = Session::open(&mut client).await;
        ids.push(
            session
                .start(proto::StartSession::default())
                .await
                .session_id,
        );
        session
            .send(Req::CancelSession(proto::CancelSession::default()))
            .await;
        session.closed().await.expect("stream ends cleanly");
    }
    ids.reverse();
    let listed = |v: &Value| -> Vec<String> {
        v["data"]
            .as_array()
            .expect("data is an array")
            .iter()
            .map(|s| s["id"].as_str().expect("id").to_string())
            .collect()
    };
    let (status, all) = get_json(&daemon, "/v1/sessions").await;
    assert_eq!(status, 200, "{all}");
    assert_eq!(listed(&all), ids);
    let (_, page) = get_json(&daemon, "/v1/sessions?limit=2").await;
    assert_eq!(listed(&page), ids[..2]);
    let (_, page) = get_json(&daemon, "/v1/sessions?limit=2&offset=2").await;
    assert_eq!(listed(&page), ids[2..]);
    let (_, page) = get_json(&daemon, "/v1/sessions?offset=3").await;
    assert!(listed(&page).is_empty());
    let (_, page) = get_json(&daemon, "/v1/sessions?limit=500&offset=0&other=x").await;
    assert_eq!(listed(&page), ids);
    daemon.shutdown().await;
}

#[tokio::test]
async fn bad_session_queries_are_json_400_and_unknown_ids_json_404() {
    let daemon = TestDaemon::start("").await;
    for query in [
        "limit=0",
        "limit=501",
        "limit=abc",
        "limit=",
        "limit=-1",
        "limit=2.5",
        "offset=-1",
        "offset=x",
        "offset=99999999999",
        "limit=1&limit=2",
    ] {
        let (status, body) = get_json(&daemon, &format!("/v1/sessions?{query}")).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!(body["error"]["code"], "invalid_argument", "{query}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{query}: {body}"
        );
    }
    for id in ["no-such-session", "9b2e0c56-0000-4000-8000-000000000000"] {
        let (status, body) = get_json(&daemon, &format!("/v1/sessions/{id}")).await;
        assert_eq!(status, 404, "{id}: {body}");
        assert_eq!(body["error"]["code"], "not_found", "{id}: {body}");
    }
    daemon.shutdown().await;
}

#[tokio::test]
async fn session_history_needs_a_token_when_tokens_are_configured() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nauth_tokens = [\"s3cret\"]\n[store]\npath = {:?}\n",
        dir.path().join("rozd.db").display().to_string()
    );
    let config = Config::parse(&text, ConfigSource::BuiltIn).unwrap();
    let daemon = TestDaemon::start_with(config, dir).await;
    let (status, body) = get_json_with(&daemon, "/v1/sessions", None).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"]["code"], "unauthenticated");
    let (status, body) = get_json_with(&daemon, "/v1/sessions/x", None).await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = get_json_with(&daemon, "/v1/sessions", Some("s3cret")).await;
    assert_eq!(status, 200, "{body}");
    daemon.shutdown().await;
}

#[tokio::test]
async fn a_session_is_visible_while_it_is_open() {
    let daemon = TestDaemon::start("").await;
    let mut client = daemon.agent().await;
    let mut session = Session::open(&mut client).await;
    let id = session
        .start(proto::StartSession::default())
        .await
        .session_id;
    let (status, detail) = get_json(&daemon, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{detail}");
    assert!(detail["session"]["ended_at_ms"].is_null(), "{detail}");
    assert!(detail["session"]["end_reason"].is_null(), "{detail}");
    assert_eq!(detail["turns"], serde_json::json!([]));
    // Reading the history does not disturb the open stream.
    session.send(Req::Ping(proto::Ping {})).await;
    assert!(matches!(session.next_significant().await, Resp::Pong(_)));
    daemon.shutdown().await;
}
