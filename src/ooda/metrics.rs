//! The loop's event metrics, registered by [`register`]: tick timing,
//! actuator commands and feedback verdicts (recorded by `tick.rs` and the
//! [`super::metered`] observer), with plain labels.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::metrics::loop_histogram;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CommandLabels {
    actuator: String,
    origin: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerdictLabels {
    actuator: String,
    status: String,
}

#[derive(Debug)]
struct LoopMetrics {
    lateness: Histogram,
    tick_exec: Histogram,
    actuator_commands: Family<CommandLabels, Counter>,
    feedback_verdicts: Family<VerdictLabels, Counter>,
}

static METRICS: LazyLock<LoopMetrics> = LazyLock::new(|| LoopMetrics {
    lateness: loop_histogram(),
    tick_exec: loop_histogram(),
    actuator_commands: Family::default(),
    feedback_verdicts: Family::default(),
});

/// One tick of the loop: how late it woke after its deadline, how long its work took.
pub(crate) fn loop_tick(late: Duration, exec: Duration) {
    METRICS.lateness.observe(late.as_secs_f64());
    METRICS.tick_exec.observe(exec.as_secs_f64());
}

/// One actuator command or safe drive: `origin` the kind of who asked
/// (`session`, `rule`, `operator`, `safety`), `result` `applied` or why not.
pub(crate) fn actuator_command(actuator: &str, origin: &str, result: &str) {
    METRICS
        .actuator_commands
        .get_or_create(&CommandLabels {
            actuator: actuator.to_string(),
            origin: origin.to_string(),
            result: result.to_string(),
        })
        .inc();
}

/// A verdict of an actuator's feedback: `status` `confirmed`,
/// `unconfirmed` or `mismatch`.
pub(crate) fn feedback_verdict(actuator: &str, status: &str) {
    METRICS
        .feedback_verdicts
        .get_or_create(&VerdictLabels {
            actuator: actuator.to_string(),
            status: status.to_string(),
        })
        .inc();
}

/// Registers the loop's event metrics in `r`.
pub(crate) fn register(r: &mut Registry) {
    let m = &*METRICS;
    r.register_with_unit(
        "loop_lateness",
        "How late each tick of the OODA loop woke after its deadline",
        Unit::Seconds,
        m.lateness.clone(),
    );
    r.register_with_unit(
        "loop_tick_exec",
        "How long each tick's own work (orient, decide, hand-off) took",
        Unit::Seconds,
        m.tick_exec.clone(),
    );
    r.register(
        "actuator_commands",
        "Actuator commands, by actuator, origin kind and result",
        m.actuator_commands.clone(),
    );
    r.register(
        "actuator_feedback_verdicts",
        "Verdicts of actuators' feedback (commanded versus measured), by actuator and status",
        m.feedback_verdicts.clone(),
    );
}
