use serde_json::json;

use super::*;

/// An HTTPScaledObject as a user writes it for the add-on (its README's example), as the API
/// server serves it: the CRD's defaults applied, status and managed fields beside.
fn served() -> serde_json::Value {
    json!({
        "apiVersion": "http.keda.sh/v1alpha1",
        "kind": "HTTPScaledObject",
        "metadata": {
            "name": "xkcd",
            "namespace": "apps",
            "creationTimestamp": "2026-11-29T12:00:00Z",
            "uid": "6c2c1f43-0a44-4fb6-9b0c-1ab2c1d3e4f5",
            "finalizers": ["httpscaledobject.http.keda.sh"],
            "annotations": {"kactivator.dev/container-concurrency": "1"}
        },
        "spec": {
            "hosts": ["myhost.com"],
            "pathPrefixes": ["/test"],
            "scaleTargetRef": {
                "name": "xkcd",
                "kind": "Deployment",
                "apiVersion": "apps/v1",
                "service": "xkcd",
                "port": 8080
            },
            "replicas": {"min": 0, "max": 10},
            "scaledownPeriod": 300,
            "scalingMetric": {"requestRate": {"granularity": "1s", "targetValue": 100, "window": "1m"}}
        },
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Reconciled"}]}
    })
}

fn read(value: serde_json::Value) -> Result<RouteObject, ObjectError> {
    RouteObject::from_json(ObjectKind::HttpScaledObject, &value)
}

#[test]
fn the_add_ons_example_reads_as_a_route_with_our_limit() {
    let object = read(served()).unwrap();
    assert_eq!(
        (object.namespace.as_str(), object.name.as_str()),
        ("apps", "xkcd")
    );
    assert_eq!(
        object.order,
        RouteOrder {
            created: 1_795_953_600,
            namespace: "apps".into(),
            name: "xkcd".into()
        }
    );
    assert_eq!(object.rules[0].hosts, ["myhost.com"]);
    assert_eq!(object.rules[0].paths, ["/test"]);
    assert!(object.rules[0].headers.is_empty());
    assert_eq!(
        object.target,
        ServiceRef {
            service: "xkcd".into(),
            port: PortRef::Number(8080)
        }
    );
    assert_eq!(object.failover, None);
    assert_eq!(object.scaling.rate, Some(100));
    assert_eq!(object.scaling.concurrency, None);
    assert_eq!(
        object.rate,
        Some(RateWindow {
            window: Duration::from_secs(60),
            granularity: Duration::from_secs(1)
        })
    );
    assert_eq!(object.readiness, Timeout::Default);
    assert_eq!(object.response_header, Timeout::Default);
    assert_eq!(object.request, Timeout::Default);
    assert_eq!(object.kind, ObjectKind::HttpScaledObject);
    assert_eq!(object.rules.len(), 1);
    assert_eq!(object.container_concurrency, Some(1));
}

#[test]
fn headers_timeouts_and_a_named_port_are_read_as_the_add_on_converts_them() {
    let mut value = served();
    value["spec"]["scaleTargetRef"] = json!({"service": "web", "portName": "http"});
    value["spec"]["headers"] = json!([{"name": "X-Tenant", "value": "a"}, {"name": "X-Debug"}]);
    value["spec"]["timeouts"] = json!({"conditionWait": "20s", "responseHeader": "0s"});
    value["spec"]["scalingMetric"] = json!({"concurrency": {}});
    value["spec"]["targetPendingRequests"] = json!(7);
    value["metadata"]["annotations"] = json!({});
    let object = read(value).unwrap();
    assert_eq!(object.target.port, PortRef::Name("http".into()));
    assert_eq!(
        object.rules[0].headers,
        vec![
            HeaderMatch {
                name: "X-Tenant".into(),
                value: Some("a".into())
            },
            HeaderMatch {
                name: "X-Debug".into(),
                value: None
            },
        ]
    );
    assert_eq!(object.readiness, Timeout::After(Duration::from_secs(20)));
    assert_eq!(object.response_header, Timeout::Default, "0s: the default");
    assert_eq!(
        object.scaling.concurrency,
        Some(100),
        "the CRD's default target"
    );
    assert_eq!(object.scaling.target_pending_requests, Some(7));
    assert_eq!(object.rate, None);
    assert_eq!(object.container_concurrency, None);
}

