//! Tracing end to end (issue 39): a client's trace continues through the real activator and
//! the real queue-proxy to the app, each exporting its spans to a collector built from the
//! official OpenTelemetry definitions (`kactivator_testkit::collector`), with the parent links
//! upstream's spans have; the configurations Knative writes (the file's `[tracing]`, 1.23's
//! `OBSERVABILITY_CONFIG`, 1.18's `TRACING_CONFIG_*`) are the ones used; sampling at 0, 1 and
//! 0.5; hostile trace headers replaced; a collector that is down, failing or silent costs no
//! request anything.

mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use kactivator_testkit::backend::{self, BackendConfig};
use kactivator_testkit::collector::Collector;
use kactivator_testkit::grpc;
use kactivator_testkit::ports::free_port;
use serde_json::Value;
use support::queue_proxy::{knative_1_23_env, knative_env, QueueProxy, REVISION};
use support::{curl, eventually, revision, Activator};

/// The client's own span: the parent the activator's server span must name.
const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

fn traceparent(flags: &str) -> String {
    format!("traceparent: 00-{CLIENT_TRACE}-{CLIENT_SPAN}-{flags}")
}

fn app() -> (backend::BackendHandle, u16) {
    let port = free_port();
    let handle = backend::spawn_on(
        SocketAddr::from(([127, 0, 0, 1], port)),
        BackendConfig::named("user-container"),
    )
    .expect("user container");
    (handle, port)
}

/// 1.23's `OBSERVABILITY_CONFIG` with tracing over `protocol` to `endpoint` at `rate`.
fn observability(protocol: &str, endpoint: &str, rate: f64) -> String {
    format!(
        r#"{{"tracing":{{"protocol":"{protocol}","endpoint":"{endpoint}","samplingRate":{rate}}},"metrics":{{"protocol":"none"}},"requestMetrics":{{"protocol":"none"}}}}"#
    )
}

/// A queue-proxy in front of `user_port` under 1.23's environment.
fn queue_proxy(user_port: u16, observability_config: &str) -> QueueProxy {
    let env = knative_1_23_env(user_port, free_port(), 4, observability_config);
    QueueProxy::start_with(env, &["--drain-grace-seconds", "1"])
}

/// An activator routing `default/<REVISION>` to `pod`, with this `[tracing]` table.
fn activator(pod: SocketAddr, tracing: &str) -> Activator {
    Activator::start_with(
        &format!("{tracing}\n\n{}", revision("default", REVISION, &[pod], "")),
        "",
        &["--shards", "2"],
        &[],
    )
}

/// What the app received: its request headers, from the test backend's `/headers`.
fn headers_at_app(answer: &[u8]) -> HashMap<String, Vec<String>> {
    let body: Value = serde_json::from_slice(answer)
        .unwrap_or_else(|error| panic!("{error}: {}", String::from_utf8_lossy(answer)));
    let mut headers: HashMap<String, Vec<String>> = HashMap::new();
    for pair in body["headers"].as_array().expect("headers") {
        headers
            .entry(pair[0].as_str().unwrap().to_ascii_lowercase())
            .or_default()
            .push(pair[1].as_str().unwrap().to_string());
    }
    headers
}

/// GET `/headers` through `to` with `extra` header lines; the app's view of the request.
fn through(to: SocketAddr, extra: &[&str], more_curl: &[&str]) -> HashMap<String, Vec<String>> {
    let url = format!("http://{to}/headers");
    let mut args = vec![
        "-f",
        "-H",
        "Knative-Serving-Namespace: default",
        "-H",
        "Knative-Serving-Revision: hello-00001",
    ];
    for line in extra {
        args.extend(["-H", line]);
    }
    args.extend(more_curl);
    args.push(&url);
    let (ok, out) = curl(&args);
    assert!(ok, "{}", String::from_utf8_lossy(&out));
    headers_at_app(&out)
}

fn one<'h>(headers: &'h HashMap<String, Vec<String>>, name: &str) -> &'h str {
    match headers.get(name).map(Vec::as_slice) {
        Some([value]) => value,
        other => panic!("{name}: {other:?} in {headers:?}"),
    }
}

