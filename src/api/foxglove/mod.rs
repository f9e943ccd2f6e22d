//! The Foxglove WebSocket protocol (`foxglove.websocket.v1`), server side,
//! at `GET /foxglove` on rozd's own listener: the same TLS, the same
//! credentials (a bearer token in `Authorization`, or in a `token` query
//! parameter for the Foxglove app, which cannot set headers; see
//! `auth::require_credential`), refused at the handshake without one.
//!
//! Implemented on axum's WebSocket rather than with the `foxglove` crate:
//! that crate's server binds and accepts on a listener of its own, with
//! its own TLS and no hook for rozd's credentials and scopes, which live in
//! this router; the protocol's server side is small (`protocol.rs`).
//!
//! A connection is two loops joined in one task: the reader (the client's
//! requests, and a tick at `max_hz` that polls the Observation and the
//! scene for a client subscribed to them) and the writer (the control
//! queue first, then the messages the [`Hub`] queued). Every queue is
//! bounded; what does not fit is dropped and counted (see
//! [`crate::live`]); a client that takes no frame for `send_timeout_secs`
//! is disconnected.

mod protocol;
mod scene;
mod services;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Extension;
use axum::extract::State;
use axum::extract::ws::{
    Message, WebSocket, WebSocketUpgrade, rejection::WebSocketUpgradeRejection,
};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_util::{SinkExt as _, StreamExt as _};
use http::StatusCode;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::auth::Caller;
use super::reply::json_error;
use crate::HostContext;
use crate::live::{COUNTS, Content, Hub, Queued};
use crate::record::schema::Event;
use protocol::{Channel, Level, Request};

/// Where Foxglove connects.
pub(crate) const PATH: &str = "/foxglove";

/// The largest message a client may send.
const MAX_CLIENT_MESSAGE: usize = 64 * 1024;
/// Answers, failures and statuses queued for one client at most.
const CONTROL_QUEUE: usize = 64;

#[derive(Clone)]
struct Foxglove {
    ctx: Arc<HostContext>,
    hub: Arc<Hub>,
}

/// `GET /foxglove`.
pub(crate) fn routes(ctx: Arc<HostContext>, hub: Arc<Hub>) -> axum::Router {
    axum::Router::new()
        .route(PATH, get(upgrade))
        .with_state(Foxglove { ctx, hub })
}

async fn upgrade(
    State(f): State<Foxglove>,
    caller: Option<Extension<Caller>>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let ws = match ws {
        Ok(ws) => ws,
        Err(rejection) => {
            return json_error(
                StatusCode::BAD_REQUEST,
                "invalid_argument",
                &format!(
                    "a Foxglove client connects here with a WebSocket ({}): {}",
                    protocol::SUBPROTOCOL,
                    rejection.body_text()
                ),
            )
            .into_response();
        }
    };
    let Some(admission) = f.hub.admit() else {
        tracing::warn!(
            max = f.hub.config().max_clients,
            "refused a Foxglove client: every place is taken"
        );
        return json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            &format!(
                "{} Foxglove clients are connected (foxglove.max_clients); try again later",
                f.hub.config().max_clients
            ),
        )
        .into_response();
    };
    let caller = caller.map_or_else(Caller::anonymous, |Extension(c)| c);
    ws.protocols([protocol::SUBPROTOCOL])
        .max_message_size(MAX_CLIENT_MESSAGE)
        .max_frame_size(MAX_CLIENT_MESSAGE)
        .on_upgrade(move |socket| async move {
            let _admission = admission;
            serve(f, caller, socket).await;
        })
}

/// The channels of this host.
fn channels(ctx: &HostContext) -> Vec<Channel> {
    let c = &ctx.config;
    let sensors: Vec<&str> = c.hardware.sensors.iter().map(|s| s.name.as_str()).collect();
    let actuators: Vec<&str> = c
        .hardware
        .actuators
        .iter()
        .map(|a| a.name.as_str())
        .collect();
    let cameras: Vec<&str> = c.cameras.iter().map(|s| s.name.as_str()).collect();
    protocol::channels(
        &sensors,
        &actuators,
        &cameras,
        ctx.ooda.sim_world().is_some(),
    )
}

