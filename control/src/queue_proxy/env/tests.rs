use std::collections::HashMap;

use super::*;

/// What Knative 1.18's reconciler sets for a revision with CC 10 (`queue.go:354-469`).
fn knative() -> HashMap<&'static str, String> {
    [
        ("SERVING_NAMESPACE", "default"),
        ("SERVING_SERVICE", "hello"),
        ("SERVING_CONFIGURATION", "hello"),
        ("SERVING_REVISION", "hello-00001"),
        ("SERVING_POD", "hello-00001-deployment-abc"),
        ("SERVING_POD_IP", "10.0.0.7"),
        ("QUEUE_SERVING_PORT", "8012"),
        ("QUEUE_SERVING_TLS_PORT", "8112"),
        ("USER_PORT", "8080"),
        ("CONTAINER_CONCURRENCY", "10"),
        ("REVISION_TIMEOUT_SECONDS", "300"),
        ("REVISION_RESPONSE_START_TIMEOUT_SECONDS", "0"),
        ("REVISION_IDLE_TIMEOUT_SECONDS", "0"),
        (
            "SERVING_READINESS_PROBE",
            r#"{"tcpSocket":{"port":8080,"host":"127.0.0.1"},"successThreshold":1}"#,
        ),
        ("SERVING_LOGGING_CONFIG", "{}"),
        ("SERVING_LOGGING_LEVEL", ""),
        ("SERVING_REQUEST_METRICS_BACKEND", "prometheus"),
        ("ENABLE_HTTP2_AUTO_DETECTION", "false"),
        ("SOME_KEY_OF_A_LATER_RELEASE", "whatever"),
    ]
    .into_iter()
    .map(|(key, value)| (key, value.to_string()))
    .collect()
}

fn parse_map(env: &HashMap<&'static str, String>) -> Result<QueueProxyEnv, EnvError> {
    parse(|key| env.get(key).cloned())
}

#[test]
fn knatives_environment_reads_as_set() {
    let env = parse_map(&knative()).expect("valid");
    assert_eq!(env.namespace, "default");
    assert_eq!(env.revision, "hello-00001");
    assert_eq!(env.pod_ip, Some("10.0.0.7".parse().unwrap()));
    assert_eq!(
        (env.serving_port, env.tls_port, env.user_port),
        (8012, 8112, 8080)
    );
    assert_eq!(env.container_concurrency, 10);
    assert_eq!(env.timeout_seconds, 300);
    assert!(env.readiness_probe.contains("tcpSocket"));
    assert_eq!(
        env.activator_service_url.map(|url| url.authority),
        Some(FORK_DEFAULT_ACTIVATOR_URL[7..].to_string()),
        "Knative sets none: the fork's default"
    );
    assert_eq!(
        env.not_acted_on,
        vec!["SERVING_LOGGING_CONFIG", "ENABLE_HTTP2_AUTO_DETECTION"]
    );
}

#[test]
fn knative_1_18s_request_metrics_are_served_only_by_the_prometheus_backend() {
    let rows: &[(Option<&str>, bool, Option<&str>)] = &[
        (Some("prometheus"), true, None),
        (None, false, None),
        (Some(""), false, None),
        (
            Some("opencensus"),
            false,
            Some("OpenCensus agent is not built"),
        ),
        (
            Some("Prometheus"),
            false,
            Some("not a backend Knative 1.18 has"),
        ),
        (
            Some("stackdriver"),
            false,
            Some("not a backend Knative 1.18 has"),
        ),
    ];
    for (backend, served, warned) in rows {
        let mut env = knative();
        match backend {
            Some(backend) => env.insert("SERVING_REQUEST_METRICS_BACKEND", backend.to_string()),
            None => env.remove("SERVING_REQUEST_METRICS_BACKEND"),
        };
        let parsed = parse_map(&env).expect("valid");
        assert_eq!(
            parsed.observability,
            ObservabilitySource::Knative118 {
                request_metrics: *served
            },
            "{backend:?}"
        );
        let warnings: Vec<_> = parsed
            .warnings
            .iter()
            .filter(|(key, _)| *key == "SERVING_REQUEST_METRICS_BACKEND")
            .collect();
        match warned {
            None => assert!(warnings.is_empty(), "{backend:?}: {warnings:?}"),
            Some(said) => {
                assert_eq!(warnings.len(), 1, "{backend:?}");
                assert!(warnings[0].1.contains(said), "{backend:?}: {warnings:?}");
            }
        }
        assert!(!parsed
            .not_acted_on
            .contains(&"SERVING_REQUEST_METRICS_BACKEND"));
    }
}

