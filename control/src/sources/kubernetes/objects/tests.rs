use super::*;
use serde_json::json;

fn revision(spec: Value) -> Value {
    json!({
        "apiVersion": "serving.knative.dev/v1",
        "kind": "Revision",
        "metadata": {
            "namespace": "default",
            "name": "hello-00001",
            "labels": {
                "serving.knative.dev/service": "hello",
                "serving.knative.dev/configuration": "hello-config",
            },
        },
        "spec": spec,
    })
}

#[test]
fn a_revision_gives_its_concurrency_timeouts_protocol_policy_and_labels() {
    let spec = revision_spec(&revision(json!({
        "containerConcurrency": 4,
        "timeoutSeconds": 30,
        "responseStartTimeoutSeconds": 10,
        "containers": [{"image": "x", "ports": [{"name": "h2c", "containerPort": 8080}]}],
    })))
    .unwrap();
    assert_eq!(spec.key.as_str(), "default/hello-00001");
    assert_eq!(spec.labels.service, "hello");
    assert_eq!(spec.labels.configuration, "hello-config");
    assert_eq!(spec.container_concurrency, 4);
    assert_eq!(spec.timeouts.total, Duration::from_secs(30));
    assert_eq!(spec.timeouts.response_start, Some(Duration::from_secs(10)));
    assert_eq!(spec.timeouts.idle, None);
    assert_eq!(spec.protocol, Protocol::H2c);
    assert_eq!(spec.serving_port, 8013);
    assert_eq!(
        spec.lb_policy,
        LbPolicy::RoundRobin,
        "CC 4: upstream's default"
    );
}

#[test]
fn the_priority_annotation_sets_the_policy_and_a_bad_one_refuses_the_revision() {
    let with = |value: Option<&str>| {
        let mut object = revision(json!({}));
        if let Some(value) = value {
            object["metadata"]["annotations"] = json!({PRIORITY_ANNOTATION: value});
        }
        revision_spec(&object).map(|spec| spec.priority.map(|policy| *policy))
    };
    assert_eq!(with(None), Ok(None), "off without the annotation");
    assert_eq!(with(Some("off")), Ok(None));
    assert_eq!(with(Some("on")), Ok(Some(PriorityPolicy::default())));
    assert_eq!(with(Some("")), Ok(Some(PriorityPolicy::default())));
    assert_eq!(
        with(Some("bands=5, tenant_header=X-Org")),
        Ok(Some(PriorityPolicy {
            bands: 5,
            default_band: 2,
            tenant_header: "X-Org".into(),
            ..PriorityPolicy::default()
        }))
    );
    assert_eq!(
        with(Some(
            "priority_header_trusted=true, tenant_band.premium=2, tenant_band.batch=0"
        )),
        Ok(Some(PriorityPolicy {
            trusted: true,
            tenant_bands: vec![("premium".into(), 2), ("batch".into(), 0)],
            ..PriorityPolicy::default()
        }))
    );
    assert_eq!(
        with(Some("bands=2,default_band=0,priority_header=X-P")),
        Ok(Some(PriorityPolicy {
            bands: 2,
            default_band: 0,
            priority_header: "X-P".into(),
            ..PriorityPolicy::default()
        }))
    );
    // (value, words the refusal must have)
    for (value, words) in [
        ("bands=0", "bands is 0"),
        ("bands=17", "bands is 17"),
        ("bands=300", "bands is not a small count"),
        ("bands=3,default_band=3", "default_band is 3"),
        ("priority_header=a b", "priority_header"),
        ("tenant=X", "unknown key"),
        ("priority_header_trusted=yes", "not true or false"),
        (
            "tenant_band.premium=3",
            "tenant_bands gives \"premium\" band 3",
        ),
        ("bands", "not key=value"),
        ("yes", "not key=value"),
    ] {
        let refused = with(Some(value)).unwrap_err();
        assert!(refused.contains(PRIORITY_ANNOTATION), "{value}: {refused}");
        assert!(refused.contains(words), "{value}: {refused}");
    }
}

#[test]
fn missing_fields_take_upstreams_defaults_and_bad_ones_say_which() {
    let spec = revision_spec(&revision(json!({}))).unwrap();
    assert_eq!(spec.container_concurrency, 0);
    assert_eq!(spec.timeouts, Timeouts::default());
    assert_eq!(spec.protocol, Protocol::Http1);
    assert_eq!(spec.lb_policy, LbPolicy::RandomChoice2);
    let by_annotation = {
        let mut object = revision(json!({"containerConcurrency": 1}));
        object["metadata"]["annotations"] = json!({LB_POLICY_ANNOTATION: "least-connections"});
        revision_spec(&object).unwrap()
    };
    assert_eq!(by_annotation.lb_policy, LbPolicy::LeastConnections);
    let error = revision_spec(&revision(json!({"containerConcurrency": "lots"}))).unwrap_err();
    assert!(error.contains("spec.containerConcurrency"), "{error}");
    let error = revision_spec(&revision(json!({"loadBalancingPolicy": "random"}))).unwrap_err();
    assert!(error.contains("random"), "{error}");
    assert!(revision_spec(&json!({"metadata": {"name": "x"}})).is_err());
}

