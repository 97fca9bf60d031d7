use super::*;
use proptest::prelude::*;
use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering};

const UNLIMITED: u32 = u32::MAX;

const ALL_POLICIES: [LbPolicy; 4] = [
    LbPolicy::RandomChoice2,
    LbPolicy::FirstAvailable,
    LbPolicy::RoundRobin,
    LbPolicy::LeastConnections,
];

/// A pod with a plain counter; `capacity` plays containerConcurrency (UNLIMITED for 0).
#[derive(Clone, Debug)]
struct TestPod {
    in_flight: Cell<u32>,
    capacity: u32,
}

impl TestPod {
    fn new(capacity: u32) -> TestPod {
        TestPod::loaded(0, capacity)
    }

    fn loaded(in_flight: u32, capacity: u32) -> TestPod {
        TestPod {
            in_flight: Cell::new(in_flight),
            capacity,
        }
    }

    fn has_free_slot(&self) -> bool {
        self.in_flight.get() < self.capacity
    }

    fn release(&self) {
        self.in_flight.set(self.in_flight.get() - 1);
    }
}

impl Slots for TestPod {
    fn in_flight(&self) -> u32 {
        self.in_flight.get()
    }

    fn try_acquire(&self) -> bool {
        let free = self.has_free_slot();
        if free {
            self.in_flight.set(self.in_flight.get() + 1);
        }
        free
    }
}

fn pods(count: usize, capacity: u32) -> Vec<TestPod> {
    (0..count).map(|_| TestPod::new(capacity)).collect()
}

fn loads(pods: &[TestPod]) -> Vec<u32> {
    pods.iter().map(TestPod::in_flight).collect()
}

#[test]
fn an_empty_list_gives_none_for_every_policy() {
    for policy in ALL_POLICIES {
        let mut balancer = Balancer::new(policy, 1);
        assert_eq!(balancer.pick::<TestPod>(&[]), None, "{policy:?}");
    }
}

// --- random-choice-2 (upstream TestRandomChoice2, TestRandomChoice_TwoTrackersDistribution)

#[test]
fn random_choice_2_with_one_tracker_takes_it_and_counts_it() {
    let trackers = pods(1, UNLIMITED);
    let mut balancer = Balancer::new(LbPolicy::RandomChoice2, 7);
    assert_eq!(balancer.pick(&trackers), Some(0));
    assert_eq!(trackers[0].in_flight(), 1);
    trackers[0].release();
    assert_eq!(balancer.pick(&trackers), Some(0));
    assert_eq!(trackers[0].in_flight(), 1);

    let full = vec![TestPod::loaded(1, 1)];
    assert_eq!(balancer.pick(&full), None, "the only tracker is full");
}

#[test]
fn random_choice_2_with_two_trackers_avoids_the_busy_one() {
    let trackers = pods(2, UNLIMITED);
    let mut balancer = Balancer::new(LbPolicy::RandomChoice2, 7);
    let first = balancer.pick(&trackers).unwrap();
    let other = 1 - first;
    assert_eq!(balancer.pick(&trackers), Some(other), "first is busy");
    // Both now carry one; release `other` and it is the idle one again, every time.
    for _ in 0..20 {
        trackers[other].release();
        assert_eq!(balancer.pick(&trackers), Some(other));
    }
    assert_eq!(loads(&trackers), [1, 1]);
}

#[test]
fn random_choice_2_with_three_trackers_never_picks_the_busiest() {
    // Whichever two are drawn, the one with 9 in flight loses; pod 0 wins whenever drawn.
    let trackers = vec![
        TestPod::loaded(0, UNLIMITED),
        TestPod::loaded(7, UNLIMITED),
        TestPod::loaded(9, UNLIMITED),
    ];
    let mut balancer = Balancer::new(LbPolicy::RandomChoice2, 42);
    let mut picked = [0u32; 3];
    for _ in 0..300 {
        let index = balancer.pick(&trackers).unwrap();
        picked[index] += 1;
        trackers[index].release();
    }
    assert_eq!(picked[2], 0, "{picked:?}");
    // Pod 0 is among the two drawn with probability 2/3.
    assert!(picked[0] > 150, "{picked:?}");
    assert!(picked[1] > 0, "{picked:?}");
}

#[test]
fn random_choice_2_spreads_100_picks_over_two_trackers() {
    let trackers = pods(2, UNLIMITED);
    let mut balancer = Balancer::new(LbPolicy::RandomChoice2, 3);
    let mut picked = [0u32; 2];
    for _ in 0..100 {
        let index = balancer.pick(&trackers).unwrap();
        picked[index] += 1;
        trackers[index].release();
    }
    assert!(picked[0] > 20 && picked[1] > 20, "{picked:?}");
}

