//! The operator's dashboard: one page (`/ui`) and its assets, embedded in
//! the binary (no build step, no CDN: the robot may be offline), the live
//! stream the page reads (`GET /v1/observation/stream`), and the simulated
//! world's room for its map (`GET /v1/sim`).
//!
//! The page and its assets carry no data, so they need no token; everything
//! the page shows comes from token-checked routes, to which it sends the
//! token as a bearer header (never in a URL). The stream is server-sent
//! events over a plain streamed response, since `EventSource` cannot send
//! headers: the page reads it with `fetch()`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;

use super::reply::json_error;
use crate::HostContext;

/// The stream sends at most this many Observations a second.
pub(crate) const STREAM_MAX_HZ: u64 = 10;
/// How often the stream looks for changes of the slower sections
/// (status, tasks, hosts) and sends those that changed.
const SNAPSHOT_EVERY: Duration = Duration::from_secs(1);
/// Tasks the stream's `tasks` event lists (newest first).
const STREAM_TASKS: u32 = 20;
/// Hosts the dashboard's stream shows (the first, by id; it says how many
/// there are).
const DASHBOARD_HOSTS: usize = 200;

/// The page's files: path under `/ui/`, content type, bytes.
const ASSETS: &[(&str, &str, &[u8])] = &[
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("ui/app.js"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_bytes!("ui/app.css"),
    ),
    (
        "uPlot.iife.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("ui/vendor/uPlot.iife.min.js"),
    ),
    (
        "uPlot.min.css",
        "text/css; charset=utf-8",
        include_bytes!("ui/vendor/uPlot.min.css"),
    ),
    (
        "uPlot.LICENSE",
        "text/plain; charset=utf-8",
        include_bytes!("ui/vendor/uPlot.LICENSE"),
    ),
];

const INDEX: &[u8] = include_bytes!("ui/index.html");

/// Whether `path` is the page or one of its assets (served without a token).
pub(crate) fn is_page(path: &str) -> bool {
    path == "/ui"
        || path
            .strip_prefix("/ui/")
            .is_some_and(|name| ASSETS.iter().any(|(n, _, _)| *n == name))
}

pub(crate) fn routes() -> Router<Arc<HostContext>> {
    Router::new()
        .route("/ui", get(index))
        .route("/ui/{name}", get(asset))
        .route("/v1/observation/stream", get(stream))
        .route("/v1/sim", get(sim))
}

/// Headers of the page and its assets: same-origin scripts only, never framed
/// (a STOP or clear button must not be clickjacked), revalidated on reload.
/// Pictures may also be `blob:` URLs: the camera frames the page cuts from
/// `stream.mjpeg` (read with its token, so not an `<img src>` to the stream).
fn page_headers(content_type: &'static str) -> [(header::HeaderName, HeaderValue); 5] {
    [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(
                "default-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
            ),
        ),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
    ]
}

async fn index() -> Response {
    (page_headers("text/html; charset=utf-8"), INDEX).into_response()
}

async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, bytes)) => (page_headers(content_type), *bytes).into_response(),
        None => json_error(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!("no dashboard file {name:?}"),
        )
        .into_response(),
    }
}

/// `GET /v1/sim`: the simulated world's room, obstacles and rover.
async fn sim(State(ctx): State<Arc<HostContext>>) -> Response {
    let Some((spec, range_sensor)) = ctx.ooda.sim_spec() else {
        return json_error(
            StatusCode::NOT_FOUND,
            "not_found",
            "this host runs no simulated world",
        )
        .into_response();
    };
    axum::Json(json!({
        "width": spec.width,
        "depth": spec.depth,
        "rover_radius": spec.rover_radius,
        "max_range": spec.max_range,
        "obstacles": spec.obstacles.iter().map(|o| json!({
            "min_x": o.min_x, "min_y": o.min_y, "max_x": o.max_x, "max_y": o.max_y,
        })).collect::<Vec<_>>(),
        "range_sensor": range_sensor,
        "rover": ctx.ooda.sim_world(),
    }))
    .into_response()
}

/// One server-sent event.
fn frame(event: &str, id: u64, data: &Value) -> Bytes {
    Bytes::from(format!("id: {id}\nevent: {event}\ndata: {data}\n\n"))
}

/// `GET /v1/observation/stream`: server-sent events, one stream per page.
/// `observation` at most [`STREAM_MAX_HZ`] a second (only newer ticks than
/// the last sent); `safety` at once on every change of the stop;
/// `approvals` (every call waiting, as `GET /v1/approvals`) at once on every
/// change of that list; `rules` (as `GET /v1/rules`) at the start and at
/// most 10 times a second while rules change; `status`, `sessions` (as `GET /v1/sessions/open`),
/// `tasks` and `hosts` at the start and whenever they change. Every event's
/// id is the tick (`seq`) of the latest Observation sent, so a page that
/// reconnects with `Last-Event-ID` gets no Observation it already had; the
/// other sections are state, sent again in full at every connection.
async fn stream(State(ctx): State<Arc<HostContext>>, headers: HeaderMap) -> Response {
    let after = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(8);
    tokio::spawn(feed(ctx, after, tx));
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        body,
    )
        .into_response()
}