/// Values at the edge of their type: each row is one field's value and what comes of it.
#[test]
fn revision_values_out_of_bounds_refuse_the_revision_naming_the_field() {
    let huge = "x".repeat(1 << 20);
    for (field, value, refused_naming) in [
        (
            "timeoutSeconds",
            json!(u64::MAX),
            Some("spec.timeoutSeconds"),
        ),
        (
            "timeoutSeconds",
            json!(MAX_TIMEOUT_SECONDS + 1),
            Some("spec.timeoutSeconds"),
        ),
        ("timeoutSeconds", json!(MAX_TIMEOUT_SECONDS), None),
        ("timeoutSeconds", json!(-1), Some("spec.timeoutSeconds")),
        (
            "timeoutSeconds",
            json!(i64::MIN),
            Some("spec.timeoutSeconds"),
        ),
        ("timeoutSeconds", json!(1.5), Some("spec.timeoutSeconds")),
        ("timeoutSeconds", json!(0), None),
        ("timeoutSeconds", json!(huge), Some("spec.timeoutSeconds")),
        (
            "responseStartTimeoutSeconds",
            json!(u64::MAX),
            Some("spec.responseStartTimeoutSeconds"),
        ),
        (
            "responseStartTimeoutSeconds",
            json!(MAX_TIMEOUT_SECONDS),
            None,
        ),
        (
            "idleTimeoutSeconds",
            json!(u64::MAX),
            Some("spec.idleTimeoutSeconds"),
        ),
        (
            "idleTimeoutSeconds",
            json!(-5),
            Some("spec.idleTimeoutSeconds"),
        ),
        ("idleTimeoutSeconds", json!(MAX_TIMEOUT_SECONDS), None),
        (
            "containerConcurrency",
            json!(u64::MAX),
            Some("spec.containerConcurrency"),
        ),
        (
            "containerConcurrency",
            json!(u64::from(u32::MAX) + 1),
            Some("spec.containerConcurrency"),
        ),
        ("containerConcurrency", json!(u32::MAX), None),
        (
            "containerConcurrency",
            json!(-1),
            Some("spec.containerConcurrency"),
        ),
        (
            "loadBalancingPolicy",
            json!(huge),
            Some("load-balancing policy"),
        ),
    ] {
        let result = revision_spec(&revision(json!({ field: value })));
        match refused_naming {
            None => assert!(result.is_ok(), "{field} = {value:.40}: {result:?}"),
            Some(naming) => {
                let error = result.expect_err(field);
                assert!(error.contains(naming), "{field}: {error}");
                assert!(error.len() < 300, "the error quotes a cut value: {error}");
            }
        }
    }
    // The largest accepted timeouts are what the spec carries.
    let spec = revision_spec(&revision(json!({
        "timeoutSeconds": MAX_TIMEOUT_SECONDS,
        "idleTimeoutSeconds": MAX_TIMEOUT_SECONDS,
    })))
    .unwrap();
    assert_eq!(
        spec.timeouts.total,
        Duration::from_secs(MAX_TIMEOUT_SECONDS)
    );
    assert_eq!(
        spec.timeouts.idle,
        Some(Duration::from_secs(MAX_TIMEOUT_SECONDS))
    );
}

#[test]
fn an_endpoints_port_out_of_range_leaves_its_subset_unused_and_says_which_field() {
    for (port, used) in [
        (0, false),
        (-1, false),
        (i32::MIN, false),
        (65_536, false),
        (i32::MAX, false),
        (1, true),
        (65_535, true),
    ] {
        let endpoints: Endpoints = serde_json::from_value(json!({
            "metadata": {"name": "x-private", "namespace": "default"},
            "subsets": [
                {"addresses": [{"ip": "10.0.0.1"}], "ports": [{"name": "http", "port": port}]},
                {"addresses": [{"ip": "10.0.0.2"}], "ports": [{"name": "http", "port": 8012}]},
            ],
        }))
        .unwrap();
        let listing = endpoints_addresses(&endpoints);
        let ready: Vec<String> = listing
            .addresses
            .ready
            .iter()
            .map(ToString::to_string)
            .collect();
        if used {
            assert_eq!(
                ready,
                [format!("10.0.0.1:{port}"), "10.0.0.2:8012".to_string()]
            );
            assert!(listing.problems.is_empty(), "{:?}", listing.problems);
        } else {
            assert_eq!(
                ready,
                ["10.0.0.2:8012"],
                "port {port}: the other subset still counts"
            );
            assert_eq!(listing.problems.len(), 1, "{:?}", listing.problems);
            assert!(
                listing.problems[0].contains("subsets[0].ports[0].port"),
                "{:?}",
                listing.problems
            );
        }
    }
}

