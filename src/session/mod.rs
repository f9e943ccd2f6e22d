//! One agent session per `StreamSession` stream.
//!
//! [`run`] is the session's I/O loop: a `select!` over client events, the
//! active turn's completion, the keepalive timer and daemon shutdown. The
//! session's data and rules live in [`state`], a turn's model/tool loop in
//! [`turn`].

pub(crate) mod approvals;
pub(crate) mod context;
pub(crate) mod embodiment;
pub(crate) mod host_call;
pub(crate) mod metrics;
pub(crate) mod permissions;
mod record;
mod registry;
mod running;
pub(crate) mod schema;
pub(crate) mod state;
pub(crate) mod tools;
pub(crate) mod turn;
pub(crate) mod types;

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use registry::{Listed, OpenSession, SessionRegistry, SessionSlot, StreamKind};
pub use types::*;

use crate::clock::now_ms;
use crate::store::{SessionRecord, TurnRecord};
use running::{RunningTurn, TurnFailed};
use state::{Session, TurnPlan};
use turn::{TurnInput, TurnLimits, TurnOutcome, TurnSetup};

/// A session's input: the client's events in order; its end is the
/// client's disconnect.
pub type SessionInput = std::pin::Pin<Box<dyn futures_util::Stream<Item = Inbound> + Send>>;

/// The answer to a client event that is not `StartSession` on a stream with
/// no session (yet): `invalid_argument` for one that is not valid, else
/// `no_session`.
pub fn before_start(event: &Inbound) -> SessionError {
    match event {
        Err(why) => SessionError::new(ErrorCode::InvalidArgument, why.clone()),
        Ok(_) => SessionError::new(
            ErrorCode::NoSession,
            "no session on this stream: send StartSession first",
        ),
    }
}

/// Where the safety layer attaches: called when a turn is interrupted
/// (cancel, disconnect, shutdown) and when a session ends, so actuators
/// commanded by that session can be returned to their safe state.
pub trait SessionHooks: Send + Sync + std::fmt::Debug {
    fn turn_interrupted(&self, session_id: &str, reason: &str);
    fn session_ended(&self, session_id: &str, reason: &str);
}

/// Hooks that only log; the default until the safety layer is attached.
#[derive(Debug, Default)]
pub struct LogHooks;

impl SessionHooks for LogHooks {
    fn turn_interrupted(&self, session_id: &str, reason: &str) {
        tracing::info!(session_id, reason, "turn interrupted");
    }
    fn session_ended(&self, session_id: &str, reason: &str) {
        tracing::info!(session_id, reason, "session ended");
    }
}

/// How long a cancelled turn gets to wind down before it is aborted.
const TURN_WIND_DOWN: Duration = Duration::from_secs(5);
/// Bound of the queue of client events forwarded to a running turn.
const TURN_INBOX: usize = 64;

struct ActiveTurn {
    plan_message_id: String,
    ai_mode: crate::config::types::AiMode,
    user_content: String,
    started_at_ms: i64,
    cancel: CancellationToken,
    running: RunningTurn,
}

/// Why the session loop stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    CancelSession,
    Disconnect,
    Shutdown,
}

impl End {
    fn as_str(self) -> &'static str {
        match self {
            End::CancelSession => "cancel_session",
            End::Disconnect => "disconnect",
            End::Shutdown => "shutdown",
        }
    }
}

/// What every agent's turns use of the host, a session's or a task
/// worker's, each named: built once by the daemon's context and shared by
/// [`SessionHost`] and the task engine's host.
#[derive(Debug)]
pub(crate) struct AgentHost {
    /// `[session]`: a session's limits, which bound a task worker's turns
    /// too.
    pub limits: crate::config::types::SessionConfig,
    /// `[host]`: who this host is (sessions and tasks are told, and
    /// recorded with it).
    pub this_host: crate::config::types::HostConfig,
    /// `model.max_output_tokens`, for a model without its own.
    pub default_max_output_tokens: u32,
    pub models: Arc<crate::model::ModelRegistry>,
    pub permissions: Arc<permissions::PermissionPolicy>,
    pub store: crate::store::Store,
    pub ooda: Arc<crate::ooda::Ooda>,
    pub briefings: Arc<embodiment::Briefings>,
    pub shutdown: CancellationToken,
    /// What each turn's host tool calls reach.
    pub turn: turn::TurnHost,
}

