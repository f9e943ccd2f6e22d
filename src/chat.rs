//! `rozd chat`: a terminal client for one agent session on a running daemon.
//!
//! It speaks the public `roz.v1` gRPC API like any other client: it opens
//! `StreamSession`, sends `StartSession`, then turns stdin lines into
//! `UserMessage`s and renders the response stream — text on stdout, thinking
//! dimmed (or on stderr when stdout is not a terminal), activity, presence,
//! errors and each turn's stop line on stderr.
//!
//! The client offers the model one tool, `shell`. With `--allow-shell` it is a
//! PHYSICAL tool (so the daemon asks for approval first, by default) that runs
//! `sh -c <command>` here under the request's deadline. Without it, `shell` is
//! registered as a PURE stub that runs nothing and answers every call with a
//! refusal, so the model can tell the user how to enable it.
//!
//! Ctrl-C during a turn sends `CancelTurn`; a second Ctrl-C, Ctrl-C while
//! idle, or end of input sends `CancelSession`, and the client exits once the
//! daemon has closed the stream. See [`EXIT_STATUS_HELP`] for exit codes.

use std::io::{IsTerminal as _, Write as _};
use std::pin::Pin;
use std::process::Stdio;
use std::time::{Duration, Instant};

use prost_types::value::Kind;
use serde_json::json;
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncReadExt as _, BufReader};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::api::convert::json_to_struct;
use crate::api::proto::{
    self, agent_service_client::AgentServiceClient, session_request::Request as Req,
    session_response::Response as Resp,
};

/// Exit statuses of `rozd chat`.
pub mod exit {
    /// The turn ended with `end_turn`; interactively: the session ended normally.
    pub const OK: u8 = 0;
    /// The session stream broke or the daemon closed it unasked; stdin unreadable.
    pub const FAILURE: u8 = 1;
    /// No session could be opened: cannot connect, the daemon refused the
    /// stream (e.g. unauthenticated), or invalid arguments.
    pub const UNREACHABLE: u8 = 2;
    /// The turn was cancelled (`stop: cancelled`, e.g. by Ctrl-C).
    pub const CANCELLED: u8 = 3;
    /// The turn hit a limit (`max_tokens` or `max_cycles`).
    pub const LIMIT: u8 = 4;
    /// The turn failed (`stop: error`, or a non-retryable `SessionError`
    /// during it), or the daemon refused `StartSession`.
    pub const ERROR: u8 = 5;
    /// Ctrl-C while the session was still starting, or again while closing.
    pub const INTERRUPTED: u8 = 130;
}

/// The exit-status table, as `rozd chat --help` prints it.
pub const EXIT_STATUS_HELP: &str = "\
Exit status (the last turn's outcome with --prompt):
  0    end_turn; interactively: the session ended (EOF, Ctrl-C)
  1    the session stream broke or the daemon closed it
  2    cannot connect / the daemon refused the stream (e.g. bad token), bad arguments
  3    the turn was cancelled (stop: cancelled)
  4    the turn hit a limit (stop: max_tokens or max_cycles)
  5    the turn failed (stop: error, or a non-retryable SessionError),
       or the daemon refused StartSession (e.g. host_not_found)
  130  Ctrl-C while the session was starting, or again while it was closing";

/// The tool this client offers the model.
pub const SHELL_TOOL: &str = "shell";
/// What a `shell` call answers when the client was started without `--allow-shell`.
pub const REFUSAL: &str = "rozd chat executes no tools (start it with --allow-shell)";
/// `shell`'s declared timeout, and the one used when a request carries none.
const SHELL_TIMEOUT_MS: u32 = 30_000;
/// Most bytes of command output returned to the model.
const SHELL_OUTPUT_MAX: usize = 64 * 1024;
/// How long to wait for the daemon to close the stream after `CancelSession`.
const CLOSE_WITHIN: Duration = Duration::from_secs(15);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";

