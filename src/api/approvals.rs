//! `GET /v1/approvals` and `POST /v1/approvals/{id}`: every call waiting
//! for an approval, an MCP client's, a session's or a task's (see
//! [`crate::session::approvals`]), listed and answered in one place, the
//! dashboard's and `rozd approvals`'. The first answer wins, whether it comes
//! from here or from the caller's own way (elicitation, `PermissionDecision`,
//! `/v1/tasks/{id}/approvals`).

use std::sync::Arc;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::auth::Caller;
use super::reply::{json_body, json_error};
use crate::HostContext;
use crate::session::host_call::own_approval_refused;

pub(super) fn routes() -> Router<Arc<HostContext>> {
    Router::new()
        .route("/v1/approvals", get(list))
        .route("/v1/approvals/{id}", post(answer))
}

/// Every call waiting for approval (MCP, session, task), oldest first.
async fn list(State(ctx): State<Arc<HostContext>>) -> Json<Value> {
    Json(json!({ "data": ctx.approvals.list() }))
}

/// `{"approve": true|false}` (or `{"approved": ...}`, the spelling of
/// `/v1/tasks/{id}/approvals`): the call stops waiting at once. With
/// `approvals.require_other_credential`, the credential that made the call
/// may deny it but not approve it (403, audited).
async fn answer(
    State(ctx): State<Arc<HostContext>>,
    caller: Option<Extension<Caller>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let approve = match json_body::<Answer>(&body) {
        Ok(answer) => match answer.decision() {
            Some(approve) => approve,
            None => return invalid("the body must be {\"approve\": true} or {\"approve\": false}"),
        },
        Err(why) => return invalid(&why),
    };
    let by = caller.as_ref().and_then(|c| c.named().map(str::to_string));
    match answer_call(&ctx, &id, approve, by, "POST /v1/approvals").await {
        Ok(view) => Json(json!({ "approved": approve, "call": view })).into_response(),
        Err(Refused::NotFound(why)) => {
            json_error(StatusCode::NOT_FOUND, "not_found", &why).into_response()
        }
        Err(Refused::OwnCall(why)) => {
            json_error(StatusCode::FORBIDDEN, "permission_denied", &why).into_response()
        }
    }
}

/// Why an answer was not taken.
#[derive(Debug)]
pub(super) enum Refused {
    /// No such call waits (or it was answered meanwhile).
    NotFound(String),
    /// `approvals.require_other_credential`: a credential approving its own
    /// call (audited).
    OwnCall(String),
}

/// Answers waiting call `id` as credential `by`, asked `via` (how the
/// audit names the request): the one path of every operator's answer
/// (REST, Foxglove).
pub(super) async fn answer_call(
    ctx: &HostContext,
    id: &str,
    approve: bool,
    by: Option<String>,
    via: &str,
) -> Result<crate::session::approvals::ApprovalView, Refused> {
    let Some(call) = ctx.approvals.get(id) else {
        let e = crate::session::approvals::ApprovalError::NotFound(id.to_string());
        return Err(Refused::NotFound(e.to_string()));
    };
    if let Err(own) = ctx
        .permissions
        .may_answer(call.credential.as_deref(), by.as_deref(), approve)
    {
        let why = own.to_string();
        tracing::warn!(tool_call_id = %call.tool_call_id, tool = %call.tool, credential = by.as_deref().unwrap_or(""), "refused: a credential approving its own call");
        let record = own_approval_refused(
            &call.session_id,
            &call.tool_call_id,
            &call.tool,
            &call.parameters,
            via,
            by.as_deref(),
            &why,
        );
        if let Err(e) = ctx.store.audit(record).await {
            tracing::error!(error = %e, "cannot write the audit record of a refused approval");
        }
        return Err(Refused::OwnCall(why));
    }
    match ctx.approvals.answer(id, approve, by.clone()) {
        Ok(view) => {
            tracing::info!(tool_call_id = %view.tool_call_id, kind = ?view.kind, tool = %view.tool, origin = %view.origin, approve, approved_by = by.as_deref().unwrap_or(""), via, "a call answered");
            Ok(view)
        }
        Err(e) => Err(Refused::NotFound(e.to_string())),
    }
}

/// The answer in a body: `{"approve": bool}` or `{"approved": bool}` (one
/// of them), and nothing else.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Answer {
    #[serde(default)]
    pub(super) approve: Option<bool>,
    #[serde(default)]
    pub(super) approved: Option<bool>,
}

impl Answer {
    /// The answer, when exactly one spelling gave it.
    pub(super) fn decision(&self) -> Option<bool> {
        match (self.approve, self.approved) {
            (Some(approve), None) | (None, Some(approve)) => Some(approve),
            _ => None,
        }
    }
}

fn invalid(message: &str) -> Response {
    json_error(StatusCode::BAD_REQUEST, "invalid_argument", message).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(text: &str) -> Option<bool> {
        json_body::<Answer>(text.as_bytes())
            .ok()
            .and_then(|a| a.decision())
    }

    #[test]
    fn both_spellings_of_an_answer_and_nothing_else() {
        assert_eq!(decision(r#"{"approve": true}"#), Some(true));
        assert_eq!(decision(r#"{"approved": false}"#), Some(false));
        assert_eq!(decision(r#"{"approve": "yes"}"#), None);
        assert_eq!(decision(r#"{"approve": true, "approved": true}"#), None);
        assert_eq!(decision(r#"{"approve": true, "note": 1}"#), None);
        assert_eq!(decision("{}"), None);
        let why = json_body::<Answer>(br#"{"approve": true, "note": 1}"#).unwrap_err();
        assert!(why.contains("unknown field `note`"), "{why}");
        let why = json_body::<Answer>(br#"{"approve": "yes"}"#).unwrap_err();
        assert!(why.starts_with("`approve`: invalid type"), "{why}");
        let why = json_body::<Answer>(b"[true]").unwrap_err();
        assert_eq!(why, "the body must be a JSON object");
        let why = json_body::<Answer>(b"{\"approve\": true} x").unwrap_err();
        assert!(why.starts_with("the body is not valid JSON"), "{why}");
    }
}
