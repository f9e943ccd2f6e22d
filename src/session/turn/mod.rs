//! One turn: model calls and tool calls until the model ends the turn, the
//! cycle limit is reached, an error stops it, or it is cancelled.
//!
//! A session polls its turn in its own task (`session/running.rs`); a
//! task's worker spawns it. It streams deltas, tool requests and activity
//! straight to the client; it never sends
//! `TurnComplete` itself — it returns a [`TurnOutcome`] and the session loop
//! clears the active turn before it sends `TurnComplete`.
//!
//! Here: the cycle of model calls and tool calls, and the turn's limits.
//! Beside it: [`tool_call`] takes a model's tool call through the one gate
//! every call passes (permission, approval; shared with every caller of
//! host tools in [`crate::session::host_call`]) and a client tool's round
//! trip, [`host_call`] runs host tools on that shared path with the turn as
//! its call site, [`compaction`] keeps the context inside its budget,
//! [`observation`] writes the Observation for `ooda_re_act` mode.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures_util::StreamExt as _;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

mod compaction;
mod host_call;
mod metered;
mod observation;
mod tool_call;

use metered::{model_result, model_tokens};
use tool_call::error_result;

use crate::config::types::{AiMode, SessionConfig};
use crate::model::{self, Block, Message, Model, ModelEvent, ModelRequest, ModelStop, Usage};
use crate::session::host_call::GateDecision;

use super::approvals::{Approvals, Asker};
use super::context::{CompactionLimits, ContextMeter, History};
use super::permissions::PermissionPolicy;
use super::tools::ToolRegistry;
use super::{Activity, ErrorCode, Presence, ServerEvent, SessionError, StopReason, ToolOutcome};
use crate::ooda::Ooda;
use crate::ooda::orient::AlarmLevel;
use crate::store::Store;
use crate::tools::HostTools;

/// The host side of a turn: host tools, where audit goes, and the
/// Observation to inject in `ooda_re_act` mode.
#[derive(Debug, Clone)]
pub(crate) struct HostAccess {
    /// Who owns the actuators this turn commands (a session, or a task's worker).
    pub session_id: String,
    /// How the audit names the caller, e.g. `session <id>`.
    pub label: String,
    /// The credential behind the calls (a token's name, a certificate
    /// subject), which the audit names.
    pub credential: Option<String>,
    /// Who the caller is, as the list of waiting approvals names it.
    pub asker: Asker,
    /// Where a call that needs approval is listed for an operator
    /// (`/v1/approvals`), beside the caller's own way to answer it.
    pub approvals: Arc<Approvals>,
    /// Where a headless driver (a task's worker) hears of each cycle and tool
    /// call; sessions leave it unset.
    pub notes: Option<mpsc::UnboundedSender<TurnNote>>,
    pub tools: Arc<HostTools>,
    pub registry: Arc<ToolRegistry>,
    pub store: Store,
    /// Set in `ooda_re_act` mode: the latest Observation goes into the
    /// model's context before every model call.
    pub observe: Option<Arc<Ooda>>,
}

/// What a turn's host tool calls reach of the host.
#[derive(Debug, Clone)]
pub(crate) struct TurnHost {
    pub approvals: Arc<Approvals>,
    pub tools: Arc<HostTools>,
    pub registry: Arc<ToolRegistry>,
    pub store: Store,
    pub ooda: Arc<Ooda>,
}

impl TurnHost {
    /// The host as `owner` (a session id or a task worker's id) sees it in
    /// `ai_mode`; `label` is how the audit names the caller.
    pub(crate) fn access(
        &self,
        asker: Asker,
        owner: &str,
        label: String,
        ai_mode: AiMode,
        notes: Option<mpsc::UnboundedSender<TurnNote>>,
    ) -> HostAccess {
        HostAccess {
            session_id: owner.to_string(),
            label,
            credential: None,
            asker,
            approvals: self.approvals.clone(),
            notes,
            tools: self.tools.clone(),
            registry: self.registry.clone(),
            store: self.store.clone(),
            observe: (ai_mode == AiMode::OodaReAct).then(|| self.ooda.clone()),
        }
    }
}

