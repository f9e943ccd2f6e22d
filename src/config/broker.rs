//! What `[mqtt]` and `[fleet]` share: the broker address, parsed once from
//! its URL, and one declaration of the connection fields
//! ([`broker_section!`]) with their checks.
//!
//! A leaf like [`super::types`]: it imports nothing of rozd but that file.

use std::fmt;
use std::net::Ipv6Addr;
use std::ops::RangeInclusive;
use std::path::Path;

use serde::Deserialize;

use super::types::Invalid;

/// The largest `max_packet_size` a broker connection may ask for.
pub const MAX_MAX_PACKET: u32 = 16 * 1024 * 1024;
/// The broker port of `mqtt://` without a port.
pub(crate) const MQTT_PORT: u16 = 1883;
/// The broker port of `mqtts://` without a port.
pub(crate) const MQTTS_PORT: u16 = 8883;

/// Where a broker is: `mqtt://host[:port]` or `mqtts://host[:port]`, an
/// IPv6 address in brackets (`mqtt://[::1]:1883`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerAddress {
    pub tls: bool,
    /// A name or an IP address (IPv6 without its brackets).
    pub host: String,
    pub port: u16,
}

impl BrokerAddress {
    /// Parses a broker URL; `Err` says what is wrong with it.
    pub fn parse(url: &str) -> Result<BrokerAddress, String> {
        let (tls, rest) = if let Some(rest) = url.strip_prefix("mqtts://") {
            (true, rest)
        } else if let Some(rest) = url.strip_prefix("mqtt://") {
            (false, rest)
        } else {
            return Err(format!("{url:?} must start with mqtt:// or mqtts://"));
        };
        let default_port = if tls { MQTTS_PORT } else { MQTT_PORT };
        let bad = |why: &str| Err(format!("{url:?} is not mqtt://host[:port]: {why}"));
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let (host, port) = if let Some(bracketed) = rest.strip_prefix('[') {
            let Some((host, after)) = bracketed.split_once(']') else {
                return bad("an IPv6 address has no closing ']'");
            };
            if host.parse::<Ipv6Addr>().is_err() {
                return bad("what is in brackets is not an IPv6 address");
            }
            match after {
                "" => (host, None),
                _ => match after.strip_prefix(':') {
                    Some(port) => (host, Some(port)),
                    None => return bad("only a port may follow the address"),
                },
            }
        } else {
            match rest.split_once(':') {
                Some((_, port)) if port.contains(':') => {
                    return bad("write an IPv6 address in brackets, as mqtt://[::1]:1883");
                }
                Some((host, port)) => (host, Some(port)),
                None => (rest, None),
            }
        };
        if host.is_empty() {
            return bad("no host");
        }
        if host.contains(['/', '@', '?', '#']) || host.chars().any(char::is_whitespace) {
            return bad("a host has no path, user, query or spaces");
        }
        let port = match port {
            None => default_port,
            Some(p) => match p.parse::<u16>() {
                Ok(port) => port,
                Err(_) => return bad("the port is not a number from 0 to 65535"),
            },
        };
        Ok(BrokerAddress {
            tls,
            host: host.to_string(),
            port,
        })
    }
}

/// A broker URL as written in the configuration, with its parsed address.
/// A URL that does not parse is refused when the configuration is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerUrl {
    text: String,
    address: BrokerAddress,
}

impl BrokerUrl {
    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn address(&self) -> &BrokerAddress {
        &self.address
    }
}

impl std::str::FromStr for BrokerUrl {
    type Err = String;

    fn from_str(text: &str) -> Result<BrokerUrl, String> {
        Ok(BrokerUrl {
            address: BrokerAddress::parse(text)?,
            text: text.to_string(),
        })
    }
}

impl fmt::Display for BrokerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for BrokerUrl {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

pub(crate) fn default_reconnect_min_ms() -> u64 {
    1_000
}
pub(crate) fn default_reconnect_max_ms() -> u64 {
    30_000
}

/// Checks a broker connection's `max_packet_size`: from `min` to 16 MiB.
pub fn check_max_packet_size(size: u32, min: u32) -> Result<(), String> {
    if !(min..=MAX_MAX_PACKET).contains(&size) {
        return Err(format!("must be from {min} to {MAX_MAX_PACKET} bytes"));
    }
    Ok(())
}

/// What a section allows of the shared connection fields.
pub(crate) struct BrokerLimits {
    /// `[mqtt]` or `[fleet]`: the prefix of the keys in errors.
    pub section: &'static str,
    pub keep_alive_secs: RangeInclusive<u64>,
    pub min_packet_size: u32,
}

/// The shared connection fields, borrowed from a section for [`check`].
pub struct BrokerFields<'a> {
    pub client_id: Option<&'a str>,
    pub ca_file: Option<&'a Path>,
    pub cert_file: Option<&'a Path>,
    pub key_file: Option<&'a Path>,
    pub keep_alive_secs: u64,
    pub reconnect_min_ms: u64,
    pub reconnect_max_ms: u64,
    pub max_packet_size: u32,
}

