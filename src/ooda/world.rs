//! World state: the latest value, timestamp and a short history per sensor,
//! and the health of every source. Drivers write it (through
//! [`Readings`]); the tick loop and the API read it.

use parking_lot::{Mutex, MutexGuard};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::hw::config::{SensorSource, SensorSpec};
use crate::hw::{Health, HealthKind, Readings};
use crate::logging::LogLimiter;
use crate::observe::Observers;

/// Samples kept per sensor for `read_sensor` and `/v1/sensors/{name}`.
pub const HISTORY: usize = 128;
/// The trend of a sensor (`/v1/sensors/{name}`, the dashboard's plots):
/// the lowest and highest value of each span this long, for [`TREND`] spans
/// (3 minutes), however fast the sensor reports.
pub const TREND_SPAN: Duration = Duration::from_millis(500);
pub const TREND: usize = 360;
/// Minimum spacing of log lines about rejected input from one source.

#[derive(Debug)]
struct SensorState {
    latest: Option<(f64, Instant)>,
    history: VecDeque<(f64, Instant)>,
    trend: Trend,
    source: String,
    /// Why its working source could not read it last time (see
    /// [`Readings::sensor_error`]).
    error: Option<String>,
}

#[derive(Debug)]
struct SourceState {
    health: Health,
    rejected: u64,
    last_rejection: Option<String>,
    log: LogLimiter,
}

impl Default for SourceState {
    fn default() -> Self {
        SourceState {
            health: Health::Ok,
            rejected: 0,
            last_rejection: None,
            log: LogLimiter::default(),
        }
    }
}

#[derive(Debug)]
struct Inner {
    sensors: Vec<SensorState>,
    sources: BTreeMap<String, SourceState>,
}

/// Told of every sensor value the world takes, as it arrives (a
/// recording, so drivers need not know of it). Must not block: it runs on
/// drivers' tasks and the control loop's thread (see [`crate::observe`]).
pub trait SensorObserver: Send + Sync + std::fmt::Debug {
    fn sensor_value(&self, sensor: &str, value: f64);
}

#[derive(Debug)]
pub struct World {
    specs: Vec<SensorSpec>,
    index: HashMap<String, usize>,
    inner: Mutex<Inner>,
    observers: Observers<dyn SensorObserver>,
}

/// The source key a sensor belongs to (its health is that source's health).
pub fn source_key(source: &SensorSource) -> String {
    match source {
        SensorSource::Serial { port, .. } => format!("serial:{port}"),
        SensorSource::Gpio { .. } => "gpio".into(),
        SensorSource::Mqtt { .. } => "mqtt".into(),
        SensorSource::System { .. } => "system".into(),
        SensorSource::Sim(_) | SensorSource::World(_) => "sim".into(),
        SensorSource::Replay(_) => "replay".into(),
        SensorSource::Modbus { link, .. } => format!("modbus:{link}"),
    }
}

/// One sensor as seen at one instant.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SensorView {
    pub name: String,
    pub unit: Option<String>,
    pub value: Option<f64>,
    pub age_ms: Option<u64>,
    /// The source's health, or stale by age.
    pub health: HealthKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SourceView {
    pub name: String,
    pub health: HealthKind,
    pub error: Option<String>,
    pub rejected: u64,
    pub last_rejection: Option<String>,
    /// A Modbus link's counters (sources `modbus:<link>`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link: Option<crate::hw::modbus::LinkStats>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    pub value: f64,
    pub age_ms: u64,
}

/// The lowest and highest value of one span of a sensor's trend; `age_ms`
/// is the age of the span's start.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TrendPoint {
    pub age_ms: u64,
    pub min: f64,
    pub max: f64,
    /// The span ended higher than it began (a plot draws its minimum
    /// first, then its maximum; the other way round when falling).
    pub rising: bool,
}

/// One span of a trend.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: Instant,
    first: f64,
    last: f64,
    min: f64,
    max: f64,
}

/// Spans of [`TREND_SPAN`], the newest last, at most [`TREND`]: plain data.
#[derive(Debug, Default)]
struct Trend {
    spans: VecDeque<Span>,
}

