//! The sessions' event metrics, registered by [`register`]: sessions and
//! turns ended, tool calls and their approval waits, with plain labels
//! (never a session or call id).

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::{Registry, Unit};

use crate::metrics::{Histograms, call_histogram};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StopReasonLabels {
    stop_reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    tool: String,
    category: String,
    decision: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolDurationLabels {
    tool: String,
    category: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

#[derive(Debug)]
struct SessionMetrics {
    sessions_ended: Family<ReasonLabels, Counter>,
    turns: Family<StopReasonLabels, Counter>,
    tool_calls: Family<ToolLabels, Counter>,
    tool_duration: Histograms<ToolDurationLabels>,
    approval_wait: Histograms<ResultLabels>,
}

static METRICS: LazyLock<SessionMetrics> = LazyLock::new(|| SessionMetrics {
    sessions_ended: Family::default(),
    turns: Family::default(),
    tool_calls: Family::default(),
    tool_duration: Family::new_with_constructor(call_histogram),
    approval_wait: Family::new_with_constructor(call_histogram),
});

/// A session ended (`cancel_session`, `disconnect`, `shutdown`, `internal_error`, ...).
pub(crate) fn session_ended(reason: &'static str) {
    METRICS
        .sessions_ended
        .get_or_create(&ReasonLabels {
            reason: reason.to_string(),
        })
        .inc();
}

/// A turn (of a session or a task's worker) ended.
pub(crate) fn turn_ended(stop_reason: &'static str) {
    METRICS
        .turns
        .get_or_create(&StopReasonLabels {
            stop_reason: stop_reason.to_string(),
        })
        .inc();
}

/// One tool call of a model. `tool` is a host tool's name, or `client`
/// for a client's tool, or `unknown`; `decision` the gate's word
/// (`allowed`, `approved`, `denied`, `blocked`) or `refused` when the call
/// never reached the gate; `outcome` `ok`, `error` or `cancelled`.
pub(crate) fn tool_call(tool: &str, category: &str, decision: &str, outcome: &str, took: Duration) {
    METRICS
        .tool_calls
        .get_or_create(&ToolLabels {
            tool: tool.to_string(),
            category: category.to_string(),
            decision: decision.to_string(),
            outcome: outcome.to_string(),
        })
        .inc();
    METRICS
        .tool_duration
        .get_or_create(&ToolDurationLabels {
            tool: tool.to_string(),
            category: category.to_string(),
        })
        .observe(took.as_secs_f64());
}

/// How long a tool call waited for its approval; `result` `approved`,
/// `denied` (also a timeout) or `cancelled`.
pub(crate) fn approval_wait(took: Duration, result: &'static str) {
    METRICS
        .approval_wait
        .get_or_create(&ResultLabels {
            result: result.to_string(),
        })
        .observe(took.as_secs_f64());
}

/// Registers the sessions' event metrics in `r`.
pub(crate) fn register(r: &mut Registry) {
    let m = &*METRICS;
    r.register(
        "sessions_ended",
        "Sessions ended, by reason",
        m.sessions_ended.clone(),
    );
    r.register(
        "turns",
        "Turns ended (sessions and task workers), by stop reason",
        m.turns.clone(),
    );
    r.register(
        "tool_calls",
        "Tool calls of models, by tool (host tool name, client, unknown), category, decision and outcome",
        m.tool_calls.clone(),
    );
    r.register_with_unit(
        "tool_call_duration",
        "Duration of tool calls (approval wait included), by tool and category",
        Unit::Seconds,
        m.tool_duration.clone(),
    );
    r.register_with_unit(
        "approval_wait",
        "How long tool calls waited for an approval, by result",
        Unit::Seconds,
        m.approval_wait.clone(),
    );
}
