//! The protective stop over the network: `roz.v1.SafetyService` (gRPC) and
//! `GET /v1/safety`, `POST /v1/estop`, `POST /v1/estop/clear` (REST). Both
//! sit behind the same bearer-token check as every other route, so clearing
//! always needs an authenticated request when tokens are configured.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use http::{HeaderMap, StatusCode};
use serde::Deserialize;
use tonic::{Request, Status};

use super::ControlSocket;
use super::auth::Caller;
use super::reply::json_error;
use crate::HostContext;
use crate::proto::{self, safety_service_server::SafetyService};
use crate::safety::status::{SafetyStatus, status};

use crate::safety::{ClearRequest, StopRequest, StopSource};

/// The source of a stop triggered through `SafetyService`.
const GRPC_SOURCE: &StopSource = &StopSource::Grpc;

/// Longest reason kept (longer ones are cut, never refused: a stop must not
/// fail over its wording).
const MAX_REASON_CHARS: usize = 500;

/// The safety state now, from this daemon's loop and configuration.
fn safety_now(ctx: &HostContext) -> SafetyStatus {
    status(
        &ctx.ooda,
        &ctx.config.safety,
        &ctx.config.host.environment_id,
    )
}

pub(super) struct SafetyApi {
    ctx: Arc<HostContext>,
}

impl SafetyApi {
    pub(super) fn new(ctx: Arc<HostContext>) -> Self {
        SafetyApi { ctx }
    }

    /// An empty `environment_id` means this host's; another one is not here.
    fn check_environment(&self, environment_id: &str) -> Result<(), Status> {
        let ours = &self.ctx.config.host.environment_id;
        if environment_id.is_empty() || environment_id == ours {
            Ok(())
        } else {
            Err(Status::not_found(format!(
                "environment {environment_id:?} is not served by this host (its environment is {ours:?})"
            )))
        }
    }
}

/// A reason as given, without control characters and cut to
/// [`MAX_REASON_CHARS`]; `default` when empty.
pub(super) fn clean_reason(reason: Option<&str>, default: &str) -> String {
    let reason: String = reason
        .unwrap_or_default()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_REASON_CHARS)
        .collect();
    let reason = reason.trim();
    if reason.is_empty() {
        default.to_string()
    } else {
        reason.to_string()
    }
}

#[tonic::async_trait]
impl SafetyService for SafetyApi {
    async fn get_safety_status(
        &self,
        request: Request<proto::GetSafetyStatusRequest>,
    ) -> Result<tonic::Response<proto::SafetyStatus>, Status> {
        self.check_environment(&request.get_ref().environment_id)?;
        let s = safety_now(&self.ctx);
        Ok(tonic::Response::new(proto::SafetyStatus {
            environment_id: s.environment_id,
            estop_active: s.estop_active,
            level: s.level.to_string(),
            active_guards: s.active_guards,
        }))
    }

    async fn trigger_estop(
        &self,
        request: Request<proto::TriggerEstopRequest>,
    ) -> Result<tonic::Response<proto::TriggerEstopResponse>, Status> {
        let credential = caller_name(request.extensions());
        let request = request.into_inner();
        self.check_environment(&request.environment_id)?;
        let reason = clean_reason(Some(&request.reason), "TriggerEstop (gRPC)");
        self.ctx
            .ooda
            .trigger_stop(StopRequest::new(GRPC_SOURCE, &reason).credential(credential.as_deref()))
            .await;
        Ok(tonic::Response::new(proto::TriggerEstopResponse {}))
    }

    async fn clear_estop(
        &self,
        request: Request<proto::ClearEstopRequest>,
    ) -> Result<tonic::Response<proto::ClearEstopResponse>, Status> {
        let credential = caller_name(request.extensions());
        let request = request.into_inner();
        self.check_environment(&request.environment_id)?;
        let reason = clean_reason(Some(&request.reason), "ClearEstop (gRPC)");
        let latch = self.ctx.ooda.protective_stop();
        let by = format!("{GRPC_SOURCE}: {reason}");
        let cleared = latch
            .clear(ClearRequest::all(&by).credential(credential.as_deref()))
            .await;
        match cleared {
            Ok(_) => Ok(tonic::Response::new(proto::ClearEstopResponse {})),
            Err(refused) => Err(Status::failed_precondition(refused.to_string())),
        }
    }
}

/// The name of the credential that made a request (see `auth::Caller`).
pub(super) fn caller_name(extensions: &http::Extensions) -> Option<String> {
    extensions
        .get::<Caller>()
        .and_then(|c| c.named().map(str::to_string))
}

// ------------------------------------------------------------------ REST