#[test]
fn the_request_log_is_on_only_when_enabled_with_a_template() {
    let template = r#"{"status": {{.Response.Code}}}"#;
    let cases = [
        (Some("true"), Some(template), Some(template)),
        (Some("1"), Some(template), Some(template)),
        (Some("false"), Some(template), None),
        (None, Some(template), None),
        (Some("true"), Some(""), None),
        (Some("true"), None, None),
    ];
    for (enabled, text, expected) in cases {
        let mut env = knative();
        if let Some(enabled) = enabled {
            env.insert("SERVING_ENABLE_REQUEST_LOG", enabled.into());
        }
        if let Some(text) = text {
            env.insert("SERVING_REQUEST_LOG_TEMPLATE", text.into());
        }
        let parsed = parse_map(&env).expect("valid");
        assert_eq!(
            parsed.request_log_template.as_deref(),
            expected,
            "{enabled:?} {text:?}"
        );
        assert!(!parsed
            .not_acted_on
            .contains(&"SERVING_REQUEST_LOG_TEMPLATE"));
    }
    let mut env = knative();
    env.insert("SERVING_ENABLE_PROBE_REQUEST_LOG", "true".into());
    assert!(parse_map(&env).expect("valid").probe_request_log);
    env.insert("SERVING_ENABLE_REQUEST_LOG", "yes".into());
    let error = parse_map(&env).unwrap_err();
    assert!(error.to_string().contains("SERVING_ENABLE_REQUEST_LOG"));
}

/// What Knative 1.23's reconciler sets, every key (`queue.go:355-449`), for CC 10 with
/// config-observability's request log and Prometheus request metrics on.
fn knative_1_23() -> HashMap<&'static str, String> {
    let observability = r#"{"tracing":{"protocol":"none"},"metrics":{"protocol":"none"},"runtime":{"profiling":"disabled","exportInterval":15000000000},"requestMetrics":{"protocol":"prometheus"},"enableRequestLog":true,"requestLogTemplate":"{{.Request.Method}} {{.Response.Code}}","enableProbeRequestLog":true}"#;
    [
        ("SERVING_NAMESPACE", "default"),
        ("SERVING_SERVICE", "hello"),
        ("SERVING_CONFIGURATION", "hello"),
        ("SERVING_REVISION", "hello-00001"),
        ("QUEUE_SERVING_PORT", "8012"),
        ("QUEUE_SERVING_TLS_PORT", "8112"),
        ("CONTAINER_CONCURRENCY", "10"),
        ("REVISION_TIMEOUT_SECONDS", "300"),
        ("REVISION_RESPONSE_START_TIMEOUT_SECONDS", "0"),
        ("REVISION_IDLE_TIMEOUT_SECONDS", "0"),
        ("SERVING_POD", "hello-00001-deployment-abc"),
        ("SERVING_POD_IP", "10.0.0.7"),
        ("SERVING_LOGGING_CONFIG", "{}"),
        ("SERVING_LOGGING_LEVEL", ""),
        ("USER_PORT", "8080"),
        ("SYSTEM_NAMESPACE", "knative-serving"),
        (
            "SERVING_READINESS_PROBE",
            r#"{"tcpSocket":{"port":8080,"host":"127.0.0.1"},"successThreshold":1}"#,
        ),
        ("HOST_IP", "10.1.0.3"),
        ("ENABLE_HTTP2_AUTO_DETECTION", "false"),
        ("ENABLE_HTTP_FULL_DUPLEX", "false"),
        ("ROOT_CA", ""),
        ("QUEUE_PROXY_TLS_MIN_VERSION", ""),
        ("QUEUE_PROXY_TLS_MAX_VERSION", ""),
        ("QUEUE_PROXY_TLS_CIPHER_SUITES", ""),
        ("QUEUE_PROXY_TLS_CURVE_PREFERENCES", ""),
        ("ENABLE_MULTI_CONTAINER_PROBES", "false"),
        ("OBSERVABILITY_CONFIG", observability),
    ]
    .into_iter()
    .map(|(key, value)| (key, value.to_string()))
    .collect()
}

