//! Crash consistency: the `rozd` binary runs sessions with PHYSICAL calls,
//! a task and protective stops, and is killed with SIGKILL at a random
//! moment, again and again. After every restart: the store passes SQLite's
//! `integrity_check`; every PHYSICAL result a client received has its audit
//! row; every session open at the kill is closed as `daemon_restart`; a task
//! running at the kill is `failed` (`interrupted`); a stop that was answered
//! is still latched; every actuator is at its safe value.
//!
//! The suite runs `ROZD_CRASH_KILLS` kills (default 10); `scripts/crash.sh`
//! runs the long version against the release binary. The random moments
//! come from `ROZD_CRASH_SEED` (printed, so a failure can be replayed).
//! Waiting a random time before the kill is the point of the harness, not
//! synchronisation: every check waits on answers.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use crate::common;
use rozd::api::proto;
use rozd::api::proto::session_request::Request as Req;
use rozd::api::proto::session_response::Response as Resp;

const CONFIG: &str = r#"
[host]
environment_id = "lab"

[gpio]
backend = "sim"

[[sensors]]
name = "distance"
source = "sim"
signal = "sine"
amplitude = 1.0
offset = 1.5
rate_hz = 50

[[actuators]]
name = "speed"
kind = "sim"
min = -1.0
max = 1.0
safe_value = 0.0

[[actuators]]
name = "brake"
kind = "sim"
allowed = [0, 1]
safe_value = 1

[[permissions]]
tool_pattern = "*"
policy = "allow"
"#;

/// What clients were told before the kill.
#[derive(Debug, Default)]
struct Told {
    /// Sessions whose StartSession was answered, and not closed by us.
    sessions: HashSet<String>,
    /// (session, tool) whose PHYSICAL result reached the client this round.
    results: Vec<(String, String)>,
    /// The stop was answered as latched (and not cleared since).
    stopped: bool,
    /// Tasks whose creation was answered.
    tasks: Vec<String>,
}

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

