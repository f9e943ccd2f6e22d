//! Reading recordings back: every complete message of a file (finished or
//! cut short), a sensor channel's values for replay, and a file's summary
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

/// Reads a whole file.
pub fn read_file(path: &Path) -> Result<Vec<u8>, ReadError> {
    std::fs::read(path).map_err(|source| ReadError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// Whether `bytes` is a finished MCAP file (both magics present).
pub fn is_finished(bytes: &[u8]) -> bool {
    bytes.len() >= 2 * MAGIC.len() && bytes.starts_with(MAGIC) && bytes.ends_with(MAGIC)
}

/// The messages of the complete chunks of `bytes`: all of them for a
/// finished file, those before the break for one cut short.
pub fn scan(path: &Path, bytes: &[u8]) -> Result<Scan, ReadError> {
    if !bytes.starts_with(MAGIC) {
        return Err(ReadError::NotMcap {
            path: path.display().to_string(),
        });
    }
    let finished = is_finished(bytes);
    let stream = if finished {
        mcap::MessageStream::new(bytes)
    } else {
        // A file cut short has no closing magic: read what precedes the break.
        mcap::MessageStream::new_with_options(bytes, mcap::read::Options::IgnoreEndMagic.into())
    }
    .map_err(|_| ReadError::NotMcap {
        path: path.display().to_string(),
    })?;
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
    Ok(Scan {
        messages,
        finished,
        broken_off,
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
