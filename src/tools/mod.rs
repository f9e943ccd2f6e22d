//! Host tools: generated from the configured sensors and actuators and run
//! inside rozd (no `ToolRequest` to the client).
//!
//! - `observe` (PURE): the current Observation, optionally filtered by sensor names;
//! - `read_sensor` (PURE): one sensor's latest value; its history when asked;
//! - one PHYSICAL tool per actuator, named after it, taking `{value, hold_ms?}`;
//! - `stop_all` (PHYSICAL): every actuator to its safe value;
//! - `serial_query` (PHYSICAL): only when a `[[serial]]` port has `allow_raw = true`;
//! - `list_cameras` and `capture_image` (PURE): only when `[[cameras]]` are
//!   configured; `capture_image` answers with the image itself (a JPEG
//!   fitted to the camera's `max_image_px` and `max_image_kb`).
//!
//! One tool per actuator (rather than a generic `actuate`) lets each schema
//! carry that actuator's own range or allowed set, unit and description, so
//! the model sees exactly what it may send and JSON Schema validation rejects
//! the rest before anything moves.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::types::ToolCategory;
use crate::hw::config::ValueSet;
use crate::ooda::Ooda;
use crate::ooda::act::{ActError, Origin};

mod spec;
pub use spec::ToolSpec;

pub const OBSERVE: &str = "observe";
pub const READ_SENSOR: &str = "read_sensor";
pub const STOP_ALL: &str = "stop_all";
pub const SERIAL_QUERY: &str = "serial_query";
pub const LIST_CAMERAS: &str = "list_cameras";
pub const CAPTURE_IMAGE: &str = "capture_image";
/// Names no actuator may take, since host tools use them.
pub const RESERVED: &[&str] = &[
    OBSERVE,
    READ_SENSOR,
    STOP_ALL,
    SERIAL_QUERY,
    LIST_CAMERAS,
    CAPTURE_IMAGE,
];

/// A host tool's answer: JSON text, and images for the model to see.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Answer {
    pub text: String,
    pub images: Vec<Image>,
}

impl From<String> for Answer {
    fn from(text: String) -> Answer {
        Answer {
            text,
            images: Vec::new(),
        }
    }
}

/// An image a host tool returns (`capture_image`).
#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    /// `image/jpeg`.
    pub media_type: String,
    pub data: bytes::Bytes,
}

/// Most samples of history `read_sensor` returns when asked (what the
/// world keeps). By default it returns none: a small local model's context
/// fills with a handful of reads otherwise (about 1 KB each with 20).
const READ_HISTORY_MAX: u64 = 128;
/// Upper bound of a `serial_query` reply wait.
const SERIAL_QUERY_MAX_MS: u64 = 10_000;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ToolError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    SafetyViolation(String),
    #[error("{0}")]
    EStop(String),
    #[error("{0}")]
    Held(String),
    #[error("{0}")]
    Timeout(String),
    #[error("{0}")]
    Failed(String),
    /// The device could not be reached or refused (a Modbus exception, a
    /// link down): `host_unavailable`.
    #[error("{0}")]
    Unavailable(String),
}

impl From<ActError> for ToolError {
    fn from(e: ActError) -> Self {
        let text = e.to_string();
        match e {
            ActError::Unknown(_) => ToolError::Invalid(text),
            ActError::SafetyViolation { .. } => ToolError::SafetyViolation(text),
            ActError::EStop { .. } => ToolError::EStop(text),
            ActError::Held { .. } => ToolError::Held(text),
            ActError::Timeout { .. } => ToolError::Timeout(text),
            ActError::Driver {
                error: crate::hw::HwError::Modbus { .. },
                ..
            } => ToolError::Unavailable(text),
            ActError::Driver { .. } | ActError::Abandoned { .. } | ActError::Closed { .. } => {
                ToolError::Failed(text)
            }
        }
    }
}

#[derive(Debug)]
pub struct HostTools {
    ooda: Arc<Ooda>,
    defs: Vec<ToolSpec>,
    raw_ports: Vec<String>,
    cameras: Arc<crate::camera::Cameras>,
}

