//! Kubernetes objects as the API server sends them, through the source's pure readers
//! (`sources::kubernetes::objects`), its model of the cluster (`model`) and the state worker's
//! core (`state::ControlState`), as the watcher drives them.
//!
//! Input: the first byte picks the mesh mode (`0` auto, `1` enabled, `2` disabled, modulo 3);
//! then one watch event per line, as a watch stream carries them:
//! `{"type":"ADDED"|"MODIFIED"|"DELETED","object":{"kind":..., ...}}` for a Revision,
//! Endpoints, EndpointSlice, Service or ConfigMap (`config-features`); named
//! `activator-service`, Endpoints and EndpointSlices are the activators' own. Two more lines
//! stand for what else reaches the model: `{"type":"LIST","object":{"kind":"...List","items":[...]}}`
//! a (re)list, and `{"type":"PROBE","tick":bool,"outcomes":"pfxs"}` the outcomes of the probes
//! under way (passed, failed as behind a mesh, failed otherwise, skipped), in order.
//!
//! Beyond "no panic": each reader's output agrees with its object, and the model agrees with
//! what it was told: it holds the revisions and endpoints it was last given, and relisting
//! exactly those changes nothing.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Endpoints, Service};
use kactivator_api::RevisionKey;
use kactivator_control::features::Tunables;
use kactivator_control::pod_state::{Gates, Timestamp};
use kactivator_control::sources::kubernetes::backends::{MeshMode, Outcome, ProbeJob};
use kactivator_control::sources::kubernetes::model::{EndpointsSeen, Model, ObjectId};
use kactivator_control::sources::kubernetes::objects::{self, Addresses, ServiceType};
use kactivator_control::state::{ControlState, Limits, Op};
use kactivator_shards::routing::{DEFAULT_QUEUE_DEPTH, MAX_TIMEOUT_SECONDS};
use kactivator_shards::throttle::gate::ProcessQueue;
use kube::core::DynamicObject;
use serde_json::Value;

/// This activator's address, as `POD_IP` gives it.
const POD_IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 1, 0, 1));
/// `activator-service`: its endpoints are the activators, not a revision's pods.
const ACTIVATOR_SERVICE: &str = "activator-service";

/// The cluster as the harness told it, to hold the model to.
#[derive(Default)]
struct Told {
    revisions: BTreeMap<RevisionKey, Value>,
    endpoints: BTreeMap<ObjectId, EndpointsSeen>,
}

/// One watched object, read as the informer loop reads it (`informers.rs`'s `read_*`).
enum Item {
    Revision(Value),
    Endpoints(ObjectId, Option<EndpointsSeen>),
    Service(Option<RevisionKey>, Option<std::net::SocketAddr>),
    Features(BTreeMap<String, String>),
    Activators(ObjectId, Addresses),
}

