//! Start order, serving, shutdown order, and systemd notification.
//!
//! Start: validated config -> recordings (unfinished files recovered) ->
//! the observers of every core, composed once (`observers.rs`) -> store ->
//! bind the listener and the control socket -> hardware -> build the
//! router -> `READY=1`. Stop (SIGTERM/SIGINT): `STOPPING=1` ->
//! health NOT_SERVING -> stop accepting -> sessions end their streams ->
//! connections drain within `server.shutdown_grace_secs` -> actuators safe
//! -> fleet offline -> the recording finished -> exit 0.
//!
//! Two accept loops, each its own task: TCP (gRPC and REST, capped at
//! `server.max_connections`) and the local control socket (the stop and its
//! status, not subject to the TCP cap). Each keeps its [`Seats`], a lobby
//! and a [`ConnectionTable`]: a full table sheds a connection for each
//! newcomer, idle connections are closed, and when the process runs out of
//! file descriptors the TCP lobby sheds the bare connections past their
//! grace, else the TCP table sheds (and stays smaller), never a stop while
//! its request runs, while a reserved descriptor lets the waiting
//! connection in: accept never spins and the stop stays reachable.

use parking_lot::Mutex;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use sd_notify::NotifyState;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::HostContext;
use crate::api;
use crate::api::connections::{Arrival, ConnectionTable, Lobby, SHED_HEADROOM, Seat};
use crate::api::tracked::{self, Closer, SharedTable};
use crate::config::Config;
use crate::tls::{PeerIdentity, ServerTls};

mod listen;
mod observers;
pub mod preflight;
mod rewind;
use listen::*;

