//! `[[cameras]]`: each camera's section, its defaults and its validation.
//! Imports only `config::types` and `record::read` (a replayed camera's
//! frames are read at load); the aggregate (`config::load`) calls
//! [`validate`] and locates its errors at their file, line and key.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use serde::Deserialize;

use crate::config::types::{Invalid, valid_id, within};

/// Where a camera's frames come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// A network camera: a multipart MJPEG stream or a single-JPEG snapshot URL.
    Http,
    /// The simulated world's first-person view.
    Sim,
    /// JPEG files from a directory, played in name order, looping.
    Files,
    /// A recording's `/cameras/<name>` frames, at their recorded times.
    Replay,
    /// A V4L2 capture device (a USB webcam, a CSI bridge with a V4L2
    /// driver): `device`, `format`, `width`, `height`, `fps`.
    V4l2,
}

impl SourceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Http => "http",
            SourceKind::Sim => "sim",
            SourceKind::Files => "files",
            SourceKind::Replay => "replay",
            SourceKind::V4l2 => "v4l2",
        }
    }
}

/// One `[[cameras]]` entry as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CameraConfig {
    pub name: String,
    pub source: SourceKind,
    /// What the camera looks at, for the model and people.
    #[serde(default)]
    pub description: Option<String>,
    /// `http`: the stream or snapshot URL (`http://` or `https://`).
    #[serde(default)]
    pub url: Option<String>,
    /// `http`: an environment variable holding one header line sent with
    /// every request, e.g. `Authorization: Basic dXNlcjpwdw==`.
    #[serde(default)]
    pub auth_header_env: Option<String>,
    /// `sim`, `files`, `v4l2` and snapshot URLs: frames per second captured.
    #[serde(default)]
    pub fps: Option<f64>,
    /// `sim`, `v4l2`: the picture's size in pixels.
    #[serde(default)]
    pub width: Option<u32>,
    #[serde(default)]
    pub height: Option<u32>,
    /// `sim`: horizontal field of view in degrees, centred on the heading.
    #[serde(default)]
    pub fov_deg: Option<f64>,
    /// `files`: the directory of `.jpg` / `.jpeg` files.
    #[serde(default)]
    pub directory: Option<PathBuf>,
    /// `replay`: an MCAP recording of rozd.
    #[serde(default)]
    pub file: Option<PathBuf>,
    /// `replay`: the recording's channel (default `/cameras/<name>`).
    #[serde(default)]
    pub channel: Option<String>,
    /// `v4l2`: the device, e.g. `/dev/video0` or a stable
    /// `/dev/v4l/by-id/...` link.
    #[serde(default)]
    pub device: Option<PathBuf>,
    /// `v4l2`: `"mjpeg"` (default) or `"yuyv"`.
    #[serde(default)]
    pub format: Option<String>,
    /// A frame larger than this is refused (and counted).
    #[serde(default = "default_max_frame_kb")]
    pub max_frame_kb: u32,
    /// No frame for this long: `stale`; a stream silent for twice as long
    /// is reconnected.
    #[serde(default = "default_stale_after_ms")]
    pub stale_after_ms: u64,
    /// Images for a model: longest edge at most this many pixels.
    #[serde(default = "default_max_image_px")]
    pub max_image_px: u32,
    /// Images for a model: re-encoded (smaller) when larger than this.
    #[serde(default = "default_max_image_kb")]
    pub max_image_kb: u32,
    /// JPEG quality of what rozd encodes (1-100).
    #[serde(default = "default_jpeg_quality")]
    pub jpeg_quality: u8,
    /// `stream.mjpeg`: at most this many frames per second to a viewer.
    #[serde(default = "default_max_stream_fps")]
    pub max_stream_fps: f64,
    /// `stream.mjpeg`: at most this many viewers at once.
    #[serde(default = "default_max_viewers")]
    pub max_viewers: u32,
}

fn default_max_frame_kb() -> u32 {
    4096
}
fn default_stale_after_ms() -> u64 {
    2000
}
/// What Anthropic recommends as the long edge of an image.
fn default_max_image_px() -> u32 {
    1568
}
fn default_max_image_kb() -> u32 {
    1024
}
fn default_jpeg_quality() -> u8 {
    80
}
fn default_max_stream_fps() -> f64 {
    10.0
}
fn default_max_viewers() -> u32 {
    4
}

