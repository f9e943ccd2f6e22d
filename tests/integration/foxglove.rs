//! The Foxglove WebSocket protocol at `/foxglove` (issue 38), against a real
//! daemon over loopback with an independent client: `@foxglove/ws-protocol`'s
//! `FoxgloveClient` under Node (`tests/integration/foxglove/client.js`,
//! installed by `scripts/test.sh` into `target/node`).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{self, EXPECT_WITHIN, TestDaemon};

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
    TestDaemon::setup(ROBOT).server(&tokens(dir)).start().await
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
    assert_eq!(daemon.host.ooda().observe_now().actuators[0].value, 0.0);
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
    assert!(
        daemon
            .host
            .ooda()
            .protective_stop()
            .state()
            .causes
            .is_empty()
    );
    daemon.shutdown().await;
}

/// A counter or gauge of `GET /metrics` on `base` (`name` as exposed,
/// counters with `_total`).
async fn metric(addr: &str, name: &str) -> f64 {
    let reply = rozd::cli::client::get(addr, "/metrics", None)
        .await
        .unwrap_or_else(|e| panic!("GET /metrics: {e}"));
    reply
        .body
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{}", reply.body))
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the daemon runs");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// Polls `metric` until `pred` holds, at most `bound`.
async fn until_metric(addr: &str, name: &str, bound: Duration, pred: impl Fn(f64) -> bool) -> f64 {
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        let value = metric(addr, name).await;
        if pred(value) {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} is still {value} after {bound:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foxglove_client_that_never_reads_loses_frames_not_the_daemons_memory_or_stop() {
    let dir = tempfile::tempdir().unwrap();
    let port = common::broker::free_port();
    let config = dir.path().join("rozd.toml");
    // A sim camera at 60 fps and a fast sensor: a stalled client's share
    // fills its socket's buffers within seconds.
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\ncontrol_socket = \"\"\n\
             [store]\npath = {:?}\n\
             [foxglove]\nsend_buffer = 16\nmax_hz = 1000\nsend_timeout_secs = 600\n\
             [sim]\n\
             [[sensors]]\nname = \"fast\"\nsource = \"sim\"\nsignal = \"sine\"\nrate_hz = 200\n\
             [[cameras]]\nname = \"front\"\nsource = \"sim\"\nwidth = 640\nheight = 480\nfps = 60\n",
            dir.path().join("rozd.db").display().to_string()
        ),
    )
    .unwrap();
    let rozd = common::spawn_rozd(dir.path(), &config).await;
    let pid = rozd.id().expect("rozd's pid");
    let addr = format!("127.0.0.1:{port}");
    let url = format!("ws://{addr}/foxglove");

    // Subscribes to everything, then never reads again.
    let mut stalled = client_command(&json!({
        "url": url,
        "subscribe": ["/observation", "/sensors/fast", "/cameras/front", "/sim/scene",
                      "/protective_stop", "/audit"],
        "stall": true,
        "timeout_ms": 600_000,
    }))
    .stdout(std::process::Stdio::piped())
    .spawn()
    .expect("node runs");
    let mut lines = tokio::io::BufReader::new(stalled.stdout.take().unwrap());
    let mut first = String::new();
    tokio::time::timeout(
        EXPECT_WITHIN,
        tokio::io::AsyncBufReadExt::read_line(&mut lines, &mut first),
    )
    .await
    .expect("the client subscribes")
    .unwrap();
    assert!(first.contains("\"stalled\":true"), "{first}");

    // Its frames are dropped and counted, and the daemon's memory stays
    // bounded while thousands more are dropped.
    let bound = Duration::from_secs(120);
    let dropped = "rozd_foxglove_messages_dropped_total";
    let first_drops = until_metric(&addr, dropped, bound, |d| d > 0.0).await;
    let rss_then = rss_kib(pid);
    until_metric(&addr, dropped, bound, |d| d >= first_drops + 3000.0).await;
    let rss_now = rss_kib(pid);
    assert!(
        rss_now < rss_then + 32 * 1024,
        "RSS grew from {rss_then} KiB to {rss_now} KiB while a stalled client's frames were dropped"
    );
    assert_eq!(
        metric(&addr, "rozd_foxglove_clients").await,
        1.0,
        "the stalled client is still connected"
    );

    // The stop still latches, and another client is served at once.
    let reply = tokio::time::timeout(
        EXPECT_WITHIN,
        rozd::cli::client::post_json(
            &addr,
            "/v1/estop",
            None,
            &json!({"reason": "stalled viewer"}),
        ),
    )
    .await
    .expect("the stop answers")
    .expect("POST /v1/estop");
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.body);
    let safety: Value = serde_json::from_str(
        &rozd::cli::client::get(&addr, "/v1/safety", None)
            .await
            .unwrap()
            .body,
    )
    .unwrap();
    assert_eq!(safety["estop_active"], true, "{safety}");
    let report = foxglove(json!({
        "url": url,
        "subscribe": ["/observation"],
        "wait": {"/observation": 2},
    }))
    .await;
    assert!(report.get("error").is_none(), "{report}");
    let stop = &report["messages"]["/observation"][1]["body"]["protective_stop"];
    assert_eq!(stop["reason"], "stalled viewer", "{report}");
    let _ = stalled.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foxglove_sim_scene_shows_the_room_and_the_rover_where_it_is() {
    let daemon = TestDaemon::start("[sim]\n").await;
    let report = foxglove(json!({
        "url": format!("ws://{}/foxglove", daemon.addr),
        "subscribe": ["/sim/scene"],
        "wait": {"/sim/scene": 1},
    }))
    .await;
    assert!(report.get("error").is_none(), "{report}");
    assert_eq!(
        channel(&report, "/sim/scene")["schemaName"],
        "foxglove.SceneUpdate"
    );
    let scene = &report["messages"]["/sim/scene"][0]["body"];
    assert_eq!(
        missing_required(&schema_of(&report, "/sim/scene"), scene),
        Vec::<String>::new()
    );
    let entity = |id: &str| {
        scene["entities"]
            .as_array()
            .and_then(|e| e.iter().find(|e| e["id"] == id))
            .unwrap_or_else(|| panic!("no entity {id}: {scene}"))
            .clone()
    };
    let sim = daemon.host.ooda().sim_spec().expect("a simulated world").0;
    // The floor, four walls and every obstacle.
    assert_eq!(
        entity("room")["cubes"].as_array().map(Vec::len),
        Some(5 + sim.obstacles.len())
    );
    // The rover stands still at its start: where the scene shows it.
    let rover = entity("rover");
    let at = &rover["cylinders"][0]["pose"]["position"];
    let view = daemon.host.ooda().sim_world().unwrap();
    assert!(
        (at["x"].as_f64().unwrap() - view.x).abs() < 1e-9
            && (at["y"].as_f64().unwrap() - view.y).abs() < 1e-9,
        "{at} vs {view:?}"
    );
    assert_eq!(rover["frame_id"], "world");
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foxglove_connection_that_ends_sends_what_it_commanded_to_safe() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = robot(dir.path()).await;
    let report = foxglove(json!({
        "url": format!("ws://{}/foxglove?token={OPERATE_SECRET}", daemon.addr),
        "calls": [{"service": "command_actuator",
                   "request": {"actuator": "speed", "value": 0.7, "hold_ms": 600000}}],
    }))
    .await;
    assert_eq!(report["calls"][0]["ok"], true, "{report}");
    // The client has exited: its connection ended; the held value goes safe.
    common::observed(
        daemon.host.ooda(),
        EXPECT_WITHIN,
        "speed back at its safe value after the Foxglove client left",
        |o| {
            o.actuators
                .iter()
                .any(|a| a.name == "speed" && a.value == 0.0)
        },
    )
    .await;
    // The safe drive is audited as the deadman's (the audit writer runs on
    // its own: polled, bounded).
    let deadline = tokio::time::Instant::now() + EXPECT_WITHIN;
    loop {
        let audit = get(&daemon, "/v1/audit?limit=100", ADMIN_SECRET).await;
        let released = audit["data"].as_array().unwrap().iter().any(|r| {
            r["kind"] == "actuator"
                && r["result"] == "0"
                && r["origin"]
                    .as_str()
                    .is_some_and(|o| o.contains("Foxglove client disconnected"))
        });
        if released {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no deadman drive audited: {audit}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foxglove_clients_beyond_the_cap_are_refused_at_the_handshake() {
    let daemon = TestDaemon::start(&format!("{ROBOT}\n[foxglove]\nmax_clients = 1\n")).await;
    let url = format!("ws://{}/foxglove", daemon.addr);
    let refused_before = metric(
        &daemon.addr.to_string(),
        "rozd_foxglove_clients_refused_total",
    )
    .await;
    // The one place, held by a client that stays.
    let mut holder = client_command(&json!({
        "url": url, "subscribe": ["/audit"], "stall": true, "timeout_ms": 600_000,
    }))
    .stdout(std::process::Stdio::piped())
    .spawn()
    .expect("node runs");
    let mut lines = tokio::io::BufReader::new(holder.stdout.take().unwrap());
    let mut first = String::new();
    tokio::time::timeout(
        EXPECT_WITHIN,
        tokio::io::AsyncBufReadExt::read_line(&mut lines, &mut first),
    )
    .await
    .expect("the first client connects")
    .unwrap();
    assert!(first.contains("\"stalled\":true"), "{first}");
    let report = foxglove(json!({"url": url, "timeout_ms": 10000})).await;
    assert_eq!(
        (report["error"].as_str(), report["status"].as_u64()),
        (Some("refused"), Some(503)),
        "{report}"
    );
    assert!(
        report["body"]
            .as_str()
            .unwrap_or_default()
            .contains("foxglove.max_clients"),
        "{report}"
    );
    assert!(
        metric(
            &daemon.addr.to_string(),
            "rozd_foxglove_clients_refused_total"
        )
        .await
            > refused_before
    );
    // Its place comes free when it leaves.
    let _ = holder.kill().await;
    let deadline = tokio::time::Instant::now() + EXPECT_WITHIN;
    loop {
        let report = foxglove(json!({"url": url, "timeout_ms": 10000})).await;
        if report["serverInfo"]["op"] == "serverInfo" {
            break;
        }
        assert_eq!(report["status"], 503, "{report}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "the place never came free: {report}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foxglove_own_port_serves_foxglove_alone_with_the_same_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let port = common::broker::free_port();
    let daemon = TestDaemon::setup(&format!(
        "{ROBOT}\n[foxglove]\nlisten = \"127.0.0.1:{port}\"\n"
    ))
    .server(&tokens(dir.path()))
    .start()
    .await;
    // Where `ws://host:8765` lands: `/`, with the token in the query.
    let report = foxglove(json!({
        "url": format!("ws://127.0.0.1:{port}/?token={READ_SECRET}"),
        "subscribe": ["/sensors/distance"],
        "wait": {"/sensors/distance": 1},
    }))
    .await;
    assert!(report.get("error").is_none(), "{report}");
    assert_eq!(report["serverInfo"]["op"], "serverInfo");
    let refused =
        foxglove(json!({"url": format!("ws://127.0.0.1:{port}/"), "timeout_ms": 10000})).await;
    assert_eq!(refused["status"], 401, "{refused}");
    // Nothing else is served there.
    let reply = rozd::cli::client::get(
        &format!("127.0.0.1:{port}"),
        "/v1/status",
        Some(ADMIN_SECRET),
    )
    .await
    .unwrap();
    assert_eq!(reply.status.as_u16(), 404, "{}", reply.body);
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foxglove_command_that_needs_approval_waits_until_foxglove_approves_or_denies() {
    let dir = tempfile::tempdir().unwrap();
    let robot = ROBOT.replace("policy = \"allow\"", "policy = \"require_confirmation\"");
    let daemon = TestDaemon::setup(&robot)
        .server(&tokens(dir.path()))
        .start()
        .await;
    let url = format!("ws://{}/foxglove?token={OPERATE_SECRET}", daemon.addr);
    for (answer, value) in [("deny", 0.2), ("approve", 0.3)] {
        // The call waits in the host's list of approvals...
        let waiting = tokio::spawn(foxglove(json!({
            "url": url,
            "calls": [{"service": "command_actuator", "request": {"actuator": "speed", "value": value}}],
        })));
        let deadline = tokio::time::Instant::now() + EXPECT_WITHIN;
        let call = loop {
            let list = get(&daemon, "/v1/approvals", READ_SECRET).await;
            if let Some(call) = list["data"].as_array().and_then(|d| d.first()).cloned() {
                break call;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no call waits: {list}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(
            (
                call["kind"].as_str(),
                call["tool"].as_str(),
                call["origin"].as_str()
            ),
            (Some("foxglove"), Some("speed"), Some("foxglove:operator")),
            "{call}"
        );
        // ...until another Foxglove client answers it; a read token may not.
        let read = foxglove(json!({
            "url": format!("ws://{}/foxglove?token={READ_SECRET}", daemon.addr),
            "calls": [{"service": answer, "request": {"id": call["id"]}}],
        }))
        .await;
        assert!(
            read["calls"][0]["message"]
                .as_str()
                .unwrap_or_default()
                .starts_with("permission_denied"),
            "{read}"
        );
        let answered = foxglove(json!({
            "url": url,
            "calls": [{"service": answer, "request": {"id": call["id"]}}],
        }))
        .await;
        assert_eq!(answered["calls"][0]["ok"], true, "{answered}");
        let report = waiting.await.unwrap();
        let result = &report["calls"][0];
        let moved = daemon.host.ooda().observe_now().actuators[0].value;
        if answer == "approve" {
            // Applied (and, its client gone, released by the deadman since).
            assert_eq!(result["ok"], true, "{report}");
            assert_eq!(result["response"]["result"]["value"].as_f64(), Some(value));
        } else {
            assert!(
                result["message"]
                    .as_str()
                    .unwrap_or_default()
                    .starts_with("denied"),
                "{report}"
            );
            assert_eq!(moved, 0.0);
        }
    }
    daemon.shutdown().await;
}
