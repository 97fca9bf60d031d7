use super::*;
use crate::state::OmissionScope;
use kactivator_shards::routing::LbPolicy;
use serde_json::json;

fn key(name: &str) -> RevisionKey {
    RevisionKey::new("default", name).unwrap()
}

fn tunables() -> Tunables {
    Tunables {
        queue_depth: 100,
        lb_policy: None,
        probe_timeout: std::time::Duration::from_millis(300),
        probe_interval: std::time::Duration::from_millis(200),
        max_queued_requests: 1000,
    }
}

fn revision(name: &str, cc: u32) -> Value {
    json!({
        "metadata": {"namespace": "default", "name": name},
        "spec": {"containerConcurrency": cc},
    })
}

fn addresses(ready: &[&str], not_ready: &[&str]) -> Addresses {
    Addresses {
        ready: ready.iter().map(|addr| addr.parse().unwrap()).collect(),
        not_ready: not_ready.iter().map(|addr| addr.parse().unwrap()).collect(),
    }
}

fn private(name: &str, ready: &[&str]) -> EndpointsSeen {
    EndpointsSeen {
        revision: key(name),
        kind: ServiceType::Private,
        addresses: addresses(ready, &[]),
    }
}

fn id(name: &str) -> ObjectId {
    ("default".into(), name.into())
}

fn model() -> Model {
    // Ready pods trusted without a probe (the probing rules are backends.rs' tests).
    Model::new(
        MeshMode::Disabled,
        "10.1.0.1".parse().ok(),
        Gates::HYBRID,
        tunables(),
    )
}

#[test]
fn a_changed_revision_is_upserted_and_an_unchanged_one_is_not() {
    let mut model = model();
    let ops = model.revision_applied(&revision("a", 1)).unwrap();
    assert!(matches!(&ops[..], [Op::UpsertRevision(spec)] if spec.container_concurrency == 1));
    assert!(model
        .revision_applied(&revision("a", 1))
        .unwrap()
        .is_empty());
    assert_eq!(model.revision_applied(&revision("a", 2)).unwrap().len(), 1);
    assert!(model.revision_applied(&json!({"spec": {}})).is_err());
}

#[test]
fn a_relist_applies_only_the_difference() {
    let mut model = model();
    model.revision_applied(&revision("stays", 1)).unwrap();
    model.revision_applied(&revision("changes", 1)).unwrap();
    model.revision_applied(&revision("goes", 1)).unwrap();
    let (ops, errors) = model.revisions_listed(&[
        revision("stays", 1),
        revision("changes", 3),
        revision("new", 0),
    ]);
    assert!(errors.is_empty());
    let mut upserted: Vec<String> = Vec::new();
    let mut removed: Vec<String> = Vec::new();
    for op in ops {
        match op {
            Op::UpsertRevision(spec) => upserted.push(spec.key.name().to_string()),
            Op::RemoveRevision { revision } => removed.push(revision.name().to_string()),
            other => panic!("{other:?}"),
        }
    }
    upserted.sort();
    assert_eq!(upserted, ["changes", "new"]);
    assert_eq!(removed, ["goes"]);
}

#[test]
fn a_revisions_slices_are_merged_and_a_relist_touches_only_changed_revisions() {
    let mut model = model();
    model.endpoints_applied(id("a-1"), private("a", &["10.0.0.1:8012"]));
    let ops = model.endpoints_applied(id("a-2"), private("a", &["10.0.0.2:8012"]));
    assert_eq!(
        ops,
        [Op::SetEndpoints {
            revision: key("a"),
            ready: vec![
                "10.0.0.1:8012".parse().unwrap(),
                "10.0.0.2:8012".parse().unwrap()
            ],
            scope: OmissionScope::AllPods,
        }]
    );
    model.endpoints_applied(id("b-1"), private("b", &["10.0.0.9:8012"]));
    // The relist still has a's slices and lost b's: only b is recomputed.
    let ops = model.endpoints_listed(vec![
        (id("a-1"), private("a", &["10.0.0.1:8012"])),
        (id("a-2"), private("a", &["10.0.0.2:8012"])),
    ]);
    assert_eq!(
        ops,
        [Op::SetEndpoints {
            revision: key("b"),
            ready: vec![],
            scope: OmissionScope::AllPods,
        }]
    );
    // Deleting one slice leaves the other's pods.
    let ops = model.endpoints_deleted(&id("a-2"));
    assert!(matches!(&ops[..], [Op::SetEndpoints { ready, .. }] if ready.len() == 1));
}