impl HostAccess {
    /// The credential the audit names for this turn's physical calls.
    pub(crate) fn with_credential(mut self, credential: Option<String>) -> HostAccess {
        self.credential = credential;
        self
    }
}

/// Progress of a turn for a headless driver: not part of the session protocol.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum TurnNote {
    /// A model/tool cycle began (1-based).
    Cycle(u32),
    /// The model called a tool (host or client), before any permission check.
    ToolCall {
        id: String,
        name: String,
        /// What the model asked for (shown beside a pending approval).
        parameters: Value,
    },
}

/// What the session loop forwards to the running turn.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum TurnInput {
    ToolResult(ToolOutcome),
    Decision {
        tool_call_id: String,
        approved: bool,
        /// The credential that answered: a session's own stream credential,
        /// or whoever answered a task's call (`None`: anonymous).
        by: Option<String>,
    },
}

#[derive(Debug, Clone)]
pub(crate) struct TurnLimits {
    pub max_cycles: u32,
    pub max_output_tokens: u32,
    pub default_tool_timeout_ms: u32,
    pub approval_timeout: Duration,
    /// The session's context budget (`max_context_tokens`).
    pub context_budget: u32,
    pub compaction: CompactionLimits,
    /// Tokens the session may spend in total; 0 = unlimited.
    pub max_session_tokens: u64,
    /// Tokens the session spent before this turn.
    pub session_tokens_spent: u64,
    /// A `safety_violation` or `e_stop` ends the turn at once. Set for
    /// headless task workers (no one is there to correct them); a session's
    /// model hears the refusal and its client decides.
    pub halt_on_safety_error: bool,
}

impl TurnLimits {
    /// The configured limits (`[session]`, and `model.max_output_tokens`
    /// for a model without its own) for a turn of `model` with this context
    /// budget, after `tokens_spent` tokens; `headless` for a task's worker.
    pub(crate) fn new(
        session: &SessionConfig,
        default_max_output_tokens: u32,
        model: &dyn Model,
        context_budget: u32,
        tokens_spent: u64,
        headless: bool,
    ) -> TurnLimits {
        TurnLimits {
            max_cycles: session.max_cycles,
            max_output_tokens: model
                .max_output_tokens()
                .unwrap_or(default_max_output_tokens),
            default_tool_timeout_ms: session.default_tool_timeout_ms,
            approval_timeout: session.approval_timeout,
            context_budget,
            compaction: CompactionLimits {
                target: session.compact_target,
                tool_results_at: session.compact_tool_results_at,
                thinking_at: session.compact_thinking_at,
                summary_at: session.compact_summary_at,
            },
            max_session_tokens: session.max_session_tokens,
            session_tokens_spent: tokens_spent,
            halt_on_safety_error: headless,
        }
    }
}

pub(crate) struct TurnSetup {
    pub message_id: String,
    pub model: Arc<dyn Model>,
    pub system: String,
    pub tools: ToolRegistry,
    /// The conversation so far, ending with this turn's user message.
    pub conversation: History,
    pub permissions: Arc<PermissionPolicy>,
    pub limits: TurnLimits,
    pub meter: ContextMeter,
    /// The live size of the context, read by `Keepalive`.
    pub live_tokens: Arc<AtomicU32>,
    pub host: HostAccess,
}

#[derive(Debug)]
pub(crate) struct TurnOutcome {
    /// The conversation after the turn (compacted where the budget required).
    pub conversation: History,
    /// This turn's own messages as they were produced, from its user message
    /// on, uncompacted: what is recorded. A model answer that broke off is
    /// not among them.
    pub added: Vec<Message>,
    pub usage: Usage,
    pub stop_reason: StopReason,
    /// An error the client is told about before `TurnComplete`.
    pub error: Option<SessionError>,
    /// Tool calls that timed out; their late results are ignored.
    pub expired_calls: Vec<String>,
    pub meter: ContextMeter,
}

