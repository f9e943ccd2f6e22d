//! Unit tests of the sub-modules' sections (`[fleet]`, `[safety]` stop
//! inputs, `[mqtt]`) through the loader: their validators are called by the
//! aggregate, so tests that read a whole configuration live beside it.

use super::*;
use crate::safety::inputs::GpioStopInput;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, ConfigSource::File("/etc/rozd/rozd.toml".into()))
}

/// The (line, key, message) of a configuration error.
fn invalid(text: &str) -> (Option<usize>, String, String) {
    match parse(text) {
        Err(ConfigError::Invalid {
            line, key, message, ..
        }) => (line, key, message),
        other => panic!("expected an invalid-config error, got {other:?}"),
    }
}

const FLEET: &str = "[fleet]\nurl = \"mqtt://broker:1883\"\n";
const MQTT: &str = "[mqtt]\nurl = \"mqtt://127.0.0.1:1883\"\n";

#[test]
fn defaults() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet-token");
    std::fs::write(&path, "t0ken\n").unwrap();
    let c = parse(&format!(
        "{FLEET}token_file = {:?}\n",
        path.display().to_string()
    ))
    .unwrap();
    let f = c.fleet.as_ref().unwrap();
    assert_eq!(
        (
            f.topic_prefix.as_str(),
            f.heartbeat,
            f.broker.keep_alive_secs
        ),
        ("roz/v1", std::time::Duration::from_secs(10), 15)
    );
    assert_eq!(f.lookup_timeout, std::time::Duration::from_millis(1000));
    // the built-in configuration's host id is the machine's: name one
    let named = parse(&format!(
        "[host]\nid = \"rover-1\"\n{FLEET}token_file = {:?}\n",
        path.display().to_string()
    ))
    .unwrap();
    let named = named.fleet.as_ref().unwrap();
    assert_eq!(named.client_id, "rozd-fleet-rover-1");
    assert_eq!(
        named.broker.client_id.as_deref(),
        Some("rozd-fleet-rover-1")
    );
    assert_eq!(f.broker.max_packet_size, 128 * 1024);
    assert_eq!(
        f.advertised("127.0.0.1:8080".parse().unwrap()),
        "http://127.0.0.1:8080"
    );
    assert_eq!(f.token.expose(), "t0ken");
    assert!(c.summary().contains("fleet:         mqtt://broker:1883"));
    assert!(parse("").unwrap().fleet.is_none());
}

#[test]
fn errors_name_the_line_and_key() {
    let cases: &[(&str, usize, &str)] = &[
        // a fleet needs its token (the line is the section's)
        (FLEET, 1, "fleet.token_file"),
        ("[fleet]\nurl = \"http://x\"\n", 2, "fleet.url"),
        (
            "[fleet]\nurl = \"mqtt://b\"\nheartbeat_secs = 0\n",
            3,
            "fleet.heartbeat_secs",
        ),
        (
            "[fleet]\nurl = \"mqtt://b\"\nkeep_alive_secs = 4\n",
            3,
            "fleet.keep_alive_secs",
        ),
        (
            "[fleet]\nurl = \"mqtt://b\"\ntopic_prefix = \"roz/#\"\n",
            3,
            "fleet.topic_prefix",
        ),
        (
            "[fleet]\nurl = \"mqtt://b\"\ntopic_prefix = \"roz//v1\"\n",
            3,
            "fleet.topic_prefix",
        ),
        (
            "[fleet]\nurl = \"mqtt://b\"\nadvertise = \"https://a:1\"\n",
            3,
            "fleet.advertise",
        ),
        (
            "[fleet]\nurl = \"mqtt://b\"\npassword_env = \"X\"\n",
            3,
            "fleet.password_env",
        ),
        (
            "[fleet]\nurl = \"mqtt://b\"\ntoken_env = \"ROZD_TEST_FLEET_TOKEN_SURELY_UNSET\"\n",
            3,
            "fleet.token_env",
        ),
        (
            "[fleet]\nurl = \"mqtt://b\"\ntoken_file = \"/nonexistent/fleet-token\"\n",
            3,
            "fleet.token_file",
        ),
        (
            "[fleet]\nurl = \"mqtt://b\"\nsurprise = 1\n",
            3,
            "fleet.surprise",
        ),
        (
            "[host]\nenvironment_id = \"lab/1\"\n[fleet]\nurl = \"mqtt://b\"\n",
            2,
            "host.environment_id",
        ),
        (
            "[server]\nlisten = \"0.0.0.0:8080\"\nallow_unauthenticated_remote = true\n\
             allow_plaintext_remote = true\n\
             [fleet]\nurl = \"mqtt://b\"\n",
            5,
            "fleet.advertise",
        ),
        (
            "[host]\nid = \"r\"\n[mqtt]\nurl = \"mqtt://b\"\n[fleet]\nurl = \"mqtt://b\"\n\
             client_id = \"rozd-r\"\n",
            7,
            "fleet.client_id",
        ),
        (
            "[host]\nid = \"r\"\n[mqtt]\nurl = \"mqtt://b\"\n[fleet]\nurl = \"mqtt://b\"\n\
             client_id = \"rozd-r-estop\"\n",
            7,
            "fleet.client_id",
        ),
        (
            "[fleet]\nurl = \"mqtt://b\"\nmax_packet_size = 65536\n",
            3,
            "fleet.max_packet_size",
        ),
        (
            "[fleet]\nurl = \"mqtt://b\"\nmax_packet_size = 33554432\n",
            3,
            "fleet.max_packet_size",
        ),
    ];
    for (text, line, key) in cases {
        let (got_line, got_key, message) = invalid(text);
        assert_eq!(
            (got_line, got_key.as_str()),
            (Some(*line), *key),
            "{text}: {message}"
        );
    }
}