/// A revision and its private endpoints go away in either order, each event in its own
/// watch: nothing of the revision is left behind, and the later deletion sends nothing.
#[test]
fn a_revision_and_its_endpoints_deleted_in_either_order_leave_nothing_behind() {
    for mesh in [MeshMode::Disabled, MeshMode::Auto] {
        // Revision first, then its endpoints.
        let mut model = model_with(mesh);
        model.revision_applied(&revision("a", 1)).unwrap();
        model.endpoints_applied(id("a-private"), private("a", &["10.0.0.1:8012"]));
        assert_eq!(
            model.revision_deleted(&key("a")),
            [Op::RemoveRevision { revision: key("a") }]
        );
        assert_eq!(model.endpoints_deleted(&id("a-private")), [], "{mesh:?}");
        assert_eq!(model.backend_revisions(), 0, "{mesh:?}: re-created");
        assert!(model.probes_due(true).is_empty(), "{mesh:?}");

        // Endpoints first, then the revision.
        let mut model = model_with(mesh);
        model.revision_applied(&revision("a", 1)).unwrap();
        model.endpoints_applied(id("a-private"), private("a", &["10.0.0.1:8012"]));
        for job in model.probes_due(false) {
            model.probed(&job, Outcome::Passed);
        }
        let ops = model.endpoints_deleted(&id("a-private"));
        assert!(
            matches!(&ops[..], [Op::SetEndpoints { ready, .. }] if ready.is_empty()),
            "{mesh:?}: the pods go first: {ops:?}"
        );
        assert_eq!(
            model.revision_deleted(&key("a")),
            [Op::RemoveRevision { revision: key("a") }]
        );
        assert_eq!(model.backend_revisions(), 0, "{mesh:?}");

        // The endpoints change once more after the revision went (a pod still
        // terminating), then go: what was sent for them is taken back, and nothing stays.
        let mut model = model_with(mesh);
        model.revision_applied(&revision("a", 1)).unwrap();
        model.endpoints_applied(
            id("a-private"),
            private("a", &["10.0.0.1:8012", "10.0.0.2:8012"]),
        );
        model.revision_deleted(&key("a"));
        model.endpoints_applied(id("a-private"), private("a", &["10.0.0.2:8012"]));
        for job in model.probes_due(false) {
            model.probed(&job, Outcome::Passed);
        }
        let ops = model.endpoints_deleted(&id("a-private"));
        assert!(
            ops.iter()
                .all(|op| matches!(op, Op::SetEndpoints { ready, .. } if ready.is_empty())),
            "{mesh:?}: {ops:?}"
        );
        assert_eq!(model.backend_revisions(), 0, "{mesh:?}");
        assert!(model.probes_due(true).is_empty(), "{mesh:?}");
    }
}

#[test]
fn missing_slices_are_looked_for_only_on_the_evidence_and_warned_about_once() {
    let start = Instant::now();
    let at = |seconds: u64| start + Duration::from_secs(seconds);
    let api = "discovery.k8s.io/v1beta1 EndpointSlices";
    let mut check = MissingSlices::default();
    // No revision yet, or slices seen: nothing to look for.
    assert!(!check.due(at(0), 0, 0));
    assert!(!check.due(at(0), 3, 1));
    // Revisions and no slice: look, once at a time.
    assert!(check.due(at(0), 3, 0));
    assert!(!check.due(at(1), 3, 0), "a look is under way");
    // No labelled Endpoints either (revisions scaled to zero, say): no warning, and the
    // next look waits.
    assert_eq!(check.looked(Some(0), 3, 0, api), None);
    assert!(!check.due(at(29), 3, 0));
    assert!(check.due(at(30), 3, 0));
    // The list failed: nothing said, tried again later.
    assert_eq!(check.looked(None, 3, 0, api), None);
    assert!(check.due(at(60), 3, 0));
    // Labelled Endpoints exist: the warning, naming the setting that fixes it.
    let warning = check
        .looked(Some(1), 3, 0, api)
        .expect("the evidence is there");
    assert!(warning.contains("endpoints = \"endpoints\""), "{warning}");
    assert!(warning.contains("[kubernetes]"), "{warning}");
    assert!(warning.contains(api), "{warning}");
    // Said once.
    assert!(!check.due(at(3600), 3, 0));
    assert_eq!(check.looked(Some(1), 3, 0, api), None);
    // A slice that appeared while the look was out: no warning.
    let mut check = MissingSlices::default();
    assert!(check.due(at(0), 1, 0));
    assert_eq!(check.looked(Some(1), 1, 1, api), None);
}

#[test]
fn public_endpoints_set_the_activators_only_when_this_one_is_among_them() {
    let mut model = model();
    let public = |ips: &[&str]| EndpointsSeen {
        revision: key("a"),
        kind: ServiceType::Public,
        addresses: addresses(ips, &[]),
    };
    let ops = model.endpoints_applied(id("a"), public(&["10.1.0.1:8012", "10.1.0.2:8012"]));
    assert!(matches!(
        &ops[..],
        [Op::SetRevisionActivators { activators: Some(activators), .. }] if activators.all.len() == 2
    ));
    assert!(model
        .endpoints_applied(id("a"), public(&["10.1.0.2:8012"]))
        .is_empty());
}

