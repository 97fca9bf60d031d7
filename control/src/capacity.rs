//! A revision's capacity in this activator: how many of its requests may be in flight here at
//! once before newcomers wait in the revision's queue.
//!
//! Upstream's `calculateCapacity` (throttler.go) in our terms, with one ★ change: only
//! **routable** pods count. The fork sizes the capacity over every tracker, NotReady and
//! Quarantined included, which admits requests that then find no pod to go to and spin or sleep
//! in the retry loop; here the caller passes the assignments computed over routable pods only
//! (`subsetting::assign`), so an admitted request always has a slot somewhere.
//!
//! * Pod mode, CC > 0: the sum of this activator's shares over its assigned pods. Upstream
//!   multiplies CC by the number of assigned pods; the shares are the same thing except on a
//!   pod shared by several activators, where ours split CC instead of granting it to each.
//! * Pod mode, CC = 0: unlimited while any pod is routable, closed otherwise (upstream's
//!   infinite breaker at 1 or 0).
//! * Cluster-IP mode (one virtual target, the private service VIP, balanced by kube-proxy or the
//!   mesh): `max(1, CC × ready / activators)`, the activators sharing the ready pods' slots by
//!   count since none of them sees the pods; closed with no ready pod; unlimited with CC = 0.
//!
//! Sums saturate at `u32::MAX` instead of wrapping; upstream clamps at `MaxInt32` for the same
//! reason (a capacity that large is no limit in practice).

use crate::subsetting::Assignment;

/// How many requests of a revision this activator admits at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capacity {
    /// No limit (containerConcurrency 0 with somewhere to send).
    Unlimited,
    /// At most this many in flight; `Limited(0)` is closed: requests wait.
    Limited(u32),
}

/// Where this activator's requests for a revision go.
#[derive(Clone, Copy, Debug)]
pub enum Targets<'a> {
    /// Pod mode: this activator's assignments over the revision's **routable** pods, as
    /// `subsetting::assign` returns them.
    Pods(&'a [Assignment]),
    /// Cluster-IP mode: one virtual target in front of `ready_pods` pods (the Kubernetes-ready
    /// endpoints), shared by `activators` activators (0 is read as 1, as upstream does).
    ClusterIp {
        ready_pods: usize,
        activators: usize,
    },
}

/// The revision's capacity in this activator for containerConcurrency `container_concurrency`.
pub fn revision_capacity(container_concurrency: u32, targets: Targets<'_>) -> Capacity {
    match targets {
        Targets::Pods(assignments) => {
            if assignments.is_empty() {
                Capacity::Limited(0)
            } else if container_concurrency == 0 {
                Capacity::Unlimited
            } else {
                // Shares already hold this activator's part of CC on each pod, whole or split.
                let total: u64 = assignments
                    .iter()
                    .map(|assignment| u64::from(assignment.share))
                    .sum();
                Capacity::Limited(saturate(total))
            }
        }
        Targets::ClusterIp {
            ready_pods,
            activators,
        } => {
            if ready_pods == 0 {
                Capacity::Limited(0)
            } else if container_concurrency == 0 {
                Capacity::Unlimited
            } else {
                // u128: CC (< 2^32) times a pod count (< 2^64) cannot overflow it.
                let slots = u128::from(container_concurrency) * ready_pods as u128;
                let per_activator = slots / activators.max(1) as u128;
                // The floor of 1 keeps a revision with ready pods from being closed when the
                // activators outnumber its slots; the pods' own queue-proxies absorb the excess.
                Capacity::Limited(saturate(per_activator).max(1))
            }
        }
    }
}

