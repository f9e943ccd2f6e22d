//! Simulated sensors (signals with noise, or a replayed CSV) and simulated
//! actuators (which record what they were told and, with an `input`, drive
//! the simulated world).

use parking_lot::Mutex;
use std::f64::consts::TAU;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::config::{SimSignal, SimSpec};
use super::sim_world::{Input, SharedWorld};
use super::{ActuatorDriver, DriverFuture, Readings};

/// A small deterministic PRNG (xorshift64*): reproducible noise from a seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [-1, 1).
    pub fn symmetric(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
}

/// The value of a simulated signal at `elapsed` since start; `walk` carries
/// the random walk's state.
pub fn signal_value(spec: &SimSpec, elapsed_ms: u64, walk: &mut f64, rng: &mut Rng) -> f64 {
    let period = spec.period.as_millis().max(1) as f64;
    let phase = (elapsed_ms as f64 % period) / period;
    let base = match spec.signal {
        SimSignal::Constant => spec.offset,
        SimSignal::Sine => spec.offset + spec.amplitude * (TAU * phase).sin(),
        SimSignal::Ramp => spec.offset + spec.amplitude * phase,
        SimSignal::RandomWalk => {
            *walk += spec.amplitude * rng.symmetric();
            spec.offset + *walk
        }
        SimSignal::Replay => replay_value(&spec.replay, elapsed_ms),
    };
    base + spec.noise * rng.symmetric()
}

/// The replayed value at `elapsed_ms`, looping over the recording.
fn replay_value(rows: &[(u64, f64)], elapsed_ms: u64) -> f64 {
    let span = rows.last().map_or(0, |(t, _)| *t).max(1);
    let t = elapsed_ms % (span + 1);
    rows.iter()
        .take_while(|(at, _)| *at <= t)
        .last()
        .or(rows.first())
        .map_or(0.0, |(_, v)| *v)
}

/// Samples one simulated sensor at its rate until shutdown.
pub async fn run_sensor(
    name: String,
    spec: SimSpec,
    readings: Arc<dyn Readings>,
    shutdown: CancellationToken,
) {
    let start = Instant::now();
    let mut ticker = tokio::time::interval(spec.every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut rng = Rng::new(
        spec.seed
            ^ name
                .bytes()
                .fold(0u64, |h, b| h.rotate_left(5) ^ u64::from(b)),
    );
    let mut walk = 0.0;
    readings.source_health("sim", super::Health::Ok);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = shutdown.cancelled() => return,
        }
        let elapsed = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        readings.record(&name, signal_value(&spec, elapsed, &mut walk, &mut rng));
    }
}

/// A simulated actuator: records every value it is told.
#[derive(Debug, Default)]
pub struct SimActuator {
    /// The world input it drives, if any.
    drives: Option<(SharedWorld, Input)>,
    applied: Mutex<Vec<f64>>,
    /// How many values were applied, so a watcher (a test, the benchmark)
    /// can wait for the next one instead of polling.
    count: watch::Sender<u64>,
}

impl SimActuator {
    pub fn new() -> Arc<Self> {
        Arc::new(SimActuator::default())
    }
    /// An actuator that sets `input` of the simulated world on every apply.
    pub fn driving(world: SharedWorld, input: Input) -> Arc<Self> {
        Arc::new(SimActuator {
            drives: Some((world, input)),
            ..SimActuator::default()
        })
    }
    /// Changes (to the number of values applied so far) on every apply.
    pub fn applied(&self) -> watch::Receiver<u64> {
        self.count.subscribe()
    }
    /// The last value applied, if any.
    pub fn value(&self) -> Option<f64> {
        self.applied.lock().last().copied()
    }
    /// Every value applied, oldest first (the most recent 1024).
    pub fn history(&self) -> Vec<f64> {
        self.applied.lock().clone()
    }
}

impl ActuatorDriver for SimActuator {
    fn apply(&self, value: f64) -> DriverFuture<'_> {
        let mut applied = self.applied.lock();
        if applied.len() == 1024 {
            applied.remove(0);
        }
        applied.push(value);
        drop(applied);
        if let Some((world, input)) = &self.drives {
            world.lock().set_input(*input, value);
        }
        self.count.send_modify(|n| *n += 1);
        Box::pin(std::future::ready(Ok(())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn spec(signal: SimSignal) -> SimSpec {
        SimSpec {
            signal,
            every: Duration::from_millis(100),
            amplitude: 2.0,
            offset: 10.0,
            period: Duration::from_millis(1000),
            noise: 0.0,
            seed: 7,
            replay: vec![(0, 1.0), (500, 2.0), (900, 3.0)],
        }
    }

    #[test]
    fn signals() {
        let (mut walk, mut rng) = (0.0, Rng::new(1));
        assert_eq!(
            signal_value(&spec(SimSignal::Constant), 123, &mut walk, &mut rng),
            10.0
        );
        assert!(
            (signal_value(&spec(SimSignal::Sine), 250, &mut walk, &mut rng) - 12.0).abs() < 1e-9
        );
        assert!(
            (signal_value(&spec(SimSignal::Ramp), 500, &mut walk, &mut rng) - 11.0).abs() < 1e-9
        );
        assert_eq!(
            signal_value(&spec(SimSignal::Replay), 600, &mut walk, &mut rng),
            2.0
        );
        assert_eq!(
            signal_value(&spec(SimSignal::Replay), 1801, &mut walk, &mut rng),
            3.0
        );
        let w = signal_value(&spec(SimSignal::RandomWalk), 0, &mut walk, &mut rng);
        assert!((w - 10.0).abs() <= 2.0);
    }

    #[tokio::test]
    async fn an_actuator_reports_each_apply_to_its_watchers() {
        let actuator = SimActuator::new();
        let mut applied = actuator.applied();
        assert!(!applied.has_changed().unwrap());
        actuator.apply(0.5).await.unwrap();
        actuator.apply(0.5).await.unwrap();
        assert!(applied.has_changed().unwrap());
        assert_eq!(*applied.borrow_and_update(), 2);
        assert_eq!(actuator.history(), [0.5, 0.5]);
    }

    #[test]
    fn noise_is_bounded_and_reproducible() {
        let mut s = spec(SimSignal::Constant);
        s.noise = 0.5;
        let values = |seed| {
            let (mut walk, mut rng) = (0.0, Rng::new(seed));
            (0..100)
                .map(|t| signal_value(&s, t, &mut walk, &mut rng))
                .collect::<Vec<_>>()
        };
        let a = values(3);
        assert_eq!(a, values(3));
        assert!(a.iter().all(|v| (v - 10.0).abs() <= 0.5));
        assert!(a.iter().any(|v| (v - 10.0).abs() > 0.01));
    }
}
