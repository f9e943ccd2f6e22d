//! The services a Foxglove client may call, each gated by scope exactly as
//! its REST twin (see [`Service::needs`]) and run on the same path:
//! `protective_stop` latches the stop as `POST /v1/estop` does (source
//! `foxglove`), `clear_protective_stop` clears as `POST /v1/estop/clear`,
//! `approve`/`deny` answer as `POST /v1/approvals/{id}`, and
//! `command_actuator` runs the actuator's PHYSICAL host tool through
//! [`host_call::run`] (limits, permissions and approvals, hold, audit) with
//! origin `foxglove:<credential>`, owned by the connection: when it ends,
//! what it commanded goes to its safe value.

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::protocol::{self, Service};
use crate::HostContext;
use crate::api::auth::Caller;
use crate::clock::now_ms;
use crate::config::types::{AiMode, ToolCategory};
use crate::ooda::act::Origin;
use crate::safety::{ClearRequest, StopRequest, StopSource};
use crate::session::approvals::{ApprovalView, Asker};
use crate::session::host_call::{self, Answer, CallSite};

/// The stop's source (and the clearer) for calls over Foxglove.
pub(super) const SOURCE: &StopSource = &StopSource::Foxglove;

/// Calls of one client running at once, besides the stop (which never waits).
const MAX_CALLS_IN_FLIGHT: usize = 8;

/// One connection's service calls.
pub(super) struct Calls {
    pub ctx: Arc<HostContext>,
    pub caller: Caller,
    /// Who owns the actuators this connection commands.
    pub owner: String,
    /// Cancelled when the connection ends: a waiting call is abandoned.
    pub gone: CancellationToken,
    /// The connection's control queue (answers, failures, statuses).
    pub replies: mpsc::Sender<axum::extract::ws::Message>,
    in_flight: Arc<Semaphore>,
}

type Reply = Result<Value, String>;

impl Calls {
    pub(super) fn new(
        ctx: Arc<HostContext>,
        caller: Caller,
        owner: String,
        gone: CancellationToken,
        replies: mpsc::Sender<axum::extract::ws::Message>,
    ) -> Calls {
        Calls {
            ctx,
            caller,
            owner,
            gone,
            replies,
            in_flight: Arc::new(Semaphore::new(MAX_CALLS_IN_FLIGHT)),
        }
    }

    /// Starts call `call_id` of service `service_id`; its answer (or
    /// failure) goes to the client when it is done.
    pub(super) fn call(&self, service_id: u32, call_id: u32, encoding: &str, payload: &[u8]) {
        let fail = |message: String| {
            let text = protocol::service_call_failure(service_id, call_id, &message);
            // A client that floods calls without reading loses answers, not the daemon's memory.
            let _ = self
                .replies
                .try_send(axum::extract::ws::Message::Text(text.into()));
        };
        let Some(service) = Service::from_id(service_id) else {
            return fail(format!("invalid_argument: no service with id {service_id}"));
        };
        if let Some(needed) = service.needs()
            && !self.caller.scope.allows(needed)
        {
            tracing::warn!(credential = self.caller.name(), service = service.name(), needed = %needed, "refused a Foxglove service call outside its credential's scope");
            return fail(format!(
                "permission_denied: credential {:?} has scope {}; {} needs {needed}",
                self.caller.name(),
                self.caller.scope,
                service.name()
            ));
        }
        // The stop is never refused over its form.
        let request: Value = if payload.iter().all(u8::is_ascii_whitespace) {
            json!({})
        } else {
            match serde_json::from_slice(payload) {
                Ok(value @ Value::Object(_)) => value,
                _ if service == Service::ProtectiveStop => json!({}),
                Ok(_) => return fail("invalid_argument: the request must be a JSON object".into()),
                Err(e) => return fail(format!("invalid_argument: the request is not JSON: {e}")),
            }
        };
        if encoding != "json" && service != Service::ProtectiveStop {
            return fail(format!(
                "invalid_argument: encoding {encoding:?}; rozd's services take json"
            ));
        }
        // The stop never waits for a place among the other calls.
        let permit = if service == Service::ProtectiveStop {
            None
        } else {
            match self.in_flight.clone().try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    return fail(format!(
                        "rate_limited: at most {MAX_CALLS_IN_FLIGHT} calls of one client run at once"
                    ));
                }
            }
        };
        let job = Job {
            ctx: self.ctx.clone(),
            caller: self.caller.clone(),
            owner: self.owner.clone(),
            gone: self.gone.clone(),
        };
        let replies = self.replies.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let reply = job.run(service, request).await;
            let message = match reply {
                Ok(value) => axum::extract::ws::Message::Binary(
                    protocol::service_call_response(
                        service_id,
                        call_id,
                        value.to_string().as_bytes(),
                    )
                    .into(),
                ),
                Err(why) => axum::extract::ws::Message::Text(
                    protocol::service_call_failure(service_id, call_id, &why).into(),
                ),
            };
            // Gone meanwhile: nobody to tell.
            let _ = replies.send(message).await;
        });
    }
}

