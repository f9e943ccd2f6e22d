//! Measurement 4, control-loop regularity: the OODA loop with 20 simulated sensors and
//! 10 reflex rules at 100 Hz and 1000 Hz, beside two bare timer loops at the
//! same rate running at the same time: a tokio interval on the same runtime
//! (the loop's own timer, without its work) and a plain thread sleeping to
//! absolute deadlines (what the OS timer alone gives).

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Result, anyhow};
use rozd::config::{Config, ConfigSource};
use rozd::safety::ProtectiveStop;

use super::Scale;
use super::report::{Better, Group, Samples};

/// As many recent ticks as the loop keeps for its percentiles
/// (`/v1/status`), so the floors' percentiles cover the same window.
const WINDOW: usize = 4096;

/// 20 simulated sensors at 100 Hz (some with alarm limits and staleness),
/// two actuators, and 10 rules that read them every tick (none fires: the
/// steady state of a quiet robot).
pub fn host(tick_hz: f64) -> String {
    let mut text = format!("[ooda]\ntick_hz = {tick_hz}\n");
    for i in 0..20 {
        let _ = write!(
            text,
            "\n[[sensors]]\nname = \"s{i:02}\"\nsource = \"sim\"\nsignal = \"sine\"\n\
             offset = 0.0\namplitude = 1.0\nperiod_ms = {}\nnoise = 0.01\nrate_hz = 100\n\
             stale_after_ms = 1000\n",
            1000 + i * 100
        );
        if i % 2 == 0 {
            text.push_str("warn_max = 500.0\ncritical_max = 1000.0\nhysteresis = 1.0\n");
        }
    }
    text.push_str(
        "\n[[actuators]]\nname = \"a0\"\nkind = \"sim\"\nmin = -1.0\nmax = 1.0\nsafe_value = 0.0\n\
         \n[[actuators]]\nname = \"a1\"\nkind = \"sim\"\nmin = 0.0\nmax = 1.0\nsafe_value = 0.0\n",
    );
    let rules = [
        ("s00 > 1000 and a0 > 0", "for_ms = 0"),
        ("stale(s01) and a0 != 0", "for_ms = 200"),
        ("alarm(s02) >= 2", "cooldown_ms = 1000"),
        ("s03 < -1000 or s04 > 1000", "for_ms = 0"),
        ("age_ms(s05) > 5000", "for_ms = 0"),
        ("not (s06 < 1000)", "for_ms = 50"),
        ("s07 >= 999 and s08 <= -999", "for_ms = 0"),
        ("alarm(s10) >= 1 and a1 > 0", "for_ms = 100"),
        (
            "s11 > 1000 and s12 > 1000 and s13 > 1000",
            "cooldown_ms = 500",
        ),
        ("stale(s14) or stale(s15) or s16 > 1000", "for_ms = 300"),
    ];
    for (i, (when, timing)) in rules.iter().enumerate() {
        let _ = write!(
            text,
            "\n[[rules]]\nname = \"r{i}\"\nwhen = \"{when}\"\n{timing}\nthen = {{ actuator = \"a{}\", value = 0.0 }}\n",
            i % 2
        );
    }
    text
}

struct Timer {
    lateness: Samples,
    max_us: f64,
    missed: u64,
    ticks: usize,
}

impl Timer {
    fn new(all: Vec<f64>, missed: u64) -> Timer {
        let max_us = all.iter().copied().fold(0.0, f64::max);
        let ticks = all.len();
        let mut lateness = Samples::default();
        for us in &all[all.len().saturating_sub(WINDOW)..] {
            lateness.push_us(*us);
        }
        Timer {
            lateness,
            max_us,
            missed,
            ticks,
        }
    }
}

/// A tokio interval with the loop's missed-tick behaviour (`Skip`).
async fn tokio_timer(period: Duration, duration: Duration) -> Timer {
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let end = tokio::time::Instant::now() + duration;
    let (mut all, mut missed) = (Vec::new(), 0u64);
    let mut expected: Option<tokio::time::Instant> = None;
    loop {
        let scheduled = ticker.tick().await;
        let now = tokio::time::Instant::now();
        if now >= end {
            break;
        }
        if let Some(expected) = expected
            && scheduled > expected
        {
            missed += (scheduled.duration_since(expected).as_secs_f64() / period.as_secs_f64())
                .round() as u64;
        }
        expected = Some(scheduled + period);
        all.push(now.saturating_duration_since(scheduled).as_secs_f64() * 1e6);
    }
    Timer::new(all, missed)
}

