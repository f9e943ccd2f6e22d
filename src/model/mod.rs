//! Language models behind one streaming trait. The session engine speaks only
//! this trait; providers plug in without touching it: the offline `local`
//! command model, the Anthropic Messages API ([`anthropic`]) and
//! OpenAI-compatible Chat Completions servers ([`openai`]). Nothing here
//! knows gRPC.

pub(crate) mod anthropic;
pub(crate) mod check;
pub(crate) mod config;
pub mod decode;
mod http;
pub mod local;
pub(crate) mod metrics;
pub(crate) mod openai;
pub mod sse;
pub(crate) mod tokens;

use std::fmt;
use std::sync::Arc;

use futures_util::stream::BoxStream;
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    User,
    Assistant,
}

/// One block of a conversation message.
#[derive(Debug, Clone, PartialEq)]
pub enum Block {
    Text(String),
    /// Extended thinking; `signature` is the provider's proof of it (Anthropic),
    /// sent back unchanged in later requests. Empty when the model gave none.
    Thinking {
        text: String,
        signature: String,
    },
    /// Thinking the provider encrypted (Anthropic `redacted_thinking`): opaque,
    /// sent back unchanged.
    RedactedThinking {
        data: String,
    },
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
    /// An image. In a user message, images that directly follow a
    /// `ToolResult` are that result's (a host tool that answers with a
    /// picture, `capture_image`): Anthropic gets them inside the
    /// `tool_result`, OpenAI-compatible servers in a user message after the
    /// tool messages.
    Image {
        media_type: String,
        data: Vec<u8>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: Role,
    pub content: Vec<Block>,
}

impl Message {
    pub fn user(content: Vec<Block>) -> Self {
        Message {
            role: Role::User,
            content,
        }
    }
    pub fn assistant(content: Vec<Block>) -> Self {
        Message {
            role: Role::Assistant,
            content,
        }
    }
}

/// A tool as the model sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDef {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelRequest {
    pub system: String,
    /// Shared with the turn's conversation: a model call does not copy the
    /// conversation (it grows with every call); the turn's next message
    /// copies it only if a provider still holds the request then.
    pub messages: Arc<Vec<Message>>,
    /// Shared with the turn: its tools do not change between its model calls.
    pub tools: Arc<Vec<ToolDef>>,
    pub max_output_tokens: u32,
    /// The caller's estimate of this request's input tokens, when it keeps
    /// one up to date (a turn does, as messages are added); equal to
    /// [`ModelRequest::estimate_tokens`]. See [`ModelRequest::input_tokens`].
    pub estimated_input_tokens: Option<u32>,
    /// The tool the model must call (`tool_choice`); `None`: the model
    /// chooses. Sessions never force one; the model check does.
    pub tool_choice: Option<String>,
}

impl ModelRequest {
    /// Estimated input tokens of the whole request: the caller's running
    /// estimate if it has one, else a pass over the request (which grows
    /// with the conversation).
    pub fn input_tokens(&self) -> u32 {
        self.estimated_input_tokens
            .unwrap_or_else(|| self.estimate_tokens())
    }

    /// Estimated input tokens of the whole request, counted afresh.
    pub fn estimate_tokens(&self) -> u32 {
        self.estimate_tokens_with_tools(estimate_tools_tokens(&self.tools))
    }

    /// [`ModelRequest::estimate_tokens`] with the tools' share already
    /// known (it does not change during a turn, and serialising every
    /// schema again for each model call was most of the estimate's cost).
    pub fn estimate_tokens_with_tools(&self, tools_tokens: u32) -> u32 {
        let mut total = tokens::count(&self.system);
        for m in self.messages.iter() {
            total = total.saturating_add(estimate_message_tokens(m));
        }
        total.saturating_add(tools_tokens)
    }
}

/// Estimated tokens of tool definitions as a request carries them.
pub fn estimate_tools_tokens(tools: &[ToolDef]) -> u32 {
    tools
        .iter()
        .map(estimate_tool_tokens)
        .fold(0u32, u32::saturating_add)
}

