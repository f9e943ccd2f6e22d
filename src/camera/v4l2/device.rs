//! The V4L2 device itself, the only place that touches the `v4l` crate:
//! open the device, agree on the format, size and rate, stream through
//! memory-mapped buffers, copy out each frame's used bytes. Blocking; the
//! camera's task calls it on a blocking thread and catches its panics (the
//! `v4l` crate panics on some driver answers and when a buffer cannot be
//! unmapped).
//!
//! Errors say what usually causes them and what to do about it.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use v4l::buffer::{Flags as BufferFlags, Type};
use v4l::capability::Flags as CapabilityFlags;
use v4l::framesize::FrameSizeEnum;
use v4l::io::mmap::Stream as MmapStream;
use v4l::io::traits::CaptureStream;
use v4l::video::Capture;
use v4l::video::capture::Parameters;
use v4l::{Device, FourCC, Fraction};

use super::frames::{Layout, RawFrame};
use super::{FrameSource, Opener};
use crate::camera::config::V4l2Spec;

/// Buffers the driver fills in turn: enough to ride out a late reader,
/// few enough to keep the latest frame recent.
const BUFFERS: u32 = 4;

/// How long a device that has just started streaming may take to send its
/// first frame: USB webcams often take a second or two (exposure, their
/// own start-up). It runs on a blocking thread, not the loop's.
const FIRST_FRAME_WITHIN: Duration = Duration::from_secs(5);
/// Most formats and sizes an error lists.
const MAX_LISTED: usize = 24;

/// Why a V4L2 device cannot be used (now): each says its usual cause and
/// the fix.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(
        "no device at {0}: the camera is unplugged or the path is wrong (`v4l2-ctl \
         --list-devices` lists them); rozd opens it when it appears"
    )]
    Missing(PathBuf),
    #[error(
        "{0} went away (unplugged, or its USB connection reset); rozd opens it again when \
         it returns"
    )]
    Gone(PathBuf),
    #[error(
        "permission denied on {0}: add rozd's user to group video (`usermod -aG video rozd`; \
         under systemd also SupplementaryGroups=video and DeviceAllow=char-video4linux rw, see \
         docs/guides/cameras.md)"
    )]
    Denied(PathBuf),
    #[error("{0} is busy: another program holds the camera (`fuser -v {0}` names it)")]
    Busy(PathBuf),
    #[error(
        "{0}: not enough USB bandwidth for this format, size and rate (use format = \"mjpeg\", \
         a smaller size or a lower fps, or another USB port)"
    )]
    Bandwidth(PathBuf),
    #[error(
        "{path} is not a video capture device ({card}, driver {driver}): USB cameras have a \
         second node for metadata, try the other /dev/videoN (`v4l2-ctl --list-devices`); a \
         Raspberry Pi CSI camera under libcamera is not a V4L2 capture device (see \
         docs/guides/cameras.md)"
    )]
    NotCapture {
        path: PathBuf,
        card: String,
        driver: String,
    },
    #[error("{path} does not offer {wanted}; it offers: {offers}")]
    Unsupported {
        path: PathBuf,
        wanted: String,
        offers: String,
    },
    #[error("{path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

impl DeviceError {
    /// `error` of `what` on `path`, by its usual cause.
    pub fn classify(path: &Path, what: &'static str, error: io::Error) -> DeviceError {
        let path = path.to_path_buf();
        match error.raw_os_error() {
            Some(libc::ENOENT | libc::ENXIO) => DeviceError::Missing(path),
            Some(libc::ENODEV) => DeviceError::Gone(path),
            Some(libc::EACCES | libc::EPERM) => DeviceError::Denied(path),
            Some(libc::EBUSY) => DeviceError::Busy(path),
            Some(libc::ENOSPC) => DeviceError::Bandwidth(path),
            _ => DeviceError::Io {
                path,
                what,
                source: error,
            },
        }
    }
}

/// Opens real V4L2 devices.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct V4l2Opener;

impl Opener for V4l2Opener {
    type Source = OpenDevice;

    fn open(&self, want: &V4l2Spec) -> Result<OpenDevice, DeviceError> {
        OpenDevice::open(want)
    }
}

/// An open device, streaming.
pub(super) struct OpenDevice {
    path: PathBuf,
    layout: Layout,
    // Dropped before the device (field order): stops the stream and
    // unmaps its buffers.
    stream: MmapStream<'static>,
    _device: Device,
    /// The stream has delivered a frame (so it is streaming, its buffers
    /// queued).
    streaming: bool,
}

