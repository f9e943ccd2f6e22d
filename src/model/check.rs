//! The model check: a fixed round trip against one model that tells an
//! operator, in seconds, whether a model server can run rozd's sessions,
//! and if not, what it said. Each step is one call through the same
//! provider code sessions use (requests, retries, decoding), so what passes
//! here passes there:
//!
//! 1. a streamed answer;
//! 2. a tool call, forced with `tool_choice` so that even a small model
//!    makes one;
//! 3. the tool's result sent back and answered (where strict servers refuse
//!    what lax ones take);
//! 4. usage: reported by the server, or rozd's estimate;
//! 5. an image in the user's message (what a camera's picture needs).

use std::sync::Arc;

use futures_util::StreamExt;
use serde_json::{Value, json};

use super::{Block, Message, Model, ModelEvent, ModelRequest, ModelStop, ToolDef, Usage};

/// The tool the check makes the model call.
pub(crate) const CHECK_TOOL: &str = "read_sensor";

const SYSTEM: &str = "You are being checked by rozd, a robot host. Answer briefly.";
/// Enough for a word or a tool call; small, so a check costs little.
const MAX_OUTPUT_TOKENS: u32 = 256;

/// One step's verdict.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct Step {
    /// What was tried, e.g. `tool call (forced)`.
    pub step: &'static str,
    pub ok: bool,
    /// What came back: the answer, or the server's own words when it failed.
    pub detail: String,
}

/// What one call gave back.
#[derive(Debug, Default)]
struct Reply {
    text: String,
    deltas: usize,
    calls: Vec<(String, String, Value)>,
    usage: Option<Usage>,
    stop: Option<ModelStop>,
}

async fn call(model: &dyn Model, request: ModelRequest) -> Result<Reply, String> {
    let mut stream = model.stream(request);
    let mut reply = Reply::default();
    while let Some(event) = stream.next().await {
        match event.map_err(|e| e.message)? {
            ModelEvent::TextDelta(t) => {
                reply.deltas += 1;
                reply.text.push_str(&t);
            }
            ModelEvent::ToolUse { id, name, input } => reply.calls.push((id, name, input)),
            ModelEvent::Usage(u) => reply.usage = Some(u),
            ModelEvent::Stop(stop) => reply.stop = Some(stop),
            ModelEvent::ThinkingDelta(_)
            | ModelEvent::ThinkingSignature(_)
            | ModelEvent::RedactedThinking(_) => {}
        }
    }
    if reply.stop.is_none() {
        return Err("the answer ended without a stop".into());
    }
    Ok(reply)
}

fn request(messages: Vec<Message>, tools: Vec<ToolDef>, tool_choice: Option<&str>) -> ModelRequest {
    ModelRequest {
        system: SYSTEM.to_string(),
        messages: Arc::new(messages),
        tools: Arc::new(tools),
        max_output_tokens: MAX_OUTPUT_TOKENS,
        estimated_input_tokens: None,
        tool_choice: tool_choice.map(str::to_string),
    }
}

fn check_tool() -> ToolDef {
    ToolDef {
        name: CHECK_TOOL.into(),
        description: "Reads one sensor of the robot and returns its value.".into(),
        input_schema: json!({
            "type": "object",
            "properties": {"name": {"type": "string", "description": "the sensor"}},
            "required": ["name"],
        }),
    }
}

/// A short quote of what the model said.
fn quote(text: &str) -> String {
    let text = text.trim();
    let short: String = text.chars().take(60).collect();
    if short.len() < text.len() {
        format!("{short:?}…")
    } else {
        format!("{short:?}")
    }
}

/// A 16×16 red JPEG: the picture the image step sends.
fn red_square() -> Vec<u8> {
    let pixels: Vec<u8> = std::iter::repeat_n([200u8, 30, 30], 16 * 16)
        .flatten()
        .collect();
    crate::camera::jpeg::encode_rgb(&pixels, 16, 16, 90).unwrap_or_default()
}

