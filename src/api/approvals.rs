//! `GET /v1/approvals` and `POST /v1/approvals/{id}`: MCP calls waiting for
//! an operator's approval (see [`crate::mcp::approvals`]). Tasks answer
//! their own at `/v1/tasks/{id}/approvals`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http::StatusCode;
use serde_json::{Value, json};

use super::reply::json_error;
use crate::HostContext;

pub fn routes() -> Router<Arc<HostContext>> {
    Router::new()
        .route("/v1/approvals", get(list))
        .route("/v1/approvals/{id}", post(answer))
}

/// Every call waiting for approval, oldest first.
async fn list(State(ctx): State<Arc<HostContext>>) -> Json<Value> {
    Json(json!({ "data": ctx.mcp.approvals.list() }))
}

/// `{"approve": true|false}`: the call stops waiting at once.
async fn answer(
    State(ctx): State<Arc<HostContext>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let approve = match serde_json::from_slice::<Value>(&body) {
        Ok(Value::Object(map)) => match (map.get("approve"), map.len()) {
            (Some(Value::Bool(approve)), 1) => *approve,
            _ => return invalid("the body must be {\"approve\": true} or {\"approve\": false}"),
        },
        Ok(_) => return invalid("the body must be a JSON object"),
        Err(e) => return invalid(&format!("the body is not valid JSON: {e}")),
    };
    match ctx.mcp.approvals.answer(&id, approve) {
        Ok(view) => {
            tracing::info!(tool_call_id = %view.id, tool = %view.tool, origin = %view.origin, approve, "operator answered an MCP call over REST");
            Json(json!({ "approved": approve, "call": view })).into_response()
        }
        Err(e) => json_error(StatusCode::NOT_FOUND, "not_found", &e.to_string()).into_response(),
    }
}

fn invalid(message: &str) -> Response {
    json_error(StatusCode::BAD_REQUEST, "invalid_argument", message).into_response()
}
