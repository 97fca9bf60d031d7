//! The source's view turned into ops: objects, Services and EndpointSlices as the API server
//! serves them, in any order.

use serde_json::json;

use super::*;

/// An HTTPScaledObject of Service `app-svc` at `port`: a number, or a name (`portName`).
fn object(name: &str, port: Value, annotations: Value) -> Value {
    let mut target = json!({"name": "app", "kind": "Deployment", "apiVersion": "apps/v1",
                            "service": "app-svc"});
    if port.is_string() {
        target["portName"] = port;
    } else {
        target["port"] = port;
    }
    json!({
        "apiVersion": "http.keda.sh/v1alpha1",
        "kind": "HTTPScaledObject",
        "metadata": {
            "namespace": "apps", "name": name,
            "creationTimestamp": "2026-11-01T00:00:00Z",
            "annotations": annotations,
        },
        "spec": {
            "hosts": ["app.example.com"],
            "pathPrefixes": ["/api"],
            "scaleTargetRef": target,
        }
    })
}

fn service(app_protocol: Option<&str>) -> Value {
    let mut port = json!({"name": "web", "port": 8080, "targetPort": 3000});
    if let Some(protocol) = app_protocol {
        port["appProtocol"] = json!(protocol);
    }
    json!({"metadata": {"namespace": "apps", "name": "app-svc"}, "spec": {"ports": [port]}})
}

fn slice(endpoints: &[(&str, Option<bool>)]) -> Value {
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|(ip, ready)| match ready {
            Some(ready) => json!({"addresses": [ip], "conditions": {"ready": ready}}),
            None => json!({"addresses": [ip]}),
        })
        .collect();
    json!({
        "metadata": {"namespace": "apps", "name": "app-svc-x1",
                     "labels": {SLICE_SERVICE_LABEL: "app-svc"}},
        "ports": [{"name": "web", "port": 3000}, {"name": "metrics", "port": 9000}],
        "endpoints": endpoints,
    })
}

const HSO: ObjectKind = ObjectKind::HttpScaledObject;
const IR: ObjectKind = ObjectKind::InterceptorRoute;

/// An InterceptorRoute `name` to Service `app-svc`'s port `web`, with `spec` merged over it.
fn route(name: &str, spec: Value) -> Value {
    let mut route = json!({
        "apiVersion": "http.keda.sh/v1beta1",
        "kind": "InterceptorRoute",
        "metadata": {"namespace": "apps", "name": name,
                     "creationTimestamp": "2026-11-02T00:00:00Z"},
        "spec": {
            "target": {"service": "app-svc", "portName": "web"},
            "rules": [{"hosts": ["chat.example.com"]}, {"paths": [{"value": "/chat"}]}],
            "scalingMetric": {"concurrency": {"targetValue": 10}},
        }
    });
    for (field, value) in spec.as_object().unwrap() {
        route["spec"][field] = value.clone();
    }
    route
}

fn key() -> RevisionKey {
    RevisionKey::new("apps", "app").unwrap()
}

