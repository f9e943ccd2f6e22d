//! Tasks and their event logs.
//!
//! Each task has one append-only log: its status changes (`kind = "status"`)
//! and its team events (`kind = "worker_*"`), numbered by `seq` from 1 with
//! no gaps. A status change updates the task row and appends to the log in
//! one transaction, so the row and the log never disagree. Readers follow a
//! log by `seq`, which is what lets `WatchTeam` replay and then go live
//! without a gap or a duplicate.

use rusqlite::{Connection, OptionalExtension, Row, Transaction, params};
use serde::Serialize;

use super::{Store, StoreError};
use crate::clock::now_ms;

/// A task as stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TaskRow {
    pub id: String,
    pub prompt: String,
    pub environment_id: String,
    pub host_id: String,
    pub status: String,
    pub detail: Option<String>,
    pub timeout_secs: u32,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

/// One entry of a task's log.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoredTaskEvent {
    pub seq: i64,
    pub at_ms: i64,
    /// `status` or a team event kind (`worker_started`, ...).
    pub kind: String,
    pub worker_id: Option<String>,
    /// The event's fields as JSON.
    pub body: serde_json::Value,
}

const TASK_COLUMNS: &str = "id, prompt, environment_id, host_id, status, detail, timeout_secs, created_at_ms, updated_at_ms";

fn task_row(r: &Row<'_>) -> Result<TaskRow, rusqlite::Error> {
    Ok(TaskRow {
        id: r.get(0)?,
        prompt: r.get(1)?,
        environment_id: r.get(2)?,
        host_id: r.get(3)?,
        status: r.get(4)?,
        detail: r.get(5)?,
        timeout_secs: r.get(6)?,
        created_at_ms: r.get(7)?,
        updated_at_ms: r.get(8)?,
    })
}

fn append(
    tx: &Transaction<'_>,
    task_id: &str,
    at_ms: i64,
    kind: &str,
    worker_id: Option<&str>,
    body: &serde_json::Value,
) -> Result<i64, rusqlite::Error> {
    let seq: i64 = tx.query_row(
        "SELECT COALESCE(MAX(seq), 0) + 1 FROM task_events WHERE task_id = ?1",
        params![task_id],
        |r| r.get(0),
    )?;
    tx.execute(
        "INSERT INTO task_events (task_id, seq, at_ms, kind, worker_id, body) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![task_id, seq, at_ms, kind, worker_id, body.to_string()],
    )?;
    Ok(seq)
}

fn set_status(
    tx: &Transaction<'_>,
    task_id: &str,
    status: &str,
    detail: Option<&str>,
    at_ms: i64,
) -> Result<i64, rusqlite::Error> {
    tx.execute(
        "UPDATE tasks SET status = ?1, detail = ?2, updated_at_ms = ?3 WHERE id = ?4",
        params![status, detail, at_ms, task_id],
    )?;
    let body = serde_json::json!({ "status": status, "detail": detail });
    append(tx, task_id, at_ms, "status", None, &body)
}

fn events(
    c: &Connection,
    task_id: &str,
    after_seq: i64,
    status_only: Option<bool>,
    limit: u32,
) -> Result<Vec<StoredTaskEvent>, rusqlite::Error> {
    let filter = match status_only {
        None => "",
        Some(true) => "AND kind = 'status'",
        Some(false) => "AND kind <> 'status'",
    };
    let mut stmt = c.prepare(&format!(
        "SELECT seq, at_ms, kind, worker_id, body FROM task_events
         WHERE task_id = ?1 AND seq > ?2 {filter} ORDER BY seq LIMIT ?3"
    ))?;
    let rows = stmt.query_map(params![task_id, after_seq, limit], |r| {
        let body: String = r.get(4)?;
        Ok(StoredTaskEvent {
            seq: r.get(0)?,
            at_ms: r.get(1)?,
            kind: r.get(2)?,
            worker_id: r.get(3)?,
            body: serde_json::from_str(&body).unwrap_or(serde_json::Value::Null),
        })
    })?;
    rows.collect()
}

impl Store {
    /// Records a new task with its first status (log entry 1).
    pub async fn task_created(&self, task: TaskRow) -> Result<(), StoreError> {
        for observer in self.observers() {
            observer.task(serde_json::json!({
                "event": "created", "task_id": task.id, "status": task.status,
                "detail": task.detail, "prompt": task.prompt,
            }));
        }
        self.with_write("task", move |c| {
            let tx = c.transaction()?;
            tx.execute(
                &format!(
                    "INSERT INTO tasks ({TASK_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
                ),
                params![
                    task.id,
                    task.prompt,
                    task.environment_id,
                    task.host_id,
                    task.status,
                    task.detail,
                    task.timeout_secs,
                    task.created_at_ms,
                    task.updated_at_ms
                ],
            )?;
            let body = serde_json::json!({ "status": task.status, "detail": task.detail });
            append(&tx, &task.id, task.created_at_ms, "status", None, &body)?;
            tx.commit()
        })
        .await
    }