#[test]
fn knative_1_23s_environment_reads_as_set() {
    let env = parse_map(&knative_1_23()).expect("valid");
    assert_eq!(
        env.observability,
        ObservabilitySource::ObservabilityConfig {
            request_metrics: RequestMetricsExport::Prometheus { listen: None },
            not_built: Vec::new(),
        }
    );
    assert_eq!(
        env.request_log_template.as_deref(),
        Some("{{.Request.Method}} {{.Response.Code}}")
    );
    assert!(env.probe_request_log);
    assert_eq!(env.request_log_key(), "OBSERVABILITY_CONFIG");
    assert!(env.tls.is_default() && env.tls.problems.is_empty());
    assert_eq!(
        env.not_acted_on,
        vec![
            "SERVING_LOGGING_CONFIG",
            "ENABLE_HTTP2_AUTO_DETECTION",
            "ENABLE_HTTP_FULL_DUPLEX",
            "SYSTEM_NAMESPACE"
        ]
    );
    assert!(env.superseded.is_empty());
    assert_eq!(env.container_concurrency, 10);
}

/// 1.23's queue-proxy reads only OBSERVABILITY_CONFIG for these; with it set, the 1.18 keys
/// are not read here either, not even checked, and are named for start-up to say so.
#[test]
fn with_observability_config_the_1_18_keys_are_not_read() {
    let mut env = knative_1_23();
    env.insert("SERVING_ENABLE_REQUEST_LOG", "yes".into());
    env.insert("SERVING_REQUEST_LOG_TEMPLATE", "{{.Request.Host}}".into());
    env.insert("SERVING_ENABLE_PROBE_REQUEST_LOG", "false".into());
    env.insert(
        "SERVING_REQUEST_METRICS_REPORTING_PERIOD_SECONDS",
        "often".into(),
    );
    env.insert("TRACING_CONFIG_BACKEND", "zipkin".into());
    let parsed = parse_map(&env).expect("the 1.18 keys are not read");
    assert_eq!(
        parsed.request_log_template.as_deref(),
        Some("{{.Request.Method}} {{.Response.Code}}")
    );
    assert!(parsed.probe_request_log);
    assert_eq!(
        parsed.superseded,
        vec![
            "SERVING_ENABLE_REQUEST_LOG",
            "SERVING_REQUEST_LOG_TEMPLATE",
            "SERVING_ENABLE_PROBE_REQUEST_LOG",
            "SERVING_REQUEST_METRICS_REPORTING_PERIOD_SECONDS",
            "TRACING_CONFIG_BACKEND"
        ]
    );
    assert!(!parsed.not_acted_on.contains(&"TRACING_CONFIG_BACKEND"));

    // Empty counts as absent: the 1.18 keys decide (and are checked) again.
    env.insert("OBSERVABILITY_CONFIG", String::new());
    let error = parse_map(&env).unwrap_err();
    let keys: Vec<&str> = error.invalid.iter().map(|(key, _)| *key).collect();
    assert_eq!(
        keys,
        [
            "SERVING_ENABLE_REQUEST_LOG",
            "SERVING_REQUEST_METRICS_REPORTING_PERIOD_SECONDS"
        ]
    );
    env.insert("SERVING_ENABLE_REQUEST_LOG", "true".into());
    env.remove("SERVING_REQUEST_METRICS_REPORTING_PERIOD_SECONDS");
    let parsed = parse_map(&env).unwrap();
    // 1.23's environment has no SERVING_REQUEST_METRICS_BACKEND: read as 1.18 reads it, none.
    assert_eq!(
        parsed.observability,
        ObservabilitySource::Knative118 {
            request_metrics: false
        }
    );
    assert_eq!(
        parsed.request_log_template.as_deref(),
        Some("{{.Request.Host}}")
    );
    assert!(!parsed.probe_request_log);
    assert_eq!(parsed.request_log_key(), "SERVING_REQUEST_LOG_TEMPLATE");
}

