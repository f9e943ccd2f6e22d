//! The models' event metrics, registered by [`register`]: calls, their
//! duration, errors and tokens, by endpoint (a model name the
//! configuration allows, else `other`: a client cannot make up labels).

use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::{Registry, Unit};

use crate::metrics::{Histograms, call_histogram};

/// Most distinct model names kept as their own label value; later ones count as `other`.
const MAX_MODEL_LABELS: usize = 64;

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

#[derive(Debug)]
struct ModelMetrics {
    calls: Family<EndpointResultLabels, Counter>,
    duration: Histograms<EndpointLabels>,
    tokens: Family<TokenLabels, Counter>,
    errors: Family<EndpointLabels, Counter>,
    /// Model names seen in configuration; others are labelled `other`.
    /// Shared, not copied: every model call labels six series with one.
    known: Mutex<BTreeSet<Arc<str>>>,
    /// The label of models configuration does not name.
    other: Arc<str>,
}

static METRICS: LazyLock<ModelMetrics> = LazyLock::new(|| ModelMetrics {
    calls: Family::default(),
    duration: Family::new_with_constructor(call_histogram),
    tokens: Family::default(),
    errors: Family::default(),
    known: Mutex::new(BTreeSet::from([Arc::from("local")])),
    other: Arc::from("other"),
});

/// The model names configuration allows (endpoint model ids and names):
/// each gets its own label value.
pub(crate) fn known_models<'a>(names: impl IntoIterator<Item = &'a str>) {
    let mut known = METRICS.known.lock();
    for name in names {
        if known.len() >= MAX_MODEL_LABELS {
            break;
        }
        known.insert(Arc::from(name));
    }
}

fn model_label(name: &str) -> Arc<str> {
    let known = METRICS.known.lock();
    known
        .get(name)
        .cloned()
        .unwrap_or_else(|| METRICS.other.clone())
}

/// Token counts of one model call, by kind.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Tokens {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_creation: u64,
}

/// How one model call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ModelResult {
    Ok,
    Error,
    Cancelled,
}

/// One model call: its endpoint (the model's name), duration, outcome and tokens.
pub(crate) fn model_call(model: &str, took: Duration, result: ModelResult, tokens: Tokens) {
    let endpoint = model_label(model);
    let word = match result {
        ModelResult::Ok => "ok",
        ModelResult::Error => "error",
        ModelResult::Cancelled => "cancelled",
    };
    METRICS
        .calls
        .get_or_create(&EndpointResultLabels {
            endpoint: endpoint.clone(),
            result: word,
        })
        .inc();
    METRICS
        .duration
        .get_or_create(&EndpointLabels {
            endpoint: endpoint.clone(),
        })
        .observe(took.as_secs_f64());
    if result == ModelResult::Error {
        METRICS
            .errors
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
        METRICS
            .tokens
            .get_or_create(&TokenLabels {
                endpoint: endpoint.clone(),
                kind,
            })
            .inc_by(n);
    }
}

/// Registers the models' event metrics in `r`.
pub(crate) fn register(r: &mut Registry) {
    let m = &*METRICS;
    r.register(
        "model_calls",
        "Model calls, by endpoint (model name; other for names not configured) and result",
        m.calls.clone(),
    );
    r.register_with_unit(
        "model_call_duration",
        "Duration of model calls, by endpoint",
        Unit::Seconds,
        m.duration.clone(),
    );
    r.register(
        "model_tokens",
        "Tokens of model calls, by endpoint and kind (input, output, cache_read, cache_creation)",
        m.tokens.clone(),
    );
    r.register(
        "model_errors",
        "Failed model calls, by endpoint",
        m.errors.clone(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unconfigured_model_names_are_other() {
        known_models(["configured-model"]);
        assert_eq!(&*model_label("configured-model"), "configured-model");
        assert_eq!(&*model_label("local"), "local");
        assert_eq!(&*model_label("claude-made-up-by-a-client"), "other");
    }
}
