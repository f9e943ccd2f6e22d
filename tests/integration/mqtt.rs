//! MQTT driver against a real `mosquitto` started by each test on a free
//! loopback port, with persistence in a temporary directory.

use crate::common;
use crate::hw_support;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::broker::{Broker, publish};
use hw_support::{EXPECT_WITHIN, Ev, Events, free_port, recorder};
use rozd::hw::config::{AlarmLimits, MqttConfig, SensorSource, SensorSpec};
use rozd::hw::mqtt::{Mqtt, MqttActuator};
use rozd::hw::{ActuatorDriver, HwError, Readings};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

/// A TCP relay in front of the broker that the test can close, so that our
/// client provably stays away while the test publishes.
struct Gate {
    port: u16,
    open: Arc<AtomicBool>,
}

impl Gate {
    async fn start(upstream: u16) -> Gate {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the gate");
        let port = listener.local_addr().expect("gate address").port();
        let open = Arc::new(AtomicBool::new(true));
        let is_open = open.clone();
        tokio::spawn(async move {
            while let Ok((mut down, _)) = listener.accept().await {
                if !is_open.load(Ordering::SeqCst) {
                    continue; // dropped: the client sees the connection closed
                }
                tokio::spawn(async move {
                    if let Ok(mut up) = TcpStream::connect(("127.0.0.1", upstream)).await {
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                    }
                });
            }
        });
        Gate { port, open }
    }

    fn set_open(&self, open: bool) {
        self.open.store(open, Ordering::SeqCst);
    }
}

fn config(port: u16, client_id: &str) -> MqttConfig {
    MqttConfig {
        url: format!("mqtt://127.0.0.1:{port}").parse().unwrap(),
        client_id: Some(client_id.to_string()),
        username: None,
        password_env: None,
        ca_file: None,
        cert_file: None,
        key_file: None,
        keep_alive_secs: 5,
        reconnect_min_ms: 50,
        reconnect_max_ms: 400,
        max_packet_size: rozd::hw::mqtt_link::DEFAULT_MAX_PACKET,
    }
}

fn sensor(name: &str, topic: &str, pointer: Option<&str>) -> SensorSpec {
    SensorSpec {
        name: name.to_string(),
        unit: None,
        alarms: AlarmLimits::default(),
        stale_after: None,
        source: SensorSource::Mqtt {
            topic: topic.to_string(),
            pointer: pointer.map(str::to_string),
        },
    }
}

struct Rig {
    mqtt: Mqtt,
    events: Events,
    shutdown: CancellationToken,
}

impl Rig {
    fn start(cfg: &MqttConfig, sensors: &[SensorSpec]) -> Rig {
        let (readings, events): (Arc<dyn Readings>, Events) = recorder();
        let shutdown = CancellationToken::new();
        let mqtt = Mqtt::start(cfg, "test-host", sensors, readings, shutdown.clone());
        Rig {
            mqtt,
            events,
            shutdown,
        }
    }

    async fn stop(self) -> Events {
        self.shutdown.cancel();
        tokio::time::timeout(EXPECT_WITHIN, self.mqtt.join())
            .await
            .expect("the event loop ends on shutdown");
        self.events
    }
}

