//! Tasks: jobs the host runs without a client attached — one headless agent
//! (worker zero, the task's lead) that may start worker agents — and their
//! durable event logs, followed live by `WatchTeam` and `StreamTaskStatus`.
//!
//! Every status change and team event is written to the store before anyone
//! hears of it; watchers read the store by sequence number and are woken by
//! a `watch` of the latest number, so a slow watcher never holds up a worker
//! and a late one replays exactly what an early one saw.
//!
//! - [`state`]: statuses, failure reasons, team events, a task's live state (no I/O)
//! - [`worker`]: one worker's turn and the driver that answers for it

mod live;
pub(crate) mod state;
pub(crate) mod worker;

pub(crate) use live::LiveTask;

use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::session::turn::TurnInput;
use crate::store::{StoreError, StoredTaskEvent, TaskRow};
use state::{PendingApproval, StopCause, TaskState, TaskStatus, TeamEvent, WorkerEnd};

/// Longest prompt a task accepts.
const MAX_PROMPT_CHARS: usize = 100_000;
/// Log entries a watcher reads from the store at a time.
const WATCH_BATCH: u32 = 256;
/// A watcher that is not woken re-reads the store this often anyway.
const WATCH_POLL: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub(crate) enum TaskError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    /// The request is valid but the task's state does not allow it.
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    ResourceExhausted(String),
    /// The caller may not do this (a credential approving a call of a task
    /// it created, with `approvals.require_other_credential`).
    #[error("{0}")]
    PermissionDenied(String),
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// Something rozd should have recorded is missing (see the daemon log).
    #[error("{0}")]
    Internal(String),
}

/// What `CreateTask` asks for.
#[derive(Debug, Clone, Default)]
pub(crate) struct NewTask {
    pub prompt: String,
    pub environment_id: String,
    pub host_id: Option<String>,
    pub timeout_secs: Option<u32>,
    /// The credential that created the task (`None`: anonymous); the audit
    /// names it for every physical call of the task's workers.
    pub credential: Option<String>,
}

/// A task as reported: its row plus the calls waiting for approval.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct TaskView {
    #[serde(flatten)]
    pub row: TaskRow,
    pub pending_approvals: Vec<ApprovalView>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct ApprovalView {
    pub tool_call_id: String,
    pub worker_id: String,
    pub tool: String,
    /// The call's parameters (what approving would apply; never modified).
    pub parameters: serde_json::Value,
}

/// What the task engine uses of the host, each named: built once by the
/// daemon's context.
#[derive(Debug)]
pub(crate) struct TeamHost {
    /// The tasks running on this daemon.
    pub tasks: Tasks,
    /// `[tasks]`.
    pub settings: crate::config::types::TasksConfig,
    /// What a worker's turns use, as a session's do (a task's id and host
    /// name it `agent.this_host`; its turns are bounded by `agent.limits`).
    pub agent: Arc<crate::session::AgentHost>,
}

/// The tasks running on this daemon.
#[derive(Debug)]
pub struct Tasks {
    live: Mutex<HashMap<String, Arc<LiveTask>>>,
    active: watch::Sender<usize>,
}

impl Default for Tasks {
    fn default() -> Self {
        Tasks {
            live: Mutex::default(),
            active: watch::Sender::new(0),
        }
    }
}

impl Tasks {
    pub fn active(&self) -> usize {
        *self.active.borrow()
    }

    /// Resolves once no task is running (each has recorded its end).
    pub async fn wait_idle(&self) {
        let mut rx = self.active.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
    }

    fn live(&self) -> MutexGuard<'_, HashMap<String, Arc<LiveTask>>> {
        self.live.lock()
    }

    fn get(&self, id: &str) -> Option<Arc<LiveTask>> {
        self.live().get(id).cloned()
    }
}

