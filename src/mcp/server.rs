//! The MCP server at `/mcp`: one [`HostServer`] per MCP session.
//!
//! - **Tools:** the host tools sessions get (`observe`, `read_sensor`, one
//!   per actuator, `stop_all`, `serial_query` where allowed), with the same
//!   names, descriptions and JSON schemas (ranges, allowed sets, units);
//!   PURE tools are annotated read-only, PHYSICAL ones destructive, and
//!   `_meta` carries `roz/category` and `roz/timeout_ms`.
//! - **Calls** take [`crate::session::host_call`], the path of a session's
//!   host tool call, with the MCP session as owner (`mcp:<session id>`) and
//!   audit origin `mcp:<client name>`. A `require_confirmation` call waits
//!   for an answer: from the client's user by elicitation (if the client
//!   supports it and `mcp.elicitation` is on), or from an operator over
//!   REST (`/v1/approvals`), whichever comes first; unanswered within
//!   `session.approval_timeout_secs` it is denied.
//! - **Resource** `roz://observation`: the latest Observation (as `GET
//!   /v1/observation`); a subscriber hears `notifications/resources/updated`
//!   at most once a second.
//! - **Resources** `rozd://embodiment` and `rozd://manual`, and the prompt
//!   `operate_robot` that carries both: what a session on this host is told
//!   before it starts (see [`crate::session::embodiment`]).
//!
//! Only protocol revisions with sessions (up to 2025-11-25) are offered: the
//! host needs a session to own actuators and a client presence to run its
//! deadman on. A client offering only the stateless 2026-07-28 revision gets
//! no tools to call.

use parking_lot::Mutex;
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use rmcp::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData as McpError,
    GetPromptRequestParams, GetPromptResponse, GetPromptResult, Implementation, InitializeResult,
    JsonObject, ListPromptsResult, ListResourcesResult, ListToolsResult, MetaObject,
    PaginatedRequestParams, PingRequest, Prompt, PromptMessage, ProtocolVersion,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, ResourceUpdatedNotificationParam, Role, ServerCapabilities, ServerConfig,
    ServerRequest, SubscribeRequestParams, Tool as McpTool, ToolAnnotations,
    UnsubscribeRequestParams,
};
use rmcp::service::{NotificationContext, Peer, RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, SessionConfig};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Value, json};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::sessions::{self, Manager};
use crate::HostContext;
use crate::clock::now_ms;
use crate::config::types::{AiMode, ToolCategory};
use crate::session::approvals::{ApprovalView, Asker};
use crate::session::host_call::{self, Answer, CallSite, Outcome};

/// The latest Observation, as a resource.
pub(crate) const OBSERVATION_URI: &str = "roz://observation";
/// The embodiment generated from the configuration (Markdown).
pub(crate) const EMBODIMENT_URI: &str = "rozd://embodiment";
/// The operator's manual (Markdown).
pub(crate) const MANUAL_URI: &str = "rozd://manual";
/// The prompt that carries both.
pub(crate) const OPERATE_PROMPT: &str = "operate_robot";
/// Subscribers hear of a new Observation at most this often.
const UPDATE_PERIOD: Duration = Duration::from_secs(1);
/// Longest client name the audit keeps.
const MAX_CLIENT_NAME: usize = 64;

