//! A shard's replica of the routing table, updated from the control thread's snapshots.
//!
//! Everything here is shard-local (`Rc`, `Cell`): a request clones `Rc`s, never `Arc`s, so the
//! request path touches no cache line another shard writes. The shared state reached from here
//! is each pod's slots and each revision's admission gate (`throttle`).

use std::cell::{Cell, RefCell};
use std::hash::{Hash, Hasher};
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use kactivator_api::RevisionKey;
use rustc_hash::{FxHashMap, FxHasher};

use crate::metrics::RevisionCounters;
use crate::routing::{Grant, PodTracker, RevisionRoute, RoutingUpdate};
use crate::runtime::shard::Shard;
use crate::throttle::gate::{Admission, Effect, LocalQueue, QueueLimits, RevisionGate, WaiterId};
use crate::throttle::lb::{Balancer, Slots};

/// One pod as seen by one shard.
#[derive(Debug)]
pub struct LocalPod {
    pub tracker: Arc<PodTracker>,
    /// `Host: <ip:port>\r\n`, formatted once here rather than for every request.
    pub host_line: Box<[u8]>,
    /// `<ip:port>` as an HTTP/2 `:authority`, formatted on the first HTTP/2 request to the pod
    /// (most pods never see one).
    authority: std::cell::OnceCell<http::uri::Authority>,
    /// This shard could not connect to the pod a moment ago and passes it over until the hold
    /// ends (`request::admission::dial_failed`). Shard-local, and written only by this shard:
    /// it is not the pod's capacity, which only the control thread writes (and, once it has the
    /// evidence, sets to zero while the pod is quarantined). It bridges the moment before that
    /// decision arrives, and stands in for it when quarantine is off.
    held_off: Cell<bool>,
}

impl LocalPod {
    pub fn new(tracker: Arc<PodTracker>) -> LocalPod {
        let host_line = crate::http1::rewrite::host_line(tracker.addr);
        LocalPod {
            tracker,
            host_line,
            authority: std::cell::OnceCell::new(),
            held_off: Cell::new(false),
        }
    }

    /// The pod's address as an HTTP/2 `:authority` (a cheap clone after the first call).
    pub fn authority(&self) -> http::uri::Authority {
        self.authority
            .get_or_init(|| {
                http::uri::Authority::try_from(self.tracker.addr.to_string())
                    .expect("a socket address is a valid authority")
            })
            .clone()
    }

    /// Starts a hold; false if one is already running.
    pub fn hold_off(&self) -> bool {
        !self.held_off.replace(true)
    }

    /// Ends the hold: the pod can be picked again on this shard.
    pub fn end_hold(&self) {
        self.held_off.set(false);
    }

    pub fn is_held_off(&self) -> bool {
        self.held_off.get()
    }
}

/// Load balancers see a shard's pods through the shared slots of their trackers. A pod this
/// shard holds off refuses every slot and looks fully loaded.
impl Slots for Rc<LocalPod> {
    fn in_flight(&self) -> u32 {
        if self.held_off.get() {
            return u32::MAX;
        }
        self.tracker.slots.in_flight()
    }

    fn try_acquire(&self) -> bool {
        !self.held_off.get() && self.tracker.slots.try_acquire()
    }
}

/// A queued request's mailbox: the slot it was granted, and who to wake.
#[derive(Debug, Default)]
struct WaiterSlot {
    granted: Option<Rc<LocalPod>>,
    waker: Option<Waker>,
}

/// One revision as seen by one shard. Survives route updates: waiters, the load balancer's
/// state and counters stay.
#[derive(Debug)]
pub struct LocalRevision {
    key: RevisionKey,
    route: RefCell<Arc<RevisionRoute>>,
    /// Cross-shard admission; the same object in every version of the revision.
    gate: Arc<RevisionGate>,
    pods: RefCell<Vec<Rc<LocalPod>>>,
    balancer: RefCell<Balancer>,
    queue: RefCell<LocalQueue>,
    waiters: RefCell<FxHashMap<WaiterId, WaiterSlot>>,
    removed: Cell<bool>,
    pub counters: Arc<RevisionCounters>,
}

impl LocalRevision {
    pub fn key(&self) -> &RevisionKey {
        &self.key
    }

    /// The revision's timers, read without cloning the shared route (an `Arc` clone would be an
    /// atomic write to a cache line every shard reads).
    pub fn timeouts(&self) -> crate::routing::Timeouts {
        self.route.borrow().timeouts
    }

