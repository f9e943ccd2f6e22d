//! Multipart MJPEG (`multipart/x-mixed-replace`), what ESP32-CAMs,
//! mjpg-streamer, motion, ffmpeg's `mpjpeg` and many IP cameras serve: an
//! incremental parser that holds at most one frame (bounded), and the
//! writer of the same format for rozd's own `stream.mjpeg`.
//!
//! Each part is `--boundary CRLF headers CRLF CRLF body`; the body's end is
//! its `Content-Length` when given, else the next boundary.

use bytes::{Buf, Bytes, BytesMut};

use super::health::Rejection;
use super::jpeg::FrameError;

/// Longest header block of one part.
const MAX_HEADERS: usize = 8 * 1024;

/// The boundary of a `multipart/x-mixed-replace; boundary=...` content type.
pub fn boundary(content_type: &str) -> Option<String> {
    let (kind, params) = content_type.split_once(';')?;
    if !kind
        .trim()
        .eq_ignore_ascii_case("multipart/x-mixed-replace")
    {
        return None;
    }
    params.split(';').find_map(|p| {
        let (k, v) = p.split_once('=')?;
        if !k.trim().eq_ignore_ascii_case("boundary") {
            return None;
        }
        let v = v.trim().trim_matches('"');
        // Some servers write the boundary with its leading dashes.
        let v = v.strip_prefix("--").unwrap_or(v);
        (!v.is_empty() && v.len() <= 70).then(|| v.to_string())
    })
}

/// The boundary of a stream served under a generic content type (ffmpeg's
/// `-listen 1` says `application/octet-stream`), from its first line
/// `--boundary`.
pub fn sniff_boundary(first: &[u8]) -> Option<String> {
    let start = first.iter().position(|b| !b.is_ascii_whitespace())?;
    let rest = first[start..].strip_prefix(b"--")?;
    let end = rest.iter().position(|&b| b == b'\r' || b == b'\n')?;
    let boundary = std::str::from_utf8(&rest[..end]).ok()?.trim();
    (!boundary.is_empty() && boundary.len() <= 70 && boundary.bytes().all(|b| b.is_ascii_graphic()))
        .then(|| boundary.to_string())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Looking for the next `--boundary`.
    Seek,
    /// Reading a part's headers.
    Headers,
    /// Reading a body of known length.
    Body(usize),
    /// Reading a body up to the next boundary.
    Open,
    /// Skipping this many bytes of a refused body.
    Skip(usize),
    /// The closing boundary was seen.
    Done,
}

/// What one part turned out to be.
pub type Part = Result<Bytes, FrameError>;

/// The parser of one stream.
#[derive(Debug)]
pub struct MultipartParser {
    /// `--boundary`.
    delimiter: Vec<u8>,
    buf: BytesMut,
    state: State,
    max_frame: usize,
    /// Bytes dropped while looking for a boundary since the last one.
    discarded: usize,
    /// The rest of a refused frame is being skipped: not counted again.
    resync: bool,
}

impl MultipartParser {
    pub fn new(boundary: &str, max_frame: usize) -> MultipartParser {
        MultipartParser {
            delimiter: format!("--{boundary}").into_bytes(),
            buf: BytesMut::new(),
            state: State::Seek,
            max_frame,
            discarded: 0,
            resync: false,
        }
    }

    /// Whether the closing boundary was seen.
    pub fn done(&self) -> bool {
        self.state == State::Done
    }