impl HostTools {
    pub fn new(
        ooda: Arc<Ooda>,
        raw_ports: Vec<String>,
        cameras: Arc<crate::camera::Cameras>,
    ) -> HostTools {
        let sensors: Vec<String> = ooda
            .world()
            .specs()
            .iter()
            .map(|s| s.name.clone())
            .collect();
        // A host without sensors offers no reading tools, one without
        // actuators no PHYSICAL ones.
        let mut defs = Vec::new();
        if !sensors.is_empty() {
            defs.extend([
            ToolSpec {
                name: OBSERVE.into(),
                description: "The host's current Observation: every sensor's value, unit, age, health and alarm, \
                              actuator states and the protective-stop state. Optionally only some sensors."
                    .into(),
                parameters_schema: json!({
                    "type": "object",
                    "properties": {"sensors": {"type": "array", "items": {"type": "string", "enum": sensors}}},
                    "additionalProperties": false
                }),
                category: ToolCategory::Pure,
                timeout_ms: spec::millis(Duration::from_secs(1)),
            },
            ToolSpec {
                name: READ_SENSOR.into(),
                description: "One sensor's latest value, its age, unit, health and alarm. \
                              Its recent history (newest last) only when asked for with `history`."
                    .into(),
                parameters_schema: json!({
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "enum": sensors},
                        "history": {"type": "integer", "minimum": 0, "maximum": READ_HISTORY_MAX,
                                    "description": "also return up to this many recent samples (default 0)"}
                    },
                    "required": ["name"],
                    "additionalProperties": false
                }),
                category: ToolCategory::Pure,
                timeout_ms: spec::millis(Duration::from_secs(1)),
            },
        ]);
        }
        for spec in ooda.actuators().specs() {
            let unit = spec
                .unit
                .as_deref()
                .map(|u| format!(" in {u}"))
                .unwrap_or_default();
            let mut value = match &spec.values {
                ValueSet::Range { min, max } => {
                    json!({"type": "number", "minimum": min, "maximum": max})
                }
                ValueSet::Allowed(values) => json!({"type": "number", "enum": values}),
            };
            value["description"] = json!(format!("the value to set{unit}"));
            let hold = match spec.hold {
                Some(h) => format!(
                    " A command holds for at most {} ms, then the actuator returns to its safe value unless renewed.",
                    h.as_millis()
                ),
                None => " A command holds until changed.".to_string(),
            };
            // A command is not a result: say what the answer proves.
            let (verified, verdict_wait) = match &spec.feedback {
                Some(f) => (
                    format!(
                        " After the command rozd watches sensor `{}` for up to {} ms and answers with \
                         `commanded`, `measured`, `status` and `settled_ms`: only status `confirmed` means \
                         the hardware did it; `mismatch` means the sensor measured something else \
                         (it did not), `unconfirmed` that no fresh measurement came (nobody knows).",
                        f.sensor,
                        f.settle.as_millis()
                    ),
                    f.settle + ooda.verdict_grace(),
                ),
                None => (
                    " Nothing measures this actuator: a result only means the command was sent; \
                     check the sensors to see what it did."
                        .to_string(),
                    Duration::ZERO,
                ),
            };
            defs.push(ToolSpec {
                name: spec.name.clone(),
                description: format!(
                    "Sets actuator `{}`{}{}. Allowed: {}; safe value {}.{}{}",
                    spec.name,
                    spec.description.as_deref().map(|d| format!(" ({d})")).unwrap_or_default(),
                    unit,
                    spec.values,
                    spec.safe_value,
                    hold,
                    verified
                ),
                parameters_schema: json!({
                    "type": "object",
                    "properties": {
                        "value": value,
                        "hold_ms": {"type": "integer", "minimum": 1, "description": "hold for at most this long (never longer than the host allows)"}
                    },
                    "required": ["value"],
                    "additionalProperties": false
                }),
                category: ToolCategory::Physical,
                // The driver's deadline, then the wait for the verdict.
                timeout_ms: spec::millis(spec.timeout + verdict_wait),
            });
        }
        let has_actuators = ooda.actuators().specs().next().is_some();
        if has_actuators {
            defs.push(ToolSpec {
                name: STOP_ALL.into(),
                description: "Drives every actuator to its safe value now.".into(),
                parameters_schema: json!({"type": "object", "properties": {}, "additionalProperties": false}),
                category: ToolCategory::Physical,
                timeout_ms: spec::millis(
                    ooda.actuators()
                        .specs()
                        .map(|s| s.timeout)
                        .max()
                        .unwrap_or(Duration::from_secs(1)),
                ),
            });
        }
        if !raw_ports.is_empty() {
            defs.push(ToolSpec {
                name: SERIAL_QUERY.into(),
                description: "Sends raw text to a serial device and optionally waits for a reply line matching \
                              a regular expression."
                    .into(),
                parameters_schema: json!({
                    "type": "object",
                    "properties": {
                        "port": {"type": "string", "enum": raw_ports},
                        "command": {"type": "string", "maxLength": 1024},
                        "expect": {"type": "string", "description": "regex the reply line must match"},
                        "timeout_ms": {"type": "integer", "minimum": 1, "maximum": SERIAL_QUERY_MAX_MS}
                    },
                    "required": ["port", "command"],
                    "additionalProperties": false
                }),
                category: ToolCategory::Physical,
                timeout_ms: spec::millis(Duration::from_millis(SERIAL_QUERY_MAX_MS)),
            });
        }
        if !cameras.is_empty() {
            defs.extend(camera_tools(&cameras));
        }
        HostTools {
            ooda,
            defs,
            raw_ports,
            cameras,
        }
    }

    pub fn definitions(&self) -> &[ToolSpec] {
        &self.defs
    }

    /// The protective stop's causes (none: not latched).
    pub fn protective_stop(&self) -> crate::safety::StopState {
        self.ooda.protective_stop().state()
    }

    pub fn get(&self, name: &str) -> Option<&ToolSpec> {
        self.defs.iter().find(|d| d.name == name)
    }

    /// Runs a host tool (parameters already validated against its schema).
    /// The result is JSON text for the model.
    pub async fn execute(
        &self,
        name: &str,
        input: &Value,
        session_id: &str,
    ) -> Result<Answer, ToolError> {
        let def = self
            .get(name)
            .ok_or_else(|| ToolError::Invalid(format!("unknown host tool `{name}`")))?;
        if name == CAPTURE_IMAGE {
            return self.capture_image(input).await;
        }
        let run = async { self.run(name, input, session_id).await.map(Answer::from) };
        if def.category == ToolCategory::Pure {
            return run.await;
        }
        // In-flight PHYSICAL calls fail as soon as a protective stop latches.
        let mut stop = self.ooda.protective_stop().subscribe();
        let latched = stop.borrow_and_update().clone();
        if latched.is_active() {
            return Err(ToolError::EStop(format!(
                "protective stop is active ({})",
                latched.describe()
            )));
        }
        // The stop first: a call that finishes as the stop latches (one
        // whose own feedback mismatch latched it, say) fails with e_stop.
        tokio::select! {
            biased;
            () = async { let _ = stop.wait_for(crate::safety::StopState::is_active).await; } => {
                // Its causes say why.
                Err(ToolError::EStop(format!(
                    "a protective stop latched while the call was running ({})",
                    self.ooda.protective_stop().state().describe()
                )))
            }
            result = run => result,
            // Actuator commands bound their driver with the actuator's deadline
            // and then drive the safe value (bounded the same way), so they
            // finish within twice the deadline. This backstop is for anything
            // that does not; a PHYSICAL tool that hits it still goes safe.
            () = tokio::time::sleep(def.timeout() * 2 + Duration::from_secs(1)) => {
                if self.ooda.actuators().spec(name).is_some() {
                    let _ = self.ooda.actuators().safe(name, "host tool backstop deadline").await;
                }
                Err(ToolError::Timeout(format!("`{name}` did not finish within {} ms", def.timeout_ms)))
            }
        }
    }

    async fn run(&self, name: &str, input: &Value, session_id: &str) -> Result<String, ToolError> {
        let obs = self.ooda.observe_now();
        match name {
            OBSERVE => {
                let input: ObserveInput = parse(input)?;
                let mut v =
                    serde_json::to_value(&obs).map_err(|e| ToolError::Failed(e.to_string()))?;
                if let (Some(wanted), Some(sensors)) = (
                    input.sensors,
                    v.get_mut("sensors").and_then(Value::as_array_mut),
                ) {
                    sensors.retain(|s| {
                        s.get("name")
                            .and_then(Value::as_str)
                            .is_some_and(|n| wanted.iter().any(|w| w == n))
                    });
                }
                if let Some(map) = v.as_object_mut() {
                    map.remove("sources");
                    // Each camera's health, without pictures (`capture_image` looks).
                    if !self.cameras.is_empty() {
                        map.insert("cameras".into(), camera_health(&self.cameras));
                    }
                }
                Ok(v.to_string())
            }
            READ_SENSOR => {
                let ReadSensorInput {
                    name: sensor,
                    history: wanted,
                } = parse(input)?;
                let wanted = wanted.map_or(0, |n| n.0);
                if wanted > READ_HISTORY_MAX {
                    return Err(ToolError::Invalid(format!(
                        "history must be at most {READ_HISTORY_MAX} samples, got {wanted}"
                    )));
                }
                let (view, history) = self
                    .ooda
                    .world()
                    .sensor(&sensor, tokio::time::Instant::now())
                    .ok_or_else(|| ToolError::Invalid(format!("no sensor named {sensor:?}")))?;
                let alarm = obs.sensor(&sensor).map(|s| s.alarm).unwrap_or_default();
                let mut answer = json!({"sensor": view, "alarm": alarm});
                if wanted > 0 {
                    let take = usize::try_from(wanted).unwrap_or(usize::MAX);
                    let recent: Vec<_> = history.iter().rev().take(take).rev().collect();
                    answer["history"] = json!(recent);
                }
                Ok(answer.to_string())
            }
            STOP_ALL => {
                // Going safe takes no parameters and is refused for none.
                self.ooda
                    .actuators()
                    .safe_all(&format!("stop_all by session {session_id}"))
                    .await;
                Ok(json!({"stopped": self.ooda.actuators().specs().map(|s| s.name.clone()).collect::<Vec<_>>()}).to_string())
            }
            LIST_CAMERAS => {
                let _: EmptyInput = parse(input)?;
                let views = self.cameras.views();
                Ok(json!({ "cameras": views }).to_string())
            }
            SERIAL_QUERY => {
                let SerialQueryInput {
                    port,
                    command,
                    expect,
                    timeout_ms,
                } = parse(input)?;
                if !self.raw_ports.contains(&port) {
                    return Err(ToolError::Invalid(format!(
                        "port {port:?} does not allow raw queries"
                    )));
                }
                let handle = self
                    .ooda
                    .serial_port(&port)
                    .ok_or_else(|| ToolError::Invalid(format!("no serial port {port:?}")))?;
                let expect = expect
                    .as_deref()
                    .map(regex::Regex::new)
                    .transpose()
                    .map_err(|e| ToolError::Invalid(format!("expect is not a valid regex: {e}")))?;
                let timeout = Duration::from_millis(
                    timeout_ms.map_or(1_000, |n| n.0).min(SERIAL_QUERY_MAX_MS),
                );
                match handle
                    .command(command.as_bytes(), expect.as_ref(), timeout)
                    .await
                {
                    Ok(reply) => Ok(json!({"port": port, "reply": reply}).to_string()),
                    Err(crate::hw::HwError::Timeout(ms)) => Err(ToolError::Timeout(format!(
                        "no matching reply from {port} within {ms} ms"
                    ))),
                    Err(e) => Err(ToolError::Failed(format!("{port}: {e}"))),
                }
            }
            actuator => {
                let ActuatorInput { value, hold_ms } = parse(input)?;
                let actuators = self.ooda.actuators();
                let applied = actuators
                    .command(
                        actuator,
                        value,
                        Origin::Session(session_id.to_string()),
                        hold_ms.map(|n| Duration::from_millis(n.0)),
                    )
                    .await?;
                let mut result =
                    serde_json::to_value(&applied).map_err(|e| ToolError::Failed(e.to_string()))?;
                // The model reads what was measured in the same result.
                if let (Some(started), Some(spec)) = (
                    &applied.watch,
                    actuators.spec(actuator).and_then(|s| s.feedback.as_ref()),
                ) {
                    let wait = spec.settle + self.ooda.verdict_grace();
                    let verdict = actuators.verdict(actuator, started, wait).await;
                    add_verdict(&mut result, spec, value, verdict);
                }
                Ok(result.to_string())
            }
        }
    }
}

