//! Tasks over the network: `roz.v1.TaskService` (gRPC), `WatchTeam`'s event
//! conversion, and the REST routes `/v1/tasks...`. The task engine is
//! [`crate::team`]; this module validates, converts and routes.
//!
//! Routing: `CreateTask{host_id}` for another host of the fleet, and every
//! request for a task id of another host (ids are `<host id>:<uuid>`), is
//! forwarded unchanged over gRPC to that host (see [`super::relay`]); its
//! answer, or its stream, comes back unchanged. `ListTasks` and the REST
//! routes serve this host's tasks only.

use std::pin::Pin;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use futures_util::Stream;
use http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response as GrpcResponse, Status};

use super::auth::Caller;
use super::relay::{self, RemoteChannel};
use super::reply::{json_body, json_error};
use crate::HostContext;
use crate::fleet::Route;
use crate::proto::task_service_client::TaskServiceClient;
use crate::proto::{self, task_service_server::TaskService};
use crate::store::StoredTaskEvent;
use crate::team::state::TeamEvent;
use crate::team::{self, Follow, NewTask, TaskError, TaskView};

/// Default and largest page of `ListTasks` / `GET /v1/tasks`.
const DEFAULT_LIMIT: u32 = 50;
const MAX_LIMIT: u32 = 500;

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

pub(super) struct TaskApi {
    ctx: Arc<HostContext>,
}

impl TaskApi {
    pub(super) fn new(ctx: Arc<HostContext>) -> Self {
        TaskApi { ctx }
    }
}

pub(super) fn status_of(e: TaskError) -> Status {
    match e {
        TaskError::InvalidArgument(m) => Status::invalid_argument(m),
        TaskError::NotFound(m) => Status::not_found(m),
        TaskError::FailedPrecondition(m) => Status::failed_precondition(m),
        TaskError::ResourceExhausted(m) => Status::resource_exhausted(m),
        TaskError::PermissionDenied(m) => Status::permission_denied(m),
        TaskError::Internal(m) => Status::internal(m),
        TaskError::Store(e) => {
            tracing::error!(error = %e, "task store failure");
            Status::internal("the task store failed; see the daemon log")
        }
    }
}

/// Where a request for `host_id` goes.
enum Owner {
    Local,
    Remote(String, RemoteChannel),
}

/// `relayed_by`: the host that relayed the request here, if one did (then
/// it is served here or refused, never relayed again).
async fn owner(
    ctx: &HostContext,
    host_id: &str,
    relayed_by: Option<&str>,
) -> Result<Owner, Status> {
    match ctx.fleet.route_to(host_id, relayed_by).await {
        Ok(Route::Local) => Ok(Owner::Local),
        Ok(Route::Remote(remote)) => {
            let channel = relay::connect(&remote, ctx.config.server.http2_keepalive)
                .await
                .map_err(|e| relay::route_status(&e))?;
            Ok(Owner::Remote(remote.id, channel))
        }
        Err(e) => Err(relay::route_status(&e)),
    }
}

/// The owner of a task, from its id.
async fn task_owner(
    ctx: &HostContext,
    task_id: &str,
    relayed_by: Option<&str>,
) -> Result<Owner, Status> {
    let host = team::task_owner(task_id).map_err(status_of)?;
    owner(ctx, host, relayed_by).await
}

/// The host that relayed `request` here, if one did.
fn relayed_by<T>(request: &Request<T>) -> Option<String> {
    relay::relayed_by(request.metadata())
}

/// A remote stream as ours: a transport failure is `UNAVAILABLE`, naming the host.
fn relayed<T: Send + 'static>(host: String, stream: tonic::Streaming<T>) -> ResponseStream<T> {
    Box::pin(stream.map(move |item| {
        item.map_err(|status| match status.code() {
            tonic::Code::Unknown | tonic::Code::Unavailable => Status::unavailable(format!(
                "the stream from host {host:?} broke: {}",
                status.message()
            )),
            _ => status,
        })
    }))
}

fn timestamp(ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: i32::try_from(ms.rem_euclid(1000) * 1_000_000).unwrap_or(0),
    }
}