/// Why the turn stopped early.
enum Interrupt {
    /// `CancelTurn`, `CancelSession`, disconnect or shutdown.
    Cancelled,
    /// The client's response stream is gone.
    ClientGone,
    /// A safety error ended a headless turn ([`TurnLimits::halt_on_safety_error`]).
    Halted(SessionError),
}

struct Turn {
    message_id: String,
    tools: ToolRegistry,
    permissions: Arc<PermissionPolicy>,
    limits: TurnLimits,
    out: mpsc::Sender<ServerEvent>,
    inbox: mpsc::Receiver<TurnInput>,
    cancel: CancellationToken,
    last_activity: Option<(Activity, String)>,
    last_presence: Option<Presence>,
    /// Calls whose results were delivered: a second result is a duplicate.
    completed: HashSet<String>,
    expired: Vec<String>,
    /// This turn's messages, for the record.
    added: Vec<Message>,
    meter: ContextMeter,
    live_tokens: Arc<AtomicU32>,
    host: HostAccess,
    /// Alarm levels seen at the previous cycle, to point out new ones.
    seen_alarms: Vec<(String, AlarmLevel)>,
    cycle: u32,
    /// Tokens this turn has spent (model calls and summaries).
    usage: Usage,
    /// What the gate decided for the tool call running now (for its metric).
    last_gate: Option<GateDecision>,
    /// Images the last host tool answered with, placed right after its
    /// result (`capture_image`).
    tool_images: Vec<Block>,
}

/// The conversation a turn works on: its messages, where this turn's own
/// messages begin (compaction never summarises or drops those), and their
/// estimated size, kept up to date as messages are added so that a model
/// call costs no pass over the whole conversation (it grows with every call).
struct Conversation {
    /// Shared with the model request of the call in flight (see
    /// [`ModelRequest::messages`]); changed through `Arc::make_mut`.
    messages: Arc<Vec<Message>>,
    turn_start: usize,
    tokens: u32,
    /// Compaction changed the messages and has not counted them yet (it
    /// counts once it is done; an interruption can come in between).
    uncounted: bool,
}

impl Conversation {
    /// `history` ends with this turn's user message.
    fn new(history: History) -> Conversation {
        let (messages, tokens) = history.into_parts();
        Conversation {
            turn_start: messages.len().saturating_sub(1),
            tokens,
            messages: Arc::new(messages),
            uncounted: false,
        }
    }

    /// Adds a message; its estimated size.
    fn push(&mut self, message: Message) -> u32 {
        let tokens = model::estimate_message_tokens(&message);
        self.tokens = self.tokens.saturating_add(tokens);
        Arc::make_mut(&mut self.messages).push(message);
        tokens
    }

    fn into_history(self) -> History {
        let messages = Arc::unwrap_or_clone(self.messages);
        if self.uncounted {
            History::new(messages)
        } else {
            History::counted(messages, self.tokens)
        }
    }
}

pub(crate) async fn run(
    setup: TurnSetup,
    out: mpsc::Sender<ServerEvent>,
    inbox: mpsc::Receiver<TurnInput>,
    cancel: CancellationToken,
) -> TurnOutcome {
    let TurnSetup {
        message_id,
        model,
        system,
        tools,
        conversation,
        permissions,
        limits,
        meter,
        live_tokens,
        host,
    } = setup;
    let added = conversation
        .messages()
        .last()
        .cloned()
        .into_iter()
        .collect();
    let mut turn = Turn {
        message_id,
        tools,
        permissions,
        limits,
        out,
        inbox,
        cancel,
        last_activity: None,
        last_presence: None,
        completed: HashSet::new(),
        expired: Vec::new(),
        added,
        meter,
        live_tokens,
        host,
        seen_alarms: Vec::new(),
        cycle: 0,
        usage: Usage::default(),
        last_gate: None,
        tool_images: Vec::new(),
    };
    let mut conversation = Conversation::new(conversation);
    let result = turn
        .cycles(model.as_ref(), &system, &mut conversation)
        .await;
    let (stop_reason, error) = match result {
        Ok(stop) => (stop, None),
        Err(TurnError::Interrupted(Interrupt::Cancelled)) => (StopReason::Cancelled, None),
        Err(TurnError::Interrupted(Interrupt::Halted(e))) => (StopReason::Error, Some(e)),
        Err(TurnError::Interrupted(Interrupt::ClientGone)) => {
            tracing::info!("client stream closed during the turn");
            (StopReason::Cancelled, None)
        }
        Err(TurnError::Failed(e)) => (StopReason::Error, Some(e)),
    };
    crate::session::metrics::turn_ended(stop_reason.as_str());
    TurnOutcome {
        conversation: conversation.into_history(),
        added: turn.added,
        usage: turn.usage,
        stop_reason,
        error,
        expired_calls: turn.expired,
        meter: turn.meter,
    }
}