/// Runs the check's steps against `model`, in order; a step that depends
/// on one that failed is tried anyway with a stand-in (a tool result can be
/// checked without the model's own call).
pub(crate) async fn run(model: &dyn Model) -> Vec<Step> {
    let mut steps = Vec::new();

    let asked = Message::user(vec![Block::Text("Reply with the single word OK.".into())]);
    let first = call(model, request(vec![asked], Vec::new(), None)).await;
    steps.push(match &first {
        Ok(r) => Step {
            step: "streamed answer",
            ok: r.deltas > 0,
            detail: if r.deltas > 0 {
                format!("{} in {} piece(s)", quote(&r.text), r.deltas)
            } else {
                "the answer had no text".into()
            },
        },
        Err(e) => Step {
            step: "streamed answer",
            ok: false,
            detail: e.clone(),
        },
    });

    let question = Message::user(vec![Block::Text(
        "Read the sensor named temp with the tool.".into(),
    )]);
    let forced = call(
        model,
        request(vec![question.clone()], vec![check_tool()], Some(CHECK_TOOL)),
    )
    .await;
    let made = match &forced {
        Ok(r) => r
            .calls
            .iter()
            .find(|(_, name, _)| name == CHECK_TOOL)
            .cloned(),
        Err(_) => None,
    };
    steps.push(Step {
        step: "tool call (forced)",
        ok: made.is_some(),
        detail: match (&forced, &made) {
            (_, Some((_, name, input))) => format!("{name}({input})"),
            (Ok(r), None) => format!(
                "no call of {CHECK_TOOL}; the model answered {}",
                quote(&r.text)
            ),
            (Err(e), None) => e.clone(),
        },
    });

    let (id, name, input) = made.unwrap_or_else(|| {
        (
            "call_check_1".into(),
            CHECK_TOOL.into(),
            json!({"name": "temp"}),
        )
    });
    let conversation = vec![
        question,
        Message::assistant(vec![Block::ToolUse {
            id: id.clone(),
            name: name.clone(),
            input,
        }]),
        Message::user(vec![Block::ToolResult {
            tool_use_id: id,
            name,
            content: "21.5 C".into(),
            is_error: false,
        }]),
    ];
    let answered = call(model, request(conversation, vec![check_tool()], None)).await;
    steps.push(match &answered {
        Ok(r) => Step {
            step: "tool result accepted",
            ok: true,
            detail: if r.text.trim().is_empty() {
                "answered".into()
            } else {
                quote(&r.text)
            },
        },
        Err(e) => Step {
            step: "tool result accepted",
            ok: false,
            detail: e.clone(),
        },
    });

    let usage = first.as_ref().ok().and_then(|r| r.usage);
    steps.push(Step {
        step: "usage",
        ok: usage.is_some(),
        detail: match usage {
            Some(u) if u.estimated => format!(
                "estimated by rozd (the server reported none): in {} / out {}",
                u.input_tokens, u.output_tokens
            ),
            Some(u) => format!(
                "reported by the server: in {} / out {} / cache read {}",
                u.input_tokens, u.output_tokens, u.cache_read_tokens
            ),
            None => "no answer to count".into(),
        },
    });

    let picture = Message::user(vec![
        Block::Image {
            media_type: "image/jpeg".into(),
            data: red_square(),
        },
        Block::Text("What colour is this picture? One word.".into()),
    ]);
    let seen = call(model, request(vec![picture], Vec::new(), None)).await;
    steps.push(match &seen {
        Ok(r) => Step {
            step: "image input",
            ok: true,
            detail: quote(&r.text),
        },
        Err(e) => Step {
            step: "image input",
            ok: false,
            detail: e.clone(),
        },
    });
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_picture_is_a_jpeg() {
        let jpeg = red_square();
        assert!(jpeg.starts_with(&[0xFF, 0xD8]) && jpeg.ends_with(&[0xFF, 0xD9]));
    }

    #[tokio::test]
    async fn the_local_model_passes_what_it_can_and_says_its_usage_is_estimated() {
        let steps = run(&super::super::local::LocalModel).await;
        let names: Vec<&str> = steps.iter().map(|s| s.step).collect();
        assert_eq!(
            names,
            [
                "streamed answer",
                "tool call (forced)",
                "tool result accepted",
                "usage",
                "image input"
            ]
        );
        let usage = &steps[3];
        assert!(
            usage.ok && usage.detail.starts_with("estimated"),
            "{usage:?}"
        );
        assert!(steps[2].ok, "{:?}", steps[2]);
    }
}
