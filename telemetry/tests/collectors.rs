//! The real exporters against real receivers built from the official definitions
//! (`kactivator_testkit::collector`, `otel_receiver.py`: grpcio with the `opentelemetry-proto`
//! package's TraceService and MetricsService, an
//! OTLP/HTTP server decoding with the same package, and a Zipkin server that checks every span
//! against Zipkin's v2 model). The drivers run on a thread of their own with a current-thread
//! runtime, as on the control thread; the tests feed the span driver as a shard would
//! (`try_send`), and hand the metrics driver a function that reads made-up counters.

use std::borrow::Cow;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use kactivator_api::trace::span::{
    Attribute, AttributeValue, FinishedSpan, SpanBatch, SpanKind, SpanStatus,
};
use kactivator_api::trace::{SpanId, TraceId};
use kactivator_telemetry::metrics::{
    GaugePoint, HistogramPoint, Metric, MetricData, MetricsCountersSnapshot, MetricsExportCounters,
};
use kactivator_telemetry::{
    run_with, BatchConfig, CountersSnapshot, ExportCounters, MetricsConfig, MetricsProtocol,
    Resource, TraceProtocol, TracingConfig,
};
use kactivator_testkit::collector::Collector as Receiver;
use serde_json::{json, Value};
use tokio::sync::watch;

/// The longest any awaited condition may take before the test fails.
const WAIT: Duration = Duration::from_secs(20);
/// Short times so the failure tests run in seconds; sizes as OpenTelemetry's defaults.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(1);
const SCHEDULE_DELAY: Duration = Duration::from_millis(20);

// === the driver ===

/// The driver on its own thread, fed as the shards feed it.
struct Exporting {
    spans: Option<flume::Sender<SpanBatch>>,
    counters: Arc<ExportCounters>,
    thread: Option<thread::JoinHandle<()>>,
    _config: watch::Sender<TracingConfig>,
}