fn saturate(value: impl TryInto<u32>) -> u32 {
    value.try_into().unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subsetting::assign;
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};

    use Capacity::{Limited, Unlimited};

    fn pods(count: usize) -> Vec<SocketAddr> {
        (0..count)
            .map(|index| SocketAddr::from(([10, 244, 0, index as u8 + 1], 8012)))
            .collect()
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

    fn with_shares(shares: &[u32]) -> Vec<Assignment> {
        pods(shares.len())
            .into_iter()
            .zip(shares)
            .map(|(pod, &share)| Assignment { pod, share })
            .collect()
    }

    /// Upstream's TestThrottlerUpdateCapacity rows without pod trackers. Upstream computes those
    /// with the cluster-IP formula (`numTrackers == 0`), so they are cluster-IP rows here;
    /// `numActivators: 0` is read as 1 in both.
    #[test]
    fn upstream_rows_without_trackers_are_the_cluster_ip_formula() {
        let rows: &[(&str, u32, usize, usize, Capacity)] = &[
            ("capacity 1, cc 10", 10, 1, 0, Limited(10)),
            ("capacity 10, cc 10", 10, 10, 0, Limited(100)),
            ("capacity 100, cc 10", 10, 100, 0, Limited(1000)),
            ("5 activators, capacity 10, cc 10", 10, 10, 5, Limited(20)),
            (
                "200 activators, capacity 10, cc 10: floor 1",
                10,
                10,
                200,
                Limited(1),
            ),
            ("200 activators, capacity 0, cc 10", 10, 0, 200, Limited(0)),
            ("infinite, 0 activators, capacity 0", 0, 0, 0, Limited(0)),
            ("infinite, 0 activators, capacity 1", 0, 1, 0, Unlimited),
            ("infinite, 0 activators, capacity 10", 0, 10, 0, Unlimited),
            (
                "infinite, 200 activators, capacity 0",
                0,
                0,
                200,
                Limited(0),
            ),
            ("infinite, 200 activators, capacity 1", 0, 1, 200, Unlimited),
            // Ours only: no overflow, and a remainder rounds down.
            (
                "cc max, many pods: saturates",
                u32::MAX,
                1 << 40,
                3,
                Limited(u32::MAX),
            ),
            ("cc 3, 5 ready, 2 activators: 7", 3, 5, 2, Limited(7)),
        ];
        for &(name, container_concurrency, ready_pods, activators, want) in rows {
            let targets = Targets::ClusterIp {
                ready_pods,
                activators,
            };
            assert_eq!(
                revision_capacity(container_concurrency, targets),
                want,
                "{name}"
            );
        }
    }

    /// Pod-mode arithmetic on given shares.
    #[test]
    fn pod_mode_sums_the_shares_of_routable_assigned_pods() {
        let rows: &[(&str, u32, &[u32], Capacity)] = &[
            ("one pod, cc 10", 10, &[10], Limited(10)),
            ("two pods, cc 10", 10, &[10, 10], Limited(20)),
            ("no routable pod: closed", 10, &[], Limited(0)),
            // ★ The fork's qp_authority_test "not-ready pods excluded from routing but counted in
            // capacity": 3 NotReady + 2 Ready at cc 1 gives 5 there. Only the 2 routable pods
            // are assigned here, so 2.
            ("2 routable of 5 pods, cc 1", 1, &[1, 1], Limited(2)),
            // ★ Shared pods: a split CC, not CC per sharer.
            (
                "shared pods with split shares",
                10,
                &[5, 4, 10],
                Limited(19),
            ),
            ("a shared pod that left us no slot", 1, &[0], Limited(0)),
            ("cc 0 with pods: unlimited", 0, &[0, 0, 0], Unlimited),
            ("cc 0 without pods: closed", 0, &[], Limited(0)),
            (
                "overflowing shares saturate",
                u32::MAX,
                &[u32::MAX, u32::MAX],
                Limited(u32::MAX),
            ),
        ];
        for &(name, container_concurrency, shares, want) in rows {
            let assignments = with_shares(shares);
            assert_eq!(
                revision_capacity(container_concurrency, Targets::Pods(&assignments)),
                want,
                "{name}"
            );
        }
    }

    /// The capacity of every activator, lowest first, going through `subsetting::assign` as the
    /// runtime does.
    fn capacities(container_concurrency: u32, pods: usize, activators: usize) -> Vec<Capacity> {
        let pods = self::pods(pods);
        let activators = self::activators(activators);
        let mut capacities: Vec<Capacity> = activators
            .iter()
            .map(|&me| {
                let assignments = assign(&pods, &activators, me, container_concurrency);
                revision_capacity(container_concurrency, Targets::Pods(&assignments))
            })
            .collect();
        capacities.sort_by_key(|capacity| match capacity {
            Limited(limit) => u64::from(*limit),
            Unlimited => u64::MAX,
        });
        capacities
    }

    /// Upstream's TestThrottlerUpdateCapacity rows with pod trackers, for every activator at
    /// once (upstream gives one index per row; with HRW the index carries no meaning, so the
    /// rows for index 0 and 1 become one row over both activators).
    ///
    /// Rows that differ because of ★ rendezvous subsetting:
    /// * 2 activators, 3 pods, cc 10: upstream index 0 → 20, index 1 → 10. HRW gives some
    ///   activator 2 pods and the other 1, so the same {10, 20}, but which one depends on the
    ///   hash, not the index.
    /// * 2 activators, 5 pods, cc 1: upstream 3 / 2. HRW may split 3 / 2 or 4 / 1; what holds
    ///   is a total of 5 with each at least 1 (asserted below rather than a fixed pair).
    /// * 200 activators, 10 pods, cc 10 (pod mode): upstream gives every activator one pod with
    ///   the full CC, 10 each, 2000 slots on 100 real ones. Ours split each pod's 10 among its
    ///   ~20 sharers: 0 or 1 each, 100 in total.
    #[test]
    fn upstream_rows_with_trackers_through_subsetting() {
        assert_eq!(capacities(10, 1, 1), [Limited(10)], "1 activator, 1 pod");
        assert_eq!(capacities(10, 2, 1), [Limited(20)], "1 activator, 2 pods");
        assert_eq!(
            capacities(10, 2, 2),
            [Limited(10), Limited(10)],
            "2 activators, 2 pods"
        );
        assert_eq!(
            capacities(10, 3, 2),
            [Limited(10), Limited(20)],
            "2 activators, 3 pods"
        );

        let split = capacities(1, 5, 2);
        assert!(
            split
                .iter()
                .all(|capacity| matches!(capacity, Limited(limit) if *limit >= 1)),
            "2 activators, 5 pods, cc 1: {split:?}"
        );
        let total: u32 = split
            .iter()
            .map(|capacity| match capacity {
                Limited(limit) => *limit,
                Unlimited => 0,
            })
            .sum();
        assert_eq!(total, 5, "2 activators, 5 pods, cc 1: {split:?}");

        // "Infinite capacity with podIP trackers": cc 0, 2 activators, 3 pods → open, and every
        // pod assigned (no subsetting at cc 0).
        assert_eq!(capacities(0, 3, 2), [Unlimited, Unlimited]);
        let everything = assign(&pods(3), &activators(2), activators(2)[1], 0);
        assert_eq!(everything.len(), 3);

        let crowded = capacities(10, 10, 200);
        let total: u32 = crowded
            .iter()
            .map(|capacity| match capacity {
                Limited(limit) => *limit,
                Unlimited => u32::MAX,
            })
            .sum();
        assert_eq!(total, 100, "200 activators over 10 pods of cc 10");
        assert!(crowded
            .iter()
            .all(|capacity| matches!(capacity, Limited(0 | 1))));
    }

    /// TestPodAssignmentFinite / Infinite capacities: upstream index 0 of 4 over 6 pods at cc 42
    /// has 84; here some activators have 84 and the others 42 (6 pods, 4 activators, each at
    /// least one), 252 in total. Scale to zero closes; cc 0 is open with pods, closed without.
    #[test]
    fn upstream_pod_assignment_capacities() {
        let finite = capacities(42, 6, 4);
        assert!(
            finite == [Limited(42), Limited(42), Limited(84), Limited(84)]
                || finite == [Limited(42), Limited(42), Limited(42), Limited(126)],
            "{finite:?}"
        );
        assert_eq!(capacities(42, 0, 4), [Limited(0); 4]);
        assert_eq!(capacities(0, 3, 1), [Unlimited]);
        assert_eq!(capacities(0, 0, 1), [Limited(0)]);
    }
}
