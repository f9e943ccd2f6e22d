//! REST endpoints (HTTP/1.1 and HTTP/2) beside gRPC on the same listener.

use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::reply::{is_grpc, json_error};
use crate::HostContext;
use crate::store::{StoreError, TurnRecord};

/// `GET /v1/sessions` page size when `limit` is not given.
pub(super) const DEFAULT_SESSIONS_LIMIT: u32 = 50;
/// The largest `limit` `GET /v1/sessions` accepts.
pub(super) const MAX_SESSIONS_LIMIT: u32 = 500;

pub(super) fn routes() -> Router<Arc<HostContext>> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/v1/status", get(status))
        .route("/v1/sessions", get(sessions))
        .route("/v1/sessions/open", get(open_sessions))
        .route("/v1/sessions/{id}", get(session))
        .route("/v1/observation", get(observation))
        .route("/v1/audit", get(audit))
        .route("/v1/rules", get(rules))
        .route("/v1/actuators", get(actuators))
        .route("/v1/sensors", get(sensors))
        .route("/v1/sensors/{name}", get(sensor))
        .route("/metrics", get(metrics))
        .route("/v1/sim/faults", post(sim_faults))
}

/// `POST /v1/sim/faults` (admin): the simulated world's faults from now on,
/// for demos and tests of actuator feedback. The body is the whole set
/// (`stuck_drive`, `drive_slip`, `echo_wheel_speed`; left out: none).
async fn sim_faults(State(ctx): State<Arc<HostContext>>, body: axum::body::Bytes) -> Response {
    let invalid = |message: String| {
        json_error(StatusCode::BAD_REQUEST, "invalid_argument", &message).into_response()
    };
    let faults: crate::hw::sim_world::SimFaults = if body.iter().all(u8::is_ascii_whitespace) {
        Default::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(faults) => faults,
            Err(e) => return invalid(format!("the body is not a set of faults: {e}")),
        }
    };
    match ctx.ooda.set_sim_faults(faults) {
        Some(Ok(())) => {
            tracing::warn!(?faults, "simulated faults set");
            Json(json!({ "faults": faults })).into_response()
        }
        Some(Err(why)) => invalid(why),
        None => json_error(
            StatusCode::NOT_FOUND,
            "not_found",
            "this host runs no simulated world",
        )
        .into_response(),
    }
}

/// `GET /metrics`: every metric, the daemon's state sampled now; OpenMetrics
/// when the client asks for it (Prometheus does), else the classic text format.
async fn metrics(State(ctx): State<Arc<HostContext>>, headers: http::HeaderMap) -> Response {
    let accept = headers
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok());
    let format = crate::metrics::Format::from_accept(accept);
    match super::metrics::render(&ctx, format) {
        Ok(text) => ([(http::header::CONTENT_TYPE, format.content_type())], text).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "cannot encode the metrics");
            json_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "cannot encode the metrics; see the daemon log",
            )
            .into_response()
        }
    }
}

/// The routes the local control socket serves besides the safety ones.
pub(super) fn control_routes() -> Router<Arc<HostContext>> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/v1/status", get(status))
        .route("/v1/observation", get(observation))
}

/// The latest Observation of the OODA loop.
async fn observation(State(ctx): State<Arc<HostContext>>) -> Response {
    // As of now: an actuator shows a command as soon as it is applied.
    let observation = ctx.ooda.observe_now();
    if ctx.cameras.is_empty() {
        return Json(observation).into_response();
    }
    // Each camera's health beside the sensors (never its pictures).
    let mut value = json!(observation);
    if let Some(map) = value.as_object_mut() {
        map.insert("cameras".into(), json!(ctx.cameras.views()));
    }
    Json(value).into_response()
}

/// Every sensor's latest value, age, health and alarm.
async fn sensors(State(ctx): State<Arc<HostContext>>) -> Json<serde_json::Value> {
    Json(json!({ "data": ctx.ooda.observation().sensors }))
}

/// One sensor with its recent history (oldest first).
async fn sensor(State(ctx): State<Arc<HostContext>>, Path(name): Path<String>) -> Response {
    let now = tokio::time::Instant::now();
    match ctx.ooda.world().sensor(&name, now) {
        Some((view, history)) => {
            let alarm = ctx
                .ooda
                .observation()
                .sensor(&name)
                .map(|s| s.alarm)
                .unwrap_or_default();
            let spec = ctx.ooda.world().specs().iter().find(|s| s.name == name);
            Json(json!({
                "sensor": view,
                "alarm": alarm,
                "stale_after_ms": spec.and_then(|s| s.stale_after).map(|d| d.as_millis() as u64),
                "limits": spec.map(|s| json!({
                    "warn_min": s.alarms.warn_min,
                    "warn_max": s.alarms.warn_max,
                    "critical_min": s.alarms.critical_min,
                    "critical_max": s.alarms.critical_max,
                })),
                "digital": spec.is_some_and(|s| is_digital(&s.source)),
                "history": history,
                "trend": ctx.ooda.world().trend(&name, now).unwrap_or_default(),
            }))
            .into_response()
        }
        None => json_error(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!("no sensor named {name:?}"),
        )
        .into_response(),
    }
}

