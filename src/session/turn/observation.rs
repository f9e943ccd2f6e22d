//! The Observation as the model reads it in `ooda_re_act` mode: one line
//! per sensor and actuator, the protective stop's causes, and the alarms
//! that appeared since the previous cycle.

use std::fmt::Write as _;

use super::Turn;
use crate::ooda::orient::AlarmLevel;
use crate::ooda::{Observation, Ooda};

impl Turn {
    /// The Observation as compact text for the model, with alarms that
    /// appeared since the previous cycle called out.
    pub(super) fn describe_observation(&mut self, ooda: &Ooda) -> String {
        // Sensors and actuators as they are now (alarm levels as of the last
        // tick), not as last published: the model sees its own last command.
        let obs = ooda.observe_now_brief();
        let (text, alarms) = describe(&obs, &self.seen_alarms, self.cycle > 1);
        self.seen_alarms = alarms;
        text
    }
}

/// The text of `obs`, and the alarms it shows. Alarms not in `seen` (or
/// higher than seen) are called out when `call_out_new`. Written into one
/// string: this runs before every model call.
fn describe(
    obs: &Observation,
    seen: &[(String, AlarmLevel)],
    call_out_new: bool,
) -> (String, Vec<(String, AlarmLevel)>) {
    let mut text = String::with_capacity(64 * (1 + obs.sensors.len() + obs.actuators.len()));
    // Writing to a String cannot fail: the results below are ignored.
    let _ = write!(text, "Current observation #{} (protective stop: ", obs.seq);
    if obs.protective_stop_causes.is_empty() {
        text.push_str("none):");
    } else {
        let causes = crate::safety::StopState {
            causes: obs.protective_stop_causes.clone(),
        };
        let _ = write!(text, "ACTIVE, {}):", causes.describe());
    }
    // Names and numbers are pushed, not formatted: `write!` was most of
    // the text's cost, and this runs before every model call.
    let mut alarms = Vec::new();
    for s in &obs.sensors {
        let v = &s.sensor;
        text.push_str("\n- sensor ");
        text.push_str(&v.name);
        text.push_str(" = ");
        match v.value {
            Some(x) => push_fixed4(&mut text, x),
            None => text.push_str("no value"),
        }
        text.push(' ');
        text.push_str(v.unit.as_deref().unwrap_or(""));
        text.push_str(" (");
        text.push_str(v.health.as_str());
        if let Some(age) = v.age_ms {
            text.push_str(", age ");
            text.push_str(itoa::Buffer::new().format(age));
            text.push_str(" ms");
        }
        if s.alarm != AlarmLevel::Ok {
            let at = text.len();
            let _ = write!(text, ", ALARM {:?}", s.alarm);
            text[at..].make_ascii_uppercase();
            alarms.push((v.name.clone(), s.alarm));
        }
        text.push(')');
    }
    for a in &obs.actuators {
        text.push_str("\n- actuator ");
        text.push_str(&a.name);
        let _ = write!(text, " = {}", a.value);
        if a.at_safe_value {
            text.push_str(" (safe)");
        } else if let Some(why) = &a.safe_unconfirmed {
            // Driven safe, but the device never said so: it may still run.
            text.push_str(" (safe value NOT confirmed by the device: ");
            text.push_str(why);
            text.push(')');
        }
        if let Some(owner) = a.owner.as_deref() {
            text.push_str(", held by ");
            text.push_str(owner);
        }
        if let Some(f) = &a.feedback {
            // What was measured: only `confirmed` means the hardware did it.
            text.push_str(", feedback ");
            text.push_str(f.feedback_status.map_or("none yet", |s| s.as_str()));
            text.push_str(" (");
            text.push_str(&f.feedback_sensor);
            text.push_str(" = ");
            match f.measured {
                Some(m) => push_fixed4(&mut text, m),
                None => text.push_str("no value"),
            }
            text.push(')');
            if f.mismatch {
                text.push_str(", MISMATCH ALARM");
            }
        }
    }
    let new: Vec<String> = alarms
        .iter()
        .filter(|(n, l)| !seen.iter().any(|(sn, sl)| sn == n && sl >= l))
        .map(|(n, l)| format!("{n} {l:?}").to_lowercase())
        .collect();
    if call_out_new && !new.is_empty() {
        let _ = write!(
            text,
            "\nNEW ALARMS since the last cycle: {}",
            new.join(", ")
        );
    }
    (text, alarms)
}