/// Starts a worker of `task`; its id, or why not.
fn start_worker(
    team: &Arc<TeamHost>,
    task: &Arc<LiveTask>,
    prompt: String,
    mode: crate::config::types::AiMode,
    lead: bool,
) -> Result<String, String> {
    let index = task.state.lock().admit_worker(team.settings.max_workers)?;
    task.running.send_modify(|n| *n += 1);
    let worker_id = format!("{}:w{index}", task.id);
    let (end_tx, end_rx) = watch::channel(None);
    task.ends.lock().push((worker_id.clone(), end_rx));
    let team = team.clone();
    let task = task.clone();
    let plan = worker::WorkerPlan {
        worker_id: worker_id.clone(),
        prompt,
        mode,
        lead,
    };
    tokio::spawn(async move {
        let _counted = RunningGuard(task.clone());
        let worker_id = plan.worker_id.clone();
        task.publish(
            &team,
            TeamEvent::Started {
                worker_id: worker_id.clone(),
                host_id: team.agent.this_host.id.clone(),
            },
        )
        .await;
        // In its own task, so that even a panic in the driver ends in a
        // recorded failure and safe actuators.
        let end = match tokio::spawn(worker::run(team.clone(), task.clone(), plan)).await {
            Ok(end) => end,
            Err(e) => {
                tracing::error!(%worker_id, error = %e, "worker task failed");
                let origin = crate::ooda::act::Origin::Session(worker_id.clone());
                team.agent
                    .ooda
                    .actuators()
                    .release(&origin, "task worker failed")
                    .await;
                WorkerEnd::Failed {
                    reason: state::FailReason::ModelError,
                    detail: "the worker failed inside rozd".into(),
                }
            }
        };
        tracing::info!(%worker_id, ?end, "worker ended");
        let outcome = match &end {
            WorkerEnd::Completed(result) => Some(TeamEvent::Completed {
                worker_id: worker_id.clone(),
                result: result.clone(),
            }),
            WorkerEnd::Failed { reason, .. } => Some(TeamEvent::Failed {
                worker_id: worker_id.clone(),
                reason: reason.as_str().to_string(),
            }),
            WorkerEnd::Cancelled => None,
        };
        if let Some(event) = outcome {
            task.publish(&team, event).await;
        }
        task.publish(
            &team,
            TeamEvent::Exited {
                worker_id: worker_id.clone(),
                parent_task_id: task.id.clone(),
            },
        )
        .await;
        task.state.lock().worker_exited(&worker_id);
        task.approval_inboxes
            .lock()
            .retain(|_, inbox| !inbox.is_closed());
        task.refresh_status(&team).await;
        let _ = end_tx.send(Some(end));
    });
    Ok(worker_id)
}

/// The host a task id names: ids are `<host id>:<uuid>`, so that any rozd
/// of a fleet can route a request for a task to the host that runs it
/// without asking anyone.
pub(crate) fn task_owner(id: &str) -> Result<&str, TaskError> {
    let malformed = || {
        TaskError::InvalidArgument(format!(
            "task id {id:?} is not <host id>:<uuid> (as CreateTask returns it)"
        ))
    };
    let (host, uuid) = id.split_once(':').ok_or_else(malformed)?;
    if !crate::config::types::valid_id(host) || uuid::Uuid::parse_str(uuid).is_err() {
        return Err(malformed());
    }
    Ok(host)
}

/// A task id of this host that is well formed.
fn check_task_id(team: &TeamHost, id: &str) -> Result<(), TaskError> {
    let owner = task_owner(id)?;
    if owner != team.agent.this_host.id {
        return Err(TaskError::NotFound(format!(
            "task {id} belongs to host {owner:?}, not this one ({:?}); ask that host, or use \
             roz.v1.TaskService, which routes by the id",
            team.agent.this_host.id
        )));
    }
    Ok(())
}

