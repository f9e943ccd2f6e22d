//! `[sim]`: the simulated world's room, rover and physics, as written in
//! the config file, and its validation into a [`WorldSpec`].

use serde::Deserialize;

use super::sim_world::{BatterySpec, MotorSpec, Obstacle, Pose, SimFaults, WorldSpec};
use crate::config::types::Invalid;

/// The largest room side accepted, metres: a sanity bound, not physics.
const MAX_SIDE_M: f64 = 1_000.0;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimWorldConfig {
    #[serde(default)]
    pub width_m: Option<f64>,
    #[serde(default)]
    pub depth_m: Option<f64>,
    /// Boxes in the room; absent: the built-in room's crate.
    #[serde(default)]
    pub obstacles: Option<Vec<ObstacleConfig>>,
    #[serde(default)]
    pub start: Option<StartConfig>,
    #[serde(default)]
    pub rover_radius_m: Option<f64>,
    #[serde(default)]
    pub range_noise_m: Option<f64>,
    #[serde(default)]
    pub max_range_m: Option<f64>,
    #[serde(default)]
    pub seed: Option<u64>,
    /// Where the object the gripper can pick up lies; `[]` for none.
    #[serde(default)]
    pub object: Option<Vec<f64>>,
    #[serde(default)]
    pub battery: Option<BatteryConfig>,
    #[serde(default)]
    pub motor: Option<MotorConfig>,
    /// `[sim.faults]`: a stuck or slipping drive, an echoing speed sensor.
    #[serde(default)]
    pub faults: Option<SimFaults>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObstacleConfig {
    pub min_x: f64,
    pub min_y: f64,
    pub max_x: f64,
    pub max_y: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartConfig {
    pub x: f64,
    pub y: f64,
    #[serde(default)]
    pub heading_deg: f64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatteryConfig {
    pub full_v: Option<f64>,
    pub empty_v: Option<f64>,
    /// Hours a full battery lasts at rest.
    pub idle_hours: Option<f64>,
    /// Hours a full battery lasts driving at 1 m/s (rest drain included
    /// separately).
    pub hours_at_1_mps: Option<f64>,
    pub sag_v_per_mps: Option<f64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MotorConfig {
    pub ambient_c: Option<f64>,
    pub heat_c_per_s_at_1_mps: Option<f64>,
    pub cooling_tau_s: Option<f64>,
}

fn invalid(key: &str, message: impl Into<String>) -> Invalid {
    Invalid {
        key: format!("sim.{key}"),
        message: message.into(),
    }
}

/// A finite number in `(lo, hi]` (`lo` itself with `lo_inclusive`).
fn number(key: &str, v: f64, lo: f64, lo_inclusive: bool, hi: f64) -> Result<f64, Invalid> {
    let above = if lo_inclusive { v >= lo } else { v > lo };
    if v.is_finite() && above && v <= hi {
        Ok(v)
    } else {
        let bracket = if lo_inclusive { '[' } else { '(' };
        Err(invalid(key, format!("{v} is outside {bracket}{lo}, {hi}]")))
    }
}

/// Checks `[sim]` and builds the world it describes (the built-in room
/// for every key left out).
pub(crate) fn world_spec(cfg: &SimWorldConfig) -> Result<WorldSpec, Invalid> {
    let mut spec = WorldSpec::default();
    if let Some(w) = cfg.width_m {
        spec.width = number("width_m", w, 0.0, false, MAX_SIDE_M)?;
    }
    if let Some(d) = cfg.depth_m {
        spec.depth = number("depth_m", d, 0.0, false, MAX_SIDE_M)?;
    }
    if let Some(r) = cfg.rover_radius_m {
        spec.rover_radius = number("rover_radius_m", r, 0.0, false, 10.0)?;
    }
    if 2.0 * spec.rover_radius >= spec.width.min(spec.depth) {
        return Err(invalid(
            "rover_radius_m",
            format!(
                "a rover of radius {} m does not fit in a {} m × {} m room",
                spec.rover_radius, spec.width, spec.depth
            ),
        ));
    }
    if let Some(n) = cfg.range_noise_m {
        spec.range_noise = number("range_noise_m", n, 0.0, true, 10.0)?;
    }
    if let Some(m) = cfg.max_range_m {
        spec.max_range = number("max_range_m", m, 0.0, false, 10.0 * MAX_SIDE_M)?;
    }
    if let Some(seed) = cfg.seed {
        spec.seed = seed;
    }
    if let Some(obstacles) = &cfg.obstacles {
        spec.obstacles = obstacles
            .iter()
            .enumerate()
            .map(|(i, o)| obstacle(i, o))
            .collect::<Result<_, _>>()?;
    }
    if let Some(start) = &cfg.start {
        for (k, v) in [("start.x", start.x), ("start.y", start.y)] {
            if !v.is_finite() {
                return Err(invalid(k, "must be a finite number"));
            }
        }
        if !start.heading_deg.is_finite() {
            return Err(invalid("start.heading_deg", "must be a finite number"));
        }
        spec.start = Pose {
            x: start.x,
            y: start.y,
            heading: start.heading_deg.to_radians(),
        };
    }
    check_start(&spec)?;
    if let Some(object) = &cfg.object {
        spec.object = match object.as_slice() {
            [] => None,
            [x, y] if x.is_finite() && y.is_finite() => {
                if !(0.0..=spec.width).contains(x) || !(0.0..=spec.depth).contains(y) {
                    return Err(invalid("object", "lies outside the room"));
                }
                Some((*x, *y))
            }
            _ => {
                return Err(invalid(
                    "object",
                    "must be [x, y] in metres, or [] for none",
                ));
            }
        };
    }
    if let Some(b) = &cfg.battery {
        spec.battery = battery(b, spec.battery)?;
    }
    if let Some(m) = &cfg.motor {
        spec.motor = motor(m, spec.motor)?;
    }
    if let Some(faults) = cfg.faults {
        faults
            .check()
            .map_err(|why| invalid("faults.drive_slip", why))?;
        spec.faults = faults;
    }
    Ok(spec)
}

fn obstacle(i: usize, o: &ObstacleConfig) -> Result<Obstacle, Invalid> {
    let key = |k: &str| format!("obstacles[{i}].{k}");
    for (k, v) in [
        ("min_x", o.min_x),
        ("min_y", o.min_y),
        ("max_x", o.max_x),
        ("max_y", o.max_y),
    ] {
        if !v.is_finite() {
            return Err(invalid(&key(k), "must be a finite number"));
        }
    }
    if o.min_x >= o.max_x {
        return Err(invalid(&key("max_x"), "must be greater than min_x"));
    }
    if o.min_y >= o.max_y {
        return Err(invalid(&key("max_y"), "must be greater than min_y"));
    }
    Ok(Obstacle {
        min_x: o.min_x,
        min_y: o.min_y,
        max_x: o.max_x,
        max_y: o.max_y,
    })
}

/// The rover must start inside the room and clear of every obstacle.
fn check_start(spec: &WorldSpec) -> Result<(), Invalid> {
    let (x, y, r) = (spec.start.x, spec.start.y, spec.rover_radius);
    if x - r < 0.0 || x + r > spec.width || y - r < 0.0 || y + r > spec.depth {
        return Err(invalid(
            "start",
            format!(
                "the rover (radius {r} m) at ({x}, {y}) is not inside the {} m × {} m room",
                spec.width, spec.depth
            ),
        ));
    }
    for (i, o) in spec.obstacles.iter().enumerate() {
        let cx = x.clamp(o.min_x, o.max_x);
        let cy = y.clamp(o.min_y, o.max_y);
        if super::sim_world::distance(x - cx, y - cy) < r {
            return Err(invalid(
                "start",
                format!("the rover at ({x}, {y}) overlaps obstacles[{i}]"),
            ));
        }
    }
    Ok(())
}

fn battery(b: &BatteryConfig, mut out: BatterySpec) -> Result<BatterySpec, Invalid> {
    if let Some(v) = b.full_v {
        out.full_v = number("battery.full_v", v, 0.0, false, 1_000.0)?;
    }
    if let Some(v) = b.empty_v {
        out.empty_v = number("battery.empty_v", v, 0.0, true, 1_000.0)?;
    }
    if out.empty_v >= out.full_v {
        return Err(invalid("battery.empty_v", "must be below full_v"));
    }
    if let Some(h) = b.idle_hours {
        out.drain_idle_per_s = 1.0 / (3_600.0 * number("battery.idle_hours", h, 0.0, false, 1e6)?);
    }
    if let Some(h) = b.hours_at_1_mps {
        out.drain_per_speed_per_s =
            1.0 / (3_600.0 * number("battery.hours_at_1_mps", h, 0.0, false, 1e6)?);
    }
    if let Some(v) = b.sag_v_per_mps {
        out.sag_per_speed_v = number("battery.sag_v_per_mps", v, 0.0, true, 1_000.0)?;
    }
    Ok(out)
}

fn motor(m: &MotorConfig, mut out: MotorSpec) -> Result<MotorSpec, Invalid> {
    if let Some(v) = m.ambient_c {
        out.ambient_c = number("motor.ambient_c", v, -100.0, true, 200.0)?;
    }
    if let Some(v) = m.heat_c_per_s_at_1_mps {
        out.heat_per_speed_c_per_s = number("motor.heat_c_per_s_at_1_mps", v, 0.0, true, 1_000.0)?;
    }
    if let Some(v) = m.cooling_tau_s {
        out.cooling_tau_s = number("motor.cooling_tau_s", v, 0.0, false, 1e6)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<WorldSpec, Invalid> {
        let cfg: SimWorldConfig = toml::from_str(text).map_err(|e| Invalid {
            key: "parse".into(),
            message: e.to_string(),
        })?;
        world_spec(&cfg)
    }

    #[test]
    fn an_empty_table_is_the_built_in_room() {
        assert_eq!(parse("").unwrap(), WorldSpec::default());
    }

    #[test]
    fn keys_override_the_built_in_room() {
        let spec = parse(
            "width_m = 10\ndepth_m = 5\nseed = 7\nobject = []\nrange_noise_m = 0.01\n\
             start = { x = 2, y = 2.5, heading_deg = 90 }\n\
             obstacles = [{ min_x = 8, min_y = 0, max_x = 9, max_y = 1 }]\n\
             [battery]\nidle_hours = 2\n",
        )
        .unwrap();
        assert_eq!((spec.width, spec.depth, spec.seed), (10.0, 5.0, 7));
        assert_eq!(spec.object, None);
        assert_eq!(spec.obstacles.len(), 1);
        assert!((spec.start.heading - std::f64::consts::FRAC_PI_2).abs() < 1e-12);
        assert!((spec.battery.drain_idle_per_s - 1.0 / 7_200.0).abs() < 1e-15);
    }

    #[test]
    fn impossible_worlds_name_the_key() {
        for (text, key) in [
            ("width_m = 0", "sim.width_m"),
            ("depth_m = -1", "sim.depth_m"),
            ("rover_radius_m = 3", "sim.rover_radius_m"),
            ("start = { x = 0.05, y = 2 }", "sim.start"),
            ("start = { x = 4, y = 3.5 }", "sim.start"),
            (
                "obstacles = [{ min_x = 2, min_y = 0, max_x = 1, max_y = 1 }]",
                "sim.obstacles[0].max_x",
            ),
            ("object = [1]", "sim.object"),
            ("object = [7, 1]", "sim.object"),
            ("range_noise_m = -0.1", "sim.range_noise_m"),
            (
                "[battery]\nfull_v = 10\nempty_v = 11",
                "sim.battery.empty_v",
            ),
            ("[motor]\ncooling_tau_s = 0", "sim.motor.cooling_tau_s"),
            ("[faults]\ndrive_slip = 2", "sim.faults.drive_slip"),
        ] {
            let err = parse(text).expect_err(text);
            assert_eq!(err.key, key, "{text}: {}", err.message);
        }
    }
}
