//! Modbus links against PyPI pymodbus's own server (an independent
//! implementation): over loopback TCP, and over RTU on one end of a socat
//! pty pair. The test controls the server's datastore and its faults
//! (`hw_support/modbus_server.py`).

use crate::common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::pty::PtyPair;
use common::{EXPECT_WITHIN, TestDaemon, observed};
use rozd::ooda::Observation;
use rozd::ooda::act::{ActError, Origin};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

const SERVER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/integration/hw_support/modbus_server.py"
);

/// pymodbus's server as a child process, driven over its stdin.
struct ModbusDevice {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl ModbusDevice {
    async fn tcp(port: u16, set: &[&str]) -> ModbusDevice {
        let mut args = vec!["--tcp".to_string(), port.to_string()];
        for s in set {
            args.extend(["--set".to_string(), (*s).to_string()]);
        }
        Self::spawn(&args).await
    }

    async fn rtu(path: &Path) -> ModbusDevice {
        Self::spawn(&[
            "--serial".to_string(),
            path.display().to_string(),
            "--baud".to_string(),
            "19200".to_string(),
            // A pty refuses parity settings (EINVAL): the line is 8N1.
            "--parity".to_string(),
            "N".to_string(),
        ])
        .await
    }

    async fn spawn(args: &[String]) -> ModbusDevice {
        let mut child = Command::new(common::pyenv_tool("python"))
            .arg(SERVER)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start the pymodbus server (scripts/test.sh installs pymodbus)");
        let stdin = child.stdin.take().expect("stdin");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut device = ModbusDevice {
            child,
            stdin,
            lines,
        };
        let ready = device.answer().await;
        assert_eq!(ready["ready"], true, "{ready}");
        device
    }

    async fn answer(&mut self) -> Value {
        let line = tokio::time::timeout(EXPECT_WITHIN, self.lines.next_line())
            .await
            .expect("the pymodbus server answers")
            .expect("its stdout")
            .expect("a line (is pymodbus installed?)");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    async fn cmd(&mut self, cmd: Value) -> Value {
        let mut line = cmd.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).await.expect("write");
        self.stdin.flush().await.expect("flush");
        let answer = self.answer().await;
        assert!(
            answer.get("error").is_none_or(Value::is_null),
            "{cmd} -> {answer}"
        );
        answer
    }

    async fn set(&mut self, table: &str, address: u16, values: &[u16]) {
        self.cmd(json!({"set": table, "address": address, "values": values}))
            .await;
    }

    async fn get(&mut self, table: &str, address: u16, count: u16) -> Vec<u64> {
        let answer = self
            .cmd(json!({"get": table, "address": address, "count": count}))
            .await;
        answer["values"]
            .as_array()
            .expect("values")
            .iter()
            .map(|v| v.as_u64().expect("a number"))
            .collect()
    }

    /// The writes the server took, in order: (function code, address, values).
    async fn writes(&mut self) -> Vec<(u64, u64, Vec<u64>)> {
        let answer = self.cmd(json!({"writes": true})).await;
        answer["writes"]
            .as_array()
            .expect("writes")
            .iter()
            .map(|w| {
                (
                    w["fc"].as_u64().unwrap(),
                    w["address"].as_u64().unwrap(),
                    w["values"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_u64().unwrap())
                        .collect(),
                )
            })
            .collect()
    }

    /// Waits until the server holds `want` at `address` of `table`.
    async fn until_value(&mut self, table: &str, address: u16, want: u64) {
        let deadline = tokio::time::Instant::now() + EXPECT_WITHIN;
        loop {
            let now = self.get(table, address, 1).await;
            if now == [want] {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{table} {address} is {now:?}, not {want}"
            );
            // The server has no change signal; ask again shortly.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn kill(mut self) {
        let _ = self.child.kill().await;
    }
}

fn operator() -> Origin {
    Origin::Operator("modbus test".into())
}

fn sensor<'a>(obs: &'a Observation, name: &str) -> &'a rozd::ooda::SensorObservation {
    obs.sensor(name)
        .unwrap_or_else(|| panic!("no sensor {name} in {obs:#?}"))
}

