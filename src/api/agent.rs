//! `roz.v1.AgentService`: adapts gRPC streams to the session engine.

use std::pin::Pin;
use std::sync::Arc;

use futures_util::Stream;
use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::convert;
use super::proto::{self, agent_service_server::AgentService};
use crate::HostContext;
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
        let mut incoming = request.into_inner();
        let (in_tx, in_rx) = mpsc::channel(SESSION_QUEUE);
        let (out_tx, out_rx) = mpsc::channel(SESSION_QUEUE);
        // Reader: decodes and converts client messages; a transport error or
        // end of stream closes `in_tx`, which the session treats as disconnect.
        // When the session ends it drops `in_rx`; the reader then drops
        // `incoming`, which resets the HTTP/2 stream, so a client that never
        // half-closes cannot hold the connection (and a graceful shutdown) open.
        tokio::spawn(async move {
            loop {
                let message = tokio::select! {
                    message = incoming.next() => message,
                    () = in_tx.closed() => break,
                };
                let Some(message) = message else { break };
                let inbound = match message {
                    Ok(request) => convert::client_event(request),
                    Err(status) => {
                        tracing::debug!(%status, "session stream ended with a transport error");
                        break;
                    }
                };
                if in_tx.send(inbound).await.is_err() {
                    break;
                }
            }
        });
        tokio::spawn(session::run(self.ctx.clone(), in_rx, out_tx));
        let responses =
            ReceiverStream::new(out_rx).map(|event| Ok(convert::server_response(event)));
        Ok(Response::new(Box::pin(responses)))
    }

    async fn watch_team(
        &self,
        request: Request<proto::WatchTeamRequest>,
    ) -> Result<Response<Self::WatchTeamStream>, Status> {
        let task_id = request.into_inner().task_id;
        let events = super::tasks::watch_team(self.ctx.clone(), task_id).await?;
        Ok(Response::new(events))
    }
}
