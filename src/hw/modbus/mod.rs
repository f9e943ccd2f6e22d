//! Modbus links: one task per `[[modbus]]` link (a Modbus TCP server, or
//! the devices on one RS-485 line over RTU) that connects, polls its
//! sensors in coalesced requests ([`plan`]) at each poll group's rate,
//! writes its actuators' values between polls (writes go first), and
//! reconnects with backoff after the link is lost.
//!
//! - **Health** as source `modbus:<link>`: `ok` while connected,
//!   `disconnected` while the server cannot be reached, the line's device
//!   is absent or the link was lost, `error` when the port exists but
//!   cannot be opened. A sensor whose request failed while the link works
//!   is `error` with the reason named (`illegal data address (exception
//!   2)`, `no reply within 200 ms`); its next value clears it.
//! - **Faults are counted by kind** ([`FaultKind`]): exception, timeout,
//!   bad frame (a reply that fails its CRC on RTU), disconnected,
//!   protocol. A timeout or a bad frame is retried up to `retries` times;
//!   on TCP a timeout ends the connection (a late reply would be taken for
//!   the next request's).
//! - **Writes** carry their own deadline: a write still queued when its
//!   caller gave up is never sent. With `read_back` the written point is
//!   read again and must hold what was written. A failed write is
//!   [`HwError::Modbus`] naming the fault; the actuator path drives the
//!   safe value on it. The link tells the loop when it comes up and goes
//!   down ([`LinkEvent`]) so that the actuators on it are driven safe then.
//! - RTU: frames are at least `frame_gap` apart (3.5 characters by
//!   default).

pub(crate) mod codec;
pub(crate) mod metrics;
pub(crate) mod plan;

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_modbus::client::{Client, Context};
use tokio_modbus::prelude::{Request, Response, Slave, SlaveContext};
use tokio_util::sync::CancellationToken;

use self::plan::{Fault, FaultKind, PollGroup, Poller, SensorRead, WriteOp};
use crate::hw::config::{
    ActuatorSpec, ActuatorTarget, ModbusLinkSpec, ModbusPoint, ModbusTransport, Parity,
    SensorSource, SensorSpec, WriteMode,
};
use crate::hw::mqtt_link::Backoff;
use crate::hw::{ActuatorDriver, DriverFuture, Health, HwError, Readings};

/// Writes queued per link before `write` waits for room.
const WRITE_QUEUE: usize = 16;
/// The longest a TCP connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// A link came up or went down: the loop drives its actuators safe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkEvent {
    Up(String),
    Down(String),
}

/// The running links.
#[derive(Debug, Default)]
pub struct ModbusLinks {
    links: HashMap<String, ModbusLinkHandle>,
    tasks: Vec<JoinHandle<()>>,
    first_attempts: Vec<oneshot::Receiver<()>>,
}

impl ModbusLinks {
    /// Spawns one task per link (inside a tokio runtime). Each polls the
    /// sensors whose source is `modbus` with its name, and tells `events`
    /// when it comes up or goes down. Nothing here fails: an unreachable
    /// device is retried with backoff. The tasks end when `shutdown` is
    /// cancelled.
    pub fn start(
        links: &[ModbusLinkSpec],
        sensors: &[SensorSpec],
        readings: Arc<dyn Readings>,
        events: mpsc::UnboundedSender<LinkEvent>,
        shutdown: CancellationToken,
    ) -> ModbusLinks {
        let mut out = ModbusLinks::default();
        for spec in links {
            let reads: Vec<SensorRead> = sensors
                .iter()
                .filter_map(|s| match &s.source {
                    SensorSource::Modbus { link, point, every } if *link == spec.name => {
                        Some(SensorRead {
                            name: s.name.clone(),
                            unit: point.unit,
                            table: point.table,
                            address: point.address,
                            codec: point.codec,
                            every: *every,
                        })
                    }
                    _ => None,
                })
                .collect();
            let groups = Arc::new(plan::plan(&reads, spec.max_registers, spec.max_gap));
            let (tx, rx) = mpsc::channel(WRITE_QUEUE);
            let (attempted, first_attempt) = oneshot::channel();
            out.first_attempts.push(first_attempt);
            let shared = Arc::new(Shared {
                name: spec.name.clone(),
                source: spec.source(),
                connected: AtomicBool::new(false),
                counters: LinkCounters::default(),
            });
            let task = LinkTask {
                spec: spec.clone(),
                shared: shared.clone(),
                poller: Poller::new(&groups, Instant::now()),
                groups,
                readings: readings.clone(),
                commands: rx,
                commands_open: true,
                events: events.clone(),
                shutdown: shutdown.clone(),
                health: None,
                first_attempt: Some(attempted),
                backoff: Backoff::new(spec.reconnect_min, spec.reconnect_max),
                received: Arc::new(AtomicU64::new(0)),
                last_frame: None,
                failing: HashSet::new(),
            };
            out.tasks.push(tokio::spawn(task.run()));
            out.links.insert(
                spec.name.clone(),
                ModbusLinkHandle {
                    shared,
                    tx,
                    timeout: spec.timeout,
                },
            );
        }
        out
    }