#[test]
fn in_mesh_mode_the_private_service_joins_the_spec() {
    let mut model = Model::new(MeshMode::Enabled, None, Gates::HYBRID, tunables());
    model.revision_applied(&revision("a", 2)).unwrap();
    let address: SocketAddr = "10.96.0.5:80".parse().unwrap();
    let ops = model.service_applied(key("a"), Some(address));
    assert!(matches!(&ops[..], [Op::UpsertRevision(spec)] if spec.cluster_ip == Some(address)));
    assert!(model.service_applied(key("a"), Some(address)).is_empty());
    let ops = model.services_listed(vec![]);
    assert!(matches!(&ops[..], [Op::UpsertRevision(spec)] if spec.cluster_ip.is_none()));
    // Outside mesh mode the Service changes nothing.
    let mut pods = model_with(MeshMode::Disabled);
    pods.revision_applied(&revision("a", 2)).unwrap();
    assert!(pods.service_applied(key("a"), Some(address)).is_empty());
}

#[test]
fn in_auto_mode_a_revision_whose_pods_fail_as_behind_a_mesh_moves_to_its_service() {
    let mut model = model_with(MeshMode::Auto);
    model.revision_applied(&revision("a", 4)).unwrap();
    let service: SocketAddr = "10.96.0.9:80".parse().unwrap();
    assert!(
        model.service_applied(key("a"), Some(service)).is_empty(),
        "pod mode"
    );
    model.endpoints_applied(id("a-private"), private("a", &["10.0.0.1:8012"]));
    for job in model.probes_due(false) {
        assert!(model
            .probed(&job, Outcome::Failed { mesh_like: true })
            .is_empty());
    }
    let [job] = &model.probes_due(false)[..] else {
        panic!("the Service is probed once");
    };
    assert_eq!((job.target, job.addr), (Target::Service, service));
    // The spec first (cluster-IP mode), then the pods it counts.
    let ops = model.probed(job, Outcome::Passed);
    assert!(
        matches!(&ops[..], [Op::UpsertRevision(spec), Op::SetEndpoints { ready, .. }]
            if spec.cluster_ip == Some(service) && ready.len() == 1),
        "{ops:?}"
    );
    // The Service moving moves the revision with it.
    let moved: SocketAddr = "10.96.0.10:80".parse().unwrap();
    let ops = model.service_applied(key("a"), Some(moved));
    assert!(matches!(&ops[..], [Op::UpsertRevision(spec)] if spec.cluster_ip == Some(moved)));
}

#[test]
fn a_service_probe_answered_by_an_address_it_no_longer_has_moves_nothing() {
    let mut model = model_with(MeshMode::Auto);
    model.revision_applied(&revision("a", 4)).unwrap();
    model.service_applied(key("a"), Some("10.96.0.9:80".parse().unwrap()));
    model.endpoints_applied(id("a-private"), private("a", &["10.0.0.1:8012"]));
    for job in model.probes_due(false) {
        model.probed(&job, Outcome::Failed { mesh_like: true });
    }
    let jobs = model.probes_due(false);
    model.service_applied(key("a"), Some("10.96.0.10:80".parse().unwrap()));
    assert!(model.probed(&jobs[0], Outcome::Passed).is_empty());
}

#[test]
fn the_peers_are_the_other_ready_activators_of_every_slice() {
    // POD_IP 10.1.0.1: never its own peer.
    let mut model = Model::new(
        MeshMode::Disabled,
        "10.1.0.1".parse().ok(),
        Gates::HYBRID,
        tunables(),
    );
    let slice = |ready: &[&str], not_ready: &[&str]| addresses(ready, not_ready);
    let peers = model.activators_listed(vec![
        (
            id("a-1"),
            slice(&["10.1.0.1:8012", "10.1.0.2:8012"], &["10.1.0.9:8012"]),
        ),
        (id("a-2"), slice(&["10.1.0.3:8012"], &[])),
    ]);
    let addrs = |list: &[&str]| {
        list.iter()
            .map(|a| a.parse().unwrap())
            .collect::<Vec<SocketAddr>>()
    };
    assert_eq!(peers, Some(addrs(&["10.1.0.2:8012", "10.1.0.3:8012"])));
    // The same again: nothing to tell.
    assert_eq!(
        model.activators_applied(id("a-2"), Some(slice(&["10.1.0.3:8012"], &[]))),
        None
    );
    assert_eq!(
        model.activators_applied(id("a-1"), None),
        Some(addrs(&["10.1.0.3:8012"]))
    );
    assert_eq!(model.activators_listed(vec![]), Some(vec![]));
}

