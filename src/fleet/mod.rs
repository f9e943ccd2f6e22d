//! Fleet: hosts by `host_id`, with the registry carried by an MQTT broker.
//!
//! - **Authenticity.** Everything a rozd publishes on the broker (records,
//!   stop commands) is sealed with an HMAC under a key derived from the
//!   fleet token ([`seal`]); what is not sealed with it is ignored and
//!   counted ([`Ignored`]), except on the stop topic, where every message
//!   but the fleet's valid command latches, whoever sent it and whatever
//!   its form ([`stop`]: anyone may stop, only the fleet clears).
//! - **Presence.** Each rozd publishes its [`record::HostRecord`] as a
//!   retained message on `<prefix>/hosts/<environment_id>/<host_id>` when it
//!   changes (its connection opened, its protective stop changed), says it
//!   is alive every `heartbeat_secs` on its environment's liveness topic,
//!   and leaves a last will that marks it `offline` if the broker loses its
//!   connection; on a clean shutdown it publishes `offline` itself.
//! - **View.** A rozd subscribes to its own environment's records
//!   (`<prefix>/hosts/<environment_id>/+`), or with `[fleet] view = "fleet"`
//!   to every environment's (`<prefix>/hosts/+/+`), and keeps the
//!   [`view::FleetView`] (online / stale / lost / offline / registered) from
//!   the authentic records only. Records that are unauthenticated, replayed,
//!   malformed, oversized or published on another host's or environment's
//!   topic are ignored and counted, with a rate-limited log line.
//! - **Lookups.** A host outside the view (`GetHost`, a relay by host id)
//!   is looked up on the broker: one subscription to that id's record in any
//!   environment, its retained record judged like any other, unsubscribed
//!   ([`lookup`]: the bookkeeping; `presence`: the I/O). Listings of hosts
//!   outside the view are refused ([`FleetError::OutOfView`]).
//! - **Routing.** [`Fleet::route`] says where a `host_id` lives: here, at
//!   another rozd's advertised endpoint (with the fleet token to present), or
//!   nowhere reachable ([`RouteError`]). Sessions and task calls use it
//!   (`api::relay`); it is the one lookup anything else routed by host
//!   should use too. It never routes a request that another host already
//!   relayed (one hop at most), and never to this host's own endpoint.
//! - **Fleet stop.** A retained command on `<prefix>/estop/<environment_id>`
//!   latches the protective stop of every host of that environment (source
//!   `fleet`), as does any other message there that is not an authentic,
//!   valid command (with its defect in the reason); an authentic, fresh
//!   withdrawal clears the latches that came from the fleet.
//!
//! Without `[fleet]` the registry holds only this host, routing to any other
//! id is `NotFound`, and registering or fleet stops are refused.
//!
//! The parts: [`Fleet`] and its state here; `presence` (the broker
//! connection's I/O loop), `registry` (listing, registering), `routing`,
//! `outbox` (what this host publishes) and `inbox` (what it takes from the
//! broker, and what it ignores); the I/O-free [`view`], [`record`], [`seal`]
//! and [`stop`]; and [`config`].

pub(crate) mod config;
mod inbox;
mod lookup;
mod outbox;
mod presence;
pub mod record;
mod registry;
mod routing;
pub mod seal;
pub(crate) mod stop;
mod subscriptions;
#[cfg(test)]
mod tests;
pub mod view;

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use config::{FleetConfig, ViewScope};
pub use inbox::Ignored;
use inbox::IgnoredCounters;
use record::{HostRecord, RecordStatus, Topics};
pub use registry::{HostPage, HostView};
pub use routing::{RemoteHost, Route, RouteError};
use seal::MessageKey;
use stop::StopGate;
use view::FleetView;

use crate::config::types::HostConfig;
use crate::hw::mqtt_link::{LinkCounters, LinkStats};
use crate::safety::{ProtectiveStop, StopSource};

/// Shortest interval between two re-checks of [`Fleet::wait_for`].
const RECHECK_EVERY: Duration = Duration::from_millis(20);

/// The source of a protective stop that came from the fleet.
pub const FLEET_SOURCE: &StopSource = &StopSource::Fleet;

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
    /// A listing this host cannot answer completely: its view does not
    /// hold those hosts.
    #[error("{0}")]
    OutOfView(String),
}

/// The fleet registry and presence of one rozd. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Fleet {
    /// This host's record, without the parts that change (status, stop, heartbeat).
    own: HostRecord,
    config: Option<FleetConfig>,
    topics: Topics,
    protective_stop: ProtectiveStop,
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
    /// The broker's count of dropped messages, as far as it publishes it.
    dropped: Mutex<subscriptions::DroppedCount>,
    /// Lookups of hosts outside the view, to the broker connection's loop.
    lookups: tokio::sync::mpsc::Sender<LookupRequest>,
    /// Their receiving end, until the broker connection's loop takes it.
    lookup_requests: Mutex<Option<tokio::sync::mpsc::Receiver<LookupRequest>>>,
}

