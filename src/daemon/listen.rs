//! The listeners: TCP and the local control socket, the accept loop that
//! sheds and reserves descriptors, and one connection served (TLS handshake,
//! HTTP/1 and HTTP/2, idle and header timeouts, graceful close).

use super::*;

/// Connections the kernel queues for accept (it caps this at
/// `net.core.somaxconn`); more than std's 128, so that a burst does not make
/// newcomers wait for SYN retries while the loop sheds.
pub(super) const LISTEN_BACKLOG: u32 = 1024;

pub(super) fn bind_tcp(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// How connections are served: HTTP/1 and HTTP/2 with their timeouts.
pub(super) fn connection_builder(config: &Config) -> auto::Builder<TokioExecutor> {
    let server = &config.server;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // A client has this long to send a request head; hyper applies it to
    // the wait for the next request on a keep-alive connection too.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(server.header_read_timeout);
    // HTTP/2 pings detect a peer that vanished without closing its
    // connection (a client on a dropped Wi-Fi link), so its session ends
    // and its actuators go safe promptly.
    let keepalive = server.http2_keepalive;
    builder
        .http2()
        .timer(TokioTimer::new())
        // Each stream holds buffers and, for a session, a task: one
        // connection may not open more than this many at once (beyond it
        // the peer's new streams are refused, REFUSED_STREAM).
        .max_concurrent_streams(server.max_concurrent_streams)
        // Half the bound pinging, half waiting for the answer: a silent
        // peer is dropped within `http2_keepalive_secs`.
        .keep_alive_interval(keepalive.map(|bound| bound / 2))
        .keep_alive_timeout((keepalive.unwrap_or_default() / 2).max(Duration::from_millis(500)));
    builder
}

/// The local control socket, bound.
pub(super) struct ControlSocket {
    pub(super) listener: UnixListener,
    pub(super) path: PathBuf,
}

impl ControlSocket {
    /// Binds `path` with mode 0660 (root and the daemon's group may connect).
    /// A socket file left by a daemon that died is replaced; one that another
    /// process still listens on, or a path that is not a socket, is an error.
    pub(super) fn bind(path: PathBuf) -> Result<ControlSocket, DaemonError> {
        use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
        let fail = |message: String| DaemonError::ControlSocket {
            path: path.clone(),
            message,
        };
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_socket() => {
                match std::os::unix::net::UnixStream::connect(&path) {
                    Ok(_) => return Err(fail("another process is listening on it".into())),
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                        std::fs::remove_file(&path)
                            .map_err(|e| fail(format!("cannot remove the stale socket: {e}")))?;
                    }
                    Err(e) => return Err(fail(format!("cannot check the existing socket: {e}"))),
                }
            }
            Ok(_) => return Err(fail("exists and is not a socket".into())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(fail(e.to_string())),
        }
        let listener = UnixListener::bind(&path).map_err(|e| fail(format!("cannot bind: {e}")))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o660))
            .map_err(|e| fail(format!("cannot set its mode to 0660: {e}")))?;
        Ok(ControlSocket { listener, path })
    }
}

pub(super) fn remove_socket_file(path: &Path) {
    if let Err(e) = std::fs::remove_file(path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), error = %e, "cannot remove the control socket");
    }
}

/// A listener of either kind, as the accept loop sees it.
pub(super) trait Acceptor: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// For logs.
    const WHAT: &'static str;
    /// Out of descriptors, it sheds TCP connections at once, even while
    /// shed ones are still closing (the control socket: the stop must not
    /// wait for them).
    const URGENT: bool;
    fn accept(&self) -> impl Future<Output = std::io::Result<Self::Io>> + Send;
    /// What `io` has received already, without waiting (into `buf`).
    fn received(io: &Self::Io, buf: &mut [u8]) -> usize;
}

impl Acceptor for TcpListener {
    type Io = tokio::net::TcpStream;
    const WHAT: &'static str = "tcp";
    const URGENT: bool = false;
    async fn accept(&self) -> std::io::Result<Self::Io> {
        let (stream, _) = TcpListener::accept(self).await?;
        // Tool calls are small messages on a latency-critical path.
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }
    fn received(io: &Self::Io, buf: &mut [u8]) -> usize {
        io.try_read(buf).unwrap_or(0)
    }
}

impl Acceptor for UnixListener {
    type Io = tokio::net::UnixStream;
    const WHAT: &'static str = "control socket";
    const URGENT: bool = true;
    async fn accept(&self) -> std::io::Result<Self::Io> {
        UnixListener::accept(self).await.map(|(stream, _)| stream)
    }
    fn received(io: &Self::Io, buf: &mut [u8]) -> usize {
        io.try_read(buf).unwrap_or(0)
    }
}