fn task_proto(view: TaskView) -> proto::Task {
    let row = view.row;
    proto::Task {
        id: row.id,
        prompt: row.prompt,
        environment_id: row.environment_id,
        status: row.status,
        host_id: Some(row.host_id),
        created_at: Some(timestamp(row.created_at_ms)),
        updated_at: Some(timestamp(row.updated_at_ms)),
        detail: row.detail,
        pending_approvals: view
            .pending_approvals
            .into_iter()
            .map(|p| proto::PendingApproval {
                tool_call_id: p.tool_call_id,
                worker_id: p.worker_id,
                tool: p.tool,
            })
            .collect(),
    }
}

/// A stored team event as the wire's `TeamEvent`.
pub(super) fn team_event_proto(entry: &StoredTaskEvent) -> Option<proto::TeamEvent> {
    use proto::team_event::Event;
    let event = match TeamEvent::from_stored(&entry.kind, &entry.body)? {
        TeamEvent::Started { worker_id, host_id } => {
            Event::WorkerStarted(proto::WorkerStarted { worker_id, host_id })
        }
        TeamEvent::Phase {
            worker_id,
            phase,
            mode,
        } => Event::WorkerPhase(proto::WorkerPhase {
            worker_id,
            phase,
            mode,
        }),
        TeamEvent::ToolCall { worker_id, tool } => {
            Event::WorkerToolCall(proto::WorkerToolCall { worker_id, tool })
        }
        TeamEvent::Completed { worker_id, result } => {
            Event::WorkerCompleted(proto::WorkerCompleted { worker_id, result })
        }
        TeamEvent::Failed { worker_id, reason } => {
            Event::WorkerFailed(proto::WorkerFailed { worker_id, reason })
        }
        TeamEvent::Exited {
            worker_id,
            parent_task_id,
        } => Event::WorkerExited(proto::WorkerExited {
            worker_id,
            parent_task_id,
        }),
    };
    Some(proto::TeamEvent { event: Some(event) })
}

fn status_update(task_id: &str, entry: &StoredTaskEvent) -> proto::TaskStatusUpdate {
    proto::TaskStatusUpdate {
        task_id: task_id.to_string(),
        status: entry
            .body
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        detail: entry
            .body
            .get("detail")
            .and_then(Value::as_str)
            .map(str::to_string),
        timestamp: Some(timestamp(entry.at_ms)),
    }
}

/// `WatchTeam`: every stored team event of the task, then live ones.
pub(super) async fn watch_team(
    ctx: Arc<HostContext>,
    relayed_by: Option<String>,
    task_id: String,
) -> Result<ResponseStream<proto::TeamEvent>, Status> {
    if let Owner::Remote(host, channel) = task_owner(&ctx, &task_id, relayed_by.as_deref()).await? {
        let stream = proto::agent_service_client::AgentServiceClient::new(channel)
            .watch_team(proto::WatchTeamRequest { task_id })
            .await?
            .into_inner();
        return Ok(relayed(host, stream));
    }
    let entries = team::follow(ctx.team.clone(), task_id, Follow::TeamEvents)
        .await
        .map_err(status_of)?;
    let events = ReceiverStream::new(entries).filter_map(|entry| match entry {
        Ok(entry) => team_event_proto(&entry).map(Ok),
        Err(e) => Some(Err(status_of(e))),
    });
    Ok(Box::pin(events))
}

fn page(limit: i64, offset: i64) -> Result<(u32, u32), TaskError> {
    let limit = match limit {
        0 => DEFAULT_LIMIT,
        n if (1..=i64::from(MAX_LIMIT)).contains(&n) => n as u32,
        n => {
            return Err(TaskError::InvalidArgument(format!(
                "limit {n} is not from 1 to {MAX_LIMIT} (0 = default {DEFAULT_LIMIT})"
            )));
        }
    };
    let offset = u32::try_from(offset).map_err(|_| {
        TaskError::InvalidArgument(format!("offset {offset} is not from 0 to {}", u32::MAX))
    })?;
    Ok((limit, offset))
}

#[tonic::async_trait]
impl TaskService for TaskApi {
    type StreamTaskStatusStream = ResponseStream<proto::TaskStatusUpdate>;