    /// Changes a task's status and logs the change; returns the entry's `seq`.
    pub async fn task_status(
        &self,
        task_id: String,
        status: String,
        detail: Option<String>,
    ) -> Result<i64, StoreError> {
        for observer in self.observers() {
            observer.task(serde_json::json!({
                "event": "status", "task_id": task_id, "status": status, "detail": detail,
            }));
        }
        self.with_write("task", move |c| {
            let tx = c.transaction()?;
            let seq = set_status(&tx, &task_id, &status, detail.as_deref(), now_ms())?;
            tx.commit()?;
            Ok(seq)
        })
        .await
    }

    /// Appends a team event to a task's log; returns its `seq`.
    pub async fn task_event(
        &self,
        task_id: String,
        kind: String,
        worker_id: Option<String>,
        body: serde_json::Value,
    ) -> Result<i64, StoreError> {
        for observer in self.observers() {
            observer.task(serde_json::json!({
                "event": "team_event", "task_id": task_id, "kind": kind,
                "worker_id": worker_id, "body": body,
            }));
        }
        self.with_write("task", move |c| {
            let tx = c.transaction()?;
            let seq = append(&tx, &task_id, now_ms(), &kind, worker_id.as_deref(), &body)?;
            tx.commit()?;
            Ok(seq)
        })
        .await
    }

    pub async fn task(&self, id: String) -> Result<Option<TaskRow>, StoreError> {
        self.with_conn(move |c| {
            c.query_row(
                &format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?1"),
                params![id],
                task_row,
            )
            .optional()
        })
        .await
    }

    /// Tasks, newest first.
    pub async fn tasks(&self, limit: u32, offset: u32) -> Result<Vec<TaskRow>, StoreError> {
        self.with_conn(move |c| {
            let mut stmt = c.prepare(&format!(
                "SELECT {TASK_COLUMNS} FROM tasks ORDER BY created_at_ms DESC, rowid DESC LIMIT ?1 OFFSET ?2"
            ))?;
            let rows = stmt.query_map(params![limit, offset], task_row)?;
            rows.collect()
        })
        .await
    }

    /// Log entries after `after_seq`, in order: all of them, only status
    /// changes (`Some(true)`) or only team events (`Some(false)`).
    pub async fn task_events(
        &self,
        task_id: String,
        after_seq: i64,
        status_only: Option<bool>,
        limit: u32,
    ) -> Result<Vec<StoredTaskEvent>, StoreError> {
        self.with_conn(move |c| events(c, &task_id, after_seq, status_only, limit))
            .await
    }

    /// After a restart: every task that had not finished is failed with
    /// `detail`; each of its workers that had started and not exited gets
    /// `worker_failed {reason}` and `worker_exited`, in one transaction per
    /// task. Returns the ids of the tasks it closed.
    pub async fn close_unfinished_tasks(
        &self,
        terminal: &'static [&'static str],
        status: &'static str,
        detail: &'static str,
        reason: &'static str,
    ) -> Result<Vec<String>, StoreError> {
        self.with_write("task", move |c| {
            let placeholders = terminal
                .iter()
                .map(|s| format!("'{s}'"))
                .collect::<Vec<_>>()
                .join(", ");
            let open: Vec<String> = {
                let mut stmt = c.prepare(&format!(
                    "SELECT id FROM tasks WHERE status NOT IN ({placeholders}) ORDER BY created_at_ms"
                ))?;
                stmt.query_map([], |r| r.get(0))?
                    .collect::<Result<_, _>>()?
            };
            for task_id in &open {
                let tx = c.transaction()?;
                let running: Vec<String> = {
                    let mut stmt = tx.prepare(
                        "SELECT worker_id FROM task_events WHERE task_id = ?1 AND kind = 'worker_started'
                         AND worker_id NOT IN (SELECT worker_id FROM task_events
                                               WHERE task_id = ?1 AND kind = 'worker_exited')
                         ORDER BY seq",
                    )?;
                    stmt.query_map(params![task_id], |r| r.get(0))?
                        .collect::<Result<_, _>>()?
                };
                let at = now_ms();
                for worker in &running {
                    let failed_already: bool = tx.query_row(
                        "SELECT EXISTS (SELECT 1 FROM task_events WHERE task_id = ?1 AND worker_id = ?2
                         AND kind IN ('worker_failed', 'worker_completed'))",
                        params![task_id, worker],
                        |r| r.get(0),
                    )?;
                    if !failed_already {
                        let body = serde_json::json!({ "worker_id": worker, "reason": reason });
                        append(&tx, task_id, at, "worker_failed", Some(worker), &body)?;
                    }
                    let body = serde_json::json!({ "worker_id": worker, "parent_task_id": task_id });
                    append(&tx, task_id, at, "worker_exited", Some(worker), &body)?;
                }
                set_status(&tx, task_id, status, Some(detail), at)?;
                tx.commit()?;
            }
            Ok(open)
        })
        .await
    }
}