#[tokio::test]
async fn values_by_json_pointer_and_plain_number() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start_on(dir.path(), free_port(), "").await;
    // Retained values reach us as soon as our subscriptions are active:
    // they prove the subscriptions before the live messages below.
    publish(broker.port, "robot/env", r#"{"temp": 19.0}"#, true).await;
    publish(broker.port, "robot/battery", "12.0", true).await;
    let sensors = [
        sensor("temp", "robot/env", Some("/temp")),
        sensor("humidity", "robot/env", Some("/hum/value")),
        sensor("battery", "robot/battery", None),
        sensor("bumper", "robot/bumper", None),
    ];
    let mut rig = Rig::start(&config(broker.port, "rozd-values"), &sensors);
    rig.events.health("mqtt", "ok").await;
    rig.events
        .values(&[("temp", 19.0), ("battery", 12.0)])
        .await;

    publish(
        broker.port,
        "robot/env",
        r#"{"temp": 21.5, "hum": {"value": "40.5"}}"#,
        false,
    )
    .await;
    rig.events
        .values(&[("temp", 21.5), ("humidity", 40.5)])
        .await;
    publish(broker.port, "robot/battery", " 12.6\n", false).await;
    rig.events.value("battery", 12.6).await;
    publish(broker.port, "robot/bumper", "true", false).await;
    rig.events.value("bumper", 1.0).await;

    // undecodable payloads are rejected, never fatal
    publish(broker.port, "robot/battery", "twelve", false).await;
    rig.events.rejected("mqtt", "robot/battery").await;
    publish(broker.port, "robot/env", r#"{"temp": "hot"}"#, false).await;
    rig.events.rejected("mqtt", "sensor temp").await;
    publish(broker.port, "robot/env", "{not json", false).await;
    rig.events.rejected("mqtt", "not JSON").await;
    // an empty message (e.g. clearing a retained value) is no value and no garbage
    publish(broker.port, "robot/battery", "", false).await;
    publish(broker.port, "robot/battery", "11.9", false).await;
    rig.events.value("battery", 11.9).await;
    let events = rig.stop().await;
    let battery: Vec<f64> = events
        .seen
        .iter()
        .filter_map(|e| match e {
            Ev::Value(s, v) if s == "battery" => Some(*v),
            _ => None,
        })
        .collect();
    assert_eq!(
        battery,
        [12.0, 12.6, 11.9],
        "rejected payloads gave no values"
    );
    assert_eq!(events.rejections().len(), 3, "{:?}", events.seen);
}

/// The acceptance test of the persistent session: QoS 1 messages published
/// while our client is away (broker stopped, restarted with its persistence,
/// our client kept out until the messages are in) all arrive once it is back.
#[tokio::test]
async fn no_qos1_message_published_during_an_outage_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = Broker::start_on(dir.path(), free_port(), "").await;
    let gate = Gate::start(broker.port).await;
    publish(broker.port, "plant/level", "0", true).await;
    let mut rig = Rig::start(
        &config(gate.port, "rozd-outage"),
        &[sensor("level", "plant/level", None)],
    );
    rig.events.health("mqtt", "ok").await;
    rig.events.value("level", 0.0).await; // subscribed

    // The broker goes down; our client notices and keeps retrying, but the
    // gate keeps it out until the test says so.
    gate.set_open(false);
    broker.restart().await;
    rig.events.health("mqtt", "disconnected").await;
    assert!(!rig.mqtt.is_connected());
    for i in 1..=5 {
        publish(broker.port, "plant/level", &i.to_string(), false).await;
    }
    gate.set_open(true);
    rig.events.health("mqtt", "ok").await;
    for i in 1..=5 {
        rig.events.value("level", f64::from(i)).await;
    }
    // and live traffic continues
    publish(broker.port, "plant/level", "6", false).await;
    rig.events.value("level", 6.0).await;
    rig.stop().await;
}

/// A broker that lost our session (restarted without its persistence
/// file) answers ConnAck without a session present: we subscribe again.
#[tokio::test]
async fn resubscribes_when_the_broker_forgot_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut broker = Broker::start_on(&dir.path().join("a").tap_mkdir(), port, "").await;
    publish(port, "plant/temp", "1", true).await;
    let mut rig = Rig::start(
        &config(port, "rozd-resub"),
        &[sensor("temp", "plant/temp", None)],
    );
    rig.events.value("temp", 1.0).await;

    broker.stop().await;
    rig.events.health("mqtt", "disconnected").await;
    let _fresh = Broker::start_on(&dir.path().join("b").tap_mkdir(), port, "").await;
    // Only a new subscription delivers this retained message, whenever our
    // client reconnects relative to it.
    publish(port, "plant/temp", "2", true).await;
    rig.events.health("mqtt", "ok").await;
    rig.events.value("temp", 2.0).await;
    publish(port, "plant/temp", "3", false).await;
    rig.events.value("temp", 3.0).await;
    rig.stop().await;
}

trait TapMkdir {
    fn tap_mkdir(self) -> Self;
}

impl TapMkdir for PathBuf {
    fn tap_mkdir(self) -> Self {
        std::fs::create_dir_all(&self).expect("create a directory");
        self
    }
}

