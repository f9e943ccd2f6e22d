//! Ties the requests of one connection to its place in a
//! [`ConnectionTable`]: each request counts as in flight until its response
//! body has been sent (a gRPC stream: until it ends), and carries a
//! [`Connection`] so that authentication can mark the connection.

use parking_lot::Mutex;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::body::Body;
use http_body_util::BodyExt as _;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use super::connections::{ConnectionId, ConnectionTable};

/// A listener's table; a connection's entry holds what closes it.
pub(crate) type SharedTable = Arc<Mutex<ConnectionTable<Closer>>>;

/// How the accept loop asks a connection's task to close it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Closer {
    shed: CancellationToken,
    expire: CancellationToken,
    /// A byte has come from the peer (a request's, a TLS ClientHello): it
    /// is no bare connection, and the lobby does not shed it for descriptors.
    heard: Arc<AtomicBool>,
}

impl Closer {
    /// At once: the connection is dropped (shed for a newcomer, or for
    /// descriptors).
    pub(crate) fn shed(&self) {
        self.shed.cancel();
    }

    /// Gracefully: it idled out (HTTP/2 gets a GOAWAY).
    pub(crate) fn expire(&self) {
        self.expire.cancel();
    }

    /// Whether it has been told to shed.
    pub(crate) fn is_shed(&self) -> bool {
        self.shed.is_cancelled()
    }

    /// A byte came from the peer.
    pub(crate) fn mark_heard(&self) {
        self.heard.store(true, Ordering::Relaxed);
    }

    /// Whether a byte has come from the peer.
    pub(crate) fn heard(&self) -> bool {
        self.heard.load(Ordering::Relaxed)
    }

    pub(crate) async fn shed_requested(&self) {
        self.shed.cancelled().await;
    }

    pub(crate) async fn expire_requested(&self) {
        self.expire.cancelled().await;
    }
}

/// The connection a request arrived on (a request extension).
#[derive(Debug, Clone)]
pub(crate) struct Connection {
    id: ConnectionId,
    table: SharedTable,
}

impl Connection {
    pub(crate) fn new(id: ConnectionId, table: SharedTable) -> Self {
        Connection { id, table }
    }

    /// A request on it passed authentication: it is not shed before
    /// connections that never did.
    pub(crate) fn mark_authenticated(&self) {
        self.table.lock().authenticated(self.id);
    }
}

/// Counts a request as in flight while it lives (and, for a request that
/// triggers the stop, as a stop running: its connection is not shed).
struct InFlight {
    connection: Connection,
    stop: bool,
}

impl InFlight {
    fn start(connection: Connection, stop: bool) -> Self {
        let mut table = connection.table.lock();
        table.request_started(connection.id, tokio::time::Instant::now());
        if stop {
            table.stop_started(connection.id);
        }
        drop(table);
        InFlight { connection, stop }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut table = self.connection.table.lock();
        if self.stop {
            table.stop_ended(self.connection.id);
        }
        table.request_ended(self.connection.id, tokio::time::Instant::now());
    }
}

/// `router` as the service of one connection.
/// `peer`: the connection's verified client certificate, given to every
/// request as an extension.
pub(crate) fn service(
    router: axum::Router,
    connection: Connection,
    peer: Option<crate::tls::PeerIdentity>,
) -> impl tower::Service<
    http::Request<hyper::body::Incoming>,
    Response = http::Response<Body>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    tower::service_fn(move |mut request: http::Request<hyper::body::Incoming>| {
        let stop = super::browser::is_stop_trigger(request.uri().path());
        let in_flight = InFlight::start(connection.clone(), stop);
        request.extensions_mut().insert(connection.clone());
        if let Some(peer) = &peer {
            request.extensions_mut().insert(peer.clone());
        }
        let router = router.clone();
        async move {
            let response = router.oneshot(request).await?;
            // The request stays in flight until the body is dropped: sent
            // completely, or the stream reset.
            Ok(response.map(|body| {
                Body::new(body.map_frame(move |frame| {
                    let _in_flight = &in_flight;
                    frame
                }))
            }))
        }
    })
}
