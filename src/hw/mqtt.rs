//! MQTT: one client connection (rumqttc, MQTT 3.1.1) shared by the mqtt
//! sensors (subscriptions), the mqtt actuators and reflex rules (publish).
//!
//! - **Persistent session.** `clean_session = false` under a stable client id
//!   (default `rozd-<host id>`) and QoS 1 subscriptions: the broker queues
//!   QoS 1 messages for us while we are away and delivers them when we
//!   reconnect, so nothing published at QoS 1 during an outage is lost
//!   (given a broker with persistence when the broker itself restarts).
//! - **Reconnects** with exponential backoff from `reconnect_min_ms` to
//!   `reconnect_max_ms`, plus up to 25 % random jitter; the backoff restarts
//!   from the minimum after every successful connection. The topics are
//!   subscribed after the first connection and again after every ConnAck
//!   without a session present (the broker forgot us).
//! - **Health** as source `mqtt`: `ok` once connected, `disconnected` while
//!   the connection is down, `error` when the broker refuses us (bad
//!   credentials, ...), TLS fails (e.g. an untrusted certificate) or the
//!   configuration cannot work (no password in the environment, unreadable
//!   CA file). Every case but the last is retried with backoff.
//! - Payloads: with a `pointer`, JSON (numbers, numeric strings, booleans as
//!   1/0; see [`crate::hw::parse`]); without, a plain number (or
//!   `true`/`false`). An empty payload (a cleared retained message) is no
//!   value. Undecodable payloads are reported through [`Readings::rejected`]
//!   and logged at most once every 10 s.
//! - TLS (`mqtts://`) uses rustls with the process-wide crypto provider
//!   (ring is installed if none is), the system roots or `ca_file`.
//!
//! - Other parts of rozd (the protective-stop input) receive a topic's raw
//!   payloads through [`Mqtt::listen`]; those topics are subscribed like the
//!   sensors' (QoS 1, persistent session).
//!
//! The password is read from the environment variable named by
//! `password_env` and never logged.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rumqttc::{
    AsyncClient, ConnectionError, Event, EventLoop, MqttOptions, Packet, Publish, QoS, Request,
    Subscribe, SubscribeFilter, SubscribeReasonCode, TlsConfiguration, Transport,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::hw::config::{
    ActuatorSpec, ActuatorTarget, LineParser, MqttConfig, SensorSource, SensorSpec,
};
use crate::hw::parse::{Line, ParseError, render_template};
use crate::hw::{ActuatorDriver, DriverFuture, Health, HwError, Readings};

/// The source name used for health and rejections.
pub const SOURCE: &str = "mqtt";
/// Requests (publishes, subscriptions) queued for the event loop.
const REQUEST_QUEUE: usize = 64;
/// Largest MQTT packet sent or accepted (a bigger one ends the connection).
const MAX_PACKET: usize = 256 * 1024;
/// Rejected payloads are logged at most this often.
const REJECT_LOG_EVERY: Duration = Duration::from_secs(10);

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

#[derive(Debug)]
struct Shared {
    /// `None` when the configuration cannot work (see the health report).
    client: Option<AsyncClient>,
    connected: AtomicBool,
    /// `true` once the first connection attempt has succeeded or failed.
    attempted: tokio::sync::watch::Sender<bool>,
    task: std::sync::Mutex<Option<JoinHandle<()>>>,
    listeners: std::sync::Mutex<Listeners>,
}

