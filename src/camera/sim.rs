//! The simulated world's camera: a first-person view from the rover's
//! pose, rendered column by column like the range sensor's ray (the
//! centre column looks exactly where `front_distance` measures). Walls,
//! obstacles (the crate) and the object on the floor each have their own
//! colour, shaded by distance, above a grey floor and below a pale
//! ceiling, with the horizon in the middle. [`render`] is a pure function
//! of the room and the pose; [`run`] is the thread around it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::Camera;
use crate::hw::sim_world::{Obstacle, Pose, SharedWorld, WorldSpec};

/// The camera's height above the floor, metres.
const CAMERA_HEIGHT: f64 = 0.25;
/// The walls' and obstacles' heights, metres.
const WALL_HEIGHT: f64 = 1.0;
const OBSTACLE_HEIGHT: f64 = 0.5;
/// The object's edge, metres (a small cube on the floor).
const OBJECT_SIZE: f64 = 0.15;

type Rgb = [u8; 3];

pub(crate) const SKY: Rgb = [205, 215, 228];
pub(crate) const FLOOR: Rgb = [96, 96, 96];
/// The walls facing +x (the west wall, x = 0), -x (east), +y (south), -y (north).
pub(crate) const WALL_WEST: Rgb = [150, 90, 200];
pub(crate) const WALL_EAST: Rgb = [60, 110, 220];
pub(crate) const WALL_SOUTH: Rgb = [40, 170, 150];
pub(crate) const WALL_NORTH: Rgb = [220, 190, 60];
pub(crate) const CRATE: Rgb = [170, 100, 40];
pub(crate) const OBJECT: Rgb = [230, 30, 30];

/// What the camera sees besides the room: the obstacles and the object.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Scene {
    pub width: f64,
    pub depth: f64,
    pub obstacles: Vec<Obstacle>,
    /// Where the object lies on the floor (none while held).
    pub object: Option<(f64, f64)>,
}

impl Scene {
    pub(crate) fn of(spec: &WorldSpec, object: Option<(f64, f64)>) -> Scene {
        Scene {
            width: spec.width,
            depth: spec.depth,
            obstacles: spec.obstacles.clone(),
            object,
        }
    }
}

/// The view from `pose` as RGB pixels (`width` × `height`, row by row),
/// `fov_deg` wide.
pub(crate) fn render(scene: &Scene, pose: Pose, width: u32, height: u32, fov_deg: f64) -> Vec<u8> {
    let (w, h) = (width as usize, height as usize);
    let mut rgb = vec![0u8; w * h * 3];
    let horizon = h as f64 / 2.0;
    let focal = (w as f64 / 2.0) / (fov_deg.to_radians() / 2.0).tan();
    let (fx, fy) = (pose.heading.cos(), pose.heading.sin());
    // To the right of the heading (clockwise).
    let (rx, ry) = (fy, -fx);
    // Ceiling above the horizon, floor below, darker far away.
    for y in 0..h {
        let colour = if (y as f64) < horizon {
            SKY
        } else {
            let below = (y as f64 + 0.5 - horizon).max(0.5);
            shade(FLOOR, CAMERA_HEIGHT * focal / below)
        };
        for x in 0..w {
            rgb[(y * w + x) * 3..(y * w + x) * 3 + 3].copy_from_slice(&colour);
        }
    }
    let mut nearest = vec![f64::INFINITY; w];
    for (x, nearest) in nearest.iter_mut().enumerate() {
        let lateral = (x as f64 + 0.5 - w as f64 / 2.0) / focal;
        // A ray whose forward component is 1: its parameter is the depth.
        let (dx, dy) = (fx + rx * lateral, fy + ry * lateral);
        let (wall_depth, wall) = room_wall(scene, pose.x, pose.y, dx, dy);
        let mut hits = vec![(wall_depth, WALL_HEIGHT, wall)];
        for o in &scene.obstacles {
            if let Some(t) = entry(pose.x, pose.y, dx, dy, o) {
                hits.push((t, OBSTACLE_HEIGHT, CRATE));
            }
        }
        // Far first, so that nearer things cover them.
        hits.sort_by(|a, b| b.0.total_cmp(&a.0));
        for &(depth, top, colour) in &hits {
            column(&mut rgb, w, h, x, focal, horizon, depth, top, colour);
        }
        *nearest = hits.last().map_or(f64::INFINITY, |hit| hit.0);
    }
    if let Some((ox, oy)) = scene.object {
        let (vx, vy) = (ox - pose.x, oy - pose.y);
        let depth = vx * fx + vy * fy;
        if depth > 0.05 {
            let lateral = vx * rx + vy * ry;
            let centre = w as f64 / 2.0 + focal * lateral / depth;
            let half = focal * OBJECT_SIZE / 2.0 / depth;
            let first = (centre - half).floor().max(0.0) as usize;
            let last = ((centre + half).ceil().max(0.0) as usize).min(w);
            for (x, &behind) in nearest.iter().enumerate().take(last).skip(first) {
                if depth < behind {
                    column(
                        &mut rgb,
                        w,
                        h,
                        x,
                        focal,
                        horizon,
                        depth,
                        OBJECT_SIZE,
                        OBJECT,
                    );
                }
            }
        }
    }
    rgb
}