/// A client of the broker that records what it receives.
async fn subscriber(port: u16, topic: &str) -> (rumqttc::AsyncClient, rumqttc::EventLoop) {
    let opts = rumqttc::MqttOptions::new("test-subscriber", "127.0.0.1", port);
    let (client, mut eventloop) = rumqttc::AsyncClient::new(opts, 10);
    client
        .subscribe(topic, rumqttc::QoS::AtLeastOnce)
        .await
        .expect("queue the subscription");
    tokio::time::timeout(EXPECT_WITHIN, async {
        loop {
            if let rumqttc::Event::Incoming(rumqttc::Packet::SubAck(_)) =
                eventloop.poll().await.expect("subscriber")
            {
                break;
            }
        }
    })
    .await
    .expect("the subscription was acknowledged");
    (client, eventloop)
}

async fn received(eventloop: &mut rumqttc::EventLoop) -> rumqttc::Publish {
    tokio::time::timeout(EXPECT_WITHIN, async {
        loop {
            if let rumqttc::Event::Incoming(rumqttc::Packet::Publish(p)) =
                eventloop.poll().await.expect("subscriber")
            {
                return p;
            }
        }
    })
    .await
    .expect("the subscriber received nothing")
}

#[tokio::test]
async fn actuator_publishes_reach_a_subscriber() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = Broker::start_on(dir.path(), free_port(), "").await;
    let (_sub, mut sub_events) = subscriber(broker.port, "robot/cmd/speed").await;
    let mut rig = Rig::start(&config(broker.port, "rozd-actuator"), &[]);
    rig.events.health("mqtt", "ok").await;
    let speed = MqttActuator::new(
        rig.mqtt.clone(),
        "robot/cmd/speed".into(),
        r#"{"speed": {value}}"#.into(),
        1,
        false,
    );

    speed.apply(0.5).await.expect("publish 0.5");
    let p = received(&mut sub_events).await;
    assert_eq!(p.topic, "robot/cmd/speed");
    assert_eq!(&p.payload[..], br#"{"speed": 0.5}"#);
    assert_eq!(p.qos, rumqttc::QoS::AtLeastOnce);
    speed.apply(1.0).await.expect("publish 1");
    assert_eq!(
        &received(&mut sub_events).await.payload[..],
        br#"{"speed": 1}"#
    );
    // the raw publish used by reflex rules
    rig.mqtt
        .publish("robot/cmd/speed", "stop", 0, false)
        .expect("publish stop");
    assert_eq!(&received(&mut sub_events).await.payload[..], b"stop");
    assert!(matches!(
        rig.mqtt.publish("robot/cmd/speed", "x", 3, false),
        Err(HwError::Unsupported(_))
    ));
    assert!(matches!(
        rig.mqtt.publish("robot/#", "x", 1, false),
        Err(HwError::Unsupported(_))
    ));
    assert!(matches!(
        speed.apply(f64::NAN).await,
        Err(HwError::Unsupported(_))
    ));

    // without a broker, commands fail at once instead of being delivered late
    broker.stop().await;
    rig.events.health("mqtt", "disconnected").await;
    assert_eq!(
        speed.apply(0.0).await,
        Err(HwError::Disconnected("mqtt".into()))
    );
    rig.stop().await;
}

#[tokio::test]
async fn a_configuration_that_cannot_work_reports_an_error() {
    let mut cfg = config(1, "rozd-bad");
    cfg.username = Some("rozd".into());
    cfg.password_env = Some("ROZD_TEST_SURELY_UNSET_PASSWORD_VAR".into());
    let mut rig = Rig::start(&cfg, &[]);
    let health = rig.events.health("mqtt", "error").await;
    assert!(
        format!("{health:?}").contains("ROZD_TEST_SURELY_UNSET_PASSWORD_VAR"),
        "{health:?}"
    );
    assert_eq!(
        rig.mqtt.publish("a", "1", 1, false),
        Err(HwError::Disconnected("mqtt".into()))
    );
    rig.stop().await;
}

