//! The OODA loop over the simulated and GPIO-sim backends: observe, orient
//! (alarms, staleness), decide (reflex rules), act (limits, rate, hold,
//! protective stop, safe state at start and shutdown).

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::TestDaemon;
use rozd::ooda::act::{ActError, Origin};
use rozd::ooda::{Observation, Ooda};

async fn until(
    ooda: &Ooda,
    bound: Duration,
    pred: impl Fn(&Observation) -> bool,
) -> Arc<Observation> {
    common::observed(ooda, bound, "the condition", pred).await
}

const LONG: Duration = Duration::from_secs(24 * 3600);

const ROBOT: &str = r#"
[ooda]
tick_hz = 50

[[sensors]]
name = "distance"
source = "sim"
unit = "m"
signal = "constant"
offset = 0.2
rate_hz = 20
warn_min = 0.5
critical_min = 0.3
stale_after_ms = 1000

[[sensors]]
name = "door"
source = "gpio"
pin = 17
pull = "up"
active = "low"
debounce_ms = 20
stale_after_ms = 5000

[[actuators]]
name = "speed"
kind = "sim"
unit = "m/s"
min = -1.0
max = 1.0
safe_value = 0.0
max_rate_hz = 10
hold_ms = 2000

[[actuators]]
name = "lamp"
kind = "gpio"
pin = 22
safe_value = 0

[[actuators]]
name = "brake"
kind = "sim"
allowed = [0, 1]
safe_value = 1
"#;

async fn robot(extra: &str) -> TestDaemon {
    TestDaemon::setup(&format!("{ROBOT}\n[gpio]\nbackend = \"sim\"\n{extra}"))
        .paused_clock()
        .start()
        .await
}

/// [`robot`] for tests on tokio's paused clock: the loop ticks on the
/// runtime's clock (its own thread would tick in real time).
async fn robot_on_paused_clock(extra: &str) -> TestDaemon {
    let robot = ROBOT.replacen("[ooda]\n", "[ooda]\ntimer = \"runtime\"\n", 1);
    TestDaemon::setup(&format!("{robot}\n[gpio]\nbackend = \"sim\"\n{extra}"))
        .paused_clock()
        .start()
        .await
}

#[tokio::test]
async fn observation_over_rest_shows_values_alarms_and_safe_actuators() {
    let daemon = robot("").await;
    let ooda = daemon.host.ooda().clone();
    until(&ooda, common::EXPECT_WITHIN, |o| {
        o.sensor("distance")
            .is_some_and(|s| s.sensor.value.is_some())
    })
    .await;
    let addr = daemon.addr.to_string();
    let reply = rozd::cli::client::get(&addr, "/v1/observation", None)
        .await
        .unwrap();
    assert_eq!(reply.status, 200);
    let v: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    let distance = v["sensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "distance")
        .unwrap();
    assert_eq!(distance["value"], 0.2);
    assert_eq!(distance["unit"], "m");
    assert_eq!(distance["health"], "ok");
    assert_eq!(distance["alarm"], "critical");
    let speed = v["actuators"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "speed")
        .unwrap();
    assert_eq!(
        (speed["value"].as_f64(), speed["at_safe_value"].as_bool()),
        (Some(0.0), Some(true))
    );
    assert!(v["protective_stop"].is_null());

    let one = rozd::cli::client::get(&addr, "/v1/sensors/distance", None)
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&one.body).unwrap();
    assert!(!v["history"].as_array().unwrap().is_empty());
    assert_eq!(v["stale_after_ms"], 1000);
    let missing = rozd::cli::client::get(&addr, "/v1/sensors/nope", None)
        .await
        .unwrap();
    assert_eq!(missing.status, 404);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&missing.body).unwrap()["error"]["code"],
        "not_found"
    );

    let status: serde_json::Value = serde_json::from_str(
        &rozd::cli::client::get(&addr, "/v1/status", None)
            .await
            .unwrap()
            .body,
    )
    .unwrap();
    assert_eq!(status["ooda"]["tick_hz"], 50.0);
    assert!(status["ooda"]["ticks"].as_u64().unwrap() > 0);
    assert!(status["ooda"]["lateness_p99_us"].is_u64());
    // The tick runs on its own thread by default, and says so.
    assert_eq!(status["ooda"]["timer"], "thread");
    for key in ["lateness_p999_us", "tick_exec_p99_us", "window_ticks"] {
        assert!(status["ooda"][key].is_u64(), "{key}: {status}");
    }
    daemon.shutdown().await;
}