/// Paints a vertical span of column `x`: something `top` metres tall at `depth`.
#[allow(clippy::too_many_arguments)]
fn column(
    rgb: &mut [u8],
    w: usize,
    h: usize,
    x: usize,
    focal: f64,
    horizon: f64,
    depth: f64,
    top: f64,
    colour: Rgb,
) {
    let depth = depth.max(1e-3);
    let upper = (horizon - focal * (top - CAMERA_HEIGHT) / depth).floor();
    let lower = (horizon + focal * CAMERA_HEIGHT / depth).ceil();
    let upper = upper.clamp(0.0, h as f64) as usize;
    let lower = lower.clamp(0.0, h as f64) as usize;
    let colour = shade(colour, depth);
    for y in upper..lower {
        let i = (y * w + x) * 3;
        rgb[i..i + 3].copy_from_slice(&colour);
    }
}

/// A colour darkened with distance (metres).
fn shade(colour: Rgb, depth: f64) -> Rgb {
    let k = 1.0 / (1.0 + 0.12 * depth.max(0.0));
    colour.map(|c| (f64::from(c) * k).round() as u8)
}

/// Where a ray from inside the room meets its walls, and the wall's colour.
fn room_wall(scene: &Scene, x: f64, y: f64, dx: f64, dy: f64) -> (f64, Rgb) {
    let mut best = (f64::INFINITY, WALL_EAST);
    if dx > 0.0 {
        best = min_hit(best, ((scene.width - x) / dx, WALL_EAST));
    } else if dx < 0.0 {
        best = min_hit(best, ((0.0 - x) / dx, WALL_WEST));
    }
    if dy > 0.0 {
        best = min_hit(best, ((scene.depth - y) / dy, WALL_NORTH));
    } else if dy < 0.0 {
        best = min_hit(best, ((0.0 - y) / dy, WALL_SOUTH));
    }
    (best.0.max(0.0), best.1)
}

fn min_hit(a: (f64, Rgb), b: (f64, Rgb)) -> (f64, Rgb) {
    if b.0 < a.0 { b } else { a }
}

/// Where a ray enters a box (slab method), if ahead of it.
fn entry(x: f64, y: f64, dx: f64, dy: f64, b: &Obstacle) -> Option<f64> {
    let mut near = f64::NEG_INFINITY;
    let mut far = f64::INFINITY;
    for (p, d, lo, hi) in [(x, dx, b.min_x, b.max_x), (y, dy, b.min_y, b.max_y)] {
        if d.abs() < 1e-12 {
            if p < lo || p > hi {
                return None;
            }
        } else {
            let (t1, t2) = ((lo - p) / d, (hi - p) / d);
            near = near.max(t1.min(t2));
            far = far.min(t1.max(t2));
        }
    }
    (near <= far && near > 0.0).then_some(near)
}

