//! The state the worker owns: every revision, every pod tracker and its [`Pod`] state, the feature
//! gates, the activators sharing the pods, and the version counter of the snapshots published
//! to the shards.
//!
//! Sans-IO. [`ControlState::apply`] takes one [`Op`] and the current [`Timestamp`], changes the
//! state, and leaves behind what must change outside it, as [`Effects`] the I/O shell takes
//! ([`ControlState::take_effects`]) and carries out: trackers' capacities to set, the process
//! queue's limit, routing updates to publish, probe sets for the prober and facts for the
//! metrics. Nothing here awaits, locks, reads a clock or writes to what the shards share, so
//! every rule is tested with simulated time.
//!
//! # Ops are incremental
//!
//! Each op is one fact from one source: a revision declared or gone, one revision's endpoints,
//! the gates, the activators, one pod's event. An informer's per-object event maps to one op;
//! the standalone file sends its whole view as one [`Op::Batch`]. An op marks the revisions it
//! touched, and only those are re-derived and published, once, when the op (batch included) is
//! done: shards never see half of a batch, and one pod's event costs its revision, not the
//! whole table.
//!
//! # What makes a route
//!
//! A revision is published once a source declared it (its [`RevisionSpec`]). Pod mode: its
//! route holds the pods that are routable ([`Pod::is_routable`]: Ready) and
//! assigned to this activator by `subsetting::assign`; each tracker's capacity is this
//! activator's share of containerConcurrency. Cluster-IP mode (the spec names the private
//! Service's address): one virtual tracker for that address, whose capacity is
//! `max(1, CC × routable pods / activators)`. Both go through the one capacity rule,
//! `capacity::revision_capacity`. Pods pushed by a queue-proxy before any source
//! declared their revision are kept and published when the revision appears.
//!
//! # One writer per fact
//!
//! A tracker's capacity is decided here and nowhere else ([`CapacityChange`]; the shell only
//! carries the decision out). A shard that could not reach a pod reports it as
//! [`Op::Evidence`], which names the tracker it is about: evidence about a tracker that has since
//! been replaced (a new pod at the same address) changes nothing. The process queue's limit is decided here too
//! ([`Op::SetMaxQueuedRequests`]).
//!
//! # Trackers outlive routing
//!
//! A pod that stops being routable keeps its tracker (and so its in-flight count) until the state
//! machine says remove, which it only does with nothing in flight (or on IP reuse). A pod that
//! comes back is therefore never handed more than its share. The tracker-per-revision limit
//! refuses new pods beyond [`Limits::max_trackers_per_revision`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use kactivator_api::RevisionKey;
use kactivator_shards::routing::priority::PriorityPolicy;
use kactivator_shards::routing::{
    LbPolicy, PodTracker, Protocol, RevisionLabels, RevisionRoute, RoutingUpdate, Timeouts,
};
use kactivator_shards::runtime::control_link::EvidenceKind;
use kactivator_shards::throttle::gate::{ProcessQueue, RevisionGate};
use kactivator_shards::throttle::slots::UNLIMITED;

use crate::capacity::{revision_capacity, Capacity, Targets};
use crate::pod_state::{Event, Gates, Outcome, Pod, PodState, Reason, Timestamp, Windows};
use crate::subsetting;

/// Default most pod trackers one revision may have: 5000, the fork's `maxTrackersPerRevision`.
pub const DEFAULT_MAX_TRACKERS_PER_REVISION: usize = 5000;

/// Port a bare pod IP maps to when its revision is not declared yet, and a revision's default
/// for HTTP/1 pods: 8012, Knative's `networking.BackendHTTPPort` (the queue-proxy's HTTP/1 port).
pub const DEFAULT_SERVING_PORT: u16 = 8012;

/// A revision's default serving port for h2c pods: 8013, Knative's
/// `networking.BackendHTTP2Port`.
pub const DEFAULT_H2C_SERVING_PORT: u16 = 8013;

/// How a revision routes, from a source, without its pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevisionSpec {
    pub key: RevisionKey,
    /// Metric labels; `namespace` and `revision` agree with `key`.
    pub labels: RevisionLabels,
    pub container_concurrency: u32,
    pub protocol: Protocol,
    pub timeouts: Timeouts,
    pub lb_policy: LbPolicy,
    /// Most requests that may wait for the revision.
    pub queue_depth: u32,
    /// Priority bands and fairness among the revision's waiters; `None` (the default):
    /// arrival order. Checked by the source (`PriorityPolicy::check`). Boxed: few revisions
    /// have one, and every spec and op would carry its size.
    pub priority: Option<Box<PriorityPolicy>>,
    /// Port a bare `pod_ip` from a queue-proxy maps to.
    pub serving_port: u16,
    /// Cluster-IP mode: the revision's private Service (`ip:port`). Requests go there, to one
    /// virtual target balanced by kube-proxy or the mesh, instead of to pods; the pods only
    /// count (and are not probed: in a mesh they are not reachable).
    pub cluster_ip: Option<SocketAddr>,
}

/// Which pods a source's omission speaks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OmissionScope {
    /// The source sees every pod (Kubernetes endpoints): a pod it does not list is omitted.
    AllPods,
    /// The source only knows the pods it lists (the standalone file): omission applies to pods it
    /// listed before, not to pods that only a queue-proxy ever announced.
    ListedPods,
}

/// The activators sharing the revisions' pods, for subsetting.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Activators {
    /// This activator's IP; `None` = alone (every pod with its whole containerConcurrency).
    pub me: Option<IpAddr>,
    /// Every activator's IP, this one included.
    pub all: Vec<IpAddr>,
}

/// Where a queue-proxy event points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodTarget {
    /// A bare IP: the revision's serving port is added.
    Ip(IpAddr),
    Addr(SocketAddr),
}

/// Who said so, for the transition metric's `source` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    QueueProxy,
    Informer,
    Prober,
    Proxy,
    Timer,
    Housekeeping,
}

impl Source {
    pub fn label(self) -> &'static str {
        match self {
            Source::QueueProxy => "qp_push",
            Source::Informer => "informer",
            Source::Prober => "prober",
            Source::Proxy => "proxy",
            Source::Timer => "timer",
            Source::Housekeeping => "housekeeping",
        }
    }
}

/// One unit of work for the state worker.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Declares a revision or changes how it routes.
    UpsertRevision(RevisionSpec),
    /// The revision is gone: it leaves routing and its trackers are forgotten (requests in
    /// flight hold their own handles and finish). Idempotent.
    RemoveRevision { revision: RevisionKey },
    /// A source's view of one revision's ready pods (the informer's view: listing promotes,
    /// omission demotes or removes, within `scope`).
    SetEndpoints {
        revision: RevisionKey,
        ready: Vec<SocketAddr>,
        scope: OmissionScope,
    },
    /// The feature gates.
    SetGates(Gates),
    /// The process-wide cap on waiting requests (`activator.max-queued-requests`), as asked:
    /// above [`Limits::queue_ceiling`] it is lowered to the ceiling, and
    /// [`Journal::QueueCapLowered`] says so.
    SetMaxQueuedRequests(u32),
    /// The activators sharing every revision's pods, unless a revision has its own.
    SetActivators(Activators),
    /// The activators sharing one revision's pods (its public endpoints); `None` falls back to
    /// the ones of [`Op::SetActivators`].
    SetRevisionActivators {
        revision: RevisionKey,
        activators: Option<Activators>,
    },
    /// A pod event: queue-proxy push, health result, request outcome, quarantine expiry.
    MutatePod {
        revision: RevisionKey,
        target: PodTarget,
        event: Event,
        source: Source,
    },
    /// Delete a tracker whatever its state (IP reuse). Idempotent.
    RemovePod {
        revision: RevisionKey,
        addr: SocketAddr,
        reason: Reason,
        source: Source,
    },
    /// What a request found out about a pod (the shards' evidence). Applies only while `tracker`
    /// (a [`PodTracker::id`]) is still the tracker at `addr`.
    Evidence {
        revision: RevisionKey,
        addr: SocketAddr,
        tracker: u64,
        kind: EvidenceKind,
    },
    /// Collect NotReady trackers that have been idle for 10 minutes.
    CleanupStale,
    /// Several ops applied as one: published once, at the end.
    Batch(Vec<Op>),
    /// Does nothing; answering it proves every earlier op was applied.
    Noop,
}

impl Op {
    /// The `op_type` metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Op::UpsertRevision(_) => "upsert_revision",
            Op::RemoveRevision { .. } => "remove_revision",
            Op::SetEndpoints { .. } => "set_endpoints",
            Op::SetGates(_) => "set_gates",
            Op::SetMaxQueuedRequests(_) => "set_max_queued_requests",
            Op::SetActivators(_) => "set_activators",
            Op::SetRevisionActivators { .. } => "set_revision_activators",
            Op::MutatePod { .. } => "mutate_pod",
            Op::RemovePod { .. } => "remove_pod",
            Op::Evidence { .. } => "evidence",
            Op::CleanupStale => "cleanup_stale",
            Op::Batch(_) => "batch",
            Op::Noop => "noop",
        }
    }
}

/// Most revisions known only from queue-proxy events (no source declared them yet): without a
/// bound, registrations naming made-up revisions would grow the state without end.
pub const MAX_UNDECLARED_REVISIONS: usize = 1000;

/// Why an op was not applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpError {
    #[error("revision {0} already tracks its limit of {1} pods")]
    TrackerLimit(RevisionKey, usize),
    #[error(
        "revision {0} is not known, and {1} unknown revisions are already waiting to be declared"
    )]
    TooManyUndeclared(RevisionKey, usize),
}

/// Facts for the metrics, in the order they happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Journal {
    /// A pod changed state; `to = None` is a removal.
    Transition {
        revision: RevisionKey,
        pod: SocketAddr,
        from: Option<PodState>,
        to: Option<PodState>,
        reason: Reason,
        source: Source,
    },
    /// A new pod was refused because its revision is at its tracker limit.
    TrackerLimit { revision: RevisionKey },
    /// A route was published: how many pods this activator routes to (cluster-IP mode: the
    /// routable pods behind the Service) and its capacity over them.
    Route {
        revision: RevisionKey,
        pods: usize,
        capacity: Capacity,
    },
    /// A revision left routing.
    RouteRemoved { revision: RevisionKey },
    /// [`Op::SetMaxQueuedRequests`] asked for more queued requests than the memory limit holds
    /// beside the other caps; the cap is `ceiling` instead.
    QueueCapLowered { asked: u32, ceiling: u32 },
}

/// A tracker's capacity, as this state decided it: the shell sets it on the tracker's slots,
/// which every shard reads.
#[derive(Clone, Debug)]
pub struct CapacityChange {
    pub tracker: Arc<PodTracker>,
    /// Its share of the revision's concurrency while it is in the route; 0 outside it.
    pub slots: u32,
}

