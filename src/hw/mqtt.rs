//! MQTT: the hardware client (rumqttc, MQTT 5) — mqtt sensors
//! (subscriptions), mqtt actuators and reflex rules (publish) share one
//! connection; the protective-stop input ([`Mqtt::listen`]) has one of its
//! own.
//!
//! - **Persistent session.** `clean_start = false` and a session that never
//!   expires, under a stable client id (default `rozd-<host id>`), with
//!   QoS 1 subscriptions: the broker queues QoS 1 messages for us while we
//!   are away and delivers them when we reconnect, so nothing published at
//!   QoS 1 during an outage is lost (given a broker with persistence when
//!   the broker itself restarts).
//! - **Bounded packets.** The connection announces `max_packet_size`
//!   (default 256 KiB): the broker sends nothing bigger, so no message can
//!   break the connection (see [`super::mqtt_link`]). A sensor message above
//!   [`MAX_SENSOR_PAYLOAD`] that does arrive is dropped and counted
//!   (`oversized`); the connection stays.
//! - **Reconnects** with exponential backoff from `reconnect_min_ms` to
//!   `reconnect_max_ms`, plus up to 25 % random jitter; the backoff restarts
//!   from the minimum after every successful connection. The topics are
//!   subscribed after the first connection and again after every ConnAck
//!   without a session present (the broker forgot us).
//! - **Health** as source `mqtt`: `ok` once connected, `disconnected` while
//!   the connection is down, `error` when the broker refuses us (bad
//!   credentials, no MQTT 5, ...), TLS fails (e.g. an untrusted
//!   certificate) or the configuration cannot work (no password in the
//!   environment, unreadable CA file). Every case but the last is retried
//!   with backoff.
//! - Payloads: with a `pointer`, JSON (numbers, numeric strings, booleans as
//!   1/0; see [`crate::hw::parse`]); without, a plain number (or
//!   `true`/`false`). An empty payload (a cleared retained message) is no
//!   value. Undecodable and oversized payloads are reported through
//!   [`Readings::rejected`], counted, and logged at most once every 10 s.
//! - TLS (`mqtts://`) uses rustls with the process-wide crypto provider
//!   (ring is installed if none is), the system roots or `ca_file`.
//! - **The stop input's connection.** [`Mqtt::listen`] delivers a topic's
//!   raw payloads over a second connection, client id `<client id>-estop`,
//!   that subscribes only to listened topics (QoS 1, persistent session of
//!   its own, packets up to [`STOP_MAX_PACKET`]; health as source
//!   `mqtt-estop`). Sensor traffic, however much, cannot delay or crowd out
//!   (in the broker's per-client queue) a message on the stop topic.
//!
//! The password is read from the environment variable named by
//! `password_env` and never logged.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rumqttc::Outgoing;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Filter, Packet, Publish, Subscribe, SubscribeReasonCode};
use rumqttc::v5::{AsyncClient, ClientError, Event, EventLoop, MqttOptions, Request};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::mqtt_link::{
    Backoff, Failure, LinkCounters, LinkStats, MAX_SENSOR_PAYLOAD, describe, persistent_session,
};
use crate::hw::config::{
    ActuatorSpec, ActuatorTarget, LineParser, MqttConfig, SensorSource, SensorSpec,
};
use crate::hw::parse::{Line, ParseError, render_template};
use crate::hw::{ActuatorDriver, DriverFuture, Health, HwError, Readings};

/// The source name used for health and rejections.
pub const SOURCE: &str = "mqtt";
/// The source name of the stop input's connection.
pub const STOP_SOURCE: &str = "mqtt-estop";
/// Appended to the client id for the stop input's connection.
pub const STOP_CLIENT_SUFFIX: &str = "-estop";
/// The stop input connection's maximum packet size: a stop message is a
/// few bytes (`1`, `true`, `stop`); anything much bigger is not one.
pub const STOP_MAX_PACKET: u32 = 16 * 1024;
/// Requests (publishes, subscriptions) queued for the event loop.
const REQUEST_QUEUE: usize = 64;

/// Sensors fed by one topic.
type Topics = HashMap<String, Vec<(String, LineParser)>>;

