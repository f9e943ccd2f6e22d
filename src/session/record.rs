//! What a turn is recorded as: its messages as JSON for the store's
//! `turns` table (and `GET /v1/sessions/{id}`).

use serde_json::{Value, json};

use crate::model::{Block, Message, Role};

/// Conversation messages as stored JSON. Image bytes are not stored, only their size.
pub(super) fn messages_json(messages: &[Message]) -> Value {
    let blocks = |m: &Message| -> Vec<Value> {
        m.content
            .iter()
            .map(|b| match b {
                Block::Text(t) => json!({"type": "text", "text": t}),
                Block::Thinking { text, .. } => json!({"type": "thinking", "thinking": text}),
                Block::RedactedThinking { .. } => json!({"type": "redacted_thinking"}),
                Block::ToolUse { id, name, input } => json!({"type": "tool_use", "id": id, "name": name, "input": input}),
                Block::ToolResult { tool_use_id, name, content, is_error } => json!({
                    "type": "tool_result", "tool_use_id": tool_use_id, "name": name, "content": content, "is_error": is_error
                }),
                Block::Image { media_type, data } => json!({"type": "image", "media_type": media_type, "bytes": data.len()}),
            })
            .collect()
    };
    Value::Array(
        messages
            .iter()
            .map(|m| {
                let role = match m.role {
                    Role::User => "user",
                    Role::Assistant => "assistant",
                };
                json!({"role": role, "content": blocks(m)})
            })
            .collect(),
    )
}
