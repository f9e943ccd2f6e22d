//! Measurements 1 (tool step overhead) and 2 (concurrency): sessions on the local model
//! over loopback gRPC, beside the bare tonic echo of the same messages.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Result, bail};
use rozd::api::proto;
use rozd::api::proto::agent_service_client::AgentServiceClient;
use rozd::api::proto::session_response::Response as Resp;
use tokio::time::Instant;
use tonic::transport::Channel;

use super::Scale;
use super::fixtures::{
    Daemon, END_TURN, Echo, STEP_PREAMBLE, SessionStream, connect, start_echo, step_tool,
    steps_prompt, tool_result, user,
};
use super::report::{Better, Group, P50, P99, P999, Samples};

/// Sessions per HTTP/2 connection (below the servers' stream limits).
const SESSIONS_PER_CONNECTION: usize = 100;

/// One rozd turn of `k` sequential client tool calls; returns the `k - 1`
/// step latencies (ToolResult sent -> next ToolRequest received). Checks
/// that each step sends what the echo of the same messages mirrors.
async fn rozd_steps(session: &mut SessionStream, k: usize) -> Result<Samples> {
    let mut samples = Samples::default();
    session.send(user(&steps_prompt(k))).await?;
    let mut sent: Option<Instant> = None;
    let mut before_request = 0;
    loop {
        match session.next().await? {
            Resp::ToolRequest(request) => {
                if let Some(at) = sent {
                    samples.push(at.elapsed());
                    if before_request != STEP_PREAMBLE {
                        bail!(
                            "rozd sent {before_request} messages before a step's ToolRequest; \
                             the echo of the same messages sends {STEP_PREAMBLE}"
                        );
                    }
                }
                let result = tool_result(&request.tool_call_id, "ok");
                before_request = 0;
                sent = Some(Instant::now());
                session.send(result).await?;
            }
            Resp::ActivityUpdate(_)
            | Resp::PresenceHint(_)
            | Resp::ThinkingDelta(_)
            | Resp::TextDelta(_) => before_request += 1,
            Resp::TurnComplete(done) if done.stop_reason == "end_turn" => return Ok(samples),
            Resp::TurnComplete(done) => bail!("the turn ended with {}", done.stop_reason),
            _ => {}
        }
    }
}

/// The echo's `n` steps: ToolResult sent -> next ToolRequest received
/// (past whatever the echo sends before it).
async fn echo_steps(stream: &mut SessionStream, n: usize) -> Result<Samples> {
    let mut samples = Samples::default();
    stream.send(user("go")).await?;
    let mut request = next_tool_request(stream).await?;
    for _ in 0..n {
        let result = tool_result(&request.tool_call_id, "ok");
        let at = Instant::now();
        stream.send(result).await?;
        request = next_tool_request(stream).await?;
        samples.push(at.elapsed());
    }
    stream
        .send(tool_result(&request.tool_call_id, END_TURN))
        .await?;
    match stream.next().await? {
        Resp::TurnComplete(_) => Ok(samples),
        other => bail!("expected the echo's TurnComplete, got {other:?}"),
    }
}

async fn next_tool_request(stream: &mut SessionStream) -> Result<proto::ToolRequest> {
    loop {
        match stream.next().await? {
            Resp::ToolRequest(request) => return Ok(request),
            Resp::ActivityUpdate(_) | Resp::ThinkingDelta(_) | Resp::TextDelta(_) => {}
            other => bail!("the echo did not answer with a ToolRequest: {other:?}"),
        }
    }
}

