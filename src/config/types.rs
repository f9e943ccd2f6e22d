//! The configuration's shared leaf types: the sections and values that the
//! sub-modules (fleet, safety, hw, model, ooda, tools, session, team, api)
//! take from the configuration, and the one shape every validator reports a
//! problem in ([`Invalid`]).
//!
//! This file imports nothing of rozd but the leaf `config::units` (how its
//! durations are read), so every module can depend on it without a circle
//! through the aggregate (`config::load`), which itself calls the
//! sub-modules' validators.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub use super::scope::Scope;

/// A validation failure: the dotted key (`actuators[1].safe_value`) and what
/// is wrong. The aggregate turns it into a [`super::ConfigError`] naming the
/// file and the line of the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub key: String,
    pub message: String,
}

impl Invalid {
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Invalid {
        Invalid {
            key: key.into(),
            message: message.into(),
        }
    }

    /// The message with `note` after it, in brackets: what a bound means
    /// (`"a year"`, `"1 MiB"`).
    pub fn noting(mut self, note: &str) -> Invalid {
        self.message = format!("{} ({note})", self.message);
        self
    }
}

/// The one check of a numeric bound: `value` (of `key`) within `range`, or
/// the error saying which bound it broke, worded alike everywhere
/// ("must be between 1 and 86400", "must be at least 1", "must be at most
/// 256").
pub(crate) fn within<T, R>(key: impl Into<String>, value: T, range: R) -> Result<(), Invalid>
where
    T: PartialOrd + std::fmt::Display,
    R: std::ops::RangeBounds<T>,
{
    use std::ops::Bound::{Included, Unbounded};
    if range.contains(&value) {
        return Ok(());
    }
    let message = match (range.start_bound(), range.end_bound()) {
        (Included(low), Included(high)) => format!("must be between {low} and {high}"),
        (Included(low), Unbounded) => format!("must be at least {low}"),
        (Unbounded, Included(high)) => format!("must be at most {high}"),
        // Exclusive bounds say so in their own words at their call sites.
        _ => "is out of range".to_string(),
    };
    Err(Invalid::new(key, message))
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "key `{}`: {}", self.key, self.message)
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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HostConfig {
    /// Stable identifier of this host; defaults to the machine's hostname.
    pub id: String,
    pub name: Option<String>,
    pub environment_id: String,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            id: machine_hostname().unwrap_or_else(|| "rozd-host".to_string()),
            name: None,
            environment_id: "default".to_string(),
        }
    }
}

impl HostConfig {
    pub fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.id)
    }
}

/// `[server]`, validated: how the listener listens. Its credentials are
/// [`AuthConfig`]; the file's form (with the defaults) is
/// `config::server::RawServer`.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub allow_unauthenticated_remote: bool,
    /// Lets a non-loopback listener serve without TLS (tokens and sessions
    /// then cross the network in cleartext).
    pub allow_plaintext_remote: bool,
    /// `[server.tls]`: the listener serves TLS (absent: plaintext).
    pub tls: Option<ServerTlsConfig>,
    /// How long open streams get to finish after SIGTERM before they are
    /// cut (`shutdown_grace_secs`).
    pub shutdown_grace: Duration,
    /// Bound within which a silently vanished client is detected (HTTP/2
    /// pings every half of it, each answered within the other half;
    /// `http2_keepalive_secs`); `None`: no pings.
    pub http2_keepalive: Option<Duration>,
    /// Most TCP connections open at once; a new one beyond it evicts the
    /// oldest connection that has not completed an authenticated request,
    /// else the longest-idle one.
    pub max_connections: u32,
    /// Bound on receiving an HTTP/1 request head (also on the wait for the
    /// next request on a keep-alive connection; `header_read_timeout_secs`).
    pub header_read_timeout: Duration,
    /// A connection (HTTP/1 or HTTP/2, TCP or the control socket) with no
    /// request in flight for this long is closed (`idle_timeout_secs`).
    pub idle_timeout: Duration,
    /// Host names (besides the daemon's own) that requests may name in
    /// `Host` / `:authority`; `"*"` accepts any.
    pub allowed_hosts: Vec<String>,
    /// The local control socket.
    pub control_socket: ControlSocket,
    /// HTTP/2 streams one connection may have open at once.
    pub max_concurrent_streams: u32,
}

