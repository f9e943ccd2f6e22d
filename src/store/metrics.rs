//! The store's event metric, registered by [`register`]: how long each
//! write took, queueing included.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use crate::metrics::Histograms;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

/// Store writes: 50 µs to about 13 s.
fn store_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 4.0, 10))
}

static WRITES: LazyLock<Histograms<KindLabels>> =
    LazyLock::new(|| Family::new_with_constructor(store_histogram));

/// One store write (`session`, `turn`, `feedback`, `audit`, `task`, ...), queueing included.
pub(crate) fn store_write(kind: &'static str, took: Duration) {
    WRITES
        .get_or_create(&KindLabels {
            kind: kind.to_string(),
        })
        .observe(took.as_secs_f64());
}

/// Registers the store's event metric in `r`.
pub(crate) fn register(r: &mut Registry) {
    r.register_with_unit(
        "store_write_duration",
        "Duration of store writes (waiting for the store included), by kind",
        Unit::Seconds,
        WRITES.clone(),
    );
}
