//! V4L2 cameras (USB webcams, CSI bridges with a V4L2 driver): one task
//! per camera, a thin loop around its [`link::Link`] (open, read, reopen,
//! back off) that does the device's blocking work on tokio's blocking
//! threads.
//!
//! - [`frames`]: a device's frame to a JPEG (MJPEG passed through, YUYV
//!   encoded), pure
//! - `link`: when to open, read and reopen, pure (time passed in)
//! - `device`: the device itself, the only code that touches `v4l`
//!
//! Hot-plug: a device that is missing at start, unplugged, or fails is
//! `disconnected` (saying why) and opened again with backoff; one that
//! stops delivering frames is closed and opened again. A panic in the
//! device layer (the `v4l` crate panics on some driver answers) is caught
//! as that device's failure: the camera reconnects, rozd goes on.

mod device;
pub mod frames;
mod link;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::Camera;
use super::config::{Source, V4l2Spec};
use device::{DeviceError, V4l2Opener};
use frames::{Layout, RawFrame};
use link::{Link, Step};

/// Opens a camera's device: [`V4l2Opener`], or a fake in tests.
pub trait Opener: Send + Sync + 'static {
    type Source: FrameSource + Send + 'static;

    /// Opens the device and starts it streaming in the format asked for.
    /// Blocking.
    fn open(&self, want: &V4l2Spec) -> Result<Self::Source, DeviceError>;
}

/// An open device, delivering frames. Closed when dropped.
pub trait FrameSource {
    /// The format and size the device agreed to.
    fn layout(&self) -> Layout;

    /// The next frame, or `None` when none came `within` (blocking at most
    /// about that long).
    fn next_frame(&mut self, within: Duration) -> Result<Option<RawFrame>, DeviceError>;
}

/// Runs the camera until `shutdown`.
pub(super) async fn run(camera: Arc<Camera>, shutdown: CancellationToken) {
    run_with(camera, V4l2Opener, shutdown).await;
}

/// What one read came back with: the device (handed back), what it
/// delivered (nothing within the wait, a frame or why it is unusable, or
/// the device's failure), and when.
struct Delivery<S> {
    source: S,
    got: Result<Option<Result<frames::Encoded, super::jpeg::FrameError>>, DeviceError>,
    at: Instant,
}

async fn run_with<O: Opener>(camera: Arc<Camera>, opener: O, shutdown: CancellationToken) {
    let Source::V4l2(want) = camera.spec.source.clone() else {
        return;
    };
    let opener = Arc::new(opener);
    let (quality, max_bytes) = (camera.spec.jpeg_quality, camera.spec.max_frame_bytes);
    let mut link = Link::new(Link::silent_after(camera.spec.stale_after), now());
    let mut open: Option<O::Source> = None;
    loop {
        match link.step(now()) {
            Step::Wait(wait) => {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(wait) => {}
                }
            }
            Step::Open => {
                let (opener, wanted) = (opener.clone(), want.clone());
                let Some(opened) = blocking(&shutdown, move || opener.open(&wanted)).await else {
                    return;
                };
                match opened.and_then(|o| o.map_err(|e| e.to_string())) {
                    Ok(source) => {
                        let layout = source.layout();
                        tracing::info!(
                            camera = %camera.spec.name,
                            device = %want.device.display(),
                            format = layout.format.as_str(),
                            width = layout.width,
                            height = layout.height,
                            "camera opened"
                        );
                        let at = now();
                        camera.link_up(at);
                        link.opened(at);
                        open = Some(source);
                    }
                    Err(why) => {
                        camera.link_down(why);
                        link.failed(now());
                    }
                }
            }
            Step::Reopen(why) => {
                close(&camera, open.take(), &shutdown).await;
                camera.link_down(why);
                link.failed(now());
            }
            Step::Read(within) => {
                let Some(mut source) = open.take() else {
                    // The link says open only after a device was stored.
                    link.failed(now());
                    continue;
                };
                let started = tokio::time::Instant::now();
                let read = blocking(&shutdown, move || {
                    let layout = source.layout();
                    let raw = source.next_frame(within);
                    // Captured when the device handed it over (a YUYV
                    // frame's encode is not its age).
                    let at = now();
                    let got = raw.map(|raw| {
                        raw.map(|raw| frames::to_jpeg(raw, &layout, quality, max_bytes))
                    });
                    Delivery { source, got, at }
                })
                .await;
                let Some(read) = read else {
                    return;
                };
                match read {
                    // The source was dropped with the panic.
                    Err(why) => {
                        camera.link_down(why);
                        link.failed(now());
                    }
                    Ok(Delivery {
                        source,
                        got: Err(error),
                        at,
                    }) => {
                        close(&camera, Some(source), &shutdown).await;
                        camera.link_down(error.to_string());
                        link.failed(at);
                    }
                    Ok(Delivery {
                        source,
                        got: Ok(None),
                        ..
                    }) => {
                        open = Some(source);
                        // `None` means nothing came within the wait: a
                        // device that says so sooner does not spin the loop.
                        tokio::select! {
                            () = shutdown.cancelled() => return,
                            () = tokio::time::sleep_until(started + within) => {}
                        }
                    }
                    Ok(Delivery {
                        source,
                        got: Ok(Some(frame)),
                        at,
                    }) => {
                        open = Some(source);
                        link.heard(at);
                        match frame {
                            Ok(f) => camera.publish(f.jpeg, f.width, f.height, at),
                            Err(bad) => camera.reject(bad, at),
                        }
                    }
                }
            }
        }
    }
}