/// What the session engine uses of the host, each named: the daemon hands
/// one to every session stream. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct SessionHost {
    /// What a session's turns use, as a task worker's do.
    pub agent: Arc<AgentHost>,
    pub sessions: Arc<SessionRegistry>,
    pub hooks: Arc<dyn SessionHooks>,
    pub recorder: Arc<crate::record::Recorder>,
}

struct Runner<'a> {
    host: SessionHost,
    /// The credential that opened the stream (the audit names it).
    credential: Option<String>,
    /// The stream's entry among the open sessions.
    listed: &'a Listed,
    /// Held from `StartSession` to the session's end.
    slot: Option<SessionSlot>,
    out: mpsc::Sender<ServerEvent>,
    session: Option<Session>,
    turn: Option<ActiveTurn>,
    /// The session's id once started, for [`run`] to clean up after a panic.
    started: Arc<parking_lot::Mutex<Option<String>>>,
}

/// The client's response stream is gone.
struct Gone;

/// Runs one session until the client ends it, disconnects, or the daemon
/// shuts down. The session loop runs as its own task: should it panic, the
/// session's actuators still go to their safe values and its end is recorded.
///
/// `credential`: who opened the stream (a token's name or certificate
/// subject), for the audit of its physical calls.
pub(crate) async fn run(
    host: SessionHost,
    inbound: SessionInput,
    out: mpsc::Sender<ServerEvent>,
    credential: Option<String>,
) {
    use tracing::Instrument as _;
    let started: Arc<parking_lot::Mutex<Option<String>>> = Arc::default();
    let joined = tokio::spawn(
        run_loop(host.clone(), inbound, out, started.clone(), credential).in_current_span(),
    )
    .await;
    if let Err(e) = joined {
        let id = started.lock().clone();
        tracing::error!(error = %e, session_id = ?id, "session task failed");
        if let Some(id) = id {
            let origin = crate::ooda::act::Origin::Session(id.clone());
            let released = host
                .agent
                .ooda
                .actuators()
                .release(&origin, "session task failed")
                .await;
            tracing::warn!(session_id = %id, ?released, "deadman after a failed session task");
            host.hooks.session_ended(&id, "internal_error");
            metrics::session_ended("internal_error");
            if let Err(e) = host
                .agent
                .store
                .session_ended(id.clone(), "internal_error".into())
                .await
            {
                tracing::error!(error = %e, session_id = %id, "cannot record the end of the session");
            }
        }
    }
}

async fn run_loop(
    host: SessionHost,
    mut inbound: SessionInput,
    out: mpsc::Sender<ServerEvent>,
    started: Arc<parking_lot::Mutex<Option<String>>>,
    credential: Option<String>,
) {
    let registry = host.sessions.clone();
    let active = registry.enter(credential.clone());
    let period = host.agent.limits.keepalive;
    let mut keepalive = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    keepalive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let shutdown = host.agent.shutdown.clone();
    let mut runner = Runner {
        host,
        credential,
        listed: &active.listed,
        slot: None,
        out,
        session: None,
        turn: None,
        started,
    };
    let end = loop {
        let step = tokio::select! {
            biased;
            () = shutdown.cancelled() => break End::Shutdown,
            joined = turn_finished(&mut runner.turn) => runner.finish_turn(joined).await,
            event = inbound.next() => match event {
                None => break End::Disconnect,
                Some(event) => match runner.handle(event).await {
                    Ok(Some(end)) => break end,
                    Ok(None) => Ok(()),
                    Err(gone) => Err(gone),
                },
            },
            _ = keepalive.tick() => runner.keepalive().await,
        };
        if step.is_err() {
            break End::Disconnect;
        }
    };
    runner.close(end).await;
}

/// Runs the active turn until it finishes; never resolves if there is none.
async fn turn_finished(turn: &mut Option<ActiveTurn>) -> Result<TurnOutcome, TurnFailed> {
    match turn {
        Some(t) => t.running.finished().await,
        None => std::future::pending().await,
    }
}