#[tokio::test]
async fn every_actuator_is_driven_safe_at_start_up() {
    let daemon = robot("").await;
    let ooda = daemon.host.ooda();
    assert_eq!(daemon.host.sim_actuator("speed").unwrap().history(), [0.0]);
    assert_eq!(daemon.host.sim_actuator("brake").unwrap().history(), [1.0]);
    assert_eq!(ooda.sim_gpio().unwrap().level(22), Some(false));
    daemon.shutdown().await;
}

#[tokio::test]
async fn shutdown_drives_commanded_actuators_safe() {
    let daemon = robot("").await;
    let ooda = daemon.host.ooda().clone();
    let speed = daemon.host.sim_actuator("speed").unwrap();
    ooda.actuators()
        .command("speed", 0.4, Origin::Operator("test".into()), None)
        .await
        .unwrap();
    ooda.actuators()
        .command("lamp", 1.0, Origin::Operator("test".into()), None)
        .await
        .unwrap();
    assert_eq!(speed.value(), Some(0.4));
    assert_eq!(ooda.sim_gpio().unwrap().level(22), Some(true));
    daemon.shutdown().await;
    assert_eq!(speed.value(), Some(0.0));
    assert_eq!(ooda.sim_gpio().unwrap().level(22), Some(false));
}