#[test]
fn the_token_is_accepted_for_auth_and_never_printed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet-token");
    std::fs::write(&path, "# shared by the lab's hosts\n\n  s3cret-fleet  \n").unwrap();
    let c = parse(&format!(
        "[server]\nlisten = \"0.0.0.0:8080\"\nallow_plaintext_remote = true\n\
         [fleet]\nurl = \"mqtt://b\"\n\
         advertise = \"http://10.0.0.7:8080\"\ntoken_file = {:?}\n",
        path.display().to_string()
    ))
    .unwrap();
    let fleet = c.fleet.as_ref().unwrap();
    assert_eq!(fleet.token.expose(), "s3cret-fleet");
    // it counts as a credential: a non-loopback listener is allowed
    assert!(c.auth_required());
    assert_eq!(c.credential_count(), 1);
    let printed = format!("{c:?}{}", c.summary());
    assert!(!printed.contains("s3cret"), "{printed}");
    std::fs::write(&path, "# nothing\n").unwrap();
    let (_, key, _) = invalid(&format!(
        "[fleet]\nurl = \"mqtt://b\"\ntoken_file = {:?}\n",
        path.display().to_string()
    ));
    assert_eq!(key, "fleet.token_file");
}

#[test]
fn stop_inputs_are_validated_at_load_naming_the_key() {
    let ok = parse(&format!(
        "{MQTT}[safety]\nestop_gpio_pin = 4\nestop_gpio_active = \"high\"\nestop_gpio_pull = \"none\"\n\
         estop_mqtt_topic = \"cell/estop\"\n"
    ))
    .unwrap();
    assert_eq!(
        GpioStopInput::from_config(&ok.safety),
        Some(GpioStopInput {
            pin: 4,
            active: Level::High,
            pull: Pull::None
        })
    );
    assert!(
        ok.summary()
            .contains("GPIO 4 (active high, pull none), MQTT topic cell/estop")
    );

    let sensor_pin = "[safety]\nestop_gpio_pin = 17\n\n[[sensors]]\nname = \"door\"\nsource = \"gpio\"\npin = 17\n";
    let (line, key, message) = invalid(sensor_pin);
    assert_eq!((line, key.as_str()), (Some(2), "safety.estop_gpio_pin"));
    assert!(message.contains("sensor \"door\""), "{message}");

    let actuator_pin = "[[actuators]]\nname = \"lamp\"\nkind = \"pwm\"\npin = 12\nmin = 0\nmax = 1\nsafe_value = 0\n[safety]\nestop_gpio_pin = 12\n";
    let (line, key, message) = invalid(actuator_pin);
    assert_eq!((line, key.as_str()), (Some(9), "safety.estop_gpio_pin"));
    assert!(message.contains("actuator \"lamp\""), "{message}");

    let (line, key, _) = invalid("[safety]\nestop_gpio_active = \"low\"\n");
    assert_eq!((line, key.as_str()), (Some(2), "safety.estop_gpio_active"));
    let (_, key, _) = invalid("[safety]\nestop_gpio_pull = \"up\"\n");
    assert_eq!(key, "safety.estop_gpio_pull");
    let (line, key, _) =
        invalid("[safety]\nestop_gpio_pin = 4\nestop_gpio_active = \"sideways\"\n");
    assert_eq!((line, key.as_str()), (Some(3), "safety.estop_gpio_active"));

    let (line, key, message) = invalid("[safety]\nestop_mqtt_topic = \"cell/estop\"\n");
    assert_eq!((line, key.as_str()), (Some(2), "safety.estop_mqtt_topic"));
    assert!(message.contains("[mqtt]"), "{message}");
    for bad in ["cell/#", "cell/+/estop", ""] {
        let (_, key, _) = invalid(&format!("{MQTT}[safety]\nestop_mqtt_topic = {bad:?}\n"));
        assert_eq!(key, "safety.estop_mqtt_topic", "{bad:?}");
    }
    let (_, key, message) = invalid(&format!(
        "{MQTT}[safety]\nestop_mqtt_topic = \"cell/x\"\n[[actuators]]\nname = \"horn\"\nkind = \"mqtt\"\n\
         topic = \"cell/x\"\nallowed = [0, 1]\nsafe_value = 0\n"
    ));
    assert_eq!(key, "safety.estop_mqtt_topic");
    assert!(message.contains("actuator \"horn\""), "{message}");
    let (_, key, message) = invalid(&format!(
        "{MQTT}[safety]\nestop_mqtt_topic = \"cell/x\"\n[[sensors]]\nname = \"t\"\nsource = \"mqtt\"\ntopic = \"cell/x\"\n"
    ));
    assert_eq!(key, "safety.estop_mqtt_topic");
    assert!(message.contains("sensor \"t\""), "{message}");
}

