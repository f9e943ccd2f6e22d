//! Prometheus metrics, the shared part: the answer's formats and their
//! encoding, the histogram buckets subsystems share, and the build's info.
//! Each subsystem keeps its own event metrics and registers them itself
//! (`ooda::metrics`, `safety::metrics`, `session::metrics`,
//! `model::metrics`, `store::metrics`, `hw::modbus::metrics`), recorded
//! where things happen with plain labels; `api::metrics` composes them
//! with the state it samples at each scrape. A leaf: it knows none of the
//! cores.
//!
//! Label values are bounded: names from the configuration (sensors,
//! actuators, host tools, model endpoints), fixed vocabularies (stop
//! reasons, decisions, outcomes), and `client`/`other` for anything a
//! client or a model could make up. Never a session, task or call id.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

/// The `Content-Type` of the OpenMetrics text answer.
pub(crate) const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The `Content-Type` of the Prometheus text (0.0.4) answer.
pub(crate) const TEXT_CONTENT_TYPE: &str =
    prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// A family of histograms made by a bucket function.
pub(crate) type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Loop timing: 10 µs to about 2.6 s.
pub(crate) fn loop_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_01, 4.0, 10))
}

/// Calls that wait on something else (models, tools, approvals): 1 ms to about 4.4 min.
pub(crate) fn call_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 4.0, 10))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
}

/// Which format `/metrics` answers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// OpenMetrics 1.0 text (what Prometheus asks for).
    OpenMetrics,
    /// The Prometheus text format 0.0.4 (curl, promtool).
    Text,
}

impl Format {
    /// OpenMetrics when the `Accept` header names it, else the classic text.
    pub(crate) fn from_accept(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Text,
        }
    }

    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
            Format::Text => TEXT_CONTENT_TYPE,
        }
    }
}

/// Encodes `registry` in `format`.
pub(crate) fn encode(registry: &Registry, format: Format) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    match format {
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, registry)?,
        Format::Text => prometheus_client::encoding::prometheus_text::encode(&mut out, registry)?,
    }
    Ok(out)
}

/// Registers this build's info (`rozd_build_info`) in `r`.
pub(crate) fn register_build(r: &mut Registry) {
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
}