/// Now, on tokio's clock (paused in tests).
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Closes a device (stops its stream, unmaps its buffers) off the async
/// threads; a panic while closing is logged.
async fn close<S: Send + 'static>(
    camera: &Camera,
    source: Option<S>,
    shutdown: &CancellationToken,
) {
    let Some(source) = source else {
        return;
    };
    if let Some(Err(why)) = blocking(shutdown, move || drop(source)).await {
        tracing::warn!(camera = %camera.spec.name, error = %why, "closing the camera's device failed");
    }
}

/// Runs blocking device work on tokio's blocking threads. `None` once
/// `shutdown` (the work finishes on its own and drops what it holds);
/// `Err` saying so when it panicked.
async fn blocking<T: Send + 'static>(
    shutdown: &CancellationToken,
    work: impl FnOnce() -> T + Send + 'static,
) -> Option<Result<T, String>> {
    let task = tokio::task::spawn_blocking(work);
    tokio::select! {
        () = shutdown.cancelled() => None,
        joined = task => Some(joined.map_err(|e| {
            let what = if e.is_panic() {
                let panic = e.into_panic();
                panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into())
            } else {
                e.to_string()
            };
            format!(
                "the camera's device layer failed (a bug in rozd or the v4l crate: {what}); \
                 opening the device again"
            )
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::camera::config::{CameraSpec, PixelFormat};
    use crate::camera::health::{Health, HealthView};
    use crate::camera::jpeg::{decode_rgb, encode_rgb};
    use parking_lot::Mutex;
    use std::collections::VecDeque;
    use std::path::PathBuf;
    use tokio::sync::mpsc;

    /// What a fake device does at one read.
    enum Read {
        Frame(Vec<u8>),
        /// Unplugged: the driver answers ENODEV.
        Lost,
        /// A bug in the device layer.
        Panic,
    }

    /// What one attempt to open the fake device does.
    enum Attempt {
        Missing,
        /// Opens, delivers these reads, then is silent.
        Device(Layout, Vec<Read>),
    }

    /// A scripted device. Each attempt to open it records the camera's
    /// view at that moment (the task waits for the open, so that is what
    /// the previous attempt left); once the script is used up it says so
    /// on `done` and is missing from then on.
    struct Fake {
        camera: Mutex<Option<Arc<Camera>>>,
        attempts: Mutex<VecDeque<Attempt>>,
        views: Arc<Mutex<Vec<HealthView>>>,
        events: Arc<Mutex<Vec<&'static str>>>,
        done: mpsc::UnboundedSender<()>,
    }

    struct FakeSource {
        layout: Layout,
        reads: VecDeque<Read>,
        events: Arc<Mutex<Vec<&'static str>>>,
    }

    impl Drop for FakeSource {
        fn drop(&mut self) {
            self.events.lock().push("closed");
        }
    }

    impl Opener for Fake {
        type Source = FakeSource;

        fn open(&self, want: &V4l2Spec) -> Result<FakeSource, DeviceError> {
            if let Some(camera) = self.camera.lock().as_ref() {
                self.views.lock().push(camera.view(now()).health);
            }
            let Some(attempt) = self.attempts.lock().pop_front() else {
                let _ = self.done.send(());
                return Err(DeviceError::Missing(want.device.clone()));
            };
            match attempt {
                Attempt::Missing => {
                    self.events.lock().push("missing");
                    Err(DeviceError::Missing(want.device.clone()))
                }
                Attempt::Device(layout, reads) => {
                    self.events.lock().push("opened");
                    Ok(FakeSource {
                        layout,
                        reads: reads.into(),
                        events: self.events.clone(),
                    })
                }
            }
        }
    }

    impl FrameSource for FakeSource {
        fn layout(&self) -> Layout {
            self.layout
        }

        fn next_frame(&mut self, _within: Duration) -> Result<Option<RawFrame>, DeviceError> {
            match self.reads.pop_front() {
                // Silent: the task waits out `within` on the paused clock.
                None => Ok(None),
                Some(Read::Frame(data)) => Ok(Some(RawFrame {
                    data,
                    damaged: false,
                })),
                Some(Read::Lost) => Err(DeviceError::Gone(PathBuf::from("/dev/video0"))),
                Some(Read::Panic) => panic!("boom in the device layer"),
            }
        }
    }

    fn spec() -> CameraSpec {
        CameraSpec {
            name: "usb".into(),
            description: None,
            source: Source::V4l2(V4l2Spec {
                device: "/dev/video0".into(),
                format: PixelFormat::Mjpeg,
                width: 64,
                height: 48,
                fps: 15.0,
            }),
            max_frame_bytes: 1 << 20,
            stale_after: Duration::from_secs(2),
            max_image_px: 1568,
            max_image_bytes: 1 << 20,
            jpeg_quality: 80,
            max_stream_fps: 10.0,
            max_viewers: 4,
        }
    }

    fn mjpeg_layout() -> Layout {
        Layout {
            format: PixelFormat::Mjpeg,
            width: 64,
            height: 48,
            stride: 0,
        }
    }

    fn jpeg() -> Vec<u8> {
        encode_rgb(&[90; 64 * 48 * 3], 64, 48, 80).unwrap()
    }

    /// Runs the camera on the scripted device until the script is used up;
    /// the camera, its views at each attempt to open, and the events.
    async fn play(script: Vec<Attempt>) -> (Arc<Camera>, Vec<HealthView>, Vec<&'static str>) {
        let camera = Arc::new(Camera::new(spec(), Default::default()));
        let (done, mut finished) = mpsc::unbounded_channel();
        let views = Arc::new(Mutex::new(Vec::new()));
        let events = Arc::new(Mutex::new(Vec::new()));
        let fake = Fake {
            camera: Mutex::new(Some(camera.clone())),
            attempts: Mutex::new(script.into()),
            views: views.clone(),
            events: events.clone(),
            done,
        };
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run_with(camera.clone(), fake, shutdown.clone()));
        finished.recv().await.unwrap();
        shutdown.cancel();
        task.await.unwrap();
        let views = views.lock().clone();
        let events = events.lock().clone();
        (camera, views, events)
    }

    #[tokio::test(start_paused = true)]
    async fn an_unplugged_camera_is_disconnected_and_comes_back() {
        let started = tokio::time::Instant::now();
        let (camera, views, events) = play(vec![
            Attempt::Device(
                mjpeg_layout(),
                vec![
                    Read::Frame(jpeg()),
                    Read::Frame(b"not a picture".to_vec()),
                    Read::Frame(jpeg()),
                    Read::Lost,
                ],
            ),
            Attempt::Missing,
            Attempt::Device(mjpeg_layout(), vec![Read::Frame(jpeg())]),
        ])
        .await;
        assert_eq!(
            events,
            ["opened", "closed", "missing", "opened", "closed"],
            "the lost device is closed before it is opened again"
        );
        assert_eq!(views[0].health, Health::Starting);
        // Unplugged: disconnected, saying why, frames kept.
        assert_eq!(views[1].health, Health::Disconnected);
        assert!(
            views[1]
                .last_error
                .as_deref()
                .unwrap()
                .contains("went away"),
            "{:?}",
            views[1].last_error
        );
        assert_eq!((views[1].frames, views[1].rejected.garbage), (2, 1));
        // Still missing at the next attempt.
        assert_eq!(views[2].health, Health::Disconnected);
        assert!(
            views[2]
                .last_error
                .as_deref()
                .unwrap()
                .contains("no device at /dev/video0")
        );
        // Back: it delivered again, then went silent and was reopened.
        assert_eq!(views[3].frames, 3);
        assert_eq!(views[3].health, Health::Disconnected);
        assert!(
            views[3]
                .last_error
                .as_deref()
                .unwrap()
                .contains("no frame from the device for 4000 ms"),
            "{:?}",
            views[3].last_error
        );
        assert_eq!(views[3].reconnects, 2, "two outages");
        // 250 ms after the loss, 500 ms after the missing device, 4 s of
        // silence, 250 ms (a frame reset the backoff): no sooner.
        assert!(
            tokio::time::Instant::now() - started >= Duration::from_millis(5000),
            "{:?}",
            tokio::time::Instant::now() - started
        );
        assert_eq!(camera.latest().unwrap().seq, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_panic_in_the_device_layer_is_a_failure_and_the_camera_reconnects() {
        let yuyv = Layout {
            format: PixelFormat::Yuyv,
            width: 64,
            height: 48,
            stride: 128,
        };
        let rgb = vec![200u8; 64 * 48 * 3];
        let (camera, views, events) = play(vec![
            Attempt::Device(mjpeg_layout(), vec![Read::Panic]),
            Attempt::Device(yuyv, vec![Read::Frame(frames::yuyv_from_rgb(&rgb, 64, 48))]),
        ])
        .await;
        assert_eq!(events, ["opened", "closed", "opened", "closed"]);
        assert_eq!(views[1].health, Health::Disconnected);
        let why = views[1].last_error.clone().unwrap();
        assert!(why.contains("device layer failed"), "{why}");
        assert!(why.contains("boom in the device layer"), "{why}");
        // The YUYV frame of the device that came back, as a JPEG.
        assert_eq!(views[2].frames, 1);
        let frame = camera.latest().unwrap();
        assert_eq!((frame.width, frame.height), (64, 48));
        let (pixels, w, h) = decode_rgb(&frame.jpeg).unwrap();
        assert_eq!((w, h), (64, 48));
        assert!(
            pixels.iter().all(|&v| v.abs_diff(200) <= 4),
            "grey stays grey"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_missing_device_keeps_the_camera_disconnected_saying_so() {
        // The real device layer, on a path that does not exist.
        let mut spec = spec();
        let missing = "/dev/video-rozd-test-never-present";
        if let Source::V4l2(v) = &mut spec.source {
            v.device = missing.into();
        }
        let camera = Arc::new(Camera::new(spec, Default::default()));
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run(camera.clone(), shutdown.clone()));
        // A second on the paused clock: attempts at 0, 250 and 750 ms (the
        // clock does not move while an attempt is under way).
        tokio::time::sleep(Duration::from_secs(1)).await;
        let view = camera.view(now());
        assert_eq!(view.health.health, Health::Disconnected);
        let why = view.health.last_error.unwrap();
        assert!(why.contains(missing) && why.contains("unplugged"), "{why}");
        assert!(camera.latest().is_none());
        shutdown.cancel();
        task.await.unwrap();
    }
}
