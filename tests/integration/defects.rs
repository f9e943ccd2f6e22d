//! Smaller defects of issue 16, each against the real daemon or store: a
//! bad message on `StreamSession` ends the stream with a failing gRPC
//! status; every REST error is the documented JSON body; the store is
//! private to its owner; the store is pruned by its retention policy (never
//! an audit row younger than it) and vacuumed; no ANSI colour codes in logs
//! that do not go to a terminal.

use crate::common;

use std::io::BufRead as _;
use std::os::unix::fs::PermissionsExt as _;
use std::process::{Command, Stdio};

use common::{EXPECT_WITHIN, ROZD, TestDaemon};
use rozd::config::{Config, ConfigSource};
use rozd::store::{AuditRecord, SessionRecord, Store, TurnRecord};

// ------------------------------------------------------------ gRPC status

/// Sends `frame` (a raw gRPC message frame) on a `StreamSession` over a
/// plain HTTP/2 client and returns the stream's final `grpc-status`.
async fn stream_session_status(daemon: &TestDaemon, frame: Vec<u8>) -> (String, String) {
    let tcp = tokio::net::TcpStream::connect(daemon.addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let request = http::Request::post(format!(
        "http://{}/roz.v1.AgentService/StreamSession",
        daemon.addr
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .unwrap();
    let (response, mut send) = client.send_request(request, false).unwrap();
    // The request stays open: the server must end it, not wait for us.
    send.send_data(bytes::Bytes::from(frame), false).unwrap();
    let outcome = tokio::time::timeout(EXPECT_WITHIN, async move {
        let response = response.await.expect("response headers");
        let header = |map: &http::HeaderMap, name: &str| {
            map.get(name)
                .map(|v| v.to_str().unwrap_or_default().to_string())
        };
        if let Some(status) = header(response.headers(), "grpc-status") {
            let message = header(response.headers(), "grpc-message").unwrap_or_default();
            return (status, message);
        }
        let mut body = response.into_body();
        while let Some(chunk) = body.data().await {
            let _ = chunk;
        }
        let trailers = body
            .trailers()
            .await
            .expect("trailers")
            .expect("the stream ends with trailers");
        (
            header(&trailers, "grpc-status").expect("grpc-status"),
            header(&trailers, "grpc-message").unwrap_or_default(),
        )
    })
    .await
    .expect("the server ends the stream");
    drop(send);
    outcome
}

#[tokio::test]
async fn an_invalid_or_oversized_message_fails_the_session_stream() {
    let daemon = TestDaemon::start("").await;
    // A length-prefixed frame whose 3 bytes are no protobuf (an unfinished varint).
    let (status, message) =
        stream_session_status(&daemon, vec![0, 0, 0, 0, 3, 0xff, 0xff, 0xff]).await;
    assert_eq!(status, "3", "INVALID_ARGUMENT: {message}");
    // A frame announcing 64 MiB: over the decoding limit before any byte of it.
    let (status, message) = stream_session_status(&daemon, vec![0, 0x04, 0, 0, 0, 1, 2, 3]).await;
    assert_eq!(status, "8", "RESOURCE_EXHAUSTED: {message}");
    let (code, body) = common::rest_get(&daemon, "/healthz").await;
    assert_eq!(code, 200, "{body}");
    daemon.shutdown().await;
}

// ------------------------------------------------------------ REST errors

fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    // HTTP/2: an answer before the whole body was read (413) arrives intact.
    reqwest::Client::builder()
        .http2_prior_knowledge()
        .timeout(EXPECT_WITHIN)
        .build()
        .unwrap()
}

async fn json_error(reply: reqwest::Response) -> (u16, serde_json::Value) {
    let status = reply.status().as_u16();
    let content_type = reply
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let text = reply.text().await.unwrap();
    assert!(
        content_type.starts_with("application/json"),
        "{status} answered as {content_type:?}: {text:?}"
    );
    let body: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(
        body["error"]["code"].is_string() && body["error"]["message"].is_string(),
        "{body}"
    );
    (status, body)
}

#[tokio::test]
async fn oversized_and_undecodable_requests_get_the_json_error_body() {
    let daemon = TestDaemon::start("").await;
    let client = http();
    let big = format!("{{\"prompt\": \"{}\"}}", "x".repeat(3 * 1024 * 1024));
    let reply = client
        .post(format!("{}/v1/tasks", daemon.url()))
        .header("content-type", "application/json")
        .body(big)
        .send()
        .await
        .unwrap();
    let (status, body) = json_error(reply).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["code"], "payload_too_large", "{body}");

    for path in ["/v1/hosts/%FF", "/v1/tasks/%FF", "/v1/sensors/%FF"] {
        let reply = client
            .get(format!("{}{path}", daemon.url()))
            .send()
            .await
            .unwrap();
        let (status, body) = json_error(reply).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert_eq!(body["error"]["code"], "invalid_argument", "{path}: {body}");
    }
    let (code, body) = common::rest_get(&daemon, "/healthz").await;
    assert_eq!(code, 200, "{body}");
    daemon.shutdown().await;
}

// ------------------------------------------------------------ the store

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn the_store_is_private_whatever_the_umask() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state/rozd/rozd.db");
    let store = Store::open(&path, Default::default()).expect("open");
    store.session_started(session("s", 0, None)).await.unwrap();
    assert_eq!(mode(path.parent().unwrap()), 0o700, "the store's directory");
    assert_eq!(mode(&path), 0o600, "the database");
    for suffix in ["-wal", "-shm"] {
        let side = path.with_file_name(format!("rozd.db{suffix}"));
        if side.exists() {
            assert_eq!(mode(&side) & 0o077, 0, "{}", side.display());
        }
    }
    // An existing database that others could read is made private.
    drop(store);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let _store = Store::open(&path, Default::default()).expect("reopen");
    assert_eq!(mode(&path), 0o600);
}

