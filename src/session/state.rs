//! A started session as plain data: identity, model, tools, conversation.
//! Methods validate requests and prepare turns; none of them does I/O.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::config::types::{AiMode, HostConfig};
use crate::model::{self, Block, Message, Model, ModelRegistry};

use super::context::{ContextMeter, History};
use super::embodiment::Briefing;
use super::tools::{RegisterSummary, ToolRegistry};
use super::{
    ContextBlock, ErrorCode, HistoryMessage, HistoryPart, SessionError, StartRequest, ToolSpec,
    UserTurn,
};

/// How many timed-out tool call ids a session remembers, so that their late
/// results are recognised and ignored rather than reported as errors.
const EXPIRED_CALLS_KEPT: usize = 256;

fn invalid(message: impl Into<String>) -> SessionError {
    SessionError::new(ErrorCode::InvalidArgument, message)
}

/// What one session may hold of the client's data (`[session]`
/// `max_session_bytes`, `max_session_tools`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SessionLimits {
    pub max_bytes: u64,
    pub max_tools: u32,
}

impl SessionLimits {
    /// No bound (unit tests of other rules).
    #[cfg(test)]
    pub(crate) const NONE: SessionLimits = SessionLimits {
        max_bytes: u64::MAX,
        max_tools: u32::MAX,
    };

    /// `Ok` when `held` bytes and `tools` tools fit; else `budget_exceeded`
    /// naming the key to raise. `what` says which request asked.
    fn check(self, what: &str, held: u64, tools: usize) -> Result<(), SessionError> {
        if tools > self.max_tools as usize {
            return Err(SessionError::new(
                ErrorCode::BudgetExceeded,
                format!(
                    "{what}: the session would have {tools} client tools, more than \
                     session.max_session_tools ({})",
                    self.max_tools
                ),
            ));
        }
        if held > self.max_bytes {
            return Err(SessionError::new(
                ErrorCode::BudgetExceeded,
                format!(
                    "{what}: the session would hold {held} bytes of history, project context \
                     and tools, more than session.max_session_bytes ({})",
                    self.max_bytes
                ),
            ));
        }
        Ok(())
    }
}

/// Bytes of a tool's definition as the client sent it.
pub(crate) fn tool_bytes(spec: &ToolSpec) -> u64 {
    (spec.name.len() + spec.description.len() + spec.parameters_schema.to_string().len()) as u64
}

/// Bytes of a history as the client sent it.
fn history_bytes(history: &[HistoryMessage]) -> u64 {
    let part = |p: &HistoryPart| -> usize {
        match p {
            HistoryPart::Text(t) => t.len(),
            HistoryPart::ToolUse { id, name, input } => {
                id.len() + name.len() + input.to_string().len()
            }
            HistoryPart::ToolResult {
                tool_use_id,
                name,
                content,
                ..
            } => tool_use_id.len() + name.len() + content.len(),
            HistoryPart::Thinking {
                thinking,
                signature,
            } => thinking.len() + signature.len(),
            HistoryPart::Image { media_type, data } => media_type.len() + data.len(),
            HistoryPart::Empty => 0,
        }
    };
    history
        .iter()
        .map(|m| (m.role.len() + m.parts.iter().map(part).sum::<usize>()) as u64)
        .sum()
}

#[derive(Debug)]
pub(crate) struct Session {
    pub id: String,
    pub environment_id: String,
    pub model: Arc<dyn Model>,
    pub tools: ToolRegistry,
    /// `RegisterTools.system_context` by source ("" when no source was given).
    guidance: BTreeMap<String, String>,
    /// The embodiment and manual this session was told at its start (a
    /// reloaded manual reaches only sessions started after).
    pub briefing: Arc<Briefing>,
    project_context: Vec<String>,
    pub conversation: History,
    /// `max_context_tokens` of this session, capped by the model's window.
    pub context_budget: u32,
    pub turns_done: u32,
    /// Tokens spent by every model call of the session so far.
    pub tokens_spent: u64,
    /// Estimates calibrated by the provider's usage reports.
    pub meter: ContextMeter,
    /// The context's current size, kept live by a running turn.
    pub live_tokens: Arc<AtomicU32>,
    expired_calls: VecDeque<String>,
    limits: SessionLimits,
    /// Bytes of the history given at the start (the conversation then
    /// grows within the context budget, which compaction enforces).
    history_bytes: u64,
}

