//! The local model's command language (`model::local`): any user message,
//! split into commands and answered (tool calls, text, a delay) without a
//! panic, with and without results of earlier calls.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rozd::model::{Block, Message, ModelRequest, Role, ToolDef};

fn tool(name: &str) -> ToolDef {
    ToolDef {
        name: name.into(),
        description: String::new(),
        input_schema: serde_json::json!({"type": "object"}),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let tools = [
        "observe",
        "read_sensor",
        "speed",
        "actuate",
        "spawn_worker",
        "await_workers",
    ]
    .map(tool)
    .to_vec();
    let mut request = ModelRequest {
        system: String::new(),
        messages: vec![Message {
            role: Role::User,
            content: vec![Block::Text(text.to_string())],
        }].into(),
        tools: tools.into(),
        max_output_tokens: 256,
        estimated_input_tokens: None,
        tool_choice: None,
    };
    let (_, events) = rozd::model::local::respond(&request);
    // Answer the first tool call it made, and ask again.
    let call = events.iter().find_map(|e| match e {
        rozd::model::ModelEvent::ToolUse { id, name, input } => {
            Some((id.clone(), name.clone(), input.clone()))
        }
        _ => None,
    });
    if let Some((id, name, input)) = call {
        std::sync::Arc::make_mut(&mut request.messages).push(Message {
            role: Role::Assistant,
            content: vec![Block::ToolUse {
                id: id.clone(),
                name: name.clone(),
                input,
            }],
        });
        std::sync::Arc::make_mut(&mut request.messages).push(Message {
            role: Role::User,
            content: vec![Block::ToolResult {
                tool_use_id: id,
                name,
                content: text.chars().take(64).collect(),
                is_error: data.len() % 2 == 0,
            }],
        });
        let _ = rozd::model::local::respond(&request);
    }
});
