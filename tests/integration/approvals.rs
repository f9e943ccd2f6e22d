//! Who approves (issue 32, item 9), against a running daemon with two
//! `operate` credentials, alice and bob: the audit row of an approved or
//! denied call names the credential that answered (`approved_by`) beside
//! the one that called, for an MCP call answered over REST, a task's call
//! answered over REST and gRPC, and a session's call answered on its own
//! stream; with `[approvals] require_other_credential = true` a credential
//! cannot approve its own call (403 / PERMISSION_DENIED / a SessionError,
//! and an audit row), may still deny it, and another credential approves it.

use std::time::Duration;

use crate::common::{EXPECT_WITHIN, Session, TestDaemon};
use rozd::api::proto;
use rozd::api::proto::agent_service_client::AgentServiceClient;
use rozd::api::proto::session_request::Request as Req;
use rozd::api::proto::session_response::Response as Resp;
use rozd::api::proto::task_service_client::TaskServiceClient;
use serde_json::{Value, json};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

const ADMIN: &str = "approvals-admin-secret";
const ALICE: &str = "alice-operate-secret-0001";
const BOB: &str = "bob-operate-secret-0002";

/// Two actuators that ask for approval (the default for PHYSICAL tools).
const ROBOT: &str = r#"
[[actuators]]
name = "lamp"
kind = "sim"
allowed = [0, 1]
safe_value = 0

[[actuators]]
name = "arm"
kind = "sim"
min = -1.0
max = 1.0
safe_value = 0.0
"#;

/// A daemon with an admin token and alice's and bob's operate tokens.
async fn robot(dir: &std::path::Path, extra: &str) -> TestDaemon {
    let file = |name: &str, secret: &str| {
        let path = dir.join(name);
        std::fs::write(&path, format!("{secret}\n")).unwrap();
        path.display().to_string()
    };
    let server = format!(
        "auth_tokens = [\"{ADMIN}\"]\n\
         [[server.tokens]]\nname = \"alice\"\ntoken_file = {alice:?}\nscopes = [\"read\", \"operate\"]\n\
         [[server.tokens]]\nname = \"bob\"\ntoken_file = {bob:?}\nscopes = [\"read\", \"operate\"]\n",
        alice = file("alice.token", ALICE),
        bob = file("bob.token", BOB),
    );
    TestDaemon::setup(&format!("{ROBOT}\n{extra}"))
        .server(&server)
        .paused_clock()
        .start()
        .await
}

const RULE: &str = "[approvals]\nrequire_other_credential = true\n";

fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

async fn rest(
    daemon: &TestDaemon,
    method: reqwest::Method,
    path: &str,
    secret: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = http()
        .request(method, format!("{}{path}", daemon.url()))
        .bearer_auth(secret);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let reply = request.send().await.expect("request");
    let status = reply.status().as_u16();
    let text = reply.text().await.unwrap();
    let value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text}"));
    (status, value)
}

async fn audit(daemon: &TestDaemon) -> Vec<Value> {
    let (status, body) = rest(daemon, reqwest::Method::GET, "/v1/audit", ADMIN, None).await;
    assert_eq!(status, 200, "{body}");
    body["data"].as_array().cloned().unwrap_or_default()
}

/// The audit rows for call `id` of `kind`.
async fn rows_of(daemon: &TestDaemon, kind: &str, id: &str) -> Vec<Value> {
    audit(daemon)
        .await
        .into_iter()
        .filter(|r| r["kind"] == kind && r["tool_call_id"] == id)
        .collect()
}

// ------------------------------------------------------------------ MCP