impl Trend {
    fn add(&mut self, value: f64, now: Instant) {
        if let Some(span) = self.spans.back_mut()
            && now.saturating_duration_since(span.start) < TREND_SPAN
        {
            span.min = span.min.min(value);
            span.max = span.max.max(value);
            span.last = value;
            return;
        }
        if self.spans.len() == TREND {
            self.spans.pop_front();
        }
        self.spans.push_back(Span {
            start: now,
            first: value,
            last: value,
            min: value,
            max: value,
        });
    }

    fn points(&self, now: Instant) -> Vec<TrendPoint> {
        self.spans
            .iter()
            .map(|s| TrendPoint {
                age_ms: ms(now.saturating_duration_since(s.start)),
                min: s.min,
                max: s.max,
                rising: s.last >= s.first,
            })
            .collect()
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl World {
    pub fn new(specs: Vec<SensorSpec>, observers: Observers<dyn SensorObserver>) -> World {
        let index = specs
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.clone(), i))
            .collect();
        let sensors = specs
            .iter()
            .map(|s| SensorState {
                latest: None,
                history: VecDeque::with_capacity(HISTORY),
                trend: Trend::default(),
                source: source_key(&s.source),
                error: None,
            })
            .collect();
        let mut sources = BTreeMap::new();
        for s in &specs {
            sources
                .entry(source_key(&s.source))
                .or_insert_with(SourceState::default);
        }
        World {
            specs,
            index,
            inner: Mutex::new(Inner { sensors, sources }),
            observers,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    pub fn specs(&self) -> &[SensorSpec] {
        &self.specs
    }

    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    /// Every sensor as of `now`.
    pub fn sensors(&self, now: Instant) -> Vec<SensorView> {
        let inner = self.lock();
        self.specs
            .iter()
            .zip(&inner.sensors)
            .map(|(spec, state)| view(spec, state, &inner, now))
            .collect()
    }

    /// One sensor with its history (newest last).
    pub fn sensor(&self, name: &str, now: Instant) -> Option<(SensorView, Vec<Sample>)> {
        let i = self.index_of(name)?;
        let inner = self.lock();
        let state = &inner.sensors[i];
        let history = state
            .history
            .iter()
            .map(|(value, at)| Sample {
                value: *value,
                age_ms: ms(now.saturating_duration_since(*at)),
            })
            .collect();
        Some((view(&self.specs[i], state, &inner, now), history))
    }

    /// A sensor's trend (oldest first): see [`TREND_SPAN`].
    pub fn trend(&self, name: &str, now: Instant) -> Option<Vec<TrendPoint>> {
        let i = self.index_of(name)?;
        Some(self.lock().sensors[i].trend.points(now))
    }

    pub fn sources(&self) -> Vec<SourceView> {
        self.lock()
            .sources
            .iter()
            .map(|(name, s)| SourceView {
                name: name.clone(),
                health: s.health.kind(),
                error: match &s.health {
                    Health::Error(e) => Some(e.clone()),
                    _ => None,
                },
                rejected: s.rejected,
                last_rejection: s.last_rejection.clone(),
                link: None,
            })
            .collect()
    }
}

/// A sensor's health as of `now`: its source's, or stale by age; the
/// source's error, if any.
fn health<'a>(
    spec: &SensorSpec,
    state: &'a SensorState,
    inner: &'a Inner,
    now: Instant,
) -> (HealthKind, Option<&'a String>) {
    let age = state
        .latest
        .map(|(_, at)| now.saturating_duration_since(at));
    match inner.sources.get(&state.source).map(|s| &s.health) {
        Some(Health::Error(e)) => (HealthKind::Error, Some(e)),
        Some(Health::Disconnected) => (HealthKind::Disconnected, None),
        _ if state.error.is_some() => (HealthKind::Error, state.error.as_ref()),
        _ if state.latest.is_none() => (HealthKind::Stale, None),
        _ if spec
            .stale_after
            .zip(age)
            .is_some_and(|(limit, age)| age > limit) =>
        {
            (HealthKind::Stale, None)
        }
        _ => (HealthKind::Ok, None),
    }
}

fn view(spec: &SensorSpec, state: &SensorState, inner: &Inner, now: Instant) -> SensorView {
    let (health, error) = health(spec, state, inner, now);
    SensorView {
        name: spec.name.clone(),
        unit: spec.unit.clone(),
        value: state.latest.map(|(v, _)| v),
        age_ms: state
            .latest
            .map(|(_, at)| ms(now.saturating_duration_since(at))),
        health,
        error: error.cloned(),
    }
}

/// One sensor as the tick reads it: no name, no allocation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Reading {
    pub value: Option<f64>,
    /// When the value arrived.
    pub at: Option<Instant>,
    pub age_ms: Option<u64>,
    /// Health `ok`: a value that is fresh and whose source works.
    pub healthy: bool,
}

