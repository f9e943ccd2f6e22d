//! The host tools over MCP, with the official Python MCP SDK (PyPI `mcp`)
//! as an independent client, over streamable HTTP (`/mcp`) and over stdio
//! through `rozd mcp`: tool schemas with the limits, a sensor read, a value
//! out of range refused, commands waiting for approval answered over REST
//! or by elicitation (or by nobody: denied), applied, a call under the
//! protective stop refused, the deadman when the client disconnects or the
//! session ends, the audit, and tokens. `scripts/test.sh` installs the SDK
//! into `target/pyenv` (or `$ROZD_TEST_PYENV`).

use std::path::PathBuf;
use std::process::Stdio;

use crate::common::{self, EXPECT_WITHIN, ROZD, TestDaemon};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

const TOKEN: &str = "mcp-test-token";

fn python() -> PathBuf {
    common::pyenv_tool("python")
}

/// A daemon with one sensor and one actuator, behind a token.
async fn daemon(extra: &str) -> TestDaemon {
    TestDaemon::setup(&format!(
        r#"
{extra}
[[sensors]]
name = "temp"
source = "sim"
unit = "C"
signal = "sine"
amplitude = 1.0
offset = 20.0
period_ms = 10000

[[actuators]]
name = "arm"
kind = "sim"
unit = "rad"
description = "arm angle"
min = -1.0
max = 1.0
safe_value = 0.0
"#
    ))
    .server(&format!("auth_tokens = [\"{TOKEN}\"]"))
    .start()
    .await
}

#[derive(Clone, Copy, Debug)]
enum Transport {
    Http,
    Stdio,
}

/// `tests/python/mcp_client.py` in `mode`, talking to `daemon`.
struct Script {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    stdin: ChildStdin,
}

impl Script {
    fn start(daemon: &TestDaemon, transport: Transport, mode: &str, token: Option<&str>) -> Script {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/mcp_client.py");
        let mut command = Command::new(python());
        command.arg(script).arg(mode);
        match transport {
            Transport::Http => command.arg("--http").arg(format!("{}/mcp", daemon.url())),
            Transport::Stdio => command
                .arg("--stdio")
                .arg(ROZD)
                .arg(daemon.addr.to_string()),
        };
        if let Some(token) = token {
            command.arg("--token").arg(token);
        }
        let mut child = command
            .env_remove("ROZD_TOKEN")
            .env_remove("ROZD_ADDR")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start the Python MCP client");
        let stdout = child.stdout.take().expect("stdout piped");
        let stdin = child.stdin.take().expect("stdin piped");
        Script {
            child,
            lines: BufReader::new(stdout).lines(),
            stdin,
        }
    }

    /// The next step the client reports.
    async fn next(&mut self) -> Value {
        let line = tokio::time::timeout(EXPECT_WITHIN * 3, self.lines.next_line())
            .await
            .expect("the client reports its next step in time")
            .expect("read the client's output")
            .expect("the client is still running");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    }

    async fn expect(&mut self, step: &str) -> Value {
        let next = self.next().await;
        assert_eq!(next["step"], step, "{next}");
        next
    }

    async fn go(&mut self) {
        self.stdin.write_all(b"go\n").await.expect("client stdin");
        self.stdin.flush().await.expect("client stdin");
    }

    async fn exit_code(mut self) -> Option<i32> {
        tokio::time::timeout(EXPECT_WITHIN, self.child.wait())
            .await
            .expect("the client exits")
            .expect("wait for the client")
            .code()
    }

    /// SIGKILL: the client vanishes without a word.
    async fn kill(mut self) {
        self.child.kill().await.expect("kill the client");
    }
}

fn http() -> reqwest::Client {
    // reqwest is built without a default TLS provider (as in the daemon).
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

async fn rest(
    daemon: &TestDaemon,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = http()
        .request(method, format!("{}{path}", daemon.url()))
        .bearer_auth(TOKEN);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("REST request");
    let status = response.status().as_u16();
    let text = response.text().await.expect("REST body");
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text}")),
    )
}

/// Waits for the next call waiting for approval, checks `GET /v1/approvals`
/// lists it, and answers it over REST; the listed entry.
async fn answer_next_approval(daemon: &TestDaemon, approve: bool) -> Value {
    let approvals = &daemon.host.approvals();
    let mut changes = approvals.subscribe();
    tokio::time::timeout(
        EXPECT_WITHIN,
        changes.wait_for(|_| !approvals.list().is_empty()),
    )
    .await
    .expect("a call waits for approval")
    .expect("approvals alive");
    let (status, listed) = rest(daemon, reqwest::Method::GET, "/v1/approvals", None).await;
    assert_eq!(status, 200, "{listed}");
    let entries = listed["data"].as_array().expect("data").clone();
    assert_eq!(entries.len(), 1, "{listed}");
    let entry = entries[0].clone();
    let id = entry["id"].as_str().expect("id");
    let (status, answered) = rest(
        daemon,
        reqwest::Method::POST,
        &format!("/v1/approvals/{id}"),
        Some(json!({ "approve": approve })),
    )
    .await;
    assert_eq!(status, 200, "{answered}");
    assert_eq!(answered["approved"], approve, "{answered}");
    entry
}

