//! A provider's whole streamed response, decoded without a connection: the
//! same SSE decoder, provider decoder and event-size bound a model call
//! uses (`http::Stream`), fed from bytes in memory. Its user is the fuzz
//! targets in `fuzz/`, which feed it arbitrary bodies cut into arbitrary
//! chunks.

use super::ModelEvent;
use super::anthropic::AnthropicDecoder;
use super::http::{Decoder, MAX_EVENT_BYTES};
use super::openai::OpenAiDecoder;
use super::sse::SseDecoder;

/// Which provider's stream format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamFormat {
    /// Anthropic's Messages API events.
    Anthropic,
    /// OpenAI-compatible chat-completion chunks.
    OpenAi,
}

/// Decodes a streamed body that arrives in `chunks`, as a model call does:
/// the model events up to the provider's final event or the body's end, or
/// the message of the failure that would end the call.
pub fn decode_stream<'a>(
    format: StreamFormat,
    chunks: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Vec<ModelEvent>, String> {
    match format {
        StreamFormat::Anthropic => run(AnthropicDecoder::default(), chunks),
        StreamFormat::OpenAi => run(OpenAiDecoder::new(0), chunks),
    }
}

fn run<'a>(
    mut decoder: impl Decoder,
    chunks: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Vec<ModelEvent>, String> {
    let mut sse = SseDecoder::new();
    let mut out = Vec::new();
    for chunk in chunks {
        for event in sse.push(chunk) {
            out.extend(decoder.event(event).map_err(|f| f.message)?);
            if decoder.finished() {
                return Ok(out);
            }
        }
        if sse.buffered() > MAX_EVENT_BYTES {
            return Err(format!(
                "the provider sent an event larger than {MAX_EVENT_BYTES} bytes"
            ));
        }
    }
    sse.finish();
    out.extend(decoder.end().map_err(|f| f.message)?);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_cut_anywhere_decodes_to_the_same_events() {
        let body = concat!(
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi there\"},\"finish_reason\":null}]}\n\n",
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            "data: [DONE]\n\n"
        )
        .as_bytes();
        let whole = decode_stream(StreamFormat::OpenAi, [body]).unwrap();
        assert!(!whole.is_empty());
        for cut in 1..body.len() {
            let (a, b) = body.split_at(cut);
            assert_eq!(
                decode_stream(StreamFormat::OpenAi, [a, b]).unwrap(),
                whole,
                "cut at {cut}"
            );
        }
        assert!(
            decode_stream(
                StreamFormat::Anthropic,
                [&b"event: error\ndata: {}\n\n"[..]]
            )
            .is_err()
        );
    }
}
