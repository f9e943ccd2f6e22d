//! `[[modbus]]` and the Modbus keys of sensors and actuators, read through
//! the loader: errors name the file, line and key.

use std::time::Duration;

use super::*;
use crate::hw::config::modbus::default_frame_gap;
use crate::hw::config::{ActuatorTarget, ModbusTransport, SensorSource, WriteMode};
use crate::hw::modbus::codec::{Order, Table, ValueType};

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, ConfigSource::File("/etc/rozd/rozd.toml".into()))
}

/// (line, key, message) of the error `text` has.
fn invalid(text: &str) -> (Option<usize>, String, String) {
    match parse(text) {
        Err(ConfigError::Invalid {
            line, key, message, ..
        }) => (line, key, message),
        other => panic!("expected an invalid-config error, got {other:?}"),
    }
}

const LINKS: &str = r#"
[[modbus]]
name = "vfd"
url = "tcp://127.0.0.1:1502"

[[modbus]]
name = "io"
rtu = { port = "/dev/ttyUSB0", baud = 9600 }
unit_id = 3
"#;

#[test]
fn links_sensors_and_actuators_read_into_their_specs() {
    let c = parse(&format!(
        r#"{LINKS}
[[sensors]]
name = "freq"
source = "modbus"
link = "vfd"
register = "input"
address = 4
type = "i32"
word_order = "little"
scale = 0.01
offset = 1.5
rate_hz = 50

[[sensors]]
name = "door"
source = "modbus"
link = "io"
register = "discrete_input"
address = 0

[[actuators]]
name = "speed"
kind = "modbus"
link = "vfd"
register = "holding"
address = 1
scale = 0.01
min = 0
max = 60
safe_value = 0

[[actuators]]
name = "lamp"
kind = "modbus"
link = "io"
unit_id = 4
register = "coil"
address = 2
allowed = [0, 1]
safe_value = 0
read_back = false
"#
    ))
    .unwrap();
    let hw = &c.hardware;
    assert_eq!(hw.modbus.len(), 2);
    assert_eq!(
        hw.modbus[0].transport,
        ModbusTransport::Tcp {
            host: "127.0.0.1".into(),
            port: 1502
        }
    );
    assert_eq!(hw.modbus[1].unit_id, 3);
    assert_eq!(hw.modbus[1].frame_gap, default_frame_gap(9600));
    match &hw.sensors[0].source {
        SensorSource::Modbus { link, point, every } => {
            assert_eq!(link, "vfd");
            assert_eq!(
                (point.unit, point.table, point.address),
                (1, Table::Input, 4)
            );
            assert_eq!(point.codec.value_type, ValueType::I32);
            assert_eq!(point.codec.word_order, Order::Little);
            assert_eq!((point.codec.scale, point.codec.offset), (0.01, 1.5));
            assert_eq!(*every, Duration::from_millis(20));
        }
        other => panic!("{other:?}"),
    }
    match &hw.sensors[1].source {
        SensorSource::Modbus { point, every, .. } => {
            assert_eq!(point.unit, 3, "the link's unit id");
            assert_eq!(point.codec.value_type, ValueType::Bool);
            assert_eq!(*every, Duration::from_millis(100), "the link's poll_hz");
        }
        other => panic!("{other:?}"),
    }
    match &hw.actuators[1].target {
        ActuatorTarget::Modbus {
            point,
            write,
            read_back,
            ..
        } => {
            assert_eq!((point.unit, point.table), (4, Table::Coil));
            assert_eq!((*write, *read_back), (WriteMode::Single, false));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn mistakes_name_their_file_line_and_key() {
    let sensor = |extra: &str| {
        format!(
            "{LINKS}\n[[sensors]]\nname = \"s\"\nsource = \"modbus\"\nlink = \"vfd\"\nregister = \"holding\"\naddress = 1\n{extra}"
        )
    };
    // LINKS ends on line 9; the sensor's table starts on line 11
    let (line, key, message) = invalid(&sensor("type = \"bool\"\n"));
    assert_eq!(
        (line, key.as_str()),
        (Some(17), "sensors[0].type"),
        "{message}"
    );
    assert!(message.contains("bool is for coils"), "{message}");
    let (_, key, message) = invalid(&sensor("pin = 3\n"));
    assert_eq!(key, "sensors[0].pin", "{message}");
    let (_, key, message) = invalid(&sensor("scale = 0\n"));
    assert_eq!(key, "sensors[0].scale", "{message}");
    let (_, key, message) = invalid(&sensor("").replace("link = \"vfd\"", "link = \"plc\""));
    assert_eq!(key, "sensors[0].link");
    assert!(
        message.contains("no [[modbus]] link named \"plc\""),
        "{message}"
    );
    let (_, key, _) = invalid(&sensor("word_order = \"little\"\n"));
    assert_eq!(key, "sensors[0].word_order", "a u16 has one word");

    let (line, key, message) = invalid("[[modbus]]\nname = \"x\"\nurl = \"udp://1.2.3.4\"\n");
    assert_eq!(
        (line, key.as_str()),
        (Some(3), "modbus[0].url"),
        "{message}"
    );
    let (_, key, _) = invalid("[[modbus]]\nname = \"x\"\n");
    assert_eq!(key, "modbus[0].url");
    let (line, key, _) =
        invalid("[[modbus]]\nname = \"x\"\nrtu = { port = \"/dev/ttyS0\", stop_bits = 3 }\n");
    assert_eq!((line, key.as_str()), (Some(3), "modbus[0].rtu.stop_bits"));
    let (_, key, _) = invalid("[[modbus]]\nname = \"x\"\nurl = \"tcp://h\"\nframe_gap_ms = 5\n");
    assert_eq!(key, "modbus[0].frame_gap_ms", "an rtu setting");
    let (_, key, _) = invalid("[[modbus]]\nname = \"x\"\nurl = \"tcp://h\"\nspeed = 5\n");
    assert_eq!(key, "modbus[0].speed", "unknown keys are errors");
    let (_, key, _) = invalid(&format!(
        "{LINKS}[[modbus]]\nname = \"vfd\"\nurl = \"tcp://h\"\n"
    ));
    assert_eq!(key, "modbus[2].name", "duplicate");
}

#[test]
fn actuator_limits_in_engineering_units_must_fit_the_register() {
    let actuator = |extra: &str| {
        format!(
            "{LINKS}\n[[actuators]]\nname = \"a\"\nkind = \"modbus\"\nlink = \"vfd\"\naddress = 1\nsafe_value = 0\n{extra}"
        )
    };
    // 0.01 Hz steps in a u16: at most 655.35 Hz
    let (_, key, message) = invalid(&actuator(
        "register = \"holding\"\nscale = 0.01\nmin = 0\nmax = 700\n",
    ));
    assert_eq!(key, "actuators[0].max", "{message}");
    assert!(message.contains("does not fit"), "{message}");
    let (_, key, _) = invalid(&actuator("register = \"input\"\nmin = 0\nmax = 1\n"));
    assert_eq!(
        key, "actuators[0].register",
        "input registers are read-only"
    );
    let (_, key, _) = invalid(&actuator(
        "register = \"holding\"\ntype = \"f32\"\nwrite = \"single\"\nmin = 0\nmax = 1\n",
    ));
    assert_eq!(key, "actuators[0].write");
    let (_, key, message) = invalid(&format!(
        "{}\n[[actuators]]\nname = \"b\"\nkind = \"modbus\"\nlink = \"vfd\"\naddress = 2\nregister = \"holding\"\ntype = \"u32\"\nmin = 0\nmax = 1\nsafe_value = 0\n",
        actuator("register = \"holding\"\ntype = \"u32\"\nmin = 0\nmax = 1\n")
    ));
    assert_eq!(key, "actuators[1].address", "{message}");
    assert!(message.contains("already written by \"a\""), "{message}");
}
