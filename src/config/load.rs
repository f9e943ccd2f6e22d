//! The aggregate: [`Config`], every section together, found, read and
//! validated (calling the sub-modules' validators), each error located at
//! its file, line and key.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::locate::{DOCUMENT, locate_key, locate_span};
use super::server::RawServer;
use super::types::{
    AuthConfig, HostConfig, Invalid, LogConfig, PermissionRuleConfig, SafetyConfig, ServerConfig,
    SessionConfig, StoreConfig, TasksConfig, valid_id, within,
};
use crate::hw::config::{
    ActuatorConfig, GpioConfig, HardwareSpec, MqttConfig, SensorConfig, SerialPortConfig,
};
use crate::model::config::ModelConfig;

/// Where the system-wide configuration lives when nothing else is given.
pub const SYSTEM_CONFIG_PATH: &str = "/etc/rozd/rozd.toml";
/// Environment variable that names a configuration file.
pub const CONFIG_ENV: &str = "ROZD_CONFIG";
/// Name used in errors for the built-in simulated-host configuration.
pub const BUILTIN_NAME: &str = "<built-in simulated host>";

/// The built-in configuration: a small simulated robot, so `rozd run` works
/// on any machine with no hardware, no network and no API key.
pub const BUILTIN_CONFIG: &str = include_str!("builtin.toml");

/// The built-in simulated rover's manual (also the documented example).
pub const BUILTIN_MANUAL: &str = include_str!("builtin_agents.md");

/// A configuration error that names where the problem is.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: cannot read configuration: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}:{line}: key `{key}`: {message}", line = fmt_line(*.line))]
    Invalid {
        file: String,
        line: Option<usize>,
        key: String,
        message: String,
    },
    /// Several errors of one file, in line order (each an `Invalid`), one
    /// a line.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Several(Vec<ConfigError>),
}

impl ConfigError {
    /// Each error on its own (several for [`ConfigError::Several`]).
    pub fn each(&self) -> Vec<&ConfigError> {
        match self {
            ConfigError::Several(all) => all.iter().collect(),
            one => vec![one],
        }
    }
}

/// At most this many errors of one file are reported in one run.
const MAX_ERRORS: usize = 20;

/// `text` with line `line` (1-based) made a comment, if it is one whole
/// `key = value` on its own (so that parsing can go on to the next error
/// with every other line where it was); `None` otherwise.
fn without_line(text: &str, line: usize) -> Option<(String, String)> {
    let target = text.lines().nth(line.checked_sub(1)?)?;
    let trimmed = target.trim_start();
    if trimmed.starts_with('[') || trimmed.starts_with('#') || !trimmed.contains('=') {
        return None;
    }
    let alone = toml::from_str::<toml::Table>(trimmed).ok()?;
    let key = alone.keys().next()?.clone();
    let mut out = String::with_capacity(text.len() + 2);
    for (i, l) in text.split_inclusive('\n').enumerate() {
        if i + 1 == line {
            out.push('#');
        }
        out.push_str(l);
    }
    Some((out, key))
}

fn fmt_line(line: Option<usize>) -> String {
    line.map_or_else(|| "?".to_string(), |l| l.to_string())
}

/// Where a configuration came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    File(PathBuf),
    BuiltIn,
}

impl fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigSource::File(p) => write!(f, "{}", p.display()),
            ConfigSource::BuiltIn => f.write_str(BUILTIN_NAME),
        }
    }
}

// ------------------------------------------------------------------ schema