const DAY_MS: i64 = 86_400_000;

fn session(id: &str, started_at_ms: i64, ended_at_ms: Option<i64>) -> SessionRecord {
    SessionRecord {
        id: id.into(),
        host_id: "h".into(),
        environment_id: "e".into(),
        model: "local".into(),
        started_at_ms,
        ended_at_ms,
        end_reason: ended_at_ms.map(|_| "disconnect".into()),
        turns: 0,
        briefing_version: None,
    }
}

fn turn(session_id: &str, at_ms: i64, size: usize) -> TurnRecord {
    TurnRecord {
        session_id: session_id.into(),
        seq: 0,
        message_id: format!("m-{session_id}"),
        ai_mode: "react".into(),
        user_content: "u".repeat(size),
        messages: serde_json::json!([]),
        stop_reason: "end_turn".into(),
        input_tokens: 0,
        output_tokens: 0,
        cache_read_tokens: 0,
        cache_creation_tokens: 0,
        started_at_ms: at_ms,
        ended_at_ms: at_ms,
    }
}

fn audit(at_ms: i64, session_id: &str) -> AuditRecord {
    AuditRecord {
        at_ms,
        kind: rozd::store::AuditKind::Actuator,
        session_id: Some(session_id.into()),
        actuator: Some("speed".into()),
        result: Some("0".into()),
        origin: Some("test".into()),
        ..Default::default()
    }
}

async fn daemon_on(store: &std::path::Path, store_toml: &str) -> TestDaemon {
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[store]\npath = {:?}\n{store_toml}\n",
        store.display().to_string()
    );
    let config = Config::parse(&text, ConfigSource::BuiltIn).expect("valid");
    TestDaemon::start_with(config, tempfile::tempdir().unwrap()).await
}

