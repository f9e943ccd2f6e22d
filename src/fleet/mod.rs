//! Fleet: hosts by `host_id`, with the registry carried by an MQTT broker.
//!
//! - **Authenticity.** Everything a rozd publishes on the broker (records,
//!   stop commands) is sealed with an HMAC under a key derived from the
//!   fleet token ([`seal`]); what is not sealed with it is ignored and
//!   counted ([`Ignored`]), except that a stop command latches whoever sent
//!   it ([`stop`]: anyone may stop, only the fleet clears).
//! - **Presence.** Each rozd publishes its [`record::HostRecord`] as a
//!   retained message on `<prefix>/hosts/<host_id>`, refreshes it every
//!   `heartbeat_secs` and whenever its protective stop changes, and leaves a
//!   last will that marks it `offline` if the broker loses its connection;
//!   on a clean shutdown it publishes `offline` itself.
//! - **View.** Every rozd subscribes to `<prefix>/hosts/+` and keeps the
//!   [`view::FleetView`] (online / stale / offline / registered) from the
//!   authentic records only. Records that are unauthenticated, replayed,
//!   malformed, oversized or published on another host's topic are ignored
//!   and counted, with a rate-limited log line.
//! - **Routing.** [`Fleet::route`] says where a `host_id` lives: here, at
//!   another rozd's advertised endpoint (with the fleet token to present), or
//!   nowhere reachable ([`RouteError`]). Sessions and task calls use it
//!   (`api::relay`); it is the one lookup anything else routed by host
//!   should use too. It never routes a request that another host already
//!   relayed (one hop at most), and never to this host's own endpoint.
//! - **Fleet stop.** A retained command on `<prefix>/estop/<environment_id>`
//!   latches the protective stop of every host of that environment (source
//!   `fleet`); an authentic, fresh withdrawal clears the latches that came
//!   from the fleet.
//!
//! Without `[fleet]` the registry holds only this host, routing to any other
//! id is `NotFound`, and registering or fleet stops are refused.

pub mod config;
mod presence;
pub mod record;
pub mod seal;
pub mod stop;
pub mod view;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use config::FleetConfig;
use record::{EstopCommand, EstopState, HostRecord, RecordStatus, Rejected, Topics};
use seal::MessageKey;
use stop::{StopGate, StopKind, Verdict};
use view::{Applied, FleetView, Presence};

use crate::HostContext;
use crate::config::types::{HostConfig, Secret};
use crate::hw::mqtt_link::{LinkCounters, LinkStats};
use crate::safety::ProtectiveStop;

/// Shortest interval between two re-checks of [`Fleet::wait_for`].
const RECHECK_EVERY: Duration = Duration::from_millis(20);

/// `StopInfo.source` of a protective stop that came from the fleet.
pub const FLEET_SOURCE: &str = "fleet";

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

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("no [fleet] is configured: this rozd's registry holds only itself")]
    NotConfigured,
    #[error("the fleet broker is not connected; try again")]
    Disconnected,
    #[error("no host {0:?} in the fleet registry")]
    NotFound(String),
    #[error(
        "host {0:?} is a running rozd; it cannot be deregistered (stop it: its record then says offline)"
    )]
    Live(String),
    #[error("{0}")]
    Invalid(String),
    #[error("the fleet broker connection cannot take another message now; try again")]
    Busy,
    #[error("[fleet] cannot work: {0}")]
    Setup(String),
}

/// A host as listed: its record, its presence, and how long ago its record arrived.
#[derive(Debug, Clone, PartialEq)]
pub struct HostView {
    pub record: HostRecord,
    pub presence: Presence,
    /// `true` for the host answering.
    pub this_host: bool,
    /// Since its latest record arrived (`None` for this host).
    pub heard_ago: Option<Duration>,
}

impl HostView {
    pub fn estop_active(&self) -> bool {
        self.record.estop.as_ref().is_some_and(|e| e.active)
    }
}

/// How many messages from the broker this host did not take, by why.
/// Shown as `fleet.ignored` by `GET /v1/hosts`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Ignored {
    /// Host records without a valid MAC.
    pub unauthenticated_records: u64,
    /// Stop-topic messages without a valid MAC. Those that ask to stop
    /// still latched (anyone may stop); nothing else of them was applied.
    pub unauthenticated_commands: u64,
    /// Authentic host records older than one already taken from that
    /// host, or written ahead of this host's clock.
    pub replayed_records: u64,
    /// Authentic stop-topic commands not applied as they asked: a clear
    /// that is not fresh or not after the stop it would clear, or a stop
    /// that is not fresh (it still latched).
    pub stale_commands: u64,
    /// Authentic or not, messages that are oversized, malformed, on the
    /// wrong topic or otherwise invalid.
    pub invalid: u64,
}

#[derive(Debug, Default)]
struct IgnoredCounters {
    unauthenticated_records: AtomicU64,
    unauthenticated_commands: AtomicU64,
    replayed_records: AtomicU64,
    stale_commands: AtomicU64,
    invalid: AtomicU64,
}

impl IgnoredCounters {
    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn record(&self, why: &Rejected) {
        Self::count(match why {
            Rejected::Unauthenticated(_) => &self.unauthenticated_records,
            Rejected::Replayed { .. } | Rejected::Future { .. } => &self.replayed_records,
            _ => &self.invalid,
        });
    }

    fn snapshot(&self) -> Ignored {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Ignored {
            unauthenticated_records: get(&self.unauthenticated_records),
            unauthenticated_commands: get(&self.unauthenticated_commands),
            replayed_records: get(&self.replayed_records),
            stale_commands: get(&self.stale_commands),
            invalid: get(&self.invalid),
        }
    }
}