enum TurnError {
    Interrupted(Interrupt),
    Failed(SessionError),
}

impl From<Interrupt> for TurnError {
    fn from(i: Interrupt) -> Self {
        TurnError::Interrupted(i)
    }
}

impl Turn {
    async fn cycles(
        &mut self,
        model: &dyn Model,
        system: &str,
        conversation: &mut Conversation,
    ) -> Result<StopReason, TurnError> {
        // The tools do not change during a turn: their share of the
        // estimate is counted once.
        let mut tools = self.host.registry.definitions();
        tools.extend(self.tools.definitions());
        let tools_tokens = self
            .host
            .registry
            .tokens()
            .saturating_add(self.tools.tokens());
        debug_assert_eq!(tools_tokens, model::estimate_tools_tokens(&tools));
        let tools = Arc::new(tools);
        // Neither does the system prompt; the Observation added to it in
        // `ooda_re_act` mode is counted on its own (a count is additive
        // across the blank line that joins them).
        let system_tokens = model::tokens::count(system);
        for _cycle in 0..self.limits.max_cycles {
            self.cycle += 1;
            self.note(TurnNote::Cycle(self.cycle));
            // In ooda_re_act mode each cycle is one observe-orient-decide-act
            // pass, reported as such; the Observation goes into the context.
            let (phase, observation) = match self.host.observe.clone() {
                Some(ooda) => (
                    format!("ooda cycle {}", self.cycle),
                    Some(self.describe_observation(&ooda)),
                ),
                None => (String::new(), None),
            };
            self.state(
                Activity::Thinking,
                &phase,
                Presence::Mini,
                "the model is thinking",
            )
            .await?;
            self.check_session_budget()?;
            let (system, fixed_tokens) = match observation {
                Some(text) => (
                    [system, "\n\n", &text].concat(),
                    model::tokens::count(&text).saturating_add(system_tokens),
                ),
                None => (system.to_string(), system_tokens),
            };
            let fixed_tokens = fixed_tokens.saturating_add(tools_tokens);
            let estimate = self.fit_budget(model, conversation, fixed_tokens).await?;
            let request = ModelRequest {
                system,
                messages: Arc::clone(&conversation.messages),
                tools: Arc::clone(&tools),
                max_output_tokens: self.limits.max_output_tokens,
                estimated_input_tokens: Some(estimate),
                tool_choice: None,
            };
            debug_assert_eq!(estimate, request.estimate_tokens(), "incremental estimate");
            self.live_tokens
                .store(self.meter.scaled(estimate), Ordering::Relaxed);
            let asked = std::time::Instant::now();
            let reply = self.call_model(model, request).await;
            crate::model::metrics::model_call(
                model.name(),
                asked.elapsed(),
                model_result(&reply),
                model_tokens(&reply),
            );
            let reply = reply?;
            self.usage.add(reply.usage);
            let answer = Message::assistant(reply.blocks);
            let answer_estimate = model::estimate_message_tokens(&answer);
            let actual = reply.usage.context_tokens();
            self.meter
                .calibrate(estimate.saturating_add(answer_estimate), actual);
            self.live_tokens.store(
                if actual > 0 {
                    actual
                } else {
                    self.meter.scaled(estimate.saturating_add(answer_estimate))
                },
                Ordering::Relaxed,
            );
            let calls: Vec<(String, String, Value)> = answer
                .content
                .iter()
                .filter_map(|b| match b {
                    Block::ToolUse { id, name, input } => {
                        Some((id.clone(), name.clone(), input.clone()))
                    }
                    _ => None,
                })
                .collect();
            if !answer.content.is_empty() {
                self.added.push(answer.clone());
                conversation.push(answer);
            }
            if calls.is_empty() {
                return Ok(match reply.stop {
                    ModelStop::MaxTokens => StopReason::MaxTokens,
                    ModelStop::EndTurn | ModelStop::ToolUse => StopReason::EndTurn,
                });
            }
            let mut results = Vec::with_capacity(calls.len());
            let mut interrupted = None;
            for (id, name, input) in calls {
                if interrupted.is_some() {
                    // Every tool use gets a result, so the conversation stays valid.
                    results.push(error_result(&id, &name, "not run: the turn was cancelled"));
                    continue;
                }
                let (called, category) = (std::time::Instant::now(), self.category_of(&name));
                self.last_gate = None;
                let result = self.tool_call(&id, &name, input).await;
                self.count_tool_call(&name, category, &result, called.elapsed());
                let images = std::mem::take(&mut self.tool_images);
                match result {
                    Ok(block) => {
                        results.push(block);
                        results.extend(images);
                    }
                    Err(i) => {
                        results.push(error_result(
                            &id,
                            &name,
                            "cancelled before a result arrived",
                        ));
                        interrupted = Some(i);
                    }
                }
            }
            let results = Message::user(results);
            self.added.push(results.clone());
            let results_estimate = conversation.push(results);
            let grown = self
                .live_tokens
                .load(Ordering::Relaxed)
                .saturating_add(self.meter.scaled(results_estimate));
            self.live_tokens.store(grown, Ordering::Relaxed);
            if let Some(i) = interrupted {
                return Err(i.into());
            }
        }
        Ok(StopReason::MaxCycles)
    }

