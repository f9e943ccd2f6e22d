//! rozd: the edge-host daemon of the roz agent runtime.
//!
//! Module map (dependency direction `api -> session -> model`; protocol types
//! stop at `api` and `cli`; `cli` uses nothing of the server):
//!
//! - [`config`]: TOML -> validated [`config::Config`]
//! - [`daemon`]: start order, shutdown order, sd_notify, signals
//! - [`logging`]: the daemon's logs, to journald or stderr
//! - [`metrics`]: Prometheus metrics: event counters and histograms, state sampled at scrape
//! - [`api`]: tonic services and axum REST on one listener, auth, reflection, health
//! - [`session`]: one agent session: state machine and turn loop; every call waiting for approval
//! - [`model`]: language models behind one streaming trait (offline `local` model)
//! - [`observe`]: observers of domain events, given to each core when it is built
//! - [`store`]: SQLite store of sessions, turns and feedback
//! - [`ooda`]: the observe–orient–decide–act loop: world, alarms, reflex rules, actuators
//! - [`hw`]: drivers (sim, system, GPIO, serial, MQTT) and hardware config
//! - [`safety`]: the protective-stop latch
//! - [`team`]: tasks, their workers and durable team events
//! - [`tools`]: the host tools generated from sensors and actuators
//! - [`mcp`]: the host tools over MCP (`/mcp`, `rozd mcp`)
//! - [`fleet`]: hosts by `host_id` over an MQTT broker: presence, registry, routing, fleet stop
//! - [`record`]: MCAP recordings (a bounded queue off the hot paths) and their replay
//! - [`camera`]: cameras: capture threads, latest frame and health, JPEG checks and fitting
//! - [`tls`]: rustls (ring) for the listener (reloadable), the CLI and relays
//! - [`proto`]: the generated roz.v1 types, servers and clients (shared by `api` and `cli`)
//! - [`testing`]: what tests, benches and examples may hold of an in-process daemon
//! - [`cli`]: the command-line clients of a running daemon (`rozd status`, `estop`,
//!   `hosts`, `task`, `chat`): connection, HTTP client, formatters
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod api;
pub mod camera;
pub mod cli;
pub mod clock;
pub mod config;
pub mod daemon;
pub mod fleet;
pub mod hw;
pub(crate) mod live;
pub mod logging;
pub(crate) mod mcp;
pub(crate) mod metrics;
pub mod model;
pub(crate) mod observe;
pub mod ooda;
pub mod proto;
pub mod record;
pub mod safety;
pub mod session;
pub mod store;
pub(crate) mod team;
pub mod testing;
pub mod tls;
pub mod tools;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::config::Config;

/// Version of this build, reported by `--version` and `/v1/status`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// What the parts of the running daemon that serve requests share: the
/// daemon builds it once and hands it to the API layer (the MCP server
/// included). The session engine gets only its [`session::SessionHost`],
/// the task engine its [`team::TeamHost`], a turn its
/// [`session::turn::TurnHost`].
/// Private to the crate: tests see a daemon through [`testing::Probe`].
#[derive(Debug)]
pub(crate) struct HostContext {
    pub config: Arc<Config>,
    pub started_at: Instant,
    pub listen_addr: SocketAddr,
    pub sessions: Arc<session::SessionRegistry>,
    /// The task engine: the tasks running on this host and what they use.
    pub team: Arc<team::TeamHost>,
    pub permissions: Arc<session::permissions::PermissionPolicy>,
    pub store: store::Store,
    pub hooks: Arc<dyn session::SessionHooks>,
    /// The OODA loop: world state, actuators, protective stop.
    pub ooda: Arc<ooda::Ooda>,
    /// Host tools generated from the sensors and actuators.
    pub host_tools: Arc<tools::HostTools>,
    /// The host tools' schemas, compiled for validation.
    /// Shared with every turn (they do not change while the daemon runs).
    pub host_registry: Arc<session::tools::ToolRegistry>,
    /// The fleet registry (just this host without `[fleet]`) and routing by host id.
    pub fleet: Arc<fleet::Fleet>,
    /// MCP sessions.
    pub mcp: Arc<mcp::Mcp>,
    /// Every call waiting for an approval (MCP, session, task): what
    /// `/v1/approvals` lists and answers.
    pub approvals: Arc<session::approvals::Approvals>,
    /// MCAP recordings (disabled without `[record]`).
    pub recorder: Arc<record::Recorder>,
    /// The cameras of `[[cameras]]`, capturing.
    pub cameras: Arc<camera::Cameras>,
    /// What every new session is told: the embodiment and the manual
    /// (SIGHUP swaps in a re-read manual).
    pub briefings: Arc<session::embodiment::Briefings>,
    /// Cancelled when the daemon begins its shutdown.
    pub shutdown: CancellationToken,
    /// The listener's TLS (set by the daemon when `[server.tls]` is
    /// configured; unset: plaintext).
    pub tls: std::sync::OnceLock<Arc<tls::ServerTls>>,
}

