//! Shared test harness: a real daemon on a free loopback port and real
//! clients talking to it over TCP.

pub mod broker;
pub mod control;
pub mod pty;
pub mod raw_mqtt;
pub mod wire;

use std::net::SocketAddr;
use std::time::Duration;

use rozd::api::proto;
use rozd::api::proto::agent_service_client::AgentServiceClient;
use rozd::config::{Config, ConfigSource};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

/// How long a test waits for a message it expects before failing: a bound on
/// a hang, not a synchronisation.
pub const EXPECT_WITHIN: Duration = Duration::from_secs(10);

pub struct TestDaemon {
    pub addr: SocketAddr,
    /// The local control socket (`control.sock` beside the store).
    pub control_socket: std::path::PathBuf,
    /// What the test may see of the daemon beyond its ports.
    pub host: rozd::testing::Probe,
    stop: Option<oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

/// A daemon to start: its configuration is text, validated as a file
/// is; nothing is changed after validation.
pub struct Setup {
    listen: String,
    /// Plain keys of `[server]`, written before `server_toml` (which may
    /// open sub-tables such as `[[server.tokens]]`).
    server_keys: String,
    server_toml: String,
    extra_toml: String,
    hooks: std::sync::Arc<dyn rozd::session::SessionHooks>,
}

impl Setup {
    /// Adds `toml` to the `[server]` table.
    pub fn server(mut self, toml: &str) -> Setup {
        self.server_toml.push_str(toml);
        self.server_toml.push('\n');
        self
    }

    /// For a test on tokio's paused clock: no HTTP/2 keepalive pings
    /// (`http2_keepalive_secs = 0`), whose timer would advance the clock.
    pub fn paused_clock(mut self) -> Setup {
        self.server_keys.push_str("http2_keepalive_secs = 0\n");
        self
    }

    /// Listening on `addr` (a port a daemon before it had) instead of an
    /// ephemeral port.
    pub fn listen(mut self, addr: SocketAddr) -> Setup {
        self.listen = addr.to_string();
        self
    }

    /// With the API token `token` (`server.auth_tokens`).
    pub fn token(mut self, token: &str) -> Setup {
        self.server_keys
            .push_str(&format!("auth_tokens = [{token:?}]\n"));
        self
    }

    /// With these session hooks.
    pub fn hooks(mut self, hooks: std::sync::Arc<dyn rozd::session::SessionHooks>) -> Setup {
        self.hooks = hooks;
        self
    }

    pub async fn start(self) -> TestDaemon {
        let dir = tempfile::tempdir().expect("tempdir");
        let text = format!(
            "[server]\nlisten = {:?}\n{}{}\n[store]\npath = {:?}\n{}",
            self.listen,
            self.server_keys,
            self.server_toml,
            dir.path().join("rozd.db").display().to_string(),
            self.extra_toml
        );
        let config = Config::parse(&text, ConfigSource::BuiltIn).expect("test config is valid");
        let daemon = rozd::daemon::Daemon::bind_with_hooks(config, self.hooks)
            .await
            .expect("bind");
        TestDaemon::serve(daemon, dir)
    }
}

impl TestDaemon {
    /// Starts a daemon from config text; `listen` is forced to an ephemeral
    /// loopback port and the store into a temporary directory.
    pub async fn start(extra_toml: &str) -> TestDaemon {
        Self::setup(extra_toml).start().await
    }

    /// A daemon of `extra_toml` with more said of it (see [`Setup`]).
    pub fn setup(extra_toml: &str) -> Setup {
        Setup {
            listen: "127.0.0.1:0".into(),
            server_keys: String::new(),
            server_toml: String::new(),
            extra_toml: extra_toml.to_string(),
            hooks: std::sync::Arc::new(rozd::session::LogHooks),
        }
    }

    pub async fn start_with(config: Config, dir: tempfile::TempDir) -> TestDaemon {
        let daemon = rozd::daemon::Daemon::bind(config).await.expect("bind");
        Self::serve(daemon, dir)
    }

    fn serve(daemon: rozd::daemon::Daemon, dir: tempfile::TempDir) -> TestDaemon {
        let addr = daemon.local_addr();
        let host = daemon.probe();
        // The default place (the tests do not run under systemd, so there is
        // no $RUNTIME_DIRECTORY): beside the store.
        let control_socket = host
            .config()
            .store
            .resolved_path()
            .with_file_name("control.sock");
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(daemon.serve(async move {
            let _ = stopped.await;
        }));
        TestDaemon {
            addr,
            control_socket,
            host,
            stop: Some(stop),
            served: Some(served),
            _dir: dir,
        }
    }

