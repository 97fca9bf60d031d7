//! Metrics pushed over OTLP, as Knative 1.19+'s queue-proxy pushes its request metrics when
//! `requestMetrics.protocol` is `grpc` or `http/protobuf`: the settings ([`MetricsConfig`]),
//! the neutral snapshot a caller hands over ([`Snapshot`]: gauges and histograms with their
//! attributes; [`crate::encode::metrics`] turns it into OTLP), and the driver ([`run`]).
//!
//! The driver is OpenTelemetry Go's `PeriodicReader` over an OTLP exporter, as knative.dev/pkg
//! builds it (`observability/metrics/provider.go`, release-1.23): every
//! [`MetricsConfig::interval`] it collects (the caller's function reads the counters) and
//! exports, cumulatively (each point from the driver's start); when told to finish it collects
//! and exports once more, as `Shutdown` does. One export at a time, each bounded by the export
//! timeout (the OTLP exporters' default, 10 s); a failed export is counted, logged when the
//! cause changes, and never retried: the next collection carries the totals anyway.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kactivator_api::trace::span::Attribute;
use prost::Message;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::endpoint::{Collector, EndpointError};
use crate::export::{ExportError, ExportFailure, Exported, OtlpClient};
use crate::proto::metrics_collector::ExportMetricsServiceResponse;
use crate::{encode, Resource, DEFAULT_EXPORT_TIMEOUT};

/// How often metrics are exported when the configuration says nothing (or 0): OpenTelemetry
/// Go's `PeriodicReader` default (`OTEL_METRIC_EXPORT_INTERVAL`'s, 60 s).
pub const DEFAULT_EXPORT_INTERVAL: Duration = Duration::from_secs(60);

/// How metrics reach the collector.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MetricsProtocol {
    /// OTLP over gRPC (`opentelemetry.proto.collector.metrics.v1.MetricsService/Export`),
    /// HTTP/2 without TLS.
    Grpc,
    /// OTLP over HTTP/1.1 with a protobuf body: `POST <endpoint>`, to `/v1/metrics` when the
    /// endpoint has no path.
    HttpProtobuf,
}

impl MetricsProtocol {
    /// The name config-observability gives it.
    pub const fn label(self) -> &'static str {
        match self {
            Self::Grpc => "grpc",
            Self::HttpProtobuf => "http/protobuf",
        }
    }
}

/// Where and how often metrics are pushed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricsConfig {
    pub protocol: MetricsProtocol,
    /// The collector, as Knative writes `requestMetrics.endpoint`: `http://host[:port][/path]`,
    /// read as the span exporters read theirs ([`crate::endpoint`]). `https://` is refused: TLS
    /// to collectors is not built.
    pub endpoint: String,
    /// The time between two exports. Defaults to 60 s ([`DEFAULT_EXPORT_INTERVAL`]).
    pub interval: Duration,
}

impl MetricsConfig {
    /// The collector the endpoint names, or why it cannot be used.
    pub fn collector(&self) -> Result<Collector, EndpointError> {
        Collector::parse_metrics(self.protocol, &self.endpoint)
    }
}

// === the snapshot ===

/// Every metric at one moment, cumulative since `start_unix_nanos`.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// When the totals began: every point's `start_time_unix_nano`.
    pub start_unix_nanos: u64,
    /// When they were read: every point's `time_unix_nano`.
    pub time_unix_nanos: u64,
    pub metrics: Vec<Metric>,
}

/// One instrument and its points, named as OpenTelemetry's semantic conventions (or Knative)
/// name it.
#[derive(Clone, Debug, PartialEq)]
pub struct Metric {
    pub name: &'static str,
    pub description: &'static str,
    /// UCUM: `s`, `{request}`.
    pub unit: &'static str,
    pub data: MetricData,
}

#[derive(Clone, Debug, PartialEq)]
pub enum MetricData {
    /// The last value of each series (OTLP's `Gauge`).
    Gauge(Vec<GaugePoint>),
    /// Cumulative explicit-bucket histograms (OTLP's `Histogram`).
    Histogram(Vec<HistogramPoint>),
}