/// What must change outside the state after the ops applied since the last
/// [`ControlState::take_effects`]. The shell carries out `capacities` and
/// `max_queued_requests` before it publishes `updates`; the rest in any order.
#[derive(Debug, Default)]
pub struct Effects {
    /// Trackers' capacities, in the order decided (a later one for the same tracker wins). Set
    /// **before** `updates` are published: a tracker leaving a route then takes no new request
    /// from any shard, even one that has not applied the update yet, and a tracker joining a
    /// route has its slots when a shard first sees it.
    pub capacities: Vec<CapacityChange>,
    /// The process queue's new limit, when an op changed it.
    pub max_queued_requests: Option<u32>,
    /// Routing updates for every shard, in version order.
    pub updates: Vec<RoutingUpdate>,
    /// Probe sets that changed, for the prober, in the order they changed.
    pub probe_updates: Vec<ProbeUpdate>,
    /// Facts for the metrics, in the order they happened.
    pub journal: Vec<Journal>,
}

/// Tunables.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_trackers_per_revision: usize,
    pub windows: Windows,
    /// The most the process queue's cap may be: the queued requests the memory limit holds
    /// beside the other caps ([`crate::budget::Budget::queue_ceiling`]). `None` (the default):
    /// no memory limit, no ceiling.
    pub queue_ceiling: Option<u32>,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_trackers_per_revision: DEFAULT_MAX_TRACKERS_PER_REVISION,
            windows: Windows::default(),
            queue_ceiling: None,
        }
    }
}

struct TrackedPod {
    pod: Pod,
    tracker: Arc<PodTracker>,
    /// The capacity last decided for `tracker` (see [`decide`]).
    capacity: u32,
    /// The source listed this pod at some point (its omission then counts).
    listed: bool,
}

impl TrackedPod {
    /// A pod just tracked, with a new tracker at capacity 0.
    fn new(pod: Pod, addr: SocketAddr, listed: bool) -> TrackedPod {
        TrackedPod {
            pod,
            tracker: Arc::new(PodTracker::new(addr, 0)),
            capacity: 0,
            listed,
        }
    }
}

/// Cluster-IP mode's one target, the revision's private Service.
struct VirtualTracker {
    tracker: Arc<PodTracker>,
    /// The capacity last decided for `tracker` (see [`decide`]).
    capacity: u32,
}

struct Revision {
    key: RevisionKey,
    /// `None` until a source declares the revision; queue-proxy pods wait here meanwhile.
    spec: Option<RevisionSpec>,
    pods: BTreeMap<SocketAddr, TrackedPod>,
    gate: Arc<RevisionGate>,
    /// This revision's own activators (its public endpoints); `None` = the default set.
    activators: Option<Activators>,
    /// Cluster-IP mode's one target; kept across publishes so its in-flight count carries over.
    virtual_tracker: Option<VirtualTracker>,
    /// Spec and targets (tracker, capacity) of the last published route, to skip identical
    /// republishes.
    published: Option<(RevisionSpec, Vec<(u64, u32)>)>,
    /// The probe set last sent to the prober (empty: none sent, or an empty one).
    probe_set: Vec<ProbePod>,
    /// The protocol it was sent with.
    probe_protocol: Protocol,
}

impl Revision {
    /// A revision seen for the first time, with no spec and no pods yet.
    fn new(key: RevisionKey, shards: usize, process_queue: &Arc<ProcessQueue>) -> Revision {
        Revision {
            key,
            spec: None,
            pods: BTreeMap::new(),
            gate: Arc::new(RevisionGate::with_process_queue(
                shards,
                process_queue.clone(),
            )),
            activators: None,
            virtual_tracker: None,
            published: None,
            probe_set: Vec::new(),
            probe_protocol: Protocol::default(),
        }
    }
}

/// One pod of a revision's probe set ([`ProbeUpdate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ProbePod {
    pub addr: SocketAddr,
    /// The pod's tracker: a new pod at the same address has another one.
    pub tracker: u64,
    /// On probation (not routable): a passing probe makes it Ready.
    pub recovering: bool,
}

/// A revision's probe set, sent to the prober when it changed: the pods the active health
/// check watches (quarantine on, pod mode: Ready and Recovering pods), and the protocol they
/// are probed in. Empty when none is to be probed any more (the revision is gone, moved to
/// cluster-IP mode, or quarantine is off).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeUpdate {
    pub revision: RevisionKey,
    /// The revision's protocol (HTTP/1 while no source declared it): h2c pods are probed over
    /// h2c, the others over HTTP/1.1.
    pub protocol: Protocol,
    /// Sorted by address.
    pub pods: Vec<ProbePod>,
}

/// The control plane's whole state, owned by the state worker: every revision with its pod
/// trackers and admission gate, the feature gates, the activators sharing the pods, and what
/// is waiting to be carried out.
pub struct ControlState {
    revisions: BTreeMap<RevisionKey, Revision>,
    gates: Gates,
    limits: Limits,
    /// The default activator set (a revision may have its own).
    activators: Activators,
    shards: usize,
    /// Shared by every revision's gate; this state only hands it to the gates it makes.
    process_queue: Arc<ProcessQueue>,
    /// The process queue's limit as last decided.
    max_queued_requests: u32,
    version: u64,
    /// What the shell has yet to carry out.
    effects: Effects,
    /// Quarantined pods by the time their quarantine ends.
    quarantine_ends: BTreeSet<(Timestamp, RevisionKey, SocketAddr)>,
    /// Revisions an op touched, re-derived and published when the op is done.
    dirty: BTreeSet<RevisionKey>,
}

impl ControlState {
    /// An empty state for `shards` shards. `process_queue` is the queue every revision's gate
    /// shares; its limit when this is called is the one in force until an op changes it.
    pub fn new(
        shards: usize,
        gates: Gates,
        limits: Limits,
        process_queue: Arc<ProcessQueue>,
    ) -> ControlState {
        ControlState {
            revisions: BTreeMap::new(),
            gates,
            limits,
            activators: Activators::default(),
            shards,
            max_queued_requests: process_queue.limit(),
            process_queue,
            version: 0,
            effects: Effects::default(),
            quarantine_ends: BTreeSet::new(),
            dirty: BTreeSet::new(),
        }
    }

    pub fn gates(&self) -> Gates {
        self.gates
    }

    /// Revisions a source declared.
    pub fn revision_count(&self) -> usize {
        self.revisions.values().filter(|r| r.spec.is_some()).count()
    }

    /// What must change outside the state since the last call (see [`Effects`] for what to
    /// carry out first).
    pub fn take_effects(&mut self) -> Effects {
        std::mem::take(&mut self.effects)
    }

    /// The earliest quarantine end still pending.
    pub fn next_deadline(&self) -> Option<Timestamp> {
        self.quarantine_ends.first().map(|(at, _, _)| *at)
    }

    /// A pod's state, for tests and diagnostics.
    pub fn pod_state(&self, revision: &RevisionKey, addr: SocketAddr) -> Option<PodState> {
        self.revisions
            .get(revision)?
            .pods
            .get(&addr)
            .map(|tracked| tracked.pod.state())
    }

