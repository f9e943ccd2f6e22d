//! The stop's event metric, registered by [`register`]: causes added to
//! the protective stop, by the kind of their source (recorded by
//! [`super::StopMetrics`]).

use std::sync::LazyLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct SourceLabels {
    pub(super) source: String,
}

pub(super) static STOP_TRIGGERS: LazyLock<Family<SourceLabels, Counter>> =
    LazyLock::new(Family::default);

/// A cause was added to the protective stop; `kind`: the kind of its
/// source (`rule`, not `rule:<name>`: see `safety::source_kind`).
pub(crate) fn stop_triggered(kind: &str) {
    STOP_TRIGGERS
        .get_or_create(&SourceLabels {
            source: kind.to_string(),
        })
        .inc();
}

/// Registers the stop's event metric in `r`.
pub(crate) fn register(r: &mut Registry) {
    r.register(
        "protective_stop_triggers",
        "Causes added to the protective stop, by source",
        STOP_TRIGGERS.clone(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_sources_lose_their_name() {
        use crate::safety::StopObserver as _;
        crate::safety::StopMetrics.stop_changed(
            &crate::safety::StopEvent::Triggered {
                source: "rule:too_hot".into(),
                reason: "hot".into(),
                by: None,
                credential: None,
            },
            &[],
        );
        let counted = STOP_TRIGGERS
            .get(&SourceLabels {
                source: "rule".into(),
            })
            .map(|c| c.get());
        assert!(counted.is_some_and(|n| n >= 1));
        assert!(
            STOP_TRIGGERS
                .get(&SourceLabels {
                    source: "rule:too_hot".into()
                })
                .is_none()
        );
    }
}
