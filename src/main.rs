//! The `rozd` command line.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use rozd::config::{Config, LogConfig, LogFormat};

/// Exit status for an invalid configuration (sysexits EX_CONFIG). The systemd
/// unit lists it in `RestartPreventExitStatus`, so a broken config does not
/// cause a restart loop.
const EXIT_CONFIG: u8 = 78;

#[derive(Parser)]
#[command(
    name = "rozd",
    version,
    about = "Edge-host daemon for roz agent sessions",
    long_about = "rozd owns this machine's sensors and actuators and serves the roz.v1 \
                  gRPC agent-session API (and a REST API) on one port.\n\n\
                  Without a subcommand it runs the daemon."
)]
struct Cli {
    /// Configuration file. Default: $ROZD_CONFIG, then /etc/rozd/rozd.toml,
    /// then the built-in simulated host.
    #[arg(long, short, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon (the default).
    Run,
    /// Validate the configuration and print the effective settings.
    Check,
    /// Ask a running daemon for its status (GET /v1/status).
    #[command(after_help = REACH_HELP)]
    Status {
        #[command(flatten)]
        reach: Reach,
        /// Bearer token, when the daemon requires one (not sent over the
        /// control socket).
        #[arg(long, env = "ROZD_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the hosts a running daemon knows (GET /v1/hosts): its fleet registry.
    Hosts {
        /// Address of the daemon.
        #[arg(long, default_value = "127.0.0.1:8080", env = "ROZD_ADDR")]
        addr: String,
        /// Bearer token, when the daemon requires one.
        #[arg(long, env = "ROZD_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Only the hosts of this environment.
        #[arg(long, value_name = "ENV")]
        environment: Option<String>,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Chat with an agent session on a running daemon (a gRPC client).
    #[command(
        long_about = "Opens a roz.v1 session on a running daemon and chats with it: each \
                      line on stdin is a message; the answer streams to stdout, activity, \
                      approvals and each turn's stop line to stderr. Ctrl-C cancels the \
                      running turn; a second Ctrl-C, Ctrl-C while idle, or end of input \
                      ends the session.\n\n\
                      The model gets one tool, `shell`. Without --allow-shell it refuses \
                      every call; with it, approved calls run `sh -c <command>` here.",
        after_help = rozd::chat::EXIT_STATUS_HELP
    )]
    Chat(ChatArgs),
    /// An MCP server on stdin/stdout relaying to a running daemon's /mcp
    /// (for Claude Desktop and other stdio MCP clients).
    Mcp {
        /// Address of the daemon (host:port or http://host:port).
        #[arg(long, default_value = "127.0.0.1:8080", env = "ROZD_ADDR")]
        addr: String,
        /// Bearer token, when the daemon requires one.
        #[arg(long, env = "ROZD_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Trigger the protective stop of a running daemon, or clear it (--clear).
    #[command(
        long_about = "Triggers the software protective stop of a running daemon \
                      (POST /v1/estop), through its local control socket when it \
                      can, else over TCP: every actuator goes to its safe value and \
                      commands are refused until the stop is cleared. With --clear, \
                      clears it (POST /v1/estop/clear); clearing never moves anything. \
                      Prints the resulting state.\n\n\
                      This is a software protective stop, not an emergency stop: a \
                      hardwired emergency stop is still required.",
        after_help = ESTOP_HELP
    )]
    Estop {
        #[command(flatten)]
        reach: Reach,
        /// Bearer token, when the daemon requires one (not sent over the
        /// control socket).
        #[arg(long, env = "ROZD_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Why: recorded as the stop's reason, or logged with the clear.
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
        /// Clear the latched stop instead of triggering it.
        #[arg(long)]
        clear: bool,
        /// Print the daemon's JSON answer.
        #[arg(long)]
        json: bool,
    },
    /// Tasks on a running daemon: create, list, show, cancel, approve, watch.
    #[command(
        long_about = "Tasks are jobs the host runs without a client attached: a headless \
                      agent with the host's tools, which may start worker agents. \
                      `watch` follows a task's status and team events until it ends.",
        after_help = rozd::task_cli::TASK_EXIT_HELP
    )]
    Task {
        /// Address of the daemon.
        #[arg(
            long,
            global = true,
            default_value = "127.0.0.1:8080",
            env = "ROZD_ADDR"
        )]
        addr: String,
        /// Bearer token, when the daemon requires one.
        #[arg(long, global = true, env = "ROZD_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Print the daemon's JSON answer.
        #[arg(long, global = true)]
        json: bool,
        #[command(subcommand)]
        command: rozd::task_cli::TaskCommand,
    },
}