/// What both accept loops share.
#[derive(Clone)]
pub(super) struct Shared {
    pub(super) builder: Arc<auto::Builder<TokioExecutor>>,
    /// The TCP listener's: what sheds when descriptors run out.
    pub(super) pressure: Seats,
    pub(super) reserve: Arc<FdReserve>,
    /// Told whenever a connection ends (a descriptor came free).
    pub(super) closed: Arc<Notify>,
    pub(super) idle_timeout: Duration,
    /// How long a new connection may take to show its first bytes.
    pub(super) first_bytes_within: Duration,
    /// Cancelled at shutdown: every connection closes gracefully.
    pub(super) drain: CancellationToken,
    /// Held by every connection task (see `serve`).
    pub(super) alive: tokio::sync::mpsc::Sender<()>,
}

/// One file descriptor held back for the moment the process runs out:
/// released, it lets accept take the waiting connection instead of failing
/// again at once, while the TCP [`Seats`] shed a connection to pay it back.
pub(super) struct FdReserve(pub(super) Mutex<Option<std::fs::File>>);

impl FdReserve {
    pub(super) fn new() -> Self {
        FdReserve(Mutex::new(Self::open()))
    }

    fn open() -> Option<std::fs::File> {
        std::fs::File::open("/dev/null").ok()
    }

    /// Closes the reserved descriptor; false if it was not held.
    fn release(&self) -> bool {
        self.0.lock().take().is_some()
    }

    /// Takes a descriptor back into reserve if it is not held (fails
    /// quietly while the process is still out of them); whether it is held.
    fn restore(&self) -> bool {
        let mut held = self.0.lock();
        if held.is_none() {
            *held = Self::open();
        }
        held.is_some()
    }
}

/// Whether an accept error means the process (or system) is out of file
/// descriptors or socket memory: then shedding a connection helps.
pub(super) fn out_of_descriptors(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Where one listener's connections wait: the lobby until they show their
/// first bytes, then the table.
#[derive(Clone)]
pub(super) struct Seats {
    pub(super) table: SharedTable,
    pub(super) lobby: SharedLobby,
}

impl Seats {
    /// A table of `limit` places, and a lobby as large (at least
    /// [`MIN_LOBBY`]): a flood of one listener never crowds another's.
    pub(super) fn new(limit: usize) -> Seats {
        Seats {
            table: Arc::new(Mutex::new(ConnectionTable::new(limit))),
            lobby: Arc::new(Mutex::new(Lobby::new(limit.max(MIN_LOBBY)))),
        }
    }

    // One lock at a time (each count is taken before the next lock).
    fn len(&self) -> usize {
        let seated = self.table.lock().len();
        seated + self.lobby.lock().len()
    }

    /// Connections shed whose descriptors are still on their way back.
    fn closing(&self) -> usize {
        let seated = self.table.lock().closing();
        seated + self.lobby.lock().closing()
    }

    /// Out of file descriptors: sheds the lobby's bare connections (nothing
    /// heard from them) that have waited past their grace, up to
    /// [`SHED_HEADROOM`], else the table's (see [`ConnectionTable::shed`]).
    fn shed(&self, now: tokio::time::Instant) {
        let bare = self
            .lobby
            .lock()
            .shed(now, SHED_HEADROOM, |closer| !closer.heard());
        let shed = if bare.is_empty() {
            self.table.lock().shed()
        } else {
            bare
        };
        for connection in shed {
            connection.shed();
        }
    }
}

/// Accepts connections until `stop` is cancelled.
pub(super) async fn accept_loop<A: Acceptor>(
    acceptor: A,
    router: axum::Router,
    seats: Seats,
    shared: Shared,
    tls: Option<Arc<ServerTls>>,
    stop: CancellationToken,
) {
    let mut reap = tokio::time::interval((shared.idle_timeout / 4).max(Duration::from_millis(250)));
    reap.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A flood must not fill the journal.
    let mut out_of_descriptors_log = crate::logging::LogLimiter::default();
    let Seats { table, lobby } = seats;
    loop {
        tokio::select! {
            accepted = acceptor.accept() => match accepted {
                Ok(io) => {
                    let _ = shared.reserve.restore();
                    // A request that came with its connection (a stop's,
                    // usually) is seen at once, and skips the lobby.
                    let mut first = Vec::new();
                    if tls.is_none() {
                        let mut buf = [0u8; rewind::FIRST_BYTES_MOST];
                        let n = A::received(&io, &mut buf);
                        first.extend_from_slice(&buf[..n]);
                    }
                    serve_connection(io, first, &router, &table, &lobby, &shared, tls.as_deref());
                }
                Err(e) if out_of_descriptors(&e) => {
                    if let Some(held_back) = out_of_descriptors_log.allow(tokio::time::Instant::now()) {
                        tracing::warn!(
                            listener = A::WHAT,
                            error = %e,
                            times = held_back + 1,
                            tcp_connections = shared.pressure.len(),
                            "accept failed: out of file descriptors; shedding TCP connections \
                             (those that sent nothing first, else the table, which then holds \
                             fewer than it held; raise LimitNOFILE)"
                        );
                    }
                    // Connections already shed give their descriptors back
                    // as their tasks end; shed more (and hold fewer) only
                    // when none are on their way.
                    let returning = !A::URGENT && shared.pressure.closing() > 0;
                    if shared.reserve.release() {
                        // The reserve's descriptor takes the waiting
                        // connection now.
                        if !returning {
                            shared.pressure.shed(tokio::time::Instant::now());
                        }
                    } else {
                        // Wait for a descriptor to come free (bounded)
                        // instead of failing again at once.
                        tokio::select! {
                            _ = tokio::time::timeout(Duration::from_millis(100), shared.closed.notified()) => {}
                            () = stop.cancelled() => break,
                        }
                        if !shared.reserve.restore()
                            && (A::URGENT || shared.pressure.closing() == 0)
                        {
                            shared.pressure.shed(tokio::time::Instant::now());
                        }
                    }
                }
                Err(e) if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionAborted
                        | std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::Interrupted
                ) => {
                    // That one connection is gone; the listener is fine.
                    tracing::debug!(listener = A::WHAT, error = %e, "accept failed");
                }
                Err(e) => {
                    tracing::warn!(listener = A::WHAT, error = %e, "accept failed");
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(100)) => {}
                        () = stop.cancelled() => break,
                    }
                }
            },
            _ = reap.tick() => {
                let expired = table.lock()
                    .expire_idle(tokio::time::Instant::now(), shared.idle_timeout);
                for connection in expired {
                    connection.expire();
                }
                let _ = shared.reserve.restore();
            }
            () = stop.cancelled() => break,
        }
    }
}

