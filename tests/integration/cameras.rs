//! Cameras (issue 33) with real parts: Debian's `ffmpeg` serving a live
//! MJPEG stream on loopback, the real `rozd` binary, a real HTTP client,
//! and Pillow decoding every JPEG rozd serves. Bad cameras are loopback
//! servers that send garbage, oversized and mistyped frames. V4L2 has no
//! device on these machines: a V4L2 camera is tested with its device
//! missing, and its frame path (YUYV to JPEG) through Pillow.
//!
//! No sleeps to synchronise: each wait polls `/v1/cameras` until a
//! condition holds, within a generous bound.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use crate::common::{self, TestDaemon, broker::free_port};

/// A bound on a hang (ffmpeg starting, a reconnect after backoff), not a
/// synchronisation.
const WITHIN: Duration = Duration::from_secs(30);

/// `ffmpeg` serving its test picture as multipart MJPEG on `port`, one
/// client (what `-listen 1` does).
fn ffmpeg(port: u16) -> Child {
    Command::new("ffmpeg")
        .args([
            "-hide_banner",
            "-loglevel",
            "error",
            "-re",
            "-f",
            "lavfi",
            "-i",
            "testsrc=size=640x480:rate=10",
            "-c:v",
            "mjpeg",
            "-f",
            "mpjpeg",
            "-listen",
            "1",
        ])
        .arg(format!("http://127.0.0.1:{port}/cam"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("ffmpeg runs (scripts/test.sh installs it)")
}

/// The answer to a GET of `url`.
async fn get(url: String) -> reqwest::Response {
    client().get(url).send().await.unwrap()
}

/// The body of a GET of `url`, as text.
async fn get_text(url: String) -> String {
    get(url).await.text().await.unwrap()
}

fn client() -> reqwest::Client {
    // rustls' process-wide provider (ring), as rozd installs it.
    let _ = rozd::tls::provider();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client")
}

async fn get_json(base: &str, path: &str) -> Value {
    client()
        .get(format!("{base}{path}"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
        .json()
        .await
        .unwrap_or_else(|e| panic!("GET {path}: not JSON: {e}"))
}

/// `/v1/cameras`' entry for `name`.
async fn camera(base: &str, name: &str) -> Value {
    let list = get_json(base, "/v1/cameras").await;
    list["data"]
        .as_array()
        .and_then(|cams| cams.iter().find(|c| c["name"] == name).cloned())
        .unwrap_or_else(|| panic!("no camera {name} in {list}"))
}

/// Polls camera `name` until `pred` holds; the failure shows the last view.
async fn until(base: &str, name: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + WITHIN;
    let mut every = tokio::time::interval(Duration::from_millis(50));
    loop {
        every.tick().await;
        let view = camera(base, name).await;
        if pred(&view) {
            return view;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "camera {name}: not {what} within {WITHIN:?}; last: {view:#}"
        );
    }
}

/// Pillow's (width, height) of each JPEG file: it decodes the whole picture.
fn pillow_sizes(files: &[&Path]) -> Vec<(u32, u32)> {
    let python = common::pyenv_tool("python");
    let out = std::process::Command::new(python)
        .arg("-c")
        .arg(
            "import sys\nfrom PIL import Image\nfor f in sys.argv[1:]:\n    im = Image.open(f)\n    \
             im.load()\n    assert im.format == 'JPEG', im.format\n    print(im.size[0], im.size[1])",
        )
        .args(files)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "Pillow cannot decode: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let (w, h) = l.split_once(' ').expect("w h");
            (w.parse().unwrap(), h.parse().unwrap())
        })
        .collect()
}

/// Reads parts of a `stream.mjpeg` answer until `n` whole JPEGs arrived.
async fn stream_parts(response: reqwest::Response, n: usize) -> Vec<bytes::Bytes> {
    let content_type = response.headers()[http::header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .to_string();
    let boundary = rozd::camera::mjpeg::boundary(&content_type).expect("multipart");
    let mut parser = rozd::camera::mjpeg::MultipartParser::new(&boundary, 8 << 20);
    let mut parts = Vec::new();
    let mut body = response;
    tokio::time::timeout(WITHIN, async {
        while parts.len() < n {
            let chunk = body
                .chunk()
                .await
                .expect("read")
                .expect("the stream goes on");
            parser.push(&chunk, &mut parts);
        }
    })
    .await
    .expect("stream parts in time");
    parts
        .into_iter()
        .map(|p| p.expect("a whole part"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_camera_follows_a_real_mjpeg_stream_through_unplug_and_back() {
    let dir = tempfile::tempdir().unwrap();
    let (cam_port, port) = (free_port(), free_port());
    let mut server = ffmpeg(cam_port);
    let config = dir.path().join("rozd.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\ncontrol_socket = \"\"\n\
             [store]\npath = {:?}\n\
             [[cameras]]\nname = \"bench\"\nsource = \"http\"\n\
             url = \"http://127.0.0.1:{cam_port}/cam\"\nstale_after_ms = 1000\n\
             max_image_px = 320\n",
            dir.path().join("rozd.db").display().to_string()
        ),
    )
    .unwrap();
    let _rozd = common::spawn_rozd(dir.path(), &config).await;
    let base = format!("http://127.0.0.1:{port}");

    // Frames arrive: ok, with the stream's size and a measured rate.
    let ok = until(&base, "bench", "ok", |c| {
        c["health"] == "ok" && c["frames"].as_u64() >= Some(5) && c["fps"].as_f64() > Some(0.0)
    })
    .await;
    assert_eq!(
        (ok["width"].as_u64(), ok["height"].as_u64()),
        (Some(640), Some(480))
    );
    assert_eq!(ok["source"], "http");

    // The snapshot and the stream are JPEGs Pillow decodes, at the camera's size.
    let snapshot = get(format!("{base}/v1/cameras/bench/snapshot.jpg")).await;
    assert_eq!(snapshot.status(), 200);
    assert_eq!(snapshot.headers()["content-type"], "image/jpeg");
    let snap_file = dir.path().join("snapshot.jpg");
    std::fs::write(&snap_file, snapshot.bytes().await.unwrap()).unwrap();
    let stream = get(format!("{base}/v1/cameras/bench/stream.mjpeg")).await;
    assert_eq!(stream.status(), 200);
    let parts = stream_parts(stream, 3).await;
    let mut files = vec![snap_file.clone()];
    for (i, part) in parts.iter().enumerate() {
        let f = dir.path().join(format!("part{i}.jpg"));
        std::fs::write(&f, part).unwrap();
        files.push(f);
    }
    let refs: Vec<&Path> = files.iter().map(|f| f.as_path()).collect();
    assert_eq!(pillow_sizes(&refs), vec![(640, 480); 4]);

    // Unplugged: the camera goes disconnected, the daemon keeps serving.
    common::broker::terminate(&mut server).await;
    let gone = until(&base, "bench", "disconnected", |c| {
        c["health"] == "disconnected"
    })
    .await;
    assert!(gone["last_error"].is_string(), "{gone}");
    let health = get(format!("{base}/healthz")).await;
    assert_eq!(health.status(), 200);
    let snapshot = get(format!("{base}/v1/cameras/bench/snapshot.jpg")).await;
    // No recent frame: 503 with a JSON body that says why, once the last one is old.
    if snapshot.status() != 200 {
        assert_eq!(snapshot.status(), 503);
        let body: Value = snapshot.json().await.unwrap();
        assert_eq!(body["error"]["code"], "unavailable");
    }
    let status = get_json(&base, "/v1/status").await;
    assert_eq!(status["cameras"][0]["name"], "bench");

    // Plugged back in: it reconnects by itself and frames flow again.
    let frames_before = gone["frames"].as_u64().unwrap();
    let _server = ffmpeg(cam_port);
    let back = until(&base, "bench", "ok again", |c| {
        c["health"] == "ok" && c["frames"].as_u64() > Some(frames_before + 3)
    })
    .await;
    assert!(back["reconnects"].as_u64() >= Some(1), "{back}");
    let metrics = get_text(format!("{base}/metrics")).await;
    assert!(
        metrics.contains("rozd_camera_health{camera=\"bench\",health=\"ok\"} 1"),
        "{metrics}"
    );
}

/// A camera that misbehaves as `kind` says, for every connection: the
/// multipart ones keep the connection open and keep misbehaving.
async fn bad_camera(kind: &'static str) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut request = [0u8; 2048];
                let _ = socket.read(&mut request).await;
                let good =
                    rozd::camera::jpeg::encode_rgb(&[90u8; 64 * 48 * 3], 64, 48, 80).unwrap();
                let head = |t: &str| {
                    format!("HTTP/1.1 200 OK\r\nContent-Type: {t}\r\nConnection: close\r\n\r\n")
                };
                if kind == "html" {
                    let body = "<html>not a camera</html>";
                    let _ = socket
                        .write_all(
                            format!(
                                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\n\r\n{body}",
                                body.len()
                            )
                            .as_bytes(),
                        )
                        .await;
                    return;
                }
                let _ = socket
                    .write_all(head("multipart/x-mixed-replace; boundary=x").as_bytes())
                    .await;
                loop {
                    let part: Vec<u8> = match kind {
                        "garbage" => {
                            let body = b"this is not a jpeg at all";
                            [
                                format!(
                                    "--x\r\nContent-Type: image/jpeg\r\nContent-Length: {}\r\n\r\n",
                                    body.len()
                                )
                                .as_bytes(),
                                body,
                                b"\r\n",
                            ]
                            .concat()
                        }
                        "truncated" => {
                            let body = &good[..good.len() / 2];
                            [
                                format!(
                                    "--x\r\nContent-Type: image/jpeg\r\nContent-Length: {}\r\n\r\n",
                                    body.len()
                                )
                                .as_bytes(),
                                body,
                                b"\r\n",
                            ]
                            .concat()
                        }
                        // 200 kB without a length, over max_frame_kb = 64.
                        "oversized" => [
                            b"--x\r\nContent-Type: image/jpeg\r\n\r\n".as_slice(),
                            &vec![0xAB; 200_000],
                            b"\r\n",
                        ]
                        .concat(),
                        // A claimed 200 MB frame; nothing of it follows.
                        "huge" => {
                            b"--x\r\nContent-Type: image/jpeg\r\nContent-Length: 209715200\r\n\r\n"
                                .to_vec()
                        }
                        _ => unreachable!(),
                    };
                    if socket.write_all(&part).await.is_err() {
                        return;
                    }
                    if kind == "huge" {
                        // Silent from here: the camera is reconnected.
                        let _ = socket.read(&mut request).await;
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_camera_input_is_a_counted_error_state_never_a_crash() {
    let mut toml = String::new();
    for kind in ["garbage", "truncated", "oversized", "huge", "html"] {
        let port = bad_camera(kind).await;
        toml.push_str(&format!(
            "[[cameras]]\nname = {kind:?}\nsource = \"http\"\nurl = \"http://127.0.0.1:{port}/\"\n\
             max_frame_kb = 64\nstale_after_ms = 500\n"
        ));
    }
    let daemon = TestDaemon::start(&toml).await;
    let base = daemon.url();
    for (kind, reason) in [
        ("garbage", "garbage"),
        ("truncated", "truncated"),
        ("oversized", "oversized"),
        ("huge", "oversized"),
        ("html", "wrong_type"),
    ] {
        let view = until(&base, kind, &format!("refusing {reason}"), |c| {
            c["rejected"][reason].as_u64() >= Some(2)
        })
        .await;
        assert_eq!(view["frames"], 0, "{kind}: nothing accepted: {view}");
        assert!(view["last_error"].is_string(), "{view}");
        // Not ok; `error` while the refusals are fresh.
        assert_ne!(view["health"], "ok", "{view}");
        let snapshot = get(format!("{base}/v1/cameras/{kind}/snapshot.jpg")).await;
        assert_eq!(snapshot.status(), 503, "{kind}");
    }
    let error = until(&base, "garbage", "in error", |c| c["health"] == "error").await;
    assert!(
        error["last_error"].as_str().unwrap().contains("not a JPEG"),
        "{error}"
    );
    // The daemon serves on, and a name that does not exist is a clear 404.
    let unknown = get(format!("{base}/v1/cameras/nope/snapshot.jpg")).await;
    assert_eq!(unknown.status(), 404);
    let body: Value = unknown.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("garbage, truncated"),
        "{body}"
    );
    daemon.shutdown().await;
}

/// Reads a recording with PyPI `mcap`: each message on a `/cameras/` channel
/// is checked against its JSON schema, its base64 JPEG decoded by Pillow;
/// prints `topic schema_name width height` per message.
const READ_IMAGES: &str = r#"
import base64, io, json, sys
import jsonschema
from mcap.reader import make_reader
from PIL import Image
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        for schema, channel, message in make_reader(f).iter_messages():
            if not channel.topic.startswith("/cameras/"):
                continue
            data = json.loads(message.data)
            jsonschema.validate(data, json.loads(schema.data))
            assert data["format"] == "jpeg" and data["frame_id"] == channel.topic[len("/cameras/"):]
            im = Image.open(io.BytesIO(base64.b64decode(data["data"])))
            im.load()
            print(channel.topic, schema.name, im.size[0], im.size[1])
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recording_holds_camera_frames_foxglove_and_pillow_read() {
    let records = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::start(&format!(
        "[sim]\n[[cameras]]\nname = \"front_camera\"\nsource = \"sim\"\nwidth = 320\nheight = 240\n\
         fps = 10\n[record]\ndirectory = {:?}\nflush_ms = 20\ncamera_hz = 5\nstreams = [\"cameras\"]\n",
        records.path().display().to_string()
    ))
    .await;
    // Until a few frames are written (the recording's own counter).
    tokio::time::timeout(WITHIN, async {
        let mut every = tokio::time::interval(Duration::from_millis(50));
        loop {
            every.tick().await;
            if daemon
                .host
                .recorder()
                .counts()
                .is_some_and(|(written, _, _)| written >= 3)
            {
                return;
            }
        }
    })
    .await
    .expect("frames recorded");
    daemon.shutdown().await;
    let files: Vec<std::path::PathBuf> = std::fs::read_dir(records.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "mcap"))
        .collect();
    assert!(!files.is_empty());
    let out = std::process::Command::new(common::pyenv_tool("python"))
        .arg("-c")
        .arg(READ_IMAGES)
        .args(&files)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert!(lines.len() >= 3, "{lines:?}");
    assert!(
        lines
            .iter()
            .all(|l| l == "/cameras/front_camera foxglove.CompressedImage 320 240"),
        "{lines:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_files_camera_loops_its_pictures_and_the_stream_is_bounded_in_viewers() {
    let frames = tempfile::tempdir().unwrap();
    for (name, w, h) in [("a.jpg", 64, 48), ("b.jpeg", 32, 24), ("notes.txt", 0, 0)] {
        let data = if w == 0 {
            b"not a picture".to_vec()
        } else {
            rozd::camera::jpeg::encode_rgb(&vec![120u8; w * h * 3], w as u32, h as u32, 80).unwrap()
        };
        std::fs::write(frames.path().join(name), data).unwrap();
    }
    let daemon = TestDaemon::start(&format!(
        "[[cameras]]\nname = \"replayed\"\nsource = \"files\"\ndirectory = {:?}\nfps = 20\n\
         max_viewers = 1\n",
        frames.path().display().to_string()
    ))
    .await;
    let base = daemon.url();
    // Both pictures come round, in turn (the text file is not a picture).
    for (w, h) in [(64, 48), (32, 24), (64, 48)] {
        until(&base, "replayed", &format!("showing {w}x{h}"), |c| {
            c["width"] == w && c["height"] == h
        })
        .await;
    }
    let view = camera(&base, "replayed").await;
    assert_eq!(
        view["rejected"]["garbage"], 0,
        "only .jpg/.jpeg are read: {view}"
    );

    // One viewer at a time: the second is refused while the first watches.
    let first = get(format!("{base}/v1/cameras/replayed/stream.mjpeg")).await;
    assert_eq!(first.status(), 200);
    until(&base, "replayed", "watched", |c| c["viewers"] == 1).await;
    let second = get(format!("{base}/v1/cameras/replayed/stream.mjpeg")).await;
    assert_eq!(second.status(), 503);
    let body: Value = second.json().await.unwrap();
    assert_eq!(body["error"]["code"], "too_many_viewers");
    let parts = stream_parts(first, 2).await;
    let sizes: Vec<_> = parts
        .iter()
        .map(|p| rozd::camera::jpeg::check(p, 1 << 20).unwrap())
        .collect();
    assert!(
        sizes.iter().all(|s| *s == (64, 48) || *s == (32, 24)),
        "{sizes:?}"
    );
    // The place is free again once the viewer leaves.
    until(&base, "replayed", "no longer watched", |c| {
        c["viewers"] == 0
    })
    .await;
    daemon.shutdown().await;
}

/// The recording of `directory` (a files camera `cam` at 10 fps, recorded at
/// 10 Hz) once it holds at least `frames` frames: its MCAP file.
async fn record_files_camera(directory: &Path, records: &Path, frames: u64) -> std::path::PathBuf {
    let daemon = TestDaemon::start(&format!(
        "[[cameras]]\nname = \"cam\"\nsource = \"files\"\ndirectory = {:?}\nfps = 10\n\
         [record]\ndirectory = {:?}\nflush_ms = 20\ncamera_hz = 10\nstreams = [\"cameras\"]\n",
        directory.display().to_string(),
        records.display().to_string()
    ))
    .await;
    tokio::time::timeout(WITHIN, async {
        let mut every = tokio::time::interval(Duration::from_millis(50));
        loop {
            every.tick().await;
            if daemon
                .host
                .recorder()
                .counts()
                .is_some_and(|(written, _, _)| written >= frames)
            {
                return;
            }
        }
    })
    .await
    .expect("frames recorded");
    daemon.shutdown().await;
    std::fs::read_dir(records)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "mcap"))
        .expect("a recording")
}

/// `source = "replay"`: a recording's /cameras/<name> frames come back as
/// the camera's frames, byte for byte (the recording keeps the JPEGs as
/// captured), both pictures in turn when looped; without `loop` the camera
/// is `disconnected` at the end, saying the recording ended; a channel
/// without frames is a config error naming the channels that have some.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_camera_plays_a_recordings_frames_back() {
    let pictures = tempfile::tempdir().unwrap();
    let (big, small) = (
        rozd::camera::jpeg::encode_rgb(&vec![200u8; 64 * 48 * 3], 64, 48, 80).unwrap(),
        rozd::camera::jpeg::encode_rgb(&vec![40u8; 32 * 24 * 3], 32, 24, 80).unwrap(),
    );
    std::fs::write(pictures.path().join("a.jpg"), &big).unwrap();
    std::fs::write(pictures.path().join("b.jpg"), &small).unwrap();
    let records = tempfile::tempdir().unwrap();
    let file = record_files_camera(pictures.path(), records.path(), 6).await;
    let file_toml = format!("{:?}", file.display().to_string());

    let daemon = TestDaemon::start(&format!(
        "[replay]\nloop = true\n[[cameras]]\nname = \"cam\"\nsource = \"replay\"\nfile = {file_toml}\n"
    ))
    .await;
    let base = daemon.url();
    let view = camera(&base, "cam").await;
    assert_eq!(view["source"], "replay", "{view}");
    for (w, h, bytes) in [(64, 48, &big), (32, 24, &small), (64, 48, &big)] {
        until(&base, "cam", &format!("showing {w}x{h}"), |c| {
            c["width"] == w && c["height"] == h && c["health"] == "ok"
        })
        .await;
        // The snapshot is the recorded picture itself (or already the next).
        let shot = get(format!("{base}/v1/cameras/cam/snapshot.jpg")).await;
        assert_eq!(shot.status(), 200);
        let shot = shot.bytes().await.unwrap();
        assert!(
            shot.as_ref() == bytes.as_slice() || shot.as_ref() == big || shot.as_ref() == small,
            "a snapshot of {} bytes is neither recorded picture",
            shot.len()
        );
    }
    daemon.shutdown().await;

    // Played once: at the end the camera says the recording ended.
    let daemon = TestDaemon::start(&format!(
        "[replay]\nspeed = 10.0\n[[cameras]]\nname = \"cam\"\nsource = \"replay\"\nfile = {file_toml}\n"
    ))
    .await;
    let ended = until(&daemon.url(), "cam", "ended", |c| {
        c["health"] == "disconnected"
    })
    .await;
    assert!(
        ended["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("has ended") && e.contains("loop = true")),
        "{ended}"
    );
    assert!(ended["frames"].as_u64().is_some_and(|n| n >= 1), "{ended}");
    daemon.shutdown().await;

    // A channel without frames: the error names the key and the channels.
    let error = rozd::config::Config::parse(
        &format!("[[cameras]]\nname = \"rear\"\nsource = \"replay\"\nfile = {file_toml}\n"),
        rozd::config::ConfigSource::BuiltIn,
    )
    .expect_err("no /cameras/rear in the recording");
    let error = error.to_string();
    assert!(
        error.contains("cameras[0].channel")
            && error.contains("no JPEG frames on channel \"/cameras/rear\"")
            && error.contains("channels with frames: /cameras/cam"),
        "{error}"
    );
}

/// A V4L2 camera whose device is not there (this machine has no V4L2 at
/// all): the daemon starts, serves, and shows the camera `disconnected`,
/// saying why, through the same API as every camera.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v4l2_camera_without_its_device_is_disconnected_and_the_daemon_serves_on() {
    let missing = "/dev/video-rozd-test-never-present";
    assert!(!Path::new(missing).exists());
    let daemon = TestDaemon::start(&format!(
        "[[cameras]]\nname = \"usb\"\nsource = \"v4l2\"\ndevice = \"{missing}\"\n\
         format = \"yuyv\"\nwidth = 320\nheight = 240\nfps = 15\n"
    ))
    .await;
    let base = daemon.url();
    let view = until(&base, "usb", "disconnected", |c| {
        c["health"] == "disconnected"
    })
    .await;
    assert_eq!(view["source"], "v4l2");
    assert_eq!(view["frames"], 0);
    let why = view["last_error"].as_str().unwrap_or_default();
    assert!(
        why.contains(missing) && why.contains("unplugged"),
        "the error names the device and the usual cause: {view}"
    );

    // Serving on: health, status, the camera's refusal, metrics.
    let health = get(format!("{base}/healthz")).await;
    assert_eq!(health.status(), 200);
    let status = get_json(&base, "/v1/status").await;
    assert_eq!(status["cameras"][0]["name"], "usb");
    assert_eq!(status["cameras"][0]["health"], "disconnected");
    let snapshot = get(format!("{base}/v1/cameras/usb/snapshot.jpg")).await;
    assert_eq!(snapshot.status(), 503);
    let body: Value = snapshot.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unavailable");
    let metrics = get_text(format!("{base}/metrics")).await;
    assert!(
        metrics.contains("rozd_camera_health{camera=\"usb\",health=\"disconnected\"} 1"),
        "{metrics}"
    );
    daemon.shutdown().await;
}

/// A YUYV frame as a camera sends it (studio range, chroma shared by each
/// pair of pixels), through rozd's V4L2 frame path: Pillow (libjpeg)
/// decodes the JPEG to the frame's colours.
#[test]
fn a_yuyv_frame_encoded_by_rozd_decodes_in_pillow_to_its_colours() {
    use rozd::camera::v4l2::frames::{self, Layout, PixelFormat, RawFrame};
    const COLOURS: [[u8; 3]; 4] = [[220, 30, 30], [30, 200, 40], [40, 60, 210], [16, 16, 16]];
    let (w, h) = (320u32, 240u32);
    let mut rgb = Vec::with_capacity((w * h * 3) as usize);
    for _ in 0..h {
        for x in 0..w {
            rgb.extend_from_slice(&COLOURS[(x * 4 / w) as usize]);
        }
    }
    let layout = Layout {
        format: PixelFormat::Yuyv,
        width: w,
        height: h,
        stride: w as usize * 2,
    };
    let raw = RawFrame {
        data: frames::yuyv_from_rgb(&rgb, w, h),
        damaged: false,
    };
    let frame = frames::to_jpeg(raw, &layout, 90, 1 << 20).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("yuyv.jpg");
    std::fs::write(&file, &frame.jpeg).unwrap();
    let out = std::process::Command::new(common::pyenv_tool("python"))
        .arg("-c")
        .arg(
            "import sys\nfrom PIL import Image\nim = Image.open(sys.argv[1])\nim.load()\n\
             assert im.format == 'JPEG' and im.mode == 'RGB', (im.format, im.mode)\n\
             print(im.size[0], im.size[1])\n\
             for band in range(4):\n    x = band * im.size[0] // 4 + im.size[0] // 8\n    \
             print(*im.getpixel((x, im.size[1] // 2)))",
        )
        .arg(&file)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "Pillow cannot decode: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("320 240"));
    for (band, colour) in COLOURS.iter().enumerate() {
        let got: Vec<u8> = lines
            .next()
            .unwrap_or_default()
            .split(' ')
            .map(|v| v.parse().unwrap())
            .collect();
        assert!(
            got.iter().zip(colour).all(|(a, b)| a.abs_diff(*b) <= 8),
            "band {band}: Pillow reads {got:?} for {colour:?}"
        );
    }
}