/// The route `/mcp`: rmcp's streamable HTTP server with rozd's
/// sessions behind [`super::gate`] (bodies, the session cap, ownership),
/// its Host and Origin allow-lists taken from the browser checks (`hosts`:
/// `None` allows any host), and its streams ended at shutdown.
pub(crate) fn router(ctx: Arc<HostContext>, hosts: Option<Vec<String>>) -> axum::Router {
    let mcp = &ctx.config.mcp;
    let local = {
        let mut local = LocalSessionManager::default();
        local.session_config = {
            let mut config = SessionConfig::default();
            config.keep_alive = Some(mcp.session_idle);
            config
        };
        local
    };
    let manager = Arc::new(Manager::new(local, ctx.mcp.sessions.clone()));
    let gate = Arc::new(super::gate::Gate {
        sessions: ctx.mcp.sessions.clone(),
        manager: manager.clone(),
    });
    let mut config = StreamableHttpServerConfig::default()
        .with_max_request_body_bytes(super::gate::MAX_BODY_BYTES)
        .with_sse_keep_alive(Some(mcp.keepalive))
        .with_cancellation_token(ctx.shutdown.child_token());
    config = match hosts {
        Some(hosts) => {
            let port = ctx.listen_addr.port();
            let origins: Vec<String> = hosts
                .iter()
                .flat_map(|h| {
                    let h = if h.contains(':') {
                        format!("[{h}]")
                    } else {
                        h.clone()
                    };
                    [format!("http://{h}:{port}"), format!("https://{h}:{port}")]
                })
                .collect();
            config
                .with_allowed_hosts(hosts)
                .with_allowed_origins(origins)
                .enforce_origin_validation()
        }
        None => config.disable_allowed_hosts().disable_allowed_origins(),
    };
    let service =
        StreamableHttpService::new(move || Ok(HostServer::new(ctx.clone())), manager, config);
    axum::Router::new()
        .route_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(
            gate,
            super::gate::check,
        ))
}

/// One MCP session's server.
pub(crate) struct HostServer {
    ctx: Arc<HostContext>,
    /// The Observation subscription's task, stopped with the session.
    subscription: Mutex<Option<DropGuard>>,
    /// The task that pings the client, stopped with the session.
    watchdog: Mutex<Option<DropGuard>>,
}

impl HostServer {
    fn new(ctx: Arc<HostContext>) -> HostServer {
        HostServer {
            ctx,
            subscription: Mutex::new(None),
            watchdog: Mutex::new(None),
        }
    }

    fn tools(&self) -> Vec<McpTool> {
        self.ctx
            .host_tools
            .definitions()
            .iter()
            .map(|d| {
                let schema = match &d.parameters_schema {
                    Value::Object(map) => map.clone(),
                    _ => JsonObject::new(),
                };
                let annotations = match d.category {
                    ToolCategory::Pure => ToolAnnotations::new().read_only(true).destructive(false),
                    ToolCategory::Physical => {
                        ToolAnnotations::new().read_only(false).destructive(true)
                    }
                }
                .open_world(false);
                let mut meta = JsonObject::new();
                meta.insert(
                    "roz/category".into(),
                    json!(d.category.as_str().to_uppercase()),
                );
                meta.insert("roz/timeout_ms".into(), json!(d.timeout_ms));
                McpTool::new(d.name.clone(), d.description.clone(), Arc::new(schema))
                    .with_annotations(annotations)
                    .with_meta(MetaObject(meta))
            })
            .collect()
    }
}

/// The credential of the HTTP request that carried a message (`None`:
/// anonymous), which the audit names for the call's physical actions.
fn credential(extensions: &rmcp::model::Extensions) -> Option<String> {
    extensions
        .get::<http::request::Parts>()?
        .extensions
        .get::<crate::api::auth::Caller>()?
        .named()
        .map(str::to_string)
}

/// The MCP session a message belongs to (the `Mcp-Session-Id` header).
fn session_id(extensions: &rmcp::model::Extensions) -> Option<String> {
    extensions
        .get::<http::request::Parts>()?
        .headers
        .get("mcp-session-id")?
        .to_str()
        .ok()
        .map(str::to_string)
}

/// The client's name from `initialize`, fit for the audit.
fn client_name(peer: &Peer<RoleServer>) -> String {
    let name: String = peer
        .peer_info()
        .map(|info| info.client_info.name.clone())
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | '.' | ' ' | '/' | '@'))
        .take(MAX_CLIENT_NAME)
        .collect();
    let name = name.trim();
    if name.is_empty() {
        "unnamed".to_string()
    } else {
        name.to_string()
    }
}

