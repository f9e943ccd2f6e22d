//! The OODA loop end to end through the real daemon, started in-process:
//! a serial device that the test plays on the far end of a `socat` pty pair,
//! and a real `mosquitto` on a free loopback port. What the daemon reads
//! shows up in the Observation (over REST too); what it commands reaches the
//! device or the broker; failures end at the safe value; shutdown drives the
//! actuators safe before it stops the drivers.
//!
//! Every wait is on an event (a line from rozd, an MQTT message, an
//! Observation tick) and bounded; nothing sleeps to synchronise.

use crate::common;
use crate::hw_support;

use std::path::Path;
use std::sync::Arc;

use common::TestDaemon;
use common::broker::{Broker, publish};
use common::pty::{Device, PtyPair};
use hw_support::{EXPECT_WITHIN, free_port};
use rozd::hw::HwError;
use rozd::ooda::act::{ActError, Origin};
use rozd::ooda::orient::AlarmLevel;
use rozd::ooda::{Observation, Ooda};
use serde_json::Value;

// ------------------------------------------------------------------ helpers

async fn until(ooda: &Ooda, what: &str, pred: impl Fn(&Observation) -> bool) -> Arc<Observation> {
    common::observed(ooda, EXPECT_WITHIN, what, pred).await
}

fn sensor<'a>(obs: &'a Observation, name: &str) -> &'a rozd::ooda::SensorObservation {
    obs.sensor(name)
        .unwrap_or_else(|| panic!("no sensor {name} in {obs:#?}"))
}

/// Whether sensor `name` reads `want`, fresh.
fn value_is(obs: &Observation, name: &str, want: f64) -> bool {
    obs.sensor(name).is_some_and(|s| {
        s.sensor.value == Some(want) && s.sensor.health == rozd::hw::HealthKind::Ok
    })
}

fn health_is(obs: &Observation, name: &str, want: &str) -> bool {
    obs.sensor(name)
        .is_some_and(|s| s.sensor.health.as_str() == want)
}

fn source_health(obs: &Observation, source: &str) -> Option<&'static str> {
    obs.sources
        .iter()
        .find(|s| s.name == source)
        .map(|s| s.health.as_str())
}

fn actuator<'a>(obs: &'a Observation, name: &str) -> &'a rozd::ooda::act::ActuatorView {
    obs.actuators
        .iter()
        .find(|a| a.name == name)
        .unwrap_or_else(|| panic!("no actuator {name} in {obs:#?}"))
}

/// `GET path` on the daemon, as JSON.
async fn rest(daemon: &TestDaemon, path: &str) -> (u16, Value) {
    let reply = rozd::cli::client::get(&daemon.addr.to_string(), path, None)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let body = serde_json::from_str(&reply.body)
        .unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {}", reply.body));
    (reply.status.as_u16(), body)
}

/// The entry named `name` of a JSON array.
fn named<'a>(list: &'a Value, name: &str) -> &'a Value {
    list.as_array()
        .unwrap_or_else(|| panic!("not an array: {list}"))
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {list}"))
}

fn operator() -> Origin {
    Origin::Operator("e2e test".into())
}

async fn start_daemon(config: &str) -> TestDaemon {
    TestDaemon::setup(config).paused_clock().start().await
}

// ------------------------------------------------------------------ serial device

/// A motor controller on a serial port: it reports its current as `I=<A>`
/// lines and takes `M <speed>` commands, which it acknowledges with `OK`.
fn serial_robot(device: &Path) -> String {
    format!(
        r#"
[ooda]
tick_hz = 100

[[serial]]
name = "mcu"
path = "{}"
baud = 115200
reconnect_ms = 50

[[sensors]]
name = "current"
source = "serial"
port = "mcu"
parser = "kv"
key = "I"
unit = "A"
warn_max = 2.0
hysteresis = 0.1

[[actuators]]
name = "motor"
kind = "serial"
port = "mcu"
template = "M {{value}}\n"
expect = "^OK\\b"
reply_timeout_ms = 500
min = -1.0
max = 1.0
safe_value = 0.0
"#,
        device.display()
    )
}

/// Starts the daemon while the device acknowledges the start-up safe value.
async fn start_serial_robot(pty: &PtyPair, dev: &mut Device) -> TestDaemon {
    let config = serial_robot(&pty.a);
    let (daemon, ()) = tokio::join!(start_daemon(&config), dev.answer("M 0", "OK"));
    daemon
}

// ------------------------------------------------------------------ serial tests