/// What `rozd chat` was asked to do.
#[derive(Debug, Clone, Default)]
pub struct ChatOptions {
    /// `host:port` or `http://host:port`.
    pub addr: String,
    pub token: Option<String>,
    pub model: Option<String>,
    pub host_id: Option<String>,
    pub environment: Option<String>,
    /// Run this one turn, then end the session.
    pub prompt: Option<String>,
    pub allow_shell: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("invalid address {0:?}: expected host:port or http://host:port")]
    Address(String),
    #[error("the token cannot be sent: it must be printable ASCII")]
    Token,
    #[error("--prompt must not be empty")]
    EmptyPrompt,
    #[error("cannot connect to {addr}: {reason}")]
    Connect { addr: String, reason: String },
    #[error("{addr} refused the session stream: {reason}")]
    Open { addr: String, reason: String },
    #[error("the daemon refused to start the session ({code}: {message})")]
    Refused { code: String, message: String },
    #[error("the session stream failed: {0}")]
    Stream(String),
    #[error("the daemon closed the session stream")]
    Closed,
    #[error("cannot read stdin: {0}")]
    Stdin(#[source] std::io::Error),
    #[error("cannot listen for Ctrl-C: {0}")]
    Signal(#[source] std::io::Error),
}

impl ChatError {
    /// The process exit status for this error (see [`exit`]).
    pub fn exit_code(&self) -> u8 {
        match self {
            ChatError::Address(_)
            | ChatError::Token
            | ChatError::EmptyPrompt
            | ChatError::Connect { .. }
            | ChatError::Open { .. } => exit::UNREACHABLE,
            ChatError::Refused { .. } => exit::ERROR,
            ChatError::Stream(_)
            | ChatError::Closed
            | ChatError::Stdin(_)
            | ChatError::Signal(_) => exit::FAILURE,
        }
    }
}

/// The exit status a finished turn maps to.
pub fn turn_exit_code(stop_reason: &str, failed: bool) -> u8 {
    if failed {
        return exit::ERROR;
    }
    match stop_reason {
        "end_turn" => exit::OK,
        "cancelled" => exit::CANCELLED,
        "max_tokens" | "max_cycles" => exit::LIMIT,
        _ => exit::ERROR,
    }
}

/// Sends `authorization: Bearer <token>` with every call when a token is set.
#[derive(Clone)]
struct Bearer(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

type Client = AgentServiceClient<InterceptedService<Channel, Bearer>>;

/// Runs the client until the session ends; returns the exit status.
pub async fn run(options: ChatOptions) -> Result<u8, ChatError> {
    if options
        .prompt
        .as_deref()
        .is_some_and(|p| p.trim().is_empty())
    {
        return Err(ChatError::EmptyPrompt);
    }
    let authority = crate::client::authority(&options.addr)
        .map_err(|_| ChatError::Address(options.addr.clone()))?;
    let bearer = match options.token.as_deref() {
        Some(token) => {
            Some(MetadataValue::try_from(format!("Bearer {token}")).map_err(|_| ChatError::Token)?)
        }
        None => None,
    };
    // Listen before anything can start a turn, so no Ctrl-C is missed; the
    // signal stream also keeps a Ctrl-C that arrives between two polls.
    let mut sigint = signal(SignalKind::interrupt()).map_err(ChatError::Signal)?;
    let mut client = connect(&authority, bearer).await?;

    let (tx, rx) = mpsc::channel(32);
    let start = proto::StartSession {
        environment_id: options.environment.clone().unwrap_or_default(),
        host_id: options.host_id.clone(),
        model: options.model.clone(),
        tools: vec![shell_schema(options.allow_shell)],
        ..Default::default()
    };
    // Queued before the call, so it leaves with the stream's first frame.
    tx.send(request(Req::Start(start)))
        .await
        .map_err(|_| ChatError::Closed)?;
    let mut responses = client
        .stream_session(ReceiverStream::new(rx))
        .await
        .map_err(|status| ChatError::Open {
            addr: authority.clone(),
            reason: status_text(&status),
        })?
        .into_inner();

    let mut chat = Chat::new(options, authority, tx);
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    loop {
        let want_stdin = chat.wants_stdin();
        tokio::select! {
            message = responses.message() => match message {
                Ok(Some(message)) => {
                    if let Some(response) = message.response {
                        chat.on_response(response).await?;
                    }
                }
                Ok(None) if chat.phase == Phase::Closing => return Ok(chat.exit),
                Ok(None) => return Err(ChatError::Closed),
                // Once the session has ended the daemon may reset the stream.
                Err(_) if chat.phase == Phase::Closing => return Ok(chat.exit),
                Err(status) => return Err(ChatError::Stream(status_text(&status))),
            },
            line = lines.next_line(), if want_stdin => {
                chat.on_line(line.map_err(ChatError::Stdin)?).await?;
            }
            Some(joined) = chat.tools.join_next(), if !chat.tools.is_empty() => {
                // An aborted call (its turn ended) has no result to send.
                if let Ok(result) = joined {
                    chat.out.status(&tool_summary(&result));
                    chat.send(Req::ToolResult(result)).await?;
                }
            }
            _ = sigint.recv() => chat.on_interrupt().await?,
            () = closing(&mut chat.close_timer) => {
                chat.out.status("rozd chat: the daemon did not close the session in time");
                return Ok(chat.exit);
            }
        }
        if let Some(code) = chat.done {
            return Ok(code);
        }
    }
}

async fn connect(
    authority: &str,
    bearer: Option<MetadataValue<Ascii>>,
) -> Result<Client, ChatError> {
    let endpoint = Endpoint::from_shared(format!("http://{authority}"))
        .map_err(|_| ChatError::Address(authority.to_string()))?
        .connect_timeout(CONNECT_TIMEOUT);
    let channel = endpoint.connect().await.map_err(|e| ChatError::Connect {
        addr: authority.to_string(),
        reason: error_chain(&e),
    })?;
    Ok(AgentServiceClient::with_interceptor(
        channel,
        Bearer(bearer),
    ))
}

/// Resolves when the close timer fires; never when there is none.
async fn closing(timer: &mut Option<Pin<Box<tokio::time::Sleep>>>) {
    match timer {
        Some(sleep) => sleep.as_mut().await,
        None => std::future::pending().await,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// `StartSession` sent, no `SessionStarted` yet.
    Starting,
    /// Waiting for the user's next message.
    Idle,
    /// A turn is running; `cancel_sent` once `CancelTurn` went out.
    Turn { cancel_sent: bool },
    /// `CancelSession` sent; waiting for the daemon to close the stream.
    Closing,
}

struct Chat {
    options: ChatOptions,
    authority: String,
    tx: mpsc::Sender<proto::SessionRequest>,
    out: Printer,
    phase: Phase,
    stdin_tty: bool,
    stdin_eof: bool,
    /// The tool call whose approval the next stdin line answers.
    pending_approval: Option<String>,
    /// A non-retryable `SessionError` arrived during the running turn.
    turn_failed: bool,
    /// Running tool calls; replaced (which aborts them) when a turn ends.
    tools: JoinSet<proto::ToolResult>,
    last_presence: Option<String>,
    close_timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Exit status once the stream closes.
    exit: u8,
    /// Set to exit at once with this status.
    done: Option<u8>,
}

impl Chat {
    fn new(
        options: ChatOptions,
        authority: String,
        tx: mpsc::Sender<proto::SessionRequest>,
    ) -> Chat {
        Chat {
            options,
            authority,
            tx,
            out: Printer::new(std::io::stdout().is_terminal()),
            phase: Phase::Starting,
            stdin_tty: std::io::stdin().is_terminal(),
            stdin_eof: false,
            pending_approval: None,
            turn_failed: false,
            tools: JoinSet::new(),
            last_presence: None,
            close_timer: None,
            exit: exit::OK,
            done: None,
        }
    }

    fn interactive(&self) -> bool {
        self.options.prompt.is_none()
    }

    /// stdin is read only for an approval, or between turns interactively.
    fn wants_stdin(&self) -> bool {
        !self.stdin_eof
            && (self.pending_approval.is_some()
                || (self.phase == Phase::Idle && self.interactive()))
    }

    async fn send(&self, request_body: Req) -> Result<(), ChatError> {
        self.tx
            .send(request(request_body))
            .await
            .map_err(|_| ChatError::Closed)
    }

    async fn close(&mut self, reason: &str) -> Result<(), ChatError> {
        self.pending_approval = None;
        self.send(Req::CancelSession(proto::CancelSession {
            reason: reason.to_string(),
        }))
        .await?;
        self.phase = Phase::Closing;
        self.close_timer = Some(Box::pin(tokio::time::sleep(CLOSE_WITHIN)));
        Ok(())
    }

    fn show_prompt(&mut self) {
        if self.interactive() && self.stdin_tty && self.phase == Phase::Idle {
            self.out.prompt("> ");
        }
    }

    async fn start_turn(&mut self, content: String) -> Result<(), ChatError> {
        self.send(Req::UserMessage(proto::UserMessage {
            content,
            ..Default::default()
        }))
        .await?;
        self.phase = Phase::Turn { cancel_sent: false };
        self.turn_failed = false;
        Ok(())
    }

    async fn on_response(&mut self, response: Resp) -> Result<(), ChatError> {
        match response {
            Resp::SessionStarted(started) => {
                if self.phase != Phase::Starting {
                    return Ok(());
                }
                self.out.status(&format!(
                    "rozd chat: session {} on {}, model {}",
                    started.session_id, self.authority, started.model
                ));
                if self.options.allow_shell {
                    self.out.status(
                        "shell tool enabled: the model may run `sh -c` commands here; you approve each one",
                    );
                }
                match self.options.prompt.clone() {
                    Some(prompt) => self.start_turn(prompt).await?,
                    None => {
                        self.out.status(
                            "type a message and press Enter; Ctrl-C cancels a turn, Ctrl-D ends the session",
                        );
                        self.phase = Phase::Idle;
                        self.show_prompt();
                    }
                }
            }
            Resp::TextDelta(delta) => self.out.text(&delta.content),
            Resp::ThinkingDelta(delta) => self.out.thinking(&delta.content),
            Resp::ToolRequest(call) => self.on_tool_request(call),
            Resp::TurnComplete(done) => self.on_turn_complete(done).await?,
            Resp::Error(error) => {
                if self.phase == Phase::Starting {
                    self.out
                        .status(&format!("error {}: {}", error.code, error.message));
                    return Err(ChatError::Refused {
                        code: error.code,
                        message: error.message,
                    });
                }
                let retry = if error.retryable { " (retryable)" } else { "" };
                self.out
                    .status(&format!("error {}: {}{retry}", error.code, error.message));
                if matches!(self.phase, Phase::Turn { .. }) && !error.retryable {
                    self.turn_failed = true;
                }
            }
            Resp::ActivityUpdate(activity) => self.on_activity(activity),
            Resp::PresenceHint(hint) => {
                if self.last_presence.as_deref() != Some(hint.level.as_str()) {
                    self.out
                        .status(&format!("[presence {}: {}]", hint.level, hint.reason));
                    self.last_presence = Some(hint.level);
                }
            }
            Resp::ContextCompacted(c) => self.out.status(&format!(
                "[context compacted ({}): {} -> {} messages, {} -> {} tokens]",
                c.level, c.messages_before, c.messages_after, c.tokens_before, c.tokens_after
            )),
            Resp::Keepalive(_) | Resp::Pong(_) => {}
        }
        Ok(())
    }

    fn on_activity(&mut self, activity: proto::ActivityUpdate) {
        // A new model call or tool call: the answer so far is a paragraph.
        self.out.break_text();
        match activity.state.as_str() {
            "idle" => {}
            "waiting_approval" if matches!(self.phase, Phase::Turn { .. }) => {
                self.out
                    .status(&format!("approve tool call {}? [y/N]", activity.detail));
                self.pending_approval = Some(activity.detail);
            }
            state => {
                let mut line = format!("[{state}");
                if !activity.detail.is_empty() {
                    line.push(' ');
                    line.push_str(&activity.detail);
                }
                if let Some(progress) = activity.progress {
                    line.push_str(&format!(" {:.0}%", progress * 100.0));
                }
                line.push(']');
                self.out.status(&line);
            }
        }
    }

    fn on_tool_request(&mut self, call: proto::ToolRequest) {
        if !matches!(self.phase, Phase::Turn { .. }) {
            return;
        }
        let allow = self.options.allow_shell;
        if allow && call.tool_name == SHELL_TOOL {
            if let Some(command) = string_param(call.parameters.as_ref(), "command") {
                self.out.status(&format!("[shell $ {command}]"));
            }
        } else {
            self.out.status(&format!(
                "[refusing tool call {} ({})]",
                call.tool_call_id, call.tool_name
            ));
        }
        self.tools.spawn(run_tool(call, allow));
    }

    async fn on_turn_complete(&mut self, done: proto::TurnComplete) -> Result<(), ChatError> {
        self.out.end_turn();
        let usage = done.usage.unwrap_or_default();
        self.out.status(&format!(
            "stop: {}, tokens in/out {}/{}",
            done.stop_reason, usage.input_tokens, usage.output_tokens
        ));
        // Dropping the set aborts (and kills) tool calls the turn left behind.
        self.tools = JoinSet::new();
        self.pending_approval = None;
        let code = turn_exit_code(&done.stop_reason, self.turn_failed);
        self.turn_failed = false;
        match self.phase {
            Phase::Turn { .. } if !self.interactive() => {
                self.exit = code;
                self.close("prompt answered").await?;
            }
            Phase::Turn { .. } => {
                self.phase = Phase::Idle;
                self.show_prompt();
            }
            // The daemon reports the turn it cancelled while closing.
            Phase::Closing if !self.interactive() => self.exit = code,
            _ => {}
        }
        Ok(())
    }

    async fn on_line(&mut self, line: Option<String>) -> Result<(), ChatError> {
        let Some(line) = line else {
            self.stdin_eof = true;
            if let Some(id) = self.pending_approval.take() {
                self.out
                    .status(&format!("[end of input: tool call {id} denied]"));
                return self.decide(id, false).await;
            }
            if self.phase == Phase::Idle {
                self.out.abandon_prompt();
                return self.close("end of input").await;
            }
            return Ok(());
        };
        self.out.end_prompt();
        if let Some(id) = self.pending_approval.take() {
            let answer = line.trim().to_ascii_lowercase();
            let approved = answer == "y" || answer == "yes";
            return self.decide(id, approved).await;
        }
        if self.phase != Phase::Idle {
            return Ok(());
        }
        let content = line.trim_end().to_string();
        if content.trim().is_empty() {
            self.show_prompt();
            return Ok(());
        }
        self.start_turn(content).await
    }

    async fn decide(&mut self, tool_call_id: String, approved: bool) -> Result<(), ChatError> {
        self.out.status(&format!(
            "[{} {tool_call_id}]",
            if approved { "approved" } else { "denied" }
        ));
        self.send(Req::PermissionDecision(proto::PermissionDecision {
            tool_call_id,
            approved,
        }))
        .await
    }

    async fn on_interrupt(&mut self) -> Result<(), ChatError> {
        match self.phase {
            Phase::Starting | Phase::Closing => {
                self.out.status("rozd chat: interrupted");
                self.done = Some(exit::INTERRUPTED);
            }
            Phase::Idle => {
                self.out.abandon_prompt();
                self.close("ctrl-c").await?;
            }
            Phase::Turn { cancel_sent: false } => {
                self.pending_approval = None;
                self.send(Req::CancelTurn(proto::CancelTurn {
                    reason: "ctrl-c".into(),
                }))
                .await?;
                self.phase = Phase::Turn { cancel_sent: true };
                self.out
                    .status("[cancelling the turn; Ctrl-C again ends the session]");
            }
            Phase::Turn { cancel_sent: true } => self.close("ctrl-c").await?,
        }
        Ok(())
    }
}

fn request(body: Req) -> proto::SessionRequest {
    proto::SessionRequest {
        request: Some(body),
    }
}

/// The `shell` tool: live with `--allow-shell`, else a PURE stub that runs nothing.
fn shell_schema(allow_shell: bool) -> proto::ToolSchema {
    let (description, category) = if allow_shell {
        (
            "Runs a command with `sh -c` on the machine where `rozd chat` runs (each call \
             needs the user's approval) and returns its stdout and stderr, at most 64 KiB, \
             and its exit code.",
            proto::ToolCategoryHint::ToolCategoryPhysical,
        )
    } else {
        (
            "Disabled: this `rozd chat` was started without --allow-shell, so it runs no \
             commands and refuses every call.",
            proto::ToolCategoryHint::ToolCategoryPure,
        )
    };
    proto::ToolSchema {
        name: SHELL_TOOL.into(),
        description: description.into(),
        parameters_schema: Some(json_to_struct(&json!({
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        }))),
        timeout_ms: SHELL_TIMEOUT_MS,
        category: category as i32,
    }
}

fn string_param(parameters: Option<&prost_types::Struct>, name: &str) -> Option<String> {
    match parameters?.fields.get(name)?.kind.as_ref()? {
        Kind::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

fn refusal(tool_call_id: String, message: impl Into<String>) -> proto::ToolResult {
    proto::ToolResult {
        tool_call_id,
        success: false,
        result: message.into(),
        ..Default::default()
    }
}

/// Answers one `ToolRequest`.
async fn run_tool(call: proto::ToolRequest, allow_shell: bool) -> proto::ToolResult {
    if !allow_shell {
        return refusal(call.tool_call_id, REFUSAL);
    }
    if call.tool_name != SHELL_TOOL {
        let message = format!("rozd chat has no tool `{}`", call.tool_name);
        return refusal(call.tool_call_id, message);
    }
    let Some(command) = string_param(call.parameters.as_ref(), "command") else {
        return refusal(
            call.tool_call_id,
            "`shell` needs a string parameter `command`",
        );
    };
    let timeout_ms = if call.timeout_ms == 0 {
        SHELL_TIMEOUT_MS
    } else {
        call.timeout_ms
    };
    run_shell(call.tool_call_id, &command, timeout_ms).await
}

/// Runs `sh -c command`, killing it at the deadline.
pub async fn run_shell(tool_call_id: String, command: &str, timeout_ms: u32) -> proto::ToolResult {
    let started = Instant::now();
    let elapsed =
        |started: Instant| i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
    let spawned = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => return refusal(tool_call_id, format!("cannot start sh: {e}")),
    };
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return refusal(tool_call_id, "cannot capture the output of sh");
    };
    let work = async {
        tokio::join!(
            read_capped(stdout, SHELL_OUTPUT_MAX),
            read_capped(stderr, SHELL_OUTPUT_MAX),
            child.wait()
        )
    };
    let limit = Duration::from_millis(u64::from(timeout_ms));
    let ((out, out_cut), (err, err_cut), status) = match tokio::time::timeout(limit, work).await {
        Ok(finished) => finished,
        Err(_) => {
            let _ = child.kill().await;
            return proto::ToolResult {
                tool_call_id,
                success: false,
                result: format!("`{command}` did not finish within {timeout_ms} ms and was killed"),
                duration_ms: Some(elapsed(started)),
                ..Default::default()
            };
        }
    };
    let status = match status {
        Ok(status) => status,
        Err(e) => return refusal(tool_call_id, format!("cannot wait for sh: {e}")),
    };
    let mut result = String::from_utf8_lossy(&out).into_owned();
    if !err.is_empty() {
        if !result.is_empty() && !result.ends_with('\n') {
            result.push('\n');
        }
        result.push_str(&String::from_utf8_lossy(&err));
    }
    let cut = truncate_utf8(&mut result, SHELL_OUTPUT_MAX);
    let exit_code = status.code();
    if exit_code.is_none() {
        result.push_str("\n(killed by a signal)");
    }
    proto::ToolResult {
        tool_call_id,
        success: exit_code == Some(0),
        result,
        exit_code,
        truncated: out_cut || err_cut || cut,
        duration_ms: Some(elapsed(started)),
    }
}

/// Reads to the end, keeping at most `cap` bytes (and draining the rest so
/// the writer never blocks on a full pipe).
async fn read_capped<R: AsyncRead + Unpin>(mut reader: R, cap: usize) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut truncated = false;
    let mut buf = [0u8; 8192];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = cap.saturating_sub(kept.len());
                if n > room {
                    truncated = true;
                }
                kept.extend(buf.iter().take(n.min(room)));
            }
        }
    }
    (kept, truncated)
}