/// Waits until `arm` is back at its safe value and owned by nobody.
async fn wait_arm_safe(daemon: &TestDaemon) {
    let mut observations = daemon.host.ooda().subscribe();
    tokio::time::timeout(EXPECT_WITHIN, async {
        loop {
            let safe = observations
                .borrow_and_update()
                .actuators
                .iter()
                .any(|a| a.name == "arm" && a.at_safe_value && a.owner.is_none());
            if safe && daemon.host.ooda().actuators().value("arm") == Some(0.0) {
                return;
            }
            observations.changed().await.expect("loop alive");
        }
    })
    .await
    .expect("arm back at its safe value");
}

fn arm(daemon: &TestDaemon) -> Option<f64> {
    daemon.host.ooda().actuators().value("arm")
}

async fn scenario(transport: Transport) {
    // Pings every 3 s: the client answers them, so they release nothing.
    let daemon = daemon("[session]\napproval_timeout_secs = 120\n[mcp]\nkeepalive_secs = 3").await;
    let mut script = Script::start(&daemon, transport, "scenario", Some(TOKEN));
    let connected = script.expect("connected").await;
    assert_eq!(connected["protocol"], "2025-11-25", "{connected}");

    // The tools, with the schemas sessions get.
    let tools = script.expect("tools").await;
    let tools = tools["tools"].as_array().expect("tools");
    let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["observe", "read_sensor", "arm", "stop_all"]);
    for def in daemon.host.host_tools().definitions() {
        let tool = tools
            .iter()
            .find(|t| t["name"] == def.name.as_str())
            .expect("listed");
        assert_eq!(tool["input_schema"], def.parameters_schema, "{}", def.name);
        assert_eq!(tool["description"], def.description.as_str());
    }
    let arm_tool = tools.iter().find(|t| t["name"] == "arm").expect("arm");
    let value = &arm_tool["input_schema"]["properties"]["value"];
    assert_eq!(
        (value["minimum"].as_f64(), value["maximum"].as_f64()),
        (Some(-1.0), Some(1.0))
    );
    assert!(
        value["description"]
            .as_str()
            .is_some_and(|d| d.contains("rad")),
        "{value}"
    );
    assert_eq!(
        arm_tool["annotations"]["destructiveHint"], true,
        "{arm_tool}"
    );
    assert_eq!(arm_tool["annotations"]["readOnlyHint"], false, "{arm_tool}");
    assert_eq!(arm_tool["meta"]["roz/category"], "PHYSICAL", "{arm_tool}");
    let read = tools
        .iter()
        .find(|t| t["name"] == "read_sensor")
        .expect("read_sensor");
    assert_eq!(read["annotations"]["readOnlyHint"], true, "{read}");
    assert_eq!(read["meta"]["roz/category"], "PURE", "{read}");

    let sensor = script.expect("read_sensor").await;
    assert_eq!(sensor["is_error"], false, "{sensor}");
    assert_eq!(sensor["structured"]["sensor"]["name"], "temp", "{sensor}");
    // Sized for small models: the latest value, no history unless asked.
    assert!(sensor["structured"].get("history").is_none(), "{sensor}");
    let schema = &read["input_schema"]["properties"]["history"];
    assert_eq!(schema["maximum"], 128, "{read}");
    let with_history = script.expect("read_history").await;
    assert_eq!(with_history["is_error"], false, "{with_history}");
    let history = with_history["structured"]["history"]
        .as_array()
        .expect("history when asked");
    assert!(!history.is_empty() && history.len() <= 3, "{with_history}");
    let too_much = script.expect("read_too_much").await;
    assert_eq!(too_much["is_error"], true, "{too_much}");
    assert!(
        too_much["text"]
            .as_str()
            .is_some_and(|t| t.contains("history") && t.contains("128")),
        "{too_much}"
    );

    // Out of range: refused, never clamped, nothing moves.
    let refused = script.expect("out_of_range").await;
    assert_eq!(refused["is_error"], true, "{refused}");
    assert_eq!(
        refused["structured"]["error"]["code"], "safety_violation",
        "{refused}"
    );
    assert!(
        refused["text"]
            .as_str()
            .is_some_and(|t| t.contains("maximum")),
        "{refused}"
    );
    assert_eq!(arm(&daemon), Some(0.0));

    // In range: waits for approval, approved over REST, applied.
    script.expect("calling").await;
    let pending = answer_next_approval(&daemon, true).await;
    assert_eq!(pending["tool"], "arm", "{pending}");
    assert_eq!(pending["parameters"], json!({"value": 0.5}), "{pending}");
    assert_eq!(pending["origin"], "mcp:rozd-test", "{pending}");
    let session_id = pending["session_id"]
        .as_str()
        .expect("session_id")
        .to_string();
    assert!(session_id.starts_with("mcp:"), "{pending}");
    let approved = script.expect("approved_call").await;
    assert_eq!(approved["is_error"], false, "{approved}");
    assert_eq!(approved["structured"]["value"], 0.5, "{approved}");
    assert_eq!(
        approved["meta"]["roz/tool_call_id"], pending["id"],
        "{approved}"
    );
    let (status, observation) = rest(&daemon, reqwest::Method::GET, "/v1/observation", None).await;
    assert_eq!(status, 200);
    let arm_state = observation["actuators"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["name"] == "arm"))
        .expect("arm in the observation")
        .clone();
    assert_eq!(arm_state["value"], 0.5, "{arm_state}");
    assert_eq!(
        arm_state["owner"],
        format!("session {session_id}"),
        "{arm_state}"
    );
    let resource = script.expect("resource").await;
    let listed = resource["observation"]["actuators"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["name"] == "arm"))
        .expect("arm in the resource")
        .clone();
    assert_eq!(listed["value"], 0.5, "{listed}");
    let updated = script.expect("resource_updated").await;
    assert_eq!(updated["uri"], "roz://observation", "{updated}");

    // Under the protective stop: refused at once, without asking anyone.
    script.expect("await_estop").await;
    let (status, body) = rest(
        &daemon,
        reqwest::Method::POST,
        "/v1/estop",
        Some(json!({"reason": "mcp test"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(arm(&daemon), Some(0.0), "the stop drove it safe");
    script.go().await;
    let stopped = script.expect("under_stop").await;
    assert_eq!(
        stopped["structured"]["error"]["code"], "e_stop",
        "{stopped}"
    );
    assert!(daemon.host.approvals().list().is_empty());
    script.expect("await_clear").await;
    let (status, body) = rest(
        &daemon,
        reqwest::Method::POST,
        "/v1/estop/clear",
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    script.go().await;

    // Denied by the operator: nothing moves.
    script.expect("calling").await;
    answer_next_approval(&daemon, false).await;
    let denied = script.expect("denied_call").await;
    assert_eq!(denied["structured"]["error"]["code"], "denied", "{denied}");
    assert!(
        denied["text"]
            .as_str()
            .is_some_and(|t| t.contains("operator")),
        "{denied}"
    );
    assert_eq!(arm(&daemon), Some(0.0));

    script.expect("calling").await;
    answer_next_approval(&daemon, true).await;
    let second = script.expect("second_call").await;
    assert_eq!(second["is_error"], false, "{second}");
    script.expect("holding").await;
    assert_eq!(arm(&daemon), Some(-0.4));
    let (_, status) = rest(&daemon, reqwest::Method::GET, "/v1/status", None).await;
    assert_eq!(
        status["mcp"],
        json!({"sessions": 1, "max_sessions": 64, "sessions_evicted": 0,
            "sessions_refused": 0, "pending_approvals": 0}),
        "{status}"
    );

    // The client vanishes: the deadman drives its actuator safe.
    script.kill().await;
    wait_arm_safe(&daemon).await;

    // Every PHYSICAL call is in the audit, as the MCP client's, naming the
    // credential its requests carried.
    let (status, audit) = rest(
        &daemon,
        reqwest::Method::GET,
        &format!("/v1/audit?session={session_id}"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{audit}");
    let calls: Vec<&Value> = audit["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter(|r| r["kind"] == "tool_call")
        .collect();
    let decisions: Vec<&str> = calls
        .iter()
        .filter_map(|r| r["decision"].as_str())
        .collect();
    assert_eq!(
        decisions,
        ["refused", "approved", "refused", "denied", "approved"],
        "{audit}"
    );
    assert!(
        calls
            .iter()
            .all(|r| r["origin"] == "mcp:rozd-test" && r["tool"] == "arm"),
        "{audit}"
    );
    assert!(
        calls.iter().all(|r| r["credential"] == "auth_tokens[0]"),
        "{audit}"
    );
    assert_eq!(calls[1]["tool_call_id"], pending["id"], "{audit}");
    assert!(
        calls[2]["error"]
            .as_str()
            .is_some_and(|e| e.contains("protective stop")),
        "{audit}"
    );
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_streamable_http_calls_take_the_session_path_and_a_vanished_client_leaves_the_arm_safe()
 {
    scenario(Transport::Http).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_rozd_mcp_over_stdio_calls_take_the_same_path() {
    scenario(Transport::Stdio).await;
}

async fn elicitation(transport: Transport) {
    let daemon = daemon("").await;
    let mut script = Script::start(&daemon, transport, "elicit", Some(TOKEN));
    script.expect("connected").await;
    let asked = script.expect("elicitation").await;
    assert!(
        asked["message"]
            .as_str()
            .is_some_and(|m| m.contains("`arm`") && m.contains("0.5")),
        "{asked}"
    );
    let approved = script.expect("elicit_approved").await;
    assert_eq!(approved["is_error"], false, "{approved}");
    assert_eq!(arm(&daemon), Some(0.5));
    script.expect("elicitation").await;
    let declined = script.expect("elicit_declined").await;
    assert_eq!(
        declined["structured"]["error"]["code"], "denied",
        "{declined}"
    );
    // The client goes on to end its session (the deadman may already have
    // driven the arm safe): what the driver was told shows the refusal.
    let told = daemon.host.sim_actuator("arm").expect("sim arm").history();
    assert!(
        !told.contains(&0.2),
        "a declined call changes nothing: {told:?}"
    );
    // The client ends its session (DELETE /mcp): the deadman.
    script.expect("closed").await;
    assert_eq!(script.exit_code().await, Some(0));
    wait_arm_safe(&daemon).await;
    assert_eq!(daemon.host.mcp_session_count(), 0);
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_elicitation_asks_its_user_and_the_end_of_its_session_leaves_the_arm_safe() {
    elicitation(Transport::Http).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_rozd_mcp_the_approval_question_reaches_the_user_and_the_answer_the_daemon() {
    elicitation(Transport::Stdio).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_nobody_answers_is_denied_at_the_approval_timeout() {
    let daemon = daemon("[session]\napproval_timeout_secs = 1").await;
    let mut script = Script::start(&daemon, Transport::Http, "timeout", Some(TOKEN));
    script.expect("connected").await;
    let denied = script.expect("timed_out").await;
    assert_eq!(denied["structured"]["error"]["code"], "denied", "{denied}");
    assert!(
        denied["text"]
            .as_str()
            .is_some_and(|t| t.contains("approval_timeout_secs")),
        "{denied}"
    );
    assert_eq!(arm(&daemon), Some(0.0));
    assert!(daemon.host.approvals().list().is_empty(), "withdrawn");
    script.expect("closed").await;
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_token_mcp_is_refused_with_401() {
    let daemon = daemon("").await;
    let response = http()
        .post(format!("{}/mcp", daemon.url()))
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}))
        .send()
        .await
        .expect("POST /mcp");
    assert_eq!(response.status(), 401);
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    let body: Value = response.json().await.expect("JSON body");
    assert_eq!(body["error"]["code"], "unauthenticated", "{body}");

    let mut script = Script::start(&daemon, Transport::Http, "connect", None);
    let refused = script.expect("refused").await;
    assert!(
        refused["statuses"]
            .as_array()
            .is_some_and(|s| s.contains(&json!(401))),
        "{refused}"
    );
    assert_eq!(script.exit_code().await, Some(3));

    let mut script = Script::start(&daemon, Transport::Stdio, "connect", None);
    let refused = script.expect("refused").await;
    assert!(
        refused["error"].as_str().is_some_and(|e| e.contains("401")),
        "{refused}"
    );
    assert_eq!(script.exit_code().await, Some(3));

    let mut script = Script::start(&daemon, Transport::Http, "connect", Some("wrong"));
    let refused = script.expect("refused").await;
    assert!(
        refused["statuses"]
            .as_array()
            .is_some_and(|s| s.contains(&json!(401))),
        "{refused}"
    );
    assert_eq!(daemon.host.mcp_session_count(), 0);
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_is_behind_the_browser_checks_and_approvals_refuse_what_they_cannot_answer() {
    let daemon = daemon("").await;
    let initialize = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
    });
    let post = |host: Option<&str>, origin: Option<&str>| {
        let mut request = http()
            .post(format!("{}/mcp", daemon.url()))
            .bearer_auth(TOKEN)
            .header("accept", "application/json, text/event-stream")
            .json(&initialize);
        if let Some(host) = host {
            request = request.header("host", host);
        }
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        request.send()
    };
    let port = daemon.addr.port();
    let rebound = post(Some(&format!("attacker.example:{port}")), None)
        .await
        .unwrap();
    assert_eq!(rebound.status(), 421);
    let foreign = post(None, Some("http://attacker.example")).await.unwrap();
    assert_eq!(foreign.status(), 403);
    // A name of this daemon, and its own origin, pass both its checks and rmcp's.
    let own = post(
        Some(&format!("localhost:{port}")),
        Some(&format!("http://localhost:{port}")),
    )
    .await
    .unwrap();
    assert_eq!(own.status(), 200);
    assert!(own.headers().contains_key("mcp-session-id"));

    let (status, body) = rest(
        &daemon,
        reqwest::Method::POST,
        "/v1/approvals/no-such-call",
        Some(json!({"approve": true})),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_found")),
        "{body}"
    );
    let (status, body) = rest(
        &daemon,
        reqwest::Method::POST,
        "/v1/approvals/x",
        Some(json!({"approve": "yes"})),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_argument")),
        "{body}"
    );
    let unauthenticated = http()
        .get(format!("{}/v1/approvals", daemon.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(unauthenticated.status(), 401);
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rozd_mcp_starts_a_new_session_when_the_daemon_restarted() {
    let first = daemon("").await;
    let addr = first.addr;
    let mut script = Script::start(&first, Transport::Stdio, "reconnect", Some(TOKEN));
    script.expect("connected").await;
    assert_eq!(script.expect("first").await["is_error"], false);
    script.expect("await_restart").await;
    first.shutdown().await;
    let second = TestDaemon::setup(
        r#"
[[sensors]]
name = "temp"
source = "sim"
unit = "C"
signal = "constant"
offset = 21.0
"#,
    )
    .listen(addr)
    .token(TOKEN)
    .start()
    .await;
    assert_eq!(second.addr, addr);
    script.go().await;
    let again = script.expect("second").await;
    assert_eq!(again["is_error"], false, "{again}");
    assert_eq!(again["structured"]["sensor"]["value"], 21.0, "{again}");
    script.expect("closed").await;
    assert_eq!(script.exit_code().await, Some(0));
    second.shutdown().await;
}

/// An MCP session driven by hand over HTTP/1.1 (no SDK): what a client
/// that misbehaves, or a second client, does.
#[derive(Clone)]
struct RawSession {
    url: String,
    id: String,
    token: String,
}

impl RawSession {
    async fn open(daemon: &TestDaemon, name: &str) -> RawSession {
        Self::open_as(daemon, name, TOKEN).await
    }

    /// `initialize` with `token`: the answer (not read).
    async fn initialize(daemon: &TestDaemon, name: &str, token: &str) -> reqwest::Response {
        Self::post_as(
            &format!("{}/mcp", daemon.url()),
            token,
            None,
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": name, "version": "1"}}}),
        )
        .await
    }

    async fn open_as(daemon: &TestDaemon, name: &str, token: &str) -> RawSession {
        let url = format!("{}/mcp", daemon.url());
        let initialized = Self::initialize(daemon, name, token).await;
        assert_eq!(initialized.status(), 200);
        let id = initialized.headers()["mcp-session-id"]
            .to_str()
            .expect("session id")
            .to_string();
        initialized.bytes().await.expect("initialize answer");
        let accepted = Self::post_as(
            &url,
            token,
            Some(&id),
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        )
        .await;
        assert_eq!(accepted.status(), 202);
        RawSession {
            url,
            id,
            token: token.to_string(),
        }
    }

    async fn post_as(
        url: &str,
        token: &str,
        session: Option<&str>,
        body: Value,
    ) -> reqwest::Response {
        let mut request = http()
            .post(url)
            .bearer_auth(token)
            .header("accept", "application/json, text/event-stream")
            .json(&body);
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        request.send().await.expect("POST /mcp")
    }

    /// `tools/list` in this session: the answer (not read).
    async fn list_tools(&self) -> reqwest::Response {
        Self::post_as(
            &self.url,
            &self.token,
            Some(&self.id),
            json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list"}),
        )
        .await
    }

    /// Opens the session's event stream; it stays open while held.
    async fn events(&self) -> reqwest::Response {
        let events = http()
            .get(&self.url)
            .bearer_auth(&self.token)
            .header("accept", "text/event-stream")
            .header("mcp-session-id", &self.id)
            .send()
            .await
            .expect("GET /mcp");
        assert_eq!(events.status(), 200);
        events
    }

    /// Calls a tool; its result (from the answer's event stream).
    async fn call(&self, tool: &str, arguments: Value) -> Value {
        let answer = Self::post_as(
            &self.url,
            &self.token,
            Some(&self.id),
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": tool, "arguments": arguments}}),
        )
        .await;
        let text = String::from_utf8_lossy(&answer.bytes().await.expect("answer")).to_string();
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find_map(|m| m.get("result").cloned())
            .unwrap_or_else(|| panic!("no result in {text}"))
    }

    async fn delete(self) {
        let deleted = http()
            .delete(&self.url)
            .bearer_auth(&self.token)
            .header("mcp-session-id", &self.id)
            .send()
            .await
            .expect("DELETE /mcp");
        assert!(deleted.status().is_success(), "{}", deleted.status());
    }
}

const ARM_ALLOWED: &str = "[[permissions]]\ntool_pattern = \"arm\"\npolicy = \"allow\"";

/// A client that holds its event stream open but never answers: a silent
/// peer (a cut network, a hung process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_holds_its_stream_but_stops_answering_pings_leaves_the_arm_safe() {
    let daemon = daemon(&format!("[mcp]\nkeepalive_secs = 1\n{ARM_ALLOWED}")).await;
    let session = RawSession::open(&daemon, "silent").await;
    let events = session.events().await;
    let result = session.call("arm", json!({"value": 0.5})).await;
    assert_eq!(result["structuredContent"]["value"], 0.5, "{result}");
    assert_eq!(arm(&daemon), Some(0.5));
    // The stream stays open, the pings on it go unanswered.
    wait_arm_safe(&daemon).await;
    drop(events);
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_an_mcp_session_commands_is_its_own_until_the_session_ends() {
    let daemon = daemon(ARM_ALLOWED).await;
    let owner = RawSession::open(&daemon, "first").await;
    let other = RawSession::open(&daemon, "second").await;
    let result = owner.call("arm", json!({"value": 0.5})).await;
    assert_eq!(result["isError"], false, "{result}");
    let held = other.call("arm", json!({"value": 0.2})).await;
    assert_eq!(held["isError"], true, "{held}");
    assert_eq!(held["structuredContent"]["error"]["code"], "held", "{held}");
    assert_eq!(arm(&daemon), Some(0.5));
    // Going safe is anyone's: stop_all is never held, never asks.
    let stopped = other.call("stop_all", json!({})).await;
    assert_eq!(stopped["isError"], false, "{stopped}");
    assert_eq!(arm(&daemon), Some(0.0));
    owner.call("arm", json!({"value": -0.5})).await;
    assert_eq!(arm(&daemon), Some(-0.5));
    owner.delete().await;
    wait_arm_safe(&daemon).await;
    other.delete().await;
    daemon.shutdown().await;
}

const ALICE: &str = "alice-operate-secret-0123";
const BOB: &str = "bob-operate-secret-4567";

/// [`daemon`] with two more credentials, `alice` and `bob` (operate), whose
/// token files live in `dir`.
async fn daemon_with_operators(dir: &std::path::Path, extra: &str) -> TestDaemon {
    let file = |name: &str, secret: &str| {
        let path = dir.join(name);
        std::fs::write(&path, format!("{secret}\n")).unwrap();
        path.display().to_string()
    };
    let server = format!(
        "auth_tokens = [\"{TOKEN}\"]\n\
         [[server.tokens]]\nname = \"alice\"\ntoken_file = {alice:?}\nscopes = [\"read\", \"operate\"]\n\
         [[server.tokens]]\nname = \"bob\"\ntoken_file = {bob:?}\nscopes = [\"read\", \"operate\"]\n",
        alice = file("alice.token", ALICE),
        bob = file("bob.token", BOB),
    );
    let robot = format!(
        "{extra}\n[[actuators]]\nname = \"arm\"\nkind = \"sim\"\nmin = -1.0\nmax = 1.0\nsafe_value = 0.0\n"
    );
    TestDaemon::setup(&robot).server(&server).start().await
}

/// An answer that must be a JSON-RPC error: its status and error object.
async fn jsonrpc_error(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap_or_default().to_string())
        .unwrap_or_default();
    let text = response.text().await.expect("body");
    let body: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{status}: not JSON ({e}): {text}"));
    assert!(
        content_type.starts_with("application/json"),
        "{content_type}"
    );
    assert_eq!(body["jsonrpc"], "2.0", "{body}");
    assert!(body["error"]["code"].is_i64(), "{body}");
    (status, body)
}

async fn mcp_status(daemon: &TestDaemon) -> Value {
    let (status, body) = rest(daemon, reqwest::Method::GET, "/v1/status", None).await;
    assert_eq!(status, 200, "{body}");
    body["mcp"].clone()
}

/// Issue 32, item 10: a body nested deeper than the parser's limit (and
/// any body that is not a JSON-RPC message) is a bad request, 400 with a
/// JSON-RPC error, not 415 (its content type was right); nothing is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_nested_deeper_than_the_limit_is_400_with_a_json_rpc_error() {
    let daemon = daemon("").await;
    let session = RawSession::open(&daemon, "first").await;
    let url = format!("{}/mcp", daemon.url());
    let raw = |body: String, session: Option<&str>| {
        let mut request = http()
            .post(&url)
            .bearer_auth(TOKEN)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .body(body);
        if let Some(session) = session {
            request = request.header("mcp-session-id", session.to_string());
        }
        request.send()
    };
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    let nested = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-11-25","capabilities":{{}},"clientInfo":{{"name":"deep","version":"1"}},"x":{deep}}}}}"#
    );
    for in_session in [None, Some(session.id.as_str())] {
        let (status, body) = jsonrpc_error(raw(nested.clone(), in_session).await.unwrap()).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["code"], -32700, "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("recursion limit exceeded"), "{body}");
    }
    let (status, body) = jsonrpc_error(raw("{\"jsonrpc\":".into(), None).await.unwrap()).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (400, &json!(-32700)),
        "{body}"
    );
    let (status, body) = jsonrpc_error(raw("{\"hello\":1}".into(), None).await.unwrap()).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (400, &json!(-32600)),
        "{body}"
    );
    assert_eq!(daemon.host.mcp_session_count(), 1, "no session was created");
    // The session that was there still works.
    assert_eq!(session.list_tools().await.status(), 200);
    daemon.shutdown().await;
}

/// Issue 32, item 8: at most `mcp.max_sessions` MCP sessions. When all are
/// taken, the least recently active idle one makes room (its client hears
/// 404 and may start again); when every one has a request in flight, the
/// next `initialize` is refused with 503 and a JSON-RPC error naming the
/// cap; `/v1/status` counts them beside the cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_sessions_are_capped_idle_ones_make_room_and_busy_ones_refuse_the_newcomer() {
    let daemon = daemon("[mcp]\nmax_sessions = 2").await;
    let first = RawSession::open(&daemon, "first").await;
    let second = RawSession::open(&daemon, "second").await;
    let status = mcp_status(&daemon).await;
    assert_eq!(
        (&status["sessions"], &status["max_sessions"]),
        (&json!(2), &json!(2)),
        "{status}"
    );
    // Touch the first after the second: the second is now the least recently active.
    assert_eq!(first.list_tools().await.status(), 200);
    let third = RawSession::open(&daemon, "third").await;
    let (status, body) = jsonrpc_error(second.list_tools().await).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (404, &json!(-32001)),
        "{body}"
    );
    assert_eq!(
        first.list_tools().await.status(),
        200,
        "the more recent one stays"
    );
    let status = mcp_status(&daemon).await;
    assert_eq!(
        (&status["sessions"], &status["sessions_evicted"]),
        (&json!(2), &json!(1)),
        "{status}"
    );

    // Both busy: each has a call waiting for an operator's approval.
    let calls: Vec<_> = [first.clone(), third.clone()]
        .into_iter()
        .map(|s| tokio::spawn(async move { s.call("arm", json!({"value": 0.5})).await }))
        .collect();
    let approvals = &daemon.host.approvals();
    let mut changes = approvals.subscribe();
    tokio::time::timeout(
        EXPECT_WITHIN,
        changes.wait_for(|_| approvals.list().len() == 2),
    )
    .await
    .expect("both calls wait for approval")
    .expect("approvals alive");
    let (status, body) =
        jsonrpc_error(RawSession::initialize(&daemon, "fourth", TOKEN).await).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["id"], 1, "{body}");
    assert_eq!(body["error"]["code"], -32000, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("mcp.max_sessions") && message.contains('2'),
        "{body}"
    );
    let status = mcp_status(&daemon).await;
    assert_eq!(
        (&status["sessions"], &status["sessions_refused"]),
        (&json!(2), &json!(1)),
        "{status}"
    );
    // The busy sessions were left alone.
    for entry in approvals.list() {
        let (code, _) = rest(
            &daemon,
            reqwest::Method::POST,
            &format!("/v1/approvals/{}", entry.id),
            Some(json!({"approve": false})),
        )
        .await;
        assert_eq!(code, 200);
    }
    for call in calls {
        let result = tokio::time::timeout(EXPECT_WITHIN, call)
            .await
            .expect("call answered")
            .expect("call task");
        assert_eq!(
            result["structuredContent"]["error"]["code"], "denied",
            "{result}"
        );
    }
    // Idle again once the answers are finished (the server notes that just
    // after the client has read them): a newcomer gets a seat.
    let deadline = tokio::time::Instant::now() + EXPECT_WITHIN;
    loop {
        let answer = RawSession::initialize(&daemon, "fourth", TOKEN).await;
        if answer.status() == 200 {
            break;
        }
        assert_eq!(answer.status(), 503);
        assert!(
            tokio::time::Instant::now() < deadline,
            "no seat after the calls ended"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(daemon.host.mcp_session_count(), 2);
    daemon.shutdown().await;
}

/// Issue 32, item 8: when the sessions are full, a credential that opens
/// sessions in a loop displaces its own, not another credential's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_opening_many_sessions_evicts_its_own_first() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = daemon_with_operators(dir.path(), "[mcp]\nmax_sessions = 3").await;
    let bob = RawSession::open_as(&daemon, "bob", BOB).await;
    let mut alice = Vec::new();
    for i in 0..10 {
        alice.push(RawSession::open_as(&daemon, &format!("alice-{i}"), ALICE).await);
    }
    assert_eq!(
        bob.list_tools().await.status(),
        200,
        "bob's session survives alice's loop"
    );
    let alive: Vec<u16> = futures_util::future::join_all(
        alice
            .iter()
            .map(|s| async { s.list_tools().await.status().as_u16() }),
    )
    .await;
    assert_eq!(
        alive,
        [404, 404, 404, 404, 404, 404, 404, 404, 200, 200],
        "alice keeps her two newest"
    );
    daemon.shutdown().await;
}

/// Issue 32, item 8: an MCP session is the credential's that opened it:
/// another credential using, listening to or deleting it gets 404, as for
/// a session that does not exist, and the session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_session_is_not_there_for_another_credential() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = daemon_with_operators(
        dir.path(),
        "[[permissions]]\ntool_pattern = \"arm\"\npolicy = \"allow\"",
    )
    .await;
    let alice = RawSession::open_as(&daemon, "alice", ALICE).await;
    let as_bob = RawSession {
        token: BOB.to_string(),
        ..alice.clone()
    };
    let (status, body) = jsonrpc_error(as_bob.list_tools().await).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (404, &json!(-32001)),
        "{body}"
    );
    let call = RawSession::post_as(
        &alice.url,
        BOB,
        Some(&alice.id),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "arm", "arguments": {"value": 0.5}}}),
    )
    .await;
    assert_eq!(call.status(), 404);
    assert_eq!(
        arm(&daemon),
        Some(0.0),
        "bob moved nothing through alice's session"
    );
    let events = http()
        .get(&alice.url)
        .bearer_auth(BOB)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &alice.id)
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), 404);
    let deleted = http()
        .delete(&alice.url)
        .bearer_auth(BOB)
        .header("mcp-session-id", &alice.id)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 404);
    // Still alice's, and alive.
    let result = alice.call("arm", json!({"value": 0.5})).await;
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(arm(&daemon), Some(0.5));
    alice.delete().await;
    wait_arm_safe(&daemon).await;
    daemon.shutdown().await;
}