    /// Admits an arriving request: a slot now, a place in the queue, or a refusal.
    pub fn admit(&self, shard: &Shard) -> Admission<Rc<LocalPod>> {
        let limits = QueueLimits {
            revision_depth: self.route.borrow().queue_depth,
        };
        let mut effects = Vec::new();
        let admission =
            self.queue
                .borrow_mut()
                .admit(&self.gate, limits, || self.try_acquire(), &mut effects);
        if let Admission::Queued(id) = admission {
            // Before the effects: the dispatch inside `admit` may have served this very waiter.
            self.waiters.borrow_mut().insert(id, WaiterSlot::default());
        }
        self.apply_effects(effects, shard);
        self.publish_queued();
        admission
    }

    /// Polls a queued request: its slot once granted, `None` if the revision went away.
    pub fn poll_grant(&self, id: WaiterId, cx: &mut Context<'_>) -> Poll<Option<Rc<LocalPod>>> {
        let mut waiters = self.waiters.borrow_mut();
        let Some(slot) = waiters.get_mut(&id) else {
            return Poll::Ready(None);
        };
        if let Some(pod) = slot.granted.take() {
            waiters.remove(&id);
            return Poll::Ready(Some(pod));
        }
        if self.removed.get() {
            return Poll::Ready(None);
        }
        slot.waker = Some(cx.waker().clone());
        Poll::Pending
    }

    /// A queued request gave up (timeout, client gone, revision removed): frees its place, or
    /// the slot it was granted meanwhile.
    pub fn cancel(&self, id: WaiterId, shard: &Shard) {
        let slot = self.waiters.borrow_mut().remove(&id);
        if self.queue.borrow_mut().cancel(&self.gate, id) {
            self.publish_queued();
            return;
        }
        if let Some(WaiterSlot {
            granted: Some(pod), ..
        }) = slot
        {
            self.release(&pod, shard);
        }
    }

    /// Gives a slot back and hands free slots to waiters, on any shard. True when a request
    /// queued on this shard was woken with one.
    pub fn release(&self, pod: &LocalPod, shard: &Shard) -> bool {
        pod.tracker.slots.release();
        self.dispatch(shard)
    }

    /// Serves waiters while slots are free (after a release, a grant or new capacity). True
    /// when a request queued on this shard was woken with a slot.
    pub fn dispatch(&self, shard: &Shard) -> bool {
        if self.gate.waiting() == 0 {
            return false;
        }
        let mut effects = Vec::new();
        self.queue
            .borrow_mut()
            .dispatch(&self.gate, || self.try_acquire(), &mut effects);
        let woke_local = self.apply_effects(effects, shard);
        self.publish_queued();
        woke_local
    }

    /// A slot granted by another shard arrived.
    pub fn receive_grant(&self, tracker: Arc<PodTracker>, shard: &Shard) {
        let pod = self
            .pods
            .borrow()
            .iter()
            .find(|pod| Arc::ptr_eq(&pod.tracker, &tracker))
            .cloned()
            // The pod left this shard's view meanwhile; the slot is still real.
            .unwrap_or_else(|| Rc::new(LocalPod::new(tracker)));
        if pod.is_held_off() {
            // This shard could not connect to the pod a moment ago: none of its waiters gets
            // it (the shard that sent it has not found out yet). The slot goes back, and a
            // dispatch here hands waiters any other free slot.
            self.release(&pod, shard);
            return;
        }
        let mut effects = Vec::new();
        let unused = self.queue.borrow_mut().receive_grant(
            &self.gate,
            pod,
            || self.try_acquire(),
            &mut effects,
        );
        self.apply_effects(effects, shard);
        self.publish_queued();
        if let Some(pod) = unused {
            self.release(&pod, shard);
        }
    }

    /// This shard's queue length, for the `kactivator_revision_queued` gauge.
    fn publish_queued(&self) {
        self.counters.queued.set(self.queue.borrow().len() as u64);
    }

    fn try_acquire(&self) -> Option<Rc<LocalPod>> {
        let pods = self.pods.borrow();
        self.balancer
            .borrow_mut()
            .pick(&pods)
            .map(|at| pods[at].clone())
    }

    /// Carries out the queue's decisions; true when a local waiter was woken with a slot.
    fn apply_effects(&self, effects: Vec<Effect<Rc<LocalPod>>>, shard: &Shard) -> bool {
        let mut woke_local = false;
        for effect in effects {
            match effect {
                Effect::Wake { waiter, pod } => {
                    let mut waiters = self.waiters.borrow_mut();
                    match waiters.get_mut(&waiter) {
                        Some(slot) => {
                            slot.granted = Some(pod);
                            if let Some(waker) = slot.waker.take() {
                                waker.wake();
                                woke_local = true;
                            }
                        }
                        None => {
                            // Only cancel removes a waiter, and it leaves the queue first; if that
                            // ever breaks, the slot must still go back.
                            drop(waiters);
                            woke_local |= self.release(&pod, shard);
                        }
                    }
                }
                Effect::Grant { shard: to, pod } => {
                    let grant = Grant {
                        key: self.key.clone(),
                        pod: pod.tracker.clone(),
                    };
                    if !shard.send_grant(to, grant) {
                        woke_local |= self.release(&pod, shard);
                    }
                }
            }
        }
        woke_local
    }