/// Everything a turn needs, prepared from the session and the `UserMessage`.
#[derive(Debug)]
pub(crate) struct TurnPlan {
    pub message_id: String,
    pub ai_mode: AiMode,
    pub user_content: String,
    pub system: String,
    /// The tools of this turn: `UserMessage.tools` when given, else the session's.
    pub tools: ToolRegistry,
    pub user_message: Message,
}

impl Session {
    /// Validates a `StartSession` and builds the session.
    pub(crate) fn start(
        request: StartRequest,
        briefing: Arc<Briefing>,
        host: &HostConfig,
        models: &ModelRegistry,
        default_budget: u32,
        limits: SessionLimits,
    ) -> Result<Session, SessionError> {
        if let Some(target) = request.host_id.as_deref().filter(|h| !h.is_empty())
            && target != host.id
        {
            return Err(SessionError::new(
                ErrorCode::HostNotFound,
                format!(
                    "host {target:?} is not this host ({:?}); a stream whose StartSession was \
                     handled here stays here: open a new stream for {target:?}",
                    host.id
                ),
            ));
        }
        // Before anything is built from them: the bounds on what it holds.
        let history_bytes = history_bytes(&request.history);
        let context_bytes: u64 = request.project_context.iter().map(|c| c.len() as u64).sum();
        let tool_bytes: u64 = request.tools.iter().map(tool_bytes).sum();
        limits.check(
            "StartSession",
            history_bytes + context_bytes + tool_bytes,
            request.tools.len(),
        )?;
        let model = models.resolve(request.model.as_deref()).map_err(invalid)?;
        let tools = ToolRegistry::from_specs(request.tools, "start.tools").map_err(invalid)?;
        let context_budget = match request.max_context_tokens {
            Some(0) => return Err(invalid("start.max_context_tokens must be greater than 0")),
            Some(n) => n,
            None => default_budget,
        };
        // A model with a smaller window bounds the budget.
        let context_budget = model
            .max_context_tokens()
            .map_or(context_budget, |window| context_budget.min(window));
        let conversation = History::new(convert_history(request.history)?);
        let live_tokens = Arc::new(AtomicU32::new(conversation.tokens()));
        Ok(Session {
            id: uuid::Uuid::new_v4().to_string(),
            environment_id: if request.environment_id.is_empty() {
                host.environment_id.clone()
            } else {
                request.environment_id
            },
            model,
            tools,
            guidance: BTreeMap::new(),
            briefing,
            project_context: request.project_context,
            conversation,
            context_budget,
            turns_done: 0,
            tokens_spent: 0,
            meter: ContextMeter::default(),
            live_tokens,
            expired_calls: VecDeque::new(),
            limits,
            history_bytes,
        })
    }

    /// The client data the session holds: history given at the start,
    /// project context, registered tools and their system contexts.
    fn held_bytes(&self, tools: &ToolRegistry, guidance: &BTreeMap<String, String>) -> u64 {
        let context: u64 = self.project_context.iter().map(|c| c.len() as u64).sum();
        let guidance: u64 = guidance.values().map(|g| g.len() as u64).sum();
        self.history_bytes + context + tools.bytes() + guidance
    }

