//! The running turn as the session loop holds it.
//!
//! The turn's future is polled by the session's own task, not spawned as a
//! task of its own: a client's `ToolResult` then reaches the turn without a
//! wake-up of another task (on another thread, often), which was one of the
//! hops of every tool step. What a task of its own gave, this keeps: a panic
//! inside the turn is caught and becomes the turn's failure (the session
//! drives its actuators safe and reports `internal`), and a turn that does
//! not wind down is dropped ([`RunningTurn::abort`]).
//!
//! Because the session loop polls the turn only between its own steps, the
//! hand-off to the turn never waits ([`RunningTurn::offer`]): a session
//! waiting for room in its turn's inbox would wait for itself.

use parking_lot::Mutex;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;

use futures_util::FutureExt as _;
use futures_util::future::{CatchUnwind, Fuse};
use tokio::sync::mpsc;

use super::turn::{TurnInput, TurnOutcome};

type TurnFuture = Pin<Box<dyn Future<Output = TurnOutcome> + Send>>;

/// Why a turn ended without an outcome.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum TurnFailed {
    #[error("the turn panicked: {0}")]
    Panicked(String),
    #[error("the turn did not wind down in time and was aborted")]
    Aborted,
}

/// The turn's inbox is full (the turn has not read what it was given yet):
/// the input it did not take.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct InboxFull(pub TurnInput);

pub(super) struct RunningTurn {
    /// `None` once aborted. The mutex is never locked (the turn is reached
    /// through `get_mut`); it only lets the session loop, whose methods
    /// take `&self` across awaits, hold a turn that is not `Sync`.
    future: Option<Mutex<Fuse<CatchUnwind<AssertUnwindSafe<TurnFuture>>>>>,
    inbox: mpsc::Sender<TurnInput>,
}

impl RunningTurn {
    /// `turn` reads its inputs from the receiver of `inbox`.
    pub(super) fn new(
        turn: impl Future<Output = TurnOutcome> + Send + 'static,
        inbox: mpsc::Sender<TurnInput>,
    ) -> RunningTurn {
        let turn: TurnFuture = Box::pin(turn);
        RunningTurn {
            // Unwind safety: as for a spawned task, the turn's state is
            // dropped with it after a panic; only its outcome is used.
            future: Some(Mutex::new(AssertUnwindSafe(turn).catch_unwind().fuse())),
            inbox,
        }
    }

    /// Runs the turn until it ends. Cancel-safe: dropping this future leaves
    /// the turn where it was, and it goes on at the next call. Once it has
    /// ended (or was aborted) this never resolves again.
    pub(super) async fn finished(&mut self) -> Result<TurnOutcome, TurnFailed> {
        let Some(future) = self.future.as_mut() else {
            return Err(TurnFailed::Aborted);
        };
        let future = future.get_mut();
        future.await.map_err(|payload| {
            let why = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_string());
            TurnFailed::Panicked(why)
        })
    }

    /// Drops the turn where it stands (its drop guards run).
    pub(super) fn abort(&mut self) {
        self.future = None;
    }

    /// Hands `input` to the turn without waiting.
    pub(super) fn offer(&self, input: TurnInput) -> Result<(), InboxFull> {
        match self.inbox.try_send(input) {
            Ok(()) => Ok(()),
            // A turn that has finished reading its inbox has finished: the
            // input belongs to no one, which is what a finished turn does.
            Err(mpsc::error::TrySendError::Closed(_)) => Ok(()),
            Err(mpsc::error::TrySendError::Full(input)) => Err(InboxFull(input)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Usage;
    use crate::session::{StopReason, turn::TurnOutcome};

    fn outcome() -> TurnOutcome {
        TurnOutcome {
            conversation: crate::session::context::History::default(),
            added: Vec::new(),
            usage: Usage::default(),
            stop_reason: StopReason::EndTurn,
            error: None,
            expired_calls: Vec::new(),
            meter: Default::default(),
        }
    }

    #[tokio::test]
    async fn a_panic_inside_the_turn_is_its_failure_not_the_sessions() {
        let (tx, _rx) = mpsc::channel(1);
        let mut turn = RunningTurn::new(
            async {
                tokio::task::yield_now().await;
                panic!("injected fault in a turn");
            },
            tx,
        );
        assert_eq!(
            turn.finished().await.err(),
            Some(TurnFailed::Panicked("injected fault in a turn".into()))
        );
        // The session's task goes on, and the failed turn never resolves again.
        let again = tokio::time::timeout(std::time::Duration::ZERO, turn.finished()).await;
        assert!(again.is_err(), "a finished turn resolved twice");
    }

    #[tokio::test]
    async fn inputs_reach_the_turn_and_a_full_inbox_refuses_without_waiting() {
        let (tx, mut rx) = mpsc::channel(1);
        let (seen_tx, seen_rx) = tokio::sync::oneshot::channel();
        let mut turn = RunningTurn::new(
            async move {
                let first = rx.recv().await;
                let _ = seen_tx.send(first);
                outcome()
            },
            tx,
        );
        let input = |id: &str| TurnInput::Decision {
            tool_call_id: id.into(),
            approved: true,
            by: None,
        };
        assert_eq!(turn.offer(input("a")), Ok(()));
        assert_eq!(turn.offer(input("b")), Err(InboxFull(input("b"))));
        let done = turn.finished().await.expect("the turn ends");
        assert_eq!(done.stop_reason, StopReason::EndTurn);
        assert_eq!(seen_rx.await.ok().flatten(), Some(input("a")));
        // The inbox is gone with the turn: an input for it is dropped quietly.
        assert_eq!(turn.offer(input("c")), Ok(()));
    }

    #[tokio::test]
    async fn an_aborted_turn_is_dropped_and_reports_aborted() {
        let (tx, _rx) = mpsc::channel(1);
        let (dropped_tx, dropped_rx) = tokio::sync::oneshot::channel::<()>();
        let mut turn = RunningTurn::new(
            async move {
                let _guard = dropped_tx;
                std::future::pending::<()>().await;
                outcome()
            },
            tx,
        );
        let pending = tokio::time::timeout(std::time::Duration::ZERO, turn.finished()).await;
        assert!(pending.is_err(), "a pending turn resolved");
        turn.abort();
        assert!(dropped_rx.await.is_err(), "the turn's state was dropped");
        assert_eq!(turn.finished().await.err(), Some(TurnFailed::Aborted));
    }
}
