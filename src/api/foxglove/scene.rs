//! The simulated world as a `foxglove.SceneUpdate`: the room's floor and
//! walls, its obstacles, the object, and the rover with an arrow for its
//! heading, in frame `world` (metres, z up). Pure.

use serde_json::{Value, json};

use crate::hw::sim_world::{WorldSpec, WorldView};

const WALL: f64 = 0.05;
const HEIGHT: f64 = 0.3;

fn pose(x: f64, y: f64, z: f64, yaw: f64) -> Value {
    json!({
        "position": {"x": x, "y": y, "z": z},
        "orientation": {"x": 0.0, "y": 0.0, "z": (yaw / 2.0).sin(), "w": (yaw / 2.0).cos()}
    })
}

fn color(r: f64, g: f64, b: f64, a: f64) -> Value {
    json!({"r": r, "g": g, "b": b, "a": a})
}

fn cube(cx: f64, cy: f64, sx: f64, sy: f64, sz: f64, c: Value) -> Value {
    json!({"pose": pose(cx, cy, sz / 2.0, 0.0), "size": {"x": sx, "y": sy, "z": sz}, "color": c})
}

/// The scene at `at_unix_ms`.
pub(super) fn scene(spec: &WorldSpec, view: &WorldView, at_unix_ms: i64) -> Value {
    let ms = at_unix_ms.max(0);
    let stamp = json!({"sec": ms / 1000, "nsec": (ms % 1000) * 1_000_000});
    let (w, d) = (spec.width, spec.depth);
    let wall = color(0.6, 0.6, 0.65, 1.0);
    let mut room = vec![
        // The floor, then the four walls.
        json!({"pose": pose(w / 2.0, d / 2.0, -0.005, 0.0),
               "size": {"x": w, "y": d, "z": 0.01}, "color": color(0.9, 0.9, 0.88, 1.0)}),
        cube(w / 2.0, -WALL / 2.0, w, WALL, HEIGHT, wall.clone()),
        cube(w / 2.0, d + WALL / 2.0, w, WALL, HEIGHT, wall.clone()),
        cube(-WALL / 2.0, d / 2.0, WALL, d, HEIGHT, wall.clone()),
        cube(w + WALL / 2.0, d / 2.0, WALL, d, HEIGHT, wall),
    ];
    room.extend(spec.obstacles.iter().map(|o| {
        cube(
            (o.min_x + o.max_x) / 2.0,
            (o.min_y + o.max_y) / 2.0,
            o.max_x - o.min_x,
            o.max_y - o.min_y,
            HEIGHT,
            color(0.55, 0.35, 0.2, 1.0),
        )
    }));
    let heading = view.heading_deg.to_radians();
    let r = spec.rover_radius;
    let body_color = if view.bumper {
        color(0.9, 0.2, 0.2, 1.0)
    } else {
        color(0.2, 0.45, 0.9, 1.0)
    };
    let mut entities = vec![
        json!({"timestamp": stamp, "frame_id": "world", "id": "room",
               "lifetime": {"sec": 0, "nsec": 0}, "frame_locked": false, "metadata": [],
               "cubes": room, "arrows": [], "spheres": [], "cylinders": [], "lines": [],
               "triangles": [], "texts": [], "models": []}),
        json!({"timestamp": stamp, "frame_id": "world", "id": "rover",
               "lifetime": {"sec": 0, "nsec": 0}, "frame_locked": false,
               "metadata": [{"key": "speed", "value": view.speed.to_string()}],
               "cylinders": [{"pose": pose(view.x, view.y, 0.1, heading),
                              "size": {"x": 2.0 * r, "y": 2.0 * r, "z": 0.2},
                              "bottom_scale": 1.0, "top_scale": 1.0, "color": body_color}],
               "arrows": [{"pose": pose(view.x, view.y, 0.25, heading),
                           "shaft_length": r * 1.5, "shaft_diameter": 0.03,
                           "head_length": r * 0.6, "head_diameter": 0.08,
                           "color": color(1.0, 0.8, 0.0, 1.0)}],
               "cubes": [], "spheres": [], "lines": [], "triangles": [], "texts": [], "models": []}),
    ];
    if let Some([x, y]) = view.object {
        entities.push(json!({"timestamp": stamp, "frame_id": "world", "id": "object",
            "lifetime": {"sec": 0, "nsec": 0}, "frame_locked": false, "metadata": [],
            "spheres": [{"pose": pose(x, y, 0.05, 0.0), "size": {"x": 0.1, "y": 0.1, "z": 0.1},
                         "color": color(0.1, 0.8, 0.3, 1.0)}],
            "cubes": [], "arrows": [], "cylinders": [], "lines": [], "triangles": [], "texts": [], "models": []}));
    }
    json!({"deletions": [], "entities": entities})
}
