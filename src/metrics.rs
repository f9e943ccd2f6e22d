//! Prometheus metrics: one process-wide set of event metrics, recorded
//! where things happen through the small typed functions below with plain
//! labels. A leaf: it knows none of the cores. The state of the running
//! daemon (loop counters, sensors, actuators, stop, fleet) is sampled when
//! `/metrics` is scraped, by `api::metrics`.
//!
//! Label values are bounded: names from the configuration (sensors,
//! actuators, host tools, model endpoints), fixed vocabularies (stop
//! reasons, decisions, outcomes), and `client`/`other` for anything a
//! client or a model could make up. Never a session, task or call id.

use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

/// The `Content-Type` of the OpenMetrics text answer.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The `Content-Type` of the Prometheus text (0.0.4) answer.
pub const TEXT_CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Most distinct model names kept as their own label value; later ones count as `other`.
const MAX_MODEL_LABELS: usize = 64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StopReasonLabels {
    stop_reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabels {
    endpoint: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointResultLabels {
    endpoint: Arc<str>,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    endpoint: Arc<str>,
    kind: &'static str,
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Loop timing: 10 µs to about 2.6 s.
fn loop_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_01, 4.0, 10))
}

/// Calls that wait on something else (models, tools, approvals): 1 ms to about 4.4 min.
fn call_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 4.0, 10))
}

/// Store writes: 50 µs to about 13 s.
fn store_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 4.0, 10))
}

/// The process-wide event metrics.
#[derive(Debug)]
struct Events {
    loop_lateness: Histogram,
    tick_exec: Histogram,
    sessions_ended: Family<ReasonLabels, Counter>,
    turns: Family<StopReasonLabels, Counter>,
    model_calls: Family<EndpointResultLabels, Counter>,
    model_duration: Histograms<EndpointLabels>,
    model_tokens: Family<TokenLabels, Counter>,
    model_errors: Family<EndpointLabels, Counter>,
    tool_calls: Family<ToolLabels, Counter>,
    tool_duration: Histograms<ToolDurationLabels>,
    approval_wait: Histograms<ResultLabels>,
    actuator_commands: Family<CommandLabels, Counter>,
    feedback_verdicts: Family<VerdictLabels, Counter>,
    stop_triggers: Family<SourceLabels, Counter>,
    store_writes: Histograms<KindLabels>,
    modbus_requests: Histograms<LinkLabels>,
    /// Model names seen in configuration; others are labelled `other`.
    /// Shared, not copied: every model call labels six series with one.
    models: Mutex<BTreeSet<Arc<str>>>,
    /// The label of models configuration does not name.
    other_model: Arc<str>,
}

static EVENTS: LazyLock<Events> = LazyLock::new(|| Events {
    loop_lateness: loop_histogram(),
    tick_exec: loop_histogram(),
    sessions_ended: Family::default(),
    turns: Family::default(),
    model_calls: Family::default(),
    model_duration: Family::new_with_constructor(call_histogram),
    model_tokens: Family::default(),
    model_errors: Family::default(),
    tool_calls: Family::default(),
    tool_duration: Family::new_with_constructor(call_histogram),
    approval_wait: Family::new_with_constructor(call_histogram),
    actuator_commands: Family::default(),
    feedback_verdicts: Family::default(),
    stop_triggers: Family::default(),
    store_writes: Family::new_with_constructor(store_histogram),
    modbus_requests: Family::new_with_constructor(modbus_histogram),
    models: Mutex::new(BTreeSet::from([Arc::from("local")])),
    other_model: Arc::from("other"),
});

/// One tick of the loop: how late it woke after its deadline, how long its work took.
pub fn loop_tick(late: Duration, exec: Duration) {
    EVENTS.loop_lateness.observe(late.as_secs_f64());
    EVENTS.tick_exec.observe(exec.as_secs_f64());
}

/// A session ended (`cancel_session`, `disconnect`, `shutdown`, `internal_error`, ...).
pub fn session_ended(reason: &'static str) {
    EVENTS
        .sessions_ended
        .get_or_create(&ReasonLabels {
            reason: reason.to_string(),
        })
        .inc();
}

/// A turn (of a session or a task's worker) ended.
pub fn turn_ended(stop_reason: &'static str) {
    EVENTS
        .turns
        .get_or_create(&StopReasonLabels {
            stop_reason: stop_reason.to_string(),
        })
        .inc();
}

/// The model names configuration allows (endpoint model ids and names):
/// each gets its own label value.
pub fn known_models<'a>(names: impl IntoIterator<Item = &'a str>) {
    let mut known = EVENTS.models.lock();
    for name in names {
        if known.len() >= MAX_MODEL_LABELS {
            break;
        }
        known.insert(Arc::from(name));
    }
}