/// Connections of one listener that may wait at once to show their first
/// bytes (see [`Lobby`]): as many as its table holds, and at least this.
pub(super) const MIN_LOBBY: usize = 256;

/// A listener's lobby.
pub(super) type SharedLobby = Arc<Mutex<Lobby<Closer>>>;

/// Serves `io` on its own task. It waits in `lobby` (whose oldest is
/// dropped when it is full) until it has shown its first bytes, within
/// `server.header_read_timeout_secs` (with `tls`, the handshake first,
/// within `server.tls.handshake_timeout_secs`): those say whether its first
/// request is a stop. Then it is seated in `table` (a stop is never
/// refused a place; see `ConnectionTable::open`), or refused and dropped,
/// and served until it ends, is shed (dropped at once), idles out (closed
/// gracefully, within [`IDLE_CLOSE_BOUND`]) or the daemon drains.
pub(super) fn serve_connection<I: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    io: I,
    first: Vec<u8>,
    router: &axum::Router,
    table: &SharedTable,
    lobby: &SharedLobby,
    shared: &Shared,
    tls: Option<&ServerTls>,
) {
    let closer = Closer::default();
    if !first.is_empty() {
        closer.mark_heard();
    }
    let io = Heard::new(io, closer.clone());
    // Known already (plaintext only): no wait in the lobby.
    let known = crate::api::connections::classify(&first).filter(|_| tls.is_none());
    let waiting = match known {
        Some(_) => None,
        None => match lobby
            .lock()
            .enter(closer.clone(), tokio::time::Instant::now(), |c| !c.heard())
        {
            Ok((id, dropped)) => {
                if let Some(dropped) = dropped {
                    dropped.shed();
                }
                Some(LobbyPlace {
                    lobby: lobby.clone(),
                    id,
                })
            }
            Err(_) => {
                tracing::debug!("connection refused: the lobby is full of newer ones");
                return;
            }
        },
    };
    let handshake = tls.map(|tls| (tls.acceptor(), tls.handshake_timeout()));
    let first_within = shared.first_bytes_within;
    let seating = Seating {
        router: router.clone(),
        table: table.clone(),
        waiting,
        closer,
        builder: shared.builder.clone(),
        drain: shared.drain.clone(),
    };
    let closed = shared.closed.clone();
    let alive = shared.alive.clone();
    tokio::spawn(async move {
        let _alive = alive;
        match handshake {
            None => seating.serve(arrive(io, first, None, first_within)).await,
            Some((acceptor, timeout)) => {
                seating
                    .serve(async move {
                        match tokio::time::timeout(timeout, acceptor.accept(io)).await {
                            Ok(Ok(stream)) => {
                                let peer = stream
                                    .get_ref()
                                    .1
                                    .peer_certificates()
                                    .and_then(|chain| chain.first())
                                    .and_then(|leaf| PeerIdentity::from_der(leaf.as_ref()));
                                arrive(stream, Vec::new(), peer, first_within).await
                            }
                            Ok(Err(e)) => {
                                tracing::debug!(error = %e, "TLS handshake failed");
                                None
                            }
                            Err(_) => {
                                tracing::debug!(?timeout, "TLS handshake timed out");
                                None
                            }
                        }
                    })
                    .await
            }
        }
        closed.notify_waiters();
    });
}

