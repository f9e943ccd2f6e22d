//! Every call waiting for an approval, whoever made it (an MCP client, a
//! session's turn, a task's worker): what `GET /v1/approvals` lists and
//! `POST /v1/approvals/{id}` answers, beside each caller's own way to answer
//! (an MCP client's elicitation, a session's `PermissionDecision`, a task's
//! approvals). The first answer wins: a waiting call holds a [`Waiting`];
//! dropping it (the call was answered elsewhere, ended or was abandoned)
//! takes the entry off the list, so nothing can be answered after its call
//! stopped waiting. Nothing here does I/O.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;
use tokio::sync::{oneshot, watch};

/// Who asks for an approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Asker {
    /// An MCP client's call.
    Mcp,
    /// A gRPC session's turn (`StreamSession`).
    Session,
    /// A task's worker.
    Task,
    /// A Foxglove client's `command_actuator`.
    Foxglove,
}

/// A call waiting for approval, as `GET /v1/approvals` lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ApprovalView {
    /// What `POST /v1/approvals/{id}` names: the call's `tool_call_id`,
    /// unless another waiting call has that already (two sessions' models
    /// may use the same ids); then `<session_id>:<tool_call_id>`.
    pub id: String,
    /// The call's id, as the audit and the caller's own stream name it.
    pub tool_call_id: String,
    pub kind: Asker,
    pub tool: String,
    pub category: &'static str,
    pub parameters: Value,
    /// Who owns what the call commands: `mcp:<session id>`, a session's
    /// id, a task worker's id.
    pub session_id: String,
    /// Who asks, as the audit names it: `mcp:<client name>`, `session
    /// <id>`, `task <id> worker <id>`.
    pub origin: String,
    /// The credential behind the call (the audit's `credential`; `None`
    /// on a daemon without credentials).
    pub credential: Option<String>,
    pub since_unix_ms: i64,
    /// Unanswered by then, the call is denied.
    pub expires_unix_ms: i64,
}

/// An answer, and the credential that gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answered {
    pub approve: bool,
    pub by: Option<String>,
}

#[derive(Debug)]
struct Entry {
    view: ApprovalView,
    answer: oneshot::Sender<Answered>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ApprovalError {
    #[error("no call {0:?} waits for approval")]
    NotFound(String),
}

/// The calls waiting for an operator.
#[derive(Debug)]
pub struct Approvals {
    entries: Mutex<HashMap<String, Entry>>,
    /// Bumped whenever the list changes (for watchers, e.g. tests).
    changes: watch::Sender<u64>,
}

impl Default for Approvals {
    fn default() -> Self {
        Approvals {
            entries: Mutex::default(),
            changes: watch::Sender::new(0),
        }
    }
}

impl Approvals {
    /// Lists `view` as waiting, under its own id or, when that is taken, a
    /// qualified one (see [`ApprovalView::id`]); the answer arrives on the
    /// returned [`Waiting`].
    pub fn ask(self: &Arc<Self>, mut view: ApprovalView) -> Waiting {
        let (answer, decision) = oneshot::channel();
        let id = {
            let mut entries = self.lock();
            if entries.contains_key(&view.id) {
                let qualified = format!("{}:{}", view.session_id, view.tool_call_id);
                view.id = qualified.clone();
                let mut n = 1;
                while entries.contains_key(&view.id) {
                    n += 1;
                    view.id = format!("{qualified}:{n}");
                }
            }
            let id = view.id.clone();
            entries.insert(id.clone(), Entry { view, answer });
            id
        };
        self.changed();
        Waiting {
            approvals: self.clone(),
            id,
            decision,
        }
    }

    /// Every waiting call, oldest first.
    pub fn list(&self) -> Vec<ApprovalView> {
        let mut views: Vec<ApprovalView> = self.lock().values().map(|e| e.view.clone()).collect();
        views.sort_by(|a, b| {
            (a.since_unix_ms, a.id.as_str()).cmp(&(b.since_unix_ms, b.id.as_str()))
        });
        views
    }

    /// How many calls wait.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Call `id`, if it waits.
    pub fn get(&self, id: &str) -> Option<ApprovalView> {
        self.lock().get(id).map(|e| e.view.clone())
    }

