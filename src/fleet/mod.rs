//! Fleet: hosts by `host_id`, with the registry carried by an MQTT broker.
//!
//! - **Presence.** Each rozd publishes its [`record::HostRecord`] as a
//!   retained message on `<prefix>/hosts/<host_id>`, refreshes it every
//!   `heartbeat_secs` and whenever its protective stop changes, and leaves a
//!   last will that marks it `offline` if the broker loses its connection;
//!   on a clean shutdown it publishes `offline` itself.
//! - **View.** Every rozd subscribes to `<prefix>/hosts/+` and keeps the
//!   [`view::FleetView`] (online / stale / offline / registered). Records that
//!   are malformed, oversized or published on another host's topic are
//!   ignored with a rate-limited log line.
//! - **Routing.** [`Fleet::route`] says where a `host_id` lives: here, at
//!   another rozd's advertised endpoint (with the fleet token to present), or
//!   nowhere reachable ([`RouteError`]). Sessions use it (`api::relay`); it is
//!   the one lookup anything else routed by host should use too.
//! - **Fleet stop.** A retained command on `<prefix>/estop/<environment_id>`
//!   latches the protective stop of every host of that environment (source
//!   `fleet`); withdrawing it clears the latches that came from the fleet.
//!
//! Without `[fleet]` the registry holds only this host, routing to any other
//! id is `NotFound`, and registering or fleet stops are refused.

pub mod config;
mod presence;
pub mod record;
pub mod view;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use config::FleetConfig;
use record::{EstopCommand, EstopState, HostRecord, RecordStatus, Rejected, Topics};
use view::{Applied, FleetView, Presence};