/// `mqtts://` with a private CA: rustls with the ring provider, and no
/// other crypto library.
#[tokio::test]
async fn mqtts_with_a_private_ca() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(d)
            .output()
            .expect("run openssl (apt-get install openssl)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    openssl(
        &[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=rozd test CA",
            ],
        ]
        .concat(),
    );
    openssl(
        &[
            &["req"][..],
            &ec,
            &[
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=localhost",
            ],
        ]
        .concat(),
    );
    std::fs::write(
        d.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "server.ext",
    ]);
    let port = free_port();
    let tls = format!(
        "cafile {0}/ca.pem\ncertfile {0}/server.pem\nkeyfile {0}/server.key\n",
        d.display()
    );
    let broker = Broker::start_on(d, port, &tls).await;
    let publish_tls = |payload: &'static str| {
        let mut cmd = Command::new("mosquitto_pub");
        cmd.args([
            "-h",
            "localhost",
            "-p",
            &port.to_string(),
            "-q",
            "1",
            "-t",
            "secure/x",
            "-m",
            payload,
            "-r",
        ])
        .arg("--cafile")
        .arg(d.join("ca.pem"));
        cmd
    };
    let out = publish_tls("7")
        .output()
        .await
        .expect("mosquitto_pub over TLS");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let mut cfg = config(port, "rozd-tls");
    cfg.url = format!("mqtts://localhost:{port}").parse().unwrap();
    cfg.ca_file = Some(d.join("ca.pem"));
    let mut rig = Rig::start(&cfg, &[sensor("x", "secure/x", None)]);
    rig.events.health("mqtt", "ok").await;
    rig.events.value("x", 7.0).await;
    rig.stop().await;

    // a client that does not trust the broker's CA does not connect
    let mut cfg = config(port, "rozd-tls-untrusted");
    cfg.url = format!("mqtts://localhost:{port}").parse().unwrap();
    cfg.ca_file = Some(d.join("server.pem")); // a leaf, not the issuer
    let mut rig = Rig::start(&cfg, &[]);
    let health = rig.events.health("mqtt", "error").await;
    assert!(format!("{health:?}").contains("TLS"), "{health:?}");
    assert!(!rig.mqtt.is_connected());
    rig.stop().await;
    drop(broker);
}

// ------------------------------------------------- through the daemon (issue 14, defect 5)

/// A plant over MQTT: a tank level and a camera's brightness (JSON) as
/// sensors, a valve as an MQTT actuator, and the MQTT stop input.
fn plant(port: u16, client_id: &str) -> String {
    format!(
        r#"
[ooda]
tick_hz = 100

[mqtt]
url = "mqtt://127.0.0.1:{port}"
client_id = "{client_id}"
keep_alive_secs = 5
reconnect_min_ms = 50
reconnect_max_ms = 400

[[sensors]]
name = "level"
source = "mqtt"
topic = "plant/level"

[[sensors]]
name = "camera"
source = "mqtt"
topic = "plant/camera"
pointer = "/brightness"

[[actuators]]
name = "valve"
kind = "mqtt"
topic = "plant/cmd/valve"
qos = 1
min = 0.0
max = 1.0
safe_value = 0.0

[safety]
estop_mqtt_topic = "plant/estop"
"#
    )
}

/// Re-reads `path` on every tick of the daemon's loop until `pred` holds
/// (bounded by [`EXPECT_WITHIN`]); returns the body that satisfied it.
async fn until_rest(
    daemon: &common::TestDaemon,
    path: &str,
    what: &str,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let mut ticks = daemon.host.ooda().subscribe();
    let mut last = serde_json::Value::Null;
    let found = tokio::time::timeout(EXPECT_WITHIN, async {
        loop {
            let (status, body) = common::rest_get(daemon, path).await;
            assert_eq!(status, 200, "GET {path}: {body}");
            if pred(&body) {
                return body;
            }
            last = body;
            ticks.changed().await.expect("the loop ticks");
        }
    })
    .await;
    match found {
        Ok(body) => body,
        Err(_) => panic!("{what} within {EXPECT_WITHIN:?}; last GET {path}: {last}"),
    }
}

/// The named sensor's value in an Observation body.
fn sensor_value(obs: &serde_json::Value, name: &str) -> Option<f64> {
    obs["sensors"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == name)?["value"]
        .as_f64()
}

/// The MQTT stop input's entry of `/v1/safety`.
fn stop_input(safety: &serde_json::Value) -> &serde_json::Value {
    &safety["inputs"][0]
}