/// `server.control_socket`: where the local control socket is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlSocket {
    /// Not set: see [`ControlSocket::path`].
    Default,
    /// An absolute path.
    At(PathBuf),
    /// `""`: no control socket.
    Disabled,
}

impl ControlSocket {
    /// The setting as the file gives it: absent, `""` (disabled) or a path.
    pub fn from_setting(setting: Option<PathBuf>) -> ControlSocket {
        match setting {
            None => ControlSocket::Default,
            Some(p) if p.as_os_str().is_empty() => ControlSocket::Disabled,
            Some(p) => ControlSocket::At(p),
        }
    }

    /// Where the daemon listens for local control: the path when one is
    /// set (`None` when disabled); else `$RUNTIME_DIRECTORY/control.sock`
    /// under systemd (`/run/rozd/control.sock`); else `control.sock` in the
    /// store's directory (`~/.local/state/rozd/control.sock` for a developer).
    pub fn path(&self, store: &StoreConfig) -> Option<PathBuf> {
        match self {
            ControlSocket::Disabled => None,
            ControlSocket::At(p) => Some(p.clone()),
            ControlSocket::Default => Some(
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

/// The credentials `[server]` configures, validated: secrets read (from
/// `auth_token_file`, each token's variable or file) and scopes parsed.
/// The fleet token is `[fleet]`'s (see `Config::auth_required`).
#[derive(Debug, Clone, Default)]
pub struct AuthConfig {
    /// `server.auth_tokens`, then the lines of `server.auth_token_file`:
    /// admin tokens, named `auth_tokens[<n>]` in this order.
    pub admin_tokens: Vec<Secret>,
    /// `[[server.tokens]]`.
    pub tokens: Vec<NamedToken>,
    /// `[[server.clients]]`.
    pub clients: Vec<NamedClient>,
}

impl AuthConfig {
    /// How many credentials these are.
    pub fn len(&self) -> usize {
        self.admin_tokens.len() + self.tokens.len() + self.clients.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The name under which the fleet token (`[fleet] token`, presented by
/// other hosts that relay here) appears in logs and the audit.
pub const FLEET_CREDENTIAL: &str = "fleet";

/// A credential as the authentication layer uses it: its name (what logs
/// and the audit show), its secret and its scope.
#[derive(Debug, Clone)]
pub struct NamedToken {
    pub name: String,
    pub secret: Secret,
    pub scope: Scope,
}

/// A client certificate subject and its scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedClient {
    pub subject: String,
    pub scope: Scope,
}

/// The highest of `scopes` (each includes the lower ones); `Err` names the
/// first unknown entry. An empty list is an error: a credential that may
/// do nothing is a mistake.
pub(crate) fn parse_scopes(scopes: &[String]) -> Result<Scope, String> {
    let mut highest = None;
    for scope in scopes {
        let parsed = Scope::parse(scope)
            .ok_or_else(|| format!("{scope:?} is not a scope (expected {})", Scope::NAMES))?;
        highest = highest.max(Some(parsed));
    }
    highest.ok_or_else(|| format!("give at least one scope ({})", Scope::NAMES))
}

/// Whether the listener asks clients for a certificate (`server.tls.client_auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    /// No client certificates.
    #[default]
    None,
    /// Clients may present one; it must chain to `client_ca_file`.
    Optional,
    /// Clients must present one chaining to `client_ca_file`.
    Required,
}

impl ClientAuth {
    pub fn as_str(self) -> &'static str {
        match self {
            ClientAuth::None => "none",
            ClientAuth::Optional => "optional",
            ClientAuth::Required => "required",
        }
    }
}

/// `[server.tls]`: the listener's certificate and client authentication.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerTlsConfig {
    /// PEM: the certificate chain, the listener's own certificate first.
    pub cert_file: PathBuf,
    /// PEM: the private key of `cert_file` (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// PEM: the CAs that client certificates must chain to.
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
    #[serde(default)]
    pub client_auth: ClientAuth,
    /// Bound on a client's TLS handshake (`handshake_timeout_secs`).
    #[serde(
        rename = "handshake_timeout_secs",
        deserialize_with = "super::units::secs",
        default = "default_handshake_timeout"
    )]
    pub handshake_timeout: Duration,
    /// How often the files are checked for a change, then reloaded
    /// (`reload_check_secs`); `None` (0): only on SIGHUP.
    #[serde(
        rename = "reload_check_secs",
        deserialize_with = "super::units::secs_or_off",
        default = "default_reload_check"
    )]
    pub reload_check: Option<Duration>,
}

