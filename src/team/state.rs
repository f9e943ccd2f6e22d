//! A task's vocabulary and rules as plain data: statuses, why workers fail,
//! team events, and the live state of a task (its workers and the tool calls
//! waiting for approval). Nothing here does I/O.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// A task's status. `succeeded`, `failed`, `cancelled` and `timed_out` are final.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskStatus {
    Pending,
    Running,
    WaitingApproval,
    Succeeded,
    Failed,
    Cancelled,
    TimedOut,
}

impl TaskStatus {
    /// Final statuses, as stored.
    pub(crate) const TERMINAL: &'static [&'static str] =
        &["succeeded", "failed", "cancelled", "timed_out"];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Pending => "pending",
            TaskStatus::Running => "running",
            TaskStatus::WaitingApproval => "waiting_approval",
            TaskStatus::Succeeded => "succeeded",
            TaskStatus::Failed => "failed",
            TaskStatus::Cancelled => "cancelled",
            TaskStatus::TimedOut => "timed_out",
        }
    }

    pub(crate) fn is_terminal(self) -> bool {
        Self::TERMINAL.contains(&self.as_str())
    }

    pub(crate) fn is_terminal_str(status: &str) -> bool {
        Self::TERMINAL.contains(&status)
    }
}

/// Why a worker failed: exactly the reasons `WorkerFailed.reason` may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailReason {
    /// A protective stop, or the daemon stopping under the worker.
    EStop,
    /// The task's `timeout_secs` ran out.
    Timeout,
    /// The model (provider) failed, or the agent failed inside rozd.
    ModelError,
    /// The worker asked for something outside the host's limits.
    SafetyViolation,
}

impl FailReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            FailReason::EStop => "e_stop",
            FailReason::Timeout => "timeout",
            FailReason::ModelError => "model_error",
            FailReason::SafetyViolation => "safety_violation",
        }
    }
}

/// Why the whole task is being stopped before its workers finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StopCause {
    Cancelled,
    Timeout,
    EStop(String),
    /// The daemon is shutting down.
    Shutdown,
    /// The lead failed (`<reason>: <detail>`); its workers are stopped.
    LeadFailed(String),
}

impl StopCause {
    /// What each running worker reports; `None` for a cancel (not a failure).
    pub(crate) fn worker_failure(&self) -> Option<FailReason> {
        match self {
            StopCause::Cancelled | StopCause::LeadFailed(_) => None,
            StopCause::Timeout => Some(FailReason::Timeout),
            StopCause::EStop(_) | StopCause::Shutdown => Some(FailReason::EStop),
        }
    }

    /// The task's final status and detail.
    pub(crate) fn final_status(&self) -> (TaskStatus, String) {
        match self {
            StopCause::Cancelled => (TaskStatus::Cancelled, "cancelled".into()),
            StopCause::Timeout => (TaskStatus::TimedOut, "timeout".into()),
            StopCause::EStop(why) => (TaskStatus::Failed, format!("e_stop: {why}")),
            StopCause::Shutdown => (TaskStatus::Failed, INTERRUPTED.into()),
            StopCause::LeadFailed(why) => (TaskStatus::Failed, why.clone()),
        }
    }
}

/// Detail of a task the daemon stopped under (shutdown or restart).
pub(crate) const INTERRUPTED: &str = "interrupted";

/// How a worker ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WorkerEnd {
    Completed(String),
    Failed { reason: FailReason, detail: String },
    Cancelled,
}

impl WorkerEnd {
    /// What `await_workers` tells the lead about this worker.
    pub(crate) fn to_json(&self, worker_id: &str) -> Value {
        match self {
            WorkerEnd::Completed(result) => {
                json!({"worker_id": worker_id, "status": "completed", "result": result})
            }
            WorkerEnd::Failed { reason, detail } => json!({
                "worker_id": worker_id, "status": "failed", "reason": reason.as_str(), "detail": detail
            }),
            WorkerEnd::Cancelled => json!({"worker_id": worker_id, "status": "cancelled"}),
        }
    }
}

