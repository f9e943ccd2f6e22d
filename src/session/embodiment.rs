//! What a session is told about the robot before its first word: the
//! embodiment, generated from the validated configuration (never hand-kept),
//! and the operator's manual (`[agent] manual_file`), together with a
//! version (a hash of both) that the session row records.
//!
//! Pure: [`Embodiment::render`] takes the config, the host tools and the
//! permission policy; [`Manual::read`] is the only I/O, a bounded file read.
//! [`Briefings`] holds the current [`Briefing`]; a SIGHUP swaps in a re-read
//! manual for new sessions while open ones keep the `Arc` they started with.

use parking_lot::RwLock;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::camera::config::CameraSpec;
use crate::config::types::{HostConfig, Policy, SafetyConfig, ToolCategory};
use crate::hw::config::{HardwareSpec, SensorSource, ValueSet};
use crate::ooda::rules::Rule;
use crate::session::permissions::PermissionPolicy;
use crate::tools::ToolSpec;

/// One sensor, as the embodiment describes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SensorView {
    pub name: String,
    pub unit: Option<String>,
    /// How it is read: `sim`, `serial`, `gpio`, `mqtt`, `system`, `replay`.
    pub source: &'static str,
    /// How often it is read, when rozd polls it (else on arrival).
    pub rate_hz: Option<f64>,
    pub warn_min: Option<f64>,
    pub warn_max: Option<f64>,
    pub critical_min: Option<f64>,
    pub critical_max: Option<f64>,
    pub hysteresis: f64,
    pub stale_after_ms: Option<u64>,
}

/// One actuator, as the embodiment describes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ActuatorView {
    pub name: String,
    pub unit: Option<String>,
    pub description: Option<String>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    /// A discrete set of values instead of a range.
    pub allowed: Option<Vec<f64>>,
    pub safe_value: f64,
    /// Longest hold of one command (then back to the safe value); absent:
    /// holds until changed.
    pub hold_ms: Option<u64>,
    pub max_rate_hz: Option<f64>,
    /// The whole budget of one call of its tool: the driver's deadline and
    /// the wait for the feedback verdict.
    pub call_timeout_ms: u32,
    /// Whether a call asks a person first (`allow`, `require_confirmation`, `block`).
    pub policy: &'static str,
    pub feedback: Option<FeedbackView>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FeedbackView {
    pub sensor: String,
    pub tolerance: f64,
    pub settle_ms: u64,
    pub on_mismatch: &'static str,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CameraView {
    pub name: String,
    pub description: Option<String>,
    pub source: &'static str,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RuleView {
    pub name: String,
    pub when: String,
    pub for_ms: u64,
    pub then: String,
    /// The rule in plain words.
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolPolicyView {
    pub name: String,
    pub category: &'static str,
    pub policy: &'static str,
}

/// The robot as its configuration describes it (`GET /v1/embodiment`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EmbodimentView {
    pub host_id: String,
    pub name: String,
    pub environment_id: String,
    pub sensors: Vec<SensorView>,
    pub actuators: Vec<ActuatorView>,
    pub cameras: Vec<CameraView>,
    pub rules: Vec<RuleView>,
    /// What triggers the protective stop besides the API, the CLI and `stop_all`.
    pub stop_inputs: Vec<String>,
    pub tools: Vec<ToolPolicyView>,
    /// How long a call may wait for a person's approval.
    pub approval_timeout_secs: u64,
    /// The default deadline of a PHYSICAL call through a driver.
    pub default_physical_timeout_ms: u32,
}

/// The embodiment: the data, its Markdown text for the model, and its size.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Embodiment {
    #[serde(flatten)]
    pub view: EmbodimentView,
    pub markdown: String,
    /// Estimated tokens of `markdown`.
    pub tokens: u32,
    /// The budget it was rendered under (`agent.embodiment_max_tokens`).
    pub max_tokens: u32,
    /// Sensors left out of `markdown` to stay under the budget (`observe` lists them).
    pub sensors_omitted: usize,
}

fn fmt_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn policy_str(p: Policy) -> &'static str {
    p.as_str()
}

