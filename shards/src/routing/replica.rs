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

use crate::fields::RequestHeaders;
use crate::metrics::{Counter, RevisionCounters, ShardStats};
use crate::routing::rules::RuleTable;
use crate::routing::{PodTracker, Protocol, RevisionRoute, RoutingUpdate};
use crate::runtime::tls::{ClientTls, UpstreamTls};
use crate::throttle::gate::{
    Admission, Class, Effect, LocalQueue, Placement, QueueLimits, RevisionGate, WaiterId,
};
use crate::throttle::lb::{Balancer, Slots};
use crate::upstream::pool::IdleConns;

/// One pod as seen by one shard. Protocol-neutral: what a front needs of a pod's address in its
/// own terms (HTTP/1's `Host` line, HTTP/2's `:authority`) is its own business.
#[derive(Debug)]
pub struct LocalPod {
    pub tracker: Arc<PodTracker>,
    /// This shard could not connect to the pod a moment ago and passes it over until the hold
    /// ends (`lifecycle::admission::dial_failed`). Shard-local, and written only by this shard:
    /// it is not the pod's capacity, which only the control thread writes (and, once it has the
    /// evidence, sets to zero while the pod is quarantined). It bridges the moment before that
    /// decision arrives, and stands in for it when quarantine is off.
    held_off: Cell<bool>,
    /// The pod's address as text (`ip:port`, `[ipv6]:port`), written once when the shard first
    /// sees the pod rather than for every request sent there: HTTP/1's `Host` and HTTP/2's
    /// `:authority` are both this text.
    authority: Box<str>,
    /// How the pod is reached over TLS, or plain TCP (`None`): its revision's current setting,
    /// kept shard-local so a request takes it without touching a counter other shards share.
    tls: RefCell<Option<Rc<UpstreamTls>>>,
    /// An HTTP/1 client's request goes to it in HTTP/2: its revision speaks h2c
    /// (`RevisionRoute::protocol`) and the shard's role sends such requests there in h2c
    /// (`Role::http1_in_h2c`). Kept beside `tls` for the same reason.
    http1_in_h2c: Cell<bool>,
    /// This shard's idle keep-alive connections to the pod, plain and TLS: found with the pod,
    /// with no lookup by address, and closed when the shard stops routing to it.
    pub idle_plain: IdleConns<monoio::net::TcpStream>,
    pub idle_tls: IdleConns<ClientTls>,
}

impl LocalPod {
    pub fn new(tracker: Arc<PodTracker>) -> LocalPod {
        LocalPod {
            authority: tracker.addr.to_string().into_boxed_str(),
            tracker,
            held_off: Cell::new(false),
            tls: RefCell::new(None),
            http1_in_h2c: Cell::new(false),
            idle_plain: IdleConns::default(),
            idle_tls: IdleConns::default(),
        }
    }

    /// The TLS the pod is dialled with for a client that came over TLS (`secure`) or not;
    /// `None`: plain TCP.
    #[inline]
    pub fn tls(&self, secure: bool) -> Option<Rc<UpstreamTls>> {
        self.tls
            .borrow()
            .as_ref()
            .filter(|tls| secure || !tls.clients_over_tls_only)
            .cloned()
    }

    /// Whether an HTTP/1 client's request goes to the pod in HTTP/2.
    #[inline]
    pub fn takes_http1_in_h2c(&self) -> bool {
        self.http1_in_h2c.get()
    }

    /// How the pod is reached: over TLS or not, and whether HTTP/1 requests go in h2c.
    fn set_upstream(&self, tls: Option<Rc<UpstreamTls>>, http1_in_h2c: bool) {
        *self.tls.borrow_mut() = tls;
        self.http1_in_h2c.set(http1_in_h2c);
    }