/// `00-<trace>-<span>-<flags>` split.
fn parts(traceparent: &str) -> (&str, &str, &str) {
    let fields: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(fields.len(), 4, "{traceparent}");
    assert_eq!(fields[0], "00", "{traceparent}");
    (fields[1], fields[2], fields[3])
}

fn by_name<'s>(spans: &'s [Value], service: &str, name: &str) -> &'s Value {
    spans
        .iter()
        .find(|span| span["name"] == name && service_of(span) == service)
        .unwrap_or_else(|| panic!("no {service} span {name:?} in {spans:#?}"))
}

fn service_of(span: &Value) -> &str {
    span["resource"]["service.name"]["string_value"]
        .as_str()
        .unwrap_or_default()
}

/// The done-when of issue 39: ingress → kactivator activator → kactivator queue-proxy → app,
/// one trace, each hop exporting (the activator over OTLP/gRPC from its file, the queue-proxy
/// over OTLP/HTTP from 1.23's `OBSERVABILITY_CONFIG`), with upstream's span names and parent
/// links, and the pod seeing the span of the hop before it.
#[test]
fn a_trace_crosses_activator_and_queue_proxy_to_the_app_with_parent_links() {
    let mut collector = Collector::start();
    let (_app, user_port) = app();
    let qp = queue_proxy(
        user_port,
        &observability(
            "http/protobuf",
            &format!("http://127.0.0.1:{}/v1/traces", collector.http),
            1.0,
        ),
    );
    let activator = activator(
        qp.serving,
        &format!(
            "[tracing]\nprotocol = \"grpc\"\nendpoint = \"http://127.0.0.1:{}\"\nsampling_rate = 1.0",
            collector.grpc
        ),
    );
    let at_app = through(
        activator.http,
        &[&traceparent("01"), "tracestate: vendor=opaque"],
        &[],
    );
    let (trace, app_parent, flags) = parts(one(&at_app, "traceparent"));
    assert_eq!(trace, CLIENT_TRACE, "the client's trace reaches the app");
    assert_eq!(flags, "01");
    assert_eq!(one(&at_app, "tracestate"), "vendor=opaque");
    assert_eq!(one(&at_app, "x-b3-traceid"), CLIENT_TRACE);
    assert_eq!(one(&at_app, "x-b3-spanid"), app_parent);

    // Four spans from each hop.
    let spans = collector.spans_until(|spans| spans.len() >= 8);
    assert!(
        spans.iter().all(|span| span["trace_id"] == CLIENT_TRACE),
        "{spans:#?}"
    );
    let handle = by_name(&spans, "activator", "handle");
    let try_span = by_name(&spans, "activator", "throttler_try");
    let proxy = by_name(&spans, "activator", "activator_proxy");
    let out = by_name(&spans, "activator", "GET");
    assert_eq!(handle["parent_span_id"], CLIENT_SPAN);
    assert_eq!(handle["kind"], "SPAN_KIND_SERVER");
    assert_eq!(try_span["parent_span_id"], handle["span_id"]);
    assert_eq!(proxy["parent_span_id"], handle["span_id"]);
    assert_eq!(out["parent_span_id"], proxy["span_id"]);
    assert_eq!(out["kind"], "SPAN_KIND_CLIENT");
    assert_eq!(
        handle["attributes"]["http.response.status_code"]["int_value"],
        200
    );
    assert_eq!(
        handle["attributes"]["kn.revision.name"]["string_value"],
        REVISION
    );
    assert_eq!(
        handle["attributes"]["kactivator.pod"]["string_value"],
        qp.serving.to_string()
    );
    assert_eq!(out["transport"], "grpc");

    let queue = spans
        .iter()
        .find(|span| span["name"] == "queue")
        .unwrap_or_else(|| panic!("no queue-proxy span in {spans:#?}"));
    assert_eq!(queue["transport"], "otlp-http");
    assert_eq!(
        queue["parent_span_id"], out["span_id"],
        "the queue-proxy continues the activator's client span"
    );
    let service = service_of(queue).to_string();
    let qp_proxy = by_name(&spans, &service, "kn.queueproxy.proxy");
    let qp_wait = by_name(&spans, &service, "kn.queueproxy.wait");
    let qp_out = by_name(&spans, &service, "GET");
    assert_eq!(qp_proxy["parent_span_id"], queue["span_id"]);
    assert_eq!(qp_wait["parent_span_id"], qp_proxy["span_id"]);
    assert_eq!(qp_out["parent_span_id"], qp_proxy["span_id"]);
    assert_eq!(
        qp_out["span_id"], app_parent,
        "the app's parent is the queue-proxy's client span"
    );
}

