//! `GET /v1/approvals` and `POST /v1/approvals/{id}`: MCP calls waiting for
//! an operator's approval (see [`crate::mcp::approvals`]). Tasks answer
//! their own at `/v1/tasks/{id}/approvals`.

use std::sync::Arc;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http::StatusCode;
use serde_json::{Value, json};

use super::auth::Caller;
use super::reply::json_error;
use crate::HostContext;
use crate::session::host_call::own_approval_refused;

pub fn routes() -> Router<Arc<HostContext>> {
    Router::new()
        .route("/v1/approvals", get(list))
        .route("/v1/approvals/{id}", post(answer))
}

/// Every call waiting for approval, oldest first.
async fn list(State(ctx): State<Arc<HostContext>>) -> Json<Value> {
    Json(json!({ "data": ctx.mcp.approvals.list() }))
}

/// `{"approve": true|false}`: the call stops waiting at once. With
/// `approvals.require_other_credential`, the credential that made the call
/// may deny it but not approve it (403, audited).
async fn answer(
    State(ctx): State<Arc<HostContext>>,
    caller: Option<Extension<Caller>>,
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
    let by = caller.as_ref().and_then(|c| c.named().map(str::to_string));
    let Some(call) = ctx.mcp.approvals.get(&id) else {
        let e = crate::mcp::approvals::ApprovalError::NotFound(id);
        return json_error(StatusCode::NOT_FOUND, "not_found", &e.to_string()).into_response();
    };
    if let Err(own) = ctx
        .permissions
        .may_answer(call.credential.as_deref(), by.as_deref(), approve)
    {
        let why = own.to_string();
        tracing::warn!(tool_call_id = %call.id, tool = %call.tool, credential = by.as_deref().unwrap_or(""), "refused: a credential approving its own MCP call");
        let record = own_approval_refused(
            &call.session_id,
            &call.id,
            &call.tool,
            &call.parameters,
            "POST /v1/approvals",
            by.as_deref(),
            &why,
        );
        if let Err(e) = ctx.store.audit(record).await {
            tracing::error!(error = %e, "cannot write the audit record of a refused approval");
        }
        return json_error(StatusCode::FORBIDDEN, "permission_denied", &why).into_response();
    }
    match ctx.mcp.approvals.answer(&id, approve, by.clone()) {
        Ok(view) => {
            tracing::info!(tool_call_id = %view.id, tool = %view.tool, origin = %view.origin, approve, approved_by = by.as_deref().unwrap_or(""), "an MCP call answered over REST");
            Json(json!({ "approved": approve, "call": view })).into_response()
        }
        Err(e) => json_error(StatusCode::NOT_FOUND, "not_found", &e.to_string()).into_response(),
    }
}

fn invalid(message: &str) -> Response {
    json_error(StatusCode::BAD_REQUEST, "invalid_argument", message).into_response()
}