    /// Bytes held now (at most about one frame and its headers).
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Feeds bytes of the stream; every part they complete goes to `out`,
    /// a frame's body or why it was refused.
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<Part>) {
        self.buf.extend_from_slice(chunk);
        while self.step(out) {}
    }

    /// One step of the state machine; `false` when more bytes are needed.
    fn step(&mut self, out: &mut Vec<Part>) -> bool {
        match self.state {
            State::Done => {
                self.buf.clear();
                false
            }
            State::Seek => match find(&self.buf, &self.delimiter) {
                Some(at) => {
                    self.buf.advance(at + self.delimiter.len());
                    self.discarded = 0;
                    self.resync = false;
                    self.state = State::Headers;
                    true
                }
                None => {
                    // Keep what could be the start of a delimiter.
                    let keep = self.delimiter.len() - 1;
                    let drop = self.buf.len().saturating_sub(keep);
                    self.buf.advance(drop);
                    self.discarded += drop;
                    if self.discarded > self.max_frame + MAX_HEADERS && !self.resync {
                        self.discarded = 0;
                        out.push(Err(FrameError::new(
                            Rejection::Garbage,
                            "the stream sends no multipart boundary",
                        )));
                    }
                    false
                }
            },
            State::Headers => {
                if self.buf.starts_with(b"--") {
                    self.state = State::Done;
                    return true;
                }
                let Some((end, sep)) = find(&self.buf, b"\r\n\r\n")
                    .map(|at| (at, 4))
                    .or_else(|| find(&self.buf, b"\n\n").map(|at| (at, 2)))
                else {
                    if self.buf.len() > MAX_HEADERS {
                        out.push(Err(FrameError::new(
                            Rejection::Garbage,
                            "a multipart part with an endless header",
                        )));
                        self.state = State::Seek;
                        return true;
                    }
                    return false;
                };
                let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
                self.buf.advance(end + sep);
                self.state = self.after_headers(&head, out);
                true
            }
            State::Body(len) => {
                if self.buf.len() < len {
                    return false;
                }
                let body = self.buf.split_to(len).freeze();
                out.push(Ok(body));
                self.state = State::Seek;
                true
            }
            State::Open => {
                let mut end = Vec::with_capacity(self.delimiter.len() + 2);
                end.extend_from_slice(b"\r\n");
                end.extend_from_slice(&self.delimiter);
                match find(&self.buf, &end) {
                    Some(at) => {
                        let body = self.buf.split_to(at).freeze();
                        out.push(Ok(body));
                        self.state = State::Seek;
                        true
                    }
                    None if self.buf.len() > self.max_frame + end.len() => {
                        out.push(Err(FrameError::new(
                            Rejection::Oversized,
                            format!("a frame larger than {} bytes", self.max_frame),
                        )));
                        let keep = end.len() - 1;
                        let drop = self.buf.len() - keep;
                        self.buf.advance(drop);
                        self.state = State::Seek;
                        self.resync = true;
                        true
                    }
                    None => false,
                }
            }
            State::Skip(n) => {
                let drop = n.min(self.buf.len());
                self.buf.advance(drop);
                if drop == n {
                    self.state = State::Seek;
                    true
                } else {
                    self.state = State::Skip(n - drop);
                    false
                }
            }
        }
    }

    /// Where a part's body goes, by its headers.
    fn after_headers(&self, head: &str, out: &mut Vec<Part>) -> State {
        let mut length = None;
        let mut content_type = None;
        for line in head.lines() {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            if name.trim().eq_ignore_ascii_case("content-length") {
                match value.parse::<usize>() {
                    Ok(n) => length = Some(n),
                    Err(_) => {
                        out.push(Err(FrameError::new(
                            Rejection::Garbage,
                            format!("a part with Content-Length {value:?}"),
                        )));
                        return State::Seek;
                    }
                }
            } else if name.trim().eq_ignore_ascii_case("content-type") {
                content_type = Some(value.to_ascii_lowercase());
            }
        }
        let skip = |n: Option<usize>| n.map_or(State::Seek, State::Skip);
        if let Some(t) = content_type
            && !(t.starts_with("image/jpeg") || t.starts_with("image/jpg"))
        {
            out.push(Err(FrameError::new(
                Rejection::WrongType,
                format!("a part of type {t:?} (expected image/jpeg)"),
            )));
            return skip(length);
        }
        match length {
            Some(n) if n > self.max_frame => {
                out.push(Err(FrameError::new(
                    Rejection::Oversized,
                    format!("a frame of {n} bytes exceeds max_frame_kb"),
                )));
                State::Skip(n)
            }
            Some(n) => State::Body(n),
            None => State::Open,
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || haystack.len() < needle.len() {
        return None;
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The boundary of rozd's own `stream.mjpeg`.
pub const STREAM_BOUNDARY: &str = "rozdframe";

/// One part of rozd's `stream.mjpeg`: headers and the JPEG, then CRLF.
pub fn part_header(len: usize) -> Bytes {
    Bytes::from(format!(
        "--{STREAM_BOUNDARY}\r\nContent-Type: image/jpeg\r\nContent-Length: {len}\r\n\r\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(body: &[u8], length: bool) -> Vec<u8> {
        let mut p = b"--ffmpeg\r\nContent-Type: image/jpeg\r\n".to_vec();
        if length {
            p.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
        }
        p.extend_from_slice(b"\r\n");
        p.extend_from_slice(body);
        p.extend_from_slice(b"\r\n");
        p
    }

    fn parse_in_pieces(stream: &[u8], piece: usize, max: usize) -> Vec<Part> {
        let mut p = MultipartParser::new("ffmpeg", max);
        let mut out = Vec::new();
        for chunk in stream.chunks(piece) {
            p.push(chunk, &mut out);
            assert!(p.buffered() <= max + 2 * MAX_HEADERS, "bounded");
        }
        out
    }

    #[test]
    fn the_boundary_is_read_from_the_content_type() {
        assert_eq!(
            boundary("multipart/x-mixed-replace;boundary=ffmpeg").as_deref(),
            Some("ffmpeg")
        );
        assert_eq!(
            boundary("multipart/x-mixed-replace; boundary=\"--frame\"").as_deref(),
            Some("frame")
        );
        assert_eq!(boundary("image/jpeg"), None);
        assert_eq!(boundary("multipart/x-mixed-replace"), None);
    }

    #[test]
    fn a_boundary_is_sniffed_from_a_generic_stream() {
        assert_eq!(
            sniff_boundary(b"--ffmpeg\r\nContent-type: image/jpeg\r\n").as_deref(),
            Some("ffmpeg")
        );
        assert_eq!(sniff_boundary(b"\r\n--frame\r\n").as_deref(), Some("frame"));
        assert_eq!(sniff_boundary(b"\xFF\xD8\xFF\xE0"), None);
        assert_eq!(sniff_boundary(b"--no end of line"), None);
        assert_eq!(sniff_boundary(b"<html>\r\n"), None);
    }

    #[test]
    fn frames_come_out_whole_however_the_bytes_are_cut() {
        let a = vec![0xAA; 1000];
        let b = vec![0xBB; 3000];
        let mut stream = b"preamble\r\n".to_vec();
        stream.extend(part(&a, true));
        stream.extend(part(&b, false));
        stream.extend(part(&a, false));
        stream.extend_from_slice(b"--ffmpeg--\r\n");
        for piece in [1, 7, 64, 1500, 100_000] {
            let out = parse_in_pieces(&stream, piece, 10_000);
            let bodies: Vec<Vec<u8>> = out.into_iter().map(|p| p.unwrap().to_vec()).collect();
            assert_eq!(
                bodies,
                vec![a.clone(), b.clone(), a.clone()],
                "piece {piece}"
            );
        }
    }

    #[test]
    fn bad_parts_are_refused_and_counted_and_the_stream_goes_on() {
        let good = vec![0x11; 100];
        let mut stream = part(&vec![0x22; 5000], true); // oversized, with length
        stream.extend(part(&good, true));
        stream.extend(part(&vec![0x33; 5000], false)); // oversized, no length
        stream.extend(part(&good, false));
        stream.extend(b"--ffmpeg\r\nContent-Type: text/html\r\nContent-Length: 5\r\n\r\nhello\r\n");
        stream.extend(b"--ffmpeg\r\nContent-Length: many\r\n\r\n");
        stream.extend(part(&good, true));
        let out = parse_in_pieces(&stream, 333, 1000);
        let kinds: Vec<Result<usize, Rejection>> = out
            .iter()
            .map(|p| p.as_ref().map(|b| b.len()).map_err(|e| e.why))
            .collect();
        assert_eq!(
            kinds,
            vec![
                Err(Rejection::Oversized),
                Ok(100),
                Err(Rejection::Oversized),
                Ok(100),
                Err(Rejection::WrongType),
                Err(Rejection::Garbage),
                Ok(100),
            ]
        );
    }

    #[test]
    fn a_huge_frame_without_a_length_is_refused_once() {
        let mut stream = part(&vec![0x44; 50_000], false);
        stream.extend(part(&[0x11; 10], true));
        let out = parse_in_pieces(&stream, 1000, 1000);
        let kinds: Vec<Result<usize, Rejection>> = out
            .iter()
            .map(|p| p.as_ref().map(|b| b.len()).map_err(|e| e.why))
            .collect();
        assert_eq!(kinds, vec![Err(Rejection::Oversized), Ok(10)]);
    }

    #[test]
    fn a_stream_without_boundaries_is_garbage_in_bounded_memory() {
        let noise = vec![0x5A; 50_000];
        let out = parse_in_pieces(&noise, 4096, 1000);
        assert!(!out.is_empty());
        assert!(
            out.iter()
                .all(|p| p.as_ref().is_err_and(|e| e.why == Rejection::Garbage))
        );
    }

    #[test]
    fn our_own_stream_parses() {
        let body = vec![7u8; 321];
        let mut stream = part_header(body.len()).to_vec();
        stream.extend_from_slice(&body);
        stream.extend_from_slice(b"\r\n");
        let mut p = MultipartParser::new(STREAM_BOUNDARY, 1000);
        let mut out = Vec::new();
        p.push(&stream, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].as_ref().unwrap().to_vec(), body);
    }
}
