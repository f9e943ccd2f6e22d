//! The Anthropic stream decoder behind a model call (`model::decode`): an
//! arbitrary body, cut into chunks at arbitrary points, decodes to events
//! or an error, never a panic; the cuts never change the outcome.
//! Input: one byte of cut positions, then the body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rozd::model::decode::{StreamFormat, decode_stream};

fuzz_target!(|data: &[u8]| {
    let Some((&cuts, body)) = data.split_first() else {
        return;
    };
    let whole = decode_stream(StreamFormat::Anthropic, [body]);
    let mut chunks = Vec::new();
    let mut rest = body;
    let mut step = usize::from(cuts % 32) + 1;
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(step.min(rest.len()));
        chunks.push(chunk);
        rest = tail;
        step = step * 5 % 37 + 1;
    }
    let cut = decode_stream(StreamFormat::Anthropic, chunks);
    assert_eq!(format!("{whole:?}"), format!("{cut:?}"));
});