#[test]
fn max_packet_size_is_configured_and_validated_naming_the_key() {
    let parse =
        |text: &str| crate::config::Config::parse(text, crate::config::ConfigSource::BuiltIn);
    let ok = parse("[mqtt]\nurl = \"mqtt://b\"\n").unwrap();
    assert_eq!(ok.hardware.mqtt.unwrap().max_packet_size, 256 * 1024);
    let ok = parse("[mqtt]\nurl = \"mqtt://b\"\nmax_packet_size = 1024\n").unwrap();
    assert_eq!(ok.hardware.mqtt.unwrap().max_packet_size, 1024);
    for bad in ["1023", "16777217", "-1", "\"big\""] {
        match parse(&format!(
            "[mqtt]\nurl = \"mqtt://b\"\nmax_packet_size = {bad}\n"
        )) {
            Err(crate::config::ConfigError::Invalid { line, key, .. }) => {
                assert_eq!(
                    (line, key.as_str()),
                    (Some(3), "mqtt.max_packet_size"),
                    "{bad}"
                );
            }
            other => panic!("{bad}: expected an invalid-config error, got {other:?}"),
        }
    }
}

#[test]
fn mcp_max_sessions_is_bounded_and_named_in_errors() {
    assert_eq!(parse("").unwrap().mcp.max_sessions, 64);
    assert_eq!(
        parse("[mcp]\nmax_sessions = 3\n").unwrap().mcp.max_sessions,
        3
    );
    for bad in ["0", "10001"] {
        let (line, key, message) = invalid(&format!("[mcp]\nmax_sessions = {bad}\n"));
        assert_eq!((line, key.as_str()), (Some(2), "mcp.max_sessions"), "{bad}");
        assert!(message.contains("between 1 and 10000"), "{message}");
    }
}

#[test]
fn require_other_credential_needs_credentials_to_tell_apart() {
    assert!(!parse("").unwrap().approvals.require_other_credential);
    let (line, key, message) = invalid("[approvals]\nrequire_other_credential = true\n");
    assert_eq!(
        (line, key.as_str()),
        (Some(2), "approvals.require_other_credential")
    );
    assert!(message.contains("needs credentials"), "{message}");
    let c = parse(
        "[server]\nauth_tokens = [\"t0ken-one\"]\n[approvals]\nrequire_other_credential = true\n",
    )
    .unwrap();
    assert!(c.approvals.require_other_credential);
    let (_, key, _) = invalid("[approvals]\nrequire_other = true\n");
    assert_eq!(key, "approvals.require_other");
}

