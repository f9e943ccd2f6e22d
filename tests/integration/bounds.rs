//! What one authenticated client may make rozd hold: concurrent sessions,
//! the bytes and tools one session holds, and streams per connection. Each
//! bound answers with its own clear error and the daemon keeps serving.

use crate::common;

use common::{Session, TestDaemon, expect_error, rest_get};
use rozd::api::proto;
use rozd::api::proto::session_request::Request as Req;
use rozd::api::proto::session_response::Response as Resp;

async fn daemon(session: &str, server: &str) -> TestDaemon {
    TestDaemon::setup(&format!("[session]\n{session}\n"))
        .server(server)
        .paused_clock()
        .start()
        .await
}

async fn open(daemon: &TestDaemon) -> Session {
    let mut client = daemon.agent().await;
    Session::open(&mut client).await
}

fn tool(name: &str, description: &str) -> proto::ToolSchema {
    proto::ToolSchema {
        name: name.into(),
        description: description.into(),
        ..Default::default()
    }
}

async fn still_serving(daemon: &TestDaemon) {
    let (status, body) = rest_get(daemon, "/healthz").await;
    assert_eq!((status, body["status"].as_str()), (200, Some("ok")));
}

#[tokio::test]
async fn sessions_beyond_max_sessions_are_rate_limited_until_one_ends() {
    let daemon = daemon("max_sessions = 2", "").await;
    let mut first = open(&daemon).await;
    first.start(proto::StartSession::default()).await;
    let mut second = open(&daemon).await;
    second.start(proto::StartSession::default()).await;

    let mut third = open(&daemon).await;
    third.send(Req::Start(proto::StartSession::default())).await;
    let refused = expect_error(third.next_significant().await);
    assert_eq!(refused.code, "rate_limited", "{refused:?}");
    assert!(refused.retryable, "{refused:?}");
    assert!(
        refused.message.contains("session.max_sessions"),
        "{refused:?}"
    );
    still_serving(&daemon).await;
    let (_, status) = rest_get(&daemon, "/v1/status").await;
    assert_eq!(status["sessions"]["started"], 2, "{status}");
    assert_eq!(status["sessions"]["max"], 2, "{status}");

    // One ends: its place is free again, on the same stream.
    first
        .send(Req::CancelSession(proto::CancelSession {
            reason: "done".into(),
        }))
        .await;
    first.closed().await.expect("a clean end");
    let started = third.start(proto::StartSession::default()).await;
    assert!(!started.session_id.is_empty());
    daemon.shutdown().await;
}

#[tokio::test]
async fn a_session_over_its_byte_budget_is_refused_and_the_stream_survives() {
    let daemon = daemon("max_session_bytes = 65536\nmax_session_tools = 3", "").await;
    // project_context over the budget.
    let mut session = open(&daemon).await;
    session
        .send(Req::Start(proto::StartSession {
            project_context: vec!["x".repeat(70_000)],
            ..Default::default()
        }))
        .await;
    let refused = expect_error(session.next_significant().await);
    assert_eq!(refused.code, "budget_exceeded", "{refused:?}");
    assert!(
        refused.message.contains("session.max_session_bytes"),
        "{refused:?}"
    );
    // History over it, split over many messages.
    session
        .send(Req::Start(proto::StartSession {
            history: (0..20)
                .map(|i| proto::ConversationMessage {
                    role: "user".into(),
                    parts: vec![proto::ContentPart {
                        part: Some(proto::content_part::Part::Text(proto::TextContent {
                            text: format!("{i}{}", "y".repeat(4_000)),
                        })),
                    }],
                })
                .collect(),
            ..Default::default()
        }))
        .await;
    let refused = expect_error(session.next_significant().await);
    assert_eq!(refused.code, "budget_exceeded", "{refused:?}");

    // Within it: started. Then tools: the count ...
    let started = session
        .start(proto::StartSession {
            project_context: vec!["a small context".into()],
            tools: vec![tool("a", "first")],
            ..Default::default()
        })
        .await;
    assert!(!started.session_id.is_empty());
    session
        .send(Req::RegisterTools(proto::RegisterTools {
            tools: vec![tool("b", "b"), tool("c", "c"), tool("d", "d")],
            ..Default::default()
        }))
        .await;
    let refused = expect_error(session.next_significant().await);
    assert_eq!(refused.code, "budget_exceeded", "{refused:?}");
    assert!(
        refused.message.contains("session.max_session_tools"),
        "{refused:?}"
    );
    // ... and their size, across several registrations by source.
    for i in 0..2 {
        session
            .send(Req::RegisterTools(proto::RegisterTools {
                source: Some(format!("source-{i}")),
                tools: vec![tool(&format!("source-{i}__big"), &"z".repeat(40_000))],
                ..Default::default()
            }))
            .await;
    }
    let refused = expect_error(session.next_significant().await);
    assert_eq!(refused.code, "budget_exceeded", "{refused:?}");
    assert!(
        refused.message.contains("session.max_session_bytes"),
        "{refused:?}"
    );

    // The stream and the daemon live on.
    session.send(Req::Ping(proto::Ping::default())).await;
    assert!(matches!(session.next_significant().await, Resp::Pong(_)));
    still_serving(&daemon).await;
    daemon.shutdown().await;
}

#[tokio::test]
async fn each_connection_is_told_its_stream_limit() {
    let daemon = daemon("", "max_concurrent_streams = 7").await;
    let tcp = tokio::net::TcpStream::connect(daemon.addr).await.unwrap();
    let (mut client, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(connection);
    // The server's SETTINGS arrive with the first exchange.
    let request = http::Request::get(format!("http://{}/healthz", daemon.addr))
        .body(())
        .unwrap();
    client = client.ready().await.unwrap();
    let (response, _) = client.send_request(request, true).unwrap();
    let response = tokio::time::timeout(common::EXPECT_WITHIN, response)
        .await
        .expect("answered")
        .expect("response");
    assert_eq!(response.status(), 200);
    assert_eq!(client.current_max_send_streams(), 7);
    daemon.shutdown().await;
}

#[test]
fn bounds_are_validated_naming_the_key() {
    use rozd::config::{Config, ConfigSource};
    for (text, key) in [
        ("[session]\nmax_sessions = 0\n", "session.max_sessions"),
        (
            "[session]\nmax_session_bytes = 10\n",
            "session.max_session_bytes",
        ),
        (
            "[session]\nmax_session_tools = 0\n",
            "session.max_session_tools",
        ),
        (
            "[server]\nmax_concurrent_streams = 0\n",
            "server.max_concurrent_streams",
        ),
    ] {
        let err = Config::parse(text, ConfigSource::BuiltIn)
            .expect_err(text)
            .to_string();
        assert!(err.contains(&format!("`{key}`")), "{key}: {err}");
    }
}
