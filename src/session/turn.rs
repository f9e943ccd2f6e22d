//! One turn: model calls and tool calls until the model ends the turn, the
//! cycle limit is reached, an error stops it, or it is cancelled.
//!
//! The turn runs as a child task of the session. It streams deltas, tool
//! requests and activity straight to the client; it never sends
//! `TurnComplete` itself — it returns a [`TurnOutcome`] and the session loop
//! clears the active turn before it sends `TurnComplete`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::{Policy, ToolCategory};
use crate::model::{self, Block, Message, Model, ModelEvent, ModelRequest, ModelStop, Usage};

use super::permissions::PermissionPolicy;
use super::tools::ToolRegistry;
use super::{Activity, ErrorCode, Presence, ServerEvent, SessionError, StopReason, ToolOutcome};

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
    pub context_budget: u32,
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
}

#[derive(Debug)]
pub struct TurnOutcome {
    pub conversation: Vec<Message>,
    pub usage: Usage,
    pub stop_reason: StopReason,
    /// An error the client is told about before `TurnComplete`.
    pub error: Option<SessionError>,
    /// Tool calls that timed out; their late results are ignored.
    pub expired_calls: Vec<String>,
    /// Messages dropped from the front of the conversation by compaction.
    pub dropped_messages: usize,
}