/// A validated camera: what its source reads and how it is bounded.
#[derive(Debug, Clone, PartialEq)]
pub struct CameraSpec {
    pub name: String,
    pub description: Option<String>,
    pub source: Source,
    pub max_frame_bytes: usize,
    pub stale_after: Duration,
    pub max_image_px: u32,
    pub max_image_bytes: usize,
    pub jpeg_quality: u8,
    pub max_stream_fps: f64,
    pub max_viewers: u32,
}

/// A validated source.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    Http {
        url: String,
        /// The header (name, value) read from `auth_header_env` at start-up.
        header: Option<(String, String)>,
        /// How often a snapshot URL is polled.
        poll: Duration,
    },
    Sim {
        width: u32,
        height: u32,
        fov_deg: f64,
        every: Duration,
    },
    Files {
        directory: PathBuf,
        every: Duration,
    },
    /// A V4L2 capture device.
    V4l2(V4l2Spec),
    /// A recording's frames, read at config load.
    Replay {
        file: PathBuf,
        channel: String,
        /// (time since the recording's first message, the JPEG), in time
        /// order; never empty.
        frames: Arc<Vec<(Duration, Bytes)>>,
        /// The recording's length (its first to its last message, any channel).
        span: Duration,
        /// From `[replay]`: playback speed, and whether it starts over.
        speed: f64,
        looped: bool,
    },
}

impl Source {
    pub fn kind(&self) -> SourceKind {
        match self {
            Source::Http { .. } => SourceKind::Http,
            Source::Sim { .. } => SourceKind::Sim,
            Source::Files { .. } => SourceKind::Files,
            Source::Replay { .. } => SourceKind::Replay,
            Source::V4l2(_) => SourceKind::V4l2,
        }
    }
}

/// What a V4L2 camera asks its device for (the device may agree to
/// another size: the frames carry the size it delivers).
#[derive(Debug, Clone, PartialEq)]
pub struct V4l2Spec {
    /// Need not exist at start: a camera plugged in later is opened then.
    pub device: PathBuf,
    pub format: PixelFormat,
    pub width: u32,
    pub height: u32,
    pub fps: f64,
}

/// The pixel formats rozd takes from a V4L2 device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PixelFormat {
    /// Motion JPEG: every frame a JPEG, passed through as it is.
    Mjpeg,
    /// YUV 4:2:2, encoded to JPEG by rozd.
    Yuyv,
}

impl PixelFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            PixelFormat::Mjpeg => "mjpeg",
            PixelFormat::Yuyv => "yuyv",
        }
    }

    /// V4L2's four-character code of the format.
    pub fn fourcc(self) -> [u8; 4] {
        match self {
            PixelFormat::Mjpeg => *b"MJPG",
            PixelFormat::Yuyv => *b"YUYV",
        }
    }

    fn parse(name: &str) -> Option<PixelFormat> {
        match name.to_ascii_lowercase().as_str() {
            "mjpeg" => Some(PixelFormat::Mjpeg),
            "yuyv" => Some(PixelFormat::Yuyv),
            _ => None,
        }
    }
}

/// Most bytes of frames one replayed camera holds (read at config load).
pub(crate) const MAX_REPLAY_BYTES: usize = 256 << 20;

/// Most cameras one host runs.
pub(crate) const MAX_CAMERAS: usize = 16;

