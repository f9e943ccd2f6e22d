//! Serial driver through real pty pairs made by `socat`: rozd opens one end
//! (link A) as its serial device, the test plays the device on the other
//! end (link B).

use crate::common;
use crate::hw_support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::pty::PtyPair;
use hw_support::{EXPECT_WITHIN, Ev, Events, recorder};
use regex::Regex;
use rozd::hw::config::{
    AlarmLimits, Framing, LineParser, NmeaField, Parity, SensorSource, SensorSpec, SerialPortConfig,
};
use rozd::hw::parse::nmea_with_checksum;
use rozd::hw::serial::{SerialActuator, SerialPorts};
use rozd::hw::{ActuatorDriver, HwError, Readings};
use tokio_util::sync::CancellationToken;

fn port_config(name: &str, path: &Path) -> SerialPortConfig {
    SerialPortConfig {
        name: name.to_string(),
        path: path.to_string_lossy().into_owned(),
        baud: 115_200,
        data_bits: 8,
        parity: Parity::None,
        stop_bits: 1,
        framing: Framing::Lf,
        max_line: 256,
        query: None,
        query_hz: None,
        reconnect_ms: 50,
        allow_raw: false,
    }
}

fn sensor(name: &str, port: &str, parser: LineParser) -> SensorSpec {
    SensorSpec {
        name: name.to_string(),
        unit: None,
        alarms: AlarmLimits::default(),
        stale_after: None,
        source: SensorSource::Serial {
            port: port.to_string(),
            parser,
        },
    }
}

fn json(p: &str) -> LineParser {
    LineParser::Json {
        pointer: p.to_string(),
    }
}
fn kv(k: &str) -> LineParser {
    LineParser::Kv { key: k.to_string() }
}
fn nmea(field: NmeaField) -> LineParser {
    LineParser::Nmea { field }
}

struct Rig {
    ports: SerialPorts,
    events: Events,
    shutdown: CancellationToken,
}

impl Rig {
    async fn start(ports: &[SerialPortConfig], sensors: &[SensorSpec]) -> Rig {
        let (readings, events): (Arc<dyn Readings>, Events) = recorder();
        let shutdown = CancellationToken::new();
        let ports = SerialPorts::start(ports, sensors, readings, shutdown.clone());
        Rig {
            ports,
            events,
            shutdown,
        }
    }

    async fn stop(self) -> Events {
        self.shutdown.cancel();
        tokio::time::timeout(EXPECT_WITHIN, self.ports.join())
            .await
            .expect("port tasks end on shutdown");
        self.events
    }
}

#[tokio::test]
async fn every_parser_end_to_end_on_one_port() {
    let dir = tempfile::tempdir().unwrap();
    let pty = PtyPair::start(dir.path()).await;
    let sensors = [
        sensor("temp", "mcu", json("/env/temp")),
        sensor("humidity", "mcu", kv("H")),
        sensor(
            "pressure",
            "mcu",
            LineParser::Regex {
                pattern: Regex::new(r"^P (?P<value>\d+(\.\d+)?) hPa$").unwrap(),
                group: "value".into(),
            },
        ),
        sensor("latitude", "mcu", nmea(NmeaField::Latitude)),
        sensor("count", "mcu", LineParser::Number),
    ];
    let mut rig = Rig::start(&[port_config("mcu", &pty.a)], &sensors).await;
    rig.events.health("serial:mcu", "ok").await;
    let mut dev = pty.device();

    dev.send("{\"env\": {\"temp\": 21.5}}\n").await;
    rig.events.value("temp", 21.5).await;
    dev.send("H=40.5, T=3\n").await;
    rig.events.value("humidity", 40.5).await;
    dev.send("P 1013.2 hPa\r\n").await;
    rig.events.value("pressure", 1013.2).await;
    let gga = nmea_with_checksum("$GPGGA,123519,4807.038,S,01131.000,E,1,08,0.9,545.4,M,46.9,M,,");
    dev.send(format!("{gga}\n")).await;
    rig.events.value("latitude", -(48.0 + 7.038 / 60.0)).await;
    dev.send("17\n").await;
    rig.events.value("count", 17.0).await;

    let events = rig.stop().await;
    // Each line was some sensor's: nothing rejected, and no sensor got a
    // value from another's line.
    assert!(events.rejections().is_empty(), "{:?}", events.seen);
    let values: Vec<_> = events
        .seen
        .iter()
        .filter(|e| matches!(e, Ev::Value(..)))
        .collect();
    assert_eq!(values.len(), 5, "{values:?}");
}

