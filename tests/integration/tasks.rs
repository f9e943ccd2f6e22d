//! Tasks and teams, black-box: `roz.v1.TaskService` and `WatchTeam` over a
//! real tonic client, the REST routes over HTTP, the offline `local` model
//! driving headless workers against simulated hardware.

use crate::common;

use std::time::Duration;

use common::{EXPECT_WITHIN, TestDaemon, rest_get, rest_post, rozd_cli};
use rozd::api::proto;
use rozd::api::proto::agent_service_client::AgentServiceClient;
use rozd::api::proto::task_service_client::TaskServiceClient;
use rozd::api::proto::team_event::Event;
use serde_json::{Value, json};
use tonic::Code;
use tonic::transport::Channel;

const HOST: &str = r#"
[[sensors]]
name = "distance"
source = "sim"
unit = "m"
signal = "constant"
offset = 1.25
rate_hz = 20

[[actuators]]
name = "speed"
kind = "sim"
unit = "m/s"
min = -1.0
max = 1.0
safe_value = 0.0

[[actuators]]
name = "lamp"
kind = "sim"
allowed = [0, 1]
safe_value = 0

[[permissions]]
tool_pattern = "speed"
policy = "allow"
"#;

async fn host(extra: &str) -> TestDaemon {
    TestDaemon::start(&format!("{HOST}\n{extra}")).await
}

async fn tasks(daemon: &TestDaemon) -> TaskServiceClient<Channel> {
    TaskServiceClient::new(daemon.channel().await)
}

async fn create(daemon: &TestDaemon, prompt: &str, timeout_secs: Option<u32>) -> proto::Task {
    tasks(daemon)
        .await
        .create_task(proto::CreateTaskRequest {
            prompt: prompt.into(),
            timeout_secs,
            ..Default::default()
        })
        .await
        .expect("CreateTask")
        .into_inner()
}

/// A team event as one comparable line, worker ids without the task prefix.
fn line(task_id: &str, event: &proto::TeamEvent) -> String {
    let short = |w: &str| {
        w.strip_prefix(&format!("{task_id}:"))
            .unwrap_or(w)
            .to_string()
    };
    match event.event.as_ref().expect("event set") {
        Event::WorkerStarted(e) => format!("started {} on {}", short(&e.worker_id), e.host_id),
        Event::WorkerPhase(e) => format!("phase {} {} {}", short(&e.worker_id), e.phase, e.mode),
        Event::WorkerToolCall(e) => format!("tool {} {}", short(&e.worker_id), e.tool),
        Event::WorkerCompleted(e) => format!("completed {}", short(&e.worker_id)),
        Event::WorkerFailed(e) => format!("failed {} {}", short(&e.worker_id), e.reason),
        Event::WorkerExited(e) => {
            assert_eq!(e.parent_task_id, task_id, "{e:?}");
            format!("exited {}", short(&e.worker_id))
        }
    }
}

struct Watch {
    task_id: String,
    stream: tonic::Streaming<proto::TeamEvent>,
    bound: Duration,
    seen: Vec<proto::TeamEvent>,
}

impl Watch {
    async fn open(daemon: &TestDaemon, task_id: &str) -> Watch {
        let stream = AgentServiceClient::new(daemon.channel().await)
            .watch_team(proto::WatchTeamRequest {
                task_id: task_id.into(),
            })
            .await
            .expect("WatchTeam")
            .into_inner();
        Watch {
            task_id: task_id.into(),
            stream,
            bound: EXPECT_WITHIN,
            seen: Vec::new(),
        }
    }

    /// The next event as a line; `None` when the stream ended.
    async fn next(&mut self) -> Option<String> {
        let next = tokio::time::timeout(self.bound, self.stream.message())
            .await
            .expect("a team event or the end arrives in time")
            .expect("WatchTeam stream healthy")?;
        let text = line(&self.task_id, &next);
        self.seen.push(next);
        Some(text)
    }

    /// Reads until `done` holds for the lines seen so far.
    async fn until(&mut self, done: impl Fn(&[String]) -> bool) -> Vec<String> {
        let mut lines: Vec<String> = self.seen.iter().map(|e| line(&self.task_id, e)).collect();
        while !done(&lines) {
            match self.next().await {
                Some(l) => lines.push(l),
                None => panic!("the stream ended before the condition held: {lines:#?}"),
            }
        }
        lines
    }

    /// Every remaining event up to the end of the stream; all lines seen.
    async fn until_end(&mut self) -> Vec<String> {
        while self.next().await.is_some() {}
        self.seen.iter().map(|e| line(&self.task_id, e)).collect()
    }
}