/// What a message on this host's own record topic is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OwnTopic {
    /// Our current record: nothing to do.
    Current,
    /// An authentic record of another running process with this host id,
    /// started after us (two hosts with one `host.id`?).
    Impostor { instance: Option<String> },
    /// Anything else (an old last will, our previous run's record, a
    /// forgery, a cleared message): publish ours again.
    Replace,
}

/// A command on this host's stop topic and what to do with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JudgedCommand {
    pub command: EstopCommand,
    pub verdict: Verdict,
}

/// The fleet registry and presence of one rozd. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Fleet {
    /// This host's record, without the parts that change (status, stop, heartbeat).
    own: HostRecord,
    config: Option<FleetConfig>,
    topics: Topics,
    estop: ProtectiveStop,
    view: Mutex<FleetView>,
    /// Bumped on every change of the view (and of this host's stop), so
    /// waiters re-check without polling.
    changed: tokio::sync::watch::Sender<u64>,
    client: Mutex<Option<rumqttc::v5::AsyncClient>>,
    /// The broker connection's state and counters.
    link: LinkCounters,
    task: Mutex<Option<JoinHandle<()>>>,
    /// The address the listener is bound to (to tell our own endpoint).
    bound: SocketAddr,
    /// The key fleet messages are sealed with (from the fleet token;
    /// `None` only without `[fleet]`).
    key: Option<MessageKey>,
    /// The fleet stop's state on this host.
    gate: Mutex<StopGate>,
    ignored: IgnoredCounters,
    /// The stamp of the latest record published under this host's id:
    /// each new one is later (see [`Fleet::sealed_own_record`]).
    stamp_floor: Mutex<i64>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What this host offers, as its record's capabilities advertise it.
#[derive(Debug, Clone, Default)]
pub struct Offer {
    pub sensors: Vec<String>,
    pub actuators: Vec<String>,
    /// The configured model endpoints (`local` is always offered).
    pub models: Vec<String>,
    pub host_tools: Vec<String>,
}

impl Fleet {
    /// The registry of this host (`host`, offering `offer`), on the
    /// broker of `fleet` if any, bound to `bound`. No I/O: [`start`]
    /// connects to the broker.
    pub fn new(
        host: &HostConfig,
        fleet: Option<&FleetConfig>,
        offer: Offer,
        bound: SocketAddr,
        estop: ProtectiveStop,
    ) -> Fleet {
        let mut models = vec!["local".to_string()];
        models.extend(offer.models);
        let capabilities = BTreeMap::from([
            ("sensors".to_string(), offer.sensors.join(",")),
            ("actuators".to_string(), offer.actuators.join(",")),
            ("host_tools".to_string(), offer.host_tools.join(",")),
            ("models".to_string(), models.join(",")),
            (
                "architecture".to_string(),
                std::env::consts::ARCH.to_string(),
            ),
            ("os".to_string(), std::env::consts::OS.to_string()),
            ("version".to_string(), crate::VERSION.to_string()),
        ]);
        let fleet = fleet.cloned();
        let endpoint = match &fleet {
            Some(f) => f.advertised(bound),
            None => format!("http://{bound}"),
        };
        let heartbeat = fleet.as_ref().map_or(10, |f| f.heartbeat_secs);
        let max_packet_size = fleet
            .as_ref()
            .map_or(config::DEFAULT_MAX_PACKET, |f| f.max_packet_size);
        let key = fleet
            .as_ref()
            .and_then(|f| f.token.as_ref())
            .map(|token| MessageKey::from_token(token.expose()));
        let own = HostRecord {
            v: record::RECORD_VERSION,
            id: host.id.clone(),
            name: host.display_name().to_string(),
            environment_id: host.environment_id.clone(),
            status: RecordStatus::Online,
            capabilities,
            endpoint: Some(endpoint),
            estop: None,
            heartbeat_secs: Some(heartbeat),
            created_at_ms: crate::clock::now_ms(),
            last_heartbeat_ms: None,
            instance: Some(uuid::Uuid::new_v4().to_string()),
        };
        Fleet {
            view: Mutex::new(FleetView::new(&host.id, Duration::from_secs(heartbeat))),
            topics: Topics::new(
                fleet
                    .as_ref()
                    .map_or(config::DEFAULT_PREFIX, |f| f.topic_prefix.as_str()),
            ),
            config: fleet,
            own,
            estop,
            changed: tokio::sync::watch::Sender::new(0),
            client: Mutex::new(None),
            link: LinkCounters::new(max_packet_size),
            task: Mutex::new(None),
            bound,
            key,
            gate: Mutex::new(StopGate::new()),
            ignored: IgnoredCounters::default(),
            stamp_floor: Mutex::new(0),
        }
    }

    pub fn config(&self) -> Option<&FleetConfig> {
        self.config.as_ref()
    }

    pub fn own_id(&self) -> &str {
        &self.own.id
    }

    pub fn environment_id(&self) -> &str {
        &self.own.environment_id
    }

    pub fn topics(&self) -> &Topics {
        &self.topics
    }

    /// Whether the broker connection is up (always `false` without `[fleet]`).
    pub fn is_connected(&self) -> bool {
        self.link.is_connected()
    }

    /// The broker connection's counters (`None` without `[fleet]`).
    pub fn link_stats(&self) -> Option<LinkStats> {
        self.config.as_ref().map(|_| self.link.stats())
    }

    /// This host's record now.
    pub fn own_record(&self, status: RecordStatus) -> HostRecord {
        let mut record = self.own.clone();
        record.status = status;
        record.estop = Some(match self.estop.active() {
            Some(stop) => EstopState {
                active: true,
                source: Some(stop.source),
                reason: Some(stop.reason),
                since_unix_ms: Some(stop.since_unix_ms),
            },
            None => EstopState::default(),
        });
        record.last_heartbeat_ms = Some(crate::clock::now_ms());
        record
    }