/// Adds the feedback verdict on `commanded` to an actuator tool's result:
/// `commanded`, `expected`, `measured`, `status`, `settled_ms`, `reason`
/// (`unconfirmed` when no verdict came within the wait).
fn add_verdict(
    result: &mut Value,
    spec: &crate::hw::config::FeedbackSpec,
    commanded: f64,
    verdict: Option<crate::ooda::feedback::Verdict>,
) {
    let fields = match verdict {
        Some(v) => json!({
            "commanded": v.commanded,
            "expected": v.expected,
            "measured": v.measured,
            "tolerance": v.tolerance,
            "status": v.status,
            "settled_ms": v.settled_ms,
            "reason": v.reason,
        }),
        None => json!({
            "commanded": commanded,
            "expected": spec.expected(commanded),
            "measured": null,
            "tolerance": spec.tolerance,
            "status": crate::ooda::feedback::FeedbackStatus::Unconfirmed,
            "settled_ms": null,
            "reason": "no verdict came in time",
        }),
    };
    if let (Some(result), Value::Object(fields)) = (result.as_object_mut(), fields) {
        result.extend(fields);
    }
}

impl HostTools {
    /// `capture_image`: the camera's latest frame, fitted to its bounds
    /// (and `max_width`) off the runtime's threads.
    async fn capture_image(&self, input: &Value) -> Result<Answer, ToolError> {
        let CaptureInput { camera, max_width } = parse(input)?;
        let camera = self.cameras.find(&camera).map_err(ToolError::Invalid)?;
        let now = std::time::Instant::now();
        let view = camera.view(now);
        let frame = match camera.latest() {
            Some(frame) if frame.age_ms(now) <= camera.spec.stale_after.as_millis() as u64 => frame,
            _ => {
                return Err(ToolError::Failed(format!(
                    "camera {:?} has no recent frame (health {}{})",
                    camera.name(),
                    view.health.health.as_str(),
                    view.health
                        .last_error
                        .as_deref()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                )));
            }
        };
        let mut edge = camera.spec.max_image_px;
        if let Some(w) = max_width {
            let w = w.0.max(MIN_CAPTURE_WIDTH);
            // The long edge that makes the picture at most `w` wide.
            let scaled = (u64::from(frame.height.max(frame.width)) * w
                / u64::from(frame.width.max(1)))
            .min(u64::from(edge));
            edge = u32::try_from(scaled).unwrap_or(edge).max(1);
        }
        let (max_bytes, quality) = (camera.spec.max_image_bytes, camera.spec.jpeg_quality);
        let jpeg = frame.jpeg.clone();
        let fitted = tokio::task::spawn_blocking(move || {
            crate::camera::jpeg::fit(&jpeg, edge, max_bytes, quality)
        })
        .await
        .map_err(|e| ToolError::Failed(format!("the image could not be prepared: {e}")))?
        .map_err(|e| ToolError::Failed(format!("the image could not be prepared: {e}")))?;
        let text = json!({
            "camera": camera.name(),
            "format": "jpeg",
            "width": fitted.width,
            "height": fitted.height,
            "bytes": fitted.jpeg.len(),
            "age_ms": frame.age_ms(std::time::Instant::now()),
            "captured_at_unix_ms": frame.at_unix_ms,
            "health": view.health.health,
        })
        .to_string();
        Ok(Answer {
            text,
            images: vec![Image {
                media_type: "image/jpeg".into(),
                data: fitted.jpeg.into(),
            }],
        })
    }
}