/// Appends `x` as `format!("{x:.4}")` does, without the exact float
/// formatter where the result is sure to be the same (most of the text's
/// cost was that formatter). Below 10^9 ten-thousandths, `x * 10^4` is off
/// from the exact product by less than 10^-7, so unless that product is
/// within 10^-6 of a tie its nearest integer is the exact one's; ties,
/// large values, NaN and infinities go to the formatter.
fn push_fixed4(text: &mut String, x: f64) {
    let scaled = (x * 10_000.0).abs();
    if scaled < 1e9 && (scaled.fract() - 0.5).abs() > 1e-6 {
        // In range: the cast is exact, and the sign stays (`-0.0000`).
        let units = scaled.round() as u64;
        if x.is_sign_negative() {
            text.push('-');
        }
        text.push_str(itoa::Buffer::new().format(units / 10_000));
        text.push('.');
        // The fraction is 0-9999; 10_000 + it has five digits, the first 1.
        let mut digits = itoa::Buffer::new();
        let fraction = digits.format(10_000 + units % 10_000);
        text.push_str(&fraction[1..]);
    } else {
        let _ = write!(text, "{x:.4}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::HealthKind;
    use crate::ooda::SensorObservation;
    use crate::ooda::act::ActuatorView;
    use crate::ooda::world::SensorView;
    use crate::safety::StopInfo;

    fn sensor(name: &str, value: Option<f64>, alarm: AlarmLevel) -> SensorObservation {
        SensorObservation {
            sensor: SensorView {
                name: name.into(),
                unit: value.map(|_| "m".into()),
                value,
                age_ms: value.map(|_| 12),
                health: if value.is_some() {
                    HealthKind::Ok
                } else {
                    HealthKind::Stale
                },
                error: None,
            },
            alarm,
            alarm_since_unix_ms: None,
            alarm_limit: None,
        }
    }

    fn actuator(name: &str, value: f64, owner: Option<&str>) -> ActuatorView {
        ActuatorView {
            name: name.into(),
            unit: None,
            value,
            safe_value: 0.0,
            at_safe_value: value == 0.0,
            safe_unconfirmed: None,
            owner: owner.map(str::to_string),
            since_ms: 0,
            hold_remaining_ms: None,
            feedback: None,
        }
    }

    fn observation() -> Observation {
        Observation {
            seq: 7,
            at_unix_ms: 0,
            protective_stop: None,
            protective_stop_causes: Vec::new(),
            sensors: vec![
                sensor("distance", Some(1.25), AlarmLevel::Ok),
                sensor("temp", Some(81.123456), AlarmLevel::Warn),
                sensor("bump", None, AlarmLevel::Ok),
            ],
            actuators: vec![
                actuator("speed", 0.5, Some("session s1")),
                actuator("valve", 0.0, None),
            ],
            sources: Vec::new(),
            sim: None,
        }
    }

    fn fixed4(x: f64) -> String {
        let mut text = String::new();
        push_fixed4(&mut text, x);
        text
    }

    #[test]
    fn four_decimals_as_the_formatter_writes_them() {
        for x in [
            0.0,
            -0.0,
            1.25,
            -1.25,
            81.123456,
            0.03125,
            -0.03125,
            0.00005,
            -0.00001,
            0.99995,
            9.99995,
            12345.6789,
            99_999.999_95,
            1e5,
            1e9,
            -1e12,
            1e300,
            f64::MIN_POSITIVE,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ] {
            assert_eq!(fixed4(x), format!("{x:.4}"), "{x:e}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_value_has_the_formatters_four_decimals(
            x in proptest::num::f64::ANY,
            small in -2e5f64..2e5,
            ties in -2_000_000i64..2_000_000,
        ) {
            proptest::prop_assert_eq!(fixed4(x), format!("{x:.4}"));
            proptest::prop_assert_eq!(fixed4(small), format!("{small:.4}"));
            // Values at and next to a tie of the fifth decimal.
            let tie = (ties as f64 + 0.5) / 10_000.0;
            for y in [tie, tie.next_up(), tie.next_down()] {
                proptest::prop_assert_eq!(fixed4(y), format!("{y:.4}"));
            }
        }
    }

    #[test]
    fn every_sensor_and_actuator_is_one_line() {
        let (text, alarms) = describe(&observation(), &[], false);
        assert_eq!(
            text,
            "Current observation #7 (protective stop: none):\n\
             - sensor distance = 1.2500 m (ok, age 12 ms)\n\
             - sensor temp = 81.1235 m (ok, age 12 ms, ALARM WARN)\n\
             - sensor bump = no value  (stale)\n\
             - actuator speed = 0.5, held by session s1\n\
             - actuator valve = 0 (safe)"
        );
        assert_eq!(alarms, [("temp".to_string(), AlarmLevel::Warn)]);
    }

    #[test]
    fn an_actuator_with_feedback_shows_its_verdict_and_its_alarm() {
        let mut obs = observation();
        obs.actuators[0].feedback = Some(crate::ooda::act::ActuatorFeedback {
            feedback_sensor: "wheel_speed".into(),
            feedback_status: Some(crate::ooda::feedback::FeedbackStatus::Mismatch),
            measured: Some(0.0),
            expected: Some(0.5),
            mismatch: true,
        });
        let (text, _) = describe(&obs, &[], false);
        assert!(
            text.contains(
                "- actuator speed = 0.5, held by session s1, feedback mismatch \
                 (wheel_speed = 0.0000), MISMATCH ALARM\n"
            ),
            "{text}"
        );
        obs.actuators[0].feedback = Some(crate::ooda::act::ActuatorFeedback {
            feedback_sensor: "wheel_speed".into(),
            feedback_status: None,
            measured: None,
            expected: None,
            mismatch: false,
        });
        let (text, _) = describe(&obs, &[], false);
        assert!(
            text.contains("feedback none yet (wheel_speed = no value)\n"),
            "{text}"
        );
    }

    #[test]
    fn a_safe_value_the_device_did_not_confirm_is_not_called_safe() {
        let mut obs = observation();
        obs.actuators[0].value = 0.0;
        obs.actuators[0].owner = None;
        obs.actuators[0].at_safe_value = false;
        obs.actuators[0].safe_unconfirmed = Some("no reply within 200 ms".into());
        let (text, _) = describe(&obs, &[], false);
        assert!(
            text.contains(
                "- actuator speed = 0 (safe value NOT confirmed by the device: \
                 no reply within 200 ms)\n"
            ),
            "{text}"
        );
        assert!(!text.contains("speed = 0 (safe)"), "{text}");
    }

    #[test]
    fn new_and_raised_alarms_are_called_out_after_the_first_cycle() {
        let mut obs = observation();
        obs.sensors[0].alarm = AlarmLevel::Critical;
        let seen = [
            ("temp".to_string(), AlarmLevel::Warn),
            ("distance".to_string(), AlarmLevel::Warn),
        ];
        let (text, _) = describe(&obs, &seen, true);
        assert!(
            text.ends_with("\nNEW ALARMS since the last cycle: distance critical"),
            "{text}"
        );
        let (first_cycle, _) = describe(&obs, &[], false);
        assert!(!first_cycle.contains("NEW ALARMS"), "{first_cycle}");
    }

    #[test]
    fn an_active_stop_names_its_causes() {
        let mut obs = observation();
        obs.protective_stop_causes = vec![StopInfo {
            source: "rest".into(),
            reason: "operator".into(),
            since_unix_ms: 0,
            by: None,
        }];
        let (text, _) = describe(&obs, &[], false);
        let causes = crate::safety::StopState {
            causes: obs.protective_stop_causes.clone(),
        };
        assert!(
            text.starts_with(&format!(
                "Current observation #7 (protective stop: ACTIVE, {}):\n",
                causes.describe()
            )),
            "{text}"
        );
    }
}