/// Feed arbitrary bytes as a watch stream.
pub fn kubernetes(data: &[u8]) {
    let Some((&selector, stream)) = data.split_first() else {
        return;
    };
    let mesh = match selector % 3 {
        0 => MeshMode::Auto,
        1 => MeshMode::Enabled,
        _ => MeshMode::Disabled,
    };
    let tunables = Tunables {
        queue_depth: DEFAULT_QUEUE_DEPTH,
        lb_policy: None,
        probe_timeout: Duration::from_millis(300),
        probe_interval: Duration::from_millis(200),
        max_queued_requests: 100_000,
    };
    let mut model = Model::new(mesh, Some(POD_IP), Gates::default(), tunables);
    let mut state = ControlState::new(
        2,
        Gates::default(),
        Limits::default(),
        Arc::new(ProcessQueue::new(ProcessQueue::UNLIMITED)),
    );
    let mut told = Told::default();
    let mut probes: Vec<ProbeJob> = Vec::new();
    let mut now = Timestamp::from_epoch_offset(Duration::from_secs(1));

    for line in stream.split(|&byte| byte == b'\n') {
        let Ok(event) = serde_json::from_slice::<Value>(line) else {
            continue;
        };
        let object = &event["object"];
        let ops = match event["type"].as_str() {
            Some("ADDED" | "MODIFIED") => read(object)
                .map(|item| applied(&mut model, &mut told, item))
                .unwrap_or_default(),
            Some("DELETED") => read(object)
                .map(|item| deleted(&mut model, &mut told, item))
                .unwrap_or_default(),
            Some("LIST") => listed(&mut model, &mut told, object),
            Some("PROBE") => {
                let outcomes = event["outcomes"].as_str().unwrap_or_default();
                let mut ops = Vec::new();
                for (job, letter) in probes
                    .drain(..)
                    .zip(outcomes.chars().chain(std::iter::repeat('s')))
                {
                    let outcome = match letter {
                        'p' => Outcome::Passed,
                        'f' => Outcome::Failed { mesh_like: true },
                        'x' => Outcome::Failed { mesh_like: false },
                        _ => Outcome::Skipped,
                    };
                    ops.extend(model.probed(&job, outcome));
                }
                if event["tick"].as_bool() == Some(true) {
                    probes.extend(model.probes_due(true));
                }
                ops
            }
            _ => Vec::new(),
        };
        probes.extend(model.probes_due(false));
        check_ops(&ops, &told);
        for op in ops {
            // Refusals (a tracker limit) are the state worker's to report, not a fault here.
            let _ = state.apply(op, now);
        }
        now = now + Duration::from_millis(100);
        state.expire_quarantines(now);
        let _ = state.take_effects();
    }

    // The model holds what it was last told, and relisting exactly that changes nothing.
    assert_eq!(model.revision_count(), told.revisions.len());
    assert_eq!(model.endpoints_count(), told.endpoints.len());
    let objects: Vec<Value> = told.revisions.values().cloned().collect();
    let (ops, errors) = model.revisions_listed(&objects);
    assert!(errors.is_empty(), "{errors:?}");
    assert!(ops.is_empty(), "relisting the same revisions gave {ops:?}");
    let ops = model.endpoints_listed(told.endpoints.clone().into_iter().collect());
    assert!(ops.is_empty(), "relisting the same endpoints gave {ops:?}");
}

/// An object of any kind, read as its informer would, with the readers' own checks.
fn read(object: &Value) -> Option<Item> {
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    match object["kind"].as_str()? {
        "Revision" => {
            check_revision(object);
            Some(Item::Revision(object.clone()))
        }
        "Endpoints" => {
            let endpoints: Endpoints = serde_json::from_value(object.clone()).ok()?;
            let id = object_id(&endpoints.metadata);
            if name == ACTIVATOR_SERVICE {
                let addresses = objects::activator_endpoints_addresses(&endpoints).addresses;
                check_addresses(&addresses);
                return Some(Item::Activators(id, addresses));
            }
            let addresses = objects::endpoints_addresses(&endpoints).addresses;
            check_addresses(&addresses);
            let seen = objects::owner(&endpoints.metadata).map(|(revision, kind)| EndpointsSeen {
                revision,
                kind,
                addresses,
            });
            Some(Item::Endpoints(id, seen))
        }
        "EndpointSlice" => {
            let slice: DynamicObject = serde_json::from_value(object.clone()).ok()?;
            let id = object_id(&slice.metadata);
            if name == ACTIVATOR_SERVICE {
                let addresses = objects::activator_slice_addresses(&slice.data).addresses;
                check_addresses(&addresses);
                return Some(Item::Activators(id, addresses));
            }
            let addresses = objects::slice_addresses(&slice.data).addresses;
            check_addresses(&addresses);
            let seen = objects::owner(&slice.metadata).map(|(revision, kind)| EndpointsSeen {
                revision,
                kind,
                addresses,
            });
            Some(Item::Endpoints(id, seen))
        }
        "Service" => {
            let service: Service = serde_json::from_value(object.clone()).ok()?;
            let revision = objects::owner(&service.metadata)
                .filter(|(_, kind)| *kind == ServiceType::Private)
                .map(|(revision, _)| revision);
            Some(Item::Service(revision, objects::service_address(&service)))
        }
        "ConfigMap" => {
            let data = object["data"]
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(key, value)| Some((key.clone(), value.as_str()?.to_string())))
                .collect();
            Some(Item::Features(data))
        }
        _ => None,
    }
}