async fn serve(f: Foxglove, caller: Caller, socket: WebSocket) {
    let Foxglove { ctx, hub } = f;
    let (client, data) = hub.attach();
    let channels = channels(&ctx);
    let (replies, control) = mpsc::channel::<Message>(CONTROL_QUEUE);
    let gone = CancellationToken::new();
    // Who owns what this connection commands (its deadman's scope).
    let owner = format!("foxglove:{}:{}", caller.name(), client.id);
    tracing::info!(
        credential = caller.name(),
        client = client.id,
        "a Foxglove client connected"
    );
    let greeting = [
        protocol::server_info(
            &format!("rozd {}", ctx.config.host.display_name()),
            &owner,
            &ctx.config.host.id,
        ),
        protocol::advertise(&channels),
        protocol::advertise_services(),
    ];
    for text in greeting {
        let _ = replies.try_send(Message::Text(text.into()));
    }
    let calls = services::Calls::new(
        ctx.clone(),
        caller.clone(),
        owner.clone(),
        gone.clone(),
        replies.clone(),
    );
    let (sink, stream) = socket.split();
    let reader = Reader {
        ctx: &ctx,
        hub: &hub,
        client: &client,
        channels: &channels,
        calls: &calls,
        scene_spec: ctx.ooda.sim_spec().map(|(spec, _)| spec),
    };
    tokio::select! {
        () = write(sink, control, data, &hub) => {}
        () = reader.run(stream) => {}
        () = ctx.shutdown.cancelled() => {}
    }
    gone.cancel();
    drop(client);
    services::release(&ctx, &owner).await;
    tracing::info!(
        credential = caller.name(),
        owner,
        "a Foxglove client disconnected"
    );
}

/// Sends the control queue first, then the subscribed messages; each
/// frame must be taken within `send_timeout_secs`.
async fn write(
    mut sink: futures_util::stream::SplitSink<WebSocket, Message>,
    mut control: mpsc::Receiver<Message>,
    mut data: mpsc::Receiver<Queued>,
    hub: &Hub,
) {
    let max = hub.config().max_message_kb * 1024;
    let timeout = hub.config().send_timeout;
    loop {
        let (message, counted) = tokio::select! {
            biased;
            Some(message) = control.recv() => (message, false),
            Some(queued) = data.recv() => {
                let body = queued.live.body();
                if body.len() > max {
                    COUNTS.dropped_too_large.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let frame = protocol::message_data(queued.subscription, queued.live.at_ns, body);
                (Message::Binary(frame.into()), true)
            }
            else => return,
        };
        match tokio::time::timeout(timeout, sink.send(message)).await {
            Ok(Ok(())) => {
                if counted {
                    COUNTS.sent.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "a Foxglove client's connection failed");
                return;
            }
            Err(_) => {
                tracing::warn!(
                    ?timeout,
                    "a Foxglove client took no frame in time (foxglove.send_timeout_secs): disconnected"
                );
                return;
            }
        }
    }
}

/// The client's requests, and the channels polled for it.
struct Reader<'a> {
    ctx: &'a HostContext,
    hub: &'a Hub,
    client: &'a crate::live::Attached,
    channels: &'a [Channel],
    calls: &'a services::Calls,
    scene_spec: Option<crate::hw::sim_world::WorldSpec>,
}

