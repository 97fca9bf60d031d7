//! The cluster as the Kubernetes source has seen it, and the ops each change makes: one watch
//! event in, the state worker's ops out. Sans-IO, so every rule (relists apply only the
//! difference, a revision's slices are merged, a Service address joins the spec in mesh mode)
//! is tested without a server.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use kactivator_api::RevisionKey;
use serde_json::Value;

use super::backends::{Backends, MeshMode, Outcome, ProbeJob, Target};
use super::objects::{self, Addresses, ServiceType, SERVICE_TYPE_LABEL};
use crate::features::{self, Tunables};
use crate::pod_state::Gates;
use crate::state::{Op, RevisionSpec};

/// An endpoints object (Endpoints or EndpointSlice) by namespace and name.
pub type ObjectId = (String, String);

/// Whose endpoints: a revision's private ones (its pods) or public ones (its activators).
type Owner = (RevisionKey, ServiceType);

/// One endpoints object as seen: whose it is and what it lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointsSeen {
    pub revision: RevisionKey,
    pub kind: ServiceType,
    pub addresses: Addresses,
}

/// A Revision as its object says.
#[derive(Clone, Debug, PartialEq, Eq)]
struct RevisionSeen {
    /// Without the Service address and the cluster-wide tunables.
    spec: RevisionSpec,
    /// The object chose its load-balancing policy (else the tunable default applies).
    policy_chosen: bool,
}

/// What the source knows.
pub struct Model {
    revisions: BTreeMap<RevisionKey, RevisionSeen>,
    /// Each revision's private Service address.
    services: BTreeMap<RevisionKey, SocketAddr>,
    endpoints: BTreeMap<ObjectId, EndpointsSeen>,
    /// `endpoints` by owner, so one event reads its revision's objects, not every object.
    owned: BTreeMap<Owner, BTreeSet<ObjectId>>,
    /// The private pods and what the probes said of them.
    backends: Backends,
    /// `activator-service`'s endpoints objects (one Endpoints, or its slices), and the peers
    /// they make: every ready activator but this one, at its data port.
    activator_endpoints: BTreeMap<ObjectId, Addresses>,
    peers: Vec<SocketAddr>,
    mesh: MeshMode,
    pod_ip: Option<IpAddr>,
    gates: Gates,
    /// `config-features`' `activator.*` tunables now, and their defaults (absent keys).
    tunables: Tunables,
    default_tunables: Tunables,
}

impl Model {
    pub fn new(mesh: MeshMode, pod_ip: Option<IpAddr>, gates: Gates, tunables: Tunables) -> Model {
        Model {
            revisions: BTreeMap::new(),
            services: BTreeMap::new(),
            endpoints: BTreeMap::new(),
            owned: BTreeMap::new(),
            backends: Backends::new(mesh),
            activator_endpoints: BTreeMap::new(),
            peers: Vec::new(),
            mesh,
            pod_ip,
            gates,
            tunables,
            default_tunables: tunables,
        }
    }

    pub fn tunables(&self) -> &Tunables {
        &self.tunables
    }

    pub fn gates(&self) -> Gates {
        self.gates
    }

    /// Revisions the backend prober remembers.
    #[cfg(test)]
    fn backend_revisions(&self) -> usize {
        self.backends.revision_count()
    }

    /// Listed pods not vouched for yet.
    pub fn pending_pods(&self) -> usize {
        self.backends.pending()
    }

    pub fn revision_count(&self) -> usize {
        self.revisions.len()
    }

    pub fn endpoints_count(&self) -> usize {
        self.endpoints.len()
    }

    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    /// The spec the state worker gets: the Revision's, with the cluster-wide tunables (queue
    /// depth, and the policy when the Revision chose none) and its Service's address in mesh
    /// mode.
    fn routed_spec(&self, seen: &RevisionSeen) -> RevisionSpec {
        let mut routed = seen.spec.clone();
        routed.queue_depth = self.tunables.queue_depth;
        if !seen.policy_chosen {
            if let Some(policy) = self.tunables.lb_policy {
                routed.lb_policy = policy;
            }
        }
        if self.through_service(&seen.spec.key) {
            routed.cluster_ip = self.services.get(&seen.spec.key).copied();
        }
        routed
    }

    /// The revision goes through its private Service: mesh mode `enabled`, or `auto` after its
    /// pods proved unreachable directly.
    fn through_service(&self, revision: &RevisionKey) -> bool {
        self.mesh == MeshMode::Enabled || self.backends.via_service(revision)
    }

