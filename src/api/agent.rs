//! `roz.v1.AgentService`: adapts gRPC streams to the session engine.

use std::pin::Pin;
use std::sync::Arc;

use futures_util::Stream;
use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status, Streaming};
use tracing::Instrument as _;

use super::auth::Caller;
use super::{convert, relay};
use crate::HostContext;
use crate::fleet::Route;
use crate::proto::{self, agent_service_server::AgentService};
use crate::session;

/// Bound of the per-session queues: enough to absorb a burst of deltas while
/// keeping a stalled client from growing memory without limit.
const SESSION_QUEUE: usize = 256;

pub struct AgentApi {
    ctx: Arc<HostContext>,
}

impl AgentApi {
    pub fn new(ctx: Arc<HostContext>) -> Self {
        AgentApi { ctx }
    }
}

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl AgentService for AgentApi {
    type StreamSessionStream = ResponseStream<proto::SessionResponse>;
    type WatchTeamStream = ResponseStream<proto::TeamEvent>;

    async fn stream_session(
        &self,
        request: Request<Streaming<proto::SessionRequest>>,
    ) -> Result<Response<Self::StreamSessionStream>, Status> {
        let relayed_by = relay::relayed_by(request.metadata());
        let caller = request.extensions().get::<Caller>().cloned();
        let incoming = request.into_inner();
        let (local_tx, local_rx) = mpsc::channel(SESSION_QUEUE);
        let (relay_tx, relay_rx) = mpsc::channel(SESSION_QUEUE);
        // The stream's log lines name the credential, as the request's did.
        let span = tracing::info_span!(
            "session_stream",
            credential = caller.as_ref().map_or("", |c| c.name())
        );
        tokio::spawn(
            read_client(
                self.ctx.clone(),
                relayed_by,
                caller.and_then(|c| c.named().map(str::to_string)),
                incoming,
                local_tx,
                relay_tx,
            )
            .instrument(span),
        );
        // The stream ends once both the local session (if any) and the
        // router/relay are done with it.
        let local = ReceiverStream::new(local_rx).map(|event| Ok(convert::server_response(event)));
        let responses = local.merge(ReceiverStream::new(relay_rx));
        Ok(Response::new(Box::pin(responses)))
    }

    async fn watch_team(
        &self,
        request: Request<proto::WatchTeamRequest>,
    ) -> Result<Response<Self::WatchTeamStream>, Status> {
        let relayed_by = relay::relayed_by(request.metadata());
        let task_id = request.into_inner().task_id;
        let events = super::tasks::watch_team(self.ctx.clone(), relayed_by, task_id).await?;
        Ok(Response::new(events))
    }
}

/// Reads the client's stream and routes it: a `StartSession` for another
/// host of the fleet turns the stream into a relay to that host; everything
/// else goes to a local session, started at the first message for it.
///
/// The first `StartSession` that goes somewhere decides for the stream: once
/// one ran here, the stream stays here. A routing failure (`host_not_found`,
/// `host_unavailable`) decides nothing, so the client may retry.
///
/// `relayed_by`: the host that relayed this stream here, if one did; then a
/// `StartSession` for another host is refused, not relayed again.
///
/// A transport error or end of stream closes the local session's input,
/// which it treats as disconnect. When the session ends it drops its input;
/// the reader then drops `incoming`, which resets the HTTP/2 stream, so a
/// client that never half-closes cannot hold the connection (and a graceful
/// shutdown) open.
async fn read_client(
    ctx: Arc<HostContext>,
    relayed_by: Option<String>,
    credential: Option<String>,
    mut incoming: Streaming<proto::SessionRequest>,
    local_out: mpsc::Sender<session::ServerEvent>,
    relay_out: mpsc::Sender<Result<proto::SessionResponse, Status>>,
) {
    let mut local_out = Some(local_out);
    let mut local: Option<mpsc::Sender<session::Inbound>> = None;
    let mut bound_here = false;
    loop {
        let message = tokio::select! {
            message = incoming.next() => message,
            () = closed(local.as_ref()) => break,
        };
        let request = match message {
            Some(Ok(request)) => request,
            Some(Err(status)) => {
                // A message that does not decode, or is over the size
                // limit, fails the stream with its own status (the stream
                // must not end as if it were a success).
                let failed = match status.code() {
                    Code::Internal => Some(Status::invalid_argument(format!(
                        "a SessionRequest that does not decode: {}",
                        status.message()
                    ))),
                    Code::OutOfRange => Some(Status::resource_exhausted(status.message())),
                    Code::InvalidArgument | Code::ResourceExhausted => Some(status.clone()),
                    _ => None,
                };
                match failed {
                    Some(failed) => {
                        tracing::warn!(status = %failed, "session stream failed: a bad message");
                        // The response stream ends at this error; a local
                        // session then ends as a disconnect.
                        let _ = relay_out.send(Err(failed)).await;
                    }
                    None => {
                        tracing::debug!(%status, "session stream ended with a transport error");
                    }
                }
                break;
            }
            None => break,
        };
        if !bound_here && let Some(proto::session_request::Request::Start(start)) = &request.request
        {
            let target = start.host_id.clone().unwrap_or_default();
            match ctx.fleet.route(&target, relayed_by.as_deref()) {
                Ok(Route::Local) => bound_here = true,
                Ok(Route::Remote(remote)) => {
                    let keepalive = ctx.config.server.http2_keepalive_secs;
                    match relay::open_session(&remote, keepalive, request).await {
                        Ok(opened) => {
                            // A local session that only answered `no_session`
                            // so far ends as a disconnect without a record.
                            drop(local);
                            drop(local_out);
                            relay::relay_session(opened, incoming, relay_out, ctx.shutdown.clone())
                                .await;
                            return;
                        }
                        Err(e) => {
                            tracing::warn!(host_id = %target, "cannot relay a session: {e}");
                            if relay_out.send(Ok(relay::session_error(&e))).await.is_err() {
                                break;
                            }
                            continue;
                        }
                    }
                }
                Err(e) => {
                    tracing::info!(host_id = %target, "session for an unreachable host: {e}");
                    if relay_out.send(Ok(relay::session_error(&e))).await.is_err() {
                        break;
                    }
                    continue;
                }
            }
        }
        let to_session = match (&local, local_out.take()) {
            (Some(tx), _) => tx.clone(),
            (None, Some(out)) => {
                let (tx, rx) = mpsc::channel(SESSION_QUEUE);
                tokio::spawn(
                    session::run(ctx.clone(), rx, out, credential.clone()).in_current_span(),
                );
                local = Some(tx.clone());
                tx
            }
            // `local_out` is only taken together with setting `local`.
            (None, None) => break,
        };
        if to_session
            .send(convert::client_event(request))
            .await
            .is_err()
        {
            break;
        }
    }
}

/// Resolves when the local session has ended (never if there is none).
async fn closed(local: Option<&mpsc::Sender<session::Inbound>>) {
    match local {
        Some(tx) => tx.closed().await,
        None => std::future::pending().await,
    }
}
