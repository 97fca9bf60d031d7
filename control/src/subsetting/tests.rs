use super::*;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddrV4};

// ---- fixtures -------------------------------------------------------------------------

/// `count` pod addresses spread over a /16 like a real pod CIDR, derived from `seed` so the
/// tests are reproducible.
fn pods(count: usize, seed: u64) -> Vec<SocketAddr> {
    let mut state = seed;
    let mut pods = BTreeSet::new();
    while pods.len() < count {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let bits = splitmix64_finalise(state);
        let ip = Ipv4Addr::new(10, 244, (bits >> 8) as u8, (bits as u8).max(1));
        pods.insert(SocketAddr::V4(SocketAddrV4::new(ip, 8012)));
    }
    pods.into_iter().collect()
}

fn activators(count: usize) -> Vec<IpAddr> {
    (0..count)
        .map(|index| {
            IpAddr::V4(Ipv4Addr::new(
                10,
                1,
                (index / 250) as u8,
                (index % 250 + 1) as u8,
            ))
        })
        .collect()
}

fn pod(text: &str) -> SocketAddr {
    text.parse().expect("test pod address")
}

fn ip(text: &str) -> IpAddr {
    text.parse().expect("test activator address")
}

/// `assign` run by every activator, as each replica would run it for itself.
fn everyone(
    pods: &[SocketAddr],
    activators: &[IpAddr],
    container_concurrency: u32,
) -> BTreeMap<IpAddr, Vec<Assignment>> {
    activators
        .iter()
        .map(|&me| (me, assign(pods, activators, me, container_concurrency)))
        .collect()
}

/// Each pod's holders with their shares, across all activators.
fn holders(result: &BTreeMap<IpAddr, Vec<Assignment>>) -> BTreeMap<SocketAddr, Vec<(IpAddr, u32)>> {
    let mut holders: BTreeMap<SocketAddr, Vec<(IpAddr, u32)>> = BTreeMap::new();
    for (&activator, assignments) in result {
        for assignment in assignments {
            holders
                .entry(assignment.pod)
                .or_default()
                .push((activator, assignment.share));
        }
    }
    holders
}

/// The owner of each pod when pods ≥ activators (exactly one holder each).
fn owners(pods: &[SocketAddr], activators: &[IpAddr]) -> BTreeMap<SocketAddr, IpAddr> {
    holders(&everyone(pods, activators, 10))
        .into_iter()
        .map(|(pod, holders)| {
            assert_eq!(holders.len(), 1, "{pod} held by {holders:?}");
            (pod, holders[0].0)
        })
        .collect()
}

/// Pods present in both maps whose owner differs.
fn moved<O: PartialEq>(before: &BTreeMap<SocketAddr, O>, after: &BTreeMap<SocketAddr, O>) -> usize {
    before
        .iter()
        .filter(|(pod, owner)| after.get(pod).is_some_and(|now| now != *owner))
        .count()
}

// ---- upstream baseline (release-1.18 pickIndices / assignSlice, reference §2.6) ---------

/// `[begin, end)` and the remnant count for activator `index` of `activators` over `pods`.
fn upstream_pick_indices(pods: usize, index: usize, activators: usize) -> (usize, usize, usize) {
    if activators > pods {
        let begin = index % pods;
        (begin, begin + 1, 0)
    } else {
        let size = pods / activators;
        (index * size, index * size + size, pods % activators)
    }
}

/// Upstream's slice for activator `index` (None = -1) of the already-sorted `trackers`.
fn upstream_assign_slice<T: Clone>(
    trackers: &[T],
    index: Option<usize>,
    activators: usize,
) -> Vec<T> {
    let Some(index) = index else {
        return trackers.to_vec();
    };
    if trackers.len() <= 1 || activators == 1 {
        return trackers.to_vec();
    }
    let (begin, end, remnants) = upstream_pick_indices(trackers.len(), index, activators);
    let mut result = trackers[begin..end].to_vec();
    if remnants > 0 {
        let tail = &trackers[trackers.len() - remnants..];
        if index < tail.len() {
            result.push(tail[index].clone());
        }
    }
    result
}

