//! `local`: the offline command model.
//!
//! It is not a language model and says so. It reads the user's message as a
//! small command language, turns commands into tool calls, and answers with
//! their results — deterministically, with no network and no API key. It
//! makes rozd usable before any provider is configured, and it drives tests.
//!
//! Commands (one per line, or separated by `;`):
//!
//! | command | effect |
//! |---|---|
//! | `help` | lists the commands and the tools of this session |
//! | `status` | calls `observe` if the session has it (answered as a table), else describes the session |
//! | `read <sensor>` | calls `read_sensor {"name": sensor}` |
//! | `look <camera>` | calls `capture_image {"camera": camera}` and answers with the picture's size, format and age (it cannot see what is in it) |
//! | `set <actuator> <value>` | calls tool `<actuator>` `{"value": v}`, or `actuate {"actuator", "value"}` |
//! | `call <tool> [json object]` | calls any tool with the given parameters |
//! | `echo <text>` | answers with the text |
//! | `context` | shows what the model received: the system prompt and the message's context blocks |
//! | `wait <ms>` | takes `<ms>` milliseconds before each answer in this turn (simulates a slow model) |
//! | `spawn [react\|ooda_re_act] <prompt>` | calls `spawn_worker {"prompt", "ai_mode"?}` (a task's lead); quote a prompt with `;` in it as a JSON string |
//! | `await [worker ids]` | calls `await_workers`, for the given workers or all of them |
//!
//! Tool calls run one per model call, in order; when all have results, the
//! final answer lists each result.

use std::borrow::Cow;
use std::time::Duration;

use futures_util::StreamExt as _;
use serde_json::{Value, json};

use super::{Block, Model, ModelEvent, ModelRequest, ModelStop, ModelStream, Role, Usage, tokens};

pub const NAME: &str = "local";

/// The host tool `look` calls (`tools::CAPTURE_IMAGE`; the model layer
/// does not import the tools).
const CAPTURE_IMAGE: &str = "capture_image";

/// Words per `TextDelta`, so answers stream in several pieces like a real model's.
const WORDS_PER_DELTA: usize = 3;

#[derive(Debug, Clone, Copy, Default)]
pub struct LocalModel;

/// A command of the prompt; names and text are slices of it (parsed again
/// on every model call of the turn, so nothing is copied that need not be).
#[derive(Debug, Clone, PartialEq)]
enum Command<'a> {
    Help,
    Status,
    Echo(&'a str),
    Context,
    Wait(u64),
    Call {
        tool: &'a str,
        input: Value,
    },
    /// A command that cannot run, with the reason shown to the user.
    Invalid(String),
}

impl Model for LocalModel {
    fn name(&self) -> &str {
        NAME
    }

    fn can_summarize(&self) -> bool {
        false
    }

    fn stream(&self, request: ModelRequest) -> ModelStream {
        let (delay, events) = respond(&request);
        let events = futures_util::stream::iter(events.into_iter().map(Ok));
        if delay.is_zero() {
            return events.boxed();
        }
        futures_util::stream::once(tokio::time::sleep(delay))
            .filter_map(|()| std::future::ready(None))
            .chain(events)
            .boxed()
    }
}

/// Splits on newlines and on `;` outside JSON braces and strings.
fn split_commands(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let (mut depth, mut in_string, mut escaped) = (0i32, false, false);
    for (at, c) in text.char_indices() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            ';' | '\n' if depth <= 0 => {
                out.push(text[start..at].trim());
                start = at + c.len_utf8();
            }
            _ => {}
        }
    }
    out.push(text[start..].trim());
    out.retain(|s| !s.is_empty());
    out
}

/// A command's verb (lower case) and the rest of its line.
fn verb_and_rest(line: &str) -> (Cow<'_, str>, &str) {
    let (verb, rest) = match split_at_whitespace(line) {
        Some((v, r)) => (v, r.trim()),
        None => (line, ""),
    };
    // Borrowed unless it has capitals: this runs for every command on every model call.
    let verb = if verb.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(verb.to_ascii_lowercase())
    } else {
        Cow::Borrowed(verb)
    };
    (verb, rest)
}

/// `line.split_once(char::is_whitespace)`, a byte at a time while the
/// line is ASCII (as commands nearly always are).
fn split_at_whitespace(line: &str) -> Option<(&str, &str)> {
    let at = line
        .bytes()
        .position(|b| !b.is_ascii() || tokens::is_ascii_whitespace_char(b))?;
    match line.as_bytes().get(at) {
        Some(b) if b.is_ascii() => Some((&line[..at], &line[at + 1..])),
        _ => line.split_once(char::is_whitespace),
    }
}