    pub(crate) fn register_tools(
        &mut self,
        source: Option<String>,
        tools: Vec<ToolSpec>,
        system_context: Option<String>,
    ) -> Result<RegisterSummary, SessionError> {
        // All or nothing: built aside, kept only within the bounds.
        let mut next_tools = self.tools.clone();
        let summary = next_tools
            .register(source.as_deref(), tools)
            .map_err(invalid)?;
        let mut next_guidance = self.guidance.clone();
        let key = source.unwrap_or_default();
        match system_context {
            Some(text) if !text.trim().is_empty() => {
                next_guidance.insert(key, text);
            }
            // Unregistering a source's tools drops its guidance too.
            _ if summary.added == 0 => {
                next_guidance.remove(&key);
            }
            _ => {}
        }
        self.limits.check(
            "RegisterTools",
            self.held_bytes(&next_tools, &next_guidance),
            next_tools.len(),
        )?;
        self.tools = next_tools;
        self.guidance = next_guidance;
        Ok(summary)
    }

    /// Validates a `UserMessage` and prepares its turn.
    pub(crate) fn plan_turn(
        &self,
        turn: UserTurn,
        host: &HostConfig,
    ) -> Result<TurnPlan, SessionError> {
        // Sessions that target this host default to ooda_re_act.
        let ai_mode = match turn.ai_mode.as_deref() {
            None | Some("") => AiMode::OodaReAct,
            Some(text) => AiMode::parse(text).ok_or_else(|| {
                invalid(format!(
                    "user_message.ai_mode {text:?} is not one of {}",
                    AiMode::EXPECTED
                ))
            })?,
        };
        if let Some(id) = &turn.message_id
            && id.is_empty()
        {
            return Err(invalid(
                "user_message.message_id must not be empty when present",
            ));
        }
        let tools = if turn.tools.is_empty() {
            self.tools.clone()
        } else {
            // This turn's tools stand in for the session's: the same bounds.
            let replaced = turn.tools.iter().map(tool_bytes).sum::<u64>();
            let held = self.held_bytes(&ToolRegistry::default(), &self.guidance) + replaced;
            self.limits.check("UserMessage", held, turn.tools.len())?;
            ToolRegistry::from_specs(turn.tools, "user_message.tools").map_err(invalid)?
        };
        let mut content = vec![Block::Text(turn.content.clone())];
        for block in turn.context {
            content.push(context_block(block));
        }
        Ok(TurnPlan {
            message_id: turn
                .message_id
                .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
            ai_mode,
            user_content: turn.content,
            system: self.system_prompt(host, turn.system_context.as_deref()),
            tools,
            user_message: Message::user(content),
        })
    }

    fn system_prompt(&self, host: &HostConfig, turn_context: Option<&str>) -> String {
        let mut parts = vec![format!(
            "You are an agent session on rozd host {:?} ({}), environment {:?}. \
             The host enforces limits, timeouts and permissions on every tool call.",
            host.id,
            host.display_name(),
            self.environment_id
        )];
        // What the host is and its rules come before what the client adds.
        parts.push(self.briefing.text().trim_end().to_string());
        parts.extend(self.project_context.iter().cloned());
        parts.extend(self.guidance.values().cloned());
        if let Some(text) = turn_context.filter(|t| !t.trim().is_empty()) {
            parts.push(text.to_string());
        }
        parts.join("\n\n")
    }

    pub(crate) fn remember_expired(&mut self, ids: impl IntoIterator<Item = String>) {
        for id in ids {
            if self.expired_calls.len() == EXPIRED_CALLS_KEPT {
                self.expired_calls.pop_front();
            }
            self.expired_calls.push_back(id);
        }
    }

    pub(crate) fn is_expired(&self, tool_call_id: &str) -> bool {
        self.expired_calls.iter().any(|id| id == tool_call_id)
    }

    /// The context's size in tokens (for `Keepalive`): the last request and
    /// answer as the provider counted them, or estimated, updated live while
    /// a turn runs.
    pub(crate) fn tokens_used(&self) -> u32 {
        self.live_tokens.load(Ordering::Relaxed)
    }
}

