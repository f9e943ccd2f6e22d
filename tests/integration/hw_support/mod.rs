//! Shared by the hardware driver tests: a [`Readings`] sink that forwards
//! everything to a channel, so tests wait on explicit events (every wait is
//! bounded, so a failure never hangs).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use rozd::hw::{Health, Readings};
use tokio::sync::mpsc;

/// A bound on a hang, not a synchronisation.
pub const EXPECT_WITHIN: Duration = Duration::from_secs(15);

#[derive(Debug, Clone, PartialEq)]
pub enum Ev {
    Value(String, f64),
    Health(String, Health),
    Rejected(String, String),
}

struct Recorder(mpsc::UnboundedSender<Ev>);

impl Readings for Recorder {
    fn record(&self, sensor: &str, value: f64) {
        let _ = self.0.send(Ev::Value(sensor.to_string(), value));
    }
    fn source_health(&self, source: &str, health: Health) {
        let _ = self.0.send(Ev::Health(source.to_string(), health));
    }
    fn rejected(&self, source: &str, why: &str) {
        let _ = self
            .0
            .send(Ev::Rejected(source.to_string(), why.to_string()));
    }
}

/// The events drivers reported, in order.
pub struct Events {
    rx: mpsc::UnboundedReceiver<Ev>,
    /// Everything received so far (for failure messages and final checks).
    pub seen: Vec<Ev>,
}

pub fn recorder() -> (Arc<dyn Readings>, Events) {
    let (tx, rx) = mpsc::unbounded_channel();
    (
        Arc::new(Recorder(tx)),
        Events {
            rx,
            seen: Vec::new(),
        },
    )
}

impl Events {
    /// The next event matching `pred` (earlier non-matching events are
    /// skipped, but kept in `seen`). Panics after [`EXPECT_WITHIN`].
    pub async fn wait_for(&mut self, what: &str, pred: impl Fn(&Ev) -> bool) -> Ev {
        let deadline = tokio::time::Instant::now() + EXPECT_WITHIN;
        loop {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(ev)) => {
                    self.seen.push(ev.clone());
                    if pred(&ev) {
                        return ev;
                    }
                }
                Ok(None) => panic!(
                    "event channel closed while waiting for {what}\n{}",
                    self.history()
                ),
                Err(_) => panic!("no {what} within {EXPECT_WITHIN:?}\n{}", self.history()),
            }
        }
    }

    pub async fn value(&mut self, sensor: &str, want: f64) {
        self.wait_for(
            &format!("value {want} of {sensor}"),
            |e| matches!(e, Ev::Value(s, v) if s == sensor && (v - want).abs() < 1e-9),
        )
        .await;
    }

    /// All of these values, in any order (each counted once).
    pub async fn values(&mut self, want: &[(&str, f64)]) {
        let mut missing: Vec<(&str, f64)> = want.to_vec();
        while !missing.is_empty() {
            let what = format!("values {missing:?}");
            let ev = self
                .wait_for(&what, |e| {
                    missing.iter().any(
                        |(s, w)| matches!(e, Ev::Value(n, v) if n == s && (v - w).abs() < 1e-9),
                    )
                })
                .await;
            if let Ev::Value(n, v) = ev
                && let Some(i) = missing
                    .iter()
                    .position(|(s, w)| n == *s && (v - w).abs() < 1e-9)
            {
                missing.remove(i);
            }
        }
    }

    pub async fn health(&mut self, source: &str, want: &str) -> Health {
        match self
            .wait_for(
                &format!("{source} {want}"),
                |e| matches!(e, Ev::Health(s, h) if s == source && h.as_str() == want),
            )
            .await
        {
            Ev::Health(_, h) => h,
            _ => unreachable!(),
        }
    }

    /// The next rejection by `source` whose reason contains `needle`.
    pub async fn rejected(&mut self, source: &str, needle: &str) -> String {
        match self
            .wait_for(
                &format!("a rejection by {source} containing {needle:?}"),
                |e| matches!(e, Ev::Rejected(s, why) if s == source && why.contains(needle)),
            )
            .await
        {
            Ev::Rejected(_, why) => why,
            _ => unreachable!(),
        }
    }

    pub fn rejections(&self) -> Vec<&Ev> {
        self.seen
            .iter()
            .filter(|e| matches!(e, Ev::Rejected(..)))
            .collect()
    }

    fn history(&self) -> String {
        let mut out = String::from("events so far:");
        for e in &self.seen {
            let _ = write!(out, "\n  {e:?}");
        }
        out
    }
}

/// A free loopback TCP port (bound and released; the caller binds it next).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}
