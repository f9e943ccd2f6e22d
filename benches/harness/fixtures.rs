//! Real parts the measurements share: an in-process daemon on a loopback
//! port, a roz.v1 client stream, the bare tonic echo (the floor of every
//! gRPC measurement), socat pty pairs with a scripted device on the far end.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use futures_util::{Stream, StreamExt as _};
use rozd::api::proto;
use rozd::api::proto::agent_service_client::AgentServiceClient;
use rozd::api::proto::agent_service_server::{AgentService, AgentServiceServer};
use rozd::api::proto::session_request::Request as Req;
use rozd::api::proto::session_response::Response as Resp;
use rozd::config::{Config, ConfigSource};
use rozd::hw::ActuatorDriver;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

/// Bound on one wait for the other side: a hang fails the run instead of
/// stalling it. Not a synchronisation.
pub const WAIT: Duration = Duration::from_secs(20);

/// The daemon's built-in simulated rover: what `rozd run` serves without a
/// config file (sensors, actuators, a reflex rule), on an ephemeral port.
pub fn builtin_host(store: &std::path::Path) -> String {
    // The harness measures many concurrent sessions, 100 per connection:
    // beyond the default bounds a Pi 4 is given (`session.max_sessions`,
    // `server.max_concurrent_streams`), which an operator raises the same way.
    let text = include_str!("../../src/config/builtin.toml").replace(
        "listen = \"127.0.0.1:8080\"",
        "listen = \"127.0.0.1:0\"\nmax_concurrent_streams = 1024",
    );
    format!(
        "{text}\n[store]\npath = {:?}\n[session]\nmax_sessions = 1000\n",
        store.display().to_string()
    )
}

/// A daemon served from this process (on the harness's runtime).
pub struct Daemon {
    pub addr: SocketAddr,
    pub host: rozd::testing::Probe,
    stop: Option<oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Daemon {
    /// Config text without `[server]`/`[store]`/`[session]`: those point
    /// at an ephemeral loopback port and a temporary store, with the bounds
    /// of [`builtin_host`].
    pub async fn start(host: &str) -> Result<Daemon> {
        let dir = tempfile::tempdir()?;
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nmax_concurrent_streams = 1024\n\
             [store]\npath = {:?}\n[session]\nmax_sessions = 1000\n{host}",
            dir.path().join("rozd.db").display().to_string()
        );
        Self::start_text(&text, dir).await
    }

    /// The built-in simulated rover.
    pub async fn builtin() -> Result<Daemon> {
        let dir = tempfile::tempdir()?;
        let text = builtin_host(&dir.path().join("rozd.db"));
        Self::start_text(&text, dir).await
    }

    async fn start_text(text: &str, dir: tempfile::TempDir) -> Result<Daemon> {
        let config = Config::parse(text, ConfigSource::BuiltIn)
            .map_err(|e| anyhow!("benchmark config: {e}"))?;
        let daemon = rozd::daemon::Daemon::bind(config).await?;
        let addr = daemon.local_addr();
        let host = daemon.probe();
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(daemon.serve(async move {
            let _ = stopped.await;
        }));
        Ok(Daemon {
            addr,
            host,
            stop: Some(stop),
            served: Some(served),
            _dir: dir,
        })
    }

    pub async fn shutdown(mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(served) = self.served.take() {
            tokio::time::timeout(WAIT, served)
                .await
                .context("daemon shutdown")??;
        }
        Ok(())
    }
}

/// A gRPC connection to `addr`. Nagle off on the client side too: tool
/// calls are small messages on a latency-critical path (tonic's default,
/// stated here because the measurements depend on it).
pub async fn connect(addr: SocketAddr) -> Result<AgentServiceClient<Channel>> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .tcp_nodelay(true)
        .connect()
        .await
        .with_context(|| format!("connect to {addr}"))?;
    Ok(AgentServiceClient::new(channel))
}

/// One `StreamSession` stream from the client side (rozd or the echo).
pub struct SessionStream {
    tx: mpsc::Sender<proto::SessionRequest>,
    rx: tonic::Streaming<proto::SessionResponse>,
}

impl SessionStream {
    pub async fn open(client: &mut AgentServiceClient<Channel>) -> Result<SessionStream> {
        let (tx, rx) = mpsc::channel(64);
        let response = client
            .stream_session(ReceiverStream::new(rx))
            .await
            .context("StreamSession")?;
        Ok(SessionStream {
            tx,
            rx: response.into_inner(),
        })
    }