impl Runner<'_> {
    async fn send(&self, event: ServerEvent) -> Result<(), Gone> {
        self.out.send(event).await.map_err(|_| Gone)
    }

    async fn error(&self, code: ErrorCode, message: impl Into<String>) -> Result<(), Gone> {
        self.send(ServerEvent::Error(SessionError::new(code, message)))
            .await
    }

    async fn handle(&mut self, event: Inbound) -> Result<Option<End>, Gone> {
        let event = match event {
            Ok(ClientEvent::Start(request)) => {
                self.start(request).await?;
                return Ok(None);
            }
            Ok(event) if self.session.is_some() => event,
            other => {
                self.send(ServerEvent::Error(before_start(&other))).await?;
                return Ok(None);
            }
        };
        match event {
            ClientEvent::Start(_) => {}
            ClientEvent::UserMessage(user) => self.user_message(user).await?,
            ClientEvent::ToolResult(result) => self.tool_result(result).await?,
            ClientEvent::PermissionDecision {
                tool_call_id,
                approved,
            } => match &self.turn {
                Some(turn) => {
                    // A session's approvals come over its own stream: the
                    // credential that opened it answers.
                    let input = TurnInput::Decision {
                        tool_call_id,
                        approved,
                        by: self.credential.clone(),
                    };
                    self.forward(turn, input).await?;
                }
                None => {
                    self.error(
                        ErrorCode::NoActiveTurn,
                        format!("PermissionDecision for {tool_call_id}: no turn is running"),
                    )
                    .await?;
                }
            },
            ClientEvent::CancelTurn { reason } => match &self.turn {
                Some(turn) => {
                    tracing::info!(reason, message_id = %turn.plan_message_id, "CancelTurn");
                    turn.cancel.cancel();
                }
                None => {
                    self.error(ErrorCode::NoActiveTurn, "CancelTurn: no turn is running")
                        .await?
                }
            },
            ClientEvent::CancelSession { reason } => {
                tracing::info!(reason, "CancelSession");
                return Ok(Some(End::CancelSession));
            }
            ClientEvent::Ping => self.send(ServerEvent::Pong).await?,
            ClientEvent::Feedback {
                session_id,
                message_id,
                rating,
            } => {
                self.feedback(session_id, message_id, rating).await?;
            }
            ClientEvent::RegisterTools {
                source,
                tools,
                system_context,
            } => {
                if let Some(e) = self.host_collision(&tools, "register_tools.tools") {
                    self.send(ServerEvent::Error(e)).await?;
                    return Ok(None);
                }
                let Some(session) = self.session.as_mut() else {
                    return Ok(None);
                };
                match session.register_tools(source.clone(), tools, system_context) {
                    Ok(summary) => tracing::info!(
                        source = source.as_deref().unwrap_or(""),
                        removed = summary.removed,
                        added = summary.added,
                        "tools registered"
                    ),
                    Err(e) => self.send(ServerEvent::Error(e)).await?,
                }
            }
        }
        Ok(None)
    }

    async fn start(&mut self, request: StartRequest) -> Result<(), Gone> {
        if let Some(session) = &self.session {
            let message = format!("this stream already has session {}", session.id);
            return self.error(ErrorCode::AlreadyStarted, message).await;
        }
        if let Some(e) = self.host_collision(&request.tools, "start.tools") {
            return self.send(ServerEvent::Error(e)).await;
        }
        let host = &self.host;
        let limits = &host.agent.limits;
        let Some(slot) = host.sessions.admit(limits.max_sessions as usize) else {
            tracing::warn!(
                max_sessions = limits.max_sessions,
                "StartSession refused: session.max_sessions sessions are running"
            );
            let message = format!(
                "{} sessions are running, the most session.max_sessions allows; retry when one has ended",
                limits.max_sessions
            );
            return self.error(ErrorCode::RateLimited, message).await;
        };
        let session = match Session::start(
            request,
            host.agent.briefings.current(),
            &host.agent.this_host,
            &host.agent.models,
            limits.default_max_context_tokens,
            state::SessionLimits {
                max_bytes: limits.max_session_bytes,
                max_tools: limits.max_session_tools,
            },
        ) {
            Ok(s) => s,
            Err(e) => return self.send(ServerEvent::Error(e)).await,
        };
        let record = SessionRecord {
            id: session.id.clone(),
            host_id: host.agent.this_host.id.clone(),
            environment_id: session.environment_id.clone(),
            model: session.model.name().to_string(),
            started_at_ms: now_ms(),
            ended_at_ms: None,
            end_reason: None,
            turns: 0,
            briefing_version: Some(session.briefing.version.clone()),
        };
        if let Err(e) = host.agent.store.session_started(record).await {
            tracing::error!(error = %e, "cannot record the new session");
            return self
                .error(
                    ErrorCode::Internal,
                    "cannot record the session in the store; try again",
                )
                .await;
        }
        tracing::info!(session_id = %session.id, model = session.model.name(), briefing_version = %session.briefing.version, tools = session.tools.len(), credential = self.credential.as_deref().unwrap_or(""), "session started");
        let started = ServerEvent::Started {
            session_id: session.id.clone(),
            model: session.model.name().to_string(),
            permissions: self.permission_views(),
        };
        *self.started.lock() = Some(session.id.clone());
        self.listed.started(&session.id, session.model.name());
        self.session = Some(session);
        self.slot = Some(slot);
        self.send(started).await
    }

    async fn user_message(&mut self, user: UserTurn) -> Result<(), Gone> {
        if let Some(turn) = &self.turn {
            let message = format!(
                "turn {} is still running; wait for its TurnComplete or send CancelTurn",
                turn.plan_message_id
            );
            return self.error(ErrorCode::TurnInProgress, message).await;
        }
        if let Some(e) = self.host_collision(&user.tools, "user_message.tools") {
            return self.send(ServerEvent::Error(e)).await;
        }
        let Some(session) = self.session.as_ref() else {
            return Ok(());
        };
        let plan = match session.plan_turn(user, &self.host.agent.this_host) {
            Ok(plan) => plan,
            Err(e) => return self.send(ServerEvent::Error(e)).await,
        };
        self.spawn_turn(plan);
        Ok(())
    }

    fn spawn_turn(&mut self, plan: TurnPlan) {
        let Some(session) = self.session.as_ref() else {
            return;
        };
        let mut conversation = session.conversation.clone();
        conversation.push(plan.user_message);
        let setup = TurnSetup {
            message_id: plan.message_id.clone(),
            model: session.model.clone(),
            system: plan.system,
            tools: plan.tools,
            conversation,
            permissions: self.host.agent.permissions.clone(),
            limits: TurnLimits::new(
                &self.host.agent.limits,
                self.host.agent.default_max_output_tokens,
                session.model.as_ref(),
                session.context_budget,
                session.tokens_spent,
                false,
            ),
            meter: session.meter,
            live_tokens: session.live_tokens.clone(),
            host: self
                .host
                .agent
                .turn
                .access(
                    approvals::Asker::Session,
                    &session.id,
                    format!("session {}", session.id),
                    plan.ai_mode,
                    None,
                )
                .with_credential(self.credential.clone()),
        };
        let cancel = CancellationToken::new();
        let (inbox_tx, inbox_rx) = mpsc::channel(TURN_INBOX);
        let running = RunningTurn::new(
            turn::run(setup, self.out.clone(), inbox_rx, cancel.clone()),
            inbox_tx,
        );
        self.host.recorder.session(|| {
            serde_json::json!({"event": "turn_started",
            "session_id": session.id, "message_id": plan.message_id,
            "ai_mode": plan.ai_mode.as_str(), "user_content": plan.user_content})
        });
        self.turn = Some(ActiveTurn {
            plan_message_id: plan.message_id,
            ai_mode: plan.ai_mode,
            user_content: plan.user_content,
            started_at_ms: now_ms(),
            cancel,
            running,
        });
    }

    /// A client tool may not take a host tool's name.
    fn host_collision(&self, tools: &[ToolSpec], field: &str) -> Option<SessionError> {
        tools.iter().enumerate().find_map(|(i, t)| {
            self.host.agent.turn.registry.get(&t.name).map(|_| {
                SessionError::new(
                    ErrorCode::InvalidArgument,
                    format!(
                        "{field}[{i}]: `{}` is a host tool of this rozd; rename the client tool",
                        t.name
                    ),
                )
            })
        })
    }

    /// Effective rules: one per host tool (its actual decision), then the
    /// configured rules and the defaults for client tools.
    fn permission_views(&self) -> Vec<PermissionView> {
        let policy = &self.host.agent.permissions;
        let mut views: Vec<PermissionView> = self
            .host
            .agent
            .turn
            .tools
            .definitions()
            .iter()
            .map(|d| {
                let verdict = policy.decide(&d.name, d.category);
                PermissionView {
                    tool_pattern: d.name.clone(),
                    policy: verdict.policy.as_str().to_string(),
                    category: Some(d.category.as_str().to_string()),
                    reason: Some(format!("host tool; {}", verdict.reason)),
                }
            })
            .collect();
        views.extend(policy.views());
        views
    }

    /// Deadman: the session's actuators go to their safe values.
    async fn release_actuators(&self, reason: &str) {
        if let Some(session) = &self.session {
            let origin = crate::ooda::act::Origin::Session(session.id.clone());
            let released = self
                .host
                .agent
                .ooda
                .actuators()
                .release(&origin, reason)
                .await;
            if !released.is_empty() {
                tracing::warn!(session_id = %session.id, reason, ?released, "deadman: session's actuators sent to safe values");
            }
        }
    }

    async fn tool_result(&mut self, result: ToolOutcome) -> Result<(), Gone> {
        if let Some(code) = result.exit_code
            && result.success != (code == 0)
        {
            let message = format!(
                "ToolResult {}: success={} contradicts exit_code={code} (success must equal exit_code == 0)",
                result.tool_call_id, result.success
            );
            return self.error(ErrorCode::InvalidArgument, message).await;
        }
        if let Some(turn) = &self.turn {
            return self.forward(turn, TurnInput::ToolResult(result)).await;
        }
        if self
            .session
            .as_ref()
            .is_some_and(|s| s.is_expired(&result.tool_call_id))
        {
            tracing::warn!(tool_call_id = %result.tool_call_id, "late ToolResult for a timed-out call ignored");
            return Ok(());
        }
        let message = format!("ToolResult {}: no turn is running", result.tool_call_id);
        self.error(ErrorCode::NoActiveTurn, message).await
    }

    async fn feedback(
        &mut self,
        session_id: String,
        message_id: String,
        rating: String,
    ) -> Result<(), Gone> {
        if rating != "up" && rating != "down" {
            return self
                .error(
                    ErrorCode::InvalidArgument,
                    format!("feedback.rating {rating:?} is not \"up\" or \"down\""),
                )
                .await;
        }
        let own = self
            .session
            .as_ref()
            .map(|s| s.id.clone())
            .unwrap_or_default();
        let session_id = if session_id.is_empty() {
            own
        } else {
            session_id
        };
        match self
            .host
            .agent
            .store
            .feedback(session_id.clone(), message_id.clone(), rating.clone())
            .await
        {
            Ok(()) => tracing::info!(%session_id, %message_id, %rating, "feedback stored"),
            Err(e) => {
                tracing::error!(error = %e, "cannot store feedback");
                self.error(ErrorCode::Internal, "cannot store feedback; try again")
                    .await?;
            }
        }
        Ok(())
    }

    /// The active turn ended: clear it, record it, then tell the client —
    /// in that order, so a client that answers `TurnComplete` at once is
    /// never told a turn is in progress.
    async fn finish_turn(&mut self, joined: Result<TurnOutcome, TurnFailed>) -> Result<(), Gone> {
        match self.record_turn(joined).await {
            Some(report) => self.report_turn(report).await,
            None => Ok(()),
        }
    }

    /// Clears the active turn, folds its outcome into the session and writes it to the store.
    async fn record_turn(&mut self, joined: Result<TurnOutcome, TurnFailed>) -> Option<TurnReport> {
        let turn = self.turn.take()?;
        let interrupted = match &joined {
            Ok(outcome) => outcome.stop_reason == StopReason::Cancelled,
            Err(_) => true,
        };
        if interrupted {
            // Deadman: a cancelled (or failed) turn leaves nothing commanded.
            self.release_actuators("turn cancelled").await;
        }
        let session = self.session.as_mut()?;
        let outcome = match joined {
            Ok(outcome) => outcome,
            Err(e) => {
                // A panicking turn must not take the session (or the daemon) down.
                tracing::error!(error = %e, message_id = %turn.plan_message_id, "turn failed");
                self.host.hooks.turn_interrupted(&session.id, "turn failed");
                TurnOutcome {
                    conversation: session.conversation.clone(),
                    added: Vec::new(),
                    usage: Usage::default(),
                    stop_reason: StopReason::Error,
                    error: Some(
                        SessionError::new(ErrorCode::Internal, "the turn failed inside rozd")
                            .with_retryable(true),
                    ),
                    expired_calls: Vec::new(),
                    meter: session.meter,
                }
            }
        };
        if outcome.stop_reason == StopReason::Cancelled {
            self.host
                .hooks
                .turn_interrupted(&session.id, "turn cancelled");
        }
        let record = TurnRecord {
            session_id: session.id.clone(),
            seq: session.turns_done,
            message_id: turn.plan_message_id.clone(),
            ai_mode: turn.ai_mode.as_str().to_string(),
            user_content: turn.user_content.clone(),
            messages: record::messages_json(&outcome.added),
            stop_reason: outcome.stop_reason.as_str().to_string(),
            input_tokens: outcome.usage.input_tokens,
            output_tokens: outcome.usage.output_tokens,
            cache_read_tokens: outcome.usage.cache_read_tokens,
            cache_creation_tokens: outcome.usage.cache_creation_tokens,
            started_at_ms: turn.started_at_ms,
            ended_at_ms: now_ms(),
        };
        session.conversation = outcome.conversation;
        session.turns_done += 1;
        session.tokens_spent = session.tokens_spent.saturating_add(outcome.usage.total());
        session.meter = outcome.meter;
        session.remember_expired(outcome.expired_calls);
        let mut errors = Vec::new();
        if let Err(e) = self.host.agent.store.turn_completed(record).await {
            tracing::error!(error = %e, "cannot record the turn");
            errors.push(SessionError::new(
                ErrorCode::Internal,
                "the turn could not be recorded in the store",
            ));
        }
        errors.extend(outcome.error);
        Some(TurnReport {
            message_id: turn.plan_message_id,
            usage: outcome.usage,
            stop_reason: outcome.stop_reason,
            errors,
        })
    }

    async fn report_turn(&self, report: TurnReport) -> Result<(), Gone> {
        for error in report.errors {
            self.send(ServerEvent::Error(error)).await?;
        }
        self.send(ServerEvent::Activity {
            state: Activity::Idle,
            detail: String::new(),
        })
        .await?;
        self.send(ServerEvent::Presence {
            level: Presence::Hidden,
            reason: "idle".into(),
        })
        .await?;
        self.send(ServerEvent::TurnComplete {
            message_id: report.message_id,
            usage: report.usage,
            stop_reason: report.stop_reason,
        })
        .await
    }

    async fn keepalive(&self) -> Result<(), Gone> {
        let (tokens_used, tokens_max) = match &self.session {
            Some(s) => (Some(s.tokens_used()), Some(s.context_budget)),
            None => (None, None),
        };
        self.send(ServerEvent::Keepalive {
            tokens_used,
            tokens_max,
        })
        .await
    }

    /// Ends the session: cancels a running turn (reporting its
    /// `TurnComplete` if the client is still there), then records the end.
    async fn close(mut self, end: End) {
        if let Some(turn) = &mut self.turn {
            turn.cancel.cancel();
            let joined = match tokio::time::timeout(TURN_WIND_DOWN, turn.running.finished()).await {
                Ok(joined) => joined,
                Err(_) => {
                    turn.running.abort();
                    tracing::error!("turn did not wind down in time; aborted");
                    Err(TurnFailed::Aborted)
                }
            };
            if let Some(session) = &self.session {
                self.host.hooks.turn_interrupted(&session.id, end.as_str());
            }
            if let Some(report) = self.record_turn(joined).await
                && end != End::Disconnect
            {
                let _ = self.report_turn(report).await;
            }
        }
        self.release_actuators(&format!("session ended: {}", end.as_str()))
            .await;
        if let Some(session) = &self.session {
            self.host.hooks.session_ended(&session.id, end.as_str());
            metrics::session_ended(end.as_str());
            if let Err(e) = self
                .host
                .agent
                .store
                .session_ended(session.id.clone(), end.as_str().to_string())
                .await
            {
                tracing::error!(error = %e, session_id = %session.id, "cannot record the end of the session");
            }
        }
        // Its place is free once its end is recorded.
        drop(self.slot.take());
    }
}

struct TurnReport {
    message_id: String,
    usage: Usage,
    stop_reason: StopReason,
    errors: Vec<SessionError>,
}

impl Runner<'_> {
    /// Hands a client's input to the running turn. The turn reads its inbox
    /// as it goes; one that has not read [`TURN_INBOX`] inputs yet is being
    /// flooded, and the client is told the input was not taken.
    async fn forward(&self, turn: &ActiveTurn, input: TurnInput) -> Result<(), Gone> {
        match turn.running.offer(input) {
            Ok(()) => Ok(()),
            Err(running::InboxFull(input)) => {
                let what = match input {
                    TurnInput::ToolResult(r) => format!("ToolResult {}", r.tool_call_id),
                    TurnInput::Decision { tool_call_id, .. } => {
                        format!("PermissionDecision for {tool_call_id}")
                    }
                };
                let message = format!(
                    "{what} not taken: turn {} has {TURN_INBOX} inputs it has not read yet",
                    turn.plan_message_id
                );
                self.error(ErrorCode::RateLimited, message).await
            }
        }
    }
}