    /// Number of pods per state over all revisions, recounted. Production folds the journal
    /// instead (the shell's `activator_pod_trackers`); tests check the two agree.
    #[cfg(test)]
    pub fn state_counts(&self) -> BTreeMap<&'static str, usize> {
        let mut counts = BTreeMap::new();
        for revision in self.revisions.values() {
            for tracked in revision.pods.values() {
                *counts.entry(tracked.pod.state().label()).or_default() += 1;
            }
        }
        counts
    }

    /// Every revision's probe set, recounted from scratch. Production derives only the
    /// revisions an op touched ([`Effects::probe_updates`]); tests check the two agree.
    #[cfg(test)]
    pub fn recount_probe_sets(&self) -> BTreeMap<RevisionKey, (Protocol, Vec<ProbePod>)> {
        self.revisions
            .values()
            .map(|revision| (revision.key.clone(), derive_probes(revision, self.gates)))
            .filter(|(_, (_, pods))| !pods.is_empty())
            .collect()
    }

    /// Applies one op at `now`, then publishes what it changed.
    pub fn apply(&mut self, op: Op, now: Timestamp) -> Result<(), OpError> {
        let result = self.apply_op(op, now);
        self.publish_dirty();
        result
    }

    /// Moves every quarantine that has ended by `now` to Recovering.
    pub fn expire_quarantines(&mut self, now: Timestamp) {
        while let Some((at, key, addr)) = self.quarantine_ends.first().cloned() {
            if at > now {
                break;
            }
            self.quarantine_ends.pop_first();
            let Some(entry) = self.revisions.get_mut(&key) else {
                continue;
            };
            let Some(tracked) = entry.pods.get_mut(&addr) else {
                continue;
            };
            let outcome = tracked.pod.apply(
                Event::QuarantineExpired,
                self.gates,
                self.limits.windows,
                now,
            );
            self.record(&key, addr, outcome, Source::Timer, now);
        }
        self.publish_dirty();
    }

    /// Re-publishes every revision from scratch, every tracker's capacity and the queue limit
    /// included: after a worker restart the last op may have stopped half-way, or its effects
    /// may have been lost with it, and this makes the shards agree with the state again.
    pub fn republish_everything(&mut self) {
        for revision in self.revisions.values_mut() {
            revision.published = None;
            let pods = revision
                .pods
                .values()
                .map(|tracked| (&tracked.tracker, tracked.capacity));
            let service = revision
                .virtual_tracker
                .as_ref()
                .map(|service| (&service.tracker, service.capacity));
            for (tracker, slots) in pods.chain(service) {
                self.effects.capacities.push(CapacityChange {
                    tracker: tracker.clone(),
                    slots,
                });
            }
        }
        self.effects.max_queued_requests = Some(self.max_queued_requests);
        self.mark_all_dirty();
        self.publish_dirty();
    }

    fn apply_op(&mut self, op: Op, now: Timestamp) -> Result<(), OpError> {
        match op {
            Op::UpsertRevision(spec) => {
                let key = spec.key.clone();
                let entry = self.entry(&key);
                if entry.spec.as_ref() != Some(&spec) {
                    entry.spec = Some(spec);
                    self.dirty.insert(key);
                }
                Ok(())
            }
            Op::RemoveRevision { revision } => {
                self.remove_revision(&revision);
                Ok(())
            }
            Op::SetEndpoints {
                revision,
                ready,
                scope,
            } => {
                self.set_endpoints(&revision, ready, scope, now);
                Ok(())
            }
            Op::SetGates(gates) => {
                if gates != self.gates {
                    self.gates = gates;
                    if !gates.pod_quarantine {
                        // No quarantine timers run with the gate off; pods left Quarantined wait
                        // for the informer or a QP `ready` (see pod_state's table).
                        self.quarantine_ends.clear();
                    }
                    self.mark_all_dirty();
                }
                Ok(())
            }
            Op::SetMaxQueuedRequests(asked) => {
                let limit = match self.limits.queue_ceiling {
                    Some(ceiling) if asked > ceiling => {
                        self.effects
                            .journal
                            .push(Journal::QueueCapLowered { asked, ceiling });
                        ceiling
                    }
                    _ => asked,
                };
                if limit != self.max_queued_requests {
                    self.max_queued_requests = limit;
                    self.effects.max_queued_requests = Some(limit);
                }
                Ok(())
            }
            Op::SetActivators(activators) => {
                if activators != self.activators {
                    self.activators = activators;
                    let affected: Vec<RevisionKey> = self
                        .revisions
                        .values()
                        .filter(|entry| entry.activators.is_none())
                        .map(|entry| entry.key.clone())
                        .collect();
                    self.dirty.extend(affected);
                }
                Ok(())
            }
            Op::SetRevisionActivators {
                revision,
                activators,
            } => {
                let entry = self.entry(&revision);
                if entry.activators != activators {
                    entry.activators = activators;
                    self.dirty.insert(revision);
                }
                Ok(())
            }
            Op::MutatePod {
                revision,
                target,
                event,
                source,
            } => self.mutate_pod(&revision, target, event, source, now),
            Op::RemovePod {
                revision,
                addr,
                reason,
                source,
            } => {
                self.remove_pod(&revision, addr, reason, source);
                Ok(())
            }
            Op::Evidence {
                revision,
                addr,
                tracker,
                kind,
            } => {
                let Some(entry) = self.revisions.get_mut(&revision) else {
                    return Ok(());
                };
                if entry
                    .virtual_tracker
                    .as_ref()
                    .is_some_and(|service| service.tracker.id == tracker)
                {
                    // About cluster-IP mode's Service: no pod to blame.
                    return Ok(());
                }
                let current = entry
                    .pods
                    .get(&addr)
                    .is_some_and(|tracked| tracked.tracker.id == tracker);
                if !current {
                    // About a tracker that is gone or was replaced: nothing to say any more.
                    return Ok(());
                }
                match kind {
                    EvidenceKind::TransportFailure => self.mutate_pod(
                        &revision,
                        PodTarget::Addr(addr),
                        Event::HealthCheckFailed,
                        Source::Proxy,
                        now,
                    ),
                }
            }
            Op::CleanupStale => {
                self.cleanup_stale(now);
                Ok(())
            }
            Op::Batch(ops) => {
                let mut first_error = Ok(());
                for op in ops {
                    let result = self.apply_op(op, now);
                    if first_error.is_ok() {
                        first_error = result;
                    }
                }
                first_error
            }
            Op::Noop => Ok(()),
        }
    }

    /// The revision's entry, created (undeclared) when it is new.
    fn entry(&mut self, key: &RevisionKey) -> &mut Revision {
        entry_of(&mut self.revisions, key, self.shards, &self.process_queue)
    }

    fn mark_all_dirty(&mut self) {
        self.dirty.extend(self.revisions.keys().cloned());
    }

    fn remove_revision(&mut self, key: &RevisionKey) {
        let Some(entry) = self.revisions.remove(key) else {
            return;
        };
        if !entry.probe_set.is_empty() {
            self.effects.probe_updates.push(ProbeUpdate {
                revision: key.clone(),
                protocol: entry.probe_protocol,
                pods: Vec::new(),
            });
        }
        for (addr, tracked) in entry.pods {
            let from = tracked.pod.state();
            forget(
                &mut self.effects,
                key,
                addr,
                tracked,
                from,
                Reason::InformerRemoved,
                Source::Informer,
            );
        }
        if let Some(mut service) = entry.virtual_tracker {
            decide(
                &mut self.effects.capacities,
                &service.tracker,
                &mut service.capacity,
                0,
            );
        }
        if entry.spec.is_some() {
            self.effects.journal.push(Journal::RouteRemoved {
                revision: key.clone(),
            });
            self.version += 1;
            self.effects.updates.push(RoutingUpdate::Remove {
                version: self.version,
                key: key.clone(),
            });
        }
    }

    fn remove_pod(&mut self, key: &RevisionKey, addr: SocketAddr, reason: Reason, source: Source) {
        if let Some(tracked) = self
            .revisions
            .get_mut(key)
            .and_then(|entry| entry.pods.remove(&addr))
        {
            let from = tracked.pod.state();
            forget(&mut self.effects, key, addr, tracked, from, reason, source);
            self.dirty.insert(key.clone());
        }
    }

    fn mutate_pod(
        &mut self,
        key: &RevisionKey,
        target: PodTarget,
        event: Event,
        source: Source,
        now: Timestamp,
    ) -> Result<(), OpError> {
        if !self.revisions.contains_key(key) {
            let undeclared = self
                .revisions
                .values()
                .filter(|entry| entry.spec.is_none())
                .count();
            if undeclared >= MAX_UNDECLARED_REVISIONS {
                return Err(OpError::TooManyUndeclared(key.clone(), undeclared));
            }
        }
        let (gates, windows, max_trackers) = (
            self.gates,
            self.limits.windows,
            self.limits.max_trackers_per_revision,
        );
        let entry = entry_of(&mut self.revisions, key, self.shards, &self.process_queue);
        let addr = match target {
            PodTarget::Addr(addr) => addr,
            PodTarget::Ip(ip) => SocketAddr::new(
                ip,
                entry
                    .spec
                    .as_ref()
                    .map_or(DEFAULT_SERVING_PORT, |spec| spec.serving_port),
            ),
        };
        match entry.pods.get_mut(&addr) {
            Some(tracked) => {
                let outcome = tracked.pod.apply(event, gates, windows, now);
                self.record(key, addr, outcome, source, now);
            }
            None => {
                let Some(pod) = Pod::first_seen(event, gates, now) else {
                    return Ok(());
                };
                if entry.pods.len() >= max_trackers {
                    self.effects.journal.push(Journal::TrackerLimit {
                        revision: key.clone(),
                    });
                    return Err(OpError::TrackerLimit(key.clone(), max_trackers));
                }
                self.effects.journal.push(Journal::Transition {
                    revision: key.clone(),
                    pod: addr,
                    from: None,
                    to: Some(pod.state()),
                    reason: pod.reason(),
                    source,
                });
                entry.pods.insert(addr, TrackedPod::new(pod, addr, false));
                self.dirty.insert(key.clone());
            }
        }
        Ok(())
    }

    fn set_endpoints(
        &mut self,
        key: &RevisionKey,
        ready: Vec<SocketAddr>,
        scope: OmissionScope,
        now: Timestamp,
    ) {
        let (gates, windows, max_trackers) = (
            self.gates,
            self.limits.windows,
            self.limits.max_trackers_per_revision,
        );
        let entry = self.entry(key);
        let listed: BTreeSet<SocketAddr> = ready.into_iter().collect();
        let mut outcomes = Vec::new();
        let mut journal = Vec::new();
        for addr in &listed {
            match entry.pods.get_mut(addr) {
                Some(tracked) => {
                    tracked.listed = true;
                    let outcome = tracked
                        .pod
                        .apply(Event::InformerListed, gates, windows, now);
                    outcomes.push((*addr, outcome));
                }
                None => {
                    if entry.pods.len() >= max_trackers {
                        journal.push(Journal::TrackerLimit {
                            revision: key.clone(),
                        });
                        continue;
                    }
                    if let Some(pod) = Pod::first_seen(Event::InformerListed, gates, now) {
                        journal.push(Journal::Transition {
                            revision: key.clone(),
                            pod: *addr,
                            from: None,
                            to: Some(pod.state()),
                            reason: pod.reason(),
                            source: Source::Informer,
                        });
                        entry.pods.insert(*addr, TrackedPod::new(pod, *addr, true));
                    }
                }
            }
        }
        for (addr, tracked) in entry.pods.iter_mut() {
            if listed.contains(addr) {
                continue;
            }
            if scope == OmissionScope::ListedPods && !tracked.listed {
                continue;
            }
            let in_flight = tracked.tracker.in_flight();
            let outcome =
                tracked
                    .pod
                    .apply(Event::InformerOmitted { in_flight }, gates, windows, now);
            outcomes.push((*addr, outcome));
        }
        self.effects.journal.extend(journal);
        for (addr, outcome) in outcomes {
            self.record(key, addr, outcome, Source::Informer, now);
        }
        self.dirty.insert(key.clone());
    }

    fn cleanup_stale(&mut self, now: Timestamp) {
        let keys: Vec<RevisionKey> = self.revisions.keys().cloned().collect();
        for key in keys {
            let Some(entry) = self.revisions.get_mut(&key) else {
                continue;
            };
            let stale: Vec<SocketAddr> = entry
                .pods
                .iter()
                .filter(|(_, tracked)| tracked.pod.is_stale(now, tracked.tracker.in_flight()))
                .map(|(addr, _)| *addr)
                .collect();
            for addr in stale {
                if let Some(tracked) = entry.pods.remove(&addr) {
                    let from = tracked.pod.state();
                    forget(
                        &mut self.effects,
                        &key,
                        addr,
                        tracked,
                        from,
                        Reason::Stale,
                        Source::Housekeeping,
                    );
                }
            }
            // A revision only queue-proxies mentioned, with nothing left, is forgotten.
            if entry.spec.is_none() && entry.pods.is_empty() && entry.activators.is_none() {
                self.revisions.remove(&key);
            }
        }
    }

    /// Journals an outcome and applies a removal; keeps the quarantine timers in step and
    /// marks the revision for publishing.
    fn record(
        &mut self,
        key: &RevisionKey,
        addr: SocketAddr,
        outcome: Outcome,
        source: Source,
        now: Timestamp,
    ) {
        let Some(entry) = self.revisions.get_mut(key) else {
            return;
        };
        match outcome {
            Outcome::Unchanged => {}
            Outcome::Transition { from, to, reason } => {
                self.effects.journal.push(Journal::Transition {
                    revision: key.clone(),
                    pod: addr,
                    from: Some(from),
                    to: Some(to),
                    reason,
                    source,
                });
                if to == PodState::Quarantined {
                    if let Some(until) = entry
                        .pods
                        .get(&addr)
                        .and_then(|tracked| tracked.pod.quarantine_until())
                    {
                        self.quarantine_ends
                            .insert((until.max(now), key.clone(), addr));
                    }
                }
                self.dirty.insert(key.clone());
            }
            Outcome::Remove { from, reason } => {
                if let Some(tracked) = entry.pods.remove(&addr) {
                    forget(&mut self.effects, key, addr, tracked, from, reason, source);
                }
                self.dirty.insert(key.clone());
            }
        }
    }

    fn publish_dirty(&mut self) {
        for key in std::mem::take(&mut self.dirty) {
            self.send_probes(&key);
            self.publish(&key);
        }
    }

    /// Sends `key`'s probe set to the prober if it changed. Costs the revision's pods, never
    /// the whole table: one pod's event at 50 000 pods derives one revision.
    fn send_probes(&mut self, key: &RevisionKey) {
        let Some(entry) = self.revisions.get_mut(key) else {
            return;
        };
        let (protocol, pods) = derive_probes(entry, self.gates);
        // An empty set is empty in any protocol.
        let protocol_changed = protocol != entry.probe_protocol && !pods.is_empty();
        if pods != entry.probe_set || protocol_changed {
            entry.probe_set = pods.clone();
            entry.probe_protocol = protocol;
            self.effects.probe_updates.push(ProbeUpdate {
                revision: key.clone(),
                protocol,
                pods,
            });
        }
    }

    /// Publishes `key`'s route if it differs from the last one published, and decides the
    /// capacity of every tracker of the revision: its share in the route, 0 outside it.
    fn publish(&mut self, key: &RevisionKey) {
        let Some(entry) = self.revisions.get_mut(key) else {
            return;
        };
        let Some(spec) = entry.spec.clone() else {
            return;
        };
        let activators = entry.activators.as_ref().unwrap_or(&self.activators);
        let plan = plan_route(entry, &spec, activators);
        let capacities = &mut self.effects.capacities;
        keep_virtual_tracker(entry, spec.cluster_ip, capacities);
        let trackers = route_trackers(entry, &plan.targets);
        // The same addresses with other trackers (a pod replaced at its address) is a change.
        let published: Vec<(u64, u32)> = trackers
            .iter()
            .zip(&plan.targets)
            .map(|(tracker, (_, slots))| (tracker.id, *slots))
            .collect();
        if entry
            .published
            .as_ref()
            .is_some_and(|(published_spec, last)| *published_spec == spec && *last == published)
        {
            return;
        }
        decide_capacities(entry, &plan.targets, capacities);
        let route = RevisionRoute {
            key: key.clone(),
            labels: spec.labels.clone(),
            container_concurrency: spec.container_concurrency,
            protocol: spec.protocol,
            timeouts: spec.timeouts,
            lb_policy: spec.lb_policy,
            pods: trackers,
            gate: entry.gate.clone(),
            queue_depth: spec.queue_depth,
            priority: spec.priority.as_deref().cloned(),
        };
        self.effects.journal.push(Journal::Route {
            revision: key.clone(),
            pods: plan.pods,
            capacity: plan.capacity,
        });
        entry.published = Some((spec, published));
        self.version += 1;
        self.effects.updates.push(RoutingUpdate::Upsert {
            version: self.version,
            route: Arc::new(route),
        });
    }
}