async fn get(addr: &str, path: &str) -> Value {
    let reply = rozd::cli::client::get(addr, path, None)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    assert_eq!(reply.status.as_u16(), 200, "GET {path}: {}", reply.body);
    serde_json::from_str(&reply.body).unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

async fn post(addr: &str, path: &str, body: Value) -> Option<(u16, String)> {
    rozd::cli::client::post_json(addr, path, None, &body)
        .await
        .ok()
        .map(|r| (r.status.as_u16(), r.body))
}

/// One client: sessions whose turns command `speed`, each result recorded
/// when it arrives, until the daemon dies under it.
async fn driver(addr: String, told: Arc<Mutex<Told>>, seed: u64) {
    let Ok(channel) = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("url")
        .connect()
        .await
    else {
        return;
    };
    let mut client = proto::agent_service_client::AgentServiceClient::new(channel);
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let Ok(response) = client
        .stream_session(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
    else {
        return;
    };
    let mut inbound = response.into_inner();
    let send = |r: Req| {
        let tx = tx.clone();
        async move {
            tx.send(proto::SessionRequest { request: Some(r) })
                .await
                .is_ok()
        }
    };
    if !send(Req::Start(proto::StartSession::default())).await {
        return;
    }
    let session_id = loop {
        match inbound.message().await {
            Ok(Some(proto::SessionResponse {
                response: Some(Resp::SessionStarted(s)),
            })) => break s.session_id,
            Ok(Some(_)) => {}
            _ => return,
        }
    };
    told.lock().unwrap().sessions.insert(session_id.clone());
    let mut rng = Rng(seed | 1);
    loop {
        let value = (rng.below(19) as f64 - 9.0) / 10.0;
        let text = format!("set speed {value}");
        if !send(Req::UserMessage(proto::UserMessage {
            content: text,
            ..Default::default()
        }))
        .await
        {
            return;
        }
        let mut streamed = String::new();
        loop {
            match inbound.message().await {
                Ok(Some(proto::SessionResponse {
                    response: Some(Resp::TextDelta(d)),
                })) => streamed.push_str(&d.content),
                Ok(Some(proto::SessionResponse {
                    response: Some(Resp::TurnComplete(_)),
                })) => break,
                Ok(Some(_)) => {}
                _ => return,
            }
            // The local model reports each result as it arrives.
            if streamed.contains("speed returned") {
                told.lock()
                    .unwrap()
                    .results
                    .push((session_id.clone(), "speed".into()));
                streamed.clear();
            }
        }
    }
}

fn config_file(dir: &Path, addr: &str) -> PathBuf {
    let path = dir.join("rozd.toml");
    std::fs::write(
        &path,
        format!(
            "{CONFIG}\n[server]\nlisten = \"{addr}\"\nhttp2_keepalive_secs = 0\n[store]\npath = {:?}\n",
            dir.join("rozd.db").display().to_string()
        ),
    )
    .unwrap();
    path
}

/// Everything the daemon promised before the kill, checked after the restart.
async fn check_after_restart(addr: &str, store: &Path, told: &Told, kill: usize) {
    let what = |s: &str| format!("after kill {kill}: {s}");
    {
        let db = rusqlite::Connection::open_with_flags(
            store,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .expect("open the store");
        let verdict: String = db
            .query_row("PRAGMA integrity_check", [], |row| row.get(0))
            .expect("integrity_check");
        assert_eq!(verdict, "ok", "{}", what("integrity_check"));
    }
    // The round's results, one query per session: each result its own row.
    let sessions: HashSet<&String> = told.results.iter().map(|(s, _)| s).collect();
    for session in sessions {
        let audit = get(addr, &format!("/v1/audit?session={session}&limit=500")).await;
        let rows = audit["data"].as_array().expect("audit rows");
        let audited = rows
            .iter()
            .filter(|r| r["kind"] == "tool_call" && r["tool"] == "speed")
            .count();
        let received = told.results.iter().filter(|(s, _)| s == session).count();
        assert!(
            audited >= received,
            "{}",
            what(&format!(
                "session {session}: {received} results received, {audited} audited"
            ))
        );
    }
    for session in &told.sessions {
        let s = get(addr, &format!("/v1/sessions/{session}")).await;
        assert_eq!(
            s["session"]["end_reason"],
            "daemon_restart",
            "{}",
            what(&format!("session {session}: {}", s["session"]))
        );
    }
    for task in &told.tasks {
        let t = get(addr, &format!("/v1/tasks/{task}")).await;
        // It waits a minute: the kill finds it running, unless the round's
        // stop failed it first (a stop may latch without its answer
        // reaching the client before the kill).
        let detail = t["detail"].as_str().unwrap_or_default();
        assert!(
            t["status"] == "failed" && (detail == "interrupted" || detail.starts_with("e_stop")),
            "{}",
            what(&format!("task {task}: {t}"))
        );
    }
    let safety = get(addr, "/v1/safety").await;
    if told.stopped {
        assert_eq!(
            safety["level"],
            "protective_stop",
            "{}",
            what(&format!("the answered stop was lost: {safety}"))
        );
    }
    let observation = get(addr, "/v1/observation").await;
    for actuator in observation["actuators"].as_array().expect("actuators") {
        assert_eq!(
            actuator["at_safe_value"],
            true,
            "{}",
            what(&format!("not safe after the restart: {actuator}"))
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_random_moments_loses_nothing() {
    let kills: usize = std::env::var("ROZD_CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let seed: u64 = std::env::var("ROZD_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    println!("crash harness: {kills} kills, ROZD_CRASH_SEED={seed}");
    let mut rng = Rng(seed | 1);
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", common::broker::free_port());
    let config = config_file(dir.path(), &addr);
    let store = dir.path().join("rozd.db");
    let mut told = Told::default();
    let (mut results, mut stops) = (0usize, 0usize);
    for kill in 0..=kills {
        let mut rozd = common::spawn_rozd(dir.path(), &config).await;
        if kill > 0 {
            check_after_restart(&addr, &store, &told, kill).await;
        }
        if kill == kills {
            rozd.kill().await.expect("kill");
            break;
        }
        if told.stopped {
            let (status, body) = post(&addr, "/v1/estop/clear", json!({}))
                .await
                .expect("clear answered");
            assert_eq!(status, 200, "clear: {body}");
        }
        let round = Arc::new(Mutex::new(Told::default()));
        let mut clients = Vec::new();
        for c in 0..2 {
            clients.push(tokio::spawn(driver(
                addr.clone(),
                round.clone(),
                seed ^ (kill as u64 * 31 + c),
            )));
        }
        if let Some((201, body)) =
            post(&addr, "/v1/tasks", json!({"prompt": "wait 60000; status"})).await
        {
            let task: Value = serde_json::from_str(&body).expect("task JSON");
            round
                .lock()
                .unwrap()
                .tasks
                .push(task["id"].as_str().expect("task id").to_string());
        }
        let stop_at = rng.below(2).eq(&0).then(|| rng.below(300));
        let kill_at = Duration::from_millis(20 + rng.below(400));
        let stopper = {
            let addr = addr.clone();
            let round = round.clone();
            tokio::spawn(async move {
                if let Some(ms) = stop_at {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    if let Some((200, _)) =
                        post(&addr, "/v1/estop", json!({"reason": "crash harness"})).await
                    {
                        round.lock().unwrap().stopped = true;
                    }
                }
            })
        };
        tokio::time::sleep(kill_at).await;
        rozd.start_kill().expect("SIGKILL");
        rozd.wait().await.expect("reaped");
        for client in clients {
            let _ = client.await;
        }
        let _ = stopper.await;
        let round = std::mem::take(&mut *round.lock().unwrap());
        results += round.results.len();
        stops += usize::from(round.stopped);
        told.stopped = round.stopped;
        told.sessions = round.sessions;
        told.results = round.results;
        told.tasks = round.tasks;
    }
    println!(
        "crash harness: {kills} kills survived; {results} PHYSICAL results audited, {stops} answered stops kept"
    );
}