    /// `budget_exceeded` once the session has spent its token budget.
    fn check_session_budget(&self) -> Result<(), TurnError> {
        let limit = self.limits.max_session_tokens;
        let spent = self
            .limits
            .session_tokens_spent
            .saturating_add(self.usage.total());
        if limit > 0 && spent >= limit {
            return Err(TurnError::Failed(SessionError::new(
                ErrorCode::BudgetExceeded,
                format!(
                    "this session has spent {spent} tokens of its budget of {limit} \
                     (session.max_session_tokens); start a new session"
                ),
            )));
        }
        Ok(())
    }

    async fn call_model(
        &mut self,
        model: &dyn Model,
        request: ModelRequest,
    ) -> Result<ModelReply, TurnError> {
        let mut stream = model.stream(request);
        let mut reply = ModelReply {
            blocks: Vec::new(),
            usage: Usage::default(),
            stop: ModelStop::EndTurn,
        };
        let mut stopped = false;
        // One wait on the cancellation for the whole answer, not one
        // registered and dropped again for every event of it.
        let cancelled = self.cancel.clone().cancelled_owned();
        tokio::pin!(cancelled);
        loop {
            let event = tokio::select! {
                biased;
                () = &mut cancelled => return Err(Interrupt::Cancelled.into()),
                event = stream.next() => event,
            };
            match event {
                None => break,
                Some(Err(e)) => {
                    tracing::warn!(model = model.name(), retryable = e.retryable, error = %e, "model call failed");
                    return Err(TurnError::Failed(
                        SessionError::new(
                            ErrorCode::ModelError,
                            format!("model {}: {e}", model.name()),
                        )
                        .with_retryable(e.retryable),
                    ));
                }
                Some(Ok(ModelEvent::TextDelta(delta))) => {
                    if delta.is_empty() {
                        continue;
                    }
                    match reply.blocks.last_mut() {
                        Some(Block::Text(text)) => text.push_str(&delta),
                        _ => reply.blocks.push(Block::Text(delta.clone())),
                    }
                    let message_id = self.message_id.clone();
                    self.send(ServerEvent::TextDelta {
                        message_id,
                        content: delta,
                    })
                    .await?;
                }
                Some(Ok(ModelEvent::ThinkingDelta(delta))) => {
                    if delta.is_empty() {
                        continue;
                    }
                    match reply.blocks.last_mut() {
                        Some(Block::Thinking { text, signature }) if signature.is_empty() => {
                            text.push_str(&delta)
                        }
                        _ => reply.blocks.push(Block::Thinking {
                            text: delta.clone(),
                            signature: String::new(),
                        }),
                    }
                    let message_id = self.message_id.clone();
                    self.send(ServerEvent::ThinkingDelta {
                        message_id,
                        content: delta,
                    })
                    .await?;
                }
                Some(Ok(ModelEvent::ThinkingSignature(sig))) => match reply.blocks.last_mut() {
                    Some(Block::Thinking { signature, .. }) if signature.is_empty() => {
                        *signature = sig;
                    }
                    _ => reply.blocks.push(Block::Thinking {
                        text: String::new(),
                        signature: sig,
                    }),
                },
                Some(Ok(ModelEvent::RedactedThinking(data))) => {
                    reply.blocks.push(Block::RedactedThinking { data });
                }
                Some(Ok(ModelEvent::ToolUse { id, name, input })) => {
                    reply.blocks.push(Block::ToolUse { id, name, input });
                }
                Some(Ok(ModelEvent::Usage(u))) => reply.usage.add(u),
                Some(Ok(ModelEvent::Stop(stop))) => {
                    reply.stop = stop;
                    stopped = true;
                }
            }
        }
        if !stopped {
            return Err(TurnError::Failed(
                SessionError::new(
                    ErrorCode::ModelError,
                    format!(
                        "model {} ended its stream without a stop reason",
                        model.name()
                    ),
                )
                .with_retryable(true),
            ));
        }
        Ok(reply)
    }