#[test]
fn a_bad_observability_config_is_named_with_the_field() {
    for (text, said) in [
        ("{", "not as upstream's queue-proxy decodes it: EOF"),
        (
            r#"{"enableRequestLog":1}"#,
            "enableRequestLog to be a boolean",
        ),
        (
            r#"{"requestMetrics":{"protocol":"opencensus"}}"#,
            "requestMetrics.protocol: \"opencensus\"",
        ),
    ] {
        let mut env = knative_1_23();
        env.insert("OBSERVABILITY_CONFIG", text.into());
        env.insert("USER_PORT", "0".into());
        let error = parse_map(&env).unwrap_err();
        let keys: Vec<&str> = error.invalid.iter().map(|(key, _)| *key).collect();
        assert_eq!(
            keys,
            ["OBSERVABILITY_CONFIG", "USER_PORT"],
            "{text}: every problem"
        );
        assert!(error.invalid[0].1.contains(said), "{text}: {error}");
        assert!(
            error.to_string().contains("OBSERVABILITY_CONFIG: "),
            "{error}"
        );
    }
}

#[test]
fn tls_settings_are_read_with_the_rest() {
    let mut env = knative_1_23();
    env.insert("QUEUE_PROXY_TLS_MIN_VERSION", "1.2".into());
    env.insert(
        "QUEUE_PROXY_TLS_CURVE_PREFERENCES",
        "X25519,brainpool".into(),
    );
    // Upstream fails on a bad one only when TLS is on (queue_proxy.rs decides that).
    let parsed = parse_map(&env).expect("not an environment error by itself");
    assert_eq!(parsed.tls.min_version, Some(crate::tls::TlsVersion::Tls12));
    assert_eq!(parsed.tls.problems.len(), 1);
    assert_eq!(
        parsed.tls.problems[0].0,
        "QUEUE_PROXY_TLS_CURVE_PREFERENCES"
    );
}

#[test]
fn every_missing_key_is_named_at_once_and_empty_strings_count_as_present() {
    let error = parse(|_| None).unwrap_err();
    assert_eq!(error.missing, REQUIRED.to_vec());
    let text = error.to_string();
    assert!(text.contains("missing SERVING_NAMESPACE, SERVING_CONFIGURATION"));

    let mut env = knative();
    env.remove("USER_PORT");
    env.remove("SERVING_REVISION");
    env.insert("SERVING_CONFIGURATION", String::new());
    let error = parse_map(&env).unwrap_err();
    assert_eq!(error.missing, vec!["SERVING_REVISION", "USER_PORT"]);
    assert!(error.invalid.is_empty());
}

