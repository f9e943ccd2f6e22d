//! `rozd task ...`: tasks on a running daemon, from the command line. Every
//! subcommand but `watch` is one REST call; `watch` follows the task over
//! gRPC (`StreamTaskStatus` and `WatchTeam` together) until it finishes.

use clap::Subcommand;
use serde_json::{Value, json};

use super::connect::{self, Bearer, ConnectError, WATCH_CONNECT_TIMEOUT};
use super::{client, format};
use crate::proto;
use crate::proto::agent_service_client::AgentServiceClient;
use crate::proto::task_service_client::TaskServiceClient;

#[derive(Debug, Subcommand)]
pub enum TaskCommand {
    /// Start a task: a headless agent on the host with the host tools.
    Create {
        /// What the task's agent is asked to do.
        prompt: String,
        /// Stop the task (actuators safe) after this many seconds.
        #[arg(long, value_name = "SECS")]
        timeout: Option<u32>,
        /// Environment id (default: the host's).
        #[arg(long, value_name = "ENV")]
        environment: Option<String>,
        /// Host to run on (default: the daemon's own).
        #[arg(long, value_name = "HOST_ID")]
        host_id: Option<String>,
    },
    /// List tasks, newest first.
    List {
        #[arg(long, default_value_t = 20)]
        limit: u32,
        #[arg(long, default_value_t = 0)]
        offset: u32,
    },
    /// Show one task and the tool calls waiting for approval.
    Show { id: String },
    /// Stop a running task; its actuators go to their safe values.
    Cancel { id: String },
    /// Approve (or, with --deny, deny) a tool call the task waits on.
    Approve {
        id: String,
        tool_call_id: String,
        #[arg(long)]
        deny: bool,
    },
    /// Follow a task's status and team events until it finishes.
    Watch { id: String },
}

pub const TASK_EXIT_HELP: &str = "Exit status:
  0  done (watch: the task succeeded)
  1  no answer: cannot connect, or a reply that is not understood
  2  bad arguments
  3  the daemon refused the request (the message says why, e.g. 404: no such task)
  4  watch: the task ended without succeeding (failed, cancelled or timed_out)";

pub mod exit {
    pub const OK: u8 = 0;
    pub const NO_ANSWER: u8 = 1;
    pub const REFUSED: u8 = 3;
    pub const NOT_SUCCEEDED: u8 = 4;
}

/// A failed command: what to print and the exit status.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct TaskCliError {
    pub message: String,
    pub exit: u8,
}

fn no_answer(message: impl Into<String>) -> TaskCliError {
    TaskCliError {
        message: message.into(),
        exit: exit::NO_ANSWER,
    }
}

/// Runs one subcommand on its own runtime; errors go to stderr. Returns
/// the exit status.
pub fn exec(addr: &str, token: Option<&str>, command: TaskCommand, raw: bool) -> u8 {
    let rt = match super::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rozd task: {}", super::error_chain(&e));
            return exit::NO_ANSWER;
        }
    };
    match rt.block_on(run(addr, token, command, raw)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rozd task: {e}");
            e.exit
        }
    }
}

