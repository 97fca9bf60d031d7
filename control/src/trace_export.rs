//! The shards' spans to the exporters (issue 39), on the control thread: the tracing in force
//! goes to the shards as a sampler (`ShardCommand::Tracing`) and to the exporters
//! (`kactivator_telemetry::run`), the shards' batches come back through one bounded channel
//! ([`span_channel`]), and what became of every span is on the metrics page
//! ([`ExportMetrics`]).

use std::collections::HashMap;
use std::sync::Arc;

use kactivator_api::trace::span::SpanBatch;
use kactivator_api::trace::Sampler;
use kactivator_shards::routing::ShardCommand;
use kactivator_telemetry::{ExportCounters, Resource, TracingConfig};
use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, LabelPair, Metric, MetricFamily, MetricType};

use crate::publisher::Publisher;

/// Batches the shards may have on their way to the exporters at once; a shard that finds the
/// channel full keeps its spans for its next flush (and drops and counts past its own bound).
pub const SPAN_CHANNEL_BATCHES: usize = 64;

/// The channel every shard's spans go through (`ShardSettings::spans`).
pub fn span_channel() -> (flume::Sender<SpanBatch>, flume::Receiver<SpanBatch>) {
    flume::bounded(SPAN_CHANNEL_BATCHES)
}

/// What the shards are told of `config`: no sampler when tracing is off; else the ratio for
/// new traces (parent-based), a rate outside 0..=1 taken to its nearer end as OpenTelemetry's
/// and OpenCensus' samplers take it.
pub fn sampler(config: &TracingConfig) -> Option<Sampler> {
    if !config.enabled() {
        return None;
    }
    Sampler::new(crate::config::trace::clamped_rate(config.sampling_rate)).ok()
}

/// Exports the shards' spans as `config` says until `finish` fires (the shards have ended and
/// sent their last spans), then exports what is left and returns; each tracing in force goes
/// to every shard first. `registry` gets the export counters.
///
/// `finish` rather than the channel's end: a shard's sender lives in its settings and its
/// tracer, and the end of the process does not wait for every one of them to be dropped.
pub async fn run(
    config: tokio::sync::watch::Receiver<TracingConfig>,
    spans: flume::Receiver<SpanBatch>,
    resource: Resource,
    publisher: Publisher,
    registry: &prometheus::Registry,
    finish: tokio::sync::oneshot::Receiver<()>,
) {
    let counters = Arc::new(ExportCounters::default());
    if let Err(error) = registry.register(Box::new(ExportMetrics::new(counters.clone()))) {
        tracing::warn!("the trace export counters are not on the metrics page: {error}");
    }
    // The exporters read their own channel, which ends when `finish` fires.
    let (to_exporters, for_exporters) = flume::bounded(SPAN_CHANNEL_BATCHES);
    let forward = async move {
        let mut finish = finish;
        loop {
            tokio::select! {
                batch = spans.recv_async() => match batch {
                    Ok(batch) => {
                        if to_exporters.send_async(batch).await.is_err() {
                            return;
                        }
                    }
                    Err(_) => return,
                },
                _ = &mut finish => {
                    while let Ok(batch) = spans.try_recv() {
                        if to_exporters.send_async(batch).await.is_err() {
                            return;
                        }
                    }
                    return;
                }
            }
        }
    };
    let export =
        kactivator_telemetry::run(config, for_exporters, resource, counters, move |config| {
            publisher.broadcast(ShardCommand::Tracing(sampler(config)));
            match config.enabled() {
                true => tracing::info!(
                    protocol = config.protocol.label(),
                    endpoint = %config.endpoint,
                    sampling_rate = config.sampling_rate,
                    "tracing on"
                ),
                false => tracing::info!("tracing off"),
            }
        });
    tokio::join!(forward, export);
}

/// The export counters as Prometheus counters, read at each scrape:
/// `kactivator_trace_spans_exported_total`, `kactivator_trace_spans_dropped_total` by `reason`
/// (`shard_buffer`, `queue_full`, `export_failed`, `rejected`, `tracing_off`) and
/// `kactivator_trace_export_failures_total`, and `kactivator_trace_export_bytes_total`.
pub struct ExportMetrics {
    counters: Arc<ExportCounters>,
    descs: [Desc; 4],
}

const EXPORTED: &str = "kactivator_trace_spans_exported_total";
const DROPPED: &str = "kactivator_trace_spans_dropped_total";
const FAILURES: &str = "kactivator_trace_export_failures_total";
const BYTES: &str = "kactivator_trace_export_bytes_total";