    /// Reads a Revision object.
    fn read_revision(&mut self, object: &Value) -> Result<RevisionSeen, String> {
        let spec = objects::revision_spec(object)?;
        self.backends
            .set_optimisation(&spec.key, objects::probe_optimisation(object));
        self.backends.set_protocol(&spec.key, spec.protocol);
        Ok(RevisionSeen {
            policy_chosen: objects::chosen_lb_policy(object).is_some(),
            spec,
        })
    }

    // === Revisions ===

    /// A Revision was added or changed. An object that cannot route (a missing name, a bad
    /// field) is reported and changes nothing.
    pub fn revision_applied(&mut self, object: &Value) -> Result<Vec<Op>, String> {
        let seen = self.read_revision(object)?;
        if self.revisions.get(&seen.spec.key) == Some(&seen) {
            return Ok(Vec::new());
        }
        let op = Op::UpsertRevision(self.routed_spec(&seen));
        self.revisions.insert(seen.spec.key.clone(), seen);
        Ok(vec![op])
    }

    pub fn revision_deleted(&mut self, revision: &RevisionKey) -> Vec<Op> {
        // Its pods are no longer probed (upstream's revision watcher ends with the revision).
        self.backends.remove(revision);
        match self.revisions.remove(revision) {
            Some(_) => vec![Op::RemoveRevision {
                revision: revision.clone(),
            }],
            None => Vec::new(),
        }
    }

    /// The watch (re)listed every Revision: those it no longer has are removed, the rest
    /// applied (unchanged ones are no-ops). Objects that cannot route are returned as errors.
    pub fn revisions_listed(&mut self, objects: &[Value]) -> (Vec<Op>, Vec<String>) {
        let mut ops = Vec::new();
        let mut errors = Vec::new();
        let mut listed = BTreeSet::new();
        for object in objects {
            match self.read_revision(object) {
                Ok(seen) => {
                    listed.insert(seen.spec.key.clone());
                    if self.revisions.get(&seen.spec.key) != Some(&seen) {
                        ops.push(Op::UpsertRevision(self.routed_spec(&seen)));
                        self.revisions.insert(seen.spec.key.clone(), seen);
                    }
                }
                Err(error) => errors.push(error),
            }
        }
        let gone: Vec<RevisionKey> = self
            .revisions
            .keys()
            .filter(|key| !listed.contains(*key))
            .cloned()
            .collect();
        for revision in gone {
            ops.extend(self.revision_deleted(&revision));
        }
        (ops, errors)
    }

    // === Endpoints (private: the pods; public: the activators) ===

    pub fn endpoints_applied(&mut self, id: ObjectId, seen: EndpointsSeen) -> Vec<Op> {
        let key = (seen.revision.clone(), seen.kind);
        self.owned
            .entry(key.clone())
            .or_default()
            .insert(id.clone());
        let previous = self.endpoints.insert(id.clone(), seen);
        let mut ops = self.endpoints_ops(&key);
        if let Some(previous) = previous {
            let before = (previous.revision, previous.kind);
            if before != key {
                self.disown(&before, &id);
                ops.extend(self.endpoints_ops(&before));
            }
        }
        ops
    }

    pub fn endpoints_deleted(&mut self, id: &ObjectId) -> Vec<Op> {
        match self.endpoints.remove(id) {
            Some(seen) => {
                let owner = (seen.revision, seen.kind);
                self.disown(&owner, id);
                self.endpoints_ops(&owner)
            }
            None => Vec::new(),
        }
    }

    fn disown(&mut self, owner: &Owner, id: &ObjectId) {
        if let Some(ids) = self.owned.get_mut(owner) {
            ids.remove(id);
            if ids.is_empty() {
                self.owned.remove(owner);
            }
        }
    }

    /// The watch (re)listed every endpoints object: only the owners of objects that changed,
    /// appeared or went away are recomputed, once each.
    pub fn endpoints_listed(&mut self, all: Vec<(ObjectId, EndpointsSeen)>) -> Vec<Op> {
        let listed: BTreeMap<ObjectId, EndpointsSeen> = all.into_iter().collect();
        let changed: BTreeSet<Owner> = listed
            .iter()
            .filter(|(id, seen)| self.endpoints.get(*id) != Some(*seen))
            .map(|(_, seen)| (seen.revision.clone(), seen.kind))
            .chain(
                self.endpoints
                    .iter()
                    .filter(|(id, _)| !listed.contains_key(*id))
                    .map(|(_, seen)| (seen.revision.clone(), seen.kind)),
            )
            .collect();
        self.owned.clear();
        for (id, seen) in &listed {
            self.owned
                .entry((seen.revision.clone(), seen.kind))
                .or_default()
                .insert(id.clone());
        }
        self.endpoints = listed;
        changed
            .iter()
            .flat_map(|key| self.endpoints_ops(key))
            .collect()
    }

