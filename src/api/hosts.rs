//! The fleet registry over the network: `roz.v1.HostService` (gRPC),
//! `GET /v1/hosts`, `GET /v1/hosts/{id}`, and the fleet-wide protective
//! stop `POST /v1/fleet/estop` / `POST /v1/fleet/estop/clear` (REST).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};
use tonic::{Request, Status};

use super::auth::Caller;
use super::reply::json_error;
use super::safety::{StopBody, clean_reason, parse_body, rest_source};
use crate::HostContext;
use crate::fleet::record::RecordStatus;
use crate::fleet::{FLEET_SOURCE, FleetError, HostView};
use crate::proto::{self, host_service_server::HostService};
use crate::safety::{ClearRequest, StopRequest};

/// Page size of a listing without a limit.
pub(super) const DEFAULT_HOSTS_LIMIT: u64 = 100;
/// The largest page.
pub const MAX_HOSTS_LIMIT: u64 = 1000;
/// How long `POST /v1/fleet/estop` waits for the hosts to report the stop
/// when the request does not say.
const DEFAULT_CONFIRM_WAIT: Duration = Duration::from_secs(5);
const MAX_CONFIRM_WAIT_MS: u64 = 60_000;

pub(super) struct HostApi {
    ctx: Arc<HostContext>,
}

impl HostApi {
    pub(super) fn new(ctx: Arc<HostContext>) -> Self {
        HostApi { ctx }
    }
}

fn status_of(e: FleetError) -> Status {
    let message = e.to_string();
    match e {
        FleetError::NotConfigured
        | FleetError::Live(_)
        | FleetError::Setup(_)
        | FleetError::OutOfView(_) => Status::failed_precondition(message),
        FleetError::Disconnected | FleetError::Busy => Status::unavailable(message),
        FleetError::NotFound(_) => Status::not_found(message),
        FleetError::Invalid(_) => Status::invalid_argument(message),
    }
}

fn timestamp(ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: ms.div_euclid(1000),
        // < 1e9, fits
        nanos: i32::try_from(ms.rem_euclid(1000) * 1_000_000).unwrap_or(0),
    }
}

/// The wire form of a host: a rozd's advertised endpoint and stop state go
/// into `capabilities` (`endpoint`, `estop_active`), as `Host` has no fields
/// for them.
fn host_proto(h: &HostView) -> proto::Host {
    let r = &h.record;
    let mut capabilities: std::collections::HashMap<String, String> = r
        .capabilities
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if r.status != RecordStatus::Registered {
        if let Some(endpoint) = &r.endpoint {
            capabilities.insert("endpoint".into(), endpoint.clone());
        }
        capabilities.insert("estop_active".into(), h.stop_active().to_string());
    }
    if let Some(why) = h.why {
        capabilities.insert("why".into(), why.as_str().to_string());
    }
    proto::Host {
        id: r.id.clone(),
        name: r.name.clone(),
        environment_id: r.environment_id.clone(),
        status: h.presence.as_str().to_string(),
        capabilities,
        created_at: Some(timestamp(r.created_at_ms)),
        last_heartbeat: r.last_heartbeat_ms.map(timestamp),
    }
}

/// `(offset, limit)` of a page; `limit` 0 or absent is the default.
fn page(limit: i64, offset: i64) -> Result<(usize, usize), String> {
    let limit = u64::try_from(limit).map_err(|_| "limit must not be negative".to_string())?;
    let offset = u64::try_from(offset).map_err(|_| "offset must not be negative".to_string())?;
    if limit > MAX_HOSTS_LIMIT {
        return Err(format!("limit must be at most {MAX_HOSTS_LIMIT}"));
    }
    let limit = if limit == 0 {
        DEFAULT_HOSTS_LIMIT
    } else {
        limit
    };
    Ok((
        usize::try_from(offset).unwrap_or(usize::MAX),
        usize::try_from(limit).unwrap_or(usize::MAX),
    ))
}

#[tonic::async_trait]
impl HostService for HostApi {
    async fn register_host(
        &self,
        request: Request<proto::RegisterHostRequest>,
    ) -> Result<tonic::Response<proto::Host>, Status> {
        let r = request.into_inner();
        let capabilities: BTreeMap<String, String> = r.capabilities.into_iter().collect();
        let host = self
            .ctx
            .fleet
            .register(&r.name, &r.environment_id, capabilities)
            .map_err(status_of)?;
        Ok(tonic::Response::new(host_proto(&host)))
    }

