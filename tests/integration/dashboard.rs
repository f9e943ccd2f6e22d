//! The dashboard (`/ui`) in a real headless Chromium driven by Selenium
//! (`tests/python/dashboard.py`; `scripts/test.sh` installs chromium,
//! chromium-driver and selenium): with tokens configured the page asks for
//! one and streams live data; a sensor's value changes on the page; every
//! waiting approval is listed, whoever asks (a gRPC session that never
//! answers, as the published roz CLI does; an MCP client; a task), with its
//! tool, parameters and asker, and is answered from the page; every open
//! session (gRPC, MCP) is listed; the rover's camera is shown live beside
//! the world view; the STOP button latches the stop.
//! Screenshots go to `target/`. Also the
//! stream's wire format (server-sent events over a plain response, resumed
//! after `Last-Event-ID`) and the page's own headers.

use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::approvals::{Token, mcp_call, mcp_open};
use crate::common::{self, EXPECT_WITHIN, Session, TestDaemon};
use rozd::api::proto;
use rozd::api::proto::agent_service_client::AgentServiceClient;
use rozd::api::proto::session_request::Request as Req;
use rozd::api::proto::session_response::Response as Resp;
use tokio_stream::wrappers::ReceiverStream;

const TOKEN: &str = "dashboard-test-token";

/// The built-in rover's world, a sine sensor that always moves, and a rule-free drive.
const HOST: &str = r#"
[host]
name = "Dashboard rover"
environment_id = "lab"

[sim]
seed = 1
range_noise_m = 0.0

[[sensors]]
name = "front_distance"
source = "sim"
quantity = "front_distance"
unit = "m"
warn_min = 0.5
critical_min = 0.3

[[sensors]]
name = "bumper"
source = "sim"
quantity = "bumper"
critical_max = 0.5

# Above its critical limit from the start: the page's alarm banner.
[[sensors]]
name = "coolant_temp"
source = "sim"
signal = "constant"
offset = 91.0
unit = "degC"
warn_max = 80.0
critical_max = 85.0

[[sensors]]
name = "battery_voltage"
source = "sim"
quantity = "battery_voltage"
unit = "V"
warn_min = 11.8
critical_min = 11.5

[[sensors]]
name = "wave"
source = "sim"
signal = "sine"
amplitude = 1.0
period_ms = 4000
unit = "V"
rate_hz = 20
warn_max = 0.8
critical_max = 0.95

[[actuators]]
name = "drive_speed"
kind = "sim"
input = "drive_speed"
unit = "m/s"
min = -0.5
max = 0.5
safe_value = 0.0
hold_ms = 20000

[[actuators]]
name = "turn_rate"
kind = "sim"
input = "turn_rate"
unit = "deg/s"
min = -90.0
max = 90.0
safe_value = 0.0

# The rover's own view, shown live beside the world.
[[cameras]]
name = "front_camera"
source = "sim"
width = 320
height = 240
fps = 5

# Fires once turn_rate is commanded above 0 (while the coolant is hot).
[[rules]]
name = "no_turning_hot"
when = "coolant_temp > 85 and turn_rate > 0"
then = { actuator = "turn_rate", value = 0.0 }

# Never fires here.
[[rules]]
name = "stop_before_obstacle"
when = "front_distance < 0.3 and drive_speed > 0"
for_ms = 100
then = { actuator = "drive_speed", value = 0.0 }
"#;

fn python() -> PathBuf {
    common::pyenv_tool("python")
}

fn target_dir() -> PathBuf {
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    std::fs::create_dir_all(&dir).expect("target dir");
    dir
}

async fn dashboard_daemon() -> TestDaemon {
    TestDaemon::setup(HOST)
        .server(&format!("auth_tokens = [{TOKEN:?}]"))
        .start()
        .await
}