    /// The op that says what a revision's endpoints of one kind list now, merged over every
    /// object (a Service has several EndpointSlices).
    fn endpoints_ops(&mut self, owner: &Owner) -> Vec<Op> {
        let (revision, kind) = owner;
        let mut merged = Addresses::default();
        for id in self.owned.get(owner).into_iter().flatten() {
            if let Some(seen) = self.endpoints.get(id) {
                merged.merge(&seen.addresses);
            }
        }
        match kind {
            // The pods the source vouches for (probed, or trusted): one it does not list is
            // omitted.
            ServiceType::Private => {
                let op = self.backends.listed(revision, merged);
                if !self.revisions.contains_key(revision) && !self.owned.contains_key(owner) {
                    // Neither the Revision nor any of its private endpoints is left (they went
                    // in either order): the prober forgets it, after `op` took back what was
                    // sent for its pods.
                    self.backends.remove(revision);
                }
                op.into_iter().collect()
            }
            // Upstream: when this activator is not among them, it keeps what it had.
            ServiceType::Public => objects::public_activators(&merged, self.pod_ip)
                .map(|activators| Op::SetRevisionActivators {
                    revision: revision.clone(),
                    activators: Some(activators),
                })
                .into_iter()
                .collect(),
        }
    }

    // === Private Services ===

    pub fn service_applied(
        &mut self,
        revision: RevisionKey,
        address: Option<SocketAddr>,
    ) -> Vec<Op> {
        let changed = match address {
            Some(address) => self.services.insert(revision.clone(), address) != Some(address),
            None => self.services.remove(&revision).is_some(),
        };
        if changed {
            self.reroute(&revision)
        } else {
            Vec::new()
        }
    }

    pub fn services_listed(&mut self, all: Vec<(RevisionKey, SocketAddr)>) -> Vec<Op> {
        let listed: BTreeMap<RevisionKey, SocketAddr> = all.into_iter().collect();
        let affected: BTreeSet<RevisionKey> = listed
            .iter()
            .filter(|(key, address)| self.services.get(*key) != Some(*address))
            .map(|(key, _)| key.clone())
            .chain(
                self.services
                    .keys()
                    .filter(|key| !listed.contains_key(*key))
                    .cloned(),
            )
            .collect();
        self.services = listed;
        affected.iter().flat_map(|key| self.reroute(key)).collect()
    }

    /// A Service address changed: through the Service, the revision's spec changes with it.
    fn reroute(&self, revision: &RevisionKey) -> Vec<Op> {
        if !self.through_service(revision) {
            return Vec::new();
        }
        self.revisions
            .get(revision)
            .map(|seen| Op::UpsertRevision(self.routed_spec(seen)))
            .into_iter()
            .collect()
    }

    // === activator-service: the peers registrations are relayed to ===

    /// `activator-service`'s endpoints were listed. Returns the peers when they changed.
    pub fn activators_listed(
        &mut self,
        all: Vec<(ObjectId, Addresses)>,
    ) -> Option<Vec<SocketAddr>> {
        self.activator_endpoints = all.into_iter().collect();
        self.repeer()
    }

    /// One of `activator-service`'s endpoints objects changed (`None`: deleted).
    pub fn activators_applied(
        &mut self,
        id: ObjectId,
        addresses: Option<Addresses>,
    ) -> Option<Vec<SocketAddr>> {
        match addresses {
            Some(addresses) => self.activator_endpoints.insert(id, addresses),
            None => self.activator_endpoints.remove(&id),
        };
        self.repeer()
    }

    /// The peers now: every ready activator address but this activator's own (`POD_IP`).
    fn repeer(&mut self) -> Option<Vec<SocketAddr>> {
        let peers: Vec<SocketAddr> = self
            .activator_endpoints
            .values()
            .flat_map(|addresses| addresses.ready.iter().copied())
            .filter(|addr| Some(addr.ip()) != self.pod_ip)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        (peers != self.peers).then(|| {
            self.peers = peers.clone();
            peers
        })
    }

    // === config-features ===

