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

pub(super) struct AgentApi {
    ctx: Arc<HostContext>,
}

impl AgentApi {
    pub(super) fn new(ctx: Arc<HostContext>) -> Self {
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
/// host of the fleet turns the stream into a relay to that host; one for
/// this host starts a local session, which then reads the rest of the stream
/// itself (no task between the client and its session). Messages before any
/// `StartSession` get the session's answer to them (`no_session`,
/// `invalid_argument`) and decide nothing.
///
/// The first `StartSession` that goes somewhere decides for the stream: once
/// one ran here, the stream stays here. A routing failure (`host_not_found`,
/// `host_unavailable`) decides nothing, so the client may retry.
///
/// `relayed_by`: the host that relayed this stream here, if one did; then a
/// `StartSession` for another host is refused, not relayed again.
///
/// A transport error or end of stream ends the session's input, which it
/// treats as disconnect. When the session ends it drops its input, and with
/// it `incoming`, which resets the HTTP/2 stream, so a client that never
/// half-closes cannot hold the connection (and a graceful shutdown) open.
async fn read_client(
    ctx: Arc<HostContext>,
    relayed_by: Option<String>,
    credential: Option<String>,
    mut incoming: Streaming<proto::SessionRequest>,
    local_out: mpsc::Sender<session::ServerEvent>,
    relay_out: mpsc::Sender<Result<proto::SessionResponse, Status>>,
) {
    loop {
        // Until a session or a relay owns the stream, the daemon's shutdown
        // ends it here (dropping `incoming` resets it), as a session would.
        let message = tokio::select! {
            message = incoming.next() => message,
            () = ctx.shutdown.cancelled() => return,
        };
        let request = match message {
            Some(Ok(request)) => request,
            Some(Err(status)) => {
                stream_failed(&relay_out, status).await;
                return;
            }
            None => return,
        };
        let Some(proto::session_request::Request::Start(start)) = &request.request else {
            let answer = session::before_start(&convert::client_event(request));
            // A client that does not read its answers must not hold the
            // shutdown either.
            tokio::select! {
                sent = local_out.send(session::ServerEvent::Error(answer)) => {
                    if sent.is_err() {
                        return;
                    }
                }
                () = ctx.shutdown.cancelled() => return,
            }
            continue;
        };
        let target = start.host_id.clone().unwrap_or_default();
        match ctx.fleet.route_to(&target, relayed_by.as_deref()).await {
            Ok(Route::Local) => {
                let first = convert::client_event(request);
                let rest = local_input(incoming, relay_out);
                let input = futures_util::stream::once(std::future::ready(first)).chain(rest);
                session::run(ctx.session_host(), Box::pin(input), local_out, credential).await;
                return;
            }
            Ok(Route::Remote(remote)) => {
                let keepalive = ctx.config.server.http2_keepalive;
                match relay::open_session(&remote, keepalive, request).await {
                    Ok(opened) => {
                        drop(local_out);
                        // Listed among the open sessions while it relays.
                        let _listed = ctx.sessions.relaying(&remote.id, credential.clone());
                        relay::relay_session(opened, incoming, relay_out, ctx.shutdown.clone())
                            .await;
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(host_id = %target, "cannot relay a session: {e}");
                        if relay_out.send(Ok(relay::session_error(&e))).await.is_err() {
                            return;
                        }
                    }
                }
            }
            Err(e) => {
                tracing::info!(host_id = %target, "session for an unreachable host: {e}");
                if relay_out.send(Ok(relay::session_error(&e))).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// The rest of the client's stream as a local session's input. It ends at
/// the end of the stream or at a transport error; a message that does not
/// decode fails the response stream first ([`stream_failed`]).
fn local_input(
    incoming: Streaming<proto::SessionRequest>,
    relay_out: mpsc::Sender<Result<proto::SessionResponse, Status>>,
) -> impl futures_util::Stream<Item = session::Inbound> + Send + 'static {
    futures_util::stream::unfold(
        (incoming, relay_out),
        |(mut incoming, relay_out)| async move {
            match incoming.next().await {
                Some(Ok(request)) => Some((convert::client_event(request), (incoming, relay_out))),
                Some(Err(status)) => {
                    stream_failed(&relay_out, status).await;
                    None
                }
                None => None,
            }
        },
    )
}

/// The client's stream broke. A message that does not decode, or is over
/// the size limit, fails the response stream with its own status (the
/// stream must not end as if it were a success); a local session then ends
/// as a disconnect.
async fn stream_failed(
    relay_out: &mpsc::Sender<Result<proto::SessionResponse, Status>>,
    status: Status,
) {
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
            let _ = relay_out.send(Err(failed)).await;
        }
        None => {
            tracing::debug!(%status, "session stream ended with a transport error");
        }
    }
}