    /// Reports activity and presence, each only when it changes.
    async fn state(
        &mut self,
        activity: Activity,
        detail: &str,
        presence: Presence,
        reason: &str,
    ) -> Result<(), Interrupt> {
        let now = (activity, detail.to_string());
        if self.last_activity.as_ref() != Some(&now) {
            self.send(ServerEvent::Activity {
                state: activity,
                detail: detail.to_string(),
            })
            .await?;
            self.last_activity = Some(now);
        }
        if self.last_presence != Some(presence) {
            self.send(ServerEvent::Presence {
                level: presence,
                reason: reason.to_string(),
            })
            .await?;
            self.last_presence = Some(presence);
        }
        Ok(())
    }

    /// Reports a safety error; ends a headless turn with it.
    async fn safety_error(&self, error: SessionError) -> Result<(), Interrupt> {
        self.send(ServerEvent::Error(error.clone())).await?;
        if self.limits.halt_on_safety_error {
            return Err(Interrupt::Halted(error));
        }
        Ok(())
    }

    fn note(&self, note: TurnNote) {
        if let Some(notes) = &self.host.notes {
            // A driver that stopped listening has nothing left to hear.
            let _ = notes.send(note);
        }
    }

    async fn send(&self, event: ServerEvent) -> Result<(), Interrupt> {
        // The queue to the client nearly always has room: then the event
        // goes in at once, without registering a wait on the cancellation
        // and the queue (two locks each way, five events a step). The
        // order of the checks is the select's below.
        if self.cancel.is_cancelled() {
            return Err(Interrupt::Cancelled);
        }
        let event = match self.out.try_send(event) {
            Ok(()) => return Ok(()),
            Err(mpsc::error::TrySendError::Closed(_)) => return Err(Interrupt::ClientGone),
            Err(mpsc::error::TrySendError::Full(event)) => event,
        };
        tokio::select! {
            biased;
            () = self.cancel.cancelled() => Err(Interrupt::Cancelled),
            sent = self.out.send(event) => sent.map_err(|_| Interrupt::ClientGone),
        }
    }
}

struct ModelReply {
    blocks: Vec<Block>,
    usage: Usage,
    stop: ModelStop,
}