/// HTTP/2 from the client (h2c, prior knowledge) through the activator's HTTP/2 front to an
/// h2c pod: the same propagation, written into the pod's HTTP/2 header map.
#[test]
fn h2c_requests_carry_the_trace_to_the_pod() {
    let mut collector = Collector::start();
    let pod = grpc::spawn_grpc(BackendConfig::named("h2c-pod")).expect("h2c pod");
    let activator = activator(
        pod.addr(),
        &format!(
            "[tracing]\nprotocol = \"http/protobuf\"\nendpoint = \"http://127.0.0.1:{}\"\nsampling_rate = 1.0",
            collector.http
        ),
    );
    let url = format!("http://{}/", activator.http);
    let sent = traceparent("01");
    let (ok, out) = curl(&[
        "-f",
        "-i",
        "--http2-prior-knowledge",
        "-H",
        "Knative-Serving-Namespace: default",
        "-H",
        "Knative-Serving-Revision: hello-00001",
        "-H",
        &sent,
        &url,
    ]);
    let out = String::from_utf8_lossy(&out);
    assert!(ok, "{out}");
    assert!(out.starts_with("HTTP/2 200"), "{out}");
    let received = out
        .lines()
        .find_map(|line| line.strip_prefix("x-received-traceparent: "))
        .unwrap_or_else(|| panic!("the pod got no traceparent: {out}"))
        .trim();
    let (trace, pod_parent, flags) = parts(received);
    assert_eq!((trace, flags), (CLIENT_TRACE, "01"));
    let spans = collector.spans_until(|spans| spans.len() >= 4);
    let out = by_name(&spans, "activator", "GET");
    assert_eq!(out["span_id"], pod_parent);
    assert_eq!(
        by_name(&spans, "activator", "handle")["parent_span_id"],
        CLIENT_SPAN
    );
}

/// Knative 1.18's queue-proxy environment (`TRACING_CONFIG_*`, Zipkin): spans go to Zipkin's
/// v2 API, each checked against Zipkin's model by the receiver, carrying the client's trace.
#[test]
fn knative_1_18s_zipkin_settings_export_zipkin_spans() {
    let mut collector = Collector::start();
    let (_app, user_port) = app();
    let mut env = knative_env(user_port, free_port(), 0);
    env.insert("TRACING_CONFIG_BACKEND".into(), "zipkin".into());
    env.insert(
        "TRACING_CONFIG_ZIPKIN_ENDPOINT".into(),
        format!("http://127.0.0.1:{}/api/v2/spans", collector.http),
    );
    env.insert("TRACING_CONFIG_SAMPLE_RATE".into(), "1".into());
    env.insert("TRACING_CONFIG_DEBUG".into(), "false".into());
    let qp = QueueProxy::start_with(env, &["--drain-grace-seconds", "1"]);
    let at_app = through(qp.serving, &[&traceparent("01")], &[]);
    let (trace, app_parent, _) = parts(one(&at_app, "traceparent"));
    assert_eq!(trace, CLIENT_TRACE);
    let spans = collector.spans_until(|spans| spans.len() >= 4);
    assert!(
        spans.iter().all(|span| span["transport"] == "zipkin"),
        "{spans:#?}"
    );
    let zipkin: Vec<&Value> = spans.iter().map(|span| &span["zipkin"]).collect();
    assert!(
        zipkin.iter().all(|span| span["traceId"] == CLIENT_TRACE),
        "{zipkin:#?}"
    );
    let client = zipkin
        .iter()
        .find(|span| span["kind"] == "CLIENT")
        .unwrap_or_else(|| panic!("no client span in {zipkin:#?}"));
    assert_eq!(client["id"], app_parent);
    let server = zipkin
        .iter()
        .find(|span| span["kind"] == "SERVER")
        .unwrap_or_else(|| panic!("no server span in {zipkin:#?}"));
    assert_eq!(server["parentId"], CLIENT_SPAN);
}

