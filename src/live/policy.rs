//! What one live client is sent, as plain data: its subscriptions (by
//! topic), each channel's rate limit, and the decision for each message
//! (send, or drop and why). No I/O; the hub applies it under its lock and
//! the connection task changes it on the client's requests.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A subscription of one client: the id the client chose, and when its
/// channel last sent (for `max_hz`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Subscription {
    id: u32,
    last_sent: Option<Instant>,
}

/// Why a subscription request was refused (the client hears it as a status).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SubscribeError {
    #[error("subscription id {0} is in use")]
    IdInUse(u32),
    #[error("already subscribed to {0}")]
    AlreadySubscribed(String),
    #[error("no subscription with id {0}")]
    NoSuchSubscription(u32),
    #[error("at most {0} subscriptions per client")]
    TooMany(usize),
}

/// Whether `max_hz` thins `topic`: the sampled streams (the Observation,
/// sensor values, camera frames, the scene), where a later message says
/// all an earlier one did. Events (actuator changes, the stop, the audit,
/// sessions, tasks) are each news and are never thinned; the send buffer
/// bounds them.
pub(crate) fn rate_limited(topic: &str) -> bool {
    topic == "/observation"
        || topic == "/sim/scene"
        || topic.starts_with("/sensors/")
        || topic.starts_with("/cameras/")
}

/// One client's subscriptions, by topic, with their rate limit.
#[derive(Debug, Clone)]
pub(crate) struct Subscriptions {
    by_topic: HashMap<String, Subscription>,
    /// The shortest time between two messages of one channel.
    every: Duration,
    limit: usize,
}

/// What to do with a message offered to one client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Offer {
    /// Not subscribed: nothing is made for it.
    NotWanted,
    /// Within `max_hz` of the previous one on its channel: skipped.
    TooSoon,
    /// Send it under this subscription id.
    Send(u32),
}

impl Subscriptions {
    /// `every`: the channel's minimum interval; `limit`: the most
    /// subscriptions one client may hold.
    pub(crate) fn new(every: Duration, limit: usize) -> Subscriptions {
        Subscriptions {
            by_topic: HashMap::new(),
            every,
            limit,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.by_topic.len()
    }

    #[cfg(test)]
    pub(crate) fn wants(&self, topic: &str) -> bool {
        self.by_topic.contains_key(topic)
    }

    /// Subscribes `topic` as `id`.
    pub(crate) fn subscribe(&mut self, id: u32, topic: &str) -> Result<(), SubscribeError> {
        if self.by_topic.values().any(|s| s.id == id) {
            return Err(SubscribeError::IdInUse(id));
        }
        if self.by_topic.contains_key(topic) {
            return Err(SubscribeError::AlreadySubscribed(topic.to_string()));
        }
        if self.by_topic.len() >= self.limit {
            return Err(SubscribeError::TooMany(self.limit));
        }
        self.by_topic.insert(
            topic.to_string(),
            Subscription {
                id,
                last_sent: None,
            },
        );
        Ok(())
    }

    /// Ends subscription `id`; says which topic it was.
    pub(crate) fn unsubscribe(&mut self, id: u32) -> Result<String, SubscribeError> {
        let topic = self
            .by_topic
            .iter()
            .find(|(_, s)| s.id == id)
            .map(|(t, _)| t.clone())
            .ok_or(SubscribeError::NoSuchSubscription(id))?;
        self.by_topic.remove(&topic);
        Ok(topic)
    }

    /// A message on `topic` at `now`: whether to send it, and as which
    /// subscription. A message sent is remembered for the rate limit.
    pub(crate) fn offer(&mut self, topic: &str, now: Instant) -> Offer {
        let Some(sub) = self.by_topic.get_mut(topic) else {
            return Offer::NotWanted;
        };
        if rate_limited(topic)
            && sub
                .last_sent
                .is_some_and(|last| now.saturating_duration_since(last) < self.every)
        {
            return Offer::TooSoon;
        }
        sub.last_sent = Some(now);
        Offer::Send(sub.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_subscribed_topics_are_offered_at_most_max_hz() {
        let t0 = Instant::now();
        let every = Duration::from_millis(100);
        let mut subs = Subscriptions::new(every, 10);
        assert_eq!(subs.offer("/observation", t0), Offer::NotWanted);
        subs.subscribe(7, "/observation").unwrap();
        assert_eq!(subs.offer("/observation", t0), Offer::Send(7));
        assert_eq!(
            subs.offer("/observation", t0 + Duration::from_millis(99)),
            Offer::TooSoon
        );
        assert_eq!(subs.offer("/audit", t0), Offer::NotWanted);
        assert_eq!(subs.offer("/observation", t0 + every), Offer::Send(7));
        // Channels are limited each on their own.
        subs.subscribe(8, "/sensors/x").unwrap();
        assert_eq!(subs.offer("/sensors/x", t0 + every), Offer::Send(8));
        // Events are never thinned: a safe drive right after a command is sent.
        subs.subscribe(9, "/actuators/drive").unwrap();
        assert_eq!(subs.offer("/actuators/drive", t0), Offer::Send(9));
        assert_eq!(subs.offer("/actuators/drive", t0), Offer::Send(9));
    }

    #[test]
    fn ids_and_topics_are_unique_and_the_count_is_bounded() {
        let mut subs = Subscriptions::new(Duration::ZERO, 2);
        subs.subscribe(1, "/a").unwrap();
        assert_eq!(subs.subscribe(1, "/b"), Err(SubscribeError::IdInUse(1)));
        assert_eq!(
            subs.subscribe(2, "/a"),
            Err(SubscribeError::AlreadySubscribed("/a".into()))
        );
        subs.subscribe(2, "/b").unwrap();
        assert_eq!(subs.subscribe(3, "/c"), Err(SubscribeError::TooMany(2)));
        assert_eq!(subs.unsubscribe(1), Ok("/a".into()));
        assert_eq!(
            subs.unsubscribe(1),
            Err(SubscribeError::NoSuchSubscription(1))
        );
        assert!(!subs.wants("/a"));
        assert_eq!(subs.offer("/a", Instant::now()), Offer::NotWanted);
        assert_eq!(subs.len(), 1);
    }
}