pub(super) fn routes() -> Router<Arc<HostContext>> {
    Router::new()
        .route("/v1/safety", get(get_status))
        .route("/v1/estop", post(trigger))
        .route("/v1/estop/clear", post(clear))
}

/// The optional JSON body of `POST /v1/estop` and `POST /v1/estop/clear`.
#[derive(Debug, Default, Deserialize)]
struct StopBodyFields {
    #[serde(default)]
    reason: Option<String>,
}

/// An empty body is the default request (no reason); anything else must be
/// a JSON object whose fields, if present, have the right types.
pub(super) fn parse_body<T: Default + serde::de::DeserializeOwned>(
    body: &[u8],
) -> Result<T, String> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    if !value.is_object() {
        let kind = match value {
            serde_json::Value::Null => "null",
            serde_json::Value::Bool(_) => "a boolean",
            serde_json::Value::Number(_) => "a number",
            serde_json::Value::String(_) => "a string",
            _ => "an array",
        };
        return Err(format!("got {kind}"));
    }
    serde_json::from_value(value).map_err(|e| e.to_string())
}

fn bad_body(why: &str) -> Response {
    json_error(
        StatusCode::BAD_REQUEST,
        "invalid_argument",
        &format!("the body must be empty or a JSON object {{\"reason\": \"...\"}}: {why}"),
    )
    .into_response()
}

/// Who asked: `control-socket` for the local control socket, `cli` for the
/// `rozd` command line over TCP, else `rest`.
pub(super) fn rest_source(headers: &HeaderMap, control: Option<&ControlSocket>) -> StopSource {
    if control.is_some() {
        return StopSource::ControlSocket;
    }
    let cli = headers
        .get(http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ua| ua.starts_with(crate::proto::CLI_USER_AGENT_PREFIX));
    if cli {
        StopSource::Cli
    } else {
        StopSource::Rest
    }
}

fn status_json(s: SafetyStatus, extra: (&str, bool)) -> Response {
    Json(status_value(s, extra)).into_response()
}

fn status_value(s: SafetyStatus, extra: (&str, bool)) -> serde_json::Value {
    let mut value = serde_json::to_value(s).unwrap_or_default();
    if let Some(object) = value.as_object_mut() {
        object.insert(extra.0.to_string(), extra.1.into());
    }
    value
}

/// `GET /v1/safety`.
async fn get_status(State(ctx): State<Arc<HostContext>>) -> Json<SafetyStatus> {
    Json(safety_now(&ctx))
}

/// The most of a stop request's body that is read: a reason is short, and a
/// larger body must not delay (or be able to refuse) the stop.
const STOP_BODY_READ: usize = 64 * 1024;

/// How long a stop request's body is waited for once the stop has latched
/// without it (a body that stalls, trickles, or waits for `100 Continue`).
pub(super) const STOP_BODY_WITHIN: std::time::Duration = std::time::Duration::from_secs(3);

/// A stop request's body, at most [`STOP_BODY_READ`] of it; `Err` says why
/// it cannot be used (the stop goes ahead without it).
async fn read_stop_body(body: axum::body::Body) -> Result<Bytes, String> {
    use http_body_util::BodyExt as _;
    match http_body_util::Limited::new(body, STOP_BODY_READ)
        .collect()
        .await
    {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(format!("over {STOP_BODY_READ} bytes"))
        }
        Err(e) => Err(format!("the body could not be read: {e}")),
    }
}

/// A stop request's body, as far as it has come: `Ready` when all of it
/// was there at once (the usual case: it came with the head), else the
/// rest of the read, which the caller awaits (bounded) only after it has
/// latched the stop.
pub(super) enum StopBody {
    Ready(Result<Bytes, String>),
    Pending(std::pin::Pin<Box<dyn std::future::Future<Output = Result<Bytes, String>> + Send>>),
}

impl StopBody {
    /// Reads what is there now, without waiting.
    pub(super) async fn start(body: axum::body::Body) -> StopBody {
        let mut read = Box::pin(read_stop_body(body));
        tokio::select! {
            biased;
            result = &mut read => StopBody::Ready(result),
            () = std::future::ready(()) => StopBody::Pending(read),
        }
    }

    /// The rest of the body, waited for at most [`STOP_BODY_WITHIN`].
    pub(super) async fn finish(self) -> Result<Bytes, String> {
        match self {
            StopBody::Ready(result) => result,
            StopBody::Pending(read) => tokio::time::timeout(STOP_BODY_WITHIN, read)
                .await
                .unwrap_or_else(|_| {
                    Err(format!(
                        "the body did not arrive within {} s of the stop",
                        STOP_BODY_WITHIN.as_secs()
                    ))
                }),
        }
    }
}