/// The delay of a `wait` command, without parsing any other command.
fn wait_of(line: &str) -> Option<Duration> {
    // Most lines are not waits: look at the verb only if it could be one.
    if !line
        .get(..4)
        .is_some_and(|verb| verb.eq_ignore_ascii_case("wait"))
    {
        return None;
    }
    let (verb, rest) = verb_and_rest(line);
    (verb == "wait")
        .then(|| rest.parse::<u64>().ok())
        .flatten()
        .map(Duration::from_millis)
}

fn parse_command<'a>(line: &'a str, tools: &[&str]) -> Command<'a> {
    let (verb, rest) = verb_and_rest(line);
    let has = |name: &str| tools.contains(&name);
    match verb.as_ref() {
        "help" => Command::Help,
        "status" if has("observe") => Command::Call {
            tool: "observe",
            input: json!({}),
        },
        "status" => Command::Status,
        "echo" => Command::Echo(rest),
        "context" => Command::Context,
        "wait" => match rest.parse::<u64>() {
            Ok(ms) => Command::Wait(ms),
            Err(_) => Command::Invalid(format!("`wait` needs milliseconds, got {rest:?}")),
        },
        "spawn" if has("spawn_worker") => parse_spawn(rest),
        "spawn" => Command::Invalid("only a task's lead can `spawn` workers".into()),
        "await" if has("await_workers") => {
            let ids: Vec<&str> = rest.split_whitespace().collect();
            Command::Call {
                tool: "await_workers",
                input: if ids.is_empty() {
                    json!({})
                } else {
                    json!({ "worker_ids": ids })
                },
            }
        }
        "await" => Command::Invalid("only a task's lead can `await` workers".into()),
        "read" if rest.is_empty() => Command::Invalid("`read` needs a sensor name".into()),
        "read" if has("read_sensor") => Command::Call {
            tool: "read_sensor",
            input: json!({ "name": rest }),
        },
        "read" => Command::Invalid("this session has no `read_sensor` tool".into()),
        "look" if rest.is_empty() => {
            Command::Invalid("`look` needs a camera name: look <camera>".into())
        }
        "look" if has(CAPTURE_IMAGE) => Command::Call {
            tool: CAPTURE_IMAGE,
            input: json!({ "camera": rest }),
        },
        "look" => Command::Invalid(
            "this session has no cameras (no `capture_image` tool; configure [[cameras]])".into(),
        ),
        "set" => {
            let mut words = rest.split_whitespace();
            let (Some(actuator), Some(raw), None) = (words.next(), words.next(), words.next())
            else {
                return Command::Invalid(
                    "`set` needs an actuator and a value: set <actuator> <value>".into(),
                );
            };
            let value = raw
                .parse::<f64>()
                .ok()
                .and_then(|v| serde_json::Number::from_f64(v).map(Value::Number))
                .unwrap_or_else(|| Value::String(raw.to_string()));
            if has(actuator) {
                Command::Call {
                    tool: actuator,
                    input: json!({ "value": value }),
                }
            } else if has("actuate") {
                Command::Call {
                    tool: "actuate",
                    input: json!({ "actuator": actuator, "value": value }),
                }
            } else {
                Command::Invalid(format!(
                    "this session has no tool `{actuator}` and no `actuate` tool"
                ))
            }
        }
        "call" => {
            let (tool, params) = match rest.split_once(char::is_whitespace) {
                Some((t, p)) => (t, p.trim()),
                None => (rest, ""),
            };
            if tool.is_empty() {
                return Command::Invalid("`call` needs a tool name: call <tool> {json}".into());
            }
            let input = if params.is_empty() {
                Ok(json!({}))
            } else {
                serde_json::from_str::<Value>(params)
            };
            match input {
                Ok(v @ Value::Object(_)) => Command::Call { tool, input: v },
                Ok(_) => Command::Invalid(format!("parameters for `{tool}` must be a JSON object")),
                Err(e) => {
                    Command::Invalid(format!("parameters for `{tool}` are not valid JSON: {e}"))
                }
            }
        }
        other => Command::Invalid(format!(
            "unknown command `{other}`; say `help` for the list"
        )),
    }
}

/// `spawn [react|ooda_re_act] <prompt>`; the prompt may be a JSON string.
fn parse_spawn(rest: &str) -> Command<'static> {
    let (mode, prompt) = match rest.split_once(char::is_whitespace) {
        Some((m @ ("react" | "ooda_re_act"), p)) => (Some(m), p.trim()),
        _ => (None, rest),
    };
    let prompt = if prompt.starts_with('"') {
        match serde_json::from_str::<String>(prompt) {
            Ok(p) => p,
            Err(e) => {
                return Command::Invalid(format!("the quoted prompt is not a JSON string: {e}"));
            }
        }
    } else {
        prompt.to_string()
    };
    if prompt.trim().is_empty() {
        return Command::Invalid("`spawn` needs a prompt for the worker".into());
    }
    let mut input = json!({ "prompt": prompt });
    if let (Some(mode), Some(map)) = (mode, input.as_object_mut()) {
        map.insert("ai_mode".into(), json!(mode));
    }
    Command::Call {
        tool: "spawn_worker",
        input,
    }
}