impl HostContext {
    pub(crate) fn new(
        config: Arc<Config>,
        listen_addr: SocketAddr,
        store: store::Store,
        hooks: Arc<dyn session::SessionHooks>,
        ooda: Arc<ooda::Ooda>,
        recorder: Arc<record::Recorder>,
        cameras: Arc<camera::Cameras>,
    ) -> Arc<Self> {
        let raw_ports = config
            .hardware
            .serial
            .iter()
            .filter(|p| p.allow_raw)
            .map(|p| p.name.clone())
            .collect();
        let host_tools = Arc::new(tools::HostTools::new(
            ooda.clone(),
            raw_ports,
            cameras.clone(),
        ));
        let host_registry = session::tools::ToolRegistry::from_specs(
            host_tools.definitions().to_vec(),
            "host tools",
        )
        // Generated from validated config; a failure here is a bug in rozd.
        .unwrap_or_else(|e| {
            tracing::error!(error = %e, "host tool schemas do not compile; offering none");
            session::tools::ToolRegistry::default()
        });
        let offer = fleet::Offer {
            sensors: config
                .hardware
                .sensors
                .iter()
                .map(|s| s.name.clone())
                .collect(),
            actuators: (config.hardware.actuators.iter())
                .map(|a| a.name.clone())
                .collect(),
            models: config
                .model
                .endpoints
                .iter()
                .map(|e| e.name.clone())
                .collect(),
            host_tools: host_tools
                .definitions()
                .iter()
                .map(|d| d.name.clone())
                .collect(),
        };
        let permissions = Arc::new(session::permissions::PermissionPolicy::new(
            config.permissions.clone(),
            &config.approvals,
        ));
        let embodiment = session::embodiment::Embodiment::render(
            session::embodiment::EmbodimentView::from_config(
                config.robot(),
                host_tools.definitions(),
                &permissions,
            ),
            config.agent.embodiment_max_tokens,
        );
        let briefings = Arc::new(session::embodiment::Briefings::new(
            session::embodiment::Briefing::new(Arc::new(embodiment), config.manual.clone()),
        ));
        let fleet = Arc::new(fleet::Fleet::new(
            &config.host,
            config.fleet.as_ref(),
            offer,
            listen_addr,
            ooda.protective_stop().clone(),
        ));
        let approvals: Arc<session::approvals::Approvals> = Arc::default();
        let host_registry = Arc::new(host_registry);
        let models = Arc::new(model::ModelRegistry::from_config(&config.model));
        let shutdown = CancellationToken::new();
        let agent = Arc::new(session::AgentHost {
            limits: config.session.clone(),
            this_host: config.host.clone(),
            default_max_output_tokens: config.model.max_output_tokens,
            models: models.clone(),
            permissions: permissions.clone(),
            store: store.clone(),
            ooda: ooda.clone(),
            briefings: briefings.clone(),
            shutdown: shutdown.clone(),
            turn: session::turn::TurnHost {
                approvals: approvals.clone(),
                tools: host_tools.clone(),
                registry: host_registry.clone(),
                store: store.clone(),
                ooda: ooda.clone(),
            },
        });
        let team = Arc::new(team::TeamHost {
            tasks: team::Tasks::default(),
            settings: config.tasks.clone(),
            agent,
        });
        Arc::new(HostContext {
            fleet,
            mcp: Arc::new(mcp::Mcp::new(ooda.clone(), &config.mcp)),
            approvals,
            host_tools,
            host_registry,
            permissions,
            briefings,
            config,
            started_at: Instant::now(),
            listen_addr,
            sessions: Arc::default(),
            team,
            store,
            hooks,
            ooda,
            recorder,
            cameras,
            shutdown,
            tls: std::sync::OnceLock::new(),
        })
    }

    /// What a turn's host tool calls reach: built once, with the
    /// [`session::AgentHost`] sessions and task workers share, and the same
    /// for every turn.
    pub(crate) fn turn_host(&self) -> session::turn::TurnHost {
        self.team.agent.turn.clone()
    }

    /// What the session engine uses, for one session stream.
    pub(crate) fn session_host(&self) -> session::SessionHost {
        session::SessionHost {
            agent: self.team.agent.clone(),
            sessions: self.sessions.clone(),
            hooks: self.hooks.clone(),
            recorder: self.recorder.clone(),
        }
    }

    /// The host as `owner` (a session id or a task worker's id) sees it in
    /// `ai_mode`, for one turn engine; `label` is how the audit names the
    /// caller.
    pub(crate) fn host_access(
        &self,
        asker: session::approvals::Asker,
        owner: &str,
        label: String,
        ai_mode: config::types::AiMode,
        notes: Option<tokio::sync::mpsc::UnboundedSender<session::turn::TurnNote>>,
    ) -> session::turn::HostAccess {
        self.turn_host().access(asker, owner, label, ai_mode, notes)
    }
}