    /// Starts a daemon on the store file `store`, which the caller keeps, so
    /// a later daemon can open the same file; `listen` is an ephemeral
    /// loopback port.
    pub async fn start_with_store(store: &std::path::Path, extra_toml: &str) -> TestDaemon {
        let dir = tempfile::tempdir().expect("tempdir");
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n[store]\npath = {:?}\n{extra_toml}",
            store.display().to_string()
        );
        let config = Config::parse(&text, ConfigSource::BuiltIn).expect("test config is valid");
        Self::start_with(config, dir).await
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(self.url())
            .expect("url")
            .connect()
            .await
            .expect("connect")
    }

    pub async fn agent(&self) -> AgentServiceClient<Channel> {
        AgentServiceClient::new(self.channel().await)
    }

    /// Stops the daemon and waits for its graceful shutdown to finish.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(served) = self.served.take() {
            tokio::time::timeout(EXPECT_WITHIN, served)
                .await
                .expect("shutdown finishes")
                .expect("serve task");
        }
    }
}

/// One open StreamSession from the client side.
pub struct Session {
    pub tx: mpsc::Sender<proto::SessionRequest>,
    pub rx: tonic::Streaming<proto::SessionResponse>,
    /// Bound on waiting for one response. Tests on tokio's paused clock
    /// raise it above the timers they wait for, since the paused clock jumps
    /// straight to the earliest timer when everything is idle.
    pub wait_bound: Duration,
}

impl Session {
    pub async fn open(client: &mut AgentServiceClient<Channel>) -> Session {
        let (tx, rx) = mpsc::channel(64);
        let response = client
            .stream_session(ReceiverStream::new(rx))
            .await
            .expect("StreamSession accepted");
        Session {
            tx,
            rx: response.into_inner(),
            wait_bound: EXPECT_WITHIN,
        }
    }

    pub async fn send(&self, request: proto::session_request::Request) {
        self.tx
            .send(proto::SessionRequest {
                request: Some(request),
            })
            .await
            .expect("request stream open");
    }

    /// The next response, failing the test if none arrives in time.
    pub async fn next(&mut self) -> proto::session_response::Response {
        let message = tokio::time::timeout(self.wait_bound, self.rx.message())
            .await
            .expect("a response arrives in time")
            .expect("stream healthy")
            .expect("stream still open");
        message.response.expect("response has a body")
    }

    /// Skips keepalives, presence hints and activity updates.
    pub async fn next_significant(&mut self) -> proto::session_response::Response {
        use proto::session_response::Response as R;
        loop {
            match self.next().await {
                R::Keepalive(_) | R::PresenceHint(_) | R::ActivityUpdate(_) => continue,
                other => return other,
            }
        }
    }

    pub async fn start(&mut self, start: proto::StartSession) -> proto::SessionStarted {
        self.send(proto::session_request::Request::Start(start))
            .await;
        match self.next_significant().await {
            proto::session_response::Response::SessionStarted(s) => s,
            other => panic!("expected SessionStarted, got {other:?}"),
        }
    }

    /// Reads until an `ActivityUpdate` in `state` (e.g. the turn's model is
    /// `thinking`); a `SessionError` on the way fails the test.
    pub async fn until_activity(&mut self, state: &str) {
        use proto::session_response::Response as R;
        loop {
            match self.next().await {
                R::ActivityUpdate(u) if u.state == state => return,
                R::Error(e) => panic!("waiting for activity {state:?}: {e:?}"),
                _ => {}
            }
        }
    }

    /// Sends `CancelTurn`; the turn's responses up to its `TurnComplete`, and that.
    pub async fn cancel_turn(
        &mut self,
    ) -> (Vec<proto::session_response::Response>, proto::TurnComplete) {
        self.send(proto::session_request::Request::CancelTurn(
            proto::CancelTurn {
                reason: "test".into(),
            },
        ))
        .await;
        until_complete(self).await
    }

    /// Waits for the server to close the stream.
    pub async fn closed(&mut self) -> Result<(), tonic::Status> {
        loop {
            let next = tokio::time::timeout(EXPECT_WITHIN, self.rx.message())
                .await
                .expect("stream closes in time")?;
            if next.is_none() {
                return Ok(());
            }
        }
    }
}

pub fn expect_error(response: proto::session_response::Response) -> proto::SessionError {
    match response {
        proto::session_response::Response::Error(e) => e,
        other => panic!("expected SessionError, got {other:?}"),
    }
}

/// The `rozd` binary under test.
pub const ROZD: &str = env!("CARGO_BIN_EXE_rozd");