/// Upstream's owner of each pod: dests and activator IPs sorted as strings, as Go does.
fn upstream_owners(pods: &[SocketAddr], activators: &[IpAddr]) -> BTreeMap<SocketAddr, IpAddr> {
    let mut sorted_pods = pods.to_vec();
    sorted_pods.sort_by_key(ToString::to_string);
    let mut sorted_activators = activators.to_vec();
    sorted_activators.sort_by_key(ToString::to_string);
    let mut owners = BTreeMap::new();
    for (index, &activator) in sorted_activators.iter().enumerate() {
        for pod in upstream_assign_slice(&sorted_pods, Some(index), sorted_activators.len()) {
            assert!(
                owners.insert(pod, activator).is_none(),
                "upstream shares {pod} with pods ≥ activators"
            );
        }
    }
    owners
}

#[test]
fn the_upstream_baseline_matches_upstreams_own_tests() {
    // TestPickIndices rows.
    assert_eq!(upstream_pick_indices(1, 1, 2), (0, 1, 0));
    assert_eq!(upstream_pick_indices(2, 2, 3), (0, 1, 0));
    assert_eq!(upstream_pick_indices(10, 0, 3), (0, 3, 1));
    assert_eq!(upstream_pick_indices(10, 2, 3), (6, 9, 1));
    assert_eq!(upstream_pick_indices(150, 4, 5), (120, 150, 0));
    // TestPodAssignmentFinite: 6 pods, 4 activators, index 0 → {ip0, ip4}.
    let trackers = ["ip0", "ip1", "ip2", "ip3", "ip4", "ip5"];
    assert_eq!(upstream_assign_slice(&trackers, Some(0), 4), ["ip0", "ip4"]);
    // TestAssignSlice rows.
    assert_eq!(upstream_assign_slice(&trackers[..3], Some(1), 3), ["ip1"]);
    assert_eq!(
        upstream_assign_slice(&trackers[..3], None, 3),
        trackers[..3]
    );
    assert_eq!(
        upstream_assign_slice(&trackers[..3], Some(1), 1),
        trackers[..3]
    );
    assert_eq!(upstream_assign_slice(&trackers[..1], Some(1), 3), ["ip0"]);
}

// ---- the hash ------------------------------------------------------------------------