#[tokio::test]
async fn out_of_range_non_finite_and_disallowed_values_are_refused_not_clamped() {
    let daemon = robot("").await;
    let act = daemon.host.ooda().actuators().clone();
    let origin = || Origin::Operator("test".into());
    for (name, value, needle) in [
        ("speed", 1.5, "outside the allowed values [-1, 1]"),
        ("speed", f64::NAN, "not a finite number"),
        ("speed", f64::INFINITY, "not a finite number"),
        ("brake", 0.5, "one of {0, 1}"),
        ("lamp", 2.0, "one of {0, 1}"),
    ] {
        match act.command(name, value, origin(), None).await {
            Err(ActError::SafetyViolation { reason, .. }) => {
                assert!(reason.contains(needle), "{name} {value}: {reason}")
            }
            other => panic!("{name} {value}: expected a safety violation, got {other:?}"),
        }
    }
    assert_eq!(
        daemon.host.sim_actuator("speed").unwrap().history(),
        [0.0],
        "nothing reached the driver"
    );
    assert!(matches!(
        act.command("warp_drive", 1.0, origin(), None).await,
        Err(ActError::Unknown(_))
    ));
    daemon.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn rate_limit_refuses_commands_that_come_too_fast() {
    let daemon = robot_on_paused_clock("").await;
    let act = daemon.host.ooda().actuators().clone();
    let origin = || Origin::Operator("test".into());
    act.command("speed", 0.1, origin(), None).await.unwrap();
    let err = act.command("speed", 0.2, origin(), None).await.unwrap_err();
    assert!(
        err.to_string().contains("rate limit of 10 commands/s"),
        "{err}"
    );
    tokio::time::advance(Duration::from_millis(100)).await;
    act.command("speed", 0.2, origin(), None).await.unwrap();
    daemon.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn hold_expiry_returns_the_actuator_to_safe() {
    let daemon = robot_on_paused_clock("").await;
    let ooda = daemon.host.ooda().clone();
    let applied = ooda
        .actuators()
        .command("speed", 0.3, Origin::Operator("t".into()), None)
        .await
        .unwrap();
    assert_eq!(applied.hold_ms, Some(2000));
    let commanded_at = tokio::time::Instant::now();
    let sim = daemon.host.sim_actuator("speed").unwrap();
    until(&ooda, LONG, |o| {
        o.actuators
            .iter()
            .any(|a| a.name == "speed" && !a.at_safe_value)
    })
    .await;
    until(&ooda, LONG, |o| {
        o.actuators
            .iter()
            .any(|a| a.name == "speed" && a.at_safe_value)
    })
    .await;
    assert!(commanded_at.elapsed() >= Duration::from_millis(2000));
    assert_eq!(sim.value(), Some(0.0));
    // A shorter hold asked by the caller is honoured; a longer one is not.
    let applied = ooda
        .actuators()
        .command(
            "speed",
            0.3,
            Origin::Operator("t".into()),
            Some(Duration::from_secs(60)),
        )
        .await
        .unwrap();
    assert_eq!(applied.hold_ms, Some(2000));
    daemon.shutdown().await;
}

#[tokio::test]
async fn protective_stop_drives_safe_refuses_commands_and_clearing_moves_nothing() {
    let daemon = robot("").await;
    let ooda = daemon.host.ooda().clone();
    let act = ooda.actuators().clone();
    act.command("speed", 0.5, Origin::Operator("t".into()), None)
        .await
        .unwrap();
    act.command("brake", 0.0, Origin::Operator("t".into()), None)
        .await
        .unwrap();
    ooda.trigger_stop(rozd::safety::StopRequest::new(
        &rozd::safety::StopSource::Rest,
        "operator pressed stop",
    ))
    .await;
    assert_eq!(
        daemon.host.sim_actuator("speed").unwrap().value(),
        Some(0.0)
    );
    assert_eq!(
        daemon.host.sim_actuator("brake").unwrap().value(),
        Some(1.0)
    );
    let err = act
        .command("speed", 0.1, Origin::Operator("t".into()), None)
        .await
        .unwrap_err();
    assert!(matches!(err, ActError::EStop { .. }), "{err}");
    let obs = until(&ooda, common::EXPECT_WITHIN, |o| {
        o.protective_stop.is_some()
    })
    .await;
    assert_eq!(obs.protective_stop.as_ref().unwrap().source, "rest");
    let before = daemon.host.sim_actuator("speed").unwrap().history().len();
    assert_eq!(
        ooda.protective_stop()
            .clear(rozd::safety::ClearRequest::all("test"))
            .await,
        Ok(true)
    );
    assert_eq!(
        daemon.host.sim_actuator("speed").unwrap().history().len(),
        before,
        "clearing moves nothing"
    );
    act.command("brake", 0.0, Origin::Operator("t".into()), None)
        .await
        .unwrap();
    daemon.shutdown().await;
}

#[tokio::test]
async fn reflex_rule_commands_an_actuator_without_any_model() {
    let daemon = robot(
        "[[rules]]\nname = \"too_close\"\nwhen = \"distance < 0.3 and brake == 0\"\nthen = { actuator = \"brake\", value = 1 }\n",
    )
    .await;
    let ooda = daemon.host.ooda().clone();
    ooda.actuators()
        .command("brake", 0.0, Origin::Operator("t".into()), None)
        .await
        .unwrap();
    let brake = daemon.host.sim_actuator("brake").unwrap();
    // start-up safe value, our release, the rule's command
    until(&ooda, common::EXPECT_WITHIN, |_| {
        brake.history() == [1.0, 0.0, 1.0]
    })
    .await;
    let obs = until(&ooda, common::EXPECT_WITHIN, |o| {
        o.actuators
            .iter()
            .any(|a| a.name == "brake" && a.value == 1.0)
    })
    .await;
    assert!(obs.seq > 0);
    daemon.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_sensor_that_stops_sending_goes_stale_and_a_rule_reacts() {
    let daemon = robot_on_paused_clock("[[rules]]\nname = \"door_silent\"\nwhen = \"stale(door)\"\nfor_ms = 100\nthen = { estop = true, reason = \"door sensor silent\" }\n").await;
    let ooda = daemon.host.ooda().clone();
    let obs = until(&ooda, LONG, |o| {
        o.sensor("door")
            .is_some_and(|s| s.sensor.health == rozd::hw::HealthKind::Ok)
    })
    .await;
    let fresh_at = tokio::time::Instant::now();
    assert_eq!(
        obs.sensor("door").unwrap().sensor.value,
        Some(0.0),
        "pulled up, active low: closed = 0"
    );
    let obs = until(&ooda, LONG, |o| o.protective_stop.is_some()).await;
    assert!(fresh_at.elapsed() >= Duration::from_millis(5000));
    assert_eq!(
        obs.sensor("door").unwrap().sensor.health,
        rozd::hw::HealthKind::Stale
    );
    let stop = obs.protective_stop.clone().unwrap();
    assert_eq!(
        (stop.source.as_str(), stop.reason.as_str()),
        ("rule:door_silent", "door sensor silent")
    );
    daemon.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn gpio_input_is_debounced_and_honours_the_active_level() {
    let daemon = robot_on_paused_clock("").await;
    let ooda = daemon.host.ooda().clone();
    let chip = ooda.sim_gpio().expect("sim backend");
    until(&ooda, LONG, |o| {
        o.sensor("door")
            .is_some_and(|s| s.sensor.value == Some(0.0))
    })
    .await;
    // A bounce shorter than debounce_ms: low then straight back high.
    chip.set_level(17, false);
    chip.set_level(17, true);
    tokio::time::advance(Duration::from_millis(50)).await;
    let (_, history) = ooda
        .world()
        .sensor("door", tokio::time::Instant::now())
        .unwrap();
    assert!(
        history.iter().all(|s| s.value == 0.0),
        "the bounce was not recorded: {history:?}"
    );
    // A real press: active low -> 1.0.
    chip.set_level(17, false);
    until(&ooda, LONG, |o| {
        o.sensor("door")
            .is_some_and(|s| s.sensor.value == Some(1.0))
    })
    .await;
    daemon.shutdown().await;
}

#[test]
fn rules_are_type_checked_at_config_load_naming_the_line() {
    let text = "[[sensors]]\nname = \"d\"\nsource = \"sim\"\n\n[[rules]]\nname = \"r\"\nwhen = \"distance < 3\"\nthen = { estop = true }\n";
    let err = rozd::config::Config::parse(
        text,
        rozd::config::ConfigSource::File("/etc/rozd/r.toml".into()),
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("/etc/rozd/r.toml:7: key `rules[0].when`"),
        "{msg}"
    );
    assert!(
        msg.contains("unknown sensor or actuator `distance`"),
        "{msg}"
    );
}

#[tokio::test]
async fn an_absurd_hold_from_a_caller_does_not_overflow() {
    let daemon = robot("").await;
    let act = daemon.host.ooda().actuators().clone();
    let applied = act
        .command(
            "brake",
            0.0,
            Origin::Operator("t".into()),
            Some(Duration::from_millis(u64::MAX)),
        )
        .await
        .unwrap();
    assert_eq!(applied.value, 0.0);
    // The configured hold (2 s) still bounds a caller's absurd one.
    let applied = act
        .command(
            "speed",
            0.2,
            Origin::Operator("t".into()),
            Some(Duration::from_millis(u64::MAX)),
        )
        .await
        .unwrap();
    assert_eq!(applied.hold_ms, Some(2000));
    daemon.shutdown().await;
}

#[tokio::test]
async fn a_real_time_setting_that_cannot_apply_keeps_the_daemon_from_starting() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[store]\npath = {:?}\n{ROBOT}\n[gpio]\nbackend = \"sim\"\n",
        dir.path().join("rozd.db").display().to_string()
    )
    // No machine this runs on has a CPU 1000: pinning must fail, loudly.
    .replace("tick_hz = 50", "tick_hz = 50\ncpu_affinity = [1000]");
    let config = rozd::config::Config::parse(&text, rozd::config::ConfigSource::BuiltIn)
        .expect("valid config");
    let err = match rozd::daemon::Daemon::bind(config).await {
        Ok(_) => panic!("started although the loop could not be pinned"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("ooda.cpu_affinity"), "{err}");
}
