//! What every broker connection of rozd shares — the hardware client
//! ([`super::mqtt`]), its protective-stop input connection, and the fleet's
//! connection (`fleet::presence`): MQTT 5 options from the configuration,
//! TLS, reconnect backoff, the bound on packet sizes, error descriptions and
//! the counters that `/v1/status` and `/v1/safety` show.
//!
//! **Packet sizes.** Every connection tells the broker its *maximum packet
//! size* in CONNECT (MQTT 5). A broker does not send a client a bigger
//! packet (mosquitto drops it for that client), so one oversized message
//! can no longer break a connection: with MQTT 3.1.1 the client had to
//! read it, failed, reconnected and got it again, forever. What arrives
//! but is bigger than rozd's own limit for that kind of message is dropped
//! and counted (`oversized`), the connection kept. The broker's own maximum
//! (its CONNACK) bounds what rozd publishes: a bigger publish is refused
//! before it is queued, because a queued QoS 1 publish the broker cannot
//! take would be retried on every reconnection.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use rumqttc::v5::mqttbytes::v5::{ConnAck, ConnectReturnCode};
use rumqttc::v5::{ConnectionError, MqttOptions, StateError};
use rumqttc::{TlsConfiguration, Transport};
use serde::Serialize;

use super::config::MqttConfig;

/// Default `[mqtt] max_packet_size`: well above rozd's own limit for a
/// sensor message ([`MAX_SENSOR_PAYLOAD`]), so that a message a little too
/// big is seen and counted rather than silently dropped by the broker, and
/// well below what a small host minds holding in memory.
pub const DEFAULT_MAX_PACKET: u32 = 256 * 1024;
/// The smallest `max_packet_size` allowed (below it, ordinary messages with
/// long topics would be dropped).
pub const MIN_MAX_PACKET: u32 = 1024;
/// The largest `max_packet_size` allowed.
pub use crate::config::broker::MAX_MAX_PACKET;
/// rozd's own limit for one sensor message: bigger ones are dropped and
/// counted as `oversized`.
pub const MAX_SENSOR_PAYLOAD: usize = 64 * 1024;
/// Session expiry of the persistent sessions: never (as MQTT 3.1.1's
/// `clean_session = false`), so QoS 1 messages published while rozd is
/// away wait for it however long it is away.
pub const SESSION_NEVER_EXPIRES: u32 = u32::MAX;
/// Outgoing QoS 1/2 publishes awaiting acknowledgement (MQTT 3.1.1
/// rumqttc's default; the broker's receive maximum may lower it).
const MAX_INFLIGHT: u16 = 100;

/// MQTT 5 options for a connection to the broker of `cfg`, as `client_id`,
/// with a maximum packet size of `max_packet_size`. The session (clean or
/// persistent, last will) is the caller's choice. `Err` says what cannot
/// work (missing password, unreadable CA file); the URL was parsed when the
/// configuration was read.
pub fn options(
    cfg: &MqttConfig,
    client_id: &str,
    max_packet_size: u32,
) -> Result<MqttOptions, String> {
    let address = cfg.url.address();
    if client_id.trim().is_empty() {
        return Err("the MQTT client id is empty".to_string());
    }
    let mut o = MqttOptions::new(client_id, address.host.as_str(), address.port);
    // The MQTT 5 client panics below 5 s; validation refuses such values,
    // this keeps a config that bypassed it from taking the daemon down.
    o.set_keep_alive(Duration::from_secs(
        cfg.keep_alive_secs.clamp(5, u64::from(u16::MAX)),
    ));
    o.set_max_packet_size(Some(max_packet_size));
    o.set_outgoing_inflight_upper_limit(MAX_INFLIGHT);
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
    if address.tls {
        o.set_transport(Transport::tls_with_config(tls_config(cfg)?));
    }
    Ok(o)
}

/// A persistent session: the broker keeps our subscriptions and queues
/// QoS 1 messages for us while we are away.
pub fn persistent_session(o: &mut MqttOptions) {
    o.set_clean_start(false);
    o.set_session_expiry_interval(Some(SESSION_NEVER_EXPIRES));
}

