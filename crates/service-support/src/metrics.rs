//! The process-wide Prometheus recorder.

use std::sync::OnceLock;

pub use metrics_exporter_prometheus::PrometheusHandle;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

/// Latency buckets in seconds for every `*_seconds` histogram: fine around
/// the millisecond work these services do, coarse up to timeouts.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Content type of the Prometheus text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The recorder, installed on first use. `metrics` has one global recorder,
/// so every application built in one process (as in tests) shares it.
pub fn recorder() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), LATENCY_BUCKETS)
                .map(PrometheusBuilder::build_recorder);
            match recorder {
                Ok(recorder) => {
                    let handle = recorder.handle();
                    if metrics::set_global_recorder(recorder).is_err() {
                        tracing::warn!(
                            "another metrics recorder was installed first; /metrics will be empty"
                        );
                    }
                    handle
                }
                // Only an empty bucket list fails, and ours is not empty.
                Err(error) => unreachable!("invalid histogram buckets: {error}"),
            }
        })
        .clone()
}