impl Shared {
    fn listeners(&self) -> std::sync::MutexGuard<'_, Listeners> {
        self.listeners
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
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
        let options = match options(cfg, host_id) {
            Ok(o) => o,
            Err(why) => {
                tracing::error!("mqtt: {why}; not connecting");
                readings.source_health(SOURCE, Health::Error(why));
                return Mqtt::unusable();
            }
        };
        let (client, eventloop) = AsyncClient::new(options, REQUEST_QUEUE);
        let shared = Arc::new(Shared {
            client: Some(client.clone()),
            connected: AtomicBool::new(false),
            attempted: tokio::sync::watch::Sender::new(false),
            task: std::sync::Mutex::new(None),
            listeners: Default::default(),
        });
        let task = EventTask {
            url: cfg.url.clone(),
            eventloop,
            client,
            shared: shared.clone(),
            topics,
            readings,
            shutdown,
            backoff: Backoff::new(
                Duration::from_millis(cfg.reconnect_min_ms.max(1)),
                Duration::from_millis(cfg.reconnect_max_ms.max(cfg.reconnect_min_ms).max(1)),
            ),
            health: None,
            reject_log: None,
            rejects_suppressed: 0,
        };
        let handle = tokio::spawn(task.run());
        if let Ok(mut slot) = shared.task.lock() {
            *slot = Some(handle);
        }
        Mqtt { inner: shared }
    }

    fn unusable() -> Mqtt {
        Mqtt {
            inner: Arc::new(Shared {
                client: None,
                connected: AtomicBool::new(false),
                // nothing will be attempted
                attempted: tokio::sync::watch::Sender::new(true),
                task: std::sync::Mutex::new(None),
                listeners: Default::default(),
            }),
        }
    }

    /// Whether the client is connected to the broker right now.
    pub fn is_connected(&self) -> bool {
        self.inner.connected.load(Ordering::Acquire)
    }

    /// Queues a publish (never waits). Refused with
    /// [`HwError::Disconnected`] while the connection is down, so that a
    /// command is never delivered late after a reconnect. Once queued, QoS 1
    /// and 2 publishes are retransmitted by the client until the broker
    /// acknowledges them (also across a reconnect within the session).
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
        let Some(client) = &self.inner.client else {
            return Err(HwError::Disconnected(SOURCE.to_string()));
        };
        if !self.is_connected() {
            return Err(HwError::Disconnected(SOURCE.to_string()));
        }
        client
            .try_publish(topic, qos, retain, payload)
            .map_err(|e| match e {
                rumqttc::ClientError::TryRequest(_) | rumqttc::ClientError::Request(_) => {
                    HwError::Io("the MQTT request queue is full or closed".to_string())
                }
            })
    }

    /// Every message on `topic` (a concrete topic, no wildcards), as raw
    /// bytes, from now on. The topic is subscribed at QoS 1 like the
    /// sensors' topics: now if connected, else at the next connection, and
    /// again whenever the broker has lost our session. Empty payloads are
    /// delivered too. The channel closes when the client stops.
    pub fn listen(&self, topic: &str) -> Result<mpsc::UnboundedReceiver<Vec<u8>>, HwError> {
        if topic.is_empty() || topic.contains(['#', '+']) {
            return Err(HwError::Unsupported(format!(
                "cannot listen on topic {topic:?}"
            )));
        }
        let Some(client) = &self.inner.client else {
            return Err(HwError::Disconnected(SOURCE.to_string()));
        };
        let (tx, rx) = mpsc::unbounded_channel();
        {
            let mut guard = self.inner.listeners();
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
        if self.is_connected() {
            let pending = std::mem::take(&mut self.inner.listeners().unsubscribed);
            for t in pending {
                if let Err(e) = client.try_subscribe(t.clone(), QoS::AtLeastOnce) {
                    tracing::warn!(topic = %t, "mqtt: cannot subscribe now ({e}); retrying at the next connection");
                    self.inner.listeners().unsubscribed.push(t);
                }
            }
        }
        Ok(rx)
    }

    /// Resolves once the first attempt to connect has succeeded or failed
    /// (at once for a configuration that cannot work), so that publishes
    /// (the start-up safe values) reach a broker that is up. It does not
    /// wait for reconnects; bound it, an unreachable broker may take long.
    pub async fn first_connection_attempt(&self) {
        let mut rx = self.inner.attempted.subscribe();
        let _ = rx.wait_for(|attempted| *attempted).await;
    }

    /// Waits until the event-loop task has ended (after `shutdown`).
    pub async fn join(&self) {
        let task = self.inner.task.lock().ok().and_then(|mut t| t.take());
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

/// MQTT options from the configuration. `Err` names what cannot work.
pub(crate) fn options(cfg: &MqttConfig, host_id: &str) -> Result<MqttOptions, String> {
    let (tls, rest) = if let Some(rest) = cfg.url.strip_prefix("mqtts://") {
        (true, rest)
    } else if let Some(rest) = cfg.url.strip_prefix("mqtt://") {
        (false, rest)
    } else {
        return Err(format!(
            "mqtt.url {:?} must start with mqtt:// or mqtts://",
            cfg.url
        ));
    };
    let rest = rest.trim_end_matches('/');
    let (host, port) = match rest.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(':') => (
            host,
            port.parse::<u16>()
                .map_err(|_| format!("mqtt.url {:?}: bad port", cfg.url))?,
        ),
        _ => (rest, if tls { 8883 } else { 1883 }),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(format!("mqtt.url {:?} has no host", cfg.url));
    }
    let client_id = cfg
        .client_id
        .clone()
        .unwrap_or_else(|| format!("rozd-{host_id}"));
    if client_id.trim().is_empty() {
        return Err("the MQTT client id is empty".to_string());
    }
    let mut o = MqttOptions::new(client_id, host, port);
    o.set_clean_session(false);
    o.set_keep_alive(Duration::from_secs(cfg.keep_alive_secs.max(1)));
    o.set_max_packet_size(MAX_PACKET, MAX_PACKET);
    let password = match &cfg.password_env {
        Some(var) => match std::env::var(var) {
            Ok(p) => Some(p),
            Err(_) => {
                return Err(format!(
                    "mqtt.password_env names {var}, which is not set (or not UTF-8)"
                ));
            }
        },
        None => None,
    };
    match (&cfg.username, password) {
        (Some(user), password) => {
            o.set_credentials(user.clone(), password.unwrap_or_default());
        }
        (None, Some(_)) => return Err("mqtt.password_env needs mqtt.username".to_string()),
        (None, None) => {}
    }
    if tls {
        o.set_transport(Transport::tls_with_config(tls_config(
            cfg.ca_file.as_deref(),
        )?));
    }
    Ok(o)
}

/// rustls client configuration: the process-wide provider (ring installed
/// if none is), roots from `ca_file` (PEM) or the system.
fn tls_config(ca_file: Option<&std::path::Path>) -> Result<TlsConfiguration, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    // Idempotent: keeps a provider someone else installed first.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("mqtt.ca_file {}: {e}", path.display()))?;
            for cert in certs {
                let cert = cert.map_err(|e| format!("mqtt.ca_file {}: {e}", path.display()))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("mqtt.ca_file {}: {e}", path.display()))?;
            }
            if roots.is_empty() {
                return Err(format!(
                    "mqtt.ca_file {} holds no certificate",
                    path.display()
                ));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(
                    "no system root certificates found for mqtts:// (set mqtt.ca_file)".to_string(),
                );
            }
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(TlsConfiguration::Rustls(Arc::new(config)))
}

