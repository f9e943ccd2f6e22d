//! `[fleet]`: the broker that carries the host registry, this host's
//! presence settings, the endpoint it advertises and the fleet token.

use std::path::PathBuf;
use std::time::Duration;

use crate::config::broker::broker_section;
use crate::config::types::{HostConfig, Invalid, Secret, token_lines, within};
use crate::hw::config::MqttConfig;

/// Default topic prefix: records on `roz/v1/hosts/<env>/<id>`, stops on `roz/v1/estop/<env>`.
pub(crate) const DEFAULT_PREFIX: &str = "roz/v1";

broker_section! {
    /// `[fleet]` as written: the broker of the host registry, and this
    /// host's presence on it. [`RawFleet::build`] checks it and makes the
    /// [`FleetConfig`] rozd reads.
    pub(crate) struct RawFleet {
        defaults: {
            keep_alive_secs: "default_keep_alive_secs",
            max_packet_size: "default_max_packet_size",
        },
        connection: MqttConfig,
        #[serde(default = "default_prefix")]
        pub topic_prefix: String,
        /// Seconds between refreshes of the host record; a host silent for three
        /// of its intervals is `stale`.
        #[serde(default = "default_heartbeat_secs")]
        pub heartbeat_secs: u64,
        /// Which hosts' records this host holds: `environment` (its own
        /// environment's, where its sessions and fleet stops go) or `fleet`
        /// (every environment's: a gateway or dashboard host).
        #[serde(default)]
        pub view: ViewScope,
        /// How long a lookup of a host outside the view (`GetHost`, a
        /// relay by host id) waits for the broker's retained record before
        /// the host is not found.
        #[serde(default = "default_lookup_timeout_ms")]
        pub lookup_timeout_ms: u64,
        /// The gRPC endpoint other hosts reach this one at, `http://host:port`
        /// or `https://host:port`. Default: the bound listen address, with
        /// `https://` when `[server.tls]` is configured.
        #[serde(default)]
        pub advertise: Option<String>,
        /// Environment variable holding the fleet token.
        #[serde(default)]
        pub token_env: Option<String>,
        /// File holding the fleet token (its first line that is not empty or a
        /// `#` comment). `token_env` or `token_file` is required.
        #[serde(default)]
        pub token_file: Option<PathBuf>,
    }
}

/// `[fleet]`, validated: the broker of the host registry, this host's
/// presence on it, and the fleet token. Its client id defaults to
/// `rozd-fleet-<host id>`, so that a restarted rozd takes over its previous
/// connection (and its last will) at once.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// The broker connection, as the MQTT client code takes it (its
    /// `client_id` set).
    pub broker: MqttConfig,
    /// The broker connection's client id.
    pub client_id: String,
    /// Records on `<prefix>/hosts/<env>/<id>`, stops on `<prefix>/estop/<env>`.
    pub topic_prefix: String,
    /// Between refreshes of the host record (`heartbeat_secs`, whole
    /// seconds); a host silent for three of its intervals is `stale`.
    pub heartbeat: Duration,
    /// Which hosts' records this host holds.
    pub view: ViewScope,
    /// How long a lookup of a host outside the view waits for the broker's
    /// retained record (`lookup_timeout_ms`).
    pub lookup_timeout: Duration,
    /// `advertise` as written (checked: `http(s)://host:port`); see
    /// [`FleetConfig::advertised`].
    pub advertise: Option<String>,
    /// The listener serves TLS: the default advertised endpoint is then
    /// `https://`.
    listener_tls: bool,
    /// The fleet token, read from `token_env` or `token_file` at load: it
    /// keys the MAC of every fleet message.
    pub token: Secret,
}

/// `[fleet] view`: which records a host subscribes to and holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum ViewScope {
    /// `<prefix>/hosts/<its environment>/+`: its own environment.
    #[default]
    Environment,
    /// `<prefix>/hosts/+/+`: every environment of the fleet.
    Fleet,
}

impl ViewScope {
    pub fn as_str(self) -> &'static str {
        match self {
            ViewScope::Environment => "environment",
            ViewScope::Fleet => "fleet",
        }
    }
}

/// Bounds of `lookup_timeout_ms`.
pub(crate) const LOOKUP_TIMEOUT_MS: std::ops::RangeInclusive<u64> = 50..=60_000;

fn default_lookup_timeout_ms() -> u64 {
    1000
}