    pub fn link(&self, name: &str) -> Option<ModbusLinkHandle> {
        self.links.get(name).cloned()
    }

    /// Every link's counters, by name.
    pub fn stats(&self) -> Vec<LinkStats> {
        let mut stats: Vec<LinkStats> = self.links.values().map(|l| l.stats()).collect();
        stats.sort_by(|a, b| a.link.cmp(&b.link));
        stats
    }

    /// Resolves once every link has tried to connect once (so that the
    /// start-up safe values reach the devices that are there).
    pub async fn first_connection_attempts(&mut self) {
        for attempt in self.first_attempts.drain(..) {
            let _ = attempt.await;
        }
    }

    /// Waits until every link task has ended (after `shutdown`).
    pub async fn join(self) {
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

#[derive(Debug)]
struct Shared {
    name: String,
    source: String,
    connected: AtomicBool,
    counters: LinkCounters,
}

/// Counts of one link, kept as it runs.
#[derive(Debug, Default)]
struct LinkCounters {
    requests: AtomicU64,
    faults: [AtomicU64; FaultKind::ALL.len()],
    connections: AtomicU64,
    missed_polls: AtomicU64,
    /// Sum of the request latencies in µs (with `requests`: the mean).
    latency_us: AtomicU64,
    /// The latest request latencies, for percentiles.
    recent: std::sync::Mutex<plan::LatencyRing>,
}

/// What `/v1/observation` and `/metrics` show of a link.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LinkStats {
    pub link: String,
    pub connected: bool,
    pub requests: u64,
    /// Failed requests by kind (`exception`, `timeout`, `bad_frame`,
    /// `disconnected`, `protocol`).
    pub errors: std::collections::BTreeMap<&'static str, u64>,
    /// Connections made since start.
    pub connections: u64,
    /// Polls not made because the last period's requests still waited.
    pub missed_polls: u64,
    /// The mean request latency so far, in µs.
    pub mean_latency_us: u64,
    /// Request latency percentiles over the latest requests (see
    /// [`plan::LatencyRing`]), in µs; 0 before the first.
    pub latency_p50_us: u64,
    pub latency_p99_us: u64,
}

/// A handle to one running link; cheap to clone.
#[derive(Debug, Clone)]
pub struct ModbusLinkHandle {
    shared: Arc<Shared>,
    tx: mpsc::Sender<WriteCommand>,
    timeout: Duration,
}

#[derive(Debug)]
struct WriteCommand {
    point: ModbusPoint,
    op: WriteOp,
    read_back: bool,
    reply: oneshot::Sender<Result<(), Fault>>,
}

impl ModbusLinkHandle {
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    pub fn is_connected(&self) -> bool {
        self.shared.connected.load(Ordering::Acquire)
    }

