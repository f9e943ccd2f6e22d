//! The `rozd` command line: its arguments, and which part of rozd runs each
//! command (the daemon, or a client of one in [`rozd::cli`]).
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use rozd::cli;
use rozd::config::Config;
use rozd::daemon::preflight;

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
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print what a session on a running daemon is told before it starts
    /// (GET /v1/embodiment): the embodiment generated from the
    /// configuration, then the operator's manual, and their version.
    #[command(after_help = REACH_HELP)]
    Manual {
        #[command(flatten)]
        reach: Reach,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the hosts a running daemon knows (GET /v1/hosts): its fleet registry.
    Hosts {
        #[command(flatten)]
        daemon: DaemonArgs,
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
        after_help = cli::chat::EXIT_STATUS_HELP
    )]
    Chat(ChatArgs),
    /// An MCP server on stdin/stdout relaying to a running daemon's /mcp
    /// (for Claude Desktop and other stdio MCP clients).
    Mcp {
        #[command(flatten)]
        daemon: DaemonArgs,
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
        /// Why: recorded as the stop's reason, or logged with the clear.
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
        /// Clear the latched stop instead of triggering it.
        #[arg(long)]
        clear: bool,
        /// The fleet-wide stop of an environment (`POST /v1/fleet/estop`;
        /// with --clear its clear, admin): over TCP with the token.
        #[arg(long)]
        fleet: bool,
        /// With --fleet: the environment (default: the daemon's own).
        #[arg(long, value_name = "ENV", requires = "fleet")]
        environment: Option<String>,
        /// Print the daemon's JSON answer.
        #[arg(long)]
        json: bool,
    },
    /// The simulated GPIO backend's pins of a running daemon: list them, or
    /// drive an input (rehearse a stop button without a Raspberry Pi).
    #[command(after_help = GPIO_HELP)]
    Gpio {
        #[command(flatten)]
        reach: Reach,
        /// Print the daemon's JSON answer.
        #[arg(long)]
        json: bool,
        #[command(subcommand)]
        command: GpioCommand,
    },
    /// Models of the configuration: check that a model server can run sessions.
    Model {
        #[command(subcommand)]
        command: ModelCommand,
    },
    /// Calls waiting for an operator's approval (MCP, gRPC sessions such as
    /// the roz CLI's, tasks): list them, approve or deny one.
    #[command(
        after_help = "Exit status:\n  0  listed / answered\n  1  no answer: cannot connect, no reply in time, or a reply that is not understood\n  2  bad arguments\n  3  refused (e.g. 401: a missing or wrong token; 403: a credential approving its own call)\n  4  no call with that id is waiting (answered already, or timed out)"
    )]
    Approvals {
        #[command(flatten)]
        daemon: DaemonArgs,
        /// Print the daemon's JSON answer.
        #[arg(long)]
        json: bool,
        #[command(subcommand)]
        command: Option<ApprovalsCommand>,
    },
    /// Recordings on this machine (MCAP files of `[record]`): list, info.
    #[command(
        long_about = "Lists the recordings in the directory of [record] (of --config, \
                      $ROZD_CONFIG, /etc/rozd/rozd.toml), or --dir; shows a file's \
                      channels, message counts and time range. Reads the files \
                      directly: no daemon needed.",
        after_help = "Exit status:\n  0  listed / shown\n  1  the directory or the file cannot be read\n  2  bad arguments\n  78 invalid configuration, or no [record] in it (and no --dir)"
    )]
    Record {
        #[command(subcommand)]
        command: RecordCommand,
    },
    /// Tasks on a running daemon: create, list, show, cancel, approve, watch.
    #[command(
        long_about = "Tasks are jobs the host runs without a client attached: a headless \
                      agent with the host's tools, which may start worker agents. \
                      `watch` follows a task's status and team events until it ends.",
        after_help = cli::task::TASK_EXIT_HELP
    )]
    Task {
        #[command(flatten)]
        daemon: DaemonArgs,
        /// Print the daemon's JSON answer.
        #[arg(long, global = true)]
        json: bool,
        #[command(subcommand)]
        command: cli::task::TaskCommand,
    },
}

#[derive(Subcommand)]
enum GpioCommand {
    /// The pins in use, their levels, inputs and outputs.
    List,
    /// Drive input PIN (BCM number) to an electrical level, as a button or
    /// switch wired to it would: 0 low, 1 high.
    Set {
        pin: u8,
        #[arg(value_parser = clap::value_parser!(u8).range(0..=1))]
        level: u8,
    },
}