/// Runs one subcommand; output goes to stdout, the exit status is returned.
pub async fn run(
    addr: &str,
    token: Option<&str>,
    command: TaskCommand,
    raw: bool,
) -> Result<u8, TaskCliError> {
    let (method, path, body) = match &command {
        TaskCommand::Watch { id } => return watch(addr, token, id).await,
        TaskCommand::Create {
            prompt,
            timeout,
            environment,
            host_id,
        } => {
            let mut body = json!({ "prompt": prompt });
            if let Some(map) = body.as_object_mut() {
                if let Some(t) = timeout {
                    map.insert("timeout_secs".into(), json!(t));
                }
                if let Some(e) = environment {
                    map.insert("environment_id".into(), json!(e));
                }
                if let Some(h) = host_id {
                    map.insert("host_id".into(), json!(h));
                }
            }
            (http::Method::POST, "/v1/tasks".to_string(), Some(body))
        }
        TaskCommand::List { limit, offset } => (
            http::Method::GET,
            format!("/v1/tasks?limit={limit}&offset={offset}"),
            None,
        ),
        TaskCommand::Show { id } => (
            http::Method::GET,
            format!("/v1/tasks/{}", client::url_part(id)),
            None,
        ),
        TaskCommand::Cancel { id } => (
            http::Method::POST,
            format!("/v1/tasks/{}/cancel", client::url_part(id)),
            Some(json!({})),
        ),
        TaskCommand::Approve {
            id,
            tool_call_id,
            deny,
        } => (
            http::Method::POST,
            format!("/v1/tasks/{}/approvals", client::url_part(id)),
            Some(json!({ "tool_call_id": tool_call_id, "approve": !deny })),
        ),
    };
    let reply = match body {
        Some(body) => client::post_json(addr, &path, token, &body).await,
        None => client::request(addr, method, &path, token).await,
    }
    .map_err(|e| no_answer(e.to_string()))?;
    let value: Value = serde_json::from_str(&reply.body).map_err(|e| {
        no_answer(format!(
            "{addr} answered something that is not JSON ({e}): {}",
            reply.body.trim()
        ))
    })?;
    if !reply.status.is_success() {
        let message = value
            .pointer("/error/message")
            .and_then(Value::as_str)
            .unwrap_or(reply.body.trim());
        return Err(TaskCliError {
            message: format!("{addr} answered {}: {message}", reply.status),
            exit: exit::REFUSED,
        });
    }
    if raw {
        println!("{value}");
        return Ok(exit::OK);
    }
    match command {
        TaskCommand::List { .. } => {
            let tasks = value
                .get("data")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if tasks.is_empty() {
                println!("no tasks");
            }
            for t in &tasks {
                println!("{}", format::task_line(t));
            }
        }
        _ => print!("{}", format::task(&value)),
    }
    Ok(exit::OK)
}

fn refused(status: tonic::Status) -> TaskCliError {
    TaskCliError {
        message: format!("{:?}: {}", status.code(), status.message()),
        exit: exit::REFUSED,
    }
}

async fn watch(addr: &str, token: Option<&str>, id: &str) -> Result<u8, TaskCliError> {
    connect::authority(addr).map_err(|e| no_answer(e.to_string()))?;
    let bearer =
        Bearer::new(token).map_err(|_| no_answer("the token is not valid in an HTTP header"))?;
    let channel = connect::channel(addr, WATCH_CONNECT_TIMEOUT)
        .await
        .map_err(|e| match e {
            ConnectError::Connect { .. } | ConnectError::Tls(_) => no_answer(e.to_string()),
            ConnectError::Address(_) | ConnectError::Token => {
                no_answer(format!("invalid address {addr:?}"))
            }
        })?;
    let mut tasks = TaskServiceClient::with_interceptor(channel.clone(), bearer.clone());
    let mut agent = AgentServiceClient::with_interceptor(channel, bearer);
    let mut statuses = tasks
        .stream_task_status(proto::StreamTaskStatusRequest {
            task_id: id.to_string(),
        })
        .await
        .map_err(refused)?
        .into_inner();
    let mut events = agent
        .watch_team(proto::WatchTeamRequest {
            task_id: id.to_string(),
        })
        .await
        .map_err(refused)?
        .into_inner();
    let (mut statuses_open, mut events_open) = (true, true);
    let mut last = String::new();
    while statuses_open || events_open {
        tokio::select! {
            update = statuses.message(), if statuses_open => match update.map_err(refused)? {
                Some(u) => {
                    match u.detail.as_deref().filter(|d| !d.is_empty()) {
                        Some(d) => println!("status {}: {}", u.status, format::one_line(d, 200)),
                        None => println!("status {}", u.status),
                    }
                    last = u.status;
                }
                None => statuses_open = false,
            },
            event = events.message(), if events_open => match event.map_err(refused)? {
                Some(e) => println!("{}", format::event_line(id, &e)),
                None => events_open = false,
            },
        }
    }
    Ok(if last == "succeeded" {
        exit::OK
    } else {
        exit::NOT_SUCCEEDED
    })
}