    /// This host's record as published: its stamp later than any record
    /// published under this host's id before (by this process, or — as
    /// far as the broker's retained record shows — by an earlier one), and
    /// sealed for its topic.
    pub(crate) fn sealed_own_record(&self, status: RecordStatus) -> Result<Vec<u8>, FleetError> {
        let mut record = self.own_record(status);
        record.last_heartbeat_ms = Some(self.next_stamp());
        self.seal(&self.topics.host(&record.id), &record)
    }

    fn next_stamp(&self) -> i64 {
        let mut floor = lock(&self.stamp_floor);
        let stamp = crate::clock::now_ms().max(floor.saturating_add(1));
        *floor = stamp;
        stamp
    }

    /// `body` as JSON, sealed for `topic`.
    fn seal(&self, topic: &str, body: &impl serde::Serialize) -> Result<Vec<u8>, FleetError> {
        let Some(key) = &self.key else {
            return Err(FleetError::NotConfigured);
        };
        let json = serde_json::to_string(body).map_err(|e| FleetError::Invalid(e.to_string()))?;
        Ok(seal::seal(key, topic, &json))
    }

    /// The body of an authentic message on `topic`.
    fn open(&self, topic: &str, payload: &[u8]) -> Result<String, seal::Unauthentic> {
        match &self.key {
            Some(key) => seal::open(key, topic, payload),
            None => Err(seal::Unauthentic::NotSealed),
        }
    }

    /// What this host ignored from the broker so far.
    pub fn ignored(&self) -> Ignored {
        self.ignored.snapshot()
    }

    fn own_view(&self) -> HostView {
        HostView {
            record: self.own_record(RecordStatus::Online),
            presence: Presence::Online,
            this_host: true,
            heard_ago: None,
        }
    }

    /// Every known host (this one included), ordered by id; only those of
    /// `environment_id` when given.
    pub fn list(&self, environment_id: Option<&str>) -> Vec<HostView> {
        let now = Instant::now();
        let mut hosts = vec![self.own_view()];
        {
            let view = lock(&self.view);
            hosts.extend(view.entries().map(|e| HostView {
                record: e.record.clone(),
                presence: view.presence_of(e, now),
                this_host: false,
                heard_ago: Some(now.saturating_duration_since(e.received_at)),
            }));
        }
        hosts.retain(|h| environment_id.is_none_or(|env| h.record.environment_id == env));
        hosts.sort_by(|a, b| a.record.id.cmp(&b.record.id));
        hosts
    }

