//! KEDA's HTTP add-on role: HTTPScaledObjects, InterceptorRoutes, Services and EndpointSlices
//! as the API server
//! sends them, through the role's model (`keda::model`: objects → state-worker ops) and the
//! state worker's core, and then requests as clients send them, routed by the rules the shards
//! would be given (`routing::rules`, what every request of the role goes through).
//!
//! Input: one JSON line per event. `{"type":"ADDED"|"MODIFIED"|"DELETED","object":{...}}` with
//! `kind` `HTTPScaledObject`, `InterceptorRoute`, `Service`, `EndpointSlice` or `ConfigMap`; `{"type":"REQUEST","authority":"...",
//! "target":"...","headers":[["name","value"],...]}` a request (its strings' bytes as a client
//! sends them).
//!
//! Beyond "no panic": the model sends only what changed (asking again right away gives no op),
//! every revision it upserts is one of the objects it was last told of, or such an object's
//! failover, and its ops apply to the state worker's core; a routed request's route is a
//! declared revision with rules, and its placeholder, if it has one, answers the request's
//! path (`routing::placeholder`) with the declared status or the add-on's 500.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kactivator_api::RevisionKey;
use kactivator_control::keda::model::{Defaults, Model, FAILOVER_SUFFIX};
use kactivator_control::keda::object::ObjectKind;
use kactivator_control::pod_state::{Gates, Timestamp};
use kactivator_control::state::{ControlState, Limits, Op};
use kactivator_shards::routing::placeholder::Placeholder;
use kactivator_shards::routing::rules::RuleTable;
use kactivator_shards::throttle::gate::ProcessQueue;
use serde_json::Value;

/// Feed arbitrary bytes as watch events and requests.
pub fn keda_http(data: &[u8]) {
    let mut model = Model::new(Defaults::default());
    let mut state = ControlState::new(
        2,
        Gates::default(),
        Limits::default(),
        Arc::new(ProcessQueue::new(ProcessQueue::UNLIMITED)),
    );
    let now = Timestamp::from_epoch_offset(std::time::Duration::from_secs(1));
    let mut objects: BTreeSet<(ObjectKind, String, String)> = BTreeSet::new();
    let mut table: RuleTable<RevisionKey> = RuleTable::default();
    let mut routed: BTreeMap<RevisionKey, Option<Arc<Placeholder>>> = BTreeMap::new();
    for line in data.split(|&byte| byte == b'\n') {
        let Ok(event) = serde_json::from_slice::<Value>(line) else {
            continue;
        };
        let object = &event["object"];
        let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let present = match event["type"].as_str() {
            Some("ADDED" | "MODIFIED") => Some(object),
            Some("DELETED") => None,
            Some("REQUEST") => {
                request(&table, &routed, &event);
                continue;
            }
            _ => continue,
        };
        let kind = match object["kind"].as_str() {
            Some("HTTPScaledObject") => Some(ObjectKind::HttpScaledObject),
            Some("InterceptorRoute") => Some(ObjectKind::InterceptorRoute),
            _ => None,
        };
        match (kind, object["kind"].as_str()) {
            (Some(kind), _) => {
                model.object(kind, namespace, name, present);
                let id = (kind, namespace.to_owned(), name.to_owned());
                if present.is_some() {
                    objects.insert(id);
                } else {
                    objects.remove(&id);
                }
            }
            (None, Some("Service")) => model.service(namespace, name, present),
            (None, Some("EndpointSlice")) => model.slice(namespace, name, present),
            (None, Some("ConfigMap")) => model.config_map(namespace, name, present),
            _ => continue,
        }
        let (ops, _refusals) = model.ops();
        let (again, _) = model.ops();
        assert!(again.is_empty(), "nothing changed, yet {again:?}");
        for op in &ops {
            if let Op::UpsertRevision(spec) = op {
                let name = spec.key.name();
                let object = name.strip_suffix(FAILOVER_SUFFIX).unwrap_or(name);
                let namespace = spec.key.namespace().to_owned();
                assert!(
                    objects.iter().any(|(_, told_namespace, told_name)| {
                        *told_namespace == namespace && told_name == object
                    }),
                    "{} upserted, but no such object",
                    spec.key
                );
                assert_eq!(spec.rules.is_some(), !name.ends_with(FAILOVER_SUFFIX));
            }
        }
        let _ = state.apply(Op::Batch(ops), now);
        // The rules the shards would be given: every declared revision's.
        let revisions = model.revisions();
        let specs = model.specs();
        table = RuleTable::build(specs.iter().filter_map(|spec| {
            let rules = spec.rules.as_deref()?;
            Some((spec.key.clone(), rules.order.clone(), &rules.rules[..]))
        }));
        routed = specs
            .iter()
            .filter(|spec| spec.rules.is_some())
            .map(|spec| {
                let placeholder = spec
                    .cold_start
                    .as_ref()
                    .and_then(|cold| cold.placeholder.clone());
                (spec.key.clone(), placeholder)
            })
            .collect();
        assert!(routed.keys().all(|key| revisions.contains(key)));
    }
}

/// Routes one request; a route found is a declared revision with rules, and its placeholder
/// answers it.
fn request(
    table: &RuleTable<RevisionKey>,
    routed: &BTreeMap<RevisionKey, Option<Arc<Placeholder>>>,
    event: &Value,
) {
    let authority = event["authority"].as_str().unwrap_or_default();
    let target = event["target"].as_str().unwrap_or("/");
    let headers: Vec<(String, String)> = event["headers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|pair| {
            Some((
                pair[0].as_str()?.to_owned(),
                pair[1].as_str()?.to_owned(),
            ))
        })
        .collect();
    let fields: Vec<(&str, &str)> = headers
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_str()))
        .collect();
    if let Some(key) = table.route(authority.as_bytes(), target.as_bytes(), &fields[..]) {
        let placeholder = routed
            .get(key)
            .unwrap_or_else(|| panic!("{key} is routed to but has no rules"));
        if let Some(placeholder) = placeholder {
            match placeholder.respond(target.as_bytes()) {
                Ok(response) => assert_eq!(response.status, placeholder.status),
                Err(why) => assert!(!why.0.is_empty()),
            }
        }
    }
}
