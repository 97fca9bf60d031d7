use super::*;
use crate::config::trace::TraceProtocol;

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect()
}

fn observability(pairs: &[(&str, &str)]) -> Result<Option<TracingConfig>, Refused> {
    from_config_observability(OBSERVABILITY_CONFIG_MAP, &map(pairs))
}

fn tracing(pairs: &[(&str, &str)]) -> Result<TracingConfig, Refused> {
    from_config_tracing(&map(pairs))
}

/// A map's data, the key refused, and part of why.
type RefusedCase<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);

fn config(protocol: TraceProtocol, endpoint: &str, sampling_rate: f64) -> TracingConfig {
    TracingConfig {
        protocol,
        endpoint: endpoint.into(),
        sampling_rate,
    }
}

const OTLP: &str = "http://jaeger-collector.observability:4318/v1/traces";
const ZIPKIN: &str = "http://zipkin.istio-system.svc.cluster.local:9411/api/v2/spans";

/// What 1.18 ships in config-observability (no tracing key) and what 1.19+ ships in
/// config-tracing: an `_example` only.
const EXAMPLE_ONLY: &[(&str, &str)] = &[("_example", "# tracing-protocol: grpc\n")];

#[test]
fn config_observability_without_a_tracing_key_does_not_decide() {
    assert_eq!(observability(&[]), Ok(None));
    assert_eq!(observability(EXAMPLE_ONLY), Ok(None));
    // 1.18's own keys, and 1.19+'s other keys.
    assert_eq!(
        observability(&[
            ("metrics.backend-destination", "prometheus"),
            ("logging.enable-request-log", "true"),
            ("metrics-protocol", "prometheus"),
        ]),
        Ok(None)
    );
}

#[test]
fn config_observability_reads_as_upstreams_tracing_config() {
    let table: &[(&[(&str, &str)], TracingConfig)] = &[
        // The release's own example (`config/core/configmaps/observability.yaml:133-146`).
        (
            &[
                ("tracing-protocol", "http/protobuf"),
                ("tracing-endpoint", OTLP),
                ("tracing-sampling-rate", "1"),
            ],
            config(TraceProtocol::HttpProtobuf, OTLP, 1.0),
        ),
        // The rate's default is 0: exported, nothing sampled (upstream's NeverSample).
        (
            &[
                ("tracing-protocol", "grpc"),
                ("tracing-endpoint", "http://otel:4317"),
            ],
            config(TraceProtocol::Grpc, "http://otel:4317", 0.0),
        ),
        (
            &[
                ("tracing-protocol", "grpc"),
                ("tracing-endpoint", "http://otel:4317"),
                ("tracing-sampling-rate", "0.25"),
            ],
            config(TraceProtocol::Grpc, "http://otel:4317", 0.25),
        ),
        // Strings trimmed, as `configmap/parser` trims them.
        (
            &[
                ("tracing-protocol", " grpc\n"),
                ("tracing-endpoint", " http://otel:4317 "),
                ("tracing-sampling-rate", "1e-1"),
            ],
            config(TraceProtocol::Grpc, "http://otel:4317", 0.1),
        ),
        // stdout samples every trace.
        (
            &[
                ("tracing-protocol", "stdout"),
                ("tracing-sampling-rate", "0"),
            ],
            config(TraceProtocol::Stdout, "", 1.0),
        ),
        // Any tracing key decides, the protocol defaulting to none.
        (&[("tracing-sampling-rate", "0.5")], TracingConfig::OFF),
        (&[("tracing-protocol", "none")], TracingConfig::OFF),
        (
            &[("tracing-protocol", "none"), ("tracing-endpoint", "  ")],
            TracingConfig::OFF,
        ),
    ];
    for (data, expected) in table {
        assert_eq!(observability(data), Ok(Some(expected.clone())), "{data:?}");
    }
}