/// Truncates to at most `max` bytes on a character boundary; true if it cut.
fn truncate_utf8(text: &mut String, max: usize) -> bool {
    if text.len() <= max {
        return false;
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    true
}

fn tool_summary(result: &proto::ToolResult) -> String {
    let mut line = format!("[tool call {} ", result.tool_call_id);
    match (result.exit_code, result.success) {
        (Some(code), _) => line.push_str(&format!("exited {code}")),
        (None, true) => line.push_str("succeeded"),
        (None, false) => line.push_str("failed"),
    }
    if let Some(ms) = result.duration_ms {
        line.push_str(&format!(" in {ms} ms"));
    }
    if result.truncated {
        line.push_str(", output truncated");
    }
    line.push(']');
    line
}

fn status_text(status: &tonic::Status) -> String {
    let code = format!("{:?}", status.code()).to_ascii_lowercase();
    if status.message().is_empty() {
        code
    } else {
        format!("{code}: {}", status.message())
    }
}

/// An error and its sources, `a: b: c`.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let next = e.to_string();
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = e.source();
    }
    text
}

/// Writes to the terminal, keeping stdout's text and stderr's status lines
/// on separate lines. Write errors (a closed pipe) are ignored: there is
/// nowhere left to report them.
struct Printer {
    stdout_tty: bool,
    /// stdout has a line without its newline yet.
    stdout_open: bool,
    /// A thinking block is open (on stdout when a terminal, else stderr).
    thinking_open: bool,
    /// A `> ` prompt is open on stderr.
    prompt_open: bool,
}

