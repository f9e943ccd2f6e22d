//! Serial ports: one task per `[[serial]]` port that opens the device,
//! frames lines, feeds every sensor on that port from each line, sends the
//! port's `query` at `query_hz`, answers commands (serial actuators, the
//! `serial_query` host tool) and reopens the device every `reconnect_ms`
//! after it vanished, without a restart.
//!
//! Health is reported as `serial:<name>`: `ok` while open, `disconnected`
//! while the device is absent or was lost (read error, end of file, the pty
//! closed), `error` when it exists but cannot be opened (permission denied,
//! busy, settings refused).
//!
//! Input that cannot be used never ends the port task: lines that are not
//! UTF-8, overlong lines (more than `max_line` bytes before the terminator),
//! lines that no parser on the port accepts and a partial line cut off by a
//! disconnect are reported through [`Readings::rejected`] and logged at most
//! once every 10 s per port (with the number of lines suppressed meanwhile).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use regex::Regex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_serial::{SerialPortBuilderExt, SerialStream};
use tokio_util::sync::CancellationToken;

use crate::hw::config::{
    ActuatorSpec, ActuatorTarget, Framing, LineParser, Parity, SensorSource, SensorSpec,
    SerialPortConfig,
};
use crate::hw::parse::{Line, ParseError, render_template};
use crate::hw::{ActuatorDriver, DriverFuture, Health, HwError, Readings};

/// Longest a periodic query may take to write before the port counts as lost.
const QUERY_WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// Commands queued per port before `command` waits for room.
const COMMAND_QUEUE: usize = 16;

/// The running serial ports.
#[derive(Debug, Default)]
pub struct SerialPorts {
    ports: HashMap<String, SerialPortHandle>,
    tasks: Vec<JoinHandle<()>>,
    /// One per port: resolves after the port's first attempt to open its device.
    first_attempts: Vec<oneshot::Receiver<()>>,
}

impl SerialPorts {
    /// Spawns one task per port (call inside a tokio runtime). Each port
    /// feeds the sensors whose source is `serial` with `port = <its name>`.
    /// Ports that cannot be opened are retried every `reconnect_ms`; nothing
    /// here fails. The tasks end when `shutdown` is cancelled.
    pub fn start(
        ports: &[SerialPortConfig],
        sensors: &[SensorSpec],
        readings: Arc<dyn Readings>,
        shutdown: CancellationToken,
    ) -> SerialPorts {
        let mut out = SerialPorts::default();
        for cfg in ports {
            let port_sensors: Vec<(String, LineParser)> = sensors
                .iter()
                .filter_map(|s| match &s.source {
                    SensorSource::Serial { port, parser } if *port == cfg.name => {
                        Some((s.name.clone(), parser.clone()))
                    }
                    _ => None,
                })
                .collect();
            let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
            let (attempted, first_attempt) = oneshot::channel();
            out.first_attempts.push(first_attempt);
            let source = format!("serial:{}", cfg.name);
            let connected = Arc::new(AtomicBool::new(false));
            let handle = SerialPortHandle {
                inner: Arc::new(HandleInner {
                    name: cfg.name.clone(),
                    source: source.clone(),
                    tx,
                    connected: connected.clone(),
                }),
            };
            let task = PortTask {
                cfg: cfg.clone(),
                source,
                sensors: port_sensors,
                readings: readings.clone(),
                commands: rx,
                commands_open: true,
                connected,
                shutdown: shutdown.clone(),
                health: None,
                waiters: Vec::new(),
                first_attempt: Some(attempted),
            };
            out.tasks.push(tokio::spawn(task.run()));
            out.ports.insert(cfg.name.clone(), handle);
        }
        out
    }

    /// The port named `name` in `[[serial]]`.
    pub fn port(&self, name: &str) -> Option<SerialPortHandle> {
        self.ports.get(name).cloned()
    }

