//! Upstream's request metrics pushed over OTLP (`requestMetrics.protocol` `grpc` or
//! `http/protobuf`), on the control thread: every interval the shards' counters are summed per
//! revision as a scrape sums them ([`crate::metrics::queue_proxy_otlp`]) and exported by
//! [`kactivator_telemetry::metrics::run`]; once the shards have ended, one last time. What
//! became of the exports is on the metrics page ([`ExportMetrics`]).

use std::collections::HashMap;
use std::sync::Arc;

use kactivator_shards::metrics::AllShardStats;
use kactivator_telemetry::metrics::{MetricsCountersSnapshot, MetricsExportCounters};
use kactivator_telemetry::{MetricsConfig, Resource};
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use tokio::sync::oneshot;

use crate::trace_export::family;

/// Pushes the request metrics as `config` says until `finish` fires (the shards have ended),
/// then pushes them once more and returns; the caller bounds how long it waits for that.
/// `queue_depth`: the revision has a breaker, so `kn.serving.queue.depth` is recorded, as
/// upstream records it only then. `registry` gets the export counters.
pub async fn run(
    config: MetricsConfig,
    stats: AllShardStats,
    queue_depth: bool,
    resource: Resource,
    registry: &prometheus::Registry,
    finish: oneshot::Receiver<()>,
) {
    let counters = Arc::new(MetricsExportCounters::default());
    if let Err(error) = registry.register(Box::new(ExportMetrics::new(counters.clone()))) {
        tracing::warn!("the metrics export counters are not on the metrics page: {error}");
    }
    let collect = move || crate::metrics::queue_proxy_otlp(&stats, queue_depth);
    kactivator_telemetry::metrics::run(config, resource, collect, counters, finish).await
}

/// The export counters as Prometheus counters, read at each scrape:
/// `kactivator_metrics_exports_total`, `kactivator_metrics_export_failures_total` and
/// `kactivator_metrics_data_points_rejected_total`.
pub struct ExportMetrics {
    counters: Arc<MetricsExportCounters>,
    descs: [Desc; 3],
}

type Read = fn(&MetricsCountersSnapshot) -> u64;

/// Each counter: name, help, and its value in a snapshot.
const COUNTERS: [(&str, &str, Read); 3] = [
    (
        "kactivator_metrics_exports_total",
        "Request-metrics exports over OTLP that the collector took.",
        |now| now.exports,
    ),
    (
        "kactivator_metrics_export_failures_total",
        "Request-metrics exports over OTLP that failed: refused, timed out or answered with an error.",
        |now| now.failures,
    ),
    (
        "kactivator_metrics_data_points_rejected_total",
        "Data points a metrics collector said it rejected, in exports it took.",
        |now| now.data_points_rejected,
    ),
];

impl ExportMetrics {
    pub fn new(counters: Arc<MetricsExportCounters>) -> Self {
        let descs = COUNTERS.map(|(name, help, _)| {
            Desc::new(name.into(), help.into(), Vec::new(), HashMap::new())
                .expect("the names and help are constants that make a valid description")
        });
        Self { counters, descs }
    }
}

impl Collector for ExportMetrics {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let now = self.counters.snapshot();
        self.descs
            .iter()
            .zip(COUNTERS)
            .map(|(desc, (_, _, read))| family(desc, &[(None, read(&now))]))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use prometheus::{Encoder, TextEncoder};

    use super::*;

    #[test]
    fn the_export_counters_are_on_the_metrics_page() {
        let counters = Arc::new(MetricsExportCounters::default());
        let registry = prometheus::Registry::new();
        registry
            .register(Box::new(ExportMetrics::new(counters.clone())))
            .unwrap();
        counters.exports.fetch_add(3, Ordering::Relaxed);
        counters.failures.fetch_add(2, Ordering::Relaxed);
        counters
            .data_points_rejected
            .fetch_add(1, Ordering::Relaxed);
        let mut text = Vec::new();
        TextEncoder::new()
            .encode(&registry.gather(), &mut text)
            .unwrap();
        let text = String::from_utf8(text).unwrap();
        for line in [
            "# TYPE kactivator_metrics_exports_total counter\n",
            "kactivator_metrics_exports_total 3\n",
            "kactivator_metrics_export_failures_total 2\n",
            "kactivator_metrics_data_points_rejected_total 1\n",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
    }
}