async fn statuses(daemon: &TestDaemon, task_id: &str, bound: Duration) -> Vec<(String, String)> {
    let mut stream = tasks(daemon)
        .await
        .stream_task_status(proto::StreamTaskStatusRequest {
            task_id: task_id.into(),
        })
        .await
        .expect("StreamTaskStatus")
        .into_inner();
    let mut seen = Vec::new();
    while let Some(update) = tokio::time::timeout(bound, stream.message())
        .await
        .expect("a status update or the end arrives in time")
        .expect("status stream healthy")
    {
        assert_eq!(update.task_id, task_id);
        assert!(update.timestamp.is_some(), "{update:?}");
        seen.push((update.status, update.detail.unwrap_or_default()));
    }
    seen
}

fn status_names(updates: &[(String, String)]) -> Vec<&str> {
    updates.iter().map(|(s, _)| s.as_str()).collect()
}

/// Checks the lifecycle of every worker in a full event sequence: started
/// first, exited last, at most one completed/failed right before exiting.
fn check_lifecycles(lines: &[String]) -> Vec<String> {
    let workers: Vec<String> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("started "))
        .map(|rest| rest.split(' ').next().unwrap_or_default().to_string())
        .collect();
    for w in &workers {
        let own: Vec<&String> = lines
            .iter()
            .filter(|l| l.split(' ').nth(1) == Some(w.as_str()))
            .collect();
        assert!(own[0].starts_with("started "), "{w}: {own:#?}");
        assert_eq!(
            own.last().map(|l| l.as_str()),
            Some(format!("exited {w}").as_str()),
            "{own:#?}"
        );
        let ends = own
            .iter()
            .filter(|l| l.starts_with("completed ") || l.starts_with("failed "))
            .count();
        assert!(ends <= 1, "{w}: {own:#?}");
        if ends == 1 {
            let before_exit = own[own.len() - 2];
            assert!(
                before_exit.starts_with("completed ") || before_exit.starts_with("failed "),
                "{w}: {own:#?}"
            );
        }
        let phases: Vec<u32> = own
            .iter()
            .filter(|l| l.starts_with("phase "))
            .map(|l| {
                l.split(' ')
                    .nth(2)
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(0)
            })
            .collect();
        let expected: Vec<u32> = (1..=phases.len() as u32).collect();
        assert_eq!(phases, expected, "{w}: phases count up from 1");
    }
    workers
}

