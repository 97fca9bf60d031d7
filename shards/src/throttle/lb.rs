//! Load-balancing policies: pick a pod for a request and take a slot on it in the same step.
//!
//! Upstream (`pkg/activator/net/lb_policy.go`) lets each policy call `Reserve` on the tracker it
//! chooses; we keep that shape so a pick can never hand out a pod whose slot another shard took
//! between "choose" and "reserve". Policies see pods only through [`Slots`], so the same code
//! runs on the shared atomics of production and on plain cells in tests. Releasing a slot is the
//! caller's business (it holds the pod until the response ends); nothing here does I/O, reads a
//! clock or allocates for revisions of up to [`INLINE_PODS`] pods.
//!
//! One deliberate difference from upstream: **a policy returns `None` only if every pod refused
//! a slot.** Upstream's random-choice-2 looks at two pods and gives up; ours then tries the rest,
//! because the work-conservation invariant (SPEC §3) forbids queueing a request while a routable
//! slot is free.

use std::sync::Arc;

/// How a revision spreads requests over its pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LbPolicy {
    RandomChoice2,
    FirstAvailable,
    RoundRobin,
    LeastConnections,
}

impl LbPolicy {
    /// Upstream's default by containerConcurrency: 0 → random-choice-2, 1..=3 → first-available,
    /// more → round-robin.
    pub fn default_for(container_concurrency: u32) -> LbPolicy {
        match container_concurrency {
            0 => LbPolicy::RandomChoice2,
            1..=3 => LbPolicy::FirstAvailable,
            _ => LbPolicy::RoundRobin,
        }
    }

    /// Parses the names used by the fork's `loadBalancingPolicy` field.
    pub fn parse(text: &str) -> Option<LbPolicy> {
        match text {
            "random-choice-2" => Some(LbPolicy::RandomChoice2),
            "first-available" => Some(LbPolicy::FirstAvailable),
            "round-robin" => Some(LbPolicy::RoundRobin),
            "least-connections" => Some(LbPolicy::LeastConnections),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            LbPolicy::RandomChoice2 => "random-choice-2",
            LbPolicy::FirstAvailable => "first-available",
            LbPolicy::RoundRobin => "round-robin",
            LbPolicy::LeastConnections => "least-connections",
        }
    }
}

/// Largest pod list least-connections orders on the stack; longer lists pay one allocation.
pub const INLINE_PODS: usize = 64;

/// A pod as a policy sees it.
pub trait Slots {
    /// Requests in flight to the pod from this activator (all shards).
    fn in_flight(&self) -> u32;
    /// Try to take one slot; false when the pod is at capacity. Must be the ONLY way a policy
    /// takes a slot.
    fn try_acquire(&self) -> bool;
}

impl<S: Slots + ?Sized> Slots for &S {
    fn in_flight(&self) -> u32 {
        (**self).in_flight()
    }

    fn try_acquire(&self) -> bool {
        (**self).try_acquire()
    }
}

/// Routes hold their pods as `Arc`s shared across shards and snapshot versions.
impl<S: Slots + ?Sized> Slots for Arc<S> {
    fn in_flight(&self) -> u32 {
        (**self).in_flight()
    }

    fn try_acquire(&self) -> bool {
        (**self).try_acquire()
    }
}

/// Per-revision, per-shard policy state (round-robin cursor, PRNG state).
///
/// Each shard owns its own `Balancer`, so neither field needs synchronisation; upstream guards
/// the round-robin index with a mutex shared by every request of the revision.
#[derive(Clone, Debug)]
pub struct Balancer {
    policy: LbPolicy,
    /// Round-robin: the index to try first on the next pick.
    cursor: usize,
    /// splitmix64 state. Seeded by the caller so tests (and replays) are deterministic.
    rng: u64,
}

impl Balancer {
    pub fn new(policy: LbPolicy, seed: u64) -> Balancer {
        Balancer {
            policy,
            cursor: 0,
            rng: seed,
        }
    }

    pub fn policy(&self) -> LbPolicy {
        self.policy
    }

    /// Switches policy (a new snapshot changed the revision's). The cursor and PRNG carry over:
    /// round-robin already copes with a cursor past the end, and reseeding would only make two
    /// shards' sequences more likely to coincide.
    pub fn set_policy(&mut self, policy: LbPolicy) {
        self.policy = policy;
    }

    /// Index of the pod whose slot was taken, or None if no pod had a free slot (the caller then
    /// queues).
    pub fn pick<S: Slots>(&mut self, pods: &[S]) -> Option<usize> {
        if pods.is_empty() {
            return None;
        }
        match self.policy {
            LbPolicy::RandomChoice2 => self.random_choice_2(pods),
            LbPolicy::FirstAvailable => first_available(pods),
            LbPolicy::RoundRobin => self.round_robin(pods),
            LbPolicy::LeastConnections => least_connections(pods),
        }
    }

