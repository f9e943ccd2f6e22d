//! One turn: model calls and tool calls until the model ends the turn, the
//! cycle limit is reached, an error stops it, or it is cancelled.
//!
//! The turn runs as a child task of the session. It streams deltas, tool
//! requests and activity straight to the client; it never sends
//! `TurnComplete` itself — it returns a [`TurnOutcome`] and the session loop
//! clears the active turn before it sends `TurnComplete`.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures_util::StreamExt as _;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::{Policy, ToolCategory};
use crate::model::{self, Block, Message, Model, ModelEvent, ModelRequest, ModelStop, Usage};

use super::context::{self, CompactionLimits, ContextMeter};
use super::permissions::PermissionPolicy;
use super::tools::{Tool, ToolRegistry};
use super::{Activity, ErrorCode, Presence, ServerEvent, SessionError, StopReason, ToolOutcome};
use crate::ooda::Ooda;
use crate::ooda::orient::AlarmLevel;
use crate::store::{AuditRecord, Store, now_ms};
use crate::tools::{HostTools, ToolError};

/// The host side of a turn: host tools, where audit goes, and the
/// Observation to inject in `ooda_re_act` mode.
#[derive(Debug, Clone)]
pub struct HostAccess {
    /// Who owns the actuators this turn commands (a session, or a task's worker).
    pub session_id: String,
    /// How the audit names the caller, e.g. `session <id>`.
    pub label: String,
    /// Where a headless driver (a task's worker) hears of each cycle and tool
    /// call; sessions leave it unset.
    pub notes: Option<mpsc::UnboundedSender<TurnNote>>,
    pub tools: Arc<HostTools>,
    pub registry: ToolRegistry,
    pub store: Store,
    /// Set in `ooda_re_act` mode: the latest Observation goes into the
    /// model's context before every model call.
    pub observe: Option<Arc<Ooda>>,
}

/// Progress of a turn for a headless driver: not part of the session protocol.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnNote {
    /// A model/tool cycle began (1-based).
    Cycle(u32),
    /// The model called a tool (host or client), before any permission check.
    ToolCall { id: String, name: String },
}

/// What the session loop forwards to the running turn.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnInput {
    ToolResult(ToolOutcome),
    Decision {
        tool_call_id: String,
        approved: bool,
    },
}