fn model_label(name: &str) -> Arc<str> {
    let known = EVENTS.models.lock();
    known
        .get(name)
        .cloned()
        .unwrap_or_else(|| EVENTS.other_model.clone())
}

/// Token counts of one model call, by kind.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tokens {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_creation: u64,
}

/// How one model call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelResult {
    Ok,
    Error,
    Cancelled,
}

/// One model call: its endpoint (the model's name), duration, outcome and tokens.
pub fn model_call(model: &str, took: Duration, result: ModelResult, tokens: Tokens) {
    let endpoint = model_label(model);
    let word = match result {
        ModelResult::Ok => "ok",
        ModelResult::Error => "error",
        ModelResult::Cancelled => "cancelled",
    };
    EVENTS
        .model_calls
        .get_or_create(&EndpointResultLabels {
            endpoint: endpoint.clone(),
            result: word,
        })
        .inc();
    EVENTS
        .model_duration
        .get_or_create(&EndpointLabels {
            endpoint: endpoint.clone(),
        })
        .observe(took.as_secs_f64());
    if result == ModelResult::Error {
        EVENTS
            .model_errors
            .get_or_create(&EndpointLabels {
                endpoint: endpoint.clone(),
            })
            .inc();
    }
    for (kind, n) in [
        ("input", tokens.input),
        ("output", tokens.output),
        ("cache_read", tokens.cache_read),
        ("cache_creation", tokens.cache_creation),
    ] {
        EVENTS
            .model_tokens
            .get_or_create(&TokenLabels {
                endpoint: endpoint.clone(),
                kind,
            })
            .inc_by(n);
    }
}

/// One tool call of a model. `tool` is a host tool's name, or `client`
/// for a client's tool, or `unknown`; `decision` the gate's word
/// (`allowed`, `approved`, `denied`, `blocked`) or `refused` when the call
/// never reached the gate; `outcome` `ok`, `error` or `cancelled`.
pub fn tool_call(tool: &str, category: &str, decision: &str, outcome: &str, took: Duration) {
    EVENTS
        .tool_calls
        .get_or_create(&ToolLabels {
            tool: tool.to_string(),
            category: category.to_string(),
            decision: decision.to_string(),
            outcome: outcome.to_string(),
        })
        .inc();
    EVENTS
        .tool_duration
        .get_or_create(&ToolDurationLabels {
            tool: tool.to_string(),
            category: category.to_string(),
        })
        .observe(took.as_secs_f64());
}

/// How long a tool call waited for its approval; `result` `approved`,
/// `denied` (also a timeout) or `cancelled`.
pub fn approval_wait(took: Duration, result: &'static str) {
    EVENTS
        .approval_wait
        .get_or_create(&ResultLabels {
            result: result.to_string(),
        })
        .observe(took.as_secs_f64());
}

/// One actuator command or safe drive: `origin` the kind of who asked
/// (`session`, `rule`, `operator`, `safety`), `result` `applied` or why not.
pub fn actuator_command(actuator: &str, origin: &str, result: &str) {
    EVENTS
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
pub fn feedback_verdict(actuator: &str, status: &str) {
    EVENTS
        .feedback_verdicts
        .get_or_create(&VerdictLabels {
            actuator: actuator.to_string(),
            status: status.to_string(),
        })
        .inc();
}

/// A cause was added to the protective stop; `kind`: the kind of its
/// source (`rule`, not `rule:<name>`: see `safety::source_kind`).
pub fn stop_triggered(kind: &str) {
    EVENTS
        .stop_triggers
        .get_or_create(&SourceLabels {
            source: kind.to_string(),
        })
        .inc();
}

/// One store write (`session`, `turn`, `feedback`, `audit`, `task`, ...), queueing included.
pub fn store_write(kind: &'static str, took: Duration) {
    EVENTS
        .store_writes
        .get_or_create(&KindLabels {
            kind: kind.to_string(),
        })
        .observe(took.as_secs_f64());
}

/// One Modbus request on `link` (a read, a write or a read-back, whatever
/// its outcome) and how long it took.
pub fn modbus_request(link: &str, took: Duration) {
    EVENTS
        .modbus_requests
        .get_or_create(&LinkLabels {
            link: link.to_string(),
        })
        .observe(took.as_secs_f64());
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LinkLabels {
    link: String,
}

/// Modbus requests: 100 µs to about 26 s.
fn modbus_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_1, 4.0, 10))
}

