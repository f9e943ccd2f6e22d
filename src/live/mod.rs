//! Live views of the robot: the hub that hands what the cores publish to
//! the clients watching it live (Foxglove, `api/foxglove`), each message
//! only to the clients that subscribe to its channel.
//!
//! The [`Hub`] is an observer of every core ([`crate::observe`]), beside
//! the recording, with the same channels and messages. It is called on the
//! cores' own paths (the control loop's tick, the stop's latch): with no
//! subscription at all it returns after one atomic load; otherwise it
//! takes its lock, asks each client's [`policy::Subscriptions`] whether the
//! message is wanted and due (`max_hz`), and `try_send`s a shared
//! reference onto that client's bounded queue. A full queue drops the
//! message for that client and counts it: a slow or stalled client never
//! delays the loop, the stop, or the other clients. The message's JSON is
//! made once, by the first client task that sends it, off the hot path.
//!
//! - [`config`]: the `foxglove` section
//! - [`policy`]: one client's subscriptions and rate limits (pure)

pub(crate) mod config;
pub(crate) mod policy;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use std::time::{Instant, SystemTime};

use serde_json::Value;
use tokio::sync::mpsc;

use crate::ooda::act::{ActuatorEvent, ActuatorObserver, VerdictEvent};
use crate::ooda::world::SensorObserver;
use crate::record::schema::{self, Event};
use crate::safety::{StopEvent, StopInfo, StopObserver};
use crate::store::{AuditRecord, SessionRecord, StoreObserver, TurnRecord};
use config::FoxgloveConfig;
use policy::{Offer, SubscribeError, Subscriptions};

/// The most subscriptions one client may hold (every channel of a large
/// robot fits).
pub(crate) const MAX_SUBSCRIPTIONS: usize = 4096;

/// Nanoseconds since the Unix epoch, now.
pub(crate) fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// What a live message holds before it is encoded.
#[derive(Debug)]
pub(crate) enum Content {
    /// An event as the recording has it (encoded by [`schema::message`]).
    Recorded(Event),
    /// A message already as JSON (the simulated scene).
    Json(Value),
}

/// One message for any number of clients, encoded at most once.
#[derive(Debug)]
pub(crate) struct Live {
    pub at_ns: u64,
    content: Content,
    body: OnceLock<Vec<u8>>,
}

impl Live {
    pub(crate) fn new(content: Content, at_ns: u64) -> Live {
        Live {
            at_ns,
            content,
            body: OnceLock::new(),
        }
    }

    /// The message's JSON, as the recording writes it.
    pub(crate) fn body(&self) -> &[u8] {
        self.body.get_or_init(|| match &self.content {
            Content::Recorded(event) => schema::message(event, self.at_ns).body,
            Content::Json(value) => serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec()),
        })
    }
}

/// A message queued for one client under its subscription id.
#[derive(Debug)]
pub(crate) struct Queued {
    pub subscription: u32,
    pub live: Arc<Live>,
}

/// Process-wide counts for `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    /// Messages handed to clients' sockets.
    pub sent: AtomicU64,
    /// Messages dropped because a client's send buffer was full.
    pub dropped_full: AtomicU64,
    /// Messages not sent because they were over `max_message_kb`.
    pub dropped_too_large: AtomicU64,
    /// Connections refused at the handshake because every place was taken.
    pub refused: AtomicU64,
    /// Clients connected now.
    pub clients: AtomicUsize,
}

/// The counts of every hub in this process.
pub(crate) static COUNTS: Counts = Counts {
    sent: AtomicU64::new(0),
    dropped_full: AtomicU64::new(0),
    dropped_too_large: AtomicU64::new(0),
    refused: AtomicU64::new(0),
    clients: AtomicUsize::new(0),
};

/// One client as the hub sees it.
#[derive(Debug)]
struct Tap {
    subscriptions: Subscriptions,
    queue: mpsc::Sender<Queued>,
}

