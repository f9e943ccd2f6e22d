//! Language models behind one streaming trait. The session engine speaks only
//! this trait; providers (the offline `local` command model here, network
//! providers later) plug in without touching it. Nothing here knows gRPC.

pub mod local;
pub mod tokens;

use std::collections::BTreeMap;
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
    Thinking {
        text: String,
        signature: String,
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
    pub messages: Vec<Message>,
    pub tools: Vec<ToolDef>,
    pub max_output_tokens: u32,
}

impl ModelRequest {
    /// Estimated input tokens of the whole request.
    pub fn estimate_tokens(&self) -> u32 {
        let mut total = tokens::count(&self.system);
        for m in &self.messages {
            total = total.saturating_add(estimate_message_tokens(m));
        }
        for t in &self.tools {
            total = total
                .saturating_add(tokens::count(&t.name))
                .saturating_add(tokens::count(&t.description))
                .saturating_add(tokens::count(&t.input_schema.to_string()));
        }
        total
    }
}

/// Estimated tokens of one message.
pub fn estimate_message_tokens(m: &Message) -> u32 {
    m.content.iter().fold(1u32, |acc, b| {
        acc.saturating_add(match b {
            Block::Text(t) => tokens::count(t),
            Block::Thinking { text, .. } => tokens::count(text),
            Block::ToolUse { name, input, .. } => {
                tokens::count(name).saturating_add(tokens::count(&input.to_string()))
            }
            Block::ToolResult { content, .. } => tokens::count(content),
            // Providers bill images by pixels; a fixed estimate keeps budgets sane.
            Block::Image { .. } => 1_000,
        })
    })
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub cache_read_tokens: u32,
    pub cache_creation_tokens: u32,
}

impl Usage {
    pub fn add(&mut self, other: Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cache_read_tokens = self
            .cache_read_tokens
            .saturating_add(other.cache_read_tokens);
        self.cache_creation_tokens = self
            .cache_creation_tokens
            .saturating_add(other.cache_creation_tokens);
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
#[derive(Debug, Clone, PartialEq)]
pub enum ModelEvent {
    TextDelta(String),
    ThinkingDelta(String),
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
    pub retryable: bool,
}

pub type ModelStream = BoxStream<'static, Result<ModelEvent, ModelError>>;

/// A language model. Dropping the stream aborts the call.
pub trait Model: Send + Sync + fmt::Debug {
    /// The name reported in `SessionStarted.model`.
    fn name(&self) -> &str;
    fn stream(&self, request: ModelRequest) -> ModelStream;
}

/// The models this daemon can run, by name.
#[derive(Debug, Clone)]
pub struct ModelRegistry {
    models: BTreeMap<String, Arc<dyn Model>>,
    default: String,
}

impl ModelRegistry {
    /// The registry for a configuration's `[model]` section.
    pub fn from_config(config: &crate::config::ModelConfig) -> Self {
        let mut models: BTreeMap<String, Arc<dyn Model>> = BTreeMap::new();
        models.insert(local::NAME.to_string(), Arc::new(local::LocalModel));
        ModelRegistry {
            models,
            default: config.default.clone(),
        }
    }

    /// The named model, or the default when `name` is `None`.
    pub fn resolve(&self, name: Option<&str>) -> Result<Arc<dyn Model>, String> {
        let name = name.unwrap_or(&self.default);
        self.models.get(name).cloned().ok_or_else(|| {
            format!(
                "unknown model {name:?}; known models: {}",
                self.models.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        })
    }

    pub fn names(&self) -> Vec<String> {
        self.models.keys().cloned().collect()
    }
}