fn result(id: &str, outcome: Outcome) -> CallToolResult {
    let mut content = vec![ContentBlock::text(outcome.content.clone())];
    // `capture_image`: the picture itself, as MCP's ImageContent.
    content.extend(outcome.images.iter().map(|image| {
        use base64::Engine as _;
        ContentBlock::image(
            base64::engine::general_purpose::STANDARD.encode(&image.data),
            image.media_type.clone(),
        )
    }));
    let mut result = match outcome.failure {
        None => {
            let mut result = CallToolResult::success(content);
            // Host tools answer JSON objects; the same, structured.
            if let Ok(value @ Value::Object(_)) = serde_json::from_str::<Value>(&outcome.content) {
                result.structured_content = Some(value);
            }
            result
        }
        Some(failure) => {
            let mut result = CallToolResult::error(content);
            result.structured_content = Some(json!({
                "error": {"code": failure.as_str(), "message": outcome.content}
            }));
            result
        }
    };
    let mut meta = JsonObject::new();
    meta.insert("roz/tool_call_id".into(), json!(id));
    result.meta = Some(MetaObject(meta));
    result
}

impl ServerHandler for HostServer {
    fn get_info(&self) -> ServerConfig {
        let host = &self.ctx.config.host;
        let capabilities = ServerCapabilities::builder()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_prompts()
            .enable_tools()
            .build();
        InitializeResult::new(capabilities)
            .with_protocol_version(ProtocolVersion::V_2025_11_25)
            .with_server_info(
                Implementation::new("rozd", crate::VERSION)
                    .with_title(format!("rozd on {}", host.display_name())),
            )
            .with_instructions(format!(
                "The hardware of host {id}. PURE tools read; PHYSICAL tools move hardware. \
                 A value outside an actuator's limits is refused, never clamped. A call that \
                 needs confirmation waits for your user's or an operator's approval \
                 (unanswered within {secs} s it is denied). stop_all always runs. When this \
                 session ends or its client disconnects, every actuator it commanded returns \
                 to its safe value. The latest Observation is the resource {OBSERVATION_URI}. \
                 Read {EMBODIMENT_URI} (this robot's limits and rules) and {MANUAL_URI} (its \
                 operator's manual) before you move anything, or start from the prompt \
                 {OPERATE_PROMPT}.",
                id = host.id,
                secs = self.ctx.config.session.approval_timeout.as_secs(),
            ))
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(&ProtocolVersion::V_2025_11_25))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    fn get_tool(&self, name: &str) -> Option<McpTool> {
        self.tools().into_iter().find(|t| t.name == name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let ctx = &self.ctx;
        let Some(session) = session_id(&context.extensions) else {
            return Err(McpError::invalid_request(
                "rozd runs tools only inside an MCP session (initialize first)",
                None,
            ));
        };
        let Some(present) = ctx.mcp.sessions.presence(&session) else {
            return Err(McpError::invalid_request("no such MCP session", None));
        };
        let name = request.name.as_ref();
        let Some(tool) = ctx.host_registry.get(name).cloned() else {
            return Err(McpError::invalid_params(
                format!(
                    "unknown tool `{name}`; available: {}",
                    ctx.host_registry.names().join(", ")
                ),
                None,
            ));
        };
        let input = Value::Object(request.arguments.unwrap_or_default());
        let id = uuid::Uuid::new_v4().to_string();
        let owner = sessions::owner(&session);
        let origin = format!("mcp:{}", client_name(&context.peer));
        let credential = credential(&context.extensions);
        let host = ctx
            .host_access(Asker::Mcp, &owner, origin.clone(), AiMode::React, None)
            .with_credential(credential.clone());
        // The client's user answers as the client's own credential: not
        // asked when a credential may not approve its own calls.
        let elicit = ctx.config.mcp.elicitation
            && ctx.permissions.caller_may_approve()
            && context
                .peer
                .supported_elicitation_modes()
                .contains(&rmcp::service::ElicitationMode::Form);
        let mut site = McpCall {
            ctx,
            peer: context.peer.clone(),
            elicit,
            present,
            request: context.ct.clone(),
            owner,
            origin,
            credential,
        };
        let physical = tool.spec.category == ToolCategory::Physical;
        let mut deadman = Deadman {
            ctx: physical.then(|| ctx.clone()),
            session: session.clone(),
        };
        match host_call::run(&mut site, &host, &ctx.permissions, &id, &tool, &input).await {
            Ok(outcome) => {
                deadman.ctx = None;
                Ok(result(&id, outcome).into())
            }
            Err(Abandoned) => Err(McpError::internal_error(
                "the call was abandoned: its client went away or cancelled it",
                None,
            )),
        }
    }

    /// Starts pinging the client once the handshake is done.
    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let Some(session) = session_id(&context.extensions) else {
            return;
        };
        let stop = CancellationToken::new();
        *self.watchdog.lock() = Some(stop.clone().drop_guard());
        tokio::spawn(watch_client(
            self.ctx.clone(),
            context.peer.clone(),
            session,
            stop,
        ));
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        Ok(ListResourcesResult::with_all_items(vec![
            Resource::new(OBSERVATION_URI, "observation")
                .with_title("Latest Observation")
                .with_description(
                    "Every sensor's value, unit, age, health and alarm, the actuators' states \
                     and the protective stop, as GET /v1/observation answers.",
                )
                .with_mime_type("application/json"),
            Resource::new(EMBODIMENT_URI, "embodiment")
                .with_title("This robot")
                .with_description(
                    "Generated from the host's configuration: every sensor and actuator with \
                     its unit and limits, cameras, reflex rules, the protective stop, which \
                     tools need approval and each call's time budget.",
                )
                .with_mime_type("text/markdown"),
            Resource::new(MANUAL_URI, "manual")
                .with_title("The operator's manual")
                .with_description(
                    "Written by the people who run this robot: what it is for, where it \
                     works, what it must never do, procedures.",
                )
                .with_mime_type("text/markdown"),
        ]))
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        Ok(ListPromptsResult::with_all_items(vec![
            Prompt::new(
                OPERATE_PROMPT,
                Some(
                    "Operate this robot: what an agent session on the host is told before it \
                     starts (the embodiment and the operator's manual).",
                ),
                None,
            )
            .with_title(format!("Operate {}", self.ctx.config.host.display_name())),
        ]))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        if request.name != OPERATE_PROMPT {
            return Err(McpError::invalid_params(
                format!("no prompt {:?}; rozd has {OPERATE_PROMPT}", request.name),
                None,
            ));
        }
        let briefing = self.ctx.briefings.current();
        let text = format!(
            "You operate rozd host {:?} through this MCP server's tools. The host enforces \
             limits, timeouts and permissions on every call.\n\n{}",
            self.ctx.config.host.id,
            briefing.text().trim_end()
        );
        Ok(
            GetPromptResult::new(vec![PromptMessage::new_text(Role::User, text)])
                .with_description(format!("briefing version {}", briefing.version))
                .into(),
        )
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        if request.uri == EMBODIMENT_URI || request.uri == MANUAL_URI {
            let briefing = self.ctx.briefings.current();
            let text = if request.uri == EMBODIMENT_URI {
                briefing.embodiment.markdown.clone()
            } else {
                match &briefing.manual {
                    Some(manual) => manual.text.clone(),
                    None => "This host has no operator's manual (see [agent] manual_file); \
                             the embodiment is all there is."
                        .to_string(),
                }
            };
            return Ok(ReadResourceResult::new(vec![
                ResourceContents::text(text, request.uri.clone()).with_mime_type("text/markdown"),
            ])
            .into());
        }
        if request.uri != OBSERVATION_URI {
            return Err(not_found(&request.uri));
        }
        let observation = serde_json::to_string(&self.ctx.ooda.observe_now())
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        Ok(ReadResourceResult::new(vec![
            ResourceContents::text(observation, OBSERVATION_URI).with_mime_type("application/json"),
        ])
        .into())
    }

