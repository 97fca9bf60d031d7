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
    ColdStart, LbPolicy, PodTracker, Protocol, RevisionLabels, RevisionRoute, RouteRules,
    RoutingUpdate, Timeouts,
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
    /// TLS to the pods; `None`: plain TCP. Boxed as `priority` is.
    pub tls: Option<Box<crate::tls::PodTls>>,
    /// The rules that route requests to the revision (an HTTPScaledObject's, issue 40);
    /// `None`: requests name it (Knative, the file).
    pub rules: Option<Arc<RouteRules>>,
    /// The wait for a first pod and the failover after it (an HTTPScaledObject's); `None`:
    /// the request's own deadline. Boxed as `priority` is.
    pub cold_start: Option<Box<ColdStart>>,
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
    /// The TLS it was sent with.
    probe_tls: Option<Arc<crate::tls::PodTls>>,
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
            probe_tls: None,
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

/// A revision's probe set as [`ControlState::recount_probe_sets`] recounts it: the protocol,
/// the TLS (if probed over TLS) and the pods.
#[cfg(test)]
pub type RecountedProbes = (Protocol, Option<Arc<crate::tls::PodTls>>, Vec<ProbePod>);

/// A revision's probe set, sent to the prober when it changed: the pods the active health
/// check watches (quarantine on, pod mode: Ready and Recovering pods), and the protocol and
/// the TLS they are probed in. Empty when none is to be probed any more (the revision is gone,
/// moved to cluster-IP mode, or quarantine is off).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeUpdate {
    pub revision: RevisionKey,
    /// The revision's protocol (HTTP/1 while no source declared it): h2c pods are probed over
    /// h2c, the others over HTTP/1.1.
    pub protocol: Protocol,
    /// The revision's TLS to its pods when the pods are probed over it
    /// ([`crate::tls::PodTls::probes_over_tls`]: dialled over TLS at the address listed, as
    /// standalone `[revisions.tls]` does); `None`: plain, Knative's TLS on another port
    /// included. The spec's `PodTls`, the one the route carries, cloned: its client (`built`)
    /// is shared, not rebuilt, so the prober dials with the data plane's very configuration.
    pub tls: Option<Arc<crate::tls::PodTls>>,
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
    pub fn recount_probe_sets(&self) -> BTreeMap<RevisionKey, RecountedProbes> {
        self.revisions
            .values()
            .map(|revision| {
                let (protocol, tls, pods) = derive_probes(revision, self.gates);
                let tls = tls.cloned().map(Arc::new);
                (revision.key.clone(), (protocol, tls, pods))
            })
            .filter(|(_, (_, _, pods))| !pods.is_empty())
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
                tls: entry.probe_tls,
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
        let (protocol, tls, pods) = derive_probes(entry, self.gates);
        // Copied (the `Arc`s inside, a few names) only when it changed.
        let new_tls = (tls != entry.probe_tls.as_deref()).then(|| tls.cloned().map(Arc::new));
        // An empty set is empty in any protocol and over any TLS.
        let dial_changed =
            (protocol != entry.probe_protocol || new_tls.is_some()) && !pods.is_empty();
        if pods != entry.probe_set || dial_changed {
            entry.probe_set = pods.clone();
            entry.probe_protocol = protocol;
            if let Some(tls) = new_tls {
                entry.probe_tls = tls;
            }
            self.effects.probe_updates.push(ProbeUpdate {
                revision: key.clone(),
                protocol,
                tls: entry.probe_tls.clone(),
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
            upstream_tls: spec
                .tls
                .as_ref()
                .map(|tls| tls.upstream(spec.cluster_ip.is_some())),
            rules: spec.rules.clone(),
            cold_start: spec.cold_start.as_deref().cloned().unwrap_or_default(),
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
/// them, the protocol to probe them in: the revision's (HTTP/1 until a source declares it);
/// and the TLS to probe them over: the revision's, where its pods are dialled over TLS at the
/// address listed (standalone `[revisions.tls]`), none where TLS goes to another port and the
/// listed one is plain (Knative's `system-internal-tls`: probed plain, as upstream's activator
/// probes them).
fn derive_probes(
    revision: &Revision,
    gates: Gates,
) -> (Protocol, Option<&crate::tls::PodTls>, Vec<ProbePod>) {
    let protocol = revision
        .spec
        .as_ref()
        .map_or(Protocol::default(), |spec| spec.protocol);
    let tls = revision
        .spec
        .as_ref()
        .and_then(|spec| spec.tls.as_deref())
        .filter(|tls| tls.probes_over_tls());
    let cluster_ip = revision
        .spec
        .as_ref()
        .is_some_and(|spec| spec.cluster_ip.is_some());
    if !gates.pod_quarantine || cluster_ip {
        return (protocol, tls, Vec::new());
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
    (protocol, tls, pods)
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
mod tests;