/// Checks the connection fields every broker section shares. The keep-alive
/// is sent as a 16-bit number of seconds (and the MQTT 5 client takes no
/// less than 5); the CA file must be readable now, not at the first TLS
/// handshake.
pub(crate) fn check(fields: &BrokerFields<'_>, limits: &BrokerLimits) -> Result<(), Invalid> {
    let key = |k: &str| format!("{}.{k}", limits.section);
    super::types::within(
        key("keep_alive_secs"),
        fields.keep_alive_secs,
        limits.keep_alive_secs.clone(),
    )?;
    if fields.reconnect_min_ms == 0 || fields.reconnect_max_ms < fields.reconnect_min_ms {
        return Err(Invalid::new(
            key("reconnect_max_ms"),
            "needs 0 < reconnect_min_ms <= reconnect_max_ms",
        ));
    }
    if let Some(client_id) = fields.client_id
        && (client_id.trim().is_empty() || client_id.len() > 64)
    {
        return Err(Invalid::new(key("client_id"), "must be 1-64 characters"));
    }
    check_max_packet_size(fields.max_packet_size, limits.min_packet_size)
        .map_err(|why| Invalid::new(key("max_packet_size"), why))?;
    match (fields.cert_file, fields.key_file) {
        (Some(_), None) => {
            return Err(Invalid::new(key("key_file"), "cert_file needs key_file"));
        }
        (None, Some(_)) => {
            return Err(Invalid::new(key("cert_file"), "key_file needs cert_file"));
        }
        _ => {}
    }
    for (name, path) in [
        ("ca_file", fields.ca_file),
        ("cert_file", fields.cert_file),
        ("key_file", fields.key_file),
    ] {
        if let Some(path) = path
            && let Err(e) = std::fs::File::open(path)
        {
            return Err(Invalid::new(
                key(name),
                format!("cannot read {}: {e}", path.display()),
            ));
        }
    }
    Ok(())
}

/// Declares a broker section: the connection fields every broker section
/// shares (url, client id, credentials, CA file, client certificate, keep-alive, reconnect
/// backoff, maximum packet size), written once here, then the section's
/// own fields. `defaults` names the section's default functions (serde
/// `default` paths) of `keep_alive_secs` and `max_packet_size`.
/// `connection: T` also gives the section `fn connection(&self, client_id)
/// -> T` for a section `T` declared with this macro without fields of its
/// own (what the MQTT client code takes). Every field has the struct's
/// visibility; the section's own fields are written `pub` (which keeps
/// them apart from `connection:`) and take it too.
macro_rules! broker_section {
    (
        $(#[$attr:meta])*
        $vis:vis struct $name:ident {
            defaults: { keep_alive_secs: $keep_alive:literal, max_packet_size: $max_packet:literal $(,)? },
            $(connection: $connection:ident,)?
            $($(#[$fattr:meta])* pub $field:ident : $ty:ty),* $(,)?
        }
    ) => {
        $(#[$attr])*
        #[derive(Debug, Clone, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        $vis struct $name {
            /// `mqtt://host[:port]` or `mqtts://host[:port]` (an IPv6
            /// address in brackets), parsed when the configuration is read.
            $vis url: $crate::config::broker::BrokerUrl,
            /// The MQTT client id; stable, so that the broker keeps this
            /// connection's session (and a restarted rozd takes it over).
            #[serde(default)]
            $vis client_id: Option<String>,
            #[serde(default)]
            $vis username: Option<String>,
            /// Name of an environment variable holding the password.
            #[serde(default)]
            $vis password_env: Option<String>,
            /// CA certificate (PEM) for `mqtts://`; default: the system roots.
            #[serde(default)]
            $vis ca_file: Option<std::path::PathBuf>,
            /// Client certificate chain (PEM) presented to the broker over
            /// `mqtts://` (with `key_file`); a broker with
            /// `use_identity_as_username` takes its CN as the user name.
            #[serde(default)]
            $vis cert_file: Option<std::path::PathBuf>,
            /// Private key (PEM) of `cert_file`.
            #[serde(default)]
            $vis key_file: Option<std::path::PathBuf>,
            /// MQTT keep-alive: the broker publishes a last will when it has
            /// heard nothing for 1.5 times this.
            #[serde(default = $keep_alive)]
            $vis keep_alive_secs: u64,
            #[serde(default = "crate::config::broker::default_reconnect_min_ms")]
            $vis reconnect_min_ms: u64,
            #[serde(default = "crate::config::broker::default_reconnect_max_ms")]
            $vis reconnect_max_ms: u64,
            /// The largest packet the broker may send this connection (MQTT 5
            /// maximum packet size): it drops bigger messages for us.
            #[serde(default = $max_packet)]
            $vis max_packet_size: u32,
            $($(#[$fattr])* $vis $field: $ty,)*
        }

        impl $name {
            /// The shared connection fields, for [`crate::config::broker::check`].
            $vis fn broker_fields(&self) -> $crate::config::broker::BrokerFields<'_> {
                $crate::config::broker::BrokerFields {
                    client_id: self.client_id.as_deref(),
                    ca_file: self.ca_file.as_deref(),
                    cert_file: self.cert_file.as_deref(),
                    key_file: self.key_file.as_deref(),
                    keep_alive_secs: self.keep_alive_secs,
                    reconnect_min_ms: self.reconnect_min_ms,
                    reconnect_max_ms: self.reconnect_max_ms,
                    max_packet_size: self.max_packet_size,
                }
            }

            $(
            /// This section's broker connection as the MQTT client code
            /// takes it, as `client_id`.
            $vis fn connection(&self, client_id: String) -> $connection {
                $connection {
                    url: self.url.clone(),
                    client_id: Some(client_id),
                    username: self.username.clone(),
                    password_env: self.password_env.clone(),
                    ca_file: self.ca_file.clone(),
                    cert_file: self.cert_file.clone(),
                    key_file: self.key_file.clone(),
                    keep_alive_secs: self.keep_alive_secs,
                    reconnect_min_ms: self.reconnect_min_ms,
                    reconnect_max_ms: self.reconnect_max_ms,
                    max_packet_size: self.max_packet_size,
                }
            }
            )?
        }
    };
}
pub(crate) use broker_section;