#[test]
fn a_failovers_wait_is_the_readiness_timeout_over_condition_wait() {
    let mut value = served();
    value["spec"]["timeouts"] = json!({"conditionWait": "20s"});
    value["spec"]["coldStartTimeoutFailoverRef"] =
        json!({"service": "static", "port": 80, "timeoutSeconds": 45});
    let object = read(value.clone()).unwrap();
    assert_eq!(
        object.failover,
        Some(Failover {
            to: ServiceRef {
                service: "static".into(),
                port: PortRef::Number(80)
            }
        })
    );
    assert_eq!(object.readiness, Timeout::After(Duration::from_secs(45)));
    value["spec"]["coldStartTimeoutFailoverRef"] = json!({"service": "static", "portName": "http"});
    assert_eq!(
        read(value.clone()).unwrap().readiness,
        Timeout::After(DEFAULT_FAILOVER_TIMEOUT),
        "the CRD's default when the API server did not apply it"
    );
    value["spec"]["coldStartTimeoutFailoverRef"] =
        json!({"service": "static", "port": 80, "timeoutSeconds": 0});
    assert_eq!(
        read(value).unwrap().readiness,
        Timeout::After(Duration::from_secs(20)),
        "0 leaves conditionWait's"
    );
}

#[test]
fn objects_a_route_cannot_come_from_are_refused_naming_the_field() {
    let rows: &[(&str, serde_json::Value, &str)] = &[
        ("/metadata/namespace", json!(null), "metadata.namespace"),
        ("/metadata/name", json!(""), "metadata.name"),
        ("/spec", json!(null), "spec"),
        ("/spec/scaleTargetRef", json!(null), "spec.scaleTargetRef"),
        (
            "/spec/scaleTargetRef",
            json!({"service": "x"}),
            "spec.scaleTargetRef",
        ),
        (
            "/spec/scaleTargetRef",
            json!({"service": "x", "port": 80, "portName": "http"}),
            "spec.scaleTargetRef",
        ),
        (
            "/spec/scaleTargetRef",
            json!({"service": "", "port": 80}),
            "spec.scaleTargetRef.service",
        ),
        (
            "/spec/scaleTargetRef",
            json!({"service": "x", "port": 70000}),
            "spec.scaleTargetRef.port",
        ),
        (
            "/spec/scaleTargetRef",
            json!({"service": "x", "port": 0}),
            "spec.scaleTargetRef.port",
        ),
        (
            "/spec/scalingMetric",
            json!({"concurrency": {}, "requestRate": {}}),
            "spec.scalingMetric",
        ),
        (
            "/spec/scalingMetric",
            json!({"requestRate": {"window": "a while"}}),
            "spec.scalingMetric.requestRate.window",
        ),
        (
            "/spec/scalingMetric",
            json!({"requestRate": {"granularity": "500ms"}}),
            "spec.scalingMetric.requestRate",
        ),
        (
            "/spec/timeouts",
            json!({"conditionWait": "soon"}),
            "spec.timeouts.conditionWait",
        ),
        (
            "/spec/headers",
            json!([{"name": ""}]),
            "spec.headers[0].name",
        ),
        (
            "/spec/coldStartTimeoutFailoverRef",
            json!({"service": "s", "port": 80, "timeoutSeconds": -1}),
            "spec.coldStartTimeoutFailoverRef.timeoutSeconds",
        ),
        (
            "/metadata/annotations",
            json!({"kactivator.dev/container-concurrency": "one"}),
            "metadata.annotations[\"kactivator.dev/container-concurrency\"]",
        ),
        (
            "/metadata/annotations",
            json!({"kactivator.dev/container-concurrency": "4294967295"}),
            "metadata.annotations[\"kactivator.dev/container-concurrency\"]",
        ),
        ("/spec/hosts", json!("myhost.com"), "object"),
        ("/spec/targetPendingRequests", json!(1u64 << 40), "object"),
    ];
    for (pointer, replacement, field) in rows {
        let mut value = served();
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        value
            .pointer_mut(parent)
            .unwrap_or_else(|| panic!("{pointer}"))[key] = replacement.clone();
        let refused = read(value).expect_err(pointer);
        assert_eq!(
            &refused.field, field,
            "{pointer} = {replacement}: {refused}"
        );
    }
}

