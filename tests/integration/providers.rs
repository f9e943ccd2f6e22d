//! Network model providers against loopback HTTP servers that replay each
//! provider's documented streaming format, driven through real gRPC
//! sessions: what the session emits, and what request the provider got.

use crate::common;
use crate::common::{text_of, until_complete};

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use common::{Session, TestDaemon, expect_error};
use futures_util::StreamExt as _;
use rozd::api::proto;
use rozd::api::proto::session_request::Request as Req;
use rozd::api::proto::session_response::Response as Resp;
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// Paused-clock tests wait through long virtual timeouts.
const PAUSED_WAIT: Duration = Duration::from_secs(24 * 3600);
/// An environment variable no test machine sets.
const UNSET_VAR: &str = "ROZD_TEST_KEY_THAT_IS_NEVER_SET_4F1C";

// ---------------------------------------------------------------- fake provider

/// What the fake provider answers to one request.
enum Reply {
    /// `200 text/event-stream` with these chunks (each written separately),
    /// then the end of the body, or a stall that never ends.
    Stream { chunks: Vec<String>, stall: bool },
    /// Any status with headers and a body.
    Status {
        code: u16,
        headers: Vec<(&'static str, String)>,
        body: String,
    },
}

/// A request the fake provider received.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: http::HeaderMap,
    body: Value,
    len: usize,
    at: tokio::time::Instant,
}

#[derive(Clone)]
struct Script {
    replies: Arc<Mutex<VecDeque<Reply>>>,
    /// Answer every request beyond the script with this status and body.
    fallback: Arc<Mutex<Option<(u16, String)>>>,
    seen: mpsc::UnboundedSender<Seen>,
}

struct FakeProvider {
    url: String,
    script: Script,
    seen: mpsc::UnboundedReceiver<Seen>,
    wait: Duration,
    _key_dir: tempfile::TempDir,
    key_file: String,
}

impl FakeProvider {
    async fn start() -> FakeProvider {
        let (tx, rx) = mpsc::unbounded_channel();
        let script = Script {
            replies: Arc::new(Mutex::new(VecDeque::new())),
            fallback: Arc::new(Mutex::new(None)),
            seen: tx,
        };
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let key_dir = tempfile::tempdir().unwrap();
        let key_file = key_dir.path().join("key");
        std::fs::write(&key_file, "sk-ant-test-0123456789abcdefghij\n").unwrap();
        FakeProvider {
            url: format!("http://{addr}"),
            script,
            seen: rx,
            wait: common::EXPECT_WITHIN,
            key_file: key_file.display().to_string(),
            _key_dir: key_dir,
        }
    }

    fn reply(&self, reply: Reply) {
        self.script.replies.lock().unwrap().push_back(reply);
    }

    fn stream(&self, chunks: Vec<String>) {
        self.reply(Reply::Stream {
            chunks,
            stall: false,
        });
    }

    /// The next request the provider received.
    async fn request(&mut self) -> Seen {
        tokio::time::timeout(self.wait, self.seen.recv())
            .await
            .expect("the provider gets a request in time")
            .expect("provider running")
    }

    fn no_more_requests(&mut self) {
        assert!(
            self.seen.try_recv().is_err(),
            "the provider got an unexpected request"
        );
    }

    /// `[[model.endpoints]]` for this server.
    fn anthropic_endpoint(&self, name: &str, model: &str, extra: &str) -> String {
        format!(
            "[[model.endpoints]]\nname = {name:?}\nprovider = \"anthropic\"\nmodel = {model:?}\n\
             base_url = {:?}\napi_key_file = {:?}\n{extra}\n",
            self.url, self.key_file
        )
    }

    fn openai_endpoint(&self, name: &str, model: &str, extra: &str) -> String {
        format!(
            "[[model.endpoints]]\nname = {name:?}\nprovider = \"openai\"\nmodel = {model:?}\n\
             base_url = \"{}/v1\"\n{extra}\n",
            self.url
        )
    }
}

async fn handle(State(script): State<Script>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let _ = script.seen.send(Seen {
        path: parts.uri.path().to_string(),
        headers: parts.headers,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        len: bytes.len(),
        at: tokio::time::Instant::now(),
    });
    // As strict as llama-cpp-python's server (pydantic models of each
    // message): what it refuses, every OpenAI-compatible request here is
    // refused for, the way it refuses it.
    if parts.uri.path().ends_with("/chat/completions") {
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let problems = strict_chat_request_problems(&body);
        if !problems.is_empty() {
            return Response::builder()
                .status(500)
                .header("content-type", "application/json")
                .body(Body::from(
                    json!({"error": {"message": format!(
                        "{} validation errors for ChatCompletionRequest: {}",
                        problems.len(),
                        problems.join("; ")
                    ), "type": "internal_server_error"}})
                    .to_string(),
                ))
                .unwrap();
        }
    }
    let next = script.replies.lock().unwrap().pop_front();
    let reply = match next {
        Some(reply) => reply,
        None => match script.fallback.lock().unwrap().clone() {
            Some((code, body)) => Reply::Status {
                code,
                headers: vec![("content-type", "application/json".into())],
                body,
            },
            None => Reply::Status {
                code: 500,
                headers: vec![],
                body: "the test scripted no reply for this request".into(),
            },
        },
    };
    match reply {
        Reply::Stream { chunks, stall } => {
            let chunks = futures_util::stream::iter(chunks.into_iter().map(Ok::<_, Infallible>));
            let body = if stall {
                Body::from_stream(chunks.chain(futures_util::stream::pending()))
            } else {
                Body::from_stream(chunks)
            };
            Response::builder()
                .status(200)
                .header("content-type", "text/event-stream")
                .header("cache-control", "no-cache")
                .body(body)
                .unwrap()
        }
        Reply::Status {
            code,
            headers,
            body,
        } => {
            let mut response = Response::builder().status(code);
            for (k, v) in headers {
                response = response.header(k, v);
            }
            response.body(Body::from(body)).unwrap()
        }
    }
}

/// Splits every event in two chunks, so the client sees events cut across reads.
/// What a strict OpenAI-compatible server (llama-cpp-python 0.3's
/// `ChatCompletionRequest*Message` models) finds wrong with a request body.
fn strict_chat_request_problems(body: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(messages) = body["messages"].as_array() else {
        return vec!["messages: field required".into()];
    };
    let text_parts = |content: &Value| {
        content.as_array().is_some_and(|parts| {
            parts.iter().all(|p| match p["type"].as_str() {
                Some("text") => p["text"].is_string(),
                Some("image_url") => p["image_url"]["url"].is_string(),
                _ => false,
            })
        })
    };
    for (i, m) in messages.iter().enumerate() {
        let content = &m["content"];
        match m["role"].as_str() {
            Some("system") if !content.is_string() => {
                problems.push(format!("messages.{i}.system.content: str type expected"));
            }
            Some("user") if !content.is_string() && !text_parts(content) => {
                problems.push(format!("messages.{i}.user.content: str or parts expected"));
            }
            Some("assistant") => {
                if !content.is_string() {
                    problems.push(format!("messages.{i}.assistant.content: str type expected"));
                }
                if let Some(calls) = m.get("tool_calls") {
                    let valid = calls.as_array().is_some_and(|calls| {
                        calls.iter().all(|c| {
                            c["id"].is_string()
                                && c["type"] == "function"
                                && c["function"]["name"].is_string()
                                && c["function"]["arguments"].is_string()
                        })
                    });
                    if !valid {
                        problems.push(format!("messages.{i}.assistant.tool_calls: invalid"));
                    }
                }
            }
            Some("tool") => {
                if !content.is_string() {
                    problems.push(format!("messages.{i}.tool.content: str type expected"));
                }
                if !m["tool_call_id"].is_string() {
                    problems.push(format!("messages.{i}.tool.tool_call_id: field required"));
                }
            }
            Some("system" | "user") => {}
            other => problems.push(format!("messages.{i}.role: unexpected value {other:?}")),
        }
    }
    problems
}

fn split_in_halves(events: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for e in events {
        let mut mid = e.len() / 2;
        while !e.is_char_boundary(mid) {
            mid += 1;
        }
        out.push(e[..mid].to_string());
        out.push(e[mid..].to_string());
    }
    out
}

// ---------------------------------------------------------------- Anthropic wire format

fn event(name: &str, data: Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

#[derive(Clone)]
enum Part {
    Text(&'static str),
    Thinking(String, &'static str),
    Tool(&'static str, &'static str, Vec<&'static str>),
}

#[derive(Clone, Copy, Default)]
struct U {
    input: u32,
    output: u32,
    cache_read: u32,
    cache_creation: u32,
}

/// A whole Messages stream as Anthropic documents it.
fn anthropic(parts: &[Part], stop: &str, u: U) -> Vec<String> {
    let mut events = vec![event(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": "msg_01", "type": "message", "role": "assistant", "content": [],
            "model": "claude-test-1", "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": u.input, "cache_creation_input_tokens": u.cache_creation,
                      "cache_read_input_tokens": u.cache_read, "output_tokens": 1}}}),
    )];
    for (index, part) in parts.iter().enumerate() {
        match part {
            Part::Text(text) => {
                events.push(event("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}})));
                events.push(event("ping", json!({"type": "ping"})));
                for word in text.split_inclusive(' ') {
                    events.push(event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": word}})));
                }
            }
            Part::Thinking(text, signature) => {
                events.push(event("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": {"type": "thinking", "thinking": ""}})));
                for piece in text.split_inclusive(". ") {
                    events.push(event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "thinking_delta", "thinking": piece}})));
                }
                events.push(event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "signature_delta", "signature": signature}})));
            }
            Part::Tool(id, name, fragments) => {
                events.push(event("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}})));
                for fragment in fragments {
                    events.push(event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": fragment}})));
                }
            }
        }
        events.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
    }
    events.push(event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": u.output}}),
    ));
    events.push(event("message_stop", json!({"type": "message_stop"})));
    split_in_halves(&events)
}