/// Which format `/metrics` answers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text (what Prometheus asks for).
    OpenMetrics,
    /// The Prometheus text format 0.0.4 (curl, promtool).
    Text,
}

impl Format {
    /// OpenMetrics when the `Accept` header names it, else the classic text.
    pub fn from_accept(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Text,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
            Format::Text => TEXT_CONTENT_TYPE,
        }
    }
}

/// Encodes `registry` in `format`.
pub fn encode(registry: &Registry, format: Format) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    match format {
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, registry)?,
        Format::Text => prometheus_client::encoding::prometheus_text::encode(&mut out, registry)?,
    }
    Ok(out)
}

/// Registers the event metrics (what the functions above record) in
/// `registry`; `/metrics` adds the state it samples (`api::metrics`).
pub fn register_events(r: &mut Registry) {
    let e = &*EVENTS;
    r.register_with_unit(
        "loop_lateness",
        "How late each tick of the OODA loop woke after its deadline",
        Unit::Seconds,
        e.loop_lateness.clone(),
    );
    r.register_with_unit(
        "loop_tick_exec",
        "How long each tick's own work (orient, decide, hand-off) took",
        Unit::Seconds,
        e.tick_exec.clone(),
    );
    r.register(
        "sessions_ended",
        "Sessions ended, by reason",
        e.sessions_ended.clone(),
    );
    r.register(
        "turns",
        "Turns ended (sessions and task workers), by stop reason",
        e.turns.clone(),
    );
    r.register(
        "model_calls",
        "Model calls, by endpoint (model name; other for names not configured) and result",
        e.model_calls.clone(),
    );
    r.register_with_unit(
        "model_call_duration",
        "Duration of model calls, by endpoint",
        Unit::Seconds,
        e.model_duration.clone(),
    );
    r.register(
        "model_tokens",
        "Tokens of model calls, by endpoint and kind (input, output, cache_read, cache_creation)",
        e.model_tokens.clone(),
    );
    r.register(
        "model_errors",
        "Failed model calls, by endpoint",
        e.model_errors.clone(),
    );
    r.register(
        "tool_calls",
        "Tool calls of models, by tool (host tool name, client, unknown), category, decision and outcome",
        e.tool_calls.clone(),
    );
    r.register_with_unit(
        "tool_call_duration",
        "Duration of tool calls (approval wait included), by tool and category",
        Unit::Seconds,
        e.tool_duration.clone(),
    );
    r.register_with_unit(
        "approval_wait",
        "How long tool calls waited for an approval, by result",
        Unit::Seconds,
        e.approval_wait.clone(),
    );
    r.register(
        "actuator_commands",
        "Actuator commands, by actuator, origin kind and result",
        e.actuator_commands.clone(),
    );
    r.register(
        "actuator_feedback_verdicts",
        "Verdicts of actuators' feedback (commanded versus measured), by actuator and status",
        e.feedback_verdicts.clone(),
    );
    r.register(
        "protective_stop_triggers",
        "Causes added to the protective stop, by source",
        e.stop_triggers.clone(),
    );
    r.register_with_unit(
        "store_write_duration",
        "Duration of store writes (waiting for the store included), by kind",
        Unit::Seconds,
        e.store_writes.clone(),
    );
    r.register_with_unit(
        "modbus_request_duration",
        "Duration of Modbus requests (reads, writes, read-backs; failed ones too), by link",
        Unit::Seconds,
        e.modbus_requests.clone(),
    );
    r.register(
        "build",
        "This build of rozd",
        Info::new(BuildLabels {
            version: crate::VERSION.to_string(),
        }),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_only_when_asked_for() {
        assert_eq!(
            Format::from_accept(Some(
                "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
            )),
            Format::OpenMetrics
        );
        assert_eq!(Format::from_accept(Some("*/*")), Format::Text);
        assert_eq!(Format::from_accept(None), Format::Text);
    }

    #[test]
    fn unconfigured_model_names_are_other() {
        known_models(["configured-model"]);
        assert_eq!(&*model_label("configured-model"), "configured-model");
        assert_eq!(&*model_label("local"), "local");
        assert_eq!(&*model_label("claude-made-up-by-a-client"), "other");
    }

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
        let counted = EVENTS
            .stop_triggers
            .get(&SourceLabels {
                source: "rule".into(),
            })
            .map(|c| c.get());
        assert!(counted.is_some_and(|n| n >= 1));
        assert!(
            EVENTS
                .stop_triggers
                .get(&SourceLabels {
                    source: "rule:too_hot".into()
                })
                .is_none()
        );
    }
}
