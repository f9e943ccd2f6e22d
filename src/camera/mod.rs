//! Cameras (DESIGN.md, "Seeing and verifying"): each captures on its own
//! thread or task and keeps only its latest frame and its health. Frames
//! go to the observers the cameras were built with (the recording) and to
//! whoever asks for the latest one (`capture_image`, the snapshot and
//! stream endpoints); the control loop never sees a pixel.
//!
//! - [`config`]: `[[cameras]]` and its validation
//! - [`health`]: a camera's health as plain data (`now` passed in)
//! - [`jpeg`]: checking frames, fitting images to their bounds
//! - [`mjpeg`]: the multipart MJPEG parser and writer
//! - `http`: network cameras (stream or snapshot), reconnecting with backoff
//! - [`sim`]: the simulated world's first-person view
//! - `files`: JPEG files from a directory, looping
//! - [`replay`]: a recording's camera frames at their recorded times
//! - [`v4l2`]: USB and CSI cameras through V4L2, hot-pluggable

pub(crate) mod config;
mod files;
pub(crate) mod health;
mod http;
pub mod jpeg;
pub mod mjpeg;
pub(crate) mod replay;
pub(crate) mod sim;
pub mod v4l2;

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

use crate::hw::sim_world::SharedWorld;
use crate::observe::Observers;
use config::{CameraSpec, Source};
use health::{CameraState, FrameInfo, HealthView};
use jpeg::FrameError;

/// One captured frame: a whole JPEG and when it was captured.
#[derive(Debug, Clone)]
pub struct Frame {
    pub jpeg: Bytes,
    pub width: u32,
    pub height: u32,
    pub captured: Instant,
    pub at_unix_ms: i64,
    /// Frames this camera captured before this one.
    pub seq: u64,
}

impl Frame {
    pub fn age_ms(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.captured).as_millis()).unwrap_or(u64::MAX)
    }
}

/// Hears every frame a camera captures, on the capture thread: must not
/// block (the recording only queues it, bounded).
pub trait CameraObserver: Send + Sync + std::fmt::Debug {
    fn frame(&self, camera: &str, frame: &Frame);
}

/// One camera: its spec, health and latest frame.
#[derive(Debug)]
pub struct Camera {
    pub spec: CameraSpec,
    state: Mutex<CameraState>,
    latest: watch::Sender<Option<Frame>>,
    viewers: Arc<Semaphore>,
    observers: Observers<dyn CameraObserver>,
}

/// A camera as `/v1/cameras`, `/v1/status` and the Observation list it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CameraView {
    pub name: String,
    pub source: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(flatten)]
    pub health: HealthView,
    /// Viewers of `stream.mjpeg` now.
    pub viewers: u32,
}

impl Camera {
    fn new(spec: CameraSpec, observers: Observers<dyn CameraObserver>) -> Camera {
        Camera {
            state: Mutex::new(CameraState::new(spec.stale_after, Instant::now())),
            latest: watch::Sender::new(None),
            viewers: Arc::new(Semaphore::new(spec.max_viewers as usize)),
            observers,
            spec,
        }
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    fn state(&self) -> parking_lot::MutexGuard<'_, CameraState> {
        self.state.lock()
    }

    /// A checked frame (a whole JPEG of that size) captured at `at`.
    pub(crate) fn publish(&self, jpeg: Bytes, width: u32, height: u32, at: Instant) {
        let seq = {
            let mut state = self.state();
            state.frame(FrameInfo {
                width,
                height,
                bytes: jpeg.len(),
                at,
            });
            state.view(at).frames - 1
        };
        let frame = Frame {
            jpeg,
            width,
            height,
            captured: at,
            at_unix_ms: crate::clock::now_ms(),
            seq,
        };
        for observer in self.observers.iter() {
            observer.frame(&self.spec.name, &frame);
        }
        self.latest.send_replace(Some(frame));
    }

    /// Checks bytes a source sent and publishes them, or counts why not.
    pub(crate) fn offer(&self, jpeg: Bytes, at: Instant) {
        match jpeg::check(&jpeg, self.spec.max_frame_bytes) {
            Ok((w, h)) => self.publish(jpeg, w, h, at),
            Err(e) => self.reject(e, at),
        }
    }

    /// A frame refused (counted, and the health says so).
    pub(crate) fn reject(&self, error: FrameError, at: Instant) {
        tracing::debug!(camera = %self.spec.name, error = %error.message, "camera frame refused");
        self.state().rejected(error.why, error.message, at);
    }

    pub(crate) fn link_up(&self, at: Instant) {
        self.state().link_up(at);
    }