    async fn create_task(
        &self,
        request: Request<proto::CreateTaskRequest>,
    ) -> Result<GrpcResponse<proto::Task>, Status> {
        let by = relayed_by(&request);
        let credential = request
            .extensions()
            .get::<Caller>()
            .and_then(|c| c.named().map(str::to_string));
        let r = request.into_inner();
        if let Owner::Remote(_, channel) = owner(
            &self.ctx,
            r.host_id.as_deref().unwrap_or_default(),
            by.as_deref(),
        )
        .await?
        {
            return TaskServiceClient::new(channel).create_task(r).await;
        }
        let view = team::create(
            &self.ctx.team,
            NewTask {
                prompt: r.prompt,
                environment_id: r.environment_id,
                host_id: r.host_id,
                timeout_secs: r.timeout_secs,
                credential,
            },
        )
        .await
        .map_err(status_of)?;
        Ok(GrpcResponse::new(task_proto(view)))
    }

    async fn get_task(
        &self,
        request: Request<proto::GetTaskRequest>,
    ) -> Result<GrpcResponse<proto::Task>, Status> {
        if let Owner::Remote(_, channel) = task_owner(
            &self.ctx,
            &request.get_ref().id,
            relayed_by(&request).as_deref(),
        )
        .await?
        {
            return TaskServiceClient::new(channel)
                .get_task(request.into_inner())
                .await;
        }
        let view = team::get(&self.ctx.team, &request.get_ref().id)
            .await
            .map_err(status_of)?;
        Ok(GrpcResponse::new(task_proto(view)))
    }

    async fn list_tasks(
        &self,
        request: Request<proto::ListTasksRequest>,
    ) -> Result<GrpcResponse<proto::ListTasksResponse>, Status> {
        let r = request.get_ref();
        let (limit, offset) = page(r.limit, r.offset).map_err(status_of)?;
        let views = team::list(&self.ctx.team, limit, offset)
            .await
            .map_err(status_of)?;
        Ok(GrpcResponse::new(proto::ListTasksResponse {
            data: views.into_iter().map(task_proto).collect(),
        }))
    }

    async fn cancel_task(
        &self,
        request: Request<proto::CancelTaskRequest>,
    ) -> Result<GrpcResponse<proto::CancelTaskResponse>, Status> {
        if let Owner::Remote(_, channel) = task_owner(
            &self.ctx,
            &request.get_ref().id,
            relayed_by(&request).as_deref(),
        )
        .await?
        {
            return TaskServiceClient::new(channel)
                .cancel_task(request.into_inner())
                .await;
        }
        team::cancel(&self.ctx.team, &request.get_ref().id)
            .await
            .map_err(status_of)?;
        Ok(GrpcResponse::new(proto::CancelTaskResponse {}))
    }

    async fn approve_tool_use(
        &self,
        request: Request<proto::ApproveToolUseRequest>,
    ) -> Result<GrpcResponse<proto::Task>, Status> {
        if let Owner::Remote(_, channel) = task_owner(
            &self.ctx,
            &request.get_ref().task_id,
            relayed_by(&request).as_deref(),
        )
        .await?
        {
            return TaskServiceClient::new(channel)
                .approve_tool_use(request.into_inner())
                .await;
        }
        let by = request
            .extensions()
            .get::<Caller>()
            .and_then(|c| c.named().map(str::to_string));
        let r = request.into_inner();
        if r.modifier.as_ref().is_some_and(|m| !m.fields.is_empty()) {
            return Err(Status::invalid_argument(
                "modifier: rozd does not change a tool call's parameters on approval; \
                 deny the call and let the agent retry instead",
            ));
        }
        if r.tool_call_id.is_empty() {
            return Err(Status::invalid_argument("tool_call_id must not be empty"));
        }
        let view = team::approve(
            &self.ctx.team,
            &r.task_id,
            &r.tool_call_id,
            r.approved,
            by,
            team::AnsweredVia::Grpc,
        )
        .await
        .map_err(status_of)?;
        Ok(GrpcResponse::new(task_proto(view)))
    }

    async fn stream_task_status(
        &self,
        request: Request<proto::StreamTaskStatusRequest>,
    ) -> Result<GrpcResponse<Self::StreamTaskStatusStream>, Status> {
        if let Owner::Remote(host, channel) = task_owner(
            &self.ctx,
            &request.get_ref().task_id,
            relayed_by(&request).as_deref(),
        )
        .await?
        {
            let stream = TaskServiceClient::new(channel)
                .stream_task_status(request.into_inner())
                .await?
                .into_inner();
            return Ok(GrpcResponse::new(relayed(host, stream)));
        }
        let task_id = request.into_inner().task_id;
        let entries = team::follow(self.ctx.team.clone(), task_id.clone(), Follow::Status)
            .await
            .map_err(status_of)?;
        let updates = ReceiverStream::new(entries).map(move |entry| match entry {
            Ok(entry) => Ok(status_update(&task_id, &entry)),
            Err(e) => Err(status_of(e)),
        });
        Ok(GrpcResponse::new(Box::pin(updates)))
    }
}