impl Exporting {
    fn to(protocol: TraceProtocol, endpoint: String) -> Exporting {
        let config = TracingConfig {
            protocol,
            endpoint,
            sampling_rate: 1.0,
        };
        config.validate().unwrap();
        let (config_tx, config_rx) = watch::channel(config);
        let (spans, spans_rx) = flume::bounded(64);
        let counters = Arc::new(ExportCounters::default());
        let batch = BatchConfig {
            schedule_delay: SCHEDULE_DELAY,
            export_timeout: EXPORT_TIMEOUT,
            ..BatchConfig::default()
        };
        let thread = thread::spawn({
            let counters = Arc::clone(&counters);
            move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(run_with(
                    batch,
                    config_rx,
                    spans_rx,
                    resource(),
                    counters,
                    |_| {},
                ));
            }
        });
        Exporting {
            spans: Some(spans),
            counters,
            thread: Some(thread),
            _config: config_tx,
        }
    }

    /// Hands spans over as a shard does: `try_send`, which must never find the channel full.
    fn send(&self, spans: Vec<FinishedSpan>) {
        let batch = SpanBatch { spans, dropped: 0 };
        self.spans
            .as_ref()
            .unwrap()
            .try_send(batch)
            .expect("the driver keeps the channel drained");
    }

    fn wait_until(
        &self,
        what: &str,
        condition: impl Fn(&CountersSnapshot) -> bool,
    ) -> CountersSnapshot {
        let deadline = Instant::now() + WAIT;
        loop {
            let counters = self.counters.snapshot();
            if condition(&counters) {
                return counters;
            }
            assert!(
                Instant::now() < deadline,
                "waited {WAIT:?} for {what}; counters: {counters:?}"
            );
            thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Exporting {
    fn drop(&mut self) {
        // Closing the channel ends the driver once what is queued has been tried.
        self.spans = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

// === spans ===

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const ROOT_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const CALLER: &str = "00f067aa0ba902b7";
const SERVER: &str = "1111111111111111";
const WAIT_SPAN: &str = "2222222222222222";
const CLIENT: &str = "3333333333333333";
const ROOT: &str = "4444444444444444";

fn resource() -> Resource {
    Resource {
        service_name: "activator".into(),
        instance_id: Some("activator-5d4c7b9f8-x2x7q".into()),
        attributes: vec![("k8s.namespace.name".into(), "knative-serving".into())],
    }
}

fn trace_id(hex: &str) -> TraceId {
    TraceId::new(u128::from_str_radix(hex, 16).unwrap().to_be_bytes()).unwrap()
}

fn span_id(hex: &str) -> SpanId {
    SpanId::new(u64::from_str_radix(hex, 16).unwrap().to_be_bytes()).unwrap()
}

fn now_nanos() -> u64 {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    u64::try_from(since_epoch.as_nanos()).unwrap()
}

/// One proxied request as a shard records it (a server span whose parent is the caller's, the
/// wait for a slot inside it, failed, and the request to the pod), and a root span of another
/// trace.
fn proxied_request() -> Vec<FinishedSpan> {
    let start = now_nanos();
    let span = |id: &str, parent: Option<&str>, name: &'static str, kind| FinishedSpan {
        trace_id: trace_id(TRACE),
        span_id: span_id(id),
        parent_span_id: parent.map(span_id),
        name: Cow::Borrowed(name),
        kind,
        start_unix_nanos: start,
        end_unix_nanos: start + 2_500_000,
        status: SpanStatus::Unset,
        attributes: Vec::new(),
    };
    let server = FinishedSpan {
        attributes: vec![
            Attribute::str("http.request.method", "GET"),
            Attribute::int("http.response.status_code", 200),
            Attribute::bool("kactivator.cold_start", true),
            Attribute {
                key: "kactivator.wait_seconds",
                value: AttributeValue::Double(0.25),
            },
        ],
        ..span(SERVER, Some(CALLER), "activator_proxy", SpanKind::Server)
    };
    let wait = FinishedSpan {
        status: SpanStatus::Error(Cow::Borrowed("no capacity: queue full")),
        attributes: vec![Attribute::int("kactivator.attempts", 3)],
        end_unix_nanos: start + 100,
        ..span(WAIT_SPAN, Some(SERVER), "throttler_try", SpanKind::Internal)
    };
    let client = FinishedSpan {
        attributes: vec![Attribute::str("server.address", "10.0.3.7")],
        ..span(CLIENT, Some(SERVER), "HTTP GET", SpanKind::Client)
    };
    let root = FinishedSpan {
        trace_id: trace_id(ROOT_TRACE),
        ..span(ROOT, None, "kn.queueproxy.wait", SpanKind::Internal)
    };
    vec![server, wait, client, root]
}

/// `count` plain spans numbered from `first`: their span ids are the numbers.
fn numbered(first: u64, count: u64) -> Vec<FinishedSpan> {
    let start = now_nanos();
    (first..first + count)
        .map(|id| FinishedSpan {
            trace_id: trace_id(TRACE),
            span_id: SpanId::new(id.to_be_bytes()).unwrap(),
            parent_span_id: None,
            name: Cow::Borrowed("activator_proxy"),
            kind: SpanKind::Server,
            start_unix_nanos: start,
            end_unix_nanos: start + 1_000,
            status: SpanStatus::Unset,
            attributes: Vec::new(),
        })
        .collect()
}

/// The numbers of received spans (OTLP or Zipkin), sorted.
fn numbers(spans: &[Value]) -> Vec<u64> {
    let mut numbers: Vec<u64> = spans
        .iter()
        .map(|span| {
            let id = span["span_id"]
                .as_str()
                .or(span["zipkin"]["id"].as_str())
                .unwrap();
            u64::from_str_radix(id, 16).unwrap()
        })
        .collect();
    numbers.sort_unstable();
    numbers
}

fn by_id<'a>(spans: &'a [Value], id: &str) -> &'a Value {
    spans
        .iter()
        .find(|span| span["span_id"] == id || span["zipkin"]["id"] == id)
        .unwrap_or_else(|| panic!("span {id} not received: {spans:?}"))
}

/// What an OTLP receiver got, field by field as a user would look at it.
fn assert_otlp_request_received(spans: &[Value], transport: &str) {
    assert_eq!(spans.len(), 4);
    for span in spans {
        assert_eq!(span["transport"], transport);
        assert_eq!(
            span["resource"]["service.name"],
            json!({"string_value": "activator"})
        );
        assert_eq!(
            span["resource"]["service.instance.id"],
            json!({"string_value": "activator-5d4c7b9f8-x2x7q"})
        );
        assert_eq!(span["scope"]["name"], "kactivator");
        assert_eq!(span["flags"], 1, "sampled");
    }
    let server = by_id(spans, SERVER);
    assert_eq!(server["trace_id"], TRACE);
    assert_eq!(server["parent_span_id"], CALLER);
    assert_eq!(server["name"], "activator_proxy");
    assert_eq!(server["kind"], "SPAN_KIND_SERVER");
    assert_eq!(server["status"]["code"], "STATUS_CODE_UNSET");
    assert_eq!(
        server["end_time_unix_nano"].as_u64().unwrap()
            - server["start_time_unix_nano"].as_u64().unwrap(),
        2_500_000
    );
    assert_eq!(
        server["attributes"],
        json!({
            "http.request.method": {"string_value": "GET"},
            "http.response.status_code": {"int_value": 200},
            "kactivator.cold_start": {"bool_value": true},
            "kactivator.wait_seconds": {"double_value": 0.25},
        })
    );
    let wait = by_id(spans, WAIT_SPAN);
    assert_eq!(wait["trace_id"], TRACE);
    assert_eq!(wait["parent_span_id"], SERVER);
    assert_eq!(wait["kind"], "SPAN_KIND_INTERNAL");
    assert_eq!(wait["status"]["code"], "STATUS_CODE_ERROR");
    assert_eq!(wait["status"]["message"], "no capacity: queue full");
    assert_eq!(
        wait["attributes"],
        json!({"kactivator.attempts": {"int_value": 3}})
    );
    let client = by_id(spans, CLIENT);
    assert_eq!(client["parent_span_id"], SERVER);
    assert_eq!(client["kind"], "SPAN_KIND_CLIENT");
    assert_eq!(client["name"], "HTTP GET");
    let root = by_id(spans, ROOT);
    assert_eq!(root["trace_id"], ROOT_TRACE);
    assert_eq!(root["parent_span_id"], "", "a root has no parent");
}

// === delivery ===

#[test]
fn otlp_http_delivers_trace_ids_parents_names_kinds_attributes_and_status() {
    let mut receiver = Receiver::start();
    let exporting = Exporting::to(
        TraceProtocol::HttpProtobuf,
        format!("http://127.0.0.1:{}", receiver.http),
    );
    exporting.send(proxied_request());
    let first = receiver.wait_for("the first post", |e| e["event"] == "request");
    let spans = receiver.spans(4);
    assert_otlp_request_received(&spans, "otlp-http");
    // No path in the endpoint: OTLP's default path, as Knative's exporter posts.
    assert!(spans.iter().all(|span| span["path"] == "/v1/traces"));
    let counted = exporting.wait_until("the export counted", |c| c.spans_exported == 4);
    assert_eq!(
        Some(counted.bytes_exported),
        first["bytes"].as_u64(),
        "the bytes counted are the body the collector read"
    );
    // The next post goes over the same kept-alive connection.
    exporting.send(numbered(1, 3));
    let second = receiver.wait_for("the second post", |e| e["event"] == "request");
    assert_eq!(numbers(&receiver.spans(3)), [1, 2, 3]);
    assert_eq!(first["peer"], second["peer"]);
}

#[test]
fn otlp_http_posts_to_the_path_the_endpoint_names() {
    let mut receiver = Receiver::start();
    let exporting = Exporting::to(
        TraceProtocol::HttpProtobuf,
        format!("http://127.0.0.1:{}/otlp/v1/traces", receiver.http),
    );
    exporting.send(numbered(1, 2));
    let spans = receiver.spans(2);
    assert!(
        spans.iter().all(|span| span["path"] == "/otlp/v1/traces"),
        "{spans:?}"
    );
}

#[test]
fn otlp_grpc_delivers_trace_ids_parents_names_kinds_attributes_and_status() {
    let mut receiver = Receiver::start();
    let exporting = Exporting::to(
        TraceProtocol::Grpc,
        format!("http://127.0.0.1:{}", receiver.grpc),
    );
    exporting.send(proxied_request());
    let first = receiver.wait_for("the first call", |e| e["event"] == "request");
    let spans = receiver.spans(4);
    assert_otlp_request_received(&spans, "grpc");
    exporting.wait_until("the export counted", |c| c.spans_exported == 4);
    // The next call goes over the same HTTP/2 connection.
    exporting.send(numbered(1, 3));
    let second = receiver.wait_for("the second call", |e| e["event"] == "request");
    assert_eq!(numbers(&receiver.spans(3)), [1, 2, 3]);
    assert_eq!(first["peer"], second["peer"]);
    exporting.wait_until("the second export counted", |c| c.spans_exported == 7);
}

#[test]
fn zipkin_spans_pass_the_v2_model_rules_and_carry_the_trace() {
    let mut receiver = Receiver::start();
    let exporting = Exporting::to(
        TraceProtocol::Zipkin,
        format!("http://127.0.0.1:{}/api/v2/spans", receiver.http),
    );
    exporting.send(proxied_request());
    // The receiver refuses (and the test fails on) any span that breaks the model's rules.
    let spans = receiver.spans(4);
    assert!(spans.iter().all(|span| span["transport"] == "zipkin"));
    assert!(spans.iter().all(|span| span["path"] == "/api/v2/spans"));
    let server = &by_id(&spans, SERVER)["zipkin"];
    assert_eq!(server["traceId"], TRACE);
    assert_eq!(server["parentId"], CALLER);
    assert_eq!(server["kind"], "SERVER");
    assert_eq!(server["name"], "activator_proxy");
    assert_eq!(server["duration"], 2_500);
    assert_eq!(server["localEndpoint"], json!({"serviceName": "activator"}));
    assert_eq!(server["tags"]["http.response.status_code"], "200");
    assert_eq!(server["tags"]["kactivator.cold_start"], "true");
    let wait = &by_id(&spans, WAIT_SPAN)["zipkin"];
    assert_eq!(wait["parentId"], SERVER);
    assert!(wait.get("kind").is_none(), "internal spans have no kind");
    assert_eq!(wait["tags"]["error"], "no capacity: queue full");
    assert_eq!(wait["tags"]["otel.status_code"], "ERROR");
    assert_eq!(
        wait["duration"], 1,
        "100 ns rounds up to the model's minimum"
    );
    assert_eq!(by_id(&spans, CLIENT)["zipkin"]["kind"], "CLIENT");
    let root = &by_id(&spans, ROOT)["zipkin"];
    assert_eq!(root["traceId"], ROOT_TRACE);
    assert!(root.get("parentId").is_none(), "a root has no parentId");
    exporting.wait_until("the export counted", |c| c.spans_exported == 4);
}

// === collectors that fail ===

/// `port`: the receiver's for `protocol`.
fn failing_collector_costs_nothing(receiver: &mut Receiver, protocol: TraceProtocol, port: u16) {
    let transport = if protocol == TraceProtocol::Grpc {
        "grpc"
    } else {
        "http"
    };
    let exporting = Exporting::to(protocol, format!("http://127.0.0.1:{port}"));
    receiver.mode(transport, "fail");
    exporting.send(numbered(1, 3));
    let request = receiver.wait_for("the failed request", |e| e["event"] == "request");
    assert_eq!(request["mode"], "fail");
    exporting.wait_until("the failure counted", |c| {
        c.export_failures == 1 && c.spans_dropped_export_failed == 3
    });
    receiver.mode(transport, "ok");
    exporting.send(numbered(4, 3));
    // The failed batch is not retried: only the new spans arrive.
    assert_eq!(numbers(&receiver.spans(3)), [4, 5, 6]);
    let counters = exporting.wait_until("the export counted", |c| c.spans_exported == 3);
    assert_eq!(counters.export_failures, 1);
}

#[test]
fn an_otlp_http_collector_answering_500_costs_nothing_and_later_batches_arrive() {
    let mut receiver = Receiver::start();
    let port = receiver.http;
    failing_collector_costs_nothing(&mut receiver, TraceProtocol::HttpProtobuf, port);
}

#[test]
fn an_otlp_grpc_collector_answering_unavailable_costs_nothing_and_later_batches_arrive() {
    let mut receiver = Receiver::start();
    let port = receiver.grpc;
    failing_collector_costs_nothing(&mut receiver, TraceProtocol::Grpc, port);
}

fn collector_down_then_back(protocol: TraceProtocol) {
    let mut receiver = Receiver::start();
    let (transport, port) = match protocol {
        TraceProtocol::Grpc => ("grpc", receiver.grpc),
        _ => ("http", receiver.http),
    };
    let exporting = Exporting::to(protocol, format!("http://127.0.0.1:{port}"));
    exporting.send(numbered(1, 3));
    assert_eq!(numbers(&receiver.spans(3)), [1, 2, 3]);
    exporting.wait_until("the first export counted", |c| c.spans_exported == 3);
    // Down: nothing listens, and the connection the exporter kept is closed.
    receiver.stop(transport);
    exporting.send(numbered(4, 3));
    exporting.wait_until("the failure counted", |c| {
        c.export_failures == 1 && c.spans_dropped_export_failed == 3
    });
    receiver.start_again(transport);
    exporting.send(numbered(7, 3));
    assert_eq!(numbers(&receiver.spans(3)), [7, 8, 9]);
    let counters = exporting.wait_until("the export counted", |c| c.spans_exported == 6);
    assert_eq!(counters.export_failures, 1);
}

#[test]
fn an_otlp_http_collector_that_is_down_costs_nothing_and_later_batches_arrive() {
    collector_down_then_back(TraceProtocol::HttpProtobuf);
}

#[test]
fn an_otlp_grpc_collector_that_is_down_costs_nothing_and_later_batches_arrive() {
    collector_down_then_back(TraceProtocol::Grpc);
}

fn collector_never_answering(protocol: TraceProtocol) {
    let mut receiver = Receiver::start();
    let (transport, port) = match protocol {
        TraceProtocol::Grpc => ("grpc", receiver.grpc),
        _ => ("http", receiver.http),
    };
    let exporting = Exporting::to(protocol, format!("http://127.0.0.1:{port}"));
    receiver.mode(transport, "hang");
    // A full batch goes out at once, and is held.
    exporting.send(numbered(1, 512));
    let held = receiver.wait_for("the held request", |e| e["event"] == "request");
    assert_eq!(
        (held["mode"].as_str(), held["spans"].as_u64()),
        (Some("hang"), Some(512))
    );
    // 3000 more, as 30 shard batches: every try_send finds room, the driver drains the
    // channel while its export hangs, queues 2048 and drops the rest.
    for first in (513..3513).step_by(100) {
        exporting.send(numbered(first, 100));
    }
    exporting.wait_until("the queue's overflow counted", |c| {
        c.spans_dropped_queue_full == 3000 - 2048
    });
    // The export times out and counts as failed; the collector answers again.
    exporting.wait_until("the timeout counted", |c| c.export_failures >= 1);
    receiver.mode(transport, "ok");
    // Every span ends counted once: exported, failed with a held batch, or dropped.
    let counters = exporting.wait_until("every span accounted for", |c| {
        c.spans_exported + c.spans_dropped_export_failed + c.spans_dropped_queue_full == 3512
    });
    assert!(counters.spans_exported > 0, "{counters:?}");
    assert_eq!(
        counters.spans_dropped_export_failed,
        512 * counters.export_failures
    );
    // What the collector received is exactly what was counted as exported, never a span of the
    // held batch.
    let received = numbers(&receiver.spans(counters.spans_exported as usize));
    assert!(received.iter().all(|&n| n > 512), "{received:?}");
    received
        .windows(2)
        .for_each(|pair| assert!(pair[0] < pair[1], "received twice"));
}

#[test]
fn an_otlp_http_collector_that_never_answers_costs_nothing_and_later_batches_arrive() {
    collector_never_answering(TraceProtocol::HttpProtobuf);
}

#[test]
fn an_otlp_grpc_collector_that_never_answers_costs_nothing_and_later_batches_arrive() {
    collector_never_answering(TraceProtocol::Grpc);
}

// === metrics ===

/// The metrics driver on its own thread, as on the control thread; `collect` returns a gauge
/// whose value counts the collections, and a histogram.
struct Pushing {
    counters: Arc<MetricsExportCounters>,
    collections: Arc<std::sync::atomic::AtomicU64>,
    finish: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

const BOUNDS: [f64; 2] = [0.005, 0.01];

impl Pushing {
    fn to(protocol: MetricsProtocol, endpoint: String, interval: Duration) -> Pushing {
        let config = MetricsConfig {
            protocol,
            endpoint,
            interval,
        };
        config.collector().unwrap();
        let counters = Arc::new(MetricsExportCounters::default());
        let collections = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (finish, finish_rx) = tokio::sync::oneshot::channel();
        let thread = thread::spawn({
            let counters = Arc::clone(&counters);
            let collections = Arc::clone(&collections);
            move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let collect = move || {
                    let n = collections.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    vec![
                        Metric {
                            name: "kn.serving.queue.depth",
                            description: "Number of current requests in the queue",
                            unit: "{request}",
                            data: MetricData::Gauge(vec![GaugePoint {
                                attributes: Vec::new(),
                                value: n as i64,
                            }]),
                        },
                        Metric {
                            name: "http.server.request.duration",
                            description: "Duration of HTTP server requests.",
                            unit: "s",
                            data: MetricData::Histogram(vec![HistogramPoint {
                                attributes: vec![Attribute::int("http.response.status_code", 200)],
                                sum: 0.02,
                                bounds: &BOUNDS,
                                bucket_counts: vec![1, 0, 1],
                            }]),
                        },
                    ]
                };
                runtime.block_on(kactivator_telemetry::metrics::run_with(
                    config,
                    EXPORT_TIMEOUT,
                    resource(),
                    collect,
                    counters,
                    finish_rx,
                ));
            }
        });
        Pushing {
            counters,
            collections,
            finish: Some(finish),
            thread: Some(thread),
        }
    }

    /// Tells the driver to finish and waits until it has; answers how long that took.
    fn finish(&mut self) -> Duration {
        let started = Instant::now();
        let _ = self.finish.take().unwrap().send(());
        self.thread.take().unwrap().join().unwrap();
        started.elapsed()
    }

    fn wait_until(
        &self,
        what: &str,
        condition: impl Fn(&MetricsCountersSnapshot) -> bool,
    ) -> MetricsCountersSnapshot {
        let deadline = Instant::now() + WAIT;
        loop {
            let counters = self.counters.snapshot();
            if condition(&counters) {
                return counters;
            }
            assert!(
                Instant::now() < deadline,
                "waited {WAIT:?} for {what}; counters: {counters:?}"
            );
            thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Pushing {
    fn drop(&mut self) {
        if let Some(finish) = self.finish.take() {
            let _ = finish.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn gauge_value(event: &Value) -> u64 {
    event["points"][0]["value"].as_u64().unwrap()
}

#[test]
fn metrics_are_pushed_every_interval_over_otlp_http_and_grpc() {
    let mut receiver = Receiver::start();
    let cases = [
        (
            MetricsProtocol::HttpProtobuf,
            format!("http://127.0.0.1:{}", receiver.http),
            "otlp-http",
            "/v1/metrics",
        ),
        (
            MetricsProtocol::Grpc,
            format!("http://127.0.0.1:{}", receiver.grpc),
            "grpc",
            "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
        ),
    ];
    for (protocol, endpoint, transport, path) in cases {
        let pushing = Pushing::to(protocol, endpoint, Duration::from_millis(50));
        // Two periods, two collections, in order: one export each (the previous case's last
        // export may still be on its way: this transport's only).
        let mut next = |name: &str| {
            receiver.wait_for(name, |event| {
                event["event"] == "metric"
                    && event["name"] == name
                    && event["transport"] == transport
            })
        };
        let first = next("kn.serving.queue.depth");
        let second = next("kn.serving.queue.depth");
        let histogram = next("http.server.request.duration");
        assert_eq!((gauge_value(&first), gauge_value(&second)), (1, 2));
        assert_eq!(first["transport"], transport);
        assert_eq!(first["path"], path);
        assert_eq!(first["type"], "gauge");
        assert_eq!(first["unit"], "{request}");
        assert_eq!(
            first["resource"],
            json!({
                "service.name": {"string_value": "activator"},
                "service.instance.id": {"string_value": "activator-5d4c7b9f8-x2x7q"},
                "k8s.namespace.name": {"string_value": "knative-serving"},
            })
        );
        assert_eq!(first["scope"]["name"], "kactivator");
        let (start, time) = (
            first["points"][0]["start_time_unix_nano"].as_u64().unwrap(),
            second["points"][0]["time_unix_nano"].as_u64().unwrap(),
        );
        assert_eq!(
            second["points"][0]["start_time_unix_nano"]
                .as_u64()
                .unwrap(),
            start,
            "cumulative: one start for every export"
        );
        assert!(time > start);
        assert_eq!(histogram["type"], "histogram");
        assert_eq!(
            histogram["temporality"],
            "AGGREGATION_TEMPORALITY_CUMULATIVE"
        );
        let point = &histogram["points"][0];
        assert_eq!(
            point["attributes"],
            json!({"http.response.status_code": {"int_value": 200}})
        );
        assert_eq!(point["count"], 2);
        assert_eq!(point["sum"], 0.02);
        assert_eq!(point["bucket_counts"], json!([1, 0, 1]));
        assert_eq!(point["explicit_bounds"], json!([0.005, 0.01]));
        pushing.wait_until("two exports", |now| now.exports >= 2);
        assert_eq!(pushing.counters.snapshot().failures, 0);
    }
}

#[test]
fn finishing_collects_and_exports_once_more() {
    let mut receiver = Receiver::start();
    let endpoint = format!("http://127.0.0.1:{}/v1/metrics", receiver.http);
    // An interval no test reaches: the only export is the last one.
    let mut pushing = Pushing::to(
        MetricsProtocol::HttpProtobuf,
        endpoint,
        Duration::from_secs(3600),
    );
    assert!(receiver
        .within(Duration::from_millis(200), |event| event["event"]
            == "metric")
        .is_none());
    pushing.finish();
    let last = receiver.metric("kn.serving.queue.depth");
    assert_eq!(gauge_value(&last), 1);
    assert_eq!(
        pushing
            .collections
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    assert_eq!(pushing.counters.snapshot().exports, 1);
}

#[test]
fn a_failing_or_silent_collector_is_counted_and_finishing_stays_bounded() {
    let mut receiver = Receiver::start();
    receiver.mode("http", "fail");
    let endpoint = format!("http://127.0.0.1:{}/v1/metrics", receiver.http);
    let mut pushing = Pushing::to(
        MetricsProtocol::HttpProtobuf,
        endpoint,
        Duration::from_millis(20),
    );
    // Every period is tried again with the totals; none is retried in between.
    let failed = pushing.wait_until("three failed exports", |now| now.failures >= 3);
    assert_eq!(failed.exports, 0);
    // A collector that never answers: the last export gives up after the export timeout.
    receiver.mode("http", "hang");
    let took = pushing.finish();
    assert!(
        took < EXPORT_TIMEOUT * 3,
        "finishing took {took:?} with a silent collector"
    );
    assert_eq!(pushing.counters.snapshot().exports, 0);

    // A collector that is down: a refused connection, counted.
    receiver.stop("grpc");
    let endpoint = format!("http://127.0.0.1:{}", receiver.grpc);
    let mut pushing = Pushing::to(MetricsProtocol::Grpc, endpoint, Duration::from_millis(20));
    pushing.wait_until("two failed exports", |now| now.failures >= 2);
    assert!(pushing.finish() < EXPORT_TIMEOUT);
    assert_eq!(pushing.counters.snapshot().exports, 0);
}