#[derive(Debug, Clone)]
pub struct TurnLimits {
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

pub struct TurnSetup {
    pub message_id: String,
    pub model: Arc<dyn Model>,
    pub system: String,
    pub tools: ToolRegistry,
    /// The conversation so far, ending with this turn's user message.
    pub conversation: Vec<Message>,
    pub permissions: Arc<PermissionPolicy>,
    pub limits: TurnLimits,
    pub meter: ContextMeter,
    /// The live size of the context, read by `Keepalive`.
    pub live_tokens: Arc<AtomicU32>,
    pub host: HostAccess,
}

#[derive(Debug)]
pub struct TurnOutcome {
    /// The conversation after the turn (compacted where the budget required).
    pub conversation: Vec<Message>,
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

/// Longest summary a compaction asks the model for.
const SUMMARY_MAX_TOKENS: u32 = 1024;

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
}

pub async fn run(
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
        mut conversation,
        permissions,
        limits,
        meter,
        live_tokens,
        host,
    } = setup;
    let added = conversation.last().cloned().into_iter().collect();
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
    };
    let mut usage = Usage::default();
    let result = turn
        .cycles(model.as_ref(), &system, &mut conversation, &mut usage)
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
    TurnOutcome {
        conversation,
        added: turn.added,
        usage,
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
        conversation: &mut Vec<Message>,
        usage: &mut Usage,
    ) -> Result<StopReason, TurnError> {
        let mut turn_start = conversation.len().saturating_sub(1);
        // The tools do not change during a turn; the conversation's estimate
        // is kept up to date as messages are added, so a model call costs
        // no pass over the whole conversation (it grows with every call).
        let mut tools = self.host.registry.definitions();
        tools.extend(self.tools.definitions());
        let tools_tokens = model::estimate_tools_tokens(&tools);
        let mut conversation_tokens = context::estimate(conversation);
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
            self.check_session_budget(usage)?;
            let mut request = ModelRequest {
                system: match observation {
                    Some(text) => format!("{system}\n\n{text}"),
                    None => system.to_string(),
                },
                messages: conversation.clone(),
                tools: tools.clone(),
                max_output_tokens: self.limits.max_output_tokens,
            };
            let system_tokens = model::tokens::count(&request.system);
            let known = system_tokens
                .saturating_add(conversation_tokens)
                .saturating_add(tools_tokens);
            debug_assert_eq!(known, request.estimate_tokens(), "incremental estimate");
            let estimate = self
                .fit_budget(
                    model,
                    &mut request,
                    conversation,
                    &mut turn_start,
                    usage,
                    (known, tools_tokens),
                )
                .await?;
            // Compaction may have changed the conversation; `request` holds it.
            conversation_tokens = estimate
                .saturating_sub(system_tokens)
                .saturating_sub(tools_tokens);
            self.live_tokens
                .store(self.meter.scaled(estimate), Ordering::Relaxed);
            let reply = self.call_model(model, request).await?;
            usage.add(reply.usage);
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
                conversation_tokens = conversation_tokens.saturating_add(answer_estimate);
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
                match self.tool_call(&id, &name, input).await {
                    Ok(block) => results.push(block),
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
            let results_estimate = model::estimate_message_tokens(&results);
            conversation_tokens = conversation_tokens.saturating_add(results_estimate);
            let grown = self
                .live_tokens
                .load(Ordering::Relaxed)
                .saturating_add(self.meter.scaled(results_estimate));
            self.live_tokens.store(grown, Ordering::Relaxed);
            self.added.push(results.clone());
            conversation.push(results);
            if let Some(i) = interrupted {
                return Err(i.into());
            }
        }
        Ok(StopReason::MaxCycles)
    }

    /// `budget_exceeded` once the session has spent its token budget.
    fn check_session_budget(&self, usage: &Usage) -> Result<(), TurnError> {
        let limit = self.limits.max_session_tokens;
        let spent = self
            .limits
            .session_tokens_spent
            .saturating_add(usage.total());
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

    /// Keeps the request inside the context budget, compacting between model
    /// calls once it passes the configured fractions of the budget: first
    /// old tool results are elided, then old thinking is removed, then the
    /// oldest turns are summarised by the model, and as a last resort (over
    /// the budget, no summary possible) the oldest turns are dropped. Each
    /// step that changed something is reported with `ContextCompacted`; the
    /// current turn's messages are never summarised or dropped.
    async fn fit_budget(
        &mut self,
        model: &dyn Model,
        request: &mut ModelRequest,
        conversation: &mut Vec<Message>,
        turn_start: &mut usize,
        usage: &mut Usage,
        (estimate, tools_tokens): (u32, u32),
    ) -> Result<u32, TurnError> {
        let budget = self.limits.context_budget;
        let limits = self.limits.compaction;
        let at = |fraction: f64| -> u32 { (f64::from(budget) * fraction).floor() as u32 };
        if self.meter.scaled(estimate) <= at(limits.tool_results_at).min(budget) {
            return Ok(estimate);
        }
        // Compaction (rare): measure the request afresh after each step.
        let full = |request: &ModelRequest| request.estimate_tokens_with_tools(tools_tokens);
        let target = self.meter.unscaled(at(limits.target));

        // Level 1: old tool results.
        let before = (conversation.len(), self.meter.scaled(full(request)));
        let mut estimate = full(request);
        let tail = context::working_tail(conversation);
        let elided = context::elide_tool_results(conversation, tail, &mut estimate, target);
        if elided > 0 {
            request.messages = conversation.clone();
            self.compacted(
                "tool_results",
                before,
                (conversation.len(), self.meter.scaled(full(request))),
                format!("elided {elided} old tool result(s)"),
            )
            .await?;
        }

        // Level 2: old thinking (never the current turn's: providers verify it).
        if self.meter.scaled(full(request)) > at(limits.thinking_at) {
            let before = (conversation.len(), self.meter.scaled(full(request)));
            let mut estimate = full(request);
            let (blocks, removed) =
                context::strip_thinking(conversation, *turn_start, &mut estimate, target);
            *turn_start -= removed;
            if blocks > 0 {
                request.messages = conversation.clone();
                self.compacted(
                    "thinking",
                    before,
                    (conversation.len(), self.meter.scaled(full(request))),
                    format!("removed {blocks} old thinking block(s)"),
                )
                .await?;
            }
        }

        // Level 3: summarise the oldest turns with the model itself.
        if self.meter.scaled(full(request)) > at(limits.summary_at) && model.can_summarize() {
            let before = (conversation.len(), self.meter.scaled(full(request)));
            let summary_budget = self.limits.max_output_tokens.min(SUMMARY_MAX_TOKENS);
            if let Some(cut) = context::cut_old_turns(
                conversation,
                *turn_start,
                full(request),
                target,
                summary_budget,
            )
            // Only worth a model call when the summary is much smaller than
            // what it replaces (never re-summarise a lone summary).
            .filter(|&cut| {
                context::estimate(&conversation[..cut]) > summary_budget.saturating_mul(2)
            }) {
                self.check_session_budget(usage)?;
                if let Some(summary) = self
                    .summarize(model, &conversation[..cut], summary_budget, usage)
                    .await?
                {
                    conversation.splice(..cut, [context::summary_message(&summary)]);
                    *turn_start = *turn_start + 1 - cut;
                    request.messages = conversation.clone();
                    self.compacted(
                        "summary",
                        before,
                        (conversation.len(), self.meter.scaled(full(request))),
                        summary,
                    )
                    .await?;
                }
            }
        }

        // Level 4: over the budget and nothing else helped: drop the oldest turns.
        if self.meter.scaled(full(request)) > budget {
            let before = (conversation.len(), self.meter.scaled(full(request)));
            if let Some(cut) =
                context::cut_old_turns(conversation, *turn_start, full(request), target, 0)
            {
                conversation.drain(..cut);
                *turn_start -= cut;
                request.messages = conversation.clone();
                self.compacted(
                    "truncate",
                    before,
                    (conversation.len(), self.meter.scaled(full(request))),
                    format!("dropped the {cut} oldest message(s) to fit {budget} tokens"),
                )
                .await?;
            }
        }
        let estimate = full(request);
        let tokens = self.meter.scaled(estimate);
        if tokens > budget {
            return Err(TurnError::Failed(SessionError::new(
                ErrorCode::BudgetExceeded,
                format!(
                    "this turn needs about {tokens} tokens of context, more than the budget of {budget}"
                ),
            )));
        }
        Ok(estimate)
    }

    async fn compacted(
        &mut self,
        level: &str,
        (messages_before, tokens_before): (usize, u32),
        (messages_after, tokens_after): (usize, u32),
        summary: String,
    ) -> Result<(), Interrupt> {
        tracing::info!(
            level,
            messages_before,
            messages_after,
            tokens_before,
            tokens_after,
            "context compacted"
        );
        self.live_tokens.store(tokens_after, Ordering::Relaxed);
        self.send(ServerEvent::ContextCompacted {
            level: level.to_string(),
            messages_before: u32::try_from(messages_before).unwrap_or(u32::MAX),
            messages_after: u32::try_from(messages_after).unwrap_or(u32::MAX),
            tokens_before,
            tokens_after,
            summary: Some(summary),
        })
        .await
    }

    /// Asks the model for a summary of old turns; `None` when it fails (the
    /// caller then falls back to dropping them).
    async fn summarize(
        &mut self,
        model: &dyn Model,
        old: &[Message],
        max_output_tokens: u32,
        usage: &mut Usage,
    ) -> Result<Option<String>, Interrupt> {
        self.state(
            Activity::Thinking,
            "compacting the context",
            Presence::Mini,
            "the model is summarising old turns",
        )
        .await?;
        let request = ModelRequest {
            system: context::SUMMARY_SYSTEM.to_string(),
            messages: vec![Message::user(vec![Block::Text(context::transcript(old))])],
            tools: Vec::new(),
            max_output_tokens,
        };
        let mut stream = model.stream(request);
        let mut text = String::new();
        let mut stopped = false;
        loop {
            let event = tokio::select! {
                biased;
                () = self.cancel.cancelled() => return Err(Interrupt::Cancelled),
                event = stream.next() => event,
            };
            match event {
                None => break,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "the model could not summarise old turns");
                    return Ok(None);
                }
                Some(Ok(ModelEvent::TextDelta(delta))) => text.push_str(&delta),
                Some(Ok(ModelEvent::Usage(u))) => usage.add(u),
                Some(Ok(ModelEvent::Stop(_))) => stopped = true,
                Some(Ok(_)) => {}
            }
        }
        let text = text.trim();
        if !stopped || text.is_empty() {
            tracing::warn!("the model gave no summary of old turns");
            return Ok(None);
        }
        Ok(Some(text.to_string()))
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
        loop {
            let event = tokio::select! {
                biased;
                () = self.cancel.cancelled() => return Err(Interrupt::Cancelled.into()),
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

    /// Runs one tool call of the model: look-up, validation, permission,
    /// approval, then the client round trip under the tool's deadline.
    async fn tool_call(&mut self, id: &str, name: &str, input: Value) -> Result<Block, Interrupt> {
        if self.cancel.is_cancelled() {
            return Err(Interrupt::Cancelled);
        }
        self.note(TurnNote::ToolCall {
            id: id.to_string(),
            name: name.to_string(),
        });
        if self.tools.get(name).is_none()
            && let Some(tool) = self.host.registry.get(name).cloned()
        {
            return self.host_tool_call(id, &tool, input).await;
        }
        let Some(tool) = self.tools.get(name).cloned() else {
            tracing::info!(tool = name, "model called a tool this turn does not have");
            return Ok(error_result(
                id,
                name,
                &format!(
                    "unknown tool `{name}`; available: {}",
                    self.tools.names().join(", ")
                ),
            ));
        };
        if let Err(why) = tool.validate(&input) {
            return Ok(error_result(
                id,
                name,
                &format!("invalid parameters for `{name}`: {why}"),
            ));
        }
        let physical = tool.spec.category == ToolCategory::Physical;
        let presence = if physical {
            Presence::Full
        } else {
            Presence::Mini
        };
        let verdict = self.permissions.decide(name, tool.spec.category);
        match verdict.policy {
            Policy::Block => {
                return Ok(error_result(
                    id,
                    name,
                    &format!("`{name}` is blocked by policy: {}", verdict.reason),
                ));
            }
            Policy::RequireConfirmation => {
                if !self.approval(id, name, presence).await? {
                    return Ok(error_result(id, name, &format!("the user denied `{name}`")));
                }
            }
            Policy::Allow => {}
        }
        let timeout_ms = if tool.spec.timeout_ms == 0 {
            self.limits.default_tool_timeout_ms
        } else {
            tool.spec.timeout_ms
        };
        let reason = if physical {
            "a PHYSICAL tool is running"
        } else {
            "a tool is running"
        };
        self.state(Activity::CallingTool, name, presence, reason)
            .await?;
        self.send(ServerEvent::ToolRequest {
            tool_call_id: id.to_string(),
            tool_name: name.to_string(),
            parameters: input,
            timeout_ms,
        })
        .await?;
        let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
        loop {
            let input = tokio::select! {
                biased;
                () = self.cancel.cancelled() => return Err(Interrupt::Cancelled),
                input = self.inbox.recv() => input,
                () = tokio::time::sleep_until(deadline) => {
                    self.expired.push(id.to_string());
                    tracing::warn!(tool_call_id = id, tool = name, timeout_ms, "client tool timed out");
                    self.send(ServerEvent::Error(SessionError::new(
                        ErrorCode::ToolTimeout,
                        format!("tool call {id} ({name}) got no result within {timeout_ms} ms"),
                    )))
                    .await?;
                    return Ok(error_result(id, name, &format!("`{name}` timed out after {timeout_ms} ms without a result")));
                }
            };
            match input {
                Some(TurnInput::ToolResult(result)) if result.tool_call_id == id => {
                    self.completed.insert(id.to_string());
                    return Ok(describe_outcome(name, result));
                }
                Some(other) => self.ignore(other, id),
                None => return Err(Interrupt::Cancelled),
            }
        }
    }

    /// A host tool: runs inside rozd under the daemon's own deadline, never
    /// as a `ToolRequest`. PHYSICAL calls are audited before the model sees
    /// the result.
    async fn host_tool_call(
        &mut self,
        id: &str,
        tool: &Tool,
        input: Value,
    ) -> Result<Block, Interrupt> {
        let name = tool.spec.name.as_str();
        let physical = tool.spec.category == ToolCategory::Physical;
        let presence = if physical {
            Presence::Full
        } else {
            Presence::Mini
        };
        let started = now_ms();
        if let Err(why) = tool.validate(&input) {
            if !physical {
                return Ok(error_result(
                    id,
                    name,
                    &format!("invalid parameters for `{name}`: {why}"),
                ));
            }
            // The host never applies a value outside its limits: say so plainly.
            let message = format!("`{name}` refused: {why}");
            self.audit(id, name, &input, "refused", Err(&message), started)
                .await;
            self.safety_error(SessionError::new(
                ErrorCode::SafetyViolation,
                format!("tool call {id}: {message}"),
            ))
            .await?;
            return Ok(error_result(id, name, &message));
        }
        let stop = self.host.tools.protective_stop();
        if physical && stop.is_active() {
            let message = format!(
                "`{name}` refused: protective stop is active ({})",
                stop.describe()
            );
            self.audit(id, name, &input, "refused", Err(&message), started)
                .await;
            self.safety_error(SessionError::new(
                ErrorCode::EStop,
                format!("tool call {id}: {message}"),
            ))
            .await?;
            return Ok(error_result(id, name, &message));
        }
        let verdict = self.permissions.decide(name, tool.spec.category);
        let decision = match verdict.policy {
            Policy::Block => {
                let message = format!("`{name}` is blocked by policy: {}", verdict.reason);
                if physical {
                    self.audit(id, name, &input, "blocked", Err(&message), started)
                        .await;
                }
                return Ok(error_result(id, name, &message));
            }
            Policy::RequireConfirmation => {
                if !self.approval(id, name, presence).await? {
                    let message = format!("the user denied `{name}`");
                    if physical {
                        self.audit(id, name, &input, "denied", Err(&message), started)
                            .await;
                    }
                    return Ok(error_result(id, name, &message));
                }
                "approved"
            }
            Policy::Allow => "allowed",
        };
        let reason = if physical {
            "a PHYSICAL host tool is running"
        } else {
            "reading the host"
        };
        self.state(Activity::CallingTool, name, presence, reason)
            .await?;
        // A command that reached its driver finishes in its own task and is
        // then undone by the deadman (see `Actuators::command`).
        let result = tokio::select! {
            biased;
            () = self.cancel.cancelled() => {
                if physical {
                    self.audit(id, name, &input, decision, Err("cancelled while running"), started).await;
                }
                return Err(Interrupt::Cancelled);
            }
            result = self.host.tools.execute(name, &input, &self.host.session_id) => result,
        };
        let (text, is_error) = match &result {
            Ok(text) => (text.clone(), false),
            Err(e) => (format!("`{name}` failed: {e}"), true),
        };
        if physical {
            let audited = if is_error {
                Err(text.as_str())
            } else {
                Ok(text.as_str())
            };
            self.audit(id, name, &input, decision, audited, started)
                .await;
        }
        let code = match &result {
            Ok(_) => None,
            Err(ToolError::Timeout(_)) => Some(ErrorCode::ToolTimeout),
            Err(ToolError::EStop(_)) => Some(ErrorCode::EStop),
            Err(ToolError::SafetyViolation(_)) => Some(ErrorCode::SafetyViolation),
            Err(ToolError::Held(_)) => Some(ErrorCode::PermissionDenied),
            Err(ToolError::Invalid(_) | ToolError::Failed(_)) => None,
        };
        if let Some(code) = code {
            let error = SessionError::new(code, format!("tool call {id}: {text}"));
            if matches!(code, ErrorCode::EStop | ErrorCode::SafetyViolation) {
                self.safety_error(error).await?;
            } else {
                self.send(ServerEvent::Error(error)).await?;
            }
        }
        Ok(Block::ToolResult {
            tool_use_id: id.to_string(),
            name: name.to_string(),
            content: text,
            is_error,
        })
    }

    /// Writes one PHYSICAL call to the audit (awaited: the record exists
    /// before the model or the client hears the result).
    async fn audit(
        &self,
        id: &str,
        tool: &str,
        input: &Value,
        decision: &str,
        result: Result<&str, &str>,
        started: i64,
    ) {
        let ended = now_ms();
        let record = AuditRecord {
            at_ms: ended,
            kind: "tool_call".into(),
            session_id: Some(self.host.session_id.clone()),
            tool_call_id: Some(id.to_string()),
            tool: Some(tool.to_string()),
            parameters: Some(input.clone()),
            decision: Some(decision.to_string()),
            result: result.ok().map(str::to_string),
            error: result.err().map(str::to_string),
            origin: Some(self.host.label.clone()),
            started_at_ms: Some(started),
            ended_at_ms: Some(ended),
            duration_ms: Some(ended - started),
            ..Default::default()
        };
        if let Err(e) = self.host.store.audit(record).await {
            tracing::error!(error = %e, tool_call_id = id, "cannot write the audit record");
        }
    }

    /// The Observation as compact text for the model, with alarms that
    /// appeared since the previous cycle called out.
    fn describe_observation(&mut self, ooda: &Ooda) -> String {
        let obs = ooda.observation();
        let mut lines = vec![format!(
            "Current observation #{} (protective stop: {}):",
            obs.seq,
            if obs.protective_stop_causes.is_empty() {
                "none".to_string()
            } else {
                let causes = crate::safety::StopState {
                    causes: obs.protective_stop_causes.clone(),
                };
                format!("ACTIVE, {}", causes.describe())
            }
        )];
        let mut now_alarms = Vec::new();
        for s in &obs.sensors {
            let v = &s.sensor;
            let value = v
                .value
                .map_or_else(|| "no value".to_string(), |x| format!("{x:.4}"));
            let unit = v.unit.as_deref().unwrap_or("");
            let age = v
                .age_ms
                .map_or_else(String::new, |a| format!(", age {a} ms"));
            let alarm = match s.alarm {
                AlarmLevel::Ok => String::new(),
                other => format!(", ALARM {other:?}").to_uppercase(),
            };
            lines.push(format!(
                "- sensor {} = {value} {unit} ({}{age}{alarm})",
                v.name, v.health
            ));
            if s.alarm != AlarmLevel::Ok {
                now_alarms.push((v.name.clone(), s.alarm));
            }
        }
        for a in &obs.actuators {
            let holder = a
                .owner
                .as_deref()
                .map_or_else(String::new, |o| format!(", held by {o}"));
            lines.push(format!(
                "- actuator {} = {}{}{}",
                a.name,
                a.value,
                if a.at_safe_value { " (safe)" } else { "" },
                holder
            ));
        }
        let new: Vec<String> = now_alarms
            .iter()
            .filter(|(n, l)| !self.seen_alarms.iter().any(|(sn, sl)| sn == n && sl >= l))
            .map(|(n, l)| format!("{n} {l:?}").to_lowercase())
            .collect();
        if self.cycle > 1 && !new.is_empty() {
            lines.push(format!(
                "NEW ALARMS since the last cycle: {}",
                new.join(", ")
            ));
        }
        self.seen_alarms = now_alarms;
        lines.join("\n")
    }

    /// Asks the client for a decision; `false` on denial or timeout.
    async fn approval(
        &mut self,
        id: &str,
        name: &str,
        presence: Presence,
    ) -> Result<bool, Interrupt> {
        let reason = format!("`{name}` needs your approval");
        self.state(Activity::WaitingApproval, id, presence, &reason)
            .await?;
        let deadline = Instant::now() + self.limits.approval_timeout;
        loop {
            let input = tokio::select! {
                biased;
                () = self.cancel.cancelled() => return Err(Interrupt::Cancelled),
                input = self.inbox.recv() => input,
                () = tokio::time::sleep_until(deadline) => {
                    tracing::info!(tool_call_id = id, tool = name, "approval timed out; treated as denied");
                    return Ok(false);
                }
            };
            match input {
                Some(TurnInput::Decision {
                    tool_call_id,
                    approved,
                }) if tool_call_id == id => {
                    tracing::info!(
                        tool_call_id = id,
                        tool = name,
                        approved,
                        "permission decision"
                    );
                    return Ok(approved);
                }
                Some(other) => self.ignore(other, id),
                None => return Err(Interrupt::Cancelled),
            }
        }
    }

    fn ignore(&self, input: TurnInput, awaited: &str) {
        match input {
            TurnInput::ToolResult(r) if self.completed.contains(&r.tool_call_id) => {
                tracing::warn!(tool_call_id = %r.tool_call_id, "duplicate ToolResult ignored");
            }
            TurnInput::ToolResult(r) if self.expired.contains(&r.tool_call_id) => {
                tracing::warn!(tool_call_id = %r.tool_call_id, "late ToolResult for a timed-out call ignored");
            }
            TurnInput::ToolResult(r) => {
                tracing::warn!(tool_call_id = %r.tool_call_id, awaited, "ToolResult for an unknown tool_call_id ignored");
            }
            TurnInput::Decision { tool_call_id, .. } => {
                tracing::warn!(%tool_call_id, awaited, "PermissionDecision for a call not awaiting approval ignored");
            }
        }
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

fn error_result(id: &str, name: &str, message: &str) -> Block {
    Block::ToolResult {
        tool_use_id: id.to_string(),
        name: name.to_string(),
        content: message.to_string(),
        is_error: true,
    }
}

/// Everything the client reported reaches the model: output, success, exit
/// code, truncation and duration.
fn describe_outcome(name: &str, outcome: ToolOutcome) -> Block {
    let mut notes = Vec::new();
    if let Some(code) = outcome.exit_code {
        notes.push(format!("exit code {code}"));
    }
    if outcome.truncated {
        notes.push("output truncated".to_string());
    }
    if let Some(ms) = outcome.duration_ms {
        notes.push(format!("took {ms} ms"));
    }
    let mut content = outcome.result;
    if !notes.is_empty() {
        content.push_str(&format!("\n[{}]", notes.join("; ")));
    }
    Block::ToolResult {
        tool_use_id: outcome.tool_call_id,
        name: name.to_string(),
        content,
        is_error: !outcome.success,
    }
}