#[tokio::test]
async fn the_store_forgets_what_is_older_than_retain_days_but_keeps_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rozd.db");
    let now = rozd::clock::now_ms();
    {
        let store = Store::open(&path, Default::default()).unwrap();
        for (id, age_days) in [("old", 40), ("young", 5)] {
            let at = now - age_days * DAY_MS;
            store
                .session_started(session(id, at, Some(at + 1000)))
                .await
                .unwrap();
            store.turn_completed(turn(id, at, 10)).await.unwrap();
            store.audit(audit(at, id)).await.unwrap();
        }
    }
    let daemon = daemon_on(&path, "retain_days = 30").await;
    let ids: Vec<String> = daemon
        .host
        .store()
        .sessions(50, 0)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(ids, ["young"]);
    let audited: Vec<Option<String>> = daemon
        .host
        .store()
        .audit_records(None, None, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.session_id)
        .collect();
    assert_eq!(audited, [Some("young".to_string())]);
    daemon.shutdown().await;
}

#[tokio::test]
async fn the_size_cap_drops_the_oldest_sessions_never_a_young_audit_row_and_vacuums() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rozd.db");
    let now = rozd::clock::now_ms();
    {
        let store = Store::open(&path, Default::default()).unwrap();
        for i in 0..200i64 {
            let id = format!("s{i:03}");
            let at = now - DAY_MS + i * 1000;
            store
                .session_started(session(&id, at, Some(at + 500)))
                .await
                .unwrap();
            store.turn_completed(turn(&id, at, 20_000)).await.unwrap();
            store.audit(audit(at, &id)).await.unwrap();
        }
    }
    let before = std::fs::metadata(&path).unwrap().len()
        + std::fs::metadata(path.with_file_name("rozd.db-wal"))
            .map(|m| m.len())
            .unwrap_or(0);
    assert!(before > 3 * 1024 * 1024, "{before}");
    let daemon = daemon_on(&path, "retain_days = 30\nmax_size_mb = 1").await;
    let store = &daemon.host.store();
    let kept = store.sessions(500, 0).await.unwrap();
    assert!(!kept.is_empty() && kept.len() < 200, "{}", kept.len());
    // Newest first: the newest are the ones kept.
    assert_eq!(kept[0].id, "s199");
    let oldest_kept: usize = kept.last().unwrap().id[1..].parse().unwrap();
    assert_eq!(oldest_kept, 200 - kept.len());
    assert_eq!(
        store.audit_records(None, None, 5000).await.unwrap().len(),
        200,
        "no audit row younger than retain_days is deleted"
    );
    let after = std::fs::metadata(&path).unwrap().len();
    assert!(
        after <= 1024 * 1024,
        "vacuumed to under the cap: {after} bytes"
    );
    daemon.shutdown().await;
}

#[test]
fn the_store_keys_are_validated_naming_the_key() {
    for (text, key) in [
        ("[store]\nretain_days = -1\n", "store.retain_days"),
        ("[store]\nmax_size_mb = -1\n", "store.max_size_mb"),
    ] {
        let err = Config::parse(text, ConfigSource::BuiltIn)
            .expect_err(text)
            .to_string();
        assert!(err.contains(&format!("`{key}`")), "{key}: {err}");
    }
}

// ------------------------------------------------------------ logs

#[test]
fn logs_to_a_pipe_carry_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rozd.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\ncontrol_socket = \"\"\n[store]\npath = {:?}\n",
            dir.path().join("rozd.db").display().to_string()
        ),
    )
    .unwrap();
    let mut child = Command::new(ROZD)
        .args(["run", "--config"])
        .arg(&config)
        .env_remove("JOURNAL_STREAM")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .env("HOME", dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut seen = Vec::new();
    for line in stderr.lines() {
        let line = line.unwrap();
        let serving = line.contains("serving gRPC and REST");
        seen.push(line);
        if serving {
            break;
        }
    }
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let _ = child.wait();
    assert!(
        seen.iter().any(|l| l.contains("serving gRPC and REST")),
        "{seen:?}"
    );
    assert!(
        seen.iter().all(|l| !l.contains('\u{1b}')),
        "ANSI escape codes in piped logs: {seen:?}"
    );
}