/// One series of a gauge. Integer values only: the one gauge exported counts requests.
#[derive(Clone, Debug, PartialEq)]
pub struct GaugePoint {
    pub attributes: Vec<Attribute>,
    pub value: i64,
}

/// One series of a histogram.
#[derive(Clone, Debug, PartialEq)]
pub struct HistogramPoint {
    pub attributes: Vec<Attribute>,
    /// The sum of the values recorded, in the metric's unit.
    pub sum: f64,
    /// The buckets' upper bounds (inclusive), ascending.
    pub bounds: &'static [f64],
    /// How many values fell in each bucket: one more than `bounds`, the last above them all.
    /// Not cumulative.
    pub bucket_counts: Vec<u64>,
}

impl HistogramPoint {
    /// How many values were recorded: the buckets' total, so that a point always agrees with
    /// itself even when its counters were read while a request was being counted.
    pub fn count(&self) -> u64 {
        self.bucket_counts.iter().sum()
    }
}

// === the driver ===

/// What became of the exports, for the metrics page; all only ever grow.
#[derive(Debug, Default)]
pub struct MetricsExportCounters {
    /// Exports the collector took (the periodic ones and the last).
    pub exports: AtomicU64,
    /// Exports that failed: refused, timed out, or answered with an error.
    pub failures: AtomicU64,
    /// Data points a collector answered it rejected (OTLP's partial success), though the
    /// export succeeded.
    pub data_points_rejected: AtomicU64,
}

/// The counters' values at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetricsCountersSnapshot {
    pub exports: u64,
    pub failures: u64,
    pub data_points_rejected: u64,
}

impl MetricsExportCounters {
    pub fn snapshot(&self) -> MetricsCountersSnapshot {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        MetricsCountersSnapshot {
            exports: read(&self.exports),
            failures: read(&self.failures),
            data_points_rejected: read(&self.data_points_rejected),
        }
    }
}

/// Exports what `collect` reads every `config.interval`, and once more when `finish` fires
/// (or its sender is dropped), then returns. Meant for the control thread's runtime; the
/// caller bounds how long it waits for the last export.
///
/// * `config`: checked by the caller ([`MetricsConfig::collector`]); one it refuses here is
///   logged and nothing is exported.
/// * `collect`: the metrics now; called on the control thread, so it must not block.
/// * `counters`: what became of the exports ([`MetricsExportCounters`]).
///
/// Memory stays bounded: one snapshot and one export in flight, one connection, an answer of
/// at most 64 KiB.
pub async fn run(
    config: MetricsConfig,
    resource: Resource,
    collect: impl FnMut() -> Vec<Metric>,
    counters: Arc<MetricsExportCounters>,
    finish: oneshot::Receiver<()>,
) {
    run_with(
        config,
        DEFAULT_EXPORT_TIMEOUT,
        resource,
        collect,
        counters,
        finish,
    )
    .await
}

/// [`run`] with another export timeout.
pub async fn run_with(
    config: MetricsConfig,
    export_timeout: Duration,
    resource: Resource,
    mut collect: impl FnMut() -> Vec<Metric>,
    counters: Arc<MetricsExportCounters>,
    mut finish: oneshot::Receiver<()>,
) {
    let collector = match config.collector() {
        Ok(collector) => collector,
        Err(error) => {
            tracing::error!(%error, "metrics export refused; no metrics are pushed");
            return;
        }
    };
    let grpc = config.protocol == MetricsProtocol::Grpc;
    let mut client = OtlpClient::new(collector, grpc, export_timeout);
    tracing::info!(
        protocol = config.protocol.label(),
        target = client.target(),
        interval = ?config.interval,
        "request metrics pushed over OTLP"
    );
    let start_unix_nanos = unix_nanos();
    let mut failures = FailureLog::default();
    let mut next = Instant::now() + config.interval;
    loop {
        let last = tokio::select! {
            biased;
            _ = &mut finish => true,
            () = tokio::time::sleep_until(next) => false,
        };
        let snapshot = Snapshot {
            start_unix_nanos,
            time_unix_nanos: unix_nanos(),
            metrics: collect(),
        };
        let message = encode::metrics::request(&snapshot, &resource).encode_to_vec();
        let exported = bounded(
            export_timeout,
            client.export::<ExportMetricsServiceResponse>(message),
        )
        .await
        .map_err(|failure| ExportError {
            target: client.target().to_owned(),
            failure,
        });
        failures.record(&exported, &counters);
        if last {
            return;
        }
        // A period that an export overran is skipped, as a ticker skips it: never two at once.
        let now = Instant::now();
        next += config.interval;
        if next <= now {
            next = now + config.interval;
        }
    }
}

