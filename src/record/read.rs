//! Reading recordings back: every complete message of a file (finished or
//! cut short), a sensor channel's values and a camera channel's frames for
//! replay, and a file's summary
//! for `rozd record info` and `GET /v1/recordings`. A leaf: it names no
//! other part of rozd, so the hardware config can read a replay file.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

/// The MCAP magic that starts and ends a file.
pub const MAGIC: &[u8] = b"\x89MCAP0\r\n";

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not an MCAP file")]
    NotMcap { path: String },
    #[error("{path} is not a regular file (a FIFO, a device or a directory is never read)")]
    NotRegular { path: String },
    #[error("{path} is not a readable recording: {why}")]
    Corrupt { path: String, why: String },
}

/// Every message a file holds up to where it ends or breaks off.
#[derive(Debug)]
pub struct Scan {
    pub messages: Vec<mcap::Message<'static>>,
    /// The file ends with the summary and the closing magic (rozd finished it).
    pub finished: bool,
    /// Why reading stopped before the end, for a file cut short.
    pub broken_off: Option<String>,
}

/// Reads a whole regular file. Anything else (a FIFO, which would block, a
/// device such as `/dev/zero`, which never ends) is refused, checked on the
/// opened descriptor (opened without blocking), not on the path.
pub fn read_file(path: &Path) -> Result<Vec<u8>, ReadError> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let io = |source| ReadError::Io {
        path: path.display().to_string(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.file_type().is_file() {
        return Err(ReadError::NotRegular {
            path: path.display().to_string(),
        });
    }
    // No more than it said it holds (a file that grows meanwhile is read
    // as it was).
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    (&mut file)
        .take(meta.len())
        .read_to_end(&mut bytes)
        .map_err(io)?;
    Ok(bytes)
}

/// MCAP opcodes whose lengths are checked before the reader sees them.
const OP_HEADER: u8 = 0x01;
const OP_FOOTER: u8 = 0x02;
const OP_SCHEMA: u8 = 0x03;
const OP_CHANNEL: u8 = 0x04;
const OP_CHUNK: u8 = 0x06;
const OP_METADATA: u8 = 0x0C;

/// A field of a record, as far as its length goes.
#[derive(Clone, Copy)]
enum Field {
    Fixed(usize),
    /// A `u32` length, then that many bytes (strings, byte arrays, maps).
    Prefixed32,
    /// A `u64` length, then that many bytes (a chunk's records).
    Prefixed64,
}

/// Walks `content` field by field: every length must fit in what is left.
/// Returns where the last field (a chunk's records) starts and its length.
fn check_fields(content: &[u8], fields: &[Field]) -> Result<(usize, usize), String> {
    let mut at = 0usize;
    let mut last = (0, 0);
    for field in fields {
        let rest = content.len() - at;
        let (head, len) = match *field {
            Field::Fixed(n) => (0, n),
            Field::Prefixed32 => {
                let bytes = content
                    .get(at..at + 4)
                    .ok_or("a length past the record's end")?;
                (
                    4,
                    u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize,
                )
            }
            Field::Prefixed64 => {
                let bytes = content
                    .get(at..at + 8)
                    .ok_or("a length past the record's end")?;
                let mut eight = [0u8; 8];
                eight.copy_from_slice(bytes);
                (
                    8,
                    usize::try_from(u64::from_le_bytes(eight)).unwrap_or(usize::MAX),
                )
            }
        };
        if head > rest || len > rest - head {
            return Err(format!(
                "a field claims {len} bytes where its record holds {}",
                rest.saturating_sub(head)
            ));
        }
        last = (at + head, len);
        at += head + len;
    }
    Ok(last)
}

/// Checks the records of `bytes` (from `start`): each record's length fits
/// the file, and the length-prefixed fields of the records rozd writes fit
/// their record (a chunk's records too, when uncompressed). Returns where
/// the whole, consistent records end, and why they end before the data
/// does. The MCAP reader only ever sees that prefix: a length of 2^64-1 or
/// a string of 2^32-1 bytes cannot make it panic or allocate beyond the
/// file's size.
fn sane_records(bytes: &[u8], start: usize) -> (usize, Option<String>) {
    use Field::{Fixed, Prefixed32, Prefixed64};
    let mut at = start;
    while bytes.len() - at >= 9 {
        let opcode = bytes[at];
        let mut eight = [0u8; 8];
        eight.copy_from_slice(&bytes[at + 1..at + 9]);
        let len = usize::try_from(u64::from_le_bytes(eight)).unwrap_or(usize::MAX);
        let rest = bytes.len() - at - 9;
        if len > rest {
            return (
                at,
                Some(format!(
                    "the record at byte {at} claims {len} bytes; {rest} follow it"
                )),
            );
        }
        let content = &bytes[at + 9..at + 9 + len];
        let checked = match opcode {
            OP_HEADER => check_fields(content, &[Prefixed32, Prefixed32]).map(|_| ()),
            OP_SCHEMA => {
                check_fields(content, &[Fixed(2), Prefixed32, Prefixed32, Prefixed32]).map(|_| ())
            }
            OP_CHANNEL => check_fields(
                content,
                &[Fixed(2), Fixed(2), Prefixed32, Prefixed32, Prefixed32],
            )
            .map(|_| ()),
            OP_METADATA => check_fields(content, &[Prefixed32, Prefixed32]).map(|_| ()),
            OP_CHUNK => check_fields(
                content,
                &[
                    Fixed(8),
                    Fixed(8),
                    Fixed(8),
                    Fixed(4),
                    Prefixed32,
                    Prefixed64,
                ],
            )
            .and_then(|(records_at, records_len)| {
                // Compression is the length-prefixed field before them.
                let compressed = content.get(28..32).is_some_and(|l| l != [0, 0, 0, 0]);
                if compressed {
                    return Ok(());
                }
                let records = &content[records_at..records_at + records_len];
                match sane_records(records, 0) {
                    (end, None) if end == records.len() => Ok(()),
                    (_, why) => Err(format!(
                        "in a chunk: {}",
                        why.unwrap_or_else(|| "a record cut short".into())
                    )),
                }
            }),
            _ => Ok(()),
        };
        if let Err(why) = checked {
            return (at, Some(format!("the record at byte {at}: {why}")));
        }
        at += 9 + len;
        if opcode == OP_FOOTER {
            break;
        }
    }
    (at, None)
}

/// Whether `bytes` is a finished MCAP file (both magics present).
pub fn is_finished(bytes: &[u8]) -> bool {
    bytes.len() >= 2 * MAGIC.len() && bytes.starts_with(MAGIC) && bytes.ends_with(MAGIC)
}

/// The messages of the complete chunks of `bytes`: all of them for a
/// finished file, those before the break for one cut short.
///
/// Only the whole, consistent records are read (see [`sane_records`]); a
/// file whose first record is not a sane header is [`ReadError::Corrupt`].
/// A panic of the MCAP reader on what is left is caught and reported as a
/// corrupt file too: nothing a file holds may take rozd down.
pub fn scan(path: &Path, bytes: &[u8]) -> Result<Scan, ReadError> {
    let corrupt = |why: String| ReadError::Corrupt {
        path: path.display().to_string(),
        why,
    };
    if !bytes.starts_with(MAGIC) {
        return Err(ReadError::NotMcap {
            path: path.display().to_string(),
        });
    }
    let (end, insane) = sane_records(bytes, MAGIC.len());
    if end == MAGIC.len() || bytes.get(MAGIC.len()) != Some(&OP_HEADER) {
        return Err(corrupt(insane.unwrap_or_else(|| {
            "it does not begin with a header record".into()
        })));
    }
    let finished = insane.is_none() && is_finished(bytes);
    let readable = if finished { bytes } else { &bytes[..end] };
    let read = std::panic::catch_unwind(|| {
        let stream = if finished {
            mcap::MessageStream::new(readable)
        } else {
            // A file cut short has no closing magic: read what precedes the break.
            mcap::MessageStream::new_with_options(
                readable,
                mcap::read::Options::IgnoreEndMagic.into(),
            )
        }
        .map_err(|e| e.to_string())?;
        let mut messages = Vec::new();
        let mut broken_off = None;
        for message in stream {
            match message {
                Ok(m) => messages.push(m),
                Err(e) => {
                    broken_off = Some(e.to_string());
                    break;
                }
            }
        }
        Ok::<_, String>((messages, broken_off))
    });
    let (messages, broken_off) = match read {
        Ok(Ok(read)) => read,
        Ok(Err(why)) => return Err(corrupt(why)),
        Err(_) => return Err(corrupt("the MCAP reader failed on it".into())),
    };
    Ok(Scan {
        messages,
        finished,
        broken_off: broken_off.or(insane),
    })
}

/// One sensor channel's values, for replay.
#[derive(Debug, Default)]
pub struct SensorTrack {
    /// (time since the file's first message, value), in time order.
    pub values: Vec<(Duration, f64)>,
    /// From the file's first message to its last, any channel.
    pub span: Duration,
    /// The channels of the file that carry sensor values (for errors).
    pub channels: Vec<String>,
}

/// The values of `channel` (messages with a numeric `value`) in `path`.
pub fn sensor_track(path: &Path, channel: &str) -> Result<SensorTrack, ReadError> {
    let bytes = read_file(path)?;
    let scan = scan(path, &bytes)?;
    let start = scan.messages.iter().map(|m| m.log_time).min().unwrap_or(0);
    let end = scan.messages.iter().map(|m| m.log_time).max().unwrap_or(0);
    let mut channels: Vec<String> = scan
        .messages
        .iter()
        .map(|m| m.channel.topic.clone())
        .filter(|t| t.starts_with("/sensors/"))
        .collect();
    channels.sort();
    channels.dedup();
    let mut values: Vec<(Duration, f64)> = scan
        .messages
        .iter()
        .filter(|m| m.channel.topic == channel)
        .filter_map(|m| {
            let body: serde_json::Value = serde_json::from_slice(&m.data).ok()?;
            let value = body.get("value")?.as_f64()?;
            Some((Duration::from_nanos(m.log_time - start), value))
        })
        .collect();
    values.sort_by_key(|(at, _)| *at);
    Ok(SensorTrack {
        values,
        span: Duration::from_nanos(end - start),
        channels,
    })
}

/// One camera channel's frames, for a camera's replay.
#[derive(Debug, Default)]
pub struct CameraTrack {
    /// (time since the file's first message, the JPEG), in time order (the
    /// same time 0 as [`sensor_track`]'s, so the two replay in step).
    pub frames: Vec<(Duration, Vec<u8>)>,
    /// From the file's first message to its last, any channel.
    pub span: Duration,
    /// The channels of the file that carry camera frames (for errors).
    pub channels: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum TrackError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("{path}: the frames of {channel} add up to more than {max} bytes")]
    TooLarge {
        path: String,
        channel: String,
        max: usize,
    },
}