/// An MCP session of `secret`'s credential: its URL and id.
pub(crate) async fn mcp_open(daemon: &TestDaemon, secret: &str) -> (String, String) {
    let url = format!("{}/mcp", daemon.url());
    let post = |session: Option<String>, body: Value| {
        let mut request = http()
            .post(&url)
            .bearer_auth(secret)
            .header("accept", "application/json, text/event-stream")
            .json(&body);
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        request.send()
    };
    let initialized = post(
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "approvals-test", "version": "1"}}}),
    )
    .await
    .unwrap();
    assert_eq!(initialized.status(), 200);
    let id = initialized.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    initialized.bytes().await.unwrap();
    let accepted = post(
        Some(id.clone()),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await
    .unwrap();
    assert_eq!(accepted.status(), 202);
    (url, id)
}

/// Calls `tool` in an MCP session in the background; the call's result.
pub(crate) fn mcp_call(
    url: String,
    secret: &'static str,
    session: String,
    tool: &'static str,
    arguments: Value,
) -> tokio::task::JoinHandle<Value> {
    tokio::spawn(async move {
        let answer = http()
            .post(&url)
            .bearer_auth(secret)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", session)
            .json(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": tool, "arguments": arguments}}))
            .send()
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&answer.bytes().await.unwrap()).to_string();
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find_map(|m| m.get("result").cloned())
            .unwrap_or_else(|| panic!("no result in {text}"))
    })
}

/// The MCP call waiting for approval now (polls `GET /v1/approvals`).
async fn waiting_mcp_call(daemon: &TestDaemon) -> Value {
    let deadline = tokio::time::Instant::now() + EXPECT_WITHIN;
    loop {
        let (status, listed) = rest(daemon, reqwest::Method::GET, "/v1/approvals", BOB, None).await;
        assert_eq!(status, 200, "{listed}");
        if let Some(call) = listed["data"].as_array().and_then(|d| d.first()) {
            return call.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no call waits for approval"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn answer_mcp(daemon: &TestDaemon, secret: &str, id: &str, approve: bool) -> (u16, Value) {
    rest(
        daemon,
        reqwest::Method::POST,
        &format!("/v1/approvals/{id}"),
        secret,
        Some(json!({ "approve": approve })),
    )
    .await
}

async fn finished(call: tokio::task::JoinHandle<Value>) -> Value {
    tokio::time::timeout(EXPECT_WITHIN, call)
        .await
        .expect("the call is answered in time")
        .expect("call task")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_calls_audit_row_names_the_credential_that_approved_or_denied_it() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = robot(dir.path(), "").await;
    let (url, session) = mcp_open(&daemon, ALICE).await;

    let call = mcp_call(
        url.clone(),
        ALICE,
        session.clone(),
        "arm",
        json!({"value": 0.5}),
    );
    let waiting = waiting_mcp_call(&daemon).await;
    assert_eq!(waiting["credential"], "alice", "{waiting}");
    let id = waiting["id"].as_str().unwrap().to_string();
    let (status, body) = answer_mcp(&daemon, BOB, &id, true).await;
    assert_eq!(status, 200, "{body}");
    let result = finished(call).await;
    assert_eq!(result["isError"], false, "{result}");
    let rows = rows_of(&daemon, "tool_call", &id).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (
            &rows[0]["decision"],
            &rows[0]["credential"],
            &rows[0]["approved_by"]
        ),
        (&json!("approved"), &json!("alice"), &json!("bob")),
        "{rows:?}"
    );

    let call = mcp_call(url, ALICE, session, "arm", json!({"value": -0.5}));
    let id = waiting_mcp_call(&daemon).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, _) = answer_mcp(&daemon, BOB, &id, false).await;
    assert_eq!(status, 200);
    let result = finished(call).await;
    assert_eq!(
        result["structuredContent"]["error"]["code"], "denied",
        "{result}"
    );
    let rows = rows_of(&daemon, "tool_call", &id).await;
    assert_eq!(
        (&rows[0]["decision"], &rows[0]["approved_by"]),
        (&json!("denied"), &json!("bob")),
        "{rows:?}"
    );
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_require_other_credential_an_mcp_caller_cannot_approve_its_own_call() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = robot(dir.path(), RULE).await;
    let (url, session) = mcp_open(&daemon, ALICE).await;
    let call = mcp_call(
        url.clone(),
        ALICE,
        session.clone(),
        "arm",
        json!({"value": 0.5}),
    );
    let id = waiting_mcp_call(&daemon).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, body) = answer_mcp(&daemon, ALICE, &id, true).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "permission_denied", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("approvals.require_other_credential"),
        "{body}"
    );
    let refused = rows_of(&daemon, "approval", &id).await;
    assert_eq!(refused.len(), 1, "the refusal is audited: {refused:?}");
    assert_eq!(
        (
            &refused[0]["decision"],
            &refused[0]["credential"],
            &refused[0]["tool"]
        ),
        (&json!("refused"), &json!("alice"), &json!("arm")),
        "{refused:?}"
    );
    assert_eq!(
        daemon.host.ooda().actuators().value("arm"),
        Some(0.0),
        "nothing moved"
    );
    // The call still waits; another credential approves it.
    assert_eq!(waiting_mcp_call(&daemon).await["id"], id.as_str());
    let (status, body) = answer_mcp(&daemon, BOB, &id, true).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(finished(call).await["isError"], false);
    let rows = rows_of(&daemon, "tool_call", &id).await;
    assert_eq!(rows[0]["approved_by"], "bob", "{rows:?}");

    // Denying one's own call is allowed.
    let call = mcp_call(url, ALICE, session, "arm", json!({"value": -0.5}));
    let id = waiting_mcp_call(&daemon).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, body) = answer_mcp(&daemon, ALICE, &id, false).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        finished(call).await["structuredContent"]["error"]["code"],
        "denied"
    );
    let rows = rows_of(&daemon, "tool_call", &id).await;
    assert_eq!(
        (&rows[0]["decision"], &rows[0]["approved_by"]),
        (&json!("denied"), &json!("alice")),
        "{rows:?}"
    );
    daemon.shutdown().await;
}

