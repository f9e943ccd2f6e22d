//! The context budget: how many tokens a request holds, and the compaction
//! steps that shrink a conversation. Pure functions over messages; the turn
//! ([`super::turn`]) decides when to run them and tells the client.
//!
//! Sizes are estimates ([`crate::model::tokens`]) scaled by a factor learnt
//! from the provider's reported usage, so they track the real tokenizer.

use crate::model::{self, Block, Message, Role};

/// Tool results at most this big (estimated tokens) are not worth eliding.
const ELIDE_MIN_TOKENS: u32 = 32;
/// How an elided tool result begins.
const ELIDED: &str = "[result elided by rozd to save context;";
/// Longest rendering of one block in a transcript for summarisation.
const TRANSCRIPT_BLOCK_CHARS: usize = 4_000;

/// The fractions of `max_context_tokens` at which compaction steps start,
/// and the fraction they bring the context down to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CompactionLimits {
    pub target: f64,
    pub tool_results_at: f64,
    pub thinking_at: f64,
    pub summary_at: f64,
}

impl Default for CompactionLimits {
    fn default() -> Self {
        CompactionLimits {
            target: 0.4,
            tool_results_at: 0.5,
            thinking_at: 0.6,
            summary_at: 0.75,
        }
    }
}

/// Estimates calibrated by what the provider reported.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ContextMeter {
    /// Real tokens per estimated token, from the last call with usage.
    scale: f64,
}

impl Default for ContextMeter {
    fn default() -> Self {
        ContextMeter { scale: 1.0 }
    }
}

impl ContextMeter {
    /// An estimate in real tokens.
    pub(crate) fn scaled(&self, estimate: u32) -> u32 {
        let v = (f64::from(estimate) * self.scale).ceil();
        if v >= f64::from(u32::MAX) {
            u32::MAX
        } else {
            v as u32
        }
    }

    /// Real tokens in estimate units.
    pub(crate) fn unscaled(&self, tokens: u32) -> u32 {
        (f64::from(tokens) / self.scale).floor() as u32
    }

    /// Learns from a call whose request and answer were estimated at
    /// `estimate` and which the provider counted as `actual` tokens.
    pub(crate) fn calibrate(&mut self, estimate: u32, actual: u32) {
        if estimate > 0 && actual > 0 {
            self.scale = (f64::from(actual) / f64::from(estimate)).clamp(0.25, 4.0);
        }
    }
}

/// Estimated tokens of messages.
pub(crate) fn estimate(messages: &[Message]) -> u32 {
    messages
        .iter()
        .map(model::estimate_message_tokens)
        .fold(0u32, u32::saturating_add)
}

/// A session's conversation and its estimated size ([`estimate`]), kept
/// together so that a turn does not count the whole conversation again:
/// it grows with every turn, and a turn starts with its size.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct History {
    messages: Vec<Message>,
    tokens: u32,
}

impl History {
    pub(crate) fn new(messages: Vec<Message>) -> History {
        History {
            tokens: estimate(&messages),
            messages,
        }
    }

    /// `messages` with their size already counted (by whoever changed
    /// them last, as a turn does); equal to `estimate(&messages)`.
    pub(super) fn counted(messages: Vec<Message>, tokens: u32) -> History {
        debug_assert_eq!(tokens, estimate(&messages), "a history's count");
        History { messages, tokens }
    }

    pub(crate) fn push(&mut self, message: Message) {
        self.tokens = self
            .tokens
            .saturating_add(model::estimate_message_tokens(&message));
        self.messages.push(message);
    }

    pub(crate) fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// Estimated tokens of the messages.
    pub(crate) fn tokens(&self) -> u32 {
        self.tokens
    }

    pub(crate) fn into_parts(self) -> (Vec<Message>, u32) {
        (self.messages, self.tokens)
    }
}

/// Whether a message starts a turn: a user message with the user's own text
/// (not only tool results).
pub(crate) fn starts_turn(m: &Message) -> bool {
    m.role == Role::User && m.content.iter().any(|b| matches!(b, Block::Text(_)))
}

/// The index of the last assistant message: it and what follows are what
/// the model is working on now and are never elided.
pub(crate) fn working_tail(conversation: &[Message]) -> usize {
    conversation
        .iter()
        .rposition(|m| m.role == Role::Assistant)
        .unwrap_or(conversation.len())
}

