//! Did it really move? (issue 34) Commanded versus measured, black-box: the
//! built-in rover (its `drive_speed` has feedback from the world's measured
//! `wheel_speed`) and an MQTT valve whose position a device reports through
//! a real mosquitto; commands from a real gRPC session (the offline command
//! model reads the tool's result), the verdicts read back over REST
//! (`/v1/observation`, `/v1/audit`, `/metrics`, `/v1/safety`) and from the
//! recording (PyPI `mcap`, every message checked against its schema).
//! Real clock; waits are on the loop's own publish signal, bounded.

use std::path::Path;

use crate::common::{self, EXPECT_WITHIN, Session, TestDaemon};
use rozd::api::proto;
use rozd::api::proto::session_request::Request as Req;
use rozd::api::proto::session_response::Response as Resp;
use rozd::config::{BUILTIN_CONFIG, Config, ConfigSource};
use rozd::ooda::Observation;
use serde_json::{Value, json};

const ALLOW: &str = "\n[[permissions]]\ntool_pattern = \"*\"\npolicy = \"allow\"\n";

/// The built-in rover on an ephemeral port with a store of its own: its
/// text `edit`ed, `extra` appended.
async fn rover(edit: impl FnOnce(&str) -> String, extra: &str) -> TestDaemon {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "{}\n{ALLOW}\n{extra}\n[store]\npath = {:?}\n",
        edit(BUILTIN_CONFIG).replace(
            "listen = \"127.0.0.1:8080\"",
            "listen = \"127.0.0.1:0\"\nhttp2_keepalive_secs = 0"
        ),
        dir.path().join("rozd.db").display().to_string()
    );
    let config =
        Config::parse(&text, ConfigSource::BuiltIn).unwrap_or_else(|e| panic!("{e}\n{text}"));
    TestDaemon::start_with(config, dir).await
}

fn without_rules(text: &str) -> String {
    let cut = text.find("[[rules]]").expect("the built-in rule");
    text[..cut].to_string()
}

fn on_mismatch(what: &'static str) -> impl FnOnce(&str) -> String {
    move |text: &str| {
        assert!(text.contains("on_mismatch = \"safe\""));
        text.replace(
            "on_mismatch = \"safe\"",
            &format!("on_mismatch = \"{what}\""),
        )
    }
}

async fn session(daemon: &TestDaemon) -> Session {
    let mut client = daemon.agent().await;
    let mut session = Session::open(&mut client).await;
    session.start(proto::StartSession::default()).await;
    session
}

/// One turn of the offline command model: the text it answered.
async fn turn(session: &mut Session, prompt: &str) -> String {
    session
        .send(Req::UserMessage(proto::UserMessage {
            content: prompt.into(),
            ..Default::default()
        }))
        .await;
    let mut text = String::new();
    loop {
        match session.next().await {
            Resp::TextDelta(d) => text.push_str(&d.content),
            Resp::TurnComplete(_) => return text,
            _ => {}
        }
    }
}

/// What the model read as `tool`'s result (the answer's line
/// `<tool> returned: <json>`).
fn returned(text: &str, tool: &str) -> Value {
    let marker = format!("{tool} returned: ");
    let at = text
        .find(&marker)
        .unwrap_or_else(|| panic!("no result of {tool} in: {text}"));
    let line = text[at + marker.len()..].lines().next().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

async fn until(daemon: &TestDaemon, what: &str, pred: impl Fn(&Observation) -> bool) {
    common::observed(daemon.host.ooda(), EXPECT_WITHIN, what, pred).await;
}

/// Polls `GET path` once per published Observation until `pred` holds of
/// its body (bounded): for what is written behind a queue, like the audit.
async fn rest_until(daemon: &TestDaemon, path: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let mut ticks = daemon.host.ooda().subscribe();
    let mut last = Value::Null;
    let reached = tokio::time::timeout(EXPECT_WITHIN, async {
        loop {
            let (status, body) = common::rest_get(daemon, path).await;
            assert_eq!(status, 200, "{path}: {body}");
            if pred(&body) {
                return body;
            }
            last = body;
            ticks.changed().await.expect("the loop runs");
        }
    })
    .await;
    reached.unwrap_or_else(|_| panic!("GET {path} never showed what was expected; last: {last:#}"))
}

fn actuator<'a>(observation: &'a Value, name: &str) -> &'a Value {
    observation["actuators"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["name"] == name))
        .unwrap_or_else(|| panic!("no actuator {name} in {observation}"))
}

