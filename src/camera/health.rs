//! A camera's health as plain data: what its source reported (link up or
//! down, frames, rejections) and what that means at a given instant
//! ([`CameraState::view`]). No I/O, no clock: every method takes `now`.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use serde::Serialize;

/// How a camera is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Health {
    /// Connected (or starting), no frame yet.
    Starting,
    /// A frame within `stale_after_ms`.
    Ok,
    /// Connected, but the last frame is older than `stale_after_ms`.
    Stale,
    /// The source cannot be reached; rozd reconnects with backoff.
    Disconnected,
    /// The source answers, but with what is not a usable frame (garbage,
    /// a truncated or oversized JPEG, the wrong content type).
    Error,
}

impl Health {
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Starting => "starting",
            Health::Ok => "ok",
            Health::Stale => "stale",
            Health::Disconnected => "disconnected",
            Health::Error => "error",
        }
    }
}

/// Why a frame was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Rejection {
    /// Not a JPEG, or a stream that does not parse.
    Garbage,
    /// A JPEG without its end (a cut-off frame).
    Truncated,
    /// Larger than `max_frame_kb`.
    Oversized,
    /// A content type that is neither a JPEG nor a multipart stream.
    WrongType,
}

impl Rejection {
    pub const ALL: [Rejection; 4] = [
        Rejection::Garbage,
        Rejection::Truncated,
        Rejection::Oversized,
        Rejection::WrongType,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Rejection::Garbage => "garbage",
            Rejection::Truncated => "truncated",
            Rejection::Oversized => "oversized",
            Rejection::WrongType => "wrong_type",
        }
    }
}

/// Rejected frames by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Rejected {
    pub garbage: u64,
    pub truncated: u64,
    pub oversized: u64,
    pub wrong_type: u64,
}

impl Rejected {
    pub fn get(&self, why: Rejection) -> u64 {
        match why {
            Rejection::Garbage => self.garbage,
            Rejection::Truncated => self.truncated,
            Rejection::Oversized => self.oversized,
            Rejection::WrongType => self.wrong_type,
        }
    }

    fn count(&mut self, why: Rejection) {
        let n = match why {
            Rejection::Garbage => &mut self.garbage,
            Rejection::Truncated => &mut self.truncated,
            Rejection::Oversized => &mut self.oversized,
            Rejection::WrongType => &mut self.wrong_type,
        };
        *n += 1;
    }
}

/// Frame times kept for the measured rate.
const RATE_WINDOW: usize = 32;

/// What a camera's source reported so far.
#[derive(Debug, Clone)]
pub(crate) struct CameraState {
    stale_after: Duration,
    link_up: bool,
    /// When the link last came up (or the camera started).
    since: Instant,
    frames: u64,
    last_frame: Option<FrameInfo>,
    recent: VecDeque<Instant>,
    last_rejection: Option<Instant>,
    rejected: Rejected,
    reconnects: u64,
    last_error: Option<String>,
}

/// The size of a frame and when it was captured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrameInfo {
    pub width: u32,
    pub height: u32,
    pub bytes: usize,
    pub at: Instant,
}

/// A camera's health at one instant, as `/v1/cameras`, `/v1/status` and
/// the Observation show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HealthView {
    pub health: Health,
    /// Frames per second over the last frames (0 when stale).
    pub fps: f64,
    pub frames: u64,
    pub width: Option<u32>,
    pub height: Option<u32>,
    pub frame_bytes: Option<usize>,
    /// Age of the latest frame.
    pub age_ms: Option<u64>,
    pub rejected: Rejected,
    pub reconnects: u64,
    pub last_error: Option<String>,
}

impl CameraState {
    pub(crate) fn new(stale_after: Duration, now: Instant) -> CameraState {
        CameraState {
            stale_after,
            link_up: true,
            since: now,
            frames: 0,
            last_frame: None,
            recent: VecDeque::with_capacity(RATE_WINDOW),
            last_rejection: None,
            rejected: Rejected::default(),
            reconnects: 0,
            last_error: None,
        }
    }

    /// The source is connected again.
    pub(crate) fn link_up(&mut self, now: Instant) {
        if !self.link_up {
            self.link_up = true;
            self.since = now;
        }
    }

    /// The source cannot be reached (or went away); `why` for the status.
    pub(crate) fn link_down(&mut self, why: String) {
        if self.link_up {
            self.reconnects += 1;
        }
        self.link_up = false;
        self.recent.clear();
        self.last_error = Some(why);
    }

    /// A good frame arrived.
    pub(crate) fn frame(&mut self, info: FrameInfo) {
        self.link_up(info.at);
        self.frames += 1;
        if self.recent.len() == RATE_WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back(info.at);
        self.last_frame = Some(info);
    }

    /// A frame was refused.
    pub(crate) fn rejected(&mut self, why: Rejection, message: String, now: Instant) {
        self.rejected.count(why);
        self.last_rejection = Some(now);
        self.last_error = Some(message);
    }

    #[cfg(test)]
    pub(crate) fn rejections(&self) -> Rejected {
        self.rejected
    }

    /// The health at `now`.
    pub(crate) fn health(&self, now: Instant) -> Health {
        if !self.link_up {
            return Health::Disconnected;
        }
        let fresh = |at: Instant| now.saturating_duration_since(at) <= self.stale_after;
        let last_good = self.last_frame.map(|f| f.at);
        match (last_good, self.last_rejection) {
            (Some(good), _) if fresh(good) => Health::Ok,
            // What came last, and recently, was refused.
            (good, Some(bad)) if fresh(bad) && good.is_none_or(|g| bad >= g) => Health::Error,
            (Some(_), _) => Health::Stale,
            (None, _) if fresh(self.since) => Health::Starting,
            (None, _) => Health::Stale,
        }
    }