    /// The pod's address as an authority: `ip:port`.
    #[inline]
    pub fn authority(&self) -> &str {
        &self.authority
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

/// What a revision leaves its shard to do after handing slots out: the slots granted to waiters
/// on other shards, to be sent over their mailboxes (a grant that cannot be delivered is
/// released, which may hand it on again: `shard::Shard::deliver`), and the evictions asked of
/// other shards for requests here. Almost always empty, which costs no allocation.
#[must_use = "granted slots must be delivered or released"]
#[derive(Debug, Default)]
pub struct Outbox {
    /// A request queued on this shard was woken with a slot.
    pub woke_local: bool,
    /// What goes to other shards. One list for both kinds keeps an empty outbox as cheap as
    /// one empty `Vec`.
    pub outgoing: Vec<Outgoing>,
}

/// One thing an [`Outbox`] sends to another shard.
#[derive(Debug)]
pub enum Outgoing {
    /// A slot for that shard's next waiter.
    Grant { to: usize, pod: Rc<LocalPod> },
    /// Shed a waiter below `below` for request `waiter` here (`throttle::gate::Effect::Evict`).
    Evict {
        to: usize,
        below: u8,
        waiter: WaiterId,
    },
}

impl Outbox {
    pub fn merge(&mut self, other: Outbox) {
        self.woke_local |= other.woke_local;
        self.outgoing.extend(other.outgoing);
    }
}

/// A queued request's mailbox: the slot it was granted (or why it will get none), and who to
/// wake.
#[derive(Debug, Default)]
struct WaiterSlot {
    granted: Option<Rc<LocalPod>>,
    /// It left the queue without a slot: shed (`throttle::gate::Effect::Shed`) or refused
    /// after displacing (`throttle::gate::Placement::Refused`).
    ended: Option<Ungranted>,
    waker: Option<Waker>,
}

impl WaiterSlot {
    /// Ends the wait without a slot and wakes the request to answer.
    fn end(&mut self, why: Ungranted) {
        self.ended = Some(why);
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }
}

/// Why a queued request left the queue without a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ungranted {
    /// The revision left routing.
    Removed,
    /// A request of a higher band took its place in a full queue.
    Shed,
    /// The queue was full and the lower band's waiter another shard was asked to shed for it
    /// was gone by then.
    Refused,
}

/// A static route a request matched: what it answers, and whether always
/// (`placeholder::StaticRoute`).
pub struct StaticMatch {
    pub response: Arc<crate::routing::placeholder::Placeholder>,
    pub always: bool,
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
    /// The route's TLS to pods, as a shard-local copy every pod of the revision shares.
    tls: RefCell<Option<Rc<UpstreamTls>>>,
    balancer: RefCell<Balancer>,
    queue: RefCell<LocalQueue>,
    waiters: RefCell<FxHashMap<WaiterId, WaiterSlot>>,
    removed: Cell<bool>,
    /// The route has a placeholder (`RevisionRoute::cold_start`): what every request asks,
    /// kept beside the route so the common answer is one load.
    has_placeholder: Cell<bool>,
    /// The route has static routes (`RouteRules::statics`), kept as `has_placeholder` is.
    has_statics: Cell<bool>,
    /// The shard's role sends HTTP/1 requests to pods that speak h2c in h2c
    /// ([`Replica::new`]).
    http1_in_h2c: bool,
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

    /// The longest wait that began without a routable pod (`RevisionRoute::cold_start`).
    pub fn cold_start_wait(&self) -> Option<std::time::Duration> {
        self.route.borrow().cold_start.wait
    }

    /// The route a request goes to once its wait for a first pod ran out, if any.
    pub fn failover(&self) -> Option<RevisionKey> {
        self.route.borrow().cold_start.failover.clone()
    }

    /// Whether HTTP/1 requests go to the revision's pods in h2c now.
    fn http1_in_h2c(&self) -> bool {
        self.http1_in_h2c && self.route.borrow().protocol == Protocol::H2c
    }

    /// The placeholder a request gets at once, when the route has one, does not hold requests
    /// before it (`ColdStart::hold_before_placeholder`), and has no routable pod now. Every
    /// request asks: the common answer (no placeholder) is inline and a few instructions.
    #[inline]
    pub fn placeholder_now(&self) -> Option<Arc<crate::routing::placeholder::Placeholder>> {
        if !self.has_placeholder.get() {
            return None;
        }
        self.placeholder_if_no_pod()
    }

    #[inline(never)]
    fn placeholder_if_no_pod(&self) -> Option<Arc<crate::routing::placeholder::Placeholder>> {
        let placeholder = self.route.borrow().cold_start.placeholder.clone()?;
        (!self.has_routable_pod()).then_some(placeholder)
    }

    /// The first of the route's static routes that a request with these fields matches, if
    /// any. Every request asks: the common answer (none) is inline and one load.
    #[inline]
    pub fn static_route<H: RequestHeaders + ?Sized>(&self, fields: &H) -> Option<StaticMatch> {
        if !self.has_statics.get() {
            return None;
        }
        self.first_static_route(fields)
    }

