//! The state the worker owns: every revision, every pod tracker and its [`Pod`] state, the feature
//! gates, and the version counter of the snapshots published to the shards.
//!
//! Sans-IO. [`PodStates::apply`] takes one [`Op`] and the current [`Timestamp`], changes the
//! state, and leaves behind what the I/O shell must do: routing updates to publish
//! ([`PodStates::take_updates`]) and facts for the metrics ([`PodStates::take_journal`]). Nothing
//! here awaits, locks or reads a clock, so every rule is tested with simulated time.
//!
//! # What makes a route
//!
//! A revision is published once a source declared it (its [`RevisionSpec`]). Its route holds the
//! pods that are routable under the current gates ([`Pod::is_routable`]) and assigned to this
//! activator by `subsetting::assign`; each tracker's capacity is this activator's share of
//! containerConcurrency. Pods pushed by a queue-proxy before any source declared their revision
//! are kept and published when the revision appears.
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
use kactivator_shards::routing::{
    LbPolicy, PodTracker, Protocol, RevisionLabels, RevisionRoute, RoutingUpdate, Timeouts,
};
use kactivator_shards::throttle::gate::{ProcessQueue, RevisionGate};
use kactivator_shards::throttle::slots::UNLIMITED;
use kactivator_shards::throttle::subsetting;

use crate::pod_state::{Event, Gates, Outcome, Pod, PodState, Reason, Timestamp, Windows};

/// `namespace/name`.
fn revision_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// The key shards know a revision by. Names reach the state only through validated sources
/// (the config file, a registration), which refuse a `/` in either part.
fn shard_key(namespace: &str, name: &str) -> RevisionKey {
    RevisionKey::new(namespace, name).expect("sources validate revision names")
}

/// Default most pod trackers one revision may have: 5000, the fork's `maxTrackersPerRevision`.
pub const DEFAULT_MAX_TRACKERS_PER_REVISION: usize = 5000;

/// How a revision routes, from a source, without its pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevisionSpec {
    pub labels: RevisionLabels,
    pub container_concurrency: u32,
    pub protocol: Protocol,
    pub timeouts: Timeouts,
    pub lb_policy: LbPolicy,
    /// Most requests that may wait for the revision.
    pub queue_depth: u32,
    /// Port a bare `pod_ip` from a queue-proxy maps to.
    pub serving_port: u16,
}

impl RevisionSpec {
    pub fn key(&self) -> String {
        revision_key(&self.labels.namespace, &self.labels.revision)
    }
}

/// One revision as a source sees it: its spec and the pods the source lists as ready.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceRevision {
    pub spec: RevisionSpec,
    pub listed: Vec<SocketAddr>,
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
    /// A pod event: queue-proxy push, health result, request outcome, quarantine expiry.
    MutatePod {
        namespace: String,
        revision: String,
        target: PodTarget,
        event: Event,
        source: Source,
    },
    /// Delete a tracker whatever its state (IP reuse). Idempotent.
    RemovePod {
        namespace: String,
        revision: String,
        addr: SocketAddr,
        reason: Reason,
        source: Source,
    },
    /// A source's complete view: every revision and its listed pods, and the gates.
    RecalculateAll {
        revisions: Vec<SourceRevision>,
        omission: OmissionScope,
        gates: Gates,
    },
    /// The activator set changed: recompute every revision's assignments and capacity.
    RecalculateCapacity { activators: Activators },
    /// Collect NotReady trackers that have been idle for 10 minutes.
    CleanupStale,
    /// Does nothing; answering it proves every earlier op was applied.
    Noop,
}

impl Op {
    /// The `op_type` metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Op::MutatePod { .. } => "mutate_pod",
            Op::RemovePod { .. } => "remove_pod",
            Op::RecalculateAll { .. } => "recalculate_all",
            Op::RecalculateCapacity { .. } => "recalculate_capacity",
            Op::CleanupStale => "cleanup_stale",
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
    TrackerLimit(String, usize),
    #[error(
        "revision {0} is not known, and {1} unknown revisions are already waiting to be declared"
    )]
    TooManyUndeclared(String, usize),
}

/// Facts for the metrics, in the order they happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Journal {
    /// A pod changed state; `to = None` is a removal.
    Transition {
        /// `namespace/name`.
        revision: String,
        pod: SocketAddr,
        from: Option<PodState>,
        to: Option<PodState>,
        reason: Reason,
        source: Source,
    },
    /// A new pod was refused because its revision is at its tracker limit.
    TrackerLimit { namespace: String, revision: String },
    /// A route was published: how many pods it has and this activator's capacity over them
    /// (`None` = unlimited).
    Route {
        namespace: String,
        revision: String,
        pods: usize,
        capacity: Option<u64>,
    },
    /// A revision left routing.
    RouteRemoved { namespace: String, revision: String },
}

