//! Which of a revision's listed pods the Kubernetes source vouches for: the backend prober of
//! upstream's `revision_backends.go`, sans-IO. Endpoints say which pods exist and which
//! Kubernetes thinks ready; a pod becomes *healthy* (and is handed to the state worker in a
//! `SetEndpoints`) once a probe `GET /healthz` with `K-Network-Probe: queue` answered `queue`,
//! or at once when Kubernetes lists it ready and the mesh mode says probing is not needed.
//!
//! The rules, as upstream:
//! * `enabled`/`disabled` mesh modes trust a ready address without probing; `auto` probes every
//!   listed pod, which is how it sniffs a mesh: when every listed pod failed its probe the way
//!   a sidecar makes it fail (no answer, or 502/503; [`Outcome::Failed`]) and none answered
//!   anything else, the revision's private Service is probed instead, and once that passes
//!   the revision goes through the Service for as long as it exists (upstream's sticky
//!   `podsAddressable = false`), its ready pods trusted and counted for its capacity. Scaled to
//!   zero and back, the Service is probed again before it is used.
//! * A passing probe promotes a ready pod; a not-ready one only with the probe optimisation on
//!   (the revision has no exec readiness probe and no startup probes, [`super::objects::probe_optimisation`]).
//! * A pod that moved from ready to not ready is probed again before it counts as healthy.
//! * A pod no longer listed is dropped; a relist that lists the same pods changes nothing.
//! * ★ A probe speaks the revision's protocol: an h2c revision's pods (and Service) get the
//!   gRPC health check over h2c, the others `GET /healthz` over HTTP/1.1 (upstream probes every
//!   pod over HTTP/1, which a pod that speaks only HTTP/2 never passes). Until its Revision
//!   object is seen, a revision's pods are probed over HTTP/1.
//!
//! ★ No rounds: each probe has its own timeout and a failed pod is probed again at the next
//! interval tick, so one slow pod never holds back the others (upstream probes a
//! revision's pods as a group under one 300 ms timeout). The caller asks [`Backends::due`] for
//! what to probe after every change and on every interval tick; a pod is never probed twice at
//! once, and one that failed waits for the next tick.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use kactivator_api::RevisionKey;
use kactivator_shards::routing::Protocol;

use super::objects::Addresses;
use crate::state::{OmissionScope, Op};

/// `config-network`'s `mesh-compatibility-mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MeshMode {
    /// Every pod is probed, and a revision whose pods all fail the way a mesh makes them fail
    /// goes through its private Service once that passes a probe (see [`Backends`]), as upstream.
    #[default]
    Auto,
    /// Every revision goes through its private Service (cluster-IP mode).
    Enabled,
    /// Never through the Service.
    Disabled,
}

impl MeshMode {
    /// Reads the key's value; anything else is `None`.
    pub fn parse(value: &str) -> Option<MeshMode> {
        match value.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Some(MeshMode::Auto),
            "enabled" => Some(MeshMode::Enabled),
            "disabled" => Some(MeshMode::Disabled),
            _ => None,
        }
    }
}

/// What a probe is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    /// One listed pod.
    Pod,
    /// The revision's private Service (its ClusterIP and `http`/`http2` port), in `auto` mesh
    /// mode after every pod failed as behind a mesh.
    Service,
}

/// One probe to make.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeJob {
    pub revision: RevisionKey,
    pub addr: SocketAddr,
    pub target: Target,
    /// What to probe in: the revision's protocol.
    pub protocol: Protocol,
}

/// How a probe ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It answered `queue` for this revision.
    Passed,
    /// Anything else. `mesh_like`: a failure a mesh could cause (no answer, 502, 503); any
    /// other answer proves something other than a mesh answered and rules out the Service.
    Failed { mesh_like: bool },
    /// Not made (over the probe concurrency bound): retried at the next tick, and no verdict
    /// on a mesh this round, since not every pod was heard from.
    Skipped,
}