fn model_with(mesh: MeshMode) -> Model {
    Model::new(mesh, None, Gates::HYBRID, tunables())
}

#[test]
fn config_features_flip_the_gates_and_a_bad_value_keeps_the_old_one() {
    let mut model = model();
    let data = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect()
    };
    let (ops, warnings) = model.features(&data(&[("activator.pod-quarantine", "Disabled")]));
    assert_eq!(ops, [Op::SetGates(Gates::QUEUE_PROXY_ONLY)]);
    assert!(warnings.is_empty());
    let (ops, warnings) = model.features(&data(&[("activator.pod-quarantine", "maybe")]));
    assert!(ops.is_empty(), "kept");
    assert_eq!(warnings.len(), 1);
    assert_eq!(MeshMode::parse("Enabled"), Some(MeshMode::Enabled));
    assert_eq!(MeshMode::parse("sometimes"), None);
}

#[test]
fn tunables_from_config_features_reach_every_revision_that_did_not_choose() {
    let mut model = model();
    let ops = model.revision_applied(&revision("plain", 0)).unwrap();
    assert!(matches!(&ops[..], [Op::UpsertRevision(spec)] if spec.queue_depth == 100));
    let mut chose = revision("chose", 0);
    chose["metadata"]["annotations"] = json!({objects::LB_POLICY_ANNOTATION: "least-connections"});
    model.revision_applied(&chose).unwrap();
    let data: BTreeMap<String, String> = [
        (features::QUEUE_DEPTH, "7"),
        (features::LOAD_BALANCING_POLICY, "first-available"),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_string(), value.to_string()))
    .collect();
    let (ops, warnings) = model.features(&data);
    assert!(warnings.is_empty(), "{warnings:?}");
    let policies: BTreeMap<String, (u32, LbPolicy)> = ops
        .iter()
        .map(|op| match op {
            Op::UpsertRevision(spec) => (
                spec.key.name().to_string(),
                (spec.queue_depth, spec.lb_policy),
            ),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(policies["plain"], (7, LbPolicy::FirstAvailable));
    assert_eq!(policies["chose"], (7, LbPolicy::LeastConnections));
    // Same data again: nothing to do.
    assert!(model.features(&data).0.is_empty());
}

#[test]
fn the_queue_cap_from_config_features_is_an_op_for_the_state_worker() {
    let mut model = model();
    let data = |value: &str| -> BTreeMap<String, String> {
        [(features::MAX_QUEUED_REQUESTS.to_string(), value.to_string())].into()
    };
    let (ops, warnings) = model.features(&data("20"));
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(ops, [Op::SetMaxQueuedRequests(20)]);
    assert!(model.features(&data("20")).0.is_empty(), "unchanged: no op");
    // The key removed: back to the default.
    let (ops, _) = model.features(&BTreeMap::new());
    assert_eq!(ops, [Op::SetMaxQueuedRequests(1000)]);
}

#[test]
fn an_h2c_revision_is_routed_like_any_other() {
    // Its requests go to the pods in the protocol they arrived in, at the endpoints' port
    // (named `http2`, 8013), as upstream.
    let mut model = model();
    let mut object = revision("grpc", 1);
    object["spec"]["containers"] = json!([{"ports": [{"name": "h2c", "containerPort": 8080}]}]);
    let applied = model.revision_applied(&object);
    assert!(applied.is_ok(), "{:?}", applied.err());
    assert_eq!(model.revision_count(), 1);
}

#[test]
fn an_h2c_revisions_pods_are_probed_over_h2c_and_the_others_over_http1() {
    use kactivator_shards::routing::Protocol;
    let mut model = model_with(MeshMode::Auto);
    let mut grpc = revision("grpc", 1);
    grpc["spec"]["containers"] = json!([{"ports": [{"name": "h2c", "containerPort": 8080}]}]);
    model.revision_applied(&grpc).unwrap();
    model.revision_applied(&revision("web", 1)).unwrap();
    model.endpoints_applied(id("grpc-private"), private("grpc", &["10.0.0.1:8013"]));
    model.endpoints_applied(id("web-private"), private("web", &["10.0.0.2:8012"]));
    let jobs: BTreeMap<String, Protocol> = model
        .probes_due(false)
        .iter()
        .map(|job| (job.revision.name().to_string(), job.protocol))
        .collect();
    assert_eq!(
        jobs,
        BTreeMap::from([
            ("grpc".to_string(), Protocol::H2c),
            ("web".to_string(), Protocol::Http1)
        ])
    );
}
