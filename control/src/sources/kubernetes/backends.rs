//! Which of a revision's listed pods the Kubernetes source vouches for: the backend prober of
//! upstream's `revision_backends.go`, sans-IO. Endpoints say which pods exist and which
//! Kubernetes thinks ready; a pod becomes *healthy* (and is handed to the state worker in a
//! `SetEndpoints`) once a probe `GET /healthz` with `K-Network-Probe: queue` answered `queue`,
//! or at once when Kubernetes lists it ready and the mesh mode says probing is not needed.
//!
//! The rules, as upstream:
//! * `enabled`/`disabled` mesh modes trust a ready address without probing; `auto` probes every
//!   listed pod (upstream probes there to sniff a mesh; the sniffing itself is not built, see
//!   [`super::model::MeshMode::Auto`]).
//! * A passing probe promotes a ready pod; a not-ready one only with the probe optimisation on
//!   (the revision has no exec readiness probe and no startup probes, [`super::objects::probe_optimisation`]).
//! * A pod that moved from ready to not ready is probed again before it counts as healthy.
//! * A pod no longer listed is dropped; a relist that lists the same pods changes nothing.
//!
//! ★ No rounds: each probe has its own timeout and a failed pod is probed again at the next
//! interval tick, so one slow pod never holds back the others (upstream probes a
//! revision's pods as a group under one 300 ms timeout). The caller asks [`Backends::due`] for
//! what to probe after every change and on every interval tick; a pod is never probed twice at
//! once, and one that failed waits for the next tick.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use kactivator_api::RevisionKey;

use super::model::MeshMode;
use super::objects::Addresses;
use crate::state::{OmissionScope, Op};

/// One probe to make.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ProbeJob {
    pub revision: RevisionKey,
    pub addr: SocketAddr,
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
        }
    }
}