/// rustls client configuration: roots from `ca_file` (PEM) or the system,
/// and the client certificate of `cert_file`/`key_file` if set.
fn tls_config(cfg: &MqttConfig) -> Result<TlsConfiguration, String> {
    use crate::tls::client::{ClientTlsFiles, client_config};
    let files = ClientTlsFiles {
        ca_file: cfg.ca_file.clone(),
        cert_file: cfg.cert_file.clone(),
        key_file: cfg.key_file.clone(),
    };
    let config = client_config(&files, None).map_err(|e| {
        let key = match &e {
            crate::tls::TlsError::Read { path, .. }
            | crate::tls::TlsError::Pem { path, .. }
            | crate::tls::TlsError::Certificate { path, .. } => {
                if Some(path) == cfg.ca_file.as_ref() {
                    "ca_file"
                } else if Some(path) == cfg.key_file.as_ref() {
                    "key_file"
                } else {
                    "cert_file"
                }
            }
            crate::tls::TlsError::Config { .. } => "ca_file",
        };
        format!("broker TLS ({key}): {e}")
    })?;
    Ok(TlsConfiguration::Rustls(config))
}

/// Exponential backoff with jitter.
#[derive(Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max,
            next: min,
        }
    }

    pub fn reset(&mut self) {
        self.next = self.min;
    }

    /// The next delay: the current step plus up to 25 % jitter.
    pub fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = base.saturating_mul(2).min(self.max);
        let jitter_ms = u64::try_from(base.as_millis() / 4).unwrap_or(u64::MAX);
        let random = RandomState::new().hash_one(base);
        base + Duration::from_millis(random % jitter_ms.saturating_add(1))
    }
}

/// Why a connection attempt or a connection failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Worth reporting as an error: the broker refused us, TLS failed, the
    /// broker does not speak MQTT 5. Retried with backoff all the same.
    Refused(String),
    /// The connection could not be made or was lost.
    Lost(String),
}

/// Describes a failure of the event loop. `connected` says whether the
/// connection was up (a failure while connecting that is not a refusal
/// hints at a broker that does not speak MQTT 5).
pub fn describe(e: &ConnectionError, connected: bool) -> Failure {
    match e {
        ConnectionError::ConnectionRefused(
            code @ (ConnectReturnCode::UnsupportedProtocolVersion
            | ConnectReturnCode::RefusedProtocolVersion),
        ) => Failure::Refused(format!(
            "the broker refused MQTT 5 ({code:?}); rozd needs an MQTT 5 broker (e.g. mosquitto 1.6 or later)"
        )),
        ConnectionError::ConnectionRefused(code) => {
            Failure::Refused(format!("the broker refused the connection: {code:?}"))
        }
        ConnectionError::Tls(e) => Failure::Refused(format!("TLS: {e}")),
        // The TCP (and TLS) connection was made, the MQTT 5 CONNECT was
        // not accepted: what a broker without MQTT 5 does (an MQTT 3.1.1
        // broker answers with a 3.1.1 CONNACK and closes).
        ConnectionError::MqttState(e) if !connected => Failure::Refused(format!(
            "the broker ended the connection without accepting it ({e}); is it an MQTT 5 broker? \
             rozd needs MQTT 5 (e.g. mosquitto 1.6 or later)"
        )),
        ConnectionError::NotConnAck(packet) if !connected => Failure::Refused(format!(
            "the broker answered CONNECT with {packet:?}, not CONNACK"
        )),
        ConnectionError::MqttState(StateError::ServerDisconnect {
            reason_code,
            reason_string,
        }) => Failure::Lost(format!(
            "the broker closed the connection: {reason_code:?}{}",
            reason_string
                .as_deref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        )),
        other => Failure::Lost(other.to_string()),
    }
}

/// The size of a PUBLISH packet of `payload` bytes on `topic` (QoS 1 or 2,
/// no properties), as the broker's maximum packet size counts it.
pub fn publish_packet_size(topic: &str, payload: usize) -> usize {
    // topic length prefix + topic + packet id + empty properties + payload
    let remaining = 2 + topic.len() + 2 + 1 + payload;
    let length_bytes = match remaining {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    };
    1 + length_bytes + remaining
}

/// A connection's counters (shared between its event loop and readers).
#[derive(Debug)]
pub struct LinkCounters {
    connected: AtomicBool,
    connections: AtomicU64,
    received: AtomicU64,
    oversized: AtomicU64,
    rejected: AtomicU64,
    /// The maximum packet size we announce.
    max_packet_size: u32,
    /// The broker's maximum packet size (its CONNACK); 0 = none given.
    broker_max_packet_size: AtomicU32,
}