#[test]
fn numbers_parse_as_go_does_and_are_bounded() {
    let table: [(&str, Option<i128>); 16] = [
        ("10", Some(10)),
        ("+7", Some(7)),
        ("-1", Some(-1)),
        ("0x10", Some(16)),
        ("0X1f", Some(31)),
        ("0o17", Some(15)),
        ("017", Some(15)),
        ("0b101", Some(5)),
        ("0x_1_0", Some(16)),
        ("0", Some(0)),
        ("", None),
        ("1_000", None),
        ("0x", None),
        (" 5", None),
        ("9223372036854775808", None),
        ("-9223372036854775808", Some(i128::from(i64::MIN))),
    ];
    for (text, expected) in table {
        assert_eq!(go_int(text), expected, "{text:?}");
    }

    let mut env = knative();
    env.insert("CONTAINER_CONCURRENCY", "-3".into());
    assert_eq!(parse_map(&env).unwrap().container_concurrency, 0);
    env.insert("CONTAINER_CONCURRENCY", "0x10".into());
    assert_eq!(parse_map(&env).unwrap().container_concurrency, 16);

    env.insert("CONTAINER_CONCURRENCY", "99999999999".into());
    env.insert("REVISION_TIMEOUT_SECONDS", "18446744073709551615".into());
    env.insert("REVISION_IDLE_TIMEOUT_SECONDS", "-5".into());
    env.insert("USER_PORT", "70000".into());
    env.insert("SERVING_POD_IP", "not-an-ip".into());
    env.insert("ENABLE_HTTP_FULL_DUPLEX", "yes".into());
    env.insert("REVISION_RESPONSE_START_TIMEOUT_SECONDS", "".into());
    let error = parse_map(&env).unwrap_err();
    let keys: Vec<&str> = error.invalid.iter().map(|(key, _)| *key).collect();
    assert_eq!(
        keys,
        vec![
            "SERVING_POD_IP",
            "USER_PORT",
            "CONTAINER_CONCURRENCY",
            "REVISION_TIMEOUT_SECONDS",
            "REVISION_RESPONSE_START_TIMEOUT_SECONDS",
            "REVISION_IDLE_TIMEOUT_SECONDS",
            "ENABLE_HTTP_FULL_DUPLEX",
        ]
    );
    assert!(error.missing.is_empty());
    assert!(error
        .to_string()
        .contains("USER_PORT: \"70000\" is not a port"));
}

#[test]
fn the_push_goes_to_the_forks_default_unless_turned_off_with_an_empty_url() {
    let mut env = knative();
    env.remove("ACTIVATOR_SERVICE_URL");
    let default = parse_map(&env).unwrap().activator_service_url;
    assert_eq!(
        default,
        Some(ActivatorUrl::parse(FORK_DEFAULT_ACTIVATOR_URL).unwrap()),
        "absent: the fork's default"
    );
    for off in ["", "  "] {
        env.insert("ACTIVATOR_SERVICE_URL", off.into());
        assert_eq!(
            parse_map(&env).unwrap().activator_service_url,
            None,
            "{off:?}"
        );
    }
    let table = [
        (
            FORK_DEFAULT_ACTIVATOR_URL,
            "activator-service.knative-serving.svc.cluster.local",
            80,
            "activator-service.knative-serving.svc.cluster.local:80",
            "/api/v1/pod-registration",
        ),
        (
            "http://activator-service.knative-serving",
            "activator-service.knative-serving",
            80,
            "activator-service.knative-serving",
            "/api/v1/pod-registration",
        ),
        (
            "HTTP://10.0.0.9:8012/",
            "10.0.0.9",
            8012,
            "10.0.0.9:8012",
            "/api/v1/pod-registration",
        ),
        (
            "http://[fd00::9]:8012/prefix//",
            "fd00::9",
            8012,
            "[fd00::9]:8012",
            "/prefix/api/v1/pod-registration",
        ),
    ];
    for (text, host, port, authority, path) in table {
        env.insert("ACTIVATOR_SERVICE_URL", text.into());
        let url = parse_map(&env)
            .unwrap_or_else(|error| panic!("{text}: {error}"))
            .activator_service_url
            .unwrap();
        assert_eq!(
            url,
            ActivatorUrl {
                host: host.into(),
                port,
                authority: authority.into(),
                path: path.into(),
            },
            "{text}"
        );
    }
}

#[test]
fn a_bad_activator_url_is_named() {
    for (text, problem) in [
        ("activator-service:80", "not an http:// URL"),
        ("https://activator-service", "https is not built"),
        ("ftp://activator-service", "not an http:// URL"),
        ("http://", "not a URL"),
        ("http://user@activator-service", "user name"),
        ("http://activator-service:0", "port 0"),
        ("http://activator-service:70000", "not a port"),
        ("http://activator-service/?a=b", "query"),
        ("http://activator service", "not a URL"),
        (" http://activator-service", "not a URL"),
    ] {
        let mut env = knative();
        env.insert("ACTIVATOR_SERVICE_URL", text.into());
        let error = parse_map(&env).expect_err(text);
        assert_eq!(error.invalid.len(), 1, "{text}: {error}");
        let (key, said) = &error.invalid[0];
        assert_eq!(*key, "ACTIVATOR_SERVICE_URL", "{text}");
        assert!(said.contains(problem), "{text}: {said}");
    }
}