impl Printer {
    fn new(stdout_tty: bool) -> Printer {
        Printer {
            stdout_tty,
            stdout_open: false,
            thinking_open: false,
            prompt_open: false,
        }
    }

    fn stdout(text: &str) {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
    }

    fn stderr(text: &str) {
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(text.as_bytes());
        let _ = err.flush();
    }

    fn text(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        self.end_thinking();
        self.end_prompt();
        Self::stdout(text);
        self.stdout_open = !text.ends_with('\n');
    }

    fn thinking(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        self.end_prompt();
        if self.stdout_tty {
            Self::stdout(&format!("{DIM}{text}{RESET}"));
            self.stdout_open = !text.ends_with('\n');
        } else {
            Self::stderr(text);
        }
        self.thinking_open = !text.ends_with('\n');
    }

    fn end_thinking(&mut self) {
        if !self.thinking_open {
            return;
        }
        self.thinking_open = false;
        if self.stdout_tty {
            Self::stdout("\n");
            self.stdout_open = false;
        } else {
            Self::stderr("\n");
        }
    }

    /// One line on stderr, after ending any open line of the same screen.
    fn status(&mut self, line: &str) {
        self.end_thinking();
        self.end_prompt();
        if self.stdout_tty && self.stdout_open {
            Self::stdout("\n");
            self.stdout_open = false;
        }
        Self::stderr(&format!("{line}\n"));
    }

