//! Cross-shard admission for one revision: who gets the next free slot, on which shard.
//!
//! Sans-IO: shards call in with the current state and get back *effects* (wake a local waiter,
//! send a slot to another shard). The I/O shell delivers grants over channels; tests deliver
//! them in any order a simulation picks.
//!
//! Shared state per revision ([`RevisionGate`]): a ticket dispenser giving every queued
//! request its place in arrival order, the number of waiters on all shards, and for each shard
//! the ticket of its oldest waiter. Each shard keeps its own FIFO of waiters ([`LocalQueue`]).
//!
//! The rules, and the invariant each one keeps:
//!
//! * **No barging.** A request takes a slot directly only while nobody waits anywhere; otherwise
//!   it takes a ticket and queues, even if a slot happens to be free (a dispatch then serves the
//!   oldest waiter, which may be this one).
//! * **No lost wake-up.** A queueing request counts itself as waiting *then* dispatches; a
//!   finishing request releases its slot *then* reads the waiting count and dispatches if
//!   non-zero. Both sides use `SeqCst`, so at least one of them sees the other: either the
//!   releaser dispatches, or the queued request's own dispatch finds the slot.
//! * **Oldest first, within a bounded error.** A dispatch serves the shard whose oldest waiter
//!   has the lowest ticket. Two dispatchers racing may both pick the same shard; the surplus
//!   grant finds the next waiter there, or none and is released and re-dispatched. So a waiter
//!   can be overtaken only by waiters served through grants that were in flight at that moment.
//! * **No slot is stranded.** A slot travels inside a grant; whoever receives a grant either
//!   hands it to a waiter or releases it and dispatches again.
//! * **Bounded.** A per-revision depth and a process-wide cap on waiters (★ upstream's queue is
//!   effectively unbounded); over either, the request is refused (503 upstream's way).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

/// No waiter on a shard.
const NONE: u64 = u64::MAX;

/// Identifies a queued request within its shard.
pub type WaiterId = u64;

/// TEMPORARY stand-in until the process-wide cap lands: counts nothing.
#[derive(Debug)]
pub struct ProcessQueue {
    limit: u32,
}

impl ProcessQueue {
    pub fn new(limit: u32) -> ProcessQueue {
        ProcessQueue { limit }
    }
    pub fn limit(&self) -> u32 {
        self.limit
    }
    pub fn queued(&self) -> u32 {
        0
    }
}

/// A revision's admission state shared by all shards.
#[derive(Debug)]
pub struct RevisionGate {
    next_ticket: AtomicU64,
    waiting: AtomicU32,
    /// Per shard: the ticket of its oldest waiter, or `NONE`.
    heads: Box<[CachePadded<AtomicU64>]>,
}

impl RevisionGate {
    pub fn new(shards: usize) -> RevisionGate {
        RevisionGate {
            next_ticket: AtomicU64::new(0),
            waiting: AtomicU32::new(0),
            heads: (0..shards.max(1))
                .map(|_| CachePadded::new(AtomicU64::new(NONE)))
                .collect(),
        }
    }

    pub fn with_process_queue(
        shards: usize,
        _process: std::sync::Arc<ProcessQueue>,
    ) -> RevisionGate {
        RevisionGate::new(shards)
    }

    /// Requests waiting on all shards.
    pub fn waiting(&self) -> u32 {
        self.waiting.load(Ordering::SeqCst)
    }

    /// The shard holding the oldest waiter.
    fn oldest_shard(&self) -> Option<usize> {
        let mut best: Option<(u64, usize)> = None;
        for (shard, head) in self.heads.iter().enumerate() {
            let ticket = head.load(Ordering::SeqCst);
            if ticket != NONE && best.is_none_or(|(oldest, _)| ticket < oldest) {
                best = Some((ticket, shard));
            }
        }
        best.map(|(_, shard)| shard)
    }
}

/// Limits on waiting requests.
#[derive(Clone, Copy, Debug)]
pub struct QueueLimits {
    /// Most requests waiting for this revision, on all shards.
    pub revision_depth: u32,
}

