use super::*;
use crate::model::ToolDef;
use crate::model::config::{MaxTokensField, ModelConfig, Provider};
use crate::model::sse::SseDecoder;

fn decode(chunks: &[Value], done: bool) -> Result<Vec<ModelEvent>, Failure> {
    let mut text: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    if done {
        text.push_str("data: [DONE]\n\n");
    }
    let mut sse = SseDecoder::new();
    let mut d = OpenAiDecoder::new(99);
    let mut out = Vec::new();
    for e in sse.push(text.as_bytes()) {
        out.extend(d.event(e)?);
        if d.finished() {
            return Ok(out);
        }
    }
    out.extend(d.end()?);
    Ok(out)
}

fn delta(d: Value) -> Value {
    json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": d, "finish_reason": null}]})
}

fn finish(reason: &str) -> Value {
    json!({"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
}

#[test]
fn parallel_tool_calls_assemble_by_index() {
    let events = decode(
        &[
            delta(json!({"role": "assistant", "content": null, "tool_calls": [
                {"index": 0, "id": "call_a", "type": "function", "function": {"name": "read", "arguments": ""}}
            ]})),
            delta(json!({"tool_calls": [
                {"index": 1, "id": "call_b", "type": "function", "function": {"name": "move", "arguments": "{\"sp"}}
            ]})),
            delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"name\":"}}]})),
            delta(json!({"tool_calls": [{"index": 1, "function": {"arguments": "eed\": 1}"}}]})),
            delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": " \"temp\"}"}}]})),
            finish("tool_calls"),
            json!({"id": "c", "choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 9, "total_tokens": 59, "prompt_tokens_details": {"cached_tokens": 20}}}),
        ],
        true,
    )
    .unwrap();
    assert_eq!(
        events,
        vec![
            ModelEvent::ToolUse {
                id: "call_a".into(),
                name: "read".into(),
                input: json!({"name": "temp"})
            },
            ModelEvent::ToolUse {
                id: "call_b".into(),
                name: "move".into(),
                input: json!({"speed": 1})
            },
            ModelEvent::Usage(Usage {
                input_tokens: 30,
                output_tokens: 9,
                cache_read_tokens: 20,
                cache_creation_tokens: 0,
                estimated: false,
            }),
            ModelEvent::Stop(ModelStop::ToolUse),
        ]
    );
}

