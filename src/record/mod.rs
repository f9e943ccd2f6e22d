//! Recordings: what the robot saw and did, in MCAP files Foxglove opens
//! (JSON messages, JSON-Schema schemas), and their replay.
//!
//! The [`Recorder`] is an observer of every core ([`crate::observe`]): the
//! world's sensor values, the actuators' changes, the protective stop, the
//! store's writes (audit, sessions, tasks); besides, a turn's start and a
//! sampler of the Observation call it. Each call only `try_send`s onto a bounded queue: a full
//! queue drops the event and counts it, so recording never blocks the
//! control loop or a session. The writer runs on its own thread.
//!
//! - [`config`]: `[record]` and `[replay]`
//! - [`schema`]: channels, their JSON Schemas, events as messages
//! - `writer`: the thread: chunks, flushes, rotation, retention, finishing
//! - [`files`]: names, listing, safe resolution, retention, crash recovery
//! - [`read`]: reading files back (info, replay tracks); a leaf

pub(crate) mod config;
pub mod files;
pub mod read;
pub(crate) mod schema;
mod writer;

use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{SyncSender, TrySendError};
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::ooda::act::{ActuatorEvent, ActuatorObserver, VerdictEvent};
use crate::ooda::world::SensorObserver;
use crate::safety::{StopEvent, StopInfo, StopObserver};
use crate::store::{AuditRecord, SessionRecord, StoreObserver, TurnRecord};
use config::RecordConfig;
use schema::Event;
use writer::{Item, Shared};

