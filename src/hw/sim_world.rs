//! The simulated world of the built-in host: a rover in a rectangular room
//! with obstacles, driven by its sim actuators and read by its sim sensors.
//!
//! Plain data and methods without I/O or clocks: the OODA loop steps it by
//! the time that passed ([`SimWorld::step`]), sim actuators set its inputs
//! ([`SimWorld::set_input`]) and sim sensors read its quantities
//! ([`SimWorld::read`]). The same seed and the same commands at the same
//! times give the same readings.
//!
//! Coordinates are metres, the room spans `[0, width] × [0, depth]`,
//! heading is radians counter-clockwise from the +x axis.

use parking_lot::Mutex;
use std::f64::consts::TAU;
use std::sync::Arc;
use std::time::Duration;

use super::sim::Rng;

/// What a world sensor reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Quantity {
    /// Range to the nearest wall or obstacle straight ahead, from the
    /// rover's front (its centre plus its radius), with the world's noise.
    FrontDistance,
    PoseX,
    PoseY,
    /// Heading in degrees, 0 = +x, counter-clockwise, in [0, 360).
    Heading,
    /// Distance travelled, forward and backward both counting.
    Odometry,
    /// 1 while the rover touches a wall or an obstacle, else 0.
    Bumper,
    BatteryVoltage,
    MotorTemperature,
    /// 1 while the gripper holds the world's object, else 0.
    Holding,
    /// Contacts with walls or obstacles so far.
    Collisions,
    /// The rover's measured speed over ground, m/s (negative backwards):
    /// what it actually moved in the last step, 0 against a wall; what a
    /// stuck or slipping drive really does (see [`SimFaults`]).
    WheelSpeed,
}

impl Quantity {
    pub const ALL: [Quantity; 11] = [
        Quantity::FrontDistance,
        Quantity::PoseX,
        Quantity::PoseY,
        Quantity::Heading,
        Quantity::Odometry,
        Quantity::Bumper,
        Quantity::BatteryVoltage,
        Quantity::MotorTemperature,
        Quantity::Holding,
        Quantity::Collisions,
        Quantity::WheelSpeed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Quantity::FrontDistance => "front_distance",
            Quantity::PoseX => "pose_x",
            Quantity::PoseY => "pose_y",
            Quantity::Heading => "heading",
            Quantity::Odometry => "odometry",
            Quantity::Bumper => "bumper",
            Quantity::BatteryVoltage => "battery_voltage",
            Quantity::MotorTemperature => "motor_temperature",
            Quantity::Holding => "holding",
            Quantity::Collisions => "collisions",
            Quantity::WheelSpeed => "wheel_speed",
        }
    }
}

/// What a sim actuator drives in the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Input {
    /// Forward speed, m/s (negative: backwards).
    DriveSpeed,
    /// Turn rate, degrees per second, counter-clockwise positive.
    TurnRate,
    /// Gripper, 0 open to 1 closed; closing near the object picks it up.
    Gripper,
}

impl Input {
    pub fn as_str(self) -> &'static str {
        match self {
            Input::DriveSpeed => "drive_speed",
            Input::TurnRate => "turn_rate",
            Input::Gripper => "gripper",
        }
    }
}

/// An axis-aligned box obstacle.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Obstacle {
    pub min_x: f64,
    pub min_y: f64,
    pub max_x: f64,
    pub max_y: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pose {
    pub x: f64,
    pub y: f64,
    /// Radians, counter-clockwise from +x.
    pub heading: f64,
}

/// The world's fixed description (validated config).
#[derive(Debug, Clone, PartialEq)]
pub struct WorldSpec {
    pub width: f64,
    pub depth: f64,
    pub obstacles: Vec<Obstacle>,
    pub start: Pose,
    /// The rover is a disc of this radius.
    pub rover_radius: f64,
    /// Uniform noise on `front_distance`, ± metres.
    pub range_noise: f64,
    /// Longest range the sensor reports.
    pub max_range: f64,
    pub seed: u64,
    /// Where the object the gripper can pick up lies (if any).
    pub object: Option<(f64, f64)>,
    pub battery: BatterySpec,
    pub motor: MotorSpec,
    /// Faults of the drive and its sensor (none by default).
    pub faults: SimFaults,
}

