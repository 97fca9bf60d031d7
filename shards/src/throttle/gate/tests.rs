use super::*;
use crate::throttle::slots::PodSlots;
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap, HashSet};

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
fn the_process_cap_is_shared_by_every_revision() {
    let process = Arc::new(ProcessQueue::new(3));
    let a = RevisionGate::with_process_queue(1, process.clone());
    let b = RevisionGate::with_process_queue(1, process.clone());
    assert!(Arc::ptr_eq(a.process_queue(), b.process_queue()));
    let (pods_a, pods_b) = ([PodSlots::new(0)], [PodSlots::new(0)]);
    let (mut queue_a, mut queue_b) = (LocalQueue::new(0), LocalQueue::new(0));
    let mut effects = Vec::new();
    let limits = QueueLimits { revision_depth: 2 };
    let mut admit_a =
        |queue: &mut LocalQueue| queue.admit(&a, limits, acquire_from(&pods_a), &mut effects);
    assert_eq!(admit_a(&mut queue_a), Admission::Queued(0));
    assert_eq!(admit_a(&mut queue_a), Admission::Queued(1));
    assert_eq!(admit_a(&mut queue_a), Admission::Rejected, "a's depth");
    assert_eq!(process.queued(), 2);
    let admit_b =
        |queue: &mut LocalQueue| queue.admit(&b, limits, acquire_from(&pods_b), &mut Vec::new());
    assert_eq!(admit_b(&mut queue_b), Admission::Queued(0));
    assert_eq!(
        admit_b(&mut queue_b),
        Admission::Rejected,
        "the process cap, though b has room"
    );
    assert_eq!(b.waiting(), 1, "the revision place is given back");
    assert_eq!(process.queued(), 3);

    // A cancellation on one revision frees a place for the other.
    assert!(queue_a.cancel(&a, 0));
    assert_eq!(process.queued(), 2);
    assert_eq!(admit_b(&mut queue_b), Admission::Queued(1));
    assert_eq!(process.queued(), 3);

    // Serving frees both places.
    pods_b[0].set_capacity(2);
    let mut effects = Vec::new();
    queue_b.dispatch(&b, acquire_from(&pods_b), &mut effects);
    assert_eq!(effects.len(), 2);
    assert_eq!((b.waiting(), process.queued()), (0, 1));
    assert!(queue_a.cancel(&a, 1));
    assert_eq!((a.waiting(), process.queued()), (0, 0));
}

#[test]
fn the_fast_path_needs_no_place_in_the_process_queue() {
    let process = Arc::new(ProcessQueue::new(0));
    let gate = RevisionGate::with_process_queue(1, process.clone());
    let pods = [PodSlots::new(1)];
    let mut queue = LocalQueue::new(0);
    let mut effects = Vec::new();
    assert_eq!(
        queue.admit(&gate, LIMITS, acquire_from(&pods), &mut effects),
        Admission::Proceed(0)
    );
    assert_eq!(
        queue.admit(&gate, LIMITS, acquire_from(&pods), &mut effects),
        Admission::Rejected
    );
    assert_eq!((gate.waiting(), process.queued()), (0, 0));
}

#[test]
fn a_gate_made_with_new_has_an_unlimited_process_queue_of_its_own() {
    let (a, b) = (RevisionGate::new(1), RevisionGate::new(1));
    assert_eq!(a.process_queue().limit(), ProcessQueue::UNLIMITED);
    assert!(!Arc::ptr_eq(a.process_queue(), b.process_queue()));
    let pods = [PodSlots::new(0)];
    let mut effects = Vec::new();
    let admission = LocalQueue::new(0).admit(&a, LIMITS, acquire_from(&pods), &mut effects);
    assert_eq!(admission, Admission::Queued(0));
    assert_eq!(a.process_queue().queued(), 1);
    assert_eq!(b.process_queue().queued(), 0);
}

#[test]
fn a_removed_revision_gives_back_every_place_of_its_waiters() {
    let process = Arc::new(ProcessQueue::new(10));
    let gate = RevisionGate::with_process_queue(2, process.clone());
    let pods = [PodSlots::new(0)];
    let mut queues = [LocalQueue::new(0), LocalQueue::new(1)];
    let mut effects = Vec::new();
    for shard in [0, 1, 0] {
        let admission = queues[shard].admit(&gate, LIMITS, acquire_from(&pods), &mut effects);
        assert!(matches!(admission, Admission::Queued(_)));
    }
    let [mut here, mut there] = queues;
    assert_eq!(gate.oldest_shard(), Some(0));
    assert_eq!(here.cancel_all(&gate), 2);
    assert!(here.is_empty());
    assert_eq!((gate.waiting(), process.queued()), (1, 1));
    assert_eq!(gate.oldest_shard(), Some(1), "shard 0 no longer has a head");
    assert!(!here.cancel(&gate, 0), "already gone");
    assert_eq!(there.cancel_all(&gate), 1);
    assert_eq!((gate.waiting(), process.queued()), (0, 0));
    assert_eq!(gate.oldest_shard(), None);
}

/// A queue under a priority policy of three bands.
fn banded(shard: usize, gate: &RevisionGate) -> LocalQueue {
    let mut queue = LocalQueue::new(shard);
    queue.set_policy(gate, Some(3), 1);
    queue
}

fn band(band: u8) -> Class {
    Class { band, flow: 0 }
}