/// Renders the world at the camera's rate until `shutdown`: a picture only
/// when the pose or the object moved (else the last one, captured again).
pub(super) fn run(camera: Arc<Camera>, world: SharedWorld, shutdown: CancellationToken) {
    let super::config::Source::Sim {
        width,
        height,
        fov_deg,
        every,
    } = camera.spec.source.clone()
    else {
        return;
    };
    let quality = camera.spec.jpeg_quality;
    let mut last: Option<(Scene, Pose, bytes::Bytes)> = None;
    let mut next = Instant::now();
    while !shutdown.is_cancelled() {
        let (scene, pose) = {
            let world = world.lock();
            (Scene::of(world.spec(), world.object()), world.pose())
        };
        let jpeg = match &last {
            Some((s, p, jpeg)) if *s == scene && *p == pose => Ok(jpeg.clone()),
            _ => {
                let rgb = render(&scene, pose, width, height, fov_deg);
                super::jpeg::encode_rgb(&rgb, width, height, quality).map(bytes::Bytes::from)
            }
        };
        match jpeg {
            Ok(jpeg) => {
                camera.publish(jpeg.clone(), width, height, Instant::now());
                last = Some((scene, pose, jpeg));
            }
            Err(e) => camera.reject(e, Instant::now()),
        }
        next += every;
        let now = Instant::now();
        if next < now {
            // Behind (a slow machine): start again from now rather than race.
            next = now;
        }
        // Short sleeps so that shutdown is seen promptly.
        while Instant::now() < next && !shutdown.is_cancelled() {
            std::thread::sleep(
                next.saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(100)),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pixel(rgb: &[u8], w: u32, x: u32, y: u32) -> Rgb {
        let i = ((y * w + x) * 3) as usize;
        [rgb[i], rgb[i + 1], rgb[i + 2]]
    }

    /// The hue of a shaded colour: the colour it is a darker copy of.
    fn is(pixel: Rgb, colour: Rgb) -> bool {
        let k = f64::from(pixel.iter().map(|&c| u32::from(c)).sum::<u32>())
            / f64::from(colour.iter().map(|&c| u32::from(c)).sum::<u32>()).max(1.0);
        pixel
            .iter()
            .zip(colour)
            .all(|(&p, c)| (f64::from(p) - f64::from(c) * k).abs() <= 6.0)
    }

    fn room() -> (WorldSpec, Scene) {
        let spec = WorldSpec::default();
        let scene = Scene::of(&spec, spec.object);
        (spec, scene)
    }

    const W: u32 = 160;
    const H: u32 = 120;

    #[test]
    fn the_start_pose_sees_the_far_wall_above_the_floor_below_the_ceiling() {
        let (spec, scene) = room();
        let rgb = render(&scene, spec.start, W, H, 60.0);
        assert_eq!(rgb.len(), (W * H * 3) as usize);
        let centre = pixel(&rgb, W, W / 2, H / 2);
        assert!(
            is(centre, WALL_EAST),
            "facing +x: the east wall, got {centre:?}"
        );
        assert_eq!(pixel(&rgb, W, W / 2, 0), SKY);
        assert!(is(pixel(&rgb, W, W / 2, H - 1), FLOOR));
        // 5 m to the wall: a band around the horizon, not the whole column.
        assert_eq!(pixel(&rgb, W, W / 2, H / 2 - 30), SKY);
        assert!(is(pixel(&rgb, W, W / 2, H / 2 - 15), WALL_EAST));
    }

    #[test]
    fn turning_toward_the_crate_puts_it_in_the_middle() {
        let (spec, scene) = room();
        let before = render(&scene, spec.start, W, H, 60.0);
        // The crate spans x 3.5-4.5, y 3-4; from (1, 2) its near face is
        // at about 27-40 degrees.
        let toward = Pose {
            heading: 33f64.to_radians(),
            ..spec.start
        };
        let after = render(&scene, toward, W, H, 60.0);
        assert_ne!(before, after);
        let centre = pixel(&after, W, W / 2, H / 2 + 2);
        assert!(is(centre, CRATE), "the crate, got {centre:?}");
        // Its top is lower than the wall behind it: the wall shows above.
        let above = (0..H / 2)
            .map(|y| pixel(&after, W, W / 2, y))
            .any(|p| is(p, WALL_NORTH) || is(p, WALL_EAST));
        assert!(above, "the wall behind shows above the crate");
    }

    #[test]
    fn the_object_shows_on_the_floor_unless_held() {
        let (spec, scene) = room();
        // The object lies at (2, 1): from (1, 2) at -45 degrees.
        let toward = Pose {
            heading: (-45f64).to_radians(),
            ..spec.start
        };
        let seen = render(&scene, toward, W, H, 60.0);
        let red = |rgb: &[u8]| {
            (0..H)
                .flat_map(|y| (0..W).map(move |x| (x, y)))
                .filter(|&(x, y)| is(pixel(rgb, W, x, y), OBJECT))
                .count()
        };
        let count = red(&seen);
        assert!(count > 10, "{count} object pixels");
        // 1.4 m away, below the horizon (it lies on the floor).
        assert!(is(pixel(&seen, W, W / 2, H / 2 + 18), OBJECT));
        assert!(!is(pixel(&seen, W, W / 2, H / 2 - 2), OBJECT));
        let held = Scene {
            object: None,
            ..scene
        };
        assert_eq!(red(&render(&held, toward, W, H, 60.0)), 0);
    }

    #[test]
    fn each_wall_has_its_own_colour() {
        let (spec, scene) = room();
        let looking = |deg: f64| {
            let pose = Pose {
                x: 2.0,
                y: 2.0,
                heading: deg.to_radians(),
            };
            pixel(&render(&scene, pose, W, H, 60.0), W, W / 2, H / 2)
        };
        assert!(is(looking(0.0), WALL_EAST));
        assert!(is(looking(90.0), WALL_NORTH));
        assert!(is(looking(180.0), WALL_WEST));
        assert!(is(looking(270.0), WALL_SOUTH));
        let _ = spec;
    }
}