/// Raw-payload listeners added with [`Mqtt::listen`].
#[derive(Debug, Default)]
struct Listeners {
    by_topic: HashMap<String, Vec<mpsc::UnboundedSender<Vec<u8>>>>,
    /// Topics not yet subscribed on the current connection/session.
    unsubscribed: Vec<String>,
}

/// The MQTT client; cheap to clone.
#[derive(Debug, Clone)]
pub struct Mqtt {
    inner: Arc<Shared>,
}

struct Shared {
    /// Sensors, actuators, rules.
    main: Arc<Link>,
    /// The stop input's connection, started by the first [`Mqtt::listen`].
    stop: Mutex<Option<Arc<Link>>>,
    /// What the stop input's connection is made from; `None` when the
    /// configuration cannot work.
    setup: Option<Setup>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mqtt")
            .field("main", &self.main)
            .field("stop", &self.stop)
            .finish()
    }
}

struct Setup {
    cfg: MqttConfig,
    client_id: String,
    readings: Arc<dyn Readings>,
    shutdown: CancellationToken,
}

impl Mqtt {
    /// Starts the client's event-loop task (call inside a tokio runtime).
    /// It connects, subscribes every mqtt sensor's topic at QoS 1, records
    /// values, and reconnects until `shutdown` is cancelled; then it sends
    /// DISCONNECT (the broker keeps our session). Problems are reported as
    /// the health of source `mqtt`, never returned.
    pub fn start(
        cfg: &MqttConfig,
        host_id: &str,
        sensors: &[SensorSpec],
        readings: Arc<dyn Readings>,
        shutdown: CancellationToken,
    ) -> Mqtt {
        let mut topics: Topics = HashMap::new();
        for s in sensors {
            if let SensorSource::Mqtt { topic, pointer } = &s.source {
                let parser = match pointer {
                    Some(pointer) => LineParser::Json {
                        pointer: pointer.clone(),
                    },
                    None => LineParser::Number,
                };
                topics
                    .entry(topic.clone())
                    .or_default()
                    .push((s.name.clone(), parser));
            }
        }
        let client_id = client_id(cfg, host_id);
        let main = Link::start(LinkSpec {
            source: SOURCE,
            cfg,
            client_id: &client_id,
            max_packet_size: cfg.max_packet_size,
            topics,
            readings: readings.clone(),
            shutdown: shutdown.clone(),
        });
        let setup = main.client.is_some().then(|| Setup {
            cfg: cfg.clone(),
            client_id,
            readings,
            shutdown,
        });
        Mqtt {
            inner: Arc::new(Shared {
                main,
                stop: Mutex::new(None),
                setup,
            }),
        }
    }

    /// Whether the client is connected to the broker right now.
    pub fn is_connected(&self) -> bool {
        self.inner.main.counters.is_connected()
    }

    /// The hardware connection's counters.
    pub fn stats(&self) -> LinkStats {
        self.inner.main.counters.stats()
    }

    /// The stop input connection's counters, once [`Mqtt::listen`] made it.
    pub fn stop_input_stats(&self) -> Option<LinkStats> {
        self.inner
            .stop
            .lock()
            .as_ref()
            .map(|link| link.counters.stats())
    }

    /// Queues a publish (never waits). Refused with
    /// [`HwError::Disconnected`] while the connection is down, so that a
    /// command is never delivered late after a reconnect, and with
    /// [`HwError::Unsupported`] when the broker would not take a packet
    /// that big. Once queued, QoS 1 and 2 publishes are retransmitted by
    /// the client until the broker acknowledges them (also across a
    /// reconnect within the session).
    pub fn publish(
        &self,
        topic: &str,
        payload: impl Into<Vec<u8>>,
        qos: u8,
        retain: bool,
    ) -> Result<(), HwError> {
        let qos = match qos {
            0 => QoS::AtMostOnce,
            1 => QoS::AtLeastOnce,
            2 => QoS::ExactlyOnce,
            other => {
                return Err(HwError::Unsupported(format!(
                    "MQTT QoS {other} does not exist"
                )));
            }
        };
        if topic.is_empty() || topic.contains(['#', '+']) {
            return Err(HwError::Unsupported(format!(
                "cannot publish to topic {topic:?}"
            )));
        }
        let link = &self.inner.main;
        let Some(client) = &link.client else {
            return Err(HwError::Disconnected(SOURCE.to_string()));
        };
        if !link.counters.is_connected() {
            return Err(HwError::Disconnected(SOURCE.to_string()));
        }
        let payload: Vec<u8> = payload.into();
        link.counters
            .check_publish(topic, payload.len())
            .map_err(HwError::Unsupported)?;
        client
            .try_publish(topic, qos, retain, payload)
            .map_err(|e| match e {
                ClientError::TryRequest(_) | ClientError::Request(_) => {
                    HwError::Busy("the MQTT request queue is full or closed".to_string())
                }
            })
    }

