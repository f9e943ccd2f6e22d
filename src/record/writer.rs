//! The writer's thread: takes events off the bounded queue, writes them
//! into the current file chunk by chunk, closes and flushes the open chunk
//! every `flush_ms` (so a crash loses at most that), rotates by size and
//! age, applies the retention cap, and finishes the file (summary, index)
//! on rotation and when told to stop.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::time::{Duration, Instant, SystemTime};

use super::files;
use super::schema::{self, Event, Kind};

/// What goes through the queue.
#[derive(Debug)]
pub(super) enum Item {
    /// An event and when it happened (ns since the Unix epoch).
    Record(u64, Event),
    /// Finish the current file, then answer and end the thread.
    Finish(SyncSender<()>),
}

/// After a write error, how long before a new file is tried.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// Counters and state the writer shares with `/v1/status` and `/metrics`.
#[derive(Debug, Default)]
pub(super) struct Shared {
    /// Messages written to a file.
    pub written: AtomicU64,
    /// Events dropped because the queue was full.
    pub dropped: AtomicU64,
    /// Events lost to a write error (the file could not take them).
    pub lost: AtomicU64,
    pub write_errors: AtomicU64,
    pub files_finished: AtomicU64,
    pub files_deleted: AtomicU64,
    pub current: Mutex<Option<String>>,
    pub last_error: Mutex<Option<String>>,
    /// Files finished so far, for whoever waits for the next one.
    pub finished: tokio::sync::watch::Sender<u64>,
}

impl Shared {
    pub(super) fn current(&self) -> Option<String> {
        self.current.lock().clone()
    }
    pub(super) fn last_error(&self) -> Option<String> {
        self.last_error.lock().clone()
    }
    fn set_current(&self, name: Option<String>) {
        *self.current.lock() = name;
    }
    fn failed(&self, why: String) {
        self.write_errors.fetch_add(1, Ordering::Relaxed);
        tracing::error!(error = %why, "recording: write failed");
        *self.last_error.lock() = Some(why);
    }
}

/// The writer's settings.
#[derive(Debug, Clone)]
pub(super) struct Settings {
    pub directory: PathBuf,
    pub host_id: String,
    pub max_file_bytes: u64,
    pub max_file_age: Duration,
    pub max_total_bytes: u64,
    pub max_files: u32,
    pub flush_every: Duration,
}

/// A file position that the thread can read while mcap's writer owns the file.
#[derive(Debug)]
struct Tracked {
    inner: BufWriter<File>,
    /// Kept here: asking the `BufWriter` would flush it.
    position: u64,
    end: Arc<AtomicU64>,
}

impl Write for Tracked {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.position += n as u64;
        self.end.fetch_max(self.position, Ordering::Relaxed);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl Seek for Tracked {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        self.position = self.inner.seek(pos)?;
        Ok(self.position)
    }
    fn stream_position(&mut self) -> std::io::Result<u64> {
        Ok(self.position)
    }
}

/// The file being written.
struct Open {
    writer: mcap::Writer<Tracked>,
    name: String,
    opened: Instant,
    end: Arc<AtomicU64>,
    schemas: HashMap<Kind, u16>,
    channels: HashMap<String, u16>,
    sequence: u32,
}

impl Open {
    fn create(settings: &Settings) -> Result<Open, String> {
        files::private_dir(&settings.directory).map_err(|e| e.to_string())?;
        let mut name = files::file_name(&settings.host_id, SystemTime::now());
        let mut n = 1;
        while settings.directory.join(&name).exists() {
            // Two files in one millisecond (tiny files, a test): suffix.
            name = files::file_name(&settings.host_id, SystemTime::now())
                .replace(".mcap", &format!("-{n}.mcap"));
            n += 1;
        }
        let path = settings.directory.join(&name);
        let file = files::create_private(&path).map_err(|e| e.to_string())?;
        let end = Arc::new(AtomicU64::new(0));
        let tracked = Tracked {
            inner: BufWriter::new(file),
            position: 0,
            end: end.clone(),
        };
        let mut writer = mcap::WriteOptions::new()
            .compression(None)
            .profile("")
            .library(format!("rozd {}", crate::VERSION))
            .create(tracked)
            .map_err(|e| format!("{name}: {e}"))?;
        let mut metadata = BTreeMap::new();
        metadata.insert("host_id".to_string(), settings.host_id.clone());
        metadata.insert("version".to_string(), crate::VERSION.to_string());
        writer
            .write_metadata(&mcap::records::Metadata {
                name: "rozd".into(),
                metadata,
            })
            .map_err(|e| format!("{name}: {e}"))?;
        // The header and metadata reach the file at once: a crash before
        // the first chunk still leaves a file that reads as empty.
        writer.flush().map_err(|e| format!("{name}: {e}"))?;
        tracing::info!(file = %path.display(), "recording to a new file");
        Ok(Open {
            writer,
            name,
            opened: Instant::now(),
            end,
            schemas: HashMap::new(),
            channels: HashMap::new(),
            sequence: 0,
        })
    }