    #[allow(deprecated)] // The 2026-07-28 replacement is not offered (see the module doc).
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        if request.uri != OBSERVATION_URI {
            return Err(not_found(&request.uri));
        }
        let stop = CancellationToken::new();
        // A second subscribe replaces the first (one notification stream).
        *self.subscription.lock() = Some(stop.clone().drop_guard());
        tokio::spawn(notify_observations(
            self.ctx.clone(),
            context.peer.clone(),
            stop,
        ));
        Ok(())
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        if request.uri != OBSERVATION_URI {
            return Err(not_found(&request.uri));
        }
        self.subscription.lock().take();
        Ok(())
    }
}

fn not_found(uri: &str) -> McpError {
    McpError::resource_not_found(
        format!("no resource {uri:?}; rozd has {OBSERVATION_URI}, {EMBODIMENT_URI}, {MANUAL_URI}"),
        None,
    )
}

/// Tells a subscriber of each new Observation, at most once per
/// [`UPDATE_PERIOD`], until unsubscribed or the session is gone.
async fn notify_observations(
    ctx: Arc<HostContext>,
    peer: Peer<RoleServer>,
    stop: CancellationToken,
) {
    let mut observations = ctx.ooda.subscribe();
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            changed = observations.changed() => if changed.is_err() { return },
        }
        observations.borrow_and_update();
        let updated = ResourceUpdatedNotificationParam::new(OBSERVATION_URI);
        if peer.notify_resource_updated(updated).await.is_err() {
            return;
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(UPDATE_PERIOD) => {}
        }
    }
}

