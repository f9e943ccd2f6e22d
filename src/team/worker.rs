//! One worker: a headless agent running the same turn engine as a session,
//! with the host tools (and, for a task's lead, the team tools) and no
//! client. This module is the worker's "client": it answers the team tools,
//! turns approvals into the task's `waiting_approval`, and decides how the
//! worker ended. Its I/O loop is one `select!` around the turn.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::state::{FailReason, PendingApproval, StopCause, TeamEvent, WorkerEnd};
use super::{LiveTask, TeamHost};
use crate::config::types::{AiMode, ToolCategory};
use crate::model::{Block, Message};
use crate::ooda::act::Origin;
use crate::session::context::{ContextMeter, History};
use crate::session::tools::ToolRegistry;
use crate::session::turn::{self, TurnInput, TurnLimits, TurnNote, TurnSetup};
use crate::session::{Activity, ErrorCode, ServerEvent, StopReason, ToolOutcome, ToolSpec};

pub(crate) const SPAWN_WORKER: &str = "spawn_worker";
pub(crate) const AWAIT_WORKERS: &str = "await_workers";

/// How long a stopped worker's turn gets to wind down before it is aborted.
const WIND_DOWN: Duration = Duration::from_secs(5);
/// Longest result kept from a worker's final answer.
const MAX_RESULT_CHARS: usize = 4000;

/// What a worker is asked to do.
pub(crate) struct WorkerPlan {
    pub worker_id: String,
    pub prompt: String,
    pub mode: AiMode,
    /// The task's own agent (worker zero): it has the team tools.
    pub lead: bool,
}

/// The team tools of a task's lead, answered by this module, never sent anywhere.
pub(crate) fn team_tools(await_timeout_ms: u32) -> Result<ToolRegistry, String> {
    ToolRegistry::from_specs(
        vec![
            ToolSpec {
                name: SPAWN_WORKER.into(),
                description: "Starts a worker agent on this host with the host tools and the given \
                              prompt; returns its worker_id at once. Collect results with await_workers."
                    .into(),
                parameters_schema: json!({
                    "type": "object",
                    "properties": {
                        "prompt": {"type": "string", "minLength": 1},
                        "ai_mode": {"type": "string", "enum": AiMode::SPELLINGS}
                    },
                    "required": ["prompt"],
                    "additionalProperties": false
                }),
                timeout_ms: 10_000,
                category: ToolCategory::Pure,
            },
            ToolSpec {
                name: AWAIT_WORKERS.into(),
                description: "Waits until the given workers (default: every worker started so far) \
                              have finished; returns each one's status and result or failure reason."
                    .into(),
                parameters_schema: json!({
                    "type": "object",
                    "properties": {
                        "worker_ids": {"type": "array", "items": {"type": "string"}}
                    },
                    "additionalProperties": false
                }),
                timeout_ms: await_timeout_ms,
                category: ToolCategory::Pure,
            },
        ],
        "team tools",
    )
}

fn system_prompt(team: &TeamHost, task: &LiveTask, plan: &WorkerPlan) -> String {
    let host = &team.agent.this_host;
    let mut text = format!(
        "You are worker {} of task {} on rozd host {:?} ({}), environment {:?}. \
         You run headless: no user reads your answers while you work and none will answer \
         questions. Use the host tools; the host enforces limits, timeouts and permissions \
         on every call. End with a short final answer: it is the worker's result.",
        plan.worker_id,
        task.id,
        host.id,
        host.display_name(),
        task.environment_id
    );
    if plan.lead {
        text.push_str(
            " You lead this task: split work with spawn_worker and collect results with \
             await_workers before you answer.",
        );
    }
    // What the host is and its rules, as every session is told.
    text.push_str("\n\n");
    text.push_str(team.agent.briefings.current().text().trim_end());
    text
}