#[test]
fn random_choice_2_finds_the_only_free_slot_beyond_its_two_candidates() {
    for free in 0..6 {
        for seed in 0..20 {
            let trackers: Vec<TestPod> = (0..6)
                .map(|index| TestPod::loaded(u32::from(index != free), 1))
                .collect();
            let mut balancer = Balancer::new(LbPolicy::RandomChoice2, seed);
            assert_eq!(balancer.pick(&trackers), Some(free), "seed {seed}");
            assert_eq!(balancer.pick(&trackers), None, "seed {seed}");
        }
    }
}

// --- first-available (upstream TestFirstAvailable and the clumping test)

#[test]
fn first_available_with_one_single_slot_tracker_refuses_the_second_pick() {
    let trackers = pods(1, 1);
    let mut balancer = Balancer::new(LbPolicy::FirstAvailable, 0);
    assert_eq!(balancer.pick(&trackers), Some(0));
    assert_eq!(balancer.pick(&trackers), None);
}

#[test]
fn first_available_with_two_trackers_goes_in_order() {
    let trackers = pods(2, 1);
    let mut balancer = Balancer::new(LbPolicy::FirstAvailable, 0);
    assert_eq!(balancer.pick(&trackers), Some(0));
    assert_eq!(balancer.pick(&trackers), Some(1));
    assert_eq!(balancer.pick(&trackers), None);
    trackers[1].release();
    assert_eq!(balancer.pick(&trackers), Some(1));
}

#[test]
fn first_available_clumps_onto_the_first_pod() {
    let trackers = pods(3, 3);
    let mut balancer = Balancer::new(LbPolicy::FirstAvailable, 0);
    for _ in 0..3 {
        assert_eq!(balancer.pick(&trackers), Some(0));
    }
    assert_eq!(balancer.pick(&trackers), Some(1));
    assert_eq!(loads(&trackers), [3, 1, 0]);
}

// --- round-robin (upstream TestRoundRobin)

#[test]
fn round_robin_with_cc_1_rotates_and_resets_on_a_shrunk_list() {
    let trackers = pods(3, 1);
    let mut balancer = Balancer::new(LbPolicy::RoundRobin, 0);
    assert_eq!(balancer.pick(&trackers), Some(0));
    assert_eq!(balancer.pick(&trackers), Some(1));
    // The cursor (2) is past the end of a one-pod list: reset, and t0 is busy.
    assert_eq!(balancer.pick(&trackers[..1]), None);
    assert_eq!(balancer.pick(&trackers), Some(2));
    assert_eq!(balancer.pick(&trackers), None);
    trackers[2].release();
    assert_eq!(balancer.pick(&trackers), Some(2));
}

#[test]
fn round_robin_with_cc_2_wraps_and_skips_full_pods() {
    let trackers = pods(3, 2);
    let mut balancer = Balancer::new(LbPolicy::RoundRobin, 0);
    assert_eq!(balancer.pick(&trackers), Some(0));
    assert_eq!(balancer.pick(&trackers), Some(1));
    assert_eq!(balancer.pick(&trackers), Some(2));
    assert_eq!(balancer.pick(&trackers), Some(0), "wraps");
    // Another shard fills pod 1: the rotation skips it.
    assert!(trackers[1].try_acquire());
    assert_eq!(balancer.pick(&trackers), Some(2));
    assert_eq!(balancer.pick(&trackers), None, "all full");
    trackers[1].release();
    assert_eq!(balancer.pick(&trackers), Some(1));
    assert_eq!(loads(&trackers), [2, 2, 2]);
}

// --- least-connections (fork)

#[test]
fn least_connections_picks_the_least_loaded() {
    let trackers = vec![
        TestPod::loaded(3, UNLIMITED),
        TestPod::loaded(1, UNLIMITED),
        TestPod::loaded(2, UNLIMITED),
    ];
    let mut balancer = Balancer::new(LbPolicy::LeastConnections, 0);
    assert_eq!(balancer.pick(&trackers), Some(1));
    assert_eq!(
        balancer.pick(&trackers),
        Some(1),
        "1 and 2 tie at 2: lower index"
    );
    assert_eq!(balancer.pick(&trackers), Some(2));
    assert_eq!(loads(&trackers), [3, 3, 3]);
    assert_eq!(balancer.pick(&trackers), Some(0), "three-way tie");
}

#[test]
fn least_connections_passes_over_full_pods_in_load_order() {
    let trackers = vec![
        TestPod::loaded(1, 1),
        TestPod::loaded(5, UNLIMITED),
        TestPod::loaded(2, 2),
        TestPod::loaded(3, 4),
    ];
    let mut balancer = Balancer::new(LbPolicy::LeastConnections, 0);
    assert_eq!(balancer.pick(&trackers), Some(3));
    assert_eq!(balancer.pick(&trackers), Some(1), "3 is full now");
}