/// Rate 0: the client's decision is kept (a sampled parent is still traced), a new trace is
/// not sampled, and nothing of it is exported; the pod always gets a valid context. Hostile
/// values are replaced, never forwarded.
#[test]
fn sampling_zero_keeps_the_parents_decision_and_hostile_headers_never_reach_the_pod() {
    let mut collector = Collector::start();
    let (_app, user_port) = app();
    let activator = activator(
        SocketAddr::from(([127, 0, 0, 1], user_port)),
        &format!(
            "[tracing]\nprotocol = \"http/protobuf\"\nendpoint = \"http://127.0.0.1:{}\"\nsampling_rate = 0.0",
            collector.http
        ),
    );
    let hostile = [
        "traceparent: ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "traceparent: 00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        "traceparent: 00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        "b3: not-a-b3-value",
        "X-B3-TraceId: zz",
    ];
    for line in hostile {
        let at_app = through(activator.http, &[line, "tracestate: a=b"], &[]);
        let (trace, _, flags) = parts(one(&at_app, "traceparent"));
        assert_ne!(trace, CLIENT_TRACE, "{line}: a new trace");
        assert_ne!(trace, "00000000000000000000000000000000");
        assert_eq!(flags, "00", "{line}: a new trace at rate 0 is not sampled");
        assert!(
            !at_app.contains_key("tracestate"),
            "{line}: no tracestate without a valid parent"
        );
        assert!(!at_app.contains_key("b3"), "{line}");
        assert_eq!(one(&at_app, "x-b3-traceid"), trace);
    }
    // A sampled parent is followed whatever the rate.
    let at_app = through(activator.http, &[&traceparent("01")], &[]);
    assert_eq!(parts(one(&at_app, "traceparent")).2, "01");
    let spans = collector.spans_until(|spans| spans.len() >= 4);
    assert!(
        spans.iter().all(|span| span["trace_id"] == CLIENT_TRACE),
        "only the sampled parent's trace is exported: {spans:#?}"
    );
    assert!(
        collector
            .within(Duration::from_secs(3), |event| event["event"] == "span")
            .is_none(),
        "nothing else was sampled"
    );
}

/// Rate 0.5, statistically: of 400 new traces, the share sampled is 0.5 within ±0.1 (the
/// chance of a fair coin leaving that band in 400 throws is below 1e-4).
#[test]
fn sampling_half_samples_about_half_of_new_traces() {
    let collector = Collector::start();
    let (_app, user_port) = app();
    let activator = activator(
        SocketAddr::from(([127, 0, 0, 1], user_port)),
        &format!(
            "[tracing]\nprotocol = \"http/protobuf\"\nendpoint = \"http://127.0.0.1:{}\"\nsampling_rate = 0.5",
            collector.http
        ),
    );
    let mut sampled = 0;
    const TRIES: usize = 400;
    for _ in 0..TRIES {
        let at_app = through(activator.http, &[], &[]);
        if parts(one(&at_app, "traceparent")).2 == "01" {
            sampled += 1;
        }
    }
    let share = sampled as f64 / TRIES as f64;
    assert!((0.4..=0.6).contains(&share), "{sampled} of {TRIES} sampled");
}

