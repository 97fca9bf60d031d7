//! The control thread's routing table: the truth the shards' replicas follow.
//!
//! Applying a new desired state yields the per-revision updates to publish, each with the next
//! version. Pod trackers are reused by address so in-flight counts carry over, and a revision
//! whose route did not change produces no update at all.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;

use kactivator_shards::routing::{
    revision_key, LbPolicy, PodTracker, Protocol, RevisionLabels, RevisionRoute, RoutingUpdate,
    Timeouts,
};
use kactivator_shards::throttle::gate::RevisionGate;
use kactivator_shards::throttle::slots::UNLIMITED;

/// What a revision should look like, from any source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredRevision {
    pub labels: RevisionLabels,
    pub container_concurrency: u32,
    pub protocol: Protocol,
    pub timeouts: Timeouts,
    pub lb_policy: LbPolicy,
    /// Most requests that may wait for the revision.
    pub queue_depth: u32,
    /// Routable pods.
    pub pods: Vec<SocketAddr>,
}

impl DesiredRevision {
    pub fn key(&self) -> String {
        revision_key(&self.labels.namespace, &self.labels.revision)
    }
}

struct Entry {
    desired: DesiredRevision,
    trackers: HashMap<SocketAddr, Arc<PodTracker>>,
    gate: Arc<RevisionGate>,
}

/// All revisions and the last version published.
pub struct RoutingTable {
    revisions: BTreeMap<String, Entry>,
    version: u64,
    /// Shards, for each revision's admission gate.
    shards: usize,
}

impl RoutingTable {
    pub fn new(shards: usize) -> RoutingTable {
        RoutingTable {
            revisions: BTreeMap::new(),
            version: 0,
            shards,
        }
    }

    pub fn len(&self) -> usize {
        self.revisions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.revisions.is_empty()
    }

    /// Makes the table equal to `desired` (the complete set) and returns the updates to publish.
    pub fn replace_all(&mut self, desired: Vec<DesiredRevision>) -> Vec<RoutingUpdate> {
        let mut wanted: BTreeMap<String, DesiredRevision> =
            desired.into_iter().map(|d| (d.key(), d)).collect();
        let mut updates = Vec::new();
        let gone: Vec<String> = self
            .revisions
            .keys()
            .filter(|key| !wanted.contains_key(*key))
            .cloned()
            .collect();
        for key in gone {
            self.revisions.remove(&key);
            self.version += 1;
            updates.push(RoutingUpdate::Remove {
                version: self.version,
                key: key.into(),
            });
        }
        for (key, desired) in std::mem::take(&mut wanted) {
            if let Some(update) = self.upsert(key, desired) {
                updates.push(update);
            }
        }
        updates
    }

    /// Sets one revision; `None` if nothing changed.
    pub fn upsert(&mut self, key: String, desired: DesiredRevision) -> Option<RoutingUpdate> {
        let mut pods = desired.pods.clone();
        pods.sort();
        pods.dedup();
        if self
            .revisions
            .get(&key)
            .is_some_and(|entry| entry.desired == desired)
        {
            return None;
        }
        let shards = self.shards;
        let entry = self.revisions.entry(key.clone()).or_insert_with(|| Entry {
            desired: desired.clone(),
            trackers: HashMap::new(),
            gate: Arc::new(RevisionGate::new(shards)),
        });
        // Standalone, this activator is the only one: it may use each pod's whole
        // containerConcurrency (subsetting applies once activator replicas are known).
        let capacity = match desired.container_concurrency {
            0 => UNLIMITED,
            limit => limit,
        };
        // Reuse trackers by address: a pod's in-flight count must survive every version.
        let mut trackers = HashMap::with_capacity(pods.len());
        for addr in &pods {
            let tracker = entry
                .trackers
                .get(addr)
                .cloned()
                .unwrap_or_else(|| Arc::new(PodTracker::new(*addr, capacity)));
            tracker.slots.set_capacity(capacity);
            trackers.insert(*addr, tracker);
        }
        let route = RevisionRoute {
            key: key.into(),
            labels: desired.labels.clone(),
            container_concurrency: desired.container_concurrency,
            protocol: desired.protocol,
            timeouts: desired.timeouts,
            lb_policy: desired.lb_policy,
            pods: pods.iter().map(|addr| trackers[addr].clone()).collect(),
            gate: entry.gate.clone(),
            queue_depth: desired.queue_depth,
        };
        entry.desired = desired;
        entry.trackers = trackers;
        self.version += 1;
        Some(RoutingUpdate::Upsert {
            version: self.version,
            route: Arc::new(route),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn revision(name: &str, pods: &[&str]) -> DesiredRevision {
        DesiredRevision {
            labels: RevisionLabels {
                namespace: "default".into(),
                revision: name.into(),
                ..Default::default()
            },
            container_concurrency: 0,
            protocol: Protocol::Http1,
            timeouts: Timeouts::default(),
            lb_policy: LbPolicy::RoundRobin,
            queue_depth: 100,
            pods: pods.iter().map(|p| p.parse().unwrap()).collect(),
        }
    }

    fn tracker_of(update: &RoutingUpdate, addr: &str) -> Arc<PodTracker> {
        let RoutingUpdate::Upsert { route, .. } = update else {
            panic!("expected an upsert")
        };
        route
            .pods
            .iter()
            .find(|tracker| tracker.addr == addr.parse().unwrap())
            .unwrap()
            .clone()
    }

    #[test]
    fn versions_increase_and_unchanged_revisions_publish_nothing() {
        let mut table = RoutingTable::new(2);
        let first = table.replace_all(vec![
            revision("a", &["10.0.0.1:8012"]),
            revision("b", &["10.0.0.2:8012"]),
        ]);
        assert_eq!(
            first.iter().map(RoutingUpdate::version).collect::<Vec<_>>(),
            vec![1, 2]
        );
        let again = table.replace_all(vec![
            revision("a", &["10.0.0.1:8012"]),
            revision("b", &["10.0.0.2:8012"]),
        ]);
        assert!(again.is_empty());
        let removed = table.replace_all(vec![revision("a", &["10.0.0.1:8012"])]);
        assert!(
            matches!(&removed[..], [RoutingUpdate::Remove { version: 3, key }] if &**key == "default/b")
        );
    }

    #[test]
    fn trackers_survive_new_versions_by_address() {
        let mut table = RoutingTable::new(2);
        let first = table.replace_all(vec![revision("a", &["10.0.0.1:8012"])]);
        let kept = tracker_of(&first[0], "10.0.0.1:8012");
        let second = table.replace_all(vec![revision("a", &["10.0.0.1:8012", "10.0.0.9:8012"])]);
        assert!(Arc::ptr_eq(&kept, &tracker_of(&second[0], "10.0.0.1:8012")));
        let RoutingUpdate::Upsert { route, .. } = &second[0] else {
            unreachable!()
        };
        assert_eq!(route.pods.len(), 2);
    }

    #[test]
    fn a_revision_with_no_pods_is_still_published() {
        let mut table = RoutingTable::new(2);
        let updates = table.replace_all(vec![revision("cold", &[])]);
        let RoutingUpdate::Upsert { route, .. } = &updates[0] else {
            panic!()
        };
        assert!(route.pods.is_empty());
    }
}
