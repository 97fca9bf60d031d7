//! `kactivator queue-proxy` under Knative 1.23's contract: exactly the environment 1.23's
//! reconciler sets (`support::queue_proxy::knative_1_23_env`), where the request log, request
//! metrics and tracing come from one `OBSERVABILITY_CONFIG` and the 1.18 keys are gone. Request
//! metrics pushed over OTLP go to a collector built from the official OpenTelemetry definitions
//! (`kactivator_testkit::collector`).

mod support;

use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use kactivator_control::queue_proxy::observability::KNATIVE_1_23_DEFAULTS;
use kactivator_testkit::backend::{self, BackendConfig};
use kactivator_testkit::collector::Collector;
use kactivator_testkit::ports::free_port;
use serde_json::{json, Value};
use support::queue_proxy::{knative_1_23_env, QueueProxy, POD, REVISION};
use support::{admin_get, eventually, exit_within};

/// config-observability with `logging.enable-request-log: "true"` and
/// `request-metrics-protocol: prometheus`, the template left at its default, as 1.23's
/// reconciler marshals it (`encoding/json` of serving's `observability.Config`).
const REQUEST_LOG_AND_PROMETHEUS: &str = r#"{"tracing":{"protocol":"none"},"metrics":{"protocol":"none"},"runtime":{"profiling":"disabled","exportInterval":15000000000},"requestMetrics":{"protocol":"prometheus"},"enableRequestLog":true,"requestLogTemplate":"{\"httpRequest\": {\"requestMethod\": \"{{.Request.Method}}\", \"requestUrl\": \"{{js .Request.RequestURI}}\", \"requestSize\": \"{{.Request.ContentLength}}\", \"status\": {{.Response.Code}}, \"responseSize\": \"{{.Response.Size}}\", \"userAgent\": \"{{js .Request.UserAgent}}\", \"remoteIp\": \"{{js .Request.RemoteAddr}}\", \"serverIp\": \"{{.Revision.PodIP}}\", \"referer\": \"{{js .Request.Referer}}\", \"latency\": \"{{.Response.Latency}}s\", \"protocol\": \"{{.Request.Proto}}\"}, \"traceId\": \"{{.TraceID}}\"}"}"#;

fn user_container(port: u16) -> backend::BackendHandle {
    backend::spawn_on(
        SocketAddr::from(([127, 0, 0, 1], port)),
        BackendConfig::named("user-container"),
    )
    .expect("user container")
}

/// Stops it as Kubernetes does; every request-log line is out once it has exited.
fn stop(proxy: &mut QueueProxy) {
    let status = Command::new("kill")
        .args(["-TERM", &proxy.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    proxy
        .wait_for_exit(Duration::from_secs(15))
        .expect("did not exit after SIGTERM");
}

fn metrics_text(proxy: &QueueProxy) -> String {
    admin_get(proxy.metrics, "/metrics")
        .expect("the metrics port answers")
        .1
}

#[test]
fn knative_1_23s_environment_writes_the_configured_request_log_and_serves_its_metrics() {
    let user_port = free_port();
    let _user = user_container(user_port);
    let env = knative_1_23_env(user_port, free_port(), 4, REQUEST_LOG_AND_PROMETHEUS);
    let mut proxy = QueueProxy::start_with(env, &["--drain-grace-seconds", "1"]);
    assert!(eventually(Duration::from_secs(5), || proxy
        .health_check("kube-probe/1.33")
        .status
        == 200));

    for path in ["/bytes/321?a=1", "/status/404", "/"] {
        let answer = proxy.get(path);
        assert_ne!(answer.status, 0, "{path}");
    }

    // `request-metrics-protocol: prometheus`: 1.19+'s names, as 1.23's queue-proxy serves
    // them, and not 1.18's, which it no longer has. A request is counted when it ends, after
    // its last byte went to the client, so a scrape right after the answer may not have it
    // yet: wait for the count to reach what was sent, then hold it to exactly that.
    let ok = || {
        proxy.metric(
            "http_server_request_duration_seconds_count",
            &[
                "kn_revision_name=\"hello-00001\"",
                "http_response_status_code=\"200\"",
            ],
        )
    };
    eventually(Duration::from_secs(5), || ok() >= 2.0);
    let text = metrics_text(&proxy);
    assert_eq!(ok(), 2.0, "{text}");
    assert_eq!(
        proxy.metric(
            "kn_serving_invocation_duration_seconds_count",
            &["http_response_status_code=\"404\""]
        ),
        1.0,
        "{text}"
    );
    assert!(
        text.contains("kn_serving_queue_depth"),
        "CC 4: a breaker, its depth: {text}"
    );
    assert!(
        !text.contains("revision_request_count"),
        "1.23 serves no 1.18 names: {text}"
    );
    assert!(text.contains("kactivator_shard_requests_total"), "{text}");

    stop(&mut proxy);
    let stdout = proxy.stdout();
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|error| panic!("{error}: {line:?}")))
        .collect();
    assert_eq!(
        lines.len(),
        3,
        "one line per request, none for the probe: {stdout}"
    );
    let first = &lines[0]["httpRequest"];
    assert_eq!(first["requestMethod"], "GET");
    assert_eq!(first["requestUrl"], "/bytes/321?a=1");
    assert_eq!(first["status"], 200);
    assert_eq!(first["responseSize"], "321");
    assert_eq!(first["serverIp"], "127.0.0.1");
    assert_eq!(first["protocol"], "HTTP/1.1");
    assert!(first["latency"].as_str().unwrap().ends_with('s'));
    assert!(
        lines[0].get("traceId").is_some(),
        "1.21+'s template: {stdout}"
    );
    assert_eq!(lines[1]["httpRequest"]["status"], 404);

    let stderr = proxy.stderr();
    assert!(
        !stderr.contains("not built"),
        "nothing unbuilt was asked for: {stderr}"
    );
}