// ------------------------------------------------------------------ REST

pub(super) fn routes() -> Router<Arc<HostContext>> {
    Router::new()
        .route("/v1/tasks", get(list_rest).post(create_rest))
        .route("/v1/tasks/{id}", get(get_rest))
        .route("/v1/tasks/{id}/events", get(events_rest))
        .route("/v1/tasks/{id}/cancel", post(cancel_rest))
        .route("/v1/tasks/{id}/approvals", post(approve_rest))
}

fn rest_error(e: TaskError) -> Response {
    let (status, code) = match &e {
        TaskError::InvalidArgument(_) => (StatusCode::BAD_REQUEST, "invalid_argument"),
        TaskError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
        TaskError::FailedPrecondition(_) => (StatusCode::CONFLICT, "failed_precondition"),
        TaskError::ResourceExhausted(_) => (StatusCode::TOO_MANY_REQUESTS, "resource_exhausted"),
        TaskError::PermissionDenied(_) => (StatusCode::FORBIDDEN, "permission_denied"),
        TaskError::Store(_) | TaskError::Internal(_) => {
            (StatusCode::INTERNAL_SERVER_ERROR, "internal")
        }
    };
    let message = match e {
        TaskError::Store(e) => {
            tracing::error!(error = %e, "task store failure");
            "the task store failed; see the daemon log".to_string()
        }
        other => other.to_string(),
    };
    json_error(status, code, &message).into_response()
}

/// The body of `POST /v1/tasks/{id}/approvals`: the call's id and the
/// answer, `approve` or `approved` (one of them, a boolean).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskAnswer {
    tool_call_id: String,
    #[serde(default)]
    approve: Option<bool>,
    #[serde(default)]
    approved: Option<bool>,
}

fn task_answer(body: &[u8]) -> Result<(String, bool), TaskError> {
    let body: TaskAnswer = json_body(body).map_err(TaskError::InvalidArgument)?;
    if body.tool_call_id.is_empty() {
        return Err(TaskError::InvalidArgument(
            "`tool_call_id` is required".into(),
        ));
    }
    let answer = super::approvals::Answer {
        approve: body.approve,
        approved: body.approved,
    };
    let approved = answer.decision().ok_or_else(|| {
        TaskError::InvalidArgument(
            "`approve` (true or false) is required, once (`approved` is accepted too)".into(),
        )
    })?;
    Ok((body.tool_call_id, approved))
}

/// The body of `POST /v1/tasks`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    prompt: String,
    #[serde(default)]
    environment_id: Option<String>,
    #[serde(default)]
    host_id: Option<String>,
    /// Whole seconds.
    #[serde(default)]
    timeout_secs: Option<u32>,
}

/// `POST /v1/tasks` `{"prompt", "environment_id"?, "host_id"?, "timeout_secs"?}` -> 201.
async fn create_rest(
    State(ctx): State<Arc<HostContext>>,
    caller: Option<Extension<Caller>>,
    body: Bytes,
) -> Response {
    let body: CreateBody = match json_body(&body) {
        Ok(body) => body,
        Err(why) => return rest_error(TaskError::InvalidArgument(why)),
    };
    let new = NewTask {
        prompt: body.prompt,
        environment_id: body.environment_id.unwrap_or_default(),
        host_id: body.host_id,
        timeout_secs: body.timeout_secs,
        credential: caller.as_ref().and_then(|c| c.named().map(str::to_string)),
    };
    match team::create(&ctx.team, new).await {
        Ok(view) => (StatusCode::CREATED, Json(view)).into_response(),
        Err(e) => rest_error(e),
    }
}

#[derive(Debug, Deserialize)]
struct PageQuery {
    limit: Option<String>,
    offset: Option<String>,
}