    #[inline(never)]
    fn first_static_route<H: RequestHeaders + ?Sized>(&self, fields: &H) -> Option<StaticMatch> {
        let route = self.route.borrow();
        let statics = &route.rules.as_deref()?.statics;
        let authority = fields.authority().unwrap_or_default();
        let target = fields.target();
        statics
            .iter()
            .find(|route| {
                route
                    .rules
                    .iter()
                    .any(|rule| rule.matches(authority, target, fields))
            })
            .map(|route| StaticMatch {
                response: route.response.clone(),
                always: route.always,
            })
    }

    /// The placeholder a request the full queue turned away gets instead of a 503, when the
    /// route holds requests before its placeholder and has no routable pod now.
    pub fn placeholder_on_overflow(&self) -> Option<Arc<crate::routing::placeholder::Placeholder>> {
        if !self.route.borrow().cold_start.hold_before_placeholder {
            return None;
        }
        self.placeholder_if_no_pod()
    }

    /// Whether the revision has a pod that takes requests (a share above zero):
    /// a request that queues without one is waiting for a cold start, not for a busy pod. Read
    /// only when a request queues.
    pub fn has_routable_pod(&self) -> bool {
        self.pods
            .borrow()
            .iter()
            .any(|pod| pod.tracker.slots.capacity() > 0)
    }

    /// Whether the revision has a priority policy now.
    pub fn has_priority_policy(&self) -> bool {
        self.route.borrow().priority.is_some()
    }

    /// A request's band and flow under the revision's priority policy; the default class
    /// (ignored by the queue) without one. `invalid` counts a priority header that is not a band.
    #[inline]
    pub fn classify<H: RequestHeaders + ?Sized>(&self, headers: &H, invalid: &Counter) -> Class {
        let route = self.route.borrow();
        let Some(policy) = &route.priority else {
            return Class::default();
        };
        let classified = policy.classify(headers);
        if classified.invalid {
            invalid.increment();
        }
        let class = classified.class;
        let counters = self.counters.priority_counters();
        // A band past the policy's last waits in the last (`Waiters::push`); counted there too.
        let band = class.band.min(policy.bands.saturating_sub(1));
        counters.bands[usize::from(band)].requests.increment();
        counters.count_tenant(class.flow, || headers.get(&policy.tenant_header));
        class
    }

    /// Admits an arriving request of `class`: a slot now, a place in the queue, or a refusal.
    pub fn admit(&self, class: Class) -> (Admission<Rc<LocalPod>>, Outbox) {
        let limits = self.limits();
        let mut effects = Vec::new();
        let admission = self.queue.borrow_mut().admit_as(
            &self.gate,
            limits,
            class,
            || self.try_acquire(),
            &mut effects,
        );
        if let Admission::Queued(id) | Admission::Displacing(id) = admission {
            // Before the effects: the dispatch inside `admit` may have served this very waiter.
            self.waiters.borrow_mut().insert(id, WaiterSlot::default());
        }
        let outbox = self.apply_effects(effects);
        self.publish_queued();
        (admission, outbox)
    }