/// The JPEG frames of `channel` in `path`: messages as rozd records them
/// (`foxglove.CompressedImage` JSON, base64 `data`, `format: "jpeg"`);
/// others are skipped. At most `max_bytes` of frames are held.
pub fn camera_track(
    path: &Path,
    channel: &str,
    max_bytes: usize,
) -> Result<CameraTrack, TrackError> {
    use base64::Engine as _;
    let bytes = read_file(path)?;
    let scan = scan(path, &bytes)?;
    drop(bytes);
    let start = scan.messages.iter().map(|m| m.log_time).min().unwrap_or(0);
    let end = scan.messages.iter().map(|m| m.log_time).max().unwrap_or(0);
    let mut channels: Vec<String> = scan
        .messages
        .iter()
        .map(|m| m.channel.topic.clone())
        .filter(|t| t.starts_with("/cameras/"))
        .collect();
    channels.sort();
    channels.dedup();
    let mut frames: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut held = 0usize;
    for m in scan.messages.iter().filter(|m| m.channel.topic == channel) {
        let Ok(body) = serde_json::from_slice::<serde_json::Value>(&m.data) else {
            continue;
        };
        if body.get("format").and_then(|f| f.as_str()) != Some("jpeg") {
            continue;
        }
        let Some(Ok(jpeg)) = body
            .get("data")
            .and_then(|d| d.as_str())
            .map(|d| base64::engine::general_purpose::STANDARD.decode(d))
        else {
            continue;
        };
        held = held.saturating_add(jpeg.len());
        if held > max_bytes {
            return Err(TrackError::TooLarge {
                path: path.display().to_string(),
                channel: channel.to_string(),
                max: max_bytes,
            });
        }
        frames.push((m.log_time, jpeg));
    }
    frames.sort_by_key(|(at, _)| *at);
    Ok(CameraTrack {
        span: Duration::from_nanos(end.saturating_sub(start)),
        frames: frames
            .into_iter()
            .map(|(at, jpeg)| (Duration::from_nanos(at.saturating_sub(start)), jpeg))
            .collect(),
        channels,
    })
}