    /// Opens a stream and starts a session offering `tools`.
    pub async fn start(
        client: &mut AgentServiceClient<Channel>,
        tools: Vec<proto::ToolSchema>,
    ) -> Result<SessionStream> {
        let mut stream = Self::open(client).await?;
        stream
            .send(Req::Start(proto::StartSession {
                environment_id: "bench".into(),
                tools,
                ..Default::default()
            }))
            .await?;
        match stream.next_significant().await? {
            Resp::SessionStarted(_) => Ok(stream),
            other => bail!("expected SessionStarted, got {other:?}"),
        }
    }

    pub async fn send(&self, request: Req) -> Result<()> {
        self.tx
            .send(proto::SessionRequest {
                request: Some(request),
            })
            .await
            .map_err(|_| anyhow!("the request stream closed"))
    }

    pub async fn next(&mut self) -> Result<Resp> {
        let message = tokio::time::timeout(WAIT, self.rx.message())
            .await
            .context("no response in time")??
            .ok_or_else(|| anyhow!("the response stream ended"))?;
        message
            .response
            .ok_or_else(|| anyhow!("a response without a body"))
    }

    /// The next response that is not a keepalive, presence hint or activity update.
    pub async fn next_significant(&mut self) -> Result<Resp> {
        loop {
            match self.next().await? {
                Resp::Keepalive(_) | Resp::PresenceHint(_) | Resp::ActivityUpdate(_) => {}
                Resp::Error(e) => bail!("SessionError {}: {}", e.code, e.message),
                other => return Ok(other),
            }
        }
    }

    /// Skips streamed text and thinking up to the next `ToolRequest`.
    pub async fn tool_request(&mut self) -> Result<proto::ToolRequest> {
        loop {
            match self.next_significant().await? {
                Resp::ToolRequest(request) => return Ok(request),
                Resp::TextDelta(_) | Resp::ThinkingDelta(_) | Resp::ContextCompacted(_) => {}
                other => bail!("expected a ToolRequest, got {other:?}"),
            }
        }
    }

    /// Skips streamed text and thinking up to a `TurnComplete` with `end_turn`.
    pub async fn turn_complete(&mut self) -> Result<()> {
        loop {
            match self.next_significant().await? {
                Resp::TurnComplete(done) if done.stop_reason == "end_turn" => return Ok(()),
                Resp::TextDelta(_) | Resp::ThinkingDelta(_) | Resp::ContextCompacted(_) => {}
                other => bail!("expected TurnComplete (end_turn), got {other:?}"),
            }
        }
    }

    /// Sends `CancelSession` and waits for the stream to end.
    pub async fn close(mut self) -> Result<()> {
        self.send(Req::CancelSession(proto::CancelSession {
            reason: "benchmark done".into(),
        }))
        .await?;
        drop(self.tx);
        loop {
            match tokio::time::timeout(WAIT, self.rx.message()).await {
                Ok(Ok(Some(_))) => {}
                Ok(Ok(None) | Err(_)) => return Ok(()),
                Err(_) => bail!("the stream did not end after CancelSession"),
            }
        }
    }
}

/// The client tool every measurement offers: PURE, no parameters.
pub fn step_tool() -> proto::ToolSchema {
    let mut object = prost_types::Struct::default();
    object.fields.insert(
        "type".into(),
        prost_types::Value {
            kind: Some(prost_types::value::Kind::StringValue("object".into())),
        },
    );
    proto::ToolSchema {
        name: STEP_TOOL.into(),
        description: "does nothing; the benchmark answers at once".into(),
        parameters_schema: Some(object),
        timeout_ms: 10_000,
        category: proto::ToolCategoryHint::ToolCategoryPure as i32,
    }
}

pub const STEP_TOOL: &str = "bench_step";

pub fn user(text: &str) -> Req {
    Req::UserMessage(proto::UserMessage {
        content: text.into(),
        ..Default::default()
    })
}

pub fn tool_result(id: &str, result: &str) -> Req {
    Req::ToolResult(proto::ToolResult {
        tool_call_id: id.into(),
        success: true,
        result: result.into(),
        ..Default::default()
    })
}

/// A local-model prompt that makes `k` sequential calls of [`STEP_TOOL`].
pub fn steps_prompt(k: usize) -> String {
    vec![format!("call {STEP_TOOL} {{}}"); k].join("; ")
}

// ------------------------------------------------------------------ echo

/// What the echo answers to a `ToolResult` whose `result` is this.
pub const END_TURN: &str = "end";