/// Measurement 1, against two floors: the bare echo (one message per
/// step), and the echo of the same messages rozd sends per step, which
/// tells the protocol's share of the step from the session's.
pub async fn tool_steps(scale: &Scale) -> Result<Vec<Group>> {
    let daemon = Daemon::builtin().await?;
    let echo = start_echo(Echo::default()).await?;
    let same = start_echo(Echo {
        same_messages: true,
        ..Echo::default()
    })
    .await?;
    let mut rozd_client = connect(daemon.addr).await?;
    let mut echo_client = connect(echo.addr).await?;
    let mut same_client = connect(same.addr).await?;
    let (mut rozd, mut floor, mut same_floor) =
        (Samples::default(), Samples::default(), Samples::default());
    // Session 0 warms them up and is not counted. rozd and the echoes take
    // turns, so all see the same moments of a noisy machine.
    for session in 0..=scale.step_sessions {
        let mut rozd_session = SessionStream::start(&mut rozd_client, vec![step_tool()]).await?;
        let mut echo_stream = SessionStream::start(&mut echo_client, vec![]).await?;
        let mut same_stream = SessionStream::start(&mut same_client, vec![]).await?;
        for _ in 0..scale.step_turns {
            let r = rozd_steps(&mut rozd_session, scale.step_calls).await?;
            let f = echo_steps(&mut echo_stream, scale.step_calls - 1).await?;
            let s = echo_steps(&mut same_stream, scale.step_calls - 1).await?;
            if session > 0 {
                rozd.extend(r);
                floor.extend(f);
                same_floor.extend(s);
            }
        }
        rozd_session.close().await?;
        echo_stream.close().await?;
        same_stream.close().await?;
    }
    daemon.shutdown().await?;
    let name = format!(
        "client tool step, ToolResult -> next ToolRequest ({} calls/turn, built-in host, ooda_re_act)",
        scale.step_calls
    );
    let mut bare = Group::new(
        "1. tool step overhead",
        "a bare tonic bidi echo of the same roz.v1 messages on the same runtime \
         (ToolResult in, ToolRequest out, no session behind it)",
    );
    bare.latencies("step", &name, &rozd, &floor, &[P50, P99, P999]);
    let mut protocol = Group::new(
        "1. tool step overhead",
        "the same echo sending, before each ToolRequest, the four messages rozd sends in a \
         step (the new cycle's and the tool call's ActivityUpdate, the model's ThinkingDelta \
         and TextDelta): the protocol's share of the step, without a session",
    );
    protocol.latencies(
        "step_same_messages",
        &format!("{name}, against the echo of the same messages"),
        &rozd,
        &same_floor,
        &[P50, P99],
    );
    Ok(vec![bare, protocol])
}

// ------------------------------------------------------------------ concurrency

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Rozd,
    Echo,
}

/// One turn with one client tool call; its latency (UserMessage sent ->
/// TurnComplete received).
pub async fn one_turn(stream: &mut SessionStream, target: Target) -> Result<Duration> {
    let start = Instant::now();
    match target {
        Target::Rozd => {
            stream.send(user(&steps_prompt(1))).await?;
            let request = stream.tool_request().await?;
            stream
                .send(tool_result(&request.tool_call_id, "ok"))
                .await?;
            stream.turn_complete().await?;
        }
        Target::Echo => {
            stream.send(user("go")).await?;
            let Resp::ToolRequest(request) = stream.next().await? else {
                bail!("expected the echo's ToolRequest");
            };
            stream
                .send(tool_result(&request.tool_call_id, END_TURN))
                .await?;
            let Resp::TurnComplete(_) = stream.next().await? else {
                bail!("expected the echo's TurnComplete");
            };
        }
    }
    Ok(start.elapsed())
}

async fn open(client: &mut AgentServiceClient<Channel>, target: Target) -> Result<SessionStream> {
    let tools = match target {
        Target::Rozd => vec![step_tool()],
        Target::Echo => vec![],
    };
    SessionStream::start(client, tools).await
}

pub struct Load {
    pub turns: usize,
    latencies: Samples,
    cpu: Duration,
    elapsed: Duration,
}