    /// Every message on `topic` (a concrete topic, no wildcards), as raw
    /// bytes, from now on, over the stop input's connection (started by the
    /// first call). The topic is subscribed at QoS 1 in that connection's
    /// persistent session: now if connected, else at the next connection,
    /// and again whenever the broker has lost the session. Empty payloads
    /// are delivered too. The channel closes when the client stops.
    pub fn listen(&self, topic: &str) -> Result<mpsc::UnboundedReceiver<Vec<u8>>, HwError> {
        if topic.is_empty() || topic.contains(['#', '+']) {
            return Err(HwError::Unsupported(format!(
                "cannot listen on topic {topic:?}"
            )));
        }
        let link = {
            let mut slot = self.inner.stop.lock();
            match &*slot {
                Some(link) => link.clone(),
                None => {
                    let Some(setup) = &self.inner.setup else {
                        return Err(HwError::Disconnected(SOURCE.to_string()));
                    };
                    let link = Link::start(LinkSpec {
                        source: STOP_SOURCE,
                        cfg: &setup.cfg,
                        client_id: &format!("{}{STOP_CLIENT_SUFFIX}", setup.client_id),
                        max_packet_size: setup.cfg.max_packet_size.min(STOP_MAX_PACKET),
                        topics: Topics::new(),
                        readings: setup.readings.clone(),
                        shutdown: setup.shutdown.clone(),
                    });
                    *slot = Some(link.clone());
                    link
                }
            }
        };
        link.listen(topic)
    }

    /// Resolves once the first attempt to connect has succeeded or failed
    /// (at once for a configuration that cannot work), so that publishes
    /// (the start-up safe values) reach a broker that is up. It does not
    /// wait for reconnects; bound it, an unreachable broker may take long.
    pub async fn first_connection_attempt(&self) {
        let mut rx = self.inner.main.attempted.subscribe();
        let _ = rx.wait_for(|attempted| *attempted).await;
    }

    /// Waits until the event-loop tasks have ended (after `shutdown`).
    pub async fn join(&self) {
        self.inner.main.join().await;
        let stop = self.inner.stop.lock().clone();
        if let Some(stop) = stop {
            stop.join().await;
        }
    }
}

/// The hardware client's id: `client_id`, or `rozd-<host id>`.
pub fn client_id(cfg: &MqttConfig, host_id: &str) -> String {
    cfg.client_id
        .clone()
        .unwrap_or_else(|| format!("rozd-{host_id}"))
}

/// What a connection is made of.
struct LinkSpec<'a> {
    source: &'static str,
    cfg: &'a MqttConfig,
    client_id: &'a str,
    max_packet_size: u32,
    topics: Topics,
    readings: Arc<dyn Readings>,
    shutdown: CancellationToken,
}

/// One broker connection: its client, counters, listeners and event-loop task.
#[derive(Debug)]
struct Link {
    /// `None` when the configuration cannot work (see the health report).
    client: Option<AsyncClient>,
    counters: LinkCounters,
    /// `true` once the first connection attempt has succeeded or failed.
    attempted: tokio::sync::watch::Sender<bool>,
    task: Mutex<Option<JoinHandle<()>>>,
    listeners: Mutex<Listeners>,
}