impl std::fmt::Debug for OpenDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenDevice")
            .field("path", &self.path)
            .field("layout", &self.layout)
            .finish_non_exhaustive()
    }
}

impl OpenDevice {
    fn open(want: &V4l2Spec) -> Result<OpenDevice, DeviceError> {
        let path = want.device.as_path();
        let fail = |what| move |e| DeviceError::classify(path, what, e);
        let device = Device::with_path(path).map_err(fail("open"))?;
        let caps = device
            .query_caps()
            .map_err(fail("query its capabilities"))?;
        if !caps.capabilities.contains(CapabilityFlags::VIDEO_CAPTURE)
            || !caps.capabilities.contains(CapabilityFlags::STREAMING)
        {
            return Err(DeviceError::NotCapture {
                path: path.to_path_buf(),
                card: caps.card,
                driver: caps.driver,
            });
        }
        let fourcc = FourCC::new(&want.format.fourcc());
        let mut format = device.format().map_err(fail("read its format"))?;
        format.width = want.width;
        format.height = want.height;
        format.fourcc = fourcc;
        let wanted = || format!("{} at {}x{}", want.format.as_str(), want.width, want.height);
        let agreed = device.set_format(&format).map_err(|e| {
            // Most drivers answer a format they lack with another one; some
            // refuse it outright.
            if e.raw_os_error() == Some(libc::EINVAL) {
                DeviceError::Unsupported {
                    path: path.to_path_buf(),
                    wanted: wanted(),
                    offers: offers(&device),
                }
            } else {
                DeviceError::classify(path, "set its format", e)
            }
        })?;
        if agreed.fourcc != fourcc {
            return Err(DeviceError::Unsupported {
                path: path.to_path_buf(),
                wanted: wanted(),
                offers: offers(&device),
            });
        }
        if (agreed.width, agreed.height) != (want.width, want.height) {
            // Drivers pick their nearest size: the frames say which.
            tracing::warn!(
                device = %path.display(),
                asked = %wanted(),
                got = %format_args!("{}x{}", agreed.width, agreed.height),
                offers = %offers(&device),
                "the camera does not offer the size asked for; using the size it chose"
            );
        }
        // The rate is a wish: a device without it picks its nearest, and
        // some do not take one at all.
        let interval = Fraction::new(1000, (want.fps * 1000.0).round().max(1.0) as u32);
        if let Err(e) = device.set_params(&Parameters::new(interval)) {
            tracing::debug!(device = %path.display(), error = %e, "the camera takes no frame rate");
        }
        let stream = MmapStream::with_buffers(&device, Type::VideoCapture, BUFFERS)
            .map_err(fail("map its buffers"))?;
        Ok(OpenDevice {
            path: path.to_path_buf(),
            layout: Layout {
                format: want.format,
                width: agreed.width,
                height: agreed.height,
                stride: agreed.stride as usize,
            },
            stream,
            _device: device,
            streaming: false,
        })
    }
}

impl FrameSource for OpenDevice {
    fn layout(&self) -> Layout {
        self.layout
    }

    fn next_frame(&mut self, within: Duration) -> Result<Option<RawFrame>, DeviceError> {
        // v4l's `next` queues the buffer it last handed out again before it
        // waits, so a wait that timed out inside it would queue that buffer
        // twice at the next call (EINVAL). Once streaming, rozd waits for a
        // filled buffer itself and calls `next` only when one is there; the
        // first call (which queues every buffer and starts the stream) waits
        // inside `next`, and a device with no first frame is reopened.
        if self.streaming {
            // At least a millisecond: a zero timeout would return at once.
            let ms = within
                .clamp(Duration::from_millis(1), Duration::from_secs(60))
                .as_millis();
            match self
                .stream
                .handle()
                .poll(libc::POLLIN, i32::try_from(ms).unwrap_or(60_000))
            {
                Ok(0) => return Ok(None),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(None),
                Err(e) => return Err(DeviceError::classify(&self.path, "wait for a frame", e)),
            }
        } else {
            self.stream.set_timeout(FIRST_FRAME_WITHIN);
        }
        let frame = match CaptureStream::next(&mut self.stream) {
            Ok((buffer, meta)) => {
                let used = (meta.bytesused as usize).min(buffer.len());
                RawFrame {
                    data: buffer[..used].to_vec(),
                    damaged: meta.flags.contains(BufferFlags::ERROR),
                }
            }
            // Only the first call has a timeout: later ones come after poll.
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                return Err(DeviceError::Io {
                    path: self.path.clone(),
                    what: "wait for the first frame after starting the stream",
                    source: e,
                });
            }
            Err(e) => return Err(DeviceError::classify(&self.path, "read a frame", e)),
        };
        if !self.streaming {
            // From now on rozd waits with poll, and `next` need not wait.
            self.streaming = true;
            self.stream.clear_timeout();
        }
        Ok(Some(frame))
    }
}