/// Pings a client that holds its event stream every `mcp.keepalive_secs`:
/// a client whose connection is open but silent (a cut network, a hung
/// process) is gone when it does not answer within as long, and the
/// deadman runs. A stream that closes is noticed without this.
async fn watch_client(
    ctx: Arc<HostContext>,
    peer: Peer<RoleServer>,
    session: String,
    stop: CancellationToken,
) {
    let period = ctx.config.mcp.keepalive;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(period) => {}
        }
        if !ctx.mcp.sessions.listening(&session) {
            continue;
        }
        let ping = peer.send_request(ServerRequest::PingRequest(PingRequest::default()));
        let answered = tokio::select! {
            () = stop.cancelled() => return,
            answered = tokio::time::timeout(period, ping) => answered,
        };
        match answered {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::info!(session_id = %sessions::owner(&session), error = %e, "MCP client did not answer a ping");
                if !ctx.mcp.sessions.unresponsive(&session).await {
                    return;
                }
            }
            Err(_) => {
                tracing::warn!(session_id = %sessions::owner(&session), timeout_s = period.as_secs(), "MCP client did not answer a ping in time");
                if !ctx.mcp.sessions.unresponsive(&session).await {
                    return;
                }
            }
        }
    }
}

/// The caller of an MCP call went away (disconnected, session ended, or
/// cancelled the request).
struct Abandoned;

/// When an abandoned PHYSICAL call ends, whatever it commanded goes safe:
/// dropped after the call's own future (which stops a command that has not
/// reached its driver), it waits for one that has and then releases it.
struct Deadman {
    /// Set while armed.
    ctx: Option<Arc<HostContext>>,
    session: String,
}

impl Drop for Deadman {
    fn drop(&mut self) {
        let Some(ctx) = self.ctx.take() else { return };
        let session = std::mem::take(&mut self.session);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                sessions::deadman(&ctx.ooda, &session, "MCP call abandoned").await;
            });
        }
    }
}