/// What became of an arriving request.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission<P> {
    /// A slot on this pod is held for the request.
    Proceed(P),
    /// The request waits; it will be named in a [`Effect::Wake`].
    Queued(WaiterId),
    /// The queue is full: answer 503.
    Rejected,
}

/// Something the shard must do after a gate call.
#[derive(Debug, PartialEq, Eq)]
pub enum Effect<P> {
    /// Give this local waiter the slot it was waiting for.
    Wake { waiter: WaiterId, pod: P },
    /// Send this held slot to another shard (its oldest waiter is older than ours).
    Grant { shard: usize, pod: P },
}

#[derive(Debug)]
struct Waiter {
    ticket: u64,
    id: WaiterId,
}

/// One shard's waiters for one revision.
#[derive(Debug)]
pub struct LocalQueue {
    shard: usize,
    waiters: VecDeque<Waiter>,
    next_id: WaiterId,
}

impl LocalQueue {
    pub fn new(shard: usize) -> LocalQueue {
        LocalQueue {
            shard,
            waiters: VecDeque::new(),
            next_id: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.waiters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }

    /// A request arrives on this shard. `try_acquire` picks a pod and takes a slot on it (the
    /// load balancer over the shard's routable pods).
    pub fn admit<P>(
        &mut self,
        gate: &RevisionGate,
        limits: QueueLimits,
        mut try_acquire: impl FnMut() -> Option<P>,
        effects: &mut Vec<Effect<P>>,
    ) -> Admission<P> {
        if gate.waiting() == 0 {
            if let Some(pod) = try_acquire() {
                return Admission::Proceed(pod);
            }
        }
        // Reserve a place within the bound before taking a ticket.
        let reserved = gate
            .waiting
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |waiting| {
                (waiting < limits.revision_depth).then_some(waiting + 1)
            });
        if reserved.is_err() {
            return Admission::Rejected;
        }
        let ticket = gate.next_ticket.fetch_add(1, Ordering::SeqCst);
        let id = self.next_id;
        self.next_id += 1;
        self.waiters.push_back(Waiter { ticket, id });
        self.publish_head(gate);
        // Counted as waiting before this dispatch looks for a slot: see "No lost wake-up".
        self.dispatch(gate, try_acquire, effects);
        Admission::Queued(id)
    }

    /// Hands free slots to the oldest waiters, here or on other shards, until either runs out.
    /// Call after releasing a slot when `gate.waiting() > 0`, and after a grant could not be used.
    pub fn dispatch<P>(
        &mut self,
        gate: &RevisionGate,
        mut try_acquire: impl FnMut() -> Option<P>,
        effects: &mut Vec<Effect<P>>,
    ) {
        while gate.waiting() > 0 {
            let Some(shard) = gate.oldest_shard() else {
                return;
            };
            let Some(pod) = try_acquire() else { return };
            if shard == self.shard {
                // Only this shard writes its head, so a head naming us means our queue is not
                // empty; should that ever break, bounce the slot through a grant to ourselves,
                // which releases it and dispatches again.
                match self.pop_oldest(gate) {
                    Some(waiter) => effects.push(Effect::Wake { waiter, pod }),
                    None => {
                        debug_assert!(false, "head published for an empty queue");
                        effects.push(Effect::Grant { shard, pod });
                        return;
                    }
                }
            } else {
                effects.push(Effect::Grant { shard, pod });
                // The remote shard pops its waiter when the grant arrives; until then our view
                // of heads is unchanged, so stop rather than send it every free slot.
                return;
            }
        }
    }

    /// A slot sent by another shard arrives. With a waiter here it is woken and the dispatch
    /// chain continues (more slots may be free: a grant moves one slot, a dispatch that sent it
    /// stopped there). With none, the slot comes back: the caller releases it and calls
    /// [`LocalQueue::dispatch`] so it finds the next oldest waiter.
    pub fn receive_grant<P>(
        &mut self,
        gate: &RevisionGate,
        pod: P,
        try_acquire: impl FnMut() -> Option<P>,
        effects: &mut Vec<Effect<P>>,
    ) -> Option<P> {
        let Some(waiter) = self.pop_oldest(gate) else {
            return Some(pod);
        };
        effects.push(Effect::Wake { waiter, pod });
        self.dispatch(gate, try_acquire, effects);
        None
    }