/// What `device` offers, for an error.
fn offers(device: &Device) -> String {
    let Ok(formats) = device.enum_formats() else {
        return "(the device does not list its formats)".into();
    };
    let listed: Vec<(String, Vec<String>)> = formats
        .into_iter()
        .take(MAX_LISTED)
        .map(|description| {
            let name = description
                .fourcc
                .str()
                .map(str::to_string)
                .unwrap_or_else(|_| format!("{:?}", description.fourcc.repr));
            let sizes = device
                .enum_framesizes(description.fourcc)
                .unwrap_or_default()
                .into_iter()
                .take(MAX_LISTED)
                .map(|size| match size.size {
                    FrameSizeEnum::Discrete(d) => format!("{}x{}", d.width, d.height),
                    FrameSizeEnum::Stepwise(s) => format!(
                        "{}x{} to {}x{}",
                        s.min_width, s.min_height, s.max_width, s.max_height
                    ),
                })
                .collect();
            (name, sizes)
        })
        .collect();
    describe_offers(&listed)
}

/// Formats (as the device names them) with their sizes, as one line:
/// `MJPG 1280x720 640x480; YUYV 640x480 (...)`.
fn describe_offers(formats: &[(String, Vec<String>)]) -> String {
    if formats.is_empty() {
        return "nothing (the device lists no formats)".into();
    }
    let listed: Vec<String> = formats
        .iter()
        .map(|(name, sizes)| format!("{name} {}", sizes.join(" ")).trim().to_string())
        .collect();
    // Say which two rozd takes, by the names the device uses.
    format!(
        "{} (format = \"mjpeg\" is MJPG, \"yuyv\" is YUYV)",
        listed.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::camera::config::PixelFormat;

    fn spec(device: &str) -> V4l2Spec {
        V4l2Spec {
            device: device.into(),
            format: PixelFormat::Mjpeg,
            width: 640,
            height: 480,
            fps: 15.0,
        }
    }

    #[test]
    fn opening_a_missing_device_says_it_is_missing() {
        let path = "/dev/video-rozd-test-never-present";
        let error = V4l2Opener.open(&spec(path)).unwrap_err();
        assert!(matches!(error, DeviceError::Missing(_)), "{error:?}");
        let text = error.to_string();
        assert!(text.contains(path), "{text}");
        assert!(text.contains("unplugged"), "{text}");
    }

    #[test]
    fn a_file_that_is_no_video_device_is_an_error_not_a_panic() {
        // /dev/null opens, but answers no V4L2 ioctl.
        let error = V4l2Opener.open(&spec("/dev/null")).unwrap_err();
        assert!(
            matches!(error, DeviceError::Io { .. } | DeviceError::Gone(_)),
            "{error:?}"
        );
    }

    #[test]
    fn an_unsupported_format_lists_what_the_device_offers() {
        let error = DeviceError::Unsupported {
            path: "/dev/video0".into(),
            wanted: "yuyv at 1920x1080".into(),
            offers: describe_offers(&[
                ("MJPG".into(), vec!["1920x1080".into(), "640x480".into()]),
                ("H264".into(), vec!["16x16 to 1920x1080".into()]),
            ]),
        };
        assert_eq!(
            error.to_string(),
            "/dev/video0 does not offer yuyv at 1920x1080; it offers: MJPG 1920x1080 640x480; \
             H264 16x16 to 1920x1080 (format = \"mjpeg\" is MJPG, \"yuyv\" is YUYV)"
        );
        assert!(describe_offers(&[]).contains("lists no formats"));
    }

    #[test]
    fn errors_say_their_usual_cause_and_fix() {
        let path = Path::new("/dev/video0");
        let of = |errno| DeviceError::classify(path, "open", io::Error::from_raw_os_error(errno));
        assert!(of(libc::EACCES).to_string().contains("group video"));
        assert!(of(libc::EBUSY).to_string().contains("another program"));
        assert!(of(libc::ENODEV).to_string().contains("went away"));
        assert!(of(libc::ENOSPC).to_string().contains("USB bandwidth"));
        assert!(matches!(of(libc::ENOENT), DeviceError::Missing(_)));
        assert!(of(libc::EIO).to_string().starts_with("/dev/video0: open: "));
    }
}
