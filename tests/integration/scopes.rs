//! Named credentials with scopes (`[[server.tokens]]`), against a running
//! daemon over loopback: a `read` token reads and may trigger the
//! protective stop but cannot open a session, command an actuator or clear
//! the stop; `operate` drives actuators but cannot clear; `admin` (and
//! today's `auth_tokens`) may do everything. Every refusal is a precise
//! error, the audit names the credential and never its secret, and the
//! scheme of `Authorization` is matched case-insensitively (RFC 7235).

use crate::common;

use common::{EXPECT_WITHIN, Session, TestDaemon};
use rozd::api::proto;
use rozd::api::proto::agent_service_client::AgentServiceClient;
use rozd::api::proto::safety_service_client::SafetyServiceClient;
use rozd::api::proto::session_request::Request as Req;
use rozd::api::proto::session_response::Response as Resp;
use rozd::api::proto::task_service_client::TaskServiceClient;
use serde_json::{Value, json};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

const READ_SECRET: &str = "read-secret-0123456789";
/// The operate token comes from the environment (`token_env`): a variable
/// cargo sets for every test process, so the test sets no variable itself.
const OPERATE_SECRET: &str = env!("CARGO_MANIFEST_DIR");
const OPERATE_ENV: &str = "CARGO_MANIFEST_DIR";
const ADMIN_SECRET: &str = "admin-secret-zyxwvu";
const LEGACY_SECRET: &str = "legacy-admin-token";

const ROBOT: &str = r#"
[[sensors]]
name = "distance"
source = "sim"
signal = "constant"
offset = 1.0
rate_hz = 50

[[actuators]]
name = "speed"
kind = "sim"
min = -1.0
max = 1.0
safe_value = 0.0

[[permissions]]
tool_pattern = "speed"
policy = "allow"
"#;

/// A daemon with a `read` token from a file, an `operate` token from the
/// environment, an `admin` token from a file and a legacy `auth_tokens` token.
async fn robot(dir: &std::path::Path) -> TestDaemon {
    let file = |name: &str, secret: &str| {
        let path = dir.join(name);
        std::fs::write(&path, format!("{secret}\n")).unwrap();
        path.display().to_string()
    };
    let server = format!(
        r#"auth_tokens = ["{LEGACY_SECRET}"]

[[server.tokens]]
name = "viewer"
token_file = {read:?}
scopes = ["read"]

[[server.tokens]]
name = "operator"
token_env = "{OPERATE_ENV}"
scopes = ["read", "operate"]

[[server.tokens]]
name = "root"
token_file = {admin:?}
scopes = ["admin"]
"#,
        read = file("viewer.token", READ_SECRET),
        admin = file("root.token", ADMIN_SECRET),
    );
    TestDaemon::setup(ROBOT)
        .server(&server)
        .paused_clock()
        .start()
        .await
}

