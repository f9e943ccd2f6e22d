//! Relaying to another rozd of the fleet: a tonic client to a host's
//! advertised endpoint that presents the fleet token ([`connect`]), and the
//! session relay ([`open_session`], [`relay_session`]).
//!
//! A relayed session passes every message unchanged in both directions: the
//! client sees the other host's own `SessionStarted`, tool requests,
//! approvals and errors. When the other host's stream breaks, the client
//! gets `host_unavailable` and its stream ends; when the client goes away,
//! the stream to the other host is reset, so that host's deadman drives the
//! session's actuators safe.
//!
//! One hop at most: every relayed request carries [`RELAYED_BY`] (this
//! host's id), and a host that receives a request with it serves the
//! request itself or refuses it (`host_unavailable` / `UNAVAILABLE`; see
//! [`crate::fleet::Fleet::route`]) — it never relays it again.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Status, Streaming};

use super::convert;
use crate::fleet::{RemoteHost, RouteError};
use crate::proto::{self, agent_service_client::AgentServiceClient};
use crate::session::{ErrorCode, ServerEvent, SessionError};

/// Bound on opening a connection to another host.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound of the queue toward the other host.
const UPSTREAM_QUEUE: usize = 256;

/// The metadata (header) that marks a request relayed by another rozd; its
/// value is that host's id.
pub const RELAYED_BY: &str = "x-roz-relayed-by";

/// Adds `authorization: Bearer <fleet token>` and [`RELAYED_BY`] to every
/// request.
#[derive(Debug, Clone)]
pub struct RelayHeaders {
    authorization: Option<MetadataValue<Ascii>>,
    relayed_by: MetadataValue<Ascii>,
}

impl tonic::service::Interceptor for RelayHeaders {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        let metadata = request.metadata_mut();
        if let Some(value) = &self.authorization {
            metadata.insert("authorization", value.clone());
        }
        metadata.insert(RELAYED_BY, self.relayed_by.clone());
        Ok(request)
    }
}

/// A connection to another host; wrap it in any generated client
/// (`AgentServiceClient::new(channel)`, and so on).
pub type RemoteChannel = InterceptedService<Channel, RelayHeaders>;

/// The host that relayed a request here, if one did. A value that is not
/// readable still marks the request as relayed.
pub fn relayed_by(metadata: &tonic::metadata::MetadataMap) -> Option<String> {
    metadata.get(RELAYED_BY).map(|value| {
        value
            .to_str()
            .map_or_else(|_| "(unreadable)".to_string(), str::to_string)
    })
}

/// The error text of `e` with its causes (tonic's own text is terse).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Connects to `remote`'s advertised endpoint (within [`CONNECT_TIMEOUT`]),
/// with HTTP/2 keepalive pings every half of `keepalive` (`None`: none), so
/// that a host that vanishes silently is noticed. Failures are
/// [`RouteError::Unavailable`].
pub async fn connect(
    remote: &RemoteHost,
    keepalive: Option<Duration>,
) -> Result<RemoteChannel, RouteError> {
    let unavailable = |why: String| {
        RouteError::Unavailable(format!(
            "cannot reach host {:?} at {}: {why}",
            remote.id, remote.endpoint
        ))
    };
    let bearer = match &remote.token {
        Some(token) => Some(
            format!("Bearer {}", token.expose())
                .parse::<MetadataValue<Ascii>>()
                .map_err(|_| unavailable("the fleet token is not a valid header value".into()))?,
        ),
        None => None,
    };
    let relayed_by = remote
        .relayed_by
        .parse::<MetadataValue<Ascii>>()
        .map_err(|_| unavailable("this host's id is not a valid header value".into()))?;
    let mut endpoint = Endpoint::from_shared(remote.endpoint.clone())
        .map_err(|e| unavailable(chain(&e)))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true);
    if let Some(bound) = keepalive {
        let half = bound / 2;
        endpoint = endpoint
            .http2_keep_alive_interval(half)
            .keep_alive_timeout(half)
            .keep_alive_while_idle(true);
    }
    let connecting = async {
        if remote.endpoint.starts_with("https://") {
            // The other host's certificate must chain to the fleet CA and
            // name the host id the record claims: a record pointing
            // somewhere else gets no fleet token.
            if remote.tls.ca_file.is_none() {
                return Err(
                    "it advertises https://, and fleet.ca_file (the fleet's CA) is not set"
                        .to_string(),
                );
            }
            let config =
                crate::tls::client::client_config(&remote.tls, Some(crate::tls::client::ALPN_H2))
                    .map_err(|e| format!("fleet TLS: {e}"))?;
            let name = crate::tls::client::server_name(&remote.id).map_err(|e| e.to_string())?;
            endpoint
                .connect_with_connector(crate::tls::client::grpc_connector(config, name))
                .await
                .map_err(|e| chain(&e))
        } else {
            endpoint.connect().await.map_err(|e| chain(&e))
        }
    };
    let channel = tokio::time::timeout(CONNECT_TIMEOUT, connecting)
        .await
        .map_err(|_| unavailable("no connection within 5 s".into()))?
        .map_err(unavailable)?;
    Ok(InterceptedService::new(
        channel,
        RelayHeaders {
            authorization: bearer,
            relayed_by,
        },
    ))
}