#[test]
fn fnv1a_matches_the_published_test_vectors() {
    let digest = |bytes: &[u8]| {
        let mut hash = Fnv1a::new();
        hash.write(bytes);
        hash.finish()
    };
    assert_eq!(digest(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(digest(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(digest(b"foobar"), 0x8594_4171_f739_67e8);
}

/// Every replica, on every machine and every version, must compute these same numbers: a
/// change here is a change of the wire contract between activators.
#[test]
fn weights_are_pinned() {
    assert_eq!(weight(pod("10.244.1.7:8012"), ip("10.1.0.1")), GOLDEN_V4);
    assert_eq!(weight(pod("[fd00::7]:8013"), ip("fd00:1::1")), GOLDEN_V6);
    let owners = owners(&pods(12, 7), &activators(3));
    let by_activator: Vec<usize> = activators(3)
        .iter()
        .map(|activator| owners.values().filter(|owner| *owner == activator).count())
        .collect();
    assert_eq!(
        by_activator, GOLDEN_SPLIT,
        "pods owned by each of 3 activators"
    );
}

// Cross-checked against an independent implementation (Python, from the definition).
const GOLDEN_V4: u64 = 0xd086_8d18_760b_3789;
const GOLDEN_V6: u64 = 0x19cc_d7d0_0cc9_d9fd;
const GOLDEN_SPLIT: [usize; 3] = [3, 5, 4];

#[test]
fn ipv4_and_ipv6_encodings_never_collide() {
    // ::a.b.c.d and a.b.c.d have the same last four octets; the family tag keeps them apart.
    let v4 = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    let v6 = IpAddr::V6(Ipv4Addr::new(10, 0, 0, 1).to_ipv6_compatible());
    let target = pod("10.244.0.1:8012");
    assert_ne!(weight(target, v4), weight(target, v6));
}

// ---- requirement 1: deterministic and order-independent -------------------------------

#[test]
fn input_order_and_duplicates_do_not_matter() {
    let pods = pods(30, 1);
    let activators = activators(4);
    let expected = everyone(&pods, &activators, 7);

    let mut reversed_pods = pods.clone();
    reversed_pods.reverse();
    let mut shuffled_activators = activators.clone();
    shuffled_activators.rotate_left(1);
    shuffled_activators.swap(0, 2);
    assert_eq!(everyone(&reversed_pods, &shuffled_activators, 7), expected);

    let mut doubled_pods = pods.clone();
    doubled_pods.extend_from_slice(&pods[..10]);
    let mut doubled_activators = activators.clone();
    doubled_activators.push(activators[0]);
    for &me in &activators {
        assert_eq!(
            assign(&doubled_pods, &doubled_activators, me, 7),
            expected[&me]
        );
    }
}

// ---- requirements 2 and 3: ownership, sharing, never multiplied ----------------------

#[test]
fn with_pods_at_least_activators_each_pod_has_one_owner_with_the_whole_cc() {
    let pods = pods(40, 2);
    let activators = activators(6);
    let result = everyone(&pods, &activators, 9);
    for (pod, holders) in holders(&result) {
        assert_eq!(holders.len(), 1, "{pod}: {holders:?}");
        assert_eq!(holders[0].1, 9);
        // Plain HRW (no activator starves with 40 pods over 6): the owner weighs highest.
        let best = activators
            .iter()
            .max_by_key(|&&activator| weight(pod, activator))
            .copied();
        assert_eq!(Some(holders[0].0), best, "{pod}");
    }
    assert!(result.values().all(|assignments| !assignments.is_empty()));
}

#[test]
fn a_starved_activator_takes_over_a_pod_instead_of_sharing_it() {
    // Find a case where plain HRW gives both pods to one of two activators (one in four).
    let activators = activators(2);
    let (pods, starved) = (0..200)
        .map(|seed| pods(2, seed))
        .find_map(|pods| {
            let favourite = |pod: SocketAddr| {
                activators
                    .iter()
                    .copied()
                    .max_by_key(|&activator| weight(pod, activator))
            };
            let first = favourite(pods[0])?;
            if favourite(pods[1]) != Some(first) {
                return None;
            }
            let starved = activators
                .iter()
                .copied()
                .find(|&activator| activator != first)?;
            Some((pods, starved))
        })
        .expect("one in four pod pairs has one favourite activator");
    // CC 1: sharing would leave one activator with share 0; taking over gives each a slot.
    let result = everyone(&pods, &activators, 1);
    assert_eq!(result[&starved].len(), 1);
    for assignments in result.values() {
        assert_eq!(assignments.len(), 1);
        assert_eq!(assignments[0].share, 1);
    }
    // The pod taken over is the one the starved activator weighs highest.
    let wanted = pods.iter().copied().max_by_key(|&pod| weight(pod, starved));
    assert_eq!(Some(result[&starved][0].pod), wanted);
}

#[test]
fn with_fewer_pods_than_activators_everyone_gets_one_pod_and_shares_sum_to_cc() {
    let pods = pods(3, 3);
    let activators = activators(10);
    for container_concurrency in [1, 2, 7, 10, 100] {
        let result = everyone(&pods, &activators, container_concurrency);
        assert!(result.values().all(|assignments| assignments.len() == 1));
        let holders = holders(&result);
        assert_eq!(holders.len(), 3, "every pod is held");
        for (pod, holders) in holders {
            let shares: Vec<u32> = holders.iter().map(|&(_, share)| share).collect();
            assert_eq!(
                shares.iter().sum::<u32>(),
                container_concurrency,
                "{pod}: {shares:?}"
            );
            let most = shares.iter().max().copied().unwrap_or(0);
            let least = shares.iter().min().copied().unwrap_or(0);
            assert!(most - least <= 1, "{pod}: {shares:?}");
        }
    }
}

#[test]
fn a_pod_shared_by_more_activators_than_slots_leaves_some_with_nothing() {
    // One pod (scale from zero), five activators, CC 2: two sharers get one slot each, the
    // three others are assigned the pod with share 0, and their requests wait.
    let pods = [pod("10.244.0.9:8012")];
    let result = everyone(&pods, &activators(5), 2);
    let mut shares: Vec<u32> = result
        .values()
        .map(|assignments| assignments[0].share)
        .collect();
    shares.sort_unstable();
    assert_eq!(shares, [0, 0, 0, 1, 1]);
    // The extra units go by weight, highest first.
    let mut by_weight = activators(5);
    by_weight.sort_by_key(|&activator| std::cmp::Reverse(weight(pods[0], activator)));
    assert_eq!(result[&by_weight[0]][0].share, 1);
    assert_eq!(result[&by_weight[1]][0].share, 1);
    assert_eq!(result[&by_weight[2]][0].share, 0);
}

#[test]
fn split_share_sums_to_cc_and_differs_by_at_most_one() {
    for container_concurrency in [0, 1, 5, 42, 1000] {
        for sharers in 1..12 {
            let shares: Vec<u32> = (0..sharers)
                .map(|rank| split_share(container_concurrency, sharers, rank))
                .collect();
            assert_eq!(shares.iter().sum::<u32>(), container_concurrency);
            assert!(shares
                .windows(2)
                .all(|pair| pair[0] >= pair[1] && pair[0] - pair[1] <= 1));
        }
    }
    assert_eq!(split_share(u32::MAX, 2, 0), u32::MAX / 2 + 1);
}

// ---- requirement 4: CC = 0 ------------------------------------------------------------

#[test]
fn with_cc_zero_everyone_gets_every_pod_unlimited() {
    let pods = pods(7, 4);
    for assignments in everyone(&pods, &activators(3), 0).values() {
        assert_eq!(assignments.len(), 7);
        assert!(assignments.iter().all(|assignment| assignment.share == 0));
    }
}

#[test]
fn an_activator_missing_from_the_list_gets_every_pod_with_full_cc() {
    let pods = pods(5, 5);
    let stranger = ip("10.9.9.9");
    for list in [activators(3), Vec::new()] {
        let assignments = assign(&pods, &list, stranger, 4);
        assert_eq!(assignments.len(), 5);
        assert!(assignments.iter().all(|assignment| assignment.share == 4));
    }
    assert!(assign(&[], &activators(3), activators(3)[0], 4).is_empty());
}

// ---- requirement 5: minimal movement, against upstream --------------------------------

/// 100 pods over 5 activators, the starting point of every movement scenario.
fn movement_base() -> (Vec<SocketAddr>, Vec<IpAddr>) {
    (pods(100, 11), activators(5))
}

/// For each trial (the pods and activators after one change), how many of the pods present
/// before and after changed owner: ours, then upstream's.
fn movements(trials: &[(Vec<SocketAddr>, Vec<IpAddr>)]) -> (Vec<usize>, Vec<usize>) {
    let (base_pods, base_activators) = movement_base();
    let ours_before = owners(&base_pods, &base_activators);
    let upstream_before = upstream_owners(&base_pods, &base_activators);
    trials
        .iter()
        .map(|(pods, activators)| {
            (
                moved(&ours_before, &owners(pods, activators)),
                moved(&upstream_before, &upstream_owners(pods, activators)),
            )
        })
        .unzip()
}

/// Asserts ours moved strictly fewer in total, with both series in the message, and prints
/// them for `cargo test -- --nocapture`.
fn assert_fewer(scenario: &str, ours: &[usize], upstream: &[usize]) {
    let ours_total: usize = ours.iter().sum();
    let upstream_total: usize = upstream.iter().sum();
    let report = format!(
        "{scenario}, {} trials: ours moved {ours_total} {ours:?}, upstream {upstream_total} {upstream:?}",
        ours.len()
    );
    assert!(ours_total < upstream_total, "{report}");
    println!("{report}");
}

#[test]
fn a_pod_joining_moves_no_other_pod() {
    let (base_pods, base_activators) = movement_base();
    let trials: Vec<_> = pods(120, 11)
        .into_iter()
        .filter(|pod| !base_pods.contains(pod))
        .take(20)
        .map(|extra| {
            let mut grown = base_pods.clone();
            grown.push(extra);
            (grown, base_activators.clone())
        })
        .collect();
    let (ours, upstream) = movements(&trials);
    assert!(ours.iter().all(|&moved| moved == 0), "ours moved {ours:?}");
    assert_fewer("one pod joins 100 over 5 activators", &ours, &upstream);
}

#[test]
fn a_pod_leaving_moves_no_other_pod() {
    let (base_pods, base_activators) = movement_base();
    let trials: Vec<_> = (0..20)
        .map(|trial| {
            let mut shrunk = base_pods.clone();
            shrunk.remove(trial * 5);
            (shrunk, base_activators.clone())
        })
        .collect();
    let (ours, upstream) = movements(&trials);
    assert!(ours.iter().all(|&moved| moved == 0), "ours moved {ours:?}");
    assert_fewer("one pod of 100 leaves, 5 activators", &ours, &upstream);
}

#[test]
fn an_activator_leaving_moves_only_its_own_pods() {
    let (base_pods, base_activators) = movement_base();
    let before = owners(&base_pods, &base_activators);
    let trials: Vec<_> = base_activators
        .iter()
        .map(|gone| {
            let rest = base_activators
                .iter()
                .copied()
                .filter(|activator| activator != gone)
                .collect();
            (base_pods.clone(), rest)
        })
        .collect();
    let (ours, upstream) = movements(&trials);
    for (gone, moved) in base_activators.iter().zip(&ours) {
        let owned = before.values().filter(|owner| *owner == gone).count();
        assert_eq!(*moved, owned, "only the {owned} pods of {gone} may move");
    }
    assert_fewer("one of 5 activators leaves, 100 pods", &ours, &upstream);
}

#[test]
fn an_activator_joining_takes_about_a_sixth_and_nothing_else_moves() {
    let (base_pods, base_activators) = movement_base();
    let newcomers: Vec<IpAddr> = activators(10).into_iter().skip(5).collect();
    let trials: Vec<_> = newcomers
        .iter()
        .map(|&newcomer| {
            let mut grown = base_activators.clone();
            grown.push(newcomer);
            (base_pods.clone(), grown)
        })
        .collect();
    let (ours, upstream) = movements(&trials);
    for ((newcomer, moved), (pods, activators)) in newcomers.iter().zip(&ours).zip(&trials) {
        let taken = owners(pods, activators)
            .values()
            .filter(|owner| *owner == newcomer)
            .count();
        assert_eq!(*moved, taken, "pods moved that did not go to {newcomer}");
        assert!(
            (5..=35).contains(&taken),
            "{newcomer} took {taken} of 100 pods, expected about 17"
        );
    }
    assert_fewer("a 6th activator joins, 100 pods", &ours, &upstream);
}

// ---- requirement 6: balance -----------------------------------------------------------

#[test]
fn a_thousand_pods_spread_evenly_over_ten_activators() {
    let owners = owners(&pods(1000, 13), &activators(10));
    let mut counts: BTreeMap<IpAddr, usize> = BTreeMap::new();
    for owner in owners.values() {
        *counts.entry(*owner).or_default() += 1;
    }
    println!(
        "1000 pods over 10 activators: {:?}",
        counts.values().collect::<Vec<_>>()
    );
    assert_eq!(counts.len(), 10);
    for (activator, count) in &counts {
        assert!(
            (60..=140).contains(count),
            "{activator} owns {count} of 1000 pods: {counts:?}"
        );
    }
}

// ---- upstream parity (reference §9.2), where HRW changes the answer -------------------

#[test]
fn upstream_pod_assignment_finite_with_our_invariants() {
    // Upstream: CC 42, 4 activators, pods ip0..ip5 → index 0 gets {ip0, ip4}, capacity 84,
    // because ranges are contiguous by sorted position. HRW picks owners by hash, so which
    // activator gets the second pod differs; what must hold is that the 6 pods are each
    // owned once, every activator has one, and the total capacity is 6 × 42.
    let pods: Vec<SocketAddr> = (0..6)
        .map(|index| pod(&format!("10.244.0.{index}:8012")))
        .collect();
    let activators = activators(4);
    let result = everyone(&pods, &activators, 42);
    assert!(result.values().all(|assignments| !assignments.is_empty()));
    assert_eq!(holders(&result).len(), 6);
    assert!(holders(&result).values().all(|holders| holders.len() == 1));
    let total: u32 = result
        .values()
        .flatten()
        .map(|assignment| assignment.share)
        .sum();
    assert_eq!(total, 6 * 42);
    // Scale to zero: nothing assigned.
    assert!(assign(&[], &activators, activators[0], 42).is_empty());
}

#[test]
fn upstream_pod_assignment_infinite_is_unchanged() {
    // Upstream: CC 0 → no subsetting, all 3 pods assigned. Same here.
    let pods = pods(3, 17);
    assert_eq!(assign(&pods, &activators(2), activators(2)[1], 0).len(), 3);
}

#[test]
fn upstream_multiple_activators_with_our_invariants() {
    // TestActivatorsIndexUpdate / TestMultipleActivators: CC 1, pods .1, .2, .23, activators
    // 130.0.0.1 and 130.0.0.2, self .2. Upstream gives .2 (index 1) one pod; HRW gives it one
    // or two depending on the hash. What must hold: the two hold the 3 slots between them,
    // each at least one; once .2 is alone it holds all three.
    let pods = [
        pod("128.0.0.1:1234"),
        pod("128.0.0.2:1234"),
        pod("128.0.0.23:1234"),
    ];
    let activators = [ip("130.0.0.1"), ip("130.0.0.2")];
    let result = everyone(&pods, &activators, 1);
    assert!(result.values().all(|assignments| !assignments.is_empty()));
    assert_eq!(
        result
            .values()
            .flatten()
            .map(|assignment| assignment.share)
            .sum::<u32>(),
        3
    );
    assert_eq!(
        assign(&pods, &[ip("130.0.0.2")], ip("130.0.0.2"), 1).len(),
        3
    );
}

#[test]
fn upstream_over_commits_with_more_activators_than_pods_and_we_do_not() {
    // TestPickIndices (1 pod, 2 activators): upstream gives both activators the pod with the
    // full CC, 2 × CC slots on a pod that has CC. We split it.
    let pods = [pod("10.244.0.1:8012")];
    let activators = activators(2);
    let upstream: usize = (0..2)
        .map(|index| upstream_assign_slice(&pods, Some(index), 2).len() * 10)
        .sum();
    assert_eq!(upstream, 20);
    let ours: u32 = everyone(&pods, &activators, 10)
        .values()
        .flatten()
        .map(|assignment| assignment.share)
        .sum();
    assert_eq!(ours, 10);
}

// ---- properties over random sets ------------------------------------------------------

fn any_pod() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![
        4 => (any::<[u8; 4]>(), 1..=u16::MAX).prop_map(|(octets, port)| SocketAddr::from((octets, port))),
        1 => (any::<[u8; 16]>(), 1..=u16::MAX).prop_map(|(octets, port)| SocketAddr::from((octets, port))),
    ]
}

fn any_activator() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        4 => any::<[u8; 4]>().prop_map(IpAddr::from),
        1 => any::<[u8; 16]>().prop_map(IpAddr::from),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Computed by every activator for itself: every pod's shares sum to exactly CC, every
    /// activator has at least one pod, shares of a shared pod differ by at most one, and the
    /// shape matches the mode (one owner per pod, or one pod per activator).
    #[test]
    fn shares_are_never_multiplied(
        pods in prop::collection::vec(any_pod(), 1..40),
        activators in prop::collection::vec(any_activator(), 1..12),
        container_concurrency in 1..50u32,
    ) {
        let pod_count = sorted_unique(&pods).len();
        let activator_count = sorted_unique(&activators).len();
        let result = everyone(&pods, &activators, container_concurrency);
        for (activator, assignments) in &result {
            prop_assert!(!assignments.is_empty(), "{} has no pod", activator);
            if pod_count < activator_count {
                prop_assert_eq!(assignments.len(), 1);
            }
        }
        let holders = holders(&result);
        prop_assert_eq!(holders.len(), pod_count, "every pod is held");
        for (pod, holders) in holders {
            let shares: Vec<u32> = holders.iter().map(|&(_, share)| share).collect();
            prop_assert_eq!(shares.iter().sum::<u32>(), container_concurrency, "{}: {:?}", pod, shares);
            if pod_count >= activator_count {
                prop_assert_eq!(shares.len(), 1, "{} shared with pods ≥ activators", pod);
            }
            let most = shares.iter().max().copied().unwrap_or(0);
            let least = shares.iter().min().copied().unwrap_or(0);
            prop_assert!(most - least <= 1, "{}: {:?}", pod, shares);
        }
    }

    /// The same sets in another order give the same answer for everyone.
    #[test]
    fn order_never_matters(
        (pods, shuffled_pods) in prop::collection::vec(any_pod(), 0..30)
            .prop_flat_map(|pods| (Just(pods.clone()), Just(pods).prop_shuffle())),
        (activators, shuffled_activators) in prop::collection::vec(any_activator(), 1..8)
            .prop_flat_map(|activators| (Just(activators.clone()), Just(activators).prop_shuffle())),
        container_concurrency in 0..20u32,
    ) {
        prop_assert_eq!(
            everyone(&pods, &activators, container_concurrency),
            everyone(&shuffled_pods, &shuffled_activators, container_concurrency)
        );
    }
}