/// The floor: a bare tonic bidi stream of the same roz.v1 messages, with no
/// session behind it. Each request gets one response, mapped on the stream
/// itself (no task, no queue): `StartSession` -> `SessionStarted`,
/// `UserMessage` -> `ToolRequest`, `ToolResult` -> the next `ToolRequest`,
/// or `TurnComplete` when its result is [`END_TURN`] or a number (which is
/// applied to `driver` first: the direct driver call of the host-tool floor).
#[derive(Clone, Default)]
pub struct Echo {
    pub driver: Option<Arc<dyn ActuatorDriver>>,
    /// Precede every `ToolRequest` with the messages rozd's session sends
    /// before one in a step ([`step_preamble`]): the floor of the same
    /// protocol traffic, without the session's work.
    pub same_messages: bool,
}

/// How many messages [`step_preamble`] has.
pub const STEP_PREAMBLE: usize = 4;

/// What rozd sends before each `ToolRequest` of a client-tool step on the
/// built-in host (`ooda_re_act`, the local model): the activity of the new
/// cycle, the model's thinking and text, and the activity of the tool call.
fn step_preamble(n: u64) -> Vec<Resp> {
    let activity = |state: &str, detail: String| {
        Resp::ActivityUpdate(proto::ActivityUpdate {
            state: state.into(),
            detail,
            progress: None,
        })
    };
    vec![
        activity("thinking", format!("ooda cycle {n}")),
        Resp::ThinkingDelta(proto::ThinkingDelta {
            message_id: "echo".into(),
            content: "Offline command model. 11 command(s) in the prompt; 1 tool call(s) done."
                .into(),
        }),
        Resp::TextDelta(proto::TextDelta {
            message_id: "echo".into(),
            content: format!("Calling {STEP_TOOL}."),
        }),
        activity("calling_tool", STEP_TOOL.into()),
    ]
}

type EchoStream<T> = Pin<Box<dyn Stream<Item = Result<T, tonic::Status>> + Send + 'static>>;

fn tool_request(n: u64) -> Resp {
    Resp::ToolRequest(proto::ToolRequest {
        tool_call_id: format!("toolu_echo_{n}"),
        tool_name: STEP_TOOL.into(),
        parameters: Some(prost_types::Struct::default()),
        timeout_ms: 10_000,
    })
}

fn turn_complete() -> Resp {
    Resp::TurnComplete(proto::TurnComplete {
        message_id: "echo".into(),
        usage: Some(proto::TokenUsage::default()),
        stop_reason: "end_turn".into(),
    })
}

#[tonic::async_trait]
impl AgentService for Echo {
    type StreamSessionStream = EchoStream<proto::SessionResponse>;
    type WatchTeamStream = EchoStream<proto::TeamEvent>;

    async fn stream_session(
        &self,
        request: tonic::Request<tonic::Streaming<proto::SessionRequest>>,
    ) -> Result<tonic::Response<Self::StreamSessionStream>, tonic::Status> {
        let driver = self.driver.clone();
        let same_messages = self.same_messages;
        let mut n = 0u64;
        let responses = request.into_inner().then(move |request| {
            n += 1;
            let driver = driver.clone();
            let next_call = move || {
                let mut out = if same_messages {
                    step_preamble(n)
                } else {
                    Vec::new()
                };
                out.push(tool_request(n));
                out
            };
            async move {
                let responses = match request?.request {
                    Some(Req::Start(_)) => vec![Resp::SessionStarted(proto::SessionStarted {
                        session_id: "echo".into(),
                        model: "echo".into(),
                        permissions: Vec::new(),
                    })],
                    Some(Req::ToolResult(r)) => match (r.result.parse::<f64>(), &driver) {
                        (Ok(value), Some(driver)) => {
                            driver
                                .apply(value)
                                .await
                                .map_err(|e| tonic::Status::internal(e.to_string()))?;
                            vec![turn_complete()]
                        }
                        _ if r.result == END_TURN => vec![turn_complete()],
                        _ => next_call(),
                    },
                    Some(Req::CancelSession(_)) => {
                        return Err(tonic::Status::cancelled("session cancelled"));
                    }
                    _ => next_call(),
                };
                Ok(responses)
            }
        });
        // Each request's responses, in order, as single messages.
        let responses = responses.flat_map(|answer| {
            let items: Vec<Result<proto::SessionResponse, tonic::Status>> = match answer {
                Ok(responses) => responses
                    .into_iter()
                    .map(|response| {
                        Ok(proto::SessionResponse {
                            response: Some(response),
                        })
                    })
                    .collect(),
                Err(status) => vec![Err(status)],
            };
            futures_util::stream::iter(items)
        });
        // End the response stream at the first error (CancelSession, a reset).
        let responses = responses.scan(false, |failed, item| {
            let next = if *failed { None } else { Some(item) };
            if matches!(next, Some(Err(_))) {
                *failed = true;
            }
            std::future::ready(next)
        });
        Ok(tonic::Response::new(Box::pin(responses)))
    }