/// An actuator's `feedback`: a sensor that exists, units that fit (or a
/// conversion), finite positive numbers; every error names its line and key.
#[test]
fn actuator_feedback_is_validated_naming_the_line_and_key() {
    let with = |feedback: &str| {
        format!(
            "[[sensors]]\nname = \"rpm\"\nsource = \"sim\"\nunit = \"rpm\"\n\n\
             [[sensors]]\nname = \"duty\"\nsource = \"sim\"\nunit = \"fraction\"\n\n\
             [[actuators]]\nname = \"fan\"\nkind = \"sim\"\nunit = \"fraction\"\nmin = 0\nmax = 1\n\
             safe_value = 0\nfeedback = {feedback}\n"
        )
    };
    let ok = parse(&with(
        "{ sensor = \"rpm\", tolerance = 50, settle_ms = 800, scale = 3000, offset = 100, on_mismatch = \"stop\" }",
    ))
    .unwrap();
    let f = ok.hardware.actuators[0].feedback.as_ref().unwrap();
    assert_eq!((f.sensor.as_str(), f.tolerance), ("rpm", 50.0));
    assert_eq!(f.settle, std::time::Duration::from_millis(800));
    assert_eq!(f.expected(0.5), 1600.0);
    assert_eq!(f.on_mismatch, crate::hw::config::OnMismatch::Stop);
    // Same units: no conversion needed; the defaults are 1, 0 and "alarm".
    let plain = parse(&with(
        "{ sensor = \"duty\", tolerance = 0.01, settle_ms = 100 }",
    ))
    .unwrap();
    let f = plain.hardware.actuators[0].feedback.as_ref().unwrap();
    assert_eq!((f.scale, f.offset), (1.0, 0.0));
    assert_eq!(f.on_mismatch, crate::hw::config::OnMismatch::Alarm);
    assert!(ok.hardware.actuators.iter().all(|a| a.name == "fan"));
    for (feedback, key, needle) in [
        (
            "{ sensor = \"speed\", tolerance = 1, settle_ms = 100 }",
            "actuators[0].feedback.sensor",
            "no [[sensors]] named \"speed\"",
        ),
        (
            "{ sensor = \"rpm\", tolerance = 1, settle_ms = 100 }",
            "actuators[0].feedback.sensor",
            "give `scale`",
        ),
        (
            "{ sensor = \"duty\", tolerance = 0, settle_ms = 100 }",
            "actuators[0].feedback.tolerance",
            "finite positive",
        ),
        (
            "{ sensor = \"duty\", tolerance = -0.1, settle_ms = 100 }",
            "actuators[0].feedback.tolerance",
            "finite positive",
        ),
        (
            "{ sensor = \"duty\", tolerance = nan, settle_ms = 100 }",
            "actuators[0].feedback.tolerance",
            "finite positive",
        ),
        (
            "{ sensor = \"duty\", tolerance = 0.1, settle_ms = 0 }",
            "actuators[0].feedback.settle_ms",
            "outside 1-60000",
        ),
        (
            "{ sensor = \"rpm\", tolerance = 1, settle_ms = 100, scale = 0 }",
            "actuators[0].feedback.scale",
            "other than 0",
        ),
        (
            "{ sensor = \"rpm\", tolerance = 1, settle_ms = 100, scale = inf }",
            "actuators[0].feedback.scale",
            "other than 0",
        ),
        (
            "{ sensor = \"rpm\", tolerance = 1, settle_ms = 100, offset = -inf }",
            "actuators[0].feedback.offset",
            "not a finite number",
        ),
        (
            "{ sensor = \"duty\", tolerance = 0.1, settle_ms = 100, on_mismatch = \"panic\" }",
            "actuators[0].feedback.on_mismatch",
            "unknown variant",
        ),
        (
            "{ sensor = \"duty\", settle_ms = 100 }",
            "actuators[0].feedback",
            "missing field `tolerance`",
        ),
        (
            "{ sensor = \"duty\", tolerance = 0.1, settle_ms = 100, within = 3 }",
            "actuators[0].feedback",
            "unknown field `within`",
        ),
    ] {
        let text = with(feedback);
        let (line, found, message) = invalid(&text);
        assert_eq!(line, Some(18), "{feedback}: {message}");
        assert!(
            found.starts_with(key),
            "{feedback}: key {found}, want {key}"
        );
        assert!(message.contains(needle), "{feedback}: {message}");
    }
    let err = parse(&with(
        "{ sensor = \"speed\", tolerance = 1, settle_ms = 100 }",
    ))
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with("/etc/rozd/rozd.toml:18: key `actuators[0].feedback.sensor`"),
        "{err}"
    );
}