/// Creates and starts a task.
pub(crate) async fn create(team: &Arc<TeamHost>, new: NewTask) -> Result<TaskView, TaskError> {
    let prompt = new.prompt.trim().to_string();
    if prompt.is_empty() {
        return Err(TaskError::InvalidArgument(
            "prompt must not be empty".into(),
        ));
    }
    if prompt.chars().count() > MAX_PROMPT_CHARS {
        return Err(TaskError::InvalidArgument(format!(
            "prompt is longer than {MAX_PROMPT_CHARS} characters"
        )));
    }
    if let Some(host) = new.host_id.as_deref().filter(|h| !h.is_empty())
        && host != team.agent.this_host.id
    {
        return Err(TaskError::NotFound(format!(
            "host {host:?} is not this host ({:?}); tasks for another host are created through \
             roz.v1.TaskService, which routes by host_id",
            team.agent.this_host.id
        )));
    }
    let environment_id = if new.environment_id.is_empty() {
        team.agent.this_host.environment_id.clone()
    } else if new.environment_id == team.agent.this_host.environment_id {
        new.environment_id
    } else {
        return Err(TaskError::InvalidArgument(format!(
            "environment_id {:?} is not this host's environment ({:?})",
            new.environment_id, team.agent.this_host.environment_id
        )));
    };
    let timeout_secs = match new.timeout_secs {
        None => team.settings.default_timeout_secs,
        Some(0) => {
            return Err(TaskError::InvalidArgument(
                "timeout_secs must be at least 1".into(),
            ));
        }
        Some(t) if t > team.settings.max_timeout_secs => {
            return Err(TaskError::InvalidArgument(format!(
                "timeout_secs {t} is above this host's limit of {} (tasks.max_timeout_secs)",
                team.settings.max_timeout_secs
            )));
        }
        Some(t) => t,
    };
    if let Err(e) = team.agent.models.resolve(team.settings.model.as_deref()) {
        return Err(TaskError::FailedPrecondition(format!(
            "the task model is not available: {e}"
        )));
    }
    let stop = team.agent.ooda.protective_stop().state();
    if stop.is_active() {
        return Err(TaskError::FailedPrecondition(format!(
            "a protective stop is active ({}); clear it before starting a task",
            stop.describe()
        )));
    }
    if team.agent.shutdown.is_cancelled() {
        return Err(TaskError::FailedPrecondition(
            "the daemon is shutting down".into(),
        ));
    }
    let now = now_ms();
    let row = TaskRow {
        id: format!("{}:{}", team.agent.this_host.id, uuid::Uuid::new_v4()),
        prompt,
        environment_id,
        host_id: team.agent.this_host.id.clone(),
        status: TaskStatus::Pending.as_str().to_string(),
        detail: None,
        timeout_secs,
        created_at_ms: now,
        updated_at_ms: now,
    };
    let task = Arc::new(LiveTask {
        id: row.id.clone(),
        environment_id: row.environment_id.clone(),
        timeout_secs,
        credential: new.credential,
        state: Mutex::default(),
        stop: CancellationToken::new(),
        approval_inboxes: Mutex::default(),
        ends: Mutex::default(),
        running: watch::Sender::new(0),
        log_seq: watch::Sender::new(1),
        status: tokio::sync::Mutex::new(TaskStatus::Pending),
    });
    {
        let mut live = team.tasks.live();
        if live.len() >= team.settings.max_concurrent as usize {
            return Err(TaskError::ResourceExhausted(format!(
                "{} task(s) are running, the most this host runs at once (tasks.max_concurrent)",
                live.len()
            )));
        }
        live.insert(row.id.clone(), task.clone());
        team.tasks.active.send_modify(|n| *n += 1);
    }
    if let Err(e) = team.agent.store.task_created(row.clone()).await {
        team.tasks.live().remove(&row.id);
        team.tasks.active.send_modify(|n| *n = n.saturating_sub(1));
        return Err(e.into());
    }
    tracing::info!(task_id = %row.id, timeout_secs, "task created");
    let view = task.view(row.clone());
    tokio::spawn(supervise(team.clone(), task, row.prompt));
    Ok(view)
}