/// An MCP call as a [`CallSite`].
struct McpCall<'a> {
    ctx: &'a HostContext,
    peer: Peer<RoleServer>,
    /// Ask the client's user by elicitation.
    elicit: bool,
    /// Cancelled when the session's client goes away.
    present: CancellationToken,
    /// Cancelled when the client cancels this request.
    request: CancellationToken,
    owner: String,
    origin: String,
    /// The credential of the MCP session (who answers by elicitation).
    credential: Option<String>,
}

impl McpCall<'_> {
    /// The client's user's answer by elicitation; never resolves if the
    /// client cannot answer (the operator still can, until the deadline).
    async fn elicited(&self, id: &str, name: &str, input: &Value) -> bool {
        if !self.elicit {
            return std::future::pending().await;
        }
        let host = &self.ctx.config.host;
        let params = json!({
            "mode": "form",
            "message": format!(
                "rozd on {}: allow `{name}` with {input}? It moves hardware. \
                 (An operator may also answer: POST /v1/approvals/{id}.)",
                host.display_name()
            ),
            "requestedSchema": {
                "type": "object",
                "properties": {
                    "approve": {
                        "type": "boolean",
                        "title": "Approve",
                        "description": format!("Run `{name}` with {input}"),
                        "default": false
                    }
                },
                "required": ["approve"]
            }
        });
        let answer = match serde_json::from_value(params) {
            Ok(params) => self.peer.create_elicitation(params).await,
            Err(e) => {
                tracing::error!(error = %e, "cannot build the elicitation request");
                return std::future::pending().await;
            }
        };
        match answer {
            Ok(answer) => {
                let approved = answer.action == rmcp::model::ElicitationAction::Accept
                    && answer
                        .content
                        .as_ref()
                        // `approved` too: the spelling tasks had first.
                        .and_then(|c| c.get("approve").or_else(|| c.get("approved")))
                        .and_then(Value::as_bool)
                        == Some(true);
                tracing::info!(tool_call_id = id, tool = name, approved, action = ?answer.action, "elicitation answered");
                approved
            }
            Err(e) => {
                tracing::warn!(tool_call_id = id, error = %e, "elicitation failed; waiting for an operator");
                std::future::pending().await
            }
        }
    }
}

impl CallSite for McpCall<'_> {
    type Interrupt = Abandoned;

    async fn approve(
        &mut self,
        id: &str,
        name: &str,
        input: &Value,
        category: ToolCategory,
    ) -> Result<Answer, Abandoned> {
        let timeout = self.ctx.config.session.approval_timeout;
        let since = now_ms();
        let mut waiting = self.ctx.approvals.ask(ApprovalView {
            id: id.to_string(),
            tool_call_id: id.to_string(),
            kind: Asker::Mcp,
            tool: name.to_string(),
            category: category.as_str(),
            parameters: input.clone(),
            session_id: self.owner.clone(),
            origin: self.origin.clone(),
            credential: self.credential.clone(),
            since_unix_ms: since,
            expires_unix_ms: since
                .saturating_add(i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX)),
        });
        tracing::info!(tool_call_id = id, tool = name, origin = %self.origin, "MCP call waits for approval");
        let answer = tokio::select! {
            biased;
            () = self.present.cancelled() => return Err(Abandoned),
            () = self.request.cancelled() => return Err(Abandoned),
            answered = waiting.decided() => Answer::from_operator(answered, name),
            approved = self.elicited(id, name, input) => Answer {
                verdict: if approved {
                    Ok(())
                } else {
                    Err(format!("the user declined `{name}`"))
                },
                by: self.credential.clone(),
            },
            () = tokio::time::sleep(timeout) => Answer::timed_out(name, timeout),
        };
        Ok(answer)
    }

    async fn running(&mut self, _name: &str, _category: ToolCategory) -> Result<(), Abandoned> {
        Ok(())
    }

    async fn abandoned(&self) -> Abandoned {
        tokio::select! {
            () = self.present.cancelled() => Abandoned,
            () = self.request.cancelled() => Abandoned,
        }
    }
}