/// The parts of the validated configuration the embodiment describes
/// (`Config::robot` gathers them).
#[derive(Debug, Clone, Copy)]
pub struct RobotConfig<'a> {
    pub host: &'a HostConfig,
    pub hardware: &'a HardwareSpec,
    pub rules: &'a [Rule],
    pub cameras: &'a [CameraSpec],
    pub safety: &'a SafetyConfig,
    pub approval_timeout_secs: u64,
    pub tick_hz: f64,
}

impl EmbodimentView {
    /// The view of a validated config, its host tools and its permissions.
    pub fn from_config(
        config: RobotConfig<'_>,
        host_tools: &[ToolSpec],
        permissions: &PermissionPolicy,
    ) -> EmbodimentView {
        let tick_hz = config.tick_hz;
        let sensors = config
            .hardware
            .sensors
            .iter()
            .map(|s| {
                let every = |d: &Duration| (!d.is_zero()).then(|| 1.0 / d.as_secs_f64());
                let (source, rate_hz) = match &s.source {
                    SensorSource::Serial { .. } => ("serial", None),
                    SensorSource::Gpio { poll, .. } => ("gpio", poll.as_ref().and_then(every)),
                    SensorSource::Mqtt { .. } => ("mqtt", None),
                    SensorSource::System { every: e, .. } => ("system", every(e)),
                    SensorSource::Sim(sim) => ("sim", every(&sim.every)),
                    SensorSource::World(_) => ("sim", Some(tick_hz)),
                    SensorSource::Replay(_) => ("replay", None),
                    SensorSource::Modbus { every: e, .. } => ("modbus", every(e)),
                };
                SensorView {
                    name: s.name.clone(),
                    unit: s.unit.clone(),
                    source,
                    rate_hz,
                    warn_min: s.alarms.warn_min,
                    warn_max: s.alarms.warn_max,
                    critical_min: s.alarms.critical_min,
                    critical_max: s.alarms.critical_max,
                    hysteresis: s.alarms.hysteresis,
                    stale_after_ms: s.stale_after.map(fmt_ms),
                }
            })
            .collect();
        let tool = |name: &str| host_tools.iter().find(|t| t.name == name);
        let actuators = config
            .hardware
            .actuators
            .iter()
            .map(|a| {
                let (min, max, allowed) = match &a.values {
                    ValueSet::Range { min, max } => (Some(*min), Some(*max), None),
                    ValueSet::Allowed(v) => (None, None, Some(v.clone())),
                };
                ActuatorView {
                    name: a.name.clone(),
                    unit: a.unit.clone(),
                    description: a.description.clone(),
                    min,
                    max,
                    allowed,
                    safe_value: a.safe_value,
                    hold_ms: a.hold.map(fmt_ms),
                    max_rate_hz: a.max_rate_hz,
                    call_timeout_ms: tool(&a.name).map_or_else(
                        || u32::try_from(a.timeout.as_millis()).unwrap_or(u32::MAX),
                        |t| t.timeout_ms,
                    ),
                    policy: policy_str(permissions.decide(&a.name, ToolCategory::Physical).policy),
                    feedback: a.feedback.as_ref().map(|f| FeedbackView {
                        sensor: f.sensor.clone(),
                        tolerance: f.tolerance,
                        settle_ms: fmt_ms(f.settle),
                        on_mismatch: f.on_mismatch.as_str(),
                    }),
                }
            })
            .collect();
        let cameras = config
            .cameras
            .iter()
            .map(|c| CameraView {
                name: c.name.clone(),
                description: c.description.clone(),
                source: c.source.kind().as_str(),
            })
            .collect();
        let rules = config
            .rules
            .iter()
            .map(|r| {
                let for_ms = fmt_ms(r.hold);
                let then = r.action.to_string();
                let held = if for_ms > 0 {
                    format!(" for {for_ms} ms")
                } else {
                    String::new()
                };
                RuleView {
                    name: r.name.clone(),
                    when: r.when.clone(),
                    for_ms,
                    text: format!("when `{}` holds{held}, rozd does: {then}", r.when),
                    then,
                }
            })
            .collect();
        let safety = &config.safety;
        let mut stop_inputs = Vec::new();
        if let Some(pin) = safety.estop_gpio_pin {
            let level = match safety.estop_gpio_active {
                Some(crate::config::types::Level::High) => "high",
                _ => "low",
            };
            stop_inputs.push(format!("GPIO pin {pin} (active {level})"));
        }
        if let Some(topic) = &safety.estop_mqtt_topic {
            stop_inputs.push(format!("MQTT topic `{topic}` (1, true or stop)"));
        }
        for r in config.rules {
            if matches!(r.action, crate::ooda::rules::Action::ProtectiveStop { .. }) {
                stop_inputs.push(format!("reflex rule `{}`", r.name));
            }
        }
        for a in &config.hardware.actuators {
            if let Some(f) = &a.feedback
                && f.on_mismatch == crate::hw::config::OnMismatch::Stop
            {
                stop_inputs.push(format!("a feedback mismatch of `{}`", a.name));
            }
        }
        let tools = host_tools
            .iter()
            .map(|t| ToolPolicyView {
                name: t.name.clone(),
                category: t.category.as_str(),
                policy: policy_str(permissions.decide(&t.name, t.category).policy),
            })
            .collect();
        EmbodimentView {
            host_id: config.host.id.clone(),
            name: config.host.display_name().to_string(),
            environment_id: config.host.environment_id.clone(),
            sensors,
            actuators,
            cameras,
            rules,
            stop_inputs,
            tools,
            approval_timeout_secs: config.approval_timeout_secs,
            default_physical_timeout_ms: safety.default_timeout_ms,
        }
    }
}

