//! Configuration: TOML text -> validated, typed [`Config`].
//!
//! Every error names the file, the line and the key, so an operator can fix a
//! broken `/etc/rozd/rozd.toml` without reading source code. Validation is
//! complete before anything binds a socket or touches hardware.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use crate::hw::config::{
    ActuatorConfig, ActuatorKind, GpioConfig, HardwareSpec, MqttConfig, SensorConfig,
    SensorSourceKind, SerialPortConfig,
};

/// Where the system-wide configuration lives when nothing else is given.
pub const SYSTEM_CONFIG_PATH: &str = "/etc/rozd/rozd.toml";
/// Environment variable that names a configuration file.
pub const CONFIG_ENV: &str = "ROZD_CONFIG";
/// Name used in errors for the built-in simulated-host configuration.
pub const BUILTIN_NAME: &str = "<built-in simulated host>";

/// The built-in configuration: a small simulated robot, so `rozd run` works
/// on any machine with no hardware, no network and no API key.
pub const BUILTIN_CONFIG: &str = include_str!("builtin.toml");

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

/// A secret string (an auth token): compared in constant time, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

// ------------------------------------------------------------------ schema

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub host: HostConfig,
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub log: LogConfig,
    #[serde(default)]
    pub store: StoreConfig,
    #[serde(default)]
    pub session: SessionConfig,
    #[serde(default)]
    pub tasks: TasksConfig,
    #[serde(default)]
    pub permissions: Vec<PermissionRuleConfig>,
    #[serde(default)]
    pub model: ModelConfig,
    #[serde(default)]
    pub ooda: OodaConfig,
    #[serde(default)]
    pub safety: SafetyConfig,
    #[serde(default)]
    pub gpio: GpioConfig,
    #[serde(default)]
    pub mqtt: Option<MqttConfig>,
    #[serde(default)]
    pub serial: Vec<SerialPortConfig>,
    #[serde(default)]
    pub sensors: Vec<SensorConfig>,
    #[serde(default)]
    pub actuators: Vec<ActuatorConfig>,
    #[serde(default)]
    pub rules: Vec<crate::ooda::rules::RuleConfig>,
    /// The simulated world that sim sensors with a `quantity` read and sim
    /// actuators with an `input` drive.
    #[serde(default)]
    pub sim: Option<crate::hw::config::SimWorldConfig>,
    /// The fleet registry's broker; absent: this host alone.
    #[serde(default)]
    pub fleet: Option<crate::fleet::FleetConfig>,
    /// The MCP server at `/mcp`.
    #[serde(default)]
    pub mcp: crate::mcp::McpConfig,
    /// The validated reflex rules.
    #[serde(skip)]
    pub reflex_rules: Vec<crate::ooda::rules::Rule>,
    /// The validated hardware sections.
    #[serde(skip)]
    pub hardware: HardwareSpec,
    /// Tokens read from `server.auth_token_file`, merged with `server.auth_tokens`.
    #[serde(skip)]
    pub resolved_tokens: Vec<Secret>,
    #[serde(skip)]
    pub source: Option<ConfigSource>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    /// Stable identifier of this host; defaults to the machine's hostname.
    #[serde(default = "default_host_id")]
    pub id: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default = "default_environment")]
    pub environment_id: String,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            id: default_host_id(),
            name: None,
            environment_id: default_environment(),
        }
    }
}

impl HostConfig {
    pub fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.id)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    #[serde(default)]
    pub auth_tokens: Vec<Secret>,
    #[serde(default)]
    pub auth_token_file: Option<PathBuf>,
    #[serde(default)]
    pub allow_unauthenticated_remote: bool,
    /// How long open streams get to finish after SIGTERM before they are cut.
    #[serde(default = "default_shutdown_grace_secs")]
    pub shutdown_grace_secs: u64,
    /// Bound within which a silently vanished client is detected (HTTP/2
    /// pings every half of it, each answered within the other half); 0 disables.
    #[serde(default = "default_http2_keepalive_secs")]
    pub http2_keepalive_secs: u64,
    /// Most TCP connections open at once; a new one beyond it evicts the
    /// oldest connection that has not completed an authenticated request,
    /// else the longest-idle one.
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// Bound on receiving an HTTP/1 request head (also on the wait for the
    /// next request on a keep-alive connection).
    #[serde(default = "default_header_read_timeout_secs")]
    pub header_read_timeout_secs: u64,
    /// A connection (HTTP/1 or HTTP/2, TCP or the control socket) with no
    /// request in flight for this long is closed.
    #[serde(default = "default_idle_timeout_secs")]
    pub idle_timeout_secs: u64,
    /// Host names (besides the daemon's own) that requests may name in
    /// `Host` / `:authority`; `"*"` accepts any.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// The local control socket; `""` disables it. Default: see
    /// [`ServerConfig::control_socket_path`].
    #[serde(default)]
    pub control_socket: Option<PathBuf>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: default_listen(),
            auth_tokens: Vec::new(),
            auth_token_file: None,
            allow_unauthenticated_remote: false,
            shutdown_grace_secs: default_shutdown_grace_secs(),
            http2_keepalive_secs: default_http2_keepalive_secs(),
            max_connections: default_max_connections(),
            header_read_timeout_secs: default_header_read_timeout_secs(),
            idle_timeout_secs: default_idle_timeout_secs(),
            allowed_hosts: Vec::new(),
            control_socket: None,
        }
    }
}

/// The file name of the control socket in its default directory.
pub const CONTROL_SOCKET_NAME: &str = "control.sock";
/// Longest path a Unix socket can have (`sun_path` is 108 bytes with its NUL).
pub const MAX_SOCKET_PATH: usize = 107;

