//! `config/rozd.toml` documents every key of the hardware and fleet sections: each key
//! the configuration accepts (as serde lists them) appears with an example
//! value in its section of the file (commented where the example needs real
//! hardware or a broker), and the file itself is a valid configuration.

use rozd::config::{Config, ConfigSource};

const DOC: &str = include_str!("../../config/rozd.toml");

/// The keys a table accepts, from the error that an unknown key produces.
fn accepted_keys(table: &str) -> Vec<String> {
    let text = table.replace("ZZZ", "zzz_not_a_key = 1");
    let err = Config::parse(&text, ConfigSource::BuiltIn)
        .expect_err("an unknown key is an error")
        .to_string();
    let expected = err
        .split_once("expected")
        .unwrap_or_else(|| panic!("no list of expected keys in: {err}"))
        .1;
    let keys: Vec<String> = expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    assert!(!keys.is_empty(), "{err}");
    keys
}

/// The part of the file from the line that ends with `from` to the one that
/// ends with `to` (section rulers such as `# ---...--- sensors`).
fn section(from: &str, to: Option<&str>) -> &'static str {
    let start = DOC
        .find(&format!("-- {from}\n"))
        .unwrap_or_else(|| panic!("no section {from}"));
    let end = to.map_or(DOC.len(), |to| {
        DOC[start..]
            .find(&format!("-- {to}\n"))
            .map(|i| start + i)
            .unwrap_or_else(|| panic!("no section {to} after {from}"))
    });
    &DOC[start..end]
}

fn assert_documented(what: &str, keys: &[String], text: &str) {
    let missing: Vec<&String> = keys
        .iter()
        .filter(|key| {
            let assignment =
                regex::Regex::new(&format!(r"(?m)(^#?\s*|[{{,]\s*){key}\s*=")).unwrap();
            !assignment.is_match(text)
        })
        .collect();
    assert!(
        missing.is_empty(),
        "config/rozd.toml shows no `key = ...` example for these {what} keys: {missing:?}"
    );
}

#[test]
fn the_example_config_is_valid() {
    let c = Config::parse(DOC, ConfigSource::File("config/rozd.toml".into())).unwrap();
    assert!(!c.hardware.sensors.is_empty());
    assert!(!c.hardware.actuators.is_empty());
    assert!(!c.reflex_rules.is_empty());
}

