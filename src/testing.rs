//! The testing facade: what the black-box tests, the benchmark harness and
//! the examples may hold of a daemon run in their own process, beyond its
//! network surface.
//!
//! A test drives rozd through its ports (gRPC, REST, MCP, the control
//! socket) like any client. Some things cannot be seen from there without
//! waiting on a wall clock: a simulated actuator's own value, the moment
//! every session has ended, the briefing a session is told. [`Probe`] gives
//! those by name (mostly views; a few handles, such as the loop, the
//! approvals and the shutdown, act as an operator would). It is the only
//! way in: the daemon's shared
//! context is private to the daemon and its API layer, so what a change
//! reaches is what its signatures say.

use std::sync::Arc;

use crate::HostContext;
use crate::camera::Cameras;
use crate::config::Config;
use crate::fleet::Fleet;
use crate::hw::sim::SimActuator;
use crate::ooda::Ooda;
use crate::record::Recorder;
use crate::session::SessionRegistry;
use crate::session::approvals::Approvals;
use crate::session::embodiment::Briefing;
use crate::store::Store;
use crate::team::Tasks;
use crate::tls::ServerTls;
use crate::tools::HostTools;

/// A view into one daemon of this process (see the module's documentation).
/// Cheap to clone.
#[derive(Debug, Clone)]
pub struct Probe {
    ctx: Arc<HostContext>,
}

impl crate::daemon::Daemon {
    /// What a test of this process may see of the daemon.
    pub fn probe(&self) -> Probe {
        Probe {
            ctx: self.context().clone(),
        }
    }
}

impl Probe {
    /// The configuration the daemon runs (validated, with its derived values).
    pub fn config(&self) -> &Config {
        &self.ctx.config
    }

    /// The control loop: world state, actuators, protective stop.
    pub fn ooda(&self) -> &Arc<Ooda> {
        &self.ctx.ooda
    }

    /// The simulated driver behind actuator `name`, when it is simulated:
    /// the value the "hardware" holds, whatever the loop believes.
    pub fn sim_actuator(&self, name: &str) -> Option<Arc<SimActuator>> {
        self.ctx.ooda.sim_actuator(name)
    }

    /// Open agent sessions (gRPC and tasks).
    pub fn sessions(&self) -> &SessionRegistry {
        &self.ctx.sessions
    }

    /// How many MCP sessions are open.
    pub fn mcp_session_count(&self) -> usize {
        self.ctx.mcp.sessions.count()
    }

    /// Tasks running on this host.
    pub fn tasks(&self) -> &Tasks {
        &self.ctx.team.tasks
    }

    /// Calls waiting for an operator's answer.
    pub fn approvals(&self) -> &Arc<Approvals> {
        &self.ctx.approvals
    }

    /// The SQLite store.
    pub fn store(&self) -> &Store {
        &self.ctx.store
    }

    /// The fleet registry and routing.
    pub fn fleet(&self) -> &Arc<Fleet> {
        &self.ctx.fleet
    }

    /// The MCAP recorder.
    pub fn recorder(&self) -> &Arc<Recorder> {
        &self.ctx.recorder
    }

    /// The cameras of `[[cameras]]`.
    pub fn cameras(&self) -> &Cameras {
        &self.ctx.cameras
    }

    /// The host tools offered to sessions, callable as a session would.
    pub fn host_tools(&self) -> &HostTools {
        &self.ctx.host_tools
    }

    /// What a session started now is told.
    pub fn briefing(&self) -> Arc<Briefing> {
        self.ctx.briefings.current()
    }

    /// The listener's TLS, when `[server.tls]` is configured.
    pub fn tls(&self) -> Option<&Arc<ServerTls>> {
        self.ctx.tls.get()
    }

    /// Begins the daemon's shutdown, as a signal would (an in-process
    /// daemon installs no signal handlers).
    pub fn begin_shutdown(&self) {
        self.ctx.shutdown.cancel();
    }

    /// Reads the manual again, as SIGHUP does.
    pub async fn reload_manual(&self) {
        crate::daemon::reload_manual(&self.ctx).await;
    }
}
