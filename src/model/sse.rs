//! A small decoder for server-sent events (the WHATWG `text/event-stream`
//! format), as both providers stream their answers.
//!
//! Bytes go in as they arrive from the network, in chunks of any size; whole
//! events come out. Lines end in `\n`, `\r\n` or `\r` (also when the `\r` and
//! the `\n` arrive in different chunks); lines starting with `:` are comments;
//! several `data:` lines of one event are joined with `\n`; a blank line ends
//! an event; an event without data is not dispatched.

/// One dispatched event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field; empty means the default type `message`.
    pub event: String,
    pub data: String,
    pub id: Option<String>,
}

#[derive(Debug, Default)]
pub struct SseDecoder {
    /// Bytes of the line being received (not yet ended).
    line: Vec<u8>,
    /// The previous chunk ended in `\r`: a `\n` at the start of the next one
    /// belongs to that line ending.
    after_cr: bool,
    /// Whether the first line has been seen (a leading BOM is dropped).
    started: bool,
    event: String,
    data: String,
    has_data: bool,
    id: Option<String>,
}

impl SseDecoder {
    pub fn new() -> Self {
        SseDecoder::default()
    }

    /// Feeds the next bytes; returns the events they complete, in order.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        let mut out = Vec::new();
        let mut rest = bytes;
        if self.after_cr {
            self.after_cr = false;
            if let Some(stripped) = rest.strip_prefix(b"\n") {
                rest = stripped;
            }
        }
        while let Some(pos) = rest.iter().position(|b| *b == b'\n' || *b == b'\r') {
            self.line.extend_from_slice(&rest[..pos]);
            let ended_by_cr = rest[pos] == b'\r';
            rest = &rest[pos + 1..];
            if ended_by_cr {
                match rest.first() {
                    Some(b'\n') => rest = &rest[1..],
                    None => self.after_cr = true,
                    Some(_) => {}
                }
            }
            let line = std::mem::take(&mut self.line);
            if let Some(event) = self.line_done(&line) {
                out.push(event);
            }
        }
        self.line.extend_from_slice(rest);
        out
    }

    /// Bytes held for the event being received (to bound its size).
    pub fn buffered(&self) -> usize {
        self.line.len() + self.data.len()
    }

    /// The stream ended: an event without its terminating blank line is
    /// incomplete and is discarded, as the format requires.
    pub fn finish(&mut self) {
        *self = SseDecoder::default();
    }

    fn line_done(&mut self, raw: &[u8]) -> Option<SseEvent> {
        let mut raw = raw;
        if !self.started {
            self.started = true;
            if let Some(stripped) = raw.strip_prefix("\u{feff}".as_bytes()) {
                raw = stripped;
            }
        }
        if raw.is_empty() {
            return self.dispatch();
        }
        let line = String::from_utf8_lossy(raw);
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line.as_ref(), ""),
        };
        match field {
            "event" => self.event = value.to_string(),
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "id" if !value.contains('\0') => self.id = Some(value.to_string()),
            // `retry` only matters to reconnecting clients; unknown fields are ignored.
            _ => {}
        }
        None
    }

    fn dispatch(&mut self) -> Option<SseEvent> {
        let event = std::mem::take(&mut self.event);
        if !std::mem::take(&mut self.has_data) {
            return None;
        }
        Some(SseEvent {
            event,
            data: std::mem::take(&mut self.data),
            id: self.id.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut d = SseDecoder::new();
        chunks.iter().flat_map(|c| d.push(c)).collect()
    }

    fn ev(event: &str, data: &str) -> SseEvent {
        SseEvent {
            event: event.into(),
            data: data.into(),
            id: None,
        }
    }

    #[test]
    fn events_with_type_and_data() {
        assert_eq!(
            all(&[b"event: ping\ndata: {}\n\nevent: x\ndata: 1\n\n"]),
            [ev("ping", "{}"), ev("x", "1")]
        );
    }

    #[test]
    fn multi_line_data_is_joined_with_newlines() {
        assert_eq!(
            all(&[b"data: a\ndata:b\ndata:  c\n\n"]),
            [ev("", "a\nb\n c")]
        );
    }

    #[test]
    fn comments_and_unknown_fields_are_ignored() {
        assert_eq!(
            all(&[b": keepalive\nretry: 10\nfoo: bar\ndata: x\n\n: again\n\n"]),
            [ev("", "x")]
        );
    }

    #[test]
    fn crlf_and_cr_line_endings() {
        assert_eq!(
            all(&[b"event: a\r\ndata: 1\r\n\r\nevent: b\rdata: 2\r\r"]),
            [ev("a", "1"), ev("b", "2")]
        );
    }

    #[test]
    fn crlf_split_between_chunks_is_one_line_ending() {
        assert_eq!(
            all(&[b"data: 1\r", b"\n", b"\r", b"\ndata: 2\r", b"\r\n"]),
            [ev("", "1"), ev("", "2")]
        );
    }

    #[test]
    fn events_split_anywhere_across_chunks() {
        let text =
            "event: content_block_delta\ndata: {\"t\":\"h\u{e9}llo\"}\n\nevent: stop\ndata: {}\n\n";
        let whole = all(&[text.as_bytes()]);
        assert_eq!(whole.len(), 2);
        // Every split point, including inside the two-byte UTF-8 character.
        for cut in 0..text.len() {
            let (a, b) = text.as_bytes().split_at(cut);
            assert_eq!(all(&[a, b]), whole, "split at {cut}");
        }
        // One byte at a time.
        let bytes: Vec<&[u8]> = text.as_bytes().chunks(1).collect();
        assert_eq!(all(&bytes), whole);
    }

    #[test]
    fn event_without_data_is_not_dispatched_and_type_resets() {
        assert_eq!(all(&[b"event: lonely\n\ndata: x\n\n"]), [ev("", "x")]);
    }

    #[test]
    fn empty_data_line_is_an_event_with_empty_data() {
        assert_eq!(all(&[b"data:\n\n"]), [ev("", "")]);
    }

    #[test]
    fn field_without_colon_and_leading_bom() {
        assert_eq!(all(&["\u{feff}data\n\n".as_bytes()]), [ev("", "")]);
    }

    #[test]
    fn id_is_kept() {
        let events = all(&[b"id: 7\ndata: a\n\n"]);
        assert_eq!(events[0].id.as_deref(), Some("7"));
    }

    #[test]
    fn unterminated_event_is_discarded_at_finish() {
        let mut d = SseDecoder::new();
        assert!(d.push(b"data: partial").is_empty());
        d.finish();
        assert!(d.push(b"\n\n").is_empty());
    }
}

/// Properties over arbitrary byte streams (bounded case counts; `fuzz/`
/// runs the decoder for long).
#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    fn decode_in(bytes: &[u8], cuts: &[usize]) -> Vec<SseEvent> {
        let mut decoder = SseDecoder::new();
        let mut events = Vec::new();
        let mut start = 0;
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        cuts.sort_unstable();
        for cut in cuts {
            events.extend(decoder.push(&bytes[start..cut.max(start)]));
            start = cut.max(start);
        }
        events.extend(decoder.push(&bytes[start..]));
        events
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// However a provider's stream is cut into chunks, the same events
        /// come out, and no bytes make the decoder panic.
        #[test]
        fn chunking_never_changes_the_events(
            bytes in prop::collection::vec(
                prop_oneof![
                    4 => prop::sample::select(b"data: event:id:\r\n\n x{}\xef\xbb\xbf\xc3\xa9".to_vec()),
                    1 => any::<u8>(),
                ],
                0..300,
            ),
            cuts in prop::collection::vec(any::<usize>(), 0..8),
        ) {
            prop_assert_eq!(decode_in(&bytes, &cuts), decode_in(&bytes, &[]));
        }

        /// Events written in the SSE format are read back as written, with
        /// any line ending.
        #[test]
        fn written_events_read_back(
            events in prop::collection::vec(
                ("[a-z_]{0,10}", prop::collection::vec("[^\r\n]{0,20}", 1..4)),
                1..5,
            ),
            ending in prop::sample::select(vec!["\n", "\r\n", "\r"]),
        ) {
            let mut text = String::new();
            for (event, lines) in &events {
                if !event.is_empty() {
                    text.push_str(&format!("event: {event}{ending}"));
                }
                for line in lines {
                    text.push_str(&format!("data: {line}{ending}"));
                }
                text.push_str(ending);
            }
            let read = decode_in(text.as_bytes(), &[]);
            prop_assert_eq!(read.len(), events.len());
            for (got, (event, lines)) in read.iter().zip(&events) {
                prop_assert_eq!(&got.event, event);
                prop_assert_eq!(&got.data, &lines.join("\n"));
            }
        }
    }
}