/// Runs one worker to its end. Its actuators are back at their safe values
/// (those it still held) when this returns.
pub(crate) async fn run(team: Arc<TeamHost>, task: Arc<LiveTask>, plan: WorkerPlan) -> WorkerEnd {
    let end = drive(&team, &task, &plan).await;
    let origin = Origin::Session(plan.worker_id.clone());
    let released = team
        .agent
        .ooda
        .actuators()
        .release(&origin, "task worker ended")
        .await;
    if !released.is_empty() {
        tracing::info!(worker_id = %plan.worker_id, ?released, "worker's actuators sent to safe values");
    }
    end
}

async fn drive(team: &Arc<TeamHost>, task: &Arc<LiveTask>, plan: &WorkerPlan) -> WorkerEnd {
    let model = match team.agent.models.resolve(team.settings.model.as_deref()) {
        Ok(model) => model,
        Err(e) => {
            return WorkerEnd::Failed {
                reason: FailReason::ModelError,
                detail: e,
            };
        }
    };
    let tools = if plan.lead {
        let await_ms = u32::try_from(u64::from(task.timeout_secs) * 1000).unwrap_or(u32::MAX);
        match team_tools(await_ms) {
            Ok(tools) => tools,
            Err(e) => {
                tracing::error!(error = %e, "team tool schemas do not compile");
                ToolRegistry::default()
            }
        }
    } else {
        ToolRegistry::default()
    };
    let (notes_tx, mut notes) = mpsc::unbounded_channel();
    let setup = TurnSetup {
        message_id: plan.worker_id.clone(),
        system: system_prompt(team, task, plan),
        tools,
        conversation: History::new(vec![Message::user(vec![Block::Text(plan.prompt.clone())])]),
        permissions: team.agent.permissions.clone(),
        limits: TurnLimits::new(
            &team.agent.limits,
            team.agent.default_max_output_tokens,
            model.as_ref(),
            model
                .max_context_tokens()
                .map_or(team.agent.limits.default_max_context_tokens, |window| {
                    window.min(team.agent.limits.default_max_context_tokens)
                }),
            0,
            true,
        ),
        model,
        meter: ContextMeter::default(),
        live_tokens: Arc::default(),
        host: team
            .agent
            .turn
            .access(
                crate::session::approvals::Asker::Task,
                &plan.worker_id,
                format!("task {} worker {}", task.id, plan.worker_id),
                plan.mode,
                Some(notes_tx),
            )
            .with_credential(task.credential.clone()),
    };
    let (out_tx, mut out) = mpsc::channel(256);
    let (inbox, inbox_rx) = mpsc::channel(64);
    // A child of the task's stop: the turn stops the moment the task does,
    // not when this driver next gets to it.
    let cancel = task.stop.child_token();
    let mut handle = tokio::spawn(turn::run(setup, out_tx, inbox_rx, cancel.clone()));
    let mut driver = Driver {
        team,
        task,
        plan,
        inbox,
        cancel,
        failure: None,
        call_names: HashMap::new(),
        awaiting: FuturesUnordered::new(),
    };
    let mut wind_down = std::pin::pin!(tokio::time::sleep(Duration::MAX / 4));
    let mut winding_down = false;
    let stop = task.stop.clone();
    // Pending events are handled before the turn's end (biased, end last):
    // a turn's last words arrive before its join handle resolves.
    let joined = loop {
        tokio::select! {
            biased;
            Some(note) = notes.recv() => driver.note(note).await,
            Some(event) = out.recv() => driver.event(event).await,
            Some(outcome) = driver.awaiting.next(), if !driver.awaiting.is_empty() => {
                let _ = driver.inbox.send(TurnInput::ToolResult(outcome)).await;
            }
            // The task stopping, or the driver itself (a safety error),
            // cancels the turn, which then gets WIND_DOWN to finish.
            () = stop.cancelled(), if !winding_down => {
                driver.cancel.cancel();
                winding_down = true;
                wind_down.as_mut().reset(tokio::time::Instant::now() + WIND_DOWN);
            }
            () = driver.cancel.cancelled(), if !winding_down => {
                winding_down = true;
                wind_down.as_mut().reset(tokio::time::Instant::now() + WIND_DOWN);
            }
            () = &mut wind_down, if winding_down => {
                tracing::error!(worker_id = %plan.worker_id, "worker's turn did not wind down in time; aborted");
                handle.abort();
                break (&mut handle).await;
            }
            joined = &mut handle => break joined,
        }
    };
    driver.end(joined)
}