fn value(obs: &Observation, name: &str) -> Option<f64> {
    obs.sensor(name).and_then(|s| s.sensor.value)
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-6)
}

fn find_link<'a>(obs: &'a Observation, link: &str) -> Option<&'a rozd::ooda::world::SourceView> {
    obs.sources
        .iter()
        .find(|s| s.name == format!("modbus:{link}"))
}

fn link_source<'a>(obs: &'a Observation, link: &str) -> &'a rozd::ooda::world::SourceView {
    find_link(obs, link).unwrap_or_else(|| panic!("no source modbus:{link} in {:#?}", obs.sources))
}

/// The link's health, once the observation lists the link (the first
/// observations may come before it does).
fn link_health<'a>(obs: &'a Observation, link: &str) -> Option<&'a str> {
    find_link(obs, link).map(|s| s.health.as_str())
}

/// Sensors of every type and order, an address the server does not have,
/// a speed in 0.01 Hz steps and a pump coil.
fn plc(link: &str) -> String {
    format!(
        r#"
[ooda]
tick_hz = 100

{link}

[[sensors]]
name = "u16_scaled"
source = "modbus"
link = "plc"
register = "holding"
address = 0
scale = 0.1

[[sensors]]
name = "i16"
source = "modbus"
link = "plc"
register = "holding"
address = 1
type = "i16"

[[sensors]]
name = "u32_big"
source = "modbus"
link = "plc"
register = "holding"
address = 2
type = "u32"

[[sensors]]
name = "u32_word_swapped"
source = "modbus"
link = "plc"
register = "holding"
address = 4
type = "u32"
word_order = "little"

[[sensors]]
name = "i32_byte_swapped"
source = "modbus"
link = "plc"
register = "input"
address = 10
type = "i32"
byte_order = "little"

[[sensors]]
name = "f32_little_offset"
source = "modbus"
link = "plc"
register = "input"
address = 20
type = "f32"
word_order = "little"
byte_order = "little"
offset = -0.25

[[sensors]]
name = "coil_5"
source = "modbus"
link = "plc"
register = "coil"
address = 5

[[sensors]]
name = "input_17"
source = "modbus"
link = "plc"
register = "discrete_input"
address = 17

[[sensors]]
name = "nowhere"
source = "modbus"
link = "plc"
register = "holding"
address = 250

[[actuators]]
name = "speed"
kind = "modbus"
link = "plc"
register = "holding"
address = 100
scale = 0.01
unit = "Hz"
min = 0
max = 60
safe_value = 0

[[actuators]]
name = "pump"
kind = "modbus"
link = "plc"
register = "coil"
address = 40
allowed = [0, 1]
safe_value = 0

[[permissions]]
tool_pattern = "speed"
policy = "allow"
"#
    )
}

fn tcp_link(port: u16) -> String {
    format!(
        "[[modbus]]\nname = \"plc\"\nurl = \"tcp://127.0.0.1:{port}\"\npoll_hz = 50\ntimeout_ms = 2000\nreconnect_min_ms = 50\nreconnect_max_ms = 200\n"
    )
}

/// The values of `plc`'s sensors in the server.
async fn load_values(dev: &mut ModbusDevice) {
    dev.set(
        "holding",
        0,
        &[1234, 0xFFFE, 0x1234, 0x5678, 0x5678, 0x1234],
    )
    .await;
    dev.set("input", 10, &[0xFFFF, 0xFEFF]).await;
    dev.set("input", 20, &[0x0080, 0xC842]).await;
    dev.set("coil", 5, &[1]).await;
    dev.set("discrete_input", 17, &[1]).await;
}