    /// A waiter gave up (client gone, timeout): its place is freed at once.
    pub fn cancel(&mut self, gate: &RevisionGate, waiter: WaiterId) -> bool {
        let Some(at) = self.waiters.iter().position(|queued| queued.id == waiter) else {
            return false;
        };
        self.waiters.remove(at);
        gate.waiting.fetch_sub(1, Ordering::SeqCst);
        self.publish_head(gate);
        true
    }

    fn pop_oldest(&mut self, gate: &RevisionGate) -> Option<WaiterId> {
        let waiter = self.waiters.pop_front()?;
        gate.waiting.fetch_sub(1, Ordering::SeqCst);
        self.publish_head(gate);
        Some(waiter.id)
    }

    fn publish_head(&self, gate: &RevisionGate) {
        let head = self.waiters.front().map_or(NONE, |waiter| waiter.ticket);
        gate.heads[self.shard].store(head, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::throttle::slots::PodSlots;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, HashSet};

    const LIMITS: QueueLimits = QueueLimits {
        revision_depth: 1000,
    };

    fn acquire_from(pods: &[PodSlots]) -> impl FnMut() -> Option<usize> + '_ {
        move || pods.iter().position(PodSlots::try_acquire)
    }

    #[test]
    fn requests_proceed_while_nobody_waits_and_queue_when_full() {
        let gate = RevisionGate::new(1);
        let pods = [PodSlots::new(1)];
        let mut queue = LocalQueue::new(0);
        let mut effects = Vec::new();
        assert_eq!(
            queue.admit(&gate, LIMITS, acquire_from(&pods), &mut effects),
            Admission::Proceed(0)
        );
        assert_eq!(
            queue.admit(&gate, LIMITS, acquire_from(&pods), &mut effects),
            Admission::Queued(0)
        );
        assert!(effects.is_empty());
        // The holder finishes: release, then dispatch because someone waits.
        assert!(pods[0].release());
        queue.dispatch(&gate, acquire_from(&pods), &mut effects);
        assert_eq!(effects, vec![Effect::Wake { waiter: 0, pod: 0 }]);
        assert_eq!(gate.waiting(), 0);
    }

    #[test]
    fn a_newcomer_does_not_barge_past_a_waiter() {
        let gate = RevisionGate::new(2);
        let pods = [PodSlots::new(1)];
        let (mut first, mut second) = (LocalQueue::new(0), LocalQueue::new(1));
        let mut effects = Vec::new();
        assert_eq!(
            first.admit(&gate, LIMITS, acquire_from(&pods), &mut effects),
            Admission::Proceed(0)
        );
        assert_eq!(
            first.admit(&gate, LIMITS, acquire_from(&pods), &mut effects),
            Admission::Queued(0)
        );
        // The slot frees but, before anyone dispatches, a newcomer arrives on another shard:
        // it must queue, and the dispatch it runs serves the older waiter on shard 0.
        assert!(pods[0].release());
        assert_eq!(
            second.admit(&gate, LIMITS, acquire_from(&pods), &mut effects),
            Admission::Queued(0)
        );
        assert_eq!(effects, vec![Effect::Grant { shard: 0, pod: 0 }]);
        let Effect::Grant { pod, .. } = effects.pop().unwrap() else {
            unreachable!()
        };
        assert_eq!(
            first.receive_grant(&gate, pod, acquire_from(&pods), &mut effects),
            None
        );
        assert_eq!(effects, vec![Effect::Wake { waiter: 0, pod: 0 }]);
        assert_eq!(gate.waiting(), 1, "the newcomer still waits");
    }