/// Tunables.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_trackers_per_revision: usize,
    pub windows: Windows,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_trackers_per_revision: DEFAULT_MAX_TRACKERS_PER_REVISION,
            windows: Windows::default(),
        }
    }
}

struct TrackedPod {
    pod: Pod,
    tracker: Arc<PodTracker>,
    /// The source listed this pod at some point (its omission then counts).
    listed: bool,
}

impl Revision {
    /// A revision seen for the first time, with no spec and no pods yet.
    fn new(
        namespace: &str,
        name: &str,
        shards: usize,
        process_queue: &Arc<ProcessQueue>,
    ) -> Revision {
        Revision {
            namespace: namespace.to_string(),
            name: name.to_string(),
            spec: None,
            pods: BTreeMap::new(),
            gate: Arc::new(RevisionGate::with_process_queue(
                shards,
                process_queue.clone(),
            )),
            published: None,
        }
    }
}

struct Revision {
    namespace: String,
    name: String,
    /// `None` until a source declares the revision; queue-proxy pods wait here meanwhile.
    spec: Option<RevisionSpec>,
    pods: BTreeMap<SocketAddr, TrackedPod>,
    gate: Arc<RevisionGate>,
    /// Pods and shares of the last published route, to skip identical republishes.
    published: Option<(RevisionSpec, Vec<(SocketAddr, u32)>)>,
}

/// A pod the prober should check.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ProbeTarget {
    pub namespace: String,
    pub revision: String,
    pub addr: SocketAddr,
    /// On probation: a passing probe makes it Ready.
    pub recovering: bool,
}

/// Everything the state worker owns.
pub struct PodStates {
    revisions: BTreeMap<String, Revision>,
    gates: Gates,
    limits: Limits,
    activators: Activators,
    shards: usize,
    process_queue: Arc<ProcessQueue>,
    version: u64,
    updates: Vec<RoutingUpdate>,
    journal: Vec<Journal>,
    /// Quarantined pods by the time their quarantine ends.
    quarantine_ends: BTreeSet<(Timestamp, String, SocketAddr)>,
}

impl PodStates {
    pub fn new(
        shards: usize,
        gates: Gates,
        limits: Limits,
        process_queue: Arc<ProcessQueue>,
    ) -> PodStates {
        PodStates {
            revisions: BTreeMap::new(),
            gates,
            limits,
            activators: Activators::default(),
            shards,
            process_queue,
            version: 0,
            updates: Vec::new(),
            journal: Vec::new(),
            quarantine_ends: BTreeSet::new(),
        }
    }

    pub fn gates(&self) -> Gates {
        self.gates
    }

    /// Revisions a source declared.
    pub fn revision_count(&self) -> usize {
        self.revisions.values().filter(|r| r.spec.is_some()).count()
    }

    /// Routing updates produced since the last call, in version order.
    pub fn take_updates(&mut self) -> Vec<RoutingUpdate> {
        std::mem::take(&mut self.updates)
    }

    /// Metric facts produced since the last call.
    pub fn take_journal(&mut self) -> Vec<Journal> {
        std::mem::take(&mut self.journal)
    }

    /// The earliest quarantine end still pending.
    pub fn next_deadline(&self) -> Option<Timestamp> {
        self.quarantine_ends.first().map(|(at, _, _)| *at)
    }

    /// A pod's state, for tests and diagnostics.
    pub fn pod_state(&self, namespace: &str, revision: &str, addr: SocketAddr) -> Option<PodState> {
        self.revisions
            .get(&revision_key(namespace, revision))?
            .pods
            .get(&addr)
            .map(|tracked| tracked.pod.state())
    }