/// A sensor that reads only 0 or 1: a GPIO input, the world's bumper or gripper.
fn is_digital(source: &crate::hw::config::SensorSource) -> bool {
    use crate::hw::config::SensorSource;
    use crate::hw::sim_world::Quantity;
    matches!(
        source,
        SensorSource::Gpio { .. } | SensorSource::World(Quantity::Bumper | Quantity::Holding)
    )
}

async fn healthz(State(ctx): State<Arc<HostContext>>) -> Response {
    if ctx.shutdown.is_cancelled() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "stopping" })),
        )
            .into_response();
    }
    Json(json!({ "status": "ok" })).into_response()
}

async fn status(
    State(ctx): State<Arc<HostContext>>,
    peer: Option<axum::Extension<crate::tls::PeerIdentity>>,
) -> Json<serde_json::Value> {
    Json(status_json(
        &ctx,
        peer.map(|axum::Extension(peer)| peer.subject),
    ))
}

/// The `/v1/status` answer (also the dashboard stream's `status` event);
/// `client_certificate` is the caller's verified certificate subject.
pub(super) fn status_json(
    ctx: &HostContext,
    client_certificate: Option<String>,
) -> serde_json::Value {
    let c = &ctx.config;
    let stop = ctx.ooda.protective_stop().state();
    json!({
        "host_id": c.host.id,
        "name": c.host.display_name(),
        "environment_id": c.host.environment_id,
        "version": crate::VERSION,
        "uptime_secs": ctx.started_at.elapsed().as_secs(),
        "listen": ctx.listen_addr.to_string(),
        "auth_required": c.auth_required(),
        "tls": ctx
            .tls
            .get()
            .map_or_else(crate::tls::TlsStatus::disabled, |tls| tls.status()),
        // The subject of the caller's verified client certificate, if it
        // presented one: what `[[server.clients]]` would match.
        "client_certificate": client_certificate,
        "sessions": {
            "active": ctx.sessions.active(),
            "started": ctx.sessions.started(),
            "max": c.session.max_sessions,
            "total": ctx.sessions.total(),
        },
        "sensors": c.hardware.sensors.len(),
        "actuators": c.hardware.actuators.len(),
        "protective_stop": stop.first(),
        "protective_stop_causes": stop.causes,
        "ooda": ctx.ooda.stats(),
        "sim": ctx.ooda.sim_world(),
        "mqtt": ctx.ooda.mqtt().map(|m| {
            let mut hardware = json!(m.stats());
            if let (Some(object), Some(stop)) = (hardware.as_object_mut(), m.stop_input_stats()) {
                object.insert("stop_input".into(), json!(stop));
            }
            hardware
        }),
        "fleet": ctx.fleet.link_stats(),
        "recording": ctx.recorder.status(),
        "cameras": ctx.cameras.views(),
        // Whether the store writes: PHYSICAL calls are refused while it does not.
        "store": ctx.store.health(),
        // Every call waiting at /v1/approvals (MCP, sessions, tasks).
        "pending_approvals": ctx.approvals.len(),
        "mcp": ctx.config.mcp.enabled.then(|| {
            let sessions = ctx.mcp.sessions.stats();
            json!({
                "sessions": sessions.sessions,
                "max_sessions": sessions.max_sessions,
                "sessions_evicted": sessions.sessions_evicted,
                "sessions_refused": sessions.sessions_refused,
                "pending_approvals": ctx
                    .approvals
                    .list()
                    .iter()
                    .filter(|a| a.kind == crate::session::approvals::Asker::Mcp)
                    .count(),
            })
        }),
    })
}

/// Query of `GET /v1/sessions`. Values are strings so that a bad value is
/// reported by us as JSON, not by the extractor as plain text.
#[derive(Debug, Deserialize)]
struct SessionsQuery {
    limit: Option<String>,
    offset: Option<String>,
}

fn invalid_argument(message: &str) -> Response {
    json_error(StatusCode::BAD_REQUEST, "invalid_argument", message).into_response()
}

