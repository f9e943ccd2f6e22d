//! The Modbus links' event metric, registered by [`register`]: how long
//! each request took, by link.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use crate::metrics::Histograms;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LinkLabels {
    link: String,
}

/// Modbus requests: 100 µs to about 26 s.
fn modbus_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_1, 4.0, 10))
}

static REQUESTS: LazyLock<Histograms<LinkLabels>> =
    LazyLock::new(|| Family::new_with_constructor(modbus_histogram));

/// One Modbus request on `link` (a read, a write or a read-back, whatever
/// its outcome) and how long it took.
pub(crate) fn modbus_request(link: &str, took: Duration) {
    REQUESTS
        .get_or_create(&LinkLabels {
            link: link.to_string(),
        })
        .observe(took.as_secs_f64());
}

/// Registers the Modbus links' event metric in `r`.
pub(crate) fn register(r: &mut Registry) {
    r.register_with_unit(
        "modbus_request_duration",
        "Duration of Modbus requests (reads, writes, read-backs; failed ones too), by link",
        Unit::Seconds,
        REQUESTS.clone(),
    );
}