    /// Number of pods per state over all revisions (exact gauges).
    pub fn state_counts(&self) -> BTreeMap<&'static str, usize> {
        let mut counts = BTreeMap::new();
        for revision in self.revisions.values() {
            for tracked in revision.pods.values() {
                *counts.entry(tracked.pod.state().label()).or_default() += 1;
            }
        }
        counts
    }

    /// Pods the active prober should check: the routable ones, when quarantine is on.
    pub fn probe_targets(&self) -> Vec<ProbeTarget> {
        if !self.gates.pod_quarantine {
            return Vec::new();
        }
        let mut targets = Vec::new();
        for revision in self.revisions.values() {
            for (addr, tracked) in &revision.pods {
                if tracked.pod.is_routable(self.gates) {
                    targets.push(ProbeTarget {
                        namespace: revision.namespace.clone(),
                        revision: revision.name.clone(),
                        addr: *addr,
                        recovering: tracked.pod.state() == PodState::Recovering,
                    });
                }
            }
        }
        targets
    }

    /// Applies one op at `now`.
    pub fn apply(&mut self, op: Op, now: Timestamp) -> Result<(), OpError> {
        match op {
            Op::MutatePod {
                namespace,
                revision,
                target,
                event,
                source,
            } => self.mutate_pod(&namespace, &revision, target, event, source, now),
            Op::RemovePod {
                namespace,
                revision,
                addr,
                reason,
                source,
            } => {
                let key = revision_key(&namespace, &revision);
                if let Some(tracked) = self
                    .revisions
                    .get_mut(&key)
                    .and_then(|entry| entry.pods.remove(&addr))
                {
                    let from = tracked.pod.state();
                    forget(
                        &mut self.journal,
                        &key,
                        addr,
                        &tracked,
                        from,
                        reason,
                        source,
                    );
                }
                self.publish(&key);
                Ok(())
            }
            Op::RecalculateAll {
                revisions,
                omission,
                gates,
            } => {
                self.recalculate_all(revisions, omission, gates, now);
                Ok(())
            }
            Op::RecalculateCapacity { activators } => {
                if activators != self.activators {
                    self.activators = activators;
                    self.publish_all();
                }
                Ok(())
            }
            Op::CleanupStale => {
                self.cleanup_stale(now);
                Ok(())
            }
            Op::Noop => Ok(()),
        }
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
            self.publish(&key);
        }
    }

    /// Re-publishes every revision from scratch: after a worker restart the last op may have
    /// stopped half-way, and this makes the shards agree with the state again.
    pub fn republish_everything(&mut self) {
        for revision in self.revisions.values_mut() {
            revision.published = None;
        }
        self.publish_all();
    }

    fn mutate_pod(
        &mut self,
        namespace: &str,
        revision: &str,
        target: PodTarget,
        event: Event,
        source: Source,
        now: Timestamp,
    ) -> Result<(), OpError> {
        let key = revision_key(namespace, revision);
        if !self.revisions.contains_key(&key) {
            let undeclared = self
                .revisions
                .values()
                .filter(|entry| entry.spec.is_none())
                .count();
            if undeclared >= MAX_UNDECLARED_REVISIONS {
                return Err(OpError::TooManyUndeclared(key, undeclared));
            }
        }
        let (shards, process_queue) = (self.shards, &self.process_queue);
        let entry = self
            .revisions
            .entry(key.clone())
            .or_insert_with(|| Revision::new(namespace, revision, shards, process_queue));
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
        let gates = self.gates;
        let windows = self.limits.windows;
        match entry.pods.get_mut(&addr) {
            Some(tracked) => {
                let outcome = tracked.pod.apply(event, gates, windows, now);
                self.record(&key, addr, outcome, source, now);
            }
            None => {
                let Some(pod) = Pod::first_seen(event, gates, now) else {
                    return Ok(());
                };
                if entry.pods.len() >= self.limits.max_trackers_per_revision {
                    self.journal.push(Journal::TrackerLimit {
                        namespace: namespace.to_string(),
                        revision: revision.to_string(),
                    });
                    return Err(OpError::TrackerLimit(
                        key,
                        self.limits.max_trackers_per_revision,
                    ));
                }
                self.journal.push(Journal::Transition {
                    revision: key.clone(),
                    pod: addr,
                    from: None,
                    to: Some(pod.state()),
                    reason: pod.reason(),
                    source,
                });
                entry.pods.insert(
                    addr,
                    TrackedPod {
                        pod,
                        tracker: Arc::new(PodTracker::new(addr, 0)),
                        listed: false,
                    },
                );
            }
        }
        self.publish(&key);
        Ok(())
    }

    fn recalculate_all(
        &mut self,
        revisions: Vec<SourceRevision>,
        omission: OmissionScope,
        gates: Gates,
        now: Timestamp,
    ) {
        let gates_changed = gates != self.gates;
        self.gates = gates;
        if gates_changed && !gates.pod_quarantine {
            // No quarantine timers run with the gate off; pods left Quarantined wait for the
            // informer or a QP `ready` (see pod_state's table).
            self.quarantine_ends.clear();
        }
        let declared: BTreeSet<String> = revisions.iter().map(|r| r.spec.key()).collect();
        // Revisions the source no longer declares leave routing. Their trackers go with them:
        // in-flight requests hold their own handles and finish.
        let gone: Vec<String> = self
            .revisions
            .iter()
            .filter(|(key, entry)| entry.spec.is_some() && !declared.contains(*key))
            .map(|(key, _)| key.clone())
            .collect();
        for key in gone {
            if let Some(entry) = self.revisions.remove(&key) {
                for (addr, tracked) in &entry.pods {
                    let from = tracked.pod.state();
                    let (reason, source) = (Reason::InformerRemoved, Source::Informer);
                    forget(
                        &mut self.journal,
                        &key,
                        *addr,
                        tracked,
                        from,
                        reason,
                        source,
                    );
                }
                self.journal.push(Journal::RouteRemoved {
                    namespace: entry.namespace.clone(),
                    revision: entry.name.clone(),
                });
                self.version += 1;
                self.updates.push(RoutingUpdate::Remove {
                    version: self.version,
                    key: shard_key(&entry.namespace, &entry.name),
                });
            }
        }
        for source_revision in revisions {
            let key = source_revision.spec.key();
            let labels = &source_revision.spec.labels;
            let (shards, process_queue) = (self.shards, &self.process_queue);
            let entry = self.revisions.entry(key.clone()).or_insert_with(|| {
                Revision::new(&labels.namespace, &labels.revision, shards, process_queue)
            });
            entry.spec = Some(source_revision.spec);
            let listed: BTreeSet<SocketAddr> = source_revision.listed.into_iter().collect();
            let mut outcomes = Vec::new();
            for addr in &listed {
                match entry.pods.get_mut(addr) {
                    Some(tracked) => {
                        tracked.listed = true;
                        let outcome = tracked.pod.apply(
                            Event::InformerListed,
                            gates,
                            self.limits.windows,
                            now,
                        );
                        outcomes.push((*addr, outcome));
                    }
                    None => {
                        if entry.pods.len() >= self.limits.max_trackers_per_revision {
                            self.journal.push(Journal::TrackerLimit {
                                namespace: entry.namespace.clone(),
                                revision: entry.name.clone(),
                            });
                            continue;
                        }
                        if let Some(pod) = Pod::first_seen(Event::InformerListed, gates, now) {
                            self.journal.push(Journal::Transition {
                                revision: key.clone(),
                                pod: *addr,
                                from: None,
                                to: Some(pod.state()),
                                reason: pod.reason(),
                                source: Source::Informer,
                            });
                            entry.pods.insert(
                                *addr,
                                TrackedPod {
                                    pod,
                                    tracker: Arc::new(PodTracker::new(*addr, 0)),
                                    listed: true,
                                },
                            );
                        }
                    }
                }
            }
            for (addr, tracked) in entry.pods.iter_mut() {
                if listed.contains(addr) {
                    continue;
                }
                if omission == OmissionScope::ListedPods && !tracked.listed {
                    continue;
                }
                let in_flight = tracked.tracker.in_flight();
                let outcome = tracked.pod.apply(
                    Event::InformerOmitted { in_flight },
                    gates,
                    self.limits.windows,
                    now,
                );
                outcomes.push((*addr, outcome));
            }
            for (addr, outcome) in outcomes {
                self.record(&key, addr, outcome, Source::Informer, now);
            }
        }
        // Every revision: listings may have changed any of them, and a gate flip changes
        // routability everywhere. Unchanged routes publish nothing.
        self.publish_all();
    }

    fn cleanup_stale(&mut self, now: Timestamp) {
        let keys: Vec<String> = self.revisions.keys().cloned().collect();
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
                    let (reason, source) = (Reason::Stale, Source::Housekeeping);
                    forget(
                        &mut self.journal,
                        &key,
                        addr,
                        &tracked,
                        from,
                        reason,
                        source,
                    );
                }
            }
            // A revision only queue-proxies mentioned, with nothing left, is forgotten.
            if entry.spec.is_none() && entry.pods.is_empty() {
                self.revisions.remove(&key);
            }
        }
    }

    /// Journals an outcome and applies a removal; keeps the quarantine timers in step.
    fn record(
        &mut self,
        key: &str,
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
                self.journal.push(Journal::Transition {
                    revision: key.to_string(),
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
                            .insert((until.max(now), key.to_string(), addr));
                    }
                }
            }
            Outcome::Remove { from, reason } => {
                if let Some(tracked) = entry.pods.remove(&addr) {
                    forget(&mut self.journal, key, addr, &tracked, from, reason, source);
                }
            }
        }
    }

    fn publish_all(&mut self) {
        let keys: Vec<String> = self.revisions.keys().cloned().collect();
        for key in keys {
            self.publish(&key);
        }
    }

    /// Publishes `key`'s route if it differs from the last one published.
    fn publish(&mut self, key: &str) {
        let Some(entry) = self.revisions.get_mut(key) else {
            return;
        };
        let Some(spec) = entry.spec.clone() else {
            return;
        };
        let routable: Vec<SocketAddr> = entry
            .pods
            .iter()
            .filter(|(_, tracked)| tracked.pod.is_routable(self.gates))
            .map(|(addr, _)| *addr)
            .collect();
        let assignments = match self.activators.me {
            Some(me) => subsetting::assign(
                &routable,
                &self.activators.all,
                me,
                spec.container_concurrency,
            ),
            None => routable
                .iter()
                .map(|&pod| subsetting::Assignment {
                    pod,
                    share: spec.container_concurrency,
                })
                .collect(),
        };
        let shares: Vec<(SocketAddr, u32)> = assignments
            .iter()
            .map(|assignment| {
                let capacity = match (spec.container_concurrency, assignment.share) {
                    (0, _) => UNLIMITED,
                    (_, share) => share,
                };
                (assignment.pod, capacity)
            })
            .collect();
        // Pods outside the route keep counting their in-flight requests but take no new ones
        // through a stale replica: their capacity drops to zero at once.
        for (addr, tracked) in &entry.pods {
            let capacity = shares
                .iter()
                .find(|(pod, _)| pod == addr)
                .map_or(0, |(_, capacity)| *capacity);
            tracked.tracker.slots.set_capacity(capacity);
        }
        if entry
            .published
            .as_ref()
            .is_some_and(|(published_spec, published)| {
                *published_spec == spec && *published == shares
            })
        {
            return;
        }
        let route = RevisionRoute {
            key: shard_key(&entry.namespace, &entry.name),
            labels: spec.labels.clone(),
            container_concurrency: spec.container_concurrency,
            protocol: spec.protocol,
            timeouts: spec.timeouts,
            lb_policy: spec.lb_policy,
            pods: shares
                .iter()
                .map(|(addr, _)| entry.pods[addr].tracker.clone())
                .collect(),
            gate: entry.gate.clone(),
            queue_depth: spec.queue_depth,
        };
        self.journal.push(Journal::Route {
            namespace: entry.namespace.clone(),
            revision: entry.name.clone(),
            pods: shares.len(),
            capacity: (spec.container_concurrency > 0)
                .then(|| shares.iter().map(|(_, share)| u64::from(*share)).sum()),
        });
        entry.published = Some((spec, shares));
        self.version += 1;
        self.updates.push(RoutingUpdate::Upsert {
            version: self.version,
            route: Arc::new(route),
        });
    }
}

