//! `rozd mcp`: an MCP server on stdin/stdout (what Claude Desktop and other
//! stdio clients start) that relays every message to a running daemon's
//! `/mcp`, so the hardware stays owned by the daemon and every call takes
//! the daemon's path (limits, approvals, deadman, audit).
//!
//! It speaks the streamable HTTP transport as a client: each message from
//! stdin is POSTed in the order it arrived (the next one goes once the
//! daemon has taken this one, i.e. once its answer's headers are in), and
//! each answer — JSON or an event stream, which may carry requests to the
//! client such as an approval question before the result — is written to
//! stdout, one JSON-RPC message per line, as it arrives. After the
//! handshake it holds the session's event stream (GET), which is also how
//! the daemon knows the client is there: if this process dies, the stream
//! closes and the daemon drives the session's actuators safe. End of input
//! (or SIGTERM, SIGINT) ends the session (`DELETE /mcp`).
//!
//! When the daemon no longer knows the session (it restarted, or the
//! session idled out), the handshake is replayed once and the message sent
//! again: the client keeps working, with its actuators safe and its
//! subscriptions gone.

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::sync::mpsc;

use crate::model::sse::SseDecoder;

/// How `rozd mcp` reaches the daemon.
#[derive(Debug, Clone)]
pub struct Options {
    /// `host:port`, or a URL (`http://host:port`, optionally ending in `/mcp`).
    pub addr: String,
    pub token: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("invalid address {0:?}: expected host:port or http://host:port")]
    Address(String),
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
    #[error("cannot read stdin: {0}")]
    Stdin(#[source] std::io::Error),
    #[error("cannot write stdout: {0}")]
    Stdout(#[source] std::io::Error),
}

impl ProxyError {
    /// 2: bad arguments; 1: anything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            ProxyError::Address(_) => 2,
            _ => 1,
        }
    }
}

/// The URL of the daemon's MCP endpoint from `--addr`.
pub fn endpoint(addr: &str) -> Result<String, ProxyError> {
    let trimmed = addr.trim().trim_end_matches('/');
    let url = if trimmed.starts_with("http:") || trimmed.starts_with("https:") {
        trimmed.to_string()
    } else if trimmed
        .parse::<http::uri::Authority>()
        .is_ok_and(|a| a.port_u16().is_some())
    {
        format!("http://{trimmed}")
    } else {
        return Err(ProxyError::Address(addr.to_string()));
    };
    let parsed: http::Uri = url
        .parse()
        .map_err(|_| ProxyError::Address(addr.to_string()))?;
    if parsed.scheme().is_none() || parsed.host().is_none_or(str::is_empty) {
        return Err(ProxyError::Address(addr.to_string()));
    }
    Ok(if parsed.path().ends_with("/mcp") {
        url
    } else {
        format!("{url}/mcp")
    })
}

/// `rozd mcp`: runs the proxy; the exit status.
pub fn exec(options: Options) -> u8 {
    let rt = match super::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rozd mcp: {}", super::error_chain(&e));
            return 1;
        }
    };
    let result = rt.block_on(run(options));
    // stdin is read with a blocking read that cannot be cancelled.
    rt.shutdown_background();
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("rozd mcp: {e}");
            e.exit_code()
        }
    }
}

/// Runs the proxy until stdin ends or a termination signal arrives.
pub async fn run(options: Options) -> Result<(), ProxyError> {
    let url = endpoint(&options.addr)?;
    // rustls needs a process-wide provider even for an https URL given later.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("rozd-mcp/", env!("CARGO_PKG_VERSION")));
    if url.starts_with("https:") {
        // The CA and client certificate of --cacert, --cert, --key.
        let tls = super::connect::tls_config(crate::tls::client::ALPN_HTTP1)
            .map_err(|e| ProxyError::Client(e.to_string()))?;
        builder = builder.tls_backend_preconfigured(rustls::ClientConfig::clone(&tls));
    }
    let http = builder
        .build()
        .map_err(|e| ProxyError::Client(e.to_string()))?;
    let (out, lines) = mpsc::unbounded_channel::<String>();
    let writer = tokio::spawn(write_lines(lines));
    let proxy = Arc::new(Proxy {
        http,
        url,
        token: options.token,
        out,
        state: Mutex::default(),
    });
    let read = proxy.clone().relay_stdin().await;
    proxy.end_session().await;
    drop(proxy);
    let written = writer.await.unwrap_or(Ok(()));
    read?;
    written
}