// ---------------------------------------------------------------- OpenAI wire format

fn chunk(delta: Value, finish: Option<&str>) -> String {
    format!(
        "data: {}\n\n",
        json!({"id": "chatcmpl-123", "object": "chat.completion.chunk", "created": 1694268190,
               "model": "qwen3:8b", "system_fingerprint": "fp_44709d6fcb",
               "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
    )
}

fn usage_chunk(prompt: u32, completion: u32, cached: u32) -> String {
    format!(
        "data: {}\n\n",
        json!({"id": "chatcmpl-123", "object": "chat.completion.chunk", "created": 1694268190,
               "model": "qwen3:8b", "choices": [],
               "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                         "total_tokens": prompt + completion,
                         "prompt_tokens_details": {"cached_tokens": cached}}})
    )
}

const DONE: &str = "data: [DONE]\n\n";

// ---------------------------------------------------------------- session helpers

fn schema(v: Value) -> Option<prost_types::Struct> {
    Some(rozd::api::convert::json_to_struct(&v))
}

fn pure_tool(name: &str) -> proto::ToolSchema {
    proto::ToolSchema {
        name: name.into(),
        description: format!("reads {name}"),
        parameters_schema: schema(json!({"type": "object"})),
        timeout_ms: 5_000,
        category: proto::ToolCategoryHint::ToolCategoryPure as i32,
    }
}

fn user(content: &str) -> Req {
    Req::UserMessage(proto::UserMessage {
        content: content.into(),
        ..Default::default()
    })
}

fn tool_result(id: &str, text: &str) -> Req {
    Req::ToolResult(proto::ToolResult {
        tool_call_id: id.into(),
        success: true,
        result: text.into(),
        exit_code: Some(0),
        ..Default::default()
    })
}

async fn open(
    daemon: &TestDaemon,
    model: Option<&str>,
    tools: Vec<proto::ToolSchema>,
) -> (Session, proto::SessionStarted) {
    let mut client = daemon.agent().await;
    let mut session = Session::open(&mut client).await;
    let started = session
        .start(proto::StartSession {
            environment_id: "test".into(),
            model: model.map(str::to_string),
            tools,
            ..Default::default()
        })
        .await;
    (session, started)
}

fn thinking_of(responses: &[Resp]) -> String {
    responses
        .iter()
        .filter_map(|r| match r {
            Resp::ThinkingDelta(d) => Some(d.content.as_str()),
            _ => None,
        })
        .collect()
}

fn errors_of(responses: &[Resp]) -> Vec<proto::SessionError> {
    responses
        .iter()
        .filter_map(|r| match r {
            Resp::Error(e) => Some(e.clone()),
            _ => None,
        })
        .collect()
}

fn compactions_of(responses: &[Resp]) -> Vec<proto::ContextCompacted> {
    responses
        .iter()
        .filter_map(|r| match r {
            Resp::ContextCompacted(c) => Some(c.clone()),
            _ => None,
        })
        .collect()
}

async fn next_tool_request(session: &mut Session) -> proto::ToolRequest {
    loop {
        match session.next().await {
            Resp::ToolRequest(r) => return r,
            Resp::TurnComplete(t) => panic!("turn ended before a ToolRequest: {t:?}"),
            Resp::Error(e) => panic!("error before a ToolRequest: {e:?}"),
            _ => {}
        }
    }
}

fn params(request: &proto::ToolRequest) -> Value {
    rozd::api::convert::struct_to_json(request.parameters.as_ref().unwrap(), "parameters").unwrap()
}

fn header<'a>(seen: &'a Seen, name: &str) -> Option<&'a str> {
    seen.headers.get(name).and_then(|v| v.to_str().ok())
}

// ---------------------------------------------------------------- Anthropic