/// The file as written: every section, before validation. Private: a
/// [`Config`] exists only validated, made by [`Config::parse`].
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    host: HostConfig,
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    log: LogConfig,
    #[serde(default)]
    store: StoreConfig,
    #[serde(default)]
    session: SessionConfig,
    #[serde(default)]
    tasks: TasksConfig,
    #[serde(default)]
    permissions: Vec<PermissionRuleConfig>,
    /// Who may answer approvals.
    #[serde(default)]
    approvals: super::types::ApprovalsConfig,
    /// What every session is told about the robot.
    #[serde(default)]
    agent: super::types::AgentConfig,
    #[serde(default)]
    model: ModelConfig,
    #[serde(default)]
    ooda: OodaConfig,
    #[serde(default)]
    safety: SafetyConfig,
    #[serde(default)]
    gpio: GpioConfig,
    #[serde(default)]
    mqtt: Option<MqttConfig>,
    #[serde(default)]
    serial: Vec<SerialPortConfig>,
    /// `[[modbus]]` links (Modbus TCP servers, RTU lines).
    #[serde(default)]
    modbus: Vec<crate::hw::config::ModbusLinkConfig>,
    #[serde(default)]
    sensors: Vec<SensorConfig>,
    #[serde(default)]
    actuators: Vec<ActuatorConfig>,
    #[serde(default)]
    rules: Vec<crate::ooda::rules::RuleConfig>,
    /// The simulated world that sim sensors with a `quantity` read and sim
    /// actuators with an `input` drive.
    #[serde(default)]
    sim: Option<crate::hw::config::SimWorldConfig>,
    /// The fleet registry's broker; absent: this host alone.
    #[serde(default)]
    fleet: Option<crate::fleet::config::RawFleet>,
    /// The MCP server at `/mcp`.
    #[serde(default)]
    mcp: crate::mcp::config::McpConfig,
    /// The Foxglove WebSocket protocol at `/foxglove`.
    #[serde(default)]
    foxglove: crate::live::config::FoxgloveConfig,
    /// MCAP recordings; absent: nothing is recorded.
    #[serde(default)]
    record: Option<crate::record::config::RecordConfig>,
    /// How replayed sensors (`source = "replay"`) play.
    #[serde(default)]
    replay: crate::record::config::ReplayConfig,
    /// `[[cameras]]`: what the host's cameras are and where they read.
    #[serde(default)]
    cameras: Vec<crate::camera::config::CameraConfig>,
}

