//! The fleet's broker connection: one rumqttc client of its own (MQTT 5,
//! separate from the hardware `[mqtt]` connections), a thin loop over its
//! events, the heartbeat, this host's stop state and shutdown.
//!
//! - **Bounded packets.** The connection announces `max_packet_size`
//!   (default 128 KiB) to the broker, which then drops bigger messages for
//!   us: no record, however big, can break the connection (see
//!   [`crate::hw::mqtt_link`]). Records above
//!   [`super::record::MAX_RECORD_BYTES`] that do arrive are ignored and
//!   counted (`oversized` in `/v1/status`).
//! - `clean_start = true`: the view is rebuilt from the retained records
//!   after every (re)connection, so nothing needs to be queued for us while
//!   we are away. Records that the broker does not resend within
//!   [`RESYNC_GRACE`] of a new connection were cleared meanwhile and leave
//!   the view.
//! - The last will (our record with status `offline`, retained) is set
//!   anew before every connection, so it carries the current stop state.
//! - A message on our own topic that is not our current record (an old
//!   last will, a forged `offline`) is answered by publishing ours again.
//! - Everything published is sealed ([`super::seal`]); what arrives is
//!   judged by [`Fleet`] (authenticity, freshness) before it is used.

use std::sync::Arc;
use std::time::Duration;

use rumqttc::Outgoing;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{LastWill, Packet, Publish, SubAck, SubscribeReasonCode};
use rumqttc::v5::{AsyncClient, ConnectionError, Event, EventLoop};
use tokio::time::Instant;

use super::ViewScope;
use super::inbox::{OwnElsewhere, OwnTopic};
use super::lookup::{Ask, Done, Lookups, Outcome};
use super::record::{OfflineCause, RecordStatus, Rejected};
use super::stop::{StopKind, Verdict};
use super::subscriptions::{self, Subscription, Subscriptions};
use super::view::{LogLimiter, Transition};
use super::{FLEET_SOURCE, Fleet, FleetError, LookupRequest};
use crate::ooda::Ooda;
use crate::safety::{ClearRequest, StopRequest};
use tokio_util::sync::CancellationToken;

/// Requests queued for the event loop (records, commands, subscriptions).
const REQUEST_QUEUE: usize = 256;
/// After a new broker session, records not resent within this are dropped.
const RESYNC_GRACE: Duration = Duration::from_secs(10);
/// Rejected messages are logged at most this often.
const REJECT_LOG_EVERY: Duration = Duration::from_secs(10);
/// The broker's dropped messages are logged at most this often.
const DROPPED_LOG_EVERY: Duration = Duration::from_secs(600);
/// Presence changes logged one by one per event; beyond, one summary line.
const CHANGES_LOGGED: usize = 10;
/// Where mosquitto publishes how many messages it dropped (for any client).
pub(super) const DROPPED_TOPIC: &str = "$SYS/broker/publish/messages/dropped";