/// Defect 5: a 300 KB retained message on a subscribed sensor topic made
/// the client fail ("payload size limit exceeded"), reconnect, get it
/// again, forever: MQTT sensors, the MQTT actuator and the MQTT stop input
/// were all dead. Now the broker does not send rozd more than its maximum
/// packet size, what arrives above rozd's own limits is dropped and
/// counted, and nothing loses its connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_message_disables_neither_the_stop_input_nor_sensors_nor_actuators() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start_on(dir.path(), free_port(), "").await;
    let port = broker.port;
    let (_watcher, mut valve) = subscriber(port, "plant/cmd/valve").await;
    publish(port, "plant/level", "1", true).await;
    let daemon = common::TestDaemon::start(&plant(port, "rozd-plant")).await;
    let ooda = daemon.host.ooda().clone();
    // start-up: the valve is driven to its safe value over MQTT
    assert_eq!(&received(&mut valve).await.payload[..], b"0");
    until_rest(&daemon, "/v1/observation", "level 1", |o| {
        sensor_value(o, "level") == Some(1.0)
    })
    .await;

    // 300 KB retained on a sensor topic rozd subscribes to.
    let huge = serde_json::json!({ "brightness": 9, "frame": "x".repeat(300_000) });
    publish(port, "plant/camera", huge.to_string(), true).await;

    // Sensors on other topics keep updating ...
    publish(port, "plant/level", "2", false).await;
    until_rest(
        &daemon,
        "/v1/observation",
        "level 2 after the huge message",
        |o| sensor_value(o, "level") == Some(2.0),
    )
    .await;
    // ... the MQTT actuator still publishes ...
    ooda.actuators()
        .command(
            "valve",
            1.0,
            rozd::ooda::act::Origin::Operator("test".into()),
            None,
        )
        .await
        .expect("the valve command is published");
    assert_eq!(&received(&mut valve).await.payload[..], b"1");
    // ... and a stop on the stop topic latches and drives the valve safe.
    publish(port, "plant/estop", "stop", true).await;
    let safety = until_rest(&daemon, "/v1/safety", "the MQTT stop latched", |s| {
        s["estop_active"] == true
    })
    .await;
    assert_eq!(safety["stop"]["source"], "mqtt", "{safety}");
    assert_eq!(&received(&mut valve).await.payload[..], b"0");
    let obs = until_rest(
        &daemon,
        "/v1/observation",
        "the valve at its safe value",
        |o| o["actuators"][0]["at_safe_value"] == true,
    )
    .await;
    assert_eq!(obs["actuators"][0]["name"], "valve");
    let input = stop_input(&safety);
    assert_eq!(input["name"], "mqtt:plant/estop");
    assert_eq!(input["connected"], true, "{safety}");
    assert!(input["received"].as_u64() >= Some(1), "{safety}");

    // Above rozd's own limit for a sensor message (64 KiB) but within what
    // the broker may send (256 KiB by default): dropped and counted. A
    // payload rozd cannot parse: counted as rejected. The connection stays.
    let big = serde_json::json!({ "brightness": 3, "frame": "y".repeat(100_000) });
    publish(port, "plant/camera", big.to_string(), false).await;
    publish(port, "plant/camera", "{not json", false).await;
    publish(port, "plant/camera", r#"{"brightness": 7}"#, false).await;
    until_rest(&daemon, "/v1/observation", "camera 7", |o| {
        sensor_value(o, "camera") == Some(7.0)
    })
    .await;
    let (_, status) = common::rest_get(&daemon, "/v1/status").await;
    let mqtt = &status["mqtt"];
    assert_eq!(mqtt["connected"], true, "{status}");
    assert_eq!(mqtt["max_packet_size"], 256 * 1024, "{status}");
    assert_eq!(mqtt["oversized"], 1, "{status}");
    assert!(mqtt["rejected"].as_u64() >= Some(1), "{status}");
    assert!(mqtt["received"].as_u64() >= Some(4), "{status}");
    assert_eq!(
        mqtt["connections"], 1,
        "the hardware connection was never lost: {status}"
    );
    assert_eq!(mqtt["stop_input"]["connections"], 1, "{status}");
    let (_, obs) = common::rest_get(&daemon, "/v1/observation").await;
    let source = obs["sources"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "mqtt"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(source["health"], "ok", "{obs}");
    assert!(source["rejected"].as_u64() >= Some(2), "{obs}");
    daemon.shutdown().await;
}

/// The stop input has a connection (and a broker session) of its own:
/// sensor traffic queued for rozd while it was away cannot push a stop out
/// of the broker's queue, and garbage on a sensor topic does not touch it.
/// (On one shared connection the broker's per-client queue, full of sensor
/// messages, dropped the stop.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_is_not_lost_behind_sensor_traffic_queued_while_away() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = Broker::start_on(dir.path(), free_port(), "max_queued_messages 10").await;
    let gate = Gate::start(broker.port).await;
    publish(broker.port, "plant/level", "0", true).await;
    // not a stop: proves the stop input's subscription when it arrives
    publish(broker.port, "plant/estop", "0", true).await;
    let daemon = common::TestDaemon::start(&plant(gate.port, "rozd-queue")).await;
    until_rest(&daemon, "/v1/observation", "level 0", |o| {
        sensor_value(o, "level") == Some(0.0)
    })
    .await;
    until_rest(&daemon, "/v1/safety", "the stop input subscribed", |s| {
        stop_input(s)["received"].as_u64() >= Some(1)
    })
    .await;

    // rozd goes away (the broker restarts with its persistence; the gate
    // keeps rozd out until the test says so) ...
    gate.set_open(false);
    broker.restart().await;
    until_rest(&daemon, "/v1/safety", "the stop input disconnected", |s| {
        stop_input(s)["connected"] == false
    })
    .await;
    // ... meanwhile a sensor floods its topic, with garbage too, and then
    // someone presses stop (QoS 1, not retained).
    for i in 1..=30 {
        publish(broker.port, "plant/level", i.to_string(), false).await;
    }
    publish(broker.port, "plant/camera", "garbage", false).await;
    publish(broker.port, "plant/estop", "stop", false).await;
    gate.set_open(true);
    let safety = until_rest(&daemon, "/v1/safety", "the queued stop latched", |s| {
        s["estop_active"] == true
    })
    .await;
    assert_eq!(safety["stop"]["source"], "mqtt", "{safety}");
    // The hardware connection is back too: it gets what its queue held
    // (the first 10 values; the broker dropped the rest, and the garbage),
    // then live values.
    until_rest(
        &daemon,
        "/v1/observation",
        "level 10, the last value the queue held",
        |o| sensor_value(o, "level") == Some(10.0),
    )
    .await;
    publish(broker.port, "plant/level", "42", false).await;
    until_rest(&daemon, "/v1/observation", "level 42", |o| {
        sensor_value(o, "level") == Some(42.0)
    })
    .await;
    daemon.shutdown().await;
}

