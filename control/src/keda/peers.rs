//! The other replicas of the role, whose counts the scaler sums with its own: the ready
//! endpoints of the interceptors' admin Service, as the add-on's scaler finds its interceptors
//! (`scaler/queue_pinger.go`: the EndpointSlices of `KEDA_HTTP_SCALER_TARGET_ADMIN_SERVICE` in
//! `KEDA_HTTP_SCALER_TARGET_ADMIN_NAMESPACE`, each ready address at
//! `KEDA_HTTP_SCALER_TARGET_ADMIN_PORT`), this replica (`POD_IP`) left out.
//!
//! The same replicas share every route's pods (★): they are the state worker's activators
//! (`Op::SetActivators`), so each pod's per-pod limit is split among them by the activator
//! role's subsetting, and the limit holds across replicas as it does across shards.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use futures_util::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Client;
use serde_json::Value;
use tokio::sync::watch;

use super::model::SLICE_SERVICE_LABEL;
use crate::sources::kubernetes::backoff::WatchBackoff;
use crate::state::{Activators, Op};
use crate::worker::WorkerHandle;

/// Where the other replicas are listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerService {
    pub namespace: String,
    pub service: String,
    /// Every replica's admin port.
    pub port: u16,
    /// This replica's address, left out.
    pub me: Option<IpAddr>,
}

/// The ready addresses of `slices` (by name) at `port`, `me` left out, sorted.
pub fn peers_of(
    slices: &BTreeMap<String, Value>,
    port: u16,
    me: Option<IpAddr>,
) -> Vec<SocketAddr> {
    let mut peers: Vec<SocketAddr> = slices
        .values()
        .flat_map(|slice| slice["endpoints"].as_array().into_iter().flatten())
        .filter(|endpoint| endpoint["conditions"]["ready"].as_bool().unwrap_or(true))
        .flat_map(|endpoint| endpoint["addresses"].as_array().into_iter().flatten())
        .filter_map(|address| address.as_str()?.parse::<IpAddr>().ok())
        .filter(|ip| Some(*ip) != me)
        .map(|ip| SocketAddr::new(ip, port))
        .collect();
    peers.sort();
    peers.dedup();
    peers
}

/// The replicas as the state worker's activators: this one (`me`) and the others.
pub fn activators_of(peers: &[SocketAddr], me: IpAddr) -> Activators {
    let mut all: Vec<IpAddr> = peers.iter().map(SocketAddr::ip).collect();
    all.push(me);
    all.sort();
    all.dedup();
    Activators { me: Some(me), all }
}

/// Watches the admin Service's EndpointSlices (`slices_version`: `v1` or `v1beta1`) and keeps
/// `peers` current until the process ends; with this replica's address known, the worker is
/// told the replicas, which share the pods.
pub async fn watch_peers(
    client: Client,
    slices_version: &'static str,
    service: PeerService,
    peers: watch::Sender<Vec<SocketAddr>>,
    worker: WorkerHandle,
) {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("discovery.k8s.io", slices_version, "EndpointSlice"),
        "endpointslices",
    );
    let api = Api::<DynamicObject>::namespaced_with(client, &service.namespace, &resource);
    let config =
        watcher::Config::default().labels(&format!("{SLICE_SERVICE_LABEL}={}", service.service));
    let mut events = watcher::watcher(api, config)
        .backoff(WatchBackoff::new())
        .boxed();
    let mut slices: BTreeMap<String, Value> = BTreeMap::new();
    let mut listing: Option<BTreeMap<String, Value>> = None;
    while let Some(event) = events.next().await {
        let name = |object: &DynamicObject| object.metadata.name.clone().unwrap_or_default();
        let value = |object: DynamicObject| serde_json::to_value(object).unwrap_or(Value::Null);
        match event {
            Ok(Event::Init) => listing = Some(BTreeMap::new()),
            Ok(Event::InitApply(object)) => {
                let key = name(&object);
                listing.get_or_insert_default().insert(key, value(object));
                continue;
            }
            Ok(Event::InitDone) => slices = listing.take().unwrap_or_default(),
            Ok(Event::Apply(object)) => {
                slices.insert(name(&object), value(object));
            }
            Ok(Event::Delete(object)) => {
                slices.remove(&name(&object));
            }
            Err(error) => {
                tracing::warn!(
                    "keda-http: watching the replicas in {}/{}: {error}",
                    service.namespace,
                    service.service
                );
                continue;
            }
        }
        let now = peers_of(&slices, service.port, service.me);
        let changed = peers.send_if_modified(|current| {
            let changed = *current != now;
            if changed {
                tracing::info!(peers = ?now, "keda-http: the other replicas");
                *current = now.clone();
            }
            changed
        });
        if let (true, Some(me)) = (changed, service.me) {
            let activators = activators_of(&now, me);
            if let Err(error) = worker.apply(Op::SetActivators(activators)).await {
                tracing::error!("keda-http: the state worker refused the replicas: {error}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_ready_replicas_but_this_one_at_the_admin_port() {
        let slices = BTreeMap::from([
            (
                "a".to_string(),
                json!({"endpoints": [
                    {"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
                    {"addresses": ["10.0.0.2"], "conditions": {"ready": false}},
                    {"addresses": ["10.0.0.3"]},
                ]}),
            ),
            (
                "b".to_string(),
                json!({"endpoints": [{"addresses": ["10.0.0.4", "not an ip"]}]}),
            ),
        ]);
        let me = Some("10.0.0.3".parse().unwrap());
        let peers = peers_of(&slices, 9090, me);
        let expected: Vec<SocketAddr> = vec![
            "10.0.0.1:9090".parse().unwrap(),
            "10.0.0.4:9090".parse().unwrap(),
        ];
        assert_eq!(peers, expected);
        let activators = activators_of(&peers, "10.0.0.3".parse().unwrap());
        assert_eq!(activators.me, me);
        assert_eq!(activators.all.len(), 3, "the others and this one");
    }
}