/// A snapshot of a connection's counters (in `/v1/status` and `/v1/safety`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LinkStats {
    /// Connected to the broker now.
    pub connected: bool,
    /// Connections made since start (1 for a connection never lost).
    pub connections: u64,
    /// The maximum packet size announced to the broker (it sends nothing bigger).
    pub max_packet_size: u32,
    /// Messages received.
    pub received: u64,
    /// Messages dropped for exceeding rozd's own limit.
    pub oversized: u64,
    /// Messages whose payload rozd could not use.
    pub rejected: u64,
}

impl LinkCounters {
    pub fn new(max_packet_size: u32) -> Self {
        LinkCounters {
            connected: AtomicBool::new(false),
            connections: AtomicU64::new(0),
            received: AtomicU64::new(0),
            oversized: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            max_packet_size,
            broker_max_packet_size: AtomicU32::new(0),
        }
    }

    /// A new connection, as its CONNACK tells.
    pub fn connected(&self, ack: &ConnAck) {
        self.connected_with(ack.properties.as_ref().and_then(|p| p.max_packet_size));
    }

    /// A new connection to a broker whose maximum packet size is `broker_max`.
    fn connected_with(&self, broker_max: Option<u32>) {
        self.broker_max_packet_size
            .store(broker_max.unwrap_or(0), Ordering::Release);
        self.connections.fetch_add(1, Ordering::Relaxed);
        self.connected.store(true, Ordering::Release);
    }

    pub fn disconnected(&self) {
        self.connected.store(false, Ordering::Release);
    }

    /// Marks the connection down; `true` if it was up.
    pub fn take_connected(&self) -> bool {
        self.connected.swap(false, Ordering::AcqRel)
    }

    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    pub fn received(&self) {
        self.received.fetch_add(1, Ordering::Relaxed);
    }

    pub fn oversized(&self) {
        self.oversized.fetch_add(1, Ordering::Relaxed);
    }

    pub fn rejected(&self) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// `Err` (why) if the broker would not take a publish of `payload`
    /// bytes on `topic`.
    pub fn check_publish(&self, topic: &str, payload: usize) -> Result<(), String> {
        let max = self.broker_max_packet_size.load(Ordering::Acquire);
        let size = publish_packet_size(topic, payload);
        if max > 0 && size > max as usize {
            return Err(format!(
                "a {size}-byte message on {topic} is larger than the broker accepts ({max} bytes)"
            ));
        }
        Ok(())
    }