/// Runs the `rozd` binary without blocking the runtime a daemon runs on;
/// its exit code, stdout and stderr. The environment's `ROZD_*` settings are
/// removed so that only `args` count.
pub async fn rozd_cli(args: &[&str]) -> (Option<i32>, String, String) {
    let out = tokio::time::timeout(
        EXPECT_WITHIN * 4,
        tokio::process::Command::new(ROZD)
            .args(args)
            .env_remove("ROZD_ADDR")
            .env_remove("ROZD_TOKEN")
            .env_remove("ROZD_CONFIG")
            .stdin(std::process::Stdio::null())
            .output(),
    )
    .await
    .expect("rozd exits")
    .expect("run rozd");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `GET path` on `daemon` (no token): the status and the body as JSON.
pub async fn rest_get(daemon: &TestDaemon, path: &str) -> (u16, serde_json::Value) {
    let reply = rozd::cli::client::get(&daemon.addr.to_string(), path, None)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    (reply.status.as_u16(), rest_body(path, &reply.body))
}

/// `POST path` with a JSON body on `daemon` (no token): the status and the body as JSON.
pub async fn rest_post(
    daemon: &TestDaemon,
    path: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    let reply = rozd::cli::client::post_json(&daemon.addr.to_string(), path, None, body)
        .await
        .unwrap_or_else(|e| panic!("POST {path}: {e}"));
    (reply.status.as_u16(), rest_body(path, &reply.body))
}

fn rest_body(path: &str, body: &str) -> serde_json::Value {
    serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("{path}: body is not JSON ({e}): {body:?}"))
}

/// The responses of a turn up to its `TurnComplete`, and that.
pub async fn until_complete(
    session: &mut Session,
) -> (Vec<proto::session_response::Response>, proto::TurnComplete) {
    use proto::session_response::Response as Resp;
    let mut seen = Vec::new();
    loop {
        match session.next().await {
            Resp::TurnComplete(done) => return (seen, done),
            other => seen.push(other),
        }
    }
}

/// The text the model streamed in `seen`.
pub fn text_of(seen: &[proto::session_response::Response]) -> String {
    use proto::session_response::Response as Resp;
    seen.iter()
        .filter_map(|r| match r {
            Resp::TextDelta(d) => Some(d.content.as_str()),
            _ => None,
        })
        .collect()
}

/// Waits on the OODA loop's own publish signal until `pred` holds for an
/// Observation, at most `bound`; a failure names `what` and shows the last
/// Observation seen.
pub async fn observed(
    ooda: &rozd::ooda::Ooda,
    bound: Duration,
    what: &str,
    pred: impl Fn(&rozd::ooda::Observation) -> bool,
) -> std::sync::Arc<rozd::ooda::Observation> {
    let mut rx = ooda.subscribe();
    let mut last = None;
    let reached = tokio::time::timeout(bound, async {
        loop {
            let obs = rx.borrow_and_update().clone();
            if pred(&obs) {
                return obs;
            }
            last = Some(obs);
            rx.changed().await.expect("the OODA loop is alive");
        }
    })
    .await;
    match reached {
        Ok(obs) => obs,
        Err(_) => panic!("not reached within {bound:?}: {what}\nlast observation: {last:#?}"),
    }
}

/// `rozd run` as a child process (killed on drop), returned once it told
/// the notify socket READY=1.
pub async fn spawn_rozd(dir: &std::path::Path, config: &std::path::Path) -> tokio::process::Child {
    let socket_path = dir.join(format!("notify-{}.sock", uuid::Uuid::new_v4().simple()));
    let socket = tokio::net::UnixDatagram::bind(&socket_path).expect("notify socket");
    let child = tokio::process::Command::new(ROZD)
        .args(["run", "--config"])
        .arg(config)
        .env("NOTIFY_SOCKET", &socket_path)
        .env_remove("WATCHDOG_USEC")
        .env_remove("ROZD_CONFIG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn rozd");
    let mut buf = [0u8; 4096];
    tokio::time::timeout(EXPECT_WITHIN, async {
        loop {
            let n = socket.recv(&mut buf).await.expect("notify socket");
            if String::from_utf8_lossy(&buf[..n]).contains("READY=1") {
                return;
            }
        }
    })
    .await
    .expect("rozd says READY=1");
    let _ = std::fs::remove_file(&socket_path);
    child
}

/// A program of the tests' Python environment (`$ROZD_TEST_PYENV`, else
/// `target/pyenv`), which `scripts/test.sh` installs: `python`, `grpcurl`.
pub fn pyenv_tool(name: &str) -> std::path::PathBuf {
    let base = std::env::var_os("ROZD_TEST_PYENV")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/pyenv")
        });
    let tool = base.join("bin").join(name);
    assert!(
        tool.exists(),
        "{} is missing: run ./scripts/test.sh, which installs it",
        tool.display()
    );
    tool
}