#[test]
fn the_manual_file_is_read_and_every_failure_names_the_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("AGENTS.md");
    std::fs::write(&path, "Never enter the kitchen.\n").unwrap();
    let c = parse(&format!(
        "[host]\nid = \"r\"\n\n[agent]\nmanual_file = {:?}\n",
        path.display().to_string()
    ))
    .unwrap();
    let manual = c.manual.as_ref().expect("the manual is read");
    assert_eq!(manual.text, "Never enter the kitchen.\n");
    assert_eq!(manual.path, path);
    assert!(
        c.summary()
            .contains(&format!("manual:        {} (25 bytes)", path.display())),
        "{}",
        c.summary()
    );

    let missing = dir.path().join("missing.md");
    let (line, key, message) = invalid(&format!(
        "[host]\nid = \"r\"\n\n[agent]\nmanual_file = {:?}\n",
        missing.display().to_string()
    ));
    assert_eq!((line, key.as_str()), (Some(5), "agent.manual_file"));
    assert!(message.contains("missing.md"), "{message}");

    let (line, key, message) = invalid(&format!(
        "[agent]\nmanual_max_bytes = 10\nmanual_file = {:?}\n",
        path.display().to_string()
    ));
    assert_eq!((line, key.as_str()), (Some(3), "agent.manual_file"));
    assert!(
        message.contains("more than agent.manual_max_bytes (10)"),
        "{message}"
    );
    assert!(message.contains("AGENTS.md"), "{message}");

    let (_, key, _) = invalid("[agent]\nembodiment_max_tokens = 10\n");
    assert_eq!(key, "agent.embodiment_max_tokens");
    let (_, key, _) = invalid("[agent]\nmanual_max_bytes = 0\n");
    assert_eq!(key, "agent.manual_max_bytes");
}

#[test]
fn without_a_manual_file_the_default_path_or_the_builtin_rover_manual_applies() {
    let default = std::path::Path::new(crate::config::types::DEFAULT_MANUAL_PATH);
    let file = parse("[host]\nid = \"r\"\n").unwrap();
    // What `rozd run` without a configuration loads.
    let builtin = Config::builtin().unwrap();
    // A test's configuration text is not the rover: no rover manual.
    let text = Config::parse(BUILTIN_CONFIG, ConfigSource::BuiltIn).unwrap();
    if default.exists() {
        // A machine with rozd installed: the operator's file wins.
        assert_eq!(file.manual.unwrap().path, default);
        assert_eq!(builtin.manual.unwrap().path, default);
    } else {
        // Missing default: a warning, not an error.
        assert!(file.manual.is_none());
        assert!(text.manual.is_none());
        assert!(
            file.warnings()
                .iter()
                .any(|w| w.starts_with("agent.manual_file"))
        );
        let manual = builtin.manual.clone().expect("the rover manual");
        assert_eq!(manual.text, BUILTIN_MANUAL);
        assert!(
            builtin
                .warnings()
                .iter()
                .all(|w| !w.starts_with("agent.manual_file"))
        );
    }
}

// ------------------------------------------------------------ the embodiment

use crate::config::types::ToolCategory;
use crate::session::embodiment::{Embodiment, EmbodimentView};
use crate::session::permissions::PermissionPolicy;
use crate::tools::ToolSpec;

fn rover_config(text: &str) -> Config {
    Config::parse(text, ConfigSource::BuiltIn).expect("valid config")
}

fn view(config: &Config) -> EmbodimentView {
    let policy = PermissionPolicy::new(config.permissions.clone(), &config.approvals);
    let tools: Vec<ToolSpec> = config
        .actuators
        .iter()
        .map(|a| ToolSpec {
            name: a.name.clone(),
            description: String::new(),
            parameters_schema: serde_json::json!({}),
            timeout_ms: 1234,
            category: ToolCategory::Physical,
        })
        .chain(std::iter::once(ToolSpec {
            name: "observe".into(),
            description: String::new(),
            parameters_schema: serde_json::json!({}),
            timeout_ms: 1000,
            category: ToolCategory::Pure,
        }))
        .collect();
    EmbodimentView::from_config(config.robot(), &tools, &policy)
}

#[test]
fn the_builtin_rover_is_described_with_every_limit_and_rule() {
    let c = rover_config(BUILTIN_CONFIG);
    let e = Embodiment::render(view(&c), 2000);
    let md = &e.markdown;
    assert_eq!(e.sensors_omitted, 0, "{md}");
    assert!(e.tokens <= 2000);
    assert!(md.contains("`drive_speed` (m/s)"), "{md}");
    assert!(md.contains("range -0.5 to 0.5 m/s"), "{md}");
    assert!(md.contains("safe value 0 m/s"), "{md}");
    assert!(md.contains("holds at most 20000 ms"), "{md}");
    assert!(md.contains("at most 20 commands/s"), "{md}");
    assert!(md.contains("checked against `wheel_speed`"), "{md}");
    assert!(md.contains("range -90 to 90 deg/s"), "{md}");
    assert!(md.contains("call budget 1234 ms"), "{md}");
    assert!(md.contains("needs approval"), "{md}");
    assert!(
        md.contains("`front_distance` (m): alarm critical below 0.3 m, warn below 0.5 m"),
        "{md}"
    );
    assert!(md.contains("stale after 1000 ms"), "{md}");
    assert!(
        md.contains(
            "`stop_before_obstacle`: when `front_distance < 0.3 and drive_speed > 0` holds"
        ),
        "{md}"
    );
    assert!(md.contains("`front_camera` (sim)"), "{md}");
    assert!(
        md.contains("Need a person's approval: `drive_speed`, `turn_rate`, `gripper`"),
        "{md}"
    );
    let json = serde_json::to_value(&e).expect("serialises");
    assert_eq!(json["actuators"][0]["min"], -0.5);
    assert_eq!(json["actuators"][0]["feedback"]["on_mismatch"], "safe");
    assert_eq!(json["rules"][0]["name"], "stop_before_obstacle");
}