use crate::HostContext;
use crate::config::{Config, Secret};
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
    /// The id of the last stop command applied (each is applied once).
    last_command: Mutex<Option<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Fleet {
    /// The registry of the host that `config` describes, bound to `bound`.
    /// No I/O: [`start`] connects to the broker.
    pub fn new(
        config: &Config,
        bound: SocketAddr,
        host_tools: Vec<String>,
        estop: ProtectiveStop,
    ) -> Fleet {
        let host = &config.host;
        let names = |v: Vec<&str>| v.join(",");
        let mut models = vec!["local"];
        models.extend(config.model.endpoints.iter().map(|e| e.name.as_str()));
        let capabilities = BTreeMap::from([
            (
                "sensors".to_string(),
                names(config.sensors.iter().map(|s| s.name.as_str()).collect()),
            ),
            (
                "actuators".to_string(),
                names(config.actuators.iter().map(|a| a.name.as_str()).collect()),
            ),
            ("host_tools".to_string(), host_tools.join(",")),
            ("models".to_string(), names(models)),
            (
                "architecture".to_string(),
                std::env::consts::ARCH.to_string(),
            ),
            ("os".to_string(), std::env::consts::OS.to_string()),
            ("version".to_string(), crate::VERSION.to_string()),
        ]);
        let fleet = config.fleet.clone();
        let endpoint = match &fleet {
            Some(f) => f.advertised(bound),
            None => format!("http://{bound}"),
        };
        let heartbeat = fleet.as_ref().map_or(10, |f| f.heartbeat_secs);
        let max_packet_size = fleet
            .as_ref()
            .map_or(config::DEFAULT_MAX_PACKET, |f| f.max_packet_size);
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
            created_at_ms: crate::store::now_ms(),
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
            last_command: Mutex::new(None),
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
        record.last_heartbeat_ms = Some(crate::store::now_ms());
        record
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
    pub fn route(&self, host_id: &str) -> Result<Route, RouteError> {
        if host_id.is_empty() || host_id == self.own.id {
            return Ok(Route::Local);
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
            Presence::Online | Presence::Stale => match &entry.record.endpoint {
                Some(endpoint) => Ok(Route::Remote(RemoteHost {
                    id: host_id.to_string(),
                    endpoint: endpoint.clone(),
                    token: config.token.clone(),
                })),
                None => Err(RouteError::Unavailable(format!(
                    "host {host_id:?} advertises no endpoint"
                ))),
            },
        }
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
            created_at_ms: crate::store::now_ms(),
            last_heartbeat_ms: None,
            instance: None,
        };
        let payload =
            serde_json::to_vec(&record).map_err(|e| FleetError::Invalid(e.to_string()))?;
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
            at_ms: Some(crate::store::now_ms()),
        };
        let payload =
            serde_json::to_vec(&command).map_err(|e| FleetError::Invalid(e.to_string()))?;
        self.publish(&self.topics.estop(environment_id), payload, true)?;
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

    /// Takes in a host record from the broker; logs what changed.
    fn record_received(&self, id: &str, payload: &[u8]) -> Result<(), Rejected> {
        let applied = lock(&self.view).apply(id, payload, Instant::now())?;
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

    /// Whether `command` is new (not applied before); remembers it.
    fn take_command(&self, command: &EstopCommand) -> bool {
        let Some(id) = &command.id else {
            return true;
        };
        let mut last = lock(&self.last_command);
        if last.as_deref() == Some(id.as_str()) {
            return false;
        }
        *last = Some(id.clone());
        true
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
    use crate::config::ConfigSource;

    fn fleet(extra: &str) -> Fleet {
        let config = Config::parse(
            &format!("[host]\nid = \"a\"\nenvironment_id = \"lab\"\n{extra}"),
            ConfigSource::BuiltIn,
        )
        .unwrap();
        Fleet::new(
            &config,
            "127.0.0.1:7000".parse().unwrap(),
            vec!["observe".into()],
            ProtectiveStop::default(),
        )
    }

    const FLEET: &str = "[fleet]\nurl = \"mqtt://127.0.0.1:1\"\nheartbeat_secs = 2\n";

    fn put(f: &Fleet, id: &str, status: RecordStatus, endpoint: Option<&str>) {
        let mut r = f.own_record(status);
        r.id = id.into();
        r.endpoint = endpoint.map(str::to_string);
        r.instance = None;
        f.record_received(id, &serde_json::to_vec(&r).unwrap())
            .unwrap();
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
        assert_eq!(f.route(""), Ok(Route::Local));
        assert_eq!(f.route("a"), Ok(Route::Local));
        assert!(matches!(f.route("b"), Err(RouteError::NotFound(m)) if m.contains("[fleet]")));
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
            f.route("b"),
            Ok(Route::Remote(RemoteHost {
                id: "b".into(),
                endpoint: "http://127.0.0.1:7001".into(),
                token: None
            }))
        );
        assert!(matches!(f.route("c"), Err(RouteError::Unavailable(_))));
        assert!(matches!(f.route("r"), Err(RouteError::NotFound(_))));
        assert!(matches!(f.route("n"), Err(RouteError::Unavailable(_))));
        assert!(matches!(f.route("zz"), Err(RouteError::NotFound(_))));
        let ids: Vec<String> = f.list(None).into_iter().map(|h| h.record.id).collect();
        assert_eq!(ids, ["a", "b", "c", "n", "r"]);
        assert_eq!(f.list(Some("elsewhere")).len(), 0);
        // a live rozd cannot be deregistered; unconnected, nothing is published
        assert!(matches!(f.deregister("b"), Err(FleetError::Live(_))));
        assert!(matches!(f.deregister("c"), Err(FleetError::Disconnected)));
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

    #[test]
    fn each_stop_command_is_applied_once() {
        let f = fleet(FLEET);
        let cmd = |id: Option<&str>| EstopCommand {
            stop: true,
            reason: String::new(),
            by: None,
            id: id.map(str::to_string),
            at_ms: None,
        };
        assert!(f.take_command(&cmd(Some("1"))));
        assert!(!f.take_command(&cmd(Some("1"))));
        assert!(f.take_command(&cmd(Some("2"))));
        assert!(f.take_command(&cmd(None)));
        assert!(f.take_command(&cmd(None)));
    }
}