/// A gRPC session that asks its model for `prompt` and, like the published
/// roz CLI, never answers an approval: the id of its call that waits, and
/// a task that reads the session to the end of its turn (the call's result)
/// and gives back the errors on the way and the session, still open.
async fn silent_session(
    daemon: &TestDaemon,
    prompt: &str,
) -> (
    String,
    tokio::task::JoinHandle<(Vec<proto::SessionError>, Session)>,
) {
    let mut client = AgentServiceClient::with_interceptor(daemon.channel().await, Token(TOKEN));
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let response = client
        .stream_session(ReceiverStream::new(rx))
        .await
        .expect("StreamSession");
    let mut session = Session {
        tx,
        rx: response.into_inner(),
        wait_bound: Duration::from_secs(240),
    };
    session.start(proto::StartSession::default()).await;
    session
        .send(Req::UserMessage(proto::UserMessage {
            content: prompt.into(),
            ..Default::default()
        }))
        .await;
    let id = loop {
        match session.next().await {
            Resp::ActivityUpdate(a) if a.state == "waiting_approval" => break a.detail,
            Resp::Error(e) => panic!("{e:?}"),
            _ => {}
        }
    };
    let rest = tokio::spawn(async move {
        let mut errors = Vec::new();
        loop {
            match session.next().await {
                Resp::TurnComplete(_) => return (errors, session),
                Resp::Error(e) => errors.push(e),
                _ => {}
            }
        }
    });
    (id, rest)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_drives_the_dashboard() {
    let daemon = dashboard_daemon().await;
    let addr = daemon.addr.to_string();
    // A task whose physical call waits for approval; the slow model keeps
    // the worker (and so its command) alive for a while after the call.
    let created = rozd::cli::client::post_json(
        &addr,
        "/v1/tasks",
        Some(TOKEN),
        &serde_json::json!({"prompt": "wait 8000; set drive_speed 0.3"}),
    )
    .await
    .expect("POST /v1/tasks");
    assert_eq!(created.status, 201, "{}", created.body);
    let task: serde_json::Value = serde_json::from_str(&created.body).expect("task JSON");
    let task_id = task["id"].as_str().expect("task id").to_string();
    // A gRPC session's call the page approves, an MCP call it denies.
    let (session_call, session_turn) = silent_session(&daemon, "set turn_rate 10").await;
    let (mcp_url, mcp_session) = mcp_open(&daemon, TOKEN).await;
    let mcp = mcp_call(
        mcp_url,
        TOKEN,
        mcp_session,
        "turn_rate",
        serde_json::json!({"value": -20.0}),
    );

    let shots = target_dir();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/dashboard.py");
    let run = tokio::process::Command::new(python())
        .arg(&script)
        .arg(daemon.url())
        .arg(TOKEN)
        .arg(&task_id)
        .arg(&shots)
        .arg(&session_call)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(240), run)
        .await
        .expect("the browser test finishes")
        .expect("run python (scripts/test.sh installs selenium, chromium, chromium-driver)");
    if !out.status.success() {
        // The whole output goes to a file; the panic carries its last lines
        // (dashboard.py's last says which step failed), so a log that keeps
        // only its tail still tells why.
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let log = shots.join("dashboard-failure.log");
        let _ = std::fs::write(&log, format!("{stdout}\n{stderr}"));
        let lines: Vec<&str> = stderr.lines().collect();
        let tail = lines[lines.len().saturating_sub(12)..].join("\n");
        panic!(
            "dashboard.py failed ({}); all of its output is in {}; its last lines:\n{tail}",
            out.status,
            log.display()
        );
    }
    assert!(shots.join("dashboard.png").exists());

    // The session's call ran once approved from the page; the MCP call was denied.
    let (errors, _open) = tokio::time::timeout(EXPECT_WITHIN, session_turn)
        .await
        .expect("the session's turn completes")
        .expect("session task");
    assert!(errors.is_empty(), "{errors:?}");
    let denied = tokio::time::timeout(EXPECT_WITHIN, mcp)
        .await
        .expect("the MCP call is answered")
        .expect("MCP task");
    assert_eq!(
        denied["structuredContent"]["error"]["code"], "denied",
        "{denied}"
    );

    // Over REST: the approved command was applied (audited), and the stop is latched.
    let audit = rozd::cli::client::get(&addr, "/v1/audit", Some(TOKEN))
        .await
        .expect("GET /v1/audit");
    let audit: serde_json::Value = serde_json::from_str(&audit.body).expect("audit JSON");
    let rows = audit["data"].as_array().expect("audit rows");
    assert!(
        rows.iter().any(|r| r["kind"] == "tool_call"
            && r["tool"] == "drive_speed"
            && r["decision"] == "approved"
            && r["error"].is_null()),
        "{rows:#?}"
    );
    assert!(
        rows.iter().any(|r| r["kind"] == "actuator"
            && r["actuator"] == "drive_speed"
            && r["result"] == "0.3"),
        "{rows:#?}"
    );
    let decided = |id: &str| {
        rows.iter()
            .find(|r| r["kind"] == "tool_call" && r["tool_call_id"] == id)
            .map(|r| (r["decision"].clone(), r["approved_by"].clone()))
    };
    assert_eq!(
        decided(&session_call),
        Some((
            serde_json::json!("approved"),
            serde_json::json!("auth_tokens[0]")
        )),
        "{rows:#?}"
    );
    assert!(
        rows.iter().any(|r| r["kind"] == "tool_call"
            && r["tool"] == "turn_rate"
            && r["decision"] == "denied"
            && r["origin"].as_str().is_some_and(|o| o.starts_with("mcp:"))),
        "{rows:#?}"
    );
    let safety = rozd::cli::client::get(&addr, "/v1/safety", Some(TOKEN))
        .await
        .expect("GET /v1/safety");
    let safety: serde_json::Value = serde_json::from_str(&safety.body).expect("safety JSON");
    assert_eq!(safety["estop_active"], true, "{safety}");
    daemon.shutdown().await;
}