fn default_handshake_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_reload_check() -> Option<Duration> {
    Some(Duration::from_secs(10))
}

/// The file name of the control socket in its default directory.
pub const CONTROL_SOCKET_NAME: &str = "control.sock";
/// Longest path a Unix socket can have (`sun_path` is 108 bytes with its NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// The first of the colon-separated directories systemd passes in `var`
/// (`STATE_DIRECTORY`, `RUNTIME_DIRECTORY`), if any.
fn first_env_dir(var: &str) -> Option<PathBuf> {
    let value = std::env::var_os(var)?;
    let first = value.to_string_lossy().split(':').next()?.to_string();
    (!first.is_empty()).then(|| PathBuf::from(first))
}

// `[log]` belongs to the logging module (which imports no configuration).
pub use crate::logging::{LogConfig, LogFormat};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// SQLite database file. Default: `$STATE_DIRECTORY/rozd.db` under systemd,
    /// else `$XDG_STATE_HOME/rozd/rozd.db` (or `~/.local/state/rozd/rozd.db`).
    pub path: Option<PathBuf>,
    /// Sessions, tasks and audit rows older than this many days are
    /// deleted; 0 keeps everything.
    pub retain_days: u32,
    /// Above this size (MiB) the oldest sessions and tasks go first (never
    /// an audit row younger than `retain_days`); 0: no cap.
    pub max_size_mb: u32,
    /// The size (MiB) the database never grows beyond (SQLite's
    /// `max_page_count`): a write that needs more fails as on a full disk,
    /// and PHYSICAL calls are refused until it can write again. 0: none.
    pub hard_cap_mb: u32,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            path: None,
            retain_days: 90,
            max_size_mb: 512,
            hard_cap_mb: 0,
        }
    }
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
        default_store_path(std::env::var_os("XDG_STATE_HOME"), std::env::var_os("HOME"))
    }
}

/// `$XDG_STATE_HOME/rozd/rozd.db`, else `$HOME/.local/state/rozd/rozd.db`.
/// As the XDG base directory specification says, a variable that is empty
/// or relative is ignored: the store must not land wherever the daemon
/// happens to be started from.
pub(super) fn default_store_path(
    xdg_state_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> PathBuf {
    let absolute = |value: Option<std::ffi::OsString>| {
        value.map(PathBuf::from).filter(|path| path.is_absolute())
    };
    let base = absolute(xdg_state_home)
        .or_else(|| absolute(home).map(|home| home.join(".local/state")))
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("rozd").join("rozd.db")
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionConfig {
    /// Between `Keepalive` messages on an open session stream.
    #[serde(rename = "keepalive_secs", deserialize_with = "super::units::secs")]
    pub keepalive: Duration,
    /// Timeout for a client tool that declares `timeout_ms = 0`.
    pub default_tool_timeout_ms: u32,
    /// How long a `require_confirmation` call waits for a `PermissionDecision`.
    #[serde(
        rename = "approval_timeout_secs",
        deserialize_with = "super::units::secs"
    )]
    pub approval_timeout: Duration,
    /// Upper bound of model calls in one turn (stop reason `max_cycles`).
    pub max_cycles: u32,
    /// Context budget when `StartSession.max_context_tokens` is absent.
    pub default_max_context_tokens: u32,
    /// Tokens one session may spend in total (input, cached input and output
    /// of every model call); 0 = unlimited. Then `budget_exceeded`.
    pub max_session_tokens: u64,
    /// Compaction brings the context down to this fraction of the budget.
    pub compact_target: f64,
    /// Above this fraction of the budget, old tool results are elided.
    pub compact_tool_results_at: f64,
    /// Above this fraction, old thinking is removed.
    pub compact_thinking_at: f64,
    /// Above this fraction, the oldest turns are summarised by the model.
    pub compact_summary_at: f64,
    /// Sessions open at once; a `StartSession` beyond it is `rate_limited`.
    pub max_sessions: u32,
    /// Bytes of client data one session may hold: history, project
    /// context, registered tools and their system contexts.
    pub max_session_bytes: u64,
    /// Client tools one session may have registered at once.
    pub max_session_tools: u32,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            keepalive: Duration::from_secs(10),
            default_tool_timeout_ms: 30_000,
            approval_timeout: Duration::from_secs(120),
            max_cycles: 25,
            default_max_context_tokens: 200_000,
            max_session_tokens: 0,
            compact_target: 0.4,
            compact_tool_results_at: 0.5,
            compact_thinking_at: 0.6,
            compact_summary_at: 0.75,
            max_sessions: 16,
            max_session_bytes: 2 * 1024 * 1024,
            max_session_tools: 256,
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

/// Where the operator's manual lives when `agent.manual_file` is not set.
pub const DEFAULT_MANUAL_PATH: &str = "/etc/rozd/AGENTS.md";

/// `[agent]`: what every session is told about the robot before it starts.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    /// The operator's manual (Markdown); absent: [`DEFAULT_MANUAL_PATH`]
    /// when that file exists.
    pub manual_file: Option<std::path::PathBuf>,
    /// The largest manual rozd accepts, in bytes.
    pub manual_max_bytes: u64,
    /// The embodiment's budget in estimated tokens; beyond it sensors are
    /// summarised (the model is pointed at `observe`).
    pub embodiment_max_tokens: u32,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            manual_file: None,
            manual_max_bytes: 32 * 1024,
            embodiment_max_tokens: 2_000,
        }
    }
}

