//! REST endpoints (HTTP/1.1 and HTTP/2) beside gRPC on the same listener.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use http::StatusCode;
use serde_json::json;

use crate::HostContext;

pub fn routes() -> Router<Arc<HostContext>> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/v1/status", get(status))
}

/// The error body every REST error uses: `{"error": {"code", "message"}}`.
pub fn json_error(
    status: StatusCode,
    code: &str,
    message: &str,
) -> (StatusCode, Json<serde_json::Value>) {
    (
        status,
        Json(json!({ "error": { "code": code, "message": message } })),
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

async fn status(State(ctx): State<Arc<HostContext>>) -> Json<serde_json::Value> {
    let c = &ctx.config;
    Json(json!({
        "host_id": c.host.id,
        "name": c.host.display_name(),
        "environment_id": c.host.environment_id,
        "version": crate::VERSION,
        "uptime_secs": ctx.started_at.elapsed().as_secs(),
        "listen": ctx.listen_addr.to_string(),
        "auth_required": c.auth_required(),
        "sessions": {
            "active": ctx.sessions.active(),
            "total": ctx.sessions.total(),
        },
        "sensors": c.sensors.len(),
        "actuators": c.actuators.len(),
    }))
}

/// Unknown paths: gRPC clients get `UNIMPLEMENTED`, everyone else a JSON 404.
pub async fn fallback(request: Request) -> Response {
    if super::auth::is_grpc(&request) {
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

pub async fn method_not_allowed(request: Request) -> Response {
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