/// A store failure: logged with its cause, answered without internals.
fn store_failure(what: &str, error: &StoreError) -> Response {
    tracing::error!(error = %error, "{what} failed");
    json_error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        &format!("{what} failed; see the daemon log"),
    )
    .into_response()
}

/// Parses `limit` and `offset`: `limit` in 1..=500 (default 50), `offset` >= 0 (default 0).
fn page(query: &SessionsQuery) -> Result<(u32, u32), String> {
    let limit = match query.limit.as_deref() {
        None => DEFAULT_SESSIONS_LIMIT,
        Some(text) => match text.parse::<u32>() {
            Ok(n) if (1..=MAX_SESSIONS_LIMIT).contains(&n) => n,
            _ => {
                return Err(format!(
                    "limit {text:?} is not a whole number from 1 to {MAX_SESSIONS_LIMIT}"
                ));
            }
        },
    };
    let offset = match query.offset.as_deref() {
        None => 0,
        Some(text) => text.parse::<u32>().map_err(|_| {
            format!(
                "offset {text:?} is not a whole number from 0 to {}",
                u32::MAX
            )
        })?,
    };
    Ok((limit, offset))
}

/// `GET /v1/sessions?limit=N&offset=M`: recorded sessions, newest first.
async fn sessions(
    State(ctx): State<Arc<HostContext>>,
    query: Result<Query<SessionsQuery>, QueryRejection>,
) -> Response {
    let query = match query {
        Ok(Query(query)) => query,
        Err(rejection) => {
            return invalid_argument(&format!("invalid query: {}", rejection.body_text()));
        }
    };
    let (limit, offset) = match page(&query) {
        Ok(page) => page,
        Err(message) => return invalid_argument(&message),
    };
    match ctx.store.sessions(limit, offset).await {
        Ok(data) => Json(json!({ "data": data })).into_response(),
        Err(e) => store_failure("listing sessions", &e),
    }
}

/// `GET /v1/actuators`: every actuator as configured: what it accepts, its
/// safe value, how long a command holds.
async fn actuators(State(ctx): State<Arc<HostContext>>) -> Json<Value> {
    let data: Vec<Value> = ctx
        .config
        .actuators
        .iter()
        .map(|a| {
            json!({
                "name": a.name,
                "unit": a.unit,
                "description": a.description,
                "min": a.min,
                "max": a.max,
                "allowed": a.allowed,
                "safe_value": a.safe_value,
                "hold_ms": a.hold_ms,
                "max_rate_hz": a.max_rate_hz,
                "shared": a.shared,
            })
        })
        .collect();
    Json(json!({ "data": data }))
}

/// `GET /v1/rules`: every reflex rule, its condition, action and state.
async fn rules(State(ctx): State<Arc<HostContext>>) -> Json<Value> {
    Json(json!({ "data": ctx.ooda.rules_view() }))
}

/// `GET /v1/sessions/open`: every session open now.
async fn open_sessions(State(ctx): State<Arc<HostContext>>) -> Json<Value> {
    Json(open_sessions_json(&ctx))
}

/// Every session open now, the oldest first within each kind: gRPC session
/// streams served here (`grpc`), those relayed through here to another
/// host (`relayed`), then MCP sessions (`mcp`); each with the calls it has
/// waiting for approval.
pub(super) fn open_sessions_json(ctx: &HostContext) -> Value {
    let waiting = ctx.approvals.list();
    let waiting_for = |owner: &str| waiting.iter().filter(|a| a.session_id == owner).count();
    let mut data: Vec<Value> = ctx
        .sessions
        .open()
        .into_iter()
        .map(|s| {
            let approvals = s.id.as_deref().map_or(0, waiting_for);
            json!({
                "kind": s.kind,
                "id": s.id,
                "credential": s.credential,
                "opened_unix_ms": s.opened_unix_ms,
                "model": s.model,
                "host_id": s.host_id,
                "pending_approvals": approvals,
            })
        })
        .collect();
    if ctx.config.mcp.enabled {
        for s in ctx.mcp.sessions.list() {
            let owner = crate::mcp::sessions::owner(&s.id);
            data.push(json!({
                "kind": "mcp",
                "id": s.id,
                "credential": s.credential,
                "opened_unix_ms": s.opened_unix_ms,
                "last_active_unix_ms": s.last_active_unix_ms,
                "listening": s.listening,
                "in_flight": s.in_flight,
                "pending_approvals": waiting_for(&owner),
            }));
        }
    }
    json!({ "data": data })
}

