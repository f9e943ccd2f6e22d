//! OpenAI-compatible Chat Completions, streaming: OpenAI itself and the
//! servers a robot runs on its own network (Ollama, llama.cpp server, vLLM,
//! LM Studio).
//!
//! `POST {base_url}/chat/completions` with `stream: true` and
//! `stream_options.include_usage`; the answer is `data: {chunk}` events and
//! a final `data: [DONE]`. Each chunk's `choices[0].delta` carries `content`,
//! reasoning (`reasoning_content` as vLLM/DeepSeek/llama.cpp name it,
//! `reasoning` as Ollama/OpenRouter do) and `tool_calls` fragments that are
//! assembled by their `index` (parallel calls interleave). Text between
//! `<think>` and `</think>` in `content` is reasoning too. Usage arrives in
//! a last chunk with no choices.

use std::collections::BTreeMap;

use base64::Engine as _;
use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::{Value, json};

use super::config::ResolvedEndpoint;
use super::http::{self, Call, Decoder, Failure, SharedClient};
use super::sse::SseEvent;
use super::{
    Block, Message, Model, ModelError, ModelEvent, ModelRequest, ModelStop, ModelStream, Role,
    Usage, tokens,
};

#[derive(Debug)]
pub(crate) struct OpenAiModel {
    endpoint: ResolvedEndpoint,
    client: SharedClient,
}

impl OpenAiModel {
    pub(crate) fn new(endpoint: ResolvedEndpoint) -> Self {
        let client = SharedClient::build(endpoint.connect_timeout);
        OpenAiModel { endpoint, client }
    }
}

impl Model for OpenAiModel {
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
            Ok(key) => key,
            Err(e) => return http::failed(ModelError::new(e.to_string(), false)),
        };
        let mut headers = HeaderMap::new();
        let mut secrets = Vec::new();
        if let Some(key) = &key {
            let Ok(mut value) = HeaderValue::from_str(&format!("Bearer {}", key.expose())) else {
                return http::failed(ModelError::new(
                    format!(
                        "the API key of model endpoint {:?} contains characters not allowed in an HTTP header",
                        self.endpoint.name
                    ),
                    false,
                ));
            };
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
            secrets.push(key.expose().to_string());
        }
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
        let estimated_input = request.input_tokens();
        Call {
            client: self.client.clone(),
            url: format!("{}/chat/completions", self.endpoint.base_url),
            headers,
            body,
            idle_timeout: self.endpoint.idle_timeout,
            retry: self.endpoint.retry,
            secrets,
            new_decoder: Box::new(move || OpenAiDecoder::new(estimated_input)),
            error_message: http::json_error_message,
        }
        .into_stream()
    }
}

/// The JSON body of a streaming Chat Completions request.
pub(crate) fn request_body(endpoint: &ResolvedEndpoint, request: &ModelRequest) -> Value {
    let mut messages = Vec::new();
    if !request.system.is_empty() {
        messages.push(json!({"role": "system", "content": request.system}));
    }
    for m in request.messages.iter() {
        push_message(&mut messages, m);
    }
    let mut body = serde_json::Map::new();
    body.insert("model".into(), json!(endpoint.model));
    body.insert("messages".into(), Value::Array(messages));
    body.insert("stream".into(), json!(true));
    body.insert("stream_options".into(), json!({"include_usage": true}));
    body.insert(
        endpoint.max_tokens_field.as_str().into(),
        json!(request.max_output_tokens),
    );
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|t| {
                json!({
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": parameters(&t.input_schema),
                    },
                })
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    if let Some(name) = &request.tool_choice {
        body.insert(
            "tool_choice".into(),
            json!({"type": "function", "function": {"name": name}}),
        );
    }
    Value::Object(body)
}

fn parameters(schema: &Value) -> Value {
    match schema {
        Value::Object(map) if map.contains_key("type") => schema.clone(),
        Value::Object(map) => {
            let mut map = map.clone();
            map.insert("type".into(), json!("object"));
            Value::Object(map)
        }
        _ => json!({"type": "object", "properties": {}}),
    }
}