impl World {
    /// Every sensor as of `now`, in spec order, into `out` (reused across
    /// ticks so that a fast loop does not allocate).
    pub fn readings_into(&self, now: Instant, out: &mut Vec<Reading>) {
        out.clear();
        let inner = self.lock();
        for (spec, state) in self.specs.iter().zip(&inner.sensors) {
            out.push(Reading {
                value: state.latest.map(|(v, _)| v),
                at: state.latest.map(|(_, at)| at),
                age_ms: state
                    .latest
                    .map(|(_, at)| ms(now.saturating_duration_since(at))),
                healthy: health(spec, state, &inner, now).0 == HealthKind::Ok,
            });
        }
    }
}

impl Readings for World {
    fn record(&self, sensor: &str, value: f64) {
        let Some(i) = self.index_of(sensor) else {
            tracing::warn!(sensor, "reading for an unknown sensor dropped");
            return;
        };
        if !value.is_finite() {
            let source = source_key(&self.specs[i].source);
            self.rejected(&source, &format!("{sensor}: non-finite value"));
            return;
        }
        let now = Instant::now();
        {
            let mut inner = self.lock();
            let state = &mut inner.sensors[i];
            state.latest = Some((value, now));
            state.error = None;
            if state.history.len() == HISTORY {
                state.history.pop_front();
            }
            state.history.push_back((value, now));
            state.trend.add(value, now);
        }
        for observer in self.observers.iter() {
            observer.sensor_value(sensor, value);
        }
    }

    fn source_health(&self, source: &str, health: Health) {
        let mut inner = self.lock();
        let entry = inner.sources.entry(source.to_string()).or_default();
        if entry.health != health {
            match &health {
                Health::Ok => tracing::info!(source, "source ok"),
                Health::Error(e) => tracing::warn!(source, error = %e, "source failed"),
                other => tracing::warn!(source, health = other.as_str(), "source unhealthy"),
            }
            entry.health = health;
        }
    }

    fn sensor_error(&self, sensor: &str, error: Option<&str>) {
        let Some(i) = self.index_of(sensor) else {
            return;
        };
        let mut inner = self.lock();
        let state = &mut inner.sensors[i];
        if state.error.as_deref() != error {
            match error {
                Some(e) => tracing::warn!(sensor, error = e, "sensor not read"),
                None => tracing::info!(sensor, "sensor read again"),
            }
            state.error = error.map(str::to_string);
        }
    }

    fn rejected(&self, source: &str, why: &str) {
        let now = Instant::now();
        let mut inner = self.lock();
        let entry = inner.sources.entry(source.to_string()).or_default();
        entry.rejected += 1;
        entry.last_rejection = Some(why.chars().take(200).collect());
        // Rate-limited: a device spewing garbage must not flood the journal.
        if let Some(suppressed) = entry.log.allow(now) {
            tracing::warn!(
                source,
                why,
                suppressed,
                total = entry.rejected,
                "input rejected"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_trend_keeps_each_spans_extremes_for_three_minutes() {
        let mut trend = Trend::default();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // 50 Hz for 1.2 s: three spans, a spike in the first kept as its max.
        for i in 0..60u64 {
            let value = if i == 3 { 9.0 } else { i as f64 * 0.01 };
            trend.add(value, at(i * 20));
        }
        let points = trend.points(at(1200));
        assert_eq!(points.len(), 3, "{points:?}");
        assert_eq!(
            (points[0].age_ms, points[0].min, points[0].max),
            (1200, 0.0, 9.0)
        );
        assert!(points[0].rising, "0.0 .. 0.24");
        assert_eq!(points[2].age_ms, 200);
        // Never more than TREND spans: the oldest go.
        for i in 0..(TREND as u64 + 10) {
            trend.add(1.0, at(2000 + i * 500));
        }
        let points = trend.points(at(2000 + (TREND as u64 + 10) * 500));
        assert_eq!(points.len(), TREND);
        assert!(points.iter().all(|p| p.min == 1.0 && p.max == 1.0));
    }
}