#[derive(Debug)]
struct Revision {
    /// What the endpoints list now.
    listed: Addresses,
    /// Listed pods the source vouches for.
    healthy: BTreeSet<SocketAddr>,
    /// The `ready` of the last `SetEndpoints` sent (`None`: nothing sent yet).
    published: Option<BTreeSet<SocketAddr>>,
    /// Probes under way.
    in_flight: BTreeSet<SocketAddr>,
    /// Failed since the last interval tick: probed again at the next one, not at once.
    failed: BTreeSet<SocketAddr>,
    /// A passing probe promotes a not-ready pod too.
    optimisation: bool,
    /// The protocol its pods are probed in (from its Revision object; HTTP/1 until then).
    protocol: Protocol,
    /// Through the private Service since its probe passed: the pods were not reachable
    /// directly (`auto` mesh mode). Never undone while the revision lasts.
    via_service: bool,
    /// In `via_service`: the Service's probe passed since the revision last had no pods.
    service_healthy: bool,
    /// A pod answered something a mesh would not say since the last interval tick: no
    /// fallback to the Service this round.
    not_mesh: bool,
}

impl Default for Revision {
    fn default() -> Revision {
        Revision {
            listed: Addresses::default(),
            healthy: BTreeSet::new(),
            published: None,
            in_flight: BTreeSet::new(),
            failed: BTreeSet::new(),
            // On until the Revision object says otherwise.
            optimisation: true,
            protocol: Protocol::default(),
            via_service: false,
            service_healthy: false,
            not_mesh: false,
        }
    }
}

impl Revision {
    /// Listed pods not vouched for (the healthy ones are always among the listed).
    fn waiting(&self) -> usize {
        self.listed.ready.len() + self.listed.not_ready.len() - self.healthy.len()
    }

    /// Something is left to probe or to find out.
    fn unsettled(&self) -> bool {
        if self.via_service {
            self.service_due()
        } else {
            self.waiting() > 0
        }
    }

    fn nothing_listed(&self) -> bool {
        self.listed.ready.is_empty() && self.listed.not_ready.is_empty()
    }

    /// Pod mode in `auto`: every listed pod failed this round, all as a mesh would make them,
    /// none is vouched for or still being probed, and Kubernetes says some are ready (the
    /// Service sends only to those).
    fn wants_service(&self) -> bool {
        !self.via_service
            && !self.not_mesh
            && self.healthy.is_empty()
            && !self.listed.ready.is_empty()
            && self.in_flight.is_empty()
            && self
                .listed
                .ready
                .iter()
                .chain(self.listed.not_ready.iter())
                .all(|addr| self.failed.contains(addr))
    }

    /// In `via_service`: the Service must pass a probe before it is used again.
    fn service_due(&self) -> bool {
        self.via_service && !self.service_healthy && !self.listed.ready.is_empty()
    }

    fn listed(&self, addr: &SocketAddr) -> bool {
        self.listed.ready.contains(addr) || self.listed.not_ready.contains(addr)
    }

    /// The op that tells the state worker the healthy pods, when they changed.
    fn publish(&mut self, revision: &RevisionKey) -> Option<Op> {
        if self.published.as_ref() == Some(&self.healthy) {
            return None;
        }
        self.published = Some(self.healthy.clone());
        Some(Op::SetEndpoints {
            revision: revision.clone(),
            ready: self.healthy.iter().copied().collect(),
            scope: OmissionScope::AllPods,
        })
    }
}

/// Every private revision's pods and what the probes said of them.
#[derive(Debug, Default)]
pub struct Backends {
    revisions: BTreeMap<RevisionKey, Revision>,
    /// The revisions with a listed pod not vouched for: the only ones [`Backends::due`] and
    /// [`Backends::pending`] look at, so an event costs its revision, not the cluster.
    unsettled: BTreeSet<RevisionKey>,
    mesh: MeshMode,
}

impl Backends {
    pub fn new(mesh: MeshMode) -> Backends {
        Backends {
            mesh,
            ..Backends::default()
        }
    }

    /// Revisions remembered (listed pods, probe results or the probe optimisation).
    #[cfg(test)]
    pub fn revision_count(&self) -> usize {
        self.revisions.len()
    }

