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
use super::internal_tls::{self, InternalTls, Served};
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
    /// With `system-internal-tls`: the served certificate and the trust for pods.
    internal_tls: Option<InternalTls>,
}

/// What a TLS object changed: the ops (every revision's spec again when the trust changed),
/// what the TLS data port serves, and problems to log.
pub struct TlsChanged {
    pub ops: Vec<Op>,
    pub served: Served,
    pub warnings: Vec<String>,
}

impl TlsChanged {
    fn none() -> TlsChanged {
        TlsChanged {
            ops: Vec::new(),
            served: Served::Unchanged,
            warnings: Vec::new(),
        }
    }
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
            internal_tls: None,
        }
    }

    /// Pods are dialled over TLS as `tls` says, which also serves the TLS data port.
    pub fn with_internal_tls(mut self, tls: InternalTls) -> Model {
        self.internal_tls = Some(tls);
        self
    }

    /// With `system-internal-tls`, whether a certificate is served.
    pub fn tls_serving(&self) -> Option<bool> {
        self.internal_tls.as_ref().map(InternalTls::serving)
    }

    /// The `routing-serving-certs` Secret as listed or changed (`None`: deleted or absent).
    pub fn tls_secret(&mut self, data: Option<&BTreeMap<String, Vec<u8>>>) -> TlsChanged {
        let change = match &mut self.internal_tls {
            Some(tls) => tls.secret(data),
            None => return TlsChanged::none(),
        };
        self.tls_changed(change)
    }

    /// Every trust-bundle ConfigMap, as (re)listed.
    pub fn tls_bundles_listed(
        &mut self,
        all: Vec<(String, BTreeMap<String, String>)>,
    ) -> TlsChanged {
        let change = match &mut self.internal_tls {
            Some(tls) => tls.bundles_listed(all),
            None => return TlsChanged::none(),
        };
        self.tls_changed(change)
    }

    /// One trust-bundle ConfigMap changed (`None`: deleted).
    pub fn tls_bundle(
        &mut self,
        name: &str,
        data: Option<&BTreeMap<String, String>>,
    ) -> TlsChanged {
        let change = match &mut self.internal_tls {
            Some(tls) => tls.bundle(name, data),
            None => return TlsChanged::none(),
        };
        self.tls_changed(change)
    }

    fn tls_changed(&mut self, change: internal_tls::Change) -> TlsChanged {
        // New trust reaches new connections only: each revision's spec is made again.
        let ops = if change.retrusted {
            self.specs()
        } else {
            Vec::new()
        };
        TlsChanged {
            ops,
            served: change.served,
            warnings: change.warnings,
        }
    }

    /// Every revision's spec as the model sees it now.
    pub fn specs(&self) -> Vec<Op> {
        self.revisions
            .values()
            .map(|seen| Op::UpsertRevision(self.routed_spec(seen)))
            .collect()
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
        if let Some(tls) = &self.internal_tls {
            routed.tls = Some(tls.pod_tls(seen.spec.key.namespace()));
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
            ops.extend(self.specs());
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
mod tests;