#[test]
fn stop_inputs_and_policies_come_from_the_config() {
    let text = format!(
        "{BUILTIN_CONFIG}\n[safety]\nestop_gpio_pin = 17\n\n[[permissions]]\ntool_pattern = \"gripper\"\npolicy = \"allow\"\n\n[[permissions]]\ntool_pattern = \"turn_rate\"\npolicy = \"block\"\n"
    );
    let e = Embodiment::render(view(&rover_config(&text)), 2000);
    assert!(
        e.markdown.contains("GPIO pin 17 (active low)"),
        "{}",
        e.markdown
    );
    assert!(
        e.markdown
            .contains("Need a person's approval: `drive_speed` "),
        "{}",
        e.markdown
    );
    assert!(
        e.markdown.contains("Blocked: `turn_rate`."),
        "{}",
        e.markdown
    );
}

#[test]
fn two_hundred_sensors_stay_under_the_budget_and_point_at_observe() {
    let mut text = String::from("[host]\nid = \"big\"\nenvironment_id = \"lab\"\n");
    for i in 0..200 {
        text.push_str(&format!(
            "\n[[sensors]]\nname = \"temperature_{i}\"\nsource = \"sim\"\nunit = \"degC\"\nwarn_max = 70.0\ncritical_max = 85.0\nstale_after_ms = 1000\n"
        ));
    }
    text.push_str(
        "\n[[actuators]]\nname = \"fan\"\nkind = \"sim\"\nmin = 0.0\nmax = 1.0\nsafe_value = 1.0\n",
    );
    let c = rover_config(&text);
    let full = Embodiment::render(view(&c), u32::MAX);
    assert!(
        full.tokens > 2000,
        "the full text must exceed the budget: {}",
        full.tokens
    );
    let e = Embodiment::render(view(&c), 2000);
    assert!(e.tokens <= 2000, "{} tokens", e.tokens);
    assert!(e.sensors_omitted > 0 && e.sensors_omitted < 200);
    assert!(e.markdown.contains("## Sensors (200)"));
    assert!(
        e.markdown
            .contains(&format!("... and {} more sensors", e.sensors_omitted))
    );
    assert!(e.markdown.contains("call `observe`"));
    // What keeps the robot safe is never cut.
    assert!(
        e.markdown.contains("`fan`: range 0 to 1; safe value 1"),
        "{}",
        e.markdown
    );
    // The JSON keeps every sensor.
    assert_eq!(e.view.sensors.len(), 200);
}