impl ServerConfig {
    /// Where the daemon listens for local control: `control_socket` when set
    /// (`None` when it is `""`: disabled); else `$RUNTIME_DIRECTORY/control.sock`
    /// under systemd (`/run/rozd/control.sock`); else `control.sock` in the
    /// store's directory (`~/.local/state/rozd/control.sock` for a developer).
    pub fn control_socket_path(&self, store: &StoreConfig) -> Option<PathBuf> {
        match &self.control_socket {
            Some(p) if p.as_os_str().is_empty() => None,
            Some(p) => Some(p.clone()),
            None => Some(
                first_env_dir("RUNTIME_DIRECTORY")
                    .map(|dir| dir.join(CONTROL_SOCKET_NAME))
                    .unwrap_or_else(|| {
                        store
                            .resolved_path()
                            .parent()
                            .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
                            .join(CONTROL_SOCKET_NAME)
                    }),
            ),
        }
    }
}

/// The first of the colon-separated directories systemd passes in `var`
/// (`STATE_DIRECTORY`, `RUNTIME_DIRECTORY`), if any.
fn first_env_dir(var: &str) -> Option<PathBuf> {
    let value = std::env::var_os(var)?;
    let first = value.to_string_lossy().split(':').next()?.to_string();
    (!first.is_empty()).then(|| PathBuf::from(first))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    #[serde(default = "default_log_level")]
    pub level: String,
    #[serde(default)]
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: default_log_level(),
            format: LogFormat::Text,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// SQLite database file. Default: `$STATE_DIRECTORY/rozd.db` under systemd,
    /// else `$XDG_STATE_HOME/rozd/rozd.db` (or `~/.local/state/rozd/rozd.db`).
    #[serde(default)]
    pub path: Option<PathBuf>,
}

impl StoreConfig {
    pub fn resolved_path(&self) -> PathBuf {
        if let Some(p) = &self.path {
            return p.clone();
        }
        // systemd may pass several colon-separated directories; the first is ours.
        if let Some(dir) = first_env_dir("STATE_DIRECTORY") {
            return dir.join("rozd.db");
        }
        let base = std::env::var_os("XDG_STATE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
            .unwrap_or_else(|| PathBuf::from("."));
        base.join("rozd").join("rozd.db")
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionConfig {
    /// Seconds between `Keepalive` messages on an open session stream.
    #[serde(default = "default_keepalive_secs")]
    pub keepalive_secs: u64,
    /// Timeout for a client tool that declares `timeout_ms = 0`.
    #[serde(default = "default_tool_timeout_ms")]
    pub default_tool_timeout_ms: u32,
    /// How long a `require_confirmation` call waits for a `PermissionDecision`.
    #[serde(default = "default_approval_timeout_secs")]
    pub approval_timeout_secs: u64,
    /// Upper bound of model calls in one turn (stop reason `max_cycles`).
    #[serde(default = "default_max_cycles")]
    pub max_cycles: u32,
    /// Context budget when `StartSession.max_context_tokens` is absent.
    #[serde(default = "default_max_context_tokens")]
    pub default_max_context_tokens: u32,
    /// Tokens one session may spend in total (input, cached input and output
    /// of every model call); 0 = unlimited. Then `budget_exceeded`.
    #[serde(default)]
    pub max_session_tokens: u64,
    /// Compaction brings the context down to this fraction of the budget.
    #[serde(default = "default_compact_target")]
    pub compact_target: f64,
    /// Above this fraction of the budget, old tool results are elided.
    #[serde(default = "default_compact_tool_results_at")]
    pub compact_tool_results_at: f64,
    /// Above this fraction, old thinking is removed.
    #[serde(default = "default_compact_thinking_at")]
    pub compact_thinking_at: f64,
    /// Above this fraction, the oldest turns are summarised by the model.
    #[serde(default = "default_compact_summary_at")]
    pub compact_summary_at: f64,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            keepalive_secs: default_keepalive_secs(),
            default_tool_timeout_ms: default_tool_timeout_ms(),
            approval_timeout_secs: default_approval_timeout_secs(),
            max_cycles: default_max_cycles(),
            default_max_context_tokens: default_max_context_tokens(),
            max_session_tokens: 0,
            compact_target: default_compact_target(),
            compact_tool_results_at: default_compact_tool_results_at(),
            compact_thinking_at: default_compact_thinking_at(),
            compact_summary_at: default_compact_summary_at(),
        }
    }
}

/// How an agent works: `react` (a plain tool loop) or `ooda_re_act` (the
/// latest Observation is injected before every model call and each cycle is
/// reported as an OODA phase). One parser for every place a mode is named:
/// `UserMessage.ai_mode`, `[tasks] ai_mode` and `spawn_worker`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AiMode {
    React,
    #[default]
    OodaReAct,
}

impl AiMode {
    /// Every accepted spelling, canonical names first.
    pub const SPELLINGS: [&str; 4] = ["react", "ooda_re_act", "ooda", "ooda_react"];
    /// The accepted spellings for messages.
    pub const EXPECTED: &str = "react, ooda_re_act (or its aliases ooda, ooda_react)";

    pub fn parse(text: &str) -> Option<AiMode> {
        match text {
            "react" => Some(AiMode::React),
            "ooda_re_act" | "ooda" | "ooda_react" => Some(AiMode::OodaReAct),
            _ => None,
        }
    }

    /// The canonical name (what is stored and reported).
    pub fn as_str(self) -> &'static str {
        match self {
            AiMode::React => "react",
            AiMode::OodaReAct => "ooda_re_act",
        }
    }
}