    async fn get_host(
        &self,
        request: Request<proto::GetHostRequest>,
    ) -> Result<tonic::Response<proto::Host>, Status> {
        let id = request.into_inner().id;
        if id.is_empty() {
            return Err(Status::invalid_argument("id must not be empty"));
        }
        match self.ctx.fleet.find(&id).await.map_err(status_of)? {
            Some(host) => Ok(tonic::Response::new(host_proto(&host))),
            None => Err(status_of(FleetError::NotFound(id))),
        }
    }

    async fn list_hosts(
        &self,
        request: Request<proto::ListHostsRequest>,
    ) -> Result<tonic::Response<proto::ListHostsResponse>, Status> {
        let r = request.into_inner();
        let (offset, limit) = page(r.limit, r.offset).map_err(Status::invalid_argument)?;
        let environment = (!r.environment_id.is_empty()).then_some(r.environment_id.as_str());
        self.ctx.fleet.listable(environment).map_err(status_of)?;
        let data = self
            .ctx
            .fleet
            .page(environment, offset, limit)
            .hosts
            .iter()
            .map(host_proto)
            .collect();
        Ok(tonic::Response::new(proto::ListHostsResponse { data }))
    }

    async fn deregister_host(
        &self,
        request: Request<proto::DeregisterHostRequest>,
    ) -> Result<tonic::Response<proto::DeregisterHostResponse>, Status> {
        let id = request.into_inner().id;
        if id.is_empty() {
            return Err(Status::invalid_argument("id must not be empty"));
        }
        self.ctx.fleet.deregister(&id).await.map_err(status_of)?;
        Ok(tonic::Response::new(proto::DeregisterHostResponse {}))
    }
}

// ------------------------------------------------------------------ REST

pub(super) fn routes() -> Router<Arc<HostContext>> {
    Router::new()
        .route("/v1/hosts", get(list))
        .route("/v1/hosts/{id}", get(one))
        .route("/v1/fleet/estop", post(fleet_stop))
        .route("/v1/fleet/estop/clear", post(fleet_clear))
}

/// A host as REST shows it.
pub(super) fn host_json(h: &HostView) -> Value {
    let r = &h.record;
    json!({
        "id": r.id,
        "name": r.name,
        "environment_id": r.environment_id,
        "status": h.presence.as_str(),
        "this_host": h.this_host,
        "capabilities": r.capabilities,
        "endpoint": r.endpoint,
        "estop_active": h.stop_active(),
        "estop": r.estop.as_ref().filter(|e| e.active),
        "created_at_ms": r.created_at_ms,
        "last_heartbeat_ms": r.last_heartbeat_ms,
        "heartbeat_secs": r.heartbeat_secs,
        "heard_ms_ago": h.heard_ago.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        "why": h.why,
        "reported_by": h.reported_by,
    })
}

pub(super) fn fleet_json(ctx: &HostContext) -> Value {
    match ctx.fleet.config() {
        Some(c) => json!({
            "configured": true,
            "connected": ctx.fleet.is_connected(),
            "broker": c.broker.url.as_str(),
            "topic_prefix": c.topic_prefix,
            // What a listing without an environment lists: this host's
            // environment, or every environment (`fleet`).
            "view": c.view.as_str(),
            "environment_id": ctx.fleet.environment_id(),
            "ignored": ctx.fleet.ignored(),
            "broker_dropped_messages": ctx.fleet.broker_dropped(),
        }),
        None => json!({ "configured": false, "connected": false }),
    }
}

#[derive(Debug, Deserialize)]
struct HostsQuery {
    environment_id: Option<String>,
    limit: Option<String>,
    offset: Option<String>,
}

fn invalid_argument(message: &str) -> Response {
    json_error(StatusCode::BAD_REQUEST, "invalid_argument", message).into_response()
}