/// The gRPC status for a routing failure: `NOT_FOUND` or `UNAVAILABLE`.
pub fn route_status(e: &RouteError) -> Status {
    match e {
        RouteError::NotFound(m) => Status::not_found(m.clone()),
        RouteError::Unavailable(m) => Status::unavailable(m.clone()),
    }
}

/// The session error for a routing failure: `host_not_found` (not
/// retryable) or `host_unavailable` (retryable).
pub fn session_error(e: &RouteError) -> proto::SessionResponse {
    let (code, message) = match e {
        RouteError::NotFound(m) => (ErrorCode::HostNotFound, m),
        RouteError::Unavailable(m) => (ErrorCode::HostUnavailable, m),
    };
    convert::server_response(ServerEvent::Error(SessionError::new(code, message.clone())))
}

/// A session stream opened on another host, its first request sent.
pub struct OpenedSession {
    host_id: String,
    upstream: mpsc::Sender<proto::SessionRequest>,
    responses: Streaming<proto::SessionResponse>,
}

/// Opens a `StreamSession` on `remote` and sends `first` (the client's
/// `StartSession`, unchanged).
pub async fn open_session(
    remote: &RemoteHost,
    keepalive: Option<Duration>,
    first: proto::SessionRequest,
) -> Result<OpenedSession, RouteError> {
    let channel = connect(remote, keepalive).await?;
    let mut client = AgentServiceClient::new(channel);
    let (upstream, rx) = mpsc::channel(UPSTREAM_QUEUE);
    // The receiver is alive: this cannot fail.
    let _ = upstream.try_send(first);
    let responses = client
        .stream_session(ReceiverStream::new(rx))
        .await
        .map_err(|status| {
            RouteError::Unavailable(format!(
                "host {:?} refused the session stream: {}: {}",
                remote.id,
                status.code(),
                status.message()
            ))
        })?
        .into_inner();
    Ok(OpenedSession {
        host_id: remote.id.clone(),
        upstream,
        responses,
    })
}

/// How the client's side of a relay ended.
enum ClientEnd {
    /// The client half-closed (or the other host stopped reading): keep
    /// relaying the other host's answers until it ends the stream.
    HalfClosed,
    /// The client's stream broke.
    Gone,
}

/// Relays until either side ends the stream or the daemon shuts down.
pub async fn relay_session(
    session: OpenedSession,
    mut incoming: Streaming<proto::SessionRequest>,
    out: mpsc::Sender<Result<proto::SessionResponse, Status>>,
    shutdown: CancellationToken,
) {
    let OpenedSession {
        host_id,
        upstream,
        mut responses,
    } = session;
    tracing::info!(%host_id, "relaying a session to another host");
    // Owns `upstream`: when it ends, the other host sees our half-close.
    let up = async move {
        loop {
            match incoming.next().await {
                Some(Ok(request)) => {
                    if upstream.send(request).await.is_err() {
                        // The other host ended the session: its last answers follow.
                        return ClientEnd::HalfClosed;
                    }
                }
                Some(Err(status)) => {
                    tracing::debug!(%status, "relayed session: the client's stream broke");
                    return ClientEnd::Gone;
                }
                None => return ClientEnd::HalfClosed,
            }
        }
    };
    let down = async {
        loop {
            match responses.message().await {
                Ok(Some(response)) => {
                    if out.send(Ok(response)).await.is_err() {
                        return;
                    }
                }
                Ok(None) => return,
                Err(status) => {
                    tracing::warn!(%host_id, %status, "relayed session: the stream to the other host broke");
                    let broke = RouteError::Unavailable(format!(
                        "the session stream to host {host_id:?} broke ({}: {}); the session there \
                         has ended",
                        status.code(),
                        status.message()
                    ));
                    let _ = out.send(Ok(session_error(&broke))).await;
                    return;
                }
            }
        }
    };
    tokio::pin!(up, down);
    tokio::select! {
        biased;
        () = shutdown.cancelled() => {}
        end = &mut up => {
            if let ClientEnd::HalfClosed = end {
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    () = &mut down => {}
                }
            }
        }
        () = &mut down => {}
    }
    tracing::info!(%host_id, "relayed session ended");
}
