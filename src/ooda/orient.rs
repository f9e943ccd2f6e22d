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
    fn no_limits_no_alarm() {
        assert_eq!(
            next_level(&AlarmLimits::default(), AlarmLevel::Ok, 1e9),
            AlarmLevel::Ok
        );
    }
}