/// `GET /v1/tasks?limit=N&offset=M`: newest first.
async fn list_rest(
    State(ctx): State<Arc<HostContext>>,
    query: Result<Query<PageQuery>, QueryRejection>,
) -> Response {
    let parsed = (|| {
        let Query(q) = query
            .map_err(|r| TaskError::InvalidArgument(format!("invalid query: {}", r.body_text())))?;
        let number = |key: &str, text: Option<String>| -> Result<i64, TaskError> {
            match text {
                None => Ok(0),
                Some(t) => t.parse::<i64>().map_err(|_| {
                    TaskError::InvalidArgument(format!("{key} {t:?} is not a whole number"))
                }),
            }
        };
        page(number("limit", q.limit)?, number("offset", q.offset)?)
    })();
    let (limit, offset) = match parsed {
        Ok(p) => p,
        Err(e) => return rest_error(e),
    };
    match team::list(&ctx.team, limit, offset).await {
        Ok(views) => Json(json!({ "data": views })).into_response(),
        Err(e) => rest_error(e),
    }
}

async fn get_rest(State(ctx): State<Arc<HostContext>>, Path(id): Path<String>) -> Response {
    match team::get(&ctx.team, &id).await {
        Ok(view) => Json(view).into_response(),
        Err(e) => rest_error(e),
    }
}

/// `GET /v1/tasks/{id}/events`: the task's whole stored log (status changes
/// and team events), oldest first.
async fn events_rest(State(ctx): State<Arc<HostContext>>, Path(id): Path<String>) -> Response {
    if let Err(e) = team::get(&ctx.team, &id).await {
        return rest_error(e);
    }
    let mut all = Vec::new();
    let mut cursor = 0;
    loop {
        match ctx.store.task_events(id.clone(), cursor, None, 1000).await {
            Ok(batch) => {
                let done = batch.len() < 1000;
                if let Some(last) = batch.last() {
                    cursor = last.seq;
                }
                all.extend(batch);
                if done {
                    break;
                }
            }
            Err(e) => return rest_error(e.into()),
        }
    }
    Json(json!({ "data": all })).into_response()
}

async fn cancel_rest(State(ctx): State<Arc<HostContext>>, Path(id): Path<String>) -> Response {
    if let Err(e) = team::cancel(&ctx.team, &id).await {
        return rest_error(e);
    }
    match team::get(&ctx.team, &id).await {
        Ok(view) => Json(view).into_response(),
        Err(e) => rest_error(e),
    }
}

/// `POST /v1/tasks/{id}/approvals` `{"tool_call_id", "approve"}` (or
/// `"approved"`, the spelling this route had first; as for
/// `POST /v1/approvals/{id}`).
async fn approve_rest(
    State(ctx): State<Arc<HostContext>>,
    caller: Option<Extension<Caller>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let (call, approved) = match task_answer(&body) {
        Ok(p) => p,
        Err(e) => return rest_error(e),
    };
    let by = caller.as_ref().and_then(|c| c.named().map(str::to_string));
    match team::approve(&ctx.team, &id, &call, approved, by, team::AnsweredVia::Rest).await {
        Ok(view) => Json(view).into_response(),
        Err(e) => rest_error(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task's approval takes `approve` as `/v1/approvals/{id}` does, and
    /// still `approved` (issue 35, item 16); both at once, a non-boolean or
    /// another field is a clear 400.
    #[test]
    fn a_task_approval_accepts_approve_and_approved() {
        let ok = |body: &str| task_answer(body.as_bytes()).map_err(|e| e.to_string());
        assert_eq!(
            ok(r#"{"tool_call_id": "c1", "approve": true}"#),
            Ok(("c1".to_string(), true))
        );
        assert_eq!(
            ok(r#"{"tool_call_id": "c1", "approved": false}"#),
            Ok(("c1".to_string(), false))
        );
        for bad in [
            r#"{"tool_call_id": "c1", "approve": true, "approved": true}"#,
            r#"{"tool_call_id": "c1", "approve": "yes"}"#,
            r#"{"tool_call_id": "c1"}"#,
            r#"{"approve": true}"#,
        ] {
            assert!(ok(bad).is_err(), "{bad}");
        }
        let unknown = ok(r#"{"tool_call_id": "c1", "approve": true, "note": 1}"#).unwrap_err();
        assert!(unknown.contains("unknown field `note`"), "{unknown}");
    }
}
