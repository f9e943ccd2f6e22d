//! Replayed sensors (`source = "replay"`): a sensor channel of a recording
//! played back at its recorded times, scaled by `[replay] speed`, so rules
//! and sessions run against a real day's data. The values were read from
//! the file at config load; this task only waits and delivers them.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::config::ReplaySpec;
use super::{Health, Readings};

/// The source key of every replayed sensor.
pub(crate) const SOURCE: &str = "replay";

/// Plays one sensor's values until they end (or, with `loop`, forever)
/// or shutdown. Time 0 is the recording's first message on any channel, so
/// sensors replayed from one file keep their recorded order.
pub(crate) async fn run_sensor(
    name: String,
    spec: ReplaySpec,
    readings: Arc<dyn Readings>,
    shutdown: CancellationToken,
) {
    readings.source_health(SOURCE, Health::Ok);
    let scale = |d: Duration| d.div_f64(spec.speed);
    loop {
        let start = Instant::now();
        for (at, value) in spec.values.iter() {
            tokio::select! {
                () = tokio::time::sleep_until(start + scale(*at)) => {}
                () = shutdown.cancelled() => return,
            }
            readings.record(&name, *value);
        }
        if !spec.looped {
            tracing::info!(sensor = %name, file = %spec.file.display(), "replay ended; the sensor's last value stays until it is stale");
            return;
        }
        // The next round starts where the recording ended (at least 1 ms on).
        let end = start + scale(spec.span).max(Duration::from_millis(1));
        tokio::select! {
            () = tokio::time::sleep_until(end) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use parking_lot::Mutex;

    use super::*;

    /// Every value delivered, with when (on tokio's clock).
    #[derive(Default)]
    struct Delivered(Mutex<Vec<(f64, Instant)>>);

    impl Delivered {
        /// Each value with when it was delivered, after `start`.
        fn since(&self, start: Instant) -> Vec<(f64, Duration)> {
            self.0
                .lock()
                .iter()
                .map(|(v, at)| (*v, *at - start))
                .collect()
        }
    }

    impl Readings for Delivered {
        fn record(&self, _sensor: &str, value: f64) {
            self.0.lock().push((value, Instant::now()));
        }
        fn source_health(&self, _source: &str, _health: Health) {}
        fn rejected(&self, _source: &str, _why: &str) {}
    }

    fn spec(speed: f64, looped: bool) -> ReplaySpec {
        ReplaySpec {
            file: "test.mcap".into(),
            channel: "/sensors/d".into(),
            values: Arc::new(vec![
                (Duration::from_millis(100), 1.0),
                (Duration::from_millis(300), 2.0),
                (Duration::from_millis(400), 3.0),
            ]),
            span: Duration::from_millis(1000),
            speed,
            looped,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn values_arrive_at_their_recorded_times_scaled_by_the_speed() {
        let delivered = Arc::new(Delivered::default());
        let start = Instant::now();
        run_sensor(
            "d".into(),
            spec(2.0, false),
            delivered.clone(),
            CancellationToken::new(),
        )
        .await;
        let got = delivered.since(start);
        assert_eq!(
            got,
            vec![
                (1.0, Duration::from_millis(50)),
                (2.0, Duration::from_millis(150)),
                (3.0, Duration::from_millis(200)),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_looped_replay_starts_over_where_the_recording_ended() {
        let delivered = Arc::new(Delivered::default());
        let shutdown = CancellationToken::new();
        let start = Instant::now();
        let task = tokio::spawn(run_sensor(
            "d".into(),
            spec(1.0, true),
            delivered.clone(),
            shutdown.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(1350)).await;
        shutdown.cancel();
        let _ = task.await;
        let got = delivered.since(start);
        assert_eq!(
            got,
            vec![
                (1.0, Duration::from_millis(100)),
                (2.0, Duration::from_millis(300)),
                (3.0, Duration::from_millis(400)),
                (1.0, Duration::from_millis(1100)),
                (2.0, Duration::from_millis(1300)),
            ]
        );
    }
}