    /// Polls a queued request: its slot once granted, or why it has none.
    pub fn poll_grant(
        &self,
        id: WaiterId,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Rc<LocalPod>, Ungranted>> {
        let mut waiters = self.waiters.borrow_mut();
        let Some(slot) = waiters.get_mut(&id) else {
            return Poll::Ready(Err(Ungranted::Removed));
        };
        if let Some(pod) = slot.granted.take() {
            waiters.remove(&id);
            return Poll::Ready(Ok(pod));
        }
        if let Some(why) = slot.ended {
            waiters.remove(&id);
            return Poll::Ready(Err(why));
        }
        if self.removed.get() {
            return Poll::Ready(Err(Ungranted::Removed));
        }
        slot.waker = Some(cx.waker().clone());
        Poll::Pending
    }

    /// A queued request gave up (timeout, client gone, revision removed): frees its place, or
    /// the slot it was granted meanwhile.
    pub fn cancel(&self, id: WaiterId) -> Outbox {
        let slot = self.waiters.borrow_mut().remove(&id);
        if self.queue.borrow_mut().cancel(&self.gate, id) {
            self.publish_queued();
            return Outbox::default();
        }
        match slot {
            Some(WaiterSlot {
                granted: Some(pod), ..
            }) => self.release(&pod),
            _ => Outbox::default(),
        }
    }

    /// Gives a slot back and hands free slots to waiters, on any shard.
    #[inline]
    pub fn release(&self, pod: &LocalPod) -> Outbox {
        pod.tracker.slots.release();
        self.dispatch()
    }

    /// Serves waiters while slots are free (after a release, a grant or new capacity).
    #[inline]
    pub fn dispatch(&self) -> Outbox {
        if self.gate.waiting() == 0 {
            return Outbox::default();
        }
        self.dispatch_waiting()
    }

    fn dispatch_waiting(&self) -> Outbox {
        let mut effects = Vec::new();
        self.queue
            .borrow_mut()
            .dispatch(&self.gate, || self.try_acquire(), &mut effects);
        let outbox = self.apply_effects(effects);
        self.publish_queued();
        outbox
    }

    /// A slot granted by another shard arrived.
    pub fn receive_grant(&self, tracker: Arc<PodTracker>) -> Outbox {
        let pod = self
            .pods
            .borrow()
            .iter()
            .find(|pod| Arc::ptr_eq(&pod.tracker, &tracker))
            .cloned()
            // The pod left this shard's view meanwhile; the slot is still real.
            .unwrap_or_else(|| {
                let pod = LocalPod::new(tracker);
                pod.set_upstream(self.tls.borrow().clone(), self.http1_in_h2c());
                Rc::new(pod)
            });
        if pod.is_held_off() {
            // This shard could not connect to the pod a moment ago: none of its waiters gets
            // it (the shard that sent it has not found out yet). The slot goes back, and a
            // dispatch here hands waiters any other free slot.
            return self.release(&pod);
        }
        let mut effects = Vec::new();
        let unused = self.queue.borrow_mut().receive_grant(
            &self.gate,
            pod,
            || self.try_acquire(),
            &mut effects,
        );
        let mut outbox = self.apply_effects(effects);
        self.publish_queued();
        if let Some(pod) = unused {
            outbox.merge(self.release(&pod));
        }
        outbox
    }

    /// The revision's gate, which tells this revision from a later one of the same name.
    pub fn gate(&self) -> &Arc<RevisionGate> {
        &self.gate
    }

    /// Another shard asks this one to shed a waiter of a band below `below` for its request
    /// (`Handoff::Evict`). True when one was shed: its places go back with the answer.
    pub fn evict(&self, below: u8) -> bool {
        let mut effects = Vec::new();
        let shed = self
            .queue
            .borrow_mut()
            .evict(&self.gate, below, &mut effects);
        // Only the shed waiter is woken: no slot moves.
        let outbox = self.apply_effects(effects);
        debug_assert!(outbox.outgoing.is_empty());
        self.publish_queued();
        shed
    }

    /// The answer to an eviction asked for request `waiter` arrives (`Handoff::Place`).
    pub fn receive_place(&self, waiter: WaiterId, placed: bool) -> Outbox {
        let limits = self.limits();
        let mut effects = Vec::new();
        let placement = self.queue.borrow_mut().receive_place(
            &self.gate,
            limits,
            waiter,
            placed,
            || self.try_acquire(),
            &mut effects,
        );
        if placement == Placement::Refused {
            if let Some(slot) = self.waiters.borrow_mut().get_mut(&waiter) {
                slot.end(Ungranted::Refused);
            }
        }
        let outbox = self.apply_effects(effects);
        self.publish_queued();
        outbox
    }

    /// This shard's queue length, for the `kactivator_revision_queued` gauge.
    fn publish_queued(&self) {
        self.counters.queued.set(self.queue.borrow().len() as u64);
    }

    /// The revision's queue bounds as of its current route.
    fn limits(&self) -> QueueLimits {
        QueueLimits {
            revision_depth: self.route.borrow().queue_depth,
        }
    }

    fn try_acquire(&self) -> Option<Rc<LocalPod>> {
        let pods = self.pods.borrow();
        self.balancer
            .borrow_mut()
            .pick(&pods)
            .map(|at| pods[at].clone())
    }

    /// Carries out the queue's decisions on this shard (local waiters woken); what goes to
    /// other shards is left in the outbox.
    fn apply_effects(&self, effects: Vec<Effect<Rc<LocalPod>>>) -> Outbox {
        let mut outbox = Outbox::default();
        for effect in effects {
            match effect {
                Effect::Wake { waiter, pod } => {
                    let mut waiters = self.waiters.borrow_mut();
                    match waiters.get_mut(&waiter) {
                        Some(slot) => {
                            slot.granted = Some(pod);
                            if let Some(waker) = slot.waker.take() {
                                waker.wake();
                                outbox.woke_local = true;
                            }
                        }
                        None => {
                            // Only cancel removes a waiter, and it leaves the queue first; if that
                            // ever breaks, the slot must still go back.
                            drop(waiters);
                            outbox.merge(self.release(&pod));
                        }
                    }
                }
                Effect::Grant { shard: to, pod } => {
                    outbox.outgoing.push(Outgoing::Grant { to, pod })
                }
                Effect::Shed { waiter } => {
                    // It already left the queue; its mailbox says why, and it is woken to answer.
                    if let Some(slot) = self.waiters.borrow_mut().get_mut(&waiter) {
                        slot.end(Ungranted::Shed);
                    }
                }
                Effect::Evict {
                    shard: to,
                    below,
                    waiter,
                } => outbox.outgoing.push(Outgoing::Evict { to, below, waiter }),
            }
        }
        outbox
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
        let http1_in_h2c = self.http1_in_h2c && route.protocol == Protocol::H2c;
        let tls = route.upstream_tls.as_ref().map(|tls| {
            Rc::new(UpstreamTls {
                config: tls.config.clone(),
                config_h2: tls.config_h2.clone(),
                server_name: tls.server_name.clone(),
                port: tls.port,
                clients_over_tls_only: tls.clients_over_tls_only,
            })
        });
        *self.pods.borrow_mut() = route
            .pods
            .iter()
            .map(|tracker| {
                let pod = kept
                    .remove(&Arc::as_ptr(tracker))
                    .unwrap_or_else(|| Rc::new(LocalPod::new(tracker.clone())));
                pod.set_upstream(tls.clone(), http1_in_h2c);
                pod
            })
            .collect();
        *self.tls.borrow_mut() = tls;
        self.balancer.borrow_mut().set_policy(route.lb_policy);
        let priority = route.priority.as_ref();
        self.queue.borrow_mut().set_policy(
            &self.gate,
            priority.map(|policy| policy.bands),
            priority.map_or(0, |policy| policy.default_band),
        );
        self.has_placeholder.set(
            route.cold_start.placeholder.is_some() && !route.cold_start.hold_before_placeholder,
        );
        self.has_statics.set(
            route
                .rules
                .as_ref()
                .is_some_and(|rules| !rules.statics.is_empty()),
        );
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
    /// The routes that have rules ([`RevisionRoute::rules`]), for a role that routes by them;
    /// built again once a route's rules changed or such a route went ([`Replica::settle_rules`]).
    rules: RefCell<RuleTable<RevisionKey>>,
    /// A route's rules changed since the table was built: it is built again once the updates
    /// at hand are applied, not once per update (a first view of thousands of routes would
    /// build it thousands of times).
    rules_stale: Cell<bool>,
    /// The shard's role sends an HTTP/1 client's request to a pod that speaks h2c in h2c
    /// (`Role::http1_in_h2c`): its pods say so (`LocalPod::takes_http1_in_h2c`).
    http1_in_h2c: bool,
}

impl Replica {
    /// A shard's empty table; `http1_in_h2c`: its role sends HTTP/1 requests to pods that speak
    /// h2c in h2c.
    pub fn new(http1_in_h2c: bool) -> Replica {
        Replica {
            http1_in_h2c,
            ..Replica::default()
        }
    }

    /// Calls `each` with every pod the shard routes to (the idle connections' sweep and the
    /// drain's close).
    pub fn for_each_pod(&self, mut each: impl FnMut(&LocalPod)) {
        for revision in self.revisions.borrow().values() {
            for pod in revision.pods.borrow().iter() {
                each(pod);
            }
        }
    }

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

    /// The revision whose rules a request with these fields matches, in the precedence of KEDA's
    /// HTTP add-on ([`RuleTable::route`]); `None`: no rule matches.
    pub fn route_by_rules<H: RequestHeaders + ?Sized>(
        &self,
        fields: &H,
    ) -> Option<Rc<LocalRevision>> {
        self.settle_rules();
        let rules = self.rules.borrow();
        let key = rules.route(
            fields.authority().unwrap_or_default(),
            fields.target(),
            fields,
        )?;
        self.get(key.as_str())
    }

    /// Builds the rule table again if a route's rules changed since it was built. The shard
    /// calls it once it has applied the updates at hand; a lookup calls it too, so that no
    /// request sees a stale table whoever applied the updates.
    pub fn settle_rules(&self) {
        if self.rules_stale.replace(false) {
            self.rebuild_rules();
        }
    }

    /// Builds the rule table again from every route that has rules.
    fn rebuild_rules(&self) {
        let revisions = self.revisions.borrow();
        let routes: Vec<Arc<RevisionRoute>> = revisions
            .values()
            .map(|revision| revision.route.borrow().clone())
            .filter(|route| route.rules.is_some())
            .collect();
        let table = RuleTable::build(routes.iter().filter_map(|route| {
            let rules = route.rules.as_deref()?;
            Some((route.key.clone(), rules.order.clone(), &rules.rules[..]))
        }));
        *self.rules.borrow_mut() = table;
    }

    /// Applies one update from the control thread on the shard whose counters are `stats`
    /// (`report_load`: an autoscaler reporter reads revisions' load). New pods or capacity may
    /// serve requests already waiting: what that hands to other shards comes back with the
    /// revision.
    pub fn apply(
        &self,
        update: RoutingUpdate,
        stats: &ShardStats,
        report_load: bool,
    ) -> Option<(Rc<LocalRevision>, Outbox)> {
        let version = update.version();
        let mut handed_on = None;
        match update {
            RoutingUpdate::Upsert { route, .. } => {
                let existing = self.revisions.borrow().get(&route.key).cloned();
                let rules_changed = match &existing {
                    Some(revision) => revision.route.borrow().rules != route.rules,
                    None => route.rules.is_some(),
                };
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
                                stats.register_revision(route.labels.clone(), report_load)
                            })
                            .clone();
                        let seed = (stats.index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                            ^ hash_key(route.key.as_str());
                        let revision = Rc::new(LocalRevision {
                            key: route.key.clone(),
                            route: RefCell::new(route.clone()),
                            gate: route.gate.clone(),
                            pods: RefCell::new(Vec::new()),
                            tls: RefCell::new(None),
                            balancer: RefCell::new(Balancer::new(route.lb_policy, seed)),
                            queue: RefCell::new(LocalQueue::new(stats.index)),
                            waiters: RefCell::new(FxHashMap::default()),
                            removed: Cell::new(false),
                            has_placeholder: Cell::new(false),
                            has_statics: Cell::new(false),
                            http1_in_h2c: self.http1_in_h2c,
                            counters,
                        });
                        revision.apply(route.clone());
                        self.revisions
                            .borrow_mut()
                            .insert(route.key.clone(), revision.clone());
                        revision
                    }
                };
                if rules_changed {
                    self.rules_stale.set(true);
                }
                // New pods or capacity may serve requests already waiting.
                let outbox = revision.dispatch();
                handed_on = Some((revision, outbox));
            }
            RoutingUpdate::Remove { key, .. } => {
                let removed = self.revisions.borrow_mut().remove(&key);
                if let Some(revision) = removed {
                    revision.remove();
                    if revision.route.borrow().rules.is_some() {
                        self.rules_stale.set(true);
                    }
                }
            }
        }
        // Versions only move forward; an update may arrive for a revision already removed.
        if version > self.version.get() {
            self.version.set(version);
            stats.routing_version.set(version);
        }
        handed_on
    }
}