/// Validates every `[[cameras]]` entry; `have_world`: the host runs the
/// simulated world (a `sim` camera renders it).
pub(crate) fn validate(
    cameras: &[CameraConfig],
    have_world: bool,
) -> Result<Vec<CameraSpec>, Invalid> {
    if cameras.len() > MAX_CAMERAS {
        return Err(Invalid::new(
            format!("cameras[{MAX_CAMERAS}]"),
            format!("at most {MAX_CAMERAS} cameras"),
        ));
    }
    let mut specs = Vec::with_capacity(cameras.len());
    for (i, c) in cameras.iter().enumerate() {
        let key = |k: &str| format!("cameras[{i}].{k}");
        if !valid_id(&c.name) || c.name.len() > 64 {
            return Err(Invalid::new(
                key("name"),
                format!(
                    "{:?} is not a valid camera name (1-64 letters, digits, '-', '_', '.')",
                    c.name
                ),
            ));
        }
        if cameras[..i].iter().any(|o| o.name == c.name) {
            return Err(Invalid::new(
                key("name"),
                format!("another camera is already named {:?}", c.name),
            ));
        }
        // Keys that belong to another source are mistakes, not ignored.
        let allowed: &[&str] = match c.source {
            SourceKind::Http => &["url", "auth_header_env", "fps"],
            SourceKind::Sim => &["fps", "width", "height", "fov_deg"],
            SourceKind::Files => &["fps", "directory"],
            SourceKind::Replay => &["file", "channel"],
            SourceKind::V4l2 => &["device", "format", "width", "height", "fps"],
        };
        for (name, given) in [
            ("url", c.url.is_some()),
            ("auth_header_env", c.auth_header_env.is_some()),
            ("fps", c.fps.is_some()),
            ("width", c.width.is_some()),
            ("height", c.height.is_some()),
            ("fov_deg", c.fov_deg.is_some()),
            ("directory", c.directory.is_some()),
            ("file", c.file.is_some()),
            ("channel", c.channel.is_some()),
            ("device", c.device.is_some()),
            ("format", c.format.is_some()),
        ] {
            if given && !allowed.contains(&name) {
                return Err(Invalid::new(
                    key(name),
                    format!(
                        "does not apply to source = {:?} (it takes: {})",
                        c.source.as_str(),
                        allowed.join(", ")
                    ),
                ));
            }
        }
        let fps = match c.fps {
            Some(f) if !(f.is_finite() && f > 0.0 && f <= 60.0) => {
                return Err(Invalid::new(
                    key("fps"),
                    format!("{f} is outside 0 < fps <= 60"),
                ));
            }
            Some(f) => f,
            // What most webcams offer at 640x480 (a device without it
            // picks its nearest).
            None if c.source == SourceKind::V4l2 => 15.0,
            None => 5.0,
        };
        let every = Duration::from_secs_f64(1.0 / fps);
        let source = match c.source {
            SourceKind::V4l2 => Source::V4l2(v4l2_spec(c, fps, &key)?),
            SourceKind::Replay => {
                let Some(file) = &c.file else {
                    return Err(Invalid::new(
                        key("file"),
                        "source = \"replay\" needs a file (an MCAP recording of rozd)",
                    ));
                };
                let channel = c
                    .channel
                    .clone()
                    .unwrap_or_else(|| format!("/cameras/{}", c.name));
                let track = crate::record::read::camera_track(file, &channel, MAX_REPLAY_BYTES)
                    .map_err(|e| Invalid::new(key("file"), e.to_string()))?;
                if track.frames.is_empty() {
                    return Err(Invalid::new(
                        key("channel"),
                        format!(
                            "{} has no JPEG frames on channel {channel:?}; channels with frames: {}",
                            file.display(),
                            if track.channels.is_empty() {
                                "none".to_string()
                            } else {
                                track.channels.join(", ")
                            }
                        ),
                    ));
                }
                Source::Replay {
                    file: file.clone(),
                    channel,
                    frames: Arc::new(
                        track
                            .frames
                            .into_iter()
                            .map(|(at, jpeg)| (at, Bytes::from(jpeg)))
                            .collect(),
                    ),
                    span: track.span,
                    speed: 1.0,
                    looped: false,
                }
            }
            SourceKind::Http => {
                let Some(url) = &c.url else {
                    return Err(Invalid::new(key("url"), "source = \"http\" needs a url"));
                };
                let parsed = reqwest::Url::parse(url)
                    .map_err(|e| Invalid::new(key("url"), format!("{url:?} is not a URL: {e}")))?;
                if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
                    return Err(Invalid::new(
                        key("url"),
                        format!("{url:?} must be an http:// or https:// URL with a host"),
                    ));
                }
                let header = match &c.auth_header_env {
                    Some(var) => Some(
                        header_from_env(var)
                            .map_err(|m| Invalid::new(key("auth_header_env"), m))?,
                    ),
                    None => None,
                };
                Source::Http {
                    url: url.clone(),
                    header,
                    poll: every,
                }
            }
            SourceKind::Sim => {
                if !have_world {
                    return Err(Invalid::new(
                        key("source"),
                        "source = \"sim\" renders the simulated world, and this host runs none \
                         (add [sim], or a sensor or actuator of the world)",
                    ));
                }
                let (width, height) = (c.width.unwrap_or(640), c.height.unwrap_or(480));
                for (name, v) in [("width", width), ("height", height)] {
                    if !(16..=4096).contains(&v) {
                        return Err(Invalid::new(key(name), format!("{v} is outside 16-4096")));
                    }
                }
                let fov_deg = c.fov_deg.unwrap_or(60.0);
                if !(fov_deg.is_finite() && (10.0..=170.0).contains(&fov_deg)) {
                    return Err(Invalid::new(
                        key("fov_deg"),
                        format!("{fov_deg} is outside 10-170"),
                    ));
                }
                Source::Sim {
                    width,
                    height,
                    fov_deg,
                    every,
                }
            }
            SourceKind::Files => {
                let Some(directory) = &c.directory else {
                    return Err(Invalid::new(
                        key("directory"),
                        "source = \"files\" needs a directory",
                    ));
                };
                if !directory.is_dir() {
                    return Err(Invalid::new(
                        key("directory"),
                        format!("{} is not a directory", directory.display()),
                    ));
                }
                Source::Files {
                    directory: directory.clone(),
                    every,
                }
            }
        };
        within(key("max_frame_kb"), c.max_frame_kb, 1..=65_536).map_err(|e| e.noting("64 MiB"))?;
        within(key("stale_after_ms"), c.stale_after_ms, 100..=3_600_000)
            .map_err(|e| e.noting("an hour"))?;
        within(key("max_image_px"), c.max_image_px, 64..=8192)?;
        within(key("max_image_kb"), c.max_image_kb, 8..=5120)
            .map_err(|e| e.noting("5 MiB, the largest image providers take"))?;
        within(key("jpeg_quality"), c.jpeg_quality, 1..=100)?;
        let s = c.max_stream_fps;
        if !(s.is_finite() && s > 0.0 && s <= 60.0) {
            return Err(Invalid::new(
                key("max_stream_fps"),
                format!("{s} is outside 0 < max_stream_fps <= 60"),
            ));
        }
        within(key("max_viewers"), c.max_viewers, 1..=64)?;
        specs.push(CameraSpec {
            name: c.name.clone(),
            description: c.description.clone(),
            source,
            max_frame_bytes: c.max_frame_kb as usize * 1024,
            stale_after: Duration::from_millis(c.stale_after_ms),
            max_image_px: c.max_image_px,
            max_image_bytes: c.max_image_kb as usize * 1024,
            jpeg_quality: c.jpeg_quality,
            max_stream_fps: s,
            max_viewers: c.max_viewers,
        });
    }
    Ok(specs)
}