/// Why the turn stopped early.
enum Interrupt {
    /// `CancelTurn`, `CancelSession`, disconnect or shutdown.
    Cancelled,
    /// The client's response stream is gone.
    ClientGone,
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
    /// Messages dropped from the front of the conversation to fit the budget.
    dropped: usize,
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
    } = setup;
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
        dropped: 0,
    };
    let mut usage = Usage::default();
    let result = turn
        .cycles(model.as_ref(), &system, &mut conversation, &mut usage)
        .await;
    let (stop_reason, error) = match result {
        Ok(stop) => (stop, None),
        Err(TurnError::Interrupted(Interrupt::Cancelled)) => (StopReason::Cancelled, None),
        Err(TurnError::Interrupted(Interrupt::ClientGone)) => {
            tracing::info!("client stream closed during the turn");
            (StopReason::Cancelled, None)
        }
        Err(TurnError::Failed(e)) => (StopReason::Error, Some(e)),
    };
    TurnOutcome {
        conversation,
        usage,
        stop_reason,
        error,
        expired_calls: turn.expired,
        dropped_messages: turn.dropped,
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
        for _cycle in 0..self.limits.max_cycles {
            self.state(
                Activity::Thinking,
                "",
                Presence::Mini,
                "the model is thinking",
            )
            .await?;
            let mut request = ModelRequest {
                system: system.to_string(),
                messages: conversation.clone(),
                tools: self.tools.definitions(),
                max_output_tokens: self.limits.max_output_tokens,
            };
            self.fit_budget(&mut request, conversation, &mut turn_start)
                .await?;
            let reply = self.call_model(model, request).await?;
            usage.add(reply.usage);
            let calls: Vec<(String, String, Value)> = reply
                .blocks
                .iter()
                .filter_map(|b| match b {
                    Block::ToolUse { id, name, input } => {
                        Some((id.clone(), name.clone(), input.clone()))
                    }
                    _ => None,
                })
                .collect();
            if !reply.blocks.is_empty() {
                conversation.push(Message::assistant(reply.blocks));
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
            conversation.push(Message::user(results));
            if let Some(i) = interrupted {
                return Err(i.into());
            }
        }
        Ok(StopReason::MaxCycles)
    }

    /// Keeps the request inside the context budget by dropping the oldest
    /// whole turns (never the current one), telling the client what it did.
    async fn fit_budget(
        &mut self,
        request: &mut ModelRequest,
        conversation: &mut Vec<Message>,
        turn_start: &mut usize,
    ) -> Result<(), TurnError> {
        let budget = self.limits.context_budget;
        let tokens_before = request.estimate_tokens();
        if tokens_before <= budget {
            return Ok(());
        }
        let messages_before = conversation.len();
        // Turn boundaries: user messages that carry the user's own text.
        let mut cut = 0;
        while request.estimate_tokens() > budget {
            let next_boundary = (cut + 1..=*turn_start).find(|&i| {
                conversation[i].role == model::Role::User
                    && conversation[i]
                        .content
                        .iter()
                        .any(|b| matches!(b, Block::Text(_)))
            });
            let Some(boundary) = next_boundary else { break };
            cut = boundary;
            request.messages = conversation[cut..].to_vec();
        }
        if cut > 0 {
            conversation.drain(..cut);
            *turn_start -= cut;
            self.dropped += cut;
            let tokens_after = request.estimate_tokens();
            self.send(ServerEvent::ContextCompacted {
                level: "truncate".into(),
                messages_before: u32::try_from(messages_before).unwrap_or(u32::MAX),
                messages_after: u32::try_from(conversation.len()).unwrap_or(u32::MAX),
                tokens_before,
                tokens_after,
                summary: Some(format!(
                    "dropped the {cut} oldest message(s) to fit {budget} tokens"
                )),
            })
            .await?;
        }
        let tokens = request.estimate_tokens();
        if tokens > budget {
            return Err(TurnError::Failed(SessionError::new(
                ErrorCode::BudgetExceeded,
                format!(
                    "this turn needs about {tokens} tokens of context, more than the budget of {budget}"
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
        let (mut text, mut thinking) = (String::new(), String::new());
        let mut stopped = false;
        loop {
            let event = tokio::select! {
                event = stream.next() => event,
                () = self.cancel.cancelled() => return Err(Interrupt::Cancelled.into()),
            };
            match event {
                None => break,
                Some(Err(e)) => {
                    return Err(TurnError::Failed(
                        SessionError::new(
                            ErrorCode::ModelError,
                            format!("model {}: {e}", model.name()),
                        )
                        .with_retryable(e.retryable),
                    ));
                }
                Some(Ok(ModelEvent::TextDelta(delta))) => {
                    text.push_str(&delta);
                    let message_id = self.message_id.clone();
                    self.send(ServerEvent::TextDelta {
                        message_id,
                        content: delta,
                    })
                    .await?;
                }
                Some(Ok(ModelEvent::ThinkingDelta(delta))) => {
                    thinking.push_str(&delta);
                    let message_id = self.message_id.clone();
                    self.send(ServerEvent::ThinkingDelta {
                        message_id,
                        content: delta,
                    })
                    .await?;
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
        let mut blocks = Vec::new();
        if !thinking.is_empty() {
            blocks.push(Block::Thinking {
                text: thinking,
                signature: String::new(),
            });
        }
        if !text.is_empty() {
            blocks.push(Block::Text(text));
        }
        blocks.append(&mut reply.blocks);
        reply.blocks = blocks;
        Ok(reply)
    }

    /// Runs one tool call of the model: look-up, validation, permission,
    /// approval, then the client round trip under the tool's deadline.
    async fn tool_call(&mut self, id: &str, name: &str, input: Value) -> Result<Block, Interrupt> {
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
                () = self.cancel.cancelled() => return Err(Interrupt::Cancelled),
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
                input = self.inbox.recv() => input,
                () = tokio::time::sleep_until(deadline) => {
                    tracing::info!(tool_call_id = id, tool = name, "approval timed out; treated as denied");
                    return Ok(false);
                }
                () = self.cancel.cancelled() => return Err(Interrupt::Cancelled),
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

    async fn send(&self, event: ServerEvent) -> Result<(), Interrupt> {
        tokio::select! {
            sent = self.out.send(event) => sent.map_err(|_| Interrupt::ClientGone),
            () = self.cancel.cancelled() => Err(Interrupt::Cancelled),
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
