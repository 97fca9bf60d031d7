//! ★ Which of a revision's routable pods this activator sends to, and with how many slots each.
//!
//! When several activators serve a revision (its public endpoints list them), each must own a
//! part of the pods' concurrency, or together they would put more than containerConcurrency (CC)
//! requests on a pod. Upstream (`assignSlice`) gives each activator a contiguous range of the
//! sorted pods by its index in the sorted activator list: one pod or activator joining or leaving
//! re-deals most of the ranges, and with more activators than pods every activator shares a pod
//! by modulo and grants the *full* CC on it, over-committing the pod.
//!
//! We use rendezvous (highest-random-weight) hashing instead. Every (pod, activator) pair has a
//! weight, a hash of both addresses, and:
//!
//! * **pods ≥ activators**: each pod is owned by exactly one activator — the one with the
//!   highest weight for it — which gets the whole CC of that pod. A pod joining or leaving moves
//!   only that pod; an activator leaving moves only the pods it owned; an activator joining takes
//!   about `1 / n` of the pods (n activators after it joined), from everyone, and nothing else
//!   moves.
//! * **pods < activators**: roles swap, each *activator* goes to the pod with the highest weight
//!   for it, so every activator gets exactly one pod and the pod's CC is split among its sharers
//!   (shares differ by at most 1 and sum to exactly CC; the sharer with the higher weight gets
//!   the extra unit). With CC smaller than the number of sharers some get share 0: the pod is
//!   still assigned to them but gives them no slot. That is the price of never over-committing.
//!
//! In both cases plain HRW can leave a bucket (an activator, or a pod) empty. It is then filled
//! deterministically by *taking over* the key (pod, or activator) it weighs highest among those
//! whose current bucket holds two or more, which by pigeonhole always exists. Stealing rather than
//! sharing keeps every share whole when there are enough pods: with CC = 1, two pods and two
//! activators, sharing could leave an activator with a share of 0 and no capacity at all. The
//! fix-up is the only place where a change can move more than the minimum (one extra key for each
//! bucket that was or becomes empty), and it only happens when pods and activators are close in
//! number: with 100 pods over 5 activators an empty activator has odds of 0.8^100.
//!
//! For every pod and CC > 0 the shares of all activators sum to exactly CC: never multiplied.
//!
//! Every activator computes the whole assignment on its own from the same inputs, so the result
//! depends only on the *sets* of pods and activators (inputs are sorted and deduplicated), and the
//! weight is a hash we define here (64-bit FNV-1a over a fixed byte encoding, then the splitmix64
//! finaliser), identical on every machine, process and version. Changing it would make replicas
//! of different versions disagree during a rolling upgrade, which over-commits pods until the
//! upgrade ends: the golden tests (`subsetting/tests.rs`) pin it.

use std::net::{IpAddr, SocketAddr};

/// One pod this activator may send to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Assignment {
    /// The pod's `ip:port`.
    pub pod: SocketAddr,
    /// This activator's share of the pod's containerConcurrency: how many requests it may have in
    /// flight there. With CC = 0 it is 0 and means **unlimited** (no slots are counted at all); with
    /// CC > 0 a share of 0 means the pod is shared by more activators than it has slots and this
    /// one got none.
    pub share: u32,
}

/// The pods of a revision this activator (`me`) sends to, sorted by pod address.
///
/// * `pods`: the revision's routable pods, in any order (duplicates are ignored).
/// * `activators`: the IPs of the activators serving the revision (its public endpoints), in any
///   order (duplicates are ignored).
/// * CC = 0: no subsetting, every activator balances over every pod with share 0 (unlimited),
///   as upstream does for CC = 0.
/// * `me` absent from `activators` (the public endpoints do not list us yet, or the revision is
///   in serve mode and they are pod IPs): every pod with the full CC, as upstream does with
///   index -1. This over-commits if other activators do subset the same pods, but it is the only
///   answer that lets requests flow without knowing the others; it ends at the next endpoints
///   update that lists us.
pub fn assign(
    pods: &[SocketAddr],
    activators: &[IpAddr],
    me: IpAddr,
    container_concurrency: u32,
) -> Vec<Assignment> {
    let pods = sorted_unique(pods);
    let whole_pods = |share| pods.iter().map(|&pod| Assignment { pod, share }).collect();
    if container_concurrency == 0 {
        return whole_pods(0);
    }
    let activators = sorted_unique(activators);
    let Ok(my_index) = activators.binary_search(&me) else {
        return whole_pods(container_concurrency);
    };
    if pods.is_empty() {
        return Vec::new();
    }

    let weights = Weights::new(&pods, &activators);
    if pods.len() >= activators.len() {
        let owner_of_pod = partition(pods.len(), activators.len(), |pod, activator| {
            weights.get(pod, activator)
        });
        pods.iter()
            .zip(owner_of_pod)
            .filter(|&(_, owner)| owner == my_index)
            .map(|(&pod, _)| Assignment {
                pod,
                share: container_concurrency,
            })
            .collect()
    } else {
        let pod_of_activator = partition(activators.len(), pods.len(), |activator, pod| {
            weights.get(pod, activator)
        });
        let my_pod = pod_of_activator[my_index];
        let mut sharers: Vec<usize> = (0..activators.len())
            .filter(|&activator| pod_of_activator[activator] == my_pod)
            .collect();
        // Highest weight first, so the extra units of an uneven split follow the same order every
        // activator computes; the index breaks (astronomically unlikely) equal weights.
        sharers.sort_by(|&left, &right| {
            let left_weight = weights.get(my_pod, left);
            let right_weight = weights.get(my_pod, right);
            right_weight.cmp(&left_weight).then(left.cmp(&right))
        });
        // `my_index` is among the sharers by construction; were it not, share 0 is the safe answer.
        let rank = sharers
            .iter()
            .position(|&activator| activator == my_index)
            .unwrap_or(sharers.len());
        vec![Assignment {
            pod: pods[my_pod],
            share: split_share(container_concurrency, sharers.len(), rank),
        }]
    }
}

