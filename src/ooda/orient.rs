//! Orient: alarm levels from limits (with hysteresis), as plain functions.

use serde::Serialize;

use crate::hw::config::AlarmLimits;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum AlarmLevel {
    #[default]
    Ok,
    Warn,
    Critical,
}

impl AlarmLevel {
    pub fn as_number(self) -> f64 {
        match self {
            AlarmLevel::Ok => 0.0,
            AlarmLevel::Warn => 1.0,
            AlarmLevel::Critical => 2.0,
        }
    }
}

/// The limit a value crossed to reach its alarm level, and that limit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CrossedLimit {
    /// `warn_min`, `warn_max`, `critical_min` or `critical_max`.
    pub limit: &'static str,
    pub value: f64,
}

/// An alarm level above `ok`: since when, and which limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AlarmMark {
    pub since_unix_ms: i64,
    pub limit: Option<CrossedLimit>,
}

/// Which limit of `level` `value` is beyond (or, within the hysteresis on
/// its way back, still counts as beyond); `None` at `ok`. When a narrow band
/// puts the value near both, the one it is beyond, else the nearer.
pub fn crossed(limits: &AlarmLimits, level: AlarmLevel, value: f64) -> Option<CrossedLimit> {
    let (min, max) = match level {
        AlarmLevel::Ok => return None,
        AlarmLevel::Warn => (
            limits.warn_min.map(|v| ("warn_min", v)),
            limits.warn_max.map(|v| ("warn_max", v)),
        ),
        AlarmLevel::Critical => (
            limits.critical_min.map(|v| ("critical_min", v)),
            limits.critical_max.map(|v| ("critical_max", v)),
        ),
    };
    let margin = limits.hysteresis;
    let below = min.filter(|(_, l)| value < l + margin);
    let above = max.filter(|(_, l)| value > l - margin);
    let (limit, value) = match (below, above) {
        (Some(b), Some(a)) => {
            if value < b.1 || (value <= a.1 && (value - b.1).abs() <= (a.1 - value).abs()) {
                b
            } else {
                a
            }
        }
        (b, a) => b.or(a)?,
    };
    Some(CrossedLimit { limit, value })
}

/// The level `value` is at against `limits`, each limit moved inwards by `margin`.
fn level_at(limits: &AlarmLimits, value: f64, margin: f64) -> AlarmLevel {
    let below = |limit: Option<f64>| limit.is_some_and(|l| value < l + margin);
    let above = |limit: Option<f64>| limit.is_some_and(|l| value > l - margin);
    if below(limits.critical_min) || above(limits.critical_max) {
        AlarmLevel::Critical
    } else if below(limits.warn_min) || above(limits.warn_max) {
        AlarmLevel::Warn
    } else {
        AlarmLevel::Ok
    }
}

/// The next alarm level: it rises as soon as a limit is crossed, and falls
/// only once the value is back inside by the hysteresis, so a value
/// hovering at a limit does not flap.
pub fn next_level(limits: &AlarmLimits, previous: AlarmLevel, value: f64) -> AlarmLevel {
    let raw = level_at(limits, value, 0.0);
    if raw >= previous {
        return raw;
    }
    let with_margin = level_at(limits, value, limits.hysteresis);
    raw.max(previous.min(with_margin))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> AlarmLimits {
        AlarmLimits {
            warn_min: Some(0.5),
            warn_max: Some(70.0),
            critical_min: Some(0.3),
            critical_max: Some(85.0),
            hysteresis: 2.0,
        }
    }

    #[test]
    fn rises_immediately_and_falls_with_hysteresis() {
        let l = limits();
        assert_eq!(next_level(&l, AlarmLevel::Ok, 50.0), AlarmLevel::Ok);
        assert_eq!(next_level(&l, AlarmLevel::Ok, 71.0), AlarmLevel::Warn);
        assert_eq!(next_level(&l, AlarmLevel::Warn, 86.0), AlarmLevel::Critical);
        // Back under 85 but not by 2: still critical.
        assert_eq!(
            next_level(&l, AlarmLevel::Critical, 84.0),
            AlarmLevel::Critical
        );
        assert_eq!(next_level(&l, AlarmLevel::Critical, 82.9), AlarmLevel::Warn);
        assert_eq!(next_level(&l, AlarmLevel::Warn, 69.0), AlarmLevel::Warn);
        assert_eq!(next_level(&l, AlarmLevel::Warn, 67.9), AlarmLevel::Ok);
        // Low side.
        assert_eq!(next_level(&l, AlarmLevel::Ok, 0.2), AlarmLevel::Critical);
    }

    #[test]
    fn the_limit_crossed_is_named_on_its_side_and_kept_through_the_hysteresis() {
        let l = limits();
        let named = |level, value| crossed(&l, level, value).map(|c| (c.limit, c.value));
        assert_eq!(named(AlarmLevel::Ok, 50.0), None);
        assert_eq!(
            named(AlarmLevel::Critical, 0.2),
            Some(("critical_min", 0.3))
        );
        assert_eq!(
            named(AlarmLevel::Critical, 86.0),
            Some(("critical_max", 85.0))
        );
        // Back inside by less than the hysteresis: still the same limit.
        assert_eq!(
            named(AlarmLevel::Critical, 84.0),
            Some(("critical_max", 85.0))
        );
        assert_eq!(named(AlarmLevel::Warn, 71.0), Some(("warn_max", 70.0)));
        assert_eq!(named(AlarmLevel::Warn, 0.4), Some(("warn_min", 0.5)));
        // A band narrower than the hysteresis: the side the value is beyond.
        let narrow = AlarmLimits {
            critical_min: Some(1.0),
            critical_max: Some(2.0),
            hysteresis: 5.0,
            ..AlarmLimits::default()
        };
        let side = |value| crossed(&narrow, AlarmLevel::Critical, value).map(|c| c.limit);
        assert_eq!(side(0.5), Some("critical_min"));
        assert_eq!(side(2.5), Some("critical_max"));
        assert_eq!(side(1.9), Some("critical_max"), "nearer");
    }

    #[test]
    fn no_limits_no_alarm() {
        assert_eq!(
            next_level(&AlarmLimits::default(), AlarmLevel::Ok, 1e9),
            AlarmLevel::Ok
        );
    }
}