#[derive(Subcommand)]
enum ModelCommand {
    /// A fixed round trip against model NAME (an endpoint's name or model
    /// id, or `local`) of --config: a streamed answer, a forced tool call,
    /// its result accepted, usage, an image; prints what works and, where
    /// something fails, the server's own words.
    #[command(after_help = cli::model::EXIT_STATUS_HELP)]
    Check {
        name: String,
        /// Print the verdict as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ApprovalsCommand {
    /// The waiting calls (the default): id, tool, parameters, who asks.
    List,
    /// Approve call ID (the `id` of the list): it runs.
    Approve { id: String },
    /// Deny call ID: it does not run.
    Deny { id: String },
}

#[derive(Subcommand)]
enum RecordCommand {
    /// The recordings, oldest first: name, size, state (finished or unfinished).
    List {
        /// The directory [default: record.directory of the configuration].
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// One file: channels with message counts and schemas, time range, state.
    Info {
        /// The .mcap file.
        file: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// TLS of an `https://` address: whom to trust, and the client
/// certificate for a daemon with `server.tls.client_auth`.
#[derive(Args)]
struct TlsArgs {
    /// CA certificate(s) (PEM) the daemon's certificate must chain to
    /// [default: the system's roots, or $SSL_CERT_FILE].
    #[arg(long, global = true, env = "ROZD_CACERT", value_name = "FILE")]
    cacert: Option<PathBuf>,
    /// Client certificate chain (PEM), for a daemon that asks for one.
    #[arg(
        long,
        global = true,
        env = "ROZD_CERT",
        value_name = "FILE",
        requires = "key"
    )]
    cert: Option<PathBuf>,
    /// Private key (PEM) of --cert.
    #[arg(
        long,
        global = true,
        env = "ROZD_KEY",
        value_name = "FILE",
        requires = "cert"
    )]
    key: Option<PathBuf>,
}

impl TlsArgs {
    /// Used by every `https://` connection of this command; `ca_file` is
    /// trusted when `--cacert` is not given.
    fn apply(&self, ca_file: Option<PathBuf>) {
        cli::connect::set_client_tls(rozd::tls::client::ClientTlsFiles {
            ca_file: self.cacert.clone().or(ca_file),
            cert_file: self.cert.clone(),
            key_file: self.key.clone(),
        });
    }
}

/// The address client command `command` talks to: `--addr` (or
/// `$ROZD_ADDR`), else the listen address of `--config` (or `$ROZD_CONFIG`)
/// with `https://` for its `[server.tls]`, else 127.0.0.1:8080; puts `tls`
/// in force. A configuration it cannot read is an error (exit 78): another
/// daemon is not to be talked to instead, except by a stop, which tries the
/// default address rather than not stopping.
fn daemon_addr(
    command: &str,
    addr: Option<&str>,
    config: Option<&Path>,
    tls: &TlsArgs,
) -> Result<String, ExitCode> {
    match cli::client::reach_for(addr, config) {
        Ok(reach) => {
            tls.apply(reach.ca_file);
            Ok(reach.addr)
        }
        Err(why) if command == "estop" => {
            eprintln!(
                "rozd estop: {why}; trying {} over TCP",
                cli::connect::DEFAULT_ADDR
            );
            tls.apply(None);
            Ok(cli::connect::DEFAULT_ADDR.to_string())
        }
        Err(why) => {
            eprintln!("rozd {command}: {why}");
            Err(ExitCode::from(EXIT_CONFIG))
        }
    }
}

/// How a client command reaches a running daemon over TCP: the flags of
/// every client command (`--addr`, `--token`, the TLS ones), declared once.
#[derive(Args)]
struct DaemonArgs {
    /// Address of the daemon (host:port, http://host:port, or
    /// https://host:port for TLS) [default: the listen address of --config,
    /// https:// with its [server.tls]; else 127.0.0.1:8080].
    #[arg(long, global = true, env = "ROZD_ADDR")]
    addr: Option<String>,
    /// Bearer token, when the daemon requires one.
    #[arg(long, global = true, env = "ROZD_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(flatten)]
    tls: TlsArgs,
}

impl DaemonArgs {
    /// The address and token for `command`, with the TLS flags put in
    /// force (see [`daemon_addr`]).
    fn connect(
        self,
        command: &str,
        config: Option<&Path>,
    ) -> Result<(String, Option<String>), ExitCode> {
        let addr = daemon_addr(command, self.addr.as_deref(), config, &self.tls)?;
        Ok((addr, self.token))
    }
}

/// Where `rozd status` and `rozd estop` send their request: the control
/// socket first, else TCP.
#[derive(Args)]
struct Reach {
    /// Address of the daemon over TCP [default: the listen address of
    /// --config, else 127.0.0.1:8080].
    #[arg(long, env = "ROZD_ADDR")]
    addr: Option<String>,
    /// The daemon's local control socket, tried before TCP ("" for none).
    /// Default: from the configuration (see below).
    #[arg(long, env = "ROZD_SOCKET", value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Bearer token, when the daemon requires one (not sent over the
    /// control socket).
    #[arg(long, env = "ROZD_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(flatten)]
    tls: TlsArgs,
}