/// A lookup of a host outside the view: its id, and where the answer goes.
type LookupRequest = (String, tokio::sync::oneshot::Sender<lookup::Outcome>);

/// Lookups waiting for the broker connection's loop; beyond, `Busy`.
const LOOKUP_QUEUE: usize = 256;

/// The fleet connection's state and counters (`/v1/status`, `fleet`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct FleetLinkStats {
    #[serde(flatten)]
    pub link: LinkStats,
    /// Messages the broker dropped (for any client) since this host first
    /// saw its count (`$SYS/broker/publish/messages/dropped`); `None` when
    /// the broker does not publish it (or the ACL hides it).
    pub broker_dropped_messages: Option<u64>,
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
        protective_stop: ProtectiveStop,
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
        let heartbeat = fleet.as_ref().map_or(10, |f| f.heartbeat_secs());
        let keep_alive = fleet.as_ref().map_or(15, |f| f.broker.keep_alive_secs);
        let max_packet_size = fleet
            .as_ref()
            .map_or(config::DEFAULT_MAX_PACKET, |f| f.broker.max_packet_size);
        let key = fleet
            .as_ref()
            .map(|f| &f.token)
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
            // Published on change; alive every heartbeat on its own topic.
            liveness: Some(record::Liveness::Will),
            cause: None,
            keep_alive_secs: Some(keep_alive),
        };
        let (lookups, lookup_requests) = tokio::sync::mpsc::channel(LOOKUP_QUEUE);
        Fleet {
            lookups,
            lookup_requests: Mutex::new(Some(lookup_requests)),
            view: Mutex::new(FleetView::new(
                &host.id,
                Duration::from_secs(heartbeat),
                Duration::from_secs(keep_alive),
            )),
            topics: Topics::new(
                fleet
                    .as_ref()
                    .map_or(config::DEFAULT_PREFIX, |f| f.topic_prefix.as_str()),
            ),
            config: fleet,
            own,
            protective_stop,
            changed: tokio::sync::watch::Sender::new(0),
            client: Mutex::new(None),
            link: LinkCounters::new(max_packet_size),
            task: Mutex::new(None),
            bound,
            key,
            gate: Mutex::new(StopGate::new()),
            ignored: IgnoredCounters::default(),
            stamp_floor: Mutex::new(0),
            dropped: Mutex::new(subscriptions::DroppedCount::default()),
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

    /// Which records this host holds (`environment` without `[fleet]`).
    pub fn view_scope(&self) -> ViewScope {
        self.config
            .as_ref()
            .map_or(ViewScope::Environment, |c| c.view)
    }

    /// Whether this host's view holds the hosts of `environment_id` (all
    /// of them: every record the broker has of it, as far as the broker
    /// delivered them).
    pub fn holds(&self, environment_id: &str) -> bool {
        self.view_scope() == ViewScope::Fleet || environment_id == self.own.environment_id
    }

    /// This host's own record topic.
    pub(crate) fn own_topic(&self) -> String {
        self.topics.host(&self.own.environment_id, &self.own.id)
    }

    /// Whether the broker connection is up (always `false` without `[fleet]`).
    pub fn is_connected(&self) -> bool {
        self.link.is_connected()
    }

    /// The broker connection's counters (`None` without `[fleet]`).
    pub fn link_stats(&self) -> Option<FleetLinkStats> {
        self.config.as_ref().map(|_| FleetLinkStats {
            link: self.link.stats(),
            broker_dropped_messages: self.broker_dropped(),
        })
    }

    /// Messages the broker dropped since this host first saw its count
    /// (`None`: the broker does not say).
    pub fn broker_dropped(&self) -> Option<u64> {
        let dropped = self.dropped.lock();
        dropped.available().then(|| dropped.since_join())
    }

    /// How many hosts the registry holds (this one included).
    pub fn host_count(&self) -> usize {
        self.view.lock().len() + 1
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
        let task = self.task.lock().take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// Connects this host to the fleet broker (if `[fleet]` is configured):
/// presence, the view and the fleet stop run until the daemon shuts down.
pub(crate) fn start(
    fleet: &Arc<Fleet>,
    ooda: &Arc<crate::ooda::Ooda>,
    shutdown: &tokio_util::sync::CancellationToken,
) -> Result<(), FleetError> {
    presence::start(fleet, ooda, shutdown)
}
