//! A running task as the supervisor, its workers and the API share it:
//! its stop, status, published events, pending approvals and workers.

use super::*;

/// A worker's id and, once it has one, its end.
pub(super) type WorkerEndWatch = (String, watch::Receiver<Option<WorkerEnd>>);

/// A running task.
#[derive(Debug)]
pub(crate) struct LiveTask {
    pub id: String,
    pub environment_id: String,
    pub timeout_secs: u32,
    /// The credential that created the task, which the audit names.
    pub credential: Option<String>,
    pub(super) state: Mutex<TaskState>,
    /// Cancelled once the task is being stopped (cancel, timeout, stop, shutdown).
    pub(super) stop: CancellationToken,
    /// Inbox of the worker whose call waits, by tool call id.
    pub(super) approval_inboxes: Mutex<HashMap<String, mpsc::Sender<TurnInput>>>,
    /// Each worker's end, once it has one.
    pub(super) ends: Mutex<Vec<WorkerEndWatch>>,
    /// Workers not yet exited.
    pub(super) running: watch::Sender<u32>,
    /// Highest sequence number written to the task's log.
    pub(super) log_seq: watch::Sender<i64>,
    /// The status last written. Held across the store write, so status
    /// changes reach the store in the order they were decided, and nothing
    /// follows a final status.
    pub(super) status: tokio::sync::Mutex<TaskStatus>,
}

impl LiveTask {
    pub(super) fn stopping(&self) -> Option<StopCause> {
        self.state.lock().stopping.clone()
    }

    /// Stops every worker of the task (the first cause is the one reported).
    pub(super) fn stop(&self, cause: StopCause) {
        if self.state.lock().stop(cause.clone()) {
            tracing::info!(task_id = %self.id, ?cause, "stopping task");
        }
        self.stop.cancel();
    }

    pub(super) fn published(&self, seq: i64) {
        self.log_seq.send_if_modified(|latest| {
            let newer = seq > *latest;
            if newer {
                *latest = seq;
            }
            newer
        });
    }

    /// Appends a team event to the store, then wakes the watchers.
    pub(super) async fn publish(&self, team: &TeamHost, event: TeamEvent) {
        let stored = team
            .agent
            .store
            .task_event(
                self.id.clone(),
                event.kind().to_string(),
                Some(event.worker_id().to_string()),
                event.body(),
            )
            .await;
        match stored {
            Ok(seq) => self.published(seq),
            Err(e) => {
                tracing::error!(task_id = %self.id, error = %e, ?event, "cannot store a team event");
            }
        }
    }

    /// Writes a status change (only a change) to the store, then wakes the
    /// watchers. A final status is tried a few times: watchers end on it.
    pub(super) async fn set_status(
        &self,
        team: &TeamHost,
        status: TaskStatus,
        detail: Option<String>,
    ) {
        let mut current = self.status.lock().await;
        if current.is_terminal() || (*current == status && !status.is_terminal()) {
            return;
        }
        let attempts: u64 = if status.is_terminal() { 3 } else { 1 };
        for attempt in 1..=attempts {
            match team
                .agent
                .store
                .task_status(self.id.clone(), status.as_str().to_string(), detail.clone())
                .await
            {
                Ok(seq) => {
                    *current = status;
                    self.published(seq);
                    return;
                }
                Err(e) => {
                    tracing::error!(task_id = %self.id, error = %e, status = status.as_str(), attempt, "cannot store a task status");
                    if attempt < attempts {
                        tokio::time::sleep(Duration::from_millis(100 * attempt)).await;
                    }
                }
            }
        }
    }

    /// The status a running task shows (running or waiting_approval),
    /// written if it changed; nothing once the task is stopping.
    pub(super) async fn refresh_status(&self, team: &TeamHost) {
        let (status, detail) = {
            let state = self.state.lock();
            if state.stopping.is_some() {
                return;
            }
            let detail = state.approvals.values().next().map(|p| {
                format!(
                    "{} ({}) of {} waits for approval",
                    p.tool_call_id, p.tool, p.worker_id
                )
            });
            (state.live_status(), detail)
        };
        self.set_status(team, status, detail).await;
    }

    pub(super) async fn approval_waiting(
        &self,
        team: &TeamHost,
        mut pending: PendingApproval,
        inbox: mpsc::Sender<TurnInput>,
    ) {
        {
            let mut state = self.state.lock();
            // Providers make call ids unique per conversation, not per task:
            // two workers may wait on the same one.
            if state.approvals.contains_key(&pending.tool_call_id) {
                pending.tool_call_id = format!("{}:{}", pending.worker_id, pending.call_id);
            }
            self.approval_inboxes
                .lock()
                .insert(pending.tool_call_id.clone(), inbox);
            state
                .approvals
                .insert(pending.tool_call_id.clone(), pending);
        }
        self.refresh_status(team).await;
    }

    pub(super) async fn approvals_done(&self, team: &TeamHost, worker_id: &str) {
        let removed: Vec<String> = {
            let mut state = self.state.lock();
            let ids: Vec<String> = state
                .approvals
                .values()
                .filter(|p| p.worker_id == worker_id)
                .map(|p| p.tool_call_id.clone())
                .collect();
            for id in &ids {
                state.approvals.remove(id);
            }
            ids
        };
        if removed.is_empty() {
            return;
        }
        {
            let mut inboxes = self.approval_inboxes.lock();
            for id in &removed {
                inboxes.remove(id);
            }
        }
        self.refresh_status(team).await;
    }

    /// The end receivers of the given workers (default: every worker but the caller).
    pub(super) fn worker_ends(
        &self,
        wanted: Option<Vec<String>>,
        caller: &str,
    ) -> Result<Vec<WorkerEndWatch>, String> {
        let ends = self.ends.lock();
        match wanted {
            None => Ok(ends
                .iter()
                .filter(|(id, _)| id != caller)
                .cloned()
                .collect()),
            Some(ids) => ids
                .into_iter()
                .map(|id| {
                    ends.iter()
                        .find(|(known, _)| *known == id && known != caller)
                        .cloned()
                        .ok_or_else(|| format!("{id:?} is not a worker of this task"))
                })
                .collect(),
        }
    }

    pub(super) fn view(&self, row: TaskRow) -> TaskView {
        TaskView {
            row,
            pending_approvals: self
                .state
                .lock()
                .approvals
                .values()
                .map(|p| ApprovalView {
                    tool_call_id: p.tool_call_id.clone(),
                    worker_id: p.worker_id.clone(),
                    tool: p.tool.clone(),
                    parameters: p.parameters.clone(),
                })
                .collect(),
        }
    }
}