    /// Listed pods not yet vouched for, over every revision.
    pub fn pending(&self) -> usize {
        self.unsettled
            .iter()
            .filter_map(|key| self.revisions.get(key))
            .map(|revision| {
                if revision.via_service {
                    revision.listed.ready.len()
                } else {
                    revision.waiting()
                }
            })
            .sum()
    }

    /// Keeps [`Backends::unsettled`] true for `key` after a change to it. A settled revision
    /// has no failures to remember.
    fn settle(&mut self, key: &RevisionKey) {
        match self.revisions.get_mut(key) {
            Some(revision) if revision.unsettled() => {
                self.unsettled.insert(key.clone());
            }
            Some(revision) => {
                revision.failed.clear();
                self.unsettled.remove(key);
            }
            None => {
                self.unsettled.remove(key);
            }
        }
    }

    /// A revision's probe optimisation (from its Revision object; on until that is seen).
    pub fn set_optimisation(&mut self, revision: &RevisionKey, on: bool) {
        self.revisions
            .entry(revision.clone())
            .or_default()
            .optimisation = on;
    }

    /// A revision's protocol (from its Revision object; HTTP/1 until that is seen): what its
    /// pods are probed in from the next probe on.
    pub fn set_protocol(&mut self, revision: &RevisionKey, protocol: Protocol) {
        self.revisions.entry(revision.clone()).or_default().protocol = protocol;
    }

    /// The revision's private endpoints now list `listed` (merged over its objects). Returns
    /// the `SetEndpoints` when the healthy pods changed; the caller then asks [`Backends::due`].
    pub fn listed(&mut self, revision: &RevisionKey, listed: Addresses) -> Option<Op> {
        if !self.revisions.contains_key(revision) && listed == Addresses::default() {
            // Nothing known and nothing listed (the endpoints of a revision already gone):
            // nothing to remember or to say.
            return None;
        }
        let trust_ready = self.mesh != MeshMode::Auto;
        let entry = self.revisions.entry(revision.clone()).or_default();
        if entry.via_service {
            // Through the Service: its ready pods are trusted (they count for the capacity);
            // with none listed at all (scaled to zero) the Service is probed again first.
            entry.listed = listed;
            if entry.nothing_listed() {
                entry.service_healthy = false;
            }
            entry.healthy = if entry.service_healthy {
                entry.listed.ready.iter().copied().collect()
            } else {
                BTreeSet::new()
            };
            let op = entry.publish(revision);
            self.settle(revision);
            return op;
        }
        // A pod Kubernetes took out of ready is probed again before it counts.
        for addr in listed.not_ready.iter() {
            if entry.listed.ready.contains(addr) {
                entry.healthy.remove(addr);
            }
        }
        entry.listed = listed;
        let Revision {
            listed, healthy, ..
        } = entry;
        healthy.retain(|addr| listed.ready.contains(addr) || listed.not_ready.contains(addr));
        if trust_ready {
            healthy.extend(listed.ready.iter().copied());
        }
        let op = entry.publish(revision);
        self.settle(revision);
        op
    }

    /// The revision is gone: nothing of it is probed or published any more.
    pub fn remove(&mut self, revision: &RevisionKey) {
        self.revisions.remove(revision);
        self.unsettled.remove(revision);
    }