fn default_keep_alive_secs() -> u64 {
    15
}
/// Default `max_packet_size`: twice the largest record rozd takes
/// ([`super::record::MAX_RECORD_BYTES`]), so that a record a little too big
/// is seen and counted rather than silently dropped by the broker.
pub(crate) const DEFAULT_MAX_PACKET: u32 = 128 * 1024;
/// The smallest `max_packet_size`: a record of the largest size rozd takes,
/// with its topic and headers.
pub(crate) const MIN_MAX_PACKET: u32 = super::record::MAX_RECORD_BYTES as u32 + 1024;

fn default_max_packet_size() -> u32 {
    DEFAULT_MAX_PACKET
}
fn default_prefix() -> String {
    DEFAULT_PREFIX.to_string()
}
fn default_heartbeat_secs() -> u64 {
    10
}

impl FleetConfig {
    /// The endpoint this host advertises, given the address it is bound to.
    pub fn advertised(&self, bound: std::net::SocketAddr) -> String {
        let scheme = if self.listener_tls { "https" } else { "http" };
        self.advertise
            .clone()
            .unwrap_or_else(|| format!("{scheme}://{bound}"))
    }

    /// The heartbeat in whole seconds, as host records carry it.
    pub fn heartbeat_secs(&self) -> u64 {
        self.heartbeat.as_secs()
    }
}

/// Whether `s` can be one level of an MQTT topic (no separators, no
/// wildcards, nothing a broker rejects).
pub(crate) fn topic_level_ok(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && !s.contains(['/', '+', '#', '\0'])
}

/// What `[fleet]` is checked against of the listener (`[server]`).
pub(crate) struct Listener {
    /// `server.listen`.
    pub listen: std::net::SocketAddr,
    /// `[server.tls]` is configured.
    pub tls: bool,
}