/// Connections the control socket holds at once (its own table: the TCP cap
/// does not apply to it).
pub const CONTROL_SOCKET_MAX_CONNECTIONS: usize = 64;
/// Bound on a graceful close of an idle connection (a client that does not
/// close after HTTP/2's GOAWAY is then dropped).
const IDLE_CLOSE_BOUND: Duration = Duration::from_secs(5);
/// Descriptors kept free for everything but TCP connections (the store,
/// drivers, the control socket, outbound calls) when warning that
/// `server.max_connections` does not fit the open-file limit.
const FD_HEADROOM: u64 = 64;

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Api(#[from] api::ApiError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("hardware: {0}")]
    Ooda(#[from] crate::ooda::OodaError),
    #[error(transparent)]
    StopInput(#[from] crate::safety::inputs::InputError),
    #[error(transparent)]
    Fleet(#[from] crate::fleet::FleetError),
    #[error(transparent)]
    Record(#[from] crate::record::RecordError),
    #[error(transparent)]
    Camera(#[from] crate::camera::CameraError),
    #[error("server.tls: {0}")]
    Tls(#[from] crate::tls::TlsError),
    #[error("cannot install signal handler: {0}")]
    Signal(#[source] std::io::Error),
    #[error(
        "control socket {}: {message} (set server.control_socket to another path, or to \"\" to disable it)",
        path.display()
    )]
    ControlSocket { path: PathBuf, message: String },
}

/// A daemon whose listener is bound but which does not serve yet.
pub struct Daemon {
    listener: TcpListener,
    control: Option<ControlSocket>,
    ctx: Arc<HostContext>,
    router: axum::Router,
    health: tonic_health::server::HealthReporter,
    tls: Option<Arc<ServerTls>>,
    /// `[foxglove] listen`: its own port, serving `/foxglove` alone.
    foxglove: Option<(TcpListener, axum::Router)>,
}

impl Daemon {
    /// Binds the configured address. Nothing is bound before this point, and
    /// the config is already fully validated.
    pub async fn bind(config: Config) -> Result<Daemon, DaemonError> {
        Self::bind_with_hooks(config, Arc::new(crate::session::LogHooks)).await
    }

    /// [`Daemon::bind`] with the given session hooks (the safety layer's attach point).
    pub async fn bind_with_hooks(
        config: Config,
        hooks: Arc<dyn crate::session::SessionHooks>,
    ) -> Result<Daemon, DaemonError> {
        // Recordings: what a crash left unfinished is recovered first.
        let recorder = start_recorder(&config).await?;
        // Who hears of what the store, the stop and the loop do, composed
        // once: every core below is built with its observers.
        // The live view (Foxglove) hears the same events as the recording.
        let live = crate::live::Hub::new(config.foxglove.clone());
        let (observers, audit_writer) = observers::compose(&recorder, &live);
        let store_path = config.store.resolved_path();
        let store_observers = observers.store;
        let store = tokio::task::spawn_blocking(move || {
            crate::store::Store::open(&store_path, store_observers)
        })
        .await
        .map_err(|e| crate::store::StoreError::Task(e.to_string()))??;
        audit_writer.start(&store);
        store.set_hard_cap_mb(config.store.hard_cap_mb).await?;
        // Before anything can start a task: no task resumes by itself.
        crate::team::recover(&store).await?;
        // The retention policy, now and then hourly (see `keep_store_pruned`).
        let retention = crate::store::Retention {
            retain_days: config.store.retain_days,
            max_bytes: u64::from(config.store.max_size_mb) * 1024 * 1024,
        };
        prune_store(&store, retention).await;
        // The certificate is read before the port is ours: a bad one is a
        // start-up error, not a listener that fails every handshake.
        let tls = match &config.server.tls {
            Some(settings) => Some(Arc::new(ServerTls::load(settings)?)),
            None => None,
        };
        let addr = config.server.listen;
        let listener = bind_tcp(addr).map_err(|source| DaemonError::Bind { addr, source })?;
        let local = listener
            .local_addr()
            .map_err(|source| DaemonError::Bind { addr, source })?;
        let control = match config.server.control_socket.path(&config.store) {
            Some(path) => Some(ControlSocket::bind(path)?),
            None => None,
        };
        // Hardware comes up only after the config is valid and the port is
        // ours; every actuator is driven to its safe value first. The
        // protective stop comes back latched if it was latched when rozd
        // last ran (a crash or a kill does not clear it).
        let stop_file =
            crate::safety::persist::StopFile::beside_store(&config.store.resolved_path());
        let stop_observers = observers.stop;
        let protective_stop = tokio::task::spawn_blocking(move || {
            crate::safety::ProtectiveStop::restore(stop_file, stop_observers)
        })
        .await
        .map_err(|e| crate::store::StoreError::Task(e.to_string()))?;
        // The audit, the recording and the metrics hear every value and
        // actuator change from the first one on (drivers and the start-up
        // safe drive included).
        let ooda = crate::ooda::Ooda::start(
            &config.hardware,
            config.reflex_rules.clone(),
            &config.ooda.loop_config(),
            &config.host.id,
            protective_stop,
            observers.ooda,
        )
        .await?;
        // The GPIO and MQTT protective-stop inputs of `[safety]`.
        if let Err(e) = crate::safety::inputs::start(&config.safety, &ooda) {
            ooda.stop().await;
            return Err(e.into());
        }
        // Cameras capture on their own threads and tasks until the loop
        // stops; the recording hears their frames.
        let cameras = match crate::camera::Cameras::start(
            &config.cameras,
            ooda.sim_handle(),
            observers.cameras,
            &ooda.shutdown_token(),
        ) {
            Ok(cameras) => Arc::new(cameras),
            Err(e) => {
                ooda.stop().await;
                return Err(e.into());
            }
        };
        let ctx = HostContext::new(
            Arc::new(config),
            local,
            store,
            hooks,
            ooda,
            recorder,
            cameras,
        );
        ctx.recorder
            .sample_observations(ctx.ooda.clone(), ctx.shutdown.clone());
        tokio::spawn(keep_store_pruned(ctx.clone(), retention));
        if let Some(tls) = &tls {
            // A fresh context: not set before.
            let _ = ctx.tls.set(tls.clone());
        }
        if let Err(e) = crate::fleet::start(&ctx.fleet, &ctx.ooda, &ctx.shutdown) {
            ctx.ooda.stop().await;
            return Err(e.into());
        }
        let foxglove = match ctx
            .config
            .foxglove
            .listen
            .filter(|_| ctx.config.foxglove.enabled)
        {
            Some(addr) => {
                let listener =
                    bind_tcp(addr).map_err(|source| DaemonError::Bind { addr, source })?;
                Some((listener, api::foxglove_router(ctx.clone(), live.clone())))
            }
            None => None,
        };
        let (router, health) = api::router(ctx.clone(), live).await?;
        Ok(Daemon {
            listener,
            control,
            ctx,
            router,
            health,
            tls,
            foxglove,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.ctx.listen_addr
    }

    /// The local control socket's path (`None`: disabled).
    pub fn control_socket(&self) -> Option<&Path> {
        self.control.as_ref().map(|c| c.path.as_path())
    }

    /// The shared context, for the testing facade (`Daemon::probe`, in
    /// `testing.rs`, which depends on the daemon and not the reverse).
    pub(crate) fn context(&self) -> &Arc<HostContext> {
        &self.ctx
    }

    /// Serves until `shutdown` resolves, then drains gracefully.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) {
        let Daemon {
            listener,
            control,
            ctx,
            router,
            health,
            tls,
            foxglove,
        } = self;
        if let Some(tls) = &tls {
            tokio::spawn(tls.clone().watch(ctx.shutdown.clone()));
        }
        let server = &ctx.config.server;
        let builder = Arc::new(connection_builder(&ctx.config));
        let max_connections = usize::try_from(server.max_connections).unwrap_or(usize::MAX);
        warn_if_fd_limit_is_low(server.max_connections);
        let tcp_seats = Seats::new(max_connections);
        // Every connection task holds a sender; when all are gone, `alive`
        // yields `None`: every connection has ended.
        let (alive_tx, mut alive) = tokio::sync::mpsc::channel::<()>(1);
        let drain = CancellationToken::new();
        let shared = Shared {
            builder,
            pressure: tcp_seats.clone(),
            reserve: Arc::new(FdReserve::new()),
            closed: Arc::new(Notify::new()),
            idle_timeout: server.idle_timeout,
            first_bytes_within: server.header_read_timeout,
            drain: drain.clone(),
            alive: alive_tx,
        };
        let stop_accepting = CancellationToken::new();
        let control_path = control.as_ref().map(|c| c.path.clone());
        let control_loop = control.map(|control| {
            tokio::spawn(accept_loop(
                control.listener,
                api::control_router(ctx.clone()),
                Seats::new(CONTROL_SOCKET_MAX_CONNECTIONS),
                shared.clone(),
                None,
                stop_accepting.clone(),
            ))
        });
        let foxglove_loop = foxglove.map(|(listener, router)| {
            // Its own seats: a flood there never crowds the API's port.
            let seats = Seats::new(ctx.config.foxglove.max_clients.saturating_mul(4).max(16));
            tokio::spawn(accept_loop(
                listener,
                router,
                seats,
                shared.clone(),
                tls.clone(),
                stop_accepting.clone(),
            ))
        });
        let tcp_loop = accept_loop(
            listener,
            router,
            tcp_seats,
            shared,
            tls,
            stop_accepting.clone(),
        );
        tokio::pin!(shutdown, tcp_loop);
        tokio::select! {
            () = &mut tcp_loop => {}
            () = &mut shutdown => {
                stop_accepting.cancel();
                tcp_loop.await;
            }
        }
        if let Some(task) = foxglove_loop {
            let _ = task.await;
        }
        if let Some(task) = control_loop {
            // The loop only returns; a panic inside it is not ours to re-raise here.
            let _ = task.await;
        }
        if let Some(path) = control_path {
            remove_socket_file(&path);
        }
        tracing::info!("shutting down: no longer accepting connections");
        for service in [
            "",
            api::AGENT_SERVICE_NAME,
            api::SAFETY_SERVICE_NAME,
            api::TASK_SERVICE_NAME,
            api::HOST_SERVICE_NAME,
        ] {
            health
                .set_service_status(service, tonic_health::ServingStatus::NotServing)
                .await;
        }
        ctx.shutdown.cancel();
        let grace = ctx.config.server.shutdown_grace;
        let drained = async {
            // Every connection finishes what it is serving, then closes.
            drain.cancel();
            let _ = alive.recv().await;
            // Sessions record their end (and release their actuators) after
            // their streams close; wait for that too.
            ctx.sessions.wait_idle().await;
            // Tasks stop their workers on shutdown and record their end.
            ctx.team.tasks.wait_idle().await;
        };
        if tokio::time::timeout(grace, drained).await.is_err() {
            tracing::warn!(
                ?grace,
                "connections or sessions still open after the grace period; closing them"
            );
        }
        // Last: every actuator to its safe value, sensor tasks stopped.
        ctx.ooda.stop().await;
        // The fleet said `offline` when the shutdown began; let it finish
        // disconnecting (bounded inside).
        ctx.fleet.join().await;
        // The recording ends after the safe drives above (it holds them):
        // its file is finished with a summary and an index (bounded).
        ctx.recorder.finish().await;
        tracing::info!("shutdown complete");
    }
}

/// Warns when `server.max_connections` (plus what else rozd keeps open)
/// does not fit the soft open-file limit: connections beyond it are shed
/// only once accept has failed for want of descriptors.
fn warn_if_fd_limit_is_low(max_connections: u32) {
    let Some(limit) = open_file_limit() else {
        return;
    };
    let wanted = u64::from(max_connections) + FD_HEADROOM;
    if wanted > limit {
        tracing::warn!(
            max_connections,
            open_file_limit = limit,
            "server.max_connections plus {FD_HEADROOM} other descriptors exceeds the open-file \
             limit; raise LimitNOFILE (or lower server.max_connections)"
        );
    }
}

/// The soft `RLIMIT_NOFILE` of this process, from `/proc/self/limits`.
fn open_file_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// How often the retention policy runs while the daemon serves.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// Applies the store's retention policy once; failures are logged (a store
/// that cannot be pruned still serves).
async fn prune_store(store: &crate::store::Store, retention: crate::store::Retention) {
    if retention.retain_days == 0 && retention.max_bytes == 0 {
        return;
    }
    match store
        .prune(retention, crate::team::state::TaskStatus::TERMINAL)
        .await
    {
        Ok(pruned) => {
            if pruned.over_cap {
                tracing::warn!(
                    bytes = pruned.bytes_after,
                    max_bytes = retention.max_bytes,
                    "the store is over store.max_size_mb with only audit rows younger than \
                     store.retain_days left; they are kept"
                );
            }
            if pruned.sessions + pruned.tasks + pruned.audit > 0 {
                tracing::info!(
                    sessions = pruned.sessions,
                    tasks = pruned.tasks,
                    audit = pruned.audit,
                    bytes_before = pruned.bytes_before,
                    bytes_after = pruned.bytes_after,
                    "store pruned by its retention policy and vacuumed"
                );
            }
        }
        Err(e) => tracing::error!(error = %e, "cannot apply the store's retention policy"),
    }
}

/// Prunes the store every [`PRUNE_EVERY`] until shutdown.
async fn keep_store_pruned(ctx: Arc<HostContext>, retention: crate::store::Retention) {
    let mut every =
        tokio::time::interval_at(tokio::time::Instant::now() + PRUNE_EVERY, PRUNE_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = ctx.shutdown.cancelled() => return,
            _ = every.tick() => prune_store(&ctx.store, retention).await,
        }
    }
}

/// The recorder of `[record]` (recovering unfinished files first, off the
/// runtime's threads), or a disabled one.
async fn start_recorder(config: &Config) -> Result<Arc<crate::record::Recorder>, DaemonError> {
    let Some(record) = config.record.clone() else {
        return Ok(Arc::new(crate::record::Recorder::disabled()));
    };
    let store_path = config.store.resolved_path();
    let host_id = config.host.id.clone();
    let recorder = tokio::task::spawn_blocking(move || {
        crate::record::Recorder::start(&record, &store_path, &host_id)
    })
    .await
    .map_err(|e| crate::store::StoreError::Task(e.to_string()))??;
    Ok(Arc::new(recorder))
}

/// Runs the daemon as a service: binds, tells systemd it is ready, pets the
/// watchdog, and shuts down on SIGTERM or SIGINT.
pub async fn run(config: Config) -> Result<(), DaemonError> {
    let daemon = Daemon::bind(config).await?;
    let addr = daemon.local_addr();
    let ctx = daemon.ctx.clone();
    tracing::info!(
        %addr,
        host_id = %ctx.config.host.id,
        config = %ctx.config.source,
        "rozd {} serving gRPC and REST", crate::VERSION
    );
    let briefing = ctx.briefings.current();
    match &briefing.manual {
        Some(manual) => {
            tracing::info!(manual = %manual.path.display(), briefing_version = %briefing.version, embodiment_tokens = briefing.embodiment.tokens, "sessions are told the embodiment and the manual")
        }
        None => {
            tracing::warn!(briefing_version = %briefing.version, "no operator's manual ({} is not there; see [agent] manual_file): sessions are told only the embodiment", crate::config::types::DEFAULT_MANUAL_PATH)
        }
    }
    // The handlers go in before READY=1: a SIGTERM that follows READY at
    // once (a stop during start-up) must shut down gracefully, not kill us.
    let shutdown = shutdown_signal()?;
    let status = format!("STATUS=serving roz.v1 on {addr}");
    notify(&[NotifyState::Ready, NotifyState::Custom(&status)]);
    use tokio::signal::unix::{SignalKind, signal};
    if let Some(period) = sd_notify::watchdog_enabled() {
        tokio::spawn(pet_watchdog(period / 2, ctx.clone()));
    }
    tokio::spawn(reload_on_sighup(
        signal(SignalKind::hangup()).map_err(DaemonError::Signal)?,
        ctx.clone(),
        status,
    ));
    daemon
        .serve(async move {
            let signal = shutdown.await;
            tracing::info!(signal, "received signal, stopping");
            notify(&[NotifyState::Stopping]);
        })
        .await;
    Ok(())
}

/// On every SIGHUP (`systemctl reload rozd`): tells systemd `RELOADING=1`,
/// reloads the listener's certificate (a failure keeps the old one and is
/// logged and shown in `/v1/status`), `store.hard_cap_mb` from the config
/// file and the operator's manual, then `READY=1`. Nothing else is reloaded.
async fn reload_on_sighup(
    mut hangup: tokio::signal::unix::Signal,
    ctx: Arc<HostContext>,
    status: String,
) {
    loop {
        tokio::select! {
            received = hangup.recv() => if received.is_none() { return },
            () = ctx.shutdown.cancelled() => return,
        }
        let mut reloading = vec![NotifyState::Reloading];
        reloading.extend(NotifyState::monotonic_usec_now().ok());
        notify(&reloading);
        match ctx.tls.get() {
            Some(tls) => {
                let tls = tls.clone();
                // The outcome is logged and kept in the status by `reload`.
                let _ = tokio::task::spawn_blocking(move || tls.reload()).await;
            }
            None => tracing::info!("SIGHUP: no [server.tls] to reload"),
        }
        reload_store_cap(&ctx).await;
        reload_manual(&ctx).await;
        notify(&[NotifyState::Ready, NotifyState::Custom(&status)]);
    }
}

/// Reads the operator's manual again (from where the configuration said at
/// start): sessions started from now on are told the new text, open ones
/// keep theirs. A manual that cannot be read keeps the old one, logged.
/// What SIGHUP does for the manual (and `Probe::reload_manual` for a
/// daemon run in-process, which installs no signal handlers).
pub(crate) async fn reload_manual(ctx: &Arc<HostContext>) {
    let config = ctx.config.clone();
    match tokio::task::spawn_blocking(move || config.read_manual()).await {
        Ok(Ok(manual)) => {
            let path = manual
                .as_ref()
                .map(|m| m.path.display().to_string())
                .unwrap_or_default();
            let version = ctx.briefings.replace_manual(manual);
            tracing::info!(manual = %path, briefing_version = %version, "SIGHUP: manual re-read; new sessions are told this version");
        }
        Ok(Err(e)) => {
            tracing::error!(error = %format!("{}: {}", e.key, e.message), "SIGHUP: the manual cannot be read; new sessions keep the previous one");
        }
        Err(e) => tracing::error!(error = %e, "SIGHUP: cannot read the manual"),
    }
}

/// Reads the config file again and applies its `store.hard_cap_mb` (raising
/// it is how an operator gives a full store room without a restart); a file
/// that does not load changes nothing and is logged.
async fn reload_store_cap(ctx: &HostContext) {
    let crate::config::ConfigSource::File(path) = ctx.config.source.clone() else {
        return;
    };
    let loaded = tokio::task::spawn_blocking(move || crate::config::Config::load_file(&path)).await;
    match loaded {
        Ok(Ok(config)) => {
            if let Err(e) = ctx.store.set_hard_cap_mb(config.store.hard_cap_mb).await {
                tracing::error!(error = %e, "SIGHUP: cannot apply store.hard_cap_mb");
            }
        }
        Ok(Err(e)) => {
            tracing::error!(error = %e, "SIGHUP: the config file does not load; store.hard_cap_mb unchanged");
        }
        Err(e) => tracing::error!(error = %e, "SIGHUP: cannot read the config file"),
    }
}

/// Sends `WATCHDOG=1` while the OODA loop keeps ticking: a stalled loop (or
/// a wedged runtime) stops the pets and systemd restarts the service.
async fn pet_watchdog(every: Duration, ctx: Arc<HostContext>) {
    let mut ticker = tokio::time::interval(every.max(Duration::from_millis(10)));
    let mut last_ticks = None;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = ctx.shutdown.cancelled() => return,
        }
        let ticks = ctx.ooda.stats().ticks;
        if last_ticks == Some(ticks) {
            tracing::error!(
                "the OODA loop has not ticked since the last watchdog period; withholding WATCHDOG=1"
            );
        } else {
            notify(&[NotifyState::Watchdog]);
        }
        last_ticks = Some(ticks);
    }
}

fn notify(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "sd_notify failed");
    }
}

/// Resolves with the signal's name on the first SIGTERM or SIGINT.
fn shutdown_signal() -> Result<impl Future<Output = &'static str>, DaemonError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(DaemonError::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(DaemonError::Signal)?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}