/// `GET /v1/hosts?environment_id=&limit=&offset=`.
async fn list(
    State(ctx): State<Arc<HostContext>>,
    query: Result<Query<HostsQuery>, QueryRejection>,
) -> Response {
    let query = match query {
        Ok(Query(q)) => q,
        Err(rejection) => {
            return invalid_argument(&format!("invalid query: {}", rejection.body_text()));
        }
    };
    let number = |name: &str, text: Option<&str>| -> Result<i64, String> {
        text.map_or(Ok(0), |t| {
            t.parse::<i64>()
                .map_err(|_| format!("{name} {t:?} is not a whole number"))
        })
    };
    let (offset, limit) = match number("limit", query.limit.as_deref())
        .and_then(|l| Ok((l, number("offset", query.offset.as_deref())?)))
        .and_then(|(l, o)| {
            if query.limit.is_some() && l == 0 {
                return Err(format!("limit must be from 1 to {MAX_HOSTS_LIMIT}"));
            }
            page(l, o)
        }) {
        Ok(p) => p,
        Err(message) => return invalid_argument(&message),
    };
    let environment = query.environment_id.as_deref().filter(|e| !e.is_empty());
    if let Err(e) = ctx.fleet.listable(environment) {
        return json_error(StatusCode::CONFLICT, "failed_precondition", &e.to_string())
            .into_response();
    }
    let page = ctx.fleet.page(environment, offset, limit);
    Json(json!({
        "data": page.hosts.iter().map(host_json).collect::<Vec<_>>(),
        "total": page.total,
        "fleet": fleet_json(&ctx),
    }))
    .into_response()
}

/// `GET /v1/hosts/{id}`.
async fn one(State(ctx): State<Arc<HostContext>>, Path(id): Path<String>) -> Response {
    match ctx.fleet.find(&id).await {
        Ok(Some(h)) => Json(host_json(&h)).into_response(),
        Ok(None) => json_error(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!("no host {id:?} in the fleet registry"),
        )
        .into_response(),
        Err(e) => json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            &e.to_string(),
        )
        .into_response(),
    }
}

/// The optional body of `POST /v1/fleet/estop` and `.../clear`.
#[derive(Debug, Default, Deserialize)]
struct FleetStopRequest {
    /// Default: this host's environment.
    #[serde(default)]
    environment_id: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    /// How long to wait for the hosts to report the new state.
    #[serde(default)]
    wait_ms: Option<u64>,
}

/// A fleet command as asked, with its defaults applied.
struct FleetCommand {
    environment: String,
    reason: Option<String>,
    wait: Duration,
}

impl FleetCommand {
    /// An empty body's command: this host's environment, the default
    /// reason and wait.
    fn default_for(own_environment: &str) -> FleetCommand {
        FleetCommand {
            environment: own_environment.to_string(),
            reason: None,
            wait: DEFAULT_CONFIRM_WAIT,
        }
    }

    /// `Err` says what in `body` cannot be used.
    fn from_body(body: &[u8], own_environment: &str) -> Result<FleetCommand, String> {
        let request: FleetStopRequest = parse_body(body).map_err(|why| {
            format!(
                "the body must be empty or a JSON object {{\"environment_id\", \"reason\", \"wait_ms\"}}: {why}"
            )
        })?;
        let environment = request
            .environment_id
            .filter(|e| !e.is_empty())
            .unwrap_or_else(|| own_environment.to_string());
        if !crate::fleet::config::topic_level_ok(&environment) {
            return Err(format!(
                "environment_id {environment:?} must be 1-128 characters without '/', '+', '#'"
            ));
        }
        let wait = match request.wait_ms {
            Some(ms) if ms > MAX_CONFIRM_WAIT_MS => {
                return Err(format!("wait_ms must be at most {MAX_CONFIRM_WAIT_MS}"));
            }
            Some(ms) => Duration::from_millis(ms),
            None => DEFAULT_CONFIRM_WAIT,
        };
        Ok(FleetCommand {
            environment,
            reason: request.reason,
            wait,
        })
    }
}