/// The share of the sharer at `rank` when `sharers` split `container_concurrency`: the first
/// `container_concurrency % sharers` get one more than the rest, so shares differ by at most one
/// and sum to exactly `container_concurrency`.
fn split_share(container_concurrency: u32, sharers: usize, rank: usize) -> u32 {
    if sharers == 0 || rank >= sharers {
        return 0;
    }
    let sharers = sharers as u64;
    let rank = rank as u64;
    let total = u64::from(container_concurrency);
    let share = total / sharers + u64::from(rank < total % sharers);
    // `share <= container_concurrency`, so it fits.
    u32::try_from(share).unwrap_or(container_concurrency)
}

/// Puts every key in one bucket: the bucket it weighs highest, then every empty bucket takes over
/// the key it weighs highest among keys whose bucket holds two or more. Requires
/// `keys >= buckets >= 1`; afterwards every bucket holds at least one key.
///
/// Returns the bucket of each key. Ties in weight go to the lower index, so the result depends
/// only on the weights and the (sorted) order of keys and buckets.
fn partition(keys: usize, buckets: usize, weight: impl Fn(usize, usize) -> u64) -> Vec<usize> {
    let mut bucket_of: Vec<usize> = (0..keys)
        // `buckets >= 1`, so there is always a highest.
        .map(|key| highest(0..buckets, |bucket| weight(key, bucket)).unwrap_or(0))
        .collect();
    let mut load = vec![0usize; buckets];
    for &bucket in &bucket_of {
        load[bucket] += 1;
    }
    for bucket in 0..buckets {
        if load[bucket] > 0 {
            continue;
        }
        // With `keys >= buckets` and this bucket empty, the keys sit in at most `buckets - 1`
        // buckets, so one holds two or more: a donor always exists and keeps at least one key.
        let donors = (0..keys).filter(|&key| load[bucket_of[key]] >= 2);
        if let Some(key) = highest(donors, |key| weight(key, bucket)) {
            load[bucket_of[key]] -= 1;
            bucket_of[key] = bucket;
            load[bucket] = 1;
        }
    }
    bucket_of
}

/// The candidate with the highest weight; the lowest index on equal weights.
fn highest(
    candidates: impl Iterator<Item = usize>,
    weight: impl Fn(usize) -> u64,
) -> Option<usize> {
    candidates.max_by_key(|&candidate| (weight(candidate), std::cmp::Reverse(candidate)))
}

fn sorted_unique<T: Ord + Copy>(items: &[T]) -> Vec<T> {
    let mut items = items.to_vec();
    items.sort_unstable();
    items.dedup();
    items
}

/// The weight of every (pod, activator) pair, computed once: `partition` reads each several
/// times, and a revision has at most a few thousand pods and a handful of activators.
struct Weights {
    activators: usize,
    by_pod: Vec<u64>,
}

impl Weights {
    fn new(pods: &[SocketAddr], activators: &[IpAddr]) -> Weights {
        let mut by_pod = Vec::with_capacity(pods.len() * activators.len());
        for &pod in pods {
            for &activator in activators {
                by_pod.push(weight(pod, activator));
            }
        }
        Weights {
            activators: activators.len(),
            by_pod,
        }
    }

    fn get(&self, pod: usize, activator: usize) -> u64 {
        self.by_pod[pod * self.activators + activator]
    }
}

/// The rendezvous weight of a (pod, activator) pair: FNV-1a over the activator's bytes then the
/// pod's, through the splitmix64 finaliser. FNV-1a alone spreads its last bytes poorly into the
/// high bits, which are the ones that decide a comparison; the finaliser fixes that.
///
/// Encoding: an IP is its family (4 or 6) then its octets in network order, so the two families
/// never collide and the concatenation is unambiguous; a pod adds its port, big-endian. IPv6 flow
/// info and scope id are not part of a pod's identity and are left out.
fn weight(pod: SocketAddr, activator: IpAddr) -> u64 {
    let mut hash = Fnv1a::new();
    hash.write_ip(activator);
    hash.write_ip(pod.ip());
    hash.write(&pod.port().to_be_bytes());
    splitmix64_finalise(hash.finish())
}

/// 64-bit FNV-1a (Fowler–Noll–Vo), defined by its offset basis and prime.
struct Fnv1a(u64);

impl Fnv1a {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    fn new() -> Fnv1a {
        Fnv1a(Self::OFFSET_BASIS)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 ^= u64::from(byte);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }

    fn write_ip(&mut self, ip: IpAddr) {
        match ip {
            IpAddr::V4(v4) => {
                self.write(&[4]);
                self.write(&v4.octets());
            }
            IpAddr::V6(v6) => {
                self.write(&[6]);
                self.write(&v6.octets());
            }
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The output step of splitmix64 (Steele, Lea, Flood 2014): a bijection that makes every input
/// bit affect every output bit.
fn splitmix64_finalise(mut value: u64) -> u64 {
    value ^= value >> 30;
    value = value.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    value ^= value >> 27;
    value = value.wrapping_mul(0x94d0_49bb_1331_11eb);
    value ^ (value >> 31)
}

#[cfg(test)]
mod tests;
