//! The Foxglove WebSocket protocol at `/foxglove` (issue 38), against a real
//! daemon over loopback with an independent client: `@foxglove/ws-protocol`'s
//! `FoxgloveClient` under Node (`tests/integration/foxglove/client.js`,
//! installed by `scripts/test.sh` into `target/node`).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::TestDaemon;

const READ_SECRET: &str = "fox-read-secret-0123";
const OPERATE_SECRET: &str = "fox-operate-secret-4567";
const ADMIN_SECRET: &str = "fox-admin-secret-89ab";

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

/// `[[server.tokens]]` of each scope, the secrets in files under `dir`.
fn tokens(dir: &std::path::Path) -> String {
    let file = |name: &str, secret: &str| {
        let path = dir.join(name);
        std::fs::write(&path, format!("{secret}\n")).unwrap();
        path.display().to_string()
    };
    format!(
        r#"
[[server.tokens]]
name = "viewer"
token_file = {read:?}
scopes = ["read"]

[[server.tokens]]
name = "operator"
token_file = {operate:?}
scopes = ["read", "operate"]

[[server.tokens]]
name = "root"
token_file = {admin:?}
scopes = ["admin"]
"#,
        read = file("viewer.token", READ_SECRET),
        operate = file("operator.token", OPERATE_SECRET),
        admin = file("root.token", ADMIN_SECRET),
    )
}

async fn robot(dir: &std::path::Path) -> TestDaemon {
    TestDaemon::start_server(
        &tokens(dir),
        ROBOT,
        |_| {},
        std::sync::Arc::new(rozd::session::LogHooks),
    )
    .await
}

/// Where `@foxglove/ws-protocol` and `ws` are installed
/// (`$ROZD_TEST_NODE_MODULES`, else `target/node/node_modules`).
fn node_modules() -> PathBuf {
    let dir = std::env::var_os("ROZD_TEST_NODE_MODULES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/node/node_modules")
        });
    assert!(
        dir.join("@foxglove/ws-protocol").exists() && dir.join("ws").exists(),
        "@foxglove/ws-protocol and ws are missing from {}: run ./scripts/test.sh, which installs them",
        dir.display()
    );
    dir
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/integration/foxglove/client.js")
}

fn client_command(plan: &Value) -> tokio::process::Command {
    let mut command = tokio::process::Command::new("node");
    command
        .arg(script())
        .arg(plan.to_string())
        .env("NODE_PATH", node_modules())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    command
}

/// Runs the client with `plan` to its end: its report.
async fn foxglove(plan: Value) -> Value {
    let output = tokio::time::timeout(Duration::from_secs(60), client_command(&plan).output())
        .await
        .expect("the Foxglove client ends")
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("the client's report is not JSON ({e}): {stdout}\n{stderr}"))
}

/// Whether `body` has every property `schema` requires (each advertised
/// schema is checked this far; the recording tests validate them fully).
fn missing_required(schema: &Value, body: &Value) -> Vec<String> {
    schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|key| body.get(*key).is_none())
        .map(str::to_string)
        .collect()
}

fn channel<'a>(report: &'a Value, topic: &str) -> &'a Value {
    report["channels"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["topic"] == topic))
        .unwrap_or_else(|| panic!("no channel {topic}: {report}"))
}