fn addr(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

fn upserts(ops: &[Op]) -> Vec<&RevisionSpec> {
    ops.iter()
        .filter_map(|op| match op {
            Op::UpsertRevision(spec) => Some(spec),
            _ => None,
        })
        .collect()
}

fn endpoints(ops: &[Op]) -> Vec<Vec<SocketAddr>> {
    ops.iter()
        .filter_map(|op| match op {
            Op::SetEndpoints { ready, scope, .. } => {
                assert_eq!(*scope, OmissionScope::AllPods);
                Some(ready.clone())
            }
            _ => None,
        })
        .collect()
}

#[test]
fn an_object_routes_by_its_rules_to_the_ready_endpoints_at_the_services_target_port() {
    let mut model = Model::new(Defaults::default());
    model.object(
        HSO,
        "apps",
        "app",
        Some(&object("app", json!(8080), json!({}))),
    );
    model.service("apps", "app-svc", Some(&service(None)));
    model.slice(
        "apps",
        "app-svc-x1",
        Some(&slice(&[
            ("10.0.0.1", Some(true)),
            ("10.0.0.2", Some(false)),
            ("10.0.0.3", None),
        ])),
    );
    let (ops, refusals) = model.ops();
    assert!(refusals.is_empty(), "{refusals:?}");
    let specs = upserts(&ops);
    assert_eq!(specs.len(), 1);
    let spec = specs[0];
    assert_eq!(spec.key, key());
    assert_eq!(spec.protocol, Protocol::Http1);
    assert_eq!(spec.container_concurrency, 0, "unlimited, as the add-on");
    let rules = spec.rules.as_deref().expect("routed by rules");
    assert_eq!(rules.rules[0].hosts, vec!["app.example.com".to_string()]);
    assert_eq!(rules.rules[0].paths, vec!["/api".to_string()]);
    assert_eq!(
        spec.timeouts.response_start,
        Some(DEFAULT_RESPONSE_HEADER_TIMEOUT)
    );
    // A ready condition left out means ready; a false one is not.
    assert_eq!(
        endpoints(&ops),
        vec![vec![addr("10.0.0.1:3000"), addr("10.0.0.3:3000")]]
    );
    assert!(model.ops().0.is_empty(), "nothing changed: nothing sent");
}

#[test]
fn a_change_of_endpoints_sends_only_the_endpoints_and_a_deleted_object_goes() {
    let mut model = Model::new(Defaults::default());
    model.object(
        HSO,
        "apps",
        "app",
        Some(&object("app", json!("web"), json!({}))),
    );
    model.service("apps", "app-svc", Some(&service(None)));
    model.slice("apps", "app-svc-x1", Some(&slice(&[])));
    let (ops, _) = model.ops();
    assert_eq!(endpoints(&ops), vec![Vec::<SocketAddr>::new()]);

    model.slice(
        "apps",
        "app-svc-x1",
        Some(&slice(&[("10.0.0.9", Some(true))])),
    );
    let (ops, _) = model.ops();
    assert!(upserts(&ops).is_empty());
    assert_eq!(endpoints(&ops), vec![vec![addr("10.0.0.9:3000")]]);

    model.slice("apps", "app-svc-x1", None);
    assert_eq!(endpoints(&model.ops().0), vec![Vec::<SocketAddr>::new()]);

    model.object(HSO, "apps", "app", None);
    let (ops, _) = model.ops();
    assert!(matches!(&ops[..], [Op::RemoveRevision { revision }] if *revision == key()));
    assert!(model.revisions().is_empty());
}

#[test]
fn an_h2c_app_protocol_and_the_concurrency_annotation_shape_the_route() {
    let mut model = Model::new(Defaults::default());
    let annotations = json!({"kactivator.dev/container-concurrency": "1"});
    model.object(
        HSO,
        "apps",
        "app",
        Some(&object("app", json!(8080), annotations)),
    );
    model.service("apps", "app-svc", Some(&service(Some(H2C_APP_PROTOCOL))));
    let (ops, said) = model.ops();
    let spec = upserts(&ops)[0];
    assert_eq!(spec.protocol, Protocol::H2c);
    assert!(said.is_empty(), "nothing to say: {said:?}");
    assert_eq!(spec.container_concurrency, 1);
    assert_eq!(spec.lb_policy, LbPolicy::default_for(1));
    assert_eq!(spec.priority, None);

    let annotations = json!({"kactivator.dev/priority": "bands=2"});
    model.object(
        HSO,
        "apps",
        "app",
        Some(&object("app", json!(8080), annotations)),
    );
    let (ops, _) = model.ops();
    let spec = upserts(&ops)[0];
    assert_eq!(spec.priority.as_ref().map(|policy| policy.bands), Some(2));
}

#[test]
fn a_missing_service_or_port_routes_with_no_pods_and_says_why() {
    let mut model = Model::new(Defaults::default());
    model.object(
        HSO,
        "apps",
        "app",
        Some(&object("app", json!("grpc"), json!({}))),
    );
    let (ops, refusals) = model.ops();
    assert_eq!(endpoints(&ops), vec![Vec::<SocketAddr>::new()]);
    assert_eq!(refusals[0].object, "HTTPScaledObject apps/app");
    assert!(refusals[0]
        .reason
        .contains("Service apps/app-svc not found"));

    model.service("apps", "app-svc", Some(&service(None)));
    let (_, refusals) = model.ops();
    assert!(
        refusals[0].reason.contains("no port named \"grpc\""),
        "{refusals:?}"
    );
}

#[test]
fn an_object_that_cannot_be_read_is_refused_naming_the_field_and_routes_nothing() {
    let mut model = Model::new(Defaults::default());
    let mut broken = object("app", json!(8080), json!({}));
    broken["spec"]["scaleTargetRef"]
        .as_object_mut()
        .unwrap()
        .remove("service");
    model.object(HSO, "apps", "app", Some(&broken));
    let (ops, refusals) = model.ops();
    assert!(ops.is_empty());
    assert!(
        refusals[0].reason.contains("spec.scaleTargetRef"),
        "{refusals:?}"
    );
    assert_eq!(model.counts(), (0, 1));
}

#[test]
fn the_process_timeouts_apply_unless_the_object_sets_its_own() {
    let defaults = Defaults {
        request: Some(Duration::from_secs(40)),
        response_header: Duration::from_secs(20),
        readiness: Some(Duration::from_secs(7)),
        max_pending: None,
    };
    let mut model = Model::new(defaults);
    let mut own = object("app", json!(8080), json!({}));
    own["spec"]["timeouts"] = json!({"responseHeader": "5s"});
    model.object(HSO, "apps", "app", Some(&own));
    model.object(
        HSO,
        "apps",
        "other",
        Some(&object("other", json!(8080), json!({}))),
    );
    let (ops, _) = model.ops();
    let specs = upserts(&ops);
    assert_eq!(specs[0].timeouts.total, Duration::from_secs(40));
    assert_eq!(
        specs[0].timeouts.response_start,
        Some(Duration::from_secs(5))
    );
    assert_eq!(
        specs[1].timeouts.response_start,
        Some(Duration::from_secs(20))
    );
    assert_eq!(
        specs[1].cold_start.as_ref().and_then(|cold| cold.wait),
        Some(Duration::from_secs(7))
    );
}

#[test]
fn a_failover_is_a_route_of_its_own_the_object_fails_over_to_after_its_timeout() {
    let mut model = Model::new(Defaults::default());
    let mut with_failover = object("app", json!(8080), json!({}));
    with_failover["spec"]["coldStartTimeoutFailoverRef"] =
        json!({"service": "fallback", "port": 80, "timeoutSeconds": 3});
    model.object(HSO, "apps", "app", Some(&with_failover));
    model.service("apps", "app-svc", Some(&service(None)));
    model.service(
        "apps",
        "fallback",
        Some(
            &json!({"metadata": {"namespace": "apps", "name": "fallback"},
                     "spec": {"ports": [{"name": "", "port": 80}]}}),
        ),
    );
    model.slice(
        "apps",
        "fallback-1",
        Some(&json!({
            "metadata": {"namespace": "apps", "name": "fallback-1",
                         "labels": {SLICE_SERVICE_LABEL: "fallback"}},
            "ports": [{"port": 8081}],
            "endpoints": [{"addresses": ["10.0.9.9"]}],
        })),
    );
    let (ops, refusals) = model.ops();
    assert!(refusals.is_empty(), "{refusals:?}");
    let specs = upserts(&ops);
    let failover_key = RevisionKey::new("apps", "app:failover").unwrap();
    let primary = specs.iter().find(|spec| spec.key == key()).unwrap();
    let cold_start = primary.cold_start.as_deref().expect("a cold start");
    assert_eq!(cold_start.wait, Some(Duration::from_secs(3)));
    assert_eq!(cold_start.failover.as_ref(), Some(&failover_key));
    let failover = specs.iter().find(|spec| spec.key == failover_key).unwrap();
    assert!(
        failover.rules.is_none(),
        "no request is routed to it by rules"
    );
    let failover_pods: Vec<_> = ops
        .iter()
        .filter_map(|op| match op {
            Op::SetEndpoints {
                revision, ready, ..
            } if *revision == failover_key => Some(ready),
            _ => None,
        })
        .collect();
    assert_eq!(failover_pods, vec![&vec![addr("10.0.9.9:8081")]]);

    model.object(HSO, "apps", "app", None);
    let (ops, _) = model.ops();
    assert_eq!(
        ops.iter()
            .filter(|op| matches!(op, Op::RemoveRevision { .. }))
            .count(),
        2,
        "the failover goes with its object"
    );
}

#[test]
fn an_interceptor_route_routes_by_all_its_rules_and_shadows_the_object_of_its_name() {
    let mut model = Model::new(Defaults::default());
    model.object(
        HSO,
        "apps",
        "app",
        Some(&object("app", json!(8080), json!({}))),
    );
    model.service("apps", "app-svc", Some(&service(None)));
    model.slice(
        "apps",
        "app-svc-x1",
        Some(&slice(&[("10.0.0.1", Some(true))])),
    );
    let (ops, _) = model.ops();
    assert_eq!(upserts(&ops)[0].rules.as_deref().unwrap().rules.len(), 1);

    // The user adds an InterceptorRoute of the same name: it routes, the object is told why it
    // no longer does; KEDA may still ask about both.
    model.object(IR, "apps", "app", Some(&route("app", json!({}))));
    let (ops, refusals) = model.ops();
    let specs = upserts(&ops);
    assert_eq!(specs.len(), 1);
    let rules = specs[0].rules.as_deref().unwrap();
    assert_eq!(rules.rules.len(), 2);
    assert_eq!(rules.rules[0].hosts, ["chat.example.com"]);
    assert_eq!(rules.rules[1].paths, ["/chat"]);
    assert!(endpoints(&ops).is_empty(), "the same pods: nothing to send");
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert_eq!(refusals[0].object, "HTTPScaledObject apps/app");
    assert!(
        refusals[0].reason.contains("InterceptorRoute"),
        "{refusals:?}"
    );
    assert_eq!(model.counts(), (1, 1));
    let view = model.scaler_view();
    assert_eq!(view.objects.len(), 2);
    assert_eq!(
        view.objects[&(IR, "apps".to_string(), "app".to_string())].concurrency,
        Some(10)
    );
    assert_eq!(
        view.windows.keys().collect::<Vec<_>>(),
        [&("apps".to_string(), "app".to_string())],
        "one route counted"
    );

    // The route goes: the object routes again, as it did.
    model.object(IR, "apps", "app", None);
    let (ops, refusals) = model.ops();
    assert!(refusals.is_empty(), "{refusals:?}");
    assert_eq!(upserts(&ops)[0].rules.as_deref().unwrap().rules.len(), 1);
}

#[test]
fn a_routes_zero_timeouts_turn_the_process_ones_off_and_a_fallback_waits_30_s_without_one() {
    let defaults = Defaults {
        request: Some(Duration::from_secs(40)),
        response_header: Duration::from_secs(20),
        readiness: Some(Duration::from_secs(7)),
        max_pending: None,
    };
    let mut model = Model::new(defaults);
    model.object(
        IR,
        "apps",
        "off",
        Some(&route(
            "off",
            json!({"timeouts": {"readiness": "0s", "request": "0s", "responseHeader": "0s"}}),
        )),
    );
    model.object(
        IR,
        "apps",
        "own",
        Some(&route(
            "own",
            json!({"timeouts": {"readiness": "2s", "request": "9s", "responseHeader": "3s"}}),
        )),
    );
    model.object(IR, "apps", "unset", Some(&route("unset", json!({}))));
    model.object(
        IR,
        "apps",
        "fallback",
        Some(&route(
            "fallback",
            json!({"timeouts": {"readiness": "0s"},
                   "coldStart": {"fallback": {"service": {"name": "app-svc", "port": 8080}}}}),
        )),
    );
    let (ops, _) = model.ops();
    let spec = |name: &str| {
        upserts(&ops)
            .into_iter()
            .find(|spec| spec.key.name() == name)
            .unwrap()
            .clone()
    };
    let wait = |spec: &RevisionSpec| spec.cold_start.as_ref().and_then(|cold| cold.wait);
    let off = spec("off");
    assert_eq!(off.timeouts.total, Duration::from_secs(MAX_TIMEOUT_SECONDS));
    assert_eq!(off.timeouts.response_start, None);
    assert_eq!(wait(&off), None);
    let own = spec("own");
    assert_eq!(own.timeouts.total, Duration::from_secs(9));
    assert_eq!(own.timeouts.response_start, Some(Duration::from_secs(3)));
    assert_eq!(wait(&own), Some(Duration::from_secs(2)));
    let unset = spec("unset");
    assert_eq!(unset.timeouts.total, Duration::from_secs(40));
    assert_eq!(unset.timeouts.response_start, Some(Duration::from_secs(20)));
    assert_eq!(wait(&unset), Some(Duration::from_secs(7)));
    assert_eq!(
        wait(&spec("fallback")),
        Some(DEFAULT_FAILOVER_TIMEOUT),
        "a fallback never waits forever (endpoint_resolver.go L16)"
    );
}

#[test]
fn a_placeholder_goes_to_the_shards_with_its_config_maps_data_as_it_changes() {
    let mut model = Model::new(Defaults::default());
    model.service("apps", "app-svc", Some(&service(None)));
    model.object(
        IR,
        "apps",
        "app",
        Some(&route(
            "app",
            json!({"coldStart": {"placeholder": {"response": {
                "bodyFromConfigMap": {"name": "pages"}, "headers": {"Retry-After": "5"}}}}}),
        )),
    );
    let placeholder = |ops: &[Op]| {
        upserts(ops)[0]
            .cold_start
            .as_ref()
            .and_then(|cold| cold.placeholder.clone())
            .expect("a placeholder")
    };
    let (ops, refusals) = model.ops();
    let sent = placeholder(&ops);
    assert_eq!(sent.status, 503);
    assert_eq!(sent.fields, [("Retry-After".to_string(), b"5".to_vec())]);
    assert_eq!(
        sent.body,
        PlaceholderBody::ConfigMap {
            name: "apps/pages".into(),
            data: None,
            key: None
        }
    );
    assert!(
        refusals[0].reason.contains("ConfigMap apps/pages"),
        "the log says why it answers 500: {refusals:?}"
    );

    // An unlabelled ConfigMap is not the add-on's to read; a labelled one is, and so are its
    // changes.
    let config_map = |labelled: bool, page: &str| {
        let labels = if labelled {
            json!({RESPONSE_BODY_LABEL: "true"})
        } else {
            json!({})
        };
        json!({"metadata": {"namespace": "apps", "name": "pages", "labels": labels},
               "data": {"index.html": page}})
    };
    model.config_map("apps", "pages", Some(&config_map(false, "<p>1</p>")));
    assert!(model.ops().0.is_empty());
    model.config_map("apps", "pages", Some(&config_map(true, "<p>1</p>")));
    let (ops, refusals) = model.ops();
    assert!(refusals.is_empty(), "{refusals:?}");
    let sent = placeholder(&ops);
    let PlaceholderBody::ConfigMap { data, .. } = &sent.body else {
        panic!("{sent:?}")
    };
    assert_eq!(data.as_ref().unwrap()["index.html"], b"<p>1</p>".to_vec());
    model.config_map("apps", "pages", Some(&config_map(true, "<p>2</p>")));
    assert_eq!(upserts(&model.ops().0).len(), 1, "a new page is a new spec");
    model.config_map("apps", "pages", None);
    let (ops, _) = model.ops();
    assert!(matches!(
        &placeholder(&ops).body,
        PlaceholderBody::ConfigMap { data: None, .. }
    ));
}

/// The add-on 0.16's cold-start cap is the route's queue bound: the object's own, else the
/// process's (`KEDA_HTTP_COLD_START_MAX_PENDING_REQUESTS`), else ours; a placeholder waits
/// behind it only with an explicit cap and `overflow: Placeholder`.
#[test]
fn the_cold_start_cap_bounds_the_routes_queue_and_may_put_the_placeholder_behind_it() {
    let spec_of = |defaults: Defaults, cold_start: Value| {
        let mut model = Model::new(defaults);
        model.service("apps", "app-svc", Some(&service(None)));
        model.object(
            IR,
            "apps",
            "app",
            Some(&route("app", json!({"coldStart": cold_start}))),
        );
        let (ops, _) = model.ops();
        let spec = upserts(&ops)[0].clone();
        (
            spec.queue_depth,
            spec.cold_start
                .as_ref()
                .is_some_and(|cold| cold.hold_before_placeholder),
        )
    };
    let process = Defaults {
        max_pending: Some(40),
        ..Defaults::default()
    };
    let placeholder = json!({"response": {"body": "warming up"}});
    assert_eq!(
        spec_of(Defaults::default(), json!({})),
        (DEFAULT_QUEUE_DEPTH, false),
        "unset everywhere (the add-on's unlimited): our bound"
    );
    assert_eq!(spec_of(process, json!({})), (40, false));
    assert_eq!(
        spec_of(process, json!({"maxPendingRequests": 3})),
        (3, false),
        "the object's own wins"
    );
    assert_eq!(
        spec_of(
            process,
            json!({"maxPendingRequests": 3, "overflow": "Placeholder", "placeholder": placeholder})
        ),
        (3, true),
        "held up to the cap, the placeholder for the rest"
    );
    assert_eq!(
        spec_of(
            process,
            json!({"overflow": "Placeholder", "placeholder": placeholder})
        ),
        (40, false),
        "the process's cap alone: the placeholder answers at once"
    );
    assert_eq!(
        spec_of(
            process,
            json!({"maxPendingRequests": 3, "placeholder": placeholder})
        ),
        (3, false),
        "overflow Reject: the placeholder answers at once"
    );
    assert_eq!(
        spec_of(
            process,
            json!({"maxPendingRequests": 3, "overflow": "Placeholder"})
        ),
        (3, false),
        "no placeholder to give: a 503"
    );
}

/// A route's static routes go to the shards with its rules, their responses' ConfigMap data
/// filled in as a placeholder's is, and a missing ConfigMap said.
#[test]
fn static_routes_go_to_the_shards_with_the_routes_rules() {
    let mut model = Model::new(Defaults::default());
    model.service("apps", "app-svc", Some(&service(None)));
    model.object(
        IR,
        "apps",
        "app",
        Some(&route(
            "app",
            json!({"staticRoutes": [
                {"rules": [{"paths": [{"value": "/healthz"}]}], "response": {"body": "ok"},
                 "responseMode": "Always"},
                {"rules": [{"paths": [{"value": "/docs"}]}],
                 "response": {"bodyFromConfigMap": {"name": "docs"}}},
            ]}),
        )),
    );
    let (ops, said) = model.ops();
    let rules = upserts(&ops)[0].rules.clone().expect("rules");
    assert_eq!(rules.rules.len(), 2, "the route's own rules are untouched");
    assert_eq!(rules.statics.len(), 2);
    assert!(rules.statics[0].always);
    assert_eq!(rules.statics[0].response.status, 200);
    assert_eq!(
        rules.statics[0].response.body,
        PlaceholderBody::Inline(b"ok".to_vec())
    );
    assert!(!rules.statics[1].always);
    assert!(
        said.iter().any(|said| said
            .reason
            .contains("spec.staticRoutes[1].response: ConfigMap apps/docs")),
        "{said:?}"
    );
    assert!(matches!(
        &rules.statics[1].response.body,
        PlaceholderBody::ConfigMap { data: None, .. }
    ));
}

/// What the state worker holds after a stream of ops: each revision's spec and ready pods.
fn apply(held: &mut BTreeMap<RevisionKey, (Option<RevisionSpec>, Vec<SocketAddr>)>, ops: Vec<Op>) {
    for op in ops {
        match op {
            Op::UpsertRevision(spec) => {
                let key = spec.key.clone();
                held.entry(key).or_default().0 = Some(spec);
            }
            Op::SetEndpoints {
                revision, ready, ..
            } => held.entry(revision).or_default().1 = ready,
            Op::RemoveRevision { revision } => {
                held.remove(&revision);
            }
            other => panic!("not an op of this source: {other:?}"),
        }
    }
}

/// Only the routes an event touches are built again, so what the worker ends up with after
/// any stream of events must be what a model that saw only the end state sends at once: 2 000
/// pseudo-random events over two namespaces, both kinds of object (with failovers, and
/// placeholders and static responses from ConfigMaps), Services, EndpointSlices that move between Services, and
/// deletions, compared after every event, the refusals too.
#[test]
fn building_only_what_an_event_touches_ends_where_building_everything_does() {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |below: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % below
    };
    // What the API server holds: (watch, namespace, name) → object.
    let mut world: BTreeMap<(u8, String, String), Value> = BTreeMap::new();
    let mut model = Model::new(Defaults::default());
    let mut held = BTreeMap::new();
    let feed =
        |model: &mut Model, watch: u8, namespace: &str, name: &str, value: Option<&Value>| {
            match watch {
                0 => model.object(HSO, namespace, name, value),
                1 => model.object(IR, namespace, name, value),
                2 => model.service(namespace, name, value),
                3 => model.slice(namespace, name, value),
                _ => model.config_map(namespace, name, value),
            }
        };
    for step in 0..2000 {
        let watch = next(5) as u8;
        let namespace = ["apps", "other"][next(2) as usize];
        let to = format!("s{}", next(3));
        let (name, value) = match watch {
            0 | 1 => {
                let name = ["a", "b"][next(2) as usize].to_string();
                let mut value = if watch == 0 {
                    object(&name, json!(8080), json!({}))
                } else {
                    route(&name, json!({}))
                };
                value["metadata"]["namespace"] = json!(namespace);
                let target = if watch == 0 {
                    "scaleTargetRef"
                } else {
                    "target"
                };
                value["spec"][target]["service"] = json!(to);
                if watch == 0 && next(2) == 0 {
                    value["spec"]["coldStartTimeoutFailoverRef"] =
                        json!({"service": format!("s{}", next(3)), "port": 8080});
                }
                if watch == 1 && next(2) == 0 {
                    value["spec"]["coldStart"] = json!({"placeholder": {"response": {
                        "bodyFromConfigMap": {"name": format!("cm{}", next(2))}}}});
                }
                if watch == 1 && next(2) == 0 {
                    value["spec"]["staticRoutes"] = json!([
                        {"rules": [{"paths": [{"value": "/docs"}]}],
                         "response": {"bodyFromConfigMap": {"name": format!("cm{}", next(2))}}}]);
                }
                (name, value)
            }
            2 => {
                let mut value = service(None);
                value["metadata"] = json!({"namespace": namespace, "name": to});
                value["spec"]["ports"][0]["name"] = json!(["web", "other"][next(2) as usize]);
                (to, value)
            }
            3 => {
                let ready: Vec<(String, Option<bool>)> = (0..next(3))
                    .map(|pod| (format!("10.0.{}.{pod}", next(4)), Some(next(3) != 0)))
                    .collect();
                let ready: Vec<(&str, Option<bool>)> = ready
                    .iter()
                    .map(|(ip, ready)| (ip.as_str(), *ready))
                    .collect();
                let mut value = slice(&ready);
                let name = format!("slice{}", next(4));
                value["metadata"] = json!({"namespace": namespace, "name": name,
                    "labels": {SLICE_SERVICE_LABEL: to},
                    "resourceVersion": step.to_string()});
                (name, value)
            }
            _ => {
                let name = format!("cm{}", next(2));
                let value = json!({"metadata": {"namespace": namespace, "name": name,
                    "labels": {RESPONSE_BODY_LABEL: "true"}},
                    "data": {"index.html": format!("page {}", next(3))}});
                (name, value)
            }
        };
        let id = (watch, namespace.to_string(), name.clone());
        if next(4) == 0 {
            world.remove(&id);
            feed(&mut model, watch, namespace, &name, None);
        } else {
            world.insert(id, value.clone());
            feed(&mut model, watch, namespace, &name, Some(&value));
        }
        apply(&mut held, model.ops().0);

        let mut fresh = Model::new(Defaults::default());
        for ((watch, namespace, name), value) in &world {
            feed(&mut fresh, *watch, namespace, name, Some(value));
        }
        let mut expected = BTreeMap::new();
        apply(&mut expected, fresh.ops().0);
        assert_eq!(held, expected, "after event {step}");
        let refusals = |model: &Model| {
            let mut all: Vec<String> = model
                .refusals()
                .map(|refusal| format!("{}: {}", refusal.object, refusal.reason))
                .collect();
            all.sort();
            all
        };
        assert_eq!(refusals(&model), refusals(&fresh), "after event {step}");
    }
    assert!(held.len() > 2, "the events built routes: {}", held.len());
}