#[test]
fn reasoning_fields_and_think_tags_become_thinking() {
    let events = decode(
        &[
            delta(json!({"reasoning_content": "plan A"})),
            delta(json!({"reasoning": " or B"})),
            delta(json!({"content": "<thi"})),
            delta(json!({"content": "nk>inner</th"})),
            delta(json!({"content": "ink>\n\nHello <b>"})),
            delta(json!({"content": "world</b>"})),
            finish("stop"),
        ],
        true,
    )
    .unwrap();
    let thinking: String = events
        .iter()
        .filter_map(|e| match e {
            ModelEvent::ThinkingDelta(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    let text: String = events
        .iter()
        .filter_map(|e| match e {
            ModelEvent::TextDelta(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(thinking, "plan A or Binner");
    assert_eq!(text, "Hello <b>world</b>");
    // No usage from the server: estimated.
    assert!(matches!(
        events[events.len() - 2],
        ModelEvent::Usage(Usage {
            input_tokens: 99,
            estimated: true,
            ..
        })
    ));
    assert_eq!(events.last(), Some(&ModelEvent::Stop(ModelStop::EndTurn)));
}

#[test]
fn think_tag_split_at_every_byte() {
    let text = "a<think>b</think>c<thin";
    for cut in 1..text.len() {
        let mut s = ThinkSplitter::default();
        let mut out = Vec::new();
        s.push(&text[..cut], &mut out);
        s.push(&text[cut..], &mut out);
        s.finish(&mut out);
        let text_only: String = out
            .iter()
            .filter_map(|e| match e {
                ModelEvent::TextDelta(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        let thinking: String = out
            .iter()
            .filter_map(|e| match e {
                ModelEvent::ThinkingDelta(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(
            (text_only.as_str(), thinking.as_str()),
            ("ac<thin", "b"),
            "cut {cut}"
        );
    }
}

#[test]
fn length_drops_cut_off_calls_and_is_max_tokens() {
    let events = decode(
        &[
            delta(json!({"content": "partial"})),
            delta(json!({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{\"a\": "}}]})),
            finish("length"),
        ],
        true,
    )
    .unwrap();
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, ModelEvent::ToolUse { .. }))
    );
    assert_eq!(events.last(), Some(&ModelEvent::Stop(ModelStop::MaxTokens)));
}

#[test]
fn error_chunk_and_early_close_are_failures() {
    let e = decode(
        &[
            delta(json!({"content": "x"})),
            json!({"error": {"message": "boom", "code": "server_error"}}),
        ],
        false,
    )
    .unwrap_err();
    assert!(e.retryable && e.message.contains("boom"));
    let e = decode(&[delta(json!({"content": "x"}))], false).unwrap_err();
    assert!(e.message.contains("ended before"));
    // finish_reason without [DONE] is accepted.
    let events = decode(&[delta(json!({"content": "x"})), finish("stop")], false).unwrap();
    assert_eq!(events.last(), Some(&ModelEvent::Stop(ModelStop::EndTurn)));
}

#[test]
fn request_maps_history_tools_and_options() {
    let mut c = ModelConfig::default();
    c.endpoints.push(crate::model::config::EndpointConfig {
        name: "box".into(),
        provider: Provider::Openai,
        model: "qwen3:8b".into(),
        base_url: Some("http://127.0.0.1:11434/v1".into()),
        api_key_env: None,
        api_key_file: None,
        thinking_budget_tokens: 0,
        max_output_tokens: None,
        max_context_tokens: None,
        connect_timeout_ms: None,
        idle_timeout_ms: None,
        retry_budget_ms: None,
        prompt_cache: true,
        max_tokens_field: MaxTokensField::MaxCompletionTokens,
    });
    let endpoint = c.resolve(&c.endpoints[0]);
    let request = ModelRequest {
        system: "sys".into(),
        messages: vec![
            Message::user(vec![Block::Text("go".into())]),
            Message::assistant(vec![
                Block::Thinking {
                    text: "hidden".into(),
                    signature: String::new(),
                },
                Block::ToolUse {
                    id: "c1".into(),
                    name: "read".into(),
                    input: json!({"name": "t"}),
                },
                Block::ToolUse {
                    id: "c2".into(),
                    name: "move".into(),
                    input: json!({}),
                },
            ]),
            Message::user(vec![
                Block::ToolResult {
                    tool_use_id: "c1".into(),
                    name: "read".into(),
                    content: "21".into(),
                    is_error: false,
                },
                Block::ToolResult {
                    tool_use_id: "c2".into(),
                    name: "move".into(),
                    content: "blocked".into(),
                    is_error: true,
                },
            ]),
            Message::user(vec![
                Block::Text("look".into()),
                Block::Image {
                    media_type: "image/png".into(),
                    data: vec![1, 2, 3],
                },
            ]),
        ]
        .into(),
        tools: vec![ToolDef {
            name: "read".into(),
            description: "reads".into(),
            input_schema: json!({}),
        }]
        .into(),
        max_output_tokens: 512,
        estimated_input_tokens: None,
        tool_choice: None,
    };
    let body = request_body(&endpoint, &request);
    assert_eq!(body["model"], "qwen3:8b");
    assert_eq!(body["stream_options"], json!({"include_usage": true}));
    assert_eq!(body["max_completion_tokens"], 512);
    assert!(body.get("max_tokens").is_none());
    assert_eq!(
        body["tools"][0],
        json!({"type": "function", "function": {"name": "read", "description": "reads", "parameters": {"type": "object"}}})
    );
    let m = body["messages"].as_array().unwrap();
    assert_eq!(m[0], json!({"role": "system", "content": "sys"}));
    assert_eq!(m[1], json!({"role": "user", "content": "go"}));
    assert_eq!(m[2]["content"], "");
    assert_eq!(
        m[2]["tool_calls"][0]["function"]["arguments"],
        "{\"name\":\"t\"}"
    );
    assert_eq!(m[2]["tool_calls"][1]["id"], "c2");
    assert!(!body.to_string().contains("hidden"));
    assert_eq!(
        m[3],
        json!({"role": "tool", "tool_call_id": "c1", "content": "21"})
    );
    assert_eq!(
        m[4],
        json!({"role": "tool", "tool_call_id": "c2", "content": "Error: blocked"})
    );
    assert_eq!(
        m[5]["content"][1]["image_url"]["url"],
        "data:image/png;base64,AQID"
    );
}
