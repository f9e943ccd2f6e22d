//! The store's retention: what is older than `store.retain_days` goes
//! (ended sessions that started before it, with their turns and feedback;
//! finished tasks last updated before it, with their logs; audit rows), and above `store.max_size_mb` the oldest ended
//! sessions and finished tasks go first — never an audit row younger than
//! `retain_days`, which only age removes. A pruning that deleted anything
//! is followed by a vacuum, so the file shrinks too.

use rusqlite::{Connection, params};
use serde::Serialize;

use super::{Store, StoreError};
use crate::clock::now_ms;

const DAY_MS: i64 = 86_400_000;

/// The policy, from `[store]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// 0: keep forever.
    pub retain_days: u32,
    /// 0: no cap.
    pub max_bytes: u64,
}

/// What a pruning did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Pruned {
    pub sessions: u64,
    pub tasks: u64,
    pub audit: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Still over the cap with nothing left that the policy lets go (the
    /// audit within `retain_days` alone is larger).
    pub over_cap: bool,
}

/// Bytes of the database that hold data (pages not on the free list).
fn used_bytes(c: &Connection) -> Result<u64, rusqlite::Error> {
    let pages: i64 = c.query_row("PRAGMA page_count", [], |r| r.get(0))?;
    let free: i64 = c.query_row("PRAGMA freelist_count", [], |r| r.get(0))?;
    let size: i64 = c.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    Ok(u64::try_from((pages - free).max(0) * size).unwrap_or(0))
}

/// Deletes the ended sessions chosen by `which` (a `SELECT id FROM
/// sessions ...`) with their turns and feedback; how many sessions went.
fn delete_sessions(c: &Connection, which: &str, param: i64) -> Result<u64, rusqlite::Error> {
    c.execute(
        &format!("DELETE FROM turns WHERE session_id IN ({which})"),
        params![param],
    )?;
    c.execute(
        &format!("DELETE FROM feedback WHERE session_id IN ({which})"),
        params![param],
    )?;
    let n = c.execute(
        &format!("DELETE FROM sessions WHERE id IN ({which})"),
        params![param],
    )?;
    Ok(n as u64)
}

fn delete_tasks(c: &Connection, which: &str, param: i64) -> Result<u64, rusqlite::Error> {
    c.execute(
        &format!("DELETE FROM task_events WHERE task_id IN ({which})"),
        params![param],
    )?;
    let n = c.execute(
        &format!("DELETE FROM tasks WHERE id IN ({which})"),
        params![param],
    )?;
    Ok(n as u64)
}

fn finished(terminal: &[&str]) -> String {
    terminal
        .iter()
        .map(|s| format!("'{}'", s.replace('\'', "''")))
        .collect::<Vec<_>>()
        .join(", ")
}

fn prune(
    c: &mut Connection,
    policy: Retention,
    terminal: &[&str],
) -> Result<Pruned, rusqlite::Error> {
    let mut pruned = Pruned {
        bytes_before: used_bytes(c)?,
        ..Default::default()
    };
    let finished = finished(terminal);
    if policy.retain_days > 0 {
        let cutoff = now_ms().saturating_sub(i64::from(policy.retain_days) * DAY_MS);
        let tx = c.transaction()?;
        pruned.sessions += delete_sessions(
            &tx,
            "SELECT id FROM sessions WHERE ended_at_ms IS NOT NULL AND started_at_ms < ?1",
            cutoff,
        )?;
        pruned.tasks += delete_tasks(
            &tx,
            &format!("SELECT id FROM tasks WHERE status IN ({finished}) AND updated_at_ms < ?1"),
            cutoff,
        )?;
        pruned.audit += tx.execute("DELETE FROM audit WHERE at_ms < ?1", params![cutoff])? as u64;
        tx.commit()?;
    }
    if policy.max_bytes > 0 {
        while used_bytes(c)? > policy.max_bytes {
            // A tenth of what may go, oldest first, per round.
            let sessions: i64 = c.query_row(
                "SELECT COUNT(*) FROM sessions WHERE ended_at_ms IS NOT NULL",
                [],
                |r| r.get(0),
            )?;
            let tasks: i64 = c.query_row(
                &format!("SELECT COUNT(*) FROM tasks WHERE status IN ({finished})"),
                [],
                |r| r.get(0),
            )?;
            if sessions + tasks == 0 {
                pruned.over_cap = true;
                break;
            }
            let tx = c.transaction()?;
            if sessions > 0 {
                pruned.sessions += delete_sessions(
                    &tx,
                    "SELECT id FROM sessions WHERE ended_at_ms IS NOT NULL
                     ORDER BY started_at_ms, id LIMIT ?1",
                    (sessions / 10).max(1),
                )?;
            }
            if tasks > 0 {
                pruned.tasks += delete_tasks(
                    &tx,
                    &format!(
                        "SELECT id FROM tasks WHERE status IN ({finished})
                         ORDER BY created_at_ms, id LIMIT ?1"
                    ),
                    (tasks / 10).max(1),
                )?;
            }
            tx.commit()?;
        }
    }
    if pruned.sessions + pruned.tasks + pruned.audit > 0 {
        // Gives the freed pages back to the file system; the checkpoint
        // moves the vacuumed database out of the WAL into the file.
        c.execute_batch("VACUUM")?;
        c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    }
    pruned.bytes_after = used_bytes(c)?;
    Ok(pruned)
}

impl Store {
    /// Applies `policy` now; `terminal`: the statuses of finished tasks.
    pub async fn prune(
        &self,
        policy: Retention,
        terminal: &'static [&'static str],
    ) -> Result<Pruned, StoreError> {
        self.with_conn(move |c| prune(c, policy, terminal)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{AuditRecord, SessionRecord};

    #[tokio::test]
    async fn sessions_that_never_ended_and_young_audit_rows_stay() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("rozd.db"), Default::default()).unwrap();
        let old = now_ms() - 100 * DAY_MS;
        let session = |id: &str, ended_at_ms: Option<i64>| SessionRecord {
            id: id.into(),
            host_id: "h".into(),
            environment_id: "e".into(),
            model: "local".into(),
            started_at_ms: old,
            ended_at_ms,
            end_reason: None,
            turns: 0,
            briefing_version: None,
        };
        store.session_started(session("open", None)).await.unwrap();
        // Recorded as a session is: started, then ended (now).
        store.session_started(session("ended", None)).await.unwrap();
        store
            .session_ended("ended".into(), "disconnect".into())
            .await
            .unwrap();
        store
            .audit(AuditRecord {
                at_ms: now_ms(),
                kind: crate::store::AuditKind::Actuator,
                ..Default::default()
            })
            .await
            .unwrap();
        let policy = Retention {
            retain_days: 30,
            max_bytes: 1,
        };
        let pruned = store.prune(policy, &["completed"]).await.unwrap();
        assert_eq!((pruned.sessions, pruned.audit), (1, 0));
        assert!(pruned.over_cap, "{pruned:?}");
        let ids: Vec<String> = store
            .sessions(10, 0)
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect();
        assert_eq!(ids, ["open"]);
        assert_eq!(store.audit_records(None, None, 10).await.unwrap().len(), 1);
    }
}