fn unit(u: &Option<String>) -> String {
    u.as_deref().map(|u| format!(" ({u})")).unwrap_or_default()
}

fn sensor_line(s: &SensorView) -> String {
    let mut parts = Vec::new();
    let u = s
        .unit
        .as_deref()
        .map(|u| format!(" {u}"))
        .unwrap_or_default();
    let mut alarms = Vec::new();
    for (label, below, value) in [
        ("critical", true, s.critical_min),
        ("warn", true, s.warn_min),
        ("warn", false, s.warn_max),
        ("critical", false, s.critical_max),
    ] {
        if let Some(v) = value {
            let side = if below { "below" } else { "above" };
            alarms.push(format!("{label} {side} {v}{u}"));
        }
    }
    if !alarms.is_empty() {
        let hyst = if s.hysteresis > 0.0 {
            format!(", clears {} inside", s.hysteresis)
        } else {
            String::new()
        };
        parts.push(format!("alarm {}{hyst}", alarms.join(", ")));
    }
    match s.rate_hz {
        Some(hz) => parts.push(format!("{}, read at {} Hz", s.source, round(hz))),
        None => parts.push(format!("{}, read on arrival", s.source)),
    }
    if let Some(ms) = s.stale_after_ms {
        parts.push(format!("stale after {ms} ms"));
    }
    format!("- `{}`{}: {}", s.name, unit(&s.unit), parts.join("; "))
}