async fn write_lines(mut lines: mpsc::UnboundedReceiver<String>) -> Result<(), ProxyError> {
    let mut stdout = tokio::io::stdout();
    while let Some(mut line) = lines.recv().await {
        line.push('\n');
        stdout
            .write_all(line.as_bytes())
            .await
            .map_err(ProxyError::Stdout)?;
        stdout.flush().await.map_err(ProxyError::Stdout)?;
    }
    Ok(())
}

#[derive(Debug, Default)]
struct State {
    session: Option<String>,
    protocol_version: Option<String>,
    /// The client's `initialize`, replayed when the daemon lost the session.
    initialize: Option<Value>,
    /// The session's event stream (GET).
    events: Option<tokio::task::JoinHandle<()>>,
}

struct Proxy {
    http: reqwest::Client,
    url: String,
    token: Option<String>,
    out: mpsc::UnboundedSender<String>,
    state: Mutex<State>,
}

/// What a POST got.
enum Posted {
    Answer(reqwest::Response),
    /// An HTTP error whose body is a JSON-RPC answer (e.g. an unsupported
    /// protocol version, with the versions that are): relayed as it is.
    Rejected(Value),
    /// The daemon does not know the session (HTTP 404 with a session id).
    SessionGone,
    /// No answer or an HTTP error; the text says which.
    Failed(String),
}

impl Proxy {
    fn state(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
    }

    fn emit(&self, message: &Value) {
        // The writer ends only with the process.
        let _ = self.out.send(message.to_string());
    }

    /// A JSON-RPC error answer to request `id` (nothing for a notification).
    fn fail(&self, id: Option<&Value>, message: &str) {
        eprintln!("rozd mcp: {message}");
        if let Some(id) = id {
            self.emit(&json!({
                "jsonrpc": "2.0",
                "id": id,
                "error": {"code": -32603, "message": format!("rozd mcp: {message}")}
            }));
        }
    }

    async fn relay_stdin(self: Arc<Self>) -> Result<(), ProxyError> {
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        let mut terminate = signal(tokio::signal::unix::SignalKind::terminate());
        let mut interrupt = signal(tokio::signal::unix::SignalKind::interrupt());
        loop {
            let line = tokio::select! {
                line = lines.next_line() => line.map_err(ProxyError::Stdin)?,
                () = recv(&mut terminate) => return Ok(()),
                () = recv(&mut interrupt) => return Ok(()),
            };
            let Some(line) = line else { return Ok(()) };
            if line.trim().is_empty() {
                continue;
            }
            let message: Value = match serde_json::from_str(&line) {
                Ok(message) => message,
                Err(e) => {
                    eprintln!("rozd mcp: a line on stdin is not JSON: {e}");
                    self.emit(&json!({
                        "jsonrpc": "2.0",
                        "id": null,
                        "error": {"code": -32700, "message": format!("parse error: {e}")}
                    }));
                    continue;
                }
            };
            self.clone().relay(message).await;
        }
    }