    #[test]
    fn the_queue_bound_rejects_and_cancellation_frees_a_place() {
        let gate = RevisionGate::new(1);
        let pods = [PodSlots::new(0)];
        let mut queue = LocalQueue::new(0);
        let mut effects = Vec::new();
        let limits = QueueLimits { revision_depth: 2 };
        assert_eq!(
            queue.admit(&gate, limits, acquire_from(&pods), &mut effects),
            Admission::Queued(0)
        );
        assert_eq!(
            queue.admit(&gate, limits, acquire_from(&pods), &mut effects),
            Admission::Queued(1)
        );
        assert_eq!(
            queue.admit(&gate, limits, acquire_from(&pods), &mut effects),
            Admission::Rejected
        );
        assert!(queue.cancel(&gate, 0));
        assert_eq!(
            queue.admit(&gate, limits, acquire_from(&pods), &mut effects),
            Admission::Queued(2)
        );
    }

    #[test]
    fn a_grant_for_a_shard_whose_waiter_left_comes_back() {
        let gate = RevisionGate::new(2);
        let mut remote = LocalQueue::new(1);
        let mut effects = Vec::new();
        let returned = remote.receive_grant(&gate, 7, || None, &mut effects);
        assert_eq!(
            returned,
            Some(7),
            "nobody to give it to: release and re-dispatch"
        );
        assert!(effects.is_empty());
    }

    /// One step of a simulated run: shards act in any order, grants arrive late and in any order.
    #[derive(Clone, Debug)]
    enum Step {
        Arrive(usize),
        /// An arrival on a shard whose failed slot attempt races with a release on another
        /// shard: the release lands between the attempt and the enqueue, and its releaser saw
        /// nobody waiting (the window "No lost wake-up" is about).
        ArriveRacing(usize, usize),
        Finish(usize),
        Deliver(usize),
        Cancel(usize),
        /// A new snapshot raises a pod's capacity; the shard applying it dispatches.
        Grow(usize, usize),
    }

