//! A stop request over the network is never lost (issue 32, items 1-3 and
//! 10), against the real `rozd` binary or the daemon in this process, over
//! real sockets:
//!
//! - 60 stops, each on a fresh connection, while 63 authenticated streams
//!   hold all but one place of `server.max_connections = 64` and four
//!   threads open bare connections as fast as they can: all 60 latch;
//! - a stop whose body stalls (a short `Content-Length`, a trickled chunked
//!   body, `Expect: 100-continue` never followed by the body) latches at
//!   once, seen from another connection while the body is still missing,
//!   for `POST /v1/estop` and `POST /v1/fleet/estop`; a body that arrives
//!   later (in time) gives the stop its reason;
//! - a fleet stop posted the way `curl -d` posts it (a form content type,
//!   with a bearer token) stops the fleet; the browser guard still refuses
//!   forms to other state-changing routes without a token;
//! - two `Host` headers are answered 400 (RFC 9112 §3.2).

use crate::common;

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::broker::{Broker, free_port};
use common::control::{raw_http, unix_request};
use common::{EXPECT_WITHIN, TestDaemon, spawn_rozd};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

const ADMIN: &str = "stopnet-admin-token";
const VIEWER: &str = "stopnet-viewer-token";

/// `rozd run` on a free loopback port with an admin token, a read token
/// (`viewer`) and one simulated actuator; `server` adds to `[server]`.
struct Binary {
    addr: std::net::SocketAddr,
    control_socket: std::path::PathBuf,
    _child: tokio::process::Child,
    _dir: tempfile::TempDir,
}

impl Binary {
    async fn start(server: &str) -> Binary {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let viewer = dir.path().join("viewer.token");
        std::fs::write(&viewer, format!("{VIEWER}\n")).unwrap();
        let config = dir.path().join("rozd.toml");
        std::fs::write(
            &config,
            format!(
                r#"
[host]
environment_id = "lab"

[server]
listen = "127.0.0.1:{port}"
auth_tokens = ["{ADMIN}"]
{server}

[[server.tokens]]
name = "viewer"
token_file = {viewer:?}
scopes = ["read"]

[store]
path = {store:?}

[[actuators]]
name = "speed"
kind = "sim"
min = -1.0
max = 1.0
safe_value = 0.0
"#,
                viewer = viewer.display().to_string(),
                store = dir.path().join("rozd.db").display().to_string(),
            ),
        )
        .unwrap();
        let child = spawn_rozd(dir.path(), &config).await;
        Binary {
            addr: format!("127.0.0.1:{port}").parse().unwrap(),
            control_socket: dir.path().join("control.sock"),
            _child: child,
            _dir: dir,
        }
    }

    /// `GET /v1/safety` through the control socket (never subject to the
    /// TCP table).
    async fn safety(&self) -> Value {
        let (status, body) = unix_request(&self.control_socket, "GET", "/v1/safety", None).await;
        assert_eq!(status, 200, "{body}");
        body
    }

    /// The operator's clear, through the control socket.
    async fn clear(&self) {
        let (status, body) = unix_request(
            &self.control_socket,
            "POST",
            "/v1/estop/clear",
            Some(&json!({"reason": "next round"})),
        )
        .await;
        assert_eq!((status, &body["cleared"]), (200, &json!(true)), "{body}");
    }
}

/// The answer to a request already sent on `stream`: its final status and
/// JSON body (interim `100 Continue` answers skipped), read up to its
/// `content-length`; `None` when the connection closed or was reset first.
async fn answer(stream: &mut TcpStream) -> Option<(u16, Value)> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(done) = parse_answer(&seen) {
            return Some(done);
        }
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
}

/// A complete final answer in `seen`, if there is one yet.
fn parse_answer(seen: &[u8]) -> Option<(u16, Value)> {
    let text = String::from_utf8_lossy(seen);
    let mut rest: &str = &text;
    loop {
        let (head, body) = rest.split_once("\r\n\r\n")?;
        let status: u16 = head.split_whitespace().nth(1)?.parse().ok()?;
        if status == 100 {
            rest = body;
            continue;
        }
        let length: usize = head.lines().find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .and_then(|v| v.trim().parse().ok())
        })?;
        let body = body.as_bytes().get(..length)?;
        return Some((status, serde_json::from_slice(body).unwrap_or(Value::Null)));
    }
}

// ------------------------------------------------------- churn at the cap