    pub fn stats(&self) -> LinkStats {
        let c = &self.shared.counters;
        let requests = c.requests.load(Ordering::Relaxed);
        let (latency_p50_us, latency_p99_us) = {
            let recent = c
                .recent
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            (recent.percentile(0.5), recent.percentile(0.99))
        };
        LinkStats {
            link: self.shared.name.clone(),
            connected: self.is_connected(),
            requests,
            errors: FaultKind::ALL
                .iter()
                .zip(&c.faults)
                .map(|(k, n)| (k.as_str(), n.load(Ordering::Relaxed)))
                .collect(),
            connections: c.connections.load(Ordering::Relaxed),
            missed_polls: c.missed_polls.load(Ordering::Relaxed),
            mean_latency_us: c
                .latency_us
                .load(Ordering::Relaxed)
                .checked_div(requests)
                .unwrap_or(0),
            latency_p50_us,
            latency_p99_us,
        }
    }

    /// Writes `op` to `point` (then reads it back with `read_back`).
    /// [`HwError::Modbus`] names the fault: the link down, an exception, no
    /// reply, a read-back that differs.
    pub async fn write(
        &self,
        point: ModbusPoint,
        op: WriteOp,
        read_back: bool,
    ) -> Result<(), HwError> {
        let fail = |fault: String| HwError::Modbus {
            link: self.shared.name.clone(),
            fault,
        };
        if !self.is_connected() {
            return Err(fail("the link is down".to_string()));
        }
        let (reply, rx) = oneshot::channel();
        let cmd = WriteCommand {
            point,
            op,
            read_back,
            reply,
        };
        self.tx
            .send(cmd)
            .await
            .map_err(|_| fail("the link is closed".to_string()))?;
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(fault)) if fault.kind == FaultKind::Timeout => Err(HwError::Timeout(
                u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX),
            )),
            Ok(Err(fault)) => Err(fail(fault.message)),
            Err(_) => Err(fail("the link went down".to_string())),
        }
    }
}

/// Why a connected session ended.
enum End {
    Shutdown,
    Lost(String),
}

struct LinkTask {
    spec: ModbusLinkSpec,
    shared: Arc<Shared>,
    groups: Arc<Vec<PollGroup>>,
    poller: Poller,
    readings: Arc<dyn Readings>,
    commands: mpsc::Receiver<WriteCommand>,
    commands_open: bool,
    events: mpsc::UnboundedSender<LinkEvent>,
    shutdown: CancellationToken,
    health: Option<Health>,
    first_attempt: Option<oneshot::Sender<()>>,
    backoff: Backoff,
    /// Bytes received on the connection (tells a bad frame from silence).
    received: Arc<AtomicU64>,
    /// When the last frame ended (RTU frame gap).
    last_frame: Option<Instant>,
    /// Sensors whose last read failed (their error is set).
    failing: HashSet<String>,
}

impl LinkTask {
    fn tcp(&self) -> bool {
        matches!(self.spec.transport, ModbusTransport::Tcp { .. })
    }

    async fn run(mut self) {
        loop {
            if self.shutdown.is_cancelled() {
                break;
            }
            let shutdown = self.shutdown.clone();
            let connected = tokio::select! {
                _ = shutdown.cancelled() => break,
                c = self.connect() => c,
            };
            match connected {
                Ok(ctx) => {
                    tracing::info!(link = %self.spec.name, "modbus link up");
                    self.shared.connected.store(true, Ordering::Release);
                    self.shared
                        .counters
                        .connections
                        .fetch_add(1, Ordering::Relaxed);
                    self.set_health(Health::Ok);
                    self.backoff.reset();
                    let _ = self.events.send(LinkEvent::Up(self.spec.name.clone()));
                    self.attempted();
                    self.poller.restart(Instant::now());
                    let end = self.session(ctx).await;
                    self.shared.connected.store(false, Ordering::Release);
                    match end {
                        End::Shutdown => break,
                        End::Lost(why) => {
                            tracing::warn!(link = %self.spec.name, "modbus link lost: {why}; reconnecting");
                            self.set_health(Health::Disconnected);
                            let _ = self.events.send(LinkEvent::Down(self.spec.name.clone()));
                        }
                    }
                }
                Err(health) => {
                    if self.health.as_ref() != Some(&health) {
                        tracing::warn!(link = %self.spec.name, health = ?health, "cannot reach the modbus device; retrying with backoff");
                    }
                    self.set_health(health);
                    self.attempted();
                }
            }
            let delay = self.backoff.next_delay();
            if !self.wait(delay).await {
                break;
            }
        }
        self.shared.connected.store(false, Ordering::Release);
        tracing::debug!(link = %self.spec.name, "modbus link task ended");
    }

