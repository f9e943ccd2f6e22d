//! Measurement 7, cameras: encoding a 640×480 picture to JPEG beside
//! Pillow (libjpeg-turbo) encoding the same picture at the same quality;
//! checking an MJPEG frame before it is passed through (what every frame
//! of a stream costs) beside copying its bytes; and `capture_image` on the
//! simulated camera (640×480, end to end through the host tools) beside
//! the least any camera tool does: taking the latest frame and
//! base64-encoding it for the model.
//!
//! And the control loop while cameras stream: the 100 Hz loop of
//! measurement 4's host with two simulated cameras (640×480, 15 fps), each
//! streamed to two viewers, beside the same host without cameras, run just
//! before it; with the CPU each captured frame cost (the run with cameras
//! less the run without, per frame, the viewers' reading included) beside
//! rozd's own encode of one picture, the least a frame costs.
//!
//! And the idle footprint: the private memory of a `rozd` process with four
//! simulated cameras beside the same host without cameras, per camera.
//!
//! Pillow runs in its own Python process (the pyenv of the tests:
//! `ROZD_TEST_PYENV`, else `<target>/pyenv`), timing only its encode
//! calls; without it the encode has no floor and says why.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use base64::Engine as _;

use super::Scale;
use super::fixtures::Daemon;
use super::footprint::{Server, rozd_command};
use super::report::{Better, Group, P50, P99, Samples};

const WIDTH: u32 = 640;
const HEIGHT: u32 = 480;
const QUALITY: u8 = 80;

/// The simulated world and one sensor in it.
const SIM_SENSOR: &str = "[sim]\n[[sensors]]\nname = \"front_distance\"\nsource = \"sim\"\n\
                          quantity = \"front_distance\"\n";
const SIM_CAMERA: &str = "[sim]\n[[sensors]]\nname = \"front_distance\"\nsource = \"sim\"\n\
                          quantity = \"front_distance\"\n\
                          [[cameras]]\nname = \"front_camera\"\nsource = \"sim\"\n\
                          width = 640\nheight = 480\nfps = 10\n";

/// Times Pillow's encode of raw pixels (argv: file, width, height,
/// quality, trials, mode: "RGB" or "YCbCr", 8 bits a channel); prints one
/// duration in µs per line.
const PILLOW: &str = r#"
import io, sys, time
from PIL import Image
path, w, h, q, n, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
im = Image.frombytes(mode, (w, h), open(path, "rb").read())
for _ in range(n):
    out = io.BytesIO()
    t = time.perf_counter()
    im.save(out, "JPEG", quality=q)
    print((time.perf_counter() - t) * 1e6)
"#;

/// A picture with edges and gradients (a flat one would flatter any encoder).
fn picture() -> Vec<u8> {
    let mut rgb = Vec::with_capacity((WIDTH * HEIGHT * 3) as usize);
    for y in 0..HEIGHT {
        for x in 0..WIDTH {
            let checker = if (x / 40 + y / 40) % 2 == 0 { 60 } else { 0 };
            rgb.push(((x * 255 / WIDTH) as u8).wrapping_add(checker));
            rgb.push(((y * 255 / HEIGHT) as u8) ^ ((x * y) as u8 & 0x1f));
            rgb.push((((x + y) * 3) as u8).wrapping_add(checker / 2));
        }
    }
    rgb
}

fn python() -> Option<PathBuf> {
    let pyenv = std::env::var_os("ROZD_TEST_PYENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| super::target_dir().join("pyenv"));
    let python = pyenv.join("bin").join("python");
    python.exists().then_some(python)
}

/// Pillow's encode times, or why there are none.
fn pillow(pixels: &[u8], mode: &str, trials: usize) -> Result<Samples, String> {
    let python = python().ok_or("no Python with Pillow (ROZD_TEST_PYENV, <target>/pyenv)")?;
    let mut file = tempfile::NamedTempFile::new().map_err(|e| e.to_string())?;
    file.write_all(pixels).map_err(|e| e.to_string())?;
    let out = std::process::Command::new(python)
        .arg("-c")
        .arg(PILLOW)
        .arg(file.path())
        .args([
            WIDTH.to_string(),
            HEIGHT.to_string(),
            QUALITY.to_string(),
            trials.to_string(),
            mode.to_string(),
        ])
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    let mut samples = Samples::default();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Ok(us) = line.trim().parse::<f64>() {
            samples.push_us(us);
        }
    }
    if samples.len() == 0 {
        return Err("Pillow printed no times".into());
    }
    Ok(samples)
}