/// The hosts of `environment` with their stop state, and whether every
/// live one is in the wanted state.
fn stop_report(hosts: &[HostView], environment: &str, stopped: bool) -> (Vec<Value>, bool) {
    let mut all = true;
    let mut out = Vec::new();
    for h in hosts
        .iter()
        .filter(|h| h.record.environment_id == environment)
    {
        if h.record.status == RecordStatus::Registered {
            continue;
        }
        let source = h
            .record
            .estop
            .as_ref()
            .filter(|e| e.active)
            .and_then(|e| e.source.clone());
        let done = if stopped {
            h.stop_active()
        } else {
            !source.as_deref().is_some_and(|s| FLEET_SOURCE.is(s))
        };
        if h.presence.is_live() && !done {
            all = false;
        }
        out.push(json!({
            "id": h.record.id,
            "status": h.presence.as_str(),
            "estop_active": h.stop_active(),
            "estop_source": source,
        }));
    }
    (out, all)
}

/// `POST /v1/fleet/estop`: latches this host's stop (if it is in the
/// environment) at once, publishes the retained fleet command, and waits
/// (up to `wait_ms`) until every live host of the environment reports it.
/// Going safe is never gated by the request's form: a body that cannot be
/// used (malformed, mistyped, out of range, over 64 KiB) is a stop of this
/// host's environment with the defaults, as an empty body is, and the
/// answer says why the body was ignored (`body_error`).
async fn fleet_stop(
    State(ctx): State<Arc<HostContext>>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    let own = ctx.fleet.environment_id().to_string();
    let body = StopBody::start(body).await;
    // This host first: a body that is not all there yet (it stalls,
    // trickles, or waits for `100 Continue`) must not hold up its stop.
    let latched_first = match body {
        StopBody::Ready(_) => false,
        StopBody::Pending(_) => {
            let reason = format!(
                "fleet stop of environment {own} from {} ({}): its request's body had not arrived",
                ctx.fleet.own_id(),
                rest_source(&headers, None)
            );
            ctx.ooda
                .trigger_stop(
                    StopRequest::new(FLEET_SOURCE, &reason)
                        .credential(caller.as_ref().and_then(|c| c.named())),
                )
                .await
        }
    };
    let (command, body_error) = match body
        .finish()
        .await
        .and_then(|bytes| FleetCommand::from_body(&bytes, &own))
    {
        Ok(command) => (command, None),
        Err(why) => {
            tracing::warn!(%why, "fleet stop of this host's environment; its request body was ignored");
            (FleetCommand::default_for(&own), Some(why))
        }
    };
    // A body that did not come (or broke off) leaves this host's reason as
    // it latched.
    let stop = Stop::Fleet {
        latched_first: latched_first && body_error.is_none(),
    };
    match fleet_command(ctx, caller.map(|c| c.0), headers, command, stop).await {
        Ok(mut answer) => {
            if let (Some(why), Some(object)) = (body_error, answer.as_object_mut()) {
                object.insert("body_error".into(), why.into());
            }
            Json(answer).into_response()
        }
        Err(refused) => refused,
    }
}

/// `POST /v1/fleet/estop/clear`: withdraws the fleet command; hosts clear
/// the stops that came from the fleet (never others), moving nothing. Its
/// body must be exact: a clear that cannot be read does nothing.
async fn fleet_clear(
    State(ctx): State<Arc<HostContext>>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match FleetCommand::from_body(&body, ctx.fleet.environment_id()) {
        Ok(command) => {
            match fleet_command(ctx, caller.map(|c| c.0), headers, command, Stop::Clear).await {
                Ok(answer) => Json(answer).into_response(),
                Err(refused) => refused,
            }
        }
        Err(why) => invalid_argument(&why),
    }
}

/// What a fleet command asks.
#[derive(Debug, Clone, Copy)]
enum Stop {
    /// Stop the environment; `latched_first`: this request already latched
    /// this host (before its body came), so this host's cause takes the
    /// command's reason instead of being added.
    Fleet { latched_first: bool },
    /// Withdraw the fleet's stop.
    Clear,
}

