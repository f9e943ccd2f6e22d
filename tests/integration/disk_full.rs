//! A store that cannot write (issue 21): the `rozd` binary with
//! `store.hard_cap_mb = 1` is filled by turns until its writes fail. Then a
//! PHYSICAL call is refused with `host_unavailable` and the actuator does not
//! move (its audit row is written before the command, or nothing is sent);
//! the protective stop latches, drives the actuator safe and persists its
//! stop file; `/v1/observation`, `/v1/status` and `/v1/safety` answer, and
//! `/v1/status` shows the store failing. Raising the cap and sending SIGHUP
//! gives the store room: the next PHYSICAL call runs and is audited.

use serde_json::{Value, json};

use crate::common::{self, Session, expect_error};
use rozd::api::proto;
use rozd::api::proto::session_request::Request as Req;
use rozd::api::proto::session_response::Response as Resp;

const CONFIG: &str = r#"
[host]
environment_id = "lab"

[gpio]
backend = "sim"

[[actuators]]
name = "speed"
kind = "sim"
min = -1.0
max = 1.0
safe_value = 0.0

[[permissions]]
tool_pattern = "*"
policy = "allow"
"#;

fn write_config(dir: &std::path::Path, addr: &str, hard_cap_mb: u32) -> std::path::PathBuf {
    let path = dir.join("rozd.toml");
    std::fs::write(
        &path,
        format!(
            "{CONFIG}\n[server]\nlisten = \"{addr}\"\nhttp2_keepalive_secs = 0\n\
             [store]\npath = {:?}\nmax_size_mb = 0\nhard_cap_mb = {hard_cap_mb}\n",
            dir.join("rozd.db").display().to_string()
        ),
    )
    .expect("write the config");
    path
}

async fn get(addr: &str, path: &str) -> Value {
    let reply = rozd::cli::client::get(addr, path, None)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    assert_eq!(reply.status.as_u16(), 200, "GET {path}: {}", reply.body);
    serde_json::from_str(&reply.body).unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

async fn post(addr: &str, path: &str, body: Value) -> (u16, Value) {
    let reply = rozd::cli::client::post_json(addr, path, None, &body)
        .await
        .unwrap_or_else(|e| panic!("POST {path}: {e}"));
    let value = serde_json::from_str(&reply.body)
        .unwrap_or_else(|e| panic!("POST {path}: {e}: {}", reply.body));
    (reply.status.as_u16(), value)
}

fn speed_of(observation: &Value) -> f64 {
    observation["actuators"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["name"] == "speed"))
        .and_then(|a| a["value"].as_f64())
        .unwrap_or_else(|| panic!("no speed in {observation}"))
}

/// Sends one user message and collects the turn's responses.
async fn turn(session: &mut Session, text: String) -> Vec<Resp> {
    session
        .send(Req::UserMessage(proto::UserMessage {
            content: text,
            ..Default::default()
        }))
        .await;
    let (seen, _) = common::until_complete(session).await;
    seen
}