/// Estimated tokens of one tool definition.
pub fn estimate_tool_tokens(tool: &ToolDef) -> u32 {
    tokens::count(&tool.name)
        .saturating_add(tokens::count(&tool.description))
        .saturating_add(tokens::count(&tool.input_schema.to_string()))
}

/// Estimated tokens of one message.
pub fn estimate_message_tokens(m: &Message) -> u32 {
    m.content.iter().fold(1u32, |acc, b| {
        acc.saturating_add(match b {
            Block::Text(t) => tokens::count(t),
            Block::Thinking { text, .. } => tokens::count(text),
            // Opaque base64 of encrypted thinking: roughly four characters per token.
            Block::RedactedThinking { data } => u32::try_from(data.len() / 4).unwrap_or(u32::MAX),
            Block::ToolUse { name, input, .. } => {
                tokens::count(name).saturating_add(tokens::count(&input.to_string()))
            }
            Block::ToolResult { content, .. } => tokens::count(content),
            Block::Image { data, .. } => image_tokens(data),
        })
    })
}

/// Estimated tokens of an image: providers bill images by their pixels,
/// about one token per 750 (Anthropic's published rule, which also holds
/// roughly for OpenAI's tiles), after scaling the long edge down to 1568;
/// a picture whose size cannot be read counts as 1 600 (the most a
/// 1568-pixel picture costs).
pub fn image_tokens(data: &[u8]) -> u32 {
    const UNREADABLE: u32 = 1_600;
    let Some((w, h)) = crate::camera::jpeg::dimensions(data).or_else(|| png_size(data)) else {
        return UNREADABLE;
    };
    let (w, h) = crate::camera::jpeg::scaled_size(w, h, 1568);
    u32::try_from((u64::from(w) * u64::from(h)).div_ceil(750))
        .unwrap_or(u32::MAX)
        .max(1)
}

/// The (width, height) of a PNG from its header.
fn png_size(data: &[u8]) -> Option<(u32, u32)> {
    if data.len() < 24 || !data.starts_with(b"\x89PNG\r\n\x1a\n") || &data[12..16] != b"IHDR" {
        return None;
    }
    let w = u32::from_be_bytes([data[16], data[17], data[18], data[19]]);
    let h = u32::from_be_bytes([data[20], data[21], data[22], data[23]]);
    Some((w, h))
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub cache_read_tokens: u32,
    pub cache_creation_tokens: u32,
    /// Some figure is rozd's own estimate ([`tokens`]), not the server's
    /// count: the server reported no usage, or the model is the local one.
    pub estimated: bool,
}

impl Usage {
    /// Every token the call processed: input, cached input and output.
    pub fn total(&self) -> u64 {
        u64::from(self.input_tokens)
            + u64::from(self.output_tokens)
            + u64::from(self.cache_read_tokens)
            + u64::from(self.cache_creation_tokens)
    }

    /// The size of the context after the call: what was read plus what was written.
    pub fn context_tokens(&self) -> u32 {
        u32::try_from(self.total()).unwrap_or(u32::MAX)
    }

    pub fn add(&mut self, other: Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cache_read_tokens = self
            .cache_read_tokens
            .saturating_add(other.cache_read_tokens);
        self.cache_creation_tokens = self
            .cache_creation_tokens
            .saturating_add(other.cache_creation_tokens);
        self.estimated |= other.estimated;
    }
}

/// Why one model call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelStop {
    EndTurn,
    ToolUse,
    MaxTokens,
}

/// What a model call streams, in order; exactly one `Stop` ends a good stream.
///
/// Deltas of one kind that follow each other belong to one block; a
/// `ThinkingSignature` closes the thinking block it signs.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelEvent {
    TextDelta(String),
    ThinkingDelta(String),
    /// The signature of the thinking block just streamed.
    ThinkingSignature(String),
    /// A whole encrypted thinking block.
    RedactedThinking(String),
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
    Usage(Usage),
    Stop(ModelStop),
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ModelError {
    pub message: String,
    /// Whether the same call may succeed if made again later.
    pub retryable: bool,
}