fn context_block(block: ContextBlock) -> Block {
    match block {
        ContextBlock::Text { text, label } => Block::Text(match label {
            Some(label) => format!("[{label}]\n{text}"),
            None => text,
        }),
        ContextBlock::Binary {
            mime_type, data, ..
        } if mime_type.starts_with("image/") => Block::Image {
            media_type: mime_type,
            data,
        },
        ContextBlock::Binary {
            mime_type,
            data,
            label,
        } => {
            let label = label.map(|l| format!("[{l}] ")).unwrap_or_default();
            match String::from_utf8(data) {
                Ok(text) if is_textual(&mime_type) => {
                    Block::Text(format!("{label}({mime_type})\n{text}"))
                }
                Ok(text) => Block::Text(format!("{label}({mime_type}, {} bytes)", text.len())),
                Err(e) => Block::Text(format!(
                    "{label}({mime_type}, {} bytes of binary data)",
                    e.as_bytes().len()
                )),
            }
        }
    }
}

fn is_textual(mime: &str) -> bool {
    mime.starts_with("text/")
        || matches!(
            mime,
            "application/json" | "application/xml" | "application/yaml" | "application/toml"
        )
}

/// Converts `StartSession.history`; anything that cannot be represented is
/// an `invalid_argument` naming its index, never silently dropped.
fn convert_history(history: Vec<HistoryMessage>) -> Result<Vec<Message>, SessionError> {
    let mut out = Vec::with_capacity(history.len());
    for (i, message) in history.into_iter().enumerate() {
        let role = match message.role.as_str() {
            "user" => model::Role::User,
            "assistant" => model::Role::Assistant,
            other => {
                return Err(invalid(format!(
                    "start.history[{i}].role {other:?} is not \"user\" or \"assistant\""
                )));
            }
        };
        if message.parts.is_empty() {
            return Err(invalid(format!("start.history[{i}] has no parts")));
        }
        let mut content = Vec::with_capacity(message.parts.len());
        for (j, part) in message.parts.into_iter().enumerate() {
            let at = || format!("start.history[{i}].parts[{j}]");
            let block = match (part, role) {
                (HistoryPart::Empty, _) => {
                    return Err(invalid(format!("{} has no part set", at())));
                }
                (HistoryPart::Text(t), _) => Block::Text(t),
                (HistoryPart::ToolUse { id, name, input }, model::Role::Assistant) => {
                    if id.is_empty() || name.is_empty() {
                        return Err(invalid(format!(
                            "{}: tool_use needs an id and a name",
                            at()
                        )));
                    }
                    Block::ToolUse { id, name, input }
                }
                (
                    HistoryPart::ToolResult {
                        tool_use_id,
                        name,
                        content,
                        is_error,
                    },
                    model::Role::User,
                ) => {
                    if tool_use_id.is_empty() {
                        return Err(invalid(format!(
                            "{}: tool_result needs a tool_use_id",
                            at()
                        )));
                    }
                    Block::ToolResult {
                        tool_use_id,
                        name,
                        content,
                        is_error,
                    }
                }
                (
                    HistoryPart::Thinking {
                        thinking,
                        signature,
                    },
                    model::Role::Assistant,
                ) => Block::Thinking {
                    text: thinking,
                    signature,
                },
                (HistoryPart::Image { media_type, data }, model::Role::User) => {
                    if !media_type.starts_with("image/") {
                        return Err(invalid(format!(
                            "{}: image media_type {media_type:?} is not image/*",
                            at()
                        )));
                    }
                    Block::Image { media_type, data }
                }
                (part, _) => {
                    return Err(invalid(format!(
                        "{}: a {} part cannot appear in a {:?} message",
                        at(),
                        part_name(&part),
                        message.role
                    )));
                }
            };
            content.push(block);
        }
        out.push(Message { role, content });
    }
    Ok(out)
}