/// Level 1: replaces the content of tool results in `conversation[..before]`,
/// oldest first, by a short note, until `estimate` (of the whole request,
/// kept up to date) is at most `target`. Returns how many were elided.
pub(crate) fn elide_tool_results(
    conversation: &mut [Message],
    before: usize,
    estimate: &mut u32,
    target: u32,
) -> usize {
    let mut elided = 0;
    for m in conversation.iter_mut().take(before) {
        for b in &mut m.content {
            if *estimate <= target {
                return elided;
            }
            let Block::ToolResult { content, .. } = b else {
                continue;
            };
            let old = model::tokens::count(content);
            if old <= ELIDE_MIN_TOKENS || content.starts_with(ELIDED) {
                continue;
            }
            let note = format!(
                "{ELIDED} it was about {old} tokens. Call the tool again if it is still needed.]"
            );
            let new = model::tokens::count(&note);
            *content = note;
            *estimate = estimate.saturating_sub(old.saturating_sub(new));
            elided += 1;
        }
    }
    elided
}

/// How an image's place in a tool result reads once the image is dropped.
const IMAGE_ELIDED: &str =
    "[image elided by rozd to save context; call the tool again to look again]";

/// Level 1, first: drops the images tool results carried (`capture_image`)
/// in `conversation[..before]`, oldest first, until `estimate` is at most
/// `target`, and says so in the result's text. Images a client sent are
/// left to the later levels. Returns how many were dropped.
pub(crate) fn elide_tool_images(
    conversation: &mut [Message],
    before: usize,
    estimate: &mut u32,
    target: u32,
) -> usize {
    let mut elided = 0;
    for m in conversation.iter_mut().take(before) {
        if *estimate <= target {
            break;
        }
        let blocks = std::mem::take(&mut m.content);
        let mut kept: Vec<Block> = Vec::with_capacity(blocks.len());
        // Index in `kept` of the tool result the images that follow belong to.
        let mut result: Option<usize> = None;
        for b in blocks {
            match (b, result) {
                (Block::Image { data, .. }, Some(at)) if *estimate > target => {
                    let saved = model::image_tokens(&data);
                    if let Some(Block::ToolResult { content, .. }) = kept.get_mut(at) {
                        content.push('\n');
                        content.push_str(IMAGE_ELIDED);
                        let note = model::tokens::count(IMAGE_ELIDED);
                        *estimate = estimate.saturating_sub(saved.saturating_sub(note));
                    }
                    elided += 1;
                }
                (b @ Block::Image { .. }, Some(_)) => kept.push(b),
                (b, _) => {
                    result = matches!(b, Block::ToolResult { .. }).then_some(kept.len());
                    kept.push(b);
                }
            }
        }
        m.content = kept;
    }
    elided
}

/// Level 2: removes thinking blocks from assistant messages in
/// `conversation[..before]`, oldest first, until `estimate` is at most
/// `target`. Messages left empty are removed. Returns (blocks removed,
/// messages removed).
pub(crate) fn strip_thinking(
    conversation: &mut Vec<Message>,
    before: usize,
    estimate: &mut u32,
    target: u32,
) -> (usize, usize) {
    let mut blocks = 0;
    let before = before.min(conversation.len());
    for m in conversation.iter_mut().take(before) {
        if *estimate <= target {
            break;
        }
        if m.role != Role::Assistant {
            continue;
        }
        let old = model::estimate_message_tokens(m);
        let count = m.content.len();
        m.content
            .retain(|b| !matches!(b, Block::Thinking { .. } | Block::RedactedThinking { .. }));
        if m.content.len() != count {
            blocks += count - m.content.len();
            // An emptied message is removed below, with its own overhead.
            let new = if m.content.is_empty() {
                0
            } else {
                model::estimate_message_tokens(m)
            };
            *estimate = estimate.saturating_sub(old.saturating_sub(new));
        }
    }
    let len = conversation.len();
    let mut index = 0;
    conversation.retain(|m| {
        let keep = index >= before || !m.content.is_empty();
        index += 1;
        keep
    });
    (blocks, len - conversation.len())
}