/// One authenticated observation stream, its response head read; then
/// drained by a task of its own until the test ends.
async fn hold_stream(addr: std::net::SocketAddr) -> tokio::task::JoinHandle<()> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            format!(
                "GET /v1/observation/stream HTTP/1.1\r\nhost: 127.0.0.1\r\n\
                 authorization: Bearer {VIEWER}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(EXPECT_WITHIN, async {
        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "stream closed: {:?}", String::from_utf8_lossy(&seen));
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("the stream's head in time");
    assert!(
        seen.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&seen)
    );
    tokio::spawn(async move { while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {} })
}

/// Four threads that open bare connections (never sending a byte) as fast
/// as they can, each holding its 32 newest, until `stop` or their bounds.
fn churn(
    addr: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicU64>,
) -> Vec<std::thread::JoinHandle<()>> {
    const HELD: usize = 32;
    const MOST: u64 = 500_000;
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    (0..4)
        .map(|_| {
            let (stop, opened) = (stop.clone(), opened.clone());
            std::thread::spawn(move || {
                let mut held = VecDeque::with_capacity(HELD);
                let mut mine = 0u64;
                while !stop.load(Ordering::Relaxed)
                    && mine < MOST
                    && std::time::Instant::now() < deadline
                {
                    if let Ok(s) =
                        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1))
                    {
                        if held.len() == HELD {
                            held.pop_front();
                        }
                        held.push_back(s);
                        mine += 1;
                        opened.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_stops_on_fresh_connections_all_latch_while_bare_connections_churn_at_the_cap() {
    const CAP: usize = 64;
    const STOPS: usize = 60;
    let rozd = Binary::start(&format!("max_connections = {CAP}")).await;
    let mut streams = Vec::new();
    for _ in 0..CAP - 1 {
        streams.push(hold_stream(rozd.addr).await);
    }

    let stop_churn = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicU64::new(0));
    let threads = churn(rozd.addr, stop_churn.clone(), opened.clone());
    // The churn is under way before the first stop.
    tokio::time::timeout(EXPECT_WITHIN, async {
        while opened.load(Ordering::Relaxed) < 1000 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the churn opens connections");

    let mut lost = Vec::new();
    for i in 0..STOPS {
        let reason = format!("churn stop {i}");
        let body = json!({ "reason": reason }).to_string();
        let exchange = async {
            let mut stream = TcpStream::connect(rozd.addr).await.ok()?;
            let request = format!(
                "POST /v1/estop HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {VIEWER}\r\n\
                 content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            stream.write_all(request.as_bytes()).await.ok()?;
            answer(&mut stream).await
        };
        let answered = tokio::time::timeout(EXPECT_WITHIN, exchange)
            .await
            .ok()
            .flatten();
        match answered {
            Some((200, body))
                if body["triggered"] == true && body["stop"]["reason"] == reason.as_str() => {}
            other => {
                lost.push(format!("stop {i}: {other:?}"));
                if rozd.safety().await["estop_active"] != true {
                    continue;
                }
            }
        }
        let safety = rozd.safety().await;
        assert_eq!(safety["estop_active"], true, "stop {i}: {safety}");
        rozd.clear().await;
    }
    stop_churn.store(true, Ordering::Relaxed);
    let churned = opened.load(Ordering::Relaxed);
    for thread in threads {
        thread.join().unwrap();
    }
    assert!(
        lost.is_empty(),
        "{} of {STOPS} stops were not latched ({churned} bare connections churned): {lost:#?}",
        lost.len()
    );
    // The streams were never shed.
    for stream in &streams {
        assert!(!stream.is_finished(), "an authenticated stream was closed");
    }
    for stream in streams {
        stream.abort();
    }
}

// ---------------------------------------------------- stalled stop bodies

/// Polls `GET /v1/safety` (control socket) until the stop is latched;
/// fails after [`EXPECT_WITHIN`].
async fn until_latched(rozd: &Binary, what: &str) -> Value {
    tokio::time::timeout(EXPECT_WITHIN, async {
        loop {
            let safety = rozd.safety().await;
            if safety["estop_active"] == true {
                return safety;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: not latched while its body stalls"))
}

/// Opens a connection and sends `head` plus the first part of a body.
async fn stalled(addr: std::net::SocketAddr, head: &str, first: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(format!("{head}\r\n\r\n{first}").as_bytes())
        .await
        .unwrap();
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_whose_body_stalls_latches_at_once_and_a_late_body_gives_its_reason() {
    let rozd = Binary::start("").await;
    for path in ["/v1/estop", "/v1/fleet/estop"] {
        let post = format!(
            "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {VIEWER}\r\n\
             content-type: application/json"
        );

        // Content-Length 1000, ten bytes sent: latched while 990 are
        // missing; the rest, sent now, names the reason.
        let reason = format!("late body on {path}");
        let whole = json!({ "reason": reason, "pad": "" }).to_string();
        let whole = whole.replace(
            r#""pad":"""#,
            &format!(r#""pad":"{}""#, "x".repeat(1000 - whole.len())),
        );
        assert_eq!(whole.len(), 1000);
        let mut stream = stalled(
            rozd.addr,
            &format!("{post}\r\ncontent-length: 1000"),
            &whole[..10],
        )
        .await;
        let safety =
            until_latched(&rozd, &format!("{path}, Content-Length 1000 with 10 sent")).await;
        assert!(safety["stop"]["reason"] != reason.as_str(), "{safety}");
        stream.write_all(&whole.as_bytes()[10..]).await.unwrap();
        let (status, body) = tokio::time::timeout(EXPECT_WITHIN, answer(&mut stream))
            .await
            .expect("an answer")
            .expect("an answer, not a reset");
        let safety = rozd.safety().await;
        let stopped_with = safety["stop"]["reason"].as_str().unwrap_or_default();
        assert!(stopped_with.contains(&reason), "{safety}");
        if path == "/v1/estop" {
            assert_eq!(
                (status, &body["stop"]["reason"]),
                (200, &json!(reason)),
                "{body}"
            );
            assert_eq!(body["triggered"], true, "{body}");
        } else {
            // No fleet configured: this host stopped, nobody else told.
            assert_eq!(status, 409, "{body}");
            assert!(
                body["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("this host was stopped")),
                "{body}"
            );
        }
        rozd.clear().await;

        // A chunked body trickled: one chunk of five bytes, then nothing;
        // the client goes away and the stop stays.
        let stream = stalled(
            rozd.addr,
            &format!("{post}\r\ntransfer-encoding: chunked"),
            "5\r\n{\"rea\r\n",
        )
        .await;
        let safety = until_latched(&rozd, &format!("{path}, trickled chunked body")).await;
        drop(stream);
        assert_eq!(rozd.safety().await["stop"], safety["stop"]);
        rozd.clear().await;

        // Expect: 100-continue, and the body never follows: latched, and
        // answered (without a reason of its own) once the wait for the
        // body is over.
        let mut stream = stalled(
            rozd.addr,
            &format!("{post}\r\ncontent-length: 20\r\nexpect: 100-continue"),
            "",
        )
        .await;
        until_latched(&rozd, &format!("{path}, Expect: 100-continue")).await;
        let (status, body) = tokio::time::timeout(EXPECT_WITHIN, answer(&mut stream))
            .await
            .expect("an answer once the wait for the body is over")
            .expect("an answer, not a reset");
        if path == "/v1/estop" {
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["estop_active"], true, "{body}");
            assert!(
                body["body_error"]
                    .as_str()
                    .is_some_and(|e| e.contains("did not arrive")),
                "{body}"
            );
        } else {
            assert_eq!(status, 409, "{body}");
        }
        assert_eq!(rozd.safety().await["estop_active"], true);
        rozd.clear().await;
    }
}

// ----------------------------------------------- the fleet stop, curl -d

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_stop_posted_as_curl_posts_it_stops_and_forms_elsewhere_are_still_refused() {
    const FLEET_TOKEN: &str = "stopnet-fleet-token";
    let broker_dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(broker_dir.path()).await;
    let token = broker_dir.path().join("fleet.token");
    std::fs::write(&token, format!("{FLEET_TOKEN}\n")).unwrap();
    let daemon = TestDaemon::setup(
        &format!(
            "[host]\nenvironment_id = \"lab\"\n\
             [fleet]\nurl = \"mqtt://127.0.0.1:{}\"\ntoken_file = {:?}\n\
             [[actuators]]\nname = \"speed\"\nkind = \"sim\"\nmin = -1.0\nmax = 1.0\nsafe_value = 0.0\n",
            broker.port,
            token.display().to_string()
        ),
    )
    .token(ADMIN)
    .start()
    .await;
    let mut changes = daemon.host.fleet().changes();
    tokio::time::timeout(EXPECT_WITHIN, async {
        while !daemon.host.fleet().is_connected() {
            changes.changed().await.expect("fleet alive");
        }
    })
    .await
    .expect("the fleet link connects");

    let curl = |path: &str, extra: &[&str]| {
        let url = format!("http://{}{path}", daemon.addr);
        let mut args: Vec<String> = ["-sS", "-o", "-", "-w", "\n%{http_code}"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        args.push(url);
        async move {
            let out = tokio::time::timeout(
                EXPECT_WITHIN,
                tokio::process::Command::new("curl").args(&args).output(),
            )
            .await
            .expect("curl finishes")
            .expect("run curl");
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
            (
                code.trim().parse::<u16>().unwrap_or(0),
                serde_json::from_str::<Value>(body).unwrap_or(Value::Null),
            )
        }
    };
    let bearer = format!("authorization: Bearer {ADMIN}");
    let (status, body) = curl(
        "/v1/fleet/estop",
        &["-H", &bearer, "-X", "POST", "-d", r#"{"reason":"x"}"#],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (&body["stop"], &body["reason"]),
        (&json!(true), &json!("x")),
        "{body}"
    );
    let latched = daemon.host.ooda().protective_stop().state();
    assert_eq!(latched.causes.len(), 1, "{latched:?}");
    assert_eq!(latched.causes[0].source, "fleet");
    assert!(latched.causes[0].reason.ends_with(": x"), "{latched:?}");

    // The same form to a route that changes state but does not stop, from
    // a browser (no token): still refused for its content type and origin.
    let own = format!("127.0.0.1:{}", daemon.addr.port());
    let (status, body) = raw_http(
        daemon.addr,
        &format!(
            "POST /v1/estop/clear HTTP/1.1\r\nhost: {own}\r\n\
             content-type: application/x-www-form-urlencoded"
        ),
        r#"{"reason":"y"}"#,
    )
    .await;
    assert_eq!(status, 415, "{body}");
    let (status, body) = raw_http(
        daemon.addr,
        &format!(
            "POST /v1/estop/clear HTTP/1.1\r\nhost: {own}\r\norigin: http://evil.example\r\n\
             content-type: application/json"
        ),
        r#"{"reason":"y"}"#,
    )
    .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (403, &json!("cross_origin")),
        "{body}"
    );
    assert!(daemon.host.ooda().protective_stop().state().is_active());
    // With a valid bearer token the request cannot be a browser's forgery:
    // curl's form is accepted there too.
    let (status, body) = curl(
        "/v1/fleet/estop/clear",
        &[
            "-H",
            &bearer,
            "-X",
            "POST",
            "-d",
            r#"{"reason":"drill over"}"#,
        ],
    )
    .await;
    assert_eq!((status, &body["stop"]), (200, &json!(false)), "{body}");
    assert!(
        !daemon.host.ooda().protective_stop().state().is_active(),
        "{:?}",
        daemon.host.ooda().protective_stop().state()
    );
    // An invalid token earns nothing: the guard refuses as before.
    let (status, body) = curl(
        "/v1/estop/clear",
        &[
            "-H",
            "authorization: Bearer not-a-token",
            "-X",
            "POST",
            "-d",
            r#"{"reason":"y"}"#,
        ],
    )
    .await;
    assert_eq!(status, 415, "{body}");
    daemon.shutdown().await;
}

// --------------------------------------------------------- two Host headers

#[tokio::test]
async fn two_host_headers_are_a_bad_request_and_a_stop_still_latches() {
    let daemon = TestDaemon::start("").await;
    for head in [
        "GET /v1/status HTTP/1.1\r\nhost: 127.0.0.1\r\nhost: 127.0.0.1",
        "POST /v1/tasks HTTP/1.1\r\nhost: 127.0.0.1\r\nhost: evil.example\r\ncontent-type: application/json",
    ] {
        let (status, body) = raw_http(daemon.addr, head, "").await;
        assert_eq!(status, 400, "{head}: {body}");
        assert_eq!(body["error"]["code"], "invalid_argument", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("Host")),
            "{body}"
        );
    }
    // One Host: answered as always.
    let (status, body) = raw_http(
        daemon.addr,
        "GET /v1/status HTTP/1.1\r\nhost: 127.0.0.1",
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // A stop never looks at Host: it latches whatever the headers say.
    let (status, body) = raw_http(
        daemon.addr,
        "POST /v1/estop HTTP/1.1\r\nhost: 127.0.0.1\r\nhost: 127.0.0.2\r\ncontent-type: application/json",
        r#"{"reason":"two hosts"}"#,
    )
    .await;
    assert_eq!((status, &body["triggered"]), (200, &json!(true)), "{body}");
    assert!(daemon.host.ooda().protective_stop().state().is_active());
    daemon.shutdown().await;
}