/// A broker that speaks only MQTT 3.1.1 answers a CONNECT of protocol level
/// 5 with a 3.1.1 CONNACK "unacceptable protocol version" and closes (MQTT
/// 3.1.1, 3.1.4). No broker at hand refuses MQTT 5, so a listener plays that
/// part on the wire: rozd reports an error that says what to fix, and keeps
/// retrying (it never falls back to MQTT 3.1.1, which cannot bound packets).
#[tokio::test]
async fn a_broker_without_mqtt_5_is_an_error_that_says_so() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (attempts_tx, mut attempts) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let attempts_tx = attempts_tx.clone();
            tokio::spawn(async move {
                let mut connect = [0u8; 512];
                let n = socket.read(&mut connect).await.unwrap_or(0);
                // CONNECT: fixed header, "MQTT", then the protocol level
                let level = connect[..n]
                    .windows(5)
                    .position(|w| &w[..4] == b"MQTT")
                    .map(|at| connect[at + 4]);
                let _ = attempts_tx.send(level);
                let _ = socket.write_all(&[0x20, 0x02, 0x00, 0x01]).await;
            });
        }
    });
    let mut rig = Rig::start(&config(port, "rozd-v5-only"), &[]);
    let health = rig.events.health("mqtt", "error").await;
    assert!(format!("{health:?}").contains("MQTT 5"), "{health:?}");
    for _ in 0..2 {
        let level = tokio::time::timeout(EXPECT_WITHIN, attempts.recv())
            .await
            .expect("rozd keeps trying")
            .unwrap();
        assert_eq!(level, Some(5), "CONNECT asks for MQTT 5");
    }
    assert!(!rig.mqtt.is_connected());
    rig.stop().await;
}