/// What a connection needs from its arrival to its end.
struct Seating {
    router: axum::Router,
    table: SharedTable,
    /// Its place in the lobby (none: its first bytes were there already).
    waiting: Option<LobbyPlace>,
    closer: Closer,
    builder: Arc<auto::Builder<TokioExecutor>>,
    drain: CancellationToken,
}

impl Seating {
    /// Waits in the lobby for `arrival` (unless dropped from it, or the
    /// daemon drains), then takes a seat and serves, or is refused.
    async fn serve<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
        self,
        arrival: impl Future<Output = Option<Arrived<S>>>,
    ) {
        // Biased: a stop that arrived as it was shed is served (below).
        let arrived = tokio::select! {
            biased;
            arrived = arrival => arrived,
            () = self.closer.shed_requested() => None,
            () = self.drain.cancelled() => None,
        };
        drop(self.waiting);
        let Some(Arrived { io, peer, arrival }) = arrived else {
            return;
        };
        // Shed from the lobby just as its first bytes came: an ordinary
        // request goes as it was told to, a stop is served all the same
        // (with a closer of its own).
        let closer = match (self.closer.is_shed(), arrival) {
            (false, _) => self.closer,
            (true, Arrival::Stop) => {
                let fresh = Closer::default();
                fresh.mark_heard();
                fresh
            }
            (true, Arrival::Other) => return,
        };
        let seat = self
            .table
            .lock()
            .open(closer.clone(), arrival, tokio::time::Instant::now());
        match seat {
            Seat::Seated { id, evicted } => {
                for victim in evicted {
                    victim.shed();
                }
                let _seated = SeatedPlace {
                    table: self.table.clone(),
                    id,
                };
                let connection = Connection {
                    router: self.router,
                    tracked: tracked::Connection::new(id, self.table),
                    builder: self.builder,
                    closer,
                    drain: self.drain,
                };
                connection.serve(io, peer).await;
            }
            Seat::Refused(_) => {
                tracing::debug!("connection refused: every place has a request in flight");
            }
        }
    }
}

/// A connection's place in its lobby, left when dropped (whatever ends
/// the wait, a panic included: a place left behind would count as closing
/// for ever and stop the shedding).
struct LobbyPlace {
    lobby: SharedLobby,
    id: crate::api::connections::LobbyId,
}

impl Drop for LobbyPlace {
    fn drop(&mut self) {
        self.lobby.lock().leave(self.id);
    }
}

/// A connection's place in its table, given up when dropped (a panic
/// included).
struct SeatedPlace {
    table: SharedTable,
    id: crate::api::connections::ConnectionId,
}

impl Drop for SeatedPlace {
    fn drop(&mut self) {
        self.table.lock().close(self.id);
    }
}

/// `io`, telling its [`Closer`] when the first byte comes from the peer
/// (a request's, a TLS ClientHello): from then on it is no bare
/// connection, and the lobby does not shed it when descriptors run out.
struct Heard<I> {
    inner: I,
    /// Until the first byte.
    closer: Option<Closer>,
}