/// `[approvals]`: who may answer a `require_confirmation` call.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalsConfig {
    /// A credential cannot approve a call it made itself (an MCP call, a
    /// task it created, a call of its own session): another credential must.
    /// Denying is always allowed.
    #[serde(default)]
    pub require_other_credential: bool,
}

/// `[tasks]`: jobs the host runs without a client (TaskService).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TasksConfig {
    /// Tasks running at once; `CreateTask` beyond that is refused.
    pub max_concurrent: u32,
    /// Workers one task's lead may start with `spawn_worker` (the lead itself not counted).
    pub max_workers: u32,
    /// `timeout_secs` of a task that does not give one.
    pub default_timeout_secs: u32,
    /// Largest `timeout_secs` a task may ask for.
    pub max_timeout_secs: u32,
    /// Agent mode of a task's lead and of workers that do not name one.
    pub ai_mode: AiMode,
    /// Model of the task agents; absent = `model.default`.
    pub model: Option<String>,
}

impl Default for TasksConfig {
    fn default() -> Self {
        TasksConfig {
            max_concurrent: 4,
            max_workers: 8,
            default_timeout_secs: 600,
            max_timeout_secs: 86_400,
            ai_mode: AiMode::default(),
            model: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SafetyConfig {
    /// Deadline for a PHYSICAL call on an actuator without its own `timeout_ms`.
    pub default_timeout_ms: u32,
    /// A GPIO input (BCM number) that triggers the protective stop while it
    /// is at `estop_gpio_active`.
    pub estop_gpio_pin: Option<u8>,
    /// The stop input's active level; default `low`.
    pub estop_gpio_active: Option<Level>,
    /// The stop input's bias; default `up` when active low, `down` when active high.
    pub estop_gpio_pull: Option<Pull>,
    /// An MQTT topic whose messages `1`, `true` or `stop` trigger the
    /// protective stop (needs `[mqtt]`).
    pub estop_mqtt_topic: Option<String>,
}

impl Default for SafetyConfig {
    fn default() -> Self {
        SafetyConfig {
            default_timeout_ms: 5_000,
            estop_gpio_pin: None,
            estop_gpio_active: None,
            estop_gpio_pull: None,
            estop_mqtt_topic: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pull {
    None,
    Up,
    Down,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    High,
    Low,
}

/// The machine's hostname, as the kernel reports it.
pub fn machine_hostname() -> Option<String> {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()?;
    let name = raw.trim();
    (!name.is_empty()).then(|| name.to_string())
}

/// The tokens of a token file: its lines, trimmed, without blank lines and
/// `#` comments.
pub(crate) fn token_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
}

/// A host id: 1-128 letters, digits, '-', '_', '.'.
pub(crate) fn valid_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Checks one `server.allowed_hosts` entry: `"*"`, or a host name without
/// scheme, port or path.
pub(crate) fn check_allowed_host_entry(entry: &str) -> Result<(), &'static str> {
    if entry == "*" {
        return Ok(());
    }
    if entry.is_empty() || entry.len() > 253 {
        return Err("a host name has 1 to 253 characters");
    }
    if !entry
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
    {
        return Err(
            "a host name has only letters, digits, '-', '_' and '.' (no scheme, port or path; \
             IP addresses are always allowed)",
        );
    }
    Ok(())
}