fn round(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

fn actuator_line(a: &ActuatorView) -> String {
    let u = a
        .unit
        .as_deref()
        .map(|u| format!(" {u}"))
        .unwrap_or_default();
    let mut parts = Vec::new();
    if let Some(d) = &a.description {
        parts.push(d.clone());
    }
    match (&a.allowed, a.min, a.max) {
        (Some(values), _, _) => {
            let list: Vec<String> = values.iter().map(ToString::to_string).collect();
            parts.push(format!("only {{{}}}", list.join(", ")));
        }
        (None, Some(min), Some(max)) => parts.push(format!("range {min} to {max}{u}")),
        _ => {}
    }
    parts.push(format!("safe value {}{u}", a.safe_value));
    match a.hold_ms {
        Some(ms) => parts.push(format!(
            "a command holds at most {ms} ms, then back to safe unless renewed"
        )),
        None => parts.push("a command holds until changed".into()),
    }
    if let Some(hz) = a.max_rate_hz {
        parts.push(format!("at most {} commands/s", round(hz)));
    }
    match &a.feedback {
        Some(f) => parts.push(format!(
            "checked against `{}` (within {} after {} ms; on mismatch: {})",
            f.sensor, f.tolerance, f.settle_ms, f.on_mismatch
        )),
        None => parts.push("nothing measures it: check the sensors".into()),
    }
    parts.push(format!("call budget {} ms", a.call_timeout_ms));
    parts.push(match a.policy {
        "allow" => "runs without approval".to_string(),
        "block" => "blocked".to_string(),
        _ => "needs approval".to_string(),
    });
    format!("- `{}`{}: {}", a.name, unit(&a.unit), parts.join("; "))
}

impl EmbodimentView {
    /// The Markdown text with the first `sensors_shown` sensors listed.
    fn markdown(&self, sensors_shown: usize) -> String {
        let mut out = format!(
            "# This robot: host `{}` ({}), environment `{}`\n\
             Generated by rozd from its running configuration. The host enforces every limit \
             below: a value outside them is refused with `safety_violation`, never clamped.\n",
            self.host_id, self.name, self.environment_id
        );
        out.push_str(&format!("\n## Actuators ({})\n", self.actuators.len()));
        if self.actuators.is_empty() {
            out.push_str("None: this host cannot move anything.\n");
        }
        for a in &self.actuators {
            out.push_str(&actuator_line(a));
            out.push('\n');
        }
        out.push_str(&format!("\n## Sensors ({})\n", self.sensors.len()));
        for s in self.sensors.iter().take(sensors_shown) {
            out.push_str(&sensor_line(s));
            out.push('\n');
        }
        let omitted = self.sensors.len().saturating_sub(sensors_shown);
        if omitted > 0 {
            out.push_str(&format!(
                "- ... and {omitted} more sensors, left out to keep this short: call `observe` \
                 to see every sensor's value, unit and alarm, or `read_sensor` for one.\n"
            ));
        }
        out.push_str(
            "An alarm `warn` means a value is near its limit; `critical` means past it. A stale \
             sensor has no fresh value: do not act on it.\n",
        );
        if !self.cameras.is_empty() {
            out.push_str(&format!("\n## Cameras ({})\n", self.cameras.len()));
            for c in &self.cameras {
                let d = c
                    .description
                    .as_deref()
                    .map(|d| format!(": {d}"))
                    .unwrap_or_default();
                out.push_str(&format!("- `{}` ({}){d}\n", c.name, c.source));
            }
            out.push_str("Look through them with `capture_image`.\n");
        }
        out.push_str(&format!("\n## Reflex rules ({})\n", self.rules.len()));
        if self.rules.is_empty() {
            out.push_str("None.\n");
        } else {
            out.push_str("They run every tick without any model and override you:\n");
        }
        for r in &self.rules {
            out.push_str(&format!("- `{}`: {}\n", r.name, r.text));
        }
        out.push_str(
            "\n## Protective stop\nLatched: every actuator goes to its safe value within one \
             tick, PHYSICAL calls fail with `e_stop` until a person clears it, and clearing never \
             restarts motion. `stop_all` drives everything safe at once and never waits for \
             approval. Triggered by: the API, the CLI, the dashboard",
        );
        for input in &self.stop_inputs {
            out.push_str(", ");
            out.push_str(input);
        }
        out.push_str(".\n");
        let asks: Vec<&str> = self
            .tools
            .iter()
            .filter(|t| t.policy == "require_confirmation")
            .map(|t| t.name.as_str())
            .collect();
        let blocked: Vec<&str> = self
            .tools
            .iter()
            .filter(|t| t.policy == "block")
            .map(|t| t.name.as_str())
            .collect();
        out.push_str("\n## Approvals and time\n");
        let list = |v: &[&str]| {
            if v.is_empty() {
                "none".to_string()
            } else {
                v.iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        };
        out.push_str(&format!(
            "- Need a person's approval: {} (a person has {} s to answer).\n",
            list(&asks),
            self.approval_timeout_secs
        ));
        if !blocked.is_empty() {
            out.push_str(&format!("- Blocked: {}.\n", list(&blocked)));
        }
        out.push_str(&format!(
            "- A PHYSICAL call must finish within its call budget (default driver deadline {} \
             ms); past it the call fails and the actuator goes safe. A held value expires: \
             renew it or it returns to safe.\n",
            self.default_physical_timeout_ms
        ));
        out
    }
}

impl Embodiment {
    /// Renders the view under `max_tokens`: every actuator, rule and stop
    /// input always; as many sensors as fit, the rest pointed at `observe`.
    pub fn render(view: EmbodimentView, max_tokens: u32) -> Embodiment {
        let count = |text: &str| crate::model::tokens::count(text);
        let all = view.sensors.len();
        let mut shown = all;
        let mut markdown = view.markdown(shown);
        if count(&markdown) > max_tokens {
            // The largest prefix of sensors that fits (what is left without
            // sensors is never cut: it is what keeps the robot safe).
            let (mut low, mut high) = (0usize, all);
            while low < high {
                let mid = (low + high).div_ceil(2);
                if count(&view.markdown(mid)) <= max_tokens {
                    low = mid;
                } else {
                    high = mid - 1;
                }
            }
            shown = low;
            markdown = view.markdown(shown);
        }
        Embodiment {
            tokens: count(&markdown),
            max_tokens,
            sensors_omitted: all - shown,
            markdown,
            view,
        }
    }
}

/// The operator's manual, as read.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Manual {
    pub path: PathBuf,
    /// The file's text without its HTML comments (`<!-- ... -->`), which
    /// are notes for the people who edit it, not for the model.
    pub text: String,
}

/// `text` without `<!-- ... -->` comments (an unclosed one runs to the end).
pub(crate) fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("<!--") {
        out.push_str(&rest[..start]);
        rest = match rest[start + 4..].find("-->") {
            Some(end) => &rest[start + 4 + end + 3..],
            None => "",
        };
    }
    out.push_str(rest);
    // Lines a comment emptied leave no runs of blank lines behind.
    let mut tidy = String::with_capacity(out.len());
    let mut blank = 0;
    for line in out.lines() {
        if line.trim().is_empty() {
            blank += 1;
            if blank > 1 {
                continue;
            }
        } else {
            blank = 0;
        }
        tidy.push_str(line.trim_end());
        tidy.push('\n');
    }
    tidy.trim().to_string()
}

