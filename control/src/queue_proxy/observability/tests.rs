use std::time::Duration;

use kactivator_telemetry::{MetricsConfig, MetricsProtocol};

use super::*;

fn decode(text: &str) -> ObservabilityConfig {
    ObservabilityConfig::decode(text).unwrap_or_else(|error| panic!("{text}: {error}"))
}

fn plan(text: &str) -> Plan {
    decode(text)
        .plan()
        .unwrap_or_else(|problems| panic!("{text}: {problems:?}"))
}

#[test]
fn the_1_23_defaults_decode_to_the_defaults_and_turn_everything_off() {
    assert_eq!(
        decode(KNATIVE_1_23_DEFAULTS),
        ObservabilityConfig::default()
    );
    assert_eq!(
        plan(KNATIVE_1_23_DEFAULTS),
        Plan {
            request_log_template: None,
            probe_request_log: false,
            request_metrics: RequestMetricsExport::Off,
            tracing: TracingConfig::OFF,
            not_built: Vec::new(),
            warnings: Vec::new(),
        }
    );
    assert_eq!(
        ObservabilityConfig::default().request_log_template,
        // `pkg/observability/config.go:34`, as written there.
        r#"{"httpRequest": {"requestMethod": "{{.Request.Method}}", "requestUrl": "{{js .Request.RequestURI}}", "requestSize": "{{.Request.ContentLength}}", "status": {{.Response.Code}}, "responseSize": "{{.Response.Size}}", "userAgent": "{{js .Request.UserAgent}}", "remoteIp": "{{js .Request.RemoteAddr}}", "serverIp": "{{.Revision.PodIP}}", "referer": "{{js .Request.Referer}}", "latency": "{{.Response.Latency}}s", "protocol": "{{.Request.Proto}}"}, "traceId": "{{.TraceID}}"}"#
    );
}

/// config-observability with `logging.enable-request-log: "true"`,
/// `logging.enable-probe-request-log: "true"` and `request-metrics-protocol: prometheus`, as
/// the reconciler marshals it (`encoding/json` over the structs of the module docs).
const REQUEST_LOG_AND_PROMETHEUS: &str = r#"{"tracing":{"protocol":"none"},"metrics":{"protocol":"none"},"runtime":{"profiling":"disabled","exportInterval":15000000000},"requestMetrics":{"protocol":"prometheus"},"enableRequestLog":true,"requestLogTemplate":"{\"httpRequest\": {\"requestMethod\": \"{{.Request.Method}}\", \"requestUrl\": \"{{js .Request.RequestURI}}\", \"requestSize\": \"{{.Request.ContentLength}}\", \"status\": {{.Response.Code}}, \"responseSize\": \"{{.Response.Size}}\", \"userAgent\": \"{{js .Request.UserAgent}}\", \"remoteIp\": \"{{js .Request.RemoteAddr}}\", \"serverIp\": \"{{.Revision.PodIP}}\", \"referer\": \"{{js .Request.Referer}}\", \"latency\": \"{{.Response.Latency}}s\", \"protocol\": \"{{.Request.Proto}}\"}, \"traceId\": \"{{.TraceID}}\"}","enableProbeRequestLog":true}"#;

#[test]
fn a_request_log_and_prometheus_as_configured_in_1_23() {
    assert_eq!(
        plan(REQUEST_LOG_AND_PROMETHEUS),
        Plan {
            request_log_template: Some(DEFAULT_REQUEST_LOG_TEMPLATE.into()),
            probe_request_log: true,
            request_metrics: RequestMetricsExport::Prometheus { listen: None },
            tracing: TracingConfig::OFF,
            not_built: Vec::new(),
            warnings: Vec::new(),
        }
    );
}