/// The defaults (an empty config-observability) with tracing over OTLP and profiling asked for:
/// no request log and no upstream request metrics, as 1.23's queue-proxy; the tracing is taken
/// (start-up says which), profiling is not built, which start-up says, naming the field, and
/// then serves.
#[test]
fn tracing_is_taken_unbuilt_profiling_is_said_and_the_defaults_log_and_export_nothing() {
    let user_port = free_port();
    let _user = user_container(user_port);
    let mut config: serde_json::Value = serde_json::from_str(KNATIVE_1_23_DEFAULTS).unwrap();
    config["tracing"] = serde_json::json!({
        "protocol": "http/protobuf",
        "endpoint": "http://jaeger-collector.observability:4318/v1/traces",
        "samplingRate": 1,
    });
    config["runtime"]["profiling"] = "enabled".into();
    let env = knative_1_23_env(user_port, free_port(), 0, &config.to_string());
    let mut proxy = QueueProxy::start_with(env, &["--drain-grace-seconds", "1"]);
    assert_eq!(proxy.get("/").status, 200);
    let text = metrics_text(&proxy);
    assert!(
        !text.contains("http_server_request_duration_seconds")
            && !text.contains("revision_request_count")
            && !text.contains("kn_serving_"),
        "request-metrics-protocol none: no upstream names: {text}"
    );
    assert!(text.contains("kactivator_shard_requests_total"), "{text}");
    let stderr = proxy.stderr();
    assert!(
        stderr.lines().any(|line| line.contains("WARN")
            && line.contains("OBSERVABILITY_CONFIG")
            && line.contains("runtime.profiling")
            && line.contains("not built")),
        "{stderr}"
    );
    assert!(
        stderr.lines().any(|line| line.contains("INFO")
            && line.contains(
                "tracing: http/protobuf to \
                 http://jaeger-collector.observability:4318/v1/traces, sampling 1"
            )),
        "{stderr}"
    );
    assert!(
        !stderr
            .lines()
            .any(|line| line.contains("tracing") && line.contains("not built")),
        "{stderr}"
    );
    stop(&mut proxy);
    assert_eq!(proxy.stdout(), "", "enableRequestLog is false");
}