// ------------------------------------------------------------------ tasks

/// A task alice creates over REST that sets the lamp; its id and the call
/// waiting for approval.
async fn alices_task(daemon: &TestDaemon) -> (String, Value) {
    let (status, created) = rest(
        daemon,
        reqwest::Method::POST,
        "/v1/tasks",
        ALICE,
        Some(json!({"prompt": "set lamp 1"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let deadline = tokio::time::Instant::now() + EXPECT_WITHIN;
    loop {
        let (status, task) = rest(
            daemon,
            reqwest::Method::GET,
            &format!("/v1/tasks/{id}"),
            BOB,
            None,
        )
        .await;
        assert_eq!(status, 200, "{task}");
        if let Some(pending) = task["pending_approvals"].as_array().and_then(|p| p.first()) {
            return (id, pending.clone());
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the task never waited: {task}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits for task `id` to end; its audit row of the lamp call.
async fn lamp_row_of_task(daemon: &TestDaemon, id: &str) -> Value {
    let deadline = tokio::time::Instant::now() + EXPECT_WITHIN;
    loop {
        let (_, task) = rest(
            daemon,
            reqwest::Method::GET,
            &format!("/v1/tasks/{id}"),
            BOB,
            None,
        )
        .await;
        if task["status"] == "succeeded" || task["status"] == "failed" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "task {id} never ended: {task}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    audit(daemon)
        .await
        .into_iter()
        .find(|r| {
            r["kind"] == "tool_call"
                && r["tool"] == "lamp"
                && r["session_id"].as_str().is_some_and(|s| s.starts_with(id))
        })
        .unwrap_or_else(|| panic!("no lamp row for task {id}"))
}

async fn approve_task_rest(
    daemon: &TestDaemon,
    secret: &str,
    task: &str,
    call: &Value,
    approved: bool,
) -> (u16, Value) {
    rest(
        daemon,
        reqwest::Method::POST,
        &format!("/v1/tasks/{task}/approvals"),
        secret,
        Some(json!({"tool_call_id": call["tool_call_id"], "approved": approved})),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_audit_row_names_the_credential_that_approved_its_call() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = robot(dir.path(), "").await;
    let (task, call) = alices_task(&daemon).await;
    let (status, body) = approve_task_rest(&daemon, BOB, &task, &call, true).await;
    assert_eq!(status, 200, "{body}");
    let row = lamp_row_of_task(&daemon, &task).await;
    assert_eq!(
        (&row["decision"], &row["credential"], &row["approved_by"]),
        (&json!("approved"), &json!("alice"), &json!("bob")),
        "{row}"
    );
    daemon.shutdown().await;
}

#[derive(Clone)]
pub(crate) struct Token(pub(crate) &'static str);

impl tonic::service::Interceptor for Token {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {}", self.0).parse().unwrap(),
        );
        Ok(request)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_require_other_credential_a_tasks_creator_cannot_approve_its_calls() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = robot(dir.path(), RULE).await;
    let (task, call) = alices_task(&daemon).await;
    let call_id = call["tool_call_id"].as_str().unwrap().to_string();
    // Over REST and over gRPC: refused, audited, the call still waits.
    let (status, body) = approve_task_rest(&daemon, ALICE, &task, &call, true).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "permission_denied", "{body}");
    let refused = TaskServiceClient::with_interceptor(daemon.channel().await, Token(ALICE))
        .approve_tool_use(proto::ApproveToolUseRequest {
            task_id: task.clone(),
            tool_call_id: call_id.clone(),
            approved: true,
            modifier: None,
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    let rows: Vec<Value> = audit(&daemon)
        .await
        .into_iter()
        .filter(|r| r["kind"] == "approval")
        .collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(
        rows.iter().all(|r| r["decision"] == "refused"
            && r["credential"] == "alice"
            && r["tool"] == "lamp"),
        "{rows:?}"
    );
    assert_eq!(
        rows[0]["origin"], "POST /v1/tasks/{id}/approvals",
        "{rows:?}"
    );
    assert_eq!(rows[1]["origin"], "ApproveToolUse", "{rows:?}");
    assert_eq!(daemon.host.ooda().actuators().value("lamp"), Some(0.0));
    // Bob approves over gRPC.
    let after = TaskServiceClient::with_interceptor(daemon.channel().await, Token(BOB))
        .approve_tool_use(proto::ApproveToolUseRequest {
            task_id: task.clone(),
            tool_call_id: call_id,
            approved: true,
            modifier: None,
        })
        .await
        .expect("another credential approves")
        .into_inner();
    assert!(after.pending_approvals.is_empty(), "{after:?}");
    let row = lamp_row_of_task(&daemon, &task).await;
    assert_eq!(
        (&row["decision"], &row["credential"], &row["approved_by"]),
        (&json!("approved"), &json!("alice"), &json!("bob")),
        "{row}"
    );
    daemon.shutdown().await;
}

// ------------------------------------------------------------------ sessions

/// A session stream of `secret`'s credential, started; its id.
async fn session_of(daemon: &TestDaemon, secret: &'static str) -> (Session, String) {
    let mut client = AgentServiceClient::with_interceptor(daemon.channel().await, Token(secret));
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let response = client
        .stream_session(ReceiverStream::new(rx))
        .await
        .expect("StreamSession");
    let mut session = Session {
        tx,
        rx: response.into_inner(),
        wait_bound: EXPECT_WITHIN,
    };
    let started = session.start(proto::StartSession::default()).await;
    (session, started.session_id)
}

/// Asks the session's model to set the lamp; the call waiting for approval.
async fn lamp_call(session: &mut Session) -> String {
    session
        .send(Req::UserMessage(proto::UserMessage {
            content: "set lamp 1".into(),
            ..Default::default()
        }))
        .await;
    loop {
        match session.next().await {
            Resp::ActivityUpdate(a) if a.state == "waiting_approval" => return a.detail,
            Resp::Error(e) => panic!("{e:?}"),
            _ => {}
        }
    }
}

async fn decide(session: &Session, id: &str, approved: bool) {
    session
        .send(Req::PermissionDecision(proto::PermissionDecision {
            tool_call_id: id.to_string(),
            approved,
        }))
        .await;
}

/// Reads the session until its turn completes; the errors on the way.
async fn errors_until_complete(session: &mut Session) -> Vec<proto::SessionError> {
    let mut errors = Vec::new();
    loop {
        match session.next().await {
            Resp::TurnComplete(_) => return errors,
            Resp::Error(e) => errors.push(e),
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_call_names_its_stream_credential_as_approver() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = robot(dir.path(), "").await;
    let (mut session, session_id) = session_of(&daemon, ALICE).await;
    let id = lamp_call(&mut session).await;
    decide(&session, &id, true).await;
    errors_until_complete(&mut session).await;
    assert_eq!(daemon.host.ooda().actuators().value("lamp"), Some(1.0));
    let rows = rows_of(&daemon, "tool_call", &id).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (
            &rows[0]["session_id"],
            &rows[0]["credential"],
            &rows[0]["approved_by"]
        ),
        (&json!(session_id), &json!("alice"), &json!("alice")),
        "{rows:?}"
    );
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_require_other_credential_a_session_cannot_approve_its_own_call() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = robot(dir.path(), RULE).await;
    let (mut session, _) = session_of(&daemon, ALICE).await;
    let id = lamp_call(&mut session).await;
    decide(&session, &id, true).await;
    let refused = loop {
        match session.next().await {
            Resp::Error(e) => break e,
            Resp::ToolRequest(r) => panic!("ran: {r:?}"),
            Resp::TurnComplete(c) => panic!("the call ended: {c:?}"),
            _ => {}
        }
    };
    assert_eq!(refused.code, "permission_denied", "{refused:?}");
    assert!(
        refused
            .message
            .contains("approvals.require_other_credential"),
        "{refused:?}"
    );
    let rows = rows_of(&daemon, "approval", &id).await;
    assert_eq!(
        (rows.len(), &rows[0]["credential"], &rows[0]["origin"]),
        (1, &json!("alice"), &json!("PermissionDecision")),
        "{rows:?}"
    );
    assert_eq!(daemon.host.ooda().actuators().value("lamp"), Some(0.0));
    // Still waiting: its own client may deny it.
    decide(&session, &id, false).await;
    errors_until_complete(&mut session).await;
    let rows = rows_of(&daemon, "tool_call", &id).await;
    assert_eq!(
        (&rows[0]["decision"], &rows[0]["approved_by"]),
        (&json!("denied"), &json!("alice")),
        "{rows:?}"
    );
    assert_eq!(daemon.host.ooda().actuators().value("lamp"), Some(0.0));
    daemon.shutdown().await;
}

// ------------------------------------------------ one list for the operator

/// `GET /v1/approvals` until it lists a call; that call.
async fn waiting_call(daemon: &TestDaemon) -> Value {
    waiting_mcp_call(daemon).await
}

/// The published roz CLI never sends a `PermissionDecision`: an operator
/// answers its session's call over REST (issue 35, item 1). The call is
/// listed with who asks and what; the first answer wins (a later one,
/// the operator's or the client's, finds nothing: 404); the audit names
/// the credential that answered; both spellings of the body answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_answers_a_sessions_call_at_v1_approvals_and_the_first_answer_wins() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = robot(dir.path(), "").await;
    let (mut session, session_id) = session_of(&daemon, ALICE).await;
    let id = lamp_call(&mut session).await;

    let listed = waiting_call(&daemon).await;
    assert_eq!(
        (
            &listed["id"],
            &listed["tool_call_id"],
            &listed["kind"],
            &listed["tool"],
            &listed["parameters"],
            &listed["credential"],
            &listed["session_id"],
        ),
        (
            &json!(id),
            &json!(id),
            &json!("session"),
            &json!("lamp"),
            &json!({"value": 1.0}),
            &json!("alice"),
            &json!(session_id),
        ),
        "{listed}"
    );
    assert!(
        listed["expires_unix_ms"].as_i64() > listed["since_unix_ms"].as_i64(),
        "{listed}"
    );
    // The session is among the open ones, with its call waiting.
    let (status, open) = rest(
        &daemon,
        reqwest::Method::GET,
        "/v1/sessions/open",
        BOB,
        None,
    )
    .await;
    assert_eq!(status, 200, "{open}");
    let mine = open["data"]
        .as_array()
        .and_then(|d| d.iter().find(|s| s["id"] == session_id.as_str()))
        .unwrap_or_else(|| panic!("session {session_id} is not listed: {open}"));
    assert_eq!(
        (
            &mine["kind"],
            &mine["credential"],
            &mine["pending_approvals"]
        ),
        (&json!("grpc"), &json!("alice"), &json!(1)),
        "{mine}"
    );

    let (status, body) = answer_mcp(&daemon, BOB, &id, true).await;
    assert_eq!(status, 200, "{body}");
    errors_until_complete(&mut session).await;
    assert_eq!(daemon.host.ooda().actuators().value("lamp"), Some(1.0));
    let (status, body) = answer_mcp(&daemon, BOB, &id, false).await;
    assert_eq!(status, 404, "answered once: {body}");
    let rows = rows_of(&daemon, "tool_call", &id).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (
            &rows[0]["decision"],
            &rows[0]["credential"],
            &rows[0]["approved_by"]
        ),
        (&json!("approved"), &json!("alice"), &json!("bob")),
        "{rows:?}"
    );

    // The client answers first: the operator's answer then finds nothing.
    let id = lamp_call(&mut session).await;
    assert_eq!(waiting_call(&daemon).await["id"], id.as_str());
    decide(&session, &id, false).await;
    errors_until_complete(&mut session).await;
    let (status, body) = answer_mcp(&daemon, BOB, &id, true).await;
    assert_eq!(status, 404, "the client answered first: {body}");
    let rows = rows_of(&daemon, "tool_call", &id).await;
    assert_eq!(
        (&rows[0]["decision"], &rows[0]["approved_by"]),
        (&json!("denied"), &json!("alice")),
        "{rows:?}"
    );

    // Denied by the operator, in the tasks' spelling of the body.
    let id = lamp_call(&mut session).await;
    assert_eq!(waiting_call(&daemon).await["id"], id.as_str());
    let (status, body) = rest(
        &daemon,
        reqwest::Method::POST,
        &format!("/v1/approvals/{id}"),
        BOB,
        Some(json!({"approved": false})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    errors_until_complete(&mut session).await;
    let rows = rows_of(&daemon, "tool_call", &id).await;
    assert_eq!(
        (&rows[0]["decision"], &rows[0]["approved_by"]),
        (&json!("denied"), &json!("bob")),
        "{rows:?}"
    );
    let (_, listed) = rest(&daemon, reqwest::Method::GET, "/v1/approvals", BOB, None).await;
    assert_eq!(listed["data"], json!([]), "nothing waits any more");
    daemon.shutdown().await;
}

/// With `require_other_credential`, the session's own credential cannot
/// approve its call at `/v1/approvals` either; another one can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_require_other_credential_a_session_cannot_approve_its_own_call_at_v1_approvals() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = robot(dir.path(), RULE).await;
    let (mut session, _) = session_of(&daemon, ALICE).await;
    let id = lamp_call(&mut session).await;
    waiting_call(&daemon).await;
    let (status, body) = answer_mcp(&daemon, ALICE, &id, true).await;
    assert_eq!(status, 403, "{body}");
    let refused = rows_of(&daemon, "approval", &id).await;
    assert_eq!(
        (refused.len(), &refused[0]["origin"]),
        (1, &json!("POST /v1/approvals")),
        "{refused:?}"
    );
    assert_eq!(daemon.host.ooda().actuators().value("lamp"), Some(0.0));
    let (status, body) = answer_mcp(&daemon, BOB, &id, true).await;
    assert_eq!(status, 200, "{body}");
    errors_until_complete(&mut session).await;
    assert_eq!(daemon.host.ooda().actuators().value("lamp"), Some(1.0));
    daemon.shutdown().await;
}

/// A task's call is listed at `/v1/approvals` beside the others and may be
/// answered there; an MCP session is among the open sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_call_is_listed_and_answered_at_v1_approvals_and_mcp_sessions_are_open_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = robot(dir.path(), "").await;
    let (_, mcp_session) = mcp_open(&daemon, BOB).await;
    let (status, open) = rest(
        &daemon,
        reqwest::Method::GET,
        "/v1/sessions/open",
        BOB,
        None,
    )
    .await;
    assert_eq!(status, 200, "{open}");
    assert!(
        open["data"]
            .as_array()
            .is_some_and(|d| d.iter().any(|s| s["kind"] == "mcp"
                && s["id"] == mcp_session.as_str()
                && s["credential"] == "bob")),
        "{open}"
    );

    let (task, pending) = alices_task(&daemon).await;
    let listed = waiting_call(&daemon).await;
    assert_eq!(
        (
            &listed["kind"],
            &listed["tool"],
            &listed["credential"],
            &listed["tool_call_id"]
        ),
        (
            &json!("task"),
            &json!("lamp"),
            &json!("alice"),
            &pending["tool_call_id"]
        ),
        "{listed}"
    );
    let id = listed["id"].as_str().unwrap().to_string();
    let (status, body) = answer_mcp(&daemon, BOB, &id, true).await;
    assert_eq!(status, 200, "{body}");
    let row = lamp_row_of_task(&daemon, &task).await;
    assert_eq!(
        (&row["decision"], &row["approved_by"]),
        (&json!("approved"), &json!("bob")),
        "{row}"
    );
    daemon.shutdown().await;
}

/// `rozd approvals`, `rozd approvals approve ID` / `deny ID`: the operator
/// answers a gRPC session's call (as the roz CLI's, which never answers
/// itself) from the command line; the call runs (or not), the audit names
/// the answering credential, and a second answer finds nothing (exit 4)
/// (issue 35, item 17).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rozd_approvals_lists_and_answers_a_sessions_call() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = robot(dir.path(), "").await;
    let (mut session, _) = session_of(&daemon, ALICE).await;
    let id = lamp_call(&mut session).await;
    waiting_call(&daemon).await;
    let addr = daemon.addr.to_string();
    let cli = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_rozd"))
                .arg("approvals")
                .args(&args)
                .env_remove("ROZD_CONFIG")
                .env_remove("ROZD_ADDR")
                .env("ROZD_TOKEN", BOB)
                .stdin(std::process::Stdio::null())
                .output()
                .expect("run rozd approvals");
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        })
    };
    let (code, out, err) = cli(vec!["--addr".into(), addr.clone()]).await.unwrap();
    assert_eq!(code, Some(0), "{out}{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with(&id))
        .unwrap_or_else(|| panic!("{id} is not listed: {out}"));
    assert!(
        line.contains("lamp") && line.contains("asked by session"),
        "{line}"
    );

    let (code, out, err) = cli(vec![
        "approve".into(),
        id.clone(),
        "--addr".into(),
        addr.clone(),
    ])
    .await
    .unwrap();
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.starts_with("approved lamp"), "{out}");
    assert!(errors_until_complete(&mut session).await.is_empty());
    assert_eq!(daemon.host.sim_actuator("lamp").unwrap().value(), Some(1.0));
    let row = rows_of(&daemon, "tool_call", &id).await;
    assert_eq!(row.last().unwrap()["approved_by"], "bob", "{row:?}");

    let (code, _, err) = cli(vec!["deny".into(), id, "--addr".into(), addr])
        .await
        .unwrap();
    assert_eq!(code, Some(4), "{err}");
    daemon.shutdown().await;
}