    /// Names of the configured ports.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.ports.keys().map(String::as_str)
    }

    /// Resolves once every port has tried to open its device once, so that
    /// commands (the start-up safe values) reach the devices that are
    /// present. Opening is quick; it does not wait for absent devices.
    pub async fn first_open_attempts(&mut self) {
        for attempt in self.first_attempts.drain(..) {
            let _ = attempt.await;
        }
    }

    /// Waits until every port task has ended (after `shutdown` was cancelled).
    pub async fn join(self) {
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// A handle to one running port; cheap to clone.
#[derive(Debug, Clone)]
pub struct SerialPortHandle {
    inner: Arc<HandleInner>,
}

#[derive(Debug)]
struct HandleInner {
    name: String,
    source: String,
    tx: mpsc::Sender<Command>,
    connected: Arc<AtomicBool>,
}

impl SerialPortHandle {
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Whether the device is open right now.
    pub fn is_connected(&self) -> bool {
        self.inner.connected.load(Ordering::Acquire)
    }

    /// Writes `bytes` to the device. With `expect`, then waits for the
    /// reply: the first line after the write that matches `expect` is
    /// returned (`Ok(Some(line))`, without its terminator). Lines that feed
    /// a sensor on this port and do not match are telemetry, not the reply,
    /// and are skipped; the first line that matches nothing (no sensor value,
    /// not `expect`) is a wrong reply: [`HwError::UnexpectedReply`]. Every
    /// line still feeds the port's sensors. Without `expect`, `Ok(None)` once
    /// the bytes are written.
    ///
    /// `timeout` bounds the whole command: [`HwError::Timeout`] when it
    /// passes; a command that is still queued then is dropped, never written
    /// late. [`HwError::Disconnected`] when the device is not open.
    pub async fn command(
        &self,
        bytes: &[u8],
        expect: Option<&Regex>,
        timeout: Duration,
    ) -> Result<Option<String>, HwError> {
        let disconnected = || HwError::Disconnected(self.inner.source.clone());
        if !self.is_connected() {
            return Err(disconnected());
        }
        let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let deadline = Instant::now() + timeout;
        let (reply, rx) = oneshot::channel();
        let cmd = Command {
            bytes: bytes.to_vec(),
            expect: expect.cloned(),
            deadline,
            timeout_ms,
            reply,
        };
        let exchange = async {
            self.inner.tx.send(cmd).await.map_err(|_| disconnected())?;
            rx.await.map_err(|_| disconnected())?
        };
        match tokio::time::timeout_at(deadline, exchange).await {
            Ok(result) => result,
            Err(_) => Err(HwError::Timeout(timeout_ms)),
        }
    }
}

#[derive(Debug)]
struct Command {
    bytes: Vec<u8>,
    expect: Option<Regex>,
    deadline: Instant,
    timeout_ms: u64,
    reply: oneshot::Sender<Result<Option<String>, HwError>>,
}

/// A written command waiting for its reply line.
#[derive(Debug)]
struct Waiter {
    expect: Regex,
    reply: oneshot::Sender<Result<Option<String>, HwError>>,
}

/// Why a connected session ended.
enum End {
    Shutdown,
    Lost(String),
}

struct PortTask {
    cfg: SerialPortConfig,
    source: String,
    sensors: Vec<(String, LineParser)>,
    readings: Arc<dyn Readings>,
    commands: mpsc::Receiver<Command>,
    commands_open: bool,
    connected: Arc<AtomicBool>,
    shutdown: CancellationToken,
    health: Option<Health>,
    waiters: Vec<Waiter>,
    /// Fired after the first attempt to open the device.
    first_attempt: Option<oneshot::Sender<()>>,
}

impl PortTask {
    async fn run(mut self) {
        loop {
            if self.shutdown.is_cancelled() {
                break;
            }
            match self.open() {
                Ok(stream) => {
                    tracing::info!(port = %self.cfg.name, path = %self.cfg.path, "serial port open");
                    self.set_health(Health::Ok);
                    self.attempted();
                    let end = self.session(stream).await;
                    self.connected.store(false, Ordering::Release);
                    for w in self.waiters.drain(..) {
                        let _ = w
                            .reply
                            .send(Err(HwError::Disconnected(self.source.clone())));
                    }
                    match end {
                        End::Shutdown => break,
                        End::Lost(why) => {
                            tracing::warn!(port = %self.cfg.name, path = %self.cfg.path, "serial port lost: {why}; reopening every {} ms", self.cfg.reconnect_ms);
                            self.set_health(Health::Disconnected);
                        }
                    }
                }
                Err(health) => {
                    if self.health.as_ref() != Some(&health) {
                        let why = match &health {
                            Health::Error(e) => e.clone(),
                            _ => "no such device".to_string(),
                        };
                        tracing::warn!(port = %self.cfg.name, path = %self.cfg.path, "cannot open serial port: {why}; retrying every {} ms", self.cfg.reconnect_ms);
                    }
                    self.set_health(health);
                    self.attempted();
                }
            }
            if !self.wait_before_reopen().await {
                break;
            }
        }
        self.connected.store(false, Ordering::Release);
        tracing::debug!(port = %self.cfg.name, "serial port task ended");
    }

    fn attempted(&mut self) {
        if let Some(tx) = self.first_attempt.take() {
            let _ = tx.send(());
        }
    }

    /// Sleeps `reconnect_ms`, answering commands with `Disconnected`.
    /// `false` on shutdown.
    async fn wait_before_reopen(&mut self) -> bool {
        let until = Instant::now() + Duration::from_millis(self.cfg.reconnect_ms);
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return false,
                _ = tokio::time::sleep_until(until) => return true,
                cmd = self.commands.recv(), if self.commands_open => match cmd {
                    Some(cmd) => {
                        let _ = cmd.reply.send(Err(HwError::Disconnected(self.source.clone())));
                    }
                    None => self.commands_open = false,
                },
            }
        }
    }

    fn open(&self) -> Result<SerialStream, Health> {
        let c = &self.cfg;
        let data_bits = match c.data_bits {
            5 => tokio_serial::DataBits::Five,
            6 => tokio_serial::DataBits::Six,
            7 => tokio_serial::DataBits::Seven,
            _ => tokio_serial::DataBits::Eight,
        };
        let parity = match c.parity {
            Parity::None => tokio_serial::Parity::None,
            Parity::Even => tokio_serial::Parity::Even,
            Parity::Odd => tokio_serial::Parity::Odd,
        };
        let stop_bits = if c.stop_bits == 2 {
            tokio_serial::StopBits::Two
        } else {
            tokio_serial::StopBits::One
        };
        tokio_serial::new(&c.path, c.baud)
            .data_bits(data_bits)
            .parity(parity)
            .stop_bits(stop_bits)
            .flow_control(tokio_serial::FlowControl::None)
            .open_native_async()
            .map_err(|e| match e.kind {
                tokio_serial::ErrorKind::Io(std::io::ErrorKind::NotFound) => Health::Disconnected,
                tokio_serial::ErrorKind::NoDevice => {
                    Health::Error(format!("{} is busy: {}", c.path, e.description))
                }
                _ => Health::Error(format!("{}: {}", c.path, e.description)),
            })
    }

    fn set_health(&mut self, health: Health) {
        self.connected
            .store(health == Health::Ok, Ordering::Release);
        if self.health.as_ref() != Some(&health) {
            self.readings.source_health(&self.source, health.clone());
            self.health = Some(health);
        }
    }

    /// Runs while the device is open.
    async fn session(&mut self, mut stream: SerialStream) -> End {
        let mut framer = LineFramer::new(self.cfg.framing, self.cfg.max_line);
        let mut buf = vec![0u8; 4096];
        let query = self.cfg.query.clone().map(String::into_bytes);
        let mut query_tick = match (&query, self.cfg.query_hz) {
            (Some(_), hz) => {
                let period = Duration::from_secs_f64(1.0 / hz.filter(|h| *h > 0.0).unwrap_or(1.0));
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
                Some(tick)
            }
            (None, _) => None,
        };
        let end = loop {
            tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => break End::Shutdown,
                read = stream.read(&mut buf) => match read {
                    Ok(0) => break End::Lost("end of file".to_string()),
                    Ok(n) => framer.push(&buf[..n], |frame| self.frame(frame)),
                    Err(e) => break End::Lost(format!("read failed: {e}")),
                },
                cmd = self.commands.recv(), if self.commands_open => match cmd {
                    Some(cmd) => {
                        if let Err(why) = self.command(&mut stream, cmd).await {
                            break End::Lost(why);
                        }
                    }
                    None => self.commands_open = false,
                },
                _ = tick(&mut query_tick) => {
                    if let Some(q) = &query {
                        let write = async {
                            stream.write_all(q).await?;
                            stream.flush().await
                        };
                        match tokio::time::timeout(QUERY_WRITE_TIMEOUT, write).await {
                            Ok(Ok(())) => {}
                            Ok(Err(e)) => break End::Lost(format!("writing the query failed: {e}")),
                            Err(_) => break End::Lost("writing the query timed out".to_string()),
                        }
                    }
                }
            }
        };
        let partial = framer.pending();
        if partial > 0 && matches!(end, End::Lost(_)) {
            self.reject(format!(
                "partial line ({partial} bytes) when the port closed"
            ));
        }
        end
    }

    /// Writes a command; registers its reply waiter. `Err` = the port is lost.
    async fn command(&mut self, stream: &mut SerialStream, cmd: Command) -> Result<(), String> {
        if cmd.reply.is_closed() || Instant::now() >= cmd.deadline {
            return Ok(()); // the caller gave up: never write a stale command
        }
        let write = async {
            stream.write_all(&cmd.bytes).await?;
            stream.flush().await
        };
        match tokio::time::timeout_at(cmd.deadline, write).await {
            Err(_) => {
                let _ = cmd.reply.send(Err(HwError::Timeout(cmd.timeout_ms)));
                Ok(())
            }
            Ok(Err(e)) => {
                let failure = format!("write failed: {e}");
                let _ = cmd
                    .reply
                    .send(Err(HwError::io("writing to the serial port", e)));
                Err(failure)
            }
            Ok(Ok(())) => {
                match cmd.expect {
                    None => {
                        let _ = cmd.reply.send(Ok(None));
                    }
                    Some(expect) => {
                        self.waiters.retain(|w| !w.reply.is_closed());
                        self.waiters.push(Waiter {
                            expect,
                            reply: cmd.reply,
                        });
                    }
                }
                Ok(())
            }
        }
    }

    fn frame(&mut self, frame: Frame<'_>) {
        match frame {
            Frame::Overlong => self.reject(format!(
                "overlong line (more than {} bytes)",
                self.cfg.max_line
            )),
            Frame::Line(bytes) => match std::str::from_utf8(bytes) {
                Ok(text) => self.line(text),
                Err(_) => self.reject(format!("line is not UTF-8 ({} bytes)", bytes.len())),
            },
        }
    }

    fn line(&mut self, text: &str) {
        let line = Line::new(text);
        let text = line.text();
        if text.is_empty() {
            return;
        }
        let mut used = false;
        // The most telling error: a bad value in a line of the right format
        // (e.g. `rpm=inf`) rather than another parser's format mismatch.
        let mut error: Option<(&str, ParseError)> = None;
        for (name, parser) in &self.sensors {
            match line.value(parser) {
                Ok(Some(v)) => {
                    self.readings.record(name, v);
                    used = true;
                }
                Ok(None) => {}
                Err(e) => {
                    if error.as_ref().is_none_or(|(_, prev)| {
                        prev.is_format_mismatch() && !e.is_format_mismatch()
                    }) {
                        error = Some((name, e));
                    }
                }
            }
        }
        self.waiters.retain(|w| !w.reply.is_closed());
        if let Some(i) = self.waiters.iter().position(|w| w.expect.is_match(text)) {
            let w = self.waiters.remove(i);
            let _ = w.reply.send(Ok(Some(text.to_string())));
            return;
        }
        if used {
            return;
        }
        if !self.waiters.is_empty() {
            let w = self.waiters.remove(0);
            let _ = w
                .reply
                .send(Err(HwError::UnexpectedReply(text.to_string())));
            return;
        }
        match error {
            Some((_, e)) if e.is_format_mismatch() => {
                self.reject(format!("unrecognised line {:?} ({e})", shorten(text)));
            }
            Some((sensor, e)) => {
                let why = format!("{e} for sensor {sensor} in line {:?}", shorten(text));
                self.reject(why);
            }
            None => {
                tracing::trace!(port = %self.cfg.name, "line for no sensor: {:?}", shorten(text))
            }
        }
    }

    /// Counted and logged (rate-limited) by the world, per source.
    fn reject(&mut self, why: String) {
        self.readings.rejected(&self.source, &why);
    }
}