pub async fn cameras(scale: &Scale) -> Result<Group> {
    let trials = scale.host_trials.max(5);
    let rgb = picture();

    // Encoding, beside Pillow.
    let mut encode = Samples::default();
    let mut jpeg = Vec::new();
    for _ in 0..trials {
        let t = Instant::now();
        jpeg = rozd::camera::jpeg::encode_rgb(&rgb, WIDTH, HEIGHT, QUALITY)
            .map_err(|e| anyhow!("encode: {}", e.message))?;
        encode.push(t.elapsed());
    }
    let floor = pillow(&rgb, "RGB", trials);
    let note = match &floor {
        Ok(_) => {
            "encode: Pillow (libjpeg-turbo) on the same picture at the same quality, in its own \
                  process"
                .to_string()
        }
        Err(why) => format!("encode: no floor ({why})"),
    };
    let note = format!(
        "{note}; YUYV encode: Pillow encoding the same frame's YCbCr (expanded to 4:4:4 \
         beforehand, untimed: Pillow reads no YUYV); pass-through check, and a V4L2 MJPEG frame \
         passed through (copied out of the driver's buffer, padding cut, checked): copying the \
         frame's bytes; capture_image: the latest frame \
         taken and base64-encoded; loop while streaming: the same host without cameras, run just \
         before; CPU per captured frame (the run with cameras less the run without, per frame): \
         rozd's own encode of one 640×480 picture (p50), the least a frame costs"
    );
    let mut group = Group::new("cameras", &note);
    match &floor {
        Ok(pillow) => group.latencies(
            "camera.encode_640x480",
            "encode 640×480 RGB to JPEG",
            &encode,
            pillow,
            &[P50, P99],
        ),
        Err(_) => group.add(
            "camera.encode_640x480.p50_us",
            "encode 640×480 RGB to JPEG p50",
            "µs",
            Better::Lower,
            encode.percentile(0.5),
            None,
            (encode.len(), 0),
        ),
    }

    // MJPEG pass-through: the check each streamed frame gets, beside a copy.
    let (mut check, mut copy) = (Samples::default(), Samples::default());
    for _ in 0..trials * 10 {
        let t = Instant::now();
        let size = rozd::camera::jpeg::check(std::hint::black_box(&jpeg), 4 << 20)
            .map_err(|e| anyhow!("check: {}", e.message))?;
        check.push(t.elapsed());
        std::hint::black_box(size);
        let t = Instant::now();
        let copied = bytes::Bytes::copy_from_slice(std::hint::black_box(&jpeg));
        copy.push(t.elapsed());
        std::hint::black_box(copied);
    }
    group.latencies(
        "camera.passthrough_check_640x480",
        "MJPEG pass-through: check a 640×480 frame",
        &check,
        &copy,
        &[P50, P99],
    );

    v4l2_frames(trials, &rgb, &jpeg, &copy, &mut group)?;

    // capture_image on the simulated camera, end to end.
    let daemon = Daemon::start(SIM_CAMERA).await?;
    let camera = daemon
        .host
        .cameras()
        .get("front_camera")
        .context("the sim camera")?
        .clone();
    let mut frames = camera.subscribe();
    tokio::time::timeout(Duration::from_secs(10), async {
        while frames.borrow_and_update().is_none() {
            frames.changed().await?;
        }
        anyhow::Ok(())
    })
    .await
    .context("the sim camera's first frame")??;
    let input = serde_json::json!({"camera": "front_camera"});
    let (mut capture, mut least) = (Samples::default(), Samples::default());
    for _ in 0..trials {
        let t = Instant::now();
        let answer = daemon
            .host
            .host_tools()
            .execute("capture_image", &input, "bench")
            .await
            .map_err(|e| anyhow!("capture_image: {e}"))?;
        capture.push(t.elapsed());
        std::hint::black_box(answer);
        let t = Instant::now();
        let frame = camera.latest().context("a frame")?;
        let data = base64::engine::general_purpose::STANDARD.encode(&frame.jpeg);
        least.push(t.elapsed());
        std::hint::black_box(data);
    }
    group.latencies(
        "camera.capture_image",
        "capture_image on the sim camera (640×480)",
        &capture,
        &least,
        &[P50, P99],
    );
    daemon.shutdown().await?;

    streaming(scale, &mut group, encode.percentile(0.5), encode.len()).await?;
    idle_footprint(scale, &mut group).await?;
    Ok(group)
}