    /// Frames per second over the recent frames, 0 when not `ok`.
    pub(crate) fn fps(&self, now: Instant) -> f64 {
        if self.health(now) != Health::Ok || self.recent.len() < 2 {
            return 0.0;
        }
        let (Some(first), Some(last)) = (self.recent.front(), self.recent.back()) else {
            return 0.0;
        };
        let span = last.saturating_duration_since(*first).as_secs_f64();
        if span <= 0.0 {
            return 0.0;
        }
        let fps = (self.recent.len() - 1) as f64 / span;
        (fps * 10.0).round() / 10.0
    }

    pub(crate) fn view(&self, now: Instant) -> HealthView {
        let f = self.last_frame;
        HealthView {
            health: self.health(now),
            fps: self.fps(now),
            frames: self.frames,
            width: f.map(|f| f.width),
            height: f.map(|f| f.height),
            frame_bytes: f.map(|f| f.bytes),
            age_ms: f.map(|f| {
                u64::try_from(now.saturating_duration_since(f.at).as_millis()).unwrap_or(u64::MAX)
            }),
            rejected: self.rejected,
            reconnects: self.reconnects,
            last_error: self.last_error.clone(),
        }
    }
}

/// The wait before the next attempt to reach a source: doubling from
/// `min` to `max` with every failure, back to `min` after a success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub(crate) fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max,
            next: min,
        }
    }

    /// The wait after a failure; the following one is twice as long.
    pub(crate) fn failed(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(self.max);
        wait
    }

    pub(crate) fn succeeded(&mut self) {
        self.next = self.min;
    }
}

/// Whether a frame is due for an observer that takes at most one every
/// `every` (the recording's `camera_hz`, a stream's `max_stream_fps`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Throttle {
    last: Option<Instant>,
}

impl Throttle {
    /// `true` (and remembered) when at least `every` passed since the last
    /// frame taken.
    pub(crate) fn take(&mut self, every: Duration, now: Instant) -> bool {
        if self
            .last
            .is_some_and(|last| now.saturating_duration_since(last) < every)
        {
            return false;
        }
        self.last = Some(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STALE: Duration = Duration::from_millis(2000);

    fn frame(at: Instant) -> FrameInfo {
        FrameInfo {
            width: 640,
            height: 480,
            bytes: 30_000,
            at,
        }
    }

    #[test]
    fn health_follows_frames_link_and_rejections() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut s = CameraState::new(STALE, t0);
        assert_eq!(s.health(t0), Health::Starting);
        assert_eq!(s.health(ms(2001)), Health::Stale, "nothing for too long");
        for i in 0..11 {
            s.frame(frame(ms(100 * i)));
        }
        assert_eq!(s.health(ms(1000)), Health::Ok);
        assert_eq!(s.fps(ms(1000)), 10.0);
        let v = s.view(ms(1500));
        assert_eq!((v.frames, v.width, v.age_ms), (11, Some(640), Some(500)));
        assert_eq!(s.health(ms(3001)), Health::Stale);
        assert_eq!(s.fps(ms(3001)), 0.0, "no rate while stale");

        s.link_down("connection refused".into());
        assert_eq!(s.health(ms(3001)), Health::Disconnected);
        assert_eq!(s.view(ms(3001)).reconnects, 1);
        s.link_down("connection refused".into());
        assert_eq!(s.view(ms(3001)).reconnects, 1, "one outage, one count");
        s.link_up(ms(4000));
        assert_eq!(s.health(ms(4000)), Health::Stale, "up, old frame");
        s.rejected(Rejection::Garbage, "not a JPEG".into(), ms(4100));
        assert_eq!(s.health(ms(4100)), Health::Error);
        assert_eq!(s.rejections().garbage, 1);
        s.frame(frame(ms(4200)));
        assert_eq!(s.health(ms(4200)), Health::Ok, "a good frame heals");
        s.rejected(Rejection::Oversized, "too big".into(), ms(4300));
        assert_eq!(
            s.health(ms(4300)),
            Health::Ok,
            "a fresh good frame outweighs one bad one"
        );
        assert_eq!(
            s.health(ms(6250)),
            Health::Error,
            "only the rejection is fresh"
        );
        assert_eq!(s.health(ms(6400)), Health::Stale);
        assert_eq!(s.view(ms(6400)).last_error.as_deref(), Some("too big"));
    }

    #[test]
    fn backoff_doubles_to_its_bound_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(250), Duration::from_secs(2));
        let waits: Vec<u128> = (0..5).map(|_| b.failed().as_millis()).collect();
        assert_eq!(waits, [250, 500, 1000, 2000, 2000]);
        b.succeeded();
        assert_eq!(b.failed(), Duration::from_millis(250));
    }

    #[test]
    fn a_throttle_takes_one_frame_per_period() {
        let t0 = Instant::now();
        let every = Duration::from_millis(1000);
        let mut t = Throttle::default();
        let taken: Vec<bool> = [0, 400, 999, 1000, 1500, 2100]
            .iter()
            .map(|&ms| t.take(every, t0 + Duration::from_millis(ms)))
            .collect();
        assert_eq!(taken, [true, false, false, true, false, true]);
    }
}
