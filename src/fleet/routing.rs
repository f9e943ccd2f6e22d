//! Routing by `host_id`: here, at another live rozd's advertised endpoint
//! (with the fleet token to present), or nowhere reachable. One hop at
//! most, and never to this host's own endpoint.

use tokio::time::Instant;

use super::config::ViewScope;
use super::record::{HostRecord, RecordStatus};
use super::view::{self, Presence};
use super::{Fleet, FleetConfig, stop};
use crate::config::types::Secret;

/// Another rozd that a request for its `host_id` goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteHost {
    pub id: String,
    /// Its advertised gRPC endpoint, `http://host:port`.
    pub endpoint: String,
    /// The fleet token to present as `authorization: Bearer`.
    pub token: Option<Secret>,
    /// This host's id, which the relayed request carries (so the other
    /// host relays it no further).
    pub relayed_by: String,
    /// For an `https://` endpoint: the fleet CA the other host's
    /// certificate must chain to (it must also name [`RemoteHost::id`]),
    /// and this host's client certificate (`[fleet]` `ca_file`,
    /// `cert_file`, `key_file`).
    pub tls: crate::tls::client::ClientTlsFiles,
}

/// Where a `host_id` is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// This host (also for an empty id).
    Local,
    Remote(RemoteHost),
}

/// Why a `host_id` cannot be reached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// No such host, or one that runs no rozd: retrying will not help
    /// (`host_not_found`, `NOT_FOUND`).
    #[error("{0}")]
    NotFound(String),
    /// Known, but offline or unreachable now (`host_unavailable`, `UNAVAILABLE`).
    #[error("{0}")]
    Unavailable(String),
}

impl Fleet {
    /// Where `host_id` is served: here (empty or this host's id), at another
    /// live rozd's advertised endpoint, or nowhere reachable.
    ///
    /// `relayed_by`: the host that relayed this request here, if another
    /// did. Such a request is served here or nowhere: rozd relays one hop
    /// at most, so a disagreement between two hosts' views (or a record
    /// pointing back at a host) cannot send a request around in circles.
    pub fn route(&self, host_id: &str, relayed_by: Option<&str>) -> Result<Route, RouteError> {
        if host_id.is_empty() || host_id == self.own.id {
            return Ok(Route::Local);
        }
        if let Some(by) = relayed_by {
            return Err(RouteError::Unavailable(format!(
                "host {by:?} relayed this request here for host {host_id:?}, but this is host \
                 {:?}; rozd relays a request one hop at most, so it is not relayed again \
                 (the two hosts disagree about where {host_id:?} is)",
                self.own.id
            )));
        }
        let Some(config) = &self.config else {
            return Err(RouteError::NotFound(format!(
                "host {host_id:?} is not this host ({:?}), and no [fleet] is configured, so this \
                 rozd knows no other host",
                self.own.id
            )));
        };
        let now = Instant::now();
        let view = self.view.lock();
        let Some(entry) = view.get(host_id) else {
            return Err(RouteError::NotFound(
                if self.view_scope() == ViewScope::Fleet {
                    format!("no host {host_id:?} in the fleet registry")
                } else {
                    format!(
                        "no host {host_id:?} in this host's view of environment {:?}, nor on the \
                     fleet's broker in any environment",
                        self.own.environment_id
                    )
                },
            ));
        };
        match view.presence_of(entry, now) {
            Presence::Registered => Err(RouteError::NotFound(format!(
                "host {host_id:?} is registered, but it is not a rozd: it runs no sessions"
            ))),
            Presence::Offline => Err(RouteError::Unavailable(format!(
                "host {host_id:?} is offline"
            ))),
            Presence::Lost => Err(RouteError::Unavailable(match view.reported_by(host_id) {
                Some(by) => format!(
                    "host {host_id:?} is lost: host {by:?}, which watches its liveness, \
                     reported it silent; it is a relay target again once it publishes"
                ),
                None => format!(
                    "host {host_id:?} is lost: nothing heard from it for {} s and no last \
                     will came; it is a relay target again once it publishes",
                    now.saturating_duration_since(entry.heard_at).as_secs()
                ),
            })),
            Presence::Online | Presence::Stale => self.remote(host_id, &entry.record, config),
        }
    }

