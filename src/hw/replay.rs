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
pub const SOURCE: &str = "replay";

/// Plays one sensor's values until they end (or, with `loop`, forever)
/// or shutdown. Time 0 is the recording's first message on any channel, so
/// sensors replayed from one file keep their recorded order.
pub async fn run_sensor(
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