impl<'de> Deserialize<'de> for AiMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        AiMode::parse(&text).ok_or_else(|| {
            serde::de::Error::custom(format!("{text:?} is not one of {}", AiMode::EXPECTED))
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    Allow,
    RequireConfirmation,
    Block,
}

impl Policy {
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Allow => "allow",
            Policy::RequireConfirmation => "require_confirmation",
            Policy::Block => "block",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolCategory {
    Physical,
    Pure,
}

impl ToolCategory {
    pub fn as_str(self) -> &'static str {
        match self {
            ToolCategory::Physical => "physical",
            ToolCategory::Pure => "pure",
        }
    }
}

/// One `[[permissions]]` rule. Rules are checked in order; the first whose
/// `tool_pattern` (a glob: `*` and `?`) matches, and whose `category` (if set)
/// equals the tool's, decides.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PermissionRuleConfig {
    pub tool_pattern: String,
    pub policy: Policy,
    #[serde(default)]
    pub category: Option<ToolCategory>,
    #[serde(default)]
    pub reason: Option<String>,
}

/// `[model]` and `[[model.endpoints]]`: defined and validated in `model::config`.
pub use crate::model::config::{EndpointConfig, ModelConfig};

/// `[tasks]`: jobs the host runs without a client (TaskService).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TasksConfig {
    /// Tasks running at once; `CreateTask` beyond that is refused.
    #[serde(default = "default_tasks_max_concurrent")]
    pub max_concurrent: u32,
    /// Workers one task's lead may start with `spawn_worker` (the lead itself not counted).
    #[serde(default = "default_tasks_max_workers")]
    pub max_workers: u32,
    /// `timeout_secs` of a task that does not give one.
    #[serde(default = "default_tasks_timeout_secs")]
    pub default_timeout_secs: u32,
    /// Largest `timeout_secs` a task may ask for.
    #[serde(default = "default_tasks_max_timeout_secs")]
    pub max_timeout_secs: u32,
    /// Agent mode of a task's lead and of workers that do not name one.
    #[serde(default)]
    pub ai_mode: AiMode,
    /// Model of the task agents; absent = `model.default`.
    #[serde(default)]
    pub model: Option<String>,
}

impl Default for TasksConfig {
    fn default() -> Self {
        TasksConfig {
            max_concurrent: default_tasks_max_concurrent(),
            max_workers: default_tasks_max_workers(),
            default_timeout_secs: default_tasks_timeout_secs(),
            max_timeout_secs: default_tasks_max_timeout_secs(),
            ai_mode: AiMode::default(),
            model: None,
        }
    }
}