#[test]
fn a_limit_of_zero_is_unlimited_and_unknown_fields_are_ignored() {
    let mut value = served();
    value["metadata"]["annotations"] = json!({"kactivator.dev/container-concurrency": "0"});
    value["spec"]["someFutureField"] = json!({"x": 1});
    let object = read(value).unwrap();
    assert_eq!(object.container_concurrency, None);
}

#[test]
fn a_timeout_past_a_year_is_refused_naming_the_field_so_no_deadline_overflows() {
    let mut value = served();
    value["spec"]["timeouts"] = json!({"conditionWait": "9999999999h"});
    let refused = read(value).unwrap_err();
    assert_eq!(refused.field, "spec.timeouts.conditionWait");
    let mut value = served();
    value["spec"]["coldStartTimeoutFailoverRef"] =
        json!({"service": "fallback", "port": 80, "timeoutSeconds": 2_147_483_647});
    let refused = read(value).unwrap_err();
    assert_eq!(
        refused.field,
        "spec.coldStartTimeoutFailoverRef.timeoutSeconds"
    );
}

/// An InterceptorRoute as the add-on's documentation writes one (0.15), as the API server
/// serves it: two rules, both metrics, a fallback, a placeholder and every timeout.
fn served_route() -> serde_json::Value {
    json!({
        "apiVersion": "http.keda.sh/v1beta1",
        "kind": "InterceptorRoute",
        "metadata": {
            "name": "chat",
            "namespace": "apps",
            "creationTimestamp": "2026-11-29T12:00:00Z",
            "annotations": {"kactivator.dev/container-concurrency": "4"}
        },
        "spec": {
            "target": {"service": "chat", "portName": "http"},
            "rules": [
                {"hosts": ["chat.example.com", "*.chat.example.com"], "paths": [{"value": "/v1"}]},
                {"headers": [{"name": "X-Model", "value": "llama"}, {"name": "X-Tenant"}]}
            ],
            "scalingMetric": {
                "concurrency": {"targetValue": 8},
                "requestRate": {"targetValue": 50, "window": "30s", "granularity": "2s"}
            },
            "coldStart": {
                "fallback": {"service": {"name": "static", "port": 80}},
                "placeholder": {"response": {"statusCode": 202, "body": "warming up",
                                             "headers": {"Retry-After": "5", "X-Tier": "gold"}}}
            },
            "timeouts": {"readiness": "0s", "request": "10m", "responseHeader": "45s"}
        }
    })
}

fn read_route(value: serde_json::Value) -> Result<RouteObject, ObjectError> {
    RouteObject::from_json(ObjectKind::InterceptorRoute, &value)
}