#[tokio::test]
async fn a_full_store_refuses_physical_calls_keeps_the_stop_and_reads_and_recovers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let addr = format!("127.0.0.1:{}", common::broker::free_port());
    let config = write_config(dir.path(), &addr, 1);
    let child = common::spawn_rozd(dir.path(), &config).await;
    let pid = child.id().expect("rozd runs").to_string();
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut client = proto::agent_service_client::AgentServiceClient::new(channel);

    // The session that commands `speed`, started (and recorded) while the
    // store writes; its first command runs and is audited.
    let mut driver = Session::open(&mut client).await;
    let started = driver.start(proto::StartSession::default()).await;
    let seen = turn(&mut driver, "set speed 0.5".into()).await;
    assert!(
        common::text_of(&seen).contains("speed returned"),
        "{seen:?}"
    );
    assert_eq!(speed_of(&get(&addr, "/v1/observation").await), 0.5);
    assert_eq!(get(&addr, "/v1/status").await["store"]["writable"], true);

    // Fill the 1 MiB store: turns of shrinking size (each stored twice: the
    // user's text and the turn's messages) until each size no longer fits,
    // then PHYSICAL calls until their audit rows do not fit either.
    for size in [400_000, 100_000, 25_000, 6_000, 1_500, 300] {
        let mut filler = Session::open(&mut client).await;
        filler.start(proto::StartSession::default()).await;
        for _ in 0..8 {
            turn(&mut filler, format!("note {}", "x".repeat(size))).await;
            if get(&addr, "/v1/status").await["store"]["writable"] == false {
                break;
            }
        }
    }
    let mut refused = None;
    for _ in 0..500 {
        let seen = turn(&mut driver, "set speed 0.5".into()).await;
        // A turn whose own record does not fit says so (`internal`); the
        // call is what matters here.
        if let Some(e) = seen.iter().find_map(|r| match r {
            Resp::Error(e) if e.code != "internal" => Some(e.clone()),
            _ => None,
        }) {
            refused = Some(e);
            break;
        }
        assert!(
            common::text_of(&seen).contains("speed returned"),
            "{seen:?}"
        );
    }
    let error = refused.expect("the full store refuses a PHYSICAL call");
    assert_eq!(error.code, "host_unavailable", "{error:?}");
    assert!(error.retryable, "{error:?}");
    assert!(
        error.message.contains("cannot write its audit record")
            && error.message.contains("nothing was sent"),
        "{error:?}"
    );
    let status = get(&addr, "/v1/status").await;
    let store = &status["store"];
    assert_eq!(store["writable"], false, "{store}");
    assert_eq!(store["hard_cap_mb"], 1, "{store}");
    assert!(
        store["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("full")),
        "{store}"
    );
    assert!(store["failing_since_unix_ms"].is_i64(), "{store}");

    // Another value is refused too, and the actuator does not move.
    let seen = turn(&mut driver, "set speed 0.7".into()).await;
    assert!(
        seen.iter()
            .any(|r| matches!(r, Resp::Error(e) if e.code == "host_unavailable")),
        "{seen:?}"
    );
    let observation = get(&addr, "/v1/observation").await;
    assert_eq!(
        speed_of(&observation),
        0.5,
        "the refused command moved nothing"
    );

    // Reads keep working.
    let safety = get(&addr, "/v1/safety").await;
    assert_eq!(safety["estop_active"], false, "{safety}");
    let audit = get(
        &addr,
        &format!("/v1/audit?session={}&limit=50", started.session_id),
    )
    .await;
    let calls = audit["data"]
        .as_array()
        .expect("audit rows")
        .iter()
        .filter(|r| r["kind"] == "tool_call")
        .count();
    assert!(calls >= 1, "{audit}");
    assert!(
        audit["data"]
            .as_array()
            .expect("audit rows")
            .iter()
            .all(|r| r["parameters"]["value"] != 0.7),
        "the refused call has no row: {audit}"
    );

    // The protective stop latches, drives `speed` safe and is persisted,
    // whether or not its audit row can be written.
    let (code, body) = post(&addr, "/v1/estop", json!({ "reason": "disk full drill" })).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["estop_active"], true, "{body}");
    assert_eq!(speed_of(&get(&addr, "/v1/observation").await), 0.0);
    let stop_file = std::fs::read_to_string(dir.path().join("rozd.db-stop.json"))
        .expect("the stop file is written");
    assert!(stop_file.contains("disk full drill"), "{stop_file}");
    assert_eq!(get(&addr, "/v1/safety").await["estop_active"], true);
    let (code, body) = post(&addr, "/v1/estop/clear", json!({})).await;
    assert_eq!(code, 200, "{body}");
    // The driver's turns see the stop, then its clearing, before going on.
    let seen = turn(&mut driver, "set speed 0.2".into()).await;
    assert!(
        seen.iter()
            .any(|r| matches!(r, Resp::Error(e) if e.code == "host_unavailable")),
        "still refused while the store is full: {seen:?}"
    );

    // Room again: the cap raised, SIGHUP. Each refused attempt moves
    // nothing; bounded polling of the daemon until one runs.
    write_config(dir.path(), &addr, 64);
    let hup = tokio::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .await
        .expect("kill -HUP");
    assert!(hup.success());
    let mut ran = false;
    for _ in 0..500 {
        let seen = turn(&mut driver, "set speed 0.3".into()).await;
        if common::text_of(&seen).contains("speed returned")
            && !seen.iter().any(|r| matches!(r, Resp::Error(_)))
        {
            ran = true;
            break;
        }
        let error = expect_error(
            seen.into_iter()
                .find(|r| matches!(r, Resp::Error(e) if e.code != "internal"))
                .expect("a refusal until the cap is raised"),
        );
        assert_eq!(error.code, "host_unavailable", "{error:?}");
    }
    assert!(ran, "a PHYSICAL call runs once the store has room");
    assert_eq!(speed_of(&get(&addr, "/v1/observation").await), 0.3);
    let store = get(&addr, "/v1/status").await["store"].clone();
    assert_eq!(store["writable"], true, "{store}");
    assert_eq!(store["hard_cap_mb"], 64, "{store}");
    let audit = get(
        &addr,
        &format!("/v1/audit?session={}&limit=50", started.session_id),
    )
    .await;
    let last = audit["data"]
        .as_array()
        .expect("audit rows")
        .iter()
        .rfind(|r| r["kind"] == "tool_call")
        .cloned()
        .expect("the call after recovery is audited");
    assert_eq!(last["parameters"]["value"], 0.3, "{last}");
    assert!(
        last["result"].is_string() && last["ended_at_ms"].is_i64(),
        "{last}"
    );
    drop(child);
}
