//! MCP sessions as the host sees them: who owns what they command, whether
//! their client is still there, and the deadman when it is not.
//!
//! Streamable HTTP has no connection that lasts as long as a session, so
//! "the client is there" means: it holds its standalone SSE stream (the GET
//! that every client opens after `initialize` to hear the server). When the
//! last such stream closes (the client exited, was killed, lost the
//! network), or while it is open the client stops answering the pings sent
//! on it (a silent peer), the session's actuators go to their safe values
//! and its calls in flight are abandoned; a client that comes back may go
//! on, with its actuators safe. When the session ends (`DELETE /mcp`, or
//! `mcp.session_idle_secs` without any event) the same happens. A client
//! that never opens the stream is covered by the end of its session only.
//!
//! [`Manager`] is rmcp's in-memory session manager with these hooks around it.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use futures_util::Stream;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError,
};
use rmcp::transport::streamable_http_server::session::{
    ServerSseMessage, SessionId, SessionManager,
};
use tokio_util::sync::CancellationToken;

use crate::ooda::Ooda;
use crate::ooda::act::Origin;

/// The owner under which an MCP session commands actuators.
pub fn owner(session_id: &str) -> String {
    format!("mcp:{session_id}")
}

#[derive(Debug)]
struct Entry {
    /// Standalone streams open now.
    streams: usize,
    /// Cancelled when the client goes away or the session ends.
    present: CancellationToken,
}

/// The open MCP sessions.
#[derive(Debug)]
pub struct Sessions {
    entries: Mutex<HashMap<String, Entry>>,
    ooda: Arc<Ooda>,
}

impl Sessions {
    pub fn new(ooda: Arc<Ooda>) -> Sessions {
        Sessions {
            entries: Mutex::default(),
            ooda,
        }
    }

    /// Sessions open now.
    pub fn count(&self) -> usize {
        self.lock().len()
    }

    /// For a call of session `id` that arrives now: cancelled once the
    /// client goes away or the session ends; `None` for an unknown session.
    /// A request proves the client is there now, even after it was found
    /// gone (what it commanded before is safe by then).
    pub fn presence(&self, id: &str) -> Option<CancellationToken> {
        let mut entries = self.lock();
        let entry = entries.get_mut(id)?;
        if entry.present.is_cancelled() {
            entry.present = CancellationToken::new();
        }
        Some(entry.present.clone())
    }

    /// Whether session `id`'s client holds its event stream and has not
    /// been found gone since: the one a ping can reach.
    pub fn listening(&self, id: &str) -> bool {
        self.lock()
            .get(id)
            .is_some_and(|e| e.streams > 0 && !e.present.is_cancelled())
    }

    /// Session `id`'s client holds its stream but did not answer: it is gone
    /// (a silent peer, e.g. a cut network). Whether the session still exists.
    pub async fn unresponsive(&self, id: &str) -> bool {
        let present = match self.lock().get(id) {
            None => return false,
            Some(e) if e.present.is_cancelled() => return true,
            Some(e) => e.present.clone(),
        };
        present.cancel();
        deadman(&self.ooda, id, "MCP client stopped answering").await;
        true
    }

    fn created(&self, id: &str) {
        self.lock().insert(
            id.to_string(),
            Entry {
                streams: 0,
                present: CancellationToken::new(),
            },
        );
    }

    /// A standalone stream of session `id` opened; the guard notes its end.
    fn stream_opened(self: &Arc<Self>, id: &str) -> Option<StreamGuard> {
        let mut entries = self.lock();
        let entry = entries.get_mut(id)?;
        entry.streams += 1;
        // The client is back after it had gone: its calls from now on are
        // not abandoned (what it commanded before is already safe).
        if entry.present.is_cancelled() {
            entry.present = CancellationToken::new();
        }
        Some(StreamGuard {
            sessions: self.clone(),
            id: id.to_string(),
        })
    }

    fn stream_closed(&self, id: &str) {
        let gone = {
            let mut entries = self.lock();
            let Some(entry) = entries.get_mut(id) else {
                return;
            };
            entry.streams = entry.streams.saturating_sub(1);
            (entry.streams == 0).then(|| entry.present.clone())
        };
        if let Some(present) = gone {
            present.cancel();
            let ooda = self.ooda.clone();
            let id = id.to_string();
            // A stream's end is noticed in a drop (no await there).
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    deadman(&ooda, &id, "MCP client disconnected").await;
                });
            }
        }
    }

    async fn closed(&self, id: &str) {
        let Some(entry) = self.lock().remove(id) else {
            return;
        };
        entry.present.cancel();
        deadman(&self.ooda, id, "MCP session ended").await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Every actuator session `id` commands goes to its safe value.
pub async fn deadman(ooda: &Ooda, id: &str, reason: &str) {
    let owner = owner(id);
    let released = ooda
        .actuators()
        .release(&Origin::Session(owner.clone()), reason)
        .await;
    if released.is_empty() {
        tracing::info!(session_id = %owner, reason, "MCP session: nothing to release");
    } else {
        tracing::warn!(session_id = %owner, reason, ?released, "deadman: MCP session's actuators sent to safe values");
    }
}

/// Notes the end of a standalone stream when dropped.
#[derive(Debug)]
struct StreamGuard {
    sessions: Arc<Sessions>,
    id: String,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.sessions.stream_closed(&self.id);
    }
}

type BoxedSse = Pin<Box<dyn Stream<Item = ServerSseMessage> + Send + Sync>>;

/// A stream that notes its end (hyper drops a response body when its
/// connection closes).
struct Guarded {
    inner: BoxedSse,
    _guard: Option<StreamGuard>,
}

impl Stream for Guarded {
    type Item = ServerSseMessage;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

/// rmcp's in-memory session manager, telling [`Sessions`] when sessions
/// begin and end and when their standalone streams open and close.
pub struct Manager {
    inner: LocalSessionManager,
    sessions: Arc<Sessions>,
}

impl Manager {
    pub fn new(inner: LocalSessionManager, sessions: Arc<Sessions>) -> Manager {
        Manager { inner, sessions }
    }
}

impl SessionManager for Manager {
    type Error = LocalSessionManagerError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let (id, transport) = self.inner.create_session().await?;
        self.sessions.created(&id);
        tracing::info!(session_id = %owner(&id), "MCP session created");
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.inner.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.inner.has_session(id).await
    }

    /// `DELETE /mcp`, and the end of the session's worker (idle timeout,
    /// shutdown) both come here.
    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        let closed = self.inner.close_session(id).await;
        self.sessions.closed(id).await;
        closed
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.create_stream(id, message).await
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let stream = self.inner.create_standalone_stream(id).await?;
        Ok(Guarded {
            inner: Box::pin(stream),
            _guard: self.sessions.stream_opened(id),
        })
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        // The local manager's event ids are `<index>` on the standalone
        // stream and `<index>/<request>` on a request's stream: only a
        // resumed standalone stream says the client is there.
        let standalone = !last_event_id.contains('/');
        let stream = self.inner.resume(id, last_event_id).await?;
        Ok(Guarded {
            inner: Box::pin(stream),
            _guard: if standalone {
                self.sessions.stream_opened(id)
            } else {
                None
            },
        })
    }
}