#[test]
fn config_observability_refuses_what_upstream_refuses_naming_the_key() {
    let table: &[RefusedCase] = &[
        (
            &[("tracing-protocol", "zipkin")],
            TRACING_PROTOCOL,
            "\"zipkin\" is not one of none, grpc, http/protobuf, stdout",
        ),
        (
            &[("tracing-protocol", "GRPC")],
            TRACING_PROTOCOL,
            "\"GRPC\"",
        ),
        (&[("tracing-protocol", "")], TRACING_PROTOCOL, "\"\""),
        (
            &[
                ("tracing-protocol", "grpc"),
                ("tracing-endpoint", "http://x:1"),
                ("tracing-sampling-rate", "half"),
            ],
            TRACING_SAMPLING_RATE,
            "\"half\" is not a number",
        ),
        // ParseFloat does not trim.
        (
            &[
                ("tracing-protocol", "grpc"),
                ("tracing-endpoint", "http://x:1"),
                ("tracing-sampling-rate", " 0.5"),
            ],
            TRACING_SAMPLING_RATE,
            "not a number",
        ),
        (
            &[
                ("tracing-protocol", "grpc"),
                ("tracing-endpoint", "http://x:1"),
                ("tracing-sampling-rate", "1.5"),
            ],
            TRACING_SAMPLING_RATE,
            "1.5 is not from 0 to 1",
        ),
        (
            &[
                ("tracing-protocol", "grpc"),
                ("tracing-endpoint", "http://x:1"),
                ("tracing-sampling-rate", "-0.1"),
            ],
            TRACING_SAMPLING_RATE,
            "not from 0 to 1",
        ),
        (
            &[
                ("tracing-protocol", "grpc"),
                ("tracing-endpoint", "http://x:1"),
                ("tracing-sampling-rate", "NaN"),
            ],
            TRACING_SAMPLING_RATE,
            "NaN is not from 0 to 1",
        ),
        (
            &[
                ("tracing-protocol", "grpc"),
                ("tracing-endpoint", "http://x:1"),
                ("tracing-sampling-rate", "1e400"),
            ],
            TRACING_SAMPLING_RATE,
            "not a number",
        ),
        (
            &[("tracing-protocol", "grpc")],
            TRACING_ENDPOINT,
            "needs an endpoint",
        ),
        (
            &[("tracing-protocol", "grpc"), ("tracing-endpoint", "  ")],
            TRACING_ENDPOINT,
            "needs an endpoint",
        ),
        (
            &[
                ("tracing-protocol", "http/protobuf"),
                ("tracing-endpoint", "collector"),
            ],
            TRACING_ENDPOINT,
            "\"collector\": no host",
        ),
        // Upstream reads host:port as https://host:port: TLS to collectors is not built.
        (
            &[
                ("tracing-protocol", "grpc"),
                ("tracing-endpoint", "otel:4317"),
            ],
            TRACING_ENDPOINT,
            "has no scheme",
        ),
        (
            &[
                ("tracing-protocol", "grpc"),
                ("tracing-endpoint", "https://otel:4317"),
            ],
            TRACING_ENDPOINT,
            "TLS to trace collectors is not built",
        ),
        (
            &[("tracing-protocol", "none"), ("tracing-endpoint", OTLP)],
            TRACING_ENDPOINT,
            "sends nowhere",
        ),
        (
            &[("tracing-protocol", "stdout"), ("tracing-endpoint", OTLP)],
            TRACING_ENDPOINT,
            "sends nowhere",
        ),
        // Upstream's order: the endpoint before the rate.
        (
            &[("tracing-protocol", "grpc"), ("tracing-sampling-rate", "2")],
            TRACING_ENDPOINT,
            "needs an endpoint",
        ),
    ];
    for (data, key, said) in table {
        let refused = observability(data).expect_err(&format!("{data:?}"));
        assert_eq!(refused.key, *key, "{data:?}: {refused}");
        assert!(refused.problem.contains(said), "{data:?}: {refused}");
        assert!(
            refused
                .to_string()
                .starts_with(&format!("config-observability: {key}: ")),
            "{refused}"
        );
    }
}

#[test]
fn a_long_value_is_quoted_cut_short() {
    let long = "x".repeat(10_000);
    let refused = observability(&[("tracing-protocol", long.as_str())]).unwrap_err();
    assert!(refused.problem.len() < 200, "{refused}");
    assert!(refused.problem.contains("(10000 bytes)"), "{refused}");
}

