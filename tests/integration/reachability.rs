//! The protective stop stays reachable, and a browser page cannot drive the
//! daemon (issue 14, defects 4 and 6), over real sockets:
//!
//! - a flood of idle and half-sent connections beyond `server.max_connections`
//!   is shed (unauthenticated and idle first) and the stop still gets
//!   through over TCP and the local control socket;
//! - half-sent HTTP/1 heads and idle connections are closed after their
//!   timeouts, connections with a request in flight are not;
//! - the `rozd` binary under a low open-file limit: a flood that makes
//!   accept fail with EMFILE does not keep `rozd estop` (through the control
//!   socket) from latching the stop, and TCP recovers;
//! - cross-site requests (foreign `Origin`, foreign `Host` / `:authority`,
//!   non-JSON bodies) are refused with precise statuses; the stop trigger is not.

use crate::common;

use std::path::Path;

use common::control::{closed_by_server, raw_http, unix_request};
use common::{EXPECT_WITHIN, ROZD, Session, TestDaemon, rozd_cli};
use rozd::api::proto;
use rozd::api::proto::safety_service_client::SafetyServiceClient;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

const TOKEN: &str = "reach-test-token";

/// A robot with one held actuator.
const ROBOT: &str = r#"
[[actuators]]
name = "speed"
kind = "sim"
min = -1.0
max = 1.0
safe_value = 0.0
"#;

async fn daemon(server_toml: &str, token: bool) -> TestDaemon {
    let setup = TestDaemon::setup(ROBOT).server(server_toml);
    if token { setup.token(TOKEN) } else { setup }.start().await
}

/// One request on a kept-open HTTP/1.1 connection; reads exactly its answer.
async fn keep_alive_get(stream: &mut TcpStream, path: &str, token: Option<&str>) -> (u16, Value) {
    let auth = token.map_or_else(String::new, |t| format!("authorization: Bearer {t}\r\n"));
    let exchange = async {
        stream
            .write_all(format!("GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n{auth}\r\n").as_bytes())
            .await
            .expect("send");
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = stream.read(&mut buf).await.expect("read");
            assert!(
                n > 0,
                "closed mid-answer: {:?}",
                String::from_utf8_lossy(&seen)
            );
            seen.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&seen).into_owned();
            let Some((head, body)) = text.split_once("\r\n\r\n") else {
                continue;
            };
            let length: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap())
                })
                .expect("a content-length");
            if body.len() >= length {
                let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
                return (status, serde_json::from_str(&body[..length]).unwrap());
            }
        }
    };
    tokio::time::timeout(EXPECT_WITHIN, exchange)
        .await
        .expect("an answer in time")
}