#[tokio::test]
async fn anthropic_text_streams_as_deltas_with_usage_and_cached_system_prompt() {
    let mut fake = FakeProvider::start().await;
    let daemon = TestDaemon::start(&fake.anthropic_endpoint("claude", "claude-test-1", "")).await;
    // Byte for byte the example stream of Anthropic's streaming documentation.
    fake.stream(vec![
        "event: message_start\ndata: {\"type\": \"message_start\", \"message\": {\"id\": \"msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY\", \"type\": \"message\", \"role\": \"assistant\", \"content\": [], \"model\": \"claude-test-1\", \"stop_reason\": null, \"stop_sequence\": null, \"usage\": {\"input_tokens\": 25, \"cache_creation_input_tokens\": 7, \"cache_read_input_tokens\": 1200, \"output_tokens\": 1}}}\n\n".into(),
        "event: content_block_start\ndata: {\"type\": \"content_block_start\", \"index\": 0, \"content_block\": {\"type\": \"text\", \"text\": \"\"}}\n\n".into(),
        "event: ping\ndata: {\"type\": \"ping\"}\n\n".into(),
        "event: content_block_delta\ndata: {\"type\": \"content_block_delta\", \"index\": 0, \"delta\": {\"type\": \"text_delta\", \"text\": \"Hello\"}}\n\n".into(),
        "event: content_block_delta\ndata: {\"type\": \"content_block_delta\", \"index\": 0, \"delta\": {\"type\": \"text_delta\", \"text\": \"!\"}}\n\n".into(),
        "event: content_block_stop\ndata: {\"type\": \"content_block_stop\", \"index\": 0}\n\n".into(),
        "event: message_delta\ndata: {\"type\": \"message_delta\", \"delta\": {\"stop_reason\": \"end_turn\", \"stop_sequence\":null}, \"usage\": {\"output_tokens\": 15}}\n\n".into(),
        "event: message_stop\ndata: {\"type\": \"message_stop\"}\n\n".into(),
    ]);
    let (mut session, started) = open(&daemon, Some("claude"), vec![]).await;
    assert_eq!(started.model, "claude-test-1", "the model actually used");
    session.send(user("say hello")).await;
    let (seen, done) = until_complete(&mut session).await;
    assert_eq!(text_of(&seen), "Hello!");
    assert!(
        seen.iter()
            .filter(|r| matches!(r, Resp::TextDelta(_)))
            .count()
            == 2
    );
    assert_eq!(done.stop_reason, "end_turn");
    assert_eq!(
        done.usage,
        Some(proto::TokenUsage {
            input_tokens: 25,
            output_tokens: 15,
            cache_read_tokens: 1200,
            cache_creation_tokens: 7,
            estimated: false,
        })
    );

    let request = fake.request().await;
    assert_eq!(request.path, "/v1/messages");
    assert_eq!(
        header(&request, "x-api-key"),
        Some("sk-ant-test-0123456789abcdefghij")
    );
    assert_eq!(header(&request, "anthropic-version"), Some("2023-06-01"));
    assert_eq!(request.body["model"], "claude-test-1");
    assert_eq!(request.body["stream"], true);
    assert_eq!(request.body["max_tokens"], 4096);
    assert!(request.body.get("thinking").is_none());
    let system = &request.body["system"][0];
    assert!(
        system["text"]
            .as_str()
            .unwrap()
            .contains("You are an agent session on rozd host")
    );
    assert_eq!(system["cache_control"], json!({"type": "ephemeral"}));
    assert_eq!(
        request.body["messages"],
        json!([{"role": "user", "content": [
            {"type": "text", "text": "say hello", "cache_control": {"type": "ephemeral"}}
        ]}])
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn anthropic_thinking_streams_and_its_signature_is_sent_back_next_turn() {
    let mut fake = FakeProvider::start().await;
    let daemon = TestDaemon::start(&fake.anthropic_endpoint(
        "claude",
        "claude-test-1",
        "thinking_budget_tokens = 2048",
    ))
    .await;
    fake.stream(anthropic(
        &[
            Part::Thinking(
                "The user greets me. A short answer fits. ".into(),
                "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pk",
            ),
            Part::Text("Hi there."),
        ],
        "end_turn",
        U::default(),
    ));
    fake.stream(anthropic(&[Part::Text("Again.")], "end_turn", U::default()));
    let (mut session, _) = open(&daemon, Some("claude"), vec![]).await;
    session.send(user("hello")).await;
    let (seen, done) = until_complete(&mut session).await;
    assert_eq!(
        thinking_of(&seen),
        "The user greets me. A short answer fits. "
    );
    assert_eq!(text_of(&seen), "Hi there.");
    assert_eq!(done.stop_reason, "end_turn");
    let first = fake.request().await;
    assert_eq!(
        first.body["thinking"],
        json!({"type": "enabled", "budget_tokens": 2048})
    );

    session.send(user("and again")).await;
    let (seen, _) = until_complete(&mut session).await;
    assert_eq!(text_of(&seen), "Again.");
    let second = fake.request().await;
    assert_eq!(
        second.body["messages"][1],
        json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": "The user greets me. A short answer fits. ",
             "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pk"},
            {"type": "text", "text": "Hi there."},
        ]})
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn anthropic_tool_use_from_many_json_fragments_round_trips_with_thinking_and_cached_tools() {
    let mut fake = FakeProvider::start().await;
    let daemon = TestDaemon::start(&fake.anthropic_endpoint(
        "claude",
        "claude-test-1",
        "thinking_budget_tokens = 1024",
    ))
    .await;
    fake.stream(anthropic(
        &[
            Part::Thinking("I should read the sensor. ".into(), "sig-1"),
            Part::Text("Reading it."),
            Part::Tool(
                "toolu_01A09q90qw90lq917835lq9",
                "read_sensor",
                vec![
                    "",
                    "{\"",
                    "na",
                    "me\": ",
                    "\"front",
                    "_dist",
                    "ance\"",
                    ", \"sam",
                    "ples\": 3",
                    "}",
                ],
            ),
        ],
        "tool_use",
        U {
            input: 400,
            output: 60,
            ..U::default()
        },
    ));
    fake.stream(anthropic(
        &[Part::Text("It is 1.25 m away.")],
        "end_turn",
        U {
            input: 500,
            output: 10,
            ..U::default()
        },
    ));
    let (mut session, _) = open(
        &daemon,
        Some("claude"),
        vec![pure_tool("camera"), pure_tool("read_sensor")],
    )
    .await;
    session.send(user("how far is the wall?")).await;
    let call = next_tool_request(&mut session).await;
    assert_eq!(call.tool_call_id, "toolu_01A09q90qw90lq917835lq9");
    assert_eq!(call.tool_name, "read_sensor");
    assert_eq!(
        params(&call),
        json!({"name": "front_distance", "samples": 3})
    );
    session
        .send(tool_result(&call.tool_call_id, "1.25 m"))
        .await;
    let (seen, done) = until_complete(&mut session).await;
    assert_eq!(text_of(&seen), "It is 1.25 m away.");
    assert_eq!(done.stop_reason, "end_turn");
    let usage = done.usage.unwrap();
    assert_eq!((usage.input_tokens, usage.output_tokens), (900, 70));

    let first = fake.request().await;
    let tools = first.body["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 2);
    assert_eq!(tools[0]["name"], "camera");
    assert!(tools[0].get("cache_control").is_none());
    assert_eq!(tools[1]["name"], "read_sensor");
    assert_eq!(tools[1]["input_schema"], json!({"type": "object"}));
    assert_eq!(tools[1]["cache_control"], json!({"type": "ephemeral"}));
    let second = fake.request().await;
    assert_eq!(
        second.body["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "how far is the wall?"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "I should read the sensor. ", "signature": "sig-1"},
                {"type": "text", "text": "Reading it."},
                {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "read_sensor",
                 "input": {"name": "front_distance", "samples": 3}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01A09q90qw90lq917835lq9",
                 "content": "1.25 m\n[exit code 0]", "is_error": false,
                 "cache_control": {"type": "ephemeral"}},
            ]},
        ])
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn anthropic_error_event_mid_stream_ends_the_turn_and_nothing_partial_is_recorded() {
    let mut fake = FakeProvider::start().await;
    let daemon = TestDaemon::start(&fake.anthropic_endpoint("claude", "claude-test-1", "")).await;
    let mut events = anthropic(&[Part::Text("Half an ")], "end_turn", U::default());
    // Cut after the text deltas: the provider fails mid-answer.
    events.truncate(events.len() - 6);
    events.push(event(
        "error",
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ));
    fake.stream(events);
    let (mut session, started) = open(&daemon, Some("claude"), vec![]).await;
    session.send(user("tell me")).await;
    let (seen, done) = until_complete(&mut session).await;
    assert_eq!(text_of(&seen), "Half an ", "what arrived was streamed");
    let errors = errors_of(&seen);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].code, "model_error");
    assert!(errors[0].retryable);
    assert!(
        errors[0].message.contains("overloaded_error") && errors[0].message.contains("Overloaded"),
        "{}",
        errors[0].message
    );
    assert_eq!(done.stop_reason, "error");
    let _ = fake.request().await;
    fake.no_more_requests();

    let (_, turns) = daemon
        .host
        .store()
        .session(started.session_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(turns.len(), 1);
    assert_eq!(turns[0].stop_reason, "error");
    assert_eq!(
        turns[0].messages,
        json!([{"role": "user", "content": [{"type": "text", "text": "tell me"}]}]),
        "the broken answer is not recorded"
    );
    daemon.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn http_429_is_retried_after_its_retry_after() {
    let mut fake = FakeProvider::start().await;
    fake.wait = PAUSED_WAIT;
    let daemon = TestDaemon::setup(&fake.anthropic_endpoint("claude", "claude-test-1", ""))
        .paused_clock()
        .start()
        .await;
    fake.reply(Reply::Status {
        code: 429,
        headers: vec![
            ("content-type", "application/json".into()),
            ("retry-after", "3".into()),
        ],
        body: json!({"type": "error", "error": {"type": "rate_limit_error", "message": "Number of request tokens has exceeded your per-minute rate limit"}}).to_string(),
    });
    fake.stream(anthropic(
        &[Part::Text("Made it.")],
        "end_turn",
        U::default(),
    ));
    let (mut session, _) = open(&daemon, Some("claude"), vec![]).await;
    session.wait_bound = PAUSED_WAIT;
    session.send(user("hi")).await;
    let (seen, done) = until_complete(&mut session).await;
    assert!(errors_of(&seen).is_empty(), "{seen:?}");
    assert_eq!(text_of(&seen), "Made it.");
    assert_eq!(done.stop_reason, "end_turn");
    let first = fake.request().await;
    let second = fake.request().await;
    let waited = second.at - first.at;
    assert!(
        waited >= Duration::from_secs(3) && waited < Duration::from_secs(4),
        "waited {waited:?}"
    );
    assert_eq!(first.body, second.body, "the same request is sent again");
    daemon.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn overload_until_the_retry_budget_is_spent_is_a_retryable_model_error() {
    let mut fake = FakeProvider::start().await;
    fake.wait = PAUSED_WAIT;
    let daemon = TestDaemon::setup(&format!(
            "[model]\nretry_budget_ms = 5000\nretry_initial_backoff_ms = 500\nretry_max_backoff_ms = 2000\n{}",
            fake.anthropic_endpoint("claude", "claude-test-1", "")
        )).paused_clock().start()
    .await;
    *fake.script.fallback.lock().unwrap() = Some((
        529,
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
            .to_string(),
    ));
    let (mut session, _) = open(&daemon, Some("claude"), vec![]).await;
    session.wait_bound = PAUSED_WAIT;
    session.send(user("hi")).await;
    let (seen, done) = until_complete(&mut session).await;
    let errors = errors_of(&seen);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].code, "model_error");
    assert!(errors[0].retryable);
    assert!(
        errors[0].message.contains("529")
            && errors[0].message.contains("overloaded_error: Overloaded")
            && errors[0].message.contains("gave up"),
        "{}",
        errors[0].message
    );
    assert_eq!(done.stop_reason, "error");
    let mut times = vec![fake.request().await.at];
    while let Ok(seen) = fake.seen.try_recv() {
        times.push(seen.at);
    }
    assert!(times.len() >= 3, "{} attempts", times.len());
    assert!(times[times.len() - 1] - times[0] <= Duration::from_secs(5));
    for pair in times.windows(2) {
        assert!(
            pair[1] - pair[0] >= Duration::from_millis(250),
            "backoff between attempts"
        );
    }
    daemon.shutdown().await;
}

#[tokio::test]
async fn an_overloaded_error_event_before_any_content_is_retried_invisibly() {
    let mut fake = FakeProvider::start().await;
    let daemon = TestDaemon::start(&format!(
        "[model]\nretry_initial_backoff_ms = 1\nretry_max_backoff_ms = 1\n{}",
        fake.anthropic_endpoint("claude", "claude-test-1", "")
    ))
    .await;
    fake.stream(vec![
        event(
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "usage": {"input_tokens": 5, "output_tokens": 1}}}),
        ),
        event(
            "error",
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        ),
    ]);
    fake.stream(anthropic(
        &[Part::Text("Second try.")],
        "end_turn",
        U::default(),
    ));
    let (mut session, _) = open(&daemon, Some("claude"), vec![]).await;
    session.send(user("hi")).await;
    let (seen, done) = until_complete(&mut session).await;
    assert!(errors_of(&seen).is_empty(), "{seen:?}");
    assert_eq!(text_of(&seen), "Second try.");
    assert_eq!(done.stop_reason, "end_turn");
    let first = fake.request().await;
    let second = fake.request().await;
    assert_eq!(first.body, second.body);
    daemon.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn connection_failures_are_retried_within_the_budget() {
    // A port that nothing listens on.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let daemon = TestDaemon::setup(&format!(
            "[model]\nretry_budget_ms = 3000\n[[model.endpoints]]\nname = \"box\"\nprovider = \"openai\"\n\
             model = \"m\"\nbase_url = \"http://127.0.0.1:{port}/v1\"\n"
        )).paused_clock().start()
    .await;
    let (mut session, _) = open(&daemon, Some("box"), vec![]).await;
    session.wait_bound = PAUSED_WAIT;
    session.send(user("hi")).await;
    let asked = tokio::time::Instant::now();
    let (seen, done) = until_complete(&mut session).await;
    let errors = errors_of(&seen);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].code, "model_error");
    assert!(errors[0].retryable);
    assert!(
        errors[0].message.contains(&format!("127.0.0.1:{port}"))
            && errors[0].message.contains("gave up after"),
        "{}",
        errors[0].message
    );
    assert!(
        !errors[0].message.contains("gave up after 1 attempt"),
        "{}",
        errors[0].message
    );
    assert_eq!(done.stop_reason, "error");
    assert!(tokio::time::Instant::now() - asked <= Duration::from_secs(3));
    daemon.shutdown().await;
}

/// A server that answers every call with the same HTTP 500 is a
/// deterministic error, not an outage: two retries (the default), then the
/// server's own message, in seconds rather than the whole retry budget.
#[tokio::test(start_paused = true)]
async fn the_same_http_500_is_retried_twice_then_reported_with_the_servers_message() {
    let mut fake = FakeProvider::start().await;
    fake.wait = PAUSED_WAIT;
    let daemon = TestDaemon::setup(&fake.openai_endpoint("box", "m", ""))
        .paused_clock()
        .start()
        .await;
    *fake.script.fallback.lock().unwrap() = Some((
        500,
        json!({"error": {"message": "7 validation errors for ChatCompletionRequest", "type": "internal_server_error"}})
            .to_string(),
    ));
    let (mut session, _) = open(&daemon, Some("box"), vec![]).await;
    session.wait_bound = PAUSED_WAIT;
    session.send(user("hi")).await;
    let asked = tokio::time::Instant::now();
    let (seen, done) = until_complete(&mut session).await;
    let errors = errors_of(&seen);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].code, "model_error");
    assert!(
        errors[0].message.contains("500")
            && errors[0].message.contains("7 validation errors")
            && errors[0].message.contains("3 attempt(s)"),
        "{}",
        errors[0].message
    );
    assert_eq!(done.stop_reason, "error");
    assert!(
        tokio::time::Instant::now() - asked <= Duration::from_secs(10),
        "the deterministic error took {:?}",
        tokio::time::Instant::now() - asked
    );
    for _ in 0..3 {
        let _ = fake.request().await;
    }
    fake.no_more_requests();
    daemon.shutdown().await;
}