impl Reach {
    /// The TCP address for `command` (see [`daemon_addr`]).
    fn addr(&self, command: &str, config: Option<&Path>) -> Result<String, ExitCode> {
        daemon_addr(command, self.addr.as_deref(), config, &self.tls)
    }

    /// The control socket to try first (see [`REACH_HELP`]).
    fn socket(&self, config: Option<&Path>) -> Option<PathBuf> {
        cli::client::socket_for(self.socket.as_deref(), config, self.addr.is_some())
    }
}

/// How `rozd status` and `rozd estop` pick their way to the daemon.
macro_rules! reach_help {
    () => {
        "Order: the daemon's local control socket first (no token needed: its file \
permissions admit root and the daemon's group), then TCP at --addr (default: \
server.listen of --config or $ROZD_CONFIG, https:// with its [server.tls]; else 127.0.0.1:8080).
The socket: --socket; else server.control_socket of --config (or $ROZD_CONFIG), or its \
default ($RUNTIME_DIRECTORY/control.sock, /run/rozd/control.sock for /etc/rozd/rozd.toml, \
else control.sock beside the store); without --config and --addr the same for the \
configuration the daemon would find; with only --addr, no socket."
    };
}

const REACH_HELP: &str = reach_help!();

const GPIO_HELP: &str = concat!(
    reach_help!(),
    "

Only a daemon on the sim GPIO backend ([gpio] backend = \"sim\", or \"auto\" off a Pi) \
takes it; one on real pins answers 409.

Exit status:
  0  listed / set
  1  no answer: cannot connect, no reply within 30 s, or a reply that is not understood
  2  bad arguments
  3  refused: not the sim backend, an output pin, a missing or wrong (admin) token"
);

const ESTOP_HELP: &str = concat!(
    reach_help!(),
    "

Exit status:
  0  triggered: the stop is latched; --clear: the stop is not latched (cleared, or was not active)
  1  no answer: cannot connect, no reply within 30 s, or a reply that is not understood
  2  bad arguments
  3  the daemon refused the request (e.g. 401: a missing or wrong token)
  4  --clear refused: a stop input (e.g. the GPIO stop button) still asserts the stop
  5  --fleet: sent, but not every live host of the environment confirmed it in time

--fleet stops (or with --clear clears, admin) every host of an environment
through this daemon's fleet (`POST /v1/fleet/estop`): over TCP only, with the
token (a fleet turns authentication on); the daemon latches its own stop first."
);

#[derive(Args)]
struct ChatArgs {
    #[command(flatten)]
    daemon: DaemonArgs,
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
    /// Also show the session's bookkeeping: presence hints and the local
    /// model's notes on each call.
    #[arg(long, short = 'v')]
    verbose: bool,
}

fn main() -> ExitCode {
    let parsed = Cli::parse();
    let config = parsed.config.as_deref();
    match parsed.command.unwrap_or(Command::Run) {
        Command::Run => run(config),
        Command::Check => check(config),
        Command::Status { reach, json } => match reach.addr("status", config) {
            Ok(addr) => ExitCode::from(cli::status::status(
                &addr,
                reach.socket(config).as_deref(),
                reach.token.as_deref(),
                json,
            )),
            Err(code) => code,
        },
        Command::Manual { reach, json } => match reach.addr("manual", config) {
            Ok(addr) => ExitCode::from(cli::status::manual(
                &addr,
                reach.socket(config).as_deref(),
                reach.token.as_deref(),
                json,
            )),
            Err(code) => code,
        },
        Command::Hosts {
            daemon,
            environment,
            json,
        } => match daemon.connect("hosts", config) {
            Ok((addr, token)) => ExitCode::from(cli::status::hosts(
                &addr,
                token.as_deref(),
                environment.as_deref(),
                json,
            )),
            Err(code) => code,
        },
        Command::Chat(args) => match args.daemon.connect("chat", config) {
            Ok((addr, token)) => ExitCode::from(cli::chat::exec(cli::chat::ChatOptions {
                addr,
                token,
                model: args.model,
                host_id: args.host_id,
                environment: args.environment,
                prompt: args.prompt,
                allow_shell: args.allow_shell,
                verbose: args.verbose,
            })),
            Err(code) => code,
        },
        Command::Mcp { daemon } => match daemon.connect("mcp", config) {
            Ok((addr, token)) => ExitCode::from(cli::mcp::exec(cli::mcp::Options { addr, token })),
            Err(code) => code,
        },
        Command::Estop {
            reach,
            reason,
            clear,
            fleet,
            environment,
            json,
        } => ExitCode::from({
            // Never fails: a stop tries the default address rather than none.
            let addr = reach
                .addr("estop", config)
                .unwrap_or_else(|_| cli::connect::DEFAULT_ADDR.to_string());
            if fleet {
                return ExitCode::from(cli::estop::fleet_estop(
                    &addr,
                    reach.token.as_deref(),
                    environment.as_deref(),
                    reason.as_deref(),
                    clear,
                    json,
                ));
            }
            cli::estop::estop(
                &addr,
                reach.socket(config).as_deref(),
                reach.token.as_deref(),
                reason.as_deref(),
                clear,
                json,
            )
        }),
        Command::Gpio {
            reach,
            json,
            command,
        } => match reach.addr("gpio", config) {
            Ok(addr) => {
                let set = match command {
                    GpioCommand::List => None,
                    GpioCommand::Set { pin, level } => Some((pin, level)),
                };
                ExitCode::from(cli::gpio::gpio(
                    &addr,
                    reach.socket(config).as_deref(),
                    reach.token.as_deref(),
                    set,
                    json,
                ))
            }
            Err(code) => code,
        },
        Command::Approvals {
            daemon,
            json,
            command,
        } => match daemon.connect("approvals", config) {
            Ok((addr, token)) => {
                let answer = match &command {
                    None | Some(ApprovalsCommand::List) => None,
                    Some(ApprovalsCommand::Approve { id }) => Some((id.as_str(), true)),
                    Some(ApprovalsCommand::Deny { id }) => Some((id.as_str(), false)),
                };
                ExitCode::from(cli::approvals::approvals(
                    &addr,
                    token.as_deref(),
                    answer,
                    json,
                ))
            }
            Err(code) => code,
        },
        Command::Record { command } => record(config, command),
        Command::Model {
            command: ModelCommand::Check { name, json },
        } => match load_config(config) {
            Ok(loaded) => ExitCode::from(cli::model::check(&loaded.model, &name, json)),
            Err(code) => code,
        },
        Command::Task {
            daemon,
            json,
            command,
        } => match daemon.connect("task", config) {
            Ok((addr, token)) => {
                ExitCode::from(cli::task::exec(&addr, token.as_deref(), command, json))
            }
            Err(code) => code,
        },
    }
}

fn load_config(path: Option<&Path>) -> Result<Config, ExitCode> {
    Config::discover(path).map_err(|e| {
        for e in e.each() {
            eprintln!("rozd: invalid configuration: {e}");
        }
        ExitCode::from(EXIT_CONFIG)
    })
}

fn record(path: Option<&Path>, command: RecordCommand) -> ExitCode {
    match command {
        RecordCommand::Info { file, json } => ExitCode::from(cli::record::info(&file, json)),
        RecordCommand::List { dir, json } => {
            let dir = match dir {
                Some(dir) => dir,
                None => {
                    let config = match load_config(path) {
                        Ok(c) => c,
                        Err(code) => return code,
                    };
                    match &config.record {
                        Some(record) => record.resolved_directory(&config.store.resolved_path()),
                        None => {
                            eprintln!(
                                "rozd: the configuration ({}) has no [record] section; give --dir",
                                config.source
                            );
                            return ExitCode::from(EXIT_CONFIG);
                        }
                    }
                }
            };
            ExitCode::from(cli::record::list(&dir, json))
        }
    }
}

fn check(path: Option<&Path>) -> ExitCode {
    match load_config(path) {
        Ok(config) => {
            print!("{}", config.summary());
            let found = preflight::check(&config, &preflight::HostFacts::probe(&config));
            for warning in config.warnings().iter().chain(&found.warnings) {
                println!("warning: {warning}");
            }
            println!("{}", preflight::NOT_CHECKED);
            if found.errors.is_empty() {
                println!("configuration OK");
                return ExitCode::SUCCESS;
            }
            refuse(&config, &found.errors)
        }
        Err(code) => code,
    }
}

/// Prints what `rozd run` would refuse on this machine (one line each,
/// naming the file) and gives the configuration-error exit status.
fn refuse(config: &rozd::config::Config, errors: &[String]) -> ExitCode {
    let file = &config.source;
    for error in errors {
        eprintln!("rozd: invalid configuration for this machine: {file}: {error}");
    }
    ExitCode::from(EXIT_CONFIG)
}

fn run(path: Option<&Path>) -> ExitCode {
    let config = match load_config(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let found = preflight::check(&config, &preflight::HostFacts::probe(&config));
    if !found.errors.is_empty() {
        return refuse(&config, &found.errors);
    }
    rozd::logging::init(&config.log);
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
        // Once, on stderr (the log goes there too, or under systemd to the
        // journal, which also gets stderr), each cause once.
        Err(e) => {
            eprintln!("rozd: {}", cli::distinct_error_chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}