#[test]
fn least_connections_handles_lists_longer_than_the_inline_buffer() {
    for count in [INLINE_PODS, INLINE_PODS + 1, 100] {
        let mut trackers: Vec<TestPod> = (0..count).map(|_| TestPod::loaded(10, 10)).collect();
        // Two least-loaded pods near the end; the first of them is full.
        trackers[count - 3].in_flight.set(3);
        trackers[count - 3].capacity = 3;
        trackers[count - 2].in_flight.set(4);
        trackers[count - 2].capacity = 5;
        let mut balancer = Balancer::new(LbPolicy::LeastConnections, 0);
        assert_eq!(balancer.pick(&trackers), Some(count - 2), "{count} pods");
        assert_eq!(balancer.pick(&trackers), None, "{count} pods");
    }
}

// --- plumbing

#[test]
fn set_policy_changes_what_the_next_pick_does() {
    let trackers = pods(3, UNLIMITED);
    let mut balancer = Balancer::new(LbPolicy::RoundRobin, 0);
    assert_eq!(balancer.pick(&trackers), Some(0));
    assert_eq!(balancer.pick(&trackers), Some(1));
    balancer.set_policy(LbPolicy::FirstAvailable);
    assert_eq!(balancer.policy(), LbPolicy::FirstAvailable);
    assert_eq!(balancer.pick(&trackers), Some(0));
    balancer.set_policy(LbPolicy::LeastConnections);
    assert_eq!(balancer.pick(&trackers), Some(2));
}

/// A pod on an atomic, as production shares them between shards behind `Arc`s.
#[derive(Debug)]
struct AtomicTestPod {
    in_flight: AtomicU32,
    capacity: u32,
}

impl Slots for AtomicTestPod {
    fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    fn try_acquire(&self) -> bool {
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |count| {
                (count < self.capacity).then_some(count + 1)
            })
            .is_ok()
    }
}

#[test]
fn pods_behind_arcs_and_references_are_slots_too() {
    let shared: Vec<Arc<AtomicTestPod>> = (0..2)
        .map(|_| {
            Arc::new(AtomicTestPod {
                in_flight: AtomicU32::new(0),
                capacity: 1,
            })
        })
        .collect();
    let mut balancer = Balancer::new(LbPolicy::FirstAvailable, 0);
    assert_eq!(balancer.pick(&shared), Some(0));
    let borrowed: Vec<&AtomicTestPod> = shared.iter().map(|pod| &**pod).collect();
    assert_eq!(balancer.pick(&borrowed), Some(1));
    assert_eq!(balancer.pick(&shared), None);
}

/// Picks with unlimited pods, releasing every third, and returns the indexes chosen.
fn random_sequence(seed: u64) -> Vec<usize> {
    let trackers = pods(8, UNLIMITED);
    let mut balancer = Balancer::new(LbPolicy::RandomChoice2, seed);
    (0..200)
        .map(|step| {
            let index = balancer.pick(&trackers).unwrap();
            if step % 3 == 0 {
                trackers[index].release();
            }
            index
        })
        .collect()
}

#[test]
fn the_same_seed_gives_the_same_pick_sequence() {
    assert_eq!(random_sequence(0), random_sequence(0));
    assert_eq!(random_sequence(0xDEAD_BEEF), random_sequence(0xDEAD_BEEF));
    assert_ne!(random_sequence(1), random_sequence(2), "seeds must matter");
}

#[test]
fn below_stays_in_bounds_and_reaches_every_value() {
    let mut balancer = Balancer::new(LbPolicy::RandomChoice2, 0);
    for bound in 1..10 {
        let mut seen = vec![false; bound];
        for _ in 0..200 {
            seen[balancer.below(bound)] = true;
        }
        assert!(seen.iter().all(|&hit| hit), "bound {bound}: {seen:?}");
    }
}

// --- properties

#[derive(Clone, Debug)]
enum Step {
    Pick,
    /// Ends one request on the pod the index selects among those with requests in flight.
    Release(prop::sample::Index),
}

fn policy() -> impl Strategy<Value = LbPolicy> {
    prop::sample::select(ALL_POLICIES.to_vec())
}

/// In-flight may start above capacity: a shrunk share leaves pods over it for a while.
fn pod() -> impl Strategy<Value = TestPod> {
    let capacity = prop_oneof![3 => 0..4u32, 1 => Just(UNLIMITED)];
    (0..5u32, capacity).prop_map(|(in_flight, capacity)| TestPod::loaded(in_flight, capacity))
}