pub(super) fn start(
    fleet: &Arc<Fleet>,
    ooda: &Arc<Ooda>,
    shutdown: &CancellationToken,
) -> Result<(), FleetError> {
    let Some(config) = fleet.config() else {
        return Ok(());
    };
    // A clean session (the default): nothing is queued for us while away.
    let options = crate::hw::mqtt_link::options(
        &config.broker,
        &config.client_id,
        config.broker.max_packet_size,
    )
    .map_err(|why| FleetError::Setup(why.replace("mqtt.", "fleet.")))?;
    let (client, mut eventloop) = AsyncClient::new(options, REQUEST_QUEUE);
    set_will(&mut eventloop, fleet);
    *fleet.client.lock() = Some(client.clone());
    let backoff = crate::hw::mqtt_link::Backoff::new(
        Duration::from_millis(config.broker.reconnect_min_ms),
        Duration::from_millis(config.broker.reconnect_max_ms),
    );
    let heartbeat = config.heartbeat;
    let Some(lookup_requests) = fleet.lookup_requests.lock().take() else {
        return Err(FleetError::Setup(
            "the fleet's broker connection was started twice".into(),
        ));
    };
    tracing::info!(
        url = %config.broker.url,
        prefix = %config.topic_prefix,
        view = config.view.as_str(),
        endpoint = fleet.own.endpoint.as_deref().unwrap_or(""),
        "fleet: joining"
    );
    let task = Presence {
        fleet: fleet.clone(),
        ooda: ooda.clone(),
        shutdown: shutdown.clone(),
        client,
        eventloop,
        backoff,
        heartbeat,
        own_topic: fleet.own_topic(),
        stop_topic: fleet.topics.stop(fleet.environment_id()),
        rejects: LogLimiter::new(REJECT_LOG_EVERY),
        impostor_log: LogLimiter::new(REJECT_LOG_EVERY),
        resync_at: None,
        url: config.broker.url.to_string(),
        subscriptions: Subscriptions::default(),
        dropped_log: LogLimiter::new(DROPPED_LOG_EVERY),
        stop_applied: None,
        displaced: false,
        lookups: Lookups::new(config.lookup_timeout),
        lookup_requests,
        legacy_cleared: false,
    };
    *fleet.task.lock() = Some(tokio::spawn(task.run()));
    Ok(())
}

fn set_will(eventloop: &mut EventLoop, fleet: &Fleet) {
    match fleet.sealed_own_record(RecordStatus::Offline, Some(OfflineCause::Will)) {
        Ok(payload) => {
            eventloop.options.set_last_will(LastWill::new(
                fleet.own_topic(),
                payload,
                QoS::AtLeastOnce,
                true,
                None,
            ));
        }
        Err(e) => tracing::error!("fleet: cannot encode the last will: {e}"),
    }
}

// One Step exists at a time, on the loop's stack: boxing the MQTT 5 event
// (the large variant) would cost an allocation per message for nothing.
#[allow(clippy::large_enum_variant)]
enum Step {
    Event(Result<Event, ConnectionError>),
    Heartbeat,
    StopChanged,
    Resync,
    /// A host in the view turns stale or lost now.
    Due,
    /// A lookup of a host outside the view is asked for.
    Lookup(LookupRequest),
    /// A lookup runs out of time now.
    LookupDue,
}

struct Presence {
    fleet: Arc<Fleet>,
    /// Whose stop the fleet's stop command latches, and whose stop this
    /// host's record reports.
    ooda: Arc<Ooda>,
    shutdown: CancellationToken,
    client: AsyncClient,
    eventloop: EventLoop,
    backoff: crate::hw::mqtt_link::Backoff,
    heartbeat: Duration,
    own_topic: String,
    stop_topic: String,
    rejects: LogLimiter,
    impostor_log: LogLimiter,
    /// When the records not resent since the last new session are dropped.
    resync_at: Option<(Instant, Instant)>,
    url: String,
    subscriptions: Subscriptions,
    dropped_log: LogLimiter,
    /// The latest message on the stop topic this broker session took
    /// (a retained copy of it, sent again, is not applied again).
    stop_applied: Option<Vec<u8>>,
    /// Another process with this host id replaced our record: ours goes
    /// out again at the next heartbeat (not at once: two such processes
    /// would answer each other as fast as the broker goes).
    displaced: bool,
    /// Lookups of hosts outside the view, each waiting for its record.
    lookups: Lookups<tokio::sync::oneshot::Sender<Outcome>>,
    lookup_requests: tokio::sync::mpsc::Receiver<LookupRequest>,
    /// Whether this process cleared its record on the topic of rozds
    /// before per-environment records (`<prefix>/hosts/<host_id>`).
    legacy_cleared: bool,
}

impl Presence {
    fn fleet(&self) -> &Fleet {
        &self.fleet
    }

