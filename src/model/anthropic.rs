//! Anthropic Messages API, streaming.
//!
//! `POST {base_url}/v1/messages` with `stream: true`; the answer is a stream
//! of server-sent events: `message_start` (input usage), per content block
//! `content_block_start` / `content_block_delta` (`text_delta`,
//! `thinking_delta`, `signature_delta`, `input_json_delta`) /
//! `content_block_stop`, then `message_delta` (stop reason, output usage)
//! and `message_stop`; `ping` any time; `error` when the provider fails
//! mid-stream.
//!
//! Extended thinking is requested when the endpoint has a thinking budget
//! (and the call's output limit exceeds it). Thinking blocks come back with
//! a signature that is kept in [`Block::Thinking`] and sent back unchanged,
//! as the API requires for multi-turn thinking and tool use. With prompt
//! caching on, `cache_control` marks the system prompt, the last tool and
//! the newest message, so each request reuses the previous one's prefix.

use std::collections::BTreeMap;

use base64::Engine as _;
use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::{Value, json};

use super::config::ResolvedEndpoint;
use super::http::{self, Call, Decoder, Failure, SharedClient};
use super::sse::SseEvent;
use super::{
    Block, Message, Model, ModelError, ModelEvent, ModelRequest, ModelStop, ModelStream, Role,
    Usage,
};

/// The `anthropic-version` header rozd speaks.
pub(crate) const API_VERSION: &str = "2023-06-01";

#[derive(Debug)]
pub(crate) struct AnthropicModel {
    endpoint: ResolvedEndpoint,
    client: SharedClient,
}

impl AnthropicModel {
    pub(crate) fn new(endpoint: ResolvedEndpoint) -> Self {
        let client = SharedClient::build(endpoint.connect_timeout);
        AnthropicModel { endpoint, client }
    }

    pub(crate) fn with_client(endpoint: ResolvedEndpoint, client: SharedClient) -> Self {
        AnthropicModel { endpoint, client }
    }
}

impl Model for AnthropicModel {
    #[expect(
        clippy::misnamed_getters,
        reason = "a model reports the provider's model id it uses, not the endpoint's name"
    )]
    fn name(&self) -> &str {
        &self.endpoint.model
    }

    fn max_output_tokens(&self) -> Option<u32> {
        Some(self.endpoint.max_output_tokens)
    }

    fn max_context_tokens(&self) -> Option<u32> {
        self.endpoint.max_context_tokens
    }

    fn stream(&self, request: ModelRequest) -> ModelStream {
        let key = match http::api_key(&self.endpoint) {
            Ok(Some(key)) => key,
            Ok(None) => {
                return http::failed(ModelError::new(
                    format!(
                        "model endpoint {:?} has no API key configured (api_key_env or api_key_file)",
                        self.endpoint.name
                    ),
                    false,
                ));
            }
            Err(e) => return http::failed(ModelError::new(e.to_string(), false)),
        };
        let mut headers = HeaderMap::new();
        let Ok(mut key_value) = HeaderValue::from_str(key.expose()) else {
            return http::failed(ModelError::new(
                format!(
                    "the API key of model endpoint {:?} contains characters not allowed in an HTTP header",
                    self.endpoint.name
                ),
                false,
            ));
        };
        key_value.set_sensitive(true);
        headers.insert("x-api-key", key_value);
        headers.insert("anthropic-version", HeaderValue::from_static(API_VERSION));
        headers.insert(
            reqwest::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(
            reqwest::header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        );
        let body = request_body(&self.endpoint, &request)
            .to_string()
            .into_bytes();
        Call {
            client: self.client.clone(),
            url: format!("{}/v1/messages", self.endpoint.base_url),
            headers,
            body,
            idle_timeout: self.endpoint.idle_timeout,
            retry: self.endpoint.retry,
            secrets: vec![key.expose().to_string()],
            new_decoder: Box::new(AnthropicDecoder::default),
            error_message: http::json_error_message,
        }
        .into_stream()
    }
}

fn cache_marker() -> Value {
    json!({"type": "ephemeral"})
}