#[test]
fn with_the_push_on_every_name_a_registration_carries_must_be_set() {
    let mut env = knative();
    env.insert("ACTIVATOR_SERVICE_URL", "http://10.0.0.9".into());
    env.insert("SERVING_POD_IP", String::new());
    env.insert("SERVING_POD", String::new());
    env.insert("SERVING_REVISION", String::new());
    let error = parse_map(&env).unwrap_err();
    let keys: Vec<&str> = error.invalid.iter().map(|(key, _)| *key).collect();
    assert_eq!(keys, ["SERVING_POD_IP", "SERVING_POD", "SERVING_REVISION"]);
    // Without the push they are only log fields, as upstream.
    env.insert("ACTIVATOR_SERVICE_URL", String::new());
    assert!(parse_map(&env).is_ok());
}

#[test]
fn booleans_parse_as_go_does() {
    for text in ["1", "t", "T", "true", "TRUE", "True"] {
        assert_eq!(go_bool(text), Some(true));
    }
    for text in ["0", "f", "F", "false", "FALSE", "False"] {
        assert_eq!(go_bool(text), Some(false));
    }
    for text in ["", "yes", "tRUE", " true"] {
        assert_eq!(go_bool(text), None);
    }
}

/// Review finding: the sidecar got the activator's budget (64 MiB kept back, 75 % of the
/// rest for the caps), so a 64 MiB limit exited 2 and 128 MiB queued 6 144 requests at most,
/// fewer than the breaker's 10 × CC from CC 615. Rows: (limit MiB, containerConcurrency) →
/// fits; then every request the breaker promises (CC in flight, 10 × CC waiting, each on a
/// connection) is admitted by the caps. Each of those connections is counted at the worst a
/// connection costs (`budget::CONNECTION_BYTES`), so 128 MiB holds CC 250 but not 615: that
/// is refused at start, naming CONTAINER_CONCURRENCY, instead of answering 503 later.
#[test]
fn a_sidecar_sized_limit_holds_the_breaker_or_is_refused_naming_containerconcurrency() {
    const MIB: u64 = 1 << 20;
    let rows: &[(u64, u32, bool)] = &[
        (32, 0, true),
        (32, 1, true),
        (32, 10, true),
        (64, 10, true),
        (128, 250, true),
        (32, 100, false),
        (128, 615, false),
        (64, 1000, false),
    ];
    for &(limit, concurrency, fits) in rows {
        let mut vars = knative();
        vars.insert("CONTAINER_CONCURRENCY", concurrency.to_string());
        let env = parse_map(&vars).expect("a Knative environment");
        let proxy = crate::config::ProxySettings::default();
        let fitted = budget::fit(&proxy, 1, Some(limit * MIB), &env.budget_needs());
        match fitted {
            Ok(fitted) => {
                assert!(fits, "{limit} MiB, CC {concurrency}: fits, unexpectedly");
                let waiting = concurrency * QUEUE_PER_CONCURRENCY;
                let caps = fitted.caps;
                assert!(
                    caps.max_queued_requests >= waiting.max(1),
                    "{limit} MiB {caps:?}"
                );
                assert!(
                    caps.max_connections_per_shard
                        >= (concurrency + waiting) as usize + SPARE_CONNECTIONS,
                    "{limit} MiB, CC {concurrency}: {caps:?}"
                );
                let room =
                    (limit * MIB - budget::QUEUE_PROXY_RESERVED_BYTES) / 100 * budget::CAPS_PERCENT;
                assert!(fitted.worst <= room, "{limit} MiB, CC {concurrency}");
            }
            Err(error) => {
                assert!(!fits, "{limit} MiB, CC {concurrency}: {error}");
                assert!(error.contains("CONTAINER_CONCURRENCY"), "{error}");
            }
        }
    }
}