/// The live clients and what each subscribes to.
#[derive(Debug)]
pub(crate) struct Hub {
    config: FoxgloveConfig,
    taps: Mutex<HashMap<u64, Tap>>,
    /// Subscriptions over all clients: zero means nothing is made at all.
    subscriptions: AtomicUsize,
    /// Clients admitted now (the connection cap).
    admitted: AtomicUsize,
    next_id: AtomicU64,
    /// The latest message of each polled channel with the tick it is of:
    /// clients polling the same tick share one message (one encoding).
    polled: Mutex<HashMap<&'static str, (u64, Arc<Live>)>>,
}

/// A client's place under the connection cap; given back when dropped.
#[derive(Debug)]
pub(crate) struct Admission {
    hub: Arc<Hub>,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.hub.admitted.fetch_sub(1, Ordering::AcqRel);
        COUNTS.clients.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A client attached to the hub; detached (its subscriptions gone) when dropped.
#[derive(Debug)]
pub(crate) struct Attached {
    hub: Arc<Hub>,
    pub id: u64,
}

impl Drop for Attached {
    fn drop(&mut self) {
        let removed = self.hub.lock().remove(&self.id);
        if let Some(tap) = removed {
            self.hub
                .subscriptions
                .fetch_sub(tap.subscriptions.len(), Ordering::AcqRel);
        }
    }
}

impl Hub {
    pub(crate) fn new(config: FoxgloveConfig) -> Arc<Hub> {
        Arc::new(Hub {
            config,
            taps: Mutex::default(),
            subscriptions: AtomicUsize::new(0),
            admitted: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            polled: Mutex::default(),
        })
    }

    pub(crate) fn config(&self) -> &FoxgloveConfig {
        &self.config
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, HashMap<u64, Tap>> {
        self.taps.lock()
    }

    /// A place for one more client, unless `max_clients` are connected.
    pub(crate) fn admit(self: &Arc<Self>) -> Option<Admission> {
        let max = self.config.max_clients;
        let taken = self
            .admitted
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            });
        if taken.is_err() {
            COUNTS.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        COUNTS.clients.fetch_add(1, Ordering::Relaxed);
        Some(Admission { hub: self.clone() })
    }

    /// Attaches a client: what it subscribes to arrives on the receiver,
    /// at most `send_buffer` messages queued.
    pub(crate) fn attach(self: &Arc<Self>) -> (Attached, mpsc::Receiver<Queued>) {
        let (queue, receiver) = mpsc::channel(self.config.send_buffer);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(
            id,
            Tap {
                subscriptions: Subscriptions::new(self.config.every(), MAX_SUBSCRIPTIONS),
                queue,
            },
        );
        (
            Attached {
                hub: self.clone(),
                id,
            },
            receiver,
        )
    }