fn rows<'a>(audit: &'a Value, kind: &str) -> Vec<&'a Value> {
    audit["data"]
        .as_array()
        .map(|rows| rows.iter().filter(|r| r["kind"] == kind).collect())
        .unwrap_or_default()
}

/// The audit's `feedback` rows of `actuator` with status `status`.
fn verdicts<'a>(audit: &'a Value, actuator: &str, status: &str) -> Vec<&'a Value> {
    rows(audit, "feedback")
        .into_iter()
        .filter(|r| r["actuator"] == actuator && r["result"] == status)
        .collect()
}

async fn metrics(daemon: &TestDaemon) -> String {
    let reply = rozd::cli::client::get(&daemon.addr.to_string(), "/metrics", None)
        .await
        .expect("GET /metrics");
    assert_eq!(reply.status.as_u16(), 200);
    reply.body
}

/// The value of the metric line that starts with `series`.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

fn record_section(dir: &Path) -> String {
    format!(
        "[record]\ndirectory = {:?}\nflush_ms = 20\n",
        dir.display().to_string()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_the_wheels_carry_out_is_confirmed_with_the_measured_speed_everywhere() {
    let recordings = tempfile::tempdir().unwrap();
    let daemon = rover(str::to_string, &record_section(recordings.path())).await;
    let mut session = session(&daemon).await;
    let text = turn(&mut session, "set drive_speed 0.2").await;
    let result = returned(&text, "drive_speed");
    assert_eq!(result["status"], "confirmed", "{result}");
    assert_eq!(result["commanded"], 0.2, "{result}");
    let measured = result["measured"].as_f64().expect("a measured speed");
    assert!((measured - 0.2).abs() <= 0.02, "{result}");
    let settled = result["settled_ms"].as_u64().expect("settled_ms");
    assert!(settled <= 500, "{result}");
    assert_eq!(
        result["value"], 0.2,
        "the fields of before are kept: {result}"
    );

    // The Observation says the same.
    let (_, observation) = common::rest_get(&daemon, "/v1/observation").await;
    let drive = actuator(&observation, "drive_speed");
    assert_eq!(drive["feedback_status"], "confirmed", "{drive}");
    assert_eq!(drive["feedback_sensor"], "wheel_speed", "{drive}");
    assert_eq!(drive["mismatch"], false, "{drive}");
    assert!(
        (drive["measured"].as_f64().unwrap() - 0.2).abs() <= 0.02,
        "{drive}"
    );
    // An actuator without feedback shows none of it.
    assert!(
        actuator(&observation, "gripper")
            .get("feedback_status")
            .is_none()
    );

    // The audit: the verdict as a row of its own, and in the call's result.
    let audit = rest_until(&daemon, "/v1/audit?limit=1000", |a| {
        verdicts(a, "drive_speed", "confirmed")
            .iter()
            .any(|r| r["parameters"]["commanded"] == 0.2)
    })
    .await;
    let row = verdicts(&audit, "drive_speed", "confirmed")
        .into_iter()
        .find(|r| r["parameters"]["commanded"] == 0.2)
        .unwrap();
    assert!(
        row["origin"].as_str().unwrap().starts_with("session "),
        "{row}"
    );
    assert_eq!(row["parameters"]["stage"], "command", "{row}");
    let call = rows(&audit, "tool_call")
        .into_iter()
        .find(|r| r["tool"] == "drive_speed")
        .expect("the tool call's row");
    let call_result: Value = serde_json::from_str(call["result"].as_str().unwrap()).unwrap();
    assert_eq!(call_result["status"], "confirmed", "{call}");

    // The metrics count it.
    let text = metrics(&daemon).await;
    assert!(
        metric(
            &text,
            "rozd_actuator_feedback_verdicts_total{actuator=\"drive_speed\",status=\"confirmed\"}"
        )
        .is_some_and(|n| n >= 1.0),
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "rozd_actuator_feedback_mismatch{actuator=\"drive_speed\"}"
        ),
        Some(0.0)
    );

    // The recording carries it on the actuator's channel.
    drop(session);
    daemon.shutdown().await;
    let files = crate::record::files_in(recordings.path());
    let file = crate::record::dump(files.last().expect("a recording"));
    let verdicts: Vec<&Value> = crate::record::on(&file, "/actuators/drive_speed")
        .into_iter()
        .filter(|m| m["kind"] == "verdict")
        .collect();
    assert!(
        verdicts
            .iter()
            .any(|v| v["status"] == "confirmed" && v["value"] == 0.2),
        "{verdicts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_its_feedback_sensor_silent_a_command_is_unconfirmed_and_nothing_follows() {
    // Feedback from a sensor that reports once a minute and is stale after
    // 200 ms: no fresh value can come within settle_ms.
    let silent = |text: &str| {
        text.replace("sensor = \"wheel_speed\"", "sensor = \"reported_speed\"")
            + "\n[[sensors]]\nname = \"reported_speed\"\nsource = \"sim\"\nunit = \"m/s\"\n\
               signal = \"constant\"\nrate_hz = 0.0166\nstale_after_ms = 200\n"
    };
    let daemon = rover(silent, "").await;
    let mut session = session(&daemon).await;
    let text = turn(&mut session, "set drive_speed 0.2").await;
    let result = returned(&text, "drive_speed");
    assert_eq!(result["status"], "unconfirmed", "{result}");
    assert!(
        result["reason"].as_str().unwrap().contains("no fresh"),
        "{result}"
    );
    let (_, observation) = common::rest_get(&daemon, "/v1/observation").await;
    let drive = actuator(&observation, "drive_speed");
    assert_eq!(drive["feedback_status"], "unconfirmed", "{drive}");
    // Nothing is known either way: no alarm, no safe drive.
    assert_eq!(drive["mismatch"], false, "{drive}");
    assert_eq!(drive["value"], 0.2, "{drive}");
    drop(session);
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_drive_is_a_mismatch_that_raises_the_alarm_the_rules_see() {
    let rule = "[[rules]]\nname = \"drive_stalled\"\nwhen = \"drive_speed.mismatch == 1\"\n\
                then = { actuator = \"gripper\", value = 1.0 }\n";
    let daemon = rover(
        |t| on_mismatch("alarm")(t),
        &format!("{rule}\n[sim.faults]\nstuck_drive = true\n"),
    )
    .await;
    let mut session = session(&daemon).await;
    let text = turn(&mut session, "set drive_speed 0.3").await;
    let result = returned(&text, "drive_speed");
    assert_eq!(result["status"], "mismatch", "{result}");
    assert_eq!(result["measured"], 0.0, "{result}");
    assert!(result["settled_ms"].as_u64().unwrap() >= 500, "{result}");
    // The alarm: in the Observation, and a rule acting on it.
    until(&daemon, "the rule on drive_speed.mismatch fired", |o| {
        o.actuators
            .iter()
            .any(|a| a.name == "gripper" && a.value == 1.0)
    })
    .await;
    let (_, observation) = common::rest_get(&daemon, "/v1/observation").await;
    let drive = actuator(&observation, "drive_speed");
    assert_eq!(drive["feedback_status"], "mismatch", "{drive}");
    assert_eq!(drive["mismatch"], true, "{drive}");
    assert_eq!(
        drive["value"], 0.3,
        "on_mismatch = alarm moves nothing: {drive}"
    );
    assert_eq!(
        actuator(&observation, "gripper")["owner"],
        "rule drive_stalled"
    );
    assert_eq!(
        metric(
            &metrics(&daemon).await,
            "rozd_actuator_feedback_mismatch{actuator=\"drive_speed\"}"
        ),
        Some(1.0)
    );
    let audit = rest_until(&daemon, "/v1/audit?limit=1000", |a| {
        !verdicts(a, "drive_speed", "mismatch").is_empty()
    })
    .await;
    let row = verdicts(&audit, "drive_speed", "mismatch")[0];
    assert!(
        row["error"]
            .as_str()
            .unwrap()
            .starts_with("measured 0 where 0.3"),
        "{row}"
    );
    assert_eq!(row["parameters"]["alarm"], true, "{row}");
    assert_eq!(row["parameters"]["action"], Value::Null, "{row}");

    // The drive freed (at run time): a confirmed command clears the alarm.
    let (status, body) =
        common::rest_post(&daemon, "/v1/sim/faults", &json!({"stuck_drive": false})).await;
    assert_eq!(
        (status, &body["faults"]["stuck_drive"]),
        (200, &json!(false))
    );
    let text = turn(&mut session, "set drive_speed 0.2").await;
    assert_eq!(
        returned(&text, "drive_speed")["status"],
        "confirmed",
        "{text}"
    );
    let (_, observation) = common::rest_get(&daemon, "/v1/observation").await;
    assert_eq!(actuator(&observation, "drive_speed")["mismatch"], false);
    drop(session);
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_mismatch_safe_drives_the_stuck_drive_to_its_safe_value() {
    let daemon = rover(str::to_string, "").await;
    // Faults set at run time, checked first.
    for bad in [json!({"drive_slip": 2}), json!({"stuck": true}), json!([1])] {
        let (status, body) = common::rest_post(&daemon, "/v1/sim/faults", &bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert_eq!(body["error"]["code"], "invalid_argument", "{body}");
    }
    let (status, _) =
        common::rest_post(&daemon, "/v1/sim/faults", &json!({"stuck_drive": true})).await;
    assert_eq!(status, 200);
    let mut session = session(&daemon).await;
    let text = turn(&mut session, "set drive_speed 0.3").await;
    assert_eq!(
        returned(&text, "drive_speed")["status"],
        "mismatch",
        "{text}"
    );
    until(&daemon, "drive_speed driven safe", |o| {
        o.actuators
            .iter()
            .any(|a| a.name == "drive_speed" && a.at_safe_value)
    })
    .await;
    let audit = rest_until(&daemon, "/v1/audit?limit=1000", |a| {
        rows(a, "actuator").iter().any(|r| {
            r["origin"].as_str().is_some_and(|o| {
                o.starts_with("safety (feedback mismatch: drive_speed commanded 0.3")
            })
        })
    })
    .await;
    let row = verdicts(&audit, "drive_speed", "mismatch")[0];
    assert_eq!(row["parameters"]["action"], "safe", "{row}");
    let (_, safety) = common::rest_get(&daemon, "/v1/safety").await;
    assert_eq!(safety["estop_active"], false, "{safety}");
    // The rover never moved; its alarm stays up though it is safe now
    // (rozd's own safe drive, confirmed at 0, clears nothing).
    let (_, observation) = common::rest_get(&daemon, "/v1/observation").await;
    assert_eq!(observation["sim"]["x"], 1.0, "{observation}");
    assert_eq!(actuator(&observation, "drive_speed")["mismatch"], true);
    drop(session);
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_mismatch_stop_latches_the_protective_stop_and_the_call_fails_with_e_stop() {
    let daemon = rover(
        |t| on_mismatch("stop")(t),
        "[sim.faults]\nstuck_drive = true\n",
    )
    .await;
    let mut session = session(&daemon).await;
    let text = turn(&mut session, "set drive_speed 0.3").await;
    assert!(text.contains("drive_speed failed: "), "{text}");
    assert!(
        text.contains("feedback:drive_speed: feedback mismatch: drive_speed commanded 0.3"),
        "{text}"
    );
    let (_, safety) = common::rest_get(&daemon, "/v1/safety").await;
    assert_eq!(safety["estop_active"], true, "{safety}");
    assert!(
        safety["causes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["source"] == "feedback:drive_speed"),
        "{safety}"
    );
    until(&daemon, "every actuator safe", |o| {
        o.actuators.iter().all(|a| a.at_safe_value)
    })
    .await;
    let audit = rest_until(&daemon, "/v1/audit?limit=1000", |a| {
        rows(a, "protective_stop")
            .iter()
            .any(|r| r["origin"] == "feedback:drive_speed")
            && !verdicts(a, "drive_speed", "mismatch").is_empty()
    })
    .await;
    assert_eq!(
        verdicts(&audit, "drive_speed", "mismatch")[0]["parameters"]["action"],
        "stop"
    );
    // Later commands are refused until an operator clears the stop.
    let text = turn(&mut session, "set drive_speed 0.1").await;
    assert!(text.contains("drive_speed failed: "), "{text}");
    drop(session);
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_speed_is_held_the_wall_stalling_the_rover_is_caught_and_it_goes_safe() {
    // Half a metre from the wall, no rule to stop it: the command is
    // confirmed, then the wall stalls it while the value is still held.
    let near_the_wall = |text: &str| {
        without_rules(text).replace("[sim]\n", "[sim]\nstart = { x = 5.3, y = 2.0 }\n")
    };
    let daemon = rover(near_the_wall, "").await;
    let mut session = session(&daemon).await;
    let text = turn(&mut session, "set drive_speed 0.5").await;
    assert_eq!(
        returned(&text, "drive_speed")["status"],
        "confirmed",
        "{text}"
    );
    until(&daemon, "the stalled drive driven safe", |o| {
        o.actuators
            .iter()
            .any(|a| a.name == "drive_speed" && a.at_safe_value)
    })
    .await;
    let audit = rest_until(&daemon, "/v1/audit?limit=1000", |a| {
        !verdicts(a, "drive_speed", "mismatch").is_empty()
    })
    .await;
    let row = verdicts(&audit, "drive_speed", "mismatch")[0];
    assert_eq!(row["parameters"]["stage"], "hold", "{row}");
    assert_eq!(row["parameters"]["commanded"], 0.5, "{row}");
    assert_eq!(row["parameters"]["measured"], 0.0, "{row}");
    let (_, observation) = common::rest_get(&daemon, "/v1/observation").await;
    assert_eq!(observation["sim"]["bumper"], true, "{observation}");
    drop(session);
    daemon.shutdown().await;
}

/// The incident behind issue 34: a speed sensor that echoes the command
/// confirms every command. The built-in drive_speed cross-checks odometry:
/// once the wheels stop (a stuck drive) while the echo still reads 0.3, the
/// held value is a mismatch and, per on_mismatch = "safe", driven safe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_echoing_wheel_speed_is_caught_by_the_cross_check_once_the_rover_stops_moving() {
    let daemon = rover(str::to_string, "[sim.faults]\necho_wheel_speed = true\n").await;
    let mut session = session(&daemon).await;
    let text = turn(&mut session, "set drive_speed 0.3").await;
    let result = returned(&text, "drive_speed");
    // The rover moves; the echo confirms, as it would anyway.
    assert_eq!(result["status"], "confirmed", "{result}");
    let (status, body) = common::rest_post(
        &daemon,
        "/v1/sim/faults",
        &json!({"echo_wheel_speed": true, "stuck_drive": true}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let audit = rest_until(&daemon, "/v1/audit?limit=1000", |a| {
        !verdicts(a, "drive_speed", "mismatch").is_empty()
    })
    .await;
    let row = verdicts(&audit, "drive_speed", "mismatch")[0];
    let p = &row["parameters"];
    assert_eq!(p["stage"], "hold", "{row}");
    assert_eq!(p["commanded"], 0.3, "{row}");
    assert_eq!(
        p["measured"], 0.3,
        "the echo agreed with the command: {row}"
    );
    assert!(
        p["reason"].as_str().unwrap().contains("cross-check"),
        "{row}"
    );
    assert_eq!(p["cross_check"]["expected_rate"], 0.3, "{row}");
    assert!(
        p["cross_check"]["sensor_rate"].as_f64().unwrap() < 0.25,
        "odometry stopped growing: {row}"
    );
    assert_eq!(p["action"], "safe", "{row}");
    until(&daemon, "the stuck drive driven safe", |o| {
        o.actuators
            .iter()
            .any(|a| a.name == "drive_speed" && a.value == 0.0)
    })
    .await;
    let (_, observation) = common::rest_get(&daemon, "/v1/observation").await;
    assert_eq!(
        actuator(&observation, "drive_speed")["mismatch"],
        true,
        "driven safe, still alarmed"
    );
    drop(session);
    daemon.shutdown().await;
}

/// A valve driven over MQTT whose position a device reports on its own
/// topic, through a real mosquitto.
fn valve(port: u16) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
http2_keepalive_secs = 0

[mqtt]
url = "mqtt://127.0.0.1:{port}"

[[sensors]]
name = "valve_position"
source = "mqtt"
topic = "plant/valve/position"
stale_after_ms = 5000

[[actuators]]
name = "valve"
kind = "mqtt"
topic = "plant/valve/set"
allowed = [0, 1]
safe_value = 0
feedback = {{ sensor = "valve_position", tolerance = 0.1, settle_ms = 400 }}
{ALLOW}"#
    )
}

/// The device: answers every command on `plant/valve/set` with a position
/// on `plant/valve/position`: the commanded one, or `stuck_at`.
async fn device(port: u16, id: &str, stuck_at: Option<f64>) -> tokio::task::JoinHandle<()> {
    let opts = rumqttc::MqttOptions::new(id, "127.0.0.1", port);
    let (client, mut events) = rumqttc::AsyncClient::new(opts, 10);
    client
        .subscribe("plant/valve/set", rumqttc::QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    tokio::time::timeout(EXPECT_WITHIN, async {
        loop {
            if let rumqttc::Event::Incoming(rumqttc::Packet::SubAck(_)) =
                events.poll().await.expect("broker")
            {
                return;
            }
        }
    })
    .await
    .expect("subscribed in time");
    tokio::spawn(async move {
        while let Ok(event) = events.poll().await {
            if let rumqttc::Event::Incoming(rumqttc::Packet::Publish(p)) = event {
                let commanded = String::from_utf8_lossy(&p.payload).to_string();
                let position = stuck_at.map_or(commanded, |s| s.to_string());
                let _ = client
                    .publish(
                        "plant/valve/position",
                        rumqttc::QoS::AtLeastOnce,
                        false,
                        position,
                    )
                    .await;
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mqtt_valve_is_confirmed_when_its_device_follows_and_a_mismatch_when_it_never_does() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::broker::Broker::start(dir.path()).await;
    let store = dir.path().join("rozd.db");
    let text = format!(
        "{}\n[store]\npath = {:?}\n",
        valve(broker.port),
        store.display().to_string()
    );
    let config = Config::parse(&text, ConfigSource::BuiltIn).unwrap_or_else(|e| panic!("{e}"));
    let daemon = TestDaemon::start_with(config, tempfile::tempdir().unwrap()).await;
    let mut session = session(&daemon).await;
    // No device at all: nothing comes back.
    let text = turn(&mut session, "set valve 1").await;
    assert_eq!(returned(&text, "valve")["status"], "unconfirmed", "{text}");
    assert_eq!(returned(&text, "valve")["measured"], Value::Null, "{text}");
    // A device that follows.
    let follows = device(broker.port, "valve-device", None).await;
    let text = turn(&mut session, "set valve 0").await;
    let result = returned(&text, "valve");
    assert_eq!(
        (&result["status"], &result["measured"]),
        (&json!("confirmed"), &json!(0.0)),
        "{result}"
    );
    let text = turn(&mut session, "set valve 1").await;
    assert_eq!(returned(&text, "valve")["status"], "confirmed", "{text}");
    follows.abort();
    // A jammed one: it reports, but the valve never leaves 1.
    let jammed = device(broker.port, "jammed-valve-device", Some(1.0)).await;
    let text = turn(&mut session, "set valve 0").await;
    let result = returned(&text, "valve");
    assert_eq!(
        (&result["status"], &result["measured"]),
        (&json!("mismatch"), &json!(1.0)),
        "{result}"
    );
    let (_, observation) = common::rest_get(&daemon, "/v1/observation").await;
    assert_eq!(actuator(&observation, "valve")["mismatch"], true);
    jammed.abort();
    drop(session);
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serial_mcu_that_reports_its_speed_confirms_the_duty_cycle_it_was_given() {
    let dir = tempfile::tempdir().unwrap();
    let pty = common::pty::PtyPair::start(dir.path()).await;
    // The MCU: `M <duty>` sets the motor; it reports `rpm=<duty * 3000>`.
    let mut mcu = pty.device();
    tokio::spawn(async move {
        loop {
            let line = mcu.line().await;
            if let Some(duty) = line.strip_prefix("M ").and_then(|d| d.parse::<f64>().ok()) {
                mcu.send(format!("rpm={}\n", duty * 3000.0)).await;
            }
        }
    });
    let text = format!(
        r#"
[server]
listen = "127.0.0.1:0"
http2_keepalive_secs = 0

[store]
path = {:?}

[[serial]]
name = "mcu"
path = {:?}

[[sensors]]
name = "motor_speed"
source = "serial"
port = "mcu"
parser = "kv"
key = "rpm"
unit = "rpm"
stale_after_ms = 5000

[[actuators]]
name = "motor"
kind = "serial"
port = "mcu"
template = "M {{value}}\n"
unit = "duty"
min = 0.0
max = 1.0
safe_value = 0.0
feedback = {{ sensor = "motor_speed", tolerance = 50, settle_ms = 400, scale = 3000 }}
{ALLOW}"#,
        dir.path().join("rozd.db").display().to_string(),
        pty.a.display().to_string()
    );
    let config = Config::parse(&text, ConfigSource::BuiltIn).unwrap_or_else(|e| panic!("{e}"));
    let daemon = TestDaemon::start_with(config, tempfile::tempdir().unwrap()).await;
    let mut session = session(&daemon).await;
    let text = turn(&mut session, "set motor 0.5").await;
    let result = returned(&text, "motor");
    assert_eq!(result["status"], "confirmed", "{result}");
    assert_eq!(
        (&result["expected"], &result["measured"]),
        (&json!(1500.0), &json!(1500.0)),
        "{result}"
    );
    drop(session);
    daemon.shutdown().await;
}

/// Issue 35 item 7: an MCU that never answers leaves the start-up safe
/// drive unconfirmed (`no reply within 200 ms`); the Observation must not
/// call the actuator safe, and says why. A later command the device
/// answers ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_up_safe_drive_the_mcu_never_answered_is_not_reported_at_safe_value() {
    let dir = tempfile::tempdir().unwrap();
    let pty = common::pty::PtyPair::start(dir.path()).await;
    // The MCU is there (the port opens) but answers nothing yet.
    let mut mcu = pty.device();
    let text = format!(
        r#"
[server]
listen = "127.0.0.1:0"
http2_keepalive_secs = 0

[store]
path = {:?}

[[serial]]
name = "mcu"
path = {:?}

[[actuators]]
name = "motor"
kind = "serial"
port = "mcu"
template = "M {{value}}\n"
expect = '^OK\b'
reply_timeout_ms = 200
min = 0.0
max = 1.0
safe_value = 0.0
{ALLOW}"#,
        dir.path().join("rozd.db").display().to_string(),
        pty.a.display().to_string()
    );
    let config = Config::parse(&text, ConfigSource::BuiltIn).unwrap_or_else(|e| panic!("{e}"));
    let daemon = TestDaemon::start_with(config, tempfile::tempdir().unwrap()).await;
    // rozd drove the safe value at start-up; nobody answered.
    assert_eq!(mcu.line().await, "M 0");
    let observation = rest_until(&daemon, "/v1/observation", |o| {
        actuator(o, "motor").get("safe_unconfirmed").is_some()
    })
    .await;
    let motor = actuator(&observation, "motor");
    assert_eq!(motor["value"], 0.0, "the value rozd wants: {motor}");
    assert_eq!(
        motor["at_safe_value"], false,
        "the device never confirmed it: {motor}"
    );
    let why = motor["safe_unconfirmed"].as_str().unwrap();
    assert!(why.contains("no reply within 200 ms"), "{motor}");
    // The MCU wakes up; the next command (0 again) is answered: safe.
    let answering = tokio::spawn(async move {
        mcu.answer("M 0", "OK").await;
        mcu
    });
    let mut session = session(&daemon).await;
    let text = turn(&mut session, "set motor 0").await;
    assert!(text.contains("motor returned"), "{text}");
    answering.await.unwrap();
    let observation = rest_until(&daemon, "/v1/observation", |o| {
        actuator(o, "motor").get("safe_unconfirmed").is_none()
    })
    .await;
    assert_eq!(actuator(&observation, "motor")["at_safe_value"], true);
    drop(session);
    daemon.shutdown().await;
}