    /// The source went away; `why` for the status.
    pub(crate) fn link_down(&self, why: String) {
        let mut state = self.state();
        let was = state.health(Instant::now());
        state.link_down(why.clone());
        drop(state);
        if was != health::Health::Disconnected {
            tracing::warn!(camera = %self.spec.name, error = %why, "camera disconnected; reconnecting");
        }
    }

    /// The latest frame, if any.
    pub fn latest(&self) -> Option<Frame> {
        self.latest.borrow().clone()
    }

    /// Changes with every frame.
    pub fn subscribe(&self) -> watch::Receiver<Option<Frame>> {
        self.latest.subscribe()
    }

    /// A place among the stream's viewers, if one is free.
    pub fn viewer(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.viewers.clone().try_acquire_owned().ok()
    }

    pub fn view(&self, now: Instant) -> CameraView {
        let health = self.state().view(now);
        CameraView {
            name: self.spec.name.clone(),
            source: self.spec.source.kind().as_str(),
            description: self.spec.description.clone(),
            health,
            viewers: self
                .spec
                .max_viewers
                .saturating_sub(self.viewers.available_permits() as u32),
        }
    }
}

/// Every camera of the host.
#[derive(Debug, Default)]
pub struct Cameras {
    cameras: Vec<Arc<Camera>>,
}

impl Cameras {
    /// No cameras.
    pub fn none() -> Cameras {
        Cameras::default()
    }

    /// Starts each camera's capture (threads for rendering and files, a
    /// task for network and V4L2 cameras) until `shutdown`; `world`: the simulated
    /// world a `sim` camera renders (validation made sure there is one).
    pub fn start(
        specs: &[CameraSpec],
        world: Option<SharedWorld>,
        observers: Observers<dyn CameraObserver>,
        shutdown: &CancellationToken,
    ) -> Result<Cameras, CameraError> {
        let mut cameras = Vec::with_capacity(specs.len());
        for spec in specs {
            let camera = Arc::new(Camera::new(spec.clone(), observers.clone()));
            let stop = shutdown.clone();
            match &spec.source {
                Source::Http { .. } => {
                    tokio::spawn(http::run(camera.clone(), stop));
                }
                // A task; the device's blocking calls on tokio's blocking
                // threads, where a panic is caught as the device's failure.
                Source::V4l2(_) => {
                    tokio::spawn(v4l2::run(camera.clone(), stop));
                }
                Source::Sim { .. } => {
                    let Some(world) = world.clone() else {
                        return Err(CameraError::NoWorld(spec.name.clone()));
                    };
                    let cam = camera.clone();
                    thread(&spec.name, move || sim::run(cam, world, stop))?;
                }
                Source::Files { .. } => {
                    let cam = camera.clone();
                    thread(&spec.name, move || files::run(cam, stop))?;
                }
                Source::Replay { .. } => {
                    let cam = camera.clone();
                    thread(&spec.name, move || replay::run(cam, stop))?;
                }
            }
            cameras.push(camera);
        }
        Ok(Cameras { cameras })
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Camera>> {
        self.cameras.iter().find(|c| c.spec.name == name)
    }

    pub fn names(&self) -> Vec<String> {
        self.cameras.iter().map(|c| c.spec.name.clone()).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.cameras.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Camera>> {
        self.cameras.iter()
    }

    /// Every camera's view now.
    pub fn views(&self) -> Vec<CameraView> {
        let now = Instant::now();
        self.cameras.iter().map(|c| c.view(now)).collect()
    }

    /// `name`, or an error naming the cameras there are.
    pub fn find(&self, name: &str) -> Result<&Arc<Camera>, String> {
        self.get(name).ok_or_else(|| {
            let names = self.names();
            if names.is_empty() {
                format!("no camera named {name:?}: this host has no cameras")
            } else {
                format!(
                    "no camera named {name:?}; the cameras are: {}",
                    names.join(", ")
                )
            }
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CameraError {
    #[error("camera {0}: source \"sim\" needs the simulated world")]
    NoWorld(String),
    #[error("camera {name}: cannot start its thread: {source}")]
    Thread {
        name: String,
        #[source]
        source: std::io::Error,
    },
}

/// Starts a camera's own thread; a panic in it is logged, not spread.
fn thread(name: &str, run: impl FnOnce() + Send + 'static) -> Result<(), CameraError> {
    let camera = name.to_string();
    std::thread::Builder::new()
        .name(format!("rozd-cam-{}", name.chars().take(7).collect::<String>()))
        .spawn(move || {
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).is_err() {
                tracing::error!(%camera, "the camera's thread failed (a bug in rozd); it captures no more until rozd restarts");
            }
        })
        .map(|_| ())
        .map_err(|source| CameraError::Thread {
            name: name.to_string(),
            source,
        })
}
