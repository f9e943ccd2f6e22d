//! Where a protective stop comes from: the vocabulary of the latch's
//! sources. A cause keeps its source as text (`StopInfo.source`, the stop
//! file, the audit, the wire), spelt by [`StopSource`]'s `Display`.

use std::fmt;

/// The source of a stop request, and of the cause it adds. One cause per
/// source: a second stop from the same source keeps the first reason.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StopSource {
    /// `POST /v1/estop` over the network (`rest`).
    Rest,
    /// The same, from the rozd CLI (`cli`, by its user agent).
    Cli,
    /// The same, over the local control socket (`control-socket`).
    ControlSocket,
    /// `roz.v1.SafetyService/TriggerEstop` (`grpc`).
    Grpc,
    /// The fleet stop of this host's environment (`fleet`).
    Fleet,
    /// The GPIO stop input (`gpio`).
    Gpio,
    /// The MQTT stop input (`mqtt`).
    Mqtt,
    /// The control loop itself, when its timer fails (`ooda`).
    Loop,
    /// A reflex rule, by name (`rule:<name>`).
    Rule(String),
    /// An actuator whose feedback contradicts its command, by name
    /// (`feedback:<actuator>`).
    Feedback(String),
    /// The stop file could not be read or written at start-up (`restore`).
    Restore,
    /// The Foxglove live connection's `protective_stop` service (`foxglove`).
    Foxglove,
}

impl StopSource {
    /// The kind, without a rule's or an actuator's name (`rule`,
    /// `feedback`): the metrics label.
    pub fn kind(&self) -> &'static str {
        match self {
            StopSource::Rest => "rest",
            StopSource::Cli => "cli",
            StopSource::ControlSocket => "control-socket",
            StopSource::Grpc => "grpc",
            StopSource::Fleet => "fleet",
            StopSource::Gpio => "gpio",
            StopSource::Mqtt => "mqtt",
            StopSource::Loop => "ooda",
            StopSource::Rule(_) => "rule",
            StopSource::Feedback(_) => "feedback",
            StopSource::Restore => "restore",
            StopSource::Foxglove => "foxglove",
        }
    }

    /// Whether a cause's recorded `source` is this one.
    pub fn is(&self, recorded: &str) -> bool {
        match self {
            StopSource::Rule(name) | StopSource::Feedback(name) => {
                recorded
                    .strip_prefix(self.kind())
                    .and_then(|rest| rest.strip_prefix(':'))
                    == Some(name.as_str())
            }
            _ => recorded == self.kind(),
        }
    }
}

impl fmt::Display for StopSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopSource::Rule(name) | StopSource::Feedback(name) => {
                write!(f, "{}:{name}", self.kind())
            }
            other => f.write_str(other.kind()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_spelt_as_recorded_and_recognised() {
        let all = [
            (StopSource::Rest, "rest"),
            (StopSource::Cli, "cli"),
            (StopSource::ControlSocket, "control-socket"),
            (StopSource::Grpc, "grpc"),
            (StopSource::Fleet, "fleet"),
            (StopSource::Gpio, "gpio"),
            (StopSource::Mqtt, "mqtt"),
            (StopSource::Loop, "ooda"),
            (StopSource::Rule("too_close".into()), "rule:too_close"),
            (StopSource::Feedback("drive".into()), "feedback:drive"),
            (StopSource::Restore, "restore"),
            (StopSource::Foxglove, "foxglove"),
        ];
        for (source, text) in &all {
            assert_eq!(source.to_string(), *text);
            assert!(source.is(text), "{text}");
        }
        assert_eq!(StopSource::Rule("a".into()).kind(), "rule");
        assert!(!StopSource::Rule("a".into()).is("rule:b"));
        assert!(!StopSource::Rule("a".into()).is("rule"));
        assert!(!StopSource::Rest.is("rest:x"));
        assert!(!StopSource::Fleet.is("feedback:fleet"));
    }
}