#[test]
fn config_tracing_reads_as_1_18s_tracing_config() {
    let table: &[(&[(&str, &str)], TracingConfig)] = &[
        (&[], TracingConfig::OFF),
        (EXAMPLE_ONLY, TracingConfig::OFF),
        (
            &[("backend", "none"), ("zipkin-endpoint", "anything")],
            TracingConfig::OFF,
        ),
        // The default rate is 0.1.
        (
            &[("backend", "zipkin"), ("zipkin-endpoint", ZIPKIN)],
            config(
                TraceProtocol::Zipkin,
                ZIPKIN,
                CONFIG_TRACING_DEFAULT_SAMPLE_RATE,
            ),
        ),
        (
            &[
                ("backend", "zipkin"),
                ("zipkin-endpoint", ZIPKIN),
                ("sample-rate", "0.5"),
                ("debug", "false"),
            ],
            config(TraceProtocol::Zipkin, ZIPKIN, 0.5),
        ),
        // debug samples every trace, whatever the rate.
        (
            &[
                ("backend", "zipkin"),
                ("zipkin-endpoint", ZIPKIN),
                ("sample-rate", "0"),
                ("debug", "True"),
            ],
            config(TraceProtocol::Zipkin, ZIPKIN, 1.0),
        ),
        // The legacy boolean, read only without `backend`.
        (
            &[("enable", "true"), ("zipkin-endpoint", ZIPKIN)],
            config(TraceProtocol::Zipkin, ZIPKIN, 0.1),
        ),
        (&[("enable", "false")], TracingConfig::OFF),
        (
            &[("backend", "none"), ("enable", "not even a boolean")],
            TracingConfig::OFF,
        ),
    ];
    for (data, expected) in table {
        assert_eq!(tracing(data).as_ref(), Ok(expected), "{data:?}");
    }
}

#[test]
fn config_tracing_refuses_what_1_18_refuses_naming_the_key() {
    let table: &[RefusedCase] = &[
        (&[("backend", "jaeger")], BACKEND, "\"jaeger\" is neither"),
        // Compared as written: no case folding, no trimming.
        (&[("backend", "Zipkin")], BACKEND, "\"Zipkin\""),
        (&[("backend", "zipkin ")], BACKEND, "\"zipkin \""),
        (&[("backend", "")], BACKEND, "\"\""),
        (&[("enable", "yes")], ENABLE, "\"yes\" is not a boolean"),
        (&[("backend", "zipkin")], ZIPKIN_ENDPOINT, "empty"),
        (
            &[
                ("backend", "zipkin"),
                ("zipkin-endpoint", ZIPKIN),
                ("debug", "maybe"),
            ],
            DEBUG,
            "\"maybe\" is not a boolean",
        ),
        (
            &[
                ("backend", "zipkin"),
                ("zipkin-endpoint", ZIPKIN),
                ("sample-rate", "ten percent"),
            ],
            SAMPLE_RATE,
            "not a number",
        ),
        (
            &[
                ("backend", "zipkin"),
                ("zipkin-endpoint", ZIPKIN),
                ("sample-rate", "1.1"),
            ],
            SAMPLE_RATE,
            "1.1 is not from 0 to 1",
        ),
        // A rate is checked with tracing off too, as upstream checks it.
        (
            &[("backend", "none"), ("sample-rate", "-1")],
            SAMPLE_RATE,
            "not from 0 to 1",
        ),
        (
            &[("backend", "none"), ("debug", "")],
            DEBUG,
            "not a boolean",
        ),
        (
            &[("backend", "zipkin"), ("zipkin-endpoint", "zipkin:9411")],
            ZIPKIN_ENDPOINT,
            "has no scheme",
        ),
        (
            &[
                ("backend", "zipkin"),
                ("zipkin-endpoint", "https://zipkin:9411/api/v2/spans"),
            ],
            ZIPKIN_ENDPOINT,
            "TLS to trace collectors is not built",
        ),
    ];
    for (data, key, said) in table {
        let refused = tracing(data).expect_err(&format!("{data:?}"));
        assert_eq!(refused.key, *key, "{data:?}: {refused}");
        assert!(refused.problem.contains(said), "{data:?}: {refused}");
        assert!(
            refused.to_string().starts_with("config-tracing: "),
            "{refused}"
        );
    }
}