/// Writes the stream until the page goes away or the daemon shuts down.
async fn feed(ctx: Arc<HostContext>, after: u64, tx: mpsc::Sender<Result<Bytes, Infallible>>) {
    let mut last_seq = after;
    let mut pace = tokio::time::interval(Duration::from_millis(1000 / STREAM_MAX_HZ));
    pace.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut snapshots = tokio::time::interval(SNAPSHOT_EVERY);
    snapshots.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut stop = ctx.ooda.protective_stop().subscribe();
    stop.mark_changed();
    let mut approvals = ctx.approvals.subscribe();
    approvals.mark_changed();
    let mut rules = ctx.ooda.subscribe_rules();
    let mut rules_changed = true;
    let (mut status, mut tasks, mut hosts) = (Value::Null, Value::Null, Value::Null);
    let mut sessions = Value::Null;
    let send = |bytes: Bytes| {
        let tx = tx.clone();
        async move { tx.send(Ok(bytes)).await.is_ok() }
    };
    if !send(Bytes::from_static(b"retry: 1000\n\n")).await {
        return;
    }
    loop {
        let open = tokio::select! {
            () = ctx.shutdown.cancelled() => false,
            () = tx.closed() => false,
            changed = stop.changed() => match changed {
                Ok(()) => {
                    let state = stop.borrow_and_update().clone();
                    send(frame("safety", last_seq, &json!({
                        "active": state.is_active(),
                        "causes": state.causes,
                        "inputs_holding": ctx.ooda.protective_stop().held_inputs(),
                    })))
                    .await
                }
                Err(_) => false,
            },
            changed = approvals.changed() => match changed {
                Ok(()) => {
                    approvals.borrow_and_update();
                    let now = super::rest::open_sessions_json(&ctx);
                    let open = if now == sessions {
                        true
                    } else {
                        sessions = now;
                        send(frame("sessions", last_seq, &sessions)).await
                    };
                    open && send(frame("approvals", last_seq, &json!({ "data": ctx.approvals.list() }))).await
                }
                Err(_) => false,
            },
            changed = rules.changed() => match changed {
                // Sent at the next pace: a rule that flaps costs the page
                // no more than the Observation does.
                Ok(()) => {
                    rules.borrow_and_update();
                    rules_changed = true;
                    true
                }
                Err(_) => false,
            },
            _ = pace.tick() => {
                let mut open = true;
                if rules_changed {
                    rules_changed = false;
                    open &= send(frame("rules", last_seq, &json!({ "data": ctx.ooda.rules_view() }))).await;
                }
                let observation = ctx.ooda.observe_now();
                if observation.seq > last_seq {
                    last_seq = observation.seq;
                    open &= send(frame("observation", last_seq, &json!(observation))).await;
                }
                open
            }
            _ = snapshots.tick() => {
                let mut open = true;
                let now = super::rest::status_json(&ctx, None);
                if now != status {
                    status = now;
                    open &= send(frame("status", last_seq, &status)).await;
                }
                let now = super::rest::open_sessions_json(&ctx);
                if now != sessions {
                    sessions = now;
                    open &= send(frame("sessions", last_seq, &sessions)).await;
                }
                match crate::team::list(&ctx.team, STREAM_TASKS, 0).await {
                    Ok(list) => {
                        let now = json!(list);
                        if now != tasks {
                            tasks = now;
                            open &= send(frame("tasks", last_seq, &tasks)).await;
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "dashboard stream: cannot list tasks"),
                }
                // A page of the view: the dashboard of one host of a large
                // fleet does not stream the whole fleet every second.
                let page = ctx.fleet.page(None, 0, DASHBOARD_HOSTS);
                let now = json!({
                    "data": page.hosts.iter().map(super::hosts::host_json).collect::<Vec<_>>(),
                    "total": page.total,
                    "fleet": super::hosts::fleet_json(&ctx),
                });
                if now != hosts {
                    hosts = now;
                    open &= send(frame("hosts", last_seq, &hosts)).await;
                }
                open
            }
        };
        if !open {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_page_and_its_files_are_public() {
        assert!(is_page("/ui"));
        assert!(is_page("/ui/app.js"));
        assert!(is_page("/ui/uPlot.LICENSE"));
        assert!(!is_page("/ui/../v1/status"));
        assert!(!is_page("/ui/secret"));
        assert!(!is_page("/v1/observation/stream"));
    }

    #[test]
    fn a_frame_is_one_event() {
        let f = frame("observation", 7, &json!({"a": 1}));
        assert_eq!(&f[..], b"id: 7\nevent: observation\ndata: {\"a\":1}\n\n");
    }
}