#[test]
fn a_freed_slot_goes_to_the_highest_band_waiting_on_any_shard() {
    let gate = RevisionGate::new(2);
    let pods = [PodSlots::new(1)];
    let (mut low, mut high) = (banded(0, &gate), banded(1, &gate));
    let mut effects = Vec::new();
    let admit = |queue: &mut LocalQueue, class, effects: &mut Vec<_>| {
        queue.admit_as(&gate, LIMITS, class, acquire_from(&pods), effects)
    };
    assert_eq!(
        admit(&mut low, band(0), &mut effects),
        Admission::Proceed(0)
    );
    assert_eq!(admit(&mut low, band(0), &mut effects), Admission::Queued(0));
    assert_eq!(admit(&mut low, band(0), &mut effects), Admission::Queued(1));
    // Later, on the other shard, a request of the top band.
    assert_eq!(
        admit(&mut high, band(2), &mut effects),
        Admission::Queued(0)
    );
    assert!(effects.is_empty());
    // The slot frees on the low shard: it goes to the other shard's high waiter.
    assert!(pods[0].release());
    low.dispatch(&gate, acquire_from(&pods), &mut effects);
    assert_eq!(effects, vec![Effect::Grant { shard: 1, pod: 0 }]);
    effects.clear();
    assert_eq!(
        high.receive_grant(&gate, 0, acquire_from(&pods), &mut effects),
        None
    );
    assert_eq!(effects, vec![Effect::Wake { waiter: 0, pod: 0 }]);
    effects.clear();
    // Then the low waiters, oldest first.
    assert!(pods[0].release());
    high.dispatch(&gate, acquire_from(&pods), &mut effects);
    assert_eq!(effects, vec![Effect::Grant { shard: 0, pod: 0 }]);
    effects.clear();
    assert_eq!(
        low.receive_grant(&gate, 0, acquire_from(&pods), &mut effects),
        None
    );
    assert_eq!(effects, vec![Effect::Wake { waiter: 0, pod: 0 }]);
}

#[test]
fn a_full_queue_sheds_its_lowest_band_for_a_higher_arrival() {
    // (what, depth, process cap, bands of the waiters, the arrival's band, what becomes of
    // it, the waiter shed)
    type Row = (
        &'static str,
        u32,
        u32,
        &'static [u8],
        u8,
        Admission<usize>,
        Option<WaiterId>,
    );
    let table: &[Row] = &[
        ("room: queued", 3, 9, &[0, 0], 2, Admission::Queued(2), None),
        (
            "revision full: the newest of band 0",
            3,
            9,
            &[1, 0, 0],
            2,
            Admission::Queued(3),
            Some(2),
        ),
        (
            "process full: the same",
            9,
            3,
            &[1, 0, 0],
            2,
            Admission::Queued(3),
            Some(2),
        ),
        (
            "band 1 sheds band 0",
            3,
            9,
            &[0, 2, 0],
            1,
            Admission::Queued(3),
            Some(2),
        ),
        (
            "nothing lower: refused",
            2,
            9,
            &[1, 2],
            1,
            Admission::Rejected,
            None,
        ),
        (
            "the lowest band is refused",
            2,
            9,
            &[0, 0],
            0,
            Admission::Rejected,
            None,
        ),
    ];
    for &(what, depth, cap, waiting, arriving, ref admitted, shed) in table {
        let process = Arc::new(ProcessQueue::new(cap));
        let gate = RevisionGate::with_process_queue(1, process.clone());
        let pods = [PodSlots::new(0)];
        let mut queue = banded(0, &gate);
        let limits = QueueLimits {
            revision_depth: depth,
        };
        for &waiter in waiting {
            let admission = queue.admit_as(
                &gate,
                limits,
                band(waiter),
                acquire_from(&pods),
                &mut Vec::new(),
            );
            assert!(matches!(admission, Admission::Queued(_)), "{what}");
        }
        let mut effects = Vec::new();
        let admission = queue.admit_as(
            &gate,
            limits,
            band(arriving),
            acquire_from(&pods),
            &mut effects,
        );
        assert_eq!(&admission, admitted, "{what}");
        let expected: Vec<_> = shed
            .map(|waiter| Effect::Shed { waiter })
            .into_iter()
            .collect();
        assert_eq!(effects, expected, "{what}");
        assert_eq!(
            queue.len(),
            waiting.len() + usize::from(shed.is_none() && admission != Admission::Rejected),
            "{what}"
        );
        assert_eq!(
            gate.waiting() as usize,
            queue.len(),
            "{what}: the places passed on"
        );
        assert_eq!(process.queued() as usize, queue.len(), "{what}");
        assert!(
            !queue.cancel(&gate, shed.unwrap_or(WaiterId::MAX)),
            "{what}: the shed left"
        );
    }
}

#[test]
fn without_a_policy_nothing_is_shed() {
    let gate = RevisionGate::new(1);
    let pods = [PodSlots::new(0)];
    let mut queue = LocalQueue::new(0);
    let limits = QueueLimits { revision_depth: 1 };
    let mut effects = Vec::new();
    let mut admit = |class| queue.admit_as(&gate, limits, class, acquire_from(&pods), &mut effects);
    assert_eq!(admit(band(0)), Admission::Queued(0));
    assert_eq!(admit(band(2)), Admission::Rejected);
    assert!(effects.is_empty());
}