fn help_text(tools: &[&str]) -> String {
    let mut text = String::from(
        "I am rozd's offline command model, not a language model. Commands: help; status; \
         read <sensor>; look <camera>; set <actuator> <value>; call <tool> {json}; echo <text>; context; wait <ms>; \
         spawn [react|ooda_re_act] <prompt>; await [worker ids] (a task's lead). \
         Separate several with `;` or new lines.",
    );
    if tools.is_empty() {
        text.push_str(" This session has no tools.");
    } else {
        text.push_str(&format!(" Tools in this session: {}.", tools.join(", ")));
    }
    text
}

/// The prompt of the current turn: the last user message that is not just
/// tool results, and the index of that message.
fn current_prompt(messages: &[super::Message]) -> Option<(usize, &str)> {
    messages.iter().enumerate().rev().find_map(|(i, m)| {
        if m.role != Role::User {
            return None;
        }
        m.content.iter().find_map(|b| match b {
            Block::Text(t) => Some((i, t.as_str())),
            _ => None,
        })
    })
}

/// A tool call's result since the prompt: its text, whether it failed, and
/// the picture that came with it (media type, bytes).
type Outcome<'a> = (&'a str, bool, Option<(&'a str, usize)>);

/// Decides the whole answer of one model call: a delay (the turn's
/// `wait`s), then events. Public for the fuzz targets in `fuzz/`: it is the
/// command parser and everything it drives, without the wait.
pub fn respond(request: &ModelRequest) -> (Duration, Vec<ModelEvent>) {
    let tools: Vec<&str> = request.tools.iter().map(|t| t.name.as_str()).collect();
    let Some((prompt_index, prompt)) = current_prompt(&request.messages) else {
        return (
            Duration::ZERO,
            finish(request, String::new(), help_text(&tools), None),
        );
    };
    let lines = split_commands(prompt);
    // Saturating: `wait` takes any u64, and several may add up past
    // Duration::MAX (`sum` would panic).
    let delay = lines
        .iter()
        .filter_map(|l| wait_of(l))
        .fold(Duration::ZERO, Duration::saturating_add);
    // Results of the tool calls made since the prompt, in call order, each
    // with the picture that came with it (an image right after the result).
    let mut results: Vec<Outcome<'_>> = Vec::new();
    for m in &request.messages[prompt_index + 1..] {
        let mut after_result = false;
        for b in &m.content {
            match b {
                Block::ToolResult {
                    content, is_error, ..
                } => {
                    results.push((content.as_str(), *is_error, None));
                    after_result = true;
                }
                Block::Image { media_type, data } if after_result => {
                    if let Some((_, _, picture @ None)) = results.last_mut() {
                        *picture = Some((media_type.as_str(), data.len()));
                    }
                }
                _ => after_result = false,
            }
        }
    }
    // Written without the formatter: this runs on every model call.
    let thinking = [
        "Offline command model. ",
        itoa::Buffer::new().format(lines.len()),
        " command(s) in the prompt; ",
        itoa::Buffer::new().format(results.len()),
        " tool call(s) done.",
    ]
    .concat();
    // Commands are parsed up to the next call only: the model is asked
    // again after every call, with the same prompt.
    let mut calls_before = 0;
    for line in &lines {
        let Command::Call { tool, input } = parse_command(line, &tools) else {
            continue;
        };
        if calls_before < results.len() {
            calls_before += 1;
            continue;
        }
        let text = ["Calling ", tool, "."].concat();
        let call = ModelEvent::ToolUse {
            id: call_id(),
            name: tool.to_string(),
            input,
        };
        return (delay, finish(request, thinking, text, Some(call)));
    }
    let mut results = results.into_iter();
    let mut answer = Vec::new();
    for line in &lines {
        match parse_command(line, &tools) {
            Command::Help => answer.push(help_text(&tools)),
            Command::Status => answer.push(format!(
                "Offline command model; {} tool(s) in this session: {}.",
                tools.len(),
                if tools.is_empty() {
                    "none".to_string()
                } else {
                    tools.join(", ")
                }
            )),
            Command::Echo(text) => answer.push(text.to_string()),
            Command::Context => answer.push(describe_context(request, prompt_index)),
            Command::Wait(_) => {}
            Command::Invalid(why) => answer.push(format!("Cannot do that: {why}.")),
            Command::Call { tool, .. } => match results.next() {
                Some((content, false, picture)) if tool == CAPTURE_IMAGE => {
                    answer.push(describe_picture(content, picture));
                }
                // `status` reads as a table; `call observe` stays JSON.
                Some((content, false, _))
                    if tool == "observe"
                        && verb_and_rest(line).0 == "status"
                        && let Some(table) = status_table(content) =>
                {
                    answer.push(table);
                }
                Some((content, false, _)) => answer.push(format!("{tool} returned: {content}")),
                Some((content, true, _)) => answer.push(format!("{tool} failed: {content}")),
                None => answer.push(format!("{tool} returned nothing.")),
            },
        }
    }
    let text = if answer.is_empty() {
        help_text(&tools)
    } else {
        answer.join("\n")
    };
    (delay, finish(request, thinking, text, None))
}

/// A measured value for people: at most 3 decimals, trailing zeros
/// dropped (1 decimal from 100 on).
fn number(v: f64) -> String {
    let text = if v.abs() >= 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    };
    let text = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    };
    if text == "-0" { "0".into() } else { text }
}