#[test]
fn an_interceptor_route_reads_with_every_rule_both_metrics_and_its_three_timeouts() {
    let route = read_route(served_route()).unwrap();
    assert_eq!(route.kind, ObjectKind::InterceptorRoute);
    assert_eq!(
        (route.namespace.as_str(), route.name.as_str()),
        ("apps", "chat")
    );
    assert_eq!(
        route.rules,
        [
            Rule {
                hosts: vec!["chat.example.com".into(), "*.chat.example.com".into()],
                paths: vec!["/v1".into()],
                headers: vec![],
            },
            Rule {
                hosts: vec![],
                paths: vec![],
                headers: vec![
                    HeaderMatch {
                        name: "X-Model".into(),
                        value: Some("llama".into())
                    },
                    HeaderMatch {
                        name: "X-Tenant".into(),
                        value: None
                    },
                ],
            },
        ]
    );
    assert_eq!(
        route.target,
        ServiceRef {
            service: "chat".into(),
            port: PortRef::Name("http".into())
        }
    );
    assert_eq!(
        route.failover,
        Some(Failover {
            to: ServiceRef {
                service: "static".into(),
                port: PortRef::Number(80)
            }
        })
    );
    assert_eq!(route.scaling.concurrency, Some(8));
    assert_eq!(route.scaling.rate, Some(50));
    assert_eq!(route.scaling.target_pending_requests, None);
    assert_eq!(
        route.rate,
        Some(RateWindow {
            window: Duration::from_secs(30),
            granularity: Duration::from_secs(2)
        })
    );
    assert_eq!(
        route.readiness,
        Timeout::Off,
        "\"0s\" is off, not the default"
    );
    assert_eq!(route.request, Timeout::After(Duration::from_secs(600)));
    assert_eq!(
        route.response_header,
        Timeout::After(Duration::from_secs(45))
    );
    assert_eq!(route.container_concurrency, Some(4));
    assert_eq!(
        route.placeholder,
        Some(PlaceholderSpec {
            status: 202,
            fields: vec![
                ("Retry-After".into(), b"5".to_vec()),
                ("X-Tier".into(), b"gold".to_vec())
            ],
            body: PlaceholderSource::Inline("warming up".into()),
        })
    );

    // The least a route can be: a target and one metric; no rules routes nothing.
    let mut least = served_route();
    least["spec"] = json!({
        "target": {"service": "chat", "port": 8080},
        "scalingMetric": {"requestRate": {"targetValue": 5}}
    });
    let route = read_route(least).unwrap();
    assert!(route.rules.is_empty());
    assert_eq!(route.failover, None);
    assert_eq!(route.placeholder, None);
    assert_eq!(
        (route.scaling.concurrency, route.scaling.rate),
        (None, Some(5))
    );
    assert_eq!(
        route.rate,
        Some(RateWindow {
            window: DEFAULT_RATE_WINDOW,
            granularity: DEFAULT_RATE_GRANULARITY
        })
    );
    assert_eq!(
        (route.readiness, route.request, route.response_header),
        (Timeout::Default, Timeout::Default, Timeout::Default)
    );
}