/// The faults that make a command differ from its effect, for demos and
/// tests of the feedback verdicts (`[sim.faults]`, or set at run time).
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimFaults {
    /// Commands are accepted, the rover does not move.
    #[serde(default)]
    pub stuck_drive: bool,
    /// The fraction of the commanded speed lost to slip: 0 none, 0.5 half.
    #[serde(default)]
    pub drive_slip: f64,
    /// `wheel_speed` reads the commanded speed instead of the motion (a
    /// sensor that echoes the command).
    #[serde(default)]
    pub echo_wheel_speed: bool,
}

impl SimFaults {
    /// `drive_slip` within [0, 1]; the message says what is wrong.
    pub fn check(&self) -> Result<(), String> {
        if !(self.drive_slip.is_finite() && (0.0..=1.0).contains(&self.drive_slip)) {
            return Err(format!(
                "drive_slip {} is outside [0, 1] (the fraction of the commanded speed lost)",
                self.drive_slip
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatterySpec {
    /// Open-circuit voltage full and empty.
    pub full_v: f64,
    pub empty_v: f64,
    /// Charge drawn per second at rest and per second per m/s of speed,
    /// as fractions of a full battery.
    pub drain_idle_per_s: f64,
    pub drain_per_speed_per_s: f64,
    /// Voltage lost under load per m/s, recovered at rest.
    pub sag_per_speed_v: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MotorSpec {
    pub ambient_c: f64,
    /// Heating in °C per second per m/s of speed.
    pub heat_per_speed_c_per_s: f64,
    /// Time constant of cooling toward ambient.
    pub cooling_tau_s: f64,
}

impl Default for WorldSpec {
    /// The built-in rover's room: 6 m × 4 m, one crate, the rover at
    /// (1, 2) facing the far wall.
    fn default() -> Self {
        WorldSpec {
            width: 6.0,
            depth: 4.0,
            obstacles: vec![Obstacle {
                min_x: 3.5,
                min_y: 3.0,
                max_x: 4.5,
                max_y: 4.0,
            }],
            start: Pose {
                x: 1.0,
                y: 2.0,
                heading: 0.0,
            },
            rover_radius: 0.15,
            range_noise: 0.0,
            max_range: 10.0,
            seed: 1,
            object: Some((2.0, 1.0)),
            battery: BatterySpec {
                full_v: 12.6,
                empty_v: 11.0,
                drain_idle_per_s: 1.0 / 36_000.0,
                drain_per_speed_per_s: 1.0 / 3_600.0,
                sag_per_speed_v: 0.4,
            },
            motor: MotorSpec {
                ambient_c: 25.0,
                heat_per_speed_c_per_s: 0.5,
                cooling_tau_s: 60.0,
            },
            faults: SimFaults::default(),
        }
    }
}

/// The world as the loop, the sim actuators and the API share it: every
/// hold of the lock is a few arithmetic operations.
pub type SharedWorld = Arc<Mutex<SimWorld>>;

/// What an Observation and `/v1/status` show of the world.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WorldView {
    pub x: f64,
    pub y: f64,
    pub heading_deg: f64,
    pub speed: f64,
    pub bumper: bool,
    pub collisions: u64,
    pub holding: bool,
    /// Where the object lies (at the rover while held).
    pub object: Option<[f64; 2]>,
    /// The faults in force (see [`SimFaults`]).
    pub faults: SimFaults,
}

/// The world's state.
#[derive(Debug, Clone)]
pub struct SimWorld {
    spec: WorldSpec,
    pose: Pose,
    speed: f64,
    /// What the rover moved in the last step, per second (signed).
    measured_speed: f64,
    faults: SimFaults,
    turn_rate_deg: f64,
    gripper: f64,
    holding: bool,
    /// Where the object lies while not held.
    object: Option<(f64, f64)>,
    touching: bool,
    collisions: u64,
    odometry: f64,
    charge: f64,
    motor_c: f64,
    rng: Rng,
}

/// Gaps smaller than this count as contact.
const CONTACT: f64 = 1e-9;
/// How close the gripper must be to the object to pick it up.
const REACH: f64 = 0.3;

impl SimWorld {
    pub fn new(spec: WorldSpec) -> SimWorld {
        SimWorld {
            pose: spec.start,
            speed: 0.0,
            measured_speed: 0.0,
            faults: spec.faults,
            turn_rate_deg: 0.0,
            gripper: 0.0,
            holding: false,
            object: spec.object,
            touching: false,
            collisions: 0,
            odometry: 0.0,
            charge: 1.0,
            motor_c: spec.motor.ambient_c,
            rng: Rng::new(spec.seed),
            spec,
        }
    }

    pub fn spec(&self) -> &WorldSpec {
        &self.spec
    }

    pub fn pose(&self) -> Pose {
        self.pose
    }

    pub fn collisions(&self) -> u64 {
        self.collisions
    }

    pub fn faults(&self) -> SimFaults {
        self.faults
    }

    /// Faults from now on (checked by the caller, see [`SimFaults::check`]).
    pub fn set_faults(&mut self, faults: SimFaults) {
        self.faults = faults;
    }

    pub fn view(&self) -> WorldView {
        WorldView {
            x: self.pose.x,
            y: self.pose.y,
            heading_deg: self.pose.heading.to_degrees().rem_euclid(360.0),
            speed: self.speed,
            bumper: self.touching,
            collisions: self.collisions,
            holding: self.holding,
            object: self.object().map(|(x, y)| [x, y]),
            faults: self.faults,
        }
    }

    /// Where the object is (held: at the rover), if there is one.
    pub fn object(&self) -> Option<(f64, f64)> {
        if self.holding {
            Some((self.pose.x, self.pose.y))
        } else {
            self.object
        }
    }

    /// A sim actuator's new value.
    pub fn set_input(&mut self, input: Input, value: f64) {
        let value = if value.is_finite() { value } else { 0.0 };
        match input {
            Input::DriveSpeed => self.speed = value,
            Input::TurnRate => self.turn_rate_deg = value,
            Input::Gripper => {
                let closing = value >= 0.5 && self.gripper < 0.5;
                let opening = value < 0.5 && self.gripper >= 0.5;
                self.gripper = value;
                if closing
                    && let Some((ox, oy)) = self.object
                    && distance(ox - self.pose.x, oy - self.pose.y)
                        <= REACH + self.spec.rover_radius
                {
                    self.holding = true;
                    self.object = None;
                } else if opening && self.holding {
                    self.holding = false;
                    self.object = Some((self.pose.x, self.pose.y));
                }
            }
        }
    }

    /// Advances the world by `dt`: the rover turns and drives (stopping at
    /// contact), the battery drains, the motor heats or cools.
    pub fn step(&mut self, dt: Duration) {
        let secs = dt.as_secs_f64();
        if secs <= 0.0 {
            return;
        }
        self.pose.heading =
            (self.pose.heading + self.turn_rate_deg.to_radians() * secs).rem_euclid(TAU);
        // A stuck drive turns nothing; a slipping one a fraction.
        let effective = if self.faults.stuck_drive {
            0.0
        } else {
            self.speed * (1.0 - self.faults.drive_slip.clamp(0.0, 1.0))
        };
        let wanted = effective * secs;
        let (dx, dy) = (self.pose.heading.cos(), self.pose.heading.sin());
        // Drive along the heading (backwards for a negative speed) up to
        // the first contact.
        let (dir_x, dir_y) = if wanted >= 0.0 { (dx, dy) } else { (-dx, -dy) };
        let free = self.clearance(self.pose.x, self.pose.y, dir_x, dir_y);
        let moved = wanted.abs().min(free);
        self.pose.x += dir_x * moved;
        self.pose.y += dir_y * moved;
        self.odometry += moved;
        self.measured_speed = (if wanted >= 0.0 { moved } else { -moved }) / secs;
        let blocked = wanted.abs() > 0.0 && wanted.abs() > free - CONTACT;
        let touching = blocked || self.gap() <= CONTACT;
        if touching && !self.touching {
            self.collisions += 1;
        }
        self.touching = touching;
        // What the motors draw follows the commanded speed; a blocked
        // rover stalls its motors, which heats them just the same.
        let load = self.speed.abs();
        let b = self.spec.battery;
        self.charge = (self.charge - secs * (b.drain_idle_per_s + b.drain_per_speed_per_s * load))
            .clamp(0.0, 1.0);
        let m = self.spec.motor;
        let cooling = (self.motor_c - m.ambient_c) * (1.0 - (-secs / m.cooling_tau_s).exp());
        self.motor_c += m.heat_per_speed_c_per_s * load * secs - cooling;
    }

    /// A sensor's reading now.
    pub fn read(&mut self, quantity: Quantity) -> f64 {
        match quantity {
            Quantity::FrontDistance => {
                let (dx, dy) = (self.pose.heading.cos(), self.pose.heading.sin());
                let range = self
                    .ray(self.pose.x, self.pose.y, dx, dy)
                    .min(self.spec.max_range + self.spec.rover_radius)
                    - self.spec.rover_radius;
                // At contact, rounding leaves a few ulps: that is zero.
                let range = if range < 1e-9 { 0.0 } else { range };
                let noise = self.spec.range_noise * self.rng.symmetric();
                (range + noise).max(0.0)
            }
            Quantity::PoseX => self.pose.x,
            Quantity::PoseY => self.pose.y,
            Quantity::Heading => self.pose.heading.to_degrees().rem_euclid(360.0),
            Quantity::Odometry => self.odometry,
            Quantity::Bumper => f64::from(u8::from(self.touching)),
            Quantity::BatteryVoltage => {
                let b = self.spec.battery;
                b.empty_v + (b.full_v - b.empty_v) * self.charge
                    - b.sag_per_speed_v * self.speed.abs()
            }
            Quantity::MotorTemperature => self.motor_c,
            Quantity::Holding => f64::from(u8::from(self.holding)),
            Quantity::Collisions => self.collisions as f64,
            Quantity::WheelSpeed if self.faults.echo_wheel_speed => self.speed,
            Quantity::WheelSpeed => self.measured_speed,
        }
    }

    /// How far the rover's centre can move from (x, y) along the unit
    /// direction before its disc touches a wall or an obstacle.
    fn clearance(&self, x: f64, y: f64, dx: f64, dy: f64) -> f64 {
        let r = self.spec.rover_radius;
        // Walls: the centre stays within [r, width - r] × [r, depth - r].
        let mut free = f64::INFINITY;
        for (pos, d, lo, hi) in [
            (x, dx, r, self.spec.width - r),
            (y, dy, r, self.spec.depth - r),
        ] {
            if d > 0.0 {
                free = free.min((hi - pos) / d);
            } else if d < 0.0 {
                free = free.min((lo - pos) / d);
            }
        }
        // Obstacles, grown by the radius (a box with square corners: a
        // slightly cautious stand-in for the rounded Minkowski sum).
        for o in &self.spec.obstacles {
            let grown = Obstacle {
                min_x: o.min_x - r,
                min_y: o.min_y - r,
                max_x: o.max_x + r,
                max_y: o.max_y + r,
            };
            if let Some(t) = ray_box(x, y, dx, dy, &grown) {
                free = free.min(t);
            }
        }
        free.max(0.0)
    }

    /// Distance from the rover's centre to the first wall or obstacle
    /// surface along the unit direction.
    fn ray(&self, x: f64, y: f64, dx: f64, dy: f64) -> f64 {
        let room = Obstacle {
            min_x: 0.0,
            min_y: 0.0,
            max_x: self.spec.width,
            max_y: self.spec.depth,
        };
        let mut hit = exit_box(x, y, dx, dy, &room);
        for o in &self.spec.obstacles {
            if let Some(t) = ray_box(x, y, dx, dy, o) {
                hit = hit.min(t);
            }
        }
        hit
    }

    /// The smallest gap between the rover's disc and anything solid.
    fn gap(&self) -> f64 {
        let (x, y, r) = (self.pose.x, self.pose.y, self.spec.rover_radius);
        let walls = [x, self.spec.width - x, y, self.spec.depth - y]
            .into_iter()
            .fold(f64::INFINITY, f64::min);
        let boxes = self.spec.obstacles.iter().fold(f64::INFINITY, |g, o| {
            let cx = x.clamp(o.min_x, o.max_x);
            let cy = y.clamp(o.min_y, o.max_y);
            g.min(distance(x - cx, y - cy))
        });
        walls.min(boxes) - r
    }
}

/// The length of (dx, dy). Not `f64::hypot`: it links glibc's `hypot` of
/// version 2.35, newer than the 2.34 the Debian package promises; at room
/// scale the plain square root loses nothing.
pub(super) fn distance(dx: f64, dy: f64) -> f64 {
    (dx * dx + dy * dy).sqrt()
}

/// Where a ray from inside `b` leaves it.
fn exit_box(x: f64, y: f64, dx: f64, dy: f64, b: &Obstacle) -> f64 {
    let mut t = f64::INFINITY;
    if dx > 0.0 {
        t = t.min((b.max_x - x) / dx);
    } else if dx < 0.0 {
        t = t.min((b.min_x - x) / dx);
    }
    if dy > 0.0 {
        t = t.min((b.max_y - y) / dy);
    } else if dy < 0.0 {
        t = t.min((b.min_y - y) / dy);
    }
    t.max(0.0)
}

/// Where a ray first enters box `b` (slab method); `None` if it misses or
/// the box is behind. A start inside the box is a hit at 0.
fn ray_box(x: f64, y: f64, dx: f64, dy: f64, b: &Obstacle) -> Option<f64> {
    let mut near = f64::NEG_INFINITY;
    let mut far = f64::INFINITY;
    for (pos, d, lo, hi) in [(x, dx, b.min_x, b.max_x), (y, dy, b.min_y, b.max_y)] {
        if d.abs() < 1e-12 {
            if pos < lo || pos > hi {
                return None;
            }
        } else {
            let (t1, t2) = ((lo - pos) / d, (hi - pos) / d);
            near = near.max(t1.min(t2));
            far = far.min(t1.max(t2));
        }
    }
    (near <= far && far >= 0.0).then_some(near.max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn open_room() -> WorldSpec {
        WorldSpec {
            obstacles: Vec::new(),
            object: None,
            ..WorldSpec::default()
        }
    }

    #[test]
    fn the_range_falls_at_exactly_the_commanded_speed() {
        let mut w = SimWorld::new(open_room());
        // From x = 1 facing the wall at x = 6, front at 1.15.
        let start = w.read(Quantity::FrontDistance);
        assert!((start - 4.85).abs() < 1e-9, "{start}");
        w.set_input(Input::DriveSpeed, 0.3);
        for _ in 0..50 {
            w.step(ms(20));
        }
        let after = w.read(Quantity::FrontDistance);
        assert!((start - after - 0.3).abs() < 1e-9, "{start} -> {after}");
        assert!((w.read(Quantity::Odometry) - 0.3).abs() < 1e-9);
        assert_eq!(w.collisions(), 0);
    }

    #[test]
    fn driving_into_a_wall_stops_at_contact_and_counts_one_collision() {
        let mut w = SimWorld::new(open_room());
        w.set_input(Input::DriveSpeed, 0.5);
        for _ in 0..2000 {
            w.step(ms(20));
        }
        assert!((w.pose().x - (6.0 - 0.15)).abs() < 1e-9, "{:?}", w.pose());
        assert_eq!(w.read(Quantity::FrontDistance), 0.0);
        assert_eq!(w.read(Quantity::Bumper), 1.0);
        assert_eq!(w.collisions(), 1, "one contact episode");
        // Backing off ends the contact; driving on again is a second one.
        w.set_input(Input::DriveSpeed, -0.5);
        w.step(ms(200));
        assert_eq!(w.read(Quantity::Bumper), 0.0);
        w.set_input(Input::DriveSpeed, 0.5);
        w.step(ms(400));
        assert_eq!(w.collisions(), 2);
    }

    #[test]
    fn obstacles_block_the_ray_and_the_rover() {
        let mut w = SimWorld::new(WorldSpec {
            obstacles: vec![Obstacle {
                min_x: 3.0,
                min_y: 1.5,
                max_x: 3.5,
                max_y: 2.5,
            }],
            ..open_room()
        });
        assert!((w.read(Quantity::FrontDistance) - 1.85).abs() < 1e-9);
        w.set_input(Input::DriveSpeed, 0.5);
        for _ in 0..500 {
            w.step(ms(20));
        }
        assert!((w.pose().x - 2.85).abs() < 1e-9, "{:?}", w.pose());
        assert_eq!(w.collisions(), 1);
    }

    #[test]
    fn turning_changes_heading_and_what_is_ahead() {
        let mut w = SimWorld::new(open_room());
        w.set_input(Input::TurnRate, 90.0);
        w.step(ms(1000));
        assert!((w.read(Quantity::Heading) - 90.0).abs() < 1e-9);
        // Facing +y from y = 2 in a 4 m deep room.
        assert!((w.read(Quantity::FrontDistance) - 1.85).abs() < 1e-9);
    }

    #[test]
    fn the_battery_drains_faster_at_speed_and_sags_only_under_load() {
        let mut idle = SimWorld::new(open_room());
        let mut busy = SimWorld::new(WorldSpec {
            width: 1000.0,
            ..open_room()
        });
        busy.set_input(Input::DriveSpeed, 0.5);
        for _ in 0..600 {
            idle.step(ms(1000));
            busy.step(ms(1000));
        }
        let at_rest = |w: &mut SimWorld| {
            w.set_input(Input::DriveSpeed, 0.0);
            w.read(Quantity::BatteryVoltage)
        };
        let loaded = busy.read(Quantity::BatteryVoltage);
        let (idle_v, busy_v) = (at_rest(&mut idle), at_rest(&mut busy));
        assert!(busy_v < idle_v, "{busy_v} < {idle_v}");
        assert!(loaded < busy_v, "sag under load recovers at rest");
        assert!(idle_v < 12.6);
    }

    #[test]
    fn the_motor_heats_with_speed_and_cools_toward_ambient() {
        let mut w = SimWorld::new(WorldSpec {
            width: 1000.0,
            ..open_room()
        });
        w.set_input(Input::DriveSpeed, 0.5);
        for _ in 0..60 {
            w.step(ms(1000));
        }
        let hot = w.read(Quantity::MotorTemperature);
        assert!(hot > 30.0, "{hot}");
        w.set_input(Input::DriveSpeed, 0.0);
        for _ in 0..600 {
            w.step(ms(1000));
        }
        let cooled = w.read(Quantity::MotorTemperature);
        assert!(cooled < hot && cooled > 25.0 && cooled < 26.0, "{cooled}");
    }

    #[test]
    fn the_gripper_picks_up_the_object_within_reach_and_drops_it_where_it_is() {
        let mut w = SimWorld::new(WorldSpec {
            object: Some((1.3, 2.0)),
            ..open_room()
        });
        w.set_input(Input::Gripper, 1.0);
        assert_eq!(w.read(Quantity::Holding), 1.0);
        w.set_input(Input::DriveSpeed, 0.5);
        w.step(ms(2000));
        w.set_input(Input::Gripper, 0.0);
        assert_eq!(w.read(Quantity::Holding), 0.0);
        assert_eq!(w.object(), Some((2.0, 2.0)));
        // Out of reach: nothing to pick up.
        let mut far = SimWorld::new(open_room());
        far.set_input(Input::Gripper, 1.0);
        assert_eq!(far.read(Quantity::Holding), 0.0);
    }

    #[test]
    fn the_same_seed_and_commands_give_the_same_readings() {
        let run = || {
            let mut w = SimWorld::new(WorldSpec {
                range_noise: 0.02,
                seed: 7,
                ..WorldSpec::default()
            });
            w.set_input(Input::DriveSpeed, 0.3);
            (0..100)
                .map(|_| {
                    w.step(ms(20));
                    w.read(Quantity::FrontDistance)
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
    }

    #[test]
    fn wheel_speed_measures_the_motion_and_the_faults_make_it_differ_from_the_command() {
        let mut w = SimWorld::new(open_room());
        w.set_input(Input::DriveSpeed, 0.3);
        w.step(ms(20));
        assert!((w.read(Quantity::WheelSpeed) - 0.3).abs() < 1e-9);
        w.set_input(Input::DriveSpeed, -0.2);
        w.step(ms(20));
        assert!((w.read(Quantity::WheelSpeed) + 0.2).abs() < 1e-9);
        // Stuck: the command stands, nothing moves.
        w.set_faults(SimFaults {
            stuck_drive: true,
            ..SimFaults::default()
        });
        let before = w.pose();
        w.step(ms(20));
        assert_eq!(w.pose(), before);
        assert_eq!(w.read(Quantity::WheelSpeed), 0.0);
        assert_eq!(w.view().speed, -0.2, "the command is still -0.2");
        // Slipping: a fraction of the commanded speed.
        w.set_faults(SimFaults {
            drive_slip: 0.5,
            ..SimFaults::default()
        });
        w.step(ms(20));
        assert!((w.read(Quantity::WheelSpeed) + 0.1).abs() < 1e-9);
        // An echoing sensor reads the command whatever the rover does.
        w.set_faults(SimFaults {
            stuck_drive: true,
            echo_wheel_speed: true,
            ..SimFaults::default()
        });
        w.step(ms(20));
        assert_eq!(w.read(Quantity::WheelSpeed), -0.2);
        assert!(
            SimFaults {
                drive_slip: 1.5,
                ..SimFaults::default()
            }
            .check()
            .is_err()
        );
        assert!(
            SimFaults {
                drive_slip: f64::NAN,
                ..SimFaults::default()
            }
            .check()
            .is_err()
        );
    }

    #[test]
    fn against_a_wall_the_measured_speed_is_zero() {
        let mut w = SimWorld::new(open_room());
        w.set_input(Input::DriveSpeed, 0.5);
        for _ in 0..2000 {
            w.step(ms(20));
        }
        assert_eq!(w.read(Quantity::Bumper), 1.0);
        assert_eq!(w.read(Quantity::WheelSpeed), 0.0);
    }

    #[test]
    fn garbage_inputs_and_zero_steps_change_nothing_harmful() {
        let mut w = SimWorld::new(WorldSpec::default());
        w.set_input(Input::DriveSpeed, f64::NAN);
        w.step(Duration::ZERO);
        w.step(ms(20));
        assert_eq!(w.pose(), WorldSpec::default().start);
        for q in Quantity::ALL {
            assert!(w.read(q).is_finite(), "{q:?}");
        }
    }
}