impl ExportMetrics {
    pub fn new(counters: Arc<ExportCounters>) -> Self {
        let desc = |name: &str, help: &str, labels: Vec<String>| {
            Desc::new(name.into(), help.into(), labels, HashMap::new())
                .expect("the names and help are constants that make a valid description")
        };
        Self {
            counters,
            descs: [
                desc(
                    EXPORTED,
                    "Spans a collector accepted, or written to stdout.",
                    Vec::new(),
                ),
                desc(
                    DROPPED,
                    "Spans recorded but never exported, by why.",
                    vec!["reason".into()],
                ),
                desc(
                    FAILURES,
                    "Exports that failed (one per batch): refused, timed out or answered with an error.",
                    Vec::new(),
                ),
                desc(
                    BYTES,
                    "Bytes of span payload in exports that succeeded (OTLP protobuf, Zipkin JSON or stdout lines, before HTTP or gRPC framing).",
                    Vec::new(),
                ),
            ],
        }
    }
}

/// A counter family of `desc`: one sample per `(reason label, value)`, without the label when
/// `None`. Also the request-metrics export counters' (`queue_proxy::request_metrics`).
pub(crate) fn family(desc: &Desc, samples: &[(Option<&str>, u64)]) -> MetricFamily {
    let mut family = MetricFamily::default();
    family.set_name(desc.fq_name.clone());
    family.set_help(desc.help.clone());
    family.set_field_type(MetricType::COUNTER);
    for &(reason, value) in samples {
        let mut counter = Counter::default();
        counter.set_value(value as f64);
        let mut metric = Metric::default();
        if let Some(reason) = reason {
            let mut label = LabelPair::default();
            label.set_name("reason".into());
            label.set_value(reason.into());
            metric.set_label(vec![label]);
        }
        metric.set_counter(counter);
        family.mut_metric().push(metric);
    }
    family
}

impl Collector for ExportMetrics {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let now = self.counters.snapshot();
        vec![
            family(&self.descs[0], &[(None, now.spans_exported)]),
            family(
                &self.descs[1],
                &[
                    (Some("shard_buffer"), now.spans_dropped_by_shards),
                    (Some("queue_full"), now.spans_dropped_queue_full),
                    (Some("export_failed"), now.spans_dropped_export_failed),
                    (Some("rejected"), now.spans_rejected),
                    (Some("tracing_off"), now.spans_dropped_tracing_off),
                ],
            ),
            family(&self.descs[2], &[(None, now.export_failures)]),
            family(&self.descs[3], &[(None, now.bytes_exported)]),
        ]
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use kactivator_telemetry::TraceProtocol;
    use prometheus::{Encoder, TextEncoder};

    use super::*;

    #[test]
    fn the_shards_get_a_sampler_only_while_tracing_is_on_its_rate_kept_in_range() {
        let config = |protocol, rate| TracingConfig {
            protocol,
            endpoint: String::new(),
            sampling_rate: rate,
        };
        assert_eq!(sampler(&TracingConfig::OFF), None);
        assert_eq!(sampler(&config(TraceProtocol::None, 1.0)), None);
        let ratio = |rate| sampler(&config(TraceProtocol::Stdout, rate)).map(|s| s.ratio());
        assert_eq!(ratio(0.25), Some(0.25));
        assert_eq!(ratio(7.0), Some(1.0));
        assert_eq!(ratio(-1.0), Some(0.0));
        assert_eq!(ratio(f64::NAN), Some(0.0));
    }

    #[test]
    fn every_counter_is_on_the_metrics_page() {
        let counters = Arc::new(ExportCounters::default());
        let registry = prometheus::Registry::new();
        registry
            .register(Box::new(ExportMetrics::new(counters.clone())))
            .unwrap();
        counters.spans_exported.store(12, Ordering::Relaxed);
        counters
            .spans_dropped_queue_full
            .store(3, Ordering::Relaxed);
        counters.export_failures.store(2, Ordering::Relaxed);
        counters.bytes_exported.store(4096, Ordering::Relaxed);
        let mut text = Vec::new();
        TextEncoder::new()
            .encode(&registry.gather(), &mut text)
            .unwrap();
        let text = String::from_utf8(text).unwrap();
        for line in [
            "kactivator_trace_spans_exported_total 12",
            "kactivator_trace_spans_dropped_total{reason=\"queue_full\"} 3",
            "kactivator_trace_spans_dropped_total{reason=\"shard_buffer\"} 0",
            "kactivator_trace_export_failures_total 2",
            "kactivator_trace_export_bytes_total 4096",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in {text}");
        }
    }
}