    /// Answers call `id` as credential `by`; it stops waiting at once.
    pub fn answer(
        &self,
        id: &str,
        approve: bool,
        by: Option<String>,
    ) -> Result<ApprovalView, ApprovalError> {
        let entry = self
            .lock()
            .remove(id)
            .ok_or_else(|| ApprovalError::NotFound(id.to_string()))?;
        self.changed();
        // A call that stopped waiting in between has dropped its receiver;
        // its `Waiting` already took it off the list, so this cannot happen
        // while the entry was still listed.
        let _ = entry.answer.send(Answered { approve, by });
        Ok(entry.view)
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn withdraw(&self, id: &str) {
        if self.lock().remove(id).is_some() {
            self.changed();
        }
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock()
    }
}

/// One call's wait for its answer; dropping it withdraws the call.
#[derive(Debug)]
pub struct Waiting {
    approvals: Arc<Approvals>,
    id: String,
    decision: oneshot::Receiver<Answered>,
}

impl Waiting {
    /// The operator's answer. Never resolves if the entry is withdrawn
    /// otherwise; callers bound it with their own deadline.
    pub async fn decided(&mut self) -> Answered {
        match (&mut self.decision).await {
            Ok(answered) => answered,
            // The sender lives in the list until answered or withdrawn, and
            // withdrawing needs this value: unreachable, but never approve.
            Err(_) => std::future::pending().await,
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.approvals.withdraw(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(id: &str, since: i64) -> ApprovalView {
        ApprovalView {
            id: id.into(),
            tool_call_id: id.into(),
            kind: Asker::Mcp,
            tool: "motor".into(),
            category: "PHYSICAL",
            parameters: serde_json::json!({"value": 0.5}),
            session_id: "mcp:s".into(),
            origin: "mcp:test".into(),
            credential: Some("alice".into()),
            since_unix_ms: since,
            expires_unix_ms: since + 1000,
        }
    }

    #[tokio::test]
    async fn an_answer_reaches_the_waiting_call_once_and_takes_it_off_the_list() {
        let approvals = Arc::new(Approvals::default());
        let mut waiting = approvals.ask(view("b", 2));
        let _other = approvals.ask(view("a", 1));
        let ids: Vec<String> = approvals.list().into_iter().map(|v| v.id).collect();
        assert_eq!(ids, ["a", "b"], "oldest first");
        assert_eq!(
            approvals.get("b").unwrap().credential.as_deref(),
            Some("alice")
        );
        assert_eq!(
            approvals
                .answer("b", true, Some("bob".into()))
                .unwrap()
                .tool,
            "motor"
        );
        assert_eq!(
            waiting.decided().await,
            Answered {
                approve: true,
                by: Some("bob".into())
            }
        );
        assert!(approvals.get("b").is_none());
        assert_eq!(
            approvals.answer("b", false, None),
            Err(ApprovalError::NotFound("b".into()))
        );
        assert_eq!(approvals.list().len(), 1);
    }

    #[tokio::test]
    async fn two_calls_with_one_id_are_listed_apart_and_answered_apart() {
        let approvals = Arc::new(Approvals::default());
        let first = ApprovalView {
            kind: Asker::Session,
            session_id: "s1".into(),
            ..view("toolu_1", 1)
        };
        let second = ApprovalView {
            session_id: "s2".into(),
            since_unix_ms: 2,
            ..first.clone()
        };
        let mut one = approvals.ask(first);
        let mut two = approvals.ask(second);
        let third = approvals.ask(ApprovalView {
            session_id: "s2".into(),
            ..view("toolu_1", 3)
        });
        let ids: Vec<String> = approvals.list().into_iter().map(|v| v.id).collect();
        assert_eq!(ids, ["toolu_1", "s2:toolu_1", "s2:toolu_1:2"]);
        approvals.answer("s2:toolu_1", false, None).unwrap();
        assert!(!two.decided().await.approve);
        approvals.answer("toolu_1", true, None).unwrap();
        assert!(one.decided().await.approve);
        drop(third);
        assert!(approvals.list().is_empty());
    }

    #[test]
    fn a_call_that_stops_waiting_can_no_longer_be_approved() {
        let approvals = Arc::new(Approvals::default());
        let changes = approvals.subscribe();
        let waiting = approvals.ask(view("x", 1));
        drop(waiting);
        assert!(approvals.list().is_empty());
        assert!(approvals.answer("x", true, None).is_err());
        assert_eq!(*changes.borrow(), 2, "listed, then withdrawn");
    }
}