    /// Power of two choices over in-flight counts, then (our addition) every other pod.
    fn random_choice_2<S: Slots>(&mut self, pods: &[S]) -> Option<usize> {
        let count = pods.len();
        if count == 1 {
            return pods[0].try_acquire().then_some(0);
        }
        // Upstream's way of drawing two distinct indexes uniformly: the second draw skips over
        // the first. For two pods this yields {0, 1} in random order, as upstream's fixed pair
        // plus its coin flip does.
        let first = self.below(count);
        let mut second = self.below(count - 1);
        if second >= first {
            second += 1;
        }
        // The ordered pair (first, second) is uniform over distinct pairs, so on a tie letting
        // `first` win is exactly upstream's coin flip, without spending another draw.
        let (preferred, other) = if pods[second].in_flight() < pods[first].in_flight() {
            (second, first)
        } else {
            (first, second)
        };
        if pods[preferred].try_acquire() {
            return Some(preferred);
        }
        if pods[other].try_acquire() {
            return Some(other);
        }
        if count == 2 {
            return None;
        }
        // Both candidates are full. A random starting point keeps shards that fall back at the
        // same moment from all piling onto the lowest free index.
        let start = self.below(count);
        (0..count)
            .map(|offset| (start + offset) % count)
            .filter(|&index| index != first && index != second)
            .find(|&index| pods[index].try_acquire())
    }

    /// Upstream's round-robin: resume after the last pod served, skipping full pods.
    fn round_robin<S: Slots>(&mut self, pods: &[S]) -> Option<usize> {
        let count = pods.len();
        // The list shrank since the last pick; upstream restarts from the top.
        if self.cursor >= count {
            self.cursor = 0;
        }
        let chosen = (0..count)
            .map(|offset| (self.cursor + offset) % count)
            .find(|&index| pods[index].try_acquire())?;
        self.cursor = chosen + 1;
        Some(chosen)
    }

    /// splitmix64: one add and a few multiply-xorshifts, good statistics from any seed (zero
    /// included), which xorshift variants cannot promise.
    fn next_u64(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut mixed = self.rng;
        mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        mixed ^ (mixed >> 31)
    }

    /// Uniform-enough index in `0..bound` (bound > 0). Multiply-shift instead of `%` avoids a
    /// division; its bias is below bound / 2^64, irrelevant for pod counts.
    fn below(&mut self, bound: usize) -> usize {
        ((u128::from(self.next_u64()) * bound as u128) >> 64) as usize
    }
}

/// The first pod, in the caller's (address) order, that grants a slot. Clumps load onto the
/// lowest addresses on purpose: with small containerConcurrency it keeps other pods idle enough
/// to scale down.
fn first_available<S: Slots>(pods: &[S]) -> Option<usize> {
    pods.iter().position(|pod| pod.try_acquire())
}

/// The least-loaded pod that grants a slot; ties go to the lower index.
fn least_connections<S: Slots>(pods: &[S]) -> Option<usize> {
    if pods.len() <= INLINE_PODS {
        let mut order = [(0, 0); INLINE_PODS];
        try_in_load_order(pods, &mut order[..pods.len()])
    } else {
        let mut order = vec![(0, 0); pods.len()];
        try_in_load_order(pods, &mut order)
    }
}

/// Tries every pod exactly once, least loaded first. `order` has one entry per pod.
///
/// The loads are read once into `order` rather than re-read while trying: other shards change
/// them concurrently, and a fixed snapshot is what guarantees each pod is tried exactly once, so
/// a free slot anywhere is found.
fn try_in_load_order<S: Slots>(pods: &[S], order: &mut [(u32, usize)]) -> Option<usize> {
    let mut least = (u32::MAX, usize::MAX);
    for (entry, (index, pod)) in order.iter_mut().zip(pods.iter().enumerate()) {
        *entry = (pod.in_flight(), index);
        least = least.min(*entry);
    }
    // Usually the least-loaded pod has room; try it before paying for a sort.
    if pods[least.1].try_acquire() {
        return Some(least.1);
    }
    // (in_flight, index) pairs are unique, so an unstable sort is deterministic and ties fall to
    // the lower index; the least-loaded pod sorts first and was already refused.
    order.sort_unstable();
    order[1..]
        .iter()
        .map(|&(_, index)| index)
        .find(|&index| pods[index].try_acquire())
}

#[cfg(test)]
mod tests;