/// `n` sessions, each running turns back to back for `duration`; a session
/// is replaced by a new one after `turns_per_session` turns (so no
/// conversation grows without bound, as in a real deployment).
pub async fn load(
    addr: SocketAddr,
    target: Target,
    n: usize,
    duration: Duration,
    turns_per_session: usize,
) -> Result<Load> {
    let mut clients = Vec::new();
    for _ in 0..n.div_ceil(SESSIONS_PER_CONNECTION) {
        clients.push(connect(addr).await?);
    }
    let mut streams = Vec::with_capacity(n);
    for i in 0..n {
        let client = &mut clients[i / SESSIONS_PER_CONNECTION];
        let mut stream = open(client, target).await?;
        one_turn(&mut stream, target).await?; // warm-up, not counted
        streams.push(stream);
    }
    let (go_tx, go_rx) = tokio::sync::watch::channel(None::<Instant>);
    let mut tasks = tokio::task::JoinSet::new();
    for (i, mut stream) in streams.into_iter().enumerate() {
        let mut go = go_rx.clone();
        let mut client = clients[i / SESSIONS_PER_CONNECTION].clone();
        tasks.spawn(async move {
            let start = go
                .wait_for(Option::is_some)
                .await?
                .unwrap_or_else(Instant::now);
            let deadline = start + duration;
            let mut latencies = Samples::default();
            let mut in_session = 1;
            while Instant::now() < deadline {
                if in_session == turns_per_session {
                    stream.close().await?;
                    stream = open(&mut client, target).await?;
                    in_session = 0;
                }
                let latency = one_turn(&mut stream, target).await?;
                in_session += 1;
                if Instant::now() <= deadline {
                    latencies.push(latency);
                }
            }
            stream.close().await?;
            anyhow::Ok(latencies)
        });
    }
    let cpu_before = process_cpu();
    go_tx.send_replace(Some(Instant::now()));
    let mut latencies = Samples::default();
    while let Some(joined) = tasks.join_next().await {
        latencies.extend(joined??);
    }
    // Only turns that ended within the window count; the window is the same
    // for every session.
    let cpu = process_cpu().saturating_sub(cpu_before);
    Ok(Load {
        turns: latencies.len(),
        latencies,
        cpu,
        elapsed: duration,
    })
}

/// CPU time (user + system) this process used so far.
pub fn process_cpu() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return Duration::ZERO;
    };
    // Fields after the command name (which may contain spaces): utime is
    // the 14th field of the line, stime the 15th, in clock ticks.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // USER_HZ is 100 on Linux for every architecture rozd runs on.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

pub async fn concurrency(scale: &Scale) -> Result<Group> {
    let daemon = Daemon::builtin().await?;
    let echo = start_echo(Echo::default()).await?;
    let mut group = Group::new(
        "2. concurrency",
        "the same number of bare tonic echo streams doing the same two round trips per turn",
    );
    for &n in &scale.sessions {
        let rozd = load(daemon.addr, Target::Rozd, n, scale.load_for, 25).await?;
        let floor = load(echo.addr, Target::Echo, n, scale.load_for, 25).await?;
        let rate = |l: &Load| l.turns as f64 / l.elapsed.as_secs_f64();
        let samples = (rozd.turns, floor.turns);
        group.add(
            &format!("concurrency.{n}.turns_per_s"),
            &format!("{n} sessions: turns/s (one client tool call per turn)"),
            "turns/s",
            Better::Higher,
            rate(&rozd),
            Some(rate(&floor)),
            samples,
        );
        group.add(
            &format!("concurrency.{n}.turn_p99_us"),
            &format!("{n} sessions: turn latency p99"),
            "µs",
            Better::Lower,
            rozd.latencies.percentile(0.99),
            Some(floor.latencies.percentile(0.99)),
            samples,
        );
        let per_turn = |l: &Load| l.cpu.as_secs_f64() * 1e6 / l.turns.max(1) as f64;
        group.add(
            &format!("concurrency.{n}.cpu_per_turn_us"),
            &format!("{n} sessions: CPU per turn (client and server in this process)"),
            "µs",
            Better::Lower,
            per_turn(&rozd),
            Some(per_turn(&floor)),
            samples,
        );
    }
    daemon.shutdown().await?;
    Ok(group)
}