/// Port a bare pod IP maps to when its revision is not declared yet, and a revision's default
/// for HTTP/1 pods: 8012, Knative's `networking.BackendHTTPPort` (the queue-proxy's HTTP/1 port).
pub const DEFAULT_SERVING_PORT: u16 = 8012;

/// A revision's default serving port for h2c pods: 8013, Knative's
/// `networking.BackendHTTP2Port`. Kept for HTTP/2; h2c revisions are refused for now.
pub const DEFAULT_H2C_SERVING_PORT: u16 = 8013;

/// A tracker taken out of the table: it takes no new requests from any shard, even before the
/// shards apply the update that drops it, and its removal is journaled.
fn forget(
    journal: &mut Vec<Journal>,
    key: &str,
    addr: SocketAddr,
    tracked: &TrackedPod,
    from: PodState,
    reason: Reason,
    source: Source,
) {
    tracked.tracker.slots.set_capacity(0);
    journal.push(Journal::Transition {
        revision: key.to_string(),
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

    fn spec(name: &str, cc: u32) -> RevisionSpec {
        RevisionSpec {
            labels: RevisionLabels {
                namespace: "ns".into(),
                revision: name.into(),
                ..Default::default()
            },
            container_concurrency: cc,
            protocol: Protocol::Http1,
            timeouts: Timeouts::default(),
            lb_policy: LbPolicy::default_for(cc),
            queue_depth: 100,
            serving_port: 8012,
        }
    }

    fn declare(revisions: &[(&str, u32, &[&str])], gates: Gates) -> Op {
        Op::RecalculateAll {
            revisions: revisions
                .iter()
                .map(|(name, cc, pods)| SourceRevision {
                    spec: spec(name, *cc),
                    listed: pods.iter().map(|pod| addr(pod)).collect(),
                })
                .collect(),
            omission: OmissionScope::ListedPods,
            gates,
        }
    }

    fn qp(name: &str, ip: &str, event: QueueProxyEvent) -> Op {
        Op::MutatePod {
            namespace: "ns".into(),
            revision: name.into(),
            target: PodTarget::Ip(ip.parse().unwrap()),
            event: Event::QueueProxy(event),
            source: Source::QueueProxy,
        }
    }

    fn health(name: &str, pod: &str, event: Event) -> Op {
        Op::MutatePod {
            namespace: "ns".into(),
            revision: name.into(),
            target: PodTarget::Addr(addr(pod)),
            event,
            source: Source::Prober,
        }
    }

    fn states() -> PodStates {
        PodStates::new(
            2,
            Gates::HYBRID,
            Limits::default(),
            Arc::new(ProcessQueue::new(u32::MAX)),
        )
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

    #[test]
    fn listed_pods_route_at_once_with_their_whole_concurrency() {
        let mut states = states();
        states
            .apply(
                declare(
                    &[("a", 2, &["10.0.0.1:8012", "10.0.0.2:8012"])],
                    Gates::HYBRID,
                ),
                at(0),
            )
            .unwrap();
        let updates = states.take_updates();
        assert_eq!(
            last_route(&updates, "a").unwrap(),
            vec![(addr("10.0.0.1:8012"), 2), (addr("10.0.0.2:8012"), 2)]
        );
        // The same view again publishes nothing.
        states
            .apply(
                declare(
                    &[("a", 2, &["10.0.0.1:8012", "10.0.0.2:8012"])],
                    Gates::HYBRID,
                ),
                at(1),
            )
            .unwrap();
        assert!(states.take_updates().is_empty());
    }

    #[test]
    fn a_queue_proxy_ready_makes_a_bare_ip_routable_on_the_serving_port() {
        let mut states = states();
        states
            .apply(declare(&[("a", 1, &[])], Gates::HYBRID), at(0))
            .unwrap();
        assert_eq!(last_route(&states.take_updates(), "a").unwrap(), vec![]);
        states
            .apply(qp("a", "10.0.0.7", QueueProxyEvent::Startup), at(1))
            .unwrap();
        assert!(states.take_updates().is_empty(), "startup is not ready");
        states
            .apply(qp("a", "10.0.0.7", QueueProxyEvent::Ready), at(2))
            .unwrap();
        assert_eq!(
            last_route(&states.take_updates(), "a").unwrap(),
            vec![(addr("10.0.0.7:8012"), 1)]
        );
        // A file reload that does not list it leaves it alone: the file never listed it.
        states
            .apply(declare(&[("a", 1, &[])], Gates::HYBRID), at(100))
            .unwrap();
        assert_eq!(
            states.pod_state("ns", "a", addr("10.0.0.7:8012")),
            Some(PodState::Ready)
        );
    }

    #[test]
    fn pods_announced_before_their_revision_is_declared_route_once_it_is() {
        let mut states = states();
        states
            .apply(qp("late", "10.0.0.9", QueueProxyEvent::Ready), at(0))
            .unwrap();
        assert!(
            states.take_updates().is_empty(),
            "nothing to route without a spec"
        );
        states
            .apply(declare(&[("late", 3, &[])], Gates::HYBRID), at(1))
            .unwrap();
        assert_eq!(
            last_route(&states.take_updates(), "late").unwrap(),
            vec![(addr("10.0.0.9:8012"), 3)]
        );
    }

    #[test]
    fn not_ready_leaves_routing_but_keeps_the_tracker_and_its_in_flight_count() {
        let mut states = states();
        states
            .apply(declare(&[("a", 1, &[])], Gates::HYBRID), at(0))
            .unwrap();
        states
            .apply(qp("a", "10.0.0.7", QueueProxyEvent::Ready), at(0))
            .unwrap();
        let updates = states.take_updates();
        let route = last_upsert(&updates);
        let tracker = route.pods[0].clone();
        assert!(tracker.slots.try_acquire(), "a request in flight");
        states
            .apply(qp("a", "10.0.0.7", QueueProxyEvent::NotReady), at(1))
            .unwrap();
        assert_eq!(last_route(&states.take_updates(), "a").unwrap(), vec![]);
        assert_eq!(
            tracker.slots.capacity(),
            0,
            "no shard may start another request there"
        );
        states
            .apply(qp("a", "10.0.0.7", QueueProxyEvent::Ready), at(2))
            .unwrap();
        let updates = states.take_updates();
        let route = last_upsert(&updates);
        assert!(
            Arc::ptr_eq(&route.pods[0], &tracker),
            "the same tracker comes back"
        );
        assert!(!tracker.slots.try_acquire(), "still one in flight at CC 1");
    }

    #[test]
    fn quarantine_takes_a_pod_out_until_it_ends_then_probation_then_ready() {
        let mut states = states();
        let pod = "10.0.0.1:8012";
        states
            .apply(declare(&[("a", 1, &[pod])], Gates::HYBRID), at(0))
            .unwrap();
        states.take_updates();
        states
            .apply(health("a", pod, Event::HealthCheckFailed), at(10))
            .unwrap();
        assert_eq!(last_route(&states.take_updates(), "a").unwrap(), vec![]);
        assert_eq!(
            states.next_deadline(),
            Some(at(11)),
            "first quarantine lasts 1 s"
        );
        states.expire_quarantines(at(10));
        assert_eq!(
            states.pod_state("ns", "a", addr(pod)),
            Some(PodState::Quarantined)
        );
        states.expire_quarantines(at(11));
        assert_eq!(
            states.pod_state("ns", "a", addr(pod)),
            Some(PodState::Recovering)
        );
        assert_eq!(
            last_route(&states.take_updates(), "a").unwrap().len(),
            1,
            "probation routes"
        );
        assert_eq!(states.probe_targets().len(), 1);
        states
            .apply(health("a", pod, Event::HealthCheckPassed), at(12))
            .unwrap();
        assert_eq!(
            states.pod_state("ns", "a", addr(pod)),
            Some(PodState::Ready)
        );
        assert_eq!(states.next_deadline(), None);
    }

    #[test]
    fn turning_quarantine_off_releases_quarantined_pods_and_stops_probing() {
        let mut states = states();
        let pod = "10.0.0.1:8012";
        states
            .apply(declare(&[("a", 1, &[pod])], Gates::HYBRID), at(0))
            .unwrap();
        states
            .apply(health("a", pod, Event::HealthCheckFailed), at(1))
            .unwrap();
        assert_eq!(last_route(&states.take_updates(), "a").unwrap(), vec![]);
        // Same file, quarantine off: nothing would ever end the quarantine, so the informer's
        // listing releases the pod (pod_state's table) and the timer is dropped.
        states
            .apply(declare(&[("a", 1, &[pod])], Gates::QUEUE_PROXY_ONLY), at(3))
            .unwrap();
        assert_eq!(
            states.pod_state("ns", "a", addr(pod)),
            Some(PodState::Ready)
        );
        assert_eq!(last_route(&states.take_updates(), "a").unwrap().len(), 1);
        assert!(states.probe_targets().is_empty());
        assert_eq!(states.next_deadline(), None);
    }

    #[test]
    fn ip_reuse_removes_the_tracker_at_once_and_removal_is_idempotent() {
        let mut states = states();
        let pod = "10.0.0.1:8012";
        states
            .apply(
                declare(&[("a", 4, &[pod, "10.0.0.2:8012"])], Gates::HYBRID),
                at(0),
            )
            .unwrap();
        let updates = states.take_updates();
        let route = last_upsert(&updates);
        let reused = route.pods[0].clone();
        let remove = Op::RemovePod {
            namespace: "ns".into(),
            revision: "a".into(),
            addr: addr(pod),
            reason: Reason::IpReused,
            source: Source::Proxy,
        };
        states.apply(remove.clone(), at(1)).unwrap();
        assert_eq!(reused.slots.capacity(), 0);
        assert_eq!(
            last_route(&states.take_updates(), "a").unwrap(),
            vec![(addr("10.0.0.2:8012"), 4)]
        );
        states.apply(remove, at(2)).unwrap();
        assert!(states.take_updates().is_empty());
        let removals = states
            .take_journal()
            .into_iter()
            .filter(|entry| matches!(entry, Journal::Transition { to: None, .. }))
            .count();
        assert_eq!(removals, 1);
    }

    /// Review finding: a shard retired a pod that answered as another revision by writing its
    /// capacity, and any later publish of the revision wrote the share back before the control
    /// thread heard of the retirement. The pod must stay out whatever is published meanwhile.
    #[test]
    fn a_pod_retired_by_a_shard_stays_out_when_its_revision_is_republished() {
        let mut states = states();
        states
            .apply(
                declare(
                    &[("a", 1, &["10.0.0.1:8012", "10.0.0.2:8012"])],
                    Gates::HYBRID,
                ),
                at(0),
            )
            .unwrap();
        let route = last_upsert(&states.take_updates()).clone();
        let retired = route.pods[0].clone();
        assert!(
            retired.slots.retire(),
            "the first shard to see it retires it"
        );
        // Before the evidence reaches the worker, another change republishes the revision.
        states
            .apply(qp("a", "10.0.0.3", QueueProxyEvent::Ready), at(1))
            .unwrap();
        let republished = last_upsert(&states.take_updates()).clone();
        assert!(republished
            .pods
            .iter()
            .any(|pod| Arc::ptr_eq(pod, &retired)));
        assert!(
            !retired.slots.try_acquire(),
            "a retired pod takes no new request, whatever the route says"
        );
    }

    #[test]
    fn the_tracker_limit_refuses_new_pods_and_says_so() {
        let mut states = PodStates::new(
            1,
            Gates::HYBRID,
            Limits {
                max_trackers_per_revision: 2,
                ..Limits::default()
            },
            Arc::new(ProcessQueue::new(u32::MAX)),
        );
        states
            .apply(declare(&[("a", 1, &[])], Gates::HYBRID), at(0))
            .unwrap();
        for ip in ["10.0.0.1", "10.0.0.2"] {
            states
                .apply(qp("a", ip, QueueProxyEvent::Ready), at(0))
                .unwrap();
        }
        let error = states.apply(qp("a", "10.0.0.3", QueueProxyEvent::Ready), at(0));
        assert_eq!(error, Err(OpError::TrackerLimit("ns/a".into(), 2)));
        assert!(states.take_journal().iter().any(
            |entry| matches!(entry, Journal::TrackerLimit { revision, .. } if revision == "a")
        ));
        // A known pod's events still apply at the limit.
        states
            .apply(qp("a", "10.0.0.1", QueueProxyEvent::NotReady), at(1))
            .unwrap();
    }

    #[test]
    fn revisions_nobody_declared_are_bounded() {
        let mut states = states();
        for i in 0..MAX_UNDECLARED_REVISIONS {
            states
                .apply(
                    qp(&format!("ghost-{i}"), "10.0.0.1", QueueProxyEvent::Ready),
                    at(0),
                )
                .unwrap();
        }
        let refused = states.apply(qp("one-more", "10.0.0.1", QueueProxyEvent::Ready), at(0));
        assert!(
            matches!(refused, Err(OpError::TooManyUndeclared(..))),
            "{refused:?}"
        );
        // A declared revision is not affected by the bound.
        states
            .apply(declare(&[("real", 1, &[])], Gates::HYBRID), at(0))
            .unwrap();
        states
            .apply(qp("real", "10.0.0.2", QueueProxyEvent::Ready), at(0))
            .unwrap();
    }

    #[test]
    fn idle_not_ready_trackers_are_collected_after_ten_minutes() {
        let mut states = states();
        states
            .apply(declare(&[("a", 1, &[])], Gates::HYBRID), at(0))
            .unwrap();
        states
            .apply(qp("a", "10.0.0.1", QueueProxyEvent::NotReady), at(0))
            .unwrap();
        states
            .apply(qp("a", "10.0.0.2", QueueProxyEvent::Ready), at(0))
            .unwrap();
        states.apply(Op::CleanupStale, at(600)).unwrap();
        assert!(states.pod_state("ns", "a", addr("10.0.0.1:8012")).is_some());
        states.apply(Op::CleanupStale, at(601)).unwrap();
        assert_eq!(states.pod_state("ns", "a", addr("10.0.0.1:8012")), None);
        assert!(states.pod_state("ns", "a", addr("10.0.0.2:8012")).is_some());
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
            let mut states = states();
            states
                .apply(
                    Op::RecalculateCapacity {
                        activators: Activators {
                            me: Some(*me),
                            all: everyone.clone(),
                        },
                    },
                    at(0),
                )
                .unwrap();
            states
                .apply(declare(&[("a", 10, &pods)], Gates::HYBRID), at(0))
                .unwrap();
            let route = last_route(&states.take_updates(), "a").unwrap();
            assert!(!route.is_empty(), "every activator gets a pod");
            for (pod, capacity) in route {
                *per_pod.entry(pod).or_default() += capacity;
            }
        }
        assert_eq!(per_pod.len(), 3);
        assert!(per_pod.values().all(|&total| total == 10), "{per_pod:?}");
    }

    #[test]
    fn a_revision_the_source_drops_is_removed_from_routing() {
        let mut states = states();
        states
            .apply(
                declare(
                    &[("a", 1, &["10.0.0.1:8012"]), ("b", 1, &[])],
                    Gates::HYBRID,
                ),
                at(0),
            )
            .unwrap();
        states.take_updates();
        states
            .apply(declare(&[("b", 1, &[])], Gates::HYBRID), at(1))
            .unwrap();
        let updates = states.take_updates();
        assert!(
            matches!(&updates[..], [RoutingUpdate::Remove { key, .. }] if key.as_str() == "ns/a")
        );
        assert_eq!(states.revision_count(), 1);
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
                namespace: "ns".into(),
                revision: name.into(),
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
            Just(Op::CleanupStale),
        ];
        (op, 0..700u64)
    }

    proptest! {
        /// Whatever happens: the published route is exactly the routable pods; trackers outside
        /// it take no new requests; the quarantine gauge folded from the journal equals a
        /// recount (never leaks); the journal's net creations and removals match the trackers.
        #[test]
        fn routes_gauges_and_journal_stay_consistent(ops in prop::collection::vec(any_op(), 1..60)) {
            let mut states = states();
            let mut now = 0;
            let mut quarantined: i64 = 0;
            let mut tracked: i64 = 0;
            let mut routes: BTreeMap<String, Vec<(SocketAddr, u32)>> = BTreeMap::new();
            for (op, step) in ops {
                now += step;
                let _ = states.apply(op, at(now));
                states.expire_quarantines(at(now));
                for update in states.take_updates() {
                    match update {
                        RoutingUpdate::Upsert { route, .. } => {
                            routes.insert(route.labels.revision.clone(), route.pods.iter().map(|pod| (pod.addr, pod.slots.capacity())).collect());
                        }
                        RoutingUpdate::Remove { key, .. } => {
                            routes.remove(key.name());
                        }
                    }
                }
                for entry in states.take_journal() {
                    if let Journal::Transition { from, to, .. } = entry {
                        quarantined += i64::from(to == Some(PodState::Quarantined)) - i64::from(from == Some(PodState::Quarantined));
                        tracked += i64::from(to.is_some()) - i64::from(from.is_some());
                    }
                }
                let counts = states.state_counts();
                prop_assert_eq!(quarantined, counts.get("quarantined").copied().unwrap_or(0) as i64);
                prop_assert_eq!(tracked, counts.values().sum::<usize>() as i64);
                let gates = states.gates();
                for (key, revision) in &states.revisions {
                    let Some(spec) = &revision.spec else { continue };
                    let expected: Vec<SocketAddr> = revision.pods.iter().filter(|(_, pod)| pod.pod.is_routable(gates)).map(|(addr, _)| *addr).collect();
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
    }
}