#[tokio::test]
async fn serial_sensor_and_actuator_through_the_daemon_and_a_device_that_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut pty = PtyPair::start(dir.path()).await;
    let mut dev = pty.device();
    // start-up: the device gets the safe value before anything else
    let daemon = start_serial_robot(&pty, &mut dev).await;
    let ooda = daemon.host.ooda().clone();
    let act = ooda.actuators().clone();

    // Observe: a line from the device becomes the sensor's value.
    dev.send("I=0.25\n").await;
    until(&ooda, "current = 0.25", |o| value_is(o, "current", 0.25)).await;
    let (status, obs) = rest(&daemon, "/v1/observation").await;
    assert_eq!(status, 200);
    let current = named(&obs["sensors"], "current");
    assert_eq!(current["value"], 0.25, "{obs}");
    assert_eq!(current["unit"], "A");
    assert_eq!(current["health"], "ok");
    assert_eq!(current["alarm"], "ok");
    assert_eq!(named(&obs["sources"], "serial:mcu")["health"], "ok");
    let motor = named(&obs["actuators"], "motor");
    assert_eq!(
        (motor["value"].as_f64(), motor["at_safe_value"].as_bool()),
        (Some(0.0), Some(true)),
        "{obs}"
    );
    let (status, one) = rest(&daemon, "/v1/sensors/current").await;
    assert_eq!(status, 200);
    assert_eq!(one["sensor"]["value"], 0.25);
    assert_eq!(one["history"].as_array().map(Vec::len), Some(1), "{one}");

    // Orient: over warn_max is a warning.
    dev.send("I=2.5\n").await;
    let obs = until(&ooda, "current = 2.5", |o| value_is(o, "current", 2.5)).await;
    assert_eq!(sensor(&obs, "current").alarm, AlarmLevel::Warn);

    // Act: the rendered template reaches the device; telemetry before the
    // reply feeds the sensor and is not taken for the reply.
    let (applied, ()) = tokio::join!(act.command("motor", 0.5, operator(), None), async {
        assert_eq!(dev.line().await, "M 0.5");
        dev.send("I=0.75\nOK M=0.5\n").await;
    });
    let applied = applied.expect("the device acknowledged");
    assert_eq!((applied.value, applied.previous), (0.5, 0.0));
    let obs = until(&ooda, "current = 0.75 (telemetry) and motor at 0.5", |o| {
        value_is(o, "current", 0.75) && actuator(o, "motor").value == 0.5
    })
    .await;
    let motor = actuator(&obs, "motor");
    assert!(!motor.at_safe_value);
    assert_eq!(motor.owner.as_deref(), Some("operator e2e test"));
    assert_eq!(sensor(&obs, "current").alarm, AlarmLevel::Ok);

    // A wrong reply fails the command, and the safe value is sent.
    let (result, ()) = tokio::join!(act.command("motor", 0.25, operator(), None), async {
        dev.answer("M 0.25", "ERR overcurrent").await;
        dev.answer("M 0", "OK").await;
    });
    assert_eq!(
        result,
        Err(ActError::Driver {
            actuator: "motor".into(),
            error: HwError::UnexpectedReply("ERR overcurrent".into()),
        })
    );
    assert_eq!(act.value("motor"), Some(0.0));

    // A device that never replies: a timeout, and the safe value is sent.
    let (result, ()) = tokio::join!(act.command("motor", -0.5, operator(), None), async {
        assert_eq!(dev.line().await, "M -0.5");
        // no reply; the safe command follows
        dev.answer("M 0", "OK").await;
    });
    assert_eq!(
        result,
        Err(ActError::Timeout {
            actuator: "motor".into(),
            timeout_ms: 500,
        })
    );
    assert_eq!(act.value("motor"), Some(0.0));
    let obs = until(&ooda, "motor back at its safe value", |o| {
        actuator(o, "motor").at_safe_value
    })
    .await;
    assert_eq!(actuator(&obs, "motor").owner, None);

    // The device vanishes: its sensor is disconnected, commands fail fast.
    pty.stop().await;
    drop(dev);
    until(&ooda, "current disconnected", |o| {
        health_is(o, "current", "disconnected")
    })
    .await;
    let (_, obs) = rest(&daemon, "/v1/observation").await;
    assert_eq!(named(&obs["sensors"], "current")["health"], "disconnected");
    assert_eq!(
        named(&obs["sources"], "serial:mcu")["health"],
        "disconnected"
    );
    assert_eq!(
        act.command("motor", 0.5, operator(), None).await,
        Err(ActError::Driver {
            actuator: "motor".into(),
            error: HwError::Disconnected("serial:mcu".into()),
        })
    );
    assert_eq!(act.value("motor"), Some(0.0));

    // It comes back at the same path: values flow again, no restart.
    let pty = PtyPair::start(dir.path()).await;
    until(&ooda, "serial:mcu open again", |o| {
        source_health(o, "serial:mcu") == Some("ok")
    })
    .await;
    let mut dev = pty.device();
    dev.send("I=1.5\n").await;
    until(&ooda, "current = 1.5 after the reconnect", |o| {
        value_is(o, "current", 1.5)
    })
    .await;
    let (applied, ()) = tokio::join!(
        act.command("motor", 0.25, operator(), None),
        dev.answer("M 0.25", "OK")
    );
    applied.expect("commands work again");

    // Shutdown: the safe value first (the device answers), then the port.
    let ((), ()) = tokio::join!(daemon.shutdown(), dev.answer("M 0", "OK"));
}