/// Where `rozd status` and `rozd estop` send their request.
#[derive(Args)]
struct Reach {
    /// Address of the daemon over TCP [default: 127.0.0.1:8080].
    #[arg(long, env = "ROZD_ADDR")]
    addr: Option<String>,
    /// The daemon's local control socket, tried before TCP ("" for none).
    /// Default: from the configuration (see below).
    #[arg(long, env = "ROZD_SOCKET", value_name = "PATH")]
    socket: Option<PathBuf>,
}

const DEFAULT_ADDR: &str = "127.0.0.1:8080";

impl Reach {
    fn addr(&self) -> &str {
        self.addr.as_deref().unwrap_or(DEFAULT_ADDR)
    }

    /// The control socket to try first (see [`REACH_HELP`]).
    fn socket(&self, config: Option<&Path>) -> Option<PathBuf> {
        match &self.socket {
            Some(path) if path.as_os_str().is_empty() => None,
            Some(path) => Some(path.clone()),
            None => {
                let from_env = std::env::var_os(rozd::config::CONFIG_ENV)
                    .filter(|p| !p.is_empty())
                    .map(PathBuf::from);
                let config = config.map(Path::to_path_buf).or(from_env);
                rozd::client::control_socket(config.as_deref(), self.addr.is_some())
            }
        }
    }
}

/// How `rozd status` and `rozd estop` pick their way to the daemon.
macro_rules! reach_help {
    () => {
        "Order: the daemon's local control socket first (no token needed: its file \
permissions admit root and the daemon's group), then TCP at --addr.
The socket: --socket; else server.control_socket of --config (or $ROZD_CONFIG), or its \
default ($RUNTIME_DIRECTORY/control.sock, /run/rozd/control.sock for /etc/rozd/rozd.toml, \
else control.sock beside the store); without --config and --addr the same for the \
configuration the daemon would find; with only --addr, no socket."
    };
}

const REACH_HELP: &str = reach_help!();

const ESTOP_HELP: &str = concat!(
    reach_help!(),
    "

Exit status:
  0  triggered: the stop is latched; --clear: the stop is not latched (cleared, or was not active)
  1  no answer: cannot connect, no reply within 30 s, or a reply that is not understood
  2  bad arguments
  3  the daemon refused the request (e.g. 401: a missing or wrong token)
  4  --clear refused: a stop input (e.g. the GPIO stop button) still asserts the stop"
);

/// Bound on `rozd estop`'s whole request (triggering waits until every
/// actuator was driven to its safe value).
const ESTOP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

#[derive(Args)]
struct ChatArgs {
    /// Address of the daemon (host:port or http://host:port).
    #[arg(long, default_value = "127.0.0.1:8080", env = "ROZD_ADDR")]
    addr: String,
    /// Bearer token, when the daemon requires one.
    #[arg(long, env = "ROZD_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Model for the session (default: the daemon's `model.default`).
    #[arg(long)]
    model: Option<String>,
    /// Host the session runs on (default: the daemon's own host).
    #[arg(long, value_name = "HOST_ID")]
    host_id: Option<String>,
    /// Environment id (default: the host's `environment_id`).
    #[arg(long, value_name = "ENV")]
    environment: Option<String>,
    /// Run this one message non-interactively, then end the session; the
    /// exit status reports how the turn ended.
    #[arg(long, value_name = "TEXT")]
    prompt: Option<String>,
    /// Let the model run shell commands on this machine (`sh -c`), each after
    /// your approval.
    #[arg(long)]
    allow_shell: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Run) {
        Command::Run => run(cli.config.as_deref()),
        Command::Check => check(cli.config.as_deref()),
        Command::Status { reach, token, json } => status(
            reach.addr(),
            reach.socket(cli.config.as_deref()).as_deref(),
            token.as_deref(),
            json,
        ),
        Command::Hosts {
            addr,
            token,
            environment,
            json,
        } => hosts(&addr, token.as_deref(), environment.as_deref(), json),
        Command::Chat(args) => chat(args),
        Command::Mcp { addr, token } => mcp(rozd::mcp::proxy::Options { addr, token }),
        Command::Estop {
            reach,
            token,
            reason,
            clear,
            json,
        } => estop(
            reach.addr(),
            reach.socket(cli.config.as_deref()).as_deref(),
            token.as_deref(),
            reason.as_deref(),
            clear,
            json,
        ),
        Command::Task {
            addr,
            token,
            json,
            command,
        } => task(&addr, token.as_deref(), command, json),
    }
}