    pub fn stats(&self) -> LinkStats {
        LinkStats {
            connected: self.is_connected(),
            connections: self.connections.load(Ordering::Relaxed),
            max_packet_size: self.max_packet_size,
            received: self.received.load(Ordering::Relaxed),
            oversized: self.oversized.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::broker::BrokerUrl;
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::Publish;

    pub(crate) fn cfg(url: &str) -> MqttConfig {
        MqttConfig {
            url: url.parse().unwrap(),
            client_id: None,
            username: None,
            password_env: None,
            ca_file: None,
            cert_file: None,
            key_file: None,
            keep_alive_secs: 30,
            reconnect_min_ms: 100,
            reconnect_max_ms: 1000,
            max_packet_size: DEFAULT_MAX_PACKET,
        }
    }

    #[test]
    fn options_from_config() {
        let mut o = options(&cfg("mqtt://broker.lan:1884"), "rozd-rover-1", 4096).unwrap();
        assert_eq!(o.broker_address(), ("broker.lan".to_string(), 1884));
        assert_eq!(o.client_id(), "rozd-rover-1");
        assert_eq!(o.keep_alive(), Duration::from_secs(30));
        assert_eq!(o.max_packet_size(), Some(4096));
        assert!(o.credentials().is_none());
        assert!(o.clean_start(), "clean unless asked otherwise");
        persistent_session(&mut o);
        assert!(!o.clean_start());
        assert_eq!(o.session_expiry_interval(), Some(u32::MAX));
        assert_eq!(o.max_packet_size(), Some(4096), "kept beside the expiry");
        let o = options(&cfg("mqtt://10.0.0.2"), "h", 4096).unwrap();
        assert_eq!(o.broker_address(), ("10.0.0.2".to_string(), 1883));
        let o = options(&cfg("mqtt://[::1]:1883"), "robot", 4096).unwrap();
        assert_eq!(o.broker_address(), ("::1".to_string(), 1883));
        // a URL that cannot work is refused when it is read
        assert!("http://x".parse::<BrokerUrl>().is_err());
        assert!("mqtt://x:port".parse::<BrokerUrl>().is_err());
        assert!(options(&cfg("mqtt://x"), " ", 4096).is_err());
    }

    #[test]
    fn the_connection_goes_where_the_configuration_says() {
        // one parse of the URL for validation and connection (they disagreed
        // on bracketed IPv6 hosts without a port)
        for (url, host, port) in [
            ("mqtt://[::1]", "::1", 1883),
            ("mqtt://[::1]:1884/", "::1", 1884),
            ("mqtt://broker/", "broker", 1883),
        ] {
            let c = cfg(url);
            let o = options(&c, "h", 4096).unwrap();
            assert_eq!(o.broker_address(), (host.to_string(), port), "{url}");
            let a = c.url.address();
            assert_eq!((a.host.as_str(), a.port), (host, port), "{url}");
        }
    }

    #[test]
    fn credentials_come_from_the_environment() {
        let mut c = cfg("mqtt://localhost");
        c.username = Some("rozd".into());
        c.password_env = Some("ROZD_TEST_MQTT_PASSWORD_SURELY_UNSET".into());
        let err = options(&c, "h", 4096).unwrap_err();
        assert!(
            err.contains("ROZD_TEST_MQTT_PASSWORD_SURELY_UNSET"),
            "{err}"
        );
        // PATH is set in every test environment; its value stands in for a password
        c.password_env = Some("PATH".into());
        let login = options(&c, "h", 4096).unwrap().credentials().unwrap();
        assert_eq!(login.username, "rozd");
        assert_eq!(login.password, std::env::var("PATH").unwrap());
        c.username = None;
        assert!(options(&c, "h", 4096).unwrap_err().contains("username"));
    }

    #[test]
    fn mqtts_uses_tls_with_a_ca_file() {
        let c = MqttConfig {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..cfg("mqtts://broker:8883")
        };
        let err = options(&c, "h", 4096).unwrap_err();
        assert!(err.contains("ca_file"), "{err}");
        // with system roots (when the machine has any) the default port is 8883
        if let Ok(o) = options(&cfg("mqtts://broker"), "h", 4096) {
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

    #[test]
    fn publish_sizes_are_counted_as_the_codec_does() {
        for payload in [0, 1, 100, 127, 128, 16_000, 16_383, 70_000, 2_097_000] {
            let mut p = Publish::new(
                "plant/cmd/valve",
                QoS::AtLeastOnce,
                vec![0u8; payload],
                None,
            );
            p.pkid = 1;
            assert_eq!(
                publish_packet_size("plant/cmd/valve", payload),
                p.size(),
                "{payload}"
            );
        }
    }

    #[test]
    fn publishes_above_the_brokers_maximum_are_refused() {
        let counters = LinkCounters::new(4096);
        assert!(
            counters.check_publish("t", 10_000_000).is_ok(),
            "no maximum yet"
        );
        counters.connected(&ConnAck {
            session_present: false,
            code: ConnectReturnCode::Success,
            properties: None,
        });
        assert!(
            counters.check_publish("t", 10_000_000).is_ok(),
            "none given"
        );
        counters.connected_with(Some(1000));
        assert!(counters.check_publish("t", 900).is_ok());
        let err = counters.check_publish("t", 1000).unwrap_err();
        assert!(err.contains("1000 bytes"), "{err}");
        let stats = counters.stats();
        assert_eq!((stats.connected, stats.connections), (true, 2));
        assert_eq!(stats.max_packet_size, 4096);
    }

    #[test]
    fn failures_name_what_to_fix() {
        let refused = ConnectionError::ConnectionRefused(ConnectReturnCode::NotAuthorized);
        assert!(
            matches!(describe(&refused, false), Failure::Refused(w) if w.contains("NotAuthorized"))
        );
        let v3 = ConnectionError::ConnectionRefused(ConnectReturnCode::UnsupportedProtocolVersion);
        assert!(matches!(describe(&v3, false), Failure::Refused(w) if w.contains("MQTT 5")));
        let garbled = ConnectionError::MqttState(StateError::Deserialization(
            rumqttc::v5::mqttbytes::Error::MalformedPacket,
        ));
        assert!(matches!(describe(&garbled, false), Failure::Refused(w) if w.contains("MQTT 5")));
        assert!(matches!(describe(&garbled, true), Failure::Lost(_)));
        let closed = ConnectionError::MqttState(StateError::ConnectionAborted);
        assert!(matches!(describe(&closed, false), Failure::Refused(w) if w.contains("MQTT 5")));
        assert!(matches!(describe(&closed, true), Failure::Lost(_)));
        let io = ConnectionError::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(matches!(describe(&io, false), Failure::Lost(_)));
    }
}