/// A `v4l2` camera's keys. The device is not looked at: a camera that is
/// not plugged in yet is `disconnected` and opened when it appears.
fn v4l2_spec(
    c: &CameraConfig,
    fps: f64,
    key: &dyn Fn(&str) -> String,
) -> Result<V4l2Spec, Invalid> {
    let Some(device) = &c.device else {
        return Err(Invalid::new(
            key("device"),
            "source = \"v4l2\" needs a device (e.g. \"/dev/video0\"; `v4l2-ctl --list-devices` \
             lists them)",
        ));
    };
    if !device.is_absolute() {
        return Err(Invalid::new(
            key("device"),
            format!(
                "{} is not an absolute path (e.g. \"/dev/video0\", or a stable \
                 \"/dev/v4l/by-id/...\" link)",
                device.display()
            ),
        ));
    }
    let format = match &c.format {
        None => PixelFormat::Mjpeg,
        Some(name) => PixelFormat::parse(name).ok_or_else(|| {
            Invalid::new(
                key("format"),
                format!("{name:?} is not a format rozd takes: \"mjpeg\" or \"yuyv\""),
            )
        })?,
    };
    let (width, height) = (c.width.unwrap_or(640), c.height.unwrap_or(480));
    for (name, v) in [("width", width), ("height", height)] {
        if !(16..=4096).contains(&v) {
            return Err(Invalid::new(key(name), format!("{v} is outside 16-4096")));
        }
    }
    if format == PixelFormat::Yuyv && width % 2 != 0 {
        return Err(Invalid::new(
            key("width"),
            format!("{width} is odd; YUYV carries pixels in pairs (an even width)"),
        ));
    }
    Ok(V4l2Spec {
        device: device.clone(),
        format,
        width,
        height,
        fps,
    })
}