/// How long shutdown waits for the writer to finish its file.
const FINISH_BOUND: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("record.directory: {0}")]
    Directory(#[source] files::FilesError),
    #[error("cannot start the recording thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// The streams, in the order of [`config::STREAMS`].
#[derive(Debug, Clone, Copy)]
enum Stream {
    Observation = 0,
    Sensors = 1,
    Actuators = 2,
    ProtectiveStop = 3,
    Audit = 4,
    Sessions = 5,
    Tasks = 6,
    Cameras = 7,
}

/// Nanoseconds since the Unix epoch, now.
fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The recording's handle, an observer of every core; disabled without `[record]`.
#[derive(Debug)]
pub struct Recorder {
    active: Option<Active>,
}

#[derive(Debug)]
struct Active {
    queue: SyncSender<Item>,
    streams: [bool; 8],
    camera_every: Duration,
    /// When each camera's frame was last recorded (`record.camera_hz`).
    camera_throttles: Mutex<std::collections::HashMap<String, crate::camera::health::Throttle>>,
    shared: Arc<Shared>,
    directory: PathBuf,
    observation_every: Duration,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Recorder {
    /// Records nothing.
    pub fn disabled() -> Recorder {
        Recorder { active: None }
    }

    /// Recovers what a crash left unfinished in the directory, then starts
    /// the writer's thread (it opens the first file at once).
    pub fn start(
        config: &RecordConfig,
        store_path: &Path,
        host_id: &str,
    ) -> Result<Recorder, RecordError> {
        if !config.enabled {
            return Ok(Recorder::disabled());
        }
        let directory = config.resolved_directory(store_path);
        files::private_dir(&directory).map_err(RecordError::Directory)?;
        let library = format!("rozd {}", crate::VERSION);
        for outcome in files::recover_all(&directory, &library) {
            match outcome {
                Ok(r) => tracing::warn!(
                    file = %r.name,
                    messages = r.messages,
                    broken_off = r.broken_off.as_deref().unwrap_or(""),
                    "recovered a recording left unfinished by a crash (rewritten, finished, same name)"
                ),
                Err(e @ files::FilesError::MovedAside { .. }) => {
                    tracing::error!(error = %e, "a recording that cannot be read at all was moved aside; rozd goes on")
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot recover an unfinished recording; left as it is")
                }
            }
        }
        let (queue, receiver) = std::sync::mpsc::sync_channel(config.queue);
        let shared = Arc::new(Shared::default());
        let settings = writer::Settings {
            directory: directory.clone(),
            host_id: host_id.to_string(),
            max_file_bytes: config.max_file_kb * 1024,
            max_file_age: config.max_file_age,
            max_total_bytes: config.max_total_mb * 1024 * 1024,
            max_files: config.max_files,
            flush_every: config.flush_every,
        };
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("rozd-record".into())
            .spawn(move || {
                let shared = thread_shared.clone();
                let run = std::panic::AssertUnwindSafe(|| {
                    writer::run(settings, receiver, thread_shared);
                });
                // A bug in the writer must not go unnoticed: what comes
                // after counts as lost, and the status says why.
                if std::panic::catch_unwind(run).is_err() {
                    tracing::error!("the recording's writer failed; nothing more is recorded until rozd restarts (which recovers the file)");
                    *shared
                        .last_error
                        .lock() =
                        Some("the writer failed (a bug in rozd); see the log".into());
                }
            })
            .map_err(RecordError::Thread)?;
        let mut streams = [false; 8];
        for (i, name) in config::STREAMS.iter().enumerate() {
            streams[i] = config.records(name);
        }
        Ok(Recorder {
            active: Some(Active {
                queue,
                streams,
                shared,
                directory,
                observation_every: Duration::from_secs_f64(1.0 / config.observation_hz),
                camera_every: Duration::from_secs_f64(1.0 / config.camera_hz),
                camera_throttles: Mutex::default(),
                thread: Mutex::new(Some(thread)),
            }),
        })
    }

    pub fn enabled(&self) -> bool {
        self.active.is_some()
    }

    /// The recordings directory, when recording.
    pub fn directory(&self) -> Option<&Path> {
        self.active.as_ref().map(|a| a.directory.as_path())
    }

    /// The file being written now.
    pub fn current_file(&self) -> Option<String> {
        self.active.as_ref().and_then(|a| a.shared.current())
    }

    /// Hands an event to the writer without waiting: a full queue drops it
    /// (counted).
    fn push(&self, stream: Stream, event: impl FnOnce() -> Event) {
        let Some(active) = &self.active else { return };
        if !active.streams[stream as usize] {
            return;
        }
        match active.queue.try_send(Item::Record(now_ns(), event())) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                active.shared.dropped.fetch_add(1, Ordering::Relaxed);
            }
            // The writer has ended (shutdown, or a bug ended its thread):
            // counted as lost, so a dead writer shows in the status.
            Err(TrySendError::Disconnected(_)) => {
                active.shared.lost.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A session event (`event`: `turn_started`, ...), built only when recorded.
    pub fn session(&self, body: impl FnOnce() -> Value) {
        self.push(Stream::Sessions, || Event::Session(body()));
    }

    /// Samples the Observation at `record.observation_hz` until `shutdown`.
    pub fn sample_observations(
        self: &Arc<Self>,
        ooda: Arc<crate::ooda::Ooda>,
        shutdown: CancellationToken,
    ) {
        let Some(active) = &self.active else { return };
        if !active.streams[Stream::Observation as usize] {
            return;
        }
        let every = active.observation_every;
        let me = self.clone();
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(every);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tokio::select! {
                    _ = ticker.tick() => {}
                    () = shutdown.cancelled() => return,
                }
                let observation = ooda.observation();
                me.push(Stream::Observation, || Event::Observation(observation));
            }
        });
    }

    /// Finishes the current file (summary, index) and ends the writer; the
    /// last step of shutdown, after the actuators went safe. Bounded.
    pub async fn finish(&self) {
        let Some(active) = &self.active else { return };
        let queue = active.queue.clone();
        let thread = active.thread.lock().take();
        let Some(thread) = thread else { return };
        let done = tokio::task::spawn_blocking(move || {
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            // Blocks only while the queue is full; the writer is draining it.
            if queue.send(Item::Finish(tx)).is_ok() {
                let _ = rx.recv();
            }
            let _ = thread.join();
        });
        if tokio::time::timeout(FINISH_BOUND, done).await.is_err() {
            tracing::error!(
                "the recording was not finished within {FINISH_BOUND:?}; the next start recovers it"
            );
        }
    }

    /// For `/v1/status`: `null` when not recording.
    pub fn status(&self) -> Value {
        let Some(active) = &self.active else {
            return Value::Null;
        };
        let s = &active.shared;
        json!({
            "directory": active.directory.display().to_string(),
            "current_file": s.current(),
            "written": s.written.load(Ordering::Relaxed),
            "dropped": s.dropped.load(Ordering::Relaxed),
            "lost": s.lost.load(Ordering::Relaxed),
            "write_errors": s.write_errors.load(Ordering::Relaxed),
            "files_finished": s.files_finished.load(Ordering::Relaxed),
            "files_deleted": s.files_deleted.load(Ordering::Relaxed),
            "last_error": s.last_error(),
        })
    }

    /// Changes to the number of files finished so far, on every finished file.
    pub fn finished_files(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.active.as_ref().map(|a| a.shared.finished.subscribe())
    }

    /// (written, dropped, lost) for `/metrics`.
    pub fn counts(&self) -> Option<(u64, u64, u64)> {
        self.active.as_ref().map(|a| {
            (
                a.shared.written.load(Ordering::Relaxed),
                a.shared.dropped.load(Ordering::Relaxed),
                a.shared.lost.load(Ordering::Relaxed),
            )
        })
    }
}

