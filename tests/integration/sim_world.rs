//! The built-in host's simulated world closes the loop: what the rover is
//! told moves it, its sensors read the result, the shipped reflex rule stops
//! it before the wall. On tokio's paused clock, so the figures are exact.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{Session, TestDaemon};
use rozd::api::proto;
use rozd::api::proto::session_request::Request as Req;
use rozd::api::proto::session_response::Response as Resp;
use rozd::config::{BUILTIN_CONFIG, Config, ConfigSource};
use rozd::ooda::act::Origin;
use rozd::ooda::{Observation, Ooda};

const LONG: Duration = Duration::from_secs(24 * 3600);
/// The built-in rover starts 4.85 m from the far wall (room 6 m, rover at
/// x = 1 with radius 0.15).
const START_RANGE: f64 = 4.85;
/// The built-in loop's tick: 50 Hz, an Observation every tick.
const TICK_S: f64 = 0.02;

/// The built-in configuration on an ephemeral port with a store of its own,
/// `edit` applied to its text first.
async fn rover(edit: impl FnOnce(&str) -> String, paused: bool) -> TestDaemon {
    let dir = tempfile::tempdir().unwrap();
    // No HTTP/2 pings (they would run on a paused clock too); paused, the
    // loop ticks on the runtime's (paused) clock.
    let text = format!(
        "{}\n[store]\npath = {:?}\n[ooda]\ntimer = {:?}\n",
        edit(BUILTIN_CONFIG).replace(
            "listen = \"127.0.0.1:8080\"",
            "listen = \"127.0.0.1:0\"\nhttp2_keepalive_secs = 0"
        ),
        dir.path().join("rozd.db").display().to_string(),
        if paused { "runtime" } else { "thread" }
    );
    let config = Config::parse(&text, ConfigSource::BuiltIn).expect("built-in config");
    TestDaemon::start_with(config, dir).await
}

fn without_rules(text: &str) -> String {
    let cut = text
        .find("[[rules]]")
        .expect("the built-in config has a rule");
    text[..cut].to_string()
}

async fn until(ooda: &Ooda, pred: impl Fn(&Observation) -> bool) -> Arc<Observation> {
    common::observed(ooda, LONG, "the condition", pred).await
}

fn value(obs: &Observation, sensor: &str) -> f64 {
    obs.sensor(sensor)
        .and_then(|s| s.sensor.value)
        .unwrap_or_else(|| panic!("{sensor} has no value in #{}", obs.seq))
}

fn actuator(obs: &Observation, name: &str) -> f64 {
    obs.actuators
        .iter()
        .find(|a| a.name == name)
        .map(|a| a.value)
        .unwrap_or_else(|| panic!("no actuator {name}"))
}

async fn drive(ooda: &Ooda, speed: f64) {
    ooda.actuators()
        .command("drive_speed", speed, Origin::Operator("test".into()), None)
        .await
        .expect("command accepted");
}