/// Levels 3 and 4: where to cut whole old turns. The cut is a turn start in
/// `1..=turn_start` (the current turn is never cut); the smallest one that
/// brings `estimate` to at most `target` once `conversation[..cut]` is
/// replaced by `reserve` tokens, else the largest. `None` when there is no
/// old turn.
pub(crate) fn cut_old_turns(
    conversation: &[Message],
    turn_start: usize,
    estimate: u32,
    target: u32,
    reserve: u32,
) -> Option<usize> {
    let mut removed = 0u32;
    let mut best = None;
    let turn_start = turn_start.min(conversation.len());
    for (i, m) in conversation.iter().enumerate().take(turn_start + 1).skip(1) {
        removed = removed.saturating_add(model::estimate_message_tokens(&conversation[i - 1]));
        if i == turn_start || starts_turn(m) {
            best = Some(i);
            if estimate.saturating_sub(removed).saturating_add(reserve) <= target {
                break;
            }
        }
    }
    best
}

/// Old turns as plain text, for the model to summarise.
pub(crate) fn transcript(messages: &[Message]) -> String {
    let clip = |s: &str| -> String {
        if s.chars().count() <= TRANSCRIPT_BLOCK_CHARS {
            return s.to_string();
        }
        let mut cut: String = s.chars().take(TRANSCRIPT_BLOCK_CHARS).collect();
        cut.push('…');
        cut
    };
    let mut out = String::new();
    for m in messages {
        let who = match m.role {
            Role::User => "User",
            Role::Assistant => "Assistant",
        };
        for b in &m.content {
            let line = match b {
                Block::Text(t) => format!("{who}: {}", clip(t)),
                Block::Thinking { .. } | Block::RedactedThinking { .. } => continue,
                Block::ToolUse { name, input, .. } => {
                    format!("{who} called tool {name} with {}", clip(&input.to_string()))
                }
                Block::ToolResult {
                    name,
                    content,
                    is_error,
                    ..
                } => format!(
                    "Tool {name} {}: {}",
                    if *is_error { "failed" } else { "returned" },
                    clip(content)
                ),
                Block::Image { media_type, data } => {
                    format!(
                        "{who} attached an image ({media_type}, {} bytes)",
                        data.len()
                    )
                }
            };
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

/// The instruction of a summarisation call.
pub(crate) const SUMMARY_SYSTEM: &str = "You compress the early part of a conversation between a user \
and an AI agent that works on a robot host through tools, so the agent can continue without it. \
Write a concise summary (at most about 300 words) that keeps: the user's goals and instructions, \
decisions made, facts learnt (sensor readings, tool results that still matter), actions taken on \
the hardware and their outcomes, and open tasks. Plain text, no preamble.";

/// The message that replaces summarised turns.
pub(crate) fn summary_message(summary: &str) -> Message {
    Message::user(vec![Block::Text(format!(
        "[Summary of the earlier conversation, written when rozd compacted the context]\n{summary}"
    ))])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn old_tool_images_go_first_and_their_results_say_so() {
        let jpeg = crate::camera::jpeg::encode_rgb(&[100u8; 640 * 480 * 3], 640, 480, 50).unwrap();
        let image = || Block::Image {
            media_type: "image/jpeg".into(),
            data: jpeg.clone(),
        };
        let result = |id: &str| Block::ToolResult {
            tool_use_id: id.into(),
            name: "capture_image".into(),
            content: "{\"camera\":\"front\"}".into(),
            is_error: false,
        };
        let mut conv = vec![
            Message::user(vec![Block::Text("look".into()), image()]),
            Message::assistant(vec![Block::Text("ok".into())]),
            Message::user(vec![result("a"), image(), result("b")]),
            Message::assistant(vec![Block::Text("again".into())]),
            Message::user(vec![result("c"), image()]),
        ];
        // 640x480 counts as 410 tokens (one per 750 pixels).
        assert_eq!(model::image_tokens(&jpeg), 410);
        let mut estimate = estimate(&conv);
        let before = estimate;
        let tail = working_tail(&conv);
        let dropped = elide_tool_images(&mut conv, tail, &mut estimate, 0);
        assert_eq!(dropped, 1, "only the old tool result's image");
        assert!(estimate < before - 300);
        assert_eq!(estimate, super::estimate(&conv));
        // The client's own image stays; the working tail keeps its image.
        assert!(matches!(conv[0].content[1], Block::Image { .. }));
        assert!(matches!(conv[4].content[1], Block::Image { .. }));
        assert_eq!(conv[2].content.len(), 2);
        let Block::ToolResult { content, .. } = &conv[2].content[0] else {
            panic!("a result")
        };
        assert!(content.ends_with(IMAGE_ELIDED), "{content}");
        assert!(!starts_turn(&conv[2]), "still only tool results");
    }

    fn user(t: &str) -> Message {
        Message::user(vec![Block::Text(t.into())])
    }
    fn assistant(t: &str) -> Message {
        Message::assistant(vec![
            Block::Thinking {
                text: "thinking ".repeat(50),
                signature: "s".into(),
            },
            Block::Text(t.into()),
        ])
    }
    fn call(id: &str) -> Message {
        Message::assistant(vec![Block::ToolUse {
            id: id.into(),
            name: "read".into(),
            input: json!({}),
        }])
    }
    fn result(id: &str, size: usize) -> Message {
        Message::user(vec![Block::ToolResult {
            tool_use_id: id.into(),
            name: "read".into(),
            content: "data ".repeat(size),
            is_error: false,
        }])
    }

    #[test]
    fn meter_scales_and_clamps() {
        let mut m = ContextMeter::default();
        assert_eq!(m.scaled(100), 100);
        m.calibrate(100, 150);
        assert_eq!(m.scaled(100), 150);
        assert_eq!(m.unscaled(150), 100);
        m.calibrate(100, 100_000);
        assert_eq!(m.scaled(100), 400);
        m.calibrate(0, 5);
        assert_eq!(m.scaled(100), 400);
    }

    #[test]
    fn tool_results_are_elided_oldest_first_and_the_tail_is_kept() {
        let mut conv = vec![
            user("go"),
            call("a"),
            result("a", 200),
            call("b"),
            result("b", 200),
            call("c"),
            result("c", 200),
        ];
        let tail = working_tail(&conv);
        assert_eq!(tail, 5);
        let mut est = estimate(&conv);
        let full = est;
        // A target that one elision reaches.
        let n = elide_tool_results(&mut conv, tail, &mut est, full - 100);
        assert_eq!(n, 1);
        assert_eq!(est, estimate(&conv));
        let Block::ToolResult { content, .. } = &conv[2].content[0] else {
            panic!()
        };
        assert!(content.starts_with("[result elided"));
        // An unreachable target elides everything but the tail.
        let n = elide_tool_results(&mut conv, tail, &mut est, 0);
        assert_eq!(n, 1);
        let Block::ToolResult { content, .. } = &conv[6].content[0] else {
            panic!()
        };
        assert!(content.starts_with("data"));
    }

    #[test]
    fn thinking_is_stripped_before_the_current_turn_only() {
        let mut conv = vec![
            user("q1"),
            assistant("a1"),
            Message::assistant(vec![Block::RedactedThinking {
                data: "x".repeat(400),
            }]),
            user("q2"),
            assistant("a2"),
        ];
        let mut est = estimate(&conv);
        let (blocks, removed) = strip_thinking(&mut conv, 3, &mut est, 0);
        assert_eq!((blocks, removed), (2, 1));
        assert_eq!(conv.len(), 4);
        assert_eq!(conv[1].content, vec![Block::Text("a1".into())]);
        assert!(matches!(conv[3].content[0], Block::Thinking { .. }));
        assert_eq!(est, estimate(&conv));
    }

    #[test]
    fn cuts_fall_on_turn_starts_and_never_in_the_current_turn() {
        let long = "word ".repeat(100);
        let conv = vec![
            user(&long),
            call("a"),
            result("a", 100),
            user(&long),
            assistant(&long),
            user("now"),
        ];
        let est = estimate(&conv);
        // Reaching the target needs only the first turn.
        let first_turn = estimate(&conv[..3]);
        assert_eq!(cut_old_turns(&conv, 5, est, est - first_turn, 0), Some(3));
        // An unreachable target: everything before the current turn.
        assert_eq!(cut_old_turns(&conv, 5, est, 0, 0), Some(5));
        // A reserve for the summary moves the cut.
        assert_eq!(cut_old_turns(&conv, 5, est, est - first_turn, 10), Some(5));
        assert_eq!(cut_old_turns(&conv, 0, est, 0, 0), None);
    }

    #[test]
    fn transcript_names_speakers_tools_and_skips_thinking() {
        let t = transcript(&[user("hi"), assistant("hello"), call("a"), result("a", 2)]);
        assert_eq!(
            t,
            "User: hi\nAssistant: hello\nAssistant called tool read with {}\nTool read returned: data data \n"
        );
    }
}