/// What one call needs, moved into its task.
struct Job {
    ctx: Arc<HostContext>,
    caller: Caller,
    owner: String,
    gone: CancellationToken,
}

fn text<'a>(request: &'a Value, key: &str) -> Option<&'a str> {
    request.get(key).and_then(Value::as_str)
}

impl Job {
    async fn run(self, service: Service, request: Value) -> Reply {
        let credential = self.caller.named();
        match service {
            Service::ProtectiveStop => {
                let reason = crate::api::safety::clean_reason(
                    text(&request, "reason"),
                    "Foxglove protective_stop",
                );
                let added = self
                    .ctx
                    .ooda
                    .trigger_stop(StopRequest::new(SOURCE, &reason).credential(credential))
                    .await;
                Ok(self.stop_state(added))
            }
            Service::ClearProtectiveStop => {
                let reason = crate::api::safety::clean_reason(text(&request, "reason"), "operator");
                let by = format!("{SOURCE}: {reason}");
                let cleared = self
                    .ctx
                    .ooda
                    .protective_stop()
                    .clear(ClearRequest::all(&by).credential(credential))
                    .await;
                match cleared {
                    Ok(cleared) => Ok(self.stop_state(cleared)),
                    Err(refused) => Err(format!("failed_precondition: {refused}")),
                }
            }
            Service::Approve | Service::Deny => {
                let Some(id) = text(&request, "id") else {
                    return Err(
                        "invalid_argument: the request must name the call: {\"id\": \"...\"}"
                            .into(),
                    );
                };
                let approve = service == Service::Approve;
                let by = credential.map(str::to_string);
                match crate::api::approvals::answer_call(&self.ctx, id, approve, by, "Foxglove")
                    .await
                {
                    Ok(view) => Ok(json!({"approved": approve, "call": view})),
                    Err(crate::api::approvals::Refused::NotFound(why)) => {
                        Err(format!("not_found: {why}"))
                    }
                    Err(crate::api::approvals::Refused::OwnCall(why)) => {
                        Err(format!("permission_denied: {why}"))
                    }
                }
            }
            Service::CommandActuator => self.command(&request).await,
        }
    }

    fn stop_state(&self, changed: bool) -> Value {
        let state = self.ctx.ooda.protective_stop().state();
        json!({"latched": !state.causes.is_empty(), "changed": changed, "causes": state.causes})
    }