#[tokio::test(start_paused = true)]
async fn commanding_a_speed_changes_the_range_at_exactly_that_rate() {
    let daemon = rover(without_rules, true).await;
    let ooda = daemon.host.ooda().clone();
    let at_rest = until(&ooda, |o| {
        o.sensor("front_distance")
            .is_some_and(|s| s.sensor.value.is_some())
    })
    .await;
    assert!((value(&at_rest, "front_distance") - START_RANGE).abs() < 1e-9);
    drive(&ooda, 0.3).await;
    // Two Observations while moving, some ticks apart.
    let first = until(&ooda, |o| value(o, "front_distance") < START_RANGE - 0.1).await;
    let second = until(&ooda, |o| o.seq >= first.seq + 50).await;
    let ticks = (second.seq - first.seq) as f64;
    let fell = value(&first, "front_distance") - value(&second, "front_distance");
    assert!(
        (fell - 0.3 * TICK_S * ticks).abs() < 1e-9,
        "fell {fell} m in {ticks} ticks"
    );
    // What it travelled is what the range lost; it is still heading +x.
    let travelled = value(&second, "odometry");
    assert!((START_RANGE - value(&second, "front_distance") - travelled).abs() < 1e-9);
    let sim = second.sim.clone().expect("the Observation shows the world");
    assert!((sim.x - (1.0 + travelled)).abs() < 1e-9 && sim.y == 2.0);
    assert_eq!((sim.collisions, sim.bumper), (0, false));
    daemon.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn the_shipped_rule_stops_the_rover_at_0_3_m() {
    let daemon = rover(str::to_string, true).await;
    let ooda = daemon.host.ooda().clone();
    until(&ooda, |o| {
        o.sensor("front_distance")
            .is_some_and(|s| s.sensor.value.is_some())
    })
    .await;
    drive(&ooda, 0.3).await;
    let moving = until(&ooda, |o| actuator(o, "drive_speed") == 0.3).await;
    let stopped = until(&ooda, |o| {
        o.seq > moving.seq && actuator(o, "drive_speed") == 0.0
    })
    .await;
    // Let it settle: the range no longer changes.
    let later = until(&ooda, |o| o.seq >= stopped.seq + 100).await;
    let range = value(&later, "front_distance");
    let one_tick = 0.3 * TICK_S;
    assert!(
        (0.3 - one_tick - 1e-9..0.3).contains(&range),
        "stopped at {range} m"
    );
    assert_eq!(
        value(&later, "front_distance"),
        value(&stopped, "front_distance")
    );
    // Start-up's safe value, our command, the rule's stop: nothing else.
    let driver = daemon.host.sim_actuator("drive_speed").unwrap();
    assert_eq!(driver.history(), [0.0, 0.3, 0.0]);
    assert_eq!(value(&later, "bumper"), 0.0);
    assert_eq!(later.sim.as_ref().map(|s| s.collisions), Some(0));
    daemon.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn without_the_rule_the_rover_bumps_into_the_wall_and_a_collision_is_counted() {
    let daemon = rover(without_rules, true).await;
    let ooda = daemon.host.ooda().clone();
    until(&ooda, |o| {
        o.sensor("front_distance")
            .is_some_and(|s| s.sensor.value.is_some())
    })
    .await;
    drive(&ooda, 0.3).await;
    let bumped = until(&ooda, |o| value(o, "bumper") == 1.0).await;
    assert_eq!(value(&bumped, "front_distance"), 0.0);
    assert!((value(&bumped, "odometry") - START_RANGE).abs() < 1e-9);
    // Pressed against the wall, it stays one collision.
    let later = until(&ooda, |o| o.seq >= bumped.seq + 50).await;
    assert_eq!(value(&later, "bumper"), 1.0);
    assert_eq!(later.sim.as_ref().map(|s| s.collisions), Some(1));
    let (status, body) = common::rest_get(&daemon, "/v1/status").await;
    assert_eq!(status, 200);
    assert_eq!(body["sim"]["collisions"], 1, "{body}");
    assert_eq!(body["sim"]["bumper"], true, "{body}");
    daemon.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn the_battery_drains_faster_and_the_motor_heats_at_speed() {
    let daemon = rover(without_rules, true).await;
    let ooda = daemon.host.ooda().clone();
    let start = until(&ooda, |o| {
        o.sensor("battery_voltage")
            .is_some_and(|s| s.sensor.value.is_some())
    })
    .await;
    // 10 s at rest.
    let rested = until(&ooda, |o| o.seq >= start.seq + 500).await;
    // 10 s at 0.3 m/s (3 m: short of the wall), then stopped (no sag).
    drive(&ooda, 0.3).await;
    let moving = until(&ooda, |o| actuator(o, "drive_speed") == 0.3).await;
    let hot = until(&ooda, |o| o.seq >= moving.seq + 500).await;
    drive(&ooda, 0.0).await;
    let after = until(&ooda, |o| {
        o.seq > hot.seq && actuator(o, "drive_speed") == 0.0
    })
    .await;
    let at_rest = value(&start, "battery_voltage") - value(&rested, "battery_voltage");
    let driving = value(&rested, "battery_voltage") - value(&after, "battery_voltage");
    assert!(at_rest > 0.0, "the battery drains at rest too");
    // The built-in rover draws four times its idle drain at 0.3 m/s.
    assert!(
        driving > 3.0 * at_rest,
        "rest {at_rest} V, driving {driving} V"
    );
    assert!(value(&hot, "motor_temperature") > value(&rested, "motor_temperature") + 1.0);
    assert_eq!(
        value(&rested, "motor_temperature"),
        25.0,
        "at rest it stays at ambient"
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn an_ooda_session_sees_the_range_it_caused_in_the_next_observation() {
    let allow = |text: &str| {
        format!("{text}\n[[permissions]]\ntool_pattern = \"drive_speed\"\npolicy = \"allow\"\n")
    };
    let daemon = rover(allow, false).await;
    let mut client = daemon.agent().await;
    let mut session = Session::open(&mut client).await;
    session.start(proto::StartSession::default()).await;
    for (message, expect) in [("set drive_speed 0.3", None), ("context", Some(()))] {
        session
            .send(Req::UserMessage(proto::UserMessage {
                content: message.into(),
                ai_mode: Some("ooda_re_act".into()),
                ..Default::default()
            }))
            .await;
        let mut text = String::new();
        loop {
            match session.next().await {
                Resp::TextDelta(d) => text.push_str(&d.content),
                Resp::TurnComplete(_) => break,
                _ => {}
            }
        }
        if expect.is_none() {
            assert!(!text.contains("error"), "{text}");
            // The next cycle starts once the rover has visibly moved.
            until(daemon.host.ooda(), |o| {
                value(o, "front_distance") < START_RANGE - 0.05
            })
            .await;
            continue;
        }
        // The cycle's Observation: the range fell by what the rover drove.
        let read = |name: &str| -> f64 {
            let at = text
                .find(&format!("sensor {name} = "))
                .unwrap_or_else(|| panic!("{name} not in the context: {text}"));
            text[at..]
                .split_whitespace()
                .nth(3)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name}: no value in {text}"))
        };
        let (range, travelled) = (read("front_distance"), read("odometry"));
        assert!(range < START_RANGE && travelled > 0.0, "{text}");
        assert!((range + travelled - START_RANGE).abs() < 2e-4, "{text}");
    }
    drop(session);
    daemon.shutdown().await;
}

#[test]
fn world_sensors_and_actuators_are_validated_naming_the_key() {
    let sensor = "[[sensors]]\nname = \"range\"\nsource = \"sim\"\n";
    let actuator =
        "[[actuators]]\nname = \"speed\"\nkind = \"sim\"\nmin = -1\nmax = 1\nsafe_value = 0.0\n";
    for (text, expected) in [
        // A world sensor is read at every tick: signals and rates do not apply.
        (
            format!("{sensor}quantity = \"front_distance\"\nsignal = \"sine\"\n"),
            ":5: key `sensors[0].signal`",
        ),
        (
            format!("{sensor}quantity = \"front_distance\"\nrate_hz = 10\n"),
            ":5: key `sensors[0].rate_hz`",
        ),
        (
            format!("{sensor}quantity = \"altitude\"\n"),
            ":4: key `sensors[0].quantity`",
        ),
        (
            format!(
                "{actuator}input = \"drive_speed\"\n\n{}input = \"drive_speed\"\n",
                actuator.replace("speed", "speed2")
            ),
            ":15: key `actuators[1].input`",
        ),
        (
            format!("{actuator}input = \"warp\"\n"),
            ":7: key `actuators[0].input`",
        ),
        (
            "[[actuators]]\nname = \"lamp\"\nkind = \"gpio\"\npin = 3\nsafe_value = 0\ninput = \"gripper\"\n"
                .to_string(),
            ":6: key `actuators[0].input`",
        ),
        (
            "[sim]\nwidth_m = 6\nstart = { x = 9, y = 1 }\n".to_string(),
            ":3: key `sim.start`",
        ),
        (
            "[sim]\n[[sim.obstacles]]\nmin_x = 1\nmin_y = 1\nmax_x = 0.5\nmax_y = 2\n".to_string(),
            ":5: key `sim.obstacles[0].max_x`",
        ),
    ] {
        let err = Config::parse(&text, ConfigSource::BuiltIn)
            .expect_err(&text)
            .to_string();
        assert!(err.contains(expected), "{text}\n=> {err}");
    }
    // Without [sim], a world sensor reads the built-in room.
    let config = Config::parse(
        &format!("{sensor}quantity = \"front_distance\"\n"),
        ConfigSource::BuiltIn,
    )
    .unwrap();
    assert_eq!(
        config.hardware.sim_world,
        Some(rozd::hw::sim_world::WorldSpec::default())
    );
    // Without anything that uses it, there is no world.
    let config = Config::parse(
        &format!("{sensor}signal = \"sine\"\n"),
        ConfigSource::BuiltIn,
    )
    .unwrap();
    assert_eq!(config.hardware.sim_world, None);
}

#[tokio::test(start_paused = true)]
async fn the_same_seed_and_commands_give_the_same_observations() {
    async fn run(seed: u64) -> Vec<(u64, f64, f64)> {
        let noisy = move |text: &str| {
            without_rules(text).replace(
                "seed = 1\nrange_noise_m = 0.0",
                &format!("seed = {seed}\nrange_noise_m = 0.05"),
            )
        };
        let daemon = rover(noisy, true).await;
        let ooda = daemon.host.ooda().clone();
        let mut rx = ooda.subscribe();
        let mut seen = Vec::new();
        while seen.len() < 100 {
            rx.changed().await.unwrap();
            let obs = rx.borrow_and_update().clone();
            if obs.seq == 20 {
                drive(&ooda, 0.2).await;
            }
            if obs
                .sensor("front_distance")
                .and_then(|s| s.sensor.value)
                .is_some()
            {
                seen.push((
                    obs.seq,
                    value(&obs, "front_distance"),
                    value(&obs, "odometry"),
                ));
            }
        }
        daemon.shutdown().await;
        seen
    }
    let first = run(7).await;
    assert!(
        first.windows(2).all(|w| w[1].0 == w[0].0 + 1),
        "every tick seen"
    );
    assert_eq!(first, run(7).await);
    // The noise is real: another seed reads other ranges on the same path.
    let other = run(8).await;
    assert_ne!(first, other);
    assert!(first.iter().zip(&other).all(|(a, b)| a.2 == b.2));
}
