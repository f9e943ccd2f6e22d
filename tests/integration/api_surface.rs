//! The API surface over loopback: AgentService, health, reflection, REST, auth.

use crate::common;

use common::{Session, TestDaemon, expect_error};
use rozd::api::proto;
use rozd::api::proto::session_request::Request as Req;
use tonic::Code;

#[tokio::test]
async fn start_session_answers_session_started() {
    let daemon = TestDaemon::start("").await;
    let mut client = daemon.agent().await;
    let mut session = Session::open(&mut client).await;
    let started = session
        .start(proto::StartSession {
            environment_id: "lab".into(),
            ..Default::default()
        })
        .await;
    assert!(
        uuid::Uuid::parse_str(&started.session_id).is_ok(),
        "session id is a UUID"
    );
    assert_eq!(started.model, "local");
    daemon.shutdown().await;
}

#[tokio::test]
async fn message_before_start_gets_no_session_and_the_stream_stays_open() {
    let daemon = TestDaemon::start("").await;
    let mut client = daemon.agent().await;
    let mut session = Session::open(&mut client).await;
    session
        .send(Req::UserMessage(proto::UserMessage {
            content: "hi".into(),
            ..Default::default()
        }))
        .await;
    let err = expect_error(session.next().await);
    assert_eq!(err.code, "no_session");
    session.send(Req::Ping(proto::Ping {})).await;
    assert_eq!(expect_error(session.next().await).code, "no_session");
    session.start(proto::StartSession::default()).await;
    daemon.shutdown().await;
}

#[tokio::test]
async fn empty_request_is_invalid_argument_and_not_fatal() {
    let daemon = TestDaemon::start("").await;
    let mut client = daemon.agent().await;
    let mut session = Session::open(&mut client).await;
    session
        .tx
        .send(proto::SessionRequest { request: None })
        .await
        .unwrap();
    assert_eq!(expect_error(session.next().await).code, "invalid_argument");
    session.start(proto::StartSession::default()).await;
    daemon.shutdown().await;
}

#[tokio::test]
async fn shutdown_closes_open_session_streams() {
    let daemon = TestDaemon::start("").await;
    let mut client = daemon.agent().await;
    let mut session = Session::open(&mut client).await;
    session.start(proto::StartSession::default()).await;
    let ctx = daemon.host.clone();
    assert_eq!(ctx.sessions().active(), 1);
    let shutdown = tokio::spawn(daemon.shutdown());
    session.closed().await.expect("stream ends cleanly");
    shutdown.await.unwrap();
    assert_eq!(ctx.sessions().active(), 0);
}

/// A stream that has not started a session yet ends at shutdown too: it
/// does not hold the daemon for the whole grace period.
#[tokio::test]
async fn shutdown_closes_a_stream_that_has_not_started_a_session() {
    let daemon = TestDaemon::setup("")
        .server("shutdown_grace_secs = 600")
        .start()
        .await;
    let mut client = daemon.agent().await;
    let mut session = Session::open(&mut client).await;
    session.send(Req::Ping(proto::Ping {})).await;
    assert_eq!(expect_error(session.next().await).code, "no_session");
    let shutdown = tokio::spawn(daemon.shutdown());
    session.closed().await.expect("stream ends cleanly");
    shutdown.await.unwrap();
}

#[tokio::test]
async fn watch_team_refuses_malformed_and_unknown_task_ids() {
    let daemon = TestDaemon::start("").await;
    let mut client = daemon.agent().await;
    let status = client
        .watch_team(proto::WatchTeamRequest {
            task_id: "t".into(),
        })
        .await
        .expect_err("not a task id");
    assert_eq!(status.code(), Code::InvalidArgument);
    let status = client
        .watch_team(proto::WatchTeamRequest {
            task_id: "nohost:00000000-0000-4000-8000-000000000000".into(),
        })
        .await
        .expect_err("no such task");
    assert_eq!(status.code(), Code::NotFound);
    daemon.shutdown().await;
}

#[tokio::test]
async fn health_reports_serving() {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    let daemon = TestDaemon::start("").await;
    let mut health = HealthClient::new(daemon.channel().await);
    for service in ["", "roz.v1.AgentService", "roz.v1.TaskService"] {
        let reply = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("health check answers")
            .into_inner();
        assert_eq!(
            reply.status(),
            ServingStatus::Serving,
            "service {service:?}"
        );
    }
    daemon.shutdown().await;
}

#[tokio::test]
async fn reflection_v1_and_v1alpha_list_the_agent_service() {
    use tonic_reflection::pb::{v1, v1alpha};
    let daemon = TestDaemon::start("").await;

    let mut client =
        v1::server_reflection_client::ServerReflectionClient::new(daemon.channel().await);
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut replies = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let reply = replies.message().await.unwrap().expect("one reply");
    let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        reply.message_response
    else {
        panic!("expected a service list");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"roz.v1.AgentService".to_string()),
        "{names:?}"
    );
    assert!(
        names.contains(&"grpc.health.v1.Health".to_string()),
        "{names:?}"
    );

    let mut client =
        v1alpha::server_reflection_client::ServerReflectionClient::new(daemon.channel().await);
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::FileContainingSymbol(
                "roz.v1.AgentService".into(),
            ),
        ),
    };
    let mut replies = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let reply = replies.message().await.unwrap().expect("one reply");
    let Some(v1alpha::server_reflection_response::MessageResponse::FileDescriptorResponse(files)) =
        reply.message_response
    else {
        panic!(
            "expected file descriptors, got {:?}",
            reply.message_response
        );
    };
    assert!(!files.file_descriptor_proto.is_empty());
    daemon.shutdown().await;
}