    fn attempted(&mut self) {
        if let Some(tx) = self.first_attempt.take() {
            let _ = tx.send(());
        }
    }

    fn set_health(&mut self, health: Health) {
        if self.health.as_ref() != Some(&health) {
            self.readings
                .source_health(&self.shared.source, health.clone());
            self.health = Some(health);
        }
    }

    /// Sleeps `delay`, answering writes with the link down. `false` on shutdown.
    async fn wait(&mut self, delay: Duration) -> bool {
        let until = Instant::now() + delay;
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return false,
                _ = tokio::time::sleep_until(until) => return true,
                cmd = self.commands.recv(), if self.commands_open => match cmd {
                    Some(cmd) => {
                        let _ = cmd.reply.send(Err(Fault {
                            kind: FaultKind::Disconnected,
                            message: "the link is down".to_string(),
                        }));
                    }
                    None => self.commands_open = false,
                },
            }
        }
    }

    async fn connect(&mut self) -> Result<Context, Health> {
        self.received = Arc::new(AtomicU64::new(0));
        self.last_frame = None;
        let slave = Slave(self.spec.unit_id);
        match &self.spec.transport {
            ModbusTransport::Tcp { host, port } => {
                let stream = tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    tokio::net::TcpStream::connect((host.as_str(), *port)),
                )
                .await
                .map_err(|_| Health::Disconnected)?
                .map_err(|_| Health::Disconnected)?;
                let _ = stream.set_nodelay(true);
                let counted = Counted::new(stream, self.received.clone(), false);
                Ok(tokio_modbus::client::tcp::attach_slave(counted, slave))
            }
            ModbusTransport::Rtu {
                path,
                baud,
                parity,
                data_bits,
                stop_bits,
            } => {
                use tokio_serial::SerialPortBuilderExt;
                let port = tokio_serial::new(path, *baud)
                    .data_bits(if *data_bits == 7 {
                        tokio_serial::DataBits::Seven
                    } else {
                        tokio_serial::DataBits::Eight
                    })
                    .parity(match parity {
                        Parity::None => tokio_serial::Parity::None,
                        Parity::Even => tokio_serial::Parity::Even,
                        Parity::Odd => tokio_serial::Parity::Odd,
                    })
                    .stop_bits(if *stop_bits == 2 {
                        tokio_serial::StopBits::Two
                    } else {
                        tokio_serial::StopBits::One
                    })
                    .flow_control(tokio_serial::FlowControl::None)
                    .open_native_async()
                    .map_err(|e| match e.kind {
                        tokio_serial::ErrorKind::Io(std::io::ErrorKind::NotFound) => {
                            Health::Disconnected
                        }
                        _ => Health::Error(format!("{path}: {}", e.description)),
                    })?;
                let counted = Counted::new(port, self.received.clone(), true);
                Ok(tokio_modbus::client::rtu::attach_slave(counted, slave))
            }
        }
    }

    /// Runs while the link is up: writes first, then the polls due.
    async fn session(&mut self, mut ctx: Context) -> End {
        loop {
            let wake = self.poller.next_wake(Instant::now());
            tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => return End::Shutdown,
                cmd = self.commands.recv(), if self.commands_open => match cmd {
                    Some(cmd) => {
                        if let Err(why) = self.write(&mut ctx, cmd).await {
                            return End::Lost(why);
                        }
                    }
                    None => self.commands_open = false,
                },
                _ = sleep_until(wake) => {
                    let missed = self.poller.missed();
                    if let Some((g, r)) = self.poller.take(Instant::now()) {
                        let now_missed = self.poller.missed().saturating_sub(missed);
                        if now_missed > 0 {
                            self.shared.counters.missed_polls.fetch_add(now_missed, Ordering::Relaxed);
                        }
                        if let Err(why) = self.poll(&mut ctx, g, r).await {
                            return End::Lost(why);
                        }
                    }
                }
            }
        }
    }

    /// One read request of a poll group. `Err`: the link is lost.
    async fn poll(&mut self, ctx: &mut Context, g: usize, r: usize) -> Result<(), String> {
        let groups = self.groups.clone();
        let Some(req) = groups.get(g).and_then(|g| g.requests.get(r)) else {
            return Ok(());
        };
        let request = match req.table {
            codec::Table::Holding => Request::ReadHoldingRegisters(req.start, req.count),
            codec::Table::Input => Request::ReadInputRegisters(req.start, req.count),
            codec::Table::Coil => Request::ReadCoils(req.start, req.count),
            codec::Table::DiscreteInput => Request::ReadDiscreteInputs(req.start, req.count),
        };
        match self.call(ctx, req.unit, request).await {
            Ok(response) => {
                let values: Vec<(&str, Option<f64>)> = match &response {
                    Response::ReadHoldingRegisters(words) | Response::ReadInputRegisters(words) => {
                        req.values_in_words(words).collect()
                    }
                    Response::ReadCoils(bits) | Response::ReadDiscreteInputs(bits) => {
                        req.values_in_bits(bits).collect()
                    }
                    _ => Vec::new(),
                };
                for (sensor, value) in values {
                    match value {
                        Some(v) => {
                            if self.failing.remove(sensor) {
                                self.readings.sensor_error(sensor, None);
                            }
                            self.readings.record(sensor, v);
                        }
                        None => {
                            let why = format!("short reply to {}", req.describe());
                            self.readings.rejected(&self.shared.source, &why);
                        }
                    }
                }
                Ok(())
            }
            Err(fault) => {
                let why = format!("{} reading {}", fault.message, req.describe());
                for slot in &req.slots {
                    self.failing.insert(slot.sensor.clone());
                    self.readings.sensor_error(&slot.sensor, Some(&why));
                }
                if fault.kind.ends_connection(self.tcp()) {
                    Err(why)
                } else {
                    Ok(())
                }
            }
        }
    }

    /// One write (and its read-back). `Err`: the link is lost.
    async fn write(&mut self, ctx: &mut Context, cmd: WriteCommand) -> Result<(), String> {
        if cmd.reply.is_closed() {
            return Ok(()); // the caller gave up: never write a stale command
        }
        let p = cmd.point;
        let request = match &cmd.op {
            WriteOp::Register(w) => Request::WriteSingleRegister(p.address, *w),
            WriteOp::Registers(ws) => Request::WriteMultipleRegisters(p.address, ws.clone().into()),
            WriteOp::Coil(b) => Request::WriteSingleCoil(p.address, *b),
            WriteOp::Coils(bs) => Request::WriteMultipleCoils(p.address, bs.clone().into()),
        };
        let mut result = self.call(ctx, p.unit, request).await.map(|_| ());
        if result.is_ok() && cmd.read_back {
            let width = p.codec.value_type.width();
            let read = if p.table.is_bits() {
                Request::ReadCoils(p.address, width)
            } else {
                Request::ReadHoldingRegisters(p.address, width)
            };
            result = match self.call(ctx, p.unit, read).await {
                Ok(Response::ReadHoldingRegisters(words)) if cmd.op.matches_words(&words) => Ok(()),
                Ok(Response::ReadCoils(bits)) if cmd.op.matches_bits(&bits) => Ok(()),
                Ok(other) => Err(Fault {
                    kind: FaultKind::Protocol,
                    message: format!("read back {other:?} after writing {:?} to {p}", cmd.op),
                }),
                Err(fault) => Err(Fault {
                    message: format!("{} reading back {p}", fault.message),
                    ..fault
                }),
            };
        }
        let lost = match &result {
            Err(f) if f.kind.ends_connection(self.tcp()) => Some(f.message.clone()),
            _ => None,
        };
        if let Err(f) = &result {
            tracing::warn!(link = %self.spec.name, point = %p, "modbus write failed: {}", f.message);
        }
        let _ = cmd.reply.send(result);
        match lost {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    /// One request with the link's timeout, retries and frame gap.
    async fn call(
        &mut self,
        ctx: &mut Context,
        unit: u8,
        request: Request<'static>,
    ) -> Result<Response, Fault> {
        let tcp = self.tcp();
        let mut attempt = 0;
        loop {
            if let Some(last) = self.last_frame {
                let quiet_until = last + self.spec.frame_gap;
                // Not even a timer registration when the line is quiet
                // already (on TCP always): it would cost a timer tick.
                if quiet_until > Instant::now() {
                    tokio::time::sleep_until(quiet_until).await;
                }
            }
            ctx.set_slave(Slave(unit));
            let before = self.received.load(Ordering::Relaxed);
            let started = Instant::now();
            let result = tokio::time::timeout(self.spec.timeout, ctx.call(request.clone())).await;
            let took = started.elapsed();
            self.last_frame = Some(Instant::now());
            let c = &self.shared.counters;
            c.requests.fetch_add(1, Ordering::Relaxed);
            let took_us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
            c.latency_us.fetch_add(took_us, Ordering::Relaxed);
            c.recent
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(took_us);
            metrics::modbus_request(&self.spec.name, took);
            let fault = match result {
                Ok(Ok(Ok(response))) => match short_reply(&request, &response) {
                    None => return Ok(response),
                    Some(fault) => fault,
                },
                Ok(Ok(Err(exception))) => Fault {
                    kind: FaultKind::Exception,
                    message: plan::exception_name(u8::from(exception)),
                },
                Ok(Err(tokio_modbus::Error::Transport(e))) => Fault {
                    kind: FaultKind::Disconnected,
                    message: format!("connection lost: {e}"),
                },
                Ok(Err(tokio_modbus::Error::Protocol(e))) => Fault {
                    kind: FaultKind::Protocol,
                    message: format!("reply does not answer the request: {e}"),
                },
                Err(_) => plan::timeout_fault(
                    self.spec.timeout,
                    self.received.load(Ordering::Relaxed).saturating_sub(before),
                ),
            };
            if let Some(n) = FaultKind::ALL
                .iter()
                .position(|k| *k == fault.kind)
                .and_then(|i| c.faults.get(i))
            {
                n.fetch_add(1, Ordering::Relaxed);
            }
            if !tcp && fault.kind.retryable() {
                // A device that answers late answers into the next
                // request's window (RTU has no transaction ids): keep the
                // line quiet for two more timeouts first; what came
                // meanwhile is dropped before the next request is written.
                self.last_frame = Some(Instant::now() + self.spec.timeout * 2);
            }
            if fault.kind.ends_connection(tcp)
                || !fault.kind.retryable()
                || attempt >= self.spec.retries
            {
                return Err(fault);
            }
            attempt += 1;
        }
    }
}

/// A read reply with fewer items than asked for (on RTU, a late reply to
/// another request may arrive in this one's window): a protocol fault.
fn short_reply(request: &Request<'_>, response: &Response) -> Option<Fault> {
    let (asked, got) = match (request, response) {
        (Request::ReadHoldingRegisters(_, n), Response::ReadHoldingRegisters(w))
        | (Request::ReadInputRegisters(_, n), Response::ReadInputRegisters(w)) => (*n, w.len()),
        (Request::ReadCoils(_, n), Response::ReadCoils(b))
        | (Request::ReadDiscreteInputs(_, n), Response::ReadDiscreteInputs(b)) => (*n, b.len()),
        _ => return None,
    };
    let registers = matches!(
        request,
        Request::ReadHoldingRegisters(..) | Request::ReadInputRegisters(..)
    );
    // Bits come padded to whole bytes; registers exactly.
    let fits = if registers {
        got == usize::from(asked)
    } else {
        got >= usize::from(asked)
    };
    (!fits).then(|| Fault {
        kind: FaultKind::Protocol,
        message: format!("reply of {got} items to a request for {asked}"),
    })
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A transport that counts the bytes it reads. On an RTU line it also
/// discards whatever waits unread when a request is written: the line is
/// half-duplex and the device speaks only when asked, so those bytes are a
/// reply that came after its request timed out, and would otherwise be
/// taken for the new request's.
#[derive(Debug)]
struct Counted<T> {
    inner: T,
    received: Arc<AtomicU64>,
    discard_stale: bool,
}

impl<T> Counted<T> {
    fn new(inner: T, received: Arc<AtomicU64>, discard_stale: bool) -> Self {
        Counted {
            inner,
            received,
            discard_stale,
        }
    }
}

impl<T: AsyncRead + Unpin> Counted<T> {
    /// Reads and drops what is there to read now (not counted).
    fn discard_unread(&mut self, cx: &mut TaskContext<'_>) {
        let mut scratch = [0u8; 256];
        // Bounded: a line that never stops talking is not waited out here.
        for _ in 0..64 {
            let mut buf = ReadBuf::new(&mut scratch);
            match Pin::new(&mut self.inner).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if !buf.filled().is_empty() => {
                    tracing::debug!(bytes = buf.filled().len(), "stale modbus bytes dropped");
                }
                _ => return,
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len().saturating_sub(before);
        self.received
            .fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
        result
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Counted<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.discard_stale {
            self.discard_unread(cx);
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

// ------------------------------------------------------------------ actuator

/// A Modbus actuator: writes its value (engineering units, scaled to the
/// register's type) to its point, and reads it back if configured.
#[derive(Debug)]
pub struct ModbusActuator {
    link: ModbusLinkHandle,
    point: ModbusPoint,
    mode: WriteMode,
    read_back: bool,
}

impl ModbusActuator {
    /// The driver of an actuator with a modbus target; `None` for other
    /// kinds or a link that is not running.
    pub fn from_spec(spec: &ActuatorSpec, links: &ModbusLinks) -> Option<Self> {
        match &spec.target {
            ActuatorTarget::Modbus {
                link,
                point,
                write,
                read_back,
            } => Some(ModbusActuator {
                link: links.link(link)?,
                point: *point,
                mode: *write,
                read_back: *read_back,
            }),
            _ => None,
        }
    }
}

impl ActuatorDriver for ModbusActuator {
    fn apply(&self, value: f64) -> DriverFuture<'_> {
        Box::pin(async move {
            // Limits were checked in engineering units; a value that still
            // does not fit the register is refused here, before any frame.
            let op = WriteOp::new(&self.point, self.mode, value)
                .map_err(|e| HwError::Unsupported(format!("{}: {e}", self.point)))?;
            self.link.write(self.point, op, self.read_back).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_with_fewer_items_than_asked_for_is_a_protocol_fault() {
        let asked = Request::ReadHoldingRegisters(0, 3);
        assert_eq!(
            short_reply(&asked, &Response::ReadHoldingRegisters(vec![1, 2, 3])),
            None
        );
        let short = short_reply(&asked, &Response::ReadHoldingRegisters(vec![1]));
        assert_eq!(short.map(|f| f.kind), Some(FaultKind::Protocol));
        // bits come padded to whole bytes
        let coils = Request::ReadCoils(0, 3);
        assert_eq!(
            short_reply(&coils, &Response::ReadCoils(vec![false; 8])),
            None
        );
        assert!(short_reply(&coils, &Response::ReadCoils(vec![false; 2])).is_some());
        // writes are not counted
        assert_eq!(
            short_reply(
                &Request::WriteSingleRegister(1, 5),
                &Response::WriteSingleRegister(1, 5)
            ),
            None
        );
    }
}