    /// Sends one message from the client; its answer is relayed by a task
    /// of its own, so that a call waiting for approval holds nothing up.
    async fn relay(self: Arc<Self>, message: Value) {
        let id = message.get("id").cloned();
        let method = message
            .get("method")
            .and_then(Value::as_str)
            .map(str::to_string);
        let is_request = id.is_some() && method.is_some();
        if method.as_deref() == Some("initialize") && is_request {
            self.initialize(message).await;
            return;
        }
        let mut posted = self.post(&message).await;
        if matches!(posted, Posted::SessionGone) {
            eprintln!(
                "rozd mcp: the daemon no longer knows this MCP session (it restarted, or the \
                 session was idle); starting a new one (actuators it commanded went safe; \
                 subscriptions are gone)"
            );
            posted = if self.reinitialize().await {
                self.post(&message).await
            } else {
                Posted::Failed("cannot start a new MCP session".into())
            };
        }
        match posted {
            Posted::Answer(response) => {
                let me = self.clone();
                tokio::spawn(async move {
                    me.relay_answer(response, is_request.then_some(id).flatten())
                        .await;
                });
            }
            Posted::Rejected(answer) => self.emit(&answer),
            Posted::SessionGone => {
                self.fail(id.as_ref().filter(|_| is_request), "the MCP session ended")
            }
            Posted::Failed(why) => self.fail(id.as_ref().filter(|_| is_request), &why),
        }
        if method.as_deref() == Some("notifications/initialized") {
            self.open_events();
        }
    }