fn schema_of(report: &Value, topic: &str) -> Value {
    let channel = channel(report, topic);
    serde_json::from_str(channel["schema"].as_str().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{topic}'s schema is not JSON ({e}): {channel}"))
}

async fn get(daemon: &TestDaemon, path: &str, token: &str) -> Value {
    let reply = rozd::cli::client::get(&daemon.addr.to_string(), path, Some(token))
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    assert_eq!(reply.status.as_u16(), 200, "GET {path}: {}", reply.body);
    serde_json::from_str(&reply.body).unwrap_or_else(|e| panic!("GET {path} ({e}): {}", reply.body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foxglove_read_token_lists_subscribes_decodes_and_stops_but_cannot_command_or_clear() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = robot(dir.path()).await;
    let report = foxglove(json!({
        // The Foxglove app's way: the token in the query.
        "url": format!("ws://{}/foxglove?token={READ_SECRET}", daemon.addr),
        "subscribe": ["/observation", "/sensors/distance", "/protective_stop", "/actuators/speed"],
        "wait": {"/observation": 2, "/sensors/distance": 2},
        "calls": [
            {"service": "command_actuator", "request": {"actuator": "speed", "value": 0.5}},
            {"service": "clear_protective_stop", "request": {}},
            {"service": "protective_stop", "request": {"reason": "seen in Foxglove"}},
        ],
        "after": {"/protective_stop": 1},
    }))
    .await;
    assert!(report.get("error").is_none(), "{report}");

    // Channels: the recordings' topics, each with its JSON Schema.
    let mut topics: Vec<&str> = report["channels"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["topic"].as_str())
        .collect();
    topics.sort_unstable();
    assert_eq!(
        topics,
        [
            "/actuators/speed",
            "/audit",
            "/observation",
            "/protective_stop",
            "/sensors/distance",
            "/sessions",
            "/tasks"
        ]
    );
    for c in report["channels"].as_array().unwrap() {
        assert_eq!(
            (c["encoding"].as_str(), c["schemaEncoding"].as_str()),
            (Some("json"), Some("jsonschema")),
            "{c}"
        );
        let topic = c["topic"].as_str().unwrap();
        assert_eq!(schema_of(&report, topic)["title"], c["schemaName"], "{c}");
    }
    let mut services: Vec<&str> = report["services"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    services.sort_unstable();
    assert_eq!(
        services,
        [
            "approve",
            "clear_protective_stop",
            "command_actuator",
            "deny",
            "protective_stop"
        ]
    );

    // Messages decode, carry what their schemas require, and say what REST says.
    let observations = report["messages"]["/observation"].as_array().unwrap();
    let schema = schema_of(&report, "/observation");
    let rest = get(&daemon, "/v1/observation", READ_SECRET).await;
    let names = |o: &Value, key: &str| -> Vec<String> {
        o[key]
            .as_array()
            .unwrap_or_else(|| panic!("{key} in {o}"))
            .iter()
            .map(|s| s["name"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    let mut seqs = Vec::new();
    for o in observations {
        let body = &o["body"];
        assert_eq!(
            missing_required(&schema, body),
            Vec::<String>::new(),
            "{body}"
        );
        assert_eq!(names(body, "sensors"), names(&rest, "sensors"));
        assert_eq!(names(body, "actuators"), names(&rest, "actuators"));
        assert_eq!(
            body["sensors"][0]["value"].as_f64(),
            rest["sensors"][0]["value"].as_f64()
        );
        seqs.push(body["seq"].as_u64().unwrap());
    }
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "ticks advance: {seqs:?}"
    );
    assert!(seqs.last() <= rest["seq"].as_u64().as_ref());
    let schema = schema_of(&report, "/sensors/distance");
    for m in report["messages"]["/sensors/distance"].as_array().unwrap() {
        let body = &m["body"];
        assert_eq!(
            missing_required(&schema, body),
            Vec::<String>::new(),
            "{body}"
        );
        assert_eq!(
            (body["sensor"].as_str(), body["value"].as_f64()),
            (Some("distance"), Some(1.0))
        );
        // The message's log time is when rozd received the value (the body's
        // integer went through a JavaScript number: within its precision).
        let logged: u64 = m["timestamp"].as_str().unwrap().parse().unwrap();
        let received = body["at_unix_ns"].as_f64().unwrap();
        assert!(
            (logged as f64 - received).abs() < 1024.0,
            "{logged} vs {received}"
        );
    }

    // A read credential may not command or clear; it may stop.
    let calls = report["calls"].as_array().unwrap();
    for (call, service) in calls
        .iter()
        .zip(["command_actuator", "clear_protective_stop"])
    {
        assert_eq!(call["service"], service);
        assert_eq!(call["ok"], false, "{call}");
        let message = call["message"].as_str().unwrap();
        assert!(
            message.starts_with("permission_denied")
                && message.contains("\"viewer\" has scope read"),
            "{message}"
        );
    }
    let stop = &calls[2];
    assert_eq!(
        (stop["ok"].as_bool(), stop["response"]["latched"].as_bool()),
        (Some(true), Some(true)),
        "{stop}"
    );
    let latched = &report["after"]["/protective_stop"][0]["body"];
    assert_eq!(
        missing_required(&schema_of(&report, "/protective_stop"), latched),
        Vec::<String>::new()
    );
    assert_eq!(
        (
            latched["event"].as_str(),
            latched["latched"].as_bool(),
            latched["source"].as_str(),
            latched["credential"].as_str()
        ),
        (
            Some("triggered"),
            Some(true),
            Some("foxglove"),
            Some("viewer")
        ),
        "{latched}"
    );
    let safety = get(&daemon, "/v1/safety", READ_SECRET).await;
    assert_eq!(safety["estop_active"], true, "{safety}");
    // The refused command moved nothing: the actuator's channel shows only
    // the stop's safe drive.
    let kinds: Vec<&str> = report["after"]["/actuators/speed"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["body"]["kind"].as_str())
        .collect();
    assert!(!kinds.contains(&"command"), "{kinds:?}");
    assert_eq!(daemon.ctx.ooda.observe_now().actuators[0].value, 0.0);
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foxglove_handshake_without_a_valid_credential_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = robot(dir.path()).await;
    for url in [
        format!("ws://{}/foxglove", daemon.addr),
        format!("ws://{}/foxglove?token=not-a-token", daemon.addr),
    ] {
        let report = foxglove(json!({"url": url, "timeout_ms": 10000})).await;
        assert_eq!(
            (report["error"].as_str(), report["status"].as_u64()),
            (Some("refused"), Some(401)),
            "{url}: {report}"
        );
        assert!(report["serverInfo"].is_null());
    }
    // The same handshake with a valid token in the query is served.
    let report = foxglove(json!({
        "url": format!("ws://{}/foxglove?token={READ_SECRET}", daemon.addr),
        "timeout_ms": 10000,
    }))
    .await;
    assert_eq!(report["serverInfo"]["op"], "serverInfo", "{report}");
    // The token is taken from the query only at /foxglove.
    let reply = rozd::cli::client::get(
        &daemon.addr.to_string(),
        &format!("/v1/status?token={ADMIN_SECRET}"),
        None,
    )
    .await
    .unwrap();
    assert_eq!(reply.status.as_u16(), 401, "{}", reply.body);
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foxglove_command_actuator_takes_the_physical_path_and_admin_clears() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = robot(dir.path()).await;
    let url = format!("ws://{}/foxglove", daemon.addr);
    let report = foxglove(json!({
        "url": url,
        "authorization": format!("Bearer {OPERATE_SECRET}"),
        "subscribe": ["/actuators/speed", "/audit"],
        "calls": [
            {"service": "command_actuator", "request": {"actuator": "speed", "value": 0.4, "hold_ms": 60000}},
            {"service": "command_actuator", "request": {"actuator": "speed", "value": 5.0}},
            {"service": "command_actuator", "request": {"actuator": "nope", "value": 0.1}},
            {"service": "clear_protective_stop", "request": {}},
            {"service": "protective_stop", "request": {}},
        ],
        "after": {"/actuators/speed": 2},
    }))
    .await;
    assert!(report.get("error").is_none(), "{report}");
    let calls = report["calls"].as_array().unwrap();
    assert_eq!(calls[0]["ok"], true, "{}", calls[0]);
    let refused = |i: usize, code: &str| {
        let message = calls[i]["message"].as_str().unwrap_or_default();
        assert!(
            calls[i]["ok"] == false && message.starts_with(code),
            "{code}: {}",
            calls[i]
        );
    };
    refused(1, "safety_violation");
    refused(2, "invalid_argument");
    refused(3, "permission_denied");
    assert_eq!(calls[4]["ok"], true, "{}", calls[4]);
    // The command, then the stop's safe drive, on the actuator's channel.
    let changes: Vec<(f64, String)> = report["after"]["/actuators/speed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["body"]["value"].as_f64().unwrap(),
                m["body"]["kind"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        changes[..2],
        [(0.4, "command".into()), (0.0, "safe".into())]
    );
    // Audited as the physical call of this credential, from Foxglove.
    let audit = get(&daemon, "/v1/audit?limit=100", ADMIN_SECRET).await;
    let rows = audit["data"].as_array().unwrap();
    let row = rows
        .iter()
        .find(|r| r["kind"] == "tool_call" && r["tool"] == "speed" && r["result"].is_string())
        .unwrap_or_else(|| panic!("no audit row of the call: {audit}"));
    assert_eq!(
        (row["origin"].as_str(), row["credential"].as_str()),
        (Some("foxglove:operator"), Some("operator")),
        "{row}"
    );

    // Only admin clears.
    let report = foxglove(json!({
        "url": format!("{url}?token={ADMIN_SECRET}"),
        "calls": [{"service": "clear_protective_stop", "request": {"reason": "checked"}}],
    }))
    .await;
    let clear = &report["calls"][0];
    assert_eq!(
        (
            clear["ok"].as_bool(),
            clear["response"]["latched"].as_bool()
        ),
        (Some(true), Some(false)),
        "{report}"
    );
    assert!(daemon.ctx.ooda.protective_stop().state().causes.is_empty());
    daemon.shutdown().await;
}