/// One team event, as published by `WatchTeam` and stored in the task's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TeamEvent {
    Started {
        worker_id: String,
        host_id: String,
    },
    Phase {
        worker_id: String,
        phase: u32,
        mode: String,
    },
    ToolCall {
        worker_id: String,
        tool: String,
    },
    Completed {
        worker_id: String,
        result: String,
    },
    Failed {
        worker_id: String,
        reason: String,
    },
    Exited {
        worker_id: String,
        parent_task_id: String,
    },
}

impl TeamEvent {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            TeamEvent::Started { .. } => "worker_started",
            TeamEvent::Phase { .. } => "worker_phase",
            TeamEvent::ToolCall { .. } => "worker_tool_call",
            TeamEvent::Completed { .. } => "worker_completed",
            TeamEvent::Failed { .. } => "worker_failed",
            TeamEvent::Exited { .. } => "worker_exited",
        }
    }

    pub(crate) fn worker_id(&self) -> &str {
        match self {
            TeamEvent::Started { worker_id, .. }
            | TeamEvent::Phase { worker_id, .. }
            | TeamEvent::ToolCall { worker_id, .. }
            | TeamEvent::Completed { worker_id, .. }
            | TeamEvent::Failed { worker_id, .. }
            | TeamEvent::Exited { worker_id, .. } => worker_id,
        }
    }

    /// The event's fields as stored.
    pub(crate) fn body(&self) -> Value {
        match self {
            TeamEvent::Started { worker_id, host_id } => {
                json!({"worker_id": worker_id, "host_id": host_id})
            }
            TeamEvent::Phase {
                worker_id,
                phase,
                mode,
            } => json!({"worker_id": worker_id, "phase": phase, "mode": mode}),
            TeamEvent::ToolCall { worker_id, tool } => {
                json!({"worker_id": worker_id, "tool": tool})
            }
            TeamEvent::Completed { worker_id, result } => {
                json!({"worker_id": worker_id, "result": result})
            }
            TeamEvent::Failed { worker_id, reason } => {
                json!({"worker_id": worker_id, "reason": reason})
            }
            TeamEvent::Exited {
                worker_id,
                parent_task_id,
            } => json!({"worker_id": worker_id, "parent_task_id": parent_task_id}),
        }
    }

    /// Rebuilds an event from the store; `None` for an entry that is not one.
    pub(crate) fn from_stored(kind: &str, body: &Value) -> Option<TeamEvent> {
        let text = |key: &str| body.get(key).and_then(Value::as_str).map(str::to_string);
        let worker_id = text("worker_id")?;
        Some(match kind {
            "worker_started" => TeamEvent::Started {
                worker_id,
                host_id: text("host_id")?,
            },
            "worker_phase" => TeamEvent::Phase {
                worker_id,
                phase: u32::try_from(body.get("phase")?.as_u64()?).ok()?,
                mode: text("mode")?,
            },
            "worker_tool_call" => TeamEvent::ToolCall {
                worker_id,
                tool: text("tool")?,
            },
            "worker_completed" => TeamEvent::Completed {
                worker_id,
                result: text("result")?,
            },
            "worker_failed" => TeamEvent::Failed {
                worker_id,
                reason: text("reason")?,
            },
            "worker_exited" => TeamEvent::Exited {
                worker_id,
                parent_task_id: text("parent_task_id")?,
            },
            _ => return None,
        })
    }
}

/// A tool call waiting for `ApproveToolUse`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PendingApproval {
    /// The id `ApproveToolUse` names: the model's call id, qualified with the
    /// worker id should another worker already wait on the same call id.
    pub tool_call_id: String,
    /// The call id as the worker's turn knows it.
    pub call_id: String,
    pub worker_id: String,
    pub tool: String,
    /// The call's parameters, as the model gave them.
    pub parameters: serde_json::Value,
}

/// The live state of a running task. The status follows from it: running
/// while no call waits for approval, `waiting_approval` while one does.
#[derive(Debug, Default)]
pub(crate) struct TaskState {
    /// Workers started so far (worker zero included), by index.
    pub started: u32,
    pub approvals: BTreeMap<String, PendingApproval>,
    /// Set once the task is being stopped; no worker starts after that.
    pub stopping: Option<StopCause>,
}