fn object_id(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> ObjectId {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// A Revision's spec agrees with its object, and what it routes with is within bounds.
fn check_revision(object: &Value) {
    let Ok(spec) = objects::revision_spec(object) else {
        return;
    };
    let metadata = &object["metadata"];
    assert_eq!(Some(spec.key.namespace()), metadata["namespace"].as_str());
    assert_eq!(Some(spec.key.name()), metadata["name"].as_str());
    assert_eq!(spec.labels.namespace, spec.key.namespace());
    assert_eq!(spec.labels.revision, spec.key.name());
    let longest = Duration::from_secs(MAX_TIMEOUT_SECONDS);
    assert!(spec.timeouts.total > Duration::ZERO && spec.timeouts.total <= longest);
    assert!(spec.timeouts.response_start.is_none_or(|t| t <= longest));
    assert!(spec.timeouts.idle.is_none_or(|t| t <= longest));
}

/// Ready and not ready are each a set of addresses; merged, an address is in one of them.
fn check_addresses(addresses: &Addresses) {
    let mut merged = Addresses::default();
    merged.merge(addresses);
    assert!(merged.ready.is_disjoint(&merged.not_ready));
    assert_eq!(merged.ready, addresses.ready);
}

fn applied(model: &mut Model, told: &mut Told, item: Item) -> Vec<Op> {
    match item {
        Item::Revision(object) => match model.revision_applied(&object) {
            Ok(ops) => {
                let key = objects::revision_spec(&object).expect("it was applied").key;
                told.revisions.insert(key, object);
                ops
            }
            Err(_) => Vec::new(),
        },
        Item::Endpoints(id, Some(seen)) => {
            told.endpoints.insert(id.clone(), seen.clone());
            model.endpoints_applied(id, seen)
        }
        Item::Endpoints(id, None) => {
            told.endpoints.remove(&id);
            model.endpoints_deleted(&id)
        }
        Item::Service(Some(revision), address) => model.service_applied(revision, address),
        Item::Service(None, _) => Vec::new(),
        Item::Features(data) => model.features(&data).0,
        Item::Activators(id, addresses) => {
            let _ = model.activators_applied(id, Some(addresses));
            Vec::new()
        }
    }
}

fn deleted(model: &mut Model, told: &mut Told, item: Item) -> Vec<Op> {
    match item {
        Item::Revision(object) => {
            let metadata = &object["metadata"];
            let key = RevisionKey::new(
                metadata["namespace"].as_str().unwrap_or_default(),
                metadata["name"].as_str().unwrap_or_default(),
            );
            match key {
                Ok(key) => {
                    told.revisions.remove(&key);
                    model.revision_deleted(&key)
                }
                Err(_) => Vec::new(),
            }
        }
        Item::Endpoints(id, _) => {
            told.endpoints.remove(&id);
            model.endpoints_deleted(&id)
        }
        Item::Service(Some(revision), _) => model.service_applied(revision, None),
        Item::Service(None, _) => Vec::new(),
        Item::Features(_) => model.features(&BTreeMap::new()).0,
        Item::Activators(id, _) => {
            let _ = model.activators_applied(id, None);
            Vec::new()
        }
    }
}

/// A (re)list of one kind: `{"kind":"RevisionList","items":[...]}` and so on.
fn listed(model: &mut Model, told: &mut Told, list: &Value) -> Vec<Op> {
    let items: Vec<Item> = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(read)
        .collect();
    match list["kind"].as_str() {
        Some("RevisionList") => {
            let objects: Vec<Value> = items
                .into_iter()
                .filter_map(|item| match item {
                    Item::Revision(object) => Some(object),
                    _ => None,
                })
                .collect();
            let (ops, _) = model.revisions_listed(&objects);
            told.revisions = objects
                .into_iter()
                .filter_map(|object| Some((objects::revision_spec(&object).ok()?.key, object)))
                .collect();
            ops
        }
        Some("EndpointsList" | "EndpointSliceList") => {
            let all: Vec<(ObjectId, EndpointsSeen)> = items
                .into_iter()
                .filter_map(|item| match item {
                    Item::Endpoints(id, seen) => Some((id, seen?)),
                    _ => None,
                })
                .collect();
            told.endpoints = all.iter().cloned().collect();
            model.endpoints_listed(all)
        }
        Some("ServiceList") => model.services_listed(
            items
                .into_iter()
                .filter_map(|item| match item {
                    Item::Service(revision, address) => Some((revision?, address?)),
                    _ => None,
                })
                .collect(),
        ),
        _ => Vec::new(),
    }
}

/// The ops the model emits name revisions it holds, or remove one it held.
fn check_ops(ops: &[Op], told: &Told) {
    for op in ops {
        if let Op::UpsertRevision(spec) = op {
            assert!(
                told.revisions.contains_key(&spec.key),
                "upserted {} that is not there",
                spec.key
            );
        }
    }
}