    pub fn get(&self, id: &str) -> Option<HostView> {
        if id == self.own.id {
            return Some(self.own_view());
        }
        let now = Instant::now();
        let view = lock(&self.view);
        view.get(id).map(|e| HostView {
            record: e.record.clone(),
            presence: view.presence_of(e, now),
            this_host: false,
            heard_ago: Some(now.saturating_duration_since(e.received_at)),
        })
    }

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
        let view = lock(&self.view);
        let Some(entry) = view.get(host_id) else {
            return Err(RouteError::NotFound(format!(
                "no host {host_id:?} in the fleet registry"
            )));
        };
        match view.presence_of(entry, now) {
            Presence::Registered => Err(RouteError::NotFound(format!(
                "host {host_id:?} is registered, but it is not a rozd: it runs no sessions"
            ))),
            Presence::Offline => Err(RouteError::Unavailable(format!(
                "host {host_id:?} is offline"
            ))),
            Presence::Online | Presence::Stale => {
                let Some(endpoint) = &entry.record.endpoint else {
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
                // A record that old is not a heartbeat of a running host:
                // its endpoint is not trusted with the fleet token.
                let heartbeat = entry.record.heartbeat_secs.unwrap_or(config.heartbeat_secs);
                let max_age_ms = i64::try_from(heartbeat)
                    .unwrap_or(i64::MAX)
                    .saturating_mul(1000)
                    .saturating_mul(i64::from(view::STALE_AFTER_HEARTBEATS))
                    .saturating_add(stop::MAX_CLOCK_SKEW_MS);
                let age_ms = crate::clock::now_ms().saturating_sub(entry.record.stamp_ms());
                if age_ms > max_age_ms {
                    return Err(RouteError::Unavailable(format!(
                        "host {host_id:?} has not published a record for {} s; its endpoint is \
                         used again once it does",
                        age_ms / 1000
                    )));
                }
                Ok(Route::Remote(RemoteHost {
                    id: host_id.to_string(),
                    endpoint: endpoint.clone(),
                    token: config.token.clone(),
                    relayed_by: self.own.id.clone(),
                }))
            }
        }
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

    /// Adds a host that is not a rozd: it gets an id and a retained record
    /// with status `registered`. An empty `environment_id` means this host's.
    pub fn register(
        &self,
        name: &str,
        environment_id: &str,
        capabilities: BTreeMap<String, String>,
    ) -> Result<HostView, FleetError> {
        if self.config.is_none() {
            return Err(FleetError::NotConfigured);
        }
        let environment_id = if environment_id.is_empty() {
            self.own.environment_id.as_str()
        } else {
            environment_id
        };
        record::check_host_fields(name, environment_id, &capabilities)
            .map_err(|e| FleetError::Invalid(e.to_string()))?;
        let record = HostRecord {
            v: record::RECORD_VERSION,
            id: uuid::Uuid::new_v4().to_string(),
            name: name.trim().to_string(),
            environment_id: environment_id.to_string(),
            status: RecordStatus::Registered,
            capabilities,
            endpoint: None,
            estop: None,
            heartbeat_secs: None,
            created_at_ms: crate::clock::now_ms(),
            last_heartbeat_ms: None,
            instance: None,
        };
        let payload = self.seal(&self.topics.host(&record.id), &record)?;
        if payload.len() > record::MAX_RECORD_BYTES {
            return Err(FleetError::Invalid(format!(
                "the record would be {} bytes; at most {} are allowed",
                payload.len(),
                record::MAX_RECORD_BYTES
            )));
        }
        self.publish(&self.topics.host(&record.id), payload, true)?;
        tracing::info!(id = %record.id, name = %record.name, environment_id = %record.environment_id, "registered a host");
        let now = Instant::now();
        let stored = lock(&self.view).insert(record.clone(), now);
        if let Err(e) = stored {
            tracing::warn!("the registered host is published but not in this view: {e}");
        }
        self.bump();
        Ok(HostView {
            record,
            presence: Presence::Registered,
            this_host: false,
            heard_ago: Some(Duration::ZERO),
        })
    }

    /// Removes a registered host's record, or an offline rozd's, and clears
    /// its retained message. A live rozd cannot be removed.
    pub fn deregister(&self, id: &str) -> Result<(), FleetError> {
        if id == self.own.id {
            return Err(FleetError::Live(id.to_string()));
        }
        if self.config.is_none() {
            return Err(FleetError::NotFound(id.to_string()));
        }
        match self.get(id) {
            None => return Err(FleetError::NotFound(id.to_string())),
            Some(h) if h.presence.is_live() => return Err(FleetError::Live(id.to_string())),
            Some(_) => {}
        }
        self.publish(&self.topics.host(id), Vec::new(), true)?;
        lock(&self.view).remove(id);
        tracing::info!(id, "deregistered a host");
        self.bump();
        Ok(())
    }

    /// Publishes a retained fleet stop command (`stop`) or its withdrawal
    /// for `environment_id`. Returns the command.
    pub fn publish_estop(
        &self,
        environment_id: &str,
        stop: bool,
        reason: &str,
    ) -> Result<EstopCommand, FleetError> {
        if self.config.is_none() {
            return Err(FleetError::NotConfigured);
        }
        if !config::topic_level_ok(environment_id) {
            return Err(FleetError::Invalid(format!(
                "environment_id {environment_id:?} must be 1-128 characters without '/', '+', '#'"
            )));
        }
        let command = EstopCommand {
            stop,
            reason: reason.to_string(),
            by: Some(self.own.id.clone()),
            id: Some(uuid::Uuid::new_v4().to_string()),
            at_ms: Some(crate::clock::now_ms()),
        };
        let topic = self.topics.estop(environment_id);
        let payload = self.seal(&topic, &command)?;
        if payload.len() > record::MAX_COMMAND_BYTES {
            return Err(FleetError::Invalid(format!(
                "the command would be {} bytes; at most {} are allowed (shorten the reason)",
                payload.len(),
                record::MAX_COMMAND_BYTES
            )));
        }
        self.publish(&topic, payload, true)?;
        if environment_id == self.own.environment_id {
            // The caller applies it here; its echo from the broker is not
            // applied again.
            lock(&self.gate).published(&command, crate::clock::now_ms());
        }
        tracing::warn!(
            environment_id,
            stop,
            reason,
            "published the fleet protective-stop command"
        );
        Ok(command)
    }

    /// How many hosts the registry holds (this one included).
    pub fn host_count(&self) -> usize {
        lock(&self.view).len() + 1
    }

    /// Changes whenever the view (or this host's stop) changes.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Waits until `done` holds for the listed hosts, or `within` passed;
    /// returns whether it held. Re-checks after changes of the view, at
    /// most every [`RECHECK_EVERY`] (a burst of records costs one listing).
    pub async fn wait_for(
        &self,
        within: Duration,
        mut done: impl FnMut(&[HostView]) -> bool,
    ) -> bool {
        let mut changes = self.changed.subscribe();
        let deadline = Instant::now() + within;
        loop {
            changes.borrow_and_update();
            if done(&self.list(None)) {
                return true;
            }
            // The sender lives in `self`: `changed` fails only at the deadline.
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .is_err()
            {
                return done(&self.list(None));
            }
            tokio::time::sleep_until(deadline.min(Instant::now() + RECHECK_EVERY)).await;
        }
    }

    /// Waits until the broker connection task has ended (after shutdown).
    pub async fn join(&self) {
        let task = lock(&self.task).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn publish(&self, topic: &str, payload: Vec<u8>, retain: bool) -> Result<(), FleetError> {
        let client = lock(&self.client).clone();
        let Some(client) = client else {
            return Err(if self.config.is_some() {
                FleetError::Disconnected
            } else {
                FleetError::NotConfigured
            });
        };
        if !self.is_connected() {
            return Err(FleetError::Disconnected);
        }
        self.link
            .check_publish(topic, payload.len())
            .map_err(FleetError::Invalid)?;
        client
            .try_publish(
                topic,
                rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
                retain,
                payload,
            )
            .map_err(|_| FleetError::Busy)
    }

    /// Takes in a message from the broker on the record topic of `id`
    /// (`topic`); logs what changed, counts what it ignores.
    fn record_received(&self, id: &str, topic: &str, payload: &[u8]) -> Result<(), Rejected> {
        let taken = self.take_record(id, topic, payload);
        if let Err(why) = &taken {
            self.ignored.record(why);
        }
        taken
    }

    fn take_record(&self, id: &str, topic: &str, payload: &[u8]) -> Result<(), Rejected> {
        // An empty payload is the broker saying the retained record was
        // cleared (deregistered): nothing to authenticate.
        let body = if payload.is_empty() {
            String::new()
        } else {
            if payload.len() > record::MAX_RECORD_BYTES {
                return Err(Rejected::Oversized {
                    len: payload.len(),
                    max: record::MAX_RECORD_BYTES,
                });
            }
            self.open(topic, payload)?
        };
        let applied =
            lock(&self.view).apply(id, body.as_bytes(), Instant::now(), crate::clock::now_ms())?;
        match applied {
            Applied::Stored { id, before, now } if before != Some(now) => {
                tracing::info!(
                    host_id = %id,
                    from = before.map_or("unknown", Presence::as_str),
                    to = now.as_str(),
                    "fleet: host presence changed"
                );
            }
            Applied::Removed { id } => {
                tracing::info!(host_id = %id, "fleet: host record removed");
            }
            _ => {}
        }
        self.bump();
        Ok(())
    }

    /// A message on this host's own record topic.
    pub(crate) fn own_topic_message(&self, payload: &[u8]) -> OwnTopic {
        if payload.is_empty() {
            return OwnTopic::Replace;
        }
        let topic = self.topics.host(&self.own.id);
        let body = match self.open(&topic, payload) {
            Ok(body) => body,
            Err(why) => {
                self.ignored.record(&Rejected::Unauthenticated(why));
                return OwnTopic::Replace;
            }
        };
        let Ok(r) = record::parse_record(&self.own.id, body.as_bytes()) else {
            return OwnTopic::Replace;
        };
        // Our next record must be newer than any published under our id
        // (our previous run's, if this host's clock went back since); one
        // far in the future would be refused by the other hosts anyway.
        let stamp = r.stamp_ms();
        if stamp <= crate::clock::now_ms().saturating_add(stop::MAX_CLOCK_SKEW_MS) {
            let mut floor = lock(&self.stamp_floor);
            *floor = (*floor).max(stamp);
        }
        if r.status != RecordStatus::Online {
            return OwnTopic::Replace;
        }
        if r.instance == self.own.instance {
            return OwnTopic::Current;
        }
        // Started after us: another process with this host id. (An older
        // record is our own previous run's; ours replaces it.)
        if r.created_at_ms > self.own.created_at_ms {
            return OwnTopic::Impostor {
                instance: r.instance,
            };
        }
        OwnTopic::Replace
    }

    /// Judges a message on this host's stop topic: `Ok(None)` for an empty
    /// one (a cleared retained command). `fleet_latched_since`: when this
    /// host's stop from the fleet latched, if it holds one.
    pub(crate) fn command_received(
        &self,
        payload: &[u8],
        fleet_latched_since: Option<i64>,
    ) -> Result<Option<JudgedCommand>, Rejected> {
        let judged = self.judge_command(payload, fleet_latched_since);
        match &judged {
            Err(Rejected::Unauthenticated(_)) => {
                IgnoredCounters::count(&self.ignored.unauthenticated_commands);
            }
            Err(_) => IgnoredCounters::count(&self.ignored.invalid),
            Ok(Some(j)) => {
                if matches!(
                    j.verdict,
                    Verdict::Refused(stop::Refusal::Unauthenticated)
                        | Verdict::Stop(StopKind::Unauthenticated)
                ) {
                    IgnoredCounters::count(&self.ignored.unauthenticated_commands);
                } else if matches!(
                    j.verdict,
                    Verdict::Refused(_) | Verdict::Stop(StopKind::Replayed)
                ) {
                    IgnoredCounters::count(&self.ignored.stale_commands);
                }
            }
            Ok(None) => {}
        }
        judged
    }

    fn judge_command(
        &self,
        payload: &[u8],
        fleet_latched_since: Option<i64>,
    ) -> Result<Option<JudgedCommand>, Rejected> {
        if payload.len() > record::MAX_COMMAND_BYTES {
            return Err(Rejected::Oversized {
                len: payload.len(),
                max: record::MAX_COMMAND_BYTES,
            });
        }
        if payload.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        let topic = self.topics.estop(&self.own.environment_id);
        let (command, authentic) = match self.open(&topic, payload) {
            Ok(body) => match record::parse_command(body.as_bytes())? {
                Some(command) => (command, true),
                None => return Ok(None),
            },
            Err(why) => match record::parse_command(&seal::content(payload)) {
                // Read only to see whether it asks to stop.
                Ok(Some(command)) => (command, false),
                Ok(None) | Err(_) => return Err(Rejected::Unauthenticated(why)),
            },
        };
        let verdict = lock(&self.gate).decide(
            &command,
            authentic,
            crate::clock::now_ms(),
            fleet_latched_since,
        );
        Ok(Some(JudgedCommand { command, verdict }))
    }
}

/// The reason a fleet stop latches with on this host (its audit row):
/// who sent it only when the command is authentic.
pub(crate) fn stop_reason(environment_id: &str, command: &EstopCommand, kind: StopKind) -> String {
    let by = command.by.as_deref().unwrap_or("an unnamed fleet member");
    let (from, reason) = match kind {
        StopKind::Authentic => (format!("host {by}"), command.reason.as_str()),
        StopKind::Replayed => (
            format!("a replayed or late command first issued by host {by}"),
            command.reason.as_str(),
        ),
        // Nothing in it is trusted: not who it claims to be, not its reason.
        StopKind::Unauthenticated => ("an unauthenticated MQTT publisher".to_string(), ""),
    };
    if reason.is_empty() {
        format!("fleet stop of environment {environment_id} from {from}")
    } else {
        format!("fleet stop of environment {environment_id} from {from}: {reason}")
    }
}

/// Connects this host to the fleet broker (if `[fleet]` is configured):
/// presence, the view and the fleet stop run until the daemon shuts down.
pub fn start(ctx: &Arc<HostContext>) -> Result<(), FleetError> {
    presence::start(ctx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::types::ServerConfig;

    const TOKEN: &str = "unit-fleet-token";

    /// A token file for the tests (kept for the whole test run).
    fn token_file() -> &'static std::path::Path {
        static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
        let dir = DIR.get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("fleet-token"), format!("{TOKEN}\n")).unwrap();
            dir
        });
        Box::leak(dir.path().join("fleet-token").into_boxed_path())
    }

    /// This host `a` in environment `lab`, offering the `observe` tool, on
    /// the broker of `section` (a `[fleet]` table) if it is not empty.
    fn fleet(section: &str) -> Fleet {
        let host: HostConfig = toml::from_str("id = \"a\"\nenvironment_id = \"lab\"\n").unwrap();
        let fleet = section.strip_prefix("[fleet]\n").map(|table| {
            let mut f: FleetConfig = toml::from_str(&format!(
                "{table}token_file = {:?}\n",
                token_file().display().to_string()
            ))
            .unwrap();
            config::validate(&mut f, &host, &ServerConfig::default(), None).unwrap();
            f
        });
        let offer = Offer {
            host_tools: vec!["observe".into()],
            ..Offer::default()
        };
        Fleet::new(
            &host,
            fleet.as_ref(),
            offer,
            "127.0.0.1:7000".parse().unwrap(),
            ProtectiveStop::default(),
        )
    }

    const FLEET: &str = "[fleet]\nurl = \"mqtt://127.0.0.1:1\"\nheartbeat_secs = 2\n";

    fn key() -> MessageKey {
        MessageKey::from_token(TOKEN)
    }

    fn record_of(f: &Fleet, id: &str, status: RecordStatus, endpoint: Option<&str>) -> HostRecord {
        let mut r = f.own_record(status);
        r.id = id.into();
        r.endpoint = endpoint.map(str::to_string);
        r.instance = None;
        r
    }

    fn sealed_record(r: &HostRecord) -> Vec<u8> {
        let topic = format!("roz/v1/hosts/{}", r.id);
        seal::seal(&key(), &topic, &serde_json::to_string(r).unwrap())
    }

    fn receive(f: &Fleet, r: &HostRecord) -> Result<(), Rejected> {
        f.record_received(&r.id, &format!("roz/v1/hosts/{}", r.id), &sealed_record(r))
    }

    fn put(f: &Fleet, id: &str, status: RecordStatus, endpoint: Option<&str>) {
        receive(f, &record_of(f, id, status, endpoint)).unwrap();
    }

    #[test]
    fn without_a_fleet_only_this_host_is_known() {
        let f = fleet("");
        let hosts = f.list(None);
        assert_eq!(hosts.len(), 1);
        assert!(hosts[0].this_host);
        assert_eq!(hosts[0].presence, Presence::Online);
        assert_eq!(
            hosts[0].record.endpoint.as_deref(),
            Some("http://127.0.0.1:7000")
        );
        assert_eq!(f.route("", None), Ok(Route::Local));
        assert_eq!(f.route("a", None), Ok(Route::Local));
        assert_eq!(f.route("a", Some("b")), Ok(Route::Local));
        assert!(
            matches!(f.route("b", None), Err(RouteError::NotFound(m)) if m.contains("[fleet]"))
        );
        assert!(matches!(
            f.register("x", "", BTreeMap::new()),
            Err(FleetError::NotConfigured)
        ));
        assert!(matches!(f.deregister("a"), Err(FleetError::Live(_))));
        assert!(matches!(f.deregister("b"), Err(FleetError::NotFound(_))));
        assert!(matches!(
            f.publish_estop("lab", true, "x"),
            Err(FleetError::NotConfigured)
        ));
        assert!(matches!(
            f.sealed_own_record(RecordStatus::Online),
            Err(FleetError::NotConfigured)
        ));
    }

    #[test]
    fn routes_follow_presence() {
        let f = fleet(FLEET);
        put(&f, "b", RecordStatus::Online, Some("http://127.0.0.1:7001"));
        put(
            &f,
            "c",
            RecordStatus::Offline,
            Some("http://127.0.0.1:7002"),
        );
        put(&f, "r", RecordStatus::Registered, None);
        put(&f, "n", RecordStatus::Online, None);
        assert_eq!(
            f.route("b", None),
            Ok(Route::Remote(RemoteHost {
                id: "b".into(),
                endpoint: "http://127.0.0.1:7001".into(),
                token: Some(Secret::new(TOKEN)),
                relayed_by: "a".into(),
            }))
        );
        assert!(matches!(
            f.route("c", None),
            Err(RouteError::Unavailable(_))
        ));
        assert!(matches!(f.route("r", None), Err(RouteError::NotFound(_))));
        assert!(matches!(
            f.route("n", None),
            Err(RouteError::Unavailable(_))
        ));
        assert!(matches!(f.route("zz", None), Err(RouteError::NotFound(_))));
        let ids: Vec<String> = f.list(None).into_iter().map(|h| h.record.id).collect();
        assert_eq!(ids, ["a", "b", "c", "n", "r"]);
        assert_eq!(f.list(Some("elsewhere")).len(), 0);
        // a live rozd cannot be deregistered; unconnected, nothing is published
        assert!(matches!(f.deregister("b"), Err(FleetError::Live(_))));
        assert!(matches!(f.deregister("c"), Err(FleetError::Disconnected)));
    }

    #[test]
    fn one_hop_and_never_to_itself() {
        let f = fleet(FLEET);
        put(&f, "b", RecordStatus::Online, Some("http://127.0.0.1:7001"));
        // relayed here by another host: served here or refused, never relayed on
        assert_eq!(f.route("a", Some("b")), Ok(Route::Local));
        assert!(matches!(
            f.route("b", Some("c")),
            Err(RouteError::Unavailable(m)) if m.contains("one hop")
        ));
        assert!(matches!(
            f.route("nowhere", Some("c")),
            Err(RouteError::Unavailable(_))
        ));
        // records that point back at this host
        for (id, endpoint) in [
            ("s1", "http://127.0.0.1:7000"),
            ("s2", "http://127.0.0.1:7000/"),
            ("s3", "http://localhost:7000"),
            ("s4", "http://[::1]:7000"),
            ("s5", "http://0.0.0.0:7000"),
        ] {
            put(&f, id, RecordStatus::Online, Some(endpoint));
            assert!(
                matches!(f.route(id, None), Err(RouteError::Unavailable(m)) if m.contains("itself")),
                "{endpoint}"
            );
        }
        // another port on loopback is another host
        put(&f, "o", RecordStatus::Online, Some("http://localhost:7003"));
        assert!(matches!(f.route("o", None), Ok(Route::Remote(_))));
    }

    #[test]
    fn an_old_record_is_not_routed_to() {
        let f = fleet(FLEET);
        let mut r = record_of(&f, "b", RecordStatus::Online, Some("http://127.0.0.1:7001"));
        // three heartbeats (2 s) and the clock skew allowance ago, and more
        r.last_heartbeat_ms =
            Some(crate::clock::now_ms() - 6_000 - stop::MAX_CLOCK_SKEW_MS - 1_000);
        receive(&f, &r).unwrap();
        assert!(matches!(
            f.route("b", None),
            Err(RouteError::Unavailable(m)) if m.contains("has not published")
        ));
        r.last_heartbeat_ms = Some(crate::clock::now_ms());
        receive(&f, &r).unwrap();
        assert!(matches!(f.route("b", None), Ok(Route::Remote(_))));
    }

    #[test]
    fn unauthenticated_records_are_ignored_and_counted() {
        let f = fleet(FLEET);
        let r = record_of(&f, "x", RecordStatus::Online, Some("http://127.0.0.1:9"));
        let plain = serde_json::to_vec(&r).unwrap();
        assert!(matches!(
            f.record_received("x", "roz/v1/hosts/x", &plain),
            Err(Rejected::Unauthenticated(seal::Unauthentic::NotSealed))
        ));
        // sealed with another key, or for another topic
        let other = seal::seal(
            &MessageKey::from_token("not the fleet's"),
            "roz/v1/hosts/x",
            &serde_json::to_string(&r).unwrap(),
        );
        assert!(f.record_received("x", "roz/v1/hosts/x", &other).is_err());
        let moved = sealed_record(&r);
        assert!(f.record_received("y", "roz/v1/hosts/y", &moved).is_err());
        assert!(f.get("x").is_none() && f.get("y").is_none());
        assert!(matches!(f.route("x", None), Err(RouteError::NotFound(_))));
        assert_eq!(f.ignored().unauthenticated_records, 3);
        // garbage is invalid or unauthenticated, never taken
        assert!(
            f.record_received(
                "x",
                "roz/v1/hosts/x",
                &vec![b'x'; record::MAX_RECORD_BYTES + 1]
            )
            .is_err()
        );
        assert_eq!(f.ignored().invalid, 1);
        // an authentic record for this host itself is not kept
        let mut own = record_of(&f, "a", RecordStatus::Online, None);
        own.instance = Some("other".into());
        assert!(receive(&f, &own).is_err());
        assert_eq!(f.ignored().invalid, 2);
    }

    #[test]
    fn records_only_move_forward() {
        let f = fleet(FLEET);
        let mut old = record_of(&f, "b", RecordStatus::Online, Some("http://10.0.0.1:1"));
        old.instance = Some("i1".into());
        old.last_heartbeat_ms = Some(crate::clock::now_ms() - 1_000);
        let mut new = old.clone();
        new.endpoint = Some("http://10.0.0.2:1".into());
        new.last_heartbeat_ms = Some(crate::clock::now_ms());
        receive(&f, &old).unwrap();
        receive(&f, &new).unwrap();
        // the old record replayed
        assert!(matches!(receive(&f, &old), Err(Rejected::Replayed { .. })));
        assert_eq!(
            f.get("b").unwrap().record.endpoint.as_deref(),
            Some("http://10.0.0.2:1")
        );
        // also after the record was cleared from the broker
        f.record_received("b", "roz/v1/hosts/b", b"").unwrap();
        assert!(f.get("b").is_none());
        assert!(receive(&f, &old).is_err());
        assert!(f.get("b").is_none());
        receive(&f, &new).unwrap();
        // its last will, written when its connection opened, is taken
        let mut will = old.clone();
        will.status = RecordStatus::Offline;
        receive(&f, &will).unwrap();
        assert_eq!(f.get("b").unwrap().presence, Presence::Offline);
        // another process's old will is not
        let mut stranger = will.clone();
        stranger.instance = Some("i0".into());
        assert!(receive(&f, &stranger).is_err());
        // a record from the future
        let mut ahead = new.clone();
        ahead.last_heartbeat_ms = Some(crate::clock::now_ms() + 2 * stop::MAX_CLOCK_SKEW_MS);
        assert!(matches!(receive(&f, &ahead), Err(Rejected::Future { .. })));
        assert_eq!(f.ignored().replayed_records, 4);
    }

    #[test]
    fn own_record_reports_the_stop() {
        let f = fleet(FLEET);
        assert_eq!(
            f.own_record(RecordStatus::Online).estop,
            Some(EstopState::default())
        );
        f.estop.trigger(FLEET_SOURCE, "drill");
        let estop = f.own_record(RecordStatus::Online).estop.unwrap();
        assert!(estop.active);
        assert_eq!(estop.source.as_deref(), Some(FLEET_SOURCE));
        assert!(f.list(None)[0].estop_active());
        let caps = &f.own.capabilities;
        assert_eq!(caps["host_tools"], "observe");
        assert_eq!(caps["models"], "local");
        assert_eq!(caps["version"], crate::VERSION);
    }

    fn own_published(payload: &[u8]) -> HostRecord {
        let body = seal::open(&key(), "roz/v1/hosts/a", payload).unwrap();
        serde_json::from_str(&body).unwrap()
    }

    #[test]
    fn own_records_are_sealed_and_their_stamps_only_grow() {
        let f = fleet(FLEET);
        let first = own_published(&f.sealed_own_record(RecordStatus::Online).unwrap());
        let second = own_published(&f.sealed_own_record(RecordStatus::Online).unwrap());
        assert!(second.stamp_ms() > first.stamp_ms());
        assert_eq!(
            f.own_topic_message(&f.sealed_own_record(RecordStatus::Online).unwrap()),
            OwnTopic::Current
        );
        // our previous run's record, published with a clock that was ahead:
        // ours continue after it
        let mut previous = first.clone();
        previous.instance = Some("earlier".into());
        previous.created_at_ms -= 1;
        previous.last_heartbeat_ms = Some(crate::clock::now_ms() + 60_000);
        assert_eq!(
            f.own_topic_message(&sealed_record(&previous)),
            OwnTopic::Replace
        );
        let next = own_published(&f.sealed_own_record(RecordStatus::Online).unwrap());
        assert!(next.stamp_ms() > previous.stamp_ms());
        // a forgery on our topic is replaced (and counted)
        let mut forged = first.clone();
        forged.status = RecordStatus::Offline;
        assert_eq!(
            f.own_topic_message(&serde_json::to_vec(&forged).unwrap()),
            OwnTopic::Replace
        );
        assert_eq!(f.ignored().unauthenticated_records, 1);
        // another process with our id, started after us
        let mut twin = first;
        twin.instance = Some("twin".into());
        twin.created_at_ms += 1;
        assert_eq!(
            f.own_topic_message(&sealed_record(&twin)),
            OwnTopic::Impostor {
                instance: Some("twin".into())
            }
        );
    }

    fn sealed_command(stop: bool, id: &str, at_ms: i64) -> Vec<u8> {
        let c = EstopCommand {
            stop,
            reason: "drill".into(),
            by: Some("b".into()),
            id: Some(id.into()),
            at_ms: Some(at_ms),
        };
        seal::seal(
            &key(),
            "roz/v1/estop/lab",
            &serde_json::to_string(&c).unwrap(),
        )
    }

    fn verdict(f: &Fleet, payload: &[u8]) -> Verdict {
        f.command_received(payload, None).unwrap().unwrap().verdict
    }

    #[test]
    fn stop_commands_anyone_may_stop_only_the_fleet_clears() {
        let f = fleet(FLEET);
        let now = crate::clock::now_ms();
        assert_eq!(f.command_received(b"", None), Ok(None));
        assert_eq!(
            verdict(&f, &sealed_command(true, "s1", now)),
            Verdict::Stop(StopKind::Authentic)
        );
        assert_eq!(
            verdict(&f, &sealed_command(true, "s1", now)),
            Verdict::AlreadyApplied
        );
        // forged clears: plain JSON, a sealed one altered, another key
        let forged = br#"{"stop":false,"id":"x","by":"b","at_ms":99999999999999}"#;
        assert_eq!(
            verdict(&f, forged),
            Verdict::Refused(stop::Refusal::Unauthenticated)
        );
        let mut altered: serde_json::Value =
            serde_json::from_slice(&sealed_command(false, "c0", now + 1)).unwrap();
        altered["body"] = altered["body"]
            .as_str()
            .unwrap()
            .replace("drill", "dril!")
            .into();
        assert_eq!(
            verdict(&f, &serde_json::to_vec(&altered).unwrap()),
            Verdict::Refused(stop::Refusal::Unauthenticated)
        );
        assert_eq!(f.ignored().unauthenticated_commands, 2);
        // a bare stop, or a stop sealed with the wrong key, latches
        assert_eq!(
            verdict(&f, b"stop"),
            Verdict::Stop(StopKind::Unauthenticated)
        );
        let wrong_key = seal::seal(
            &MessageKey::from_token("old token"),
            "roz/v1/estop/lab",
            r#"{"stop":true,"by":"c"}"#,
        );
        assert_eq!(
            verdict(&f, &wrong_key),
            Verdict::Stop(StopKind::Unauthenticated)
        );
        // garbage is counted and changes nothing
        assert!(f.command_received(b"\xff\x00", None).is_err());
        assert_eq!(f.ignored().unauthenticated_commands, 5);
        // a sealed stop moved from another environment's topic is not authentic
        let elsewhere = seal::seal(
            &key(),
            "roz/v1/estop/other",
            &serde_json::to_string(&EstopCommand {
                stop: false,
                reason: String::new(),
                by: None,
                id: Some("m".into()),
                at_ms: Some(now + 10),
            })
            .unwrap(),
        );
        assert_eq!(
            verdict(&f, &elsewhere),
            Verdict::Refused(stop::Refusal::Unauthenticated)
        );
        // the fleet's own clear, issued after the stops
        let clear_at = crate::clock::now_ms() + 1;
        assert_eq!(
            verdict(&f, &sealed_command(false, "c1", clear_at)),
            Verdict::Clear
        );
        // replayed after a newer stop: refused
        assert_eq!(
            verdict(&f, &sealed_command(true, "s2", clear_at + 1)),
            Verdict::Stop(StopKind::Authentic)
        );
        assert!(matches!(
            verdict(&f, &sealed_command(false, "c1", clear_at)),
            Verdict::Refused(stop::Refusal::OlderThanApplied { .. })
        ));
        assert_eq!(f.ignored().stale_commands, 1);
        let oversized = vec![b' '; record::MAX_COMMAND_BYTES + 1];
        assert!(f.command_received(&oversized, None).is_err());
        assert_eq!(f.ignored().invalid, 1);
    }

    #[test]
    fn the_audit_names_only_authentic_senders() {
        let mut c = EstopCommand {
            stop: true,
            reason: "smoke".into(),
            by: Some("mallory".into()),
            id: None,
            at_ms: None,
        };
        assert_eq!(
            stop_reason("lab", &c, StopKind::Unauthenticated),
            "fleet stop of environment lab from an unauthenticated MQTT publisher"
        );
        c.by = Some("b".into());
        assert_eq!(
            stop_reason("lab", &c, StopKind::Authentic),
            "fleet stop of environment lab from host b: smoke"
        );
        assert!(stop_reason("lab", &c, StopKind::Replayed).contains("replayed"));
    }
}