#[tokio::test]
async fn rest_healthz_status_and_json_404() {
    let daemon = TestDaemon::start(
        "[host]\nid = \"rover-7\"\nname = \"Rover Seven\"\nenvironment_id = \"lab\"\n",
    )
    .await;
    let addr = daemon.addr.to_string();
    let health = rozd::cli::client::get(&addr, "/healthz", None)
        .await
        .unwrap();
    assert_eq!(health.status, 200);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&health.body).unwrap()["status"],
        "ok"
    );

    let status = rozd::cli::client::get(&addr, "/v1/status", None)
        .await
        .unwrap();
    assert_eq!(status.status, 200);
    let v: serde_json::Value = serde_json::from_str(&status.body).unwrap();
    assert_eq!(v["host_id"], "rover-7");
    assert_eq!(v["name"], "Rover Seven");
    assert_eq!(v["environment_id"], "lab");
    assert_eq!(v["version"], rozd::VERSION);
    assert_eq!(v["listen"], addr);
    assert_eq!(v["sessions"]["active"], 0);
    assert!(v["uptime_secs"].is_u64());
    assert!(v["sensors"].is_u64() && v["actuators"].is_u64());

    let missing = rozd::cli::client::get(&addr, "/v1/nothing-here", None)
        .await
        .unwrap();
    assert_eq!(missing.status, 404);
    let v: serde_json::Value = serde_json::from_str(&missing.body).expect("404 body is JSON");
    assert_eq!(v["error"]["code"], "not_found");
    daemon.shutdown().await;
}

#[tokio::test]
async fn status_counts_open_sessions() {
    let daemon = TestDaemon::start("").await;
    let mut client = daemon.agent().await;
    let mut session = Session::open(&mut client).await;
    session.start(proto::StartSession::default()).await;
    let status = rozd::cli::client::get(&daemon.addr.to_string(), "/v1/status", None)
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&status.body).unwrap();
    assert_eq!(v["sessions"]["active"], 1);
    daemon.shutdown().await;
}

async fn start_with_tokens() -> TestDaemon {
    // Tokens come from a token file here; inline `auth_tokens` are covered by config tests.
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "s3cret-alpha\ns3cret-beta\n").unwrap();
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nauth_token_file = {:?}\n[store]\npath = {:?}\n",
        tokens.display().to_string(),
        dir.path().join("rozd.db").display().to_string()
    );
    let config = rozd::config::Config::parse(&text, rozd::config::ConfigSource::BuiltIn).unwrap();
    TestDaemon::start_with(config, dir).await
}

fn with_token(
    channel: tonic::transport::Channel,
    token: Option<&'static str>,
) -> proto::agent_service_client::AgentServiceClient<
    tonic::service::interceptor::InterceptedService<
        tonic::transport::Channel,
        impl tonic::service::Interceptor,
    >,
> {
    proto::agent_service_client::AgentServiceClient::with_interceptor(
        channel,
        move |mut req: tonic::Request<()>| {
            if let Some(token) = token {
                req.metadata_mut()
                    .insert("authorization", format!("Bearer {token}").parse().unwrap());
            }
            Ok(req)
        },
    )
}

#[tokio::test]
async fn grpc_requires_a_valid_bearer_token() {
    let daemon = start_with_tokens().await;
    for token in [None, Some("wrong-token")] {
        let mut client = with_token(daemon.channel().await, token);
        let (_tx, rx) = tokio::sync::mpsc::channel::<proto::SessionRequest>(1);
        let status = client
            .stream_session(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .expect_err("refused");
        assert_eq!(status.code(), Code::Unauthenticated, "token {token:?}");
    }
    let mut health = tonic_health::pb::health_client::HealthClient::new(daemon.channel().await);
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect_err("health over gRPC needs a token too");
    assert_eq!(status.code(), Code::Unauthenticated);

    let mut client = with_token(daemon.channel().await, Some("s3cret-beta"));
    let (tx, rx) = tokio::sync::mpsc::channel::<proto::SessionRequest>(4);
    tx.send(proto::SessionRequest {
        request: Some(Req::Start(proto::StartSession::default())),
    })
    .await
    .unwrap();
    let mut stream = client
        .stream_session(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("accepted with the right token")
        .into_inner();
    let first = tokio::time::timeout(common::EXPECT_WITHIN, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(matches!(
        first.response,
        Some(proto::session_response::Response::SessionStarted(_))
    ));
    daemon.shutdown().await;
}

#[tokio::test]
async fn rest_requires_a_valid_bearer_token_except_healthz() {
    let daemon = start_with_tokens().await;
    let addr = daemon.addr.to_string();
    for token in [None, Some("s3cret-alph"), Some("nope")] {
        let reply = rozd::cli::client::get(&addr, "/v1/status", token)
            .await
            .unwrap();
        assert_eq!(reply.status, 401, "token {token:?}");
        let v: serde_json::Value = serde_json::from_str(&reply.body).expect("401 body is JSON");
        assert_eq!(v["error"]["code"], "unauthenticated");
        assert!(
            !reply.body.contains("s3cret"),
            "the body never echoes a token"
        );
    }
    assert_eq!(
        rozd::cli::client::get(&addr, "/v1/status", Some("s3cret-alpha"))
            .await
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        rozd::cli::client::get(&addr, "/healthz", None)
            .await
            .unwrap()
            .status,
        200
    );
    daemon.shutdown().await;
}