/// Runs a task: its lead, the stop conditions, then its final status.
async fn supervise(team: Arc<TeamHost>, task: Arc<LiveTask>, prompt: String) {
    task.set_status(&team, TaskStatus::Running, None).await;
    let lead_id = match start_worker(&team, &task, prompt, team.settings.ai_mode, true) {
        Ok(id) => Some(id),
        Err(e) => {
            tracing::error!(task_id = %task.id, error = %e, "cannot start the task's lead");
            None
        }
    };
    let deadline = tokio::time::sleep(Duration::from_secs(u64::from(task.timeout_secs)));
    tokio::pin!(deadline);
    let mut stop = team.agent.ooda.protective_stop().subscribe();
    let mut running = task.running.subscribe();
    let mut lead_end = lead_id.as_ref().and_then(|id| {
        task.ends
            .lock()
            .iter()
            .find(|(w, _)| w == id)
            .map(|(_, end)| end.clone())
    });
    let _live = LiveGuard {
        team: team.clone(),
        task_id: task.id.clone(),
    };
    loop {
        let stopping = task.stopping().is_some();
        tokio::select! {
            // The sender lives in `task`: this only resolves at zero.
            _ = running.wait_for(|n| *n == 0) => break,
            // A lead that failed leaves no one to collect its workers' work:
            // they stop too.
            ended = lead_failed(&mut lead_end), if !stopping => {
                if let WorkerEnd::Failed { reason, detail } = ended {
                    task.stop(StopCause::LeadFailed(format!("{}: {detail}", reason.as_str())));
                }
            }
            () = &mut deadline, if !stopping => task.stop(StopCause::Timeout),
            changed = stop.wait_for(crate::safety::StopState::is_active), if !stopping => {
                let why = match changed {
                    Ok(state) => state.describe(),
                    Err(_) => "protective stop".into(),
                };
                task.stop(StopCause::EStop(why));
            }
            () = team.agent.shutdown.cancelled(), if !stopping => task.stop(StopCause::Shutdown),
        }
    }
    let lead_end = lead_id.and_then(|id| {
        task.ends
            .lock()
            .iter()
            .find(|(w, _)| *w == id)
            .and_then(|(_, end)| end.borrow().clone())
    });
    let (status, detail) = match (task.stopping(), lead_end) {
        (Some(cause), _) => cause.final_status(),
        (None, Some(WorkerEnd::Completed(result))) => (TaskStatus::Succeeded, result),
        (None, Some(WorkerEnd::Failed { reason, detail })) => {
            (TaskStatus::Failed, format!("{}: {detail}", reason.as_str()))
        }
        (None, Some(WorkerEnd::Cancelled)) => (TaskStatus::Cancelled, "cancelled".into()),
        (None, None) => (
            TaskStatus::Failed,
            "the task's agent could not start".into(),
        ),
    };
    task.set_status(&team, status, Some(detail)).await;
    tracing::info!(task_id = %task.id, status = status.as_str(), "task finished");
}

/// Resolves with the lead's end once it has one; never if there is no lead
/// (or it has already been seen).
async fn lead_failed(lead: &mut Option<watch::Receiver<Option<WorkerEnd>>>) -> WorkerEnd {
    let ended = match lead {
        Some(rx) => rx
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|e| e.clone()),
        None => None,
    };
    match ended {
        Some(end) => {
            *lead = None;
            end
        }
        None => {
            *lead = None;
            std::future::pending().await
        }
    }
}

/// Takes a task off the running list when its supervisor ends, however it ends.
struct LiveGuard {
    team: Arc<TeamHost>,
    task_id: String,
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.team.tasks.live().remove(&self.task_id);
        self.team
            .tasks
            .active
            .send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Counts a worker out when its task ends, however it ends.
struct RunningGuard(Arc<LiveTask>);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.0.running.send_modify(|n| *n = n.saturating_sub(1));
    }
}