fn hash_key(key: &str) -> u64 {
    let mut hasher = FxHasher::default();
    key.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;
    use crate::routing::placeholder::{Placeholder, PlaceholderBody};
    use crate::routing::{ColdStart, LbPolicy, RevisionLabels, Timeouts};

    /// Route `default/app` with `pods` (one slot each), `protocol` and `cold_start`.
    fn route(pods: usize, protocol: Protocol, cold_start: ColdStart) -> RoutingUpdate {
        let pods = (0..pods)
            .map(|index| {
                let addr = SocketAddr::from(([10, 0, 0, 1 + index as u8], 8080));
                Arc::new(PodTracker::new(addr, 1))
            })
            .collect();
        RoutingUpdate::Upsert {
            version: 1,
            route: Arc::new(RevisionRoute {
                key: RevisionKey::new("default", "app").unwrap(),
                labels: RevisionLabels::default(),
                container_concurrency: 1,
                protocol,
                timeouts: Timeouts::default(),
                lb_policy: LbPolicy::FirstAvailable,
                pods,
                gate: Arc::new(RevisionGate::new(1)),
                queue_depth: 2,
                priority: None,
                upstream_tls: None,
                rules: None,
                cold_start,
            }),
        }
    }

    fn placeholder() -> Option<Arc<Placeholder>> {
        Some(Arc::new(Placeholder {
            status: 503,
            fields: Vec::new(),
            body: PlaceholderBody::Inline(b"warming up".to_vec()),
        }))
    }

    fn revision(update: RoutingUpdate) -> Rc<LocalRevision> {
        revision_in(Replica::default(), update)
    }

    fn revision_in(replica: Replica, update: RoutingUpdate) -> Rc<LocalRevision> {
        let stats = ShardStats::new(0);
        replica.apply(update, &stats, false);
        replica.get("default/app").expect("the route")
    }

    #[test]
    fn a_placeholder_answers_at_once_or_only_what_a_full_queue_turns_away() {
        let at_once = ColdStart {
            placeholder: placeholder(),
            ..ColdStart::default()
        };
        let cold = revision(route(0, Protocol::Http1, at_once.clone()));
        assert!(cold.placeholder_now().is_some(), "no pod: at once");
        assert!(cold.placeholder_on_overflow().is_none());
        let warm = revision(route(1, Protocol::Http1, at_once));
        assert!(warm.placeholder_now().is_none(), "a pod: proxied");

        let behind = ColdStart {
            placeholder: placeholder(),
            hold_before_placeholder: true,
            ..ColdStart::default()
        };
        let cold = revision(route(0, Protocol::Http1, behind.clone()));
        assert!(cold.placeholder_now().is_none(), "held for a pod first");
        assert!(
            cold.placeholder_on_overflow().is_some(),
            "the overflow gets it"
        );
        let warm = revision(route(1, Protocol::Http1, behind));
        assert!(
            warm.placeholder_on_overflow().is_none(),
            "a full queue with a pod is a 503"
        );
    }

    #[test]
    fn http1_requests_go_in_h2c_only_to_an_h2c_routes_pods_and_only_if_the_role_says() {
        let takes = |role: bool, protocol| {
            let revision =
                revision_in(Replica::new(role), route(2, protocol, ColdStart::default()));
            let pods = revision.pods.borrow();
            assert!(pods
                .iter()
                .all(|pod| pod.takes_http1_in_h2c() == pods[0].takes_http1_in_h2c()));
            pods[0].takes_http1_in_h2c()
        };
        assert!(takes(true, Protocol::H2c));
        assert!(!takes(true, Protocol::Http1));
        assert!(
            !takes(false, Protocol::H2c),
            "Knative's roles keep the client's protocol"
        );
    }

    #[test]
    fn the_first_static_route_a_request_matches_is_the_one() {
        use crate::routing::placeholder::StaticRoute;
        use crate::routing::rules::{RouteOrder, Rule};
        use crate::routing::RouteRules;
        let statics = |paths: &[(&str, bool)]| {
            paths
                .iter()
                .map(|(path, always)| StaticRoute {
                    rules: vec![Rule {
                        paths: vec![path.to_string()],
                        ..Rule::default()
                    }],
                    response: placeholder().unwrap(),
                    always: *always,
                })
                .collect()
        };
        let with = |statics| {
            let RoutingUpdate::Upsert { route, .. } =
                route(1, Protocol::Http1, ColdStart::default())
            else {
                unreachable!()
            };
            let mut route = Arc::into_inner(route).unwrap();
            route.rules = Some(Arc::new(RouteRules {
                order: RouteOrder {
                    created: 0,
                    namespace: "default".into(),
                    name: "app".into(),
                },
                rules: vec![Rule::default()],
                statics,
            }));
            revision(RoutingUpdate::Upsert {
                version: 1,
                route: Arc::new(route),
            })
        };
        let request = |path: &'static str| [("Host", "a.example.com"), (":path", path)];
        let none = with(Vec::new());
        assert!(none.static_route(&request("/healthz")[..]).is_none());
        let two = with(statics(&[("/healthz", true), ("/", false)]));
        let matched = |path| two.static_route(&request(path)[..]).map(|m| m.always);
        assert_eq!(
            matched("/healthz/live"),
            Some(true),
            "the first that matches"
        );
        assert_eq!(matched("/other"), Some(false));
    }
}