/// The reconciler's own expectations (`pkg/reconciler/revision/resources/queue_test.go`),
/// built from zero-valued configs: absent fields keep the queue-proxy's defaults.
#[test]
fn the_reconcilers_test_values_read_as_upstreams_queue_proxy_reads_them() {
    let table: &[(&str, Option<&str>, bool, RequestMetricsExport)] = &[
        // :1135, the default environment of its tests.
        (
            r#"{"tracing":{},"metrics":{},"runtime":{},"requestMetrics":{}}"#,
            None,
            false,
            RequestMetricsExport::Off,
        ),
        // :230: a template and probe logging, but the log not enabled.
        (
            r#"{"tracing":{},"metrics":{},"runtime":{},"requestMetrics":{},"requestLogTemplate":"test template","enableProbeRequestLog":true}"#,
            None,
            true,
            RequestMetricsExport::Off,
        ),
        // :258.
        (
            r#"{"tracing":{},"metrics":{},"runtime":{},"requestMetrics":{"protocol":"prometheus"}}"#,
            None,
            false,
            RequestMetricsExport::Prometheus { listen: None },
        ),
        (
            r#"{"enableRequestLog":true,"requestLogTemplate":"test template"}"#,
            Some("test template"),
            false,
            RequestMetricsExport::Off,
        ),
        // Enabled, template left out: the default template.
        (
            r#"{"enableRequestLog":true}"#,
            Some(DEFAULT_REQUEST_LOG_TEMPLATE),
            false,
            RequestMetricsExport::Off,
        ),
        // Enabled with an explicitly empty template: no lines, as upstream.
        (
            r#"{"enableRequestLog":true,"requestLogTemplate":""}"#,
            None,
            false,
            RequestMetricsExport::Off,
        ),
    ];
    for (text, template, probes, metrics) in table {
        let plan = plan(text);
        assert_eq!(plan.request_log_template.as_deref(), *template, "{text}");
        assert_eq!(plan.probe_request_log, *probes, "{text}");
        assert_eq!(plan.request_metrics, *metrics, "{text}");
        assert!(plan.not_built.is_empty(), "{text}");
    }
    // :274 and :382: profiling, and an OTLP push: read, and not built.
    let plan1 = plan(
        r#"{"tracing":{},"metrics":{},"runtime":{"profiling":"enabled"},"requestMetrics":{}}"#,
    );
    assert_eq!(plan1.not_built.len(), 1);
    assert_eq!(plan1.not_built[0].0, "runtime.profiling");
    // The reconciler's own example endpoint is a bare host:port, which upstream reads as
    // https://: TLS to collectors is not built, so the queue-proxy refuses it, naming the field.
    let problems = decode(
        r#"{"tracing":{},"metrics":{},"runtime":{},"requestMetrics":{"protocol":"http/protobuf","endpoint":"otel:55678"}}"#,
    )
    .plan()
    .unwrap_err();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0]
            .starts_with("requestMetrics.endpoint: metrics endpoint \"otel:55678\" has no scheme"),
        "{problems:?}"
    );
}