    /// The probes to start now: every listed pod not vouched for, not being probed, and (unless
    /// this is an interval `tick`) not failed since the last tick; and the private Service's
    /// address (from `services`) when the mesh rules call for it. Each is marked in flight
    /// until [`Backends::probed`] reports it.
    pub fn due(
        &mut self,
        tick: bool,
        services: &BTreeMap<RevisionKey, SocketAddr>,
    ) -> Vec<ProbeJob> {
        let mut jobs = Vec::new();
        let sniff = self.mesh == MeshMode::Auto;
        for key in &self.unsettled {
            let Some(revision) = self.revisions.get_mut(key) else {
                continue;
            };
            if tick {
                revision.failed.clear();
                revision.not_mesh = false;
            }
            let service = services.get(key).copied();
            let protocol = revision.protocol;
            let probe_service = |revision: &mut Revision, jobs: &mut Vec<ProbeJob>| {
                let Some(addr) = service else { return };
                if revision.in_flight.contains(&addr) || revision.failed.contains(&addr) {
                    return;
                }
                revision.in_flight.insert(addr);
                jobs.push(ProbeJob {
                    revision: key.clone(),
                    addr,
                    target: Target::Service,
                    protocol,
                });
            };
            if revision.via_service {
                if revision.service_due() {
                    probe_service(revision, &mut jobs);
                }
                continue;
            }
            let waiting: Vec<SocketAddr> = revision
                .listed
                .ready
                .iter()
                .chain(revision.listed.not_ready.iter())
                .filter(|addr| {
                    !revision.healthy.contains(*addr)
                        && !revision.in_flight.contains(*addr)
                        && !revision.failed.contains(*addr)
                })
                .copied()
                .collect();
            for addr in waiting {
                revision.in_flight.insert(addr);
                jobs.push(ProbeJob {
                    revision: key.clone(),
                    addr,
                    target: Target::Pod,
                    protocol,
                });
            }
            if sniff && revision.wants_service() {
                probe_service(revision, &mut jobs);
            }
        }
        jobs
    }

    /// The revision goes through its private Service (its pods were not reachable directly).
    pub fn via_service(&self, revision: &RevisionKey) -> bool {
        self.revisions
            .get(revision)
            .is_some_and(|revision| revision.via_service)
    }