#[test]
fn a_full_queue_has_another_shard_shed_its_lowest_band_for_a_higher_arrival() {
    // Two shards under three bands, a depth of 2 taken by shard 0's waiters (ids 0 and 1),
    // a pod with no slot; a band-2 arrival on shard 1 asks shard 0 to shed. What happens on
    // either shard between the ask and the answer decides the rest.
    type Meanwhile = fn(&mut LocalQueue, &mut LocalQueue, &RevisionGate);
    // (what, bands of shard 0's waiters, meanwhile, a waiter shed, the answer's fate, the
    // waiting count after)
    type Row = (
        &'static str,
        [u8; 2],
        Meanwhile,
        Option<WaiterId>,
        Placement,
        u32,
    );
    let nothing: Meanwhile = |_, _, _| {};
    let table: &[Row] = &[
        (
            "the newest of the lowest band is shed; the arrival queues in its place",
            [0, 0],
            nothing,
            Some(1),
            Placement::Queued,
            2,
        ),
        (
            "the lowest band, not the newest waiter",
            [0, 1],
            nothing,
            Some(0),
            Placement::Queued,
            2,
        ),
        (
            "the low waiters left meanwhile: nothing to shed, but room at a second try",
            [0, 0],
            |zero, _, gate| {
                assert!(zero.cancel(gate, 0) && zero.cancel(gate, 1));
            },
            None,
            Placement::Queued,
            1,
        ),
        (
            "the low waiter left and a high one took its place: refused",
            [0, 2],
            |zero, _, gate| {
                assert!(zero.cancel(gate, 0));
                let admitted =
                    zero.admit_as(gate, LIMIT_2, band(2), || None::<usize>, &mut Vec::new());
                assert_eq!(admitted, Admission::Queued(2));
            },
            None,
            Placement::Refused,
            2,
        ),
        (
            "the arrival left before the answer: the place it was given goes back",
            [0, 0],
            |_, one, gate| assert!(one.cancel(gate, 0), "a displacing request cancels"),
            Some(1),
            Placement::Gone,
            1,
        ),
    ];
    const LIMIT_2: QueueLimits = QueueLimits { revision_depth: 2 };
    for &(what, bands, meanwhile, shed, fate, waiting) in table {
        let gate = RevisionGate::new(2);
        let (mut zero, mut one) = (banded(0, &gate), banded(1, &gate));
        let mut effects: Vec<Effect<usize>> = Vec::new();
        for band_of in bands {
            let admitted = zero.admit_as(&gate, LIMIT_2, band(band_of), || None, &mut effects);
            assert!(matches!(admitted, Admission::Queued(_)), "{what}");
        }
        let arrival = one.admit_as(&gate, LIMIT_2, band(2), || None, &mut effects);
        assert_eq!(arrival, Admission::Displacing(0), "{what}");
        assert_eq!(
            effects,
            [Effect::Evict {
                shard: 0,
                below: 2,
                waiter: 0
            }],
            "{what}"
        );
        effects.clear();
        meanwhile(&mut zero, &mut one, &gate);
        let placed = zero.evict(&gate, 2, &mut effects);
        assert_eq!(placed, shed.is_some(), "{what}");
        let shed_now: Vec<_> = effects
            .drain(..)
            .map(|effect| match effect {
                Effect::Shed { waiter } => waiter,
                other => panic!("{what}: {other:?}"),
            })
            .collect();
        assert_eq!(shed_now, shed.into_iter().collect::<Vec<_>>(), "{what}");
        let placement = one.receive_place(&gate, LIMIT_2, 0, placed, || None, &mut effects);
        assert_eq!(placement, fate, "{what}");
        assert!(effects.is_empty(), "{what}: no slot anywhere");
        assert_eq!(gate.waiting(), waiting, "{what}");
        assert_eq!(gate.process_queue().queued(), waiting, "{what}");
        assert_eq!(
            zero.len() + one.len(),
            waiting as usize,
            "{what}: the count is the queues'"
        );
    }
}

#[test]
fn the_lowest_band_anywhere_is_shed_and_a_tie_stays_on_the_arrivals_shard() {
    // Two shards under three bands, depth 2: one waiter on each, then a band-2 arrival on
    // shard 0. (what, band waiting on shard 0, band waiting on shard 1, the arrival's fate)
    type Row = (
        &'static str,
        u8,
        u8,
        Admission<usize>,
        &'static [Effect<usize>],
    );
    let table: &[Row] = &[
        (
            "lower on the other shard: asked there",
            1,
            0,
            Admission::Displacing(1),
            &[Effect::Evict {
                shard: 1,
                below: 2,
                waiter: 1,
            }],
        ),
        (
            "lower here: shed here",
            0,
            1,
            Admission::Queued(1),
            &[Effect::Shed { waiter: 0 }],
        ),
        (
            "the same band on both: shed here, no message",
            0,
            0,
            Admission::Queued(1),
            &[Effect::Shed { waiter: 0 }],
        ),
    ];
    let limits = QueueLimits { revision_depth: 2 };
    for &(what, here, there, ref fate, expected) in table {
        let gate = RevisionGate::new(2);
        let (mut zero, mut one) = (banded(0, &gate), banded(1, &gate));
        let mut effects: Vec<Effect<usize>> = Vec::new();
        assert_eq!(
            zero.admit_as(&gate, limits, band(here), || None, &mut effects),
            Admission::Queued(0)
        );
        assert_eq!(
            one.admit_as(&gate, limits, band(there), || None, &mut effects),
            Admission::Queued(0)
        );
        let arrival = zero.admit_as(&gate, limits, band(2), || None, &mut effects);
        assert_eq!(&arrival, fate, "{what}");
        assert_eq!(effects, expected, "{what}");
    }
}

#[test]
fn a_lower_band_on_another_shard_is_asked_only_under_a_policy_and_only_when_lower() {
    let gate = RevisionGate::new(2);
    let limits = QueueLimits { revision_depth: 1 };
    let (mut zero, mut one) = (banded(0, &gate), banded(1, &gate));
    let mut effects: Vec<Effect<usize>> = Vec::new();
    assert_eq!(
        zero.admit_as(&gate, limits, band(1), || None, &mut effects),
        Admission::Queued(0)
    );
    assert_eq!(
        one.admit_as(&gate, limits, band(1), || None, &mut effects),
        Admission::Rejected,
        "the same band"
    );
    assert_eq!(
        one.admit_as(&gate, limits, band(0), || None, &mut effects),
        Admission::Rejected,
        "a lower band"
    );
    assert!(effects.is_empty());
    // Arrival order publishes no band: the same queue, switched off, is asked nothing.
    zero.set_policy(&gate, None, 0);
    one.set_policy(&gate, None, 0);
    assert_eq!(
        one.admit_as(&gate, limits, band(2), || None, &mut effects),
        Admission::Rejected
    );
    assert!(effects.is_empty());
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
    /// An arrival of a band (flow 0).
    ArriveAs(usize, u8),
    /// An arrival of a band and a flow.
    ArriveFlow(usize, u8, u64),
    Finish(usize),
    Deliver(usize),
    /// An eviction asked of another shard arrives there.
    DeliverEviction(usize),
    /// The answer to an eviction arrives back.
    DeliverPlace(usize),
    /// A queued or displacing request gives up.
    Cancel(usize),
    /// A new snapshot raises a pod's capacity; the shard applying it dispatches.
    Grow(usize, usize),
}

impl Step {
    /// The same step with its shard taken modulo `shards`.
    fn on(&self, shards: usize) -> Step {
        match *self {
            Step::Arrive(shard) => Step::Arrive(shard % shards),
            Step::ArriveAs(shard, band) => Step::ArriveAs(shard % shards, band),
            Step::ArriveFlow(shard, band, flow) => Step::ArriveFlow(shard % shards, band, flow),
            Step::ArriveRacing(shard, pick) => Step::ArriveRacing(shard % shards, pick),
            ref other => other.clone(),
        }
    }
}