/// Other 4xx answers are the request's fault: not retried.
#[tokio::test]
async fn other_4xx_answers_are_not_retried() {
    let mut fake = FakeProvider::start().await;
    let daemon = TestDaemon::start(&fake.openai_endpoint("box", "m", "")).await;
    fake.reply(Reply::Status {
        code: 409,
        headers: vec![("content-type", "application/json".into())],
        body: json!({"error": {"message": "conflict here"}}).to_string(),
    });
    let (mut session, _) = open(&daemon, Some("box"), vec![]).await;
    session.send(user("hi")).await;
    let (seen, _) = until_complete(&mut session).await;
    let errors = errors_of(&seen);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].message.contains("conflict here"),
        "{}",
        errors[0].message
    );
    assert!(!errors[0].retryable);
    let _ = fake.request().await;
    fake.no_more_requests();
    daemon.shutdown().await;
}

#[tokio::test]
async fn http_401_is_not_retried_and_reports_the_provider_message() {
    let mut fake = FakeProvider::start().await;
    let daemon = TestDaemon::start(&fake.anthropic_endpoint("claude", "claude-test-1", "")).await;
    fake.reply(Reply::Status {
        code: 401,
        headers: vec![("content-type", "application/json".into())],
        body: json!({"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}).to_string(),
    });
    let (mut session, _) = open(&daemon, Some("claude"), vec![]).await;
    session.send(user("hi")).await;
    let (seen, done) = until_complete(&mut session).await;
    let errors = errors_of(&seen);
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].code, "model_error");
    assert!(!errors[0].retryable);
    assert!(
        errors[0].message.contains("401")
            && errors[0]
                .message
                .contains("authentication_error: invalid x-api-key"),
        "{}",
        errors[0].message
    );
    assert_eq!(done.stop_reason, "error");
    let _ = fake.request().await;
    fake.no_more_requests();
    daemon.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_stalled_stream_hits_the_idle_timeout_and_ends_the_turn() {
    let mut fake = FakeProvider::start().await;
    fake.wait = PAUSED_WAIT;
    let daemon = TestDaemon::setup(&fake.anthropic_endpoint(
        "claude",
        "claude-test-1",
        "idle_timeout_ms = 30000",
    ))
    .paused_clock()
    .start()
    .await;
    let mut events = anthropic(&[Part::Text("Starting ")], "end_turn", U::default());
    events.truncate(events.len() - 6);
    fake.reply(Reply::Stream {
        chunks: events,
        stall: true,
    });
    let (mut session, _) = open(&daemon, Some("claude"), vec![]).await;
    session.wait_bound = PAUSED_WAIT;
    session.send(user("go")).await;
    let asked = tokio::time::Instant::now();
    let (seen, done) = until_complete(&mut session).await;
    assert_eq!(text_of(&seen), "Starting ");
    let errors = errors_of(&seen);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].code, "model_error");
    assert!(errors[0].retryable);
    assert!(
        errors[0].message.contains("stalled") && errors[0].message.contains("30000 ms"),
        "{}",
        errors[0].message
    );
    assert_eq!(done.stop_reason, "error");
    let waited = tokio::time::Instant::now() - asked;
    assert!(
        waited >= Duration::from_secs(30) && waited < Duration::from_secs(31),
        "{waited:?}"
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn a_missing_api_key_names_the_variable_and_sends_nothing() {
    let mut fake = FakeProvider::start().await;
    let daemon = TestDaemon::start(&format!(
        "[[model.endpoints]]\nname = \"claude\"\nprovider = \"anthropic\"\nmodel = \"claude-test-1\"\n\
         base_url = {:?}\napi_key_env = {UNSET_VAR:?}\n",
        fake.url
    ))
    .await;
    let (mut session, _) = open(&daemon, Some("claude"), vec![]).await;
    session.send(user("hi")).await;
    let (seen, done) = until_complete(&mut session).await;
    let errors = errors_of(&seen);
    assert_eq!(errors[0].code, "model_error");
    assert!(!errors[0].retryable);
    assert!(
        errors[0].message.contains(UNSET_VAR),
        "{}",
        errors[0].message
    );
    assert_eq!(done.stop_reason, "error");
    fake.no_more_requests();
    daemon.shutdown().await;
}

// ---------------------------------------------------------------- OpenAI-compatible

#[tokio::test]
async fn openai_text_reasoning_and_usage_with_stream_options() {
    let mut fake = FakeProvider::start().await;
    let daemon = TestDaemon::start(&fake.openai_endpoint("box", "qwen3:8b", "")).await;
    fake.stream(vec![
        chunk(json!({"role": "assistant", "content": ""}), None),
        chunk(json!({"reasoning_content": "The user wants "}), None),
        chunk(json!({"reasoning": "a greeting."}), None),
        chunk(json!({"content": "Hello"}), None),
        chunk(json!({"content": " there"}), None),
        chunk(json!({}), Some("stop")),
        usage_chunk(120, 14, 100),
        DONE.into(),
    ]);
    let (mut session, started) = open(&daemon, Some("box"), vec![]).await;
    assert_eq!(started.model, "qwen3:8b");
    session.send(user("hello")).await;
    let (seen, done) = until_complete(&mut session).await;
    assert_eq!(thinking_of(&seen), "The user wants a greeting.");
    assert_eq!(text_of(&seen), "Hello there");
    assert_eq!(done.stop_reason, "end_turn");
    assert_eq!(
        done.usage,
        Some(proto::TokenUsage {
            input_tokens: 20,
            output_tokens: 14,
            cache_read_tokens: 100,
            cache_creation_tokens: 0,
            estimated: false,
        })
    );
    let request = fake.request().await;
    assert_eq!(request.path, "/v1/chat/completions");
    assert_eq!(header(&request, "authorization"), None, "no key configured");
    assert_eq!(request.body["model"], "qwen3:8b");
    assert_eq!(request.body["stream"], true);
    assert_eq!(
        request.body["stream_options"],
        json!({"include_usage": true})
    );
    assert_eq!(request.body["max_tokens"], 4096);
    let messages = request.body["messages"].as_array().unwrap();
    assert_eq!(messages[0]["role"], "system");
    assert!(
        messages[0]["content"]
            .as_str()
            .unwrap()
            .contains("You are an agent session on rozd host")
    );
    assert_eq!(messages[1], json!({"role": "user", "content": "hello"}));
    assert!(request.body.get("tools").is_none());
    daemon.shutdown().await;
}

#[tokio::test]
async fn openai_think_tags_in_content_become_thinking() {
    let mut fake = FakeProvider::start().await;
    let daemon = TestDaemon::start(&fake.openai_endpoint("box", "deepseek-r1:8b", "")).await;
    // llama.cpp / older Ollama: reasoning inline, tags cut across chunks.
    fake.stream(vec![
        chunk(json!({"role": "assistant", "content": "<th"}), None),
        chunk(json!({"content": "ink>\nCheck the "}), None),
        chunk(json!({"content": "units.</thi"}), None),
        chunk(json!({"content": "nk>\n\n42 mm"}), None),
        chunk(json!({}), Some("stop")),
        DONE.into(),
    ]);
    let (mut session, _) = open(&daemon, Some("box"), vec![]).await;
    session.send(user("how wide?")).await;
    let (seen, done) = until_complete(&mut session).await;
    assert_eq!(thinking_of(&seen), "\nCheck the units.");
    assert_eq!(text_of(&seen), "42 mm");
    assert_eq!(done.stop_reason, "end_turn");
    let usage = done.usage.unwrap();
    assert!(
        usage.input_tokens > 0 && usage.output_tokens > 0 && usage.estimated,
        "estimated, and said to be, when the server reports none: {usage:?}"
    );
    let _ = fake.request().await;
    daemon.shutdown().await;
}

#[tokio::test]
async fn openai_parallel_tool_calls_are_assembled_by_index_and_answered_in_order() {
    let mut fake = FakeProvider::start().await;
    let daemon = TestDaemon::start(&fake.openai_endpoint("box", "qwen3:8b", "")).await;
    fake.stream(vec![
        chunk(json!({"role": "assistant", "content": null, "tool_calls": [
            {"index": 0, "id": "call_temp", "type": "function", "function": {"name": "read_sensor", "arguments": ""}}]}), None),
        chunk(json!({"tool_calls": [
            {"index": 1, "id": "call_batt", "type": "function", "function": {"name": "read_sensor", "arguments": ""}}]}), None),
        chunk(json!({"tool_calls": [{"index": 1, "function": {"arguments": "{\"name\": \"bat"}}]}), None),
        chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"name\""}}]}), None),
        chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": ": \"temp\"}"}}]}), None),
        chunk(json!({"tool_calls": [{"index": 1, "function": {"arguments": "tery\"}"}}]}), None),
        chunk(json!({}), Some("tool_calls")),
        usage_chunk(300, 40, 0),
        DONE.into(),
    ]);
    fake.stream(vec![
        chunk(
            json!({"role": "assistant", "content": "21 C, 12.1 V"}),
            None,
        ),
        chunk(json!({}), Some("stop")),
        usage_chunk(380, 8, 256),
        DONE.into(),
    ]);
    let (mut session, _) = open(&daemon, Some("box"), vec![pure_tool("read_sensor")]).await;
    session.send(user("temperature and battery?")).await;
    let first = next_tool_request(&mut session).await;
    assert_eq!(first.tool_call_id, "call_temp");
    assert_eq!(params(&first), json!({"name": "temp"}));
    session.send(tool_result("call_temp", "21 C")).await;
    let second = next_tool_request(&mut session).await;
    assert_eq!(second.tool_call_id, "call_batt");
    assert_eq!(params(&second), json!({"name": "battery"}));
    session.send(tool_result("call_batt", "12.1 V")).await;
    let (seen, done) = until_complete(&mut session).await;
    assert_eq!(text_of(&seen), "21 C, 12.1 V");
    assert_eq!(done.stop_reason, "end_turn");
    let usage = done.usage.unwrap();
    assert_eq!(
        (
            usage.input_tokens,
            usage.output_tokens,
            usage.cache_read_tokens
        ),
        (300 + 380 - 256, 48, 256)
    );

    let first = fake.request().await;
    assert_eq!(
        first.body["tools"],
        json!([{"type": "function", "function": {"name": "read_sensor", "description": "reads read_sensor", "parameters": {"type": "object"}}}])
    );
    let second = fake.request().await;
    let messages = second.body["messages"].as_array().unwrap();
    assert_eq!(
        &messages[1..],
        &[
            json!({"role": "user", "content": "temperature and battery?"}),
            json!({"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_temp", "type": "function", "function": {"name": "read_sensor", "arguments": "{\"name\":\"temp\"}"}},
                {"id": "call_batt", "type": "function", "function": {"name": "read_sensor", "arguments": "{\"name\":\"battery\"}"}},
            ]}),
            json!({"role": "tool", "tool_call_id": "call_temp", "content": "21 C\n[exit code 0]"}),
            json!({"role": "tool", "tool_call_id": "call_batt", "content": "12.1 V\n[exit code 0]"}),
        ]
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn openai_401_message_is_reported_with_the_key_redacted() {
    let mut fake = FakeProvider::start().await;
    let daemon = TestDaemon::start(&fake.openai_endpoint(
        "box",
        "gpt-test",
        &format!("api_key_file = {:?}", fake.key_file),
    ))
    .await;
    fake.reply(Reply::Status {
        code: 401,
        headers: vec![("content-type", "application/json".into())],
        body: json!({"error": {"message": "Incorrect API key provided: sk-ant-test-0123456789abcdefghij. You can find your API key at https://platform.openai.com/account/api-keys.", "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}}).to_string(),
    });
    let (mut session, _) = open(&daemon, Some("box"), vec![]).await;
    session.send(user("hi")).await;
    let (seen, done) = until_complete(&mut session).await;
    let errors = errors_of(&seen);
    assert_eq!(errors[0].code, "model_error");
    assert!(!errors[0].retryable);
    assert!(
        errors[0]
            .message
            .contains("Incorrect API key provided: [redacted]."),
        "{}",
        errors[0].message
    );
    assert!(!errors[0].message.contains("0123456789abcdefghij"));
    assert_eq!(done.stop_reason, "error");
    let request = fake.request().await;
    assert_eq!(
        header(&request, "authorization"),
        Some("Bearer sk-ant-test-0123456789abcdefghij")
    );
    fake.no_more_requests();
    daemon.shutdown().await;
}

// ---------------------------------------------------------------- model selection

#[tokio::test]
async fn claude_model_names_go_to_anthropic_with_the_endpoint_settings() {
    let mut fake = FakeProvider::start().await;
    let daemon = TestDaemon::start(&fake.anthropic_endpoint("claude", "claude-test-1", "")).await;
    fake.stream(anthropic(&[Part::Text("ok")], "end_turn", U::default()));
    let (mut session, started) = open(&daemon, Some("claude-sonnet-4-5-20250929"), vec![]).await;
    assert_eq!(started.model, "claude-sonnet-4-5-20250929");
    session.send(user("hi")).await;
    let (_, done) = until_complete(&mut session).await;
    assert_eq!(done.stop_reason, "end_turn");
    let request = fake.request().await;
    assert_eq!(request.body["model"], "claude-sonnet-4-5-20250929");
    assert_eq!(
        header(&request, "x-api-key"),
        Some("sk-ant-test-0123456789abcdefghij")
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn the_default_endpoint_serves_sessions_that_name_no_model() {
    let mut fake = FakeProvider::start().await;
    let daemon = TestDaemon::start(&format!(
        "[model]\ndefault = \"box\"\n{}",
        fake.openai_endpoint("box", "qwen3:8b", "")
    ))
    .await;
    fake.stream(vec![
        chunk(json!({"content": "from the box"}), None),
        chunk(json!({}), Some("stop")),
        DONE.into(),
    ]);
    let (mut session, started) = open(&daemon, None, vec![]).await;
    assert_eq!(started.model, "qwen3:8b");
    session.send(user("hi")).await;
    let (seen, _) = until_complete(&mut session).await;
    assert_eq!(text_of(&seen), "from the box");
    let _ = fake.request().await;
    // The reported model id selects the same endpoint again.
    let (_, again) = open(&daemon, Some("qwen3:8b"), vec![]).await;
    assert_eq!(again.model, "qwen3:8b");
    daemon.shutdown().await;
}

#[tokio::test]
async fn an_unknown_model_is_invalid_argument_listing_the_endpoints() {
    let fake = FakeProvider::start().await;
    let daemon = TestDaemon::start(&format!(
        "{}{}",
        fake.anthropic_endpoint("claude", "claude-test-1", ""),
        fake.openai_endpoint("box", "qwen3:8b", "")
    ))
    .await;
    let mut client = daemon.agent().await;
    let mut session = Session::open(&mut client).await;
    session
        .send(Req::Start(proto::StartSession {
            model: Some("gpt-imaginary".into()),
            ..Default::default()
        }))
        .await;
    let err = expect_error(session.next_significant().await);
    assert_eq!(err.code, "invalid_argument");
    for name in ["gpt-imaginary", "local", "claude", "box", "claude-*"] {
        assert!(err.message.contains(name), "{name}: {}", err.message);
    }
    daemon.shutdown().await;
}

#[test]
fn model_config_errors_name_the_line_and_key() {
    use rozd::config::{Config, ConfigError, ConfigSource};
    let parse = |text: &str| match Config::parse(text, ConfigSource::BuiltIn) {
        Err(ConfigError::Invalid {
            line, key, message, ..
        }) => (line, key, message),
        other => panic!("expected an invalid-config error, got {other:?}"),
    };
    let (line, key, message) = parse("[model]\ndefault = \"gpt-9\"\n");
    assert_eq!((line, key.as_str()), (Some(2), "model.default"));
    assert!(message.contains("known models: local"), "{message}");
    let (line, key, _) = parse(
        "[model]\ndefault = \"local\"\n\n[[model.endpoints]]\nname = \"a\"\nprovider = \"openai\"\nmodel = \"m\"\n\n\
         [[model.endpoints]]\nname = \"b\"\nprovider = \"anthropic\"\nmodel = \"m\"\nbase_url = \"ftp://x\"\n",
    );
    assert_eq!(
        (line, key.as_str()),
        (Some(13), "model.endpoints[1].base_url")
    );
    let (line, key, _) =
        parse("[[model.endpoints]]\nname = \"a\"\nprovider = \"gemini\"\nmodel = \"m\"\n");
    assert_eq!(
        (line, key.as_str()),
        (Some(3), "model.endpoints[0].provider")
    );
}

// ---------------------------------------------------------------- budgets

#[tokio::test]
async fn the_session_token_budget_is_budget_exceeded_before_the_next_call() {
    let mut fake = FakeProvider::start().await;
    let daemon = TestDaemon::start(&format!(
        "[session]\nmax_session_tokens = 1000\n{}",
        fake.anthropic_endpoint("claude", "claude-test-1", "")
    ))
    .await;
    fake.stream(anthropic(
        &[Part::Text("expensive")],
        "end_turn",
        U {
            input: 600,
            output: 100,
            cache_read: 300,
            cache_creation: 0,
        },
    ));
    let (mut session, _) = open(&daemon, Some("claude"), vec![]).await;
    session.send(user("one")).await;
    let (_, done) = until_complete(&mut session).await;
    assert_eq!(done.stop_reason, "end_turn");
    let _ = fake.request().await;
    session.send(user("two")).await;
    let (seen, done) = until_complete(&mut session).await;
    let errors = errors_of(&seen);
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].code, "budget_exceeded");
    assert!(!errors[0].retryable);
    assert!(
        errors[0]
            .message
            .contains("1000 tokens of its budget of 1000"),
        "{}",
        errors[0].message
    );
    assert_eq!(done.stop_reason, "error");
    fake.no_more_requests();
    daemon.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn keepalive_reports_the_provider_figures_and_the_endpoint_window() {
    let mut fake = FakeProvider::start().await;
    fake.wait = PAUSED_WAIT;
    let daemon = TestDaemon::setup(&format!(
        "[session]\nkeepalive_secs = 5\n{}",
        fake.anthropic_endpoint("claude", "claude-test-1", "max_context_tokens = 8000")
    ))
    .paused_clock()
    .start()
    .await;
    fake.stream(anthropic(
        &[Part::Text("noted")],
        "end_turn",
        U {
            input: 1000,
            output: 50,
            cache_read: 500,
            cache_creation: 20,
        },
    ));
    let (mut session, _) = open(&daemon, Some("claude"), vec![]).await;
    session.wait_bound = PAUSED_WAIT;
    session.send(user("remember this")).await;
    let _ = until_complete(&mut session).await;
    loop {
        if let Resp::Keepalive(k) = session.next().await {
            assert_eq!(
                k.tokens_max,
                Some(8000),
                "the endpoint's window caps the budget"
            );
            assert_eq!(k.tokens_used, Some(1000 + 50 + 500 + 20));
            break;
        }
    }
    daemon.shutdown().await;
}

// ---------------------------------------------------------------- compaction

fn words(word: &str, n: usize) -> String {
    format!("{word} ").repeat(n)
}

#[tokio::test]
async fn compaction_elides_old_tool_results_then_old_thinking_and_the_next_request_is_smaller() {
    let mut fake = FakeProvider::start().await;
    let daemon = TestDaemon::start(&format!(
        "[session]\ncompact_target = 0.2\ncompact_tool_results_at = 0.3\ncompact_thinking_at = 0.4\n\
         compact_summary_at = 0.9\n{}",
        fake.anthropic_endpoint("claude", "claude-test-1", "thinking_budget_tokens = 1024")
    ))
    .await;
    // Usage 0: the estimate stays uncalibrated, so the figures are predictable.
    let thinking = words("mull", 4000);
    fake.stream(anthropic(
        &[
            Part::Thinking(thinking.clone(), "sig-big"),
            Part::Tool("toolu_1", "read_sensor", vec!["{}"]),
        ],
        "tool_use",
        U::default(),
    ));
    fake.stream(anthropic(
        &[Part::Text("Logged.")],
        "end_turn",
        U::default(),
    ));
    fake.stream(anthropic(&[Part::Text("Next.")], "end_turn", U::default()));
    let mut client = daemon.agent().await;
    let mut session = Session::open(&mut client).await;
    session
        .start(proto::StartSession {
            model: Some("claude".into()),
            tools: vec![pure_tool("read_sensor")],
            max_context_tokens: Some(10_000),
            ..Default::default()
        })
        .await;
    session.send(user("log the sensor")).await;
    let call = next_tool_request(&mut session).await;
    session
        .send(tool_result(&call.tool_call_id, &words("data", 1000)))
        .await;
    let (seen, _) = until_complete(&mut session).await;
    assert!(
        compactions_of(&seen).is_empty(),
        "the current turn's thinking and latest results are never compacted: {seen:?}"
    );
    let _ = fake.request().await;
    let before = fake.request().await;
    assert!(before.body.to_string().contains("sig-big"));

    session.send(user("next")).await;
    let (seen, done) = until_complete(&mut session).await;
    assert_eq!(done.stop_reason, "end_turn");
    let c = compactions_of(&seen);
    assert_eq!(c.len(), 2, "{c:?}");
    assert_eq!(c[0].level, "tool_results");
    assert!(
        c[0].tokens_before > 5_000 && c[0].tokens_after < c[0].tokens_before - 900,
        "{c:?}"
    );
    assert_eq!((c[0].messages_before, c[0].messages_after), (5, 5));
    assert_eq!(c[1].level, "thinking");
    assert_eq!(c[1].tokens_before, c[0].tokens_after);
    assert!(c[1].tokens_after <= 2_000, "down to compact_target: {c:?}");
    assert_eq!((c[1].messages_before, c[1].messages_after), (5, 5));

    let after = fake.request().await;
    assert!(
        after.len < before.len / 4,
        "{} vs {}",
        after.len,
        before.len
    );
    let history = after.body["messages"].to_string();
    assert!(history.contains("result elided by rozd"), "{history}");
    assert!(!history.contains("sig-big") && !history.contains("mull"));
    assert!(
        history.contains("toolu_1"),
        "the call and its result stay paired"
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn compaction_summarises_the_oldest_turns_with_the_model_itself() {
    let mut fake = FakeProvider::start().await;
    let daemon = TestDaemon::start(&format!(
        "[session]\ncompact_target = 0.2\ncompact_tool_results_at = 0.3\ncompact_thinking_at = 0.3\n\
         compact_summary_at = 0.3\n{}",
        fake.anthropic_endpoint("claude", "claude-test-1", "thinking_budget_tokens = 1024")
    ))
    .await;
    let text = |t: &str| proto::ContentPart {
        part: Some(proto::content_part::Part::Text(proto::TextContent {
            text: t.into(),
        })),
    };
    let history: Vec<proto::ConversationMessage> = (1..=3)
        .flat_map(|i| {
            [
                proto::ConversationMessage {
                    role: "user".into(),
                    parts: vec![text(&format!("question {i}"))],
                },
                proto::ConversationMessage {
                    role: "assistant".into(),
                    parts: vec![text(&format!("answer {i} {}", words("blah", 1500)))],
                },
            ]
        })
        .collect();
    // First the summary call, then the turn's own call.
    fake.stream(anthropic(
        &[Part::Text("SUMMARY: three questions, three long answers.")],
        "end_turn",
        U {
            input: 4600,
            output: 12,
            ..U::default()
        },
    ));
    fake.stream(anthropic(&[Part::Text("Fresh.")], "end_turn", U::default()));
    let mut client = daemon.agent().await;
    let mut session = Session::open(&mut client).await;
    session
        .start(proto::StartSession {
            model: Some("claude".into()),
            history,
            max_context_tokens: Some(10_000),
            ..Default::default()
        })
        .await;
    session.send(user("now what?")).await;
    let (seen, done) = until_complete(&mut session).await;
    assert_eq!(
        text_of(&seen),
        "Fresh.",
        "the summary is not streamed as the answer"
    );
    assert_eq!(done.stop_reason, "end_turn");
    assert_eq!(
        done.usage.unwrap().input_tokens,
        4600,
        "the summary call counts"
    );
    let c = compactions_of(&seen);
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!(c[0].level, "summary");
    assert_eq!((c[0].messages_before, c[0].messages_after), (7, 2));
    assert!(
        c[0].tokens_before > 4_500 && c[0].tokens_after < 1_000,
        "{c:?}"
    );
    assert_eq!(
        c[0].summary.as_deref(),
        Some("SUMMARY: three questions, three long answers.")
    );

    let summary_request = fake.request().await;
    assert!(summary_request.body.get("tools").is_none());
    assert!(summary_request.body.get("thinking").is_none());
    assert_eq!(summary_request.body["max_tokens"], 1024);
    assert!(
        summary_request.body["system"][0]["text"]
            .as_str()
            .unwrap()
            .contains("compress the early part of a conversation")
    );
    let transcript = summary_request.body["messages"][0]["content"][0]["text"]
        .as_str()
        .unwrap();
    assert!(transcript.starts_with("User: question 1\nAssistant: answer 1 blah"));
    assert!(transcript.contains("User: question 3"));

    let turn_request = fake.request().await;
    assert!(turn_request.len < summary_request.len / 4);
    let messages = turn_request.body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2);
    assert!(
        messages[0]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("SUMMARY: three questions")
    );
    assert_eq!(messages[1]["content"][0]["text"], "now what?");
    daemon.shutdown().await;
}

// ---------------------------------------------------------------- cameras

/// A simulated rover with its camera (small, for a quick test).
const SIM_CAMERA: &str = "[sim]\n[[sensors]]\nname = \"front_distance\"\nsource = \"sim\"\n\
                          quantity = \"front_distance\"\n\
                          [[cameras]]\nname = \"front_camera\"\nsource = \"sim\"\n\
                          width = 320\nheight = 240\nmax_image_px = 160\n";

/// Decodes base64 JPEG data and returns its size (a decoder independent of
/// the encoder rozd uses).
fn jpeg_size(base64_data: &str) -> (u32, u32) {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(base64_data)
        .expect("base64");
    let (_, w, h) = rozd::camera::jpeg::decode_rgb(&bytes).expect("a JPEG that decodes");
    (w, h)
}

/// Waits until the daemon's camera has a frame (polling, bounded).
async fn camera_ready(daemon: &TestDaemon) {
    tokio::time::timeout(common::EXPECT_WITHIN, async {
        let camera = daemon.host.cameras().get("front_camera").expect("camera");
        let mut frames = camera.subscribe();
        while frames.borrow_and_update().is_none() {
            frames.changed().await.expect("camera alive");
        }
    })
    .await
    .expect("the sim camera captures");
}

#[tokio::test]
async fn anthropic_capture_image_sends_the_picture_inside_the_tool_result() {
    let mut fake = FakeProvider::start().await;
    let daemon = TestDaemon::start(&format!(
        "{SIM_CAMERA}{}",
        fake.anthropic_endpoint("claude", "claude-test-1", "")
    ))
    .await;
    camera_ready(&daemon).await;
    fake.stream(anthropic(
        &[Part::Tool(
            "toolu_cam",
            "capture_image",
            vec!["{\"camera\": \"front_camera\"}"],
        )],
        "tool_use",
        U::default(),
    ));
    fake.stream(anthropic(
        &[Part::Text("A blue wall ahead.")],
        "end_turn",
        U::default(),
    ));
    let (mut session, _) = open(&daemon, Some("claude"), vec![]).await;
    session.send(user("what do you see?")).await;
    let (seen, done) = until_complete(&mut session).await;
    assert_eq!(done.stop_reason, "end_turn");
    assert_eq!(text_of(&seen), "A blue wall ahead.");

    let first = fake.request().await;
    let tools = first.body["tools"].as_array().unwrap();
    let capture = tools
        .iter()
        .find(|t| t["name"] == "capture_image")
        .expect("capture_image offered");
    assert_eq!(
        capture["input_schema"]["properties"]["camera"]["enum"],
        json!(["front_camera"])
    );
    assert!(tools.iter().any(|t| t["name"] == "list_cameras"));
    let second = fake.request().await;
    let result = &second.body["messages"][2]["content"];
    assert_eq!(result.as_array().map(Vec::len), Some(1), "{result}");
    let result = &result[0];
    assert_eq!(result["type"], "tool_result");
    assert_eq!(result["tool_use_id"], "toolu_cam");
    assert_eq!(result["is_error"], false);
    let parts = result["content"].as_array().expect("text and image");
    assert_eq!(parts[0]["type"], "text");
    let text: Value = serde_json::from_str(parts[0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(text["camera"], "front_camera");
    assert_eq!(
        (text["width"].as_u64(), text["height"].as_u64()),
        (Some(160), Some(120))
    );
    assert_eq!(parts[1]["type"], "image");
    assert_eq!(parts[1]["source"]["type"], "base64");
    assert_eq!(parts[1]["source"]["media_type"], "image/jpeg");
    // Fitted to max_image_px = 160 on the long edge.
    assert_eq!(
        jpeg_size(parts[1]["source"]["data"].as_str().unwrap()),
        (160, 120)
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn openai_capture_image_sends_the_picture_as_an_image_url_after_the_tool_message() {
    let mut fake = FakeProvider::start().await;
    let daemon = TestDaemon::start(&format!(
        "{SIM_CAMERA}{}",
        fake.openai_endpoint("box", "qwen3-vl", "")
    ))
    .await;
    camera_ready(&daemon).await;
    fake.stream(vec![
        chunk(
            json!({"role": "assistant", "content": "", "tool_calls": [
            {"index": 0, "id": "call_cam", "type": "function", "function": {"name": "capture_image",
             "arguments": "{\"camera\": \"front_camera\", \"max_width\": 80}"}}]}),
            None,
        ),
        chunk(json!({}), Some("tool_calls")),
        DONE.into(),
    ]);
    fake.stream(vec![
        chunk(json!({"role": "assistant", "content": "A wall."}), None),
        chunk(json!({}), Some("stop")),
        DONE.into(),
    ]);
    let (mut session, _) = open(&daemon, Some("box"), vec![]).await;
    session.send(user("look")).await;
    let (seen, _) = until_complete(&mut session).await;
    assert_eq!(text_of(&seen), "A wall.");
    let _first = fake.request().await;
    let second = fake.request().await;
    let messages = second.body["messages"].as_array().unwrap();
    let at = messages
        .iter()
        .position(|m| m["role"] == "tool")
        .expect("a tool message");
    assert_eq!(messages[at]["tool_call_id"], "call_cam");
    let text: Value = serde_json::from_str(messages[at]["content"].as_str().unwrap()).unwrap();
    assert_eq!(text["width"], 80);
    // Chat completions carry no images in tool messages: a user message follows.
    let image_message = &messages[at + 1];
    assert_eq!(image_message["role"], "user");
    let parts = image_message["content"].as_array().expect("parts");
    assert_eq!(parts[0]["type"], "text");
    assert!(parts[0]["text"].as_str().unwrap().contains("call_cam"));
    assert_eq!(parts[1]["type"], "image_url");
    let url = parts[1]["image_url"]["url"].as_str().unwrap();
    let data = url
        .strip_prefix("data:image/jpeg;base64,")
        .expect("a JPEG data URL");
    assert_eq!(jpeg_size(data), (80, 60));
    daemon.shutdown().await;
}

#[tokio::test]
async fn capture_image_of_an_unknown_camera_names_the_known_ones() {
    let mut fake = FakeProvider::start().await;
    let daemon = TestDaemon::start(&format!(
        "{SIM_CAMERA}{}",
        fake.anthropic_endpoint("claude", "claude-test-1", "")
    ))
    .await;
    let outcome = daemon
        .host
        .host_tools()
        .execute("capture_image", &json!({"camera": "rear"}), "s1")
        .await
        .unwrap_err();
    assert!(
        outcome
            .to_string()
            .contains("the cameras are: front_camera"),
        "{outcome}"
    );
    fake.no_more_requests();
    daemon.shutdown().await;
}

// ------------------------------------------------------------ model check

/// `rozd model check` against an OpenAI-compatible server (the strict
/// fake): four calls, each through the provider code sessions use; the
/// forced tool call carries `tool_choice`; every step passes and usage the
/// server reported is said to be reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_check_runs_the_round_trip_and_says_what_works() {
    let mut fake = FakeProvider::start().await;
    fake.stream(vec![
        chunk(json!({"role": "assistant", "content": "O"}), None),
        chunk(json!({"content": "K"}), None),
        chunk(json!({}), Some("stop")),
        usage_chunk(31, 2, 0),
        DONE.into(),
    ]);
    fake.stream(vec![
        chunk(json!({"role": "assistant", "content": "", "tool_calls": [
            {"index": 0, "id": "call_1", "type": "function", "function": {"name": "read_sensor", "arguments": "{\"name\":"}}]}), None),
        chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"temp\"}"}}]}), None),
        chunk(json!({}), Some("tool_calls")),
        DONE.into(),
    ]);
    fake.stream(vec![
        chunk(
            json!({"role": "assistant", "content": "It is 21.5 C."}),
            None,
        ),
        chunk(json!({}), Some("stop")),
        DONE.into(),
    ]);
    fake.stream(vec![
        chunk(json!({"role": "assistant", "content": "Red."}), None),
        chunk(json!({}), Some("stop")),
        DONE.into(),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rozd.toml");
    std::fs::write(&config, fake.openai_endpoint("box", "m", "")).unwrap();
    let config = config.display().to_string();
    let (code, out, err) = common::rozd_cli(&["model", "check", "box", "--config", &config]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    for line in [
        "streamed answer       ok      \"OK\" in 2 piece(s)",
        "tool call (forced)    ok      read_sensor({\"name\":\"temp\"})",
        "tool result accepted  ok      \"It is 21.5 C.\"",
        "usage                 ok      reported by the server: in 31 / out 2",
        "image input           ok      \"Red.\"",
        "every step passed",
    ] {
        assert!(out.contains(line), "{line:?} in:\n{out}");
    }
    let _ = fake.request().await;
    let forced = fake.request().await;
    assert_eq!(
        forced.body["tool_choice"],
        json!({"type": "function", "function": {"name": "read_sensor"}})
    );
    let result = fake.request().await;
    assert_eq!(
        result.body["messages"][3]["role"], "tool",
        "{}",
        result.body
    );
    let image = fake.request().await;
    assert!(
        image.body["messages"][1]["content"][0]["image_url"]["url"]
            .as_str()
            .is_some_and(|u| u.starts_with("data:image/jpeg;base64,")),
        "{}",
        image.body
    );
    fake.no_more_requests();
}

/// A server that refuses: each step says so in the server's words, the
/// check exits 1, and a deterministic HTTP 500 is not retried for a minute
/// (two retries, then the next step). An unknown model is exit 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_check_reports_a_refusing_server_in_its_own_words() {
    let fake = FakeProvider::start().await;
    *fake.script.fallback.lock().unwrap() = Some((
        500,
        json!({"error": {"message": "7 validation errors for ChatCompletionRequest", "type": "internal_server_error"}})
            .to_string(),
    ));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rozd.toml");
    std::fs::write(
        &config,
        format!(
            "[model]\nretry_initial_backoff_ms = 1\nretry_max_backoff_ms = 1\n{}",
            fake.openai_endpoint("box", "m", "")
        ),
    )
    .unwrap();
    let config = config.display().to_string();
    let (code, out, err) = common::rozd_cli(&["model", "check", "box", "--config", &config]).await;
    assert_eq!(code, Some(1), "{out}{err}");
    assert_eq!(
        out.matches("FAILED").count(),
        5,
        "every step fails (usage: nothing to count):\n{out}"
    );
    assert!(
        out.matches("7 validation errors").count() >= 4,
        "the server's own words:\n{out}"
    );
    let (code, _, err) = common::rozd_cli(&["model", "check", "nope", "--config", &config]).await;
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("box"), "names the known models: {err}");
}

// ---------------------------------------------------------------- the robot's manual (issue 36)

/// `GET path` on a daemon at `addr`: the body as JSON (a 200 expected).
async fn get_json(addr: &str, path: &str) -> Value {
    let reply = rozd::cli::client::get(addr, path, None)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    assert_eq!(reply.status.as_u16(), 200, "GET {path}: {}", reply.body);
    serde_json::from_str(&reply.body).unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// The system prompt of an Anthropic Messages request.
fn anthropic_system(seen: &Seen) -> String {
    seen.body["system"][0]["text"]
        .as_str()
        .expect("a system prompt")
        .to_string()
}

/// One turn of `session` answered "ok" by the fake Anthropic endpoint: the
/// system prompt the provider got.
async fn anthropic_turn(fake: &mut FakeProvider, session: &mut Session, content: &str) -> String {
    fake.stream(anthropic(&[Part::Text("ok")], "end_turn", U::default()));
    session.send(user(content)).await;
    let (_, done) = until_complete(session).await;
    assert_eq!(done.stop_reason, "end_turn");
    anthropic_system(&fake.request().await)
}

/// Issue 36: the real binary on the simulated rover with an operator's
/// manual. The exact system prompt a session's model gets opens with the
/// embodiment (every actuator's limits, the reflex rule) and the manual,
/// before the client's project context; the session row records the
/// version. A SIGHUP with a changed manual changes what new sessions are
/// told and their version; an open session keeps its own.
#[tokio::test]
async fn anthropic_sessions_are_told_the_embodiment_and_the_manual_and_sighup_changes_only_new_ones()
 {
    let mut fake = FakeProvider::start().await;
    let dir = tempfile::tempdir().unwrap();
    let manual = dir.path().join("AGENTS.md");
    std::fs::write(&manual, "Never enter the kitchen.\n").unwrap();
    let port = common::broker::free_port();
    let addr = format!("127.0.0.1:{port}");
    let text = format!(
        "{}\n[store]\npath = {:?}\n\n[agent]\nmanual_file = {:?}\n\n{}",
        rozd::config::BUILTIN_CONFIG.replace("127.0.0.1:8080", &addr),
        dir.path().join("rozd.db").display().to_string(),
        manual.display().to_string(),
        fake.anthropic_endpoint("claude", "claude-test-1", "")
    );
    let config = dir.path().join("rozd.toml");
    std::fs::write(&config, text).unwrap();
    let child = common::spawn_rozd(dir.path(), &config).await;

    let first = get_json(&addr, "/v1/embodiment").await;
    let briefing = first["briefing"].as_str().unwrap().to_string();
    let version = first["version"].as_str().unwrap().to_string();
    let mut client =
        proto::agent_service_client::AgentServiceClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
    let mut open_session = Session::open(&mut client).await;
    let started = open_session
        .start(proto::StartSession {
            environment_id: "sim".into(),
            model: Some("claude".into()),
            project_context: vec!["PROJECT CONTEXT BLOCK".into()],
            ..Default::default()
        })
        .await;
    let system = anthropic_turn(&mut fake, &mut open_session, "look around").await;
    // Exactly what GET /v1/embodiment says a session is told, whole.
    assert!(
        system.contains(briefing.trim_end()),
        "{system}\n---\n{briefing}"
    );
    for limits in [
        "`drive_speed` (m/s): forward speed of the rover; negative drives backwards; range -0.5 to 0.5 m/s; safe value 0 m/s; a command holds at most 20000 ms",
        "`turn_rate` (deg/s): turn rate of the rover, counter-clockwise positive; range -90 to 90 deg/s; safe value 0 deg/s",
        "`gripper` (fraction closed): gripper position, 0 open to 1 closed; range 0 to 1 fraction closed; safe value 0 fraction closed",
        "`stop_before_obstacle`: when `front_distance < 0.3 and drive_speed > 0` holds, rozd does: ",
    ] {
        assert!(system.contains(limits), "missing {limits:?} in:\n{system}");
    }
    let embodiment_at = system.find("# This robot: host").unwrap();
    let manual_at = system.find("Never enter the kitchen.").unwrap();
    let project_at = system.find("PROJECT CONTEXT BLOCK").unwrap();
    assert!(
        embodiment_at < manual_at && manual_at < project_at,
        "{system}"
    );
    let row = get_json(&addr, &format!("/v1/sessions/{}", started.session_id)).await;
    assert_eq!(row["session"]["briefing_version"], version.as_str());

    // The operator changes the manual and reloads.
    std::fs::write(&manual, "Never leave the lab.\n").unwrap();
    let pid = child.id().expect("rozd runs").to_string();
    let status = tokio::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .await
        .unwrap();
    assert!(status.success());
    let reloaded = tokio::time::timeout(common::EXPECT_WITHIN, async {
        loop {
            let now = get_json(&addr, "/v1/embodiment").await;
            if now["version"] != version.as_str() {
                return now;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("SIGHUP re-reads the manual");
    let new_version = reloaded["version"].as_str().unwrap().to_string();
    assert!(
        reloaded["briefing"]
            .as_str()
            .unwrap()
            .contains("Never leave the lab.")
    );

    // The open session keeps what it was told.
    let system = anthropic_turn(&mut fake, &mut open_session, "and now?").await;
    assert!(system.contains("Never enter the kitchen."), "{system}");
    assert!(!system.contains("Never leave the lab."), "{system}");
    // A new one is told the new manual, and its row says so.
    let mut client =
        proto::agent_service_client::AgentServiceClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
    let mut new_session = Session::open(&mut client).await;
    let started_new = new_session
        .start(proto::StartSession {
            environment_id: "sim".into(),
            model: Some("claude".into()),
            ..Default::default()
        })
        .await;
    let system = anthropic_turn(&mut fake, &mut new_session, "hello").await;
    assert!(system.contains("Never leave the lab."), "{system}");
    assert!(!system.contains("Never enter the kitchen."), "{system}");
    let row = get_json(&addr, &format!("/v1/sessions/{}", started_new.session_id)).await;
    assert_eq!(row["session"]["briefing_version"], new_version.as_str());
    let row = get_json(&addr, &format!("/v1/sessions/{}", started.session_id)).await;
    assert_eq!(row["session"]["briefing_version"], version.as_str());
    drop(child);
}

/// Issue 36: the OpenAI-compatible wire format gets the same system prompt:
/// the embodiment and the manual, in the first (system) message.
#[tokio::test]
async fn openai_sessions_are_told_the_embodiment_and_the_manual() {
    let mut fake = FakeProvider::start().await;
    let dir = tempfile::tempdir().unwrap();
    let manual = dir.path().join("AGENTS.md");
    std::fs::write(&manual, "Only work in the test cell.\n").unwrap();
    let daemon = TestDaemon::start(&format!(
        "{}\n[agent]\nmanual_file = {:?}\n\n[[actuators]]\nname = \"fan\"\nkind = \"sim\"\nunit = \"%\"\nmin = 0.0\nmax = 80.0\nsafe_value = 80.0\nhold_ms = 3000\n\n[[sensors]]\nname = \"temp\"\nsource = \"sim\"\nunit = \"degC\"\ncritical_max = 90.0\n\n[[rules]]\nname = \"too_hot\"\nwhen = \"temp > 90\"\nthen = {{ estop = true }}\n",
        fake.openai_endpoint("box", "qwen3:8b", ""),
        manual.display().to_string()
    ))
    .await;
    fake.stream(vec![
        chunk(json!({"role": "assistant", "content": "ok"}), None),
        chunk(json!({}), Some("stop")),
        DONE.into(),
    ]);
    let (mut session, _) = open(&daemon, Some("box"), vec![]).await;
    session.send(user("hello")).await;
    until_complete(&mut session).await;
    let request = fake.request().await;
    let system = request.body["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(request.body["messages"][0]["role"], "system");
    let briefing = daemon.host.briefing().text().to_string();
    assert!(system.contains(briefing.trim_end()), "{system}");
    for expected in [
        "`fan` (%): range 0 to 80 %; safe value 80 %; a command holds at most 3000 ms",
        "`temp` (degC): alarm critical above 90 degC",
        "`too_hot`: when `temp > 90` holds, rozd does: ",
        "reflex rule `too_hot`",
        "Only work in the test cell.",
    ] {
        assert!(
            system.contains(expected),
            "missing {expected:?} in:\n{system}"
        );
    }
    daemon.shutdown().await;
}

/// Issue 34: a model (the Anthropic fake) that calls the built-in rover's
/// PHYSICAL `drive_speed` reads the feedback verdict in the same tool
/// result (status, commanded, measured), and the tool's description told
/// it that only `confirmed` means the hardware did it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_model_reads_the_feedback_verdict_in_the_physical_tools_result() {
    let mut fake = FakeProvider::start().await;
    let rover = rozd::config::BUILTIN_CONFIG.replace("[server]\nlisten = \"127.0.0.1:8080\"\n", "");
    assert!(!rover.contains("[server]"), "the built-in [server] is cut");
    let daemon = TestDaemon::start(&format!(
        "{rover}\n[[permissions]]\ntool_pattern = \"*\"\npolicy = \"allow\"\n\n{}",
        fake.anthropic_endpoint("claude", "claude-test-1", "")
    ))
    .await;
    fake.stream(anthropic(
        &[
            Part::Text("Driving."),
            Part::Tool("toolu_drive", "drive_speed", vec!["{\"value\"", ": 0.2}"]),
        ],
        "tool_use",
        U::default(),
    ));
    fake.stream(anthropic(
        &[Part::Text("The wheels turn.")],
        "end_turn",
        U::default(),
    ));
    let (mut session, _) = open(&daemon, Some("claude"), vec![]).await;
    session.send(user("drive slowly")).await;
    let (seen, done) = until_complete(&mut session).await;
    assert_eq!(done.stop_reason, "end_turn", "{seen:?}");

    let first = fake.request().await;
    let drive = first.body["tools"]
        .as_array()
        .and_then(|tools| tools.iter().find(|t| t["name"] == "drive_speed"))
        .unwrap_or_else(|| panic!("no drive_speed tool in {}", first.body["tools"]));
    let description = drive["description"].as_str().unwrap();
    assert!(
        description.contains("confirmed"),
        "the model is told what a verdict means: {description}"
    );
    let second = fake.request().await;
    let result = second.body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_array())
        .and_then(|c| c.iter().find(|b| b["type"] == "tool_result"))
        .unwrap_or_else(|| panic!("no tool_result in {}", second.body["messages"]))
        .clone();
    assert_eq!(result["tool_use_id"], "toolu_drive");
    assert_eq!(result["is_error"], false, "{result}");
    // What the model read: the tool's JSON answer.
    let text = match &result["content"] {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    let json = text
        .find('{')
        .zip(text.rfind('}'))
        .and_then(|(from, to)| serde_json::from_str::<Value>(&text[from..=to]).ok())
        .unwrap_or_else(|| panic!("no JSON answer in {text}"));
    assert_eq!(json["status"], "confirmed", "{json}");
    assert_eq!(json["commanded"], 0.2, "{json}");
    let measured = json["measured"].as_f64().expect("a measured speed");
    assert!((measured - 0.2).abs() <= 0.02, "{json}");
    assert!(json["settled_ms"].as_u64().is_some(), "{json}");
    daemon.shutdown().await;
}

/// The offline `local` model looks through a camera: `look front_camera`
/// runs the real `capture_image` and the answer names the picture's size,
/// format and age, and that the picture itself came with the result.
#[tokio::test]
async fn the_local_model_looks_through_a_camera() {
    let daemon = TestDaemon::start(SIM_CAMERA).await;
    camera_ready(&daemon).await;
    let (mut session, _) = open(&daemon, Some("local"), vec![]).await;
    session.send(user("look front_camera")).await;
    let (seen, done) = until_complete(&mut session).await;
    assert_eq!(done.stop_reason, "end_turn");
    // The turn's text: "Calling capture_image." (the call), then the answer.
    let text = text_of(&seen);
    let text = text
        .strip_prefix("Calling capture_image.\n")
        .unwrap_or_else(|| panic!("the call, then the answer: {text}"));
    // Fitted to max_image_px = 160 on the long edge, as capture_image sends it.
    assert!(
        text.starts_with("front_camera: 160x120 jpeg, ")
            && text.contains(" ms old (health ok); the picture came with it (image/jpeg, ")
            && text.ends_with(" bytes), and this offline model cannot see what is in it.\n"),
        "{text}"
    );
    daemon.shutdown().await;
}