async fn every_value_read(daemon: &TestDaemon) -> std::sync::Arc<Observation> {
    observed(
        daemon.host.ooda(),
        EXPECT_WITHIN,
        "every modbus sensor read",
        |o| {
            close(value(o, "u16_scaled"), 123.4)
                && close(value(o, "i16"), -2.0)
                && close(value(o, "u32_big"), 305_419_896.0)
                && close(value(o, "u32_word_swapped"), 305_419_896.0)
                && close(value(o, "i32_byte_swapped"), -2.0)
                && close(value(o, "f32_little_offset"), 100.0)
                && close(value(o, "coil_5"), 1.0)
                && close(value(o, "input_17"), 1.0)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tcp_sensors_read_every_type_and_order_and_the_actuators_take_the_one_command_path() {
    let port = common::broker::free_port();
    let mut dev = ModbusDevice::tcp(port, &[]).await;
    load_values(&mut dev).await;
    let daemon = TestDaemon::start(&plc(&tcp_link(port))).await;
    let ooda = daemon.host.ooda().clone();

    let obs = every_value_read(&daemon).await;
    for name in ["u16_scaled", "f32_little_offset", "input_17"] {
        assert_eq!(sensor(&obs, name).sensor.health.as_str(), "ok", "{name}");
    }
    // An address the device does not have: the sensor is in error, the
    // exception named; the others read on.
    let obs = observed(&ooda, EXPECT_WITHIN, "the exception named", |o| {
        sensor(o, "nowhere")
            .sensor
            .error
            .as_deref()
            .is_some_and(|e| e.contains("illegal data address (exception 2)"))
    })
    .await;
    assert_eq!(sensor(&obs, "nowhere").sensor.health.as_str(), "error");
    assert_eq!(sensor(&obs, "u16_scaled").sensor.health.as_str(), "ok");

    // A command in engineering units lands in the datastore, scaled.
    ooda.actuators()
        .command("speed", 42.5, operator(), None)
        .await
        .expect("42.5 Hz applied");
    assert_eq!(dev.get("holding", 100, 1).await, [4250]);
    ooda.actuators()
        .command("pump", 1.0, operator(), None)
        .await
        .expect("pump on");
    assert_eq!(dev.get("coil", 40, 1).await, [1]);

    // Out of range: refused before any frame is sent.
    let before = dev.writes().await;
    let refused = ooda
        .actuators()
        .command("speed", 61.0, operator(), None)
        .await;
    assert!(
        matches!(refused, Err(ActError::SafetyViolation { .. })),
        "{refused:?}"
    );
    assert_eq!(dev.writes().await, before, "no frame for a refused command");
    assert_eq!(dev.get("holding", 100, 1).await, [4250]);

    // The stop writes every safe value.
    ooda.trigger_stop(rozd::safety::StopRequest::new(
        &rozd::safety::StopSource::Rest,
        "modbus drill",
    ))
    .await;
    assert_eq!(dev.get("holding", 100, 1).await, [0]);
    assert_eq!(dev.get("coil", 40, 1).await, [0]);
    let writes = dev.writes().await;
    assert!(writes.contains(&(6, 100, vec![0])), "{writes:?}");
    assert!(writes.contains(&(5, 40, vec![0])), "{writes:?}");

    // Health and counters per link, in /v1/observation and /metrics.
    let (status, body) = common::rest_get(&daemon, "/v1/observation").await;
    assert_eq!(status, 200);
    let source = body["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "modbus:plc")
        .unwrap_or_else(|| panic!("modbus:plc in {body}"))
        .clone();
    assert_eq!(source["health"], "ok", "{source}");
    assert!(
        source["link"]["requests"].as_u64().unwrap() > 10,
        "{source}"
    );
    assert!(
        source["link"]["errors"]["exception"].as_u64().unwrap() >= 1,
        "{source}"
    );
    assert_eq!(source["link"]["errors"]["disconnected"], 0, "{source}");
    let metrics = rozd::cli::client::get(&daemon.addr.to_string(), "/metrics", None)
        .await
        .expect("GET /metrics")
        .body;
    for want in [
        "modbus_request_duration_seconds_bucket{link=\"plc\"",
        "modbus_errors_total{link=\"plc\",kind=\"exception\"}",
        "modbus_connected{link=\"plc\"} 1",
    ] {
        assert!(metrics.contains(want), "{want} in:\n{metrics}");
    }
    daemon.shutdown().await;
    dev.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_goes_away_is_disconnected_then_back_and_its_actuators_are_driven_safe() {
    let port = common::broker::free_port();
    let mut dev = ModbusDevice::tcp(port, &[]).await;
    load_values(&mut dev).await;
    let daemon = TestDaemon::start(&plc(&tcp_link(port))).await;
    let ooda = daemon.host.ooda().clone();
    every_value_read(&daemon).await;
    ooda.actuators()
        .command("speed", 30.0, operator(), None)
        .await
        .expect("30 Hz applied");
    assert_eq!(dev.get("holding", 100, 1).await, [3000]);

    dev.kill().await;
    let obs = observed(&ooda, EXPECT_WITHIN, "the link down", |o| {
        link_health(o, "plc") == Some("disconnected")
    })
    .await;
    assert_eq!(
        sensor(&obs, "u16_scaled").sensor.health.as_str(),
        "disconnected"
    );
    // The link's loss drove the speed safe (unconfirmed: nothing to write to).
    let obs = observed(&ooda, EXPECT_WITHIN, "speed driven safe", |o| {
        o.actuators
            .iter()
            .any(|a| a.name == "speed" && a.value == 0.0)
    })
    .await;
    let speed = obs.actuators.iter().find(|a| a.name == "speed").unwrap();
    assert!(speed.safe_unconfirmed.is_some(), "{speed:?}");
    // A command while it is down fails with the link named, and is safe.
    let failed = ooda
        .actuators()
        .command("speed", 10.0, operator(), None)
        .await;
    match failed {
        Err(ActError::Driver { error, .. }) => {
            assert!(error.to_string().contains("modbus link plc"), "{error}")
        }
        other => panic!("expected a driver error, got {other:?}"),
    }

    // The device comes back still running at its last speed: rozd
    // reconnects and drives it safe, then reads again.
    let mut dev = ModbusDevice::tcp(port, &["holding:100:3000"]).await;
    load_values(&mut dev).await;
    dev.until_value("holding", 100, 0).await;
    dev.set("holding", 0, &[4321]).await;
    let obs = observed(&ooda, EXPECT_WITHIN, "read again", |o| {
        close(value(o, "u16_scaled"), 432.1) && link_health(o, "plc") == Some("ok")
    })
    .await;
    assert_eq!(sensor(&obs, "u16_scaled").sensor.health.as_str(), "ok");
    let obs = observed(&ooda, EXPECT_WITHIN, "speed confirmed safe", |o| {
        o.actuators
            .iter()
            .any(|a| a.name == "speed" && a.at_safe_value && a.safe_unconfirmed.is_none())
    })
    .await;
    let link = link_source(&obs, "plc")
        .link
        .clone()
        .expect("link counters");
    assert!(link.connections >= 2, "{link:?}");
    assert!(link.errors["disconnected"] >= 1, "{link:?}");
    daemon.shutdown().await;
    dev.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_the_device_refuses_is_host_unavailable_with_the_exception_and_goes_safe() {
    use common::Session;
    use rozd::api::proto;
    use rozd::api::proto::session_request::Request as Req;
    use rozd::api::proto::session_response::Response as Resp;

    let port = common::broker::free_port();
    let mut dev = ModbusDevice::tcp(port, &[]).await;
    let daemon = TestDaemon::start(&plc(&tcp_link(port))).await;
    observed(daemon.host.ooda(), EXPECT_WITHIN, "link up", |o| {
        link_health(o, "plc") == Some("ok")
    })
    .await;
    dev.cmd(json!({"busy_writes": 1})).await;
    let mut client = daemon.agent().await;
    let mut session = Session::open(&mut client).await;
    session.start(proto::StartSession::default()).await;
    session
        .send(Req::UserMessage(proto::UserMessage {
            content: "set speed 30".into(),
            ..Default::default()
        }))
        .await;
    let (seen, _) = common::until_complete(&mut session).await;
    let errors: Vec<&proto::SessionError> = seen
        .iter()
        .filter_map(|r| match r {
            Resp::Error(e) => Some(e),
            _ => None,
        })
        .collect();
    assert_eq!(errors.len(), 1, "{seen:?}");
    assert_eq!(errors[0].code, "host_unavailable", "{errors:?}");
    assert!(
        errors[0]
            .message
            .contains("server device busy (exception 6)"),
        "{errors:?}"
    );
    // The start-up safe value, the refused write, then the safe value.
    let writes = dev.writes().await;
    assert_eq!(
        writes
            .iter()
            .filter(|w| w.1 == 100)
            .cloned()
            .collect::<Vec<_>>(),
        [(6, 100, vec![0]), (6, 100, vec![3000]), (6, 100, vec![0])],
        "{writes:?}"
    );
    assert_eq!(daemon.host.ooda().actuators().value("speed"), Some(0.0));
    daemon.shutdown().await;
    dev.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_rtu_on_a_pty_values_read_writes_land_and_crc_errors_and_slow_replies_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let pty = PtyPair::start(dir.path()).await;
    let mut dev = ModbusDevice::rtu(&pty.b).await;
    load_values(&mut dev).await;
    let link = format!(
        "[[modbus]]\nname = \"plc\"\nrtu = {{ port = \"{}\", baud = 19200, parity = \"none\" }}\npoll_hz = 20\ntimeout_ms = 200\nretries = 1\nreconnect_min_ms = 50\n",
        pty.a.display()
    );
    let daemon = TestDaemon::start(&plc(&link)).await;
    let ooda = daemon.host.ooda().clone();
    every_value_read(&daemon).await;
    observed(&ooda, EXPECT_WITHIN, "the exception named over RTU", |o| {
        sensor(o, "nowhere")
            .sensor
            .error
            .as_deref()
            .is_some_and(|e| e.contains("illegal data address (exception 2)"))
    })
    .await;
    ooda.actuators()
        .command("speed", 12.34, operator(), None)
        .await
        .expect("applied over RTU");
    assert_eq!(dev.get("holding", 100, 1).await, [1234]);

    // A reply whose CRC fails: a bad frame, counted, and the retry reads on.
    dev.cmd(json!({"corrupt": 1})).await;
    let obs = observed(&ooda, EXPECT_WITHIN, "a bad frame counted", |o| {
        find_link(o, "plc")
            .and_then(|s| s.link.as_ref())
            .is_some_and(|l| l.errors["bad_frame"] >= 1)
    })
    .await;
    assert_eq!(link_source(&obs, "plc").health.as_str(), "ok");
    dev.set("holding", 0, &[999]).await;
    observed(&ooda, EXPECT_WITHIN, "read on after the bad frame", |o| {
        close(value(o, "u16_scaled"), 99.9)
    })
    .await;

    // Replies slower than the timeout (and than the quiet time after it,
    // so none is taken for a later request's): the sensors say so, then
    // recover.
    dev.cmd(json!({"delay_ms": 300})).await;
    observed(&ooda, EXPECT_WITHIN, "a slow reply named", |o| {
        sensor(o, "u16_scaled")
            .sensor
            .error
            .as_deref()
            .is_some_and(|e| e.contains("no reply within 200 ms"))
    })
    .await;
    // A write the device does not answer in time fails (a timeout, or a
    // late reply to an earlier request that does not answer it), and the
    // safe value follows it down the line: the device takes requests in
    // order, so the safe value is the last it applies.
    let late = ooda
        .actuators()
        .command("speed", 20.0, operator(), None)
        .await;
    assert!(
        matches!(
            late,
            Err(ActError::Timeout { .. } | ActError::Driver { .. })
        ),
        "{late:?}"
    );
    dev.cmd(json!({"delay_ms": 0})).await;
    dev.until_value("holding", 100, 0).await;
    dev.set("holding", 0, &[777]).await;
    let obs = observed(&ooda, EXPECT_WITHIN, "read again", |o| {
        close(value(o, "u16_scaled"), 77.7) && sensor(o, "u16_scaled").sensor.error.is_none()
    })
    .await;
    let link = link_source(&obs, "plc").link.clone().expect("counters");
    assert!(link.errors["timeout"] >= 1, "{link:?}");

    // The stop reaches the line too.
    ooda.actuators()
        .command("speed", 5.0, operator(), None)
        .await
        .expect("applied over RTU again");
    assert_eq!(dev.get("holding", 100, 1).await, [500]);
    ooda.trigger_stop(rozd::safety::StopRequest::new(
        &rozd::safety::StopSource::Rest,
        "rtu drill",
    ))
    .await;
    dev.until_value("holding", 100, 0).await;
    daemon.shutdown().await;
    dev.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modbus_reads_and_writes_are_recorded_like_every_drivers() {
    let port = common::broker::free_port();
    let mut dev = ModbusDevice::tcp(port, &[]).await;
    load_values(&mut dev).await;
    let recordings = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::start(&format!(
        "[record]\ndirectory = {:?}\nflush_ms = 20\n{}",
        recordings.path().display().to_string(),
        plc(&tcp_link(port))
    ))
    .await;
    every_value_read(&daemon).await;
    daemon
        .host
        .ooda()
        .actuators()
        .command("speed", 42.5, operator(), None)
        .await
        .expect("applied");
    assert_eq!(dev.get("holding", 100, 1).await, [4250]);
    daemon.shutdown().await;
    assert_eq!(
        dev.get("holding", 100, 1).await,
        [0],
        "shutdown wrote the safe value"
    );
    dev.kill().await;

    let files: Vec<_> = std::fs::read_dir(recordings.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "mcap"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let read = rozd::record::read::sensor_track(&files[0], "/sensors/f32_little_offset")
        .expect("a readable recording");
    assert!(
        read.values.iter().any(|(_, v)| (*v - 100.0).abs() < 1e-6),
        "{:?}",
        read.values
    );
    let written: Vec<f64> = rozd::record::read::sensor_track(&files[0], "/actuators/speed")
        .expect("a readable recording")
        .values
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    // start-up safe value, the command, the shutdown's safe value
    assert_eq!(written.first(), Some(&0.0), "{written:?}");
    assert!(written.contains(&42.5), "{written:?}");
    assert_eq!(written.last(), Some(&0.0), "{written:?}");
}

/// docs/guides/first-hardware.md, "A Modbus device": the guide's VFD
/// tables, pointed at pymodbus's server, and the commands it types into it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_hardware_guides_vfd_works_against_the_pymodbus_server_as_written() {
    let guide = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/guides/first-hardware.md"
    ))
    .expect("the guide");
    let section = &guide[guide
        .find("## A Modbus device")
        .expect("the Modbus section")..];
    let start = section.find("```toml\n").expect("its toml block") + "```toml\n".len();
    let block = &section[start..start + section[start..].find("```").expect("closed")];
    assert!(
        block.contains("url = \"tcp://192.168.1.50:502\""),
        "{block}"
    );
    // The commands it types into the server, as written.
    let typed: Vec<Value> = section
        .lines()
        .filter(|l| l.starts_with("{\""))
        .map(|l| {
            let json = l.split("  <-").next().unwrap().trim();
            serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {l}"))
        })
        .collect();
    assert_eq!(typed.len(), 3, "{typed:?}");

    let port = common::broker::free_port();
    let mut dev = ModbusDevice::tcp(port, &[]).await;
    let config = block.replace("tcp://192.168.1.50:502", &format!("tcp://127.0.0.1:{port}"));
    let daemon = TestDaemon::start(&config).await;
    let ooda = daemon.host.ooda().clone();

    dev.cmd(typed[0].clone()).await;
    observed(&ooda, EXPECT_WITHIN, "vfd_frequency reads 25 Hz", |o| {
        close(value(o, "vfd_frequency"), 25.0)
    })
    .await;
    ooda.actuators()
        .command("conveyor_speed", 30.0, operator(), None)
        .await
        .expect("30 Hz applied");
    assert_eq!(dev.get("holding", 1, 1).await, [3000]);
    dev.cmd(typed[1].clone()).await;
    let refused = ooda
        .actuators()
        .command("conveyor_speed", 30.0, operator(), None)
        .await;
    match &refused {
        Err(e @ ActError::Driver { .. }) => {
            assert!(e.to_string().contains("server device busy"), "{e}");
            // what a session or MCP client hears: host_unavailable
            assert!(matches!(
                rozd::tools::ToolError::from(e.clone()),
                rozd::tools::ToolError::Unavailable(_)
            ));
        }
        other => panic!("expected the busy device's refusal, got {other:?}"),
    }
    let answer = dev.cmd(typed[2].clone()).await;
    assert_eq!(answer["values"], json!([0]), "safe after the failed write");
    daemon.shutdown().await;
    dev.kill().await;
}