impl Link {
    fn start(spec: LinkSpec<'_>) -> Arc<Link> {
        let options = super::mqtt_link::options(spec.cfg, spec.client_id, spec.max_packet_size)
            .map(|mut o| {
                persistent_session(&mut o);
                o
            });
        let options: MqttOptions = match options {
            Ok(o) => o,
            Err(why) => {
                tracing::error!(source = spec.source, "mqtt: {why}; not connecting");
                spec.readings.source_health(spec.source, Health::Error(why));
                return Arc::new(Link {
                    client: None,
                    counters: LinkCounters::new(spec.max_packet_size),
                    // nothing will be attempted
                    attempted: tokio::sync::watch::Sender::new(true),
                    task: Mutex::new(None),
                    listeners: Default::default(),
                });
            }
        };
        let (client, eventloop) = AsyncClient::new(options, REQUEST_QUEUE);
        let link = Arc::new(Link {
            client: Some(client.clone()),
            counters: LinkCounters::new(spec.max_packet_size),
            attempted: tokio::sync::watch::Sender::new(false),
            task: Mutex::new(None),
            listeners: Default::default(),
        });
        let cfg = spec.cfg;
        let task = EventTask {
            source: spec.source,
            url: cfg.url.to_string(),
            eventloop,
            client,
            link: link.clone(),
            topics: spec.topics,
            readings: spec.readings,
            shutdown: spec.shutdown,
            backoff: Backoff::new(
                Duration::from_millis(cfg.reconnect_min_ms.max(1)),
                Duration::from_millis(cfg.reconnect_max_ms.max(cfg.reconnect_min_ms).max(1)),
            ),
            health: None,
        };
        *link.task.lock() = Some(tokio::spawn(task.run()));
        link
    }

    fn listen(&self, topic: &str) -> Result<mpsc::UnboundedReceiver<Vec<u8>>, HwError> {
        let Some(client) = &self.client else {
            return Err(HwError::Disconnected(SOURCE.to_string()));
        };
        let (tx, rx) = mpsc::unbounded_channel();
        {
            let mut guard = self.listeners.lock();
            let listeners = &mut *guard;
            let senders = listeners.by_topic.entry(topic.to_string()).or_default();
            if senders.is_empty() {
                listeners.unsubscribed.push(topic.to_string());
            }
            senders.push(tx);
        }
        // The event task subscribes pending topics at every ConnAck and sets
        // `connected` before it looks; if it has looked already, we are
        // connected and subscribe here. Whoever takes a topic subscribes it.
        if self.counters.is_connected() {
            let pending = std::mem::take(&mut self.listeners.lock().unsubscribed);
            for t in pending {
                if let Err(e) = client.try_subscribe(t.clone(), QoS::AtLeastOnce) {
                    tracing::warn!(topic = %t, "mqtt: cannot subscribe now ({e}); retrying at the next connection");
                    self.listeners.lock().unsubscribed.push(t);
                }
            }
        }
        Ok(rx)
    }