/// `POST /v1/estop`: latches the stop (adding this source's cause); answers
/// once every actuator was driven to its safe value and the latch is on disk.
/// `triggered` says whether this added a cause. The stop never waits for
/// its request's body: a body that is not all there when the head arrives
/// (it stalls, trickles, or waits for `100 Continue`) is read after the
/// stop has latched with the default reason, for at most
/// [`STOP_BODY_WITHIN`], and its reason then replaces the default. Going
/// safe is never gated by the request's form: a body that is not a valid
/// request (malformed JSON, wrong types, over [`STOP_BODY_READ`], a broken
/// or missing upload) still stops, with the default reason, and the answer
/// says why the body was ignored (`body_error`).
async fn trigger(
    State(ctx): State<Arc<HostContext>>,
    control: Option<Extension<ControlSocket>>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    let source = rest_source(&headers, control.as_deref());
    let default_reason = if source == StopSource::Rest {
        "POST /v1/estop"
    } else {
        "rozd estop"
    };
    let credential = caller.as_ref().and_then(|c| c.named());
    let body = StopBody::start(body).await;
    let (added, request) = match body {
        StopBody::Ready(read) => {
            let request = read.and_then(|bytes| parse_body::<StopBodyFields>(&bytes));
            let reason = match &request {
                Ok(r) => clean_reason(r.reason.as_deref(), default_reason),
                Err(_) => default_reason.to_string(),
            };
            let added = ctx
                .ooda
                .trigger_stop(StopRequest::new(&source, &reason).credential(credential))
                .await;
            (added, request)
        }
        pending => {
            // Latch first; the body, if it comes, names the reason.
            let added = ctx
                .ooda
                .trigger_stop(StopRequest::new(&source, default_reason).credential(credential))
                .await;
            let request = pending
                .finish()
                .await
                .and_then(|bytes| parse_body::<StopBodyFields>(&bytes));
            if added
                && let Ok(StopBodyFields {
                    reason: Some(reason),
                }) = &request
            {
                let reason = clean_reason(Some(reason), default_reason);
                let latch = ctx.ooda.protective_stop();
                if latch.give_reason(&source, &reason, credential) && !latch.persisted().await {
                    tracing::error!(
                        "the protective stop's reason could not be written to disk in time"
                    );
                }
            }
            (added, request)
        }
    };
    let mut reply = status_value(safety_now(&ctx), ("triggered", added));
    if let (Err(why), Some(object)) = (request, reply.as_object_mut()) {
        tracing::warn!(%why, "protective stop triggered; its request body was ignored");
        object.insert(
            "body_error".into(),
            format!("the body must be empty or a JSON object {{\"reason\": \"...\"}}: {why}")
                .into(),
        );
    }
    Json(reply).into_response()
}

/// `POST /v1/estop/clear`: the operator's clear: removes every cause but
/// those a stop input still asserts (moves nothing); `409` while one does.
async fn clear(
    State(ctx): State<Arc<HostContext>>,
    control: Option<Extension<ControlSocket>>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request: StopBodyFields = match parse_body(&body) {
        Ok(r) => r,
        Err(why) => return bad_body(&why),
    };
    let source = rest_source(&headers, control.as_deref());
    let reason = clean_reason(request.reason.as_deref(), "operator");
    let latch = ctx.ooda.protective_stop();
    let credential = caller.as_ref().and_then(|c| c.named());
    let by = format!("{source}: {reason}");
    let cleared = latch
        .clear(ClearRequest::all(&by).credential(credential))
        .await;
    match cleared {
        Ok(cleared) => status_json(safety_now(&ctx), ("cleared", cleared)),
        Err(refused) => json_error(
            StatusCode::CONFLICT,
            "failed_precondition",
            &refused.to_string(),
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_cleaned_and_cut() {
        assert_eq!(clean_reason(None, "d"), "d");
        assert_eq!(clean_reason(Some("  "), "d"), "d");
        assert_eq!(clean_reason(Some("a\nb\x07"), "d"), "a b");
        assert_eq!(
            clean_reason(Some(&"x".repeat(2000)), "d").chars().count(),
            MAX_REASON_CHARS
        );
    }

    #[test]
    fn bodies() {
        let parse = parse_body::<StopBodyFields>;
        assert!(parse(b"").unwrap().reason.is_none());
        assert!(parse(b" \n").unwrap().reason.is_none());
        assert_eq!(
            parse(br#"{"reason":"r","other":1}"#)
                .unwrap()
                .reason
                .as_deref(),
            Some("r")
        );
        assert!(parse(b"{}").unwrap().reason.is_none());
        for bad in [&b"{"[..], b"[]", b"null", br#"{"reason":5}"#, b"stop"] {
            assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