async fn tick(interval: &mut Option<tokio::time::Interval>) {
    match interval {
        Some(i) => {
            i.tick().await;
        }
        None => std::future::pending().await,
    }
}

fn shorten(s: &str) -> &str {
    match s.char_indices().nth(60) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

// ------------------------------------------------------------------ framing

#[derive(Debug, PartialEq)]
pub(crate) enum Frame<'a> {
    /// A line without its terminator.
    Line(&'a [u8]),
    /// A line longer than `max_line` was dropped.
    Overlong,
}

/// Splits a byte stream into lines by the port's framing, dropping lines
/// longer than `max_line` bytes (counted without the terminator).
#[derive(Debug)]
pub(crate) struct LineFramer {
    framing: Framing,
    max_line: usize,
    buf: Vec<u8>,
    /// Inside an overlong line: drop bytes until the next terminator.
    discarding: bool,
    /// The last byte seen was `\r` (for `crlf` while discarding).
    prev_cr: bool,
}

impl LineFramer {
    pub(crate) fn new(framing: Framing, max_line: usize) -> Self {
        LineFramer {
            framing,
            max_line,
            buf: Vec::with_capacity(max_line.min(4096)),
            discarding: false,
            prev_cr: false,
        }
    }

    /// Bytes of an unfinished line.
    pub(crate) fn pending(&self) -> usize {
        if self.discarding { 0 } else { self.buf.len() }
    }

    pub(crate) fn push(&mut self, data: &[u8], mut out: impl FnMut(Frame<'_>)) {
        for &b in data {
            let end = match self.framing {
                Framing::Lf => b == b'\n',
                Framing::Cr => b == b'\r',
                Framing::Crlf => b == b'\n' && self.prev_cr,
            };
            self.prev_cr = b == b'\r';
            if end {
                self.end_line(&mut out);
                continue;
            }
            if self.discarding {
                continue;
            }
            self.buf.push(b);
            // one byte of slack for a `\r` that the terminator will strip
            if self.buf.len() > self.max_line + 1 {
                out(Frame::Overlong);
                self.discarding = true;
                self.buf.clear();
            }
        }
    }

    fn end_line(&mut self, out: &mut impl FnMut(Frame<'_>)) {
        if std::mem::take(&mut self.discarding) {
            self.buf.clear();
            return;
        }
        let mut line = &self.buf[..];
        match self.framing {
            Framing::Lf | Framing::Crlf => {
                if let Some(stripped) = line.strip_suffix(b"\r") {
                    line = stripped;
                }
            }
            Framing::Cr => {
                if let Some(stripped) = line.strip_prefix(b"\n") {
                    line = stripped;
                }
            }
        }
        if line.len() > self.max_line {
            out(Frame::Overlong);
        } else if !line.is_empty() {
            out(Frame::Line(line));
        }
        self.buf.clear();
    }
}

// ------------------------------------------------------------------ actuator

/// A serial actuator: writes `template` with `{value}` replaced and, with
/// `expect`, requires a matching reply within `reply_timeout`.
#[derive(Debug)]
pub struct SerialActuator {
    port: SerialPortHandle,
    template: String,
    expect: Option<Regex>,
    reply_timeout: Duration,
}

impl SerialActuator {
    pub fn new(
        port: SerialPortHandle,
        template: String,
        expect: Option<Regex>,
        reply_timeout: Duration,
    ) -> Self {
        SerialActuator {
            port,
            template,
            expect,
            reply_timeout,
        }
    }

    /// The driver of an actuator with a serial target; `None` for other
    /// kinds or a port that is not running.
    pub fn from_spec(spec: &ActuatorSpec, ports: &SerialPorts) -> Option<Self> {
        match &spec.target {
            ActuatorTarget::Serial {
                port,
                template,
                expect,
                reply_timeout,
            } => Some(SerialActuator::new(
                ports.port(port)?,
                template.clone(),
                expect.clone(),
                *reply_timeout,
            )),
            _ => None,
        }
    }

    /// The bytes written for `value`.
    pub fn render(&self, value: f64) -> String {
        render_template(&self.template, value)
    }
}

impl ActuatorDriver for SerialActuator {
    fn apply(&self, value: f64) -> DriverFuture<'_> {
        Box::pin(async move {
            if !value.is_finite() {
                return Err(HwError::Unsupported(format!(
                    "{value} is not a finite value"
                )));
            }
            let text = self.render(value);
            self.port
                .command(text.as_bytes(), self.expect.as_ref(), self.reply_timeout)
                .await
                .map(|_| ())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(framing: Framing, max: usize, chunks: &[&[u8]]) -> (Vec<String>, usize) {
        let mut f = LineFramer::new(framing, max);
        let mut lines = Vec::new();
        let mut overlong = 0;
        for c in chunks {
            f.push(c, |fr| match fr {
                Frame::Line(l) => lines.push(String::from_utf8_lossy(l).into_owned()),
                Frame::Overlong => overlong += 1,
            });
        }
        (lines, overlong)
    }

    #[test]
    fn lf_framing_strips_cr_and_joins_chunks() {
        let (lines, over) = frames(Framing::Lf, 16, &[b"a=1\nb=", b"2\r\n\n", b"c=3"]);
        assert_eq!(lines, ["a=1", "b=2"]);
        assert_eq!(over, 0);
    }

    #[test]
    fn crlf_framing_needs_both_bytes() {
        let (lines, _) = frames(Framing::Crlf, 16, &[b"a=1\r", b"\nb=2\nc=3\r\n"]);
        assert_eq!(lines, ["a=1", "b=2\nc=3"]);
    }

    #[test]
    fn cr_framing_ignores_a_following_lf() {
        let (lines, _) = frames(Framing::Cr, 16, &[b"a=1\r\nb=2\r", b"c=3\r"]);
        assert_eq!(lines, ["a=1", "b=2", "c=3"]);
    }

    #[test]
    fn overlong_lines_are_dropped_once_and_framing_recovers() {
        let long = [b'x'; 40];
        let (lines, over) = frames(
            Framing::Lf,
            8,
            &[b"ok=1\n", &long, &long, b"tail\nnext=2\n"],
        );
        assert_eq!(lines, ["ok=1", "next=2"]);
        assert_eq!(over, 1);
        // exactly max_line is fine, one more is not (also when it arrives whole)
        let (lines, over) = frames(Framing::Lf, 4, &[b"abcd\r\nabcde\nab\n"]);
        assert_eq!(lines, ["abcd", "ab"]);
        assert_eq!(over, 1);
        let (lines, over) = frames(Framing::Crlf, 4, &[b"abcdefgh\r", b"\nok\r\n"]);
        assert_eq!(lines, ["ok"]);
        assert_eq!(over, 1);
    }

    #[test]
    fn pending_counts_an_unfinished_line() {
        let mut f = LineFramer::new(Framing::Lf, 64);
        f.push(b"a=1\nb=", |_| {});
        assert_eq!(f.pending(), 2);
    }
}