    async fn post(&self, message: &Value) -> Posted {
        let (session, version) = {
            let state = self.state();
            (state.session.clone(), state.protocol_version.clone())
        };
        let mut request = self
            .http
            .post(&self.url)
            .header(http::header::ACCEPT, "application/json, text/event-stream")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(message.to_string());
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(session) = &session {
            request = request.header("mcp-session-id", session);
        }
        for (name, value) in message_headers(message, version.as_deref()) {
            request = request.header(name, value);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) => return Posted::Failed(format!("cannot reach rozd at {}: {e}", self.url)),
        };
        let status = response.status();
        if status == http::StatusCode::NOT_FOUND && session.is_some() {
            return Posted::SessionGone;
        }
        if status.is_success() {
            return Posted::Answer(response);
        }
        let body = response.text().await.unwrap_or_default();
        if let Ok(answer) = serde_json::from_str::<Value>(&body)
            && answer.get("jsonrpc").is_some()
        {
            return Posted::Rejected(answer);
        }
        Posted::Failed(match status {
            http::StatusCode::UNAUTHORIZED => format!(
                "rozd refused the token (HTTP 401: {}); give it with --token or $ROZD_TOKEN",
                body.trim()
            ),
            _ => format!("rozd answered HTTP {status}: {}", body.trim()),
        })
    }

    /// The handshake: inline, so that nothing is sent before the session exists.
    async fn initialize(&self, message: Value) {
        let id = message.get("id").cloned();
        // A second initialize starts over: the daemon gets a new session.
        self.end_session().await;
        match self.post(&message).await {
            Posted::Answer(response) => {
                let session = session_header(&response);
                {
                    let mut state = self.state();
                    state.session = session;
                    state.initialize = Some(message);
                }
                if let Some(result) = self.relay_answer(response, id).await {
                    let version = result
                        .pointer("/result/protocolVersion")
                        .and_then(Value::as_str)
                        .map(str::to_string);
                    self.state().protocol_version = version;
                }
            }
            Posted::Rejected(answer) => self.emit(&answer),
            Posted::SessionGone => self.fail(id.as_ref(), "the MCP session ended"),
            Posted::Failed(why) => self.fail(id.as_ref(), &why),
        }
    }

    /// Replays the handshake after the daemon lost the session; whether it worked.
    async fn reinitialize(self: &Arc<Self>) -> bool {
        let Some(mut message) = self.state().initialize.clone() else {
            return false;
        };
        message["id"] = json!("rozd-mcp-reinitialize");
        {
            let mut state = self.state();
            state.session = None;
            if let Some(events) = state.events.take() {
                events.abort();
            }
        }
        let Posted::Answer(response) = self.post(&message).await else {
            return false;
        };
        let session = session_header(&response);
        // The client has had its answer to `initialize` already.
        let _ = response.bytes().await;
        if session.is_none() {
            return false;
        }
        self.state().session = session;
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        if let Posted::Answer(response) = self.post(&initialized).await {
            let _ = response.bytes().await;
            self.open_events();
            true
        } else {
            false
        }
    }

    /// Relays one answer (JSON, or an event stream that ends with it) to
    /// stdout; the message answering `id`, if it came.
    async fn relay_answer(&self, response: reqwest::Response, id: Option<Value>) -> Option<Value> {
        let is_events = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("text/event-stream"));
        let mut answer = None;
        let mut note = |message: Value| {
            if id.is_some() && message.get("id") == id.as_ref() && message.get("method").is_none() {
                answer = Some(message.clone());
            }
            self.emit(&message);
        };
        if is_events {
            let mut decoder = SseDecoder::new();
            let mut body = response.bytes_stream();
            while let Some(chunk) = body.next().await {
                let Ok(chunk) = chunk else { break };
                // Priming events (an id and a retry time) carry no message.
                for event in decoder
                    .push(&chunk)
                    .into_iter()
                    .filter(|e| !e.data.trim().is_empty())
                {
                    match serde_json::from_str::<Value>(&event.data) {
                        Ok(message) => note(message),
                        Err(e) => {
                            eprintln!("rozd mcp: the daemon sent an event that is not JSON: {e}")
                        }
                    }
                }
            }
        } else if let Ok(text) = response.text().await
            && !text.trim().is_empty()
        {
            match serde_json::from_str::<Value>(&text) {
                Ok(message) => note(message),
                Err(e) => {
                    eprintln!("rozd mcp: the daemon answered something that is not JSON: {e}")
                }
            }
        }
        if answer.is_none() && id.is_some() {
            self.fail(
                id.as_ref(),
                "the connection to rozd ended before the answer",
            );
        }
        answer
    }

    /// Holds the session's event stream, reconnecting while the session lasts.
    fn open_events(self: &Arc<Self>) {
        let me = self.clone();
        let task = tokio::spawn(async move { me.events().await });
        if let Some(old) = self.state().events.replace(task) {
            old.abort();
        }
    }

    async fn events(&self) {
        let mut backoff = Duration::from_secs(1);
        loop {
            let (session, version) = {
                let state = self.state();
                (state.session.clone(), state.protocol_version.clone())
            };
            let Some(session) = session else { return };
            let mut request = self
                .http
                .get(&self.url)
                .header(http::header::ACCEPT, "text/event-stream")
                .header("mcp-session-id", &session);
            if let Some(token) = &self.token {
                request = request.bearer_auth(token);
            }
            if let Some(version) = &version {
                request = request.header("mcp-protocol-version", version);
            }
            match request.send().await {
                Ok(response) if response.status().is_success() => {
                    backoff = Duration::from_secs(1);
                    let mut decoder = SseDecoder::new();
                    let mut body = response.bytes_stream();
                    while let Some(Ok(chunk)) = body.next().await {
                        for event in decoder.push(&chunk) {
                            if let Ok(message) = serde_json::from_str::<Value>(&event.data) {
                                self.emit(&message);
                            }
                        }
                    }
                }
                Ok(response) if response.status() == http::StatusCode::METHOD_NOT_ALLOWED => {
                    return;
                }
                Ok(response) if response.status() == http::StatusCode::UNAUTHORIZED => {
                    eprintln!("rozd mcp: rozd refused the token for the event stream (HTTP 401)");
                    return;
                }
                // 404: the session is gone; the next message starts a new one.
                Ok(response) => {
                    eprintln!(
                        "rozd mcp: the event stream was refused (HTTP {})",
                        response.status()
                    );
                }
                Err(e) => eprintln!("rozd mcp: the event stream broke: {e}"),
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(30));
        }
    }

    /// `DELETE /mcp`: the daemon ends the session (its actuators go safe).
    async fn end_session(&self) {
        // The event stream closes after the DELETE: its end alone would
        // count as a client gone rather than a session ended.
        let (session, events) = {
            let mut state = self.state();
            (state.session.take(), state.events.take())
        };
        let _stop_events = events.map(|events| events.abort_handle()).map(AbortOnDrop);
        let Some(session) = session else { return };
        let mut request = self
            .http
            .delete(&self.url)
            .header("mcp-session-id", &session);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        match tokio::time::timeout(Duration::from_secs(5), request.send()).await {
            Ok(Ok(response)) if response.status().is_success() => {}
            Ok(Ok(response)) => eprintln!(
                "rozd mcp: ending the MCP session: HTTP {}",
                response.status()
            ),
            Ok(Err(e)) => eprintln!("rozd mcp: ending the MCP session: {e}"),
            Err(_) => eprintln!("rozd mcp: ending the MCP session: no answer within 5 s"),
        }
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The per-message headers of the streamable HTTP transport: the protocol
/// version (the message's own, from `_meta`, else the negotiated one) and,
/// from 2026-07-28 on, the method and name that intermediaries route on.
fn message_headers(message: &Value, negotiated: Option<&str>) -> Vec<(&'static str, String)> {
    let own = message
        .pointer("/params/_meta/io.modelcontextprotocol~1protocolVersion")
        .and_then(Value::as_str);
    let Some(version) = own.or(negotiated) else {
        return Vec::new();
    };
    let mut headers = vec![("mcp-protocol-version", version.to_string())];
    if version >= "2026-07-28"
        && let Some(method) = message.get("method").and_then(Value::as_str)
    {
        headers.push(("mcp-method", method.to_string()));
        let key = match method {
            "tools/call" | "prompts/get" => Some("name"),
            "resources/read" | "resources/subscribe" | "resources/unsubscribe" => Some("uri"),
            _ => None,
        };
        if let Some(name) = key
            .and_then(|k| message.get("params")?.get(k)?.as_str())
            .filter(|n| n.chars().all(|c| c.is_ascii_graphic()))
        {
            headers.push(("mcp-name", name.to_string()));
        }
    }
    headers
}

fn session_header(response: &reqwest::Response) -> Option<String> {
    response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

fn signal(kind: tokio::signal::unix::SignalKind) -> Option<tokio::signal::unix::Signal> {
    tokio::signal::unix::signal(kind).ok()
}

/// Resolves when the signal arrives; never without a handler.
async fn recv(signal: &mut Option<tokio::signal::unix::Signal>) {
    match signal {
        Some(signal) => {
            signal.recv().await;
        }
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_carries_its_own_protocol_version_and_from_2026_its_method() {
        let discover = json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover",
            "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}});
        assert_eq!(
            message_headers(&discover, Some("2025-11-25")),
            [
                ("mcp-protocol-version", "2026-07-28".to_string()),
                ("mcp-method", "server/discover".to_string())
            ]
        );
        let call =
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "arm"}});
        assert_eq!(
            message_headers(&call, Some("2025-11-25")),
            [("mcp-protocol-version", "2025-11-25".to_string())]
        );
        assert!(message_headers(&call, None).is_empty());
    }

    #[test]
    fn the_endpoint_comes_from_an_address_or_a_url() {
        assert_eq!(
            endpoint("127.0.0.1:8080").unwrap(),
            "http://127.0.0.1:8080/mcp"
        );
        assert_eq!(
            endpoint("http://rover:8080/").unwrap(),
            "http://rover:8080/mcp"
        );
        assert_eq!(
            endpoint("https://rover:8443/mcp").unwrap(),
            "https://rover:8443/mcp"
        );
        assert_eq!(endpoint("[::1]:8080").unwrap(), "http://[::1]:8080/mcp");
        for bad in ["", "rover", "rover/x:1", "http://"] {
            assert!(endpoint(bad).is_err(), "{bad:?}");
        }
    }
}