/// A collector that fails, never answers, or is gone costs no request anything: every
/// request through the activator is answered 200 while its spans are lost (and counted).
#[test]
fn a_failing_silent_or_absent_collector_costs_no_request() {
    let mut collector = Collector::start();
    let (_app, user_port) = app();
    let activator = activator(
        SocketAddr::from(([127, 0, 0, 1], user_port)),
        &format!(
            "[tracing]\nprotocol = \"http/protobuf\"\nendpoint = \"http://127.0.0.1:{}\"\nsampling_rate = 1.0",
            collector.http
        ),
    );
    for (mode, what) in [("fail", "answers 500"), ("hang", "never answers")] {
        collector.mode("http", mode);
        for _ in 0..50 {
            let at_app = through(activator.http, &[], &[]);
            assert!(at_app.contains_key("traceparent"), "{what}");
        }
    }
    collector.stop("http");
    for _ in 0..50 {
        through(activator.http, &[], &[]);
    }
    assert!(
        eventually(Duration::from_secs(15), || activator
            .metric_sum("kactivator_trace_export_failures_total", &[])
            >= 1.0),
        "{}",
        activator.metrics()
    );
    // Back, it receives again.
    collector.mode("http", "ok");
    collector.start_again("http");
    through(activator.http, &[&traceparent("01")], &[]);
    let span = collector.wait_for("a span after the collector came back", |event| {
        event["event"] == "span" && event["trace_id"] == CLIENT_TRACE
    });
    assert_eq!(span["trace_id"], CLIENT_TRACE);
}

/// Tracing off (no `[tracing]`): every propagation header reaches the pod exactly as sent,
/// invalid ones included.
#[test]
fn without_tracing_trace_headers_pass_untouched() {
    let (_app, user_port) = app();
    let activator = activator(SocketAddr::from(([127, 0, 0, 1], user_port)), "");
    let sent = [
        "traceparent: ff-not-valid",
        "tracestate: a=b",
        "b3: 1",
        "X-B3-Flags: 1",
    ];
    let at_app = through(activator.http, &sent, &[]);
    assert_eq!(one(&at_app, "traceparent"), "ff-not-valid");
    assert_eq!(one(&at_app, "tracestate"), "a=b");
    assert_eq!(one(&at_app, "b3"), "1");
    assert_eq!(one(&at_app, "x-b3-flags"), "1");
    assert!(!at_app.contains_key("x-b3-traceid"));
}

/// The spans of the last requests before SIGTERM reach the collector before the process ends:
/// the shards hand over what they buffer when they end, and the exporter sends what it holds
/// then, well before its 5 s batch timer would have (nothing was exported before the signal).
#[test]
fn the_last_spans_are_exported_when_the_process_exits() {
    let mut collector = Collector::start();
    let (_app, user_port) = app();
    let tracing = format!(
        "[tracing]\nprotocol = \"http/protobuf\"\nendpoint = \"http://127.0.0.1:{}/v1/traces\"\nsampling_rate = 1.0",
        collector.http
    );
    let pod = SocketAddr::from(([127, 0, 0, 1], user_port));
    let mut activator = Activator::start_with(
        &format!("{tracing}\n\n{}", revision("default", REVISION, &[pod], "")),
        "",
        &["--shards", "2", "--drain-grace-seconds", "0"],
        &[],
    );
    for _ in 0..3 {
        let at_app = through(activator.http, &[&traceparent("01")], &[]);
        assert_eq!(parts(one(&at_app, "traceparent")).0, CLIENT_TRACE);
    }
    assert!(
        collector
            .within(Duration::from_millis(500), |event| event["event"] == "span")
            .is_none(),
        "a span was exported before the exit: this test no longer shows the exit's flush"
    );
    activator.send_signal("TERM");
    assert_eq!(
        activator.wait_exit(Duration::from_secs(10)),
        Some(0),
        "{}",
        activator.stderr()
    );
    // Four spans for each request: handle, throttler_try, activator_proxy, the client's.
    let spans = collector.spans_until(|spans| spans.len() >= 12);
    assert_eq!(spans.len(), 12, "{spans:#?}");
    assert!(spans.iter().all(|span| span["trace_id"] == CLIENT_TRACE));
    let handles = spans.iter().filter(|span| span["name"] == "handle").count();
    assert_eq!(handles, 3, "{spans:#?}");
}
