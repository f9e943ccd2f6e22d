//! The Observation as the model reads it in `ooda_re_act` mode: one line
//! per sensor and actuator, the protective stop's causes, and the alarms
//! that appeared since the previous cycle.

use super::Turn;
use crate::ooda::Ooda;
use crate::ooda::orient::AlarmLevel;

impl Turn {
    /// The Observation as compact text for the model, with alarms that
    /// appeared since the previous cycle called out.
    pub(super) fn describe_observation(&mut self, ooda: &Ooda) -> String {
        // Sensors and actuators as they are now (alarm levels as of the last
        // tick), not as last published: the model sees its own last command.
        let obs = ooda.observe_now();
        let mut lines = vec![format!(
            "Current observation #{} (protective stop: {}):",
            obs.seq,
            if obs.protective_stop_causes.is_empty() {
                "none".to_string()
            } else {
                let causes = crate::safety::StopState {
                    causes: obs.protective_stop_causes.clone(),
                };
                format!("ACTIVE, {}", causes.describe())
            }
        )];
        let mut now_alarms = Vec::new();
        for s in &obs.sensors {
            let v = &s.sensor;
            let value = v
                .value
                .map_or_else(|| "no value".to_string(), |x| format!("{x:.4}"));
            let unit = v.unit.as_deref().unwrap_or("");
            let age = v
                .age_ms
                .map_or_else(String::new, |a| format!(", age {a} ms"));
            let alarm = match s.alarm {
                AlarmLevel::Ok => String::new(),
                other => format!(", ALARM {other:?}").to_uppercase(),
            };
            lines.push(format!(
                "- sensor {} = {value} {unit} ({}{age}{alarm})",
                v.name, v.health
            ));
            if s.alarm != AlarmLevel::Ok {
                now_alarms.push((v.name.clone(), s.alarm));
            }
        }
        for a in &obs.actuators {
            let holder = a
                .owner
                .as_deref()
                .map_or_else(String::new, |o| format!(", held by {o}"));
            lines.push(format!(
                "- actuator {} = {}{}{}",
                a.name,
                a.value,
                if a.at_safe_value { " (safe)" } else { "" },
                holder
            ));
        }
        let new: Vec<String> = now_alarms
            .iter()
            .filter(|(n, l)| !self.seen_alarms.iter().any(|(sn, sl)| sn == n && sl >= l))
            .map(|(n, l)| format!("{n} {l:?}").to_lowercase())
            .collect();
        if self.cycle > 1 && !new.is_empty() {
            lines.push(format!(
                "NEW ALARMS since the last cycle: {}",
                new.join(", ")
            ));
        }
        self.seen_alarms = now_alarms;
        lines.join("\n")
    }
}