impl<I> Heard<I> {
    fn new(inner: I, closer: Closer) -> Self {
        Heard {
            inner,
            closer: Some(closer),
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Heard<I> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before
            && let Some(closer) = self.closer.take()
        {
            closer.mark_heard();
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Heard<I> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, data)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A connection that has shown its first bytes.
struct Arrived<I> {
    io: rewind::Rewind<I>,
    peer: Option<PeerIdentity>,
    arrival: crate::api::connections::Arrival,
}

/// Waits (at most `within`) for `io`'s first bytes; `None` when none came.
async fn arrive<I: AsyncRead + Unpin>(
    mut io: I,
    first: Vec<u8>,
    peer: Option<PeerIdentity>,
    within: Duration,
) -> Option<Arrived<I>> {
    match tokio::time::timeout(within, rewind::first_bytes(&mut io, first)).await {
        Ok(Some((first, arrival))) => Some(Arrived {
            io: rewind::Rewind::new(first, io),
            peer,
            arrival,
        }),
        Ok(None) => None,
        Err(_) => {
            tracing::debug!(?within, "no request began in time; connection closed");
            None
        }
    }
}

/// What serves one accepted connection.
pub(super) struct Connection {
    pub(super) router: axum::Router,
    pub(super) tracked: tracked::Connection,
    pub(super) builder: Arc<auto::Builder<TokioExecutor>>,
    pub(super) closer: Closer,
    pub(super) drain: CancellationToken,
}

impl Connection {
    /// Serves HTTP on `io` until it ends, is shed, idles out or drains. The
    /// socket is closed when this returns (before its end is reported:
    /// whoever waits for a descriptor to come free finds it free).
    async fn serve<I: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
        self,
        io: I,
        peer: Option<PeerIdentity>,
    ) {
        let Connection {
            router,
            tracked,
            builder,
            closer,
            drain,
        } = self;
        let service = TowerToHyperService::new(tracked::service(router, tracked, peer));
        // With upgrades: the Foxglove WebSocket at `/foxglove`.
        let mut connection =
            Box::pin(builder.serve_connection_with_upgrades(TokioIo::new(io), service));
        let mut closing = false;
        let bound = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(bound);
        let mut bounded = false;
        loop {
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                    break;
                }
                // Dropping the connection closes it.
                () = closer.shed_requested() => {
                    tracing::debug!("connection shed");
                    break;
                }
                () = closer.expire_requested(), if !closing => {
                    connection.as_mut().graceful_shutdown();
                    closing = true;
                    bound.as_mut().reset(tokio::time::Instant::now() + IDLE_CLOSE_BOUND);
                    bounded = true;
                }
                () = drain.cancelled(), if !closing => {
                    // Bounded by `server.shutdown_grace_secs` in `serve`.
                    connection.as_mut().graceful_shutdown();
                    closing = true;
                }
                () = &mut bound, if bounded => {
                    tracing::debug!("idle connection did not close in time; dropped");
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::connections::LOBBY_GRACE;

    /// Out of descriptors, the lobby's bare connections past their grace
    /// go first and the table keeps its seats; a connection heard from
    /// stays; with no bare one left, the table sheds.
    #[tokio::test]
    async fn out_of_descriptors_bare_lobby_connections_go_before_the_table() {
        let seats = Seats::new(10);
        let t0 = tokio::time::Instant::now();
        let (bare, heard) = (Closer::default(), Closer::default());
        heard.mark_heard();
        for closer in [&bare, &heard] {
            seats
                .lobby
                .lock()
                .enter(closer.clone(), t0, |_| true)
                .unwrap();
        }
        let seated = Closer::default();
        let open = seats.table.lock().open(seated.clone(), Arrival::Other, t0);
        assert!(matches!(open, Seat::Seated { .. }));

        // Within the grace: the lobby keeps them, the table sheds.
        seats.shed(t0 + LOBBY_GRACE / 2);
        assert!(!bare.is_shed() && !heard.is_shed());
        assert!(seated.is_shed());
        let second = Closer::default();
        let open = seats.table.lock().open(second.clone(), Arrival::Other, t0);
        assert!(matches!(open, Seat::Seated { .. }));

        // Past it: the bare one goes, the table keeps its seat.
        seats.shed(t0 + LOBBY_GRACE);
        assert!(bare.is_shed() && !heard.is_shed() && !second.is_shed());
        assert_eq!(seats.closing(), 2, "the shed seat and the bare one");
        // Nothing bare left: the table sheds again.
        seats.shed(t0 + LOBBY_GRACE * 2);
        assert!(second.is_shed() && !heard.is_shed());
    }

    /// The first byte read marks the connection heard; a read of nothing
    /// does not.
    #[tokio::test]
    async fn a_connection_is_heard_from_its_first_byte() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let (mut client, server) = tokio::io::duplex(64);
        let closer = Closer::default();
        let mut io = Heard::new(server, closer.clone());
        let mut buf = [0u8; 8];
        let nothing = futures_util::FutureExt::now_or_never(io.read(&mut buf));
        assert!(nothing.is_none(), "nothing to read yet");
        assert!(!closer.heard());
        client.write_all(b"P").await.unwrap();
        assert_eq!(io.read(&mut buf).await.unwrap(), 1);
        assert!(closer.heard());
    }
}