fn step(shards: usize) -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..shards).prop_map(Step::Arrive),
        2 => (0..shards, 0..64usize).prop_map(|(shard, pick)| Step::ArriveRacing(shard, pick)),
        3 => (0..64usize).prop_map(Step::Finish),
        3 => (0..64usize).prop_map(Step::Deliver),
        2 => (0..64usize).prop_map(Step::DeliverEviction),
        2 => (0..64usize).prop_map(Step::DeliverPlace),
        1 => (0..64usize).prop_map(Step::Cancel),
        1 => (0..shards, 0..8usize).prop_map(|(shard, pod)| Step::Grow(shard, pod)),
    ]
}

/// One revision of a simulated activator: its gate, pods and shard queues, and the
/// bookkeeping to check every request is answered exactly once.
struct Revision {
    gate: RevisionGate,
    limits: QueueLimits,
    pods: Vec<PodSlots>,
    queues: Vec<LocalQueue>,
    /// Requests holding a slot: (shard, pod).
    running: Vec<(usize, usize)>,
    /// Grants travelling between shards: (to shard, pod).
    in_transit: Vec<(usize, usize)>,
    /// Evictions travelling: (to shard, the band to shed below, from shard, its request).
    evictions: Vec<(usize, u8, usize, WaiterId)>,
    /// Answers travelling back: (to shard, its request, whether places come with it).
    places: Vec<(usize, WaiterId, bool)>,
    /// Requests waiting for the answer to their eviction, by (shard, id), with their band
    /// and arrival order.
    displacing: BTreeMap<(usize, WaiterId), (u8, u64)>,
    /// Displacing requests refused when the answer came.
    refused: u64,
    /// Queued requests per shard, by waiter id, with their band (0 without a policy) and
    /// arrival order.
    queued: BTreeMap<(usize, WaiterId), (u8, u64)>,
    /// The priority policy's bands, or `None`.
    bands: Option<u8>,
    /// Waiters that lost their place to a higher band.
    shed: u64,
    served: HashSet<(usize, WaiterId)>,
    /// The flow of each queued request that arrived with one (`Step::ArriveFlow`).
    flow_of: HashMap<(usize, WaiterId), u64>,
    /// Requests starting to wait and being served, in order, by (band, flow).
    log: Vec<Fairness>,
}

/// An entry of [`Revision::log`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fairness {
    Waits { band: u8, flow: u64 },
    Served { band: u8, flow: u64 },
}

impl Revision {
    fn apply(&mut self, shard: usize, effects: Vec<Effect<usize>>) -> u64 {
        let mut overtakes = 0;
        for effect in effects {
            match effect {
                Effect::Wake { waiter, pod } => overtakes += self.serve(shard, waiter, pod),
                Effect::Grant { shard: to, pod } => self.in_transit.push((to, pod)),
                Effect::Shed { waiter } => {
                    assert!(
                        self.queued.remove(&(shard, waiter)).is_some(),
                        "shed a request that was not waiting"
                    );
                    self.flow_of.remove(&(shard, waiter));
                    self.shed += 1;
                }
                Effect::Evict {
                    shard: to,
                    below,
                    waiter,
                } => {
                    assert_ne!(to, shard, "an eviction asked of its own shard");
                    self.evictions.push((to, below, shard, waiter));
                }
            }
        }
        overtakes
    }

    /// Places travelling with answers: counted as waiting, in no queue yet.
    fn travelling(&self) -> usize {
        self.places.iter().filter(|&&(_, _, placed)| placed).count()
    }

    /// An eviction arrives at its shard: a waiter below its band is shed, if one is left,
    /// and the answer starts back.
    fn deliver_eviction(&mut self, pick: usize) {
        let (to, below, from, waiter) = self.evictions.swap_remove(pick % self.evictions.len());
        let lowest = self
            .queued
            .iter()
            .filter(|((on, _), _)| *on == to)
            .map(|(_, &(band, _))| band)
            .min();
        let mut effects = Vec::new();
        let placed = self.queues[to].evict(&self.gate, below, &mut effects);
        assert_eq!(
            placed,
            lowest.is_some_and(|lowest| lowest < below),
            "shed exactly when a lower band waits"
        );
        if let [Effect::Shed { waiter: shed }] = effects[..] {
            assert_eq!(
                self.queued[&(to, shed)].0,
                lowest.unwrap(),
                "not the lowest band"
            );
        } else {
            assert!(effects.is_empty() && !placed, "{effects:?}");
        }
        self.apply(to, effects);
        self.places.push((from, waiter, placed));
    }

    /// An answer arrives back: its request queues in the place it carries, tries the bounds
    /// once more, or is gone.
    fn deliver_place(&mut self, pick: usize, process: &ProcessQueue) -> u64 {
        let (to, waiter, placed) = self.places.swap_remove(pick % self.places.len());
        let waiting = self.queued.len() + self.travelling();
        let full =
            waiting >= self.limits.revision_depth as usize || process.queued() >= process.limit();
        let mut effects = Vec::new();
        let pods = &self.pods;
        let placement = self.queues[to].receive_place(
            &self.gate,
            self.limits,
            waiter,
            placed,
            || pods.iter().position(PodSlots::try_acquire),
            &mut effects,
        );
        let displacing = self.displacing.remove(&(to, waiter));
        match placement {
            Placement::Queued => {
                assert!(placed || !full, "queued past a bound without a place");
                let entry = displacing.expect("a displacing request queued");
                self.queued.insert((to, waiter), entry);
            }
            Placement::Refused => {
                assert!(
                    !placed && full,
                    "refused with a place, or below both bounds"
                );
                assert!(displacing.is_some());
                self.refused += 1;
            }
            Placement::Gone => assert!(displacing.is_none(), "a waiting request was gone"),
        }
        self.apply(to, effects)
    }

    /// The band a request of `band` waits in.
    fn band_of(&self, band: u8) -> u8 {
        self.bands.map_or(0, |bands| band.min(bands - 1))
    }

    /// Serves a waiter; returns how many waiters of this revision it overtook: of a higher
    /// band, or of its band and older.
    fn serve(&mut self, shard: usize, waiter: WaiterId, pod: usize) -> u64 {
        let (band, arrival) = self
            .queued
            .remove(&(shard, waiter))
            .expect("a woken waiter was queued and not yet served");
        assert!(self.served.insert((shard, waiter)), "served twice");
        let flow = self.flow_of.remove(&(shard, waiter)).unwrap_or(0);
        self.log.push(Fairness::Served { band, flow });
        self.running.push((shard, pod));
        self.queued
            .values()
            .filter(|&&(other, older)| other > band || (other == band && older < arrival))
            .count() as u64
    }