/// A feedback's `cross_check`: another sensor that exists, whose unit per
/// second is the command's (or a `scale`), finite positive numbers; the
/// freshness bound of a sensor without `stale_after_ms` is `settle_ms`.
#[test]
fn feedback_cross_check_is_validated_naming_the_line_and_key() {
    let with = |cross: &str| {
        format!(
            "[[sensors]]\nname = \"speed\"\nsource = \"sim\"\nunit = \"m/s\"\n\n\
             [[sensors]]\nname = \"odo\"\nsource = \"sim\"\nunit = \"m\"\nstale_after_ms = 900\n\n\
             [[actuators]]\nname = \"drive\"\nkind = \"sim\"\nunit = \"m/s\"\nmin = -1\nmax = 1\n\
             safe_value = 0\nfeedback = {{ sensor = \"speed\", tolerance = 0.02, settle_ms = 400{cross} }}\n"
        )
    };
    let plain = parse(&with("")).unwrap();
    let f = plain.hardware.actuators[0].feedback.as_ref().unwrap();
    assert_eq!(f.cross_check, None);
    assert_eq!(
        f.fresh_within,
        Some(std::time::Duration::from_millis(400)),
        "no stale_after_ms of its own: settle_ms"
    );
    let ok = parse(&with(
        ", cross_check = { sensor = \"odo\", tolerance = 0.05, magnitude = true }",
    ))
    .unwrap();
    let c = ok.hardware.actuators[0]
        .feedback
        .as_ref()
        .unwrap()
        .cross_check
        .clone()
        .unwrap();
    assert_eq!(
        (c.sensor.as_str(), c.tolerance, c.scale),
        ("odo", 0.05, 1.0)
    );
    assert_eq!(c.window, std::time::Duration::from_millis(400), "settle_ms");
    assert_eq!((c.expected_rate(-0.3), c.magnitude), (0.3, true));
    // The odometry as the feedback sensor itself: its own stale_after_ms.
    let text = with("").replace(
        "sensor = \"speed\", tolerance",
        "sensor = \"odo\", scale = 1, tolerance",
    );
    let f = parse(&text).unwrap().hardware.actuators[0]
        .feedback
        .clone()
        .unwrap();
    assert_eq!(f.fresh_within, Some(std::time::Duration::from_millis(900)));
    // A GPIO input read on its edges: no news is no change.
    let readback = "[gpio]\nbackend = \"sim\"\n[[sensors]]\nname = \"back\"\nsource = \"gpio\"\npin = 5\n\
                    [[actuators]]\nname = \"out\"\nkind = \"gpio\"\npin = 6\nsafe_value = 0\n\
                    feedback = { sensor = \"back\", tolerance = 0.5, settle_ms = 100 }\n";
    let f = parse(readback)
        .unwrap_or_else(|e| panic!("{e}"))
        .hardware
        .actuators[0]
        .feedback
        .clone()
        .unwrap();
    assert_eq!(f.fresh_within, None);
    for (cross, key, needle) in [
        (
            ", cross_check = { sensor = \"gps\", tolerance = 0.05 }",
            "actuators[0].feedback.cross_check.sensor",
            "no [[sensors]] named \"gps\"",
        ),
        (
            ", cross_check = { sensor = \"speed\", tolerance = 0.05 }",
            "actuators[0].feedback.cross_check.sensor",
            "independent",
        ),
        (
            ", cross_check = { sensor = \"odo\", tolerance = 0.05, window_ms = 0 }",
            "actuators[0].feedback.cross_check.window_ms",
            "outside 1-60000",
        ),
        (
            ", cross_check = { sensor = \"odo\", tolerance = -1 }",
            "actuators[0].feedback.cross_check.tolerance",
            "finite positive",
        ),
        (
            ", cross_check = { sensor = \"odo\", tolerance = 0.05, scale = 0 }",
            "actuators[0].feedback.cross_check.scale",
            "other than 0",
        ),
        (
            ", cross_check = { sensor = \"odo\", tolerance = 0.05, rate = 1 }",
            "actuators[0].feedback",
            "unknown field `rate`",
        ),
    ] {
        let text = with(cross);
        let (line, found, message) = invalid(&text);
        assert_eq!(line, Some(19), "{cross}: {message}");
        assert!(found.starts_with(key), "{cross}: key {found}, want {key}");
        assert!(message.contains(needle), "{cross}: {message}");
    }
    // A rate in other units than the command's needs a scale.
    let text = with(", cross_check = { sensor = \"odo\", tolerance = 0.05 }")
        .replace("unit = \"m\"\n", "unit = \"mm\"\n");
    let (_, found, message) = invalid(&text);
    assert_eq!(found, "actuators[0].feedback.cross_check.sensor");
    assert!(message.contains("give `scale`"), "{message}");
}

// Issue 34: the built-in rover's drive_speed feedback, its cross-check on
// odometry against the simulated world's faults, stepped tick by tick.
/// The built-in configuration, as the daemon loads it without a file.
fn parse_builtin() -> crate::config::Config {
    crate::config::Config::parse(
        crate::config::BUILTIN_CONFIG,
        crate::config::ConfigSource::BuiltIn,
    )
    .unwrap()
}