/// Query of `GET /v1/audit`; strings so bad values get a JSON 400.
#[derive(Debug, Deserialize)]
struct AuditQuery {
    since: Option<String>,
    session: Option<String>,
    limit: Option<String>,
    order: Option<String>,
}

/// `GET /v1/audit?since=<unix ms>&session=<id>&limit=<n>&order=asc|desc`:
/// physical actions, oldest first (`order=desc`: newest first).
async fn audit(
    State(ctx): State<Arc<HostContext>>,
    query: Result<Query<AuditQuery>, QueryRejection>,
) -> Response {
    let query = match query {
        Ok(Query(query)) => query,
        Err(rejection) => {
            return invalid_argument(&format!("invalid query: {}", rejection.body_text()));
        }
    };
    let since = match query.since.as_deref().map(str::parse::<i64>).transpose() {
        Ok(since) => since,
        Err(_) => return invalid_argument("since must be a unix time in milliseconds"),
    };
    let limit = match query.limit.as_deref().map(str::parse::<u32>).transpose() {
        Ok(Some(l)) if (1..=5000).contains(&l) => l,
        Ok(None) => 500,
        _ => return invalid_argument("limit must be an integer from 1 to 5000"),
    };
    let order = match query.order.as_deref() {
        None | Some("asc") => crate::store::AuditOrder::OldestFirst,
        Some("desc") => crate::store::AuditOrder::NewestFirst,
        Some(_) => {
            return invalid_argument("order must be asc (oldest first) or desc (newest first)");
        }
    };
    match ctx
        .store
        .audit_records_ordered(since, query.session.filter(|s| !s.is_empty()), limit, order)
        .await
    {
        Ok(data) => Json(json!({ "data": data })).into_response(),
        Err(e) => store_failure("reading the audit", &e),
    }
}

/// `GET /v1/sessions/{id}`: one session and its turns in order.
async fn session(
    State(ctx): State<Arc<HostContext>>,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    let id = match id {
        Ok(Path(id)) => id,
        Err(rejection) => {
            return invalid_argument(&format!("invalid session id: {}", rejection.body_text()));
        }
    };
    match ctx.store.session(id.clone()).await {
        Ok(Some((session, turns))) => Json(json!({
            "session": session,
            "turns": turns.iter().map(turn_json).collect::<Vec<_>>(),
        }))
        .into_response(),
        Ok(None) => json_error(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!("no session {id:?}"),
        )
        .into_response(),
        Err(e) => store_failure("reading the session", &e),
    }
}

fn turn_json(t: &TurnRecord) -> serde_json::Value {
    json!({
        "seq": t.seq,
        "message_id": t.message_id,
        "ai_mode": t.ai_mode,
        "user_content": t.user_content,
        "messages": t.messages,
        "stop_reason": t.stop_reason,
        "input_tokens": t.input_tokens,
        "output_tokens": t.output_tokens,
        "cache_read_tokens": t.cache_read_tokens,
        "cache_creation_tokens": t.cache_creation_tokens,
        "started_at_ms": t.started_at_ms,
        "ended_at_ms": t.ended_at_ms,
    })
}

/// Unknown paths: gRPC clients get `UNIMPLEMENTED`, everyone else a JSON 404.
pub(super) async fn fallback(request: Request) -> Response {
    if is_grpc(&request) {
        return tonic::Status::unimplemented(format!("no gRPC method {}", request.uri().path()))
            .into_http::<axum::body::Body>();
    }
    json_error(
        StatusCode::NOT_FOUND,
        "not_found",
        &format!("no route for {} {}", request.method(), request.uri().path()),
    )
    .into_response()
}

pub(super) async fn method_not_allowed(request: Request) -> Response {
    json_error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        &format!(
            "{} is not allowed on {}",
            request.method(),
            request.uri().path()
        ),
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(limit: Option<&str>, offset: Option<&str>) -> SessionsQuery {
        SessionsQuery {
            limit: limit.map(str::to_string),
            offset: offset.map(str::to_string),
        }
    }

    #[test]
    fn page_defaults_and_bounds() {
        assert_eq!(page(&q(None, None)), Ok((DEFAULT_SESSIONS_LIMIT, 0)));
        assert_eq!(page(&q(Some("1"), Some("7"))), Ok((1, 7)));
        assert_eq!(page(&q(Some("500"), None)), Ok((500, 0)));
        for bad in ["0", "501", "-1", "ten", "", "1.5"] {
            assert!(page(&q(Some(bad), None)).is_err(), "limit {bad:?}");
        }
        for bad in ["-1", "x", "", "4294967296"] {
            assert!(page(&q(None, Some(bad))).is_err(), "offset {bad:?}");
        }
    }
}