#[test]
fn interceptor_routes_a_route_cannot_come_from_are_refused_naming_the_field() {
    let rows: &[(&str, serde_json::Value, &str)] = &[
        ("/spec/target", json!(null), "spec.target"),
        ("/spec/target", json!({"service": "x"}), "spec.target"),
        (
            "/spec/target",
            json!({"service": "x", "port": 0}),
            "spec.target.port",
        ),
        ("/spec/scalingMetric", json!(null), "spec.scalingMetric"),
        ("/spec/scalingMetric", json!({}), "spec.scalingMetric"),
        (
            "/spec/scalingMetric",
            json!({"concurrency": {}}),
            "spec.scalingMetric.concurrency.targetValue",
        ),
        (
            "/spec/scalingMetric",
            json!({"concurrency": {"targetValue": 0}}),
            "spec.scalingMetric.concurrency.targetValue",
        ),
        (
            "/spec/scalingMetric",
            json!({"requestRate": {"targetValue": 1, "window": "0s"}}),
            "spec.scalingMetric.requestRate",
        ),
        (
            "/spec/rules",
            json!([{"paths": [{"value": ""}]}]),
            "spec.rules[0].paths[0].value",
        ),
        (
            "/spec/rules",
            json!([{}, {"headers": [{"name": ""}]}]),
            "spec.rules[1].headers[0].name",
        ),
        (
            "/spec/timeouts",
            json!({"request": "forever"}),
            "spec.timeouts.request",
        ),
        (
            "/spec/timeouts",
            json!({"responseHeader": "9999999999h"}),
            "spec.timeouts.responseHeader",
        ),
        (
            "/spec/coldStart",
            json!({"fallback": {"service": {"name": "", "port": 80}}}),
            "spec.coldStart.fallback.service.name",
        ),
        (
            "/spec/coldStart",
            json!({"fallback": {"service": {"name": "s"}}}),
            "spec.coldStart.fallback.service",
        ),
        (
            "/spec/coldStart",
            json!({"maxPendingRequests": 0}),
            "spec.coldStart.maxPendingRequests",
        ),
        (
            "/spec/coldStart",
            json!({"maxPendingRequests": -3}),
            "spec.coldStart.maxPendingRequests",
        ),
        (
            "/spec/coldStart",
            json!({"maxPendingRequests": 4_294_967_296_i64}),
            "spec.coldStart.maxPendingRequests",
        ),
        (
            "/spec/coldStart",
            json!({"overflow": "Drop"}),
            "spec.coldStart.overflow",
        ),
        (
            "/spec/staticRoutes",
            json!([{"response": {}}]),
            "spec.staticRoutes[0].rules",
        ),
        (
            "/spec/staticRoutes",
            json!([{"rules": [{}]}]),
            "spec.staticRoutes[0].response",
        ),
        (
            "/spec/staticRoutes",
            json!([{"rules": [{}], "response": {}}, {"rules": [{}], "response": {},
                    "responseMode": "Sometimes"}]),
            "spec.staticRoutes[1].responseMode",
        ),
        (
            "/spec/staticRoutes",
            json!([{"rules": [{"paths": [{"value": ""}]}], "response": {}}]),
            "spec.staticRoutes[0].rules[0].paths[0].value",
        ),
        (
            "/spec/staticRoutes",
            json!([{"rules": [{}], "response": {"statusCode": 42}}]),
            "spec.staticRoutes[0].response.statusCode",
        ),
        ("/spec/rules", json!({"hosts": []}), "object"),
    ];
    for (pointer, replacement, field) in rows {
        let mut value = served_route();
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        value
            .pointer_mut(parent)
            .unwrap_or_else(|| panic!("{pointer}"))[key] = replacement.clone();
        let refused = read_route(value).expect_err(pointer);
        assert_eq!(
            &refused.field, field,
            "{pointer} = {replacement}: {refused}"
        );
    }
}

#[test]
fn a_placeholder_takes_the_add_ons_defaults_and_refuses_what_would_break_its_response() {
    let with = |response: serde_json::Value| {
        let mut value = served_route();
        value["spec"]["coldStart"] = json!({"placeholder": {"response": response}});
        read_route(value)
    };
    let least = with(json!({})).unwrap().placeholder.unwrap();
    assert_eq!(least.status, 503);
    assert_eq!(least.body, PlaceholderSource::Inline(String::new()));
    let from_map = with(json!({"bodyFromConfigMap": {"name": "pages"}}))
        .unwrap()
        .placeholder
        .unwrap();
    assert_eq!(
        from_map.body,
        PlaceholderSource::ConfigMap {
            name: "pages".into(),
            key: None
        }
    );
    let field = "spec.coldStart.placeholder.response";
    for (response, refused) in [
        (json!({"statusCode": 99}), format!("{field}.statusCode")),
        (json!({"statusCode": 600}), format!("{field}.statusCode")),
        (
            json!({"body": "x", "bodyFromConfigMap": {"name": "pages"}}),
            field.to_string(),
        ),
        (
            json!({"body": "x".repeat(MAX_PLACEHOLDER_BODY + 1)}),
            format!("{field}.body"),
        ),
        (
            json!({"bodyFromConfigMap": {"name": ""}}),
            format!("{field}.bodyFromConfigMap.name"),
        ),
        (
            json!({"headers": {"Bad Name": "x"}}),
            format!("{field}.headers[\"Bad Name\"]"),
        ),
        (
            json!({"headers": {"X-Split": "a\r\nSet-Cookie: stolen"}}),
            format!("{field}.headers[\"X-Split\"]"),
        ),
        (
            json!({"headers": {"content-length": "5"}}),
            format!("{field}.headers[\"content-length\"]"),
        ),
    ] {
        let error = with(response.clone()).expect_err(&response.to_string());
        assert_eq!(error.field, refused, "{response}: {error}");
    }
}

