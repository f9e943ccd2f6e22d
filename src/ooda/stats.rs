//! The loop's own statistics: how late each tick woke (against its absolute
//! deadline), how long each tick took, and how many deadlines were missed,
//! over a stated window of recent ticks. Plain data, no I/O.

use std::collections::VecDeque;

use serde::Serialize;

/// Ticks the percentiles are taken over.
pub(crate) const WINDOW: usize = 4096;

/// What `/v1/status` (`ooda`) and the benchmark report.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct LoopStats {
    pub tick_hz: f64,
    /// How the loop is timed: `thread` (its own OS thread sleeping to
    /// absolute deadlines) or `runtime` (a task on the async runtime's clock).
    pub timer: &'static str,
    /// Real-time settings in force on the loop's thread, as configured.
    pub realtime: RealtimeView,
    pub ticks: u64,
    /// Deadlines that passed without a tick (the loop skips them, never
    /// bunches ticks up to catch up).
    pub missed_ticks: u64,
    /// Ticks the percentiles below are taken over (the most recent).
    pub window_ticks: usize,
    pub lateness_p50_us: u64,
    pub lateness_p99_us: u64,
    pub lateness_p999_us: u64,
    /// Since start.
    pub lateness_max_us: u64,
    /// How long a tick's work (orient, decide, hand-off) took.
    pub tick_exec_p50_us: u64,
    pub tick_exec_p99_us: u64,
    pub tick_exec_max_us: u64,
}

#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct RealtimeView {
    /// SCHED_FIFO priority, if set.
    pub priority: Option<u8>,
    /// CPUs the loop's thread is pinned to, if set.
    pub cpu_affinity: Option<Vec<usize>>,
    pub memory_locked: bool,
}

/// Collected by the loop, read by [`TickHistory::stats`].
#[derive(Debug, Default)]
pub(crate) struct TickHistory {
    ticks: u64,
    missed: u64,
    late_max_us: u64,
    exec_max_us: u64,
    late: VecDeque<u64>,
    exec: VecDeque<u64>,
}

impl TickHistory {
    /// One tick: how late it woke, how long its work took, and how many
    /// deadlines before it were skipped.
    pub(crate) fn tick(&mut self, late_us: u64, exec_us: u64, skipped: u64) {
        self.ticks += 1;
        self.missed += skipped;
        self.late_max_us = self.late_max_us.max(late_us);
        self.exec_max_us = self.exec_max_us.max(exec_us);
        for (ring, v) in [(&mut self.late, late_us), (&mut self.exec, exec_us)] {
            if ring.len() == WINDOW {
                ring.pop_front();
            }
            ring.push_back(v);
        }
    }

    pub(crate) fn stats(
        &self,
        tick_hz: f64,
        timer: &'static str,
        realtime: RealtimeView,
    ) -> LoopStats {
        let late = sorted(&self.late);
        let exec = sorted(&self.exec);
        LoopStats {
            tick_hz,
            timer,
            realtime,
            ticks: self.ticks,
            missed_ticks: self.missed,
            window_ticks: late.len(),
            lateness_p50_us: percentile(&late, 0.50),
            lateness_p99_us: percentile(&late, 0.99),
            lateness_p999_us: percentile(&late, 0.999),
            lateness_max_us: self.late_max_us,
            tick_exec_p50_us: percentile(&exec, 0.50),
            tick_exec_p99_us: percentile(&exec, 0.99),
            tick_exec_max_us: self.exec_max_us,
        }
    }
}

fn sorted(ring: &VecDeque<u64>) -> Vec<u64> {
    let mut v: Vec<u64> = ring.iter().copied().collect();
    v.sort_unstable();
    v
}

/// The nearest-rank percentile of sorted values; 0 when there are none.
fn percentile(sorted: &[u64], p: f64) -> u64 {
    match sorted.len() {
        0 => 0,
        n => sorted[((n as f64 * p).ceil() as usize).clamp(1, n) - 1],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_over_the_window_and_maxima_since_start() {
        let mut r = TickHistory::default();
        r.tick(10_000, 5, 0);
        for i in 1..=WINDOW as u64 {
            r.tick(i, i % 7, if i == 5 { 3 } else { 0 });
        }
        let s = r.stats(1000.0, "thread", RealtimeView::default());
        assert_eq!(s.ticks, WINDOW as u64 + 1);
        assert_eq!(s.missed_ticks, 3);
        assert_eq!(s.window_ticks, WINDOW);
        assert_eq!(s.lateness_p50_us, 2048);
        assert_eq!(s.lateness_p99_us, 4056);
        assert_eq!(s.lateness_p999_us, 4092);
        assert_eq!(s.lateness_max_us, 10_000, "the max is since start");
        assert_eq!(s.tick_exec_max_us, 6);
        let empty = TickHistory::default().stats(50.0, "runtime", RealtimeView::default());
        assert_eq!((empty.lateness_p99_us, empty.window_ticks), (0, 0));
    }
}