    fn step(shards: usize) -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0..shards).prop_map(Step::Arrive),
            2 => (0..shards, 0..64usize).prop_map(|(shard, pick)| Step::ArriveRacing(shard, pick)),
            3 => (0..64usize).prop_map(Step::Finish),
            3 => (0..64usize).prop_map(Step::Deliver),
            1 => (0..64usize).prop_map(Step::Cancel),
            1 => (0..shards, 0..8usize).prop_map(|(shard, pod)| Step::Grow(shard, pod)),
        ]
    }

    /// A whole activator in one thread: shards, pods, in-flight grants, and the bookkeeping
    /// to check every request is answered exactly once.
    struct Simulation {
        gate: RevisionGate,
        pods: Vec<PodSlots>,
        queues: Vec<LocalQueue>,
        /// Requests holding a slot: (shard, pod).
        running: Vec<(usize, usize)>,
        /// Grants travelling between shards: (to shard, pod).
        in_transit: Vec<(usize, usize)>,
        /// Queued requests per shard, by waiter id, with their arrival order.
        queued: BTreeMap<(usize, WaiterId), u64>,
        served: HashSet<(usize, WaiterId)>,
        arrivals: u64,
        overtakes: u64,
    }

    impl Simulation {
        fn new(shards: usize, capacities: &[u32]) -> Simulation {
            Simulation {
                gate: RevisionGate::new(shards),
                pods: capacities
                    .iter()
                    .map(|&capacity| PodSlots::new(capacity))
                    .collect(),
                queues: (0..shards).map(LocalQueue::new).collect(),
                running: Vec::new(),
                in_transit: Vec::new(),
                queued: BTreeMap::new(),
                served: HashSet::new(),
                arrivals: 0,
                overtakes: 0,
            }
        }

        fn apply(&mut self, shard: usize, effects: Vec<Effect<usize>>) {
            for effect in effects {
                match effect {
                    Effect::Wake { waiter, pod } => self.serve(shard, waiter, pod),
                    Effect::Grant { shard: to, pod } => self.in_transit.push((to, pod)),
                }
            }
        }

        fn serve(&mut self, shard: usize, waiter: WaiterId, pod: usize) {
            let arrival = self
                .queued
                .remove(&(shard, waiter))
                .expect("a woken waiter was queued and not yet served");
            assert!(self.served.insert((shard, waiter)), "served twice");
            self.overtakes += self
                .queued
                .values()
                .filter(|&&older| older < arrival)
                .count() as u64;
            self.running.push((shard, pod));
        }

        fn step(&mut self, step: &Step) {
            let mut effects = Vec::new();
            match *step {
                Step::Arrive(shard) => {
                    let pods = &self.pods;
                    let admission = self.queues[shard].admit(
                        &self.gate,
                        LIMITS,
                        || pods.iter().position(PodSlots::try_acquire),
                        &mut effects,
                    );
                    self.record_arrival(shard, admission, effects);
                }
                Step::ArriveRacing(shard, pick) => {
                    let gate = &self.gate;
                    let pods = &self.pods;
                    let running = &mut self.running;
                    let waiting_before = gate.waiting();
                    let mut raced = false;
                    let admission = self.queues[shard].admit(
                        gate,
                        LIMITS,
                        || {
                            let got = pods.iter().position(PodSlots::try_acquire);
                            if got.is_none() && !raced && waiting_before == 0 && !running.is_empty()
                            {
                                // Another shard finishes right now; it reads `waiting` = 0 and so
                                // does not dispatch.
                                raced = true;
                                let (_, pod) = running.swap_remove(pick % running.len());
                                assert!(pods[pod].release());
                            }
                            got
                        },
                        &mut effects,
                    );
                    self.record_arrival(shard, admission, effects);
                }
                Step::Grow(shard, pod) => {
                    let shard = shard % self.queues.len();
                    let pod = pod % self.pods.len();
                    self.pods[pod].set_capacity(self.pods[pod].capacity() + 2);
                    self.dispatch_on(shard);
                }
                Step::Finish(pick) if !self.running.is_empty() => {
                    let (shard, pod) = self.running.swap_remove(pick % self.running.len());
                    assert!(self.pods[pod].release());
                    self.dispatch_on(shard);
                }
                Step::Deliver(pick) if !self.in_transit.is_empty() => {
                    let (shard, pod) = self.in_transit.swap_remove(pick % self.in_transit.len());
                    self.deliver(shard, pod);
                }
                Step::Cancel(pick) if !self.queued.is_empty() => {
                    let &(shard, waiter) =
                        self.queued.keys().nth(pick % self.queued.len()).unwrap();
                    assert!(self.queues[shard].cancel(&self.gate, waiter));
                    self.queued.remove(&(shard, waiter));
                }
                _ => {}
            }
            self.check();
        }

        fn deliver(&mut self, shard: usize, pod: usize) {
            let mut effects = Vec::new();
            let pods = &self.pods;
            let acquire = || pods.iter().position(PodSlots::try_acquire);
            let unused = self.queues[shard].receive_grant(&self.gate, pod, acquire, &mut effects);
            self.apply(shard, effects);
            if let Some(pod) = unused {
                assert!(self.pods[pod].release());
                self.dispatch_on(shard);
            }
        }

        /// Books an arrival's outcome and applies the effects of its admission.
        fn record_arrival(
            &mut self,
            shard: usize,
            admission: Admission<usize>,
            effects: Vec<Effect<usize>>,
        ) {
            match admission {
                Admission::Proceed(pod) => self.running.push((shard, pod)),
                Admission::Queued(id) => {
                    self.queued.insert((shard, id), self.arrivals);
                }
                Admission::Rejected => unreachable!("the bound is not reached here"),
            }
            self.arrivals += 1;
            self.apply(shard, effects);
        }

        /// Dispatches on `shard`, as the shell does after a release or new capacity.
        fn dispatch_on(&mut self, shard: usize) {
            let mut effects = Vec::new();
            let pods = &self.pods;
            self.queues[shard].dispatch(
                &self.gate,
                || pods.iter().position(PodSlots::try_acquire),
                &mut effects,
            );
            self.apply(shard, effects);
        }

        /// Work conservation: with every grant delivered, nobody waits while a slot is free.
        fn check_work_conserving(&self) {
            if self.in_transit.is_empty() && !self.queued.is_empty() {
                for pod in &self.pods {
                    assert!(
                        !pod.has_free_slot(),
                        "a request waits while a slot is free ({}/{})",
                        pod.in_flight(),
                        pod.capacity()
                    );
                }
            }
        }

        fn check(&self) {
            for pod in &self.pods {
                assert!(
                    pod.in_flight() <= pod.capacity(),
                    "over-commit: {} > {}",
                    pod.in_flight(),
                    pod.capacity()
                );
            }
            let held = self.running.len() + self.in_transit.len();
            let in_flight: u32 = self.pods.iter().map(PodSlots::in_flight).sum();
            assert_eq!(
                in_flight as usize, held,
                "every slot is held by a request or a grant in transit"
            );
            assert_eq!(
                self.gate.waiting() as usize,
                self.queued.len(),
                "the waiting count matches the queues"
            );
        }

        /// Lets everything finish: deliver grants, finish requests, until quiet.
        fn drain(&mut self) {
            while !self.running.is_empty() || !self.in_transit.is_empty() {
                if let Some((shard, pod)) = self.in_transit.pop() {
                    self.deliver(shard, pod);
                } else {
                    self.step(&Step::Finish(0));
                }
                self.check();
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Arbitrary interleavings of arrivals, completions, late grants and cancellations on
        /// up to four shards: no pod is over-committed, every slot is accounted for, nobody is
        /// served twice, and once traffic stops every queued request is served (no lost wake-up,
        /// no stranded slot).
        #[test]
        fn handoff_is_safe_and_work_conserving(
            shards in 1..5usize,
            capacities in prop::collection::vec(0..3u32, 1..4),
            steps in prop::collection::vec(step(4), 1..300),
        ) {
            prop_assume!(capacities.iter().any(|&capacity| capacity > 0));
            let mut simulation = Simulation::new(shards, &capacities);
            for step in &steps {
                let step = match *step {
                    Step::Arrive(shard) => Step::Arrive(shard % shards),
                    Step::ArriveRacing(shard, pick) => Step::ArriveRacing(shard % shards, pick),
                    ref other => other.clone(),
                };
                simulation.step(&step);
            }
            simulation.drain();
            prop_assert!(simulation.queued.is_empty(), "{} requests never served", simulation.queued.len());
            prop_assert_eq!(simulation.gate.waiting(), 0);
        }

        /// With grants delivered at once (no messages in flight), service is strictly in
        /// arrival order across shards.
        #[test]
        fn prompt_delivery_serves_in_arrival_order(
            shards in 1..5usize,
            steps in prop::collection::vec(prop_oneof![
                3 => (0..4usize).prop_map(Step::Arrive),
                1 => (0..4usize, 0..64usize).prop_map(|(shard, pick)| Step::ArriveRacing(shard, pick)),
                2 => (0..64usize).prop_map(Step::Finish),
                1 => (0..4usize, 0..2usize).prop_map(|(shard, pod)| Step::Grow(shard, pod)),
            ], 1..300),
        ) {
            let mut simulation = Simulation::new(shards, &[1, 2]);
            for step in &steps {
                let step = match *step {
                    Step::Arrive(shard) => Step::Arrive(shard % shards),
                    Step::ArriveRacing(shard, pick) => Step::ArriveRacing(shard % shards, pick),
                    ref other => other.clone(),
                };
                simulation.step(&step);
                while let Some((shard, pod)) = simulation.in_transit.pop() {
                    simulation.deliver(shard, pod);
                }
                simulation.check_work_conserving();
            }
            simulation.drain();
            prop_assert_eq!(simulation.overtakes, 0, "someone was served before an older waiter");
            prop_assert!(simulation.queued.is_empty());
        }
    }
}