/// Each cluster generation, as its ConfigMaps are shipped and configured.
#[test]
fn config_observability_decides_once_it_names_tracing_else_config_tracing() {
    let zipkin_118 = map(&[
        ("backend", "zipkin"),
        ("zipkin-endpoint", ZIPKIN),
        ("sample-rate", "0.5"),
    ]);
    let observability_118 = map(&[("metrics.backend-destination", "prometheus")]);
    let example = map(EXAMPLE_ONLY);
    let grpc_119 = map(&[
        ("tracing-protocol", "grpc"),
        ("tracing-endpoint", "http://otel:4317"),
        ("tracing-sampling-rate", "0.2"),
    ]);
    let none_119 = map(&[("tracing-protocol", "none")]);
    let zipkin = config(TraceProtocol::Zipkin, ZIPKIN, 0.5);
    let grpc = config(TraceProtocol::Grpc, "http://otel:4317", 0.2);
    type Case<'a> = (
        &'a str,
        Option<&'a BTreeMap<String, String>>,
        Option<&'a BTreeMap<String, String>>,
        TracingConfig,
        Decider,
    );
    let table: &[Case] = &[
        (
            "no map at all",
            None,
            None,
            TracingConfig::OFF,
            Decider::Neither,
        ),
        (
            "1.18 tracing to Zipkin",
            Some(&observability_118),
            Some(&zipkin_118),
            zipkin.clone(),
            Decider::ConfigTracing,
        ),
        (
            "1.18 without config-observability",
            None,
            Some(&zipkin_118),
            zipkin.clone(),
            Decider::ConfigTracing,
        ),
        (
            "1.19+ as shipped",
            Some(&example),
            Some(&example),
            TracingConfig::OFF,
            Decider::ConfigTracing,
        ),
        (
            "1.19+ tracing over OTLP",
            Some(&grpc_119),
            Some(&example),
            grpc.clone(),
            Decider::ConfigObservability,
        ),
        (
            "1.19+ without config-tracing",
            Some(&grpc_119),
            None,
            grpc.clone(),
            Decider::ConfigObservability,
        ),
        (
            "both say something: config-observability decides",
            Some(&grpc_119),
            Some(&zipkin_118),
            grpc.clone(),
            Decider::ConfigObservability,
        ),
        (
            "upgraded from 1.18, tracing turned off in config-observability",
            Some(&none_119),
            Some(&zipkin_118),
            TracingConfig::OFF,
            Decider::ConfigObservability,
        ),
        (
            "upgraded from 1.18, config-observability silent: the old Zipkin (★)",
            Some(&example),
            Some(&zipkin_118),
            zipkin.clone(),
            Decider::ConfigTracing,
        ),
    ];
    for (what, observability, tracing, expected, decider) in table {
        let mut cluster = ClusterTracing::new(OBSERVABILITY_CONFIG_MAP);
        cluster.observability_seen(*observability).unwrap();
        cluster.tracing_seen(*tracing).unwrap();
        assert_eq!(cluster.effective(), (expected.clone(), *decider), "{what}");
        // The order the two lists arrive in does not matter.
        let mut other_order = ClusterTracing::new(OBSERVABILITY_CONFIG_MAP);
        other_order.tracing_seen(*tracing).unwrap();
        other_order.observability_seen(*observability).unwrap();
        assert_eq!(other_order, cluster, "{what}");
    }
}