#[test]
fn a_slice_port_out_of_range_or_an_address_that_is_no_ip_is_reported() {
    for port in [
        json!(0),
        json!(-1),
        json!(65_536),
        json!(u64::MAX),
        json!(null),
        json!("http"),
    ] {
        let listing = slice_addresses(&json!({
            "ports": [{"name": "http", "port": port}],
            "endpoints": [{"addresses": ["10.0.0.1"]}],
        }));
        assert_eq!(listing.addresses, Addresses::default(), "{port}");
        assert!(
            listing.problems[0].contains("ports[0].port"),
            "{:?}",
            listing.problems
        );
    }
    let huge = "1".repeat(1 << 20);
    let listing = slice_addresses(&json!({
        "ports": [{"name": "http", "port": 8012}],
        "endpoints": [{"addresses": ["10.0.0.1", huge, 7]}],
    }));
    assert_eq!(listing.addresses.ready.len(), 1);
    assert_eq!(listing.problems.len(), 2, "{:?}", listing.problems);
    assert!(listing.problems[0].contains("endpoints[0].addresses[1]"));
    assert!(
        listing.problems[0].len() < 300,
        "cut: {}",
        listing.problems[0]
    );
    // Many bad addresses: a few problems are listed, not one per address.
    let many: Vec<Value> = (0..10_000).map(|n| json!(format!("bad-{n}"))).collect();
    let listing = slice_addresses(&json!({
        "ports": [{"name": "http", "port": 8012}],
        "endpoints": [{"addresses": many}],
    }));
    assert_eq!(listing.problems.len(), PROBLEMS_MAX + 1);
}

#[test]
fn an_object_listing_more_addresses_than_the_bound_is_not_used() {
    let ips = |count: usize| -> Vec<Value> {
        (0..count)
            .map(|n| json!(format!("10.{}.{}.{}", n >> 16, (n >> 8) & 255, n & 255)))
            .collect()
    };
    let slice = |count: usize| {
        json!({
            "ports": [{"name": "http", "port": 8012}],
            "endpoints": [{"addresses": ips(count)}],
        })
    };
    let at_bound = slice_addresses(&slice(MAX_ADDRESSES_PER_OBJECT));
    assert_eq!(at_bound.addresses.ready.len(), MAX_ADDRESSES_PER_OBJECT);
    assert!(at_bound.problems.is_empty());
    let over = slice_addresses(&slice(MAX_ADDRESSES_PER_OBJECT + 1));
    assert_eq!(over.addresses, Addresses::default());
    assert!(
        over.problems[0].contains("65537 addresses"),
        "{:?}",
        over.problems
    );
    let endpoints: Endpoints = serde_json::from_value(json!({
        "metadata": {"name": "x-private", "namespace": "default"},
        "subsets": [{
            "addresses": ips(MAX_ADDRESSES_PER_OBJECT).into_iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>(),
            "notReadyAddresses": [{"ip": "10.255.0.1"}],
            "ports": [{"name": "http", "port": 8012}],
        }],
    }))
    .unwrap();
    let over = endpoints_addresses(&endpoints);
    assert_eq!(over.addresses, Addresses::default());
    assert!(over.problems[0].contains("subsets"), "{:?}", over.problems);
}

#[test]
fn endpoints_take_the_port_named_http_or_http2_and_split_ready_from_not_ready() {
    let endpoints: Endpoints = serde_json::from_value(json!({
        "metadata": {"name": "hello-00001-private", "namespace": "default"},
        "subsets": [
            {
                "addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}],
                "notReadyAddresses": [{"ip": "10.0.0.3"}],
                "ports": [{"name": "http-autometric", "port": 9090}, {"name": "http", "port": 8012}],
            },
            {"addresses": [{"ip": "10.0.0.9"}], "ports": [{"name": "https", "port": 8112}]},
        ],
    }))
    .unwrap();
    let listing = endpoints_addresses(&endpoints);
    assert_eq!(listing.problems, Vec::<String>::new());
    let addresses = listing.addresses;
    let ready: Vec<String> = addresses.ready.iter().map(ToString::to_string).collect();
    assert_eq!(ready, ["10.0.0.1:8012", "10.0.0.2:8012"]);
    let not_ready: Vec<String> = addresses
        .not_ready
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(not_ready, ["10.0.0.3:8012"]);
}