fn latched(daemon: &TestDaemon) -> bool {
    daemon.host.ooda().protective_stop().active().is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_beyond_the_connection_cap_is_shed_and_the_stop_gets_through() {
    const CAP: usize = 32;
    const FLOOD: usize = 420;
    let daemon = daemon(
        &format!(
            "max_connections = {CAP}\nheader_read_timeout_secs = 600\nidle_timeout_secs = 3600"
        ),
        true,
    )
    .await;

    // A client that authenticated before the flood, on a kept-open connection.
    let mut client = TcpStream::connect(daemon.addr).await.unwrap();
    let (status, body) = keep_alive_get(&mut client, "/v1/status", Some(TOKEN)).await;
    assert_eq!(status, 200, "{body}");

    // The flood: silent connections, every sixth with half an HTTP/1 head.
    let (mut silent, mut half) = (Vec::new(), Vec::new());
    for i in 0..FLOOD {
        let mut stream = TcpStream::connect(daemon.addr).await.unwrap();
        if i.is_multiple_of(6) {
            stream
                .write_all(b"GET /v1/status HTTP/1.1\r\nhost: 127.0")
                .await
                .unwrap();
            half.push(stream);
        } else {
            silent.push(stream);
        }
    }
    // Silent connections wait in the lobby (MIN_LOBBY of them, the table
    // being smaller), those that began a request in the table (CAP, the
    // authenticated client among them): the server closes every other
    // flood connection (which ones depends on when each arrived).
    const LOBBY: usize = 256;
    let half_count = half.len();
    let silent_count = silent.len();
    assert_eq!(
        closed_by_server_count(silent, silent_count - LOBBY).await,
        silent_count - LOBBY
    );
    assert_eq!(
        closed_by_server_count(half, half_count - (CAP - 1)).await,
        half_count - (CAP - 1)
    );

    // The stop over TCP, while the flood holds the rest of the table.
    let addr = daemon.addr.to_string();
    let reply =
        rozd::cli::client::post_json(&addr, "/v1/estop", Some(TOKEN), &json!({"reason": "flood"}))
            .await
            .expect("POST /v1/estop answers");
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(latched(&daemon));
    assert_eq!(
        daemon.host.sim_actuator("speed").unwrap().value(),
        Some(0.0)
    );
    let health = rozd::cli::client::get(&addr, "/healthz", None)
        .await
        .unwrap();
    assert_eq!(health.status, 200, "{}", health.body);

    // The control socket, beside TCP and not subject to its cap.
    let (status, body) = unix_request(&daemon.control_socket, "GET", "/healthz", None).await;
    assert_eq!((status, &body["status"]), (200, &json!("ok")), "{body}");
    let (status, body) = unix_request(&daemon.control_socket, "GET", "/v1/safety", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["estop_active"], true, "{body}");
    assert_eq!(body["stop"]["reason"], "flood", "{body}");

    // The authenticated client was never shed.
    let (status, body) = keep_alive_get(&mut client, "/v1/safety", Some(TOKEN)).await;
    assert_eq!(
        (status, &body["estop_active"]),
        (200, &json!(true)),
        "{body}"
    );
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_heads_and_idle_connections_are_closed_busy_ones_are_not() {
    let daemon = daemon("header_read_timeout_secs = 1\nidle_timeout_secs = 2", false).await;

    // A session stream: a request in flight the whole time.
    let mut agent = daemon.agent().await;
    let mut session = Session::open(&mut agent).await;
    session.start(proto::StartSession::default()).await;

    // A gRPC client between calls: its connection idles out.
    let mut safety = SafetyServiceClient::new(daemon.channel().await);
    safety
        .get_safety_status(proto::GetSafetyStatusRequest::default())
        .await
        .expect("GetSafetyStatus");

    let mut half = TcpStream::connect(daemon.addr).await.unwrap();
    half.write_all(b"POST /v1/estop/clear HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-le")
        .await
        .unwrap();
    let mut silent = TcpStream::connect(daemon.addr).await.unwrap();
    let mut kept = TcpStream::connect(daemon.addr).await.unwrap();
    let (status, _) = keep_alive_get(&mut kept, "/healthz", None).await;
    assert_eq!(status, 200);

    closed_by_server(&mut half, EXPECT_WITHIN).await;
    closed_by_server(&mut silent, EXPECT_WITHIN).await;
    closed_by_server(&mut kept, EXPECT_WITHIN).await;
    // The control socket's connections idle out the same way.
    let mut silent_local = tokio::net::UnixStream::connect(&daemon.control_socket)
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(EXPECT_WITHIN, silent_local.read(&mut buf))
        .await
        .expect("the idle control-socket connection is closed in time");
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");

    // The gRPC client's idle connection was closed (opened before `silent`)
    // with a GOAWAY: the client reconnects for its next call.
    safety
        .get_safety_status(proto::GetSafetyStatusRequest::default())
        .await
        .expect("GetSafetyStatus after the idle close");

    // Past the idle timeout the session still answers: it was busy.
    session
        .send(proto::session_request::Request::Ping(proto::Ping {}))
        .await;
    match session.next_significant().await {
        proto::session_response::Response::Pong(_) => {}
        other => panic!("expected Pong, got {other:?}"),
    }
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_site_requests_are_refused_and_the_stop_trigger_is_not() {
    let daemon = daemon("", false).await;
    let addr = daemon.addr;
    let own = format!("127.0.0.1:{}", addr.port());
    let post = |path: &str, host: &str, extra: &str| {
        format!("POST {path} HTTP/1.1\r\nhost: {host}{extra}")
    };

    // Anyone may stop, a page on another site through DNS rebinding included.
    let (status, body) = raw_http(
        addr,
        &post(
            "/v1/estop",
            "evil.example",
            "\r\norigin: http://evil.example\r\ncontent-type: text/plain",
        ),
        r#"{"reason":"a web page"}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(latched(&daemon));

    // A body that is not JSON: 415, nothing changes.
    for path in ["/v1/estop/clear", "/v1/tasks"] {
        let (status, body) = raw_http(
            addr,
            &post(path, &own, "\r\ncontent-type: text/plain"),
            r#"{"prompt":"set speed 1","reason":"x"}"#,
        )
        .await;
        assert_eq!(status, 415, "{path}: {body}");
        assert_eq!(body["error"]["code"], "unsupported_media_type", "{body}");
    }
    // Another origin: 403.
    for path in ["/v1/estop/clear", "/v1/tasks"] {
        let (status, body) = raw_http(
            addr,
            &post(
                path,
                &own,
                "\r\ncontent-type: application/json\r\norigin: http://evil.example",
            ),
            r#"{"prompt":"set speed 1"}"#,
        )
        .await;
        assert_eq!(status, 403, "{path}: {body}");
        assert_eq!(body["error"]["code"], "cross_origin", "{body}");
    }
    // A Host that is not one of the daemon's names (DNS rebinding): 421, reads too.
    for head in [
        post(
            "/v1/estop/clear",
            &format!("evil.example:{}", addr.port()),
            "\r\ncontent-type: application/json",
        ),
        format!(
            "GET /v1/status HTTP/1.1\r\nhost: evil.example:{}",
            addr.port()
        ),
    ] {
        let (status, body) = raw_http(addr, &head, "").await;
        assert_eq!(status, 421, "{head}: {body}");
        assert_eq!(body["error"]["code"], "host_not_allowed", "{body}");
    }
    assert!(latched(&daemon), "nothing cleared the stop");
    let (status, body) = common::rest_get(&daemon, "/v1/tasks").await;
    assert_eq!(status, 200);
    assert_eq!(body["data"], json!([]), "no task was created: {body}");

    // Reads from another origin are answered (the browser keeps the answer
    // from the page: no CORS headers).
    let (status, body) = raw_http(
        addr,
        &format!("GET /v1/safety HTTP/1.1\r\nhost: {own}\r\norigin: http://evil.example"),
        "",
    )
    .await;
    assert_eq!(
        (status, &body["estop_active"]),
        (200, &json!(true)),
        "{body}"
    );

    // gRPC with a foreign :authority: PERMISSION_DENIED.
    let channel = tonic::transport::Endpoint::from_shared(daemon.url())
        .unwrap()
        .origin(
            format!("http://evil.example:{}", addr.port())
                .parse()
                .unwrap(),
        )
        .connect()
        .await
        .unwrap();
    let refused = SafetyServiceClient::new(channel)
        .get_safety_status(proto::GetSafetyStatusRequest::default())
        .await
        .expect_err("a foreign :authority is refused");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");

    // The daemon's own origin, with JSON: cleared.
    let (status, body) = raw_http(
        addr,
        &post(
            "/v1/estop/clear",
            &own,
            &format!("\r\ncontent-type: application/json\r\norigin: http://{own}"),
        ),
        r#"{"reason":"checked the cell"}"#,
    )
    .await;
    assert_eq!((status, &body["cleared"]), (200, &json!(true)), "{body}");
    assert!(!latched(&daemon));
    daemon.shutdown().await;
}

/// The `rozd` binary under `ulimit -n 128`, stopped (SIGKILL) when dropped.
struct LimitedRozd {
    _child: tokio::process::Child,
    addr: String,
    config: std::path::PathBuf,
    log: std::path::PathBuf,
    dir: tempfile::TempDir,
}

impl LimitedRozd {
    async fn start(open_files: u32) -> LimitedRozd {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("rozd.toml");
        std::fs::write(
            &config,
            format!(
                // Bare connections wait for their first bytes far longer
                // than the test: TCP comes back only by shedding them.
                "[server]\nlisten = \"127.0.0.1:0\"\nheader_read_timeout_secs = 300\n\
                 [store]\npath = {:?}\n",
                dir.path().join("rozd.db").display().to_string()
            ),
        )
        .unwrap();
        let notify_path = dir.path().join("notify.sock");
        let notify = tokio::net::UnixDatagram::bind(&notify_path).unwrap();
        let log = dir.path().join("rozd.log");
        let child = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ulimit -n {open_files} && exec \"$0\" run --config \"$1\""
            ))
            .arg(ROZD)
            .arg(&config)
            .env("NOTIFY_SOCKET", &notify_path)
            .env_remove("RUNTIME_DIRECTORY")
            .env_remove("ROZD_CONFIG")
            .env_remove("RUST_LOG")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .expect("sh runs rozd");
        let mut buf = [0u8; 1024];
        let addr = tokio::time::timeout(EXPECT_WITHIN, async {
            loop {
                let n = notify.recv(&mut buf).await.unwrap();
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                if let Some(addr) = text
                    .lines()
                    .find_map(|l| l.strip_prefix("STATUS=serving roz.v1 on "))
                {
                    return addr.to_string();
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("rozd reports READY=1: {}", read(&log)));
        LimitedRozd {
            _child: child,
            addr,
            config,
            log,
            dir,
        }
    }

    fn control_socket(&self) -> std::path::PathBuf {
        self.dir.path().join("control.sock")
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_file_descriptors_the_stop_still_latches_through_the_control_socket() {
    let rozd = LimitedRozd::start(128).await;
    let addr: std::net::SocketAddr = rozd.addr.parse().unwrap();

    // Connections until accept fails for want of descriptors, then more.
    let mut flood = Vec::new();
    let connect = async |flood: &mut Vec<TcpStream>| {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        if flood.len().is_multiple_of(3) {
            stream
                .write_all(b"GET /healthz HTTP/1.1\r\nhost: 1")
                .await
                .unwrap();
        }
        flood.push(stream);
    };
    while !read(&rozd.log).contains("Too many open files") {
        assert!(flood.len() < 1000, "no EMFILE: {}", read(&rozd.log));
        connect(&mut flood).await;
    }
    for _ in 0..60 {
        connect(&mut flood).await;
    }

    // `rozd estop` goes through the control socket.
    let config = rozd.config.display().to_string();
    let (code, stdout, stderr) = rozd_cli(&[
        "estop",
        "--config",
        &config,
        "--addr",
        &rozd.addr,
        "--reason",
        "descriptor flood",
    ])
    .await;
    assert_eq!(
        code,
        Some(0),
        "stdout: {stdout}\nstderr: {stderr}\nlog: {}",
        read(&rozd.log)
    );
    assert!(stdout.contains("protective stop: ACTIVE"), "{stdout}");

    let (status, body) = unix_request(&rozd.control_socket(), "GET", "/v1/safety", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["estop_active"], true, "{body}");
    assert_eq!(body["stop"]["source"], "control-socket", "{body}");
    assert_eq!(body["stop"]["reason"], "descriptor flood", "{body}");

    let (code, stdout, stderr) =
        rozd_cli(&["status", "--config", &config, "--addr", &rozd.addr]).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("ACTIVE (control-socket: descriptor flood)"),
        "{stdout}"
    );

    // TCP recovers: the flood is shed for newcomers.
    let health = tokio::time::timeout(
        EXPECT_WITHIN,
        rozd::cli::client::get(&rozd.addr, "/healthz", None),
    )
    .await
    .expect("/healthz over TCP answers in time")
    .expect("/healthz over TCP");
    assert_eq!(health.status, 200, "{}", health.body);
    let again = tokio::time::timeout(
        EXPECT_WITHIN,
        rozd::cli::client::post_json(
            &rozd.addr,
            "/v1/estop",
            None,
            &json!({"reason": "over TCP"}),
        ),
    )
    .await
    .expect("POST /v1/estop over TCP answers in time")
    .expect("POST /v1/estop over TCP");
    assert_eq!(again.status, 200, "{}", again.body);
    drop(flood);
}

/// Waits until the server has closed `want` of `streams` (each without
/// sending anything); fails after [`EXPECT_WITHIN`].
async fn closed_by_server_count(streams: Vec<TcpStream>, want: usize) -> usize {
    let mut closing = tokio::task::JoinSet::new();
    for mut stream in streams {
        closing.spawn(async move {
            let mut buf = [0u8; 64];
            let mut sent = Vec::new();
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return sent,
                    Ok(n) => sent.extend_from_slice(&buf[..n]),
                }
            }
        });
    }
    let mut closed = 0;
    tokio::time::timeout(EXPECT_WITHIN, async {
        while closed < want {
            let sent = closing.join_next().await.expect("streams left").unwrap();
            assert!(sent.is_empty(), "a flood connection got {sent:?}");
            closed += 1;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the server closed {closed} of the {want} it should have"));
    closing.abort_all();
    closed
}