    /// Client `client` subscribes to `topic` as `id`.
    pub(crate) fn subscribe(
        &self,
        client: &Attached,
        id: u32,
        topic: &str,
    ) -> Result<(), SubscribeError> {
        let mut taps = self.lock();
        let Some(tap) = taps.get_mut(&client.id) else {
            return Ok(());
        };
        tap.subscriptions.subscribe(id, topic)?;
        self.subscriptions.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Client `client` ends subscription `id`; says which topic it was.
    pub(crate) fn unsubscribe(&self, client: &Attached, id: u32) -> Result<String, SubscribeError> {
        let mut taps = self.lock();
        let Some(tap) = taps.get_mut(&client.id) else {
            return Err(SubscribeError::NoSuchSubscription(id));
        };
        let topic = tap.subscriptions.unsubscribe(id)?;
        self.subscriptions.fetch_sub(1, Ordering::AcqRel);
        Ok(topic)
    }

    /// Offers a message on `topic` to every client that wants it now;
    /// `topic` and `content` are made only when someone subscribes at all.
    fn publish(&self, topic: impl FnOnce() -> String, content: impl FnOnce() -> Content) {
        if self.subscriptions.load(Ordering::Acquire) == 0 {
            return;
        }
        let topic = topic();
        let now = Instant::now();
        let mut content = Some(content);
        let mut live: Option<Arc<Live>> = None;
        let mut taps = self.lock();
        for tap in taps.values_mut() {
            let Offer::Send(subscription) = tap.subscriptions.offer(&topic, now) else {
                continue;
            };
            // Made for the first client that wants it, shared by the others.
            if live.is_none()
                && let Some(make) = content.take()
            {
                live = Some(Arc::new(Live::new(make(), now_ns())));
            }
            let Some(live) = &live else { continue };
            enqueue(
                &tap.queue,
                Queued {
                    subscription,
                    live: live.clone(),
                },
            );
        }
    }

    /// Offers a message on `topic` to one client (channels it polls
    /// itself: the Observation, the scene) as of tick `tick`; `content` is
    /// made only when due, and once per tick for every client.
    pub(crate) fn offer_to(
        &self,
        client: &Attached,
        topic: &'static str,
        tick: u64,
        content: impl FnOnce() -> Content,
    ) {
        // The decision under the lock; the message is made outside it, so
        // the cores' observer calls never wait for it.
        let due = {
            let mut taps = self.lock();
            let Some(tap) = taps.get_mut(&client.id) else {
                return;
            };
            match tap.subscriptions.offer(topic, Instant::now()) {
                Offer::Send(subscription) => Some((subscription, tap.queue.clone())),
                Offer::NotWanted | Offer::TooSoon => None,
            }
        };
        let Some((subscription, queue)) = due else {
            return;
        };
        let cached = self
            .polled
            .lock()
            .get(topic)
            .filter(|(of, _)| *of == tick)
            .map(|(_, live)| live.clone());
        let live = cached.unwrap_or_else(|| {
            let live = Arc::new(Live::new(content(), now_ns()));
            self.polled.lock().insert(topic, (tick, live.clone()));
            live
        });
        enqueue(&queue, Queued { subscription, live });
    }
}

/// Queues without waiting: a full queue drops the message (counted); a
/// closed one belongs to a client on its way out.
fn enqueue(queue: &mpsc::Sender<Queued>, queued: Queued) {
    if let Err(mpsc::error::TrySendError::Full(_)) = queue.try_send(queued) {
        COUNTS.dropped_full.fetch_add(1, Ordering::Relaxed);
    }
}

impl SensorObserver for Hub {
    fn sensor_value(&self, sensor: &str, value: f64) {
        self.publish(
            || format!("/sensors/{sensor}"),
            || {
                Content::Recorded(Event::Sensor {
                    name: Arc::from(sensor),
                    value,
                })
            },
        );
    }
}

impl ActuatorObserver for Hub {
    fn actuator_changed(&self, event: &ActuatorEvent) {
        self.publish(
            || format!("/actuators/{}", event.actuator),
            || Content::Recorded(Event::Actuator(Box::new(event.clone()))),
        );
    }

