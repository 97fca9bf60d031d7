//! A pod's concurrency slots for this process, shared by every shard.
//!
//! The whole cross-shard state of a pod is one counter of requests in flight plus its capacity
//! (this activator's share of containerConcurrency), on one cache line: the pod's tracker is
//! aligned to a line, so no other pod's counter shares it. Taking a slot is a CAS that
//! refuses once the count has reached the capacity, so no interleaving of shards can put more
//! than `capacity` requests in flight through successful acquires.
//!
//! Invariant kept here: **an acquire succeeds only if, at the instant it takes effect, the
//! count was below the capacity.** When the capacity shrinks (a new snapshot), requests already
//! in flight finish; no new acquire succeeds until the count is below the new capacity.
//!
//! One writer per fact: the capacity is written only by the control thread (the publish of a
//! snapshot).

use std::sync::atomic::{AtomicU32, Ordering};

/// Capacity meaning "no limit" (containerConcurrency 0).
pub const UNLIMITED: u32 = u32::MAX;

/// In-flight count and capacity of one pod.
#[derive(Debug)]
pub struct PodSlots {
    in_flight: AtomicU32,
    /// This activator's share of the pod; written by the control thread only.
    capacity: AtomicU32,
}

impl PodSlots {
    pub fn new(capacity: u32) -> PodSlots {
        PodSlots {
            in_flight: AtomicU32::new(0),
            capacity: AtomicU32::new(capacity),
        }
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }

    pub fn capacity(&self) -> u32 {
        self.capacity.load(Ordering::Acquire)
    }

    /// Whether an acquire could succeed right now (a hint: another shard may take it first).
    pub fn has_free_slot(&self) -> bool {
        self.in_flight() < self.capacity()
    }

    /// Takes one slot unless the pod is at capacity.
    pub fn try_acquire(&self) -> bool {
        let mut current = self.in_flight.load(Ordering::Acquire);
        loop {
            // Re-read the capacity on every attempt so a shrink is honoured at once.
            if current >= self.capacity.load(Ordering::Acquire) {
                return false;
            }
            match self.in_flight.compare_exchange_weak(
                current,
                current + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => current = now,
            }
        }
    }

    /// Gives a slot back. Returns false (and changes nothing) if none was held, which would be a
    /// bookkeeping bug in the caller; the count never wraps below zero.
    pub fn release(&self) -> bool {
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |current| {
                current.checked_sub(1)
            })
            .is_ok()
    }

    /// Sets this activator's share of the pod (from a new snapshot).
    pub fn set_capacity(&self, capacity: u32) {
        self.capacity.store(capacity, Ordering::Release);
    }
}

impl crate::throttle::lb::Slots for PodSlots {
    fn in_flight(&self) -> u32 {
        PodSlots::in_flight(self)
    }

    fn try_acquire(&self) -> bool {
        PodSlots::try_acquire(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn acquire_stops_at_capacity_and_release_reopens() {
        let slots = PodSlots::new(2);
        assert!(slots.try_acquire());
        assert!(slots.try_acquire());
        assert!(!slots.try_acquire(), "a third request must wait");
        assert!(slots.release());
        assert!(slots.try_acquire());
        assert_eq!(slots.in_flight(), 2);
    }

    #[test]
    fn a_shrunk_capacity_lets_in_flight_work_finish_and_admits_nothing_new() {
        let slots = PodSlots::new(3);
        for _ in 0..3 {
            assert!(slots.try_acquire());
        }
        slots.set_capacity(1);
        assert!(!slots.try_acquire());
        assert!(slots.release());
        assert!(!slots.try_acquire(), "2 in flight, capacity 1");
        assert!(slots.release());
        assert!(!slots.try_acquire(), "1 in flight, capacity 1");
        assert!(slots.release());
        assert!(slots.try_acquire());
    }

    #[test]
    fn releasing_with_nothing_held_is_refused_not_wrapped() {
        let slots = PodSlots::new(1);
        assert!(!slots.release());
        assert_eq!(slots.in_flight(), 0);
    }

    #[test]
    fn unlimited_never_refuses() {
        let slots = PodSlots::new(UNLIMITED);
        for _ in 0..10_000 {
            assert!(slots.try_acquire());
        }
    }

    #[derive(Clone, Debug)]
    enum Step {
        Acquire(usize),
        Release(usize),
        SetCapacity(u32),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0..4usize).prop_map(Step::Acquire),
            3 => (0..4usize).prop_map(Step::Release),
            1 => (0..6u32).prop_map(Step::SetCapacity),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Four shards acquire and release in any order while snapshots change the capacity:
        /// every successful acquire found the count below the capacity, every release matches
        /// an acquire, and the count always equals what the shards hold.
        #[test]
        fn no_interleaving_over_commits(initial in 0..6u32, steps in prop::collection::vec(step(), 1..200)) {
            let slots = PodSlots::new(initial);
            let mut held = [0u32; 4];
            let mut capacity = initial;
            for step in steps {
                match step {
                    Step::Acquire(shard) => {
                        let before = slots.in_flight();
                        if slots.try_acquire() {
                            prop_assert!(before < capacity, "acquired at {before}/{capacity}");
                            held[shard] += 1;
                        } else {
                            prop_assert!(before >= capacity);
                        }
                    }
                    Step::Release(shard) => {
                        if held[shard] > 0 {
                            prop_assert!(slots.release());
                            held[shard] -= 1;
                        }
                    }
                    Step::SetCapacity(new) => {
                        slots.set_capacity(new);
                        capacity = new;
                    }
                }
                prop_assert_eq!(slots.in_flight(), held.iter().sum::<u32>());
            }
        }
    }

    /// Real threads hammering one pod: the count seen right after each successful acquire never
    /// exceeds the capacity.
    #[test]
    fn threads_never_exceed_capacity() {
        const CAPACITY: u32 = 3;
        let slots = Arc::new(PodSlots::new(CAPACITY));
        let exceeded = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let slots = slots.clone();
                let exceeded = exceeded.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        if slots.try_acquire() {
                            if slots.in_flight() > CAPACITY {
                                exceeded.store(true, Ordering::Relaxed);
                            }
                            assert!(slots.release());
                        }
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().unwrap();
        }
        assert!(!exceeded.load(Ordering::Relaxed));
        assert_eq!(slots.in_flight(), 0);
    }
}
