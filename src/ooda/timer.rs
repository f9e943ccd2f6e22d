//! What wakes the loop: its own OS thread sleeping to absolute deadlines on
//! `CLOCK_MONOTONIC` (`clock_nanosleep(TIMER_ABSTIME)`, the kernel's floor),
//! optionally SCHED_FIFO, pinned and with memory locked; or a task on the
//! async runtime's clock (`timer = "runtime"`: for tests on tokio's paused
//! clock, where exact simulated time matters more than wake-up latency).
//!
//! Either way the loop never bunches ticks to catch up: deadlines that
//! passed while a tick ran are skipped and counted.

use std::time::Duration;

use nix::sys::time::TimeSpec;
use nix::time::{ClockId, ClockNanosleepFlags, clock_gettime, clock_nanosleep};

use super::stats::RealtimeView;

/// How the loop is timed (`[ooda] timer`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Timer {
    #[default]
    Thread,
    Runtime,
}

impl Timer {
    pub fn as_str(self) -> &'static str {
        match self {
            Timer::Thread => "thread",
            Timer::Runtime => "runtime",
        }
    }
}

/// Real-time settings for the loop's thread (`[ooda] realtime_priority`,
/// `cpu_affinity`, `lock_memory`). Each one configured must apply, or the
/// daemon does not start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Realtime {
    pub priority: Option<u8>,
    pub cpus: Option<Vec<usize>>,
    pub lock_memory: bool,
}

impl Realtime {
    pub fn view(&self) -> RealtimeView {
        RealtimeView {
            priority: self.priority,
            cpu_affinity: self.cpus.clone(),
            memory_locked: self.lock_memory,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TimerError {
    #[error(
        "ooda.realtime_priority = {priority}: cannot make the loop's thread SCHED_FIFO: {why} \
         (needs CAP_SYS_NICE or RLIMIT_RTPRIO >= {priority}; see docs/concepts/ooda-loop.md, 'Real-time loop')"
    )]
    Priority { priority: u8, why: String },
    #[error("ooda.cpu_affinity = {cpus:?}: cannot pin the loop's thread: {why}")]
    Affinity { cpus: Vec<usize>, why: String },
    #[error(
        "ooda.lock_memory = true: mlockall failed: {why} (needs CAP_IPC_LOCK or a large enough \
         RLIMIT_MEMLOCK; see docs/concepts/ooda-loop.md, 'Real-time loop')"
    )]
    LockMemory { why: String },
    #[error("cannot start the loop's thread: {0}")]
    Spawn(String),
}

/// One wake-up: how late it came after its deadline, and how many earlier
/// deadlines were skipped.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wake {
    pub late: Duration,
    pub skipped: u64,
}

/// Starts the loop's thread: applies `realtime` on it (reporting failure
/// before returning), then calls `tick` at every deadline `period` apart
/// until it returns `false`.
pub(crate) fn spawn_thread(
    period: Duration,
    realtime: &Realtime,
    mut tick: impl FnMut(Wake) -> bool + Send + 'static,
) -> Result<std::thread::JoinHandle<()>, TimerError> {
    let realtime = realtime.clone();
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
    let handle = std::thread::Builder::new()
        .name("rozd-ooda".into())
        .spawn(move || {
            let applied = apply(&realtime);
            let ok = applied.is_ok();
            let _ = ready_tx.send(applied);
            if ok {
                run_thread(period, &mut tick);
            }
        })
        .map_err(|e| TimerError::Spawn(e.to_string()))?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(handle),
        Ok(Err(e)) => {
            let _ = handle.join();
            Err(e)
        }
        Err(_) => Err(TimerError::Spawn("the loop's thread ended at once".into())),
    }
}

fn run_thread(period: Duration, tick: &mut impl FnMut(Wake) -> bool) {
    let period_ts = TimeSpec::from(period);
    let Ok(start) = clock_gettime(ClockId::CLOCK_MONOTONIC) else {
        tracing::error!("CLOCK_MONOTONIC is not readable; the control loop cannot run");
        return;
    };
    // The first tick at once, as an interval's: the first Observation
    // need not wait a period.
    let mut deadline = start;
    loop {
        // EINTR (a signal) wakes early: sleep again to the same deadline.
        while let Err(nix::errno::Errno::EINTR) = clock_nanosleep(
            ClockId::CLOCK_MONOTONIC,
            ClockNanosleepFlags::TIMER_ABSTIME,
            &deadline,
        ) {}
        let now = clock_gettime(ClockId::CLOCK_MONOTONIC).unwrap_or(deadline);
        let late = Duration::from(now - deadline.min(now));
        let mut skipped = 0u64;
        deadline = deadline + period_ts;
        while deadline <= now {
            deadline = deadline + period_ts;
            skipped += 1;
        }
        if !tick(Wake { late, skipped }) {
            return;
        }
    }
}