/// A V4L2 camera's frames, through the path a device's frames take
/// (`camera::v4l2::frames::to_jpeg`): a 640×480 YUYV frame encoded, beside
/// Pillow encoding the same frame's YCbCr; an MJPEG frame passed through,
/// beside `copy` (copying its bytes).
fn v4l2_frames(
    trials: usize,
    rgb: &[u8],
    jpeg: &[u8],
    copy: &Samples,
    group: &mut Group,
) -> Result<()> {
    use rozd::camera::v4l2::frames::{self, Layout, PixelFormat, RANGE, RawFrame};
    let yuyv = frames::yuyv_from_rgb(rgb, WIDTH, HEIGHT);
    let layout = Layout {
        format: PixelFormat::Yuyv,
        width: WIDTH,
        height: HEIGHT,
        stride: WIDTH as usize * 2,
    };
    let mut encode = Samples::default();
    for _ in 0..trials {
        let t = Instant::now();
        let frame = frames::yuyv_to_jpeg(std::hint::black_box(&yuyv), &layout, QUALITY)
            .map_err(|e| anyhow!("YUYV encode: {}", e.message))?;
        encode.push(t.elapsed());
        std::hint::black_box(frame);
    }
    // The same frame as full-range YCbCr 4:4:4, what Pillow can take.
    let mut ycbcr = Vec::with_capacity(yuyv.len() * 3 / 2);
    for pair in yuyv.chunks_exact(4) {
        let (cb, cr) = (
            RANGE.chroma[usize::from(pair[1])],
            RANGE.chroma[usize::from(pair[3])],
        );
        ycbcr.extend_from_slice(&[RANGE.luma[usize::from(pair[0])], cb, cr]);
        ycbcr.extend_from_slice(&[RANGE.luma[usize::from(pair[2])], cb, cr]);
    }
    match pillow(&ycbcr, "YCbCr", trials) {
        Ok(pillow) => group.latencies(
            "camera.yuyv_encode_640x480",
            "encode a 640×480 YUYV frame to JPEG",
            &encode,
            &pillow,
            &[P50, P99],
        ),
        Err(_) => group.add(
            "camera.yuyv_encode_640x480.p50_us",
            "encode a 640×480 YUYV frame to JPEG p50",
            "µs",
            Better::Lower,
            encode.percentile(0.5),
            None,
            (encode.len(), 0),
        ),
    }

    let mjpeg = Layout {
        format: PixelFormat::Mjpeg,
        stride: 0,
        ..layout
    };
    let mut pass = Samples::default();
    for _ in 0..trials * 10 {
        let t = Instant::now();
        let raw = RawFrame {
            data: std::hint::black_box(jpeg).to_vec(),
            damaged: false,
        };
        let frame = frames::to_jpeg(raw, &mjpeg, QUALITY, 4 << 20)
            .map_err(|e| anyhow!("MJPEG pass-through: {}", e.message))?;
        pass.push(t.elapsed());
        std::hint::black_box(frame);
    }
    group.latencies(
        "camera.v4l2_mjpeg_passthrough_640x480",
        "V4L2 MJPEG pass-through of a 640×480 frame",
        &pass,
        copy,
        &[P50, P99],
    );
    Ok(())
}

/// Cameras in the idle-footprint run beside none.
const IDLE_CAMERAS: usize = 4;

/// Private memory (RssAnon) of an idle `rozd` process with
/// [`IDLE_CAMERAS`] simulated 640×480 cameras beside the same host without
/// cameras (the floor), settled; the name says the growth per camera.
async fn idle_footprint(scale: &Scale, group: &mut Group) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut private = Vec::new();
    for cameras in [0, IDLE_CAMERAS] {
        let mut text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n[store]\npath = {:?}\n{SIM_SENSOR}",
            dir.path()
                .join(format!("idle-{cameras}.db"))
                .display()
                .to_string()
        );
        for i in 0..cameras {
            text.push_str(&format!(
                "\n[[cameras]]\nname = \"cam_{i}\"\nsource = \"sim\"\nwidth = 640\n\
                 height = 480\nfps = 10\n"
            ));
        }
        let config = dir.path().join(format!("idle-{cameras}.toml"));
        std::fs::write(&config, text)?;
        let server = Server::spawn(rozd_command(&config), dir.path()).await?;
        tokio::time::sleep(scale.settle).await;
        private.push(server.status_mib("RssAnon")?);
        server.stop().await?;
    }
    let per_camera = (private[1] - private[0]) / IDLE_CAMERAS as f64;
    group.add(
        "camera.idle_private_mib",
        &format!(
            "idle private memory (RssAnon) with {IDLE_CAMERAS} sim cameras (640×480, 10 fps) vs \
             none: {per_camera:.2} MiB per camera"
        ),
        "MiB",
        Better::Lower,
        private[1],
        Some(private[0]),
        (1, 1),
    );
    Ok(())
}

