//! MCAP recordings (issue 22), read back by an independent reader, the
//! Foxglove project's PyPI `mcap` (and every message checked against its
//! channel's JSON Schema with PyPI `jsonschema`): channels and schemas as
//! docs/recordings.md documents them; sensor values and actuator commands
//! as `/v1/observation` and `/v1/audit` reported them; a file cut short by
//! `kill -9` readable and recovered at the next start; a recording replayed
//! (`source = "replay"`) reproducing the sensor values and firing a reflex
//! rule at the same point; `GET /v1/recordings` with auth, downloads and
//! refused names. `scripts/test.sh` installs the reader into `target/pyenv`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::{self, EXPECT_WITHIN, TestDaemon};
use rozd::ooda::act::Origin;
use serde_json::{Value, json};

const TOKEN: &str = "record-test-token";

/// Reads every file given with PyPI `mcap`: for each, the channels with
/// their schema, every message decoded, whether a summary is present, and
/// where a stream of records broke off; every message is validated against
/// its channel's schema.
const DUMP: &str = r#"
import json, sys
import jsonschema
from mcap.reader import make_reader
from mcap.stream_reader import StreamReader
from mcap.records import Schema, Channel, Message
out = {}
for path in sys.argv[1:]:
    schemas, channels, messages, broken_off = {}, {}, [], None
    try:
        with open(path, "rb") as f:
            for rec in StreamReader(f, skip_magic=False).records:
                if isinstance(rec, Schema):
                    schemas[rec.id] = rec
                elif isinstance(rec, Channel):
                    channels[rec.id] = rec
                elif isinstance(rec, Message):
                    ch = channels[rec.channel_id]
                    data = json.loads(rec.data)
                    jsonschema.validate(data, json.loads(schemas[ch.schema_id].data))
                    messages.append({"topic": ch.topic, "log_time": rec.log_time, "data": data})
    except jsonschema.ValidationError as e:
        raise
    except Exception as e:
        broken_off = type(e).__name__
    summary = None
    try:
        with open(path, "rb") as f:
            s = make_reader(f).get_summary()
            if s is not None and s.statistics is not None:
                summary = {"messages": s.statistics.message_count,
                           "metadata": [m.name for m in make_reader(open(path, "rb")).iter_metadata()]}
    except Exception:
        summary = None
    out[path] = {
        "channels": {ch.topic: {"schema_name": schemas[ch.schema_id].name,
                                "schema_encoding": schemas[ch.schema_id].encoding,
                                "schema": json.loads(schemas[ch.schema_id].data),
                                "message_encoding": ch.message_encoding}
                     for ch in channels.values()},
        "messages": messages,
        "broken_off": broken_off,
        "summary": summary,
    }
print(json.dumps(out))
"#;

fn python() -> PathBuf {
    common::pyenv_tool("python")
}

/// One file as PyPI `mcap` read it.
pub(crate) fn dump(path: &Path) -> Value {
    let out = std::process::Command::new(python())
        .arg("-c")
        .arg(DUMP)
        .arg(path)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "the mcap reader failed on {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let all: Value = serde_json::from_slice(&out.stdout).expect("JSON from the reader");
    all[path.display().to_string()].clone()
}

/// The recordings in `dir`, oldest first.
pub(crate) fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "mcap"));
    files.sort();
    files
}

/// The data of every message on `topic`.
pub(crate) fn on<'a>(file: &'a Value, topic: &str) -> Vec<&'a Value> {
    file["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter(|m| m["topic"] == topic)
                .map(|m| &m["data"])
                .collect()
        })
        .unwrap_or_default()
}

fn values(file: &Value, topic: &str) -> Vec<f64> {
    on(file, topic)
        .iter()
        .filter_map(|d| d["value"].as_f64())
        .collect()
}

async fn get(daemon: &TestDaemon, path: &str, token: Option<&str>) -> (u16, Value) {
    let reply = rozd::cli::client::get(&daemon.addr.to_string(), path, token)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let body = serde_json::from_str(&reply.body).unwrap_or(Value::String(reply.body));
    (reply.status.as_u16(), body)
}

const ROBOT: &str = r#"
[[sensors]]
name = "temp"
source = "sim"
unit = "C"
signal = "sine"
amplitude = 1.0
offset = 20.0
period_ms = 2000
rate_hz = 50

[[actuators]]
name = "arm"
kind = "sim"
min = -1.0
max = 1.0
safe_value = 0.0
"#;