/// What 1.18's reconciler sets from config-tracing (`queue.go:417-427`).
fn knative_tracing(
    backend: &str,
    endpoint: &str,
    debug: &str,
    rate: &str,
) -> HashMap<&'static str, String> {
    let mut env = knative();
    env.insert("TRACING_CONFIG_BACKEND", backend.into());
    env.insert("TRACING_CONFIG_ZIPKIN_ENDPOINT", endpoint.into());
    env.insert("TRACING_CONFIG_DEBUG", debug.into());
    env.insert("TRACING_CONFIG_SAMPLE_RATE", rate.into());
    env
}

const ZIPKIN: &str = "http://zipkin.istio-system.svc.cluster.local:9411/api/v2/spans";

#[test]
fn the_1_18_tracing_keys_are_acted_on() {
    use crate::config::trace::TraceProtocol;

    let zipkin = |rate| TracingConfig {
        protocol: TraceProtocol::Zipkin,
        endpoint: ZIPKIN.into(),
        sampling_rate: rate,
    };
    let table = [
        (
            knative_tracing("zipkin", ZIPKIN, "false", "0.1"),
            zipkin(0.1),
        ),
        (
            knative_tracing("zipkin", ZIPKIN, "true", "0.1"),
            zipkin(1.0),
        ),
        (
            knative_tracing("zipkin", ZIPKIN, "false", "1e-05"),
            zipkin(1e-5),
        ),
        // Outside 0..=1: as OpenCensus' sampler takes it (config-tracing would refuse it).
        (knative_tracing("zipkin", ZIPKIN, "false", "2"), zipkin(1.0)),
        (
            knative_tracing("zipkin", ZIPKIN, "false", "NaN"),
            zipkin(0.0),
        ),
        // What an empty config-tracing makes the reconciler set.
        (
            knative_tracing("none", "", "false", "0.1"),
            TracingConfig::OFF,
        ),
        // Upstream builds a tracer without an exporter: nothing exported (module docs).
        (
            knative_tracing("", ZIPKIN, "false", "1"),
            TracingConfig::OFF,
        ),
        (knative(), TracingConfig::OFF),
    ];
    for (env, expected) in table {
        let parsed = parse_map(&env).unwrap_or_else(|error| panic!("{env:?}: {error}"));
        assert_eq!(parsed.tracing, expected, "{env:?}");
        assert!(parsed.warnings.is_empty(), "{env:?}: {:?}", parsed.warnings);
        assert!(
            !parsed
                .not_acted_on
                .iter()
                .any(|key| key.starts_with("TRACING_CONFIG_")),
            "{:?}",
            parsed.not_acted_on
        );
    }
    // An absent rate is Go's zero value.
    let mut env = knative_tracing("zipkin", ZIPKIN, "false", "");
    env.remove("TRACING_CONFIG_SAMPLE_RATE");
    env.remove("TRACING_CONFIG_DEBUG");
    assert_eq!(parse_map(&env).unwrap().tracing, zipkin(0.0));
}

#[test]
fn a_1_18_tracing_key_that_does_not_parse_exits_naming_it() {
    for (env, key) in [
        (
            knative_tracing("zipkin", ZIPKIN, "false", "ten percent"),
            "TRACING_CONFIG_SAMPLE_RATE",
        ),
        (
            knative_tracing("zipkin", ZIPKIN, "false", ""),
            "TRACING_CONFIG_SAMPLE_RATE",
        ),
        (
            knative_tracing("zipkin", ZIPKIN, "false", " 0.1"),
            "TRACING_CONFIG_SAMPLE_RATE",
        ),
        (
            knative_tracing("zipkin", ZIPKIN, "maybe", "0.1"),
            "TRACING_CONFIG_DEBUG",
        ),
        (
            knative_tracing("none", "", "", "0.1"),
            "TRACING_CONFIG_DEBUG",
        ),
    ] {
        let error = parse_map(&env).unwrap_err();
        let keys: Vec<&str> = error.invalid.iter().map(|(key, _)| *key).collect();
        assert_eq!(keys, [key], "{env:?}: {error}");
        assert!(error.to_string().contains(key), "{error}");
    }
}