#[tokio::test]
async fn one_port_feeds_several_sensors() {
    let dir = tempfile::tempdir().unwrap();
    let pty = PtyPair::start(dir.path()).await;
    let gps = [
        sensor("lat", "gps", nmea(NmeaField::Latitude)),
        sensor("lon", "gps", nmea(NmeaField::Longitude)),
        sensor("alt", "gps", nmea(NmeaField::Altitude)),
        sensor("sats", "gps", nmea(NmeaField::Satellites)),
        sensor("fix", "gps", nmea(NmeaField::FixQuality)),
        sensor("speed", "gps", nmea(NmeaField::SpeedMps)),
        sensor("course", "gps", nmea(NmeaField::Course)),
    ];
    let mut cfg = port_config("gps", &pty.a);
    cfg.framing = Framing::Crlf;
    let mut rig = Rig::start(&[cfg], &gps).await;
    rig.events.health("serial:gps", "ok").await;
    let mut dev = pty.device();

    let gga = nmea_with_checksum(
        "$GNGGA,092725.00,4717.11399,N,00833.91590,E,1,08,1.01,499.6,M,48.0,M,,",
    );
    let gsv =
        nmea_with_checksum("$GPGSV,3,1,11,03,03,111,00,04,15,270,00,06,01,010,00,13,06,292,00");
    let rmc =
        nmea_with_checksum("$GNRMC,092725.00,A,4717.11399,N,00833.91590,E,0.004,77.52,091202,,,A");
    dev.send(format!("{gga}\r\n{gsv}\r\n{rmc}\r\n")).await;
    rig.events
        .values(&[
            ("fix", 1.0),
            ("sats", 8.0),
            ("alt", 499.6),
            ("speed", 0.004 * 1852.0 / 3600.0),
            ("course", 77.52),
        ])
        .await;
    let events = rig.stop().await;
    let lats: Vec<_> = events
        .seen
        .iter()
        .filter(|e| matches!(e, Ev::Value(s, _) if s == "lat"))
        .collect();
    // from GGA and from RMC
    assert_eq!(lats.len(), 2, "{:?}", events.seen);
    for e in lats {
        let Ev::Value(_, v) = e else { unreachable!() };
        assert!((v - (47.0 + 17.11399 / 60.0)).abs() < 1e-9, "{v}");
    }
    assert!(
        events.rejections().is_empty(),
        "GSV is not garbage: {:?}",
        events.seen
    );
}

#[tokio::test]
async fn query_mode_asks_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let pty = PtyPair::start(dir.path()).await;
    let mut cfg = port_config("meter", &pty.a);
    cfg.query = Some("MEAS?\n".into());
    cfg.query_hz = Some(20.0);
    let mut rig = Rig::start(&[cfg], &[sensor("voltage", "meter", kv("V"))]).await;
    let mut dev = pty.device();
    for v in ["12.5", "12.25", "11.75"] {
        assert_eq!(dev.line().await, "MEAS?");
        dev.send(format!("V={v}\n")).await;
        rig.events.value("voltage", v.parse().unwrap()).await;
    }
    rig.stop().await;
}