    async fn join(&self) {
        let task = self.task.lock().take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

struct EventTask {
    /// `mqtt` or `mqtt-estop`: health, rejections, logs.
    source: &'static str,
    url: String,
    eventloop: EventLoop,
    client: AsyncClient,
    link: Arc<Link>,
    topics: Topics,
    readings: Arc<dyn Readings>,
    shutdown: CancellationToken,
    backoff: Backoff,
    health: Option<Health>,
}

impl EventTask {
    async fn run(mut self) {
        let source = self.source;
        let mut subscribed = false;
        let mut failures: u32 = 0;
        loop {
            let event = tokio::select! {
                _ = self.shutdown.cancelled() => break,
                event = self.eventloop.poll() => event,
            };
            match event {
                Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                    // before subscribing: see `Link::listen`
                    self.link.counters.connected(&ack);
                    self.set_health(Health::Ok);
                    if failures > 0 {
                        tracing::info!(url = %self.url, source, session_present = ack.session_present, "mqtt: reconnected after {failures} failed attempt(s)");
                    } else {
                        tracing::info!(url = %self.url, source, session_present = ack.session_present, "mqtt: connected");
                    }
                    failures = 0;
                    self.backoff.reset();
                    let everything = !subscribed || !ack.session_present;
                    self.subscribe(everything);
                    subscribed = true;
                }
                Ok(Event::Incoming(Packet::Publish(p))) => self.publish_received(&p),
                Ok(Event::Incoming(Packet::SubAck(ack))) => {
                    if ack
                        .return_codes
                        .iter()
                        .any(|c| !matches!(c, SubscribeReasonCode::Success(_)))
                    {
                        tracing::warn!(url = %self.url, source, "mqtt: the broker refused a subscription: {:?}", ack.return_codes);
                        self.readings
                            .rejected(source, "the broker refused a subscription");
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    let was_connected = self.link.counters.take_connected();
                    let health = match describe(&e, was_connected) {
                        Failure::Refused(why) => Health::Error(why),
                        Failure::Lost(_) => Health::Disconnected,
                    };
                    failures = failures.saturating_add(1);
                    let delay = self.backoff.next_delay();
                    if failures == 1 {
                        tracing::warn!(url = %self.url, source, "mqtt: connection failed: {e}; reconnecting with backoff");
                    } else {
                        tracing::debug!(url = %self.url, source, "mqtt: attempt {failures} failed: {e}; next in {delay:?}");
                    }
                    self.set_health(health);
                    tokio::select! {
                        _ = self.shutdown.cancelled() => break,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
        let was_connected = self.link.counters.take_connected();
        if was_connected && self.client.try_disconnect().is_ok() {
            // Let the event loop write DISCONNECT (bounded: the broker may be gone).
            let _ = tokio::time::timeout(Duration::from_secs(1), async {
                loop {
                    match self.eventloop.poll().await {
                        Ok(Event::Outgoing(Outgoing::Disconnect)) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
            })
            .await;
        }
        tracing::debug!(source, "mqtt: event loop ended");
    }

    /// Queues one SUBSCRIBE at QoS 1 for every sensor and listener topic
    /// (`everything`), or only for listener topics added since the last
    /// subscription, ahead of anything else the event loop will send (not
    /// through the request channel, which may be full of publishes).
    fn subscribe(&mut self, everything: bool) {
        let mut topics: Vec<String> = {
            let mut listeners = self.link.listeners.lock();
            let pending = std::mem::take(&mut listeners.unsubscribed);
            if everything {
                listeners.by_topic.keys().cloned().collect()
            } else {
                pending
            }
        };
        if everything {
            topics.extend(
                self.topics
                    .keys()
                    .filter(|t| !topics.contains(t))
                    .cloned()
                    .collect::<Vec<_>>(),
            );
        }
        if topics.is_empty() {
            return;
        }
        let filters = topics.into_iter().map(|t| Filter::new(t, QoS::AtLeastOnce));
        self.eventloop
            .pending
            .push_front(Request::Subscribe(Subscribe::new_many(filters, None)));
    }

    fn set_health(&mut self, health: Health) {
        self.link.attempted.send_if_modified(|attempted| {
            let first = !*attempted;
            *attempted = true;
            first
        });
        if self.health.as_ref() != Some(&health) {
            self.readings.source_health(self.source, health.clone());
            self.health = Some(health);
        }
    }

    fn publish_received(&mut self, p: &Publish) {
        self.link.counters.received();
        let Ok(topic) = std::str::from_utf8(&p.topic) else {
            self.link.counters.rejected();
            self.report("a message on a topic that is not UTF-8".to_string());
            return;
        };
        if p.payload.len() > MAX_SENSOR_PAYLOAD {
            // The broker sent it (it is within our maximum packet size), but
            // no sensor or stop message is this big: drop it, keep the connection.
            self.link.counters.oversized();
            self.report(format!(
                "topic {topic}: a {}-byte message is larger than rozd takes ({MAX_SENSOR_PAYLOAD} bytes); dropped",
                p.payload.len()
            ));
            return;
        }
        let listened = {
            let mut listeners = self.link.listeners.lock();
            match listeners.by_topic.get_mut(topic) {
                Some(senders) => {
                    senders.retain(|tx| tx.send(p.payload.to_vec()).is_ok());
                    true
                }
                None => false,
            }
        };
        let Some(sensors) = self.topics.get(topic) else {
            if !listened {
                tracing::debug!(source = self.source, %topic, "mqtt: message on a topic no sensor reads");
            }
            return;
        };
        if p.payload.iter().all(u8::is_ascii_whitespace) {
            // e.g. a retained message being cleared: no value, not garbage
            tracing::debug!(%topic, "mqtt: empty message");
            return;
        }
        let Ok(text) = std::str::from_utf8(&p.payload) else {
            let why = format!(
                "topic {topic}: payload is not UTF-8 ({} bytes)",
                p.payload.len()
            );
            self.reject(why);
            return;
        };
        let line = Line::new(text);
        // One rejection per distinct error (a payload that is not JSON at
        // all is one rejection, whatever number of sensors read the topic).
        let mut errors: Vec<(ParseError, Vec<&str>)> = Vec::new();
        for (name, parser) in sensors {
            match line.value(parser) {
                Ok(Some(v)) => self.readings.record(name, v),
                Ok(None) => {}
                Err(e) => match errors.iter_mut().find(|(seen, _)| *seen == e) {
                    Some((_, names)) => names.push(name),
                    None => errors.push((e, vec![name])),
                },
            }
        }
        let why: Vec<String> = errors
            .into_iter()
            .map(|(e, names)| format!("topic {topic} (sensor {}): {e}", names.join(", ")))
            .collect();
        if !why.is_empty() {
            self.link.counters.rejected();
        }
        for why in why {
            self.report(why);
        }
    }

    /// A payload rozd cannot use: counted, reported.
    fn reject(&mut self, why: String) {
        self.link.counters.rejected();
        self.report(why);
    }

    /// Reports a message that was not used to the source's rejections
    /// (counted and logged, rate-limited, by the world).
    fn report(&mut self, why: String) {
        self.readings.rejected(self.source, &why);
    }
}

/// An MQTT actuator: publishes `payload` with `{value}` replaced.
#[derive(Debug)]
pub struct MqttActuator {
    mqtt: Mqtt,
    topic: String,
    payload: String,
    qos: u8,
    retain: bool,
}

impl MqttActuator {
    pub fn new(mqtt: Mqtt, topic: String, payload: String, qos: u8, retain: bool) -> Self {
        MqttActuator {
            mqtt,
            topic,
            payload,
            qos,
            retain,
        }
    }

    /// The driver of an actuator with an mqtt target; `None` for other kinds.
    pub fn from_spec(spec: &ActuatorSpec, mqtt: &Mqtt) -> Option<Self> {
        match &spec.target {
            ActuatorTarget::Mqtt {
                topic,
                payload,
                qos,
                retain,
            } => Some(MqttActuator::new(
                mqtt.clone(),
                topic.clone(),
                payload.clone(),
                *qos,
                *retain,
            )),
            _ => None,
        }
    }

    /// The payload published for `value`.
    pub fn render(&self, value: f64) -> String {
        render_template(&self.payload, value)
    }
}

impl ActuatorDriver for MqttActuator {
    fn apply(&self, value: f64) -> DriverFuture<'_> {
        Box::pin(async move {
            if !value.is_finite() {
                return Err(HwError::Unsupported(format!(
                    "{value} is not a finite value"
                )));
            }
            self.mqtt
                .publish(&self.topic, self.render(value), self.qos, self.retain)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ids_default_to_the_host_id() {
        let mut cfg = MqttConfig {
            url: "mqtt://localhost".parse().unwrap(),
            client_id: None,
            username: None,
            password_env: None,
            ca_file: None,
            cert_file: None,
            key_file: None,
            keep_alive_secs: 30,
            reconnect_min_ms: 100,
            reconnect_max_ms: 1000,
            max_packet_size: super::super::mqtt_link::DEFAULT_MAX_PACKET,
        };
        assert_eq!(client_id(&cfg, "rover-1"), "rozd-rover-1");
        cfg.client_id = Some("robot".into());
        assert_eq!(client_id(&cfg, "rover-1"), "robot");
    }
}