async fn bounded(
    timeout: Duration,
    export: impl Future<Output = Result<Exported, ExportFailure>>,
) -> Result<Exported, ExportFailure> {
    tokio::time::timeout(timeout, export)
        .await
        .unwrap_or(Err(ExportFailure::TimedOut(timeout)))
}

fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos() as u64)
}

/// Counts every export and logs only changes: the first failure of a cause, and the first
/// success after failures. A collector that stays down costs one line, not one per period.
#[derive(Debug, Default)]
struct FailureLog {
    /// The cause of the failures under way ([`ExportFailure::label`]).
    failing: Option<&'static str>,
    /// Failures since the last line.
    unlogged: u64,
}

impl FailureLog {
    fn record(
        &mut self,
        exported: &Result<Exported, ExportError>,
        counters: &MetricsExportCounters,
    ) {
        match exported {
            Ok(exported) => {
                counters.exports.fetch_add(1, Ordering::Relaxed);
                counters
                    .data_points_rejected
                    .fetch_add(exported.rejected, Ordering::Relaxed);
                if exported.rejected > 0 {
                    tracing::warn!(
                        rejected = exported.rejected,
                        reason = exported.message,
                        "the metrics collector rejected data points"
                    );
                }
                if self.failing.take().is_some() {
                    // Taken outside the macro, which skips its fields when nothing listens.
                    let failures = std::mem::take(&mut self.unlogged);
                    tracing::info!(failures, "metrics export succeeds again");
                }
            }
            Err(error) => {
                counters.failures.fetch_add(1, Ordering::Relaxed);
                self.unlogged += 1;
                let cause = error.failure.label();
                if self.failing != Some(cause) {
                    self.failing = Some(cause);
                    let failures = std::mem::take(&mut self.unlogged);
                    tracing::warn!(
                        %error,
                        cause,
                        failures,
                        "metrics export failed; the next one carries the totals"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(label: &str) -> Result<Exported, ExportError> {
        let failure = match label {
            "connect" => ExportFailure::Connect(std::io::ErrorKind::ConnectionRefused.into()),
            _ => ExportFailure::TimedOut(Duration::from_secs(10)),
        };
        Err(ExportError {
            target: "http://otel:4318/v1/metrics".into(),
            failure,
        })
    }

    #[test]
    fn every_export_is_counted_and_only_a_change_of_cause_is_logged() {
        let counters = MetricsExportCounters::default();
        let mut log = FailureLog::default();
        log.record(&Ok(Exported::default()), &counters);
        assert_eq!(log.failing, None);
        log.record(&failed("connect"), &counters);
        assert_eq!((log.failing, log.unlogged), (Some("connect"), 0), "logged");
        log.record(&failed("connect"), &counters);
        log.record(&failed("connect"), &counters);
        assert_eq!((log.failing, log.unlogged), (Some("connect"), 2), "quiet");
        log.record(&failed("timeout"), &counters);
        assert_eq!((log.failing, log.unlogged), (Some("timeout"), 0), "logged");
        log.record(
            &Ok(Exported {
                rejected: 2,
                message: "bad unit".into(),
                bytes: 0,
            }),
            &counters,
        );
        assert_eq!((log.failing, log.unlogged), (None, 0), "recovery logged");
        assert_eq!(
            counters.snapshot(),
            MetricsCountersSnapshot {
                exports: 2,
                failures: 4,
                data_points_rejected: 2,
            }
        );
    }

    #[test]
    fn a_histograms_count_is_its_buckets_total() {
        let point = HistogramPoint {
            attributes: Vec::new(),
            sum: 1.0,
            bounds: &[0.1, 1.0],
            bucket_counts: vec![2, 0, 5],
        };
        assert_eq!(point.count(), 7);
    }
}