impl Reader<'_> {
    async fn run(&self, mut stream: futures_util::stream::SplitStream<WebSocket>) {
        let mut poll = tokio::time::interval(self.hub.config().every());
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                message = stream.next() => match message {
                    Some(Ok(Message::Text(text))) => self.handle(protocol::parse_text(&text)),
                    Some(Ok(Message::Binary(bytes))) => self.handle(protocol::parse_binary(&bytes)),
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                    Some(Ok(Message::Close(_)) | Err(_)) | None => return,
                },
                _ = poll.tick() => self.poll(),
            }
        }
    }

    /// The Observation and the scene, for a client subscribed to them.
    fn poll(&self) {
        let observation = self.ctx.ooda.observation();
        let tick = observation.seq;
        self.hub
            .offer_to(self.client, protocol::OBSERVATION_TOPIC, tick, || {
                Content::Recorded(Event::Observation(observation))
            });
        if let Some(spec) = &self.scene_spec {
            self.hub
                .offer_to(self.client, protocol::SCENE_TOPIC, tick, || {
                    let view = self.ctx.ooda.sim_world();
                    Content::Json(match view {
                        Some(view) => scene::scene(spec, &view, crate::clock::now_ms()),
                        None => serde_json::json!({"deletions": [], "entities": []}),
                    })
                });
        }
    }

    fn status(&self, level: Level, message: &str) {
        let _ = self
            .calls
            .replies
            .try_send(Message::Text(protocol::status(level, message).into()));
    }

    fn handle(&self, request: Result<Request, String>) {
        match request {
            Ok(Request::Subscribe(pairs)) => {
                for (id, channel_id) in pairs {
                    let Some(channel) = self.channels.iter().find(|c| c.id == channel_id) else {
                        self.status(Level::Warning, &format!("no channel with id {channel_id}"));
                        continue;
                    };
                    if let Err(e) = self.hub.subscribe(self.client, id, &channel.topic) {
                        self.status(Level::Warning, &format!("subscribe {}: {e}", channel.topic));
                    }
                }
            }
            Ok(Request::Unsubscribe(ids)) => {
                for id in ids {
                    if let Err(e) = self.hub.unsubscribe(self.client, id) {
                        self.status(Level::Warning, &format!("unsubscribe: {e}"));
                    }
                }
            }
            Ok(Request::ServiceCall {
                service_id,
                call_id,
                encoding,
                payload,
            }) => self.calls.call(service_id, call_id, &encoding, &payload),
            Ok(Request::Unsupported(op)) => {
                self.status(Level::Warning, &format!("rozd does not support {op}"));
            }
            Err(why) => self.status(Level::Error, &why),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `/topic` a layout names (in paths, image topics, topic maps).
    fn topics_in(value: &serde_json::Value, out: &mut Vec<String>) {
        match value {
            serde_json::Value::String(s) if s.starts_with('/') => {
                out.push(s.split('.').next().unwrap_or_default().to_string());
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| topics_in(v, out)),
            serde_json::Value::Object(map) => {
                for (key, v) in map {
                    if key.starts_with('/') {
                        out.push(key.clone());
                    }
                    topics_in(v, out);
                }
            }
            _ => {}
        }
    }

    #[test]
    fn the_example_layout_names_only_what_the_simulated_rover_serves() {
        let layout: serde_json::Value =
            serde_json::from_str(include_str!("../../../examples/foxglove-layout.json")).unwrap();
        let config = crate::config::Config::builtin().unwrap();
        let hardware = &config.hardware;
        let sensors: Vec<&str> = hardware.sensors.iter().map(|s| s.name.as_str()).collect();
        let actuators: Vec<&str> = hardware.actuators.iter().map(|a| a.name.as_str()).collect();
        let cameras: Vec<&str> = config.cameras.iter().map(|c| c.name.as_str()).collect();
        let channels = protocol::channels(
            &sensors,
            &actuators,
            &cameras,
            config.hardware.sim_world.is_some(),
        );
        let mut named = Vec::new();
        topics_in(&layout["configById"], &mut named);
        assert!(named.len() >= 6, "{named:?}");
        for topic in &named {
            assert!(
                channels.iter().any(|c| &c.topic == topic),
                "the layout names {topic}, which the simulated rover does not advertise"
            );
        }
        for (id, panel) in layout["configById"].as_object().unwrap() {
            if let Some(service) = panel.get("serviceName").and_then(|s| s.as_str()) {
                assert!(
                    protocol::Service::ALL.iter().any(|s| s.name() == service),
                    "{id} calls {service}"
                );
            }
        }
    }
}