/// Exponential backoff with jitter.
#[derive(Debug)]
pub(crate) struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub(crate) fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max,
            next: min,
        }
    }

    pub(crate) fn reset(&mut self) {
        self.next = self.min;
    }

    /// The next delay: the current step plus up to 25 % jitter.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = base.saturating_mul(2).min(self.max);
        let jitter_ms = u64::try_from(base.as_millis() / 4).unwrap_or(u64::MAX);
        let random = RandomState::new().hash_one(base);
        base + Duration::from_millis(random % jitter_ms.saturating_add(1))
    }
}

struct EventTask {
    url: String,
    eventloop: EventLoop,
    client: AsyncClient,
    shared: Arc<Shared>,
    topics: Topics,
    readings: Arc<dyn Readings>,
    shutdown: CancellationToken,
    backoff: Backoff,
    health: Option<Health>,
    reject_log: Option<Instant>,
    rejects_suppressed: u64,
}

impl EventTask {
    async fn run(mut self) {
        let mut subscribed = false;
        let mut failures: u32 = 0;
        loop {
            let event = tokio::select! {
                _ = self.shutdown.cancelled() => break,
                event = self.eventloop.poll() => event,
            };
            match event {
                Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                    self.set_health(Health::Ok);
                    if failures > 0 {
                        tracing::info!(url = %self.url, session_present = ack.session_present, "mqtt: reconnected after {failures} failed attempt(s)");
                    } else {
                        tracing::info!(url = %self.url, session_present = ack.session_present, "mqtt: connected");
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
                        .any(|c| matches!(c, SubscribeReasonCode::Failure))
                    {
                        tracing::warn!(url = %self.url, "mqtt: the broker refused a subscription: {:?}", ack.return_codes);
                        self.readings
                            .rejected(SOURCE, "the broker refused a subscription");
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    let health = match &e {
                        ConnectionError::ConnectionRefused(code) => {
                            Health::Error(format!("the broker refused the connection: {code:?}"))
                        }
                        ConnectionError::Tls(e) => Health::Error(format!("TLS: {e}")),
                        _ => Health::Disconnected,
                    };
                    failures = failures.saturating_add(1);
                    let delay = self.backoff.next_delay();
                    if failures == 1 {
                        tracing::warn!(url = %self.url, "mqtt: connection failed: {e}; reconnecting with backoff");
                    } else {
                        tracing::debug!(url = %self.url, "mqtt: attempt {failures} failed: {e}; next in {delay:?}");
                    }
                    self.set_health(health);
                    tokio::select! {
                        _ = self.shutdown.cancelled() => break,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
        let was_connected = self.shared.connected.swap(false, Ordering::AcqRel);
        if was_connected && self.client.try_disconnect().is_ok() {
            // Let the event loop write DISCONNECT (bounded: the broker may be gone).
            let _ = tokio::time::timeout(Duration::from_secs(1), async {
                loop {
                    match self.eventloop.poll().await {
                        Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect)) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
            })
            .await;
        }
        tracing::debug!("mqtt: event loop ended");
    }

    /// Queues one SUBSCRIBE at QoS 1 for every sensor and listener topic
    /// (`everything`), or only for listener topics added since the last
    /// subscription, ahead of anything else the event loop will send (not
    /// through the request channel, which may be full of publishes).
    fn subscribe(&mut self, everything: bool) {
        let mut topics: Vec<String> = {
            let mut listeners = self.shared.listeners();
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
        let filters = topics
            .into_iter()
            .map(|t| SubscribeFilter::new(t, QoS::AtLeastOnce));
        self.eventloop
            .pending
            .push_front(Request::Subscribe(Subscribe::new_many(filters)));
    }

    fn set_health(&mut self, health: Health) {
        self.shared
            .connected
            .store(health == Health::Ok, Ordering::Release);
        self.shared.attempted.send_if_modified(|attempted| {
            let first = !*attempted;
            *attempted = true;
            first
        });
        if self.health.as_ref() != Some(&health) {
            self.readings.source_health(SOURCE, health.clone());
            self.health = Some(health);
        }
    }

    fn publish_received(&mut self, p: &Publish) {
        let listened = {
            let mut listeners = self.shared.listeners();
            match listeners.by_topic.get_mut(&p.topic) {
                Some(senders) => {
                    senders.retain(|tx| tx.send(p.payload.to_vec()).is_ok());
                    true
                }
                None => false,
            }
        };
        let Some(sensors) = self.topics.get(&p.topic) else {
            if !listened {
                tracing::debug!(topic = %p.topic, "mqtt: message on a topic no sensor reads");
            }
            return;
        };
        if p.payload.iter().all(u8::is_ascii_whitespace) {
            // e.g. a retained message being cleared: no value, not garbage
            tracing::debug!(topic = %p.topic, "mqtt: empty message");
            return;
        }
        let Ok(text) = std::str::from_utf8(&p.payload) else {
            let why = format!(
                "topic {}: payload is not UTF-8 ({} bytes)",
                p.topic,
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
            .map(|(e, names)| format!("topic {} (sensor {}): {e}", p.topic, names.join(", ")))
            .collect();
        for why in why {
            self.reject(why);
        }
    }

    fn reject(&mut self, why: String) {
        self.readings.rejected(SOURCE, &why);
        let now = Instant::now();
        match self.reject_log {
            Some(last) if now.duration_since(last) < REJECT_LOG_EVERY => {
                self.rejects_suppressed += 1
            }
            _ => {
                let suppressed = std::mem::take(&mut self.rejects_suppressed);
                if suppressed > 0 {
                    tracing::warn!(
                        "mqtt: rejected message: {why} ({suppressed} more rejected since the last report)"
                    );
                } else {
                    tracing::warn!("mqtt: rejected message: {why}");
                }
                self.reject_log = Some(now);
            }
        }
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

    fn cfg(url: &str) -> MqttConfig {
        MqttConfig {
            url: url.to_string(),
            client_id: None,
            username: None,
            password_env: None,
            ca_file: None,
            keep_alive_secs: 30,
            reconnect_min_ms: 100,
            reconnect_max_ms: 1000,
        }
    }

    #[test]
    fn options_from_config() {
        let o = options(&cfg("mqtt://broker.lan:1884"), "rover-1").unwrap();
        assert_eq!(o.broker_address(), ("broker.lan".to_string(), 1884));
        assert_eq!(o.client_id(), "rozd-rover-1");
        assert!(!o.clean_session());
        assert_eq!(o.keep_alive(), Duration::from_secs(30));
        assert!(o.credentials().is_none());
        let o = options(&cfg("mqtt://10.0.0.2"), "h").unwrap();
        assert_eq!(o.broker_address(), ("10.0.0.2".to_string(), 1883));
        let mut c = cfg("mqtt://[::1]:1883");
        c.client_id = Some("robot".into());
        let o = options(&c, "h").unwrap();
        assert_eq!(o.broker_address(), ("::1".to_string(), 1883));
        assert_eq!(o.client_id(), "robot");
        assert!(options(&cfg("http://x"), "h").is_err());
        assert!(options(&cfg("mqtt://x:port"), "h").is_err());
    }

    #[test]
    fn credentials_come_from_the_environment() {
        let mut c = cfg("mqtt://localhost");
        c.username = Some("rozd".into());
        c.password_env = Some("ROZD_TEST_MQTT_PASSWORD_SURELY_UNSET".into());
        let err = options(&c, "h").unwrap_err();
        assert!(
            err.contains("ROZD_TEST_MQTT_PASSWORD_SURELY_UNSET"),
            "{err}"
        );
        // PATH is set in every test environment; its value stands in for a password
        c.password_env = Some("PATH".into());
        let login = options(&c, "h").unwrap().credentials().unwrap();
        assert_eq!(login.username, "rozd");
        assert_eq!(login.password, std::env::var("PATH").unwrap());
        c.username = None;
        assert!(options(&c, "h").unwrap_err().contains("username"));
    }

    #[test]
    fn mqtts_uses_tls_with_a_ca_file() {
        let c = MqttConfig {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..cfg("mqtts://broker:8883")
        };
        let err = options(&c, "h").unwrap_err();
        assert!(err.contains("ca_file"), "{err}");
        let o = options(&cfg("mqtts://broker"), "h");
        // with system roots (when the machine has any) the default port is 8883
        if let Ok(o) = o {
            assert_eq!(o.broker_address().1, 8883);
            assert!(matches!(o.transport(), Transport::Tls(_)));
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_maximum_with_bounded_jitter() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(1000));
        let steps: Vec<u128> = (0..6).map(|_| b.next_delay().as_millis()).collect();
        for (got, base) in steps.iter().zip([100u128, 200, 400, 800, 1000, 1000]) {
            assert!(
                *got >= base && *got <= base + base / 4,
                "{got} not in [{base}, {}]",
                base + base / 4
            );
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(125));
    }
}
