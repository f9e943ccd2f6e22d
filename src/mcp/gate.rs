//! In front of rmcp at `/mcp` (inside authentication and the browser
//! checks): what rmcp's streamable HTTP server does not do itself.
//!
//! - **The body.** A POST's JSON body is read whole (at most
//!   [`MAX_BODY_BYTES`]) and must be a JSON-RPC message: one that does not
//!   parse — not JSON, nested deeper than serde_json's limit of 128 levels,
//!   not a JSON-RPC message — is `400` with a JSON-RPC error (rmcp answers
//!   such a body `415`, which says the content type was wrong).
//! - **Ownership.** A request naming a session (`Mcp-Session-Id`) passes only
//!   for the credential that opened it; to any other credential the session
//!   does not exist (`404`, as for a session that ended).
//! - **The cap.** An `initialize` gets a seat in the session table first
//!   ([`super::sessions::Table::admit`]), evicting an idle session if every
//!   seat is taken; when none is idle it is refused with `503` and a
//!   JSON-RPC error naming `mcp.max_sessions`. The seat travels to
//!   [`super::sessions::Manager::create_session`] as a task-local (rmcp calls
//!   it inside this request's future, and gives it nothing else).
//!
//! Every answer of its own is a JSON-RPC error object with HTTP status,
//! `{"jsonrpc": "2.0", "id": <the request's or null>, "error": {"code",
//! "message"}}`, as MCP clients read them.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt as _;
use http::{Method, StatusCode};
use http_body_util::BodyExt as _;
use rmcp::model::{ClientJsonRpcMessage, ClientRequest};
use serde_json::{Value, json};

use super::sessions::{Admission, Manager, Reservation, Sessions};
use crate::api::auth::Caller;

/// The largest body a POST to `/mcp` may have (rmcp's own limit is set to
/// the same).
pub(crate) const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// JSON-RPC's error codes, and the server-defined ones rozd answers.
pub(crate) mod code {
    /// The body is not JSON (or nested too deep for the parser).
    pub(crate) const PARSE_ERROR: i64 = -32700;
    /// JSON, but not a JSON-RPC message; or a body too large.
    pub(crate) const INVALID_REQUEST: i64 = -32600;
    /// `mcp.max_sessions` sessions exist and none is idle.
    pub(crate) const TOO_MANY_SESSIONS: i64 = -32000;
    /// The session named does not exist (ended, evicted, or another
    /// credential's).
    pub(crate) const SESSION_NOT_FOUND: i64 = -32001;
}

tokio::task_local! {
    /// The seat the `initialize` being handled holds.
    static SEAT: Reservation;
}

/// The seat held by the `initialize` this task is handling, if any.
pub(super) fn held_seat() -> Option<Reservation> {
    SEAT.try_with(|seat| *seat).ok()
}

/// What the gate works with.
pub(crate) struct Gate {
    pub sessions: Arc<Sessions>,
    pub manager: Arc<Manager>,
}

/// A JSON-RPC error answer with HTTP `status`.
pub(crate) fn jsonrpc_error(status: StatusCode, id: Value, code: i64, message: &str) -> Response {
    (
        status,
        axum::Json(json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {"code": code, "message": message},
        })),
    )
        .into_response()
}

/// Whether the request says its body is JSON (what rmcp requires; anything
/// else is left to rmcp, which answers `415`).
fn is_json(request: &Request) -> bool {
    request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
        })
}

/// Whether the client accepts both answers rmcp may give a POST (it
/// answers `406` otherwise, and no session is created).
fn accepts_both(request: &Request) -> bool {
    let accepted: Vec<String> = request
        .headers()
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|item| item.split(';').next())
        .map(|essence| essence.trim().to_ascii_lowercase())
        .collect();
    accepted.iter().any(|a| a == "application/json")
        && accepted.iter().any(|a| a == "text/event-stream")
}