#[tokio::test]
async fn garbage_overlong_and_partial_lines_are_rejected_and_later_lines_work() {
    let dir = tempfile::tempdir().unwrap();
    let pty = PtyPair::start(dir.path()).await;
    let mut cfg = port_config("mcu", &pty.a);
    cfg.max_line = 32;
    let sensors = [
        sensor("temp", "mcu", json("/t")),
        sensor("rpm", "mcu", kv("rpm")),
    ];
    let mut rig = Rig::start(&[cfg], &sensors).await;
    rig.events.health("serial:mcu", "ok").await;
    let mut dev = pty.device();

    dev.send("{\"t\": 20}\n").await;
    rig.events.value("temp", 20.0).await;
    // not UTF-8
    dev.send(b"\xff\xfe\x00garbage\n").await;
    rig.events.rejected("serial:mcu", "not UTF-8").await;
    // overlong (arrives in pieces)
    dev.send("{\"t\": 1, \"padding\": \"xxxxxxxxxx").await;
    dev.send("xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}\n")
        .await;
    rig.events.rejected("serial:mcu", "overlong").await;
    // a partial line (the device restarted mid-line) and plain garbage
    dev.send("{\"t\": 2\n").await;
    rig.events.rejected("serial:mcu", "line").await;
    dev.send("#~@!\n").await;
    rig.events.rejected("serial:mcu", "#~@!").await;
    // a non-finite value is garbage too
    dev.send("rpm=inf\n").await;
    rig.events.rejected("serial:mcu", "non-finite").await;
    // later lines work
    dev.send("{\"t\": 21.25}\nrpm=1200\n").await;
    rig.events.value("temp", 21.25).await;
    rig.events.value("rpm", 1200.0).await;
    let events = rig.stop().await;
    assert_eq!(events.rejections().len(), 5, "{:?}", events.seen);
    assert!(
        !events
            .seen
            .iter()
            .any(|e| matches!(e, Ev::Value(s, v) if s == "temp" && (*v == 1.0 || *v == 2.0))),
        "a rejected line produced a value: {:?}",
        events.seen
    );
}

#[tokio::test]
async fn a_device_that_disappears_and_comes_back_recovers_without_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut pty = PtyPair::start(dir.path()).await;
    let mut rig = Rig::start(
        &[port_config("mcu", &pty.a)],
        &[sensor("count", "mcu", LineParser::Number)],
    )
    .await;
    rig.events.health("serial:mcu", "ok").await;
    let port = rig.ports.port("mcu").expect("port handle");
    let mut dev = pty.device();
    dev.send("1\n").await;
    rig.events.value("count", 1.0).await;
    // half a line, then the device vanishes (whether the half line still
    // reached rozd is up to the kernel; it must never become a value)
    dev.send("7").await;
    pty.stop().await;
    drop(dev);
    rig.events.health("serial:mcu", "disconnected").await;
    assert!(!port.is_connected());
    let err = port
        .command(b"PING\n", None, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eq!(err, HwError::Disconnected("serial:mcu".into()));

    // the device comes back at the same path (a new pty behind the link)
    let pty = PtyPair::start(dir.path()).await;
    rig.events.health("serial:mcu", "ok").await;
    assert!(port.is_connected());
    let mut dev = pty.device();
    dev.send("2\n3\n").await;
    rig.events.value("count", 2.0).await;
    rig.events.value("count", 3.0).await;
    let events = rig.stop().await;
    assert!(
        !events
            .seen
            .iter()
            .any(|e| matches!(e, Ev::Value(_, v) if *v == 7.0)),
        "the partial line must not become a value: {:?}",
        events.seen
    );
}

fn actuator(rig: &Rig, expect: Option<&str>, reply_timeout: Duration) -> SerialActuator {
    SerialActuator::new(
        rig.ports.port("drive").expect("port handle"),
        "M {value}\n".into(),
        expect.map(|e| Regex::new(e).unwrap()),
        reply_timeout,
    )
}