/// Why a manual cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ManualError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is {size} bytes, more than agent.manual_max_bytes ({max})")]
    TooLarge { path: String, size: u64, max: u64 },
    #[error("{path} is not UTF-8 text")]
    NotText { path: String },
}

impl Manual {
    /// Reads the manual at `path`, refusing more than `max_bytes`.
    pub fn read(path: &Path, max_bytes: u64) -> Result<Manual, ManualError> {
        use std::io::Read as _;
        let shown = path.display().to_string();
        let read_err = |source| ManualError::Read {
            path: shown.clone(),
            source,
        };
        let file = std::fs::File::open(path).map_err(read_err)?;
        let mut bytes = Vec::new();
        // One byte past the bound tells "too large" from "exactly at it".
        file.take(max_bytes.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(read_err)?;
        let size = bytes.len() as u64;
        if size > max_bytes {
            let size = std::fs::metadata(path).map_or(size, |m| m.len());
            return Err(ManualError::TooLarge {
                path: shown,
                size,
                max: max_bytes,
            });
        }
        let text = String::from_utf8(bytes).map_err(|_| ManualError::NotText {
            path: shown.clone(),
        })?;
        let text = strip_comments(&text);
        Ok(Manual {
            path: path.to_path_buf(),
            text: if text.is_empty() {
                text
            } else {
                format!("{text}\n")
            },
        })
    }
}

/// What every new session is told: the embodiment, the manual, a version.
#[derive(Debug, Clone, PartialEq)]
pub struct Briefing {
    pub embodiment: Arc<Embodiment>,
    pub manual: Option<Manual>,
    /// A hash of the text the model is given: it changes when either does.
    pub version: String,
    /// The text, built once (every turn's system prompt opens with it).
    text: String,
}

impl Briefing {
    pub fn new(embodiment: Arc<Embodiment>, manual: Option<Manual>) -> Briefing {
        let mut text = embodiment.markdown.clone();
        if let Some(manual) = &manual
            && !manual.text.trim().is_empty()
        {
            text.push_str(
                "\n# The operator's manual\nWritten by the people who run this robot; follow it.\n\n",
            );
            text.push_str(manual.text.trim_end());
            text.push('\n');
        }
        let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
        let version = digest
            .as_ref()
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect();
        Briefing {
            embodiment,
            manual,
            version,
            text,
        }
    }

    /// The text that opens every session's system prompt: the embodiment,
    /// then the manual.
    pub fn text(&self) -> &str {
        &self.text
    }
}

/// The current briefing; swapped whole when the manual is re-read.
#[derive(Debug)]
pub(crate) struct Briefings {
    current: RwLock<Arc<Briefing>>,
}

impl Briefings {
    pub(crate) fn new(briefing: Briefing) -> Briefings {
        Briefings {
            current: RwLock::new(Arc::new(briefing)),
        }
    }