/// Outcomes of Go's `json.Unmarshal` over `DefaultConfig()` (run with go1.19 on the structs
/// of the module docs): `Ok` with what must then hold, or `Err` with part of the message.
#[test]
fn json_decodes_as_encoding_json_decodes_it() {
    type Check = fn(&ObservabilityConfig) -> bool;
    let ok: &[(&str, Check)] = &[
        ("null", |c| *c == ObservabilityConfig::default()),
        ("{}", |c| *c == ObservabilityConfig::default()),
        (" \n{}\t", |c| *c == ObservabilityConfig::default()),
        (r#"{"enableRequestLog":null}"#, |c| !c.enable_request_log),
        (r#"{"EnableRequestLog":true}"#, |c| c.enable_request_log),
        (r#"{"ENABLEREQUESTLOG":true}"#, |c| c.enable_request_log),
        // `ſ` folds to `s`, the Kelvin sign to `k`.
        ("{\"enableRequeſtLog\":true}", |c| c.enable_request_log),
        (
            "{\"kelvin\u{212a}\":1,\"requestMetrics\":{\"protocol\":\"prometheus\"}}",
            |c| c.request_metrics.protocol == "prometheus",
        ),
        (r#"{"requestmetrics":{"PROTOCOL":"prometheus"}}"#, |c| {
            c.request_metrics.protocol == "prometheus"
        }),
        // The last of a repeated name wins.
        (
            r#"{"enableRequestLog":true,"enablerequestlog":false}"#,
            |c| !c.enable_request_log,
        ),
        // A repeated object merges into what is there.
        (
            r#"{"requestMetrics":{"protocol":"prometheus"},"requestMetrics":{"endpoint":":9092"}}"#,
            |c| c.request_metrics.protocol == "prometheus" && c.request_metrics.endpoint == ":9092",
        ),
        (r#"{"requestLogTemplate":null}"#, |c| {
            c.request_log_template == DEFAULT_REQUEST_LOG_TEMPLATE
        }),
        (r#"{"requestLogTemplate":""}"#, |c| {
            c.request_log_template.is_empty()
        }),
        (r#"{"requestMetrics":null}"#, |c| {
            c.request_metrics.protocol == "none"
        }),
        (r#"{"requestMetrics":{"exportInterval":-5}}"#, |c| {
            c.request_metrics.export_interval_nanos == -5
        }),
        (r#"{"tracing":{"samplingRate":1}}"#, |c| {
            c.tracing.sampling_rate == 1.0
        }),
        (r#"{"tracing":{"samplingRate":5e-1}}"#, |c| {
            c.tracing.sampling_rate == 0.5
        }),
        // Unknown fields, of any shape, and the embedded struct's own name, are skipped.
        (
            r#"{"unknown":{"deep":[1,2,{"x":null}]},"BaseConfig":{"tracing":{"protocol":"grpc"}}}"#,
            |c| c.tracing.protocol == "none",
        ),
        (r#"{"a":"\ud800"}"#, |c| {
            *c == ObservabilityConfig::default()
        }),
        (
            r#"{"LoggingURLTemplate":"http://x/${REVISION_UID}","EnableVarLogCollection":true}"#,
            |c| c.enable_var_log_collection && c.logging_url_template.starts_with("http"),
        ),
        (
            r#"{"requestLogTemplate":"\u003c{{.Request.Method}}\u003e"}"#,
            |c| c.request_log_template == "<{{.Request.Method}}>",
        ),
    ];
    for (text, check) in ok {
        let config = decode(text);
        assert!(check(&config), "{text}: {config:?}");
    }
    let refused: &[(&str, &str)] = &[
        ("[]", "expected a JSON object"),
        (r#""x""#, "expected a JSON object"),
        ("5", "expected a JSON object"),
        ("", "EOF"),
        ("   ", "EOF"),
        (
            r#"{"enableRequestLog":"true"}"#,
            "enableRequestLog to be a boolean",
        ),
        (
            r#"{"enableRequestLog":1}"#,
            "enableRequestLog to be a boolean",
        ),
        (
            r#"{"requestLogTemplate":5}"#,
            "requestLogTemplate to be a string",
        ),
        (r#"{"requestMetrics":[]}"#, "requestMetrics to be an object"),
        (
            r#"{"requestMetrics":{"exportInterval":1.5}}"#,
            "requestMetrics.exportInterval",
        ),
        (
            r#"{"requestMetrics":{"exportInterval":1e9}}"#,
            "requestMetrics.exportInterval",
        ),
        (
            r#"{"requestMetrics":{"exportInterval":9223372036854775808}}"#,
            "requestMetrics.exportInterval",
        ),
        (
            r#"{"requestMetrics":{"exportInterval":"60s"}}"#,
            "requestMetrics.exportInterval",
        ),
        (
            r#"{"runtime":{"exportInterval":true}}"#,
            "runtime.exportInterval",
        ),
        (r#"{"tracing":{"samplingRate":1e400}}"#, "out of range"),
        (
            r#"{"tracing":{"samplingRate":"0.5"}}"#,
            "tracing.samplingRate to be a number",
        ),
        (
            r#"{"tracing":{"protocol":["grpc"]}}"#,
            "tracing.protocol to be a string",
        ),
        (r#"{"enableRequestLog":true} x"#, "trailing characters"),
        (r#"{"enableRequestLog":true,}"#, "trailing comma"),
        (r#"{"enableRequestLog":tru}"#, "expected ident"),
        (r#"{"requestLogTemplate":"\ud800"}"#, "hex escape"),
    ];
    for (text, message) in refused {
        let error = ObservabilityConfig::decode(text).expect_err(text);
        assert!(error.contains(message), "{text}: {error}");
    }
}

#[test]
fn protocols_upstream_does_not_know_are_refused_naming_the_field() {
    for (text, field) in [
        (
            r#"{"requestMetrics":{"protocol":"opencensus"}}"#,
            "requestMetrics.protocol",
        ),
        (
            r#"{"requestMetrics":{"protocol":""}}"#,
            "requestMetrics.protocol",
        ),
        (
            r#"{"requestMetrics":{"protocol":"Prometheus"}}"#,
            "requestMetrics.protocol",
        ),
        (r#"{"tracing":{"protocol":"zipkin"}}"#, "tracing.protocol"),
        (r#"{"tracing":{"protocol":"NONE"}}"#, "tracing.protocol"),
    ] {
        let problems = decode(text).plan().expect_err(text);
        assert_eq!(problems.len(), 1, "{text}: {problems:?}");
        assert!(problems[0].starts_with(field), "{text}: {problems:?}");
    }
    // Both at once: every problem, so one restart fixes them.
    let problems = decode(r#"{"tracing":{"protocol":"x"},"requestMetrics":{"protocol":"y"}}"#)
        .plan()
        .unwrap_err();
    assert_eq!(problems.len(), 2);
}

#[test]
fn tracing_is_read_with_upstreams_meanings() {
    use crate::config::trace::TraceProtocol;

    let tracing = |json: &str| {
        let plan = plan(&format!(r#"{{"tracing":{json}}}"#));
        assert!(plan.not_built.is_empty(), "{json}: {:?}", plan.not_built);
        assert!(plan.warnings.is_empty(), "{json}: {:?}", plan.warnings);
        plan.tracing
    };
    let otlp = "http://otel:4318/v1/traces";
    let table: &[(String, TracingConfig)] = &[
        (r#"{}"#.into(), TracingConfig::OFF),
        (
            r#"{"protocol":"none","endpoint":"ignored","samplingRate":1}"#.into(),
            TracingConfig::OFF,
        ),
        (
            format!(r#"{{"protocol":"http/protobuf","endpoint":"{otlp}","samplingRate":0.1}}"#),
            TracingConfig {
                protocol: TraceProtocol::HttpProtobuf,
                endpoint: otlp.into(),
                sampling_rate: 0.1,
            },
        ),
        (
            r#"{"protocol":"grpc","endpoint":"http://otel:4317","samplingRate":0.5}"#.into(),
            TracingConfig {
                protocol: TraceProtocol::Grpc,
                endpoint: "http://otel:4317".into(),
                sampling_rate: 0.5,
            },
        ),
        // The rate's default, 0: exported, nothing sampled (upstream's NeverSample).
        (
            r#"{"protocol":"grpc","endpoint":"http://otel:4317"}"#.into(),
            TracingConfig {
                protocol: TraceProtocol::Grpc,
                endpoint: "http://otel:4317".into(),
                sampling_rate: 0.0,
            },
        ),
        // What config-observability would refuse but the queue-proxy runs with: the rate as
        // upstream's sampler takes it.
        (
            r#"{"protocol":"grpc","endpoint":"http://otel:4317","samplingRate":2}"#.into(),
            TracingConfig {
                protocol: TraceProtocol::Grpc,
                endpoint: "http://otel:4317".into(),
                sampling_rate: 1.0,
            },
        ),
        (
            r#"{"protocol":"grpc","endpoint":"http://otel:4317","samplingRate":-3}"#.into(),
            TracingConfig {
                protocol: TraceProtocol::Grpc,
                endpoint: "http://otel:4317".into(),
                sampling_rate: 0.0,
            },
        ),
        // stdout samples every trace and sends nowhere.
        (
            r#"{"protocol":"stdout","endpoint":"ignored","samplingRate":0.1}"#.into(),
            TracingConfig {
                protocol: TraceProtocol::Stdout,
                endpoint: String::new(),
                sampling_rate: 1.0,
            },
        ),
    ];
    for (json, expected) in table {
        assert_eq!(tracing(json), *expected, "{json}");
    }
}

#[test]
fn an_endpoint_no_exporter_can_use_turns_tracing_off_with_a_warning_and_starts() {
    for (endpoint, said) in [
        ("", "needs an endpoint"),
        ("collector", "no host"),
        ("otel:4317", "has no scheme"),
        ("https://otel:4317", "TLS to trace collectors is not built"),
    ] {
        for protocol in ["grpc", "http/protobuf"] {
            let text = format!(
                r#"{{"tracing":{{"protocol":"{protocol}","endpoint":"{endpoint}","samplingRate":1}}}}"#
            );
            let plan = plan(&text);
            assert_eq!(plan.tracing, TracingConfig::OFF, "{text}");
            assert_eq!(plan.warnings.len(), 1, "{text}");
            assert_eq!(plan.warnings[0].0, "tracing.endpoint", "{text}");
            assert!(
                plan.warnings[0].1.contains(said),
                "{text}: {:?}",
                plan.warnings
            );
            assert!(plan.warnings[0].1.ends_with("tracing is off"), "{text}");
        }
    }
}

#[test]
fn an_otlp_push_of_request_metrics_is_planned_with_upstreams_interval() {
    // (protocol, endpoint, exportInterval in ns, the interval pushed at).
    let table = [
        (
            "grpc",
            MetricsProtocol::Grpc,
            "http://otel:4317",
            "60000000000",
            Duration::from_secs(60),
        ),
        (
            "http/protobuf",
            MetricsProtocol::HttpProtobuf,
            "http://otel:4318/v1/metrics",
            "1000000000",
            Duration::from_secs(1),
        ),
        // Unset, 0 and negative: OpenTelemetry Go's default, 60 s.
        (
            "grpc",
            MetricsProtocol::Grpc,
            "http://otel:4317",
            "0",
            Duration::from_secs(60),
        ),
        (
            "grpc",
            MetricsProtocol::Grpc,
            "http://otel:4317",
            "-5",
            Duration::from_secs(60),
        ),
        (
            "http/protobuf",
            MetricsProtocol::HttpProtobuf,
            "http://otel:4318",
            "null",
            Duration::from_secs(60),
        ),
    ];
    for (name, protocol, endpoint, interval_nanos, interval) in table {
        let text = format!(
            r#"{{"requestMetrics":{{"protocol":"{name}","endpoint":"{endpoint}","exportInterval":{interval_nanos}}}}}"#
        );
        let plan = plan(&text);
        assert_eq!(
            plan.request_metrics,
            RequestMetricsExport::Otlp(MetricsConfig {
                protocol,
                endpoint: endpoint.into(),
                interval,
            }),
            "{text}"
        );
        assert!(plan.not_built.is_empty(), "{text}: {:?}", plan.not_built);
    }
    // Upstream turns profiling on only for the exact word.
    assert!(plan(r#"{"runtime":{"profiling":"Enabled"}}"#)
        .not_built
        .is_empty());
}

#[test]
fn an_otlp_metrics_endpoint_the_exporter_cannot_use_is_refused_naming_the_field() {
    let table = [
        ("", "no host"),
        ("otel-collector:4317", "has no scheme"),
        (
            "https://otel:4318",
            "TLS to metrics collectors is not built",
        ),
        ("http://otel:port", "the port is not a number"),
        ("http://", "no host"),
    ];
    for protocol in ["grpc", "http/protobuf"] {
        for (endpoint, why) in table {
            let text = format!(
                r#"{{"requestMetrics":{{"protocol":"{protocol}","endpoint":"{endpoint}"}}}}"#
            );
            let problems = decode(&text).plan().unwrap_err();
            assert_eq!(problems.len(), 1, "{text}: {problems:?}");
            assert!(
                problems[0].starts_with("requestMetrics.endpoint: metrics endpoint")
                    && problems[0].contains(why),
                "{text}: {problems:?}"
            );
        }
    }
}

#[test]
fn a_prometheus_endpoint_is_where_upstream_would_listen() {
    let any = |port| Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port));
    let table: &[(&str, Option<SocketAddr>)] = &[
        ("", None),
        (":9091", any(9091)),
        (":09095", any(9095)),
        ("0.0.0.0:9092", Some("0.0.0.0:9092".parse().unwrap())),
        ("127.0.0.1:65535", Some("127.0.0.1:65535".parse().unwrap())),
        ("[::1]:1024", Some("[::1]:1024".parse().unwrap())),
        ("[]:9093", any(9093)),
    ];
    for (endpoint, listen) in table {
        assert_eq!(
            prometheus_listen(endpoint).as_ref(),
            Ok(listen),
            "{endpoint:?}"
        );
    }
    let refused: &[(&str, &str)] = &[
        ("9091", "is not \"host:port\""),
        ("::1:9091", "is not \"host:port\""),
        ("[::1]9091", "is not \"host:port\""),
        ("[::1:9091", "is not \"host:port\""),
        ("host:", "is not a port number"),
        (":+9091", "is not a port number"),
        (":65536", "is not a port number"),
        (":9_091", "is not a port number"),
        (":80", "below 1024"),
        (":0", "below 1024"),
        ("localhost:9091", "not an IP address"),
        ("[fe80::1%eth0]:9091", "zone"),
    ];
    for (endpoint, problem) in refused {
        let error = prometheus_listen(endpoint).expect_err(endpoint);
        assert!(error.contains(problem), "{endpoint:?}: {error}");
    }
    let problems = decode(r#"{"requestMetrics":{"protocol":"prometheus","endpoint":":80"}}"#)
        .plan()
        .unwrap_err();
    assert!(
        problems[0].starts_with("requestMetrics.endpoint: \":80\""),
        "{problems:?}"
    );
}

/// A skipped value is walked without recursion, however deep; a field read refuses a
/// nested value at its first bracket. Neither can exhaust the stack.
#[test]
fn deep_nesting_neither_recurses_nor_crashes() {
    let deep = |field: &str| {
        format!(
            "{{\"{field}\":{}{}}}",
            "[".repeat(100_000),
            "]".repeat(100_000)
        )
    };
    assert_eq!(
        ObservabilityConfig::decode(&deep("x")),
        Ok(ObservabilityConfig::default())
    );
    let error = ObservabilityConfig::decode(&deep("requestLogTemplate")).unwrap_err();
    assert!(
        error.contains("requestLogTemplate to be a string"),
        "{error}"
    );
    let error = ObservabilityConfig::decode(&deep("tracing")).unwrap_err();
    assert!(error.contains("tracing to be an object"), "{error}");
}

proptest::proptest! {
    /// Whatever the variable holds, decoding and planning return; they never panic.
    #[test]
    fn any_text_decodes_or_is_refused(text in r#"[{}\[\]":,0-9a-zA-Z\\. eE+-]{0,64}"#) {
        if let Ok(config) = ObservabilityConfig::decode(&text) {
            let _ = config.plan();
        }
    }

    /// Every field with arbitrary JSON values of every kind.
    #[test]
    fn any_value_in_any_field_decodes_or_is_refused(
        field in proptest::sample::select(vec![
            "tracing", "metrics", "runtime", "requestMetrics", "enableRequestLog",
            "requestLogTemplate", "enableProbeRequestLog", "EnableVarLogCollection",
        ]),
        inner in proptest::sample::select(vec![
            "protocol", "endpoint", "samplingRate", "exportInterval", "profiling",
        ]),
        value in proptest::sample::select(vec![
            "null", "true", "0", "-1", "1.5", "1e308", "-9223372036854775808",
            "18446744073709551615", "\"\"", "\"grpc\"", "[]", "{}", "\"\\u0000\"",
        ]),
    ) {
        for text in [
            format!(r#"{{"{field}":{value}}}"#),
            format!(r#"{{"{field}":{{"{inner}":{value}}}}}"#),
        ] {
            if let Ok(config) = ObservabilityConfig::decode(&text) {
                let _ = config.plan();
            }
        }
    }
}