    /// A probe finished (another revision's answer is a failure, and not a mesh's). Returns
    /// the `SetEndpoints` when it promoted a pod, or the Service.
    pub fn probed(&mut self, job: &ProbeJob, outcome: Outcome) -> Option<Op> {
        let revision = self.revisions.get_mut(&job.revision)?;
        revision.in_flight.remove(&job.addr);
        match outcome {
            Outcome::Passed => {}
            Outcome::Failed { mesh_like } => {
                revision.failed.insert(job.addr);
                if job.target == Target::Pod && !mesh_like {
                    revision.not_mesh = true;
                }
                return None;
            }
            Outcome::Skipped => {
                revision.failed.insert(job.addr);
                revision.not_mesh = true;
                return None;
            }
        }
        if job.target == Target::Service {
            if revision.via_service && revision.service_healthy {
                return None;
            }
            revision.via_service = true;
            revision.service_healthy = true;
            revision.healthy = revision.listed.ready.iter().copied().collect();
            let op = revision.publish(&job.revision);
            self.settle(&job.revision);
            return op;
        }
        if revision.via_service {
            // A pod probe from before the switch: the pods are not used one by one any more.
            return None;
        }
        if !revision.listed(&job.addr) {
            return None;
        }
        let promotable = revision.listed.ready.contains(&job.addr) || revision.optimisation;
        if !promotable || !revision.healthy.insert(job.addr) {
            return None;
        }
        let op = revision.publish(&job.revision);
        self.settle(&job.revision);
        op
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> RevisionKey {
        RevisionKey::new("default", name).unwrap()
    }

    fn addr(last: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, last], 8012))
    }

    fn listed(ready: &[u8], not_ready: &[u8]) -> Addresses {
        Addresses {
            ready: ready.iter().map(|last| addr(*last)).collect(),
            not_ready: not_ready.iter().map(|last| addr(*last)).collect(),
        }
    }

    fn ready_of(op: Option<Op>) -> Option<Vec<SocketAddr>> {
        match op {
            Some(Op::SetEndpoints { ready, scope, .. }) => {
                assert_eq!(scope, OmissionScope::AllPods);
                Some(ready)
            }
            None => None,
            Some(other) => panic!("{other:?}"),
        }
    }

    fn job(name: &str, last: u8) -> ProbeJob {
        ProbeJob {
            revision: key(name),
            addr: addr(last),
            target: Target::Pod,
            protocol: Protocol::Http1,
        }
    }

    fn no_services() -> BTreeMap<RevisionKey, SocketAddr> {
        BTreeMap::new()
    }

    #[test]
    fn in_auto_mode_a_listed_pod_waits_for_its_probe() {
        let mut backends = Backends::new(MeshMode::Auto);
        // Listed, nothing vouched for yet: an empty SetEndpoints says so once.
        assert_eq!(
            ready_of(backends.listed(&key("a"), listed(&[1, 2], &[]))),
            Some(vec![])
        );
        assert_eq!(
            backends.due(false, &no_services()),
            [job("a", 1), job("a", 2)]
        );
        assert!(
            backends.due(false, &no_services()).is_empty(),
            "never probed twice at once"
        );
        assert_eq!(
            ready_of(backends.probed(&job("a", 2), Outcome::Passed)),
            Some(vec![addr(2)])
        );
        assert_eq!(
            backends.probed(&job("a", 1), Outcome::Failed { mesh_like: false }),
            None
        );
        assert_eq!(backends.pending(), 1);
        // The failed one waits for the next interval tick.
        assert!(backends.due(false, &no_services()).is_empty());
        assert_eq!(backends.due(true, &no_services()), [job("a", 1)]);
        assert_eq!(
            ready_of(backends.probed(&job("a", 1), Outcome::Passed)),
            Some(vec![addr(1), addr(2)])
        );
        assert!(backends.due(false, &no_services()).is_empty());
        assert_eq!(backends.pending(), 0);
    }

    #[test]
    fn with_a_mesh_mode_set_a_ready_pod_is_trusted_and_only_not_ready_ones_are_probed() {
        let mut backends = Backends::new(MeshMode::Disabled);
        assert_eq!(
            ready_of(backends.listed(&key("a"), listed(&[1], &[2]))),
            Some(vec![addr(1)])
        );
        assert_eq!(backends.due(false, &no_services()), [job("a", 2)]);
        // The optimisation (on by default) lets a passing probe promote a not-ready pod.
        assert_eq!(
            ready_of(backends.probed(&job("a", 2), Outcome::Passed)),
            Some(vec![addr(1), addr(2)])
        );
    }

    #[test]
    fn without_the_optimisation_a_not_ready_pod_waits_for_kubernetes() {
        let mut backends = Backends::new(MeshMode::Auto);
        backends.set_optimisation(&key("a"), false);
        backends.listed(&key("a"), listed(&[], &[1]));
        assert_eq!(backends.due(false, &no_services()), [job("a", 1)]);
        assert_eq!(
            backends.probed(&job("a", 1), Outcome::Passed),
            None,
            "not promoted"
        );
        // Kubernetes lists it ready: probed again, then promoted.
        assert_eq!(backends.listed(&key("a"), listed(&[1], &[])), None);
        assert_eq!(backends.due(false, &no_services()), [job("a", 1)]);
        assert_eq!(
            ready_of(backends.probed(&job("a", 1), Outcome::Passed)),
            Some(vec![addr(1)])
        );
    }

    #[test]
    fn a_relist_of_the_same_pods_changes_nothing_and_a_pod_gone_meanwhile_is_dropped() {
        let mut backends = Backends::new(MeshMode::Auto);
        backends.listed(&key("a"), listed(&[1, 2], &[]));
        for job in backends.due(false, &no_services()) {
            backends.probed(&job, Outcome::Passed);
        }
        // Same pods again (a relist after an outage): no op, nothing to probe.
        assert_eq!(backends.listed(&key("a"), listed(&[1, 2], &[])), None);
        assert!(backends.due(false, &no_services()).is_empty());
        // One went away meanwhile: dropped at once, the other kept without a probe.
        assert_eq!(
            ready_of(backends.listed(&key("a"), listed(&[2], &[]))),
            Some(vec![addr(2)])
        );
        assert!(backends.due(false, &no_services()).is_empty());
    }

    #[test]
    fn a_pod_that_became_not_ready_is_probed_again() {
        let mut backends = Backends::new(MeshMode::Auto);
        backends.listed(&key("a"), listed(&[1], &[]));
        let jobs = backends.due(false, &no_services());
        backends.probed(&jobs[0], Outcome::Passed);
        assert_eq!(
            ready_of(backends.listed(&key("a"), listed(&[], &[1]))),
            Some(vec![])
        );
        assert_eq!(backends.due(false, &no_services()), [job("a", 1)]);
    }

    #[test]
    fn a_probe_of_a_pod_no_longer_listed_promotes_nothing() {
        let mut backends = Backends::new(MeshMode::Auto);
        backends.listed(&key("a"), listed(&[1], &[]));
        let jobs = backends.due(false, &no_services());
        backends.listed(&key("a"), listed(&[], &[]));
        assert_eq!(backends.probed(&jobs[0], Outcome::Passed), None);
        backends.remove(&key("a"));
        assert_eq!(backends.probed(&jobs[0], Outcome::Passed), None);
        assert!(backends.due(false, &no_services()).is_empty());
    }

    const MESH: Outcome = Outcome::Failed { mesh_like: true };
    const NOT_MESH: Outcome = Outcome::Failed { mesh_like: false };

    fn service_addr() -> SocketAddr {
        SocketAddr::from(([10, 96, 0, 7], 80))
    }

    fn services() -> BTreeMap<RevisionKey, SocketAddr> {
        BTreeMap::from([(key("a"), service_addr())])
    }

    fn service_job() -> ProbeJob {
        ProbeJob {
            revision: key("a"),
            addr: service_addr(),
            target: Target::Service,
            protocol: Protocol::Http1,
        }
    }

    /// Probes every pod due and fails each with `outcome`; returns what became due after.
    fn fail_all(backends: &mut Backends, tick: bool, outcome: Outcome) -> Vec<ProbeJob> {
        let jobs = backends.due(tick, &services());
        assert!(jobs.iter().all(|job| job.target == Target::Pod), "{jobs:?}");
        for job in &jobs {
            assert_eq!(backends.probed(job, outcome), None);
        }
        backends.due(false, &services())
    }

    #[test]
    fn in_auto_mode_pods_failing_as_behind_a_mesh_send_the_revision_through_its_service() {
        let mut backends = Backends::new(MeshMode::Auto);
        backends.listed(&key("a"), listed(&[1, 2], &[3]));
        assert!(!backends.via_service(&key("a")));
        // Every pod failed as a mesh makes it fail: the Service is probed, once.
        assert_eq!(fail_all(&mut backends, false, MESH), [service_job()]);
        assert!(backends.due(false, &services()).is_empty());
        // It answered: the ready pods are trusted, through the Service.
        assert_eq!(
            ready_of(backends.probed(&service_job(), Outcome::Passed)),
            Some(vec![addr(1), addr(2)])
        );
        assert!(backends.via_service(&key("a")));
        assert_eq!(backends.pending(), 0);
        // From now on the pods are never probed one by one; what Kubernetes calls ready is used.
        assert!(backends.due(true, &services()).is_empty());
        assert_eq!(
            ready_of(backends.listed(&key("a"), listed(&[1, 3, 4], &[]))),
            Some(vec![addr(1), addr(3), addr(4)])
        );
        assert!(backends.due(true, &services()).is_empty());
    }

    #[test]
    fn one_answer_no_mesh_would_give_keeps_the_pods_for_that_round() {
        let mut backends = Backends::new(MeshMode::Auto);
        backends.listed(&key("a"), listed(&[1, 2], &[]));
        let jobs = backends.due(false, &services());
        backends.probed(&jobs[0], MESH);
        // A 500 (or a body other than `queue`) came from the pod, not from a sidecar.
        backends.probed(&jobs[1], NOT_MESH);
        assert!(backends.due(false, &services()).is_empty());
        // Next round every pod fails as behind a mesh: now the Service is tried.
        assert_eq!(fail_all(&mut backends, true, MESH), [service_job()]);
    }

    #[test]
    fn a_probe_left_out_by_the_concurrency_bound_gives_no_mesh_verdict() {
        let mut backends = Backends::new(MeshMode::Auto);
        backends.listed(&key("a"), listed(&[1, 2], &[]));
        let jobs = backends.due(false, &services());
        backends.probed(&jobs[0], MESH);
        backends.probed(&jobs[1], Outcome::Skipped);
        assert!(backends.due(false, &services()).is_empty());
    }

    #[test]
    fn a_failing_service_is_tried_again_after_the_next_round_of_pod_probes() {
        let mut backends = Backends::new(MeshMode::Auto);
        backends.listed(&key("a"), listed(&[1], &[]));
        assert_eq!(fail_all(&mut backends, false, MESH), [service_job()]);
        assert_eq!(backends.probed(&service_job(), MESH), None);
        assert!(!backends.via_service(&key("a")));
        assert!(backends.due(false, &services()).is_empty());
        assert_eq!(fail_all(&mut backends, true, MESH), [service_job()]);
        // Without a known Service address nothing is tried.
        backends.probed(&service_job(), MESH);
        let jobs = backends.due(true, &no_services());
        for job in &jobs {
            backends.probed(job, MESH);
        }
        assert!(backends.due(false, &no_services()).is_empty());
    }

    #[test]
    fn scaled_to_zero_and_back_the_service_is_probed_again_before_it_is_used() {
        let mut backends = Backends::new(MeshMode::Auto);
        backends.listed(&key("a"), listed(&[1], &[]));
        fail_all(&mut backends, false, MESH);
        backends.probed(&service_job(), Outcome::Passed);
        assert_eq!(
            ready_of(backends.listed(&key("a"), listed(&[], &[]))),
            Some(vec![])
        );
        // Pods again: not used until the Service answers; the pods themselves are not probed.
        assert_eq!(backends.listed(&key("a"), listed(&[2], &[])), None);
        assert_eq!(backends.due(false, &services()), [service_job()]);
        assert_eq!(
            ready_of(backends.probed(&service_job(), Outcome::Passed)),
            Some(vec![addr(2)])
        );
        assert!(
            backends.via_service(&key("a")),
            "sticky while the revision lasts"
        );
        backends.remove(&key("a"));
        assert!(!backends.via_service(&key("a")));
    }

    #[test]
    fn with_the_mesh_mode_set_the_service_is_never_sniffed() {
        for mode in [MeshMode::Enabled, MeshMode::Disabled] {
            let mut backends = Backends::new(mode);
            backends.listed(&key("a"), listed(&[1], &[2]));
            let jobs = backends.due(false, &services());
            assert_eq!(jobs, [job("a", 2)], "{mode:?}");
            backends.probed(&jobs[0], MESH);
            assert!(backends
                .due(true, &services())
                .iter()
                .all(|job| job.target == Target::Pod));
            assert!(!backends.via_service(&key("a")));
        }
    }

    #[test]
    fn probes_speak_the_revisions_protocol() {
        // (protocol the Revision object says, if seen; what its pods and Service are probed in)
        let cases = [
            (None, Protocol::Http1),
            (Some(Protocol::Http1), Protocol::Http1),
            (Some(Protocol::H2c), Protocol::H2c),
        ];
        for (seen, expected) in cases {
            let mut backends = Backends::new(MeshMode::Auto);
            if let Some(protocol) = seen {
                backends.set_protocol(&key("a"), protocol);
            }
            backends.listed(&key("a"), listed(&[1, 2], &[]));
            let jobs = backends.due(false, &services());
            assert_eq!(jobs.len(), 2, "{jobs:?}");
            assert!(
                jobs.iter().all(|job| job.protocol == expected),
                "{seen:?}: {jobs:?}"
            );
            // Every pod failing as behind a mesh: the Service is probed, in the same protocol.
            for job in &jobs {
                backends.probed(job, MESH);
            }
            let service = backends.due(false, &services());
            assert_eq!(
                service
                    .iter()
                    .map(|job| (job.target, job.protocol))
                    .collect::<Vec<_>>(),
                [(Target::Service, expected)],
                "{seen:?}"
            );
        }
        // A revision seen after its endpoints: the next probes speak its protocol.
        let mut backends = Backends::new(MeshMode::Auto);
        backends.listed(&key("a"), listed(&[1], &[]));
        let [first] = &backends.due(false, &no_services())[..] else {
            panic!("one probe");
        };
        assert_eq!(first.protocol, Protocol::Http1);
        backends.probed(first, NOT_MESH);
        backends.set_protocol(&key("a"), Protocol::H2c);
        let [again] = &backends.due(true, &no_services())[..] else {
            panic!("probed again at the tick");
        };
        assert_eq!(again.protocol, Protocol::H2c);
    }
}
