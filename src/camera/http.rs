//! Network cameras: one task per camera that keeps a multipart MJPEG
//! stream open (or polls a snapshot URL), hands each part to the camera's
//! check, and reconnects with backoff when the camera goes away or goes
//! silent. Holds at most one frame (`max_frame_kb`) in memory.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::Camera;
use super::config::Source;
use super::health::{Backoff, Rejection};
use super::jpeg::FrameError;
use super::mjpeg::{self, MultipartParser};

/// Bounds of the wait between attempts to reach a camera.
const BACKOFF_MIN: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Connecting, and an answer's headers, at most this long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What to do after one request.
enum Next {
    /// A snapshot was taken (or refused): the next after the poll period.
    Poll,
    /// The camera cannot be reached or went away: reconnect after backoff.
    Reconnect(String),
}

pub(super) async fn run(camera: Arc<Camera>, shutdown: CancellationToken) {
    let Source::Http { url, header, poll } = camera.spec.source.clone() else {
        return;
    };
    let _ = crate::tls::provider();
    let client = match reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .user_agent(concat!("rozd/", env!("CARGO_PKG_VERSION")))
        .build()
    {
        Ok(client) => client,
        Err(e) => {
            camera.link_down(format!("cannot build the HTTP client: {e}"));
            return;
        }
    };
    let mut backoff = Backoff::new(BACKOFF_MIN, BACKOFF_MAX);
    loop {
        let next = tokio::select! {
            () = shutdown.cancelled() => return,
            next = request(&camera, &client, &url, header.as_ref()) => next,
        };
        let wait = match next {
            Next::Poll => {
                backoff.succeeded();
                poll
            }
            Next::Reconnect(why) => {
                camera.link_down(why);
                backoff.failed()
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// One request: a stream read until it fails, or one snapshot.
async fn request(
    camera: &Camera,
    client: &reqwest::Client,
    url: &str,
    header: Option<&(String, String)>,
) -> Next {
    let mut request = client.get(url);
    if let Some((name, value)) = header {
        request = request.header(name.as_str(), value.as_str());
    }
    // Headers within the connect bound plus the staleness bound.
    let answer_within = CONNECT_TIMEOUT + camera.spec.stale_after;
    let response = match tokio::time::timeout(answer_within, request.send()).await {
        Err(_) => return Next::Reconnect(format!("no answer within {answer_within:?}")),
        Ok(Err(e)) => return Next::Reconnect(describe(&e)),
        Ok(Ok(response)) => response,
    };
    let status = response.status();
    if !status.is_success() {
        return Next::Reconnect(format!("the camera answered HTTP {status}"));
    }
    let content_type = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    camera.link_up(Instant::now());
    if let Some(boundary) = mjpeg::boundary(&content_type) {
        return stream(camera, response, &boundary, bytes::Bytes::new()).await;
    }
    let lower = content_type.to_ascii_lowercase();
    if lower.starts_with("image/jpeg") || lower.starts_with("image/jpg") {
        return snapshot(camera, response, bytes::Bytes::new()).await;
    }
    // A generic type (ffmpeg's `-listen 1` sends application/octet-stream):
    // the first bytes tell a multipart stream from a JPEG.
    if lower.is_empty() || lower.starts_with("application/octet-stream") {
        let mut response = response;
        let within = CONNECT_TIMEOUT + camera.spec.stale_after;
        let first = match tokio::time::timeout(within, response.chunk()).await {
            Err(_) => return Next::Reconnect(format!("the camera sent nothing within {within:?}")),
            Ok(Err(e)) => return Next::Reconnect(describe(&e)),
            Ok(Ok(None)) => bytes::Bytes::new(),
            Ok(Ok(Some(first))) => first,
        };
        if let Some(boundary) = mjpeg::sniff_boundary(&first) {
            return stream(camera, response, &boundary, first).await;
        }
        if first.starts_with(&[0xFF, 0xD8]) {
            return snapshot(camera, response, first).await;
        }
    }
    camera.reject(
        FrameError::new(
            Rejection::WrongType,
            format!(
                "the camera answered with content type {content_type:?} (expected \
                 multipart/x-mixed-replace or image/jpeg)"
            ),
        ),
        Instant::now(),
    );
    Next::Poll
}

/// Reads a multipart stream until it ends, fails or goes silent.
async fn stream(
    camera: &Camera,
    mut response: reqwest::Response,
    boundary: &str,
    first: bytes::Bytes,
) -> Next {
    let silent = (camera.spec.stale_after * 2).max(Duration::from_secs(1));
    let mut parser = MultipartParser::new(boundary, camera.spec.max_frame_bytes);
    let mut parts = Vec::new();
    parser.push(&first, &mut parts);
    deliver(camera, &mut parts);
    loop {
        let chunk = match tokio::time::timeout(silent, response.chunk()).await {
            Err(_) => return Next::Reconnect(format!("the stream sent nothing for {silent:?}")),
            Ok(Err(e)) => return Next::Reconnect(describe(&e)),
            Ok(Ok(None)) => return Next::Reconnect("the camera ended the stream".into()),
            Ok(Ok(Some(chunk))) => chunk,
        };
        parser.push(&chunk, &mut parts);
        deliver(camera, &mut parts);
        if parser.done() {
            return Next::Reconnect("the camera ended the stream".into());
        }
    }
}

/// Hands the parts the parser completed to the camera's check.
fn deliver(camera: &Camera, parts: &mut Vec<mjpeg::Part>) {
    let now = Instant::now();
    for part in parts.drain(..) {
        match part {
            Ok(jpeg) => camera.offer(jpeg, now),
            Err(e) => camera.reject(e, now),
        }
    }
}

/// Reads one JPEG, bounded by `max_frame_kb`.
async fn snapshot(camera: &Camera, mut response: reqwest::Response, first: bytes::Bytes) -> Next {
    let max = camera.spec.max_frame_bytes;
    let oversized = |n: u64| {
        FrameError::new(
            Rejection::Oversized,
            format!("a snapshot of {n} bytes or more exceeds max_frame_kb"),
        )
    };
    if let Some(n) = response.content_length()
        && n > max as u64
    {
        camera.reject(oversized(n), Instant::now());
        return Next::Poll;
    }
    let mut body = bytes::BytesMut::from(&first[..]);
    let within = CONNECT_TIMEOUT + camera.spec.stale_after;
    let read = async {
        while let Some(chunk) = response.chunk().await? {
            body.extend_from_slice(&chunk);
            if body.len() > max {
                return Ok(false);
            }
        }
        Ok::<bool, reqwest::Error>(true)
    };
    match tokio::time::timeout(within, read).await {
        Err(_) => Next::Reconnect(format!("the snapshot did not arrive within {within:?}")),
        Ok(Err(e)) => Next::Reconnect(describe(&e)),
        Ok(Ok(false)) => {
            camera.reject(oversized(body.len() as u64), Instant::now());
            Next::Poll
        }
        Ok(Ok(true)) => {
            camera.offer(body.freeze(), Instant::now());
            Next::Poll
        }
    }
}

/// A request's failure with its causes (reqwest's own message is terse).
fn describe(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