    fn feedback_verdict(&self, event: &VerdictEvent) {
        self.publish(
            || format!("/actuators/{}", event.actuator),
            || Content::Recorded(Event::Verdict(Box::new(event.clone()))),
        );
    }
}

impl StopObserver for Hub {
    fn stop_changed(&self, event: &StopEvent, causes: &[StopInfo]) {
        self.publish(
            || "/protective_stop".to_string(),
            || {
                Content::Recorded(Event::Stop {
                    event: Box::new(event.clone()),
                    causes: causes.to_vec(),
                })
            },
        );
    }
}

impl crate::camera::CameraObserver for Hub {
    fn frame(&self, camera: &str, frame: &crate::camera::Frame) {
        self.publish(
            || format!("/cameras/{camera}"),
            || {
                Content::Recorded(Event::Image {
                    camera: Arc::from(camera),
                    jpeg: frame.jpeg.clone(),
                    at_unix_ms: frame.at_unix_ms,
                })
            },
        );
    }
}

impl StoreObserver for Hub {
    fn audit(&self, record: &AuditRecord) {
        self.publish(
            || "/audit".to_string(),
            || Content::Recorded(Event::Audit(Box::new(record.clone()))),
        );
    }
    fn session_started(&self, s: &SessionRecord) {
        self.publish(
            || "/sessions".to_string(),
            || Content::Recorded(Event::Session(schema::session_started(s))),
        );
    }
    fn session_ended(&self, id: &str, reason: &str) {
        self.publish(
            || "/sessions".to_string(),
            || Content::Recorded(Event::Session(schema::session_ended(id, reason))),
        );
    }
    fn turn_completed(&self, t: &TurnRecord) {
        self.publish(
            || "/sessions".to_string(),
            || Content::Recorded(Event::Session(schema::turn_ended(t))),
        );
    }
    fn task(&self, body: Value) {
        self.publish(
            || "/tasks".to_string(),
            || Content::Recorded(Event::Task(body)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub(send_buffer: usize) -> Arc<Hub> {
        Hub::new(FoxgloveConfig {
            send_buffer,
            // No rate limit: every message is due.
            max_hz: f64::INFINITY,
            max_clients: 2,
            ..FoxgloveConfig::default()
        })
    }

    #[test]
    fn nothing_is_made_for_a_channel_nobody_subscribes_to() {
        let hub = hub(4);
        let (client, mut rx) = hub.attach();
        hub.publish(
            || panic!("no topic is built without a subscription"),
            || panic!("no message is built without a subscription"),
        );
        hub.subscribe(&client, 1, "/sensors/a").unwrap();
        hub.sensor_value("b", 1.0);
        assert!(rx.try_recv().is_err());
        hub.sensor_value("a", 2.5);
        let queued = rx.try_recv().unwrap();
        assert_eq!(queued.subscription, 1);
        let body: Value = serde_json::from_slice(queued.live.body()).unwrap();
        assert_eq!(
            (body["sensor"].as_str(), body["value"].as_f64()),
            (Some("a"), Some(2.5))
        );
        drop(client);
        assert_eq!(hub.subscriptions.load(Ordering::Acquire), 0);
    }

    #[test]
    fn a_full_queue_drops_and_counts_and_the_others_still_get_theirs() {
        let hub = hub(2);
        let (slow, _slow_rx) = hub.attach();
        let (fast, mut fast_rx) = hub.attach();
        hub.subscribe(&slow, 1, "/audit").unwrap();
        hub.subscribe(&fast, 9, "/audit").unwrap();
        let before = COUNTS.dropped_full.load(Ordering::Relaxed);
        for i in 0..5 {
            hub.audit(&AuditRecord {
                at_ms: i,
                kind: crate::store::AuditKind::Other("test".into()),
                ..Default::default()
            });
            // The fast client takes each at once.
            assert_eq!(fast_rx.try_recv().map(|q| q.subscription).ok(), Some(9));
        }
        // Two queued for the slow one; three dropped (other tests may add more).
        assert!(COUNTS.dropped_full.load(Ordering::Relaxed) - before >= 3);
    }

    #[test]
    fn clients_polling_the_same_tick_share_one_message() {
        let hub = hub(4);
        let (a, mut a_rx) = hub.attach();
        let (b, mut b_rx) = hub.attach();
        hub.subscribe(&a, 1, "/observation").unwrap();
        hub.subscribe(&b, 2, "/observation").unwrap();
        let made = std::cell::Cell::new(0);
        let make = || {
            made.set(made.get() + 1);
            Content::Json(serde_json::json!({"tick": 7}))
        };
        hub.offer_to(&a, "/observation", 7, make);
        hub.offer_to(&b, "/observation", 7, make);
        assert_eq!(made.get(), 1);
        let (qa, qb) = (a_rx.try_recv().unwrap(), b_rx.try_recv().unwrap());
        assert!(Arc::ptr_eq(&qa.live, &qb.live));
        hub.offer_to(&a, "/observation", 8, make);
        assert_eq!(made.get(), 2);
    }

    #[test]
    fn the_connection_cap_is_given_back_when_a_client_leaves() {
        let hub = hub(1);
        let a = hub.admit().unwrap();
        let _b = hub.admit().unwrap();
        assert!(hub.admit().is_none());
        drop(a);
        assert!(hub.admit().is_some());
    }
}