/// `observe`'s Observation as a table for people (the answer to `status`):
/// the stop, each sensor's value, health and alarm, each actuator's value
/// and whether it is at its safe value. `None` when it is not one.
fn status_table(content: &str) -> Option<String> {
    let o: Value = serde_json::from_str(content).ok()?;
    let sensors = o.get("sensors")?.as_array()?;
    let actuators = o.get("actuators")?.as_array()?;
    let value = |x: &Value| match x["value"].as_f64() {
        Some(v) => match x["unit"].as_str() {
            Some(unit) => format!("{} {unit}", number(v)),
            None => number(v),
        },
        None => "-".to_string(),
    };
    let text = |x: &Value, key: &str| x[key].as_str().unwrap_or("?").to_string();
    let mut rows: Vec<[String; 4]> = vec![[
        "name".into(),
        "value".into(),
        "health".into(),
        "alarm / state".into(),
    ]];
    for s in sensors {
        rows.push([
            text(s, "name"),
            value(s),
            text(s, "health"),
            text(s, "alarm"),
        ]);
    }
    for a in actuators {
        let state = if a["at_safe_value"] == true {
            "at its safe value".to_string()
        } else {
            match a["owner"].as_str() {
                Some(owner) => format!("moved by {owner}"),
                None => "moved".to_string(),
            }
        };
        rows.push([text(a, "name"), value(a), "actuator".into(), state]);
    }
    let mut width = [0usize; 3];
    for row in &rows {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let stop = match &o["protective_stop"] {
        Value::Object(stop) => format!(
            "ACTIVE ({}: {})",
            stop.get("source").and_then(Value::as_str).unwrap_or("?"),
            stop.get("reason").and_then(Value::as_str).unwrap_or("?")
        ),
        _ => "not active".to_string(),
    };
    let mut out = format!("Protective stop: {stop}.");
    for [name, value, health, state] in &rows {
        out.push_str(&format!(
            "\n{name:<w0$}  {value:>w1$}  {health:<w2$}  {state}",
            w0 = width[0],
            w1 = width[1],
            w2 = width[2]
        ));
    }
    Some(out)
}

/// `look`'s answer: one line with the picture's size, format and age from
/// `capture_image`'s result, and whether the picture itself came with it.
/// This model cannot see, and says so.
fn describe_picture(content: &str, picture: Option<(&str, usize)>) -> String {
    let facts: Value = serde_json::from_str(content).unwrap_or(Value::Null);
    let (Some(width), Some(height)) = (facts["width"].as_u64(), facts["height"].as_u64()) else {
        return format!("{CAPTURE_IMAGE} returned: {content}");
    };
    let camera = facts["camera"].as_str().unwrap_or("the camera");
    let format = facts["format"].as_str().unwrap_or("an unknown format");
    let age = facts["age_ms"]
        .as_u64()
        .map_or_else(|| "of unknown age".to_string(), |ms| format!("{ms} ms old"));
    let health = facts["health"].as_str().unwrap_or("unknown");
    let came = match picture {
        Some((media_type, bytes)) => format!(
            "the picture came with it ({media_type}, {bytes} bytes), and this offline model \
             cannot see what is in it"
        ),
        None => "no picture came with it".to_string(),
    };
    format!("{camera}: {width}x{height} {format}, {age} (health {health}); {came}.")
}

/// The system prompt and the extra blocks of the prompt message, as text.
fn describe_context(request: &ModelRequest, prompt_index: usize) -> String {
    let blocks: Vec<String> = request.messages[prompt_index]
        .content
        .iter()
        .skip(1)
        .map(|b| match b {
            Block::Text(t) => format!("text: {t}"),
            Block::Image { media_type, data } => {
                format!("image: {media_type}, {} bytes", data.len())
            }
            other => format!("{other:?}"),
        })
        .collect();
    format!(
        "System prompt:\n{}\nContext blocks ({}):\n{}",
        request.system,
        blocks.len(),
        blocks.join("\n")
    )
}

/// Turns thinking, text and an optional tool call into a streamed answer with
/// usage, honouring the output budget. The text ends with a newline, as a
/// real model's answer usually does: clients that print whole lines (the
/// published roz CLI holds text until one) would otherwise run one answer
/// into the next.
fn finish(
    request: &ModelRequest,
    thinking: String,
    mut text: String,
    call: Option<ModelEvent>,
) -> Vec<ModelEvent> {
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    let budget = request.max_output_tokens;
    // Thinking, text in pieces of a few words, the call, usage and stop.
    let mut events = Vec::with_capacity(4 + text.len() / 8);
    let mut output: u32 = 0;
    let mut stop = if call.is_some() {
        ModelStop::ToolUse
    } else {
        ModelStop::EndTurn
    };
    if !thinking.is_empty() {
        output = output.saturating_add(tokens::count(&thinking));
        events.push(ModelEvent::ThinkingDelta(thinking));
    }
    for chunk in chunk_words(&text) {
        let cost = tokens::count(&chunk);
        if output.saturating_add(cost) > budget {
            stop = ModelStop::MaxTokens;
            break;
        }
        output += cost;
        events.push(ModelEvent::TextDelta(chunk));
    }
    if stop != ModelStop::MaxTokens
        && let Some(call) = call
    {
        if let ModelEvent::ToolUse { input, name, .. } = &call {
            output = output
                .saturating_add(tokens::count(name))
                .saturating_add(tokens::count(&input.to_string()));
        }
        events.push(call);
    }
    events.push(ModelEvent::Usage(Usage {
        input_tokens: request.input_tokens(),
        output_tokens: output,
        estimated: true,
        ..Usage::default()
    }));
    events.push(ModelEvent::Stop(stop));
    events
}

/// A tool call id unique in this process and, by its random prefix (drawn
/// once), across restarts: `toolu_local_` and 32 hex digits, as a UUID's
/// simple form was (one getrandom call per id was a tenth of a call's work).
fn call_id() -> String {
    static PREFIX: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let prefix = PREFIX.get_or_init(|| uuid::Uuid::new_v4().as_u64_pair().0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut digits = uuid::Uuid::encode_buffer();
    let digits = uuid::Uuid::from_u64_pair(*prefix, n)
        .simple()
        .encode_lower(&mut digits);
    ["toolu_local_", digits].concat()
}

/// Splits text into pieces of a few words, keeping every character.
fn chunk_words(text: &str) -> Vec<String> {
    let mut chunks = Vec::new();
    let mut current = String::new();
    let mut words = 0;
    for piece in text.split_inclusive(char::is_whitespace) {
        current.push_str(piece);
        if piece.ends_with(char::is_whitespace) {
            words += 1;
            if words == WORDS_PER_DELTA {
                chunks.push(std::mem::take(&mut current));
                words = 0;
            }
        }
    }
    if !current.is_empty() {
        chunks.push(current);
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Message, ToolDef};

    fn request(messages: Vec<Message>, tools: &[&str]) -> ModelRequest {
        ModelRequest {
            system: "sys".into(),
            messages: messages.into(),
            tools: tools
                .iter()
                .map(|n| ToolDef {
                    name: n.to_string(),
                    description: String::new(),
                    input_schema: json!({}),
                })
                .collect::<Vec<_>>()
                .into(),
            max_output_tokens: 4096,
            estimated_input_tokens: None,
            tool_choice: None,
        }
    }

    fn text_of(events: &[ModelEvent]) -> String {
        events
            .iter()
            .filter_map(|e| match e {
                ModelEvent::TextDelta(t) => Some(t.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn call_ids_are_distinct_and_keep_their_shape() {
        let ids: Vec<String> = (0..1000).map(|_| call_id()).collect();
        let distinct: std::collections::HashSet<&String> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len());
        for id in &ids {
            let hex = id.strip_prefix("toolu_local_").expect("prefix");
            assert_eq!(hex.len(), 32, "{id}");
            assert!(hex.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        }
        // The random prefix, then the counter (other tests draw ids too).
        let split = |id: &str| {
            let hex = &id["toolu_local_".len()..];
            let number = |digits: &str| u64::from_str_radix(digits, 16).expect("hex");
            (number(&hex[..16]), number(&hex[16..]))
        };
        for pair in ids.windows(2) {
            let (a, b) = (split(&pair[0]), split(&pair[1]));
            assert_eq!(a.0, b.0, "{pair:?}");
            assert!(a.1 < b.1, "{pair:?}");
        }
    }

    #[test]
    fn splits_on_semicolons_outside_json() {
        assert_eq!(
            split_commands("call a {\"x\": \"1;2\"}; echo hi\nhelp"),
            ["call a {\"x\": \"1;2\"}", "echo hi", "help"]
        );
    }

    #[test]
    fn echo_streams_in_several_deltas_and_ends_the_turn() {
        let (_, events) = respond(&request(
            vec![Message::user(vec![Block::Text(
                "echo one two three four five six seven".into(),
            )])],
            &[],
        ));
        let deltas = events
            .iter()
            .filter(|e| matches!(e, ModelEvent::TextDelta(_)))
            .count();
        assert!(deltas >= 3, "{events:?}");
        assert_eq!(text_of(&events), "one two three four five six seven\n");
        assert!(matches!(events.first(), Some(ModelEvent::ThinkingDelta(_))));
        assert_eq!(events.last(), Some(&ModelEvent::Stop(ModelStop::EndTurn)));
    }

    #[test]
    fn spawn_and_await_become_team_tool_calls_for_a_lead_only() {
        let lead = ["spawn_worker", "await_workers"];
        assert_eq!(
            parse_command(r#"spawn react "read a; read b""#, &lead),
            Command::Call {
                tool: "spawn_worker",
                input: json!({"prompt": "read a; read b", "ai_mode": "react"}),
            }
        );
        assert_eq!(
            parse_command("spawn read temp", &lead),
            Command::Call {
                tool: "spawn_worker",
                input: json!({"prompt": "read temp"}),
            }
        );
        assert_eq!(
            parse_command("await x:w1 x:w2", &lead),
            Command::Call {
                tool: "await_workers",
                input: json!({"worker_ids": ["x:w1", "x:w2"]}),
            }
        );
        assert!(matches!(parse_command("spawn", &lead), Command::Invalid(_)));
        assert!(matches!(
            parse_command("spawn read temp", &["read_sensor"]),
            Command::Invalid(_)
        ));
        // A quoted prompt keeps its `;` through command splitting.
        assert_eq!(
            split_commands(r#"spawn "read a; read b"; await"#),
            [r#"spawn "read a; read b""#, "await"]
        );
    }

    #[test]
    fn calls_tools_in_order_then_reports_results() {
        let tools = ["gripper", "read_sensor"];
        let prompt = Message::user(vec![Block::Text("set gripper 0.5; read temp".into())]);
        let (_, first) = respond(&request(vec![prompt.clone()], &tools));
        let Some(ModelEvent::ToolUse { id, name, input }) = first
            .iter()
            .find(|e| matches!(e, ModelEvent::ToolUse { .. }))
            .cloned()
        else {
            panic!("first call is a tool use: {first:?}");
        };
        assert_eq!((name.as_str(), input), ("gripper", json!({"value": 0.5})));
        assert_eq!(first.last(), Some(&ModelEvent::Stop(ModelStop::ToolUse)));

        let mut history = vec![
            prompt,
            Message::assistant(vec![Block::ToolUse {
                id: id.clone(),
                name: name.clone(),
                input: json!({"value": 0.5}),
            }]),
            Message::user(vec![Block::ToolResult {
                tool_use_id: id,
                name,
                content: "ok".into(),
                is_error: false,
            }]),
        ];
        let (_, second) = respond(&request(history.clone(), &tools));
        let Some(ModelEvent::ToolUse { id, name, input }) = second
            .iter()
            .find(|e| matches!(e, ModelEvent::ToolUse { .. }))
            .cloned()
        else {
            panic!("second call is a tool use: {second:?}");
        };
        assert_eq!(
            (name.as_str(), input.clone()),
            ("read_sensor", json!({"name": "temp"}))
        );
        history.push(Message::assistant(vec![Block::ToolUse {
            id: id.clone(),
            name: name.clone(),
            input,
        }]));
        history.push(Message::user(vec![Block::ToolResult {
            tool_use_id: id,
            name,
            content: "21.5".into(),
            is_error: true,
        }]));
        let (_, last) = respond(&request(history, &tools));
        assert_eq!(
            text_of(&last),
            "gripper returned: ok\nread_sensor failed: 21.5\n"
        );
        assert_eq!(last.last(), Some(&ModelEvent::Stop(ModelStop::EndTurn)));
    }

    #[test]
    fn look_calls_capture_image_and_answers_with_size_format_and_age() {
        let tools = ["capture_image", "read_sensor"];
        let prompt = Message::user(vec![Block::Text("look front_camera".into())]);
        let (_, first) = respond(&request(vec![prompt.clone()], &tools));
        let Some(ModelEvent::ToolUse { id, name, input }) = first
            .iter()
            .find(|e| matches!(e, ModelEvent::ToolUse { .. }))
            .cloned()
        else {
            panic!("look is a tool call: {first:?}");
        };
        assert_eq!(
            (name.as_str(), input.clone()),
            ("capture_image", json!({"camera": "front_camera"}))
        );
        let result = json!({"camera": "front_camera", "format": "jpeg", "width": 640,
            "height": 480, "bytes": 2048, "age_ms": 37, "health": "ok"});
        let history = vec![
            prompt,
            Message::assistant(vec![Block::ToolUse {
                id: id.clone(),
                name: name.clone(),
                input,
            }]),
            Message::user(vec![
                Block::ToolResult {
                    tool_use_id: id,
                    name,
                    content: result.to_string(),
                    is_error: false,
                },
                Block::Image {
                    media_type: "image/jpeg".into(),
                    data: vec![0xff; 2048],
                },
            ]),
        ];
        let (_, last) = respond(&request(history.clone(), &tools));
        assert_eq!(
            text_of(&last),
            "front_camera: 640x480 jpeg, 37 ms old (health ok); the picture came with it \
             (image/jpeg, 2048 bytes), and this offline model cannot see what is in it.\n"
        );
        assert_eq!(last.last(), Some(&ModelEvent::Stop(ModelStop::EndTurn)));

        // Without the picture it says none came; a failed look says why.
        let mut without = history.clone();
        if let Some(m) = without.last_mut() {
            m.content.truncate(1);
        }
        assert!(
            text_of(&respond(&request(without, &tools)).1).ends_with("no picture came with it.\n"),
        );
        let mut failed = history;
        if let Some(Block::ToolResult {
            content, is_error, ..
        }) = failed.last_mut().and_then(|m| m.content.first_mut())
        {
            *content = "camera \"front_camera\" has no recent frame (health stale)".into();
            *is_error = true;
        }
        assert_eq!(
            text_of(&respond(&request(failed, &tools)).1),
            "capture_image failed: camera \"front_camera\" has no recent frame (health stale)\n"
        );
    }

    #[test]
    fn look_without_a_camera_or_without_cameras_is_explained() {
        let ask = |text: &str, tools: &[&str]| {
            let prompt = Message::user(vec![Block::Text(text.into())]);
            text_of(&respond(&request(vec![prompt], tools)).1)
        };
        assert_eq!(
            ask("look", &["capture_image"]),
            "Cannot do that: `look` needs a camera name: look <camera>.\n"
        );
        assert!(ask("look front_camera", &["read_sensor"]).contains("this session has no cameras"),);
        assert!(ask("help", &["capture_image"]).contains("look <camera>"));
    }

    #[test]
    fn the_next_call_skips_commands_that_are_not_calls_and_calls_done() {
        let tools = ["gripper", "read_sensor"];
        let prompt = Message::user(vec![Block::Text(
            "call t [1]; wait 5; set gripper 0.5; frobnicate; read temp; wait 7".into(),
        )]);
        let history = vec![
            prompt,
            Message::assistant(vec![Block::ToolUse {
                id: "a".into(),
                name: "gripper".into(),
                input: json!({"value": 0.5}),
            }]),
            Message::user(vec![Block::ToolResult {
                tool_use_id: "a".into(),
                name: "gripper".into(),
                content: "ok".into(),
                is_error: false,
            }]),
        ];
        let (delay, events) = respond(&request(history, &tools));
        // Every wait of the prompt counts, also those after the next call.
        assert_eq!(delay, Duration::from_millis(12));
        assert_eq!(
            events.first(),
            Some(&ModelEvent::ThinkingDelta(
                "Offline command model. 6 command(s) in the prompt; 1 tool call(s) done.".into()
            ))
        );
        let calls: Vec<(&str, &Value)> = events
            .iter()
            .filter_map(|e| match e {
                ModelEvent::ToolUse { name, input, .. } => Some((name.as_str(), input)),
                _ => None,
            })
            .collect();
        assert_eq!(calls, [("read_sensor", &json!({"name": "temp"}))]);
    }

    /// `status` answers with a table, values rounded, not the
    /// Observation's JSON; `call observe` still gives the JSON (issue 35,
    /// item 14).
    #[test]
    fn status_reads_as_a_table() {
        let observation = json!({
            "protective_stop": null,
            "sensors": [{"name": "temp", "unit": "degC", "value": 21.053924732137325,
                         "health": "ok", "alarm": "ok"}],
            "actuators": [{"name": "fan", "unit": null, "value": 0.0, "at_safe_value": true}],
        })
        .to_string();
        let prompt = Message::user(vec![Block::Text("status".into())]);
        let result = Message::user(vec![Block::ToolResult {
            tool_use_id: "t".into(),
            name: "observe".into(),
            content: observation.clone(),
            is_error: false,
        }]);
        let (_, events) = respond(&request(vec![prompt, result.clone()], &["observe"]));
        let text = text_of(&events);
        assert!(text.contains("Protective stop: not active."), "{text}");
        let temp = text.lines().find(|l| l.starts_with("temp")).expect(&text);
        assert!(
            temp.contains("21.054 degC") && temp.contains("ok"),
            "{temp}"
        );
        assert!(!text.contains("21.0539"), "{text}");
        let fan = text.lines().find(|l| l.starts_with("fan")).expect(&text);
        assert!(fan.contains("at its safe value"), "{fan}");
        let call = Message::user(vec![Block::Text("call observe".into())]);
        let (_, events) = respond(&request(vec![call, result], &["observe"]));
        assert!(
            text_of(&events).contains("observe returned: {"),
            "{}",
            text_of(&events)
        );
    }

    #[test]
    fn bad_commands_are_explained_not_called() {
        let (_, events) = respond(&request(
            vec![Message::user(vec![Block::Text(
                "call t [1]; frobnicate; read x".into(),
            )])],
            &[],
        ));
        let text = text_of(&events);
        assert!(text.contains("must be a JSON object"), "{text}");
        assert!(text.contains("unknown command `frobnicate`"), "{text}");
        assert!(text.contains("no `read_sensor` tool"), "{text}");
        assert!(
            !events
                .iter()
                .any(|e| matches!(e, ModelEvent::ToolUse { .. }))
        );
    }

    #[test]
    fn usage_is_counted_and_the_output_budget_is_kept() {
        let mut r = request(
            vec![Message::user(vec![Block::Text(
                "echo a b c d e f g h i j".into(),
            )])],
            &[],
        );
        let (_, events) = respond(&r);
        let usage = events
            .iter()
            .find_map(|e| match e {
                ModelEvent::Usage(u) => Some(*u),
                _ => None,
            })
            .unwrap();
        assert_eq!(usage.input_tokens, r.estimate_tokens());
        assert!(usage.output_tokens > 0);
        r.max_output_tokens = usage.output_tokens - 2;
        let (_, events) = respond(&r);
        assert_eq!(events.last(), Some(&ModelEvent::Stop(ModelStop::MaxTokens)));
    }

    #[test]
    fn wait_delays_the_answer() {
        let (delay, _) = respond(&request(
            vec![Message::user(vec![Block::Text("wait 250; echo x".into())])],
            &[],
        ));
        assert_eq!(delay, Duration::from_millis(250));
    }

    #[test]
    fn waits_that_add_up_past_the_largest_duration_saturate() {
        // u64::MAX ms is a thousandth of Duration::MAX: 1001 of them overflow.
        let prompt = format!("{}echo x", format!("wait {}; ", u64::MAX).repeat(1001));
        let (delay, _) = respond(&request(
            vec![Message::user(vec![Block::Text(prompt)])],
            &[],
        ));
        assert_eq!(delay, Duration::MAX);
    }
}

/// Any user text becomes commands (or `Invalid` ones), never a panic.
#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn any_text_splits_and_parses(
            text in prop_oneof![
                "\\PC{0,200}",
                "((help|status|read|set|call|echo|wait|spawn|await|context) [a-z0-9 {}\":;.\\-]{0,40}[;\n]?){1,6}",
            ],
        ) {
            let tools = ["observe", "read_sensor", "speed", "spawn_worker", "await_workers"];
            for line in split_commands(&text) {
                prop_assert!(!line.is_empty());
                let _ = parse_command(line, &tools);
            }
        }

        #[test]
        fn splits_any_line_as_split_once_does(line in "(?s).{0,40}") {
            prop_assert_eq!(
                split_at_whitespace(&line),
                line.split_once(char::is_whitespace)
            );
        }
    }

    #[test]
    fn splits_at_the_first_whitespace_as_split_once_does() {
        for line in [
            "call tool {}",
            "wait\t10",
            "set\u{b}x 1",
            "echo\u{a0}non-breaking space",
            "größe\u{2003}em space",
            "verb",
            "",
            " leading",
            "é x",
            "x\u{85}next line",
        ] {
            assert_eq!(
                split_at_whitespace(line),
                line.split_once(char::is_whitespace),
                "{line:?}"
            );
        }
    }
}