async fn fleet_command(
    ctx: Arc<HostContext>,
    caller: Option<Caller>,
    headers: HeaderMap,
    command: FleetCommand,
    kind: Stop,
) -> Result<Value, Response> {
    let stop = matches!(kind, Stop::Fleet { .. });
    let FleetCommand {
        environment,
        reason,
        wait,
    } = command;
    let fleet = &ctx.fleet;
    let source = rest_source(&headers, None);
    let reason = clean_reason(
        reason.as_deref(),
        if stop {
            "fleet stop"
        } else {
            "fleet stop withdrawn"
        },
    );
    let here = environment == fleet.environment_id();
    let local_note;
    if stop {
        // This host first: its stop must not wait for the broker.
        if here {
            let why = format!(
                "fleet stop of environment {environment} from {} ({source}): {reason}",
                fleet.own_id()
            );
            let credential = caller.as_ref().and_then(Caller::named);
            let added = ctx
                .ooda
                .trigger_stop(StopRequest::new(FLEET_SOURCE, &why).credential(credential))
                .await;
            if !added
                && matches!(
                    kind,
                    Stop::Fleet {
                        latched_first: true
                    }
                )
            {
                let latch = ctx.ooda.protective_stop();
                if latch.give_reason(FLEET_SOURCE, &why, credential) && !latch.persisted().await {
                    tracing::error!("the fleet stop's reason could not be written to disk in time");
                }
            }
            local_note = "this host was stopped";
        } else if matches!(
            kind,
            Stop::Fleet {
                latched_first: true
            }
        ) {
            // Stopping too much is the safe mistake; a person clears it.
            local_note = "this host is not in that environment, but it was stopped before the \
                          request's body named the environment, and stays stopped until cleared";
        } else {
            local_note = "this host is not in that environment and was not stopped";
        }
    } else {
        local_note = "this host's stop was not cleared";
    }
    let command = match fleet.publish_stop(&environment, stop, &reason) {
        Ok(c) => c,
        Err(e) => {
            let (status, code) = match e {
                FleetError::NotConfigured => (StatusCode::CONFLICT, "failed_precondition"),
                FleetError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_argument"),
                _ => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            };
            return Err(json_error(
                status,
                code,
                &format!("{e}; {local_note}; no other host was told"),
            )
            .into_response());
        }
    };
    if !stop && here {
        // Only the fleet's cause: a stop from any other source stays.
        let latch = ctx.ooda.protective_stop();
        let by = format!("{source}: fleet stop withdrawn: {reason}");
        let clear = ClearRequest::source(FLEET_SOURCE, &by)
            .credential(caller.as_ref().and_then(Caller::named));
        match latch.clear(clear).await {
            Ok(_) => {}
            Err(refused) => {
                tracing::warn!("fleet stop withdrawn, but this host's stop stays: {refused}");
            }
        }
    }
    if !fleet.holds(&environment) {
        // This host does not hold that environment's records: it cannot
        // tell who confirmed, and an empty list is no confirmation.
        return Ok(json!({
            "environment_id": environment,
            "stop": stop,
            "command_id": command.id,
            "reason": command.reason,
            "confirmed": false,
            "hosts": [],
            "unconfirmed": format!(
                "published; this host holds the hosts of its own environment {:?} only \
                 ([fleet] view = \"environment\"), so it cannot see which hosts of {environment:?} \
                 confirmed: ask a host of {environment:?}, or one with [fleet] view = \"fleet\"",
                fleet.environment_id()
            ),
        }));
    }
    let confirmed = fleet
        .wait_for(wait, |hosts| stop_report(hosts, &environment, stop).1)
        .await;
    let (hosts, _) = stop_report(&fleet.list(Some(&environment)), &environment, stop);
    Ok(json!({
        "environment_id": environment,
        "stop": stop,
        "command_id": command.id,
        "reason": command.reason,
        "confirmed": confirmed,
        "hosts": hosts,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages() {
        assert_eq!(page(0, 0), Ok((0, 100)));
        assert_eq!(page(5, 7), Ok((7, 5)));
        assert_eq!(page(1000, 0), Ok((0, 1000)));
        assert!(page(1001, 0).is_err());
        assert!(page(-1, 0).is_err());
        assert!(page(1, -1).is_err());
    }

    #[test]
    fn timestamps_from_milliseconds() {
        let t = timestamp(1_700_000_000_123);
        assert_eq!((t.seconds, t.nanos), (1_700_000_000, 123_000_000));
        let t = timestamp(-1);
        assert_eq!((t.seconds, t.nanos), (-1, 999_000_000));
    }
}