/// Two sim cameras at 15 fps, each streamed to two viewers.
fn with_cameras(base: &str) -> String {
    let mut text = format!("[sim]\n{base}");
    for name in ["cam_a", "cam_b"] {
        text.push_str(&format!(
            "\n[[cameras]]\nname = \"{name}\"\nsource = \"sim\"\nwidth = 640\nheight = 480\n\
             fps = 15\nmax_stream_fps = 15\n"
        ));
    }
    text
}

/// Reads `camera`'s stream.mjpeg over plain HTTP until `stop`: its bytes.
async fn viewer(
    addr: std::net::SocketAddr,
    camera: &'static str,
    stop: tokio_util::sync::CancellationToken,
) -> Result<u64> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.write_all(
        format!("GET /v1/cameras/{camera}/stream.mjpeg HTTP/1.1\r\nHost: {addr}\r\n\r\n")
            .as_bytes(),
    )
    .await?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    loop {
        tokio::select! {
            () = stop.cancelled() => return Ok(total),
            n = tcp.read(&mut buf) => match n? {
                0 => return Ok(total),
                n => total += n as u64,
            },
        }
    }
}

/// The loop's lateness p99 (µs) over `duration` and the process CPU it
/// took, for a daemon of `text`; with `viewers`, those streams run meanwhile.
async fn loop_run(
    text: &str,
    viewers: &[&'static str],
    duration: Duration,
) -> Result<(u64, u64, Duration, u64, u64)> {
    let daemon = Daemon::start(text).await?;
    let stop = tokio_util::sync::CancellationToken::new();
    let mut watching = Vec::new();
    for camera in viewers {
        watching.push(tokio::spawn(viewer(daemon.addr, camera, stop.clone())));
    }
    let ooda = daemon.host.ooda().clone();
    let before = ooda.stats();
    let frames_before: u64 = daemon
        .host
        .cameras()
        .views()
        .iter()
        .map(|v| v.health.frames)
        .sum();
    let cpu = super::steps::process_cpu();
    tokio::time::sleep(duration).await;
    let cpu = super::steps::process_cpu().saturating_sub(cpu);
    let stats = ooda.stats();
    let frames: u64 = daemon
        .host
        .cameras()
        .views()
        .iter()
        .map(|v| v.health.frames)
        .sum();
    stop.cancel();
    let mut streamed = 0;
    for w in watching {
        streamed += w.await??;
    }
    daemon.shutdown().await?;
    if !viewers.is_empty() && streamed == 0 {
        anyhow::bail!("the viewers received nothing");
    }
    Ok((
        stats.lateness_p99_us,
        stats.ticks.saturating_sub(before.ticks),
        cpu,
        frames.saturating_sub(frames_before),
        streamed,
    ))
}

/// `encode_p50_us` (of `encoded` samples): the floor of a frame's CPU.
async fn streaming(
    scale: &Scale,
    group: &mut Group,
    encode_p50_us: f64,
    encoded: usize,
) -> Result<()> {
    let base = super::control_loop::host(100.0);
    let plain = format!("[sim]\n{base}");
    let (p99_plain, ticks_plain, cpu_plain, _, _) = loop_run(&plain, &[], scale.loop_for).await?;
    let (p99, ticks, cpu, frames, _) = loop_run(
        &with_cameras(&base),
        &["cam_a", "cam_a", "cam_b", "cam_b"],
        scale.loop_for,
    )
    .await?;
    let n = (
        usize::try_from(ticks).unwrap_or(usize::MAX),
        usize::try_from(ticks_plain).unwrap_or(usize::MAX),
    );
    group.add(
        "camera.loop_streaming.lateness_p99_us",
        "100 Hz loop while 2 cameras stream to 2 viewers each: tick lateness p99 vs no cameras",
        "µs",
        Better::Lower,
        p99 as f64,
        Some(p99_plain as f64),
        n,
    );
    let per_frame = cpu.saturating_sub(cpu_plain).as_secs_f64() * 1e6 / frames.max(1) as f64;
    group.add(
        "camera.cpu_per_frame_us",
        &format!("CPU per captured frame ({frames} frames, 4 viewers) vs one encode"),
        "µs",
        Better::Lower,
        per_frame,
        Some(encode_p50_us),
        (usize::try_from(frames).unwrap_or(usize::MAX), encoded),
    );
    Ok(())
}