impl ModelError {
    pub fn new(message: impl Into<String>, retryable: bool) -> Self {
        ModelError {
            message: message.into(),
            retryable,
        }
    }
}

pub type ModelStream = BoxStream<'static, Result<ModelEvent, ModelError>>;

/// A language model. Dropping the stream aborts the call.
pub trait Model: Send + Sync + fmt::Debug {
    /// The name reported in `SessionStarted.model`: the model actually used.
    fn name(&self) -> &str;
    fn stream(&self, request: ModelRequest) -> ModelStream;
    /// The output limit of one call, when the model has its own.
    fn max_output_tokens(&self) -> Option<u32> {
        None
    }
    /// The model's usable context window, when configured; caps a session's budget.
    fn max_context_tokens(&self) -> Option<u32> {
        None
    }
    /// Whether the model can write a summary of old turns when the context
    /// is compacted (the offline command model cannot).
    fn can_summarize(&self) -> bool {
        true
    }
}

/// The models this daemon can run, by name.
#[derive(Debug, Clone)]
pub struct ModelRegistry {
    config: config::ModelConfig,
    local: Arc<dyn Model>,
    /// Configured endpoints, by endpoint name, in configuration order.
    endpoints: Vec<(String, Arc<dyn Model>)>,
    /// The HTTP client of models asked for by a `claude-*` name no endpoint
    /// has; built on first use.
    claude_client: Arc<std::sync::OnceLock<http::SharedClient>>,
}

impl ModelRegistry {
    /// The registry for a configuration's (validated) `[model]` section.
    pub fn from_config(config: &config::ModelConfig) -> Self {
        metrics::known_models(config.endpoints.iter().map(|e| e.model.as_str()));
        let endpoints = config
            .endpoints
            .iter()
            .map(|e| {
                let resolved = config.resolve(e);
                tracing::debug!(
                    endpoint = %resolved.name,
                    provider = resolved.provider.as_str(),
                    model = %resolved.model,
                    base_url = %resolved.base_url,
                    "model endpoint configured"
                );
                let model: Arc<dyn Model> = match resolved.provider {
                    config::Provider::Anthropic => {
                        Arc::new(anthropic::AnthropicModel::new(resolved))
                    }
                    config::Provider::Openai => Arc::new(openai::OpenAiModel::new(resolved)),
                };
                (e.name.clone(), model)
            })
            .collect();
        ModelRegistry {
            config: config.clone(),
            local: Arc::new(local::LocalModel),
            endpoints,
            claude_client: Arc::new(std::sync::OnceLock::new()),
        }
    }

    /// The model `name` selects, or the default when `name` is `None` (or
    /// empty): `local`, an endpoint by name, an endpoint by its model id, or
    /// any `claude-*` model id (on Anthropic).
    pub fn resolve(&self, name: Option<&str>) -> Result<Arc<dyn Model>, String> {
        let name = name
            .filter(|n| !n.is_empty())
            .unwrap_or(&self.config.default);
        if name == config::LOCAL {
            return Ok(self.local.clone());
        }
        if let Some((_, m)) = self.endpoints.iter().find(|(n, _)| n == name) {
            return Ok(m.clone());
        }
        if let Some((_, m)) = self.endpoints.iter().find(|(_, m)| m.name() == name) {
            return Ok(m.clone());
        }
        if config::is_claude(name) {
            let endpoint = self.config.claude(name);
            let client = self
                .claude_client
                .get_or_init(|| http::SharedClient::build(endpoint.connect_timeout))
                .clone();
            return Ok(Arc::new(anthropic::AnthropicModel::with_client(
                endpoint, client,
            )));
        }
        Err(format!(
            "unknown model {name:?}; known models: {}",
            self.config.known_names().join(", ")
        ))
    }

    /// The names a session may ask for.
    pub fn names(&self) -> Vec<String> {
        self.config.known_names()
    }
}
