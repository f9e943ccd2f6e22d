//! Start order, serving, shutdown order, and systemd notification.
//!
//! Start: validated config -> bind the listener -> build the router ->
//! `READY=1`. Stop (SIGTERM/SIGINT): `STOPPING=1` -> health NOT_SERVING ->
//! stop accepting -> sessions end their streams -> connections drain within
//! `server.shutdown_grace_secs` -> exit 0.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use sd_notify::NotifyState;
use tokio::net::TcpListener;

use crate::HostContext;
use crate::api;
use crate::config::Config;

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
    #[error("cannot install signal handler: {0}")]
    Signal(#[source] std::io::Error),
}

/// A daemon whose listener is bound but which does not serve yet.
pub struct Daemon {
    listener: TcpListener,
    ctx: Arc<HostContext>,
    router: axum::Router,
    health: tonic_health::server::HealthReporter,
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
        let store_path = config.store.resolved_path();
        let store = tokio::task::spawn_blocking(move || crate::store::Store::open(&store_path))
            .await
            .map_err(|e| crate::store::StoreError::Task(e.to_string()))??;
        // Before anything can start a task: no task resumes by itself.
        crate::team::recover(&store).await?;
        let addr = config.server.listen;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| DaemonError::Bind { addr, source })?;
        let local = listener
            .local_addr()
            .map_err(|source| DaemonError::Bind { addr, source })?;
        // Hardware comes up only after the config is valid and the port is
        // ours; every actuator is driven to its safe value first. The
        // protective stop comes back latched if it was latched when rozd
        // last ran (a crash or a kill does not clear it).
        let stop_file =
            crate::safety::persist::StopFile::beside_store(&config.store.resolved_path());
        let protective_stop =
            tokio::task::spawn_blocking(move || crate::safety::ProtectiveStop::restore(stop_file))
                .await
                .map_err(|e| crate::store::StoreError::Task(e.to_string()))?;
        let ooda = crate::ooda::Ooda::start(
            &config.hardware,
            config.reflex_rules.clone(),
            config.ooda.tick_hz,
            &config.host.id,
            protective_stop,
        )
        .await?;
        // Every trigger and clear of the protective stop goes to the audit
        // (set up before the stop inputs, which may latch it at once).
        audit_protective_stop(store.clone(), ooda.protective_stop());
        // The GPIO and MQTT protective-stop inputs of `[safety]`.
        if let Err(e) = crate::safety::inputs::start(&config.safety, &ooda) {
            ooda.stop().await;
            return Err(e.into());
        }
        // Every actuator change goes to the audit in the store.
        let (audit_tx, mut audit_rx) = tokio::sync::mpsc::unbounded_channel();
        ooda.actuators().set_audit(audit_tx);
        let audit_store = store.clone();
        tokio::spawn(async move {
            while let Some(event) = audit_rx.recv().await {
                let now = crate::store::now_ms();
                let record = crate::store::AuditRecord {
                    at_ms: now,
                    kind: "actuator".into(),
                    session_id: event.session_id,
                    actuator: Some(event.actuator),
                    result: Some(event.value.to_string()),
                    error: event.error,
                    origin: Some(event.origin),
                    ended_at_ms: Some(now),
                    ..Default::default()
                };
                if let Err(e) = audit_store.audit(record).await {
                    tracing::error!(error = %e, "cannot write the audit record of an actuator change");
                }
            }
        });
        let ctx = HostContext::new(Arc::new(config), local, store, hooks, ooda);
        if let Err(e) = crate::fleet::start(&ctx) {
            ctx.ooda.stop().await;
            return Err(e.into());
        }
        let (router, health) = api::router(ctx.clone()).await?;
        Ok(Daemon {
            listener,
            ctx,
            router,
            health,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.ctx.listen_addr
    }

    pub fn context(&self) -> Arc<HostContext> {
        self.ctx.clone()
    }

    /// Serves until `shutdown` resolves, then drains gracefully.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) {
        let Daemon {
            listener,
            ctx,
            router,
            health,
        } = self;
        let mut builder = auto::Builder::new(TokioExecutor::new());
        // HTTP/2 pings detect a peer that vanished without closing its
        // connection (a client on a dropped Wi-Fi link), so its session ends
        // and its actuators go safe promptly.
        let keepalive = ctx.config.server.http2_keepalive_secs;
        builder
            .http2()
            .timer(TokioTimer::new())
            // Half the bound pinging, half waiting for the answer: a silent
            // peer is dropped within `http2_keepalive_secs`.
            .keep_alive_interval(
                (keepalive > 0).then(|| Duration::from_millis(keepalive.saturating_mul(500))),
            )
            .keep_alive_timeout(Duration::from_millis(
                keepalive.saturating_mul(500).max(500),
            ));
        let builder = Arc::new(builder);
        let graceful = GracefulShutdown::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let (stream, peer) = match accepted {
                        Ok(pair) => pair,
                        Err(e) => {
                            // EMFILE and friends: back off briefly rather than spin.
                            tracing::warn!(error = %e, "accept failed");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    };
                    // Tool calls are small messages on a latency-critical path.
                    let _ = stream.set_nodelay(true);
                    let service = TowerToHyperService::new(router.clone());
                    let builder = builder.clone();
                    let watcher = graceful.watcher();
                    tokio::spawn(async move {
                        let connection = builder.serve_connection(TokioIo::new(stream), service);
                        if let Err(e) = watcher.watch(connection).await {
                            tracing::debug!(%peer, error = %e, "connection ended with an error");
                        }
                    });
                }
                () = &mut shutdown => break,
            }
        }
        drop(listener);
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
        let grace = Duration::from_secs(ctx.config.server.shutdown_grace_secs);
        let drained = async {
            graceful.shutdown().await;
            // Sessions record their end (and release their actuators) after
            // their streams close; wait for that too.
            ctx.sessions.wait_idle().await;
            // Tasks stop their workers on shutdown and record their end.
            ctx.tasks.wait_idle().await;
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
        tracing::info!("shutdown complete");
    }
}