async fn load_row(team: &TeamHost, id: &str) -> Result<TaskRow, TaskError> {
    check_task_id(team, id)?;
    team.agent
        .store
        .task(id.to_string())
        .await?
        .ok_or_else(|| TaskError::NotFound(format!("no task {id:?} on this host")))
}

fn view(team: &TeamHost, row: TaskRow) -> TaskView {
    match team.tasks.get(&row.id) {
        Some(task) => task.view(row),
        None => TaskView {
            row,
            pending_approvals: Vec::new(),
        },
    }
}

pub(crate) async fn get(team: &TeamHost, id: &str) -> Result<TaskView, TaskError> {
    let row = load_row(team, id).await?;
    Ok(view(team, row))
}

/// Tasks, newest first.
pub(crate) async fn list(
    team: &TeamHost,
    limit: u32,
    offset: u32,
) -> Result<Vec<TaskView>, TaskError> {
    let rows = team.agent.store.tasks(limit, offset).await?;
    Ok(rows.into_iter().map(|r| view(team, r)).collect())
}

/// Stops a running task; its workers exit and their actuators go safe.
pub(crate) async fn cancel(team: &TeamHost, id: &str) -> Result<(), TaskError> {
    let row = load_row(team, id).await?;
    match team.tasks.get(id) {
        Some(task) => {
            task.stop(StopCause::Cancelled);
            Ok(())
        }
        None => Err(TaskError::FailedPrecondition(format!(
            "task {id} has already finished ({})",
            row.status
        ))),
    }
}

/// How an answer to a task's call arrived (the audit's `origin` of a
/// refused one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AnsweredVia {
    /// `TaskService.ApproveToolUse`.
    Grpc,
    /// `POST /v1/tasks/{id}/approvals`.
    Rest,
}

impl AnsweredVia {
    fn as_str(self) -> &'static str {
        match self {
            AnsweredVia::Grpc => "ApproveToolUse",
            AnsweredVia::Rest => "POST /v1/tasks/{id}/approvals",
        }
    }
}

/// Answers a tool call waiting for approval, as credential `by`. With
/// `approvals.require_other_credential`, the credential that created the
/// task may deny its calls but not approve them (refused and audited; the
/// call keeps waiting).
pub(crate) async fn approve(
    team: &TeamHost,
    task_id: &str,
    tool_call_id: &str,
    approved: bool,
    by: Option<String>,
    via: AnsweredVia,
) -> Result<TaskView, TaskError> {
    let row = load_row(team, task_id).await?;
    let Some(task) = team.tasks.get(task_id) else {
        return Err(TaskError::FailedPrecondition(format!(
            "task {task_id} has already finished ({})",
            row.status
        )));
    };
    let waiting = task.state.lock().approvals.get(tool_call_id).cloned();
    if let Some(call) = waiting
        && let Err(own) =
            team.agent
                .permissions
                .may_answer(task.credential.as_deref(), by.as_deref(), approved)
    {
        let why = own.to_string();
        tracing::warn!(
            task_id,
            tool_call_id,
            credential = by.as_deref().unwrap_or(""),
            "refused: a credential approving a call of its own task"
        );
        let record = crate::session::host_call::own_approval_refused(
            &call.worker_id,
            &call.call_id,
            &call.tool,
            &call.parameters,
            via.as_str(),
            by.as_deref(),
            &why,
        );
        if let Err(e) = team.agent.store.audit(record).await {
            tracing::error!(error = %e, "cannot write the audit record of a refused approval");
        }
        return Err(TaskError::PermissionDenied(why));
    }
    let pending = task.state.lock().approvals.remove(tool_call_id);
    let inbox = task.approval_inboxes.lock().remove(tool_call_id);
    let (Some(pending), Some(inbox)) = (pending, inbox) else {
        return Err(TaskError::NotFound(format!(
            "no tool call {tool_call_id:?} waits for approval in task {task_id}"
        )));
    };
    tracing::info!(task_id, tool_call_id, tool = %pending.tool, worker_id = %pending.worker_id, approved, approved_by = by.as_deref().unwrap_or(""), "tool use decided");
    let decision = TurnInput::Decision {
        tool_call_id: pending.call_id.clone(),
        approved,
        by,
    };
    if inbox.send(decision).await.is_err() {
        return Err(TaskError::FailedPrecondition(format!(
            "worker {} is no longer running",
            pending.worker_id
        )));
    }
    task.refresh_status(team).await;
    let row = load_row(team, task_id).await?;
    Ok(task.view(row))
}