#[test]
fn a_refused_change_keeps_the_tracing_in_force_until_a_good_one_comes() {
    let mut cluster = ClusterTracing::new(OBSERVABILITY_CONFIG_MAP);
    let good = map(&[
        ("tracing-protocol", "grpc"),
        ("tracing-endpoint", "http://otel:4317"),
        ("tracing-sampling-rate", "0.5"),
    ]);
    cluster.observability_seen(Some(&good)).unwrap();
    let in_force = cluster.effective();
    assert_eq!(
        in_force.0,
        config(TraceProtocol::Grpc, "http://otel:4317", 0.5)
    );
    for bad in [
        &[
            ("tracing-protocol", "grpc"),
            ("tracing-endpoint", "http://otel:4317"),
            ("tracing-sampling-rate", "lots"),
        ][..],
        &[
            ("tracing-protocol", "grpc"),
            ("tracing-endpoint", "http://otel:4317"),
            ("tracing-sampling-rate", "7"),
        ],
        &[
            ("tracing-protocol", "otlp"),
            ("tracing-endpoint", "http://otel:4317"),
        ],
        &[("tracing-protocol", "grpc")],
    ] {
        let refused = cluster.observability_seen(Some(&map(bad))).unwrap_err();
        assert_eq!(refused.config_map, OBSERVABILITY_CONFIG_MAP);
        assert_eq!(cluster.effective(), in_force, "{bad:?}: kept");
    }
    // A refused config-tracing changes nothing either, and a later good one is taken.
    cluster
        .tracing_seen(Some(&map(&[("backend", "zipkin")])))
        .unwrap_err();
    assert_eq!(cluster.effective(), in_force);
    let fixed = map(&[
        ("tracing-protocol", "grpc"),
        ("tracing-endpoint", "http://otel:4317"),
        ("tracing-sampling-rate", "0.75"),
    ]);
    cluster.observability_seen(Some(&fixed)).unwrap();
    assert_eq!(cluster.effective().0.sampling_rate, 0.75);
}

#[test]
fn a_bad_first_config_observability_leaves_config_tracing_deciding() {
    let mut cluster = ClusterTracing::new(OBSERVABILITY_CONFIG_MAP);
    cluster
        .tracing_seen(Some(&map(&[
            ("backend", "zipkin"),
            ("zipkin-endpoint", ZIPKIN),
        ])))
        .unwrap();
    let before = cluster.effective();
    assert_eq!(before.1, Decider::ConfigTracing);
    cluster
        .observability_seen(Some(&map(&[("tracing-protocol", "jaeger")])))
        .unwrap_err();
    assert_eq!(cluster.effective(), before, "nothing accepted from it yet");
}

#[test]
fn a_deleted_map_says_nothing_again() {
    let mut cluster = ClusterTracing::new(OBSERVABILITY_CONFIG_MAP);
    cluster
        .tracing_seen(Some(&map(&[
            ("backend", "zipkin"),
            ("zipkin-endpoint", ZIPKIN),
        ])))
        .unwrap();
    cluster
        .observability_seen(Some(&map(&[("tracing-protocol", "stdout")])))
        .unwrap();
    assert_eq!(cluster.effective().0.protocol, TraceProtocol::Stdout);
    cluster.observability_seen(None).unwrap();
    assert_eq!(cluster.effective().1, Decider::ConfigTracing);
    cluster.tracing_seen(None).unwrap();
    assert_eq!(cluster.effective(), (TracingConfig::OFF, Decider::Neither));
}

#[test]
fn a_renamed_config_observability_is_named_as_renamed() {
    let mut cluster = ClusterTracing::new("my-observability");
    let refused = cluster
        .observability_seen(Some(&map(&[("tracing-protocol", "x")])))
        .unwrap_err();
    assert!(refused
        .to_string()
        .starts_with("my-observability: tracing-protocol: "));
    assert_eq!(cluster.observability_map(), "my-observability");
    assert_eq!(
        Decider::ConfigObservability.describe(&cluster, "knative-serving"),
        "knative-serving/my-observability's tracing-* keys"
    );
    assert_eq!(
        Decider::ConfigTracing.describe(&cluster, "knative-serving"),
        "knative-serving/config-tracing (my-observability names no tracing-* key)"
    );
    assert_eq!(
        Decider::Neither.describe(&cluster, "ns"),
        "no tracing-* key in ns/my-observability and no ns/config-tracing"
    );
}