/// Parameters of a tool that takes none.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EmptyInput {}

/// `capture_image`'s parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CaptureInput {
    camera: String,
    max_width: Option<WholeNumber>,
}

/// Smallest `max_width` a model may ask for.
const MIN_CAPTURE_WIDTH: u64 = 32;

/// The camera tools, described from the configured cameras.
fn camera_tools(cameras: &crate::camera::Cameras) -> Vec<ToolSpec> {
    let names = cameras.names();
    let listing: Vec<String> = cameras
        .iter()
        .map(|c| match &c.spec.description {
            Some(d) => format!("`{}` ({d})", c.spec.name),
            None => format!("`{}`", c.spec.name),
        })
        .collect();
    let largest = cameras
        .iter()
        .map(|c| c.spec.max_image_px)
        .max()
        .unwrap_or(1568);
    vec![
        ToolSpec {
            name: LIST_CAMERAS.into(),
            description: format!(
                "The host's cameras ({}) with their health (ok, stale, disconnected, error,                  starting), frames per second, picture size and the age of the latest frame.                  No pictures: call capture_image to look.",
                listing.join(", ")
            ),
            parameters_schema: json!({"type": "object", "properties": {}, "additionalProperties": false}),
            category: ToolCategory::Pure,
            timeout_ms: spec::millis(Duration::from_secs(1)),
        },
        ToolSpec {
            name: CAPTURE_IMAGE.into(),
            description: format!(
                "Looks through one of the host's cameras: returns its latest frame as a JPEG                  image you can see (at most {largest} pixels on the long edge, smaller with                  max_width), with a line of text giving the camera, the picture's size and how old                  it is in milliseconds. Cameras: {}. A camera that has no recent frame answers                  with an error saying why.",
                listing.join(", ")
            ),
            parameters_schema: json!({
                "type": "object",
                "properties": {
                    "camera": {"type": "string", "enum": names},
                    "max_width": {"type": "integer", "minimum": MIN_CAPTURE_WIDTH,
                                  "description": "downscale so the picture is at most this wide"}
                },
                "required": ["camera"],
                "additionalProperties": false
            }),
            category: ToolCategory::Pure,
            timeout_ms: spec::millis(Duration::from_secs(5)),
        },
    ]
}