    async fn watch_team(
        &self,
        _request: tonic::Request<proto::WatchTeamRequest>,
    ) -> Result<tonic::Response<Self::WatchTeamStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("echo"))
    }
}

/// A running echo server; it stops when this is dropped.
pub struct EchoServer {
    pub addr: SocketAddr,
    _stop: oneshot::Sender<()>,
}

/// Serves [`Echo`] with tonic's own server on an ephemeral loopback port.
pub async fn start_echo(echo: Echo) -> Result<EchoServer> {
    let incoming = tonic::transport::server::TcpIncoming::bind("127.0.0.1:0".parse()?)
        .map_err(|e| anyhow!("bind the echo server: {e}"))?
        .with_nodelay(Some(true));
    let addr = incoming.local_addr()?;
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AgentServiceServer::new(echo))
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = stopped.await;
            }),
    );
    Ok(EchoServer { addr, _stop: stop })
}

// ------------------------------------------------------------------ serial

/// A socat pty pair: rozd (or the floor's driver) opens `a`, the scripted
/// [`Device`] plays the hardware on `b`.
pub struct PtyPair {
    _child: tokio::process::Child,
    pub a: PathBuf,
    pub b: PathBuf,
}

impl PtyPair {
    pub async fn start(dir: &std::path::Path, name: &str) -> Result<PtyPair> {
        let (a, b) = (dir.join(format!("{name}-A")), dir.join(format!("{name}-B")));
        let mut child = tokio::process::Command::new("socat")
            .args(["-d", "-d"])
            .arg(format!("pty,raw,echo=0,link={}", a.display()))
            .arg(format!("pty,raw,echo=0,link={}", b.display()))
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("spawn socat (apt-get install socat)")?;
        let stderr = child.stderr.take().ok_or_else(|| anyhow!("socat stderr"))?;
        let mut lines = BufReader::new(stderr).lines();
        tokio::time::timeout(WAIT, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains("starting data transfer loop") {
                    return Ok(());
                }
            }
            Err(anyhow!("socat ended before it was ready"))
        })
        .await
        .context("socat ready")??;
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(PtyPair {
            _child: child,
            a,
            b,
        })
    }
}

/// The device end of a pty pair: every line it receives is timestamped and
/// reported; `reply` decides what it answers (nothing for `None`).
pub struct Device {
    pub lines: mpsc::UnboundedReceiver<(String, Instant)>,
}

impl Device {
    pub fn start(pty: &PtyPair, reply: fn(&str) -> Option<&'static str>) -> Result<Device> {
        use tokio_serial::SerialPortBuilderExt as _;
        let port = tokio_serial::new(pty.b.to_string_lossy(), 115_200)
            .open_native_async()
            .with_context(|| format!("open {}", pty.b.display()))?;
        let (read, mut write) = tokio::io::split(port);
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(read).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                let at = Instant::now();
                let answer = reply(&line);
                if tx.send((line, at)).is_err() {
                    return;
                }
                if let Some(answer) = answer
                    && write.write_all(answer.as_bytes()).await.is_err()
                {
                    return;
                }
            }
        });
        Ok(Device { lines })
    }

    /// The next line the device receives, with when it arrived.
    pub async fn line(&mut self) -> Result<(String, Instant)> {
        tokio::time::timeout(WAIT, self.lines.recv())
            .await
            .context("no line at the device in time")?
            .ok_or_else(|| anyhow!("the device end closed"))
    }

    /// Drops lines already received.
    pub fn drain(&mut self) {
        while self.lines.try_recv().is_ok() {}
    }
}

/// A readings sink that discards everything (the floor's serial port feeds no world).
pub struct Discard;

impl rozd::hw::Readings for Discard {
    fn record(&self, _sensor: &str, _value: f64) {}
    fn source_health(&self, _source: &str, _health: rozd::hw::Health) {}
    fn rejected(&self, _source: &str, _why: &str) {}
}

/// Waits until `rx` changes (a simulated actuator applied a value).
pub async fn changed(rx: &mut tokio::sync::watch::Receiver<u64>) -> Result<Instant> {
    tokio::time::timeout(WAIT, rx.changed())
        .await
        .context("the actuator did not change in time")?
        .context("the actuator is gone")?;
    Ok(Instant::now())
}

/// Polls `done` every millisecond until it holds (bounded by [`WAIT`]): for
/// the harness's own set-up between trials, never inside a measured interval.
pub async fn settle(what: &str, done: impl Fn() -> bool) -> Result<()> {
    let deadline = Instant::now() + WAIT;
    while !done() {
        if Instant::now() > deadline {
            bail!("{what} did not happen in time");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}