/// Writes every trigger, clear and refused clear of the protective stop to
/// the audit, as rows of kind `protective_stop` (one per added cause),
/// `protective_stop_cleared` (one per removed cause),
/// `protective_stop_clear_refused` and `protective_stop_restored` (latched
/// again at start-up); `origin`: the source, or who cleared.
fn audit_protective_stop(store: crate::store::Store, stop: &crate::safety::ProtectiveStop) {
    let (stop_tx, mut stop_rx) = tokio::sync::mpsc::unbounded_channel();
    stop.set_audit(stop_tx);
    tokio::spawn(async move {
        use crate::safety::StopEvent;
        while let Some(event) = stop_rx.recv().await {
            let now = crate::store::now_ms();
            let (kind, origin, result, error) = match event {
                StopEvent::Triggered { source, reason, by } => {
                    let origin = match by {
                        Some(by) => format!("{source} ({by})"),
                        None => source,
                    };
                    ("protective_stop", origin, Some(reason), None)
                }
                StopEvent::Cleared { by, source } => (
                    "protective_stop_cleared",
                    by,
                    Some(format!("cleared cause {source}")),
                    None,
                ),
                StopEvent::Restored { causes } => (
                    "protective_stop_restored",
                    "start-up".to_string(),
                    Some(format!(
                        "latched at start-up as before the restart: {}",
                        crate::safety::StopState { causes }.describe()
                    )),
                    None,
                ),
                StopEvent::ClearRefused { by, input } => (
                    "protective_stop_clear_refused",
                    by,
                    None,
                    Some(format!("stop input {input} still asserts the stop")),
                ),
            };
            let record = crate::store::AuditRecord {
                at_ms: now,
                kind: kind.into(),
                result,
                error,
                origin: Some(origin),
                ended_at_ms: Some(now),
                ..Default::default()
            };
            if let Err(e) = store.audit(record).await {
                tracing::error!(error = %e, "cannot write the audit record of a protective stop change");
            }
        }
    });
}

/// Runs the daemon as a service: binds, tells systemd it is ready, pets the
/// watchdog, and shuts down on SIGTERM or SIGINT.
pub async fn run(config: Config) -> Result<(), DaemonError> {
    let daemon = Daemon::bind(config).await?;
    let addr = daemon.local_addr();
    let ctx = daemon.context();
    tracing::info!(
        %addr,
        host_id = %ctx.config.host.id,
        config = %ctx.config.source.as_ref().map_or_else(String::new, ToString::to_string),
        "rozd {} serving gRPC and REST", crate::VERSION
    );
    // The handlers go in before READY=1: a SIGTERM that follows READY at
    // once (a stop during start-up) must shut down gracefully, not kill us.
    let shutdown = shutdown_signal()?;
    let status = format!("STATUS=serving roz.v1 on {addr}");
    notify(&[NotifyState::Ready, NotifyState::Custom(&status)]);
    if let Some(period) = sd_notify::watchdog_enabled() {
        tokio::spawn(pet_watchdog(period / 2, ctx.clone()));
    }
    daemon
        .serve(async move {
            let signal = shutdown.await;
            tracing::info!(signal, "received signal, stopping");
            notify(&[NotifyState::Stopping]);
        })
        .await;
    Ok(())
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