impl ActuatorObserver for Recorder {
    fn actuator_changed(&self, event: &ActuatorEvent) {
        self.push(Stream::Actuators, || {
            Event::Actuator(Box::new(event.clone()))
        });
    }

    fn feedback_verdict(&self, event: &VerdictEvent) {
        self.push(Stream::Actuators, || {
            Event::Verdict(Box::new(event.clone()))
        });
    }
}

/// A camera's frames on `/cameras/<name>`, at most `record.camera_hz`
/// each (the frame's bytes are shared, not copied, until the writer
/// encodes them).
impl crate::camera::CameraObserver for Recorder {
    fn frame(&self, camera: &str, frame: &crate::camera::Frame) {
        let Some(active) = &self.active else { return };
        if !active.streams[Stream::Cameras as usize] {
            return;
        }
        let due = active
            .camera_throttles
            .lock()
            .entry(camera.to_string())
            .or_default()
            .take(active.camera_every, frame.captured);
        if due {
            self.push(Stream::Cameras, || Event::Image {
                camera: Arc::from(camera),
                jpeg: frame.jpeg.clone(),
                at_unix_ms: frame.at_unix_ms,
            });
        }
    }
}

impl StopObserver for Recorder {
    fn stop_changed(&self, event: &StopEvent, causes: &[StopInfo]) {
        self.push(Stream::ProtectiveStop, || Event::Stop {
            event: Box::new(event.clone()),
            causes: causes.to_vec(),
        });
    }
}

impl SensorObserver for Recorder {
    fn sensor_value(&self, sensor: &str, value: f64) {
        self.push(Stream::Sensors, || Event::Sensor {
            name: Arc::from(sensor),
            value,
        });
    }
}

impl StoreObserver for Recorder {
    fn audit(&self, record: &AuditRecord) {
        self.push(Stream::Audit, || Event::Audit(Box::new(record.clone())));
    }
    fn session_started(&self, s: &SessionRecord) {
        self.session(|| schema::session_started(s));
    }
    fn session_ended(&self, id: &str, reason: &str) {
        self.session(|| schema::session_ended(id, reason));
    }
    fn turn_completed(&self, t: &TurnRecord) {
        self.session(|| schema::turn_ended(t));
    }
    fn task(&self, body: Value) {
        self.push(Stream::Tasks, || Event::Task(body));
    }
}

#[cfg(test)]
mod tests;