fn record_section(dir: &Path, extra: &str) -> String {
    format!(
        "[record]\ndirectory = {:?}\nflush_ms = 20\n{extra}\n",
        dir.display().to_string()
    )
}

#[tokio::test]
async fn a_recording_holds_what_the_observation_and_the_audit_reported() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::setup(&format!(
        "{}{ROBOT}",
        record_section(dir.path(), "observation_hz = 20")
    ))
    .server(&format!("auth_tokens = [\"{TOKEN}\"]"))
    .start()
    .await;
    common::observed(daemon.host.ooda(), EXPECT_WITHIN, "a temperature", |o| {
        o.sensor("temp").is_some_and(|s| s.sensor.value.is_some())
    })
    .await;
    // A command through the one actuator path, then the stop over REST.
    daemon
        .host
        .ooda()
        .actuators()
        .command("arm", 0.5, Origin::Operator("test".into()), None)
        .await
        .expect("commanded");
    let (status, observation) = get(&daemon, "/v1/observation", Some(TOKEN)).await;
    assert_eq!(status, 200);
    let observed_temp = observation["sensors"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "temp"))
        .and_then(|s| s["value"].as_f64())
        .expect("temp observed");
    let reply = rozd::cli::client::post_json(
        &daemon.addr.to_string(),
        "/v1/estop",
        Some(TOKEN),
        &json!({"reason": "recorded stop"}),
    )
    .await
    .expect("estop");
    assert_eq!(reply.status.as_u16(), 200);
    let (_, status) = get(&daemon, "/v1/status", Some(TOKEN)).await;
    assert_eq!(status["recording"]["dropped"], 0, "{status}");
    assert!(status["recording"]["current_file"].is_string(), "{status}");
    let (_, metrics) = get(&daemon, "/metrics", Some(TOKEN)).await;
    let metrics = metrics.as_str().unwrap_or_default().to_string();
    assert!(metrics.contains("rozd_record_dropped_total 0"), "{metrics}");
    // The audit is written by its own task: poll it (bounded) until it
    // holds the start-up safe drive, the command and the stop's safe drive.
    let audited = tokio::time::timeout(EXPECT_WITHIN, async {
        loop {
            let (status, audit) = get(&daemon, "/v1/audit", Some(TOKEN)).await;
            assert_eq!(status, 200);
            let audited: Vec<(f64, String)> = audit["data"]
                .as_array()
                .expect("audit rows")
                .iter()
                .filter(|r| r["kind"] == "actuator" && r["actuator"] == "arm")
                .map(|r| {
                    (
                        r["result"].as_str().and_then(|v| v.parse().ok()).unwrap(),
                        r["origin"].as_str().unwrap().to_string(),
                    )
                })
                .collect();
            if audited.len() >= 3 {
                return audited;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the command and the safe drive audited");
    daemon.shutdown().await;

    let files = files_in(dir.path());
    assert_eq!(files.len(), 1, "{files:?}");
    let file = dump(&files[0]);
    assert!(
        file["summary"].is_object(),
        "finished with a summary: {file}"
    );
    assert_eq!(file["broken_off"], Value::Null);
    // Channels and schemas as documented.
    for (topic, schema) in [
        ("/observation", "rozd.Observation"),
        ("/sensors/temp", "rozd.SensorValue"),
        ("/actuators/arm", "rozd.ActuatorChange"),
        ("/protective_stop", "rozd.ProtectiveStop"),
        ("/audit", "rozd.AuditRecord"),
    ] {
        let channel = &file["channels"][topic];
        assert_eq!(channel["schema_name"], schema, "{topic}: {channel}");
        assert_eq!(channel["schema_encoding"], "jsonschema");
        assert_eq!(channel["message_encoding"], "json");
        assert_eq!(channel["schema"]["type"], "object");
    }
    // The value /v1/observation reported arrived on /sensors/temp.
    let temps = values(&file, "/sensors/temp");
    assert!(
        temps.contains(&observed_temp),
        "{observed_temp} not among {temps:?}"
    );
    // Every audited change of `arm`, in order, with its origin: the audit
    // and the recording are observers of the same events from the first
    // one on, the start-up safe drive included.
    assert_eq!(audited[0], (0.0, "safety (start-up)".to_string()));
    let recorded: Vec<(f64, String)> = on(&file, "/actuators/arm")
        .iter()
        .map(|d| {
            (
                d["value"].as_f64().unwrap(),
                d["origin"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(
        recorded.starts_with(&audited),
        "audit {audited:?}\nrecording {recorded:?}"
    );
    assert!(audited.contains(&(0.5, "operator test".to_string())));
    let safe = on(&file, "/actuators/arm")
        .into_iter()
        .find(|d| {
            d["kind"] == "safe"
                && d["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("recorded stop"))
        })
        .expect("the stop's safe drive recorded");
    assert_eq!(safe["value"], 0.0);
    // The stop, on its channel and in the audit channel.
    let stops = on(&file, "/protective_stop");
    assert_eq!(stops[0]["event"], "triggered");
    // rozd's own HTTP client says it is the CLI.
    assert_eq!(stops[0]["source"], "cli");
    assert_eq!(stops[0]["latched"], true);
    assert!(
        on(&file, "/audit")
            .iter()
            .any(|r| r["kind"] == "protective_stop" && r["result"] == "recorded stop")
    );
    // The shutdown's safe drive is the last thing recorded for `arm`.
    assert_eq!(
        on(&file, "/actuators/arm")
            .last()
            .map(|d| d["reason"].clone()),
        Some(json!("shutdown"))
    );
}

#[tokio::test]
async fn rest_lists_and_downloads_recordings_behind_auth_and_refuses_other_names() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::setup(&format!(
        "{}{ROBOT}",
        record_section(dir.path(), "max_file_kb = 64\nobservation_hz = 50")
    ))
    .server(&format!("auth_tokens = [\"{TOKEN}\"]"))
    .start()
    .await;
    // Wait (bounded) for the first rotation: the writer says so.
    let mut finished = daemon.host.recorder().finished_files().expect("recording");
    tokio::time::timeout(EXPECT_WITHIN, finished.wait_for(|n| *n >= 1))
        .await
        .expect("a file is finished by rotation")
        .expect("writer alive");
    let (status, body) = get(&daemon, "/v1/recordings", None).await;
    assert_eq!(status, 401, "{body}");
    // The next file opens with the next event (within a sensor period).
    let list = tokio::time::timeout(EXPECT_WITHIN, async {
        loop {
            let (status, list) = get(&daemon, "/v1/recordings", Some(TOKEN)).await;
            assert_eq!(status, 200, "{list}");
            if list["current_file"].is_string() {
                return list;
            }
        }
    })
    .await
    .expect("a file being written");
    assert_eq!(list["enabled"], true);
    let data = list["data"].as_array().expect("data");
    let finished_name = data
        .iter()
        .find(|f| f["state"] == "finished")
        .and_then(|f| f["name"].as_str())
        .expect("a finished file listed")
        .to_string();
    let current = list["current_file"]
        .as_str()
        .expect("current file")
        .to_string();
    assert!(
        data.iter()
            .any(|f| f["name"] == current.as_str() && f["state"] == "recording")
    );
    // Download: the bytes of the file.
    let url = format!("{}/v1/recordings/{finished_name}", daemon.url());
    // reqwest is built without a default TLS provider (as in the daemon).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let reply = client
        .get(&url)
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("download");
    assert_eq!(reply.status().as_u16(), 200);
    assert_eq!(
        reply.headers()["content-type"].to_str().unwrap(),
        "application/octet-stream"
    );
    let bytes = reply.bytes().await.expect("body");
    assert_eq!(
        bytes.as_ref(),
        std::fs::read(dir.path().join(&finished_name))
            .unwrap()
            .as_slice()
    );
    let unauthenticated = client.get(&url).send().await.expect("request");
    assert_eq!(unauthenticated.status().as_u16(), 401);
    // The file being written, names that are not recordings', none such.
    let (status, body) = get(&daemon, &format!("/v1/recordings/{current}"), Some(TOKEN)).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (409, &json!("still_recording"))
    );
    std::fs::write(dir.path().join("secret.txt"), "no").unwrap();
    for name in [
        "..%2Frozd.db",
        "secret.txt",
        "..%2F..%2Fetc%2Fpasswd",
        ".hidden.mcap",
    ] {
        let (status, body) = get(&daemon, &format!("/v1/recordings/{name}"), Some(TOKEN)).await;
        assert_eq!(
            (status, &body["error"]["code"]),
            (400, &json!("invalid_argument")),
            "{name}: {body}"
        );
    }
    let (status, body) = get(&daemon, "/v1/recordings/none-such.mcap", Some(TOKEN)).await;
    assert_eq!((status, &body["error"]["code"]), (404, &json!("not_found")));
    daemon.shutdown().await;
    // Every file, the rotated ones and the last, reads as finished.
    for file in files_in(dir.path()) {
        let read = dump(&file);
        assert!(read["summary"].is_object(), "{}: {read}", file.display());
    }
}

#[tokio::test]
async fn without_record_nothing_is_recorded_and_the_list_says_so() {
    let daemon = TestDaemon::start(ROBOT).await;
    let (status, list) = get(&daemon, "/v1/recordings", None).await;
    assert_eq!((status, &list["enabled"]), (200, &json!(false)));
    let (status, body) = get(&daemon, "/v1/recordings/x.mcap", None).await;
    assert_eq!((status, &body["error"]["code"]), (404, &json!("not_found")));
    let (_, status) = get(&daemon, "/v1/status", None).await;
    assert_eq!(status["recording"], Value::Null);
    daemon.shutdown().await;
}

#[tokio::test]
async fn a_file_cut_short_by_kill_9_is_readable_and_recovered_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let recordings = dir.path().join("recordings");
    let config = dir.path().join("rozd.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n[store]\npath = {:?}\n{}{ROBOT}",
            dir.path().join("rozd.db").display().to_string(),
            record_section(&recordings, "")
        ),
    )
    .unwrap();
    let mut child = common::spawn_rozd(dir.path(), &config).await;
    // Bounded polling of the child's output file: wait until complete
    // chunks with sensor values are on disk.
    let file = tokio::time::timeout(EXPECT_WITHIN, async {
        loop {
            if let Some(file) = files_in(&recordings).into_iter().next()
                && rozd::record::read::info(&file).is_ok_and(|i| {
                    i.channels
                        .get("/sensors/temp")
                        .is_some_and(|c| c.messages >= 20)
                })
            {
                return file;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("sensor values flushed to the file");
    child.start_kill().expect("kill -9");
    child.wait().await.expect("killed");
    let cut = dump(&file);
    assert_eq!(cut["summary"], Value::Null, "no summary after kill -9");
    let cut_temps = values(&cut, "/sensors/temp");
    assert!(cut_temps.len() >= 20, "{}", cut_temps.len());
    // The next start recovers it under its name before it serves.
    let mut again = common::spawn_rozd(dir.path(), &config).await;
    let recovered = dump(&file);
    assert!(recovered["summary"].is_object(), "{recovered}");
    assert!(
        recovered["summary"]["metadata"]
            .as_array()
            .is_some_and(|m| m.contains(&json!("rozd.recovered")))
    );
    let recovered_temps = values(&recovered, "/sensors/temp");
    assert!(recovered_temps.starts_with(&cut_temps));
    assert_eq!(
        files_in(&recordings).len(),
        2,
        "the recovered file and a new one"
    );
    again.start_kill().expect("kill");
    let _ = again.wait().await;
}

/// A descending distance, 1.0 to 0.1 in steps of 0.1 every 100 ms (looped).
const DISTANCE_CSV: &str = "elapsed_ms,value\n0,1.0\n100,0.9\n200,0.8\n300,0.7\n400,0.6\n500,0.5\n600,0.4\n700,0.3\n800,0.2\n900,0.1\n";

const TOO_CLOSE: &str = r#"
[[actuators]]
name = "drive"
kind = "sim"
min = -1.0
max = 1.0
safe_value = 0.0

[[rules]]
name = "too_close"
when = "distance < 0.35"
then = { estop = true, reason = "too close" }
"#;

/// The distance values of a recording, and how many of them came before
/// the first protective stop.
fn distances_and_stop_point(file: &Value) -> (Vec<f64>, usize) {
    let messages = file["messages"].as_array().expect("messages");
    let stop_at = messages
        .iter()
        .find(|m| m["topic"] == "/protective_stop")
        .and_then(|m| m["log_time"].as_u64())
        .unwrap_or_else(|| panic!("a stop recorded: {file}"));
    let before = messages
        .iter()
        .filter(|m| m["topic"] == "/sensors/distance")
        .filter(|m| m["log_time"].as_u64().is_some_and(|t| t <= stop_at))
        .count();
    (values(file, "/sensors/distance"), before)
}

#[tokio::test]
async fn a_replayed_recording_reproduces_the_values_and_fires_the_rule_at_the_same_point() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("distance.csv");
    std::fs::write(&csv, DISTANCE_CSV).unwrap();
    let first = dir.path().join("first");
    let second = dir.path().join("second");
    let streams = "streams = [\"sensors\", \"protective_stop\"]";
    // 1. The robot's run: a sim sensor replaying the CSV; the rule stops it.
    let daemon = TestDaemon::start(&format!(
        "{}[[sensors]]\nname = \"distance\"\nsource = \"sim\"\nsignal = \"replay\"\nfile = {:?}\nrate_hz = 10\n{TOO_CLOSE}",
        record_section(&first, streams),
        csv.display().to_string()
    ))
    .await;
    common::observed(daemon.host.ooda(), EXPECT_WITHIN, "the rule stops", |o| {
        o.protective_stop.is_some()
    })
    .await;
    daemon.shutdown().await;
    let recorded_file = files_in(&first).pop().expect("first recording");
    let recorded = dump(&recorded_file);
    let (recorded_values, recorded_point) = distances_and_stop_point(&recorded);
    assert!(
        recorded_values[recorded_point - 1] < 0.35,
        "{recorded_values:?}"
    );
    assert!(
        recorded_values[..recorded_point - 1]
            .iter()
            .all(|v| *v >= 0.35)
    );

    // 2. The recording replayed, twice as fast, recorded again.
    let daemon = TestDaemon::start(&format!(
        "{}[replay]\nspeed = 2.0\n[[sensors]]\nname = \"distance\"\nsource = \"replay\"\nfile = {:?}\n{TOO_CLOSE}",
        record_section(&second, streams),
        recorded_file.display().to_string()
    ))
    .await;
    let stopped = common::observed(
        daemon.host.ooda(),
        EXPECT_WITHIN,
        "the rule stops again",
        |o| o.protective_stop.is_some(),
    )
    .await;
    assert_eq!(
        stopped.protective_stop.as_ref().map(|s| s.source.as_str()),
        Some("rule:too_close")
    );
    daemon.shutdown().await;
    let replayed = dump(&files_in(&second).pop().expect("second recording"));
    let (replayed_values, replayed_point) = distances_and_stop_point(&replayed);
    let n = replayed_values.len().min(recorded_values.len());
    assert!(n >= recorded_point, "{replayed_values:?}");
    assert_eq!(replayed_values[..n], recorded_values[..n]);
    assert_eq!(
        replayed_point, recorded_point,
        "the rule fired after the same value"
    );

    // 3. Replay beside an actuator that is not simulated: refused, unless allowed.
    let real = format!(
        "[[sensors]]\nname = \"distance\"\nsource = \"replay\"\nfile = {:?}\n\
         [[actuators]]\nname = \"lamp\"\nkind = \"gpio\"\npin = 17\nsafe_value = 0\n",
        recorded_file.display().to_string()
    );
    let err = rozd::config::Config::parse(&real, rozd::config::ConfigSource::BuiltIn)
        .expect_err("replay beside a GPIO actuator")
        .to_string();
    assert!(
        err.contains("key `sensors[0].source`") && err.contains("replay.allow_real_actuators"),
        "{err}"
    );
    rozd::config::Config::parse(
        &format!("[replay]\nallow_real_actuators = true\n{real}"),
        rozd::config::ConfigSource::BuiltIn,
    )
    .expect("allowed explicitly");
    let err = rozd::config::Config::parse(
        &format!(
            "[[sensors]]\nname = \"d\"\nsource = \"replay\"\nfile = {:?}\nchannel = \"/sensors/nope\"\n",
            recorded_file.display().to_string()
        ),
        rozd::config::ConfigSource::BuiltIn,
    )
    .expect_err("no such channel")
    .to_string();
    assert!(
        err.contains("key `sensors[0].channel`") && err.contains("/sensors/distance"),
        "{err}"
    );
}

#[tokio::test]
async fn rozd_record_list_and_info_read_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::start(&format!("{}{ROBOT}", record_section(dir.path(), ""))).await;
    common::observed(daemon.host.ooda(), EXPECT_WITHIN, "a value", |o| {
        o.sensor("temp").is_some_and(|s| s.sensor.value.is_some())
    })
    .await;
    let addr = daemon.addr.to_string();
    let (code, out, err) = common::rozd_cli(&["status", "--addr", &addr]).await;
    assert_eq!(code, Some(0), "{err}");
    let current = daemon.host.recorder().current_file().expect("a file");
    assert!(
        out.contains(&format!("recording:    {current} (")) && out.contains(" 0 dropped)"),
        "{out}"
    );
    daemon.shutdown().await;
    let dir_arg = dir.path().display().to_string();
    let (code, out, err) = common::rozd_cli(&["record", "list", "--dir", &dir_arg, "--json"]).await;
    assert_eq!(code, Some(0), "{err}");
    let listed: Value = serde_json::from_str(&out).expect("JSON");
    let name = listed["data"][0]["name"]
        .as_str()
        .expect("a file")
        .to_string();
    assert_eq!(listed["data"][0]["state"], "finished");
    let file = dir.path().join(&name).display().to_string();
    let (code, out, err) = common::rozd_cli(&["record", "info", &file]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("finished (summary and index present)"),
        "{out}"
    );
    assert!(
        out.contains("/sensors/temp") && out.contains("rozd.SensorValue"),
        "{out}"
    );
    let (code, _, err) = common::rozd_cli(&["record", "info", "/nonexistent.mcap"]).await;
    assert_eq!(code, Some(1));
    assert!(err.contains("cannot read /nonexistent.mcap"), "{err}");
}

#[tokio::test]
async fn sessions_and_tasks_are_recorded_at_the_turn_level() {
    use rozd::api::proto;
    use rozd::api::proto::session_request::Request as Req;
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::start(&format!(
        "{}{ROBOT}\n[[permissions]]\ntool_pattern = \"arm\"\npolicy = \"allow\"\n",
        record_section(
            dir.path(),
            "streams = [\"sessions\", \"tasks\", \"audit\", \"actuators\"]"
        )
    ))
    .await;
    let mut client = daemon.agent().await;
    let mut session = common::Session::open(&mut client).await;
    let session_id = session
        .start(proto::StartSession::default())
        .await
        .session_id;
    session
        .send(Req::UserMessage(proto::UserMessage {
            content: "set arm 0.4".into(),
            ..Default::default()
        }))
        .await;
    let (_, done) = common::until_complete(&mut session).await;
    assert_eq!(done.stop_reason, "end_turn");
    drop(session);
    // A task, followed to its end over gRPC.
    let (status, created) =
        common::rest_post(&daemon, "/v1/tasks", &json!({"prompt": "echo hello"})).await;
    assert_eq!(status, 201, "{created}");
    let task_id = created["id"].as_str().unwrap().to_string();
    let mut tasks = proto::task_service_client::TaskServiceClient::new(daemon.channel().await);
    let mut stream = tasks
        .stream_task_status(proto::StreamTaskStatusRequest {
            task_id: task_id.clone(),
        })
        .await
        .expect("StreamTaskStatus")
        .into_inner();
    while tokio::time::timeout(EXPECT_WITHIN, stream.message())
        .await
        .expect("the task ends in time")
        .expect("status stream")
        .is_some()
    {}
    daemon.shutdown().await;

    let file = dump(&files_in(dir.path()).pop().expect("a recording"));
    let sessions = on(&file, "/sessions");
    let events: Vec<&str> = sessions
        .iter()
        .filter(|e| e["session_id"] == session_id.as_str())
        .filter_map(|e| e["event"].as_str())
        .collect();
    assert_eq!(
        events,
        [
            "session_started",
            "turn_started",
            "turn_ended",
            "session_ended"
        ],
        "{sessions:?}"
    );
    let turn = sessions
        .iter()
        .find(|e| e["event"] == "turn_ended" && e["session_id"] == session_id.as_str())
        .expect("the turn");
    assert_eq!(turn["user_content"], "set arm 0.4");
    let messages = turn["messages"].to_string();
    assert!(
        messages.contains("\"tool_use\"") && messages.contains("\"name\":\"arm\""),
        "{messages}"
    );
    assert!(on(&file, "/audit").iter().any(|r| r["kind"] == "tool_call"
        && r["tool"] == "arm"
        && r["session_id"] == session_id.as_str()));
    assert!(
        on(&file, "/actuators/arm")
            .iter()
            .any(|a| a["value"] == 0.4 && a["origin"] == format!("session {session_id}").as_str())
    );
    let task_events: Vec<&Value> = on(&file, "/tasks")
        .into_iter()
        .filter(|e| e["task_id"] == task_id.as_str())
        .collect();
    assert_eq!(task_events[0]["event"], "created", "{task_events:?}");
    assert!(
        task_events
            .iter()
            .any(|e| e["event"] == "status" && e["status"] == "succeeded"),
        "{task_events:?}"
    );
    assert!(
        task_events
            .iter()
            .any(|e| e["event"] == "team_event" && e["kind"] == "worker_completed"),
        "{task_events:?}"
    );
}

/// Recordings that hostile or broken files (issue 32, item 5): the MCAP
/// magic and one record whose length is 2^64-1, one whose string length is
/// 2^32-1, a FIFO and `/dev/zero`.
fn hostile_recording(kind: &str) -> Vec<u8> {
    let mut file = b"\x89MCAP0\r\n".to_vec();
    match kind {
        "record length" => {
            file.push(0x01); // Header
            file.extend_from_slice(&u64::MAX.to_le_bytes());
            file.extend_from_slice(b"xxxx");
        }
        _ => {
            // A Header whose profile string claims 4 GiB.
            file.push(0x01);
            file.extend_from_slice(&8u64.to_le_bytes());
            file.extend_from_slice(&u32::MAX.to_le_bytes());
            file.extend_from_slice(b"abcd");
        }
    }
    file
}

/// The real binary starts, serves and stops with a hostile file among its
/// recordings (moved aside as `.mcap.corrupt`); `rozd record info` and
/// `rozd check` (the file as a replay source) refuse such files, a FIFO and
/// `/dev/zero` with a clear error instead of a panic, a hang or reading
/// forever.
#[tokio::test]
async fn hostile_recordings_neither_panic_hang_nor_keep_the_daemon_down() {
    for kind in ["record length", "string length"] {
        let dir = tempfile::tempdir().unwrap();
        let recordings = dir.path().join("recordings");
        std::fs::create_dir(&recordings).unwrap();
        let bad = recordings.join("rover-20261201T000000.000Z.mcap");
        std::fs::write(&bad, hostile_recording(kind)).unwrap();

        let (code, out, err) =
            common::rozd_cli(&["record", "info", &bad.display().to_string()]).await;
        assert_eq!(code, Some(1), "{kind}: {out}\n{err}");
        assert!(!err.contains("panicked"), "{kind}: {err}");
        assert!(
            err.contains("rover-20261201T000000.000Z.mcap"),
            "{kind}: {err}"
        );

        let port = common::broker::free_port();
        let config = dir.path().join("rozd.toml");
        std::fs::write(
            &config,
            format!(
                "[server]\nlisten = \"127.0.0.1:{port}\"\ncontrol_socket = \"\"\n\
                 [store]\npath = {:?}\n[record]\ndirectory = {:?}\n",
                dir.path().join("rozd.db").display().to_string(),
                recordings.display().to_string(),
            ),
        )
        .unwrap();
        let _rozd = common::spawn_rozd(dir.path(), &config).await;
        let (status, _) = rest_get_addr(port, "/v1/safety").await;
        assert_eq!(status, 200, "{kind}");
        assert!(!bad.exists(), "{kind}: the file was moved aside");
        let mut aside = bad.clone().into_os_string();
        aside.push(".corrupt");
        assert!(std::path::Path::new(&aside).exists(), "{kind}: {aside:?}");
    }

    // As a replay source: refused at load, promptly, with the file named.
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.mcap");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let hostile = dir.path().join("hostile.mcap");
    std::fs::write(&hostile, hostile_recording("record length")).unwrap();
    for file in [
        fifo.as_path(),
        std::path::Path::new("/dev/zero"),
        hostile.as_path(),
    ] {
        let config = dir.path().join("check.toml");
        std::fs::write(
            &config,
            format!(
                "[[sensors]]\nname = \"distance\"\nsource = \"replay\"\nfile = {:?}\n",
                file.display().to_string()
            ),
        )
        .unwrap();
        let (code, out, err) =
            common::rozd_cli(&["check", "--config", &config.display().to_string()]).await;
        assert_eq!(code, Some(78), "{file:?}: {out}\n{err}");
        assert!(!err.contains("panicked"), "{file:?}: {err}");
        assert!(err.contains(&file.display().to_string()), "{file:?}: {err}");
    }
}

async fn rest_get_addr(port: u16, path: &str) -> (u16, Value) {
    let reply = rozd::cli::client::get(&format!("127.0.0.1:{port}"), path, None)
        .await
        .unwrap();
    (
        reply.status.as_u16(),
        serde_json::from_str(&reply.body).unwrap_or(Value::Null),
    )
}
