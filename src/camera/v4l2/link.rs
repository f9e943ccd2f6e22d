//! A V4L2 camera's link as plain data: whether its device is open, when to
//! try opening it again (backoff, [`Backoff`], 250 ms doubling to 5 s), and
//! when an open device has been silent so long that it is closed and
//! opened again (a driver that stopped delivering without an error). No
//! I/O, no clock: every method takes `now`.

use std::time::{Duration, Instant};

use crate::camera::health::Backoff;

/// Bounds of the wait between attempts to open the device.
pub(super) const BACKOFF_MIN: Duration = Duration::from_millis(250);
pub(super) const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Longest single wait for a frame, so that silence is noticed in time.
pub(super) const MAX_READ_WAIT: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No device open; the next attempt at `retry_at`.
    Closed { retry_at: Instant },
    /// The device is open; it last delivered (or was opened) at `heard`.
    Open { heard: Instant },
}

/// What the camera's task does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Step {
    /// Open the device (now).
    Open,
    /// Wait this long, then ask again.
    Wait(Duration),
    /// Wait for the next frame, at most this long.
    Read(Duration),
    /// Close the open device (it went silent, saying why) and ask again.
    Reopen(String),
}

/// The link of one camera.
#[derive(Debug, Clone)]
pub(super) struct Link {
    backoff: Backoff,
    silent_after: Duration,
    state: State,
}

impl Link {
    /// A link that opens its device at once; an open device with no frame
    /// for `silent_after` is reopened.
    pub(super) fn new(silent_after: Duration, now: Instant) -> Link {
        Link {
            backoff: Backoff::new(BACKOFF_MIN, BACKOFF_MAX),
            silent_after,
            state: State::Closed { retry_at: now },
        }
    }

    /// How long an open device may be silent before it is reopened, for a
    /// camera that is `stale` after `stale_after`: twice that (as network
    /// cameras), and at least a second (cameras take a moment to start).
    pub(super) fn silent_after(stale_after: Duration) -> Duration {
        (stale_after * 2).max(Duration::from_secs(1))
    }

    /// What to do at `now`.
    pub(super) fn step(&self, now: Instant) -> Step {
        match self.state {
            State::Closed { retry_at } if now >= retry_at => Step::Open,
            State::Closed { retry_at } => Step::Wait(retry_at - now),
            State::Open { heard } => {
                let silent = now.saturating_duration_since(heard);
                if silent >= self.silent_after {
                    Step::Reopen(format!(
                        "no frame from the device for {} ms; closing and opening it again",
                        silent.as_millis()
                    ))
                } else {
                    Step::Read((self.silent_after - silent).min(MAX_READ_WAIT))
                }
            }
        }
    }

    /// The device was opened.
    pub(super) fn opened(&mut self, now: Instant) {
        self.state = State::Open { heard: now };
    }

    /// The device delivered a frame (usable or not): it is alive, and the
    /// next outage starts its backoff from the shortest wait.
    pub(super) fn heard(&mut self, now: Instant) {
        self.state = State::Open { heard: now };
        self.backoff.succeeded();
    }

    /// Opening failed, the open device failed, or it was closed for its
    /// silence: closed until the returned wait has passed.
    pub(super) fn failed(&mut self, now: Instant) -> Duration {
        let wait = self.backoff.failed();
        self.state = State::Closed {
            retry_at: now + wait,
        };
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SILENT: Duration = Duration::from_secs(4);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn opening_fails_with_a_doubling_backoff_up_to_five_seconds() {
        let t0 = Instant::now();
        let mut link = Link::new(SILENT, t0);
        assert_eq!(link.step(t0), Step::Open, "the first attempt is at once");
        let mut now = t0;
        let mut waits = Vec::new();
        for _ in 0..8 {
            let wait = link.failed(now);
            waits.push(wait.as_millis());
            assert_eq!(link.step(now), Step::Wait(wait));
            assert_eq!(link.step(now + wait - ms(1)), Step::Wait(ms(1)));
            now += wait;
            assert_eq!(link.step(now), Step::Open);
        }
        assert_eq!(waits, [250, 500, 1000, 2000, 4000, 5000, 5000, 5000]);
        // Opening alone does not reset the backoff (a device that opens
        // and fails at once is not retried at full speed) ...
        link.opened(now);
        assert_eq!(link.failed(now), ms(5000));
        // ... a frame does.
        link.opened(now);
        link.heard(now + ms(10));
        assert_eq!(link.failed(now + ms(20)), ms(250));
    }

    #[test]
    fn a_silent_device_is_reopened() {
        let t0 = Instant::now();
        let mut link = Link::new(SILENT, t0);
        link.opened(t0);
        assert_eq!(link.step(t0), Step::Read(MAX_READ_WAIT));
        assert_eq!(
            link.step(t0 + ms(3800)),
            Step::Read(ms(200)),
            "no wait beyond the silence bound"
        );
        link.heard(t0 + ms(3900));
        assert_eq!(
            link.step(t0 + ms(7000)),
            Step::Read(ms(500)),
            "a frame resets it"
        );
        let Step::Reopen(why) = link.step(t0 + ms(7900)) else {
            panic!("a device silent for 4 s is reopened");
        };
        assert!(
            why.contains("no frame from the device for 4000 ms"),
            "{why}"
        );
        let wait = link.failed(t0 + ms(7900));
        assert_eq!(wait, ms(250));
        assert_eq!(link.step(t0 + ms(8150)), Step::Open);
    }

    #[test]
    fn the_silence_bound_follows_staleness() {
        assert_eq!(Link::silent_after(ms(2000)), ms(4000));
        assert_eq!(Link::silent_after(ms(100)), ms(1000), "at least a second");
    }
}
