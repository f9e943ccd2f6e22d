//! The session's own vocabulary: what a client asks and what the session
//! answers, free of protobuf types (the `api` layer converts at the edge).

use serde_json::Value;

pub use crate::tools::ToolSpec;

#[derive(Debug, Clone, PartialEq)]
pub struct StartRequest {
    pub environment_id: String,
    pub host_id: Option<String>,
    pub model: Option<String>,
    pub tools: Vec<ToolSpec>,
    pub history: Vec<HistoryMessage>,
    pub project_context: Vec<String>,
    pub max_context_tokens: Option<u32>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HistoryMessage {
    pub role: String,
    pub parts: Vec<HistoryPart>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum HistoryPart {
    Text(String),
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
    ToolResult {
        tool_use_id: String,
        name: String,
        content: String,
        is_error: bool,
    },
    Thinking {
        thinking: String,
        signature: String,
    },
    Image {
        media_type: String,
        data: Vec<u8>,
    },
    /// A `ContentPart` with no `part` set: refused when the history is converted.
    Empty,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ContextBlock {
    Text {
        text: String,
        label: Option<String>,
    },
    Binary {
        mime_type: String,
        data: Vec<u8>,
        label: Option<String>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct UserTurn {
    pub content: String,
    pub context: Vec<ContextBlock>,
    pub ai_mode: Option<String>,
    pub message_id: Option<String>,
    pub tools: Vec<ToolSpec>,
    pub system_context: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutcome {
    pub tool_call_id: String,
    pub success: bool,
    pub result: String,
    pub exit_code: Option<i32>,
    pub truncated: bool,
    pub duration_ms: Option<i64>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ClientEvent {
    Start(StartRequest),
    UserMessage(UserTurn),
    ToolResult(ToolOutcome),
    CancelTurn {
        reason: String,
    },
    CancelSession {
        reason: String,
    },
    Ping,
    Feedback {
        session_id: String,
        message_id: String,
        rating: String,
    },
    PermissionDecision {
        tool_call_id: String,
        approved: bool,
    },
    RegisterTools {
        source: Option<String>,
        tools: Vec<ToolSpec>,
        system_context: Option<String>,
    },
}

/// What arrives from the transport: an event, or a message the api layer
/// could not convert (answered with `invalid_argument`, the session goes on).
pub type Inbound = Result<ClientEvent, String>;

/// The effective permission of a tool pattern, as reported in `SessionStarted`.
#[derive(Debug, Clone, PartialEq)]
pub struct PermissionView {
    pub tool_pattern: String,
    pub policy: String,
    pub category: Option<String>,
    pub reason: Option<String>,
}

pub use crate::model::Usage;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    EndTurn,
    MaxTokens,
    MaxCycles,
    Cancelled,
    Error,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::EndTurn => "end_turn",
            StopReason::MaxTokens => "max_tokens",
            StopReason::MaxCycles => "max_cycles",
            StopReason::Cancelled => "cancelled",
            StopReason::Error => "error",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    Full,
    Mini,
    Hidden,
}

impl Presence {
    pub fn as_str(self) -> &'static str {
        match self {
            Presence::Full => "full",
            Presence::Mini => "mini",
            Presence::Hidden => "hidden",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    Thinking,
    CallingTool,
    WaitingApproval,
    Idle,
}

impl Activity {
    pub fn as_str(self) -> &'static str {
        match self {
            Activity::Thinking => "thinking",
            Activity::CallingTool => "calling_tool",
            Activity::WaitingApproval => "waiting_approval",
            Activity::Idle => "idle",
        }
    }
}

/// Stable `SessionError.code` values (documented in docs/reference/errors.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    NoSession,
    AlreadyStarted,
    TurnInProgress,
    NoActiveTurn,
    InvalidArgument,
    Unauthenticated,
    PermissionDenied,
    HostNotFound,
    HostUnavailable,
    UnknownTool,
    ToolTimeout,
    ModelError,
    AgentError,
    EStop,
    SafetyViolation,
    RateLimited,
    BudgetExceeded,
    Internal,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::NoSession => "no_session",
            ErrorCode::AlreadyStarted => "already_started",
            ErrorCode::TurnInProgress => "turn_in_progress",
            ErrorCode::NoActiveTurn => "no_active_turn",
            ErrorCode::InvalidArgument => "invalid_argument",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::HostNotFound => "host_not_found",
            ErrorCode::HostUnavailable => "host_unavailable",
            ErrorCode::UnknownTool => "unknown_tool",
            ErrorCode::ToolTimeout => "tool_timeout",
            ErrorCode::ModelError => "model_error",
            ErrorCode::AgentError => "agent_error",
            ErrorCode::EStop => "e_stop",
            ErrorCode::SafetyViolation => "safety_violation",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::BudgetExceeded => "budget_exceeded",
            ErrorCode::Internal => "internal",
        }
    }

    /// Whether the same request may succeed if sent again later.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::TurnInProgress
                | ErrorCode::HostUnavailable
                | ErrorCode::ToolTimeout
                | ErrorCode::RateLimited
                | ErrorCode::Internal
        )
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SessionError {
    pub code: ErrorCode,
    pub message: String,
    pub retryable: bool,
}

impl SessionError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        SessionError {
            code,
            message: message.into(),
            retryable: code.retryable(),
        }
    }
    pub fn with_retryable(mut self, retryable: bool) -> Self {
        self.retryable = retryable;
        self
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum ServerEvent {
    Started {
        session_id: String,
        model: String,
        permissions: Vec<PermissionView>,
    },
    TextDelta {
        message_id: String,
        content: String,
    },
    ThinkingDelta {
        message_id: String,
        content: String,
    },
    ToolRequest {
        tool_call_id: String,
        tool_name: String,
        parameters: Value,
        timeout_ms: u32,
    },
    TurnComplete {
        message_id: String,
        usage: Usage,
        stop_reason: StopReason,
    },
    Error(SessionError),
    Keepalive {
        tokens_used: Option<u32>,
        tokens_max: Option<u32>,
    },
    Pong,
    ContextCompacted {
        level: String,
        messages_before: u32,
        messages_after: u32,
        tokens_before: u32,
        tokens_after: u32,
        summary: Option<String>,
    },
    Presence {
        level: Presence,
        reason: String,
    },
    Activity {
        state: Activity,
        detail: String,
    },
}