#[tokio::test]
async fn a_team_of_three_workers_reads_and_moves_and_every_watcher_sees_the_same_events() {
    let daemon = host("").await;
    let speed = daemon.host.sim_actuator("speed").unwrap();
    let task = create(
        &daemon,
        r#"spawn react "read distance"; spawn react "read distance; read distance"; spawn react "set speed 0.5"; await"#,
        None,
    )
    .await;
    assert_eq!(task.status, "pending");
    assert_eq!(
        task.host_id.as_deref(),
        Some(daemon.host.config().host.id.as_str())
    );
    let id = task.id.clone();
    let mut early = Watch::open(&daemon, &id).await;
    let seen_early = early.until_end().await;

    let mut workers = check_lifecycles(&seen_early);
    workers.sort();
    assert_eq!(workers, ["w0", "w1", "w2", "w3"], "{seen_early:#?}");
    let host_id = &daemon.host.config().host.id;
    for w in ["w0", "w1", "w2", "w3"] {
        assert!(
            seen_early.contains(&format!("started {w} on {host_id}")),
            "{seen_early:#?}"
        );
        assert!(
            seen_early.contains(&format!("completed {w}")),
            "{seen_early:#?}"
        );
    }
    // The lead works in ooda_re_act (the default), workers in react as asked.
    assert!(seen_early.contains(&"phase w0 1 ooda_re_act".to_string()));
    assert!(seen_early.contains(&"phase w1 1 react".to_string()));
    for expected in [
        "tool w0 spawn_worker",
        "tool w0 await_workers",
        "tool w1 read_sensor",
        "tool w2 read_sensor",
        "tool w3 speed",
    ] {
        assert!(
            seen_early.contains(&expected.to_string()),
            "{expected}: {seen_early:#?}"
        );
    }
    assert_eq!(
        seen_early
            .iter()
            .filter(|l| *l == "tool w2 read_sensor")
            .count(),
        2
    );
    // The lead's result is the await's report of its three workers.
    let lead_result = early
        .seen
        .iter()
        .find_map(|e| match &e.event {
            Some(Event::WorkerCompleted(c)) if c.worker_id.ends_with(":w0") => {
                Some(c.result.clone())
            }
            _ => None,
        })
        .unwrap();
    assert!(
        lead_result.contains("await_workers returned"),
        "{lead_result}"
    );
    for w in ["w1", "w2", "w3"] {
        assert!(lead_result.contains(&format!("{id}:{w}")), "{lead_result}");
    }
    assert!(!lead_result.contains("failed"), "{lead_result}");

    // A watcher that comes after the end replays the identical sequence.
    let mut late = Watch::open(&daemon, &id).await;
    let seen_late = late.until_end().await;
    assert_eq!(seen_late, seen_early);
    assert_eq!(late.seen, early.seen);

    // The worker moved the actuator; its exit returned it to safe.
    assert!(speed.history().contains(&0.5), "{:?}", speed.history());
    assert_eq!(speed.value(), Some(0.0));

    let done = tasks(&daemon)
        .await
        .get_task(proto::GetTaskRequest { id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.status, "succeeded");
    assert_eq!(done.detail.as_deref(), Some(lead_result.as_str()));
    let updates = statuses(&daemon, &id, EXPECT_WITHIN).await;
    assert_eq!(status_names(&updates), ["pending", "running", "succeeded"]);

    // The worker's physical call is audited under its own id.
    let (_, audit) = rest_get(&daemon, &format!("/v1/audit?session={id}:w3")).await;
    assert!(
        audit["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["kind"] == "tool_call" && r["tool"] == "speed"),
        "{audit}"
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn a_protective_stop_mid_task_fails_every_running_worker_with_e_stop() {
    let daemon = host("").await;
    let task = create(
        &daemon,
        r#"spawn react "wait 600000; read distance"; spawn react "wait 600000; read distance"; await"#,
        None,
    )
    .await;
    let mut watch = Watch::open(&daemon, &task.id).await;
    // Both workers are in their (slow) model call and the lead awaits them.
    watch
        .until(|lines| {
            [
                "phase w1 1 react",
                "phase w2 1 react",
                "tool w0 await_workers",
            ]
            .iter()
            .all(|l| lines.iter().any(|seen| seen == l))
        })
        .await;
    let (status, reply) = rest_post(
        &daemon,
        "/v1/estop",
        &json!({"reason": "operator pressed stop"}),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    let lines = watch.until_end().await;
    check_lifecycles(&lines);
    for w in ["w0", "w1", "w2"] {
        assert!(lines.contains(&format!("failed {w} e_stop")), "{lines:#?}");
        assert!(!lines.contains(&format!("completed {w}")), "{lines:#?}");
    }
    let updates = statuses(&daemon, &task.id, EXPECT_WITHIN).await;
    let (last, detail) = updates.last().unwrap();
    assert_eq!(last, "failed");
    assert!(
        detail.starts_with("e_stop") && detail.contains("operator pressed stop"),
        "{detail}"
    );
    // While the stop is latched no task starts.
    let refused = tasks(&daemon)
        .await
        .create_task(proto::CreateTaskRequest {
            prompt: "read distance".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    daemon.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_task_timeout_fails_its_workers_with_timeout_and_its_actuators_go_safe() {
    let daemon = TestDaemon::setup(HOST).paused_clock().start().await;
    let speed = daemon.host.sim_actuator("speed").unwrap();
    // `speed` is allowed; `lamp` waits for an approval that never comes
    // (its own approval timeout, 120 s, is longer than the task's 20 s).
    let task = create(&daemon, "set speed 0.5; set lamp 1", Some(20)).await;
    let bound = Duration::from_secs(300);
    let mut watch = Watch::open(&daemon, &task.id).await;
    watch.bound = bound;
    let lines = watch.until_end().await;
    check_lifecycles(&lines);
    assert!(lines.contains(&"tool w0 speed".to_string()), "{lines:#?}");
    assert!(
        lines.contains(&"failed w0 timeout".to_string()),
        "{lines:#?}"
    );
    let updates = statuses(&daemon, &task.id, bound).await;
    assert_eq!(
        status_names(&updates),
        ["pending", "running", "waiting_approval", "timed_out"]
    );
    assert!(speed.history().contains(&0.5), "{:?}", speed.history());
    assert_eq!(speed.value(), Some(0.0));
    assert_eq!(
        daemon
            .host
            .sim_actuator("lamp")
            .unwrap()
            .history()
            .iter()
            .filter(|v| **v == 1.0)
            .count(),
        0
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn an_out_of_range_command_fails_the_worker_with_safety_violation() {
    let daemon = host("").await;
    let speed = daemon.host.sim_actuator("speed").unwrap();
    let task = create(&daemon, "set speed 5; set speed 0.5", None).await;
    let lines = Watch::open(&daemon, &task.id).await.until_end().await;
    check_lifecycles(&lines);
    assert!(
        lines.contains(&"failed w0 safety_violation".to_string()),
        "{lines:#?}"
    );
    // The worker stopped at the violation: its next command never ran.
    assert_eq!(
        lines.iter().filter(|l| *l == "tool w0 speed").count(),
        1,
        "{lines:#?}"
    );
    assert!(
        !speed.history().contains(&5.0) && !speed.history().contains(&0.5),
        "{:?}",
        speed.history()
    );
    let updates = statuses(&daemon, &task.id, EXPECT_WITHIN).await;
    let (last, detail) = updates.last().unwrap();
    assert_eq!(last, "failed");
    assert!(detail.starts_with("safety_violation:"), "{detail}");
    daemon.shutdown().await;
}

/// A provider that refuses every request with a non-retryable 400.
async fn refusing_provider() -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                // Headers, then as much body as content-length says.
                loop {
                    let Ok(n) = socket.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    request.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&request).to_string();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length = text[..end]
                            .lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case("content-length")
                                    .then(|| v.trim().parse::<usize>().ok())?
                            })
                            .unwrap_or(0);
                        if request.len() >= end + 4 + length {
                            break;
                        }
                    }
                }
                let body =
                    r#"{"error":{"message":"bad model name","type":"invalid_request_error"}}"#;
                let reply = format!(
                    "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(reply.as_bytes()).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    port
}

#[tokio::test]
async fn a_provider_error_fails_the_worker_with_model_error() {
    let port = refusing_provider().await;
    let daemon = host(&format!(
        "[tasks]\nmodel = \"box\"\n[[model.endpoints]]\nname = \"box\"\nprovider = \"openai\"\n\
         model = \"m\"\nbase_url = \"http://127.0.0.1:{port}/v1\"\n"
    ))
    .await;
    let task = create(&daemon, "read distance", None).await;
    let lines = Watch::open(&daemon, &task.id).await.until_end().await;
    assert_eq!(
        lines,
        [
            format!("started w0 on {}", daemon.host.config().host.id),
            "phase w0 1 ooda_re_act".to_string(),
            "failed w0 model_error".to_string(),
            "exited w0".to_string()
        ]
    );
    let updates = statuses(&daemon, &task.id, EXPECT_WITHIN).await;
    let (last, detail) = updates.last().unwrap();
    assert_eq!(last, "failed");
    assert!(
        detail.starts_with("model_error:") && detail.contains("400"),
        "{detail}"
    );
    daemon.shutdown().await;
}

/// Waits for the task to wait for an approval; returns the pending call.
async fn pending_call(daemon: &TestDaemon, task_id: &str) -> proto::PendingApproval {
    let mut stream = tasks(daemon)
        .await
        .stream_task_status(proto::StreamTaskStatusRequest {
            task_id: task_id.into(),
        })
        .await
        .unwrap()
        .into_inner();
    loop {
        let update = tokio::time::timeout(EXPECT_WITHIN, stream.message())
            .await
            .expect("status in time")
            .unwrap()
            .expect("the task waits for approval before it ends");
        if update.status == "waiting_approval" {
            break;
        }
    }
    let task = tasks(daemon)
        .await
        .get_task(proto::GetTaskRequest { id: task_id.into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(task.status, "waiting_approval");
    assert_eq!(task.pending_approvals.len(), 1, "{task:?}");
    task.pending_approvals[0].clone()
}

#[tokio::test]
async fn approvals_through_approve_tool_use_and_through_rest_both_decide_the_call() {
    let daemon = host("").await;
    let lamp = daemon.host.sim_actuator("lamp").unwrap();
    let mut client = tasks(&daemon).await;

    // gRPC: approved, the lamp goes on; the worker's exit turns it off.
    let task = create(&daemon, "set lamp 1", None).await;
    let pending = pending_call(&daemon, &task.id).await;
    assert_eq!(pending.tool, "lamp");
    assert_eq!(pending.worker_id, format!("{}:w0", task.id));
    let unknown = client
        .approve_tool_use(proto::ApproveToolUseRequest {
            task_id: task.id.clone(),
            tool_call_id: "no-such-call".into(),
            approved: true,
            modifier: None,
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound, "{unknown:?}");
    let modified = client
        .approve_tool_use(proto::ApproveToolUseRequest {
            task_id: task.id.clone(),
            tool_call_id: pending.tool_call_id.clone(),
            approved: true,
            modifier: Some(rozd::api::convert::json_to_struct(&json!({"value": 0}))),
        })
        .await
        .unwrap_err();
    assert_eq!(modified.code(), Code::InvalidArgument, "{modified:?}");
    let after = client
        .approve_tool_use(proto::ApproveToolUseRequest {
            task_id: task.id.clone(),
            tool_call_id: pending.tool_call_id.clone(),
            approved: true,
            modifier: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(after.pending_approvals.is_empty(), "{after:?}");
    let updates = statuses(&daemon, &task.id, EXPECT_WITHIN).await;
    assert_eq!(
        status_names(&updates),
        [
            "pending",
            "running",
            "waiting_approval",
            "running",
            "succeeded"
        ]
    );
    assert!(lamp.history().contains(&1.0), "{:?}", lamp.history());
    assert_eq!(lamp.value(), Some(0.0));

    // REST: denied, the lamp never moves; the worker completes with the denial.
    let before = lamp.history().len();
    let task = create(&daemon, "set lamp 1", None).await;
    let pending = pending_call(&daemon, &task.id).await;
    let path = format!("/v1/tasks/{}/approvals", task.id);
    let (status, bad) = rest_post(
        &daemon,
        &path,
        &json!({"tool_call_id": pending.tool_call_id}),
    )
    .await;
    assert_eq!(status, 400, "{bad}");
    assert_eq!(bad["error"]["code"], "invalid_argument");
    let (status, reply) = rest_post(
        &daemon,
        &path,
        &json!({"tool_call_id": pending.tool_call_id, "approved": false}),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    let updates = statuses(&daemon, &task.id, EXPECT_WITHIN).await;
    assert_eq!(status_names(&updates).last(), Some(&"succeeded"));
    assert!(updates.last().unwrap().1.contains("denied"), "{updates:?}");
    assert!(
        !lamp.history()[before..].contains(&1.0),
        "{:?}",
        lamp.history()
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn bad_requests_get_precise_errors_over_grpc_and_rest() {
    let daemon = host("[tasks]\nmax_timeout_secs = 60\ndefault_timeout_secs = 30\n").await;
    let mut client = tasks(&daemon).await;
    let code = |r: Result<tonic::Response<proto::Task>, tonic::Status>| r.unwrap_err().code();
    assert_eq!(
        code(
            client
                .create_task(proto::CreateTaskRequest::default())
                .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            client
                .create_task(proto::CreateTaskRequest {
                    prompt: "status".into(),
                    timeout_secs: Some(61),
                    ..Default::default()
                })
                .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            client
                .create_task(proto::CreateTaskRequest {
                    prompt: "status".into(),
                    host_id: Some("another-host".into()),
                    ..Default::default()
                })
                .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(
            client
                .get_task(proto::GetTaskRequest {
                    id: "not-a-uuid".into()
                })
                .await
        ),
        Code::InvalidArgument
    );
    let unknown = format!("{}:{}", daemon.host.config().host.id, uuid::Uuid::new_v4());
    assert_eq!(
        code(
            client
                .get_task(proto::GetTaskRequest {
                    id: unknown.clone()
                })
                .await
        ),
        Code::NotFound
    );
    let mut agent = AgentServiceClient::new(daemon.channel().await);
    let watch = |id: &str| proto::WatchTeamRequest { task_id: id.into() };
    assert_eq!(
        agent.watch_team(watch("nope")).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    assert_eq!(
        agent.watch_team(watch(&unknown)).await.unwrap_err().code(),
        Code::NotFound
    );
    assert_eq!(
        client
            .list_tasks(proto::ListTasksRequest {
                limit: 501,
                offset: 0
            })
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );

    for (body, needle) in [
        (json!([1]), "JSON object"),
        (
            json!({"prompt": 3}),
            "`prompt`: invalid type: integer `3`, expected a string",
        ),
        (
            json!({"prompt": "status", "colour": "red"}),
            "unknown field `colour`",
        ),
        (
            json!({"prompt": "status", "timeout_secs": -1}),
            "timeout_secs",
        ),
    ] {
        let (status, reply) = rest_post(&daemon, "/v1/tasks", &body).await;
        assert_eq!(status, 400, "{body}: {reply}");
        assert_eq!(reply["error"]["code"], "invalid_argument");
        let message = reply["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{message}");
    }
    let (status, reply) = rest_get(&daemon, &format!("/v1/tasks/{unknown}")).await;
    assert_eq!(status, 404, "{reply}");

    // The REST round trip: create, list, show, events; cancel a finished task is a 409.
    let (status, created) = rest_post(&daemon, "/v1/tasks", &json!({"prompt": "echo hello"})).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    assert_eq!(created["timeout_secs"], 30);
    let updates = statuses(&daemon, &id, EXPECT_WITHIN).await;
    assert_eq!(
        updates.last().unwrap(),
        &("succeeded".to_string(), "hello".to_string())
    );
    let (_, list) = rest_get(&daemon, "/v1/tasks?limit=5").await;
    assert_eq!(list["data"][0]["id"], id.as_str());
    assert_eq!(list["data"][0]["status"], "succeeded");
    let (_, events) = rest_get(&daemon, &format!("/v1/tasks/{id}/events")).await;
    let kinds: Vec<&str> = events["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds.first(), Some(&"status"));
    assert!(
        kinds.contains(&"worker_completed") && kinds.contains(&"worker_exited"),
        "{kinds:?}"
    );
    let (status, cancel) = rest_post(&daemon, &format!("/v1/tasks/{id}/cancel"), &json!({})).await;
    assert_eq!(status, 409, "{cancel}");
    daemon.shutdown().await;
}

#[tokio::test]
async fn cancelling_a_task_exits_its_workers_without_failure_and_makes_actuators_safe() {
    let daemon = host("").await;
    let speed = daemon.host.sim_actuator("speed").unwrap();
    let task = create(&daemon, "set speed 0.5; set lamp 1", None).await;
    pending_call(&daemon, &task.id).await;
    assert_eq!(speed.value(), Some(0.5));
    tasks(&daemon)
        .await
        .cancel_task(proto::CancelTaskRequest {
            id: task.id.clone(),
        })
        .await
        .unwrap();
    let lines = Watch::open(&daemon, &task.id).await.until_end().await;
    check_lifecycles(&lines);
    assert!(
        !lines
            .iter()
            .any(|l| l.starts_with("failed ") || l.starts_with("completed ")),
        "{lines:#?}"
    );
    let updates = statuses(&daemon, &task.id, EXPECT_WITHIN).await;
    assert_eq!(status_names(&updates).last(), Some(&"cancelled"));
    assert_eq!(speed.value(), Some(0.0));
    daemon.shutdown().await;
}

#[tokio::test]
async fn a_graceful_shutdown_mid_task_fails_it_as_interrupted_with_safe_actuators() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("rozd.db");
    let daemon = TestDaemon::start_with_store(&store, HOST).await;
    let speed = daemon.host.sim_actuator("speed").unwrap();
    let task = create(&daemon, "set speed 0.5; set lamp 1", None).await;
    pending_call(&daemon, &task.id).await;
    assert_eq!(speed.value(), Some(0.5));
    // The first step of the shutdown, alone: the tasks stop their workers
    // and record their end; the actuators are safe before the daemon's own
    // last safe drive (`ooda.stop`) could have done it.
    daemon.host.begin_shutdown();
    tokio::time::timeout(EXPECT_WITHIN, daemon.host.tasks().wait_idle())
        .await
        .expect("the task ends");
    assert_eq!(speed.value(), Some(0.0));
    daemon.shutdown().await;

    let daemon = TestDaemon::start_with_store(&store, HOST).await;
    let lines = Watch::open(&daemon, &task.id).await.until_end().await;
    check_lifecycles(&lines);
    assert!(
        lines.contains(&"failed w0 e_stop".to_string()),
        "{lines:#?}"
    );
    let updates = statuses(&daemon, &task.id, EXPECT_WITHIN).await;
    assert_eq!(
        updates.last().unwrap(),
        &("failed".to_string(), "interrupted".to_string())
    );
    daemon.shutdown().await;
}

/// A daemon that dies mid-task (its runtime dropped: no graceful path runs)
/// leaves the task running in the store; the next start fails it as
/// `interrupted`, gives its worker `e_stop` and `exited`, starts the
/// actuators safe, and `WatchTeam` replays the whole history.
#[test]
fn a_restart_after_a_crash_mid_task_replays_the_interrupted_history() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("rozd.db");
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    let crashing = runtime();
    let client_rt = runtime();
    let first = crashing.block_on(TestDaemon::start_with_store(&store, HOST));
    let (task_id, before) = client_rt.block_on(async {
        let task = create(&first, "set speed 0.5; set lamp 1", None).await;
        pending_call(&first, &task.id).await;
        let mut watch = Watch::open(&first, &task.id).await;
        let before = watch
            .until(|l| l.contains(&"tool w0 lamp".to_string()))
            .await;
        (task.id, before)
    });
    assert_eq!(first.host.sim_actuator("speed").unwrap().value(), Some(0.5));
    drop(crashing);
    drop(first);

    client_rt.block_on(async {
        let daemon = TestDaemon::start_with_store(&store, HOST).await;
        let lines = Watch::open(&daemon, &task_id).await.until_end().await;
        assert_eq!(
            lines[..before.len()],
            before[..],
            "history kept: {lines:#?}"
        );
        assert_eq!(lines[before.len()..], ["failed w0 e_stop", "exited w0"]);
        let updates = statuses(&daemon, &task_id, EXPECT_WITHIN).await;
        assert_eq!(
            updates.last().unwrap(),
            &("failed".to_string(), "interrupted".to_string())
        );
        assert_eq!(
            status_names(&updates),
            ["pending", "running", "waiting_approval", "failed"]
        );
        daemon.shutdown().await;
    });
}

// ------------------------------------------------------------------ CLI

#[tokio::test]
async fn the_task_cli_creates_approves_watches_lists_and_reports_refusals() {
    let daemon = host("").await;
    let addr = daemon.addr.to_string();
    let (code, out, err) =
        rozd_cli(&["task", "create", "set lamp 1", "--addr", &addr, "--json"]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    let created: Value = serde_json::from_str(out.trim()).unwrap();
    let id = created["id"].as_str().unwrap().to_string();
    let pending = pending_call(&daemon, &id).await;

    let (code, out, err) = rozd_cli(&["task", "show", &id, "--addr", &addr]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("status: waiting_approval"), "{out}");
    assert!(
        out.contains(&format!(
            "waiting for approval: {} (lamp",
            pending.tool_call_id
        )),
        "{out}"
    );

    let (code, _, err) = rozd_cli(&[
        "task",
        "approve",
        &id,
        &pending.tool_call_id,
        "--addr",
        &addr,
    ])
    .await;
    assert_eq!(code, Some(0), "{err}");
    let (code, out, err) = rozd_cli(&["task", "watch", &id, "--addr", &addr]).await;
    assert_eq!(code, Some(0), "the task succeeded: {out}{err}");
    for expected in [
        "status pending",
        "status waiting_approval",
        "w0 calls lamp",
        "w0 exited",
    ] {
        assert!(out.contains(expected), "{expected}: {out}");
    }
    assert!(
        out.trim_end()
            .lines()
            .any(|l| l.starts_with("status succeeded")),
        "{out}"
    );

    let (code, out, _) = rozd_cli(&["task", "list", "--addr", &addr]).await;
    assert_eq!(code, Some(0));
    assert!(out.contains(&id) && out.contains("succeeded"), "{out}");

    // Refusals: exit 3 with the daemon's message.
    let (code, _, err) = rozd_cli(&["task", "cancel", &id, "--addr", &addr]).await;
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains("409") && err.contains("already finished"),
        "{err}"
    );
    let (code, _, err) = rozd_cli(&["task", "show", "not-a-uuid", "--addr", &addr]).await;
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("is not <host id>:<uuid>"), "{err}");
    // An id with URL syntax in it reaches the task routes whole: not
    // another route (`/v1/tasks/<id>/cancel` for `show`), not a query.
    for odd in ["lab:x/cancel", "lab:x?limit=1", "lab:x#y", "../status"] {
        let (code, _, err) = rozd_cli(&["task", "show", odd, "--addr", &addr]).await;
        assert_eq!(code, Some(3), "{odd}: {err}");
        assert!(err.contains("is not <host id>:<uuid>"), "{odd}: {err}");
        assert!(err.contains(&format!("{odd:?}")), "{odd}: {err}");
    }

    // A task that fails makes `watch` exit 4.
    let (code, out, _) =
        rozd_cli(&["task", "create", "set speed 9", "--addr", &addr, "--json"]).await;
    assert_eq!(code, Some(0));
    let failing: Value = serde_json::from_str(out.trim()).unwrap();
    let (code, out, _) = rozd_cli(&[
        "task",
        "watch",
        failing["id"].as_str().unwrap(),
        "--addr",
        &addr,
    ])
    .await;
    assert_eq!(code, Some(4), "{out}");
    assert!(out.contains("w0 failed: safety_violation"), "{out}");
    daemon.shutdown().await;
}

#[tokio::test]
async fn a_lead_that_fails_stops_its_workers() {
    let daemon = host("").await;
    let task = create(
        &daemon,
        r#"spawn react "wait 600000; read distance"; set speed 5"#,
        None,
    )
    .await;
    let lines = Watch::open(&daemon, &task.id).await.until_end().await;
    check_lifecycles(&lines);
    assert!(
        lines.contains(&"failed w0 safety_violation".to_string()),
        "{lines:#?}"
    );
    // The worker was stopped (no failure of its own), not left to run.
    assert!(lines.contains(&"exited w1".to_string()), "{lines:#?}");
    assert!(
        !lines
            .iter()
            .any(|l| l.starts_with("failed w1") || l.starts_with("completed w1")),
        "{lines:#?}"
    );
    let updates = statuses(&daemon, &task.id, EXPECT_WITHIN).await;
    let (last, detail) = updates.last().unwrap();
    assert_eq!(last, "failed");
    assert!(detail.starts_with("safety_violation:"), "{detail}");
    daemon.shutdown().await;
}

#[tokio::test]
async fn max_concurrent_and_max_workers_bound_tasks_and_teams() {
    let daemon = host("[tasks]\nmax_concurrent = 1\nmax_workers = 1\n").await;
    // One task waits for an approval: the host is at its limit.
    let first = create(&daemon, "set lamp 1", None).await;
    pending_call(&daemon, &first.id).await;
    let refused = tasks(&daemon)
        .await
        .create_task(proto::CreateTaskRequest {
            prompt: "status".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    let (status, reply) = rest_post(&daemon, "/v1/tasks", &json!({"prompt": "status"})).await;
    assert_eq!(status, 429, "{reply}");
    tasks(&daemon)
        .await
        .cancel_task(proto::CancelTaskRequest {
            id: first.id.clone(),
        })
        .await
        .unwrap();
    statuses(&daemon, &first.id, EXPECT_WITHIN).await;

    // A lead may start one worker; the second spawn is refused, and says why.
    let task = create(
        &daemon,
        r#"spawn react "read distance"; spawn react "read distance"; await"#,
        None,
    )
    .await;
    let lines = Watch::open(&daemon, &task.id).await.until_end().await;
    assert!(lines.contains(&"exited w1".to_string()), "{lines:#?}");
    assert!(
        !lines.iter().any(|l| l.starts_with("started w2")),
        "{lines:#?}"
    );
    let done = tasks(&daemon)
        .await
        .get_task(proto::GetTaskRequest {
            id: task.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.status, "succeeded");
    let detail = done.detail.unwrap_or_default();
    assert!(
        detail.contains("spawn_worker failed") && detail.contains("max_workers"),
        "{detail}"
    );
    daemon.shutdown().await;
}

/// A serial valve that answers `OK` only when the test says so.
fn serial_valve(path: &std::path::Path) -> String {
    format!(
        "[[serial]]\nname = \"mcu\"\npath = {:?}\n\n[[actuators]]\nname = \"valve\"\nkind = \"serial\"\nport = \"mcu\"\n\
         template = \"V {{value}}\\n\"\nexpect = \"^OK\"\nreply_timeout_ms = 20000\ntimeout_ms = 30000\nmin = 0\nmax = 1\nsafe_value = 0\n\n\
         [[permissions]]\ntool_pattern = \"valve\"\npolicy = \"allow\"\n",
        path.display().to_string()
    )
}

/// Cancelling a task while its command is at the driver (the device has the
/// bytes, its reply is pending) neither leaves the valve open nor loses track
/// of it: the command finishes, and the worker's deadman closes the valve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_task_mid_command_still_ends_with_the_valve_safe() {
    let dir = tempfile::tempdir().unwrap();
    let pty = common::pty::PtyPair::start(dir.path()).await;
    let mut device = pty.device();
    // Start-up drives the safe value (and waits for the device to confirm it).
    let config = serial_valve(&pty.a);
    let starting = tokio::spawn(async move { TestDaemon::start(&config).await });
    device.answer("V 0", "OK").await;
    let daemon = starting.await.unwrap();
    let task = create(&daemon, "set valve 1", None).await;
    assert_eq!(device.line().await, "V 1", "the command reached the device");
    tasks(&daemon)
        .await
        .cancel_task(proto::CancelTaskRequest {
            id: task.id.clone(),
        })
        .await
        .unwrap();
    // The device confirms the open only now; then it must be told to close.
    device.send("OK\n").await;
    device.answer("V 0", "OK").await;
    let updates = statuses(&daemon, &task.id, EXPECT_WITHIN).await;
    assert_eq!(status_names(&updates).last(), Some(&"cancelled"));
    assert_eq!(daemon.host.ooda().actuators().value("valve"), Some(0.0));
    // Shutdown drives the safe value once more; the device answers it.
    let shutdown = tokio::spawn(daemon.shutdown());
    device.answer("V 0", "OK").await;
    shutdown.await.unwrap();
}

/// Issue 36: a task's worker is told what every session is told: its
/// system prompt (which the offline model's `context` command answers with)
/// holds the embodiment and the operator's manual.
#[tokio::test]
async fn a_task_worker_is_told_the_embodiment_and_the_manual() {
    let dir = tempfile::tempdir().unwrap();
    let manual = dir.path().join("AGENTS.md");
    std::fs::write(&manual, "Tasks run only when the cell is empty.\n").unwrap();
    let daemon = host(&format!(
        "[agent]\nmanual_file = {:?}\n",
        manual.display().to_string()
    ))
    .await;
    let briefing = daemon.host.briefing().text().to_string();
    assert!(briefing.contains("Tasks run only when the cell is empty."));
    let (status, created) = rest_post(&daemon, "/v1/tasks", &json!({"prompt": "context"})).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let updates = statuses(&daemon, &id, EXPECT_WITHIN).await;
    let (last, detail) = updates.last().unwrap();
    assert_eq!(last, "succeeded", "{updates:?}");
    assert!(
        detail.contains(briefing.trim_end()),
        "the worker's system prompt:\n{detail}"
    );
    daemon.shutdown().await;
}