// === Publishing a route, step by step ===

/// A route's targets before its trackers are chosen.
struct RoutePlan {
    /// Each target's address and this activator's slots on it, in address order. Cluster-IP
    /// mode: the Service alone, or nothing while no pod is ready (or the share is 0).
    targets: Vec<(SocketAddr, u32)>,
    /// The revision's capacity over them.
    capacity: Capacity,
    /// How many pods this activator routes to (cluster-IP mode: the routable pods behind the
    /// Service).
    pods: usize,
}

/// Step 1: the routable pods, this activator's share of them (`subsetting::assign`; alone,
/// every pod with its whole containerConcurrency) and the slots on each, through the one
/// capacity rule (`revision_capacity`). Cluster-IP mode: one target, the Service, with
/// `max(1, CC × routable pods / activators)` slots.
fn plan_route(revision: &Revision, spec: &RevisionSpec, activators: &Activators) -> RoutePlan {
    let container_concurrency = spec.container_concurrency;
    let routable: Vec<SocketAddr> = revision
        .pods
        .iter()
        .filter(|(_, tracked)| tracked.pod.is_routable())
        .map(|(addr, _)| *addr)
        .collect();
    match spec.cluster_ip {
        Some(service) => {
            let capacity = revision_capacity(
                container_concurrency,
                Targets::ClusterIp {
                    ready_pods: routable.len(),
                    activators: activators.all.len(),
                },
            );
            let slots = match capacity {
                Capacity::Unlimited => UNLIMITED,
                Capacity::Limited(slots) => slots,
            };
            let targets = if slots > 0 {
                vec![(service, slots)]
            } else {
                Vec::new()
            };
            RoutePlan {
                targets,
                capacity,
                pods: routable.len(),
            }
        }
        None => {
            let assignments = match activators.me {
                Some(me) => {
                    subsetting::assign(&routable, &activators.all, me, container_concurrency)
                }
                None => routable
                    .iter()
                    .map(|&pod| subsetting::Assignment {
                        pod,
                        share: container_concurrency,
                    })
                    .collect(),
            };
            let capacity = revision_capacity(container_concurrency, Targets::Pods(&assignments));
            let targets: Vec<(SocketAddr, u32)> = assignments
                .iter()
                .map(|assignment| {
                    let slots = match container_concurrency {
                        0 => UNLIMITED,
                        _ => assignment.share,
                    };
                    (assignment.pod, slots)
                })
                .collect();
            RoutePlan {
                pods: targets.len(),
                targets,
                capacity,
            }
        }
    }
}

/// Step 2, cluster-IP mode's target: the Service's tracker is kept while the Service stays at
/// the same address, so its in-flight count carries over. One it replaces, or one left from
/// cluster-IP mode, takes nothing new (capacity 0).
fn keep_virtual_tracker(
    revision: &mut Revision,
    service: Option<SocketAddr>,
    capacities: &mut Vec<CapacityChange>,
) {
    revision.virtual_tracker = match (revision.virtual_tracker.take(), service) {
        (Some(kept), Some(service)) if kept.tracker.addr == service => Some(kept),
        (replaced, service) => {
            if let Some(mut old) = replaced {
                decide(capacities, &old.tracker, &mut old.capacity, 0);
            }
            service.map(|service| VirtualTracker {
                tracker: Arc::new(PodTracker::new(service, 0)),
                capacity: 0,
            })
        }
    };
}

/// Step 3: the trackers the route carries, one per target: the Service's in cluster-IP mode,
/// else each pod's.
fn route_trackers(revision: &Revision, targets: &[(SocketAddr, u32)]) -> Vec<Arc<PodTracker>> {
    match &revision.virtual_tracker {
        Some(service) if !targets.is_empty() => vec![service.tracker.clone()],
        Some(_) => Vec::new(),
        // Every target is a routable pod of this revision, so the lookup finds it.
        None => targets
            .iter()
            .map(|(addr, _)| revision.pods[addr].tracker.clone())
            .collect(),
    }
}

/// Step 4 (once the route is known to have changed): every tracker's capacity, its share in
/// the route and 0 outside it. Trackers outside keep counting their in-flight requests but
/// take no new ones through a stale replica.
fn decide_capacities(
    revision: &mut Revision,
    targets: &[(SocketAddr, u32)],
    capacities: &mut Vec<CapacityChange>,
) {
    // Looked up per pod: a sorted copy keeps that logarithmic (a scan made it quadratic in
    // the revision's pods).
    let mut sorted_targets = targets.to_vec();
    sorted_targets.sort_unstable_by_key(|(addr, _)| *addr);
    let share_of = |addr: &SocketAddr| {
        sorted_targets
            .binary_search_by_key(addr, |(target, _)| *target)
            .map_or(0, |index| sorted_targets[index].1)
    };
    // In cluster-IP mode the pods only count; requests go to the Service.
    let cluster_ip = revision.virtual_tracker.is_some();
    for (addr, tracked) in revision.pods.iter_mut() {
        let slots = if cluster_ip { 0 } else { share_of(addr) };
        decide(capacities, &tracked.tracker, &mut tracked.capacity, slots);
    }
    if let Some(service) = &mut revision.virtual_tracker {
        let slots = share_of(&service.tracker.addr);
        decide(capacities, &service.tracker, &mut service.capacity, slots);
    }
}

/// The pods of `revision` the prober watches: with quarantine on and in pod mode, the Ready ones
/// and those on probation (Recovering: a passing probe makes them Ready). Quarantined pods wait
/// for their quarantine to end; NotReady ones are their queue-proxy's and the informer's. With
/// them, the protocol to probe them in: the revision's (HTTP/1 until a source declares it).
fn derive_probes(revision: &Revision, gates: Gates) -> (Protocol, Vec<ProbePod>) {
    let protocol = revision
        .spec
        .as_ref()
        .map_or(Protocol::default(), |spec| spec.protocol);
    let cluster_ip = revision
        .spec
        .as_ref()
        .is_some_and(|spec| spec.cluster_ip.is_some());
    if !gates.pod_quarantine || cluster_ip {
        return (protocol, Vec::new());
    }
    let pods = revision
        .pods
        .iter()
        .filter_map(|(addr, tracked)| {
            let recovering = match tracked.pod.state() {
                PodState::Ready => false,
                PodState::Recovering => true,
                PodState::NotReady | PodState::Quarantined => return None,
            };
            Some(ProbePod {
                addr: *addr,
                tracker: tracked.tracker.id,
                recovering,
            })
        })
        .collect();
    (protocol, pods)
}

/// Decides `slots` for `tracker`, whose capacity was last decided as `decided`: a change for
/// the shell when it differs. Only a change is sent, so re-deriving a revision of 50 000 pods
/// sets the capacity of the pods whose share moved, not of every pod.
fn decide(
    changes: &mut Vec<CapacityChange>,
    tracker: &Arc<PodTracker>,
    decided: &mut u32,
    slots: u32,
) {
    if *decided != slots {
        *decided = slots;
        changes.push(CapacityChange {
            tracker: tracker.clone(),
            slots,
        });
    }
}

/// `key`'s entry in `revisions`, created (undeclared) when it is new.
fn entry_of<'a>(
    revisions: &'a mut BTreeMap<RevisionKey, Revision>,
    key: &RevisionKey,
    shards: usize,
    process_queue: &Arc<ProcessQueue>,
) -> &'a mut Revision {
    revisions
        .entry(key.clone())
        .or_insert_with(|| Revision::new(key.clone(), shards, process_queue))
}