/// Issue 36: the official Python SDK lists the resources `rozd://embodiment`
/// and `rozd://manual` and reads them (the embodiment with the actuator's
/// limits, the manual as written), and gets the prompt `operate_robot`,
/// which carries both: over HTTP and through `rozd mcp`.
#[tokio::test]
async fn the_embodiment_and_the_manual_are_resources_and_a_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let manual = dir.path().join("AGENTS.md");
    std::fs::write(
        &manual,
        "The arm must never swing while a person is near.\n",
    )
    .unwrap();
    let daemon = daemon(&format!(
        "[agent]\nmanual_file = {:?}\n",
        manual.display().to_string()
    ))
    .await;
    let limits = "`arm` (rad): arm angle; range -1 to 1 rad; safe value 0 rad";
    for transport in [Transport::Http, Transport::Stdio] {
        let mut client = Script::start(&daemon, transport, "manual", Some(TOKEN));
        client.expect("connected").await;
        let resources = client.expect("resources").await;
        let uris: Vec<&str> = resources["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["uri"].as_str().unwrap())
            .collect();
        assert!(
            uris.contains(&"rozd://embodiment") && uris.contains(&"rozd://manual"),
            "{transport:?}: {resources}"
        );
        let embodiment = client.expect("read").await;
        assert_eq!(embodiment["uri"], "rozd://embodiment");
        assert_eq!(embodiment["mime_type"], "text/markdown");
        let text = embodiment["text"].as_str().unwrap();
        assert!(text.contains(limits), "{transport:?}: {text}");
        assert_eq!(text, daemon.host.briefing().embodiment.markdown);
        let read = client.expect("read").await;
        assert_eq!(read["uri"], "rozd://manual");
        assert_eq!(
            read["text"],
            "The arm must never swing while a person is near.\n"
        );
        let prompts = client.expect("prompts").await;
        assert_eq!(prompts["prompts"][0]["name"], "operate_robot", "{prompts}");
        let prompt = client.expect("prompt").await;
        let message = &prompt["messages"][0];
        assert_eq!(message["role"], "user");
        let text = message["text"].as_str().unwrap();
        assert!(text.contains(limits), "{text}");
        assert!(
            text.contains("The arm must never swing while a person is near."),
            "{text}"
        );
        assert!(
            prompt["description"]
                .as_str()
                .unwrap()
                .contains(&daemon.host.briefing().version),
            "{prompt}"
        );
        client.expect("closed").await;
        assert_eq!(client.exit_code().await, Some(0));
    }
    daemon.shutdown().await;
}