/// The JSON body of a streaming Messages request.
pub(crate) fn request_body(endpoint: &ResolvedEndpoint, request: &ModelRequest) -> Value {
    let cache = endpoint.prompt_cache;
    let mut body = serde_json::Map::new();
    body.insert("model".into(), json!(endpoint.model));
    body.insert("max_tokens".into(), json!(request.max_output_tokens));
    body.insert("stream".into(), json!(true));
    if !request.system.is_empty() {
        let mut system = json!({"type": "text", "text": request.system});
        if cache {
            system["cache_control"] = cache_marker();
        }
        body.insert("system".into(), json!([system]));
    }
    if !request.tools.is_empty() {
        let count = request.tools.len();
        let tools: Vec<Value> = request
            .tools
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let mut tool = json!({
                    "name": t.name,
                    "description": t.description,
                    "input_schema": input_schema(&t.input_schema),
                });
                if cache && i + 1 == count {
                    tool["cache_control"] = cache_marker();
                }
                tool
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    if let Some(name) = &request.tool_choice {
        body.insert("tool_choice".into(), json!({"type": "tool", "name": name}));
    }
    let budget = endpoint.thinking_budget_tokens;
    // Anthropic refuses extended thinking with a forced tool.
    if budget > 0 && request.max_output_tokens > budget && request.tool_choice.is_none() {
        body.insert(
            "thinking".into(),
            json!({"type": "enabled", "budget_tokens": budget}),
        );
    }
    let mut messages: Vec<Value> = request.messages.iter().filter_map(message).collect();
    if cache && let Some(last) = messages.last_mut() {
        mark_last_block(last);
    }
    body.insert("messages".into(), Value::Array(messages));
    Value::Object(body)
}

/// Anthropic needs an object schema with a `type`.
fn input_schema(schema: &Value) -> Value {
    match schema {
        Value::Object(map) if map.contains_key("type") => schema.clone(),
        Value::Object(map) => {
            let mut map = map.clone();
            map.insert("type".into(), json!("object"));
            Value::Object(map)
        }
        _ => json!({"type": "object"}),
    }
}

/// Puts a cache breakpoint on the last block that can carry one (not thinking).
fn mark_last_block(message: &mut Value) {
    let Some(blocks) = message.get_mut("content").and_then(Value::as_array_mut) else {
        return;
    };
    if let Some(block) = blocks.iter_mut().rev().find(|b| {
        !matches!(
            b.get("type").and_then(Value::as_str),
            Some("thinking" | "redacted_thinking")
        )
    }) {
        block["cache_control"] = cache_marker();
    }
}

fn message(m: &Message) -> Option<Value> {
    let role = match m.role {
        Role::User => "user",
        Role::Assistant => "assistant",
    };
    let mut content: Vec<Value> = Vec::with_capacity(m.content.len());
    let mut after_result = false;
    for b in &m.content {
        let Some(value) = block(b) else { continue };
        match (b, content.last_mut()) {
            // A tool's picture goes inside its `tool_result` (see `Block::Image`).
            (Block::Image { .. }, Some(result)) if after_result => {
                let text = result["content"].take();
                let mut parts = match text {
                    Value::Array(parts) => parts,
                    Value::String(t) if t.is_empty() => Vec::new(),
                    Value::String(t) => vec![json!({"type": "text", "text": t})],
                    _ => Vec::new(),
                };
                parts.push(value);
                result["content"] = Value::Array(parts);
            }
            _ => {
                after_result = matches!(b, Block::ToolResult { .. });
                content.push(value);
            }
        }
    }
    if content.is_empty() {
        return None;
    }
    Some(json!({"role": role, "content": content}))
}

fn block(b: &Block) -> Option<Value> {
    Some(match b {
        // The API refuses empty text blocks.
        Block::Text(t) if t.is_empty() => return None,
        Block::Text(t) => json!({"type": "text", "text": t}),
        // Thinking without a signature (from another model) cannot be verified.
        Block::Thinking { signature, .. } if signature.is_empty() => return None,
        Block::Thinking { text, signature } => {
            json!({"type": "thinking", "thinking": text, "signature": signature})
        }
        Block::RedactedThinking { data } => json!({"type": "redacted_thinking", "data": data}),
        Block::ToolUse { id, name, input } => {
            let input = if input.is_object() {
                input.clone()
            } else {
                json!({})
            };
            json!({"type": "tool_use", "id": id, "name": name, "input": input})
        }
        Block::ToolResult {
            tool_use_id,
            content,
            is_error,
            ..
        } => json!({
            "type": "tool_result",
            "tool_use_id": tool_use_id,
            "content": content,
            "is_error": is_error,
        }),
        Block::Image { media_type, data } => json!({
            "type": "image",
            "source": {
                "type": "base64",
                "media_type": media_type,
                "data": base64::engine::general_purpose::STANDARD.encode(data),
            },
        }),
    })
}

/// A content block being streamed.
#[derive(Debug)]
enum Open {
    Text,
    Thinking,
    ToolUse {
        id: String,
        name: String,
        json: String,
    },
    Other,
}

/// Assembles one streamed message.
#[derive(Debug, Default)]
pub(crate) struct AnthropicDecoder {
    blocks: BTreeMap<u64, Open>,
    usage: Usage,
    stop: Option<ModelStop>,
    finished: bool,
}

fn u32_at(v: &Value, key: &str) -> Option<u32> {
    v.get(key)
        .and_then(Value::as_u64)
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
}

fn str_at<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

impl AnthropicDecoder {
    fn take_usage(&mut self, usage: &Value) {
        if let Some(n) = u32_at(usage, "input_tokens") {
            self.usage.input_tokens = n;
        }
        if let Some(n) = u32_at(usage, "output_tokens") {
            self.usage.output_tokens = n;
        }
        if let Some(n) = u32_at(usage, "cache_read_input_tokens") {
            self.usage.cache_read_tokens = n;
        }
        if let Some(n) = u32_at(usage, "cache_creation_input_tokens") {
            self.usage.cache_creation_tokens = n;
        }
    }

    fn index(v: &Value) -> Result<u64, Failure> {
        v.get("index")
            .and_then(Value::as_u64)
            .ok_or_else(|| Failure::retryable("a content block event without an index"))
    }
}

/// Maps Anthropic's `stop_reason`.
fn stop_reason(reason: &str) -> ModelStop {
    match reason {
        "tool_use" => ModelStop::ToolUse,
        "max_tokens" | "model_context_window_exceeded" => ModelStop::MaxTokens,
        "end_turn" | "stop_sequence" | "pause_turn" => ModelStop::EndTurn,
        other => {
            // e.g. "refusal": the model ended its answer.
            tracing::info!(
                stop_reason = other,
                "model ended with a stop reason rozd maps to end_turn"
            );
            ModelStop::EndTurn
        }
    }
}

/// Error types worth another attempt.
fn retryable_error_type(kind: &str) -> bool {
    matches!(
        kind,
        "overloaded_error" | "api_error" | "rate_limit_error" | "timeout_error"
    )
}

impl Decoder for AnthropicDecoder {
    fn event(&mut self, event: SseEvent) -> Result<Vec<ModelEvent>, Failure> {
        let v: Value = serde_json::from_str(&event.data).map_err(|e| {
            Failure::retryable(format!(
                "the provider sent an event that is not JSON ({e}): {}",
                http::shorten(&event.data, 200)
            ))
        })?;
        let kind = match str_at(&v, "type") {
            "" => event.event.as_str(),
            t => t,
        };
        let mut out = Vec::new();
        match kind {
            "message_start" => {
                if let Some(usage) = v.get("message").and_then(|m| m.get("usage")) {
                    self.take_usage(usage);
                }
            }
            "content_block_start" => {
                let index = Self::index(&v)?;
                let block = v.get("content_block").cloned().unwrap_or(Value::Null);
                let open = match str_at(&block, "type") {
                    "text" => {
                        let text = str_at(&block, "text");
                        if !text.is_empty() {
                            out.push(ModelEvent::TextDelta(text.to_string()));
                        }
                        Open::Text
                    }
                    "thinking" => {
                        let text = str_at(&block, "thinking");
                        if !text.is_empty() {
                            out.push(ModelEvent::ThinkingDelta(text.to_string()));
                        }
                        let signature = str_at(&block, "signature");
                        if !signature.is_empty() {
                            out.push(ModelEvent::ThinkingSignature(signature.to_string()));
                        }
                        Open::Thinking
                    }
                    "redacted_thinking" => {
                        out.push(ModelEvent::RedactedThinking(
                            str_at(&block, "data").to_string(),
                        ));
                        Open::Other
                    }
                    "tool_use" => {
                        let id = str_at(&block, "id").to_string();
                        let name = str_at(&block, "name").to_string();
                        if id.is_empty() || name.is_empty() {
                            return Err(Failure::retryable(
                                "the provider started a tool_use block without an id or a name",
                            ));
                        }
                        // Non-empty `input` here is the whole input (no deltas follow).
                        let json = match block.get("input") {
                            Some(Value::Object(m)) if !m.is_empty() => {
                                Value::Object(m.clone()).to_string()
                            }
                            _ => String::new(),
                        };
                        Open::ToolUse { id, name, json }
                    }
                    other => {
                        tracing::debug!(block_type = other, "ignoring an unknown content block");
                        Open::Other
                    }
                };
                self.blocks.insert(index, open);
            }
            "content_block_delta" => {
                let index = Self::index(&v)?;
                let delta = v.get("delta").cloned().unwrap_or(Value::Null);
                match (str_at(&delta, "type"), self.blocks.get_mut(&index)) {
                    ("text_delta", Some(Open::Text)) => {
                        out.push(ModelEvent::TextDelta(str_at(&delta, "text").to_string()));
                    }
                    ("thinking_delta", Some(Open::Thinking)) => out.push(
                        ModelEvent::ThinkingDelta(str_at(&delta, "thinking").to_string()),
                    ),
                    ("signature_delta", Some(Open::Thinking)) => out.push(
                        ModelEvent::ThinkingSignature(str_at(&delta, "signature").to_string()),
                    ),
                    ("input_json_delta", Some(Open::ToolUse { json, .. })) => {
                        json.push_str(str_at(&delta, "partial_json"));
                    }
                    (_, Some(Open::Other)) | ("citations_delta", _) => {}
                    (kind, None) => {
                        return Err(Failure::retryable(format!(
                            "a {kind} for content block {index}, which was never started"
                        )));
                    }
                    (kind, Some(open)) => {
                        return Err(Failure::retryable(format!(
                            "a {kind} for content block {index}, which is {open:?}"
                        )));
                    }
                }
            }
            "content_block_stop" => {
                let index = Self::index(&v)?;
                if let Some(Open::ToolUse { id, name, json }) = self.blocks.remove(&index) {
                    let input = if json.trim().is_empty() {
                        json!({})
                    } else {
                        serde_json::from_str::<Value>(&json).map_err(|e| {
                            Failure::retryable(format!(
                                "the input of tool call {id} ({name}) is not valid JSON: {e}"
                            ))
                        })?
                    };
                    if !input.is_object() {
                        return Err(Failure::retryable(format!(
                            "the input of tool call {id} ({name}) is not a JSON object"
                        )));
                    }
                    out.push(ModelEvent::ToolUse { id, name, input });
                }
            }
            "message_delta" => {
                if let Some(reason) = v
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(Value::as_str)
                {
                    self.stop = Some(stop_reason(reason));
                }
                if let Some(usage) = v.get("usage") {
                    self.take_usage(usage);
                }
            }
            "message_stop" => {
                self.finished = true;
                out.push(ModelEvent::Usage(self.usage));
                out.push(ModelEvent::Stop(self.stop.unwrap_or(ModelStop::EndTurn)));
            }
            "error" => {
                let error = v.get("error").cloned().unwrap_or(Value::Null);
                let kind = str_at(&error, "type");
                let message = str_at(&error, "message");
                return Err(Failure {
                    message: format!(
                        "the provider reported an error mid-stream: {}: {}",
                        if kind.is_empty() { "error" } else { kind },
                        http::shorten(message, 500)
                    ),
                    retryable: retryable_error_type(kind),
                    server_error: false,
                    retry_after: None,
                });
            }
            // `ping` and event types added later.
            _ => {}
        }
        Ok(out)
    }

    fn end(&mut self) -> Result<Vec<ModelEvent>, Failure> {
        Err(Failure::retryable(
            "the stream ended before message_stop (the connection closed early)",
        ))
    }

    fn finished(&self) -> bool {
        self.finished
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ToolDef;
    use crate::model::config::ModelConfig;
    use crate::model::sse::SseDecoder;

    fn decode(stream: &str) -> Result<Vec<ModelEvent>, Failure> {
        let mut sse = SseDecoder::new();
        let mut d = AnthropicDecoder::default();
        let mut out = Vec::new();
        for e in sse.push(stream.as_bytes()) {
            out.extend(d.event(e)?);
            if d.finished() {
                return Ok(out);
            }
        }
        out.extend(d.end()?);
        Ok(out)
    }

    fn sse(events: &[(&str, Value)]) -> String {
        events
            .iter()
            .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
            .collect()
    }

    #[test]
    fn text_thinking_signature_tool_use_and_usage() {
        let stream = sse(&[
            (
                "message_start",
                json!({"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":10,"cache_creation_input_tokens":3,"cache_read_input_tokens":7,"output_tokens":1}}}),
            ),
            (
                "content_block_start",
                json!({"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}),
            ),
            (
                "content_block_delta",
                json!({"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Let me "}}),
            ),
            (
                "content_block_delta",
                json!({"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"think."}}),
            ),
            (
                "content_block_delta",
                json!({"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"sig=="}}),
            ),
            (
                "content_block_stop",
                json!({"type":"content_block_stop","index":0}),
            ),
            ("ping", json!({"type":"ping"})),
            (
                "content_block_start",
                json!({"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}),
            ),
            (
                "content_block_delta",
                json!({"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Moving."}}),
            ),
            (
                "content_block_stop",
                json!({"type":"content_block_stop","index":1}),
            ),
            (
                "content_block_start",
                json!({"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_1","name":"move","input":{}}}),
            ),
            (
                "content_block_delta",
                json!({"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":""}}),
            ),
            (
                "content_block_delta",
                json!({"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"spe"}}),
            ),
            (
                "content_block_delta",
                json!({"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"ed\": 0.2}"}}),
            ),
            (
                "content_block_stop",
                json!({"type":"content_block_stop","index":2}),
            ),
            (
                "message_delta",
                json!({"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":42}}),
            ),
            ("message_stop", json!({"type":"message_stop"})),
        ]);
        let events = decode(&stream).unwrap();
        assert_eq!(
            events,
            vec![
                ModelEvent::ThinkingDelta("Let me ".into()),
                ModelEvent::ThinkingDelta("think.".into()),
                ModelEvent::ThinkingSignature("sig==".into()),
                ModelEvent::TextDelta("Moving.".into()),
                ModelEvent::ToolUse {
                    id: "toolu_1".into(),
                    name: "move".into(),
                    input: json!({"speed": 0.2})
                },
                ModelEvent::Usage(Usage {
                    input_tokens: 10,
                    output_tokens: 42,
                    cache_read_tokens: 7,
                    cache_creation_tokens: 3,
                    estimated: false,
                }),
                ModelEvent::Stop(ModelStop::ToolUse),
            ]
        );
    }

    #[test]
    fn error_event_overloaded_is_retryable_invalid_request_is_not() {
        let overloaded = sse(&[(
            "error",
            json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}),
        )]);
        let e = decode(&overloaded).unwrap_err();
        assert!(e.retryable && e.message.contains("Overloaded"), "{e:?}");
        let invalid = sse(&[(
            "error",
            json!({"type":"error","error":{"type":"invalid_request_error","message":"bad"}}),
        )]);
        assert!(!decode(&invalid).unwrap_err().retryable);
    }

    #[test]
    fn stream_without_message_stop_is_a_retryable_failure() {
        let cut = sse(&[(
            "message_start",
            json!({"type":"message_start","message":{"usage":{"input_tokens":1}}}),
        )]);
        assert!(decode(&cut).unwrap_err().retryable);
    }

    #[test]
    fn invalid_tool_json_is_a_failure() {
        let stream = sse(&[
            (
                "content_block_start",
                json!({"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"n","input":{}}}),
            ),
            (
                "content_block_delta",
                json!({"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"a\":"}}),
            ),
            (
                "content_block_stop",
                json!({"type":"content_block_stop","index":0}),
            ),
        ]);
        assert!(
            decode(&stream)
                .unwrap_err()
                .message
                .contains("not valid JSON")
        );
    }

    #[test]
    fn stop_reasons_map() {
        assert_eq!(stop_reason("end_turn"), ModelStop::EndTurn);
        assert_eq!(stop_reason("stop_sequence"), ModelStop::EndTurn);
        assert_eq!(stop_reason("tool_use"), ModelStop::ToolUse);
        assert_eq!(stop_reason("max_tokens"), ModelStop::MaxTokens);
        assert_eq!(stop_reason("refusal"), ModelStop::EndTurn);
    }

    #[test]
    fn request_has_cache_markers_thinking_and_round_trips_blocks() {
        let mut endpoint = ModelConfig::default().claude("claude-test");
        endpoint.thinking_budget_tokens = 2048;
        let request = ModelRequest {
            system: "be careful".into(),
            messages: vec![
                Message::user(vec![Block::Text("go".into())]),
                Message::assistant(vec![
                    Block::Thinking {
                        text: "hmm".into(),
                        signature: "sig".into(),
                    },
                    Block::Thinking {
                        text: "unsigned, from elsewhere".into(),
                        signature: String::new(),
                    },
                    Block::RedactedThinking { data: "xyz".into() },
                    Block::Text(String::new()),
                    Block::ToolUse {
                        id: "t1".into(),
                        name: "move".into(),
                        input: json!({"speed": 1}),
                    },
                ]),
                Message::user(vec![
                    Block::ToolResult {
                        tool_use_id: "t1".into(),
                        name: "move".into(),
                        content: "ok".into(),
                        is_error: false,
                    },
                    Block::Image {
                        media_type: "image/png".into(),
                        data: vec![1, 2, 3],
                    },
                ]),
            ]
            .into(),
            tools: vec![
                ToolDef {
                    name: "a".into(),
                    description: "A".into(),
                    input_schema: json!({"properties": {}}),
                },
                ToolDef {
                    name: "move".into(),
                    description: "moves".into(),
                    input_schema: json!({"type": "object"}),
                },
            ]
            .into(),
            max_output_tokens: 4096,
            estimated_input_tokens: None,
            tool_choice: None,
        };
        let body = request_body(&endpoint, &request);
        assert_eq!(body["model"], "claude-test");
        assert_eq!(body["max_tokens"], 4096);
        assert_eq!(body["stream"], true);
        assert_eq!(
            body["thinking"],
            json!({"type": "enabled", "budget_tokens": 2048})
        );
        assert_eq!(
            body["system"],
            json!([{"type": "text", "text": "be careful", "cache_control": {"type": "ephemeral"}}])
        );
        assert_eq!(body["tools"][0]["input_schema"]["type"], "object");
        assert!(body["tools"][0].get("cache_control").is_none());
        assert_eq!(
            body["tools"][1]["cache_control"],
            json!({"type": "ephemeral"})
        );
        let assistant = &body["messages"][1]["content"];
        assert_eq!(
            assistant,
            &json!([
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "redacted_thinking", "data": "xyz"},
                {"type": "tool_use", "id": "t1", "name": "move", "input": {"speed": 1}},
            ])
        );
        // An image right after a tool result is that result's: inside it.
        let last = &body["messages"][2]["content"];
        assert_eq!(last.as_array().map(Vec::len), Some(1));
        assert_eq!(last[0]["type"], "tool_result");
        assert_eq!(last[0]["content"][0], json!({"type": "text", "text": "ok"}));
        assert_eq!(last[0]["content"][1]["type"], "image");
        assert_eq!(last[0]["content"][1]["source"]["data"], "AQID");
        assert_eq!(last[0]["cache_control"], json!({"type": "ephemeral"}));

        // No thinking when the output limit cannot hold the budget; no markers without caching.
        endpoint.prompt_cache = false;
        let small = ModelRequest {
            max_output_tokens: 1024,
            ..request
        };
        let body = request_body(&endpoint, &small);
        assert!(body.get("thinking").is_none());
        assert!(!body.to_string().contains("cache_control"));
    }
}