impl Revision {
    /// Listed pods not vouched for (the healthy ones are always among the listed).
    fn waiting(&self) -> usize {
        self.listed.ready.len() + self.listed.not_ready.len() - self.healthy.len()
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

    /// Listed pods not yet vouched for, over every revision.
    pub fn pending(&self) -> usize {
        self.unsettled
            .iter()
            .filter_map(|key| self.revisions.get(key))
            .map(Revision::waiting)
            .sum()
    }

    /// Keeps [`Backends::unsettled`] true for `key` after a change to it. A settled revision
    /// has no failures to remember.
    fn settle(&mut self, key: &RevisionKey) {
        match self.revisions.get_mut(key) {
            Some(revision) if revision.waiting() > 0 => {
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

    /// The revision's private endpoints now list `listed` (merged over its objects). Returns
    /// the `SetEndpoints` when the healthy pods changed; the caller then asks [`Backends::due`].
    pub fn listed(&mut self, revision: &RevisionKey, listed: Addresses) -> Option<Op> {
        let trust_ready = self.mesh != MeshMode::Auto;
        let entry = self.revisions.entry(revision.clone()).or_default();
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
    /// this is an interval `tick`) not failed since the last tick. Each is marked in flight
    /// until [`Backends::probed`] reports it.
    pub fn due(&mut self, tick: bool) -> Vec<ProbeJob> {
        let mut jobs = Vec::new();
        for key in &self.unsettled {
            let Some(revision) = self.revisions.get_mut(key) else {
                continue;
            };
            if tick {
                revision.failed.clear();
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
                });
            }
        }
        jobs
    }

    /// A probe finished (`passed`: it answered `queue` for this revision; another revision's
    /// answer is a failure). Returns the `SetEndpoints` when it promoted the pod.
    pub fn probed(&mut self, job: &ProbeJob, passed: bool) -> Option<Op> {
        let revision = self.revisions.get_mut(&job.revision)?;
        revision.in_flight.remove(&job.addr);
        if !passed {
            revision.failed.insert(job.addr);
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
        }
    }

    #[test]
    fn in_auto_mode_a_listed_pod_waits_for_its_probe() {
        let mut backends = Backends::new(MeshMode::Auto);
        // Listed, nothing vouched for yet: an empty SetEndpoints says so once.
        assert_eq!(
            ready_of(backends.listed(&key("a"), listed(&[1, 2], &[]))),
            Some(vec![])
        );
        assert_eq!(backends.due(false), [job("a", 1), job("a", 2)]);
        assert!(backends.due(false).is_empty(), "never probed twice at once");
        assert_eq!(
            ready_of(backends.probed(&job("a", 2), true)),
            Some(vec![addr(2)])
        );
        assert_eq!(backends.probed(&job("a", 1), false), None);
        assert_eq!(backends.pending(), 1);
        // The failed one waits for the next interval tick.
        assert!(backends.due(false).is_empty());
        assert_eq!(backends.due(true), [job("a", 1)]);
        assert_eq!(
            ready_of(backends.probed(&job("a", 1), true)),
            Some(vec![addr(1), addr(2)])
        );
        assert!(backends.due(false).is_empty());
        assert_eq!(backends.pending(), 0);
    }

    #[test]
    fn with_a_mesh_mode_set_a_ready_pod_is_trusted_and_only_not_ready_ones_are_probed() {
        let mut backends = Backends::new(MeshMode::Disabled);
        assert_eq!(
            ready_of(backends.listed(&key("a"), listed(&[1], &[2]))),
            Some(vec![addr(1)])
        );
        assert_eq!(backends.due(false), [job("a", 2)]);
        // The optimisation (on by default) lets a passing probe promote a not-ready pod.
        assert_eq!(
            ready_of(backends.probed(&job("a", 2), true)),
            Some(vec![addr(1), addr(2)])
        );
    }

    #[test]
    fn without_the_optimisation_a_not_ready_pod_waits_for_kubernetes() {
        let mut backends = Backends::new(MeshMode::Auto);
        backends.set_optimisation(&key("a"), false);
        backends.listed(&key("a"), listed(&[], &[1]));
        assert_eq!(backends.due(false), [job("a", 1)]);
        assert_eq!(backends.probed(&job("a", 1), true), None, "not promoted");
        // Kubernetes lists it ready: probed again, then promoted.
        assert_eq!(backends.listed(&key("a"), listed(&[1], &[])), None);
        assert_eq!(backends.due(false), [job("a", 1)]);
        assert_eq!(
            ready_of(backends.probed(&job("a", 1), true)),
            Some(vec![addr(1)])
        );
    }

    #[test]
    fn a_relist_of_the_same_pods_changes_nothing_and_a_pod_gone_meanwhile_is_dropped() {
        let mut backends = Backends::new(MeshMode::Auto);
        backends.listed(&key("a"), listed(&[1, 2], &[]));
        for job in backends.due(false) {
            backends.probed(&job, true);
        }
        // Same pods again (a relist after an outage): no op, nothing to probe.
        assert_eq!(backends.listed(&key("a"), listed(&[1, 2], &[])), None);
        assert!(backends.due(false).is_empty());
        // One went away meanwhile: dropped at once, the other kept without a probe.
        assert_eq!(
            ready_of(backends.listed(&key("a"), listed(&[2], &[]))),
            Some(vec![addr(2)])
        );
        assert!(backends.due(false).is_empty());
    }

    #[test]
    fn a_pod_that_became_not_ready_is_probed_again() {
        let mut backends = Backends::new(MeshMode::Auto);
        backends.listed(&key("a"), listed(&[1], &[]));
        let jobs = backends.due(false);
        backends.probed(&jobs[0], true);
        assert_eq!(
            ready_of(backends.listed(&key("a"), listed(&[], &[1]))),
            Some(vec![])
        );
        assert_eq!(backends.due(false), [job("a", 1)]);
    }

    #[test]
    fn a_probe_of_a_pod_no_longer_listed_promotes_nothing() {
        let mut backends = Backends::new(MeshMode::Auto);
        backends.listed(&key("a"), listed(&[1], &[]));
        let jobs = backends.due(false);
        backends.listed(&key("a"), listed(&[], &[]));
        assert_eq!(backends.probed(&jobs[0], true), None);
        backends.remove(&key("a"));
        assert_eq!(backends.probed(&jobs[0], true), None);
        assert!(backends.due(false).is_empty());
    }
}