/// Each camera's health for `observe`: name, health, fps, size, age.
fn camera_health(cameras: &crate::camera::Cameras) -> Value {
    Value::Array(
        cameras
            .views()
            .into_iter()
            .map(|v| {
                json!({
                    "name": v.name,
                    "health": v.health.health,
                    "fps": v.health.fps,
                    "width": v.health.width,
                    "height": v.health.height,
                    "age_ms": v.health.age_ms,
                })
            })
            .collect(),
    )
}

/// `observe`'s parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ObserveInput {
    sensors: Option<Vec<String>>,
}

/// `read_sensor`'s parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadSensorInput {
    name: String,
    history: Option<WholeNumber>,
}

/// `serial_query`'s parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SerialQueryInput {
    port: String,
    command: String,
    expect: Option<String>,
    timeout_ms: Option<WholeNumber>,
}

/// An actuator tool's parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ActuatorInput {
    value: f64,
    hold_ms: Option<WholeNumber>,
}

/// A tool's parameters as their type. The schema has already been checked,
/// so this refuses only what the schema cannot say (a whole number written
/// `500.5`); the message names the parameter.
/// No parameters at all (`null`) are taken as none given (`{}`).
fn parse<T: serde::de::DeserializeOwned>(input: &Value) -> Result<T, ToolError> {
    let none = Value::Object(serde_json::Map::new());
    let input = if input.is_null() { &none } else { input };
    T::deserialize(input).map_err(|e| ToolError::Invalid(e.to_string()))
}