    /// [`Fleet::route`], and for a host outside this host's view (of
    /// another environment) its record looked up on the broker
    /// ([`Fleet::look_up`]): relays by host id reach every environment.
    pub async fn route_to(
        &self,
        host_id: &str,
        relayed_by: Option<&str>,
    ) -> Result<Route, RouteError> {
        let routed = self.route(host_id, relayed_by);
        let Err(RouteError::NotFound(_)) = &routed else {
            return routed;
        };
        let Some(config) = &self.config else {
            return routed;
        };
        if self.view.lock().get(host_id).is_some() {
            // In the view, and not a relay target (a registered host).
            return routed;
        }
        let record = match self.look_up(host_id).await {
            Ok(Some(record)) => record,
            Ok(None) => return routed,
            Err(e) => {
                return Err(RouteError::Unavailable(format!(
                    "host {host_id:?} is not in this host's view of environment {:?} and cannot \
                     be looked up now: {e}",
                    self.own.environment_id
                )));
            }
        };
        match record.status {
            RecordStatus::Registered => Err(RouteError::NotFound(format!(
                "host {host_id:?} is registered, but it is not a rozd: it runs no sessions"
            ))),
            RecordStatus::Offline => Err(RouteError::Unavailable(format!(
                "host {host_id:?} (environment {:?}) is offline",
                record.environment_id
            ))),
            RecordStatus::Online => self.remote(host_id, &record, config),
        }
    }

    /// The route to `host_id`, a live rozd whose latest record is `record`.
    fn remote(
        &self,
        host_id: &str,
        record: &HostRecord,
        config: &FleetConfig,
    ) -> Result<Route, RouteError> {
        let Some(endpoint) = &record.endpoint else {
            return Err(RouteError::Unavailable(format!(
                "host {host_id:?} advertises no endpoint"
            )));
        };
        if self.is_own_endpoint(endpoint) {
            return Err(RouteError::Unavailable(format!(
                "host {host_id:?} advertises {endpoint}, which is this host ({:?}); \
                 not relaying to itself (two hosts with one address?)",
                self.own.id
            )));
        }
        // A record refreshed every heartbeat (an older rozd's) that is that
        // old is not a heartbeat of a running host: its endpoint is not
        // trusted with the fleet token. A record published on change is
        // as old as the host's connection (or its latest stop): its being
        // retained `online` is the broker's word that the connection lives
        // (the last will replaces it), and its liveness messages (in the
        // view of its environment) or their silence decide its presence.
        let heartbeat = record.heartbeat_secs.unwrap_or(config.heartbeat_secs());
        let max_age_ms = i64::try_from(heartbeat)
            .unwrap_or(i64::MAX)
            .saturating_mul(1000)
            .saturating_mul(i64::from(view::STALE_AFTER_HEARTBEATS))
            .saturating_add(stop::MAX_CLOCK_SKEW_MS);
        let age_ms = crate::clock::now_ms().saturating_sub(record.stamp_ms());
        if record.refreshed_every_heartbeat() && age_ms > max_age_ms {
            return Err(RouteError::Unavailable(format!(
                "host {host_id:?} has not published a record for {} s; its endpoint is \
                 used again once it does",
                age_ms / 1000
            )));
        }
        // With host certificates the fleet token goes only where a
        // certificate proves the host is `host_id`.
        if config.broker.cert_file.is_some() && !endpoint.starts_with("https://") {
            return Err(RouteError::Unavailable(format!(
                "host {host_id:?} advertises {endpoint}, which is not TLS; this fleet uses \
                 host certificates (fleet.cert_file), so the fleet token is sent only \
                 over TLS to a host whose certificate names it"
            )));
        }
        Ok(Route::Remote(RemoteHost {
            id: host_id.to_string(),
            endpoint: endpoint.clone(),
            token: Some(config.token.clone()),
            relayed_by: self.own.id.clone(),
            tls: crate::tls::client::ClientTlsFiles {
                ca_file: config.broker.ca_file.clone(),
                cert_file: config.broker.cert_file.clone(),
                key_file: config.broker.key_file.clone(),
            },
        }))
    }

    /// Whether `endpoint` is this rozd: its advertised endpoint, or a
    /// loopback address with the port it listens on.
    fn is_own_endpoint(&self, endpoint: &str) -> bool {
        let trimmed = |e: &str| e.trim_end_matches('/').to_ascii_lowercase();
        if self
            .own
            .endpoint
            .as_deref()
            .is_some_and(|own| trimmed(own) == trimmed(endpoint))
        {
            return true;
        }
        let Ok(uri) = endpoint.parse::<http::Uri>() else {
            return false;
        };
        let Some(authority) = uri.authority() else {
            return false;
        };
        if authority.port_u16() != Some(self.bound.port()) {
            return false;
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback() || ip.is_unspecified() || ip == self.bound.ip())
    }
}