async fn rest(
    daemon: &TestDaemon,
    method: http::Method,
    path: &str,
    authorization: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    // reqwest is built without a default TLS provider; install ring's (as
    // rozd does) so this test also runs alone.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let mut request = client.request(method, format!("{}{path}", daemon.url()));
    if let Some(value) = authorization {
        request = request.header("authorization", value);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let reply = request.send().await.expect("request");
    let status = reply.status().as_u16();
    let content_type = reply
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let text = reply.text().await.unwrap();
    let value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{path}: not JSON ({e}, {content_type}): {text:?}"));
    (status, value)
}

fn bearer(secret: &str) -> String {
    format!("Bearer {secret}")
}

#[derive(Clone)]
struct Token(&'static str);

impl tonic::service::Interceptor for Token {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        request
            .metadata_mut()
            .insert("authorization", bearer(self.0).parse().unwrap());
        Ok(request)
    }
}

type Authed = InterceptedService<Channel, Token>;

async fn agent(daemon: &TestDaemon, secret: &'static str) -> AgentServiceClient<Authed> {
    AgentServiceClient::with_interceptor(daemon.channel().await, Token(secret))
}

async fn safety(daemon: &TestDaemon, secret: &'static str) -> SafetyServiceClient<Authed> {
    SafetyServiceClient::with_interceptor(daemon.channel().await, Token(secret))
}

async fn audit(daemon: &TestDaemon) -> Vec<Value> {
    let (status, body) = rest(
        daemon,
        http::Method::GET,
        "/v1/audit",
        Some(&bearer(READ_SECRET)),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body["data"].as_array().cloned().unwrap_or_default()
}

fn assert_denied(status: u16, body: &Value, what: &str) {
    assert_eq!(status, 403, "{what}: {body}");
    assert_eq!(body["error"]["code"], "permission_denied", "{what}: {body}");
}

#[tokio::test]
async fn a_read_token_reads_and_stops_but_cannot_command_or_clear() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = robot(dir.path()).await;
    let viewer = Some(bearer(READ_SECRET));
    let viewer = viewer.as_deref();

    for path in [
        "/v1/status",
        "/v1/sensors",
        "/v1/observation",
        "/v1/sessions",
        "/v1/audit",
        "/v1/safety",
        "/v1/tasks",
    ] {
        let (status, body) = rest(&daemon, http::Method::GET, path, viewer, None).await;
        assert_eq!(status, 200, "GET {path} with a read token: {body}");
    }

    // Tasks and approvals need operate.
    let (status, body) = rest(
        &daemon,
        http::Method::POST,
        "/v1/tasks",
        viewer,
        Some(json!({"prompt": "status"})),
    )
    .await;
    assert_denied(status, &body, "POST /v1/tasks");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("operate"),
        "the refusal names the missing scope: {body}"
    );
    let mut tasks = TaskServiceClient::with_interceptor(daemon.channel().await, Token(READ_SECRET));
    let refused = tasks
        .create_task(proto::CreateTaskRequest {
            prompt: "status".into(),
            ..Default::default()
        })
        .await
        .expect_err("CreateTask with a read token");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");

    // A session (and so any actuator command) needs operate.
    let (_tx, rx) = tokio::sync::mpsc::channel::<proto::SessionRequest>(4);
    let refused = agent(&daemon, READ_SECRET)
        .await
        .stream_session(ReceiverStream::new(rx))
        .await
        .expect_err("StreamSession with a read token");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert_eq!(daemon.host.ooda().actuators().value("speed"), Some(0.0));

    // Anyone may stop ...
    let (status, body) = rest(
        &daemon,
        http::Method::POST,
        "/v1/estop",
        viewer,
        Some(json!({"reason": "viewer saw smoke"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["estop_active"], true, "{body}");
    // ... over gRPC too ...
    safety(&daemon, READ_SECRET)
        .await
        .trigger_estop(proto::TriggerEstopRequest {
            environment_id: String::new(),
            reason: "viewer again".into(),
        })
        .await
        .expect("TriggerEstop with a read token");
    // ... but only admin may clear.
    let (status, body) = rest(&daemon, http::Method::POST, "/v1/estop/clear", viewer, None).await;
    assert_denied(status, &body, "POST /v1/estop/clear with read");
    let (status, body) = rest(
        &daemon,
        http::Method::POST,
        "/v1/estop/clear",
        Some(&bearer(OPERATE_SECRET)),
        None,
    )
    .await;
    assert_denied(status, &body, "POST /v1/estop/clear with operate");
    let refused = safety(&daemon, READ_SECRET)
        .await
        .clear_estop(proto::ClearEstopRequest {
            environment_id: String::new(),
            reason: "viewer".into(),
        })
        .await
        .expect_err("ClearEstop with a read token");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(daemon.host.ooda().protective_stop().active().is_some());

    // Host registration is admin's.
    let (status, body) = rest(
        &daemon,
        http::Method::POST,
        "/v1/fleet/estop/clear",
        Some(&bearer(OPERATE_SECRET)),
        None,
    )
    .await;
    assert_denied(status, &body, "POST /v1/fleet/estop/clear with operate");

    let (status, body) = rest(
        &daemon,
        http::Method::POST,
        "/v1/estop/clear",
        Some(&bearer(ADMIN_SECRET)),
        Some(json!({"reason": "checked"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["estop_active"], false, "{body}");

    // The audit names each credential, never a secret.
    let rows = audit(&daemon).await;
    let text = serde_json::to_string(&rows).unwrap();
    for secret in [READ_SECRET, OPERATE_SECRET, ADMIN_SECRET, LEGACY_SECRET] {
        assert!(!text.contains(secret), "a secret in the audit: {text}");
    }
    let stops: Vec<&Value> = rows
        .iter()
        .filter(|r| r["kind"] == "protective_stop")
        .collect();
    assert!(!stops.is_empty(), "{text}");
    assert!(
        stops.iter().all(|r| r["credential"] == "viewer"),
        "each stop names the read token: {text}"
    );
    let cleared: Vec<&Value> = rows
        .iter()
        .filter(|r| r["kind"] == "protective_stop_cleared")
        .collect();
    assert!(!cleared.is_empty(), "{text}");
    assert!(
        cleared.iter().all(|r| r["credential"] == "root"),
        "the clear names the admin token: {text}"
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn an_operate_token_drives_an_actuator_and_its_audit_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = robot(dir.path()).await;
    let mut client = agent(&daemon, OPERATE_SECRET).await;
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let response = client
        .stream_session(ReceiverStream::new(rx))
        .await
        .expect("StreamSession with an operate token");
    let mut session = Session {
        tx,
        rx: response.into_inner(),
        wait_bound: EXPECT_WITHIN,
    };
    let started = session.start(proto::StartSession::default()).await;
    session
        .send(Req::UserMessage(proto::UserMessage {
            content: "set speed 0.3".into(),
            ..Default::default()
        }))
        .await;
    loop {
        if let Resp::TurnComplete(_) = session.next().await {
            break;
        }
    }
    assert_eq!(daemon.host.ooda().actuators().value("speed"), Some(0.3));
    let rows = audit(&daemon).await;
    let call = rows
        .iter()
        .find(|r| r["kind"] == "tool_call" && r["session_id"] == started.session_id.as_str())
        .unwrap_or_else(|| panic!("no tool_call row: {rows:?}"));
    assert_eq!(call["credential"], "operator", "{call}");
    let text = serde_json::to_string(&rows).unwrap();
    assert!(!text.contains(OPERATE_SECRET), "{text}");
    daemon.shutdown().await;
}

/// A task acts for whoever created it: its workers' physical calls name
/// that credential in the audit, whichever way the task was created.
#[tokio::test]
async fn a_tasks_workers_physical_calls_name_the_credential_that_created_it() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = robot(dir.path()).await;
    let mut tasks =
        TaskServiceClient::with_interceptor(daemon.channel().await, Token(OPERATE_SECRET));
    let grpc_task = tasks
        .create_task(proto::CreateTaskRequest {
            prompt: "set speed 0.3".into(),
            ..Default::default()
        })
        .await
        .expect("CreateTask with an operate token")
        .into_inner()
        .id;
    let (status, created) = rest(
        &daemon,
        http::Method::POST,
        "/v1/tasks",
        Some(&bearer(ADMIN_SECRET)),
        Some(json!({"prompt": "set speed 0.2"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let rest_task = created["id"].as_str().expect("task id").to_string();
    for (task, credential) in [(&grpc_task, "operator"), (&rest_task, "root")] {
        // The status stream ends with the task's final status.
        let mut updates = tasks
            .stream_task_status(proto::StreamTaskStatusRequest {
                task_id: task.clone(),
            })
            .await
            .expect("StreamTaskStatus")
            .into_inner();
        let mut last = String::new();
        while let Some(update) = tokio::time::timeout(EXPECT_WITHIN, updates.message())
            .await
            .expect("the task ends in time")
            .expect("status stream healthy")
        {
            last = update.status;
        }
        assert_eq!(last, "succeeded", "task {task}");
        let rows = audit(&daemon).await;
        let calls: Vec<&Value> = rows
            .iter()
            .filter(|r| {
                r["kind"] == "tool_call"
                    && r["session_id"]
                        .as_str()
                        .is_some_and(|s| s.starts_with(task.as_str()))
            })
            .collect();
        assert!(
            !calls.is_empty(),
            "no tool_call row of task {task}: {rows:?}"
        );
        assert!(
            calls.iter().all(|r| r["credential"] == credential),
            "{calls:?}"
        );
    }
    daemon.shutdown().await;
}

#[tokio::test]
async fn legacy_auth_tokens_are_admin_and_the_scheme_is_case_insensitive() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = robot(dir.path()).await;
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let (status, body) = rest(
            &daemon,
            http::Method::GET,
            "/v1/status",
            Some(&format!("{scheme} {READ_SECRET}")),
            None,
        )
        .await;
        assert_eq!(status, 200, "scheme {scheme}: {body}");
    }
    for (authorization, why) in [
        (format!("Basic {READ_SECRET}"), "another scheme"),
        (format!("Bearer {READ_SECRET}x"), "a longer token"),
        (format!("Bearer {}", &READ_SECRET[1..]), "a shorter token"),
        ("Bearer".to_string(), "no token"),
        (format!("Bearer{READ_SECRET}"), "no space"),
    ] {
        let (status, body) = rest(
            &daemon,
            http::Method::GET,
            "/v1/status",
            Some(&authorization),
            None,
        )
        .await;
        assert_eq!(status, 401, "{why}: {body}");
        assert_eq!(body["error"]["code"], "unauthenticated", "{why}: {body}");
    }
    // The legacy token clears (admin).
    let legacy = Some(bearer(LEGACY_SECRET));
    let (status, body) = rest(
        &daemon,
        http::Method::POST,
        "/v1/estop",
        legacy.as_deref(),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = rest(
        &daemon,
        http::Method::POST,
        "/v1/estop/clear",
        legacy.as_deref(),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["estop_active"], false, "{body}");
    let rows = audit(&daemon).await;
    let cleared = rows
        .iter()
        .find(|r| r["kind"] == "protective_stop_cleared")
        .expect("a clear row");
    assert_eq!(cleared["credential"], "auth_tokens[0]", "{cleared}");
    daemon.shutdown().await;
}

#[test]
fn scopes_and_credentials_are_validated_naming_the_key() {
    use rozd::config::{Config, ConfigSource};
    let cases = [
        (
            "[[server.tokens]]\nname = \"a\"\ntoken_env = \"X\"\nscopes = [\"write\"]\n",
            "server.tokens[0].scopes",
        ),
        (
            "[[server.tokens]]\nname = \"a\"\nscopes = [\"read\"]\n",
            "server.tokens[0]",
        ),
        (
            "[[server.tokens]]\nname = \"a\"\ntoken_env = \"ROZD_TEST_SCOPES_UNSET_VARIABLE\"\nscopes = [\"read\"]\n",
            "server.tokens[0].token_env",
        ),
        (
            "[[server.clients]]\nsubject = \"\"\nscopes = [\"read\"]\n",
            "server.clients[0].subject",
        ),
    ];
    for (text, key) in cases {
        let err = Config::parse(text, ConfigSource::BuiltIn)
            .expect_err(text)
            .to_string();
        assert!(err.contains(&format!("`{key}")), "{key}: {err}");
    }
}