    /// Dispatches on `shard`, as the shell does after a release or new capacity.
    fn dispatch_on(&mut self, shard: usize) -> u64 {
        let mut effects = Vec::new();
        let pods = &self.pods;
        self.queues[shard].dispatch(
            &self.gate,
            || pods.iter().position(PodSlots::try_acquire),
            &mut effects,
        );
        self.apply(shard, effects)
    }

    fn deliver(&mut self, shard: usize, pod: usize) -> u64 {
        let mut effects = Vec::new();
        let pods = &self.pods;
        let acquire = || pods.iter().position(PodSlots::try_acquire);
        let unused = self.queues[shard].receive_grant(&self.gate, pod, acquire, &mut effects);
        let mut overtakes = self.apply(shard, effects);
        if let Some(pod) = unused {
            assert!(self.pods[pod].release());
            overtakes += self.dispatch_on(shard);
        }
        overtakes
    }

    fn finish(&mut self, pick: usize) -> u64 {
        let (shard, pod) = self.running.swap_remove(pick % self.running.len());
        assert!(self.pods[pod].release());
        self.dispatch_on(shard)
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
        let waiting = self.queued.len() + self.travelling();
        assert_eq!(
            self.gate.waiting() as usize,
            waiting,
            "the waiting count matches the queues and the places travelling"
        );
        assert!(
            waiting <= self.limits.revision_depth as usize,
            "{waiting} waiting past the revision depth {}",
            self.limits.revision_depth
        );
    }
}

/// A whole activator in one thread: shards, revisions sharing a process queue, in-flight
/// grants.
struct Simulation {
    process: Arc<ProcessQueue>,
    revisions: Vec<Revision>,
    arrivals: u64,
    overtakes: u64,
    rejected: u64,
}

impl Simulation {
    /// One revision with these pod capacities and an unlimited process queue.
    fn new(shards: usize, capacities: &[u32]) -> Simulation {
        Simulation::with_revisions(shards, &[(capacities, LIMITS)], ProcessQueue::UNLIMITED)
    }

    /// Revisions of their own pods and limits, all counting against one process cap.
    fn with_revisions(
        shards: usize,
        revisions: &[(&[u32], QueueLimits)],
        process_limit: u32,
    ) -> Simulation {
        let process = Arc::new(ProcessQueue::new(process_limit));
        let revisions = revisions
            .iter()
            .map(|&(capacities, limits)| Revision {
                gate: RevisionGate::with_process_queue(shards, process.clone()),
                limits,
                pods: capacities
                    .iter()
                    .map(|&capacity| PodSlots::new(capacity))
                    .collect(),
                queues: (0..shards).map(LocalQueue::new).collect(),
                running: Vec::new(),
                in_transit: Vec::new(),
                evictions: Vec::new(),
                places: Vec::new(),
                displacing: BTreeMap::new(),
                refused: 0,
                queued: BTreeMap::new(),
                bands: None,
                shed: 0,
                served: HashSet::new(),
                flow_of: HashMap::new(),
                log: Vec::new(),
            })
            .collect();
        Simulation {
            process,
            revisions,
            arrivals: 0,
            overtakes: 0,
            rejected: 0,
        }
    }

    /// Puts every revision under a priority policy of `bands` bands.
    fn with_bands(mut self, bands: u8) -> Simulation {
        for rev in &mut self.revisions {
            rev.bands = Some(bands);
            for queue in &mut rev.queues {
                queue.set_policy(&rev.gate, Some(bands), 0);
            }
        }
        self
    }

