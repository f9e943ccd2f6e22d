//! One agent session per `StreamSession` stream.

pub mod types;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::sync::mpsc;

pub use types::*;

use crate::HostContext;

/// Counts the sessions this daemon is serving.
#[derive(Debug, Default)]
pub struct SessionRegistry {
    active: AtomicUsize,
    total: AtomicU64,
}

impl SessionRegistry {
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
    fn enter(&self) -> ActiveSession<'_> {
        self.active.fetch_add(1, Ordering::Relaxed);
        self.total.fetch_add(1, Ordering::Relaxed);
        ActiveSession(self)
    }
}

struct ActiveSession<'a>(&'a SessionRegistry);

impl Drop for ActiveSession<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Runs one session until the client ends it, disconnects, or the daemon shuts down.
pub async fn run(
    ctx: Arc<HostContext>,
    mut inbound: mpsc::Receiver<Inbound>,
    outbound: mpsc::Sender<ServerEvent>,
) {
    let _active = ctx.sessions.enter();
    let mut started = false;
    loop {
        let event = tokio::select! {
            event = inbound.recv() => event,
            () = ctx.shutdown.cancelled() => return,
        };
        let Some(event) = event else { return };
        let reply = match event {
            Err(message) => Some(ServerEvent::Error(SessionError::new(
                ErrorCode::InvalidArgument,
                message,
            ))),
            Ok(ClientEvent::Start(_)) if started => Some(ServerEvent::Error(SessionError::new(
                ErrorCode::AlreadyStarted,
                "this stream already has a session",
            ))),
            Ok(ClientEvent::Start(start)) => {
                started = true;
                Some(ServerEvent::Started {
                    session_id: uuid::Uuid::new_v4().to_string(),
                    model: start
                        .model
                        .unwrap_or_else(|| ctx.config.model.default.clone()),
                    permissions: Vec::new(),
                })
            }
            Ok(ClientEvent::Ping) => Some(ServerEvent::Pong),
            Ok(ClientEvent::CancelSession { .. }) => return,
            Ok(_) if !started => Some(ServerEvent::Error(SessionError::new(
                ErrorCode::NoSession,
                "send StartSession first",
            ))),
            Ok(_) => Some(ServerEvent::Error(
                SessionError::new(ErrorCode::Internal, "turns are not implemented yet")
                    .with_retryable(false),
            )),
        };
        if let Some(reply) = reply
            && outbound.send(reply).await.is_err()
        {
            return;
        }
    }
}