#[test]
fn every_hardware_key_is_documented_with_an_example() {
    let sensors = accepted_keys("[[sensors]]\nname = \"s\"\nsource = \"sim\"\nZZZ\n");
    assert_documented(
        "[[sensors]]",
        &sensors,
        section("sensors", Some("actuators")),
    );
    let actuators = accepted_keys(
        "[[actuators]]\nname = \"a\"\nkind = \"sim\"\nmin = 0\nmax = 1\nsafe_value = 0\nZZZ\n",
    );
    assert_documented(
        "[[actuators]]",
        &actuators,
        section("actuators", Some("reflex rules")),
    );
    assert_documented(
        "[[actuators]] feedback",
        &accepted_keys(
            "[[actuators]]\nname = \"a\"\nkind = \"sim\"\nmin = 0\nmax = 1\nsafe_value = 0\nfeedback = { ZZZ }\n",
        ),
        section("actuators", Some("reflex rules")),
    );
    assert_documented(
        "[[actuators]] feedback.cross_check",
        &accepted_keys(
            "[[sensors]]\nname = \"s\"\nsource = \"sim\"\n[[actuators]]\nname = \"a\"\nkind = \"sim\"\nmin = 0\nmax = 1\nsafe_value = 0\nfeedback = { sensor = \"s\", tolerance = 1, settle_ms = 1, cross_check = { ZZZ } }\n",
        ),
        section("actuators", Some("reflex rules")),
    );
    let rules = section("reflex rules", Some("cameras"));
    assert_documented(
        "[[cameras]]",
        &accepted_keys("[[cameras]]\nname = \"c\"\nsource = \"sim\"\nZZZ\n"),
        section("cameras", None),
    );
    assert_documented(
        "[[rules]]",
        &accepted_keys("[[rules]]\nname = \"r\"\nwhen = \"true\"\nZZZ\nthen = { estop = true }\n"),
        rules,
    );
    assert_documented(
        "[[rules]] then",
        &accepted_keys("[[rules]]\nname = \"r\"\nwhen = \"true\"\nthen = { ZZZ }\n"),
        rules,
    );
    assert_documented(
        "[gpio]",
        &accepted_keys("[gpio]\nZZZ\n"),
        section("GPIO", Some("MQTT")),
    );
    assert_documented(
        "[mqtt]",
        &accepted_keys("[mqtt]\nurl = \"mqtt://127.0.0.1\"\nZZZ\n"),
        section("MQTT", Some("serial ports")),
    );
    assert_documented(
        "[fleet]",
        &accepted_keys("[fleet]\nurl = \"mqtt://127.0.0.1\"\nZZZ\n"),
        section("fleet", Some("GPIO")),
    );
    let world = section("simulated world", Some("sensors"));
    // Its sub-tables are checked key by key below.
    let sim: Vec<String> = accepted_keys("[sim]\nZZZ\n")
        .into_iter()
        .filter(|k| k != "battery" && k != "motor" && k != "faults")
        .collect();
    assert!(
        world.contains("[sim.battery]")
            && world.contains("[sim.motor]")
            && world.contains("[sim.faults]")
    );
    assert_documented("[sim]", &sim, world);
    for table in ["battery", "motor", "faults"] {
        assert_documented(
            &format!("[sim.{table}]"),
            &accepted_keys(&format!("[sim.{table}]\nZZZ\n")),
            world,
        );
    }
    assert_documented(
        "[sim] start",
        &accepted_keys("[sim]\nstart = { x = 1, y = 1, ZZZ }\n"),
        world,
    );
    assert_documented(
        "[sim] obstacles",
        &accepted_keys(
            "[sim]\nobstacles = [{ min_x = 1, min_y = 1, max_x = 2, max_y = 2, ZZZ }]\n",
        ),
        world,
    );
    assert_documented(
        "[[serial]]",
        &accepted_keys("[[serial]]\nname = \"p\"\npath = \"/dev/null\"\nZZZ\n"),
        section("serial ports", Some("sensors")),
    );
    let modbus = section("Modbus links", Some("simulated world"));
    assert_documented(
        "[[modbus]]",
        &accepted_keys("[[modbus]]\nname = \"m\"\nurl = \"tcp://h\"\nZZZ\n"),
        modbus,
    );
    assert_documented(
        "[[modbus]] rtu",
        &accepted_keys("[[modbus]]\nname = \"m\"\nrtu = { port = \"/dev/x\", ZZZ }\n"),
        modbus,
    );
}

#[test]
fn every_server_key_is_documented_with_an_example() {
    let start = DOC.find("\n[server]\n").expect("a [server] section");
    let end = DOC[start..]
        .find("\n[log]\n")
        .map(|i| start + i)
        .expect("[log] after [server]");
    assert_documented(
        "[server]",
        &accepted_keys("[server]\nZZZ\n"),
        &DOC[start..end],
    );
}

#[test]
fn every_record_and_replay_key_is_documented_with_an_example() {
    let recordings = section("recordings", Some("fleet"));
    assert_documented("[record]", &accepted_keys("[record]\nZZZ\n"), recordings);
    assert_documented("[replay]", &accepted_keys("[replay]\nZZZ\n"), recordings);
    // The example's [record] and [replay], uncommented, are a valid config.
    let uncommented: String = recordings
        .lines()
        .filter_map(|l| l.strip_prefix("# "))
        .filter(|l| {
            l.starts_with('[')
                || l.split_once(" = ")
                    .is_some_and(|(key, _)| key.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let c = Config::parse(&uncommented, ConfigSource::BuiltIn)
        .unwrap_or_else(|e| panic!("{e}\n{uncommented}"));
    assert!(c.record.is_some());
}

#[test]
fn every_foxglove_key_is_documented_with_an_example() {
    let start = DOC.find("\n[foxglove]\n").expect("a [foxglove] section");
    let end = DOC[start..]
        .find("\n[model]\n")
        .map(|i| start + i)
        .expect("[model] after [foxglove]");
    assert_documented(
        "[foxglove]",
        &accepted_keys("[foxglove]\nZZZ\n"),
        &DOC[start..end],
    );
}

#[test]
fn every_mcp_key_is_documented_with_an_example() {
    let start = DOC.find("\n[mcp]\n").expect("an [mcp] section");
    let end = DOC[start..]
        .find("\n[foxglove]\n")
        .map(|i| start + i)
        .expect("[foxglove] after [mcp]");
    assert_documented("[mcp]", &accepted_keys("[mcp]\nZZZ\n"), &DOC[start..end]);
}