/// One conversation message becomes one or more chat messages: tool results
/// are `tool` messages (first, right after the assistant's calls), other
/// user content one `user` message; thinking is not sent back (servers
/// either ignore it or refuse it).
fn push_message(out: &mut Vec<Value>, m: &Message) {
    match m.role {
        Role::User => {
            let mut parts = Vec::new();
            let mut only_text = true;
            // The tool call the images that follow belong to (see `Block::Image`).
            let mut result_of: Option<&str> = None;
            for b in &m.content {
                if let (Block::Image { .. }, Some(id)) = (b, result_of.take()) {
                    parts.push(json!({"type": "text", "text": format!("The image returned by tool call {id}:")}));
                }
                match b {
                    Block::ToolResult {
                        tool_use_id,
                        content,
                        is_error,
                        ..
                    } => {
                        let content = if *is_error {
                            format!("Error: {content}")
                        } else {
                            content.clone()
                        };
                        out.push(json!({
                            "role": "tool",
                            "tool_call_id": tool_use_id,
                            "content": content,
                        }));
                        result_of = Some(tool_use_id.as_str());
                    }
                    Block::Text(t) if !t.is_empty() => {
                        parts.push(json!({"type": "text", "text": t}));
                    }
                    Block::Image { media_type, data } => {
                        only_text = false;
                        let url = format!(
                            "data:{media_type};base64,{}",
                            base64::engine::general_purpose::STANDARD.encode(data)
                        );
                        parts.push(json!({"type": "image_url", "image_url": {"url": url}}));
                    }
                    _ => {}
                }
            }
            if parts.is_empty() {
                return;
            }
            let content = if only_text {
                // Plain text content is what every server understands.
                let texts: Vec<&str> = parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect();
                json!(texts.join("\n\n"))
            } else {
                Value::Array(parts)
            };
            out.push(json!({"role": "user", "content": content}));
        }
        Role::Assistant => {
            let text: String = m
                .content
                .iter()
                .filter_map(|b| match b {
                    Block::Text(t) => Some(t.as_str()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n\n");
            let calls: Vec<Value> = m
                .content
                .iter()
                .filter_map(|b| match b {
                    Block::ToolUse { id, name, input } => Some(json!({
                        "id": id,
                        "type": "function",
                        "function": {"name": name, "arguments": input.to_string()},
                    })),
                    _ => None,
                })
                .collect();
            if text.is_empty() && calls.is_empty() {
                return;
            }
            let mut message = json!({
                "role": "assistant",
                // A string even when empty: OpenAI also takes null, but
                // strict servers (llama-cpp-python) refuse it.
                "content": text,
            });
            if !calls.is_empty() {
                message["tool_calls"] = Value::Array(calls);
            }
            out.push(message);
        }
    }
}

/// Splits streamed `content` at `<think>` / `</think>` tags, which may
/// arrive cut into pieces.
#[derive(Debug, Default)]
struct ThinkSplitter {
    thinking: bool,
    held: String,
    /// Drop whitespace at the start of the answer after a think block.
    trim_next_text: bool,
}

const OPEN_TAG: &str = "<think>";
const CLOSE_TAG: &str = "</think>";

impl ThinkSplitter {
    fn push(&mut self, text: &str, out: &mut Vec<ModelEvent>) {
        self.held.push_str(text);
        loop {
            let tag = if self.thinking { CLOSE_TAG } else { OPEN_TAG };
            if let Some(pos) = self.held.find(tag) {
                let before: String = self.held[..pos].to_string();
                self.emit(before, out);
                self.held.drain(..pos + tag.len());
                self.thinking = !self.thinking;
                if !self.thinking {
                    self.trim_next_text = true;
                }
                continue;
            }
            // Hold back a tail that could be the start of the tag.
            let keep = (1..tag.len())
                .rev()
                .find(|&n| self.held.len() >= n && self.held.ends_with(&tag[..n]))
                .unwrap_or(0);
            let cut = self.held.len() - keep;
            let ready: String = self.held[..cut].to_string();
            self.held.drain(..cut);
            self.emit(ready, out);
            return;
        }
    }

    fn finish(&mut self, out: &mut Vec<ModelEvent>) {
        let rest = std::mem::take(&mut self.held);
        self.emit(rest, out);
    }

    fn emit(&mut self, text: String, out: &mut Vec<ModelEvent>) {
        if text.is_empty() {
            return;
        }
        if self.thinking {
            push_thinking(out, text);
            return;
        }
        let text = if self.trim_next_text {
            let trimmed = text.trim_start();
            if trimmed.is_empty() {
                return;
            }
            self.trim_next_text = false;
            trimmed.to_string()
        } else {
            text
        };
        out.push(ModelEvent::TextDelta(text));
    }
}

fn push_thinking(out: &mut Vec<ModelEvent>, text: String) {
    if !text.is_empty() {
        out.push(ModelEvent::ThinkingDelta(text));
    }
}

#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// Assembles one streamed chat completion.
#[derive(Debug)]
pub(crate) struct OpenAiDecoder {
    think: ThinkSplitter,
    calls: BTreeMap<u64, PartialCall>,
    finish_reason: Option<String>,
    usage: Option<Usage>,
    /// For a usage estimate when the server reports none.
    estimated_input: u32,
    output_text: String,
    finished: bool,
}

impl OpenAiDecoder {
    pub(crate) fn new(estimated_input: u32) -> Self {
        OpenAiDecoder {
            think: ThinkSplitter::default(),
            calls: BTreeMap::new(),
            finish_reason: None,
            usage: None,
            estimated_input,
            output_text: String::new(),
            finished: false,
        }
    }

    fn take_usage(&mut self, usage: &Value) {
        let n = |v: Option<&Value>| {
            v.and_then(Value::as_u64)
                .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
        };
        let prompt = n(usage.get("prompt_tokens"));
        let cached = n(usage
            .get("prompt_tokens_details")
            .and_then(|d| d.get("cached_tokens")));
        self.usage = Some(Usage {
            input_tokens: prompt.saturating_sub(cached),
            output_tokens: n(usage.get("completion_tokens")),
            cache_read_tokens: cached.min(prompt),
            cache_creation_tokens: 0,
            estimated: false,
        });
    }

    fn tool_call_delta(&mut self, position: usize, call: &Value) {
        let index = call
            .get("index")
            .and_then(Value::as_u64)
            .unwrap_or_else(|| {
                // Servers that omit `index`: a call with an id is a new one.
                let last = self.calls.keys().next_back().copied();
                match (call.get("id").and_then(Value::as_str), last) {
                    (Some(id), Some(last)) if !id.is_empty() && self.calls[&last].id != id => {
                        last + 1
                    }
                    (_, Some(last)) => last,
                    (_, None) => u64::try_from(position).unwrap_or(0),
                }
            });
        let entry = self.calls.entry(index).or_default();
        if let Some(id) = call.get("id").and_then(Value::as_str)
            && !id.is_empty()
        {
            entry.id = id.to_string();
        }
        if let Some(function) = call.get("function") {
            if let Some(name) = function.get("name").and_then(Value::as_str) {
                // Some servers repeat the name in every fragment.
                if !entry.name.ends_with(name) || entry.name.is_empty() {
                    entry.name.push_str(name);
                }
            }
            match function.get("arguments") {
                Some(Value::String(fragment)) => entry.arguments.push_str(fragment),
                Some(v @ Value::Object(_)) => entry.arguments = v.to_string(),
                _ => {}
            }
        }
    }

    /// Everything after the last content: flushed text, the assembled tool
    /// calls in index order, usage and the stop reason.
    fn finals(&mut self) -> Result<Vec<ModelEvent>, Failure> {
        self.finished = true;
        let mut out = Vec::new();
        self.think.finish(&mut out);
        let truncated = self.finish_reason.as_deref() == Some("length");
        let mut calls = Vec::new();
        for (index, call) in std::mem::take(&mut self.calls) {
            if call.name.is_empty() {
                if truncated {
                    continue;
                }
                return Err(Failure::retryable(format!(
                    "tool call {index} arrived without a function name"
                )));
            }
            let input = if call.arguments.trim().is_empty() {
                json!({})
            } else {
                match serde_json::from_str::<Value>(&call.arguments) {
                    Ok(v) => v,
                    // The output limit cut the arguments off: the call is dropped.
                    Err(_) if truncated => continue,
                    Err(e) => {
                        return Err(Failure::retryable(format!(
                            "the arguments of tool call {} ({}) are not valid JSON: {e}",
                            call.id, call.name
                        )));
                    }
                }
            };
            if !input.is_object() {
                return Err(Failure::retryable(format!(
                    "the arguments of tool call {} ({}) are not a JSON object",
                    call.id, call.name
                )));
            }
            let id = if call.id.is_empty() {
                format!("call_{}", uuid::Uuid::new_v4().simple())
            } else {
                call.id
            };
            self.output_text.push_str(&call.name);
            self.output_text.push_str(&call.arguments);
            calls.push(ModelEvent::ToolUse {
                id,
                name: call.name,
                input,
            });
        }
        let has_calls = !calls.is_empty();
        out.extend(calls);
        let usage = self.usage.unwrap_or_else(|| Usage {
            input_tokens: self.estimated_input,
            output_tokens: tokens::count(&self.output_text),
            estimated: true,
            ..Usage::default()
        });
        out.push(ModelEvent::Usage(usage));
        let stop = match self.finish_reason.as_deref() {
            Some("length") => ModelStop::MaxTokens,
            _ if has_calls => ModelStop::ToolUse,
            Some("stop" | "tool_calls" | "function_call" | "content_filter") | None => {
                ModelStop::EndTurn
            }
            Some(other) => {
                tracing::info!(
                    finish_reason = other,
                    "unknown finish_reason; treated as end_turn"
                );
                ModelStop::EndTurn
            }
        };
        out.push(ModelEvent::Stop(stop));
        Ok(out)
    }
}

impl Decoder for OpenAiDecoder {
    fn event(&mut self, event: SseEvent) -> Result<Vec<ModelEvent>, Failure> {
        let data = event.data.trim();
        if data == "[DONE]" {
            return self.finals();
        }
        if data.is_empty() {
            return Ok(Vec::new());
        }
        let v: Value = serde_json::from_str(data).map_err(|e| {
            Failure::retryable(format!(
                "the server sent a chunk that is not JSON ({e}): {}",
                http::shorten(data, 200)
            ))
        })?;
        if let Some(error) = v.get("error").filter(|e| !e.is_null()) {
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .or_else(|| error.as_str())
                .unwrap_or("unknown error");
            let code = [error.get("code"), error.get("type")]
                .into_iter()
                .flatten()
                .map(|c| match c {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect::<Vec<_>>()
                .join(" ");
            let retryable = [
                "server_error",
                "rate_limit",
                "overloaded",
                "timeout",
                "500",
                "502",
                "503",
                "504",
            ]
            .iter()
            .any(|k| code.contains(k));
            return Err(Failure {
                message: format!(
                    "the server reported an error mid-stream: {}",
                    http::shorten(message, 500)
                ),
                retryable,
                retry_after: None,
                server_error: false,
            });
        }
        if let Some(usage) = v.get("usage").filter(|u| u.is_object()) {
            self.take_usage(usage);
        }
        let mut out = Vec::new();
        let Some(choice) = v
            .get("choices")
            .and_then(Value::as_array)
            .and_then(|c| c.first())
        else {
            return Ok(out);
        };
        if let Some(delta) = choice.get("delta") {
            for field in ["reasoning_content", "reasoning"] {
                if let Some(text) = delta.get(field).and_then(Value::as_str) {
                    self.output_text.push_str(text);
                    push_thinking(&mut out, text.to_string());
                }
            }
            if let Some(text) = delta.get("content").and_then(Value::as_str) {
                self.output_text.push_str(text);
                self.think.push(text, &mut out);
            }
            if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
                for (position, call) in calls.iter().enumerate() {
                    self.tool_call_delta(position, call);
                }
            }
        }
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish_reason = Some(reason.to_string());
        }
        Ok(out)
    }

    fn end(&mut self) -> Result<Vec<ModelEvent>, Failure> {
        // Some servers close without `[DONE]`; a finish_reason means the answer is whole.
        if self.finish_reason.is_some() {
            return self.finals();
        }
        Err(Failure::retryable(
            "the stream ended before a finish_reason or [DONE] (the connection closed early)",
        ))
    }

    fn finished(&self) -> bool {
        self.finished
    }
}

#[cfg(test)]
mod tests;