#[test]
fn the_priority_annotation_gives_either_kind_bands_in_the_knative_sources_grammar() {
    let annotation = "bands=3,priority_header=x-priority,priority_header_trusted=true";
    let mut object = served();
    object["metadata"]["annotations"]["kactivator.dev/priority"] = json!(annotation);
    let mut route = served_route();
    route["metadata"]["annotations"]["kactivator.dev/priority"] = json!(annotation);
    for read in [read(object).unwrap(), read_route(route).unwrap()] {
        let policy = read.priority.expect("a policy");
        assert_eq!(policy.bands, 3);
        assert_eq!(policy.priority_header, "x-priority");
        assert!(policy.trusted);
    }
    assert_eq!(read(served()).unwrap().priority, None, "absent: off");
    let mut bad = served();
    bad["metadata"]["annotations"]["kactivator.dev/priority"] = json!("bands=lots");
    let refused = read(bad).unwrap_err();
    assert_eq!(
        refused.field,
        "metadata.annotations[\"kactivator.dev/priority\"]"
    );
    assert!(refused.problem.contains("bands"), "{refused}");
}

/// The add-on 0.16's cold-start cap (#1733), as its CRD writes it: absent from a 0.15 object,
/// read from a 0.16 one, `Reject` by default.
#[test]
fn the_cold_start_cap_and_its_overflow_read_as_0_16_writes_them() {
    let old = read_route(served_route()).unwrap();
    assert_eq!((old.max_pending, old.overflow), (None, Overflow::Reject));
    let mut value = served_route();
    value["spec"]["coldStart"]["maxPendingRequests"] = json!(25);
    let capped = read_route(value.clone()).unwrap();
    assert_eq!(
        (capped.max_pending, capped.overflow),
        (Some(25), Overflow::Reject)
    );
    value["spec"]["coldStart"]["overflow"] = json!("Placeholder");
    value["spec"]["coldStart"]["maxPendingRequests"] = json!(u32::MAX);
    let placeholder = read_route(value).unwrap();
    assert_eq!(
        (placeholder.max_pending, placeholder.overflow),
        (Some(u32::MAX), Overflow::Placeholder)
    );
}

/// 0.16's static routes (#1689), as the add-on's `main` CRD writes them: in order, each with its
/// rules, its response (200 unless it says) and its mode (`WhenUnavailable` unless it says).
#[test]
fn static_routes_read_in_order_with_the_add_ons_defaults() {
    assert_eq!(read_route(served_route()).unwrap().static_routes, []);
    let mut value = served_route();
    value["spec"]["staticRoutes"] = json!([
        {"rules": [{"paths": [{"value": "/healthz"}]}], "response": {"body": "ok"},
         "responseMode": "Always"},
        {"rules": [{"hosts": ["*.example.com"]}, {"headers": [{"name": "X-Probe"}]}],
         "response": {"statusCode": 204, "headers": {"Cache-Control": "no-store"}}},
    ]);
    let statics = read_route(value).unwrap().static_routes;
    assert_eq!(statics.len(), 2);
    assert_eq!(statics[0].rules[0].paths, ["/healthz"]);
    assert!(statics[0].always);
    assert_eq!(statics[0].response.status, STATIC_ROUTE_STATUS);
    assert_eq!(
        statics[0].response.body,
        PlaceholderSource::Inline("ok".into())
    );
    assert!(!statics[1].always, "WhenUnavailable by default");
    assert_eq!(statics[1].rules.len(), 2);
    assert_eq!(statics[1].rules[0].hosts, ["*.example.com"]);
    assert_eq!(&*statics[1].rules[1].headers[0].name, "X-Probe");
    assert_eq!(statics[1].response.status, 204);
    assert_eq!(
        statics[1].response.fields,
        [("Cache-Control".to_string(), b"no-store".to_vec())]
    );
}
