//! A metric snapshot into OTLP's `ExportMetricsServiceRequest`: one `ResourceMetrics` for this
//! process, one `ScopeMetrics` for kactivator, every point with the snapshot's start and time
//! and, for histograms, cumulative temporality (what OpenTelemetry Go's SDK exports by
//! default).

use crate::encode::otlp::{attribute, resource_of, scope};
use crate::metrics::{Metric, MetricData, Snapshot};
use crate::proto::metrics::{
    metric, number_data_point, AggregationTemporality, Gauge, Histogram, HistogramDataPoint,
    Metric as ProtoMetric, NumberDataPoint, ResourceMetrics, ScopeMetrics,
};
use crate::proto::metrics_collector::ExportMetricsServiceRequest;
use crate::Resource;

/// The request that exports `snapshot` on behalf of `resource`.
pub fn request(snapshot: &Snapshot, resource: &Resource) -> ExportMetricsServiceRequest {
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(resource_of(resource)),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(scope()),
                metrics: snapshot
                    .metrics
                    .iter()
                    .map(|one| encode_metric(one, snapshot))
                    .collect(),
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

fn encode_metric(one: &Metric, snapshot: &Snapshot) -> ProtoMetric {
    let (start, time) = (snapshot.start_unix_nanos, snapshot.time_unix_nanos);
    let data = match &one.data {
        MetricData::Gauge(points) => metric::Data::Gauge(Gauge {
            data_points: points
                .iter()
                .map(|point| NumberDataPoint {
                    attributes: point.attributes.iter().map(attribute).collect(),
                    start_time_unix_nano: start,
                    time_unix_nano: time,
                    value: Some(number_data_point::Value::AsInt(point.value)),
                    ..Default::default()
                })
                .collect(),
        }),
        MetricData::Histogram(points) => metric::Data::Histogram(Histogram {
            data_points: points
                .iter()
                .map(|point| HistogramDataPoint {
                    attributes: point.attributes.iter().map(attribute).collect(),
                    start_time_unix_nano: start,
                    time_unix_nano: time,
                    count: point.count(),
                    sum: Some(point.sum),
                    bucket_counts: point.bucket_counts.clone(),
                    explicit_bounds: point.bounds.to_vec(),
                    ..Default::default()
                })
                .collect(),
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
        }),
    };
    ProtoMetric {
        name: one.name.to_owned(),
        description: one.description.to_owned(),
        unit: one.unit.to_owned(),
        data: Some(data),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use kactivator_api::trace::span::Attribute;
    use prost::Message;

    use super::*;
    use crate::encode::fixtures;
    use crate::metrics::{GaugePoint, HistogramPoint};
    use crate::proto::common::any_value::Value;

    const START: u64 = 1_704_164_645_000_000_000;
    const TIME: u64 = START + 60_000_000_000;
    const BOUNDS: [f64; 3] = [0.005, 0.01, 0.1];

    fn snapshot() -> Snapshot {
        Snapshot {
            start_unix_nanos: START,
            time_unix_nanos: TIME,
            metrics: vec![
                Metric {
                    name: "kn.serving.queue.depth",
                    description: "Number of current requests in the queue",
                    unit: "{request}",
                    data: MetricData::Gauge(vec![GaugePoint {
                        attributes: Vec::new(),
                        value: 3,
                    }]),
                },
                Metric {
                    name: "http.server.request.duration",
                    description: "Duration of HTTP server requests.",
                    unit: "s",
                    data: MetricData::Histogram(vec![
                        HistogramPoint {
                            attributes: vec![
                                Attribute::int("http.response.status_code", 200),
                                Attribute::str("kn.route.tag", "blue"),
                            ],
                            sum: 0.0125,
                            bounds: &BOUNDS,
                            bucket_counts: vec![1, 1, 0, 0],
                        },
                        HistogramPoint {
                            attributes: vec![Attribute::int("http.response.status_code", 503)],
                            sum: 2.5,
                            bounds: &BOUNDS,
                            bucket_counts: vec![0, 0, 0, 1],
                        },
                    ]),
                },
            ],
        }
    }

    /// Encodes and decodes again, as a collector would read the bytes.
    fn round_trip(snapshot: &Snapshot) -> ExportMetricsServiceRequest {
        let bytes = request(snapshot, &fixtures::resource()).encode_to_vec();
        ExportMetricsServiceRequest::decode(bytes.as_slice()).unwrap()
    }

    #[test]
    fn one_resource_and_one_kactivator_scope_hold_every_metric() {
        let decoded = round_trip(&snapshot());
        assert_eq!(decoded.resource_metrics.len(), 1);
        let resource_metrics = &decoded.resource_metrics[0];
        let attributes = &resource_metrics.resource.as_ref().unwrap().attributes;
        let keys: Vec<_> = attributes.iter().map(|kv| kv.key.as_str()).collect();
        assert_eq!(
            keys,
            ["service.name", "service.instance.id", "k8s.namespace.name"]
        );
        assert_eq!(
            attributes[0].value.as_ref().unwrap().value,
            Some(Value::StringValue("activator".into()))
        );
        assert_eq!(resource_metrics.scope_metrics.len(), 1);
        let scope_metrics = &resource_metrics.scope_metrics[0];
        let scope = scope_metrics.scope.as_ref().unwrap();
        assert_eq!(scope.name, "kactivator");
        assert_eq!(scope.version, env!("CARGO_PKG_VERSION"));
        let names: Vec<_> = scope_metrics
            .metrics
            .iter()
            .map(|m| m.name.as_str())
            .collect();
        assert_eq!(
            names,
            ["kn.serving.queue.depth", "http.server.request.duration"]
        );
    }

    #[test]
    fn a_gauge_is_an_integer_point_with_the_snapshots_times() {
        let decoded = round_trip(&snapshot());
        let gauge = &decoded.resource_metrics[0].scope_metrics[0].metrics[0];
        assert_eq!(gauge.description, "Number of current requests in the queue");
        assert_eq!(gauge.unit, "{request}");
        let Some(metric::Data::Gauge(data)) = &gauge.data else {
            panic!("not a gauge: {gauge:?}")
        };
        assert_eq!(data.data_points.len(), 1);
        let point = &data.data_points[0];
        assert!(point.attributes.is_empty());
        assert_eq!(point.start_time_unix_nano, START);
        assert_eq!(point.time_unix_nano, TIME);
        assert_eq!(point.value, Some(number_data_point::Value::AsInt(3)));
        assert!(point.exemplars.is_empty());
        assert_eq!(point.flags, 0);
    }

    #[test]
    fn a_histogram_is_cumulative_with_its_bounds_buckets_count_and_sum() {
        let decoded = round_trip(&snapshot());
        let histogram = &decoded.resource_metrics[0].scope_metrics[0].metrics[1];
        assert_eq!(histogram.unit, "s");
        assert_eq!(histogram.description, "Duration of HTTP server requests.");
        let Some(metric::Data::Histogram(data)) = &histogram.data else {
            panic!("not a histogram: {histogram:?}")
        };
        assert_eq!(
            data.aggregation_temporality(),
            AggregationTemporality::Cumulative
        );
        let [ok, unavailable] = data.data_points.as_slice() else {
            panic!("two points: {data:?}")
        };
        assert_eq!(ok.start_time_unix_nano, START);
        assert_eq!(ok.time_unix_nano, TIME);
        assert_eq!(ok.explicit_bounds, BOUNDS);
        assert_eq!(ok.bucket_counts, [1, 1, 0, 0]);
        assert_eq!(ok.count, 2, "the buckets' total");
        assert_eq!(ok.sum, Some(0.0125));
        assert_eq!((ok.min, ok.max), (None, None), "not recorded");
        let attributes: Vec<_> = ok
            .attributes
            .iter()
            .map(|kv| (kv.key.as_str(), kv.value.clone().unwrap().value.unwrap()))
            .collect();
        assert_eq!(
            attributes,
            [
                ("http.response.status_code", Value::IntValue(200)),
                ("kn.route.tag", Value::StringValue("blue".into())),
            ]
        );
        assert_eq!(unavailable.count, 1);
        assert_eq!(unavailable.bucket_counts, [0, 0, 0, 1]);
        assert_eq!(unavailable.sum, Some(2.5));
    }

    #[test]
    fn an_empty_snapshot_still_names_the_resource() {
        let decoded = round_trip(&Snapshot {
            start_unix_nanos: START,
            time_unix_nanos: TIME,
            metrics: Vec::new(),
        });
        let resource_metrics = &decoded.resource_metrics[0];
        assert!(resource_metrics.resource.is_some());
        assert!(resource_metrics.scope_metrics[0].metrics.is_empty());
    }
}