fn default_tasks_max_concurrent() -> u32 {
    4
}
fn default_tasks_max_workers() -> u32 {
    8
}
fn default_tasks_timeout_secs() -> u32 {
    600
}
fn default_tasks_max_timeout_secs() -> u32 {
    86_400
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OodaConfig {
    /// Rate of the orient/decide tick.
    #[serde(default = "default_tick_hz")]
    pub tick_hz: f64,
    /// Rate the Observation is published at; absent: min(tick_hz, 50).
    #[serde(default)]
    pub publish_hz: Option<f64>,
    /// `thread` (its own OS thread, absolute deadlines) or `runtime`.
    #[serde(default)]
    pub timer: crate::ooda::timer::Timer,
    /// SCHED_FIFO priority (1-99) of the loop's thread.
    #[serde(default)]
    pub realtime_priority: Option<u8>,
    /// CPUs the loop's thread is pinned to.
    #[serde(default)]
    pub cpu_affinity: Option<Vec<usize>>,
    /// mlockall(MCL_CURRENT | MCL_FUTURE) at start-up.
    #[serde(default)]
    pub lock_memory: bool,
}

impl Default for OodaConfig {
    fn default() -> Self {
        OodaConfig {
            tick_hz: default_tick_hz(),
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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SafetyConfig {
    /// Deadline for a PHYSICAL call on an actuator without its own `timeout_ms`.
    #[serde(default = "default_physical_timeout_ms")]
    pub default_timeout_ms: u32,
    /// A GPIO input (BCM number) that triggers the protective stop while it
    /// is at `estop_gpio_active`.
    #[serde(default)]
    pub estop_gpio_pin: Option<u8>,
    /// The stop input's active level; default `low`.
    #[serde(default)]
    pub estop_gpio_active: Option<crate::hw::config::Level>,
    /// The stop input's bias; default `up` when active low, `down` when active high.
    #[serde(default)]
    pub estop_gpio_pull: Option<crate::hw::config::Pull>,
    /// An MQTT topic whose messages `1`, `true` or `stop` trigger the
    /// protective stop (needs `[mqtt]`).
    #[serde(default)]
    pub estop_mqtt_topic: Option<String>,
}

impl Default for SafetyConfig {
    fn default() -> Self {
        SafetyConfig {
            default_timeout_ms: default_physical_timeout_ms(),
            estop_gpio_pin: None,
            estop_gpio_active: None,
            estop_gpio_pull: None,
            estop_mqtt_topic: None,
        }
    }
}

fn default_host_id() -> String {
    machine_hostname().unwrap_or_else(|| "rozd-host".to_string())
}
fn default_environment() -> String {
    "default".to_string()
}
fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8080))
}
fn default_shutdown_grace_secs() -> u64 {
    5
}
fn default_http2_keepalive_secs() -> u64 {
    5
}
fn default_max_connections() -> u32 {
    1024
}
fn default_header_read_timeout_secs() -> u64 {
    10
}
fn default_idle_timeout_secs() -> u64 {
    120
}
fn default_log_level() -> String {
    "info".to_string()
}
fn default_keepalive_secs() -> u64 {
    10
}
fn default_tool_timeout_ms() -> u32 {
    30_000
}
fn default_approval_timeout_secs() -> u64 {
    120
}
fn default_max_cycles() -> u32 {
    25
}
fn default_max_context_tokens() -> u32 {
    200_000
}
fn default_compact_target() -> f64 {
    0.4
}
fn default_compact_tool_results_at() -> f64 {
    0.5
}
fn default_compact_thinking_at() -> f64 {
    0.6
}
fn default_compact_summary_at() -> f64 {
    0.75
}
fn default_tick_hz() -> f64 {
    50.0
}
fn default_physical_timeout_ms() -> u32 {
    5_000
}

/// The machine's hostname, as the kernel reports it.
pub fn machine_hostname() -> Option<String> {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()?;
    let name = raw.trim();
    (!name.is_empty()).then(|| name.to_string())
}

// ------------------------------------------------------------------ loading

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
        Config::parse(BUILTIN_CONFIG, ConfigSource::BuiltIn)
    }

    pub fn load_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: path.display().to_string(),
            source,
        })?;
        Config::parse(&text, ConfigSource::File(path.to_path_buf()))
    }

    /// Parses and fully validates configuration text.
    pub fn parse(text: &str, source: ConfigSource) -> Result<Config, ConfigError> {
        let file = source.to_string();
        let mut config: Config = toml::from_str(text).map_err(|e| {
            let (line, key) = match e.span() {
                Some(span) => locate_span(text, span.start),
                None => (None, String::from("<document>")),
            };
            ConfigError::Invalid {
                file: file.clone(),
                line,
                key,
                message: e.message().trim().to_string(),
            }
        })?;
        config.source = Some(source);
        let invalid = |key: &str, message: String| ConfigError::Invalid {
            file: file.clone(),
            line: locate_key(text, key),
            key: key.to_string(),
            message,
        };
        config.validate(&invalid)?;
        config.hardware = crate::hw::config::validate(
            &config.gpio,
            config.mqtt.as_ref(),
            &config.serial,
            &config.sensors,
            &config.actuators,
            config.sim.as_ref(),
            config.safety.default_timeout_ms,
        )
        .map_err(|e| invalid(&e.key, e.message))?;
        crate::safety::inputs::validate(&config.safety, &config.hardware)
            .map_err(|(key, message): (String, String)| invalid(&key, message))?;
        if let Some((i, a)) = config
            .actuators
            .iter()
            .enumerate()
            .find(|(_, a)| crate::tools::RESERVED.contains(&a.name.as_str()))
        {
            return Err(invalid(
                &format!("actuators[{i}].name"),
                format!("{:?} is the name of a host tool; choose another", a.name),
            ));
        }
        let sensor_names = config.sensors.iter().map(|s| s.name.clone()).collect();
        let actuator_names = config.actuators.iter().map(|a| a.name.clone()).collect();
        config.reflex_rules = crate::ooda::rules::build_rules(
            &config.rules,
            &sensor_names,
            &actuator_names,
            config.mqtt.is_some(),
        )
        .map_err(|(key, message)| invalid(&key, message))?;
        if let Some(fleet) = config.fleet.as_mut() {
            crate::fleet::config::validate(
                fleet,
                &config.host,
                &config.server,
                config.mqtt.as_ref(),
            )
            .map_err(|(key, message)| invalid(&key, message))?;
        }
        crate::mcp::config::validate(&config.mcp)
            .map_err(|(key, message)| invalid(&key, message))?;
        config.resolve_tokens(&file, text)?;
        // Other hosts of the fleet present the fleet token when they relay here.
        if let Some(token) = config.fleet.as_ref().and_then(|f| f.token.clone()) {
            config.resolved_tokens.push(token);
        }
        if !config.server.listen.ip().is_loopback()
            && config.resolved_tokens.is_empty()
            && !config.server.allow_unauthenticated_remote
        {
            return Err(ConfigError::Invalid {
                file: file.clone(),
                line: locate_key(text, "server.listen"),
                key: "server.listen".into(),
                message: format!(
                    "{} is not a loopback address and no auth tokens are configured; \
                     set server.auth_tokens or server.auth_token_file, or set \
                     server.allow_unauthenticated_remote = true to accept the risk",
                    config.server.listen
                ),
            });
        }
        Ok(config)
    }

    fn validate(&self, invalid: &dyn Fn(&str, String) -> ConfigError) -> Result<(), ConfigError> {
        if !valid_id(&self.host.id) {
            return Err(invalid(
                "host.id",
                format!(
                    "{:?} is not a valid host id (1-128 characters of letters, digits, '-', '_', '.')",
                    self.host.id
                ),
            ));
        }
        if self.host.environment_id.trim().is_empty() {
            return Err(invalid("host.environment_id", "must not be empty".into()));
        }
        if tracing_subscriber::EnvFilter::try_new(&self.log.level).is_err() {
            return Err(invalid(
                "log.level",
                format!(
                    "{:?} is not a log level or filter (try \"info\", \"debug\", \"rozd=debug,info\")",
                    self.log.level
                ),
            ));
        }
        if self
            .server
            .auth_tokens
            .iter()
            .any(|t| t.expose().trim().is_empty())
        {
            return Err(invalid(
                "server.auth_tokens",
                "tokens must not be empty".into(),
            ));
        }
        self.validate_server(invalid)?;
        // Upper bounds keep `now + period` far from overflowing an Instant.
        if !(1..=86_400).contains(&self.session.keepalive_secs) {
            return Err(invalid(
                "session.keepalive_secs",
                "must be between 1 and 86400".into(),
            ));
        }
        if self.session.default_tool_timeout_ms == 0 {
            return Err(invalid(
                "session.default_tool_timeout_ms",
                "must be at least 1".into(),
            ));
        }
        if !(1..=86_400).contains(&self.session.approval_timeout_secs) {
            return Err(invalid(
                "session.approval_timeout_secs",
                "must be between 1 and 86400".into(),
            ));
        }
        if self.session.max_cycles == 0 {
            return Err(invalid("session.max_cycles", "must be at least 1".into()));
        }
        if self.session.default_max_context_tokens < 1024 {
            return Err(invalid(
                "session.default_max_context_tokens",
                "must be at least 1024".into(),
            ));
        }
        let t = &self.tasks;
        if !(1..=1024).contains(&t.max_concurrent) {
            return Err(invalid(
                "tasks.max_concurrent",
                "must be between 1 and 1024".into(),
            ));
        }
        if t.max_workers > 256 {
            return Err(invalid("tasks.max_workers", "must be at most 256".into()));
        }
        if !(1..=31_536_000).contains(&t.max_timeout_secs) {
            return Err(invalid(
                "tasks.max_timeout_secs",
                "must be between 1 and 31536000 (a year)".into(),
            ));
        }
        if t.default_timeout_secs == 0 || t.default_timeout_secs > t.max_timeout_secs {
            return Err(invalid(
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
            return Err(invalid(
                "tasks.model",
                format!(
                    "unknown model {model:?}; known models: {}",
                    self.model.known_names().join(", ")
                ),
            ));
        }
        for (i, rule) in self.permissions.iter().enumerate() {
            if rule.tool_pattern.trim().is_empty() {
                return Err(invalid(
                    &format!("permissions[{i}].tool_pattern"),
                    "must not be empty".into(),
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
                return Err(invalid(
                    &format!("session.{key}"),
                    format!(
                        "{value} is out of order: 0 < compact_target < compact_tool_results_at \
                         <= compact_thinking_at <= compact_summary_at <= 1"
                    ),
                ));
            }
        }
        if let Err((key, message)) = self.model.validate() {
            return Err(invalid(&key, message));
        }
        if !(self.ooda.tick_hz.is_finite()
            && self.ooda.tick_hz > 0.0
            && self.ooda.tick_hz <= 10_000.0)
        {
            return Err(invalid(
                "ooda.tick_hz",
                format!("{} is outside 0 < tick_hz <= 10000", self.ooda.tick_hz),
            ));
        }
        if let Some(hz) = self.ooda.publish_hz
            && !(hz.is_finite() && hz > 0.0 && hz <= self.ooda.tick_hz)
        {
            return Err(invalid(
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
            return Err(invalid(
                "ooda.realtime_priority",
                format!("{p} is outside 1-99 (SCHED_FIFO priorities)"),
            ));
        }
        if let Some(cpus) = &self.ooda.cpu_affinity
            && (cpus.is_empty() || cpus.iter().any(|&c| c >= 1024))
        {
            return Err(invalid(
                "ooda.cpu_affinity",
                "must list at least one CPU number, each below 1024".into(),
            ));
        }
        if self.ooda.timer == crate::ooda::timer::Timer::Runtime
            && (self.ooda.realtime_priority.is_some() || self.ooda.cpu_affinity.is_some())
        {
            return Err(invalid(
                "ooda.timer",
                "realtime_priority and cpu_affinity apply to the loop's own thread: use timer = \"thread\""
                    .into(),
            ));
        }
        if self.safety.default_timeout_ms == 0 {
            return Err(invalid(
                "safety.default_timeout_ms",
                "must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// The connection limits, timeouts, allowed hosts and control socket of `[server]`.
    fn validate_server(
        &self,
        invalid: &dyn Fn(&str, String) -> ConfigError,
    ) -> Result<(), ConfigError> {
        let s = &self.server;
        if !(4..=1_048_576).contains(&s.max_connections) {
            return Err(invalid(
                "server.max_connections",
                "must be between 4 and 1048576".into(),
            ));
        }
        if !(1..=3_600).contains(&s.header_read_timeout_secs) {
            return Err(invalid(
                "server.header_read_timeout_secs",
                "must be between 1 and 3600".into(),
            ));
        }
        if !(1..=86_400).contains(&s.idle_timeout_secs) {
            return Err(invalid(
                "server.idle_timeout_secs",
                "must be between 1 and 86400".into(),
            ));
        }
        for (i, host) in s.allowed_hosts.iter().enumerate() {
            if let Err(why) = crate::api::browser::check_allowed_host_entry(host) {
                return Err(invalid(
                    "server.allowed_hosts",
                    format!("entry {i} ({host:?}): {why}"),
                ));
            }
        }
        if let Some(path) = &s.control_socket
            && !path.as_os_str().is_empty()
        {
            if !path.is_absolute() {
                return Err(invalid(
                    "server.control_socket",
                    format!(
                        "{:?} is not an absolute path (or \"\" to disable the control socket)",
                        path.display()
                    ),
                ));
            }
            if path.as_os_str().len() > MAX_SOCKET_PATH {
                return Err(invalid(
                    "server.control_socket",
                    format!("a Unix socket path has at most {MAX_SOCKET_PATH} bytes"),
                ));
            }
        }
        Ok(())
    }

    fn resolve_tokens(&mut self, file: &str, text: &str) -> Result<(), ConfigError> {
        let mut tokens = self.server.auth_tokens.clone();
        if let Some(path) = &self.server.auth_token_file {
            let content = std::fs::read_to_string(path).map_err(|e| ConfigError::Invalid {
                file: file.to_string(),
                line: locate_key(text, "server.auth_token_file"),
                key: "server.auth_token_file".into(),
                message: format!("cannot read {}: {e}", path.display()),
            })?;
            tokens.extend(token_lines(&content).map(Secret::new));
        }
        self.resolved_tokens = tokens;
        Ok(())
    }

    /// Whether requests must carry a bearer token.
    pub fn auth_required(&self) -> bool {
        !self.resolved_tokens.is_empty()
    }

    /// A human-readable summary of the effective configuration (no secrets).
    pub fn summary(&self) -> String {
        let source = self
            .source
            .as_ref()
            .map_or_else(|| BUILTIN_NAME.to_string(), ToString::to_string);
        let mut out = String::new();
        let mut line = |s: String| {
            out.push_str(&s);
            out.push('\n');
        };
        line(format!("config:        {source}"));
        line(format!(
            "host:          {} ({})",
            self.host.id,
            self.host.display_name()
        ));
        line(format!("environment:   {}", self.host.environment_id));
        line(format!("listen:        {}", self.server.listen));
        line(format!(
            "auth:          {}",
            if self.auth_required() {
                format!("{} bearer token(s)", self.resolved_tokens.len())
            } else {
                "none (loopback only)".to_string()
            }
        ));
        let server = &self.server;
        line(format!(
            "connections:   at most {} over TCP, HTTP/1 head within {} s, idle closed after {} s",
            server.max_connections, server.header_read_timeout_secs, server.idle_timeout_secs
        ));
        line(format!(
            "allowed hosts: {}",
            if server.allowed_hosts.is_empty() {
                "this host's own names and IP addresses".to_string()
            } else {
                format!("this host's own and {}", server.allowed_hosts.join(", "))
            }
        ));
        line(format!(
            "control:       {}",
            server.control_socket_path(&self.store).map_or_else(
                || "no control socket".to_string(),
                |p| p.display().to_string()
            )
        ));
        line(format!(
            "log:           {} ({:?})",
            self.log.level, self.log.format
        ));
        line(format!(
            "store:         {}",
            self.store.resolved_path().display()
        ));
        line(format!("model:         {}", self.model.default));
        let t = &self.tasks;
        line(format!(
            "tasks:         up to {} at once, {} worker(s) each, timeout {} s (max {} s), {}, model {}",
            t.max_concurrent,
            t.max_workers,
            t.default_timeout_secs,
            t.max_timeout_secs,
            t.ai_mode.as_str(),
            t.model.as_deref().unwrap_or(&self.model.default)
        ));
        for e in &self.model.endpoints {
            let r = self.model.resolve(e);
            let key = match (&r.api_key_file, &r.api_key_env) {
                (Some(f), _) => format!("key from {}", f.display()),
                (None, Some(var)) => format!("key from ${var}"),
                (None, None) => "no key".to_string(),
            };
            line(format!(
                "  endpoint:    {} = {} {} at {} ({key})",
                r.name,
                r.provider.as_str(),
                r.model,
                r.base_url
            ));
        }
        let l = self.ooda.loop_config();
        line(format!(
            "ooda tick:     {} Hz on {} (Observation at {} Hz){}{}{}",
            l.tick_hz,
            if l.timer == crate::ooda::timer::Timer::Thread {
                "its own thread"
            } else {
                "the runtime's clock"
            },
            l.publish_hz,
            l.realtime
                .priority
                .map_or(String::new(), |p| format!(", SCHED_FIFO {p}")),
            l.realtime
                .cpus
                .as_ref()
                .map_or(String::new(), |c| format!(", CPUs {c:?}")),
            if l.realtime.lock_memory {
                ", memory locked"
            } else {
                ""
            },
        ));
        line(format!("permissions:   {} rule(s)", self.permissions.len()));
        line(format!(
            "stop inputs:   {}",
            crate::safety::inputs::describe(&self.safety)
        ));
        line(format!(
            "fleet:         {}",
            match &self.fleet {
                Some(f) => format!(
                    "{} (prefix {}, heartbeat {}s, advertise {}, token {})",
                    f.url,
                    f.topic_prefix,
                    f.heartbeat_secs,
                    f.advertise.as_deref().unwrap_or("http://<listen address>"),
                    if f.token.is_some() { "set" } else { "none" }
                ),
                None => "none (this host alone)".to_string(),
            }
        ));
        line(format!("mcp:           {}", self.mcp.describe()));
        let sensors: Vec<&str> = self.sensors.iter().map(|s| s.name.as_str()).collect();
        let actuators: Vec<&str> = self.actuators.iter().map(|a| a.name.as_str()).collect();
        line(format!(
            "sensors:       {} [{}]",
            sensors.len(),
            sensors.join(", ")
        ));
        line(format!(
            "actuators:     {} [{}]",
            actuators.len(),
            actuators.join(", ")
        ));
        if let Some(w) = &self.hardware.sim_world {
            line(format!(
                "sim world:     {} m x {} m, {} obstacle(s), rover at ({}, {}), seed {}",
                w.width,
                w.depth,
                w.obstacles.len(),
                w.start.x,
                w.start.y,
                w.seed
            ));
        }
        out
    }
}

/// The tokens of a token file: its lines, trimmed, without blank lines and
/// `#` comments.
pub(crate) fn token_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
}

/// A host id: 1-128 letters, digits, '-', '_', '.'.
pub fn valid_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

// ------------------------------------------------------------------ locating keys in TOML text

/// One logical TOML line: its 1-based number, the table it is in, and the key
/// it assigns (if any).
struct TomlLine<'a> {
    number: usize,
    table: String,
    key: Option<&'a str>,
    is_header: bool,
}

fn scan_lines(text: &str) -> Vec<TomlLine<'_>> {
    let mut table = String::new();
    let mut counts: std::collections::HashMap<String, usize> = Default::default();
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if let Some(inner) = line.strip_prefix("[[") {
            let name = inner.split("]]").next().unwrap_or("").trim().to_string();
            let n = counts.entry(name.clone()).or_insert(0);
            table = format!("{name}[{n}]");
            *n += 1;
            out.push(TomlLine {
                number: i + 1,
                table: table.clone(),
                key: None,
                is_header: true,
            });
        } else if let Some(inner) = line.strip_prefix('[') {
            table = inner.split(']').next().unwrap_or("").trim().to_string();
            out.push(TomlLine {
                number: i + 1,
                table: table.clone(),
                key: None,
                is_header: true,
            });
        } else if let Some((k, _)) = line.split_once('=')
            && !line.starts_with('#')
        {
            let key = k.trim().trim_matches('"');
            out.push(TomlLine {
                number: i + 1,
                table: table.clone(),
                key: Some(key),
                is_header: false,
            });
        }
    }
    out
}

fn join_key(table: &str, key: Option<&str>) -> String {
    match (table.is_empty(), key) {
        (true, Some(k)) => k.to_string(),
        (false, Some(k)) => format!("{table}.{k}"),
        (_, None) if table.is_empty() => "<document>".to_string(),
        (_, None) => table.to_string(),
    }
}

/// The 1-based line and dotted key at a byte offset of the text.
fn locate_span(text: &str, offset: usize) -> (Option<usize>, String) {
    let offset = offset.min(text.len());
    let line_no = text
        .get(..offset)
        .map_or(1, |before| before.matches('\n').count() + 1);
    let lines = scan_lines(text);
    let found = lines.iter().rev().find(|l| l.number <= line_no);
    match found {
        Some(l) if l.number == line_no => (Some(line_no), join_key(&l.table, l.key)),
        Some(l) => (Some(line_no), join_key(&l.table, None)),
        None => (Some(line_no), "<document>".to_string()),
    }
}

/// The line where a dotted key (e.g. `server.listen`, `actuators[1].max`) is
/// set, or the line of its table header if the key itself is absent.
fn locate_key(text: &str, dotted: &str) -> Option<usize> {
    let lines = scan_lines(text);
    let (table, key) = match dotted.rsplit_once('.') {
        Some((t, k)) => (t, k),
        None => ("", dotted),
    };
    lines
        .iter()
        .find(|l| l.table == table && l.key == Some(key))
        .or_else(|| lines.iter().find(|l| l.is_header && l.table == table))
        .map(|l| l.number)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(
            text,
            ConfigSource::File(PathBuf::from("/etc/rozd/test.toml")),
        )
    }

    fn invalid(text: &str) -> (String, Option<usize>, String) {
        match parse(text) {
            Err(ConfigError::Invalid {
                file, line, key, ..
            }) => (file, line, key),
            other => panic!("expected an invalid-config error, got {other:?}"),
        }
    }

    #[test]
    fn tasks_section_errors_name_line_and_key() {
        for (text, line, key) in [
            ("[tasks]\nmax_concurrent = 0\n", 2, "tasks.max_concurrent"),
            ("[tasks]\nmax_workers = 1000\n", 2, "tasks.max_workers"),
            (
                "[tasks]\nmax_timeout_secs = 60\ndefault_timeout_secs = 61\n",
                3,
                "tasks.default_timeout_secs",
            ),
            ("[tasks]\nai_mode = \"plan\"\n", 2, "tasks.ai_mode"),
            ("[tasks]\nmodel = \"gpt-nope\"\n", 2, "tasks.model"),
            ("[tasks]\nmax_workers = -1\n", 2, "tasks.max_workers"),
        ] {
            let (_, found_line, found_key) = invalid(text);
            assert_eq!(
                (found_line, found_key.as_str()),
                (Some(line), key),
                "{text}"
            );
        }
        let c = parse("[tasks]\nai_mode = \"react\"\nmax_workers = 0\n").unwrap();
        assert_eq!(c.tasks.ai_mode, AiMode::React);
        assert_eq!(c.tasks.max_workers, 0);
        let c = parse("[tasks]\nai_mode = \"ooda\"\n").unwrap();
        assert_eq!(
            c.tasks.ai_mode,
            AiMode::OodaReAct,
            "the aliases sessions accept"
        );
    }

    #[test]
    fn ooda_loop_settings_are_validated_naming_line_and_key() {
        for (text, line, key) in [
            (
                "[ooda]\ntick_hz = 100\npublish_hz = 200\n",
                3,
                "ooda.publish_hz",
            ),
            (
                "[ooda]\nrealtime_priority = 0\n",
                2,
                "ooda.realtime_priority",
            ),
            ("[ooda]\ncpu_affinity = []\n", 2, "ooda.cpu_affinity"),
            (
                "[ooda]\ntimer = \"runtime\"\nrealtime_priority = 10\n",
                2,
                "ooda.timer",
            ),
            ("[ooda]\ntimer = \"fast\"\n", 2, "ooda.timer"),
        ] {
            let (_, found_line, found_key) = invalid(text);
            assert_eq!(
                (found_line, found_key.as_str()),
                (Some(line), key),
                "{text}"
            );
        }
        let c =
            parse("[ooda]\ntick_hz = 1000\nrealtime_priority = 50\ncpu_affinity = [1]\n").unwrap();
        let l = c.ooda.loop_config();
        assert_eq!(l.publish_hz, 50.0, "at most 50 Hz by default");
        assert_eq!(l.realtime.priority, Some(50));
    }

    #[test]
    fn one_parser_for_every_ai_mode_spelling() {
        for (text, mode) in [
            ("react", AiMode::React),
            ("ooda_re_act", AiMode::OodaReAct),
            ("ooda", AiMode::OodaReAct),
            ("ooda_react", AiMode::OodaReAct),
        ] {
            assert_eq!(AiMode::parse(text), Some(mode), "{text}");
            assert!(AiMode::SPELLINGS.contains(&text));
        }
        for bad in ["", "React", "plan", "ooda-react"] {
            assert_eq!(AiMode::parse(bad), None, "{bad:?}");
        }
        assert_eq!(AiMode::default(), AiMode::OodaReAct);
        assert_eq!(AiMode::parse(AiMode::React.as_str()), Some(AiMode::React));
    }

    #[test]
    fn builtin_config_is_a_valid_simulated_host() {
        let c = Config::parse(BUILTIN_CONFIG, ConfigSource::BuiltIn).unwrap();
        assert_eq!(c.server.listen, default_listen());
        assert!(!c.auth_required());
        // No hardware needed: only simulated and host-system sources.
        assert!(
            c.sensors
                .iter()
                .all(|s| matches!(s.source, SensorSourceKind::Sim | SensorSourceKind::System))
        );
        assert!(c.actuators.iter().all(|a| a.kind == ActuatorKind::Sim));
        assert!(c.sensors.len() >= 3 && !c.actuators.is_empty());
        assert_eq!(
            Some(c.host.id),
            machine_hostname().or(Some("rozd-host".into()))
        );
    }

    #[test]
    fn documented_example_config_is_valid() {
        let text = include_str!("../config/rozd.toml");
        let c = parse(text).unwrap();
        assert_eq!(c.host.id, "rover-1");
        assert_eq!(c.permissions.len(), 2);
        assert_eq!(c.permissions[1].policy, Policy::Block);
        let endpoints: Vec<&str> = c.model.endpoints.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(endpoints, ["claude", "lab-box"]);
    }

    #[test]
    fn unknown_key_names_file_line_and_key() {
        let (file, line, key) =
            invalid("[host]\nid = \"a\"\n\n[server]\nlisten = \"127.0.0.1:1\"\nlisen = 3\n");
        assert_eq!(file, "/etc/rozd/test.toml");
        assert_eq!(line, Some(6));
        assert_eq!(key, "server.lisen");
    }

    #[test]
    fn absurd_timeouts_are_refused_not_overflowed() {
        let (_, line, key) = invalid("[session]\napproval_timeout_secs = 18446744073709551615\n");
        assert_eq!(
            (line, key.as_str()),
            (Some(2), "session.approval_timeout_secs")
        );
        let (_, _, key) = invalid("[session]\nkeepalive_secs = 9999999999\n");
        assert_eq!(key, "session.keepalive_secs");
    }

    #[test]
    fn wrong_type_names_line_and_key() {
        let (_, line, key) = invalid("[session]\nkeepalive_secs = \"ten\"\n");
        assert_eq!((line, key.as_str()), (Some(2), "session.keepalive_secs"));
    }

    #[test]
    fn bad_address_names_line_and_key() {
        let (_, line, key) = invalid("\n[server]\nlisten = \"localhost:99999\"\n");
        assert_eq!((line, key.as_str()), (Some(3), "server.listen"));
    }

    #[test]
    fn semantic_errors_point_at_the_key_in_arrays_of_tables() {
        let text = "[[actuators]]\nname = \"a\"\nkind = \"sim\"\nmin = 0\nmax = 1\nsafe_value = 0\n\n\
                    [[actuators]]\nname = \"b\"\nkind = \"sim\"\nmin = 0\nmax = 1\nsafe_value = 5\n";
        let (_, line, key) = invalid(text);
        assert_eq!((line, key.as_str()), (Some(13), "actuators[1].safe_value"));
    }

    #[test]
    fn non_loopback_without_tokens_is_refused_unless_allowed() {
        let (_, line, key) = invalid("[server]\nlisten = \"0.0.0.0:8080\"\n");
        assert_eq!((line, key.as_str()), (Some(2), "server.listen"));
        assert!(parse("[server]\nlisten = \"0.0.0.0:8080\"\nauth_tokens = [\"t0ken\"]\n").is_ok());
        assert!(
            parse("[server]\nlisten = \"0.0.0.0:8080\"\nallow_unauthenticated_remote = true\n")
                .is_ok()
        );
    }

    #[test]
    fn server_limits_hosts_and_socket_errors_name_line_and_key() {
        for (text, line, key) in [
            (
                "[server]\nmax_connections = 0\n",
                2,
                "server.max_connections",
            ),
            (
                "[server]\nmax_connections = -5\n",
                2,
                "server.max_connections",
            ),
            (
                "[server]\n\nheader_read_timeout_secs = 0\n",
                3,
                "server.header_read_timeout_secs",
            ),
            (
                "[server]\nidle_timeout_secs = 86401\n",
                2,
                "server.idle_timeout_secs",
            ),
            (
                "[server]\nallowed_hosts = [\"robot.lab\", \"http://x\"]\n",
                2,
                "server.allowed_hosts",
            ),
            (
                "[server]\ncontrol_socket = \"rel.sock\"\n",
                2,
                "server.control_socket",
            ),
            (
                &format!("[server]\ncontrol_socket = \"/{}\"\n", "x".repeat(200)),
                2,
                "server.control_socket",
            ),
        ] {
            let (_, found_line, found_key) = invalid(text);
            assert_eq!(
                (found_line, found_key.as_str()),
                (Some(line), key),
                "{text}"
            );
        }
        let c = parse(
            "[server]\nmax_connections = 32\nallowed_hosts = [\"*\"]\ncontrol_socket = \"\"\n",
        )
        .unwrap();
        assert_eq!(c.server.max_connections, 32);
        assert_eq!(c.server.control_socket_path(&c.store), None);
        let c = parse("[server]\ncontrol_socket = \"/run/x/c.sock\"\n").unwrap();
        assert_eq!(
            c.server.control_socket_path(&c.store),
            Some(PathBuf::from("/run/x/c.sock"))
        );
        let c = parse("[store]\npath = \"/var/tmp/r/rozd.db\"\n").unwrap();
        if std::env::var_os("RUNTIME_DIRECTORY").is_none() {
            assert_eq!(
                c.server.control_socket_path(&c.store),
                Some(PathBuf::from("/var/tmp/r/control.sock"))
            );
        }
    }

    #[test]
    fn token_file_is_read_and_secrets_are_not_printed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, "# operators\nalpha-token\n\nbeta-token\n").unwrap();
        let c = parse(&format!(
            "[server]\nauth_token_file = {:?}\n",
            path.display().to_string()
        ))
        .unwrap();
        let tokens: Vec<&str> = c.resolved_tokens.iter().map(Secret::expose).collect();
        assert_eq!(tokens, ["alpha-token", "beta-token"]);
        let printed = format!("{c:?}{}", c.summary());
        assert!(!printed.contains("alpha-token") && !printed.contains("beta-token"));
    }

    #[test]
    fn missing_token_file_is_an_error_naming_the_key() {
        let (_, line, key) = invalid("[server]\nauth_token_file = \"/nonexistent/rozd-tokens\"\n");
        assert_eq!((line, key.as_str()), (Some(2), "server.auth_token_file"));
    }

    #[test]
    fn missing_file_is_a_read_error_naming_the_file() {
        let err = Config::load_file(Path::new("/nonexistent/rozd.toml")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/rozd.toml"), "{err}");
    }
}