#[test]
fn a_1_18_tracing_backend_or_endpoint_no_exporter_can_use_is_off_with_a_warning() {
    for (env, key, said) in [
        (
            knative_tracing("jaeger", ZIPKIN, "false", "0.1"),
            "TRACING_CONFIG_BACKEND",
            "\"jaeger\" is neither",
        ),
        (
            knative_tracing("zipkin", "", "false", "0.1"),
            "TRACING_CONFIG_ZIPKIN_ENDPOINT",
            "needs an endpoint",
        ),
        (
            knative_tracing("zipkin", "https://zipkin:9411/api/v2/spans", "false", "0.1"),
            "TRACING_CONFIG_ZIPKIN_ENDPOINT",
            "TLS to trace collectors is not built",
        ),
        (
            knative_tracing("zipkin", "zipkin:9411", "false", "0.1"),
            "TRACING_CONFIG_ZIPKIN_ENDPOINT",
            "has no scheme",
        ),
    ] {
        let parsed = parse_map(&env).expect("starts");
        assert_eq!(parsed.tracing, TracingConfig::OFF, "{env:?}");
        assert_eq!(parsed.warnings.len(), 1, "{:?}", parsed.warnings);
        assert_eq!(parsed.warnings[0].0, key);
        assert!(parsed.warnings[0].1.contains(said), "{:?}", parsed.warnings);
    }
}

#[test]
fn observability_configs_tracing_is_acted_on_and_the_1_18_keys_are_not_read() {
    use crate::config::trace::TraceProtocol;

    let mut env = knative_1_23();
    env.insert(
        "OBSERVABILITY_CONFIG",
        r#"{"tracing":{"protocol":"grpc","endpoint":"http://otel:4317","samplingRate":0.5}}"#
            .into(),
    );
    // Not read: no error for the rate that does not parse, no Zipkin.
    env.insert("TRACING_CONFIG_BACKEND", "zipkin".into());
    env.insert("TRACING_CONFIG_SAMPLE_RATE", "lots".into());
    let parsed = parse_map(&env).expect("the 1.18 keys are not read");
    assert_eq!(
        parsed.tracing,
        TracingConfig {
            protocol: TraceProtocol::Grpc,
            endpoint: "http://otel:4317".into(),
            sampling_rate: 0.5,
        }
    );
    assert!(parsed.superseded.contains(&"TRACING_CONFIG_SAMPLE_RATE"));
    assert_eq!(
        parsed.observability,
        ObservabilitySource::ObservabilityConfig {
            request_metrics: RequestMetricsExport::Off,
            not_built: Vec::new(),
        },
        "nothing unbuilt asked for"
    );

    env.insert(
        "OBSERVABILITY_CONFIG",
        r#"{"tracing":{"protocol":"http/protobuf","endpoint":"https://otel:4318"}}"#.into(),
    );
    let parsed = parse_map(&env).expect("starts");
    assert_eq!(parsed.tracing, TracingConfig::OFF);
    assert_eq!(parsed.warnings.len(), 1);
    assert_eq!(parsed.warnings[0].0, "OBSERVABILITY_CONFIG");
    assert!(
        parsed.warnings[0].1.starts_with("tracing.endpoint: "),
        "{:?}",
        parsed.warnings
    );

    env.insert(
        "OBSERVABILITY_CONFIG",
        r#"{"tracing":{"protocol":"zipkin"}}"#.into(),
    );
    let error = parse_map(&env).unwrap_err();
    assert_eq!(error.invalid[0].0, "OBSERVABILITY_CONFIG");
    assert!(
        error.invalid[0].1.contains("tracing.protocol: \"zipkin\""),
        "{error}"
    );
}