    fn apply(&self, route: Arc<RevisionRoute>) {
        // A pod that stays keeps its `LocalPod` (and so a hold this shard put on it); trackers
        // are matched by identity, not address, so a new pod at an old address starts afresh.
        let mut kept: FxHashMap<*const PodTracker, Rc<LocalPod>> = self
            .pods
            .borrow_mut()
            .drain(..)
            .map(|pod| (Arc::as_ptr(&pod.tracker), pod))
            .collect();
        *self.pods.borrow_mut() = route
            .pods
            .iter()
            .map(|tracker| {
                kept.remove(&Arc::as_ptr(tracker))
                    .unwrap_or_else(|| Rc::new(LocalPod::new(tracker.clone())))
            })
            .collect();
        self.balancer.borrow_mut().set_policy(route.lb_policy);
        *self.route.borrow_mut() = route;
        self.removed.set(false);
    }

    /// The revision is gone: every local waiter is woken to answer, and their places (in the
    /// revision's depth and the process-wide cap) are given back now, since a waiter woken this
    /// way does not cancel.
    fn remove(&self) {
        self.pods.borrow_mut().clear();
        self.removed.set(true);
        self.queue.borrow_mut().cancel_all(&self.gate);
        self.publish_queued();
        for slot in self.waiters.borrow_mut().values_mut() {
            if let Some(waker) = slot.waker.take() {
                waker.wake();
            }
        }
    }
}

/// The shard's routing table.
#[derive(Debug, Default)]
pub struct Replica {
    revisions: RefCell<FxHashMap<RevisionKey, Rc<LocalRevision>>>,
    /// Metric blocks outlive a revision's removal so counters never go backwards.
    counters: RefCell<FxHashMap<RevisionKey, Arc<RevisionCounters>>>,
    version: Cell<u64>,
    /// Where `find` spells the key, so that a connection keeps no key of its own.
    scratch: RefCell<String>,
}

impl Replica {
    /// Looks a revision up by `namespace/name`.
    pub fn get(&self, key: &str) -> Option<Rc<LocalRevision>> {
        self.revisions.borrow().get(key).cloned()
    }

    /// Looks a revision up by its namespace and name.
    pub fn find(&self, namespace: &str, name: &str) -> Option<Rc<LocalRevision>> {
        let mut key = self.scratch.borrow_mut();
        RevisionKey::spell(namespace, name, &mut key);
        self.get(&key)
    }

    /// Applies one update from the control thread.
    pub fn apply(&self, update: RoutingUpdate, shard: &Shard) {
        let stats = shard.stats();
        let version = update.version();
        match update {
            RoutingUpdate::Upsert { route, .. } => {
                let existing = self.revisions.borrow().get(&route.key).cloned();
                let revision = match existing {
                    Some(revision) => {
                        revision.apply(route);
                        revision
                    }
                    None => {
                        let counters = self
                            .counters
                            .borrow_mut()
                            .entry(route.key.clone())
                            .or_insert_with(|| {
                                stats.register_revision(
                                    route.labels.clone(),
                                    shard.settings.report_load,
                                )
                            })
                            .clone();
                        let seed = (shard.index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                            ^ hash_key(route.key.as_str());
                        let revision = Rc::new(LocalRevision {
                            key: route.key.clone(),
                            route: RefCell::new(route.clone()),
                            gate: route.gate.clone(),
                            pods: RefCell::new(Vec::new()),
                            balancer: RefCell::new(Balancer::new(route.lb_policy, seed)),
                            queue: RefCell::new(LocalQueue::new(shard.index)),
                            waiters: RefCell::new(FxHashMap::default()),
                            removed: Cell::new(false),
                            counters,
                        });
                        revision.apply(route.clone());
                        self.revisions
                            .borrow_mut()
                            .insert(route.key.clone(), revision.clone());
                        revision
                    }
                };
                // New pods or capacity may serve requests already waiting.
                revision.dispatch(shard);
            }
            RoutingUpdate::Remove { key, .. } => {
                let removed = self.revisions.borrow_mut().remove(&key);
                if let Some(revision) = removed {
                    revision.remove();
                }
            }
        }
        // Versions only move forward; an update may arrive for a revision already removed.
        if version > self.version.get() {
            self.version.set(version);
            stats.routing_version.set(version);
        }
    }
}

fn hash_key(key: &str) -> u64 {
    let mut hasher = FxHasher::default();
    key.hash(&mut hasher);
    hasher.finish()
}