    fn step(&mut self, revision: usize, step: &Step) {
        let revision = revision % self.revisions.len();
        let shards = self.revisions[revision].queues.len();
        let before = self.bounds(revision);
        let rev = &mut self.revisions[revision];
        let mut effects = Vec::new();
        match *step {
            Step::Arrive(shard) => {
                let shard = shard % shards;
                let pods = &rev.pods;
                let admission = rev.queues[shard].admit(
                    &rev.gate,
                    rev.limits,
                    || pods.iter().position(PodSlots::try_acquire),
                    &mut effects,
                );
                self.record_arrival(revision, shard, 0, before, admission, effects);
            }
            Step::ArriveAs(shard, band) => {
                let shard = shard % shards;
                let pods = &rev.pods;
                let admission = rev.queues[shard].admit_as(
                    &rev.gate,
                    rev.limits,
                    Class { band, flow: 0 },
                    || pods.iter().position(PodSlots::try_acquire),
                    &mut effects,
                );
                self.record_arrival(revision, shard, band, before, admission, effects);
            }
            Step::ArriveFlow(shard, band, flow) => {
                let shard = shard % shards;
                let pods = &rev.pods;
                let admission = rev.queues[shard].admit_as(
                    &rev.gate,
                    rev.limits,
                    Class { band, flow },
                    || pods.iter().position(PodSlots::try_acquire),
                    &mut effects,
                );
                if let Admission::Queued(id) = admission {
                    // Before the effects, which may serve this very waiter.
                    rev.flow_of.insert((shard, id), flow);
                    let band = rev.band_of(band);
                    rev.log.push(Fairness::Waits { band, flow });
                }
                self.record_arrival(revision, shard, band, before, admission, effects);
            }
            Step::ArriveRacing(shard, pick) => {
                let shard = shard % shards;
                let gate = &rev.gate;
                let pods = &rev.pods;
                let running = &mut rev.running;
                let mut raced = false;
                let admission = rev.queues[shard].admit(
                    gate,
                    rev.limits,
                    || {
                        let got = pods.iter().position(PodSlots::try_acquire);
                        if got.is_none() && !raced && before.0 == 0 && !running.is_empty() {
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
                self.record_arrival(revision, shard, 0, before, admission, effects);
            }
            Step::Grow(shard, pod) => {
                let shard = shard % shards;
                let pod = pod % rev.pods.len();
                rev.pods[pod].set_capacity(rev.pods[pod].capacity() + 2);
                self.overtakes += rev.dispatch_on(shard);
            }
            Step::Finish(pick) if !rev.running.is_empty() => {
                self.overtakes += rev.finish(pick);
            }
            Step::Deliver(pick) if !rev.in_transit.is_empty() => {
                let (shard, pod) = rev.in_transit.swap_remove(pick % rev.in_transit.len());
                self.overtakes += rev.deliver(shard, pod);
            }
            Step::DeliverEviction(pick) if !rev.evictions.is_empty() => {
                rev.deliver_eviction(pick);
            }
            Step::DeliverPlace(pick) if !rev.places.is_empty() => {
                self.overtakes += rev.deliver_place(pick, &self.process);
            }
            Step::Cancel(pick) if !rev.queued.is_empty() || !rev.displacing.is_empty() => {
                let pick = pick % (rev.queued.len() + rev.displacing.len());
                let &(shard, waiter) = match pick.checked_sub(rev.queued.len()) {
                    None => rev.queued.keys().nth(pick).unwrap(),
                    Some(pick) => rev.displacing.keys().nth(pick).unwrap(),
                };
                assert!(rev.queues[shard].cancel(&rev.gate, waiter));
                rev.queued.remove(&(shard, waiter));
                rev.displacing.remove(&(shard, waiter));
                rev.flow_of.remove(&(shard, waiter));
            }
            _ => {}
        }
        self.check();
    }

    /// The revision's waiting count and the process's, before a step.
    fn bounds(&self, revision: usize) -> (u32, u32) {
        (
            self.revisions[revision].gate.waiting(),
            self.process.queued(),
        )
    }

    /// Books an arrival's outcome and applies the effects of its admission. A request may
    /// queue only below both bounds (or in the place of a lower band's waiter it shed), and
    /// be refused only at one of them.
    fn record_arrival(
        &mut self,
        revision: usize,
        shard: usize,
        band: u8,
        (waiting, queued): (u32, u32),
        admission: Admission<usize>,
        effects: Vec<Effect<usize>>,
    ) {
        let rev = &mut self.revisions[revision];
        let (depth, cap) = (rev.limits.revision_depth, self.process.limit());
        match admission {
            Admission::Proceed(pod) => {
                assert_eq!(waiting, 0, "took a slot past a waiter");
                rev.running.push((shard, pod));
            }
            Admission::Queued(id) => {
                let band = rev.band_of(band);
                let shed: Vec<WaiterId> = effects
                    .iter()
                    .filter_map(|effect| match effect {
                        Effect::Shed { waiter } => Some(*waiter),
                        _ => None,
                    })
                    .collect();
                match shed[..] {
                    [] => assert!(
                        waiting < depth && queued < cap,
                        "queued at {waiting}/{depth} in the revision, {queued}/{cap} in the process"
                    ),
                    [waiter] => {
                        assert!(
                            waiting >= depth || queued >= cap,
                            "shed at {waiting}/{depth} in the revision, {queued}/{cap} in the process"
                        );
                        let (lower, _) = rev.queued[&(shard, waiter)];
                        assert!(lower < band, "shed a waiter of band {lower} for {band}");
                        let lowest = rev.queued.values().map(|&(other, _)| other).min();
                        assert_eq!(
                            lowest,
                            Some(lower),
                            "not the lowest band on any shard (ties go to the arrival's)"
                        );
                    }
                    _ => panic!("one arrival shed {shed:?}"),
                }
                rev.queued.insert((shard, id), (band, self.arrivals));
            }
            Admission::Displacing(id) => {
                let band = rev.band_of(band);
                assert!(
                    waiting >= depth || queued >= cap,
                    "displacing at {waiting}/{depth} in the revision, {queued}/{cap} in the process"
                );
                let [Effect::Evict {
                    shard: to,
                    below,
                    waiter,
                }] = effects[..]
                else {
                    panic!("a displacing arrival's effects: {effects:?}");
                };
                assert_eq!((below, waiter), (band, id));
                let lowest_on = |on: usize| {
                    rev.queued
                        .iter()
                        .filter(|((at, _), _)| *at == on)
                        .map(|(_, &(other, _))| other)
                        .min()
                };
                let lowest = lowest_on(to).expect("asked a shard with nobody waiting");
                assert!(
                    lowest_on(shard).is_none_or(|here| here > lowest),
                    "asked another shard while as low a band waits here"
                );
                assert!(lowest < band, "asked a shard whose lowest band is {lowest}");
                let lowest_anywhere = (0..rev.queues.len()).filter_map(lowest_on).min();
                assert_eq!(
                    Some(lowest),
                    lowest_anywhere,
                    "not the lowest band anywhere"
                );
                rev.displacing.insert((shard, id), (band, self.arrivals));
            }
            Admission::Rejected => {
                assert!(
                    waiting >= depth || queued >= cap,
                    "refused at {waiting}/{depth} in the revision, {queued}/{cap} in the process"
                );
                assert!(effects.is_empty());
                if let (Some(bands), Some(lowest)) = (
                    rev.bands,
                    rev.queued.values().map(|&(lower, _)| lower).min(),
                ) {
                    assert!(
                        lowest >= band.min(bands - 1),
                        "refused while band {lowest} waits, below the arrival's {band}"
                    );
                }
                self.rejected += 1;
            }
        }
        self.arrivals += 1;
        self.overtakes += rev.apply(shard, effects);
    }

    fn check(&self) {
        for revision in &self.revisions {
            revision.check();
        }
        let waiting: usize = self
            .revisions
            .iter()
            .map(|rev| rev.queued.len() + rev.travelling())
            .sum();
        assert_eq!(
            self.process.queued() as usize,
            waiting,
            "the process count matches every revision's queues and places travelling"
        );
        assert!(
            self.process.queued() <= self.process.limit(),
            "{} waiting past the process cap {}",
            self.process.queued(),
            self.process.limit()
        );
    }

    /// Lets everything finish: deliver grants, finish requests, until quiet.
    fn drain(&mut self) {
        for revision in 0..self.revisions.len() {
            loop {
                let rev = &mut self.revisions[revision];
                if !rev.evictions.is_empty() {
                    rev.deliver_eviction(0);
                } else if !rev.places.is_empty() {
                    self.overtakes += rev.deliver_place(0, &self.process);
                } else if let Some((shard, pod)) = rev.in_transit.pop() {
                    self.overtakes += rev.deliver(shard, pod);
                } else if !rev.running.is_empty() {
                    self.overtakes += rev.finish(0);
                } else {
                    break;
                }
                self.check();
            }
        }
    }

    /// Nothing waits anywhere, and every count is back to zero.
    fn assert_all_served(&self) {
        for rev in &self.revisions {
            assert!(
                rev.queued.is_empty() && rev.displacing.is_empty(),
                "{} requests never served, {} never answered",
                rev.queued.len(),
                rev.displacing.len()
            );
            assert_eq!(rev.gate.waiting(), 0);
            assert_eq!(rev.gate.oldest_shard(), None);
        }
        assert_eq!(self.process.queued(), 0);
    }
}

/// Checks start-time fair queuing's bounds in a log of a run where grants were delivered at
/// once and no waiter left except by being served. Within each band:
///
/// * Two flows that both have waiters over a stretch of the run are served counts that
///   differ by at most two there: one turn's request each (the turn under way when the
///   stretch began may already have served one of them and not yet the other).
/// * A flow that starts waiting for the first time is, for as long as it keeps waiting,
///   never served fewer than any other flow less one: another flow may take its turn's
///   request first, never a second one.
fn check_fairness(log: &[Fairness]) {
    type Flow = (u8, u64);
    let mut waiting: HashMap<Flow, usize> = HashMap::new();
    let mut served: HashMap<Flow, u64> = HashMap::new();
    let mut seen: HashSet<Flow> = HashSet::new();
    // Per pair of flows waiting together: their served counts when the stretch began.
    let mut together: HashMap<(Flow, Flow), (u64, u64)> = HashMap::new();
    // Per newcomer still waiting: every flow's served count when it arrived.
    let mut newcomers: HashMap<Flow, HashMap<Flow, u64>> = HashMap::new();
    for (at, &event) in log.iter().enumerate() {
        match event {
            Fairness::Waits { band, flow } => {
                let flow = (band, flow);
                let count = waiting.entry(flow).or_default();
                *count += 1;
                if *count == 1 {
                    for (&other, &others) in &waiting {
                        if other != flow && other.0 == band && others > 0 {
                            let counts = (served_of(&served, flow), served_of(&served, other));
                            together.insert((flow, other), counts);
                            together.insert((other, flow), (counts.1, counts.0));
                        }
                    }
                }
                if seen.insert(flow) {
                    newcomers.insert(flow, served.clone());
                }
            }
            Fairness::Served { band, flow } => {
                let flow = (band, flow);
                *served.entry(flow).or_default() += 1;
                for (&(one, other), &(from_one, from_other)) in &together {
                    if one == flow {
                        let ahead = (served[&one] - from_one) as i64
                            - (served_of(&served, other) - from_other) as i64;
                        assert!(
                            ahead <= 2,
                            "event {at}: flow {one:?} served {ahead} more than {other:?} while both waited"
                        );
                    }
                }
                for (&newcomer, since) in &newcomers {
                    if newcomer != flow && newcomer.0 == band {
                        let own = served_of(&served, newcomer)
                            - since.get(&newcomer).copied().unwrap_or(0);
                        let theirs = served[&flow] - since.get(&flow).copied().unwrap_or(0);
                        assert!(
                            theirs <= own + 1,
                            "event {at}: flow {flow:?} served {theirs} since newcomer {newcomer:?} arrived, which was served {own}"
                        );
                    }
                }
                let count = waiting.get_mut(&flow).expect("served a flow not waiting");
                *count -= 1;
                if *count == 0 {
                    together.retain(|&(one, other), _| one != flow && other != flow);
                    newcomers.remove(&flow);
                }
            }
        }
    }
}

fn served_of(served: &HashMap<(u8, u64), u64>, flow: (u8, u64)) -> u64 {
    served.get(&flow).copied().unwrap_or(0)
}

/// Serves one request at a time, grants delivered at once, until `done` holds; returns the
/// log from there.
fn serve_until(simulation: &mut Simulation, mut done: impl FnMut(&[Fairness]) -> bool) {
    while !done(&simulation.revisions[0].log) {
        assert!(
            !simulation.revisions[0].running.is_empty(),
            "nothing left to serve"
        );
        simulation.step(0, &Step::Finish(0));
        let rev = &mut simulation.revisions[0];
        while let Some((shard, pod)) = rev.in_transit.pop() {
            simulation.overtakes += rev.deliver(shard, pod);
        }
    }
}

/// Issue 27's "a tenant that queues 5 000 requests does not delay another tenant's first
/// request by more than one service turn", across shards: backlogs spread over every shard,
/// then a newcomer on one; one pod with one slot.
#[test]
fn a_backlog_on_every_shard_delays_a_newcomers_first_request_by_one_turn() {
    // (what, shards, backlogged flows and their requests, the newcomer's shard, most
    // requests served between its arrival and its own: one per other flow waiting)
    type Row = (&'static str, usize, &'static [(u64, usize)], usize, usize);
    let table: &[Row] = &[
        (
            "A's 500 over two shards, B on shard 1",
            2,
            &[(1, 500)],
            1,
            1,
        ),
        (
            "A's 500 over two shards, B on shard 0",
            2,
            &[(1, 500)],
            0,
            1,
        ),
        (
            "A's and C's 200 over three shards, B on shard 2",
            3,
            &[(1, 200), (3, 200)],
            2,
            2,
        ),
        ("one shard", 1, &[(1, 500)], 0, 1),
    ];
    for &(what, shards, backlog, newcomer_shard, most) in table {
        let mut simulation = Simulation::new(shards, &[1]).with_bands(1);
        // Flow 0's request takes the slot; everything after it waits.
        simulation.step(0, &Step::ArriveFlow(0, 0, 0));
        let mut arrival = 0;
        for round in 0..backlog.iter().map(|&(_, count)| count).max().unwrap_or(0) {
            for &(flow, count) in backlog {
                if round < count {
                    simulation.step(0, &Step::ArriveFlow(arrival % shards, 0, flow));
                    arrival += 1;
                }
            }
        }
        let newcomer = 2;
        simulation.step(0, &Step::ArriveFlow(newcomer_shard, 0, newcomer));
        let arrived = simulation.revisions[0].log.len();
        serve_until(&mut simulation, |log| {
            log.contains(&Fairness::Served {
                band: 0,
                flow: newcomer,
            })
        });
        let ahead = simulation.revisions[0].log[arrived..].len() - 1;
        assert!(
            ahead <= most,
            "{what}: the newcomer waited behind {ahead} requests (at most {most})"
        );
        simulation.drain();
        simulation.assert_all_served();
        check_fairness(&simulation.revisions[0].log);
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
            simulation.step(0, &step.on(shards));
        }
        simulation.drain();
        simulation.assert_all_served();
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
            simulation.step(0, &step.on(shards));
            let rev = &mut simulation.revisions[0];
            while let Some((shard, pod)) = rev.in_transit.pop() {
                simulation.overtakes += rev.deliver(shard, pod);
            }
            simulation.check();
            simulation.revisions[0].check_work_conserving();
        }
        simulation.drain();
        prop_assert_eq!(simulation.overtakes, 0, "someone was served before an older waiter");
        simulation.assert_all_served();
    }

    /// The same under a priority policy of three bands, arrivals of every band (and past the
    /// last), and queues small enough to shed: still safe and work conserving, and every
    /// shed was of a lower band.
    #[test]
    fn banded_handoff_is_safe_and_work_conserving(
        shards in 1..5usize,
        capacities in prop::collection::vec(0..3u32, 1..4),
        depth in 1..6u32,
        steps in prop::collection::vec(prop_oneof![
            3 => step(4),
            4 => (0..4usize, 0..4u8).prop_map(|(shard, band)| Step::ArriveAs(shard, band)),
        ], 1..300),
    ) {
        prop_assume!(capacities.iter().any(|&capacity| capacity > 0));
        let limits = QueueLimits { revision_depth: depth };
        let mut simulation =
            Simulation::with_revisions(shards, &[(&capacities, limits)], ProcessQueue::UNLIMITED)
                .with_bands(3);
        for step in &steps {
            simulation.step(0, &step.on(shards));
        }
        simulation.drain();
        simulation.assert_all_served();
    }

    /// Under a priority policy, with grants delivered at once: a freed slot always goes to
    /// the highest band waiting on any shard, and within a band to the oldest.
    #[test]
    fn prompt_delivery_serves_higher_bands_first(
        shards in 1..5usize,
        steps in prop::collection::vec(prop_oneof![
            3 => (0..4usize, 0..3u8).prop_map(|(shard, band)| Step::ArriveAs(shard, band)),
            1 => (0..4usize, 0..64usize).prop_map(|(shard, pick)| Step::ArriveRacing(shard, pick)),
            3 => (0..64usize).prop_map(Step::Finish),
            1 => (0..4usize, 0..2usize).prop_map(|(shard, pod)| Step::Grow(shard, pod)),
        ], 1..300),
    ) {
        let mut simulation = Simulation::new(shards, &[1, 2]).with_bands(3);
        for step in &steps {
            simulation.step(0, &step.on(shards));
            let rev = &mut simulation.revisions[0];
            while let Some((shard, pod)) = rev.in_transit.pop() {
                simulation.overtakes += rev.deliver(shard, pod);
            }
            simulation.check();
            simulation.revisions[0].check_work_conserving();
        }
        simulation.drain();
        prop_assert_eq!(simulation.overtakes, 0, "served past a higher band or an older waiter");
        simulation.assert_all_served();
    }

    /// Under a priority policy, with grants delivered at once, flows of two bands arriving
    /// on any shard: across shards, within each band, a flow is never served more than one
    /// turn ahead of another flow that waits (`check_fairness`).
    #[test]
    fn prompt_delivery_shares_each_band_fairly_across_shards(
        shards in 1..5usize,
        steps in prop::collection::vec(prop_oneof![
            4 => (0..4usize, 0..2u8, 0..4u64)
                .prop_map(|(shard, band, flow)| Step::ArriveFlow(shard, band, flow)),
            3 => (0..64usize).prop_map(Step::Finish),
            1 => (0..4usize, 0..2usize).prop_map(|(shard, pod)| Step::Grow(shard, pod)),
        ], 1..400),
    ) {
        let mut simulation = Simulation::new(shards, &[1, 1]).with_bands(2);
        for step in &steps {
            simulation.step(0, &step.on(shards));
            let rev = &mut simulation.revisions[0];
            while let Some((shard, pod)) = rev.in_transit.pop() {
                simulation.overtakes += rev.deliver(shard, pod);
            }
        }
        simulation.drain();
        simulation.assert_all_served();
        check_fairness(&simulation.revisions[0].log);
    }

    /// Two revisions share one process queue, on up to four shards, in any interleaving:
    /// the total waiting never exceeds the cap nor any revision its depth, a request is
    /// refused only at one of them (checked at every arrival), and the counts return to zero
    /// once everything is served. Then a flood of arrivals fills the queues: the total
    /// waiting reaches exactly the smaller of the cap and the sum of the depths.
    #[test]
    fn a_process_cap_shared_by_two_revisions_bounds_every_queue(
        shards in 1..5usize,
        capacities in [prop::collection::vec(0..3u32, 1..3), prop::collection::vec(0..3u32, 1..3)],
        depths in [1..6u32, 1..6u32],
        cap in 1..8u32,
        steps in prop::collection::vec((0..2usize, step(4)), 1..300),
    ) {
        prop_assume!(capacities.iter().all(|pods| pods.iter().any(|&capacity| capacity > 0)));
        let revisions = [
            (&capacities[0][..], QueueLimits { revision_depth: depths[0] }),
            (&capacities[1][..], QueueLimits { revision_depth: depths[1] }),
        ];
        let mut simulation = Simulation::with_revisions(shards, &revisions, cap);
        for (revision, step) in &steps {
            simulation.step(*revision, &step.on(shards));
        }

        // The flood: each arrival takes a slot, queues or is refused, and slots and places
        // are finite, so after enough of them every arrival is refused.
        let slots: u32 = simulation
            .revisions
            .iter()
            .flat_map(|rev| rev.pods.iter().map(PodSlots::capacity))
            .sum();
        for arrival in 0..2 * (slots + depths[0] + depths[1] + 1) as usize {
            simulation.step(arrival % 2, &Step::Arrive(arrival / 2 % shards));
        }
        for revision in 0..2 {
            let rejected = simulation.rejected;
            simulation.step(revision, &Step::Arrive(0));
            prop_assert_eq!(simulation.rejected, rejected + 1, "the flood did not fill the queues");
        }
        prop_assert_eq!(simulation.process.queued(), cap.min(depths[0] + depths[1]));

        simulation.drain();
        simulation.assert_all_served();
    }
}