/// A file's summary: its channels with message counts and time range.
#[derive(Debug, Clone, Serialize)]
pub struct FileInfo {
    pub finished: bool,
    pub messages: u64,
    pub start_unix_ns: Option<u64>,
    pub end_unix_ns: Option<u64>,
    pub channels: BTreeMap<String, ChannelInfo>,
    /// For a file cut short: why reading stopped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broken_off: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChannelInfo {
    pub messages: u64,
    pub schema: Option<String>,
    pub message_encoding: String,
}

/// Reads `path` and summarises it.
pub fn info(path: &Path) -> Result<FileInfo, ReadError> {
    let bytes = read_file(path)?;
    let scan = scan(path, &bytes)?;
    let mut channels: BTreeMap<String, ChannelInfo> = BTreeMap::new();
    for m in &scan.messages {
        channels
            .entry(m.channel.topic.clone())
            .or_insert_with(|| ChannelInfo {
                messages: 0,
                schema: m.channel.schema.as_ref().map(|s| s.name.clone()),
                message_encoding: m.channel.message_encoding.clone(),
            })
            .messages += 1;
    }
    Ok(FileInfo {
        finished: scan.finished,
        messages: scan.messages.len() as u64,
        start_unix_ns: scan.messages.iter().map(|m| m.log_time).min(),
        end_unix_ns: scan.messages.iter().map(|m| m.log_time).max(),
        channels,
        broken_off: scan.broken_off,
    })
}