/// A tracker taken out of the table: its capacity goes to 0, so it takes no new requests from
/// any shard even before the shards apply the update that drops it, and its removal is
/// journaled.
fn forget(
    effects: &mut Effects,
    key: &RevisionKey,
    addr: SocketAddr,
    mut tracked: TrackedPod,
    from: PodState,
    reason: Reason,
    source: Source,
) {
    decide(
        &mut effects.capacities,
        &tracked.tracker,
        &mut tracked.capacity,
        0,
    );
    effects.journal.push(Journal::Transition {
        revision: key.clone(),
        pod: addr,
        from: Some(from),
        to: None,
        reason,
        source,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod_state::QueueProxyEvent;
    use proptest::prelude::*;
    use std::time::Duration;

    fn at(seconds: u64) -> Timestamp {
        Timestamp::from_epoch_offset(Duration::from_secs(seconds))
    }

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    fn key(name: &str) -> RevisionKey {
        RevisionKey::new("ns", name).unwrap()
    }

    fn spec(name: &str, cc: u32) -> RevisionSpec {
        let key = key(name);
        RevisionSpec {
            labels: RevisionLabels {
                namespace: key.namespace().to_string(),
                revision: key.name().to_string(),
                ..RevisionLabels::default()
            },
            key,
            container_concurrency: cc,
            protocol: Protocol::Http1,
            timeouts: Timeouts::default(),
            lb_policy: LbPolicy::default_for(cc),
            queue_depth: 100,
            priority: None,
            serving_port: DEFAULT_SERVING_PORT,
            cluster_ip: None,
        }
    }

    /// What the standalone file sends: the gates, then each revision and its listed pods.
    fn declare(revisions: &[(&str, u32, &[&str])], gates: Gates) -> Op {
        let mut ops = vec![Op::SetGates(gates)];
        for (name, cc, pods) in revisions {
            ops.push(Op::UpsertRevision(spec(name, *cc)));
            ops.push(Op::SetEndpoints {
                revision: key(name),
                ready: pods.iter().map(|pod| addr(pod)).collect(),
                scope: OmissionScope::ListedPods,
            });
        }
        Op::Batch(ops)
    }

    fn qp(name: &str, ip: &str, event: QueueProxyEvent) -> Op {
        Op::MutatePod {
            revision: key(name),
            target: PodTarget::Ip(ip.parse().unwrap()),
            event: Event::QueueProxy(event),
            source: Source::QueueProxy,
        }
    }

    fn health(name: &str, pod: &str, event: Event) -> Op {
        Op::MutatePod {
            revision: key(name),
            target: PodTarget::Addr(addr(pod)),
            event,
            source: Source::Prober,
        }
    }

    fn fresh_state() -> Shelled {
        Shelled::new(ControlState::new(
            2,
            Gates::HYBRID,
            Limits::default(),
            Arc::new(ProcessQueue::new(u32::MAX)),
        ))
    }

    /// The state as the shell drives it: after each op (or expiry) the capacities are set on
    /// the trackers, before a test looks at any route, and the other effects are kept until the
    /// test takes them.
    struct Shelled {
        state: ControlState,
        kept: Effects,
    }

    impl Shelled {
        fn new(state: ControlState) -> Shelled {
            Shelled {
                state,
                kept: Effects::default(),
            }
        }

        fn apply(&mut self, op: Op, now: Timestamp) -> Result<(), OpError> {
            let result = self.state.apply(op, now);
            self.carry_out();
            result
        }

        fn expire_quarantines(&mut self, now: Timestamp) {
            self.state.expire_quarantines(now);
            self.carry_out();
        }

        fn carry_out(&mut self) {
            let effects = self.state.take_effects();
            crate::shell::set_capacities(effects.capacities);
            self.kept.updates.extend(effects.updates);
            self.kept.probe_updates.extend(effects.probe_updates);
            self.kept.journal.extend(effects.journal);
        }

        fn take_updates(&mut self) -> Vec<RoutingUpdate> {
            std::mem::take(&mut self.kept.updates)
        }

        fn take_journal(&mut self) -> Vec<Journal> {
            std::mem::take(&mut self.kept.journal)
        }

        fn take_probe_updates(&mut self) -> Vec<ProbeUpdate> {
            std::mem::take(&mut self.kept.probe_updates)
        }
    }

    impl std::ops::Deref for Shelled {
        type Target = ControlState;

        fn deref(&self) -> &ControlState {
            &self.state
        }
    }

    /// The route of the last update, which must be an upsert.
    fn last_upsert(updates: &[RoutingUpdate]) -> &Arc<RevisionRoute> {
        match updates.last() {
            Some(RoutingUpdate::Upsert { route, .. }) => route,
            other => panic!("expected an upsert last, got {other:?}"),
        }
    }

    /// The pods and capacities of the last route published for `name`.
    fn last_route(updates: &[RoutingUpdate], name: &str) -> Option<Vec<(SocketAddr, u32)>> {
        updates.iter().rev().find_map(|update| match update {
            RoutingUpdate::Upsert { route, .. } if route.labels.revision == name => Some(
                route
                    .pods
                    .iter()
                    .map(|pod| (pod.addr, pod.slots.capacity()))
                    .collect(),
            ),
            _ => None,
        })
    }

    /// The core decides capacities; only the shell writes them. Applying an op leaves every
    /// tracker as it was, and the effects say what to set: each routed pod's share, and 0 for
    /// a pod that left, in the same take as the update that drops it.
    #[test]
    fn capacities_are_effects_the_state_never_writes_itself() {
        let mut state = fresh_state().state;
        let pods = ["10.0.0.1:8012", "10.0.0.2:8012"];
        state
            .apply(declare(&[("a", 2, &pods)], Gates::HYBRID), at(0))
            .unwrap();
        let effects = state.take_effects();
        let route = last_upsert(&effects.updates).clone();
        assert!(
            route.pods.iter().all(|pod| pod.slots.capacity() == 0),
            "the state set no capacity itself"
        );
        let decided: Vec<(SocketAddr, u32)> = effects
            .capacities
            .iter()
            .map(|change| (change.tracker.addr, change.slots))
            .collect();
        assert_eq!(decided, vec![(addr(pods[0]), 2), (addr(pods[1]), 2)]);
        for change in &effects.capacities {
            assert!(route
                .pods
                .iter()
                .any(|pod| Arc::ptr_eq(pod, &change.tracker)));
            change.tracker.slots.set_capacity(change.slots);
        }
        // The same view again: nothing to set, nothing to publish.
        state
            .apply(declare(&[("a", 2, &pods)], Gates::HYBRID), at(1))
            .unwrap();
        let effects = state.take_effects();
        assert!(effects.capacities.is_empty() && effects.updates.is_empty());
        // The second pod leaves: its capacity goes to 0 with the update that drops it, and
        // only the shell's carrying it out makes it so.
        let leaving = route.pods[1].clone();
        state
            .apply(declare(&[("a", 2, &pods[..1])], Gates::HYBRID), at(2))
            .unwrap();
        let effects = state.take_effects();
        assert_eq!(last_route_of(&effects.updates), vec![addr(pods[0])]);
        assert_eq!(leaving.slots.capacity(), 2, "untouched until carried out");
        assert!(effects
            .capacities
            .iter()
            .any(|change| Arc::ptr_eq(&change.tracker, &leaving) && change.slots == 0));
        assert_eq!(
            effects.capacities.len(),
            1,
            "the pod that stays keeps its share"
        );
    }

    fn last_route_of(updates: &[RoutingUpdate]) -> Vec<SocketAddr> {
        last_upsert(updates)
            .pods
            .iter()
            .map(|pod| pod.addr)
            .collect()
    }

    /// A restart after a panic re-sends every decision, in case the panicking op's effects
    /// were lost with it.
    #[test]
    fn republishing_everything_sends_every_capacity_and_the_queue_limit_again() {
        let mut state = fresh_state().state;
        let pods = ["10.0.0.1:8012", "10.0.0.2:8012"];
        state
            .apply(
                Op::Batch(vec![
                    declare(&[("a", 2, &pods)], Gates::HYBRID),
                    Op::SetMaxQueuedRequests(7),
                ]),
                at(0),
            )
            .unwrap();
        state.take_effects();
        state.republish_everything();
        let effects = state.take_effects();
        let decided: Vec<(SocketAddr, u32)> = effects
            .capacities
            .iter()
            .map(|change| (change.tracker.addr, change.slots))
            .collect();
        assert_eq!(decided, vec![(addr(pods[0]), 2), (addr(pods[1]), 2)]);
        assert_eq!(effects.max_queued_requests, Some(7));
        assert_eq!(
            last_route_of(&effects.updates),
            vec![addr(pods[0]), addr(pods[1])]
        );
    }

    /// The capacities an op decided, as (pod, slots) in order.
    fn decided(effects: &Effects) -> Vec<(SocketAddr, u32)> {
        effects
            .capacities
            .iter()
            .map(|change| (change.tracker.addr, change.slots))
            .collect()
    }

    /// A pod that becomes ready gets its share as an effect of the op that made it ready, and
    /// loses it as one when it stops being ready; nothing while it stays out of the route.
    #[test]
    fn a_pod_becoming_ready_or_not_is_a_capacity_effect() {
        let mut state = fresh_state().state;
        let pod = "10.0.0.7:8012";
        state
            .apply(declare(&[("a", 3, &[])], Gates::HYBRID), at(0))
            .unwrap();
        state.take_effects();
        state
            .apply(qp("a", "10.0.0.7", QueueProxyEvent::Startup), at(1))
            .unwrap();
        assert_eq!(decided(&state.take_effects()), [], "not ready: no capacity");
        state
            .apply(qp("a", "10.0.0.7", QueueProxyEvent::Ready), at(2))
            .unwrap();
        assert_eq!(decided(&state.take_effects()), [(addr(pod), 3)]);
        state
            .apply(qp("a", "10.0.0.7", QueueProxyEvent::NotReady), at(3))
            .unwrap();
        assert_eq!(decided(&state.take_effects()), [(addr(pod), 0)]);
    }

    /// Quarantine on simulated time: a failed check takes the pod's capacity at once; the
    /// quarantine's end (probation) gives none back; only a passing probe does.
    #[test]
    fn quarantine_and_recovery_are_capacity_effects_on_simulated_time() {
        let mut state = fresh_state().state;
        let pod = "10.0.0.1:8012";
        state
            .apply(declare(&[("a", 2, &[pod])], Gates::HYBRID), at(0))
            .unwrap();
        assert_eq!(decided(&state.take_effects()), [(addr(pod), 2)]);
        state
            .apply(health("a", pod, Event::HealthCheckFailed), at(10))
            .unwrap();
        assert_eq!(decided(&state.take_effects()), [(addr(pod), 0)]);
        let end = state.next_deadline().expect("quarantined");
        state.expire_quarantines(end);
        let effects = state.take_effects();
        assert!(
            effects.capacities.is_empty(),
            "recovering is not routable: {:?}",
            decided(&effects)
        );
        state
            .apply(health("a", pod, Event::HealthCheckPassed), at(20))
            .unwrap();
        assert_eq!(decided(&state.take_effects()), [(addr(pod), 2)]);
    }

    /// A new containerConcurrency, or a second activator sharing the pods, moves every
    /// routed pod's share: one effect per pod whose share moved.
    #[test]
    fn container_concurrency_and_activator_changes_move_each_share() {
        let mut state = fresh_state().state;
        let pods = ["10.0.0.1:8012", "10.0.0.2:8012"];
        state
            .apply(declare(&[("a", 2, &pods)], Gates::HYBRID), at(0))
            .unwrap();
        state.take_effects();
        state
            .apply(declare(&[("a", 10, &pods)], Gates::HYBRID), at(1))
            .unwrap();
        assert_eq!(
            decided(&state.take_effects()),
            [(addr(pods[0]), 10), (addr(pods[1]), 10)]
        );
        // A second activator: with as many pods as activators each owns one pod whole, so one
        // pod leaves this activator's route (0) and the other keeps its 10: one effect.
        let me: IpAddr = "10.1.0.1".parse().unwrap();
        let other: IpAddr = "10.1.0.2".parse().unwrap();
        state
            .apply(
                Op::SetActivators(Activators {
                    all: vec![me, other],
                    me: Some(me),
                }),
                at(2),
            )
            .unwrap();
        let shares = decided(&state.take_effects());
        assert!(
            matches!(shares.as_slice(), [(pod, 0)] if pods.iter().any(|p| addr(p) == *pod)),
            "{shares:?}"
        );
    }

    /// A revision removed takes every tracker's capacity, its pods' and cluster-IP mode's
    /// Service's, in the take that removes its route.
    #[test]
    fn removing_a_revision_zeroes_every_tracker_it_had() {
        let mut state = fresh_state().state;
        let pods = ["10.0.0.1:8012", "10.0.0.2:8012"];
        state
            .apply(declare(&[("a", 2, &pods)], Gates::HYBRID), at(0))
            .unwrap();
        let service: SocketAddr = "10.96.0.9:80".parse().unwrap();
        state
            .apply(
                Op::UpsertRevision(RevisionSpec {
                    cluster_ip: Some(service),
                    ..spec("b", 2)
                }),
                at(0),
            )
            .unwrap();
        state
            .apply(
                Op::SetEndpoints {
                    revision: key("b"),
                    ready: vec![addr("10.0.1.1:8012")],
                    scope: OmissionScope::ListedPods,
                },
                at(0),
            )
            .unwrap();
        let effects = state.take_effects();
        assert!(
            decided(&effects).contains(&(service, 2)),
            "{:?}",
            decided(&effects)
        );
        for (name, zeroed) in [
            ("a", vec![addr(pods[0]), addr(pods[1])]),
            ("b", vec![service]),
        ] {
            state
                .apply(
                    Op::RemoveRevision {
                        revision: key(name),
                    },
                    at(1),
                )
                .unwrap();
            let effects = state.take_effects();
            assert!(matches!(
                effects.updates.as_slice(),
                [RoutingUpdate::Remove { .. }]
            ));
            let expected: Vec<(SocketAddr, u32)> =
                zeroed.into_iter().map(|addr| (addr, 0)).collect();
            assert_eq!(decided(&effects), expected, "{name}");
        }
    }

    /// With a memory limit, a queue cap asked above what it holds is lowered to it, and the
    /// journal names both figures for the shell's warning; at or below it, it is kept as is.
    #[test]
    fn a_queue_cap_above_the_memory_ceiling_is_lowered_to_it_naming_both() {
        let queue = Arc::new(ProcessQueue::new(100));
        let limits = Limits {
            queue_ceiling: Some(5_000),
            ..Limits::default()
        };
        let mut state = ControlState::new(2, Gates::HYBRID, limits, queue);
        state
            .apply(Op::SetMaxQueuedRequests(u32::MAX), at(0))
            .unwrap();
        let effects = state.take_effects();
        assert_eq!(effects.max_queued_requests, Some(5_000));
        assert_eq!(
            effects.journal,
            [Journal::QueueCapLowered {
                asked: u32::MAX,
                ceiling: 5_000
            }]
        );
        for (asked, limit) in [(5_000, None), (1, Some(1)), (5_001, Some(5_000))] {
            state.apply(Op::SetMaxQueuedRequests(asked), at(1)).unwrap();
            let effects = state.take_effects();
            assert_eq!(effects.max_queued_requests, limit, "{asked}");
            assert_eq!(
                effects.journal.is_empty(),
                asked <= 5_000,
                "{asked}: {:?}",
                effects.journal
            );
        }
    }

    /// `activator.max-queued-requests` has one writer: the op decides, the shell sets it.
    #[test]
    fn the_queue_limit_is_an_effect_of_its_op_when_it_changes() {
        let queue = Arc::new(ProcessQueue::new(100));
        let mut state = ControlState::new(2, Gates::HYBRID, Limits::default(), queue.clone());
        state.apply(Op::SetMaxQueuedRequests(100), at(0)).unwrap();
        assert_eq!(state.take_effects().max_queued_requests, None, "unchanged");
        state.apply(Op::SetMaxQueuedRequests(5), at(1)).unwrap();
        assert_eq!(state.take_effects().max_queued_requests, Some(5));
        assert_eq!(queue.limit(), 100, "the state does not set it itself");
        state.apply(Op::SetMaxQueuedRequests(5), at(2)).unwrap();
        assert_eq!(state.take_effects().max_queued_requests, None);
    }

    #[test]
    fn listed_pods_route_at_once_with_their_whole_concurrency() {
        let mut state = fresh_state();
        state
            .apply(
                declare(
                    &[("a", 2, &["10.0.0.1:8012", "10.0.0.2:8012"])],
                    Gates::HYBRID,
                ),
                at(0),
            )
            .unwrap();
        let updates = state.take_updates();
        assert_eq!(
            last_route(&updates, "a").unwrap(),
            vec![(addr("10.0.0.1:8012"), 2), (addr("10.0.0.2:8012"), 2)]
        );
        // The same view again publishes nothing.
        state
            .apply(
                declare(
                    &[("a", 2, &["10.0.0.1:8012", "10.0.0.2:8012"])],
                    Gates::HYBRID,
                ),
                at(1),
            )
            .unwrap();
        assert!(state.take_updates().is_empty());
    }

    #[test]
    fn a_queue_proxy_ready_makes_a_bare_ip_routable_on_the_serving_port() {
        let mut state = fresh_state();
        state
            .apply(declare(&[("a", 1, &[])], Gates::HYBRID), at(0))
            .unwrap();
        assert_eq!(last_route(&state.take_updates(), "a").unwrap(), vec![]);
        state
            .apply(qp("a", "10.0.0.7", QueueProxyEvent::Startup), at(1))
            .unwrap();
        assert!(state.take_updates().is_empty(), "startup is not ready");
        state
            .apply(qp("a", "10.0.0.7", QueueProxyEvent::Ready), at(2))
            .unwrap();
        assert_eq!(
            last_route(&state.take_updates(), "a").unwrap(),
            vec![(addr("10.0.0.7:8012"), 1)]
        );
        // A file reload that does not list it leaves it alone: the file never listed it.
        state
            .apply(declare(&[("a", 1, &[])], Gates::HYBRID), at(100))
            .unwrap();
        assert_eq!(
            state.pod_state(&key("a"), addr("10.0.0.7:8012")),
            Some(PodState::Ready)
        );
    }

    #[test]
    fn pods_announced_before_their_revision_is_declared_route_once_it_is() {
        let mut state = fresh_state();
        state
            .apply(qp("late", "10.0.0.9", QueueProxyEvent::Ready), at(0))
            .unwrap();
        assert!(
            state.take_updates().is_empty(),
            "nothing to route without a spec"
        );
        state
            .apply(declare(&[("late", 3, &[])], Gates::HYBRID), at(1))
            .unwrap();
        assert_eq!(
            last_route(&state.take_updates(), "late").unwrap(),
            vec![(addr("10.0.0.9:8012"), 3)]
        );
    }

    #[test]
    fn not_ready_leaves_routing_but_keeps_the_tracker_and_its_in_flight_count() {
        let mut state = fresh_state();
        state
            .apply(declare(&[("a", 1, &[])], Gates::HYBRID), at(0))
            .unwrap();
        state
            .apply(qp("a", "10.0.0.7", QueueProxyEvent::Ready), at(0))
            .unwrap();
        let updates = state.take_updates();
        let route = last_upsert(&updates);
        let tracker = route.pods[0].clone();
        assert!(tracker.slots.try_acquire(), "a request in flight");
        state
            .apply(qp("a", "10.0.0.7", QueueProxyEvent::NotReady), at(1))
            .unwrap();
        assert_eq!(last_route(&state.take_updates(), "a").unwrap(), vec![]);
        assert_eq!(
            tracker.slots.capacity(),
            0,
            "no shard may start another request there"
        );
        state
            .apply(qp("a", "10.0.0.7", QueueProxyEvent::Ready), at(2))
            .unwrap();
        let updates = state.take_updates();
        let route = last_upsert(&updates);
        assert!(
            Arc::ptr_eq(&route.pods[0], &tracker),
            "the same tracker comes back"
        );
        assert!(!tracker.slots.try_acquire(), "still one in flight at CC 1");
    }

    #[test]
    fn quarantine_takes_a_pod_out_until_it_ends_then_probation_then_ready() {
        let mut state = fresh_state();
        let pod = "10.0.0.1:8012";
        state
            .apply(declare(&[("a", 1, &[pod])], Gates::HYBRID), at(0))
            .unwrap();
        state.take_updates();
        state
            .apply(health("a", pod, Event::HealthCheckFailed), at(10))
            .unwrap();
        assert_eq!(last_route(&state.take_updates(), "a").unwrap(), vec![]);
        assert_eq!(
            state.next_deadline(),
            Some(at(11)),
            "first quarantine lasts 1 s"
        );
        state.expire_quarantines(at(10));
        assert_eq!(
            state.pod_state(&key("a"), addr(pod)),
            Some(PodState::Quarantined)
        );
        state.expire_quarantines(at(11));
        assert_eq!(
            state.pod_state(&key("a"), addr(pod)),
            Some(PodState::Recovering)
        );
        assert!(
            last_route(&state.take_updates(), "a").is_none_or(|route| route.is_empty()),
            "probation does not route"
        );
        // The prober is told at once, with the pod on probation.
        let probes = state.take_probe_updates();
        let last = probes.last().expect("a probe set after the expiry");
        assert_eq!(last.pods.len(), 1);
        assert!(last.pods[0].recovering);
        state
            .apply(health("a", pod, Event::HealthCheckPassed), at(12))
            .unwrap();
        assert_eq!(state.pod_state(&key("a"), addr(pod)), Some(PodState::Ready));
        assert_eq!(
            last_route(&state.take_updates(), "a").unwrap().len(),
            1,
            "a passing probe routes it again"
        );
        assert_eq!(state.next_deadline(), None);
    }

    #[test]
    fn a_probe_set_carries_its_revisions_protocol_and_is_sent_again_when_it_changes() {
        let mut state = fresh_state();
        let pod = "10.0.0.1:8012";
        state
            .apply(declare(&[("a", 1, &[pod])], Gates::HYBRID), at(0))
            .unwrap();
        let sent = state.take_probe_updates();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].protocol, Protocol::Http1);
        // The revision is h2c now, same pods: the prober must probe them over h2c.
        let h2c = RevisionSpec {
            protocol: Protocol::H2c,
            ..spec("a", 1)
        };
        state.apply(Op::UpsertRevision(h2c.clone()), at(1)).unwrap();
        let sent = state.take_probe_updates();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].protocol, Protocol::H2c);
        let pods: Vec<SocketAddr> = sent[0].pods.iter().map(|pod| pod.addr).collect();
        assert_eq!(pods, [addr(pod)]);
        // Unchanged: nothing sent.
        state.apply(Op::UpsertRevision(h2c), at(2)).unwrap();
        assert!(state.take_probe_updates().is_empty());
        // Gone: an empty set.
        state
            .apply(Op::RemoveRevision { revision: key("a") }, at(3))
            .unwrap();
        let sent = state.take_probe_updates();
        assert_eq!(sent.len(), 1);
        assert!(sent[0].pods.is_empty());
    }

    #[test]
    fn turning_quarantine_off_releases_quarantined_pods_and_stops_probing() {
        let mut state = fresh_state();
        let pod = "10.0.0.1:8012";
        state
            .apply(declare(&[("a", 1, &[pod])], Gates::HYBRID), at(0))
            .unwrap();
        state
            .apply(health("a", pod, Event::HealthCheckFailed), at(1))
            .unwrap();
        assert_eq!(last_route(&state.take_updates(), "a").unwrap(), vec![]);
        // Same file, quarantine off: nothing would ever end the quarantine, so the informer's
        // listing releases the pod (pod_state's table) and the timer is dropped.
        state
            .apply(declare(&[("a", 1, &[pod])], Gates::QUEUE_PROXY_ONLY), at(3))
            .unwrap();
        assert_eq!(state.pod_state(&key("a"), addr(pod)), Some(PodState::Ready));
        assert_eq!(last_route(&state.take_updates(), "a").unwrap().len(), 1);
        assert!(state.recount_probe_sets().is_empty());
        let last = state
            .take_probe_updates()
            .pop()
            .expect("the prober is told");
        assert!(last.pods.is_empty());
        assert_eq!(state.next_deadline(), None);
    }

    #[test]
    fn ip_reuse_removes_the_tracker_at_once_and_removal_is_idempotent() {
        let mut state = fresh_state();
        let pod = "10.0.0.1:8012";
        state
            .apply(
                declare(&[("a", 4, &[pod, "10.0.0.2:8012"])], Gates::HYBRID),
                at(0),
            )
            .unwrap();
        let updates = state.take_updates();
        let route = last_upsert(&updates);
        let reused = route.pods[0].clone();
        let remove = Op::RemovePod {
            revision: key("a"),
            addr: addr(pod),
            reason: Reason::IpReused,
            source: Source::Proxy,
        };
        state.apply(remove.clone(), at(1)).unwrap();
        assert_eq!(reused.slots.capacity(), 0);
        assert_eq!(
            last_route(&state.take_updates(), "a").unwrap(),
            vec![(addr("10.0.0.2:8012"), 4)]
        );
        state.apply(remove, at(2)).unwrap();
        assert!(state.take_updates().is_empty());
        let removals = state
            .take_journal()
            .into_iter()
            .filter(|entry| matches!(entry, Journal::Transition { to: None, .. }))
            .count();
        assert_eq!(removals, 1);
    }

    #[test]
    fn the_tracker_limit_refuses_new_pods_and_says_so() {
        let mut state = Shelled::new(ControlState::new(
            1,
            Gates::HYBRID,
            Limits {
                max_trackers_per_revision: 2,
                ..Limits::default()
            },
            Arc::new(ProcessQueue::new(u32::MAX)),
        ));
        state
            .apply(declare(&[("a", 1, &[])], Gates::HYBRID), at(0))
            .unwrap();
        for ip in ["10.0.0.1", "10.0.0.2"] {
            state
                .apply(qp("a", ip, QueueProxyEvent::Ready), at(0))
                .unwrap();
        }
        let error = state.apply(qp("a", "10.0.0.3", QueueProxyEvent::Ready), at(0));
        assert_eq!(error, Err(OpError::TrackerLimit(key("a"), 2)));
        assert!(state.take_journal().iter().any(
            |entry| matches!(entry, Journal::TrackerLimit { revision } if revision.name() == "a")
        ));
        // A known pod's events still apply at the limit.
        state
            .apply(qp("a", "10.0.0.1", QueueProxyEvent::NotReady), at(1))
            .unwrap();
    }

    #[test]
    fn revisions_nobody_declared_are_bounded() {
        let mut state = fresh_state();
        for i in 0..MAX_UNDECLARED_REVISIONS {
            state
                .apply(
                    qp(&format!("ghost-{i}"), "10.0.0.1", QueueProxyEvent::Ready),
                    at(0),
                )
                .unwrap();
        }
        let refused = state.apply(qp("one-more", "10.0.0.1", QueueProxyEvent::Ready), at(0));
        assert!(
            matches!(refused, Err(OpError::TooManyUndeclared(..))),
            "{refused:?}"
        );
        // A declared revision is not affected by the bound.
        state
            .apply(declare(&[("real", 1, &[])], Gates::HYBRID), at(0))
            .unwrap();
        state
            .apply(qp("real", "10.0.0.2", QueueProxyEvent::Ready), at(0))
            .unwrap();
    }

    #[test]
    fn idle_not_ready_trackers_are_collected_after_ten_minutes() {
        let mut state = fresh_state();
        state
            .apply(declare(&[("a", 1, &[])], Gates::HYBRID), at(0))
            .unwrap();
        state
            .apply(qp("a", "10.0.0.1", QueueProxyEvent::NotReady), at(0))
            .unwrap();
        state
            .apply(qp("a", "10.0.0.2", QueueProxyEvent::Ready), at(0))
            .unwrap();
        state.apply(Op::CleanupStale, at(600)).unwrap();
        assert!(state.pod_state(&key("a"), addr("10.0.0.1:8012")).is_some());
        state.apply(Op::CleanupStale, at(601)).unwrap();
        assert_eq!(state.pod_state(&key("a"), addr("10.0.0.1:8012")), None);
        assert!(state.pod_state(&key("a"), addr("10.0.0.2:8012")).is_some());
    }

    #[test]
    fn activators_split_the_pods_and_never_multiply_a_shared_pods_concurrency() {
        let pods = ["10.0.0.1:8012", "10.0.0.2:8012", "10.0.0.3:8012"];
        let everyone: Vec<IpAddr> = ["10.1.0.1", "10.1.0.2"]
            .iter()
            .map(|ip| ip.parse().unwrap())
            .collect();
        let mut per_pod: BTreeMap<SocketAddr, u32> = BTreeMap::new();
        for me in &everyone {
            let mut state = fresh_state();
            state
                .apply(
                    Op::SetActivators(Activators {
                        me: Some(*me),
                        all: everyone.clone(),
                    }),
                    at(0),
                )
                .unwrap();
            state
                .apply(declare(&[("a", 10, &pods)], Gates::HYBRID), at(0))
                .unwrap();
            let route = last_route(&state.take_updates(), "a").unwrap();
            assert!(!route.is_empty(), "every activator gets a pod");
            for (pod, capacity) in route {
                *per_pod.entry(pod).or_default() += capacity;
            }
        }
        assert_eq!(per_pod.len(), 3);
        assert!(per_pod.values().all(|&total| total == 10), "{per_pod:?}");
    }

    #[test]
    fn a_removed_revision_leaves_routing_with_its_trackers() {
        let mut state = fresh_state();
        state
            .apply(
                declare(
                    &[("a", 1, &["10.0.0.1:8012"]), ("b", 1, &[])],
                    Gates::HYBRID,
                ),
                at(0),
            )
            .unwrap();
        let tracker = state
            .take_updates()
            .iter()
            .find_map(|update| match update {
                RoutingUpdate::Upsert { route, .. } if route.key == key("a") => {
                    Some(route.pods[0].clone())
                }
                _ => None,
            })
            .unwrap();
        assert!(tracker.slots.try_acquire(), "a request in flight");
        state
            .apply(Op::RemoveRevision { revision: key("a") }, at(1))
            .unwrap();
        let updates = state.take_updates();
        assert!(
            matches!(&updates[..], [RoutingUpdate::Remove { key, .. }] if key.as_str() == "ns/a")
        );
        assert_eq!(state.revision_count(), 1);
        assert_eq!(state.pod_state(&key("a"), addr("10.0.0.1:8012")), None);
        assert_eq!(tracker.slots.capacity(), 0, "no new request goes there");
        assert!(tracker.slots.release(), "the one in flight finishes");
        // Again: nothing left to remove.
        state
            .apply(Op::RemoveRevision { revision: key("a") }, at(2))
            .unwrap();
        assert!(state.take_updates().is_empty());
    }

    #[test]
    fn a_batch_publishes_each_revision_it_touched_once() {
        let mut state = fresh_state();
        state
            .apply(
                declare(
                    &[("a", 1, &["10.0.0.1:8012", "10.0.0.2:8012"]), ("b", 0, &[])],
                    Gates::HYBRID,
                ),
                at(0),
            )
            .unwrap();
        let upserts: Vec<String> = state
            .take_updates()
            .iter()
            .filter_map(|update| match update {
                RoutingUpdate::Upsert { route, .. } => Some(route.key.to_string()),
                RoutingUpdate::Remove { .. } => None,
            })
            .collect();
        assert_eq!(upserts, ["ns/a", "ns/b"]);
        // Declaring the same spec again changes nothing.
        state
            .apply(Op::UpsertRevision(spec("a", 1)), at(1))
            .unwrap();
        assert!(state.take_updates().is_empty());
    }

    #[test]
    fn evidence_applies_only_to_the_tracker_it_is_about() {
        let mut state = fresh_state();
        let pod = "10.0.0.1:8012";
        state
            .apply(declare(&[("a", 1, &[pod])], Gates::HYBRID), at(0))
            .unwrap();
        let old = last_upsert(&state.take_updates()).pods[0].clone();
        // The pod goes and a new one comes at the same address: another tracker.
        state
            .apply(
                Op::RemovePod {
                    revision: key("a"),
                    addr: addr(pod),
                    reason: Reason::IpReused,
                    source: Source::Prober,
                },
                at(1),
            )
            .unwrap();
        state
            .apply(
                declare(&[("a", 1, &[pod, "10.0.0.2:8012"])], Gates::HYBRID),
                at(2),
            )
            .unwrap();
        let new = last_upsert(&state.take_updates()).pods[0].clone();
        assert!(!Arc::ptr_eq(&old, &new));
        let evidence = |tracker: &Arc<PodTracker>, kind: EvidenceKind| Op::Evidence {
            revision: key("a"),
            addr: addr(pod),
            tracker: tracker.id,
            kind,
        };
        // Late evidence about the old pod says nothing about the new one.
        state
            .apply(evidence(&old, EvidenceKind::TransportFailure), at(3))
            .unwrap();
        assert_eq!(state.pod_state(&key("a"), addr(pod)), Some(PodState::Ready));
        // About the new one it counts: a transport failure quarantines.
        state
            .apply(evidence(&new, EvidenceKind::TransportFailure), at(4))
            .unwrap();
        assert_eq!(
            state.pod_state(&key("a"), addr(pod)),
            Some(PodState::Quarantined)
        );
    }

    /// Upstream's cluster-IP rows (`capacity`'s table), through the publish path:
    /// one target, the Service, with `max(1, CC × routable pods / activators)` slots.
    #[test]
    fn cluster_ip_mode_routes_to_the_service_with_the_shared_capacity() {
        let service = addr("10.96.0.5:80");
        let mut state = fresh_state();
        let everyone: Vec<IpAddr> = ["10.1.0.1", "10.1.0.2"]
            .iter()
            .map(|ip| ip.parse().unwrap())
            .collect();
        state
            .apply(
                Op::SetActivators(Activators {
                    me: Some(everyone[0]),
                    all: everyone,
                }),
                at(0),
            )
            .unwrap();
        let mut cluster_ip = spec("a", 3);
        cluster_ip.cluster_ip = Some(service);
        let endpoints = |pods: &[&str]| Op::SetEndpoints {
            revision: key("a"),
            ready: pods.iter().map(|pod| addr(pod)).collect(),
            scope: OmissionScope::ListedPods,
        };
        state.apply(Op::UpsertRevision(cluster_ip), at(0)).unwrap();
        assert_eq!(
            last_route(&state.take_updates(), "a").unwrap(),
            vec![],
            "no ready pod: closed"
        );
        let five = [
            "10.0.0.1:8012",
            "10.0.0.2:8012",
            "10.0.0.3:8012",
            "10.0.0.4:8012",
            "10.0.0.5:8012",
        ];
        state.apply(endpoints(&five), at(1)).unwrap();
        let updates = state.take_updates();
        assert_eq!(
            last_route(&updates, "a").unwrap(),
            vec![(service, 7)],
            "3 × 5 / 2"
        );
        let virtual_tracker = last_upsert(&updates).pods[0].clone();
        assert!(
            state.recount_probe_sets().is_empty(),
            "pods behind a Service are not probed"
        );
        assert!(state.take_journal().iter().any(|entry| matches!(
            entry,
            Journal::Route {
                pods: 5,
                capacity: Capacity::Limited(7),
                ..
            }
        )));
        state.apply(endpoints(&five[..1]), at(2)).unwrap();
        let updates = state.take_updates();
        assert_eq!(
            last_route(&updates, "a").unwrap(),
            vec![(service, 1)],
            "floor of 1"
        );
        assert!(
            Arc::ptr_eq(&last_upsert(&updates).pods[0], &virtual_tracker),
            "the same target, so its in-flight count carries over"
        );
        // Back to pod mode: the Service takes nothing new, the pod gets its share.
        state
            .apply(Op::UpsertRevision(spec("a", 3)), at(3))
            .unwrap();
        assert_eq!(virtual_tracker.slots.capacity(), 0);
        let route = last_route(&state.take_updates(), "a").unwrap();
        assert_eq!(route.len(), 1);
        assert_ne!(route[0].0, service);
    }

    #[test]
    fn a_pod_replaced_at_its_address_within_one_op_is_published_with_its_new_tracker() {
        let mut state = fresh_state();
        let pod = "10.0.0.1:8012";
        state
            .apply(declare(&[("a", 2, &[pod])], Gates::HYBRID), at(0))
            .unwrap();
        let old = last_upsert(&state.take_updates()).pods[0].clone();
        // Gone and back in one batch: same address, same share, another tracker.
        state
            .apply(
                Op::Batch(vec![
                    Op::RemovePod {
                        revision: key("a"),
                        addr: addr(pod),
                        reason: Reason::IpReused,
                        source: Source::Prober,
                    },
                    Op::SetEndpoints {
                        revision: key("a"),
                        ready: vec![addr(pod)],
                        scope: OmissionScope::ListedPods,
                    },
                ]),
                at(1),
            )
            .unwrap();
        let route = last_upsert(&state.take_updates()).clone();
        assert!(
            !Arc::ptr_eq(&route.pods[0], &old),
            "the new pod's tracker is routed"
        );
        assert_eq!(route.pods[0].slots.capacity(), 2);
        assert_eq!(old.slots.capacity(), 0);
    }

    #[test]
    fn cluster_ip_mode_gets_a_fresh_target_when_the_service_moves() {
        let mut state = fresh_state();
        let mut service = spec("a", 0);
        service.cluster_ip = Some(addr("10.96.0.5:80"));
        state
            .apply(
                Op::Batch(vec![
                    Op::UpsertRevision(service.clone()),
                    Op::SetEndpoints {
                        revision: key("a"),
                        ready: vec![addr("10.0.0.1:8012")],
                        scope: OmissionScope::ListedPods,
                    },
                ]),
                at(0),
            )
            .unwrap();
        let first = last_upsert(&state.take_updates()).pods[0].clone();
        assert_eq!(first.slots.capacity(), UNLIMITED, "CC 0 with a ready pod");
        // The Service moves: the old target takes nothing new.
        service.cluster_ip = Some(addr("10.96.0.6:80"));
        state.apply(Op::UpsertRevision(service), at(2)).unwrap();
        let second = last_upsert(&state.take_updates()).pods[0].clone();
        assert_eq!(second.addr, addr("10.96.0.6:80"));
        assert_eq!(first.slots.capacity(), 0);
        assert!(
            second.slots.try_acquire(),
            "the revision has somewhere to go again"
        );
    }

    #[test]
    fn a_revision_with_activators_of_its_own_ignores_the_default_set() {
        let mut state = fresh_state();
        let pods = ["10.0.0.1:8012", "10.0.0.2:8012"];
        state
            .apply(
                declare(&[("a", 4, &pods), ("b", 4, &pods)], Gates::HYBRID),
                at(0),
            )
            .unwrap();
        state.take_updates();
        let me: IpAddr = "10.1.0.1".parse().unwrap();
        let crowd = Activators {
            me: Some(me),
            all: vec![me, "10.1.0.2".parse().unwrap(), "10.1.0.3".parse().unwrap()],
        };
        state
            .apply(
                Op::SetRevisionActivators {
                    revision: key("a"),
                    activators: Some(crowd.clone()),
                },
                at(1),
            )
            .unwrap();
        let updates = state.take_updates();
        let shared: u32 = last_route(&updates, "a")
            .unwrap()
            .iter()
            .map(|(_, capacity)| capacity)
            .sum();
        assert!(shared < 8, "a's pods are shared three ways: {shared}");
        assert!(
            last_route(&updates, "b").is_none(),
            "b keeps the default (alone)"
        );
        // The default set changing does not touch a.
        state.apply(Op::SetActivators(crowd), at(2)).unwrap();
        let updates = state.take_updates();
        assert!(last_route(&updates, "a").is_none());
        assert!(last_route(&updates, "b").is_some());
    }

    fn any_op() -> impl Strategy<Value = (Op, u64)> {
        let pod = prop::sample::select(vec!["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
        let name = prop::sample::select(vec!["a", "b"]);
        let qp_event = prop::sample::select(vec![
            QueueProxyEvent::Startup,
            QueueProxyEvent::Ready,
            QueueProxyEvent::NotReady,
            QueueProxyEvent::Draining,
        ]);
        let gates = prop::sample::select(vec![
            Gates::HYBRID,
            Gates::QUEUE_PROXY_ONLY,
            Gates::QUARANTINE_ONLY,
            Gates::MINIMAL,
        ]);
        let op = prop_oneof![
            (name.clone(), pod.clone(), qp_event).prop_map(|(name, ip, event)| qp(name, ip, event)),
            (name.clone(), pod.clone(), 0..4u8).prop_map(|(name, ip, which)| {
                let event = match which {
                    0 => Event::HealthCheckFailed,
                    1 => Event::HealthCheckPassed,
                    2 => Event::RequestSucceeded,
                    _ => Event::QuarantineExpired,
                };
                health(name, &format!("{ip}:8012"), event)
            }),
            (name.clone(), pod.clone()).prop_map(|(name, ip)| Op::RemovePod {
                revision: key(name),
                addr: addr(&format!("{ip}:8012")),
                reason: Reason::IpReused,
                source: Source::Proxy,
            }),
            (prop::collection::vec(pod, 0..3), gates, any::<bool>()).prop_map(
                |(pods, gates, with_b)| {
                    let listed: Vec<String> = pods.iter().map(|ip| format!("{ip}:8012")).collect();
                    let listed: Vec<&str> = listed.iter().map(String::as_str).collect();
                    let mut revisions = vec![("a", 2, &listed[..])];
                    if with_b {
                        revisions.push(("b", 0, &[][..]));
                    }
                    declare(&revisions, gates)
                }
            ),
            name.clone().prop_map(|name| Op::RemoveRevision {
                revision: key(name)
            }),
            // The same revision in the other protocol: its probe set is sent again.
            (name.clone(), any::<bool>()).prop_map(|(name, h2c)| {
                let protocol = if h2c { Protocol::H2c } else { Protocol::Http1 };
                Op::UpsertRevision(RevisionSpec {
                    protocol,
                    ..spec(name, 2)
                })
            }),
            Just(Op::CleanupStale),
        ];
        (op, 0..700u64)
    }

    proptest! {
        /// Whatever happens: the published route is exactly the routable pods; trackers outside
        /// it take no new requests; every per-state gauge folded from the journal equals a
        /// recount (never leaks), so the shell may fold instead of recounting.
        #[test]
        fn routes_gauges_and_journal_stay_consistent(ops in prop::collection::vec(any_op(), 1..60)) {
            let mut state = fresh_state();
            let mut now = 0;
            let metrics = crate::shell::PodMetrics::new(&prometheus::Registry::new());
            let mut routes: BTreeMap<String, Vec<(SocketAddr, u32)>> = BTreeMap::new();
            for (op, step) in ops {
                now += step;
                let _ = state.apply(op, at(now));
                state.expire_quarantines(at(now));
                for update in state.take_updates() {
                    match update {
                        RoutingUpdate::Upsert { route, .. } => {
                            routes.insert(route.labels.revision.clone(), route.pods.iter().map(|pod| (pod.addr, pod.slots.capacity())).collect());
                        }
                        RoutingUpdate::Remove { key, .. } => {
                            routes.remove(key.name());
                        }
                    }
                }
                for entry in state.take_journal() {
                    metrics.observe(&entry);
                }
                let counts = state.state_counts();
                for pod_state in PodState::ALL {
                    let recount = counts.get(pod_state.label()).copied().unwrap_or(0) as i64;
                    prop_assert_eq!(metrics.trackers(pod_state), recount, "{}", pod_state.label());
                }
                prop_assert_eq!(metrics.quarantined(), counts.get("quarantined").copied().unwrap_or(0) as i64);
                for (key, revision) in &state.revisions {
                    let Some(spec) = &revision.spec else { continue };
                    let expected: Vec<SocketAddr> = revision.pods.iter().filter(|(_, pod)| pod.pod.is_routable()).map(|(addr, _)| *addr).collect();
                    let published: Vec<SocketAddr> = routes.get(&spec.labels.revision).map(|route| route.iter().map(|(addr, _)| *addr).collect()).unwrap_or_default();
                    prop_assert_eq!(&expected, &published, "revision {}", key);
                    for (addr, pod) in &revision.pods {
                        if !expected.contains(addr) {
                            prop_assert_eq!(pod.tracker.slots.capacity(), 0);
                        }
                    }
                }
            }
        }

        /// The probe sets the prober is sent, one touched revision at a time, always equal a
        /// recount of every revision: deriving only what an op touched loses nothing.
        #[test]
        fn probe_sets_sent_incrementally_equal_a_recount(ops in prop::collection::vec(any_op(), 1..60)) {
            let mut state = fresh_state();
            let mut now = 0;
            let mut sent: BTreeMap<RevisionKey, (Protocol, Vec<ProbePod>)> = BTreeMap::new();
            for (op, step) in ops {
                now += step;
                let _ = state.apply(op, at(now));
                state.expire_quarantines(at(now));
                for update in state.take_probe_updates() {
                    if update.pods.is_empty() {
                        sent.remove(&update.revision);
                    } else {
                        sent.insert(update.revision, (update.protocol, update.pods));
                    }
                }
                prop_assert_eq!(&sent, &state.recount_probe_sets());
            }
        }
    }
}