/// The header named by `auth_header_env`: `Name: value` from the
/// environment, checked as HTTP allows.
fn header_from_env(var: &str) -> Result<(String, String), String> {
    let value = std::env::var(var).map_err(|_| {
        format!("environment variable {var:?} is not set (it should hold `Name: value`)")
    })?;
    parse_header(&value).ok_or_else(|| {
        format!(
            "environment variable {var:?} does not hold a header line `Name: value` \
             (its value is not shown)"
        )
    })
}

/// `Name: value` as a valid header name and value.
fn parse_header(line: &str) -> Option<(String, String)> {
    let (name, value) = line.split_once(':')?;
    let (name, value) = (name.trim(), value.trim());
    http::HeaderName::from_bytes(name.as_bytes()).ok()?;
    http::HeaderValue::from_str(value).ok()?;
    Some((name.to_string(), value.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, ConfigError, ConfigSource};

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, ConfigSource::File("/etc/rozd/rozd.toml".into()))
    }

    /// (line, key, message) of a configuration error.
    fn invalid(text: &str) -> (Option<usize>, String, String) {
        match parse(text) {
            Err(ConfigError::Invalid {
                line, key, message, ..
            }) => (line, key, message),
            other => panic!("expected an invalid-config error, got {other:?}"),
        }
    }

    #[test]
    fn cameras_are_validated_and_errors_name_line_and_key() {
        let ok = parse(
            "[sim]\n[[cameras]]\nname = \"front\"\nsource = \"sim\"\n\
             [[cameras]]\nname = \"net\"\nsource = \"http\"\nurl = \"http://127.0.0.1:81/stream\"\n",
        )
        .unwrap();
        assert_eq!(ok.cameras.len(), 2);
        assert!(matches!(
            ok.cameras[0].source,
            Source::Sim {
                width: 640,
                height: 480,
                ..
            }
        ));
        assert_eq!(ok.cameras[1].max_image_px, 1568);
        let cases: &[(&str, usize, &str, &str)] = &[
            (
                "[[cameras]]\nname = \"c\"\nsource = \"v4l2\"\n",
                1,
                "cameras[0].device",
                "needs a device",
            ),
            (
                "[[cameras]]\nname = \"c\"\nsource = \"v4l2\"\ndevice = \"video0\"\n",
                4,
                "cameras[0].device",
                "not an absolute path",
            ),
            (
                "[[cameras]]\nname = \"c\"\nsource = \"v4l2\"\ndevice = \"/dev/video0\"\n\
                 format = \"h264\"\n",
                5,
                "cameras[0].format",
                "\"mjpeg\" or \"yuyv\"",
            ),
            (
                "[[cameras]]\nname = \"c\"\nsource = \"v4l2\"\ndevice = \"/dev/video0\"\n\
                 width = 8\n",
                5,
                "cameras[0].width",
                "outside 16-4096",
            ),
            (
                "[[cameras]]\nname = \"c\"\nsource = \"v4l2\"\ndevice = \"/dev/video0\"\n\
                 format = \"yuyv\"\nwidth = 641\n",
                6,
                "cameras[0].width",
                "is odd",
            ),
            (
                "[[cameras]]\nname = \"c\"\nsource = \"v4l2\"\ndevice = \"/dev/video0\"\n\
                 height = 5000\n",
                5,
                "cameras[0].height",
                "outside 16-4096",
            ),
            (
                "[[cameras]]\nname = \"c\"\nsource = \"v4l2\"\ndevice = \"/dev/video0\"\n\
                 fps = 120\n",
                5,
                "cameras[0].fps",
                "outside 0 < fps <= 60",
            ),
            (
                "[[cameras]]\nname = \"c\"\nsource = \"v4l2\"\ndevice = \"/dev/video0\"\n\
                 url = \"http://x/\"\n",
                5,
                "cameras[0].url",
                "does not apply",
            ),
            (
                "[[cameras]]\nname = \"c\"\nsource = \"sim\"\n",
                3,
                "cameras[0].source",
                "runs none",
            ),
            (
                "[[cameras]]\nname = \"c\"\nsource = \"http\"\n",
                1,
                "cameras[0].url",
                "needs a url",
            ),
            (
                "[[cameras]]\nname = \"c\"\nsource = \"http\"\nurl = \"ftp://x/y\"\n",
                4,
                "cameras[0].url",
                "http:// or https://",
            ),
            (
                "[[cameras]]\nname = \"c\"\nsource = \"http\"\nurl = \"http://x/\"\nwidth = 10\n",
                5,
                "cameras[0].width",
                "does not apply",
            ),
            (
                "[[cameras]]\nname = \"c\"\nsource = \"http\"\nurl = \"http://x/\"\n\
                 auth_header_env = \"ROZD_TEST_NEVER_SET_CAMERA_AUTH\"\n",
                5,
                "cameras[0].auth_header_env",
                "is not set",
            ),
            (
                "[sim]\n[[cameras]]\nname = \"a b\"\nsource = \"sim\"\n",
                3,
                "cameras[0].name",
                "not a valid camera name",
            ),
            (
                "[sim]\n[[cameras]]\nname = \"c\"\nsource = \"sim\"\n\
                 [[cameras]]\nname = \"c\"\nsource = \"sim\"\n",
                6,
                "cameras[1].name",
                "already named",
            ),
            (
                "[sim]\n[[cameras]]\nname = \"c\"\nsource = \"sim\"\nfps = 0\n",
                5,
                "cameras[0].fps",
                "outside",
            ),
            (
                "[sim]\n[[cameras]]\nname = \"c\"\nsource = \"sim\"\nmax_viewers = 0\n",
                5,
                "cameras[0].max_viewers",
                "between 1 and 64",
            ),
            (
                "[sim]\n[[cameras]]\nname = \"c\"\nsource = \"sim\"\nmax_frame_kb = 0\n",
                5,
                "cameras[0].max_frame_kb",
                "between",
            ),
            (
                "[[cameras]]\nname = \"c\"\nsource = \"files\"\ndirectory = \"/nonexistent/frames\"\n",
                4,
                "cameras[0].directory",
                "not a directory",
            ),
        ];
        for (text, line, key, message) in cases {
            let (l, k, m) = invalid(text);
            assert_eq!((l, k.as_str()), (Some(*line), *key), "{text}: {m}");
            assert!(m.contains(message), "{text}: {m}");
        }
    }

    #[test]
    fn a_v4l2_camera_is_accepted_without_its_device_present() {
        // A camera plugged in later (hot-plug): not a configuration error.
        let missing = "/dev/video-rozd-test-never-present";
        assert!(!std::path::Path::new(missing).exists());
        let config = parse(&format!(
            "[[cameras]]\nname = \"usb\"\nsource = \"v4l2\"\ndevice = \"{missing}\"\n\
             format = \"yuyv\"\nwidth = 320\nheight = 240\nfps = 30\n"
        ))
        .unwrap();
        assert_eq!(
            config.cameras[0].source,
            Source::V4l2(V4l2Spec {
                device: missing.into(),
                format: PixelFormat::Yuyv,
                width: 320,
                height: 240,
                fps: 30.0,
            })
        );
        assert_eq!(config.cameras[0].source.kind().as_str(), "v4l2");
        // The defaults: MJPEG, 640x480, 15 fps.
        let config =
            parse("[[cameras]]\nname = \"usb\"\nsource = \"v4l2\"\ndevice = \"/dev/video0\"\n")
                .unwrap();
        assert_eq!(
            config.cameras[0].source,
            Source::V4l2(V4l2Spec {
                device: "/dev/video0".into(),
                format: PixelFormat::Mjpeg,
                width: 640,
                height: 480,
                fps: 15.0,
            })
        );
    }

    #[test]
    fn header_lines_are_checked() {
        assert_eq!(
            parse_header("Authorization: Basic abc="),
            Some(("Authorization".into(), "Basic abc=".into()))
        );
        assert_eq!(parse_header("no colon"), None);
        assert_eq!(parse_header("bad name: x"), None);
        assert_eq!(parse_header("X-Key: line\nbreak"), None);
    }
}
