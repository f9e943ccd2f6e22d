//! The cameras over HTTP (read scope, like every GET): the list with each
//! camera's health, the latest frame as a JPEG, and a multipart MJPEG
//! stream for `<img>` tags and VLC, bounded in viewers and frame rate.
//! A slow viewer skips frames: each part is the latest frame when the
//! viewer is ready for one, nothing queues.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderValue, StatusCode, header};
use serde_json::json;

use super::reply::json_error;
use crate::HostContext;
use crate::camera::{Camera, Frame, mjpeg};

pub(super) fn routes() -> Router<Arc<HostContext>> {
    Router::new()
        .route("/v1/cameras", get(list))
        .route("/v1/cameras/{name}/snapshot.jpg", get(snapshot))
        .route("/v1/cameras/{name}/snapshot", get(snapshot))
        .route("/v1/cameras/{name}/stream.mjpeg", get(stream))
}

/// Every camera with its health.
async fn list(State(ctx): State<Arc<HostContext>>) -> Response {
    axum::Json(json!({ "data": ctx.cameras.views() })).into_response()
}

/// A refusal: its status and JSON body.
type Refusal = (StatusCode, axum::Json<serde_json::Value>);

fn camera<'a>(ctx: &'a HostContext, name: &str) -> Result<&'a Arc<Camera>, Refusal> {
    ctx.cameras
        .find(name)
        .map_err(|message| json_error(StatusCode::NOT_FOUND, "not_found", &message))
}

/// The latest frame if it is recent, else `503` saying why not.
fn recent(camera: &Camera) -> Result<Frame, Refusal> {
    let now = Instant::now();
    match camera.latest() {
        Some(frame) if frame.age_ms(now) <= camera.spec.stale_after.as_millis() as u64 => Ok(frame),
        _ => {
            let view = camera.view(now);
            let why = view
                .health
                .last_error
                .map(|e| format!(": {e}"))
                .unwrap_or_default();
            Err(json_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                &format!(
                    "camera {:?} has no recent frame (health {}{why})",
                    camera.name(),
                    view.health.health.as_str()
                ),
            ))
        }
    }
}

/// `GET /v1/cameras/{name}/snapshot.jpg`: the latest frame as it was captured.
async fn snapshot(State(ctx): State<Arc<HostContext>>, Path(name): Path<String>) -> Response {
    let camera = match camera(&ctx, &name) {
        Ok(camera) => camera,
        Err(refusal) => return refusal.into_response(),
    };
    let frame = match recent(camera) {
        Ok(frame) => frame,
        Err(refusal) => return refusal.into_response(),
    };
    let age = frame.age_ms(Instant::now());
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("image/jpeg")),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
            (
                http::HeaderName::from_static("x-frame-age-ms"),
                HeaderValue::from(age),
            ),
            (
                http::HeaderName::from_static("x-frame-captured-unix-ms"),
                HeaderValue::from(frame.at_unix_ms),
            ),
        ],
        Body::from(frame.jpeg),
    )
        .into_response()
}

/// `GET /v1/cameras/{name}/stream.mjpeg`: frames as they come, at most
/// `max_stream_fps`, to at most `max_viewers` at once (`503` beyond);
/// ends when the daemon shuts down.
async fn stream(State(ctx): State<Arc<HostContext>>, Path(name): Path<String>) -> Response {
    let camera = match camera(&ctx, &name) {
        Ok(camera) => camera.clone(),
        Err(refusal) => return refusal.into_response(),
    };
    let Some(permit) = camera.viewer() else {
        return json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_viewers",
            &format!(
                "camera {:?} already streams to {} viewers (its max_viewers)",
                camera.name(),
                camera.spec.max_viewers
            ),
        )
        .into_response();
    };
    let mut frames = camera.subscribe();
    // The latest frame goes out at once.
    frames.mark_changed();
    let every = Duration::from_secs_f64(1.0 / camera.spec.max_stream_fps);
    let shutdown = ctx.shutdown.clone();
    let parts = futures_util::stream::unfold(
        (frames, permit, None::<tokio::time::Instant>),
        move |(mut frames, permit, last)| {
            let shutdown = shutdown.clone();
            async move {
                if let Some(last) = last {
                    tokio::select! {
                        () = shutdown.cancelled() => return None,
                        () = tokio::time::sleep_until(last + every) => {}
                    }
                }
                let frame = loop {
                    tokio::select! {
                        () = shutdown.cancelled() => return None,
                        changed = frames.changed() => changed.ok()?,
                    }
                    if let Some(frame) = frames.borrow_and_update().clone() {
                        break frame;
                    }
                };
                let head = mjpeg::part_header(frame.jpeg.len());
                let mut part = BytesMut::with_capacity(head.len() + frame.jpeg.len() + 2);
                part.put(head);
                part.put(frame.jpeg);
                part.put_slice(b"\r\n");
                let part: Bytes = part.freeze();
                Some((
                    Ok::<_, Infallible>(part),
                    (frames, permit, Some(tokio::time::Instant::now())),
                ))
            }
        },
    );
    let content_type = format!(
        "multipart/x-mixed-replace; boundary={}",
        mjpeg::STREAM_BOUNDARY
    );
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_str(&content_type)
                    .unwrap_or(HeaderValue::from_static("multipart/x-mixed-replace")),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        Body::from_stream(parts),
    )
        .into_response()
}