    fn prompt(&mut self, prompt: &str) {
        Self::stderr(prompt);
        self.prompt_open = true;
    }

    /// The user answered the prompt (their newline ended its line).
    fn end_prompt(&mut self) {
        self.prompt_open = false;
    }

    /// The prompt got no line (end of input, Ctrl-C): end its line for them.
    fn abandon_prompt(&mut self) {
        if self.prompt_open {
            Self::stderr("\n");
            self.prompt_open = false;
        }
    }

    /// Ends the open stdout line, so text from the next model call starts
    /// on its own line even when stdout is not a terminal.
    fn break_text(&mut self) {
        self.end_thinking();
        if self.stdout_open {
            Self::stdout("\n");
            self.stdout_open = false;
        }
    }

    fn end_turn(&mut self) {
        self.break_text();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_reasons_map_to_exit_codes() {
        assert_eq!(turn_exit_code("end_turn", false), 0);
        assert_eq!(turn_exit_code("cancelled", false), 3);
        assert_eq!(turn_exit_code("max_tokens", false), 4);
        assert_eq!(turn_exit_code("max_cycles", false), 4);
        assert_eq!(turn_exit_code("error", false), 5);
        assert_eq!(turn_exit_code("end_turn", true), 5);
        assert_eq!(turn_exit_code("something_new", false), 5);
    }

    #[test]
    fn truncation_keeps_whole_characters() {
        let mut s = "aé".repeat(10);
        assert!(truncate_utf8(&mut s, 4));
        assert_eq!(s, "aéa");
        let mut short = "abc".to_string();
        assert!(!truncate_utf8(&mut short, 4));
    }

    #[tokio::test]
    async fn shell_reports_output_exit_code_and_timeout() {
        let ok = run_shell("a".into(), "echo out; echo err >&2", 5000).await;
        assert!(ok.success);
        assert_eq!(ok.exit_code, Some(0));
        assert_eq!(ok.result, "out\nerr\n");
        let failed = run_shell("b".into(), "exit 7", 5000).await;
        assert!(!failed.success);
        assert_eq!(failed.exit_code, Some(7));
        let slow = run_shell("c".into(), "sleep 10", 100).await;
        assert!(!slow.success);
        assert_eq!(slow.exit_code, None);
        assert!(slow.result.contains("was killed"), "{}", slow.result);
        let big = run_shell("d".into(), "head -c 100000 /dev/zero | tr '\\0' x", 5000).await;
        assert!(big.truncated);
        assert_eq!(big.result.len(), SHELL_OUTPUT_MAX);
        assert!(big.success);
    }

    #[tokio::test]
    async fn without_allow_shell_nothing_runs() {
        let call = proto::ToolRequest {
            tool_call_id: "x".into(),
            tool_name: SHELL_TOOL.into(),
            parameters: Some(json_to_struct(&json!({"command": "touch /tmp/never"}))),
            timeout_ms: 1000,
        };
        let result = run_tool(call, false).await;
        assert!(!result.success);
        assert_eq!(result.result, REFUSAL);
    }
}