/// The validated configuration: its sections as the file gave them (each
/// checked), and what validation derived from them (hardware specs, reflex
/// rules, cameras, the listener's settings and credentials, the manual).
/// The sections that validation turns into other types (the hardware
/// sections, `[[rules]]`, `[[cameras]]`, `[server]`) are here only as
/// those, but for `[[actuators]]` as written (see [`Config::actuators`]).
/// Made only by [`Config::parse`] (through [`Config::discover`],
/// [`Config::load_file`], [`Config::builtin`]); nothing edits it afterwards.
#[derive(Debug, Clone)]
pub struct Config {
    pub host: HostConfig,
    pub server: ServerConfig,
    pub log: LogConfig,
    pub store: StoreConfig,
    pub session: SessionConfig,
    pub tasks: TasksConfig,
    pub permissions: Vec<PermissionRuleConfig>,
    /// Who may answer approvals.
    pub approvals: super::types::ApprovalsConfig,
    /// What every session is told about the robot.
    pub agent: super::types::AgentConfig,
    pub model: ModelConfig,
    pub ooda: OodaConfig,
    pub safety: SafetyConfig,
    /// `[[actuators]]` as written, which `GET /v1/actuators` serves (`min`
    /// and `max` unset where the file leaves them); everything that drives
    /// or describes an actuator reads [`Config::hardware`].
    pub actuators: Vec<ActuatorConfig>,
    /// The fleet registry's broker; absent: this host alone.
    pub fleet: Option<crate::fleet::config::FleetConfig>,
    /// The MCP server at `/mcp`.
    pub mcp: crate::mcp::config::McpConfig,
    /// The Foxglove WebSocket protocol at `/foxglove`.
    pub foxglove: crate::live::config::FoxgloveConfig,
    /// MCAP recordings; absent: nothing is recorded.
    pub record: Option<crate::record::config::RecordConfig>,
    /// How replayed sensors (`source = "replay"`) play.
    pub replay: crate::record::config::ReplayConfig,
    /// `[[cameras]]`, validated.
    pub cameras: Vec<crate::camera::config::CameraSpec>,
    /// `[[rules]]`, validated: the reflex rules.
    pub reflex_rules: Vec<crate::ooda::rules::Rule>,
    /// The hardware sections (`[gpio]`, `[mqtt]`, `[[serial]]`,
    /// `[[modbus]]`, `[[sensors]]`, `[[actuators]]`, `[sim]`), validated.
    pub hardware: HardwareSpec,
    /// The credentials `[server]` configures, their secrets read.
    pub auth: AuthConfig,
    /// Where this configuration was read from.
    pub source: ConfigSource,
    /// The operator's manual, read at load (`[agent] manual_file`, the
    /// default path, or the built-in rover's); absent: none.
    pub manual: Option<crate::session::embodiment::Manual>,
    /// This is the built-in simulated rover, whose manual is built in too.
    pub builtin_manual: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OodaConfig {
    /// Rate of the orient/decide tick.
    pub tick_hz: f64,
    /// Rate the Observation is published at; absent: min(tick_hz, 50).
    pub publish_hz: Option<f64>,
    /// `thread` (its own OS thread, absolute deadlines) or `runtime`.
    pub timer: crate::ooda::timer::Timer,
    /// SCHED_FIFO priority (1-99) of the loop's thread.
    pub realtime_priority: Option<u8>,
    /// CPUs the loop's thread is pinned to.
    pub cpu_affinity: Option<Vec<usize>>,
    /// mlockall(MCL_CURRENT | MCL_FUTURE) at start-up.
    pub lock_memory: bool,
}

impl Default for OodaConfig {
    fn default() -> Self {
        OodaConfig {
            tick_hz: 50.0,
            publish_hz: None,
            timer: crate::ooda::timer::Timer::default(),
            realtime_priority: None,
            cpu_affinity: None,
            lock_memory: false,
        }
    }
}

impl OodaConfig {
    /// The validated settings as the loop takes them.
    pub fn loop_config(&self) -> crate::ooda::LoopConfig {
        crate::ooda::LoopConfig {
            tick_hz: self.tick_hz,
            publish_hz: self.publish_hz.unwrap_or(self.tick_hz.min(50.0)),
            timer: self.timer,
            realtime: crate::ooda::timer::Realtime {
                priority: self.realtime_priority,
                cpus: self.cpu_affinity.clone(),
                lock_memory: self.lock_memory,
            },
        }
    }
}

/// The sections of the file that validation turns into other types (the
/// hardware, the reflex rules, the cameras into specs; `[server]` into
/// its settings and credentials; `[fleet]` into its settings and token): [`Config::check`] reads them, and only
/// what they became stays (and `[[actuators]]` as written, which `Config`
/// keeps for `GET /v1/actuators`).
struct SpecSections {
    server: RawServer,
    fleet: Option<crate::fleet::config::RawFleet>,
    gpio: GpioConfig,
    mqtt: Option<MqttConfig>,
    serial: Vec<SerialPortConfig>,
    modbus: Vec<crate::hw::config::ModbusLinkConfig>,
    sensors: Vec<SensorConfig>,
    rules: Vec<crate::ooda::rules::RuleConfig>,
    sim: Option<crate::hw::config::SimWorldConfig>,
    cameras: Vec<crate::camera::config::CameraConfig>,
}

// ------------------------------------------------------------------ loading

impl RawConfig {
    /// The sections, with nothing derived yet, and the sections to derive
    /// it from: what [`Config::check`] validates and completes.
    fn unchecked(self, source: ConfigSource) -> (Config, SpecSections) {
        // Taken apart field by field (not `self.host`, ...): a section added
        // to the file's form does not compile until it has its place here.
        let RawConfig {
            host,
            server,
            log,
            store,
            session,
            tasks,
            permissions,
            approvals,
            agent,
            model,
            ooda,
            safety,
            gpio,
            mqtt,
            serial,
            modbus,
            sensors,
            actuators,
            rules,
            sim,
            fleet,
            mcp,
            foxglove,
            record,
            replay,
            cameras,
        } = self;
        let config = Config {
            host,
            server: server.settings(),
            log,
            store,
            session,
            tasks,
            permissions,
            approvals,
            agent,
            model,
            ooda,
            safety,
            actuators,
            fleet: None,
            mcp,
            foxglove,
            record,
            replay,
            cameras: Vec::new(),
            reflex_rules: Vec::new(),
            hardware: HardwareSpec::default(),
            auth: AuthConfig::default(),
            source,
            manual: None,
            builtin_manual: false,
        };
        let sections = SpecSections {
            server,
            fleet,
            gpio,
            mqtt,
            serial,
            modbus,
            sensors,
            rules,
            sim,
            cameras,
        };
        (config, sections)
    }
}

impl Config {
    /// Finds and loads the configuration: `explicit` (from `--config`) >
    /// `$ROZD_CONFIG` > `/etc/rozd/rozd.toml` > the built-in simulated host.
    pub fn discover(explicit: Option<&Path>) -> Result<Config, ConfigError> {
        if let Some(path) = explicit {
            return Config::load_file(path);
        }
        if let Some(path) = std::env::var_os(CONFIG_ENV).filter(|p| !p.is_empty()) {
            return Config::load_file(Path::new(&path));
        }
        let system = Path::new(SYSTEM_CONFIG_PATH);
        if system.exists() {
            return Config::load_file(system);
        }
        Config::builtin()
    }