    async fn run(mut self) {
        let shutdown = self.shutdown.clone();
        let mut heartbeat = tokio::time::interval(self.heartbeat);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut stops = self.ooda.protective_stop().subscribe();
        let mut failures: u32 = 0;
        loop {
            let resync = self.resync_at.map(|(_, at)| at);
            let due = self.fleet().view.lock().next_due();
            let lookup_due = self.lookups.next_deadline();
            let step = tokio::select! {
                () = shutdown.cancelled() => break,
                event = self.eventloop.poll() => Step::Event(event),
                _ = heartbeat.tick() => Step::Heartbeat,
                changed = stops.changed() => match changed {
                    Ok(()) => Step::StopChanged,
                    // The latch outlives this task; this cannot happen while we run.
                    Err(_) => break,
                },
                () = sleep_until(resync), if resync.is_some() => Step::Resync,
                () = sleep_until(due), if due.is_some() => Step::Due,
                () = sleep_until(lookup_due), if lookup_due.is_some() => Step::LookupDue,
                // The sender lives in `Fleet`, which outlives this task.
                Some(request) = self.lookup_requests.recv() => Step::Lookup(request),
            };
            match step {
                Step::Event(Ok(Event::Incoming(Packet::ConnAck(ack)))) => {
                    self.fleet().link.connected(&ack);
                    if failures > 0 {
                        tracing::info!(url = %self.url, "fleet: reconnected after {failures} failed attempt(s)");
                    } else {
                        tracing::info!(url = %self.url, "fleet: connected");
                    }
                    failures = 0;
                    self.backoff.reset();
                    self.connected();
                }
                Step::Event(Ok(Event::Incoming(Packet::Publish(p)))) => self.received(&p),
                Step::Event(Ok(Event::Incoming(Packet::SubAck(ack)))) => self.subscribed(&ack),
                Step::Event(Ok(Event::Outgoing(Outgoing::Subscribe(pkid)))) => {
                    self.subscriptions.sent(pkid);
                }
                Step::Event(Ok(_)) => {}
                Step::Event(Err(e)) => {
                    let was_connected = self.fleet().link.take_connected();
                    for done in self.lookups.disconnected() {
                        self.answer(done, false);
                    }
                    // Deaf to liveness while away: nothing ages by it.
                    let changed = self.fleet().view.lock().set_watching(None, Instant::now());
                    if !changed.is_empty() {
                        log_changes(&changed);
                    }
                    self.fleet().bump();
                    failures = failures.saturating_add(1);
                    let delay = self.backoff.next_delay();
                    if failures == 1 {
                        tracing::warn!(url = %self.url, "fleet: broker connection failed: {}; reconnecting with backoff", describe(&e, was_connected));
                    } else {
                        tracing::debug!(url = %self.url, "fleet: attempt {failures} failed: {e}; next in {delay:?}");
                    }
                    set_will(&mut self.eventloop, &self.fleet);
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
                Step::Heartbeat => {
                    // The record goes out when it changes; every heartbeat
                    // only says "alive", to this environment's hosts.
                    self.publish_alive();
                    if std::mem::take(&mut self.displaced) {
                        self.publish_own();
                    }
                    self.ask_for_the_stop_again();
                }
                Step::StopChanged => {
                    self.publish_own();
                    self.fleet().bump();
                }
                Step::Due => {
                    let changed = self.fleet().view.lock().advance(Instant::now());
                    if !changed.is_empty() {
                        log_changes(&changed);
                        self.fleet().bump();
                    }
                }
                Step::Lookup((id, waiter)) => self.look_up(id, waiter),
                Step::LookupDue => {
                    for done in self.lookups.expire(Instant::now()) {
                        self.answer(done, true);
                    }
                }
                Step::Resync => {
                    if let Some((since, _)) = self.resync_at.take() {
                        let gone = self.fleet().view.lock().prune_older_than(since);
                        if !gone.is_empty() {
                            tracing::info!(hosts = ?gone, "fleet: records cleared while we were away");
                            self.fleet().bump();
                        }
                    }
                }
            }
        }
        self.leave().await;
    }

    /// A new broker session: subscribe to the fleet stop first, on its own
    /// (the records follow once the broker acknowledged it: see
    /// [`Presence::subscribed`]); announce ourselves.
    fn connected(&mut self) {
        self.subscriptions.new_session();
        self.stop_applied = None;
        self.subscribe(Subscription::Stop);
        self.publish_own();
        self.clear_legacy_record();
        let now = Instant::now();
        self.resync_at = Some((now, now + RESYNC_GRACE));
        self.fleet().bump();
    }

    /// Subscribes to the fleet stop again (not the records): the broker
    /// sends its retained command anew. A broker can lose a message it
    /// queued for a congested connection (mosquitto 2.0.11 was seen to log
    /// sending a QoS 1 message queued behind a connection whose outgoing
    /// queue had overflowed, which the client never received); asked for
    /// every heartbeat, a retained stop lost that way latches one heartbeat
    /// later. What this session took already is not applied again (see
    /// [`Presence::received`]); without a retained command this costs a
    /// SUBSCRIBE and its SUBACK.
    fn ask_for_the_stop_again(&mut self) {
        if self.fleet().is_connected() {
            self.subscribe(Subscription::StopAgain);
        }
    }

    fn subscribe(&mut self, what: Subscription) {
        let (filter, qos) = match what {
            Subscription::Stop | Subscription::StopAgain => {
                (self.stop_topic.clone(), QoS::AtLeastOnce)
            }
            Subscription::Records => {
                let topics = &self.fleet().topics;
                let filter = match self.fleet().view_scope() {
                    ViewScope::Environment => topics.hosts_in(self.fleet().environment_id()),
                    ViewScope::Fleet => topics.all_hosts(),
                };
                (filter, QoS::AtMostOnce)
            }
            Subscription::Alive => (
                self.fleet().topics.alive_in(self.fleet().environment_id()),
                QoS::AtMostOnce,
            ),
            Subscription::Dropped => (DROPPED_TOPIC.to_string(), QoS::AtMostOnce),
            Subscription::OwnElsewhere => (
                self.fleet().topics.host_anywhere(self.fleet().own_id()),
                QoS::AtMostOnce,
            ),
            // Asked for with its id, by `look_up`.
            Subscription::Lookup => return,
        };
        match self.client.try_subscribe(filter.clone(), qos) {
            Ok(()) => self.subscriptions.asked(what),
            Err(e) => tracing::error!(%filter, "fleet: cannot subscribe: {e}"),
        }
    }

    /// A SUBACK. Once the fleet stop's subscription is acknowledged, the
    /// records are asked for, at QoS 0 (and the broker's count of dropped
    /// messages). So the stop's retained command is in the broker's queue
    /// for us before any record, and no burst of records, however large,
    /// can crowd it out: a broker drops QoS 1 messages for a client whose
    /// queue is full (mosquitto's default `max_queued_messages` is 1 000),
    /// and QoS 0 messages never enter that queue. The stop keeps QoS 1
    /// (redelivered until acknowledged).
    fn subscribed(&mut self, ack: &SubAck) {
        let Some(what) = self.subscriptions.acked(ack.pkid) else {
            return;
        };
        let granted = matches!(
            ack.return_codes.first(),
            Some(SubscribeReasonCode::Success(_))
        );
        match what {
            Subscription::Stop => {
                if !granted {
                    tracing::error!(
                        topic = %self.stop_topic,
                        "fleet: the broker refused the subscription to the fleet stop ({:?}); \
                         this host does not hear fleet stops (check the broker's ACL)",
                        ack.return_codes
                    );
                }
                self.subscribe(Subscription::Records);
                self.subscribe(Subscription::OwnElsewhere);
                self.subscribe(Subscription::Alive);
                self.subscribe(Subscription::Dropped);
            }
            Subscription::Records if !granted => tracing::error!(
                "fleet: the broker refused the subscription to the host records ({:?}); \
                 this host's view stays empty (check the broker's ACL)",
                ack.return_codes
            ),
            Subscription::Dropped if !granted => tracing::debug!(
                "fleet: the broker does not let us read {DROPPED_TOPIC}; messages it drops for \
                 this host go unnoticed"
            ),
            Subscription::Alive if granted => {
                // From now on the hosts of this environment that publish
                // their records on change age here by their liveness.
                let environment = self.fleet().environment_id().to_string();
                let changed = self
                    .fleet()
                    .view
                    .lock()
                    .set_watching(Some(&environment), Instant::now());
                if !changed.is_empty() {
                    log_changes(&changed);
                }
                self.fleet().bump();
            }
            Subscription::Alive => tracing::error!(
                "fleet: the broker refused the subscription to this environment's liveness \
                 messages ({:?}); a hung host of it is noticed only when its connection dies \
                 (check the broker's ACL)",
                ack.return_codes
            ),
            Subscription::Lookup if !granted => tracing::warn!(
                "fleet: the broker refused a lookup's subscription to a host record ({:?}); \
                 hosts outside this host's view are not found (check the broker's ACL)",
                ack.return_codes
            ),
            Subscription::OwnElsewhere if !granted => tracing::warn!(
                "fleet: the broker refused the subscription to this host's id in other \
                 environments ({:?}); another rozd with this host id there goes unnoticed \
                 (check the broker's ACL)",
                ack.return_codes
            ),
            Subscription::StopAgain
            | Subscription::Records
            | Subscription::Dropped
            | Subscription::Lookup
            | Subscription::OwnElsewhere => {}
        }
    }

    /// The broker's count of dropped messages grew: say so (it may have
    /// dropped host records for us: the view may miss hosts or changes).
    fn broker_dropped(&mut self, payload: &[u8]) {
        let Some(count) = subscriptions::parse_count(payload) else {
            return;
        };
        let (grew, total) = {
            let mut dropped = self.fleet().dropped.lock();
            let grew = dropped.seen(count);
            (grew, dropped.since_join())
        };
        if grew > 0
            && let Some(more) = self.dropped_log.allow(Instant::now())
        {
            tracing::warn!(
                dropped = grew,
                since_joining = total,
                "fleet: the broker dropped messages ({DROPPED_TOPIC}); some may have been host \
                 records for this host, whose view can then miss hosts or their changes until \
                 they publish again. Raise the broker's max_queued_messages (see \
                 packaging/mosquitto/rozd-fleet.conf) ({more} more such reports not logged)"
            );
        }
    }

    /// Says this host is alive, to the hosts of its environment (QoS 0,
    /// not retained: a lost one is made up for by the next).
    fn publish_alive(&self) {
        if !self.fleet().is_connected() {
            return;
        }
        match self.fleet().sealed_alive() {
            Ok((topic, payload)) => {
                if let Err(e) = self
                    .client
                    .try_publish(topic, QoS::AtMostOnce, false, payload)
                {
                    tracing::debug!("fleet: cannot say this host is alive: {e}");
                }
            }
            Err(e) => tracing::error!("fleet: cannot encode this host's liveness message: {e}"),
        }
    }

    fn publish_own(&self) {
        if !self.fleet().is_connected() {
            return;
        }
        match self.fleet().sealed_own_record(RecordStatus::Online, None) {
            Ok(payload) => {
                // A publish the broker cannot take would fail the connection
                // on every reconnection (QoS 1 is retried): refuse it here.
                if let Err(why) = self
                    .fleet()
                    .link
                    .check_publish(&self.own_topic, payload.len())
                {
                    tracing::error!("fleet: cannot publish this host's record: {why}");
                    return;
                }
                if let Err(e) =
                    self.client
                        .try_publish(&self.own_topic, QoS::AtLeastOnce, true, payload)
                {
                    tracing::warn!("fleet: cannot publish this host's record: {e}");
                }
            }
            Err(e) => tracing::error!("fleet: cannot encode this host's record: {e}"),
        }
    }

    fn received(&mut self, p: &Publish) {
        self.fleet().link.received();
        let Ok(topic) = std::str::from_utf8(&p.topic) else {
            tracing::debug!("fleet: message on a topic that is not UTF-8");
            return;
        };
        if topic == self.own_topic {
            self.own_record_seen(&p.payload);
        } else if topic == DROPPED_TOPIC {
            self.broker_dropped(&p.payload);
        } else if topic == self.stop_topic {
            if p.retain && self.stop_applied.as_deref() == Some(&p.payload[..]) {
                // The retained command again, as asked for every heartbeat:
                // this session took it already.
                return;
            }
            self.stop_applied = Some(p.payload.to_vec());
            self.command(&p.payload);
        } else if let Some((environment, id)) = self.fleet().topics.alive_of(topic) {
            let (environment, id) = (environment.to_string(), id.to_string());
            if let Err(why) = self
                .fleet()
                .alive_received(&environment, &id, topic, &p.payload)
            {
                self.fleet().count_ignored(&why);
                self.count_link(&why);
                self.reject(topic, &why);
            }
        } else if let Some((environment, id)) = self.fleet().topics.host_of(topic) {
            let (environment, id) = (environment.to_string(), id.to_string());
            if id == self.fleet().own_id() {
                self.own_record_elsewhere(&environment, topic, &p.payload);
            } else if self.fleet().holds(&environment)
                && let Err(why) = self
                    .fleet()
                    .record_received(&environment, &id, topic, &p.payload)
            {
                self.count_link(&why);
                self.reject(topic, &why);
            }
            if self.lookups.wants(&id) {
                self.looked_up(&environment, &id, topic, &p.payload);
            }
        } else {
            tracing::debug!(%topic, "fleet: message on a topic we do not read");
        }
    }

    /// A lookup of a host outside the view: the first for its id
    /// subscribes to its record in any environment; later ones wait with it.
    fn look_up(&mut self, id: String, waiter: tokio::sync::oneshot::Sender<Outcome>) {
        if !self.fleet().is_connected() {
            let _ = waiter.send(Outcome::Disconnected);
            return;
        }
        match self.lookups.ask(&id, waiter, Instant::now()) {
            (Ask::Subscribe, _) => {}
            (Ask::Joined, _) => return,
            (Ask::Full, waiter) => {
                if let Some(waiter) = waiter {
                    let _ = waiter.send(Outcome::Busy);
                }
                return;
            }
        }
        let filter = self.fleet().topics.host_anywhere(&id);
        match self.client.try_subscribe(filter.clone(), QoS::AtMostOnce) {
            Ok(()) => self.subscriptions.asked(Subscription::Lookup),
            // Not found at its deadline, like a record that does not come.
            Err(e) => tracing::warn!(%filter, "fleet: cannot look up a host: {e}"),
        }
    }

    /// A record a lookup asked for arrived.
    fn looked_up(&mut self, environment: &str, id: &str, topic: &str, payload: &[u8]) {
        match self
            .fleet()
            .looked_up_received(environment, id, topic, payload)
        {
            Ok(Some(record)) => {
                if let Some(done) = self.lookups.found(record) {
                    self.answer(done, true);
                }
            }
            Ok(None) => {}
            Err(why) => {
                self.count_link(&why);
                self.reject(topic, &why);
            }
        }
    }

    /// A lookup ended: its waiters get the outcome, and (`unsubscribe`,
    /// while connected) the broker stops sending that host's record.
    fn answer(&mut self, done: Done<tokio::sync::oneshot::Sender<Outcome>>, unsubscribe: bool) {
        if unsubscribe {
            let filter = self.fleet().topics.host_anywhere(&done.id);
            if let Err(e) = self.client.try_unsubscribe(filter.clone()) {
                tracing::debug!(%filter, "fleet: cannot end a lookup's subscription: {e}");
            }
        }
        for waiter in done.waiters {
            // A waiter that went away (its request was cancelled) needs nothing.
            let _ = waiter.send(done.outcome.clone());
        }
    }

    /// Clears this host's record on the topic of rozds before
    /// per-environment records (`<prefix>/hosts/<host_id>`, its previous
    /// version's, which no rozd of this version reads), once per process:
    /// older rozds then drop this host from their views instead of holding
    /// its last record there for ever. (A broker whose ACL does not allow it
    /// refuses it; nothing else depends on it.)
    fn clear_legacy_record(&mut self) {
        if self.legacy_cleared {
            return;
        }
        let topic = self.fleet().topics.legacy_host(self.fleet().own_id());
        match self
            .client
            .try_publish(&topic, QoS::AtLeastOnce, true, Vec::<u8>::new())
        {
            Ok(()) => self.legacy_cleared = true,
            Err(e) => tracing::debug!(%topic, "fleet: cannot clear this host's legacy record: {e}"),
        }
    }

    /// A record with this host's id in another environment: another rozd
    /// with this host id (said loudly, as on our own topic), or our own
    /// record in an environment this host left (cleared: lookups of this
    /// id then find only the current one).
    fn own_record_elsewhere(&mut self, environment: &str, topic: &str, payload: &[u8]) {
        match self
            .fleet()
            .own_record_elsewhere(environment, topic, payload)
        {
            OwnElsewhere::Nothing => {}
            OwnElsewhere::Impostor { instance } => {
                if let Some(more) = self.impostor_log.allow(Instant::now()) {
                    tracing::error!(
                        host_id = %self.fleet().own_id(),
                        other_environment = environment,
                        other_instance = instance.as_deref().unwrap_or("?"),
                        "fleet: another rozd publishes records as this host in another \
                         environment (two hosts with one host.id?); a lookup of this id from a \
                         third environment may find either ({more} more such records not logged)"
                    );
                }
            }
            OwnElsewhere::Left => {
                tracing::info!(
                    host_id = %self.fleet().own_id(),
                    old_environment = environment,
                    "fleet: clearing this host's offline record in an environment it left"
                );
                if let Err(e) =
                    self.client
                        .try_publish(topic, QoS::AtLeastOnce, true, Vec::<u8>::new())
                {
                    tracing::debug!(%topic, "fleet: cannot clear this host's old record: {e}");
                }
            }
        }
    }

    /// Our own topic: anything but our current record (an old last will, a
    /// record someone forged) is replaced by ours.
    fn own_record_seen(&mut self, payload: &[u8]) {
        match self.fleet().own_topic_message(payload) {
            OwnTopic::Current => {}
            OwnTopic::Impostor { instance } => {
                self.displaced = true;
                if let Some(more) = self.impostor_log.allow(Instant::now()) {
                    tracing::error!(
                        host_id = %self.fleet().own_id(),
                        other_instance = instance.as_deref().unwrap_or("?"),
                        "fleet: another rozd publishes records as this host (two hosts with one host.id?); \
                         ours is published again every heartbeat while theirs replaces it ({more} more such records not logged)"
                    );
                }
            }
            OwnTopic::Replace => {
                tracing::debug!(host_id = %self.fleet().own_id(), "fleet: our topic holds another record (an old last will, our previous run's, or a forgery); publishing ours again");
                self.publish_own();
            }
        }
    }

    fn command(&mut self, payload: &[u8]) {
        let latch = self.ooda.protective_stop();
        let fleet_latched_since = latch
            .state()
            .causes
            .iter()
            .find(|cause| FLEET_SOURCE.is(&cause.source))
            .map(|cause| cause.since_unix_ms);
        // Every message here but the fleet's valid command latches.
        let judged = self.fleet().command_received(payload, fleet_latched_since);
        let env = self.fleet().environment_id().to_string();
        let kind = match &judged.verdict {
            Verdict::AlreadyApplied => return,
            Verdict::Refused(why) => {
                let topic = self.stop_topic.clone();
                self.reject(&topic, &format!("not applied: {why}"));
                return;
            }
            Verdict::Stop(kind) => *kind,
            Verdict::Clear => {
                // Authentic and fresh: its `by` is a fleet member's host id.
                // Only the fleet's cause goes: a stop from any other source stays.
                let by = judged.sender().unwrap_or("an unnamed fleet member");
                let by = format!("fleet: stop withdrawn by host {by}");
                // At once, in the order the broker delivered: a stop that
                // follows this clear must stay latched.
                if let Err(refused) = latch.clear_now(ClearRequest::source(FLEET_SOURCE, &by)) {
                    tracing::warn!(
                        "fleet: the fleet stop was withdrawn, but this host's stop stays: {refused}"
                    );
                }
                let still = latch.state();
                if still.is_active() {
                    tracing::warn!(
                        causes = %still.describe(),
                        "fleet: the fleet stop was withdrawn; this host's other stop causes stay \
                         latched until they are cleared here"
                    );
                }
                return;
            }
        };
        if kind != StopKind::Authentic
            && let Some(more) = self.rejects.allow(Instant::now())
        {
            tracing::warn!(
                topic = %self.stop_topic,
                "fleet: {} latches this host's stop anyway (everything on the stop topic but the \
                 fleet's clear stops; nothing else of it is trusted) ({more} more ignored since \
                 the last report)",
                judged.describe()
            );
        }
        let reason = judged.stop_reason(&env);
        // Only an authentic command's `by` names who asked (a fleet host).
        let by = (kind == StopKind::Authentic)
            .then(|| judged.sender())
            .flatten()
            .map(|host| format!("host {host}"));
        // Beside the loop: driving actuators safe may take their deadline,
        // and the broker connection must keep being served meanwhile.
        let ooda = self.ooda.clone();
        tokio::spawn(async move {
            ooda.trigger_stop(StopRequest::new(FLEET_SOURCE, &reason).by(by.as_deref()))
                .await
        });
    }

    /// The link's counters: oversized messages apart from the others.
    fn count_link(&self, why: &Rejected) {
        match why {
            Rejected::Oversized { .. } => self.fleet().link.oversized(),
            _ => self.fleet().link.rejected(),
        }
    }

    fn reject(&mut self, topic: &str, why: &dyn std::fmt::Display) {
        if let Some(more) = self.rejects.allow(Instant::now()) {
            tracing::warn!(
                %topic,
                "fleet: ignored a message: {why} ({more} more ignored since the last report)"
            );
        }
    }

    /// Clean shutdown: publish `offline` ourselves, then disconnect (so the
    /// broker does not publish the last will).
    async fn leave(mut self) {
        let fleet = self.fleet.clone();
        let was_connected = fleet.link.take_connected();
        if !was_connected {
            tracing::debug!("fleet: not connected at shutdown; the last will marks us offline");
            return;
        }
        let offline = fleet.sealed_own_record(RecordStatus::Offline, Some(OfflineCause::Shutdown));
        let published = match offline {
            Ok(payload) => self
                .client
                .try_publish(&self.own_topic, QoS::AtLeastOnce, true, payload)
                .is_ok(),
            Err(_) => false,
        };
        let _ = self.client.try_disconnect();
        // Bounded: the broker may be gone.
        let flushed = tokio::time::timeout(Duration::from_secs(2), async {
            loop {
                match self.eventloop.poll().await {
                    Ok(Event::Outgoing(Outgoing::Disconnect)) => return true,
                    Err(_) => return false,
                    Ok(_) => {}
                }
            }
        })
        .await
        .unwrap_or(false);
        if published && flushed {
            tracing::info!("fleet: left (published offline)");
        } else {
            tracing::warn!("fleet: could not say goodbye; the broker's last will marks us offline");
        }
    }
}

/// Logs presence changes: each of a few, a summary of many (a mass
/// disconnect must not flood the log).
pub(super) fn log_changes(changed: &[Transition]) {
    if changed.len() <= CHANGES_LOGGED {
        for t in changed {
            tracing::info!(
                host_id = %t.id,
                from = t.from.as_str(),
                to = t.to.as_str(),
                "fleet: host presence changed"
            );
        }
        return;
    }
    let mut to: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for t in changed {
        *to.entry(t.to.as_str()).or_default() += 1;
    }
    tracing::info!(hosts = changed.len(), now = ?to, "fleet: host presences changed");
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn describe(e: &ConnectionError, connected: bool) -> String {
    match crate::hw::mqtt_link::describe(e, connected) {
        crate::hw::mqtt_link::Failure::Refused(why) | crate::hw::mqtt_link::Failure::Lost(why) => {
            why
        }
    }
}