/// Reads the body of a POST; the message it holds, or the answer to give.
async fn message(body: Body) -> Result<(axum::body::Bytes, ClientJsonRpcMessage), Response> {
    let bytes = match http_body_util::Limited::new(body, MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            return Err(jsonrpc_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                Value::Null,
                code::INVALID_REQUEST,
                &format!("the body is larger than {MAX_BODY_BYTES} bytes"),
            ));
        }
        Err(e) => {
            return Err(jsonrpc_error(
                StatusCode::BAD_REQUEST,
                Value::Null,
                code::INVALID_REQUEST,
                &format!("the body could not be read: {e}"),
            ));
        }
    };
    match serde_json::from_slice::<ClientJsonRpcMessage>(&bytes) {
        Ok(message) => Ok((bytes, message)),
        Err(e) => {
            let (code, what) = match e.classify() {
                serde_json::error::Category::Data => (
                    code::INVALID_REQUEST,
                    "is not a JSON-RPC message rozd takes",
                ),
                // Syntax, Eof, Io; nesting deeper than 128 levels is a
                // syntax error ("recursion limit exceeded").
                _ => (
                    code::PARSE_ERROR,
                    "is not JSON (or is nested deeper than 128 levels)",
                ),
            };
            Err(jsonrpc_error(
                StatusCode::BAD_REQUEST,
                Value::Null,
                code,
                &format!("the body {what}: {e}"),
            ))
        }
    }
}

/// The middleware in front of rmcp (see the module doc).
pub(crate) async fn check(State(gate): State<Arc<Gate>>, request: Request, next: Next) -> Response {
    let credential: Arc<str> = request
        .extensions()
        .get::<Caller>()
        .map_or_else(|| Arc::from(""), |c| c.credential.clone());
    let session = request
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap_or_default().to_string());
    let post = request.method() == Method::POST;
    // The body first: a body that is no message is answered as such.
    let (request, message) = if post && is_json(&request) {
        let (parts, body) = request.into_parts();
        match message(body).await {
            Ok((bytes, message)) => (Request::from_parts(parts, Body::from(bytes)), Some(message)),
            Err(answer) => return answer,
        }
    } else {
        (request, None)
    };
    let request_id = match &message {
        Some(ClientJsonRpcMessage::Request(r)) => {
            serde_json::to_value(&r.id).unwrap_or(Value::Null)
        }
        _ => Value::Null,
    };
    if let Some(id) = session {
        // A session that is not this credential's is not there, to it.
        let Some(guard) = gate.sessions.begin(&id, &credential, post) else {
            return jsonrpc_error(
                StatusCode::NOT_FOUND,
                request_id,
                code::SESSION_NOT_FOUND,
                "Session not found: it ended, was evicted (mcp.max_sessions), or was never this \
                 credential's; initialize a new one",
            );
        };
        let response = next.run(request).await;
        // The session is busy until the answer (an SSE stream for a call)
        // is finished or dropped.
        let (parts, body) = response.into_parts();
        let body = Body::from_stream(body.into_data_stream().map(move |chunk| {
            let _busy = &guard;
            chunk
        }));
        return Response::from_parts(parts, body);
    }
    let initialize = matches!(
        &message,
        Some(ClientJsonRpcMessage::Request(r)) if matches!(r.request, ClientRequest::InitializeRequest(_))
    );
    if !initialize || !accepts_both(&request) {
        // rmcp answers these without creating a session.
        return next.run(request).await;
    }
    match gate.sessions.admit(&credential) {
        Admission::Full { max } => {
            tracing::warn!(credential = %credential, max, "MCP initialize refused: mcp.max_sessions sessions exist and none is idle");
            jsonrpc_error(
                StatusCode::SERVICE_UNAVAILABLE,
                request_id,
                code::TOO_MANY_SESSIONS,
                &format!(
                    "rozd holds its limit of {max} MCP sessions (mcp.max_sessions) and each has a \
                     request in flight; try again when one ends"
                ),
            )
        }
        Admission::Seated {
            reservation,
            evicted,
        } => {
            let seat = SeatGuard {
                sessions: gate.sessions.clone(),
                reservation,
            };
            if let Some(evicted) = evicted {
                gate.manager.evict(&evicted).await;
            }
            let response = SEAT.scope(reservation, next.run(request)).await;
            drop(seat);
            response
        }
    }
}

/// Frees a seat its `initialize` did not turn into a session (an error, or
/// the client went away first); a seat that became a session is no longer
/// held and this does nothing.
struct SeatGuard {
    sessions: Arc<Sessions>,
    reservation: Reservation,
}

impl Drop for SeatGuard {
    fn drop(&mut self) {
        self.sessions.release(self.reservation);
    }
}
