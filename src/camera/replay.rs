//! A recording's camera frames as a camera: played at their recorded
//! times (scaled by `[replay].speed`), once or looping like replayed
//! sensors, with the same time 0 (the recording's first message) and the
//! same length, so a camera and sensors replayed from one file stay in
//! step. The frames were read at config load; the thread only waits
//! and hands each one to the camera. When the recording ends (not looped)
//! the camera is `disconnected`, saying so.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::Camera;
use super::config::Source;

pub(super) fn run(camera: Arc<Camera>, shutdown: CancellationToken) {
    let Source::Replay {
        file,
        frames,
        span,
        speed,
        looped,
        ..
    } = camera.spec.source.clone()
    else {
        return;
    };
    let times: Vec<Duration> = frames.iter().map(|(at, _)| *at).collect();
    let mut playback = Playback::new(times, span, speed, looped, Instant::now());
    while !shutdown.is_cancelled() {
        match playback.step(Instant::now()) {
            Step::Show(i) => {
                if let Some((_, jpeg)) = frames.get(i) {
                    camera.offer(jpeg.clone(), Instant::now());
                }
            }
            Step::Wait(until) => sleep_until(until, &shutdown),
            Step::Ended => {
                camera.link_down(format!(
                    "the recording {} has ended (set [replay] loop = true to play it again)",
                    file.display()
                ));
                while !shutdown.is_cancelled() {
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }
}

/// Sleeps until `until`, in steps short enough to notice the shutdown.
fn sleep_until(until: Instant, shutdown: &CancellationToken) {
    while !shutdown.is_cancelled() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
}

/// What the replay does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Show this frame now.
    Show(usize),
    /// Nothing is due before then.
    Wait(Instant),
    /// The recording has ended and does not loop.
    Ended,
}

/// Which recorded frame is due when: plain data, `now` passed in. A frame
/// overdue when a later one is also due is skipped (a camera keeps only
/// its latest frame anyway).
#[derive(Debug, Clone)]
pub(crate) struct Playback {
    /// Each frame's time since the recording's start, in order; never empty.
    times: Vec<Duration>,
    /// The recording's length: a looped pass takes this long (at speed 1).
    span: Duration,
    speed: f64,
    looped: bool,
    /// When the current pass's first frame was (or is) due.
    started: Instant,
    next: usize,
}

impl Playback {
    /// `speed` > 0 (validated in `[replay]`).
    pub(crate) fn new(
        times: Vec<Duration>,
        span: Duration,
        speed: f64,
        looped: bool,
        now: Instant,
    ) -> Playback {
        let times = if times.is_empty() {
            vec![Duration::ZERO]
        } else {
            times
        };
        Playback {
            times,
            span,
            speed,
            looped,
            started: now,
            next: 0,
        }
    }

    fn due(&self, index: usize) -> Instant {
        self.started + self.times[index].div_f64(self.speed)
    }

    /// One pass at this speed: the recording's length (never shorter than
    /// its frames, never zero).
    fn pass(&self) -> Duration {
        let last = self.times[self.times.len() - 1];
        self.span
            .max(last)
            .max(Duration::from_millis(1))
            .div_f64(self.speed)
    }

    pub(crate) fn step(&mut self, now: Instant) -> Step {
        if self.next >= self.times.len() {
            if !self.looped {
                return Step::Ended;
            }
            self.started += self.pass();
            // A whole pass already in the past (the thread was held up):
            // start again from now rather than racing through it.
            if self.started + self.pass() <= now {
                self.started = now;
            }
            self.next = 0;
        }
        let due = self.due(self.next);
        if due > now {
            return Step::Wait(due);
        }
        let mut show = self.next;
        while show + 1 < self.times.len() && self.due(show + 1) <= now {
            show += 1;
        }
        self.next = show + 1;
        Step::Show(show)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn frames_come_at_their_recorded_times_scaled_by_speed() {
        let t0 = Instant::now();
        let mut p = Playback::new(vec![ms(0), ms(100), ms(300)], ms(300), 2.0, false, t0);
        assert_eq!(p.step(t0), Step::Show(0));
        assert_eq!(p.step(t0), Step::Wait(t0 + ms(50)));
        assert_eq!(p.step(t0 + ms(50)), Step::Show(1));
        assert_eq!(p.step(t0 + ms(60)), Step::Wait(t0 + ms(150)));
        assert_eq!(p.step(t0 + ms(150)), Step::Show(2));
        assert_eq!(p.step(t0 + ms(10_000)), Step::Ended);
        assert_eq!(p.step(t0 + ms(20_000)), Step::Ended);
    }

    #[test]
    fn a_late_step_shows_the_latest_due_frame_and_skips_the_others() {
        let t0 = Instant::now();
        let mut p = Playback::new(
            vec![ms(0), ms(100), ms(200), ms(300)],
            ms(300),
            1.0,
            false,
            t0,
        );
        assert_eq!(p.step(t0 + ms(250)), Step::Show(2));
        assert_eq!(p.step(t0 + ms(250)), Step::Wait(t0 + ms(300)));
    }

    #[test]
    fn a_looped_replay_starts_over_where_the_recording_ended() {
        // Frames from 50 ms into a recording 300 ms long (other channels
        // before and after): each pass takes 300 ms, as replayed sensors'.
        let t0 = Instant::now();
        let mut p = Playback::new(vec![ms(50), ms(150), ms(250)], ms(300), 1.0, true, t0);
        assert_eq!(p.step(t0), Step::Wait(t0 + ms(50)));
        assert_eq!(p.step(t0 + ms(50)), Step::Show(0));
        assert_eq!(p.step(t0 + ms(150)), Step::Show(1));
        assert_eq!(p.step(t0 + ms(250)), Step::Show(2));
        assert_eq!(p.step(t0 + ms(250)), Step::Wait(t0 + ms(350)));
        assert_eq!(p.step(t0 + ms(350)), Step::Show(0));
        assert_eq!(p.step(t0 + ms(350)), Step::Wait(t0 + ms(450)));
    }

    #[test]
    fn a_looped_replay_held_up_for_whole_passes_starts_again_from_now() {
        let t0 = Instant::now();
        let mut p = Playback::new(vec![ms(0), ms(100)], ms(100), 1.0, true, t0);
        assert_eq!(p.step(t0), Step::Show(0));
        assert_eq!(p.step(t0 + ms(100)), Step::Show(1));
        let later = t0 + ms(3_600_000);
        assert_eq!(p.step(later), Step::Show(0));
        assert_eq!(p.step(later), Step::Wait(later + ms(100)));
    }

    #[test]
    fn a_recording_of_one_instant_loops_without_spinning() {
        let t0 = Instant::now();
        let mut p = Playback::new(vec![ms(0)], ms(0), 1.0, true, t0);
        assert_eq!(p.step(t0), Step::Show(0));
        assert_eq!(p.step(t0), Step::Wait(t0 + ms(1)));
        assert_eq!(p.step(t0 + ms(1)), Step::Show(0));
    }
}