    /// `config-features` says `data` (empty when deleted): the gates, hot, through the same
    /// rules as the file's `[features]`. Returns the ops (for what changed) and the warnings.
    /// The tunables change too (see [`Model::tunables`]): revisions whose spec they change are
    /// upserted again, and a new `activator.max-queued-requests` is an
    /// [`Op::SetMaxQueuedRequests`].
    pub fn features(&mut self, data: &BTreeMap<String, String>) -> (Vec<Op>, Vec<String>) {
        let (gates, mut warnings) = features::resolve(data, self.gates);
        let (tunables, tunable_warnings) =
            features::resolve_tunables(data, &self.default_tunables, &self.tunables);
        warnings.extend(tunable_warnings);
        let mut ops = Vec::new();
        if gates != self.gates {
            self.gates = gates;
            ops.push(Op::SetGates(gates));
        }
        if tunables.max_queued_requests != self.tunables.max_queued_requests {
            ops.push(Op::SetMaxQueuedRequests(tunables.max_queued_requests));
        }
        let respec = tunables.queue_depth != self.tunables.queue_depth
            || tunables.lb_policy != self.tunables.lb_policy;
        self.tunables = tunables;
        if respec {
            ops.extend(
                self.revisions
                    .values()
                    .map(|seen| Op::UpsertRevision(self.routed_spec(seen))),
            );
        }
        (ops, warnings)
    }

    // === Backend probes ===

    /// The probes to start now (after any change, and on every probe-interval tick).
    pub fn probes_due(&mut self, tick: bool) -> Vec<ProbeJob> {
        self.backends.due(tick, &self.services)
    }

    /// A probe finished; the ops when it promoted a pod, or moved the revision to its Service
    /// (its spec first, so the state worker never counts the pods as directly routable).
    pub fn probed(&mut self, job: &ProbeJob, mut outcome: Outcome) -> Vec<Op> {
        if job.target == Target::Service && self.services.get(&job.revision) != Some(&job.addr) {
            // The Service moved or went away while it was probed: try again at the next tick.
            outcome = Outcome::Skipped;
        }
        let before = self.backends.via_service(&job.revision);
        let endpoints = self.backends.probed(job, outcome);
        let mut ops = Vec::new();
        if !before && self.backends.via_service(&job.revision) {
            tracing::info!(
                revision = %job.revision,
                service = %job.addr,
                "pods not reachable directly (every probe failed as behind a mesh) and the \
                 private Service answered: the revision goes through the Service"
            );
            ops.extend(self.reroute(&job.revision));
        }
        ops.extend(endpoints);
        ops
    }
}

// === EndpointSlices nothing mirrors ===

/// How often, at most, the source looks for labelled core/v1 Endpoints while it watches
/// EndpointSlices and sees none.
pub const MISSING_SLICES_CHECK_EVERY: Duration = Duration::from_secs(30);

/// Whether a cluster lists Knative's pods only in core/v1 Endpoints while kactivator watches
/// EndpointSlices (`kubernetes.endpoints = "auto"` on a server that serves EndpointSlices
/// where nothing mirrors Endpoints into them, such as one without the mirroring controller):
/// then every revision has zero pods. The evidence is revisions known and not one labelled
/// slice seen; when it holds the shell lists the labelled Endpoints (at most every
/// [`MISSING_SLICES_CHECK_EVERY`]), and if there are some, the warning is said, once.
#[derive(Debug, Default)]
pub struct MissingSlices {
    last_look: Option<Instant>,
    looking: bool,
    warned: bool,
}

impl MissingSlices {
    /// Whether to look for labelled Endpoints now, given the revisions and the labelled slices
    /// the source holds. A `true` must be answered with [`MissingSlices::looked`].
    pub fn due(&mut self, now: Instant, revisions: usize, slices: usize) -> bool {
        let due = !self.warned
            && !self.looking
            && revisions > 0
            && slices == 0
            && self.last_look.is_none_or(|last| {
                now.saturating_duration_since(last) >= MISSING_SLICES_CHECK_EVERY
            });
        if due {
            self.looking = true;
            self.last_look = Some(now);
        }
        due
    }

    /// The look found `endpoints` labelled Endpoints objects (`None`: the list failed) while
    /// `revisions` are known and `slices` labelled slices of `api` are held. Returns the
    /// warning, the first time the evidence is there.
    pub fn looked(
        &mut self,
        endpoints: Option<usize>,
        revisions: usize,
        slices: usize,
        api: &str,
    ) -> Option<String> {
        self.looking = false;
        if self.warned || endpoints.unwrap_or(0) == 0 || slices > 0 || revisions == 0 {
            return None;
        }
        self.warned = true;
        Some(format!(
            "kubernetes.endpoints: watching {api}, but none is labelled \
             {SERVICE_TYPE_LABEL} while {revisions} revision(s) are known and core/v1 Endpoints \
             with that label exist: nothing mirrors Knative's Endpoints into EndpointSlices on \
             this cluster, so no revision has a pod. Set endpoints = \"endpoints\" in the \
             [kubernetes] table of the --config file to read the Endpoints"
        ))
    }
}

#[cfg(test)]
mod tests {
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
        chose["metadata"]["annotations"] =
            json!({objects::LB_POLICY_ANNOTATION: "least-connections"});
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
}