    /// The actuator's PHYSICAL tool, as a session or an MCP client calls it.
    async fn command(&self, request: &Value) -> Reply {
        let Some(actuator) = text(request, "actuator") else {
            return Err("invalid_argument: the request must name the actuator".into());
        };
        let actuators = &self.ctx.config.hardware.actuators;
        let configured = actuators.iter().any(|a| a.name == actuator);
        let tool = self
            .ctx
            .host_registry
            .get(actuator)
            .filter(|t| configured && t.spec.category == ToolCategory::Physical)
            .cloned();
        let Some(tool) = tool else {
            let names: Vec<&str> = actuators.iter().map(|a| a.name.as_str()).collect();
            return Err(format!(
                "invalid_argument: no actuator {actuator:?}; this host has: {}",
                names.join(", ")
            ));
        };
        let mut input = serde_json::Map::new();
        if let Some(value) = request.get("value") {
            input.insert("value".into(), value.clone());
        }
        if let Some(hold) = request.get("hold_ms") {
            input.insert("hold_ms".into(), hold.clone());
        }
        let input = Value::Object(input);
        let credential = self.caller.named().map(str::to_string);
        let origin = format!("foxglove:{}", self.caller.name());
        let host = self
            .ctx
            .host_access(
                Asker::Foxglove,
                &self.owner,
                origin.clone(),
                AiMode::React,
                None,
            )
            .with_credential(credential.clone());
        let id = uuid::Uuid::new_v4().to_string();
        let mut site = FoxgloveCall {
            ctx: &self.ctx,
            gone: self.gone.clone(),
            owner: self.owner.clone(),
            origin,
            credential,
        };
        match host_call::run(&mut site, &host, &self.ctx.permissions, &id, &tool, &input).await {
            Ok(outcome) => match outcome.failure {
                None => Ok(json!({
                    "result": serde_json::from_str::<Value>(&outcome.content)
                        .unwrap_or(Value::String(outcome.content)),
                })),
                Some(failure) => Err(format!("{}: {}", failure.as_str(), outcome.content)),
            },
            Err(Gone) => Err("the connection ended".into()),
        }
    }
}

/// The connection ended while the call waited.
struct Gone;

/// A Foxglove call as a [`CallSite`]: an approval waits in the host's list
/// (`/v1/approvals`, or this service's `approve`) until answered, the
/// connection ends, or `session.approval_timeout_secs` passes.
struct FoxgloveCall<'a> {
    ctx: &'a HostContext,
    gone: CancellationToken,
    owner: String,
    origin: String,
    credential: Option<String>,
}

impl CallSite for FoxgloveCall<'_> {
    type Interrupt = Gone;

    async fn approve(
        &mut self,
        id: &str,
        name: &str,
        input: &Value,
        category: ToolCategory,
    ) -> Result<Answer, Gone> {
        let timeout = self.ctx.config.session.approval_timeout;
        let since = now_ms();
        let mut waiting = self.ctx.approvals.ask(ApprovalView {
            id: id.to_string(),
            tool_call_id: id.to_string(),
            kind: Asker::Foxglove,
            tool: name.to_string(),
            category: category.as_str(),
            parameters: input.clone(),
            session_id: self.owner.clone(),
            origin: self.origin.clone(),
            credential: self.credential.clone(),
            since_unix_ms: since,
            expires_unix_ms: since
                .saturating_add(i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX)),
        });
        tracing::info!(tool_call_id = id, tool = name, origin = %self.origin, "Foxglove call waits for approval");
        let answer = tokio::select! {
            biased;
            () = self.gone.cancelled() => return Err(Gone),
            answered = waiting.decided() => Answer::from_operator(answered, name),
            () = tokio::time::sleep(timeout) => Answer::timed_out(name, timeout),
        };
        Ok(answer)
    }

    async fn running(&mut self, _name: &str, _category: ToolCategory) -> Result<(), Gone> {
        Ok(())
    }

    async fn abandoned(&self) -> Gone {
        self.gone.cancelled().await;
        Gone
    }
}

/// The deadman of a connection: what it commanded goes to its safe value.
pub(super) async fn release(ctx: &HostContext, owner: &str) {
    let released = ctx
        .ooda
        .actuators()
        .release(
            &Origin::Session(owner.to_string()),
            "Foxglove client disconnected",
        )
        .await;
    if !released.is_empty() {
        tracing::warn!(
            owner,
            ?released,
            "deadman: a Foxglove client's actuators sent to safe values"
        );
    }
}