#[tokio::test]
async fn serial_actuator_with_the_expected_reply() {
    let dir = tempfile::tempdir().unwrap();
    let pty = PtyPair::start(dir.path()).await;
    let mut rig = Rig::start(
        &[port_config("drive", &pty.a)],
        &[sensor("current", "drive", kv("I"))],
    )
    .await;
    rig.events.health("serial:drive", "ok").await;
    let act = actuator(&rig, Some("^OK\\b"), EXPECT_WITHIN);
    let mut dev = pty.device();
    let device = async move {
        assert_eq!(dev.line().await, "M 0.5");
        // telemetry arrives before the reply: it feeds the sensor, and is not the reply
        dev.send("I=0.25\nOK M=0.5\n").await;
        assert_eq!(dev.line().await, "M 1");
        dev.send("OK\n").await;
        dev
    };
    let driver = async {
        act.apply(0.5).await.expect("first command");
        act.apply(1.0).await.expect("second command");
    };
    let (mut dev, ()) = tokio::join!(device, driver);
    rig.events.value("current", 0.25).await;
    // the raw command interface returns the reply line
    let port = rig.ports.port("drive").unwrap();
    let ver = Regex::new("^VER ").unwrap();
    let (reply, ()) = tokio::join!(port.command(b"VER?\n", Some(&ver), EXPECT_WITHIN), async {
        assert_eq!(dev.line().await, "VER?");
        dev.send("VER 1.2.3\n").await;
    });
    assert_eq!(reply, Ok(Some("VER 1.2.3".to_string())));
    let events = rig.stop().await;
    assert!(events.rejections().is_empty(), "{:?}", events.seen);
}

#[tokio::test]
async fn serial_actuator_with_a_wrong_reply() {
    let dir = tempfile::tempdir().unwrap();
    let pty = PtyPair::start(dir.path()).await;
    let mut rig = Rig::start(&[port_config("drive", &pty.a)], &[]).await;
    rig.events.health("serial:drive", "ok").await;
    let act = actuator(&rig, Some("^OK$"), EXPECT_WITHIN);
    let mut dev = pty.device();
    let (result, ()) = tokio::join!(act.apply(-0.25), async {
        assert_eq!(dev.line().await, "M -0.25");
        dev.send("ERR overcurrent\n").await;
    });
    assert_eq!(
        result,
        Err(HwError::UnexpectedReply("ERR overcurrent".into()))
    );
    rig.stop().await;
}

#[tokio::test]
async fn serial_actuator_whose_device_never_replies_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let pty = PtyPair::start(dir.path()).await;
    let mut rig = Rig::start(
        &[port_config("drive", &pty.a)],
        &[sensor("current", "drive", kv("I"))],
    )
    .await;
    rig.events.health("serial:drive", "ok").await;
    let act = actuator(&rig, Some("^OK$"), Duration::from_millis(300));
    let mut dev = pty.device();
    let (result, line) = tokio::join!(act.apply(3.0), dev.line());
    assert_eq!(line, "M 3");
    assert_eq!(result, Err(HwError::Timeout(300)));
    // a late reply, after the timeout, is answered to nobody; the telemetry
    // line after it proves rozd has read it before the next command
    dev.send("OK\nI=1.5\n").await;
    rig.events.value("current", 1.5).await;
    let act = actuator(&rig, Some("^DONE$"), EXPECT_WITHIN);
    let (result, ()) = tokio::join!(act.apply(4.0), async {
        assert_eq!(dev.line().await, "M 4");
        dev.send("DONE\n").await;
    });
    assert_eq!(result, Ok(()));
    rig.stop().await;
}

#[tokio::test]
async fn commands_to_an_absent_device_fail_as_disconnected() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::start(
        &[port_config("drive", &dir.path().join("nothing-here"))],
        &[],
    )
    .await;
    rig.events.health("serial:drive", "disconnected").await;
    let act = actuator(&rig, None, Duration::from_secs(1));
    assert_eq!(
        act.apply(1.0).await,
        Err(HwError::Disconnected("serial:drive".into()))
    );
    rig.stop().await;
}