fn part_name(part: &HistoryPart) -> &'static str {
    match part {
        HistoryPart::Text(_) => "text",
        HistoryPart::ToolUse { .. } => "tool_use",
        HistoryPart::ToolResult { .. } => "tool_result",
        HistoryPart::Thinking { .. } => "thinking",
        HistoryPart::Image { .. } => "image",
        HistoryPart::Empty => "empty",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> HostConfig {
        HostConfig {
            id: "h1".into(),
            name: None,
            environment_id: "env".into(),
        }
    }

    fn models() -> ModelRegistry {
        ModelRegistry::from_config(&crate::model::config::ModelConfig::default())
    }

    fn start(request: StartRequest) -> Result<Session, SessionError> {
        Session::start(
            request,
            super::super::embodiment::test_briefing(Some("Never enter the kitchen.")),
            &host(),
            &models(),
            10_000,
            SessionLimits::NONE,
        )
    }

    fn request() -> StartRequest {
        StartRequest {
            environment_id: String::new(),
            host_id: None,
            model: None,
            tools: vec![],
            history: vec![],
            project_context: vec![],
            max_context_tokens: None,
        }
    }

    #[test]
    fn host_id_must_be_this_host() {
        let mut r = request();
        r.host_id = Some("h1".into());
        assert!(start(r.clone()).is_ok());
        r.host_id = Some("other".into());
        let e = start(r).unwrap_err();
        assert_eq!((e.code, e.retryable), (ErrorCode::HostNotFound, false));
    }

    #[test]
    fn unknown_model_lists_known_ones() {
        let mut r = request();
        r.model = Some("gpt-99".into());
        let e = start(r).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArgument);
        assert!(e.message.contains("local"), "{}", e.message);
    }

    #[test]
    fn history_errors_name_the_index() {
        let mut r = request();
        r.history = vec![
            HistoryMessage {
                role: "user".into(),
                parts: vec![HistoryPart::Text("hi".into())],
            },
            HistoryMessage {
                role: "assistant".into(),
                parts: vec![HistoryPart::Text("a".into()), HistoryPart::Empty],
            },
        ];
        let e = start(r.clone()).unwrap_err();
        assert!(
            e.message.contains("start.history[1].parts[1]"),
            "{}",
            e.message
        );
        r.history[1].parts[1] = HistoryPart::Image {
            media_type: "image/png".into(),
            data: vec![1],
        };
        let e = start(r.clone()).unwrap_err();
        assert!(
            e.message.contains("start.history[1].parts[1]") && e.message.contains("image"),
            "{}",
            e.message
        );
        r.history[1].role = "robot".into();
        assert!(
            start(r)
                .unwrap_err()
                .message
                .contains("start.history[1].role")
        );
    }

    #[test]
    fn history_and_project_context_reach_the_model_input() {
        let mut r = request();
        r.project_context = vec!["first block".into(), "second block".into()];
        r.history = vec![HistoryMessage {
            role: "user".into(),
            parts: vec![HistoryPart::Text("earlier".into())],
        }];
        let s = start(r).unwrap();
        assert_eq!(
            s.conversation.messages(),
            [Message::user(vec![Block::Text("earlier".into())])]
        );
        let plan = s
            .plan_turn(
                UserTurn {
                    content: "now".into(),
                    context: vec![],
                    ai_mode: None,
                    message_id: None,
                    tools: vec![],
                    system_context: Some("turn only".into()),
                },
                &host(),
            )
            .unwrap();
        let first = plan.system.find("first block").unwrap();
        let second = plan.system.find("second block").unwrap();
        assert!(first < second && plan.system.contains("turn only"));
        // The embodiment and the manual come before the client's context.
        let embodiment = plan.system.find("# This robot: host `rover-1`").unwrap();
        let manual = plan.system.find("Never enter the kitchen.").unwrap();
        assert!(embodiment < manual && manual < first, "{}", plan.system);
        assert_eq!(plan.ai_mode, AiMode::OodaReAct);
        assert!(uuid::Uuid::parse_str(&plan.message_id).is_ok());
    }
}