fn pod_list() -> impl Strategy<Value = Vec<TestPod>> {
    prop_oneof![
        8 => prop::collection::vec(pod(), 0..10),
        1 => prop::collection::vec(pod(), INLINE_PODS - 2..INLINE_PODS + 6),
    ]
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        3 => Just(Step::Pick),
        2 => any::<prop::sample::Index>().prop_map(Step::Release),
    ];
    prop::collection::vec(step, 0..40)
}

/// The pod a deterministic policy must choose, given the state before the pick.
fn expected_choice(balancer: &Balancer, pods: &[TestPod]) -> Option<usize> {
    let free = |index: &usize| pods[*index].has_free_slot();
    match balancer.policy {
        LbPolicy::RandomChoice2 => None,
        LbPolicy::FirstAvailable => (0..pods.len()).find(free),
        LbPolicy::RoundRobin => {
            let start = if balancer.cursor >= pods.len() {
                0
            } else {
                balancer.cursor
            };
            (0..pods.len())
                .map(|offset| (start + offset) % pods.len())
                .find(free)
        }
        LbPolicy::LeastConnections => (0..pods.len())
            .filter(free)
            .min_by_key(|&index| (pods[index].in_flight(), index)),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(384))]

    /// Over any picks and releases: a pick succeeds iff some pod has a free slot, the
    /// returned pod is the only one whose count moved and it moved by exactly one from below
    /// its capacity (so a pod that starts within capacity never exceeds it), and the
    /// deterministic policies choose exactly the pod their definition names.
    #[test]
    fn a_pick_takes_one_free_slot_whenever_one_exists(
        policy in policy(),
        seed in any::<u64>(),
        trackers in pod_list(),
        steps in steps(),
    ) {
        let mut balancer = Balancer::new(policy, seed);
        let started_within: Vec<bool> =
            trackers.iter().map(|pod| pod.in_flight() <= pod.capacity).collect();
        for step in steps {
            match step {
                Step::Pick => {
                    let before = loads(&trackers);
                    let any_free = trackers.iter().any(TestPod::has_free_slot);
                    let expected = expected_choice(&balancer, &trackers);
                    let picked = balancer.pick(&trackers);
                    prop_assert_eq!(picked.is_some(), any_free);
                    let after = loads(&trackers);
                    for (index, (&old, &new)) in before.iter().zip(&after).enumerate() {
                        if Some(index) == picked {
                            prop_assert_eq!(new, old + 1);
                            prop_assert!(old < trackers[index].capacity);
                        } else {
                            prop_assert_eq!(new, old, "pod {} moved", index);
                        }
                    }
                    if policy != LbPolicy::RandomChoice2 {
                        prop_assert_eq!(picked, expected);
                    }
                }
                Step::Release(selector) => {
                    let busy: Vec<&TestPod> =
                        trackers.iter().filter(|pod| pod.in_flight() > 0).collect();
                    if !busy.is_empty() {
                        selector.get(&busy).release();
                    }
                }
            }
            for (pod, &within) in trackers.iter().zip(&started_within) {
                if within {
                    prop_assert!(pod.in_flight() <= pod.capacity);
                }
            }
        }
    }

    /// Power of two choices on unlimited pods never lands on the strictly busiest pod.
    #[test]
    fn random_choice_2_never_picks_a_unique_busiest_pod(
        seed in any::<u64>(),
        in_flight in prop::collection::vec(0..6u32, 2..10),
    ) {
        let trackers: Vec<TestPod> =
            in_flight.iter().map(|&count| TestPod::loaded(count, UNLIMITED)).collect();
        let busiest = *in_flight.iter().max().unwrap();
        let unique_busiest = in_flight.iter().filter(|&&count| count == busiest).count() == 1;
        let mut balancer = Balancer::new(LbPolicy::RandomChoice2, seed);
        let index = balancer.pick(&trackers).unwrap();
        if unique_busiest {
            prop_assert!(in_flight[index] < busiest);
        }
    }

    /// Two balancers with the same seed make the same choices on the same history.
    #[test]
    fn replaying_a_seed_replays_the_picks(
        policy in policy(),
        seed in any::<u64>(),
        trackers in pod_list(),
        steps in steps(),
    ) {
        let replica = trackers.clone();
        let mut original = Balancer::new(policy, seed);
        let mut replay = Balancer::new(policy, seed);
        for step in steps {
            match step {
                Step::Pick => {
                    prop_assert_eq!(original.pick(&trackers), replay.pick(&replica));
                }
                Step::Release(selector) => {
                    let busy: Vec<usize> =
                        (0..trackers.len()).filter(|&index| trackers[index].in_flight() > 0).collect();
                    if !busy.is_empty() {
                        let index = *selector.get(&busy);
                        trackers[index].release();
                        replica[index].release();
                    }
                }
            }
        }
    }
}