struct Driver<'a> {
    team: &'a Arc<TeamHost>,
    task: &'a Arc<LiveTask>,
    plan: &'a WorkerPlan,
    inbox: mpsc::Sender<TurnInput>,
    cancel: CancellationToken,
    failure: Option<(FailReason, String)>,
    call_names: HashMap<String, (String, serde_json::Value)>,
    /// `await_workers` calls in progress.
    awaiting: FuturesUnordered<BoxFuture<'static, ToolOutcome>>,
}

impl Driver<'_> {
    async fn note(&mut self, note: TurnNote) {
        match note {
            TurnNote::Cycle(n) => {
                self.task
                    .publish(
                        self.team,
                        TeamEvent::Phase {
                            worker_id: self.plan.worker_id.clone(),
                            phase: n,
                            mode: self.plan.mode.as_str().to_string(),
                        },
                    )
                    .await;
            }
            TurnNote::ToolCall {
                id,
                name,
                parameters,
            } => {
                self.call_names.insert(id, (name.clone(), parameters));
                self.task
                    .publish(
                        self.team,
                        TeamEvent::ToolCall {
                            worker_id: self.plan.worker_id.clone(),
                            tool: name,
                        },
                    )
                    .await;
            }
        }
    }

    async fn event(&mut self, event: ServerEvent) {
        match event {
            ServerEvent::ToolRequest {
                tool_call_id,
                tool_name,
                parameters,
                ..
            } => self.team_tool(tool_call_id, &tool_name, parameters).await,
            ServerEvent::Activity {
                state: Activity::WaitingApproval,
                detail,
            } => {
                let (tool, parameters) = self.call_names.get(&detail).cloned().unwrap_or_default();
                self.task
                    .approval_waiting(
                        self.team,
                        PendingApproval {
                            tool_call_id: detail.clone(),
                            call_id: detail,
                            worker_id: self.plan.worker_id.clone(),
                            tool,
                            parameters,
                        },
                        self.inbox.clone(),
                    )
                    .await;
            }
            // Any other activity means no call of this worker waits any
            // more (an approval that timed out was denied by the turn).
            ServerEvent::Activity { .. } => {
                self.task
                    .approvals_done(self.team, &self.plan.worker_id)
                    .await
            }
            ServerEvent::Error(e) => {
                let reason = match e.code {
                    ErrorCode::EStop => Some(FailReason::EStop),
                    ErrorCode::SafetyViolation => Some(FailReason::SafetyViolation),
                    _ => None,
                };
                tracing::info!(worker_id = %self.plan.worker_id, code = e.code.as_str(), message = %e.message, "worker error");
                // A headless agent that hits the host's limits stops: no
                // one is there to tell it otherwise.
                if let Some(reason) = reason
                    && self.failure.is_none()
                {
                    self.failure = Some((reason, e.message));
                    self.cancel.cancel();
                }
            }
            _ => {}
        }
    }

    /// Answers `spawn_worker` at once; `await_workers` when its workers end.
    async fn team_tool(&mut self, id: String, name: &str, parameters: Value) {
        let reply = |success: bool, result: Value| ToolOutcome {
            tool_call_id: id.clone(),
            success,
            result: result.to_string(),
            exit_code: None,
            truncated: false,
            duration_ms: None,
        };
        let outcome = match name {
            SPAWN_WORKER if self.plan.lead => {
                let prompt = parameters
                    .get("prompt")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                let mode = match parameters.get("ai_mode").and_then(Value::as_str) {
                    None => Ok(self.team.settings.ai_mode),
                    Some(text) => AiMode::parse(text).ok_or_else(|| {
                        format!("ai_mode {text:?} is not one of {}", AiMode::EXPECTED)
                    }),
                };
                match mode
                    .and_then(|mode| super::start_worker(self.team, self.task, prompt, mode, false))
                {
                    Ok(worker_id) => reply(true, json!({ "worker_id": worker_id })),
                    Err(why) => reply(false, json!({ "error": why })),
                }
            }
            AWAIT_WORKERS if self.plan.lead => {
                let wanted: Option<Vec<String>> = parameters
                    .get("worker_ids")
                    .and_then(Value::as_array)
                    .map(|ids| {
                        ids.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_string)
                            .collect()
                    });
                match self.task.worker_ends(wanted, &self.plan.worker_id) {
                    Ok(ends) => {
                        let id = id.clone();
                        self.awaiting.push(Box::pin(async move {
                            let mut results = Vec::with_capacity(ends.len());
                            for (worker_id, mut end) in ends {
                                let finished = end.wait_for(Option::is_some).await;
                                let value = match finished {
                                    Ok(end) => end.as_ref().map(|e| e.to_json(&worker_id)),
                                    Err(_) => None,
                                };
                                results.push(value.unwrap_or_else(
                                    || json!({"worker_id": worker_id, "status": "unknown"}),
                                ));
                            }
                            ToolOutcome {
                                tool_call_id: id,
                                success: true,
                                result: Value::Array(results).to_string(),
                                exit_code: None,
                                truncated: false,
                                duration_ms: None,
                            }
                        }));
                        return;
                    }
                    Err(why) => reply(false, json!({ "error": why })),
                }
            }
            other => reply(
                false,
                json!({ "error": format!("`{other}` is not a tool of this worker") }),
            ),
        };
        let _ = self.inbox.send(TurnInput::ToolResult(outcome)).await;
    }

    fn end(self, joined: Result<turn::TurnOutcome, tokio::task::JoinError>) -> WorkerEnd {
        let outcome = match joined {
            Ok(outcome) => outcome,
            Err(e) => {
                tracing::error!(worker_id = %self.plan.worker_id, error = %e, "worker's turn failed");
                return WorkerEnd::Failed {
                    reason: FailReason::ModelError,
                    detail: "the worker failed inside rozd".into(),
                };
            }
        };
        if let Some((reason, detail)) = self.failure {
            return WorkerEnd::Failed { reason, detail };
        }
        if let Some(cause) = self.task.stopping() {
            return match cause.worker_failure() {
                Some(reason) => WorkerEnd::Failed {
                    reason,
                    detail: describe_cause(&cause),
                },
                None => WorkerEnd::Cancelled,
            };
        }
        match outcome.stop_reason {
            StopReason::EndTurn | StopReason::MaxTokens | StopReason::MaxCycles => {
                let text = final_answer(&outcome.added);
                let text = text.trim();
                let result: String = if text.is_empty() {
                    format!("(no answer; stop reason {})", outcome.stop_reason.as_str())
                } else {
                    text.chars().take(MAX_RESULT_CHARS).collect()
                };
                WorkerEnd::Completed(result)
            }
            StopReason::Error => {
                let (reason, detail) = match outcome.error {
                    Some(e) => (
                        match e.code {
                            ErrorCode::EStop => FailReason::EStop,
                            ErrorCode::SafetyViolation => FailReason::SafetyViolation,
                            _ => FailReason::ModelError,
                        },
                        e.message,
                    ),
                    None => (FailReason::ModelError, "the turn failed".into()),
                };
                WorkerEnd::Failed { reason, detail }
            }
            StopReason::Cancelled => WorkerEnd::Cancelled,
        }
    }
}

/// The text of the model's last answer: the worker's result.
fn final_answer(messages: &[Message]) -> String {
    messages
        .iter()
        .rev()
        .find(|m| m.role == crate::model::Role::Assistant)
        .map(|m| {
            m.content
                .iter()
                .filter_map(|b| match b {
                    Block::Text(t) => Some(t.as_str()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("")
        })
        .unwrap_or_default()
}

fn describe_cause(cause: &StopCause) -> String {
    match cause {
        StopCause::Cancelled => "the task was cancelled".into(),
        StopCause::Timeout => "the task's timeout ran out".into(),
        StopCause::EStop(why) => format!("protective stop: {why}"),
        StopCause::Shutdown => "the daemon is shutting down".into(),
        StopCause::LeadFailed(why) => format!("the task's lead failed ({why})"),
    }
}
