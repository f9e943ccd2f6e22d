//! The OpenAi stream decoder behind a model call (`model::decode`): an
//! arbitrary body, cut into chunks at arbitrary points, decodes to events
//! or an error, never a panic; the cuts never change the outcome.
//! Input: one byte of cut positions, then the body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rozd::model::ModelEvent;
use rozd::model::decode::{StreamFormat, decode_stream};

fuzz_target!(|data: &[u8]| {
    let Some((&cuts, body)) = data.split_first() else {
        return;
    };
    let whole = decode_stream(StreamFormat::OpenAi, [body]);
    let mut chunks = Vec::new();
    let mut rest = body;
    let mut step = usize::from(cuts % 32) + 1;
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(step.min(rest.len()));
        chunks.push(chunk);
        rest = tail;
        step = step * 5 % 37 + 1;
    }
    let cut = decode_stream(StreamFormat::OpenAi, chunks);
    assert_eq!(without_ids(whole), without_ids(cut));
});

/// A tool call the provider sent without an id gets a fresh random one
/// (`call_<uuid>`), different in each decode: compare without them.
fn without_ids(decoded: Result<Vec<ModelEvent>, String>) -> Result<Vec<ModelEvent>, String> {
    decoded.map(|events| {
        events
            .into_iter()
            .map(|e| match e {
                ModelEvent::ToolUse { name, input, .. } => ModelEvent::ToolUse {
                    id: String::new(),
                    name,
                    input,
                },
                other => other,
            })
            .collect()
    })
}