#[tokio::test]
async fn shutdown_drives_the_serial_actuator_safe_before_the_port_closes() {
    let dir = tempfile::tempdir().unwrap();
    let pty = PtyPair::start(dir.path()).await;
    let mut dev = pty.device();
    let daemon = start_serial_robot(&pty, &mut dev).await;
    let ooda = daemon.host.ooda().clone();
    let act = ooda.actuators().clone();
    let (applied, ()) = tokio::join!(
        act.command("motor", 0.8, operator(), None),
        dev.answer("M 0.8", "OK")
    );
    applied.expect("commanded");
    // Shutdown sends the safe value while the port still reads: the
    // telemetry the device sends with its reply is still recorded ...
    let ((), ()) = tokio::join!(daemon.shutdown(), async {
        assert_eq!(dev.line().await, "M 0");
        dev.send("I=0.125\nOK\n").await;
    });
    assert_eq!(act.value("motor"), Some(0.0));
    let (current, _) = ooda
        .world()
        .sensor("current", tokio::time::Instant::now())
        .expect("sensor current");
    assert_eq!(
        current.value,
        Some(0.125),
        "the port read the device's answer to the safe value"
    );
    // ... and only then does the port stop.
    let port = ooda.serial_port("mcu").expect("port mcu");
    assert_eq!(
        port.command(b"M 1\n", None, EXPECT_WITHIN).await,
        Err(HwError::Disconnected("serial:mcu".into()))
    );
}

// ------------------------------------------------------------------ MQTT

/// Another client of the broker that records what rozd publishes.
struct Subscriber {
    _client: rumqttc::AsyncClient,
    events: rumqttc::EventLoop,
}

impl Subscriber {
    async fn start(port: u16, id: &str, filter: &str) -> Subscriber {
        let opts = rumqttc::MqttOptions::new(id, "127.0.0.1", port);
        let (client, mut events) = rumqttc::AsyncClient::new(opts, 10);
        client
            .subscribe(filter, rumqttc::QoS::AtLeastOnce)
            .await
            .expect("queue the subscription");
        tokio::time::timeout(EXPECT_WITHIN, async {
            loop {
                if let rumqttc::Event::Incoming(rumqttc::Packet::SubAck(_)) =
                    events.poll().await.expect("subscriber")
                {
                    break;
                }
            }
        })
        .await
        .expect("the subscription was acknowledged");
        Subscriber {
            _client: client,
            events,
        }
    }

    /// The next message: (topic, payload).
    async fn next(&mut self) -> (String, String) {
        let p = tokio::time::timeout(EXPECT_WITHIN, async {
            loop {
                if let rumqttc::Event::Incoming(rumqttc::Packet::Publish(p)) =
                    self.events.poll().await.expect("subscriber")
                {
                    return p;
                }
            }
        })
        .await
        .expect("the subscriber received nothing");
        assert_eq!(p.qos, rumqttc::QoS::AtLeastOnce, "{p:?}");
        assert!(!p.retain, "{p:?}");
        (
            p.topic.clone(),
            String::from_utf8_lossy(&p.payload).into_owned(),
        )
    }

    async fn expect(&mut self, topic: &str, payload: &str) {
        assert_eq!(self.next().await, (topic.to_string(), payload.to_string()));
    }
}

/// A greenhouse: temperature and tank level over MQTT, a fan commanded over
/// MQTT, and a reflex rule that raises an alert.
fn mqtt_robot(port: u16) -> String {
    format!(
        r#"
[ooda]
tick_hz = 100

[mqtt]
url = "mqtt://127.0.0.1:{port}"
client_id = "rozd-e2e"
keep_alive_secs = 5
reconnect_min_ms = 50
reconnect_max_ms = 400

[[sensors]]
name = "temp"
source = "mqtt"
topic = "plant/env"
pointer = "/temp"
unit = "degC"

[[sensors]]
name = "level"
source = "mqtt"
topic = "plant/level"

[[actuators]]
name = "fan"
kind = "mqtt"
topic = "robot/cmd/fan"
payload = '{{"fan": {{value}}}}'
qos = 1
min = 0.0
max = 1.0
safe_value = 0.0

[[rules]]
name = "overheat"
when = "temp > 80"
then = {{ publish = "robot/alert", payload = "overheat", qos = 1 }}
"#
    )
}

