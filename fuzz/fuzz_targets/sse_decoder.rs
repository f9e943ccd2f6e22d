//! The SSE decoder (`model::sse`): an arbitrary stream cut at arbitrary
//! points gives the same events as the stream in one piece.
//! Input: one byte of cut positions, then the stream.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rozd::model::sse::SseDecoder;

fuzz_target!(|data: &[u8]| {
    let Some((&cuts, stream)) = data.split_first() else {
        return;
    };
    let mut whole = SseDecoder::new();
    let expected = whole.push(stream);
    let mut pieces = SseDecoder::new();
    let mut got = Vec::new();
    let mut rest = stream;
    let mut step = usize::from(cuts % 16) + 1;
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(step.min(rest.len()));
        got.extend(pieces.push(chunk));
        rest = tail;
        step = step * 3 % 17 + 1;
    }
    assert_eq!(got, expected);
    assert_eq!(pieces.buffered(), whole.buffered());
    pieces.finish();
    assert_eq!(pieces.buffered(), 0);
});