impl RawFleet {
    /// Checks `[fleet]` and reads the token, which a fleet requires (it keys
    /// the MAC of every fleet message): the section as rozd reads it.
    pub(crate) fn build(
        &self,
        host: &HostConfig,
        server: &Listener,
        mqtt: Option<&MqttConfig>,
    ) -> Result<FleetConfig, Invalid> {
        let fleet = self;
        let err = |key: &str, message: String| Err(Invalid::new(format!("fleet.{key}"), message));
        crate::config::broker::check(
            &fleet.broker_fields(),
            &crate::config::broker::BrokerLimits {
                section: "fleet",
                // 5: the shortest keep-alive the MQTT 5 client takes.
                keep_alive_secs: 5..=3600,
                min_packet_size: MIN_MAX_PACKET,
            },
        )?;
        within("fleet.heartbeat_secs", fleet.heartbeat_secs, 1..=3600)?;
        within(
            "fleet.lookup_timeout_ms",
            fleet.lookup_timeout_ms,
            LOOKUP_TIMEOUT_MS,
        )?;
        let prefix = &fleet.topic_prefix;
        if prefix.is_empty()
            || prefix.len() > 128
            || prefix.starts_with('/')
            || prefix.ends_with('/')
            || prefix.contains(['+', '#', '\0'])
            || prefix.split('/').any(str::is_empty)
        {
            return err(
                "topic_prefix",
                format!(
                    "{prefix:?} is not a topic prefix like \"roz/v1\" (no wildcards, no empty levels)"
                ),
            );
        }
        let client_id = fleet
            .client_id
            .clone()
            .unwrap_or_else(|| format!("rozd-fleet-{}", host.id));
        if client_id.trim().is_empty() || client_id.len() > 64 {
            return err("client_id", "must be 1-64 characters".into());
        }
        if let Some(m) = mqtt {
            let hardware = crate::hw::mqtt::client_id(m, &host.id);
            let stop_input = format!("{hardware}{}", crate::hw::mqtt::STOP_CLIENT_SUFFIX);
            if client_id == hardware || client_id == stop_input {
                return err(
                    "client_id",
                    format!(
                        "{client_id:?} is also the client id of an [mqtt] connection; the two \
                     connections would keep disconnecting each other"
                    ),
                );
            }
        }
        if fleet.cert_file.is_some() && fleet.ca_file.is_none() {
            return err(
                "ca_file",
                "fleet.cert_file (this host's certificate) needs fleet.ca_file, the fleet's CA: \
             relays check that the other host's certificate chains to it"
                    .into(),
            );
        }
        if fleet.password_env.is_some() && fleet.username.is_none() {
            return err("password_env", "needs fleet.username".into());
        }
        match &fleet.advertise {
            Some(endpoint) => {
                if let Err(why) = check_endpoint(endpoint) {
                    return err("advertise", why);
                }
                if endpoint.starts_with("https://") && !server.tls {
                    return err(
                        "advertise",
                        format!("{endpoint:?} is https://, but [server.tls] is not configured"),
                    );
                }
                if endpoint.starts_with("http://") && fleet.cert_file.is_some() {
                    return err(
                        "advertise",
                        format!(
                            "{endpoint:?} is plaintext, but this fleet uses host certificates \
                         (fleet.cert_file): other hosts relay only over TLS; advertise https://"
                        ),
                    );
                }
            }
            None if server.listen.ip().is_unspecified() => {
                return err(
                    "advertise",
                    format!(
                        "server.listen is {}, which other hosts cannot connect to; set \
                     fleet.advertise = \"http://<this host's address>:{}\"",
                        server.listen,
                        server.listen.port()
                    ),
                );
            }
            None => {}
        }
        if !topic_level_ok(&host.environment_id) {
            return Err(Invalid::new(
                "host.environment_id",
                format!(
                    "{:?} cannot be a topic level of the fleet's stop command (1-128 characters, \
                 no '/', '+', '#')",
                    host.environment_id
                ),
            ));
        }
        let token = match (&fleet.token_env, &fleet.token_file) {
            (Some(_), Some(_)) => {
                return err("token_file", "set token_env or token_file, not both".into());
            }
            (Some(var), None) => match std::env::var(var) {
                Ok(token) if !token.trim().is_empty() => Secret::new(token.trim()),
                Ok(_) => return err("token_env", format!("{var} is empty")),
                Err(_) => {
                    return err(
                        "token_env",
                        format!("names {var}, which is not set (or not UTF-8)"),
                    );
                }
            },
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    Invalid::new(
                        "fleet.token_file",
                        format!("cannot read {}: {e}", path.display()),
                    )
                })?;
                match token_lines(&text).next() {
                    Some(token) => Secret::new(token),
                    None => return err("token_file", format!("{} holds no token", path.display())),
                }
            }
            (None, None) => {
                return err(
                    "token_file",
                    "a fleet needs the fleet token: set fleet.token_file (or fleet.token_env) on \
                 every host of the fleet, to the same token. It authenticates host records, \
                 fleet stop/clear commands and relayed requests; without it anyone who can \
                 publish to the broker could redirect sessions or clear a fleet stop"
                        .into(),
                );
            }
        };
        Ok(FleetConfig {
            broker: fleet.connection(client_id.clone()),
            client_id,
            topic_prefix: fleet.topic_prefix.clone(),
            heartbeat: Duration::from_secs(fleet.heartbeat_secs),
            view: fleet.view,
            lookup_timeout: Duration::from_millis(fleet.lookup_timeout_ms),
            advertise: fleet.advertise.clone(),
            listener_tls: server.tls,
            token,
        })
    }
}

/// An endpoint other hosts can dial: `http://host:port` or
/// `https://host:port` (then the host's certificate must name its host id).
pub(crate) fn check_endpoint(endpoint: &str) -> Result<(), String> {
    let uri: http::Uri = endpoint
        .parse()
        .map_err(|e| format!("{endpoint:?} is not a URL: {e}"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(format!("{endpoint:?} must start with http:// or https://"));
    }
    let Some(authority) = uri.authority() else {
        return Err(format!("{endpoint:?} has no host"));
    };
    if authority.host().is_empty() || authority.port_u16().is_none() {
        return Err(format!("{endpoint:?} must name a host and a port"));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(format!("{endpoint:?} must not have a path"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert!(check_endpoint("http://10.0.0.7:8080").is_ok());
        assert!(check_endpoint("http://rover-1.lan:8080/").is_ok());
        assert!(check_endpoint("http://[::1]:8080").is_ok());
        assert!(check_endpoint("https://rover-1.lan:8443").is_ok());
        for bad in [
            "a:1",
            "http://a",
            "http://a:1/x",
            "http://:1",
            "",
            "ftp://a:1",
        ] {
            assert!(check_endpoint(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn topic_levels() {
        assert!(topic_level_ok("lab"));
        assert!(topic_level_ok("warehouse-3.aisle_2"));
        for bad in ["", "a/b", "+", "a#", &"x".repeat(129)] {
            assert!(!topic_level_ok(bad), "{bad:?}");
        }
    }
}