/// Runs the queue-proxy to its exit with `env` (and `args`): its exit code and stderr.
fn exit_of(env: std::collections::HashMap<String, String>, args: &[&str]) -> (Option<i32>, String) {
    let serving: u16 = env["QUEUE_SERVING_PORT"].parse().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_kactivator"))
        .arg("queue-proxy")
        .args(["--admin", &format!("127.0.0.1:{}", free_port())])
        .args(["--drain-admin", &format!("127.0.0.1:{}", free_port())])
        .args([
            "--autoscaler-metrics",
            &format!("127.0.0.1:{}", free_port()),
        ])
        .args(args)
        .env_clear()
        .envs(env)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kactivator queue-proxy");
    let (exited, output) = exit_within(child, Duration::from_secs(10));
    assert!(
        exited,
        "it started: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(TcpStream::connect(("127.0.0.1", serving)).is_err());
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_bad_observability_config_exits_2_naming_the_field() {
    let table: &[(&str, &[&str])] = &[
        (
            r#"{"enableRequestLog":"true"}"#,
            &["enableRequestLog", "boolean"],
        ),
        (r#"{"requestMetrics":"#, &["EOF"]),
        (
            r#"{"requestMetrics":{"protocol":"opencensus"},"tracing":{"protocol":"zipkin"}}"#,
            &[
                "requestMetrics.protocol",
                "\"opencensus\"",
                "tracing.protocol",
                "\"zipkin\"",
            ],
        ),
        (
            r#"{"requestMetrics":{"protocol":"prometheus","endpoint":":80"}}"#,
            &["requestMetrics.endpoint", "below 1024"],
        ),
        (
            r#"{"tracing":{"protocol":"grpc","samplingRate":"0.5"}}"#,
            &["tracing.samplingRate", "a number"],
        ),
        // Read as https:// upstream; TLS to collectors is not built.
        (
            r#"{"requestMetrics":{"protocol":"grpc","endpoint":"otel-collector.observability:4317"}}"#,
            &["requestMetrics.endpoint", "has no scheme"],
        ),
        (
            r#"{"requestMetrics":{"protocol":"http/protobuf","endpoint":"http://otel:port/v1/metrics"}}"#,
            &["requestMetrics.endpoint", "not a number"],
        ),
        (
            r#"{"enableRequestLog":true,"requestLogTemplate":"{{.Request.Body}}"}"#,
            &["requestLogTemplate", "Body"],
        ),
    ];
    for (config, said) in table {
        let env = knative_1_23_env(free_port(), free_port(), 0, config);
        let (code, stderr) = exit_of(env, &[]);
        assert_eq!(code, Some(2), "{config}: {stderr}");
        assert!(
            stderr.contains("OBSERVABILITY_CONFIG"),
            "{config}: {stderr}"
        );
        for part in *said {
            assert!(stderr.contains(part), "{config}: {part:?} in {stderr}");
        }
    }
}

/// Upstream reads `QUEUE_PROXY_TLS_*` only when its certificate is mounted, and then a bad
/// value is fatal; otherwise it starts. The same here (the settings are checked before the
/// mounted pair is loaded).
#[test]
fn a_bad_tls_setting_exits_2_when_the_certificate_is_mounted_and_is_warned_about_otherwise() {
    let user_port = free_port();
    let _user = user_container(user_port);
    let mut env = knative_1_23_env(user_port, free_port(), 0, KNATIVE_1_23_DEFAULTS);
    env.insert("QUEUE_PROXY_TLS_MIN_VERSION".into(), "1.1".into());
    env.insert(
        "QUEUE_PROXY_TLS_CIPHER_SUITES".into(),
        "TLS_AES_128_GCM_SHA256,TLS_RSA_WITH_RC4_128_SHA".into(),
    );
    let certs = support::scratch_dir();
    std::fs::write(certs.join("tls.crt"), "-----BEGIN CERTIFICATE-----\n").unwrap();
    std::fs::write(certs.join("tls.key"), "-----BEGIN PRIVATE KEY-----\n").unwrap();
    let certs_arg = ["--certs-dir", certs.to_str().unwrap()];
    let (code, stderr) = exit_of(env.clone(), &certs_arg);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("QUEUE_PROXY_TLS_MIN_VERSION: \"1.1\" is not a TLS version")
            && stderr.contains(
                "QUEUE_PROXY_TLS_CIPHER_SUITES: unknown cipher suite \"TLS_RSA_WITH_RC4_128_SHA\""
            ),
        "{stderr}"
    );

    std::fs::remove_file(certs.join("tls.key")).unwrap();
    let proxy = QueueProxy::start_with(
        env,
        &["--drain-grace-seconds", "1", certs_arg[0], certs_arg[1]],
    );
    assert_eq!(proxy.get("/").status, 200);
    let stderr = proxy.stderr();
    assert!(
        stderr.lines().any(|line| line.contains("WARN")
            && line.contains("QUEUE_PROXY_TLS_MIN_VERSION")
            && line.contains("TLS is off")),
        "{stderr}"
    );
    std::fs::remove_dir_all(certs).unwrap();
}

// === request metrics pushed over OTLP ===

/// An empty config-observability but `request-metrics-protocol: protocol` to `endpoint`, every
/// `interval_nanos`, as 1.23's reconciler marshals it.
fn otlp_request_metrics(protocol: &str, endpoint: &str, interval_nanos: u64) -> String {
    let mut config: Value = serde_json::from_str(KNATIVE_1_23_DEFAULTS).unwrap();
    config["requestMetrics"] = json!({
        "protocol": protocol,
        "endpoint": endpoint,
        "exportInterval": interval_nanos,
    });
    config.to_string()
}

const SECOND: u64 = 1_000_000_000;

/// The point of a pushed histogram for status 200, if any.
fn ok_point(metric: &Value) -> Option<&Value> {
    metric["points"]
        .as_array()?
        .iter()
        .find(|point| point["attributes"]["http.response.status_code"] == json!({"int_value": 200}))
}

/// The next push from `transport` of histogram `name` whose 200s number `count`.
fn histogram_with(collector: &mut Collector, transport: &str, name: &str, count: u64) -> Value {
    collector.wait_for(
        &format!("{name} with {count} requests over {transport}"),
        |event| {
            event["event"] == "metric"
                && event["transport"] == transport
                && event["name"] == name
                && ok_point(event).is_some_and(|point| point["count"] == count)
        },
    )
}

/// Requests through the queue-proxy are pushed under upstream's names (otelhttp's server
/// duration, the queue's invocation duration and depth) with upstream's resource, every
/// `exportInterval` and once more after SIGTERM; over OTLP/HTTP and OTLP/gRPC.
#[test]
fn request_metrics_are_pushed_over_otlp_every_interval_and_once_more_at_exit() {
    let mut collector = Collector::start();
    let cases = [
        (
            "http/protobuf",
            format!("http://127.0.0.1:{}/v1/metrics", collector.http),
            "otlp-http",
            SECOND,
        ),
        // An hour: nothing is pushed before the last push, which SIGTERM brings.
        (
            "grpc",
            format!("http://127.0.0.1:{}", collector.grpc),
            "grpc",
            3600 * SECOND,
        ),
    ];
    for (protocol, endpoint, transport, interval) in cases {
        let user_port = free_port();
        let _user = user_container(user_port);
        let config = otlp_request_metrics(protocol, &endpoint, interval);
        let env = knative_1_23_env(user_port, free_port(), 4, &config);
        let mut proxy = QueueProxy::start_with(env, &["--drain-grace-seconds", "1"]);
        const REQUESTS: u64 = 7;
        for _ in 0..REQUESTS {
            assert_eq!(proxy.get("/").status, 200);
        }
        // Pushed, so not served for scraping (as upstream, which serves only one or the other).
        let text = metrics_text(&proxy);
        assert!(
            !text.contains("http_server_request_duration_seconds") && !text.contains("kn_serving_"),
            "{text}"
        );
        if interval == SECOND {
            let server = histogram_with(
                &mut collector,
                transport,
                "http.server.request.duration",
                REQUESTS,
            );
            assert_eq!(server["unit"], "s");
            assert_eq!(server["type"], "histogram");
            assert_eq!(server["temporality"], "AGGREGATION_TEMPORALITY_CUMULATIVE");
            let point = ok_point(&server).unwrap();
            // otelhttp's labeler carries the route tag upstream's handler adds: none was asked
            // for (no `Knative-Serving-Tag`), so `kn:disabled`.
            assert_eq!(
                point["attributes"],
                json!({
                    "http.response.status_code": {"int_value": 200},
                    "kn.route.tag": {"string_value": "kn:disabled"},
                })
            );
            assert_eq!(point["explicit_bounds"][0], 0.005);
            let resource = server["resource"].as_object().unwrap();
            let string = |value: &str| json!({ "string_value": value });
            for (key, value) in [
                ("service.name", "hello"),
                ("service.instance.id", POD),
                ("k8s.container.name", "queue-proxy"),
                ("k8s.namespace.name", "default"),
                ("k8s.pod.name", POD),
                ("kn.service.name", "hello"),
                ("kn.configuration.name", "hello"),
                ("kn.revision.name", REVISION),
            ] {
                assert_eq!(resource.get(key), Some(&string(value)), "{key}: {server}");
            }
            assert!(resource["service.version"]["string_value"].is_string());
            let invocation = histogram_with(
                &mut collector,
                transport,
                "kn.serving.invocation.duration",
                REQUESTS,
            );
            assert_eq!(invocation["unit"], "s");
            let depth = collector.wait_for("the queue depth", |event| {
                event["event"] == "metric"
                    && event["transport"] == transport
                    && event["name"] == "kn.serving.queue.depth"
            });
            assert_eq!(depth["type"], "gauge");
            assert_eq!(depth["points"][0]["value"], 0, "nothing in flight");
            assert!(
                eventually(Duration::from_secs(5), || proxy
                    .metric("kactivator_metrics_exports_total", &[])
                    >= 1.0),
                "{}",
                metrics_text(&proxy)
            );
        } else {
            assert!(
                collector
                    .within(Duration::from_millis(500), |event| {
                        event["event"] == "metric" && event["transport"] == transport
                    })
                    .is_none(),
                "pushed before its interval"
            );
        }
        assert_eq!(
            proxy.metric("kactivator_metrics_export_failures_total", &[]),
            0.0
        );
        // Three more, then SIGTERM: the last push carries every request.
        for _ in 0..3 {
            assert_eq!(proxy.get("/").status, 200);
        }
        let started = std::time::Instant::now();
        stop(&mut proxy);
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        histogram_with(
            &mut collector,
            transport,
            "http.server.request.duration",
            REQUESTS + 3,
        );
        histogram_with(
            &mut collector,
            transport,
            "kn.serving.invocation.duration",
            REQUESTS + 3,
        );
    }
}

/// A metrics collector that answers 500, never answers, or is gone costs no request anything:
/// every request is answered 200, the failures are counted, and exit after SIGTERM waits at
/// most the last push's bound.
#[test]
fn a_failing_silent_or_absent_metrics_collector_costs_no_request_and_holds_exit_briefly() {
    let mut collector = Collector::start();
    let endpoint = format!("http://127.0.0.1:{}/v1/metrics", collector.http);
    for (mode, what) in [
        ("fail", "answers 500"),
        ("hang", "never answers"),
        ("down", "is gone"),
    ] {
        match mode {
            "down" => collector.stop("http"),
            mode => collector.mode("http", mode),
        }
        let user_port = free_port();
        let _user = user_container(user_port);
        let config = otlp_request_metrics("http/protobuf", &endpoint, SECOND / 10);
        let env = knative_1_23_env(user_port, free_port(), 4, &config);
        let mut proxy = QueueProxy::start_with(env, &["--drain-grace-seconds", "1"]);
        for _ in 0..20 {
            assert_eq!(proxy.get("/").status, 200, "{what}");
        }
        if mode != "hang" {
            assert!(
                eventually(Duration::from_secs(5), || proxy
                    .metric("kactivator_metrics_export_failures_total", &[])
                    >= 2.0),
                "{what}: {}",
                metrics_text(&proxy)
            );
        }
        assert_eq!(
            proxy.metric("kactivator_metrics_exports_total", &[]),
            0.0,
            "{what}"
        );
        // The drain (1 s), then at most the last push's 5 s, whatever the collector does.
        let started = std::time::Instant::now();
        stop(&mut proxy);
        assert!(
            started.elapsed() < Duration::from_secs(9),
            "{what}: exit took {:?}",
            started.elapsed()
        );
    }
}