/// The built-in rover, stepped tick by tick (no clock): its
/// `drive_speed` feedback against the simulated world's `wheel_speed`
/// and `odometry`, with the sensor echoing the command and the drive
/// stuck from `stuck_at_ms` on.
fn drive_the_builtin_rover(
    spec: &crate::hw::config::FeedbackSpec,
    stuck_at_ms: u64,
    until_ms: u64,
) -> (Vec<(u64, crate::ooda::feedback::Verdict)>, Vec<f64>) {
    use crate::hw::sim_world::{Input, Quantity, SimFaults, SimWorld};
    let config = parse_builtin();
    let mut world = SimWorld::new(config.hardware.sim_world.clone().expect("[sim]"));
    let echo = SimFaults {
        echo_wheel_speed: true,
        ..SimFaults::default()
    };
    world.set_faults(echo);
    use crate::ooda::feedback::{Sample, Watch};
    use std::time::Duration;
    use tokio::time::Instant;
    let ms = Duration::from_millis;
    let fresh = |value: f64, at: Instant| Sample {
        latest: Some((value, at)),
        healthy: true,
    };
    let t0 = Instant::now();
    let tick = ms(10);
    let mut w = Watch::new(t0);
    world.set_input(Input::DriveSpeed, 0.3);
    w.command(spec, 0.3, false, t0);
    let (mut verdicts, mut range) = (Vec::new(), Vec::new());
    for k in 1..=until_ms / 10 {
        let t = k * 10;
        if t == stuck_at_ms {
            world.set_faults(SimFaults {
                stuck_drive: true,
                ..echo
            });
        }
        world.step(tick);
        let at = t0 + ms(t);
        let speed = fresh(world.read(Quantity::WheelSpeed), at);
        let odometry = fresh(world.read(Quantity::Odometry), at);
        range.push(world.read(Quantity::FrontDistance));
        if let Some(v) = w.step_checked(spec, speed, Some(odometry), at) {
            verdicts.push((t, v));
        }
    }
    (verdicts, range)
}

#[test]
fn the_builtin_drive_speed_catches_an_echoing_wheel_speed_once_the_world_disagrees() {
    use crate::hw::config::FeedbackSpec;
    use crate::ooda::feedback::{FeedbackStatus, MismatchAction, Watch};
    let config = parse_builtin();
    let drive = config
        .hardware
        .actuators
        .iter()
        .find(|a| a.name == "drive_speed")
        .unwrap();
    let spec = drive.feedback.clone().expect("drive_speed has feedback");
    assert_eq!(spec.sensor, "wheel_speed");
    assert_eq!(
        spec.cross_check.as_ref().map(|c| c.sensor.as_str()),
        Some("odometry")
    );
    let (verdicts, range) = drive_the_builtin_rover(&spec, 2000, 4000);
    // Moving: the range falls and the echo confirms.
    assert_eq!(verdicts[0].1.status, FeedbackStatus::Confirmed);
    assert!(range[199] < range[0] - 0.5, "{} {}", range[0], range[199]);
    // Stuck from 2 s: the range stops falling, the speed still reads
    // 0.3, and the cross-check calls it a mismatch within its window,
    // settle_ms and a tick.
    assert!((range[399] - range[210]).abs() < 1e-9);
    let (t, mismatch) = verdicts
        .iter()
        .find(|(_, v)| v.status == FeedbackStatus::Mismatch)
        .unwrap_or_else(|| panic!("no mismatch in {verdicts:?}"));
    assert!(
        *t <= 2000
            + (spec.cross_check.as_ref().unwrap().window + spec.settle).as_millis() as u64
            + 10,
        "mismatch at {t} ms"
    );
    assert_eq!(mismatch.measured, Some(0.3), "the echo");
    assert!(mismatch.reason.contains("cross-check"));
    // What on_mismatch = "safe" then does.
    assert_eq!(
        Watch::action(&spec, mismatch, false),
        Some(MismatchAction::DriveSafe)
    );
    // Without the cross-check the echo hides it: nothing but confirmed.
    let blind = FeedbackSpec {
        cross_check: None,
        ..spec.clone()
    };
    let (verdicts, _) = drive_the_builtin_rover(&blind, 2000, 4000);
    assert!(
        verdicts
            .iter()
            .all(|(_, v)| v.status == FeedbackStatus::Confirmed),
        "{verdicts:?}"
    );
}

#[test]
fn foxglove_keys_are_bounded_and_its_own_port_follows_the_servers_rules() {
    let c = parse("").unwrap().foxglove;
    assert!(c.enabled && c.listen.is_none());
    for (key, bad, why) in [
        ("max_clients", "0", "between 1 and 1000"),
        ("send_buffer", "0", "between 1 and 65536"),
        ("max_hz", "0", "between 0.1 and 1000"),
        ("max_message_kb", "70000", "between 1 and 65536"),
        ("send_timeout_secs", "0", "between 1 and 3600"),
    ] {
        let (line, k, message) = invalid(&format!("[foxglove]\n{key} = {bad}\n"));
        assert_eq!(
            (line, k.as_str()),
            (Some(2), format!("foxglove.{key}").as_str())
        );
        assert!(message.contains(why), "{message}");
    }
    assert!(parse("[foxglove]\nlisten = \"127.0.0.1:8765\"\n").is_ok());
    // A non-loopback port of its own needs tokens, like server.listen.
    let (_, key, message) = invalid("[foxglove]\nlisten = \"0.0.0.0:8765\"\n");
    assert_eq!(key, "foxglove.listen");
    assert!(message.contains("no auth tokens"), "{message}");
}