    /// What a session starting now is told.
    pub(crate) fn current(&self) -> Arc<Briefing> {
        self.current.read().clone()
    }

    /// New sessions get `manual` with the same embodiment; returns the new version.
    pub(crate) fn replace_manual(&self, manual: Option<Manual>) -> String {
        let mut current = self.current.write();
        let next = Briefing::new(current.embodiment.clone(), manual);
        let version = next.version.clone();
        *current = Arc::new(next);
        version
    }
}

/// A briefing of an empty robot with `manual`, for tests.
#[cfg(test)]
pub(crate) fn test_briefing(manual: Option<&str>) -> Arc<Briefing> {
    Arc::new(Briefing::new(
        Arc::new(plain_embodiment()),
        manual.map(|text| Manual {
            path: "AGENTS.md".into(),
            text: text.into(),
        }),
    ))
}

#[cfg(test)]
fn plain_embodiment() -> Embodiment {
    let view = EmbodimentView {
        host_id: "rover-1".into(),
        name: "Rover".into(),
        environment_id: "lab".into(),
        sensors: vec![],
        actuators: vec![],
        cameras: vec![],
        rules: vec![],
        stop_inputs: vec![],
        tools: vec![],
        approval_timeout_secs: 120,
        default_physical_timeout_ms: 5000,
    };
    Embodiment::render(view, 2000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_changes_with_the_manual_and_open_holders_keep_theirs() {
        let e = Arc::new(plain_embodiment());
        let manual = |t: &str| Manual {
            path: "/etc/rozd/AGENTS.md".into(),
            text: t.into(),
        };
        let briefings = Briefings::new(Briefing::new(
            e.clone(),
            Some(manual("Never enter the kitchen.")),
        ));
        let open = briefings.current();
        assert!(open.text().contains("Never enter the kitchen."));
        assert!(open.text().starts_with(&e.markdown));
        let v2 = briefings.replace_manual(Some(manual("Never leave the lab.")));
        assert_ne!(v2, open.version);
        assert_eq!(briefings.current().version, v2);
        assert!(briefings.current().text().contains("Never leave the lab."));
        assert!(open.text().contains("Never enter the kitchen."));
        // Same inputs, same version.
        assert_eq!(
            Briefing::new(e.clone(), Some(manual("Never leave the lab."))).version,
            v2
        );
        assert_eq!(Briefing::new(e.clone(), None).text(), e.markdown);
    }

    #[test]
    fn comments_are_for_the_editors_not_the_model() {
        assert_eq!(
            strip_comments(
                "<!-- how to edit -->\n\n# Rover\n\n<!-- a note\nover lines -->\n\nStay in the lab. <!-- why -->\n"
            ),
            "# Rover\n\nStay in the lab."
        );
        assert_eq!(strip_comments("<!-- only comments -->\n<!-- unclosed"), "");
        // The shipped example is all comments: no manual at all.
        let b = Briefing::new(
            Arc::new(plain_embodiment()),
            Some(Manual {
                path: "AGENTS.md".into(),
                text: strip_comments(include_str!("../../packaging/deb/AGENTS.md")),
            }),
        );
        assert!(!b.text().contains("operator's manual"), "{}", b.text());
    }

    #[test]
    fn a_manual_past_its_bound_or_missing_is_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("rozd-manual-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("AGENTS.md");
        std::fs::write(&path, "x".repeat(100)).expect("write");
        assert_eq!(
            Manual::read(&path, 100).expect("at the bound").text.len(),
            101, // and the newline it ends with
        );
        let e = Manual::read(&path, 99).expect_err("past the bound");
        assert!(
            e.to_string()
                .contains("100 bytes, more than agent.manual_max_bytes (99)"),
            "{e}"
        );
        let missing = dir.join("missing.md");
        let e = Manual::read(&missing, 100).expect_err("missing");
        assert!(e.to_string().contains("missing.md"), "{e}");
        std::fs::write(&path, [0xff, 0xfe]).expect("write");
        assert!(matches!(
            Manual::read(&path, 100),
            Err(ManualError::NotText { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