#[test]
fn endpoint_slices_of_either_version_read_alike() {
    let v1 = json!({
        "apiVersion": "discovery.k8s.io/v1",
        "addressType": "IPv4",
        "endpoints": [
            {"addresses": ["10.0.0.1"], "conditions": {"ready": true}, "nodeName": "n"},
            {"addresses": ["10.0.0.2"], "conditions": {"ready": false}},
            {"addresses": ["10.0.0.3"]},
        ],
        "ports": [{"name": "http2", "port": 8013}],
    });
    let mut v1beta1 = v1.clone();
    v1beta1["apiVersion"] = json!("discovery.k8s.io/v1beta1");
    v1beta1["endpoints"][0]["topology"] = json!({"kubernetes.io/hostname": "n"});
    for slice in [v1, v1beta1] {
        let addresses = slice_addresses(&slice).addresses;
        let ready: Vec<String> = addresses.ready.iter().map(ToString::to_string).collect();
        assert_eq!(
            ready,
            ["10.0.0.1:8013", "10.0.0.3:8013"],
            "nil ready means ready"
        );
        assert_eq!(addresses.not_ready.len(), 1);
    }
    assert_eq!(
        slice_addresses(&json!({"ports": [{"name": "https", "port": 1}]})),
        Listing::default()
    );
    assert_eq!(slice_addresses(&json!(null)), Listing::default());
}

#[test]
fn this_activator_subsets_only_when_it_is_in_the_public_endpoints() {
    let mut addresses = Addresses::default();
    for ip in ["10.1.0.2", "10.1.0.1"] {
        addresses
            .ready
            .insert(SocketAddr::new(ip.parse().unwrap(), 8012));
    }
    let me: IpAddr = "10.1.0.2".parse().unwrap();
    let activators = public_activators(&addresses, Some(me)).unwrap();
    assert_eq!(activators.me, Some(me));
    assert_eq!(activators.all.len(), 2);
    assert_eq!(
        public_activators(&addresses, Some("10.9.9.9".parse().unwrap())),
        None
    );
    assert_eq!(public_activators(&addresses, None), None);
}

#[test]
fn exec_readiness_or_a_startup_probe_turns_the_probe_optimisation_off() {
    let with = |containers: Value| probe_optimisation(&json!({"spec": {"containers": containers}}));
    assert!(with(json!([{"ports": [{"containerPort": 8080}]}])));
    assert!(
        probe_optimisation(&json!({})),
        "no containers: nothing says otherwise"
    );
    assert!(!with(
        json!([{"readinessProbe": {"exec": {"command": ["true"]}}}])
    ));
    assert!(with(
        json!([{"readinessProbe": {"httpGet": {"port": 8080}}}])
    ));
    // With a sidecar, the user container is the one with ports; any startup probe counts.
    assert!(!with(json!([
        {"name": "sidecar", "readinessProbe": {"exec": {"command": ["true"]}}, "startupProbe": {}},
        {"name": "user", "ports": [{"containerPort": 8080}]},
    ])));
    assert!(with(json!([
        {"name": "sidecar", "readinessProbe": {"exec": {"command": ["true"]}}},
        {"name": "user", "ports": [{"containerPort": 8080}]},
    ])));
    assert!(!with(json!([
        {"name": "user", "ports": [{"containerPort": 8080}], "readinessProbe": {"exec": {}}},
        {"name": "sidecar"},
    ])));
}

#[test]
fn owners_come_from_the_labels() {
    let meta: ObjectMeta = serde_json::from_value(json!({
        "namespace": "default",
        "name": "hello-00001-private",
        "labels": {SERVICE_TYPE_LABEL: "Private", REVISION_LABEL: "hello-00001"},
    }))
    .unwrap();
    let (key, kind) = owner(&meta).unwrap();
    assert_eq!(
        (key.as_str(), kind),
        ("default/hello-00001", ServiceType::Private)
    );
    let unlabelled: ObjectMeta =
        serde_json::from_value(json!({"namespace": "default", "name": "x"})).unwrap();
    assert_eq!(owner(&unlabelled), None);
}

#[test]
fn a_private_service_gives_its_cluster_ip_at_the_http_port() {
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "hello-00001-private", "namespace": "default"},
        "spec": {"clusterIP": "10.96.3.4", "ports": [
            {"name": "https", "port": 443}, {"name": "http", "port": 80, "targetPort": 8012}
        ]},
    }))
    .unwrap();
    assert_eq!(
        service_address(&service),
        Some("10.96.3.4:80".parse().unwrap())
    );
    let headless: Service = serde_json::from_value(json!({
        "metadata": {"name": "x"}, "spec": {"clusterIP": "None", "ports": [{"name": "http", "port": 80}]},
    }))
    .unwrap();
    assert_eq!(service_address(&headless), None);
}