fn task(
    addr: &str,
    token: Option<&str>,
    command: rozd::task_cli::TaskCommand,
    raw: bool,
) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rozd task: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(rozd::task_cli::run(addr, token, command, raw)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("rozd task: {e}");
            ExitCode::from(e.exit)
        }
    }
}

fn chat(args: ChatArgs) -> ExitCode {
    let options = rozd::chat::ChatOptions {
        addr: args.addr,
        token: args.token,
        model: args.model,
        host_id: args.host_id,
        environment: args.environment,
        prompt: args.prompt,
        allow_shell: args.allow_shell,
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rozd chat: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(rozd::chat::run(options));
    // tokio reads stdin with a blocking read that cannot be cancelled: do not
    // wait for it (or for anything else) before exiting.
    rt.shutdown_background();
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("rozd chat: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn mcp(options: rozd::mcp::proxy::Options) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rozd mcp: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(rozd::mcp::proxy::run(options));
    // stdin is read with a blocking read that cannot be cancelled.
    rt.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rozd mcp: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn load_config(path: Option<&Path>) -> Result<Config, ExitCode> {
    Config::discover(path).map_err(|e| {
        eprintln!("rozd: invalid configuration: {e}");
        ExitCode::from(EXIT_CONFIG)
    })
}

fn check(path: Option<&Path>) -> ExitCode {
    match load_config(path) {
        Ok(config) => {
            print!("{}", config.summary());
            println!("configuration OK");
            ExitCode::SUCCESS
        }
        Err(code) => code,
    }
}

fn run(path: Option<&Path>) -> ExitCode {
    let config = match load_config(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    init_tracing(&config.log);
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("rozd")
        .build()
        .context("cannot start the async runtime")
        .and_then(|rt| {
            rt.block_on(rozd::daemon::run(config))
                .map_err(anyhow::Error::from)
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("rozd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn status(addr: &str, socket: Option<&Path>, token: Option<&str>, raw: bool) -> ExitCode {
    show_json(
        "status",
        addr,
        socket,
        "/v1/status",
        token,
        raw,
        format_status,
    )
}

fn hosts(addr: &str, token: Option<&str>, environment: Option<&str>, raw: bool) -> ExitCode {
    let mut path = format!("/v1/hosts?limit={}", rozd::api::MAX_HOSTS_LIMIT);
    if let Some(env) = environment {
        path.push_str("&environment_id=");
        path.push_str(&percent_encode(env));
    }
    show_json("hosts", addr, None, &path, token, raw, format_hosts)
}

/// `GET path` on the daemon (over `socket` first, if any), printed raw
/// (`--json`) or by `format`; exit status 1 when there is no answer, an
/// error, or no JSON.
fn show_json(
    command: &str,
    addr: &str,
    socket: Option<&Path>,
    path: &str,
    token: Option<&str>,
    raw: bool,
    format: fn(&serde_json::Value) -> String,
) -> ExitCode {
    let mut notes = Vec::new();
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
        .and_then(|rt| {
            rt.block_on(rozd::client::send_local(
                socket,
                addr,
                http::Method::GET,
                path,
                token,
                None,
                &mut notes,
            ))
            .map_err(anyhow::Error::from)
        });
    for note in notes {
        eprintln!("rozd {command}: {note}");
    }
    let (reply, via) = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rozd {command}: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    if !reply.status.is_success() {
        eprintln!(
            "rozd {command}: {via} answered {}: {}",
            reply.status,
            reply.body.trim()
        );
        return ExitCode::FAILURE;
    }
    if raw {
        println!("{}", reply.body.trim());
        return ExitCode::SUCCESS;
    }
    match serde_json::from_str::<serde_json::Value>(&reply.body) {
        Ok(v) => {
            print!("{}", format(&v));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "rozd {command}: {via} answered something that is not JSON ({e}): {}",
                reply.body
            );
            ExitCode::FAILURE
        }
    }
}

/// `%XX` for everything but unreserved URL characters.
fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The answer of `/v1/hosts` as a table.
fn format_hosts(v: &serde_json::Value) -> String {
    let text = |h: &serde_json::Value, k: &str| {
        h.get(k)
            .and_then(serde_json::Value::as_str)
            .unwrap_or("-")
            .to_string()
    };
    let fleet = &v["fleet"];
    let mut out = if fleet["configured"].as_bool() == Some(true) {
        format!(
            "fleet: {} ({})\n",
            fleet["broker"].as_str().unwrap_or("?"),
            if fleet["connected"].as_bool() == Some(true) {
                "connected"
            } else {
                "NOT connected: the list may be out of date"
            }
        )
    } else {
        "fleet: none (no [fleet] configured: this host alone)\n".to_string()
    };
    let mut rows = vec![[
        "ID".to_string(),
        "NAME".to_string(),
        "ENVIRONMENT".to_string(),
        "STATUS".to_string(),
        "STOP".to_string(),
        "ENDPOINT".to_string(),
        "HEARD".to_string(),
    ]];
    for h in v["data"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let heard = if h["this_host"].as_bool() == Some(true) {
            "this host".to_string()
        } else {
            match h["heard_ms_ago"].as_u64() {
                Some(ms) => format!("{}s ago", ms / 1000),
                None => "-".to_string(),
            }
        };
        rows.push([
            text(h, "id"),
            text(h, "name"),
            text(h, "environment_id"),
            text(h, "status"),
            if h["estop_active"].as_bool() == Some(true) {
                "ACTIVE".to_string()
            } else {
                "-".to_string()
            },
            text(h, "endpoint"),
            heard,
        ]);
    }
    let widths: Vec<usize> = (0..7)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    let total = v["total"].as_u64().unwrap_or(0);
    let shown = rows.len() - 1;
    if total > shown as u64 {
        out.push_str(&format!("({shown} of {total} hosts shown)\n"));
    }
    // Messages that anyone with access to the broker can publish, and
    // that this host did not take: worth a look when they are not zero.
    if let Some(ignored) = fleet["ignored"].as_object() {
        let counts: Vec<String> = ignored
            .iter()
            .filter_map(|(k, n)| n.as_u64().filter(|n| *n > 0).map(|n| format!("{k} {n}")))
            .collect();
        if !counts.is_empty() {
            out.push_str(&format!("ignored from the broker: {}\n", counts.join(", ")));
        }
    }
    out
}

fn estop(
    addr: &str,
    socket: Option<&Path>,
    token: Option<&str>,
    reason: Option<&str>,
    clear: bool,
    raw: bool,
) -> ExitCode {
    let (path, what) = if clear {
        ("/v1/estop/clear", "the protective stop was NOT cleared")
    } else {
        ("/v1/estop", "the protective stop was NOT triggered")
    };
    let body = match reason {
        Some(r) => serde_json::json!({ "reason": r }),
        None => serde_json::json!({}),
    };
    let target = match socket {
        Some(socket) => format!("{} or {addr}", socket.display()),
        None => addr.to_string(),
    };
    let mut notes = Vec::new();
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
        .and_then(|rt| {
            rt.block_on(async {
                tokio::time::timeout(
                    ESTOP_TIMEOUT,
                    rozd::client::send_local(
                        socket,
                        addr,
                        http::Method::POST,
                        path,
                        token,
                        Some(&body),
                        &mut notes,
                    ),
                )
                .await
            })
            .map_err(|_| {
                anyhow::anyhow!(
                    "no answer from {target} within {}s; check the state with `rozd status`",
                    ESTOP_TIMEOUT.as_secs()
                )
            })?
            .map_err(anyhow::Error::from)
        });
    for note in notes {
        eprintln!("rozd estop: {note}");
    }
    let (reply, via) = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rozd estop: {e:#}\nrozd estop: {what}");
            return ExitCode::from(1);
        }
    };
    if !reply.status.is_success() {
        let message = serde_json::from_str::<serde_json::Value>(&reply.body)
            .ok()
            .and_then(|v| {
                v.pointer("/error/message")
                    .and_then(|m| m.as_str())
                    .map(str::to_string)
            })
            .unwrap_or_else(|| reply.body.trim().to_string());
        eprintln!(
            "rozd estop: {via} answered {}: {message}\nrozd estop: {what}",
            reply.status
        );
        return ExitCode::from(if reply.status == http::StatusCode::CONFLICT {
            4
        } else {
            3
        });
    }
    let v = match serde_json::from_str::<serde_json::Value>(&reply.body) {
        Ok(v) => v,
        Err(e) => {
            eprintln!(
                "rozd estop: {via} answered something that is not JSON ({e}): {}",
                reply.body
            );
            return ExitCode::from(1);
        }
    };
    if raw {
        println!("{}", reply.body.trim());
    } else {
        print!("{}", format_safety(&v, clear));
    }
    let active = v.get("estop_active").and_then(serde_json::Value::as_bool);
    match (clear, active) {
        (false, Some(true)) | (true, Some(false)) => ExitCode::SUCCESS,
        _ => {
            eprintln!(
                "rozd estop: unexpected state in the answer: {}",
                reply.body.trim()
            );
            ExitCode::from(1)
        }
    }
}

/// The answer of `/v1/estop` or `/v1/estop/clear`, readably.
fn format_safety(v: &serde_json::Value, cleared: bool) -> String {
    let text = |p: &str| {
        v.pointer(p)
            .and_then(serde_json::Value::as_str)
            .unwrap_or("?")
            .to_string()
    };
    let guards: Vec<&str> = v
        .get("active_guards")
        .and_then(serde_json::Value::as_array)
        .map(|a| a.iter().filter_map(serde_json::Value::as_str).collect())
        .unwrap_or_default();
    let mut out = String::new();
    if v.get("estop_active").and_then(serde_json::Value::as_bool) == Some(true) {
        let fresh = v.get("triggered").and_then(serde_json::Value::as_bool) == Some(true);
        out.push_str(&format!(
            "protective stop: ACTIVE{}\n  source:  {}\n  reason:  {}\n",
            if fresh {
                ""
            } else {
                " (it was already latched; the first cause is kept)"
            },
            text("/stop/source"),
            text("/stop/reason"),
        ));
        out.push_str(
            "  every actuator was sent to its safe value; commands are refused until cleared\n",
        );
    } else if cleared && v.get("cleared").and_then(serde_json::Value::as_bool) == Some(true) {
        out.push_str("protective stop: cleared (nothing was moved; commands are accepted again)\n");
    } else {
        out.push_str("protective stop: not active\n");
    }
    if !guards.is_empty() {
        out.push_str(&format!("  guards:  {}\n", guards.join(", ")));
    }
    out
}

fn format_status(v: &serde_json::Value) -> String {
    let s = |k: &str| {
        v.get(k).map_or_else(
            || "?".to_string(),
            |x| x.to_string().trim_matches('"').to_string(),
        )
    };
    let uptime = v
        .get("uptime_secs")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0);
    let active = v
        .pointer("/sessions/active")
        .map_or_else(|| "?".into(), ToString::to_string);
    let cause = |stop: &serde_json::Value| {
        format!(
            "{}: {}",
            stop.get("source").and_then(|x| x.as_str()).unwrap_or("?"),
            stop.get("reason").and_then(|x| x.as_str()).unwrap_or("?")
        )
    };
    let stop = match (v.get("protective_stop"), v.get("protective_stop_causes")) {
        (_, Some(serde_json::Value::Array(causes))) if !causes.is_empty() => format!(
            "ACTIVE ({})",
            causes.iter().map(cause).collect::<Vec<_>>().join("; ")
        ),
        (Some(stop @ serde_json::Value::Object(_)), _) => format!("ACTIVE ({})", cause(stop)),
        (Some(serde_json::Value::Null), _) => "not active".to_string(),
        _ => "?".to_string(),
    };
    format!(
        "host:         {} ({})\nenvironment:  {}\nversion:      {}\nlistening:    {}\nuptime:       {}h {:02}m {:02}s\nsessions:     {} active\nsensors:      {}\nactuators:    {}\nstop:         {}\n",
        s("host_id"),
        s("name"),
        s("environment_id"),
        s("version"),
        s("listen"),
        uptime / 3600,
        (uptime / 60) % 60,
        uptime % 60,
        active,
        s("sensors"),
        s("actuators"),
        stop,
    )
}

/// Logs go to journald when systemd started us with a journal (its
/// `JOURNAL_STREAM` is set and the socket exists), else to stderr.
/// `RUST_LOG` overrides `log.level`.
fn init_tracing(log: &LogConfig) {
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&log.level));
    let under_journal = std::env::var_os("JOURNAL_STREAM").is_some()
        && Path::new("/run/systemd/journal/socket").exists();
    if under_journal && let Ok(journald) = tracing_journald::layer() {
        tracing_subscriber::registry()
            .with(filter)
            .with(journald)
            .init();
        return;
    }
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    match log.format {
        LogFormat::Json => tracing_subscriber::registry()
            .with(filter)
            .with(fmt.json())
            .init(),
        LogFormat::Text => tracing_subscriber::registry().with(filter).with(fmt).init(),
    }
}
