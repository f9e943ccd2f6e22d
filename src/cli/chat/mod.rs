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

mod printer;
mod shell;

use std::io::IsTerminal as _;
use std::pin::Pin;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use self::printer::Printer;
pub use self::shell::{REFUSAL, SHELL_TOOL, run_shell};
use self::shell::{run_tool, shell_schema, string_param, tool_summary};
use super::connect::{self, Bearer, ConnectError, SESSION_CONNECT_TIMEOUT};
use crate::proto::{
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

/// How long to wait for the daemon to close the stream after `CancelSession`.
const CLOSE_WITHIN: Duration = Duration::from_secs(15);

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
    /// Show presence hints and the local model's notes (its thinking).
    pub verbose: bool,
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

type Client = AgentServiceClient<InterceptedService<Channel, Bearer>>;

/// Runs the client on its own runtime until the session ends; errors go to
/// stderr. Returns the exit status.
pub fn exec(options: ChatOptions) -> u8 {
    let rt = match super::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rozd chat: {}", super::error_chain(&e));
            return exit::FAILURE;
        }
    };
    let result = rt.block_on(run(options));
    // tokio reads stdin with a blocking read that cannot be cancelled: do not
    // wait for it (or for anything else) before exiting.
    rt.shutdown_background();
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rozd chat: {e}");
            e.exit_code()
        }
    }
}

/// Runs the client until the session ends; returns the exit status.
pub async fn run(options: ChatOptions) -> Result<u8, ChatError> {
    if options
        .prompt
        .as_deref()
        .is_some_and(|p| p.trim().is_empty())
    {
        return Err(ChatError::EmptyPrompt);
    }
    let authority =
        connect::authority(&options.addr).map_err(|_| ChatError::Address(options.addr.clone()))?;
    let bearer = Bearer::new(options.token.as_deref()).map_err(|_| ChatError::Token)?;
    // Listen before anything can start a turn, so no Ctrl-C is missed; the
    // signal stream also keeps a Ctrl-C that arrives between two polls.
    let mut sigint = signal(SignalKind::interrupt()).map_err(ChatError::Signal)?;
    let mut client = connect(&options.addr, bearer).await?;

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

async fn connect(addr: &str, bearer: Bearer) -> Result<Client, ChatError> {
    let channel = connect::channel(addr, SESSION_CONNECT_TIMEOUT)
        .await
        .map_err(|e| match e {
            ConnectError::Connect { addr, source } => ChatError::Connect {
                addr,
                reason: super::distinct_error_chain(&source),
            },
            ConnectError::Tls(reason) => ChatError::Connect {
                addr: addr.to_string(),
                reason: format!("TLS: {reason}"),
            },
            ConnectError::Address(_) | ConnectError::Token => ChatError::Address(addr.to_string()),
        })?;
    Ok(AgentServiceClient::with_interceptor(channel, bearer))
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

/// The first line of a session: which session, on which host (a relayed
/// one named, with the daemon that relays it), which model.
fn banner(session_id: &str, authority: &str, host_id: Option<&str>, model: &str) -> String {
    match host_id.filter(|h| !h.is_empty()) {
        Some(host) => format!(
            "rozd chat: session {session_id} on host {host} (via {authority}), model {model}"
        ),
        None => format!("rozd chat: session {session_id} on {authority}, model {model}"),
    }
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
    /// The session's model is `local`, whose thinking is bookkeeping.
    local_model: bool,
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
            local_model: false,
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
                self.local_model = started.model == crate::model::local::NAME;
                self.out.status(&banner(
                    &started.session_id,
                    &self.authority,
                    self.options.host_id.as_deref(),
                    &started.model,
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
            // The local model's thinking counts commands and calls: for a
            // person only with --verbose.
            Resp::ThinkingDelta(delta) => {
                if self.options.verbose || !self.local_model {
                    self.out.thinking(&delta.content);
                }
            }
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
                if self.options.verbose
                    && self.last_presence.as_deref() != Some(hint.level.as_str())
                {
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
            "stop: {}, tokens in/out {}/{}{}",
            done.stop_reason,
            usage.input_tokens,
            usage.output_tokens,
            if usage.estimated {
                " (estimated: the model server reported no usage)"
            } else {
                ""
            }
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

fn status_text(status: &tonic::Status) -> String {
    let code = format!("{:?}", status.code()).to_ascii_lowercase();
    if status.message().is_empty() {
        code
    } else {
        format!("{code}: {}", status.message())
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
}