    fn write(&mut self, at_ns: u64, event: &Event) -> Result<(), String> {
        let message = schema::message(event, at_ns);
        let channel = match self.channels.get(&message.topic) {
            Some(&id) => id,
            None => {
                let schema = match self.schemas.get(&message.kind) {
                    Some(&id) => id,
                    None => {
                        let data = message.kind.schema().to_string();
                        let id = self
                            .writer
                            .add_schema(message.kind.schema_name(), "jsonschema", data.as_bytes())
                            .map_err(|e| format!("{}: {e}", self.name))?;
                        self.schemas.insert(message.kind, id);
                        id
                    }
                };
                let id = self
                    .writer
                    .add_channel(schema, &message.topic, "json", &BTreeMap::new())
                    .map_err(|e| format!("{}: {e}", self.name))?;
                self.channels.insert(message.topic.clone(), id);
                id
            }
        };
        self.sequence = self.sequence.wrapping_add(1);
        self.writer
            .write_to_known_channel(
                &mcap::records::MessageHeader {
                    channel_id: channel,
                    sequence: self.sequence,
                    log_time: at_ns,
                    publish_time: at_ns,
                },
                &message.body,
            )
            .map_err(|e| format!("{}: {e}", self.name))
    }

    fn bytes(&self) -> u64 {
        self.end.load(Ordering::Relaxed)
    }

    /// Summary, index, closing magic, then the file synced to disk.
    fn finish(mut self) -> Result<String, String> {
        self.writer
            .finish()
            .map_err(|e| format!("{}: {e}", self.name))?;
        let tracked = self.writer.into_inner();
        let file = tracked
            .inner
            .into_inner()
            .map_err(|e| format!("{}: {}", self.name, e.error()))?;
        file.sync_all().map_err(|e| format!("{}: {e}", self.name))?;
        Ok(self.name)
    }
}

/// Runs until told to finish (or every sender is gone).
pub(super) fn run(settings: Settings, queue: Receiver<Item>, shared: Arc<Shared>) {
    let mut open: Option<Open> = None;
    let mut retry_at: Option<Instant> = None;
    let mut next_flush = Instant::now() + settings.flush_every;
    let start = |open: &mut Option<Open>, retry_at: &mut Option<Instant>| {
        if open.is_some() || retry_at.is_some_and(|t| Instant::now() < t) {
            return;
        }
        match Open::create(&settings) {
            Ok(file) => {
                shared.set_current(Some(file.name.clone()));
                *open = Some(file);
                *retry_at = None;
            }
            Err(why) => {
                shared.failed(why);
                *retry_at = Some(Instant::now() + RETRY_AFTER);
            }
        }
    };
    start(&mut open, &mut retry_at);
    retain(&settings, &shared, open.as_ref().map(|o| o.name.as_str()));
    loop {
        let timeout = next_flush.saturating_duration_since(Instant::now());
        match queue.recv_timeout(timeout) {
            Ok(Item::Record(at_ns, event)) => {
                start(&mut open, &mut retry_at);
                match open.as_mut() {
                    Some(file) => match file.write(at_ns, &event) {
                        Ok(()) => {
                            shared.written.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(why) => {
                            shared.lost.fetch_add(1, Ordering::Relaxed);
                            shared.failed(why);
                            abandon(&mut open, &shared);
                            retry_at = Some(Instant::now() + RETRY_AFTER);
                        }
                    },
                    None => {
                        shared.lost.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            Ok(Item::Finish(done)) => {
                finish(&mut open, &settings, &shared);
                let _ = done.send(());
                return;
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                finish(&mut open, &settings, &shared);
                return;
            }
        }
        let now = Instant::now();
        if now >= next_flush {
            next_flush = now + settings.flush_every;
            if let Some(file) = open.as_mut()
                && let Err(e) = file.writer.flush()
            {
                shared.failed(format!("{}: {e}", file.name));
                abandon(&mut open, &shared);
                retry_at = Some(now + RETRY_AFTER);
            }
        }
        let rotate = open.as_ref().is_some_and(|file| {
            file.bytes() >= settings.max_file_bytes
                || now.duration_since(file.opened) >= settings.max_file_age
        });
        if rotate {
            // The next file opens with the next event: no empty files.
            finish(&mut open, &settings, &shared);
            retain(&settings, &shared, None);
        }
    }
}

/// Finishes the open file, if any.
fn finish(open: &mut Option<Open>, settings: &Settings, shared: &Shared) {
    if let Some(file) = open.take() {
        shared.set_current(None);
        match file.finish() {
            Ok(name) => {
                let n = shared.files_finished.fetch_add(1, Ordering::Relaxed) + 1;
                shared.finished.send_replace(n);
                tracing::info!(file = %settings.directory.join(&name).display(), "recording finished");
            }
            Err(why) => shared.failed(why),
        }
    }
}

/// Drops a file that failed: what it has flushed stays readable, and the
/// next start of rozd recovers it.
fn abandon(open: &mut Option<Open>, shared: &Shared) {
    if let Some(file) = open.take() {
        shared.set_current(None);
        // mcap's writer finishes on drop; a failure there is already counted.
        drop(file);
    }
}

/// Applies the retention cap, logging what it deleted.
fn retain(settings: &Settings, shared: &Shared, active: Option<&str>) {
    match files::apply_retention(
        &settings.directory,
        active,
        settings.max_total_bytes,
        settings.max_files,
    ) {
        Ok(deleted) => {
            for name in deleted {
                shared.files_deleted.fetch_add(1, Ordering::Relaxed);
                tracing::info!(file = %name, "recording deleted by the retention cap");
            }
        }
        Err(e) => shared.failed(format!("retention: {e}")),
    }
}