    /// The built-in simulated rover, with its manual.
    pub fn builtin() -> Result<Config, ConfigError> {
        let mut config = Config::parse(BUILTIN_CONFIG, ConfigSource::BuiltIn)?;
        // The built-in rover comes with its manual (unless /etc/rozd/AGENTS.md
        // was read: the operator's word wins).
        config.builtin_manual = true;
        if config.manual.is_none() {
            config.manual = config.read_manual().map_err(|e| ConfigError::Invalid {
                file: BUILTIN_NAME.to_string(),
                line: None,
                key: e.key,
                message: e.message,
            })?;
        }
        Ok(config)
    }

    pub fn load_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: path.display().to_string(),
            source,
        })?;
        Config::parse(&text, ConfigSource::File(path.to_path_buf()))
    }

    /// Parses and fully validates configuration text.
    /// Every error of reading is reported, in line order: a line whose key
    /// or value is wrong is set aside and the rest read on. The checks of
    /// what was read follow only when reading found nothing.
    pub fn parse(text: &str, source: ConfigSource) -> Result<Config, ConfigError> {
        let file = source.to_string();
        let mut errors: Vec<ConfigError> = Vec::new();
        let mut set_aside: Vec<String> = Vec::new();
        let mut current = text.to_string();
        let parsed = loop {
            match toml::from_str::<RawConfig>(&current) {
                Ok(config) => break Some(config),
                Err(e) => {
                    let message = e.message().trim().to_string();
                    // A required key set aside for its own error is missing
                    // now: not another error.
                    if set_aside
                        .iter()
                        .any(|k| message == format!("missing field `{k}`"))
                    {
                        break None;
                    }
                    let (line, key) = match e.span() {
                        Some(span) => locate_span(&current, span.start),
                        None => (None, DOCUMENT.to_string()),
                    };
                    errors.push(ConfigError::Invalid {
                        file: file.clone(),
                        line,
                        message: super::wording::reword(&message, &key),
                        key,
                    });
                    match line.and_then(|l| without_line(&current, l)) {
                        Some((next, key)) if errors.len() < MAX_ERRORS => {
                            current = next;
                            set_aside.push(key);
                        }
                        _ => break None,
                    }
                }
            }
        };
        // The checks of what was read need all of it: only a file without
        // such errors gets them (each section reports its first error).
        if let Some(raw) = parsed.filter(|_| errors.is_empty()) {
            let (mut config, sections) = raw.unchecked(source);
            let invalid = config.check(&sections);
            if invalid.is_empty() {
                return Ok(config);
            }
            errors = invalid
                .into_iter()
                .map(|e| ConfigError::Invalid {
                    file: file.clone(),
                    line: locate_key(text, &e.key),
                    key: e.key,
                    message: e.message,
                })
                .collect();
        }
        errors.sort_by_key(|e| match e {
            ConfigError::Invalid { line, .. } => line.unwrap_or(usize::MAX),
            _ => usize::MAX,
        });
        if errors.len() == 1 {
            Err(errors.remove(0))
        } else {
            Err(ConfigError::Several(errors))
        }
    }

    /// Validates every section, the sub-modules' through their own
    /// validators, and fills in what is derived (hardware specs, reflex
    /// rules, tokens). Returns every section's first error: an operator
    /// fixing a file sees all its sections' problems in one run. A check
    /// that needs what another derives runs only when that one passed.
    fn check(&mut self, sections: &SpecSections) -> Vec<Invalid> {
        let mut errors = Vec::new();
        let mut keep = |result: Result<(), Invalid>| match result {
            Ok(()) => true,
            Err(e) => {
                errors.push(e);
                false
            }
        };
        keep(self.validate());
        keep(sections.server.check());
        keep(self.validate_session_limits());
        keep(check_reserved_names(&self.actuators));
        let hardware = crate::hw::config::validate(
            &sections.gpio,
            sections.mqtt.as_ref(),
            &sections.serial,
            &sections.modbus,
            &sections.sensors,
            &self.actuators,
            sections.sim.as_ref(),
            self.safety.default_timeout_ms,
        );
        let hardware_ok = match hardware {
            Ok(hardware) => {
                self.hardware = hardware;
                true
            }
            Err(e) => keep(Err(e)),
        };
        if hardware_ok {
            keep(crate::safety::inputs::validate(
                &self.safety,
                &self.hardware,
            ));
            keep(self.build_reflex_rules(&sections.rules));
            keep(crate::record::config::validate_replay(
                &self.replay,
                &mut self.hardware,
            ));
            keep(self.check_cameras(&sections.cameras));
        }
        if let Some(fleet) = &sections.fleet {
            let listener = crate::fleet::config::Listener {
                listen: self.server.listen,
                tls: self.server.tls.is_some(),
            };
            match fleet.build(&self.host, &listener, sections.mqtt.as_ref()) {
                Ok(fleet) => self.fleet = Some(fleet),
                Err(e) => {
                    keep(Err(e));
                }
            }
        }
        keep(crate::mcp::config::validate(&self.mcp));
        keep(crate::live::config::validate(&self.foxglove));
        if let Some(record) = &self.record {
            keep(crate::record::config::validate(record));
        }
        let tokens_ok = match sections.server.auth() {
            Ok(auth) => {
                self.auth = auth;
                true
            }
            Err(e) => keep(Err(e)),
        };
        match self.read_manual() {
            Ok(manual) => self.manual = manual,
            Err(e) => {
                keep(Err(e));
            }
        }
        if tokens_ok {
            keep(self.check_exposure());
        }
        errors
    }

    /// Builds the reflex rules (they need the hardware specs).
    fn build_reflex_rules(
        &mut self,
        rules: &[crate::ooda::rules::RuleConfig],
    ) -> Result<(), Invalid> {
        // Rules read sensors, and each actuator with feedback's alarm.
        let sensor_names = self
            .hardware
            .sensors
            .iter()
            .map(|s| s.name.clone())
            .chain(
                self.hardware
                    .actuators
                    .iter()
                    .filter(|a| a.feedback.is_some())
                    .map(|a| format!("{}{}", a.name, crate::ooda::feedback::MISMATCH_SUFFIX)),
            )
            .collect();
        let actuator_names = self
            .hardware
            .actuators
            .iter()
            .map(|a| a.name.clone())
            .collect();
        self.reflex_rules = crate::ooda::rules::build_rules(
            rules,
            &sensor_names,
            &actuator_names,
            self.hardware.mqtt.is_some(),
        )?;
        Ok(())
    }

    /// Cameras (the simulated one needs the simulated world).
    fn check_cameras(
        &mut self,
        cameras: &[crate::camera::config::CameraConfig],
    ) -> Result<(), Invalid> {
        self.cameras = crate::camera::config::validate(cameras, self.hardware.sim_world.is_some())?;
        // Replayed cameras play like replayed sensors, so the two stay in step.
        for spec in &mut self.cameras {
            if let crate::camera::config::Source::Replay { speed, looped, .. } = &mut spec.source {
                (*speed, *looped) = (self.replay.speed, self.replay.looped);
            }
        }
        Ok(())
    }

    /// What the listener exposes, given the credentials resolved.
    fn check_exposure(&self) -> Result<(), Invalid> {
        if self.approvals.require_other_credential && !self.auth_required() {
            return Err(Invalid::new(
                "approvals.require_other_credential",
                "needs credentials (server.auth_tokens, server.auth_token_file, [[server.tokens]] \
                 or [[server.clients]]): without them every caller is the same anonymous one, \
                 and nothing could ever be approved",
            ));
        }
        if !self.server.listen.ip().is_loopback()
            && !self.auth_required()
            && !self.server.allow_unauthenticated_remote
        {
            return Err(Invalid::new(
                "server.listen",
                format!(
                    "{} is not a loopback address and no auth tokens are configured; \
                     set server.auth_tokens, server.auth_token_file or [[server.tokens]], or set \
                     server.allow_unauthenticated_remote = true to accept the risk",
                    self.server.listen
                ),
            ));
        }
        if !self.server.listen.ip().is_loopback()
            && self.server.tls.is_none()
            && !self.server.allow_plaintext_remote
        {
            return Err(Invalid::new(
                "server.listen",
                format!(
                    "{} is not a loopback address and [server.tls] is not configured: tokens \
                     and sessions would cross the network in cleartext; configure \
                     [server.tls] (cert_file, key_file), or set \
                     server.allow_plaintext_remote = true to accept the risk",
                    self.server.listen
                ),
            ));
        }
        // Foxglove's own port is held to the same rules as the server's.
        if let Some(listen) = self.foxglove.listen.filter(|a| !a.ip().is_loopback()) {
            if !self.auth_required() && !self.server.allow_unauthenticated_remote {
                return Err(Invalid::new(
                    "foxglove.listen",
                    format!(
                        "{listen} is not a loopback address and no auth tokens are configured \
                         (see server.listen: the same rules hold)"
                    ),
                ));
            }
            if self.server.tls.is_none() && !self.server.allow_plaintext_remote {
                return Err(Invalid::new(
                    "foxglove.listen",
                    format!(
                        "{listen} is not a loopback address and [server.tls] is not configured \
                         (see server.listen: the same rules hold)"
                    ),
                ));
            }
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), Invalid> {
        if !valid_id(&self.host.id) {
            return Err(Invalid::new(
                "host.id",
                format!(
                    "{:?} is not a valid host id (1-128 characters of letters, digits, '-', '_', '.')",
                    self.host.id
                ),
            ));
        }
        if self.host.environment_id.trim().is_empty() {
            return Err(Invalid::new("host.environment_id", "must not be empty"));
        }
        if tracing_subscriber::EnvFilter::try_new(&self.log.level).is_err() {
            return Err(Invalid::new(
                "log.level",
                format!(
                    "{:?} is not a log level or filter (try \"info\", \"debug\", \"rozd=debug,info\")",
                    self.log.level
                ),
            ));
        }
        // Upper bounds keep `now + period` far from overflowing an Instant.
        within(
            "session.keepalive_secs",
            self.session.keepalive.as_secs(),
            1..=86_400,
        )?;
        within(
            "session.default_tool_timeout_ms",
            self.session.default_tool_timeout_ms,
            1..,
        )?;
        within(
            "session.approval_timeout_secs",
            self.session.approval_timeout.as_secs(),
            1..=86_400,
        )?;
        within("session.max_cycles", self.session.max_cycles, 1..)?;
        within(
            "session.default_max_context_tokens",
            self.session.default_max_context_tokens,
            1024..,
        )?;
        let t = &self.tasks;
        within("tasks.max_concurrent", t.max_concurrent, 1..=1024)?;
        within("tasks.max_workers", t.max_workers, ..=256)?;
        within("tasks.max_timeout_secs", t.max_timeout_secs, 1..=31_536_000)
            .map_err(|e| e.noting("a year"))?;
        if t.default_timeout_secs == 0 || t.default_timeout_secs > t.max_timeout_secs {
            return Err(Invalid::new(
                "tasks.default_timeout_secs",
                format!(
                    "must be between 1 and tasks.max_timeout_secs ({})",
                    t.max_timeout_secs
                ),
            ));
        }
        if let Some(model) = &t.model
            && !self.model.knows(model)
        {
            return Err(Invalid::new(
                "tasks.model",
                format!(
                    "unknown model {model:?}; known models: {}",
                    self.model.known_names().join(", ")
                ),
            ));
        }
        within(
            "agent.manual_max_bytes",
            self.agent.manual_max_bytes,
            1..=1024 * 1024,
        )
        .map_err(|e| e.noting("1 MiB"))?;
        within(
            "agent.embodiment_max_tokens",
            self.agent.embodiment_max_tokens,
            256..=100_000,
        )?;
        for (i, rule) in self.permissions.iter().enumerate() {
            if rule.tool_pattern.trim().is_empty() {
                return Err(Invalid::new(
                    format!("permissions[{i}].tool_pattern"),
                    "must not be empty",
                ));
            }
        }
        let s = &self.session;
        // 0 < compact_target < compact_tool_results_at <= compact_thinking_at
        // <= compact_summary_at <= 1
        for (key, low, strict, value) in [
            ("compact_target", 0.0, true, s.compact_target),
            (
                "compact_tool_results_at",
                s.compact_target,
                true,
                s.compact_tool_results_at,
            ),
            (
                "compact_thinking_at",
                s.compact_tool_results_at,
                false,
                s.compact_thinking_at,
            ),
            (
                "compact_summary_at",
                s.compact_thinking_at,
                false,
                s.compact_summary_at,
            ),
        ] {
            let above = if strict { value > low } else { value >= low };
            if !(value.is_finite() && above && value <= 1.0) {
                return Err(Invalid::new(
                    format!("session.{key}"),
                    format!(
                        "{value} is out of order: 0 < compact_target < compact_tool_results_at \
                         <= compact_thinking_at <= compact_summary_at <= 1"
                    ),
                ));
            }
        }
        self.model.validate()?;
        if !(self.ooda.tick_hz.is_finite()
            && self.ooda.tick_hz > 0.0
            && self.ooda.tick_hz <= 10_000.0)
        {
            return Err(Invalid::new(
                "ooda.tick_hz",
                format!("{} is outside 0 < tick_hz <= 10000", self.ooda.tick_hz),
            ));
        }
        if let Some(hz) = self.ooda.publish_hz
            && !(hz.is_finite() && hz > 0.0 && hz <= self.ooda.tick_hz)
        {
            return Err(Invalid::new(
                "ooda.publish_hz",
                format!(
                    "{hz} is outside 0 < publish_hz <= ooda.tick_hz ({})",
                    self.ooda.tick_hz
                ),
            ));
        }
        if let Some(p) = self.ooda.realtime_priority
            && !(1..=99).contains(&p)
        {
            return Err(Invalid::new(
                "ooda.realtime_priority",
                format!("{p} is outside 1-99 (SCHED_FIFO priorities)"),
            ));
        }
        if let Some(cpus) = &self.ooda.cpu_affinity
            && (cpus.is_empty() || cpus.iter().any(|&c| c >= 1024))
        {
            return Err(Invalid::new(
                "ooda.cpu_affinity",
                "must list at least one CPU number, each below 1024",
            ));
        }
        if self.ooda.timer == crate::ooda::timer::Timer::Runtime
            && (self.ooda.realtime_priority.is_some() || self.ooda.cpu_affinity.is_some())
        {
            return Err(Invalid::new(
                "ooda.timer",
                "realtime_priority and cpu_affinity apply to the loop's own thread: use timer = \"thread\"",
            ));
        }
        within(
            "safety.default_timeout_ms",
            self.safety.default_timeout_ms,
            1..,
        )?;
        Ok(())
    }

    /// How many sessions, and how much each may hold.
    fn validate_session_limits(&self) -> Result<(), Invalid> {
        let session = &self.session;
        within("session.max_sessions", session.max_sessions, 1..=65_536)?;
        within(
            "session.max_session_bytes",
            session.max_session_bytes,
            1024..,
        )?;
        within("session.max_session_tools", session.max_session_tools, 1..)?;
        Ok(())
    }

    /// What the embodiment describes.
    pub fn robot(&self) -> crate::session::embodiment::RobotConfig<'_> {
        crate::session::embodiment::RobotConfig {
            host: &self.host,
            hardware: &self.hardware,
            rules: &self.reflex_rules,
            cameras: &self.cameras,
            safety: &self.safety,
            approval_timeout_secs: self.session.approval_timeout.as_secs(),
            tick_hz: self.ooda.tick_hz,
        }
    }

    /// The operator's manual: `agent.manual_file` (which must be readable),
    /// else the default path when it exists, else the built-in rover's
    /// manual for the built-in configuration.
    pub fn read_manual(&self) -> Result<Option<crate::session::embodiment::Manual>, Invalid> {
        use crate::session::embodiment::Manual;
        let max = self.agent.manual_max_bytes;
        let path = match &self.agent.manual_file {
            Some(path) => path.clone(),
            None => {
                let default = Path::new(super::types::DEFAULT_MANUAL_PATH);
                if !default.exists() {
                    return Ok(self.builtin_manual.then(|| Manual {
                        path: PathBuf::from(BUILTIN_NAME),
                        text: BUILTIN_MANUAL.to_string(),
                    }));
                }
                default.to_path_buf()
            }
        };
        Manual::read(&path, max)
            .map(Some)
            .map_err(|e| Invalid::new("agent.manual_file", e.to_string()))
    }

    /// What an operator should know that does not stop rozd from starting:
    /// no operator's manual; any configured certificate (the listener's and its client CAs, the
    /// MQTT and fleet connections' CAs and client certificates) that has
    /// expired, is not valid yet, or expires within 30 days.
    pub fn warnings(&self) -> Vec<String> {
        self.warnings_at(crate::clock::now_ms().div_euclid(1000))
    }

    /// [`Config::warnings`] at `now_secs` (Unix seconds).
    pub fn warnings_at(&self, now_secs: i64) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.manual.is_none() {
            warnings.push(format!(
                "agent.manual_file: no operator's manual ({} is not there): sessions are told \
                 only what the configuration says; write one (see docs/guides/manual.md)",
                super::types::DEFAULT_MANUAL_PATH
            ));
        }
        let mut files: Vec<(&str, &Path)> = Vec::new();
        if let Some(tls) = &self.server.tls {
            files.push(("server.tls.cert_file", &tls.cert_file));
            files.extend(
                tls.client_ca_file
                    .as_deref()
                    .map(|p| ("server.tls.client_ca_file", p)),
            );
        }
        if let Some(mqtt) = &self.hardware.mqtt {
            files.extend(mqtt.ca_file.as_deref().map(|p| ("mqtt.ca_file", p)));
            files.extend(mqtt.cert_file.as_deref().map(|p| ("mqtt.cert_file", p)));
        }
        if let Some(fleet) = &self.fleet {
            let broker = &fleet.broker;
            files.extend(broker.ca_file.as_deref().map(|p| ("fleet.ca_file", p)));
            files.extend(broker.cert_file.as_deref().map(|p| ("fleet.cert_file", p)));
        }
        warnings.extend(files.into_iter().flat_map(|(key, path)| {
            crate::tls::expiry_warnings(path, now_secs)
                .into_iter()
                .map(move |w| format!("{key}: {w}"))
        }));
        warnings
    }

    /// Whether requests must carry a credential: any token (including the
    /// fleet's, which other hosts present when they relay here) or client
    /// certificate subject is configured.
    pub fn auth_required(&self) -> bool {
        !self.auth.is_empty() || self.fleet.is_some()
    }

    /// How many credentials are configured (for `rozd check`).
    pub fn credential_count(&self) -> usize {
        self.auth.len() + usize::from(self.fleet.is_some())
    }
}

/// No actuator takes a host tool's name.
fn check_reserved_names(actuators: &[ActuatorConfig]) -> Result<(), Invalid> {
    if let Some((i, a)) = actuators
        .iter()
        .enumerate()
        .find(|(_, a)| crate::tools::RESERVED.contains(&a.name.as_str()))
    {
        return Err(Invalid::new(
            format!("actuators[{i}].name"),
            format!("{:?} is the name of a host tool; choose another", a.name),
        ));
    }
    Ok(())
}