/// A plain thread sleeping to absolute deadlines; deadlines already past
/// when it wakes are skipped and counted as missed.
fn thread_timer(period: Duration, duration: Duration) -> Timer {
    let start = std::time::Instant::now();
    let end = start + duration;
    let mut next = start + period;
    let (mut all, mut missed) = (Vec::new(), 0u64);
    loop {
        let now = std::time::Instant::now();
        if let Some(wait) = next.checked_duration_since(now) {
            std::thread::sleep(wait);
        }
        let woke = std::time::Instant::now();
        if woke >= end {
            break;
        }
        all.push(woke.saturating_duration_since(next).as_secs_f64() * 1e6);
        next += period;
        while next <= woke {
            next += period;
            missed += 1;
        }
    }
    Timer::new(all, missed)
}

pub async fn control_loop(scale: &Scale) -> Result<Group> {
    let mut group = Group::new(
        "4. control-loop regularity",
        "a bare tokio interval at the same rate on the same runtime, at the same time \
         (rows marked 'thread': a plain thread sleeping to absolute deadlines)",
    );
    for hz in [100.0, 1000.0] {
        let config = Config::parse(&host(hz), ConfigSource::BuiltIn)
            .map_err(|e| anyhow!("control-loop config: {e}"))?;
        let period = Duration::from_secs_f64(1.0 / hz);
        let ooda = rozd::ooda::Ooda::start(
            &config.hardware,
            config.reflex_rules.clone(),
            &config.ooda.loop_config(),
            "bench",
            ProtectiveStop::default(),
        )
        .await?;
        let thread = std::thread::spawn({
            let duration = scale.loop_for;
            move || thread_timer(period, duration)
        });
        let tokio_floor = tokio_timer(period, scale.loop_for).await;
        let stats = ooda.stats();
        ooda.stop().await;
        let thread_floor = thread
            .join()
            .map_err(|_| anyhow!("the thread timer panicked"))?;

        let id = format!("loop.{hz:.0}hz");
        let name = format!("{hz:.0} Hz");
        let ticks = usize::try_from(stats.ticks).unwrap_or(usize::MAX);
        let n = (ticks, tokio_floor.ticks);
        group.add(
            &format!("{id}.lateness_p50_us"),
            &format!("{name}: tick lateness p50"),
            "µs",
            Better::Lower,
            stats.lateness_p50_us as f64,
            Some(tokio_floor.lateness.percentile(0.50)),
            n,
        );
        group.add(
            &format!("{id}.lateness_p99_us"),
            &format!("{name}: tick lateness p99"),
            "µs",
            Better::Lower,
            stats.lateness_p99_us as f64,
            Some(tokio_floor.lateness.percentile(0.99)),
            n,
        );
        group.add(
            &format!("{id}.lateness_max_us"),
            &format!("{name}: tick lateness max"),
            "µs",
            Better::Lower,
            stats.lateness_max_us as f64,
            Some(tokio_floor.max_us),
            n,
        );
        group.add(
            &format!("{id}.missed_ticks"),
            &format!("{name}: missed ticks"),
            "ticks",
            Better::Lower,
            stats.missed_ticks as f64,
            Some(tokio_floor.missed as f64),
            n,
        );
        let n = (ticks, thread_floor.ticks);
        group.add(
            &format!("{id}.thread.lateness_p99_us"),
            &format!("{name}: tick lateness p99 vs thread"),
            "µs",
            Better::Lower,
            stats.lateness_p99_us as f64,
            Some(thread_floor.lateness.percentile(0.99)),
            n,
        );
        group.add(
            &format!("{id}.thread.lateness_max_us"),
            &format!("{name}: tick lateness max vs thread"),
            "µs",
            Better::Lower,
            stats.lateness_max_us as f64,
            Some(thread_floor.max_us),
            n,
        );
        group.add(
            &format!("{id}.thread.missed_ticks"),
            &format!("{name}: missed ticks vs thread"),
            "ticks",
            Better::Lower,
            stats.missed_ticks as f64,
            Some(thread_floor.missed as f64),
            n,
        );
    }
    Ok(group)
}