#[tokio::test]
async fn mqtt_sensors_actuator_and_reflex_publish_through_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = Broker::start_on(dir.path(), free_port(), "").await;
    let port = broker.port;
    let mut sub = Subscriber::start(port, "e2e-watcher", "robot/#").await;
    // Retained: they reach rozd as soon as its subscriptions are active.
    publish(port, "plant/env", r#"{"temp": 21.5}"#, true).await;
    publish(port, "plant/level", "3", true).await;

    let daemon = start_daemon(&mqtt_robot(port)).await;
    let ooda = daemon.host.ooda().clone();
    let act = ooda.actuators().clone();
    // start-up: the safe value is published before anything else
    sub.expect("robot/cmd/fan", r#"{"fan": 0}"#).await;

    // Observe: values by JSON pointer and plain number.
    until(&ooda, "temp 21.5 and level 3", |o| {
        value_is(o, "temp", 21.5) && value_is(o, "level", 3.0)
    })
    .await;
    let (status, obs) = rest(&daemon, "/v1/observation").await;
    assert_eq!(status, 200);
    assert_eq!(named(&obs["sensors"], "temp")["value"], 21.5, "{obs}");
    assert_eq!(named(&obs["sensors"], "temp")["unit"], "degC");
    assert_eq!(named(&obs["sensors"], "level")["value"], 3.0);
    assert_eq!(named(&obs["sources"], "mqtt")["health"], "ok");
    let (status, one) = rest(&daemon, "/v1/sensors/level").await;
    assert_eq!((status, &one["sensor"]["value"]), (200, &Value::from(3.0)));
    let (status, missing) = rest(&daemon, "/v1/sensors/humidity").await;
    assert_eq!(status, 404);
    assert_eq!(missing["error"]["code"], "not_found");

    // Act: the rendered payload is published.
    let applied = act
        .command("fan", 0.5, operator(), None)
        .await
        .expect("published");
    assert_eq!((applied.value, applied.previous), (0.5, 0.0));
    sub.expect("robot/cmd/fan", r#"{"fan": 0.5}"#).await;

    // Decide: the rule publishes when its condition becomes true ...
    publish(port, "plant/env", r#"{"temp": 85}"#, false).await;
    sub.expect("robot/alert", "overheat").await;
    // ... once: while it stays true, nothing more (the fan command that
    // follows is the next message, ticks after the rule saw 90) ...
    publish(port, "plant/env", r#"{"temp": 90}"#, false).await;
    let seen = until(&ooda, "temp 90", |o| value_is(o, "temp", 90.0)).await;
    until(&ooda, "two more ticks", |o| o.seq >= seen.seq + 2).await;
    act.command("fan", 0.25, operator(), None)
        .await
        .expect("published");
    sub.expect("robot/cmd/fan", r#"{"fan": 0.25}"#).await;
    // ... and again after it was false.
    publish(port, "plant/env", r#"{"temp": 20}"#, false).await;
    until(&ooda, "temp 20", |o| value_is(o, "temp", 20.0)).await;
    publish(port, "plant/env", r#"{"temp": 86}"#, false).await;
    sub.expect("robot/alert", "overheat").await;

    // The broker goes away: the sensors are disconnected; it comes back
    // (with its persistence): values flow again.
    drop(sub);
    broker.stop().await;
    until(&ooda, "temp disconnected", |o| {
        health_is(o, "temp", "disconnected")
    })
    .await;
    let (_, obs) = rest(&daemon, "/v1/observation").await;
    assert_eq!(named(&obs["sensors"], "level")["health"], "disconnected");
    assert_eq!(
        act.command("fan", 1.0, operator(), None).await,
        Err(ActError::Driver {
            actuator: "fan".into(),
            error: HwError::Disconnected("mqtt".into()),
        })
    );
    broker.start_again().await;
    until(&ooda, "mqtt connected again", |o| {
        source_health(o, "mqtt") == Some("ok")
    })
    .await;
    let mut sub = Subscriber::start(port, "e2e-watcher-2", "robot/#").await;
    publish(port, "plant/level", "4", false).await;
    until(&ooda, "level 4 after the broker restart", |o| {
        value_is(o, "level", 4.0)
    })
    .await;
    act.command("fan", 0.75, operator(), None)
        .await
        .expect("published");
    sub.expect("robot/cmd/fan", r#"{"fan": 0.75}"#).await;

    // Shutdown publishes the safe value before the client disconnects.
    daemon.shutdown().await;
    sub.expect("robot/cmd/fan", r#"{"fan": 0}"#).await;
}