/// The loop as a task on the runtime's clock.
pub(crate) async fn run_runtime(period: Duration, mut tick: impl FnMut(Wake) -> bool) {
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut expected: Option<tokio::time::Instant> = None;
    loop {
        let scheduled = ticker.tick().await;
        let now = tokio::time::Instant::now();
        // With `Skip`, a tick scheduled after the expected one means
        // deadlines were dropped.
        let skipped = expected.map_or(0, |e| {
            (scheduled.saturating_duration_since(e).as_secs_f64() / period.as_secs_f64()).round()
                as u64
        });
        expected = Some(scheduled + period);
        let late = now.saturating_duration_since(scheduled);
        if !tick(Wake { late, skipped }) {
            return;
        }
    }
}

/// Applies the real-time settings to the calling thread (memory locking is
/// process-wide).
fn apply(realtime: &Realtime) -> Result<(), TimerError> {
    if let Some(cpus) = &realtime.cpus {
        let affinity = |why: String| TimerError::Affinity {
            cpus: cpus.clone(),
            why,
        };
        let mut set = nix::sched::CpuSet::new();
        for &cpu in cpus {
            set.set(cpu).map_err(|e| affinity(e.to_string()))?;
        }
        nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
            .map_err(|e| affinity(e.to_string()))?;
    }
    if realtime.lock_memory {
        use nix::sys::mman::{MlockAllFlags, mlockall};
        mlockall(MlockAllFlags::MCL_CURRENT | MlockAllFlags::MCL_FUTURE)
            .map_err(|e| TimerError::LockMemory { why: e.to_string() })?;
    }
    if let Some(priority) = realtime.priority {
        use thread_priority::{
            RealtimeThreadSchedulePolicy, ThreadPriority, ThreadPriorityValue,
            ThreadSchedulePolicy, set_thread_priority_and_policy, thread_native_id,
        };
        let fail = |why: String| TimerError::Priority { priority, why };
        let value = ThreadPriorityValue::try_from(priority).map_err(|e| fail(e.to_string()))?;
        set_thread_priority_and_policy(
            thread_native_id(),
            ThreadPriority::Crossplatform(value),
            ThreadSchedulePolicy::Realtime(RealtimeThreadSchedulePolicy::Fifo),
        )
        .map_err(|e| fail(format!("{e:?}")))?;
    }
    Ok(())
}

/// `tick` with its panics caught: a tick that panics ends the loop and
/// hands `failed` the panic's message once (the caller goes safe), instead
/// of leaving a dead loop behind whose reflexes no longer run.
pub(crate) fn guarded(
    mut tick: impl FnMut(Wake) -> bool,
    failed: impl FnOnce(String),
) -> impl FnMut(Wake) -> bool {
    let mut failed = Some(failed);
    move |wake| {
        if failed.is_none() {
            return false;
        }
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tick(wake))) {
            Ok(go_on) => go_on,
            Err(panic) => {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".to_string());
                if let Some(failed) = failed.take() {
                    failed(message);
                }
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_tick_ends_the_loop_and_reports_once() {
        let (tx, rx) = std::sync::mpsc::channel();
        let mut n = 0;
        let handle = spawn_thread(
            Duration::from_millis(1),
            &Realtime::default(),
            guarded(
                move |_| {
                    n += 1;
                    assert!(n < 3, "tick {n} failed");
                    true
                },
                move |why| {
                    let _ = tx.send(why);
                },
            ),
        )
        .unwrap();
        // The thread ends by itself: the guard stopped the loop.
        handle.join().unwrap();
        let reports: Vec<String> = rx.iter().collect();
        assert_eq!(reports.len(), 1);
        assert!(reports[0].contains("tick 3 failed"), "{reports:?}");
    }

    #[test]
    fn the_thread_ticks_to_deadlines_until_told_to_stop() {
        let (tx, rx) = std::sync::mpsc::channel();
        let mut n = 0;
        let handle = spawn_thread(
            Duration::from_millis(1),
            &Realtime::default(),
            move |wake| {
                n += 1;
                let _ = tx.send(wake);
                n < 20
            },
        )
        .unwrap();
        handle.join().unwrap();
        let wakes: Vec<Wake> = rx.iter().collect();
        assert_eq!(wakes.len(), 20);
    }

    #[test]
    fn a_setting_that_cannot_apply_is_an_error_not_a_fallback() {
        // CPU 100000 does not exist on any machine this runs on.
        let err = spawn_thread(
            Duration::from_millis(1),
            &Realtime {
                cpus: Some(vec![100_000]),
                ..Realtime::default()
            },
            |_| false,
        )
        .unwrap_err();
        assert!(matches!(err, TimerError::Affinity { .. }), "{err}");
    }
}