/// Which part of a task's log a watcher follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Follow {
    TeamEvents,
    Status,
}

/// Follows a task's log from its start: every stored entry in order, then
/// new ones as they are written, until the task has finished and every
/// entry is delivered. The task must exist (checked before streaming).
pub(crate) async fn follow(
    team: Arc<TeamHost>,
    task_id: String,
    which: Follow,
) -> Result<mpsc::Receiver<Result<StoredTaskEvent, TaskError>>, TaskError> {
    load_row(&team, &task_id).await?;
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let status_only = Some(which == Follow::Status);
        let mut wake = team.tasks.get(&task_id).map(|t| t.log_seq.subscribe());
        let mut cursor = 0;
        loop {
            // Finished is read before the log: every entry of a finished
            // task was written before its final status. Whether it still runs
            // is read before that: a task stops running after its final status.
            let running = team.tasks.get(&task_id).is_some();
            let finished = match team.agent.store.task(task_id.clone()).await {
                Ok(Some(row)) => TaskStatus::is_terminal_str(&row.status),
                Ok(None) => true,
                Err(e) => {
                    let _ = tx.send(Err(e.into())).await;
                    return;
                }
            };
            loop {
                let batch = match team
                    .agent
                    .store
                    .task_events(task_id.clone(), cursor, status_only, WATCH_BATCH)
                    .await
                {
                    Ok(batch) => batch,
                    Err(e) => {
                        let _ = tx.send(Err(e.into())).await;
                        return;
                    }
                };
                let full = batch.len() == WATCH_BATCH as usize;
                for entry in batch {
                    cursor = entry.seq;
                    if tx.send(Ok(entry)).await.is_err() {
                        return;
                    }
                }
                if !full {
                    break;
                }
            }
            if finished {
                return;
            }
            if !running {
                // Its final status could not be stored (see the daemon log):
                // end rather than wait for an entry that will never come.
                let _ = tx
                    .send(Err(TaskError::Internal(format!(
                        "task {task_id} is no longer running but its final status was not recorded"
                    ))))
                    .await;
                return;
            }
            match &mut wake {
                Some(rx) => {
                    tokio::select! {
                        changed = rx.changed() => if changed.is_err() { wake = None },
                        () = tx.closed() => return,
                    }
                }
                None => {
                    tokio::select! {
                        () = tokio::time::sleep(WATCH_POLL) => {}
                        () = tx.closed() => return,
                    }
                }
            }
        }
    });
    Ok(rx)
}

/// After a restart: no task resumes physical work by itself. Tasks that were
/// running are failed (`interrupted`), their workers reported failed
/// (`e_stop`: the host stopped under them) and exited.
pub(crate) async fn recover(store: &crate::store::Store) -> Result<Vec<String>, StoreError> {
    let closed = store
        .close_unfinished_tasks(
            TaskStatus::TERMINAL,
            TaskStatus::Failed.as_str(),
            state::INTERRUPTED,
            state::FailReason::EStop.as_str(),
        )
        .await?;
    if !closed.is_empty() {
        tracing::warn!(tasks = ?closed, "tasks interrupted by the restart marked failed");
    }
    Ok(closed)
}