impl TaskState {
    /// The status a running task shows now.
    pub(crate) fn live_status(&self) -> TaskStatus {
        if self.approvals.is_empty() {
            TaskStatus::Running
        } else {
            TaskStatus::WaitingApproval
        }
    }

    /// Admits a new worker: its index, or why not.
    pub(crate) fn admit_worker(&mut self, max_spawned: u32) -> Result<u32, String> {
        if let Some(cause) = &self.stopping {
            return Err(format!("the task is stopping ({cause:?}); no new workers"));
        }
        // Worker zero is the task's own agent and does not count.
        if self.started > max_spawned {
            return Err(format!(
                "this task has already started its {max_spawned} worker(s) (tasks.max_workers)"
            ));
        }
        let index = self.started;
        self.started += 1;
        Ok(index)
    }

    pub(crate) fn worker_exited(&mut self, worker_id: &str) {
        self.approvals.retain(|_, p| p.worker_id != worker_id);
    }

    /// Records the first stop cause; later ones do not replace it.
    pub(crate) fn stop(&mut self, cause: StopCause) -> bool {
        if self.stopping.is_some() {
            return false;
        }
        self.stopping = Some(cause);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_worker_zero_plus_max_workers_then_refuses() {
        let mut s = TaskState::default();
        assert_eq!(s.admit_worker(2), Ok(0));
        assert_eq!(s.admit_worker(2), Ok(1));
        assert_eq!(s.admit_worker(2), Ok(2));
        assert!(s.admit_worker(2).unwrap_err().contains("max_workers"));
        assert_eq!(s.started, 3);
    }

    #[test]
    fn no_worker_starts_once_stopping_and_first_cause_wins() {
        let mut s = TaskState::default();
        assert!(s.stop(StopCause::Timeout));
        assert!(!s.stop(StopCause::Cancelled));
        assert_eq!(s.stopping, Some(StopCause::Timeout));
        assert!(s.admit_worker(5).is_err());
    }

    #[test]
    fn status_follows_pending_approvals_and_exit_clears_them() {
        let mut s = TaskState::default();
        assert_eq!(s.live_status(), TaskStatus::Running);
        s.approvals.insert(
            "c1".into(),
            PendingApproval {
                tool_call_id: "c1".into(),
                call_id: "c1".into(),
                worker_id: "w".into(),
                tool: "fan".into(),
                parameters: serde_json::json!({"value": 1}),
            },
        );
        assert_eq!(s.live_status(), TaskStatus::WaitingApproval);
        s.worker_exited("w");
        assert_eq!(s.live_status(), TaskStatus::Running);
    }

    #[test]
    fn stop_causes_map_to_reasons_and_final_statuses() {
        assert_eq!(StopCause::Cancelled.worker_failure(), None);
        assert_eq!(
            StopCause::Timeout.worker_failure(),
            Some(FailReason::Timeout)
        );
        assert_eq!(
            StopCause::Shutdown.final_status(),
            (TaskStatus::Failed, "interrupted".to_string())
        );
        assert_eq!(StopCause::Timeout.final_status().0, TaskStatus::TimedOut);
        assert!(TaskStatus::TimedOut.is_terminal());
        assert!(!TaskStatus::WaitingApproval.is_terminal());
    }

    #[test]
    fn team_events_round_trip_through_the_stored_form() {
        let events = [
            TeamEvent::Started {
                worker_id: "t:w0".into(),
                host_id: "h".into(),
            },
            TeamEvent::Phase {
                worker_id: "t:w0".into(),
                phase: 3,
                mode: "react".into(),
            },
            TeamEvent::ToolCall {
                worker_id: "t:w0".into(),
                tool: "observe".into(),
            },
            TeamEvent::Completed {
                worker_id: "t:w0".into(),
                result: "done".into(),
            },
            TeamEvent::Failed {
                worker_id: "t:w0".into(),
                reason: "timeout".into(),
            },
            TeamEvent::Exited {
                worker_id: "t:w0".into(),
                parent_task_id: "t".into(),
            },
        ];
        for e in events {
            assert_eq!(TeamEvent::from_stored(e.kind(), &e.body()), Some(e));
        }
        assert_eq!(TeamEvent::from_stored("status", &json!({})), None);
    }
}