/// Reads one event (up to the blank line) from an SSE stream.
async fn next_event(lines: &mut tokio::io::Lines<BufReader<TcpStream>>) -> (String, u64, String) {
    let (mut event, mut id, mut data) = (String::new(), 0, String::new());
    loop {
        let line = tokio::time::timeout(EXPECT_WITHIN, lines.next_line())
            .await
            .expect("an event in time")
            .expect("read")
            .expect("stream open");
        if line.is_empty() {
            if !data.is_empty() {
                return (event, id, data);
            }
            continue;
        }
        if let Some(v) = line.strip_prefix("event: ") {
            event = v.to_string();
        } else if let Some(v) = line.strip_prefix("id: ") {
            id = v.parse().expect("numeric id");
        } else if let Some(v) = line.strip_prefix("data: ") {
            data = v.to_string();
        }
    }
}

/// Opens the stream over HTTP/1.0 (no chunking), after `last_id` if given.
async fn open_stream(
    daemon: &TestDaemon,
    token: Option<&str>,
    last_id: Option<u64>,
) -> (String, tokio::io::Lines<BufReader<TcpStream>>) {
    let mut stream = TcpStream::connect(daemon.addr).await.expect("connect");
    let mut request = format!(
        "GET /v1/observation/stream HTTP/1.0\r\nhost: {}\r\n",
        daemon.addr
    );
    if let Some(token) = token {
        request.push_str(&format!("authorization: Bearer {token}\r\n"));
    }
    if let Some(id) = last_id {
        request.push_str(&format!("last-event-id: {id}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut lines = BufReader::new(stream).lines();
    let mut head = String::new();
    loop {
        let line = tokio::time::timeout(EXPECT_WITHIN, lines.next_line())
            .await
            .expect("head in time")
            .expect("read")
            .unwrap_or_default();
        if line.is_empty() {
            break;
        }
        head.push_str(&line.to_ascii_lowercase());
        head.push('\n');
    }
    (head, lines)
}

#[tokio::test]
async fn the_stream_needs_a_token_and_resumes_after_the_last_event() {
    let daemon = dashboard_daemon().await;
    let (head, _) = open_stream(&daemon, None, None).await;
    assert!(
        head.starts_with("http/1.0 401") || head.starts_with("http/1.1 401"),
        "{head}"
    );

    let (head, mut lines) = open_stream(&daemon, Some(TOKEN), None).await;
    assert!(head.contains(" 200"), "{head}");
    assert!(head.contains("content-type: text/event-stream"), "{head}");
    let mut seen = std::collections::HashSet::new();
    let mut last_observation = 0;
    while !(seen.contains("observation")
        && seen.contains("status")
        && seen.contains("safety")
        && seen.contains("tasks")
        && seen.contains("hosts"))
    {
        let (event, id, data) = next_event(&mut lines).await;
        let json: serde_json::Value = serde_json::from_str(&data).expect("data is JSON");
        if event == "observation" {
            assert_eq!(json["seq"].as_u64(), Some(id), "the id is the tick");
            assert!(id > last_observation, "observations only move forward");
            last_observation = id;
        }
        if event == "status" {
            assert_eq!(json["name"], "Dashboard rover");
        }
        seen.insert(event);
    }
    drop(lines);

    // Reconnecting with Last-Event-ID: no Observation the page already had.
    let (_, mut lines) = open_stream(&daemon, Some(TOKEN), Some(last_observation)).await;
    let mut observations = 0;
    while observations < 3 {
        let (event, id, _) = next_event(&mut lines).await;
        if event == "observation" {
            assert!(id > last_observation, "{id} after {last_observation}");
            observations += 1;
        }
    }
    drop(lines);

    // The world's room for the page's map.
    let sim = rozd::cli::client::get(&daemon.addr.to_string(), "/v1/sim", Some(TOKEN))
        .await
        .expect("GET /v1/sim");
    let sim: serde_json::Value = serde_json::from_str(&sim.body).expect("sim JSON");
    assert_eq!(sim["width"], 6.0, "{sim}");
    assert_eq!(sim["range_sensor"], "front_distance");
    assert!(sim["rover"]["x"].is_number());
    daemon.shutdown().await;
}

/// The Observation says since when a sensor is at its alarm level and
/// which limit it crossed (what the page's banner shows).
#[tokio::test]
async fn a_critical_alarm_says_which_limit_it_crossed_and_since_when() {
    let daemon = dashboard_daemon().await;
    let addr = daemon.addr.to_string();
    let deadline = tokio::time::Instant::now() + EXPECT_WITHIN;
    let coolant = loop {
        let reply = rozd::cli::client::get(&addr, "/v1/observation", Some(TOKEN))
            .await
            .expect("GET /v1/observation");
        let observation: serde_json::Value =
            serde_json::from_str(&reply.body).expect("observation JSON");
        let coolant = observation["sensors"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["name"] == "coolant_temp"))
            .cloned()
            .expect("coolant_temp is observed");
        if coolant["alarm"] == "critical" {
            assert!(
                coolant["alarm_since_unix_ms"]
                    .as_i64()
                    .is_some_and(|since| since <= observation["at_unix_ms"].as_i64().unwrap()),
                "{coolant}"
            );
            break coolant;
        }
        assert!(tokio::time::Instant::now() < deadline, "{coolant}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        coolant["alarm_limit"],
        serde_json::json!({"limit": "critical_max", "value": 85.0}),
        "{coolant}"
    );
    // A sensor at `ok` carries neither.
    let reply = rozd::cli::client::get(&addr, "/v1/observation", Some(TOKEN))
        .await
        .expect("GET /v1/observation");
    let observation: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    let battery = observation["sensors"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "battery_voltage"))
        .cloned()
        .unwrap();
    assert_eq!(battery["alarm"], "ok", "{battery}");
    assert!(
        battery.get("alarm_since_unix_ms").is_none() && battery.get("alarm_limit").is_none(),
        "{battery}"
    );
    daemon.shutdown().await;
}

/// `GET /v1/rules`: each rule's condition and action, its phase, how often
/// it fired, when last and what that did.
#[tokio::test]
async fn rules_show_their_condition_state_and_what_their_last_firing_did() {
    let daemon = dashboard_daemon().await;
    let addr = daemon.addr.to_string();
    let rules = |body: &str| -> Vec<serde_json::Value> {
        let v: serde_json::Value = serde_json::from_str(body).expect("rules JSON");
        v["data"].as_array().cloned().expect("data")
    };
    let listed = rozd::cli::client::get(&addr, "/v1/rules", Some(TOKEN))
        .await
        .expect("GET /v1/rules");
    assert_eq!(listed.status, 200, "{}", listed.body);
    let listed = rules(&listed.body);
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!(
        listed[1],
        serde_json::json!({
            "name": "stop_before_obstacle",
            "when": "front_distance < 0.3 and drive_speed > 0",
            "for_ms": 100,
            "cooldown_ms": 0,
            "then": "set drive_speed to 0",
            "phase": "armed",
            "fired": 0,
            "last_fired_unix_ms": null,
            "last_result": null,
        })
    );
    let before = rozd::clock::now_ms();
    daemon
        .host
        .ooda()
        .actuators()
        .command(
            "turn_rate",
            10.0,
            rozd::ooda::act::Origin::Operator("test".into()),
            None,
        )
        .await
        .expect("turn_rate accepts 10");
    let deadline = tokio::time::Instant::now() + EXPECT_WITHIN;
    let fired = loop {
        let reply = rozd::cli::client::get(&addr, "/v1/rules", Some(TOKEN))
            .await
            .expect("GET /v1/rules");
        let rule = rules(&reply.body)[0].clone();
        if rule["last_result"].is_string() && rule["phase"] == "armed" {
            break rule;
        }
        assert!(tokio::time::Instant::now() < deadline, "{rule}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        (&fired["name"], &fired["fired"], &fired["last_result"]),
        (
            &serde_json::json!("no_turning_hot"),
            &serde_json::json!(1),
            &serde_json::json!("turn_rate set to 0")
        ),
        "{fired}"
    );
    assert!(
        fired["last_fired_unix_ms"]
            .as_i64()
            .is_some_and(|t| t >= before),
        "{fired}"
    );
    assert_eq!(daemon.host.ooda().actuators().value("turn_rate"), Some(0.0));
    daemon.shutdown().await;
}

/// A sensor's trend reaches back further than its last 128 samples (what
/// the page's plots start with), and each actuator's range is listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sensors_trend_reaches_back_beyond_its_samples_and_actuators_list_their_range() {
    let daemon = dashboard_daemon().await;
    let addr = daemon.addr.to_string();
    let actuators = rozd::cli::client::get(&addr, "/v1/actuators", Some(TOKEN))
        .await
        .expect("GET /v1/actuators");
    assert_eq!(actuators.status, 200, "{}", actuators.body);
    let actuators: serde_json::Value = serde_json::from_str(&actuators.body).unwrap();
    assert_eq!(
        (
            &actuators["data"][0]["name"],
            &actuators["data"][0]["min"],
            &actuators["data"][0]["max"],
            &actuators["data"][0]["hold_ms"]
        ),
        (
            &serde_json::json!("drive_speed"),
            &serde_json::json!(-0.5),
            &serde_json::json!(0.5),
            &serde_json::json!(20000)
        ),
        "{actuators}"
    );
    // wave reports at 20 Hz: its 128 samples cover 6.4 s; the trend keeps
    // every half second's extremes for 3 minutes.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let reply = rozd::cli::client::get(&addr, "/v1/sensors/wave", Some(TOKEN))
            .await
            .expect("GET /v1/sensors/wave");
        let wave: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        let oldest_sample = wave["history"][0]["age_ms"].as_u64().unwrap_or(0);
        let trend = wave["trend"].as_array().cloned().unwrap_or_default();
        let oldest_trend = trend
            .first()
            .and_then(|p| p["age_ms"].as_u64())
            .unwrap_or(0);
        if wave["history"].as_array().map_or(0, Vec::len) == 128
            && oldest_trend > oldest_sample + 1000
        {
            assert!(
                trend.iter().all(|p| p["min"].as_f64() <= p["max"].as_f64()),
                "{trend:?}"
            );
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{wave}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    daemon.shutdown().await;
}

#[tokio::test]
async fn the_page_needs_no_token_and_is_never_framed() {
    let daemon = dashboard_daemon().await;
    let addr = daemon.addr.to_string();
    for path in [
        "/ui",
        "/ui/app.js",
        "/ui/uPlot.iife.min.js",
        "/ui/uPlot.LICENSE",
    ] {
        let reply = rozd::cli::client::get(&addr, path, None)
            .await
            .expect("GET");
        assert_eq!(reply.status, 200, "{path}");
    }
    let page = rozd::cli::client::get(&addr, "/ui", None)
        .await
        .expect("GET /ui");
    assert!(page.body.contains("id=\"stop-button\""));
    // Data still needs the token; an unknown file under /ui is not public.
    for path in ["/v1/status", "/v1/sim", "/ui/other"] {
        let reply = rozd::cli::client::get(&addr, path, None)
            .await
            .expect("GET");
        assert_eq!(reply.status, 401, "{path}");
    }
    let mut stream = TcpStream::connect(daemon.addr).await.expect("connect");
    stream
        .write_all(format!("GET /ui HTTP/1.0\r\nhost: {}\r\n\r\n", daemon.addr).as_bytes())
        .await
        .expect("send");
    let mut answer = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut stream, &mut answer)
        .await
        .expect("read");
    let head = answer.to_ascii_lowercase();
    assert!(head.contains("x-frame-options: deny"), "{head}");
    assert!(head.contains("frame-ancestors 'none'"), "{head}");
    daemon.shutdown().await;
}

/// A rover whose drive is stuck: a rule commands 0.3 at start, the wheels
/// never turn, and drive_speed's feedback raises its mismatch alarm.
const STUCK: &str = r#"
[host]
name = "Stuck rover"

[sim]
seed = 1

[sim.faults]
stuck_drive = true

[[sensors]]
name = "wheel_speed"
source = "sim"
quantity = "wheel_speed"
unit = "m/s"
stale_after_ms = 1000

[[sensors]]
name = "bumper"
source = "sim"
quantity = "bumper"

[[actuators]]
name = "drive_speed"
kind = "sim"
input = "drive_speed"
unit = "m/s"
min = -0.5
max = 0.5
safe_value = 0.0
feedback = { sensor = "wheel_speed", tolerance = 0.02, settle_ms = 300 }

[[actuators]]
name = "turn_rate"
kind = "sim"
input = "turn_rate"
unit = "deg/s"
min = -90.0
max = 90.0
safe_value = 0.0

[[rules]]
name = "go"
when = "bumper < 0.5"
then = { actuator = "drive_speed", value = 0.3 }
"#;

/// A serial motor whose MCU never answers: its start-up safe drive is not
/// confirmed (`no reply within 200 ms`).
fn silent_motor(port: &std::path::Path) -> String {
    format!(
        "\n[[serial]]\nname = \"mcu\"\npath = {:?}\n\n[[actuators]]\nname = \"motor\"\n\
         kind = \"serial\"\nport = \"mcu\"\ntemplate = \"M {{value}}\\n\"\nexpect = '^OK\\b'\n\
         reply_timeout_ms = 200\nmin = 0.0\nmax = 1.0\nsafe_value = 0.0\n",
        port.display().to_string()
    )
}

/// Issue 34: a feedback mismatch is an alarm of the actuator on the
/// dashboard (the critical banner, the tab's title, its row), and goes
/// when the hardware does what it was told again. Issue 35 item 7: so is a
/// safe value the device never confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_shows_a_feedback_mismatch_as_the_actuators_alarm() {
    let dir = tempfile::tempdir().unwrap();
    let pty = common::pty::PtyPair::start(dir.path()).await;
    // The MCU's end is open, and never answers.
    let _mcu = pty.device();
    let daemon = TestDaemon::setup(&format!("{STUCK}{}", silent_motor(&pty.a)))
        .server(&format!("auth_tokens = [{TOKEN:?}]"))
        .start()
        .await;
    common::observed(
        daemon.host.ooda(),
        EXPECT_WITHIN,
        "drive_speed's mismatch alarm and motor's unconfirmed safe value",
        |o| {
            o.actuators
                .iter()
                .any(|a| a.feedback.as_ref().is_some_and(|f| f.mismatch))
                && o.actuators
                    .iter()
                    .any(|a| a.name == "motor" && a.safe_unconfirmed.is_some())
        },
    )
    .await;
    let shots = target_dir();
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/dashboard_feedback.py");
    let run = tokio::process::Command::new(python())
        .arg(&script)
        .arg(daemon.url())
        .arg(TOKEN)
        .arg(&shots)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(180), run)
        .await
        .expect("the browser test finishes")
        .expect("run python (scripts/test.sh installs selenium, chromium, chromium-driver)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        // The script's last word says which step failed and why; the
        // browser's stack traces before it go to a file.
        let log = shots.join("dashboard-mismatch-failure.log");
        let _ = std::fs::write(&log, format!("{stdout}\n{stderr}"));
        let why: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("FAILED at"))
            .collect();
        panic!(
            "dashboard_feedback.py failed ({}); all of its output is in {}:\n{stdout}\n{}",
            out.status,
            log.display(),
            why.join("\n")
        );
    }
    assert!(shots.join("dashboard-mismatch.png").exists());
    // What the page showed last is what rozd says: confirmed, no alarm.
    let observation = daemon.host.ooda().observe_now();
    let drive = observation
        .actuators
        .iter()
        .find(|a| a.name == "drive_speed")
        .and_then(|a| a.feedback.clone())
        .expect("drive_speed has feedback");
    assert!(!drive.mismatch, "{drive:?}");
    daemon.shutdown().await;
}