/// A non-negative whole number. JSON Schema's `integer` admits `500.0` as
/// well as `500`, so both are taken as 500; anything else is refused,
/// never silently dropped. Above `u64::MAX` it saturates (callers bound it).
#[derive(Debug, Clone, Copy, PartialEq)]
struct WholeNumber(u64);

impl<'de> Deserialize<'de> for WholeNumber {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(d)?;
        if let Some(n) = value.as_u64() {
            return Ok(WholeNumber(n));
        }
        match value.as_f64() {
            // The cast saturates at u64::MAX.
            Some(f) if f.is_finite() && f >= 0.0 && f.fract() == 0.0 => Ok(WholeNumber(f as u64)),
            _ => Err(serde::de::Error::custom(format!(
                "must be a non-negative whole number, got {value}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_numbers_are_taken_in_either_json_spelling_and_others_refused() {
        let get = |v: Value| parse::<ActuatorInput>(&json!({ "value": 0.0, "hold_ms": v }));
        let hold = |v: Value| get(v).unwrap().hold_ms.map(|n| n.0);
        assert_eq!(hold(json!(500)), Some(500));
        assert_eq!(hold(json!(500.0)), Some(500));
        assert_eq!(hold(json!(0)), Some(0));
        assert_eq!(hold(json!(1e300)), Some(u64::MAX), "saturates");
        for bad in [json!(500.5), json!(-1), json!(-1.0), json!("500")] {
            let err = get(bad.clone()).unwrap_err().to_string();
            assert!(err.contains("non-negative whole number"), "{bad}: {err}");
        }
        let absent = parse::<ActuatorInput>(&json!({ "value": 0.0 })).unwrap();
        assert_eq!(absent.hold_ms, None);
    }

    #[test]
    fn parameters_are_typed_and_unknown_ones_refused() {
        let err = parse::<ActuatorInput>(&json!({ "value": 0.1, "speed": 1 }))
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `speed`"), "{err}");
        let err = parse::<ActuatorInput>(&json!({ "value": "fast" }))
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid type"), "{err}");
        let err = parse::<ReadSensorInput>(&json!({}))
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing field `name`"), "{err}");
        let q: SerialQueryInput =
            parse(&json!({ "port": "p", "command": "c", "timeout_ms": 20.0 })).unwrap();
        assert_eq!(q.timeout_ms, Some(WholeNumber(20)));
        assert_eq!(q.expect, None);
        let o: ObserveInput = parse(&json!({})).unwrap();
        assert_eq!(o.sensors, None);
        let o: ObserveInput = parse(&Value::Null).unwrap();
        assert_eq!(o.sensors, None);
    }
}
